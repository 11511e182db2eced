/* Batched plan execution: a plan flattened into a table that one kernel
 * launch (or one CPU loop) walks.
 *
 * Each region of the plan becomes one batch region that copies (or zeroes)
 * `units` accesses of 1 << shift bytes (16 when every offset, stride and run
 * is 16-byte aligned, narrower otherwise).  Regions are cut into chunks of
 * about chunk_bytes; first_chunk is a prefix sum, so chunk c belongs to the
 * last region whose first_chunk <= c (a binary search).  A GPU block takes a
 * chunk, its threads take every blockDim-th access of it.  Addresses are
 * slot + offset: slots are the base pointers of source and destination
 * regions, passed separately so that one table serves every step (bases do
 * not change between refits; a table is built once per plan).
 *
 * The per-thread walk (refit_batch_thread_*) is REFIT_HD: the CUDA kernel
 * and refit_batch_execute_host() run the same code, and the CPU tests check
 * the latter against refit_plan_execute_memcpy. */
#ifndef REFIT_PLAN_BATCH_H
#define REFIT_PLAN_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "refit/plan.h"
#include "util/hd.h"

#ifdef __cplusplus
extern "C" {
#endif

#define REFIT_BATCH_ZERO 0xffffffffu /* src_slot of a fill region */

typedef struct {
    uint64_t src_offset, dst_offset; /* bytes from the slot bases */
    uint64_t run_units;              /* accesses per contiguous run */
    uint64_t count[3];               /* loop counts, 1 for unused loops (loop 0 innermost) */
    uint64_t src_stride[3], dst_stride[3];
    uint64_t units;              /* run_units * count[0] * count[1] * count[2] */
    uint64_t first_chunk;        /* prefix sum of chunks */
    uint64_t chunk_units;        /* accesses per chunk */
    uint32_t src_slot, dst_slot; /* src_slot == REFIT_BATCH_ZERO: write zeros */
    uint32_t shift;              /* log2 of the access width (0..4) */
    uint32_t pad_;
} refit_batch_region_t;

typedef struct {
    refit_batch_region_t *regions;
    uint32_t n;
    uint64_t nchunks;
    uint64_t bytes;          /* bytes written */
    uint32_t nsrcs;          /* sources of the plan */
    uint32_t *src_slot_base; /* nsrcs + 1: slots of source s are src_slot_base[s] + its region */
    uint32_t dst_slot_base;  /* slot of destination region r: dst_slot_base + r */
    uint32_t nslots;
} refit_batch_t;

typedef struct {
    uint64_t chunk_bytes; /* 0: 256 KiB */
    uint32_t max_shift;   /* widest access, log2 (0..4); the bases must be aligned to it */
    bool copies, fills;   /* which plan regions to include */
    const uint8_t *only;  /* copies only from sources s with only[s] != 0 (NULL: all) */
} refit_batch_opts_t;

refit_status_t refit_batch_build(const refit_plan_t *plan, const refit_batch_opts_t *o, refit_batch_t *out);
/* One region copying `bytes` from slot 0 to slot 1 (a raw copy through the same kernel). */
refit_status_t refit_batch_single(uint64_t bytes, uint64_t chunk_bytes, uint32_t max_shift, refit_batch_t *out);
void refit_batch_free(refit_batch_t *b);
/* Runs the batch on the CPU exactly as the kernel does (block by block,
 * thread by thread, `threads` threads a block).  slots[i] is slot i's base. */
void refit_batch_execute_host(const refit_batch_t *b, void *const *slots, uint32_t threads);

typedef struct {
    uint64_t col, d[3];
} refit_batch_cursor_t;

REFIT_HD static inline void refit_batch_seek(const refit_batch_region_t *r, uint64_t u, refit_batch_cursor_t *c)
{
    uint64_t row = u / r->run_units;
    c->col = u - row * r->run_units;
    uint64_t q = row / r->count[0];
    c->d[0] = row - q * r->count[0];
    c->d[2] = q / r->count[1];
    c->d[1] = q - c->d[2] * r->count[1];
}

REFIT_HD static inline void refit_batch_advance(const refit_batch_region_t *r, uint64_t n, refit_batch_cursor_t *c)
{
    c->col += n;
    if (c->col < r->run_units) return;
    uint64_t q = refit_hd_div(c->col, r->run_units);
    c->col -= q * r->run_units;
    c->d[0] += q;
    if (c->d[0] < r->count[0]) return;
    q = refit_hd_div(c->d[0], r->count[0]);
    c->d[0] -= q * r->count[0];
    c->d[1] += q;
    if (c->d[1] < r->count[1]) return;
    q = refit_hd_div(c->d[1], r->count[1]);
    c->d[1] -= q * r->count[1];
    c->d[2] += q;
}

REFIT_HD static inline void refit_batch_offsets(const refit_batch_region_t *r, const refit_batch_cursor_t *c,
                                                uint64_t *so, uint64_t *dof)
{
    uint64_t col = c->col << r->shift;
    *so = r->src_offset + col + c->d[0] * r->src_stride[0] + c->d[1] * r->src_stride[1] + c->d[2] * r->src_stride[2];
    *dof = r->dst_offset + col + c->d[0] * r->dst_stride[0] + c->d[1] * r->dst_stride[1] + c->d[2] * r->dst_stride[2];
}

/* Chunk c's region: the last one whose first_chunk <= c. */
REFIT_HD static inline uint32_t refit_batch_find(const refit_batch_region_t *r, uint32_t n, uint64_t c)
{
    uint32_t i;
    REFIT_HD_LAST_LE(i, r, n, first_chunk, c);
    return i;
}

/* One thread's share of accesses u0, u0 + step, ... < u1 of region r: four
 * loads in flight, then four stores.  src NULL writes zeros. */
#define REFIT_BATCH_THREAD_FN(NAME, T)                                                                       \
    REFIT_HD static inline void NAME(const refit_batch_region_t *r, uint64_t u0, uint64_t u1, uint64_t step, \
                                     const unsigned char *src, unsigned char *dst)                           \
    {                                                                                                        \
        if (u0 >= u1) return;                                                                                \
        refit_batch_cursor_t c;                                                                              \
        refit_batch_seek(r, u0, &c);                                                                         \
        const T z = REFIT_ZERO_INIT;                                                                         \
        for (uint64_t u = u0;;) {                                                                            \
            uint64_t s0, d0, s1 = 0, d1 = 0, s2 = 0, d2 = 0, s3 = 0, d3 = 0;                                 \
            int n = 1;                                                                                       \
            refit_batch_offsets(r, &c, &s0, &d0);                                                            \
            if (u + step < u1) {                                                                             \
                refit_batch_advance(r, step, &c);                                                            \
                refit_batch_offsets(r, &c, &s1, &d1);                                                        \
                n = 2;                                                                                       \
                if (u + 2 * step < u1) {                                                                     \
                    refit_batch_advance(r, step, &c);                                                        \
                    refit_batch_offsets(r, &c, &s2, &d2);                                                    \
                    n = 3;                                                                                   \
                    if (u + 3 * step < u1) {                                                                 \
                        refit_batch_advance(r, step, &c);                                                    \
                        refit_batch_offsets(r, &c, &s3, &d3);                                                \
                        n = 4;                                                                               \
                    }                                                                                        \
                }                                                                                            \
            }                                                                                                \
            T v0 = z, v1 = z, v2 = z, v3 = z;                                                                \
            if (src) {                                                                                       \
                v0 = *(const T *)(src + s0);                                                                 \
                if (n > 1) v1 = *(const T *)(src + s1);                                                      \
                if (n > 2) v2 = *(const T *)(src + s2);                                                      \
                if (n > 3) v3 = *(const T *)(src + s3);                                                      \
            }                                                                                                \
            *(T *)(dst + d0) = v0;                                                                           \
            if (n > 1) *(T *)(dst + d1) = v1;                                                                \
            if (n > 2) *(T *)(dst + d2) = v2;                                                                \
            if (n > 3) *(T *)(dst + d3) = v3;                                                                \
            if (n < 4 || u + 4 * step >= u1) break;                                                          \
            refit_batch_advance(r, step, &c);                                                                \
            u += 4 * step;                                                                                   \
        }                                                                                                    \
    }

REFIT_BATCH_THREAD_FN(refit_batch_thread_16, refit_u128_t)
REFIT_BATCH_THREAD_FN(refit_batch_thread_8, uint64_t)
REFIT_BATCH_THREAD_FN(refit_batch_thread_4, uint32_t)
REFIT_BATCH_THREAD_FN(refit_batch_thread_2, uint16_t)
REFIT_BATCH_THREAD_FN(refit_batch_thread_1, uint8_t)

/* Block `tid` of `nthreads` working on chunk c. */
REFIT_HD static inline void refit_batch_chunk(const refit_batch_region_t *regions, uint32_t n, uint64_t c, uint64_t tid,
                                              uint64_t nthreads, const uint64_t *slots)
{
    const refit_batch_region_t *r = &regions[refit_batch_find(regions, n, c)];
    uint64_t u0 = (c - r->first_chunk) * r->chunk_units, u1 = u0 + r->chunk_units;
    if (u1 > r->units) u1 = r->units;
    const unsigned char *src = r->src_slot == REFIT_BATCH_ZERO ? (const unsigned char *)0
                                                               : (const unsigned char *)(uintptr_t)slots[r->src_slot];
    unsigned char *dst = (unsigned char *)(uintptr_t)slots[r->dst_slot];
    switch (r->shift) {
    case 4: refit_batch_thread_16(r, u0 + tid, u1, nthreads, src, dst); break;
    case 3: refit_batch_thread_8(r, u0 + tid, u1, nthreads, src, dst); break;
    case 2: refit_batch_thread_4(r, u0 + tid, u1, nthreads, src, dst); break;
    case 1: refit_batch_thread_2(r, u0 + tid, u1, nthreads, src, dst); break;
    default: refit_batch_thread_1(r, u0 + tid, u1, nthreads, src, dst); break;
    }
}

#ifdef __cplusplus
}
#endif
#endif
