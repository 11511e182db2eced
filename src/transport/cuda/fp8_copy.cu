/* Quantize-on-copy: the FP8 kernel (see fp8_gpu.h and plan/fp8_table.h).
 *
 * A persistent grid takes 128x128 blocks of the quantized matrices.  Blocks
 * of one whole piece whose rows are 16-byte aligned (nearly all of them) go
 * through a software pipeline (fp8_pipe_kernel): each thread block keeps the
 * loads of its next block in flight (cp.async into shared memory) while it
 * reduces the current block's amax and writes its e4m3 bytes and scale, so
 * that the barrier a block's amax needs does not stall the memory system.
 * Other blocks (edges, blocks gathered from several pieces, padding) go
 * through a 32 KiB tile in shared memory in a second kernel.  The arithmetic
 * is fp8_hd.h, the CPU stage's own; the whole-block path computes the same
 * bits faster (quant2 below), which refit_gpu_fp8_check_all proves for every
 * input. */
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "data/fp8_hd.h"
#include "transport/cuda/fp8_gpu.h"
#include "transport/cuda/cuda_check.h"
#include "transport/cuda/gpu.h"
#include "util/util.h"
}

#define FP8_THREADS 512
#define FP8_STAGES 2 /* the default: 3 thread blocks of 2 stages per multiprocessor (docs/gpu.md, FP8) */
#define FP8_MAX_STAGES 4
#define BLK REFIT_FP8_BLOCK

#define CK(call) REFIT_CUDA_CK("fp8: ", call)

