/* bench_digest_fused: what the receiver's digest costs on top of its copy, and the publisher's table on top
 * of a memcpy, per kernel, from memory (buffers far larger than the caches), one thread.
 *
 *   receiver (one vLLM tp=2 rank of qwen3-30b-a3b-mini, its placements' boxes as strided runs):
 *     memcpy          one memcpy of the whole region (the floor);
 *     copy            the boxes' rows copied with memcpy, run by run, as a plan executor does;
 *     copy_then_hash  copy, then refit_digest_local over the destination (today's receiver), per kernel;
 *     fused           refit_digest_copy_rows over the same runs, per kernel;
 *   publisher (one Megatron ep=8 rank): memcpy of the shard vs refit_digest_table_fill, per kernel; a read of
 *     the shard alone (publisher_read: vector loads summed, the floor of any pass that reads it); and
 *     refit_digest_table_update (AUTO kernel) from 1% of the shard changed, as 2-byte units spread over it
 *     (table_update_sparse1pct, one range per unit) or as 4 KiB runs (table_update_runs1pct).
 *
 * Every round runs each variant once, in an order rotated round by round (interleaved A/B); a figure is
 * the median of the rounds with their range, and each ratio is the median of the per-round ratios.  Before
 * timing, the fused copy's bytes and sums are checked against copy and refit_digest_local for every kernel.
 *
 * Usage: bench_digest_fused [ROUNDS] (default 7).  Prints one JSON object on stdout. */
#include <immintrin.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "digest_common.h"
#include "data/digest_internal.h"
#include "refit/refit.h"
#include "refit/experimental/truth.h"
#include "util/util.h"

#define MAX_ROUNDS 64
#define NKERNELS 3

/* One placement's box as a strided run in region 0. */
typedef struct {
    uint64_t off, stride, tid, row, nrows, j, n;
    uint32_t pl;
} run_t;

typedef struct {
    const refit_manifest_t *m;
    run_t *runs;
    size_t nruns;
    uint8_t *src, *dst;
    uint64_t region, placed;
    refit_digest_key_t *keys[NKERNELS]; /* scalar, avx2, avx512; NULL if absent */
    refit_dsum_t *sums;                 /* per placement */
} rx_t;

