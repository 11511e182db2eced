/* Shared by the digest's files: the key, the keyed row kernels (digest_kernel.c), a placement's box in
 * canonical units, and the table layout that the publisher writes (digest.c) and the plan reads
 * (digest_plan.c). */
#ifndef REFIT_DATA_DIGEST_INTERNAL_H
#define REFIT_DATA_DIGEST_INTERNAL_H

#include <string.h>

#include "data/digest.h"
#include "layout/manifest.h"
#include "util/util.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the digest reads units and writes tables as little-endian host words"
#endif

/* Units per column-key block: K_l[j] = m_l(j >> KBITS) * kc[l][j & (KCOLS - 1)]. */
#define KBITS 16u
#define KCOLS (1u << KBITS)

struct refit_digest_key {
    int16_t kc[2][KCOLS]; /* column keys per lane (odd); lane 1 follows lane 0 (the kernel relies on it) */
    uint64_t tid_seed, row_seed, blk_seed;
    refit_digest_impl_t impl;
};

/* The odd 64-bit constant that spreads rows and key blocks before refit_mix64. */
#define DIGEST_GOLDEN 0x9e3779b97f4a7c15ULL

/* The block multipliers m_0(b), m_1(b) (odd): 1 for block 0, so rows of up to
 * KCOLS units keep the digests they had before blocks were keyed, and the
 * kernels skip the multiply there; a keyed mix of b for every other block. */
static inline void block_mult(const refit_digest_key_t *k, uint64_t b, uint32_t m[2])
{
    if (b == 0) {
        m[0] = m[1] = 1;
        return;
    }
    uint64_t h = refit_mix64(k->blk_seed + b * DIGEST_GOLDEN);
    m[0] = (uint32_t)h | 1;
    m[1] = (uint32_t)(h >> 32) | 1;
}

static inline uint64_t row_hash(const refit_digest_key_t *k, uint64_t tid, uint64_t row)
{
    return refit_mix64((tid ^ k->row_seed) + row * DIGEST_GOLDEN);
}

/* Adds the keyed dot products of nrows rows (stride bytes apart) of n units starting at column j into acc,
 * with the kernel the key chose. */
void digest_rows_any(const refit_digest_key_t *k, uint64_t tid, uint64_t row, uint64_t nrows, uint64_t j,
                     const uint8_t *p, uint64_t stride, uint64_t n, uint32_t acc[2]);

/* One publisher row: its dot (lanes, into s) and r * v_t added into the column sums g0, g1. */
void digest_pub_row_any(const refit_digest_key_t *k, const uint8_t *p, uint64_t j, uint64_t n, uint32_t r0, uint32_t r1,
                        uint32_t *g0, uint32_t *g1, uint32_t s[2]);
/* Two publisher rows at once (pa with row keys ra, pb with rb): their dots into sa, sb and both rows' terms
 * added into g0, g1 in one pass over the column sums (the same results as two digest_pub_row_any calls). */
void digest_pub_rows2_any(const refit_digest_key_t *k, const uint8_t *pa, const uint8_t *pb, uint64_t j, uint64_t n,
                          const uint32_t ra[2], const uint32_t rb[2], uint32_t *g0, uint32_t *g1, uint32_t sa[2],
                          uint32_t sb[2]);

/* A row key as two signed 16-bit halves: r = lo + 65536 * hi (mod 2^32), so r * v = lo * v + 65536 * (hi * v)
 * (mod 2^32) for any unit v, and 16-bit multiply-adds give the 32-bit column terms (digest_avx512.c). */
static inline void digest_pub_key_halves(uint32_t r, int16_t *lo, int16_t *hi)
{
    uint32_t l = r & 0xffff;
    *lo = (int16_t)(uint16_t)l;                       /* l - 65536 when l >= 32768 ... */
    *hi = (int16_t)(uint16_t)((r >> 16) + (l >> 15)); /* ... which the high half takes back */
}

/* The publisher's pass over nrows rows of one placement's box (rows [row, row+nrows) of tensor tid, row i at
 * p + i * stride, n units from column j): P[2i + l] = r_l(row+i) * dot_l(row i) (the row terms of the P
 * array, before the prefix sums) and g[l * n + t] = sum_i r_l(row+i) * v_it, the column sums (overwritten;
 * 2n entries).  scratch: digest_pub_scratch_bytes(n) bytes, 64-byte aligned (may be NULL when that is 0). */
void digest_pub_rows_any(const refit_digest_key_t *k, uint64_t tid, uint64_t row, uint64_t nrows, uint64_t j,
                         const uint8_t *p, uint64_t stride, uint64_t n, uint32_t *P, uint32_t *g, void *scratch);
