/* Content digests of device memory: data/digest.h's definition computed by kernels, bit for bit the
 * CPU's (the arithmetic is sums of products mod 2^32, so the order of the additions, and the atomics that
 * make it, change nothing).
 *
 * Work: data/digest.c's items (whole rows of one placement, about 512 KiB) are cut here into tiles of at
 * most TILE_ROWS rows by TILE_UNITS units that never cross a column-key block (65,536 units), so that a
 * tile has one block multiplier m(b); one CUDA block per tile.  A thread takes 8 units (16 bytes) of a
 * row at a time: one 16-byte load of data and two of keys where the tile is 16-byte aligned, else unit
 * by unit.
 *   Receiver (local): acc += r(t,i) m(b) * sum_u k[j+u] v_iu in registers; one atomic per lane per tile
 *   into the placement's sum.
 *   Publisher (table): the row dots into shared memory per row, the column sums r(t,i) v_ij into shared
 *   memory per unit; per tile, atomics into the P slots (row terms) and Q slots (column sums) of the
 *   table; then Q slots times K_j, a scan over the whole table (lanes apart) and, per P or Q array,
 *   the scan minus its value at the array's first slot (wrapping arithmetic makes that exact), and the
 *   check that each placement's P and Q totals agree (else its memory changed during the fill). */
#include <algorithm>
#include <cub/device/device_scan.cuh>
#include <utility>
#include <vector>

#include "transport/cuda/gpu_internal.h"

extern "C" {
#include "data/digest.h"
#include "truth/truth_hd.h" /* refit_hd_mix64: refit_mix64 on the device */
}

#define TILE_ROWS 64u
#define TILE_UNITS 2048u
#define KCOLS_ 65536u
#define GOLDEN 0x9e3779b97f4a7c15ULL

typedef struct {
    uint64_t p, stride; /* device address of the tile's first unit; bytes between rows */
    uint64_t tid, row;  /* canonical tensor id, first row */
    uint64_t j;         /* first unit (canonical column) */
    uint64_t pslot;     /* table entry of P[rel + 1] of the tile's first row */
    uint64_t qslot;     /* table entry of Q[t + 1] of the tile's first unit */
    uint32_t nrows, n, pl, pad;
} tile_t;

typedef struct {
    uint64_t pstart, nrows, qstart, n, c;
} seg_t;

typedef REFIT_VEC(tile_t) tiles_t;
typedef REFIT_VEC(seg_t) segs_t;

struct refit_gpu_digest {
    int dev;
    bool table;
    cudaStream_t stream;
    int16_t *kc;   /* 2 x 65536 column keys, lane 1 after lane 0 */
    tile_t *tiles; /* device */
    uint64_t ntiles;
    seg_t *segs; /* device, table only: one per digestible placement */
    uint64_t nsegs, entries;
    uint32_t *out; /* device: local sums (2 per placement) or the bad-placement flag */
    uint32_t nplacements;
    uint64_t row_seed, blk_seed;
    void *scan_tmp; /* table: CUB's scratch and the scanned copy */
    size_t scan_tmp_bytes;
    uint2 *scanned;
    tile_t *htiles; /* receiver: the tiles, on the host too (refit_gpu_digest_fused_create) */
};

__device__ __forceinline__ void block_mult(uint64_t blk_seed, uint64_t b, uint32_t m[2])
{
    if (b == 0) {
        m[0] = m[1] = 1;
        return;
    }
    uint64_t h = refit_hd_mix64(blk_seed + b * GOLDEN);
    m[0] = (uint32_t)h | 1;
    m[1] = (uint32_t)(h >> 32) | 1;
}

__device__ __forceinline__ uint32_t lo16(uint32_t w) { return (uint32_t)((int32_t)(w << 16) >> 16); }
__device__ __forceinline__ uint32_t hi16(uint32_t w) { return (uint32_t)((int32_t)w >> 16); }

/* The dots of 8 units already loaded (w) with the column keys at kidx (a multiple of 8). */
__device__ __forceinline__ void chunk_of(uint4 w, const int16_t *kc, uint32_t kidx, uint32_t v[8], uint32_t d[2])
{
    uint4 a = __ldg((const uint4 *)(kc + kidx)), b = __ldg((const uint4 *)(kc + KCOLS_ + kidx));
    uint32_t ws[4] = {w.x, w.y, w.z, w.w}, as[4] = {a.x, a.y, a.z, a.w}, bs[4] = {b.x, b.y, b.z, b.w};
    d[0] = d[1] = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[2 * i] = lo16(ws[i]);
        v[2 * i + 1] = hi16(ws[i]);
        d[0] += lo16(as[i]) * v[2 * i] + hi16(as[i]) * v[2 * i + 1];
        d[1] += lo16(bs[i]) * v[2 * i] + hi16(bs[i]) * v[2 * i + 1];
    }
}

/* The 8 (or cnt < 8) units of one chunk, sign-extended, and their dots with the column keys. */
__device__ __forceinline__ void chunk(const uint8_t *q, const int16_t *kc, uint32_t kidx, uint32_t cnt, bool vec,
                                      uint32_t v[8], uint32_t d[2])
{
    d[0] = d[1] = 0;
    if (vec && cnt == 8) {
        chunk_of(__ldg((const uint4 *)q), kc, kidx, v, d);
        return;
    }
    const uint16_t *u = (const uint16_t *)q;
#pragma unroll
    for (uint32_t i = 0; i < 8; i++) {
        v[i] = 0;
        if (i < cnt) {
            v[i] = (uint32_t)(int32_t)(int16_t)u[i];
            d[0] += (uint32_t)(int32_t)kc[kidx + i] * v[i];
            d[1] += (uint32_t)(int32_t)kc[KCOLS_ + kidx + i] * v[i];
        }
    }
}

/* Receiver: acc += r(t,i) m(b) * dot(row i) per thread; one atomic per lane per tile into out[2 pl].  With
 * COPY the tile is read from src_delta bytes further and written where it is hashed: copy and hash in
 * one pass (the bytes hashed are the bytes written).  With SLOTS too (a plan's copy, the fused tiles of
 * refit_gpu_digest_fused_create), row i of the tile is read from slots[pad] + pslot + i * qslot instead. */
