/* Content digests (src/data/digest.h): the AVX2 kernel equals the scalar one
 * (AVX-512 and the fused copy: test_digest_kernels.c; every kernel's publisher
 * tables here)
 * and a naive reference bit for bit; digests add up over any split of a box;
 * publisher tables hold the prefix sums they claim; end to end over real
 * layout pairs (synthetic sources, real plans, real copies; FP8 arenas too)
 * every destination placement verifies, and a flipped byte, swapped rows, a stale source or a
 * wrong key fail naming the tensor, while padding is ignored; unusable
 * sources, overlapping, gapped, cut or odd-byte boxes are unverifiable, never
 * wrongly verified. */
#include "testutil.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/delta_hashed.h"
#include "data/digest.h"
#include "data/digest_internal.h"
#include "rows4_fixture.h"
#include "layout/manifest.h"
#include "tool_local.h"
#include "util/util.h"

/* ---------------------------------------------------------------- helpers */

static refit_digest_key_t *key_impl(uint8_t seed, refit_digest_impl_t impl)
{
    uint8_t raw[32];
    for (int i = 0; i < 32; i++) raw[i] = (uint8_t)(seed * 31 + i * 7);
    refit_digest_key_t *k = NULL;
    REFIT_ASSERT_OK(refit_digest_key_create_impl(raw, impl, &k));
    return k;
}
static refit_digest_key_t *key_of(uint8_t seed) { return key_impl(seed, REFIT_DIGEST_IMPL_AUTO); }

static bool have_impl(refit_digest_impl_t impl)
{
    uint8_t raw[32] = {0};
    refit_digest_key_t *k = NULL;
    refit_status_t st = refit_digest_key_create_impl(raw, impl, &k);
    refit_digest_key_destroy(k);
    return st == REFIT_OK;
}
static bool have_avx2(void) { return have_impl(REFIT_DIGEST_IMPL_AVX2); }

static uint64_t rng_state = 0x1234567;
static uint64_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return refit_mix64(rng_state);
}

/* K_l[j] recovered through the API: the dot of a single unit of value 1
 * (long_rows checks its structure, m_l(j >> 16) * k_l[j mod 65536]). */
static uint32_t kcol(const refit_digest_key_t *k, int lane, uint64_t j)
{
    uint8_t one[2] = {1, 0};
    return refit_digest_dot(k, one, j, 1).lane[lane];
}

/* sum_t K[j+t] * v_t mod 2^32, written independently of the library. */
static refit_dsum_t naive_dot(const refit_digest_key_t *k, const uint8_t *p, uint64_t j, uint64_t n)
{
    refit_dsum_t d = {{0, 0}};
    for (uint64_t t = 0; t < n; t++) {
        int16_t v;
        memcpy(&v, p + 2 * t, 2);
        for (int l = 0; l < 2; l++) d.lane[l] += kcol(k, l, j + t) * (uint32_t)(int32_t)v;
    }
    return d;
}

static bool dsum_eq(refit_dsum_t a, refit_dsum_t b) { return a.lane[0] == b.lane[0] && a.lane[1] == b.lane[1]; }

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* ------------------------------------------------------------- kernels */

static void key_properties(void **state)
{
    (void)state;
    refit_digest_key_t *a = key_of(1), *b = key_of(2);
    uint64_t ta = refit_digest_tensor_id(a, "model.embed_tokens.weight");
    assert_int_not_equal(ta, refit_digest_tensor_id(a, "lm_head.weight"));
    assert_int_not_equal(ta, refit_digest_tensor_id(b, "model.embed_tokens.weight"));
    unsigned same = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        refit_dsum_t r = refit_digest_row_key(a, ta, i);
        assert_true(r.lane[0] & 1);
        assert_true(r.lane[1] & 1);
        assert_int_not_equal(r.lane[0], r.lane[1]);
        assert_false(dsum_eq(r, refit_digest_row_key(a, ta, i + 1)));
        for (int l = 0; l < 2; l++) assert_true(kcol(a, l, i * 61) & 1);
        same += kcol(a, 0, i) == kcol(b, 0, i);
    }
    assert_true(same < 20); /* 16-bit keys of two keys agree by chance only */
    refit_digest_key_destroy(a);
    refit_digest_key_destroy(b);
}

/* AVX2 == scalar == naive for every length 0..200, misaligned addresses and
 * starts, across the 65536 key period, and on the int16 extremes where
 * madd's pair sum wraps. */
static void kernels_agree(void **state)
{
    (void)state;
    if (!have_avx2()) skip();
    refit_digest_key_t *ks = key_impl(3, REFIT_DIGEST_IMPL_SCALAR), *kv = key_impl(3, REFIT_DIGEST_IMPL_AVX2);
    assert_int_equal(refit_digest_key_impl(kv), REFIT_DIGEST_IMPL_AVX2);
    enum { N = 200 };
    uint8_t buf[2 * N + 64];
    const uint64_t starts[] = {0, 1, 7, 15, 16, 33, 1000, 65536 - 200, 65536 - 17, 65536 - 1, 65536, 3 * 65536 + 5};
    for (int pattern = 0; pattern < 4; pattern++) {
        for (size_t i = 0; i < sizeof(buf); i++) {
            uint8_t b = (uint8_t)rnd();
            if (pattern == 1) b = (i & 1) ? 0x80 : 0x00; /* -32768 everywhere */
            if (pattern == 2) b = (i & 1) ? 0x7f : 0xff; /* +32767 */
            if (pattern == 3) b = (uint8_t)((i & 1) ? (rnd() & 1 ? 0x80 : 0x7f) : (rnd() & 1 ? 0 : 0xff));
            buf[i] = b;
        }
        for (size_t si = 0; si < REFIT_ARRAY_LEN(starts); si++)
            for (unsigned mis = 0; mis < 3; mis++)
                for (uint64_t n = 0; n <= N; n++) {
                    const uint8_t *p = buf + mis;
                    refit_dsum_t a = refit_digest_dot(ks, p, starts[si], n), b = refit_digest_dot(kv, p, starts[si], n);
                    if (!dsum_eq(a, b))
                        fail_msg("pattern %d start %" PRIu64 " misalign %u n %" PRIu64
                                 ": scalar %08x%08x avx2 %08x%08x",
                                 pattern, starts[si], mis, n, a.lane[0], a.lane[1], b.lane[0], b.lane[1]);
                    if (n % 37 == 0 || n < 20 || pattern == 1) assert_true(dsum_eq(a, naive_dot(ks, p, starts[si], n)));
                }
    }
    /* -32768 times every key: madd's pairs reach 2^31 and wrap; the sum must
     * still be exact mod 2^32. */
    {
        enum { M = 4096 };
        uint8_t *big = xmalloc(2 * M);
        for (size_t i = 0; i < M; i++) big[2 * i] = 0x00, big[2 * i + 1] = 0x80;
        refit_dsum_t want = {{0, 0}};
        for (uint64_t j = 0; j < M; j++)
            for (int l = 0; l < 2; l++) want.lane[l] += kcol(ks, l, j) * (uint32_t)(int32_t)-32768;
        assert_true(dsum_eq(want, refit_digest_dot(kv, big, 0, M)));
        assert_true(dsum_eq(want, refit_digest_dot(ks, big, 0, M)));
        free(big);
    }
    /* Long rows across the key period, and rows of several rows (row keys
     * applied in vector lanes) against span-by-span sums. */
    {
        uint64_t n = 70000;
        uint8_t *row = xmalloc(2 * n * 3);
        for (size_t i = 0; i < 2 * n * 3; i++) row[i] = (uint8_t)rnd();
        for (uint64_t first = 0; first < 65536 * 2; first += 65536 - 3) {
            assert_true(dsum_eq(refit_digest_dot(ks, row, first, n), refit_digest_dot(kv, row, first, n)));
            refit_dsum_t a = {{0, 0}}, b = {{0, 0}}, c = {{0, 0}};
            refit_digest_rows(ks, 42, 9, 3, first, row, 2 * n, n, &a);
            refit_digest_rows(kv, 42, 9, 3, first, row, 2 * n, n, &b);
            for (uint64_t i = 0; i < 3; i++) {
                refit_dsum_t r = refit_digest_row_key(ks, 42, 9 + i),
                             d = refit_digest_dot(ks, row + 2 * n * i, first, n);
                c.lane[0] += r.lane[0] * d.lane[0];
                c.lane[1] += r.lane[1] * d.lane[1];
            }
            assert_true(dsum_eq(a, b));
            assert_true(dsum_eq(a, c));
        }
        free(row);
    }
    refit_digest_key_destroy(ks);
    refit_digest_key_destroy(kv);
}

/* D of a box equals the sum of D over any split of it into sub-boxes. */
static void additivity(void **state)
{
    (void)state;
    refit_digest_key_t *k = key_of(4);
    enum { R = 37, U = 150 };
    uint8_t *m = xmalloc(2 * R * U);
    for (size_t i = 0; i < 2 * R * U; i++) m[i] = (uint8_t)rnd();
    uint64_t tid = refit_digest_tensor_id(k, "t");
    refit_dsum_t whole = {{0, 0}};
    refit_digest_rows(k, tid, 0, R, 0, m, 2 * U, U, &whole);
    for (int trial = 0; trial < 200; trial++) {
        /* A guillotine split: cut rows at random, then each band's columns at random. */
        refit_dsum_t sum = {{0, 0}};
        uint64_t a = 0;
        while (a < R) {
            uint64_t b = a + 1 + rnd() % (R - a);
            uint64_t c = 0;
            while (c < U) {
                uint64_t d = c + 1 + rnd() % (U - c);
                if (trial % 2) {
                    refit_digest_rows(k, tid, a, b - a, c, m + 2 * (a * U + c), 2 * U, d - c, &sum);
                } else {
                    for (uint64_t i = a; i < b; i++) refit_digest_span(k, tid, i, c, m + 2 * (i * U + c), d - c, &sum);
                }
                c = d;
            }
            a = b;
        }
        assert_true(dsum_eq(sum, whole));
    }
    /* The same box at other rows or columns, or of another tensor, differs. */
    refit_dsum_t other = {{0, 0}}, shifted = {{0, 0}}, moved = {{0, 0}};
    refit_digest_rows(k, tid + 1, 0, R, 0, m, 2 * U, U, &other);
    refit_digest_rows(k, tid, 1, R, 0, m, 2 * U, U, &shifted);
    refit_digest_rows(k, tid, 0, R, 1, m, 2 * U, U, &moved);
    assert_false(dsum_eq(whole, other));
    assert_false(dsum_eq(whole, shifted));
    assert_false(dsum_eq(whole, moved));
    free(m);
    refit_digest_key_destroy(k);
}

