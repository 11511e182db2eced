/* Publishers and receivers in separate processes, over the embedded file
 * registry and a real Redis, through shm (and UCX when built): end to end,
 * steady-state caching, in-place and snapshot modes, and faults - each ending
 * in a clear error, never in a reported success, with the receiver's previous
 * version intact or its memory marked unusable. */
#include "testutil.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "refit/fp8.h"
#include "registry/backend.h"
#include "tool_proc.h"
#include "registry/registry.h"
#include "util/util.h"

/* Every child process of these tests runs on tools/common's process harness
 * (tool_proc.h): forked with a pipe each way, dying with the test, its lines
 * read and its end awaited with a bound. */

/* ---- publisher processes, driven line by line over pipes ----------------- */

typedef tool_proc_t pub_t; /* to_child: commands; from_child: one answer line per command */

typedef struct {
    const char *model, *layout, *registry, *job, *transports, *topts;
    refit_publish_mode_t mode;
    uint32_t dead_ms;
    bool attach;  /* the caller's own (not shared) memory: read with process_vm_readv */
    double delta; /* > 0: a delta publisher, its truth changing this share of elements per version */
} pubcfg_t;

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
                int len = snprintf(out, sizeof(out), "REFIT_OK base=%llu bytes=%llu of=%llu\n",
                                   (unsigned long long)d.base_version, (unsigned long long)d.bytes,
                                   (unsigned long long)d.region_bytes);
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

static pub_t pub_start(const pubcfg_t *c, uint32_t rank)
{
    pub_arg_t arg = {c, rank};
    pub_t p;
    assert_int_equal(tool_proc_fork(&p, pub_main, &arg, true), 0);
    return p;
}

static const char *pub_read(pub_t *p);

/* Sends a command; returns the status name the child answered (bounded: 30 s). */
static const char *pub_cmd(pub_t *p, const char *fmt, ...)
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
static const char *pub_read(pub_t *p)
{
    static char reply[600];
    return tool_proc_line(p, 30000, reply, sizeof(reply));
}

#define PUB_OK(p, ...)                                                      \
    do {                                                                    \
        const char *r_ = pub_cmd((p), __VA_ARGS__);                         \
        if (strncmp(r_, "REFIT_OK", 8)) fail_msg("publisher said: %s", r_); \
    } while (0)

/* Asks the publisher to quit (killed after 10 s); reaps it, closes its pipes. */
static void pub_stop(pub_t *p)
{
    tool_proc_stop(p, "quit\n", 5, false, 10.0);
}

static void pub_kill(pub_t *p)
{
    tool_proc_stop(p, NULL, 0, true, 10.0);
}

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
static tool_proc_t kill_after(pid_t victim, int after_ms)
{
    killer_arg_t arg = {victim, after_ms};
    tool_proc_t k;
    assert_int_equal(tool_proc_fork(&k, killer_main, &arg, true), 0);
    return k;
}

/* Waits (<= 10 s) for a kill_after child to have done its kill and ended. */
static void killer_done(tool_proc_t *k)
{
    tool_proc_wait(k, 10.0);
}

/* ---- fixtures ------------------------------------------------------------- */

typedef struct {
    char dir[64];
    char url[96];
    char job[32];
} reg_t;

static void reg_file(reg_t *g)
{
    static int seq;
    snprintf(g->dir, sizeof(g->dir), "/tmp/refit-engine-XXXXXX");
    assert_non_null(mkdtemp(g->dir));
    snprintf(g->url, sizeof(g->url), "file:%s", g->dir);
    snprintf(g->job, sizeof(g->job), "job%d-%d", (int)getpid(), ++seq);
}

static refit_receiver_t *receiver(const char *model, const char *layout, uint32_t rank, const reg_t *g,
                                  const char *transports, uint32_t lease_ms, void **base)
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
static void expect_truth(const char *model, const char *layout, uint32_t rank, void *base, uint64_t v)
{
    refit_manifest_t *m = t_manifest_named(model, layout, rank);
    REFIT_ASSERT_OK(refit_truth_verify(m, (const void *const *)&base, v, NULL));
    refit_manifest_destroy(m);
}

/* ---- relays: receivers in child processes that serve what they pulled ---- */

typedef tool_proc_t relay_t; /* to_child: 'q' (quit), 'n' (pull the newest); from_child: answer lines */

typedef struct {
    const reg_t *g;
    const char *model, *layout;
    uint32_t rank, max_readers;
    int slot;
    uint64_t version;
} relay_arg_t;

static int relay_main(void *arg, int cmd, int resp)
{
    const relay_arg_t *x = arg;
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
    void *base;
    if (refit_receiver_create(&rp, t_manifest_named(x->model, x->layout, x->rank), &r) ||
        refit_receiver_alloc(r, 0, &base))
        return 3;
    refit_status_t st = refit_receiver_pull(r, x->version ? x->version : REFIT_VERSION_NEWEST, 10000, NULL);
    const char *ans = st ? "fail\n" : "ok\n";
    if (write(resp, ans, strlen(ans)) < 0) return 4;
    char c;
    while (read(cmd, &c, 1) == 1 && c != 'q') {
    }
    refit_receiver_destroy(r);
    return 0;
}

/* A receiver process (relay slot `slot`) that pulls `version` (NEWEST if 0),
 * verifies it, answers "ok"/"fail", then serves until "quit" or its death;
 * relay_pulled waits for its answer. */
static relay_t relay_spawn(const reg_t *g, const char *model, const char *layout, uint32_t rank, int slot,
                           uint64_t version, uint32_t max_readers)
{
    relay_arg_t arg = {g, model, layout, rank, max_readers, slot, version};
    relay_t x;
    assert_int_equal(tool_proc_fork(&x, relay_main, &arg, true), 0);
    return x;
}

/* The relay's next answer line (bounded: 15 s) must start with `want`. */
static void relay_answer(relay_t *x, char *buf, size_t cap, const char *want)
{
    tool_proc_line(x, 15000, buf, cap);
    if (strncmp(buf, want, strlen(want))) fail_msg("relay pid %d answered \"%s\", want %s", (int)x->pid, buf, want);
}

static void relay_pulled(relay_t *x)
{
    char buf[800];
    relay_answer(x, buf, sizeof(buf), "ok");
}

static relay_t relay_start(const reg_t *g, const char *model, const char *layout, uint32_t rank, int slot,
                           uint64_t version, uint32_t max_readers)
{
    relay_t x = relay_spawn(g, model, layout, rank, slot, version, max_readers);
    relay_pulled(&x);
    return x;
}

/* Asks the relay to quit, or kills it (killed anyway after 10 s); reaps it. */
static void relay_stop(relay_t *x, bool kill_it)
{
    tool_proc_stop(x, "q", 1, kill_it, 10.0);
}

static const refit_holder_stat_t *holder(const refit_holder_stat_t *hs, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(hs[i].name, name)) return &hs[i];
    return NULL;
}

static refit_receiver_t *fleet_receiver(const char *model, const char *layout, uint32_t rank, const reg_t *g,
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

/* A relay serves a second receiver of its layout; with a reader limit the
 * second one (a joiner: created after the relay finished) reads nothing from
 * the trainer; a joiner that prepared reads no manifest in its pull.  Bytes
 * verified against the truth. */
static void relay_serves_joiner(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    relay_t a = relay_start(&g, "tiny-dense", "vllm:tp=2", 1, 0, 1, 1);
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=2", 1, &g, 1, &b);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, REFIT_VERSION_NEWEST, 10000, &rep));
    assert_int_equal(rep.version, 1);
    expect_truth("tiny-dense", "vllm:tp=2", 1, b, 1);
    /* Fetched from the registry: both trainer ranks' manifests once each
     * (rank 0's, read first to learn the world, is not fetched again) and
     * the relay's. */
    assert_int_equal(rep.manifests_read, 3);
    refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &nh));
    const refit_holder_stat_t *h = holder(hs, nh, "relay:0");
    assert_non_null(h);
    assert_true(h->bytes >= rep.bytes); /* contiguous spans: padding between rows included */
    assert_true(rep.bytes > 0);
    assert_null(holder(hs, nh, "trainer:0"));
    assert_null(holder(hs, nh, "trainer:1"));
    /* Another layout's rank (rank 0) finds no relay of its own and reads the trainer. */
    void *b0;
    refit_receiver_t *r0 = fleet_receiver("tiny-dense", "vllm:tp=2", 0, &g, 1, &b0);
    REFIT_ASSERT_OK(refit_receiver_pull(r0, 1, 10000, &rep));
    expect_truth("tiny-dense", "vllm:tp=2", 0, b0, 1);
    REFIT_ASSERT_OK(refit_receiver_holders(r0, hs, 8, &nh));
    assert_null(holder(hs, nh, "relay:0"));
    refit_receiver_destroy(r0);
    /* A joiner that prepared (refit_receiver_prepare) has read the trainer
     * ranks' manifests and the relay's: its first pull, through the relay,
     * fetches none.  Knowing a relay of its layout alive, it yields for the
     * grace (REFIT_FLEET_STICKY_MS) before taking a holder. */
    void *b2;
    refit_receiver_t *r2 = fleet_receiver("tiny-dense", "vllm:tp=2", 1, &g, 1, &b2);
    REFIT_ASSERT_OK(refit_receiver_prepare(r2, 10000, NULL));
    REFIT_ASSERT_OK(refit_receiver_pull(r2, REFIT_VERSION_NEWEST, 10000, &rep));
    assert_int_equal(rep.version, 1);
    assert_false(rep.planned);
    assert_int_equal(rep.manifests_read, 0);
    assert_true(rep.transfer_ms >= 250); /* the holders are chosen in the transfer stage */
    expect_truth("tiny-dense", "vllm:tp=2", 1, b2, 1);
    REFIT_ASSERT_OK(refit_receiver_holders(r2, hs, 8, &nh));
    assert_non_null(holder(hs, nh, "relay:0"));
    assert_null(holder(hs, nh, "trainer:0"));
    assert_null(holder(hs, nh, "trainer:1"));
    refit_receiver_destroy(r2);
    refit_receiver_destroy(r);
    relay_stop(&a, false);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* Sized outputs (refit/engine.h): a size too small is refused, naming the
 * structure, before anything happens; a caller whose structure is larger
 * (newer headers) keeps its extra bytes; one whose structure is smaller
 * (older headers) gets only the fields that fit; holders are written at the
 * caller's stride. */
