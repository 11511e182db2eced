/* Receivers.
 *
 * pull():  discover -> lease -> (re)load changed manifests -> plan (cached by
 * signatures) -> connect peers (cached per source incarnation and buffer) ->
 * transfer (all transports, all sources) -> re-check that every source still
 * holds the version and is alive -> verify -> commit -> ack -> release.
 *
 * Discovery reads one record and one heartbeat per source rank (one round
 * trip each with Redis) and nothing else in steady state.
 *
 * Content digests: after the transfer (and the re-check of the sources),
 * the receiver hashes its own memory in canonical coordinates, fetches the
 * few entries of the sources' digest tables its boxes need (one transport
 * pull of 8-byte runs) and compares (data/digest.h), so that bytes that do
 * not match what the publishers published are never committed, whatever
 * carried them (relays, deltas, a torn read).  The receiver's
 * memory is marked unusable from the first byte written until a pull
 * completes, so a failed pull never passes for a good one. */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/digest.h"
#include "engine/engine.h"
#include "engine/metrics.h"
#include "engine/relay.h"
#include "engine/test_hooks.h"
#include "refit/delta.h"

#define PLAN_CACHE 4
#define MAX_BUFFERS 2

typedef struct {
    refit_manifest_t *m; /* decoded, NULL until fetched */
    uint64_t signature, incarnation;
    int transport;                                         /* index into ts, -1 none yet */
    uint64_t mkey;                                         /* refit_fleet_mirror_key(m) */
    refit_peer_t *peer[REFIT_MAX_TRANSPORTS][MAX_BUFFERS]; /* connected peers */
} source_t;

/* Delta refit: one source region the plan reads, its delta index (built
 * once per plan) and the buffer its deltas are fetched into. */
typedef struct {
    uint32_t src, region;
    refit_delta_index_t *ix;
    unsigned char *wire;
    uint64_t cap;
} delta_src_t;

typedef struct {
    refit_plan_key_t key;
    refit_plan_t *plan;
    uint64_t last_used;
    delta_src_t *dsrc; /* NULL until the first delta pull with this plan */
    uint32_t ndsrc;
    refit_digest_plan_t *dplan; /* NULL until the first verified pull with this plan */
    uint8_t *dusable;           /* the sources it was built for */
} cached_plan_t;

struct refit_receiver {
    refit_registry_t *reg;
    char group[104], reader[128];
    refit_manifest_t *m;
    refit_receiver_params_t params;
    refit_tset_t ts;
    uint32_t nregions;
    void **mem;
    bool *owned;
    void **stage;         /* pinned host staging for GPU memory pulled by host-only transports */
    uint64_t stage_version; /* the version the staging holds whole (0: none): a delta applies there */
    bool pull_staged;     /* this pull went through the staging */
    uint32_t world;
    source_t *src;
    cached_plan_t plans[PLAN_CACHE];
    uint64_t uses;
    uint64_t committed;
    uint64_t *committed_inc; /* per source rank: its incarnation when `committed` was pulled */
    bool usable;
    /* during a pull */
    uint64_t lease_version, lease_token;
    double lease_renewed;
    /* fleet (relay.c, fleet.c): relays, and the holders of the last pull */
    refit_relays_t *relays;
    refit_holder_stat_t *holders;
    size_t nholders;
    refit_digest_key_t *dkey; /* content digests; NULL with no_digest */
    refit_dsum_t *dlocal;     /* per destination placement */
};

static const char *or_default(const char *s, const char *d) { return s && s[0] ? s : d; }

refit_status_t refit_receiver_create(const refit_receiver_params_t *params, refit_manifest_t *m,
                                     refit_receiver_t **out)
{
    refit_status_t st;
    refit_receiver_params_t defaults = REFIT_RECEIVER_PARAMS_INIT;
    if (!m || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_receiver_create: NULL argument");
    if (params && (params->version < 1 || params->version > REFIT_RECEIVER_PARAMS_VERSION))
        return refit_error(REFIT_ERR_UNSUPPORTED, "receiver params version %u (this library knows 1..%u)",
                           params->version, REFIT_RECEIVER_PARAMS_VERSION);
    if (!m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "the receiver's manifest is not finalized");
    refit_receiver_t *r = calloc(1, sizeof(*r));
    if (!r) return refit_error(REFIT_ERR_NO_MEMORY, "receiver");
    r->params = defaults;
    if (params) /* version 1 ends before `device` */
        memcpy(&r->params, params,
               params->version == 1   ? offsetof(refit_receiver_params_t, device)
               : params->version == 2 ? offsetof(refit_receiver_params_t, relay_slot)
               : params->version == 3 ? offsetof(refit_receiver_params_t, no_delta)
               : params->version == 4 ? offsetof(refit_receiver_params_t, secret_file)
                                      : sizeof(refit_receiver_params_t));
    r->params.version = REFIT_RECEIVER_PARAMS_VERSION;
#ifndef REFIT_HAVE_CUDA
    if (r->params.device >= 0) {
        int dev = r->params.device;
        free(r);
        return refit_error(REFIT_ERR_UNSUPPORTED, "GPU memory (device %d) needs a refit built with CUDA", dev);
    }
#endif
    if (!(r->params.truth_fraction > 0 && r->params.truth_fraction < 1)) r->params.truth_fraction = 1;
    if (r->params.truth_fraction < 1 && r->params.device >= 0) {
        free(r);
        return refit_error(REFIT_ERR_UNSUPPORTED, "truth_fraction below 1 is verified on host memory only");
    }
    if (!r->params.lease_ms) r->params.lease_ms = 10000;
    snprintf(r->group, sizeof(r->group), "%s", or_default(r->params.group, "trainer"));
    if (r->params.reader && r->params.reader[0]) {
        snprintf(r->reader, sizeof(r->reader), "%s", r->params.reader);
    } else {
        char host[64];
        refit_hostname(host, sizeof(host));
        snprintf(r->reader, sizeof(r->reader), "%.60s:%d:r%u", host, (int)getpid(), m->rank);
    }
    r->nregions = (uint32_t)m->regions.len;
    r->mem = calloc(r->nregions ? r->nregions : 1, sizeof(void *));
    r->owned = calloc(r->nregions ? r->nregions : 1, sizeof(bool));
    r->stage = calloc(r->nregions ? r->nregions : 1, sizeof(void *));
    if (!r->mem || !r->owned || !r->stage) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "receiver");
        goto err;
    }
    if ((st = refit_check_name("group", r->group)) || (st = refit_check_name("reader", r->reader))) goto err;
    {
        refit_registry_auth_t auth = {r->params.secret_file, r->params.insecure};
        if ((st = refit_registry_open_auth(or_default(r->params.registry, refit_default_registry()),
                                           or_default(r->params.job, "default"), &auth, &r->reg)))
            goto err;
    }
    {
        char *opts = refit_options_for_device(r->params.transport_options, r->params.device, m->rank);
        if (!opts) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "receiver");
            goto err;
        }
        st = refit_tset_open(&r->ts, refit_transports_for_device(r->params.transports, r->params.device), opts,
                             refit_registry_key(r->reg, REFIT_KEY_CONNECTION));
        free(opts);
        if (st) goto err;
    }
    /* The fleet path (chunks, holders, relays) runs in host memory: a GPU
     * receiver takes it when none of its transports writes GPU memory, so
     * that every pull goes through its pinned staging anyway (relays then
     * serve from the staging). */
    bool host_path = r->params.device < 0;
    if (!host_path) {
        host_path = true;
        for (uint32_t t = 0; t < r->ts.n; t++)
            if (refit_transport_caps(r->ts.ops[t]) & REFIT_TCAP_DEVICE_DST) host_path = false;
    }
    if (host_path && (st = refit_relays_open(r->reg, r->group, m, &r->params, &r->relays))) goto err;
    if (!r->params.no_digest &&
        ((st = refit_digest_key_create(refit_registry_key(r->reg, REFIT_KEY_DIGEST), &r->dkey)) ||
         !(r->dlocal = calloc(m->placements.len ? m->placements.len : 1, sizeof(refit_dsum_t))))) {
        if (!st) st = refit_error(REFIT_ERR_NO_MEMORY, "receiver digests");
        goto err;
    }
    r->m = m;
    r->usable = true; /* nothing written yet: whatever the caller put there stands */
    *out = r;
    return REFIT_OK;
err:
    refit_receiver_destroy(r);
    return st;
}

