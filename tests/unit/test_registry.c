/* Registry: the same cases against the file backend (a mkdtemp directory)
 * and against a real redis-server this test starts on a free port of
 * 127.0.0.1 (skipped, saying why, when hiredis or redis-server is missing).
 * Each case uses its own job, so cases never see each other's keys. */
#include "testutil.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "data/digest.h"
#include "registry/backend.h"
#include "registry/registry.h"
#include "util/crypto.h"

typedef struct {
    const char *name;
    const refit_kv_ops_t *ops; /* NULL: backend not available */
    const char *skip_why;
    char url[PATH_MAX + 16];
    char rest[PATH_MAX + 16]; /* url without "scheme:", for direct backend access */
    char dir[PATH_MAX];       /* file: the registry; redis: the server's --dir */
    pid_t server;
    int port;
} backend_t;

static backend_t g_file = {.name = "file"};
static backend_t g_redis = {.name = "redis"};
static int g_job_seq;

/* ---- helpers ------------------------------------------------------------ */

#define msleep t_msleep
#define ms_since t_ms_since

static backend_t *need(void **state)
{
    backend_t *b = *state;
    if (!b->ops) {
        print_message("[  SKIPPED ] %s backend: %s\n", b->name, b->skip_why);
        skip();
    }
    return b;
}

static const char *new_job(char job[32])
{
    snprintf(job, 32, "t%d-%ld", ++g_job_seq, (long)getpid());
    return job;
}

static refit_registry_t *open_job(const backend_t *b, const char *job)
{
    refit_registry_t *r = NULL;
    REFIT_ASSERT_OK(refit_registry_open(b->url, job, &r));
    assert_non_null(r);
    return r;
}

static refit_kv_t *open_kv(const backend_t *b, const char *job)
{
    refit_kv_t *kv = NULL;
    REFIT_ASSERT_OK(b->ops->open(b->rest, job, &kv));
    return kv;
}

static uint32_t count(refit_registry_t *r, const char *group, uint64_t v)
{
    uint32_t n = 12345;
    REFIT_ASSERT_OK(refit_registry_lease_count(r, group, v, &n));
    return n;
}

/* ---- redis-server ------------------------------------------------------- */

static void stop_redis(backend_t *b)
{
    t_redis_t tr = {.pid = b->server, .port = b->port};
    t_redis_stop(&tr);
    b->server = 0;
}

/* Starts redis-server on b->port (files in b->dir) and waits until it answers. */
static bool start_redis(backend_t *b)
{
    t_redis_t tr = {0};
    snprintf(tr.dir, sizeof(tr.dir), "%s", b->dir);
    if (!t_redis_start(&tr, b->port)) return false;
    b->server = tr.pid;
    return true;
}

#ifdef REFIT_HAVE_REDIS
static void stop_redis_at_exit(void) { stop_redis(&g_redis); }
#endif

/* ---- group set-ups ------------------------------------------------------ */

static int file_setup(void **state)
{
    snprintf(g_file.dir, sizeof(g_file.dir), "/tmp/refit-reg-XXXXXX");
    if (!mkdtemp(g_file.dir)) return -1;
    snprintf(g_file.url, sizeof(g_file.url), "file:%s", g_file.dir);
    snprintf(g_file.rest, sizeof(g_file.rest), "%s", g_file.dir);
    g_file.ops = &refit_kv_file_ops;
    return 0;
}

static int file_teardown(void **state)
{
    if (g_file.dir[0]) t_rm_tree(g_file.dir);
    return 0;
}

static int redis_setup(void **state)
{
#ifndef REFIT_HAVE_REDIS
    g_redis.skip_why = "refit was built without hiredis";
    return 0;
#else
    if (!t_in_path("redis-server")) {
        g_redis.skip_why = "redis-server is not installed (scripts/deps.sh installs it)";
        return 0;
    }
    snprintf(g_redis.dir, sizeof(g_redis.dir), "/tmp/refit-redis-XXXXXX");
    if (!mkdtemp(g_redis.dir)) return -1;
    atexit(stop_redis_at_exit);
    g_redis.port = t_free_port();
    if (g_redis.port <= 0 || !start_redis(&g_redis)) {
        g_redis.skip_why = "redis-server did not start";
        print_message("redis-server did not answer PING on port %d\n", g_redis.port);
        return -1;
    }
    snprintf(g_redis.url, sizeof(g_redis.url), "redis://127.0.0.1:%d", g_redis.port);
    snprintf(g_redis.rest, sizeof(g_redis.rest), "//127.0.0.1:%d", g_redis.port);
    g_redis.ops = &refit_kv_redis_ops;
    return 0;
#endif
}

static int redis_teardown(void **state)
{
    stop_redis(&g_redis);
    if (g_redis.dir[0]) t_rm_tree(g_redis.dir);
    return 0;
}

/* ---- cases -------------------------------------------------------------- */

static void test_manifest(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    void *buf = NULL;
    size_t len = 0;
    REFIT_ASSERT_ERR(refit_registry_get_manifest(r, "trainer", 0, &buf, &len), REFIT_ERR_NOT_FOUND, "manifest");

    uint8_t bytes[300];
    for (size_t i = 0; i < sizeof(bytes); i++) bytes[i] = (uint8_t)i; /* zeros and high bytes too */
    REFIT_ASSERT_OK(refit_registry_put_manifest(r, "trainer", 0, bytes, sizeof(bytes)));
    REFIT_ASSERT_OK(refit_registry_get_manifest(r, "trainer", 0, &buf, &len));
    assert_int_equal(len, sizeof(bytes));
    assert_memory_equal(buf, bytes, sizeof(bytes));
    free(buf);

    REFIT_ASSERT_OK(refit_registry_put_manifest(r, "trainer", 0, "second", 6));
    REFIT_ASSERT_OK(refit_registry_get_manifest(r, "trainer", 0, &buf, &len));
    assert_int_equal(len, 6);
    assert_memory_equal(buf, "second", 6);
    free(buf);
    REFIT_ASSERT_ERR(refit_registry_get_manifest(r, "trainer", 1, &buf, &len), REFIT_ERR_NOT_FOUND, "rank 1");
    REFIT_ASSERT_ERR(refit_registry_get_manifest(r, "other", 0, &buf, &len), REFIT_ERR_NOT_FOUND, NULL);

    REFIT_ASSERT_ERR(refit_registry_put_manifest(r, "trainer", 0, bytes, 0), REFIT_ERR_INVALID_ARG, "empty");
    REFIT_ASSERT_ERR(refit_registry_put_manifest(r, "a/b", 0, bytes, 1), REFIT_ERR_INVALID_ARG, "group");
    REFIT_ASSERT_ERR(refit_registry_put_manifest(r, "", 0, bytes, 1), REFIT_ERR_INVALID_ARG, "group");
    refit_registry_close(r);
}

static void test_heartbeat(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    refit_source_info_t info = {.incarnation = 0x1122334455667788ULL, .pid = 4242};
    snprintf(info.host, sizeof(info.host), "node-7.example");
    uint8_t alive[3] = {9, 9, 9};
    refit_source_info_t infos[3];
    REFIT_ASSERT_OK(refit_registry_alive(r, "g", 3, alive, infos));
    assert_memory_equal(alive, ((uint8_t[]){0, 0, 0}), 3);

    double t0 = refit_now();
    REFIT_ASSERT_OK(refit_registry_heartbeat(r, "g", 1, &info, 300));
    REFIT_ASSERT_OK(refit_registry_alive(r, "g", 3, alive, infos));
    assert_memory_equal(alive, ((uint8_t[]){0, 1, 0}), 3);
    assert_int_equal(infos[1].incarnation, info.incarnation);
    assert_int_equal(infos[1].pid, 4242);
    assert_string_equal(infos[1].host, "node-7.example");
    REFIT_ASSERT_OK(refit_registry_alive(r, "g", 3, alive, NULL));

    /* Refreshed at 150 ms: still alive at 350 ms (past the first ttl). */
    msleep(150);
    REFIT_ASSERT_OK(refit_registry_heartbeat(r, "g", 1, &info, 300));
    msleep(200);
    REFIT_ASSERT_OK(refit_registry_alive(r, "g", 3, alive, NULL));
    if (ms_since(t0) < 440) assert_int_equal(alive[1], 1); /* unless this machine stalled */
    /* Not refreshed: dead after its ttl. */
    msleep(300);
    REFIT_ASSERT_OK(refit_registry_alive(r, "g", 3, alive, infos));
    assert_memory_equal(alive, ((uint8_t[]){0, 0, 0}), 3);

    REFIT_ASSERT_ERR(refit_registry_heartbeat(r, "g", 1, &info, 0), REFIT_ERR_INVALID_ARG, "ttl");
    memset(info.host, 'x', sizeof(info.host));
    REFIT_ASSERT_ERR(refit_registry_heartbeat(r, "g", 1, &info, 100), REFIT_ERR_INVALID_ARG, "host");
    refit_registry_close(r);
}

static refit_version_record_t rec_of(uint64_t v, uint32_t rank)
{
    refit_version_record_t rec = {.version = v,
                                  .signature = 0xabcdef0123456789ULL ^ rank,
                                  .incarnation = 77 + rank,
                                  .buffer = rank & 1,
                                  .flags = 0x80000001u,
                                  .delta_base = v * 1000 + rank};
    return rec;
}

static void test_records(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    enum { W = 6 };
    refit_version_record_t recs[W];
    uint8_t present[W];
    REFIT_ASSERT_OK(refit_registry_records(r, "g", 0, recs, present));
    REFIT_ASSERT_OK(refit_registry_records(r, "g", W, recs, present));
    for (int k = 0; k < W; k++) assert_int_equal(present[k], 0);

    const uint32_t ranks[] = {0, 2, 5};
    for (size_t i = 0; i < 3; i++) {
        refit_version_record_t rec = rec_of(10, ranks[i]);
        REFIT_ASSERT_OK(refit_registry_publish(r, "g", ranks[i], &rec));
    }
    REFIT_ASSERT_OK(refit_registry_records(r, "g", W, recs, present));
    assert_memory_equal(present, ((uint8_t[]){1, 0, 1, 0, 0, 1}), W);
    for (size_t i = 0; i < 3; i++) {
        refit_version_record_t want = rec_of(10, ranks[i]);
        assert_memory_equal(&recs[ranks[i]], &want, sizeof(want));
    }
    /* Publishing again replaces the rank's record. */
    refit_version_record_t rec = rec_of(11, 2);
    REFIT_ASSERT_OK(refit_registry_publish(r, "g", 2, &rec));
    REFIT_ASSERT_OK(refit_registry_records(r, "g", W, recs, present));
    assert_int_equal(recs[2].version, 11);
    assert_int_equal(recs[2].delta_base, 11002);
    assert_int_equal(recs[0].version, 10);
    /* Other groups are separate. */
    REFIT_ASSERT_OK(refit_registry_records(r, "h", W, recs, present));
    for (int k = 0; k < W; k++) assert_int_equal(present[k], 0);
    /* Heads: rank 0 of several groups, records and heartbeats together. */
    rec = rec_of(12, 0);
    REFIT_ASSERT_OK(refit_registry_publish(r, "h", 0, &rec));
    refit_source_info_t info = {.incarnation = 5, .pid = 1};
    snprintf(info.host, sizeof(info.host), "node");
    REFIT_ASSERT_OK(refit_registry_heartbeat(r, "h", 0, &info, 5000));
    const char *groups[] = {"g", "h", "nobody"};
    uint8_t alive[3];
    REFIT_ASSERT_OK(refit_registry_heads(r, groups, 3, recs, present, alive));
    assert_memory_equal(present, ((uint8_t[]){1, 1, 0}), 3);
    assert_memory_equal(alive, ((uint8_t[]){0, 1, 0}), 3);
    assert_int_equal(recs[0].version, 10);
    assert_memory_equal(&recs[1], &rec, sizeof(rec));
    refit_registry_close(r);
}

