/* include/refit/gpu.h in builds without CUDA: no devices, no baselines.
 * With CUDA, src/transport/cuda/ defines these functions instead. */
#ifndef REFIT_HAVE_CUDA
#include "refit/gpu.h"
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

refit_status_t refit_gpu_baseline(const refit_gpu_baseline_cfg_t *cfg, refit_gpu_baseline_t *out)
{
    (void)cfg;
    (void)out;
    return refit_error(REFIT_ERR_UNSUPPORTED, "GPU baseline: this refit was built without CUDA");
}

refit_status_t refit_gpu_d2d_baseline(int dev, uint64_t bytes, uint32_t iters, refit_gpu_d2d_t *out)
{
    (void)bytes;
    (void)iters;
    (void)out;
    return refit_error(REFIT_ERR_UNSUPPORTED, "GPU %d: this refit was built without CUDA", dev);
}
#else
typedef int refit_gpu_none_unused_t; /* ISO C: a translation unit is not empty */
#endif
