/* The receiver's path (refit_rx_path_t): every path a pull takes on this
 * machine's memory, each checked in the pull report and by the bytes (the
 * synthetic truth, verified independently of the pull).  Publishers and
 * receivers share this process (shm reads its own memory); a file registry.
 * The GPU paths (gpu_direct, gpu_fp8) are checked in tests/gpu. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SRC "tiny-moe", "megatron:ep=2"
#define DST "tiny-moe", "vllm:tp=2"

typedef struct {
    char dir[64], url[96], job[32];
    refit_publisher_t *pub[2];
    refit_manifest_t *pm[2]; /* the publishers' manifests (owned by them) */
    void *pbase[2];
    double delta; /* > 0: delta publishers, their truth changing this share per version */
} bench_t;

static void bench_start(bench_t *b, double delta)
{
    static int seq;
    memset(b, 0, sizeof(*b));
    snprintf(b->dir, sizeof(b->dir), "/tmp/refit-rxpath-XXXXXX");
    assert_non_null(mkdtemp(b->dir));
    snprintf(b->url, sizeof(b->url), "file:%s", b->dir);
    snprintf(b->job, sizeof(b->job), "rxpath%d-%d", (int)getpid(), ++seq);
    b->delta = delta;
    for (uint32_t k = 0; k < 2; k++) {
        refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
        pp.registry = b->url;
        pp.job = b->job;
        pp.transports = "shm";
        pp.mode = REFIT_MODE_IN_PLACE;
        pp.delta = delta > 0;
        b->pm[k] = t_manifest_named(SRC, k);
        REFIT_ASSERT_OK(refit_publisher_create(&pp, b->pm[k], &b->pub[k]));
        REFIT_ASSERT_OK(refit_publisher_alloc(b->pub[k], 0, &b->pbase[k]));
    }
}

static void bench_publish(bench_t *b, uint64_t v)
{
    for (uint32_t k = 0; k < 2; k++) {
        if (b->delta > 0) REFIT_ASSERT_OK(refit_truth_fill_delta(b->pm[k], &b->pbase[k], v, b->delta));
        else REFIT_ASSERT_OK(refit_truth_fill(b->pm[k], &b->pbase[k], v));
        REFIT_ASSERT_OK(refit_publisher_publish(b->pub[k], v));
    }
}

static void bench_stop(bench_t *b)
{
    for (uint32_t k = 0; k < 2; k++) refit_publisher_destroy(b->pub[k]);
    t_rm_tree(b->dir);
}

static refit_receiver_t *rx(const bench_t *b, const char *reader, int relay_slot, void **base)
{
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = b->url;
    rp.job = b->job;
    rp.transports = "shm";
    rp.reader = reader;
    rp.relay_slot = relay_slot;
    rp.relay_heartbeat_ms = 100;
    rp.threads = 2;
    rp.chunk_kb = 16; /* many chunks even for a tiny model */
    refit_receiver_t *r;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(DST, 1), &r));
    REFIT_ASSERT_OK(refit_receiver_alloc(r, 0, base));
    return r;
}

/* The pull's path, its name, and the bytes: the truth of v (delta: the delta truth); every byte checked
 * against the publishers' digests, which a direct pull and the fleet's chunks computed while they copied and a
 * delta while it applied (from the sums of the version before, docs/digest.md): no path hashes in a pass of its
 * own. */
static void expect_pull(refit_receiver_t *r, const bench_t *b, void *base, uint64_t v, refit_rx_path_t want)
{
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, v, 10000, &rep));
    if (rep.path != (uint32_t)want)
        fail_msg("version %llu came the %s way, not %s (lanes: %s)", (unsigned long long)v,
                 refit_rx_path_name((refit_rx_path_t)rep.path), refit_rx_path_name(want), rep.lanes);
    assert_int_equal(rep.version, v);
    assert_true(rep.bytes > 0);
    assert_true(rep.digest_bytes > 0);
    assert_int_equal(rep.unverified_bytes, 0);
    if (!rep.digest_fused)
        fail_msg("version %llu (%s): digest_fused %d", (unsigned long long)v, refit_rx_path_name(want),
                 rep.digest_fused);
    refit_manifest_t *m = t_manifest_named(DST, 1);
    if (b->delta > 0) REFIT_ASSERT_OK(refit_truth_verify_delta(m, (const void *const *)&base, v, b->delta, NULL));
    else REFIT_ASSERT_OK(refit_truth_verify(m, (const void *const *)&base, v, NULL));
    refit_manifest_destroy(m);
}

