/* The synthetic truth of GPU memory (verify/verify.h): the CUDA folder's
 * side of refit_verify_truth, over the plain-C interfaces of gpu.h and
 * fp8_gpu.h. */
#include "transport/cuda/fp8_gpu.h"
#include "transport/cuda/gpu.h"
#include "verify/verify.h"

extern "C" refit_status_t refit_verify_truth_gpu(const refit_verify_mem_t *mem)
{
    /* An FP8 arena: the bf16 truth quantized on the GPU by the same kernel. */
    if (mem->fp8) return refit_gpu_fp8_truth_verify(mem->m, mem->fp8, mem->device, mem->bases[0], mem->version);
    /* Every byte (receivers on a GPU refuse fractions below 1), after a 2 ms
     * grace, so that a receiver waiting to copy on this GPU goes first:
     * kernels of two processes are time-sliced, and this one (a full read of
     * the receiver's memory) would halve that copy's speed (docs/gpu.md). */
    int turn = refit_gpu_turn_take(mem->device, 0.002, 2.0);
    refit_status_t st = refit_gpu_truth_verify(mem->m, mem->device, mem->bases, mem->version, NULL);
    refit_gpu_turn_give(turn);
    return st;
}
