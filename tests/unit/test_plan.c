/* Planner behaviour: strided regions, coalescing, DP balance, fail-closed
 * coverage (missing ranks, mismatches, identity), custom placements, plan
 * keys. */
#include "testutil.h"
#include "plan/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static refit_manifest_t *custom(const char *model, const char *layout, uint32_t rank, uint32_t world)
{
    refit_manifest_identity_t id = {model, layout, rank, world};
    refit_manifest_t *m = NULL;
    REFIT_ASSERT_OK(refit_manifest_create(&id, &m));
    return m;
}

static uint32_t canon2(refit_manifest_t *m, const char *name, refit_dtype_t dt, uint64_t r, uint64_t c)
{
    refit_tensor_info_t t = {name, dt, 2, {r, c}};
    uint32_t id;
    REFIT_ASSERT_OK(refit_manifest_add_canonical(m, &t, &id));
    return id;
}

static uint32_t local2(refit_manifest_t *m, const char *name, uint64_t r, uint64_t c, uint64_t off)
{
    refit_tensor_info_t t = {name, REFIT_DTYPE_BF16, 2, {r, c}};
    uint32_t id;
    REFIT_ASSERT_OK(refit_manifest_add_local(m, &t, 0, off, &id));
    return id;
}

static void place2(refit_manifest_t *m, uint32_t canon, uint32_t local, uint64_t r0, uint64_t c0, uint64_t nr,
                   uint64_t nc, uint64_t lr, uint64_t lc)
{
    refit_placement_t p = {canon, local, 2, {r0, c0}, {nr, nc}, {lr, lc}};
    REFIT_ASSERT_OK(refit_manifest_add_placement(m, &p));
}

/* A [64, 128] bf16 weight: a source holding it whole, a destination holding
 * its columns 64..127 (a row-parallel shard) in a [64, 64] tensor. */
static void row_parallel_slice_is_one_region(void **state)
{
    (void)state;
    refit_manifest_t *src = custom("m", "whole", 0, 1), *dst = custom("m", "cols", 0, 1);
    REFIT_ASSERT_OK(refit_manifest_add_region(src, 64 * 128 * 2, NULL));
    place2(src, canon2(src, "w", REFIT_DTYPE_BF16, 64, 128), local2(src, "w", 64, 128, 0), 0, 0, 64, 128, 0, 0);
    REFIT_ASSERT_OK(refit_manifest_add_region(dst, 64 * 64 * 2, NULL));
    place2(dst, canon2(dst, "w", REFIT_DTYPE_BF16, 64, 128), local2(dst, "w_shard", 64, 64, 0), 0, 64, 64, 64, 0, 0);
    REFIT_ASSERT_OK(refit_manifest_finalize(src));
    REFIT_ASSERT_OK(refit_manifest_finalize(dst));
    refit_plan_t *plan;
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const[]){src}, 1, dst, NULL, &plan));
    size_t n;
    const refit_plan_region_t *r = refit_plan_regions(plan, &n);
    assert_int_equal(n, 1);
    assert_int_equal(r[0].run, 64 * 2);
    assert_int_equal(r[0].nloops, 1);
    assert_int_equal(r[0].count[0], 64);
    assert_int_equal(r[0].src_offset, 64 * 2);
    assert_int_equal(r[0].src_stride[0], 128 * 2);
    assert_int_equal(r[0].dst_stride[0], 64 * 2);
    /* Execute it and compare with a direct slice. */
    uint16_t s[64 * 128], d[64 * 64];
    for (int i = 0; i < 64 * 128; i++) s[i] = (uint16_t)(i * 7 + 1);
    memset(d, 0, sizeof(d));
    const void *sb[] = {s};
    void *db[] = {d};
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(plan, (const void *const *const[]){sb}, db, 2));
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 64; j++) assert_int_equal(d[i * 64 + j], s[i * 128 + 64 + j]);
    refit_plan_destroy(plan);
    refit_manifest_destroy(src);
    refit_manifest_destroy(dst);
}

/* Regions whose destination bytes meet local tensor `name`. */
static size_t regions_into(const refit_plan_t *plan, const refit_manifest_t *dst, const char *name)
{
    for (uint32_t i = 0; i < refit_manifest_num_locals(dst); i++) {
        refit_tensor_info_t t;
        uint64_t off;
        refit_manifest_local(dst, i, &t, NULL, &off);
        if (strcmp(t.name, name)) continue;
        size_t n, count = 0;
        const refit_plan_region_t *r = refit_plan_regions(plan, &n);
        for (size_t k = 0; k < n; k++)
            if (r[k].dst_offset < off + refit_tensor_nbytes(&t) && refit_region_dst_end(&r[k]) > off) count++;
        return count;
    }
    fail_msg("no local %s", name);
    return 0;
}