static void sized_outputs(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=2", 1, &g, 0, &b);
    refit_pull_report_t zero;
    memset(&zero, 0, sizeof(zero));
    REFIT_ASSERT_ERR(refit_receiver_pull(r, 1, 10000, &zero), REFIT_ERR_INVALID_ARG, "refit_pull_report_t: size is 0");
    assert_int_equal(refit_receiver_committed(r), 0); /* refused before pulling */
    zero.size = offsetof(refit_pull_report_t, digest_ms);
    REFIT_ASSERT_ERR(refit_receiver_pull(r, 1, 10000, &zero), REFIT_ERR_INVALID_ARG, "refit_pull_report_t");
    struct {
        refit_pull_report_t rep;
        uint64_t future; /* a field of a newer header */
    } newer = {REFIT_PULL_REPORT_INIT, 0x5eed};
    newer.rep.size = sizeof(newer);
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &newer.rep));
    assert_int_equal(newer.rep.size, sizeof(newer));
    assert_int_equal(newer.rep.version, 1);
    assert_true(newer.rep.bytes > 0);
    assert_int_equal(newer.future, 0x5eed);
    expect_truth("tiny-dense", "vllm:tp=2", 1, b, 1);

    /* An older caller: only its prefix is written (the library's helper, as
     * the engine uses it, on a size that ends before digest_bytes). */
    refit_pull_report_t older = REFIT_PULL_REPORT_INIT;
    older.digest_bytes = older.unverified_bytes = 77;
    older.digest_ms = 7;
    size_t older_size = offsetof(refit_pull_report_t, digest_bytes);
    older.size = older_size;
    refit_out_write(&older, older.size, &newer.rep, sizeof(newer.rep));
    assert_int_equal(older.size, older_size);
    assert_int_equal(older.version, 1);
    assert_int_equal(older.bytes, newer.rep.bytes);
    assert_int_equal(older.digest_bytes, 77);
    assert_int_equal(older.unverified_bytes, 77);
    assert_true(older.digest_ms == 7);

    size_t nh = 99;
    REFIT_ASSERT_OK(refit_receiver_holders(r, NULL, 0, &nh));
    assert_true(nh >= 1 && nh <= 2);
    size_t n = nh;
    refit_holder_stat_t small = {.size = 8};
    REFIT_ASSERT_ERR(refit_receiver_holders(r, &small, 1, &nh), REFIT_ERR_INVALID_ARG, "refit_holder_stat_t");
    struct wide {
        refit_holder_stat_t h;
        uint64_t future;
    } hs[3] = {{REFIT_HOLDER_STAT_INIT, 1}, {REFIT_HOLDER_STAT_INIT, 2}, {REFIT_HOLDER_STAT_INIT, 3}};
    hs[0].h.size = sizeof(hs[0]);
    nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, &hs[0].h, 3, &nh));
    assert_int_equal(nh, n);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(hs[i].h.size, sizeof(hs[0]));
        assert_int_equal(strncmp(hs[i].h.name, "trainer:", 8), 0);
        assert_int_equal(hs[i].future, i + 1);
        sum += hs[i].h.bytes;
    }
    assert_true(sum >= newer.rep.bytes);
    assert_int_equal(hs[2].h.name[0], '\0'); /* beyond the holders: untouched */
    assert_int_equal(hs[2].future, 3);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* A relay is killed while a reader pulls from it (and from a second relay):
 * the reader drops it and finishes from the other holders within a bounded
 * time, every byte verified. */
static void relay_killed_reader_fails_over(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    relay_t a = relay_start(&g, "tiny-dense", "vllm:tp=1", 0, 0, 1, 0);
    relay_t d = relay_start(&g, "tiny-dense", "vllm:tp=1", 0, 1, 1, 0);
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=1", 0, &g, 4, &b);
    /* Slow links (0.4 MB/s each, ~0.6 MB to move): the pull takes ~0.75 s; relay 0 dies at 250 ms, late
     * enough that it has served chunks even when a loaded machine slows the pull's start. */
    setenv("REFIT_TEST_THROTTLE", "relay:0=0.4,relay:1=0.4", 1);
    tool_proc_t killer = kill_after(a.pid, 250);
    double t0 = refit_now();
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    refit_status_t st = refit_receiver_pull(r, 1, 10000, &rep);
    double ms = t_ms_since(t0);
    unsetenv("REFIT_TEST_THROTTLE");
    killer_done(&killer);
    REFIT_ASSERT_OK(st);
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 1);
    refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &nh));
    const refit_holder_stat_t *h0 = holder(hs, nh, "relay:0"), *h1 = holder(hs, nh, "relay:1");
    assert_non_null(h0);
    assert_non_null(h1);
    assert_true(h0->failed);
    assert_true(h0->chunks > 0); /* it was serving when it died */
    assert_false(h1->failed);
    assert_true(h1->bytes > h0->bytes);
    assert_null(holder(hs, nh, "trainer:0")); /* relays had room: the trainer was left alone */
    assert_true(ms < 3000);
    refit_receiver_destroy(r);
    relay_stop(&a, true);
    relay_stop(&d, false);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* The only relay dies mid-transfer: the trainer serves what is left, and
 * the chunks already read from the relay are not read again. */
static void relay_killed_trainer_resumes(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    relay_t a = relay_start(&g, "tiny-dense", "vllm:tp=1", 0, 0, 1, 0);
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=1", 0, &g, 4, &b);
    setenv("REFIT_TEST_THROTTLE", "relay:0=1", 1); /* ~0.6 MB at 1 MB/s; killed at 150 ms */
    tool_proc_t killer = kill_after(a.pid, 150);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    refit_status_t st = refit_receiver_pull(r, 1, 10000, &rep);
    unsetenv("REFIT_TEST_THROTTLE");
    killer_done(&killer);
    REFIT_ASSERT_OK(st);
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 1);
    refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &nh));
    const refit_holder_stat_t *h0 = holder(hs, nh, "relay:0"), *t0 = holder(hs, nh, "trainer:0");
    assert_non_null(h0);
    assert_non_null(t0);
    assert_true(h0->failed && h0->chunks > 0);
    refit_manifest_t *m = t_manifest_named("tiny-dense", "vllm:tp=1", 0);
    uint64_t total = refit_manifest_region_size(m, 0);
    refit_manifest_destroy(m);
    /* The trainer moved what the relay had not: less than everything. */
    assert_true(t0->bytes > 0 && t0->bytes + h0->bytes / 2 < total);
    refit_receiver_destroy(r);
    relay_stop(&a, true);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* The trainer restarts and publishes version 1 again (another incarnation:
 * its bytes need not be those the relay holds).  A reader that finds the
 * relay still serving "version 1" must not read it: the relay's progress
 * names the trainer records its version came from, and they differ. */
static void relay_of_restarted_trainer_skipped(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    relay_t a = relay_start(&g, "tiny-dense", "vllm:tp=1", 0, 0, 1, 1);
    pub_stop(&p);
    p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=1", 0, &g, 1, &b);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &rep));
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 1);
    refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &nh));
    const refit_holder_stat_t *h0 = holder(hs, nh, "relay:0"), *t0 = holder(hs, nh, "trainer:0");
    assert_non_null(t0);
    assert_true(t0->bytes > 0);
    assert_true(!h0 || (h0->failed && h0->bytes == 0));
    refit_receiver_destroy(r);
    relay_stop(&a, false);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* Waits until relay group `group` serves `version` (it does from the start
 * of its transfer). */
static void wait_relay_serves(const reg_t *g, const char *group, uint64_t version)
{
    refit_registry_t *reg;
    REFIT_ASSERT_OK(refit_registry_open(g->url, g->job, &reg));
    for (int i = 0;; i++) {
        refit_version_record_t rec;
        uint8_t present = 0;
        REFIT_ASSERT_OK(refit_registry_records(reg, group, 1, &rec, &present));
        if (present && rec.version == version) break;
        if (i > 2500) fail_msg("%s never served version %llu", group, (unsigned long long)version);
        t_msleep(2);
    }
    refit_registry_close(reg);
}

/* A chain trainer -> A -> B -> reader; A dies mid-transfer.  B's own pull
 * fails over to the trainer (keeping what it has), and B goes on serving
 * the same version: the reader keeps following B rather than dropping it. */
