/* GPU content digests (src/transport/cuda/digest.cu) against the CPU's (src/data/digest*.c), bit for bit:
 * publishers' tables and receivers' own sums, over built-in layouts of several models and over hand-made
 * boxes that take the kernels' other paths (rows not 16-byte aligned, column starts that are not a
 * multiple of 8 units, rows longer than a column-key block, f32, narrow rows); a changed byte changes the
 * GPU's sums.
 *
 *   test_gpu_digest                     the tests (exit 77 without a GPU)
 *   test_gpu_digest --bench MODEL SPEC  timings on device 0 (JSON on stdout): the manifest of rank 0 of SPEC
 *                                       filled with the synthetic truth; interleaved, per round: a
 *                                       device-to-device copy of its region, the GPU table, the GPU own sums */
#include <inttypes.h>
#include <time.h>

#include "data/digest.h"
#include "refit/plan.h"
#include "transport/cuda/gpu.h"
#include "util/util.h"
#include "verify/verify.h"

#include "gputest.h"

#ifdef REFIT_HAVE_CUDA /* the work lists (verify/verify.h) exist only in a build with CUDA */

static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static refit_digest_key_t *key_of(uint8_t seed)
{
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(seed * 31 + i * 7 + 1);
    refit_digest_key_t *k = NULL;
    REFIT_ASSERT_OK(refit_digest_key_create(key, &k));
    return k;
}

/* Random bytes, with the extreme units (0x8000, 0x7fff, 0xffff) sprinkled in. */
static void fill_random(uint8_t *p, uint64_t n)
{
    for (uint64_t i = 0; i + 8 <= n; i += 8) {
        uint64_t x = rnd();
        memcpy(p + i, &x, 8);
    }
    for (uint64_t i = n & ~(uint64_t)7; i < n; i++) p[i] = (uint8_t)rnd();
    static const uint16_t ext[3] = {0x8000, 0x7fff, 0xffff};
    for (uint64_t i = 0; i + 1 < n; i += 2 * (1 + rnd() % 61)) memcpy(p + (i & ~(uint64_t)1), &ext[rnd() % 3], 2);
}

typedef struct {
    uint32_t nreg;
    void *host[8], *dev[8];
} mem_t;

static void mem_make(const refit_manifest_t *m, mem_t *x)
{
    x->nreg = refit_manifest_num_regions(m);
    assert_true(x->nreg <= 8);
    for (uint32_t r = 0; r < x->nreg; r++) {
        uint64_t size = refit_manifest_region_size(m, r);
        x->host[r] = malloc(size ? size : 1);
        assert_non_null(x->host[r]);
        fill_random(x->host[r], size);
        REFIT_ASSERT_OK(refit_gpu_alloc(0, size ? size : 1, &x->dev[r]));
        REFIT_ASSERT_OK(refit_gpu_copy(x->dev[r], x->host[r], size));
    }
}

static void mem_free(mem_t *x)
{
    for (uint32_t r = 0; r < x->nreg; r++) {
        free(x->host[r]);
        refit_gpu_free(x->dev[r]);
    }
}

/* The GPU's table and own sums of m equal the CPU's; a changed unit changes the GPU's sums.  Returns the
 * number of digestible placements. */
