/* bench_digest_pub_rows: the publisher's table kernel by row length, against a memcpy of as many bytes.
 *
 * For each row length n (units), 256 MiB of rows of n units (one tensor of rows, from memory) go through
 * digest_pub_rows_any in work items of 512 KiB, as refit_digest_table_fill cuts them, with: the AVX-512 pairs
 * kernel, the AVX-512 four-row kernel (digest_pub_rows4_min_units moved to force either), and the AVX2 pairs.
 * Interleaved rounds (the arms' order rotates each round); per arm the median time / the memcpy's median.  One
 * thread.  This is what set digest_pub_rows4_min_units (docs/digest.md, "The publisher's table").  Row lengths
 * from 192 units: the unit tests check the four-row kernel from 160 (tests/unit/test_digest_kernels.c).
 *
 * Usage: bench_digest_pub_rows [ROUNDS]   (default 5; JSON on stdout) */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "data/digest.h"
#include "data/digest_internal.h"

enum { A_MEMCPY, A_PAIRS512, A_ROWS4, A_PAIRS_AVX2, NARMS, MAX_ROUNDS = 31 };
static const char *arm_name[NARMS] = {"memcpy", "avx512_pairs", "avx512_rows4", "avx2_pairs"};

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static double median(double *x, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (x[j] < x[i]) {
                double t = x[i];
                x[i] = x[j];
                x[j] = t;
            }
    return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    rounds = rounds < 1 ? 1 : rounds > MAX_ROUNDS ? MAX_ROUNDS : rounds;
    const size_t bytes = (size_t)256 << 20;
    uint8_t *src = aligned_alloc(4096, bytes), *dst = aligned_alloc(4096, bytes);
    if (!src || !dst) return 1;
    for (size_t i = 0; i < bytes; i++) src[i] = (uint8_t)(i * 131 + 7);
    memset(dst, 0, bytes);
    uint8_t raw[32];
    for (int i = 0; i < 32; i++) raw[i] = (uint8_t)(i * 37 + 1);
    refit_digest_key_t *k2 = NULL, *k5 = NULL;
    if (refit_digest_key_create_impl(raw, REFIT_DIGEST_IMPL_AVX2, &k2)) k2 = NULL;
    if (refit_digest_key_create_impl(raw, REFIT_DIGEST_IMPL_AVX512, &k5)) k5 = NULL;
    const uint64_t ns[] = {192, 256, 512, 1024, 1280, 1536, 1792, 2048, 3072, 4096, 8192};
    const uint64_t dflt = digest_pub_rows4_min_units;
    printf("{\n  \"bench\": \"digest_pub_rows\", \"bytes\": %zu, \"rounds\": %d, \"rows4_min_units\": %" PRIu64
           ",\n  \"rows\": [\n",
           bytes, rounds, dflt);
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        uint64_t n = ns[a], nrows = bytes / (2 * n), per = ((uint64_t)512 << 10) / (2 * n);
        if (!per) per = 1;
        uint32_t *P = malloc((nrows + 2) * 8), *g = malloc(n * 8);
        size_t sb = k5 ? digest_pub_scratch_bytes(k5, n) : 0;
        void *scratch = sb ? aligned_alloc(64, (sb + 63) / 64 * 64) : NULL;
        if (!P || !g || (sb && !scratch)) return 1;
        double t[NARMS][MAX_ROUNDS];
        bool on[NARMS] = {true, k5 != NULL, k5 != NULL, k2 != NULL};
        for (int r = 0; r < rounds; r++)
            for (int x = 0; x < NARMS; x++) {
                int v = (x + r) % NARMS;
                if (!on[v]) continue;
                double t0 = now_ms();
                if (v == A_MEMCPY) {
                    memcpy(dst, src, bytes);
                } else {
                    const refit_digest_key_t *k = v == A_PAIRS_AVX2 ? k2 : k5;
                    digest_pub_rows4_min_units = v == A_ROWS4 ? 1 : UINT64_MAX;
                    for (uint64_t r0 = 0; r0 < nrows; r0 += per)
                        digest_pub_rows_any(k, 1, r0, nrows - r0 < per ? nrows - r0 : per, 0, src + r0 * 2 * n, 2 * n,
                                            n, P + 2 * (r0 + 1), g, scratch);
                }
                t[v][r] = now_ms() - t0;
            }
        digest_pub_rows4_min_units = dflt;
        double base = median(t[A_MEMCPY], rounds);
        printf("    {\"units\": %" PRIu64 ", \"memcpy_ms\": %.2f", n, base);
        for (int v = 1; v < NARMS; v++)
            if (on[v]) printf(", \"%s\": %.3f", arm_name[v], median(t[v], rounds) / base);
        printf("}%s\n", a + 1 < sizeof ns / sizeof ns[0] ? "," : "");
        free(P);
        free(g);
        free(scratch);
    }
    printf("  ]\n}\n");
    refit_digest_key_destroy(k2);
    refit_digest_key_destroy(k5);
    free(src);
    free(dst);
    return 0;
}
