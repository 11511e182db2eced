/* The registry's leases, the job's epoch, readers' acknowledgements and waiting, on top of the signed
 * access in registry.c.
 *
 *   lease value (40 bytes): "RFLS", u32 = 0, version u64, token u64 (0 for
 *   plain acquires), reserved u64 x 2; key "epoch" (outside every group):
 *   a random u64, created by the first user of the job.
 *
 * The epoch never stops a job: a value that is not authentic or no epoch is
 * replaced by a fresh one (logged at WARN, naming what was found), as an
 * absent one is created; an epoch deleted and made again faster than it can
 * be read is reported as a fresh value.  Each of these reads as "the store
 * lost its data" to the publishers, which then fence (wait a lease lifetime
 * before trusting "no leases"): the cautious side, never a failure.
 *
 * Lease protocol.  acquire(v, r): (1) get retired(v) (and lease(v, r), to
 * know whether this is a renewal): present -> STALE (deleting the reader's
 * earlier lease, if any); (2) put lease(v, r) with ttl; (3) get retired(v)
 * again: present -> delete the lease, STALE.  retire(v): put retired(v).  The publisher then waits
 * for lease_count(v) (a list of lease(v, *)) to reach 0.
 *   Why no reader can hold a lease the publisher misses, with sequentially
 * consistent (linearizable) backend operations: let acquire return OK; its
 * step (3) read "absent", so it is ordered before the retirer's put of the
 * marker, and the lease put (2) precedes (3).  Every lease_count the retirer
 * issues after retire returned therefore sees that lease (until released or
 * expired).  A reader whose step (3) comes after the marker sees it and
 * deletes its lease; the retirer may count such a lease for a moment, which
 * only makes it wait a little longer (never too little).  Renewal is the
 * same call, so renewing a lease on a retired version fails with STALE and
 * removes it: after STALE the reader holds no lease on that version and must
 * stop reading it (and discard what it read).
 *   Retired markers expire after RETIRED_TTL_MS (10 min) so that a
 * long-running job does not accumulate one key per step; leases expire by
 * themselves.  A marker that has expired no longer blocks acquires: by then
 * the publisher has long published a newer record, and readers acquire only
 * versions they have just read from a record (and re-read the record after
 * acquiring), so the expired marker is never needed.  Deleting old versions'
 * keys at retire time instead would need a list of the group's versions on
 * every retire (a SCAN of the keyspace in redis) and buys nothing more. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "registry/registry_internal.h"
#include "util/crypto.h"

#define RETIRED_TTL_MS (10u * 60u * 1000u)
#define ACK_TTL_MS (60u * 60u * 1000u)
#define LEASE_MAGIC "RFLS"
#define LEASE_SIZE 40u
#define EPOCH_TRIES 6 /* reads of a changing epoch, 1 + 2 + 4 + 8 + 16 ms apart */

/* ---- leases ------------------------------------------------------------- */

static void retired_key(char *key, const char *group, uint64_t version)
{
    snprintf(key, KEY_MAX, "%s/v/%" PRIu64 "/retired", group, version);
}

static void lease_key(char *key, const char *group, uint64_t version, const char *reader)
{
    snprintf(key, KEY_MAX, "%s/v/%" PRIu64 "/lease/%s", group, version, reader);
}

refit_status_t refit_registry_retire(refit_registry_t *r, const char *group, uint64_t version)
{
    refit_status_t st = registry_check_group(group);
    if (st) return st;
    char key[KEY_MAX];
    retired_key(key, group, version);
    return registry_kv_put(r, key, "retired", 7, RETIRED_TTL_MS, false);
}

/* The epoch's value when it is one: 8 bytes, not 0. */
static bool decode_epoch(const void *val, size_t len, uint64_t *e)
{
    if (len != 8) return false;
    *e = refit_get_le(val, 8);
    return *e != 0;
}

