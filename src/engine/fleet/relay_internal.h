/* Relays, the state shared by relay.c (open, close), relay_serve.c (a
 * receiver serving what it holds) and relay_read.c (a receiver finding and
 * reading the relays of its layout): internal to fleet/. */
#ifndef REFIT_ENGINE_FLEET_RELAY_INTERNAL_H
#define REFIT_ENGINE_FLEET_RELAY_INTERNAL_H

#include <stdio.h>

#include "engine/fleet/relay.h"

/* A load token's lease (renewed at a third of it during a pull). */
#define LOAD_TTL_MS 1500

typedef struct {
    refit_manifest_t *m; /* fetched when first read (its transport descriptors); NULL before */
    bool known;          /* signature / incarnation: a layout that mirrors ours (checked, or seen checked) */
    uint64_t signature, incarnation;
    refit_peer_t *peer[REFIT_MAX_TRANSPORTS];
    bool leased, loaded;
    uint64_t version, token; /* the version leased, and the lease's token (fencing) */
    int progress_region;     /* of its manifest (relay_key), -1: none */
} relay_src_t;

struct refit_relays {
    refit_registry_t *reg;
    char group[104];
    uint32_t rank;
    int slot;
    uint64_t key; /* mirror key of this receiver's layout */
    const refit_manifest_t *mine;
    refit_receiver_params_t params;
    refit_publisher_t *pub;
    refit_progress_hdr_t *progress; /* our progress region (publisher memory) */
    uint64_t serving;               /* version published (partial or whole), 0: none */
    bool partial;                   /* `serving` is still being received */
    relay_src_t src[REFIT_MAX_RELAYS];
    /* Relay manifest signatures already checked to mirror our layout, and
     * their progress region: every relay of our rank publishes the same
     * layout, so one check serves them all and a relay is fetched only when
     * it is read (each manifest is MBs: fetching, authenticating and decoding
     * every relay's cost a first pull ~30 ms of CPU per relay). */
    uint64_t mirror_sig[REFIT_MAX_RELAYS];
    int mirror_progress[REFIT_MAX_RELAYS];
    uint32_t nmirror;
    uint32_t fetches;       /* relay manifests fetched, ever */
    uint32_t mirrors_alive; /* other relays of our layout alive at the last look (refit_relays_mirrors_alive) */
    bool trainer_loaded;
    uint64_t trainer_version;
    double renewed;
    int upstream; /* refit_relays_upstream */
    /* At the last refit_relays_find: other relays of our layout alive that
     * did not hold its version yet, and whether the upstream is one of them
     * (refit_relays_coming). */
    uint32_t coming;
    bool upstream_coming;
};

/* Relay slot `slot`'s group of our rank: "<group>.relay.r<rank>.s<slot>". */
static inline void relay_group(const refit_relays_t *R, uint32_t slot, char *buf, size_t n)
{
    snprintf(buf, n, "%.40s.relay.r%u.s%u", R->group, R->rank, slot);
}

/* The load-token group of group g. */
static inline void load_group(const char *g, char *buf, size_t n) { snprintf(buf, n, "%.56s.load", g); }

/* Disconnects relay s and forgets its manifest (relay.c). */
void refit_relay_src_drop(const refit_tset_t *ts, relay_src_t *s);

#endif
