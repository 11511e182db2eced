/* FP8 targets: the library's e4m3 conversion and block quantization against a
 * plain reference quantizer written here (nearest of the 254 finite e4m3
 * values, ties to the even code; quantized per canonical 128x128 block from
 * the synthetic truth), bit for bit, after the full path megatron bf16 ->
 * bf16 plan -> source-side stage -> FP8 arena; misaligned shards refused. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layout/manifest.h"
#include "plan/fp8_table.h"

/* ---- the reference quantizer ---- */

static double ref_value(unsigned code) /* code 0..0x7e, positive */
{
    unsigned e = code >> 3, m = code & 7;
    return e == 0 ? m * pow(2.0, -9) : (1.0 + m / 8.0) * pow(2.0, (double)e - 7.0);
}

static double g_vals[0x7f];

static uint8_t ref_e4m3(float x)
{
    if (g_vals[1] == 0)
        for (unsigned c = 0; c <= 0x7e; c++) g_vals[c] = ref_value(c);
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    if (a >= 448.0) return sign | 0x7e;
    unsigned best = 0;
    double bd = INFINITY;
    for (unsigned c = 0; c <= 0x7e; c++) {
        double d = fabs(a - g_vals[c]);
        if (d < bd || (d == bd && (c & 1) == 0)) {
            bd = d;
            best = c;
        }
    }
    return sign | (uint8_t)best;
}