static void chain_survives_relay_death(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    setenv("REFIT_TEST_THROTTLE", "trainer:0=2,relay:0=2,relay:1=2", 1); /* ~0.3 s per transfer */
    relay_t a = relay_spawn(&g, "tiny-dense", "vllm:tp=1", 0, 0, 1, 1);
    wait_relay_serves(&g, "trainer.relay.r0.s0", 1);
    relay_t bb = relay_spawn(&g, "tiny-dense", "vllm:tp=1", 0, 1, 1, 1);
    wait_relay_serves(&g, "trainer.relay.r0.s1", 1);
    tool_proc_t killer = kill_after(a.pid, 60);
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=1", 0, &g, 1, &b);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    refit_status_t st = refit_receiver_pull(r, 1, 15000, &rep);
    unsetenv("REFIT_TEST_THROTTLE");
    killer_done(&killer);
    REFIT_ASSERT_OK(st);
    relay_pulled(&bb); /* B completed (and verified) after failing over */
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 1);
    refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &nh));
    const refit_holder_stat_t *h1 = holder(hs, nh, "relay:1");
    assert_non_null(h1);
    assert_false(h1->failed);
    assert_true(h1->bytes * 2 > rep.bytes); /* most of it from B */
    assert_null(holder(hs, nh, "trainer:0"));
    refit_receiver_destroy(r);
    relay_stop(&a, true);
    relay_stop(&bb, false);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* A chain pipelines: relay A pulls slowly from the trainer (2 MB/s); B,
 * limited to one reader per holder, finds A holding the version while A is
 * still receiving it and reads A's chunks as they land, on a link as slow as
 * A's: B ends about when A does, not one whole transfer later.  Bytes
 * verified against the truth on both. */
static void relay_chain_pipelines(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    setenv("REFIT_TEST_THROTTLE", "trainer:0=2", 1);
    double t0 = refit_now();
    relay_t a = relay_spawn(&g, "tiny-dense", "vllm:tp=1", 0, 0, 1, 1);
    /* B starts once A serves version 1 (which it does when its transfer starts). */
    refit_registry_t *reg;
    REFIT_ASSERT_OK(refit_registry_open(g.url, g.job, &reg));
    for (int i = 0;; i++) {
        refit_version_record_t rec;
        uint8_t present = 0;
        REFIT_ASSERT_OK(refit_registry_records(reg, "trainer.relay.r0.s0", 1, &rec, &present));
        if (present && rec.version == 1) break;
        if (i > 2000) fail_msg("relay A never served version 1 while receiving it");
        t_msleep(2);
    }
    refit_registry_close(reg);
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=1", 0, &g, 1, &b);
    setenv("REFIT_TEST_THROTTLE", "relay:0=2", 1);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &rep));
    /* When B's bytes were in place (its verification - digests, truth - comes after). */
    double b_end = (rep.end_s - t0) * 1e3;
    unsigned long long dbytes = rep.digest_bytes;
    unsetenv("REFIT_TEST_THROTTLE");
    relay_pulled(&a); /* A verified its copy too */
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 1);
    refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &nh));
    const refit_holder_stat_t *h = holder(hs, nh, "relay:0");
    assert_non_null(h);
    assert_null(holder(hs, nh, "trainer:0")); /* the trainer's one reader was A */
    assert_false(h->failed);
    /* Most chunks were read from A while A was still receiving them. */
    assert_true(h->early > 0);
    assert_true(h->early * 2 > h->chunks);
    /* One transfer at 2 MB/s is ~0.3 s; back to back it would be ~0.6 s (2x; 1.8x leaves room for a loaded
     * machine's scheduling). */
    double one_ms = (double)rep.bytes / 2e6 * 1e3;
    if (b_end > 1.8 * one_ms) fail_msg("B ended after %.0f ms; one transfer takes %.0f ms", b_end, one_ms);
    assert_true(dbytes > 0); /* bytes read from a relay are checked against the trainer's digests */
    refit_receiver_destroy(r);
    relay_stop(&a, false);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* One of two DP replicas is slow (0.5 MB/s): the fast one steals its chunks;
 * the pull ends long before the slow replica could have served its half. */
static void slow_replica_chunks_stolen(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1,dp=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    void *b;
    refit_receiver_t *r = fleet_receiver("tiny-dense", "vllm:tp=1", 0, &g, 0, &b);
    setenv("REFIT_TEST_THROTTLE", "trainer:1=0.5", 1);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    double t0 = refit_now();
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &rep));
    double ms = t_ms_since(t0);
    unsetenv("REFIT_TEST_THROTTLE");
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 1);
    refit_holder_stat_t hs[4] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 4, &nh));
    const refit_holder_stat_t *fast = holder(hs, nh, "trainer:0"), *slow = holder(hs, nh, "trainer:1");
    assert_non_null(fast);
    assert_non_null(slow);
    /* Half the bytes at 0.5 MB/s would take ~570 ms; the slow one serves a few chunks at most. */
    assert_true(fast->bytes >= rep.bytes * 8 / 10);
    assert_true(ms < 400);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* ---- cases ---------------------------------------------------------------- */

static void end_to_end_shm_file(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=2,ep=2,etp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p[2];
    for (uint32_t k = 0; k < 2; k++) p[k] = pub_start(&c, k);
    void *b0, *b1;
    refit_receiver_t *r0 = receiver("tiny-moe", "vllm:tp=2", 0, &g, "shm", 0, &b0);
    refit_receiver_t *r1 = receiver("tiny-moe", "vllm:tp=2", 1, &g, "shm", 0, &b1);
    refit_manifest_t *m0 = t_manifest_named("tiny-moe", "vllm:tp=2", 0);
    const uint64_t size0 = refit_manifest_region_size(m0, 0);
    refit_manifest_destroy(m0);
    for (uint64_t v = 1; v <= 3; v++) {
        for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish %llu", (unsigned long long)v);
        refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
        /* Poison first: the pull must leave the memory byte-identical to the truth. */
        memset(b0, 0xa5, size0);
        REFIT_ASSERT_OK(refit_receiver_pull(r0, REFIT_VERSION_NEWEST, 10000, &rep));
        assert_int_equal(rep.version, v);
        assert_int_equal(rep.sources, 2);
        assert_string_equal(rep.transport, "shm");
        /* First pull plans and reads both manifests; later ones neither. */
        assert_int_equal(rep.planned, v == 1);
        assert_int_equal(rep.manifests_read, v == 1 ? 2 : 0);
        /* Every byte the placements cover was checked against the publishers' digests. */
        refit_plan_t *pl;
        refit_manifest_t *srcs[2] = {t_manifest_named("tiny-moe", "megatron:tp=2,ep=2,etp=1", 0),
                                     t_manifest_named("tiny-moe", "megatron:tp=2,ep=2,etp=1", 1)};
        refit_manifest_t *dm = t_manifest_named("tiny-moe", "vllm:tp=2", 0);
        REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)srcs, 2, dm, NULL, &pl));
        refit_plan_stats_t ps = REFIT_PLAN_STATS_INIT;
        refit_plan_stats(pl, &ps);
        assert_int_equal(rep.digest_bytes, ps.bytes_written);
        assert_int_equal(rep.unverified_bytes, 0);
        assert_true(rep.digest_ms > 0 && rep.digest_ms <= rep.verify_ms);
        refit_plan_destroy(pl);
        refit_manifest_destroy(dm);
        refit_manifest_destroy(srcs[0]);
        refit_manifest_destroy(srcs[1]);
        REFIT_ASSERT_OK(refit_receiver_pull(r1, v, 10000, &rep));
        expect_truth("tiny-moe", "vllm:tp=2", 0, b0, v);
        expect_truth("tiny-moe", "vllm:tp=2", 1, b1, v);
        assert_int_equal(refit_receiver_committed(r0), v);
        assert_true(refit_receiver_usable(r0));
        for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait %llu 5000", (unsigned long long)v);
    }
    /* Nothing newer: a bounded wait that says what it waited for. */
    REFIT_ASSERT_ERR(refit_receiver_pull(r0, REFIT_VERSION_NEWEST, 300, NULL), REFIT_ERR_TIMEOUT, "newer than 3");
    assert_int_equal(refit_receiver_committed(r0), 3);
    assert_true(refit_receiver_usable(r0));
    refit_receiver_destroy(r0);
    refit_receiver_destroy(r1);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* refit_receiver_prepare: refused (bounded) while the sources have not
 * published; once they have, it reads the manifests, plans and connects, so
 * the first pull reads no manifest and plans nothing, and its bytes are
 * right. */
static void prepare_before_first_pull(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=2,ep=2,etp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p[2];
    for (uint32_t k = 0; k < 2; k++) p[k] = pub_start(&c, k);
    void *b;
    refit_receiver_t *r = receiver("tiny-moe", "vllm:tp=2", 1, &g, "shm", 0, &b);
    double ms = -1;
    REFIT_ASSERT_ERR(refit_receiver_prepare(r, 300, &ms), REFIT_ERR_TIMEOUT, "no source of group");
    assert_true(ms < 0); /* outputs written only on success */
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    REFIT_ASSERT_OK(refit_receiver_prepare(r, 10000, &ms));
    assert_true(ms > 0);
    refit_manifest_t *m = t_manifest_named("tiny-moe", "vllm:tp=2", 1);
    memset(b, 0xa5, refit_manifest_region_size(m, 0));
    refit_manifest_destroy(m);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &rep));
    assert_false(rep.planned);
    assert_int_equal(rep.manifests_read, 0);
    assert_int_equal(rep.sources, 2);
    expect_truth("tiny-moe", "vllm:tp=2", 1, b, 1);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 1 5000");
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 2");
    REFIT_ASSERT_OK(refit_receiver_pull(r, 2, 10000, &rep));
    expect_truth("tiny-moe", "vllm:tp=2", 1, b, 2);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

