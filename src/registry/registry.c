/* The registry, built once on top of the key-value backend table
 * (registry/backend.h): URL parsing, key layout, value encodings and the
 * lease protocol.  Backends only store bytes under keys.
 *
 * Key layout (inside the job namespace the backend adds: a directory
 * DIR/<job>/ for file:, the prefix "refit:<job>:" for redis:):
 *
 *   <group>/src/<rank>/manifest           encoded manifest, as given
 *   <group>/src/<rank>/hb                 heartbeat (ttl = the caller's)
 *   <group>/src/<rank>/rec                version record
 *   <group>/v/<version>/retired           retired marker (ttl RETIRED_TTL_MS)
 *   <group>/v/<version>/lease/<reader>    a reader's lease (ttl = the caller's)
 *   <group>/ack/<reader>                  last version the reader committed (u64 LE)
 *
 * <rank> and <version> are decimal.  Group names follow the job rule
 * ([A-Za-z0-9._-], 1..64); reader names may also hold ':' and '@' (1..128).
 * Neither can contain '/', so "<group>/v/7/lease/" never matches version 70.
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
 * bytes; authenticity is the tag's job, below).  Anything else (length,
 * magic, size, checksum, reserved bits, unterminated host) is
 * REFIT_ERR_CORRUPT naming the key; another format number is
 * REFIT_ERR_UNSUPPORTED.
 *
 * Authentication.  Every value goes to the backend as value || tag, tag =
 * HMAC-SHA-256(K_reg, u16 len(key) || key || value) (32 bytes), K_reg derived
 * by HKDF from the job's secret (refit_registry_auth_t) with the job name in
 * the info, so a value is bound to its key and its job: moving a record to
 * another rank's key, or into another job, breaks its tag.  Reads check the
 * tag before anything else (REFIT_ERR_AUTH naming the key); listings that
 * count (leases, acks) skip keys whose values are not authentic.  Replaying
 * an old authentic value under its own key is not prevented by the tag;
 * records only move forward for receivers (they ignore versions they have
 * committed), leases carry a token (fencing, below) and the epoch tells a
 * store that lost its data from one that did not.
 *
 *   lease value (40 bytes): "RFLS", u32 = 0, version u64, token u64 (0 for
 *   plain acquires), reserved u64 x 2; key "epoch" (outside every group):
 *   a random u64, created by the first user of the job.
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
#include "registry/registry.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "refit/manifest.h"
#include "registry/backend.h"
#include "util/crypto.h"

#define RETIRED_TTL_MS (10u * 60u * 1000u)
#define MAX_WORLD REFIT_MANIFEST_MAX_WORLD /* the largest world a manifest may have */
#define KEY_MAX 256

#define REC_MAGIC "RFVR"
#define REC_SIZE 56u
#define REC_SEED 0x5246565231ULL /* "RFVR1" */
#define HB_MAGIC "RFHB"
#define HB_SIZE 96u
#define HB_SEED 0x5246484231ULL /* "RFHB1" */
#define FORMAT 1u
#define TAG_LEN REFIT_SHA256_LEN
#define ACK_TTL_MS (60u * 60u * 1000u)
#define LEASE_MAGIC "RFLS"
#define LEASE_SIZE 40u
#define MIN_SECRET 16u
#define MAX_SECRET 4096u

struct refit_registry {
    const refit_kv_ops_t *ops;
    refit_kv_t *kv;
    char *url;
    uint8_t reg_key[32], keys[2][32];
    bool secure;
    char secret_source[160];
};

/* ---- names -------------------------------------------------------------- */

static bool name_ok(const char *s, size_t max, const char *extra)
{
    size_t n = 0;
    for (; s[n]; n++) {
        char c = s[n];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                  c == '_' || c == '-' || (extra && strchr(extra, c));
        if (!ok || n >= max) return false;
    }
    return n > 0 && s[0] != '.'; /* never ".", ".." or a hidden name */
}

static refit_status_t check_group(const char *group)
{
    if (!group || !name_ok(group, 64, NULL))
        return refit_error(REFIT_ERR_INVALID_ARG, "registry: group name \"%.80s\" must be 1..64 of [A-Za-z0-9._-], not starting with '.'",
                           group ? group : "(null)");
    return REFIT_OK;
}

