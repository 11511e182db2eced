/* Fleet transfers (fleet.c) and relays (relay.c): internal to the engine. */
#ifndef REFIT_ENGINE_FLEET_H
#define REFIT_ENGINE_FLEET_H

#include "engine/engine.h"
#include "refit/experimental/fleet.h"
#include "refit/experimental/plan.h"
#include "util/trace.h"

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
    uint64_t version;            /* 0: nothing valid (being rewritten, failed, retired) */
    uint64_t plan_src, plan_dst; /* the plan's key */
    uint64_t chunk_bytes, nchunks;
    uint64_t complete; /* 1: committed; every byte of the version is there */
    uint64_t origin;   /* refit_fleet_origin of the trainer records the version came from */
} refit_progress_hdr_t;
#define REFIT_PROGRESS_BYTES (sizeof(refit_progress_hdr_t) + REFIT_PROGRESS_MAX_CHUNKS)

/* One holder of bytes a receiver needs: a trainer rank, or a relay. */
typedef struct {
    char name[96];       /* "trainer:3", "relay:2" */
    uint32_t id;         /* trainer rank or relay slot */
    uint32_t transport;  /* index into the transport set */
    refit_peer_t *peer;  /* connected; NULL: unusable */
    bool mirror_dst;     /* a relay of the receiver's own layout and rank */
    uint64_t mirror_key; /* trainer rank: refit_fleet_mirror_key of its manifest */
    double rate;         /* emulated link, bytes/s (test_hooks.h); 0: none */
    double delay_s;      /* each chunk read waits this long before it copies (test_hooks.h); 0: none */
    int progress_region; /* relay: its progress region; -1: none (it serves complete versions) */
    /* filled by the transfer */
    bool failed;
    double failed_at;
    uint64_t bytes;          /* bytes read from this holder (duplicates included) */
    uint32_t chunks, steals; /* steals: re-reads of overdue chunks */
    uint32_t taken;          /* chunks taken from a slower holder's share */
    uint32_t early;          /* chunks read while the relay was still receiving */
    double busy_until;
    double busy_s;        /* seconds copying and paced */
    bool partial;         /* relay still receiving the version (as far as we know) */
    bool refreshing;      /* a worker is reading its progress */
    double progress_read; /* when its progress was last read */
    uint32_t waits;       /* progress reads that found nothing new */
    bool waitable;        /* partial relay whose progress matched ours, over a transport with conditional
                             pulls: chunks may be asked for before it has them (refit_fleet_claim_ahead) */
    uint32_t ahead;       /* chunks read that way */
    uint32_t late;        /* of those, asked again: the relay did not write them within REFIT_FLEET_WAIT_MS */
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
    uint64_t *plan_keys; /* mirror key of every plan source (0: none) */
    void *const *dst;
    double deadline;
    uint64_t chunk_bytes; /* 0: 2 MiB */
    unsigned workers;     /* per holder served by copying CPUs (shm); 0: 2 */
    unsigned net_workers; /* per holder over a network transport (chunks in flight); 0: REFIT_FLEET_NET_WORKERS */
    unsigned threads;     /* copy threads of a direct pull (see fleet.c); 0: one per CPU */
    /* Pulls hash while they copy (refit_pull_ctl_t's dmap, dacc, dbytes):
     * a direct pull through its transport; chunks each through theirs, a
     * read's sums kept only when it alone wrote its chunk, the others' chunks
     * hashed in place at the end (fleet.c's top comment).  NULL: none. */
    const refit_digest_map_t *dmap;
    refit_dsum_t *dacc; /* dn entries, zeroed with *dbytes when a try starts (a resumed chunk try keeps them) */
    size_t dn;
    uint64_t *dbytes;
    uint32_t seed;                /* rotates ties between holders (different receivers start on different ones) */
    uint64_t version;             /* the version moved (checked against relays' progress) */
    void *progress;               /* this receiver's own progress region (it is a relay), or NULL */
    void (*announce)(void *user); /* called once *progress is valid: the relay may serve it */
    void (*marked)(void *user);   /* called after a chunk is marked in *progress (lock not held) */
    refit_status_t (*tick)(void *user);
    void *user;
    refit_fleet_resume_t *resume; /* NULL: start from nothing */
    uint64_t origin;              /* refit_fleet_origin of this pull's trainer records: a relay whose version came
                               from other records (a restarted trainer that reused the version number) is
                               not read; ours, as a relay, is marked with it */
} refit_fleet_xfer_t;