static void process_vm_readv_path(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-mla", "megatron:tp=2,ep=2,etp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, true, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b;
    refit_receiver_t *r = receiver("tiny-mla", "vllm:tp=4", 3, &g, "shm", 0, &b);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &rep));
    assert_string_equal(rep.lanes, "shm:process_vm_readv");
    expect_truth("tiny-mla", "vllm:tp=4", 3, b, 1);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

static void snapshot_mode(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=2", g.url, g.job, "shm", NULL, REFIT_MODE_SNAPSHOT, 0, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b;
    refit_receiver_t *r = receiver("tiny-dense", "vllm:tp=1", 0, &g, NULL, 0, &b);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    /* The trainer goes on at once: its memory now holds other bytes, but the
     * snapshot of version 1 is what receivers read. */
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "scribble 99");
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, NULL));
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 1);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 2");
    REFIT_ASSERT_OK(refit_receiver_pull(r, REFIT_VERSION_NEWEST, 10000, NULL));
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 2);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

static void end_to_end_redis(void **state)
{
    (void)state;
#ifndef REFIT_HAVE_REDIS
    skip();
#else
    if (!t_in_path("redis-server")) {
        print_message("[  SKIPPED ] redis-server is not installed (scripts/deps.sh installs it)\n");
        skip();
    }
    t_redis_t rs = {0};
    assert_true(t_redis_start(&rs, 0));
    reg_t g;
    snprintf(g.url, sizeof(g.url), "redis://127.0.0.1:%d", rs.port);
    snprintf(g.job, sizeof(g.job), "redis-%d", (int)getpid());
    g.dir[0] = '\0';
    pubcfg_t c = {"tiny-moe", "megatron:ep=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 600, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b;
    refit_receiver_t *r = receiver("tiny-moe", "vllm:tp=1", 0, &g, "shm", 0, &b);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &rep));
    expect_truth("tiny-moe", "vllm:tp=1", 0, b, 1);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 1 5000");
    /* Redis goes away: a pull fails with a clear registry error, in bounded time. */
    t_redis_stop(&rs);
    double t0 = refit_now();
    REFIT_ASSERT_ERR(refit_receiver_pull(r, REFIT_VERSION_NEWEST, 2000, NULL), REFIT_ERR_REGISTRY, "redis");
    assert_true(t_ms_since(t0) < 6000);
    assert_int_equal(refit_receiver_committed(r), 1);
    assert_true(refit_receiver_usable(r));
    expect_truth("tiny-moe", "vllm:tp=1", 0, b, 1);
    /* ...and comes back empty (no persistence): publishers write their
     * manifests and records again on their next heartbeat. */
    assert_true(t_redis_start(&rs, rs.port));
    refit_registry_t *reg;
    REFIT_ASSERT_OK(refit_registry_open(g.url, g.job, &reg));
    for (uint32_t k = 0; k < 2; k++) {
        void *mb = NULL;
        size_t ml;
        t0 = refit_now();
        while (refit_registry_get_manifest(reg, "trainer", k, &mb, &ml) && t_ms_since(t0) < 5000) t_msleep(20);
        assert_non_null(mb);
        free(mb);
    }
    refit_registry_close(reg);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 2");
    REFIT_ASSERT_OK(refit_receiver_pull(r, 2, 10000, &rep));
    expect_truth("tiny-moe", "vllm:tp=1", 0, b, 2);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_redis_stop(&rs);
    t_rm_tree(rs.dir);
#endif
}

/* Both publishers publish version 1, r pulls it, the publishers wait for its
 * readers and publish version 2: the state every fault test starts from. */
static void to_version_2(pub_t p[2], refit_receiver_t *r)
{
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, NULL));
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 1 5000");
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 2");
}

/* Pulls version v of r while a forked killer SIGKILLs `victim` 100 ms into
 * the 300 ms pause the receiver takes after it started writing
 * (REFIT_TEST_PAUSE_MS); reaps both (the victim's pipes closed); *ms is the
 * pull's wall time. */
static refit_status_t pull_while_killing(refit_receiver_t *r, uint64_t v, pub_t *victim, refit_pull_report_t *rep,
                                         double *ms)
{
    setenv("REFIT_TEST_PAUSE_MS", "300", 1);
    tool_proc_t killer = kill_after(victim->pid, 100);
    double t0 = refit_now();
    refit_status_t st = refit_receiver_pull(r, v, 10000, rep);
    *ms = t_ms_since(t0);
    unsetenv("REFIT_TEST_PAUSE_MS");
    killer_done(&killer);
    tool_proc_wait(victim, 10.0);
    return st;
}

/* A publisher whose bytes nobody else holds dies during the transfer: the
 * pull fails (PEER, "died"), the memory is marked unusable. */
static void publisher_killed_mid_transfer(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b;
    refit_receiver_t *r = receiver("tiny-dense", "vllm:tp=1", 0, &g, "shm", 0, &b);
    to_version_2(p, r);
    /* The receiver pauses after it started writing; rank 1 dies meanwhile. */
    double ms;
    refit_status_t st = pull_while_killing(r, 2, &p[1], NULL, &ms);
    assert_int_equal(st, REFIT_ERR_PEER);
    assert_non_null(strstr(refit_last_error(), "died"));
    assert_true(ms < 5000);
    assert_false(refit_receiver_usable(r));
    assert_int_equal(refit_receiver_committed(r), 1);
    refit_receiver_destroy(r);
    pub_stop(&p[0]);
    t_rm_tree(g.dir);
}

/* A DP replica dies during the transfer: its chunks go to the other replica
 * in the same pull, every byte verified. */
static void replica_killed_mid_transfer_fails_over(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1,dp=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b;
    refit_receiver_t *r = receiver("tiny-dense", "vllm:tp=1", 0, &g, "shm", 0, &b);
    to_version_2(p, r);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    double ms;
    REFIT_ASSERT_OK(pull_while_killing(r, 2, &p[1], &rep, &ms));
    assert_true(ms < 5000);
    assert_true(refit_receiver_usable(r));
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 2);
    refit_holder_stat_t hs[4] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 4, &nh));
    assert_int_equal(nh, 2);
    bool saw_failed = false;
    for (size_t i = 0; i < nh; i++)
        if (!strcmp(hs[i].name, "trainer:1")) saw_failed = hs[i].failed;
    assert_true(saw_failed);
    refit_receiver_destroy(r);
    pub_stop(&p[0]);
    t_rm_tree(g.dir);
}

/* A publisher whose bytes nobody else holds dies: a clear error naming what
 * is missing, and the previous version stays intact. */
static void stale_entry_and_missing_rank(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:ep=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b;
    refit_receiver_t *r = receiver("tiny-moe", "vllm:tp=1", 0, &g, "shm", 0, &b);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, NULL));
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 1 5000");
    PUB_OK(&p[0], "publish 2");
    PUB_OK(&p[1], "publish 2");
    pub_kill(&p[1]); /* its manifest and record stay behind: a stale entry */
    t_msleep(600);
    REFIT_ASSERT_ERR(refit_receiver_pull(r, 2, 3000, NULL), REFIT_ERR_MISSING_SOURCE, "source slot(s) 1 missing");
    assert_true(refit_receiver_usable(r));
    expect_truth("tiny-moe", "vllm:tp=1", 0, b, 1);
    /* A new process takes rank 1 over (new incarnation): the receiver notices,
     * reads its manifest again and completes. */
    p[1] = pub_start(&c, 1);
    PUB_OK(&p[1], "publish 2");
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, 2, 10000, &rep));
    assert_int_equal(rep.manifests_read, 1);
    expect_truth("tiny-moe", "vllm:tp=1", 0, b, 2);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* A receiver killed while it holds a lease: the publisher's wait ends when
 * the lease expires, and another receiver is unaffected. */
/* A receiver of vllm:tp=2 rank 0 with a 500 ms lease that pauses 20 s once it
 * started its pull of version 1 (the test kills it meanwhile). */
static int paused_receiver_main(void *arg, int in, int out)
{
    (void)in, (void)out;
    void *vb;
    setenv("REFIT_TEST_PAUSE_MS", "20000", 1);
    refit_receiver_t *vr = receiver("tiny-moe", "vllm:tp=2", 0, arg, "shm", 500, &vb);
    refit_receiver_pull(vr, 1, 30000, NULL);
    return 0;
}

