/* The receiver's state and its stages (receiver*.c), internal to the engine.
 *
 * A pull runs in stages, each in a file of its own:
 *   receiver_discover.c  wait for the group, read records and heartbeats, find
 *                        a complete version and lease it, (re)load manifests;
 *   receiver_plan.c      the plan cache (keyed by the manifests' signatures)
 *                        and the connections to sources;
 *   receiver_path.c      the receiver's path (refit_rx_path_t): its route at
 *                        create, delta or full per pull;
 *   receiver_transfer.c  the full transfer: the host path (every holder:
 *                        direct, or in chunks) or the GPU path, then the
 *                        padding;
 *   receiver_delta.c     the delta path: chunk tables, payloads, apply;
 *   receiver_verify.c    content digests and the synthetic truth;
 *   receiver.c           the public functions, the order of the stages, the
 *                        re-check, the commit and prepare().
 * One pull's state travels between them in a pull_t. */
#ifndef REFIT_ENGINE_RECEIVER_INTERNAL_H
#define REFIT_ENGINE_RECEIVER_INTERNAL_H

#include "data/digest.h"
#include "engine/engine.h"
#include "refit/experimental/fleet.h"
#include "engine/fleet/fleet.h"
#include "engine/memdom.h"
#include "engine/fleet/relay.h"
#include "engine/stamp.h"
#include "refit/experimental/delta.h"
#include "refit/experimental/fp8.h"
#include "verify/verify.h"

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
    /* dplan's entries as read regions (entries side by side in a table are
     * one run), built at its first check, and the digest region of each
     * source they were built for (made again when one differs) */
    refit_plan_region_t *dregs;
    size_t ndregs, dnf; /* dnf: the fetches they were built from */
    int64_t *dregion;
    /* GPU memory: dplan's check on the GPU (verify/verify.h), built with it */
    struct refit_gpu_digest_check *gchk;
} cached_plan_t;

struct refit_receiver {
    char *strings; /* the params' strings, copied at create (refit_strings_own) */
    refit_registry_t *reg;
    char group[104], reader[128];
    refit_manifest_t *m;
    refit_receiver_params_t params;
    const refit_memdom_t *dom; /* where its memory is: host, or params.device's GPU */
    refit_tset_t ts;
    uint32_t nregions;
    void **mem;
    bool *owned;
    void **stage;           /* host staging (dom's) for GPU memory pulled by host-only transports */
    uint64_t stage_version; /* the version the staging holds whole (0: none): a delta applies there */
    bool pull_staged;       /* this pull went through the staging */
    uint32_t world;
    source_t *src;
    refit_manifest_t *m0;      /* rank 0's manifest as read to learn the world, until discovery takes it */
    uint64_t m0_incarnation;   /* rank 0's incarnation in the record read just before m0 was fetched */
    uint32_t manifest_fetches; /* source manifests fetched from the registry, ever (load_manifest) */
    cached_plan_t plans[PLAN_CACHE];
    uint64_t uses;
    uint64_t committed;
    uint64_t *committed_inc; /* per source rank: its incarnation when `committed` was pulled */
    bool usable;
    /* during a pull */
    uint64_t lease_version, lease_token;
    double lease_renewed;
    /* The full transfer's path, decided at create (refit_rx_route):
     * HOST_FLEET names the host path (a pull runs direct when its holders
     * qualify), GPU_DIRECT or GPU_FP8 the GPU path. */
    refit_rx_path_t route;
    /* the host path (fleet/relay.c, fleet/fleet.c): relays (NULL on the GPU
     * path), and the holders of the last pull */
    refit_relays_t *relays;
    refit_holder_stat_t *holders;
    size_t nholders;
    refit_digest_key_t *dkey;      /* content digests; NULL with no_digest */
    refit_dsum_t *dlocal;          /* per destination placement */
    refit_digest_map_t *dmap;      /* where they live in the memory: copies that hash what they write */
    struct refit_gpu_digest *gdig; /* GPU memory: the kernels that hash it (verify/verify.h) */
    unsigned char *dfetch;         /* the sources' digest entries land here (receiver_verify.c) */
    size_t dfetch_len;
    REFIT_VEC(unsigned char *) dfetch_old; /* smaller ones it replaced, freed at destroy */
    uint64_t dsum_version;   /* dlocal holds the sums of the memory (host, or the staging) as it holds this
                                 version, checked against its publishers' (0: none); a delta from it updates them */
    refit_fp8_target_t *fp8; /* params.fp8: the memory is this target's arena */
};