static void *xalloc(uint64_t bytes)
{
    void *p = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!p) {
        fprintf(stderr, "out of memory (%" PRIu64 " bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static uint8_t *arena_of(const refit_manifest_t *m)
{
    uint8_t *a = xalloc(refit_manifest_region_size(m, 0));
    void *b = a;
    CHECK(refit_truth_fill(m, &b, 1)); /* touches every page */
    return a;
}

/* The digestible boxes that the receiver computes itself (whole rows or every row), as refit_digest_local
 * walks them: offset in the region, row stride, canonical rows and units. */
static void runs_of(const refit_digest_key_t *k, rx_t *rx)
{
    const refit_manifest_t *m = rx->m;
    rx->runs = calloc(m->placements.len, sizeof(run_t));
    if (!rx->runs) exit(1);
    for (uint32_t i = 0; i < m->placements.len; i++) {
        const refit_placement_t *p = &m->placements.data[i];
        const refit_local_t *l = &m->locals.data[p->local];
        cbox_t b;
        if (cbox_of(&m->canon.data[p->canon], p, &b) != REFIT_DIGEST_VERIFIABLE) continue;
        if (!cbox_full_rows(&b) && !cbox_all_rows(&b)) continue;
        uint64_t es = refit_dtype_size(l->d.dtype), lst[REFIT_MAX_DIMS];
        refit_tdesc_strides(&l->d, lst);
        run_t *r = &rx->runs[rx->nruns++];
        r->off = l->offset + refit_placement_local_index(m, p, p->canon_offset) * es;
        r->stride = p->ndim == 2 ? lst[l->d.ndim - 2] * es : 0;
        r->tid = refit_digest_tensor_id(k, m->canon.data[p->canon].name);
        r->row = b.a;
        r->nrows = b.nrows;
        r->j = b.c;
        r->n = b.n;
        r->pl = i;
        rx->placed += b.nrows * b.n * 2;
    }
}

static void do_copy(rx_t *rx)
{
    for (size_t i = 0; i < rx->nruns; i++) {
        const run_t *r = &rx->runs[i];
        for (uint64_t x = 0; x < r->nrows; x++)
            memcpy(rx->dst + r->off + x * r->stride, rx->src + r->off + x * r->stride, 2 * r->n);
    }
}

static void do_fused(rx_t *rx, const refit_digest_key_t *k)
{
    memset(rx->sums, 0, rx->m->placements.len * sizeof(*rx->sums));
    for (size_t i = 0; i < rx->nruns; i++) {
        const run_t *r = &rx->runs[i];
        refit_digest_copy_rows(k, r->tid, r->row, r->nrows, r->j, rx->dst + r->off, r->stride, rx->src + r->off,
                               r->stride, r->n, &rx->sums[r->pl]);
    }
}

static void do_copy_then_hash(rx_t *rx, const refit_digest_key_t *k)
{
    do_copy(rx);
    const void *b = rx->dst;
    CHECK(refit_digest_local(k, rx->m, &b, rx->sums, 1));
}

/* Before timing: every kernel's fused copy writes copy's bytes and refit_digest_local's sums. */
static void validate(rx_t *rx)
{
    size_t np = rx->m->placements.len;
    refit_dsum_t *want = malloc(np * sizeof(*want));
    uint8_t *ref = xalloc(rx->region);
    if (!want) exit(1);
    memset(rx->dst, 0x5a, rx->region);
    do_copy(rx);
    memcpy(ref, rx->dst, rx->region);
    const void *b = ref;
    CHECK(refit_digest_local(rx->keys[0], rx->m, &b, want, 1));
    for (int i = 0; i < NKERNELS; i++) {
        if (!rx->keys[i]) continue;
        memset(rx->dst, 0x5a, rx->region);
        do_fused(rx, rx->keys[i]);
        if (memcmp(rx->dst, ref, rx->region) || memcmp(rx->sums, want, np * sizeof(*want))) {
            fprintf(stderr, "fused copy (%s) differs from copy then refit_digest_local\n",
                    refit_digest_impl_name(refit_digest_key_impl(rx->keys[i])));
            exit(1);
        }
    }
    free(ref);
    free(want);
}

/* ------------------------------------------------------------ rounds */

enum {
    V_MEMCPY,
    V_COPY,
    V_CTH0, /* copy_then_hash per kernel: V_CTH0 + kernel */
    V_FUSED0 = V_CTH0 + NKERNELS,
    V_PUB_MEMCPY = V_FUSED0 + NKERNELS,
    V_PUB0,
    V_PUB_READ = V_PUB0 + NKERNELS,
    V_UPD_SPARSE,
    V_UPD_RUNS,
    V_COUNT
};

/* The shard read once, 128 bytes a step (AVX2 where the CPU has it): what a pass that only reads costs. */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, uint64_t n)
{
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (uint64_t i = 0; i + 128 <= n; i += 128) {
        a = _mm256_add_epi32(a, _mm256_loadu_si256((const __m256i *)(p + i)));
        b = _mm256_add_epi32(b, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
        c = _mm256_add_epi32(c, _mm256_loadu_si256((const __m256i *)(p + i + 64)));
        d = _mm256_add_epi32(d, _mm256_loadu_si256((const __m256i *)(p + i + 96)));
    }
    a = _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d));
    return (uint64_t)_mm256_extract_epi64(a, 0) + (uint64_t)_mm256_extract_epi64(a, 2);
}
#endif

static uint64_t read_all(const uint8_t *p, uint64_t n)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2")) return read_avx2(p, n);
#endif
    uint64_t s = 0;
    for (uint64_t i = 0; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, p + i, 8);
        s += x;
    }
    return s;
}

typedef struct {
    rx_t *rx;
    const refit_manifest_t *sm;
    uint8_t *sarena, *scopy;
    void *table;
    uint64_t sregion;
    refit_digest_key_t *kauto;
    /* table_update: the shard with 1% changed (sparse units, runs) and the ranges that changed */
    uint8_t *snew[2];
    refit_digest_range_t *ranges[2];
    size_t nranges[2];
    volatile uint64_t sink;
    double t[V_COUNT][MAX_ROUNDS];
    bool on[V_COUNT];
} bench_t;

static void run_variant(bench_t *B, int v, int round)
{
    rx_t *rx = B->rx;
    double t0 = refit_now();
    if (v == V_MEMCPY) memcpy(rx->dst, rx->src, rx->region);
    else if (v == V_COPY) do_copy(rx);
    else if (v < V_FUSED0) do_copy_then_hash(rx, rx->keys[v - V_CTH0]);
    else if (v < V_PUB_MEMCPY) do_fused(rx, rx->keys[v - V_FUSED0]);
    else if (v == V_PUB_MEMCPY) memcpy(B->scopy, B->sarena, B->sregion);
    else if (v == V_PUB_READ) B->sink += read_all(B->sarena, B->sregion);
    else if (v == V_UPD_SPARSE || v == V_UPD_RUNS) {
        int x = v - V_UPD_SPARSE;
        const void *nb = B->snew[x], *ob = B->sarena;
        CHECK(refit_digest_table_update(B->kauto, B->sm, &nb, &ob, B->ranges[x], B->nranges[x], B->table));
    } else {
        const void *b = B->sarena;
        CHECK(refit_digest_table_fill(rx->keys[v - V_PUB0], B->sm, &b, B->table, 1));
    }
    B->t[v][round] = refit_now() - t0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n)
{
    double s[MAX_ROUNDS];
    memcpy(s, v, (size_t)n * sizeof(*v));
    qsort(s, (size_t)n, sizeof(*s), cmp_double);
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static double vmin(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++) m = REFIT_MIN(m, v[i]);
    return m;
}

