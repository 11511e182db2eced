/*
 * refit/version.h - which refit this is, what it was built with, its clock.
 *
 * REFIT_VERSION_* are the version of the headers a program was compiled
 * against; refit_version() is the version of the library it runs with (the
 * two differ when a program meets another librefit.so.0 at run time).  The
 * optional parts of refit (transports, registries, CUDA) are chosen when the
 * library is built; refit_features() says which ones this build has.  All
 * functions here may be called from any thread, at any time, and never fail.
 */
#ifndef REFIT_VERSION_H
#define REFIT_VERSION_H

#include <stdint.h>

#include "refit/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* CMakeLists.txt reads these three lines for the project's version. */
#define REFIT_VERSION_MAJOR 0
#define REFIT_VERSION_MINOR 1
#define REFIT_VERSION_PATCH 0

/* The library's version as "MAJOR.MINOR.PATCH" (static storage); its parts
 * go to *major, *minor, *patch (each may be NULL). */
REFIT_API const char *refit_version(int *major, int *minor, int *patch);

/* X(name, bit, short name, what it enables): the optional parts of refit. */
#define REFIT_FEATURE_MAP(X)                                                              \
    X(SHM, 0, "shm", "the shm transport (same host; always built)")                       \
    X(UCX, 1, "ucx", "the ucx transport (UCX: TCP, RDMA)")                                \
    X(CUDA, 2, "cuda", "the cuda_ipc transport, GPU buffers and GPU verification (CUDA)") \
    X(REDIS, 3, "redis", "redis:// registries (hiredis)")

typedef enum {
#define REFIT_FEATURE_ENUM_(name, bit, short_name, text) REFIT_FEATURE_##name = 1u << (bit),
    REFIT_FEATURE_MAP(REFIT_FEATURE_ENUM_)
#undef REFIT_FEATURE_ENUM_
} refit_feature_t;

/* The features built into this library: REFIT_FEATURE_* bits ORed. */
REFIT_API unsigned refit_features(void);
/* The short name of one feature bit ("shm", "ucx", "cuda", "redis"), or NULL
 * for anything that is not exactly one known bit. */
REFIT_API const char *refit_feature_name(unsigned feature);

/* The clock of every time refit reports (report begin_s/end_s fields, the
 * metrics): CLOCK_MONOTONIC, in seconds and in nanoseconds. */
REFIT_API double refit_now(void);
REFIT_API uint64_t refit_now_ns(void);

#ifdef __cplusplus
}
#endif

#endif