static void receiver_killed_mid_transfer(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:ep=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    tool_proc_t victim;
    assert_int_equal(tool_proc_fork(&victim, paused_receiver_main, &g, true), 0);
    /* Wait until the victim holds its lease, then kill it. */
    refit_registry_t *reg;
    REFIT_ASSERT_OK(refit_registry_open(g.url, g.job, &reg));
    uint32_t n = 0;
    double t0 = refit_now();
    while (n == 0 && t_ms_since(t0) < 10000) {
        REFIT_ASSERT_OK(refit_registry_lease_count(reg, "trainer", 1, &n));
        t_msleep(20);
    }
    assert_int_equal(n, 1);
    tool_proc_stop(&victim, NULL, 0, true, 10.0);
    /* Another receiver pulls normally. */
    void *b;
    refit_receiver_t *r = receiver("tiny-moe", "vllm:tp=2", 1, &g, "shm", 0, &b);
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, NULL));
    expect_truth("tiny-moe", "vllm:tp=2", 1, b, 1);
    /* The publishers' wait for readers ends once the dead lease expires (500 ms). */
    t0 = refit_now();
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 1 5000");
    assert_true(t_ms_since(t0) < 3000);
    REFIT_ASSERT_OK(refit_registry_lease_count(reg, "trainer", 1, &n));
    assert_int_equal(n, 0);
    refit_registry_close(reg);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* ---- fencing: a receiver never commits bytes its lease stopped protecting -- */

/* A receiver child ("victim", reader name `reader`) pulls version 1 without
 * the synthetic truth (as production does), pausing `pause_ms` after it
 * committed to the transfer; it answers one line: "<status> usable=U
 * committed=C bytes_of_v=V", V = the version whose truth the memory holds
 * (0: neither 1 nor 2). */
static bool g_victim_no_digest; /* the next fenced_victim checks no content digests */

typedef struct {
    const reg_t *g;
    const char *reader;
    int pause_ms;
} victim_arg_t;

static int victim_main(void *arg, int in, int resp)
{
    (void)in;
    const victim_arg_t *x = arg;
    char ms[16];
    snprintf(ms, sizeof(ms), "%d", x->pause_ms);
    setenv("REFIT_TEST_PAUSE_MS", ms, 1);
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = x->g->url;
    rp.job = x->g->job;
    rp.transports = "shm";
    rp.reader = x->reader;
    rp.lease_ms = 60000; /* no renewal during the pause: only the fence can notice */
    rp.no_digest = g_victim_no_digest;
    refit_manifest_t *m = t_manifest_named("tiny-moe", "vllm:tp=1", 0);
    refit_manifest_t *check = t_manifest_named("tiny-moe", "vllm:tp=1", 0);
    refit_receiver_t *r;
    void *b;
    if (refit_receiver_create(&rp, m, &r) || refit_receiver_alloc(r, 0, &b)) return 3;
    refit_status_t st = refit_receiver_pull(r, 1, 30000, NULL);
    char detail[512];
    snprintf(detail, sizeof(detail), "%s", st ? refit_last_error() : "");
    int holds = 0;
    for (uint64_t v = 1; v <= 2 && !holds; v++)
        if (!refit_truth_verify(check, (const void *const *)&b, v, NULL)) holds = (int)v;
    char out[700];
    int len = snprintf(out, sizeof(out), "%s usable=%d committed=%llu bytes_of_v=%d %s\n", refit_status_name(st),
                       (int)refit_receiver_usable(r), (unsigned long long)refit_receiver_committed(r), holds, detail);
    if (write(resp, out, (size_t)len) != len) return 4;
    refit_receiver_destroy(r);
    refit_manifest_destroy(check);
    return 0;
}

static tool_proc_t fenced_victim(const reg_t *g, const char *reader, int pause_ms)
{
    victim_arg_t arg = {g, reader, pause_ms};
    tool_proc_t v;
    assert_int_equal(tool_proc_fork(&v, victim_main, &arg, true), 0);
    return v;
}

/* The victim's answer line (bounded: 30 s); then waits (<= 30 s) for it to end. */
static void victim_result(tool_proc_t *victim, char *out, size_t cap)
{
    tool_proc_line(victim, 30000, out, cap);
    tool_proc_wait(victim, 30.0);
}

static void wait_lease(const reg_t *g, uint64_t v)
{
    refit_registry_t *reg;
    REFIT_ASSERT_OK(refit_registry_open(g->url, g->job, &reg));
    uint32_t n = 0;
    double t0 = refit_now();
    while (n == 0 && t_ms_since(t0) < 10000) {
        REFIT_ASSERT_OK(refit_registry_lease_count(reg, "trainer", v, &n));
        if (!n) t_msleep(10);
    }
    refit_registry_close(reg);
    assert_int_equal(n, 1);
}

/* A one-rank in-place publisher that published version 1, and a victim
 * receiver holding its lease while it pauses before the transfer. */
