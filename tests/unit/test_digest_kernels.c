/* The digest's kernels (src/data/digest_kernel.c, digest_avx512.c): scalar, AVX2 and AVX-512 give identical
 * dots, row sums and fused copy+hash sums, and the fused copy writes exactly the bytes memcpy would (and
 * nothing around them), on random and adversarial shapes: n = 0 and 1, odd tails, unaligned (odd) source and
 * destination addresses, rows crossing the 65,536-unit key blocks, first_unit past 0, large and odd strides,
 * the int16 extremes, calls large enough for streaming stores (aligned, unaligned and odd destinations); a row cut into pieces copied by different kernels adds up to the whole.  Kernels the
 * CPU lacks are skipped (printed); the scalar one is also checked against a naive sum. */
#include "testutil.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/digest.h"
#include "data/digest_internal.h"
#include "rows4_fixture.h"
#include "util/util.h"

static const refit_digest_impl_t g_impls[] = {REFIT_DIGEST_IMPL_SCALAR, REFIT_DIGEST_IMPL_AVX2,
                                              REFIT_DIGEST_IMPL_AVX512};
enum { NIMPL = 3 };

/* keys[i] for g_impls[i], NULL where the CPU lacks it (keys[0], scalar, always exists). */
static void keys_all(uint8_t seed, refit_digest_key_t *keys[NIMPL])
{
    uint8_t raw[32];
    for (int i = 0; i < 32; i++) raw[i] = (uint8_t)(seed * 29 + i * 5);
    for (int i = 0; i < NIMPL; i++) {
        keys[i] = NULL;
        refit_status_t st = refit_digest_key_create_impl(raw, g_impls[i], &keys[i]);
        if (st == REFIT_ERR_UNSUPPORTED) {
            print_message("kernel %s: not on this CPU, skipped\n", refit_digest_impl_name(g_impls[i]));
            continue;
        }
        REFIT_ASSERT_OK(st);
        assert_int_equal(refit_digest_key_impl(keys[i]), g_impls[i]);
    }
    assert_non_null(keys[0]);
}

static void keys_free(refit_digest_key_t *keys[NIMPL])
{
    for (int i = 0; i < NIMPL; i++) refit_digest_key_destroy(keys[i]);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return refit_mix64(rng_state);
}

static bool dsum_eq(refit_dsum_t a, refit_dsum_t b) { return a.lane[0] == b.lane[0] && a.lane[1] == b.lane[1]; }

/* Fills p with units of one pattern: 0 random, 1 all -32768, 2 all +32767, 3 random extremes (-32768, -1,
 * 0, 32767), written byte by byte (any alignment). */
static void fill_units(uint8_t *p, size_t bytes, int pattern)
{
    static const uint16_t ext[4] = {0x8000, 0xffff, 0x0000, 0x7fff};
    for (size_t i = 0; i < bytes; i += 2) {
        uint16_t u = pattern == 0 ? (uint16_t)rnd() : pattern == 1 ? 0x8000 : pattern == 2 ? 0x7fff : ext[rnd() & 3];
        p[i] = (uint8_t)u;
        if (i + 1 < bytes) p[i + 1] = (uint8_t)(u >> 8);
    }
}

/* sum_t K[j+t] * v_t, K read back one unit at a time through the scalar key (the naive reference). */
static refit_dsum_t naive_dot(const refit_digest_key_t *k, const uint8_t *p, uint64_t j, uint64_t n)
{
    refit_dsum_t d = {{0, 0}};
    uint8_t one[2] = {1, 0};
    for (uint64_t t = 0; t < n; t++) {
        refit_dsum_t kk = refit_digest_dot(k, one, j + t, 1);
        uint32_t v = (uint32_t)(int32_t)(int16_t)(uint16_t)(p[2 * t] | p[2 * t + 1] << 8);
        d.lane[0] += kk.lane[0] * v;
        d.lane[1] += kk.lane[1] * v;
    }
    return d;
}

/* Dots and row sums: every kernel equals scalar for n 0..160 at misaligned addresses, starts at and around
 * the block boundaries, every pattern; scalar equals the naive sum on a sample. */