refit_status_t refit_receiver_alloc(refit_receiver_t *r, uint32_t region, void **base)
{
    if (!r || !base || region >= r->nregions)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_receiver_alloc: bad region %u", region);
    if (r->mem[region]) return refit_error(REFIT_ERR_INVALID_ARG, "region %u already has memory", region);
    void *p = NULL;
    uint64_t size = r->m->regions.data[region];
#ifdef REFIT_HAVE_CUDA
    if (r->params.device >= 0) {
        refit_status_t st = refit_gpu_alloc(r->params.device, size, &p); /* zeroed */
        if (st) return st;
        r->mem[region] = p;
        r->owned[region] = true;
        *base = p;
        return REFIT_OK;
    }
#endif
    if (posix_memalign(&p, 4096, size ? size : 1))
        return refit_error(REFIT_ERR_NO_MEMORY, "receiver region %u: %" PRIu64 " bytes", region, size);
    memset(p, 0, size); /* fault the pages in now, not during the first refit */
    r->mem[region] = p;
    r->owned[region] = true;
    *base = p;
    return REFIT_OK;
}

refit_status_t refit_receiver_attach(refit_receiver_t *r, uint32_t region, void *base)
{
    if (!r || !base || region >= r->nregions)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_receiver_attach: bad region %u", region);
    if (r->mem[region]) return refit_error(REFIT_ERR_INVALID_ARG, "region %u already has memory", region);
    r->mem[region] = base;
    return REFIT_OK;
}

uint64_t refit_receiver_committed(const refit_receiver_t *r) { return r ? r->committed : 0; }
bool refit_receiver_usable(const refit_receiver_t *r) { return r && r->usable; }

static void drop_peers(refit_receiver_t *r, source_t *s)
{
    for (uint32_t t = 0; t < REFIT_MAX_TRANSPORTS; t++)
        for (uint32_t b = 0; b < MAX_BUFFERS; b++)
            if (s->peer[t][b]) {
                r->ts.ops[t]->disconnect(s->peer[t][b]);
                s->peer[t][b] = NULL;
            }
}

static void drop_source(refit_receiver_t *r, source_t *s)
{
    drop_peers(r, s);
    refit_manifest_destroy(s->m);
    s->m = NULL;
    s->signature = s->incarnation = 0;
    s->transport = -1;
}

static void drop_plan(cached_plan_t *cp)
{
    for (uint32_t i = 0; i < cp->ndsrc; i++) {
        refit_delta_index_destroy(cp->dsrc[i].ix);
        free(cp->dsrc[i].wire);
    }
    free(cp->dsrc);
    refit_plan_destroy(cp->plan);
    refit_digest_plan_destroy(cp->dplan);
    free(cp->dusable);
    memset(cp, 0, sizeof(*cp));
}

static void drop_plans(refit_receiver_t *r)
{
    for (int i = 0; i < PLAN_CACHE; i++) drop_plan(&r->plans[i]);
}

void refit_receiver_destroy(refit_receiver_t *r)
{
    if (!r) return;
    refit_relays_close(r->relays, &r->ts); /* stops serving first: readers fail over */
    free(r->holders);
    for (uint32_t k = 0; r->src && k < r->world; k++) drop_source(r, &r->src[k]);
    free(r->src);
    free(r->committed_inc);
    drop_plans(r);
    refit_tset_close(&r->ts);
    refit_registry_close(r->reg);
    for (uint32_t i = 0; r->mem && i < r->nregions; i++) {
        if (!r->owned[i]) continue;
#ifdef REFIT_HAVE_CUDA
        if (r->params.device >= 0) {
            refit_gpu_free(r->mem[i]);
            continue;
        }
#endif
        free(r->mem[i]);
    }
#ifdef REFIT_HAVE_CUDA
    for (uint32_t i = 0; r->stage && i < r->nregions; i++) refit_gpu_host_free(r->stage[i]);
#endif
    free(r->stage);
    free(r->mem);
    free(r->owned);
    refit_digest_key_destroy(r->dkey);
    free(r->dlocal);
    refit_manifest_destroy(r->m);
    free(r);
}

/* Fetches and decodes rank k's manifest; checks it against its record. */
static refit_status_t load_manifest(refit_receiver_t *r, uint32_t k, refit_manifest_t **out)
{
    refit_status_t st;
    void *buf = NULL;
    size_t len = 0;
    if ((st = refit_registry_get_manifest(r->reg, r->group, k, &buf, &len))) {
        if (st == REFIT_ERR_NOT_FOUND)
            return refit_error(REFIT_ERR_MISSING_SOURCE, "source rank %u of group %s has no manifest in %s", k,
                               r->group, refit_registry_url(r->reg));
        return st;
    }
    st = refit_manifest_decode(buf, len, out);
    free(buf);
    if (st) {
        refit_error_prefix("manifest of source rank %u in %s", k, refit_registry_url(r->reg));
        return st;
    }
    if ((*out)->rank != k) {
        refit_manifest_destroy(*out);
        return refit_error(REFIT_ERR_CORRUPT, "the manifest stored for rank %u says it is rank %u", k, (*out)->rank);
    }
    return REFIT_OK;
}

/* Source rank k's manifest, read again when its record names another one
 * (or it was never read); *read says whether it was. */
static refit_status_t refresh_manifest(refit_receiver_t *r, uint32_t k, const refit_version_record_t *rec, bool *read)
{
    source_t *src = &r->src[k];
    *read = false;
    if (src->m && src->signature == rec->signature && src->incarnation == rec->incarnation) return REFIT_OK;
    refit_manifest_t *m;
    refit_status_t st = load_manifest(r, k, &m);
    if (st) return st;
    if (m->signature != rec->signature) {
        refit_manifest_destroy(m);
        return refit_error(REFIT_ERR_STALE, "source rank %u's manifest changed while being read", k);
    }
    drop_source(r, src);
    src->m = m;
    src->mkey = refit_fleet_mirror_key(m);
    src->signature = m->signature;
    src->incarnation = rec->incarnation;
    *read = true;
    return REFIT_OK;
}


static refit_status_t learn_world(refit_receiver_t *r)
{
    refit_status_t st;
    refit_manifest_t *m0;
    if ((st = load_manifest(r, 0, &m0))) return st;
    if (strcmp(m0->model, r->m->model) != 0) {
        st = refit_error(REFIT_ERR_IDENTITY, "group %s publishes model %s; this receiver holds %s", r->group, m0->model,
                         r->m->model);
        refit_manifest_destroy(m0);
        return st;
    }
    r->world = m0->world;
    r->src = calloc(r->world, sizeof(source_t));
    r->committed_inc = calloc(r->world, sizeof(uint64_t));
    if (!r->src || !r->committed_inc) {
        free(r->src);
        free(r->committed_inc);
        r->src = NULL;
        r->committed_inc = NULL;
        refit_manifest_destroy(m0);
        r->world = 0;
        return refit_error(REFIT_ERR_NO_MEMORY, "receiver sources");
    }
    for (uint32_t k = 0; k < r->world; k++) r->src[k].transport = -1;
    /* Rank 0's manifest is read again with the others, against its record. */
    refit_manifest_destroy(m0);
    return REFIT_OK;
}

typedef struct {
    refit_version_record_t *recs;
    uint8_t *present, *alive;
    uint64_t origin; /* refit_fleet_origin of the records: which trainer publishers they are */
} snapshot_t;

static refit_status_t read_state(refit_receiver_t *r, snapshot_t *s)
{
    refit_status_t st;
    if ((st = refit_registry_records(r->reg, r->group, r->world, s->recs, s->present))) return st;
    s->origin = refit_fleet_origin(s->recs, s->present, r->world);
    return refit_registry_alive(r->reg, r->group, r->world, s->alive, NULL);
}

/* The version every live rank holds, or 0 if they disagree, none is live, or
 * some rank has not published at all yet.  A rank that published and then
 * stopped heartbeating is dead and left out (its bytes may still be held by
 * replicas; the planner decides). */
static uint64_t common_version(const refit_receiver_t *r, const snapshot_t *s, uint32_t *live)
{
    uint64_t v = 0;
    *live = 0;
    for (uint32_t k = 0; k < r->world; k++)
        if (!s->present[k]) return 0;
    for (uint32_t k = 0; k < r->world; k++) {
        if (!s->alive[k]) continue;
        if (v && s->recs[k].version != v) return 0;
        v = s->recs[k].version;
        (*live)++;
    }
    return v;
}

static refit_status_t tick(void *user)
{
    refit_receiver_t *r = user;
    double now = refit_now();
    refit_status_t rs = refit_relays_renew(r->relays, r->reader, r->params.lease_ms); /* its own pace (1.5 s tokens) */
    if (rs) return rs;
    if (now - r->lease_renewed < r->params.lease_ms / 3e3) return REFIT_OK;
    r->lease_renewed = now;
    return refit_registry_lease_renew(r->reg, r->group, r->lease_version, r->reader, r->params.lease_ms,
                                      r->lease_token);
}

