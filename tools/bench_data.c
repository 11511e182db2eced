/* refit bench scenarios: delta, partial, fp8 (fleet behaviour, issue 5).  Not built yet:
 * each says so and exits 1. */
#include "tool.h"
#include "util/util.h"

int bench_delta(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return tool_fail(refit_error(REFIT_ERR_UNSUPPORTED, "bench scenario delta is not built yet"), "bench");
}

int bench_partial(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return tool_fail(refit_error(REFIT_ERR_UNSUPPORTED, "bench scenario partial is not built yet"), "bench");
}

int bench_fp8(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return tool_fail(refit_error(REFIT_ERR_UNSUPPORTED, "bench scenario fp8 is not built yet"), "bench");
}