static void path_names(void **state)
{
    (void)state;
    assert_string_equal(refit_rx_path_name(REFIT_RX_PATH_NONE), "none");
    assert_string_equal(refit_rx_path_name(REFIT_RX_PATH_HOST_DIRECT), "host_direct");
    assert_string_equal(refit_rx_path_name(REFIT_RX_PATH_HOST_FLEET), "host_fleet");
    assert_string_equal(refit_rx_path_name(REFIT_RX_PATH_GPU_DIRECT), "gpu_direct");
    assert_string_equal(refit_rx_path_name(REFIT_RX_PATH_GPU_FP8), "gpu_fp8");
    assert_string_equal(refit_rx_path_name(REFIT_RX_PATH_DELTA), "delta");
    assert_string_equal(refit_rx_path_name((refit_rx_path_t)99), "unknown");
}

/* Host memory, the trainer ranks alone: one direct pull of the plan. */
static void host_direct(void **state)
{
    (void)state;
    bench_t b;
    bench_start(&b, 0);
    void *base;
    refit_receiver_t *r = rx(&b, "direct", -1, &base);
    for (uint64_t v = 1; v <= 2; v++) {
        bench_publish(&b, v);
        expect_pull(r, &b, base, v, REFIT_RX_PATH_HOST_DIRECT);
        for (uint32_t k = 0; k < 2; k++) REFIT_ASSERT_OK(refit_publisher_wait_readers(b.pub[k], v, 5000));
    }
    refit_receiver_destroy(r);
    bench_stop(&b);
}

/* A receiver that finds a relay among the holders of the version reads in
 * chunks (the relay itself pulled direct: over shm a relay publishes at its
 * commit, over a network it would pull in chunks for its readers to follow). */
static void host_fleet(void **state)
{
    (void)state;
    bench_t b;
    bench_start(&b, 0);
    void *rbase, *base;
    refit_receiver_t *relay = rx(&b, "relay", 0, &rbase);
    bench_publish(&b, 1);
    expect_pull(relay, &b, rbase, 1, REFIT_RX_PATH_HOST_DIRECT);
    refit_receiver_t *r = rx(&b, "reader", -1, &base);
    expect_pull(r, &b, base, 1, REFIT_RX_PATH_HOST_FLEET);
    refit_holder_stat_t hs[8];
    for (int i = 0; i < 8; i++) hs[i].size = sizeof(hs[i]);
    size_t n = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &n));
    bool relay_read = false;
    for (size_t i = 0; i < n; i++) relay_read |= !strncmp(hs[i].name, "relay:", 6);
    assert_true(relay_read); /* the relay was among the holders */
    refit_receiver_destroy(r);
    refit_receiver_destroy(relay);
    bench_stop(&b);
}

/* ---- chunks read twice: a holder whose reads are held back -------------------------------------------------
 * The relay's every chunk read waits 400 ms before it copies (REFIT_TEST_READ_DELAY_MS): the trainer ranks, done
 * with their own shares, re-read its overdue chunks (steals, after 4x the mean chunk time + 100 ms), and the
 * relay's own copies of those chunks land after theirs.  Each such chunk is written by two reads in flight at
 * once.  The trainer ranks' reads wait 20 ms each, so that the relay's workers have read its progress and claimed
 * chunks of its share before the trainer ranks are through theirs (a relay that has not answered yet has its
 * share served by the others, and then nothing is read twice: the tests then try again, up to 4 times). */

/* A relay pulls version 1 (direct; spoil, if given, then rewrites its memory); a reader (no reader limit: the
 * relay and the trainer ranks are its holders) pulls it with the relay held back.  Returns the reader's pull
 * status; *truth: whether the reader's memory is the truth of version 1 (checked before the reader is
 * destroyed); *steals: the chunks the trainer ranks re-read; *relay_chunks: the relay's reads that completed. */