/* What the registry said about every source rank in one round. */
typedef struct {
    refit_version_record_t *recs;
    uint8_t *present, *alive;
    uint64_t origin; /* refit_fleet_origin of the records: which trainer publishers they are */
} snapshot_t;

/* One pull (or prepare): what the stages share.  refit_rx_pull_begin() allocates the
 * per-source arrays for r->world ranks, refit_rx_pull_end() frees them. */
typedef struct {
    refit_receiver_t *r;
    double deadline;
    uint64_t want;                 /* the version asked for (REFIT_VERSION_NEWEST: the newest) */
    uint64_t v;                    /* the version pulled, once leased */
    snapshot_t s;                  /* the records the version was found in */
    const refit_manifest_t **srcs; /* per source rank: its manifest when it holds v, else NULL */
    refit_peer_t **peers;          /* scratch: per source rank, for one transport's pull */
    int *tix;                      /* per source rank: the transport its bytes came through, -1 none */
    cached_plan_t *cp;             /* the plan (cached) */
    refit_pull_report_t *rep;
    /* The transfer's copies hashed this many of r->dmap's bytes into
     * r->dlocal (a host pull, direct or in chunks: each chunk's bytes once,
     * fleet.c); all of them: the verification needs no second pass over
     * the memory. */
    uint64_t dhashed;
    /* The delta's apply kept r->dlocal the sums of the memory it changed
     * (data/delta_hashed.h): no pass over the memory either. */
    bool ddelta;
    /* GPU memory: the transfer's copy kernel hashed every byte it wrote
     * into r->gdig's sums (refit_gpu_digest_sums_*): no pass either. */
    bool gsummed;
} pull_t;

#ifdef REFIT_HAVE_CUDA
/* GPU memory checked by content digests, hashed while it is copied (not
 * REFIT_DIGEST_GPU=host|separate): the kernels' work list (r->gdig, made on
 * first use), else NULL (receiver_verify.c). */
struct refit_gpu_digest *refit_rx_gpu_hasher(refit_receiver_t *r);
#endif

/* The pull's copies hashed all of the memory's digests as they wrote it
 * (p->dhashed): its verification skips refit_digest_local. */
bool refit_rx_digests_fused(const pull_t *p);
refit_status_t refit_rx_pull_begin(pull_t *p, refit_receiver_t *r, double deadline, refit_pull_report_t *rep);
void refit_rx_pull_end(pull_t *p);

/* receiver_discover.c */
refit_status_t refit_rx_wait_world(refit_receiver_t *r, double deadline);
refit_status_t refit_rx_read_state(refit_receiver_t *r, snapshot_t *s);
refit_status_t refit_rx_snapshot_alloc(snapshot_t *s, uint32_t world);
void refit_rx_snapshot_free(snapshot_t *s);
/* Waits for a complete version (the newest above the committed one, or
 * exactly `want`) and leases it: p->v.  *round: when the round that found
 * it began. */
refit_status_t refit_rx_discover(pull_t *p, uint64_t want, double *round);
/* Source rank k's manifest, read again when its record names another one
 * (or it was never read); *read says whether it was. */
refit_status_t refit_rx_refresh_manifest(refit_receiver_t *r, uint32_t k, const refit_version_record_t *rec,
                                         bool *read);
/* The number of delta arenas a source manifest exposes (0: none). */
uint32_t refit_rx_delta_regions(const refit_manifest_t *m);
/* The index of a source's digest table region, or -1 when it offers none. */
int64_t refit_rx_digest_region(const refit_manifest_t *m);
/* The index of a source's version stamp (engine/stamp.h), or -1 when it has none. */
int64_t refit_rx_stamp_region(const refit_manifest_t *m);

