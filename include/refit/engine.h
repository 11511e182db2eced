/*
 * refit/engine.h - publishers (trainer ranks) and receivers (rollout ranks).
 *
 * A publisher owns one rank's manifest and memory.  publish(version) makes the
 * bytes currently in its memory visible as `version`: the first call also
 * exposes the memory through the transports and stores the manifest in the
 * registry; later calls write a small version record.  A version is visible
 * to receivers only when every live rank of the group has published it.
 *
 *   in-place mode: the caller must not change its memory until
 *     refit_publisher_wait_readers(version) returned REFIT_OK (the version is
 *     retired, no new reader may start, and every lease was released or
 *     expired);
 *   snapshot mode: publish copies the memory into one of two staging arenas
 *     and returns; the caller may change its memory at once.  A staging
 *     arena is reused only after the readers of the version it held are done.
 *
 * A receiver owns one rank's manifest and memory.  pull(version) discovers the
 * sources, plans (once per pair of layout signatures; later pulls read no
 * manifest they already have and plan nothing), transfers from all sources at
 * once, checks that no source changed or died during the transfer, verifies
 * (optionally against the synthetic truth), commits and releases its lease.
 * A pull that fails after it started writing leaves the receiver marked
 * unusable (refit_receiver_usable() false) until a later pull completes;
 * one that fails before leaves the previous version intact.
 *
 * Threads: a publisher runs a heartbeat thread of its own; both objects may be
 * used from one thread at a time.  Every wait is bounded by a timeout.
 *
 * Timeouts (every `int timeout_ms` here): > 0 waits up to that many
 * milliseconds; 0 or negative does not wait (checks once: a version already
 * complete is pulled, readers already gone are seen); there is no "wait
 * forever".
 *
 * Ownership: refit_publisher_create and refit_receiver_create take the
 * manifest they are given on success (destroy frees it) and leave it to the
 * caller on failure (the caller destroys it); the strings a params structure
 * points at are copied or read during create only, and the params structure
 * itself may be reused or freed once create returned.  Outputs are written
 * only on success.
 */
#ifndef REFIT_ENGINE_H
#define REFIT_ENGINE_H

#include <stdbool.h>
#include <stddef.h>

#include "refit/manifest.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct refit_publisher refit_publisher_t;
typedef struct refit_receiver refit_receiver_t;

typedef enum { REFIT_MODE_IN_PLACE = 0, REFIT_MODE_SNAPSHOT = 1 } refit_publish_mode_t;

/* Registry URL used when params leave it NULL: $REFIT_REGISTRY, else
 * "file:$XDG_RUNTIME_DIR/refit/registry", else "file:$HOME/.cache/refit/registry",
 * else the same under this user's home directory in the passwd database, else ""
 * (never a world-writable directory such as /tmp; docs/security.md): opening ""
 * fails with REFIT_ERR_INVALID_ARG saying what to set. */
REFIT_API const char *refit_default_registry(void);

/* Sized outputs: the structures the library fills for the caller
 * (refit_pull_report_t, refit_holder_stat_t, refit_publish_delta_t,
 * refit_fp8_relay_report_t, refit_plan_stats_t, refit_truth_report_t,
 * refit_select_report_t, refit_delta_info_t, refit_delta_apply_stats_t)
 * begin with `size`, which the caller sets to the
 * sizeof of the structure as it compiled it (their _INIT macros do).  The
 * library writes only the fields that fit in that size and never past it,
 * so a program built against older headers keeps working with a newer
 * library (fields it does not know are not written); fields the library
 * does not know (a newer program) keep the caller's values.  A size smaller
 * than the structure's first sized version is refused with
 * REFIT_ERR_INVALID_ARG naming the structure. */