static void test_lease_basic(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    assert_int_equal(count(r, "g", 7), 0);
    REFIT_ASSERT_OK(refit_registry_lease_acquire(r, "g", 7, "host-a:123@0", 5000));
    assert_int_equal(count(r, "g", 7), 1);
    REFIT_ASSERT_OK(refit_registry_lease_acquire(r, "g", 7, "host-a:123@0", 5000)); /* renewal */
    assert_int_equal(count(r, "g", 7), 1);
    REFIT_ASSERT_OK(refit_registry_lease_acquire(r, "g", 7, "r2", 5000));
    assert_int_equal(count(r, "g", 7), 2);
    assert_int_equal(count(r, "g", 70), 0); /* "7/" is not a prefix of "70/" */
    assert_int_equal(count(r, "g2", 7), 0);
    REFIT_ASSERT_OK(refit_registry_lease_release(r, "g", 7, "host-a:123@0"));
    assert_int_equal(count(r, "g", 7), 1);
    REFIT_ASSERT_OK(refit_registry_lease_release(r, "g", 7, "host-a:123@0")); /* absent: fine */
    REFIT_ASSERT_OK(refit_registry_lease_release(r, "g", 7, "r2"));
    assert_int_equal(count(r, "g", 7), 0);

    REFIT_ASSERT_ERR(refit_registry_lease_acquire(r, "g", 7, "a/b", 100), REFIT_ERR_INVALID_ARG, "reader");
    REFIT_ASSERT_ERR(refit_registry_lease_acquire(r, "g", 7, "a*", 100), REFIT_ERR_INVALID_ARG, "reader");
    REFIT_ASSERT_ERR(refit_registry_lease_acquire(r, "g", 7, "r", 0), REFIT_ERR_INVALID_ARG, "ttl");
    refit_registry_close(r);
}

static void test_lease_expiry(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    REFIT_ASSERT_OK(refit_registry_lease_acquire(r, "g", 3, "survivor", 20000));
    /* A reader process takes a 300 ms lease and dies without releasing it. */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        refit_registry_t *cr = NULL;
        int rc = refit_registry_open(b->url, job, &cr) == REFIT_OK &&
                         refit_registry_lease_acquire(cr, "g", 3, "doomed", 300) == REFIT_OK
                     ? 0
                     : 1;
        _exit(rc);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    double t0 = refit_now();
    assert_int_equal(count(r, "g", 3), 2);
    uint32_t n = 2;
    while (n == 2 && ms_since(t0) < 3000) {
        msleep(20);
        n = count(r, "g", 3);
    }
    assert_int_equal(n, 1);
    assert_true(ms_since(t0) < 1500);
    refit_registry_close(r);
}

static void test_retire(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    REFIT_ASSERT_OK(refit_registry_lease_acquire(r, "g", 3, "early", 5000));
    REFIT_ASSERT_OK(refit_registry_retire(r, "g", 3));
    REFIT_ASSERT_OK(refit_registry_retire(r, "g", 3)); /* idempotent */
    REFIT_ASSERT_ERR(refit_registry_lease_acquire(r, "g", 3, "late", 5000), REFIT_ERR_STALE, "retired");
    assert_int_equal(count(r, "g", 3), 1); /* "early" only: "late" left nothing */
    /* Renewing on a retired version fails and removes the lease. */
    REFIT_ASSERT_ERR(refit_registry_lease_acquire(r, "g", 3, "early", 5000), REFIT_ERR_STALE, "version 3");
    assert_int_equal(count(r, "g", 3), 0);
    /* Other versions and groups are unaffected. */
    REFIT_ASSERT_OK(refit_registry_lease_acquire(r, "g", 4, "late", 5000));
    REFIT_ASSERT_OK(refit_registry_lease_acquire(r, "h", 3, "late", 5000));
    assert_int_equal(count(r, "g", 4), 1);
    refit_registry_close(r);
}

/* ---- concurrency: readers acquiring while a retirer retires ------------- */

enum { RACE_READERS = 4, RACE_ROUNDS = 12 };

typedef struct {
    const backend_t *b;
    const char *job;
    int id;
    pthread_barrier_t *start;
    uint64_t version;
    int ok;      /* leases taken */
    int stale;   /* STALE answers */
    int late_ok; /* OK for an acquire that started after retire returned */
    int errors;
    char error[256];
    uint64_t *retired_at; /* refit_now_ns() after retire returned; 0 before */
} race_reader_t;

static void *race_reader(void *arg)
{
    race_reader_t *rd = arg;
    refit_registry_t *r = NULL;
    if (refit_registry_open(rd->b->url, rd->job, &r) != REFIT_OK) {
        rd->errors++;
        snprintf(rd->error, sizeof(rd->error), "open: %s", refit_last_error());
    }
    pthread_barrier_wait(rd->start);
    for (int j = 0; r && j < 100000; j++) {
        char name[64];
        snprintf(name, sizeof(name), "reader%d-%d", rd->id, j);
        uint64_t started = refit_now_ns();
        uint64_t ret = __atomic_load_n(rd->retired_at, __ATOMIC_SEQ_CST);
        refit_status_t st = refit_registry_lease_acquire(r, "g", rd->version, name, 30000);
        bool after = ret > 0 && started > ret;
        if (st == REFIT_OK) {
            rd->ok++;
            if (after) rd->late_ok++;
        } else if (st == REFIT_ERR_STALE) {
            rd->stale++;
            break;
        } else {
            rd->errors++;
            snprintf(rd->error, sizeof(rd->error), "%s: %s", refit_status_name(st), refit_last_error());
            break;
        }
    }
    refit_registry_close(r);
    return NULL;
}

static void test_lease_race(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    unsigned seed = (unsigned)getpid();
    int total_ok = 0, total_stale = 0;
    for (int round = 0; round < RACE_ROUNDS; round++) {
        uint64_t v = 100 + (uint64_t)round;
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, RACE_READERS + 1);
        uint64_t retired_at = 0;
        race_reader_t rd[RACE_READERS];
        pthread_t th[RACE_READERS];
        for (int i = 0; i < RACE_READERS; i++) {
            rd[i] = (race_reader_t){
                .b = b, .job = job, .id = i, .start = &start, .version = v, .retired_at = &retired_at};
            assert_int_equal(pthread_create(&th[i], NULL, race_reader, &rd[i]), 0);
        }
        pthread_barrier_wait(&start);
        msleep(1 + (int)(rand_r(&seed) % 8));
        REFIT_ASSERT_OK(refit_registry_retire(r, "g", v));
        __atomic_store_n(&retired_at, refit_now_ns(), __ATOMIC_SEQ_CST);
        uint32_t counted = count(r, "g", v); /* what the publisher would wait for */
        int ok = 0;
        for (int i = 0; i < RACE_READERS; i++) {
            pthread_join(th[i], NULL);
            if (rd[i].errors) fail_msg("reader %d: %s", i, rd[i].error);
            assert_int_equal(rd[i].late_ok, 0);
            assert_int_equal(rd[i].stale, 1);
            ok += rd[i].ok;
            total_stale += rd[i].stale;
        }
        pthread_barrier_destroy(&start);
        /* Every lease a reader holds was visible to the retirer's count. */
        if (counted < (uint32_t)ok)
            fail_msg("round %d: retirer counted %u leases, readers hold %d", round, counted, ok);
        /* STALE answers left no lease behind. */
        assert_int_equal(count(r, "g", v), ok);
        total_ok += ok;
    }
    print_message("lease race (%s): %d leases taken, %d refused over %d rounds\n", b->name, total_ok, total_stale,
                  RACE_ROUNDS);
    refit_registry_close(r);
}

/* ---- wait ----------------------------------------------------------------- */

typedef struct {
    refit_registry_t *r;
    int delay_ms;
    refit_status_t st;
} putter_t;

static void *delayed_put(void *arg)
{
    putter_t *p = arg;
    msleep(p->delay_ms);
    p->st = refit_registry_put_manifest(p->r, "g", 9, "x", 1);
    return NULL;
}

static void test_wait(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));

    /* Nothing happens: TIMEOUT, not early. */
    double t0 = refit_now();
    REFIT_ASSERT_ERR(refit_registry_wait(r, 200), REFIT_ERR_TIMEOUT, NULL);
    double el = ms_since(t0);
    assert_true(el >= 199.0);
    assert_true(el < 1000.0);
    REFIT_ASSERT_ERR(refit_registry_wait(r, 0), REFIT_ERR_TIMEOUT, NULL);
    REFIT_ASSERT_ERR(refit_registry_wait(r, -1), REFIT_ERR_INVALID_ARG, NULL);

    /* A put from another thread, on the same object (a blocked wait does
     * not hold up puts), wakes the waiter promptly. */
    putter_t p = {.r = r, .delay_ms = 100};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, delayed_put, &p), 0);
    t0 = refit_now();
    REFIT_ASSERT_OK(refit_registry_wait(r, 5000));
    el = ms_since(t0);
    pthread_join(th, NULL);
    REFIT_ASSERT_OK(p.st);
    assert_true(el >= 80.0);
    assert_true(el < 1500.0);

    /* Changes made between two waits (by another object) are not lost; one
     * wait takes them all, and the next one blocks again. */
    refit_registry_t *r2 = open_job(b, job);
    REFIT_ASSERT_OK(refit_registry_put_manifest(r2, "g", 1, "a", 1));
    REFIT_ASSERT_OK(refit_registry_lease_acquire(r2, "g", 1, "rd", 5000));
    REFIT_ASSERT_OK(refit_registry_lease_release(r2, "g", 1, "rd"));
    msleep(50);
    t0 = refit_now();
    REFIT_ASSERT_OK(refit_registry_wait(r, 5000));
    assert_true(ms_since(t0) < 500.0);
    REFIT_ASSERT_ERR(refit_registry_wait(r, 150), REFIT_ERR_TIMEOUT, NULL);

    /* Reads are not changes. */
    void *buf = NULL;
    size_t len = 0;
    REFIT_ASSERT_OK(refit_registry_get_manifest(r2, "g", 1, &buf, &len));
    free(buf);
    assert_int_equal(count(r2, "g", 1), 0);
    REFIT_ASSERT_ERR(refit_registry_wait(r, 150), REFIT_ERR_TIMEOUT, NULL);

    /* A change from another process. */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        refit_registry_t *cr = NULL;
        msleep(100);
        refit_version_record_t rec = rec_of(5, 0);
        int rc = refit_registry_open(b->url, job, &cr) == REFIT_OK &&
                         refit_registry_publish(cr, "g", 0, &rec) == REFIT_OK
                     ? 0
                     : 1;
        _exit(rc);
    }
    t0 = refit_now();
    refit_status_t st = refit_registry_wait(r, 5000);
    el = ms_since(t0);
    int status = 0;
    waitpid(pid, &status, 0);
    REFIT_ASSERT_OK(st);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_true(el < 2000.0);
    refit_registry_close(r2);
    refit_registry_close(r);
}

