/* Open-addressing hash map from NUL-terminated strings to uint32 values.
 * Keys are borrowed (the caller keeps them alive, usually in the same object). */
#ifndef REFIT_STRMAP_H
#define REFIT_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char **keys;
    uint32_t *vals;
    size_t cap, len; /* cap is 0 or a power of two */
} refit_strmap_t;

/* 0 on success, -1 on OOM.  Replaces the value of an existing key. */
int refit_strmap_put(refit_strmap_t *m, const char *key, uint32_t val);
/* 1 and *val if found, 0 otherwise. */
int refit_strmap_get(const refit_strmap_t *m, const char *key, uint32_t *val);
void refit_strmap_free(refit_strmap_t *m);

#endif
