/* The digest's AVX-512 kernels (F + BW + VL): the receiver's row kernel, the publisher's row kernel and the fused
 * copy+hash, each bit-identical to the scalar reference in digest_kernel.c.
 *
 * _mm512_madd_epi16 takes 32 units a step (pairwise int16 products summed into int32 lanes, wrapping as mod
 * 2^32 does, as in the AVX2 kernel).  Tails use masked loads and stores (AVX-512BW's per-word masks), which
 * never touch memory outside the mask, so a row's last partial step reads and writes only its own bytes and
 * the key tables' own entries; no scalar tail and no overlapping re-read.
 *
 * The fused copy stores the very register it hashes: the copied bytes and the hashed bytes are the same
 * load, so copy+hash costs one read of src and one write of dst, the traffic of a memcpy, and the sums
 * equal a copy followed by refit_digest_rows over dst.  Calls that copy at least DIGEST_STREAM_BYTES use
 * streaming stores (as glibc's memcpy does for large copies): a plain store first reads the destination's
 * line (read-for-ownership), a third stream of memory traffic that the copy does not need; in interleaved
 * runs on 512 MiB (2048-unit rows) streaming measured about 0.9x a row-by-row memcpy, plain stores about
 * 1.06x (docs/digest.md).  Smaller calls keep plain stores, leaving dst in cache.
 *
 * One always-inline body serves hashing alone and copy+hash: `store` is a constant at every call, so the
 * compiler emits two loops without a branch inside. */
#include "data/digest_internal.h"

#if DIGEST_HAVE_AVX512
#include <cpuid.h>
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline

/* Prefetch distance, as the AVX2 kernel's (digest_kernel.c). */
#define PREFETCH_BYTES_512 2048

bool digest_cpu_has_avx512(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    /* The OS saves XMM, YMM, the opmask registers and both halves of the ZMM state. */
    if ((lo & 0xe6) != 0xe6) return false;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (b & bit_AVX512F) && (b & bit_AVX512BW) && (b & bit_AVX512VL);
}

/* The sum of the 16 lanes mod 2^32, in vector adds (GCC's _mm512_reduce_add_epi32 adds in signed int, which
 * the undefined-behaviour sanitizer rightly flags when it wraps). */
AVX512_INLINE uint32_t hsum512(__m512i v)
{
    __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(s);
}

/* v in the low half of a zeroed 512-bit register. */
AVX512_INLINE __m512i zext256(__m256i v) { return _mm512_inserti64x4(_mm512_setzero_si512(), v, 0); }

AVX512_INLINE __mmask32 mask_units(uint64_t r) { return r >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << r) - 1); }

/* Up to 32 units, masked: *s0, *s1 += their products with the keys at k0, copied to d when store. */
AVX512_INLINE void step_masked(const int16_t *k0, const uint8_t *p, uint8_t *d, int store, uint64_t r, __m512i *s0,
                               __m512i *s1)
{
    __mmask32 m = mask_units(r);
    __m512i v = _mm512_maskz_loadu_epi16(m, p);
    if (store) _mm512_mask_storeu_epi16(d, m, v);
    *s0 = _mm512_add_epi32(*s0, _mm512_madd_epi16(v, _mm512_maskz_loadu_epi16(m, k0)));
    *s1 = _mm512_add_epi32(*s1, _mm512_madd_epi16(v, _mm512_maskz_loadu_epi16(m, k0 + KCOLS)));
}

/* *a0, *a1 (int32 lanes) += the products of units [0,len) at p with the column keys at k0 (lane 1's are
 * KCOLS entries further; jj + len <= KCOLS), and the units copied to d when store is STORE_PLAIN or
 * STORE_STREAM.  Streaming first copies a masked head up to d's next 64-byte boundary (d even: units can
 * reach it), then stores whole lines with _mm512_stream_si512. */
