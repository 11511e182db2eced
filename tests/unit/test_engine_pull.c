/* Publishers and receivers in separate processes over the embedded file
 * registry and a real Redis, through shm (and UCX when built): end to end,
 * steady-state caching, prepared receivers, sized outputs, partial and delta
 * refits, process_vm_readv, in-place and snapshot modes.  Every byte is
 * verified against the synthetic truth.  Faults are in test_engine.c, relays
 * in test_engine_relays.c; the processes in engine_procs.h. */
#include "engine_procs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "registry/registry.h"
#include "util/util.h"

/* Sized outputs (refit/engine.h): a size too small is refused, naming the
 * structure, before anything happens; a caller whose structure is larger
 * (newer headers) keeps its extra bytes; one whose structure is smaller
 * (older headers) gets only the fields that fit; holders are written at the
 * caller's stride. */
static void sized_outputs(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=2", 1, &g, 0, &b);
    refit_pull_report_t zero;
    memset(&zero, 0, sizeof(zero));
    REFIT_ASSERT_ERR(refit_receiver_pull(r, 1, 10000, &zero), REFIT_ERR_INVALID_ARG, "refit_pull_report_t: size is 0");
    assert_int_equal(refit_receiver_committed(r), 0); /* refused before pulling */
    zero.size = offsetof(refit_pull_report_t, digest_ms);
    REFIT_ASSERT_ERR(refit_receiver_pull(r, 1, 10000, &zero), REFIT_ERR_INVALID_ARG, "refit_pull_report_t");
    struct {
        refit_pull_report_t rep;
        uint64_t future; /* a field of a newer header */
    } newer = {REFIT_PULL_REPORT_INIT, 0x5eed};
    newer.rep.size = sizeof(newer);
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &newer.rep));
    assert_int_equal(newer.rep.size, sizeof(newer));
    assert_int_equal(newer.rep.version, 1);
    assert_true(newer.rep.bytes > 0);
    assert_int_equal(newer.future, 0x5eed);
    expect_truth("tiny-dense", "vllm:tp=2", 1, b, 1);

    /* An older caller: only its prefix is written (the library's helper, as
     * the engine uses it, on a size that ends before digest_bytes). */
    refit_pull_report_t older = REFIT_PULL_REPORT_INIT;
    older.digest_bytes = older.unverified_bytes = 77;
    older.digest_ms = 7;
    size_t older_size = offsetof(refit_pull_report_t, digest_bytes);
    older.size = older_size;
    refit_out_write(&older, older.size, &newer.rep, sizeof(newer.rep));
    assert_int_equal(older.size, older_size);
    assert_int_equal(older.version, 1);
    assert_int_equal(older.bytes, newer.rep.bytes);
    assert_int_equal(older.digest_bytes, 77);
    assert_int_equal(older.unverified_bytes, 77);
    assert_true(older.digest_ms == 7);

    size_t nh = 99;
    REFIT_ASSERT_OK(refit_receiver_holders(r, NULL, 0, &nh));
    assert_true(nh >= 1 && nh <= 2);
    size_t n = nh;
    refit_holder_stat_t small = {.size = 8};
    REFIT_ASSERT_ERR(refit_receiver_holders(r, &small, 1, &nh), REFIT_ERR_INVALID_ARG, "refit_holder_stat_t");
    struct wide {
        refit_holder_stat_t h;
        uint64_t future;
    } hs[3] = {{REFIT_HOLDER_STAT_INIT, 1}, {REFIT_HOLDER_STAT_INIT, 2}, {REFIT_HOLDER_STAT_INIT, 3}};
    hs[0].h.size = sizeof(hs[0]);
    nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, &hs[0].h, 3, &nh));
    assert_int_equal(nh, n);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(hs[i].h.size, sizeof(hs[0]));
        assert_int_equal(strncmp(hs[i].h.name, "trainer:", 8), 0);
        assert_int_equal(hs[i].future, i + 1);
        sum += hs[i].h.bytes;
    }
    assert_true(sum >= newer.rep.bytes);
    assert_int_equal(hs[2].h.name[0], '\0'); /* beyond the holders: untouched */
    assert_int_equal(hs[2].future, 3);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* ---- cases ---------------------------------------------------------------- */

