/* Delta refit: the truth's change-fraction mode, encoding (sparse and
 * blocks), plan-guided application bit-exact against a full refit, refusal
 * of a wrong base, fetching only the chunks the plan reads. */
#include "testutil.h"

#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

#define CHUNK_BYTES ((uint64_t)REFIT_DELTA_CHUNK_UNITS * 2)

static void truth_delta(void **state)
{
    (void)state;
    uint64_t s = refit_truth_tensor_seed("model.layers.0.mlp.down_proj.weight");
    uint64_t changed = 0, n = 200000;
    for (uint64_t i = 0; i < n; i++) {
        /* fraction 1: the plain truth, so existing tests hold. */
        assert_int_equal(refit_truth_value_delta(s, REFIT_DTYPE_BF16, i, 5, 1.0),
                         refit_truth_value(s, REFIT_DTYPE_BF16, i, 5));
        uint64_t a = refit_truth_value_delta(s, REFIT_DTYPE_BF16, i, 4, 0.01);
        uint64_t b = refit_truth_value_delta(s, REFIT_DTYPE_BF16, i, 5, 0.01);
        if (refit_truth_changed(s, i, 5, 0.01)) {
            changed++;
            assert_int_equal(b, refit_truth_value(s, REFIT_DTYPE_BF16, i, 5));
            assert_int_not_equal(a, b); /* the version parity bit differs */
        } else {
            assert_int_equal(a, b);
        }
    }
    assert_true(changed > n / 200 && changed < n * 3 / 200); /* about 1% */
}

typedef struct {
    refit_manifest_t *src[2], *dst;
    void *sbase[2], *dbase, *full;
    const void *const *sb[2];
    refit_plan_t *plan;
    uint64_t dsize;
} pair_t;

static void pair_make(pair_t *p)
{
    memset(p, 0, sizeof(*p));
    for (int i = 0; i < 2; i++) {
        p->src[i] = t_manifest_named("tiny-moe", "megatron:ep=2", (uint32_t)i);
        p->sbase[i] = calloc(1, refit_manifest_region_size(p->src[i], 0));
        p->sb[i] = (const void *const *)&p->sbase[i];
    }
    p->dst = t_manifest_named("tiny-moe", "vllm:tp=2", 1);
    p->dsize = refit_manifest_region_size(p->dst, 0);
    p->dbase = calloc(1, p->dsize);
    p->full = calloc(1, p->dsize);
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)p->src, 2, p->dst, NULL, &p->plan));
}

static void pair_free(pair_t *p)
{
    refit_plan_destroy(p->plan);
    for (int i = 0; i < 2; i++) {
        refit_manifest_destroy(p->src[i]);
        free(p->sbase[i]);
    }
    refit_manifest_destroy(p->dst);
    free(p->dbase);
    free(p->full);
}

static refit_status_t apply_st(pair_t *p, int i, const void *d, size_t len, uint64_t have)
{
    refit_delta_index_t *ix;
    REFIT_ASSERT_OK(refit_delta_index_create(p->plan, (uint32_t)i, 0, refit_manifest_region_size(p->src[i], 0), &ix));
    /* Source 1 through three threads, source 0 through the one-thread entry. */
    refit_status_t st = i ? refit_delta_apply_threads(ix, d, len, have, &p->dbase, 3, NULL)
                          : refit_delta_apply(ix, d, len, have, &p->dbase, NULL);
    refit_delta_index_destroy(ix);
    return st;
}

static void apply(pair_t *p, int i, const void *d, size_t len, uint64_t have)
{
    REFIT_ASSERT_OK(apply_st(p, i, d, len, have));
}

static void fill_sources(pair_t *p, uint64_t v, double frac)
{
    for (int i = 0; i < 2; i++) REFIT_ASSERT_OK(refit_truth_fill_delta(p->src[i], &p->sbase[i], v, frac));
}

/* Versions 1..4 with `frac` changing; v1 full, then deltas; every version
 * verified against the truth and byte-compared with a full refit. */