AVX512_INLINE void seg512(const int16_t *k0, const uint8_t *p, uint8_t *d, int store, uint64_t len, __m512i *a0,
                          __m512i *a1)
{
    __m512i s0 = *a0, s1 = *a1, u0 = _mm512_setzero_si512(), u1 = _mm512_setzero_si512();
    bool stream = false;
    if (store == STORE_STREAM && len >= 256 && !((uintptr_t)d & 1)) {
        uint64_t h = ((0 - (uintptr_t)d) & 63) / 2;
        if (h) {
            step_masked(k0, p, d, store, h, &s0, &s1);
            p += 2 * h;
            d += 2 * h;
            k0 += h;
            len -= h;
        }
        stream = true;
    }
    const uint8_t *end2 = p + 2 * (len & ~(uint64_t)63);
    for (; p < end2; p += 128, k0 += 64) {
        _mm_prefetch((const char *)p + PREFETCH_BYTES_512, _MM_HINT_T0);
        __m512i v = _mm512_loadu_si512((const void *)p), w = _mm512_loadu_si512((const void *)(p + 64));
        if (stream) {
            _mm512_stream_si512((void *)d, v);
            _mm512_stream_si512((void *)(d + 64), w);
            d += 128;
        } else if (store) {
            _mm512_storeu_si512((void *)d, v);
            _mm512_storeu_si512((void *)(d + 64), w);
            d += 128;
        }
        s0 = _mm512_add_epi32(s0, _mm512_madd_epi16(v, _mm512_loadu_si512((const void *)k0)));
        s1 = _mm512_add_epi32(s1, _mm512_madd_epi16(v, _mm512_loadu_si512((const void *)(k0 + KCOLS))));
        u0 = _mm512_add_epi32(u0, _mm512_madd_epi16(w, _mm512_loadu_si512((const void *)(k0 + 32))));
        u1 = _mm512_add_epi32(u1, _mm512_madd_epi16(w, _mm512_loadu_si512((const void *)(k0 + KCOLS + 32))));
    }
    /* The rest (< 64 units): whole 32- and 16-unit steps with plain loads, then at most one masked 256-bit
     * step of fewer than 16 units.  Each step prefetches as the main loop does: rows shorter than 64 units
     * never run the main loop, and on this machine's AMD cores masked loads that miss the caches are slow
     * unless prefetched (rows of 48 units from memory: 1.2 GB/s with masked steps and no
     * prefetch, 12-16 GB/s with these steps; docs/digest.md). */
    uint64_t rest = len & 63;
    if (rest >= 32) {
        _mm_prefetch((const char *)p + PREFETCH_BYTES_512, _MM_HINT_T0);
        __m512i v = _mm512_loadu_si512((const void *)p);
        if (store) {
            _mm512_storeu_si512((void *)d, v);
            d += 64;
        }
        s0 = _mm512_add_epi32(s0, _mm512_madd_epi16(v, _mm512_loadu_si512((const void *)k0)));
        s1 = _mm512_add_epi32(s1, _mm512_madd_epi16(v, _mm512_loadu_si512((const void *)(k0 + KCOLS))));
        p += 64;
        k0 += 32;
        rest -= 32;
    }
    if (rest >= 16) {
        _mm_prefetch((const char *)p + PREFETCH_BYTES_512, _MM_HINT_T0);
        __m256i v = _mm256_loadu_si256((const __m256i *)p);
        if (store) {
            _mm256_storeu_si256((__m256i *)d, v);
            d += 32;
        }
        u0 = _mm512_add_epi32(u0, zext256(_mm256_madd_epi16(v, _mm256_loadu_si256((const __m256i *)k0))));
        u1 = _mm512_add_epi32(u1, zext256(_mm256_madd_epi16(v, _mm256_loadu_si256((const __m256i *)(k0 + KCOLS)))));
        p += 32;
        k0 += 16;
        rest -= 16;
    }
    if (rest) {
        _mm_prefetch((const char *)p + PREFETCH_BYTES_512, _MM_HINT_T0);
        __mmask16 m = (__mmask16)((1u << rest) - 1);
        __m256i v = _mm256_maskz_loadu_epi16(m, p);
        if (store) _mm256_mask_storeu_epi16(d, m, v);
        u0 = _mm512_add_epi32(u0, zext256(_mm256_madd_epi16(v, _mm256_maskz_loadu_epi16(m, k0))));
        u1 = _mm512_add_epi32(u1, zext256(_mm256_madd_epi16(v, _mm256_maskz_loadu_epi16(m, k0 + KCOLS))));
    }
    *a0 = _mm512_add_epi32(s0, u0);
    *a1 = _mm512_add_epi32(s1, u1);
}

/* *a0, *a1 += the products of units [0,n) at p with K[j..j+n) (copied to d when store): pieces of block 0
 * (multiplier 1) add straight into the accumulators, others are summed apart and every lane multiplied by
 * the block's m_l (the sum distributes), as dot_avx2 does. */
AVX512_INLINE void dot512(const refit_digest_key_t *k, const uint8_t *p, uint8_t *d, int store, uint64_t j, uint64_t n,
                          __m512i *a0, __m512i *a1)
{
    while (n) {
        uint64_t jj = j & (KCOLS - 1), len = REFIT_MIN(n, KCOLS - jj);
        if (j >> KBITS == 0) {
            seg512(k->kc[0] + jj, p, d, store, len, a0, a1);
        } else {
            uint32_t m[2];
            block_mult(k, j >> KBITS, m);
            __m512i b0 = _mm512_setzero_si512(), b1 = _mm512_setzero_si512();
            seg512(k->kc[0] + jj, p, d, store, len, &b0, &b1);
            *a0 = _mm512_add_epi32(*a0, _mm512_mullo_epi32(b0, _mm512_set1_epi32((int32_t)m[0])));
            *a1 = _mm512_add_epi32(*a1, _mm512_mullo_epi32(b1, _mm512_set1_epi32((int32_t)m[1])));
        }
        p += 2 * len;
        if (store) d += 2 * len;
        j += len;
        n -= len;
    }
}