static refit_status_t check_reader(const char *reader)
{
    if (!reader || !name_ok(reader, 128, ":@"))
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "registry: reader name \"%.140s\" must be 1..128 of [A-Za-z0-9._:@-]",
                           reader ? reader : "(null)");
    return REFIT_OK;
}

static void src_key(char *key, const char *group, uint32_t rank, const char *what)
{
    snprintf(key, KEY_MAX, "%s/src/%" PRIu32 "/%s", group, rank, what);
}

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
    if (len != size)
        return refit_error(REFIT_ERR_CORRUPT, "registry key %s: %zu bytes, want %u", key, len, size);
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

/* ---- open / close ------------------------------------------------------- */

/* ---- the job's secret and the keys derived from it ---------------------- */

/* Reads a secret file: regular, ours, not readable by others, 16..4096 bytes. */
static refit_status_t read_secret_file(const char *path, uint8_t *buf, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return refit_error(REFIT_ERR_AUTH, "secret file %s: %s", path, strerror(errno));
    struct stat sb;
    refit_status_t st = REFIT_OK;
    if (fstat(fd, &sb) != 0) st = refit_error(REFIT_ERR_AUTH, "secret file %s: fstat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode)) st = refit_error(REFIT_ERR_AUTH, "secret file %s is not a regular file", path);
    else if (sb.st_uid != geteuid())
        st = refit_error(REFIT_ERR_AUTH, "secret file %s belongs to uid %u, not to this user (uid %u)", path,
                         (unsigned)sb.st_uid, (unsigned)geteuid());
    else if (sb.st_mode & 077)
        st = refit_error(REFIT_ERR_AUTH, "secret file %s is accessible to group or others (mode %04o): chmod 600 it",
                         path, (unsigned)(sb.st_mode & 07777));
    else if (sb.st_size < MIN_SECRET || sb.st_size > MAX_SECRET)
        st = refit_error(REFIT_ERR_AUTH, "secret file %s holds %lld bytes; want %u..%u", path, (long long)sb.st_size,
                         MIN_SECRET, MAX_SECRET);
    ssize_t n = st ? -1 : read(fd, buf, MAX_SECRET);
    if (!st && n != (ssize_t)sb.st_size)
        st = refit_error(REFIT_ERR_AUTH, "secret file %s: short read", path);
    close(fd);
    if (!st) *len = (size_t)n;
    return st;
}

/* Finds the secret (refit_registry_auth_t's order) and derives the keys. */
static refit_status_t derive_keys(refit_registry_t *r, const char *job, const refit_registry_auth_t *auth)
{
    uint8_t secret[MAX_SECRET];
    size_t len = 0;
    refit_status_t st = REFIT_OK;
    const char *file = auth && auth->secret_file && auth->secret_file[0] ? auth->secret_file : getenv("REFIT_SECRET_FILE");
    const char *env = getenv("REFIT_SECRET"), *insecure_env = getenv("REFIT_INSECURE");
    bool insecure = (auth && auth->insecure) || (insecure_env && strcmp(insecure_env, "1") == 0);
    if (file && file[0]) {
        if ((st = read_secret_file(file, secret, &len))) return st;
        snprintf(r->secret_source, sizeof(r->secret_source), "file %.140s", file);
    } else if (env && env[0]) {
        len = strlen(env);
        if (len < MIN_SECRET || len > MAX_SECRET)
            return refit_error(REFIT_ERR_AUTH, "$REFIT_SECRET holds %zu characters; want %u..%u", len, MIN_SECRET,
                               MAX_SECRET);
        memcpy(secret, env, len);
        snprintf(r->secret_source, sizeof(r->secret_source), "$REFIT_SECRET");
    } else if (insecure) {
        static bool warned;
        if (!warned) refit_log(REFIT_LOG_WARN, "job %s runs without a secret (insecure): registry entries and "
                               "connections are not authenticated", job);
        warned = true;
        len = 0;
        snprintf(r->secret_source, sizeof(r->secret_source), "insecure");
    } else if (r->ops->job_secret) {
        if ((st = r->ops->job_secret(r->kv, secret))) return st;
        len = 32;
        snprintf(r->secret_source, sizeof(r->secret_source), "job directory");
    } else {
        return refit_error(REFIT_ERR_AUTH,
                           "registry %s: no secret for job %s: set REFIT_SECRET_FILE to a file of at least %u random "
                           "bytes (mode 0600) shared by the job's processes (or REFIT_SECRET, or the secret_file "
                           "parameter); REFIT_INSECURE=1 runs without authentication",
                           r->url, job, MIN_SECRET);
    }
    r->secure = !insecure || len > 0;
    static const char salt[] = "refit secret v1";
    char info[128];
    static const char *const uses[] = {"registry", "connection", "digest"};
    for (int i = 0; i < 3; i++) {
        int n = snprintf(info, sizeof(info), "%s key for job %s", uses[i], job);
        refit_hkdf(salt, sizeof(salt) - 1, secret, len, info, (size_t)n, i == 0 ? r->reg_key : r->keys[i - 1], 32);
    }
    refit_wipe(secret, sizeof(secret));
    return REFIT_OK;
}

const uint8_t *refit_registry_key(const refit_registry_t *r, refit_key_use_t use)
{
    return r && (unsigned)use < 2 ? r->keys[use] : NULL;
}

bool refit_registry_secure(const refit_registry_t *r) { return r && r->secure; }
const char *refit_registry_secret_source(const refit_registry_t *r) { return r ? r->secret_source : ""; }

refit_status_t refit_registry_open(const char *url, const char *job, refit_registry_t **out)
{
    return refit_registry_open_auth(url, job, NULL, out);
}

refit_status_t refit_registry_open_auth(const char *url, const char *job, const refit_registry_auth_t *auth,
                                        refit_registry_t **out)
{
    if (!url || !out) return refit_error(REFIT_ERR_INVALID_ARG, "registry open: NULL url or out");
    if (!job || !name_ok(job, 64, NULL))
        return refit_error(REFIT_ERR_INVALID_ARG, "registry open %s: job name \"%.80s\" must be 1..64 of [A-Za-z0-9._-], not starting with '.'",
                           url, job ? job : "(null)");
    const char *colon = strchr(url, ':');
    if (!colon || colon == url)
        return refit_error(REFIT_ERR_INVALID_ARG, "registry url \"%s\": want file:DIR or redis://HOST:PORT", url);
    size_t slen = (size_t)(colon - url);
    const char *rest = colon + 1;

    const refit_kv_ops_t *ops = NULL;
    if (slen == 4 && memcmp(url, "file", 4) == 0) {
        ops = &refit_kv_file_ops;
    } else if (slen == 5 && memcmp(url, "redis", 5) == 0) {
#ifdef REFIT_HAVE_REDIS
        ops = &refit_kv_redis_ops;
#else
        return refit_error(REFIT_ERR_UNSUPPORTED, "registry url \"%s\": refit was built without hiredis", url);
#endif
    } else {
        return refit_error(REFIT_ERR_UNSUPPORTED, "registry url \"%s\": unknown scheme \"%.*s\" (file, redis)", url,
                           (int)REFIT_MIN(slen, 32), url);
    }
    if (!*rest) return refit_error(REFIT_ERR_INVALID_ARG, "registry url \"%s\": nothing after the scheme", url);

    refit_registry_t *r = calloc(1, sizeof(*r));
    if (!r) return refit_error(REFIT_ERR_NO_MEMORY, "registry open %s", url);
    r->ops = ops;
    r->url = refit_redact_url(url);
    refit_status_t st = REFIT_OK;
    if (!r->url) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "registry open %s", url);
        goto free_registry;
    }
    st = ops->open(rest, job, &r->kv);
    if (st) goto free_url;
    if ((st = derive_keys(r, job, auth))) goto close_kv;
    *out = r;
    return REFIT_OK;

