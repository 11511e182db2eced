/* The redis backend (hiredis, synchronous API).
 *
 * Keys are "refit:<job>:<key>".  put = SET key val [PX ttl]; put_new = SET
 * NX [PX]; get_many = MGET (one round trip); list = SCAN MATCH prefix*
 * (never KEYS; SCAN may repeat a key, so results are de-duplicated); del =
 * DEL.  Every write is followed (in the same pipeline) by PUBLISH of the key
 * on "refit:<job>:events".
 *
 * Two connections: `cmd` for commands and `sub`, SUBSCRIBEd to the events
 * channel from open() on, so that no change is lost between two waits.
 * Each has its own mutex; a waiter never holds up a command.
 *
 * Bounded time: connects give up after IO_TIMEOUT_MS, and every socket read
 * or write after IO_TIMEOUT_MS (redisSetTimeout).  Host names are resolved
 * by getaddrinfo, which is not bounded by it: use addresses where that
 * matters.
 *
 * Connection loss: a call that hits a connection error frees that context
 * and returns REFIT_ERR_REGISTRY ("redis HOST:PORT: Connection refused");
 * the next call reconnects.  A subscriber that had to reconnect may have
 * missed messages, so that wait() returns at once (a change is reported).
 *
 * Authentication: redis://USER@HOST:PORT or redis://USER:PASSWORD@HOST:PORT
 * (or redis://:PASSWORD@...): every connection sends AUTH [USER] PASSWORD
 * first (Redis 6 ACL users: give the job's user only the keys
 * refit:<job>:* and the channel refit:<job>:events; docs/security.md).  A
 * password not in the URL comes from $REFIT_REDIS_PASSWORD_FILE (a file of
 * ours, not readable by others) or $REFIT_REDIS_PASSWORD.  TLS: hiredis 0.14
 * has none; docs/security.md shows a stunnel client in front (tested).
 *
 * SIGPIPE: hiredis writes with write(2); a write to a closed socket would
 * kill the process.  Commands run with SIGPIPE blocked in the calling thread
 * and a SIGPIPE they raised is consumed before it is unblocked. */
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "registry/backend.h"
#include "util/crypto.h"

#define IO_TIMEOUT_MS 2000
#define DEFAULT_PORT 6379
#define SCAN_COUNT "1000"
#define MAX_SCAN_ROUNDS 1000000
#define MAX_DRAIN 4096

struct refit_kv {
    char *host;
    int port;
    char *user, *password; /* AUTH; NULL: none */
    char *addr;            /* "host:port", for messages */
    char *prefix;          /* "refit:<job>:" */
    size_t prefix_len;
    char *channel; /* "refit:<job>:events" */
    pthread_mutex_t cmd_mu;
    redisContext *cmd;
    pthread_mutex_t sub_mu;
    redisContext *sub;
};

typedef struct {
    int argc;
    const char **argv;
    const size_t *lens;
} cmd_t;

/* ---- SIGPIPE guard ------------------------------------------------------ */

typedef struct {
    sigset_t old;
    bool was_pending;
} sigpipe_guard_t;