static cached_plan_t *find_plan(refit_receiver_t *r, const refit_plan_key_t *key)
{
    for (int i = 0; i < PLAN_CACHE; i++)
        if (r->plans[i].plan && r->plans[i].key.src == key->src && r->plans[i].key.dst == key->dst) {
            r->plans[i].last_used = ++r->uses;
            return &r->plans[i];
        }
    return NULL;
}

static cached_plan_t *keep_plan(refit_receiver_t *r, const refit_plan_key_t *key, refit_plan_t *plan)
{
    int victim = 0;
    for (int i = 1; i < PLAN_CACHE; i++)
        if (r->plans[i].last_used < r->plans[victim].last_used) victim = i;
    drop_plan(&r->plans[victim]);
    r->plans[victim] = (cached_plan_t){.key = *key, .plan = plan, .last_used = ++r->uses};
    return &r->plans[victim];
}

/* The number of delta arenas a source manifest exposes (0: none). */
static uint32_t delta_regions(const refit_manifest_t *m)
{
    const void *v;
    size_t len;
    uint32_t n;
    if (refit_manifest_get_attr(m, "refit.delta", &v, &len) || len != sizeof(n)) return 0;
    memcpy(&n, v, sizeof(n));
    return n == m->regions.len ? n : 0;
}

/* The index of a source's digest table region, or -1 when it offers none. */
static int64_t digest_region(const refit_manifest_t *m)
{
    const void *v;
    size_t len;
    uint32_t n;
    if (refit_manifest_get_attr(m, "refit.digest", &v, &len) || len != sizeof(n)) return -1;
    memcpy(&n, v, sizeof(n));
    return n == m->regions.len + delta_regions(m) ? (int64_t)n : -1;
}

/* Connects source k for buffer b through the first transport that works. */
static refit_status_t connect_source(refit_receiver_t *r, uint32_t k, uint32_t b, int *tidx)
{
    source_t *s = &r->src[k];
    refit_status_t st = REFIT_OK, first = REFIT_OK;
    char first_detail[512] = "";
    uint32_t n = (uint32_t)s->m->regions.len;
    n += delta_regions(s->m);             /* a delta publisher's arenas follow its regions */
    n += digest_region(s->m) >= 0 ? 1 : 0; /* then its digest table */
    for (uint32_t t = 0; t < r->ts.n; t++) {
        if (s->peer[t][b]) {
            *tidx = (int)t;
            return REFIT_OK;
        }
        const void **descs = calloc(n ? n : 1, sizeof(void *));
        size_t *lens = calloc(n ? n : 1, sizeof(size_t));
        if (!descs || !lens) {
            free(descs);
            free(lens);
            return refit_error(REFIT_ERR_NO_MEMORY, "connecting");
        }
        bool have = true;
        for (uint32_t i = 0; i < n && have; i++) {
            char key[96];
            refit_desc_key(key, sizeof(key), r->ts.ops[t]->name, i, b);
            have = refit_manifest_get_attr(s->m, key, &descs[i], &lens[i]) == REFIT_OK;
        }
        if (have) st = r->ts.ops[t]->connect(r->ts.ctx[t], descs, lens, n, &s->peer[t][b]);
        free(descs);
        free(lens);
        if (have && !st) {
            *tidx = (int)t;
            return REFIT_OK;
        }
        if (have && !first) {
            first = st;
            snprintf(first_detail, sizeof(first_detail), "%s", refit_last_error());
        }
    }
    if (first) return refit_error(first, "source rank %u: %s", k, first_detail);
    return refit_error(REFIT_ERR_TRANSPORT, "source rank %u exposes none of this receiver's transports", k);
}

/* Appends sep (if buf is not empty) and s to buf, truncating. */
static void append(char *buf, size_t size, const char *sep, const char *s)
{
    size_t len = strlen(buf);
    if (len && len + 1 < size) {
        size_t n = strlen(sep) < size - len - 1 ? strlen(sep) : size - len - 1;
        memcpy(buf + len, sep, n);
        len += n;
    }
    size_t n = strlen(s) < size - len - 1 ? strlen(s) : size - len - 1;
    memcpy(buf + len, s, n);
    buf[len + n] = '\0';
}

/* ---- fleet path (host memory): every holder of the bytes, in chunks ------- */

/* Trainer ranks at version v that hold bytes the plan needs (planned sources
 * and their DP replicas), connected, appended to h[*nh]. */
static refit_status_t trainer_holders(refit_receiver_t *r, const snapshot_t *s, uint64_t v, const refit_plan_t *plan,
                                      refit_fleet_holder_t *h, uint32_t *nh, uint32_t max)
{
    for (uint32_t k = 0; k < r->world && *nh < max; k++) {
        source_t *src = &r->src[k];
        if (!s->present[k] || !s->alive[k] || s->recs[k].version != v || !src->m) continue;
        bool needed = refit_plan_source_bytes(plan, k) > 0;
        for (uint32_t j = 0; j < r->world && !needed; j++)
            needed = r->src[j].m && r->src[j].mkey == src->mkey && refit_plan_source_bytes(plan, j) > 0;
        if (!needed) continue;
        uint32_t b = s->recs[k].buffer;
        if (b >= MAX_BUFFERS) return refit_error(REFIT_ERR_CORRUPT, "source rank %u names staging buffer %u", k, b);
        int t;
        refit_status_t st = connect_source(r, k, b, &t);
        if (st) {
            if (refit_plan_source_bytes(plan, k)) return st;
            continue; /* a replica we cannot reach: the planned rank serves */
        }
        refit_fleet_holder_t *x = &h[(*nh)++];
        memset(x, 0, sizeof(*x));
        snprintf(x->name, sizeof(x->name), "trainer:%u", k);
        x->id = k;
        x->transport = (uint32_t)t;
        x->peer = src->peer[t][b];
        x->mirror_key = src->mkey;
        x->rate = refit_test_throttle("trainer", k);
    }
    return REFIT_OK;
}

/* Chooses holders: relays with room first; the trainer when there is no
 * limit (with the relays), or while no relay holds v and the trainer has
 * room (alone).  Waits (up to
 * the deadline) while every holder is full.  *with_trainer says whether
 * trainer ranks are among them. */
static refit_status_t fleet_select(refit_receiver_t *r, const snapshot_t *s, uint64_t v, const refit_plan_t *plan,
                                   double deadline, refit_fleet_holder_t *h, uint32_t *nh, uint32_t max,
                                   bool *with_trainer)
{
    uint32_t cap = r->params.max_readers;
    for (;;) {
        uint32_t holding = 0;
        *nh = refit_relays_find(r->relays, &r->ts, v, s->origin, r->reader, r->params.lease_ms, h,
                                REFIT_MIN(max, REFIT_MAX_RELAYS), &holding);
        refit_log(REFIT_LOG_DEBUG, "%s: version %" PRIu64 ": %u relay(s) hold it, %u with room", r->reader, v, holding,
                  *nh);
        if (*nh && cap) {
            *with_trainer = false;
            return REFIT_OK;
        }
        /* With a limit, the trainer feeds only while no relay holds the version. */
        if (!cap || (!holding && refit_relays_trainer_token(r->relays, v, r->reader, cap))) {
            *with_trainer = true;
            return trainer_holders(r, s, v, plan, h, nh, max);
        }
        double left = deadline - refit_now();
        if (left <= 0)
            return refit_error(REFIT_ERR_TIMEOUT, "every holder of version %" PRIu64 " stayed at %u readers", v, cap);
        refit_status_t st = refit_registry_wait(r->reg, (int)(REFIT_MIN(left, 0.02) * 1e3) + 1);
        if (st && st != REFIT_ERR_TIMEOUT) return st;
    }
}

static refit_status_t fleet_tick(void *user) { return tick(user); }

/* Our chunked transfer has begun and our progress is valid: serve it. */
static void fleet_announce(void *user)
{
    refit_receiver_t *r = user;
    refit_relays_announce(r->relays, r->lease_version);
}

