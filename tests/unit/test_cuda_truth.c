/* The GPU port, checked on the CPU (no GPU needed, so CI guards it): the
 * REFIT_HD truth and hash functions against truth.c and util.c, the truth
 * table walk against refit_truth_fill / refit_truth_verify, and the batch
 * copy walk (the copy kernel's per-thread code) against the plan executor. */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "layout/manifest.h"
#include "plan/batch.h"
#include "tool_local.h"
#include "plan/plan.h"
#include "truth/truth_table.h"
#include "util/util.h"

static uint64_t rng = 0x1234567;
static uint64_t next(void) { return rng = refit_mix64(rng + 0x9e3779b97f4a7c15ULL); }

static void test_values(void **state)
{
    (void)state;
    static const refit_dtype_t dts[] = {REFIT_DTYPE_BF16, REFIT_DTYPE_F16, REFIT_DTYPE_F32, REFIT_DTYPE_F8_E4M3,
                                        REFIT_DTYPE_I32,  REFIT_DTYPE_I64, REFIT_DTYPE_U8,  REFIT_DTYPE_INVALID};
    for (int i = 0; i < 200000; i++) {
        uint64_t seed = next(), idx = i < 1000 ? (uint64_t)i : next() >> (next() & 63), ver = next() & 0xffff;
        refit_dtype_t dt = dts[i % 8];
        assert_int_equal(refit_hd_truth_value(seed, (uint32_t)dt, idx, ver), refit_truth_value(seed, dt, idx, ver));
        assert_int_equal(refit_hd_mix64(seed), refit_mix64(seed));
    }
}

static void test_hash(void **state)
{
    (void)state;
    unsigned char buf[64];
    for (int len = 0; len <= 64; len++)
        for (int k = 0; k < 50; k++) {
            for (int i = 0; i < len; i++) buf[i] = (unsigned char)next();
            uint64_t seed = next();
            assert_int_equal(refit_hd_hash64(buf, (size_t)len, seed), refit_hash64(buf, (size_t)len, seed));
        }
    refit_manifest_t *m = t_manifest_named("qwen3-30b-a3b-mini", "vllm:tp=2", 0);
    for (uint32_t c = 0; c < refit_manifest_num_canonical(m); c++) {
        refit_tensor_info_t info;
        refit_manifest_canonical(m, c, &info);
        assert_int_equal(refit_hd_tensor_seed(info.name), refit_truth_tensor_seed(info.name));
    }
    refit_manifest_destroy(m);
}

static void *arena(refit_manifest_t *m, int poison)
{
    uint64_t size = refit_manifest_region_size(m, 0);
    void *p = NULL;
    assert_int_equal(posix_memalign(&p, 256, size ? size : 1), 0);
    memset(p, poison, size);
    return p;
}

/* The table walk writes exactly what refit_truth_fill writes, and checks
 * what refit_truth_verify checks. */
static void check_table(const char *model, const char *spec, uint64_t chunk, uint32_t threads)
{
    refit_model_t *md = t_model(model);
    refit_layout_t *lay = t_layout(spec);
    for (uint32_t r = 0; r < refit_layout_world(lay); r++) {
        refit_manifest_t *m = t_manifest(md, spec, r);
        assert_int_equal(refit_manifest_num_regions(m), 1);
        uint64_t size = refit_manifest_region_size(m, 0);
        void *a = arena(m, 0xa5), *b = arena(m, 0x5a);
        REFIT_ASSERT_OK(refit_truth_fill(m, &a, 7));
        refit_truth_table_t t;
        REFIT_ASSERT_OK(refit_truth_table_build(m, chunk, &t));
        uint64_t first = 0;
        assert_int_equal(refit_truth_table_run_host(&t, &b, 7, false, threads, &first), 0);
        /* Bytes between tensors (alignment gaps) are nobody's; compare tensors. */
        for (uint32_t li = 0; li < refit_manifest_num_locals(m); li++) {
            refit_tensor_info_t info;
            uint32_t reg;
            uint64_t off;
            refit_manifest_local(m, li, &info, &reg, &off);
            assert_memory_equal((char *)a + off, (char *)b + off, refit_tensor_nbytes(&info));
        }
        refit_truth_report_t rep = REFIT_TRUTH_REPORT_INIT;
        REFIT_ASSERT_OK(refit_truth_verify(m, (const void *const *)&b, 7, &rep));
        assert_int_equal(t.bytes, rep.bytes_checked);
        assert_int_equal(refit_truth_table_run_host(&t, &a, 7, true, threads, &first), 0);
        /* Wrong version: nearly everything differs; a corrupted byte is found. */
        assert_true(refit_truth_table_run_host(&t, &a, 8, true, threads, &first) > t.elements / 2);
        refit_tensor_info_t info;
        uint32_t reg;
        uint64_t off;
        refit_manifest_local(m, refit_manifest_num_locals(m) - 1, &info, &reg, &off);
        uint64_t at = off + refit_tensor_nbytes(&info) - 1;
        ((unsigned char *)a)[at] ^= 0x40;
        assert_int_equal(refit_truth_table_run_host(&t, &a, 7, true, threads, &first), 1);
        uint64_t bo = 0;
        const refit_truth_box_t *bx = &t.boxes[first >> 40];
        (void)refit_truth_box_expected(bx, first & ((1ull << 40) - 1), 7, &bo);
        assert_true(bo <= at && at < bo + bx->es);
        (void)size;
        refit_truth_table_free(&t);
        free(a);
        free(b);
        refit_manifest_destroy(m);
    }
    refit_layout_destroy(lay);
    refit_model_destroy(md);
}

