/* The block-FP8 quantizer's arithmetic, shared by the CPU stage (fp8.c) and
 * the GPU quantize-on-copy kernel (src/transport/cuda/fp8_copy.cu): one
 * definition, so that both give the same bits (refit/experimental/fp8.h has the rule).
 *
 * Every float operation here is a single IEEE operation rounded to nearest;
 * on the device they are written with the _rn intrinsics so that nvcc does
 * not contract them into FMAs (host C11 does not contract: -std=c11). */
#ifndef REFIT_FP8_HD_H
#define REFIT_FP8_HD_H

#include <stdint.h>
#include <string.h>

#include "util/hd.h"

#if defined(__CUDA_ARCH__)
#define REFIT_FP8_MUL(a, b) __fmul_rn(a, b)
#define REFIT_FP8_ADD(a, b) __fadd_rn(a, b)
#define REFIT_FP8_SUB(a, b) __fsub_rn(a, b)
#define REFIT_FP8_DIV(a, b) __fdiv_rn(a, b)
#else
#define REFIT_FP8_MUL(a, b) ((a) * (b))
#define REFIT_FP8_ADD(a, b) ((a) + (b))
#define REFIT_FP8_SUB(a, b) ((a) - (b))
#define REFIT_FP8_DIV(a, b) ((a) / (b))
#endif

#define REFIT_FP8_HD_MAX 448.0f

REFIT_HD static inline float refit_fp8_hd_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* |x| of a bf16 for the block maximum, on the bit pattern: |bf16| orders like
 * its low 15 bits; a NaN counts as 0 (as fabsf's comparison would never
 * pick it). */
REFIT_HD static inline int32_t refit_fp8_hd_absbits(uint16_t b)
{
    int32_t a = (int32_t)(b & 0x7fffu);
    return a <= 0x7f80 ? a : 0;
}

/* The block's scale (weight_scale_inv) from its largest absbits. */
REFIT_HD static inline float refit_fp8_hd_scale(int32_t amax_bits)
{
    float amax = refit_fp8_hd_bf16((uint16_t)amax_bits);
    return amax > 0 ? REFIT_FP8_DIV(amax, REFIT_FP8_HD_MAX) : 1.0f;
}

/* float -> e4m3fn, round to nearest even, saturating to +-448, NaN -> sign|0x7f.
 * Branch-free in signed 32-bit arithmetic (the CPU loop vectorizes): every
 * case is computed and one is selected. */
REFIT_HD static inline uint8_t refit_fp8_hd_e4m3(float x)
{
    int32_t u;
    memcpy(&u, &x, 4);
    int32_t sign = (u >> 24) & 0x80;
    u &= 0x7fffffff;
    float a;
    memcpy(&a, &u, 4);
    /* < 2^-6: subnormal, steps of 2^-9, round to nearest even (exact: a * 512 < 8;
     * other values are cleared first, so that the conversion is always defined) */
    float as = u < 0x3c800000 ? a : 0.0f;
    int32_t sub = (int32_t)REFIT_FP8_SUB(REFIT_FP8_ADD(REFIT_FP8_MUL(as, 512.0f), 0x1p23f), 0x1p23f);
    /* normal: keep 3 mantissa bits, rounding to nearest even on the 20 dropped */
    int32_t r = (int32_t)((uint32_t)u + 0x7ffffu + (((uint32_t)u >> 20) & 1)); /* no signed overflow (NaN) */
    int32_t e = (r >> 23) - 120;
    e = e < 0 ? 0 : e; /* below the normal range: the subnormal result is taken instead */
    int32_t code = (e << 3) | ((r >> 20) & 7);
    code = code > 0x7e ? 0x7e : code;
    int32_t v = u < 0x3c800000 ? sub : code;
    v = u >= 0x43e00000 ? 0x7e : v; /* >= 448: saturate */
    v = u > 0x7f800000 ? 0x7f : v;  /* NaN */
    return (uint8_t)(sign | v);
}

/* One element: e4m3(x / scale), the sign taken from x (scale > 0, so it is
 * the quotient's sign for every number; for a NaN the sign of x is kept, as
 * x86 keeps it and a GPU's division would not). */
REFIT_HD static inline uint8_t refit_fp8_hd_quantize(uint16_t x, float scale)
{
    return (uint8_t)(refit_fp8_hd_e4m3(REFIT_FP8_DIV(refit_fp8_hd_bf16((uint16_t)(x & 0x7fffu)), scale)) |
                     ((x >> 8) & 0x80));
}

#endif