/* The block's largest absbits, to every thread (red: 32 ints of shared memory). */
__device__ __forceinline__ int32_t block_max(int32_t m, int32_t *red)
{
    m = __reduce_max_sync(0xffffffffu, m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = red[0];
#pragma unroll
    for (int w = 1; w < FP8_THREADS / 32; w++) m = max(m, red[w]);
    return m;
}

/* x / scale correctly rounded, without a division: r = RN(1/scale), q =
 * RN(x r) is within an ulp, and one FMA correction makes it the correctly
 * rounded quotient (Markstein) while 1/scale is a normal number; blocks with
 * smaller scales (exact) divide. */
__device__ __forceinline__ float qdiv(float a, float scale, float r, bool exact)
{
    if (exact) return __fdiv_rn(a, scale);
    float q = __fmul_rn(a, r);
    return __fmaf_rn(__fmaf_rn(-q, scale, a), r, q);
}

/* Two bf16 (a 32-bit word) to two e4m3 bytes: the quotient of |x| converted
 * by the hardware (round to nearest even, saturating to 448, NaN -> 0x7f:
 * refit_fp8_hd_e4m3's rule), the sign of x put back (refit_fp8_hd_quantize). */
__device__ __forceinline__ uint32_t quant2(uint32_t w, float scale, float r, bool exact)
{
    float2 q;
    q.x = qdiv(__uint_as_float((w & 0x7fffu) << 16), scale, r, exact);
    q.y = qdiv(__uint_as_float(w & 0x7fff0000u), scale, r, exact);
    uint32_t v = (uint32_t)__nv_cvt_float2_to_fp8x2(q, __NV_SATFINITE, __NV_E4M3);
    return (v & 0xffffu) | ((w >> 8) & 0x80u) | ((w >> 16) & 0x8000u);
}

__device__ __forceinline__ uint32_t quant4(uint32_t lo, uint32_t hi, float scale, float r, bool exact)
{
    return quant2(lo, scale, r, exact) | quant2(hi, scale, r, exact) << 16;
}

/* The fast division holds while its residual is exact: scale in [2^-90, 2^126] (the exhaustive check
 * found 206 of 1.07e9 pairs off with 2^-126, all with subnormal products); not 0, not inf (amax is
 * inf when a block holds one). */
#define FP8_FAST(scale) ((scale) >= 0x1p-90f && (scale) <= 0x1p126f)

__device__ __forceinline__ int32_t absmax2(uint32_t w, int32_t m)
{
    return max(m, max(refit_fp8_hd_absbits((uint16_t)w), refit_fp8_hd_absbits((uint16_t)(w >> 16))));
}

/* Any block: gathered into the tile (zeros where no piece is: padding). */
__device__ float tile_block(const refit_fp8_piece_t *pc, uint32_t np, const uint64_t *slots, uint32_t rows,
                            uint32_t cols, unsigned char *q, uint64_t ldq, uint16_t *tile, int32_t *red)
{
    uint32_t *t32 = (uint32_t *)tile;
    for (uint32_t i = threadIdx.x; i < BLK * BLK / 2; i += FP8_THREADS) t32[i] = 0;
    __syncthreads();
    for (uint32_t p = 0; p < np; p++) {
        refit_fp8_piece_t x = pc[p];
        const unsigned char *src = (const unsigned char *)(uintptr_t)slots[x.src_slot] + x.src_offset;
        uint32_t w = x.c1 - x.c0, n = (uint32_t)(x.r1 - x.r0) * w;
        for (uint32_t i = threadIdx.x; i < n; i += FP8_THREADS) {
            uint32_t r = i / w, c = i - r * w;
            tile[(x.r0 + r) * BLK + x.c0 + c] = *(const uint16_t *)(src + r * x.src_stride + c * 2);
        }
    }
    __syncthreads();
    int32_t m = 0;
    for (uint32_t i = threadIdx.x; i < rows * cols; i += FP8_THREADS) {
        uint32_t r = i / cols, c = i - r * cols;
        m = max(m, refit_fp8_hd_absbits(tile[r * BLK + c]));
    }
    float scale = refit_fp8_hd_scale(block_max(m, red));
    for (uint32_t i = threadIdx.x; i < rows * cols; i += FP8_THREADS) {
        uint32_t r = i / cols, c = i - r * cols;
        q[r * ldq + c] = refit_fp8_hd_quantize(tile[r * BLK + c], scale);
    }
    return scale;
}

/* Block b's place: its matrix, block row and column, and where its e4m3 bytes go. */
struct block_at {
    const refit_fp8_matrix_t *mt;
    uint64_t bi, bj;
    unsigned char *q;
};

__device__ __forceinline__ block_at locate(const refit_fp8_matrix_t *mats, uint32_t nmats, uint64_t b,
                                           unsigned char *arena)
{
    block_at a;
    a.mt = &mats[refit_fp8_table_matrix(mats, nmats, b)];
    uint64_t k = b - a.mt->first_block;
    a.bi = k / a.mt->bcols;
    a.bj = k - a.bi * a.mt->bcols;
    a.q = arena + a.mt->dst_offset + a.bi * BLK * a.mt->cols + a.bj * BLK;
    return a;
}

/* The whole aligned blocks, software-pipelined: a persistent thread block of
 * 256 threads walks its share of the fast list (blocks i, i + grid, ...) with
 * S shared-memory stages of one 128x128 block each (32 KiB).  While it
 * reduces and writes block k, the loads of blocks k+1 .. k+S-1 are in flight
 * (cp.async, 16 bytes each, straight from global memory, local or a peer's,
 * into shared memory without passing through registers).  Each thread reads
 * back only the 16-byte pieces it loaded itself (its own cp.async group), so
 * a stage needs no barrier before it is refilled; the one barrier per block
 * is the amax reduction's.  Where each block's bytes come from and go is a
 * descriptor per block built at create time (no search on the device), read
 * one iteration ahead.  Thread t loads rows t/16 + 16c (c = 0..7), bytes
 * 16(t%16) .. +16 of each: 16 threads read a row's 256 bytes, and write its
 * 128 e4m3 bytes as 8 bytes each. */
#define PIPE_THREADS 256
#define PIPE_LOADS (BLK * BLK * 2 / 16 / PIPE_THREADS) /* 16-byte loads per thread per block: 8 */
#define PIPE_STAGE (BLK * BLK * 2 / 16)                /* uint4 per stage: 2048 */

struct fast_desc {
    uint64_t src_offset, src_stride; /* from the source slot's base, as the block's piece */
    uint64_t q_offset, scale_offset; /* the block's e4m3 bytes (row stride ldq) and its scale in the arena */
    uint32_t src_slot, ldq;
};

__device__ __forceinline__ void cp_async16(uint4 *smem, const void *gmem)
{
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* This thread's 8 loads of the block d into one stage. */
__device__ __forceinline__ void pipe_issue(const fast_desc &d, const uint64_t *slots, uint4 *stage)
{
    const unsigned char *src = (const unsigned char *)(uintptr_t)slots[d.src_slot] + d.src_offset;
    uint32_t t = threadIdx.x;
#pragma unroll
    for (int c = 0; c < PIPE_LOADS; c++) {
        uint32_t k = t + c * PIPE_THREADS;
        cp_async16(stage + k, src + (k >> 4) * d.src_stride + (k & 15) * 16);
    }
}

template <int S>
__global__ void __launch_bounds__(PIPE_THREADS) fp8_pipe_kernel(const fast_desc *__restrict__ desc, uint64_t n,
                                                                const uint64_t *__restrict__ slots, uint32_t dst_slot)
{
    extern __shared__ uint4 stages[]; /* S x PIPE_STAGE */
    __shared__ int32_t
        red[2][PIPE_THREADS / 32]; /* by the block's parity: a fast warp's next write cannot meet a slow one's read */
    unsigned char *arena = (unsigned char *)(uintptr_t)slots[dst_slot];
    const uint32_t t = threadIdx.x, warp = t >> 5;
    const uint64_t g = gridDim.x;
    uint64_t i = blockIdx.x;
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (i + s * g < n) pipe_issue(desc[i + s * g], slots, stages + s * PIPE_STAGE);
        cp_async_commit();
    }
    fast_desc next; /* the block to issue in the next iteration, loaded one iteration early */
    if (i + (S - 1) * g < n) next = desc[i + (S - 1) * g];
    for (uint32_t k = 0; i < n; i += g, k++) {
        uint64_t j = i + (S - 1) * g;
        if (j < n) {
            pipe_issue(next, slots, stages + ((k + S - 1) % S) * PIPE_STAGE);
            if (j + g < n) next = desc[j + g];
        }
        cp_async_commit();
        const fast_desc d = desc[i]; /* first used after the wait below */
        cp_async_wait<S - 1>();      /* this thread's loads of block i have landed */
        const uint4 *st = stages + (k % S) * PIPE_STAGE;
        uint4 v[PIPE_LOADS];
        int32_t m = 0;
#pragma unroll
        for (int c = 0; c < PIPE_LOADS; c++) {
            v[c] = st[t + c * PIPE_THREADS];
            m = absmax2(v[c].w, absmax2(v[c].z, absmax2(v[c].y, absmax2(v[c].x, m))));
        }
        m = __reduce_max_sync(0xffffffffu, m);
        int32_t *r = red[k & 1];
        if ((t & 31) == 0) r[warp] = m;
        __syncthreads();
#pragma unroll
        for (int w = 0; w < PIPE_THREADS / 32; w++) m = max(m, r[w]);
        float scale = refit_fp8_hd_scale(m), rs = __frcp_rn(scale);
        bool exact = !FP8_FAST(scale);
        unsigned char *q = arena + d.q_offset + (t >> 4) * (uint64_t)d.ldq + (t & 15) * 8;
        bool q8 = !(((uintptr_t)arena | d.q_offset | d.ldq) & 7);
#pragma unroll
        for (int c = 0; c < PIPE_LOADS; c++) {
            uint2 o;
            o.x = quant4(v[c].x, v[c].y, scale, rs, exact);
            o.y = quant4(v[c].z, v[c].w, scale, rs, exact);
            unsigned char *p = q + c * (PIPE_THREADS / 16) * (uint64_t)d.ldq;
            if (q8) *(uint2 *)p = o;
            else memcpy(p, &o, 8);
        }
        if (t == 0) *(float *)(arena + d.scale_offset) = scale;
    }
    cp_async_wait<0>();
}

/* Any block (the slow list, or every block when list is NULL): through the tile. */
__global__ void __launch_bounds__(FP8_THREADS)
    fp8_tile_kernel(const refit_fp8_matrix_t *__restrict__ mats, uint32_t nmats, const uint32_t *__restrict__ list,
                    uint64_t n, const uint32_t *__restrict__ block_piece, const refit_fp8_piece_t *__restrict__ pieces,
                    const uint64_t *__restrict__ slots, uint32_t dst_slot)
{
    __shared__ uint16_t tile[BLK * BLK];
    __shared__ int32_t red[32];
    unsigned char *arena = (unsigned char *)(uintptr_t)slots[dst_slot];
    for (uint64_t i = blockIdx.x; i < n; i += gridDim.x) {
        uint64_t b = list ? list[i] : i;
        block_at a = locate(mats, nmats, b, arena);
        uint32_t rows = a.mt->rows - a.bi * BLK < BLK ? (uint32_t)(a.mt->rows - a.bi * BLK) : BLK;
        uint32_t cols = a.mt->cols - a.bj * BLK < BLK ? (uint32_t)(a.mt->cols - a.bj * BLK) : BLK;
        uint32_t p0 = block_piece[b];
        float scale = tile_block(&pieces[p0], block_piece[b + 1] - p0, slots, rows, cols, a.q, a.mt->cols, tile, red);
        if (threadIdx.x == 0) *(float *)(arena + a.mt->scale_offset + (a.bi * a.mt->bcols + a.bj) * 4) = scale;
        __syncthreads(); /* red and tile are reused by the next block */
    }
}

struct refit_gpu_fp8 {
    int dev;
    refit_fp8_table_t table; /* host copy of the sizes and slot numbering (no pieces) */
    refit_fp8_matrix_t *dmats;
    uint32_t *dblock_piece;
    refit_fp8_piece_t *dpieces;
    uint32_t *dlists; /* the fast list, then the slow one */
    fast_desc *ddesc; /* the fast list's blocks, for the pipelined kernel */
    int stages;       /* fp8_pipe_kernel<stages> */
    int grid_pipe[FP8_MAX_STAGES + 1];
    uint64_t *dslots, *hslots;
    bool slots_valid;
    int grid_tile, sms;
    refit_gpu_batch_t *copy; /* the kept tensors (its own stream) */
    cudaStream_t stream;
    cudaEvent_t done;
};

static int enter(int dev)
{
    int saved = -1;
    if (cudaGetDevice(&saved) != cudaSuccess) saved = -1;
    if (saved != dev) cudaSetDevice(dev);
    return saved;
}

static void leave(int saved)
{
    if (saved >= 0) cudaSetDevice(saved);
}

/* The fast list's descriptors: each block's piece and its place in the arena, resolved once. */
static fast_desc *fast_descs(const refit_fp8_table_t *x)
{
    fast_desc *d = (fast_desc *)malloc((x->full_blocks ? x->full_blocks : 1) * sizeof(fast_desc));
    if (!d) return NULL;
    uint32_t mi = 0;
    for (uint64_t i = 0; i < x->full_blocks; i++) {
        uint64_t b = x->fast[i];
        if (b < x->mats[mi].first_block || (mi + 1 < x->nmats && b >= x->mats[mi + 1].first_block))
            mi = refit_fp8_table_matrix(x->mats, x->nmats, b);
        const refit_fp8_matrix_t *mt = &x->mats[mi];
        const refit_fp8_piece_t *pc = &x->pieces[x->block_piece[b]];
        uint64_t k = b - mt->first_block, bi = k / mt->bcols, bj = k - bi * mt->bcols;
        d[i].src_offset = pc->src_offset;
        d[i].src_stride = pc->src_stride;
        d[i].q_offset = mt->dst_offset + bi * BLK * mt->cols + bj * BLK;
        d[i].scale_offset = mt->scale_offset + (bi * mt->bcols + bj) * 4;
        d[i].src_slot = pc->src_slot;
        d[i].ldq = mt->cols;
    }
    return d;
}

typedef void (*pipe_fn)(const fast_desc *, uint64_t, const uint64_t *, uint32_t);

static pipe_fn pipe_kernel(int stages)
{
    switch (stages) {
    case 2: return fp8_pipe_kernel<2>;
    case 3: return fp8_pipe_kernel<3>;
    case 4: return fp8_pipe_kernel<4>;
    default: return NULL;
    }
}

extern "C" refit_status_t refit_gpu_fp8_create(int dev, const refit_fp8_table_t *x, refit_gpu_fp8_t **out)
{
    refit_status_t st = REFIT_OK;
    *out = NULL;
    if (dev < 0 || dev >= refit_gpu_count())
        return refit_error(REFIT_ERR_UNSUPPORTED, "fp8: CUDA device %d is not here", dev);
    refit_gpu_fp8_t *g = (refit_gpu_fp8_t *)calloc(1, sizeof(*g));
    if (!g) return refit_error(REFIT_ERR_NO_MEMORY, "fp8 GPU table");
    int saved = enter(dev), sms = 0, occ = 0;
    g->dev = dev;
    g->table.nmats = x->nmats;
    g->table.nblocks = x->nblocks;
    g->table.npieces = x->npieces;
    g->table.full_blocks = x->full_blocks;
    g->table.quantized_bf16 = x->quantized_bf16;
    g->table.quantized_out = x->quantized_out;
    g->table.nsrcs = x->nsrcs;
    g->table.dst_slot = x->dst_slot;
    g->table.nslots = x->nslots;
    g->table.src_slot_base = (uint32_t *)malloc((x->nsrcs + 1) * sizeof(uint32_t));
    g->hslots = (uint64_t *)calloc(x->nslots ? x->nslots : 1, sizeof(uint64_t));
    if (!g->table.src_slot_base || !g->hslots) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "fp8 GPU table");
        goto out;
    }
    memcpy(g->table.src_slot_base, x->src_slot_base, (x->nsrcs + 1) * sizeof(uint32_t));
    CK(cudaMalloc(&g->dmats, (x->nmats ? x->nmats : 1) * sizeof(refit_fp8_matrix_t)));
    CK(cudaMalloc(&g->dblock_piece, (x->nblocks + 1) * sizeof(uint32_t)));
    CK(cudaMalloc(&g->dpieces, (x->npieces ? x->npieces : 1) * sizeof(refit_fp8_piece_t)));
    CK(cudaMalloc(&g->dslots, (x->nslots ? x->nslots : 1) * sizeof(uint64_t)));
    CK(cudaMalloc(&g->dlists, (x->nblocks ? x->nblocks : 1) * sizeof(uint32_t)));
    if (x->nblocks) CK(cudaMemcpy(g->dlists, x->fast, x->nblocks * sizeof(uint32_t), cudaMemcpyHostToDevice));
    if (x->nmats) CK(cudaMemcpy(g->dmats, x->mats, x->nmats * sizeof(refit_fp8_matrix_t), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g->dblock_piece, x->block_piece, (x->nblocks + 1) * sizeof(uint32_t), cudaMemcpyHostToDevice));
    if (x->npieces)
        CK(cudaMemcpy(g->dpieces, x->pieces, x->npieces * sizeof(refit_fp8_piece_t), cudaMemcpyHostToDevice));
    CK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming));
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fp8_tile_kernel, FP8_THREADS, 0);
    g->grid_tile = (sms > 0 ? sms : 1) * (occ > 0 ? occ : 4);
    g->sms = sms > 0 ? sms : 1;
    g->stages = FP8_STAGES;
    for (int s = 2; s <= FP8_MAX_STAGES; s++) {
        pipe_fn f = pipe_kernel(s);
        if (!f) continue;
        int smem = s * PIPE_STAGE * 16;
        CK(cudaFuncSetAttribute((const void *)f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        occ = 0;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, f, PIPE_THREADS, smem);
        g->grid_pipe[s] = g->sms * (occ > 0 ? occ : 1);
    }
    if (x->full_blocks) {
        fast_desc *d = fast_descs(x);
        if (!d) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "fp8 GPU table");
            goto out;
        }
        cudaError_t e = cudaMalloc(&g->ddesc, x->full_blocks * sizeof(fast_desc));
        if (e == cudaSuccess) e = cudaMemcpy(g->ddesc, d, x->full_blocks * sizeof(fast_desc), cudaMemcpyHostToDevice);
        free(d);
        CK(e);
    }
    if (x->copy.n) st = refit_gpu_batch_create(dev, &x->copy, &g->copy);