static refit_status_t fleet_transfer(refit_receiver_t *r, void *const *dst, const snapshot_t *s, uint64_t v,
                                     const refit_plan_t *plan,
                                     refit_fleet_holder_t *h, uint32_t nh, bool with_trainer, double deadline,
                                     int *tix, refit_pull_stats_t *stats, uint32_t *used)
{
    uint32_t max = REFIT_MAX_RELAYS + r->world;
    uint64_t *keys = calloc(r->world ? r->world : 1, sizeof(uint64_t));
    if (!keys) return refit_error(REFIT_ERR_NO_MEMORY, "fleet");
    for (uint32_t k = 0; k < r->world; k++) keys[k] = r->src[k].m ? r->src[k].mkey : 0;
    refit_fleet_xfer_t x = {.ts = &r->ts, .plan = plan, .plan_keys = keys, .dst = dst, .deadline = deadline,
                            .chunk_bytes = (uint64_t)r->params.chunk_kb << 10, .tick = fleet_tick, .user = r,
                            .seed = (uint32_t)refit_random_u64(),
                            /* The receiver's copy-thread budget caps the workers each holder gets. */
                            .workers = r->params.threads ? REFIT_MIN(r->params.threads, 2u) : 0,
                            .threads = r->params.threads, .version = v,
                            .progress = refit_relays_progress(r->relays, dst), .announce = fleet_announce,
                            .origin = s->origin};
    refit_fleet_resume_t resume = {0};
    x.resume = &resume;
    refit_status_t st = refit_fleet_transfer(&x, h, nh, stats);
    if (st && !with_trainer && (st == REFIT_ERR_PEER || st == REFIT_ERR_MISSING_SOURCE)) {
        /* Every relay we had failed: the trainer serves what is left (the
         * chunks already written stay). */
        refit_log(REFIT_LOG_INFO, "relays failed (%s); reading version %" PRIu64 " from the trainer", refit_last_error(), v);
        uint32_t before = nh;
        if (!(st = trainer_holders(r, s, v, plan, h, &nh, max))) {
            for (uint32_t i = 0; i < before; i++) h[i].failed = true;
            memset(stats, 0, sizeof(*stats));
            st = refit_fleet_transfer(&x, h, nh, stats);
        }
    }
    free(keys);
    free(resume.done);
    free(r->holders);
    r->holders = calloc(nh ? nh : 1, sizeof(refit_holder_stat_t));
    r->nholders = r->holders ? nh : 0;
    *used = 0;
    for (uint32_t k = 0; k < r->world; k++) tix[k] = -1;
    for (uint32_t i = 0; i < nh; i++) {
        if (r->holders) {
            refit_holder_stat_t *o = &r->holders[i];
            snprintf(o->name, sizeof(o->name), "%s", h[i].name);
            o->bytes = h[i].bytes;
            o->chunks = h[i].chunks;
            o->steals = h[i].steals;
            o->failed = h[i].failed;
            o->early = h[i].early;
        }
        if (h[i].chunks) (*used)++;
        if (h[i].chunks && !h[i].mirror_dst) tix[h[i].id] = (int)h[i].transport; /* re-checked after */
    }
    return st;
}

refit_status_t refit_receiver_holders(const refit_receiver_t *r, refit_holder_stat_t *out, size_t max,
                                      size_t *count)
{
    if (!r) return refit_error(REFIT_ERR_INVALID_ARG, "receiver is NULL");
    if (max && !out) return refit_error(REFIT_ERR_INVALID_ARG, "holders: out is NULL and max is %zu", max);
    if (max) {
        /* out[0].size is the caller's sizeof, so also the array's stride. */
        size_t stride = out[0].size;
        refit_status_t st = refit_out_check(stride, REFIT_HOLDER_STAT_SIZE_V1, "refit_holder_stat_t");
        if (st) return st;
        for (size_t i = 0; i < r->nholders && i < max; i++) {
            refit_holder_stat_t *o = (refit_holder_stat_t *)(void *)((char *)out + i * stride);
            o->size = stride;
            refit_out_write(o, stride, &r->holders[i], sizeof(r->holders[i]));
        }
    }
    if (count) *count = r->nholders;
    return REFIT_OK;
}

/* ---- delta path (host memory) ---------------------------------------------- */

/* Whether every source the plan reads offers a delta from exactly what this
 * memory holds: the committed version, from the same publisher incarnation
 * (a restarted trainer may publish a version number again with other bytes). */
static bool delta_eligible(const refit_receiver_t *r, const snapshot_t *s, uint64_t v, const refit_plan_t *plan)
{
    if (r->params.no_delta || !r->committed || !r->usable || v <= r->committed) return false;
    /* GPU memory: the delta applies to the pinned staging when that holds
     * the committed version whole (it came through it), then goes up. */
    if (r->params.device >= 0 && r->stage_version != r->committed) return false;
    bool any = false;
    for (uint32_t k = 0; k < r->world; k++) {
        if (!refit_plan_source_bytes(plan, k)) continue;
        if (s->recs[k].delta_base != r->committed || s->recs[k].incarnation != r->committed_inc[k] ||
            !r->src[k].m || !delta_regions(r->src[k].m))
            return false;
        any = true;
    }
    return any;
}

/* The source regions the plan reads, each with its delta index (once per plan). */
static refit_status_t delta_sources(refit_receiver_t *r, cached_plan_t *cp)
{
    if (cp->dsrc) return REFIT_OK;
    size_t n;
    const refit_plan_region_t *regs = refit_plan_regions(cp->plan, &n);
    delta_src_t *d = NULL;
    uint32_t nd = 0;
    refit_status_t st = REFIT_OK;
    for (size_t i = 0; i < n && !st; i++) {
        uint32_t j = 0;
        while (j < nd && (d[j].src != regs[i].src || d[j].region != regs[i].src_region)) j++;
        if (j < nd) continue;
        delta_src_t *g = realloc(d, (nd + 1) * sizeof(*d));
        if (!g) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "delta indices");
            break;
        }
        d = g;
        d[nd] = (delta_src_t){.src = regs[i].src, .region = regs[i].src_region};
        const refit_manifest_t *m = r->src[regs[i].src].m;
        if (!m || regs[i].src_region >= m->regions.len)
            st = refit_error(REFIT_ERR_INTERNAL, "the plan reads region %u of source %u, which has no manifest",
                             regs[i].src_region, regs[i].src);
        else
            st = refit_delta_index_create(cp->plan, regs[i].src, regs[i].src_region, m->regions.data[regs[i].src_region],
                                          &d[nd].ix);
        nd++;
    }
    if (st) {
        for (uint32_t j = 0; j < nd; j++) refit_delta_index_destroy(d[j].ix);
        free(d);
        return st;
    }
    cp->dsrc = d;
    cp->ndsrc = nd;
    return REFIT_OK;
}

/* Reads n byte ranges of sources' memory: regs[i] reads from source regs[i].src
 * (its region regs[i].src_region) into bufs[regs[i].dst_region], one
 * transport pull per transport. */
static refit_status_t raw_pull(refit_receiver_t *r, const snapshot_t *s, const int *tix, refit_plan_region_t *regs,
                               size_t n, void *const *bufs, double deadline, refit_pull_report_t *rep)
{
    refit_status_t st = REFIT_OK;
    uint64_t *sb = calloc(r->world, sizeof(uint64_t));
    refit_peer_t **peers = calloc(r->world, sizeof(void *));
    refit_plan_region_t *sub = calloc(n ? n : 1, sizeof(*sub));
    if (!sb || !peers || !sub) st = refit_error(REFIT_ERR_NO_MEMORY, "delta fetch");
    for (uint32_t t = 0; t < r->ts.n && !st; t++) {
        size_t m = 0;
        memset(sb, 0, r->world * sizeof(uint64_t));
        for (uint32_t k = 0; k < r->world; k++)
            peers[k] = tix[k] == (int)t ? r->src[k].peer[t][s->recs[k].buffer] : NULL;
        for (size_t i = 0; i < n; i++)
            if (peers[regs[i].src]) {
                sub[m++] = regs[i];
                sb[regs[i].src] += regs[i].run;
            }
        if (!m) continue;
        struct refit_plan one = refit_plan_view(sub, m, sb, r->world);
        refit_pull_ctl_t ctl = {.deadline = deadline, .threads = r->params.threads, .tick = tick, .user = r};
        refit_pull_stats_t ps = {0};
        if ((st = r->ts.ops[t]->pull(r->ts.ctx[t], peers, &one, bufs, &ctl, &ps))) break;
        rep->bytes += ps.bytes;
        rep->requests += ps.requests;
        if (!strstr(rep->transport, r->ts.ops[t]->name)) append(rep->transport, sizeof(rep->transport), "+", r->ts.ops[t]->name);
        if (!strstr(rep->lanes, ps.lanes)) append(rep->lanes, sizeof(rep->lanes), " ", ps.lanes);
    }
    free(sb);
    free(peers);
    free(sub);
    return st;
}