static pub_t victim_scene(reg_t *g, tool_proc_t *victim)
{
    reg_file(g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=1", g->url, g->job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    *victim = fenced_victim(g, "victim", 1500);
    wait_lease(g, 1);
    return p;
}

/* The victim's answer must start with `want` and name `why`. */
static void expect_victim(tool_proc_t *victim, const char *want, const char *why)
{
    char out[800];
    victim_result(victim, out, sizeof(out));
    if (strncmp(out, want, strlen(want)) || !strstr(out, why)) fail_msg("victim: %s", out);
}

/* The lease is deleted while the receiver reads (an operator, a bug, an
 * attacker with write access to the store): the publisher finds no reader,
 * rewrites its memory with version 2, and the receiver - which read v2's
 * bytes as "v1" - must not commit them.  Before fencing it did (rc 0). */
static void lease_lost_mid_read_not_committed(void **state)
{
    (void)state;
    reg_t g;
    tool_proc_t victim;
    pub_t p = victim_scene(&g, &victim);
    refit_registry_t *reg;
    REFIT_ASSERT_OK(refit_registry_open(g.url, g.job, &reg));
    REFIT_ASSERT_OK(refit_registry_lease_release(reg, "trainer", 1, "victim"));
    refit_registry_close(reg);
    PUB_OK(&p, "wait 1 5000"); /* no lease: it returns at once */
    PUB_OK(&p, "scribble 2");  /* and the trainer writes its next step in place */
    expect_victim(&victim, "REFIT_ERR_STALE usable=0 committed=0", "was lost during the transfer");
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* The same, and the lease's own authentic value written back before the
 * receiver checks it (a registry writer without the secret), with no content
 * digests: the fence's lease check passes, and before the version stamps the
 * receiver committed v2's bytes as v1 with rc 0 (docs/security.md said so).
 * The publisher's stamp was cleared when wait_readers returned. */
static void lease_replayed_mid_read_refused(void **state)
{
    (void)state;
    reg_t g;
    tool_proc_t victim;
    g_victim_no_digest = true;
    pub_t p = victim_scene(&g, &victim);
    g_victim_no_digest = false;
    refit_kv_t *kv;
    REFIT_ASSERT_OK(refit_kv_file_ops.open(g.dir, g.job, &kv));
    const char *key = "trainer/v/1/lease/victim";
    void *lease = NULL;
    size_t len = 0;
    REFIT_ASSERT_OK(refit_kv_file_ops.get_many(kv, &key, 1, &lease, &len));
    assert_non_null(lease);
    REFIT_ASSERT_OK(refit_kv_file_ops.del(kv, key));
    PUB_OK(&p, "wait 1 5000");                                      /* no lease: it returns at once */
    PUB_OK(&p, "scribble 2");                                       /* the trainer writes its next step in place */
    REFIT_ASSERT_OK(refit_kv_file_ops.put(kv, key, lease, len, 0)); /* and the lease is back, token and tag */
    expect_victim(&victim, "REFIT_ERR_STALE usable=0 committed=0", "retired version 1");
    free(lease);
    refit_kv_file_ops.close(kv);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* A trainer that rewrites its memory while a receiver reads it (in place,
 * without waiting for its readers: a bug, or a second writer), the lease
 * intact: no synthetic truth in the receiver, only the publisher's content
 * digests, which the bytes read no longer match.  Before the digests the
 * receiver committed v2's bytes as v1 with rc 0. */
static void scribble_during_read_refused(void **state)
{
    (void)state;
    reg_t g;
    tool_proc_t victim;
    pub_t p = victim_scene(&g, &victim);
    PUB_OK(&p, "scribble 2");
    expect_victim(&victim, "REFIT_ERR_VERIFY usable=0 committed=0",
                  "does not match what its publishers published");
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* A registry on a full filesystem: the receiver's error says so (the
 * issue saw "0 of 1 receivers committed" from the driver instead). */
static void registry_disk_full_said(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        print_message("[  SKIPPED ] needs root to mount a small tmpfs\n");
        skip();
    }
    reg_t g;
    reg_file(&g);
    if (mount("refit-test", g.dir, "tmpfs", 0, "size=2m,mode=0700") != 0) {
        print_message("[  SKIPPED ] cannot mount a tmpfs: %s\n", strerror(errno));
        t_rm_tree(g.dir);
        skip();
    }
    pubcfg_t c = {"tiny-moe", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    void *b;
    refit_receiver_t *r = receiver("tiny-moe", "vllm:tp=1", 0, &g, "shm", 0, &b);
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, NULL)); /* reads the manifest while there is room */
    PUB_OK(&p, "wait 1 5000");
    PUB_OK(&p, "publish 2");
    /* Fill what is left. */
    char junk[160];
    snprintf(junk, sizeof(junk), "%s/junk", g.dir);
    FILE *f = fopen(junk, "w");
    static char block[4096];
    for (int i = 0; f && i < 4096; i++) /* 16 MiB at most: the tmpfs has 2 */
        if (fwrite(block, 1, sizeof(block), f) != sizeof(block) || fflush(f) != 0 || ferror(f)) break;
    if (f) fclose(f);
    /* The receiver cannot take its lease: it says why. */
    REFIT_ASSERT_ERR(refit_receiver_pull(r, REFIT_VERSION_NEWEST, 3000, NULL), REFIT_ERR_REGISTRY,
                     "No space left on device");
    assert_int_equal(refit_receiver_committed(r), 1);
    assert_true(refit_receiver_usable(r));
    /* Nor can the publisher retire or publish. */
    const char *said = pub_cmd(&p, "wait 2 3000");
    if (!strstr(said, "No space left on device")) fail_msg("publisher said: %s", said);
    refit_receiver_destroy(r);
    pub_kill(&p);
    umount2(g.dir, MNT_DETACH);
    t_rm_tree(g.dir);
}

/* Redis restarts without its data while the receiver reads: every lease and
 * retired marker is gone.  The publisher notices (a new epoch) and does not
 * believe "no leases" for a lease lifetime, so it does not rewrite its
 * memory; the receiver finds its lease gone and does not commit. */
static void registry_lost_mid_read_fenced(void **state)
{
    (void)state;
#ifndef REFIT_HAVE_REDIS
    skip();
#else
    if (!t_in_path("redis-server")) skip();
    t_redis_t rs = {0};
    assert_true(t_redis_start(&rs, 0));
    reg_t g;
    snprintf(g.url, sizeof(g.url), "redis://127.0.0.1:%d", rs.port);
    snprintf(g.job, sizeof(g.job), "fence-%d", (int)getpid());
    g.dir[0] = '\0';
    pubcfg_t c = {"tiny-moe", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    tool_proc_t victim = fenced_victim(&g, "victim", 2500);
    wait_lease(&g, 1);
    t_redis_stop(&rs);
    assert_true(t_redis_start(&rs, rs.port));
    /* The publisher's default lease_ms is 10 s: within 1.5 s it must refuse
     * to call the version free, naming the reason. */
    const char *said = pub_cmd(&p, "wait 1 1500");
    if (strncmp(said, "REFIT_ERR_TIMEOUT", 17) || !strstr(said, "lost its data")) fail_msg("publisher said: %s", said);
    expect_victim(&victim, "REFIT_ERR_STALE usable=0 committed=0", "lost");
    pub_stop(&p);
    t_redis_stop(&rs);
    t_rm_tree(rs.dir);
#endif
}

/* A heartbeat that comes later than dead_ms (a publisher starved of CPU)
 * finds its entry expired.  That is no loss of the store's data (its epoch
 * is the same): the publisher writes the entry again and keeps believing
 * "no leases" -- before, it fenced for a lease lifetime (10 s), which held up
 * relays' next versions on a busy host.  The store really losing its data
 * is registry_lost_mid_read_fenced. */
static void late_heartbeat_is_not_data_loss(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    /* The entry gone as if it expired: its file removed (the store and its
     * epoch stay). */
    char hb[256];
    snprintf(hb, sizeof(hb), "%s/%s/trainer%%2Fsrc%%2F0%%2Fhb", g.dir, g.job);
    assert_int_equal(unlink(hb), 0);
    /* The next beat (every 100 ms) writes it again. */
    double t0 = refit_now();
    while (access(hb, F_OK) != 0 && t_ms_since(t0) < 3000) t_msleep(10);
    assert_int_equal(access(hb, F_OK), 0);
    const char *said = pub_cmd(&p, "wait 1 1500");
    if (strncmp(said, "REFIT_OK", 8)) fail_msg("publisher said: %s", said);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

static void identity_and_corrupt_manifest(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    /* A receiver of another model. */
    void *b;
    refit_receiver_t *r = receiver("tiny-dense", "vllm:tp=1", 0, &g, "shm", 0, &b);
    REFIT_ASSERT_ERR(refit_receiver_pull(r, 1, 2000, NULL), REFIT_ERR_IDENTITY,
                     "group trainer publishes model tiny-moe; this receiver holds tiny-dense");
    refit_receiver_destroy(r);
    /* A corrupt manifest in the registry. */
    refit_registry_t *reg;
    REFIT_ASSERT_OK(refit_registry_open(g.url, g.job, &reg));
    void *buf;
    size_t len;
    REFIT_ASSERT_OK(refit_registry_get_manifest(reg, "trainer", 0, &buf, &len));
    ((unsigned char *)buf)[len / 2] ^= 0x40;
    REFIT_ASSERT_OK(refit_registry_put_manifest(reg, "trainer", 0, buf, len / 2 + 7)); /* truncated, and flipped */
    free(buf);
    r = receiver("tiny-moe", "vllm:tp=1", 0, &g, "shm", 0, &b);
    REFIT_ASSERT_ERR(refit_receiver_pull(r, 1, 2000, NULL), REFIT_ERR_CORRUPT, "manifest of source rank 0");
    assert_true(refit_receiver_usable(r));
    refit_receiver_destroy(r);
    refit_registry_close(reg);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* Partial refit through the engine: a receiver with a narrowed manifest
 * (refit_manifest_select) over the same memory pulls only layer 1 and the
 * lm_head (whole fused tensors) and verifies only those; the rest of the
 * memory keeps the previous version. */
static void partial_refit(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=2,ep=2,etp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p[2];
    for (uint32_t k = 0; k < 2; k++) p[k] = pub_start(&c, k);
    void *b;
    refit_receiver_t *full = receiver("tiny-moe", "vllm:tp=2", 0, &g, "shm", 0, &b);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 1");
    REFIT_ASSERT_OK(refit_receiver_pull(full, 1, 10000, NULL));
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 1 5000");
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish 2");
    refit_manifest_t *m = t_manifest_named("tiny-moe", "vllm:tp=2", 0), *sel, *rest;
    refit_select_report_t sr = REFIT_SELECT_REPORT_INIT;
    REFIT_ASSERT_OK(refit_manifest_select(m, "layer:1,lm_head.weight", false, &sel, &sr));
    REFIT_ASSERT_OK(refit_manifest_select(m, "layer:1,lm_head.weight", true, &rest, NULL));
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g.url;
    rp.job = g.job;
    rp.transports = "shm";
    rp.verify = REFIT_VERIFY_TRUTH;
    rp.reader = "partial";
    refit_receiver_t *part;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, sel, &part));
    REFIT_ASSERT_OK(refit_receiver_attach(part, 0, b));
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(part, 2, 10000, &rep));
    assert_int_equal(rep.version, 2);
    assert_true(rep.bytes < sr.bytes + 1);
    assert_true(rep.bytes * 2 < refit_manifest_region_size(m, 0));
    REFIT_ASSERT_OK(refit_manifest_select(m, "layer:1,lm_head.weight", false, &sel, NULL));
    REFIT_ASSERT_OK(refit_truth_verify(sel, (const void *const *)&b, 2, NULL));
    REFIT_ASSERT_OK(refit_truth_verify(rest, (const void *const *)&b, 1, NULL));
    REFIT_ASSERT_ERR(refit_truth_verify(m, (const void *const *)&b, 2, NULL), REFIT_ERR_VERIFY, "");
    refit_receiver_destroy(part);
    refit_receiver_destroy(full);
    refit_manifest_destroy(sel);
    refit_manifest_destroy(rest);
    refit_manifest_destroy(m);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* ---- delta refit ------------------------------------------------------------ */

static refit_receiver_t *delta_receiver(const char *model, const char *layout, uint32_t rank, const reg_t *g,
                                        double fraction, const char *reader, void **base)
{
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g->url;
    rp.job = g->job;
    rp.transports = "shm";
    rp.verify = REFIT_VERIFY_TRUTH;
    rp.truth_fraction = fraction;
    rp.reader = reader;
    rp.threads = 2;
    refit_receiver_t *r;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(model, layout, rank), &r));
    REFIT_ASSERT_OK(refit_receiver_alloc(r, 0, base));
    return r;
}

/* Independent proof for the delta truth. */
static void expect_truth_delta(const char *model, const char *layout, uint32_t rank, void *base, uint64_t v, double f)
{
    refit_manifest_t *m = t_manifest_named(model, layout, rank);
    REFIT_ASSERT_OK(refit_truth_verify_delta(m, (const void *const *)&base, v, f, NULL));
    refit_manifest_destroy(m);
}

/* Publishes v on both ranks; returns the delta base rank 0 offered. */
static unsigned long long publish_delta(pub_t p[2], uint64_t v)
{
    unsigned long long base = 99, bytes = 0, of = 0;
    for (uint32_t k = 0; k < 2; k++) {
        const char *r = pub_cmd(&p[k], "publish %llu", (unsigned long long)v);
        if (strncmp(r, "REFIT_OK", 8)) fail_msg("publisher said: %s", r);
        unsigned long long b2;
        assert_int_equal(sscanf(r, "REFIT_OK base=%llu bytes=%llu of=%llu", &b2, &bytes, &of), 3);
        if (k == 0) base = b2;
        else assert_int_equal(b2, base);
    }
    return base;
}

#define DM "tiny-moe", "vllm:tp=2"