size_t digest_pub_scratch_bytes(const refit_digest_key_t *k, uint64_t n);
/* Rows of at least this many units take the AVX-512 four-row kernel, shorter ones the pairs (digest_kernel.c);
 * bench_digest_pub_rows moves it to compare the two. */
extern uint64_t digest_pub_rows4_min_units;

/* Fused copies of at least this many bytes in one call stream their stores past the caches (AVX-512 and
 * AVX2; see digest_avx512.c): a quarter of a Zen 4 core's L2, so a copy that would evict most of it anyway. */
#define DIGEST_STREAM_BYTES (256u << 10)

/* How a fused kernel stores: not at all (hash only), plain stores, or streaming past the caches. */
enum { STORE_NONE = 0, STORE_PLAIN = 1, STORE_STREAM = 2 };

/* One segment's changed units for the notes of a delta publisher's encoder (digest_update.c): unit x of a
 * note is unit u = u0 + units[x] of a segment whose rows of bn units are contiguous and whose columns stay in
 * one key block; its row rr = u / bn (from the segment's first), its column t = u - rr * bn, its row's keys
 * the two halves of refit_mix64(h0 + rr * golden) (odd), its change d = now - before.  It adds r_l * d *
 * bm_l * K_l[t] to dP[2 * rr + l] and r_l * d to dq_l[t].  inv is 1.0 / bn: a unit's row is
 * (u * inv) truncated, which is u / bn or, at an exact multiple, one less (then corrected); never more, for
 * u < 2^50.  A unit that did not change adds 0. */
typedef struct {
    const uint8_t *nwo, *odo; /* now and before at the note's offset: unit x's bytes at 2 * units[x] */
    int64_t u0;
    uint64_t bn, h0;
    double inv;
    uint32_t bm[2];
    const int16_t *K0, *K1; /* the block's column keys from the box's first column */
    uint32_t *dP, *dq0, *dq1;
} digest_units_t;

/* Whether units [col, col + n) of a row share one column-key block (the segments the unit kernels take). */
static inline bool digest_one_key_block(uint64_t col, uint64_t n) { return col >> KBITS == (col + n - 1) >> KBITS; }

/* j's terms for rows of n units of tensor tid whose first is canonical row `row`, from canonical column col
 * (digest_one_key_block(col, n)): row_hash(k, tid, row + rr) = refit_mix64(h0 + rr * golden). */
static inline void digest_units_init(digest_units_t *j, const refit_digest_key_t *k, uint64_t tid, uint64_t row,
                                     uint64_t col, uint64_t n)
{
    j->bn = n;
    j->inv = 1.0 / (double)n;
    j->h0 = (tid ^ k->row_seed) + row * DIGEST_GOLDEN;
    j->K0 = k->kc[0] + (col & (KCOLS - 1));
    j->K1 = k->kc[1] + (col & (KCOLS - 1));
    block_mult(k, col >> KBITS, j->bm);
}

/* Unit u of j's segment: its row (from the segment's first), its column and its row's keys. */
static inline void digest_unit_at(const digest_units_t *j, int64_t u, int64_t *row, int64_t *col, uint32_t r[2])
{
    int64_t bn = (int64_t)j->bn;
    int64_t rr = (int64_t)((double)u * j->inv), t = u - rr * bn;
    if (t >= bn) {
        rr++;
        t -= bn;
    }
    uint64_t h = refit_mix64(j->h0 + (uint64_t)rr * DIGEST_GOLDEN);
    r[0] = (uint32_t)h | 1;
    r[1] = (uint32_t)(h >> 32) | 1;
    *row = rr;
    *col = t;
}

/* The scalar note of one unit (offset `unit` from the note's): the reference digest_units_avx512 matches, bit for
 * bit. */
static inline void digest_unit_note(const digest_units_t *j, uint16_t unit)
{
    int64_t rr, t;
    uint32_t r[2];
    digest_unit_at(j, j->u0 + unit, &rr, &t, r);
    int16_t a, c;
    memcpy(&a, j->nwo + 2 * (size_t)unit, 2);
    memcpy(&c, j->odo + 2 * (size_t)unit, 2);
    uint32_t d = (uint32_t)((int32_t)a - (int32_t)c);
    uint32_t rd0 = r[0] * d, rd1 = r[1] * d;
    j->dP[2 * rr] += rd0 * (j->bm[0] * (uint32_t)(int32_t)j->K0[t]);
    j->dP[2 * rr + 1] += rd1 * (j->bm[1] * (uint32_t)(int32_t)j->K1[t]);
    j->dq0[t] += rd0;
    j->dq1[t] += rd1;
}

/* What a change of d to unit u of j's segment adds to its digest (a receiver's delta apply), into s: the
 * reference digest_units_sum_avx512 matches. */
