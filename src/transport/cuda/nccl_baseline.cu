/* Baselines for the GPU benchmark, in one process holding two GPUs:
 *
 *  - the raw limit: one peer copy of the same bytes src_dev -> dst_dev, by
 *    the copy engines (cudaMemcpyPeerAsync) and by the batch kernel pulling
 *    over P2P (the access pattern of cuda_ipc, without any layout change);
 *  - NCCL: the sender packs the whole model into one buffer (the "hf"
 *    layout: every canonical tensor, contiguous) with the batch kernel,
 *    ncclBroadcast moves it to the receiver's GPU, and the receiver unpacks
 *    it into each of its ranks' layouts; every destination byte is verified
 *    against the synthetic truth (not timed).
 *
 * NCCL is loaded at run time (dlopen of the library CMake found, or
 * $REFIT_NCCL_LIBRARY), so librefit does not depend on it; without nccl.h at
 * build time the NCCL part reports REFIT_ERR_UNSUPPORTED and the peer copy
 * still runs.  NVLink SHARP / multicast is never asked for (callers keep
 * NCCL_NVLS_ENABLE=0). */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef REFIT_HAVE_NCCL
#include <nccl.h>
#endif

extern "C" {
#include "refit/refit.h"
#include "transport/cuda/gpu.h"
#include "util/util.h"
}

#define CK(call)                                                                                          \
    do {                                                                                                  \
        cudaError_t e_ = (call);                                                                          \
        if (e_ != cudaSuccess) {                                                                          \
            st = refit_error(e_ == cudaErrorMemoryAllocation ? REFIT_ERR_NO_MEMORY : REFIT_ERR_TRANSPORT, \
                             "baseline: %s: %s", #call, cudaGetErrorString(e_));                          \
            goto out;                                                                                     \
        }                                                                                                 \
    } while (0)

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, uint32_t n)
{
    double t[REFIT_GPU_BASELINE_MAX_ITERS];
    if (!n) return 0;
    memcpy(t, v, n * sizeof(double));
    qsort(t, n, sizeof(double), cmp_d);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

#ifdef REFIT_HAVE_NCCL
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
#ifdef REFIT_NCCL_LIBRARY
    const char *built = REFIT_NCCL_LIBRARY;
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
    for (uint32_t i = 0; !st && i < r->n; i++) st = refit_layout_manifest(l, model, i, &r->m[i]);
    refit_layout_destroy(l);
    return st;
}

static void free_ranks(ranks_t *r)
{
    for (uint32_t i = 0; i < r->n; i++) {
        if (r->m) refit_manifest_destroy(r->m[i]);
        if (r->arena) refit_gpu_free(r->arena[i]);
    }
    free(r->m);
    free(r->arena);
    memset(r, 0, sizeof(*r));
}

static refit_status_t alloc_ranks(ranks_t *r, int dev)
{
    for (uint32_t i = 0; i < r->n; i++) {
        refit_status_t st = refit_gpu_alloc(dev, refit_manifest_region_size(r->m[i], 0), &r->arena[i]);
        if (st) return st;
    }
    return REFIT_OK;
}

/* A batch for plan (sources: arenas srcs, destination: dst) on dev. */
static refit_status_t plan_batch(const refit_manifest_t *const *srcs, void *const *src_arenas, uint32_t nsrc,
                                 const refit_manifest_t *dst, void *dst_arena, int dev, refit_gpu_batch_t **g,
                                 uint64_t **slots_out)
{
    refit_plan_t *plan = NULL;
    refit_batch_t b;
    memset(&b, 0, sizeof(b));
    refit_status_t st = refit_plan_create(srcs, nsrc, dst, NULL, &plan);
    refit_batch_opts_t o;
    memset(&o, 0, sizeof(o));
    o.max_shift = 4;
    o.copies = o.fills = true;
    if (!st) st = refit_batch_build(plan, &o, &b);
    uint64_t *slots = NULL;
    if (!st && !(slots = (uint64_t *)calloc(b.nslots ? b.nslots : 1, sizeof(uint64_t))))
        st = refit_error(REFIT_ERR_NO_MEMORY, "baseline");
    for (uint32_t s = 0; !st && s < nsrc; s++)
        for (uint32_t k = b.src_slot_base[s]; k < b.src_slot_base[s + 1]; k++)
            slots[k] = (uint64_t)(uintptr_t)src_arenas[s];
    for (uint32_t k = b.dst_slot_base; !st && k < b.nslots; k++) slots[k] = (uint64_t)(uintptr_t)dst_arena;
    if (!st) st = refit_gpu_batch_create(dev, &b, g);
    refit_batch_free(&b);
    refit_plan_destroy(plan);
    if (st) free(slots);
    else *slots_out = slots;
    return st;
}

