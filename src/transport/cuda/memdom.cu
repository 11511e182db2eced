/* The CUDA memory domain (transport/memdom.h): the engine's operations on
 * GPU memory, over the plain-C interface of gpu.h. */
#include "transport/cuda/fp8_gpu.h"
#include "transport/cuda/gpu.h"
#include "transport/memdom.h"

static refit_status_t cuda_truth_verify(const refit_manifest_t *m, int dev, const void *const *bases, uint64_t version,
                                        double fraction)
{
    (void)fraction; /* every byte: receivers on a GPU refuse fractions below 1 */
    /* After a 2 ms grace, so that a receiver waiting to copy on this GPU
     * goes first: kernels of two processes are time-sliced, and this one (a
     * full read of the receiver's memory) would halve that copy's speed
     * (docs/gpu.md). */
    int turn = refit_gpu_turn_take(dev, 0.002, 2.0);
    refit_status_t st = refit_gpu_truth_verify(m, dev, bases, version, NULL);
    refit_gpu_turn_give(turn);
    return st;
}

extern "C" const refit_memdom_t refit_memdom_cuda = {
    "cuda",
    refit_gpu_alloc,
    refit_gpu_free,
    refit_gpu_copy,
    refit_gpu_host_alloc,
    refit_gpu_host_free,
    refit_gpu_plan_fills,
    cuda_truth_verify,
    refit_gpu_fp8_truth_verify,
};