/* Params with a size: the structures a caller fills for the library
 * (refit_publisher_params_t, refit_receiver_params_t, refit_plan_params_t)
 * begin with `size`, the sizeof of the structure as the caller compiled it;
 * their _INIT macros set it and every default by name, so C callers write
 *
 *     refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
 *     rp.job = "run-7";
 *
 * The library reads the first min(size, its own sizeof) bytes and takes the
 * fields past them as 0: a field added in a later release means its default
 * when it is 0, so a program built against older headers keeps working with
 * a newer library.  A size smaller than the structure's first layout
 * (REFIT_*_PARAMS_SIZE_1) or larger than the library's own sizeof (a program
 * built against newer headers than the library it runs with) is refused with
 * REFIT_ERR_INVALID_ARG naming the structure.  A NULL params pointer means
 * every default. */

/* sizeof the public structure named `name` (every structure of
 * refit_abi_layout: "refit_pull_report_t", "refit_publisher_params_t", ...),
 * 0 for others: for bindings that mirror the structures, to refuse a library
 * they do not match. */
REFIT_API size_t refit_struct_size(const char *name);

/* The layout of the public structures as this library was compiled: one
 * entry per field (structure, field, offset, size) and one per structure
 * (field NULL, offset 0, size = sizeof), structures in order.  For bindings
 * that mirror the structures (python/refit/_lib.py is checked against it
 * field by field).  *count (not NULL) receives the number of entries; the
 * table is static. */
typedef struct {
    const char *structure; /* "refit_pull_report_t" */
    const char *field;     /* "bytes"; NULL: the structure itself */
    size_t offset, size;
} refit_abi_field_t;
REFIT_API const refit_abi_field_t *refit_abi_layout(size_t *count);

/* Authentication (docs/security.md): every registry entry is signed and
 * checked with keys derived from the job's secret, and every transport
 * connection proves it.  secret_file names a file holding it (at least 16
 * bytes, mode 0600, ours); NULL: $REFIT_SECRET_FILE, then $REFIT_SECRET, then
 * (file: registries only) DIR/<job>/.secret, created on first use.  A redis
 * registry without a secret is refused (REFIT_ERR_AUTH) unless `insecure`
 * (or $REFIT_INSECURE=1) is set, which uses a public key: anyone who can
 * write the registry or reach a listener is then trusted. */

/* The most memory regions a publisher's manifest may have (refit_publisher_create
 * refuses more with REFIT_ERR_INVALID_ARG); a relay (a receiver with
 * relay_slot >= 0) serves at most one fewer of its own, its progress region
 * being one more (refit_receiver_create refuses more).  511: a publisher exposes per buffer its
 * regions, as many delta arenas (delta mode), a digest table and a version
 * stamp, 2 * 511 + 2 = 1024 regions, the most one shm connection maps.  The
 * vLLM backend makes one region per directly bound parameter (about 435 for
 * Qwen3-30B-A3B on CUDA). */
#define REFIT_MAX_REGIONS 511u

/* Publisher params (sized: above).  Every field's 0 / NULL is its default,
 * except `device` (0 is GPU 0; host memory is -1, as in the _INIT macro). */
