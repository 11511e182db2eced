/* The GPU scenarios' baselines (gpu_baseline.h), on refit's public API and
 * the CUDA runtime, in the bench process.
 *
 * Pack and unpack are a fair NCCL pipeline's own work: one launch of a
 * batched copy kernel per plan (bcopy below), not one cudaMemcpy per region.
 * The kernel takes the plan's regions (refit_plan_regions, refit_plan_fills:
 * a run of bytes repeated over up to three strided loops), cut on the host
 * into items of about 1 MiB (whole rows of short runs, or 1 MiB pieces of a
 * long run); a persistent grid walks the items, each thread moving four
 * units (16, 8, 4, 2 or 1 bytes, the widest every address and length of the
 * region allows) per round.
 *
 * NCCL is loaded at run time (dlopen of the library CMake found, or
 * $REFIT_NCCL_LIBRARY), so neither refit-bench nor librefit depends on it;
 * without nccl.h at build time the NCCL part reports REFIT_ERR_UNSUPPORTED
 * and the peer copy still runs.  NVLink SHARP / multicast is never asked for
 * (callers keep NCCL_NVLS_ENABLE=0). */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef BENCH_HAVE_NCCL
#include <nccl.h>
#endif

#include "gpu_baseline.h"

#define CK(call)                                                                                          \
    do {                                                                                                  \
        cudaError_t e_ = (call);                                                                          \
        if (e_ != cudaSuccess) {                                                                          \
            st = refit_error(e_ == cudaErrorMemoryAllocation ? REFIT_ERR_NO_MEMORY : REFIT_ERR_TRANSPORT, \
                             "baseline: %s: %s", #call, cudaGetErrorString(e_));                          \
            goto out;                                                                                     \
        }                                                                                                 \
    } while (0)

#define ALLOC_ROUND (2ull << 20) /* as refit rounds its own allocations (docs/gpu.md, Colocated) */
#define ITEM_BYTES (1ull << 20)
#define BCOPY_THREADS 256
#define BCOPY_UNROLL 4

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, uint32_t n)
{
    double t[BENCH_GPU_MAX_ITERS];
    if (!n) return 0;
    memcpy(t, v, n * sizeof(double));
    qsort(t, n, sizeof(double), cmp_d);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

static refit_status_t dev_alloc(int dev, uint64_t n, void **out)
{
    refit_status_t st = REFIT_OK;
    *out = NULL;
    CK(cudaSetDevice(dev));
    CK(cudaMalloc(out, (n + ALLOC_ROUND - 1) / ALLOC_ROUND * ALLOC_ROUND));
out:
    return st;
}

/* ---- the bench's batched copy kernel ------------------------------------ */

typedef struct {
    uint64_t src, dst; /* addresses of the region's first byte; src 0: write zeros */
    uint64_t run;
    uint32_t count[2]; /* the two inner loops (the outermost is the quotient) */
    uint64_t sstride[3], dstride[3];
    uint32_t width; /* bytes per unit */
} bregion_t;

typedef struct {
    uint32_t region, nrows;
    uint64_t row0, off, len; /* rows row0 .. +nrows, bytes off .. +len of each */
} bitem_t;

/* Item it of region r with units of T.  Unit u of the item is unit u % upr
 * of its row u / upr; the loop indices of the item's first row are taken
 * apart once, later rows carry into the outer loops only when they cross. */
template <typename T> __device__ __forceinline__ void bcopy_item(const bregion_t &r, const bitem_t &it)
{
    const uint32_t upr = (uint32_t)(it.len / sizeof(T)), total = upr * it.nrows, c0 = r.count[0], c1 = r.count[1];
    const uint64_t q = it.row0 / c0;
    const uint32_t b0 = (uint32_t)(it.row0 - q * c0), b1 = (uint32_t)(q % c1), b2 = (uint32_t)(q / c1);
    for (uint32_t u0 = threadIdx.x; u0 < total; u0 += BCOPY_THREADS * BCOPY_UNROLL) {
        T v[BCOPY_UNROLL];
        T *d[BCOPY_UNROLL];
#pragma unroll
        for (int k = 0; k < BCOPY_UNROLL; k++) {
            uint32_t u = u0 + k * BCOPY_THREADS;
            d[k] = NULL;
            if (u >= total) continue;
            uint32_t rl = it.nrows == 1 ? 0 : u / upr, e = u - rl * upr, i0 = b0 + rl, i1 = b1, i2 = b2;
            if (i0 >= c0) {
                uint32_t c = i0 / c0;
                i0 -= c * c0;
                i1 += c;
                if (i1 >= c1) {
                    c = i1 / c1;
                    i1 -= c * c1;
                    i2 += c;
                }
            }
            uint64_t byte = it.off + (uint64_t)e * sizeof(T);
            d[k] = (T *)(r.dst + i0 * r.dstride[0] + i1 * r.dstride[1] + i2 * r.dstride[2] + byte);
            if (r.src) v[k] = *(const T *)(r.src + i0 * r.sstride[0] + i1 * r.sstride[1] + i2 * r.sstride[2] + byte);
            else memset(&v[k], 0, sizeof(T));
        }
#pragma unroll
        for (int k = 0; k < BCOPY_UNROLL; k++)
            if (d[k]) *d[k] = v[k];
    }
}

__global__ void __launch_bounds__(BCOPY_THREADS)
    bcopy_kernel(const bregion_t *__restrict__ regions, const bitem_t *__restrict__ items, uint64_t n)
{
    for (uint64_t i = blockIdx.x; i < n; i += gridDim.x) {
        bitem_t it = items[i];
        bregion_t r = regions[it.region];
        switch (r.width) {
        case 16: bcopy_item<uint4>(r, it); break;
        case 8: bcopy_item<uint2>(r, it); break;
        case 4: bcopy_item<uint32_t>(r, it); break;
        case 2: bcopy_item<uint16_t>(r, it); break;
        default: bcopy_item<uint8_t>(r, it); break;
        }
    }
}

typedef struct {
    int dev, grid;
    bregion_t *dregions;
    bitem_t *ditems;
    uint64_t nitems;
    cudaStream_t stream;
} bcopy_t;

static void bcopy_destroy(bcopy_t *b)
{
    if (b->dev < 0) return;
    cudaSetDevice(b->dev);
    cudaFree(b->dregions);
    cudaFree(b->ditems);
    if (b->stream) cudaStreamDestroy(b->stream);
    memset(b, 0, sizeof(*b));
    b->dev = -1;
}

static uint32_t width_of(uint64_t x)
{
    for (uint32_t w = 16; w > 1; w /= 2)
        if (!(x % w)) return w;
    return 1;
}

/* Appends region r's items; the table grows as needed. */
static refit_status_t add_region(const bregion_t *r, uint32_t ri, uint64_t rows, bitem_t **items, uint64_t *n,
                                 uint64_t *cap)
{
    uint64_t per = r->run >= ITEM_BYTES ? 1 : ITEM_BYTES / r->run;
    uint64_t pieces = r->run >= ITEM_BYTES ? (r->run + ITEM_BYTES - 1) / ITEM_BYTES : 1;
    for (uint64_t row = 0; row < rows; row += per)
        for (uint64_t p = 0; p < pieces; p++) {
            if (*n == *cap) {
                uint64_t c = *cap ? *cap * 2 : 4096;
                bitem_t *t = (bitem_t *)realloc(*items, c * sizeof(bitem_t));
                if (!t) return refit_error(REFIT_ERR_NO_MEMORY, "baseline copy table");
                *items = t;
                *cap = c;
            }
            bitem_t *it = &(*items)[(*n)++];
            it->region = ri;
            it->row0 = row;
            it->nrows = (uint32_t)(rows - row < per ? rows - row : per);
            it->off = p * ITEM_BYTES;
            it->len = pieces > 1 ? (r->run - it->off < ITEM_BYTES ? r->run - it->off : ITEM_BYTES) : r->run;
        }
    return REFIT_OK;
}

/* The plan (sources: one region each, at src_bases; destination: region 0
 * at dst_base) as a copy table on dev. */
static refit_status_t bcopy_create(const refit_plan_t *plan, void *const *src_bases, void *dst_base, int dev,
                                   bcopy_t *out)
{
    refit_status_t st = REFIT_OK;
    size_t nreg = 0, nfill = 0;
    const refit_plan_region_t *regs = refit_plan_regions(plan, &nreg), *fills = refit_plan_fills(plan, &nfill);
    bregion_t *hr = (bregion_t *)calloc(nreg + nfill + 1, sizeof(bregion_t));
    bitem_t *items = NULL;
    uint64_t n = 0, cap = 0;
    int sms = 0, occ = 0;
    memset(out, 0, sizeof(*out));
    out->dev = -1;
    if (!hr) return refit_error(REFIT_ERR_NO_MEMORY, "baseline copy table");
    for (size_t i = 0; !st && i < nreg + nfill; i++) {
        const refit_plan_region_t *p = i < nreg ? &regs[i] : &fills[i - nreg];
        bool fill = i >= nreg;
        if ((!fill && p->src_region) || p->dst_region) {
            st = refit_error(REFIT_ERR_UNSUPPORTED, "baseline: layouts of one memory region per rank only");
            break;
        }
        bregion_t *r = &hr[i];
        uint64_t rows = 1, align = p->run | p->dst_offset | (uint64_t)(uintptr_t)dst_base;
        r->src = fill ? 0 : (uint64_t)(uintptr_t)src_bases[p->src] + p->src_offset;
        r->dst = (uint64_t)(uintptr_t)dst_base + p->dst_offset;
        r->run = p->run;
        r->count[0] = r->count[1] = 1;
        for (uint32_t k = 0; k < p->nloops; k++) {
            if (p->count[k] > UINT32_MAX) st = refit_error(REFIT_ERR_UNSUPPORTED, "baseline: a loop of 2^32 rows");
            if (k < 2) r->count[k] = (uint32_t)p->count[k];
            rows *= p->count[k];
            r->sstride[k] = fill ? 0 : p->src_stride[k];
            r->dstride[k] = p->dst_stride[k];
            align |= r->sstride[k] | r->dstride[k];
        }
        if (!fill) align |= r->src;
        r->width = width_of(align);
        if (!st && p->run && rows) st = add_region(r, (uint32_t)i, rows, &items, &n, &cap);
    }
    if (st) goto out;
    out->dev = dev;
    out->nitems = n;
    CK(cudaSetDevice(dev));
    CK(cudaStreamCreateWithFlags(&out->stream, cudaStreamNonBlocking));
    CK(cudaMalloc(&out->dregions, (nreg + nfill + 1) * sizeof(bregion_t)));
    CK(cudaMalloc(&out->ditems, (n ? n : 1) * sizeof(bitem_t)));
    CK(cudaMemcpy(out->dregions, hr, (nreg + nfill + 1) * sizeof(bregion_t), cudaMemcpyHostToDevice));
    if (n) CK(cudaMemcpy(out->ditems, items, n * sizeof(bitem_t), cudaMemcpyHostToDevice));
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, bcopy_kernel, BCOPY_THREADS, 0);
    out->grid = (sms > 0 ? sms : 1) * (occ > 0 ? occ : 4);
out:
    free(hr);
    free(items);
    if (st) bcopy_destroy(out);
    return st;
}

