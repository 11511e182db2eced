/* The kernels and what launches them: the batch copy kernel (batches), the
 * truth fill/verify kernels and the digest kernel.  Devices, memory and GPU
 * turns: gpu_device.cu.
 *
 * The kernels are thin: the per-thread work is the REFIT_HD code of
 * plan/batch.h and truth/truth_table.h, which the CPU tests run too.  Grids
 * are persistent (a few blocks per multiprocessor) and walk chunks of the
 * table with a grid stride; tables live in device memory for as long as
 * their owner (a cached plan) does. */
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sys/file.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport/cuda/gpu_internal.h"

extern "C" {
#include "truth/truth_table.h"
}

/* ---- kernels ------------------------------------------------------------ */

/* A chunk that lies inside one contiguous run of a 16-byte region (most
 * chunks: runs are whole tensors, rows of thousands of bytes, or whole
 * experts) is a flat copy: one offset computation per block, then every
 * thread keeps FLAT_DEPTH 16-byte loads in flight before its stores.  The
 * Nsight Compute profile of the general walk (four loads in flight, cursor
 * arithmetic between them) on one H200 showed 58% of DRAM bandwidth, 65% of
 * warp stalls waiting on loads and 0.37 eligible warps per scheduler: too
 * few bytes in flight.  Other chunks take the general walk (plan/batch.h).
 * Loads take the read-only path (ld.global.nc) and stores the default
 * policy: against streaming loads and stores (ld/st .cs), with 1 MiB chunks
 * and 2 blocks per multiprocessor for local copies (refit_gpu_batch_local),
 * vllm:tp=2's kernel on one H200 went from 1.77 to 1.91 TB/s (docs/gpu.md,
 * Colocated; variants-kernel.txt in its run folder). */
#define FLAT_DEPTH 8
#define ROWS_DEPTH 6

__device__ __forceinline__ void flat_copy16(const uint4 *__restrict__ s, uint4 *__restrict__ d, uint32_t m)
{
    uint32_t k = threadIdx.x;
    for (; k + (FLAT_DEPTH - 1) * THREADS < m; k += FLAT_DEPTH * THREADS) {
        uint4 v[FLAT_DEPTH];
#pragma unroll
        for (int j = 0; j < FLAT_DEPTH; j++) v[j] = __ldg(s + k + j * THREADS);
#pragma unroll
        for (int j = 0; j < FLAT_DEPTH; j++) d[k + j * THREADS] = v[j];
    }
    for (; k < m; k += THREADS) d[k] = __ldg(s + k); /* the last chunk of a region */
}

/* A chunk of a 16-byte region with one loop (count[0] rows of run_units
 * accesses, strided on both sides) whose rows are shorter than the chunk
 * (e.g. 768-byte rows of column-split expert weights): each access's row
 * and column come from one 32-bit division of its chunk-relative index,
 * ROWS_DEPTH loads in flight per thread (what fits in 64 registers). */
__device__ __forceinline__ void rows_copy16(const refit_batch_region_t *rp, uint64_t u0, uint32_t m,
                                            const uint64_t *__restrict__ slots)
{
    const uint32_t run = (uint32_t)rp->run_units;
    const uint64_t row0 = u0 / run;
    const uint32_t col0 = (uint32_t)(u0 - row0 * run);
    const uint64_t ss = rp->src_stride[0], ds = rp->dst_stride[0];
    const unsigned char *src = (const unsigned char *)(uintptr_t)(slots[rp->src_slot] + rp->src_offset + row0 * ss);
    unsigned char *dst = (unsigned char *)(uintptr_t)(slots[rp->dst_slot] + rp->dst_offset + row0 * ds);
    uint32_t k = threadIdx.x;
    for (; k + (ROWS_DEPTH - 1) * THREADS < m; k += ROWS_DEPTH * THREADS) {
        uint4 v[ROWS_DEPTH];
        uint32_t row[ROWS_DEPTH];
#pragma unroll
        for (int j = 0; j < ROWS_DEPTH; j++) {
            uint32_t t = col0 + k + j * THREADS, r = t / run;
            row[j] = r;
            v[j] = __ldg((const uint4 *)(src + r * ss + ((uint64_t)(t - r * run) << 4)));
        }
#pragma unroll
        for (int j = 0; j < ROWS_DEPTH; j++) {
            uint32_t t = col0 + k + j * THREADS;
            *(uint4 *)(dst + row[j] * ds + ((uint64_t)(t - row[j] * run) << 4)) = v[j];
        }
    }
    for (; k < m; k += THREADS) {
        uint32_t t = col0 + k, r = t / run;
        uint64_t c = (uint64_t)(t - r * run) << 4;
        *(uint4 *)(dst + r * ds + c) = __ldg((const uint4 *)(src + r * ss + c));
    }
}