/* Chunks a receiver keeps in flight per network holder.  One was the
 * receiver's copy-thread budget (1 in the benchmarks): each chunk then waited
 * a full request round trip, and a relay's requests queue behind the bytes it
 * serves on its own egress (README: Fleet, what the fan-out measured); 4 left
 * the head of a chain 3-7% behind a lone receiver.  A holder the rules judge
 * clearly slower keeps one (fleet_rules.c, held_back). */
#define REFIT_FLEET_NET_WORKERS 8

/* ---- the rules of a fleet transfer, without threads, clocks or I/O --------
 * How a plan becomes chunks, how chunks are shared among holders, which chunk
 * a holder's worker takes next (stealing and re-reads), what a chunk read
 * from a relay costs, when a pull runs direct, and which holders a receiver
 * picks (fleet_rules.c).  fleet.c's workers call these under their lock with
 * refit_now(); the simulator (tools/sim) calls the same functions with simulated
 * time, so that what it predicts is what this engine decides; test_fleet.c
 * calls them with a clock of its own. */
enum { REFIT_CHUNK_FREE = 0, REFIT_CHUNK_BUSY = 1, REFIT_CHUNK_DONE = 2 };

typedef struct {
    size_t first, n;  /* pieces (regions cut to size; source side in the planned source's coordinates) */
    uint64_t bytes;   /* destination bytes they write */
    uint32_t planned; /* plan source index */
    uint8_t state, dup;
    uint32_t owner; /* holder index while busy */
    uint32_t pref;  /* holder whose share it is */
    double start;
} refit_fleet_chunk_t;

typedef struct {
    refit_fleet_holder_t *h; /* holders (the caller's) */
    uint32_t nh;
    const uint64_t *plan_keys; /* mirror key of each plan source */
    size_t nplan;
    refit_fleet_chunk_t *c; /* refit_fleet_sched_chunks */
    size_t nc, done;
    refit_plan_region_t *pieces;
    size_t npieces;
    uint8_t **avail; /* per holder: chunks a partial relay has written (NULL: not a partial relay) */
    double time_sum; /* chunk times, for the mean a re-read waits for */
    uint64_t time_n;
} refit_fleet_sched_t;

/* Cuts the plan's regions into pieces of at most about `chunk` bytes (along
 * the outermost loop, or the run) and groups consecutive pieces of one
 * source into chunks of up to `chunk` bytes: S->c, S->nc, S->pieces.  Other
 * fields untouched. */
refit_status_t refit_fleet_sched_chunks(refit_fleet_sched_t *S, const refit_plan_t *plan, uint64_t chunk);
/* Frees S->c, S->pieces and S->avail (and its rows; nh entries). */
void refit_fleet_sched_free(refit_fleet_sched_t *S);
/* Whether holder h has or will have chunk c's bytes. */
bool refit_fleet_could_serve(const refit_fleet_sched_t *S, uint32_t h, const refit_fleet_chunk_t *c);
/* Whether holder h has chunk c's bytes now. */
bool refit_fleet_can_serve(const refit_fleet_sched_t *S, uint32_t h, const refit_fleet_chunk_t *c);
/* Shares: each chunk goes to the capable holder with the fewest bytes so far
 * (ties rotate with seed). */
void refit_fleet_share(refit_fleet_sched_t *S, uint32_t seed);
/* The chunk holder h's worker takes at time `now` (marked busy), or NULL
 * (*none_left: nothing this holder could ever serve is left). */
