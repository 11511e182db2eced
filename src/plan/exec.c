/* Plan execution in this process.  Regions are cut into tasks of roughly
 * equal bytes (a task is a range of a region's innermost runs, a slice of
 * one long run, or small regions next to each other) and threads take tasks
 * from a shared counter.  Copies are
 * memcpy from mapped source memory, or a caller-supplied copy function (e.g.
 * process_vm_readv).  The first failure stops every thread. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "plan/plan.h"

typedef struct {
    const refit_plan_region_t *r;
    uint64_t begin, end; /* rows (runs) [begin, end), or bytes of the run when nloops == 0 */
    uint32_t whole;      /* > 0: the regions r[0, whole), all of each (small ones batched into one task) */
} task_t;

typedef struct {
    task_t *tasks;
    size_t ntasks;
    atomic_size_t next;
    atomic_int failed;
    refit_status_t status; /* first failure (written once, under failed) */
    char detail[512];
    const void *const *const *src_bases;
    void *const *dst_bases;
    const refit_exec_opts_t *o;
} exec_ctx_t;

uint64_t refit_region_rows(const refit_plan_region_t *r)
{
    uint64_t n = 1;
    for (uint32_t i = 0; i < r->nloops; i++) n *= r->count[i];
    return n;
}

void refit_region_row_offsets(const refit_plan_region_t *r, uint64_t row, uint64_t *so, uint64_t *dof)
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

/* A caller's copy (a system call: process_vm_readv) hashed after it is
 * cut into pieces of this size, each hashed right after its copy from the
 * cache, not from memory once the whole run has gone through. */
enum { HASH_PIECE = 256 << 10 };

/* One run: a fill, a copy (hashed on the way when the options carry a
 * digest map: fused with memcpy, or in place right after a caller's copy),
 * `dof` bytes into destination region r->dst_region. */
static refit_status_t copy_bytes(exec_ctx_t *c, const refit_plan_region_t *r, uint64_t so, uint64_t dof, uint64_t len,
                                 uint64_t *hashed)
{
    unsigned char *dst = (unsigned char *)c->dst_bases[r->dst_region] + dof;
    const refit_exec_opts_t *o = c->o;
    if (r->src == REFIT_PLAN_FILL) {
        memset(dst, 0, len);
        return REFIT_OK;
    }
    if (o->copy) { /* the caller's copy; with a digest map, hashed in place a piece at a time, while in cache */
        uint64_t piece = o->dmap ? (uint64_t)HASH_PIECE : len, done = 0;
        do {
            uint64_t n = REFIT_MIN(len - done, piece);
            refit_status_t st = o->copy(o->user, r->src, r->src_region, so + done, dst + done, n);
            if (st) return st;
            if (o->dmap)
                *hashed += refit_digest_map_copy(o->dmap, r->dst_region, dof + done, dst + done, NULL, n, o->dacc);
            done += n;
        } while (done < len);
        return REFIT_OK;
    }
    const unsigned char *src = (const unsigned char *)c->src_bases[r->src][r->src_region] + so;
    if (o->dmap) *hashed += refit_digest_map_copy(o->dmap, r->dst_region, dof, dst, src, len, o->dacc);
    else memcpy(dst, src, len);
    return REFIT_OK;
}

/* Rows [row, row + n) of r's innermost loop (one outer iteration): hashed in one call through the map. */
static void copy_hashed_rows(exec_ctx_t *c, const refit_plan_region_t *r, uint64_t row, uint64_t n, uint64_t *hashed)
{
    uint64_t so, dof;
    refit_region_row_offsets(r, row, &so, &dof);
    unsigned char *dst = (unsigned char *)c->dst_bases[r->dst_region] + dof;
    const unsigned char *src = (const unsigned char *)c->src_bases[r->src][r->src_region] + so;
    *hashed += refit_digest_map_copy_rows(c->o->dmap, r->dst_region, dof, r->dst_stride[0], dst, src, r->src_stride[0],
                                          r->run, n, c->o->dacc);
}

static uint64_t region_units(const refit_plan_region_t *r) { return r->nloops == 0 ? r->run : refit_region_rows(r); }

