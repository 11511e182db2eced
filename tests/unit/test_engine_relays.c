/* Relays: receivers in child processes that serve what they pulled to the
 * receivers after them - joiners, relays killed mid-read (the reader fails
 * over; the trainer resumes only what is left), relays of a restarted
 * trainer, chains that survive a death and pipeline, slow replicas whose
 * chunks are stolen, and FP8 relays.  Every byte is verified.  Faults are in
 * test_engine.c, the other pull paths in test_engine_pull.c; the processes
 * in engine_procs.h. */
#include "engine_procs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "refit/experimental/fp8.h"
#include "engine/fleet/fleet.h"
#include "registry/registry.h"
#include "util/util.h"

/* A fleet pull's digests were computed by its chunk copies (docs/digest.md), every byte covered. */
static void expect_fused(const refit_pull_report_t *rep)
{
    if (!rep->digest_fused)
        fail_msg("version %llu: digests hashed in a pass, not while copying (path %u)",
                 (unsigned long long)rep->version, rep->path);
    assert_true(rep->digest_bytes > 0);
    assert_int_equal(rep->unverified_bytes, 0);
}

/* A relay serves a second receiver of its layout; with a reader limit the
 * second one (a joiner: created after the relay finished) reads nothing from
 * the trainer; a joiner that prepared reads no manifest in its pull.  Bytes
 * verified against the truth. */
static void relay_serves_joiner(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    relay_t a = relay_start(&g, "tiny-dense", "vllm:tp=2", 1, 0, 1, 1);
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=2", 1, &g, 1, &b);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, REFIT_VERSION_NEWEST, 10000, &rep));
    assert_int_equal(rep.version, 1);
    expect_fused(&rep); /* the relay's chunks hashed as they were copied */
    expect_truth("tiny-dense", "vllm:tp=2", 1, b, 1);
    /* Fetched from the registry: both trainer ranks' manifests once each
     * (rank 0's, read first to learn the world, is not fetched again) and
     * the relay's. */
    assert_int_equal(rep.manifests_read, 3);
    refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &nh));
    const refit_holder_stat_t *h = holder(hs, nh, "relay:0");
    assert_non_null(h);
    assert_true(h->bytes >= rep.bytes); /* contiguous spans: padding between rows included */
    assert_true(rep.bytes > 0);
    assert_null(holder(hs, nh, "trainer:0"));
    assert_null(holder(hs, nh, "trainer:1"));
    /* Another layout's rank (rank 0) finds no relay of its own and reads the trainer. */
    void *b0;
    refit_receiver_t *r0 = fleet_receiver("tiny-dense", "vllm:tp=2", 0, &g, 1, &b0);
    REFIT_ASSERT_OK(refit_receiver_pull(r0, 1, 10000, &rep));
    expect_truth("tiny-dense", "vllm:tp=2", 0, b0, 1);
    REFIT_ASSERT_OK(refit_receiver_holders(r0, hs, 8, &nh));
    assert_null(holder(hs, nh, "relay:0"));
    refit_receiver_destroy(r0);
    /* A joiner that prepared (refit_receiver_prepare) has read the trainer
     * ranks' manifests and the relay's: its first pull, through the relay,
     * fetches none.  Knowing a relay of its layout alive, it yields for the
     * grace (REFIT_FLEET_STICKY_MS) before taking a holder. */
    void *b2;
    refit_receiver_t *r2 = fleet_receiver("tiny-dense", "vllm:tp=2", 1, &g, 1, &b2);
    REFIT_ASSERT_OK(refit_receiver_prepare(r2, 10000, NULL));
    REFIT_ASSERT_OK(refit_receiver_pull(r2, REFIT_VERSION_NEWEST, 10000, &rep));
    assert_int_equal(rep.version, 1);
    assert_false(rep.planned);
    assert_int_equal(rep.manifests_read, 0);
    assert_true(rep.transfer_ms >= 250); /* the holders are chosen in the transfer stage */
    expect_truth("tiny-dense", "vllm:tp=2", 1, b2, 1);
    REFIT_ASSERT_OK(refit_receiver_holders(r2, hs, 8, &nh));
    assert_non_null(holder(hs, nh, "relay:0"));
    assert_null(holder(hs, nh, "trainer:0"));
    assert_null(holder(hs, nh, "trainer:1"));
    refit_receiver_destroy(r2);
    refit_receiver_destroy(r);
    relay_stop(&a, false);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* A relay is killed while a reader pulls from it (and from a second relay):
 * the reader drops it and finishes from the other holders within a bounded
 * time, every byte verified. */