/* One launch on the table's stream. */
static refit_status_t bcopy_launch(bcopy_t *b)
{
    refit_status_t st = REFIT_OK;
    int grid = (uint64_t)b->grid < b->nitems ? b->grid : (int)b->nitems;
    CK(cudaSetDevice(b->dev));
    if (b->nitems) {
        bcopy_kernel<<<grid, BCOPY_THREADS, 0, b->stream>>>(b->dregions, b->ditems, b->nitems);
        CK(cudaGetLastError());
    }
out:
    return st;
}

/* One launch, then the wait. */
static refit_status_t bcopy_run(bcopy_t *b)
{
    refit_status_t st = bcopy_launch(b);
    if (!st) CK(cudaStreamSynchronize(b->stream));
out:
    return st;
}

/* ---- digests and patterns ---------------------------------------------- */

__device__ __forceinline__ uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* The wrapping sum of mix(word + mix(position)): any byte moved or changed shows. */
__global__ void digest_kernel(const uint64_t *p, uint64_t words, unsigned long long *sum)
{
    uint64_t s = 0;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < words; i += (uint64_t)gridDim.x * blockDim.x)
        s += mix(p[i] + mix(i));
    atomicAdd(sum, (unsigned long long)s);
}

static refit_status_t digest(int dev, const void *p, uint64_t bytes, uint64_t *out)
{
    refit_status_t st = REFIT_OK;
    unsigned long long *d = NULL, h = 0;
    CK(cudaSetDevice(dev));
    CK(cudaMalloc(&d, sizeof(h)));
    CK(cudaMemset(d, 0, sizeof(h)));
    digest_kernel<<<1024, 256>>>((const uint64_t *)p, bytes / 8, d);
    CK(cudaGetLastError());
    CK(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
    *out = h;
out:
    cudaFree(d);
    return st;
}

__global__ void pattern_kernel(uint64_t *p, uint64_t words, uint64_t seed)
{
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < words; i += (uint64_t)gridDim.x * blockDim.x)
        p[i] = mix(i ^ seed) | 1;
}