static void test_remove_source(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    refit_source_info_t info = {.incarnation = 1, .pid = 2};
    snprintf(info.host, sizeof(info.host), "h");
    for (uint32_t k = 0; k < 2; k++) {
        refit_version_record_t rec = rec_of(3, k);
        REFIT_ASSERT_OK(refit_registry_put_manifest(r, "g", k, "m", 1));
        REFIT_ASSERT_OK(refit_registry_heartbeat(r, "g", k, &info, 10000));
        REFIT_ASSERT_OK(refit_registry_publish(r, "g", k, &rec));
    }
    REFIT_ASSERT_OK(refit_registry_remove_source(r, "g", 1));
    REFIT_ASSERT_OK(refit_registry_remove_source(r, "g", 1)); /* again: nothing to do */
    REFIT_ASSERT_OK(refit_registry_remove_source(r, "g", 7));
    void *buf = NULL;
    size_t len = 0;
    REFIT_ASSERT_ERR(refit_registry_get_manifest(r, "g", 1, &buf, &len), REFIT_ERR_NOT_FOUND, NULL);
    REFIT_ASSERT_OK(refit_registry_get_manifest(r, "g", 0, &buf, &len));
    free(buf);
    uint8_t alive[2], present[2];
    refit_version_record_t recs[2];
    REFIT_ASSERT_OK(refit_registry_alive(r, "g", 2, alive, NULL));
    REFIT_ASSERT_OK(refit_registry_records(r, "g", 2, recs, present));
    assert_memory_equal(alive, ((uint8_t[]){1, 0}), 2);
    assert_memory_equal(present, ((uint8_t[]){1, 0}), 2);
    refit_registry_close(r);
}

static void test_corrupt(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    refit_kv_t *kv = open_kv(b, job);
    refit_version_record_t rec = rec_of(4, 0);
    REFIT_ASSERT_OK(refit_registry_publish(r, "g", 0, &rec));

    uint8_t present[3] = {7, 7, 7};
    refit_version_record_t recs[3];
    memset(recs, 0x5a, sizeof(recs));
    refit_version_record_t untouched[3];
    memcpy(untouched, recs, sizeof(recs));

    /* Written without the secret (a plain key write): refused as such. */
    REFIT_ASSERT_OK(b->ops->put(kv, "g/src/2/rec", "garbage", 7, 0));
    REFIT_ASSERT_ERR(refit_registry_records(r, "g", 3, recs, present), REFIT_ERR_AUTH, "g/src/2/rec");
    assert_memory_equal(present, ((uint8_t[]){7, 7, 7}), 3); /* outputs only on success */
    assert_memory_equal(recs, untouched, sizeof(recs));
    /* An authentic value moved to another key: its tag names the first key. */
    void *vals[1] = {NULL};
    size_t lens[1] = {0};
    const char *key0[1] = {"g/src/0/rec"};
    REFIT_ASSERT_OK(b->ops->get_many(kv, key0, 1, vals, lens));
    assert_non_null(vals[0]);
    assert_int_equal(lens[0], 56 + 32);
    REFIT_ASSERT_OK(b->ops->put(kv, "g/src/2/rec", vals[0], lens[0], 0));
    REFIT_ASSERT_ERR(refit_registry_records(r, "g", 3, recs, present), REFIT_ERR_AUTH, "g/src/2/rec");
    /* One flipped bit of an authentic value breaks its tag. */
    ((uint8_t *)vals[0])[20] ^= 0x10;
    REFIT_ASSERT_OK(b->ops->put(kv, "g/src/0/rec", vals[0], lens[0], 0));
    REFIT_ASSERT_ERR(refit_registry_records(r, "g", 3, recs, present), REFIT_ERR_AUTH, "g/src/0/rec");
    REFIT_ASSERT_OK(refit_registry_publish(r, "g", 0, &rec));

    /* Signed by someone with the secret, but malformed: the decoders still check. */
    REFIT_ASSERT_OK(refit_registry_put_signed(r, "g/src/2/rec", "garbage", 7, 0));
    REFIT_ASSERT_ERR(refit_registry_records(r, "g", 3, recs, present), REFIT_ERR_CORRUPT, "g/src/2/rec");
    ((uint8_t *)vals[0])[20] ^= 0x10;
    lens[0] -= 32;                    /* the record without its tag */
    ((uint8_t *)vals[0])[20] ^= 0x10; /* right size, right magic, one flipped bit: the checksum catches it */
    REFIT_ASSERT_OK(refit_registry_put_signed(r, "g/src/2/rec", vals[0], lens[0], 0));
    REFIT_ASSERT_ERR(refit_registry_records(r, "g", 3, recs, present), REFIT_ERR_CORRUPT, "checksum");
    ((uint8_t *)vals[0])[20] ^= 0x10;
    ((uint8_t *)vals[0])[4] = 9; /* another format */
    REFIT_ASSERT_OK(refit_registry_put_signed(r, "g/src/2/rec", vals[0], lens[0], 0));
    REFIT_ASSERT_ERR(refit_registry_records(r, "g", 3, recs, present), REFIT_ERR_UNSUPPORTED, "format");
    free(vals[0]);
    REFIT_ASSERT_OK(refit_registry_put_signed(r, "g/src/2/rec", "", 0, 0));
    REFIT_ASSERT_ERR(refit_registry_records(r, "g", 3, recs, present), REFIT_ERR_CORRUPT, "0 bytes");
    REFIT_ASSERT_OK(b->ops->del(kv, "g/src/2/rec"));
    REFIT_ASSERT_OK(refit_registry_records(r, "g", 3, recs, present));
    assert_memory_equal(present, ((uint8_t[]){1, 0, 0}), 3);

    /* A heartbeat with a record's bytes. */
    uint8_t alive[2];
    REFIT_ASSERT_OK(refit_registry_put_signed(r, "g/src/1/hb", "RFHB....", 8, 5000));
    REFIT_ASSERT_ERR(refit_registry_alive(r, "g", 2, alive, NULL), REFIT_ERR_CORRUPT, "g/src/1/hb");
    b->ops->close(kv);
    refit_registry_close(r);
}

/* put_new: create-if-absent, also over an expired key; list skips expired keys. */
static void test_kv_put_new(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_kv_t *kv = open_kv(b, new_job(job));
    REFIT_ASSERT_OK(b->ops->put_new(kv, "g/x", "1", 1, 300));
    REFIT_ASSERT_ERR(b->ops->put_new(kv, "g/x", "2", 1, 300), REFIT_ERR_BUSY, "g/x");
    REFIT_ASSERT_OK(b->ops->put(kv, "g/y", "y", 1, 0));
    char **keys = NULL;
    size_t n = 0;
    REFIT_ASSERT_OK(b->ops->list(kv, "g/", &keys, &n));
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++) free(keys[i]);
    free(keys);
    msleep(400);
    REFIT_ASSERT_OK(b->ops->list(kv, "g/", &keys, &n));
    assert_int_equal(n, 1);
    assert_string_equal(keys[0], "g/y");
    free(keys[0]);
    free(keys);
    REFIT_ASSERT_OK(b->ops->put(kv, "g/x", "3", 1, 100));
    msleep(200); /* g/x is present but expired */
    REFIT_ASSERT_OK(b->ops->put_new(kv, "g/x", "4", 1, 0));
    const char *k[2] = {"g/x", "g/none"};
    void *vals[2];
    size_t lens[2];
    REFIT_ASSERT_OK(b->ops->get_many(kv, k, 2, vals, lens));
    assert_non_null(vals[0]);
    assert_null(vals[1]);
    assert_int_equal(lens[0], 1);
    assert_memory_equal(vals[0], "4", 1);
    free(vals[0]);
    REFIT_ASSERT_OK(b->ops->del(kv, "g/x"));
    REFIT_ASSERT_OK(b->ops->del(kv, "g/x"));
    REFIT_ASSERT_OK(b->ops->put_new(kv, "g/x", "5", 1, 0));
    b->ops->close(kv);
}

/* Concurrent put_new on one expired key from several threads: exactly one wins. */
typedef struct {
    const backend_t *b;
    const char *job;
    pthread_barrier_t *start;
    refit_status_t st;
} put_new_racer_t;

static void *put_new_racer(void *arg)
{
    put_new_racer_t *p = arg;
    refit_kv_t *kv = NULL;
    p->st = p->b->ops->open(p->b->rest, p->job, &kv);
    pthread_barrier_wait(p->start);
    if (kv) p->st = p->b->ops->put_new(kv, "g/once", "w", 1, 0);
    if (kv) p->b->ops->close(kv);
    return NULL;
}

static void test_kv_put_new_race(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_kv_t *kv = open_kv(b, new_job(job));
    enum { N = 4 };
    for (int round = 0; round < 10; round++) {
        REFIT_ASSERT_OK(b->ops->put(kv, "g/once", "old", 3, 1)); /* expires at once */
        msleep(3);
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, N);
        put_new_racer_t p[N];
        pthread_t th[N];
        for (int i = 0; i < N; i++) {
            p[i] = (put_new_racer_t){.b = b, .job = job, .start = &start};
            assert_int_equal(pthread_create(&th[i], NULL, put_new_racer, &p[i]), 0);
        }
        int won = 0;
        for (int i = 0; i < N; i++) {
            pthread_join(th[i], NULL);
            if (p[i].st == REFIT_OK) won++;
            else if (p[i].st != REFIT_ERR_BUSY) fail_msg("put_new: %s", refit_status_name(p[i].st));
        }
        pthread_barrier_destroy(&start);
        assert_int_equal(won, 1);
        REFIT_ASSERT_OK(b->ops->del(kv, "g/once"));
    }
    b->ops->close(kv);
}

/* ---- file backend specifics ---------------------------------------------- */