close_kv:
    ops->close(r->kv);
free_url:
    free(r->url);
free_registry:
    refit_wipe(r, sizeof(*r));
    free(r);
    return st;
}

void refit_registry_close(refit_registry_t *r)
{
    if (!r) return;
    r->ops->close(r->kv);
    free(r->url);
    refit_wipe(r, sizeof(*r));
    free(r);
}

const char *refit_registry_url(const refit_registry_t *r) { return r ? r->url : NULL; }

/* ---- authenticated access to the backend -------------------------------- */

static void tag_of(const refit_registry_t *r, const char *key, const void *val, size_t len, uint8_t tag[TAG_LEN])
{
    refit_hmac_t h;
    uint8_t klen[2];
    size_t kl = strlen(key);
    refit_put_le(klen, kl, 2);
    refit_hmac_init(&h, r->reg_key, sizeof(r->reg_key));
    refit_hmac_update(&h, klen, 2);
    refit_hmac_update(&h, key, kl);
    refit_hmac_update(&h, val, len);
    refit_hmac_final(&h, tag);
}

/* Stores value || tag (put, or put_new when nx). */
static refit_status_t kv_put(refit_registry_t *r, const char *key, const void *val, size_t len, uint32_t ttl_ms,
                             bool nx)
{
    uint8_t small[256], *buf = len + TAG_LEN <= sizeof(small) ? small : malloc(len + TAG_LEN);
    if (!buf) return refit_error(REFIT_ERR_NO_MEMORY, "registry: %zu-byte value for %s", len, key);
    if (len) memcpy(buf, val, len);
    tag_of(r, key, val, len, buf + len);
    refit_status_t st = nx ? r->ops->put_new(r->kv, key, buf, len + TAG_LEN, ttl_ms)
                           : r->ops->put(r->kv, key, buf, len + TAG_LEN, ttl_ms);
    if (buf != small) free(buf);
    return st;
}

