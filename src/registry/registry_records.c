/* The registry's sources (manifests, heartbeats, liveness) and versions (records, heads), on top of the
 * signed access in registry.c.
 *
 * Values.  Manifests are stored verbatim (their codec checks them).  Records
 * and heartbeats are fixed-size little-endian structures:
 *
 *   record (56 bytes)             heartbeat (96 bytes)
 *   0  magic "RFVR"               0  magic "RFHB"
 *   4  format u16 = 1             4  format u16 = 1
 *   6  size u16 = 56              6  size u16 = 96
 *   8  version u64                8  incarnation u64
 *   16 signature u64              16 pid u32
 *   24 incarnation u64            20 reserved u32 = 0
 *   32 buffer u32                 24 host char[64], NUL-terminated, NUL-padded
 *   36 flags u32                  88 checksum u64
 *   40 delta_base u64
 *   48 checksum u64
 *
 * checksum = refit_hash64(bytes before it, seed) (catches torn or foreign
 * bytes; authenticity is the tag's job, registry.c).  Anything else (length,
 * magic, size, checksum, reserved bits, unterminated host) is
 * REFIT_ERR_CORRUPT naming the key; another format number is
 * REFIT_ERR_UNSUPPORTED. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "refit/manifest.h"
#include "registry/registry_internal.h"

#define REC_MAGIC "RFVR"
#define REC_SIZE 56u
#define REC_SEED 0x5246565231ULL /* "RFVR1" */
#define HB_MAGIC "RFHB"
#define HB_SIZE 96u
#define HB_SEED 0x5246484231ULL /* "RFHB1" */
#define FORMAT 1u

/* ---- encodings ---------------------------------------------------------- */


static void seal(uint8_t *p, const char *magic, unsigned size, uint64_t seed)
{
    memcpy(p, magic, 4);
    refit_put_le(p + 4, FORMAT, 2);
    refit_put_le(p + 6, size, 2);
    refit_put_le(p + size - 8, refit_hash64(p, size - 8, seed), 8);
}

/* Checks length, magic, format, size and checksum of a fixed-size value. */
static refit_status_t check_sealed(const uint8_t *p, size_t len, const char *magic, unsigned size, uint64_t seed,
                                   const char *key)
{
    if (len != size) return refit_error(REFIT_ERR_CORRUPT, "registry key %s: %zu bytes, want %u", key, len, size);
    if (memcmp(p, magic, 4) != 0) return refit_error(REFIT_ERR_CORRUPT, "registry key %s: bad magic", key);
    if (refit_get_le(p + 4, 2) != FORMAT)
        return refit_error(REFIT_ERR_UNSUPPORTED, "registry key %s: format %u, want %u", key,
                           (unsigned)refit_get_le(p + 4, 2), FORMAT);
    if (refit_get_le(p + 6, 2) != size)
        return refit_error(REFIT_ERR_CORRUPT, "registry key %s: size field %u, want %u", key,
                           (unsigned)refit_get_le(p + 6, 2), size);
    if (refit_get_le(p + size - 8, 8) != refit_hash64(p, size - 8, seed))
        return refit_error(REFIT_ERR_CORRUPT, "registry key %s: checksum mismatch", key);
    return REFIT_OK;
}

static void encode_record(uint8_t p[REC_SIZE], const refit_version_record_t *rec)
{
    memset(p, 0, REC_SIZE);
    refit_put_le(p + 8, rec->version, 8);
    refit_put_le(p + 16, rec->signature, 8);
    refit_put_le(p + 24, rec->incarnation, 8);
    refit_put_le(p + 32, rec->buffer, 4);
    refit_put_le(p + 36, rec->flags, 4);
    refit_put_le(p + 40, rec->delta_base, 8);
    seal(p, REC_MAGIC, REC_SIZE, REC_SEED);
}

