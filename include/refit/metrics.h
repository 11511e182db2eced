/*
 * refit/metrics.h - Prometheus metrics of this process's publishers and
 * receivers (docs/operations.md has the names, types and labels).
 *
 * Every refit_receiver_pull and refit_publisher_publish of the process
 * updates one in-memory set of counters, gauges and histograms (seconds per
 * phase, bytes per transport and lane, failures by status name, versions
 * committed and published, delta ratios, bytes checked and not checkable by
 * content digests).  Nothing is exported unless asked:
 *
 *   REFIT_METRICS_FILE=PATH  after each pull and publish the whole set is
 *                            written to PATH in the Prometheus text format
 *                            (0.0.4), atomically (a temporary file in the same
 *                            directory, renamed), for the node exporter's
 *                            textfile collector (PATH should end in .prom).
 *                            "%p" in PATH is replaced by the process id, so
 *                            that the ranks of one host write files of their own.
 *   REFIT_METRICS_ADDR=ADDR  at the first pull or publish, a minimal HTTP
 *                            server (one thread, up to 16 connections of
 *                            at most 3 s each)
 *                            answers GET /metrics on ADDR: "PORT" or ":PORT"
 *                            (127.0.0.1), "IP:PORT", "[IPv6]:PORT".  Like UCX
 *                            listeners (docs/security.md), it binds one named
 *                            address, the loopback by default; 0.0.0.0 and
 *                            :: are refused.
 *
 * Failures to write the file or to start the server are logged (warn), once
 * per cause; they never fail a pull or a publish.
 *
 * Threads: every function may be called from any thread.
 */
#ifndef REFIT_METRICS_H
#define REFIT_METRICS_H

#include <stddef.h>

#include "refit/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The current metrics in the Prometheus text exposition format (version
 * 0.0.4), NUL-terminated; *out is malloc'ed (free it), *len its length
 * without the NUL (len may be NULL).  REFIT_ERR_NO_MEMORY. */
REFIT_API refit_status_t refit_metrics_text(char **out, size_t *len);

/* Writes the current metrics to `path` atomically ("%p": the process id):
 * through an exclusive temporary of a random name in path's directory, never
 * following a symbolic link, renamed over path.  REFIT_ERR_IO naming the
 * file and the reason. */
REFIT_API refit_status_t refit_metrics_write_file(const char *path);

/* Starts the HTTP endpoint on `addr` (as REFIT_METRICS_ADDR; port 0 picks a
 * free one).  bound (may be NULL) receives "IP:PORT" as bound (at most n
 * bytes).  REFIT_ERR_INVALID_ARG for a malformed or wildcard address,
 * REFIT_ERR_IO if it cannot be bound (the detail says why, e.g. an address
 * of no interface here), REFIT_ERR_BUSY if this process already serves. */
REFIT_API refit_status_t refit_metrics_serve(const char *addr, char *bound, size_t n);

/* Stops the endpoint (waits for its thread); no-op when none runs. */
REFIT_API void refit_metrics_stop(void);

#ifdef __cplusplus
}
#endif
#endif