static void experts_coalesce(void **state)
{
    (void)state;
    refit_model_t *m = t_model("tiny-moe");
    refit_manifest_t *src = t_manifest(m, "megatron:tp=1", 0), *dst = t_manifest(m, "vllm:tp=1", 0);
    refit_plan_t *plan;
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const[]){src}, 1, dst, NULL, &plan));
    /* 8 experts' fc1 (gate, up) stacked contiguously -> one region per layer for w13, one for w2. */
    assert_int_equal(regions_into(plan, dst, "model.layers.2.mlp.experts.w13_weight"), 1);
    assert_int_equal(regions_into(plan, dst, "model.layers.2.mlp.experts.w2_weight"), 1);
    refit_plan_stats_t s = {.size = offsetof(refit_plan_stats_t, plan_ms), .regions = 77}; /* too small */
    REFIT_ASSERT_ERR(refit_plan_stats(plan, &s), REFIT_ERR_INVALID_ARG, "refit_plan_stats_t");
    assert_int_equal(s.regions, 77);
    s.size = sizeof(s);
    REFIT_ASSERT_OK(refit_plan_stats(plan, &s));
    assert_true(s.regions * 4 < s.pieces);
    refit_plan_destroy(plan);
    /* Into vllm tp=2 the gate and up halves of each expert interleave: stacking
     * builds loops instead of one region per expert slice. */
    refit_manifest_t *dst2 = t_manifest(m, "vllm:tp=2", 1);
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const[]){src}, 1, dst2, NULL, &plan));
    assert_int_equal(regions_into(plan, dst2, "model.layers.2.mlp.experts.w13_weight"), 1);
    assert_int_equal(regions_into(plan, dst2, "model.layers.2.mlp.experts.w2_weight"), 1);
    refit_plan_destroy(plan);
    /* Without coalescing, one region per (tensor, source) piece. */
    refit_plan_params_t params = REFIT_PLAN_PARAMS_INIT;
    params.no_coalesce = true;
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const[]){src}, 1, dst2, &params, &plan));
    assert_int_equal(regions_into(plan, dst2, "model.layers.2.mlp.experts.w13_weight"), 16);
    refit_plan_destroy(plan);
    refit_manifest_destroy(dst2);
    refit_manifest_destroy(src);
    refit_manifest_destroy(dst);
    refit_model_destroy(m);
}

static tool_local_set_t plan_set(refit_model_t *m, const char *spec)
{
    refit_layout_t *l = t_layout(spec);
    tool_local_set_t set;
    REFIT_ASSERT_OK(tool_local_set_create(m, l, false, 0, &set));
    refit_layout_destroy(l);
    return set;
}

/* qwen3-30b-a3b from megatron ep=8 (8 DP replicas of every dense weight) into
 * vllm tp=2: each rank needs exactly its half, reads it once, from all 8. */
static void qwen3_30b_dp_balance(void **state)
{
    (void)state;
    refit_model_t *m = t_model("qwen3-30b-a3b");
    tool_local_set_t set = plan_set(m, "megatron:ep=8");
    for (uint32_t r = 0; r < 2; r++) {
        refit_manifest_t *dst = t_manifest(m, "vllm:tp=2", r);
        refit_plan_t *plan;
        REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)set.manifests, set.n, dst, NULL, &plan));
        refit_plan_stats_t s = REFIT_PLAN_STATS_INIT;
        refit_plan_stats(plan, &s);
        /* Half of every sharded tensor + replicated norms and routers. */
        assert_int_equal(s.bytes_written, 30544916480ULL);
        assert_int_equal(s.bytes_read, s.bytes_written);
        assert_int_equal(s.bytes_redundant, 0);
        assert_int_equal(s.sources_used, 8);
        uint64_t lo = UINT64_MAX, hi = 0;
        for (uint32_t k = 0; k < set.n; k++) {
            uint64_t b = refit_plan_source_bytes(plan, k);
            lo = b < lo ? b : lo;
            hi = b > hi ? b : hi;
        }
        printf("rank %u: %zu regions from %zu pieces, per-source bytes %llu..%llu (%.3f)\n", r, s.regions, s.pieces,
               (unsigned long long)lo, (unsigned long long)hi, (double)hi / (double)lo);
        assert_true((double)hi <= 1.02 * (double)lo);
        /* Far fewer regions than ModelExpress's 18,432 expert writes per rank. */
        assert_true(s.regions < 2000);
        refit_plan_destroy(plan);
        refit_manifest_destroy(dst);
    }
    tool_local_set_destroy(&set);
    refit_model_destroy(m);
}