static double vmax(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++) m = REFIT_MAX(m, v[i]);
    return m;
}

static const char *variant_name(int v, char *buf, size_t size)
{
    static const char *kn[NKERNELS] = {"scalar", "avx2", "avx512"};
    if (v == V_MEMCPY) return "memcpy";
    if (v == V_COPY) return "copy";
    if (v == V_PUB_MEMCPY) return "publisher_memcpy";
    if (v == V_PUB_READ) return "publisher_read";
    if (v == V_UPD_SPARSE) return "table_update_sparse1pct";
    if (v == V_UPD_RUNS) return "table_update_runs1pct";
    if (v < V_FUSED0) snprintf(buf, size, "copy_then_hash_%s", kn[v - V_CTH0]);
    else if (v < V_PUB_MEMCPY) snprintf(buf, size, "fused_%s", kn[v - V_FUSED0]);
    else snprintf(buf, size, "table_fill_%s", kn[v - V_PUB0]);
    return buf;
}

/* "name": {ms median, min, max; GB/s at the median; ratio to base: median of per-round ratios, range}. */
static void print_variant(const bench_t *B, int v, int base, uint64_t bytes, int rounds, bool last)
{
    char buf[64], rb[64];
    double r[MAX_ROUNDS];
    for (int i = 0; i < rounds; i++) r[i] = B->t[v][i] / B->t[base][i];
    printf("    \"%s\": {\"ms_median\": %.1f, \"ms_min\": %.1f, \"ms_max\": %.1f, \"gbps_median\": %.2f, "
           "\"vs_%s\": {\"median\": %.3f, \"min\": %.3f, \"max\": %.3f}}%s\n",
           variant_name(v, buf, sizeof(buf)), median(B->t[v], rounds) * 1e3, vmin(B->t[v], rounds) * 1e3,
           vmax(B->t[v], rounds) * 1e3, (double)bytes / median(B->t[v], rounds) / 1e9,
           variant_name(base, rb, sizeof(rb)), median(r, rounds), vmin(r, rounds), vmax(r, rounds), last ? "" : ",");
}

static void report(const bench_t *B, int rounds, const char *host, const char *auto_kernel)
{
    const rx_t *rx = B->rx;
    printf("{\n  \"bench\": \"digest-fused\",\n%s  \"model\": \"qwen3-30b-a3b-mini\",\n  \"threads\": 1,\n"
           "  \"rounds\": %d,\n  \"kernel_auto\": \"%s\",\n",
           host, rounds, auto_kernel);
    printf("  \"receiver\": {\"layout\": \"vllm:tp=2\", \"rank\": 0, \"runs\": %zu, \"region_bytes\": %" PRIu64
           ", \"placed_bytes\": %" PRIu64 "},\n",
           rx->nruns, rx->region, rx->placed);
    printf("  \"receiver_variants\": {\n");
    int last = V_MEMCPY;
    for (int v = V_MEMCPY; v < V_PUB_MEMCPY; v++)
        if (B->on[v]) last = v;
    for (int v = V_MEMCPY; v < V_PUB_MEMCPY; v++)
        if (B->on[v]) print_variant(B, v, v <= V_COPY ? V_MEMCPY : V_COPY, rx->placed, rounds, v == last);
    printf("  },\n  \"publisher\": {\"layout\": \"megatron:ep=8\", \"rank\": 0, \"region_bytes\": %" PRIu64
           ", \"table_bytes\": %" PRIu64 "},\n  \"publisher_variants\": {\n",
           B->sregion, refit_digest_table_bytes(B->sm));
    for (int v = V_PUB_MEMCPY; v < V_COUNT; v++)
        if (B->on[v]) last = v;
    for (int v = V_PUB_MEMCPY; v < V_COUNT; v++)
        if (B->on[v]) print_variant(B, v, V_PUB_MEMCPY, B->sregion, rounds, v == last);
    printf("  }\n}\n");
}

/* The two changed shards and their ranges (1% of the bytes each: every unit with probability 1/100, in
 * address order; or every 100th 4 KiB run), and a check that updating the old memory's table gives the
 * new memory's. */
