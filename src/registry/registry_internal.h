/* Shared by the registry's files (registry.c, registry_records.c, registry_lease.c): the registry object
 * and the signed access to its backend that the protocol's parts build on. */
#ifndef REFIT_REGISTRY_INTERNAL_H
#define REFIT_REGISTRY_INTERNAL_H

#include "registry/backend.h"
#include "registry/registry.h"

#define KEY_MAX 256

/* The keys derived from the job's secret, on pages of their own that core
 * dumps leave out (refit_secret_alloc). */
typedef struct {
    uint8_t reg_key[32], keys[2][32];
} registry_keys_t;

struct refit_registry {
    const refit_kv_ops_t *ops;
    refit_kv_t *kv;
    char *url;
    registry_keys_t *k;
    bool secure;
    char secret_source[160];
};

refit_status_t registry_check_group(const char *group);
refit_status_t registry_check_reader(const char *reader);
void registry_src_key(char *key, const char *group, uint32_t rank, const char *what);
refit_status_t registry_kv_put(refit_registry_t *r, const char *key, const void *val, size_t len, uint32_t ttl_ms,
                               bool nx);
refit_status_t registry_kv_get_many(refit_registry_t *r, const char *const *keys, size_t n, void **vals, size_t *lens,
                                    uint8_t *forged);
refit_status_t registry_get_one(refit_registry_t *r, const char *key, void **val, size_t *len);
/* One key, its tag checked without failing or logging: *val malloc'ed (tag
 * stripped), or NULL when absent or not authentic; *forged says which, and
 * then *len is the stored value's size. */
refit_status_t registry_get_checked(refit_registry_t *r, const char *key, void **val, size_t *len, bool *forged);
refit_status_t registry_is_present(refit_registry_t *r, const char *key, bool *present);
refit_status_t registry_check_world(uint32_t world, const void *out);
refit_status_t registry_get_ranks(refit_registry_t *r, const char *group, uint32_t world, const char *what,
                                  char **keybuf, void ***vals, size_t **lens);
void registry_free_many(char *keybuf, void **vals, size_t *lens, uint32_t n);

#endif
