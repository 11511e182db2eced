/* Internal: the environment variables the library reads, every one of them
 * named here and read in env.c, the only file of src/ that calls getenv
 * (besides engine/test_hooks.c, the test flavour's hooks).  docs/env.md says
 * what each one means to users.
 *
 * Two kinds:
 * - settings (REFIT_ENV_SETTINGS): read at the call that uses them, when an
 *   object is created or opened, so a process may change them between two
 *   creates (the secret is even removed from the environment once read:
 *   registry.c);
 * - diagnostics (refit_diag_t): read once per process, under pthread_once,
 *   into one struct; later changes to the environment are not seen. */
#ifndef REFIT_UTIL_ENV_H
#define REFIT_UTIL_ENV_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(ID, NAME): the settings, in docs/env.md's order. */
#define REFIT_ENV_SETTINGS(X)                           \
    X(REGISTRY, "REFIT_REGISTRY")                       \
    X(SECRET, "REFIT_SECRET")                           \
    X(SECRET_FILE, "REFIT_SECRET_FILE")                 \
    X(INSECURE, "REFIT_INSECURE")                       \
    X(REDIS_PASSWORD, "REFIT_REDIS_PASSWORD")           \
    X(REDIS_PASSWORD_FILE, "REFIT_REDIS_PASSWORD_FILE") \
    X(METRICS_FILE, "REFIT_METRICS_FILE")               \
    X(METRICS_ADDR, "REFIT_METRICS_ADDR")               \
    X(RUNTIME_DIR, "REFIT_RUNTIME_DIR")                 \
    X(XDG_RUNTIME_DIR, "XDG_RUNTIME_DIR")               \
    X(HOME, "HOME")

typedef enum {
#define REFIT_ENV_ID(id, name) REFIT_ENV_##id,
    REFIT_ENV_SETTINGS(REFIT_ENV_ID)
#undef REFIT_ENV_ID
        REFIT_ENV_COUNT
} refit_env_t;

/* The setting's value now (getenv's pointer into the environment, which
 * registry.c overwrites for the secret), NULL when unset or var is out of
 * range.  Any thread; as safe as getenv against a concurrent setenv. */
char *refit_env(refit_env_t var);
/* "REFIT_REGISTRY" for REFIT_ENV_REGISTRY; "?" out of range. */
const char *refit_env_name(refit_env_t var);

/* The diagnostics, as the environment held them when first asked (copies:
 * NULL when unset; empty strings are kept).  Parsed where they are used. */
typedef struct refit_diag {
    const char *log_level;        /* REFIT_LOG_LEVEL: off|error|warn|info|debug|trace or 0..5 (util/log.c) */
    const char *cuda_trace;       /* REFIT_CUDA_TRACE: FILE for per-copy GPU times (transport/cuda/gpu.cu) */
    const char *cuda_small;       /* REFIT_CUDA_SMALL: after|before (transport/cuda/cuda_ipc_pull.cu) */
    const char *digest_pass;      /* REFIT_DIGEST_PASS: separate (engine/receiver.c: no hashing while copying) */
    const char *digest_table;     /* REFIT_DIGEST_TABLE: full (engine/publisher.c: no table from a delta's changes) */
    const char *cuda_alloc_round; /* REFIT_CUDA_ALLOC_ROUND: bytes (transport/cuda/gpu_device.cu) */
    const char *digest_trace;     /* REFIT_DIGEST_TRACE: FILE for the phases of each digest check (receiver_verify.c) */
    const char *digest_gpu;       /* REFIT_DIGEST_GPU: host|separate (receiver_verify.c: the older GPU checks) */
    const char *fleet_trace;      /* REFIT_FLEET_TRACE: DIR for per-chunk fleet events (engine/fleet/fleet_trace.c) */
} refit_diag_t;

/* The diagnostics, read on the first call in the process (pthread_once); the
 * struct lives as long as the process.  Any thread.  If a copy cannot be
 * allocated that variable reads as unset. */
const refit_diag_t *refit_diag(void);

#ifdef __cplusplus
}
#endif

#endif
