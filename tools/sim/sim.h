/* refit simulate: how long a refit takes on a cluster that is not here.
 *
 * The planner (refit_plan_create on the manifests refit_layout_manifest
 * makes) plans every destination rank of a fleet; the fleet's rules (fleet.h:
 * chunks, shares, claims, direct pulls, the pick of holders and the relay
 * tree) decide, as in the engine, which holder serves which bytes when; and a
 * flow-level network model (max-min fair sharing over the links each flow
 * crosses: NICs, NVLink, PCIe, spine) says how fast each flow runs.
 *
 * Two ways to run the same fleet: "chunks" replays the engine's scheduler
 * chunk by chunk (each holder's workers claim chunks in simulated time, each
 * chunk a flow), for fleets of up to a few hundred thousand chunks; "fluid"
 * gives each (holder, reader) pair one flow carrying the share the engine's
 * rules give it, readers of a relay that is still receiving held to its pace,
 * for fleets of any size.  Both share everything else.
 *
 * Not modelled: CPU (copies, digests, verification) except a delta's apply,
 * packet loss and congestion control dynamics beyond a fixed wire overhead
 * and a request queue, failures, and GPU staging through host memory (GPU
 * receivers are assumed to take bytes straight from the NIC).
 *
 * The static library refit_sim (cmake/tools.cmake), linked into the refit
 * command; not part of librefit's API.  This header, its interface, uses
 * only the public API's types.  Its sources are the one part of the programs
 * compiled against the library's internal headers (src/): a model of the
 * engine has to run the engine's own scheduling rules (src/engine/fleet/fleet.h,
 * fleet_rules.c, built into refit_sim), which are not a stable interface to
 * export (docs/architecture.md). */
#ifndef REFIT_SIM_H
#define REFIT_SIM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "refit/experimental/all.h"

/* ---- the cluster ------------------------------------------------------------ */

typedef enum { SIM_RDMA = 0, SIM_TCP = 1 } sim_proto_t;

#define SIM_MAX_PLACE 4096
/* Bounds of a described cluster, so that a typo (nodes=4e9) is an error
 * naming the field, not gigabytes of links: about 1.7 KB of state per GPU.
 * Ten times a node's GPUs of today's largest systems, and 131072 GPUs in all
 * (the field's largest fleets are ~100k GPUs). */
#define SIM_MAX_NODE_GPUS 1024u
#define SIM_MAX_GPUS 131072u

typedef struct {
    char name[64];
    uint32_t nodes;    /* 0: as many as the fleet needs */
    uint32_t gpus;     /* ranks (GPUs, or processes of host-memory nodes) per node */
    uint32_t nics;     /* NICs per node; GPU g uses NIC g * nics / gpus (rail aligned) */
    double nic;        /* bytes/s per NIC, each direction, on the wire */
    double nvlink;     /* bytes/s per GPU, each direction; 0: traffic inside a node takes the NICs */
    uint32_t nvdomain; /* GPUs per NVLink domain (0: one node) */
    double pcie;       /* bytes/s per GPU between GPU and NIC (GPUDirect RDMA); 0: no limit */
    double spine;      /* leaf uplink oversubscription; <= 1: a non-blocking fabric */
    uint32_t leaf;     /* nodes per leaf switch (spine > 1) */
    sim_proto_t proto;
    uint32_t mtu;     /* bytes (TCP: Ethernet MTU; RDMA: the IB/RoCE path MTU) */
    double l2;        /* wire bytes per frame outside the MTU (< 0: 38 for TCP on Ethernet, 26 for RDMA on IB) */
    double eff;       /* payload bytes per wire byte on NIC links (derived from proto and mtu unless given) */
    double ack;       /* wire bytes of acknowledgements per payload byte, on the reverse links (TCP) */
    double rtt;       /* seconds: a request's round trip before its bytes flow */
    double req_queue; /* bytes a request waits behind on a busy egress (TCP: the socket's queued data) */
    double control;   /* seconds of control plane per steady pull (discover, lease, re-check) */
    double discover;  /* first pull: seconds of discovery */
    double plan_s;    /* first pull: seconds of planning (< 0: the planner's own time, measured here) */
    double connect;   /* first pull: seconds per holder connected */
    bool first;       /* a first pull (plans and connections made) instead of a steady one */
    double apply_ns;  /* delta apply: nanoseconds of CPU per 2-byte unit written */
    double copy;      /* bytes/s of a relay's own copy (shm); unused on the network */
    /* placement: GPU index (node * gpus + local) of each trainer and receiver
     * rank; -1 entries (the default) place trainer ranks from GPU 0 on and
     * receivers after them (dst_at: first receiver GPU, < 0: after the trainer) */
    int32_t src_gpu[SIM_MAX_PLACE], dst_gpu[SIM_MAX_PLACE];
    uint32_t nsrc_gpu, ndst_gpu;
    int64_t dst_at;
} sim_cluster_t;

/* Defaults: 8 GPUs per node, 8 NICs of 400 Gbit/s, NVLink 450 GB/s per GPU
 * per direction in the node, PCIe Gen5 64 GB/s, RDMA with a 4096-byte MTU,
 * non-blocking, steady pulls (2 ms of control plane). */