/* acc += D of nrows rows (src row i at p + i * sstride), copied to d + i * dstride when store.  A row's dot
 * stays in vector lanes and is multiplied there by the row key (the lanes' sum is linear). */
AVX512_INLINE void rows_body512(const refit_digest_key_t *k, uint64_t tid, uint64_t row, uint64_t nrows, uint64_t j,
                                uint8_t *d, uint64_t dstride, int store, const uint8_t *p, uint64_t sstride, uint64_t n,
                                uint32_t acc[2])
{
    __m512i t0 = _mm512_setzero_si512(), t1 = _mm512_setzero_si512();
    for (uint64_t i = 0; i < nrows; i++) {
        __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
        dot512(k, p + i * sstride, store ? d + i * dstride : NULL, store, j, n, &a0, &a1);
        uint64_t h = row_hash(k, tid, row + i);
        t0 = _mm512_add_epi32(t0, _mm512_mullo_epi32(a0, _mm512_set1_epi32((int32_t)((uint32_t)h | 1))));
        t1 = _mm512_add_epi32(t1, _mm512_mullo_epi32(a1, _mm512_set1_epi32((int32_t)((uint32_t)(h >> 32) | 1))));
    }
    acc[0] += hsum512(t0);
    acc[1] += hsum512(t1);
}

AVX512 void digest_rows_avx512(const refit_digest_key_t *k, uint64_t tid, uint64_t row, uint64_t nrows, uint64_t j,
                               const uint8_t *p, uint64_t stride, uint64_t n, uint32_t acc[2])
{
    rows_body512(k, tid, row, nrows, j, NULL, 0, STORE_NONE, p, stride, n, acc);
}

AVX512 void digest_copy_rows_avx512(const refit_digest_key_t *k, uint64_t tid, uint64_t row, uint64_t nrows, uint64_t j,
                                    uint8_t *d, uint64_t dstride, const uint8_t *p, uint64_t sstride, uint64_t n,
                                    uint32_t acc[2])
{
    if (nrows * n * 2 >= DIGEST_STREAM_BYTES) {
        rows_body512(k, tid, row, nrows, j, d, dstride, STORE_STREAM, p, sstride, n, acc);
        _mm_sfence(); /* the streamed lines are ordered before whatever the caller stores next */
    } else {
        rows_body512(k, tid, row, nrows, j, d, dstride, STORE_PLAIN, p, sstride, n, acc);
    }
}

AVX512 void digest_dot_avx512(const refit_digest_key_t *k, const uint8_t *p, uint64_t j, uint64_t n, uint32_t s[2])
{
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
    dot512(k, p, NULL, STORE_NONE, j, n, &a0, &a1);
    s[0] += hsum512(a0);
    s[1] += hsum512(a1);
}

/* One publisher row: its dot into s, and r * v_t added into g0[t], g1[t] (16 units a step, sign-extended to
 * int32 lanes; the tail masked). */
AVX512 void digest_pub_row_avx512(const refit_digest_key_t *k, const uint8_t *p, uint64_t j, uint64_t n, uint32_t r0,
                                  uint32_t r1, uint32_t *g0, uint32_t *g1, uint32_t s[2])
{
    digest_dot_avx512(k, p, j, n, s);
    __m512i rv0 = _mm512_set1_epi32((int32_t)r0), rv1 = _mm512_set1_epi32((int32_t)r1);
    uint64_t t = 0;
    for (; t + 16 <= n; t += 16) {
        __m512i v = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(p + 2 * t)));
        __m512i x0 = _mm512_loadu_si512((const void *)(g0 + t)), x1 = _mm512_loadu_si512((const void *)(g1 + t));
        _mm512_storeu_si512((void *)(g0 + t), _mm512_add_epi32(x0, _mm512_mullo_epi32(v, rv0)));
        _mm512_storeu_si512((void *)(g1 + t), _mm512_add_epi32(x1, _mm512_mullo_epi32(v, rv1)));
    }
    if (t < n) {
        __mmask16 m = (__mmask16)((1u << (n - t)) - 1);
        __m512i v = _mm512_cvtepi16_epi32(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(m, p + 2 * t)));
        __m512i x0 = _mm512_maskz_loadu_epi32(m, g0 + t), x1 = _mm512_maskz_loadu_epi32(m, g1 + t);
        _mm512_mask_storeu_epi32(g0 + t, m, _mm512_add_epi32(x0, _mm512_mullo_epi32(v, rv0)));
        _mm512_mask_storeu_epi32(g1 + t, m, _mm512_add_epi32(x1, _mm512_mullo_epi32(v, rv1)));
    }
}