/* The general walk of one chunk (strided, narrow, fills), kept out of line
 * so that its registers do not limit the flat path's. */
__device__ __noinline__ void general_chunk(const refit_batch_region_t *rp, uint64_t u0, uint64_t u1,
                                           const uint64_t *__restrict__ slots)
{
    const refit_batch_region_t r = *rp;
    const unsigned char *src = r.src_slot == REFIT_BATCH_ZERO ? (const unsigned char *)0
                                                              : (const unsigned char *)(uintptr_t)slots[r.src_slot];
    unsigned char *dst = (unsigned char *)(uintptr_t)slots[r.dst_slot];
    switch (r.shift) {
    case 4: refit_batch_thread_16(&r, u0 + threadIdx.x, u1, blockDim.x, src, dst); break;
    case 3: refit_batch_thread_8(&r, u0 + threadIdx.x, u1, blockDim.x, src, dst); break;
    case 2: refit_batch_thread_4(&r, u0 + threadIdx.x, u1, blockDim.x, src, dst); break;
    case 1: refit_batch_thread_2(&r, u0 + threadIdx.x, u1, blockDim.x, src, dst); break;
    default: refit_batch_thread_1(&r, u0 + threadIdx.x, u1, blockDim.x, src, dst); break;
    }
}

__global__ void __launch_bounds__(THREADS, 4) batch_kernel(const refit_batch_region_t *__restrict__ regions, uint32_t n,
                                                           uint64_t nchunks, const uint64_t *__restrict__ slots)
{
    for (uint64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
        uint32_t i = refit_batch_find(regions, n, c);
        const refit_batch_region_t *rp = &regions[i];
        uint64_t units = rp->units, cu = rp->chunk_units, run = rp->run_units;
        uint64_t u0 = (c - rp->first_chunk) * cu, u1 = u0 + cu;
        if (u1 > units) u1 = units;
        uint32_t src_slot = rp->src_slot, shift = rp->shift;
        if (shift == 4 && src_slot != REFIT_BATCH_ZERO && (u0 / run == (u1 - 1) / run || run >= 1024)) {
            /* within one run, or runs of 16 KiB and more: one flat piece per run the chunk touches */
            while (u0 < u1) {
                refit_batch_cursor_t cur;
                uint64_t so, dof, row = u0 / run, end = (row + 1) * run;
                if (end > u1) end = u1;
                refit_batch_seek(rp, u0, &cur);
                refit_batch_offsets(rp, &cur, &so, &dof);
                flat_copy16((const uint4 *)(uintptr_t)(slots[src_slot] + so),
                            (uint4 *)(uintptr_t)(slots[rp->dst_slot] + dof), (uint32_t)(end - u0));
                u0 = end;
            }
            continue;
        }
        if (shift == 4 && src_slot != REFIT_BATCH_ZERO && rp->count[1] == 1 && rp->count[2] == 1 && run < (1u << 30)) {
            rows_copy16(rp, u0, (uint32_t)(u1 - u0), slots);
            continue;
        }
        general_chunk(rp, u0, u1, slots);
    }
}

__global__ void __launch_bounds__(THREADS)
    truth_kernel(const refit_truth_box_t *__restrict__ boxes, uint32_t n, uint64_t nchunks, uint64_t chunk,
                 const uint64_t *__restrict__ bases, uint64_t version, int verify, unsigned long long *bad,
                 unsigned long long *first_key)
{
    for (uint64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
        uint32_t bi = refit_truth_find(boxes, n, c);
        const refit_truth_box_t b = boxes[bi];
        uint64_t e0 = (c - b.first_chunk) * chunk, e1 = e0 + chunk;
        if (e1 > b.numel) e1 = b.numel;
        uint64_t first = 0;
        uint64_t k = refit_truth_box_thread(&b, e0 + threadIdx.x, e1, blockDim.x,
                                            (unsigned char *)(uintptr_t)bases[b.region], version, verify, &first);
        if (k) {
            atomicAdd(bad, (unsigned long long)k);
            atomicMin(first_key, (unsigned long long)REFIT_TRUTH_KEY(bi, first));
        }
    }
}

