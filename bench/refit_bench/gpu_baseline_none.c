/* gpu_baseline.h in refit-bench builds without CUDA: no baselines.  With
 * CUDA, gpu_baseline.cu defines these functions instead (cmake/tools.cmake). */
#ifndef BENCH_HAVE_CUDA
#include <string.h>

#include "gpu_baseline.h"

refit_status_t bench_gpu_baseline(const bench_gpu_baseline_cfg_t *cfg, bench_gpu_baseline_t *out)
{
    (void)cfg;
    memset(out, 0, sizeof(*out));
    return refit_error(REFIT_ERR_UNSUPPORTED, "GPU baseline: refit-bench was built without CUDA");
}

refit_status_t bench_gpu_d2d_baseline(int dev, uint64_t bytes, uint32_t iters, bench_gpu_d2d_t *out)
{
    (void)bytes;
    (void)iters;
    memset(out, 0, sizeof(*out));
    return refit_error(REFIT_ERR_UNSUPPORTED, "GPU %d: refit-bench was built without CUDA", dev);
}
#else
typedef int bench_gpu_baseline_none_unused_t; /* ISO C: a translation unit is not empty */
#endif
