/* Linear probing over a power-of-two table, kept at most half full. */
#include "util/strmap.h"

#include <stdlib.h>
#include <string.h>

#include "util/util.h"

static size_t slot_of(const refit_strmap_t *m, const char *key)
{
    return (size_t)refit_hash64(key, strlen(key), 0x57a) & (m->cap - 1);
}

static int rehash(refit_strmap_t *m, size_t ncap)
{
    refit_strmap_t n = {calloc(ncap, sizeof(char *)), calloc(ncap, sizeof(uint32_t)), ncap, 0};
    if (!n.keys || !n.vals) {
        free(n.keys);
        free(n.vals);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i]) {
            size_t s = slot_of(&n, m->keys[i]);
            while (n.keys[s]) s = (s + 1) & (ncap - 1);
            n.keys[s] = m->keys[i];
            n.vals[s] = m->vals[i];
            n.len++;
        }
    free(m->keys);
    free(m->vals);
    *m = n;
    return 0;
}

int refit_strmap_put(refit_strmap_t *m, const char *key, uint32_t val)
{
    if ((m->len + 1) * 2 > m->cap && rehash(m, m->cap ? m->cap * 2 : 64)) return -1;
    size_t s = slot_of(m, key);
    while (m->keys[s] && strcmp(m->keys[s], key) != 0) s = (s + 1) & (m->cap - 1);
    if (!m->keys[s]) m->len++;
    m->keys[s] = key;
    m->vals[s] = val;
    return 0;
}

int refit_strmap_get(const refit_strmap_t *m, const char *key, uint32_t *val)
{
    if (!m->cap) return 0;
    size_t s = slot_of(m, key);
    while (m->keys[s]) {
        if (strcmp(m->keys[s], key) == 0) {
            *val = m->vals[s];
            return 1;
        }
        s = (s + 1) & (m->cap - 1);
    }
    return 0;
}

void refit_strmap_free(refit_strmap_t *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof(*m));
}
