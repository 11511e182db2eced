/* include/refit/experimental/gpu.h in builds without CUDA: no devices.
 * With CUDA, src/transport/cuda/ defines these functions instead. */
#ifndef REFIT_HAVE_CUDA
#include "refit/experimental/gpu.h"
#include "util/util.h"

int refit_gpu_count(void) { return 0; }

refit_status_t refit_gpu_info(int dev, refit_gpu_info_t *out)
{
    (void)out;
    return refit_error(REFIT_ERR_UNSUPPORTED, "GPU %d: this refit was built without CUDA", dev);
}

bool refit_gpu_can_access_peer(int dev, int peer)
{
    (void)dev;
    (void)peer;
    return false;
}

refit_status_t refit_gpu_truth_fill(const refit_manifest_t *m, int dev, void *const *bases, uint64_t version)
{
    (void)m;
    (void)bases;
    (void)version;
    return refit_error(REFIT_ERR_UNSUPPORTED, "GPU %d: this refit was built without CUDA", dev);
}

refit_status_t refit_gpu_truth_verify(const refit_manifest_t *m, int dev, const void *const *bases, uint64_t version,
                                      refit_truth_report_t *report)
{
    (void)m;
    (void)bases;
    (void)version;
    (void)report;
    return refit_error(REFIT_ERR_UNSUPPORTED, "GPU %d: this refit was built without CUDA", dev);
}
#else
typedef int refit_gpu_none_unused_t; /* ISO C: a translation unit is not empty */
#endif
