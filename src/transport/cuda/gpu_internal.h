/* Shared by gpu.cu (kernels, truth, batches) and gpu_device.cu (devices,
 * memory, turns): C++ (nvcc) only. */
#ifndef REFIT_TRANSPORT_CUDA_GPU_INTERNAL_H
#define REFIT_TRANSPORT_CUDA_GPU_INTERNAL_H

#include <cuda_runtime.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "transport/cuda/cuda_check.h"
#include "transport/cuda/gpu.h"
#include "util/util.h"
}

#define THREADS 256

#define CK(call) REFIT_CUDA_CK("", call)

/* The calling thread on device dev until gpu_leave (the device it had before
 * is restored). */
typedef struct {
    int saved;
} devguard_t;
refit_status_t gpu_enter(int dev, devguard_t *g);
void gpu_leave(devguard_t *g);
/* Blocks for a persistent grid of `kernel` (THREADS threads) over nchunks
 * chunks on device dev: the resident blocks of the whole device, or fewer. */
int gpu_grid_for(int dev, uint64_t nchunks, const void *kernel);

#endif
