/* Replayed registry values (docs/security.md, issue 28): whoever can write the
 * store but has no secret can still put back any value it has seen - every
 * one carries a valid tag.  No such replay may make a receiver commit bytes
 * of another version than it reports, nor a version older than the newest
 * complete one.
 *
 * Publishers and receivers run in this process over the file registry and a
 * real Redis, through shm.  The store is read and written underneath the
 * registry, through its byte-only backend (registry/backend.h), exactly as a
 * writer without the secret can: values are copied verbatim, tags included.
 *
 * The walk: a job goes through versions with its sources at different
 * versions (pipeline, tensor and expert parallel ranks), the whole store
 * recorded after each step.  Then, for every key, every earlier value of it
 * (and its absence) is put back, and so is every earlier state of the whole
 * store; each time a fresh receiver pulls the newest version.  A pull either
 * fails, or commits a version at least the newest complete one whose every
 * byte is that version's (the synthetic truth, checked here, not by the
 * receiver). */
#include "testutil.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "refit/experimental/fp8.h"
#include "registry/backend.h"
#include "registry/registry.h"
#include "util/util.h"

#define MAX_KEYS 256
#define MAX_PUBS 8

/* ---- the store underneath the registry ------------------------------------ */

typedef struct {
    const refit_kv_ops_t *ops;
    refit_kv_t *kv;
} store_t;

typedef struct {
    size_t n;
    char *key[MAX_KEYS];
    void *val[MAX_KEYS];
    size_t len[MAX_KEYS];
} snap_t;

static void snap_free(snap_t *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->key[i]);
        free(s->val[i]);
    }
    s->n = 0;
}

/* Every key of the job and its raw value (tag included). */
static void snap_take(store_t *st, snap_t *s)
{
    char **keys = NULL;
    size_t n = 0;
    REFIT_ASSERT_OK(st->ops->list(st->kv, "", &keys, &n));
    assert_true(n <= MAX_KEYS);
    s->n = 0;
    for (size_t i = 0; i < n; i++) {
        void *v = NULL;
        size_t len = 0;
        const char *k = keys[i];
        REFIT_ASSERT_OK(st->ops->get_many(st->kv, &k, 1, &v, &len));
        if (v) {
            s->key[s->n] = keys[i];
            s->val[s->n] = v;
            s->len[s->n] = len;
            s->n++;
        } else {
            free(keys[i]); /* expired between list and get */
        }
    }
    free(keys);
}

static int snap_find(const snap_t *s, const char *key)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->key[i], key)) return (int)i;
    return -1;
}

static bool same_value(const snap_t *a, int i, const snap_t *b, int j)
{
    return i >= 0 && j >= 0 && a->len[i] == b->len[j] && !memcmp(a->val[i], b->val[j], a->len[i]);
}

/* key := its value in s (or deleted where s has none). */
static void put_back(store_t *st, const snap_t *s, const char *key)
{
    int i = snap_find(s, key);
    if (i < 0) REFIT_ASSERT_OK(st->ops->del(st->kv, key));
    else REFIT_ASSERT_OK(st->ops->put(st->kv, key, s->val[i], s->len[i], 0));
}

/* The whole store := s. */
static void restore_all(store_t *st, const snap_t *s, const snap_t *now)
{
    for (size_t i = 0; i < now->n; i++) put_back(st, s, now->key[i]);
    for (size_t i = 0; i < s->n; i++) put_back(st, s, s->key[i]);
}

/* ---- a job ------------------------------------------------------------------ */

typedef struct {
    const char *name;
    const char *model, *src, *dst; /* layouts of the sources and the receivers */
    refit_publish_mode_t mode;
    bool delta;
    bool relay; /* the committed receiver serves as a relay (slot 0) */
    bool redis;
    bool fp8; /* FP8 relays (group "fp8", one per rank of `dst`) feed FP8 receivers of vllm:tp=1 */
} scenario_t;

typedef struct {
    const scenario_t *sc;
    char dir[64], url[96], job[48], secret[96];
    t_redis_t redis;
    store_t store;
    uint32_t world;
    refit_publisher_t *pub[MAX_PUBS];
    refit_manifest_t *pm[MAX_PUBS];
    void *pbase[MAX_PUBS];
    uint64_t pver[MAX_PUBS];
    refit_fp8_relay_t *x[MAX_PUBS];
    uint32_t nx;
} job_t;

