/* Shared by the GPU test programs (tests/gpu/test_*.c): self-contained
 * assertions (no cmocka, so that they build on GPU machines without the test
 * libraries) and model/manifest/device-memory helpers.  Include after
 * "transport/cuda/gpu.h", under REFIT_HAVE_CUDA. */
#ifndef REFIT_GPUTEST_H
#define REFIT_GPUTEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "refit/experimental/all.h"

#define FAIL(...)                                              \
    do {                                                       \
        fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                          \
        fprintf(stderr, "\n");                                 \
        exit(1);                                               \
    } while (0)
#define REFIT_ASSERT_OK(expr)                                                                         \
    do {                                                                                              \
        refit_status_t st_ = (expr);                                                                  \
        if (st_ != REFIT_OK) FAIL("%s -> %s: %s", #expr, refit_status_name(st_), refit_last_error()); \
    } while (0)
#define REFIT_ASSERT_ERR(expr, code, needle)                                                              \
    do {                                                                                                  \
        refit_status_t st_ = (expr);                                                                      \
        if (st_ != (code) || !strstr(refit_last_error(), needle))                                         \
            FAIL("%s -> %s (%s), wanted %s with '%s'", #expr, refit_status_name(st_), refit_last_error(), \
                 refit_status_name(code), needle);                                                        \
    } while (0)
#define assert_true(c)                     \
    do {                                   \
        if (!(c)) FAIL("%s is false", #c); \
    } while (0)
#define assert_false(c) assert_true(!(c))
#define assert_int_equal(a, b)                                                         \
    do {                                                                               \
        unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b); \
        if (a_ != b_) FAIL("%s == %llu, expected %s == %llu", #a, a_, #b, b_);         \
    } while (0)
#define assert_memory_equal(a, b, n)                                       \
    do {                                                                   \
        if (memcmp((a), (b), (n))) FAIL("memory differs: %s, %s", #a, #b); \
    } while (0)
#define assert_non_null(p) assert_true((p) != NULL)

static inline refit_model_t *t_model(const char *name)
{
    refit_model_t *m = NULL;
    REFIT_ASSERT_OK(refit_model_builtin(name, &m));
    return m;
}

static inline refit_layout_t *t_layout(const char *spec)
{
    refit_layout_t *l = NULL;
    REFIT_ASSERT_OK(refit_layout_parse(spec, &l));
    return l;
}

static inline refit_manifest_t *t_manifest(const refit_model_t *m, const char *spec, uint32_t rank)
{
    refit_layout_t *l = t_layout(spec);
    refit_manifest_t *man = NULL;
    REFIT_ASSERT_OK(refit_layout_manifest(l, m, rank, &man));
    refit_layout_destroy(l);
    return man;
}

static inline refit_manifest_t *t_manifest_named(const char *model, const char *spec, uint32_t rank)
{
    refit_model_t *m = t_model(model);
    refit_manifest_t *man = t_manifest(m, spec, rank);
    refit_model_destroy(m);
    return man;
}

static inline void *gpu_arena(int dev, refit_manifest_t *m)
{
    void *p = NULL;
    REFIT_ASSERT_OK(refit_gpu_alloc(dev, refit_manifest_region_size(m, 0), &p));
    return p;
}

static inline void *host_copy(const void *dptr, uint64_t n)
{
    void *h = malloc(n ? n : 1);
    REFIT_ASSERT_OK(refit_gpu_copy(h, dptr, n));
    return h;
}

static inline void t_rm_tree(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* A file registry in a fresh directory and a job of its own. */
typedef struct {
    char dir[64], url[96], job[32];
} reg_t;

static inline void reg_file(reg_t *g)
{
    static int seq;
    snprintf(g->dir, sizeof(g->dir), "/tmp/refit-gpu-XXXXXX");
    assert_non_null(mkdtemp(g->dir));
    snprintf(g->url, sizeof(g->url), "file:%s", g->dir);
    snprintf(g->job, sizeof(g->job), "gpu%d-%d", (int)getpid(), ++seq);
}

/* The destination device of the GPU tests (1 with two GPUs, else 0); exits
 * 77 (skipped) where there is no device. */
static inline int gputest_dst_device(void)
{
    int n = refit_gpu_count();
    if (n == 0) {
        printf("SKIP: no CUDA device here (the GPU tests need one)\n");
        exit(77);
    }
    return n > 1 ? 1 : 0;
}

#endif
