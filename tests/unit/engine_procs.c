/* The engine tests' processes and fixtures (engine_procs.h), on tools/common's
 * process harness. */
#include "engine_procs.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "util/util.h"

/* ---- publisher processes, driven line by line over pipes ----------------- */


typedef struct {
    const pubcfg_t *c;
    uint32_t rank;
} pub_arg_t;

static int pub_main(void *arg, int cmd, int resp)
{
    const pubcfg_t *c = ((const pub_arg_t *)arg)->c;
    uint32_t rank = ((const pub_arg_t *)arg)->rank;
    refit_manifest_t *m = t_manifest_named(c->model, c->layout, rank);
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = c->registry;
    pp.job = c->job;
    pp.transports = c->transports;
    pp.transport_options = c->topts;
    pp.mode = c->mode;
    pp.dead_ms = c->dead_ms;
    pp.heartbeat_ms = c->dead_ms ? c->dead_ms / 4 : 0;
    pp.delta = c->delta > 0;
    pp.delta_threads = 2;
    refit_publisher_t *p;
    void *base;
    if (refit_publisher_create(&pp, m, &p)) return 3;
    if (c->attach) {
        base = malloc(refit_manifest_region_size(m, 0));
        if (!base || refit_publisher_attach(p, 0, base)) return 3;
    } else if (refit_publisher_alloc(p, 0, &base)) {
        return 3;
    }
    FILE *in = fdopen(cmd, "r");
    char line[256];
    while (fgets(line, sizeof(line), in)) {
        unsigned long long v = 0, n = 0;
        refit_status_t st = REFIT_OK;
        if (sscanf(line, "publish %llu", &v) == 1) {
            st = c->delta > 0 ? refit_truth_fill_delta(m, &base, v, c->delta) : refit_truth_fill(m, &base, v);
            if (!st) st = refit_publisher_publish(p, v);
            refit_publish_delta_t d = REFIT_PUBLISH_DELTA_INIT;
            if (!st && c->delta > 0 && !(st = refit_publisher_last_delta(p, &d)) && d.version != v)
                st = refit_error(REFIT_ERR_INTERNAL, "last delta is of version %llu", (unsigned long long)d.version);
            if (!st && c->delta > 0) { /* what it offered, for the test to check */
                char out[128];
                int len = snprintf(out, sizeof(out), "REFIT_OK base=%llu bytes=%llu of=%llu table=%s\n",
                                   (unsigned long long)d.base_version, (unsigned long long)d.bytes,
                                   (unsigned long long)d.region_bytes, d.table_from_delta ? "delta" : "pass");
                if (write(resp, out, (size_t)len) != len) return 4;
                continue;
            }
        } else if (sscanf(line, "scribble %llu", &v) == 1) {
            st = refit_truth_fill(m, &base, v); /* overwrite memory without publishing */
        } else if (sscanf(line, "wait %llu %llu", &v, &n) == 2) {
            st = refit_publisher_wait_readers(p, v, (int)n);
        } else if (!strncmp(line, "quit", 4)) {
            break;
        }
        char out[600];
        int len = snprintf(out, sizeof(out), "%s %s\n", refit_status_name(st), st ? refit_last_error() : "");
        if (write(resp, out, (size_t)len) != len) return 4;
    }
    refit_publisher_destroy(p);
    return 0;
}

pub_t pub_start(const pubcfg_t *c, uint32_t rank)
{
    pub_arg_t arg = {c, rank};
    pub_t p;
    assert_int_equal(tool_proc_fork(&p, pub_main, &arg, true), 0);
    return p;
}