static void dots_agree(void **state)
{
    (void)state;
    refit_digest_key_t *keys[NIMPL];
    keys_all(1, keys);
    enum { N = 160 };
    uint8_t *buf = malloc(3 * (2 * N + 16));
    assert_non_null(buf);
    const uint64_t starts[] = {0, 1, 31, 32, 65536 - 160, 65536 - 33, 65536 - 1, 65536, 2 * 65536 + 17};
    for (int pattern = 0; pattern < 4; pattern++) {
        fill_units(buf, 3 * (2 * N + 16), pattern);
        for (size_t si = 0; si < REFIT_ARRAY_LEN(starts); si++)
            for (unsigned mis = 0; mis < 4; mis++)
                for (uint64_t n = 0; n <= N; n++) {
                    const uint8_t *p = buf + mis;
                    refit_dsum_t want = refit_digest_dot(keys[0], p, starts[si], n), wr = {{7, 9}};
                    refit_digest_rows(keys[0], 42, 5, 3, starts[si], p, 2 * n + 8 + mis, n, &wr);
                    if (n % 23 == 0 || n < 5) assert_true(dsum_eq(want, naive_dot(keys[0], p, starts[si], n)));
                    for (int i = 1; i < NIMPL; i++) {
                        if (!keys[i]) continue;
                        refit_dsum_t got = refit_digest_dot(keys[i], p, starts[si], n), gr = {{7, 9}};
                        refit_digest_rows(keys[i], 42, 5, 3, starts[si], p, 2 * n + 8 + mis, n, &gr);
                        if (!dsum_eq(want, got) || !dsum_eq(wr, gr))
                            fail_msg("%s: pattern %d start %" PRIu64 " misalign %u n %" PRIu64
                                     ": dot %08x%08x vs scalar %08x%08x, rows %08x%08x vs %08x%08x",
                                     refit_digest_impl_name(g_impls[i]), pattern, starts[si], mis, n, got.lane[0],
                                     got.lane[1], want.lane[0], want.lane[1], gr.lane[0], gr.lane[1], wr.lane[0],
                                     wr.lane[1]);
                    }
                }
    }
    free(buf);
    keys_free(keys);
}

/* One copy_rows case: src and dst buffers with guard bytes around and between rows; every kernel's copy
 * equals memcpy's bytes (guards untouched) and its sum equals scalar refit_digest_rows over the copy, added
 * onto a non-zero acc. */
typedef struct {
    uint64_t nrows, n, first, spad, dpad;
    unsigned smis, dmis;
    int pattern;
} shape_t;

static void copy_case(refit_digest_key_t *keys[NIMPL], const shape_t *c)
{
    uint64_t sstride = 2 * c->n + c->spad, dstride = 2 * c->n + c->dpad;
    size_t sbytes = c->nrows * sstride + c->smis + 64, dbytes = c->nrows * dstride + c->dmis + 64;
    uint8_t *src = malloc(sbytes), *ref = malloc(dbytes), *dst = malloc(dbytes);
    assert_true(src && ref && dst);
    fill_units(src, sbytes, c->pattern);
    memset(ref, 0xa5, dbytes);
    for (uint64_t i = 0; i < c->nrows; i++) memcpy(ref + c->dmis + i * dstride, src + c->smis + i * sstride, 2 * c->n);
    refit_dsum_t want = {{0x12345678u, 0x9abcdef0u}};
    refit_digest_rows(keys[0], 77, 1000, c->nrows, c->first, ref + c->dmis, dstride, c->n, &want);
    for (int i = 0; i < NIMPL; i++) {
        if (!keys[i]) continue;
        memset(dst, 0xa5, dbytes);
        refit_dsum_t got = {{0x12345678u, 0x9abcdef0u}};
        refit_digest_copy_rows(keys[i], 77, 1000, c->nrows, c->first, dst + c->dmis, dstride, src + c->smis, sstride,
                               c->n, &got);
        if (memcmp(dst, ref, dbytes) != 0 || !dsum_eq(got, want))
            fail_msg("%s: nrows %" PRIu64 " n %" PRIu64 " first %" PRIu64 " spad %" PRIu64 " dpad %" PRIu64
                     " smis %u dmis %u pattern %d: %s, sum %08x%08x want %08x%08x",
                     refit_digest_impl_name(g_impls[i]), c->nrows, c->n, c->first, c->spad, c->dpad, c->smis, c->dmis,
                     c->pattern, memcmp(dst, ref, dbytes) ? "bytes differ from memcpy" : "bytes equal", got.lane[0],
                     got.lane[1], want.lane[0], want.lane[1]);
    }
    free(src);
    free(ref);
    free(dst);
}