out:
    leave(saved);
    if (st) refit_gpu_fp8_destroy(g);
    else *out = g;
    return st;
}

extern "C" void refit_gpu_fp8_destroy(refit_gpu_fp8_t *g)
{
    if (!g) return;
    int saved = enter(g->dev);
    if (g->stream) cudaStreamSynchronize(g->stream);
    cudaFree(g->dmats);
    cudaFree(g->dblock_piece);
    cudaFree(g->dpieces);
    cudaFree(g->dlists);
    cudaFree(g->ddesc);
    cudaFree(g->dslots);
    if (g->done) cudaEventDestroy(g->done);
    if (g->stream) cudaStreamDestroy(g->stream);
    leave(saved);
    refit_gpu_batch_destroy(g->copy);
    free(g->table.src_slot_base);
    free(g->hslots);
    free(g);
}

extern "C" refit_status_t refit_gpu_fp8_set_kernel(refit_gpu_fp8_t *g, int stages)
{
    if (!pipe_kernel(stages)) return refit_error(REFIT_ERR_INVALID_ARG, "fp8: no kernel with %d stages", stages);
    g->stages = stages;
    return REFIT_OK;
}

extern "C" const refit_fp8_table_t *refit_gpu_fp8_table(const refit_gpu_fp8_t *g) { return &g->table; }