/* Checks this memory against the sources' content digests: hash it, fetch
 * the table entries the digest plan names (connecting sources the transfer
 * did not read: relays served it), compare.  REFIT_ERR_VERIFY names the
 * first tensor that differs.  Bytes no digest covers are counted as
 * unverified (and said once per plan at INFO). */
static refit_status_t digest_verify(refit_receiver_t *r, const snapshot_t *s, uint64_t v, cached_plan_t *cp,
                                    double deadline, int *tix, refit_pull_report_t *rep)
{
    double t0 = refit_now();
    refit_status_t st = REFIT_OK;
    uint8_t *usable = calloc(r->world ? r->world : 1, 1);
    if (!usable) return refit_error(REFIT_ERR_NO_MEMORY, "digests");
    const refit_manifest_t **srcs = calloc(r->world ? r->world : 1, sizeof(void *));
    if (!srcs) {
        free(usable);
        return refit_error(REFIT_ERR_NO_MEMORY, "digests");
    }
    for (uint32_t k = 0; k < r->world; k++) {
        srcs[k] = r->src[k].m;
        usable[k] = s->present[k] && s->alive[k] && s->recs[k].version == v && r->src[k].m &&
                    s->recs[k].incarnation == r->src[k].incarnation && digest_region(r->src[k].m) >= 0;
    }
    /* The entries come from the sources the digest plan picks; one we cannot
     * reach (a replica the transfer did not need) is left out and the plan
     * made again without it. */
    size_t nf = 0;
    const refit_digest_fetch_t *f = NULL;
    uint64_t covered_unverifiable = UINT64_MAX; /* with every source that offers digests */
    uint32_t unreachable = UINT32_MAX;         /* a source dropped because it could not be reached */
    for (uint32_t attempt = 0; attempt <= r->world && !st; attempt++) {
        if (!cp->dplan || memcmp(cp->dusable, usable, r->world) != 0) {
            refit_digest_plan_destroy(cp->dplan);
            free(cp->dusable);
            cp->dplan = NULL;
            cp->dusable = NULL;
            uint8_t *keep = malloc(r->world ? r->world : 1);
            if (!keep) {
                st = refit_error(REFIT_ERR_NO_MEMORY, "digests");
                break;
            }
            memcpy(keep, usable, r->world);
            if ((st = refit_digest_plan_create(srcs, r->world, usable, r->m, &cp->dplan))) {
                free(keep);
                break;
            }
            cp->dusable = keep;
            refit_digest_plan_stats_t ps;
            refit_digest_plan_stats(cp->dplan, &ps);
            if (ps.unverifiable_bytes)
                refit_log(REFIT_LOG_INFO, "%s: %" PRIu64 " of %" PRIu64 " bytes cannot be checked against the "
                          "sources' digests (sources without digests, or boxes no digest covers)", r->reader,
                          ps.unverifiable_bytes, ps.bytes + ps.unverifiable_bytes);
        }
        f = refit_digest_plan_fetches(cp->dplan, &nf);
        if (covered_unverifiable == UINT64_MAX) {
            refit_digest_plan_stats_t ps0;
            refit_digest_plan_stats(cp->dplan, &ps0);
            covered_unverifiable = ps0.unverifiable_bytes;
        }
        bool dropped = false;
        for (size_t i = 0; i < nf; i++) {
            uint32_t k = f[i].src;
            if (tix[k] >= 0 || !usable[k]) continue;
            if (connect_source(r, k, s->recs[k].buffer, &tix[k])) {
                refit_log(REFIT_LOG_INFO, "%s: digests of source rank %u unreachable (%s); using others", r->reader, k,
                          refit_last_error());
                tix[k] = -1;
                usable[k] = 0;
                dropped = true;
                unreachable = k;
            }
        }
        if (!dropped) break;
    }
    if (st) goto out;
    if (unreachable != UINT32_MAX) {
        /* Leaving out an unreachable source must not leave bytes unchecked
         * that its digests would have covered (a dead trainer rank whose
         * bytes came through a relay): fail rather than commit them. */
        refit_digest_plan_stats_t ps1;
        refit_digest_plan_stats(cp->dplan, &ps1);
        if (ps1.unverifiable_bytes > covered_unverifiable) {
            st = refit_error(REFIT_ERR_PEER, "%" PRIu64 " bytes of version %" PRIu64 " cannot be checked: the digests "
                             "of source rank %u are unreachable", ps1.unverifiable_bytes - covered_unverifiable, v,
                             unreachable);
            goto out;
        }
    }
    /* The entries: one 8-byte run each, from the source's digest region. */
    refit_plan_region_t *regs = calloc(nf ? nf : 1, sizeof(*regs));
    unsigned char *fetched = calloc(nf ? nf : 1, 8);
    if (!regs || !fetched) st = refit_error(REFIT_ERR_NO_MEMORY, "digest entries");
    for (size_t i = 0; i < nf && !st; i++) {
        uint32_t k = f[i].src;
        if (tix[k] < 0) {
            st = refit_error(REFIT_ERR_PEER, "source rank %u holds digests this receiver needs and is unreachable", k);
            break;
        }
        regs[i] = (refit_plan_region_t){.src = k, .src_region = (uint32_t)digest_region(r->src[k].m),
                                        .src_offset = f[i].offset, .dst_offset = i * 8, .run = 8};
    }
    refit_pull_report_t scratch = {0};
    void *bufs[1] = {fetched};
    if (!st && nf) st = raw_pull(r, s, tix, regs, nf, bufs, deadline, &scratch);
    /* This memory: the staging when the pull went through it (GPU), else the
     * receiver's own (host); GPU memory itself is not hashed here. */
    bool host = r->params.device < 0 || r->pull_staged;
    void *const *mem = r->params.device >= 0 ? r->stage : r->mem;
    if (!st && host)
        st = refit_digest_local(r->dkey, r->m, (const void *const *)mem, r->dlocal, r->params.threads);
    refit_digest_report_t dr = {0};
    if (!st && host) st = refit_digest_check(cp->dplan, fetched, r->dlocal, &dr);
    if (st == REFIT_ERR_VERIFY)
        refit_error_prefix("version %" PRIu64 " does not match what its publishers published: ", v);
    refit_digest_plan_stats_t ps;
    refit_digest_plan_stats(cp->dplan, &ps);
    rep->digest_bytes = host ? dr.bytes : 0;
    rep->unverified_bytes = host ? ps.unverifiable_bytes : ps.bytes + ps.unverifiable_bytes;
    free(regs);
    free(fetched);
out:
    free(usable);
    free(srcs);
    rep->digest_ms = (refit_now() - t0) * 1e3;
    return st;
}

/* The delta path: fetch each source region's chunk table, check that it
 * takes this memory from the committed version to v, fetch the payloads of
 * the chunks the plan reads, apply them in place.  Returns before writing
 * anything unless the deltas are all in hand and sound; an error while
 * applying leaves the memory marked unusable (the caller then pulls in full,
 * which rewrites every byte). */