refit_status_t refit_registry_epoch(refit_registry_t *r, uint64_t *epoch, bool *created)
{
    if (!r || !epoch) return refit_error(REFIT_ERR_INVALID_ARG, "registry epoch: NULL argument");
    refit_status_t st;
    uint64_t e = 0;
    for (int tries = 0; tries < EPOCH_TRIES; tries++) {
        if (tries) usleep(1000u << (tries - 1)); /* another process raced us: let it finish */
        void *val = NULL;
        size_t len = 0;
        bool forged = false;
        if ((st = registry_get_checked(r, "epoch", &val, &len, &forged))) return st;
        bool ok = val && decode_epoch(val, len, &e), bad = forged || val;
        free(val);
        if (ok) {
            *epoch = e;
            if (created) *created = false;
            return REFIT_OK;
        }
        /* Absent (the store lost its data, or someone deleted the key), or
         * a value that is no epoch: either way no authentic epoch is there,
         * and a fresh one is what tells every user of the job "assume the
         * store lost its data".  Refusing to go on instead stopped every
         * publisher until an operator deleted the key. */
        e = 0;
        while (!e)
            if ((st = refit_random_bytes(&e, sizeof(e)))) return st;
        uint8_t v[8];
        refit_put_le(v, e, 8);
        st = registry_kv_put(r, "epoch", v, sizeof(v), 0, !bad);
        if (!st) {
            *epoch = e;
            if (created) *created = true;
            if (bad)
                refit_log(REFIT_LOG_WARN,
                          "registry %s: key epoch held %s (%zu bytes): replaced by a fresh epoch %016" PRIx64
                          "; publishers treat it as a loss of the store's data",
                          r->url,
                          forged ? "a value not signed with this job's secret" : "a signed value that is no epoch", len,
                          e);
            else
                refit_log(REFIT_LOG_INFO, "registry %s: epoch %016" PRIx64 " made (pid %ld)", r->url, e,
                          (long)getpid());
            return REFIT_OK;
        }
        if (st != REFIT_ERR_BUSY) return st; /* else another process made it first: read it */
    }
    /* Made and deleted again and again: no stable value to report.  A fresh
     * one that is not stored differs from whatever the caller saw before, so
     * it reads as a loss of the store's data (fencing: safe, and the caller
     * goes on); the next call finds whatever is stored by then. */
    *epoch = e;
    if (created) *created = false;
    refit_log(REFIT_LOG_WARN,
              "registry %s: key epoch changed under %d reads: reporting a fresh epoch %016" PRIx64
              " (a loss of the store's data)",
              r->url, EPOCH_TRIES, e);
    return REFIT_OK;
}

typedef struct {
    uint64_t version, token;
} lease_val_t;

static void encode_lease(uint8_t p[LEASE_SIZE], const lease_val_t *l)
{
    memset(p, 0, LEASE_SIZE);
    memcpy(p, LEASE_MAGIC, 4);
    refit_put_le(p + 8, l->version, 8);
    refit_put_le(p + 16, l->token, 8);
}

/* false for a value that is not a lease. */
static bool decode_lease(const void *val, size_t len, lease_val_t *out)
{
    const uint8_t *p = val;
    if (len != LEASE_SIZE || memcmp(p, LEASE_MAGIC, 4) != 0) return false;
    *out = (lease_val_t){refit_get_le(p + 8, 8), refit_get_le(p + 16, 8)};
    return true;
}

/* The acquire protocol (see the top of this file).  expect_token != 0: a
 * renewal, valid only while the lease holds that token; new_token: what
 * the lease value carries (0 for plain acquires). */
static refit_status_t acquire(refit_registry_t *r, const char *group, uint64_t version, const char *reader,
                              uint32_t ttl_ms, uint64_t expect_token, uint64_t new_token)
{
    refit_status_t st = registry_check_group(group);
    if (!st) st = registry_check_reader(reader);
    if (st) return st;
    if (ttl_ms == 0)
        return refit_error(REFIT_ERR_INVALID_ARG, "registry lease %s/v/%" PRIu64 ": zero ttl", group, version);
    char rkey[KEY_MAX], lkey[KEY_MAX];
    retired_key(rkey, group, version);
    lease_key(lkey, group, version, reader);

    /* (1) The marker, and whether this is a renewal, in one round trip. */
    const char *keys[2] = {rkey, lkey};
    void *vals[2] = {NULL, NULL};
    size_t lens[2] = {0, 0};
    st = registry_kv_get_many(r, keys, 2, vals, lens, NULL);
    if (st) return st;
    bool retired = vals[0] != NULL, renewal = vals[1] != NULL;
    lease_val_t held = {0};
    bool ours = renewal && decode_lease(vals[1], lens[1], &held) && held.version == version &&
                held.token == expect_token;
    free(vals[0]);
    free(vals[1]);
    if (expect_token && !ours)
        return refit_error(REFIT_ERR_STALE,
                           "registry: the lease of reader %s on version %" PRIu64 " of %s was lost (%s): the "
                           "publisher may have reused its memory",
                           reader, version, group,
                           renewal ? "it holds another token"
                                   : "deleted, expired, or the "
                                     "store lost its data");
    if (retired) {
        /* No lease stays behind, not even one taken earlier; deleting only
         * what exists keeps refused acquires from notifying waiters. */
        if (renewal && (st = r->ops->del(r->kv, lkey))) return st;
        goto stale;
    }
    /* (2) The lease. */
    uint8_t lv[LEASE_SIZE];
    lease_val_t mine = {version, new_token};
    encode_lease(lv, &mine);
    st = registry_kv_put(r, lkey, lv, sizeof(lv), ttl_ms, false);
    if (st) return st;
    /* (3) The marker again. */
    st = registry_is_present(r, rkey, &retired);
    if (st || retired) {
        /* Retired meanwhile (or unknown): take the lease back.  If that fails
         * too, the lease expires after ttl_ms; report the first error. */
        refit_status_t first = st;
        char detail[512];
        snprintf(detail, sizeof(detail), "%s", refit_last_error());
        refit_status_t dst = r->ops->del(r->kv, lkey);
        if (first) {
            refit_error(first, "%s", detail);
            return first;
        }
        if (dst) return dst;
        goto stale;
    }
    return REFIT_OK;

stale:
    return refit_error(REFIT_ERR_STALE, "registry: version %" PRIu64 " of %s is retired (reader %s)", version, group,
                       reader);
}

