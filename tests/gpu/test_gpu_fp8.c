/* FP8 quantize-on-copy on the GPU (needs a CUDA device; exit 77 = skipped):
 *  - the kernel's arithmetic: every bf16 value divided by a spread of block
 *    scales (normal, subnormal, tiny, huge) gives the CPU's e4m3 byte;
 *  - quantize-on-copy tables (plan/fp8_table.h) run by the kernel from bf16
 *    sources on GPU 0 into FP8 arenas on the other GPU and on GPU 0 itself
 *    equal the CPU path (plan into a bf16 image, refit_fp8_stage) byte for
 *    byte: whole aligned blocks (megatron:ep=2 sources) and blocks gathered
 *    from several pieces (megatron:tp=4 sources cut blocks in half).
 *
 * With --bench MODEL SRC DST ITERS OUT.json it measures instead, on a real
 * model: per destination rank and device (the other GPU, then GPU 0), the
 * bf16 batch kernel (what a bf16 receiver's pull runs) and the FP8 kernel
 * pulling the same bf16 shards, medians of ITERS after a warm-up; the bf16
 * arena verified against the truth on the GPU, the FP8 arena copied back
 * and compared with the CPU stage of that bf16 arena, byte for byte. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/manifest.h"
#include "plan/fp8_table.h"
#include "refit/experimental/fp8.h"
#include "refit/experimental/all.h"
#include "util/util.h"
#ifdef REFIT_HAVE_CUDA
#include "data/fp8_hd.h"
#include "transport/cuda/fp8_gpu.h"
#include "transport/cuda/gpu.h"

#include "gputest.h"

static int g_dst_dev;

static void quantize_all(void)
{
    /* scales the quantizer makes from block maxima across the bf16 range */
    const uint16_t amax[] = {0x0001, 0x0040, 0x0080, 0x0100, 0x1234, 0x3a00,
                             0x3f80, 0x3f81, 0x43e0, 0x4480, 0x6000, 0x7f7f};
    uint32_t n = sizeof(amax) / sizeof(amax[0]) + 1;
    float scales[16];
    for (uint32_t k = 0; k + 1 < n; k++) scales[k] = refit_fp8_hd_scale(amax[k]);
    scales[n - 1] = 1.0f;
    uint8_t *q = malloc(65536ull * n);
    assert_non_null(q);
    REFIT_ASSERT_OK(refit_gpu_fp8_quantize_all(0, scales, n, q));
    uint64_t diff = 0;
    for (uint32_t i = 0; i < 65536; i++)
        for (uint32_t k = 0; k < n; k++) {
            uint8_t want = refit_fp8_e4m3_from_f32(refit_bf16_to_f32((uint16_t)i) / scales[k]);
            if (q[(uint64_t)i * n + k] != want && diff++ < 5)
                fprintf(stderr, "bf16 0x%04x / %g: GPU 0x%02x, CPU 0x%02x\n", i, (double)scales[k],
                        q[(uint64_t)i * n + k], want);
        }
    free(q);
    assert_int_equal(diff, 0);
}

typedef struct {
    refit_manifest_t *m[8];
    void *dev_base[8], *host_base[8];
    uint32_t n;
} srcs_t;

static void srcs_make(srcs_t *s, const char *model, const char *spec, uint64_t version, bool host)
{
    refit_layout_t *l = t_layout(spec);
    s->n = refit_layout_world(l);
    refit_layout_destroy(l);
    assert_true(s->n <= 8);
    for (uint32_t i = 0; i < s->n; i++) {
        s->m[i] = t_manifest_named(model, spec, i);
        s->dev_base[i] = gpu_arena(0, s->m[i]);
        REFIT_ASSERT_OK(refit_gpu_truth_fill(s->m[i], 0, &s->dev_base[i], version));
        s->host_base[i] = NULL;
        if (host) {
            s->host_base[i] = malloc(refit_manifest_region_size(s->m[i], 0));
            assert_non_null(s->host_base[i]);
            REFIT_ASSERT_OK(refit_truth_fill(s->m[i], &s->host_base[i], version));
        }
    }
}