extern "C" refit_status_t refit_gpu_fp8_launch(refit_gpu_fp8_t *g, const uint64_t *slots, uint64_t *launches,
                                               uint64_t *uploads)
{
    refit_status_t st = REFIT_OK;
    int saved = enter(g->dev);
    size_t n = g->table.nslots * sizeof(uint64_t);
    if (!g->slots_valid || memcmp(g->hslots, slots, n) != 0) {
        memcpy(g->hslots, slots, n);
        CK(cudaMemcpyAsync(g->dslots, g->hslots, n, cudaMemcpyHostToDevice, g->stream));
        g->slots_valid = true;
        if (uploads) (*uploads)++;
    }
    if (g->table.nblocks) {
        /* the fast list assumes 16-byte aligned sources: when a base is not, every block takes the tile */
        uint64_t align = 0;
        for (uint32_t k = 0; k < g->table.dst_slot; k++) align |= slots[k];
        uint64_t nfast = align & 15 ? 0 : g->table.full_blocks, nslow = g->table.nblocks - nfast;
        if (nfast) {
            int grid = (uint64_t)g->grid_pipe[g->stages] < nfast ? g->grid_pipe[g->stages] : (int)nfast;
            pipe_kernel(g->stages)<<<grid, PIPE_THREADS, g->stages * PIPE_STAGE * 16, g->stream>>>(
                g->ddesc, nfast, g->dslots, g->table.dst_slot);
            CK(cudaGetLastError());
            if (launches) (*launches)++;
        }
        if (nslow) {
            int grid = (uint64_t)g->grid_tile < nslow ? g->grid_tile : (int)nslow;
            fp8_tile_kernel<<<grid, FP8_THREADS, 0, g->stream>>>(
                g->dmats, g->table.nmats, nfast ? g->dlists + nfast : NULL, nslow, g->dblock_piece, g->dpieces,
                g->dslots, g->table.dst_slot);
            CK(cudaGetLastError());
            if (launches) (*launches)++;
        }
    }
    CK(cudaEventRecord(g->done, g->stream));
    if (g->copy) st = refit_gpu_batch_launch(g->copy, slots, launches, uploads); /* beside it, on its own stream */
out:
    if (st) g->slots_valid = false;
    leave(saved);
    return st;
}

