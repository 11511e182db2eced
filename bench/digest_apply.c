/* bench_digest_apply: what a receiver's digest sums add to a sparse delta's writes, unit by unit or in batches.
 *
 * One receiver rank of qwen3-30b-a3b-mini (vLLM TP2, rank 0: 562 MB in one region) in memory, its sums from
 * refit_digest_local.  Per round, 1% of its units change: ascending offsets 1 to 199 units apart, new values at
 * random.  They are written in batches of 32, the lines of the batch after next asked for first (as the delta's
 * apply asks 32 changes ahead), by three arms, interleaved (the order rotates per round):
 *   per_unit  refit_digest_map_update for each unit (the apply before 2026-12-08);
 *   batched   refit_digest_map_update_units for the batch (the apply now: the units' sums computed together, 16 a
 *             vector with the AVX-512 kernel);
 *   plain     the writes alone (digests off).
 * After every round of a digest arm its sums must equal refit_digest_local of the memory, else the run fails.
 * One thread.
 * Reported: ns per changed unit, median and range over rounds.
 *
 * Usage: bench_digest_apply [ROUNDS]   (default 7; JSON on stdout) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "data/digest.h"
#include "layout/manifest.h"
#include "refit/layout.h"

enum { PER_UNIT, BATCHED, PLAIN, NARMS, MAX_ROUNDS = 31, BATCH = 32 };
static const char *arm_name[NARMS] = {"per_unit", "batched", "plain"};

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t g_rng = 0x2545f4914f6cdd1dULL;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    if (rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "bench_digest_apply: ROUNDS must be 1..%d\n", MAX_ROUNDS);
        return 2;
    }
    refit_manifest_t *m;
    if (refit_manifest_for_rank("qwen3-30b-a3b-mini", "vllm:tp=2", 0, &m)) {
        fprintf(stderr, "bench_digest_apply: %s\n", refit_last_error());
        return 1;
    }
    uint64_t size = refit_manifest_region_size(m, 0), cap = size / 200;
    uint32_t np = refit_manifest_num_placements(m);
    uint8_t *mem = malloc(size);
    uint64_t *offs = malloc(cap * sizeof(uint64_t));
    uint16_t *vals = malloc(cap * sizeof(uint16_t));
    refit_dsum_t *acc = calloc(np, sizeof(*acc)), *want = calloc(np, sizeof(*want));
    if (!mem || !offs || !vals || !acc || !want) return 1;
    for (uint64_t i = 0; i + 8 <= size; i += 8) {
        uint64_t v = rnd();
        memcpy(mem + i, &v, 8);
    }
    unsigned char seed[32] = {3};
    refit_digest_key_t *k;
    refit_digest_map_t *map;
    const void *base = mem;
    if (refit_digest_key_create(seed, &k) || refit_digest_map_create(k, m, &map) ||
        refit_digest_local(k, m, &base, acc, 1))
        return 1;
    static double ns[NARMS][MAX_ROUNDS];
    uint64_t n = 0;
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < NARMS; i++) {
            int a = (r + i) % NARMS;
            uint64_t o = 0;
            for (n = 0; n < cap; n++) {
                o += 2 * (1 + rnd() % 199);
                if (o + 2 > size) break;
                offs[n] = o;
                vals[n] = (uint16_t)rnd();
            }
            refit_digest_cursor_t cur = {0};
            double t0 = now_ns();
            for (uint64_t x = 0; x < n; x += BATCH) {
                uint32_t cnt = n - x < BATCH ? (uint32_t)(n - x) : BATCH;
                for (uint64_t y = x + 2 * BATCH; y < x + 3 * BATCH && y < n; y++) __builtin_prefetch(mem + offs[y], 1);
                if (a == PER_UNIT)
                    for (uint32_t y = 0; y < cnt; y++)
                        refit_digest_map_update(map, &cur, 0, offs[x + y], mem + offs[x + y], &vals[x + y], 2, acc);
                else if (a == BATCHED) refit_digest_map_update_units(map, &cur, 0, mem, offs + x, vals + x, cnt, acc);
                else
                    for (uint32_t y = 0; y < cnt; y++) memcpy(mem + offs[x + y], &vals[x + y], 2);
            }
            refit_digest_cursor_flush(&cur);
            ns[a][r] = (now_ns() - t0) / (double)n;
            /* the sums kept through a digest arm's updates must be those of the memory; after the plain arm's
             * writes they are computed again */
            if (refit_digest_local(k, m, &base, want, 1)) return 1;
            if (a != PLAIN && memcmp(acc, want, np * sizeof(*acc))) {
                fprintf(stderr,
                        "bench_digest_apply: %s, round %d: the sums kept through the updates differ from "
                        "refit_digest_local\n",
                        arm_name[a], r);
                return 1;
            }
            memcpy(acc, want, np * sizeof(*acc));
        }
    printf(
        "{\n  \"bench\": \"digest_apply\", \"model\": \"qwen3-30b-a3b-mini\", \"layout\": \"vllm:tp=2\", \"rank\": 0, "
        "\"bytes\": %llu, \"changed_units\": %llu, \"rounds\": %d, \"threads\": 1, \"kernel\": \"%s\"",
        (unsigned long long)size, (unsigned long long)n, rounds, refit_digest_impl_name(refit_digest_key_impl(k)));
    for (int a = 0; a < NARMS; a++) {
        qsort(ns[a], (size_t)rounds, sizeof(double), cmp_double);
        printf(",\n  \"%s_ns_per_unit\": {\"median\": %.2f, \"min\": %.2f, \"max\": %.2f}", arm_name[a],
               ns[a][rounds / 2], ns[a][0], ns[a][rounds - 1]);
    }
    printf("\n}\n");
    refit_digest_map_destroy(map);
    refit_digest_key_destroy(k);
    refit_manifest_destroy(m);
    free(mem);
    free(offs);
    free(vals);
    free(acc);
    free(want);
    return 0;
}