static void relay_killed_reader_fails_over(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    relay_t a = relay_start(&g, "tiny-dense", "vllm:tp=1", 0, 0, 1, 0);
    relay_t d = relay_start(&g, "tiny-dense", "vllm:tp=1", 0, 1, 1, 0);
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=1", 0, &g, 4, &b);
    /* Slow links (0.4 MB/s each, ~0.6 MB to move): the pull takes ~0.75 s; relay 0 dies at 250 ms, late
     * enough that it has served chunks even when a loaded machine slows the pull's start. */
    setenv("REFIT_TEST_THROTTLE", "relay:0=0.4,relay:1=0.4", 1);
    tool_proc_t killer = kill_after(a.pid, 250);
    double t0 = refit_now();
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    refit_status_t st = refit_receiver_pull(r, 1, 10000, &rep);
    double ms = t_ms_since(t0);
    unsetenv("REFIT_TEST_THROTTLE");
    killer_done(&killer);
    REFIT_ASSERT_OK(st);
    expect_fused(&rep); /* the dead relay's chunk in flight, read again from relay 1, summed once */
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 1);
    refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &nh));
    const refit_holder_stat_t *h0 = holder(hs, nh, "relay:0"), *h1 = holder(hs, nh, "relay:1");
    assert_non_null(h0);
    assert_non_null(h1);
    assert_true(h0->failed);
    assert_true(h0->chunks > 0); /* it was serving when it died */
    assert_false(h1->failed);
    assert_true(h1->bytes > h0->bytes);
    assert_null(holder(hs, nh, "trainer:0")); /* relays had room: the trainer was left alone */
    assert_true(ms < 3000);
    refit_receiver_destroy(r);
    relay_stop(&a, true);
    relay_stop(&d, false);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* The only relay dies mid-transfer: the trainer serves what is left, and
 * the chunks already read from the relay are not read again. */
static void relay_killed_trainer_resumes(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    relay_t a = relay_start(&g, "tiny-dense", "vllm:tp=1", 0, 0, 1, 0);
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=1", 0, &g, 4, &b);
    setenv("REFIT_TEST_THROTTLE", "relay:0=1", 1); /* ~0.6 MB at 1 MB/s; killed at 150 ms */
    tool_proc_t killer = kill_after(a.pid, 150);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    refit_status_t st = refit_receiver_pull(r, 1, 10000, &rep);
    unsetenv("REFIT_TEST_THROTTLE");
    killer_done(&killer);
    REFIT_ASSERT_OK(st);
    expect_fused(&rep); /* the sums of the chunks the first try left in place kept, the rest added once */
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 1);
    refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &nh));
    const refit_holder_stat_t *h0 = holder(hs, nh, "relay:0"), *t0 = holder(hs, nh, "trainer:0");
    assert_non_null(h0);
    assert_non_null(t0);
    assert_true(h0->failed && h0->chunks > 0);
    refit_manifest_t *m = t_manifest_named("tiny-dense", "vllm:tp=1", 0);
    uint64_t total = refit_manifest_region_size(m, 0);
    refit_manifest_destroy(m);
    /* The trainer moved what the relay had not: less than everything. */
    assert_true(t0->bytes > 0 && t0->bytes + h0->bytes / 2 < total);
    refit_receiver_destroy(r);
    relay_stop(&a, true);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* The trainer restarts and publishes version 1 again (another incarnation:
 * its bytes need not be those the relay holds).  A reader that finds the
 * relay still serving "version 1" must not read it: the relay's progress
 * names the trainer records its version came from, and they differ. */