static refit_status_t delta_pull(refit_receiver_t *r, const snapshot_t *s, uint64_t v, cached_plan_t *cp,
                                 double deadline, int *tix, refit_pull_report_t *rep)
{
    refit_status_t st;
    double tc = refit_now();
    r->nholders = 0; /* not a fleet pull: no holders to report */
    if ((st = delta_sources(r, cp))) return st;
    for (uint32_t k = 0; k < r->world; k++) tix[k] = -1;
    rep->sources = 0;
    for (uint32_t j = 0; j < cp->ndsrc; j++) {
        uint32_t k = cp->dsrc[j].src;
        if (tix[k] >= 0) continue;
        if (s->recs[k].buffer >= MAX_BUFFERS)
            return refit_error(REFIT_ERR_CORRUPT, "source rank %u names staging buffer %u", k, s->recs[k].buffer);
        if ((st = connect_source(r, k, s->recs[k].buffer, &tix[k]))) return st;
        if (!(refit_transport_caps(r->ts.ops[tix[k]]) & REFIT_TCAP_HOST_DST))
            return refit_error(REFIT_ERR_TRANSPORT, "transport %s cannot write host memory", r->ts.ops[tix[k]]->name);
        rep->sources++;
    }
    rep->connect_ms = (refit_now() - tc) * 1e3;
    uint32_t nd = cp->ndsrc;
    refit_plan_region_t *regs = NULL;
    void **bufs = calloc(nd, sizeof(void *));
    size_t nregs = 0, capregs = 0;
    if (!bufs) return refit_error(REFIT_ERR_NO_MEMORY, "delta fetch");
    rep->transport[0] = rep->lanes[0] = '\0';
    /* 1. Headers and chunk tables (their size follows from the region's). */
    for (uint32_t j = 0; j < nd; j++) {
        delta_src_t *d = &cp->dsrc[j];
        uint64_t rb = r->src[d->src].m->regions.data[d->region], tb = refit_delta_table_bytes(rb);
        if (d->cap < tb) {
            unsigned char *w = realloc(d->wire, tb);
            if (!w) {
                st = refit_error(REFIT_ERR_NO_MEMORY, "delta of source %u: %" PRIu64 " bytes", d->src, tb);
                goto out;
            }
            d->wire = w;
            d->cap = tb;
        }
        bufs[j] = d->wire;
    }
    if (!(regs = calloc(nd, sizeof(*regs)))) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "delta fetch");
        goto out;
    }
    for (uint32_t j = 0; j < nd; j++) {
        delta_src_t *d = &cp->dsrc[j];
        const refit_manifest_t *m = r->src[d->src].m;
        regs[j] = (refit_plan_region_t){.src = d->src, .src_region = (uint32_t)m->regions.len + d->region,
                                        .dst_region = j, .run = refit_delta_table_bytes(m->regions.data[d->region])};
    }
    if ((st = raw_pull(r, s, tix, regs, nd, bufs, deadline, rep))) goto out;
    /* 2. Each must take `committed` to v, for this region's size. */
    uint64_t *total = calloc(nd, sizeof(uint64_t));
    if (!total) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "delta fetch");
        goto out;
    }
    for (uint32_t j = 0; j < nd && !st; j++) {
        delta_src_t *d = &cp->dsrc[j];
        uint64_t rb = r->src[d->src].m->regions.data[d->region], tb = refit_delta_table_bytes(rb);
        refit_delta_info_t info = REFIT_DELTA_INFO_INIT;
        if ((st = refit_delta_info(d->wire, tb, &info))) {
            refit_error_prefix("delta of source rank %u region %u", d->src, d->region);
            break;
        }
        if (info.base_version != r->committed || info.version != v || info.region_bytes != rb ||
            info.header_bytes != tb || info.total_bytes > tb + rb) {
            st = refit_error(REFIT_ERR_STALE,
                             "source rank %u region %u offers a delta from %" PRIu64 " to %" PRIu64 " (%" PRIu64
                             " bytes of %" PRIu64 "); wanted %" PRIu64 " to %" PRIu64,
                             d->src, d->region, info.base_version, info.version, info.total_bytes, info.region_bytes,
                             r->committed, v);
            break;
        }
        total[j] = info.total_bytes;
        if (d->cap < total[j]) {
            unsigned char *w = realloc(d->wire, total[j]);
            if (!w) {
                st = refit_error(REFIT_ERR_NO_MEMORY, "delta of source %u: %" PRIu64 " bytes", d->src, total[j]);
                break;
            }
            d->wire = w;
            d->cap = total[j];
        }
        bufs[j] = d->wire;
        /* 3. The payloads of the chunks the plan reads (neighbours merged). */
        uint64_t nch;
        const uint8_t *need = refit_delta_index_need(d->ix, &nch);
        uint64_t lo = 0, hi = 0;
        for (uint64_t c = 0; c <= nch && !st; c++) {
            uint64_t off = 0, len = 0;
            if (c < nch && need[c]) refit_delta_chunk_payload(d->wire, c, &off, &len);
            if (len && off == hi && hi > lo) {
                hi += len;
                continue;
            }
            if (hi > lo) {
                if (nregs == capregs) {
                    size_t nc = capregs ? capregs * 2 : 256;
                    refit_plan_region_t *g = realloc(regs, nc * sizeof(*regs));
                    if (!g) {
                        st = refit_error(REFIT_ERR_NO_MEMORY, "delta fetch");
                        break;
                    }
                    regs = g;
                    capregs = nc;
                }
                const refit_manifest_t *m = r->src[d->src].m;
                regs[nregs++] = (refit_plan_region_t){.src = d->src, .src_region = (uint32_t)m->regions.len + d->region,
                                                      .src_offset = lo, .dst_region = j, .dst_offset = lo,
                                                      .run = hi - lo};
            }
            lo = off;
            hi = off + len;
        }
    }
    if (!st && nregs) st = raw_pull(r, s, tix, regs, nregs, bufs, deadline, rep);
    /* 4. Apply: from here the memory holds a partial version until committed. */
    if (!st) {
        refit_relays_withdraw(r->relays, (int)r->params.lease_ms);
        r->usable = false;
        r->stage_version = 0; /* the staging is being written too (GPU) */
    }
    bool gpu = r->params.device >= 0;
    void *const *dst = gpu ? r->stage : r->mem;
    for (uint32_t j = 0; j < nd && !st; j++) {
        refit_delta_apply_stats_t as = REFIT_DELTA_APPLY_STATS_INIT;
        st = refit_delta_apply_threads(cp->dsrc[j].ix, cp->dsrc[j].wire, total[j], r->committed, dst,
                                       r->params.threads, &as);
        if (st) refit_error_prefix("applying the delta of source rank %u region %u", cp->dsrc[j].src, cp->dsrc[j].region);
        rep->delta_units += as.units_written + as.bytes_written / 2;
    }
    free(total);
#ifdef REFIT_HAVE_CUDA
    for (uint32_t i = 0; gpu && !st && i < r->nregions; i++) st = refit_gpu_copy(r->mem[i], r->stage[i], r->m->regions.data[i]);
    if (gpu && !st) append(rep->lanes, sizeof(rep->lanes), " ", "(via pinned host staging)");
#endif
    if (gpu) r->pull_staged = true;
    if (!st) {
        rep->delta_base = r->committed;
        append(rep->lanes, sizeof(rep->lanes), " ", "(delta)");
    }
out:
    free(regs);
    free(bufs);
    return st;
}

/* Steps 4 and 5 of a full pull: peers for the sources the plan reads (the
 * fleet path: every holder), then the transfer and the padding. */
static refit_status_t full_transfer(refit_receiver_t *r, const snapshot_t *snap, uint64_t v,
                                    const refit_plan_t *plan, double deadline, int *tix, refit_peer_t **peers,
                                    refit_pull_report_t *rep)
{
    refit_status_t st = REFIT_OK;
    const snapshot_t s = *snap;
    refit_fleet_holder_t *holders = NULL;
    /* Peers for the sources this plan reads (the fleet path: every holder). */
    double tc = refit_now();
    bool fleet = r->relays != NULL, with_trainer = true;
    uint32_t nh = 0, hmax = REFIT_MAX_RELAYS + r->world;
    if (fleet) {
        for (uint32_t k = 0; k < r->world; k++) tix[k] = -1;
        if (!(holders = calloc(hmax, sizeof(*holders)))) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "holders");
            goto done;
        }
        if ((st = fleet_select(r, &s, v, plan, deadline, holders, &nh, hmax, &with_trainer))) goto done;
    }
    for (uint32_t k = 0; k < r->world && !fleet; k++) {
        tix[k] = -1;
        if (!refit_plan_source_bytes(plan, k)) continue;
        uint32_t b = s.recs[k].buffer;
        if (b >= MAX_BUFFERS) {
            st = refit_error(REFIT_ERR_CORRUPT, "source rank %u names staging buffer %u", k, b);
            goto done;
        }
        if ((st = connect_source(r, k, b, &tix[k]))) goto done;
        rep->sources++;
    }
    rep->connect_ms = (refit_now() - tc) * 1e3;
    /* GPU memory and a transport that cannot write it: everything goes
     * through pinned host staging, then one copy per region (the fleet path
     * on a GPU receiver always does). */
    bool gpu = r->params.device >= 0, bounce = gpu && fleet;
    for (uint32_t k = 0; k < r->world; k++)
        if (tix[k] >= 0) {
            unsigned caps = refit_transport_caps(r->ts.ops[tix[k]]);
            if (gpu && !(caps & REFIT_TCAP_DEVICE_DST)) bounce = true;
            if (!gpu && !(caps & REFIT_TCAP_HOST_DST)) {
                st = refit_error(REFIT_ERR_TRANSPORT, "transport %s cannot write host memory", r->ts.ops[tix[k]]->name);
                goto done;
            }
        }
    void *const *dst = r->mem;
#ifdef REFIT_HAVE_CUDA
    if (bounce) {
        for (uint32_t i = 0; i < r->nregions; i++)
            if (!r->stage[i] && (st = refit_gpu_host_alloc(r->m->regions.data[i], &r->stage[i]))) goto done;
        dst = r->stage;
    }