/* x + ra * va + rb * vb, per int32 lane (mod 2^32). */
AVX512_INLINE __m512i cols2(__m512i x, __m512i va, __m512i vb, __m512i ra, __m512i rb)
{
    return _mm512_add_epi32(x, _mm512_add_epi32(_mm512_mullo_epi32(va, ra), _mm512_mullo_epi32(vb, rb)));
}

/* Two rows: each row's dot, then one pass over g0, g1 adding both rows' r * v_t (the column sums are loaded
 * and stored once for two rows, half the traffic of two digest_pub_row_avx512 calls). */
AVX512 void digest_pub_rows2_avx512(const refit_digest_key_t *k, const uint8_t *pa, const uint8_t *pb, uint64_t j,
                                    uint64_t n, const uint32_t ra[2], const uint32_t rb[2], uint32_t *g0, uint32_t *g1,
                                    uint32_t sa[2], uint32_t sb[2])
{
    digest_dot_avx512(k, pa, j, n, sa);
    digest_dot_avx512(k, pb, j, n, sb);
    __m512i a0 = _mm512_set1_epi32((int32_t)ra[0]), a1 = _mm512_set1_epi32((int32_t)ra[1]);
    __m512i b0 = _mm512_set1_epi32((int32_t)rb[0]), b1 = _mm512_set1_epi32((int32_t)rb[1]);
    uint64_t t = 0;
    for (; t + 16 <= n; t += 16) {
        __m512i va = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(pa + 2 * t)));
        __m512i vb = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(pb + 2 * t)));
        __m512i x0 = _mm512_loadu_si512((const void *)(g0 + t)), x1 = _mm512_loadu_si512((const void *)(g1 + t));
        x0 = cols2(x0, va, vb, a0, b0);
        x1 = cols2(x1, va, vb, a1, b1);
        _mm512_storeu_si512((void *)(g0 + t), x0);
        _mm512_storeu_si512((void *)(g1 + t), x1);
    }
    if (t < n) {
        __mmask16 m = (__mmask16)((1u << (n - t)) - 1);
        __m512i va = _mm512_cvtepi16_epi32(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(m, pa + 2 * t)));
        __m512i vb = _mm512_cvtepi16_epi32(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(m, pb + 2 * t)));
        __m512i x0 = _mm512_maskz_loadu_epi32(m, g0 + t), x1 = _mm512_maskz_loadu_epi32(m, g1 + t);
        x0 = cols2(x0, va, vb, a0, b0);
        x1 = cols2(x1, va, vb, a1, b1);
        _mm512_mask_storeu_epi32(g0 + t, m, x0);
        _mm512_mask_storeu_epi32(g1 + t, m, x1);
    }
}
#endif

#if DIGEST_HAVE_AVX512
/* ---------------------------------------------------------------- the publisher's rows, four at a time
 *
 * A row's column terms r * v_t (mod 2^32, r the row key, v_t a signed unit) come from 16-bit products:
 * with r = lo + 65536 * hi (mod 2^32; lo, hi signed 16-bit, digest_pub_key_halves), r * v = lo * v + 65536 *
 * (hi * v), and the second term needs hi * v mod 2^16 only.  Two rows a, b interleaved unit by unit
 * (unpacklo/hi_epi16) meet the pair (lo_a, lo_b) in one _mm512_madd_epi16: lo_a * v_a + lo_b * v_b per
 * column, in int32 lanes that wrap mod 2^32 as the scalar sums do.  So per 32 columns a pair of rows costs 2
 * unpacks and 8 madds (L and H for both lanes, low and high halves) where 32-bit products cost 4 sign
 * extensions and 8 mullo per row; four rows share each load and store of the column sums, which stay in a
 * scratch array in the unpack's column order (L and H kept apart) until the end of the call.  The rows'
 * dots are summed in vector lanes over the whole call (8 accumulators) and reduced once per row.  Nothing
 * differs in the results: L + 65536 * H is the column sum mod 2^32 (tests compare with the scalar kernel). */

/* Prefetch distance of the publisher's rows: a group reads four rows at once, so the main loop's 2 KiB is one
 * group ahead for rows of 256 units; from memory (rows of 256 units, one thread, loaded host) 2 KiB gave 15.5
 * GB/s, 4 KiB 14.8-17.6, 8 KiB 19.4, 16 KiB 16.2. */
#define PUB_PREFETCH_BYTES 8192

/* Scratch accumulators per 32-column step: L0, H0, L1, H1, each as unpacklo and unpackhi halves. */
#define PUB_STEP_VECS 8

