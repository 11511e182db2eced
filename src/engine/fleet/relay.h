/* Relays (relay.c): receivers serving the versions they hold. */
#ifndef REFIT_ENGINE_RELAY_H
#define REFIT_ENGINE_RELAY_H

#include "engine/fleet/fleet.h"

#define REFIT_MAX_RELAYS 16

typedef struct refit_relays refit_relays_t;

refit_status_t refit_relays_open(refit_registry_t *reg, const char *group, const refit_manifest_t *mine,
                                 const refit_receiver_params_t *params, refit_relays_t **out);
void refit_relays_close(refit_relays_t *R, const refit_tset_t *ts);
/* Before the receiver writes its memory: retire the version served and wait
 * (up to timeout_ms) for its readers. */
void refit_relays_withdraw(refit_relays_t *R, int timeout_ms);
/* The relay's progress region for a chunked transfer (NULL: not a relay, or
 * it could not be set up); refit_fleet_chunks fills it. */
refit_progress_hdr_t *refit_relays_progress(refit_relays_t *R, void *const *mem);
/* The progress is valid for v: publish v while it is being received. */
void refit_relays_announce(refit_relays_t *R, uint64_t v);
/* A chunk was marked written in the progress: readers waiting for it are answered now. */
void refit_relays_marked(refit_relays_t *R);
/* The pull of the announced version failed: stop serving it. */
void refit_relays_abort(refit_relays_t *R);
/* After a commit: serve version v from the receiver's memory (slot >= 0 only). */
refit_status_t refit_relays_serve(refit_relays_t *R, void *const *mem, uint64_t v, uint64_t origin);
bool refit_relays_serving(const refit_relays_t *R);
/* Reads and checks the manifests of the other relays of our rank present
 * now, whatever version they hold (refit_receiver_prepare: a joiner's first
 * pull then fetches no relay manifest while the others pull). */
void refit_relays_learn(refit_relays_t *R, const refit_tset_t *ts);
/* Other relays of our layout alive at the last refit_relays_learn or
 * refit_relays_find (whatever version they hold). */
uint32_t refit_relays_mirrors_alive(const refit_relays_t *R);
/* Other relays holding v from the trainer records of `origin`, with room
 * (max_readers): leased, connected, as holders; *holding counts the relays
 * that hold v, full or not. */
uint32_t refit_relays_find(refit_relays_t *R, const refit_tset_t *ts, uint64_t v, uint64_t origin, const char *reader,
                           uint32_t lease_ms, refit_fleet_holder_t *out, uint32_t max, uint32_t *holding,
                           bool only_upstream);
/* Disconnects every relay peer (after a failed pull: the next one connects
 * afresh). */
void refit_relays_reset(refit_relays_t *R, const refit_tset_t *ts);
/* A load token on the trainer group (always true when cap is 0). */
bool refit_relays_trainer_token(refit_relays_t *R, uint64_t v, const char *reader, uint32_t cap);
/* The holder this receiver read in its last pull: a relay's slot,
 * REFIT_RELAYS_TRAINER, or REFIT_RELAYS_NONE; refit_relays_find tries that
 * relay first. */
#define REFIT_RELAYS_TRAINER (-2)
#define REFIT_RELAYS_NONE (-1)
void refit_relays_set_upstream(refit_relays_t *R, int upstream);
int refit_relays_upstream(const refit_relays_t *R);
/* At the last refit_relays_find(v): the other relays of our layout alive
 * that did not hold v yet (receivers of the fleet that have not begun v);
 * *upstream: the relay read last time is one of them. */
uint32_t refit_relays_coming(const refit_relays_t *R, bool *upstream);
/* Relay manifests fetched from the registry since open (pull reports count them). */
uint32_t refit_relays_fetches(const refit_relays_t *R);
/* Renews the leases on the relays being read (and the load tokens);
 * REFIT_ERR_STALE when a relay's lease was lost (the relay retired the
 * version or revoked its readers to rewrite its memory): the pull must stop. */
refit_status_t refit_relays_renew(refit_relays_t *R, const char *reader, uint32_t lease_ms);
/* Whether every relay lease of this pull still holds and every relay read
 * still holds the version it was leased for (its version stamp; checked
 * after the transfer, before committing: fencing, as for the trainer). */
refit_status_t refit_relays_holds(refit_relays_t *R, const refit_tset_t *ts, const char *reader);
void refit_relays_release_as(refit_relays_t *R, const char *reader);

#endif
