/* REFIT_FLEET_TRACE=DIR (docs/env.md): one line per fleet event appended to
 * DIR/fleet-<pid>.txt, for finding where a chain of relays loses time
 * (bench/fleet_trace.py reads them): the receivers' chunk events
 * (engine/fleet/fleet.c), the UCX publisher's answers to conditional requests
 * and the puller's arrivals (transport/ucx), hence in util/.  Each line:
 * CLOCK_MONOTONIC seconds (one clock for every process of the host), the pid,
 * the event, then the thread id.  Off (one branch) when unset or the file
 * cannot be opened. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "util/env.h"
#include "util/trace.h"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static FILE *g_file;
static int g_state; /* 0: not looked yet, 1: on, -1: off */

bool refit_fleet_tracing(void) { return __atomic_load_n(&g_state, __ATOMIC_RELAXED) >= 0; }

void refit_fleet_trace(const char *fmt, ...)
{
    if (__atomic_load_n(&g_state, __ATOMIC_RELAXED) < 0) return;
    pthread_mutex_lock(&g_mu);
    if (!g_state) {
        const char *dir = refit_diag()->fleet_trace;
        char path[4096];
        if (dir && *dir && snprintf(path, sizeof(path), "%s/fleet-%d.txt", dir, (int)getpid()) < (int)sizeof(path))
            g_file = fopen(path, "a");
        __atomic_store_n(&g_state, g_file ? 1 : -1, __ATOMIC_RELAXED);
    }
    if (g_file) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        fprintf(g_file, "%.6f %d ", (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9, (int)getpid());
        va_list ap;
        va_start(ap, fmt);
        vfprintf(g_file, fmt, ap);
        va_end(ap);
        fprintf(g_file, " tid=%d\n", (int)gettid());
        fflush(g_file);
    }
    pthread_mutex_unlock(&g_mu);
}