refit_fleet_chunk_t *refit_fleet_claim(refit_fleet_sched_t *S, uint32_t h, double now, bool *none_left);
/* A chunk holder h's worker asks for before h has it, when refit_fleet_claim
 * found none (marked busy), or NULL: the first free chunk of h's share, if h
 * is a waitable relay still receiving.  The relay writes chunks in about
 * that order; the request waits at the relay (a conditional pull,
 * transport.h) and is answered as soon as the chunk is written, instead of
 * a progress read and a request after it: two round trips per hop of a
 * chain through loaded links (README: Fleet). */
refit_fleet_chunk_t *refit_fleet_claim_ahead(refit_fleet_sched_t *S, uint32_t h, double now);
/* How long such a request waits at the relay before it is answered "not
 * yet" (the reader then reads the relay's progress and asks again). */
#define REFIT_FLEET_WAIT_MS 1000
/* Books chunk c read by holder h: `bytes` read, `cost` seconds of the
 * holder's time, dt wall seconds, `rows` read while the relay was receiving.
 * True when this made the chunk done (the first read of it). */
bool refit_fleet_chunk_done(refit_fleet_sched_t *S, uint32_t h, refit_fleet_chunk_t *c, uint64_t bytes, double cost,
                            double dt, bool rows);
/* The region a chunk's piece is read as from holder H: the piece itself from
 * a trainer rank; from a relay, its rows where the reader puts them (`rows`:
 * the relay is still receiving) or its whole destination span. */
void refit_fleet_piece_from(const refit_fleet_holder_t *H, bool rows, refit_plan_region_t *reg);
/* Whether a pull over these holders runs as one direct pull of the plan (see
 * fleet.c): `net`, the holders' transport is not shm; `relay`, the receiver
 * serves its own readers chunk by chunk. */
bool refit_fleet_direct_ok(const refit_fleet_holder_t *h, uint32_t nh, bool net, bool relay, const refit_plan_t *plan);
/* The holder serving plan source s directly (trainer rank s itself), or -1. */
int refit_fleet_direct_holder(const refit_fleet_holder_t *h, uint32_t nh, uint32_t s);

/* Which holders a receiver reads (receiver.c's fleet_select; the tree):
 * RELAYS: the relays with room alone (a limit is set and some have room);
 * ALL: the relays found and the trainer ranks (no limit);
 * TRAINER_IF_ROOM: the trainer ranks, if a load token on them is free, else WAIT;
 * WAIT: until a holder has room.
 * defer_trainer: this receiver read a relay in its last pull; for a short
 * grace (REFIT_FLEET_STICKY_MS, and on while that relay is alive and has not
 * begun the version, up to REFIT_FLEET_STICKY_MAX_MS) it waits for that relay
 * rather than race for the trainer, so that a chain keeps its order and its connections from one
 * version to the next (a new connection over a loaded link costs ~0.1 s per
 * hop, each hop after the one before it).  A joiner (its first pull, relays
 * of its layout alive) defers too, and takes nothing in the grace: a
 * prepared joiner ready as the fleet's pulls start would otherwise win the
 * trainer's token from the chain's head and reorder the chain for this
 * version and the next. */
typedef enum {
    REFIT_FLEET_PICK_RELAYS,
    REFIT_FLEET_PICK_ALL,
    REFIT_FLEET_PICK_TRAINER_IF_ROOM,
    REFIT_FLEET_PICK_WAIT,
} refit_fleet_pick_t;
refit_fleet_pick_t refit_fleet_pick(uint32_t max_readers, uint32_t relays_with_room, uint32_t relays_holding,
                                    bool defer_trainer);
#define REFIT_FLEET_STICKY_MS 250
/* ... and on while that relay is alive and has not begun the version (it
 * waits for its own: a chain forms hop by hop, each hop a registry look and a
 * connection; one CI run on this 2-core host took ~0.3 s per hop, past the
 * grace, and the chain reordered), up to this. */
#define REFIT_FLEET_STICKY_MAX_MS 2000