/* Column keys do not repeat along a row (issue 28): unit j and unit j + 65536
 * used to share a key, so +d at one and -d at the other of the same row kept
 * both lanes for every key.  Now each 65,536-unit block b has its own odd
 * multiplier m_l(b) (1 for block 0): K[j] = m(j >> 16) * K[j mod 65536]; the
 * pair is caught for 200 of 200 random keys, by the receiver's box sums and
 * by the publisher's table alike; scalar and AVX2 agree on long rows,
 * segments that cross a block boundary and odd offsets; sums stay additive
 * over cuts at and around the boundaries. */
static uint32_t inv32(uint32_t a) /* inverse of odd a mod 2^32 (Newton) */
{
    uint32_t x = a;
    for (int i = 0; i < 5; i++) x *= 2 - a * x;
    return x;
}

static void long_rows(void **state)
{
    (void)state;
    enum { U = 65536 + 6000, KEYS = 200 };
    uint8_t *row = xmalloc(2 * U);
    unsigned caught[2] = {0, 0}, same_key_old = 0;
    for (int kn = 0; kn < KEYS; kn++) {
        uint8_t raw[32];
        for (int i = 0; i < 32; i++) raw[i] = (uint8_t)rnd();
        for (int impl = 0; impl < 2; impl++) {
            refit_digest_impl_t want = impl ? REFIT_DIGEST_IMPL_AVX2 : REFIT_DIGEST_IMPL_SCALAR;
            if (impl && !have_avx2()) continue;
            refit_digest_key_t *k = NULL;
            REFIT_ASSERT_OK(refit_digest_key_create_impl(raw, want, &k));
            for (size_t i = 0; i < 2 * U; i++) row[i] = (uint8_t)rnd();
            /* +d at unit j, -d at unit j + 65536, no int16 wrap. */
            uint64_t j = rnd() % (U - 65536), tid = rnd();
            int16_t a = (int16_t)((int)(rnd() % 32001) - 16000), b = (int16_t)((int)(rnd() % 32001) - 16000);
            int16_t d = (int16_t)(1 + rnd() % 16000);
            if (rnd() & 1) d = (int16_t)-d;
            memcpy(row + 2 * j, &a, 2);
            memcpy(row + 2 * (j + 65536), &b, 2);
            refit_dsum_t before = {{0, 0}}, after = {{0, 0}};
            refit_digest_rows(k, tid, 7, 1, 0, row, 0, U, &before);
            a = (int16_t)(a + d);
            b = (int16_t)(b - d);
            memcpy(row + 2 * j, &a, 2);
            memcpy(row + 2 * (j + 65536), &b, 2);
            refit_digest_rows(k, tid, 7, 1, 0, row, 0, U, &after);
            caught[impl] += before.lane[0] != after.lane[0] && before.lane[1] != after.lane[1];
            /* The keys' structure: one odd multiplier per block, 1 for block 0. */
            if (kn < 20) {
                for (int l = 0; l < 2; l++) {
                    uint32_t k0 = kcol(k, l, 0);
                    for (int t = 0; t < 50; t++) {
                        uint64_t x = rnd() % 65536, blk = 1 + rnd() % 1000;
                        uint32_t mb = kcol(k, l, blk << 16) * inv32(k0);
                        assert_true(mb & 1);
                        assert_int_equal(kcol(k, l, (blk << 16) + x), mb * kcol(k, l, x));
                        same_key_old += kcol(k, l, x) == kcol(k, l, x + 65536);
                        assert_true((uint32_t)(int32_t)(int16_t)kcol(k, l, x) == kcol(k, l, x));
                    }
                }
            }
            refit_digest_key_destroy(k);
        }
    }
    if (caught[0] != KEYS || (have_avx2() && caught[1] != KEYS) || same_key_old)
        fail_msg("+d at j, -d at j + 65536 caught for %u (scalar) and %u (avx2) of %d keys; K[j] == K[j + 65536] "
                 "%u times",
                 caught[0], caught[1], KEYS, same_key_old);
    free(row);

    /* Scalar == AVX2 == naive on long rows, across block boundaries, at odd
     * starts and odd addresses; additive over cuts at and near boundaries. */
    if (!have_avx2()) return;
    refit_digest_key_t *ks = key_impl(11, REFIT_DIGEST_IMPL_SCALAR), *kv = key_impl(11, REFIT_DIGEST_IMPL_AVX2);
    enum { N = 3 * 65536 + 100 };
    uint8_t *buf = xmalloc(2 * N + 3);
    for (size_t i = 0; i < 2 * N + 3; i++) buf[i] = (uint8_t)rnd();
    const uint64_t firsts[] = {0,         1,     12345, 65536 - 17,    65536 - 16,
                               65536 - 1, 65536, 65537, 2 * 65536 - 7, 5 * 65536 + 3};
    const uint64_t lens[] = {1, 15, 16, 17, 31, 33, 65535, 65536, 65537, 70001, 140000, 2 * 65536 + 50};
    for (size_t fi = 0; fi < REFIT_ARRAY_LEN(firsts); fi++)
        for (size_t li = 0; li < REFIT_ARRAY_LEN(lens); li++)
            for (unsigned mis = 0; mis < 2; mis++) {
                uint64_t first = firsts[fi], n = lens[li];
                const uint8_t *p = buf + mis;
                refit_dsum_t x = refit_digest_dot(ks, p, first, n), y = refit_digest_dot(kv, p, first, n);
                if (!dsum_eq(x, y))
                    fail_msg("first %" PRIu64 " n %" PRIu64 " misalign %u: scalar %08x%08x avx2 %08x%08x", first, n,
                             mis, x.lane[0], x.lane[1], y.lane[0], y.lane[1]);
                if (n <= 70001 && li % 3 == 0) assert_true(dsum_eq(x, naive_dot(ks, p, first, n)));
                refit_dsum_t r1 = {{0, 0}}, r2 = {{0, 0}}, parts = {{0, 0}};
                uint64_t nr = n > 65536 ? 1 : 2;
                refit_digest_rows(ks, 5, 3, nr, first, p, 2 * n, n, &r1);
                refit_digest_rows(kv, 5, 3, nr, first, p, 2 * n, n, &r2);
                assert_true(dsum_eq(r1, r2));
                /* Cut each row at the next block boundary, one unit on either side, and at random. */
                for (uint64_t i = 0; i < nr; i++) {
                    uint64_t c = 0, bound = ((first >> 16) + 1) << 16;
                    uint64_t cuts[4] = {bound - first - 1, bound - first, bound - first + 1, rnd() % (n + 1)};
                    for (int q = 0; q < 4; q++) {
                        uint64_t e = REFIT_MIN(REFIT_MAX(cuts[q], c), n);
                        refit_digest_span(q % 2 ? kv : ks, 5, 3 + i, first + c, p + 2 * n * i + 2 * c, e - c, &parts);
                        c = e;
                    }
                    refit_digest_span(kv, 5, 3 + i, first + c, p + 2 * n * i + 2 * c, n - c, &parts);
                }
                assert_true(dsum_eq(r1, parts));
            }
    free(buf);
    refit_digest_key_destroy(ks);
    refit_digest_key_destroy(kv);
}

/* ------------------------------------------------- hand-made manifests */

typedef struct {
    const char *name;
    refit_dtype_t dtype;
    uint32_t ndim;
    uint64_t shape[3];
} tspec_t;

typedef struct {
    uint32_t t; /* index into the tensor list */
    uint64_t off[3], ext[3];
} bspec_t;

/* A manifest of model "m" holding each box in its own local tensor, packed
 * in one region. */
static refit_manifest_t *hand_manifest(uint32_t rank, const tspec_t *ts, size_t nt, const bspec_t *bs, size_t nb)
{
    refit_manifest_identity_t id = {"m", "hand", rank, 8};
    refit_manifest_t *m = NULL;
    REFIT_ASSERT_OK(refit_manifest_create(&id, &m));
    uint64_t size = 0;
    for (size_t b = 0; b < nb; b++) {
        uint64_t v = refit_dtype_size(ts[bs[b].t].dtype);
        for (uint32_t d = 0; d < ts[bs[b].t].ndim; d++) v *= bs[b].ext[d];
        size += (v + 63) / 64 * 64;
    }
    uint32_t region;
    REFIT_ASSERT_OK(refit_manifest_add_region(m, size ? size : 64, &region));
    uint64_t off = 0;
    for (size_t b = 0; b < nb; b++) {
        const tspec_t *t = &ts[bs[b].t];
        refit_tensor_info_t ci = {t->name, t->dtype, t->ndim, {0}}, li = ci;
        char lname[64];
        snprintf(lname, sizeof(lname), "local%zu", b);
        li.name = lname;
        uint64_t v = refit_dtype_size(t->dtype);
        for (uint32_t d = 0; d < t->ndim; d++) {
            ci.shape[d] = t->shape[d];
            li.shape[d] = bs[b].ext[d];
            v *= bs[b].ext[d];
        }
        uint32_t cid, lid;
        REFIT_ASSERT_OK(refit_manifest_add_canonical(m, &ci, &cid));
        REFIT_ASSERT_OK(refit_manifest_add_local(m, &li, region, off, &lid));
        refit_placement_t p = {.canon = cid, .local = lid, .ndim = t->ndim};
        for (uint32_t d = 0; d < t->ndim; d++) {
            p.canon_offset[d] = bs[b].off[d];
            p.extent[d] = bs[b].ext[d];
        }
        REFIT_ASSERT_OK(refit_manifest_add_placement(m, &p));
        off += (v + 63) / 64 * 64;
    }
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    return m;
}

/* Fills every placement of m with the value of each canonical element: a
 * hash of (tensor name, flat index, byte). */