extern "C" refit_status_t refit_gpu_baseline(const refit_gpu_baseline_cfg_t *cfg, refit_gpu_baseline_t *out)
{
    refit_status_t st = REFIT_OK;
    memset(out, 0, sizeof(*out));
    uint32_t iters = cfg->iters ? cfg->iters : 5;
    if (iters > REFIT_GPU_BASELINE_MAX_ITERS) iters = REFIT_GPU_BASELINE_MAX_ITERS;
    out->iters = iters;
    int sd = cfg->src_dev, dd = cfg->dst_dev, saved = -1;
    refit_model_t *model = NULL;
    ranks_t src, hf, dst;
    memset(&src, 0, sizeof(src));
    memset(&hf, 0, sizeof(hf));
    memset(&dst, 0, sizeof(dst));
    void *packed0 = NULL, *packed1 = NULL;
    refit_gpu_batch_t *pack = NULL, **unpack = NULL, *kcopy = NULL;
    uint64_t *pack_slots = NULL, **unpack_slots = NULL;
    cudaStream_t s0 = NULL, s1 = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    uint64_t packed = 0, pbuf = 0;
    double t_pack[REFIT_GPU_BASELINE_MAX_ITERS], t_bcast[REFIT_GPU_BASELINE_MAX_ITERS],
        t_unpack[REFIT_GPU_BASELINE_MAX_ITERS], t_kcopy[REFIT_GPU_BASELINE_MAX_ITERS];
#ifdef REFIT_HAVE_NCCL
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
    if ((st = alloc_ranks(&src, sd)) || (st = refit_gpu_alloc(sd, pbuf, &packed0)) ||
        (st = refit_gpu_alloc(dd, pbuf, &packed1)) || (st = alloc_ranks(&dst, dd)))
        goto out;
    CK(cudaSetDevice(dd));
    {
        cudaError_t e = cudaDeviceEnablePeerAccess(sd, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CK(e);
        cudaGetLastError();
    }
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e1));
    CK(cudaSetDevice(sd));
    CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));

    /* 1. The raw limit: the packed buffer GPU sd -> GPU dd. */
    for (uint32_t it = 0; it <= iters; it++) { /* iteration 0 warms up */
        CK(cudaSetDevice(dd));
        double t0 = refit_now();
        CK(cudaMemcpyPeerAsync(packed1, dd, packed0, sd, out->peer_bytes, s1));
        CK(cudaStreamSynchronize(s1));
        if (it) out->peer_copy_runs[it - 1] = refit_now() - t0;
    }
    out->peer_copy_s = median(out->peer_copy_runs, iters);
    {
        refit_batch_t b;
        if ((st = refit_batch_single(out->peer_bytes, 0, 4, &b))) goto out;
        st = refit_gpu_batch_create(dd, &b, &kcopy);
        refit_batch_free(&b);
        if (st) goto out;
        uint64_t slots[2] = {(uint64_t)(uintptr_t)packed0, (uint64_t)(uintptr_t)packed1};
        for (uint32_t it = 0; it <= iters; it++) {
            double t0 = refit_now();
            if ((st = refit_gpu_batch_launch(kcopy, slots, NULL, NULL)) ||
                (st = refit_gpu_batch_wait(kcopy, NULL, NULL, 0)))
                goto out;
            if (it) t_kcopy[it - 1] = refit_now() - t0;
        }
        out->peer_copy_kernel_s = median(t_kcopy, iters);
    }
    if (cfg->skip_nccl) {
        snprintf(out->note, sizeof(out->note), "NCCL baseline skipped");
        goto out;
    }
