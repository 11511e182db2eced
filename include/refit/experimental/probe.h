/*
 * refit/experimental/probe.h - checks of a host before a job starts (what `refit
 * preflight` asks the library): is a transport built in, do the transports
 * open with these options, does the registry open with this secret, and how
 * long do its round trips take.
 *
 * Every function may be called from any thread; a registry handle is used by
 * one thread at a time.  Errors are the library's statuses with the detail in
 * refit_last_error().
 *
 * EXPERIMENTAL (docs/api.md): no ABI promise.  Exported for refit's own tools
 * and tests (version node REFIT_EXPERIMENTAL of src/refit.map); a release may
 * change or remove any declaration here without a new soname.
 */
#ifndef REFIT_PROBE_H
#define REFIT_PROBE_H

#include <stdbool.h>

#include "refit/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the transport `name` ("shm", "ucx", "cuda_ipc") is built into this
 * library (refit_features() says the same per feature). */
REFIT_API bool refit_transport_built(const char *name);

/* Opens the transports `names` (comma-separated) with `options` as a
 * publisher would (listeners bound, addresses resolved), then closes them.
 * REFIT_ERR_INVALID_ARG / REFIT_ERR_UNSUPPORTED / REFIT_ERR_TRANSPORT as
 * refit_publisher_create would return them. */
REFIT_API refit_status_t refit_transport_check(const char *names, const char *options);

/* A registry opened for inspection. */
typedef struct refit_registry refit_registry_t;

/* Opens the registry at url (NULL: refit_default_registry()) for job, with
 * the secret in secret_file; secret_file NULL: the secret a rank of the job
 * would use (REFIT_SECRET_FILE, REFIT_SECRET, the job directory; see
 * docs/security.md).  REFIT_ERR_REGISTRY (unreachable), REFIT_ERR_AUTH,
 * REFIT_ERR_UNSUPPORTED (a registry this build has no backend for),
 * REFIT_ERR_INVALID_ARG (url or job malformed). */
REFIT_API refit_status_t refit_registry_connect(const char *url, const char *job, const char *secret_file,
                                                refit_registry_t **out);
/* Whether the registry's entries are signed with a secret that is not the public fallback. */
REFIT_API bool refit_registry_secure(const refit_registry_t *r);
/* Where the secret came from ("file /path", "$REFIT_SECRET", "job directory", "insecure"). */
REFIT_API const char *refit_registry_secret_source(const refit_registry_t *r);
/* One round trip of the lease protocol under group "preflight", version 1:
 * a lease named reader taken, checked (signature and token read back) and
 * released; the three steps' times in milliseconds (each pointer may be NULL). */
REFIT_API refit_status_t refit_registry_probe(refit_registry_t *r, const char *reader, double *take_ms,
                                              double *check_ms, double *release_ms);
/* Closes the registry (NULL: no-op). */
REFIT_API void refit_registry_close(refit_registry_t *r);

#ifdef __cplusplus
}
#endif
#endif