__global__ void __launch_bounds__(THREADS) digest_kernel(const unsigned char *p, uint64_t n, unsigned long long *out)
{
    uint64_t words = n / 8, sum = 0;
    const uint64_t *w = (const uint64_t *)p;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < words; i += (uint64_t)gridDim.x * blockDim.x)
        sum += refit_hd_digest_word(w[i], i);
    if (blockIdx.x == 0 && threadIdx.x == 0 && words * 8 < n) {
        uint64_t t = 0;
        for (uint64_t k = words * 8; k < n; k++) t |= (uint64_t)p[k] << (8 * (k - words * 8));
        sum += refit_hd_digest_word(t, words);
    }
    for (int o = 16; o > 0; o /= 2) sum += __shfl_down_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, (unsigned long long)sum);
}

/* ---- truth ---------------------------------------------------------------- */

static refit_status_t truth_run(const refit_manifest_t *m, int dev, void *const *bases, uint64_t version, bool verify,
                                refit_truth_report_t *rep)
{
    refit_status_t st = REFIT_OK;
    devguard_t g;
    refit_truth_table_t t;
    refit_truth_box_t *dboxes = NULL;
    uint64_t *dbases = NULL, *hbases = NULL;
    unsigned long long *dcnt = NULL, hcnt[2] = {0, ~0ull};
    uint32_t nreg = refit_manifest_num_regions(m);
    if ((st = refit_truth_table_build(m, 16384, &t))) return st;
    if ((st = gpu_enter(dev, &g))) {
        refit_truth_table_free(&t);
        return st;
    }
    hbases = (uint64_t *)calloc(nreg ? nreg : 1, sizeof(uint64_t));
    if (!hbases) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "truth");
        goto out;
    }
    for (uint32_t r = 0; r < nreg; r++) hbases[r] = (uint64_t)(uintptr_t)bases[r];
    if (t.n) {
        CK(cudaMalloc(&dboxes, t.n * sizeof(refit_truth_box_t)));
        CK(cudaMemcpy(dboxes, t.boxes, t.n * sizeof(refit_truth_box_t), cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&dbases, (nreg ? nreg : 1) * sizeof(uint64_t)));
    CK(cudaMemcpy(dbases, hbases, nreg * sizeof(uint64_t), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dcnt, sizeof(hcnt)));
    CK(cudaMemcpy(dcnt, hcnt, sizeof(hcnt), cudaMemcpyHostToDevice));
    if (t.nchunks) {
        truth_kernel<<<gpu_grid_for(dev, t.nchunks, (const void *)truth_kernel), THREADS>>>(
            dboxes, t.n, t.nchunks, t.chunk, dbases, version, verify, dcnt, dcnt + 1);
        CK(cudaGetLastError());
    }
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hcnt, dcnt, sizeof(hcnt), cudaMemcpyDeviceToHost));
    if (rep) {
        rep->elements_checked = t.elements;
        rep->bytes_checked = t.bytes;
        rep->mismatches = hcnt[0];
    }
    if (verify && hcnt[0]) {
        uint32_t bi = (uint32_t)(hcnt[1] >> 40);
        uint64_t e = hcnt[1] & ((1ull << 40) - 1), off = 0, found = 0;
        const refit_truth_box_t *b = &t.boxes[bi < t.n ? bi : 0];
        uint64_t want = refit_truth_box_expected(b, e, version, &off);
        cudaMemcpy(&found, (const unsigned char *)bases[b->region] + off, b->es, cudaMemcpyDeviceToHost);
        st = refit_error(REFIT_ERR_VERIFY,
                         "%llu wrong elements or bytes on GPU %d; the first: region %u byte %" PRIu64
                         " (%s, version %" PRIu64 "): expected 0x%" PRIx64 ", found 0x%" PRIx64,
                         hcnt[0], dev, b->region, off, b->zero ? "padding" : "placed element", version, want, found);
    }