static void sigpipe_block(sigpipe_guard_t *g)
{
    sigset_t set, pending;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigemptyset(&pending);
    sigpending(&pending);
    g->was_pending = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

static void sigpipe_unblock(sigpipe_guard_t *g)
{
    if (!g->was_pending) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGPIPE);
        struct timespec zero = {0, 0};
        while (sigtimedwait(&set, NULL, &zero) == SIGPIPE) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* ---- connections -------------------------------------------------------- */

/* Records the error of *c (a connection that failed), frees it, NULLs it. */
static refit_status_t conn_failed(refit_kv_t *kv, redisContext **c, const char *what)
{
    const char *why = (*c && (*c)->errstr[0]) ? (*c)->errstr : "connection error";
    bool timed_out = *c && (*c)->err == REDIS_ERR_IO && strstr(why, "temporarily unavailable");
    refit_status_t st;
    if (timed_out)
        st = refit_error(REFIT_ERR_REGISTRY, "redis %s: %s: no answer within %d ms", kv->addr, what, IO_TIMEOUT_MS);
    else st = refit_error(REFIT_ERR_REGISTRY, "redis %s: %s: %s", kv->addr, what, why);
    if (*c) redisFree(*c);
    *c = NULL;
    return st;
}

static refit_status_t connect_ctx(refit_kv_t *kv, redisContext **out)
{
    struct timeval tv = {IO_TIMEOUT_MS / 1000, (IO_TIMEOUT_MS % 1000) * 1000};
    sigpipe_guard_t g;
    sigpipe_block(&g);
    redisContext *c = redisConnectWithTimeout(kv->host, kv->port, tv);
    sigpipe_unblock(&g);
    if (!c) return refit_error(REFIT_ERR_NO_MEMORY, "redis %s: connection context", kv->addr);
    if (c->err) {
        refit_status_t st = refit_error(REFIT_ERR_REGISTRY, "redis %s: %s", kv->addr, c->errstr);
        redisFree(c);
        return st;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK) {
        refit_status_t st = refit_error(REFIT_ERR_REGISTRY, "redis %s: setting I/O timeout: %s", kv->addr, c->errstr);
        redisFree(c);
        return st;
    }
    if (kv->password) {
        const char *argv[3] = {"AUTH", kv->user ? kv->user : kv->password, kv->password};
        size_t lens[3] = {4, strlen(argv[1]), strlen(kv->password)};
        sigpipe_block(&g);
        redisReply *r = redisCommandArgv(c, kv->user ? 3 : 2, argv, lens);
        sigpipe_unblock(&g);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            refit_status_t st = refit_error(r ? REFIT_ERR_AUTH : REFIT_ERR_REGISTRY, "redis %s: AUTH as %s: %s",
                                            kv->addr, kv->user ? kv->user : "default", r ? r->str : c->errstr);
            if (r) freeReplyObject(r);
            redisFree(c);
            return st;
        }
        freeReplyObject(r);
    }
    *out = c;
    return REFIT_OK;
}

static bool is_string(const redisReply *r, const char *s)
{
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) && r->len == strlen(s) &&
           memcmp(r->str, s, r->len) == 0;
}

/* Connects kv->sub and subscribes it.  Caller holds sub_mu. */
static refit_status_t subscribe(refit_kv_t *kv)
{
    redisContext *c = NULL;
    refit_status_t st = connect_ctx(kv, &c);
    if (st) return st;
    const char *argv[2] = {"SUBSCRIBE", kv->channel};
    size_t lens[2] = {9, strlen(kv->channel)};
    sigpipe_guard_t g;
    sigpipe_block(&g);
    redisReply *r = redisCommandArgv(c, 2, argv, lens);
    sigpipe_unblock(&g);
    if (!r) return conn_failed(kv, &c, "SUBSCRIBE");
    bool ok = r->type == REDIS_REPLY_ARRAY && r->elements == 3 && is_string(r->element[0], "subscribe");
    if (!ok) {
        st = refit_error(REFIT_ERR_REGISTRY, "redis %s: SUBSCRIBE %s: unexpected reply (type %d%s%.*s)", kv->addr,
                         kv->channel, r->type, r->type == REDIS_REPLY_ERROR ? ": " : "",
                         r->type == REDIS_REPLY_ERROR ? (int)REFIT_MIN(r->len, 200) : 0,
                         r->type == REDIS_REPLY_ERROR ? r->str : "");
        freeReplyObject(r);
        redisFree(c);
        return st;
    }
    freeReplyObject(r);
    kv->sub = c;
    return REFIT_OK;
}

/* Sends ncmd commands in one pipeline and reads their replies (replies[i],
 * free with freeReplyObject).  An error reply is REFIT_ERR_REGISTRY; a
 * connection error also drops the connection.  Caller holds cmd_mu. */
