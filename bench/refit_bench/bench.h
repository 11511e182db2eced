/* refit-bench: the benchmark scenarios, beside the refit command (as
 * ucx_perftest is beside ucx_info).  Built on the public API only
 * (include/refit, linked against librefit.so) and the tools' helper library
 * (tools/common).  Each scenario prints one JSON record on stdout:
 *   {"scenario":..,"metrics":{..},"assertions":[{"name","expected","observed","passed"}]}
 * (the GPU scenarios: their own flat records, docs/gpu.md). */
#ifndef REFIT_BENCH_H
#define REFIT_BENCH_H

#include "tool_common.h"

/* argv includes --scenario NAME. */
int bench_gpu(int argc, char **argv);       /* gpu.c */
int bench_colocated(int argc, char **argv); /* gpu.c */
int bench_fanout(int argc, char **argv);    /* net.c */
int bench_elastic(int argc, char **argv);
int bench_straggler(int argc, char **argv);
int bench_egress(int argc, char **argv);
int bench_delta_net(int argc, char **argv); /* delta through publishers and receivers (--net shm|netns) */
int bench_fp8_net(int argc, char **argv);   /* FP8 relays and receivers (--net shm|netns) */
int bench_delta(int argc, char **argv);     /* data.c */
int bench_partial(int argc, char **argv);
int bench_fp8(int argc, char **argv);
/* argv[1] is "netns": namespaces held up for a script (netns.c). */
int bench_netns(int argc, char **argv);

#endif