static void srcs_free(srcs_t *s)
{
    for (uint32_t i = 0; i < s->n; i++) {
        refit_gpu_free(s->dev_base[i]);
        free(s->host_base[i]);
        refit_manifest_destroy(s->m[i]);
    }
}

static uint64_t *slots_for(const refit_fp8_table_t *x, const srcs_t *s, void *arena)
{
    uint64_t *slots = calloc(x->nslots, sizeof(uint64_t));
    for (uint32_t i = 0; i < s->n; i++)
        for (uint32_t k = x->src_slot_base[i]; k < x->src_slot_base[i + 1]; k++)
            slots[k] = (uint64_t)(uintptr_t)s->dev_base[i];
    slots[x->dst_slot] = (uint64_t)(uintptr_t)arena;
    return slots;
}

/* Bytes of the arena inside the target's tensors (the 256-byte gaps are nobody's). */
static uint64_t compare_arena(const refit_fp8_target_t *t, const unsigned char *got, const unsigned char *want)
{
    uint64_t bad = 0;
    for (uint32_t i = 0; i < refit_fp8_target_num_tensors(t); i++) {
        const refit_fp8_tensor_t *e = refit_fp8_target_tensor(t, i);
        if (!memcmp(got + e->offset, want + e->offset, e->bytes)) continue;
        for (uint64_t k = e->offset; k < e->offset + e->bytes; k++)
            if (got[k] != want[k] && bad++ < 5)
                fprintf(stderr, "%s: byte %llu of the arena: GPU 0x%02x, CPU 0x%02x\n", e->name,
                        (unsigned long long)(k - e->offset), got[k], want[k]);
    }
    return bad;
}

static void table_case(const char *model, const char *src_spec, const char *dst_spec, uint32_t rank, int dev,
                       bool expect_gather)
{
    srcs_t s;
    srcs_make(&s, model, src_spec, 3, true);
    refit_manifest_t *dst = t_manifest_named(model, dst_spec, rank);
    refit_plan_t *plan;
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)s.m, s.n, dst, NULL, &plan));
    refit_fp8_target_t *t;
    REFIT_ASSERT_OK(refit_fp8_target_create(dst, &t));
    /* the CPU path */
    void *img = calloc(1, refit_manifest_region_size(dst, 0));
    uint64_t nf = refit_fp8_target_bytes(t);
    unsigned char *want = calloc(1, nf), *junk = malloc(nf);
    const void *const *sb[8];
    for (uint32_t i = 0; i < s.n; i++) sb[i] = (const void *const *)&s.host_base[i];
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(plan, (const void *const *const *)sb, &img, 1));
    REFIT_ASSERT_OK(refit_fp8_stage(t, img, want, 0));
    /* the GPU: an arena full of junk, so that a byte not written shows */
    refit_fp8_table_t x;
    refit_batch_opts_t o = {.max_shift = 4, .copies = true, .fills = true};
    REFIT_ASSERT_OK(refit_fp8_table_build(plan, dst, t, &o, &x));
    assert_true(expect_gather ? x.npieces > x.nblocks : x.full_blocks > 0);
    void *arena = NULL;
    REFIT_ASSERT_OK(refit_gpu_alloc(dev, nf, &arena));
    memset(junk, 0xa5, nf);
    REFIT_ASSERT_OK(refit_gpu_copy(arena, junk, nf));
    refit_gpu_fp8_t *g;
    REFIT_ASSERT_OK(refit_gpu_fp8_create(dev, &x, &g));
    uint64_t *slots = slots_for(&x, &s, arena), launches = 0, uploads = 0;
    for (int it = 0; it < 2; it++) { /* twice: the second launch uploads nothing */
        REFIT_ASSERT_OK(refit_gpu_fp8_launch(g, slots, &launches, &uploads));
        REFIT_ASSERT_OK(refit_gpu_fp8_wait(g, NULL, NULL, 0));
    }
    assert_int_equal(launches, 2 * ((x.full_blocks > 0) + (x.nblocks > x.full_blocks) + (x.copy.n > 0)));
    assert_int_equal(uploads, x.copy.n ? 2 : 1);
    unsigned char *got = host_copy(arena, nf);
    assert_int_equal(compare_arena(t, got, want), 0);
    printf("  %s %s -> %s rank %u on GPU %d: %llu blocks (%llu whole, %llu pieces), %llu kept regions, bit-exact\n",
           model, src_spec, dst_spec, rank, dev, (unsigned long long)x.nblocks, (unsigned long long)x.full_blocks,
           (unsigned long long)x.npieces, (unsigned long long)x.copy.n);
    free(got);
    free(slots);
    refit_gpu_fp8_destroy(g);
    refit_gpu_free(arena);
    refit_fp8_table_free(&x);
    free(junk);
    free(want);
    free(img);
    refit_fp8_target_destroy(t);
    refit_plan_destroy(plan);
    refit_manifest_destroy(dst);
    srcs_free(&s);
}