/* Adversarial shapes on a grid, then random ones. */
static void copy_rows_agree(void **state)
{
    (void)state;
    refit_digest_key_t *keys[NIMPL];
    keys_all(2, keys);
    const uint64_t ns[] = {0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129, 1000, 4097};
    const uint64_t firsts[] = {0, 1, 65536 - 40, 65536, 3 * 65536 + 7};
    const uint64_t pads[] = {0, 1, 3, 64};
    int pattern = 0;
    for (size_t ni = 0; ni < REFIT_ARRAY_LEN(ns); ni++)
        for (size_t fi = 0; fi < REFIT_ARRAY_LEN(firsts); fi++)
            for (size_t pi = 0; pi < REFIT_ARRAY_LEN(pads); pi++)
                for (unsigned mis = 0; mis < 4; mis++) {
                    shape_t c = {3,   ns[ni],        firsts[fi],   pads[pi], pads[(pi + mis) % 4],
                                 mis, (mis * 3) % 4, pattern++ % 4};
                    copy_case(keys, &c);
                }
    /* Rows across one or two block boundaries, a large stride, nrows 0 and 1. */
    const shape_t big[] = {
        {2, 65536, 0, 0, 0, 1, 0, 0},
        {2, 65537, 0, 2, 1, 0, 1, 3},
        {1, 140000, 1000, 0, 0, 3, 2, 0},
        {2, 70001, 65536 - 3, 5, 7, 1, 1, 1},
        {3, 100, 12, 1u << 20, (1u << 20) + 1, 2, 3, 0},
        {0, 100, 0, 0, 0, 0, 0, 0},
        {1, 2 * 65536 + 50, 65536 - 17, 0, 0, 0, 3, 2},
        /* Calls of at least 256 KiB stream their stores: dst unaligned but even (a head first), odd (plain
         * stores), aligned; many rows of 1000 units each with its own head; rows too short to stream. */
        {4, 40000, 7, 2, 6, 0, 2, 0},
        {4, 40001, 65536 - 100, 0, 1, 1, 1, 3},
        {3, 70001, 65536 - 3, 64, 64, 3, 0, 1},
        {300, 1000, 5, 0, 0, 0, 4, 2},
        {300, 1001, 65536 - 500, 3, 2, 1, 2, 0},
        {700, 250, 0, 0, 2, 0, 2, 3},
    };
    for (size_t i = 0; i < REFIT_ARRAY_LEN(big); i++) copy_case(keys, &big[i]);
    for (int r = 0; r < 300; r++) {
        shape_t c = {rnd() % 6,
                     rnd() % 700,
                     rnd() % 4 ? rnd() % 1000 : rnd() % (4 * 65536),
                     rnd() % 130,
                     rnd() % 130,
                     (unsigned)(rnd() % 8),
                     (unsigned)(rnd() % 8),
                     (int)(rnd() % 4)};
        copy_case(keys, &c);
    }
    keys_free(keys);
}

/* The plan cuts rows into pieces across sources and regions: a box of rows cut at random columns (at and
 * around a block boundary too), each piece copied by a kernel chosen at random, adds up to D(box) and
 * leaves the box copied. */
