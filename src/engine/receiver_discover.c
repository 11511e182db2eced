/* Receivers, discovery: the group's world (rank 0's manifest), the records
 * and heartbeats of every source rank, the version every live rank holds,
 * its lease, and the manifests that changed.
 *
 * Discovery reads one record and one heartbeat per source rank (one round
 * trip each with Redis) and nothing else in steady state: a manifest is read
 * again only when its record names another signature or incarnation. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "engine/receiver_internal.h"

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
    r->manifest_fetches++;
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

refit_status_t refit_rx_refresh_manifest(refit_receiver_t *r, uint32_t k, const refit_version_record_t *rec, bool *read)
{
    source_t *src = &r->src[k];
    *read = false;
    if (src->m && src->signature == rec->signature && src->incarnation == rec->incarnation) return REFIT_OK;
    refit_manifest_t *m = NULL;
    refit_status_t st;
    if (k == 0 && r->m0) { /* read moments ago to learn the world: not fetched, authenticated, decoded twice */
        m = r->m0;
        r->m0 = NULL;
        /* Only for the incarnation whose record was read before it was fetched
         * (the signature does not cover transport descriptors: a restarted
         * rank 0 of the same layout has the same signature). */
        if (m->signature != rec->signature || r->m0_incarnation != rec->incarnation) { /* republished: read again */
            refit_manifest_destroy(m);
            m = NULL;
        }
    }
    if (!m && (st = load_manifest(r, k, &m))) return st;
    if (m->signature != rec->signature) {
        refit_manifest_destroy(m);
        return refit_error(REFIT_ERR_STALE, "source rank %u's manifest changed while being read", k);
    }
    refit_rx_drop_source(r, src);
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
    refit_version_record_t rec0;
    uint8_t present0 = 0;
    if (refit_registry_records(r->reg, r->group, 1, &rec0, &present0)) present0 = 0; /* then not kept: read again */
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
    /* Rank 0's manifest is checked against its record with the others' (a
     * signature other than the record's is read again). */
    refit_manifest_destroy(r->m0);
    r->m0 = NULL;
    if (present0 && rec0.signature == m0->signature) {
        r->m0 = m0;
        r->m0_incarnation = rec0.incarnation;
    } else {
        refit_manifest_destroy(m0);
    }
    return REFIT_OK;
}

/* Until rank 0's manifest is there (the group may not have started yet) or
 * the deadline passes. */
refit_status_t refit_rx_wait_world(refit_receiver_t *r, double deadline)
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

refit_status_t refit_rx_snapshot_alloc(snapshot_t *s, uint32_t world)
{
    *s = (snapshot_t){calloc(world, sizeof(refit_version_record_t)), calloc(world, 1), calloc(world, 1), 0};
    return s->recs && s->present && s->alive ? REFIT_OK : REFIT_ERR_NO_MEMORY;
}

void refit_rx_snapshot_free(snapshot_t *s)
{
    free(s->recs);
    free(s->present);
    free(s->alive);
    *s = (snapshot_t){0};
}

refit_status_t refit_rx_read_state(refit_receiver_t *r, snapshot_t *s)
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

refit_status_t refit_rx_discover(pull_t *p, uint64_t want, double *round)
{
    refit_receiver_t *r = p->r;
    refit_status_t st;
    for (;;) {
        uint32_t live;
        *round = refit_now();
        if ((st = refit_rx_read_state(r, &p->s))) return st;
        uint64_t c = common_version(r, &p->s, &live);
        if (c && want != REFIT_VERSION_NEWEST && c > want)
            return refit_error(REFIT_ERR_STALE,
                               "version %" PRIu64 " was replaced by %" PRIu64
                               " before it was pulled: its publishers did not wait for this receiver (a publisher "
                               "waits for N receivers to commit each version with refit_publisher_wait_acks, `refit "
                               "publish --acks N`; or pull the newest version, `refit pull --newest`)",
                               want, c);
        bool ready = c && (want == REFIT_VERSION_NEWEST ? c > r->committed : c == want);
        if (ready) {
            st = refit_registry_lease_take(r->reg, r->group, c, r->reader, r->params.lease_ms, &r->lease_token);
            if (!st) {
                p->v = c;
                return REFIT_OK;
            }
            if (st != REFIT_ERR_STALE) return st;
        }
        double left = p->deadline - refit_now();
        if (left <= 0)
            return refit_error(REFIT_ERR_TIMEOUT,
                               "no complete version %s%" PRIu64 " of group %s appeared (%u of %u source ranks live%s)",
                               want == REFIT_VERSION_NEWEST ? "newer than " : "",
                               want == REFIT_VERSION_NEWEST ? r->committed : want, r->group, live, r->world,
                               c ? "" : ", their versions differ or none published");
        /* Publishes wake us; expiries of heartbeats do not, so look again now and then. */
        st = refit_registry_wait(r->reg, (int)(REFIT_MIN(left, 0.25) * 1e3) + 1);
        if (st && st != REFIT_ERR_TIMEOUT) return st;
    }
}

uint32_t refit_rx_delta_regions(const refit_manifest_t *m)
{
    const void *v;
    size_t len;
    uint32_t n;
    if (refit_manifest_get_attr(m, "refit.delta", &v, &len) || len != sizeof(n)) return 0;
    memcpy(&n, v, sizeof(n));
    return n == m->regions.len ? n : 0;
}

int64_t refit_rx_digest_region(const refit_manifest_t *m)
{
    const void *v;
    size_t len;
    uint32_t n;
    if (refit_manifest_get_attr(m, "refit.digest", &v, &len) || len != sizeof(n)) return -1;
    memcpy(&n, v, sizeof(n));
    return n == m->regions.len + refit_rx_delta_regions(m) ? (int64_t)n : -1;
}

int64_t refit_rx_stamp_region(const refit_manifest_t *m)
{
    int64_t n = refit_stamp_region(m);
    return n == (int64_t)(m->regions.len + refit_rx_delta_regions(m)) + (refit_rx_digest_region(m) >= 0) ? n : -1;
}
