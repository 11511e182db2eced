/* Planning a fleet: every manifest and every destination rank's plan, with
 * threads (ranks are independent), using the real layouts and planner. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim_internal.h"

typedef struct {
    sim_plans_t *P;
    const refit_layout_t *src, *dst;
    const refit_model_t *model;
    uint32_t next_src, next_dst, next_plan;
    pthread_mutex_t lock;
    refit_status_t st;
    char err[256];
} job_t;

static void job_fail(job_t *J, refit_status_t st)
{
    pthread_mutex_lock(&J->lock);
    if (!J->st) {
        J->st = st;
        snprintf(J->err, sizeof(J->err), "%s", refit_last_error());
    }
    pthread_mutex_unlock(&J->lock);
}

static bool take(job_t *J, uint32_t *counter, uint32_t n, uint32_t *out)
{
    pthread_mutex_lock(&J->lock);
    bool ok = !J->st && *counter < n;
    if (ok) *out = (*counter)++;
    pthread_mutex_unlock(&J->lock);
    return ok;
}

static void *manifest_worker(void *arg)
{
    job_t *J = arg;
    sim_plans_t *P = J->P;
    uint32_t i;
    while (take(J, &J->next_src, P->src_world, &i)) {
        refit_status_t st = refit_layout_manifest(J->src, J->model, i, &P->srcs[i]);
        if (st) job_fail(J, st);
    }
    while (take(J, &J->next_dst, P->ndst, &i)) {
        refit_status_t st = refit_layout_manifest(J->dst, J->model, P->dst_rank[i], &P->dsts[i]);
        if (st) job_fail(J, st);
    }
    return NULL;
}

static void *plan_worker(void *arg)
{
    job_t *J = arg;
    sim_plans_t *P = J->P;
    uint32_t i;
    while (take(J, &J->next_plan, P->ndst, &i)) {
        double t0 = refit_now();
        refit_status_t st = refit_plan_create((const refit_manifest_t *const *)P->srcs, P->src_world, P->dsts[i], NULL,
                                              &P->plans[i]);
        P->plan_ms[i] = (refit_now() - t0) * 1e3;
        if (st) job_fail(J, st);
    }
    return NULL;
}

static unsigned cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

static refit_status_t run_threads(job_t *J, unsigned threads, void *(*fn)(void *))
{
    pthread_t th[256];
    unsigned n = threads ? threads : cpus();
    if (n > 256) n = 256;
    unsigned started = 0;
    for (unsigned t = 1; t < n; t++)
        if (pthread_create(&th[started], NULL, fn, J) == 0) started++;
    fn(J); /* this thread works too */
    for (unsigned t = 0; t < started; t++) pthread_join(th[t], NULL);
    return J->st;
}