/* Sends a command; returns the status name the child answered (bounded: 30 s). */
const char *pub_cmd(pub_t *p, const char *fmt, ...)
{
    char cmd[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    cmd[n++] = '\n';
    assert_int_equal(write(p->to_child, cmd, (size_t)n), n);
    return pub_read(p);
}

/* The next answer line of a publisher (bounded: 30 s). */
const char *pub_read(pub_t *p)
{
    static char reply[600];
    return tool_proc_line(p, 30000, reply, sizeof(reply));
}


/* Asks the publisher to quit (killed after 10 s); reaps it, closes its pipes. */
void pub_stop(pub_t *p) { tool_proc_stop(p, "quit\n", 5, false, 10.0); }

void pub_kill(pub_t *p) { tool_proc_stop(p, NULL, 0, true, 10.0); }

/* ---- helper processes that act at a time ---------------------------------- */

typedef struct {
    pid_t victim;
    int after_ms;
} killer_arg_t;

static int killer_main(void *arg, int in, int out)
{
    (void)in, (void)out;
    const killer_arg_t *k = arg;
    t_msleep(k->after_ms);
    kill(k->victim, SIGKILL);
    return 0;
}

/* A child that SIGKILLs `victim` after_ms from now; reap it with killer_done. */
tool_proc_t kill_after(pid_t victim, int after_ms)
{
    killer_arg_t arg = {victim, after_ms};
    tool_proc_t k;
    assert_int_equal(tool_proc_fork(&k, killer_main, &arg, true), 0);
    return k;
}

/* Waits (<= 10 s) for a kill_after child to have done its kill and ended. */
void killer_done(tool_proc_t *k) { tool_proc_wait(k, 10.0); }

/* ---- fixtures ------------------------------------------------------------- */


void reg_file(reg_t *g)
{
    static int seq;
    snprintf(g->dir, sizeof(g->dir), "/tmp/refit-engine-XXXXXX");
    assert_non_null(mkdtemp(g->dir));
    snprintf(g->url, sizeof(g->url), "file:%s", g->dir);
    snprintf(g->job, sizeof(g->job), "job%d-%d", (int)getpid(), ++seq);
}

refit_receiver_t *receiver(const char *model, const char *layout, uint32_t rank, const reg_t *g, const char *transports,
                           uint32_t lease_ms, void **base)
{
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g->url;
    rp.job = g->job;
    rp.transports = transports;
    rp.verify = REFIT_VERIFY_TRUTH;
    rp.lease_ms = lease_ms;
    rp.threads = 2;
    rp.chunk_kb = 16; /* many chunks even for tiny models: holders share and steal */
    refit_receiver_t *r;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(model, layout, rank), &r));
    REFIT_ASSERT_OK(refit_receiver_alloc(r, 0, base));
    return r;
}

/* Independent proof: the receiver memory equals the truth of version v. */
void expect_truth(const char *model, const char *layout, uint32_t rank, void *base, uint64_t v)
{
    refit_manifest_t *m = t_manifest_named(model, layout, rank);
    REFIT_ASSERT_OK(refit_truth_verify(m, (const void *const *)&base, v, NULL));
    refit_manifest_destroy(m);
}

/* ---- relays: receivers in child processes that serve what they pulled ---- */


refit_receiver_t *relay_receiver(const relay_arg_t *x, void **base)
{
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = x->g->url;
    rp.job = x->g->job;
    rp.transports = "shm";
    rp.verify = REFIT_VERIFY_TRUTH;
    rp.threads = 1;
    rp.chunk_kb = 16;
    rp.relay_slot = x->slot;
    rp.max_readers = x->max_readers;
    rp.relay_heartbeat_ms = 100;
    refit_receiver_t *r;
    if (refit_receiver_create(&rp, t_manifest_named(x->model, x->layout, x->rank), &r)) return NULL;
    if (refit_receiver_alloc(r, 0, base)) {
        refit_receiver_destroy(r);
        return NULL;
    }
    return r;
}

/* Pulls `version` (NEWEST if 0), verifies it against the truth, answers
 * "ok vN HOLDER,... MS" (the holders that served bytes, the pull's
 * milliseconds) or "fail ERROR". */