/* The engine: bf16 publishers on GPU 0 (cuda_ipc), one FP8 receiver per
 * destination rank on dev (params.fp8, verified by the engine against the
 * CPU quantizer), three versions; the arena checked again here. */
static void engine_case(const char *model, const char *src_spec, const char *dst_spec, int dev)
{
    reg_t g;
    reg_file(&g);
    refit_layout_t *sl = t_layout(src_spec), *dl = t_layout(dst_spec);
    uint32_t ns = refit_layout_world(sl), nd = refit_layout_world(dl);
    refit_publisher_t *pub[8];
    refit_manifest_t *pm[8];
    void *pb[8];
    assert_true(ns <= 8 && nd <= 8);
    for (uint32_t k = 0; k < ns; k++) {
        refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
        pp.registry = g.url;
        pp.job = g.job;
        pp.device = 0;
        pp.transports = "cuda_ipc";
        pm[k] = t_manifest_named(model, src_spec, k);
        REFIT_ASSERT_OK(refit_publisher_create(&pp, pm[k], &pub[k]));
        REFIT_ASSERT_OK(refit_publisher_alloc(pub[k], 0, &pb[k]));
    }
    refit_receiver_t *rx[8];
    void *rb[8];
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g.url;
    rp.job = g.job;
    rp.verify = REFIT_VERIFY_TRUTH;
    rp.fp8 = true;
    rp.transports = "cuda_ipc";
    /* refused: host memory, a transport that cannot quantize, a relay */
    REFIT_ASSERT_ERR(refit_receiver_create(&rp, t_manifest_named(model, dst_spec, 0), &rx[0]), REFIT_ERR_UNSUPPORTED,
                     "set device");
    rp.device = dev;
    rp.transports = "shm";
    REFIT_ASSERT_ERR(refit_receiver_create(&rp, t_manifest_named(model, dst_spec, 0), &rx[0]), REFIT_ERR_UNSUPPORTED,
                     "cuda_ipc");
    rp.transports = "cuda_ipc";
    rp.relay_slot = 0;
    REFIT_ASSERT_ERR(refit_receiver_create(&rp, t_manifest_named(model, dst_spec, 0), &rx[0]), REFIT_ERR_UNSUPPORTED,
                     "relay");
    rp.relay_slot = -1;
    for (uint32_t k = 0; k < nd; k++) {
        REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(model, dst_spec, k), &rx[k]));
        REFIT_ASSERT_OK(refit_receiver_alloc(rx[k], 0, &rb[k]));
        assert_non_null(refit_receiver_fp8_target(rx[k]));
    }
    for (uint64_t v = 1; v <= 3; v++) {
        for (uint32_t k = 0; k < ns; k++) {
            REFIT_ASSERT_OK(refit_gpu_truth_fill(pm[k], 0, &pb[k], v));
            REFIT_ASSERT_OK(refit_publisher_publish(pub[k], v));
        }
        for (uint32_t k = 0; k < nd; k++) {
            refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
            REFIT_ASSERT_OK(refit_receiver_pull(rx[k], v, 20000, &rep));
            assert_int_equal(rep.version, v);
            assert_true(strstr(rep.lanes, "fp8") != NULL);
            assert_int_equal(rep.path, REFIT_RX_PATH_GPU_FP8);
            const refit_fp8_target_t *t = refit_receiver_fp8_target(rx[k]);
            refit_manifest_t *bf = t_manifest_named(model, dst_spec, k);
            uint64_t nf = refit_fp8_target_bytes(t);
            void *img = calloc(1, refit_manifest_region_size(bf, 0));
            unsigned char *want = calloc(1, nf), *got = host_copy(rb[k], nf);
            REFIT_ASSERT_OK(refit_truth_fill(bf, &img, v));
            REFIT_ASSERT_OK(refit_fp8_stage(t, img, want, 0));
            assert_int_equal(compare_arena(t, got, want), 0);
            printf(
                "  engine %s -> %s+fp8 v%llu rank %u on GPU %d: %llu bf16 bytes read, %llu launches, transfer %.2f ms, "
                "%s\n",
                src_spec, dst_spec, (unsigned long long)v, k, dev, (unsigned long long)rep.bytes,
                (unsigned long long)rep.launches, rep.transfer_ms, rep.lanes);
            free(img);
            free(want);
            free(got);
            refit_manifest_destroy(bf);
        }
        for (uint32_t k = 0; k < ns; k++) REFIT_ASSERT_OK(refit_publisher_wait_readers(pub[k], v, 10000));
    }
    /* bytes that are not version 4's (the publishers hold version 5's truth)
     * are caught by the engine's verification, and the memory is marked unusable */
    for (uint32_t k = 0; k < ns; k++) {
        REFIT_ASSERT_OK(refit_gpu_truth_fill(pm[k], 0, &pb[k], 5));
        REFIT_ASSERT_OK(refit_publisher_publish(pub[k], 4));
    }
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_ERR(refit_receiver_pull(rx[0], 4, 20000, &rep), REFIT_ERR_VERIFY, "FP8 tensor");
    assert_false(refit_receiver_usable(rx[0]));
    for (uint32_t k = 0; k < nd; k++) refit_receiver_destroy(rx[k]);
    for (uint32_t k = 0; k < ns; k++) refit_publisher_destroy(pub[k]);
    refit_layout_destroy(sl);
    refit_layout_destroy(dl);
    t_rm_tree(g.dir);
}