static void missing_source_rank(void **state)
{
    (void)state;
    refit_model_t *m = t_model("tiny-moe");
    tool_local_set_t set = plan_set(m, "megatron:ep=4");
    refit_manifest_t *dst = t_manifest(m, "vllm:tp=2", 0), *saved = set.manifests[2];
    refit_plan_t *plan = NULL;
    set.manifests[2] = NULL; /* rank 2 never published: its experts 4 and 5 are nowhere else */
    REFIT_ASSERT_ERR(refit_plan_create((const refit_manifest_t *const *)set.manifests, set.n, dst, NULL, &plan),
                     REFIT_ERR_MISSING_SOURCE, "source slot(s) 2 missing");
    assert_true(strstr(refit_last_error(), "mlp.experts.4.") != NULL);
    assert_null(plan);
    /* A DP replica missing is fine: another holds the same bytes. */
    set.manifests[2] = saved;
    tool_local_set_t dp = plan_set(m, "megatron:tp=2,dp=2");
    refit_manifest_t *keep = dp.manifests[3];
    dp.manifests[3] = NULL;
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)dp.manifests, dp.n, dst, NULL, &plan));
    refit_plan_destroy(plan);
    /* Fewer sources than the layout has ranks, without a NULL slot: uncovered. */
    REFIT_ASSERT_ERR(refit_plan_create((const refit_manifest_t *const *)set.manifests, 3, dst, NULL, &plan),
                     REFIT_ERR_UNCOVERED, "is held by no source");
    assert_true(strstr(refit_last_error(), "experts.6.") != NULL);
    dp.manifests[3] = keep;
    tool_local_set_destroy(&dp);
    refit_manifest_destroy(dst);
    tool_local_set_destroy(&set);
    refit_model_destroy(m);
}