static void end_to_end_shm_file(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=2,ep=2,etp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p[2];
    for (uint32_t k = 0; k < 2; k++) p[k] = pub_start(&c, k);
    void *b0, *b1;
    refit_receiver_t *r0 = receiver("tiny-moe", "vllm:tp=2", 0, &g, "shm", 0, &b0);
    refit_receiver_t *r1 = receiver("tiny-moe", "vllm:tp=2", 1, &g, "shm", 0, &b1);
    refit_manifest_t *m0 = t_manifest_named("tiny-moe", "vllm:tp=2", 0);
    const uint64_t size0 = refit_manifest_region_size(m0, 0);
    refit_manifest_destroy(m0);
    for (uint64_t v = 1; v <= 3; v++) {
        for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish %llu", (unsigned long long)v);
        refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
        /* Poison first: the pull must leave the memory byte-identical to the truth. */
        memset(b0, 0xa5, size0);
        REFIT_ASSERT_OK(refit_receiver_pull(r0, REFIT_VERSION_NEWEST, 10000, &rep));
        assert_int_equal(rep.version, v);
        assert_int_equal(rep.sources, 2);
        assert_string_equal(rep.transport, "shm");
        /* First pull plans and reads both manifests; later ones neither. */
        assert_int_equal(rep.planned, v == 1);
        assert_int_equal(rep.manifests_read, v == 1 ? 2 : 0);
        /* Every byte the placements cover was checked against the publishers' digests. */
        refit_plan_t *pl;
        refit_manifest_t *srcs[2] = {t_manifest_named("tiny-moe", "megatron:tp=2,ep=2,etp=1", 0),
                                     t_manifest_named("tiny-moe", "megatron:tp=2,ep=2,etp=1", 1)};
        refit_manifest_t *dm = t_manifest_named("tiny-moe", "vllm:tp=2", 0);
        REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)srcs, 2, dm, NULL, &pl));
        refit_plan_stats_t ps = REFIT_PLAN_STATS_INIT;
        refit_plan_stats(pl, &ps);
        assert_int_equal(rep.digest_bytes, ps.bytes_written);
        assert_int_equal(rep.unverified_bytes, 0);
        assert_true(rep.digest_ms > 0 && rep.digest_ms <= rep.verify_ms);
        refit_plan_destroy(pl);
        refit_manifest_destroy(dm);
        refit_manifest_destroy(srcs[0]);
        refit_manifest_destroy(srcs[1]);
        REFIT_ASSERT_OK(refit_receiver_pull(r1, v, 10000, &rep));
        expect_truth("tiny-moe", "vllm:tp=2", 0, b0, v);
        expect_truth("tiny-moe", "vllm:tp=2", 1, b1, v);
        assert_int_equal(refit_receiver_committed(r0), v);
        assert_true(refit_receiver_usable(r0));
        for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait %llu 5000", (unsigned long long)v);
    }
    /* Nothing newer: a bounded wait that says what it waited for. */
    REFIT_ASSERT_ERR(refit_receiver_pull(r0, REFIT_VERSION_NEWEST, 300, NULL), REFIT_ERR_TIMEOUT, "newer than 3");
    assert_int_equal(refit_receiver_committed(r0), 3);
    assert_true(refit_receiver_usable(r0));
    refit_receiver_destroy(r0);
    refit_receiver_destroy(r1);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* refit_receiver_prepare: refused (bounded) while the sources have not
 * published; once they have, it reads the manifests, plans and connects, so
 * the first pull reads no manifest and plans nothing, and its bytes are
 * right. */
