/* bench_digest_notes: what a delta publisher's table costs when it comes from the changed units, by share changed.
 *
 * One publisher rank of qwen3-30b-a3b-mini (Megatron EP2, rank 0: 637 MB in one region) in memory.  Per round and
 * share F: F of the 2-byte units change (spread at random), then the changed units of each 128 KiB chunk are
 * found by comparing the two versions, as the delta encoder finds them, and given to
 * refit_digest_changes_note_units right after (the chunk still in cache, as in the encoder's pass); the notes
 * alone are timed.  Then refit_digest_changes_apply (timed), a refit_digest_table_fill of the new memory (timed,
 * and compared with the applied table: they must be equal, else the run fails) and a memcpy of the region
 * (timed).  The arms are the key's kernels: the AVX-512 one (its notes 16 units a vector where the CPU has
 * AVX-512 DQ) and the scalar one (the notes unit by unit); they alternate per round.  One thread.  Reported per
 * share and arm, medians over rounds: ns per changed unit in the notes, the apply, (notes + apply) / memcpy, and
 * a fill / memcpy.  This set DIGEST_CHANGES_MAX_PERMILLE (src/engine/publisher.c; docs/digest.md, "The
 * publisher's table").
 *
 * Usage: bench_digest_notes [ROUNDS] [F...]   (defaults: 5; 0.002 0.01 0.02 0.04; JSON on stdout) */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "data/digest.h"
#include "data/digest_internal.h"
#include "layout/manifest.h"
#include "refit/layout.h"

enum { MAX_ROUNDS = 31, MAX_SHARES = 8, CHUNK_UNITS = 65536 };
static const refit_digest_impl_t arm_impl[2] = {REFIT_DIGEST_IMPL_AVX512, REFIT_DIGEST_IMPL_SCALAR};
static const char *arm_name[2] = {"avx512", "scalar"};

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *x, int n)
{
    double s[MAX_ROUNDS];
    memcpy(s, x, (size_t)n * sizeof(double));
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    double share[MAX_SHARES] = {0.002, 0.01, 0.02, 0.04};
    int nshare = 4;
    if (argc > 2) {
        nshare = 0;
        for (int i = 2; i < argc && nshare < MAX_SHARES; i++) share[nshare++] = atof(argv[i]);
    }
    for (int f = 0; f < nshare; f++)
        if (!(share[f] > 0 && share[f] < 1)) {
            fprintf(stderr, "bench_digest_notes: a share must be in (0, 1)\n");
            return 2;
        }
    if (rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "bench_digest_notes: ROUNDS must be 1..%d\n", MAX_ROUNDS);
        return 2;
    }
    refit_manifest_t *m;
    if (refit_manifest_for_rank("qwen3-30b-a3b-mini", "megatron:ep=2", 0, &m)) {
        fprintf(stderr, "bench_digest_notes: %s\n", refit_last_error());
        return 1;
    }
    uint64_t size = refit_manifest_region_size(m, 0), units = size / 2;
    size_t tb = (refit_digest_table_bytes(m) + 63) & ~(size_t)63;
    uint16_t *now = malloc(size), *before = malloc(size), *copy = malloc(size), *list = malloc(CHUNK_UNITS * 2);
    void *table = aligned_alloc(64, tb), *fill = aligned_alloc(64, tb);
    if (!now || !before || !copy || !list || !table || !fill) return 1;
    for (uint64_t u = 0; u < units; u++) now[u] = (uint16_t)rnd();
    memcpy(copy, now, size);
    unsigned char seed[32] = {7};
    refit_digest_key_t *k[2] = {NULL, NULL};
    bool on[2];
    for (int a = 0; a < 2; a++) on[a] = !refit_digest_key_create_impl(seed, arm_impl[a], &k[a]);
    static double ns_unit[MAX_SHARES][2][MAX_ROUNDS], notes_ms[MAX_SHARES][2][MAX_ROUNDS],
        apply_ms[MAX_SHARES][2][MAX_ROUNDS];
    static double fill_ms[MAX_SHARES][2][MAX_ROUNDS], memcpy_ms[MAX_SHARES][2][MAX_ROUNDS];
    static uint64_t changed[MAX_SHARES];
    for (int r = 0; r < rounds; r++)
        for (int f = 0; f < nshare; f++)
            for (int i = 0; i < 2; i++) {
                int a = (r + i) % 2;
                if (!on[a]) continue;
                refit_digest_changes_t *C;
                const void *b = now;
                /* the table of the memory before, then F of its units change */
                if (refit_digest_table_fill(k[a], m, &b, table, 1) || refit_digest_changes_create(k[a], m, &C))
                    return 1;
                memcpy(before, now, size);
                uint64_t thr = (uint64_t)(share[f] * 18446744073709551615.0);
                for (uint64_t u = 0; u < units; u++)
                    if (rnd() < thr) now[u] = (uint16_t)(now[u] + 1 + rnd() % 65535);
                double notes = 0;
                uint64_t nu = 0;
                for (uint64_t c0 = 0; c0 < units; c0 += CHUNK_UNITS) {
                    uint32_t n = 0;
                    for (uint64_t u = c0; u < units && u < c0 + CHUNK_UNITS; u++)
                        if (now[u] != before[u]) list[n++] = (uint16_t)(u - c0);
                    if (!n) continue;
                    nu += n;
                    double t0 = now_ms();
                    if (!refit_digest_changes_note_units(C, 0, 0, 2 * c0, list, n, now, before)) return 1;
                    notes += now_ms() - t0;
                }
                double t0 = now_ms();
                if (refit_digest_changes_apply(C, table)) {
                    fprintf(stderr, "bench_digest_notes: %s\n", refit_last_error());
                    return 1;
                }
                double t1 = now_ms();
                if (refit_digest_table_fill(k[a], m, &b, fill, 1)) return 1;
                double t2 = now_ms();
                memcpy(copy, now, size);
                double t3 = now_ms();
                if (memcmp(table, fill, refit_digest_table_bytes(m))) {
                    fprintf(stderr, "bench_digest_notes: %s, share %g: the table from the changes is not the fill\n",
                            arm_name[a], share[f]);
                    return 1;
                }
                refit_digest_changes_destroy(C);
                changed[f] = nu;
                ns_unit[f][a][r] = notes * 1e6 / (double)(nu ? nu : 1);
                notes_ms[f][a][r] = notes;
                apply_ms[f][a][r] = t1 - t0;
                fill_ms[f][a][r] = t2 - t1;
                memcpy_ms[f][a][r] = t3 - t2;
            }