static void delta_refit(void **state)
{
    (void)state;
    const double f = 0.02;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-moe", "megatron:tp=2,ep=2,etp=1", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, f};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    void *b0, *b1;
    refit_receiver_t *r0 = delta_receiver(DM, 0, &g, f, "d0", &b0), *r1 = delta_receiver(DM, 1, &g, f, "d1", &b1);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    /* Version 1: nothing to take a delta from. */
    assert_int_equal(publish_delta(p, 1), 0);
    REFIT_ASSERT_OK(refit_receiver_pull(r0, 1, 10000, &rep));
    assert_int_equal(rep.delta_base, 0);
    uint64_t full_bytes = rep.bytes;
    REFIT_ASSERT_OK(refit_receiver_pull(r1, 1, 10000, &rep));
    for (uint64_t v = 2; v <= 4; v++) {
        for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait %llu 5000", (unsigned long long)(v - 1));
        assert_int_equal(publish_delta(p, v), v - 1);
        /* r0 takes every version as a delta: a few percent of the bytes. */
        REFIT_ASSERT_OK(refit_receiver_pull(r0, v, 10000, &rep));
        assert_int_equal(rep.delta_base, v - 1);
        assert_true(rep.delta_units > 0);
        assert_true(rep.bytes * 10 < full_bytes);
        assert_non_null(strstr(rep.lanes, "(delta)"));
        expect_truth_delta(DM, 0, b0, v, f);
        assert_true(refit_receiver_usable(r0));
        /* r1 skips version 2: version 3's delta is from a version it lacks, so it pulls in full. */
        if (v == 2) continue;
        REFIT_ASSERT_OK(refit_receiver_pull(r1, v, 10000, &rep));
        assert_int_equal(rep.delta_base, v == 3 ? 0 : v - 1);
        expect_truth_delta(DM, 1, b1, v, f);
    }
    /* A receiver that wants none pulls in full. */
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 4 5000");
    assert_int_equal(publish_delta(p, 5), 4);
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g.url;
    rp.job = g.job;
    rp.transports = "shm";
    rp.no_delta = true;
    rp.reader = "nodelta";
    refit_receiver_t *rn;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(DM, 1), &rn));
    REFIT_ASSERT_OK(refit_receiver_attach(rn, 0, b1));
    REFIT_ASSERT_OK(refit_receiver_pull(rn, 5, 10000, &rep));
    assert_int_equal(rep.delta_base, 0);
    expect_truth_delta(DM, 1, b1, 5, f);
    refit_receiver_destroy(rn);
    /* The trainer restarts and publishes version 5 again, then 6.  r0 holds
     * the old incarnation's 5: the new delta's base has the same number but
     * comes from another publisher, so r0 pulls in full. */
    REFIT_ASSERT_OK(refit_receiver_pull(r0, 5, 10000, &rep));
    assert_int_equal(rep.delta_base, 4);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    for (uint32_t k = 0; k < 2; k++) p[k] = pub_start(&c, k);
    assert_int_equal(publish_delta(p, 5), 0);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 5 5000");
    assert_int_equal(publish_delta(p, 6), 5);
    REFIT_ASSERT_OK(refit_receiver_pull(r0, 6, 10000, &rep));
    assert_int_equal(rep.delta_base, 0);
    expect_truth_delta(DM, 0, b0, 6, f);
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 6 5000");
    assert_int_equal(publish_delta(p, 7), 6);
    REFIT_ASSERT_OK(refit_receiver_pull(r0, 7, 10000, &rep));
    assert_int_equal(rep.delta_base, 6);
    expect_truth_delta(DM, 0, b0, 7, f);
    refit_receiver_destroy(r0);
    refit_receiver_destroy(r1);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* A delta that would cost more than delta_max_pct of the bytes is not
 * offered; a corrupt one is refused while applying and the pull completes in
 * full; snapshot publishers offer deltas too. */
static void delta_fallbacks(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    void *b;
    /* 30% of elements change: sparse would cost more than the chunks, so the
     * delta is about the size of the region and not offered. */
    pubcfg_t c = {"tiny-moe", "megatron:tp=2,ep=2,etp=1", g.url, g.job, "shm",
                  NULL,       REFIT_MODE_IN_PLACE,        0,     false, 0.3};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    refit_receiver_t *r = delta_receiver(DM, 0, &g, 0.3, "big", &b);
    for (uint64_t v = 1; v <= 2; v++) {
        assert_int_equal(publish_delta(p, v), 0);
        REFIT_ASSERT_OK(refit_receiver_pull(r, v, 10000, &rep));
        assert_int_equal(rep.delta_base, 0);
        expect_truth_delta(DM, 0, b, v, 0.3);
        for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait %llu 5000", (unsigned long long)v);
    }
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    /* Corrupt: indices that do not ascend.  The receiver may have written
     * part of the delta before it found out; the full pull that follows
     * rewrites every byte, and the memory verifies. */
    reg_file(&g);
    c.registry = g.url;
    c.job = g.job;
    c.delta = 0.02;
    setenv("REFIT_TEST_CORRUPT_DELTA", "1", 1);
    p[0] = pub_start(&c, 0);
    p[1] = pub_start(&c, 1);
    unsetenv("REFIT_TEST_CORRUPT_DELTA");
    r = delta_receiver(DM, 0, &g, 0.02, "corrupt", &b);
    assert_int_equal(publish_delta(p, 1), 0);
    REFIT_ASSERT_OK(refit_receiver_pull(r, 1, 10000, &rep));
    for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait 1 5000");
    assert_int_equal(publish_delta(p, 2), 1);
    REFIT_ASSERT_OK(refit_receiver_pull(r, 2, 10000, &rep));
    assert_int_equal(rep.delta_base, 0);
    assert_true(refit_receiver_usable(r));
    expect_truth_delta(DM, 0, b, 2, 0.02);
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    /* Snapshot mode: each buffer has its delta arenas; the trainer scribbles
     * right after publishing and the delta is still the published one. */
    reg_file(&g);
    pubcfg_t sc = {"tiny-dense", "megatron:tp=2", g.url, g.job, "shm", NULL, REFIT_MODE_SNAPSHOT, 0, false, 0.02};
    p[0] = pub_start(&sc, 0);
    p[1] = pub_start(&sc, 1);
    r = delta_receiver("tiny-dense", "vllm:tp=1", 0, &g, 0.02, "snap", &b);
    for (uint64_t v = 1; v <= 4; v++) {
        assert_int_equal(publish_delta(p, v), v - 1);
        for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "scribble 99");
        REFIT_ASSERT_OK(refit_receiver_pull(r, v, 10000, &rep));
        assert_int_equal(rep.delta_base, v - 1);
        expect_truth_delta("tiny-dense", "vllm:tp=1", 0, b, v, 0.02);
    }
    refit_receiver_destroy(r);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

/* ---- a relay rewritten under its reader ---------------------------------- */

static int relay_follower_main(void *arg, int cmd, int resp)
{
    const relay_arg_t *x = arg;
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = x->g->url;
    rp.job = x->g->job;
    rp.transports = "shm";
    rp.verify = REFIT_VERIFY_TRUTH;
    rp.threads = 1;
    rp.chunk_kb = 16;
    rp.relay_slot = 0;
    rp.relay_heartbeat_ms = 100;
    refit_receiver_t *r;
    void *base;
    if (refit_receiver_create(&rp, t_manifest_named(x->model, x->layout, 0), &r) || refit_receiver_alloc(r, 0, &base))
        return 3;
    refit_status_t st = refit_receiver_pull(r, 1, 10000, NULL);
    char out[700];
    snprintf(out, sizeof(out), "%s\n", st ? refit_last_error() : "ok");
    if (write(resp, out, strlen(out)) < 0) return 4;
    char c;
    while (read(cmd, &c, 1) == 1 && c != 'q') {
        if (c != 'n') continue;
        st = refit_receiver_pull(r, REFIT_VERSION_NEWEST, 10000, NULL);
        snprintf(out, sizeof(out), "%s\n", st ? refit_last_error() : "ok2");
        if (write(resp, out, strlen(out)) < 0) return 4;
    }
    refit_receiver_destroy(r);
    return 0;
}

/* A relay process that pulls version 1, answers "ok" (or the error), then
 * pulls the newest version on each 'n' and answers "ok2" (or the error). */
static relay_t relay_follower_spawn(const reg_t *g, const char *model, const char *layout)
{
    relay_arg_t arg = {g, model, layout, 0, 0, 0, 1};
    relay_t x;
    assert_int_equal(tool_proc_fork(&x, relay_follower_main, &arg, true), 0);
    return x;
}

typedef struct {
    int trainer_cmd, relay_cmd;
} rewrite_arg_t;

/* At 300 ms: version 2 published; at 500 ms: the relay told to pull it. */
static int rewrite_main(void *arg, int in, int out)
{
    (void)in, (void)out;
    const rewrite_arg_t *x = arg;
    t_msleep(300);
    if (write(x->trainer_cmd, "publish 2\n", 10) != 10) return 1;
    t_msleep(200);
    if (write(x->relay_cmd, "n", 1) != 1) return 1;
    return 0;
}

/* A reader pulls version 1 from a relay (slowly); meanwhile the trainer
 * publishes version 2 and the relay pulls it into the memory the reader is
 * reading.  The relay waits up to its readers' lease time, then revokes
 * their leases and writes.  The reader must not report success with a torn
 * version: its pull is REFIT_ERR_STALE (the relay lease it held is gone) and
 * its memory is marked unusable.  Digests are off, so the fencing alone must
 * catch it; before relay leases had tokens the pull returned REFIT_OK with
 * a mixture of versions 1 and 2. */