#endif
    /* 5. Transfer: from here the memory holds a partial version until committed
     * (a relay stops serving first, and waits for its readers). */
    refit_relays_withdraw(r->relays, (int)r->params.lease_ms);
    r->usable = false;
    r->stage_version = 0; /* the staging is being written too (GPU) */
    /* Fault-injection hook for the test suite: a pause after the receiver
     * committed to the transfer, during which a test kills a process. */
    unsigned pause_ms = refit_test_pause_ms();
    if (pause_ms) usleep((useconds_t)pause_ms * 1000u);
    refit_pull_ctl_t ctl = {.deadline = deadline, .threads = r->params.threads, .tick = tick, .user = r};
    refit_pull_stats_t stats = {0};
    rep->transport[0] = rep->lanes[0] = '\0';
    if (fleet) {
        uint32_t used = 0;
        if ((st = fleet_transfer(r, dst, &s, v, plan, holders, nh, with_trainer, deadline, tix, &stats, &used)))
            goto done;
        rep->sources = used;
        snprintf(rep->transport, sizeof(rep->transport), "%s", r->ts.ops[0]->name);
        append(rep->lanes, sizeof(rep->lanes), " ", stats.lanes);
    }
    for (uint32_t t = 0; t < r->ts.n && !fleet; t++) {
        bool any = false;
        for (uint32_t k = 0; k < r->world; k++) {
            peers[k] = tix[k] == (int)t ? r->src[k].peer[t][s.recs[k].buffer] : NULL;
            any |= peers[k] != NULL;
        }
        if (!any) continue;
        refit_pull_stats_t ts = {0};
        if ((st = r->ts.ops[t]->pull(r->ts.ctx[t], peers, plan, dst, &ctl, &ts))) goto done;
        stats.bytes += ts.bytes;
        stats.requests += ts.requests;
        stats.launches += ts.launches;
        append(rep->transport, sizeof(rep->transport), "+", r->ts.ops[t]->name);
        append(rep->lanes, sizeof(rep->lanes), " ", ts.lanes);
    }
    /* Padding (zeros) is ours to write. */
    uint8_t *only = calloc(r->world ? r->world : 1, 1);
    if (!only) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "fills");
        goto done;
    }
    refit_exec_opts_t fo = {.threads = 1, .only = only};
#ifdef REFIT_HAVE_CUDA
    if (gpu && !bounce) st = refit_gpu_plan_fills(plan, r->params.device, r->mem, &stats.launches);
    else
#endif
        st = refit_plan_execute(plan, NULL, dst, &fo);
    free(only);
    if (st) goto done;
#ifdef REFIT_HAVE_CUDA
    for (uint32_t i = 0; bounce && i < r->nregions; i++)
        if ((st = refit_gpu_copy(r->mem[i], r->stage[i], r->m->regions.data[i]))) goto done;
    if (bounce) append(rep->lanes, sizeof(rep->lanes), " ", "(via pinned host staging)");
#endif
    r->pull_staged = bounce;
    rep->bytes = stats.bytes;
    rep->requests = stats.requests;
    rep->launches = stats.launches;
done:
    free(holders);
    return st;
}

/* Until rank 0's manifest is there (the group may not have started yet) or
 * the deadline passes. */
static refit_status_t wait_world(refit_receiver_t *r, double deadline)
{
    while (!r->world) {
        refit_status_t st = learn_world(r);
        if (!st) break;
        if (st != REFIT_ERR_MISSING_SOURCE) return st;
        double left = deadline - refit_now();
        if (left <= 0)
            return refit_error(REFIT_ERR_TIMEOUT, "no source of group %s appeared in %s", r->group,
                               refit_registry_url(r->reg));
        st = refit_registry_wait(r->reg, (int)(REFIT_MIN(left, 0.25) * 1e3) + 1);
        if (st && st != REFIT_ERR_TIMEOUT) return st;
    }
    return REFIT_OK;
}

static refit_status_t do_pull(refit_receiver_t *r, uint64_t want, double deadline, refit_pull_report_t *rep)
{
    refit_status_t st;
    double t0 = refit_now();
    r->pull_staged = false;
    /* The group may not have started yet: wait for rank 0's manifest. */
    if ((st = wait_world(r, deadline))) return st;
    snapshot_t s = {calloc(r->world, sizeof(refit_version_record_t)), calloc(r->world, 1), calloc(r->world, 1), 0};
    const refit_manifest_t **srcs = calloc(r->world, sizeof(void *));
    refit_peer_t **peers = calloc(r->world, sizeof(void *));
    int *tix = calloc(r->world, sizeof(int));
    bool leased = false, committed = false;
    if (!s.recs || !s.present || !s.alive || !srcs || !peers || !tix) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "pull");
        goto out;
    }
    /* 1. Discover a complete version and lease it. */
    uint64_t v = 0;
    double round = refit_now(); /* start of the discovery round that succeeds */
    for (;;) {
        uint32_t live;
        round = refit_now();
        if ((st = read_state(r, &s))) goto out;
        uint64_t c = common_version(r, &s, &live);
        if (c && want != REFIT_VERSION_NEWEST && c > want) {
            st = refit_error(REFIT_ERR_STALE, "version %" PRIu64 " was replaced by %" PRIu64 " before it was pulled",
                             want, c);
            goto out;
        }
        bool ready = c && (want == REFIT_VERSION_NEWEST ? c > r->committed : c == want);
        if (ready) {
            st = refit_registry_lease_take(r->reg, r->group, c, r->reader, r->params.lease_ms, &r->lease_token);
            if (!st) {
                v = c;
                leased = true;
                break;
            }
            if (st != REFIT_ERR_STALE) goto out;
        }
        double left = deadline - refit_now();
        if (left <= 0) {
            st = refit_error(REFIT_ERR_TIMEOUT,
                             "no complete version %s%" PRIu64 " of group %s appeared (%u of %u source ranks live%s)",
                             want == REFIT_VERSION_NEWEST ? "newer than " : "", want == REFIT_VERSION_NEWEST ? r->committed : want,
                             r->group, live, r->world, c ? "" : ", their versions differ or none published");
            goto out;
        }
        /* Publishes wake us; expiries of heartbeats do not, so look again now and then. */
        st = refit_registry_wait(r->reg, (int)(REFIT_MIN(left, 0.25) * 1e3) + 1);
        if (st && st != REFIT_ERR_TIMEOUT) goto out;
    }
    /* Rounds that found no complete version count as waiting: the control
     * plane of a refit is the round that finds its version, and what follows. */
    rep->wait_ms = (round - t0) * 1e3;
    r->lease_version = v;
    r->lease_renewed = refit_now();
    /* 2. Manifests that changed (or were never read). */
    for (uint32_t k = 0; k < r->world; k++) {
        source_t *src = &r->src[k];
        if (!s.present[k] || !s.alive[k] || s.recs[k].version != v) continue;
        bool read = false;
        if ((st = refresh_manifest(r, k, &s.recs[k], &read))) goto out;
        rep->manifests_read += read;
        srcs[k] = src->m;
    }
    double t1 = refit_now();
    rep->discover_ms = (t1 - round) * 1e3;
    /* 3. Plan, or reuse. */
    refit_plan_key_t key;
    refit_plan_key_of(srcs, r->world, r->m, &key);
    cached_plan_t *cp = find_plan(r, &key);
    if (!cp) {
        refit_plan_t *made;
        if ((st = refit_plan_create(srcs, r->world, r->m, NULL, &made))) goto out;
        cp = keep_plan(r, &key, made);
        rep->planned = true;
    }
    const refit_plan_t *plan = cp->plan;
    double t2 = refit_now();
    rep->plan_ms = (t2 - t1) * 1e3;
    bool delta_done = false;
    if (delta_eligible(r, &s, v, plan)) {
        if (!(st = delta_pull(r, &s, v, cp, deadline, tix, rep))) {
            delta_done = true;
        } else if (st == REFIT_ERR_TIMEOUT || refit_now() > deadline) {
            goto out;
        } else {
            refit_log(REFIT_LOG_INFO, "%s: delta of version %" PRIu64 " not applied (%s); pulling in full", r->reader, v,
                      refit_last_error());
            rep->delta_base = rep->delta_units = rep->bytes = rep->requests = 0;
            rep->sources = 0;
        }
    }
    if (!delta_done && (st = full_transfer(r, &s, v, plan, deadline, tix, peers, rep))) goto out;
    /* 6. Nothing changed under us: same records, sources alive. */
    snapshot_t s2 = {calloc(r->world, sizeof(refit_version_record_t)), calloc(r->world, 1), calloc(r->world, 1), 0};
    if (!s2.recs || !s2.present || !s2.alive) st = refit_error(REFIT_ERR_NO_MEMORY, "pull");
    else st = read_state(r, &s2);
    for (uint32_t k = 0; !st && k < r->world; k++) {
        if (tix[k] < 0) continue;
        if (!s2.present[k] || !s2.alive[k])
            st = refit_error(REFIT_ERR_PEER, "source rank %u died during the transfer of version %" PRIu64, k, v);
        else if (s2.recs[k].version != v || s2.recs[k].incarnation != s.recs[k].incarnation)
            st = refit_error(REFIT_ERR_PEER, "source rank %u moved to version %" PRIu64 " during the transfer of %" PRIu64,
                             k, s2.recs[k].version, v);
    }
    free(s2.recs);
    free(s2.present);
    free(s2.alive);
    if (st) goto out;
    double t3 = refit_now();
    rep->transfer_ms = (t3 - t2) * 1e3;
    rep->begin_s = round;
    rep->end_s = t3;
    rep->transfer_begin_s = t2;
    /* Fencing: our lease must still hold.  A publisher that found no lease
     * (deleted, expired, or a store that lost its data) may have rewritten
     * its memory while we read it; such bytes are never committed. */
    if ((st = refit_registry_lease_holds(r->reg, r->group, v, r->reader, r->lease_token)) ||
        (st = refit_relays_holds(r->relays, r->reader)))
        goto out;
    /* 7. Verify: the sources' digests, then (tests) the synthetic truth. */
    if (r->dkey && (st = digest_verify(r, &s, v, cp, deadline, tix, rep))) goto out;
    if (r->params.verify == REFIT_VERIFY_TRUTH) {
#ifdef REFIT_HAVE_CUDA
        if (r->params.device >= 0) {
            /* After a 2 ms grace, so that a receiver waiting to copy on this
             * GPU goes first: kernels of two processes are time-sliced, and
             * this one (a full read of the receiver's memory) would halve
             * that copy's speed (docs/gpu.md). */
            int turn = refit_gpu_turn_take(r->params.device, 0.002, 2.0);
            st = refit_gpu_truth_verify(r->m, r->params.device, (const void *const *)r->mem, v, NULL);
            refit_gpu_turn_give(turn);
        } else
#endif
            st = refit_truth_verify_delta(r->m, (const void *const *)r->mem, v, r->params.truth_fraction, NULL);
        if (st) goto out;
    }
    rep->verify_ms = (refit_now() - t3) * 1e3;
    /* 8. Commit. */
    r->committed = v;
    r->stage_version = r->pull_staged ? v : 0;
    for (uint32_t k = 0; k < r->world; k++) r->committed_inc[k] = s.present[k] ? s.recs[k].incarnation : 0;
    r->usable = true;
    rep->version = v;
    refit_status_t ack = refit_registry_ack(r->reg, r->group, r->reader, v);
    char ack_detail[512] = "";
    if (ack) snprintf(ack_detail, sizeof(ack_detail), "%s", refit_last_error());
    /* A relay serves host memory: a GPU receiver's staging, which holds v whole. */
    if (r->params.device >= 0 && !r->pull_staged) refit_relays_withdraw(r->relays, 0);
    else if ((st = refit_relays_serve(r->relays, r->params.device >= 0 ? r->stage : r->mem, v, s.origin)))
        refit_log(REFIT_LOG_WARN, "serving version %" PRIu64 " as a relay: %s", v, refit_last_error());
    st = REFIT_OK;
    /* The bytes are committed (committed() says v, the memory is usable), but
     * a driver waiting for acknowledgements would never learn it: say so. */
    if (ack) st = refit_error(ack, "version %" PRIu64 " was committed but not acknowledged: %s", v, ack_detail);
    committed = true;