#ifndef REFIT_HAVE_NCCL
    st = refit_error(REFIT_ERR_UNSUPPORTED, "built without nccl.h: no NCCL baseline");
    snprintf(out->note, sizeof(out->note), "built without nccl.h");
    goto out;
#else
    /* 2. NCCL: pack, broadcast, unpack. */
    if ((st = nccl_load(&api, out->nccl_library, sizeof(out->nccl_library)))) goto out;
    NK(api.get_version(&out->nccl_version));
    if ((st = plan_batch((const refit_manifest_t *const *)src.m, src.arena, src.n, hf.m[0], packed0, sd, &pack,
                         &pack_slots)))
        goto out;
    unpack = (refit_gpu_batch_t **)calloc(dst.n, sizeof(void *));
    unpack_slots = (uint64_t **)calloc(dst.n, sizeof(void *));
    if (!unpack || !unpack_slots) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "baseline");
        goto out;
    }
    for (uint32_t r = 0; r < dst.n; r++)
        if ((st = plan_batch((const refit_manifest_t *const *)hf.m, &packed1, 1, dst.m[r], dst.arena[r], dd, &unpack[r],
                             &unpack_slots[r])))
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
            uint64_t pl = 0, ul = 0, calls = 0;
            double t0 = refit_now();
            if ((st = refit_gpu_batch_launch(pack, pack_slots, &pl, NULL)) ||
                (st = refit_gpu_batch_wait(pack, NULL, NULL, 0)))
                goto out;
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
            for (uint32_t r = 0; r < dst.n; r++)
                if ((st = refit_gpu_batch_launch(unpack[r], unpack_slots[r], &ul, NULL))) goto out;
            for (uint32_t r = 0; r < dst.n; r++)
                if ((st = refit_gpu_batch_wait(unpack[r], NULL, NULL, 0))) goto out;
            double t3 = refit_now();
            if (it) {
                t_pack[it - 1] = t1 - t0;
                t_bcast[it - 1] = t2 - t1;
                t_unpack[it - 1] = t3 - t2;
                out->nccl_runs[it - 1] = t3 - t0;
            }
            out->pack_launches = pl;
            out->unpack_launches = ul;
            out->bcast_calls = calls;
            if (it == 1) {
                if ((st = refit_gpu_digest(sd, packed0, packed, &out->digest_src)) ||
                    (st = refit_gpu_digest(dd, packed1, packed, &out->digest_dst)))
                    goto out;
                if (out->digest_src != out->digest_dst) all_ok = false;
            }
            for (uint32_t r = 0; r < dst.n; r++) {
                refit_truth_report_t rep;
                if ((st = refit_gpu_truth_verify(dst.m[r], dd, (const void *const *)&dst.arena[r], v, &rep))) {
                    refit_error_prefix("NCCL baseline, iteration %u, destination rank %u", it, r);
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
#ifdef REFIT_HAVE_NCCL
    for (int i = 0; i < 2; i++)
        if (comms[i]) api.destroy(comms[i]);
#endif
    refit_gpu_batch_destroy(pack);
    refit_gpu_batch_destroy(kcopy);
    for (uint32_t r = 0; unpack && r < dst.n; r++) refit_gpu_batch_destroy(unpack[r]);
    for (uint32_t r = 0; unpack_slots && r < dst.n; r++) free(unpack_slots[r]);
    free(unpack);
    free(unpack_slots);
    free(pack_slots);
    if (s0) cudaStreamDestroy(s0);
    if (s1) cudaStreamDestroy(s1);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    refit_gpu_free(packed0);
    refit_gpu_free(packed1);
    free_ranks(&src);
    free_ranks(&hf);
    free_ranks(&dst);
    refit_model_destroy(model);
    if (saved >= 0) cudaSetDevice(saved);
    return st;
}

/* ---- the colocated limit: a device-to-device copy on one GPU ------------- */

__global__ void pattern_kernel(uint64_t *p, uint64_t words, uint64_t seed)
{
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < words;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ull;
        p[i] = x ^ (x >> 29);
    }
}

