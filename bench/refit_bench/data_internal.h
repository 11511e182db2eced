/* The data scenarios of refit-bench on one host (data.c: options, the
 * record, children, setup, delta; data_select.c: partial and fp8).  Internal
 * to bench/refit_bench. */
#ifndef REFIT_BENCH_DATA_INTERNAL_H
#define REFIT_BENCH_DATA_INTERNAL_H

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "tool_proc.h"


#define MAXR 16
#define MAXV 32

#define CMD_SKIP (1ull << 62)
#define REPS 3

typedef struct {
    const char *model, *src, *dst, *out, *format, *select;
    double fraction;
    uint64_t versions;
    unsigned threads;
} bopts_t;

typedef struct {
    char *buf;
    size_t len, cap;
    int failed;
    int nassert;
} jout_t;

typedef tool_proc_t child_t;

typedef int (*child_fn)(void *ctx, uint32_t rank, uint64_t cmd);

typedef struct {
    refit_model_t *model;
    refit_layout_t *sl, *dl;
    uint32_t ns, nd;
    refit_manifest_t *src[MAXR], *dst[MAXR];
} setup_t;

int bd_jfinish(jout_t *j, const char *out);
int bd_parse_opts(int argc, char **argv, bopts_t *o);
int bd_round_all(child_t *c, uint32_t n, const uint64_t *cmds);
int bd_spawn(child_t *c, child_fn fn, void *ctx, uint32_t rank);
refit_status_t bd_setup(setup_t *s, const bopts_t *o);
void *bd_shmap(size_t n);
void bd_jassert(jout_t *j, const char *name, const char *expected, const char *observed, bool passed);
void bd_jp(jout_t *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void bd_stop_all(child_t *c, uint32_t n);
void bd_teardown(setup_t *s);

#endif
