/* The GPU scenarios' baselines (refit-bench --scenario gpu|colocated), in the
 * bench process, on the public API and the CUDA runtime (gpu_baseline.cu;
 * without CUDA gpu_baseline_none.c reports REFIT_ERR_UNSUPPORTED):
 *
 *  - bench_gpu_baseline: the raw peer copy of `peer_bytes` src_dev -> dst_dev
 *    (copy engines: cudaMemcpyPeerAsync; and the bench's copy kernel on
 *    dst_dev reading over P2P), and NCCL (loaded at run time when built with
 *    nccl.h): pack the source layout into one buffer (the hf layout) on
 *    src_dev, broadcast it to dst_dev, unpack it into every destination rank,
 *    every destination byte verified on the GPU in every iteration.
 *  - bench_gpu_d2d_baseline: the colocated limit on one GPU, `bytes` copied
 *    device to device by cudaMemcpyAsync and by the bench's copy kernel.
 *
 * Pack, unpack and the copy kernel figures use the bench's own batched copy
 * kernel (one launch per plan, gpu_baseline.cu), not refit's. */
#ifndef REFIT_BENCH_GPU_BASELINE_H
#define REFIT_BENCH_GPU_BASELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "refit/experimental/all.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BENCH_GPU_MAX_ITERS 32

typedef struct {
    const char *model, *src_layout, *dst_layout;
    int src_dev, dst_dev;
    uint32_t iters;      /* timed repetitions (0: 5) */
    uint64_t nccl_chunk; /* bytes per ncclBroadcast (0: 1 GiB) */
    uint64_t peer_bytes; /* bytes of the raw peer copy (0: the packed model) */
    bool skip_nccl;
} bench_gpu_baseline_cfg_t;

typedef struct {
    uint64_t bytes;        /* the model's bytes */
    uint64_t packed_bytes; /* the packed buffer (the hf layout: tensors 256-byte aligned) */
    uint64_t peer_bytes;   /* bytes of the raw peer copy */
    uint32_t iters;
    double peer_copy_s;                       /* median, cudaMemcpyPeerAsync of `bytes` */
    double peer_copy_kernel_s;                /* median, the bench's copy kernel on dst_dev reading src_dev */
    double pack_s, bcast_s, unpack_s, nccl_s; /* medians; nccl_s = the median of pack + bcast + unpack */
    double peer_copy_runs[BENCH_GPU_MAX_ITERS], nccl_runs[BENCH_GPU_MAX_ITERS];
    uint64_t pack_launches, unpack_launches, bcast_calls; /* per iteration */
    bool nccl_ran, verified;                              /* every destination byte checked in every iteration */
    uint64_t digest_src, digest_dst;                      /* of the packed buffer before and after the broadcast */
    int nccl_version;
    char nccl_library[256];
    char note[256];
} bench_gpu_baseline_t;

/* out is zeroed first; on failure it holds what was measured before it. */
refit_status_t bench_gpu_baseline(const bench_gpu_baseline_cfg_t *cfg, bench_gpu_baseline_t *out);

typedef struct {
    uint64_t bytes;
    uint32_t iters;
    double copy_s, kernel_s; /* medians: cudaMemcpyAsync, the bench's copy kernel */
    double copy_runs[BENCH_GPU_MAX_ITERS];
    bool copy_verified, kernel_verified;
} bench_gpu_d2d_t;

/* `bytes` (rounded down to 256) on device dev; the source filled with a
 * non-zero pattern, each copy checked by digest.  Medians of `iters` (0: 5)
 * after one warm-up. */
refit_status_t bench_gpu_d2d_baseline(int dev, uint64_t bytes, uint32_t iters, bench_gpu_d2d_t *out);

#ifdef __cplusplus
}
#endif
#endif