template <bool COPY, bool SLOTS>
__global__ void __launch_bounds__(THREADS)
    local_tiles(const tile_t *tiles, const int16_t *kc, uint64_t row_seed, uint64_t blk_seed, int64_t src_delta,
                const uint64_t *slots, uint32_t *out)
{
    __shared__ uint32_t rk[TILE_ROWS][2];
    __shared__ uint32_t red[THREADS / 32][2];
    const tile_t s = tiles[blockIdx.x];
    uint32_t m[2];
    block_mult(blk_seed, s.j / KCOLS_, m);
    for (uint32_t t = threadIdx.x; t < s.nrows; t += blockDim.x) {
        uint64_t h = refit_hd_mix64((s.tid ^ row_seed) + (s.row + t) * GOLDEN);
        rk[t][0] = ((uint32_t)h | 1) * m[0];
        rk[t][1] = ((uint32_t)(h >> 32) | 1) * m[1];
    }
    __syncthreads();
    uint8_t *base = (uint8_t *)s.p;
    const uint32_t nch = (s.n + 7) / 8, total = s.nrows * nch, kbase = (uint32_t)(s.j % KCOLS_);
    /* the source of row `row` (SLOTS): sbase + row * sstride; else row's address + src_delta */
    const uint8_t *sbase = SLOTS ? (const uint8_t *)(uintptr_t)(slots[s.pad] + s.pslot) : NULL;
    const uint64_t sstride = SLOTS ? s.qslot : 0;
    const bool vec = ((s.p | s.stride | (uint64_t)src_delta | (uint64_t)(uintptr_t)sbase | sstride) & 15) == 0 &&
                     (kbase & 7) == 0;
    uint32_t acc0 = 0, acc1 = 0;
    uint32_t idx = threadIdx.x;
    if (COPY && vec) /* two aligned chunks a step: both loads in flight before the stores */
        for (; idx + blockDim.x < total; idx += 2 * blockDim.x) {
            uint32_t ra = idx / nch, ua = (idx - ra * nch) * 8, i2 = idx + blockDim.x, rb = i2 / nch,
                     ub = (i2 - rb * nch) * 8;
            if (s.n - ua < 8 || s.n - ub < 8) break;
            uint8_t *qa = base + ra * s.stride + 2 * (uint64_t)ua, *qb = base + rb * s.stride + 2 * (uint64_t)ub;
            const uint8_t *sa = SLOTS ? sbase + ra * sstride + 2 * (uint64_t)ua : qa + src_delta,
                          *sb = SLOTS ? sbase + rb * sstride + 2 * (uint64_t)ub : qb + src_delta;
            uint4 wa = __ldg((const uint4 *)sa), wb = __ldg((const uint4 *)sb);
            *(uint4 *)qa = wa;
            *(uint4 *)qb = wb;
            uint32_t v[8], d[2];
            chunk_of(wa, kc, kbase + ua, v, d);
            acc0 += rk[ra][0] * d[0];
            acc1 += rk[ra][1] * d[1];
            chunk_of(wb, kc, kbase + ub, v, d);
            acc0 += rk[rb][0] * d[0];
            acc1 += rk[rb][1] * d[1];
        }
    for (; idx < total; idx += blockDim.x) {
        uint32_t row = idx / nch, u0 = (idx - row * nch) * 8, cnt = min(8u, s.n - u0), v[8], d[2];
        uint8_t *q = base + row * s.stride + 2 * (uint64_t)u0;
        const uint8_t *sq = SLOTS ? sbase + row * sstride + 2 * (uint64_t)u0 : q + src_delta;
        if (COPY) {
            if (vec && cnt == 8) *(uint4 *)q = __ldg((const uint4 *)sq);
            else if (((uintptr_t)q | (uintptr_t)sq) & 1)
                for (uint32_t i = 0; i < 2 * cnt; i++) q[i] = sq[i];
            else
                for (uint32_t i = 0; i < cnt; i++) ((uint16_t *)q)[i] = ((const uint16_t *)sq)[i];
        }
        chunk(COPY ? sq : q, kc, kbase + u0, cnt, vec, v, d);
        acc0 += rk[row][0] * d[0];
        acc1 += rk[row][1] * d[1];
    }
    for (int o = 16; o; o >>= 1) {
        acc0 += __shfl_xor_sync(0xffffffffu, acc0, o);
        acc1 += __shfl_xor_sync(0xffffffffu, acc1, o);
    }
    if ((threadIdx.x & 31) == 0) {
        red[threadIdx.x / 32][0] = acc0;
        red[threadIdx.x / 32][1] = acc1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t a0 = 0, a1 = 0;
        for (uint32_t w = 0; w < blockDim.x / 32; w++) {
            a0 += red[w][0];
            a1 += red[w][1];
        }
        atomicAdd(&out[2 * s.pl], a0);
        atomicAdd(&out[2 * s.pl + 1], a1);
    }
}

/* Publisher: thread t keeps chunk column t % nch of rows t / nch, t / nch + per, ... (per = rows a pass
 * covers), so its column sums r(t,i) v_ij stay in registers across rows; row dots go to shared memory;
 * per tile, the row terms r m dot into the P slots and the column sums into the Q slots (atomics: a row
 * wider than a tile, a placement of several items). */