typedef struct {
    size_t size;                   /* sizeof(refit_publisher_params_t): REFIT_PUBLISHER_PARAMS_INIT */
    const char *registry;          /* "file:DIR" or "redis://HOST:PORT"; NULL: refit_default_registry() */
    const char *job;               /* namespace shared by publishers and receivers; NULL: "default" */
    const char *group;             /* source group; NULL: "trainer" */
    const char *transports;        /* transports to expose memory through, e.g. "shm,ucx"; NULL: every built-in one */
    const char *transport_options; /* e.g. "ucx.listen=10.77.0.1"; NULL: defaults */
    refit_publish_mode_t mode;     /* 0: REFIT_MODE_IN_PLACE */
    uint32_t heartbeat_ms;         /* 0: 200 */
    uint32_t dead_ms;              /* a rank silent this long is dead; 0: 2000; at least 2 * heartbeat_ms */
    int device;                    /* CUDA device of the memory (refit_publisher_alloc allocates there
                                      through a GPU transport: cuda_ipc), -1: host memory */
    /* Delta refit (host memory).  The publisher keeps a copy of what it last
     * published (one more copy of its regions) and, with each version, the
     * difference from the previous one in its own byte coordinates (sparse
     * 2-byte units, or whole chunks where denser: refit/experimental/delta.h), exposed
     * like its memory.  A receiver whose memory holds exactly the previous
     * version (same publisher incarnation) fetches the parts of the delta its
     * plan reads and applies them in place; any other receiver pulls in full. */
    bool delta;              /* false: publish in full only */
    uint32_t delta_max_pct;  /* a version whose delta exceeds this share of a region's bytes is offered
                                      in full only; 0: 10 (sparse costs 4 bytes per changed 2-byte unit, so
                                      10% holds up to about 5% of elements changed); above 100: 100 */
    unsigned delta_threads;  /* encoding threads at publish; 0: 4, at most one per CPU */
    const char *secret_file; /* the job's secret (above); NULL: from the environment or the registry */
    bool insecure;           /* no secret: public key (above) */
    uint32_t lease_ms;       /* the longest lease its receivers take (their lease_ms); a publisher that
                                      lost its view of the registry (its entries vanished: a store restarted
                                      without its data) waits this long before it trusts "no leases"; 0: 10000 */
    bool no_digest;          /* true: publish no content digests (receivers cannot verify this rank's
                                      bytes and say so); false: digest tables computed at each publish */
} refit_publisher_params_t;
/* The end of the first layout's last field: the smallest size accepted. */
#define REFIT_PUBLISHER_PARAMS_SIZE_1 (offsetof(refit_publisher_params_t, no_digest) + sizeof(bool))
/* Designated initializers in declaration order: C99 and C++20. */
#define REFIT_PUBLISHER_PARAMS_INIT                                                         \
    {                                                                                       \
        .size = sizeof(refit_publisher_params_t), .mode = REFIT_MODE_IN_PLACE, .device = -1 \
    }

/* Creates a publisher for the rank `manifest` describes (finalized, at most
 * REFIT_MAX_REGIONS regions).  On success the publisher owns the manifest;
 * on failure the caller keeps it.  params NULL: every default.  Opens the
 * registry (REFIT_ERR_REGISTRY, REFIT_ERR_AUTH, REFIT_ERR_UNSUPPORTED);
 * REFIT_ERR_INVALID_ARG for params of a wrong size or a manifest that is
 * not finalized or has too many regions. */
REFIT_API refit_status_t refit_publisher_create(const refit_publisher_params_t *params, refit_manifest_t *manifest,
                                                refit_publisher_t **out);
/* Memory for region r that every transport reads well (shared memory for
 * shm; device memory from cudaMalloc for cuda_ipc when params.device >= 0);
 * owned by the publisher.  *base stays valid until destroy.  With a device,
 * each region is exposed only through transports that read GPU memory. */
REFIT_API refit_status_t refit_publisher_alloc(refit_publisher_t *p, uint32_t region, void **base);
/* Uses the caller's memory for region r (read by process_vm_readv for shm). */
REFIT_API refit_status_t refit_publisher_attach(refit_publisher_t *p, uint32_t region, void *base);
/* Publishes the memory as `version` (greater than any published before).
 * REFIT_ERR_INVALID_ARG if a region has no memory or versions go backwards;
 * REFIT_ERR_TIMEOUT in snapshot mode if a staging arena's readers did not
 * finish within dead_ms * 4 + lease_ms. */
REFIT_API refit_status_t refit_publisher_publish(refit_publisher_t *p, uint64_t version);
/* In-place mode: retires `version` and waits until no reader holds it.
 * REFIT_ERR_TIMEOUT (with the number of readers) after timeout_ms. */
REFIT_API refit_status_t refit_publisher_wait_readers(refit_publisher_t *p, uint64_t version, int timeout_ms);
/* What the last publish offered as a delta (delta mode). */
typedef struct {
    size_t size;                    /* sizeof(refit_publish_delta_t) as the caller compiled it (sized output,
                                       below): REFIT_PUBLISH_DELTA_INIT */
    uint64_t version, base_version; /* base_version 0: no delta offered (first version, too large, failed) */
    uint64_t bytes;                 /* encoded bytes over every region */
    uint64_t region_bytes;          /* the regions' bytes */
    uint64_t changed_units;         /* 2-byte units that differ from the base */
    double encode_ms;               /* wall time spent encoding inside publish */
    uint32_t table_from_delta;      /* 1: this version's digest table is the base's plus the changes encoded
                                       (no pass over the shard: docs/digest.md); 0: filled in a pass (the first
                                       version, one after a version that changed over 3% of its units, digests
                                       off, GPU memory, REFIT_DIGEST_TABLE=full) */
} refit_publish_delta_t;
#ifdef __cplusplus
#define REFIT_PUBLISH_DELTA_INIT      \
    {                                 \
        sizeof(refit_publish_delta_t) \
    }
