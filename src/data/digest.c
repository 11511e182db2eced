/* Layout-independent content digests (see digest.h for the mathematics).
 *
 * Everything reduces to one kernel: the keyed dot product of a row segment
 * with the column keys, per lane a sum of int16 x int16 products mod 2^32.
 * AVX2 computes 16 units per _mm256_madd_epi16 (pairwise products summed
 * into int32 lanes; its only overflow, 2 * (-32768)^2, wraps exactly as mod
 * 2^32 does), so the scalar reference works in uint32 and the two agree bit
 * for bit.  The receiver's box digest keeps the per-row dot products in
 * vector lanes and multiplies them by the row key there (sum over lanes is
 * linear), so a row costs no horizontal sum; the publisher needs each row's
 * total (P) and each column's row-weighted sum (Q), one pass over the rows.
 *
 * Work is split into items of whole rows of one placement (up to ITEM_BYTES)
 * that threads take from a shared counter; sums mod 2^32 do not depend on
 * the split, so results are identical for any thread count. */
#include "data/digest.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "layout/manifest.h"
#include "util/util.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define DIGEST_HAVE_AVX2 1
#include <immintrin.h>
#else
#define DIGEST_HAVE_AVX2 0
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "digest.c reads units and writes tables as little-endian host words"
#endif

#define KCOLS 65536u
#define ITEM_BYTES (512u << 10)
/* Software prefetch distance of the AVX2 loop: from memory, 1 thread on a
 * Xeon host, rows of 96..2048 units went from 7.6-9.4 GB/s (none) to
 * 11.9-13.0 GB/s (2048 bytes ahead; 1024: 11.2-12.4), the speed of a plain
 * read loop there (12-14 GB/s).  A prefetch never faults. */
#define PREFETCH_BYTES 2048
#define LOG_UNVERIFIABLE_MAX 16

struct refit_digest_key {
    int16_t kc[2][KCOLS]; /* column keys per lane (odd); lane 1 follows lane 0 (the kernel relies on it) */
    uint64_t tid_seed, row_seed;
    refit_digest_impl_t impl;
};

/* ------------------------------------------------------------------ keys */

static bool cpu_has_avx2(void)
{
#if DIGEST_HAVE_AVX2
    return __builtin_cpu_supports("avx2");
#else
    return false;
#endif
}

refit_status_t refit_digest_key_create_impl(const uint8_t key[32], refit_digest_impl_t impl, refit_digest_key_t **out)
{
    if (!key || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_key_create: NULL argument");
    if (impl == REFIT_DIGEST_IMPL_AUTO) impl = cpu_has_avx2() ? REFIT_DIGEST_IMPL_AVX2 : REFIT_DIGEST_IMPL_SCALAR;
    else if (impl == REFIT_DIGEST_IMPL_AVX2 && !cpu_has_avx2())
        return refit_error(REFIT_ERR_UNSUPPORTED, "digest: AVX2 kernel requested on a CPU or build without AVX2");
    else if (impl != REFIT_DIGEST_IMPL_SCALAR && impl != REFIT_DIGEST_IMPL_AVX2)
        return refit_error(REFIT_ERR_INVALID_ARG, "digest: unknown kernel %d", (int)impl);
    refit_digest_key_t *k = aligned_alloc(64, (sizeof(*k) + 63) / 64 * 64);
    if (!k) return refit_error(REFIT_ERR_NO_MEMORY, "digest key tables");
    /* Domain-separated seeds from the key. */
    k->tid_seed = refit_hash64(key, 32, 0x6469676573742d74ULL);
    k->row_seed = refit_hash64(key, 32, 0x6469676573742d72ULL);
    uint64_t cs = refit_hash64(key, 32, 0x6469676573742d63ULL);
    for (uint32_t j = 0; j < KCOLS; j++) {
        uint64_t x = refit_mix64(cs + (uint64_t)(j + 1) * 0x9e3779b97f4a7c15ULL);
        k->kc[0][j] = (int16_t)(uint16_t)((x & 0xffff) | 1);
        k->kc[1][j] = (int16_t)(uint16_t)(((x >> 32) & 0xffff) | 1);
    }
    k->impl = impl;
    *out = k;
    return REFIT_OK;
}

refit_status_t refit_digest_key_create(const uint8_t key[32], refit_digest_key_t **out)
{
    return refit_digest_key_create_impl(key, REFIT_DIGEST_IMPL_AUTO, out);
}

refit_digest_impl_t refit_digest_key_impl(const refit_digest_key_t *k) { return k->impl; }

void refit_digest_key_destroy(refit_digest_key_t *k) { free(k); }

uint64_t refit_digest_tensor_id(const refit_digest_key_t *k, const char *name)
{
    return refit_hash64(name, strlen(name), k->tid_seed);
}

static inline uint64_t row_hash(const refit_digest_key_t *k, uint64_t tid, uint64_t row)
{
    return refit_mix64((tid ^ k->row_seed) + row * 0x9e3779b97f4a7c15ULL);
}

refit_dsum_t refit_digest_row_key(const refit_digest_key_t *k, uint64_t tid, uint64_t row)
{
    uint64_t h = row_hash(k, tid, row);
    return (refit_dsum_t){{(uint32_t)h | 1, (uint32_t)(h >> 32) | 1}};
}

/* --------------------------------------------------------- scalar kernels */

static inline uint32_t unit_at(const uint8_t *p, uint64_t t)
{
    return (uint32_t)(int32_t)(int16_t)(uint16_t)(p[2 * t] | (unsigned)p[2 * t + 1] << 8);
}

/* s += sum_{t<n} K[(j+t) mod 65536] * v_t, per lane. */
static void dot_scalar(const refit_digest_key_t *k, const uint8_t *p, uint64_t j, uint64_t n, uint32_t s[2])
{
    uint32_t a0 = 0, a1 = 0;
    for (uint64_t t = 0; t < n; t++) {
        uint32_t v = unit_at(p, t);
        size_t jj = (size_t)((j + t) & (KCOLS - 1));
        a0 += (uint32_t)(int32_t)k->kc[0][jj] * v;
        a1 += (uint32_t)(int32_t)k->kc[1][jj] * v;
    }
    s[0] += a0;
    s[1] += a1;
}

static void rows_scalar(const refit_digest_key_t *k, uint64_t tid, uint64_t row, uint64_t nrows, uint64_t j,
                        const uint8_t *p, uint64_t stride, uint64_t n, uint32_t acc[2])
{
    for (uint64_t i = 0; i < nrows; i++) {
        uint32_t s[2] = {0, 0};
        dot_scalar(k, p + i * stride, j, n, s);
        uint64_t h = row_hash(k, tid, row + i);
        acc[0] += ((uint32_t)h | 1) * s[0];
        acc[1] += ((uint32_t)(h >> 32) | 1) * s[1];
    }
}

/* One publisher row: returns the row's dot (lanes) and adds r * v_t into
 * g0[t], g1[t]. */
static void pub_row_scalar(const refit_digest_key_t *k, const uint8_t *p, uint64_t j, uint64_t n, uint32_t r0,
                           uint32_t r1, uint32_t *g0, uint32_t *g1, uint32_t s[2])
{
    dot_scalar(k, p, j, n, s);
    for (uint64_t t = 0; t < n; t++) {
        uint32_t v = unit_at(p, t);
        g0[t] += r0 * v;
        g1[t] += r1 * v;
    }
}

/* ----------------------------------------------------------- AVX2 kernels */

#if DIGEST_HAVE_AVX2
#if defined(__clang__)
#define AVX2 __attribute__((target("avx2")))
#else
/* GCC 12's partial redundancy elimination turns the madd loop's four
 * accumulators into register copies and a reload (13 -> 18 uops a
 * 32-unit step, measured with objdump); without it the loop is minimal. */
#define AVX2 __attribute__((target("avx2"), optimize("no-tree-pre")))
#endif
#define AVX2_INLINE __attribute__((target("avx2"), always_inline)) static inline

/* mask + r (r = 1..15): 16 - r zero lanes, then r all-ones lanes. */
static const int16_t g_tail_mask[32] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};

