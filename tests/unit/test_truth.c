/* The synthetic truth: values are finite, differ between neighbours, tensors
 * and versions; fill + verify round-trips in any layout; verification catches
 * a flipped byte, a stale version, a shifted or transposed copy and dirty
 * padding, naming the element. */
#include "testutil.h"
#include "verify/verify.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float bf16_to_float(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static void values(void **state)
{
    (void)state;
    uint64_t a = refit_truth_tensor_seed("model.layers.0.self_attn.q_proj.weight");
    uint64_t b = refit_truth_tensor_seed("model.layers.0.self_attn.k_proj.weight");
    assert_int_not_equal(a, b);
    unsigned same_tensor = 0;
    for (uint64_t i = 0; i < 100000; i++) {
        uint16_t v = (uint16_t)refit_truth_value(a, REFIT_DTYPE_BF16, i, 7);
        float f = bf16_to_float(v);
        assert_true(isfinite(f) && f != 0.0f && fabsf(f) < 128.0f && fabsf(f) > 1e-3f);
        assert_int_not_equal(v, (uint16_t)refit_truth_value(a, REFIT_DTYPE_BF16, i + 1, 7)); /* neighbours */
        assert_int_not_equal(v, (uint16_t)refit_truth_value(a, REFIT_DTYPE_BF16, i, 8));     /* versions */
        same_tensor += v == (uint16_t)refit_truth_value(b, REFIT_DTYPE_BF16, i, 7);
        uint32_t f32 = (uint32_t)refit_truth_value(a, REFIT_DTYPE_F32, i, 7);
        float ff;
        memcpy(&ff, &f32, 4);
        assert_true(isfinite(ff));
        uint8_t f8 = (uint8_t)refit_truth_value(a, REFIT_DTYPE_F8_E4M3, i, 7);
        assert_true((f8 & 0x7f) != 0x7f); /* e4m3 NaN */
    }
    /* Different tensors agree only by chance (10 random bits: about 1 in 1024). */
    assert_true(same_tensor < 200);
    /* Deterministic. */
    assert_int_equal(refit_truth_value(a, REFIT_DTYPE_BF16, 12345, 3),
                     refit_truth_value(a, REFIT_DTYPE_BF16, 12345, 3));
}

typedef struct {
    refit_model_t *model;
    refit_manifest_t *m;
    void *arena;
    size_t size;
} fixture_t;

static fixture_t make(const char *model, const char *layout, uint32_t rank, uint64_t version)
{
    fixture_t f = {t_model(model), NULL, NULL, 0};
    f.m = t_manifest(f.model, layout, rank);
    f.size = refit_manifest_region_size(f.m, 0);
    f.arena = malloc(f.size);
    memset(f.arena, 0x77, f.size);
    REFIT_ASSERT_OK(refit_truth_fill(f.m, &f.arena, version));
    return f;
}

static void destroy(fixture_t *f)
{
    free(f->arena);
    refit_manifest_destroy(f->m);
    refit_model_destroy(f->model);
}

static uint64_t local_offset(const refit_manifest_t *m, const char *name, refit_tensor_info_t *t)
{
    for (uint32_t i = 0; i < refit_manifest_num_locals(m); i++) {
        uint64_t off;
        refit_manifest_local(m, i, t, NULL, &off);
        if (!strcmp(t->name, name)) return off;
    }
    fail_msg("no local %s", name);
    return 0;
}

static void roundtrip_and_corruptions(void **state)
{
    (void)state;
    fixture_t f = make("tiny-moe", "vllm:tp=8", 7, 5);
    const void *const *bases = (const void *const *)&f.arena;
    refit_truth_report_t rep = {.size = 0, .mismatches = 99}; /* unsized: refused, untouched */
    REFIT_ASSERT_ERR(refit_truth_verify(f.m, bases, 5, &rep), REFIT_ERR_INVALID_ARG, "refit_truth_report_t: size is 0");
    assert_int_equal(rep.mismatches, 99);
    rep.size = sizeof(rep);
    REFIT_ASSERT_OK(refit_truth_verify(f.m, bases, 5, &rep));
    assert_int_equal(rep.size, sizeof(rep));
    assert_int_equal(rep.mismatches, 0);
    assert_true(rep.bytes_checked > 0);
    /* Stale version. */
    REFIT_ASSERT_ERR(refit_truth_verify(f.m, bases, 4, &rep), REFIT_ERR_VERIFY, "version 4");
    assert_int_equal(rep.mismatches, rep.elements_checked);
    /* One flipped byte in the middle of w2. */
    refit_tensor_info_t t;
    uint64_t off = local_offset(f.m, "model.layers.3.mlp.experts.w2_weight", &t);
    unsigned char *p = (unsigned char *)f.arena + off + 1000;
    *p ^= 0x10;
    REFIT_ASSERT_ERR(refit_truth_verify(f.m, bases, 5, &rep), REFIT_ERR_VERIFY,
                     "model.layers.3.mlp.experts.w2_weight element 500 (model.layers.3.mlp.experts.");
    assert_int_equal(rep.mismatches, 1);
    *p ^= 0x10;
    /* Dirty padding: lm_head rows beyond vocab 997 on the last rank must be zero. */
    off = local_offset(f.m, "lm_head.weight", &t);
    unsigned char *pad = (unsigned char *)f.arena + off + (t.shape[0] - 1) * t.shape[1] * 2;
    pad[3] = 1;
    REFIT_ASSERT_ERR(refit_truth_verify(f.m, bases, 5, NULL), REFIT_ERR_VERIFY, "lm_head.weight padding byte");
    pad[3] = 0;
    /* A copy shifted by one element. */
    off = local_offset(f.m, "model.layers.0.self_attn.o_proj.weight", &t);
    unsigned char *o = (unsigned char *)f.arena + off;
    memmove(o + 2, o, refit_tensor_nbytes(&t) - 2);
    REFIT_ASSERT_ERR(refit_truth_verify(f.m, bases, 5, &rep), REFIT_ERR_VERIFY, "o_proj");
    assert_true(rep.mismatches > refit_tensor_numel(&t) / 2);
    destroy(&f);
}

