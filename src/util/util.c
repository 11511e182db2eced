/* Small helpers: growable arrays, strings, hashing, clocks. */
#include "util/util.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

refit_status_t refit_out_check(size_t size, size_t min, const char *name)
{
    if (size >= min) return REFIT_OK;
    return refit_error(REFIT_ERR_INVALID_ARG,
                       "%s: size is %zu, at least %zu expected (set it to sizeof(%s), e.g. with its _INIT macro)", name,
                       size, min, name);
}

refit_status_t refit_params_in(void *dst, size_t dst_size, const void *params, size_t first, const char *name)
{
    size_t size;
    memcpy(&size, params, sizeof(size));
    if (size < first || size > dst_size)
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "%s: size is %zu, this library takes %zu to %zu (set it to sizeof(%s): start from "
                           "its _INIT macro; a program built against newer headers than this library gives more)",
                           name, size, first, dst_size, name);
    memset(dst, 0, dst_size);
    memcpy(dst, params, size);
    memcpy(dst, &dst_size, sizeof(dst_size));
    return REFIT_OK;
}

int refit_strings_own(const char **const *fields, size_t n, char **block)
{
    size_t total = 1;
    for (size_t i = 0; i < n; i++)
        if (*fields[i]) total += strlen(*fields[i]) + 1;
    char *b = malloc(total), *at = b;
    if (!b) return -1;
    for (size_t i = 0; i < n; i++) {
        if (!*fields[i]) continue;
        size_t len = strlen(*fields[i]) + 1;
        memcpy(at, *fields[i], len);
        *fields[i] = at;
        at += len;
    }
    *block = b;
    return 0;
}

void refit_out_write(void *out, size_t out_size, const void *full, size_t full_size)
{
    size_t n = REFIT_MIN(out_size, full_size);
    size_t skip = sizeof(size_t); /* the caller's size stays */
    if (n > skip) memcpy((char *)out + skip, (const char *)full + skip, n - skip);
}

int refit_vec_grow_(void **data, size_t *cap, size_t elem, size_t need)
{
    if (need <= *cap) return 0;
    size_t ncap = *cap ? *cap : 8;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2) return -1;
        ncap *= 2;
    }
    if (ncap > SIZE_MAX / elem) return -1;
    void *p = realloc(*data, ncap * elem);
    if (!p) return -1;
    *data = p;
    *cap = ncap;
    return 0;
}

char *refit_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

char *refit_asprintf(const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (p) vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return p;
}

char *refit_redact_url(const char *url)
{
    const char *auth = strstr(url, "//");
    const char *at = auth ? strrchr(auth + 2, '@') : NULL; /* a password may hold '@' */
    const char *colon = at ? memchr(auth + 2, ':', (size_t)(at - auth - 2)) : NULL;
    if (!colon) return refit_strdup(url);
    return refit_asprintf("%.*s***%s", (int)(colon + 1 - url), url, at);
}

uint64_t refit_hash64(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t h = refit_mix64(seed ^ (len * 0x9e3779b97f4a7c15ULL));
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ refit_mix64(w)) * 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 29;
        p += 8;
        len -= 8;
    }
    uint64_t tail = 0;
    for (size_t i = 0; i < len; i++) tail |= (uint64_t)p[i] << (8 * i);
    h = (h ^ refit_mix64(tail ^ 0xa0761d6478bd642fULL)) * 0x94d049bb133111ebULL;
    return refit_mix64(h);
}

void refit_hasher_bytes(refit_hasher_t *s, const void *data, size_t len)
{
    refit_hasher_u64(s, refit_hash64(data, len, s->n));
}

uint64_t refit_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

double refit_now(void) { return (double)refit_now_ns() * 1e-9; }

void refit_run_threads(void *(*fn)(void *), void *arg, unsigned threads)
{
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (unsigned)n : 1;
    }
    if (threads > 64) threads = 64;
    pthread_t tid[64];
    unsigned started = 0;
    for (unsigned t = 1; t < threads; t++)
        if (!pthread_create(&tid[started], NULL, fn, arg)) started++;
    fn(arg);
    for (unsigned t = 0; t < started; t++) pthread_join(tid[t], NULL);
}