/* receiver_plan.c */
/* p->cp: the cached plan for p->srcs, made when there is none; *made says whether it was. */
refit_status_t refit_rx_plan_for(pull_t *p, bool *made);
void refit_rx_drop_plans(refit_receiver_t *r);
void refit_rx_drop_peers(refit_receiver_t *r, source_t *s);
void refit_rx_drop_source(refit_receiver_t *r, source_t *s);
/* Connects source k for buffer b through the first transport that works. */
refit_status_t refit_rx_connect(refit_receiver_t *r, uint32_t k, uint32_t b, int *tidx);
/* Connects source k for the buffer its record names. */
refit_status_t refit_rx_connect_recorded(refit_receiver_t *r, const snapshot_t *s, uint32_t k, int *tidx);

/* receiver_path.c */
/* The route of receiver r at create (r->params, r->fp8 and r->ts set):
 * REFIT_ERR_UNSUPPORTED when none fits (an FP8 receiver without cuda_ipc). */
refit_status_t refit_rx_route(const refit_receiver_t *r, refit_rx_path_t *out);
/* Whether r's route is the host path (holders, relays; r->route HOST_FLEET). */
static inline bool refit_rx_host_route(const refit_receiver_t *r) { return r->route == REFIT_RX_PATH_HOST_FLEET; }
/* Steps 4 and 5 of a pull: the delta when the sources offer one, else (or
 * when it fails short of the deadline) the full transfer; p->rep->path
 * says which ran. */
refit_status_t refit_rx_transfer(pull_t *p);

/* receiver_transfer.c */
/* The lease (and relay tokens) renewed at their pace: a transport's tick. */
refit_status_t refit_rx_tick(void *user);
/* Appends sep (if buf is not empty) and s to buf, truncating. */
void refit_rx_append(char *buf, size_t size, const char *sep, const char *s);
/* The full transfer on r->route's path: peers for the sources the plan
 * reads (the host path: every holder), then the transfer and the padding;
 * p->rep->path says which way the bytes came. */
refit_status_t refit_rx_full_transfer(pull_t *p);
/* Reads n byte ranges of sources' memory: regs[i] reads from source regs[i].src
 * (its region regs[i].src_region) into bufs[regs[i].dst_region], one
 * transport pull per transport (the sources p->tix names). */
refit_status_t refit_rx_raw_pull(pull_t *p, refit_plan_region_t *regs, size_t n, void *const *bufs,
                                 refit_pull_report_t *rep);

/* receiver_delta.c */
/* Whether every source the plan reads offers a delta from exactly what this
 * memory holds. */
bool refit_rx_delta_eligible(const pull_t *p);
/* The delta path; returns before writing anything unless the deltas are all
 * in hand and sound. */
refit_status_t refit_rx_delta_pull(pull_t *p);

/* receiver_transfer.c: pulls plan into dst through transport t (r->ts), or
 * with warm builds what its first pull would (moving nothing).  An FP8
 * receiver takes the transport's FP8 extension (REFIT_TEXT_FP8) and is
 * refused (REFIT_ERR_UNSUPPORTED) by a transport without one. */
refit_status_t refit_rx_transport_pull(refit_receiver_t *r, uint32_t t, refit_peer_t *const *peers,
                                       const refit_plan_t *plan, void *const *dst, const refit_pull_ctl_t *ctl,
                                       refit_pull_stats_t *stats, bool warm);

/* receiver_verify.c */
/* The sources' content digests against this memory (REFIT_ERR_VERIFY names
 * the first tensor that differs). */
refit_status_t refit_rx_digest_verify(pull_t *p);
/* The version stamps of every source holding p->v, read (connecting those
 * not connected yet) and compared with their records before the bytes move,
 * and of every source read (p->tix) again once every byte the commit depends
 * on has been read (after).  A
 * NEWEST pull also refuses a version older than one a source has published
 * while the registry still shows the older record (REFIT_ERR_REPLAY). */
refit_status_t refit_rx_check_stamps(pull_t *p, bool after);
/* The digest check as a verifier (verify/verify.h; user: the pull_t). */
extern const refit_verifier_t refit_rx_digests;
/* Runs `check` (refit_rx_digests, refit_verify_truth for REFIT_VERIFY_TRUTH)
 * on this receiver's memory holding version v. */
refit_status_t refit_rx_verify(refit_receiver_t *r, uint64_t v, const refit_verifier_t *check, void *user);

#endif
