/* Internal helpers shared by every module: error recording, logging, checked
 * allocation and arithmetic, a growable array, hashing and clocks. */
#ifndef REFIT_UTIL_H
#define REFIT_UTIL_H

#include "refit/status.h"
#include "refit/version.h"
#include "util/env.h" /* refit_env, refit_diag: the environment, read in one place */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define REFIT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define REFIT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define REFIT_MAX(a, b) ((a) > (b) ? (a) : (b))

#if defined(__GNUC__)
#define REFIT_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define REFIT_PRINTF(f, a)
#endif

/* Records the detail of a failure (thread-local) and returns status, so that
 * error paths read `return refit_error(REFIT_ERR_X, "tensor %s ...", name);`. */
refit_status_t refit_error(refit_status_t status, const char *fmt, ...) REFIT_PRINTF(2, 3);
/* Prepends context ("source rank 3: ") to the current detail; returns REFIT_OK. */
refit_status_t refit_error_prefix(const char *fmt, ...) REFIT_PRINTF(1, 2);
void refit_log(refit_log_level_t level, const char *fmt, ...) REFIT_PRINTF(2, 3);

/* Sized outputs (refit/engine.h): `size` is the caller's sizeof of a structure
 * that begins with `size_t size`.  refit_out_check refuses a size below `min`
 * (the end of the structure's first sized version) naming the structure;
 * refit_out_write copies the fields of `full` (the library's whole structure,
 * full_size bytes) that fit in the caller's `out`, leaving out->size alone. */
refit_status_t refit_out_check(size_t size, size_t min, const char *name);
/* The end of a field: a sized output's minimum is the end of the last field of its first sized version. */
#define REFIT_END_OF(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))
void refit_out_write(void *out, size_t out_size, const void *full, size_t full_size);
/* Sized inputs (params, refit/engine.h): copies the caller's structure
 * `params`, whose first field is its `size_t size`, into the library's `dst`
 * (dst_size bytes): the first min(size, dst_size) bytes, zeros after (a field
 * the caller's headers did not have is 0: its default); dst->size becomes
 * dst_size.  REFIT_ERR_INVALID_ARG naming the structure, dst untouched, for a
 * size below `first` (the end of its first layout) or above dst_size.  The one
 * place params are read by size. */
refit_status_t refit_params_in(void *dst, size_t dst_size, const void *params, size_t first, const char *name);
/* Points every non-NULL *fields[i] at a copy of its string in one block (*block: malloc'ed, the caller's to free
 * once the strings are no longer used), so that a params structure's strings may be freed once create returned.
 * -1 when out of memory (nothing changed), else 0. */
int refit_strings_own(const char **const *fields, size_t n, char **block);

/* Checked arithmetic: false on overflow. */
static inline bool refit_mul_u64(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool refit_add_u64(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }

/* Little-endian fixed-width integers of n bytes (n <= 8), for encodings. */
static inline void refit_put_le(uint8_t *p, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint64_t refit_get_le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Growable array of elements of any type:
 *   REFIT_VEC(plan_region_t) v = {0};  REFIT_VEC_PUSH(&v, x) (0 or -1 on OOM) */
#define REFIT_VEC(type)  \
    struct {             \
        type *data;      \
        size_t len, cap; \
    }
int refit_vec_grow_(void **data, size_t *cap, size_t elem, size_t need);
#define REFIT_VEC_RESERVE(v, n) refit_vec_grow_((void **)&(v)->data, &(v)->cap, sizeof(*(v)->data), (n))
#define REFIT_VEC_PUSH(v, x) (REFIT_VEC_RESERVE((v), (v)->len + 1) ? -1 : ((v)->data[(v)->len++] = (x), 0))
#define REFIT_VEC_FREE(v) (free((v)->data), (v)->data = NULL, (v)->len = (v)->cap = 0)

/* strdup that returns NULL on OOM (C11 has none). */
char *refit_strdup(const char *s);
/* snprintf into a fresh heap string; NULL on OOM. */
char *refit_asprintf(const char *fmt, ...) REFIT_PRINTF(1, 2);

/* A copy of a URL with any password ("scheme://user:PASSWORD@host") replaced
 * by "***", for messages; NULL on OOM. */
char *refit_redact_url(const char *url);

/* 64-bit hashing (our own construction: multiply-xorshift over 8-byte words,
 * finalised with a 64-bit avalanche).  Stable across runs and hosts; used for
 * layout signatures, the synthetic truth and checksums, never for security. */
uint64_t refit_hash64(const void *data, size_t len, uint64_t seed);
static inline uint64_t refit_mix64(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dULL;
    x ^= x >> 33;
    return x;
}
/* Incremental hasher for structured data (signatures). */
typedef struct {
    uint64_t h;
    uint64_t n;
} refit_hasher_t;
static inline void refit_hasher_init(refit_hasher_t *s, uint64_t seed)
{
    s->h = refit_mix64(seed ^ 0x5eed);
    s->n = 0;
}
static inline void refit_hasher_u64(refit_hasher_t *s, uint64_t v)
{
    s->h = refit_mix64(s->h ^ refit_mix64(v + 0x9e3779b97f4a7c15ULL * ++s->n));
}
void refit_hasher_bytes(refit_hasher_t *s, const void *data, size_t len);
static inline uint64_t refit_hasher_done(const refit_hasher_t *s) { return refit_mix64(s->h ^ s->n); }

/* Monotonic clock in seconds / nanoseconds: refit_now(), refit_now_ns(),
 * public in refit/version.h. */

/* Runs fn(arg) on `threads` threads at once (0: one per CPU; at most 64),
 * the calling thread among them (fewer when a thread cannot be started),
 * and returns when every one has returned. */
void refit_run_threads(void *(*fn)(void *), void *arg, unsigned threads);

#endif