#if DIGEST_HAVE_AVX512
    bool vec = on[0] && digest_cpu_has_avx512dq();
#else
    bool vec = false;
#endif
    printf("{\n  \"bench\": \"digest_notes\", \"model\": \"qwen3-30b-a3b-mini\", \"layout\": \"megatron:ep=2\", "
           "\"rank\": 0, \"bytes\": %" PRIu64 ", \"rounds\": %d, \"threads\": 1, \"avx512_notes_vectorised\": %s,\n"
           "  \"shares\": [\n",
           size, rounds, vec ? "true" : "false");
    for (int f = 0; f < nshare; f++) {
        printf("    {\"share\": %g, \"changed_units\": %" PRIu64, share[f], changed[f]);
        for (int a = 0; a < 2; a++) {
            if (!on[a]) continue;
            double ratio[MAX_ROUNDS], fr[MAX_ROUNDS];
            for (int r = 0; r < rounds; r++) {
                ratio[r] = (notes_ms[f][a][r] + apply_ms[f][a][r]) / memcpy_ms[f][a][r];
                fr[r] = fill_ms[f][a][r] / memcpy_ms[f][a][r];
            }
            printf(",\n     \"%s\": {\"notes_ns_per_unit\": %.2f, \"apply_ms\": %.2f, \"fill_ms\": %.2f, "
                   "\"memcpy_ms\": %.2f, \"from_changes_vs_memcpy\": %.3f, \"fill_vs_memcpy\": %.3f}",
                   arm_name[a], median(ns_unit[f][a], rounds), median(apply_ms[f][a], rounds),
                   median(fill_ms[f][a], rounds), median(memcpy_ms[f][a], rounds), median(ratio, rounds),
                   median(fr, rounds));
        }
        printf("}%s\n", f + 1 < nshare ? "," : "");
    }
    printf("  ]\n}\n");
    for (int a = 0; a < 2; a++) refit_digest_key_destroy(k[a]);
    refit_manifest_destroy(m);
    free(now);
    free(before);
    free(copy);
    free(list);
    free(table);
    free(fill);
    return 0;
}