/* ---- NCCL, loaded at run time ------------------------------------------- */

#ifdef BENCH_HAVE_NCCL
typedef struct {
    void *h;
    ncclResult_t (*get_version)(int *);
    ncclResult_t (*init_all)(ncclComm_t *, int, const int *);
    ncclResult_t (*bcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*destroy)(ncclComm_t);
    const char *(*error_string)(ncclResult_t);
} nccl_api_t;

static refit_status_t nccl_load(nccl_api_t *a, char *path, size_t n)
{
    const char *env = getenv("REFIT_NCCL_LIBRARY");
#ifdef BENCH_NCCL_LIBRARY
    const char *built = BENCH_NCCL_LIBRARY;
#else
    const char *built = "libnccl.so.2";
#endif
    snprintf(path, n, "%s", env && env[0] ? env : built);
    memset(a, 0, sizeof(*a));
    a->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!a->h && strcmp(path, "libnccl.so.2") != 0) {
        snprintf(path, n, "libnccl.so.2");
        a->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (!a->h) return refit_error(REFIT_ERR_UNSUPPORTED, "NCCL: cannot load %s: %s", path, dlerror());
#define SYM(f, name) *(void **)&a->f = dlsym(a->h, name)
    SYM(get_version, "ncclGetVersion");
    SYM(init_all, "ncclCommInitAll");
    SYM(bcast, "ncclBroadcast");
    SYM(group_start, "ncclGroupStart");
    SYM(group_end, "ncclGroupEnd");
    SYM(destroy, "ncclCommDestroy");
    SYM(error_string, "ncclGetErrorString");
#undef SYM
    if (!a->get_version || !a->init_all || !a->bcast || !a->group_start || !a->group_end || !a->destroy ||
        !a->error_string)
        return refit_error(REFIT_ERR_UNSUPPORTED, "NCCL: %s lacks a symbol this baseline needs", path);
    return REFIT_OK;
}

