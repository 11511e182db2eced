/* The registry, built once on top of the key-value backend table
 * (registry/backend.h): URL parsing, key layout, value encodings and the
 * lease protocol.  Backends only store bytes under keys.  This file: names, the job's secret,
 * opening and closing, and signed access to the backend; registry_records.c holds the sources' and
 * versions' values, registry_lease.c the leases and acknowledgements.
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
 * Authentication.  Every value goes to the backend as value || tag, tag =
 * HMAC-SHA-256(K_reg, u16 len(key) || key || value) (32 bytes), K_reg derived
 * by HKDF from the job's secret (refit_registry_auth_t) with the job name in
 * the info, so a value is bound to its key and its job: moving a record to
 * another rank's key, or into another job, breaks its tag.  Reads check the
 * tag before anything else (REFIT_ERR_AUTH naming the key); listings that
 * count (leases, acks) skip keys whose values are not authentic.  Replaying
 * an old authentic value under its own key is not prevented by the tag;
 * records only move forward for receivers (they ignore versions they have
 * committed), leases carry a token (fencing, registry_lease.c) and the epoch tells a
 * store that lost its data from one that did not. */
#include "registry/registry.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "refit/manifest.h"
#include "registry/backend.h"
#include "registry/registry_internal.h"
#include "util/crypto.h"

#define MAX_WORLD REFIT_MANIFEST_MAX_WORLD /* the largest world a manifest may have */
#define TAG_LEN REFIT_SHA256_LEN
#define MIN_SECRET 16u
#define MAX_SECRET 4096u

/* ---- names -------------------------------------------------------------- */

static bool name_ok(const char *s, size_t max, const char *extra)
{
    size_t n = 0;
    for (; s[n]; n++) {
        char c = s[n];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                  c == '-' || (extra && strchr(extra, c));
        if (!ok || n >= max) return false;
    }
    return n > 0 && s[0] != '.'; /* never ".", ".." or a hidden name */
}

refit_status_t registry_check_group(const char *group)
{
    if (!group || !name_ok(group, 64, NULL))
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "registry: group name \"%.80s\" must be 1..64 of [A-Za-z0-9._-], not starting with '.'",
                           group ? group : "(null)");
    return REFIT_OK;
}

refit_status_t registry_check_reader(const char *reader)
{
    if (!reader || !name_ok(reader, 128, ":@"))
        return refit_error(REFIT_ERR_INVALID_ARG, "registry: reader name \"%.140s\" must be 1..128 of [A-Za-z0-9._:@-]",
                           reader ? reader : "(null)");
    return REFIT_OK;
}

void registry_src_key(char *key, const char *group, uint32_t rank, const char *what)
{
    snprintf(key, KEY_MAX, "%s/src/%" PRIu32 "/%s", group, rank, what);
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
    if (!st && n != (ssize_t)sb.st_size) st = refit_error(REFIT_ERR_AUTH, "secret file %s: short read", path);
    close(fd);
    if (!st) *len = (size_t)n;
    return st;
}

/* $REFIT_SECRET, read once into the process's copy and taken out of the
 * environment: a core dump or /proc/PID/environ no longer shows it, and a
 * later open in this process (tests and tools open several registries)
 * still finds it.  The environment keeps the bytes of a variable that was
 * there at exec (the initial block /proc/PID/environ shows) or of a setenv
 * (glibc never frees those), so they are overwritten before unsetenv.  A
 * later setenv of another secret replaces the copy at the next open.
 * Children exec'ed after that no longer inherit the variable: give them
 * REFIT_SECRET_FILE (what refit demo does for its children). */
typedef struct {
    size_t len;
    uint8_t bytes[MAX_SECRET];
} env_secret_t;

static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_env_lock = PTHREAD_MUTEX_INITIALIZER;
static env_secret_t *g_env; /* NULL: out of memory at the first open */

static void env_secret_init(void) { g_env = refit_secret_alloc(sizeof(*g_env)); }

/* Copies the process's copy of $REFIT_SECRET (taking it from the
 * environment first, if it is set there) into out; *len 0 when there is none. */