static void relay_of_restarted_trainer_skipped(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    relay_t a = relay_start(&g, "tiny-dense", "vllm:tp=1", 0, 0, 1, 1);
    pub_stop(&p);
    p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=1", 0, &g, 1, &b);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &rep));
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 1);
    refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &nh));
    const refit_holder_stat_t *h0 = holder(hs, nh, "relay:0"), *t0 = holder(hs, nh, "trainer:0");
    assert_non_null(t0);
    assert_true(t0->bytes > 0);
    assert_true(!h0 || (h0->failed && h0->bytes == 0));
    refit_receiver_destroy(r);
    relay_stop(&a, false);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* Waits until relay group `group` serves `version` (it does from the start
 * of its transfer). */
static void wait_relay_serves(const reg_t *g, const char *group, uint64_t version)
{
    refit_registry_t *reg;
    REFIT_ASSERT_OK(refit_registry_open(g->url, g->job, &reg));
    for (int i = 0;; i++) {
        refit_version_record_t rec;
        uint8_t present = 0;
        REFIT_ASSERT_OK(refit_registry_records(reg, group, 1, &rec, &present));
        if (present && rec.version == version) break;
        if (i > 2500) fail_msg("%s never served version %llu", group, (unsigned long long)version);
        t_msleep(2);
    }
    refit_registry_close(reg);
}

/* A chain trainer -> A -> B -> reader; A dies mid-transfer.  B's own pull
 * fails over to the trainer (keeping what it has), and B goes on serving
 * the same version: the reader keeps following B rather than dropping it. */
static void chain_survives_relay_death(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    setenv("REFIT_TEST_THROTTLE", "trainer:0=2,relay:0=2,relay:1=2", 1); /* ~0.3 s per transfer */
    relay_t a = relay_spawn(&g, "tiny-dense", "vllm:tp=1", 0, 0, 1, 1);
    wait_relay_serves(&g, "trainer.relay.r0.s0", 1);
    relay_t bb = relay_spawn(&g, "tiny-dense", "vllm:tp=1", 0, 1, 1, 1);
    wait_relay_serves(&g, "trainer.relay.r0.s1", 1);
    tool_proc_t killer = kill_after(a.pid, 60);
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=1", 0, &g, 1, &b);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    refit_status_t st = refit_receiver_pull(r, 1, 15000, &rep);
    unsetenv("REFIT_TEST_THROTTLE");
    killer_done(&killer);
    REFIT_ASSERT_OK(st);
    relay_pulled(&bb); /* B completed (and verified) after failing over */
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 1);
    refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &nh));
    const refit_holder_stat_t *h1 = holder(hs, nh, "relay:1");
    assert_non_null(h1);
    assert_false(h1->failed);
    assert_true(h1->bytes * 2 > rep.bytes); /* most of it from B */
    assert_null(holder(hs, nh, "trainer:0"));
    refit_receiver_destroy(r);
    relay_stop(&a, true);
    relay_stop(&bb, false);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* Relay x's next answer: version v read from `from` alone ("relay:1," /
 * "trainer:0,"), every byte checked against the truth; returns the pull's
 * milliseconds. */
static double relay_read_from(relay_t *x, uint64_t v, const char *from)
{
    char buf[800], got[600] = "";
    unsigned long long ver = 0;
    double ms = -1;
    relay_answer(x, buf, sizeof(buf), "ok");
    if (sscanf(buf, "ok v%llu %599s %lf", &ver, got, &ms) != 3 || ver != v || strcmp(got, from))
        fail_msg("relay pid %d: \"%s\"; want version %llu from %s", (int)x->pid, buf, (unsigned long long)v, from);
    return ms;
}