refit_status_t refit_registry_put_signed(refit_registry_t *r, const char *key, const void *val, size_t len,
                                         uint32_t ttl_ms)
{
    if (!r || !key || (!val && len)) return refit_error(REFIT_ERR_INVALID_ARG, "registry put_signed: NULL argument");
    return kv_put(r, key, val ? val : "", len, ttl_ms, false);
}

/* get_many, checking and stripping every tag.  A value whose tag is wrong
 * (written without this job's secret, or under another key) fails the call
 * with REFIT_ERR_AUTH, or, when forged != NULL, is logged, reported absent
 * and flagged there (listings that only count). */
static refit_status_t kv_get_many(refit_registry_t *r, const char *const *keys, size_t n, void **vals, size_t *lens,
                                  uint8_t *forged)
{
    refit_status_t st = r->ops->get_many(r->kv, keys, n, vals, lens);
    if (st) return st;
    for (size_t i = 0; i < n; i++) {
        if (forged) forged[i] = 0;
        if (!vals[i]) continue;
        uint8_t tag[TAG_LEN];
        bool ok = lens[i] >= TAG_LEN;
        if (ok) {
            tag_of(r, keys[i], vals[i], lens[i] - TAG_LEN, tag);
            ok = refit_ct_equal(tag, (uint8_t *)vals[i] + lens[i] - TAG_LEN, TAG_LEN);
        }
        if (ok) {
            lens[i] -= TAG_LEN;
            continue;
        }
        refit_status_t e = refit_error(REFIT_ERR_AUTH,
                                       "registry %s: key %s is not signed with this job's secret (%s): written by "
                                       "someone without it, or under another key",
                                       r->url, keys[i], r->secret_source);
        if (forged) {
            refit_log(REFIT_LOG_WARN, "%s; ignored", refit_last_error());
            forged[i] = 1;
            free(vals[i]);
            vals[i] = NULL;
            lens[i] = 0;
            continue;
        }
        for (size_t k = 0; k < n; k++) {
            free(vals[k]);
            vals[k] = NULL;
        }
        return e;
    }
    return REFIT_OK;
}

/* One key: *val malloc'ed or NULL when absent. */
static refit_status_t get_one(refit_registry_t *r, const char *key, void **val, size_t *len)
{
    const char *keys[1] = {key};
    void *vals[1] = {NULL};
    size_t lens[1] = {0};
    refit_status_t st = kv_get_many(r, keys, 1, vals, lens, NULL);
    if (st) return st;
    *val = vals[0];
    *len = lens[0];
    return REFIT_OK;
}

static refit_status_t is_present(refit_registry_t *r, const char *key, bool *present)
{
    void *val = NULL;
    size_t len = 0;
    refit_status_t st = get_one(r, key, &val, &len);
    if (st) return st;
    *present = val != NULL;
    free(val);
    return REFIT_OK;
}

static refit_status_t check_world(uint32_t world, const void *out)
{
    if (!out) return refit_error(REFIT_ERR_INVALID_ARG, "registry: NULL output array");
    if (world > MAX_WORLD) return refit_error(REFIT_ERR_INVALID_ARG, "registry: world %u above %u", world, MAX_WORLD);
    return REFIT_OK;
}

