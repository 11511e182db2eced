/* The digest's AVX-512 kernels (F + BW): the receiver's row kernel, the publisher's row kernel and the fused
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
     * never run the main loop, and on this machine's AMD cores masked loads that miss the caches are not
     * covered by the hardware prefetcher (rows of 48 units from memory: 1.2 GB/s with masked steps and no
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