static refit_status_t relayed_pull(const bench_t *b, void (*spoil)(void *base, uint64_t len), refit_status_t *truth,
                                   refit_pull_report_t *rep, uint32_t *steals, uint32_t *relay_chunks)
{
    void *rbase;
    refit_receiver_t *relay = rx(b, "relay", 0, &rbase);
    expect_pull(relay, b, rbase, 1, REFIT_RX_PATH_HOST_DIRECT);
    refit_manifest_t *m = t_manifest_named(DST, 1);
    if (spoil) spoil(rbase, refit_manifest_region_size(m, 0)); /* what the relay serves from now on */
    refit_manifest_destroy(m);
    void *base;
    refit_receiver_t *r = rx(b, "reader", -1, &base);
    setenv("REFIT_TEST_READ_DELAY_MS", "relay:0=400,trainer:0=20,trainer:1=20", 1);
    refit_status_t st = refit_receiver_pull(r, 1, 10000, rep);
    unsetenv("REFIT_TEST_READ_DELAY_MS");
    m = t_manifest_named(DST, 1);
    *truth = refit_truth_verify(m, (const void *const *)&base, 1, NULL);
    refit_manifest_destroy(m);
    refit_holder_stat_t hs[8];
    for (int i = 0; i < 8; i++) hs[i] = (refit_holder_stat_t)REFIT_HOLDER_STAT_INIT;
    size_t n = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &n));
    *steals = *relay_chunks = 0;
    for (size_t i = 0; i < n; i++) {
        if (!strncmp(hs[i].name, "trainer:", 8)) *steals += hs[i].steals;
        if (!strcmp(hs[i].name, "relay:0")) *relay_chunks = hs[i].chunks;
    }
    refit_receiver_destroy(r);
    refit_receiver_destroy(relay);
    return st;
}

/* A redone chunk is summed once: the reads that were not alone on their chunk drop their sums, and those chunks
 * are hashed in place after every read has returned.  The check then passes on the copies' sums (digest_fused:
 * the mapped bytes were hashed exactly once each; a chunk counted twice leaves them above the map's, and the
 * receiver falls back to a pass, or sums that fail the check), 0 bytes unverified, the bytes the truth. */
static void fleet_redone_chunk_counted_once(void **state)
{
    (void)state;
    bench_t b;
    bench_start(&b, 0);
    bench_publish(&b, 1);
    refit_status_t truth = REFIT_OK;
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    uint32_t steals = 0, relay_chunks = 0;
    for (int i = 0; i < 4 && (!steals || !relay_chunks); i++)
        REFIT_ASSERT_OK(relayed_pull(&b, NULL, &truth, &rep, &steals, &relay_chunks));
    assert_int_equal(rep.path, REFIT_RX_PATH_HOST_FLEET);
    if (!steals || !relay_chunks)
        fail_msg("no chunk was read twice in 4 tries (trainer re-reads %u, relay reads %u)", steals, relay_chunks);
    assert_true(rep.digest_fused);
    assert_int_equal(rep.unverified_bytes, 0);
    assert_true(rep.digest_bytes > 0);
    assert_int_equal(truth, REFIT_OK);
    bench_stop(&b);
}

static void flip_all(void *base, uint64_t len)
{
    for (uint64_t i = 0; i < len; i++) ((unsigned char *)base)[i] ^= 0x5a;
}

/* The same with the relay's memory corrupt (every byte flipped after its commit): its late copies overwrite the
 * trainer's good bytes of the chunks it shared, so the memory ends with the relay's bytes there.  The sums are of
 * the memory as it ends (hashed in place after the reads), not of the first read that completed: the check
 * fails (REFIT_ERR_VERIFY).  Whatever the timing, a pull that passes holds the truth. */
static void fleet_tamper_late_copy_caught(void **state)
{
    (void)state;
    bench_t b;
    bench_start(&b, 0);
    bench_publish(&b, 1);
    refit_status_t truth = REFIT_OK;
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    uint32_t steals = 0, relay_chunks = 0;
    refit_status_t st = REFIT_OK;
    for (int i = 0; i < 4 && st == REFIT_OK && (!steals || !relay_chunks); i++) /* each try: a relay pulled anew */
        st = relayed_pull(&b, flip_all, &truth, &rep, &steals, &relay_chunks);
    if (st == REFIT_OK) { /* only if the relay wrote nothing that stayed: then the memory must be the truth */
        if (truth)
            fail_msg("a pull with a corrupt relay passed its check but holds wrong bytes (%s)",
                     refit_status_name(truth));
        print_message("note: the relay's copies did not land last (trainer re-reads %u, relay reads %u)\n", steals,
                      relay_chunks);
    } else {
        assert_int_equal(st, REFIT_ERR_VERIFY);
        assert_true(relay_chunks > 0);
    }
    bench_stop(&b);
}

/* A relay's corrupt byte, read by a reader that has only the relay (reader limit 1): the chunks' sums, hashed as
 * they were copied, catch it (REFIT_ERR_VERIFY); the same pull of the relay's memory put right passes on those
 * sums (digest_fused). */