__global__ void __launch_bounds__(THREADS)
    table_tiles(const tile_t *tiles, const int16_t *kc, uint64_t row_seed, uint64_t blk_seed, uint32_t *tab)
{
    __shared__ uint32_t rk[TILE_ROWS][2], rd[TILE_ROWS][2];
    __shared__ uint32_t g[TILE_UNITS][2];
    const tile_t s = tiles[blockIdx.x];
    uint32_t m[2];
    block_mult(blk_seed, s.j / KCOLS_, m);
    for (uint32_t t = threadIdx.x; t < s.nrows; t += blockDim.x) {
        uint64_t h = refit_hd_mix64((s.tid ^ row_seed) + (s.row + t) * GOLDEN);
        rk[t][0] = (uint32_t)h | 1;
        rk[t][1] = (uint32_t)(h >> 32) | 1;
        rd[t][0] = rd[t][1] = 0;
    }
    for (uint32_t u = threadIdx.x; u < s.n; u += blockDim.x) g[u][0] = g[u][1] = 0;
    __syncthreads();
    const uint8_t *base = (const uint8_t *)s.p;
    const uint32_t nch = (s.n + 7) / 8, per = blockDim.x / nch, kbase = (uint32_t)(s.j % KCOLS_);
    const bool vec = ((s.p | s.stride) & 15) == 0 && (kbase & 7) == 0;
    const uint32_t ch = threadIdx.x % nch, u0 = ch * 8, cnt = min(8u, s.n - u0);
    uint32_t g0[8] = {0}, g1[8] = {0};
    if (threadIdx.x < per * nch) {
        for (uint32_t row = threadIdx.x / nch; row < s.nrows; row += per) {
            uint32_t v[8], d[2], r0 = rk[row][0], r1 = rk[row][1];
            chunk(base + row * s.stride + 2 * (uint64_t)u0, kc, kbase + u0, cnt, vec, v, d);
            /* The lanes of this warp on the same row add their dots first (one shared atomic per row and
             * warp instead of up to 32 on one address). */
            uint32_t same = __match_any_sync(__activemask(), row);
            uint32_t s0 = __reduce_add_sync(same, d[0]), s1 = __reduce_add_sync(same, d[1]);
            if ((threadIdx.x & 31) == (uint32_t)(__ffs(same) - 1)) {
                atomicAdd(&rd[row][0], s0);
                atomicAdd(&rd[row][1], s1);
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                g0[i] += r0 * v[i];
                g1[i] += r1 * v[i];
            }
        }
        for (uint32_t i = 0; i < cnt; i++) {
            atomicAdd(&g[u0 + i][0], g0[i]);
            atomicAdd(&g[u0 + i][1], g1[i]);
        }
    }
    __syncthreads();
    for (uint32_t t = threadIdx.x; t < s.nrows; t += blockDim.x) {
        atomicAdd(&tab[2 * (s.pslot + t)], rk[t][0] * m[0] * rd[t][0]);
        atomicAdd(&tab[2 * (s.pslot + t) + 1], rk[t][1] * m[1] * rd[t][1]);
    }
    for (uint32_t u = threadIdx.x; u < s.n; u += blockDim.x) {
        atomicAdd(&tab[2 * (s.qslot + u)], g[u][0]);
        atomicAdd(&tab[2 * (s.qslot + u) + 1], g[u][1]);
    }
}

/* Q slots: column sums gamma_j -> K_j * gamma_j (K_j with its block's multiplier). */
__global__ void q_keys(const seg_t *segs, const int16_t *kc, uint64_t blk_seed, uint32_t *tab)
{
    const seg_t s = segs[blockIdx.x];
    for (uint64_t t = threadIdx.x; t < s.n; t += blockDim.x) {
        uint64_t j = s.c + t, e = s.qstart + 1 + t;
        uint32_t m[2];
        block_mult(blk_seed, j / KCOLS_, m);
        tab[2 * e] *= m[0] * (uint32_t)(int32_t)kc[j % KCOLS_];
        tab[2 * e + 1] *= m[1] * (uint32_t)(int32_t)kc[KCOLS_ + j % KCOLS_];
    }
}

struct add2 {
    __device__ __forceinline__ uint2 operator()(const uint2 &a, const uint2 &b) const
    {
        return make_uint2(a.x + b.x, a.y + b.y);
    }
};

/* Per placement: P and Q arrays = the scan minus the scan at their first slot (slot 0 holds 0); flags a
 * placement whose totals differ. */
__global__ void rebase(const seg_t *segs, const uint2 *scanned, uint2 *tab, uint32_t *bad)
{
    const seg_t s = segs[blockIdx.x];
    const uint2 p0 = scanned[s.pstart], q0 = scanned[s.qstart];
    for (uint64_t t = threadIdx.x; t <= s.nrows; t += blockDim.x) {
        uint2 x = scanned[s.pstart + t];
        tab[s.pstart + t] = make_uint2(x.x - p0.x, x.y - p0.y);
    }
    for (uint64_t t = threadIdx.x; t <= s.n; t += blockDim.x) {
        uint2 x = scanned[s.qstart + t];
        tab[s.qstart + t] = make_uint2(x.x - q0.x, x.y - q0.y);
    }
    if (threadIdx.x == 0) {
        uint2 pe = scanned[s.pstart + s.nrows], qe = scanned[s.qstart + s.n];
        if (pe.x - p0.x != qe.x - q0.x || pe.y - p0.y != qe.y - q0.y) atomicMin(bad, blockIdx.x);
    }
}

/* ---- host side ------------------------------------------------------------ */

/* Cuts item `it` into tiles (rows of TILE_ROWS, columns of TILE_UNITS not crossing a key block). */
static int push_tiles(tiles_t *v, const refit_digest_item_t *it, uint64_t pbase, uint64_t qbase, uint64_t c)
{
    for (uint64_t r = 0; r < it->nrows; r += TILE_ROWS)
        for (uint64_t u = 0; u < it->n;) {
            uint64_t j = it->first_unit + u, len = REFIT_MIN(it->n - u, (uint64_t)TILE_UNITS);
            len = REFIT_MIN(len, KCOLS_ - j % KCOLS_);
            tile_t t = {.p = (uint64_t)(uintptr_t)(it->p + r * it->stride + 2 * u),
                        .stride = it->stride,
                        .tid = it->tensor_id,
                        .row = it->row + r,
                        .j = j,
                        .pslot = pbase + 1 + it->rel + r,
                        .qslot = qbase + 1 + (j - c),
                        .nrows = (uint32_t)REFIT_MIN((uint64_t)TILE_ROWS, it->nrows - r),
                        .n = (uint32_t)len,
                        .pl = it->pl,
                        .pad = 0};
            if (REFIT_VEC_PUSH(v, t) < 0) return -1;
            u += len;
        }
    return 0;
}

/* The table's P/Q segments of m (offsets in entries) and the tiles of its items. */
static refit_status_t build_lists(const refit_manifest_t *m, const refit_digest_item_t *items, size_t nitems,
                                  bool table, tiles_t *tiles, segs_t *segs)
{
    uint32_t np = refit_manifest_num_placements(m);
    uint64_t *offs = (uint64_t *)malloc((np ? np : 1) * sizeof(uint64_t));
    if (!offs) return refit_error(REFIT_ERR_NO_MEMORY, "GPU digest: offsets");
    refit_digest_table_offsets(m, offs);
    /* Items are in placement order: at a placement's first, its box's rows from its last. */
    uint64_t pbase = 0, qbase = 0;
    for (size_t i = 0; i < nitems; i++) {
        const refit_digest_item_t *it = &items[i];
        if (i == 0 || items[i - 1].pl != it->pl) {
            size_t last = i;
            while (last + 1 < nitems && items[last + 1].pl == it->pl) last++;
            uint64_t box_rows = items[last].rel + items[last].nrows;
            pbase = table ? offs[it->pl] / 8 : 0;
            qbase = pbase + box_rows + 1;
            seg_t s = {.pstart = pbase, .nrows = box_rows, .qstart = qbase, .n = it->n, .c = it->first_unit};
            if (table && REFIT_VEC_PUSH(segs, s) < 0) goto oom;
        }
        if (push_tiles(tiles, it, pbase, qbase, it->first_unit)) goto oom;
    }
    free(offs);
    return REFIT_OK;
oom:
    free(offs);
    return refit_error(REFIT_ERR_NO_MEMORY, "GPU digest: work list");
}

