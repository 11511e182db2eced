/* Receivers.
 *
 * pull():  discover -> lease -> (re)load changed manifests -> plan (cached by
 * signatures) -> connect peers (cached per source incarnation and buffer) ->
 * transfer (all transports, all sources) -> re-check that every source still
 * holds the version and is alive -> verify -> commit -> ack -> release.
 *
 * This file holds the public functions and the order of the stages; each
 * stage is a file of its own (receiver_internal.h lists them), and one pull's
 * state travels between them in a pull_t.  The receiver's memory is marked
 * unusable from the first byte written until a pull completes, so a failed
 * pull never passes for a good one. */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/metrics.h"
#include "engine/receiver_internal.h"

static const char *or_default(const char *s, const char *d) { return s && s[0] ? s : d; }

refit_status_t refit_receiver_create(const refit_receiver_params_t *params, refit_manifest_t *m, refit_receiver_t **out)
{
    refit_status_t st;
    const refit_receiver_params_t defaults = REFIT_RECEIVER_PARAMS_INIT;
    refit_receiver_params_t in;
    if (!m || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_receiver_create: NULL argument");
    if ((st = refit_params_in(&in, sizeof(in), params ? params : &defaults, REFIT_RECEIVER_PARAMS_SIZE_1,
                              "refit_receiver_params_t")))
        return st;
    if (!m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "the receiver's manifest is not finalized");
    refit_receiver_t *r = calloc(1, sizeof(*r));
    if (!r) return refit_error(REFIT_ERR_NO_MEMORY, "receiver");
    r->params = in;
    if ((st = refit_memdom_for(r->params.device, &r->dom))) {
        free(r);
        return st;
    }
    if (!(r->params.truth_fraction > 0 && r->params.truth_fraction < 1)) r->params.truth_fraction = 1;
    if (r->params.truth_fraction < 1 && r->params.device >= 0) {
        free(r);
        return refit_error(REFIT_ERR_UNSUPPORTED, "truth_fraction below 1 is verified on host memory only");
    }
    if (r->params.fp8) {
        const char *why = r->params.device < 0        ? "quantizes on the GPU: set device"
                          : r->params.relay_slot >= 0 ? "does not relay (its memory is not its layout's bf16)"
                                                      : NULL;
        if (why || (st = refit_fp8_target_create(m, &r->fp8))) {
            free(r);
            return why ? refit_error(REFIT_ERR_UNSUPPORTED, "an FP8 receiver %s", why) : st;
        }
        r->params.no_delta = true;  /* deltas are of bf16 bytes */
        r->params.no_digest = true; /* so are the sources' content digests */
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
    const char **const strs[] = {&r->params.registry,         &r->params.job,    &r->params.group,
                                 &r->params.transports,       &r->params.reader, &r->params.secret_file,
                                 &r->params.transport_options};
    if (refit_strings_own(strs, sizeof(strs) / sizeof(strs[0]), &r->strings)) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "receiver");
        goto err;
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
        if ((st = refit_registry_open_auth(refit_registry_url_or_default(r->params.registry),
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
    /* The route (receiver_path.c); relays only on the host path, the one that reads and serves them. */
    if ((st = refit_rx_route(r, &r->route))) goto err;
    if (refit_rx_host_route(r) && (st = refit_relays_open(r->reg, r->group, m, &r->params, &r->relays))) goto err;
    if (!r->params.no_digest &&
        ((st = refit_digest_key_create(refit_registry_key(r->reg, REFIT_KEY_DIGEST), &r->dkey)) ||
         !(r->dlocal = calloc(m->placements.len ? m->placements.len : 1, sizeof(refit_dsum_t))))) {
        if (!st) st = refit_error(REFIT_ERR_NO_MEMORY, "receiver digests");
        goto err;
    }
    /* Copies that hash what they write (docs/digest.md); REFIT_DIGEST_PASS=separate: a pass after them. */
    const char *pass = refit_diag()->digest_pass;
    bool separate = pass && strcmp(pass, "separate") == 0;
    if (r->dkey && !separate && (st = refit_digest_map_create(r->dkey, m, &r->dmap))) goto err;
    if (r->dmap && !refit_digest_map_bytes(r->dmap)) { /* no placement a digest covers: nothing to hash */
        refit_digest_map_destroy(r->dmap);
        r->dmap = NULL;
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
    uint64_t size = r->fp8 ? refit_fp8_target_bytes(r->fp8) : r->m->regions.data[region];
    refit_status_t st = r->dom->alloc(r->params.device, size, &p); /* zeroed, its pages in */
    if (st)                                                        /* the GPU's error says which device */
        return r->params.device >= 0 ? st : refit_error(st, "receiver region %u: %" PRIu64 " bytes", region, size);
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
const refit_fp8_target_t *refit_receiver_fp8_target(const refit_receiver_t *r) { return r ? r->fp8 : NULL; }
bool refit_receiver_usable(const refit_receiver_t *r) { return r && r->usable; }

void refit_receiver_destroy(refit_receiver_t *r)
{
    if (!r) return;
    refit_relays_close(r->relays, &r->ts); /* stops serving first: readers fail over */
    free(r->holders);
    for (uint32_t k = 0; r->src && k < r->world; k++) refit_rx_drop_source(r, &r->src[k]);
    free(r->src);
    free(r->committed_inc);
    refit_manifest_destroy(r->m0);
    refit_rx_drop_plans(r);
    refit_tset_close(&r->ts);
    refit_registry_close(r->reg);
    refit_fp8_target_destroy(r->fp8);
    for (uint32_t i = 0; r->mem && i < r->nregions; i++)
        if (r->owned[i]) r->dom->free(r->mem[i]);
    for (uint32_t i = 0; r->stage && i < r->nregions; i++) r->dom->staging_free(r->stage[i]);
    free(r->stage);
    free(r->mem);
    free(r->owned);
    free(r->strings);
    refit_digest_map_destroy(r->dmap);
    free(r->dfetch);
    for (size_t i = 0; i < r->dfetch_old.len; i++) free(r->dfetch_old.data[i]);
    REFIT_VEC_FREE(&r->dfetch_old);
#ifdef REFIT_HAVE_CUDA
    refit_gpu_digest_destroy(r->gdig);
#endif
    refit_digest_key_destroy(r->dkey);
    free(r->dlocal);
    refit_manifest_destroy(r->m);
    free(r);
}

refit_status_t refit_receiver_holders(const refit_receiver_t *r, refit_holder_stat_t *out, size_t max, size_t *count)
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

refit_status_t refit_rx_pull_begin(pull_t *p, refit_receiver_t *r, double deadline, refit_pull_report_t *rep)
{
    *p = (pull_t){.r = r, .deadline = deadline, .rep = rep};
    refit_status_t st = refit_rx_snapshot_alloc(&p->s, r->world);
    p->srcs = calloc(r->world, sizeof(void *));
    p->peers = calloc(r->world, sizeof(void *));
    p->tix = calloc(r->world, sizeof(int));
    for (uint32_t k = 0; p->tix && k < r->world; k++) p->tix[k] = -1; /* none connected yet */
    return st || !p->srcs || !p->peers || !p->tix ? REFIT_ERR_NO_MEMORY : REFIT_OK;
}

void refit_rx_pull_end(pull_t *p)
{
    refit_rx_snapshot_free(&p->s);
    free(p->srcs);
    free(p->peers);
    free(p->tix);
}

/* Why source k, which held v at discovery, is gone now (s2: the registry
 * now), into an error; REFIT_OK if it is not. */
static refit_status_t source_gone(const pull_t *p, const snapshot_t *s2, uint32_t k)
{
    if (!s2->present[k])
        return refit_error(REFIT_ERR_PEER,
                           "source rank %u withdrew during the transfer of version %" PRIu64
                           ": its publisher was destroyed before this receiver finished (a publisher should wait "
                           "for its receivers before it exits: refit_publisher_wait_acks or "
                           "refit_publisher_wait_readers; `refit publish --acks N` for N receivers)",
                           k, p->v);
    if (!s2->alive[k])
        return refit_error(REFIT_ERR_PEER,
                           "source rank %u died during the transfer of version %" PRIu64
                           " (its heartbeat stopped: the process was killed or hangs)",
                           k, p->v);
    if (s2->recs[k].version != p->v || s2->recs[k].incarnation != p->s.recs[k].incarnation)
        return refit_error(REFIT_ERR_PEER,
                           "source rank %u moved to version %" PRIu64 " during the transfer of %" PRIu64, k,
                           s2->recs[k].version, p->v);
    return REFIT_OK;
}

/* 6. Nothing changed under us: the sources read still hold v, alive, in the
 * same incarnation.  all: every source that held v at discovery (a transfer
 * that failed: which one is gone), else those connected. */
static refit_status_t recheck_sources(pull_t *p, bool all)
{
    refit_receiver_t *r = p->r;
    snapshot_t s2;
    refit_status_t st = refit_rx_snapshot_alloc(&s2, r->world);
    if (st) st = refit_error(REFIT_ERR_NO_MEMORY, "pull");
    else st = refit_rx_read_state(r, &s2);
    for (uint32_t k = 0; !st && k < r->world; k++) {
        bool held = p->s.present[k] && p->s.alive[k] && p->s.recs[k].version == p->v;
        if (all ? held : p->tix[k] >= 0) st = source_gone(p, &s2, k);
    }
    refit_rx_snapshot_free(&s2);
    return st;
}

/* A transfer that lost a source (REFIT_ERR_PEER: "source process died")
 * says why when the registry knows: the source withdrew (its publisher was
 * destroyed), died, or moved to another version; the transport's words
 * follow in parentheses.  Otherwise the error stays as it was. */
static void explain_lost_source(pull_t *p)
{
    char detail[1024];
    snprintf(detail, sizeof(detail), "%s", refit_last_error());
    if (!recheck_sources(p, true)) {
        refit_error(REFIT_ERR_PEER, "%s", detail);
        return;
    }
    char why[1024];
    snprintf(why, sizeof(why), "%s", refit_last_error());
    refit_error(REFIT_ERR_PEER, "%s (%s)", why, detail);
}

/* 8. Commit: committed() says v and the memory is usable; acknowledged, and
 * served as a relay.  Fails only when the acknowledgement does (the bytes
 * stay committed). */
static refit_status_t commit(pull_t *p)
{
    refit_receiver_t *r = p->r;
    uint64_t v = p->v;
    r->committed = v;
    r->stage_version = r->pull_staged ? v : 0;
    for (uint32_t k = 0; k < r->world; k++) r->committed_inc[k] = p->s.present[k] ? p->s.recs[k].incarnation : 0;
    r->usable = true;
    p->rep->version = v;
    refit_status_t ack = refit_registry_ack(r->reg, r->group, r->reader, v);
    char ack_detail[512] = "";
    if (ack) snprintf(ack_detail, sizeof(ack_detail), "%s", refit_last_error());
    /* A relay serves host memory: a GPU receiver's staging, which holds v whole. */
    if (r->params.device >= 0 && !r->pull_staged) refit_relays_withdraw(r->relays, 0);
    else if (refit_relays_serve(r->relays, r->params.device >= 0 ? r->stage : r->mem, v, p->s.origin))
        refit_log(REFIT_LOG_WARN, "serving version %" PRIu64 " as a relay: %s", v, refit_last_error());
    /* The bytes are committed (committed() says v, the memory is usable), but
     * a driver waiting for acknowledgements would never learn it: say so. */
    if (ack) return refit_error(ack, "version %" PRIu64 " was committed but not acknowledged: %s", v, ack_detail);
    return REFIT_OK;
}

static refit_status_t do_pull(refit_receiver_t *r, uint64_t want, double deadline, refit_pull_report_t *rep)
{
    refit_status_t st;
    double t0 = refit_now();
    r->pull_staged = false;
    uint32_t fetched = r->manifest_fetches + refit_relays_fetches(r->relays);
    /* The group may not have started yet: wait for rank 0's manifest. */
    if ((st = refit_rx_wait_world(r, deadline))) return st;
    pull_t p;
    bool committed = false;
    if (refit_rx_pull_begin(&p, r, deadline, rep)) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "pull");
        goto out;
    }
    /* 1. Discover a complete version and lease it. */
    double round = refit_now(); /* start of the discovery round that succeeds */
    p.want = want;
    if ((st = refit_rx_discover(&p, want, &round))) goto out;
    uint64_t v = p.v;
    /* Rounds that found no complete version count as waiting: the control
     * plane of a refit is the round that finds its version, and what follows. */
    rep->wait_ms = (round - t0) * 1e3;
    r->lease_version = v;
    r->lease_renewed = refit_now();
    /* 2. Manifests that changed (or were never read). */
    for (uint32_t k = 0; k < r->world; k++) {
        if (!p.s.present[k] || !p.s.alive[k] || p.s.recs[k].version != v) continue;
        bool read = false;
        if ((st = refit_rx_refresh_manifest(r, k, &p.s.recs[k], &read))) goto out;
        p.srcs[k] = r->src[k].m;
    }
    double t1 = refit_now();
    rep->discover_ms = (t1 - round) * 1e3;
    /* 3. Plan, or reuse. */
    if ((st = refit_rx_plan_for(&p, &rep->planned))) goto out;
    rep->plan_ms = (refit_now() - t1) * 1e3;
    /* What the sources' memory says it holds, before a byte moves. */
    if ((st = refit_rx_check_stamps(&p, false))) goto out;
    double t2 = refit_now();
    /* 4 and 5: the delta when the sources offer one, else (or when it fails) in full (receiver_path.c). */
    if ((st = refit_rx_transfer(&p))) {
        if (st == REFIT_ERR_PEER) explain_lost_source(&p);
        goto out;
    }
    if ((st = recheck_sources(&p, false))) goto out;
    double t3 = refit_now();
    rep->transfer_ms = (t3 - t2) * 1e3;
    rep->begin_s = round;
    rep->end_s = t3;
    rep->transfer_begin_s = t2;
    /* Fencing: our lease must still hold.  A publisher that found no lease
     * (deleted, expired, or a store that lost its data) may have rewritten
     * its memory while we read it; such bytes are never committed. */
    if ((st = refit_registry_lease_holds(r->reg, r->group, v, r->reader, r->lease_token)) ||
        (st = refit_relays_holds(r->relays, &r->ts, r->reader)))
        goto out;
    /* 7. Verify: the sources' digests, then (tests) the synthetic truth. */
    if (r->dkey && (st = refit_rx_verify(r, v, &refit_rx_digests, &p))) goto out;
    /* ... and after the last byte the commit depends on (data, deltas,
     * digest entries): nothing in a source's buffer changed in between. */
    if ((st = refit_rx_check_stamps(&p, true))) goto out;
    if (r->params.verify == REFIT_VERIFY_TRUTH && (st = refit_rx_verify(r, v, &refit_verify_truth, NULL))) goto out;
    rep->verify_ms = (refit_now() - t3) * 1e3;
    st = commit(&p);
    committed = true;
out:
    if (st && !committed) refit_relays_abort(r->relays); /* readers following a partial version stop */
    if (st == REFIT_ERR_PEER || st == REFIT_ERR_TIMEOUT || st == REFIT_ERR_TRANSPORT) {
        /* A transport may have given up on a live peer (force-closed it):
         * the next pull connects every source and relay afresh. */
        for (uint32_t k = 0; k < r->world; k++) refit_rx_drop_peers(r, &r->src[k]);
        refit_relays_reset(r->relays, &r->ts);
    }
    refit_relays_release_as(r->relays, r->reader);
    if (p.v) { /* leased */
        refit_status_t keep = st;
        char detail[1024];
        snprintf(detail, sizeof(detail), "%s", refit_last_error());
        if (refit_registry_lease_release(r->reg, r->group, p.v, r->reader))
            refit_log(REFIT_LOG_WARN, "releasing lease on %" PRIu64 ": %s", p.v, refit_last_error());
        if (keep) refit_error(keep, "%s", detail);
    }
    refit_rx_pull_end(&p);
    rep->manifests_read = r->manifest_fetches + refit_relays_fetches(r->relays) - fetched;
    rep->total_ms = (refit_now() - t0) * 1e3 - rep->wait_ms;
    return st;
}

refit_status_t refit_receiver_prepare(refit_receiver_t *r, int timeout_ms, double *prepare_ms)
{
    if (!r) return refit_error(REFIT_ERR_INVALID_ARG, "receiver is NULL");
    double t0 = refit_now(), deadline = t0 + (timeout_ms < 0 ? 0 : timeout_ms) / 1e3;
    refit_status_t st;
    if ((st = refit_rx_wait_world(r, deadline))) return st;
    pull_t p;
    if (refit_rx_pull_begin(&p, r, deadline, NULL)) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "prepare");
        goto out;
    }
    /* Every rank has published (its record names its manifest's signature,
     * its incarnation and its buffer) and is alive. */
    for (;;) {
        if ((st = refit_rx_read_state(r, &p.s))) goto out;
        uint32_t ready = 0;
        for (uint32_t k = 0; k < r->world; k++) ready += p.s.present[k] && p.s.alive[k];
        if (ready == r->world) break;
        double left = deadline - refit_now();
        if (left <= 0) {
            st = refit_error(REFIT_ERR_TIMEOUT, "prepare: %u of %u source ranks of group %s have published", ready,
                             r->world, r->group);
            goto out;
        }
        if ((st = refit_registry_wait(r->reg, (int)(REFIT_MIN(left, 0.25) * 1e3) + 1)) && st != REFIT_ERR_TIMEOUT)
            goto out;
    }
    for (uint32_t k = 0; k < r->world; k++) {
        bool read = false;
        if ((st = refit_rx_refresh_manifest(r, k, &p.s.recs[k], &read))) goto out;
        p.srcs[k] = r->src[k].m;
    }
    bool made;
    if ((st = refit_rx_plan_for(&p, &made))) goto out;
    refit_relays_learn(r->relays, &r->ts); /* the host path: the relays there are now (NULL: none) */
    for (uint32_t k = 0; k < r->world; k++) {
        p.tix[k] = -1;
        if (refit_rx_host_route(r) || !refit_plan_source_bytes(p.cp->plan, k))
            continue; /* the host path picks holders per pull */
        if ((st = refit_rx_connect_recorded(r, &p.s, k, &p.tix[k]))) goto out;
    }
    /* What the transports build on a first pull (cuda_ipc: its copy or FP8
     * table on the GPU), built now, when the memory is there. */
    bool have_mem = true;
    for (uint32_t i = 0; i < r->nregions; i++) have_mem = have_mem && r->mem[i];
    for (uint32_t t = 0; t < r->ts.n && have_mem; t++) {
        if (r->fp8 ? !refit_transport_fp8(r->ts.ops[t]) : !r->ts.ops[t]->warm) continue; /* nothing to build */
        bool any = false;
        for (uint32_t k = 0; k < r->world; k++) {
            p.peers[k] = p.tix[k] == (int)t ? r->src[k].peer[t][p.s.recs[k].buffer] : NULL;
            any |= p.peers[k] != NULL;
        }
        refit_pull_ctl_t ctl = {.deadline = deadline, .threads = r->params.threads};
#ifdef REFIT_HAVE_CUDA
        bool hashed = false; /* the copy that hashes GPU memory as it writes it: its table too */
        if ((ctl.gdig = refit_rx_gpu_hasher(r))) ctl.ghashed = &hashed;
#endif
        if (any && (st = refit_rx_transport_pull(r, t, p.peers, p.cp->plan, r->mem, &ctl, NULL, true))) goto out;
    }
    if (prepare_ms) *prepare_ms = (refit_now() - t0) * 1e3;
out:
    refit_rx_pull_end(&p);
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