/* A chain keeps its order when it forms slowly.  Version 1 makes trainer ->
 * A -> B -> C (one reader per holder).  In version 2 B begins 0.7 s after A
 * and C, past the grace (REFIT_FLEET_STICKY_MS): C waits on for B (alive,
 * not at version 2 yet) instead of taking A, which has room, and B reads A
 * again.  (Before, C took A and B then read C: the chain reordered in a CI
 * run where each hop took ~0.3 s to form.)  In version 3 B does not pull:
 * C waits no longer than REFIT_FLEET_STICKY_MAX_MS, then reads A.  Every
 * relay's bytes are checked against the truth. */
static void chain_keeps_order_when_slow(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    relay_t a = relay_spawn(&g, "tiny-dense", "vllm:tp=1", 0, 0, 1, 1);
    relay_read_from(&a, 1, "trainer:0,");
    /* B reads A slowly (2 MB/s, ~0.3 s): C, started while B reads, finds A full and reads B. */
    setenv("REFIT_TEST_THROTTLE", "relay:0=2", 1);
    relay_t bb = relay_spawn(&g, "tiny-dense", "vllm:tp=1", 0, 1, 1, 1);
    unsetenv("REFIT_TEST_THROTTLE");
    wait_relay_serves(&g, "trainer.relay.r0.s1", 1);
    relay_t cc = relay_spawn(&g, "tiny-dense", "vllm:tp=1", 0, 2, 1, 1);
    relay_read_from(&bb, 1, "relay:0,");
    relay_read_from(&cc, 1, "relay:1,");
    PUB_OK(&p, "publish 2");
    assert_int_equal(write(a.to_child, "n", 1), 1);
    assert_int_equal(write(cc.to_child, "n", 1), 1);
    t_msleep(700);
    assert_int_equal(write(bb.to_child, "n", 1), 1);
    relay_read_from(&a, 2, "trainer:0,");
    relay_read_from(&bb, 2, "relay:0,");
    double c_ms = relay_read_from(&cc, 2, "relay:1,");
    assert_true(c_ms >= 700); /* it waited for B */
    PUB_OK(&p, "publish 3");
    assert_int_equal(write(a.to_child, "n", 1), 1);
    assert_int_equal(write(cc.to_child, "n", 1), 1);
    relay_read_from(&a, 3, "trainer:0,");
    c_ms = relay_read_from(&cc, 3, "relay:0,");
    if (c_ms < REFIT_FLEET_STICKY_MAX_MS || c_ms > REFIT_FLEET_STICKY_MAX_MS + 4000)
        fail_msg("C waited %.0f ms for B, which never began version 3 (the most: %d ms)", c_ms,
                 REFIT_FLEET_STICKY_MAX_MS);
    relay_stop(&a, false);
    relay_stop(&bb, false);
    relay_stop(&cc, false);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* A chain pipelines: relay A pulls slowly from the trainer (2 MB/s); B,
 * limited to one reader per holder, finds A holding the version while A is
 * still receiving it and reads A's chunks as they land, on a link as slow as
 * A's: B ends about when A does, not one whole transfer later.  Bytes
 * verified against the truth on both. */
static void relay_chain_pipelines(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    setenv("REFIT_TEST_THROTTLE", "trainer:0=2", 1);
    double t0 = refit_now();
    relay_t a = relay_spawn(&g, "tiny-dense", "vllm:tp=1", 0, 0, 1, 1);
    /* B starts once A serves version 1 (which it does when its transfer starts). */
    refit_registry_t *reg;
    REFIT_ASSERT_OK(refit_registry_open(g.url, g.job, &reg));
    for (int i = 0;; i++) {
        refit_version_record_t rec;
        uint8_t present = 0;
        REFIT_ASSERT_OK(refit_registry_records(reg, "trainer.relay.r0.s0", 1, &rec, &present));
        if (present && rec.version == 1) break;
        if (i > 2000) fail_msg("relay A never served version 1 while receiving it");
        t_msleep(2);
    }
    refit_registry_close(reg);
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=1", 0, &g, 1, &b);
    setenv("REFIT_TEST_THROTTLE", "relay:0=2", 1);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &rep));
    /* When B's bytes were in place (its verification - digests, truth - comes after). */
    double b_end = (rep.end_s - t0) * 1e3;
    unsigned long long dbytes = rep.digest_bytes;
    unsetenv("REFIT_TEST_THROTTLE");
    expect_fused(&rep); /* chunks read from a relay still receiving, hashed as they were copied */
    relay_pulled(&a);   /* A verified its copy too */
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 1);
    refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &nh));
    const refit_holder_stat_t *h = holder(hs, nh, "relay:0");
    assert_non_null(h);
    assert_null(holder(hs, nh, "trainer:0")); /* the trainer's one reader was A */
    assert_false(h->failed);
    /* Most chunks were read from A while A was still receiving them. */
    assert_true(h->early > 0);
    assert_true(h->early * 2 > h->chunks);
    /* One transfer at 2 MB/s is ~0.3 s; back to back it would be ~0.6 s (2x; 1.8x leaves room for a loaded
     * machine's scheduling). */
    double one_ms = (double)rep.bytes / 2e6 * 1e3;
    if (b_end > 1.8 * one_ms) fail_msg("B ended after %.0f ms; one transfer takes %.0f ms", b_end, one_ms);
    assert_true(dbytes > 0); /* bytes read from a relay are checked against the trainer's digests */
    refit_receiver_destroy(r);
    relay_stop(&a, false);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* One of two DP replicas is slow (0.5 MB/s): the fast one steals its chunks;
 * the pull ends long before the slow replica could have served its half. */