static void mismatches_and_identity(void **state)
{
    (void)state;
    /* Same names, different shape: a source whose w is [64, 96]. */
    refit_manifest_t *src = custom("m", "a", 0, 1), *dst = custom("m", "b", 0, 1);
    REFIT_ASSERT_OK(refit_manifest_add_region(src, 1 << 20, NULL));
    REFIT_ASSERT_OK(refit_manifest_add_region(dst, 1 << 20, NULL));
    place2(src, canon2(src, "w", REFIT_DTYPE_BF16, 64, 96), local2(src, "w", 64, 96, 0), 0, 0, 64, 96, 0, 0);
    place2(dst, canon2(dst, "w", REFIT_DTYPE_BF16, 64, 128), local2(dst, "w", 64, 128, 0), 0, 0, 64, 128, 0, 0);
    REFIT_ASSERT_OK(refit_manifest_finalize(src));
    REFIT_ASSERT_OK(refit_manifest_finalize(dst));
    refit_plan_t *plan = NULL;
    REFIT_ASSERT_ERR(refit_plan_create((const refit_manifest_t *const[]){src}, 1, dst, NULL, &plan), REFIT_ERR_MISMATCH,
                     "tensor w is bf16[64, 96] in source 0 (a rank 0) but bf16[64, 128]");
    refit_manifest_destroy(src);
    /* Different dtype. */
    src = custom("m", "a", 0, 1);
    REFIT_ASSERT_OK(refit_manifest_add_region(src, 1 << 20, NULL));
    uint32_t c = canon2(src, "w", REFIT_DTYPE_F32, 64, 128);
    refit_tensor_info_t lt = {"w", REFIT_DTYPE_F32, 2, {64, 128}};
    uint32_t l;
    REFIT_ASSERT_OK(refit_manifest_add_local(src, &lt, 0, 0, &l));
    place2(src, c, l, 0, 0, 64, 128, 0, 0);
    REFIT_ASSERT_OK(refit_manifest_finalize(src));
    REFIT_ASSERT_ERR(refit_plan_create((const refit_manifest_t *const[]){src}, 1, dst, NULL, &plan), REFIT_ERR_MISMATCH,
                     "f32[64, 128] in source 0");
    refit_manifest_destroy(src);
    /* Another model altogether. */
    src = custom("other-model", "a", 0, 1);
    REFIT_ASSERT_OK(refit_manifest_add_region(src, 1 << 20, NULL));
    place2(src, canon2(src, "w", REFIT_DTYPE_BF16, 64, 128), local2(src, "w", 64, 128, 0), 0, 0, 64, 128, 0, 0);
    REFIT_ASSERT_OK(refit_manifest_finalize(src));
    REFIT_ASSERT_ERR(refit_plan_create((const refit_manifest_t *const[]){src}, 1, dst, NULL, &plan), REFIT_ERR_IDENTITY,
                     "describes model other-model, the destination m");
    assert_null(plan);
    /* Params of a size the library does not know are refused, naming the structure. */
    refit_plan_params_t p = REFIT_PLAN_PARAMS_INIT;
    p.size = sizeof(p) + 8;
    REFIT_ASSERT_ERR(refit_plan_create((const refit_manifest_t *const[]){src}, 1, dst, &p, &plan),
                     REFIT_ERR_INVALID_ARG, "refit_plan_params_t: size is");
    p.size = REFIT_PLAN_PARAMS_SIZE_1 - 1;
    REFIT_ASSERT_ERR(refit_plan_create((const refit_manifest_t *const[]){src}, 1, dst, &p, &plan),
                     REFIT_ERR_INVALID_ARG, "refit_plan_params_t: size is");
    refit_manifest_destroy(src);
    refit_manifest_destroy(dst);
    /* Built-in models with different vocab sizes: tiny-dense vs tiny-moe are different models. */
    refit_model_t *a = t_model("tiny-dense"), *b = t_model("tiny-moe");
    refit_manifest_t *ma = t_manifest(a, "hf", 0), *mb = t_manifest(b, "hf", 0);
    REFIT_ASSERT_ERR(refit_plan_create((const refit_manifest_t *const[]){ma}, 1, mb, NULL, &plan), REFIT_ERR_IDENTITY,
                     "tiny-dense");
    refit_manifest_destroy(ma);
    refit_manifest_destroy(mb);
    refit_model_destroy(a);
    refit_model_destroy(b);
}

/* Gaps between sources are refused; sources that touch are accepted; sources
 * that overlap partially are each read only where needed. */
static void custom_partial_sources(void **state)
{
    (void)state;
    const uint64_t R = 40, C = 24;
    refit_manifest_t *srcs[3];
    /* rows [0,16) | [10,30) | [30,40): overlapping 10..16, touching at 30. */
    const uint64_t r0[3] = {0, 10, 30}, nr[3] = {16, 20, 10};
    for (int i = 0; i < 3; i++) {
        srcs[i] = custom("m", "rows", (uint32_t)i, 3);
        REFIT_ASSERT_OK(refit_manifest_add_region(srcs[i], nr[i] * C * 2, NULL));
        place2(srcs[i], canon2(srcs[i], "w", REFIT_DTYPE_BF16, R, C), local2(srcs[i], "w", nr[i], C, 0), r0[i], 0,
               nr[i], C, 0, 0);
        REFIT_ASSERT_OK(refit_manifest_finalize(srcs[i]));
    }
    /* The destination holds columns [4, 20) of all rows, transposed into two halves of rows. */
    refit_manifest_t *dst = custom("m", "cols", 0, 1);
    REFIT_ASSERT_OK(refit_manifest_add_region(dst, 2 * 20 * 16 * 2 + 512, NULL));
    uint32_t c = canon2(dst, "w", REFIT_DTYPE_BF16, R, C);
    uint32_t l0 = local2(dst, "top", 20, 16, 0), l1 = local2(dst, "bottom", 22, 16, 1024);
    place2(dst, c, l0, 0, 4, 20, 16, 0, 0);
    place2(dst, c, l1, 20, 4, 20, 16, 2, 0); /* 2 rows of padding at the top of "bottom" */
    REFIT_ASSERT_OK(refit_manifest_finalize(dst));
    refit_plan_t *plan;
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)srcs, 3, dst, NULL, &plan));
    refit_plan_stats_t s = REFIT_PLAN_STATS_INIT;
    refit_plan_stats(plan, &s);
    assert_int_equal(s.bytes_written, R * 16 * 2);
    assert_int_equal(s.bytes_redundant, 0);
    assert_int_equal(s.bytes_fill, 2 * 16 * 2);
    assert_int_equal(s.sources_used, 3);
    /* Execute against the truth. */
    void *sa[3], *da = malloc(2 * 20 * 16 * 2 + 512);
    const void *const *sb[3];
    for (int i = 0; i < 3; i++) {
        sa[i] = malloc(nr[i] * C * 2);
        REFIT_ASSERT_OK(refit_truth_fill(srcs[i], &sa[i], 42));
        sb[i] = (const void *const *)&sa[i];
    }
    memset(da, 0x5a, 2 * 20 * 16 * 2 + 512);
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(plan, sb, &da, 1));
    REFIT_ASSERT_OK(refit_truth_verify(dst, (const void *const *)&da, 42, NULL));
    refit_plan_destroy(plan);
    /* Without the middle source, rows 16..30 are a gap. */
    refit_manifest_t *gap[2] = {srcs[0], srcs[2]};
    REFIT_ASSERT_ERR(refit_plan_create((const refit_manifest_t *const *)gap, 2, dst, NULL, &plan), REFIT_ERR_UNCOVERED,
                     "tensor w box [16:20, 4:20] (for destination top) is held by no source");
    for (int i = 0; i < 3; i++) {
        free(sa[i]);
        refit_manifest_destroy(srcs[i]);
    }
    free(da);
    refit_manifest_destroy(dst);
}