/* ---- --bench ---------------------------------------------------------------- */

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Kernel variants (refit_gpu_fp8_set_kernel) timed in the same run, from
 * $FP8_BENCH_KERNELS (stage counts, e.g. "3 4"): each overwrites the arena with other
 * bytes first and must give the default kernel's bytes (by digest). */
#define MAX_VARIANTS 8

typedef struct {
    double bf16_s, fp8_s, table_ms, var_s[MAX_VARIANTS];
    uint64_t bf16_bytes, fp8_bytes, blocks, whole, pieces;
    bool bf16_verified, fp8_bit_exact, var_exact[MAX_VARIANTS];
} rank_result_t;

static int variants(int *v)
{
    const char *e = getenv("FP8_BENCH_KERNELS");
    int n = 0;
    char *end;
    for (const char *p = e ? e : ""; *p && n < MAX_VARIANTS; p = end) {
        long k = strtol(p, &end, 10);
        if (end == p) break;
        v[n++] = (int)k;
    }
    return n;
}

static double time_fp8(refit_gpu_fp8_t *g, const uint64_t *slots, int iters)
{
    double times[64];
    for (int it = -1; it < iters; it++) {
        double t0 = refit_now();
        REFIT_ASSERT_OK(refit_gpu_fp8_launch(g, slots, NULL, NULL));
        REFIT_ASSERT_OK(refit_gpu_fp8_wait(g, NULL, NULL, 0));
        if (it >= 0) times[it] = refit_now() - t0;
    }
    return median(times, iters);
}