static void test_file_layout(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    REFIT_ASSERT_OK(refit_registry_put_manifest(r, "g", 0, "m", 1));
    char path[PATH_MAX + 128];
    snprintf(path, sizeof(path), "%s/%s/g%%2Fsrc%%2F0%%2Fmanifest", b->dir, job);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);

    /* A file that is not a registry file under a key's name. */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("hi", f);
    fclose(f);
    void *buf = NULL;
    size_t len = 0;
    REFIT_ASSERT_ERR(refit_registry_get_manifest(r, "g", 0, &buf, &len), REFIT_ERR_CORRUPT, "g%2Fsrc%2F0%2Fmanifest");

    /* Expired leases are removed from the directory by lease_count. */
    REFIT_ASSERT_OK(refit_registry_lease_acquire(r, "g", 1, "rd", 50));
    snprintf(path, sizeof(path), "%s/%s/g%%2Fv%%2F1%%2Flease%%2Frd", b->dir, job);
    assert_int_equal(stat(path, &sb), 0);
    msleep(100);
    assert_int_equal(count(r, "g", 1), 0);
    assert_int_equal(stat(path, &sb), -1);

    /* Stray files (foreign names, temp files) are not keys. */
    snprintf(path, sizeof(path), "%s/%s/g%%2Fv%%2F1%%2Flease%%ZZ", b->dir, job);
    f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(count(r, "g", 1), 0);
    refit_registry_close(r);
}

/* ---- authentication (docs/security.md) --------------------------------------------- */

/* The test secret, as it was before the first open took it out of the
 * environment (main). */
static char *g_secret;

/* A registry of the same job opened with another secret.  The next open
 * takes the test secret back from the environment. */
static refit_registry_t *open_with_secret(const backend_t *b, const char *job, const char *secret)
{
    setenv("REFIT_SECRET", secret, 1);
    refit_registry_t *r = NULL;
    REFIT_ASSERT_OK(refit_registry_open(b->url, job, &r));
    setenv("REFIT_SECRET", g_secret, 1);
    return r;
}

/* Entries written by someone without the job's secret are refused or, where
 * a listing only counts them, ignored: forged records, manifests, leases,
 * acks, the version 2^64-1. */
static void test_forged_entries(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    refit_registry_t *x = open_with_secret(b, job, "the attacker's own secret, wrong");
    /* Everything the attacker writes through a registry of its own fails our checks. */
    refit_version_record_t rec = rec_of(7, 0);
    REFIT_ASSERT_OK(refit_registry_publish(x, "g", 0, &rec));
    REFIT_ASSERT_OK(refit_registry_put_manifest(x, "g", 0, "forged manifest", 15));
    refit_version_record_t recs[1];
    uint8_t present[1];
    REFIT_ASSERT_ERR(refit_registry_records(r, "g", 1, recs, present), REFIT_ERR_AUTH, "g/src/0/rec");
    void *buf = NULL;
    size_t len = 0;
    REFIT_ASSERT_ERR(refit_registry_get_manifest(r, "g", 0, &buf, &len), REFIT_ERR_AUTH, "g/src/0/manifest");
    assert_null(buf);
    refit_source_info_t info = {.incarnation = 1, .pid = 1, .host = "h"};
    REFIT_ASSERT_OK(refit_registry_heartbeat(x, "g", 0, &info, 5000));
    uint8_t alive[1];
    REFIT_ASSERT_ERR(refit_registry_alive(r, "g", 1, alive, NULL), REFIT_ERR_AUTH, "g/src/0/hb");
    /* A forged lease does not hold the publisher; a forged ack does not count. */
    REFIT_ASSERT_OK(refit_registry_lease_acquire(x, "g", 3, "ghost", 5000));
    assert_int_equal(count(r, "g", 3), 0);
    REFIT_ASSERT_OK(refit_registry_lease_acquire(r, "g", 3, "real", 5000));
    assert_int_equal(count(r, "g", 3), 1);
    REFIT_ASSERT_OK(refit_registry_ack(x, "g", "ghost", UINT64_MAX - 1));
    uint32_t n = 99;
    REFIT_ASSERT_OK(refit_registry_acks(r, "g", 1, &n));
    assert_int_equal(n, 0);
    REFIT_ASSERT_OK(refit_registry_ack(r, "g", "real", 2));
    REFIT_ASSERT_OK(refit_registry_acks(r, "g", 1, &n));
    assert_int_equal(n, 1);
    /* The reserved version: never written, never read, even when signed. */
    REFIT_ASSERT_ERR(refit_registry_ack(r, "g", "real", UINT64_MAX), REFIT_ERR_INVALID_ARG, "reserved");
    rec = rec_of(UINT64_MAX, 0);
    REFIT_ASSERT_ERR(refit_registry_publish(r, "g", 0, &rec), REFIT_ERR_INVALID_ARG, "reserved");
    uint8_t raw[56];
    rec = rec_of(5, 0);
    REFIT_ASSERT_OK(refit_registry_publish(r, "g", 1, &rec));
    refit_kv_t *kv = open_kv(b, job);
    void *vals[1] = {NULL};
    size_t lens[1];
    const char *k1[1] = {"g/src/1/rec"};
    REFIT_ASSERT_OK(b->ops->get_many(kv, k1, 1, vals, lens));
    assert_int_equal(lens[0], 56 + 32);
    memcpy(raw, vals[0], 56);
    free(vals[0]);
    refit_put_le(raw + 8, UINT64_MAX, 8);
    refit_put_le(raw + 48, refit_hash64(raw, 48, 0x5246565231ULL), 8);
    REFIT_ASSERT_OK(refit_registry_put_signed(r, "g/src/1/rec", raw, 56, 0));
    refit_version_record_t recs2[2];
    uint8_t present2[2];
    REFIT_ASSERT_ERR(refit_registry_records(r, "g", 2, recs2, present2), REFIT_ERR_AUTH, "g/src/0/rec");
    REFIT_ASSERT_OK(b->ops->del(kv, "g/src/0/rec"));
    REFIT_ASSERT_ERR(refit_registry_records(r, "g", 2, recs2, present2), REFIT_ERR_CORRUPT, "reserved");
    b->ops->close(kv);
    refit_registry_close(x);
    refit_registry_close(r);
}

/* Fenced leases: take, renew and holds follow the lease's token; a lease
 * that vanished (deleted, expired) cannot be renewed or relied on. */
static void test_fenced_lease(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    uint64_t t1 = 0, t2 = 0;
    REFIT_ASSERT_OK(refit_registry_lease_take(r, "g", 4, "rd", 5000, &t1));
    assert_true(t1 != 0);
    REFIT_ASSERT_OK(refit_registry_lease_holds(r, "g", 4, "rd", t1));
    REFIT_ASSERT_OK(refit_registry_lease_renew(r, "g", 4, "rd", 5000, t1));
    REFIT_ASSERT_ERR(refit_registry_lease_holds(r, "g", 4, "rd", t1 + 1), REFIT_ERR_STALE, "another token");
    REFIT_ASSERT_ERR(refit_registry_lease_renew(r, "g", 4, "rd", 5000, t1 + 1), REFIT_ERR_STALE, "lost");
    assert_int_equal(count(r, "g", 4), 1);
    /* Deleted under the reader. */
    REFIT_ASSERT_OK(refit_registry_lease_release(r, "g", 4, "rd"));
    REFIT_ASSERT_ERR(refit_registry_lease_holds(r, "g", 4, "rd", t1), REFIT_ERR_STALE, "lost during the transfer");
    REFIT_ASSERT_ERR(refit_registry_lease_renew(r, "g", 4, "rd", 5000, t1), REFIT_ERR_STALE, "was lost");
    assert_int_equal(count(r, "g", 4), 0); /* a failed renewal leaves nothing behind */
    /* Expired under the reader. */
    REFIT_ASSERT_OK(refit_registry_lease_take(r, "g", 4, "rd", 100, &t2));
    assert_true(t2 != t1);
    msleep(250);
    REFIT_ASSERT_ERR(refit_registry_lease_renew(r, "g", 4, "rd", 5000, t2), REFIT_ERR_STALE, "lost");
    /* Retired: no new lease. */
    REFIT_ASSERT_OK(refit_registry_retire(r, "g", 4));
    REFIT_ASSERT_ERR(refit_registry_lease_take(r, "g", 4, "rd", 5000, &t2), REFIT_ERR_STALE, "retired");
    refit_registry_close(r);
}

/* The epoch: made once, stable, replaced when the store loses it. */
static void test_epoch(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    refit_registry_t *r2 = open_job(b, job);
    uint64_t e1 = 0, e2 = 0, e3 = 0;
    bool created = false;
    REFIT_ASSERT_OK(refit_registry_epoch(r, &e1, &created));
    assert_true(created && e1 != 0);
    REFIT_ASSERT_OK(refit_registry_epoch(r2, &e2, &created));
    assert_false(created);
    assert_true(e1 == e2);
    refit_kv_t *kv = open_kv(b, job);
    REFIT_ASSERT_OK(b->ops->del(kv, "epoch")); /* the store lost its data */
    REFIT_ASSERT_OK(refit_registry_epoch(r2, &e3, &created));
    assert_true(created && e3 != e1);
    /* Forged (no tag), or signed but no epoch: replaced by a fresh authentic
     * epoch, as if the store had lost it -- before, every later call failed
     * (REFIT_ERR_AUTH, REFIT_ERR_CORRUPT) until someone deleted the key. */
    REFIT_ASSERT_OK(b->ops->put(kv, "epoch", "12345678", 8, 0));
    uint64_t e4 = 0, e5 = 0;
    REFIT_ASSERT_OK(refit_registry_epoch(r, &e4, &created));
    assert_true(created && e4 != e3 && e4 != refit_get_le((const uint8_t *)"12345678", 8));
    REFIT_ASSERT_OK(refit_registry_epoch(r2, &e5, &created));
    assert_false(created);
    assert_true(e5 == e4);
    REFIT_ASSERT_OK(refit_registry_put_signed(r, "epoch", "\0\0\0\0\0\0\0\0", 8, 0)); /* signed, zero */
    REFIT_ASSERT_OK(refit_registry_epoch(r2, &e5, &created));
    assert_true(created && e5 != 0 && e5 != e4);
    REFIT_ASSERT_OK(refit_registry_put_signed(r, "epoch", "abc", 3, 0)); /* signed, 3 bytes */
    REFIT_ASSERT_OK(refit_registry_epoch(r, &e4, &created));
    assert_true(created && e4 != 0 && e4 != e5);
    REFIT_ASSERT_OK(refit_registry_epoch(r2, &e5, &created));
    assert_true(!created && e5 == e4);
    b->ops->close(kv);
    refit_registry_close(r2);
    refit_registry_close(r);
}

/* ---- a forged or deleted epoch does not stop a job (issue 28) ------------- */

#define EPOCH_MODEL "tiny-moe"
#define EPOCH_SRC "megatron:tp=1"
#define EPOCH_DST "vllm:tp=1"

/* A snapshot publisher in this process with short dead and lease times
 * (fencing waits 300 ms, a staging arena's readers get 4 * 200 + 300 ms). */