static void run_versions(refit_delta_format_t fmt, double frac)
{
    pair_t p;
    pair_make(&p);
    refit_delta_params_t dp = {fmt, 64, 3}; /* three encoding threads, copies updated in the same pass */
    refit_delta_encoder_t *enc[2];
    for (int i = 0; i < 2; i++) {
        uint64_t sz = refit_manifest_region_size(p.src[i], 0);
        REFIT_ASSERT_OK(refit_delta_encoder_create(&sz, 1, &dp, &enc[i]));
    }
    for (uint64_t v = 1; v <= 4; v++) {
        fill_sources(&p, v, frac);
        void *d[2];
        size_t len[2];
        for (int i = 0; i < 2; i++) REFIT_ASSERT_OK(refit_delta_encoder_publish(enc[i], p.sb[i], v, &d[i], &len[i]));
        REFIT_ASSERT_OK(refit_plan_execute_memcpy(p.plan, (const void *const *const *)p.sb, &p.full, 1));
        if (v == 1) {
            assert_null(d[0]);
            REFIT_ASSERT_OK(refit_plan_execute_memcpy(p.plan, (const void *const *const *)p.sb, &p.dbase, 1));
        } else {
            for (int i = 0; i < 2; i++) {
                refit_delta_info_t info = REFIT_DELTA_INFO_INIT;
                REFIT_ASSERT_OK(refit_delta_info(d[i], len[i], &info));
                assert_int_equal(info.base_version, v - 1);
                assert_int_equal(info.version, v);
                /* 1% changed: sparse costs 4 bytes per changed unit (~2%); 64-byte
                 * blocks carry ~28% (1 - 0.99^32), which is why sparse is the default. */
                if (frac < 0.05 && fmt == REFIT_DELTA_SPARSE) assert_true(info.total_bytes < info.region_bytes / 25);
                if (frac < 0.05 && fmt == REFIT_DELTA_BLOCKS) assert_true(info.total_bytes < info.region_bytes / 2);
                apply(&p, i, d[i], len[i], v - 1);
            }
        }
        REFIT_ASSERT_OK(refit_truth_verify_delta(p.dst, (const void *const *)&p.dbase, v, frac, NULL));
        assert_memory_equal(p.dbase, p.full, p.dsize);
        for (int i = 0; i < 2; i++) free(d[i]);
    }
    for (int i = 0; i < 2; i++) refit_delta_encoder_destroy(enc[i]);
    pair_free(&p);
}

static void sparse_versions(void **state)
{
    (void)state;
    run_versions(REFIT_DELTA_SPARSE, 0.01);
}
static void blocks_versions(void **state)
{
    (void)state;
    run_versions(REFIT_DELTA_BLOCKS, 0.01);
}
static void dense_versions(void **state)
{
    (void)state;
    run_versions(REFIT_DELTA_SPARSE, 1.0);
}