static float bf16f(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void conversion(void **state)
{
    (void)state;
    /* Every e4m3 value and every midpoint between neighbours (ties to even). */
    for (unsigned c = 0; c < 0x7e; c++) {
        float v = (float)ref_value(c), mid = (float)((ref_value(c) + ref_value(c + 1)) / 2);
        assert_int_equal(refit_fp8_e4m3_from_f32(v), c);
        assert_int_equal(refit_fp8_e4m3_from_f32(-v), c | 0x80);
        assert_int_equal(refit_fp8_e4m3_from_f32(mid), ref_e4m3(mid));
        assert_int_equal(refit_fp8_e4m3_from_f32(nextafterf(mid, 0)), ref_e4m3(nextafterf(mid, 0)));
        assert_int_equal(refit_fp8_e4m3_from_f32(nextafterf(mid, 1000)), ref_e4m3(nextafterf(mid, 1000)));
        assert_true(refit_fp8_e4m3_to_f32((uint8_t)c) == v);
    }
    assert_int_equal(refit_fp8_e4m3_from_f32(448.0f), 0x7e);
    assert_int_equal(refit_fp8_e4m3_from_f32(460.0f), 0x7e);
    assert_int_equal(refit_fp8_e4m3_from_f32(1e9f), 0x7e);
    /* Every bf16 value in range, divided by a few scales. */
    const float scales[] = {1.0f, 0.0123f, 3.7f, 1.0f / 448.0f};
    for (unsigned s = 0; s < 4; s++)
        for (uint32_t b = 0; b < 0x10000; b++) {
            float x = bf16f((uint16_t)b);
            if (!isfinite(x)) continue;
            float y = x / scales[s];
            if (fabsf(y) > 448.0f) continue;
            assert_int_equal(refit_fp8_e4m3_from_f32(y), ref_e4m3(y));
        }
}

/* ---- full path ---- */

static refit_manifest_t *g_src[2];
static void *g_sbase[2];

/* The quantize-on-copy table (plan/fp8_table.h) run on the CPU writes the
 * same arena, byte for byte, as the plan into a bf16 image and the stage. */
static void table_equals_stage(const refit_plan_t *plan, const refit_manifest_t *dst, const refit_fp8_target_t *t,
                               void *const *sbase, size_t nsrc, const unsigned char *want, bool expect_full)
{
    refit_fp8_table_t x;
    refit_batch_opts_t o = {.max_shift = 4, .copies = true, .fills = true};
    REFIT_ASSERT_OK(refit_fp8_table_build(plan, dst, t, &o, &x));
    uint64_t n = refit_fp8_target_bytes(t);
    unsigned char *got = malloc(n);
    memset(got, 0xa5, n); /* every byte must be written (the gaps between tensors as zeros) */
    void **slots = calloc(x.nslots, sizeof(void *));
    for (size_t s = 0; s < nsrc; s++)
        for (uint32_t k = x.src_slot_base[s]; k < x.src_slot_base[s + 1]; k++) slots[k] = sbase[s];
    slots[x.dst_slot] = got;
    REFIT_ASSERT_OK(refit_fp8_table_execute_host(&x, slots));
    for (uint64_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("fp8 table: arena byte %llu is 0x%02x, the stage wrote 0x%02x", (unsigned long long)i, got[i],
                     want[i]);
    assert_true(x.nblocks > 0 && x.npieces >= x.nblocks);
    if (expect_full) assert_true(x.full_blocks > 0);
    else assert_true(x.npieces > x.nblocks); /* blocks gathered from several pieces */
    free(slots);
    free(got);
    refit_fp8_table_free(&x);
}

static void check_rank(const char *layout, uint32_t rank, uint64_t v)
{
    refit_manifest_t *dst = t_manifest_named("tiny-fp8", layout, rank);
    refit_plan_t *plan;
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)g_src, 2, dst, NULL, &plan));
    uint64_t ds = refit_manifest_region_size(dst, 0);
    void *img = calloc(1, ds);
    const void *const *sb[2] = {(const void *const *)&g_sbase[0], (const void *const *)&g_sbase[1]};
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(plan, (const void *const *const *)sb, &img, 1));
    refit_fp8_target_t *t;
    REFIT_ASSERT_OK(refit_fp8_target_create(dst, &t));
    assert_true(refit_fp8_target_num_quantized(t) >= 2 * 4); /* qkv, o, w13, w2 per layer */
    unsigned char *arena = calloc(1, refit_fp8_target_bytes(t));
    REFIT_ASSERT_OK(refit_fp8_stage(t, img, arena, 2));
    table_equals_stage(plan, dst, t, g_sbase, 2, arena, true);
    uint64_t checked = 0, blocks = 0;
    for (uint32_t i = 0; i < refit_fp8_target_num_tensors(t); i++) {
        const refit_fp8_tensor_t *e = refit_fp8_target_tensor(t, i);
        const refit_local_t *l = &dst->locals.data[e->local];
        if (e->dtype == REFIT_DTYPE_F32 && strstr(e->name, "_scale_inv")) continue;
        if (e->dtype != REFIT_DTYPE_F8_E4M3) { /* kept as is */
            assert_memory_equal(arena + e->offset, (unsigned char *)img + l->offset, e->bytes);
            continue;
        }
        const refit_fp8_tensor_t *sc = refit_fp8_target_tensor(t, i + 1);
        assert_non_null(strstr(sc->name, "_scale_inv"));
        uint64_t R = l->d.shape[l->d.ndim - 2], C = l->d.shape[l->d.ndim - 1], bc = (C + 127) / 128;
        uint64_t sbr = (R + 127) / 128;
        for (uint32_t k = dst->pl_start[e->local]; k < dst->pl_start[e->local + 1]; k++) {
            const refit_placement_t *p = &dst->placements.data[dst->pl_list[k]];
            const refit_tdesc_t *c = &dst->canon.data[p->canon];
            uint64_t seed = refit_truth_tensor_seed(c->name), CR = c->shape[0], CC = c->shape[1];
            uint64_t lead = l->d.ndim == 3 ? p->local_offset[0] : 0;
            uint64_t lr0 = p->local_offset[l->d.ndim - 2], lc0 = p->local_offset[l->d.ndim - 1];
            /* Each canonical block in the box, quantized from the truth. */
            for (uint64_t br = p->canon_offset[0]; br < p->canon_offset[0] + p->extent[0]; br += 128)
                for (uint64_t bcn = p->canon_offset[1]; bcn < p->canon_offset[1] + p->extent[1]; bcn += 128) {
                    uint64_t nr = CR - br < 128 ? CR - br : 128, nc = CC - bcn < 128 ? CC - bcn : 128;
                    float amax = 0;
                    for (uint64_t r = 0; r < nr; r++)
                        for (uint64_t q = 0; q < nc; q++) {
                            float x = fabsf(
                                bf16f((uint16_t)refit_truth_value(seed, REFIT_DTYPE_BF16, (br + r) * CC + bcn + q, v)));
                            if (x > amax) amax = x;
                        }
                    float scale = amax / 448.0f;
                    uint64_t lr = lr0 + (br - p->canon_offset[0]), lc = lc0 + (bcn - p->canon_offset[1]);
                    float got_scale;
                    memcpy(&got_scale, arena + sc->offset + ((lead * sbr + lr / 128) * bc + lc / 128) * 4, 4);
                    assert_true(memcmp(&got_scale, &scale, 4) == 0);
                    for (uint64_t r = 0; r < nr; r++)
                        for (uint64_t q = 0; q < nc; q++) {
                            float x = bf16f(
                                (uint16_t)refit_truth_value(seed, REFIT_DTYPE_BF16, (br + r) * CC + bcn + q, v));
                            uint8_t want = ref_e4m3(x / scale);
                            uint8_t got = arena[e->offset + (lead * R + lr + r) * C + lc + q];
                            if (want != got)
                                fail_msg("%s block (%llu,%llu) element (%llu,%llu): fp8 0x%02x, reference 0x%02x",
                                         c->name, (unsigned long long)br, (unsigned long long)bcn,
                                         (unsigned long long)r, (unsigned long long)q, got, want);
                            checked++;
                        }
                    blocks++;
                }
        }
        (void)l;
    }
    assert_true(checked > 100000 && blocks > 0);
    free(arena);
    free(img);
    refit_fp8_target_destroy(t);
    refit_plan_destroy(plan);
    refit_manifest_destroy(dst);
}