static uint32_t compare(const char *what, const refit_digest_key_t *k, const refit_manifest_t *m)
{
    mem_t x;
    mem_make(m, &x);
    uint64_t tb = refit_digest_table_bytes(m);
    uint32_t np = refit_manifest_num_placements(m);
    uint8_t *cpu_t = aligned_alloc(64, (tb + 64) / 64 * 64), *gpu_t = malloc(tb + 1);
    refit_dsum_t *cpu_s = calloc(np + 1, sizeof(*cpu_s)), *gpu_s = calloc(np + 1, sizeof(*gpu_s));
    assert_true(cpu_t && gpu_t && cpu_s && gpu_s);
    REFIT_ASSERT_OK(refit_digest_table_fill(k, m, (const void *const *)x.host, cpu_t, 0));
    REFIT_ASSERT_OK(refit_digest_local(k, m, (const void *const *)x.host, cpu_s, 0));
    void *dtab = NULL;
    REFIT_ASSERT_OK(refit_gpu_alloc(0, tb + 8, &dtab));
    refit_gpu_digest_t *gt = NULL, *gl = NULL;
    REFIT_ASSERT_OK(refit_gpu_digest_create(0, k, m, x.dev, true, &gt));
    REFIT_ASSERT_OK(refit_gpu_digest_create(0, k, m, x.dev, false, &gl));
    for (int round = 0; round < 2; round++) { /* a work list is reusable */
        memset(gpu_t, 0xa5, tb);
        REFIT_ASSERT_OK(refit_gpu_digest_table_run(gt, dtab));
        REFIT_ASSERT_OK(refit_gpu_copy(gpu_t, dtab, tb));
        if (memcmp(cpu_t, gpu_t, tb)) {
            uint64_t e = 0;
            while (!memcmp(cpu_t + 8 * e, gpu_t + 8 * e, 8)) e++;
            FAIL("%s: GPU table differs from the CPU's at entry %" PRIu64 " of %" PRIu64, what, e, tb / 8);
        }
        memset(gpu_s, 0xa5, np * sizeof(*gpu_s));
        REFIT_ASSERT_OK(refit_gpu_digest_local_run(gl, gpu_s));
        for (uint32_t i = 0; i < np; i++)
            if (memcmp(&cpu_s[i], &gpu_s[i], sizeof(refit_dsum_t)))
                FAIL("%s: GPU sum of placement %u is %08x %08x, the CPU's %08x %08x", what, i, gpu_s[i].lane[0],
                     gpu_s[i].lane[1], cpu_s[i].lane[0], cpu_s[i].lane[1]);
    }
    uint32_t digestible = 0;
    for (uint32_t i = 0; i < np; i++) digestible += cpu_s[i].lane[0] || cpu_s[i].lane[1];
    /* One unit of the first digested placement changed on the device: its sum moves, the others stay. */
    refit_digest_item_t *items = NULL;
    size_t ni = 0;
    REFIT_ASSERT_OK(refit_digest_items(k, m, (const void *const *)x.dev, false, &items, &ni));
    if (ni) {
        uint16_t u;
        uint8_t *at = (uint8_t *)items[0].p + 2 * (items[0].n / 2);
        REFIT_ASSERT_OK(refit_gpu_copy(&u, at, 2));
        u ^= 0x0100;
        REFIT_ASSERT_OK(refit_gpu_copy(at, &u, 2));
        REFIT_ASSERT_OK(refit_gpu_digest_local_run(gl, gpu_s));
        uint32_t pl = items[0].pl;
        assert_true(gpu_s[pl].lane[0] != cpu_s[pl].lane[0] && gpu_s[pl].lane[1] != cpu_s[pl].lane[1]);
        for (uint32_t i = 0; i < np; i++)
            if (i != pl) assert_memory_equal(&gpu_s[i], &cpu_s[i], sizeof(refit_dsum_t));
    }
    printf("ok  %-44s %6u placements, %5u digested, table %9" PRIu64 " entries, %zu items\n", what, np, digestible,
           tb / 8, ni);
    free(items);
    refit_gpu_digest_destroy(gt);
    refit_gpu_digest_destroy(gl);
    refit_gpu_free(dtab);
    free(cpu_t);
    free(gpu_t);
    free(cpu_s);
    free(gpu_s);
    mem_free(&x);
    return digestible;
}