static refit_publisher_t *epoch_publisher(const backend_t *b, const char *job, void **base)
{
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = b->url;
    pp.job = job;
    pp.transports = "shm";
    pp.mode = REFIT_MODE_SNAPSHOT;
    pp.heartbeat_ms = 50;
    pp.dead_ms = 200;
    pp.lease_ms = 300;
    refit_publisher_t *p = NULL;
    REFIT_ASSERT_OK(refit_publisher_create(&pp, t_manifest_named(EPOCH_MODEL, EPOCH_SRC, 0), &p));
    REFIT_ASSERT_OK(refit_publisher_alloc(p, 0, base));
    return p;
}

static refit_receiver_t *epoch_receiver(const backend_t *b, const char *job, void **base)
{
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = b->url;
    rp.job = job;
    rp.transports = "shm";
    rp.verify = REFIT_VERIFY_TRUTH;
    rp.lease_ms = 300;
    rp.threads = 1;
    refit_receiver_t *r = NULL;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(EPOCH_MODEL, EPOCH_DST, 0), &r));
    REFIT_ASSERT_OK(refit_receiver_alloc(r, 0, base));
    return r;
}

static void epoch_publish(refit_publisher_t *p, const refit_manifest_t *m, void *base, uint64_t v)
{
    REFIT_ASSERT_OK(refit_truth_fill(m, &base, v));
    REFIT_ASSERT_OK(refit_publisher_publish(p, v));
}

/* Pulls v (or the newest) and checks the receiver's memory is that version's truth. */
static void epoch_pull(refit_receiver_t *r, const refit_manifest_t *dm, void *base, uint64_t v)
{
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_OK(refit_receiver_pull(r, v, 5000, &rep));
    assert_int_equal(rep.version, v);
    REFIT_ASSERT_OK(refit_truth_verify(dm, (const void *const *)&base, v, NULL));
}

/* A forged epoch value (no tag) before the first publish and again between
 * publishes: the publisher publishes (its snapshot arenas reused: the wait
 * fences once), a receiver commits each version, and the store ends with an
 * authentic epoch.  Before: the first publish failed with REFIT_ERR_AUTH
 * ("key epoch is not signed"), and so did every one after. */
static void test_epoch_forged_publish(void **state)
{
    backend_t *b = need(state);
    char job[32];
    new_job(job);
    refit_kv_t *kv = open_kv(b, job);
    REFIT_ASSERT_OK(b->ops->put(kv, "epoch", "forged!!", 8, 0));
    void *pb = NULL, *rb = NULL;
    refit_publisher_t *p = epoch_publisher(b, job, &pb);
    refit_receiver_t *r = epoch_receiver(b, job, &rb);
    refit_manifest_t *sm = t_manifest_named(EPOCH_MODEL, EPOCH_SRC, 0),
                     *dm = t_manifest_named(EPOCH_MODEL, EPOCH_DST, 0);
    epoch_publish(p, sm, pb, 1);
    epoch_pull(r, dm, rb, 1);
    for (uint64_t v = 2; v <= 4; v++) {
        REFIT_ASSERT_OK(b->ops->put(kv, "epoch", "forged!!", 8, 0));
        epoch_publish(p, sm, pb, v);
        epoch_pull(r, dm, rb, v);
    }
    refit_registry_t *reg = open_job(b, job);
    uint64_t e = 0, e2 = 0;
    bool created = true;
    REFIT_ASSERT_OK(refit_registry_epoch(reg, &e, &created));
    assert_false(created);
    REFIT_ASSERT_OK(refit_registry_epoch(reg, &e2, &created));
    assert_true(e == e2 && !created);
    refit_registry_close(reg);
    refit_receiver_destroy(r);
    refit_publisher_destroy(p);
    refit_manifest_destroy(sm);
    refit_manifest_destroy(dm);
    b->ops->close(kv);
}

typedef struct {
    const backend_t *b;
    const char *job;
    volatile int stop;
    unsigned deletes;
} epoch_deleter_t;

static void *epoch_deleter(void *arg)
{
    epoch_deleter_t *d = arg;
    refit_kv_t *kv = open_kv(d->b, d->job);
    while (!d->stop) {
        if (d->b->ops->del(kv, "epoch") == REFIT_OK) d->deletes++;
        msleep(10);
    }
    d->b->ops->close(kv);
    return NULL;
}

/* `epoch` deleted every 10 ms for 2.5 s while snapshot publishes (and pulls)
 * go on: every publish succeeds, each fencing at most one lease lifetime
 * (300 ms here); a receiver commits every version.  Before: the fence
 * restarted at every new epoch, and the first publish that reused a staging
 * arena failed after dead_ms * 4 + lease_ms with REFIT_ERR_TIMEOUT ("the
 * registry lost its data"). */
static void test_epoch_deleted_repeatedly(void **state)
{
    backend_t *b = need(state);
    char job[32];
    new_job(job);
    void *pb = NULL, *rb = NULL;
    refit_publisher_t *p = epoch_publisher(b, job, &pb);
    refit_receiver_t *r = epoch_receiver(b, job, &rb);
    refit_manifest_t *sm = t_manifest_named(EPOCH_MODEL, EPOCH_SRC, 0),
                     *dm = t_manifest_named(EPOCH_MODEL, EPOCH_DST, 0);
    epoch_publish(p, sm, pb, 1);
    epoch_pull(r, dm, rb, 1);
    epoch_deleter_t d = {b, job, 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, epoch_deleter, &d), 0);
    double t0 = refit_now();
    uint64_t v = 1;
    double slowest = 0;
    while (ms_since(t0) < 2500) {
        double t1 = refit_now();
        v++;
        epoch_publish(p, sm, pb, v);
        slowest = REFIT_MAX(slowest, ms_since(t1));
        epoch_pull(r, dm, rb, v);
    }
    d.stop = 1;
    pthread_join(th, NULL);
    print_message("epoch deleted %u times; %" PRIu64 " publishes, the slowest %.0f ms\n", d.deletes, v - 1, slowest);
    assert_true(d.deletes > 50);
    assert_true(v >= 4); /* versions 3 and on reused an arena: waited, fenced, succeeded */
    assert_true(slowest < 4 * 200 + 300);
    epoch_publish(p, sm, pb, v + 1);
    epoch_pull(r, dm, rb, v + 1);
    refit_receiver_destroy(r);
    refit_publisher_destroy(p);
    refit_manifest_destroy(sm);
    refit_manifest_destroy(dm);
}

/* Where the secret comes from, and the checks on secret files. */
static void test_secret_sources(void **state)
{
    backend_t *b = need(state);
    char job[32], path[PATH_MAX + 64];
    new_job(job);
    snprintf(path, sizeof(path), "%s/secret-%s", b->dir[0] ? b->dir : "/tmp", job);
    char *saved = strdup(g_secret);
    unsetenv("REFIT_SECRET");
    refit_registry_forget_env_secret();
    refit_registry_t *r = NULL;
    refit_registry_auth_t auth = {path, false};
    /* Missing, too short, too open, not a regular file. */
    REFIT_ASSERT_ERR(refit_registry_open_auth(b->url, job, &auth, &r), REFIT_ERR_AUTH, path);
    FILE *f = fopen(path, "w");
    fputs("short", f);
    fclose(f);
    chmod(path, 0600);
    REFIT_ASSERT_ERR(refit_registry_open_auth(b->url, job, &auth, &r), REFIT_ERR_AUTH, "want 16..4096");
    f = fopen(path, "w");
    fputs("a perfectly good secret of enough bytes", f);
    fclose(f);
    chmod(path, 0644);
    REFIT_ASSERT_ERR(refit_registry_open_auth(b->url, job, &auth, &r), REFIT_ERR_AUTH, "chmod 600");
    chmod(path, 0600);
    REFIT_ASSERT_OK(refit_registry_open_auth(b->url, job, &auth, &r));
    assert_true(refit_registry_secure(r));
    assert_non_null(strstr(refit_registry_secret_source(r), path));
    REFIT_ASSERT_OK(refit_registry_put_manifest(r, "g", 0, "m", 1));
    refit_registry_close(r);
    /* The same secret through the environment reads it back. */
    setenv("REFIT_SECRET_FILE", path, 1);
    REFIT_ASSERT_OK(refit_registry_open(b->url, job, &r));
    void *buf = NULL;
    size_t len = 0;
    REFIT_ASSERT_OK(refit_registry_get_manifest(r, "g", 0, &buf, &len));
    free(buf);
    refit_registry_close(r);
    unsetenv("REFIT_SECRET_FILE");
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    REFIT_ASSERT_ERR(refit_registry_open_auth(b->url, job, &auth, &r), REFIT_ERR_AUTH, "not a regular file");
    unlink(path);
    /* Nothing given: file registries make one in the job directory; redis refuses. */
    if (!strcmp(b->name, "file")) {
        refit_registry_t *r2 = NULL;
        REFIT_ASSERT_OK(refit_registry_open(b->url, job, &r));
        REFIT_ASSERT_OK(refit_registry_open(b->url, job, &r2));
        assert_string_equal(refit_registry_secret_source(r), "job directory");
        assert_memory_equal(refit_registry_key(r, REFIT_KEY_CONNECTION), refit_registry_key(r2, REFIT_KEY_CONNECTION),
                            32);
        snprintf(path, sizeof(path), "%s/%s/.secret", b->dir, job);
        struct stat sb;
        assert_int_equal(stat(path, &sb), 0);
        assert_int_equal(sb.st_mode & 0777, 0600);
        assert_int_equal(sb.st_size, 32);
        refit_registry_close(r2);
        refit_registry_close(r);
        chmod(path, 0644);
        REFIT_ASSERT_ERR(refit_registry_open(b->url, job, &r), REFIT_ERR_AUTH, ".secret");
    } else {
        REFIT_ASSERT_ERR(refit_registry_open(b->url, job, &r), REFIT_ERR_AUTH, "REFIT_SECRET_FILE");
    }
    /* Insecure: a public key, said as such. */
    setenv("REFIT_INSECURE", "1", 1);
    char job2[32];
    REFIT_ASSERT_OK(refit_registry_open(b->url, new_job(job2), &r));
    assert_false(refit_registry_secure(r));
    assert_string_equal(refit_registry_secret_source(r), "insecure");
    refit_registry_close(r);
    unsetenv("REFIT_INSECURE");
    setenv("REFIT_SECRET", saved, 1);
    free(saved);
}

/* The file registry's directory is a trust boundary: ours, 0700, files 0600;
 * a directory others may write, or under a parent they own, is refused. */