static refit_status_t run(refit_kv_t *kv, const char *what, size_t ncmd, const cmd_t *cmds, redisReply **replies)
{
    refit_status_t st = REFIT_OK;
    /* A connection kept from an earlier call may have been closed by a server
     * that restarted since: one fresh connection is tried before failing.
     * Every command refit sends is idempotent (SET, GET, MGET, DEL, SCAN,
     * PUBLISH), so sending it twice is harmless. */
    bool retry = kv->cmd != NULL;
again:
    if (!kv->cmd) {
        st = connect_ctx(kv, &kv->cmd);
        if (st) {
            refit_error_prefix("%s", what);
            return st;
        }
    }
    size_t got = 0;
    sigpipe_guard_t g;
    sigpipe_block(&g);
    for (size_t i = 0; i < ncmd; i++)
        if (redisAppendCommandArgv(kv->cmd, cmds[i].argc, cmds[i].argv, cmds[i].lens) != REDIS_OK) goto conn_error;
    for (; got < ncmd; got++) {
        void *r = NULL;
        if (redisGetReply(kv->cmd, &r) != REDIS_OK || !r) goto conn_error;
        replies[got] = r;
    }
    sigpipe_unblock(&g);
    for (size_t i = 0; i < ncmd && !st; i++)
        if (replies[i]->type == REDIS_REPLY_ERROR)
            st = refit_error(REFIT_ERR_REGISTRY, "redis %s: %s: %.*s", kv->addr, what,
                             (int)REFIT_MIN(replies[i]->len, 300), replies[i]->str);
    if (st) goto free_replies;
    return REFIT_OK;

conn_error:
    /* ...but not after a timeout: a hung server would cost the timeout twice. */
    if (retry && got == 0 && !(kv->cmd->err == REDIS_ERR_IO && strstr(kv->cmd->errstr, "temporarily unavailable"))) {
        sigpipe_unblock(&g);
        redisFree(kv->cmd);
        kv->cmd = NULL;
        retry = false;
        goto again;
    }
    st = conn_failed(kv, &kv->cmd, what);
    sigpipe_unblock(&g);
free_replies:
    for (size_t i = 0; i < got; i++) freeReplyObject(replies[i]);
    return st;
}

static refit_status_t unexpected(refit_kv_t *kv, const char *what, const redisReply *r)
{
    return refit_error(REFIT_ERR_REGISTRY, "redis %s: %s: unexpected reply type %d", kv->addr, what, r->type);
}

/* ---- open / close ------------------------------------------------------- */

static void redis_close(refit_kv_t *kv);

/* "//HOST[:PORT]" or "//[V6ADDR][:PORT]". */
/* A password from the environment: $REFIT_REDIS_PASSWORD_FILE (a regular
 * file of ours that no one else may read; one line) or $REFIT_REDIS_PASSWORD. */