out:
    if (st && !committed) refit_relays_abort(r->relays); /* readers following a partial version stop */
    if (st == REFIT_ERR_PEER || st == REFIT_ERR_TIMEOUT || st == REFIT_ERR_TRANSPORT) {
        /* A transport may have given up on a live peer (force-closed it):
         * the next pull connects every source and relay afresh. */
        for (uint32_t k = 0; k < r->world; k++) drop_peers(r, &r->src[k]);
        refit_relays_reset(r->relays, &r->ts);
    }
    refit_relays_release_as(r->relays, r->reader);
    if (leased) {
        refit_status_t keep = st;
        char detail[1024];
        snprintf(detail, sizeof(detail), "%s", refit_last_error());
        if (refit_registry_lease_release(r->reg, r->group, v, r->reader))
            refit_log(REFIT_LOG_WARN, "releasing lease on %" PRIu64 ": %s", v, refit_last_error());
        if (keep) refit_error(keep, "%s", detail);
    }
    free(s.recs);
    free(s.present);
    free(s.alive);
    free(srcs);
    free(peers);
    free(tix);
    rep->total_ms = (refit_now() - t0) * 1e3 - rep->wait_ms;
    return st;
}

refit_status_t refit_receiver_prepare(refit_receiver_t *r, int timeout_ms, double *prepare_ms)
{
    if (!r) return refit_error(REFIT_ERR_INVALID_ARG, "receiver is NULL");
    double t0 = refit_now(), deadline = t0 + (timeout_ms < 0 ? 0 : timeout_ms) / 1e3;
    refit_status_t st;
    if ((st = wait_world(r, deadline))) return st;
    snapshot_t s = {calloc(r->world, sizeof(refit_version_record_t)), calloc(r->world, 1), calloc(r->world, 1), 0};
    const refit_manifest_t **srcs = calloc(r->world, sizeof(void *));
    if (!s.recs || !s.present || !s.alive || !srcs) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "prepare");
        goto out;
    }
    /* Every rank has published (its record names its manifest's signature,
     * its incarnation and its buffer) and is alive. */
    for (;;) {
        if ((st = read_state(r, &s))) goto out;
        uint32_t ready = 0;
        for (uint32_t k = 0; k < r->world; k++) ready += s.present[k] && s.alive[k];
        if (ready == r->world) break;
        double left = deadline - refit_now();
        if (left <= 0) {
            st = refit_error(REFIT_ERR_TIMEOUT, "prepare: %u of %u source ranks of group %s have published", ready,
                             r->world, r->group);
            goto out;
        }
        if ((st = refit_registry_wait(r->reg, (int)(REFIT_MIN(left, 0.25) * 1e3) + 1)) && st != REFIT_ERR_TIMEOUT) goto out;
    }
    for (uint32_t k = 0; k < r->world; k++) {
        source_t *src = &r->src[k];
        bool read = false;
        if ((st = refresh_manifest(r, k, &s.recs[k], &read))) goto out;
        srcs[k] = src->m;
    }
    refit_plan_key_t key;
    refit_plan_key_of(srcs, r->world, r->m, &key);
    cached_plan_t *cp = find_plan(r, &key);
    if (!cp) {
        refit_plan_t *made;
        if ((st = refit_plan_create(srcs, r->world, r->m, NULL, &made))) goto out;
        cp = keep_plan(r, &key, made);
    }
    for (uint32_t k = 0; k < r->world && !r->relays; k++) { /* the fleet path picks its holders per pull */
        int tidx = -1;
        if (!refit_plan_source_bytes(cp->plan, k)) continue;
        if (s.recs[k].buffer >= MAX_BUFFERS) {
            st = refit_error(REFIT_ERR_CORRUPT, "source rank %u names staging buffer %u", k, s.recs[k].buffer);
            goto out;
        }
        if ((st = connect_source(r, k, s.recs[k].buffer, &tidx))) goto out;
    }
    if (prepare_ms) *prepare_ms = (refit_now() - t0) * 1e3;
out:
    free(s.recs);
    free(s.present);
    free(s.alive);
    free(srcs);
    return st;
}

refit_status_t refit_receiver_pull(refit_receiver_t *r, uint64_t version, int timeout_ms, refit_pull_report_t *report)
{
    if (!r) return refit_error(REFIT_ERR_INVALID_ARG, "receiver is NULL");
    for (uint32_t i = 0; i < r->nregions; i++)
        if (!r->mem[i]) return refit_error(REFIT_ERR_INVALID_ARG, "region %u has no memory (alloc or attach it)", i);
    if (report) {
        refit_status_t st = refit_out_check(report->size, REFIT_PULL_REPORT_SIZE_V1, "refit_pull_report_t");
        if (st) return st;
    }
    refit_pull_report_t rep;
    memset(&rep, 0, sizeof(rep));
    rep.size = sizeof(rep);
    refit_status_t st = do_pull(r, version, refit_now() + (timeout_ms < 0 ? 0 : timeout_ms) / 1e3, &rep);
    refit_metrics_pull(r->params.job, r->group, r->m, st, &rep); /* metrics.c: counters, optional export */
    if (report) refit_out_write(report, report->size, &rep, sizeof(rep));
    return st;
}