static void fleet_tamper_relay_byte(void **state)
{
    (void)state;
    bench_t b;
    bench_start(&b, 0);
    bench_publish(&b, 1);
    void *rbase, *base;
    refit_receiver_t *relay = rx(&b, "relay", 0, &rbase);
    expect_pull(relay, &b, rbase, 1, REFIT_RX_PATH_HOST_DIRECT);
    refit_manifest_t *m = t_manifest_named(DST, 1);
    /* A weight's byte in the middle of the memory (the padding between tensors is zeros, and no digest's) */
    uint64_t at = refit_manifest_region_size(m, 0) / 2;
    while (!((unsigned char *)rbase)[at]) at++;
    refit_manifest_destroy(m);
    ((unsigned char *)rbase)[at] ^= 0x01;
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = b.url;
    rp.job = b.job;
    rp.transports = "shm";
    rp.reader = "reader";
    rp.threads = 2;
    rp.chunk_kb = 16;
    rp.max_readers = 1; /* relays with room are read alone */
    refit_receiver_t *r;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(DST, 1), &r));
    REFIT_ASSERT_OK(refit_receiver_alloc(r, 0, &base));
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_ERR(refit_receiver_pull(r, 1, 10000, &rep), REFIT_ERR_VERIFY, NULL);
    ((unsigned char *)rbase)[at] ^= 0x01;
    expect_pull(r, &b, base, 1, REFIT_RX_PATH_HOST_FLEET);
    refit_holder_stat_t hs[8];
    for (int i = 0; i < 8; i++) hs[i] = (refit_holder_stat_t)REFIT_HOLDER_STAT_INIT;
    size_t n = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &n));
    assert_int_equal(n, 1);
    assert_string_equal(hs[0].name, "relay:0");
    refit_receiver_destroy(r);
    refit_receiver_destroy(relay);
    bench_stop(&b);
}

/* The sources offer a delta from what the memory holds: it is applied, three
 * versions in a row (each keeping the digests of the one before up to date:
 * a wrong sum fails the check); a receiver that wants none pulls the same
 * version in full. */
static void delta(void **state)
{
    (void)state;
    bench_t b;
    bench_start(&b, 0.02);
    void *base, *nbase;
    refit_receiver_t *r = rx(&b, "delta", -1, &base);
    bench_publish(&b, 1);
    expect_pull(r, &b, base, 1, REFIT_RX_PATH_HOST_DIRECT); /* nothing to take a delta from */
    for (uint32_t k = 0; k < 2; k++) REFIT_ASSERT_OK(refit_publisher_wait_readers(b.pub[k], 1, 5000));
    for (uint64_t v = 2; v <= 4; v++) {
        if (v > 2)
            for (uint32_t k = 0; k < 2; k++) REFIT_ASSERT_OK(refit_publisher_wait_readers(b.pub[k], v - 1, 5000));
        bench_publish(&b, v);
        expect_pull(r, &b, base, v, REFIT_RX_PATH_DELTA);
    }
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = b.url;
    rp.job = b.job;
    rp.transports = "shm";
    rp.reader = "nodelta";
    rp.no_delta = true;
    refit_receiver_t *rn;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(DST, 1), &rn));
    REFIT_ASSERT_OK(refit_receiver_alloc(rn, 0, &nbase));
    expect_pull(rn, &b, nbase, 4, REFIT_RX_PATH_HOST_DIRECT);
    refit_receiver_destroy(rn);
    refit_receiver_destroy(r);
    bench_stop(&b);
}

/* A pull that moved nothing (no version by the deadline) says so. */
static void none_moved(void **state)
{
    (void)state;
    bench_t b;
    bench_start(&b, 0);
    void *base;
    refit_receiver_t *r = rx(&b, "early", -1, &base);
    bench_publish(&b, 1);
    expect_pull(r, &b, base, 1, REFIT_RX_PATH_HOST_DIRECT);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_ERR(refit_receiver_pull(r, 2, 200, &rep), REFIT_ERR_TIMEOUT, NULL);
    assert_int_equal(rep.path, REFIT_RX_PATH_NONE);
    refit_receiver_destroy(r);
    bench_stop(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(path_names),
        cmocka_unit_test(host_direct),
        cmocka_unit_test(host_fleet),
        cmocka_unit_test(delta),
        cmocka_unit_test(none_moved),
        cmocka_unit_test(fleet_redone_chunk_counted_once),
        cmocka_unit_test(fleet_tamper_late_copy_caught),
        cmocka_unit_test(fleet_tamper_relay_byte),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