/* Fetches the key <group>/src/<k>/<what> of every rank k < world in one
 * get_many.  vals[k] malloc'ed or NULL; free with free_many. */
static refit_status_t get_ranks(refit_registry_t *r, const char *group, uint32_t world, const char *what,
                                char **keybuf, void ***vals, size_t **lens)
{
    char *kb = malloc((size_t)world * KEY_MAX);
    const char **keys = malloc((size_t)world * sizeof(*keys));
    void **v = calloc(world, sizeof(*v));
    size_t *l = calloc(world, sizeof(*l));
    refit_status_t st = REFIT_OK;
    if (!kb || !keys || !v || !l) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "registry: key arrays for world %u", world);
        goto free_arrays;
    }
    for (uint32_t k = 0; k < world; k++) {
        src_key(kb + (size_t)k * KEY_MAX, group, k, what);
        keys[k] = kb + (size_t)k * KEY_MAX;
    }
    st = kv_get_many(r, keys, world, v, l, NULL);
    if (st) goto free_arrays;
    free(keys);
    *keybuf = kb;
    *vals = v;
    *lens = l;
    return REFIT_OK;

free_arrays:
    free(l);
    free(v);
    free(keys);
    free(kb);
    return st;
}

static void free_many(char *keybuf, void **vals, size_t *lens, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++) free(vals[k]);
    free(vals);
    free(lens);
    free(keybuf);
}

/* ---- sources ------------------------------------------------------------ */

refit_status_t refit_registry_put_manifest(refit_registry_t *r, const char *group, uint32_t rank, const void *buf,
                                           size_t len)
{
    refit_status_t st = check_group(group);
    if (st) return st;
    if (!buf || len == 0) return refit_error(REFIT_ERR_INVALID_ARG, "registry put_manifest %s/%u: empty", group, rank);
    char key[KEY_MAX];
    src_key(key, group, rank, "manifest");
    return kv_put(r, key, buf, len, 0, false);
}

refit_status_t refit_registry_get_manifest(refit_registry_t *r, const char *group, uint32_t rank, void **buf,
                                           size_t *len)
{
    refit_status_t st = check_group(group);
    if (st) return st;
    if (!buf || !len) return refit_error(REFIT_ERR_INVALID_ARG, "registry get_manifest: NULL output");
    char key[KEY_MAX];
    src_key(key, group, rank, "manifest");
    void *val = NULL;
    size_t n = 0;
    st = get_one(r, key, &val, &n);
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
    refit_status_t st = check_group(group);
    if (st) return st;
    if (!info || ttl_ms == 0)
        return refit_error(REFIT_ERR_INVALID_ARG, "registry heartbeat %s/%u: NULL info or zero ttl", group, rank);
    size_t host_len = strnlen(info->host, sizeof(info->host));
    if (host_len == sizeof(info->host))
        return refit_error(REFIT_ERR_INVALID_ARG, "registry heartbeat %s/%u: host not NUL-terminated", group, rank);
    uint8_t val[HB_SIZE];
    encode_heartbeat(val, info, host_len);
    char key[KEY_MAX];
    src_key(key, group, rank, "hb");
    if (was_absent) {
        bool present = false;
        if ((st = is_present(r, key, &present))) return st;
        *was_absent = !present;
    }
    return kv_put(r, key, val, sizeof(val), ttl_ms, false);
}

refit_status_t refit_registry_alive(refit_registry_t *r, const char *group, uint32_t world, uint8_t *alive,
                                    refit_source_info_t *infos)
{
    refit_status_t st = check_group(group);
    if (!st) st = check_world(world, alive);
    if (st) return st;
    if (world == 0) return REFIT_OK;
    char *keybuf = NULL;
    void **vals = NULL;
    size_t *lens = NULL;
    st = get_ranks(r, group, world, "hb", &keybuf, &vals, &lens);
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
    free_many(keybuf, vals, lens, world);
    return st;
}

refit_status_t refit_registry_remove_source(refit_registry_t *r, const char *group, uint32_t rank)
{
    refit_status_t st = check_group(group);
    if (st) return st;
    /* Heartbeat first: the rank is seen dead before its data disappears. */
    static const char *const what[] = {"hb", "rec", "manifest"};
    for (size_t i = 0; i < REFIT_ARRAY_LEN(what); i++) {
        char key[KEY_MAX];
        src_key(key, group, rank, what[i]);
        st = r->ops->del(r->kv, key);
        if (st) return st;
    }
    return REFIT_OK;
}