static void plan_keys(void **state)
{
    (void)state;
    refit_model_t *m = t_model("tiny-moe");
    tool_local_set_t set = plan_set(m, "megatron:ep=2,dp=2");
    refit_manifest_t *d0 = t_manifest(m, "vllm:tp=2", 0), *d0b = t_manifest(m, "vllm:tp=2", 0),
                     *d1 = t_manifest(m, "vllm:tp=2", 1);
    refit_plan_t *plan;
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)set.manifests, set.n, d0, NULL, &plan));
    refit_plan_key_t k, k2, k3;
    refit_plan_key(plan, &k);
    refit_plan_key_of((const refit_manifest_t *const *)set.manifests, set.n, d0b, &k2);
    refit_plan_key_of((const refit_manifest_t *const *)set.manifests, set.n, d1, &k3);
    assert_true(k.src == k2.src && k.dst == k2.dst);
    assert_true(k.src == k3.src && k.dst != k3.dst);
    refit_plan_key_of((const refit_manifest_t *const *)set.manifests, set.n - 1, d0, &k3);
    assert_true(k3.src != k.src);
    refit_plan_destroy(plan);
    refit_manifest_destroy(d0);
    refit_manifest_destroy(d0b);
    refit_manifest_destroy(d1);
    tool_local_set_destroy(&set);
    refit_model_destroy(m);
}

/* The field's largest model: one destination rank of kimi-k2 from a real
 * trainer recipe plans with regions in the order of (tensor, source) overlaps. */
static void kimi_k2_plan(void **state)
{
    (void)state;
    refit_model_t *m = t_model("kimi-k2");
    tool_local_set_t set = plan_set(m, "megatron:pp=4,ep=64,first=16");
    refit_manifest_t *dst = t_manifest(m, "vllm:tp=8,ep=8", 5);
    refit_plan_t *plan;
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)set.manifests, set.n, dst, NULL, &plan));
    refit_plan_stats_t s = REFIT_PLAN_STATS_INIT;
    refit_plan_stats(plan, &s);
    printf("kimi-k2 rank 5: %llu bytes, %zu regions, %zu pieces, %.1f ms\n", (unsigned long long)s.bytes_written,
           s.regions, s.pieces, s.plan_ms);
    assert_int_equal(s.bytes_redundant, 0);
    assert_true(s.regions <= s.pieces);
    assert_true(s.regions < 10000);
    refit_plan_destroy(plan);
    refit_manifest_destroy(dst);
    tool_local_set_destroy(&set);
    refit_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(row_parallel_slice_is_one_region),
        cmocka_unit_test(experts_coalesce),
        cmocka_unit_test(qwen3_30b_dp_balance),
        cmocka_unit_test(missing_source_rank),
        cmocka_unit_test(mismatches_and_identity),
        cmocka_unit_test(custom_partial_sources),
        cmocka_unit_test(plan_keys),
        cmocka_unit_test(kimi_k2_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