static refit_status_t env_password(refit_kv_t *kv)
{
    const char *file = refit_env(REFIT_ENV_REDIS_PASSWORD_FILE), *pw = refit_env(REFIT_ENV_REDIS_PASSWORD);
    if (file && file[0]) {
        int fd = open(file, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        struct stat sb;
        char buf[1024];
        ssize_t n = -1;
        refit_status_t st = REFIT_OK;
        if (fd < 0 || fstat(fd, &sb) != 0)
            st = refit_error(REFIT_ERR_AUTH, "redis password file %s: %s", file, strerror(errno));
        else if (!S_ISREG(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077))
            st = refit_error(REFIT_ERR_AUTH,
                             "redis password file %s must be a regular file of this user that no one "
                             "else may read (chmod 600)",
                             file);
        else if ((n = read(fd, buf, sizeof(buf) - 1)) <= 0)
            st = refit_error(REFIT_ERR_AUTH, "redis password file %s is empty", file);
        if (fd >= 0) close(fd);
        if (st) return st;
        buf[n] = '\0';
        buf[strcspn(buf, "\r\n")] = '\0';
        kv->password = refit_strdup(buf);
        refit_wipe(buf, sizeof(buf));
    } else if (pw && pw[0]) {
        kv->password = refit_strdup(pw);
    } else {
        return REFIT_OK;
    }
    return kv->password ? REFIT_OK : refit_error(REFIT_ERR_NO_MEMORY, "redis password");
}

static refit_status_t parse_addr(refit_kv_t *kv, const char *rest)
{
    const char *h = rest, *end;
    if (strncmp(h, "//", 2) != 0) goto malformed;
    h += 2;
    /* USER[:PASSWORD]@ or :PASSWORD@; the last '@' ends it (a password may
     * hold '@', a host cannot). */
    const char *at = strrchr(h, '@');
    if (at) {
        const char *colon = memchr(h, ':', (size_t)(at - h));
        size_t ul = colon ? (size_t)(colon - h) : (size_t)(at - h);
        if (ul) {
            kv->user = malloc(ul + 1);
            if (!kv->user) return refit_error(REFIT_ERR_NO_MEMORY, "redis url");
            memcpy(kv->user, h, ul);
            kv->user[ul] = '\0';
        }
        if (colon) {
            size_t pl = (size_t)(at - colon - 1);
            kv->password = malloc(pl + 1);
            if (!kv->password) return refit_error(REFIT_ERR_NO_MEMORY, "redis url");
            memcpy(kv->password, colon + 1, pl);
            kv->password[pl] = '\0';
        }
        h = at + 1;
    }
    if (!kv->password) {
        refit_status_t st = env_password(kv);
        if (st) return st;
    }
    if (kv->user && !kv->password)
        return refit_error(REFIT_ERR_AUTH,
                           "registry url \"redis:%s\": user %s without a password (put it in "
                           "$REFIT_REDIS_PASSWORD_FILE)",
                           kv->addr, kv->user);
    if (*h == '[') {
        h++;
        end = strchr(h, ']');
        if (!end) goto malformed;
        rest = end + 1;
    } else {
        end = h + strcspn(h, ":/?#@");
        rest = end;
    }
    if (end == h || end - h > 255) goto malformed;
    long port = DEFAULT_PORT;
    if (*rest == ':') {
        rest++;
        if (!*rest || strlen(rest) > 5) goto malformed;
        port = 0;
        for (; *rest; rest++) {
            if (*rest < '0' || *rest > '9') goto malformed;
            port = port * 10 + (*rest - '0');
        }
        if (port < 1 || port > 65535) goto malformed;
    } else if (*rest) {
        goto malformed;
    }
    kv->host = malloc((size_t)(end - h) + 1);
    if (!kv->host) return refit_error(REFIT_ERR_NO_MEMORY, "redis url");
    memcpy(kv->host, h, (size_t)(end - h));
    kv->host[end - h] = '\0';
    kv->port = (int)port;
    return REFIT_OK;

malformed:
    return refit_error(REFIT_ERR_INVALID_ARG, "registry url \"redis:%s\": want redis://HOST[:PORT] (port 1..65535)",
                       kv->addr);
}

static refit_status_t redis_open(const char *rest, const char *job, refit_kv_t **out)
{
    refit_kv_t *kv = calloc(1, sizeof(*kv));
    if (!kv) return refit_error(REFIT_ERR_NO_MEMORY, "redis registry");
    pthread_mutex_init(&kv->cmd_mu, NULL);
    pthread_mutex_init(&kv->sub_mu, NULL);
    refit_status_t st = REFIT_OK;
    kv->addr = refit_redact_url(rest); /* for the parse error message */
    if (!kv->addr) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "redis registry");
        goto close_kv;
    }
    st = parse_addr(kv, rest);
    if (st) goto close_kv;
    free(kv->addr);
    kv->addr = strchr(kv->host, ':') ? refit_asprintf("[%s]:%d", kv->host, kv->port)
                                     : refit_asprintf("%s:%d", kv->host, kv->port);
    kv->prefix = refit_asprintf("refit:%s:", job);
    kv->channel = refit_asprintf("refit:%s:events", job);
    if (!kv->addr || !kv->prefix || !kv->channel) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "redis registry");
        goto close_kv;
    }
    kv->prefix_len = strlen(kv->prefix);
    st = connect_ctx(kv, &kv->cmd);
    if (st) goto close_kv;
    st = subscribe(kv);
    if (st) goto close_kv;
    *out = kv;
    return REFIT_OK;

close_kv:
    redis_close(kv);
    return st;
}

static void redis_close(refit_kv_t *kv)
{
    if (!kv) return;
    if (kv->sub) redisFree(kv->sub);
    if (kv->cmd) redisFree(kv->cmd);
    pthread_mutex_destroy(&kv->sub_mu);
    pthread_mutex_destroy(&kv->cmd_mu);
    free(kv->channel);
    free(kv->prefix);
    free(kv->addr);
    free(kv->host);
    free(kv->user);
    if (kv->password) refit_wipe(kv->password, strlen(kv->password));
    free(kv->password);
    free(kv);
}

/* ---- operations --------------------------------------------------------- */

static char *full_key(const refit_kv_t *kv, const char *key) { return refit_asprintf("%s%s", kv->prefix, key); }

/* SET (NX) then PUBLISH; *created false when NX found the key.  put_new
 * publishes only when it created the key. */
