/* Faults and fencing, publishers and receivers in separate processes over the
 * embedded file registry and a real Redis: a publisher, a replica or a
 * receiver killed mid-transfer, stale entries and missing ranks, mismatched
 * identities and corrupt manifests, and leases lost, replayed or outlived
 * (a relay rewritten under its reader among them) - each ending in a clear
 * error, never in a reported success, with the receiver's previous version
 * intact or its memory marked unusable.  The pull paths are in
 * test_engine_pull.c, the relays in test_engine_relays.c; the processes in
 * engine_procs.h. */
#include "engine_procs.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "refit/experimental/fp8.h"
#include "registry/backend.h"
#include "registry/registry.h"
#include "util/util.h"

/* Both publishers publish version 1, r pulls it, the publishers wait for its
 * readers and publish version 2: the state every fault test starts from. */
static void to_version_2(pub_t p[2], refit_receiver_t *r)
{
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, NULL));
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 1 5000");
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 2");
}

/* Pulls version v of r while a forked killer SIGKILLs `victim` 100 ms into
 * the 300 ms pause the receiver takes after it started writing
 * (REFIT_TEST_PAUSE_MS); reaps both (the victim's pipes closed); *ms is the
 * pull's wall time. */
static refit_status_t pull_while_killing(refit_receiver_t *r, uint64_t v, pub_t *victim, refit_pull_report_t *rep,
                                         double *ms)
{
    setenv("REFIT_TEST_PAUSE_MS", "300", 1);
    tool_proc_t killer = kill_after(victim->pid, 100);
    double t0 = refit_now();
    refit_status_t st = refit_receiver_pull(r, v, 10000, rep);
    *ms = t_ms_since(t0);
    unsetenv("REFIT_TEST_PAUSE_MS");
    killer_done(&killer);
    tool_proc_wait(victim, 10.0);
    return st;
}

/* A publisher whose bytes nobody else holds dies during the transfer: the
 * pull fails (PEER, "died"), the memory is marked unusable. */
static void publisher_killed_mid_transfer(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b;
    refit_receiver_t *r = receiver("tiny-dense", "vllm:tp=1", 0, &g, "shm", 0, &b);
    to_version_2(p, r);
    /* The receiver pauses after it started writing; rank 1 dies meanwhile. */
    double ms;
    refit_status_t st = pull_while_killing(r, 2, &p[1], NULL, &ms);
    assert_int_equal(st, REFIT_ERR_PEER);
    assert_non_null(strstr(refit_last_error(), "died"));
    assert_true(ms < 5000);
    assert_false(refit_receiver_usable(r));
    assert_int_equal(refit_receiver_committed(r), 1);
    refit_receiver_destroy(r);
    pub_stop(&p[0]);
    t_rm_tree(g.dir);
}

typedef struct {
    int to_publisher; /* its command pipe (inherited by the fork) */
    int after_ms;
} quitter_arg_t;

static int quitter_main(void *arg, int in, int out)
{
    (void)in, (void)out;
    const quitter_arg_t *q = arg;
    t_msleep(q->after_ms);
    return write(q->to_publisher, "quit\n", 5) == 5 ? 0 : 1;
}

/* Issue 31: a publisher destroyed (not killed) while a receiver reads it -
 * `refit publish` exiting after its last version - is said as such, with
 * what to change, instead of "source process died". */
