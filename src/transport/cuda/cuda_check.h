/* The CUDA files' error check: a failed runtime call becomes a refit status
 * (REFIT_ERR_NO_MEMORY for allocations, else REFIT_ERR_TRANSPORT) naming the
 * call, stored in the caller's `st`, and jumps to its `out` label. */
#ifndef REFIT_CUDA_CHECK_H
#define REFIT_CUDA_CHECK_H

#define REFIT_CUDA_CK(prefix, call)                                                                       \
    do {                                                                                                  \
        cudaError_t e_ = (call);                                                                          \
        if (e_ != cudaSuccess) {                                                                          \
            st = refit_error(e_ == cudaErrorMemoryAllocation ? REFIT_ERR_NO_MEMORY : REFIT_ERR_TRANSPORT, \
                             prefix "%s: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
            goto out;                                                                                     \
        }                                                                                                 \
    } while (0)

#endif
