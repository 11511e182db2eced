/* Transports: how bytes move from a source rank's memory into a receiver's.
 *
 * Publisher side: a transport exposes a memory region and returns an access
 * descriptor (opaque bytes) that travels in the manifest as the attribute
 * "<transport>.region.<i>".  Receiver side: from a source manifest's
 * descriptors it connects a peer, then executes plans: every source at
 * once, each region of the plan read from its source's region.
 *
 * Implementations: shm (same host: memfd / POSIX shared memory mapped by the
 * receiver, or process_vm_readv for memory that is not shared), ucx
 * (network, through UCX) and cuda_ipc (same host, GPU memory: CUDA IPC
 * handles and a batched copy kernel).  Each optional dependency lives in its own file;
 * everything else talks to it through this table.
 *
 * The table is what every transport does; what only some do are extensions,
 * asked for by kind (refit_transport_ext): FP8 quantize-on-copy (cuda_ipc)
 * and conditional pulls (ucx, for relays read ahead).  A transport knows
 * nothing of an extension it does not have; the caller that needs one asks
 * and refuses with REFIT_ERR_UNSUPPORTED. */
#ifndef REFIT_TRANSPORT_H
#define REFIT_TRANSPORT_H

#include "plan/plan.h"
#include "util/util.h"

typedef struct refit_transport refit_transport_t; /* per-process context of one transport */
typedef struct refit_peer refit_peer_t;           /* a connected source rank */

typedef struct {
    uint64_t bytes;    /* moved by this pull */
    uint64_t requests; /* network requests, copy tasks, or kernel launches and uploads issued */
    uint64_t launches; /* GPU kernel launches (cuda_ipc) */
    char lanes[256];   /* what carried the bytes, e.g. "shm:mmap" or "ucx:tcp/veth0 (am)" */
} refit_pull_stats_t;

typedef struct {
    double deadline;  /* refit_now() time by which the pull must end (REFIT_ERR_TIMEOUT) */
    unsigned threads; /* copy threads for local transports (0: one per CPU) */
    /* Called now and then during long pulls (from the pulling thread); a
     * non-zero status aborts the pull with that status (used to renew leases
     * and to notice dead sources). */
    refit_status_t (*tick)(void *user);
    void *user;
    /* Hash while copying (data/digest.h): a transport whose copies are its
     * own (shm) passes every byte it writes through dmap, adding the
     * digests into dacc and the mapped bytes hashed into *dbytes; one that
     * cannot leaves both, and the receiver hashes its memory in a second
     * pass.  NULL dmap: no hashing. */
    const refit_digest_map_t *dmap;
    refit_dsum_t *dacc;
    uint64_t *dbytes;
    /* The same for GPU memory (cuda_ipc, verify/verify.h): a transport whose
     * copy kernel can hash what it writes copies through gdig's fused kernel
     * and sets *ghashed: gdig's sums on the device are then those of every
     * digested byte of the destination.  NULL gdig: no hashing. */
    struct refit_gpu_digest *gdig;
    bool *ghashed;
    /* This process serves data while it pulls (a fleet relay handing on the
     * chunks it receives): its egress queue is full, and a round trip through
     * it is slow.  A transport that can trade a copy for a round trip should
     * (ucx over TCP: eager replies, ucx_opts tcp_eager=auto). */
    bool busy_egress;
} refit_pull_ctl_t;

/* What memory a transport handles.  0 means host memory only (shm, ucx). */
#define REFIT_TCAP_HOST_SRC 1u   /* exposes host memory */
#define REFIT_TCAP_DEVICE_SRC 2u /* exposes GPU memory */
#define REFIT_TCAP_HOST_DST 4u   /* pulls into host memory */
#define REFIT_TCAP_DEVICE_DST 8u /* pulls into GPU memory */
#define REFIT_TCAP_HOST (REFIT_TCAP_HOST_SRC | REFIT_TCAP_HOST_DST)
#define REFIT_TCAP_CONCURRENT 16u /* pull may run in several threads at once (a fleet's holders in parallel) */