static void test_file_permissions(void **state)
{
    backend_t *b = need(state);
    char job[32], path[PATH_MAX + 128];
    refit_registry_t *r = open_job(b, new_job(job));
    REFIT_ASSERT_OK(refit_registry_put_manifest(r, "g", 0, "m", 1));
    refit_registry_close(r);
    struct stat sb;
    snprintf(path, sizeof(path), "%s/%s", b->dir, job);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0700);
    snprintf(path, sizeof(path), "%s/%s/g%%2Fsrc%%2F0%%2Fmanifest", b->dir, job);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    /* A job directory others may write (as a pre-created 0777 one in /tmp). */
    snprintf(path, sizeof(path), "%s/%s", b->dir, job);
    chmod(path, 0777);
    REFIT_ASSERT_ERR(refit_registry_open(b->url, job, &r), REFIT_ERR_AUTH, "writable by group or others");
    chmod(path, 0700);
    /* A registry under a non-sticky directory others may write. */
    char top[PATH_MAX + 64], url[PATH_MAX + 96];
    snprintf(top, sizeof(top), "%s/open-%s", b->dir, job);
    assert_int_equal(mkdir(top, 0777), 0);
    chmod(top, 0777);
    snprintf(url, sizeof(url), "file:%s/reg", top);
    REFIT_ASSERT_ERR(refit_registry_open(url, job, &r), REFIT_ERR_AUTH, "its parent");
    chmod(top, 01777); /* sticky, as /tmp: fine */
    REFIT_ASSERT_OK(refit_registry_open(url, job, &r));
    refit_registry_close(r);
    /* Acks expire (about an hour after the reader's last report): the file's expiry field is set. */
    r = open_job(b, job);
    REFIT_ASSERT_OK(refit_registry_ack(r, "g", "rd", 3));
    refit_registry_close(r);
    snprintf(path, sizeof(path), "%s/%s/g%%2Fack%%2Frd", b->dir, job);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t hdr[16];
    assert_int_equal(fread(hdr, 1, 16, f), 16);
    fclose(f);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t expiry = refit_get_le(hdr + 8, 8),
             now_ms = (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
    assert_true(expiry > now_ms + 50u * 60u * 1000u && expiry < now_ms + 70u * 60u * 1000u);
    /* The default registry is never under a world-writable directory. */
    pid_t kid = fork();
    if (kid == 0) {
        unsetenv("REFIT_REGISTRY");
        setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
        _exit(strcmp(refit_default_registry(), "file:/run/user/4242/refit/registry") == 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(kid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    kid = fork();
    if (kid == 0) {
        unsetenv("REFIT_REGISTRY");
        unsetenv("XDG_RUNTIME_DIR");
        setenv("HOME", "/home/someone", 1);
        _exit(strcmp(refit_default_registry(), "file:/home/someone/.cache/refit/registry") == 0 ? 0 : 1);
    }
    waitpid(kid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* Names that would leave the directory. */
    REFIT_ASSERT_ERR(refit_registry_open(b->url, "..", &r), REFIT_ERR_INVALID_ARG, "not starting with '.'");
    REFIT_ASSERT_ERR(refit_registry_open(b->url, ".hidden", &r), REFIT_ERR_INVALID_ARG, "job name");
}

/* A child's answer: 0, or the number of the check that failed. */
static int child_status(pid_t kid)
{
    int status = 0;
    waitpid(kid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

/* With neither XDG_RUNTIME_DIR nor HOME (containers, env -i, su), the
 * default registry is never under /tmp, where another user could create
 * /tmp/refit-<uid> first: the home directory of the passwd entry, else
 * none, and opening it says what to set. */
static void test_default_registry_private(void **state)
{
    (void)state;
    pid_t kid = fork();
    if (kid == 0) {
        unsetenv("REFIT_REGISTRY");
        unsetenv("XDG_RUNTIME_DIR");
        unsetenv("HOME");
        struct passwd *pw = getpwuid(geteuid());
        char want[4200];
        snprintf(want, sizeof(want), "file:%s/.cache/refit/registry", pw ? pw->pw_dir : "?");
        if (!pw || pw->pw_dir[0] != '/' || !strcmp(pw->pw_dir, "/")) _exit(0); /* nothing to compare with */
        _exit(strcmp(refit_default_registry(), want) == 0 ? 0 : 1);
    }
    assert_int_equal(child_status(kid), 0);
    if (geteuid() != 0) {
        print_message("[  SKIPPED ] a user without a passwd entry needs root (setresuid)\n");
        return;
    }
    kid = fork();
    if (kid == 0) {
        unsetenv("REFIT_REGISTRY");
        unsetenv("XDG_RUNTIME_DIR");
        unsetenv("HOME");
        uid_t uid = 54321;
        while (getpwuid(uid)) uid++;
        if (setresgid(uid, uid, uid) || setresuid(uid, uid, uid)) _exit(2);
        const char *url = refit_default_registry();
        if (strncmp(url, "file:/tmp", 9) == 0) _exit(3);
        if (url[0]) _exit(4);
        refit_registry_t *r = NULL;
        refit_status_t st = refit_registry_open(url, "j", &r);
        _exit(st == REFIT_ERR_INVALID_ARG && strstr(refit_last_error(), "set HOME") ? 0 : 5);
    }
    assert_int_equal(child_status(kid), 0);
}

/* Checks of test_file_fifo, run in a child: 0 when every call refused the
 * file that is not a regular file with REFIT_ERR_CORRUPT naming it, else the
 * number of the check that failed. */
static int fifo_checks(const backend_t *b, const char *job)
{
    char path[PATH_MAX + 128], *dir = path;
    refit_registry_t *r = NULL;
    if (refit_registry_open(b->url, job, &r)) return 1;
    /* A key's value replaced by a FIFO: a receiver reading the manifest. */
    snprintf(path, sizeof(path), "%s/%s/g%%2Fsrc%%2F0%%2Fmanifest", b->dir, job);
    if (unlink(path) != 0 || mkfifo(path, 0600) != 0) return 2;
    void *buf = NULL;
    size_t len = 0;
    refit_status_t st = refit_registry_get_manifest(r, "g", 0, &buf, &len);
    if (st != REFIT_ERR_CORRUPT || !strstr(refit_last_error(), "manifest is a FIFO")) return 3;
    /* The job's epoch (every publisher reads it when it starts). */
    snprintf(path, sizeof(path), "%s/%s/epoch", b->dir, job);
    unlink(path);
    if (mkfifo(path, 0600) != 0) return 4;
    st = refit_registry_epoch(r, &(uint64_t){0}, NULL);
    if (st != REFIT_ERR_CORRUPT || !strstr(refit_last_error(), "epoch is a FIFO")) return 5;
    /* Listing reads every key it names. */
    refit_kv_t *kv = NULL;
    if (b->ops->open(b->rest, job, &kv)) return 6;
    char **keys = NULL;
    size_t n = 0;
    st = b->ops->list(kv, "g/", &keys, &n);
    if (st != REFIT_ERR_CORRUPT || !strstr(refit_last_error(), "FIFO")) return 7;
    /* A symbolic link under a key's name is not followed (to another job's value, say). */
    snprintf(path, sizeof(path), "%s/%s/g%%2Fsrc%%2F0%%2Fmanifest", b->dir, job);
    unlink(path);
    if (symlink("epoch", path) != 0) return 8;
    st = refit_registry_get_manifest(r, "g", 0, &buf, &len);
    if (st != REFIT_ERR_CORRUPT || !strstr(refit_last_error(), "symbolic link")) return 9;
    b->ops->close(kv);
    refit_registry_close(r);
    /* The job's .lock as a FIFO: opening the registry refuses it. */
    char job2[40];
    snprintf(job2, sizeof(job2), "%s-lock", job);
    snprintf(dir, sizeof(path), "%s/%s", b->dir, job2);
    if (mkdir(dir, 0700) != 0) return 10;
    snprintf(path, sizeof(path), "%s/%s/.lock", b->dir, job2);
    if (mkfifo(path, 0600) != 0) return 11;
    st = b->ops->open(b->rest, job2, &kv);
    if (st != REFIT_ERR_CORRUPT || !strstr(refit_last_error(), ".lock is a FIFO")) return 12;
    return 0;
}

/* A FIFO (or a symbolic link) put in place of a value, the epoch or .lock:
 * every call answers at once with REFIT_ERR_CORRUPT naming the file, where a
 * blocking open() used to wait for a writer forever.  The checks run in a
 * child the test kills after 5 s (each should take microseconds). */
static void test_file_fifo(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    REFIT_ASSERT_OK(refit_registry_put_manifest(r, "g", 0, "m", 1));
    uint64_t e = 0;
    REFIT_ASSERT_OK(refit_registry_epoch(r, &e, NULL));
    refit_registry_close(r);
    double t0 = refit_now();
    pid_t kid = fork();
    assert_true(kid >= 0);
    if (kid == 0) _exit(fifo_checks(b, job));
    int status = 0;
    pid_t got = 0;
    while ((got = waitpid(kid, &status, WNOHANG)) == 0 && t_ms_since(t0) < 5000) msleep(5);
    if (got == 0) {
        kill(kid, SIGKILL);
        waitpid(kid, &status, 0);
        fail_msg("the file registry still blocked on a FIFO after %.0f ms", t_ms_since(t0));
    }
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) != 0) fail_msg("FIFO check %d failed", WEXITSTATUS(status));
    assert_true(t_ms_since(t0) < 2000);
}

/* ---- open errors ---------------------------------------------------------- */

static void test_open_errors(void **state)
{
    refit_registry_t *r = NULL;
    char dir[] = "/tmp/refit-reg-open-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char url[PATH_MAX + 16];
    snprintf(url, sizeof(url), "file:%s", dir);

    REFIT_ASSERT_ERR(refit_registry_open("nonsense", "j", &r), REFIT_ERR_INVALID_ARG, "nonsense");
    REFIT_ASSERT_ERR(refit_registry_open(":x", "j", &r), REFIT_ERR_INVALID_ARG, NULL);
    REFIT_ASSERT_ERR(refit_registry_open("file:", "j", &r), REFIT_ERR_INVALID_ARG, "file:");
    REFIT_ASSERT_ERR(refit_registry_open("ftp://h/x", "j", &r), REFIT_ERR_UNSUPPORTED, "ftp");
    REFIT_ASSERT_ERR(refit_registry_open(NULL, "j", &r), REFIT_ERR_INVALID_ARG, NULL);
#ifdef REFIT_HAVE_REDIS
    static const char *const bad_redis[] = {
        "redis:",         "redis://",      "redis://:6379", "redis://h:",   "redis://h:0",      "redis://h:65536",
        "redis://h:12ab", "redis://h:1/2", "redis:h:1",     "redis://[::1", "redis://h:1234567"};
    for (size_t i = 0; i < REFIT_ARRAY_LEN(bad_redis); i++)
        REFIT_ASSERT_ERR(refit_registry_open(bad_redis[i], "j", &r), REFIT_ERR_INVALID_ARG, NULL);
#else
    REFIT_ASSERT_ERR(refit_registry_open("redis://127.0.0.1:6379", "j", &r), REFIT_ERR_UNSUPPORTED, "hiredis");
#endif

    char long_job[66];
    memset(long_job, 'j', 65);
    long_job[65] = '\0';
    static const char *const bad_jobs[] = {"", "a/b", "a b", "a:b", "..%", "x\n"};
    for (size_t i = 0; i < REFIT_ARRAY_LEN(bad_jobs); i++)
        REFIT_ASSERT_ERR(refit_registry_open(url, bad_jobs[i], &r), REFIT_ERR_INVALID_ARG, "job");
    REFIT_ASSERT_ERR(refit_registry_open(url, long_job, &r), REFIT_ERR_INVALID_ARG, "job");
    REFIT_ASSERT_ERR(refit_registry_open(url, NULL, &r), REFIT_ERR_INVALID_ARG, "job");
    assert_null(r);
    long_job[64] = '\0';
    REFIT_ASSERT_OK(refit_registry_open(url, long_job, &r));
    assert_string_equal(refit_registry_url(r), url);
    refit_registry_close(r);
    r = NULL;

    /* A directory that cannot be created (a regular file is in the way;
     * permissions would not stop root). */
    char plain[PATH_MAX];
    snprintf(plain, sizeof(plain), "%s/plain", dir);
    FILE *f = fopen(plain, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(url, sizeof(url), "file:%s/sub", plain);
    REFIT_ASSERT_ERR(refit_registry_open(url, "j", &r), REFIT_ERR_REGISTRY, plain);
    snprintf(url, sizeof(url), "file:%s", plain);
    REFIT_ASSERT_ERR(refit_registry_open(url, "j", &r), REFIT_ERR_REGISTRY, "Not a directory");
    assert_null(r);
    t_rm_tree(dir);

#ifdef REFIT_HAVE_REDIS
    /* Nothing listening: REGISTRY, quickly, naming the address. */
    int port = t_free_port();
    assert_true(port > 0);
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
    char needle[64];
    snprintf(needle, sizeof(needle), "redis 127.0.0.1:%d: Connection refused", port);
    double t0 = refit_now();
    REFIT_ASSERT_ERR(refit_registry_open(url, "j", &r), REFIT_ERR_REGISTRY, needle);
    assert_true(ms_since(t0) < 2500.0);
    assert_null(r);
#endif
}

/* ---- redis going away and coming back ------------------------------------- */

static void test_redis_restart(void **state)
{
    backend_t *b = need(state);
    double t_start = refit_now();
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    REFIT_ASSERT_OK(refit_registry_put_manifest(r, "g", 0, "m", 1));
    REFIT_ASSERT_OK(refit_registry_wait(r, 2000)); /* our own put's event */

    stop_redis(b);
    char needle[64];
    snprintf(needle, sizeof(needle), "redis 127.0.0.1:%d", b->port);
    void *buf = NULL;
    size_t len = 0;
    double t0 = refit_now();
    REFIT_ASSERT_ERR(refit_registry_get_manifest(r, "g", 0, &buf, &len), REFIT_ERR_REGISTRY, needle);
    REFIT_ASSERT_ERR(refit_registry_put_manifest(r, "g", 0, "m", 1), REFIT_ERR_REGISTRY, "Connection refused");
    uint32_t n = 0;
    REFIT_ASSERT_ERR(refit_registry_lease_count(r, "g", 1, &n), REFIT_ERR_REGISTRY, "Connection refused");
    REFIT_ASSERT_ERR(refit_registry_wait(r, 1000), REFIT_ERR_REGISTRY, needle); /* subscriber lost */
    REFIT_ASSERT_ERR(refit_registry_wait(r, 1000), REFIT_ERR_REGISTRY, "Connection refused");
    double el = ms_since(t0);
    print_message("redis down: 5 calls failed in %.1f ms\n", el);
    assert_true(el < 2500.0);

    assert_true(start_redis(b));
    /* Back: calls reconnect (the data is gone: no persistence). */
    REFIT_ASSERT_ERR(refit_registry_get_manifest(r, "g", 0, &buf, &len), REFIT_ERR_NOT_FOUND, NULL);
    REFIT_ASSERT_OK(refit_registry_put_manifest(r, "g", 0, "m2", 2));
    REFIT_ASSERT_OK(refit_registry_get_manifest(r, "g", 0, &buf, &len));
    assert_int_equal(len, 2);
    free(buf);
    /* The first wait re-subscribes and reports a possible change at once. */
    t0 = refit_now();
    REFIT_ASSERT_OK(refit_registry_wait(r, 2000));
    assert_true(ms_since(t0) < 500.0);
    REFIT_ASSERT_ERR(refit_registry_wait(r, 100), REFIT_ERR_TIMEOUT, NULL);
    putter_t p = {.r = r, .delay_ms = 50};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, delayed_put, &p), 0);
    t0 = refit_now();
    REFIT_ASSERT_OK(refit_registry_wait(r, 5000));
    assert_true(ms_since(t0) < 1500.0);
    pthread_join(th, NULL);
    REFIT_ASSERT_OK(p.st);
    REFIT_ASSERT_OK(refit_registry_lease_acquire(r, "g", 1, "rd", 5000));
    assert_int_equal(count(r, "g", 1), 1);
    refit_registry_close(r);
    print_message("redis restart case: %.0f ms\n", ms_since(t_start));
}

/* A server that stops answering (SIGSTOP): calls fail after the 2 s I/O
 * timeout, waits just time out, and all is well once it answers again. */
static void test_redis_hang(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    REFIT_ASSERT_OK(refit_registry_put_manifest(r, "g", 0, "m", 1));
    REFIT_ASSERT_OK(refit_registry_wait(r, 2000));
    assert_int_equal(kill(b->server, SIGSTOP), 0);
    double t0 = refit_now();
    uint32_t n = 0;
    refit_status_t st = refit_registry_lease_count(r, "g", 1, &n);
    double el = ms_since(t0);
    REFIT_ASSERT_ERR(st, REFIT_ERR_REGISTRY, "no answer within 2000 ms");
    assert_true(el >= 1900.0 && el < 3500.0);
    REFIT_ASSERT_ERR(refit_registry_wait(r, 100), REFIT_ERR_TIMEOUT, NULL);
    assert_int_equal(kill(b->server, SIGCONT), 0);
    REFIT_ASSERT_OK(refit_registry_lease_count(r, "g", 1, &n));
    assert_int_equal(n, 0);
    refit_registry_close(r);
}

/* Sends one command on a fresh connection; true if the reply starts with want. */
static bool redis_raw(int port, const char *cmd, const char *want)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    struct timeval tv = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char buf[64] = {0};
    size_t len = strlen(cmd);
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && send(fd, cmd, len, MSG_NOSIGNAL) == (ssize_t)len &&
              recv(fd, buf, sizeof(buf) - 1, 0) > 0 && strncmp(buf, want, strlen(want)) == 0;
    close(fd);
    return ok;
}

/* The server drops our connection and we then write a large command: the
 * writes hit a reset socket (EPIPE), which must not kill the process with
 * SIGPIPE (its default action here); the backend then retries once on a
 * fresh connection, so the put succeeds. */
/* Redis ACL users: the registry authenticates with USER:PASSWORD from the
 * URL or $REFIT_REDIS_PASSWORD_FILE; a wrong password, none, or a user
 * scoped to another job's keys each fail clearly; the password never
 * appears in messages. */
static void test_redis_acl(void **state)
{
    backend_t *b = need(state);
    (void)b;
    t_redis_t rs = {0};
    /* Both job users get the same key pattern and commands; only the name and password differ. */
#define ACL_JOB_RIGHTS                                                                                              \
    "~refit:acljob:*", "&refit:acljob:events", "-@all", "+set", "+mget", "+del", "+scan", "+publish", "+subscribe", \
        "+ping"
    const char *extra[] = {"--user",       "default", "off",    "--user", "refitjob",   "on",           ">s3cret-pw",
                           ACL_JOB_RIGHTS, "--user",  "atuser", "on",     ">p@ss@w0rd", ACL_JOB_RIGHTS, NULL};
#undef ACL_JOB_RIGHTS
    assert_true(t_redis_start_with(&rs, 0, extra));
    char url[128], bad[128], anon[128], useronly[128];
    snprintf(url, sizeof(url), "redis://refitjob:s3cret-pw@127.0.0.1:%d", rs.port);
    snprintf(bad, sizeof(bad), "redis://refitjob:wrong@127.0.0.1:%d", rs.port);
    snprintf(anon, sizeof(anon), "redis://127.0.0.1:%d", rs.port);
    snprintf(useronly, sizeof(useronly), "redis://refitjob@127.0.0.1:%d", rs.port);
    refit_registry_t *r = NULL;
    REFIT_ASSERT_OK(refit_registry_open(url, "acljob", &r));
    assert_null(strstr(refit_registry_url(r), "s3cret"));
    assert_non_null(strstr(refit_registry_url(r), "refitjob:***@"));
    REFIT_ASSERT_OK(refit_registry_put_manifest(r, "g", 0, "m", 1));
    void *buf = NULL;
    size_t len = 0;
    REFIT_ASSERT_OK(refit_registry_get_manifest(r, "g", 0, &buf, &len));
    free(buf);
    refit_registry_close(r);
    /* A password holding '@': the last '@' ends it, and none of it shows. */
    char aturl[128];
    snprintf(aturl, sizeof(aturl), "redis://atuser:p@ss@w0rd@127.0.0.1:%d", rs.port);
    REFIT_ASSERT_OK(refit_registry_open(aturl, "acljob", &r));
    assert_null(strstr(refit_registry_url(r), "ss@"));
    assert_null(strstr(refit_registry_url(r), "w0rd"));
    assert_non_null(strstr(refit_registry_url(r), "atuser:***@127.0.0.1"));
    REFIT_ASSERT_OK(refit_registry_get_manifest(r, "g", 0, &buf, &len));
    free(buf);
    refit_registry_close(r);
    REFIT_ASSERT_ERR(refit_registry_open(bad, "acljob", &r), REFIT_ERR_AUTH, "AUTH as refitjob");
    assert_null(strstr(refit_last_error(), "wrong"));
    REFIT_ASSERT_ERR(refit_registry_open(anon, "acljob", &r), REFIT_ERR_REGISTRY, "NOAUTH");
    REFIT_ASSERT_ERR(refit_registry_open(url, "otherjob", &r), REFIT_ERR_REGISTRY, "NOPERM");
    /* The password from a file of ours. */
    char pwf[64];
    snprintf(pwf, sizeof(pwf), "/tmp/refit-redis-pw-%d", (int)getpid());
    FILE *f = fopen(pwf, "w");
    fputs("s3cret-pw\n", f);
    fclose(f);
    chmod(pwf, 0644);
    setenv("REFIT_REDIS_PASSWORD_FILE", pwf, 1);
    REFIT_ASSERT_ERR(refit_registry_open(useronly, "acljob", &r), REFIT_ERR_AUTH, "chmod 600");
    chmod(pwf, 0600);
    REFIT_ASSERT_OK(refit_registry_open(useronly, "acljob", &r));
    REFIT_ASSERT_OK(refit_registry_get_manifest(r, "g", 0, &buf, &len));
    free(buf);
    refit_registry_close(r);
    unsetenv("REFIT_REDIS_PASSWORD_FILE");
    unlink(pwf);
    REFIT_ASSERT_ERR(refit_registry_open(useronly, "acljob", &r), REFIT_ERR_AUTH, "without a password");
    t_redis_stop(&rs);
    t_rm_tree(rs.dir);
}

static void test_redis_sigpipe(void **state)
{
    backend_t *b = need(state);
    char job[32];
    refit_registry_t *r = open_job(b, new_job(job));
    REFIT_ASSERT_OK(refit_registry_put_manifest(r, "g", 0, "m", 1));
    assert_true(redis_raw(b->port, "CLIENT KILL TYPE normal\r\n", ":"));
    msleep(50);
    size_t big = 16u << 20;
    char *val = calloc(1, big);
    assert_non_null(val);
    refit_status_t st = refit_registry_put_manifest(r, "g", 0, val, big);
    print_message("large put on a killed connection: %s (%s)\n", refit_status_name(st), refit_last_error());
    REFIT_ASSERT_OK(st);
    val[big - 1] = 7;
    REFIT_ASSERT_OK(refit_registry_put_manifest(r, "g", 0, val, big));
    void *buf = NULL;
    size_t len = 0;
    REFIT_ASSERT_OK(refit_registry_get_manifest(r, "g", 0, &buf, &len));
    assert_int_equal(len, big);
    assert_int_equal(((char *)buf)[big - 1], 7);
    free(buf);
    free(val);
    refit_registry_close(r);
}

/* ---- the secret in memory (issue 28) -------------------------------------- */

/* Whether /proc/self/smaps marks the mapping holding addr "dd" (left out of core dumps). */
static bool mapping_dontdump(const void *addr)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return false;
    char line[512];
    bool in = false, dd = false;
    uintptr_t a = (uintptr_t)addr;
    while (fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = a >= lo && a < hi;
            continue;
        }
        if (in && !strncmp(line, "VmFlags:", 8)) {
            dd = strstr(line, " dd") != NULL;
            break;
        }
    }
    fclose(f);
    return dd;
}