#define NK(call)                                                                                \
    do {                                                                                        \
        ncclResult_t r_ = (call);                                                               \
        if (r_ != ncclSuccess) {                                                                \
            st = refit_error(REFIT_ERR_TRANSPORT, "NCCL: %s: %s", #call, api.error_string(r_)); \
            goto out;                                                                           \
        }                                                                                       \
    } while (0)
#endif

/* ---- the ranks of a layout, in device memory ----------------------------- */

typedef struct {
    refit_manifest_t **m;
    void **arena;
    uint32_t n;
} ranks_t;

static refit_status_t make_ranks(const refit_model_t *model, const char *spec, ranks_t *r)
{
    refit_layout_t *l = NULL;
    refit_status_t st = refit_layout_parse(spec, &l);
    if (!st) st = refit_layout_check(l, model);
    if (st) {
        refit_layout_destroy(l);
        return st;
    }
    r->n = refit_layout_world(l);
    r->m = (refit_manifest_t **)calloc(r->n, sizeof(void *));
    r->arena = (void **)calloc(r->n, sizeof(void *));
    if (!r->m || !r->arena) st = refit_error(REFIT_ERR_NO_MEMORY, "baseline");
    for (uint32_t i = 0; !st && i < r->n; i++) {
        st = refit_layout_manifest(l, model, i, &r->m[i]);
        if (!st && refit_manifest_num_regions(r->m[i]) != 1)
            st = refit_error(REFIT_ERR_UNSUPPORTED, "baseline: layouts of one memory region per rank only");
    }
    refit_layout_destroy(l);
    return st;
}

static void free_ranks(ranks_t *r)
{
    for (uint32_t i = 0; i < r->n; i++) {
        if (r->m) refit_manifest_destroy(r->m[i]);
        if (r->arena) cudaFree(r->arena[i]);
    }
    free(r->m);
    free(r->arena);
    memset(r, 0, sizeof(*r));
}

static refit_status_t alloc_ranks(ranks_t *r, int dev)
{
    for (uint32_t i = 0; i < r->n; i++) {
        refit_status_t st = dev_alloc(dev, refit_manifest_region_size(r->m[i], 0), &r->arena[i]);
        if (st) return st;
    }
    return REFIT_OK;
}

/* The copy table of the plan from srcs (arenas src_arenas) to dst (dst_arena), on dev. */
static refit_status_t plan_copy(const refit_manifest_t *const *srcs, void *const *src_arenas, uint32_t nsrc,
                                const refit_manifest_t *dst, void *dst_arena, int dev, bcopy_t *out)
{
    refit_plan_t *plan = NULL;
    refit_status_t st = refit_plan_create(srcs, nsrc, dst, NULL, &plan);
    if (!st) st = bcopy_create(plan, src_arenas, dst_arena, dev, out);
    refit_plan_destroy(plan);
    return st;
}

/* One region of `bytes`: src -> dst (device addresses, dst on dev). */
static refit_status_t flat_copy(const void *src, void *dst, uint64_t bytes, int dev, bcopy_t *out)
{
    refit_status_t st = REFIT_OK;
    bregion_t r;
    bitem_t *items = NULL;
    uint64_t n = 0, cap = 0;
    int sms = 0, occ = 0;
    memset(&r, 0, sizeof(r));
    memset(out, 0, sizeof(*out));
    out->dev = -1;
    r.src = (uint64_t)(uintptr_t)src;
    r.dst = (uint64_t)(uintptr_t)dst;
    r.run = bytes;
    r.count[0] = r.count[1] = 1;
    r.width = width_of(bytes | r.src | r.dst);
    if ((st = add_region(&r, 0, 1, &items, &n, &cap))) return st;
    out->dev = dev;
    out->nitems = n;
    CK(cudaSetDevice(dev));
    CK(cudaStreamCreateWithFlags(&out->stream, cudaStreamNonBlocking));
    CK(cudaMalloc(&out->dregions, sizeof(r)));
    CK(cudaMalloc(&out->ditems, (n ? n : 1) * sizeof(bitem_t)));
    CK(cudaMemcpy(out->dregions, &r, sizeof(r), cudaMemcpyHostToDevice));
    if (n) CK(cudaMemcpy(out->ditems, items, n * sizeof(bitem_t), cudaMemcpyHostToDevice));
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, bcopy_kernel, BCOPY_THREADS, 0);
    out->grid = (sms > 0 ? sms : 1) * (occ > 0 ? occ : 4);
out:
    free(items);
    if (st) bcopy_destroy(out);
    return st;
}