static void publisher_destroyed_mid_transfer(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b;
    refit_receiver_t *r = receiver("tiny-dense", "vllm:tp=1", 0, &g, "shm", 0, &b);
    to_version_2(p, r);
    /* The receiver pauses after it started writing; rank 1 quits (its publisher is destroyed) meanwhile. */
    setenv("REFIT_TEST_PAUSE_MS", "300", 1);
    quitter_arg_t qa = {p[1].to_child, 100};
    tool_proc_t quitter;
    assert_int_equal(tool_proc_fork(&quitter, quitter_main, &qa, true), 0);
    refit_status_t st = refit_receiver_pull(r, 2, 10000, NULL);
    unsetenv("REFIT_TEST_PAUSE_MS");
    assert_int_equal(tool_proc_wait(&quitter, 10.0), 0);
    assert_int_equal(tool_proc_wait(&p[1], 10.0), 0);
    print_message("%s\n", refit_last_error());
    assert_int_equal(st, REFIT_ERR_PEER);
    assert_non_null(strstr(refit_last_error(), "source rank 1 withdrew during the transfer of version 2: its publisher "
                                               "was destroyed before this receiver finished"));
    assert_non_null(strstr(refit_last_error(), "refit publish --acks N"));
    assert_false(refit_receiver_usable(r));
    assert_int_equal(refit_receiver_committed(r), 1);
    refit_receiver_destroy(r);
    pub_stop(&p[0]);
    t_rm_tree(g.dir);
}

/* A DP replica dies during the transfer: its chunks go to the other replica
 * in the same pull, every byte verified. */
static void replica_killed_mid_transfer_fails_over(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1,dp=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b;
    refit_receiver_t *r = receiver("tiny-dense", "vllm:tp=1", 0, &g, "shm", 0, &b);
    to_version_2(p, r);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    double ms;
    REFIT_ASSERT_OK(pull_while_killing(r, 2, &p[1], &rep, &ms));
    assert_true(ms < 5000);
    assert_true(refit_receiver_usable(r));
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 2);
    refit_holder_stat_t hs[4] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 4, &nh));
    assert_int_equal(nh, 2);
    bool saw_failed = false;
    for (size_t i = 0; i < nh; i++)
        if (!strcmp(hs[i].name, "trainer:1")) saw_failed = hs[i].failed;
    assert_true(saw_failed);
    refit_receiver_destroy(r);
    pub_stop(&p[0]);
    t_rm_tree(g.dir);
}

/* A publisher whose bytes nobody else holds dies: a clear error naming what
 * is missing, and the previous version stays intact. */
static void stale_entry_and_missing_rank(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:ep=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b;
    refit_receiver_t *r = receiver("tiny-moe", "vllm:tp=1", 0, &g, "shm", 0, &b);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, NULL));
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 1 5000");
    PUB_OK(&p[0], "publish 2");
    PUB_OK(&p[1], "publish 2");
    pub_kill(&p[1]); /* its manifest and record stay behind: a stale entry */
    t_msleep(600);
    REFIT_ASSERT_ERR(refit_receiver_pull(r, 2, 3000, NULL), REFIT_ERR_MISSING_SOURCE, "source slot(s) 1 missing");
    assert_true(refit_receiver_usable(r));
    expect_truth("tiny-moe", "vllm:tp=1", 0, b, 1);
    /* A new process takes rank 1 over (new incarnation): the receiver notices,
     * reads its manifest again and completes. */
    p[1] = pub_start(&c, 1);
    PUB_OK(&p[1], "publish 2");
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, 2, 10000, &rep));
    assert_int_equal(rep.manifests_read, 1);
    expect_truth("tiny-moe", "vllm:tp=1", 0, b, 2);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* A receiver killed while it holds a lease: the publisher's wait ends when
 * the lease expires, and another receiver is unaffected. */
/* A receiver of vllm:tp=2 rank 0 with a 500 ms lease that pauses 20 s once it
 * started its pull of version 1 (the test kills it meanwhile). */
static int paused_receiver_main(void *arg, int in, int out)
{
    (void)in, (void)out;
    void *vb;
    setenv("REFIT_TEST_PAUSE_MS", "20000", 1);
    refit_receiver_t *vr = receiver("tiny-moe", "vllm:tp=2", 0, arg, "shm", 500, &vb);
    refit_receiver_pull(vr, 1, 30000, NULL);
    return 0;
}