extern "C" refit_status_t refit_gpu_fp8_wait(refit_gpu_fp8_t *g, refit_status_t (*tick)(void *), void *user,
                                             double deadline)
{
    /* the kept tensors' copy ticks and keeps the deadline while it runs; then the FP8 kernel */
    refit_status_t st = g->copy ? refit_gpu_batch_wait(g->copy, tick, user, deadline) : REFIT_OK;
    refit_status_t s2 = refit_gpu_event_wait(g->done, g->dev, "FP8 kernel", st ? NULL : tick, user, st ? 0 : deadline);
    if (s2 == REFIT_ERR_TRANSPORT) g->slots_valid = false;
    return st ? st : s2;
}

/* The arena against version's quantized truth, on dev: the bf16 truth
 * filled into scratch memory, quantized by the same kernel through the
 * identity plan (bf16 layout -> itself), the two arenas compared by digest.
 * Under the GPU's turn (waiting up to a minute: two receivers' scratch at
 * once may not fit beside the sources on one GPU). */
extern "C" refit_status_t refit_gpu_fp8_truth_verify(const refit_manifest_t *bf16, const refit_fp8_target_t *t, int dev,
                                                     const void *arena, uint64_t version)
{
    refit_status_t st;
    void *img = NULL, *ref = NULL;
    refit_plan_t *plan = NULL;
    refit_fp8_table_t x;
    refit_gpu_fp8_t *g = NULL;
    memset(&x, 0, sizeof(x));
    uint64_t nb = refit_manifest_region_size(bf16, 0), nf = refit_fp8_target_bytes(t), dg[2] = {0, 1};
    refit_batch_opts_t o;
    memset(&o, 0, sizeof(o));
    o.max_shift = 4;
    int turn = refit_gpu_turn_take(dev, 0.002, 60.0);
    if ((st = refit_gpu_alloc(dev, nb, &img)) || (st = refit_gpu_alloc(dev, nf, &ref))) goto done;
    if ((st = refit_gpu_truth_fill(bf16, dev, &img, version))) goto done;
    if ((st = refit_plan_create(&bf16, 1, bf16, NULL, &plan))) goto done;
    if ((st = refit_fp8_table_build(plan, bf16, t, &o, &x)) || (st = refit_gpu_fp8_create(dev, &x, &g))) goto done;
    {
        uint64_t *slots = (uint64_t *)calloc(x.nslots, sizeof(uint64_t));
        if (!slots) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "FP8 verification");
            goto done;
        }
        for (uint32_t k = x.src_slot_base[0]; k < x.src_slot_base[1]; k++) slots[k] = (uint64_t)(uintptr_t)img;
        slots[x.dst_slot] = (uint64_t)(uintptr_t)ref;
        st = refit_gpu_fp8_launch(g, slots, NULL, NULL);
        if (!st) st = refit_gpu_fp8_wait(g, NULL, NULL, 0);
        free(slots);
    }
    if (!st) st = refit_gpu_digest(dev, arena, nf, &dg[0]);
    if (!st) st = refit_gpu_digest(dev, ref, nf, &dg[1]);
    for (uint32_t i = 0; !st && dg[0] != dg[1] && i < refit_fp8_target_num_tensors(t); i++) {
        const refit_fp8_tensor_t *e = refit_fp8_target_tensor(t, i);
        uint64_t a = 0, b = 0, n = e->bytes & ~7ull; /* offsets are 256-aligned; a tail of < 8 bytes is not named */
        if ((st = refit_gpu_digest(dev, (const char *)arena + e->offset, n, &a)) ||
            (st = refit_gpu_digest(dev, (const char *)ref + e->offset, n, &b)))
            break;
        if (a != b)
            st = refit_error(REFIT_ERR_VERIFY, "FP8 tensor %s differs from version %" PRIu64 "'s truth quantized",
                             e->name, version);
    }
    if (!st && dg[0] != dg[1])
        st = refit_error(REFIT_ERR_VERIFY, "the FP8 arena differs from version %" PRIu64 "'s truth quantized", version);