static void pieces_add_up(void **state)
{
    (void)state;
    refit_digest_key_t *keys[NIMPL];
    keys_all(3, keys);
    enum { R = 4, U = 65536 + 300, FIRST = 200 };
    uint8_t *src = malloc(2 * R * U), *dst = calloc(2 * R, U);
    assert_true(src && dst);
    fill_units(src, 2 * R * U, 0);
    refit_dsum_t whole = {{0, 0}};
    refit_digest_rows(keys[0], 9, 40, R, FIRST, src, 2 * U, U, &whole);
    for (int trial = 0; trial < 20; trial++) {
        memset(dst, 0, 2 * R * U);
        refit_dsum_t sum = {{0, 0}};
        for (uint64_t i = 0; i < R; i++) {
            uint64_t bound = 65536 - FIRST, cuts[] = {bound - 1 - trial % 3, bound + trial % 2, rnd() % U, U};
            for (uint64_t c = 0, q = 0; q < 4; q++) {
                uint64_t e = REFIT_MIN(REFIT_MAX(cuts[q], c), U);
                refit_digest_key_t *k = NULL;
                while (!k) k = keys[rnd() % NIMPL];
                refit_digest_copy_rows(k, 9, 40 + i, 1, FIRST + c, dst + 2 * (i * U + c), 0, src + 2 * (i * U + c), 0,
                                       e - c, &sum);
                c = e;
            }
        }
        assert_true(dsum_eq(sum, whole));
        assert_memory_equal(dst, src, 2 * R * U);
    }
    free(src);
    free(dst);
    keys_free(keys);
}

/* One shape of the publisher's rows: P (row terms) and g (column sums) of every kernel equal the reference
 * computed unit by unit from refit_digest_row_key and refit_digest_dot. */
static void pub_case(refit_digest_key_t *keys[NIMPL], uint64_t nrows, uint64_t n, uint64_t j, uint64_t pad,
                     unsigned mis, int pattern)
{
    uint64_t stride = 2 * n + pad, tid = 0x5eed + n, row = 7 * n + 3;
    size_t bytes = nrows * stride + mis + 64;
    uint8_t *mem = malloc(bytes), *p = mem + mis;
    uint32_t *want_p = calloc(2 * nrows + 1, 4), *want_g = calloc(2 * n + 1, 4), *got_p = malloc(8 * nrows + 4),
             *got_g = malloc(8 * n + 4);
    assert_true(mem && want_p && want_g && got_p && got_g);
    fill_units(mem, bytes, pattern);
    for (uint64_t i = 0; i < nrows; i++) {
        const uint8_t *ri = p + i * stride;
        refit_dsum_t r = refit_digest_row_key(keys[0], tid, row + i), d = refit_digest_dot(keys[0], ri, j, n);
        for (int l = 0; l < 2; l++) {
            want_p[2 * i + l] = r.lane[l] * d.lane[l];
            for (uint64_t t = 0; t < n; t++)
                want_g[l * n + t] += r.lane[l] * (uint32_t)(int32_t)(int16_t)(uint16_t)(ri[2 * t] | ri[2 * t + 1] << 8);
        }
    }
    for (int x = 0; x < NIMPL; x++) {
        if (!keys[x]) continue;
        size_t sb = digest_pub_scratch_bytes(keys[x], n);
        void *scratch = sb ? aligned_alloc(64, (sb + 63) / 64 * 64) : NULL;
        assert_true(!sb || scratch);
        memset(got_p, 0xa5, 8 * nrows + 4);
        memset(got_g, 0xa5, 8 * n + 4);
        digest_pub_rows_any(keys[x], tid, row, nrows, j, p, stride, n, got_p, got_g, scratch);
        if (memcmp(got_p, want_p, 8 * nrows) || memcmp(got_g, want_g, 8 * n))
            fail_msg("publisher rows, %s: nrows %" PRIu64 " n %" PRIu64 " j %" PRIu64 " pad %" PRIu64
                     " mis %u pattern %d: %s differ",
                     refit_digest_impl_name(g_impls[x]), nrows, n, j, pad, mis, pattern,
                     memcmp(got_p, want_p, 8 * nrows) ? "row terms" : "column sums");
        /* Nothing written past the row terms and the column sums. */
        assert_int_equal(got_p[2 * nrows], 0xa5a5a5a5u);
        assert_int_equal(got_g[2 * n], 0xa5a5a5a5u);
        free(scratch);
    }
    free(mem);
    free(want_p);
    free(want_g);
    free(got_p);
    free(got_g);
}