refit_status_t refit_registry_lease_acquire(refit_registry_t *r, const char *group, uint64_t version,
                                            const char *reader, uint32_t ttl_ms)
{
    return acquire(r, group, version, reader, ttl_ms, 0, 0);
}

refit_status_t refit_registry_lease_take(refit_registry_t *r, const char *group, uint64_t version, const char *reader,
                                         uint32_t ttl_ms, uint64_t *token)
{
    if (!token) return refit_error(REFIT_ERR_INVALID_ARG, "registry lease_take: NULL token");
    uint64_t t = 0;
    refit_status_t st;
    while (!t)
        if ((st = refit_random_bytes(&t, sizeof(t)))) return st;
    if ((st = acquire(r, group, version, reader, ttl_ms, 0, t))) return st;
    *token = t;
    return REFIT_OK;
}

refit_status_t refit_registry_lease_renew(refit_registry_t *r, const char *group, uint64_t version, const char *reader,
                                          uint32_t ttl_ms, uint64_t token)
{
    if (!token) return refit_error(REFIT_ERR_INVALID_ARG, "registry lease_renew: no token");
    return acquire(r, group, version, reader, ttl_ms, token, token);
}

refit_status_t refit_registry_lease_holds(refit_registry_t *r, const char *group, uint64_t version, const char *reader,
                                          uint64_t token)
{
    refit_status_t st = registry_check_group(group);
    if (!st) st = registry_check_reader(reader);
    if (st) return st;
    char lkey[KEY_MAX];
    lease_key(lkey, group, version, reader);
    void *val = NULL;
    size_t len = 0;
    if ((st = registry_get_one(r, lkey, &val, &len))) return st;
    lease_val_t held;
    bool present = val != NULL;
    bool ours = present && decode_lease(val, len, &held) && held.version == version && held.token == token;
    free(val);
    if (!ours)
        return refit_error(REFIT_ERR_STALE,
                           "registry: the lease of reader %s on version %" PRIu64 " of %s was lost during the "
                           "transfer (%s): the publisher may have rewritten its memory, the bytes are not trusted",
                           reader, version, group,
                           present ? "it holds another token"
                                   : "deleted, expired, or the "
                                     "store lost its data");
    return REFIT_OK;
}

refit_status_t refit_registry_lease_release(refit_registry_t *r, const char *group, uint64_t version,
                                            const char *reader)
{
    refit_status_t st = registry_check_group(group);
    if (!st) st = registry_check_reader(reader);
    if (st) return st;
    char key[KEY_MAX];
    lease_key(key, group, version, reader);
    return r->ops->del(r->kv, key);
}

/* The values under `prefix`, authentic ones only (forged ones are logged and
 * skipped).  *vals[i] NULL where absent or forged; free with free_listing. */
static refit_status_t authentic_listing(refit_registry_t *r, const char *prefix, char ***keys, void ***vals,
                                        size_t **lens, size_t *n)
{
    char **k = NULL;
    size_t nk = 0;
    refit_status_t st = r->ops->list(r->kv, prefix, &k, &nk);
    if (st) return st;
    void **v = calloc(nk ? nk : 1, sizeof(void *));
    size_t *l = calloc(nk ? nk : 1, sizeof(size_t));
    uint8_t *forged = calloc(nk ? nk : 1, 1);
    if (!v || !l || !forged) st = refit_error(REFIT_ERR_NO_MEMORY, "registry: listing %s", prefix);
    else if (nk) st = registry_kv_get_many(r, (const char *const *)k, nk, v, l, forged);
    free(forged);
    if (st) {
        for (size_t i = 0; i < nk; i++) free(k[i]);
        free(k);
        free(v);
        free(l);
        return st;
    }
    *keys = k;
    *vals = v;
    *lens = l;
    *n = nk;
    return REFIT_OK;
}

