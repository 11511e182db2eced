/* refit bench scenarios: fanout, elastic, straggler, egress (fleet behaviour, issue 5).  Not built yet:
 * each says so and exits 1. */
#include "tool.h"
#include "util/util.h"

int bench_fanout(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return tool_fail(refit_error(REFIT_ERR_UNSUPPORTED, "bench scenario fanout is not built yet"), "bench");
}

int bench_elastic(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return tool_fail(refit_error(REFIT_ERR_UNSUPPORTED, "bench scenario elastic is not built yet"), "bench");
}

int bench_straggler(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return tool_fail(refit_error(REFIT_ERR_UNSUPPORTED, "bench scenario straggler is not built yet"), "bench");
}

int bench_egress(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return tool_fail(refit_error(REFIT_ERR_UNSUPPORTED, "bench scenario egress is not built yet"), "bench");
}