static void job_start(job_t *j, const scenario_t *sc)
{
    static int seq;
    memset(j, 0, sizeof(*j));
    j->sc = sc;
    snprintf(j->dir, sizeof(j->dir), "/tmp/refit-replay-XXXXXX");
    assert_non_null(mkdtemp(j->dir));
    snprintf(j->job, sizeof(j->job), "replay%d-%d", (int)getpid(), ++seq);
    snprintf(j->secret, sizeof(j->secret), "%s/secret", j->dir);
    int fd = open(j->secret, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    uint8_t key[32];
    assert_int_equal(getrandom(key, sizeof(key), 0), (ssize_t)sizeof(key));
    assert_int_equal(write(fd, key, sizeof(key)), (ssize_t)sizeof(key));
    close(fd);
    char rest[96];
    if (sc->redis) {
        assert_true(t_redis_start(&j->redis, 0));
        snprintf(j->url, sizeof(j->url), "redis://127.0.0.1:%d", j->redis.port);
        snprintf(rest, sizeof(rest), "//127.0.0.1:%d", j->redis.port);
#ifdef REFIT_HAVE_REDIS
        j->store.ops = &refit_kv_redis_ops;
#endif
    } else {
        snprintf(j->url, sizeof(j->url), "file:%s/reg", j->dir);
        snprintf(rest, sizeof(rest), "%s/reg", j->dir);
        j->store.ops = &refit_kv_file_ops;
    }
    assert_non_null(j->store.ops);
    refit_manifest_t *m0 = t_manifest_named(sc->model, sc->src, 0);
    refit_manifest_identity_t id;
    refit_manifest_identity(m0, &id);
    j->world = id.world;
    refit_manifest_destroy(m0);
    assert_true(j->world <= MAX_PUBS);
    for (uint32_t k = 0; k < j->world; k++) {
        refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
        pp.registry = j->url;
        pp.job = j->job;
        pp.transports = "shm";
        pp.mode = sc->mode;
        pp.secret_file = j->secret;
        pp.delta = sc->delta;
        pp.delta_threads = 1;
        pp.heartbeat_ms = 100;
        pp.dead_ms = 1500;
        pp.lease_ms = 1000;
        j->pm[k] = t_manifest_named(sc->model, sc->src, k);
        REFIT_ASSERT_OK(refit_publisher_create(&pp, j->pm[k], &j->pub[k]));
        REFIT_ASSERT_OK(refit_publisher_alloc(j->pub[k], 0, &j->pbase[k]));
    }
    /* The registry made the store; now open it underneath, as an intruder. */
    REFIT_ASSERT_OK(j->store.ops->open(rest, j->job, &j->store.kv));
}

static void job_stop(job_t *j)
{
    for (uint32_t k = 0; k < j->nx; k++) refit_fp8_relay_destroy(j->x[k]);
    for (uint32_t k = 0; k < j->world; k++) {
        refit_publisher_destroy(j->pub[k]);
        /* the publisher owns its manifest */
    }
    if (j->store.kv) j->store.ops->close(j->store.kv);
    if (j->sc->redis) t_redis_stop(&j->redis);
    t_rm_tree(j->dir);
}

/* Rank k publishes version v (in place: after its readers of the last one). */
static void publish(job_t *j, uint32_t k, uint64_t v)
{
    if (j->pver[k] && j->sc->mode == REFIT_MODE_IN_PLACE)
        REFIT_ASSERT_OK(refit_publisher_wait_readers(j->pub[k], j->pver[k], 5000));
    void *b = j->pbase[k];
    REFIT_ASSERT_OK(j->sc->delta ? refit_truth_fill_delta(j->pm[k], &b, v, 0.02) : refit_truth_fill(j->pm[k], &b, v));
    REFIT_ASSERT_OK(refit_publisher_publish(j->pub[k], v));
    j->pver[k] = v;
}

/* The FP8 arena of vllm:tp=1 rank 0 at version v, quantized here from the
 * truth (the reference), and its manifest in *m unless m is NULL. */
static unsigned char *fp8_reference(const job_t *j, uint64_t v, refit_manifest_t **m)
{
    refit_manifest_t *fm;
    unsigned char *ref = t_fp8_arena(j->sc->model, "vllm:tp=1", 0, v, &fm);
    if (m) *m = fm;
    else refit_manifest_destroy(fm);
    return ref;
}

static refit_receiver_t *receiver(const job_t *j, uint32_t rank, int slot, void **base)
{
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = j->url;
    rp.job = j->job;
    rp.transports = "shm";
    rp.secret_file = j->secret;
    rp.lease_ms = 1000;
    rp.threads = 1;
    rp.chunk_kb = 16;
    rp.relay_slot = slot;
    rp.relay_heartbeat_ms = 100;
    refit_manifest_t *m = t_manifest_named(j->sc->model, j->sc->dst, rank);
    if (j->sc->fp8 && slot == -2) { /* an FP8 receiver of the FP8 relays */
        refit_manifest_destroy(m);
        free(fp8_reference(j, 1, &m));
        rp.group = "fp8";
        rp.relay_slot = -1;
    }
    refit_receiver_t *r;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, m, &r));
    REFIT_ASSERT_OK(refit_receiver_alloc(r, 0, base));
    return r;
}

