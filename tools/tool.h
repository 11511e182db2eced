/* Helpers shared by the refit command's subcommands. */
#ifndef REFIT_TOOL_H
#define REFIT_TOOL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "tool_common.h" /* tool_fail, tool_usage, tool_parse_u64, tool_json_string */

int cmd_publish(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_gpus(int argc, char **argv);
int cmd_simulate(int argc, char **argv); /* tools/simulate.c, on tools/sim */

#endif