out:
    cudaFree(dboxes);
    cudaFree(dbases);
    cudaFree(dcnt);
    free(hbases);
    refit_truth_table_free(&t);
    gpu_leave(&g);
    return st;
}

extern "C" refit_status_t refit_gpu_truth_fill(const refit_manifest_t *m, int dev, void *const *bases, uint64_t version)
{
    if (!m || !bases) return refit_error(REFIT_ERR_INVALID_ARG, "refit_gpu_truth_fill: NULL argument");
    return truth_run(m, dev, bases, version, false, NULL);
}

extern "C" refit_status_t refit_gpu_truth_verify(const refit_manifest_t *m, int dev, const void *const *bases,
                                                 uint64_t version, refit_truth_report_t *report)
{
    if (!m || !bases) return refit_error(REFIT_ERR_INVALID_ARG, "refit_gpu_truth_verify: NULL argument");
    if (report && report->size < sizeof(*report))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_gpu_truth_verify: report->size %zu (REFIT_TRUTH_REPORT_INIT)",
                           report->size);
    return truth_run(m, dev, (void *const *)bases, version, true, report);
}

extern "C" refit_status_t refit_gpu_digest(int dev, const void *p, uint64_t n, uint64_t *out)
{
    refit_status_t st = REFIT_OK;
    devguard_t g;
    unsigned long long *d = NULL, h = 0;
    if ((uintptr_t)p % 8) return refit_error(REFIT_ERR_INVALID_ARG, "digest: address not 8-byte aligned");
    if ((st = gpu_enter(dev, &g))) return st;
    CK(cudaMalloc(&d, sizeof(h)));
    CK(cudaMemset(d, 0, sizeof(h)));
    digest_kernel<<<gpu_grid_for(dev, n / 8 / THREADS + 1, (const void *)digest_kernel), THREADS>>>(
        (const unsigned char *)p, n, d);
    CK(cudaGetLastError());
    CK(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
    *out = h;
out:
    cudaFree(d);
    gpu_leave(&g);
    return st;
}

/* ---- batches -------------------------------------------------------------- */

struct refit_gpu_batch {
    int dev;
    refit_batch_t table; /* host copy (regions, slot bases) */
    refit_batch_region_t *dregions;
    uint64_t *dslots, *hslots; /* device slot table and what was last uploaded */
    bool slots_valid;
    cudaStream_t stream;
    cudaEvent_t done;
    int per_sm; /* blocks per multiprocessor at most (0: as many as fit) */
    /* REFIT_CUDA_TRACE (diagnostics, docs/gpu.md "Colocated"): a timing
     * event before each copy call or launch and one after the last */
    cudaEvent_t *tev;
    const void **tsrc;
    void **tdst;
    uint64_t *tbytes;
    uint32_t ntev, ntcap;
};

/* REFIT_CUDA_TRACE=FILE: per-copy GPU times of local pulls appended to FILE. */
extern "C" const char *refit_gpu_trace_path(void)
{
    const char *e = refit_diag()->cuda_trace; /* read once, under pthread_once (util/env.h) */
    return e && *e ? e : NULL;
}

/* Records a timing event on x's stream before an operation (bytes 0: the
 * end).  Tracing is best effort: nothing is recorded once an event fails. */
static void trace_mark(refit_gpu_batch_t *x, const void *src, void *dst, uint64_t bytes)
{
    if (x->ntev == x->ntcap) {
        uint32_t c = x->ntcap ? 2 * x->ntcap : 256;
        cudaEvent_t *e = (cudaEvent_t *)realloc(x->tev, c * sizeof(*e));
        if (e) x->tev = e;
        const void **s = (const void **)realloc(x->tsrc, c * sizeof(*s));
        if (s) x->tsrc = s;
        void **d = (void **)realloc(x->tdst, c * sizeof(*d));
        if (d) x->tdst = d;
        uint64_t *b = (uint64_t *)realloc(x->tbytes, c * sizeof(*b));
        if (b) x->tbytes = b;
        if (!e || !s || !d || !b) return;
        for (uint32_t i = x->ntcap; i < c; i++)
            if (cudaEventCreate(&x->tev[i]) != cudaSuccess) {
                cudaGetLastError();
                c = i;
                break;
            }
        x->ntcap = c;
        if (x->ntev == x->ntcap) return;
    }
    if (cudaEventRecord(x->tev[x->ntev], x->stream) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    x->tsrc[x->ntev] = src;
    x->tdst[x->ntev] = dst;
    x->tbytes[x->ntev] = bytes;
    x->ntev++;
}

static double ev_ms(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;
    if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
        cudaGetLastError();
        return -1e9;
    }
    return ms;
}

/* After both have been waited for: one line per copy call of `copies`
 * (start relative to the kernel's launch when there is one, duration,
 * rate) and the kernel's span. */
extern "C" void refit_gpu_batch_trace_print(refit_gpu_batch_t *copies, refit_gpu_batch_t *kernel, FILE *f)
{
    cudaEvent_t ref = NULL;
    if (kernel && kernel->ntev >= 2) ref = kernel->tev[0];
    else if (copies && copies->ntev >= 2) ref = copies->tev[0];
    if (!ref) return;
    if (kernel && kernel->ntev >= 2)
        fprintf(f, "kernel start 0.000 end %.3f ms (%" PRIu64 " bytes, %.1f GB/s)\n",
                ev_ms(ref, kernel->tev[kernel->ntev - 1]), kernel->tbytes[0],
                kernel->tbytes[0] / ev_ms(ref, kernel->tev[kernel->ntev - 1]) / 1e6);
    if (!copies || copies->ntev < 2 || copies == kernel) return;
    uint64_t total = 0;
    for (uint32_t i = 0; i + 1 < copies->ntev; i++) {
        double a = ev_ms(ref, copies->tev[i]), d = ev_ms(copies->tev[i], copies->tev[i + 1]);
        total += copies->tbytes[i];
        fprintf(f, "copy %u src %p dst %p bytes %" PRIu64 " start %.4f ms dur %.5f ms %.1f GB/s\n", i, copies->tsrc[i],
                copies->tdst[i], copies->tbytes[i], a, d, copies->tbytes[i] / d / 1e6);
    }
    double span = ev_ms(copies->tev[0], copies->tev[copies->ntev - 1]);
    fprintf(f, "copies %u bytes %" PRIu64 " start %.3f end %.3f ms span %.3f ms %.1f GB/s\n", copies->ntev - 1, total,
            ev_ms(ref, copies->tev[0]), ev_ms(ref, copies->tev[copies->ntev - 1]), span, total / span / 1e6);
}

/* x's later work waits for what `first` has issued so far. */
extern "C" refit_status_t refit_gpu_batch_after(refit_gpu_batch_t *x, refit_gpu_batch_t *first)
{
    refit_status_t st = REFIT_OK;
    devguard_t g;
    if ((st = gpu_enter(x->dev, &g))) return st;
    CK(cudaStreamWaitEvent(x->stream, first->done, 0));
out:
    gpu_leave(&g);
    return st;
}

extern "C" refit_status_t refit_gpu_batch_create(int dev, const refit_batch_t *b, refit_gpu_batch_t **out)
{
    refit_status_t st = REFIT_OK;
    devguard_t g;
    refit_gpu_batch_t *x = (refit_gpu_batch_t *)calloc(1, sizeof(*x));
    *out = NULL;
    if (!x) return refit_error(REFIT_ERR_NO_MEMORY, "GPU batch");
    x->dev = dev;
    if ((st = gpu_enter(dev, &g))) {
        free(x);
        return st;
    }
    x->table = *b;
    x->table.regions = (refit_batch_region_t *)malloc((b->n ? b->n : 1) * sizeof(refit_batch_region_t));
    x->table.src_slot_base = (uint32_t *)malloc((b->nsrcs + 1) * sizeof(uint32_t));
    x->hslots = (uint64_t *)calloc(b->nslots ? b->nslots : 1, sizeof(uint64_t));
    if (!x->table.regions || !x->table.src_slot_base || !x->hslots) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "GPU batch");
        goto out;
    }
    memcpy(x->table.regions, b->regions, b->n * sizeof(refit_batch_region_t));
    memcpy(x->table.src_slot_base, b->src_slot_base, (b->nsrcs + 1) * sizeof(uint32_t));
    CK(cudaMalloc(&x->dregions, (b->n ? b->n : 1) * sizeof(refit_batch_region_t)));
    if (b->n) CK(cudaMemcpy(x->dregions, b->regions, b->n * sizeof(refit_batch_region_t), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&x->dslots, (b->nslots ? b->nslots : 1) * sizeof(uint64_t)));
    CK(cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&x->done, cudaEventDisableTiming));