static void publisher_rows_shapes(void)
{
    refit_digest_key_t *keys[NIMPL];
    keys_all(4, keys);
    const uint64_t rows[] = {1, 2, 3, 4, 5, 6, 7, 9, 14};
    const uint64_t ns[] = {1,  2,   15,  16,  17,  31,  32,  33,  48,  63,  64, 65,
                           96, 159, 160, 161, 175, 191, 193, 207, 255, 256, 257};
    const uint64_t js[] = {0, 3, 65536 - 40, 2 * 65536 + 5};
    int pattern = 0;
    for (size_t ri = 0; ri < REFIT_ARRAY_LEN(rows); ri++)
        for (size_t ni = 0; ni < REFIT_ARRAY_LEN(ns); ni++)
            for (size_t ji = 0; ji < REFIT_ARRAY_LEN(js); ji++, pattern++)
                pub_case(keys, rows[ri], ns[ni], js[ji], (uint64_t)(pattern % 3) * 6, (unsigned)(pattern % 5),
                         pattern % 4);
    pub_case(keys, 3, 65536, 0, 0, 0, 0);
    pub_case(keys, 5, 70001, 65536 - 3, 2, 1, 3);
    pub_case(keys, 600, 100, 0, 0, 2, 0);
    /* around the default threshold (1792 units) */
    pub_case(keys, 6, 1791, 0, 0, 1, 1);
    pub_case(keys, 5, 1792, 3, 6, 0, 2);
    pub_case(keys, 7, 1793, 0, 2, 3, 3);
    pub_case(keys, 9, 2100, 65536 - 1000, 0, 0, 0);
    for (int r = 0; r < 200; r++)
        pub_case(keys, 1 + rnd() % 12, 1 + rnd() % 600, rnd() % 4 ? rnd() % 100 : rnd() % (3 * 65536), rnd() % 70,
                 (unsigned)(rnd() % 8), (int)(rnd() % 4));
    keys_free(keys);
}

/* The publisher's row kernel (rows four at a time with AVX-512 from digest_pub_rows4_min_units, in pairs otherwise):
 * groups of 1 to 4 rows left over, tails of 1 to 31 units, odd and unaligned addresses, padded strides, the int16
 * extremes, rows starting in later key blocks and rows crossing a block boundary (taken pair by pair).  Two
 * passes: with the threshold at 160 units, so that the four-row kernel meets the short rows and their tails, and
 * at its default (the fixed shapes are the same in both; the random ones differ). */
static void publisher_rows_agree(void **state)
{
    (void)state;
    for (int pass = 0; pass < 2; pass++) {
        digest_pub_rows4_min_units = pass == 0 ? 160 : rows4_default;
        publisher_rows_shapes();
    }
}

/* Forcing a kernel: AUTO resolves to one of the three; names; an unknown kernel is refused. */
static void impl_choice(void **state)
{
    (void)state;
    uint8_t raw[32] = {1};
    refit_digest_key_t *k = NULL;
    REFIT_ASSERT_OK(refit_digest_key_create_impl(raw, REFIT_DIGEST_IMPL_AUTO, &k));
    refit_digest_impl_t got = refit_digest_key_impl(k);
    assert_true(got == REFIT_DIGEST_IMPL_SCALAR || got == REFIT_DIGEST_IMPL_AVX2 || got == REFIT_DIGEST_IMPL_AVX512);
    print_message("AUTO kernel here: %s\n", refit_digest_impl_name(got));
    refit_digest_key_destroy(k);
    assert_string_equal(refit_digest_impl_name(REFIT_DIGEST_IMPL_AVX512), "avx512");
    assert_string_equal(refit_digest_impl_name(REFIT_DIGEST_IMPL_SCALAR), "scalar");
    REFIT_ASSERT_ERR(refit_digest_key_create_impl(raw, (refit_digest_impl_t)4, &k), REFIT_ERR_INVALID_ARG,
                     "unknown kernel");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dots_agree),
        cmocka_unit_test(copy_rows_agree),
        cmocka_unit_test(pieces_add_up),
        cmocka_unit_test_setup_teardown(publisher_rows_agree, rows4_keep, rows4_restore),
        cmocka_unit_test(impl_choice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
