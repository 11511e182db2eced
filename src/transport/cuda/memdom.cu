/* The CUDA memory domain (transport/memdom.h): the engine's operations on
 * GPU memory, over the plain-C interface of gpu.h. */
#include "transport/cuda/gpu.h"
#include "transport/memdom.h"

extern "C" const refit_memdom_t refit_memdom_cuda = {
    "cuda",
    refit_gpu_alloc,
    refit_gpu_free,
    refit_gpu_copy,
    refit_gpu_host_alloc,
    refit_gpu_host_free,
    refit_gpu_plan_fills,
};