static refit_status_t decode_record(const void *buf, size_t len, const char *key, refit_version_record_t *out)
{
    const uint8_t *p = buf;
    refit_status_t st = check_sealed(p, len, REC_MAGIC, REC_SIZE, REC_SEED, key);
    if (st) return st;
    refit_version_record_t rec = {
        .version = refit_get_le(p + 8, 8),
        .signature = refit_get_le(p + 16, 8),
        .incarnation = refit_get_le(p + 24, 8),
        .buffer = (uint32_t)refit_get_le(p + 32, 4),
        .flags = (uint32_t)refit_get_le(p + 36, 4),
        .delta_base = refit_get_le(p + 40, 8),
    };
    if (rec.version == 0 || rec.version == UINT64_MAX)
        return refit_error(REFIT_ERR_CORRUPT, "registry key %s: version %" PRIu64 " is reserved", key, rec.version);
    *out = rec;
    return REFIT_OK;
}

static void encode_heartbeat(uint8_t p[HB_SIZE], const refit_source_info_t *info, size_t host_len)
{
    memset(p, 0, HB_SIZE);
    refit_put_le(p + 8, info->incarnation, 8);
    refit_put_le(p + 16, info->pid, 4);
    memcpy(p + 24, info->host, host_len);
    seal(p, HB_MAGIC, HB_SIZE, HB_SEED);
}

static refit_status_t decode_heartbeat(const void *buf, size_t len, const char *key, refit_source_info_t *out)
{
    const uint8_t *p = buf;
    refit_status_t st = check_sealed(p, len, HB_MAGIC, HB_SIZE, HB_SEED, key);
    if (st) return st;
    if (refit_get_le(p + 20, 4) != 0) return refit_error(REFIT_ERR_CORRUPT, "registry key %s: reserved field set", key);
    if (!memchr(p + 24, '\0', 64)) return refit_error(REFIT_ERR_CORRUPT, "registry key %s: host not terminated", key);
    refit_source_info_t info = {.incarnation = refit_get_le(p + 8, 8), .pid = (uint32_t)refit_get_le(p + 16, 4)};
    memcpy(info.host, p + 24, 64);
    *out = info;
    return REFIT_OK;
}

/* ---- sources ------------------------------------------------------------ */

refit_status_t refit_registry_put_manifest(refit_registry_t *r, const char *group, uint32_t rank, const void *buf,
                                           size_t len)
{
    refit_status_t st = registry_check_group(group);
    if (st) return st;
    if (!buf || len == 0) return refit_error(REFIT_ERR_INVALID_ARG, "registry put_manifest %s/%u: empty", group, rank);
    char key[KEY_MAX];
    registry_src_key(key, group, rank, "manifest");
    return registry_kv_put(r, key, buf, len, 0, false);
}

refit_status_t refit_registry_get_manifest(refit_registry_t *r, const char *group, uint32_t rank, void **buf,
                                           size_t *len)
{
    refit_status_t st = registry_check_group(group);
    if (st) return st;
    if (!buf || !len) return refit_error(REFIT_ERR_INVALID_ARG, "registry get_manifest: NULL output");
    char key[KEY_MAX];
    registry_src_key(key, group, rank, "manifest");
    void *val = NULL;
    size_t n = 0;
    st = registry_get_one(r, key, &val, &n);
    if (st) return st;
    if (!val) return refit_error(REFIT_ERR_NOT_FOUND, "registry: no manifest for %s rank %u", group, rank);
    *buf = val;
    *len = n;
    return REFIT_OK;
}

refit_status_t refit_registry_heartbeat(refit_registry_t *r, const char *group, uint32_t rank,
                                        const refit_source_info_t *info, uint32_t ttl_ms)
{
    return refit_registry_beat(r, group, rank, info, ttl_ms, NULL);
}