static void receiver_killed_mid_transfer(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:ep=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    tool_proc_t victim;
    assert_int_equal(tool_proc_fork(&victim, paused_receiver_main, &g, true), 0);
    /* Wait until the victim holds its lease, then kill it. */
    refit_registry_t *reg;
    REFIT_ASSERT_OK(refit_registry_open(g.url, g.job, &reg));
    uint32_t n = 0;
    double t0 = refit_now();
    while (n == 0 && t_ms_since(t0) < 10000) {
        REFIT_ASSERT_OK(refit_registry_lease_count(reg, "trainer", 1, &n));
        t_msleep(20);
    }
    assert_int_equal(n, 1);
    tool_proc_stop(&victim, NULL, 0, true, 10.0);
    /* Another receiver pulls normally. */
    void *b;
    refit_receiver_t *r = receiver("tiny-moe", "vllm:tp=2", 1, &g, "shm", 0, &b);
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, NULL));
    expect_truth("tiny-moe", "vllm:tp=2", 1, b, 1);
    /* The publishers' wait for readers ends once the dead lease expires (500 ms). */
    t0 = refit_now();
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 1 5000");
    assert_true(t_ms_since(t0) < 3000);
    REFIT_ASSERT_OK(refit_registry_lease_count(reg, "trainer", 1, &n));
    assert_int_equal(n, 0);
    refit_registry_close(reg);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* ---- fencing: a receiver never commits bytes its lease stopped protecting -- */

/* A receiver child ("victim", reader name `reader`) pulls version 1 without
 * the synthetic truth (as production does), pausing `pause_ms` after it
 * committed to the transfer; it answers one line: "<status> usable=U
 * committed=C bytes_of_v=V", V = the version whose truth the memory holds
 * (0: neither 1 nor 2). */
static bool g_victim_no_digest; /* the next fenced_victim checks no content digests */

typedef struct {
    const reg_t *g;
    const char *reader;
    int pause_ms;
} victim_arg_t;

/* The file the victim's receiver creates as its pause begins (REFIT_TEST_PAUSE_FILE). */
static void pause_mark(const reg_t *g, const char *reader, char *out, size_t cap)
{
    snprintf(out, cap, "/tmp/refit-test-paused-%s-%s", g->job, reader);
}

static int victim_main(void *arg, int in, int resp)
{
    (void)in;
    const victim_arg_t *x = arg;
    char ms[16];
    snprintf(ms, sizeof(ms), "%d", x->pause_ms);
    setenv("REFIT_TEST_PAUSE_MS", ms, 1);
    char mark[160];
    pause_mark(x->g, x->reader, mark, sizeof(mark));
    setenv("REFIT_TEST_PAUSE_FILE", mark, 1);
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = x->g->url;
    rp.job = x->g->job;
    rp.transports = "shm";
    rp.reader = x->reader;
    rp.lease_ms = 60000; /* no renewal during the pause: only the fence can notice */
    rp.no_digest = g_victim_no_digest;
    refit_manifest_t *m = t_manifest_named("tiny-moe", "vllm:tp=1", 0);
    refit_manifest_t *check = t_manifest_named("tiny-moe", "vllm:tp=1", 0);
    refit_receiver_t *r;
    void *b;
    if (refit_receiver_create(&rp, m, &r) || refit_receiver_alloc(r, 0, &b)) return 3;
    refit_status_t st = refit_receiver_pull(r, 1, 30000, NULL);
    char detail[512];
    snprintf(detail, sizeof(detail), "%s", st ? refit_last_error() : "");
    int holds = 0;
    for (uint64_t v = 1; v <= 2 && !holds; v++)
        if (!refit_truth_verify(check, (const void *const *)&b, v, NULL)) holds = (int)v;
    char out[700];
    int len = snprintf(out, sizeof(out), "%s usable=%d committed=%llu bytes_of_v=%d %s\n", refit_status_name(st),
                       (int)refit_receiver_usable(r), (unsigned long long)refit_receiver_committed(r), holds, detail);
    if (write(resp, out, (size_t)len) != len) return 4;
    refit_receiver_destroy(r);
    refit_manifest_destroy(check);
    return 0;
}