static void test_table(void **state)
{
    (void)state;
    check_table("tiny-moe", "megatron:tp=2,ep=2", 1000, 7);
    check_table("tiny-moe", "vllm:tp=2", 16384, 256);
    check_table("tiny-mla", "megatron:tp=2", 333, 5);
    check_table("tiny-dense", "vllm:tp=4", 64, 3);
    check_table("tiny-moe", "megatron:ep=4", 16384, 256);
}

/* Plans dst from src, runs the batch walk (copies and fills) into a
 * poisoned arena, verifies every byte.  Returns the fill bytes seen. */
static uint64_t check_batch(const char *model, const char *src_spec, const char *dst_spec, uint64_t chunk,
                            uint32_t threads, uint32_t max_shift)
{
    refit_model_t *md = t_model(model);
    refit_layout_t *sl = t_layout(src_spec), *dl = t_layout(dst_spec);
    tool_local_set_t set;
    REFIT_ASSERT_OK(tool_local_set_create(md, sl, true, 3, &set));
    uint64_t fills = 0;
    for (uint32_t r = 0; r < refit_layout_world(dl); r++) {
        refit_manifest_t *dm = t_manifest(md, dst_spec, r);
        refit_plan_t *plan = NULL;
        REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)set.manifests, set.n, dm, NULL, &plan));
        refit_plan_stats_t ps = REFIT_PLAN_STATS_INIT;
        refit_plan_stats(plan, &ps);
        fills += ps.bytes_fill;
        refit_batch_opts_t o = {.chunk_bytes = chunk, .max_shift = max_shift, .copies = true, .fills = true};
        refit_batch_t b;
        REFIT_ASSERT_OK(refit_batch_build(plan, &o, &b));
        assert_int_equal(b.bytes, ps.bytes_written + ps.bytes_fill);
        void *d = arena(dm, 0xee);
        void **slots = calloc(b.nslots, sizeof(void *));
        for (uint32_t s = 0; s < set.n; s++)
            for (uint32_t k = b.src_slot_base[s]; k < b.src_slot_base[s + 1]; k++) slots[k] = set.arenas[s];
        for (uint32_t k = b.dst_slot_base; k < b.nslots; k++) slots[k] = d;
        refit_batch_execute_host(&b, slots, threads);
        refit_truth_report_t rep = REFIT_TRUTH_REPORT_INIT;
        REFIT_ASSERT_OK(refit_truth_verify(dm, (const void *const *)&d, 3, &rep));
        free(slots);
        free(d);
        refit_batch_free(&b);
        refit_plan_destroy(plan);
        refit_manifest_destroy(dm);
    }
    tool_local_set_destroy(&set);
    refit_layout_destroy(sl);
    refit_layout_destroy(dl);
    refit_model_destroy(md);
    return fills;
}

static void test_batch(void **state)
{
    (void)state;
    check_batch("tiny-moe", "megatron:ep=2", "vllm:tp=2", 4096, 5, 4);
    check_batch("tiny-moe", "megatron:tp=2,ep=2", "vllm:tp=2,ep=2", 1000, 3, 4);
    check_batch("tiny-moe", "megatron:ep=2", "vllm:tp=2", 777, 4, 0);
    check_batch("tiny-mla", "megatron:tp=2", "vllm:tp=2", 65536, 256, 4);
    check_batch("tiny-moe", "megatron:ep=4", "vllm:tp=2", 1 << 18, 256, 4);
    /* A destination with padding (vocab rows nobody holds): fills run too. */
    assert_true(check_batch("tiny-dense", "hf", "megatron:tp=2", 4096, 7, 4) +
                    check_batch("tiny-moe", "hf", "megatron:tp=4", 4096, 7, 3) >
                0);
}

static void test_single_and_digest(void **state)
{
    (void)state;
    uint64_t n = 100003;
    unsigned char *a = malloc(n), *b = malloc(n);
    for (uint64_t i = 0; i < n; i++) a[i] = (unsigned char)next();
    memset(b, 0, n);
    refit_batch_t bt;
    REFIT_ASSERT_OK(refit_batch_single(n, 4096, 4, &bt));
    void *slots[2] = {a, b};
    refit_batch_execute_host(&bt, slots, 64);
    assert_memory_equal(a, b, n);
    uint64_t d = refit_digest_host(a, n);
    b[n / 2] ^= 1;
    assert_true(refit_digest_host(b, n) != d);
    b[n / 2] ^= 1;
    assert_int_equal(refit_digest_host(b, n), d);
    refit_batch_free(&bt);
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_hash),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_batch),
        cmocka_unit_test(test_single_and_digest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