AVX2_INLINE uint32_t hsum_avx2(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(s);
}

/* *a0, *a1 (int32 lanes) += the products of units [0,len) at p with the
 * column keys at k0 (lane 1's are KCOLS entries further); 16 <= len and the
 * keys do not wrap.  Plain base + displacement addressing (lane 1's keys at a
 * constant distance) keeps every load micro-fused into its madd. */
AVX2_INLINE void seg_avx2(const int16_t *k0, const uint8_t *p, uint64_t len, __m256i *a0, __m256i *a1)
{
    __m256i s0 = *a0, s1 = *a1, u0 = _mm256_setzero_si256(), u1 = _mm256_setzero_si256();
    const uint8_t *end2 = p + 2 * (len & ~(uint64_t)31);
    for (; p < end2; p += 64, k0 += 32) {
        _mm_prefetch((const char *)p + PREFETCH_BYTES, _MM_HINT_T0);
        __m256i v = _mm256_loadu_si256((const __m256i *)p), w = _mm256_loadu_si256((const __m256i *)(p + 32));
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(v, _mm256_loadu_si256((const __m256i *)k0)));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(v, _mm256_loadu_si256((const __m256i *)(k0 + KCOLS))));
        u0 = _mm256_add_epi32(u0, _mm256_madd_epi16(w, _mm256_loadu_si256((const __m256i *)(k0 + 16))));
        u1 = _mm256_add_epi32(u1, _mm256_madd_epi16(w, _mm256_loadu_si256((const __m256i *)(k0 + KCOLS + 16))));
    }
    uint64_t rest = len & 31;
    if (rest >= 16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)p);
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(v, _mm256_loadu_si256((const __m256i *)k0)));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(v, _mm256_loadu_si256((const __m256i *)(k0 + KCOLS))));
        p += 32;
        k0 += 16;
        rest -= 16;
    }
    if (rest) {
        /* The last 16 units again, with the keys of the units already
         * counted masked to zero (reads stay inside the row). */
        __m256i m = _mm256_loadu_si256((const __m256i *)(g_tail_mask + rest));
        __m256i v = _mm256_loadu_si256((const __m256i *)(p - 2 * (16 - rest)));
        const int16_t *kb = k0 - (16 - rest);
        u0 = _mm256_add_epi32(u0, _mm256_madd_epi16(v, _mm256_and_si256(m, _mm256_loadu_si256((const __m256i *)kb))));
        u1 = _mm256_add_epi32(
            u1, _mm256_madd_epi16(v, _mm256_and_si256(m, _mm256_loadu_si256((const __m256i *)(kb + KCOLS)))));
    }
    *a0 = _mm256_add_epi32(s0, u0);
    *a1 = _mm256_add_epi32(s1, u1);
}

/* *a0, *a1 (int32 lanes) += the products of units [0,n) at p with
 * K[j..j+n) mod 65536; the lanes' sum is the dot product mod 2^32. */
AVX2_INLINE void dot_avx2(const refit_digest_key_t *k, const uint8_t *p, uint64_t j, uint64_t n, __m256i *a0,
                          __m256i *a1)
{
    while (n) {
        uint64_t jj = j & (KCOLS - 1), len = REFIT_MIN(n, KCOLS - jj);
        if (len >= 16) {
            seg_avx2(k->kc[0] + jj, p, len, a0, a1);
        } else {
            uint32_t s[2] = {0, 0};
            dot_scalar(k, p, jj, len, s);
            *a0 = _mm256_add_epi32(*a0, _mm256_setr_epi32((int32_t)s[0], 0, 0, 0, 0, 0, 0, 0));
            *a1 = _mm256_add_epi32(*a1, _mm256_setr_epi32((int32_t)s[1], 0, 0, 0, 0, 0, 0, 0));
        }
        p += 2 * len;
        j += len;
        n -= len;
    }
}

AVX2 static void dot_total_avx2(const refit_digest_key_t *k, const uint8_t *p, uint64_t j, uint64_t n, uint32_t s[2])
{
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    dot_avx2(k, p, j, n, &a0, &a1);
    s[0] += hsum_avx2(a0);
    s[1] += hsum_avx2(a1);
}

AVX2 static void rows_avx2(const refit_digest_key_t *k, uint64_t tid, uint64_t row, uint64_t nrows, uint64_t j,
                           const uint8_t *p, uint64_t stride, uint64_t n, uint32_t acc[2])
{
    __m256i t0 = _mm256_setzero_si256(), t1 = _mm256_setzero_si256();
    for (uint64_t i = 0; i < nrows; i++) {
        __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
        dot_avx2(k, p + i * stride, j, n, &a0, &a1);
        uint64_t h = row_hash(k, tid, row + i);
        t0 = _mm256_add_epi32(t0, _mm256_mullo_epi32(a0, _mm256_set1_epi32((int32_t)((uint32_t)h | 1))));
        t1 = _mm256_add_epi32(t1, _mm256_mullo_epi32(a1, _mm256_set1_epi32((int32_t)((uint32_t)(h >> 32) | 1))));
    }
    acc[0] += hsum_avx2(t0);
    acc[1] += hsum_avx2(t1);
}

