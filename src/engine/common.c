/* Shared by publishers and receivers: transport sets, names, defaults. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "engine/engine.h"
#include "util/userdir.h"

static char g_default_registry[4200];
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;

/* A directory only this user writes (util/userdir.h): the per-user runtime
 * directory, the home cache; never a shared one such as /tmp, where another
 * user could create ours first.  "" when there is none: opening it fails,
 * saying what to set (registry.c). */
static void default_registry_init(void)
{
    char dir[4096];
    if (refit_default_registry_dir(dir, sizeof(dir)))
        snprintf(g_default_registry, sizeof(g_default_registry), "file:%.4000s", dir);
    else g_default_registry[0] = '\0';
}

const char *refit_default_registry(void)
{
    const char *env = refit_env(REFIT_ENV_REGISTRY);
    if (env && env[0]) return env;
    pthread_once(&g_default_once, default_registry_init);
    return g_default_registry;
}

const char *refit_registry_url_or_default(const char *url) { return url && url[0] ? url : refit_default_registry(); }

static char *options_for(const char *options, const char *name)
{
    /* "ucx.listen=a,shm.x=y,ucx.require=rdma" -> "listen=a,require=rdma" for ucx */
    size_t nl = strlen(name), cap = options ? strlen(options) + 1 : 1, len = 0;
    char *out = calloc(cap, 1);
    if (!out || !options) return out;
    const char *p = options;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > nl + 1 && strncmp(p, name, nl) == 0 && p[nl] == '.') {
            if (len) out[len++] = ',';
            memcpy(out + len, p + nl + 1, n - nl - 1);
            len += n - nl - 1;
        }
        p += n + (end ? 1 : 0);
    }
    out[len] = '\0';
    return out;
}

refit_status_t refit_tset_open(refit_tset_t *ts, const char *names, const char *options, const uint8_t *key)
{
    refit_status_t st = REFIT_OK;
    memset(ts, 0, sizeof(*ts));
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", names && names[0] ? names : "shm,ucx");
    bool defaulted = !(names && names[0]);
    char *save = NULL;
    for (char *name = strtok_r(buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        const refit_transport_ops_t *ops = refit_transport_find(name);
        if (!ops) {
            if (defaulted) continue; /* a default that is not built in */
            st = refit_error(strcmp(name, "ucx") == 0 || strcmp(name, "cuda_ipc") == 0 ? REFIT_ERR_UNSUPPORTED
                                                                                       : REFIT_ERR_INVALID_ARG,
                             "transport '%s' is not built into this refit (built in: shm%s%s)", name,
                             refit_transport_find("ucx") ? ", ucx" : "",
                             refit_transport_find("cuda_ipc") ? ", cuda_ipc" : "");
            goto err;
        }
        if (ts->n == REFIT_MAX_TRANSPORTS) {
            st = refit_error(REFIT_ERR_INVALID_ARG, "too many transports in '%s'", names);
            goto err;
        }
        char *opt = options_for(options, name);
        if (!opt) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "transport options");
            goto err;
        }
        st = ops->create(opt, &ts->ctx[ts->n]);
        free(opt);
        if (st) goto err;
        if (key && ops->set_key) ops->set_key(ts->ctx[ts->n], key);
        ts->ops[ts->n++] = ops;
    }
    if (ts->n == 0) {
        st = refit_error(REFIT_ERR_INVALID_ARG, "no transport in '%s'", names ? names : "");
        goto err;
    }
    return REFIT_OK;
err:
    refit_tset_close(ts);
    return st;
}

void refit_tset_close(refit_tset_t *ts)
{
    for (uint32_t i = 0; i < ts->n; i++) ts->ops[i]->destroy(ts->ctx[i]);
    memset(ts, 0, sizeof(*ts));
}

void refit_desc_key(char *buf, size_t n, const char *transport, uint32_t region, uint32_t buffer)
{
    snprintf(buf, n, "%s.region.%u.%u", transport, region, buffer);
}

refit_status_t refit_check_name(const char *what, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 100) return refit_error(REFIT_ERR_INVALID_ARG, "%s must have 1..100 characters", what);
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-' || c == ':'))
            return refit_error(REFIT_ERR_INVALID_ARG, "%s '%s' has '%c' (allowed: letters, digits, . _ - :)", what, s,
                               c);
    }
    return REFIT_OK;
}

char *refit_options_for_device(const char *options, int device, uint32_t rank)
{
    const char *o = options ? options : "";
    char dev[48] = "";
    if (device >= 0 && !strstr(o, "cuda_ipc.device=")) snprintf(dev, sizeof(dev), ",cuda_ipc.device=%d", device);
    char *s = refit_asprintf("%s%s,cuda_ipc.rank=%u", o, dev, rank);
    if (s && s[0] == ',') memmove(s, s + 1, strlen(s));
    return s;
}

const char *refit_transports_for_device(const char *names, int device)
{
    if (names && names[0]) return names;
    return device >= 0 ? "cuda_ipc" : names;
}

uint64_t refit_random_u64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != sizeof(v)) v = refit_mix64(refit_now_ns() ^ ((uint64_t)getpid() << 32));
    return v ? v : 1;
}

void refit_hostname(char *buf, size_t n)
{
    if (gethostname(buf, n) != 0) snprintf(buf, n, "unknown");
    buf[n - 1] = '\0';
}