/* Extensions: what a transport can do beyond the generic pull, asked for by
 * kind (refit_transport_ext).  A transport without one answers NULL and
 * knows nothing of it; the caller that needs it refuses with
 * REFIT_ERR_UNSUPPORTED, naming the transport.  Each kind has a table of its
 * own below. */
typedef enum {
    REFIT_TEXT_FP8 = 1,    /* refit_transport_fp8_t (cuda_ipc) */
    REFIT_TEXT_WAIT = 2,   /* refit_transport_wait_t (ucx) */
    REFIT_TEXT_DEVMEM = 3, /* refit_transport_devmem_t (cuda_ipc) */
} refit_transport_ext_kind_t;

/* Quantize-on-copy: the plan's destination is bf16 (the receiver's bf16
 * manifest), but dst_bases[0] is the arena of its FP8 target (refit/experimental/fp8.h):
 * the pull writes e4m3 weights, their scales, the kept tensors and the
 * padding (plan/fp8_table.h).  GPU destinations only, every source of the
 * plan through this transport. */
typedef struct {
    const struct refit_fp8_target *target;
    const refit_manifest_t *bf16;
} refit_pull_fp8_t;

typedef struct {
    /* As the generic pull and warm, converting as fp8 says. */
    refit_status_t (*pull)(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                           void *const *dst_bases, const refit_pull_ctl_t *ctl, const refit_pull_fp8_t *fp8,
                           refit_pull_stats_t *stats);
    refit_status_t (*warm)(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                           void *const *dst_bases, const refit_pull_ctl_t *ctl, const refit_pull_fp8_t *fp8);
} refit_transport_fp8_t;

/* A conditional pull: the source answers each request only once, in its own
 * memory, the 8-byte word at word_off of its region `region` (a source
 * region index) equals `word` and the byte at flag_off of that region is
 * non-zero, waiting up to `ms` (> 0) for it; a request still waiting then
 * fails the pull with REFIT_ERR_BUSY.  A relay's progress (engine/fleet/fleet.h)
 * is such a pair: the version it receives and a chunk's mark, so a reader
 * asks for a chunk before it is written and gets it one link's latency
 * after. */
typedef struct {
    uint32_t region, ms;
    uint64_t word_off, word, flag_off;
} refit_pull_wait_t;

typedef struct {
    /* As the generic pull, every request carrying the condition w. */
    refit_status_t (*pull)(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                           void *const *dst_bases, const refit_pull_ctl_t *ctl, const refit_pull_wait_t *w,
                           refit_pull_stats_t *stats);
    /* Memory this process exposes has changed (a relay marked a chunk
     * written): look at waiting conditional requests now.  Without the call
     * a transport looks within a millisecond anyway. */
    void (*notify)(refit_transport_t *t);
} refit_transport_wait_t;

/* A source's memory as a kernel of this process reads it (cuda_ipc): for a
 * check that reads a few words of a source's region in place (a receiver's
 * digest entries, gathered on its GPU) instead of pulling them. */
typedef struct {
    /* *ptr: region `region` of peer as mapped here; *dev: the device it was
     * opened on (kernels there read it).  REFIT_ERR_INVALID_ARG out of range. */
    refit_status_t (*region)(refit_peer_t *peer, uint32_t region, void **ptr, int *dev);
    /* REFIT_ERR_PEER when the peer's process is gone (what a pull checks
     * after its copy: words read from a dead process's memory do not count). */
    refit_status_t (*alive)(const refit_peer_t *peer);
} refit_transport_devmem_t;