#else
#define REFIT_PUBLISH_DELTA_INIT              \
    {                                         \
        .size = sizeof(refit_publish_delta_t) \
    }
#endif
/* out->size must be set (REFIT_PUBLISH_DELTA_INIT); REFIT_ERR_INVALID_ARG for
 * a size too small or a publisher made without delta. */
REFIT_API refit_status_t refit_publisher_last_delta(const refit_publisher_t *p, refit_publish_delta_t *out);
/* Milliseconds the last publish spent computing its content digests (0 when
 * digests are off). */
REFIT_API double refit_publisher_digest_ms(const refit_publisher_t *p);
/* Waits until `n` distinct receivers reported committing `version` (or a
 * later one).  For drivers that want every receiver to see every version. */
REFIT_API refit_status_t refit_publisher_wait_acks(refit_publisher_t *p, uint64_t version, uint32_t n, int timeout_ms);
/* Stops the heartbeat, removes the rank from the registry, frees its memory. */
REFIT_API void refit_publisher_destroy(refit_publisher_t *p);

typedef enum { REFIT_VERIFY_NONE = 0, REFIT_VERIFY_TRUTH = 1 } refit_verify_mode_t;

/* Receiver params (sized: above).  Every field's 0 / NULL is its default,
 * except `device` and `relay_slot` (0 is GPU 0 and relay slot 0; host memory
 * and no relay are -1, as in the _INIT macro). */