done:
    refit_gpu_fp8_destroy(g);
    refit_fp8_table_free(&x);
    refit_plan_destroy(plan);
    refit_gpu_free(img);
    refit_gpu_free(ref);
    refit_gpu_turn_give(turn);
    return st;
}

/* Every pair of a bf16 x and a block maximum amax (absbits, 0 .. inf) that
 * can hold it (absbits(x) <= amax; NaNs count as 0): quant2 against
 * refit_fp8_hd_quantize. */
__global__ void check_all_kernel(unsigned long long *bad, unsigned long long *first, unsigned long long *checked)
{
    const uint64_t n = 65536ull * 0x7f81;
    unsigned long long mine = 0;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)(i & 0xffff), amax = (uint32_t)(i >> 16);
        if (refit_fp8_hd_absbits((uint16_t)x) > (int32_t)amax) continue;
        mine++;
        float scale = refit_fp8_hd_scale((int32_t)amax), r = __frcp_rn(scale);
        uint32_t fast = quant2(x | x << 16, scale, r, !FP8_FAST(scale));
        uint32_t want = refit_fp8_hd_quantize((uint16_t)x, scale);
        if ((fast & 0xff) != want || (fast >> 8) != want) {
            atomicAdd(bad, 1ull);
            atomicCAS(first, ~0ull, (unsigned long long)i);
        }
    }
    atomicAdd(checked, mine);
}