extern "C" void refit_gpu_digest_destroy(refit_gpu_digest_t *g)
{
    if (!g) return;
    devguard_t dg;
    bool in = gpu_enter(g->dev, &dg) == REFIT_OK;
    if (g->stream) cudaStreamDestroy(g->stream);
    cudaFree(g->kc);
    cudaFree(g->tiles);
    cudaFree(g->segs);
    cudaFree(g->out);
    cudaFree(g->scan_tmp);
    cudaFree(g->scanned);
    if (in) gpu_leave(&dg);
    free(g->htiles);
    free(g);
}

static refit_status_t upload(refit_gpu_digest_t *g, const refit_digest_key_t *k, const tile_t *tiles, const seg_t *segs)
{
    refit_status_t st = REFIT_OK;
    CK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    CK(cudaMalloc(&g->kc, 2 * KCOLS_ * sizeof(int16_t)));
    CK(cudaMemcpy(g->kc, refit_digest_key_columns(k, 0), KCOLS_ * sizeof(int16_t), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g->kc + KCOLS_, refit_digest_key_columns(k, 1), KCOLS_ * sizeof(int16_t), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&g->tiles, (g->ntiles ? g->ntiles : 1) * sizeof(tile_t)));
    if (g->ntiles) CK(cudaMemcpy(g->tiles, tiles, g->ntiles * sizeof(tile_t), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&g->out, (g->table ? 1 : 2 * (size_t)(g->nplacements ? g->nplacements : 1)) * sizeof(uint32_t)));
    if (!g->table) goto out;
    CK(cudaMalloc(&g->segs, (g->nsegs ? g->nsegs : 1) * sizeof(seg_t)));
    if (g->nsegs) CK(cudaMemcpy(g->segs, segs, g->nsegs * sizeof(seg_t), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&g->scanned, (g->entries ? g->entries : 1) * sizeof(uint2)));
    CK(cub::DeviceScan::InclusiveScan(NULL, g->scan_tmp_bytes, (uint2 *)NULL, (uint2 *)NULL, add2(),
                                      (int64_t)(g->entries ? g->entries : 1), g->stream));
    CK(cudaMalloc(&g->scan_tmp, g->scan_tmp_bytes ? g->scan_tmp_bytes : 1));
out:
    if (!st) CK(cudaStreamSynchronize(0)); /* the uploads' DMA, before the stream's first kernel */
    return st;
}

extern "C" refit_status_t refit_gpu_digest_create(int dev, const refit_digest_key_t *k, const refit_manifest_t *m,
                                                  void *const *bases, bool table, refit_gpu_digest_t **out)
{
    if (!k || !m || !bases || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_gpu_digest_create: NULL argument");
    refit_digest_item_t *items = NULL;
    size_t nitems = 0;
    refit_status_t st = refit_digest_items(k, m, (const void *const *)bases, table, &items, &nitems);
    if (st) return st;
    tiles_t tiles = {};
    segs_t segs = {};
    devguard_t dg = {-1};
    refit_gpu_digest_t *g = (refit_gpu_digest_t *)calloc(1, sizeof(*g));
    if (!g) st = refit_error(REFIT_ERR_NO_MEMORY, "GPU digest");
    if (!st) st = build_lists(m, items, nitems, table, &tiles, &segs);
    if (!st && tiles.len > INT32_MAX) st = refit_error(REFIT_ERR_INVALID_ARG, "GPU digest: %zu tiles", tiles.len);
    if (!st) st = gpu_enter(dev, &dg);
    if (!st) {
        g->dev = dev;
        g->table = table;
        g->ntiles = tiles.len;
        g->nsegs = segs.len;
        g->entries = refit_digest_table_bytes(m) / 8;
        g->nplacements = refit_manifest_num_placements(m);
        refit_digest_key_seeds(k, &g->row_seed, &g->blk_seed);
        st = upload(g, k, tiles.data, segs.data);
        gpu_leave(&dg);
    }
    if (!st && !table) { /* kept for the fused copies */
        g->htiles = tiles.data;
        tiles.data = NULL;
    }
    free(items);
    REFIT_VEC_FREE(&tiles);
    REFIT_VEC_FREE(&segs);
    if (st) {
        refit_gpu_digest_destroy(g);
        return st;
    }
    *out = g;
    return REFIT_OK;
}

static refit_status_t local_run(refit_gpu_digest_t *g, int64_t src_delta, bool copy, void *sums)
{
    if (!g || !sums || g->table) return refit_error(REFIT_ERR_INVALID_ARG, "refit_gpu_digest_local_run: bad argument");
    devguard_t dg;
    refit_status_t st = gpu_enter(g->dev, &dg);
    if (st) return st;
    size_t bytes = 2 * (size_t)g->nplacements * sizeof(uint32_t);
    CK(cudaMemsetAsync(g->out, 0, bytes ? bytes : 4, g->stream));
    if (g->ntiles && copy)
        local_tiles<true, false><<<(unsigned)g->ntiles, THREADS, 0, g->stream>>>(g->tiles, g->kc, g->row_seed,
                                                                                 g->blk_seed, src_delta, NULL, g->out);
    else if (g->ntiles)
        local_tiles<false, false><<<(unsigned)g->ntiles, THREADS, 0, g->stream>>>(g->tiles, g->kc, g->row_seed,
                                                                                  g->blk_seed, 0, NULL, g->out);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(sums, g->out, bytes, cudaMemcpyDeviceToHost, g->stream));
    CK(cudaStreamSynchronize(g->stream));
out:
    gpu_leave(&dg);
    return st;
}

