/* refit preflight (tools/preflight.c: options, output, the order of the
 * checks, the transports; preflight_host.c: /dev/shm and shm, GPUs, memory
 * limits, the plan; preflight_net.c: UCX and RDMA, the registry, the secret,
 * the clock).  Internal to the refit command. */
#ifndef REFIT_TOOL_PREFLIGHT_H
#define REFIT_TOOL_PREFLIGHT_H

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "tool.h"
#include "tool_local.h" /* the in-process executor (refit_tool_local, cmake/tools.cmake) */

typedef enum { PASS, WARN, FAIL, SKIP } verdict_t;

#define MAX_CHECKS 32
typedef struct {
    const char *name;
    verdict_t v;
    char detail[640];
    char remedy[400];
} check_t;

typedef struct {
    const char *registry, *job, *transports, *topts, *model, *src, *dst, *ranks, *role;
    int device; /* -1: none asked */
    bool json, snapshot;
    uint64_t shm_need;
    /* derived */
    bool trainer;
    uint32_t rank_list[256];
    uint32_t nranks;
    uint64_t host_bytes; /* bytes this host's ranks hold (0: unknown) */
    bool want_ucx, want_shm, require_rdma;
    check_t checks[MAX_CHECKS];
    size_t n;
} pf_t;

/* preflight.c: a check's line (pf_remedy then sets its remedy), formats, option lists, a loopback pull */
char *pf_option(const char *opts, const char *key);
TOOL_PRINTF(2, 3) void pf_remedy(pf_t *p, const char *fmt, ...);
refit_status_t pf_loopback(const char *transport, const char *topts, const char *tmpdir, refit_pull_report_t *rep);
const char *pf_fmt_bytes(uint64_t b, char *buf, size_t n);
TOOL_PRINTF(4, 5) void pf_put(pf_t *p, const char *name, verdict_t v, const char *fmt, ...);

/* preflight_host.c */
void check_dev_shm(pf_t *p);
void check_gpus(pf_t *p);
void check_memlock(pf_t *p);
void check_plan(pf_t *p);
void check_shm(pf_t *p, const char *tmpdir);
void check_memory(pf_t *p);

/* preflight_net.c */
void check_ucx(pf_t *p, const char *tmpdir);
void check_rdma(pf_t *p);
void check_tcp_cc(pf_t *p);
bool check_registry(pf_t *p, const char *tmpdir);
void check_clock(pf_t *p, bool reachable);
const char *pf_registry_url(const pf_t *p);
void check_auth(pf_t *p, bool reachable);

#endif