static refit_status_t set_key(refit_kv_t *kv, const char *key, const void *val, size_t len, uint32_t ttl_ms, bool nx,
                              bool *created)
{
    char *fk = full_key(kv, key);
    if (!fk) return refit_error(REFIT_ERR_NO_MEMORY, "redis %s: SET %s", kv->addr, key);
    char ttl[16];
    snprintf(ttl, sizeof(ttl), "%u", ttl_ms);
    const char *argv[6] = {"SET", fk, val ? val : "", NULL, NULL, NULL};
    size_t lens[6] = {3, strlen(fk), len, 0, 0, 0};
    int argc = 3;
    if (nx) argv[argc] = "NX", lens[argc++] = 2;
    if (ttl_ms) argv[argc] = "PX", lens[argc++] = 2, argv[argc] = ttl, lens[argc++] = strlen(ttl);
    const char *pargv[3] = {"PUBLISH", kv->channel, key};
    size_t plens[3] = {7, strlen(kv->channel), strlen(key)};
    cmd_t cmds[2] = {{argc, argv, lens}, {3, pargv, plens}};
    redisReply *replies[2] = {NULL, NULL};
    char what[320];
    snprintf(what, sizeof(what), "SET %.300s", key);

    pthread_mutex_lock(&kv->cmd_mu);
    refit_status_t st = run(kv, what, nx ? 1 : 2, cmds, replies);
    if (st) goto unlock;
    if (is_string(replies[0], "OK")) {
        *created = true;
        if (nx) {
            freeReplyObject(replies[0]);
            replies[0] = NULL;
            st = run(kv, "PUBLISH", 1, &cmds[1], &replies[1]);
            if (st) goto unlock;
        }
    } else if (nx && replies[0]->type == REDIS_REPLY_NIL) {
        *created = false;
    } else {
        st = unexpected(kv, what, replies[0]);
    }
    for (size_t i = 0; i < 2; i++)
        if (replies[i]) freeReplyObject(replies[i]);
unlock:
    pthread_mutex_unlock(&kv->cmd_mu);
    free(fk);
    return st;
}

static refit_status_t redis_put(refit_kv_t *kv, const char *key, const void *val, size_t len, uint32_t ttl_ms)
{
    bool created = false;
    return set_key(kv, key, val, len, ttl_ms, false, &created);
}

static refit_status_t redis_put_new(refit_kv_t *kv, const char *key, const void *val, size_t len, uint32_t ttl_ms)
{
    bool created = false;
    refit_status_t st = set_key(kv, key, val, len, ttl_ms, true, &created);
    if (st) return st;
    if (!created) return refit_error(REFIT_ERR_BUSY, "redis %s: key %s%s exists", kv->addr, kv->prefix, key);
    return REFIT_OK;
}

static refit_status_t redis_get_many(refit_kv_t *kv, const char *const *keys, size_t n, void **vals, size_t *lens)
{
    if (n == 0) return REFIT_OK;
    if (n > (size_t)INT32_MAX - 1) return refit_error(REFIT_ERR_INVALID_ARG, "redis %s: MGET of %zu keys", kv->addr, n);
    const char **argv = calloc(n + 1, sizeof(*argv));
    size_t *alens = calloc(n + 1, sizeof(*alens));
    char **fks = calloc(n, sizeof(*fks));
    void **v = calloc(n, sizeof(*v));
    refit_status_t st = REFIT_OK;
    if (!argv || !alens || !fks || !v) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "redis %s: MGET of %zu keys", kv->addr, n);
        goto free_arrays;
    }
    argv[0] = "MGET";
    alens[0] = 4;
    for (size_t i = 0; i < n; i++) {
        fks[i] = full_key(kv, keys[i]);
        if (!fks[i]) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "redis %s: MGET of %zu keys", kv->addr, n);
            goto free_arrays;
        }
        argv[i + 1] = fks[i];
        alens[i + 1] = strlen(fks[i]);
    }
    cmd_t cmd = {(int)(n + 1), argv, alens};
    redisReply *r = NULL;
    pthread_mutex_lock(&kv->cmd_mu);
    st = run(kv, "MGET", 1, &cmd, &r);
    pthread_mutex_unlock(&kv->cmd_mu);
    if (st) goto free_arrays;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != n) {
        st = unexpected(kv, "MGET", r);
        goto free_reply;
    }
    for (size_t i = 0; i < n && !st; i++) {
        const redisReply *e = r->element[i];
        if (e->type == REDIS_REPLY_NIL) continue;
        if (e->type != REDIS_REPLY_STRING) {
            st = unexpected(kv, "MGET", e);
            break;
        }
        v[i] = malloc(e->len ? e->len : 1);
        if (!v[i]) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "redis %s: MGET value of %zu bytes", kv->addr, e->len);
            break;
        }
        memcpy(v[i], e->str, e->len);
    }
    if (!st) {
        for (size_t i = 0; i < n; i++) {
            vals[i] = v[i];
            lens[i] = v[i] ? r->element[i]->len : 0;
        }
    } else {
        for (size_t i = 0; i < n; i++) free(v[i]);
    }