AVX2 static void pub_row_avx2(const refit_digest_key_t *k, const uint8_t *p, uint64_t j, uint64_t n, uint32_t r0,
                              uint32_t r1, uint32_t *g0, uint32_t *g1, uint32_t s[2])
{
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    dot_avx2(k, p, j, n, &a0, &a1);
    s[0] += hsum_avx2(a0);
    s[1] += hsum_avx2(a1);
    __m256i rv0 = _mm256_set1_epi32((int32_t)r0), rv1 = _mm256_set1_epi32((int32_t)r1);
    uint64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256i v = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(p + 2 * t)));
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(g0 + t)), x1 = _mm256_loadu_si256((const __m256i *)(g1 + t));
        _mm256_storeu_si256((__m256i *)(g0 + t), _mm256_add_epi32(x0, _mm256_mullo_epi32(v, rv0)));
        _mm256_storeu_si256((__m256i *)(g1 + t), _mm256_add_epi32(x1, _mm256_mullo_epi32(v, rv1)));
    }
    for (; t < n; t++) {
        uint32_t v = unit_at(p, t);
        g0[t] += r0 * v;
        g1[t] += r1 * v;
    }
}
#endif

/* ------------------------------------------------------- low-level API */

static void rows_any(const refit_digest_key_t *k, uint64_t tid, uint64_t row, uint64_t nrows, uint64_t j,
                     const uint8_t *p, uint64_t stride, uint64_t n, uint32_t acc[2])
{
#if DIGEST_HAVE_AVX2
    if (k->impl == REFIT_DIGEST_IMPL_AVX2) {
        rows_avx2(k, tid, row, nrows, j, p, stride, n, acc);
        return;
    }
#endif
    rows_scalar(k, tid, row, nrows, j, p, stride, n, acc);
}

static void pub_row_any(const refit_digest_key_t *k, const uint8_t *p, uint64_t j, uint64_t n, uint32_t r0,
                        uint32_t r1, uint32_t *g0, uint32_t *g1, uint32_t s[2])
{
#if DIGEST_HAVE_AVX2
    if (k->impl == REFIT_DIGEST_IMPL_AVX2) {
        pub_row_avx2(k, p, j, n, r0, r1, g0, g1, s);
        return;
    }
#endif
    pub_row_scalar(k, p, j, n, r0, r1, g0, g1, s);
}

refit_dsum_t refit_digest_dot(const refit_digest_key_t *k, const void *units, uint64_t first_unit, uint64_t n)
{
    refit_dsum_t d = {{0, 0}};
#if DIGEST_HAVE_AVX2
    if (k->impl == REFIT_DIGEST_IMPL_AVX2) {
        dot_total_avx2(k, units, first_unit, n, d.lane);
        return d;
    }
#endif
    dot_scalar(k, units, first_unit, n, d.lane);
    return d;
}

void refit_digest_span(const refit_digest_key_t *k, uint64_t tid, uint64_t row, uint64_t first_unit, const void *p,
                       uint64_t n, refit_dsum_t *acc)
{
    rows_any(k, tid, row, 1, first_unit, p, 0, n, acc->lane);
}

void refit_digest_rows(const refit_digest_key_t *k, uint64_t tid, uint64_t row, uint64_t nrows, uint64_t first_unit,
                       const void *p, uint64_t stride, uint64_t n, refit_dsum_t *acc)
{
    rows_any(k, tid, row, nrows, first_unit, p, stride, n, acc->lane);
}

/* ------------------------------------------------ canonical geometry */

/* A placement's box in canonical units: rows [a, a+nrows), units [c, c+n)
 * of a tensor of R rows by U units. */
typedef struct {
    uint64_t R, U, a, nrows, c, n;
} cbox_t;

static refit_digest_reason_t cbox_of(const refit_tdesc_t *t, const refit_placement_t *p, cbox_t *b)
{
    if (t->ndim > 2) return REFIT_DIGEST_UNV_NDIM;
    uint64_t es = refit_dtype_size(t->dtype);
    uint32_t last = t->ndim - 1;
    uint64_t rowb = t->shape[last] * es, cb = p->canon_offset[last] * es, wb = p->extent[last] * es;
    if (es == 0 || ((rowb | cb | wb) & 1)) return REFIT_DIGEST_UNV_ODD_BYTES;
    b->R = t->ndim == 2 ? t->shape[0] : 1;
    b->U = rowb / 2;
    b->a = t->ndim == 2 ? p->canon_offset[0] : 0;
    b->nrows = t->ndim == 2 ? p->extent[0] : 1;
    b->c = cb / 2;
    b->n = wb / 2;
    return REFIT_DIGEST_VERIFIABLE;
}

static bool cbox_full_rows(const cbox_t *b) { return b->c == 0 && b->n == b->U; }
static bool cbox_all_rows(const cbox_t *b) { return b->a == 0 && b->nrows == b->R; }

static uint64_t table_entries(const cbox_t *b) { return b->nrows + 1 + b->n + 1; }

uint64_t refit_digest_table_offsets(const refit_manifest_t *m, uint64_t *offsets)
{
    if (!m || !m->finalized) return 0;
    uint64_t off = 0;
    for (size_t i = 0; i < m->placements.len; i++) {
        const refit_placement_t *p = &m->placements.data[i];
        cbox_t b;
        if (cbox_of(&m->canon.data[p->canon], p, &b) != REFIT_DIGEST_VERIFIABLE) {
            if (offsets) offsets[i] = UINT64_MAX;
            continue;
        }
        if (offsets) offsets[i] = off;
        off += table_entries(&b) * 8;
    }
    return off;
}

uint64_t refit_digest_table_bytes(const refit_manifest_t *m) { return refit_digest_table_offsets(m, NULL); }

/* Byte offset of the box's first unit in its region, and the bytes between its rows. */
static uint64_t box_offset(const refit_manifest_t *m, const refit_placement_t *p, uint64_t *stride)
{
    const refit_local_t *l = &m->locals.data[p->local];
    uint64_t es = refit_dtype_size(l->d.dtype), lst[REFIT_MAX_DIMS];
    refit_tdesc_strides(&l->d, lst);
    *stride = p->ndim == 2 ? lst[l->d.ndim - 2] * es : 0;
    return l->offset + refit_placement_local_index(m, p, p->canon_offset) * es;
}