/* The truth as a verifier (verify/verify.h), as a receiver runs it: host
 * memory checked (a whole step's truth or a delta step's), a stale version and a flipped byte
 * caught, an FP8 arena on the host and GPU memory without a GPU refused. */
static void as_a_verifier(void **state)
{
    (void)state;
    const refit_verifier_t *v = &refit_verify_truth;
    assert_string_equal(v->name, "truth");
    fixture_t f = make("tiny-dense", "vllm:tp=2", 1, 6);
    refit_verify_mem_t mem = {
        .m = f.m, .device = -1, .bases = (const void *const *)&f.arena, .version = 6, .fraction = 1};
    REFIT_ASSERT_OK(v->check(NULL, &mem));
    mem.fraction = 0.25; /* the truth of a delta step (refit_truth_value_delta): not what was filled */
    REFIT_ASSERT_ERR(v->check(NULL, &mem), REFIT_ERR_VERIFY, "version 6");
    REFIT_ASSERT_OK(refit_truth_fill_delta(f.m, &f.arena, 6, 0.25));
    REFIT_ASSERT_OK(v->check(NULL, &mem));
    REFIT_ASSERT_OK(refit_truth_fill(f.m, &f.arena, 6));
    mem.fraction = 1;
    mem.version = 5;
    REFIT_ASSERT_ERR(v->check(NULL, &mem), REFIT_ERR_VERIFY, "version 5");
    mem.version = 6;
    refit_tensor_info_t t;
    unsigned char *p = (unsigned char *)f.arena + local_offset(f.m, "model.layers.1.mlp.down_proj.weight", &t) + 10;
    *p ^= 1;
    REFIT_ASSERT_ERR(v->check(NULL, &mem), REFIT_ERR_VERIFY, "down_proj");
    *p ^= 1;
    mem.fp8 = (const refit_fp8_target_t *)&mem; /* any non-NULL target: refused before it is read */
    REFIT_ASSERT_ERR(v->check(NULL, &mem), REFIT_ERR_UNSUPPORTED, "FP8 verification needs a GPU");
    mem.fp8 = NULL;
    if (refit_gpu_count() == 0) {
        mem.device = 0;
        assert_int_not_equal(v->check(NULL, &mem), REFIT_OK);
    }
    REFIT_ASSERT_ERR(v->check(NULL, NULL), REFIT_ERR_INVALID_ARG, "NULL");
    destroy(&f);
}

static void transposed_copy_is_caught(void **state)
{
    (void)state;
    /* A square tensor: q_norm is 1-d, so use an hf layout's o_proj-like square
     * tensor: tiny-tied's q_proj is [64, 64]. */
    fixture_t f = make("tiny-tied", "hf", 0, 1);
    refit_tensor_info_t t;
    uint64_t off = local_offset(f.m, "model.layers.1.self_attn.q_proj.weight", &t);
    assert_int_equal(t.shape[0], t.shape[1]);
    uint16_t *w = (uint16_t *)((unsigned char *)f.arena + off);
    uint64_t n = t.shape[0];
    for (uint64_t i = 0; i < n; i++)
        for (uint64_t j = i + 1; j < n; j++) {
            uint16_t x = w[i * n + j];
            w[i * n + j] = w[j * n + i];
            w[j * n + i] = x;
        }
    refit_truth_report_t rep = REFIT_TRUTH_REPORT_INIT;
    REFIT_ASSERT_ERR(refit_truth_verify(f.m, (const void *const *)&f.arena, 1, &rep), REFIT_ERR_VERIFY, "q_proj");
    assert_true(rep.mismatches > n * (n - 1) / 2);
    destroy(&f);
}

static void same_values_in_every_layout(void **state)
{
    (void)state;
    /* The element of canonical q_proj row 70, column 3 has one value in every layout. */
    fixture_t hf = make("tiny-dense", "hf", 0, 9), vl = make("tiny-dense", "vllm:tp=2", 1, 9);
    refit_tensor_info_t t;
    uint64_t off = local_offset(hf.m, "model.layers.2.self_attn.q_proj.weight", &t);
    uint16_t want = *(uint16_t *)((unsigned char *)hf.arena + off + (70 * 64 + 3) * 2);
    off = local_offset(vl.m, "model.layers.2.self_attn.qkv_proj.weight", &t);
    /* vllm tp=2 rank 1 holds q rows 64..127 at local rows 0..63. */
    uint16_t got = *(uint16_t *)((unsigned char *)vl.arena + off + (6 * 64 + 3) * 2);
    assert_int_equal(want, got);
    destroy(&hf);
    destroy(&vl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(values),
        cmocka_unit_test(roundtrip_and_corruptions),
        cmocka_unit_test(transposed_copy_is_caught),
        cmocka_unit_test(as_a_verifier),
        cmocka_unit_test(same_values_in_every_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