/* ---- versions ----------------------------------------------------------- */

refit_status_t refit_registry_publish(refit_registry_t *r, const char *group, uint32_t rank,
                                      const refit_version_record_t *rec)
{
    refit_status_t st = check_group(group);
    if (st) return st;
    if (!rec) return refit_error(REFIT_ERR_INVALID_ARG, "registry publish %s/%u: NULL record", group, rank);
    uint8_t val[REC_SIZE];
    if (rec->version == 0 || rec->version == UINT64_MAX)
        return refit_error(REFIT_ERR_INVALID_ARG, "registry publish %s/%u: version %" PRIu64 " is reserved", group,
                           rank, rec->version);
    encode_record(val, rec);
    char key[KEY_MAX];
    src_key(key, group, rank, "rec");
    return kv_put(r, key, val, sizeof(val), 0, false);
}

refit_status_t refit_registry_heads(refit_registry_t *r, const char *const *groups, uint32_t n,
                                    refit_version_record_t *recs, uint8_t *present, uint8_t *alive)
{
    if (!groups || !recs || !present || !alive || n > 4096)
        return refit_error(REFIT_ERR_INVALID_ARG, "registry heads: bad arguments");
    if (n == 0) return REFIT_OK;
    for (uint32_t i = 0; i < n; i++) {
        refit_status_t st = check_group(groups[i]);
        if (st) return st;
    }
    char *kb = malloc((size_t)n * 2 * KEY_MAX);
    const char **keys = malloc((size_t)n * 2 * sizeof(*keys));
    void **v = calloc((size_t)n * 2, sizeof(*v));
    size_t *l = calloc((size_t)n * 2, sizeof(*l));
    refit_status_t st = REFIT_OK;
    if (!kb || !keys || !v || !l) st = refit_error(REFIT_ERR_NO_MEMORY, "registry heads: %u groups", n);
    for (uint32_t i = 0; i < n && !st; i++) {
        src_key(kb + (size_t)(2 * i) * KEY_MAX, groups[i], 0, "rec");
        src_key(kb + (size_t)(2 * i + 1) * KEY_MAX, groups[i], 0, "hb");
        keys[2 * i] = kb + (size_t)(2 * i) * KEY_MAX;
        keys[2 * i + 1] = kb + (size_t)(2 * i + 1) * KEY_MAX;
    }
    uint8_t *forged = st ? NULL : calloc((size_t)n * 2, 1);
    if (!st && !forged) st = refit_error(REFIT_ERR_NO_MEMORY, "registry heads: %u groups", n);
    if (!st) st = kv_get_many(r, keys, (size_t)n * 2, v, l, forged);
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
    refit_status_t st = check_group(group);
    if (!st) st = check_world(world, present);
    if (!st) st = check_world(world, recs);
    if (st) return st;
    if (world == 0) return REFIT_OK;
    char *keybuf = NULL;
    void **vals = NULL;
    size_t *lens = NULL;
    st = get_ranks(r, group, world, "rec", &keybuf, &vals, &lens);
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
    free_many(keybuf, vals, lens, world);
    return st;
}

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
    refit_status_t st = check_group(group);
    if (st) return st;
    char key[KEY_MAX];
    retired_key(key, group, version);
    return kv_put(r, key, "retired", 7, RETIRED_TTL_MS, false);
}