static void prepare_before_first_pull(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=2,ep=2,etp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p[2];
    for (uint32_t k = 0; k < 2; k++) p[k] = pub_start(&c, k);
    void *b;
    refit_receiver_t *r = receiver("tiny-moe", "vllm:tp=2", 1, &g, "shm", 0, &b);
    double ms = -1;
    REFIT_ASSERT_ERR(refit_receiver_prepare(r, 300, &ms), REFIT_ERR_TIMEOUT, "no source of group");
    assert_true(ms < 0); /* outputs written only on success */
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    REFIT_ASSERT_OK(refit_receiver_prepare(r, 10000, &ms));
    assert_true(ms > 0);
    refit_manifest_t *m = t_manifest_named("tiny-moe", "vllm:tp=2", 1);
    memset(b, 0xa5, refit_manifest_region_size(m, 0));
    refit_manifest_destroy(m);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &rep));
    assert_false(rep.planned);
    assert_int_equal(rep.manifests_read, 0);
    assert_int_equal(rep.sources, 2);
    expect_truth("tiny-moe", "vllm:tp=2", 1, b, 1);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 1 5000");
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 2");
    REFIT_ASSERT_OK(refit_receiver_pull(r, 2, 10000, &rep));
    expect_truth("tiny-moe", "vllm:tp=2", 1, b, 2);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

static void process_vm_readv_path(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-mla", "megatron:tp=2,ep=2,etp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, true, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b;
    refit_receiver_t *r = receiver("tiny-mla", "vllm:tp=4", 3, &g, "shm", 0, &b);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &rep));
    assert_string_equal(rep.lanes, "shm:process_vm_readv");
    expect_truth("tiny-mla", "vllm:tp=4", 3, b, 1);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

static void snapshot_mode(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=2", g.url, g.job, "shm", NULL, REFIT_MODE_SNAPSHOT, 0, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b;
    refit_receiver_t *r = receiver("tiny-dense", "vllm:tp=1", 0, &g, NULL, 0, &b);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    /* The trainer goes on at once: its memory now holds other bytes, but the
     * snapshot of version 1 is what receivers read. */
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "scribble 99");
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, NULL));
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 1);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 2");
    REFIT_ASSERT_OK(refit_receiver_pull(r, REFIT_VERSION_NEWEST, 10000, NULL));
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 2);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

static void end_to_end_redis(void **state)
{
    (void)state;
#ifndef REFIT_HAVE_REDIS
    skip();
#else
    if (!t_in_path("redis-server")) {
        print_message("[  SKIPPED ] redis-server is not installed (scripts/deps.sh installs it)\n");
        skip();
    }
    t_redis_t rs = {0};
    assert_true(t_redis_start(&rs, 0));
    reg_t g;
    snprintf(g.url, sizeof(g.url), "redis://127.0.0.1:%d", rs.port);
    snprintf(g.job, sizeof(g.job), "redis-%d", (int)getpid());
    g.dir[0] = '\0';
    pubcfg_t c = {"tiny-moe", "megatron:ep=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 600, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b;
    refit_receiver_t *r = receiver("tiny-moe", "vllm:tp=1", 0, &g, "shm", 0, &b);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &rep));
    expect_truth("tiny-moe", "vllm:tp=1", 0, b, 1);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 1 5000");
    /* Redis goes away: a pull fails with a clear registry error, in bounded time. */
    t_redis_stop(&rs);
    double t0 = refit_now();
    REFIT_ASSERT_ERR(refit_receiver_pull(r, REFIT_VERSION_NEWEST, 2000, NULL), REFIT_ERR_REGISTRY, "redis");
    assert_true(t_ms_since(t0) < 6000);
    assert_int_equal(refit_receiver_committed(r), 1);
    assert_true(refit_receiver_usable(r));
    expect_truth("tiny-moe", "vllm:tp=1", 0, b, 1);
    /* ...and comes back empty (no persistence): publishers write their
     * manifests and records again on their next heartbeat. */
    assert_true(t_redis_start(&rs, rs.port));
    refit_registry_t *reg;
    REFIT_ASSERT_OK(refit_registry_open(g.url, g.job, &reg));
    for (uint32_t k = 0; k < 2; k++) {
        void *mb = NULL;
        size_t ml;
        t0 = refit_now();
        while (refit_registry_get_manifest(reg, "trainer", k, &mb, &ml) && t_ms_since(t0) < 5000) t_msleep(20);
        assert_non_null(mb);
        free(mb);
    }
    refit_registry_close(reg);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 2");
    REFIT_ASSERT_OK(refit_receiver_pull(r, 2, 10000, &rep));
    expect_truth("tiny-moe", "vllm:tp=1", 0, b, 2);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_redis_stop(&rs);
    t_rm_tree(rs.dir);