refit_status_t refit_registry_beat(refit_registry_t *r, const char *group, uint32_t rank,
                                   const refit_source_info_t *info, uint32_t ttl_ms, bool *was_absent)
{
    refit_status_t st = registry_check_group(group);
    if (st) return st;
    if (!info || ttl_ms == 0)
        return refit_error(REFIT_ERR_INVALID_ARG, "registry heartbeat %s/%u: NULL info or zero ttl", group, rank);
    size_t host_len = strnlen(info->host, sizeof(info->host));
    if (host_len == sizeof(info->host))
        return refit_error(REFIT_ERR_INVALID_ARG, "registry heartbeat %s/%u: host not NUL-terminated", group, rank);
    uint8_t val[HB_SIZE];
    encode_heartbeat(val, info, host_len);
    char key[KEY_MAX];
    registry_src_key(key, group, rank, "hb");
    if (was_absent) {
        bool present = false;
        if ((st = registry_is_present(r, key, &present))) return st;
        *was_absent = !present;
    }
    return registry_kv_put(r, key, val, sizeof(val), ttl_ms, false);
}

refit_status_t refit_registry_alive(refit_registry_t *r, const char *group, uint32_t world, uint8_t *alive,
                                    refit_source_info_t *infos)
{
    refit_status_t st = registry_check_group(group);
    if (!st) st = registry_check_world(world, alive);
    if (st) return st;
    if (world == 0) return REFIT_OK;
    char *keybuf = NULL;
    void **vals = NULL;
    size_t *lens = NULL;
    st = registry_get_ranks(r, group, world, "hb", &keybuf, &vals, &lens);
    if (st) return st;
    refit_source_info_t *tmp = calloc(world, sizeof(*tmp));
    if (!tmp) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "registry alive: %u infos", world);
        goto free_values;
    }
    for (uint32_t k = 0; k < world; k++) {
        if (!vals[k]) continue;
        st = decode_heartbeat(vals[k], lens[k], keybuf + (size_t)k * KEY_MAX, &tmp[k]);
        if (st) goto free_tmp;
    }
    for (uint32_t k = 0; k < world; k++) {
        alive[k] = vals[k] != NULL;
        if (infos) infos[k] = tmp[k];
    }
free_tmp:
    free(tmp);
free_values:
    registry_free_many(keybuf, vals, lens, world);
    return st;
}

refit_status_t refit_registry_remove_source(refit_registry_t *r, const char *group, uint32_t rank)
{
    refit_status_t st = registry_check_group(group);
    if (st) return st;
    /* Heartbeat first: the rank is seen dead before its data disappears. */
    static const char *const what[] = {"hb", "rec", "manifest"};
    for (size_t i = 0; i < REFIT_ARRAY_LEN(what); i++) {
        char key[KEY_MAX];
        registry_src_key(key, group, rank, what[i]);
        st = r->ops->del(r->kv, key);
        if (st) return st;
    }
    return REFIT_OK;
}

/* ---- versions ----------------------------------------------------------- */

refit_status_t refit_registry_publish(refit_registry_t *r, const char *group, uint32_t rank,
                                      const refit_version_record_t *rec)
{
    refit_status_t st = registry_check_group(group);
    if (st) return st;
    if (!rec) return refit_error(REFIT_ERR_INVALID_ARG, "registry publish %s/%u: NULL record", group, rank);
    uint8_t val[REC_SIZE];
    if (rec->version == 0 || rec->version == UINT64_MAX)
        return refit_error(REFIT_ERR_INVALID_ARG, "registry publish %s/%u: version %" PRIu64 " is reserved", group,
                           rank, rec->version);
    encode_record(val, rec);
    char key[KEY_MAX];
    registry_src_key(key, group, rank, "rec");
    return registry_kv_put(r, key, val, sizeof(val), 0, false);
}