static void *hand_fill(const refit_manifest_t *m)
{
    uint64_t size = refit_manifest_region_size(m, 0);
    uint8_t *arena = xmalloc(size);
    memset(arena, 0x5a, size);
    for (size_t i = 0; i < m->placements.len; i++) {
        const refit_placement_t *p = &m->placements.data[i];
        const refit_tdesc_t *c = &m->canon.data[p->canon];
        const refit_local_t *l = &m->locals.data[p->local];
        uint64_t es = refit_dtype_size(c->dtype), cst[REFIT_MAX_DIMS], n = 1,
                 seed = refit_hash64(c->name, strlen(c->name), 9);
        refit_tdesc_strides(c, cst);
        for (uint32_t d = 0; d < p->ndim; d++) n *= p->extent[d];
        for (uint64_t e = 0; e < n; e++) {
            uint64_t pt[REFIT_MAX_DIMS] = {0}, rem = e, flat = 0;
            for (int d = (int)p->ndim - 1; d >= 0; d--) {
                pt[d] = p->canon_offset[d] + rem % p->extent[d];
                rem /= p->extent[d];
                flat += pt[d] * cst[d];
            }
            uint8_t *q = arena + l->offset + refit_placement_local_index(m, p, pt) * es;
            for (uint64_t b = 0; b < es; b++) q[b] = (uint8_t)refit_mix64(seed ^ (flat * es + b));
        }
    }
    return arena;
}

static void *table_of(const refit_digest_key_t *k, const refit_manifest_t *m, void *arena, unsigned threads)
{
    void *t = aligned_alloc(64, (refit_digest_table_bytes(m) + 64) / 64 * 64);
    assert_non_null(t);
    REFIT_ASSERT_OK(refit_digest_table_fill(k, m, (const void *const *)&arena, t, threads));
    return t;
}

static uint8_t *fetch_all(const refit_digest_plan_t *dp, void *const *tables, const refit_manifest_t *const *srcs)
{
    size_t n;
    const refit_digest_fetch_t *f = refit_digest_plan_fetches(dp, &n);
    uint8_t *buf = xmalloc(8 * n);
    for (size_t i = 0; i < n; i++) {
        assert_non_null(srcs[f[i].src]);
        assert_true(f[i].offset % 8 == 0 && f[i].offset + 8 <= refit_digest_table_bytes(srcs[f[i].src]));
        memcpy(buf + 8 * i, (const uint8_t *)tables[f[i].src] + f[i].offset, 8);
    }
    return buf;
}

/* Digest plan + fetch + local + check. */
static refit_status_t verify(const refit_digest_key_t *k, const refit_manifest_t *const *srcs, size_t nsrcs,
                             const uint8_t *usable, void *const *tables, const refit_manifest_t *dst, void *arena,
                             refit_digest_plan_stats_t *stats, refit_digest_report_t *rep)
{
    refit_digest_plan_t *dp = NULL;
    REFIT_ASSERT_OK(refit_digest_plan_create(srcs, nsrcs, usable, dst, &dp));
    if (stats) refit_digest_plan_stats(dp, stats);
    uint8_t *fetched = fetch_all(dp, tables, srcs);
    refit_dsum_t *local = xmalloc(sizeof(refit_dsum_t) * dst->placements.len);
    REFIT_ASSERT_OK(refit_digest_local(k, dst, (const void *const *)&arena, local, 2));
    refit_status_t st = refit_digest_check(dp, fetched, local, rep);
    free(local);
    free(fetched);
    refit_digest_plan_destroy(dp);
    return st;
}

/* Tables hold P[k] = D(rows [a, a+k) of the box) and Q[k] = D(columns [c, c+k)),
 * computed independently here; identical for any thread count and kernel,
 * including boxes split into several work items. */
static void table_contents_once(void)
{
    const tspec_t ts[] = {{"big", REFIT_DTYPE_BF16, 2, {2100, 300}},
                          {"f32", REFIT_DTYPE_F32, 2, {40, 24}},
                          {"vec", REFIT_DTYPE_BF16, 1, {1000}},
                          {"u8", REFIT_DTYPE_U8, 2, {8, 64}}};
    const bspec_t bs[] = {{0, {0, 20}, {2100, 260}}, {1, {3, 4}, {30, 20}}, {2, {100}, {900}}, {3, {2, 8}, {5, 40}}};
    refit_manifest_t *m = hand_manifest(0, ts, 4, bs, 4);
    void *arena = hand_fill(m);
    refit_digest_key_t *k = key_of(5);
    uint64_t *offs = xmalloc(sizeof(uint64_t) * 4);
    uint64_t bytes = refit_digest_table_offsets(m, offs);
    assert_int_equal(bytes, refit_digest_table_bytes(m));
    assert_int_equal(bytes, 8 * ((2101 + 261) + (31 + 41) + (2 + 901) + (6 + 21)));
    uint8_t *t1 = table_of(k, m, arena, 1);
    refit_dsum_t local[4];
    REFIT_ASSERT_OK(refit_digest_local(k, m, (const void *const *)&arena, local, 1));
    for (uint32_t i = 0; i < 4; i++) {
        const refit_placement_t *p = &m->placements.data[i];
        const refit_tdesc_t *c = &m->canon.data[p->canon];
        const refit_local_t *l = &m->locals.data[p->local];
        uint64_t es = refit_dtype_size(c->dtype), tid = refit_digest_tensor_id(k, c->name);
        bool two = c->ndim == 2;
        uint64_t a = two ? p->canon_offset[0] : 0, rows = two ? p->extent[0] : 1;
        uint64_t cu = p->canon_offset[c->ndim - 1] * es / 2, n = p->extent[c->ndim - 1] * es / 2;
        const uint8_t *base = (const uint8_t *)arena + l->offset;
        uint64_t stride = two ? l->d.shape[1] * es : 0;
        const uint8_t *P = t1 + offs[i], *Q = P + 8 * (rows + 1);
        for (uint64_t x = 0; x <= rows; x += (x < 5 || rows - x < 5) ? 1 : 97) {
            refit_dsum_t want = {{0, 0}}, got;
            refit_digest_rows(k, tid, a, x, cu, base, stride, n, &want);
            memcpy(&got, P + 8 * x, 8);
            assert_true(dsum_eq(want, got));
        }
        for (uint64_t x = 0; x <= n; x += (x < 5 || n - x < 5) ? 1 : 13) {
            refit_dsum_t want = {{0, 0}}, got;
            refit_digest_rows(k, tid, a, rows, cu, base, stride, x, &want);
            memcpy(&got, Q + 8 * x, 8);
            assert_true(dsum_eq(want, got));
        }
        refit_dsum_t pe, qe;
        memcpy(&pe, P + 8 * rows, 8);
        memcpy(&qe, Q + 8 * n, 8);
        assert_true(dsum_eq(pe, qe));
        /* The receiver computes its own digest only for boxes it can verify:
         * not "f32" and "u8", cut in both dimensions. */
        if (i == 0 || i == 2) assert_true(dsum_eq(pe, local[i]));
        else assert_true(local[i].lane[0] == 0 && local[i].lane[1] == 0);
    }
    /* "big" is about 1 MiB: several work items adding into one Q. */
    uint8_t *t2 = table_of(k, m, arena, 2), *t8 = table_of(k, m, arena, 8);
    assert_memory_equal(t1, t2, bytes);
    assert_memory_equal(t1, t8, bytes);
    /* Every kernel's publisher rows and receiver sums equal AUTO's. */
    for (refit_digest_impl_t im = REFIT_DIGEST_IMPL_SCALAR; im <= REFIT_DIGEST_IMPL_AVX512; im++) {
        if (!have_impl(im)) continue;
        refit_digest_key_t *ks = key_impl(5, im);
        uint8_t *ts1 = table_of(ks, m, arena, 3);
        assert_memory_equal(t1, ts1, bytes);
        refit_dsum_t ls[4];
        REFIT_ASSERT_OK(refit_digest_local(ks, m, (const void *const *)&arena, ls, 3));
        assert_memory_equal(local, ls, sizeof(ls));
        free(ts1);
        refit_digest_key_destroy(ks);
    }
    free(t1);
    free(t2);
    free(t8);
    free(offs);
    free(arena);
    refit_digest_key_destroy(k);
    refit_manifest_destroy(m);
}

/* The table's entries against sums computed unit by unit; twice: with the AVX-512 four-row publisher kernel taken
 * from 160 units (the 260-unit rows then reach it) and at its default threshold (they go pair by pair). */
static void table_contents(void **state)
{
    (void)state;
    digest_pub_rows4_min_units = 160;
    table_contents_once();
    digest_pub_rows4_min_units = rows4_default;
    table_contents_once();
}

/* A box whose rows cross unit 65536 (an lm_head-like row of 140,000 units
 * with its first 1000 cut off): P and Q hold the digests the kernel gives,
 * with the right multiplier on each side of the boundary, for any thread
 * count and either kernel; +d / -d 65,536 units apart in one row changes the
 * publisher's totals and the receiver's own sum. */