static refit_status_t relay_pull(const relay_arg_t *x, refit_receiver_t *r, void *base, uint64_t version, int resp)
{
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    double t0 = refit_now();
    refit_status_t st = refit_receiver_pull(r, version ? version : REFIT_VERSION_NEWEST, 10000, &rep);
    if (!st) {
        refit_manifest_t *m = t_manifest_named(x->model, x->layout, x->rank);
        st = refit_truth_verify(m, (const void *const *)&base, rep.version, NULL);
        refit_manifest_destroy(m);
    }
    char out[600];
    int len = snprintf(out, sizeof(out), "fail %s\n", refit_last_error());
    if (!st) {
        refit_holder_stat_t hs[24] = {REFIT_HOLDER_STAT_INIT};
        size_t nh = 0;
        len = snprintf(out, sizeof(out), "ok v%llu ", (unsigned long long)rep.version);
        if (!refit_receiver_holders(r, hs, sizeof(hs) / sizeof(hs[0]), &nh))
            for (size_t i = 0; i < nh && len < 500; i++)
                if (hs[i].bytes) len += snprintf(out + len, sizeof(out) - (size_t)len, "%s,", hs[i].name);
        len += snprintf(out + len, sizeof(out) - (size_t)len, " %.0f\n", (refit_now() - t0) * 1e3);
    }
    return write(resp, out, (size_t)len) == len ? st : REFIT_ERR_IO;
}

static int relay_main(void *arg, int cmd, int resp)
{
    const relay_arg_t *x = arg;
    void *base;
    refit_receiver_t *r = relay_receiver(x, &base);
    if (!r) return 3;
    if (relay_pull(x, r, base, x->version, resp) == REFIT_ERR_IO) return 4;
    char c;
    while (read(cmd, &c, 1) == 1 && c != 'q')
        if (c == 'n' && relay_pull(x, r, base, 0, resp) == REFIT_ERR_IO) return 4;
    refit_receiver_destroy(r);
    return 0;
}

/* A receiver process (relay slot `slot`) that pulls `version` (NEWEST if 0),
 * verifies it, answers "ok"/"fail", then serves until "quit" or its death;
 * relay_pulled waits for its answer. */
relay_t relay_spawn(const reg_t *g, const char *model, const char *layout, uint32_t rank, int slot, uint64_t version,
                    uint32_t max_readers)
{
    relay_arg_t arg = {g, model, layout, rank, max_readers, slot, version};
    relay_t x;
    assert_int_equal(tool_proc_fork(&x, relay_main, &arg, true), 0);
    return x;
}

/* The relay's next answer line (bounded: 15 s) must start with `want`. */
void relay_answer(relay_t *x, char *buf, size_t cap, const char *want)
{
    tool_proc_line(x, 15000, buf, cap);
    if (strncmp(buf, want, strlen(want))) fail_msg("relay pid %d answered \"%s\", want %s", (int)x->pid, buf, want);
}

void relay_pulled(relay_t *x)
{
    char buf[800];
    relay_answer(x, buf, sizeof(buf), "ok");
}

relay_t relay_start(const reg_t *g, const char *model, const char *layout, uint32_t rank, int slot, uint64_t version,
                    uint32_t max_readers)
{
    relay_t x = relay_spawn(g, model, layout, rank, slot, version, max_readers);
    relay_pulled(&x);
    return x;
}

/* Asks the relay to quit, or kills it (killed anyway after 10 s); reaps it. */
void relay_stop(relay_t *x, bool kill_it) { tool_proc_stop(x, "q", 1, kill_it, 10.0); }

const refit_holder_stat_t *holder(const refit_holder_stat_t *hs, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(hs[i].name, name)) return &hs[i];
    return NULL;
}

refit_receiver_t *fleet_receiver(const char *model, const char *layout, uint32_t rank, const reg_t *g,
                                 uint32_t max_readers, void **base)
{
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g->url;
    rp.job = g->job;
    rp.transports = "shm";
    rp.verify = REFIT_VERIFY_TRUTH;
    rp.threads = 1;
    rp.chunk_kb = 16;
    rp.max_readers = max_readers;
    refit_receiver_t *r;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(model, layout, rank), &r));
    REFIT_ASSERT_OK(refit_receiver_alloc(r, 0, base));
    return r;
}