static void bench_rank(const srcs_t *s, const char *model, const char *dst_spec, uint32_t rank, int dev, int iters,
                       rank_result_t *r)
{
    refit_manifest_t *dst = t_manifest_named(model, dst_spec, rank);
    refit_plan_t *plan;
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)s->m, s->n, dst, NULL, &plan));
    refit_fp8_target_t *t;
    REFIT_ASSERT_OK(refit_fp8_target_create(dst, &t));
    uint64_t nb = refit_manifest_region_size(dst, 0), nf = refit_fp8_target_bytes(t);
    double times[64];
    /* bf16: the batch kernel on the destination's device reading the sources */
    refit_batch_t b;
    refit_batch_opts_t o = {.max_shift = 4, .copies = true, .fills = true};
    REFIT_ASSERT_OK(refit_batch_build(plan, &o, &b));
    refit_gpu_batch_t *gb;
    REFIT_ASSERT_OK(refit_gpu_batch_create(dev, &b, &gb));
    void *bf = NULL;
    REFIT_ASSERT_OK(refit_gpu_alloc(dev, nb, &bf));
    uint64_t *bslots = calloc(b.nslots, sizeof(uint64_t));
    for (uint32_t i = 0; i < s->n; i++)
        for (uint32_t k = b.src_slot_base[i]; k < b.src_slot_base[i + 1]; k++)
            bslots[k] = (uint64_t)(uintptr_t)s->dev_base[i];
    for (uint32_t k = b.dst_slot_base; k < b.nslots; k++) bslots[k] = (uint64_t)(uintptr_t)bf;
    for (int it = -1; it < iters; it++) {
        double t0 = refit_now();
        REFIT_ASSERT_OK(refit_gpu_batch_launch(gb, bslots, NULL, NULL));
        REFIT_ASSERT_OK(refit_gpu_batch_wait(gb, NULL, NULL, 0));
        if (it >= 0) times[it] = refit_now() - t0;
    }
    r->bf16_s += median(times, iters);
    r->bf16_bytes += b.bytes;
    refit_truth_report_t rep = REFIT_TRUTH_REPORT_INIT;
    REFIT_ASSERT_OK(refit_gpu_truth_verify(dst, dev, (const void *const *)&bf, 1, &rep));
    r->bf16_verified = rep.mismatches == 0 && rep.elements_checked > 0;
    unsigned char *img = host_copy(bf, nb);
    refit_gpu_batch_destroy(gb);
    refit_batch_free(&b);
    free(bslots);
    /* FP8: the same shards, quantized on the way */
    double t0 = refit_now();
    refit_fp8_table_t x;
    REFIT_ASSERT_OK(refit_fp8_table_build(plan, dst, t, &o, &x));
    r->table_ms += (refit_now() - t0) * 1e3;
    r->blocks += x.nblocks;
    r->whole += x.full_blocks;
    r->pieces += x.npieces;
    r->fp8_bytes += x.quantized_bf16 + x.copy.bytes;
    refit_gpu_fp8_t *g;
    REFIT_ASSERT_OK(refit_gpu_fp8_create(dev, &x, &g));
    void *arena = NULL;
    REFIT_ASSERT_OK(refit_gpu_alloc(dev, nf, &arena));
    uint64_t *slots = slots_for(&x, s, arena);
    r->fp8_s += time_fp8(g, slots, iters);
    unsigned char *got = host_copy(arena, nf), *want = calloc(1, nf);
    REFIT_ASSERT_OK(refit_fp8_stage(t, img, want, 0));
    r->fp8_bit_exact = compare_arena(t, got, want) == 0;
    uint64_t good = 0, d = 1;
    REFIT_ASSERT_OK(refit_gpu_digest(dev, arena, nf, &good));
    int var[MAX_VARIANTS], nv = variants(var);
    for (int k = 0; k < nv; k++) {
        REFIT_ASSERT_OK(refit_gpu_fp8_set_kernel(g, var[k]));
        REFIT_ASSERT_OK(refit_gpu_copy(arena, bf, nf < nb ? nf : nb)); /* bf16 bytes: not the answer */
        r->var_s[k] += time_fp8(g, slots, iters);
        REFIT_ASSERT_OK(refit_gpu_digest(dev, arena, nf, &d));
        r->var_exact[k] = r->var_exact[k] && d == good && r->fp8_bit_exact;
    }
    refit_gpu_free(bf);
    free(got);
    free(want);
    free(img);
    free(slots);
    refit_gpu_fp8_destroy(g);
    refit_gpu_free(arena);
    refit_fp8_table_free(&x);
    refit_fp8_target_destroy(t);
    refit_plan_destroy(plan);
    refit_manifest_destroy(dst);
}