extern "C" refit_status_t refit_gpu_fp8_check_all(int dev, uint64_t *mismatches, uint64_t *checked, uint16_t *first_x,
                                                  uint16_t *first_amax)
{
    refit_status_t st = REFIT_OK;
    unsigned long long *d = NULL, h[3] = {0, ~0ull, 0};
    if (dev < 0 || dev >= refit_gpu_count())
        return refit_error(REFIT_ERR_UNSUPPORTED, "fp8: CUDA device %d is not here", dev);
    int saved = enter(dev);
    CK(cudaMalloc(&d, sizeof(h)));
    CK(cudaMemcpy(d, h, sizeof(h), cudaMemcpyHostToDevice));
    check_all_kernel<<<4096, 256>>>(d, d + 1, d + 2);
    CK(cudaGetLastError());
    CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    *mismatches = h[0];
    *checked = h[2];
    *first_x = h[0] ? (uint16_t)(h[1] & 0xffff) : 0;
    *first_amax = h[0] ? (uint16_t)(h[1] >> 16) : 0;
out:
    cudaFree(d);
    leave(saved);
    return st;
}

__global__ void quantize_all_kernel(const float *scales, uint32_t nscales, uint8_t *q)
{
    uint64_t n = 65536ull * nscales;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
        q[i] = refit_fp8_hd_quantize((uint16_t)(i / nscales), scales[i % nscales]);
}

extern "C" refit_status_t refit_gpu_fp8_quantize_all(int dev, const float *scales, uint32_t nscales, uint8_t *q)
{
    refit_status_t st = REFIT_OK;
    float *ds = NULL;
    uint8_t *dq = NULL;
    if (dev < 0 || dev >= refit_gpu_count())
        return refit_error(REFIT_ERR_UNSUPPORTED, "fp8: CUDA device %d is not here", dev);
    int saved = enter(dev);
    size_t n = 65536ull * nscales;
    CK(cudaMalloc(&ds, nscales * sizeof(float)));
    CK(cudaMalloc(&dq, n));
    CK(cudaMemcpy(ds, scales, nscales * sizeof(float), cudaMemcpyHostToDevice));
    quantize_all_kernel<<<1024, 256>>>(ds, nscales, dq);
    CK(cudaGetLastError());
    CK(cudaMemcpy(q, dq, n, cudaMemcpyDeviceToHost));
out:
    cudaFree(ds);
    cudaFree(dq);
    leave(saved);
    return st;
}