static void slow_replica_chunks_stolen(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1,dp=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=1", 0, &g, 0, &b);
    setenv("REFIT_TEST_THROTTLE", "trainer:1=0.5", 1);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    double t0 = refit_now();
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &rep));
    double ms = t_ms_since(t0);
    unsetenv("REFIT_TEST_THROTTLE");
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 1);
    expect_fused(&rep);
    refit_holder_stat_t hs[4] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 4, &nh));
    const refit_holder_stat_t *fast = holder(hs, nh, "trainer:0"), *slow = holder(hs, nh, "trainer:1");
    assert_non_null(fast);
    assert_non_null(slow);
    /* Half the bytes at 0.5 MB/s would take ~570 ms; the slow one serves a few chunks at most. */
    assert_true(fast->bytes >= rep.bytes * 8 / 10);
    assert_true(ms < 400);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* ---- FP8 relays ------------------------------------------------------------- */

/* bf16 trainer (2 processes) -> two FP8 relays (vllm:tp=2 ranks) -> FP8
 * receivers of tp=2 rank 1 and of tp=1 (resharded from the two arenas);
 * every byte equal to a reference quantization of the truth, and the FP8
 * receivers read about half the bf16 bytes. */
static void fp8_relays(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-fp8", "megatron:ep=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    refit_fp8_relay_t *x[2];
    for (uint32_t k = 0; k < 2; k++) {
        refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
        rp.registry = g.url;
        rp.job = g.job;
        rp.transports = "shm";
        rp.verify = REFIT_VERIFY_TRUTH;
        char reader[32];
        snprintf(reader, sizeof(reader), "fp8relay%u", k);
        rp.reader = reader;
        refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
        pp.registry = g.url;
        pp.job = g.job;
        pp.group = "fp8";
        pp.transports = "shm";
        REFIT_ASSERT_OK(refit_fp8_relay_create(&rp, &pp, t_manifest_named("tiny-fp8", "vllm:tp=2", k), &x[k]));
    }
    refit_receiver_t *r2, *r1;
    void *b2, *b1;
    refit_manifest_t *want_m;
    for (int i = 0; i < 2; i++) {
        unsigned char *ref = t_fp8_arena("tiny-fp8", i ? "vllm:tp=1" : "vllm:tp=2", i ? 0 : 1, 1, &want_m);
        free(ref);
        refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
        rp.registry = g.url;
        rp.job = g.job;
        rp.group = "fp8";
        rp.transports = "shm";
        rp.reader = i ? "fp8-tp1" : "fp8-tp2";
        REFIT_ASSERT_OK(refit_receiver_create(&rp, want_m, i ? &r1 : &r2));
        REFIT_ASSERT_OK(refit_receiver_alloc(i ? r1 : r2, 0, i ? &b1 : &b2));
    }
    for (uint64_t v = 1; v <= 2; v++) {
        for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish %llu", (unsigned long long)v);
        uint64_t bf16_bytes = 0;
        for (uint32_t k = 0; k < 2; k++) {
            refit_fp8_relay_report_t xr = REFIT_FP8_RELAY_REPORT_INIT;
            REFIT_ASSERT_OK(refit_fp8_relay_step(x[k], v, 10000, &xr));
            assert_int_equal(xr.version, v);
            assert_true(xr.fp8_bytes < xr.bf16_bytes * 7 / 10);
            if (k == 1) bf16_bytes = xr.bf16_bytes;
        }
        refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
        REFIT_ASSERT_OK(refit_receiver_pull(r2, v, 10000, &rep));
        assert_true(rep.bytes < bf16_bytes * 7 / 10);
        REFIT_ASSERT_OK(refit_receiver_pull(r1, v, 10000, &rep));
        assert_int_equal(rep.sources, 2);
        for (int i = 0; i < 2; i++) {
            refit_manifest_t *fm;
            unsigned char *ref = t_fp8_arena("tiny-fp8", i ? "vllm:tp=1" : "vllm:tp=2", i ? 0 : 1, v, &fm);
            assert_memory_equal(i ? b1 : b2, ref, refit_manifest_region_size(fm, 0));
            refit_manifest_destroy(fm);
            free(ref);
        }
        for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait %llu 5000", (unsigned long long)v);
    }
    /* A layout that cuts FP8 blocks is refused when the relay is made. */
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g.url;
    rp.job = g.job;
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = g.url;
    pp.job = g.job;
    pp.group = "fp8";
    refit_fp8_relay_t *bad;
    refit_manifest_t *kept = t_manifest_named("tiny-fp8", "vllm:tp=4", 1); /* the caller's on failure */
    REFIT_ASSERT_ERR(refit_fp8_relay_create(&rp, &pp, kept, &bad), REFIT_ERR_GEOMETRY, "block grid");
    refit_manifest_destroy(kept);
    pp.group = NULL;
    kept = t_manifest_named("tiny-fp8", "vllm:tp=2", 0);
    REFIT_ASSERT_ERR(refit_fp8_relay_create(&rp, &pp, kept, &bad), REFIT_ERR_INVALID_ARG, "group of its own");
    refit_manifest_destroy(kept);
    refit_receiver_destroy(r1);
    refit_receiver_destroy(r2);
    for (uint32_t k = 0; k < 2; k++) refit_fp8_relay_destroy(x[k]);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fp8_relays),
        cmocka_unit_test(relay_serves_joiner),
        cmocka_unit_test(relay_killed_reader_fails_over),
        cmocka_unit_test(relay_killed_trainer_resumes),
        cmocka_unit_test(relay_of_restarted_trainer_skipped),
        cmocka_unit_test(chain_survives_relay_death),
        cmocka_unit_test(chain_keeps_order_when_slow),
        cmocka_unit_test(relay_chain_pipelines),
        cmocka_unit_test(slow_replica_chunks_stolen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