#endif
}

/* Partial refit through the engine: a receiver with a narrowed manifest
 * (refit_manifest_select) over the same memory pulls only layer 1 and the
 * lm_head (whole fused tensors) and verifies only those; the rest of the
 * memory keeps the previous version. */
static void partial_refit(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=2,ep=2,etp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p[2];
    for (uint32_t k = 0; k < 2; k++) p[k] = pub_start(&c, k);
    void *b;
    refit_receiver_t *full = receiver("tiny-moe", "vllm:tp=2", 0, &g, "shm", 0, &b);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    REFIT_ASSERT_OK(refit_receiver_pull(full, 1, 10000, NULL));
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 1 5000");
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 2");
    refit_manifest_t *m = t_manifest_named("tiny-moe", "vllm:tp=2", 0), *sel, *rest;
    refit_select_report_t sr = REFIT_SELECT_REPORT_INIT;
    REFIT_ASSERT_OK(refit_manifest_select(m, "layer:1,lm_head.weight", false, &sel, &sr));
    REFIT_ASSERT_OK(refit_manifest_select(m, "layer:1,lm_head.weight", true, &rest, NULL));
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g.url;
    rp.job = g.job;
    rp.transports = "shm";
    rp.verify = REFIT_VERIFY_TRUTH;
    rp.reader = "partial";
    refit_receiver_t *part;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, sel, &part));
    REFIT_ASSERT_OK(refit_receiver_attach(part, 0, b));
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(part, 2, 10000, &rep));
    assert_int_equal(rep.version, 2);
    assert_true(rep.bytes < sr.bytes + 1);
    assert_true(rep.bytes * 2 < refit_manifest_region_size(m, 0));
    REFIT_ASSERT_OK(refit_manifest_select(m, "layer:1,lm_head.weight", false, &sel, NULL));
    REFIT_ASSERT_OK(refit_truth_verify(sel, (const void *const *)&b, 2, NULL));
    REFIT_ASSERT_OK(refit_truth_verify(rest, (const void *const *)&b, 1, NULL));
    REFIT_ASSERT_ERR(refit_truth_verify(m, (const void *const *)&b, 2, NULL), REFIT_ERR_VERIFY, "");
    refit_receiver_destroy(part);
    refit_receiver_destroy(full);
    refit_manifest_destroy(sel);
    refit_manifest_destroy(rest);
    refit_manifest_destroy(m);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* ---- delta refit ------------------------------------------------------------ */

static refit_receiver_t *delta_receiver(const char *model, const char *layout, uint32_t rank, const reg_t *g,
                                        double fraction, const char *reader, void **base)
{
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g->url;
    rp.job = g->job;
    rp.transports = "shm";
    rp.verify = REFIT_VERIFY_TRUTH;
    rp.truth_fraction = fraction;
    rp.reader = reader;
    rp.threads = 2;
    refit_receiver_t *r;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(model, layout, rank), &r));
    REFIT_ASSERT_OK(refit_receiver_alloc(r, 0, base));
    return r;
}

/* Independent proof for the delta truth. */
static void expect_truth_delta(const char *model, const char *layout, uint32_t rank, void *base, uint64_t v, double f)
{
    refit_manifest_t *m = t_manifest_named(model, layout, rank);
    REFIT_ASSERT_OK(refit_truth_verify_delta(m, (const void *const *)&base, v, f, NULL));
    refit_manifest_destroy(m);
}

/* How each rank's digest table of the last publish_delta was made: "delta" (the base's plus the changes the
 * encoder noted) or "pass" (refit_publish_delta_t.table_from_delta). */
static char g_table[2][8];

/* Publishes v on both ranks; returns the delta base rank 0 offered. */
static unsigned long long publish_delta(pub_t p[2], uint64_t v)
{
    unsigned long long base = 99, bytes = 0, of = 0;
    for (uint32_t k = 0; k < 2; k++) {
        const char *r = pub_cmd(&p[k], "publish %llu", (unsigned long long)v);
        if (strncmp(r, "REFIT_OK", 8)) fail_msg("publisher said: %s", r);
        unsigned long long b2;
        assert_int_equal(sscanf(r, "REFIT_OK base=%llu bytes=%llu of=%llu table=%7s", &b2, &bytes, &of, g_table[k]), 4);
        if (k == 0) base = b2;
        else assert_int_equal(b2, base);
    }
    return base;
}

