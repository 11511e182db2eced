/*
 * refit/status.h - status codes, last-error detail and logging.
 *
 * Every refit function that can fail returns a refit_status_t: 0 is success,
 * errors are negative.  A failing call also records a one-line detail in a
 * thread-local buffer (which tensor, which rank, which byte range), read with
 * refit_last_error().  Outputs are written only on success.
 *
 * The library never prints and never aborts.  Logging goes to a sink that is
 * silent by default; REFIT_LOG_LEVEL (error|warn|info|debug|trace) in the
 * environment, or refit_log_set_level(), turns it up.
 */
#ifndef REFIT_STATUS_H
#define REFIT_STATUS_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(REFIT_BUILDING)
#define REFIT_API __attribute__((visibility("default")))
#else
#define REFIT_API
#endif

/* X(name, value, message).  Grouped by how much they break:
 *   -1..-19   the caller's input (arguments, files, manifests, geometries)
 *   -20..-39  planning and verification (the data does not add up)
 *   -40..-59  the environment (memory, I/O, peers, servers, time) */
#define REFIT_STATUS_MAP(X)                                                     \
    X(OK, 0, "success")                                                         \
    X(ERR_INVALID_ARG, -1, "invalid argument")                                  \
    X(ERR_PARSE, -2, "malformed text input")                                    \
    X(ERR_CORRUPT, -3, "corrupt or truncated binary data")                      \
    X(ERR_UNSUPPORTED, -4, "unsupported feature or version")                    \
    X(ERR_GEOMETRY, -5, "geometry breaks a rule of its layout scheme")          \
    X(ERR_NOT_FOUND, -6, "no such model, scheme, tensor or entry")              \
    X(ERR_OUT_OF_BOUNDS, -7, "box or byte range outside its tensor or region")  \
    X(ERR_OVERLAP, -8, "two boxes claim the same bytes")                        \
    X(ERR_IDENTITY, -9, "manifests describe different models or world sizes")   \
    X(ERR_MISMATCH, -20, "a tensor's dtype or shape differs between manifests") \
    X(ERR_UNCOVERED, -21, "destination bytes are held by no source")            \
    X(ERR_MISSING_SOURCE, -22, "a source rank's manifest is missing")           \
    X(ERR_VERIFY, -23, "verification found wrong bytes")                        \
    X(ERR_INTERNAL, -24, "internal consistency check failed")                   \
    X(ERR_REPLAY, -25, "a registry value names bytes its source does not hold") \
    X(ERR_NO_MEMORY, -40, "out of memory")                                      \
    X(ERR_IO, -41, "input/output error")                                        \
    X(ERR_TIMEOUT, -42, "timed out")                                            \
    X(ERR_PEER, -43, "a peer process died or misbehaved")                       \
    X(ERR_TRANSPORT, -44, "transport failure")                                  \
    X(ERR_REGISTRY, -45, "registry failure")                                    \
    X(ERR_STALE, -46, "version or entry is stale")                              \
    X(ERR_BUSY, -47, "resource busy")                                           \
    X(ERR_AUTH, -48, "authentication failed: an entry or a peer did not prove the job's secret")

typedef enum {
#define REFIT_STATUS_ENUM_(name, value, msg) REFIT_##name = value,
    REFIT_STATUS_MAP(REFIT_STATUS_ENUM_)
#undef REFIT_STATUS_ENUM_
} refit_status_t;

/* "REFIT_ERR_UNCOVERED" etc.; "REFIT_UNKNOWN" for values not in the list. */
REFIT_API const char *refit_status_name(refit_status_t status);
/* One sentence saying what the code means (not what happened this time). */
REFIT_API const char *refit_status_message(refit_status_t status);
/* Detail of the most recent failure on this thread ("" if none).  The pointer
 * stays valid until the next refit call on this thread. */
REFIT_API const char *refit_last_error(void);
/* Clears the detail; refit calls that succeed do not clear it. */
REFIT_API void refit_clear_error(void);
/* Sets this thread's last-error detail (printf format) and returns status,
 * so that code built on refit (tools, callbacks) reports a failure the way
 * refit does: `return refit_error(REFIT_ERR_PARSE, "line %d", n);`. */
REFIT_API refit_status_t refit_error(refit_status_t status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

typedef enum {
    REFIT_LOG_OFF = 0,
    REFIT_LOG_ERROR = 1,
    REFIT_LOG_WARN = 2,
    REFIT_LOG_INFO = 3,
    REFIT_LOG_DEBUG = 4,
    REFIT_LOG_TRACE = 5,
} refit_log_level_t;

/* A sink receives one formatted line (no trailing newline).  It may be called
 * from any thread that calls into refit; it must not call back into refit. */
typedef void (*refit_log_sink_t)(refit_log_level_t level, const char *line, void *user);

/* Sets the sink (NULL restores the default: stderr, level from REFIT_LOG_LEVEL,
 * off when unset).  Not thread-safe against concurrent logging: call at start-up. */
REFIT_API void refit_log_set_sink(refit_log_sink_t sink, void *user);
REFIT_API void refit_log_set_level(refit_log_level_t level);
REFIT_API refit_log_level_t refit_log_get_level(void);

#ifdef __cplusplus
}
#endif
#endif
