/* The synthetic truth as a verifier (verify.h): the checks of refit/experimental/truth.h
 * for a receiver's memory wherever it lives. */
#include "verify/verify.h"

#include "refit/experimental/truth.h"

static refit_status_t truth_check(void *user, const refit_verify_mem_t *mem)
{
    (void)user;
    if (!mem || !mem->m || !mem->bases) return refit_error(REFIT_ERR_INVALID_ARG, "truth check: NULL argument");
    if (mem->device >= 0) {
#ifdef REFIT_HAVE_CUDA
        return refit_verify_truth_gpu(mem);
#else
        return refit_error(REFIT_ERR_UNSUPPORTED, "the truth of GPU memory (device %d) needs a refit built with CUDA",
                           mem->device);
#endif
    }
    if (mem->fp8) return refit_error(REFIT_ERR_UNSUPPORTED, "FP8 verification needs a GPU");
    return refit_truth_verify_delta(mem->m, mem->bases, mem->version, mem->fraction, NULL);
}

const refit_verifier_t refit_verify_truth = {.name = "truth", .check = truth_check};