/* ---- GPU -> GPU: the raw peer copy and NCCL -------------------------------- */

extern "C" refit_status_t bench_gpu_baseline(const bench_gpu_baseline_cfg_t *cfg, bench_gpu_baseline_t *out)
{
    refit_status_t st = REFIT_OK;
    memset(out, 0, sizeof(*out));
    uint32_t iters = cfg->iters ? cfg->iters : 5;
    if (iters > BENCH_GPU_MAX_ITERS) iters = BENCH_GPU_MAX_ITERS;
    out->iters = iters;
    int sd = cfg->src_dev, dd = cfg->dst_dev, saved = -1;
    refit_model_t *model = NULL;
    ranks_t src, hf, dst;
    memset(&src, 0, sizeof(src));
    memset(&hf, 0, sizeof(hf));
    memset(&dst, 0, sizeof(dst));
    void *packed0 = NULL, *packed1 = NULL;
    bcopy_t pack, kcopy, *unpack = NULL;
    pack.dev = kcopy.dev = -1;
    cudaStream_t s0 = NULL, s1 = NULL;
    uint64_t packed = 0, pbuf = 0;
    double t_pack[BENCH_GPU_MAX_ITERS], t_bcast[BENCH_GPU_MAX_ITERS], t_unpack[BENCH_GPU_MAX_ITERS],
        t_kcopy[BENCH_GPU_MAX_ITERS];
#ifdef BENCH_HAVE_NCCL
    nccl_api_t api;
    memset(&api, 0, sizeof(api));
    ncclComm_t comms[2] = {NULL, NULL};
#endif
    if (refit_gpu_count() < 2 || sd == dd || sd < 0 || dd < 0 || sd >= refit_gpu_count() || dd >= refit_gpu_count())
        return refit_error(REFIT_ERR_UNSUPPORTED, "the baseline needs two distinct GPUs (%d here)", refit_gpu_count());
    CK(cudaGetDevice(&saved));
    if ((st = refit_model_open(cfg->model, &model))) goto out;
    if ((st = make_ranks(model, cfg->src_layout, &src)) || (st = make_ranks(model, "hf", &hf)) ||
        (st = make_ranks(model, cfg->dst_layout, &dst)))
        goto out;
    packed = refit_manifest_region_size(hf.m[0], 0);
    out->bytes = refit_model_total_bytes(model);
    out->packed_bytes = packed;
    out->peer_bytes = cfg->peer_bytes ? cfg->peer_bytes : packed;
    pbuf = out->peer_bytes > packed ? out->peer_bytes : packed;
    {
        uint64_t need0 = pbuf, need1 = pbuf;
        for (uint32_t i = 0; i < src.n; i++) need0 += refit_manifest_region_size(src.m[i], 0);
        for (uint32_t i = 0; i < dst.n; i++) need1 += refit_manifest_region_size(dst.m[i], 0);
        refit_gpu_info_t i0, i1;
        if ((st = refit_gpu_info(sd, &i0)) || (st = refit_gpu_info(dd, &i1))) goto out;
        if (need0 + (1ull << 30) > i0.free_memory || need1 + (1ull << 30) > i1.free_memory) {
            st = refit_error(REFIT_ERR_NO_MEMORY,
                             "the baseline needs %.1f GB on GPU %d (%.1f free) and %.1f GB on GPU %d (%.1f free)",
                             need0 / 1e9, sd, i0.free_memory / 1e9, need1 / 1e9, dd, i1.free_memory / 1e9);
            goto out;
        }
    }
    if ((st = alloc_ranks(&src, sd)) || (st = dev_alloc(sd, pbuf, &packed0)) || (st = dev_alloc(dd, pbuf, &packed1)) ||
        (st = alloc_ranks(&dst, dd)))
        goto out;
    CK(cudaSetDevice(dd));
    {
        cudaError_t e = cudaDeviceEnablePeerAccess(sd, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CK(e);
        cudaGetLastError();
    }
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaSetDevice(sd));
    CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));

    /* 1. The raw limit: the packed buffer GPU sd -> GPU dd. */
    for (uint32_t it = 0; it <= iters; it++) { /* iteration 0 warms up */
        CK(cudaSetDevice(dd));
        double t0 = refit_now();
        CK(cudaMemcpyPeerAsync(packed1, dd, packed0, sd, out->peer_bytes, s1));
        CK(cudaStreamSynchronize(s1));
        if (it) out->peer_copy_runs[it - 1] = refit_now() - t0;
    }
    out->peer_copy_s = median(out->peer_copy_runs, iters);
    if ((st = flat_copy(packed0, packed1, out->peer_bytes, dd, &kcopy))) goto out;
    for (uint32_t it = 0; it <= iters; it++) {
        double t0 = refit_now();
        if ((st = bcopy_run(&kcopy))) goto out;
        if (it) t_kcopy[it - 1] = refit_now() - t0;
    }
    out->peer_copy_kernel_s = median(t_kcopy, iters);
    if (cfg->skip_nccl) {
        snprintf(out->note, sizeof(out->note), "NCCL baseline skipped");
        goto out;
    }