/* Units a step covers and its mask (rest < 32: the masked tail). */
AVX512_INLINE __mmask32 pub_mask(uint64_t rest) { return rest >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << rest) - 1); }

/* Loads 32 units at p, or the first `rest` of them (rest < 32, the others 0) with a masked load.  Masked loads
 * only in a row's last step: a full step's plain load keeps the hardware prefetcher's view of the stream. */
AVX512_INLINE __m512i pub_load(const void *p, uint64_t rest)
{
    return rest >= 32 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(pub_mask(rest), p);
}

/* The running sums of one group (dots d[row][lane]) and its pairs' key halves. */
typedef struct {
    __m512i d[4][2];
    __m512i c[2][4];
} pub_regs_t;

/* One step of 32 units (or the rest of the row: rest < 32) of a group at byte offset o of its rows. */
AVX512_INLINE void pub_step512(const int16_t *k0, const uint8_t *const rp[4], uint64_t o, uint64_t rest, int np,
                               pub_regs_t *R, __m512i *acc)
{
    _mm_prefetch((const char *)rp[0] + o + PUB_PREFETCH_BYTES, _MM_HINT_T0);
    _mm_prefetch((const char *)rp[1] + o + PUB_PREFETCH_BYTES, _MM_HINT_T0);
    __m512i ka = pub_load(k0, rest), kb = pub_load(k0 + KCOLS, rest);
    __m512i v0 = pub_load(rp[0] + o, rest), v1 = pub_load(rp[1] + o, rest);
    R->d[0][0] = _mm512_add_epi32(R->d[0][0], _mm512_madd_epi16(v0, ka));
    R->d[0][1] = _mm512_add_epi32(R->d[0][1], _mm512_madd_epi16(v0, kb));
    R->d[1][0] = _mm512_add_epi32(R->d[1][0], _mm512_madd_epi16(v1, ka));
    R->d[1][1] = _mm512_add_epi32(R->d[1][1], _mm512_madd_epi16(v1, kb));
    __m512i alo = _mm512_unpacklo_epi16(v0, v1), ahi = _mm512_unpackhi_epi16(v0, v1);
    __m512i blo = _mm512_setzero_si512(), bhi = blo;
    if (np == 2) {
        _mm_prefetch((const char *)rp[2] + o + PUB_PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)rp[3] + o + PUB_PREFETCH_BYTES, _MM_HINT_T0);
        __m512i v2 = pub_load(rp[2] + o, rest), v3 = pub_load(rp[3] + o, rest);
        R->d[2][0] = _mm512_add_epi32(R->d[2][0], _mm512_madd_epi16(v2, ka));
        R->d[2][1] = _mm512_add_epi32(R->d[2][1], _mm512_madd_epi16(v2, kb));
        R->d[3][0] = _mm512_add_epi32(R->d[3][0], _mm512_madd_epi16(v3, ka));
        R->d[3][1] = _mm512_add_epi32(R->d[3][1], _mm512_madd_epi16(v3, kb));
        blo = _mm512_unpacklo_epi16(v2, v3);
        bhi = _mm512_unpackhi_epi16(v2, v3);
    }
    /* Unrolled, the constants stay in registers (26 -> 31 GB/s in L2, rows of 256 units, one thread). */
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        __m512i xl = _mm512_add_epi32(_mm512_load_si512(acc + 2 * q), _mm512_madd_epi16(alo, R->c[0][q]));
        __m512i xh = _mm512_add_epi32(_mm512_load_si512(acc + 2 * q + 1), _mm512_madd_epi16(ahi, R->c[0][q]));
        if (np == 2) {
            xl = _mm512_add_epi32(xl, _mm512_madd_epi16(blo, R->c[1][q]));
            xh = _mm512_add_epi32(xh, _mm512_madd_epi16(bhi, R->c[1][q]));
        }
        _mm512_store_si512(acc + 2 * q, xl);
        _mm512_store_si512(acc + 2 * q + 1, xh);
    }
}

/* The lane sums of 8 vectors x[4][2] into out[4][2] (mod 2^32) in one transposing tree: pairs of vectors
 * interleaved and added (32-bit, then 64-bit), then 128-bit lanes; 23 instructions where 8 separate
 * reductions take 64 (a group of rows of 96 units spends about a quarter of its time there otherwise). */