/* Address of the box's first unit and the bytes between its rows. */
static const uint8_t *box_memory(const refit_manifest_t *m, const refit_placement_t *p, const void *const *bases,
                                 uint64_t *stride)
{
    return (const uint8_t *)bases[m->locals.data[p->local].region] + box_offset(m, p, stride);
}

/* ------------------------------------------------ work items and threads */

/* Rows [rel, rel+nrows) of the box of placement pl. */
typedef struct {
    const uint8_t *p; /* first unit of the item's first row */
    uint64_t stride, tid, row, nrows, j, n, rel;
    uint32_t pl;
    bool whole; /* the item is its placement's whole box */
} item_t;

typedef REFIT_VEC(item_t) items_t;

/* Splits a box into items of about ITEM_BYTES (whole rows). */
static int push_items(items_t *v, uint32_t pl, const cbox_t *b, uint64_t tid, const uint8_t *p, uint64_t stride)
{
    uint64_t rowb = REFIT_MAX(b->n * 2, 1), per = REFIT_MAX(ITEM_BYTES / rowb, 1);
    for (uint64_t r = 0; r < b->nrows; r += per) {
        item_t it = {.p = p + r * stride, .stride = stride, .tid = tid, .row = b->a + r,
                     .nrows = REFIT_MIN(per, b->nrows - r), .j = b->c, .n = b->n, .rel = r, .pl = pl,
                     .whole = per >= b->nrows};
        if (REFIT_VEC_PUSH(v, it)) return -1;
    }
    return 0;
}

static size_t next_index(size_t *counter) { return __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED); }

/* ------------------------------------------------------ receiver's own */

typedef struct {
    const refit_digest_key_t *k;
    const item_t *items;
    size_t nitems, next;
    refit_dsum_t *part; /* per item */
} local_job_t;

static void *local_worker(void *arg)
{
    local_job_t *J = arg;
    for (size_t i; (i = next_index(&J->next)) < J->nitems;) {
        const item_t *it = &J->items[i];
        rows_any(J->k, it->tid, it->row, it->nrows, it->j, it->p, it->stride, it->n, J->part[i].lane);
    }
    return NULL;
}

/* Keyed ids of every canonical tensor of m (malloc'ed). */
static uint64_t *tensor_ids(const refit_digest_key_t *k, const refit_manifest_t *m)
{
    uint64_t *t = malloc(REFIT_MAX(m->canon.len, 1) * sizeof(*t));
    if (t)
        for (size_t c = 0; c < m->canon.len; c++) t[c] = refit_digest_tensor_id(k, m->canon.data[c].name);
    return t;
}

