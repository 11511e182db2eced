/* In-process plan execution with memcpy.  Regions are cut into tasks of
 * roughly equal bytes (a task is a range of a region's innermost runs, or a
 * slice of one long run) and threads take tasks from a shared counter. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "plan/plan.h"

typedef struct {
    const refit_plan_region_t *r;
    uint64_t begin, end; /* rows (runs) [begin, end), or bytes of the run when nloops == 0 */
} task_t;

typedef struct {
    task_t *tasks;
    size_t ntasks;
    atomic_size_t next;
    const void *const *const *src_bases;
    void *const *dst_bases;
} exec_ctx_t;

static uint64_t region_rows(const refit_plan_region_t *r)
{
    uint64_t n = 1;
    for (uint32_t i = 0; i < r->nloops; i++) n *= r->count[i];
    return n;
}

/* Offsets of row `row` (loop 0 fastest). */
static void row_offsets(const refit_plan_region_t *r, uint64_t row, uint64_t *so, uint64_t *dof)
{
    uint64_t s = r->src_offset, d = r->dst_offset;
    for (uint32_t i = 0; i < r->nloops; i++) {
        uint64_t k = row % r->count[i];
        row /= r->count[i];
        s += k * r->src_stride[i];
        d += k * r->dst_stride[i];
    }
    *so = s;
    *dof = d;
}

static void run_task(const exec_ctx_t *c, const task_t *t)
{
    const refit_plan_region_t *r = t->r;
    unsigned char *dst = c->dst_bases[r->dst_region];
    const unsigned char *src = r->src == REFIT_PLAN_FILL ? NULL : c->src_bases[r->src][r->src_region];
    if (r->nloops == 0) {
        if (src) memcpy(dst + r->dst_offset + t->begin, src + r->src_offset + t->begin, t->end - t->begin);
        else memset(dst + r->dst_offset + t->begin, 0, t->end - t->begin);
        return;
    }
    for (uint64_t row = t->begin; row < t->end; row++) {
        uint64_t so, dof;
        row_offsets(r, row, &so, &dof);
        if (src) memcpy(dst + dof, src + so, r->run);
        else memset(dst + dof, 0, r->run);
    }
}

static void *worker(void *arg)
{
    exec_ctx_t *c = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&c->next, 1);
        if (i >= c->ntasks) break;
        run_task(c, &c->tasks[i]);
    }
    return NULL;
}

/* Cuts regions into tasks of about `chunk` bytes. */
static refit_status_t make_tasks(const refit_plan_region_t *v, size_t n, uint64_t chunk, task_t **tasks, size_t *nt,
                                 size_t *cap)
{
    for (size_t i = 0; i < n; i++) {
        const refit_plan_region_t *r = &v[i];
        uint64_t units, per;
        if (r->nloops == 0) {
            units = r->run;
            per = chunk;
        } else {
            units = region_rows(r);
            per = chunk / r->run ? chunk / r->run : 1;
        }
        for (uint64_t b = 0; b < units; b += per) {
            if (*nt == *cap) {
                size_t ncap = *cap ? *cap * 2 : 256;
                task_t *p = realloc(*tasks, ncap * sizeof(task_t));
                if (!p) return refit_error(REFIT_ERR_NO_MEMORY, "executing a plan");
                *tasks = p;
                *cap = ncap;
            }
            (*tasks)[(*nt)++] = (task_t){r, b, b + per < units ? b + per : units};
        }
    }
    return REFIT_OK;
}

refit_status_t refit_plan_execute_memcpy(const refit_plan_t *plan, const void *const *const *src_bases,
                                         void *const *dst_bases, unsigned threads)
{
    refit_status_t st;
    if (!plan || !dst_bases || (plan->regions.len && !src_bases))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_plan_execute_memcpy: NULL argument");
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (unsigned)n : 1;
    }
    uint64_t total = plan->stats.bytes_written + plan->stats.bytes_fill;
    uint64_t chunk = total / ((uint64_t)threads * 8) + 1;
    if (chunk < (256u << 10)) chunk = 256u << 10;
    if (chunk > (16u << 20)) chunk = 16u << 20;
    exec_ctx_t c = {.src_bases = src_bases, .dst_bases = dst_bases};
    size_t cap = 0;
    if ((st = make_tasks(plan->fills.data, plan->fills.len, chunk, &c.tasks, &c.ntasks, &cap)) ||
        (st = make_tasks(plan->regions.data, plan->regions.len, chunk, &c.tasks, &c.ntasks, &cap))) {
        free(c.tasks);
        return st;
    }
    atomic_init(&c.next, 0);
    if (threads > c.ntasks) threads = c.ntasks ? (unsigned)c.ntasks : 1;
    pthread_t tids[64];
    unsigned started = 0;
    for (unsigned t = 1; t < threads && t < 64; t++)
        if (pthread_create(&tids[started], NULL, worker, &c) == 0) started++;
    worker(&c);
    for (unsigned t = 0; t < started; t++) pthread_join(tids[t], NULL);
    free(c.tasks);
    return REFIT_OK;
}