/* Whether the n bytes at s occur in /proc/self/environ (the initial environment block). */
static bool in_proc_environ(const char *s, size_t n)
{
    static char buf[1 << 20];
    int fd = open("/proc/self/environ", O_RDONLY);
    if (fd < 0) return true;
    ssize_t got = read(fd, buf, sizeof(buf));
    close(fd);
    return got < 0 || memmem(buf, (size_t)got, s, n) != NULL;
}

#define SCRUB_FAIL(code, ...)                          \
    do {                                               \
        fprintf(stderr, "secret child: " __VA_ARGS__); \
        fprintf(stderr, "\n");                         \
        return code;                                   \
    } while (0)

/* The child of test_secret_out_of_dumps, started with $REFIT_SECRET in its
 * initial environment: opens a registry, then checks what a core dump or
 * /proc would show. */
static int secret_child(const char *url)
{
    char secret[128];
    const char *env = getenv("REFIT_SECRET");
    if (!env || strlen(env) >= sizeof(secret)) SCRUB_FAIL(10, "no usable REFIT_SECRET");
    snprintf(secret, sizeof(secret), "%s", env);
    size_t n = strlen(secret);
    if (!in_proc_environ(secret, n)) SCRUB_FAIL(11, "the secret is not in /proc/self/environ to begin with");
    refit_registry_t *r = NULL, *r2 = NULL;
    if (refit_registry_open(url, "scrub", &r)) SCRUB_FAIL(12, "open: %s", refit_last_error());
    if (refit_registry_put_manifest(r, "g", 0, "m", 1)) SCRUB_FAIL(12, "put: %s", refit_last_error());
    if (getenv("REFIT_SECRET")) SCRUB_FAIL(2, "getenv(\"REFIT_SECRET\") still returns it after the open");
    if (in_proc_environ(secret, n)) SCRUB_FAIL(3, "the secret's bytes are still in /proc/self/environ");
    if (!mapping_dontdump(refit_registry_key(r, REFIT_KEY_CONNECTION)))
        SCRUB_FAIL(4, "the derived keys are on pages a core dump includes (no dd in smaps VmFlags)");
    refit_digest_key_t *dk = NULL;
    if (refit_digest_key_create(refit_registry_key(r, REFIT_KEY_DIGEST), &dk) || !mapping_dontdump(dk))
        SCRUB_FAIL(4, "the digest key's tables are on pages a core dump includes");
    refit_digest_key_destroy(dk);
    /* A second open in this process, and one in a forked child, still have the secret. */
    if (refit_registry_open(url, "scrub", &r2)) SCRUB_FAIL(5, "second open: %s", refit_last_error());
    if (strcmp(refit_registry_secret_source(r2), "$REFIT_SECRET"))
        SCRUB_FAIL(5, "second open took its secret from %s", refit_registry_secret_source(r2));
    void *buf = NULL;
    size_t len = 0;
    if (refit_registry_get_manifest(r2, "g", 0, &buf, &len) || len != 1)
        SCRUB_FAIL(5, "second open does not authenticate: %s", refit_last_error());
    free(buf);
    if (memcmp(refit_registry_key(r, REFIT_KEY_CONNECTION), refit_registry_key(r2, REFIT_KEY_CONNECTION), 32))
        SCRUB_FAIL(5, "second open derived other keys");
    pid_t kid = fork();
    if (kid == 0) {
        refit_registry_t *r3 = NULL;
        void *b3 = NULL;
        size_t l3 = 0;
        _exit(refit_registry_open(url, "scrub", &r3) || refit_registry_get_manifest(r3, "g", 0, &b3, &l3) ? 1 : 0);
    }
    int status = 1;
    if (kid < 0 || waitpid(kid, &status, 0) != kid || !WIFEXITED(status) || WEXITSTATUS(status))
        SCRUB_FAIL(6, "a forked child could not open the registry with the secret");
    refit_registry_close(r2);
    refit_registry_close(r);
    return 0;
}