static void wrong_base(void **state)
{
    (void)state;
    pair_t p;
    pair_make(&p);
    fill_sources(&p, 1, 0.02);
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(p.plan, (const void *const *const *)p.sb, &p.dbase, 1));
    /* A delta 2 -> 3 while the destination holds 1. */
    uint64_t sz[2] = {refit_manifest_region_size(p.src[0], 0), refit_manifest_region_size(p.src[1], 0)};
    void *v2[2], *d[2];
    size_t len[2];
    for (int i = 0; i < 2; i++) {
        v2[i] = malloc(sz[i]);
        REFIT_ASSERT_OK(refit_truth_fill_delta(p.src[i], &v2[i], 2, 0.02));
    }
    fill_sources(&p, 3, 0.02);
    for (int i = 0; i < 2; i++)
        REFIT_ASSERT_OK(refit_delta_encode(v2[i], p.sbase[i], sz[i], 2, 3, NULL, &d[i], &len[i]));
    REFIT_ASSERT_ERR(apply_st(&p, 0, d[0], len[0], 1), REFIT_ERR_STALE, "full refit");
    /* Forced onto the wrong base (a caller lying about its version): the
     * result is not version 3, and verification says so. */
    for (int i = 0; i < 2; i++) apply(&p, i, d[i], len[i], 2);
    REFIT_ASSERT_ERR(refit_truth_verify_delta(p.dst, (const void *const *)&p.dbase, 3, 0.02, NULL), REFIT_ERR_VERIFY,
                     "version 3");
    /* A truncated delta is refused. */
    REFIT_ASSERT_ERR(apply_st(&p, 1, d[1], len[1] - 1, 2), REFIT_ERR_CORRUPT, "given");
    /* A corrupt header is refused. */
    ((unsigned char *)d[0])[12] = 9;
    REFIT_ASSERT_ERR(apply_st(&p, 0, d[0], len[0], 2), REFIT_ERR_CORRUPT, "");
    /* Sparse indices out of order (in every sparse chunk) are refused. */
    refit_delta_info_t info = {.size = 8, .nchunks = 5}; /* unsized: refused, untouched */
    REFIT_ASSERT_ERR(refit_delta_info(d[1], len[1], &info), REFIT_ERR_INVALID_ARG, "refit_delta_info_t: size is 8");
    assert_int_equal(info.nchunks, 5);
    refit_delta_index_t *dix;
    REFIT_ASSERT_OK(refit_delta_index_create(p.plan, 1, 0, refit_manifest_region_size(p.src[1], 0), &dix));
    refit_delta_apply_stats_t as = {.size = 0};
    REFIT_ASSERT_ERR(refit_delta_apply(dix, d[1], len[1], 1, &p.dbase, &as), REFIT_ERR_INVALID_ARG,
                     "refit_delta_apply_stats_t");
    refit_delta_index_destroy(dix);
    info.size = sizeof(info);
    REFIT_ASSERT_OK(refit_delta_info(d[1], len[1], &info));
    uint32_t swapped = 0;
    for (uint64_t c = 0; c < info.nchunks; c++) {
        uint64_t off, n;
        refit_delta_chunk_payload(d[1], c, &off, &n);
        if (n < 8 || n % 4 || n >= (uint64_t)REFIT_DELTA_CHUNK_UNITS * 2) continue; /* not a sparse chunk of 2+ */
        unsigned char *ix = (unsigned char *)d[1] + off, t[2];
        memcpy(t, ix, 2), memcpy(ix, ix + 2, 2), memcpy(ix + 2, t, 2);
        swapped++;
    }
    assert_true(swapped > 0);
    REFIT_ASSERT_ERR(apply_st(&p, 1, d[1], len[1], 2), REFIT_ERR_CORRUPT, "not ascending");
    for (int i = 0; i < 2; i++) {
        free(v2[i]);
        free(d[i]);
    }
    pair_free(&p);
}

/* The receiver fetches the header, table and only the chunks its plan reads;
 * the others may hold anything. */
static void fetch_needed_only(void **state)
{
    (void)state;
    pair_t p;
    pair_make(&p);
    fill_sources(&p, 1, 0.3);
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(p.plan, (const void *const *const *)p.sb, &p.dbase, 1));
    uint64_t total_need = 0, total_chunks = 0;
    for (int i = 0; i < 2; i++) {
        uint64_t sz = refit_manifest_region_size(p.src[i], 0);
        void *old = malloc(sz), *d;
        size_t len;
        memcpy(old, p.sbase[i], sz);
        REFIT_ASSERT_OK(refit_truth_fill_delta(p.src[i], &p.sbase[i], 2, 0.3));
        REFIT_ASSERT_OK(refit_delta_encode(old, p.sbase[i], sz, 1, 2, NULL, &d, &len));
        refit_delta_info_t info = REFIT_DELTA_INFO_INIT;
        REFIT_ASSERT_OK(refit_delta_info(d, len, &info));
        refit_delta_index_t *ix;
        REFIT_ASSERT_OK(refit_delta_index_create(p.plan, (uint32_t)i, 0, sz, &ix));
        uint64_t nch;
        const uint8_t *need = refit_delta_index_need(ix, &nch);
        assert_int_equal(nch, info.nchunks);
        unsigned char *local = malloc(len);
        memset(local, 0xab, len); /* what was not fetched holds junk */
        memcpy(local, d, info.header_bytes);
        for (uint64_t c = 0; c < info.nchunks; c++) {
            total_chunks++;
            if (!need[c]) continue;
            total_need++;
            uint64_t off, n;
            refit_delta_chunk_payload(d, c, &off, &n);
            memcpy(local + off, (unsigned char *)d + off, n);
        }
        REFIT_ASSERT_OK(refit_delta_apply(ix, local, len, 1, &p.dbase, NULL));
        refit_delta_index_destroy(ix);
        free(local);
        free(old);
        free(d);
    }
    REFIT_ASSERT_OK(refit_truth_verify_delta(p.dst, (const void *const *)&p.dbase, 2, 0.3, NULL));
    assert_true(total_need > 0 && total_need <= total_chunks);
    pair_free(&p);
}