/* The thresholds of the claim rules (fleet_rules.c), beside the grace above.
 * A holder is clearly slower than another (its share may be taken, and it
 * keeps one chunk in flight: held_back) when its seconds per byte are over
 * REFIT_FLEET_SLOWER_RATIO times the other's once each has served
 * REFIT_FLEET_SLOWER_CHUNKS chunks: CPU scheduling noise on a busy 2-core
 * host stays under 3x, a link at a tenth of the speed does not. */
#define REFIT_FLEET_SLOWER_RATIO 3.0
#define REFIT_FLEET_SLOWER_CHUNKS 3
/* ... or when a chunk of its has been in flight for over
 * REFIT_FLEET_STUCK_RATIO times what the other would take for it, plus
 * REFIT_FLEET_STUCK_S seconds (a stuck source is found before its first
 * chunks are counted; the margin keeps tiny chunks out of it). */
#define REFIT_FLEET_STUCK_RATIO 10.0
#define REFIT_FLEET_STUCK_S 0.1
/* A worker with nothing left to claim re-reads a chunk another holder has
 * had in flight for over REFIT_FLEET_REREAD_RATIO times the mean chunk time
 * plus REFIT_FLEET_REREAD_S seconds (a slow source's tail is worked around,
 * an ordinary chunk's jitter is not); before any chunk is done the mean is
 * taken as REFIT_FLEET_FIRST_MEAN_S (20 ms: a 2 MiB chunk over a slow link). */
#define REFIT_FLEET_REREAD_RATIO 4.0
#define REFIT_FLEET_REREAD_S 0.1
#define REFIT_FLEET_FIRST_MEAN_S 0.02
/* Whether a holder with `readers` load tokens takes one more (max_readers 0: no limit). */
bool refit_fleet_room(uint32_t readers, uint32_t max_readers);

uint64_t refit_fleet_mirror_key(const refit_manifest_t *m);
/* A hash of the incarnations of the trainer ranks whose records are present
 * (recs[k], present[k], k < world): which publishers a version's bytes are. */
uint64_t refit_fleet_origin(const refit_version_record_t *recs, const uint8_t *present, uint32_t world);

/* ---- the two ways a fleet pull moves bytes (fleet.c) ------------------------
 * The receiver (receiver_transfer.c, its host path) asks which applies and
 * calls it: the answer is its pull's path (REFIT_RX_PATH_HOST_DIRECT or
 * REFIT_RX_PATH_HOST_FLEET). */
/* Whether the pull over these holders runs as one direct pull of the plan
 * (refit_fleet_direct_ok with x's transport and whether x's receiver is a relay). */
bool refit_fleet_runs_direct(const refit_fleet_xfer_t *x, const refit_fleet_holder_t *h, uint32_t nh);
/* One pull of the plan from the trainer ranks themselves (with x->threads
 * copy threads; over UCX from every source at once); the holders count one
 * chunk per planned source.  REFIT_ERR_INTERNAL when !refit_fleet_runs_direct;
 * else the transport's error (REFIT_ERR_PEER: a source died; the caller then
 * redoes the plan in chunks, where the dead one is found and dropped). */
refit_status_t refit_fleet_direct(const refit_fleet_xfer_t *x, refit_fleet_holder_t *h, uint32_t nh,
                                  refit_pull_stats_t *stats);
/* The chunked transfer over every holder: shares, stealing, re-reads,
 * failover, relays followed by their progress, ours marked (fleet.c's top
 * comment).  REFIT_ERR_MISSING_SOURCE when some bytes have no connected
 * holder; REFIT_ERR_PEER when chunks were left with no live holder;
 * REFIT_ERR_TIMEOUT; x->tick's error. */
refit_status_t refit_fleet_chunks(const refit_fleet_xfer_t *x, refit_fleet_holder_t *holders, uint32_t nh,
                                  refit_pull_stats_t *stats);
/* Zeroes the holders' transfer counts (bytes, chunks, busy time, lanes): a
 * failed direct pull's, before the chunks redo it. */
void refit_fleet_clear_counts(refit_fleet_holder_t *h, uint32_t nh);

#endif