refit_status_t sim_plans_build(const char *model_name, const char *src, const char *dst, uint32_t only_rank,
                               unsigned threads, sim_plans_t *P)
{
    memset(P, 0, sizeof(*P));
    refit_status_t st;
    refit_model_t *model = NULL;
    refit_layout_t *ls = NULL, *ld = NULL;
    if ((st = refit_model_open(model_name, &model))) return st;
    if ((st = refit_layout_parse(src, &ls)) || (st = refit_layout_parse(dst, &ld))) goto out;
    P->model_bytes = refit_model_total_bytes(model);
    P->src_world = refit_layout_world(ls);
    P->dst_world = refit_layout_world(ld);
    snprintf(P->src_spec, sizeof(P->src_spec), "%s", refit_layout_string(ls));
    snprintf(P->dst_spec, sizeof(P->dst_spec), "%s", refit_layout_string(ld));
    if (only_rank != UINT32_MAX && only_rank >= P->dst_world) {
        st = refit_error(REFIT_ERR_INVALID_ARG, "rank %u of a %u-rank layout", only_rank, P->dst_world);
        goto out;
    }
    P->ndst = only_rank == UINT32_MAX ? P->dst_world : 1;
    P->srcs = calloc(P->src_world, sizeof(*P->srcs));
    P->mkeys = calloc(P->src_world, sizeof(*P->mkeys));
    P->dsts = calloc(P->ndst, sizeof(*P->dsts));
    P->dst_rank = calloc(P->ndst, sizeof(*P->dst_rank));
    P->plans = calloc(P->ndst, sizeof(*P->plans));
    P->plan_ms = calloc(P->ndst, sizeof(*P->plan_ms));
    if (!P->srcs || !P->mkeys || !P->dsts || !P->dst_rank || !P->plans || !P->plan_ms) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "plans");
        goto out;
    }
    for (uint32_t i = 0; i < P->ndst; i++) P->dst_rank[i] = only_rank == UINT32_MAX ? i : only_rank;
    job_t J;
    memset(&J, 0, sizeof(J));
    J.P = P;
    J.src = ls;
    J.dst = ld;
    J.model = model;
    pthread_mutex_init(&J.lock, NULL);
    P->threads = threads ? threads : cpus();
    double t0 = refit_now();
    st = run_threads(&J, threads, manifest_worker);
    P->manifests_ms = (refit_now() - t0) * 1e3;
    if (!st) {
        t0 = refit_now();
        st = run_threads(&J, threads, plan_worker);
        P->plan_wall_ms = (refit_now() - t0) * 1e3;
    }
    pthread_mutex_destroy(&J.lock);
    if (st) {
        st = refit_error(st, "%s", J.err);
        goto out;
    }
    for (uint32_t k = 0; k < P->src_world; k++) P->mkeys[k] = refit_fleet_mirror_key(P->srcs[k]);
out:
    refit_layout_destroy(ls);
    refit_layout_destroy(ld);
    refit_model_destroy(model);
    if (st) sim_plans_free(P);
    return st;
}

void sim_plans_free(sim_plans_t *P)
{
    for (uint32_t i = 0; P->srcs && i < P->src_world; i++) refit_manifest_destroy(P->srcs[i]);
    for (uint32_t i = 0; P->dsts && i < P->ndst; i++) refit_manifest_destroy(P->dsts[i]);
    for (uint32_t i = 0; P->plans && i < P->ndst; i++) refit_plan_destroy(P->plans[i]);
    free(P->srcs);
    free(P->dsts);
    free(P->plans);
    free(P->plan_ms);
    free(P->mkeys);
    free(P->dst_rank);
    memset(P, 0, sizeof(*P));
}

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
}

refit_status_t sim_plan_scale(const char *model, const char *src, const char *dst, unsigned threads,
                              sim_plan_scale_t *out)
{
    sim_plans_t P;
    refit_status_t st = sim_plans_build(model, src, dst, UINT32_MAX, threads, &P);
    if (st) return st;
    memset(out, 0, sizeof(*out));
    out->src_world = P.src_world;
    out->dst_world = P.dst_world;
    out->manifests_ms = P.manifests_ms;
    out->plan_wall_ms = P.plan_wall_ms;
    out->threads = P.threads;
    uint64_t h = 0x706c616e7363616cULL;
    for (uint32_t i = 0; i < P.ndst; i++) {
        refit_plan_stats_t s = REFIT_PLAN_STATS_INIT;
        refit_plan_stats(P.plans[i], &s);
        if (P.plan_ms[i] > out->plan_ms_max) out->plan_ms_max = P.plan_ms[i];
        out->plan_ms_sum += P.plan_ms[i];
        if (s.bytes_written > out->bytes_max) out->bytes_max = s.bytes_written;
        out->redundant += s.bytes_redundant;
        size_t n;
        const refit_plan_region_t *r = refit_plan_regions(P.plans[i], &n);
        for (size_t k = 0; k < n; k++) {
            h = mix(h, r[k].src);
            h = mix(h, r[k].src_region);
            h = mix(h, r[k].dst_region);
            h = mix(h, r[k].src_offset);
            h = mix(h, r[k].dst_offset);
            h = mix(h, r[k].run);
            for (uint32_t l = 0; l < r[k].nloops; l++)
                h = mix(mix(mix(h, r[k].count[l]), r[k].src_stride[l]), r[k].dst_stride[l]);
        }
    }
    out->digest = h;
    sim_plans_free(&P);
    return REFIT_OK;
}