/* The FP8 relays of every rank of `dst` (bf16 receivers publishing FP8 arenas in group "fp8"). */
static void fp8_relays_start(job_t *j)
{
    refit_manifest_t *m0 = t_manifest_named(j->sc->model, j->sc->dst, 0);
    refit_manifest_identity_t id;
    refit_manifest_identity(m0, &id);
    refit_manifest_destroy(m0);
    j->nx = id.world;
    for (uint32_t k = 0; k < j->nx; k++) {
        char reader[32];
        snprintf(reader, sizeof(reader), "fp8relay%u", k);
        refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
        rp.registry = j->url;
        rp.job = j->job;
        rp.transports = "shm";
        rp.secret_file = j->secret;
        rp.reader = reader;
        rp.lease_ms = 1000;
        refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
        pp.registry = j->url;
        pp.job = j->job;
        pp.group = "fp8";
        pp.transports = "shm";
        pp.secret_file = j->secret;
        pp.heartbeat_ms = 100;
        pp.dead_ms = 1500;
        pp.lease_ms = 1000;
        REFIT_ASSERT_OK(refit_fp8_relay_create(&rp, &pp, t_manifest_named(j->sc->model, j->sc->dst, k), &j->x[k]));
    }
}

/* Whether base holds exactly the truth of version v (delta scenarios: the
 * delta truth) for destination rank `rank`. */
static bool holds(const job_t *j, uint32_t rank, void *base, uint64_t v, uint64_t *wrong)
{
    if (j->sc->fp8) { /* the FP8 receiver's arena against a reference quantization */
        refit_manifest_t *fm;
        unsigned char *ref = fp8_reference(j, v, &fm);
        uint64_t n = refit_manifest_region_size(fm, 0);
        *wrong = 0;
        for (uint64_t i = 0; i < n; i++) *wrong += ref[i] != ((unsigned char *)base)[i];
        refit_manifest_destroy(fm);
        free(ref);
        return *wrong == 0;
    }
    refit_manifest_t *m = t_manifest_named(j->sc->model, j->sc->dst, rank);
    refit_truth_report_t rep = REFIT_TRUTH_REPORT_INIT;
    refit_status_t st = j->sc->delta ? refit_truth_verify_delta(m, (const void *const *)&base, v, 0.02, &rep)
                                     : refit_truth_verify(m, (const void *const *)&base, v, &rep);
    refit_manifest_destroy(m);
    *wrong = rep.mismatches;
    return st == REFIT_OK;
}

typedef struct {
    uint32_t tries, committed, replay, stale, timeout, other;
} tally_t;

/* A fresh receiver pulls the newest version: a failure is fine; a commit
 * must be of a version >= min_ok holding exactly that version's bytes. */
static void fresh_pull(const job_t *j, uint64_t min_ok, const char *what, tally_t *t)
{
    void *base;
    refit_receiver_t *r = receiver(j, 0, j->sc->fp8 ? -2 : -1, &base);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    refit_status_t st = refit_receiver_pull(r, REFIT_VERSION_NEWEST, 150, &rep);
    t->tries++;
    if (st == REFIT_OK) {
        uint64_t wrong = 0;
        if (!holds(j, 0, base, rep.version, &wrong))
            fail_msg("%s: %s: committed version %llu with %llu wrong elements", j->sc->name, what,
                     (unsigned long long)rep.version, (unsigned long long)wrong);
        if (rep.version < min_ok)
            fail_msg("%s: %s: committed version %llu, older than the newest complete %llu (a rollback)", j->sc->name,
                     what, (unsigned long long)rep.version, (unsigned long long)min_ok);
        t->committed++;
    } else if (st == REFIT_ERR_REPLAY) {
        t->replay++;
    } else if (st == REFIT_ERR_STALE) {
        t->stale++;
    } else if (st == REFIT_ERR_TIMEOUT) {
        t->timeout++;
    } else {
        t->other++;
    }
    refit_receiver_destroy(r);
}