free_reply:
    freeReplyObject(r);
free_arrays:
    for (size_t i = 0; fks && i < n; i++) free(fks[i]);
    free(v);
    free(fks);
    free(alens);
    free(argv);
    return st;
}

static refit_status_t redis_del(refit_kv_t *kv, const char *key)
{
    char *fk = full_key(kv, key);
    if (!fk) return refit_error(REFIT_ERR_NO_MEMORY, "redis %s: DEL %s", kv->addr, key);
    const char *argv[2] = {"DEL", fk};
    size_t lens[2] = {3, strlen(fk)};
    const char *pargv[3] = {"PUBLISH", kv->channel, key};
    size_t plens[3] = {7, strlen(kv->channel), strlen(key)};
    cmd_t cmds[2] = {{2, argv, lens}, {3, pargv, plens}};
    redisReply *replies[2] = {NULL, NULL};
    pthread_mutex_lock(&kv->cmd_mu);
    refit_status_t st = run(kv, "DEL", 2, cmds, replies);
    pthread_mutex_unlock(&kv->cmd_mu);
    if (!st) {
        freeReplyObject(replies[0]);
        freeReplyObject(replies[1]);
    }
    free(fk);
    return st;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static refit_status_t redis_list(refit_kv_t *kv, const char *prefix, char ***keys_out, size_t *n_out)
{
    REFIT_VEC(char *) keys = {0};
    refit_status_t st = REFIT_OK;
    /* MATCH pattern: our prefix with glob characters escaped, then '*'. */
    char *pat = malloc(2 * (kv->prefix_len + strlen(prefix)) + 2);
    if (!pat) return refit_error(REFIT_ERR_NO_MEMORY, "redis %s: SCAN", kv->addr);
    size_t o = 0;
    for (int part = 0; part < 2; part++)
        for (const char *p = part ? prefix : kv->prefix; *p; p++) {
            if (strchr("*?[]\\", *p)) pat[o++] = '\\';
            pat[o++] = *p;
        }
    pat[o++] = '*';
    pat[o] = '\0';

    char cursor[32] = "0";
    pthread_mutex_lock(&kv->cmd_mu);
    for (long round = 0;; round++) {
        if (round >= MAX_SCAN_ROUNDS) {
            st = refit_error(REFIT_ERR_REGISTRY, "redis %s: SCAN did not finish in %d rounds", kv->addr,
                             MAX_SCAN_ROUNDS);
            break;
        }
        const char *argv[6] = {"SCAN", cursor, "MATCH", pat, "COUNT", SCAN_COUNT};
        size_t lens[6] = {4, strlen(cursor), 5, o, 5, strlen(SCAN_COUNT)};
        cmd_t cmd = {6, argv, lens};
        redisReply *r = NULL;
        st = run(kv, "SCAN", 1, &cmd, &r);
        if (st) break;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
            r->element[0]->len == 0 || r->element[0]->len >= sizeof(cursor) ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            st = unexpected(kv, "SCAN", r);
            freeReplyObject(r);
            break;
        }
        memcpy(cursor, r->element[0]->str, r->element[0]->len);
        cursor[r->element[0]->len] = '\0';
        const redisReply *arr = r->element[1];
        for (size_t i = 0; i < arr->elements && !st; i++) {
            const redisReply *e = arr->element[i];
            if (e->type != REDIS_REPLY_STRING || e->len < kv->prefix_len ||
                memcmp(e->str, kv->prefix, kv->prefix_len) != 0 || memchr(e->str, '\0', e->len))
                continue;
            size_t klen = e->len - kv->prefix_len;
            char *k = malloc(klen + 1);
            if (!k || REFIT_VEC_PUSH(&keys, k) != 0) {
                free(k);
                st = refit_error(REFIT_ERR_NO_MEMORY, "redis %s: SCAN", kv->addr);
                break;
            }
            memcpy(k, e->str + kv->prefix_len, klen);
            k[klen] = '\0';
        }
        freeReplyObject(r);
        if (st || strcmp(cursor, "0") == 0) break;
    }
    pthread_mutex_unlock(&kv->cmd_mu);
    free(pat);
    if (st) {
        for (size_t i = 0; i < keys.len; i++) free(keys.data[i]);
        REFIT_VEC_FREE(&keys);
        return st;
    }
    /* SCAN may return a key more than once. */
    if (keys.len > 1) qsort(keys.data, keys.len, sizeof(*keys.data), cmp_str);
    size_t n = 0;
    for (size_t i = 0; i < keys.len; i++) {
        if (n > 0 && strcmp(keys.data[n - 1], keys.data[i]) == 0) free(keys.data[i]);
        else keys.data[n++] = keys.data[i];
    }
    *keys_out = keys.data;
    *n_out = n;
    return REFIT_OK;
}