static void free_listing(char **keys, void **vals, size_t *lens, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(keys[i]);
        free(vals[i]);
    }
    free(keys);
    free(vals);
    free(lens);
}

refit_status_t refit_registry_lease_count(refit_registry_t *r, const char *group, uint64_t version, uint32_t *n)
{
    refit_status_t st = registry_check_group(group);
    if (st) return st;
    if (!n) return refit_error(REFIT_ERR_INVALID_ARG, "registry lease_count: NULL output");
    char prefix[KEY_MAX];
    snprintf(prefix, sizeof(prefix), "%s/v/%" PRIu64 "/lease/", group, version);
    char **keys = NULL;
    void **vals = NULL;
    size_t *lens = NULL, nkeys = 0;
    if ((st = authentic_listing(r, prefix, &keys, &vals, &lens, &nkeys))) return st;
    uint32_t count = 0;
    for (size_t i = 0; i < nkeys; i++) {
        lease_val_t l;
        /* Plain acquires (relays' load tokens) store a lease value with token 0. */
        if (vals[i] && decode_lease(vals[i], lens[i], &l) && l.version == version) count++;
    }
    free_listing(keys, vals, lens, nkeys);
    *n = count;
    return REFIT_OK;
}

refit_status_t refit_registry_lease_revoke(refit_registry_t *r, const char *group, uint64_t version, uint32_t *n)
{
    refit_status_t st = registry_check_group(group);
    if (st) return st;
    char prefix[KEY_MAX];
    snprintf(prefix, sizeof(prefix), "%s/v/%" PRIu64 "/lease/", group, version);
    char **keys = NULL;
    size_t nkeys = 0;
    if ((st = r->ops->list(r->kv, prefix, &keys, &nkeys))) return st;
    uint32_t done = 0;
    for (size_t i = 0; i < nkeys; i++) {
        if (!st && !(st = r->ops->del(r->kv, keys[i]))) done++;
        free(keys[i]);
    }
    free(keys);
    if (n) *n = done;
    return st;
}

/* ---- acknowledgements --------------------------------------------------- */

/* "<group>/ack/<reader>" holds the last version the reader committed, as a
 * u64 little-endian (8 bytes), for ACK_TTL_MS after the last report: a reader
 * that went away still counts for the versions it did commit for an hour,
 * and a job does not keep one key per receiver process forever. */
static void ack_key(char *key, const char *group, const char *reader)
{
    snprintf(key, KEY_MAX, "%s/ack/%s", group, reader);
}

refit_status_t refit_registry_ack(refit_registry_t *r, const char *group, const char *reader, uint64_t version)
{
    refit_status_t st = registry_check_group(group);
    if (!st) st = registry_check_reader(reader);
    if (st) return st;
    if (version == 0 || version == UINT64_MAX)
        return refit_error(REFIT_ERR_INVALID_ARG, "registry ack: version %" PRIu64 " is reserved", version);
    char key[KEY_MAX];
    uint8_t val[8];
    ack_key(key, group, reader);
    refit_put_le(val, version, 8);
    return registry_kv_put(r, key, val, sizeof(val), ACK_TTL_MS, false);
}

refit_status_t refit_registry_acks(refit_registry_t *r, const char *group, uint64_t version, uint32_t *n)
{
    refit_status_t st = registry_check_group(group);
    if (st) return st;
    if (!n) return refit_error(REFIT_ERR_INVALID_ARG, "registry acks: NULL output");
    char prefix[KEY_MAX];
    snprintf(prefix, sizeof(prefix), "%s/ack/", group);
    char **keys = NULL;
    void **vals = NULL;
    size_t *lens = NULL, nkeys = 0;
    if ((st = authentic_listing(r, prefix, &keys, &vals, &lens, &nkeys))) return st;
    uint32_t count = 0;
    for (size_t i = 0; !st && i < nkeys; i++) {
        if (!vals[i]) continue; /* deleted between list and get, or not authentic */
        if (lens[i] != 8) {
            st = refit_error(REFIT_ERR_CORRUPT, "registry: %s holds %zu bytes, not an 8-byte version", keys[i],
                             lens[i]);
            break;
        }
        uint64_t v = refit_get_le(vals[i], 8);
        count += v >= version && v != UINT64_MAX;
    }
    free_listing(keys, vals, lens, nkeys);
    if (!st) *n = count;
    return st;
}

/* ---- waiting ------------------------------------------------------------ */

refit_status_t refit_registry_wait(refit_registry_t *r, int timeout_ms)
{
    if (timeout_ms < 0) return refit_error(REFIT_ERR_INVALID_ARG, "registry wait: negative timeout %d", timeout_ms);
    return r->ops->wait(r->kv, timeout_ms);
}