/* Replays every earlier value of every key of the store, one at a time, and
 * every earlier whole state; the store is put back as it was after each. */
static void walk(job_t *j, snap_t *hist, size_t nhist, uint64_t min_ok)
{
    snap_t now;
    snap_take(&j->store, &now);
    if (getenv("REPLAY_KEYS"))
        for (size_t i = 0; i < now.n; i++) print_message("key %s (%zu bytes)\n", now.key[i], now.len[i]);
    tally_t t = {0};
    fresh_pull(j, min_ok, "no replay", &t);
    for (size_t h = 0; h < nhist; h++) {
        snap_t *old = &hist[h];
        /* every key present then or now */
        for (int pass = 0; pass < 2; pass++) {
            const snap_t *keys = pass ? &now : old;
            for (size_t i = 0; i < keys->n; i++) {
                const char *key = keys->key[i];
                if (pass && snap_find(old, key) >= 0) continue; /* done in pass 0 */
                int a = snap_find(old, key), b = snap_find(&now, key);
                if (same_value(old, a, &now, b)) continue;
                char what[192];
                snprintf(what, sizeof(what), "%s of step %zu put back at %s", a >= 0 ? "value" : "absence", h + 1, key);
                put_back(&j->store, old, key);
                fresh_pull(j, min_ok, what, &t);
                put_back(&j->store, &now, key);
            }
        }
        char what[64];
        snprintf(what, sizeof(what), "the whole store of step %zu put back", h + 1);
        restore_all(&j->store, old, &now);
        fresh_pull(j, min_ok, what, &t);
        restore_all(&j->store, &now, old);
    }
    print_message("%s: %u replays: %u committed (verified), refused %u as replay, %u stale, %u timed out, %u other\n",
                  j->sc->name, t.tries, t.committed, t.replay, t.stale, t.timeout, t.other);
    /* The walk must have exercised the binding, not only the registry's own
     * refusals: some replay reaches the sources and is refused by their stamps. */
    assert_true(t.replay > 0);
    snap_free(&now);
}

/* Versions 1 and 2 everywhere (a receiver commits each, and relays it), then
 * rank 0 alone publishes 3: rank 0 ahead of the others. */
static void run_scenario(const scenario_t *sc)
{
    job_t j;
    job_start(&j, sc);
    snap_t hist[3];
    void *base = NULL;
    refit_receiver_t *keep = sc->fp8 ? NULL : receiver(&j, 0, sc->relay ? 0 : -1, &base);
    if (sc->fp8) fp8_relays_start(&j);
    refit_registry_t *reg;
    refit_registry_auth_t auth = {j.secret, false};
    REFIT_ASSERT_OK(refit_registry_open_auth(j.url, j.job, &auth, &reg));
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    for (uint64_t v = 1; v <= 2; v++) {
        for (uint32_t k = 0; k < j.world; k++) publish(&j, k, v);
        for (uint32_t k = 0; k < j.nx; k++) {
            refit_fp8_relay_report_t xr = REFIT_FP8_RELAY_REPORT_INIT;
            REFIT_ASSERT_OK(refit_fp8_relay_step(j.x[k], v, 10000, &xr));
        }
        if (keep) {
            REFIT_ASSERT_OK(refit_receiver_pull(keep, v, 10000, &rep));
            uint64_t wrong = 0;
            assert_true(holds(&j, 0, base, v, &wrong));
        }
        /* The store as it is while a reader holds a lease on v. */
        uint64_t token = 0;
        REFIT_ASSERT_OK(refit_registry_lease_take(reg, "trainer", v, "intruder-seen-reader", 60000, &token));
        snap_take(&j.store, &hist[v - 1]);
        REFIT_ASSERT_OK(refit_registry_lease_release(reg, "trainer", v, "intruder-seen-reader"));
    }
    if (sc->relay) {
        /* Relays: all sources at 2 (complete) and a relay serving it; a
         * fresh receiver may commit 2 from either. */
        walk(&j, hist, 2, 2);
    } else if (sc->fp8) {
        /* The FP8 relays hold 2 (complete); the trainer's rank 0 moves on. */
        publish(&j, 0, 3);
        snap_take(&j.store, &hist[2]);
        walk(&j, hist, 2, 2);
    } else {
        publish(&j, 0, 3);
        snap_take(&j.store, &hist[2]);
        walk(&j, hist, 2, 3); /* nothing complete now: no pull may commit */
    }
    refit_receiver_destroy(keep);
    refit_registry_close(reg);
    for (size_t h = 0; h < (sc->relay ? 2u : 3u); h++) snap_free(&hist[h]);
    (void)rep;
    job_stop(&j);
}