typedef struct {
    size_t size;                        /* sizeof(refit_receiver_params_t): REFIT_RECEIVER_PARAMS_INIT */
    const char *registry, *job, *group; /* as for publishers */
    const char *transports;             /* preference order, e.g. "shm,ucx"; NULL: "shm,ucx" */
    const char *transport_options;      /* e.g. "ucx.require=rdma" */
    const char *reader;                 /* lease holder name; NULL: "<host>:<pid>:r<rank>" (two receivers of one rank
                                           in one process need distinct names: leases and acks are counted by it) */
    uint32_t lease_ms;                  /* lease ttl, renewed during pulls; 0: 10000 */
    unsigned threads;                   /* copy threads for shm; 0: one per CPU */
    refit_verify_mode_t verify;         /* 0: REFIT_VERIFY_NONE (content digests still apply: no_digest) */
    int device;                         /* CUDA device of the receiver's memory, -1: host.  With a device,
                                      refit_receiver_alloc allocates GPU memory, attached memory must
                                      be on that device, padding is written and the truth verified by
                                      kernels; transports that cannot write GPU memory (shm, ucx) go
                                      through a pinned host staging copy. */
    /* Fleet (host memory, or GPU memory when none of the transports writes
     * GPU memory: then pulls land in the pinned staging, and a relay serves
     * from there).  Every pull reads from every holder of the bytes it
     * needs - trainer ranks, their DP replicas, relays of this receiver's
     * layout and rank - in chunks that fast holders steal from slow ones; a
     * holder that dies is dropped and its chunks go to others. */
    int relay_slot;              /* >= 0: after each commit, serve the version to other receivers of the
                                      same layout and rank as relay slot N (0..15; unique per rank);
                                      -1: not a relay */
    uint32_t max_readers;        /* a holder feeds at most this many readers at once, and the trainer
                                      only while no relay holds the version (a tree); 0: no limit */
    uint32_t chunk_kb;           /* chunk size for fleet transfers; 0: 2048 */
    uint32_t relay_heartbeat_ms; /* the relay's heartbeat (dead after 4x); 0: 200 */
    /* Delta refit: when every source this receiver reads offers a delta
     * whose base is the version this memory holds (same publisher
     * incarnation), the pull fetches only the delta chunks its plan reads and
     * applies them in place (bit-exact; padding is untouched).  GPU memory:
     * only when the pulls go through the pinned host staging, where the delta
     * applies before the staging is copied up.  Any failure on that path falls
     * back to a full pull within the same call, except a timeout or a failure
     * after the pull's deadline (then the error is returned, the memory marked
     * unusable if the apply had begun).  true: always pull in full. */
    bool no_delta;           /* false: take deltas where offered */
    double truth_fraction;   /* REFIT_VERIFY_TRUTH against refit_truth_fill_delta(fraction): the share of
                                      elements that change per version (host memory); 0, or outside (0, 1):
                                      1 (every element, refit_truth_fill) */
    const char *secret_file; /* the job's secret (above); NULL: from the environment or the registry */
    bool insecure;           /* no secret: public key (above) */
    bool no_digest;          /* true: do not check the pulled bytes against the sources' content digests
                                      (for those who accept the risk); false: every verifiable byte is checked
                                      before the version is committed (REFIT_ERR_VERIFY naming the tensor) */
    bool fp8;                /* true: the memory is the FP8 variant of the manifest's layout (refit/experimental/fp8.h:
                                      e4m3 linear weights in 128x128 blocks with fp32 scales, the rest as is;
                                      one region of refit_fp8_target_bytes, tensors as refit_receiver_fp8_target
                                      lists them), quantized from the bf16 sources on the GPU while pulling:
                                      needs `device` and the cuda_ipc transport; no relay; no delta; content
                                      digests do not apply to quantized bytes (REFIT_VERIFY_TRUTH checks them
                                      against the truth quantized by the same GPU code, whose arithmetic
                                      tests/gpu/test_gpu_fp8.c checks against the CPU quantizer) */
} refit_receiver_params_t;
/* The end of the first layout's last field: the smallest size accepted. */
#define REFIT_RECEIVER_PARAMS_SIZE_1 (offsetof(refit_receiver_params_t, fp8) + sizeof(bool))
/* Designated initializers in declaration order: C99 and C++20. */
#define REFIT_RECEIVER_PARAMS_INIT                                                                           \
    {                                                                                                        \
        .size = sizeof(refit_receiver_params_t), .verify = REFIT_VERIFY_NONE, .device = -1, .relay_slot = -1 \
    }

/* Creates a receiver for the rank `manifest` describes (finalized).  On
 * success the receiver owns the manifest; on failure the caller keeps it.
 * params NULL: every default.  REFIT_ERR_INVALID_ARG for params of a wrong
 * size or a manifest not finalized; REFIT_ERR_UNSUPPORTED for a combination
 * this build or memory cannot do (the detail says which); registry and
 * transport errors as for publishers. */
REFIT_API refit_status_t refit_receiver_create(const refit_receiver_params_t *params, refit_manifest_t *manifest,
                                               refit_receiver_t **out);
REFIT_API refit_status_t refit_receiver_alloc(refit_receiver_t *r, uint32_t region, void **base);
REFIT_API refit_status_t refit_receiver_attach(refit_receiver_t *r, uint32_t region, void *base);
#define REFIT_VERSION_NEWEST UINT64_MAX

/* The way a pull's bytes came (refit_pull_report_t.path), decided by the
 * receiver: at create from its params, its memory and its transports (the
 * host path, or its GPU's), then per pull from what the sources offer (a
 * delta) and, on the host path, from the holders it picked.
 *   HOST_DIRECT: host memory (or a GPU receiver's pinned staging, when none
 *     of its transports writes GPU memory): one pull of the plan from the
 *     trainer ranks themselves;
 *   HOST_FLEET: the same memory, in chunks over every holder of the bytes:
 *     trainer ranks, their DP replicas and relays (a relay among the
 *     holders, a paced holder, or over a network a receiver that is a relay
 *     or bytes with two holders);
 *   GPU_DIRECT: GPU memory written by its transports (cuda_ipc), every
 *     source at once;
 *   GPU_FP8: an FP8 receiver (params.fp8): cuda_ipc quantizes the bf16
 *     sources into its FP8 arena;
 *   DELTA: the delta from the version this memory held, applied in place;
 *   NONE: no bytes moved (the pull failed before its transfer). */
