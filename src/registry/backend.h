/* Registry backends: a small key-value store with expiring keys and change
 * notification.  registry.c (with registry_records.c and registry_lease.c)
 * builds versions, heartbeats and leases on top, identically for every backend. Keys are printable ASCII without spaces,
 * of the form "<group>/<...>" (the backend adds the job namespace). */
#ifndef REFIT_REGISTRY_BACKEND_H
#define REFIT_REGISTRY_BACKEND_H

#include "registry/registry.h"

typedef struct refit_kv refit_kv_t;

typedef struct {
    const char *scheme; /* "file", "redis" */
    /* url without the scheme prefix ("/dir" or "//host:port") */
    refit_status_t (*open)(const char *rest, const char *job, refit_kv_t **out);
    void (*close)(refit_kv_t *kv);
    /* Atomic replace; ttl_ms = 0 means no expiry.  Notifies waiters. */
    refit_status_t (*put)(refit_kv_t *kv, const char *key, const void *val, size_t len, uint32_t ttl_ms);
    /* Creates only if absent (or expired): REFIT_ERR_BUSY if present.  Notifies waiters. */
    refit_status_t (*put_new)(refit_kv_t *kv, const char *key, const void *val, size_t len, uint32_t ttl_ms);
    /* vals[k] malloc'ed (free them) or NULL where absent/expired; one round trip where possible. */
    refit_status_t (*get_many)(refit_kv_t *kv, const char *const *keys, size_t n, void **vals, size_t *lens);
    refit_status_t (*del)(refit_kv_t *kv, const char *key); /* absent is not an error */
    /* Unexpired keys starting with prefix (malloc'ed array of malloc'ed strings). */
    refit_status_t (*list)(refit_kv_t *kv, const char *prefix, char ***keys, size_t *n);
    refit_status_t (*wait)(refit_kv_t *kv, int timeout_ms);
    /* Optional: a secret shared by everyone who can open this store (file:
     * DIR/<job>/.secret, created on first use); NULL where there is none. */
    refit_status_t (*job_secret)(refit_kv_t *kv, uint8_t out[32]);
} refit_kv_ops_t;

extern const refit_kv_ops_t refit_kv_file_ops;
#ifdef REFIT_HAVE_REDIS
extern const refit_kv_ops_t refit_kv_redis_ops;
#endif

#endif