refit_status_t refit_registry_heads(refit_registry_t *r, const char *const *groups, uint32_t n,
                                    refit_version_record_t *recs, uint8_t *present, uint8_t *alive)
{
    if (!groups || !recs || !present || !alive || n > 4096)
        return refit_error(REFIT_ERR_INVALID_ARG, "registry heads: bad arguments");
    if (n == 0) return REFIT_OK;
    for (uint32_t i = 0; i < n; i++) {
        refit_status_t st = registry_check_group(groups[i]);
        if (st) return st;
    }
    char *kb = malloc((size_t)n * 2 * KEY_MAX);
    const char **keys = malloc((size_t)n * 2 * sizeof(*keys));
    void **v = calloc((size_t)n * 2, sizeof(*v));
    size_t *l = calloc((size_t)n * 2, sizeof(*l));
    refit_status_t st = REFIT_OK;
    if (!kb || !keys || !v || !l) st = refit_error(REFIT_ERR_NO_MEMORY, "registry heads: %u groups", n);
    for (uint32_t i = 0; i < n && !st; i++) {
        registry_src_key(kb + (size_t)(2 * i) * KEY_MAX, groups[i], 0, "rec");
        registry_src_key(kb + (size_t)(2 * i + 1) * KEY_MAX, groups[i], 0, "hb");
        keys[2 * i] = kb + (size_t)(2 * i) * KEY_MAX;
        keys[2 * i + 1] = kb + (size_t)(2 * i + 1) * KEY_MAX;
    }
    uint8_t *forged = st ? NULL : calloc((size_t)n * 2, 1);
    if (!st && !forged) st = refit_error(REFIT_ERR_NO_MEMORY, "registry heads: %u groups", n);
    if (!st) st = registry_kv_get_many(r, keys, (size_t)n * 2, v, l, forged);
    free(forged);
    for (uint32_t i = 0; i < n && !st; i++) {
        memset(&recs[i], 0, sizeof(recs[i]));
        present[i] = v[2 * i] != NULL;
        alive[i] = v[2 * i + 1] != NULL;
        refit_source_info_t info;
        /* One unreadable group does not hide the others: it is reported absent. */
        if (present[i] && decode_record(v[2 * i], l[2 * i], keys[2 * i], &recs[i])) {
            refit_log(REFIT_LOG_WARN, "%s", refit_last_error());
            present[i] = 0;
        }
        if (alive[i] && decode_heartbeat(v[2 * i + 1], l[2 * i + 1], keys[2 * i + 1], &info)) {
            refit_log(REFIT_LOG_WARN, "%s", refit_last_error());
            alive[i] = 0;
        }
    }
    for (uint32_t i = 0; v && i < n * 2; i++) free(v[i]);
    free(v);
    free(l);
    free(keys);
    free(kb);
    return st;
}

refit_status_t refit_registry_records(refit_registry_t *r, const char *group, uint32_t world,
                                      refit_version_record_t *recs, uint8_t *present)
{
    refit_status_t st = registry_check_group(group);
    if (!st) st = registry_check_world(world, present);
    if (!st) st = registry_check_world(world, recs);
    if (st) return st;
    if (world == 0) return REFIT_OK;
    char *keybuf = NULL;
    void **vals = NULL;
    size_t *lens = NULL;
    st = registry_get_ranks(r, group, world, "rec", &keybuf, &vals, &lens);
    if (st) return st;
    refit_version_record_t *tmp = calloc(world, sizeof(*tmp));
    if (!tmp) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "registry records: %u records", world);
        goto free_values;
    }
    for (uint32_t k = 0; k < world; k++) {
        if (!vals[k]) continue;
        st = decode_record(vals[k], lens[k], keybuf + (size_t)k * KEY_MAX, &tmp[k]);
        if (st) goto free_tmp;
    }
    for (uint32_t k = 0; k < world; k++) {
        present[k] = vals[k] != NULL;
        recs[k] = tmp[k];
    }
free_tmp:
    free(tmp);
free_values:
    registry_free_many(keybuf, vals, lens, world);
    return st;
}