static void relay_rewritten_under_reader_fenced(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-dense", "megatron:tp=1", g.url, g.job, "shm", NULL, REFIT_MODE_SNAPSHOT, 400, false, 0};
    pub_t p = pub_start(&c, 0);
    PUB_OK(&p, "publish 1");
    relay_t a = relay_follower_spawn(&g, "tiny-dense", "vllm:tp=1");
    char buf[800];
    relay_answer(&a, buf, sizeof(buf), "ok");
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g.url;
    rp.job = g.job;
    rp.transports = "shm";
    rp.verify = REFIT_VERIFY_NONE;
    rp.threads = 1;
    rp.chunk_kb = 16;
    rp.max_readers = 1;
    rp.lease_ms = 600; /* the relay waits this long for us before revoking */
    rp.no_digest = true;
    refit_receiver_t *r;
    void *b;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named("tiny-dense", "vllm:tp=1", 0), &r));
    REFIT_ASSERT_OK(refit_receiver_alloc(r, 0, &b));
    setenv("REFIT_TEST_THROTTLE", "relay:0=0.3", 1); /* ~2 s to read the relay */
    rewrite_arg_t rw = {p.to_child, a.to_child};
    tool_proc_t helper;
    assert_int_equal(tool_proc_fork(&helper, rewrite_main, &rw, true), 0);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    refit_status_t st = refit_receiver_pull(r, 1, 20000, &rep);
    unsetenv("REFIT_TEST_THROTTLE");
    tool_proc_wait(&helper, 10.0);
    refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
    size_t nh = 0;
    REFIT_ASSERT_OK(refit_receiver_holders(r, hs, 8, &nh));
    const refit_holder_stat_t *h0 = holder(hs, nh, "relay:0");
    assert_non_null(h0);
    assert_true(h0->bytes > 0);                /* it did read the relay */
    relay_answer(&a, buf, sizeof(buf), "ok2"); /* the relay moved on to version 2 */
    if (st != REFIT_ERR_STALE)
        fail_msg("reader of a rewritten relay: %s (%s), want REFIT_ERR_STALE", refit_status_name(st),
                 st ? refit_last_error() : "");
    assert_false(refit_receiver_usable(r));
    /* The next pull starts over and verifies. */
    REFIT_ASSERT_OK(refit_receiver_pull(r, REFIT_VERSION_NEWEST, 20000, &rep));
    assert_int_equal(rep.version, 2);
    expect_truth("tiny-dense", "vllm:tp=1", 0, b, 2);
    assert_true(refit_receiver_usable(r));
    refit_receiver_destroy(r);
    relay_stop(&a, false);
    const char *pr = pub_read(&p); /* the trainer's answer to "publish 2" */
    if (strncmp(pr, "REFIT_OK", 8)) fail_msg("publish 2: %s", pr);
    pub_stop(&p);
    t_rm_tree(g.dir);
}

/* ---- FP8 relays ------------------------------------------------------------- */

/* bf16 trainer (2 processes) -> two FP8 relays (vllm:tp=2 ranks) -> FP8
 * receivers of tp=2 rank 1 and of tp=1 (resharded from the two arenas);
 * every byte equal to a reference quantization of the truth, and the FP8
 * receivers read about half the bf16 bytes. */
static void fp8_relays(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    pubcfg_t c = {"tiny-fp8", "megatron:ep=2", g.url, g.job, "shm", NULL, REFIT_MODE_IN_PLACE, 0, false, 0};
    pub_t p[2] = {pub_start(&c, 0), pub_start(&c, 1)};
    refit_fp8_relay_t *x[2];
    for (uint32_t k = 0; k < 2; k++) {
        refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
        rp.registry = g.url;
        rp.job = g.job;
        rp.transports = "shm";
        rp.verify = REFIT_VERIFY_TRUTH;
        char reader[32];
        snprintf(reader, sizeof(reader), "fp8relay%u", k);
        rp.reader = reader;
        refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
        pp.registry = g.url;
        pp.job = g.job;
        pp.group = "fp8";
        pp.transports = "shm";
        REFIT_ASSERT_OK(refit_fp8_relay_create(&rp, &pp, t_manifest_named("tiny-fp8", "vllm:tp=2", k), &x[k]));
    }
    refit_receiver_t *r2, *r1;
    void *b2, *b1;
    refit_manifest_t *want_m;
    for (int i = 0; i < 2; i++) {
        unsigned char *ref = t_fp8_arena("tiny-fp8", i ? "vllm:tp=1" : "vllm:tp=2", i ? 0 : 1, 1, &want_m);
        free(ref);
        refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
        rp.registry = g.url;
        rp.job = g.job;
        rp.group = "fp8";
        rp.transports = "shm";
        rp.reader = i ? "fp8-tp1" : "fp8-tp2";
        REFIT_ASSERT_OK(refit_receiver_create(&rp, want_m, i ? &r1 : &r2));
        REFIT_ASSERT_OK(refit_receiver_alloc(i ? r1 : r2, 0, i ? &b1 : &b2));
    }
    for (uint64_t v = 1; v <= 2; v++) {
        for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "publish %llu", (unsigned long long)v);
        uint64_t bf16_bytes = 0;
        for (uint32_t k = 0; k < 2; k++) {
            refit_fp8_relay_report_t xr = REFIT_FP8_RELAY_REPORT_INIT;
            REFIT_ASSERT_OK(refit_fp8_relay_step(x[k], v, 10000, &xr));
            assert_int_equal(xr.version, v);
            assert_true(xr.fp8_bytes < xr.bf16_bytes * 7 / 10);
            if (k == 1) bf16_bytes = xr.bf16_bytes;
        }
        refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
        REFIT_ASSERT_OK(refit_receiver_pull(r2, v, 10000, &rep));
        assert_true(rep.bytes < bf16_bytes * 7 / 10);
        REFIT_ASSERT_OK(refit_receiver_pull(r1, v, 10000, &rep));
        assert_int_equal(rep.sources, 2);
        for (int i = 0; i < 2; i++) {
            refit_manifest_t *fm;
            unsigned char *ref = t_fp8_arena("tiny-fp8", i ? "vllm:tp=1" : "vllm:tp=2", i ? 0 : 1, v, &fm);
            assert_memory_equal(i ? b1 : b2, ref, refit_manifest_region_size(fm, 0));
            refit_manifest_destroy(fm);
            free(ref);
        }
        for (uint32_t k = 0; k < 2; k++) PUB_OK(&p[k], "wait %llu 5000", (unsigned long long)v);
    }
    /* A layout that cuts FP8 blocks is refused when the relay is made. */
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g.url;
    rp.job = g.job;
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = g.url;
    pp.job = g.job;
    pp.group = "fp8";
    refit_fp8_relay_t *bad;
    REFIT_ASSERT_ERR(refit_fp8_relay_create(&rp, &pp, t_manifest_named("tiny-fp8", "vllm:tp=4", 1), &bad),
                     REFIT_ERR_GEOMETRY, "block grid");
    pp.group = NULL;
    REFIT_ASSERT_ERR(refit_fp8_relay_create(&rp, &pp, t_manifest_named("tiny-fp8", "vllm:tp=2", 0), &bad),
                     REFIT_ERR_INVALID_ARG, "group of its own");
    refit_receiver_destroy(r1);
    refit_receiver_destroy(r2);
    for (uint32_t k = 0; k < 2; k++) refit_fp8_relay_destroy(x[k]);
    for (uint32_t k = 0; k < 2; k++) pub_stop(&p[k]);
    t_rm_tree(g.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(end_to_end_shm_file),
        cmocka_unit_test(prepare_before_first_pull),
        cmocka_unit_test(sized_outputs),
        cmocka_unit_test(partial_refit),
        cmocka_unit_test(delta_refit),
        cmocka_unit_test(delta_fallbacks),
        cmocka_unit_test(fp8_relays),
        cmocka_unit_test(process_vm_readv_path),
        cmocka_unit_test(snapshot_mode),
        cmocka_unit_test(end_to_end_redis),
        cmocka_unit_test(publisher_killed_mid_transfer),
        cmocka_unit_test(replica_killed_mid_transfer_fails_over),
        cmocka_unit_test(stale_entry_and_missing_rank),
        cmocka_unit_test(receiver_killed_mid_transfer),
        cmocka_unit_test(identity_and_corrupt_manifest),
        cmocka_unit_test(lease_lost_mid_read_not_committed),
        cmocka_unit_test(lease_replayed_mid_read_refused),
        cmocka_unit_test(registry_lost_mid_read_fenced),
        cmocka_unit_test(late_heartbeat_is_not_data_loss),
        cmocka_unit_test(scribble_during_read_refused),
        cmocka_unit_test(registry_disk_full_said),
        cmocka_unit_test(relay_serves_joiner),
        cmocka_unit_test(relay_killed_reader_fails_over),
        cmocka_unit_test(relay_killed_trainer_resumes),
        cmocka_unit_test(relay_of_restarted_trainer_skipped),
        cmocka_unit_test(chain_survives_relay_death),
        cmocka_unit_test(relay_chain_pipelines),
        cmocka_unit_test(relay_rewritten_under_reader_fenced),
        cmocka_unit_test(slow_replica_chunks_stolen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