static void setup_updates(bench_t *B)
{
    uint64_t n = B->sregion, seed = 0x5eed;
    for (int x = 0; x < 2; x++) {
        B->snew[x] = xalloc(n);
        memcpy(B->snew[x], B->sarena, n);
        size_t cap = x == 0 ? n / 2 / 50 + 16 : n / 4096 / 100 + 16;
        B->ranges[x] = malloc(cap * sizeof(refit_digest_range_t));
        if (!B->ranges[x]) exit(1);
    }
    for (uint64_t u = 0; u + 2 <= n; u += 2) {
        seed = refit_mix64(seed);
        if (seed % 100 || B->nranges[0] == n / 2 / 50 + 16) continue;
        B->snew[0][u] ^= (uint8_t)(1 + (seed >> 32) % 255);
        B->ranges[0][B->nranges[0]++] = (refit_digest_range_t){0, u, 2};
    }
    for (uint64_t off = 0; off + 4096 <= n; off += 100 * 4096) {
        for (uint64_t b = 0; b < 4096; b++) B->snew[1][off + b] = (uint8_t)(B->snew[1][off + b] * 7 + 1);
        B->ranges[1][B->nranges[1]++] = (refit_digest_range_t){0, off, 4096};
    }
    uint64_t tb = REFIT_MAX(refit_digest_table_bytes(B->sm), 64);
    uint8_t *want = xalloc(tb);
    for (int x = 0; x < 2; x++) {
        const void *ob = B->sarena, *nb = B->snew[x];
        CHECK(refit_digest_table_fill(B->kauto, B->sm, &ob, B->table, 1));
        CHECK(refit_digest_table_update(B->kauto, B->sm, &nb, &ob, B->ranges[x], B->nranges[x], B->table));
        CHECK(refit_digest_table_fill(B->kauto, B->sm, &nb, want, 1));
        if (memcmp(want, B->table, refit_digest_table_bytes(B->sm))) {
            fprintf(stderr, "table_update (%s) differs from a fill of the new memory\n", x ? "runs" : "sparse");
            exit(1);
        }
    }
    free(want);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    rounds = REFIT_MAX(1, REFIT_MIN(rounds, MAX_ROUNDS));
    char host[512];
    host_json(host, sizeof(host));
    refit_model_t *model;
    CHECK(refit_model_builtin("qwen3-30b-a3b-mini", &model));
    uint8_t raw[32];
    for (int i = 0; i < 32; i++) raw[i] = (uint8_t)(i * 37 + 1);
    static const refit_digest_impl_t impls[NKERNELS] = {REFIT_DIGEST_IMPL_SCALAR, REFIT_DIGEST_IMPL_AVX2,
                                                        REFIT_DIGEST_IMPL_AVX512};
    rx_t rx = {0};
    for (int i = 0; i < NKERNELS; i++)
        if (refit_digest_key_create_impl(raw, impls[i], &rx.keys[i])) rx.keys[i] = NULL;
    refit_manifest_t *dm = manifest(model, "vllm:tp=2", 0), *sm = manifest(model, "megatron:ep=8", 0);
    rx.m = dm;
    rx.region = refit_manifest_region_size(dm, 0);
    rx.src = arena_of(dm);
    rx.dst = xalloc(rx.region);
    memset(rx.dst, 0, rx.region);
    rx.sums = calloc(dm->placements.len, sizeof(*rx.sums));
    if (!rx.sums) return 1;
    runs_of(rx.keys[0], &rx);
    validate(&rx);

    bench_t *B = calloc(1, sizeof(*B));
    if (!B) return 1;
    B->rx = &rx;
    B->sm = sm;
    B->sregion = refit_manifest_region_size(sm, 0);
    B->sarena = arena_of(sm);
    B->scopy = xalloc(B->sregion);
    memset(B->scopy, 0, B->sregion);
    B->table = xalloc(REFIT_MAX(refit_digest_table_bytes(sm), 64));
    CHECK(refit_digest_key_create(raw, &B->kauto));
    setup_updates(B);
    for (int v = 0; v < V_COUNT; v++) B->on[v] = true;
    for (int i = 0; i < NKERNELS; i++) B->on[V_CTH0 + i] = B->on[V_FUSED0 + i] = B->on[V_PUB0 + i] = rx.keys[i] != NULL;
    for (int r = 0; r < rounds; r++)
        for (int x = 0; x < V_COUNT; x++) {
            int v = (x + r) % V_COUNT;
            if (B->on[v]) run_variant(B, v, r);
        }
    report(B, rounds, host, refit_digest_impl_name(refit_digest_key_impl(B->kauto)));
    for (int x = 0; x < 2; x++) {
        free(B->snew[x]);
        free(B->ranges[x]);
    }
    refit_digest_key_destroy(B->kauto);

    free(B->table);
    free(B->scopy);
    free(B->sarena);
    free(B);
    free(rx.runs);
    free(rx.sums);
    free(rx.dst);
    free(rx.src);
    for (int i = 0; i < NKERNELS; i++) refit_digest_key_destroy(rx.keys[i]);
    refit_manifest_destroy(sm);
    refit_manifest_destroy(dm);
    refit_model_destroy(model);
    return 0;
}