static refit_status_t run_slice(exec_ctx_t *c, const task_t *t)
{
    const refit_plan_region_t *r = t->r;
    refit_status_t st = REFIT_OK;
    uint64_t hashed = 0;
    if (r->nloops == 0) {
        st = copy_bytes(c, r, r->src_offset + t->begin, r->dst_offset + t->begin, t->end - t->begin, &hashed);
    } else if (c->o->dmap && !c->o->copy && r->src != REFIT_PLAN_FILL) {
        for (uint64_t row = t->begin; row < t->end;) { /* a run of loop 0's rows at a time */
            uint64_t n = REFIT_MIN(r->count[0] - row % r->count[0], t->end - row);
            copy_hashed_rows(c, r, row, n, &hashed);
            row += n;
        }
    } else {
        for (uint64_t row = t->begin; row < t->end && !st; row++) {
            uint64_t so, dof;
            refit_region_row_offsets(r, row, &so, &dof);
            st = copy_bytes(c, r, so, dof, r->run, &hashed);
        }
    }
    if (hashed) __atomic_fetch_add(c->o->dbytes, hashed, __ATOMIC_RELAXED);
    return st;
}

enum { PREFETCH_AHEAD = 32 };

static refit_status_t run_task(exec_ctx_t *c, const task_t *t)
{
    if (!t->whole) return run_slice(c, t);
    refit_status_t st = REFIT_OK;
    for (uint32_t i = 0; i < t->whole && !st; i++) {
        /* A batch is many small regions (a digest fetch: thousands of 8-byte
         * runs, each in a line of its own): their source lines are asked for
         * a few regions ahead, so the misses overlap instead of one per copy. */
        if (!c->o->copy && i + PREFETCH_AHEAD < t->whole) {
            const refit_plan_region_t *a = &t->r[i + PREFETCH_AHEAD];
            if (a->src != REFIT_PLAN_FILL)
                __builtin_prefetch((const unsigned char *)c->src_bases[a->src][a->src_region] + a->src_offset);
        }
        task_t one = {&t->r[i], 0, region_units(&t->r[i]), 0};
        st = run_slice(c, &one);
    }
    return st;
}

static void record_failure(exec_ctx_t *c, refit_status_t st)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&c->failed, &expected, 1)) {
        c->status = st;
        strncpy(c->detail, refit_last_error(), sizeof(c->detail) - 1);
    }
}

static void *worker(void *arg)
{
    exec_ctx_t *c = arg;
    while (!atomic_load(&c->failed)) {
        size_t i = atomic_fetch_add(&c->next, 1);
        if (i >= c->ntasks) break;
        refit_status_t st = run_task(c, &c->tasks[i]);
        if (st) record_failure(c, st);
    }
    return NULL;
}

/* At most this many regions a batch: the deadline and the tick are looked
 * at between tasks, and a region may be a caller's copy (a system call). */
#define BATCH_REGIONS 4096

static refit_status_t push_task(task_t **tasks, size_t *nt, size_t *cap, task_t t)
{
    if (*nt == *cap) {
        size_t ncap = *cap ? *cap * 2 : 256;
        task_t *p = realloc(*tasks, ncap * sizeof(task_t));
        if (!p) return refit_error(REFIT_ERR_NO_MEMORY, "executing a plan");
        *tasks = p;
        *cap = ncap;
    }
    (*tasks)[(*nt)++] = t;
    return REFIT_OK;
}

/* Cuts regions into tasks of about `chunk` bytes; regions next to each
 * other in v that are smaller together than that go as one task (a plan
 * of 40,000 8-byte runs is 40,000 tasks otherwise, each a trip to the
 * shared counter). */