refit_status_t refit_digest_local(const refit_digest_key_t *k, const refit_manifest_t *dst, const void *const *bases,
                                  refit_dsum_t *out, unsigned threads)
{
    if (!k || !dst || !bases || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_local: NULL argument");
    if (!dst->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_local: manifest is not finalized");
    refit_status_t st = REFIT_OK;
    items_t items = {0};
    refit_dsum_t *part = NULL;
    uint64_t *tids = tensor_ids(k, dst);
    if (!tids) goto oom;
    for (uint32_t i = 0; i < dst->placements.len; i++) {
        const refit_placement_t *p = &dst->placements.data[i];
        cbox_t b;
        if (cbox_of(&dst->canon.data[p->canon], p, &b) != REFIT_DIGEST_VERIFIABLE) continue;
        if (!cbox_full_rows(&b) && !cbox_all_rows(&b)) continue;
        uint64_t stride;
        const uint8_t *mem = box_memory(dst, p, bases, &stride);
        if (push_items(&items, i, &b, tids[p->canon], mem, stride)) goto oom;
    }
    part = calloc(REFIT_MAX(items.len, 1), sizeof(*part));
    if (!part) goto oom;
    local_job_t J = {.k = k, .items = items.data, .nitems = items.len, .part = part};
    if (items.len <= 1) threads = 1;
    refit_run_threads(local_worker, &J, threads);
    memset(out, 0, dst->placements.len * sizeof(*out));
    for (size_t i = 0; i < items.len; i++) {
        out[items.data[i].pl].lane[0] += part[i].lane[0];
        out[items.data[i].pl].lane[1] += part[i].lane[1];
    }
    goto done;
oom:
    st = refit_error(REFIT_ERR_NO_MEMORY, "digest: work list of %u placements", (unsigned)dst->placements.len);
done:
    free(part);
    REFIT_VEC_FREE(&items);
    free(tids);
    return st;
}

/* ------------------------------------------------------------ publisher */

typedef struct {
    const refit_digest_key_t *k;
    const item_t *items;
    size_t nitems, next;
    uint32_t *table;        /* entries: 2 uint32 each */
    const uint64_t *offs;   /* per placement: P offset (bytes) */
    const cbox_t *boxes;    /* per placement */
    uint64_t max_n;
    /* finalize phase */
    const uint32_t *pls;    /* digestible placements */
    size_t npls, next_pl;
    int failed;             /* a worker's scratch allocation failed */
    size_t bad_pl;          /* SIZE_MAX or a placement whose P and Q totals differ */
} fill_job_t;

static void *fill_worker(void *arg)
{
    fill_job_t *J = arg;
    uint32_t *g = malloc(REFIT_MAX(J->max_n, 1) * 2 * sizeof(uint32_t));
    if (!g) {
        __atomic_store_n(&J->failed, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    for (size_t i; (i = next_index(&J->next)) < J->nitems;) {
        const item_t *it = &J->items[i];
        uint32_t *g0 = g, *g1 = g + it->n;
        memset(g, 0, it->n * 2 * sizeof(uint32_t));
        uint32_t *P = J->table + J->offs[it->pl] / 4;
        uint32_t *Q = P + 2 * (J->boxes[it->pl].nrows + 1);
        for (uint64_t r = 0; r < it->nrows; r++) {
            uint64_t h = row_hash(J->k, it->tid, it->row + r);
            uint32_t r0 = (uint32_t)h | 1, r1 = (uint32_t)(h >> 32) | 1, s[2] = {0, 0};
            pub_row_any(J->k, it->p + r * it->stride, it->j, it->n, r0, r1, g0, g1, s);
            P[2 * (it->rel + r + 1)] = r0 * s[0];
            P[2 * (it->rel + r + 1) + 1] = r1 * s[1];
        }
        if (it->whole) {
            for (uint64_t t = 0; t < it->n; t++) {
                Q[2 * (t + 1)] = g0[t];
                Q[2 * (t + 1) + 1] = g1[t];
            }
        } else {
            for (uint64_t t = 0; t < it->n; t++) {
                __atomic_fetch_add(&Q[2 * (t + 1)], g0[t], __ATOMIC_RELAXED);
                __atomic_fetch_add(&Q[2 * (t + 1) + 1], g1[t], __ATOMIC_RELAXED);
            }
        }
    }
    free(g);
    return NULL;
}

/* P: row terms -> prefix sums.  Q: column sums gamma_j -> prefix sums of K[j] * gamma_j. */
static void *finalize_worker(void *arg)
{
    fill_job_t *J = arg;
    const refit_digest_key_t *k = J->k;
    for (size_t x; (x = next_index(&J->next_pl)) < J->npls;) {
        uint32_t pl = J->pls[x];
        const cbox_t *b = &J->boxes[pl];
        uint32_t *P = J->table + J->offs[pl] / 4, *Q = P + 2 * (b->nrows + 1);
        uint32_t s0 = 0, s1 = 0;
        P[0] = P[1] = 0;
        for (uint64_t r = 1; r <= b->nrows; r++) {
            s0 += P[2 * r];
            s1 += P[2 * r + 1];
            P[2 * r] = s0;
            P[2 * r + 1] = s1;
        }
        uint32_t q0 = 0, q1 = 0;
        Q[0] = Q[1] = 0;
        for (uint64_t t = 0; t < b->n; t++) {
            size_t jj = (size_t)((b->c + t) & (KCOLS - 1));
            q0 += (uint32_t)(int32_t)k->kc[0][jj] * Q[2 * (t + 1)];
            q1 += (uint32_t)(int32_t)k->kc[1][jj] * Q[2 * (t + 1) + 1];
            Q[2 * (t + 1)] = q0;
            Q[2 * (t + 1) + 1] = q1;
        }
        if (q0 != s0 || q1 != s1) {
            size_t none = SIZE_MAX;
            __atomic_compare_exchange_n(&J->bad_pl, &none, (size_t)pl, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

refit_status_t refit_digest_table_fill(const refit_digest_key_t *k, const refit_manifest_t *m, const void *const *bases,
                                       void *table, unsigned threads)
{
    if (!k || !m || !bases || (!table && refit_digest_table_bytes(m)))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_table_fill: NULL argument");
    if (!m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_table_fill: manifest is not finalized");
    if ((uintptr_t)table % 8) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_table_fill: table not 8-byte aligned");
    refit_status_t st = REFIT_OK;
    size_t np = m->placements.len;
    items_t items = {0};
    uint64_t *offs = malloc(REFIT_MAX(np, 1) * sizeof(*offs));
    cbox_t *boxes = calloc(REFIT_MAX(np, 1), sizeof(*boxes));
    uint32_t *pls = malloc(REFIT_MAX(np, 1) * sizeof(*pls));
    uint64_t *tids = tensor_ids(k, m);
    if (!offs || !boxes || !pls || !tids) goto oom;
    refit_digest_table_offsets(m, offs);
    size_t npls = 0;
    uint64_t max_n = 0;
    for (uint32_t i = 0; i < np; i++) {
        if (offs[i] == UINT64_MAX) continue;
        const refit_placement_t *p = &m->placements.data[i];
        cbox_of(&m->canon.data[p->canon], p, &boxes[i]);
        uint64_t stride;
        const uint8_t *mem = box_memory(m, p, bases, &stride);
        size_t first = items.len;
        if (push_items(&items, i, &boxes[i], tids[p->canon], mem, stride)) goto oom;
        if (items.len - first > 1) /* several items add into the Q slots */
            memset((uint8_t *)table + offs[i] + (boxes[i].nrows + 1) * 8, 0, (boxes[i].n + 1) * 8);
        max_n = REFIT_MAX(max_n, boxes[i].n);
        pls[npls++] = i;
    }
    fill_job_t J = {.k = k, .items = items.data, .nitems = items.len, .table = table, .offs = offs, .boxes = boxes,
                    .max_n = max_n, .pls = pls, .npls = npls, .bad_pl = SIZE_MAX};
    unsigned t1 = threads, t2 = threads;
    if (items.len <= 1) t1 = 1;
    if (npls <= 1) t2 = 1;
    refit_run_threads(fill_worker, &J, t1);
    if (J.failed) goto oom;
    refit_run_threads(finalize_worker, &J, t2);
    if (J.bad_pl != SIZE_MAX) {
        const refit_placement_t *p = &m->placements.data[J.bad_pl];
        st = refit_error(REFIT_ERR_INTERNAL,
                         "digest table of %s rank %u: placement %zu (%s) sums differently by rows and by columns: "
                         "its memory changed during the fill",
                         m->layout, m->rank, J.bad_pl, m->canon.data[p->canon].name);
    }
    goto done;
oom:
    st = refit_error(REFIT_ERR_NO_MEMORY, "digest table of %s rank %u: work list", m->layout, m->rank);
done:
    REFIT_VEC_FREE(&items);
    free(offs);
    free(boxes);
    free(pls);
    free(tids);
    return st;
}

/* ------------------------------------------------------------ the plan */

static const char *const g_reason_names[REFIT_DIGEST_REASON_COUNT] = {
    "verifiable", "ndim>=3", "odd-bytes", "cut-both", "no-partition", "source-box"};

const char *refit_digest_reason_name(refit_digest_reason_t r)
{
    return (unsigned)r < REFIT_DIGEST_REASON_COUNT ? g_reason_names[r] : "unknown";
}

typedef struct {
    uint32_t fetch;
    int32_t sign; /* +1 or -1 */
} term_t;

struct refit_digest_plan {
    uint32_t n;            /* destination placements */
    uint8_t *reason;       /* per placement */
    uint64_t *bytes;       /* per placement */
    uint32_t *canon;       /* per placement: destination canonical id */
    refit_box_t *boxes;    /* per placement: canonical box */
    uint32_t *term_start;  /* n + 1 */
    term_t *terms;
    refit_digest_fetch_t *fetches;
    size_t nfetches;
    char **names; /* destination canonical names */
    uint32_t ncanon;
    refit_digest_plan_stats_t stats;
};

/* A source box of a destination canonical tensor. */
typedef struct {
    uint32_t canon; /* destination canonical id */
    uint32_t src, pl;
    refit_box_t box;
    cbox_t cb;
    uint64_t poff; /* P array in the source's table; UINT64_MAX: not digestible */
} cand_t;
typedef REFIT_VEC(cand_t) cands_t;

static int cmp_box(const refit_box_t *a, const refit_box_t *b)
{
    for (uint32_t d = 0; d < a->ndim; d++) {
        if (a->off[d] != b->off[d]) return a->off[d] < b->off[d] ? -1 : 1;
        if (a->ext[d] != b->ext[d]) return a->ext[d] < b->ext[d] ? -1 : 1;
    }
    return 0;
}

static int cmp_cand(const void *x, const void *y)
{
    const cand_t *a = x, *b = y;
    if (a->canon != b->canon) return a->canon < b->canon ? -1 : 1;
    int c = cmp_box(&a->box, &b->box);
    if (c) return c;
    if (a->src != b->src) return a->src < b->src ? -1 : 1;
    return a->pl < b->pl ? -1 : (a->pl > b->pl);
}

typedef struct {
    uint32_t src, pl; /* the destination placement (pl) that needs it */
    uint64_t off;
    int32_t sign;
} rawterm_t;
typedef REFIT_VEC(rawterm_t) rawterms_t;

static int cmp_fetch(const void *x, const void *y)
{
    const refit_digest_fetch_t *a = x, *b = y;
    if (a->src != b->src) return a->src < b->src ? -1 : 1;
    return a->offset < b->offset ? -1 : (a->offset > b->offset);
}

static bool same_desc(const refit_tdesc_t *a, const refit_tdesc_t *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (uint32_t d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

static refit_box_t placement_box(const refit_placement_t *p)
{
    refit_box_t b = {.ndim = p->ndim};
    for (uint32_t d = 0; d < p->ndim; d++) {
        b.off[d] = p->canon_offset[d];
        b.ext[d] = p->extent[d];
    }
    return b;
}

void refit_digest_plan_destroy(refit_digest_plan_t *p)
{
    if (!p) return;
    if (p->names)
        for (uint32_t c = 0; c < p->ncanon; c++) free(p->names[c]);
    free(p->names);
    free(p->reason);
    free(p->bytes);
    free(p->canon);
    free(p->boxes);
    free(p->term_start);
    free(p->terms);
    free(p->fetches);
    free(p);
}

/* Collects the usable source boxes of the destination's tensors, sorted by
 * tensor then box then source. */
static refit_status_t gather(const refit_manifest_t *const *srcs, size_t nsrcs, const uint8_t *usable,
                             const refit_manifest_t *dst, cands_t *out)
{
    for (size_t s = 0; s < nsrcs; s++) {
        const refit_manifest_t *m = srcs[s];
        if (!m || (usable && !usable[s])) continue;
        uint64_t *offs = malloc(REFIT_MAX(m->placements.len, 1) * sizeof(*offs));
        uint32_t *map = malloc(REFIT_MAX(m->canon.len, 1) * sizeof(*map));
        if (!offs || !map) {
            free(offs);
            free(map);
            return refit_error(REFIT_ERR_NO_MEMORY, "digest plan: source %zu", s);
        }
        refit_status_t st = REFIT_OK;
        for (size_t c = 0; c < m->canon.len && !st; c++) {
            uint32_t d;
            map[c] = UINT32_MAX;
            if (!refit_strmap_get(&dst->canon_index, m->canon.data[c].name, &d)) continue;
            if (!same_desc(&m->canon.data[c], &dst->canon.data[d]))
                st = refit_error(REFIT_ERR_MISMATCH, "digest plan: tensor %s differs in dtype or shape between source %zu "
                                 "(%s rank %u) and the destination", m->canon.data[c].name, s, m->layout, m->rank);
            map[c] = d;
        }
        refit_digest_table_offsets(m, offs);
        for (uint32_t i = 0; i < m->placements.len && !st; i++) {
            const refit_placement_t *p = &m->placements.data[i];
            if (map[p->canon] == UINT32_MAX) continue;
            cand_t c = {.canon = map[p->canon], .src = (uint32_t)s, .pl = i, .box = placement_box(p), .poff = offs[i]};
            cbox_of(&m->canon.data[p->canon], p, &c.cb);
            if (REFIT_VEC_PUSH(out, c)) st = refit_error(REFIT_ERR_NO_MEMORY, "digest plan: source boxes");
        }
        free(offs);
        free(map);
        if (st) return st;
    }
    if (out->len) qsort(out->data, out->len, sizeof(cand_t), cmp_cand);
    return REFIT_OK;
}

/* Whether the distinct usable source boxes of a tensor partition it. */
enum { PART_OK = 0, PART_VOLUME = 1, PART_OVERLAP = 2 };

/* Keeps one box of every run of identical boxes (the lowest source) and
 * checks, per tensor, that the distinct boxes partition it.  Fills start
 * (ncanon + 1, CSR over the compacted candidates), part[canon] (PART_*) and
 * vol[canon] (elements the distinct boxes hold). */
static refit_status_t dedupe_and_partition(const refit_manifest_t *dst, cand_t *c, size_t *nc, uint32_t *start,
                                           uint8_t *part, uint64_t *vols)
{
    size_t w = 0, n = *nc;
    for (size_t r = 0; r < n; r++)
        if (w == 0 || c[w - 1].canon != c[r].canon || cmp_box(&c[w - 1].box, &c[r].box)) c[w++] = c[r];
    *nc = w;
    uint32_t ncanon = (uint32_t)dst->canon.len;
    memset(start, 0, (ncanon + 1) * sizeof(*start));
    for (size_t i = 0; i < w; i++) start[c[i].canon + 1]++;
    for (uint32_t t = 0; t < ncanon; t++) start[t + 1] += start[t];
    refit_box_t *boxes = malloc(REFIT_MAX(w, 1) * sizeof(*boxes));
    uint32_t *groups = calloc(REFIT_MAX(w, 1), sizeof(*groups));
    if (!boxes || !groups) {
        free(boxes);
        free(groups);
        return refit_error(REFIT_ERR_NO_MEMORY, "digest plan: partition check");
    }
    refit_status_t st = REFIT_OK;
    for (uint32_t t = 0; t < ncanon && !st; t++) {
        const refit_tdesc_t *d = &dst->canon.data[t];
        uint64_t numel = 1, vol = 0;
        for (uint32_t k = 0; k < d->ndim; k++) numel *= d->shape[k];
        size_t m = 0;
        for (uint32_t i = start[t]; i < start[t + 1]; i++) {
            boxes[m++] = c[i].box;
            if (!refit_add_u64(vol, refit_box_volume(&c[i].box), &vol)) vol = UINT64_MAX;
        }
        part[t] = vol == numel ? PART_OK : PART_VOLUME;
        vols[t] = vol;
        if (part[t] == PART_OK && m > 1) {
            size_t i, j;
            int err = 0;
            if (refit_boxes_find_overlap(boxes, groups, m, &i, &j, &err)) part[t] = PART_OVERLAP;
            if (err) st = refit_error(REFIT_ERR_NO_MEMORY, "digest plan: partition check");
        }
    }
    free(boxes);
    free(groups);
    return st;
}

/* The P (rows) or Q (columns) entry x of a source box, Q's last as P's last. */
static uint64_t entry_offset(const cand_t *s, bool by_rows, uint64_t x)
{
    if (by_rows || x == s->cb.n) return s->poff + (by_rows ? x : s->cb.nrows) * 8;
    return s->poff + (s->cb.nrows + 1 + x) * 8;
}

static refit_digest_reason_t plan_placement(const refit_manifest_t *dst, uint32_t i, const cand_t *cands,
                                            const uint32_t *start, const uint8_t *part, rawterms_t *terms,
                                            int *oom)
{
    const refit_placement_t *p = &dst->placements.data[i];
    cbox_t b;
    refit_digest_reason_t r = cbox_of(&dst->canon.data[p->canon], p, &b);
    if (r) return r;
    bool by_rows = cbox_full_rows(&b);
    if (!by_rows && !cbox_all_rows(&b)) return REFIT_DIGEST_UNV_CUT_BOTH;
    if (part[p->canon] != PART_OK) return REFIT_DIGEST_UNV_NO_PARTITION;
    size_t mark = terms->len;
    refit_box_t db = placement_box(p), x;
    for (uint32_t k = start[p->canon]; k < start[p->canon + 1]; k++) {
        const cand_t *s = &cands[k];
        if (!refit_box_intersect(&db, &s->box, &x)) continue;
        if (s->poff == UINT64_MAX) {
            terms->len = mark;
            return REFIT_DIGEST_UNV_SOURCE_BOX;
        }
        uint64_t lo, hi, base;
        if (by_rows) {
            lo = REFIT_MAX(b.a, s->cb.a);
            hi = REFIT_MIN(b.a + b.nrows, s->cb.a + s->cb.nrows);
            base = s->cb.a;
        } else {
            lo = REFIT_MAX(b.c, s->cb.c);
            hi = REFIT_MIN(b.c + b.n, s->cb.c + s->cb.n);
            base = s->cb.c;
        }
        rawterm_t t = {.src = s->src, .pl = i, .off = entry_offset(s, by_rows, hi - base), .sign = 1};
        if (REFIT_VEC_PUSH(terms, t)) goto oom;
        if (lo > base) {
            t.off = entry_offset(s, by_rows, lo - base);
            t.sign = -1;
            if (REFIT_VEC_PUSH(terms, t)) goto oom;
        }
    }
    return REFIT_DIGEST_VERIFIABLE;
oom:
    *oom = 1;
    return REFIT_DIGEST_VERIFIABLE;
}

refit_status_t refit_digest_plan_create(const refit_manifest_t *const *srcs, size_t nsrcs, const uint8_t *usable,
                                        const refit_manifest_t *dst, refit_digest_plan_t **out)
{
    if (!dst || !out || (!srcs && nsrcs)) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_plan_create: NULL argument");
    if (nsrcs > UINT32_MAX) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_plan_create: %zu sources", nsrcs);
    if (!dst->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "digest plan: the destination is not finalized");
    for (size_t s = 0; s < nsrcs; s++) {
        const refit_manifest_t *m = srcs[s];
        if (!m) continue;
        if (!m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "digest plan: source %zu is not finalized", s);
        if (strcmp(m->model, dst->model) != 0)
            return refit_error(REFIT_ERR_IDENTITY, "digest plan: source %zu (%s rank %u) describes model %s, the "
                               "destination %s", s, m->layout, m->rank, m->model, dst->model);
    }
    refit_status_t st = REFIT_OK;
    cands_t cands = {0};
    rawterms_t raw = {0};
    uint32_t ncanon = (uint32_t)dst->canon.len, n = (uint32_t)dst->placements.len;
    uint32_t *start = calloc(ncanon + 1, sizeof(*start));
    uint8_t *part = calloc(REFIT_MAX(ncanon, 1), sizeof(*part));
    uint64_t *vols = calloc(REFIT_MAX(ncanon, 1), sizeof(*vols));
    refit_digest_plan_t *P = calloc(1, sizeof(*P));
    if (!start || !part || !vols || !P) goto oom;
    P->n = n;
    P->ncanon = ncanon;
    P->reason = calloc(REFIT_MAX(n, 1), 1);
    P->bytes = calloc(REFIT_MAX(n, 1), sizeof(*P->bytes));
    P->canon = calloc(REFIT_MAX(n, 1), sizeof(*P->canon));
    P->boxes = calloc(REFIT_MAX(n, 1), sizeof(*P->boxes));
    P->term_start = calloc((size_t)n + 1, sizeof(*P->term_start));
    P->names = calloc(REFIT_MAX(ncanon, 1), sizeof(*P->names));
    if (!P->reason || !P->bytes || !P->canon || !P->boxes || !P->term_start || !P->names) goto oom;
    for (uint32_t c = 0; c < ncanon; c++)
        if (!(P->names[c] = refit_strdup(dst->canon.data[c].name))) goto oom;

    if ((st = gather(srcs, nsrcs, usable, dst, &cands))) goto fail;
    if ((st = dedupe_and_partition(dst, cands.data, &cands.len, start, part, vols))) goto fail;

    unsigned logged = 0;
    for (uint32_t i = 0; i < n; i++) {
        const refit_placement_t *p = &dst->placements.data[i];
        const refit_tdesc_t *t = &dst->canon.data[p->canon];
        P->canon[i] = p->canon;
        P->boxes[i] = placement_box(p);
        P->bytes[i] = refit_box_volume(&P->boxes[i]) * refit_dtype_size(t->dtype);
        int oom = 0;
        refit_digest_reason_t r = plan_placement(dst, i, cands.data, start, part, &raw, &oom);
        if (oom) goto oom;
        P->reason[i] = (uint8_t)r;
        P->term_start[i + 1] = (uint32_t)raw.len;
        P->stats.placements++;
        P->stats.bytes += P->bytes[i];
        if (r == REFIT_DIGEST_VERIFIABLE) {
            P->stats.verifiable++;
            continue;
        }
        P->stats.unverifiable[r]++;
        P->stats.unverifiable_bytes += P->bytes[i];
        if (logged++ < LOG_UNVERIFIABLE_MAX) {
            char box[160], why[96] = "";
            uint64_t numel = 1;
            for (uint32_t d = 0; d < t->ndim; d++) numel *= t->shape[d];
            if (r == REFIT_DIGEST_UNV_NO_PARTITION && part[p->canon] == PART_OVERLAP)
                snprintf(why, sizeof(why), " (usable source boxes overlap)");
            else if (r == REFIT_DIGEST_UNV_NO_PARTITION)
                snprintf(why, sizeof(why), " (usable source boxes hold %" PRIu64 " of %" PRIu64 " elements)",
                         vols[p->canon], numel);
            refit_log(REFIT_LOG_INFO, "digest: %s %s (destination %s rank %u placement %u) is unverifiable: %s%s",
                      t->name, refit_box_format(&P->boxes[i], box, sizeof(box)), dst->layout, dst->rank, i,
                      refit_digest_reason_name(r), why);
        }
    }
    if (logged)
        refit_log(REFIT_LOG_INFO,
                  "digest: %s rank %u: %" PRIu64 " of %" PRIu64 " placements (%" PRIu64 " of %" PRIu64
                  " bytes) unverifiable: ndim %" PRIu64 ", odd bytes %" PRIu64 ", cut both %" PRIu64
                  ", no partition %" PRIu64 ", source box %" PRIu64,
                  dst->layout, dst->rank, P->stats.placements - P->stats.verifiable, P->stats.placements,
                  P->stats.unverifiable_bytes, P->stats.bytes, P->stats.unverifiable[1], P->stats.unverifiable[2],
                  P->stats.unverifiable[3], P->stats.unverifiable[4], P->stats.unverifiable[5]);

    /* Each entry fetched once, sorted by source and offset. */
    P->fetches = malloc(REFIT_MAX(raw.len, 1) * sizeof(*P->fetches));
    P->terms = malloc(REFIT_MAX(raw.len, 1) * sizeof(*P->terms));
    if (!P->fetches || !P->terms) goto oom;
    for (size_t i = 0; i < raw.len; i++) P->fetches[i] = (refit_digest_fetch_t){raw.data[i].src, raw.data[i].off};
    if (raw.len) qsort(P->fetches, raw.len, sizeof(*P->fetches), cmp_fetch);
    size_t nf = 0;
    for (size_t i = 0; i < raw.len; i++)
        if (nf == 0 || cmp_fetch(&P->fetches[nf - 1], &P->fetches[i])) P->fetches[nf++] = P->fetches[i];
    P->nfetches = nf;
    for (size_t i = 0; i < raw.len; i++) {
        refit_digest_fetch_t key = {raw.data[i].src, raw.data[i].off};
        const refit_digest_fetch_t *f = bsearch(&key, P->fetches, nf, sizeof(key), cmp_fetch);
        P->terms[i] = (term_t){(uint32_t)(f - P->fetches), raw.data[i].sign};
    }
    P->stats.fetches = nf;
    *out = P;
    P = NULL;
    goto done;
oom:
    st = refit_error(REFIT_ERR_NO_MEMORY, "digest plan of %s rank %u", dst->layout, dst->rank);
fail:
done:
    refit_digest_plan_destroy(P);
    REFIT_VEC_FREE(&cands);
    REFIT_VEC_FREE(&raw);
    free(start);
    free(part);
    free(vols);
    return st;
}

const refit_digest_fetch_t *refit_digest_plan_fetches(const refit_digest_plan_t *p, size_t *n)
{
    *n = p->nfetches;
    return p->fetches;
}

void refit_digest_plan_stats(const refit_digest_plan_t *p, refit_digest_plan_stats_t *out) { *out = p->stats; }

refit_digest_reason_t refit_digest_plan_reason(const refit_digest_plan_t *p, uint32_t i)
{
    return (refit_digest_reason_t)p->reason[i];
}

refit_status_t refit_digest_check(const refit_digest_plan_t *p, const void *fetched, const refit_dsum_t *local,
                                  refit_digest_report_t *report)
{
    if (!p || !local || (!fetched && p->nfetches))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_check: NULL argument");
    const uint8_t *f = fetched;
    refit_digest_report_t rep = {0};
    uint32_t first = UINT32_MAX;
    refit_dsum_t first_exp = {{0, 0}};
    for (uint32_t i = 0; i < p->n; i++) {
        if (p->reason[i] != REFIT_DIGEST_VERIFIABLE) continue;
        refit_dsum_t e = {{0, 0}};
        for (uint32_t t = p->term_start[i]; t < p->term_start[i + 1]; t++) {
            uint32_t v[2];
            memcpy(v, f + (size_t)p->terms[t].fetch * 8, 8);
            if (p->terms[t].sign > 0) {
                e.lane[0] += v[0];
                e.lane[1] += v[1];
            } else {
                e.lane[0] -= v[0];
                e.lane[1] -= v[1];
            }
        }
        rep.checked++;
        rep.bytes += p->bytes[i];
        if (e.lane[0] == local[i].lane[0] && e.lane[1] == local[i].lane[1]) continue;
        if (rep.mismatches++ == 0) {
            first = i;
            first_exp = e;
        }
    }
    if (report) *report = rep;
    if (!rep.mismatches) return REFIT_OK;
    /* The sources the first mismatching placement was checked against. */
    char srcs[128] = "";
    size_t pos = 0, nseen = 0;
    uint32_t seen[16];
    for (uint32_t t = p->term_start[first]; t < p->term_start[first + 1] && nseen < REFIT_ARRAY_LEN(seen); t++) {
        uint32_t s = p->fetches[p->terms[t].fetch].src;
        bool dup = false;
        for (size_t q = 0; q < nseen; q++) dup = dup || seen[q] == s;
        if (dup) continue;
        seen[nseen++] = s;
        pos += (size_t)snprintf(srcs + pos, sizeof(srcs) - pos, "%s%u", pos ? ", " : "", s);
        if (pos >= sizeof(srcs)) break;
    }
    char box[160];
    refit_status_t st = refit_error(
        REFIT_ERR_VERIFY,
        "digest mismatch in %s %s (destination placement %u): expected %08" PRIx32 "%08" PRIx32 " from source(s) %s, "
        "computed %08" PRIx32 "%08" PRIx32,
        p->names[p->canon[first]], refit_box_format(&p->boxes[first], box, sizeof(box)), first, first_exp.lane[0],
        first_exp.lane[1], srcs, local[first].lane[0], local[first].lane[1]);
    if (rep.mismatches > 1) refit_error_prefix("%" PRIu64 " placements differ; the first", rep.mismatches);
    return st;
}