static void long_row_tables(void **state)
{
    (void)state;
    const tspec_t ts[] = {{"wide", REFIT_DTYPE_BF16, 2, {3, 140000}}};
    const bspec_t bs[] = {{0, {0, 1000}, {3, 139000}}};
    refit_manifest_t *m = hand_manifest(0, ts, 1, bs, 1);
    uint8_t *arena = hand_fill(m);
    refit_digest_key_t *k = key_of(12);
    const refit_placement_t *pl = &m->placements.data[0];
    const uint8_t *base = arena + m->locals.data[pl->local].offset;
    uint64_t tid = refit_digest_tensor_id(k, "wide"), n = 139000, stride = 2 * n;
    uint8_t *t1 = table_of(k, m, arena, 1), *t2 = table_of(k, m, arena, 2);
    uint64_t bytes = refit_digest_table_bytes(m);
    assert_int_equal(bytes, 8 * (4 + 139001));
    assert_memory_equal(t1, t2, bytes);
    const uint8_t *P = t1, *Q = P + 8 * 4;
    for (uint64_t x = 0; x <= 3; x++) {
        refit_dsum_t want = {{0, 0}}, got;
        refit_digest_rows(k, tid, 0, x, 1000, base, stride, n, &want);
        memcpy(&got, P + 8 * x, 8);
        assert_true(dsum_eq(want, got));
    }
    const uint64_t qs[] = {1, 2, 64535, 64536, 64537, 100000, 130072, 130073, 139000};
    for (size_t i = 0; i < REFIT_ARRAY_LEN(qs); i++) {
        refit_dsum_t want = {{0, 0}}, got;
        refit_digest_rows(k, tid, 0, 3, 1000, base, stride, qs[i], &want);
        memcpy(&got, Q + 8 * qs[i], 8);
        assert_true(dsum_eq(want, got));
    }
    for (refit_digest_impl_t im = REFIT_DIGEST_IMPL_SCALAR; im <= REFIT_DIGEST_IMPL_AVX512; im++) {
        if (!have_impl(im)) continue;
        refit_digest_key_t *ks = key_impl(12, im);
        uint8_t *ts1 = table_of(ks, m, arena, 1);
        assert_memory_equal(t1, ts1, bytes);
        free(ts1);
        refit_digest_key_destroy(ks);
    }
    refit_dsum_t local0, local1;
    REFIT_ASSERT_OK(refit_digest_local(k, m, (const void *const *)&arena, &local0, 2));
    assert_memory_equal(&local0, P + 8 * 3, 8);
    /* Row 1: canonical units 2000 and 2000 + 65536 set to known values, then
     * +300 at the first and -300 at the second. */
    uint8_t *u1 = arena + m->locals.data[pl->local].offset + stride + 2 * (2000 - 1000), *u2 = u1 + 2 * 65536;
    int16_t v[4] = {1234, -777, 1234 + 300, -777 - 300};
    memcpy(u1, &v[0], 2);
    memcpy(u2, &v[1], 2);
    uint8_t *before = table_of(k, m, arena, 2);
    memcpy(u1, &v[2], 2);
    memcpy(u2, &v[3], 2);
    uint8_t *after = table_of(k, m, arena, 2);
    REFIT_ASSERT_OK(refit_digest_local(k, m, (const void *const *)&arena, &local1, 2));
    refit_dsum_t pb, pa;
    memcpy(&pb, before + 8 * 3, 8);
    memcpy(&pa, after + 8 * 3, 8);
    assert_true(pb.lane[0] != pa.lane[0] && pb.lane[1] != pa.lane[1]);
    assert_memory_equal(&local1, &pa, 8);
    free(before);
    free(after);
    free(t2);
    free(t1);
    free(arena);
    refit_digest_key_destroy(k);
    refit_manifest_destroy(m);
}

/* ------------------------------------------------------ end to end */

/* Address of canonical point (row, col) of placement p in arena. */
static uint8_t *elem_at(const refit_manifest_t *m, uint32_t pi, void *arena, uint64_t row, uint64_t col)
{
    const refit_placement_t *p = &m->placements.data[pi];
    const refit_local_t *l = &m->locals.data[p->local];
    uint64_t pt[REFIT_MAX_DIMS] = {0};
    if (p->ndim == 2) {
        pt[0] = p->canon_offset[0] + row;
        pt[1] = p->canon_offset[1] + col;
    } else {
        pt[0] = p->canon_offset[0] + col;
    }
    return (uint8_t *)arena + l->offset + refit_placement_local_index(m, p, pt) * refit_dtype_size(l->d.dtype);
}

static const char *canon_of(const refit_manifest_t *m, uint32_t pi)
{
    return m->canon.data[m->placements.data[pi].canon].name;
}

/* Every way of breaking the destination's bytes that must fail, and the
 * padding change that must not (the last rank holds the padded vocabulary rows). */
static void tamper(const refit_digest_key_t *k, const refit_manifest_t *const *srcs, size_t nsrcs, void *const *tables,
                   const refit_manifest_t *dm, void *arena)
{
    uint32_t np = (uint32_t)dm->placements.len;
    const uint32_t picks[] = {0, np / 3, np / 2, np - 1};
    for (size_t x = 0; x < REFIT_ARRAY_LEN(picks); x++) {
        uint32_t pi = picks[x];
        const refit_placement_t *p = &dm->placements.data[pi];
        uint64_t rows = p->ndim == 2 ? p->extent[0] : 1, cols = p->extent[p->ndim - 1];
        /* A byte in the middle, then the very last byte of the box (the kernel's tail). */
        for (int where = 0; where < 2; where++) {
            uint64_t es = refit_dtype_size(dm->canon.data[p->canon].dtype);
            uint8_t *q = where ? elem_at(dm, pi, arena, rows - 1, cols - 1) + es - 1
                               : elem_at(dm, pi, arena, rows / 2, cols / 2);
            *q ^= 0x10;
            refit_digest_report_t rep;
            REFIT_ASSERT_ERR(verify(k, srcs, nsrcs, NULL, tables, dm, arena, NULL, &rep), REFIT_ERR_VERIFY,
                             canon_of(dm, pi));
            assert_int_equal(rep.mismatches, 1);
            *q ^= 0x10;
        }
    }
    /* Two different rows of one box swapped. */
    for (uint32_t pi = np / 4, done = 0; pi < np && !done; pi++) {
        const refit_placement_t *p = &dm->placements.data[pi];
        if (p->ndim != 2 || p->extent[0] < 4) continue;
        uint64_t rb = p->extent[1] * refit_dtype_size(dm->canon.data[p->canon].dtype);
        uint8_t *r1 = elem_at(dm, pi, arena, 1, 0), *r3 = elem_at(dm, pi, arena, 3, 0);
        if (!memcmp(r1, r3, rb)) continue;
        uint8_t *tmp = xmalloc(rb);
        memcpy(tmp, r1, rb);
        memcpy(r1, r3, rb);
        memcpy(r3, tmp, rb);
        REFIT_ASSERT_ERR(verify(k, srcs, nsrcs, NULL, tables, dm, arena, NULL, NULL), REFIT_ERR_VERIFY,
                         canon_of(dm, pi));
        memcpy(r3, r1, rb);
        memcpy(r1, tmp, rb);
        free(tmp);
        done = 1;
    }
    /* Padding is part of no digest. */
    unsigned padded = 0;
    for (uint32_t li = 0; li < dm->locals.len; li++) {
        refit_box_t *boxes;
        size_t n;
        REFIT_ASSERT_OK(refit_manifest_padding(dm, li, &boxes, &n));
        if (n) {
            const refit_local_t *l = &dm->locals.data[li];
            uint64_t lst[REFIT_MAX_DIMS], idx = 0;
            refit_tdesc_strides(&l->d, lst);
            for (uint32_t d = 0; d < boxes[0].ndim; d++) idx += boxes[0].off[d] * lst[d];
            uint8_t *q = (uint8_t *)arena + l->offset + idx * refit_dtype_size(l->d.dtype);
            *q ^= 0xff;
            REFIT_ASSERT_OK(verify(k, srcs, nsrcs, NULL, tables, dm, arena, NULL, NULL));
            *q ^= 0xff;
            padded++;
        }
        free(boxes);
    }
    assert_true(padded > 0);
    REFIT_ASSERT_OK(verify(k, srcs, nsrcs, NULL, tables, dm, arena, NULL, NULL));
}

typedef struct {
    const char *model, *src, *dst;
    bool tamper;
} pair_t;

static void run_pair(const pair_t *pr)
{
    refit_model_t *model = t_model(pr->model);
    refit_layout_t *sl = t_layout(pr->src), *dl = t_layout(pr->dst);
    tool_local_set_t set;
    REFIT_ASSERT_OK(tool_local_set_create(model, sl, true, 11, &set));
    refit_digest_key_t *k = key_of(6);
    void **tables = xmalloc(set.n * sizeof(void *));
    for (uint32_t s = 0; s < set.n; s++) tables[s] = table_of(k, set.manifests[s], set.arenas[s], 2);
    const refit_manifest_t *const *srcs = (const refit_manifest_t *const *)set.manifests;
    uint64_t placements = 0, fetches = 0, bytes = 0;
    for (uint32_t r = 0; r < refit_layout_world(dl); r++) {
        refit_manifest_t *dm = NULL;
        REFIT_ASSERT_OK(refit_layout_manifest(dl, model, r, &dm));
        refit_plan_t *plan = NULL;
        REFIT_ASSERT_OK(refit_plan_create(srcs, set.n, dm, NULL, &plan));
        uint64_t size = refit_manifest_region_size(dm, 0);
        void *arena = xmalloc(size);
        memset(arena, 0xa5, size);
        REFIT_ASSERT_OK(refit_plan_execute_memcpy(plan, set.bases, &arena, 1));
        REFIT_ASSERT_OK(refit_truth_verify(dm, (const void *const *)&arena, 11, NULL));
        refit_plan_stats_t ps = REFIT_PLAN_STATS_INIT;
        refit_plan_stats(plan, &ps);
        refit_digest_plan_stats_t st;
        refit_digest_report_t rep;
        refit_status_t s = verify(k, srcs, set.n, NULL, tables, dm, arena, &st, &rep);
        if (s) fail_msg("%s %s -> %s rank %u: %s", pr->model, pr->src, pr->dst, r, refit_last_error());
        /* Every placement of these layouts is verifiable. */
        assert_int_equal(st.placements, dm->placements.len);
        assert_int_equal(st.verifiable, st.placements);
        assert_int_equal(st.unverifiable_bytes, 0);
        assert_int_equal(st.bytes, ps.bytes_written);
        assert_int_equal(rep.checked, st.placements);
        assert_int_equal(rep.bytes, ps.bytes_written);
        assert_true(st.fetches > 0 && st.fetches <= 2 * ps.pieces);
        placements += st.placements;
        fetches += st.fetches;
        bytes += st.bytes;
        if (pr->tamper && r + 1 == refit_layout_world(dl)) tamper(k, srcs, set.n, tables, dm, arena);
        free(arena);
        refit_plan_destroy(plan);
        refit_manifest_destroy(dm);
    }
    print_message("%s %s -> %s: %u ranks, %" PRIu64 " placements (%" PRIu64 " bytes) verified with %" PRIu64
                  " fetches\n",
                  pr->model, pr->src, pr->dst, refit_layout_world(dl), placements, bytes, fetches);
    for (uint32_t s = 0; s < set.n; s++) free(tables[s]);
    free(tables);
    refit_digest_key_destroy(k);
    tool_local_set_destroy(&set);
    refit_layout_destroy(sl);
    refit_layout_destroy(dl);
    refit_model_destroy(model);
}

