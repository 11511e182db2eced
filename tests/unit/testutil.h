/* Shared helpers for the unit tests (cmocka). */
#ifndef REFIT_TESTUTIL_H
#define REFIT_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "refit/experimental/all.h"

/* Asserts a refit call succeeded, printing the last-error detail if not. */
#define REFIT_ASSERT_OK(expr)                                                                             \
    do {                                                                                                  \
        refit_status_t st_ = (expr);                                                                      \
        if (st_ != REFIT_OK) fail_msg("%s -> %s: %s", #expr, refit_status_name(st_), refit_last_error()); \
    } while (0)
/* Asserts a refit call failed with `code` and that the detail contains `needle`. */
#define REFIT_ASSERT_ERR(expr, code, needle) refit_test_assert_err((expr), (code), (needle), #expr, __FILE__, __LINE__)
void refit_test_assert_err(refit_status_t got, refit_status_t want, const char *needle, const char *expr,
                           const char *file, int line);

#endif

#ifndef REFIT_TESTUTIL_HELPERS
#define REFIT_TESTUTIL_HELPERS
#include "tool_local.h"
/* Opens a built-in model / parses a layout, failing the test on error. */
refit_model_t *t_model(const char *name);
refit_layout_t *t_layout(const char *spec);
refit_manifest_t *t_manifest(const refit_model_t *m, const char *spec, uint32_t rank);
/* The same for a built-in model given by name. */
refit_manifest_t *t_manifest_named(const char *model, const char *spec, uint32_t rank);
/* Index of the placement of canonical `canon` in local `local` whose box
 * starts at canonical row `crow`, or -1. */
int t_find_placement(const refit_manifest_t *m, const char *local, const char *canon, uint64_t crow,
                     refit_placement_t *out);
/* Plans and executes every destination rank of dst_spec from every rank of
 * src_spec (synthetic truth, version v) and verifies every byte; returns the
 * number of destination ranks checked. */
uint32_t t_execute_pair(const char *model, const char *src_spec, const char *dst_spec, uint64_t v);

/* The FP8 arena (refit/fp8.h) of rank `rank` of bf16 layout `spec`, staged
 * here from the truth of version v, and its manifest in *fp8m (a
 * reference made without the engine).  Free the arena. */
unsigned char *t_fp8_arena(const char *model, const char *spec, uint32_t rank, uint64_t v, refit_manifest_t **fp8m);
#endif

#ifndef REFIT_TESTUTIL_PROCS
#define REFIT_TESTUTIL_PROCS
#include <stdbool.h>
#include <sys/types.h>
/* Process and server helpers for multi-process tests.  Every wait is bounded. */
void t_msleep(int ms);
double t_ms_since(double t0);
int t_free_port(void);
bool t_in_path(const char *prog);
int t_rm_tree(const char *path);
typedef struct {
    pid_t pid;
    int port;
    char dir[4096];
} t_redis_t;
/* Starts redis-server on 127.0.0.1:port (port 0: a free one) with its files
 * in a fresh temporary directory; waits (<= 5 s) until it answers PING.  The
 * server dies with the test process. */
bool t_redis_start(t_redis_t *r, int port);
/* The same with more redis-server arguments (NULL-terminated list). */
bool t_redis_start_with(t_redis_t *r, int port, const char *const *extra);
bool t_redis_ping(int port);
/* SIGTERM (then SIGKILL after 5 s) and reap; keeps dir and port for a restart. */
void t_redis_stop(t_redis_t *r);
#endif