extern "C" refit_status_t refit_gpu_digest_local_run(refit_gpu_digest_t *g, void *sums)
{
    return local_run(g, 0, false, sums);
}

extern "C" refit_status_t refit_gpu_digest_copy_run(refit_gpu_digest_t *g, int64_t src_delta, void *sums)
{
    return local_run(g, src_delta, true, sums);
}

extern "C" refit_status_t refit_gpu_digest_table_run(refit_gpu_digest_t *g, void *table)
{
    if (!g || !g->table || (!table && g->entries))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_gpu_digest_table_run: bad argument");
    devguard_t dg;
    refit_status_t st = gpu_enter(g->dev, &dg);
    uint32_t bad = UINT32_MAX;
    if (st) return st;
    if (!g->entries) goto out;
    CK(cudaMemsetAsync(table, 0, g->entries * 8, g->stream));
    CK(cudaMemcpyAsync(g->out, &bad, 4, cudaMemcpyHostToDevice, g->stream));
    if (g->ntiles) {
        table_tiles<<<(unsigned)g->ntiles, THREADS, 0, g->stream>>>(g->tiles, g->kc, g->row_seed, g->blk_seed,
                                                                    (uint32_t *)table);
        CK(cudaGetLastError());
    }
    q_keys<<<(unsigned)g->nsegs, THREADS, 0, g->stream>>>(g->segs, g->kc, g->blk_seed, (uint32_t *)table);
    CK(cudaGetLastError());
    CK(cub::DeviceScan::InclusiveScan(g->scan_tmp, g->scan_tmp_bytes, (const uint2 *)table, g->scanned, add2(),
                                      (int64_t)g->entries, g->stream));
    rebase<<<(unsigned)g->nsegs, THREADS, 0, g->stream>>>(g->segs, g->scanned, (uint2 *)table, g->out);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(&bad, g->out, 4, cudaMemcpyDeviceToHost, g->stream));
    CK(cudaStreamSynchronize(g->stream));
    if (bad != UINT32_MAX)
        st = refit_error(REFIT_ERR_INTERNAL,
                         "GPU digest table: segment %u sums differently by rows and by columns: its memory changed "
                         "during the fill",
                         bad);
out:
    gpu_leave(&dg);
    return st;
}

/* ---- the receiver's check on the device -------------------------------------------------------------- */

/* One term of a placement's expected digest: entry `entry` (8 bytes) of source `src`'s table, added or
 * subtracted. */
typedef struct {
    uint64_t entry;
    uint32_t src;
    int32_t sign;
} dterm_t;

/* One verifiable placement: its sums' index and its terms. */
typedef struct {
    uint32_t pl, first, n, pad;
} dcheck_t;

struct refit_gpu_digest_check {
    int dev;
    uint32_t nchecks, nsrcs;
    dcheck_t *checks; /* device */
    dterm_t *terms;   /* device */
    uint64_t *tables; /* device: nsrcs table addresses */
    uint64_t *htables;
    uint32_t *res; /* device: mismatches, first mismatching placement */
    uint32_t *hres;
};

/* Thread per verifiable placement: the sum of its terms against the local sums. */
__global__ void check_kernel(const dcheck_t *checks, uint32_t n, const dterm_t *terms, const uint64_t *tables,
                             const uint32_t *sums, uint32_t *res)
{
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const dcheck_t c = checks[i];
    uint32_t e0 = 0, e1 = 0;
    for (uint32_t t = c.first; t < c.first + c.n; t++) {
        const dterm_t d = terms[t];
        const uint2 v = ((const uint2 *)tables[d.src])[d.entry];
        if (d.sign > 0) {
            e0 += v.x;
            e1 += v.y;
        } else {
            e0 -= v.x;
            e1 -= v.y;
        }
    }
    if (e0 != sums[2 * c.pl] || e1 != sums[2 * c.pl + 1]) {
        atomicAdd(&res[0], 1u);
        atomicMin(&res[1], c.pl);
    }
}

extern "C" void refit_gpu_digest_check_destroy(refit_gpu_digest_check_t *c)
{
    if (!c) return;
    devguard_t dg;
    bool in = gpu_enter(c->dev, &dg) == REFIT_OK;
    cudaFree(c->checks);
    cudaFree(c->terms);
    cudaFree(c->tables);
    cudaFree(c->res);
    cudaFreeHost(c->hres);
    if (in) gpu_leave(&dg);
    free(c->htables);
    free(c);
}

