/* Fleet transfers (fleet.c) and relays (relay.c): internal to the engine. */
#ifndef REFIT_ENGINE_FLEET_H
#define REFIT_ENGINE_FLEET_H

#include "engine/engine.h"

/* A relay's progress region (chunk-level availability): exposed like its
 * other memory, written by the relay's own transfer, read by its readers with
 * the same one-sided pulls as the bytes.  A header, then one byte per chunk of
 * the relay's plan (1: written).  A reader whose plan and chunk size match
 * (same key, same chunk count) reads the written chunks while the rest
 * arrive; any other reader waits for `complete`. */
#define REFIT_PROGRESS_MAGIC 0x7373657267f72efeULL
#define REFIT_PROGRESS_MAX_CHUNKS (1u << 20)
typedef struct {
    uint64_t magic;
    uint64_t version;           /* 0: nothing valid (being rewritten, failed, retired) */
    uint64_t plan_src, plan_dst; /* the plan's key */
    uint64_t chunk_bytes, nchunks;
    uint64_t complete;          /* 1: committed; every byte of the version is there */
    uint64_t origin;            /* refit_fleet_origin of the trainer records the version came from */
} refit_progress_hdr_t;
#define REFIT_PROGRESS_BYTES (sizeof(refit_progress_hdr_t) + REFIT_PROGRESS_MAX_CHUNKS)

/* One holder of bytes a receiver needs: a trainer rank, or a relay. */
typedef struct {
    char name[96];          /* "trainer:3", "relay:2" */
    uint32_t id;            /* trainer rank or relay slot */
    uint32_t transport;     /* index into the transport set */
    refit_peer_t *peer;     /* connected; NULL: unusable */
    bool mirror_dst;        /* a relay of the receiver's own layout and rank */
    uint64_t mirror_key;    /* trainer rank: refit_fleet_mirror_key of its manifest */
    double rate;            /* emulated link, bytes/s (REFIT_TEST_THROTTLE); 0: none */
    int progress_region;    /* relay: its progress region; -1: none (it serves complete versions) */
    /* filled by the transfer */
    bool failed;
    double failed_at;
    uint64_t bytes;         /* bytes read from this holder (duplicates included) */
    uint32_t chunks, steals; /* steals: re-reads of overdue chunks */
    uint32_t taken;          /* chunks taken from a slower holder's share */
    uint32_t early;          /* chunks read while the relay was still receiving */
    double busy_until;
    double busy_s;          /* seconds copying and paced */
    bool partial;           /* relay still receiving the version (as far as we know) */
    bool refreshing;        /* a worker is reading its progress */
    double progress_read;   /* when its progress was last read */
    uint32_t waits;         /* progress reads that found nothing new */
    char lanes[64];
    char error[256];
} refit_fleet_holder_t;

/* Chunks already in place, carried from a failed transfer to the next try
 * of the same plan and chunk size (the caller's; the transfer updates it). */
typedef struct {
    uint8_t *done; /* per chunk: 1 written */
    size_t n;
} refit_fleet_resume_t;

typedef struct {
    const refit_tset_t *ts;
    const refit_plan_t *plan;
    uint64_t *plan_keys;    /* mirror key of every plan source (0: none) */
    void *const *dst;
    double deadline;
    uint64_t chunk_bytes;   /* 0: 2 MiB */
    unsigned workers;       /* per holder; 0: 2 */
    unsigned threads;       /* copy threads of a direct pull (see fleet.c); 0: one per CPU */
    uint32_t seed;          /* rotates ties between holders (different receivers start on different ones) */
    uint64_t version;       /* the version moved (checked against relays' progress) */
    void *progress;         /* this receiver's own progress region (it is a relay), or NULL */
    void (*announce)(void *user); /* called once *progress is valid: the relay may serve it */
    refit_status_t (*tick)(void *user);
    void *user;
    refit_fleet_resume_t *resume; /* NULL: start from nothing */
    uint64_t origin;        /* refit_fleet_origin of this pull's trainer records: a relay whose version came
                               from other records (a restarted trainer that reused the version number) is
                               not read; ours, as a relay, is marked with it */
} refit_fleet_xfer_t;

uint64_t refit_fleet_mirror_key(const refit_manifest_t *m);
/* A hash of the incarnations of the trainer ranks whose records are present
 * (recs[k], present[k], k < world): which publishers a version's bytes are. */
uint64_t refit_fleet_origin(const refit_version_record_t *recs, const uint8_t *present, uint32_t world);
/* REFIT_TEST_THROTTLE rate for holder kind:index, bytes/s (0: none). */
double refit_fleet_throttle(const char *kind, uint32_t index);
refit_status_t refit_fleet_transfer(const refit_fleet_xfer_t *x, refit_fleet_holder_t *holders, uint32_t nh,
                                    refit_pull_stats_t *stats);

#endif