typedef enum {
    REFIT_RX_PATH_NONE = 0,
    REFIT_RX_PATH_HOST_DIRECT = 1,
    REFIT_RX_PATH_HOST_FLEET = 2,
    REFIT_RX_PATH_GPU_DIRECT = 3,
    REFIT_RX_PATH_GPU_FP8 = 4,
    REFIT_RX_PATH_DELTA = 5,
} refit_rx_path_t;
/* "none", "host_direct", "host_fleet", "gpu_direct", "gpu_fp8", "delta";
 * "unknown" for a value not in the list.  A static string. */
REFIT_API const char *refit_rx_path_name(refit_rx_path_t path);

typedef struct {
    size_t size;             /* sizeof(refit_pull_report_t) as the caller compiled it: REFIT_PULL_REPORT_INIT */
    uint64_t version;        /* the version pulled */
    uint64_t bytes;          /* bytes moved */
    uint32_t sources;        /* source ranks read from */
    bool planned;            /* a plan was computed (false: cached) */
    uint32_t manifests_read; /* manifests fetched from the registry (sources' and relays') */
    double wait_ms;          /* waiting for the version to be complete (not part of discover_ms) */
    double discover_ms, plan_ms, transfer_ms, verify_ms;
    double total_ms;         /* the pull without wait_ms */
    char transport[32];      /* transports used, e.g. "shm" */
    char lanes[256];         /* what carried the bytes */
    uint64_t requests;       /* copy tasks, network requests, or GPU launches and uploads */
    uint64_t launches;       /* GPU kernel launches (copies and fills) */
    double connect_ms;       /* connecting sources (opening IPC handles, mapping); 0 when cached */
    double begin_s, end_s;   /* refit_now()-clock (CLOCK_MONOTONIC) times: the start of the discovery
                                round that found the version, and the end of the transfer
                                (data in place, before verification) */
    double transfer_begin_s; /* the same clock: when the transfer (connect included) began */
    uint64_t delta_base;     /* a delta from this version was applied (0: a full pull); `bytes` are its bytes */
    uint64_t delta_units;    /* 2-byte units the delta changed in this receiver's memory (dense chunks:
                                every unit they cover) */
    /* Content digests (no_digest off): the bytes checked against the sources'
     * digests, those that could not be (a source without digests - GPU
     * memory, no_digest -, GPU memory here, boxes no digest covers), and
     * the time it took (hashing this memory, fetching the entries,
     * comparing); part of verify_ms. */
    uint64_t digest_bytes, unverified_bytes;
    double digest_ms;
    /* Version stamps (docs/security.md): the time spent reading every
     * source's stamp before and after the transfer and comparing it with its
     * record (included in plan_ms and verify_ms), and the sources read
     * without one (GPU publishers: their bytes are bound to the version by
     * the registry and the leases alone). */
    double stamp_ms;
    uint32_t unstamped_sources;
    uint32_t path; /* refit_rx_path_t: the way the bytes came (refit_rx_path_name) */
    /* The digests of this memory were computed by the copies that wrote it,
     * in the same pass (a direct host pull over shm; docs/digest.md): the
     * check read nothing again.  False when digest_bytes were hashed in a
     * pass of their own, or no digest was checked. */
    bool digest_fused;
} refit_pull_report_t;
#ifdef __cplusplus
#define REFIT_PULL_REPORT_INIT      \
    {                               \
        sizeof(refit_pull_report_t) \
    }
#else
#define REFIT_PULL_REPORT_INIT              \
    {                                       \
        .size = sizeof(refit_pull_report_t) \
    }
#endif