#ifndef BENCH_HAVE_NCCL
    st = refit_error(REFIT_ERR_UNSUPPORTED, "built without nccl.h: no NCCL baseline");
    snprintf(out->note, sizeof(out->note), "built without nccl.h");
    goto out;
#else
    /* 2. NCCL: pack, broadcast, unpack. */
    if ((st = nccl_load(&api, out->nccl_library, sizeof(out->nccl_library)))) goto out;
    NK(api.get_version(&out->nccl_version));
    if ((st = plan_copy((const refit_manifest_t *const *)src.m, src.arena, src.n, hf.m[0], packed0, sd, &pack)))
        goto out;
    unpack = (bcopy_t *)calloc(dst.n, sizeof(bcopy_t));
    if (!unpack) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "baseline");
        goto out;
    }
    for (uint32_t r = 0; r < dst.n; r++) unpack[r].dev = -1;
    for (uint32_t r = 0; r < dst.n; r++)
        if ((st = plan_copy((const refit_manifest_t *const *)hf.m, &packed1, 1, dst.m[r], dst.arena[r], dd,
                            &unpack[r])))
            goto out;
    {
        int devs[2] = {sd, dd};
        NK(api.init_all(comms, 2, devs));
    }
    {
        uint64_t chunk = cfg->nccl_chunk ? cfg->nccl_chunk : (1ull << 30);
        bool all_ok = true;
        for (uint32_t it = 0; it <= iters; it++) {
            uint64_t v = it + 1;
            for (uint32_t i = 0; i < src.n; i++)
                if ((st = refit_gpu_truth_fill(src.m[i], sd, &src.arena[i], v))) goto out;
            CK(cudaSetDevice(dd));
            for (uint32_t r = 0; r < dst.n; r++)
                CK(cudaMemset(dst.arena[r], 0xee, refit_manifest_region_size(dst.m[r], 0)));
            CK(cudaMemset(packed1, 0xee, packed));
            CK(cudaDeviceSynchronize());
            CK(cudaSetDevice(sd));
            CK(cudaDeviceSynchronize());
            uint64_t calls = 0;
            double t0 = refit_now();
            if ((st = bcopy_run(&pack))) goto out;
            double t1 = refit_now();
            for (uint64_t off = 0; off < packed; off += chunk) {
                size_t cnt = (size_t)(packed - off < chunk ? packed - off : chunk);
                NK(api.group_start());
                NK(api.bcast((char *)packed0 + off, (char *)packed0 + off, cnt, ncclUint8, 0, comms[0], s0));
                NK(api.bcast((char *)packed1 + off, (char *)packed1 + off, cnt, ncclUint8, 0, comms[1], s1));
                NK(api.group_end());
                calls++;
            }
            CK(cudaSetDevice(sd));
            CK(cudaStreamSynchronize(s0));
            CK(cudaSetDevice(dd));
            CK(cudaStreamSynchronize(s1));
            double t2 = refit_now();
            for (uint32_t r = 0; r < dst.n; r++) /* the ranks' unpacks side by side */
                if ((st = bcopy_launch(&unpack[r]))) goto out;
            for (uint32_t r = 0; r < dst.n; r++) CK(cudaStreamSynchronize(unpack[r].stream));
            double t3 = refit_now();
            if (it) {
                t_pack[it - 1] = t1 - t0;
                t_bcast[it - 1] = t2 - t1;
                t_unpack[it - 1] = t3 - t2;
                out->nccl_runs[it - 1] = t3 - t0;
            }
            out->pack_launches = pack.nitems ? 1 : 0;
            out->unpack_launches = 0;
            for (uint32_t r = 0; r < dst.n; r++) out->unpack_launches += unpack[r].nitems ? 1 : 0;
            out->bcast_calls = calls;
            if (it == 1) {
                if ((st = digest(sd, packed0, packed, &out->digest_src)) ||
                    (st = digest(dd, packed1, packed, &out->digest_dst)))
                    goto out;
                if (out->digest_src != out->digest_dst) all_ok = false;
            }
            for (uint32_t r = 0; r < dst.n; r++) {
                refit_truth_report_t rep;
                memset(&rep, 0, sizeof(rep));
                rep.size = sizeof(rep);
                if ((st = refit_gpu_truth_verify(dst.m[r], dd, (const void *const *)&dst.arena[r], v, &rep))) {
                    char why[512];
                    snprintf(why, sizeof(why), "%s", refit_last_error());
                    st = refit_error(st, "NCCL baseline, iteration %u, destination rank %u: %s", it, r, why);
                    goto out;
                }
            }
        }
        out->nccl_ran = true;
        out->verified = all_ok;
        out->pack_s = median(t_pack, iters);
        out->bcast_s = median(t_bcast, iters);
        out->unpack_s = median(t_unpack, iters);
        out->nccl_s = median(out->nccl_runs, iters);
    }