out:
    gpu_leave(&g);
    if (st) refit_gpu_batch_destroy(x);
    else *out = x;
    return st;
}

extern "C" void refit_gpu_batch_destroy(refit_gpu_batch_t *x)
{
    if (!x) return;
    devguard_t g;
    bool in = gpu_enter(x->dev, &g) == REFIT_OK;
    if (x->stream) cudaStreamSynchronize(x->stream);
    cudaFree(x->dregions);
    cudaFree(x->dslots);
    if (x->done) cudaEventDestroy(x->done);
    for (uint32_t i = 0; i < x->ntcap; i++) cudaEventDestroy(x->tev[i]);
    if (x->stream) cudaStreamDestroy(x->stream);
    if (in) gpu_leave(&g);
    free(x->hslots);
    free(x->tev);
    free(x->tsrc);
    free(x->tdst);
    free(x->tbytes);
    refit_batch_free(&x->table);
    free(x);
}

extern "C" const refit_batch_t *refit_gpu_batch_table(const refit_gpu_batch_t *x) { return &x->table; }
extern "C" void refit_gpu_batch_local(refit_gpu_batch_t *x) { x->per_sm = 2; }
extern "C" int refit_gpu_batch_device(const refit_gpu_batch_t *x) { return x->dev; }

extern "C" refit_status_t refit_gpu_batch_launch(refit_gpu_batch_t *x, const uint64_t *slots, uint64_t *launches,
                                                 uint64_t *uploads)
{
    refit_status_t st = REFIT_OK;
    devguard_t g;
    if ((st = gpu_enter(x->dev, &g))) return st;
    if (!x->slots_valid || memcmp(x->hslots, slots, x->table.nslots * sizeof(uint64_t)) != 0) {
        memcpy(x->hslots, slots, x->table.nslots * sizeof(uint64_t));
        CK(cudaMemcpyAsync(x->dslots, x->hslots, x->table.nslots * sizeof(uint64_t), cudaMemcpyHostToDevice,
                           x->stream));
        x->slots_valid = true;
        if (uploads) (*uploads)++;
    }
    if (x->table.nchunks) {
        bool trace = refit_gpu_trace_path() != NULL;
        if (trace) {
            uint64_t b = 0;
            for (uint32_t i = 0; i < x->table.n; i++) b += x->table.regions[i].units << x->table.regions[i].shift;
            x->ntev = 0;
            trace_mark(x, NULL, NULL, b);
        }
        int grid = gpu_grid_for(x->dev, x->table.nchunks, (const void *)batch_kernel), sms = 0;
        if (x->per_sm > 0 && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, x->dev) == cudaSuccess &&
            grid > x->per_sm * sms)
            grid = x->per_sm * sms;
        batch_kernel<<<grid, THREADS, 0, x->stream>>>(x->dregions, x->table.n, x->table.nchunks, x->dslots);
        CK(cudaGetLastError());
        if (trace) trace_mark(x, NULL, NULL, 0);
        if (launches) (*launches)++;
    }
    CK(cudaEventRecord(x->done, x->stream));