AVX512_INLINE void hsum8_512(const __m512i x[4][2], uint32_t out[4][2])
{
    __m512i y[4], z[2];
    for (int q = 0; q < 4; q++)
        y[q] = _mm512_add_epi32(_mm512_unpacklo_epi32(x[q][0], x[q][1]), _mm512_unpackhi_epi32(x[q][0], x[q][1]));
    /* y[q], per 128-bit lane: [x[q][0], x[q][1], x[q][0], x[q][1]] partial sums */
    for (int h = 0; h < 2; h++)
        z[h] = _mm512_add_epi32(_mm512_unpacklo_epi64(y[2 * h], y[2 * h + 1]),
                                _mm512_unpackhi_epi64(y[2 * h], y[2 * h + 1]));
    /* z[h], per 128-bit lane: [x[2h][0], x[2h][1], x[2h+1][0], x[2h+1][1]] */
    __m512i w = _mm512_add_epi32(_mm512_shuffle_i32x4(z[0], z[1], 0x88), _mm512_shuffle_i32x4(z[0], z[1], 0xdd));
    /* w's 128-bit lanes: z0 (0+1), z0 (2+3), z1 (0+1), z1 (2+3) */
    w = _mm512_add_epi32(w, _mm512_shuffle_i32x4(w, w, 0xb1));
    uint32_t v[16];
    _mm512_storeu_si512((void *)v, w);
    for (int q = 0; q < 4; q++) {
        out[q][0] = v[8 * (q >> 1) + 2 * (q & 1)];
        out[q][1] = v[8 * (q >> 1) + 2 * (q & 1) + 1];
    }
}

/* One group of up to 4 rows (two pairs; np = pairs present, 1 or 2) over n units: the rows' dots with the
 * keys at k0 (lane 1 KCOLS further) into dots[row][lane], their column terms added into acc.  c[pair][kind]
 * holds the 16-bit key halves of a pair as (row a | row b << 16): kind 0 lane 0's lo, 1 lane 0's hi, 2 lane
 * 1's lo, 3 lane 1's hi.  Rows not present read a present row again with zero halves in c (their terms
 * vanish; their dots are ignored). */
AVX512_INLINE void pub_group512(const int16_t *k0, const uint8_t *const rp[4], uint64_t n, const uint32_t c[2][4],
                                int np, __m512i *acc, uint32_t dots[4][2])
{
    pub_regs_t R;
    for (int q = 0; q < 4; q++) {
        R.d[q][0] = R.d[q][1] = _mm512_setzero_si512();
        R.c[0][q] = _mm512_set1_epi32((int32_t)c[0][q]);
        R.c[1][q] = _mm512_set1_epi32((int32_t)c[1][q]);
    }
    uint64_t t = 0;
    for (; t + 32 <= n; t += 32, acc += PUB_STEP_VECS) {
        if (np == 2) pub_step512(k0 + t, rp, 2 * t, 32, 2, &R, acc);
        else pub_step512(k0 + t, rp, 2 * t, 32, 1, &R, acc);
    }
    if (t < n) pub_step512(k0 + t, rp, 2 * t, n - t, np, &R, acc);
    hsum8_512(R.d, dots);
}

size_t digest_pub_scratch_avx512(uint64_t n) { return (size_t)((n + 31) / 32) * PUB_STEP_VECS * 64; }

/* Rows [row, row+nrows) (row i at p + i * stride) of n units from column j, all in one key block: P[2i + l] =
 * r_l(row+i) * dot_l(row i), g[l * n + t] = sum_i r_l(row+i) * v_it (overwritten).  scratch: 64-byte aligned,
 * digest_pub_scratch_avx512(n) bytes. */