/* Both ranks' tables of the last publish_delta were made `how`. */
static void expect_table(const char *how)
{
    for (uint32_t k = 0; k < 2; k++)
        if (strcmp(g_table[k], how)) fail_msg("rank %u's digest table: %s, want %s", k, g_table[k], how);
}

#define DM "tiny-moe", "vllm:tp=2"

static void delta_refit(void **state)
{
    (void)state;
    const double f = 0.02;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=2,ep=2,etp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, f};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b0, *b1;
    refit_receiver_t *r0 = delta_receiver(DM, 0, &g, f, "d0", &b0), *r1 = delta_receiver(DM, 1, &g, f, "d1", &b1);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    /* Version 1: nothing to take a delta from; its digest table is a pass over the shard, every later one the
     * one before plus the encoder's changes, checked by every pull below (the receivers' digests). */
    assert_int_equal(publish_delta(p, 1), 0);
    expect_table("pass");
    REFIT_ASSERT_OK(refit_receiver_pull(r0, 1, 10000, &rep));
    assert_int_equal(rep.delta_base, 0);
    uint64_t full_bytes = rep.bytes;
    REFIT_ASSERT_OK(refit_receiver_pull(r1, 1, 10000, &rep));
    for (uint64_t v = 2; v <= 4; v++) {
        for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait %llu 5000", (unsigned long long)(v - 1));
        assert_int_equal(publish_delta(p, v), v - 1);
        expect_table("delta");
        /* r0 takes every version as a delta: a few percent of the bytes. */
        REFIT_ASSERT_OK(refit_receiver_pull(r0, v, 10000, &rep));
        assert_int_equal(rep.delta_base, v - 1);
        assert_true(rep.delta_units > 0);
        assert_true(rep.bytes * 10 < full_bytes);
        assert_non_null(strstr(rep.lanes, "(delta)"));
        expect_truth_delta(DM, 0, b0, v, f);
        assert_true(refit_receiver_usable(r0));
        /* r1 skips version 2: version 3's delta is from a version it lacks, so it pulls in full. */
        if (v == 2) continue;
        REFIT_ASSERT_OK(refit_receiver_pull(r1, v, 10000, &rep));
        assert_int_equal(rep.delta_base, v == 3 ? 0 : v - 1);
        expect_truth_delta(DM, 1, b1, v, f);
    }
    /* A receiver that wants none pulls in full. */
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 4 5000");
    assert_int_equal(publish_delta(p, 5), 4);
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g.url;
    rp.job = g.job;
    rp.transports = "shm";
    rp.no_delta = true;
    rp.reader = "nodelta";
    refit_receiver_t *rn;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(DM, 1), &rn));
    REFIT_ASSERT_OK(refit_receiver_attach(rn, 0, b1));
    REFIT_ASSERT_OK(refit_receiver_pull(rn, 5, 10000, &rep));
    assert_int_equal(rep.delta_base, 0);
    expect_truth_delta(DM, 1, b1, 5, f);
    refit_receiver_destroy(rn);
    /* The trainer restarts and publishes version 5 again, then 6.  r0 holds
     * the old incarnation's 5: the new delta's base has the same number but
     * comes from another publisher, so r0 pulls in full. */
    REFIT_ASSERT_OK(refit_receiver_pull(r0, 5, 10000, &rep));
    assert_int_equal(rep.delta_base, 4);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    for (uint32_t k = 0; k < 2; k++) p[k] = pub_start(&c, k);
    assert_int_equal(publish_delta(p, 5), 0);
    expect_table("pass"); /* a new publisher: its first table is a pass */
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 5 5000");
    assert_int_equal(publish_delta(p, 6), 5);
    expect_table("delta");
    REFIT_ASSERT_OK(refit_receiver_pull(r0, 6, 10000, &rep));
    assert_int_equal(rep.delta_base, 0);
    expect_truth_delta(DM, 0, b0, 6, f);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 6 5000");
    assert_int_equal(publish_delta(p, 7), 6);
    REFIT_ASSERT_OK(refit_receiver_pull(r0, 7, 10000, &rep));
    assert_int_equal(rep.delta_base, 6);
    expect_truth_delta(DM, 0, b0, 7, f);
    refit_receiver_destroy(r0);
    refit_receiver_destroy(r1);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* A delta that would cost more than delta_max_pct of the bytes is not
 * offered; a corrupt one is refused while applying and the pull completes in
 * full; snapshot publishers offer deltas too. */