/* Pulls `version` (or the newest complete version newer than the committed
 * one, with REFIT_VERSION_NEWEST), waiting up to timeout_ms for it.
 * REFIT_ERR_TIMEOUT, REFIT_ERR_STALE (that version was retired),
 * REFIT_ERR_PEER (a source died or changed during the transfer),
 * REFIT_ERR_MISSING_SOURCE / UNCOVERED / MISMATCH / IDENTITY (planning),
 * REFIT_ERR_VERIFY, REFIT_ERR_TRANSPORT, REFIT_ERR_REGISTRY, REFIT_ERR_CORRUPT
 * (a manifest in the registry) - each with a detail.  report may be NULL;
 * otherwise report->size must be set (REFIT_PULL_REPORT_INIT;
 * REFIT_ERR_INVALID_ARG before anything else if it is too small), and the
 * report is written whether the pull succeeds or not. */
REFIT_API refit_status_t refit_receiver_pull(refit_receiver_t *r, uint64_t version, int timeout_ms,
                                             refit_pull_report_t *report);
/* Gets ready for the first pull without moving bytes (optional): waits up
 * to timeout_ms for every source rank to have published, reads their
 * manifests, plans, and connects to the sources the plan reads (cuda_ipc:
 * opens their IPC handles, the bulk of a first refit's cost) and, when its
 * memory is allocated or attached, builds the transport's copy table for
 * the plan (cuda_ipc: the batch, or an FP8 receiver's quantize-on-copy
 * table, about 0.1 s for Qwen3-30B-A3B).  A receiver
 * that joins a running job calls it before it needs weights (e.g. while its
 * engine starts), so that its first pull costs about what a steady one does;
 * pulls reuse the plan and connections while the sources' manifests and
 * incarnations stay the same.  Receivers in host memory (the fleet path,
 * which picks its holders per pull) plan and read the manifests of the
 * relays of their rank present then (a joiner's first pull then reads none
 * while the others pull), but connect nothing here.
 * *prepare_ms (may be NULL): time spent, written on success. */
REFIT_API refit_status_t refit_receiver_prepare(refit_receiver_t *r, int timeout_ms, double *prepare_ms);
/* Per holder of the last pull (fleet path): what it served. */
typedef struct {
    size_t size;     /* sizeof(refit_holder_stat_t) as the caller compiled it: REFIT_HOLDER_STAT_INIT */
    char name[96];   /* "trainer:R" or "relay:S" */
    uint64_t bytes;  /* bytes read from it (re-read chunks included) */
    uint32_t chunks; /* chunks it served */
    uint32_t steals; /* chunks it re-read from a slower holder */
    bool failed;     /* dropped during the pull (died, broke) */
    uint32_t early;  /* a relay: chunks read while it was still receiving the version */
    uint32_t ahead;  /* a relay: of those, chunks asked for before it had them (answered once written) */
    uint32_t late;   /* a relay: such requests it did not answer in time (asked again after a progress read) */
} refit_holder_stat_t;
#ifdef __cplusplus
#define REFIT_HOLDER_STAT_INIT      \
    {                               \
        sizeof(refit_holder_stat_t) \
    }
#else
#define REFIT_HOLDER_STAT_INIT              \
    {                                       \
        .size = sizeof(refit_holder_stat_t) \
    }
#endif
/* Copies up to max entries into out[0 .. max) and returns the number of
 * holders of the last pull (0 when it did not use the fleet path); *count
 * (may be NULL) receives it.  out[0].size is the size of every element (the
 * array's stride: set it, REFIT_HOLDER_STAT_INIT, in at least the first);
 * REFIT_ERR_INVALID_ARG (nothing written) if it is too small.  out may be
 * NULL with max 0 to ask for the count. */
REFIT_API refit_status_t refit_receiver_holders(const refit_receiver_t *r, refit_holder_stat_t *out, size_t max,
                                                size_t *count);

/* The last version pulled completely (0: none). */
REFIT_API uint64_t refit_receiver_committed(const refit_receiver_t *r);
/* False while the memory holds a partially written version. */
REFIT_API bool refit_receiver_usable(const refit_receiver_t *r);
REFIT_API void refit_receiver_destroy(refit_receiver_t *r);

#ifdef __cplusplus
}
#endif
#endif