typedef struct {
    const char *name;
    unsigned caps; /* REFIT_TCAP_*; 0: REFIT_TCAP_HOST */
    /* options: transport-specific "key=value,..." (NULL for defaults) */
    refit_status_t (*create)(const char *options, refit_transport_t **out);
    void (*destroy)(refit_transport_t *t);

    /* Publisher side. alloc may be NULL (the transport reads any memory). */
    refit_status_t (*alloc)(refit_transport_t *t, uint64_t size, void **base);
    void (*free)(refit_transport_t *t, void *base, uint64_t size);
    /* Makes [base, base+size) readable by peers; *desc (malloc'ed) describes how. */
    refit_status_t (*expose)(refit_transport_t *t, void *base, uint64_t size, void **desc, size_t *len);
    void (*unexpose)(refit_transport_t *t, void *base);

    /* Receiver side: descs[i]/lens[i] are the descriptors of the source's regions. */
    refit_status_t (*connect)(refit_transport_t *t, const void *const *descs, const size_t *lens, uint32_t nregions,
                              refit_peer_t **out);
    void (*disconnect)(refit_peer_t *peer);
    /* Executes every region of plan; peers[i] is source i of the plan (NULL
     * where the plan reads nothing from it).  dst_bases[r] is the receiver's
     * region r. */
    refit_status_t (*pull)(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                           void *const *dst_bases, const refit_pull_ctl_t *ctl, refit_pull_stats_t *stats);
    /* Optional: the job's connection key (32 bytes, derived from its secret;
     * docs/security.md), given right after create.  Connections prove it both
     * ways before any byte is served; a transport never given one uses the
     * public all-zero key (as an insecure job does). */
    void (*set_key)(refit_transport_t *t, const uint8_t key[32]);
    /* Optional: builds (and caches) what the first pull of plan into
     * dst_bases would build before moving a byte (cuda_ipc: its copy or FP8
     * table on the GPU), moving nothing; for refit_receiver_prepare. */
    refit_status_t (*warm)(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                           void *const *dst_bases, const refit_pull_ctl_t *ctl);
    /* Optional: the table of extension `kind` (refit_transport_ext_kind_t),
     * or NULL where this transport has none of that kind.  NULL: none. */
    const void *(*ext)(refit_transport_ext_kind_t kind);
} refit_transport_ops_t;

static inline unsigned refit_transport_caps(const refit_transport_ops_t *ops)
{
    return ops->caps ? ops->caps : REFIT_TCAP_HOST;
}

/* The transport's extension of `kind`, or NULL. */
static inline const void *refit_transport_ext(const refit_transport_ops_t *ops, refit_transport_ext_kind_t kind)
{
    return ops && ops->ext ? ops->ext(kind) : NULL;
}

static inline const refit_transport_fp8_t *refit_transport_fp8(const refit_transport_ops_t *ops)
{
    return (const refit_transport_fp8_t *)refit_transport_ext(ops, REFIT_TEXT_FP8);
}

static inline const refit_transport_devmem_t *refit_transport_devmem(const refit_transport_ops_t *ops)
{
    return (const refit_transport_devmem_t *)refit_transport_ext(ops, REFIT_TEXT_DEVMEM);
}

static inline const refit_transport_wait_t *refit_transport_wait(const refit_transport_ops_t *ops)
{
    return (const refit_transport_wait_t *)refit_transport_ext(ops, REFIT_TEXT_WAIT);
}

extern const refit_transport_ops_t refit_transport_shm;
#ifdef REFIT_HAVE_CUDA
extern const refit_transport_ops_t refit_transport_cuda_ipc;
#endif
#ifdef REFIT_HAVE_UCX
extern const refit_transport_ops_t refit_transport_ucx;
#endif

/* Same-host helpers (shm.c): the boot id, and a process's start time (0 if
 * it is gone or a zombie), which together tell a live process from a
 * recycled pid. */
void refit_boot_id(char out[40]);
uint64_t refit_proc_start_time(uint32_t pid);

/* The transport named `name`, or NULL. */
const refit_transport_ops_t *refit_transport_find(const char *name);

#endif
