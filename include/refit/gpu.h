/*
 * refit/gpu.h - the CUDA devices this library sees, and the GPU benchmark's
 * baselines.
 *
 * Every function here exists in every build: without CUDA (refit_features()
 * lacks REFIT_FEATURE_CUDA) refit_gpu_count() is 0, refit_gpu_can_access_peer()
 * false and the others return REFIT_ERR_UNSUPPORTED.  Each may be called from
 * any thread; each saves and restores the calling thread's current device.
 * Outputs are written only on success.
 */
#ifndef REFIT_GPU_PUBLIC_H
#define REFIT_GPU_PUBLIC_H

#include <stdbool.h>
#include <stdint.h>

#include "refit/manifest.h"
#include "refit/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Devices usable here: 0 without CUDA, a driver or a device (never fails). */
REFIT_API int refit_gpu_count(void);

typedef struct {
    char name[256];
    char uuid[48]; /* "GPU-xxxxxxxx-..." */
    char pci[20];  /* bus id */
    uint64_t memory, free_memory;
    int sms, cc_major, cc_minor;
    int driver, runtime; /* versions, e.g. 13000 */
} refit_gpu_info_t;
/* What device dev is.  REFIT_ERR_INVALID_ARG for a device that is not here. */
REFIT_API refit_status_t refit_gpu_info(int dev, refit_gpu_info_t *out);
/* Whether device `dev` can read device `peer`'s memory directly (P2P). */
REFIT_API bool refit_gpu_can_access_peer(int dev, int peer);

/* The synthetic truth of `version` (refit/truth.h) written into device
 * memory: bases[i] is region i of m, memory of device dev. */
REFIT_API refit_status_t refit_gpu_truth_fill(const refit_manifest_t *m, int dev, void *const *bases, uint64_t version);

/* Baselines of the GPU benchmark (refit-bench --scenario gpu|colocated), in
 * one process holding the GPUs: the raw peer copy of `bytes` src_dev ->
 * dst_dev (copy engines: cudaMemcpyPeerAsync, and the batch kernel pulling
 * over P2P), and NCCL (loaded at run time when built with nccl.h): pack the
 * source layout into one buffer (the hf layout) on src_dev, broadcast it to
 * dst_dev, unpack it into every destination rank, verify every byte. */
#define REFIT_GPU_BASELINE_MAX_ITERS 32
typedef struct {
    const char *model, *src_layout, *dst_layout;
    int src_dev, dst_dev;
    uint32_t iters;      /* timed repetitions (0: 5) */
    uint64_t nccl_chunk; /* bytes per ncclBroadcast (0: 1 GiB) */
    uint64_t peer_bytes; /* bytes of the raw peer copy (0: the packed model) */
    bool skip_nccl;
} refit_gpu_baseline_cfg_t;

typedef struct {
    uint64_t bytes;        /* the model's bytes */
    uint64_t packed_bytes; /* the packed buffer (the hf layout: tensors 256-byte aligned) */
    uint64_t peer_bytes;   /* bytes of the raw peer copy */
    uint32_t iters;
    double peer_copy_s;                       /* median, cudaMemcpyPeerAsync of `bytes` */
    double peer_copy_kernel_s;                /* median, the batch kernel on dst_dev reading src_dev */
    double pack_s, bcast_s, unpack_s, nccl_s; /* medians; nccl_s = the median of pack + bcast + unpack */
    double peer_copy_runs[REFIT_GPU_BASELINE_MAX_ITERS], nccl_runs[REFIT_GPU_BASELINE_MAX_ITERS];
    uint64_t pack_launches, unpack_launches, bcast_calls; /* per iteration */
    bool nccl_ran, verified;                              /* every destination byte checked in every iteration */
    uint64_t digest_src, digest_dst;                      /* of the packed buffer before and after the broadcast */
    int nccl_version;
    char nccl_library[256];
    char note[256];
} refit_gpu_baseline_t;
REFIT_API refit_status_t refit_gpu_baseline(const refit_gpu_baseline_cfg_t *cfg, refit_gpu_baseline_t *out);

/* The colocated limit on one GPU: `bytes` (rounded down to 256) copied
 * device to device by cudaMemcpyAsync, and by the batch kernel as one
 * region; source filled with a non-zero pattern, each copy checked by
 * digest.  Medians of `iters` (0: 5) after one warm-up. */
typedef struct {
    uint64_t bytes;
    uint32_t iters;
    double copy_s, kernel_s; /* medians */
    double copy_runs[REFIT_GPU_BASELINE_MAX_ITERS];
    bool copy_verified, kernel_verified;
} refit_gpu_d2d_t;
REFIT_API refit_status_t refit_gpu_d2d_baseline(int dev, uint64_t bytes, uint32_t iters, refit_gpu_d2d_t *out);

#ifdef __cplusplus
}
#endif
#endif