static void delta_fallbacks(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    void *b;
    /* 30% of elements change: sparse would cost more than the chunks, so the
     * delta is about the size of the region and not offered. */
    pubcfg_t c = {"tiny-moe", "megatron:tp=2,ep=2,etp=1", g.url, g.job, "shm",
                  NULL,       REFIT_MODE_IN_PLACE,        0,     false, 0.3};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    refit_receiver_t *r = delta_receiver(DM, 0, &g, 0.3, "big", &b);
    for (uint64_t v = 1; v <= 3; v++) {
        assert_int_equal(publish_delta(p, v), 0);
        /* Not offered, but encoded: version 2's table follows the changes.  Version 2 changed 30% of its units,
         * more than the notes pay for (3%): version 3's table is a pass. */
        expect_table(v == 2 ? "delta" : "pass");
        REFIT_ASSERT_OK(refit_receiver_pull(r, v, 10000, &rep));
        assert_int_equal(rep.delta_base, 0);
        expect_truth_delta(DM, 0, b, v, 0.3);
        for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait %llu 5000", (unsigned long long)v);
    }
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    /* Corrupt: indices that do not ascend.  The receiver may have written
     * part of the delta before it found out; the full pull that follows
     * rewrites every byte, and the memory verifies. */
    reg_file(&g);
    c.registry = g.url;
    c.job = g.job;
    c.delta = 0.02;
    setenv("REFIT_TEST_CORRUPT_DELTA", "1", 1);
    p[0] = pub_start(&c, 0);
    p[1] = pub_start(&c, 1);
    unsetenv("REFIT_TEST_CORRUPT_DELTA");
    r = delta_receiver(DM, 0, &g, 0.02, "corrupt", &b);
    assert_int_equal(publish_delta(p, 1), 0);
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &rep));
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 1 5000");
    assert_int_equal(publish_delta(p, 2), 1);
    REFIT_ASSERT_OK(refit_receiver_pull(r, 2, 10000, &rep));
    assert_int_equal(rep.delta_base, 0);
    assert_true(refit_receiver_usable(r));
    expect_truth_delta(DM, 0, b, 2, 0.02);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    /* Snapshot mode: each buffer has its delta arenas; the trainer scribbles
     * right after publishing and the delta is still the published one. */
    reg_file(&g);
    pubcfg_t sc = {"tiny-dense", "megatron:tp=2", g.url, g.job, "shm", NULL, REFIT_MODE_SNAPSHOT, 0, false, 0.02};
    p[0] = pub_start(&sc, 0);
    p[1] = pub_start(&sc, 1);
    r = delta_receiver("tiny-dense", "vllm:tp=1", 0, &g, 0.02, "snap", &b);
    for (uint64_t v = 1; v <= 4; v++) {
        assert_int_equal(publish_delta(p, v), v - 1);
        expect_table(v == 1 ? "pass" : "delta"); /* from the other buffer's table */
        for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "scribble 99");
        REFIT_ASSERT_OK(refit_receiver_pull(r, v, 10000, &rep));
        assert_int_equal(rep.delta_base, v - 1);
        expect_truth_delta("tiny-dense", "vllm:tp=1", 0, b, v, 0.02);
    }
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(end_to_end_shm_file),   cmocka_unit_test(prepare_before_first_pull),
        cmocka_unit_test(sized_outputs),         cmocka_unit_test(partial_refit),
        cmocka_unit_test(delta_refit),           cmocka_unit_test(delta_fallbacks),
        cmocka_unit_test(process_vm_readv_path), cmocka_unit_test(snapshot_mode),
        cmocka_unit_test(end_to_end_redis),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
