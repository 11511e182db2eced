/* Helpers shared by the refit command's subcommands. */
#ifndef REFIT_TOOL_H
#define REFIT_TOOL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "refit/refit.h"

/* Prints "refit: WHAT: detail (NAME)" to stderr; returns 1. */
int tool_fail(refit_status_t st, const char *what);
/* Prints a usage error for a subcommand; returns 2. */
int tool_usage(const char *cmd, const char *msg);
int tool_parse_u64(const char *s, uint64_t *out);
void tool_json_string(FILE *f, const char *s);

int cmd_publish(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_bench(int argc, char **argv);
/* refit bench scenarios (argv includes --scenario NAME; JSON on stdout:
 * {"scenario":..,"metrics":{..},"assertions":[{"name","expected","observed","passed"}]}). */
int bench_fanout(int argc, char **argv);
int bench_elastic(int argc, char **argv);
int bench_straggler(int argc, char **argv);
int bench_egress(int argc, char **argv);
int bench_delta(int argc, char **argv);
int bench_delta_net(int argc, char **argv); /* delta through publishers and receivers (--net shm|netns) */
int bench_fp8_net(int argc, char **argv);   /* FP8 relays and receivers (--net shm|netns) */
int bench_partial(int argc, char **argv);
int bench_fp8(int argc, char **argv);
int cmd_gpus(int argc, char **argv);

#endif