static tool_proc_t fenced_victim(const reg_t *g, const char *reader, int pause_ms)
{
    victim_arg_t arg = {g, reader, pause_ms};
    tool_proc_t v;
    assert_int_equal(tool_proc_fork(&v, victim_main, &arg, true), 0);
    return v;
}

/* The victim's answer line (bounded: 30 s); then waits (<= 30 s) for it to end. */
static void victim_result(tool_proc_t *victim, char *out, size_t cap)
{
    tool_proc_line(victim, 30000, out, cap);
    tool_proc_wait(victim, 30.0);
}

/* Until the victim's receiver is in its pause (past its lease and the stamps it reads before the transfer):
 * what a test does from here happens during the transfer, however slow the machine. */
static void wait_paused(const reg_t *g, const char *reader)
{
    char mark[160];
    pause_mark(g, reader, mark, sizeof(mark));
    double t0 = refit_now();
    while (access(mark, F_OK) != 0 && t_ms_since(t0) < 30000) t_msleep(5);
    assert_int_equal(access(mark, F_OK), 0);
    unlink(mark);
}

static void wait_lease(const reg_t *g, uint64_t v)
{
    refit_registry_t *reg;
    REFIT_ASSERT_OK(refit_registry_open(g->url, g->job, &reg));
    uint32_t n = 0;
    double t0 = refit_now();
    while (n == 0 && t_ms_since(t0) < 10000) {
        REFIT_ASSERT_OK(refit_registry_lease_count(reg, "trainer", v, &n));
        if (!n) t_msleep(10);
    }
    refit_registry_close(reg);
    assert_int_equal(n, 1);
}

/* A one-rank in-place publisher that published version 1, and a victim
 * receiver holding its lease while it pauses before the transfer. */