extern "C" refit_status_t refit_gpu_digest_check_create(const refit_gpu_digest_t *g, const refit_digest_plan_t *plan,
                                                        uint32_t nsrcs, refit_gpu_digest_check_t **out)
{
    if (!g || !plan || !out || g->table)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_gpu_digest_check_create: bad argument");
    size_t nf = 0;
    const refit_digest_fetch_t *f = refit_digest_plan_fetches(plan, &nf);
    const uint32_t *start = NULL;
    uint32_t n = 0;
    const refit_digest_term_t *terms = refit_digest_plan_terms(plan, &start, &n);
    if (n > g->nplacements) return refit_error(REFIT_ERR_INVALID_ARG, "GPU digest check: another manifest's plan");
    REFIT_VEC(dcheck_t) cv = {};
    REFIT_VEC(dterm_t) tv = {};
    refit_status_t st = REFIT_OK;
    devguard_t dg = {-1};
    refit_gpu_digest_check_t *c = (refit_gpu_digest_check_t *)calloc(1, sizeof(*c));
    if (!c) return refit_error(REFIT_ERR_NO_MEMORY, "GPU digest check");
    c->dev = g->dev;
    c->nsrcs = nsrcs;
    for (uint32_t i = 0; i < n && !st; i++) {
        if (refit_digest_plan_reason(plan, i) != REFIT_DIGEST_VERIFIABLE) continue;
        dcheck_t d = {i, (uint32_t)tv.len, start[i + 1] - start[i], 0};
        for (uint32_t t = start[i]; t < start[i + 1] && !st; t++) {
            const refit_digest_fetch_t *e = &f[terms[t].fetch];
            if (e->src >= nsrcs || e->offset % 8) st = refit_error(REFIT_ERR_INTERNAL, "GPU digest check: bad term");
            dterm_t x = {e->offset / 8, e->src, terms[t].sign};
            if (!st && REFIT_VEC_PUSH(&tv, x) < 0) st = refit_error(REFIT_ERR_NO_MEMORY, "GPU digest check");
        }
        if (!st && REFIT_VEC_PUSH(&cv, d) < 0) st = refit_error(REFIT_ERR_NO_MEMORY, "GPU digest check");
    }
    c->nchecks = (uint32_t)cv.len;
    c->htables = (uint64_t *)calloc(nsrcs ? nsrcs : 1, sizeof(uint64_t));
    if (!st && !c->htables) st = refit_error(REFIT_ERR_NO_MEMORY, "GPU digest check");
    if (!st) st = gpu_enter(g->dev, &dg);
    if (!st) {
        CK(cudaMalloc(&c->checks, (cv.len ? cv.len : 1) * sizeof(dcheck_t)));
        CK(cudaMalloc(&c->terms, (tv.len ? tv.len : 1) * sizeof(dterm_t)));
        CK(cudaMalloc(&c->tables, (nsrcs ? nsrcs : 1) * sizeof(uint64_t)));
        CK(cudaMalloc(&c->res, 2 * sizeof(uint32_t)));
        CK(cudaMallocHost(&c->hres, 2 * sizeof(uint32_t)));
        if (cv.len) CK(cudaMemcpy(c->checks, cv.data, cv.len * sizeof(dcheck_t), cudaMemcpyHostToDevice));
        if (tv.len) CK(cudaMemcpy(c->terms, tv.data, tv.len * sizeof(dterm_t), cudaMemcpyHostToDevice));
        /* a pageable cudaMemcpy may return before its DMA ends, on the legacy stream, which g's non-blocking
         * stream does not wait for */
        CK(cudaStreamSynchronize(0));
        /* No cudaMemset here: on the legacy stream it may still run after the first run's upload on g's
         * (non-blocking) stream and zero the addresses (seen: illegal accesses at a first check).  The host
         * mirror starts at an address no source has, so the first run uploads every entry. */
        for (uint32_t i = 0; i < nsrcs; i++) c->htables[i] = UINT64_MAX;
    out:
        gpu_leave(&dg);
    }
    REFIT_VEC_FREE(&cv);
    REFIT_VEC_FREE(&tv);
    if (st) {
        refit_gpu_digest_check_destroy(c);
        return st;
    }
    *out = c;
    return REFIT_OK;
}

extern "C" refit_status_t refit_gpu_digest_verify_run(refit_gpu_digest_t *g, refit_gpu_digest_check_t *c,
                                                      const void *const *tables, bool summed, uint64_t *mismatches,
                                                      uint32_t *first, void *sums)
{
    if (!g || !c || g->table || c->dev != g->dev || !mismatches || !sums || (!tables && c->nsrcs))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_gpu_digest_verify_run: bad argument");
    devguard_t dg;
    refit_status_t st = gpu_enter(g->dev, &dg);
    if (st) return st;
    size_t bytes = 2 * (size_t)g->nplacements * sizeof(uint32_t);
    bool changed = false;
    for (uint32_t s = 0; s < c->nsrcs; s++) {
        uint64_t a = (uint64_t)(uintptr_t)tables[s];
        changed |= a != c->htables[s];
        c->htables[s] = a;
    }
    if (changed)
        CK(cudaMemcpyAsync(c->tables, c->htables, c->nsrcs * sizeof(uint64_t), cudaMemcpyHostToDevice, g->stream));
    if (!summed) {
        CK(cudaMemsetAsync(g->out, 0, bytes ? bytes : 4, g->stream));
        if (g->ntiles)
            local_tiles<false, false><<<(unsigned)g->ntiles, THREADS, 0, g->stream>>>(g->tiles, g->kc, g->row_seed,
                                                                                      g->blk_seed, 0, NULL, g->out);
        CK(cudaGetLastError());
    }
    c->hres[0] = 0;
    c->hres[1] = UINT32_MAX;
    CK(cudaMemcpyAsync(c->res, c->hres, 2 * sizeof(uint32_t), cudaMemcpyHostToDevice, g->stream));
    if (c->nchecks) {
        check_kernel<<<(c->nchecks + THREADS - 1) / THREADS, THREADS, 0, g->stream>>>(c->checks, c->nchecks, c->terms,
                                                                                      c->tables, g->out, c->res);
        CK(cudaGetLastError());
    }
    CK(cudaMemcpyAsync(c->hres, c->res, 2 * sizeof(uint32_t), cudaMemcpyDeviceToHost, g->stream));
    CK(cudaStreamSynchronize(g->stream));
    *mismatches = c->hres[0];
    if (first) *first = c->hres[1];
    if (c->hres[0]) CK(cudaMemcpy(sums, g->out, bytes, cudaMemcpyDeviceToHost));
out:
    gpu_leave(&dg);
    return st;
}

/* ---- a plan's copy that hashes what it writes -------------------------------------------------------- */

struct refit_gpu_digest_fused {
    int dev;
    tile_t *tiles; /* device: g's tiles cut where the runs that write them change */
    uint64_t ntiles;
    uint64_t *slots; /* device: source addresses */
    uint64_t *hslots;
    uint32_t nslots;
};

typedef struct {
    size_t run;
    uint64_t a, b; /* bytes [a, b) of the run that tiles cover */
} covered_t;

/* One piece of a tile row: units [u0, u0 + n) read from slot `slot` at src. */
typedef struct {
    uint32_t u0, n, slot;
    uint64_t src;
} piece_t;

typedef REFIT_VEC(piece_t) pieces_t;
typedef REFIT_VEC(covered_t) covs_t;

static int cmp_covered(const void *x, const void *y)
{
    const covered_t *a = (const covered_t *)x, *b = (const covered_t *)y;
    if (a->run != b->run) return a->run < b->run ? -1 : 1;
    return a->a < b->a ? -1 : (a->a > b->a);
}

/* The runs by destination address: ord[k] the run, odst[k] its address. */
typedef struct {
    const refit_gpu_run_t *runs;
    const size_t *ord;
    const uint64_t *odst;
    size_t n;
    uint64_t *covered;     /* per run: bytes tiles cover */
    const uint8_t *detail; /* per run: record its covered pieces in cov (NULL: none) */
} runidx_t;

/* The pieces of the row of `len` bytes at `addr`; false when a byte of it is not written by exactly one run,
 * a run starts or ends inside a unit, or a piece would be read from an odd source offset. */