out:
    if (st) x->slots_valid = false;
    gpu_leave(&g);
    return st;
}

extern "C" bool refit_gpu_batch_region_by_copy(const refit_batch_region_t *r, uint64_t min_bytes)
{
    uint64_t per = (r->units << r->shift) / (r->count[1] * r->count[2]);
    if (r->src_slot == REFIT_BATCH_ZERO || per < min_bytes) return false;
    /* contiguous runs only: pitched (2D) copies of vllm:tp=2's 1.5 MiB halves
     * of Megatron's fused expert rows moved 0.83 TB/s on one H200, against
     * the kernel's 1.75 (docs/gpu.md, Colocated) */
    return r->count[0] == 1;
}

extern "C" refit_status_t refit_gpu_batch_copy(refit_gpu_batch_t *x, const uint64_t *slots, uint64_t min_bytes,
                                               uint64_t *ops)
{
    refit_status_t st = REFIT_OK;
    devguard_t g;
    uint64_t n = 0;
    bool trace = refit_gpu_trace_path() != NULL;
    if ((st = gpu_enter(x->dev, &g))) return st;
    x->ntev = 0;
    for (uint32_t i = 0; i < x->table.n; i++) {
        const refit_batch_region_t *r = &x->table.regions[i];
        if (min_bytes && !refit_gpu_batch_region_by_copy(r, min_bytes)) continue;
        if (r->src_slot == REFIT_BATCH_ZERO) {
            st = refit_error(REFIT_ERR_INVALID_ARG, "refit_gpu_batch_copy: a fill region (copies only)");
            goto out;
        }
        const unsigned char *src = (const unsigned char *)(uintptr_t)(slots[r->src_slot] + r->src_offset);
        unsigned char *dst = (unsigned char *)(uintptr_t)(slots[r->dst_slot] + r->dst_offset);
        uint64_t w = r->run_units << r->shift;
        bool pitched = r->count[0] > 1 && r->src_stride[0] >= w && r->dst_stride[0] >= w &&
                       r->src_stride[0] < (1ull << 40) && r->dst_stride[0] < (1ull << 40);
        for (uint64_t d2 = 0; d2 < r->count[2]; d2++)
            for (uint64_t d1 = 0; d1 < r->count[1]; d1++) {
                const unsigned char *s1 = src + d1 * r->src_stride[1] + d2 * r->src_stride[2];
                unsigned char *t1 = dst + d1 * r->dst_stride[1] + d2 * r->dst_stride[2];
                if (trace) trace_mark(x, s1, t1, w * r->count[0]);
                if (r->count[0] == 1) {
                    CK(cudaMemcpyAsync(t1, s1, w, cudaMemcpyDeviceToDevice, x->stream));
                    n++;
                } else if (pitched) {
                    CK(cudaMemcpy2DAsync(t1, r->dst_stride[0], s1, r->src_stride[0], w, r->count[0],
                                         cudaMemcpyDeviceToDevice, x->stream));
                    n++;
                } else {
                    for (uint64_t d0 = 0; d0 < r->count[0]; d0++, n++)
                        CK(cudaMemcpyAsync(t1 + d0 * r->dst_stride[0], s1 + d0 * r->src_stride[0], w,
                                           cudaMemcpyDeviceToDevice, x->stream));
                }
            }
    }
    if (trace) trace_mark(x, NULL, NULL, 0);
    CK(cudaEventRecord(x->done, x->stream));
    if (ops) *ops += n;
out:
    gpu_leave(&g);
    return st;
}