static void layouts(const refit_digest_key_t *k)
{
    static const struct {
        const char *model, *spec;
        uint32_t ranks;
    } cases[] = {
        {"tiny-dense", "hf", 1},
        {"tiny-dense", "megatron:tp=2", 2},
        {"tiny-dense", "vllm:tp=2", 2},
        {"tiny-moe", "megatron:ep=2", 2},
        {"tiny-moe", "vllm:tp=2", 2},
        {"tiny-mla", "vllm:tp=2", 2},
        {"tiny-tied", "megatron:tp=2,pp=2", 4},
        {"qwen3-30b-a3b-mini", "megatron:ep=2", 1},
        {"qwen3-30b-a3b-mini", "vllm:tp=2", 1},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
        for (uint32_t r = 0; r < cases[c].ranks; r++) {
            refit_manifest_t *m = t_manifest_named(cases[c].model, cases[c].spec, r);
            char what[96];
            snprintf(what, sizeof(what), "%s %s rank %u", cases[c].model, cases[c].spec, r);
            assert_true(compare(what, k, m) > 0);
            refit_manifest_destroy(m);
        }
}

/* One canonical tensor per box, each box in a local tensor of its own, packed in one region (64-byte
 * aligned starts): the boxes choose the kernel's paths. */
typedef struct {
    const char *name;
    refit_dtype_t dtype;
    uint32_t ndim;
    uint64_t shape[2], off[2], ext[2];
} box_t;

static refit_manifest_t *hand(const box_t *b, size_t nb)
{
    refit_manifest_identity_t id = {"m", "hand", 0, 1};
    refit_manifest_t *m = NULL;
    REFIT_ASSERT_OK(refit_manifest_create(&id, &m));
    uint64_t size = 0, sz[16];
    for (size_t i = 0; i < nb; i++) {
        sz[i] = refit_dtype_size(b[i].dtype) * b[i].ext[0] * (b[i].ndim == 2 ? b[i].ext[1] : 1);
        size += (sz[i] + 63) / 64 * 64;
    }
    uint32_t region, cid, lid;
    REFIT_ASSERT_OK(refit_manifest_add_region(m, size, &region));
    uint64_t off = 0;
    for (size_t i = 0; i < nb; i++) {
        refit_tensor_info_t ci = {b[i].name, b[i].dtype, b[i].ndim, {b[i].shape[0], b[i].shape[1]}}, li = ci;
        char lname[32];
        snprintf(lname, sizeof(lname), "local%zu", i);
        li.name = lname;
        li.shape[0] = b[i].ext[0];
        li.shape[1] = b[i].ext[1];
        REFIT_ASSERT_OK(refit_manifest_add_canonical(m, &ci, &cid));
        REFIT_ASSERT_OK(refit_manifest_add_local(m, &li, region, off, &lid));
        refit_placement_t p = {.canon = cid, .local = lid, .ndim = b[i].ndim};
        for (uint32_t d = 0; d < b[i].ndim; d++) {
            p.canon_offset[d] = b[i].off[d];
            p.extent[d] = b[i].ext[d];
        }
        REFIT_ASSERT_OK(refit_manifest_add_placement(m, &p));
        off += (sz[i] + 63) / 64 * 64;
    }
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    return m;
}

static void hand_boxes(const refit_digest_key_t *k)
{
    const box_t b[] = {
        {"long_1d", REFIT_DTYPE_BF16, 1, {200003, 0}, {0, 0}, {200003, 0}},         /* 4 key blocks, odd tail */
        {"wide_rows", REFIT_DTYPE_BF16, 2, {37, 70001}, {5, 0}, {25, 70001}},       /* rows not 16-byte aligned */
        {"cut_cols", REFIT_DTYPE_BF16, 2, {9, 66003}, {0, 3}, {9, 65997}},          /* column start 3, across a block */
        {"f32_rows", REFIT_DTYPE_F32, 2, {300, 4096}, {100, 0}, {130, 4096}},       /* vector path, 8192 units/row */
        {"narrow", REFIT_DTYPE_BF16, 2, {1000, 24}, {0, 0}, {1000, 24}},            /* many rows per tile */
        {"odd_units", REFIT_DTYPE_F16, 2, {70, 13}, {0, 0}, {70, 13}},              /* 13 units: tails only */
        {"cols_aligned", REFIT_DTYPE_BF16, 2, {129, 4096}, {0, 2048}, {129, 2048}}, /* column half */
        {"block_edge", REFIT_DTYPE_BF16, 2, {3, 131072}, {0, 65528}, {3, 16}},      /* 8 units each side */
    };
    refit_manifest_t *m = hand(b, sizeof(b) / sizeof(b[0]));
    assert_true(compare("hand-made boxes", k, m) == sizeof(b) / sizeof(b[0]));
    refit_manifest_destroy(m);
}

/* A plan's copy that hashes what it writes (refit_gpu_digest_fused_*, the cuda_ipc pull's with digests on)
 * against the plan executed on the CPU and hashed there, and against the GPU's separate pass over the memory
 * it wrote; then the check on the GPU (refit_gpu_digest_check_*) against the sources' GPU tables: no
 * mismatch, and a changed unit of the destination is found, as the CPU's refit_digest_check finds it. */
static void plan_case(const refit_digest_key_t *k, const char *model, const char *src_spec, uint32_t nsrc,
                      const char *dst_spec, uint32_t dst_rank)
{
    enum { MAXS = 8, SLOTS_PER = 8 };
    assert_true(nsrc <= MAXS);
    refit_manifest_t *srcm[MAXS];
    mem_t sm[MAXS];
    void *dtab[MAXS];
    for (uint32_t s = 0; s < nsrc; s++) {
        srcm[s] = t_manifest_named(model, src_spec, s);
        mem_make(srcm[s], &sm[s]);
        assert_true(sm[s].nreg <= SLOTS_PER);
        /* replicas of a tensor on two sources hold the same bytes (the plan reads one, the digests another) */
        REFIT_ASSERT_OK(refit_gpu_truth_fill(srcm[s], 0, sm[s].dev, 7));
        for (uint32_t r = 0; r < sm[s].nreg; r++)
            REFIT_ASSERT_OK(refit_gpu_copy(sm[s].host[r], sm[s].dev[r], refit_manifest_region_size(srcm[s], r)));
        refit_gpu_digest_t *gt = NULL;
        uint64_t tb = refit_digest_table_bytes(srcm[s]);
        REFIT_ASSERT_OK(refit_gpu_alloc(0, tb + 8, &dtab[s]));
        REFIT_ASSERT_OK(refit_gpu_digest_create(0, k, srcm[s], sm[s].dev, true, &gt));
        REFIT_ASSERT_OK(refit_gpu_digest_table_run(gt, dtab[s]));
        refit_gpu_digest_destroy(gt);
    }
    refit_manifest_t *dm = t_manifest_named(model, dst_spec, dst_rank);
    uint32_t nd = refit_manifest_num_regions(dm), np = refit_manifest_num_placements(dm);
    assert_true(nd <= 8);
    void *dh[8], *dd[8], *back[8];
    for (uint32_t r = 0; r < nd; r++) {
        uint64_t size = refit_manifest_region_size(dm, r);
        dh[r] = calloc(1, size ? size : 1);
        back[r] = malloc(size ? size : 1);
        assert_true(dh[r] && back[r]);
        REFIT_ASSERT_OK(refit_gpu_alloc(0, size ? size : 1, &dd[r]));
        REFIT_ASSERT_OK(refit_gpu_copy(dd[r], dh[r], size ? size : 1));
    }
    refit_plan_t *plan = NULL;
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)srcm, nsrc, dm, NULL, &plan));
    /* CPU: the plan by memcpy, then the sums of what it wrote */
    const void *const *hs[MAXS];
    for (uint32_t s = 0; s < nsrc; s++) hs[s] = (const void *const *)sm[s].host;
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(plan, hs, dh, 1));
    refit_dsum_t *cpu = calloc(np + 1, sizeof(*cpu)), *fused = calloc(np + 1, sizeof(*fused)),
                 *sep = calloc(np + 1, sizeof(*sep));
    assert_true(cpu && fused && sep);
    REFIT_ASSERT_OK(refit_digest_local(k, dm, (const void *const *)dh, cpu, 0));
    /* GPU: the plan's runs (one per innermost copy), slot s * SLOTS_PER + region */
    size_t nreg;
    const refit_plan_region_t *regs = refit_plan_regions(plan, &nreg);
    REFIT_VEC(refit_gpu_run_t) runs = {0};
    REFIT_VEC(refit_plan_region_t) one = {0};
    for (size_t i = 0; i < nreg; i++) {
        const refit_plan_region_t *r = &regs[i];
        uint64_t c[3] = {1, 1, 1};
        for (uint32_t l = 0; l < r->nloops; l++) c[l] = r->count[l];
        for (uint64_t d2 = 0; d2 < c[2]; d2++)
            for (uint64_t d1 = 0; d1 < c[1]; d1++)
                for (uint64_t d0 = 0; d0 < c[0]; d0++) {
                    uint64_t d[3] = {d0, d1, d2}, so = r->src_offset, dof = r->dst_offset;
                    for (uint32_t l = 0; l < r->nloops; l++) {
                        so += d[l] * r->src_stride[l];
                        dof += d[l] * r->dst_stride[l];
                    }
                    refit_gpu_run_t g = {(uint64_t)(uintptr_t)dd[r->dst_region] + dof, r->run, so,
                                         r->src * SLOTS_PER + r->src_region, 0};
                    refit_plan_region_t o = *r;
                    o.nloops = 0;
                    o.src_offset = so;
                    o.dst_offset = dof;
                    assert_true(REFIT_VEC_PUSH(&runs, g) == 0 && REFIT_VEC_PUSH(&one, o) == 0);
                }
    }
    uint64_t slots[MAXS * SLOTS_PER] = {0};
    for (uint32_t s = 0; s < nsrc; s++)
        for (uint32_t r = 0; r < sm[s].nreg; r++) slots[s * SLOTS_PER + r] = (uint64_t)(uintptr_t)sm[s].dev[r];
    refit_gpu_digest_t *gd = NULL;
    REFIT_ASSERT_OK(refit_gpu_digest_create(0, k, dm, dd, false, &gd));
    refit_gpu_digest_fused_t *f = NULL;
    refit_gpu_rest_t *rest = NULL;
    size_t nrest = 0;
    REFIT_ASSERT_OK(refit_gpu_digest_fused_create(gd, runs.data, runs.len, MAXS * SLOTS_PER, &f, &rest, &nrest));
    uint64_t rest_bytes = 0;
    for (size_t i = 0; i < nrest; i++) { /* what no digest covers: copied by the runtime here */
        const refit_plan_region_t *o = &one.data[rest[i].run];
        REFIT_ASSERT_OK(refit_gpu_copy((uint8_t *)dd[o->dst_region] + o->dst_offset + rest[i].off,
                                       (const uint8_t *)sm[o->src].dev[o->src_region] + o->src_offset + rest[i].off,
                                       rest[i].len));
        rest_bytes += rest[i].len;
    }
    for (int round = 0; round < 2; round++) { /* the table is reusable */
        memset(fused, 0xa5, np * sizeof(*fused));
        REFIT_ASSERT_OK(refit_gpu_digest_fused_launch(gd, f, slots));
        REFIT_ASSERT_OK(refit_gpu_digest_wait(gd));
        REFIT_ASSERT_OK(refit_gpu_digest_sums(gd, fused));
        for (uint32_t i = 0; i < np; i++)
            if (memcmp(&cpu[i], &fused[i], sizeof(refit_dsum_t)))
                FAIL("%s %s -> %s rank %u: fused sum of placement %u is %08x %08x, the CPU's %08x %08x", model,
                     src_spec, dst_spec, dst_rank, i, fused[i].lane[0], fused[i].lane[1], cpu[i].lane[0],
                     cpu[i].lane[1]);
    }
    for (uint32_t r = 0; r < nd; r++) { /* the bytes it wrote are the CPU's */
        uint64_t size = refit_manifest_region_size(dm, r);
        REFIT_ASSERT_OK(refit_gpu_copy(back[r], dd[r], size));
        if (memcmp(back[r], dh[r], size)) {
            uint64_t b = 0;
            while (((uint8_t *)back[r])[b] == ((uint8_t *)dh[r])[b]) b++;
            FAIL("%s %s -> %s rank %u: region %u differs from the CPU's copy at byte %" PRIu64, model, src_spec,
                 dst_spec, dst_rank, r, b);
        }
    }
    REFIT_ASSERT_OK(refit_gpu_digest_local_run(gd, sep)); /* the separate pass: the same sums */
    assert_memory_equal(sep, cpu, np * sizeof(*cpu));
    /* The check on the GPU: fused sums, then a separate pass; then one unit changed. */
    refit_digest_plan_t *dp = NULL;
    REFIT_ASSERT_OK(refit_digest_plan_create((const refit_manifest_t *const *)srcm, nsrc, NULL, dm, &dp));
    refit_digest_plan_stats_t ps;
    refit_digest_plan_stats(dp, &ps);
    assert_true(ps.verifiable > 0);
    refit_gpu_digest_check_t *chk = NULL;
    REFIT_ASSERT_OK(refit_gpu_digest_check_create(gd, dp, nsrc, &chk));
    const void *tabs[MAXS];
    for (uint32_t s = 0; s < nsrc; s++) tabs[s] = dtab[s];
    uint64_t bad = 99;
    uint32_t first = 0;
    REFIT_ASSERT_OK(refit_gpu_digest_fused_launch(gd, f, slots));
    REFIT_ASSERT_OK(refit_gpu_digest_verify_run(gd, chk, tabs, true, &bad, &first, sep));
    assert_int_equal(bad, 0);
    REFIT_ASSERT_OK(refit_gpu_digest_verify_run(gd, chk, tabs, false, &bad, &first, sep));
    assert_int_equal(bad, 0);
    /* the CPU's check of the same entries agrees */
    size_t nf = 0;
    const refit_digest_fetch_t *fe = refit_digest_plan_fetches(dp, &nf);
    uint8_t *ent = malloc(nf * 8 + 8);
    assert_non_null(ent);
    for (size_t i = 0; i < nf; i++)
        REFIT_ASSERT_OK(refit_gpu_copy(ent + 8 * i, (const uint8_t *)dtab[fe[i].src] + fe[i].offset, 8));
    refit_digest_report_t rep;
    REFIT_ASSERT_OK(refit_digest_check(dp, ent, cpu, &rep));
    /* one unit of the first digested tile changed on the device */
    refit_digest_item_t *items = NULL;
    size_t ni = 0;
    REFIT_ASSERT_OK(refit_digest_items(k, dm, (const void *const *)dd, false, &items, &ni));
    assert_true(ni > 0);
    uint32_t pl = items[0].pl;
    bool verifiable = refit_digest_plan_reason(dp, pl) == REFIT_DIGEST_VERIFIABLE;
    uint16_t u;
    uint8_t *at = (uint8_t *)items[0].p + 2 * (items[0].n / 2);
    REFIT_ASSERT_OK(refit_gpu_copy(&u, at, 2));
    u ^= 0x0004;
    REFIT_ASSERT_OK(refit_gpu_copy(at, &u, 2));
    memset(sep, 0, np * sizeof(*sep));
    REFIT_ASSERT_OK(refit_gpu_digest_verify_run(gd, chk, tabs, false, &bad, &first, sep));
    if (verifiable) {
        assert_int_equal(bad, 1);
        assert_int_equal(first, pl);
        REFIT_ASSERT_ERR(refit_digest_check(dp, ent, sep, &rep), REFIT_ERR_VERIFY, "digest mismatch");
    }
    printf("ok  fused %s %s -> %s rank %u: %zu runs, %zu rest pieces (%" PRIu64 " bytes), %" PRIu64
           " verifiable placements, changed unit %s\n",
           model, src_spec, dst_spec, dst_rank, runs.len, nrest, rest_bytes, ps.verifiable,
           verifiable ? "found" : "in an unverifiable placement");
    free(items);
    free(ent);
    refit_gpu_digest_check_destroy(chk);
    refit_digest_plan_destroy(dp);
    refit_gpu_digest_fused_destroy(f);
    refit_gpu_digest_destroy(gd);
    free(rest);
    REFIT_VEC_FREE(&runs);
    REFIT_VEC_FREE(&one);
    free(cpu);
    free(fused);
    free(sep);
    refit_plan_destroy(plan);
    for (uint32_t r = 0; r < nd; r++) {
        free(dh[r]);
        free(back[r]);
        refit_gpu_free(dd[r]);
    }
    refit_manifest_destroy(dm);
    for (uint32_t s = 0; s < nsrc; s++) {
        mem_free(&sm[s]);
        refit_gpu_free(dtab[s]);
        refit_manifest_destroy(srcm[s]);
    }
}