static void layout_pairs(void **state)
{
    (void)state;
    const pair_t pairs[] = {
        {"tiny-moe", "megatron:tp=2", "vllm:tp=2", true},
        {"tiny-moe", "megatron:ep=8", "vllm:tp=2", true},
        {"tiny-moe", "megatron:tp=2,pp=2,ep=4", "vllm:tp=4,ep=4", true},
        {"tiny-moe", "hf", "vllm:tp=4", true},
        {"tiny-moe", "megatron:tp=2,dp=2", "vllm:tp=2,dp=2", false},
        {"tiny-moe", "vllm:tp=4,ep=4", "megatron:tp=2,pp=2,ep=2", false},
        {"tiny-dense", "megatron:tp=4,pp=2", "vllm:tp=2", true},
        {"tiny-dense", "megatron:tp=8", "hf", false},
        {"tiny-mla", "megatron:tp=2,ep=2", "vllm:tp=2", true},
        {"tiny-tied", "megatron:tp=2,pp=2", "vllm:tp=4", false},
        /* dtensor (issue #33): FSDP2's dim-0 chunks are row ranges. */
        {"tiny-moe", "dtensor:dp_shard=3", "vllm:tp=2", true},
        {"tiny-tied", "dtensor:dp_shard=7", "vllm:tp=4", false},
        {"tiny-dense", "dtensor:dp_shard=4,tp=3", "hf", false},
        {"tiny-dense", "dtensor:dp_shard=2,dp_replicate=2,tp=2", "megatron:tp=2", false},
    };
    for (size_t i = 0; i < REFIT_ARRAY_LEN(pairs); i++) run_pair(&pairs[i]);
}

/* FP8 arenas (refit/fp8.h) as publishers and receivers: e4m3 weights (two
 * bytes a unit, shards on the 128 grid) and fp32 block scales verify from a
 * vLLM tp=2 FP8 stage into a tp=1 FP8 receiver; a flipped fp8 byte fails. */
static void fp8_arenas(void **state)
{
    (void)state;
    refit_manifest_t *sm[2], *dm;
    unsigned char *sa[2];
    for (uint32_t r = 0; r < 2; r++) sa[r] = t_fp8_arena("tiny-fp8", "vllm:tp=2", r, 4, &sm[r]);
    unsigned char *ref = t_fp8_arena("tiny-fp8", "vllm:tp=1", 0, 4, &dm);
    refit_digest_key_t *k = key_of(13);
    void *tables[2] = {table_of(k, sm[0], sa[0], 2), table_of(k, sm[1], sa[1], 2)};
    const refit_manifest_t *srcs[2] = {sm[0], sm[1]};
    refit_plan_t *plan = NULL;
    REFIT_ASSERT_OK(refit_plan_create(srcs, 2, dm, NULL, &plan));
    uint64_t size = refit_manifest_region_size(dm, 0);
    void *arena = xmalloc(size);
    memset(arena, 0xa5, size);
    const void *const *bases[2] = {(const void *const *)&sa[0], (const void *const *)&sa[1]};
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(plan, bases, &arena, 1));
    refit_digest_plan_stats_t st;
    REFIT_ASSERT_OK(verify(k, srcs, 2, NULL, tables, dm, arena, &st, NULL));
    assert_int_equal(st.verifiable, st.placements);
    unsigned f8 = 0, scales = 0;
    int32_t pick = -1;
    for (uint32_t i = 0; i < dm->placements.len; i++) {
        refit_dtype_t t = dm->canon.data[dm->placements.data[i].canon].dtype;
        f8 += t == REFIT_DTYPE_F8_E4M3;
        scales += t == REFIT_DTYPE_F32;
        if (t == REFIT_DTYPE_F8_E4M3 && pick < 0 && dm->placements.data[i].extent[0] > 2) pick = (int32_t)i;
    }
    assert_true(f8 > 0 && scales > 0 && pick >= 0);
    uint8_t *q = elem_at(dm, (uint32_t)pick, arena, 2, 129); /* an odd byte: the high half of a unit */
    *q ^= 0x08;
    REFIT_ASSERT_ERR(verify(k, srcs, 2, NULL, tables, dm, arena, NULL, NULL), REFIT_ERR_VERIFY,
                     canon_of(dm, (uint32_t)pick));
    free(arena);
    free(ref);
    free(tables[0]);
    free(tables[1]);
    for (uint32_t r = 0; r < 2; r++) {
        free(sa[r]);
        refit_manifest_destroy(sm[r]);
    }
    refit_manifest_destroy(dm);
    refit_plan_destroy(plan);
    refit_digest_key_destroy(k);
}

/* A source byte changed after its table was filled: the destination copy of
 * it fails verification, naming the tensor (an expert: held by one source). */
static void stale_source(void **state)
{
    (void)state;
    refit_model_t *model = t_model("tiny-moe");
    refit_layout_t *sl = t_layout("megatron:ep=8"), *dl = t_layout("vllm:tp=2");
    tool_local_set_t set;
    REFIT_ASSERT_OK(tool_local_set_create(model, sl, true, 3, &set));
    refit_digest_key_t *k = key_of(7), *wrong = key_of(8);
    void **tables = xmalloc(set.n * sizeof(void *));
    for (uint32_t s = 0; s < set.n; s++) tables[s] = table_of(k, set.manifests[s], set.arenas[s], 1);
    const refit_manifest_t *const *srcs = (const refit_manifest_t *const *)set.manifests;
    /* An expert placement of source 5; the canonical element at row 0, column 0
     * goes to destination rank 0 (gate/up rows and down columns split over tp). */
    const refit_manifest_t *sm = set.manifests[5];
    int32_t pick = -1;
    for (uint32_t i = 0; i < sm->placements.len && pick < 0; i++)
        if (strstr(canon_of(sm, i), "experts.") && sm->placements.data[i].canon_offset[0] == 0 &&
            sm->placements.data[i].canon_offset[1] == 0)
            pick = (int32_t)i;
    assert_true(pick >= 0);
    uint8_t *q = elem_at(sm, (uint32_t)pick, set.arenas[5], 0, 0);
    *q ^= 1;
    refit_manifest_t *dm = NULL;
    REFIT_ASSERT_OK(refit_layout_manifest(dl, model, 0, &dm));
    refit_plan_t *plan = NULL;
    REFIT_ASSERT_OK(refit_plan_create(srcs, set.n, dm, NULL, &plan));
    void *arena = xmalloc(refit_manifest_region_size(dm, 0));
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(plan, set.bases, &arena, 2));
    refit_digest_report_t rep;
    REFIT_ASSERT_ERR(verify(k, srcs, set.n, NULL, tables, dm, arena, NULL, &rep), REFIT_ERR_VERIFY,
                     canon_of(sm, (uint32_t)pick));
    assert_int_equal(rep.mismatches, 1);
    assert_non_null(strstr(refit_last_error(), "source(s) 5"));
    /* Restored: passes; a receiver with another key: every placement fails. */
    *q ^= 1;
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(plan, set.bases, &arena, 2));
    REFIT_ASSERT_OK(verify(k, srcs, set.n, NULL, tables, dm, arena, NULL, NULL));
    REFIT_ASSERT_ERR(verify(wrong, srcs, set.n, NULL, tables, dm, arena, NULL, &rep), REFIT_ERR_VERIFY,
                     "placements differ");
    assert_int_equal(rep.mismatches, dm->placements.len);
    free(arena);
    refit_plan_destroy(plan);
    refit_manifest_destroy(dm);
    for (uint32_t s = 0; s < set.n; s++) free(tables[s]);
    free(tables);
    refit_digest_key_destroy(k);
    refit_digest_key_destroy(wrong);
    tool_local_set_destroy(&set);
    refit_layout_destroy(sl);
    refit_layout_destroy(dl);
    refit_model_destroy(model);
}

/* Sources marked unusable: a replica takes over (still fully verifiable,
 * never fetching from them); with both replicas of a shard unusable, what
 * needs that shard is unverifiable, the rest still verified. */
static void unusable_sources(void **state)
{
    (void)state;
    refit_model_t *model = t_model("tiny-moe");
    refit_layout_t *sl = t_layout("megatron:tp=2,dp=2"), *dl = t_layout("vllm:tp=2");
    tool_local_set_t set;
    REFIT_ASSERT_OK(tool_local_set_create(model, sl, true, 5, &set));
    assert_int_equal(set.n, 4); /* rank = tp_rank + 2 * dp_rank */
    refit_digest_key_t *k = key_of(9);
    void **tables = xmalloc(set.n * sizeof(void *));
    for (uint32_t s = 0; s < set.n; s++) tables[s] = table_of(k, set.manifests[s], set.arenas[s], 2);
    const refit_manifest_t *const *srcs = (const refit_manifest_t *const *)set.manifests;
    refit_manifest_t *dm = NULL;
    REFIT_ASSERT_OK(refit_layout_manifest(dl, model, 0, &dm));
    /* Rank 0 is dead: the copy comes from its replica, rank 2. */
    const refit_manifest_t *alive[4] = {NULL, srcs[1], srcs[2], srcs[3]};
    refit_plan_t *plan = NULL;
    REFIT_ASSERT_OK(refit_plan_create(alive, 4, dm, NULL, &plan));
    void *arena = xmalloc(refit_manifest_region_size(dm, 0));
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(plan, set.bases, &arena, 1));
    const uint8_t usable[4] = {0, 1, 1, 1};
    refit_digest_plan_stats_t st;
    REFIT_ASSERT_OK(verify(k, srcs, 4, usable, tables, dm, arena, &st, NULL));
    assert_int_equal(st.verifiable, st.placements);
    refit_digest_plan_t *dp = NULL;
    REFIT_ASSERT_OK(refit_digest_plan_create(srcs, 4, usable, dm, &dp));
    size_t nf;
    const refit_digest_fetch_t *f = refit_digest_plan_fetches(dp, &nf);
    unsigned from2 = 0;
    for (size_t i = 0; i < nf; i++) {
        assert_int_not_equal(f[i].src, 0);
        from2 += f[i].src == 2;
    }
    assert_true(from2 > 0);
    refit_digest_plan_destroy(dp);
    /* Without usable, the lowest index of each replica set is used (ranks 0
     * and 1, never their replicas 2 and 3): same verdict. */
    REFIT_ASSERT_OK(refit_digest_plan_create(srcs, 4, NULL, dm, &dp));
    f = refit_digest_plan_fetches(dp, &nf);
    for (size_t i = 0; i < nf; i++) assert_true(f[i].src < 2);
    refit_digest_plan_destroy(dp);
    REFIT_ASSERT_OK(verify(k, srcs, 4, NULL, tables, dm, arena, NULL, NULL));
    /* Both holders of TP shard 0 unusable. */
    const uint8_t only_odd[4] = {0, 1, 0, 1};
    REFIT_ASSERT_OK(verify(k, srcs, 4, only_odd, tables, dm, arena, &st, NULL));
    assert_true(st.unverifiable[REFIT_DIGEST_UNV_NO_PARTITION] > 0);
    assert_int_equal(st.unverifiable[REFIT_DIGEST_UNV_NO_PARTITION], st.placements - st.verifiable);
    assert_true(st.verifiable > 0); /* replicated norms and the router, from rank 1 */
    free(arena);
    refit_plan_destroy(plan);
    refit_manifest_destroy(dm);
    for (uint32_t s = 0; s < set.n; s++) free(tables[s]);
    free(tables);
    refit_digest_key_destroy(k);
    tool_local_set_destroy(&set);
    refit_layout_destroy(sl);
    refit_layout_destroy(dl);
    refit_model_destroy(model);
}