static refit_status_t env_secret(uint8_t *out, size_t *len)
{
    pthread_once(&g_env_once, env_secret_init);
    if (!g_env) return refit_error(REFIT_ERR_NO_MEMORY, "registry: a page for the secret");
    refit_status_t st = REFIT_OK;
    pthread_mutex_lock(&g_env_lock);
    char *env = refit_env(REFIT_ENV_SECRET);
    if (env && env[0]) {
        size_t n = strlen(env);
        if (n < MIN_SECRET || n > MAX_SECRET) {
            st = refit_error(REFIT_ERR_AUTH, "$REFIT_SECRET holds %zu characters; want %u..%u", n, MIN_SECRET,
                             MAX_SECRET);
            goto unlock;
        }
        memcpy(g_env->bytes, env, n);
        g_env->len = n;
        refit_wipe(env, n);
        unsetenv("REFIT_SECRET");
    }
    memcpy(out, g_env->bytes, g_env->len);
    *len = g_env->len;
unlock:
    pthread_mutex_unlock(&g_env_lock);
    return st;
}

void refit_registry_forget_env_secret(void)
{
    pthread_once(&g_env_once, env_secret_init);
    pthread_mutex_lock(&g_env_lock);
    if (g_env) refit_wipe(g_env, sizeof(*g_env));
    pthread_mutex_unlock(&g_env_lock);
}

/* Finds the secret (refit_registry_auth_t's order) and derives the keys
 * into r->k.  The secret passes through a page that core dumps leave out. */
static refit_status_t derive_keys(refit_registry_t *r, const char *job, const refit_registry_auth_t *auth)
{
    uint8_t *secret = refit_secret_alloc(MAX_SECRET);
    r->k = refit_secret_alloc(sizeof(*r->k));
    if (!secret || !r->k) {
        refit_secret_free(secret, MAX_SECRET);
        return refit_error(REFIT_ERR_NO_MEMORY, "registry: pages for the keys");
    }
    size_t len = 0;
    refit_status_t st = REFIT_OK;
    const char *file = auth && auth->secret_file && auth->secret_file[0] ? auth->secret_file
                                                                         : refit_env(REFIT_ENV_SECRET_FILE);
    const char *insecure_env = refit_env(REFIT_ENV_INSECURE);
    bool insecure = (auth && auth->insecure) || (insecure_env && strcmp(insecure_env, "1") == 0);
    if (file && file[0]) {
        if ((st = read_secret_file(file, secret, &len))) goto wipe;
        snprintf(r->secret_source, sizeof(r->secret_source), "file %.140s", file);
    } else if ((st = env_secret(secret, &len))) {
        goto wipe;
    } else if (len) {
        snprintf(r->secret_source, sizeof(r->secret_source), "$REFIT_SECRET");
    } else if (insecure) {
        static bool warned;
        if (!warned)
            refit_log(REFIT_LOG_WARN,
                      "job %s runs without a secret (insecure): registry entries and "
                      "connections are not authenticated",
                      job);
        warned = true;
        len = 0;
        snprintf(r->secret_source, sizeof(r->secret_source), "insecure");
    } else if (r->ops->job_secret) {
        if ((st = r->ops->job_secret(r->kv, secret))) goto wipe;
        len = 32;
        snprintf(r->secret_source, sizeof(r->secret_source), "job directory");
    } else {
        st = refit_error(REFIT_ERR_AUTH,
                         "registry %s: no secret for job %s: set REFIT_SECRET_FILE to a file of at least %u random "
                         "bytes (mode 0600) shared by the job's processes (or REFIT_SECRET, or the secret_file "
                         "parameter); REFIT_INSECURE=1 runs without authentication",
                         r->url, job, MIN_SECRET);
        goto wipe;
    }
    r->secure = !insecure || len > 0;
    static const char salt[] = "refit secret v1";
    char info[128];
    static const char *const uses[] = {"registry", "connection", "digest"};
    for (int i = 0; i < 3; i++) {
        int n = snprintf(info, sizeof(info), "%s key for job %s", uses[i], job);
        refit_hkdf(salt, sizeof(salt) - 1, secret, len, info, (size_t)n, i == 0 ? r->k->reg_key : r->k->keys[i - 1],
                   32);
    }
wipe:
    refit_secret_free(secret, MAX_SECRET);
    return st;
}

const uint8_t *refit_registry_key(const refit_registry_t *r, refit_key_use_t use)
{
    return r && (unsigned)use < 2 ? r->k->keys[use] : NULL;
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
    if (!url[0]) /* refit_default_registry() with nowhere private to put it */
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "no registry named, and none by default: REFIT_REGISTRY, XDG_RUNTIME_DIR and HOME are unset "
                           "and this user has no home directory in the passwd database; name one (--registry "
                           "file:DIR or redis://..., REFIT_REGISTRY) or set HOME (refit does not fall back to a "
                           "directory under /tmp, which another local user could create first)");
    if (!job || !name_ok(job, 64, NULL))
        return refit_error(
            REFIT_ERR_INVALID_ARG,
            "registry open %s: job name \"%.80s\" must be 1..64 of [A-Za-z0-9._-], not starting with '.'", url,
            job ? job : "(null)");
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
    refit_secret_free(r->k, sizeof(*r->k));
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
    refit_secret_free(r->k, sizeof(*r->k));
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
    refit_hmac_init(&h, r->k->reg_key, sizeof(r->k->reg_key));
    refit_hmac_update(&h, klen, 2);
    refit_hmac_update(&h, key, kl);
    refit_hmac_update(&h, val, len);
    refit_hmac_final(&h, tag);
}