/* The attacks as found (issue 28), each refused by name.  `world` ranks of
 * tiny-dense in `src`; versions 1 then 2 on rank 0 only (all ranks when
 * world is 1); then rank 0's record of version 1 put back and v/1/retired
 * deleted, with nothing but the store's own operations. */
static void named_refusal(const char *src, refit_publish_mode_t mode, const char *needle)
{
    scenario_t sc = {"named", "tiny-dense", src, "vllm:tp=1", mode, .delta = false};
    job_t j;
    job_start(&j, &sc);
    for (uint32_t k = 0; k < j.world; k++) publish(&j, k, 1);
    snap_t v1;
    snap_take(&j.store, &v1);
    publish(&j, 0, 2);
    put_back(&j.store, &v1, "trainer/src/0/rec");
    REFIT_ASSERT_OK(j.store.ops->del(j.store.kv, "trainer/v/1/retired"));
    void *base;
    refit_receiver_t *r = receiver(&j, 0, -1, &base);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_ERR(refit_receiver_pull(r, REFIT_VERSION_NEWEST, 5000, &rep), REFIT_ERR_REPLAY, needle);
    assert_int_equal(refit_receiver_committed(r), 0);
    refit_receiver_destroy(r);
    snap_free(&v1);
    job_stop(&j);
}

/* Pipeline rank 0 at version 2, rank 1 at 1: before, a fresh receiver
 * committed "1" made of rank 0's 2 and rank 1's 1, every digest matching. */
static void mixed_commit_refused(void **state)
{
    (void)state;
    named_refusal("megatron:pp=2", REFIT_MODE_IN_PLACE, "source rank 0's buffer 0 holds version 2");
}

/* One rank in place: before, "1" holding 2's bytes. */
static void in_place_replay_refused(void **state)
{
    (void)state;
    named_refusal("megatron:tp=1", REFIT_MODE_IN_PLACE, "holds version 2, but the record read names version 1");
}

/* One rank, snapshot: 1 is still intact in its buffer, but 2 is published:
 * before, a receiver asking for the newest committed 1 (a rollback). */
static void snapshot_rollback_refused(void **state)
{
    (void)state;
    named_refusal("megatron:tp=1", REFIT_MODE_SNAPSHOT, "has published version 2, but the registry's record");
}

static void replay_pp_in_place(void **state)
{
    (void)state;
    scenario_t sc = {"pp=2 in place", "tiny-dense", "megatron:pp=2", "vllm:tp=1", REFIT_MODE_IN_PLACE, .delta = false};
    run_scenario(&sc);
}

static void replay_pp_snapshot(void **state)
{
    (void)state;
    scenario_t sc = {"pp=2 snapshot", "tiny-dense", "megatron:pp=2", "vllm:tp=2", REFIT_MODE_SNAPSHOT, .delta = false};
    run_scenario(&sc);
}

static void replay_tp_delta(void **state)
{
    (void)state;
    scenario_t sc = {"tp=2 delta", "tiny-dense", "megatron:tp=2", "vllm:tp=1", REFIT_MODE_IN_PLACE, .delta = true};
    run_scenario(&sc);
}

static void replay_relays(void **state)
{
    (void)state;
    scenario_t sc = {"tp=2 relays", "tiny-dense", "megatron:tp=2", "vllm:tp=2", REFIT_MODE_IN_PLACE, .relay = true};
    run_scenario(&sc);
}

static void replay_fp8_relays(void **state)
{
    (void)state;
    scenario_t sc = {"ep=2 fp8 relays", "tiny-fp8", "megatron:ep=2", "vllm:tp=2", REFIT_MODE_IN_PLACE, .fp8 = true};
    run_scenario(&sc);
}

static void replay_ep_redis(void **state)
{
    (void)state;
    if (!t_in_path("redis-server")) skip();
    scenario_t sc = {"ep=2 tp=2 redis", "tiny-moe",          "megatron:tp=2,ep=2",
                     "vllm:tp=2",       REFIT_MODE_IN_PLACE, .redis = true};
    run_scenario(&sc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mixed_commit_refused),
        cmocka_unit_test(in_place_replay_refused),
        cmocka_unit_test(snapshot_rollback_refused),
        cmocka_unit_test(replay_pp_in_place),
        cmocka_unit_test(replay_pp_snapshot),
        cmocka_unit_test(replay_tp_delta),
        cmocka_unit_test(replay_relays),
        cmocka_unit_test(replay_fp8_relays),
        cmocka_unit_test(replay_ep_redis),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
