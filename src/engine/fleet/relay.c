/* Relays: a receiver that committed a version serves it to receivers of the
 * same layout and rank.
 *
 * Registry: relay slot S of receiver rank K of source group G is a source
 * group of its own, "G.relay.rK.sS", with one rank (0) whose manifest is the
 * receiver's (rank field set to 0), whose memory is the receiver's memory
 * (exposed by the receiver's transports: shm reads it with process_vm_readv)
 * and whose version record names the version committed.  A relay is an
 * ordinary in-place publisher: heartbeat, leases, retire.  Before the
 * receiver writes its memory again it retires its version and waits (bounded
 * by the lease ttl) for its readers to release their leases; a reader that
 * finds the version retired skips that relay.
 *
 * Chunk level: the relay's manifest has one more region, its progress
 * (fleet.h; attribute "refit.progress" names it).  When the receiver pulls in
 * chunks, the relay publishes the version as soon as the transfer starts and
 * the transfer marks chunks written as it goes (fleet.c); readers follow.  A
 * pull that fails clears the progress and retires the version.  A direct
 * pull (fleet.c) publishes at the commit, as a whole.
 *
 * Load: with max_readers set, a reader takes a relay (or the trainer, counted
 * per receiver rank) only while fewer than max_readers readers hold a load
 * token on it (a lease under "<group>.load", short ttl, renewed during the
 * pull).  Trainer tokens
 * are taken only when no relay holds the version, so the trainer feeds the
 * first max_readers receivers and relays feed the rest: a tree.
 *
 * This file opens and closes them; relay_serve.c serves (a relay's
 * publisher and progress), relay_read.c reads (finding the relays of our
 * layout, their load tokens, leases and stamps); relay_internal.h holds
 * their shared state. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/fleet/relay_internal.h"

refit_status_t refit_relays_open(refit_registry_t *reg, const char *group, const refit_manifest_t *mine,
                                 const refit_receiver_params_t *params, refit_relays_t **out)
{
    refit_relays_t *R = calloc(1, sizeof(*R));
    if (!R) return refit_error(REFIT_ERR_NO_MEMORY, "relays");
    R->reg = reg;
    snprintf(R->group, sizeof(R->group), "%s", group);
    R->rank = mine->rank;
    R->slot = params->relay_slot;
    R->upstream = REFIT_RELAYS_NONE;
    R->mine = mine;
    R->params = *params;
    R->key = refit_fleet_mirror_key(mine);
    if (R->slot >= REFIT_MAX_RELAYS) {
        free(R);
        return refit_error(REFIT_ERR_INVALID_ARG, "relay slot %d (at most %d)", params->relay_slot,
                           REFIT_MAX_RELAYS - 1);
    }
    /* A relay publishes its regions and one progress region: refused here, not at its first serve. */
    if (R->slot >= 0 && mine->regions.len + 1 > REFIT_MAX_REGIONS) {
        free(R);
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "a relay (relay_slot %d) of %zu regions: a relay serves at most %u (REFIT_MAX_REGIONS, "
                           "less its progress region)",
                           params->relay_slot, (size_t)mine->regions.len, REFIT_MAX_REGIONS - 1);
    }
    *out = R;
    return REFIT_OK;
}

void refit_relay_src_drop(const refit_tset_t *ts, relay_src_t *s)
{
    for (uint32_t t = 0; t < REFIT_MAX_TRANSPORTS; t++)
        if (s->peer[t]) {
            ts->ops[t]->disconnect(s->peer[t]);
            s->peer[t] = NULL;
        }
    refit_manifest_destroy(s->m);
    s->m = NULL;
    s->known = false;
    s->signature = s->incarnation = 0;
}

void refit_relays_reset(refit_relays_t *R, const refit_tset_t *ts)
{
    if (!R) return;
    for (int i = 0; i < REFIT_MAX_RELAYS; i++) refit_relay_src_drop(ts, &R->src[i]);
}

void refit_relays_close(refit_relays_t *R, const refit_tset_t *ts)
{
    if (!R) return;
    for (int i = 0; i < REFIT_MAX_RELAYS; i++) refit_relay_src_drop(ts, &R->src[i]);
    refit_publisher_destroy(R->pub);
    free(R);
}
