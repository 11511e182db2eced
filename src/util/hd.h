/* Code shared by host C and CUDA device code.
 *
 * Functions marked REFIT_HD are compiled as plain C by the host compiler and
 * as __host__ __device__ functions by nvcc, so the GPU kernels and the CPU
 * tests run the very same arithmetic: the CPU-only CI guards the GPU port. */
#ifndef REFIT_HD_H
#define REFIT_HD_H

#include <stdint.h>

#ifdef __CUDACC__
#define REFIT_HD __host__ __device__
#else
#define REFIT_HD
#endif

/* Zero-initialiser valid for scalars and structs in both C and C++. */
#ifdef __cplusplus
#define REFIT_ZERO_INIT \
    {                   \
    }
#else
#define REFIT_ZERO_INIT \
    {                   \
        0               \
    }
#endif

/* 16 bytes moved as one access (a 128-bit load/store on the GPU). */
typedef struct __attribute__((aligned(16))) {
    uint64_t lo, hi;
} refit_u128_t;

/* Unsigned division that takes the 32-bit path when both operands fit (far
 * cheaper on a GPU). */
REFIT_HD static inline uint64_t refit_hd_div(uint64_t a, uint64_t b)
{
    if ((a | b) <= 0xffffffffULL) return (uint64_t)((uint32_t)a / (uint32_t)b);
    return a / b;
}

/* The index of the last element of arr[0..n) whose `field` is <= key (arr
 * sorted by field, arr[0].field <= key): a table's chunk or block -> its
 * region, box or matrix.  Sets `out` (uint32_t). */
#define REFIT_HD_LAST_LE(out, arr, n, field, key)       \
    do {                                                \
        uint32_t lo_ = 0, hi_ = (n);                    \
        while (hi_ - lo_ > 1) {                         \
            uint32_t mid_ = lo_ + (hi_ - lo_) / 2;      \
            if ((arr)[mid_].field <= (key)) lo_ = mid_; \
            else hi_ = mid_;                            \
        }                                               \
        (out) = lo_;                                    \
    } while (0)

#endif