void sim_cluster_defaults(sim_cluster_t *c);
/* Applies "key=value,key=value" (rates take units: 400Gb, 50GB, 100MB, 12.5Mb
 * per second; plain numbers are GB/s; times take ms or us) or, when the
 * text starts with '{', a JSON object with the same keys.  Unknown keys
 * are refused (REFIT_ERR_INVALID_ARG naming them). */
refit_status_t sim_cluster_apply(sim_cluster_t *c, const char *text);
/* Derived values (eff, ack) from proto and mtu where not given. */
void sim_cluster_finish(sim_cluster_t *c);
/* One line describing the cluster. */
void sim_cluster_describe(const sim_cluster_t *c, char *buf, size_t n);

/* ---- the network: links, flows, max-min fair rates ------------------------ */

typedef enum {
    SIM_LINK_NIC_TX,
    SIM_LINK_NIC_RX,
    SIM_LINK_NVL_TX,
    SIM_LINK_NVL_RX,
    SIM_LINK_PCIE,
    SIM_LINK_UP,
    SIM_LINK_DOWN,
    SIM_LINK_CAP, /* a virtual limit (a reader held to its relay's pace) */
} sim_link_kind_t;

typedef struct {
    char name[48];
    sim_link_kind_t kind;
    double cap;         /* wire bytes/s */
    double wire;        /* wire bytes carried so far */
    double payload;     /* payload bytes of the flows whose data crossed it */
    double full_s;      /* seconds it ran at >= 99% of its capacity */
    uint32_t nflows;    /* flows crossing it now (data, not acknowledgements) */
    double resid, wsum; /* scratch of the rate computation */
} sim_link_t;

#define SIM_PATH_MAX 12

typedef struct {
    uint32_t n;
    uint32_t link[SIM_PATH_MAX];
    float w[SIM_PATH_MAX];   /* wire bytes per payload byte on that link */
    bool data[SIM_PATH_MAX]; /* the data direction (else acknowledgements) */
} sim_path_t;

typedef struct {
    sim_path_t path;
    double remaining, sent, rate;
    double cap; /* payload bytes/s; 0: none */
    double start;
    bool active, frozen;
    uint64_t user; /* the caller's */
} sim_flow_t;

typedef struct sim_net sim_net_t;
refit_status_t sim_net_create(sim_net_t **out);
void sim_net_destroy(sim_net_t *net);
/* Adds a link; returns its index or UINT32_MAX on no memory. */
uint32_t sim_net_link(sim_net_t *net, const char *name, sim_link_kind_t kind, double cap);
sim_link_t *sim_net_links(sim_net_t *net, uint32_t *n);
/* Starts a flow of `bytes` payload at time `now`; its index, or UINT32_MAX. */
uint32_t sim_net_start(sim_net_t *net, const sim_path_t *path, double bytes, double cap, uint64_t user, double now);
sim_flow_t *sim_net_flow(sim_net_t *net, uint32_t f);
/* Changes a flow's cap (0: none). */
void sim_net_set_cap(sim_net_t *net, uint32_t f, double cap);
/* Max-min fair rates of the active flows (progressive filling; each flow's
 * rate is payload bytes/s, it uses rate * w on each link of its path). */
void sim_net_solve(sim_net_t *net);
/* Seconds until the next active flow completes (INFINITY: none). */
double sim_net_next(const sim_net_t *net);
/* Moves time on by dt: bytes flow at the current rates.  Flows whose
 * remaining bytes fall within `tol` seconds of their rate are done: their
 * indices go to done[] (up to max; *ndone), they stop. */
void sim_net_advance(sim_net_t *net, double dt, double tol, uint32_t *done, uint32_t max, uint32_t *ndone);
uint32_t sim_net_active(const sim_net_t *net);
/* Payload bytes/s flowing now over link l (data direction). */
double sim_net_link_rate(const sim_net_t *net, uint32_t l);
/* Wire bytes/s on link l now (data and acknowledgements). */
double sim_net_link_load(const sim_net_t *net, uint32_t l);

/* ---- the fleet ------------------------------------------------------------- */

typedef enum { SIM_MODE_AUTO = 0, SIM_MODE_CHUNKS, SIM_MODE_FLUID } sim_mode_t;