/* Unverifiable, never wrongly verified: overlapping non-identical source
 * boxes, a gap, a destination box cut in both dimensions, odd bytes (at
 * the destination or only at a source), ndim 3.  What is verifiable next to
 * them still is, and still catches a wrong byte. */
static void unverifiable_cases(void **state)
{
    (void)state;
    const tspec_t ts[] = {
        {"overlap", REFIT_DTYPE_BF16, 2, {8, 16}}, /* sources rows [0,6) and [4,8) */
        {"good", REFIT_DTYPE_BF16, 2, {8, 16}},    /* sources rows [0,4) and [4,8) */
        {"gap", REFIT_DTYPE_BF16, 2, {8, 16}},     /* sources rows [0,3) and [4,8) */
        {"cut", REFIT_DTYPE_BF16, 2, {8, 16}},     /* destination [0:4, 0:8] */
        {"odd", REFIT_DTYPE_U8, 2, {4, 15}},       /* rows of 15 bytes */
        {"oddsrc", REFIT_DTYPE_U8, 2, {4, 16}},    /* sources split at column 5 */
        {"cube", REFIT_DTYPE_BF16, 3, {2, 4, 8}},
        {"overlap2", REFIT_DTYPE_BF16, 2, {8, 16}}, /* [0:5, 0:16] and [4:8, 0:12]: volumes add up */
    };
    const bspec_t a[] = {{0, {0, 0}, {6, 16}}, {1, {0, 0}, {4, 16}}, {2, {0, 0}, {3, 16}},      {3, {0, 0}, {8, 16}},
                         {4, {0, 0}, {4, 15}}, {5, {0, 0}, {4, 5}},  {6, {0, 0, 0}, {2, 4, 8}}, {7, {0, 0}, {5, 16}}};
    const bspec_t b[] = {
        {0, {4, 0}, {4, 16}}, {1, {4, 0}, {4, 16}}, {2, {4, 0}, {4, 16}}, {5, {0, 5}, {4, 11}}, {7, {4, 0}, {4, 12}}};
    const bspec_t d[] = {{0, {0, 0}, {8, 16}}, {1, {0, 0}, {8, 16}}, {2, {4, 0}, {4, 16}},      {3, {0, 0}, {4, 8}},
                         {4, {0, 0}, {4, 15}}, {5, {0, 0}, {2, 16}}, {6, {0, 0, 0}, {2, 4, 8}}, {7, {0, 0}, {8, 16}}};
    refit_manifest_t *sa = hand_manifest(0, ts, 8, a, REFIT_ARRAY_LEN(a));
    refit_manifest_t *sb = hand_manifest(1, ts, 8, b, REFIT_ARRAY_LEN(b));
    refit_manifest_t *dm = hand_manifest(2, ts, 8, d, REFIT_ARRAY_LEN(d));
    void *aa = hand_fill(sa), *ab = hand_fill(sb), *ad = hand_fill(dm);
    refit_digest_key_t *k = key_of(10);
    void *tables[2] = {table_of(k, sa, aa, 1), table_of(k, sb, ab, 1)};
    const refit_manifest_t *srcs[2] = {sa, sb};
    refit_digest_plan_t *dp = NULL;
    REFIT_ASSERT_OK(refit_digest_plan_create(srcs, 2, NULL, dm, &dp));
    const refit_digest_reason_t want[] = {REFIT_DIGEST_UNV_NO_PARTITION, REFIT_DIGEST_VERIFIABLE,
                                          REFIT_DIGEST_UNV_NO_PARTITION, REFIT_DIGEST_UNV_CUT_BOTH,
                                          REFIT_DIGEST_UNV_ODD_BYTES,    REFIT_DIGEST_UNV_SOURCE_BOX,
                                          REFIT_DIGEST_UNV_NDIM,         REFIT_DIGEST_UNV_NO_PARTITION};
    for (uint32_t i = 0; i < REFIT_ARRAY_LEN(want); i++)
        if (refit_digest_plan_reason(dp, i) != want[i])
            fail_msg("placement %u (%s): %s, want %s", i, canon_of(dm, i),
                     refit_digest_reason_name(refit_digest_plan_reason(dp, i)), refit_digest_reason_name(want[i]));
    refit_digest_plan_stats_t st;
    refit_digest_plan_stats(dp, &st);
    assert_int_equal(st.placements, 8);
    assert_int_equal(st.verifiable, 1);
    assert_int_equal(st.bytes, 256 + 256 + 128 + 64 + 60 + 32 + 128 + 256);
    assert_int_equal(st.unverifiable_bytes, st.bytes - 256);
    assert_int_equal(st.fetches, 2); /* "good": P[end] of each source */
    refit_digest_plan_destroy(dp);
    /* Only "good" is compared: wrong bytes elsewhere pass, in "good" fail. */
    refit_digest_report_t rep;
    for (uint32_t i = 0; i < 8; i++)
        if (i != 1) *elem_at(dm, i, ad, 0, 0) ^= 0x40;
    REFIT_ASSERT_OK(verify(k, srcs, 2, NULL, tables, dm, ad, NULL, &rep));
    assert_int_equal(rep.checked, 1);
    *elem_at(dm, 1, ad, 7, 15) ^= 0x40;
    REFIT_ASSERT_ERR(verify(k, srcs, 2, NULL, tables, dm, ad, NULL, NULL), REFIT_ERR_VERIFY, "good [0:8, 0:16]");
    /* Local digests are 0 where the box alone is unverifiable. */
    refit_dsum_t local[8];
    REFIT_ASSERT_OK(refit_digest_local(k, dm, (const void *const *)&ad, local, 1));
    for (uint32_t i = 0; i < 8; i++) {
        bool zero = local[i].lane[0] == 0 && local[i].lane[1] == 0;
        assert_int_equal(zero, i == 3 || i == 4 || i == 6);
    }
    free(tables[0]);
    free(tables[1]);
    free(aa);
    free(ab);
    free(ad);
    refit_digest_key_destroy(k);
    refit_manifest_destroy(sa);
    refit_manifest_destroy(sb);
    refit_manifest_destroy(dm);
}

/* Each dst placement half of a source box: hi - lo, both fetched; a whole
 * source box: one fetch (P[end]); Q's last entry fetched as P's last. */
static void fetch_shape(void **state)
{
    (void)state;
    const tspec_t ts[] = {{"rows", REFIT_DTYPE_BF16, 2, {8, 16}}, {"cols", REFIT_DTYPE_BF16, 2, {8, 16}}};
    const bspec_t s0[] = {{0, {0, 0}, {8, 16}}, {1, {0, 0}, {8, 8}}};
    const bspec_t s1[] = {{1, {0, 8}, {8, 8}}};
    const bspec_t d[] = {{0, {2, 0}, {3, 16}}, {1, {0, 4}, {8, 12}}};
    refit_manifest_t *a = hand_manifest(0, ts, 2, s0, 2), *b = hand_manifest(1, ts, 2, s1, 1),
                     *dm = hand_manifest(2, ts, 2, d, 2);
    refit_digest_plan_t *dp = NULL;
    const refit_manifest_t *srcs[2] = {a, b};
    REFIT_ASSERT_OK(refit_digest_plan_create(srcs, 2, NULL, dm, &dp));
    size_t nf;
    const refit_digest_fetch_t *f = refit_digest_plan_fetches(dp, &nf);
    uint64_t offs0[2];
    refit_digest_table_offsets(a, offs0);
    /* rows: P[5] - P[2] of source 0; cols: Q[8] - Q[4] of source 0 (Q[8] as P[8]), Q[8] of source 1 as P[8]. */
    const refit_digest_fetch_t want[] = {
        {0, offs0[0] + 8 * 2}, {0, offs0[0] + 8 * 5}, {0, offs0[1] + 8 * 8}, {0, offs0[1] + 8 * (9 + 4)}, {1, 8 * 8}};
    assert_int_equal(nf, REFIT_ARRAY_LEN(want));
    for (size_t i = 0; i < nf; i++) {
        assert_int_equal(f[i].src, want[i].src);
        assert_int_equal(f[i].offset, want[i].offset);
    }
    void *aa = hand_fill(a), *ab = hand_fill(b), *ad = hand_fill(dm);
    refit_digest_key_t *k = key_of(12);
    void *tables[2] = {table_of(k, a, aa, 1), table_of(k, b, ab, 1)};
    REFIT_ASSERT_OK(verify(k, srcs, 2, NULL, tables, dm, ad, NULL, NULL));
    *elem_at(dm, 1, ad, 7, 0) ^= 1; /* first column of "cols" dst: row 7, col 4 */
    REFIT_ASSERT_ERR(verify(k, srcs, 2, NULL, tables, dm, ad, NULL, NULL), REFIT_ERR_VERIFY, "cols [0:8, 4:16]");
    free(tables[0]);
    free(tables[1]);
    free(aa);
    free(ab);
    free(ad);
    refit_digest_key_destroy(k);
    refit_digest_plan_destroy(dp);
    refit_manifest_destroy(a);
    refit_manifest_destroy(b);
    refit_manifest_destroy(dm);
}