static bool row_pieces(const runidx_t *x, uint64_t addr, uint64_t len, pieces_t *out, covs_t *cov)
{
    out->len = 0;
    size_t k = (size_t)(std::upper_bound(x->odst, x->odst + x->n, addr) - x->odst); /* first run after addr */
    k = k ? k - 1 : 0;
    uint64_t a = addr, end = addr + len;
    for (; a < end; k++) {
        if (k >= x->n) return false;
        size_t i = x->ord[k];
        const refit_gpu_run_t *r = &x->runs[i];
        if (r->dst + r->len <= a) continue; /* an empty or earlier run */
        if (r->dst > a) return false;       /* a gap */
        uint64_t e = REFIT_MIN(end, r->dst + r->len);
        /* whole units, read from an even source offset (the kernel's 2-byte accesses) */
        if ((a - addr) % 2 || (e - addr) % 2 || (r->src_off + (a - r->dst)) % 2) return false;
        piece_t pc = {(uint32_t)((a - addr) / 2), (uint32_t)((e - a) / 2), r->slot, r->src_off + (a - r->dst)};
        if (REFIT_VEC_PUSH(out, pc) < 0) return false;
        x->covered[i] += e - a;
        if (x->detail && x->detail[i]) {
            covered_t c = {i, a - r->dst, e - r->dst};
            if (REFIT_VEC_PUSH(cov, c) < 0) return false;
        }
        a = e;
    }
    return true;
}

extern "C" void refit_gpu_digest_fused_destroy(refit_gpu_digest_fused_t *f)
{
    if (!f) return;
    devguard_t dg;
    bool in = gpu_enter(f->dev, &dg) == REFIT_OK;
    cudaFree(f->tiles);
    cudaFree(f->slots);
    if (in) gpu_leave(&dg);
    free(f->hslots);
    free(f);
}

extern "C" refit_status_t refit_gpu_digest_fused_create(const refit_gpu_digest_t *g, const refit_gpu_run_t *runs,
                                                        size_t n, uint32_t nslots, refit_gpu_digest_fused_t **out,
                                                        refit_gpu_rest_t **rest, size_t *nrest)
{
    if (!g || g->table || !g->htiles || (!runs && n) || !out || !rest || !nrest)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_gpu_digest_fused_create: bad argument");
    refit_status_t st = REFIT_OK;
    size_t *ord = (size_t *)malloc((n ? n : 1) * sizeof(size_t));
    uint64_t *odst = (uint64_t *)malloc((n ? n : 1) * sizeof(uint64_t));
    uint64_t *covered = (uint64_t *)calloc(n ? n : 1, sizeof(uint64_t));
    uint8_t *detail = NULL;
    runidx_t ix = {runs, ord, odst, n, covered, NULL};
    pieces_t row = {}, prev = {};
    covs_t cov = {};
    REFIT_VEC(tile_t) ft = {};
    REFIT_VEC(refit_gpu_rest_t) rv = {};
    refit_gpu_digest_fused_t *f = (refit_gpu_digest_fused_t *)calloc(1, sizeof(*f));
    devguard_t dg = {-1};
    if (!ord || !odst || !covered || !f) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "GPU digest: fused copy");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        ord[i] = i;
        if (runs[i].slot >= nslots) {
            st = refit_error(REFIT_ERR_INVALID_ARG, "GPU digest: run %zu reads slot %u of %u", i, runs[i].slot, nslots);
            goto done;
        }
    }
    {
        std::vector<std::pair<uint64_t, size_t>> by(n);
        for (size_t i = 0; i < n; i++) by[i] = std::make_pair(runs[i].dst, i);
        std::sort(by.begin(), by.end());
        for (size_t i = 0; i < n; i++) {
            ord[i] = by[i].second;
            odst[i] = by[i].first;
        }
    }
    for (size_t i = 1; i < n; i++)
        if (odst[i - 1] + runs[ord[i - 1]].len > odst[i]) {
            st = refit_error(REFIT_ERR_UNSUPPORTED, "GPU digest: two runs of the plan write the same bytes");
            goto done;
        }
    /* Each tile, row by row: its pieces; rows that are cut alike and whose sources step alike make one fused
     * tile per piece. */
    for (uint64_t t = 0; t < g->ntiles && !st; t++) {
        const tile_t *s = &g->htiles[t];
        uint32_t r0 = 0;
        int64_t step = 0; /* source bytes between rows of the open group (all pieces) */
        prev.len = 0;
        for (uint32_t i = 0; i <= s->nrows && !st; i++) {
            bool more = i < s->nrows;
            if (more && !row_pieces(&ix, s->p + i * s->stride, 2 * (uint64_t)s->n, &row, &cov)) {
                st = refit_error(REFIT_ERR_UNSUPPORTED,
                                 "GPU digest: a digested row is not written whole by the plan, in whole units");
                break;
            }
            bool same = more && i > r0 && row.len == prev.len;
            int64_t d = 0;
            for (size_t k = 0; same && k < row.len; k++) {
                const piece_t *a = &prev.data[k], *b = &row.data[k];
                int64_t dk = (int64_t)(b->src - a->src);
                if (k == 0) d = dk;
                same = a->u0 == b->u0 && a->n == b->n && a->slot == b->slot && dk == d && (i - r0 == 1 || d == step) &&
                       d >= 0;
            }
            if (same) {
                step = d;
            } else if (i > r0 || (!more && i > 0)) { /* close rows [r0, i) */
                for (size_t k = 0; k < prev.len && i > r0; k++) {
                    const piece_t *pc = &prev.data[k];
                    tile_t x = *s;
                    uint32_t rows = i - r0;
                    x.p = s->p + r0 * s->stride + 2 * (uint64_t)pc->u0;
                    x.row = s->row + r0;
                    x.j = s->j + pc->u0;
                    x.nrows = rows;
                    x.n = pc->n;
                    x.qslot = rows > 1 ? (uint64_t)step : 0;
                    x.pslot = pc->src - (rows > 1 ? (uint64_t)step * (rows - 1) : 0);
                    x.pad = pc->slot;
                    if (REFIT_VEC_PUSH(&ft, x) < 0) st = refit_error(REFIT_ERR_NO_MEMORY, "GPU digest: fused copy");
                }
                r0 = i;
                step = 0;
            }
            /* prev: the open group's last row */
            prev.len = 0;
            for (size_t k = 0; more && k < row.len; k++)
                if (REFIT_VEC_PUSH(&prev, row.data[k]) < 0) st = refit_error(REFIT_ERR_NO_MEMORY, "GPU digest");
        }
    }
    if (st) goto done;
    /* What no tile covers, run by run: whole runs, and for runs tiles cover in part (rare: a run across a
     * digested and an undigested placement) the gaps, from a second walk that records their pieces. */
    detail = (uint8_t *)calloc(n ? n : 1, 1);
    if (!detail) st = refit_error(REFIT_ERR_NO_MEMORY, "GPU digest: fused copy");
    {
        bool any = false;
        for (size_t i = 0; i < n && !st; i++) {
            detail[i] = covered[i] && covered[i] < runs[i].len;
            any |= detail[i];
        }
        if (any && !st) {
            memset(covered, 0, n * sizeof(uint64_t));
            ix.detail = detail;
            for (uint64_t t = 0; t < g->ntiles && !st; t++)
                for (uint32_t i = 0; i < g->htiles[t].nrows && !st; i++)
                    if (!row_pieces(&ix, g->htiles[t].p + i * g->htiles[t].stride, 2 * (uint64_t)g->htiles[t].n, &row,
                                    &cov))
                        st = refit_error(REFIT_ERR_NO_MEMORY, "GPU digest: fused copy");
            qsort(cov.data, cov.len, sizeof(covered_t), cmp_covered);
        }
    }
    for (size_t i = 0, c = 0; i < n && !st; i++) {
        if (covered[i] == runs[i].len) continue;
        uint64_t at = 0;
        while (c < cov.len && cov.data[c].run < i) c++;
        for (; detail[i] && c < cov.len && cov.data[c].run == i; c++) {
            if (cov.data[c].a > at) {
                refit_gpu_rest_t x = {i, at, cov.data[c].a - at};
                if (REFIT_VEC_PUSH(&rv, x) < 0) st = refit_error(REFIT_ERR_NO_MEMORY, "GPU digest: fused copy");
            }
            at = REFIT_MAX(at, cov.data[c].b);
        }
        if (at < runs[i].len) {
            refit_gpu_rest_t x = {i, at, runs[i].len - at};
            if (REFIT_VEC_PUSH(&rv, x) < 0) st = refit_error(REFIT_ERR_NO_MEMORY, "GPU digest: fused copy");
        }
    }
    if (!st && ft.len > INT32_MAX) st = refit_error(REFIT_ERR_UNSUPPORTED, "GPU digest: %zu fused tiles", ft.len);
    if (!st) st = gpu_enter(g->dev, &dg);
    if (!st) {
        f->dev = g->dev;
        f->ntiles = ft.len;
        f->nslots = nslots;
        f->hslots = (uint64_t *)calloc(nslots ? nslots : 1, sizeof(uint64_t));
        if (!f->hslots) st = refit_error(REFIT_ERR_NO_MEMORY, "GPU digest: fused copy");
        if (!st) {
            CK(cudaMalloc(&f->tiles, (ft.len ? ft.len : 1) * sizeof(tile_t)));
            if (ft.len) CK(cudaMemcpy(f->tiles, ft.data, ft.len * sizeof(tile_t), cudaMemcpyHostToDevice));
            CK(cudaStreamSynchronize(0)); /* as in check_create */
            CK(cudaMalloc(&f->slots, (nslots ? nslots : 1) * sizeof(uint64_t)));
            memset(f->hslots, 0xff, (nslots ? nslots : 1) * sizeof(uint64_t)); /* the first launch uploads all */
        }
    out:
        gpu_leave(&dg);
    }
