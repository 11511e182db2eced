/* What the refit programs (tools/: refit; bench/refit_bench/: refit-bench)
 * share beside the library: the static helper library refit_tool_common
 * (tools/common/), which is not part of librefit and exports nothing.
 *
 * The few internal functions the programs share with the library (the JSON
 * reader among them) are in tool_pure.h. */
#ifndef REFIT_TOOL_COMMON_H
#define REFIT_TOOL_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "tool_pure.h" /* refit_json_*: the reader, built into refit_tool_pure */
#include "refit/experimental/all.h"

#define TOOL_MAX(a, b) ((a) > (b) ? (a) : (b))
#define TOOL_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* Prints "refit: WHAT: detail (NAME)" to stderr; returns 1. */
int tool_fail(refit_status_t st, const char *what);
/* Prints a usage error for a subcommand; returns 2. */
int tool_usage(const char *cmd, const char *msg);
/* A decimal number without sign; 0, or -1 when s is not one. */
int tool_parse_u64(const char *s, uint64_t *out);
/* s as a JSON string literal (quotes, escapes). */
void tool_json_string(FILE *f, const char *s);
/* The report writer of every benchmark record: record (one JSON object, one
 * line) to stdout and, with out_path, into that file.  REFIT_OK, or
 * REFIT_ERR_IO (detail: the path and errno) when the file cannot be written. */
refit_status_t tool_report_write(const char *record, const char *out_path);
/* GPU dev as one JSON object (name, uuid, pci, memory, ...; or its error). */
void tool_print_gpu(FILE *f, int dev);
/* Whether the UCX this tree was built with moves GPU memory (a sentence). */
const char *tool_ucx_cuda_status(void);
/* The program `name` beside this one (same directory as /proc/self/exe),
 * e.g. refit-bench finds refit; 0, or -1 when the path does not fit. */
int tool_sibling(const char *name, char *out, size_t size);
/* The file of `refit plan --dump DIR` / `refit pull --dump DIR` for a rank:
 * DIR/rank-R/model.safetensors into out.  Creates DIR and DIR/rank-R where
 * missing; DIR must belong to this user and not be writable by group or
 * others unless sticky, and DIR/rank-R must be a directory of ours that only
 * we can write, opened without following a symbolic link (another user
 * could otherwise have the dump written into a directory of their choice).
 * REFIT_ERR_AUTH naming the directory and what to do, REFIT_ERR_IO for
 * mkdir/open errors, REFIT_ERR_INVALID_ARG when the path does not fit. */
refit_status_t tool_dump_path(const char *dump, uint64_t rank, char *out, size_t size);

#endif