extern "C" refit_status_t refit_gpu_d2d_baseline(int dev, uint64_t bytes, uint32_t iters, refit_gpu_d2d_t *out)
{
    refit_status_t st = REFIT_OK;
    memset(out, 0, sizeof(*out));
    if (!iters) iters = 5;
    if (iters > REFIT_GPU_BASELINE_MAX_ITERS) iters = REFIT_GPU_BASELINE_MAX_ITERS;
    out->iters = iters;
    bytes &= ~(uint64_t)255; /* whole 16-byte accesses for the kernel, 8-byte words for the digest */
    out->bytes = bytes;
    int saved = -1;
    void *a = NULL, *b = NULL;
    cudaStream_t s = NULL;
    refit_gpu_batch_t *k = NULL;
    uint64_t da = 0, db = 0;
    double runs[REFIT_GPU_BASELINE_MAX_ITERS], kruns[REFIT_GPU_BASELINE_MAX_ITERS];
    if (dev < 0 || dev >= refit_gpu_count()) return refit_error(REFIT_ERR_UNSUPPORTED, "no CUDA device %d here", dev);
    CK(cudaGetDevice(&saved));
    CK(cudaSetDevice(dev));
    CK(cudaMalloc(&a, bytes ? bytes : 256));
    CK(cudaMalloc(&b, bytes ? bytes : 256));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    pattern_kernel<<<1024, 256, 0, s>>>((uint64_t *)a, bytes / 8, 0x726566697431ull); /* never time zeros */
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
    if ((st = refit_gpu_digest(dev, a, bytes, &da))) goto out;
    /* 1. cudaMemcpyAsync device to device (what a plain copy of the bytes costs). */
    for (uint32_t it = 0; it <= iters; it++) { /* iteration 0 warms up */
        CK(cudaMemsetAsync(b, 0xa5, bytes, s));
        CK(cudaStreamSynchronize(s));
        double t0 = refit_now();
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
        CK(cudaStreamSynchronize(s));
        if (it) runs[it - 1] = refit_now() - t0;
    }
    if ((st = refit_gpu_digest(dev, b, bytes, &db))) goto out;
    out->copy_verified = da == db;
    out->copy_s = median(runs, iters);
    memcpy(out->copy_runs, runs, iters * sizeof(double));
    /* 2. The batch copy kernel on the same bytes, one region. */
    {
        refit_batch_t bt;
        if ((st = refit_batch_single(bytes, 1u << 20, 4, &bt))) goto out; /* as cuda_ipc runs it on one GPU */
        st = refit_gpu_batch_create(dev, &bt, &k);
        refit_batch_free(&bt);
        if (st) goto out;
        refit_gpu_batch_local(k);
        uint64_t slots[2] = {(uint64_t)(uintptr_t)a, (uint64_t)(uintptr_t)b};
        for (uint32_t it = 0; it <= iters; it++) {
            CK(cudaMemsetAsync(b, 0x5a, bytes, s));
            CK(cudaStreamSynchronize(s));
            double t0 = refit_now();
            if ((st = refit_gpu_batch_launch(k, slots, NULL, NULL)) || (st = refit_gpu_batch_wait(k, NULL, NULL, 0)))
                goto out;
            if (it) kruns[it - 1] = refit_now() - t0;
        }
        if ((st = refit_gpu_digest(dev, b, bytes, &db))) goto out;
        out->kernel_verified = da == db;
        out->kernel_s = median(kruns, iters);
    }
    if (!out->copy_verified || !out->kernel_verified)
        st = refit_error(REFIT_ERR_VERIFY, "d2d baseline: the copy's digest differs from the source's");
out:
    refit_gpu_batch_destroy(k);
    if (s) cudaStreamDestroy(s);
    cudaFree(a);
    cudaFree(b);
    if (saved >= 0) cudaSetDevice(saved);
    return st;
}