static int bench(const char *model, const char *src_spec, const char *dst_spec, int iters, const char *out)
{
    if (iters < 1 || iters > 64) iters = 5;
    srcs_t s;
    srcs_make(&s, model, src_spec, 1, false);
    refit_layout_t *l = t_layout(dst_spec);
    uint32_t world = refit_layout_world(l);
    refit_layout_destroy(l);
    FILE *f = fopen(out, "w");
    assert_non_null(f);
    fprintf(f, "{\"model\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"iters\":%d,\"cases\":[", model, src_spec, dst_spec,
            iters);
    int devs[2] = {g_dst_dev, 0}, ndev = g_dst_dev ? 2 : 1;
    bool all = true;
    for (int d = 0; d < ndev; d++) {
        rank_result_t r;
        memset(&r, 0, sizeof(r));
        r.bf16_verified = r.fp8_bit_exact = true;
        for (int k = 0; k < MAX_VARIANTS; k++) r.var_exact[k] = true;
        bool v = true, e = true;
        for (uint32_t k = 0; k < world; k++) {
            bench_rank(&s, model, dst_spec, k, devs[d], iters, &r);
            v = v && r.bf16_verified;
            e = e && r.fp8_bit_exact;
        }
        double ratio = r.fp8_s / r.bf16_s;
        all = all && v && e;
        printf("%s on GPU %d (sources on GPU 0): bf16 %.4f s (%.1f GB), fp8 %.4f s, fp8_vs_bf16 %.3f, table %.0f ms, "
               "%llu blocks (%llu whole, %llu pieces), bf16 verified %d, fp8 bit-exact %d\n",
               devs[d] == 0 ? "colocated" : "cross-GPU", devs[d], r.bf16_s, r.bf16_bytes / 1e9, r.fp8_s, ratio,
               r.table_ms, (unsigned long long)r.blocks, (unsigned long long)r.whole, (unsigned long long)r.pieces, v,
               e);
        fprintf(f,
                "%s{\"case\":\"%s\",\"src_device\":0,\"dst_device\":%d,\"ranks\":%u,\"bf16_s\":%.6f,\"fp8_s\":%.6f,"
                "\"fp8_vs_bf16\":%.4f,\"bf16_bytes\":%llu,\"bf16_read_by_fp8\":%llu,\"table_ms\":%.1f,\"blocks\":%llu,"
                "\"whole_blocks\":%llu,\"pieces\":%llu,\"bf16_verified\":%s,\"bit_exact\":%s",
                d ? "," : "", devs[d] == 0 ? "colocated" : "cross-gpu", devs[d], world, r.bf16_s, r.fp8_s, ratio,
                (unsigned long long)r.bf16_bytes, (unsigned long long)r.fp8_bytes, r.table_ms,
                (unsigned long long)r.blocks, (unsigned long long)r.whole, (unsigned long long)r.pieces,
                v ? "true" : "false", e ? "true" : "false");
        int var[MAX_VARIANTS], nv = variants(var);
        fprintf(f, ",\"variants\":[");
        for (int k = 0; k < nv; k++) {
            printf("  kernel with %d stages: fp8 %.4f s, fp8_vs_bf16 %.3f, bit-exact %d\n", var[k], r.var_s[k],
                   r.var_s[k] / r.bf16_s, r.var_exact[k]);
            fprintf(f, "%s{\"stages\":%d,\"fp8_s\":%.6f,\"fp8_vs_bf16\":%.4f,\"bit_exact\":%s}", k ? "," : "", var[k],
                    r.var_s[k], r.var_s[k] / r.bf16_s, r.var_exact[k] ? "true" : "false");
            all = all && r.var_exact[k];
        }
        fprintf(f, "]}");
    }
    fprintf(f, "],\"verified\":%s}\n", all ? "true" : "false");
    fclose(f);
    srcs_free(&s);
    return all ? 0 : 1;
}
#endif