static pub_t victim_scene(reg_t *g, tool_proc_t *victim)
{
    reg_file(g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=1", g->url, g->job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    *victim = fenced_victim(g, "victim", 1500);
    wait_lease(g, 1);
    wait_paused(g, "victim");
    return p;
}

/* The victim's answer must start with `want` and name `why`. */
static void expect_victim(tool_proc_t *victim, const char *want, const char *why)
{
    char out[800];
    victim_result(victim, out, sizeof(out));
    if (strncmp(out, want, strlen(want)) || !strstr(out, why)) fail_msg("victim: %s", out);
}

/* The lease is deleted while the receiver reads (an operator, a bug, an
 * attacker with write access to the store): the publisher finds no reader,
 * rewrites its memory with version 2, and the receiver - which read v2's
 * bytes as "v1" - must not commit them.  Before fencing it did (rc 0). */
static void lease_lost_mid_read_not_committed(void **state)
{
    (void)state;
    reg_t g;
    tool_proc_t victim;
    pub_t p = victim_scene(&g, &victim);
    refit_registry_t *reg;
    REFIT_ASSERT_OK(refit_registry_open(g.url, g.job, &reg));
    REFIT_ASSERT_OK(refit_registry_lease_release(reg, "trainer", 1, "victim"));
    refit_registry_close(reg);
    PUB_OK(&p, "wait 1 5000"); /* no lease: it returns at once */
    PUB_OK(&p, "scribble 2");  /* and the trainer writes its next step in place */
    expect_victim(&victim, "REFIT_ERR_STALE usable=0 committed=0", "was lost during the transfer");
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* The same, and the lease's own authentic value written back before the
 * receiver checks it (a registry writer without the secret), with no content
 * digests: the fence's lease check passes, and before the version stamps the
 * receiver committed v2's bytes as v1 with rc 0 (docs/security.md said so).
 * The publisher's stamp was cleared when wait_readers returned. */
static void lease_replayed_mid_read_refused(void **state)
{
    (void)state;
    reg_t g;
    tool_proc_t victim;
    g_victim_no_digest = true;
    pub_t p = victim_scene(&g, &victim);
    g_victim_no_digest = false;
    refit_kv_t *kv;
    REFIT_ASSERT_OK(refit_kv_file_ops.open(g.dir, g.job, &kv));
    const char *key = "trainer/v/1/lease/victim";
    void *lease = NULL;
    size_t len = 0;
    REFIT_ASSERT_OK(refit_kv_file_ops.get_many(kv, &key, 1, &lease, &len));
    assert_non_null(lease);
    REFIT_ASSERT_OK(refit_kv_file_ops.del(kv, key));
    PUB_OK(&p, "wait 1 5000");                                      /* no lease: it returns at once */
    PUB_OK(&p, "scribble 2");                                       /* the trainer writes its next step in place */
    REFIT_ASSERT_OK(refit_kv_file_ops.put(kv, key, lease, len, 0)); /* and the lease is back, token and tag */
    expect_victim(&victim, "REFIT_ERR_STALE usable=0 committed=0", "retired version 1");
    free(lease);
    refit_kv_file_ops.close(kv);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* A trainer that rewrites its memory while a receiver reads it (in place,
 * without waiting for its readers: a bug, or a second writer), the lease
 * intact: no synthetic truth in the receiver, only the publisher's content
 * digests, which the bytes read no longer match.  Before the digests the
 * receiver committed v2's bytes as v1 with rc 0. */
static void scribble_during_read_refused(void **state)
{
    (void)state;
    reg_t g;
    tool_proc_t victim;
    pub_t p = victim_scene(&g, &victim);
    PUB_OK(&p, "scribble 2");
    expect_victim(&victim, "REFIT_ERR_VERIFY usable=0 committed=0", "does not match what its publishers published");
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* A source whose connection failed during the transfer, after it had served bytes (a DP replica the fleet
 * dropped; seen once over UCX/TCP on a loaded host, where the pull then failed reading its stamp): the receiver
 * connects to it again and reads its stamp, which still covers what it served.  REFIT_TEST_STAMP_BROKEN makes
 * the first stamp read after the transfer fail as such a connection's does (shm connections do not fail that
 * way).  Two versions, bytes checked against the truth; without the reconnect the pull fails (checked). */
static void stamp_read_reconnects(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b;
    refit_receiver_t *r = receiver("tiny-moe", "vllm:tp=1", 0, &g, "shm", 0, &b);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    setenv("REFIT_TEST_STAMP_BROKEN", "1", 1);
    for (uint64_t v = 1; v <= 2; v++) {
        for (uint32_t k = 0; k < 2; k++) {
            if (v > 1) PUB_OK(&p[k], "wait %llu 5000", (unsigned long long)(v - 1));
            PUB_OK(&p[k], "publish %llu", (unsigned long long)v);
        }
        REFIT_ASSERT_OK(refit_receiver_pull(r, v, 10000, &rep));
        assert_int_equal(rep.version, v);
        expect_truth("tiny-moe", "vllm:tp=1", 0, b, v);
    }
    unsetenv("REFIT_TEST_STAMP_BROKEN");
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* A registry on a full filesystem: the receiver's error says so (the
 * issue saw "0 of 1 receivers committed" from the driver instead). */
static void registry_disk_full_said(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        print_message("[  SKIPPED ] needs root to mount a small tmpfs\n");
        skip();
    }
    reg_t g;
    reg_file(&g);
    if (mount("refit-test", g.dir, "tmpfs", 0, "size=2m,mode=0700") != 0) {
        print_message("[  SKIPPED ] cannot mount a tmpfs: %s\n", strerror(errno));
        t_rm_tree(g.dir);
        skip();
    }
    pubcfg_t c = {"tiny-moe", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    void *b;
    refit_receiver_t *r = receiver("tiny-moe", "vllm:tp=1", 0, &g, "shm", 0, &b);
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, NULL)); /* reads the manifest while there is room */
    PUB_OK(&p, "wait 1 5000");
    PUB_OK(&p, "publish 2");
    /* Fill what is left. */
    char junk[160];
    snprintf(junk, sizeof(junk), "%s/junk", g.dir);
    FILE *f = fopen(junk, "w");
    static char block[4096];
    for (int i = 0; f && i < 4096; i++) /* 16 MiB at most: the tmpfs has 2 */
        if (fwrite(block, 1, sizeof(block), f) != sizeof(block) || fflush(f) != 0 || ferror(f)) break;
    if (f) fclose(f);
    /* The receiver cannot take its lease: it says why. */
    REFIT_ASSERT_ERR(refit_receiver_pull(r, REFIT_VERSION_NEWEST, 3000, NULL), REFIT_ERR_REGISTRY,
                     "No space left on device");
    assert_int_equal(refit_receiver_committed(r), 1);
    assert_true(refit_receiver_usable(r));
    /* Nor can the publisher retire or publish. */
    const char *said = pub_cmd(&p, "wait 2 3000");
    if (!strstr(said, "No space left on device")) fail_msg("publisher said: %s", said);
    refit_receiver_destroy(r);
    pub_kill(&p);
    umount2(g.dir, MNT_DETACH);
    t_rm_tree(g.dir);
}

/* Redis restarts without its data while the receiver reads: every lease and
 * retired marker is gone.  The publisher notices (a new epoch) and does not
 * believe "no leases" for a lease lifetime, so it does not rewrite its
 * memory; the receiver finds its lease gone and does not commit. */
static void registry_lost_mid_read_fenced(void **state)
{
    (void)state;
#ifndef REFIT_HAVE_REDIS
    skip();
#else
    if (!t_in_path("redis-server")) skip();
    t_redis_t rs = {0};
    assert_true(t_redis_start(&rs, 0));
    reg_t g;
    snprintf(g.url, sizeof(g.url), "redis://127.0.0.1:%d", rs.port);
    snprintf(g.job, sizeof(g.job), "fence-%d", (int)getpid());
    g.dir[0] = '\0';
    pubcfg_t c = {"tiny-moe", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    tool_proc_t victim = fenced_victim(&g, "victim", 2500);
    wait_lease(&g, 1);
    wait_paused(&g, "victim");
    t_redis_stop(&rs);
    assert_true(t_redis_start(&rs, rs.port));
    /* The publisher's default lease_ms is 10 s: within 1.5 s it must refuse
     * to call the version free, naming the reason. */
    const char *said = pub_cmd(&p, "wait 1 1500");
    if (strncmp(said, "REFIT_ERR_TIMEOUT", 17) || !strstr(said, "lost its data")) fail_msg("publisher said: %s", said);
    expect_victim(&victim, "REFIT_ERR_STALE usable=0 committed=0", "lost");
    pub_stop(&p);
    t_redis_stop(&rs);
    t_rm_tree(rs.dir);
#endif
}

/* A heartbeat that comes later than dead_ms (a publisher starved of CPU)
 * finds its entry expired.  That is no loss of the store's data (its epoch
 * is the same): the publisher writes the entry again and keeps believing
 * "no leases" -- before, it fenced for a lease lifetime (10 s), which held up
 * relays' next versions on a busy host.  The store really losing its data
 * is registry_lost_mid_read_fenced. */
static void late_heartbeat_is_not_data_loss(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    /* The entry gone as if it expired: its file removed (the store and its
     * epoch stay). */
    char hb[256];
    snprintf(hb, sizeof(hb), "%s/%s/trainer%%2Fsrc%%2F0%%2Fhb", g.dir, g.job);
    assert_int_equal(unlink(hb), 0);
    /* The next beat (every 100 ms) writes it again. */
    double t0 = refit_now();
    while (access(hb, F_OK) != 0 && t_ms_since(t0) < 3000) t_msleep(10);
    assert_int_equal(access(hb, F_OK), 0);
    const char *said = pub_cmd(&p, "wait 1 1500");
    if (strncmp(said, "REFIT_OK", 8)) fail_msg("publisher said: %s", said);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

static void identity_and_corrupt_manifest(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    /* A receiver of another model. */
    void *b;
    refit_receiver_t *r = receiver("tiny-dense", "vllm:tp=1", 0, &g, "shm", 0, &b);
    REFIT_ASSERT_ERR(refit_receiver_pull(r, 1, 2000, NULL), REFIT_ERR_IDENTITY,
                     "group trainer publishes model tiny-moe; this receiver holds tiny-dense");
    refit_receiver_destroy(r);
    /* A corrupt manifest in the registry. */
    refit_registry_t *reg;
    REFIT_ASSERT_OK(refit_registry_open(g.url, g.job, &reg));
    void *buf;
    size_t len;
    REFIT_ASSERT_OK(refit_registry_get_manifest(reg, "trainer", 0, &buf, &len));
    ((unsigned char *)buf)[len / 2] ^= 0x40;
    REFIT_ASSERT_OK(refit_registry_put_manifest(reg, "trainer", 0, buf, len / 2 + 7)); /* truncated, and flipped */
    free(buf);
    r = receiver("tiny-moe", "vllm:tp=1", 0, &g, "shm", 0, &b);
    REFIT_ASSERT_ERR(refit_receiver_pull(r, 1, 2000, NULL), REFIT_ERR_CORRUPT, "manifest of source rank 0");
    assert_true(refit_receiver_usable(r));
    refit_receiver_destroy(r);
    refit_registry_close(reg);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* ---- a relay rewritten under its reader ---------------------------------- */

static int relay_follower_main(void *arg, int cmd, int resp)
{
    void *base;
    refit_receiver_t *r = relay_receiver(arg, &base);
    if (!r) return 3;
    refit_status_t st = refit_receiver_pull(r, 1, 10000, NULL);
    char out[700];
    snprintf(out, sizeof(out), "%s\n", st ? refit_last_error() : "ok");
    if (write(resp, out, strlen(out)) < 0) return 4;
    char c;
    while (read(cmd, &c, 1) == 1 && c != 'q') {
        if (c != 'n') continue;
        st = refit_receiver_pull(r, REFIT_VERSION_NEWEST, 10000, NULL);
        snprintf(out, sizeof(out), "%s\n", st ? refit_last_error() : "ok2");
        if (write(resp, out, strlen(out)) < 0) return 4;
    }
    refit_receiver_destroy(r);
    return 0;
}

/* A relay process that pulls version 1, answers "ok" (or the error), then
 * pulls the newest version on each 'n' and answers "ok2" (or the error). */
static relay_t relay_follower_spawn(const reg_t *g, const char *model, const char *layout)
{
    relay_arg_t arg = {.g = g, .model = model, .layout = layout, .rank = 0, .slot = 0, .max_readers = 0};
    relay_t x;
    assert_int_equal(tool_proc_fork(&x, relay_follower_main, &arg, true), 0);
    return x;
}

typedef struct {
    int trainer_cmd, relay_cmd;
} rewrite_arg_t;

/* At 300 ms: version 2 published; at 500 ms: the relay told to pull it. */
static int rewrite_main(void *arg, int in, int out)
{
    (void)in, (void)out;
    const rewrite_arg_t *x = arg;
    t_msleep(300);
    if (write(x->trainer_cmd, "publish 2\n", 10) != 10) return 1;
    t_msleep(200);
    if (write(x->relay_cmd, "n", 1) != 1) return 1;
    return 0;
}

/* A reader pulls version 1 from a relay (slowly); meanwhile the trainer
 * publishes version 2 and the relay pulls it into the memory the reader is
 * reading.  The relay waits up to its readers' lease time, then revokes
 * their leases and writes.  The reader must not report success with a torn
 * version: its pull is REFIT_ERR_STALE (the relay lease it held is gone) and
 * its memory is marked unusable.  Digests are off, so the fencing alone must
 * catch it; before relay leases had tokens the pull returned REFIT_OK with
 * a mixture of versions 1 and 2. */
static void relay_rewritten_under_reader_fenced(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_SNAPSHOT, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    relay_t a = relay_follower_spawn(&g, "tiny-dense", "vllm:tp=1");
    char buf[800];
    relay_answer(&a, buf, sizeof(buf), "ok");
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g.url;
    rp.job = g.job;
    rp.transports = "shm";
    rp.verify = REFIT_VERIFY_NONE;
    rp.threads = 1;
    rp.chunk_kb = 16;
    rp.max_readers = 1;
    rp.lease_ms = 600; /* the relay waits this long for us before revoking */
    rp.no_digest = true;
    refit_receiver_t *r;
    void *b;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named("tiny-dense", "vllm:tp=1", 0), &r));
    REFIT_ASSERT_OK(refit_receiver_alloc(r, 0, &b));
    setenv("REFIT_TEST_THROTTLE", "relay:0=0.3", 1); /* ~2 s to read the relay */
    rewrite_arg_t rw = {p.to_child, a.to_child};
    tool_proc_t helper;
    assert_int_equal(tool_proc_fork(&helper, rewrite_main, &rw, true), 0);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    refit_status_t st = refit_receiver_pull(r, 1, 20000, &rep);
    unsetenv("REFIT_TEST_THROTTLE");
    tool_proc_wait(&helper, 10.0);
    refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &nh));
    const refit_holder_stat_t *h0 = holder(hs, nh, "relay:0");
    assert_non_null(h0);
    assert_true(h0->bytes > 0);                /* it did read the relay */
    relay_answer(&a, buf, sizeof(buf), "ok2"); /* the relay moved on to version 2 */
    if (st != REFIT_ERR_STALE)
        fail_msg("reader of a rewritten relay: %s (%s), want REFIT_ERR_STALE", refit_status_name(st),
                 st ? refit_last_error() : "");
    assert_false(refit_receiver_usable(r));
    /* The next pull starts over and verifies. */
    REFIT_ASSERT_OK(refit_receiver_pull(r, REFIT_VERSION_NEWEST, 20000, &rep));
    assert_int_equal(rep.version, 2);
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 2);
    assert_true(refit_receiver_usable(r));
    refit_receiver_destroy(r);
    relay_stop(&a, false);
    const char *pr = pub_read(&p); /* the trainer's answer to "publish 2" */
    if (strncmp(pr, "REFIT_OK", 8)) fail_msg("publish 2: %s", pr);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(publisher_killed_mid_transfer),          cmocka_unit_test(publisher_destroyed_mid_transfer),
        cmocka_unit_test(replica_killed_mid_transfer_fails_over), cmocka_unit_test(stale_entry_and_missing_rank),
        cmocka_unit_test(receiver_killed_mid_transfer),           cmocka_unit_test(identity_and_corrupt_manifest),
        cmocka_unit_test(lease_lost_mid_read_not_committed),      cmocka_unit_test(lease_replayed_mid_read_refused),
        cmocka_unit_test(registry_lost_mid_read_fenced),          cmocka_unit_test(late_heartbeat_is_not_data_loss),
        cmocka_unit_test(scribble_during_read_refused),           cmocka_unit_test(registry_disk_full_said),
        cmocka_unit_test(relay_rewritten_under_reader_fenced),    cmocka_unit_test(stamp_read_reconnects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