/* Stores value || tag (put, or put_new when nx). */
refit_status_t registry_kv_put(refit_registry_t *r, const char *key, const void *val, size_t len, uint32_t ttl_ms,
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
    return registry_kv_put(r, key, val ? val : "", len, ttl_ms, false);
}

/* Whether value || tag (len bytes in all) carries this job's tag for key. */
static bool value_authentic(const refit_registry_t *r, const char *key, const void *val, size_t len)
{
    uint8_t tag[TAG_LEN];
    if (len < TAG_LEN) return false;
    tag_of(r, key, val, len - TAG_LEN, tag);
    return refit_ct_equal(tag, (const uint8_t *)val + len - TAG_LEN, TAG_LEN);
}

/* get_many, checking and stripping every tag.  A value whose tag is wrong
 * (written without this job's secret, or under another key) fails the call
 * with REFIT_ERR_AUTH, or, when forged != NULL, is logged, reported absent
 * and flagged there (listings that only count). */
refit_status_t registry_kv_get_many(refit_registry_t *r, const char *const *keys, size_t n, void **vals, size_t *lens,
                                    uint8_t *forged)
{
    refit_status_t st = r->ops->get_many(r->kv, keys, n, vals, lens);
    if (st) return st;
    for (size_t i = 0; i < n; i++) {
        if (forged) forged[i] = 0;
        if (!vals[i]) continue;
        if (value_authentic(r, keys[i], vals[i], lens[i])) {
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
refit_status_t registry_get_one(refit_registry_t *r, const char *key, void **val, size_t *len)
{
    const char *keys[1] = {key};
    void *vals[1] = {NULL};
    size_t lens[1] = {0};
    refit_status_t st = registry_kv_get_many(r, keys, 1, vals, lens, NULL);
    if (st) return st;
    *val = vals[0];
    *len = lens[0];
    return REFIT_OK;
}

refit_status_t registry_get_checked(refit_registry_t *r, const char *key, void **val, size_t *len, bool *forged)
{
    const char *keys[1] = {key};
    void *vals[1] = {NULL};
    size_t lens[1] = {0};
    refit_status_t st = r->ops->get_many(r->kv, keys, 1, vals, lens);
    if (st) return st;
    *forged = vals[0] && !value_authentic(r, key, vals[0], lens[0]);
    if (*forged || !vals[0]) {
        free(vals[0]);
        *val = NULL;
        *len = *forged ? lens[0] : 0;
        return REFIT_OK;
    }
    *val = vals[0];
    *len = lens[0] - TAG_LEN;
    return REFIT_OK;
}

refit_status_t registry_is_present(refit_registry_t *r, const char *key, bool *present)
{
    void *val = NULL;
    size_t len = 0;
    refit_status_t st = registry_get_one(r, key, &val, &len);
    if (st) return st;
    *present = val != NULL;
    free(val);
    return REFIT_OK;
}

refit_status_t registry_check_world(uint32_t world, const void *out)
{
    if (!out) return refit_error(REFIT_ERR_INVALID_ARG, "registry: NULL output array");
    if (world > MAX_WORLD) return refit_error(REFIT_ERR_INVALID_ARG, "registry: world %u above %u", world, MAX_WORLD);
    return REFIT_OK;
}

/* Fetches the key <group>/src/<k>/<what> of every rank k < world in one
 * get_many.  vals[k] malloc'ed or NULL; free with free_many. */
refit_status_t registry_get_ranks(refit_registry_t *r, const char *group, uint32_t world, const char *what,
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
        registry_src_key(kb + (size_t)k * KEY_MAX, group, k, what);
        keys[k] = kb + (size_t)k * KEY_MAX;
    }
    st = registry_kv_get_many(r, keys, world, v, l, NULL);
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

void registry_free_many(char *keybuf, void **vals, size_t *lens, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++) free(vals[k]);
    free(vals);
    free(lens);
    free(keybuf);
}