AVX512 void digest_pub_rows_avx512(const refit_digest_key_t *k, uint64_t tid, uint64_t row, uint64_t nrows, uint64_t j,
                                   const uint8_t *p, uint64_t stride, uint64_t n, uint32_t *P, uint32_t *g,
                                   void *scratch)
{
    __m512i *acc = scratch;
    uint64_t steps = (n + 31) / 32;
    for (uint64_t s = 0; s < steps * PUB_STEP_VECS; s++) acc[s] = _mm512_setzero_si512();
    uint32_t bm[2];
    block_mult(k, j >> KBITS, bm);
    const int16_t *k0 = k->kc[0] + (j & (KCOLS - 1));
    for (uint64_t i = 0; i < nrows; i += 4) {
        uint64_t nr = REFIT_MIN(4, nrows - i);
        uint32_t r[4][2] = {{0}}, c[2][4] = {{0}}, dots[4][2];
        const uint8_t *rp[4];
        for (uint64_t q = 0; q < 4; q++) {
            uint64_t src = q < nr ? q : nr > 2 ? 2 : 0; /* a row not present reads one that is */
            rp[q] = p + (i + src) * stride;
            if (q >= nr) continue;
            uint64_t h = row_hash(k, tid, row + i + q);
            r[q][0] = (uint32_t)h | 1;
            r[q][1] = (uint32_t)(h >> 32) | 1;
            for (int l = 0; l < 2; l++) {
                int16_t lo, hi;
                digest_pub_key_halves(r[q][l], &lo, &hi);
                c[q >> 1][2 * l] |= (uint32_t)(uint16_t)lo << (16 * (q & 1));
                c[q >> 1][2 * l + 1] |= (uint32_t)(uint16_t)hi << (16 * (q & 1));
            }
        }
        pub_group512(k0, rp, n, c, nr > 2 ? 2 : 1, acc, dots);
        for (uint64_t q = 0; q < nr; q++) {
            P[2 * (i + q)] = r[q][0] * (bm[0] * dots[q][0]);
            P[2 * (i + q) + 1] = r[q][1] * (bm[1] * dots[q][1]);
        }
    }
    /* Column order back: within each 128-bit lane q of a step, unpacklo held units 8q..8q+3, unpackhi
     * 8q+4..8q+7. */
    const __m512i ia = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i ib = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (uint64_t s = 0; s < steps; s++) {
        const __m512i *a = acc + s * PUB_STEP_VECS;
        uint64_t t = 32 * s, rest = n - t;
        __mmask16 m0 = rest >= 16 ? 0xffff : (__mmask16)((1u << rest) - 1);
        __mmask16 m1 = rest >= 32 ? 0xffff : rest <= 16 ? 0 : (__mmask16)((1u << (rest - 16)) - 1);
        for (int l = 0; l < 2; l++) {
            __m512i lo = _mm512_add_epi32(a[4 * l], _mm512_slli_epi32(a[4 * l + 2], 16));
            __m512i hi = _mm512_add_epi32(a[4 * l + 1], _mm512_slli_epi32(a[4 * l + 3], 16));
            _mm512_mask_storeu_epi32(g + l * n + t, m0, _mm512_permutex2var_epi32(lo, ia, hi));
            _mm512_mask_storeu_epi32(g + l * n + t + 16, m1, _mm512_permutex2var_epi32(lo, ib, hi));
        }
    }
}
#endif

#if DIGEST_HAVE_AVX512
/* ---------------------------------------------------------------- a delta publisher's changed units
 *
 * digest_unit_note for 16 units at a time: the row by a double multiply and a correction, the row's keys by
 * refit_mix64 in 64-bit lanes (DQ's mullo), both versions' units and the column keys by 32-bit gathers, the
 * four products in 32-bit lanes; then the 16 units' sums are added one by one (two units of a vector may share
 * a row or a column). */

#define AVX512DQ __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define AVX512DQ_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), always_inline)) static inline

bool digest_cpu_has_avx512dq(void)
{
    unsigned a, b, c, d;
    return digest_cpu_has_avx512() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_AVX512DQ);
}

AVX512DQ_INLINE __m512i mix64_512(__m512i x)
{
    x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
    x = _mm512_mullo_epi64(x, _mm512_set1_epi64((long long)0x7fb5d329728ea185ULL));
    x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 27));
    x = _mm512_mullo_epi64(x, _mm512_set1_epi64((long long)0x81dadef4bc2dd44dULL));
    return _mm512_xor_si512(x, _mm512_srli_epi64(x, 33));
}

/* Rows of 8 units (32-bit lanes) as 64-bit lanes' keys refit_mix64(h0 + rr * golden). */
AVX512DQ_INLINE __m512i row_keys8(__m256i rr, __m512i h0)
{
    __m512i x = _mm512_mullo_epi64(_mm512_cvtepu32_epi64(rr), _mm512_set1_epi64((long long)DIGEST_GOLDEN));
    return mix64_512(_mm512_add_epi64(x, h0));
}

/* 16 lanes from two 256-bit halves. */
AVX512DQ_INLINE __m512i join256(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Of 16 units u (lanes in m) of j's segment: their rows rr, columns t, row keys r0, r1 and column keys k0, k1
 * times the block's multipliers. */
AVX512DQ_INLINE void units16(const digest_units_t *j, __m512i u, __mmask16 m, __m512i *rr, __m512i *t, __m512i *r0,
                             __m512i *r1, __m512i *k0, __m512i *k1)
{
    const __m512i one = _mm512_set1_epi32(1), bnv = _mm512_set1_epi32((int32_t)j->bn);
    const __m512i h0 = _mm512_set1_epi64((long long)j->h0);
    const __m512d inv = _mm512_set1_pd(j->inv);
    __m256i ra = _mm512_cvttpd_epi32(_mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(u)), inv));
    __m256i rb = _mm512_cvttpd_epi32(_mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(u, 1)), inv));
    __m512i r = join256(ra, rb);
    __m512i c = _mm512_sub_epi32(u, _mm512_mullo_epi32(r, bnv));
    __mmask16 over = _mm512_cmpge_epu32_mask(c, bnv);
    r = _mm512_mask_add_epi32(r, over, r, one);
    c = _mm512_mask_sub_epi32(c, over, c, bnv);
    __m512i ha = row_keys8(_mm512_castsi512_si256(r), h0), hb = row_keys8(_mm512_extracti64x4_epi64(r, 1), h0);
    __m512i lo = join256(_mm512_cvtepi64_epi32(ha), _mm512_cvtepi64_epi32(hb));
    __m512i hi = join256(_mm512_cvtepi64_epi32(_mm512_srli_epi64(ha, 32)),
                         _mm512_cvtepi64_epi32(_mm512_srli_epi64(hb, 32)));
    *r0 = _mm512_or_si512(lo, one);
    *r1 = _mm512_or_si512(hi, one);
    /* The 32-bit words that begin with each column key (lane 0's last word reads lane 1's first key, lane 1's
     * the key's seeds), their low halves sign-extended. */
    __m512i to = _mm512_slli_epi32(c, 1);
    __m512i ka = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, to, (const void *)j->K0, 1);
    __m512i kb = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, to, (const void *)j->K1, 1);
    *k0 = _mm512_mullo_epi32(_mm512_set1_epi32((int32_t)j->bm[0]), _mm512_srai_epi32(_mm512_slli_epi32(ka, 16), 16));
    *k1 = _mm512_mullo_epi32(_mm512_set1_epi32((int32_t)j->bm[1]), _mm512_srai_epi32(_mm512_slli_epi32(kb, 16), 16));
    *rr = r;
    *t = c;
}