done:
    free(ord);
    free(odst);
    free(covered);
    free(detail);
    REFIT_VEC_FREE(&row);
    REFIT_VEC_FREE(&prev);
    REFIT_VEC_FREE(&cov);
    REFIT_VEC_FREE(&ft);
    if (st) {
        REFIT_VEC_FREE(&rv);
        refit_gpu_digest_fused_destroy(f);
        return st;
    }
    *rest = rv.data;
    *nrest = rv.len;
    *out = f;
    return REFIT_OK;
}

extern "C" refit_status_t refit_gpu_digest_fused_launch(refit_gpu_digest_t *g, refit_gpu_digest_fused_t *f,
                                                        const uint64_t *slots)
{
    if (!g || !f || g->table || f->dev != g->dev || (!slots && f->nslots))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_gpu_digest_fused_launch: bad argument");
    devguard_t dg;
    refit_status_t st = gpu_enter(g->dev, &dg);
    if (st) return st;
    size_t bytes = 2 * (size_t)g->nplacements * sizeof(uint32_t);
    if (f->nslots && memcmp(f->hslots, slots, f->nslots * sizeof(uint64_t))) {
        memcpy(f->hslots, slots, f->nslots * sizeof(uint64_t));
        CK(cudaMemcpyAsync(f->slots, f->hslots, f->nslots * sizeof(uint64_t), cudaMemcpyHostToDevice, g->stream));
    }
    CK(cudaMemsetAsync(g->out, 0, bytes ? bytes : 4, g->stream));
    if (f->ntiles)
        local_tiles<true, true><<<(unsigned)f->ntiles, THREADS, 0, g->stream>>>(f->tiles, g->kc, g->row_seed,
                                                                                g->blk_seed, 0, f->slots, g->out);
    CK(cudaGetLastError());
out:
    gpu_leave(&dg);
    return st;
}

extern "C" refit_status_t refit_gpu_digest_wait(refit_gpu_digest_t *g)
{
    if (!g) return refit_error(REFIT_ERR_INVALID_ARG, "refit_gpu_digest_wait: NULL");
    devguard_t dg;
    refit_status_t st = gpu_enter(g->dev, &dg);
    if (st) return st;
    CK(cudaStreamSynchronize(g->stream));
out:
    gpu_leave(&dg);
    return st;
}

extern "C" refit_status_t refit_gpu_digest_sums(refit_gpu_digest_t *g, void *sums)
{
    if (!g || !sums || g->table) return refit_error(REFIT_ERR_INVALID_ARG, "refit_gpu_digest_sums: bad argument");
    devguard_t dg;
    refit_status_t st = gpu_enter(g->dev, &dg);
    if (st) return st;
    CK(cudaMemcpyAsync(sums, g->out, 2 * (size_t)g->nplacements * sizeof(uint32_t), cudaMemcpyDeviceToHost, g->stream));
    CK(cudaStreamSynchronize(g->stream));
out:
    gpu_leave(&dg);
    return st;
}