static refit_status_t make_tasks(const refit_plan_region_t *v, size_t n, uint64_t chunk, const uint8_t *only,
                                 task_t **tasks, size_t *nt, size_t *cap)
{
    uint64_t batch_bytes = 0;
    bool batching = false; /* the last task is a batch that the next region may join */
    for (size_t i = 0; i < n; i++) {
        const refit_plan_region_t *r = &v[i];
        if (only && r->src != REFIT_PLAN_FILL && !only[r->src]) {
            batching = false;
            continue;
        }
        uint64_t units = region_units(r), bytes = refit_plan_region_bytes(r), per;
        if (bytes < chunk) {
            if (batching && batch_bytes + bytes <= chunk && (*tasks)[*nt - 1].whole < BATCH_REGIONS) {
                (*tasks)[*nt - 1].whole++;
                batch_bytes += bytes;
                continue;
            }
            refit_status_t st = push_task(tasks, nt, cap, (task_t){r, 0, 0, 1});
            if (st) return st;
            batching = true;
            batch_bytes = bytes;
            continue;
        }
        batching = false;
        per = r->nloops == 0 ? chunk : chunk / r->run ? chunk / r->run : 1;
        for (uint64_t b = 0; b < units; b += per) {
            refit_status_t st = push_task(tasks, nt, cap, (task_t){r, b, b + per < units ? b + per : units, 0});
            if (st) return st;
        }
    }
    return REFIT_OK;
}

refit_status_t refit_plan_execute(const refit_plan_t *plan, const void *const *const *src_bases, void *const *dst_bases,
                                  const refit_exec_opts_t *o)
{
    refit_status_t st;
    if (o->dmap && (!o->dacc || !o->dbytes))
        return refit_error(REFIT_ERR_INVALID_ARG, "plan execution: a digest map without its sums");
    unsigned threads = o->threads;
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (unsigned)n : 1;
    }
    uint64_t total = plan->stats.bytes_written + plan->stats.bytes_fill;
    uint64_t chunk = total / ((uint64_t)threads * 16) + 1;
    if (chunk < (256u << 10)) chunk = 256u << 10;
    if (chunk > (8u << 20)) chunk = 8u << 20;
    exec_ctx_t c = {.src_bases = src_bases, .dst_bases = dst_bases, .o = o};
    size_t cap = 0;
    if ((!o->skip_fills &&
         (st = make_tasks(plan->fills.data, plan->fills.len, chunk, NULL, &c.tasks, &c.ntasks, &cap))) ||
        (st = make_tasks(plan->regions.data, plan->regions.len, chunk, o->only, &c.tasks, &c.ntasks, &cap))) {
        free(c.tasks);
        return st;
    }
    atomic_init(&c.next, 0);
    atomic_init(&c.failed, 0);
    if (threads > c.ntasks) threads = c.ntasks ? (unsigned)c.ntasks : 1;
    pthread_t tids[64];
    unsigned started = 0;
    for (unsigned t = 1; t < threads && t < 64; t++)
        if (pthread_create(&tids[started], NULL, worker, &c) == 0) started++;
    /* The calling thread works too, and between tasks checks the deadline and
     * calls tick. */
    double last_tick = refit_now();
    while (!atomic_load(&c.failed)) {
        double now = refit_now();
        if (o->deadline > 0 && now > o->deadline) {
            record_failure(&c, refit_error(REFIT_ERR_TIMEOUT, "plan execution ran past its deadline"));
            break;
        }
        if (o->tick && now - last_tick > 0.01) {
            last_tick = now;
            refit_status_t ts = o->tick(o->tick_user);
            if (ts) {
                record_failure(&c, ts);
                break;
            }
        }
        size_t i = atomic_fetch_add(&c.next, 1);
        if (i >= c.ntasks) break;
        refit_status_t ts = run_task(&c, &c.tasks[i]);
        if (ts) record_failure(&c, ts);
    }
    for (unsigned t = 0; t < started; t++) pthread_join(tids[t], NULL);
    free(c.tasks);
    if (atomic_load(&c.failed)) return refit_error(c.status, "%s", c.detail);
    return REFIT_OK;
}

refit_status_t refit_plan_execute_memcpy(const refit_plan_t *plan, const void *const *const *src_bases,
                                         void *const *dst_bases, unsigned threads)
{
    if (!plan || !dst_bases || (plan->regions.len && !src_bases))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_plan_execute_memcpy: NULL argument");
    refit_exec_opts_t o = {.threads = threads};
    return refit_plan_execute(plan, src_bases, dst_bases, &o);
}