static void errors(void **state)
{
    (void)state;
    refit_digest_key_t *k = NULL;
    REFIT_ASSERT_ERR(refit_digest_key_create(NULL, &k), REFIT_ERR_INVALID_ARG, NULL);
    REFIT_ASSERT_ERR(refit_digest_key_create_impl((const uint8_t *)"0123456789abcdef0123456789abcdef", 9, &k),
                     REFIT_ERR_INVALID_ARG, NULL);
    assert_null(k);
    k = key_of(1);
    const tspec_t ts[] = {{"w", REFIT_DTYPE_BF16, 2, {8, 16}}};
    const tspec_t ts2[] = {{"w", REFIT_DTYPE_F16, 2, {8, 16}}};
    const bspec_t b[] = {{0, {0, 0}, {8, 16}}};
    refit_manifest_t *s = hand_manifest(0, ts, 1, b, 1), *d = hand_manifest(1, ts2, 1, b, 1);
    refit_digest_plan_t *dp = NULL;
    const refit_manifest_t *srcs[1] = {s};
    REFIT_ASSERT_ERR(refit_digest_plan_create(srcs, 1, NULL, d, &dp), REFIT_ERR_MISMATCH, "w");
    assert_null(dp);
    refit_manifest_t *other = t_manifest_named("tiny-dense", "hf", 0);
    REFIT_ASSERT_ERR(refit_digest_plan_create(srcs, 1, NULL, other, &dp), REFIT_ERR_IDENTITY, NULL);
    REFIT_ASSERT_ERR(refit_digest_plan_create(srcs, 1, NULL, NULL, &dp), REFIT_ERR_INVALID_ARG, NULL);
    /* A missing source is no error: what it held is unverifiable. */
    const refit_manifest_t *none[1] = {NULL};
    REFIT_ASSERT_OK(refit_digest_plan_create(none, 1, NULL, s, &dp));
    refit_digest_plan_stats_t st;
    refit_digest_plan_stats(dp, &st);
    assert_int_equal(st.unverifiable[REFIT_DIGEST_UNV_NO_PARTITION], 1);
    assert_int_equal(st.fetches, 0);
    refit_dsum_t local[1] = {{{1, 2}}};
    REFIT_ASSERT_OK(refit_digest_check(dp, NULL, local, NULL));
    REFIT_ASSERT_ERR(refit_digest_check(dp, NULL, NULL, NULL), REFIT_ERR_INVALID_ARG, NULL);
    refit_digest_plan_destroy(dp);
    void *arena = hand_fill(s);
    uint8_t *table = xmalloc(refit_digest_table_bytes(s) + 8);
    REFIT_ASSERT_ERR(refit_digest_table_fill(k, s, (const void *const *)&arena, table + 4, 1), REFIT_ERR_INVALID_ARG,
                     "aligned");
    REFIT_ASSERT_ERR(refit_digest_local(k, s, NULL, local, 1), REFIT_ERR_INVALID_ARG, NULL);
    refit_manifest_identity_t id = {"m", "x", 0, 1};
    refit_manifest_t *unfinished = NULL;
    REFIT_ASSERT_OK(refit_manifest_create(&id, &unfinished));
    assert_int_equal(refit_digest_table_bytes(unfinished), 0);
    REFIT_ASSERT_ERR(refit_digest_plan_create(srcs, 1, NULL, unfinished, &dp), REFIT_ERR_INVALID_ARG, "finalized");
    refit_manifest_destroy(unfinished);
    free(table);
    free(arena);
    refit_manifest_destroy(s);
    refit_manifest_destroy(d);
    refit_manifest_destroy(other);
    refit_digest_key_destroy(k);
    refit_digest_key_destroy(NULL);
    refit_digest_plan_destroy(NULL);
}

/* A manifest with rows side by side: "a" [40, 100] and "b" [40, 200] in the columns of one local [40, 300]
 * (strided rows), a vector, an f32 box, and a box whose rows cross unit 65536 ("wide" columns [1000,
 * 70000)); padding between them. */
static refit_manifest_t *update_manifest(void)
{
    refit_manifest_identity_t id = {"m", "hand-update", 0, 1};
    refit_manifest_t *m = NULL;
    REFIT_ASSERT_OK(refit_manifest_create(&id, &m));
    uint32_t region, l[4], c[5];
    REFIT_ASSERT_OK(refit_manifest_add_region(m, 24000 + 64 + 2000 + 64 + 2880 + 64 + 276000 + 64, &region));
    refit_tensor_info_t lt[4] = {{"fused", REFIT_DTYPE_BF16, 2, {40, 300}},
                                 {"lvec", REFIT_DTYPE_BF16, 1, {1000}},
                                 {"lf32", REFIT_DTYPE_F32, 2, {30, 24}},
                                 {"lwide", REFIT_DTYPE_BF16, 2, {2, 69000}}};
    const uint64_t loff[4] = {0, 24064, 24064 + 2064, 24064 + 2064 + 2944};
    for (int i = 0; i < 4; i++) REFIT_ASSERT_OK(refit_manifest_add_local(m, &lt[i], region, loff[i], &l[i]));
    refit_tensor_info_t ct[5] = {{"a", REFIT_DTYPE_BF16, 2, {40, 100}},
                                 {"b", REFIT_DTYPE_BF16, 2, {40, 200}},
                                 {"v", REFIT_DTYPE_BF16, 1, {1000}},
                                 {"w", REFIT_DTYPE_F32, 2, {30, 24}},
                                 {"wide", REFIT_DTYPE_BF16, 2, {2, 70000}}};
    for (int i = 0; i < 5; i++) REFIT_ASSERT_OK(refit_manifest_add_canonical(m, &ct[i], &c[i]));
    refit_placement_t ps[5] = {
        {.canon = c[0], .local = l[0], .ndim = 2, .extent = {40, 100}, .local_offset = {0, 0}},
        {.canon = c[1], .local = l[0], .ndim = 2, .extent = {40, 200}, .local_offset = {0, 100}},
        {.canon = c[2], .local = l[1], .ndim = 1, .extent = {1000}},
        {.canon = c[3], .local = l[2], .ndim = 2, .extent = {30, 24}},
        {.canon = c[4], .local = l[3], .ndim = 2, .canon_offset = {0, 1000}, .extent = {2, 69000}},
    };
    for (int i = 0; i < 5; i++) REFIT_ASSERT_OK(refit_manifest_add_placement(m, &ps[i]));
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    return m;
}

/* refit_digest_table_update: the table of the old memory updated from the changed ranges equals the fill of
 * the new memory bit for bit, with every kernel: single bytes (low and high halves of units), units, ranges
 * that start and end inside units, that span rows, padding and placements side by side, long runs (the
 * kernels' path), rows across a key block, ranges covering unchanged bytes, out of order; a range outside
 * the region is refused and leaves the table unchanged; an uncovered change leaves a table that differs
 * from the fill (the test can fail). */
static void table_update(void **state)
{
    (void)state;
    refit_manifest_t *m = update_manifest();
    uint64_t size = refit_manifest_region_size(m, 0), tb = refit_digest_table_bytes(m);
    uint8_t *old = xmalloc(size), *nw = xmalloc(size);
    for (uint64_t i = 0; i < size; i++) old[i] = (uint8_t)rnd();
    memcpy(nw, old, size);
    refit_digest_range_t rg[400];
    size_t nr = 0;
    /* sparse: single bytes and single units anywhere (padding too) */
    for (int i = 0; i < 300; i++) {
        uint64_t off = rnd() % (size - 2), len = 1 + rnd() % 2;
        bool clash = false;
        for (size_t x = 0; x < nr; x++) clash |= off < rg[x].off + rg[x].len && rg[x].off < off + len;
        if (clash) continue;
        for (uint64_t b = 0; b < len; b++) nw[off + b] = (uint8_t)(nw[off + b] + 1 + rnd() % 255);
        rg[nr++] = (refit_digest_range_t){0, off, len};
    }
    /* runs: across the side-by-side rows (odd start and end), a long run inside "wide" across unit 65536,
     * the f32 box whole, a run that changes nothing */
    const uint64_t runs[][2] = {
        {601, 1799}, {24064 + 2064 + 2944 + 2 * 64000, 2 * 2000 + 1}, {24064 + 2064, 2880}, {24064 + 100, 300}};
    for (size_t r = 0; r < 4; r++) {
        uint64_t off = runs[r][0], len = runs[r][1];
        /* drop the sparse ranges it meets (ranges must not overlap) */
        size_t w = 0;
        for (size_t x = 0; x < nr; x++)
            if (!(off < rg[x].off + rg[x].len && rg[x].off < off + len)) rg[w++] = rg[x];
        nr = w;
        if (r < 3)
            for (uint64_t b = 0; b < len; b++) nw[off + b] = (uint8_t)rnd();
        rg[nr++] = (refit_digest_range_t){0, off, len};
    }
    for (refit_digest_impl_t im = REFIT_DIGEST_IMPL_SCALAR; im <= REFIT_DIGEST_IMPL_AVX512; im++) {
        if (!have_impl(im)) continue;
        refit_digest_key_t *k = key_impl(21, im);
        uint8_t *t = table_of(k, m, old, 1), *want = table_of(k, m, nw, 1), *keep = xmalloc(tb);
        const void *nb = nw, *ob = old;
        assert_memory_not_equal(t, want, tb);
        memcpy(keep, t, tb);
        refit_digest_range_t bad = {0, size - 4, 8};
        REFIT_ASSERT_ERR(refit_digest_table_update(k, m, &nb, &ob, &bad, 1, t), REFIT_ERR_INVALID_ARG,
                         "outside the manifest's regions");
        assert_memory_equal(t, keep, tb);
        /* out of order: the ranges reversed */
        refit_digest_range_t rev[400];
        for (size_t x = 0; x < nr; x++) rev[x] = rg[nr - 1 - x];
        REFIT_ASSERT_OK(refit_digest_table_update(k, m, &nb, &ob, im == REFIT_DIGEST_IMPL_AVX2 ? rev : rg, nr, t));
        assert_memory_equal(t, want, tb);
        /* and back: new -> old with the same ranges */
        REFIT_ASSERT_OK(refit_digest_table_update(k, m, &ob, &nb, rg, nr, t));
        assert_memory_equal(t, keep, tb);
        /* one changed range left out: the update is not the fill */
        REFIT_ASSERT_OK(refit_digest_table_update(k, m, &nb, &ob, rg, nr - 2, t));
        assert_memory_not_equal(t, want, tb);
        free(keep);
        free(want);
        free(t);
        refit_digest_key_destroy(k);
    }
    free(old);
    free(nw);
    refit_manifest_destroy(m);
}