static void stage_equals_reference(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++) {
        g_src[i] = t_manifest_named("tiny-fp8", "megatron:ep=2", (uint32_t)i);
        g_sbase[i] = malloc(refit_manifest_region_size(g_src[i], 0));
        REFIT_ASSERT_OK(refit_truth_fill(g_src[i], &g_sbase[i], 3));
    }
    check_rank("vllm:tp=2", 0, 3);
    check_rank("vllm:tp=2", 1, 3);
    check_rank("vllm:tp=1", 0, 3);
    for (int i = 0; i < 2; i++) {
        refit_manifest_destroy(g_src[i]);
        free(g_sbase[i]);
    }
}

/* FP8 arenas described as manifests plan like any layouts: the same layout
 * is one contiguous copy, and tp=2 arenas reshard into the tp=1 arena byte
 * for byte (blocks are canonical blocks, so their scales do not depend on
 * the sharding). */
static void fp8_manifest_plans(void **state)
{
    (void)state;
    refit_manifest_t *src[2], *one;
    unsigned char *sa[2];
    for (uint32_t r = 0; r < 2; r++) sa[r] = t_fp8_arena("tiny-fp8", "vllm:tp=2", r, 5, &src[r]);
    unsigned char *want = t_fp8_arena("tiny-fp8", "vllm:tp=1", 0, 5, &one);
    refit_manifest_identity_t id;
    refit_manifest_identity(src[1], &id);
    assert_string_equal(id.layout, "vllm:tp=2,ep=1,dp=1,pad=64+fp8");
    const void *const *sb[2] = {(const void *const *)&sa[0], (const void *const *)&sa[1]};
    /* Same layout: rank 1 from the two ranks, one contiguous region. */
    refit_plan_t *plan;
    refit_manifest_t *again = NULL;
    unsigned char *a1 = t_fp8_arena("tiny-fp8", "vllm:tp=2", 1, 5, &again);
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)src, 2, again, NULL, &plan));
    refit_plan_stats_t ps = REFIT_PLAN_STATS_INIT;
    refit_plan_stats(plan, &ps);
    assert_true(ps.bytes_read > 0 && ps.bytes_read + ps.bytes_fill <= refit_manifest_region_size(again, 0));
    uint64_t n1 = refit_manifest_region_size(again, 0);
    unsigned char *got = calloc(1, n1);
    void *gp = got;
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(plan, (const void *const *const *)sb, &gp, 1));
    assert_memory_equal(got, a1, n1);
    refit_plan_destroy(plan);
    free(got);
    /* tp=2 -> tp=1. */
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)src, 2, one, NULL, &plan));
    uint64_t n = refit_manifest_region_size(one, 0);
    got = calloc(1, n);
    gp = got;
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(plan, (const void *const *const *)sb, &gp, 1));
    assert_memory_equal(got, want, n);
    refit_plan_destroy(plan);
    free(got);
    for (uint32_t r = 0; r < 2; r++) {
        refit_manifest_destroy(src[r]);
        free(sa[r]);
    }
    refit_manifest_destroy(again);
    refit_manifest_destroy(one);
    free(a1);
    free(want);
}