/* $REFIT_SECRET is taken out of the environment (getenv, and its bytes in
 * the initial block /proc/PID/environ shows) at the first open, the derived
 * keys and digest tables live on pages marked dontdump, and a second open
 * (and a forked child) still authenticate.  Run in a child exec'ed with the
 * secret in its initial environment.  Before: getenv still returned it (exit 2). */
static void test_secret_out_of_dumps(void **state)
{
    (void)state;
    char dir[] = "/tmp/refit-scrub-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char url[64], secret[64], sv[96], cv[96];
    snprintf(url, sizeof(url), "file:%s", dir);
    uint64_t rnd = 0;
    assert_int_equal(refit_random_bytes(&rnd, sizeof(rnd)), REFIT_OK);
    snprintf(secret, sizeof(secret), "scrub-test-secret-%016llx-end", (unsigned long long)rnd);
    snprintf(sv, sizeof(sv), "REFIT_SECRET=%s", secret);
    snprintf(cv, sizeof(cv), "REFIT_TEST_SECRET_CHILD=%s", url);
    extern char **environ;
    size_t ne = 0;
    while (environ[ne]) ne++;
    char **envp = calloc(ne + 3, sizeof(char *));
    assert_non_null(envp);
    size_t k = 0;
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "REFIT_SECRET", 12) && strncmp(environ[i], "REFIT_TEST_SECRET_CHILD=", 24))
            envp[k++] = environ[i];
    envp[k++] = sv;
    envp[k++] = cv;
    int errp[2];
    assert_int_equal(pipe(errp), 0);
    pid_t kid = fork();
    assert_true(kid >= 0);
    if (kid == 0) {
        dup2(errp[1], STDERR_FILENO);
        close(errp[0]);
        char *argv[] = {"test_registry", NULL};
        execve("/proc/self/exe", argv, envp);
        _exit(127);
    }
    close(errp[1]);
    char said[1024] = "";
    ssize_t got = 0, r;
    double t0 = refit_now();
    while ((size_t)got < sizeof(said) - 1 && (r = read(errp[0], said + got, sizeof(said) - 1 - (size_t)got)) > 0)
        got += r;
    close(errp[0]);
    int status = 0;
    assert_int_equal(waitpid(kid, &status, 0), kid);
    assert_true(ms_since(t0) < 20000);
    free(envp);
    t_rm_tree(dir);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("child exited %d: %s", WIFEXITED(status) ? WEXITSTATUS(status) : -1, said);
}

/* ---- main ------------------------------------------------------------------- */

#define BACKEND_TESTS(b)                                                                                          \
    cmocka_unit_test_prestate(test_manifest, &(b)), cmocka_unit_test_prestate(test_heartbeat, &(b)),              \
        cmocka_unit_test_prestate(test_records, &(b)), cmocka_unit_test_prestate(test_lease_basic, &(b)),         \
        cmocka_unit_test_prestate(test_lease_expiry, &(b)), cmocka_unit_test_prestate(test_retire, &(b)),         \
        cmocka_unit_test_prestate(test_lease_race, &(b)), cmocka_unit_test_prestate(test_wait, &(b)),             \
        cmocka_unit_test_prestate(test_remove_source, &(b)), cmocka_unit_test_prestate(test_corrupt, &(b)),       \
        cmocka_unit_test_prestate(test_kv_put_new, &(b)), cmocka_unit_test_prestate(test_kv_put_new_race, &(b)),  \
        cmocka_unit_test_prestate(test_forged_entries, &(b)), cmocka_unit_test_prestate(test_fenced_lease, &(b)), \
        cmocka_unit_test_prestate(test_epoch, &(b)), cmocka_unit_test_prestate(test_epoch_forged_publish, &(b)),  \
        cmocka_unit_test_prestate(test_epoch_deleted_repeatedly, &(b)),                                           \
        cmocka_unit_test_prestate(test_secret_sources, &(b))

int main(void)
{
    const char *child = getenv("REFIT_TEST_SECRET_CHILD");
    if (child) return secret_child(child);
    g_secret = strdup(getenv("REFIT_SECRET")); /* testutil sets one; opens take it out of the environment */
    const struct CMUnitTest file_tests[] = {
        BACKEND_TESTS(g_file),
        cmocka_unit_test_prestate(test_file_layout, &g_file),
        cmocka_unit_test_prestate(test_file_permissions, &g_file),
        cmocka_unit_test_prestate(test_file_fifo, &g_file),
    };
    const struct CMUnitTest redis_tests[] = {
        BACKEND_TESTS(g_redis),
        cmocka_unit_test_prestate(test_redis_restart, &g_redis),
        cmocka_unit_test_prestate(test_redis_hang, &g_redis),
        cmocka_unit_test_prestate(test_redis_sigpipe, &g_redis),
        cmocka_unit_test_prestate(test_redis_acl, &g_redis),
    };
    const struct CMUnitTest misc_tests[] = {
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_secret_out_of_dumps),
        cmocka_unit_test(test_default_registry_private),
    };
    int failed = cmocka_run_group_tests_name("registry misc", misc_tests, NULL, NULL);
    failed += cmocka_run_group_tests_name("registry file", file_tests, file_setup, file_teardown);
    failed += cmocka_run_group_tests_name("registry redis", redis_tests, redis_setup, redis_teardown);
    return failed;
}