/* The notes of changed units (refit_digest_changes_note_units), called as the encoder calls them (chunks of
 * 4096 units, offsets from the chunk), with every kernel: a row from (double) u * (1 / n) is one less than u / n
 * at some exact multiples (n = 49: u = 49, 98, ...), which the notes correct; rows of 1, 3, 49 and 1000 units,
 * a segment of 147,000 units (indices past 65,536, notes that start inside it);
 * every 5th unit, the region's first and last; the table equals a fill of the new memory. */
static void notes_of_units(void **state)
{
    (void)state;
    refit_manifest_identity_t id = {"m", "hand-notes", 0, 1};
    refit_manifest_t *m = NULL;
    REFIT_ASSERT_OK(refit_manifest_create(&id, &m));
    const uint64_t shape[5][2] = {{97, 49}, {50, 3}, {7, 1}, {33, 1000}, {3000, 49}};
    uint64_t off = 0;
    uint32_t region;
    REFIT_ASSERT_OK(refit_manifest_add_region(m, 2 * (97 * 49 + 50 * 3 + 7 + 33 * 1000 + 3000 * 49), &region));
    for (int i = 0; i < 5; i++) {
        char name[8];
        snprintf(name, sizeof name, "t%d", i);
        refit_tensor_info_t t = {name, REFIT_DTYPE_BF16, 2, {shape[i][0], shape[i][1]}};
        uint32_t l, c;
        REFIT_ASSERT_OK(refit_manifest_add_local(m, &t, region, off, &l));
        REFIT_ASSERT_OK(refit_manifest_add_canonical(m, &t, &c));
        refit_placement_t p = {.canon = c, .local = l, .ndim = 2, .extent = {shape[i][0], shape[i][1]}};
        REFIT_ASSERT_OK(refit_manifest_add_placement(m, &p));
        off += 2 * shape[i][0] * shape[i][1];
    }
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    uint64_t units = off / 2, tb = refit_digest_table_bytes(m);
    uint16_t *before = xmalloc(off), *now = xmalloc(off), *list = xmalloc(4096 * sizeof(uint16_t));
#if DIGEST_HAVE_AVX512
    if (have_impl(REFIT_DIGEST_IMPL_AVX512) && !digest_cpu_has_avx512dq())
        print_message("notes_of_units: no AVX-512 DQ here: the AVX-512 key's notes take the scalar path\n");
#endif
    for (refit_digest_impl_t im = REFIT_DIGEST_IMPL_SCALAR; im <= REFIT_DIGEST_IMPL_AVX512; im++) {
        if (!have_impl(im)) continue;
        for (uint64_t u = 0; u < units; u++) before[u] = now[u] = (uint16_t)rnd();
        refit_digest_key_t *k = key_impl(23, im);
        refit_digest_changes_t *C;
        REFIT_ASSERT_OK(refit_digest_changes_create(k, m, &C));
        uint8_t *t = table_of(k, m, before, 1);
        for (uint64_t u = 0; u < units; u++)
            if (u % 5 == 0 || u == units - 1) now[u] = (uint16_t)(now[u] + 1 + rnd() % 65535);
        for (uint64_t c0 = 0; c0 < units; c0 += 4096) {
            uint32_t n = 0;
            for (uint64_t u = c0; u < units && u < c0 + 4096; u++)
                if (now[u] != before[u]) list[n++] = (uint16_t)(u - c0);
            assert_true(refit_digest_changes_note_units(C, 0, 0, 2 * c0, list, n, now, before));
        }
        REFIT_ASSERT_OK(refit_digest_changes_apply(C, t));
        uint8_t *want = table_of(k, m, now, 1);
        assert_memory_equal(t, want, tb);
        free(want);
        free(t);
        refit_digest_changes_destroy(C);
        refit_digest_key_destroy(k);
    }
    free(list);
    free(now);
    free(before);
    refit_manifest_destroy(m);
}

/* The encoder's watcher: a failed note shows at the apply. */
static void note_change(void *ctx, unsigned w, uint32_t region, uint64_t off, uint64_t len, const uint16_t *units,
                        uint32_t n, const void *now, const void *before)
{
    if (units) (void)refit_digest_changes_note_units(ctx, w, region, off, units, n, now, before);
    else (void)refit_digest_changes_note(ctx, w, region, off, len, now, before);
}

/* A delta publisher's table (publisher.c): the delta encoder, on 3 threads, tells a refit_digest_changes_t the
 * bytes that changed as it encodes them; the table before plus those changes equals the fill of the new memory,
 * version after version, with every kernel: single units spread over the region (sparse chunks), a long range
 * of every byte (dense chunks, the kernels' path), a version with nothing changed, bytes in the padding, every
 * 7th unit with the region's first and last (full vectors of the AVX-512 notes, units sharing rows).  A note
 * outside its region fails, and so does the apply, leaving the table unchanged; a reset drops what was noted. */
static void table_from_encoder(void **state)
{
    (void)state;
    refit_manifest_t *m = update_manifest();
    uint64_t size = refit_manifest_region_size(m, 0), tb = refit_digest_table_bytes(m);
    uint8_t *mem = xmalloc(size), *alt = xmalloc(size), *keep = xmalloc(tb);
    for (refit_digest_impl_t im = REFIT_DIGEST_IMPL_SCALAR; im <= REFIT_DIGEST_IMPL_AVX512; im++) {
        if (!have_impl(im)) continue;
        for (uint64_t i = 0; i < size; i++) mem[i] = (uint8_t)rnd();
        refit_digest_key_t *k = key_impl(22, im);
        refit_digest_changes_t *C;
        REFIT_ASSERT_OK(refit_digest_changes_create(k, m, &C));
        refit_delta_params_t dp = {REFIT_DELTA_SPARSE, 0, 3};
        refit_delta_encoder_t *e;
        REFIT_ASSERT_OK(refit_delta_encoder_create(&size, 1, &dp, &e));
        refit_delta_encoder_watch(e, note_change, C);
        const void *bases[1] = {mem};
        void *d[1];
        size_t len[1];
        REFIT_ASSERT_OK(refit_delta_encoder_publish(e, bases, 1, d, len)); /* the first: a copy, no delta */
        uint8_t *t = table_of(k, m, mem, 1);
        for (uint64_t v = 2; v <= 6; v++) {
            if (v == 2 || v == 5) /* single units, some in the padding */
                for (int i = 0; i < 400; i++) mem[(rnd() % (size / 2)) * 2 + rnd() % 2] ^= (uint8_t)(1 + rnd() % 255);
            if (v == 3) /* every byte of a long range: dense chunks, across the side-by-side rows and key block */
                for (uint64_t i = 1001; i < size - 999; i++) mem[i] = (uint8_t)(mem[i] + 1 + rnd() % 255);
            if (v == 6) /* every 7th unit, the region's first and last: still sparse chunks, full vectors of units
                           that share rows, columns a row apart, and the units at the region's two ends */
                for (uint64_t u = 0; u < size / 2; u++)
                    if (u % 7 == 0 || u == size / 2 - 1) mem[2 * u + rnd() % 2] ^= (uint8_t)(1 + rnd() % 255);
            REFIT_ASSERT_OK(refit_delta_encoder_publish(e, bases, v, d, len));
            free(d[0]);
            REFIT_ASSERT_OK(refit_digest_changes_apply(C, t));
            uint8_t *want = table_of(k, m, mem, 1);
            assert_memory_equal(t, want, tb);
            free(want);
        }
        memcpy(keep, t, tb);
        assert_false(refit_digest_changes_note(C, 1, 0, size - 2, 8, mem, mem));
        REFIT_ASSERT_ERR(refit_digest_changes_apply(C, t), REFIT_ERR_NO_MEMORY, "outside its region");
        assert_memory_equal(t, keep, tb);
        memcpy(alt, mem, size);
        alt[24064 + 10] ^= 0x5a; /* a unit of the vector */
        assert_true(refit_digest_changes_note(C, 2, 0, 24064 + 10, 1, alt, mem));
        refit_digest_changes_reset(C);
        REFIT_ASSERT_OK(refit_digest_changes_apply(C, t));
        assert_memory_equal(t, keep, tb);
        assert_true(refit_digest_changes_note(C, 2, 0, 24064 + 10, 1, alt, mem)); /* and applied, it counts */
        REFIT_ASSERT_OK(refit_digest_changes_apply(C, t));
        assert_memory_not_equal(t, keep, tb);
        uint8_t *want = table_of(k, m, alt, 1);
        assert_memory_equal(t, want, tb);
        free(want);
        free(t);
        refit_delta_encoder_destroy(e);
        refit_digest_changes_destroy(C);
        refit_digest_key_destroy(k);
    }
    free(keep);
    free(alt);
    free(mem);
    refit_manifest_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(key_properties),
        cmocka_unit_test(kernels_agree),
        cmocka_unit_test(additivity),
        cmocka_unit_test(long_rows),
        cmocka_unit_test_setup_teardown(table_contents, rows4_keep, rows4_restore),
        cmocka_unit_test(long_row_tables),
        cmocka_unit_test(layout_pairs),
        cmocka_unit_test(fp8_arenas),
        cmocka_unit_test(stale_source),
        cmocka_unit_test(unusable_sources),
        cmocka_unit_test(unverifiable_cases),
        cmocka_unit_test(fetch_shape),
        cmocka_unit_test(errors),
        cmocka_unit_test(table_update),
        cmocka_unit_test(notes_of_units),
        cmocka_unit_test(table_from_encoder),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