AVX512DQ_INLINE __mmask16 mask16(uint32_t cnt) { return (__mmask16)(cnt >= 16 ? 0xffffu : (1u << cnt) - 1); }

AVX512DQ void digest_units_avx512(const digest_units_t *j, const uint16_t *units, uint32_t n)
{
    const __m512i u0 = _mm512_set1_epi32((int32_t)j->u0);
    /* The 32-bit words that end with each unit (signed indices 2 * units[x] - 2): the unit in their high half. */
    const uint8_t *nw = j->nwo, *od = j->odo;
    const __m512i two = _mm512_set1_epi32(2);
    uint32_t *dP = j->dP, *dq0 = j->dq0, *dq1 = j->dq1;
    uint32_t R[16] __attribute__((aligned(64))), T[16] __attribute__((aligned(64)));
    uint32_t P0[16] __attribute__((aligned(64))), P1[16] __attribute__((aligned(64)));
    uint32_t Q0[16] __attribute__((aligned(64))), Q1[16] __attribute__((aligned(64)));
    for (uint32_t x = 0; x < n; x += 16) {
        uint32_t cnt = n - x < 16 ? n - x : 16;
        __mmask16 m = mask16(cnt);
        __m512i uo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, units + x)); /* units[x] */
        __m512i rr, t, r0, r1, k0, k1;
        units16(j, _mm512_add_epi32(uo, u0), m, &rr, &t, &r0, &r1, &k0, &k1);
        __m512i bo = _mm512_sub_epi32(_mm512_slli_epi32(uo, 1), two);
        __m512i a = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, bo, nw, 1);
        __m512i c = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, bo, od, 1);
        __m512i d = _mm512_sub_epi32(_mm512_srai_epi32(a, 16), _mm512_srai_epi32(c, 16));
        __m512i q0 = _mm512_mullo_epi32(r0, d), q1 = _mm512_mullo_epi32(r1, d);
        _mm512_store_si512(R, rr);
        _mm512_store_si512(T, t);
        _mm512_store_si512(Q0, q0);
        _mm512_store_si512(Q1, q1);
        _mm512_store_si512(P0, _mm512_mullo_epi32(q0, k0));
        _mm512_store_si512(P1, _mm512_mullo_epi32(q1, k1));
        for (uint32_t y = 0; y < cnt; y++) {
            dP[2 * (size_t)R[y]] += P0[y];
            dP[2 * (size_t)R[y] + 1] += P1[y];
            dq0[T[y]] += Q0[y];
            dq1[T[y]] += Q1[y];
        }
    }
}

AVX512DQ void digest_units_sum_avx512(const digest_units_t *j, const uint32_t *u, const int32_t *d, uint32_t n,
                                      uint32_t s[2])
{
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (uint32_t x = 0; x < n; x += 16) {
        __mmask16 m = mask16(n - x);
        __m512i rr, t, r0, r1, k0, k1;
        units16(j, _mm512_maskz_loadu_epi32(m, u + x), m, &rr, &t, &r0, &r1, &k0, &k1);
        __m512i dv = _mm512_maskz_loadu_epi32(m, d + x); /* 0 in the lanes past n: they add nothing */
        s0 = _mm512_add_epi32(s0, _mm512_mullo_epi32(_mm512_mullo_epi32(r0, k0), dv));
        s1 = _mm512_add_epi32(s1, _mm512_mullo_epi32(_mm512_mullo_epi32(r1, k1), dv));
    }
    s[0] += hsum512(s0);
    s[1] += hsum512(s1);
}
#endif