static inline void digest_unit_sum(const digest_units_t *j, uint32_t u, int32_t d, uint32_t s[2])
{
    int64_t rr, t;
    uint32_t r[2];
    digest_unit_at(j, u, &rr, &t, r);
    s[0] += r[0] * (j->bm[0] * (uint32_t)(int32_t)j->K0[t]) * (uint32_t)d;
    s[1] += r[1] * (j->bm[1] * (uint32_t)(int32_t)j->K1[t]) * (uint32_t)d;
}

/* The AVX-512 (F + BW + VL) kernels, digest_avx512.c: the same contracts as the scalar ones in digest_kernel.c.
 * Call them only when digest_cpu_has_avx512() (CPUID and the OS's ZMM state, XGETBV). */
#if defined(__x86_64__) && defined(__GNUC__)
#define DIGEST_HAVE_AVX512 1
bool digest_cpu_has_avx512(void);
void digest_rows_avx512(const refit_digest_key_t *k, uint64_t tid, uint64_t row, uint64_t nrows, uint64_t j,
                        const uint8_t *p, uint64_t stride, uint64_t n, uint32_t acc[2]);
void digest_copy_rows_avx512(const refit_digest_key_t *k, uint64_t tid, uint64_t row, uint64_t nrows, uint64_t j,
                             uint8_t *d, uint64_t dstride, const uint8_t *p, uint64_t sstride, uint64_t n,
                             uint32_t acc[2]);
void digest_dot_avx512(const refit_digest_key_t *k, const uint8_t *p, uint64_t j, uint64_t n, uint32_t s[2]);
void digest_pub_row_avx512(const refit_digest_key_t *k, const uint8_t *p, uint64_t j, uint64_t n, uint32_t r0,
                           uint32_t r1, uint32_t *g0, uint32_t *g1, uint32_t s[2]);
void digest_pub_rows2_avx512(const refit_digest_key_t *k, const uint8_t *pa, const uint8_t *pb, uint64_t j, uint64_t n,
                             const uint32_t ra[2], const uint32_t rb[2], uint32_t *g0, uint32_t *g1, uint32_t sa[2],
                             uint32_t sb[2]);
size_t digest_pub_scratch_avx512(uint64_t n);
void digest_pub_rows_avx512(const refit_digest_key_t *k, uint64_t tid, uint64_t row, uint64_t nrows, uint64_t j,
                            const uint8_t *p, uint64_t stride, uint64_t n, uint32_t *P, uint32_t *g, void *scratch);
/* digest_unit_note for units[0, n), 16 at a time; needs AVX-512 DQ as well (digest_cpu_has_avx512dq), units
 * whose segment index u0 + units[x] is below 2^31, and 2 readable bytes before unit units[0] in both memories
 * (it gathers 32-bit words that end with each unit). */
bool digest_cpu_has_avx512dq(void);
void digest_units_avx512(const digest_units_t *j, const uint16_t *units, uint32_t n);
/* digest_unit_sum of units u[0, n) (below 2^31) with changes d, 16 at a time; needs DQ as well. */
void digest_units_sum_avx512(const digest_units_t *j, const uint32_t *u, const int32_t *d, uint32_t n, uint32_t s[2]);
#else
#define DIGEST_HAVE_AVX512 0
#endif

/* Whether a key's changed units go through the AVX-512 unit kernels: its kernel is AVX-512 and the CPU has DQ. */
static inline bool digest_units_vectorised(const refit_digest_key_t *k)
{
#if DIGEST_HAVE_AVX512
    return refit_digest_key_impl(k) == REFIT_DIGEST_IMPL_AVX512 && digest_cpu_has_avx512dq();
#else
    (void)k;
    return false;
#endif
}

/* A placement's box in canonical units: rows [a, a+nrows), units [c, c+n)
 * of a tensor of R rows by U units. */
typedef struct {
    uint64_t R, U, a, nrows, c, n;
} cbox_t;

static inline refit_digest_reason_t cbox_of(const refit_tdesc_t *t, const refit_placement_t *p, cbox_t *b)
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

static inline bool cbox_full_rows(const cbox_t *b) { return b->c == 0 && b->n == b->U; }
static inline bool cbox_all_rows(const cbox_t *b) { return b->a == 0 && b->nrows == b->R; }

/* Byte offset of placement p's first unit in its region, and the bytes between its rows (0 for ndim 1). */
uint64_t digest_box_offset(const refit_manifest_t *m, const refit_placement_t *p, uint64_t *stride);
/* Keyed ids of every canonical tensor of m (malloc'ed; NULL when out of memory). */
uint64_t *digest_tensor_ids(const refit_digest_key_t *k, const refit_manifest_t *m);

static inline uint64_t table_entries(const cbox_t *b) { return b->nrows + 1 + b->n + 1; }

#endif