typedef struct {
    const char *model, *src, *dst;
    uint32_t replicas;     /* rollout replicas of the dst layout (receivers = replicas * world(dst)) */
    uint32_t only_rank;    /* UINT32_MAX: every rank of dst; else only this rank (one receiver per replica) */
    bool relays;           /* receivers serve as relays (slot = replica, at most 16 per rank) */
    uint32_t max_readers;  /* the engine's max_readers (0: no limit) */
    uint32_t chunk_kb;     /* 0: 2048 */
    uint32_t workers;      /* per holder; 0: as the engine (REFIT_FLEET_NET_WORKERS over a network, 2 over shm) */
    const char *transport; /* "ucx" (network), "shm", "cuda_ipc" (static plan, GPU to GPU) */
    double delta;          /* > 0: a delta refit at this change fraction (publishers offer deltas) */
    sim_mode_t mode;
    unsigned threads;    /* planner threads; 0: one per CPU */
    double start_spread; /* receivers begin evenly spread over this many seconds (0: together) */
    double *start_at;    /* or explicit begin times per receiver (NULL: spread) */
    double *rx_rate;     /* per receiver: its NIC rate instead of the cluster's (0 entries: the cluster's) */
    double *src_rate;    /* per trainer rank: its NIC rate instead of the cluster's */
    bool timeline;       /* keep per-receiver intervals and link samples for a plot */
} sim_fleet_t;
#define SIM_FLEET_INIT                                                                                          \
    {                                                                                                           \
        NULL, NULL, NULL, 1, UINT32_MAX, false, 0, 0, 0, "ucx", 0, SIM_MODE_AUTO, 0, 0, NULL, NULL, NULL, false \
    }

typedef struct {
    uint32_t rank, replica, gpu;
    double begin, xfer, end; /* seconds: discovery began, transfer began, data in place */
    uint64_t bytes_trainer, bytes_relay;
    uint32_t holders; /* holders it read from */
    char first_holder[32];
    bool direct; /* one direct pull, no chunks */
} sim_rx_result_t;

typedef struct {
    uint32_t link;
    double t, util;
} sim_sample_t;

typedef struct {
    /* planning */
    uint32_t src_world, dst_world, receivers;
    uint64_t model_bytes;
    uint64_t rank_bytes_max; /* bytes a receiver writes (largest rank) */
    uint64_t wire_bytes;     /* payload read by every receiver together */
    double manifests_ms, plan_ms_max, plan_ms_sum, plan_wall_ms;
    unsigned plan_threads;
    /* the transfer */
    sim_mode_t mode;
    double refit_s;    /* first begin to last data in place */
    double transfer_s; /* first transfer start to last data in place */
    double mean_rx_s;  /* mean per-receiver begin..end */
    uint64_t trainer_egress, relay_egress;
    uint32_t nlinks;
    sim_link_t *links;   /* copies, with totals */
    uint32_t bottleneck; /* link index with the most full seconds (UINT32_MAX: none) */
    sim_rx_result_t *rx;
    sim_sample_t *samples; /* timeline: link utilisation over time (sampled) */
    size_t nsamples;
    uint64_t events, flows;
    double sim_wall_ms;
    char error[256];
} sim_result_t;

/* Plans the fleet (every distinct destination rank, `threads` at once) and
 * simulates one refit on the cluster.  *out is filled on success and on
 * failure (then its error says why); free it with sim_result_free. */
refit_status_t sim_fleet_run(const sim_fleet_t *f, const sim_cluster_t *c, sim_result_t *out);
void sim_result_free(sim_result_t *r);
/* JSON object of a result (with the fleet and cluster it came from). */
void sim_result_json(FILE *out, const sim_fleet_t *f, const sim_cluster_t *c, const sim_result_t *r);
/* A short table. */
void sim_result_table(FILE *out, const sim_fleet_t *f, const sim_cluster_t *c, const sim_result_t *r);

/* ---- the planner at scale ---------------------------------------------------- */

typedef struct {
    uint32_t src_world, dst_world;
    double manifests_ms; /* every source and destination manifest */
    double plan_wall_ms; /* every destination rank planned, `threads` at once */
    double plan_ms_max, plan_ms_sum;
    uint64_t bytes_max, redundant;
    uint64_t digest; /* of every plan's regions (threads must not change it) */
    unsigned threads;
} sim_plan_scale_t;
/* Builds every manifest and plans every destination rank with `threads`
 * threads (0: one per CPU). */
refit_status_t sim_plan_scale(const char *model, const char *src, const char *dst, unsigned threads,
                              sim_plan_scale_t *out);

/* ---- calibration against measured runs --------------------------------------- */

typedef struct {
    char name[64];
    char source[96];                       /* the result file and field */
    double measured_s, predicted_s, error; /* error = predicted / measured - 1 */
    char note[160];
} sim_calib_row_t;

/* Predicts each measured scenario in results_dir (bench/results: fleet-*-netns
 * JSON and the H200 record) from its configuration and link rates; rows in
 * *rows (malloc'ed).  `ignore` names a model term to leave out (for checking
 * that the comparison can fail): "tbf" (links at 10 GB/s, no shaping),
 * "wire" (no protocol overhead), "relays" (no relays); NULL: none. */
refit_status_t sim_calibrate(const char *results_dir, const char *ignore, sim_calib_row_t **rows, size_t *n);

/* ---- a PNG timeline -------------------------------------------------------- */

refit_status_t sim_plot_png(const char *path, const sim_fleet_t *f, const sim_cluster_t *c, const sim_result_t *r);
/* Writes an RGB image (w x h, 3 bytes per pixel, rows top down) as a PNG. */
refit_status_t sim_png_write(const char *path, const uint8_t *rgb, uint32_t w, uint32_t h);

#endif
