/* Shared by the cuda_ipc transport's two files: cuda_ipc.cu (create,
 * expose, connect: handles) and cuda_ipc_pull.cu (the cached tables and the
 * pull).  C++ (nvcc) only. */
#ifndef REFIT_TRANSPORT_CUDA_IPC_INTERNAL_H
#define REFIT_TRANSPORT_CUDA_IPC_INTERNAL_H

#include <cuda_runtime.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern "C" {
#include "transport/cuda/fp8_gpu.h"
#include "transport/cuda/cuda_check.h"
#include "transport/cuda/gpu.h"
#include "verify/verify.h"
#include "refit/experimental/plan.h"
#include "transport/transport.h"
}


#define IPC_MAGIC 0x43504943u /* "CIPC" */
#define IPC_DESC_VERSION 1
#define EXEC_CACHE 8
#define MAX_OPEN 1024
/* The batch kernel's chunk (one block's share at a time): 1 MiB moved
 * vllm:tp=2's kernel on one H200 faster than 256 KiB or 64 KiB (docs/gpu.md,
 * Colocated); 4 MiB was no better. */
#define KERNEL_CHUNK (1ull << 20)

typedef struct {
    uint32_t magic, version, pid;
    int32_t device; /* the publisher's device ordinal (informational: ordinals differ between processes) */
    uint64_t start_time;
    uint64_t offset; /* of the region in its allocation */
    uint64_t size;
    uint64_t addr; /* the publisher's address (used by the publisher's own process) */
    char boot_id[40];
    char uuid[48]; /* the device's UUID: what identifies it across processes */
    unsigned char handle[CUDA_IPC_HANDLE_SIZE];
} ipc_desc_t;

typedef struct {
    unsigned char handle[CUDA_IPC_HANDLE_SIZE];
    int dev;
    void *base;
    uint32_t refs;
} opened_t;

typedef struct {
    refit_plan_key_t key;
    size_t nregions;
    uint64_t only_hash;
    int dev;
    uint32_t max_shift;
    refit_gpu_batch_t *batch;
    refit_gpu_batch_t *small; /* local copy=auto: the regions left to the kernel (NULL: none, or not built) */
    refit_gpu_fp8_t *fp8;     /* instead of batch: a quantize-on-copy table for fp8_target */
    const void *fp8_target;
    bool small_built;
    uint64_t last_used;
    /* A receiver that hashes while it copies (ctl->gdig): the copy and hash
     * kernel of its tiles cut by this plan, and the bytes no tile covers as
     * a batch of their own; fused_state 0 not tried, 1 built, 2 the plan
     * cannot be fused (copied and hashed apart); for fused_g's tiles and
     * destinations hashing to fused_dst. */
    refit_gpu_digest_fused_t *fused;
    refit_gpu_batch_t *rest;
    int fused_state;
    const void *fused_g;
    uint64_t fused_dst;
} exec_entry_t;

typedef struct {
    void *base;
    uint64_t len;
} reg_t;

struct refit_transport {
    pthread_mutex_t lock;
    int device;                /* -1: none given */
    bool exec_src;             /* run the copy on the source's GPU, writing to the destination (push) */
    uint64_t peer_enabled[64]; /* bit d of [e]: peer access e -> d enabled in this process */
    REFIT_VEC(reg_t) allocs;
    REFIT_VEC(reg_t) registered;
    opened_t opened[MAX_OPEN];
    uint32_t nopened;
    exec_entry_t exec[EXEC_CACHE];
    uint64_t uses;
    int turns;     /* cuda_ipc.turns=auto (-1: local copies only) | 0 | 1 */
    int copy_mode; /* cuda_ipc.copy=auto (0) | kernel (1) | memcpy (2) */
};

typedef struct {
    void *ptr;  /* the region */
    void *base; /* the opened allocation (NULL: not opened by us) */
    uint64_t size;
} ipc_region_t;

struct refit_peer {
    refit_transport_t *t;
    uint32_t pid, n;
    uint64_t start_time;
    int dev;     /* the device the handles were opened on */
    int src_dev; /* the publisher's device as an ordinal here, -1 if unknown */
    ipc_region_t *regions;
};

#define CK(call) REFIT_CUDA_CK("cuda_ipc: ", call)

static inline int current_device(void)
{
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return d;
}

/* The device holding p, -1 for host memory. */
static inline int pointer_device(const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return a.type == cudaMemoryTypeDevice ? a.device : -1;
}

static inline int device_by_uuid(const char *uuid)
{
    for (int d = 0; d < refit_gpu_count(); d++) {
        char u[48];
        if (refit_gpu_uuid(d, u) == REFIT_OK && strcmp(u, uuid) == 0) return d;
    }
    return -1;
}

typedef int (*get_range_fn)(unsigned long long *base, size_t *size, unsigned long long ptr);

static inline get_range_fn get_range(void)
{
    static get_range_fn fn;
    static int tried;
    if (!tried) {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (get_range_fn)f;
        else cudaGetLastError();
        tried = 1;
    }
    return fn;
}

/* cuda_ipc_pull.cu: the transport's pull() and warm(), and its FP8
 * extension (REFIT_TEXT_FP8: the same with quantize-on-copy). */
refit_status_t cuda_ipc_pull(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                             void *const *dst_bases, const refit_pull_ctl_t *ctl, refit_pull_stats_t *stats);
refit_status_t cuda_ipc_warm(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                             void *const *dst_bases, const refit_pull_ctl_t *ctl);
extern "C" const refit_transport_fp8_t cuda_ipc_fp8_ext;

#endif
