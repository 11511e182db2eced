/* Relays, serving (relay.c's top comment): before the receiver writes its
 * memory, the version served is retired and its readers waited for
 * (withdraw); a chunked transfer publishes the version as it starts, with
 * its progress (announce, marked; abort when it fails); a commit publishes
 * it whole (serve).  The relay's publisher is made on first use (ensure_pub). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/fleet/relay_internal.h"

void refit_relays_withdraw(refit_relays_t *R, int timeout_ms)
{
    if (!R || !R->pub || !R->serving) return;
    __atomic_store_n(&R->progress->version, 0, __ATOMIC_RELEASE); /* readers following us stop */
    if (refit_publisher_wait_readers(R->pub, R->serving, timeout_ms)) {
        /* This memory must take the next version: readers still on this one
         * lose their leases, so none of them commits what it reads from now
         * on (each checks its lease after its transfer). */
        char g[104];
        uint32_t n = 0;
        relay_group(R, (uint32_t)R->slot, g, sizeof(g));
        refit_status_t st = refit_registry_lease_revoke(R->reg, g, R->serving, &n);
        refit_log(REFIT_LOG_WARN, "relay %s slot %d: readers of version %" PRIu64 " stayed past %d ms; %s", R->group,
                  R->slot, R->serving, timeout_ms, st ? refit_last_error() : "their leases are revoked");
        (void)n;
    }
    refit_publisher_rewriting(R->pub, 0); /* whether or not its readers left: the memory changes next */
    R->serving = 0;
    R->partial = false;
}

/* Creates the relay's publisher on first use: the receiver's manifest as rank
 * 0 of the relay group, plus the progress region. */
static refit_status_t ensure_pub(refit_relays_t *R, void *const *mem)
{
    refit_status_t st;
    if (R->pub) return REFIT_OK;
    refit_manifest_t *copy = NULL;
    if ((st = refit_manifest_copy(R->mine, &copy))) return st;
    copy->rank = 0; /* rank 0 of the relay's own group; the layout's rank stays in the placements */
    uint32_t pr = (uint32_t)copy->regions.len;
    if (REFIT_VEC_PUSH(&copy->regions, (uint64_t)REFIT_PROGRESS_BYTES) ||
        refit_manifest_set_attr(copy, "refit.progress", &pr, sizeof(pr))) {
        refit_manifest_destroy(copy);
        return refit_error(REFIT_ERR_NO_MEMORY, "relay manifest");
    }
    copy->signature = refit_manifest_compute_signature(copy);
    char g[104];
    relay_group(R, (uint32_t)R->slot, g, sizeof(g));
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = R->params.registry;
    pp.job = R->params.job;
    pp.group = g;
    pp.transports = R->params.transports;
    pp.transport_options = R->params.transport_options;
    pp.heartbeat_ms = R->params.relay_heartbeat_ms;
    pp.dead_ms = R->params.relay_heartbeat_ms ? R->params.relay_heartbeat_ms * 4 : 0;
    pp.secret_file = R->params.secret_file;
    pp.insecure = R->params.insecure;
    pp.lease_ms = R->params.lease_ms;
    pp.no_digest = true; /* its readers check the trainer's digests: the bytes are the same canonical bytes */
    if ((st = refit_publisher_create(&pp, copy, &R->pub))) {
        refit_manifest_destroy(copy);
        return st;
    }
    void *p = NULL;
    for (uint32_t i = 0; i < pr && !st; i++) st = refit_publisher_attach(R->pub, i, mem[i]);
    if (st || (st = refit_publisher_alloc(R->pub, pr, &p))) {
        refit_publisher_destroy(R->pub);
        R->pub = NULL;
        return st;
    }
    R->progress = p;
    return REFIT_OK;
}

refit_progress_hdr_t *refit_relays_progress(refit_relays_t *R, void *const *mem)
{
    if (!R || R->slot < 0) return NULL;
    if (ensure_pub(R, mem)) {
        refit_log(REFIT_LOG_WARN, "relay %s slot %d: %s (serving whole versions only)", R->group, R->slot,
                  refit_last_error());
        return NULL;
    }
    return R->progress;
}

void refit_relays_announce(refit_relays_t *R, uint64_t v)
{
    if (!R || !R->pub) return;
    if (R->partial && R->serving == v) return; /* a retry of the same pull (its chunks written so far stay) */
    refit_publisher_stamp(R->pub, (uint32_t)R->progress->origin);
    if (refit_publisher_publish(R->pub, v)) { /* e.g. v again after a failed pull: served once complete */
        refit_log(REFIT_LOG_DEBUG, "relay %s slot %d: not serving %" PRIu64 " while receiving it: %s", R->group,
                  R->slot, v, refit_last_error());
        __atomic_store_n(&R->progress->version, 0, __ATOMIC_RELEASE);
        return;
    }
    R->serving = v;
    R->partial = true;
}

void refit_relays_marked(refit_relays_t *R)
{
    if (R && R->pub) refit_publisher_notify(R->pub);
}

void refit_relays_abort(refit_relays_t *R)
{
    if (!R || !R->pub || !R->partial) return;
    __atomic_store_n(&R->progress->version, 0, __ATOMIC_RELEASE);
    /* Retire it (readers of the chunks written keep them); the next pull
     * waits for their leases before writing (withdraw). */
    refit_status_t st = refit_publisher_wait_readers(R->pub, R->serving, 0);
    if (st && st != REFIT_ERR_TIMEOUT)
        refit_log(REFIT_LOG_WARN, "relay %s slot %d: retiring %" PRIu64 ": %s", R->group, R->slot, R->serving,
                  refit_last_error());
    R->partial = false;
}

refit_status_t refit_relays_serve(refit_relays_t *R, void *const *mem, uint64_t v, uint64_t origin)
{
    refit_status_t st;
    if (!R || R->slot < 0) return REFIT_OK;
    if ((st = ensure_pub(R, mem))) return st;
    refit_progress_hdr_t *hd = R->progress;
    if (R->partial && R->serving == v && hd->origin == origin) { /* published when the transfer started */
        __atomic_store_n(&hd->complete, 1, __ATOMIC_RELEASE);
        R->partial = false;
        return REFIT_OK;
    }
    __atomic_store_n(&hd->version, 0, __ATOMIC_RELEASE);
    hd->magic = REFIT_PROGRESS_MAGIC;
    hd->nchunks = hd->chunk_bytes = hd->plan_src = hd->plan_dst = 0;
    hd->complete = 1;
    hd->origin = origin;
    refit_publisher_stamp(R->pub, (uint32_t)origin);
    __atomic_store_n(&hd->version, v, __ATOMIC_RELEASE);
    if ((st = refit_publisher_publish(R->pub, v))) return st;
    R->serving = v;
    return REFIT_OK;
}

bool refit_relays_serving(const refit_relays_t *R) { return R && R->pub && R->serving; }