#endif
out:
#ifdef BENCH_HAVE_NCCL
    for (int i = 0; i < 2; i++)
        if (comms[i]) api.destroy(comms[i]);
#endif
    bcopy_destroy(&pack);
    bcopy_destroy(&kcopy);
    for (uint32_t r = 0; unpack && r < dst.n; r++) bcopy_destroy(&unpack[r]);
    free(unpack);
    if (s0) cudaStreamDestroy(s0);
    if (s1) cudaStreamDestroy(s1);
    cudaFree(packed0);
    cudaFree(packed1);
    free_ranks(&src);
    free_ranks(&hf);
    free_ranks(&dst);
    refit_model_destroy(model);
    if (saved >= 0) cudaSetDevice(saved);
    return st;
}

/* ---- the colocated limit: a device-to-device copy on one GPU ------------- */

extern "C" refit_status_t bench_gpu_d2d_baseline(int dev, uint64_t bytes, uint32_t iters, bench_gpu_d2d_t *out)
{
    refit_status_t st = REFIT_OK;
    memset(out, 0, sizeof(*out));
    if (!iters) iters = 5;
    if (iters > BENCH_GPU_MAX_ITERS) iters = BENCH_GPU_MAX_ITERS;
    out->iters = iters;
    bytes &= ~(uint64_t)255; /* whole 16-byte units for the kernel, 8-byte words for the digest */
    out->bytes = bytes;
    int saved = -1;
    void *a = NULL, *b = NULL;
    cudaStream_t s = NULL;
    bcopy_t k;
    k.dev = -1;
    uint64_t da = 0, db = 0;
    double runs[BENCH_GPU_MAX_ITERS], kruns[BENCH_GPU_MAX_ITERS];
    if (dev < 0 || dev >= refit_gpu_count()) return refit_error(REFIT_ERR_UNSUPPORTED, "no CUDA device %d here", dev);
    CK(cudaGetDevice(&saved));
    if ((st = dev_alloc(dev, bytes ? bytes : 256, &a)) || (st = dev_alloc(dev, bytes ? bytes : 256, &b))) goto out;
    CK(cudaSetDevice(dev));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    pattern_kernel<<<1024, 256, 0, s>>>((uint64_t *)a, bytes / 8, 0x726566697431ull); /* never time zeros */
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
    if ((st = digest(dev, a, bytes, &da))) goto out;
    /* 1. cudaMemcpyAsync device to device (what a plain copy of the bytes costs). */
    for (uint32_t it = 0; it <= iters; it++) { /* iteration 0 warms up */
        CK(cudaSetDevice(dev));
        CK(cudaMemsetAsync(b, 0xa5, bytes, s));
        CK(cudaStreamSynchronize(s));
        double t0 = refit_now();
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
        CK(cudaStreamSynchronize(s));
        if (it) runs[it - 1] = refit_now() - t0;
    }
    if ((st = digest(dev, b, bytes, &db))) goto out;
    out->copy_verified = da == db;
    out->copy_s = median(runs, iters);
    memcpy(out->copy_runs, runs, iters * sizeof(double));
    /* 2. The bench's copy kernel on the same bytes, one region. */
    if ((st = flat_copy(a, b, bytes, dev, &k))) goto out;
    for (uint32_t it = 0; it <= iters; it++) {
        CK(cudaSetDevice(dev));
        CK(cudaMemsetAsync(b, 0x5a, bytes, s));
        CK(cudaStreamSynchronize(s));
        double t0 = refit_now();
        if ((st = bcopy_run(&k))) goto out;
        if (it) kruns[it - 1] = refit_now() - t0;
    }
    if ((st = digest(dev, b, bytes, &db))) goto out;
    out->kernel_verified = da == db;
    out->kernel_s = median(kruns, iters);
    if (!out->copy_verified || !out->kernel_verified)
        st = refit_error(REFIT_ERR_VERIFY, "d2d baseline: the copy's digest differs from the source's");
out:
    bcopy_destroy(&k);
    if (s) cudaStreamDestroy(s);
    cudaFree(a);
    cudaFree(b);
    if (saved >= 0) cudaSetDevice(saved);
    return st;
}