refit_status_t refit_registry_epoch(refit_registry_t *r, uint64_t *epoch, bool *created)
{
    if (!r || !epoch) return refit_error(REFIT_ERR_INVALID_ARG, "registry epoch: NULL argument");
    for (int tries = 0; tries < 3; tries++) {
        void *val = NULL;
        size_t len = 0;
        refit_status_t st = get_one(r, "epoch", &val, &len);
        if (st) return st;
        if (val) {
            bool ok = len == 8;
            uint64_t e = ok ? refit_get_le(val, 8) : 0;
            free(val);
            if (!ok || e == 0) return refit_error(REFIT_ERR_CORRUPT, "registry %s: key epoch is not an epoch", r->url);
            *epoch = e;
            if (created) *created = false;
            return REFIT_OK;
        }
        uint8_t v[8];
        uint64_t e = 0;
        while (!e)
            if ((st = refit_random_bytes(&e, sizeof(e)))) return st;
        refit_put_le(v, e, 8);
        st = kv_put(r, "epoch", v, sizeof(v), 0, true);
        if (!st) {
            *epoch = e;
            if (created) *created = true;
            return REFIT_OK;
        }
        if (st != REFIT_ERR_BUSY) return st; /* else another process made it first: read it */
    }
    return refit_error(REFIT_ERR_REGISTRY, "registry %s: the epoch key keeps changing", r->url);
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
    refit_status_t st = check_group(group);
    if (!st) st = check_reader(reader);
    if (st) return st;
    if (ttl_ms == 0) return refit_error(REFIT_ERR_INVALID_ARG, "registry lease %s/v/%" PRIu64 ": zero ttl", group, version);
    char rkey[KEY_MAX], lkey[KEY_MAX];
    retired_key(rkey, group, version);
    lease_key(lkey, group, version, reader);

    /* (1) The marker, and whether this is a renewal, in one round trip. */
    const char *keys[2] = {rkey, lkey};
    void *vals[2] = {NULL, NULL};
    size_t lens[2] = {0, 0};
    st = kv_get_many(r, keys, 2, vals, lens, NULL);
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
                           reader, version, group, renewal ? "it holds another token" : "deleted, expired, or the "
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
    st = kv_put(r, lkey, lv, sizeof(lv), ttl_ms, false);
    if (st) return st;
    /* (3) The marker again. */
    st = is_present(r, rkey, &retired);
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

refit_status_t refit_registry_lease_take(refit_registry_t *r, const char *group, uint64_t version,
                                         const char *reader, uint32_t ttl_ms, uint64_t *token)
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

refit_status_t refit_registry_lease_renew(refit_registry_t *r, const char *group, uint64_t version,
                                          const char *reader, uint32_t ttl_ms, uint64_t token)
{
    if (!token) return refit_error(REFIT_ERR_INVALID_ARG, "registry lease_renew: no token");
    return acquire(r, group, version, reader, ttl_ms, token, token);
}

refit_status_t refit_registry_lease_holds(refit_registry_t *r, const char *group, uint64_t version,
                                          const char *reader, uint64_t token)
{
    refit_status_t st = check_group(group);
    if (!st) st = check_reader(reader);
    if (st) return st;
    char lkey[KEY_MAX];
    lease_key(lkey, group, version, reader);
    void *val = NULL;
    size_t len = 0;
    if ((st = get_one(r, lkey, &val, &len))) return st;
    lease_val_t held;
    bool present = val != NULL;
    bool ours = present && decode_lease(val, len, &held) && held.version == version && held.token == token;
    free(val);
    if (!ours)
        return refit_error(REFIT_ERR_STALE,
                           "registry: the lease of reader %s on version %" PRIu64 " of %s was lost during the "
                           "transfer (%s): the publisher may have rewritten its memory, the bytes are not trusted",
                           reader, version, group, present ? "it holds another token" : "deleted, expired, or the "
                           "store lost its data");
    return REFIT_OK;
}

refit_status_t refit_registry_lease_release(refit_registry_t *r, const char *group, uint64_t version,
                                            const char *reader)
{
    refit_status_t st = check_group(group);
    if (!st) st = check_reader(reader);
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
    else if (nk) st = kv_get_many(r, (const char *const *)k, nk, v, l, forged);
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
    refit_status_t st = check_group(group);
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
    refit_status_t st = check_group(group);
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
    refit_status_t st = check_group(group);
    if (!st) st = check_reader(reader);
    if (st) return st;
    if (version == 0 || version == UINT64_MAX)
        return refit_error(REFIT_ERR_INVALID_ARG, "registry ack: version %" PRIu64 " is reserved", version);
    char key[KEY_MAX];
    uint8_t val[8];
    ack_key(key, group, reader);
    refit_put_le(val, version, 8);
    return kv_put(r, key, val, sizeof(val), ACK_TTL_MS, false);
}

refit_status_t refit_registry_acks(refit_registry_t *r, const char *group, uint64_t version, uint32_t *n)
{
    refit_status_t st = check_group(group);
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
            st = refit_error(REFIT_ERR_CORRUPT, "registry: %s holds %zu bytes, not an 8-byte version", keys[i], lens[i]);
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
