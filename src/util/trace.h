/* REFIT_FLEET_TRACE (trace.c): one line per event ("start", "claim",
 * "done", "end" of a receiver's chunks; "post", "sent", "arrive" of a UCX
 * conditional request's reply) into the process's trace file; nothing when
 * the variable is unset.  refit_fleet_tracing: whether it may be on (false
 * once found off), for callers whose fields cost something.  Any thread. */
#ifndef REFIT_UTIL_TRACE_H
#define REFIT_UTIL_TRACE_H

#include <stdbool.h>

void refit_fleet_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool refit_fleet_tracing(void);

#endif