static void plans(const refit_digest_key_t *k)
{
    plan_case(k, "tiny-moe", "megatron:ep=2", 2, "vllm:tp=2", 0);
    plan_case(k, "tiny-moe", "megatron:ep=2", 2, "vllm:tp=2", 1);
    plan_case(k, "tiny-dense", "megatron:tp=2", 2, "vllm:tp=2", 1);
    plan_case(k, "tiny-dense", "hf", 1, "megatron:tp=4", 3);
    plan_case(k, "tiny-mla", "hf", 1, "vllm:tp=2", 0);
    plan_case(k, "tiny-tied", "megatron:tp=2,pp=2", 4, "hf", 0);
    plan_case(k, "qwen3-30b-a3b-mini", "megatron:ep=2", 2, "vllm:tp=2", 0);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void stats(const char *name, double *v, int n, uint64_t bytes, bool last)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    printf("    \"%s\": {\"median_ms\": %.3f, \"min_ms\": %.3f, \"max_ms\": %.3f, \"read_gbps\": %.1f}%s\n", name,
           v[n / 2] * 1e3, v[0] * 1e3, v[n - 1] * 1e3, bytes / v[n / 2] / 1e9, last ? "" : ",");
}

static int bench(const char *model, const char *spec)
{
    refit_manifest_t *m = t_manifest_named(model, spec, 0);
    refit_digest_key_t *k = key_of(3);
    assert_true(refit_manifest_num_regions(m) == 1);
    uint64_t size = refit_manifest_region_size(m, 0), tb = refit_digest_table_bytes(m);
    void *src = NULL, *dst = NULL, *dtab = NULL;
    REFIT_ASSERT_OK(refit_gpu_alloc(0, size, &src));
    REFIT_ASSERT_OK(refit_gpu_alloc(0, size, &dst));
    REFIT_ASSERT_OK(refit_gpu_alloc(0, tb + 8, &dtab));
    REFIT_ASSERT_OK(refit_gpu_truth_fill(m, 0, &src, 7));
    double t0 = now_s();
    refit_gpu_digest_t *gt = NULL, *gl = NULL;
    REFIT_ASSERT_OK(refit_gpu_digest_create(0, k, m, &src, true, &gt));
    REFIT_ASSERT_OK(refit_gpu_digest_create(0, k, m, &src, false, &gl));
    double create_s = now_s() - t0;
    uint32_t np = refit_manifest_num_placements(m);
    refit_dsum_t *sums = calloc(np + 1, sizeof(*sums));
    enum { ROUNDS = 7 };
    double copy[ROUNDS], table[ROUNDS], local[ROUNDS], fused[ROUNDS];
    refit_dsum_t *fsums = calloc(np + 1, sizeof(*fsums));
    refit_gpu_digest_t *gf = NULL; /* the fused copy's work list: tiles at dst, read from src */
    REFIT_ASSERT_OK(refit_gpu_digest_create(0, k, m, &dst, false, &gf));
    int64_t delta = (int64_t)((uintptr_t)src - (uintptr_t)dst);
    REFIT_ASSERT_OK(refit_gpu_copy(dst, src, size)); /* warm-up */
    REFIT_ASSERT_OK(refit_gpu_digest_table_run(gt, dtab));
    REFIT_ASSERT_OK(refit_gpu_digest_local_run(gl, sums));
    for (int r = 0; r < ROUNDS; r++) {
        t0 = now_s();
        REFIT_ASSERT_OK(refit_gpu_copy(dst, src, size));
        copy[r] = now_s() - t0;
        t0 = now_s();
        REFIT_ASSERT_OK(refit_gpu_digest_table_run(gt, dtab));
        table[r] = now_s() - t0;
        t0 = now_s();
        REFIT_ASSERT_OK(refit_gpu_digest_local_run(gl, sums));
        local[r] = now_s() - t0;
        REFIT_ASSERT_OK(refit_gpu_copy(dst, dtab, 4096)); /* dst's first page is not src's again */
        t0 = now_s();
        REFIT_ASSERT_OK(refit_gpu_digest_copy_run(gf, delta, fsums));
        fused[r] = now_s() - t0;
    }
    /* The fused pass wrote the bytes it hashed: its sums are the source's. */
    bool fused_same = memcmp(sums, fsums, np * sizeof(*sums)) == 0;
    REFIT_ASSERT_OK(refit_gpu_digest_local_run(gf, fsums)); /* and the bytes it wrote are the source's */
    fused_same = fused_same && memcmp(sums, fsums, np * sizeof(*sums)) == 0;
    /* The GPU's table equals the CPU's on this memory too (a check of the bench's own result). */
    void *host = malloc(size), *ht = aligned_alloc(64, (tb + 64) / 64 * 64), *gtab = malloc(tb + 1);
    assert_true(host && ht && gtab);
    REFIT_ASSERT_OK(refit_gpu_copy(host, src, size));
    REFIT_ASSERT_OK(refit_digest_table_fill(k, m, (const void *const *)&host, ht, 0));
    REFIT_ASSERT_OK(refit_gpu_copy(gtab, dtab, tb));
    bool same = memcmp(ht, gtab, tb) == 0;
    double medc;
    printf("{\"bench\": \"gpu-digest\", \"model\": \"%s\", \"spec\": \"%s\", \"rank\": 0, \"bytes\": %" PRIu64
           ", \"table_bytes\": %" PRIu64 ", \"placements\": %u, \"rounds\": %d, \"create_s\": %.3f,"
           " \"table_equals_cpu\": %s, \"fused_sums_equal\": %s,\n",
           model, spec, size, tb, np, ROUNDS, create_s, same ? "true" : "false", fused_same ? "true" : "false");
    double c2[ROUNDS], t2[ROUNDS], l2[ROUNDS], f2[ROUNDS];
    memcpy(f2, fused, sizeof(f2));
    qsort(f2, ROUNDS, sizeof(double), cmp_d);
    memcpy(c2, copy, sizeof(c2));
    memcpy(t2, table, sizeof(t2));
    memcpy(l2, local, sizeof(l2));
    qsort(c2, ROUNDS, sizeof(double), cmp_d);
    qsort(t2, ROUNDS, sizeof(double), cmp_d);
    qsort(l2, ROUNDS, sizeof(double), cmp_d);
    medc = c2[ROUNDS / 2];
    printf("  \"table_vs_copy\": %.3f, \"local_vs_copy\": %.3f, \"copy_then_local_vs_copy\": %.3f,"
           " \"fused_vs_copy\": %.3f,\n",
           t2[ROUNDS / 2] / medc, l2[ROUNDS / 2] / medc, 1 + l2[ROUNDS / 2] / medc, f2[ROUNDS / 2] / medc);
    printf("  \"runs\": {\n");
    stats("d2d_copy", copy, ROUNDS, size, false);
    stats("table", table, ROUNDS, size, false);
    stats("local", local, ROUNDS, size, false);
    stats("fused_copy_hash", fused, ROUNDS, size, true);
    printf("  }}\n");
    refit_gpu_digest_destroy(gt);
    refit_gpu_digest_destroy(gl);
    refit_gpu_digest_destroy(gf);
    free(fsums);
    refit_gpu_free(src);
    refit_gpu_free(dst);
    refit_gpu_free(dtab);
    free(host);
    free(ht);
    free(gtab);
    free(sums);
    refit_digest_key_destroy(k);
    refit_manifest_destroy(m);
    return same && fused_same ? 0 : 1;
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
    (void)gputest_dst_device();
    if (argc == 4 && !strcmp(argv[1], "--bench")) return bench(argv[2], argv[3]);
    refit_digest_key_t *k = key_of(1);
    hand_boxes(k);
    layouts(k);
    plans(k);
    refit_digest_key_destroy(k);
    printf("test_gpu_digest: all passed\n");
    return 0;
#endif
}