/* Parses replies already read into sub's buffer; *got set on a message. */
static refit_status_t sub_parse(refit_kv_t *kv, bool *got)
{
    for (;;) {
        void *r = NULL;
        if (redisGetReplyFromReader(kv->sub, &r) != REDIS_OK) return conn_failed(kv, &kv->sub, "events");
        if (!r) return REFIT_OK;
        const redisReply *m = r;
        if (m->type == REDIS_REPLY_ARRAY && m->elements == 3 && is_string(m->element[0], "message")) *got = true;
        freeReplyObject(r);
    }
}

/* Reads what the socket holds into sub's buffer. */
static refit_status_t sub_read(refit_kv_t *kv)
{
    if (redisBufferRead(kv->sub) != REDIS_OK) return conn_failed(kv, &kv->sub, "events");
    return REFIT_OK;
}

static refit_status_t redis_wait(refit_kv_t *kv, int timeout_ms)
{
    uint64_t deadline = refit_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
    refit_status_t st = REFIT_OK;
    pthread_mutex_lock(&kv->sub_mu);
    if (!kv->sub) {
        /* Lost and now back: whatever was published meanwhile is gone, so
         * report a change. */
        st = subscribe(kv);
        goto unlock;
    }
    bool got = false;
    st = sub_parse(kv, &got);
    while (!st && !got) {
        uint64_t now = refit_now_ns();
        if (now >= deadline) {
            st = refit_error(REFIT_ERR_TIMEOUT, "redis %s: no change within %d ms", kv->addr, timeout_ms);
            goto unlock;
        }
        struct pollfd pfd = {.fd = kv->sub->fd, .events = POLLIN};
        int rc = poll(&pfd, 1, (int)((deadline - now + 999999u) / 1000000u));
        if (rc < 0 && errno != EINTR) {
            st = refit_error(REFIT_ERR_REGISTRY, "redis %s: poll: %s", kv->addr, strerror(errno));
            goto unlock;
        }
        if (rc <= 0) continue;
        st = sub_read(kv);
        if (!st) st = sub_parse(kv, &got);
    }
    /* Drain what has already arrived, so that the next wait blocks.  A
     * connection lost meanwhile does not fail this call (it has its change);
     * the next one reconnects and reports a change. */
    for (int i = 0; !st && i < MAX_DRAIN; i++) {
        struct pollfd pfd = {.fd = kv->sub->fd, .events = POLLIN};
        if (poll(&pfd, 1, 0) <= 0) break;
        if (sub_read(kv) != REFIT_OK || sub_parse(kv, &got) != REFIT_OK) break;
    }
unlock:
    pthread_mutex_unlock(&kv->sub_mu);
    return st;
}

const refit_kv_ops_t refit_kv_redis_ops = {
    .scheme = "redis",
    .open = redis_open,
    .close = redis_close,
    .put = redis_put,
    .put_new = redis_put_new,
    .get_many = redis_get_many,
    .del = redis_del,
    .list = redis_list,
    .wait = redis_wait,
};