int main(int argc, char **argv)
{
#ifndef REFIT_HAVE_CUDA
    (void)argc;
    (void)argv;
    printf("SKIP: refit was built without CUDA (REFIT_WITH_CUDA=OFF or no CUDA toolkit)\n");
    return 77;
#else
    g_dst_dev = gputest_dst_device();
    if (g_dst_dev) REFIT_ASSERT_OK(refit_gpu_enable_peer(g_dst_dev, 0)); /* the kernels below read GPU 0 from GPU 1 */
    if (argc == 7 && !strcmp(argv[1], "--bench")) return bench(argv[2], argv[3], argv[4], atoi(argv[5]), argv[6]);
    quantize_all();
    printf("ok FP8 arithmetic: every bf16 value over 13 block scales, GPU = CPU\n");
    uint64_t bad = 0, checked = 0;
    uint16_t fx = 0, fa = 0;
    REFIT_ASSERT_OK(refit_gpu_fp8_check_all(0, &bad, &checked, &fx, &fa));
    if (bad)
        FAIL("the whole-block path differs in %llu of %llu cases, first bf16 0x%04x with amax 0x%04x",
             (unsigned long long)bad, (unsigned long long)checked, fx, fa);
    assert_true(checked > 1000000000ull);
    printf(
        "ok FP8 whole-block arithmetic (reciprocal + FMA correction, hardware e4m3) = fp8_hd.h for all %llu (x, amax)\n",
        (unsigned long long)checked);
    for (int d = 0; d < (g_dst_dev ? 2 : 1); d++) {
        int dev = d ? 0 : g_dst_dev;
        table_case("tiny-fp8", "megatron:ep=2", "vllm:tp=2", 0, dev, false);
        table_case("tiny-fp8", "megatron:ep=2", "vllm:tp=2", 1, dev, false);
        table_case("tiny-fp8", "megatron:ep=2", "vllm:tp=1", 0, dev, false);
        table_case("tiny-fp8", "megatron:tp=4", "vllm:tp=2", 1, dev, true);
    }
    printf("ok FP8 quantize-on-copy kernel = CPU stage, byte for byte (%s)\n",
           g_dst_dev ? "GPU 0 -> GPU 1 and colocated on GPU 0" : "colocated on GPU 0 only: one GPU here");
    for (int d = 0; d < (g_dst_dev ? 2 : 1); d++)
        engine_case("tiny-fp8", "megatron:ep=2", "vllm:tp=2", d ? 0 : g_dst_dev);
    printf(
        "ok FP8 receivers in the engine (params.fp8): quantized while pulled, verified, refused where they cannot work\n");
    return 0;
#endif
}