/* Plan regions no layout pair here produces, applied against a reference
 * copy of their rows: loops listed innermost-last (reordered by the index),
 * rows that repeat source bytes (kept one region per row), odd offsets and
 * strides (units that straddle rows), rows across chunk boundaries, and
 * regions that read the same source bytes. */
static void odd_regions(void **state)
{
    (void)state;
    const uint64_t sbytes = 400000, dbytes = 270000;
    refit_plan_region_t regs[] = {
        {.run = 128, .nloops = 2, .count = {2, 50}, .src_stride = {8192, 128}, .dst_stride = {6400, 128}},
        {.src_offset = 200000,
         .dst_offset = 12800,
         .run = 1000,
         .nloops = 1,
         .count = {3},
         .src_stride = {0},
         .dst_stride = {1000}},
        {.src_offset = 130970,
         .dst_offset = 15800,
         .run = 301,
         .nloops = 1,
         .count = {5},
         .src_stride = {1001},
         .dst_stride = {301}},
        {.src_offset = 20000, .dst_offset = 17305, .run = 250000},
    };
    refit_plan_t plan = {0};
    plan.regions.data = regs;
    plan.regions.len = sizeof regs / sizeof regs[0];
    unsigned char *v1 = malloc(sbytes), *v2 = malloc(sbytes), *want = calloc(1, dbytes), *got = calloc(1, dbytes);
    assert_non_null(v1 && v2 && want && got);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i < sbytes; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        v1[i] = (unsigned char)x;
        v2[i] = (x >> 20) % 50 ? v1[i] : (unsigned char)(v1[i] + 1); /* ~2% of bytes change */
    }
    memset(v2 + CHUNK_BYTES, 0x5a, 60000); /* much of chunk 1 changes: a dense chunk or blocks */
    for (int f = 0; f < 3; f++) {
        refit_delta_params_t dp = {f ? REFIT_DELTA_BLOCKS : REFIT_DELTA_SPARSE, f == 2 ? 512 : 64, 1};
        void *d, *d4;
        size_t len, len4;
        REFIT_ASSERT_OK(refit_delta_encode(v1, v2, sbytes, 1, 2, &dp, &d, &len));
        /* Threads split the chunks; the encoding is the same byte for byte. */
        dp.threads = 4;
        REFIT_ASSERT_OK(refit_delta_encode(v1, v2, sbytes, 1, 2, &dp, &d4, &len4));
        assert_int_equal(len4, len);
        assert_memory_equal(d4, d, len);
        free(d4);
        assert_int_equal(refit_delta_header_bytes(d, len), refit_delta_table_bytes(sbytes));
        refit_delta_index_t *ix;
        REFIT_ASSERT_OK(refit_delta_index_create(&plan, 0, 0, sbytes, &ix));
        for (int v = 1; v <= 2; v++)
            for (size_t i = 0; i < plan.regions.len; i++)
                for (uint64_t row = 0; row < refit_region_rows(&regs[i]); row++) {
                    uint64_t so, dof;
                    refit_region_row_offsets(&regs[i], row, &so, &dof);
                    memcpy((v == 1 ? got : want) + dof, (v == 1 ? v1 : v2) + so, regs[i].run);
                }
        void *dst = got;
        REFIT_ASSERT_OK(refit_delta_apply_threads(ix, d, len, 1, &dst, f + 1, NULL));
        assert_memory_equal(got, want, dbytes);
        refit_delta_index_destroy(ix);
        free(d);
    }
    free(v1);
    free(v2);
    free(want);
    free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(truth_delta),    cmocka_unit_test(sparse_versions), cmocka_unit_test(blocks_versions),
        cmocka_unit_test(dense_versions), cmocka_unit_test(wrong_base),      cmocka_unit_test(fetch_needed_only),
        cmocka_unit_test(odd_regions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