extern "C" refit_status_t refit_gpu_batch_wait(refit_gpu_batch_t *x, refit_status_t (*tick)(void *), void *user,
                                               double deadline)
{
    refit_status_t st = refit_gpu_event_wait(x->done, x->dev, "copy kernel", tick, user, deadline);
    if (st == REFIT_ERR_TRANSPORT) x->slots_valid = false; /* uploaded again next time */
    return st;
}

extern "C" refit_status_t refit_gpu_plan_fills(const refit_plan_t *plan, int dev, void *const *dst_bases,
                                               uint64_t *launches)
{
    size_t nf = 0;
    refit_plan_fills(plan, &nf);
    if (!nf) return REFIT_OK;
    refit_batch_opts_t o;
    memset(&o, 0, sizeof(o));
    o.max_shift = 4;
    o.fills = true;
    refit_batch_t b;
    refit_status_t st = refit_batch_build(plan, &o, &b);
    if (st) return st;
    refit_gpu_batch_t *g = NULL;
    uint64_t *slots = (uint64_t *)calloc(b.nslots ? b.nslots : 1, sizeof(uint64_t));
    if (!slots) st = refit_error(REFIT_ERR_NO_MEMORY, "fills");
    for (uint32_t s = b.dst_slot_base; !st && s < b.nslots; s++)
        slots[s] = (uint64_t)(uintptr_t)dst_bases[s - b.dst_slot_base];
    if (!st) st = refit_gpu_batch_create(dev, &b, &g);
    if (!st) st = refit_gpu_batch_launch(g, slots, launches, NULL);
    if (!st) st = refit_gpu_batch_wait(g, NULL, NULL, 0);
    refit_gpu_batch_destroy(g);
    free(slots);
    refit_batch_free(&b);
    return st;
}