static void misaligned_refused(void **state)
{
    (void)state;
    refit_fp8_target_t *t;
    /* tp=4 cuts each expert's 256 rows into 64: a block would straddle shards. */
    refit_manifest_t *m = t_manifest_named("tiny-fp8", "vllm:tp=4", 1);
    REFIT_ASSERT_ERR(refit_fp8_target_create(m, &t), REFIT_ERR_GEOMETRY, "block grid");
    refit_manifest_destroy(m);
    /* head_dim 32: a kv head's rows are not a whole block. */
    m = t_manifest_named("qwen3-30b-a3b-mini", "vllm:tp=2", 0);
    REFIT_ASSERT_ERR(refit_fp8_target_create(m, &t), REFIT_ERR_GEOMETRY, "straddle");
    refit_manifest_destroy(m);
    /* The sizes: fp8 bytes and scales, about half of bf16. */
    m = t_manifest_named("tiny-fp8", "vllm:tp=2", 0);
    REFIT_ASSERT_OK(refit_fp8_target_create(m, &t));
    assert_true(refit_fp8_target_bytes(t) < refit_manifest_region_size(m, 0) * 7 / 10);
    refit_fp8_target_destroy(t);
    refit_manifest_destroy(m);
}

/* Sources that cut blocks (megatron:tp=4 splits rows into quarters) and an
 * uncoalesced plan: blocks gathered from several pieces, still the stage's bytes. */
static void table_gathers_pieces(void **state)
{
    (void)state;
    refit_manifest_t *src[4];
    void *sb[4];
    for (uint32_t i = 0; i < 4; i++) {
        src[i] = t_manifest_named("tiny-fp8", "megatron:tp=4", i);
        sb[i] = malloc(refit_manifest_region_size(src[i], 0));
        REFIT_ASSERT_OK(refit_truth_fill(src[i], &sb[i], 7));
    }
    refit_manifest_t *dst = t_manifest_named("tiny-fp8", "vllm:tp=2", 1);
    refit_plan_params_t pp = REFIT_PLAN_PARAMS_INIT;
    for (int coalesce = 0; coalesce < 2; coalesce++) {
        pp.no_coalesce = !coalesce;
        refit_plan_t *plan;
        REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)src, 4, dst, &pp, &plan));
        void *img = calloc(1, refit_manifest_region_size(dst, 0));
        const void *const *sbp[4];
        for (int i = 0; i < 4; i++) sbp[i] = (const void *const *)&sb[i];
        REFIT_ASSERT_OK(refit_plan_execute_memcpy(plan, (const void *const *const *)sbp, &img, 1));
        refit_fp8_target_t *t;
        REFIT_ASSERT_OK(refit_fp8_target_create(dst, &t));
        unsigned char *want = calloc(1, refit_fp8_target_bytes(t));
        REFIT_ASSERT_OK(refit_fp8_stage(t, img, want, 2));
        table_equals_stage(plan, dst, t, sb, 4, want, false);
        free(want);
        free(img);
        refit_fp8_target_destroy(t);
        refit_plan_destroy(plan);
    }
    refit_manifest_destroy(dst);
    for (int i = 0; i < 4; i++) {
        refit_manifest_destroy(src[i]);
        free(sb[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(conversion), cmocka_unit_test(stage_equals_reference),
                                       cmocka_unit_test(fp8_manifest_plans), cmocka_unit_test(misaligned_refused),
                                       cmocka_unit_test(table_gathers_pieces)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
