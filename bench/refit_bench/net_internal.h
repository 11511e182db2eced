/* The fleet scenarios of refit-bench (net.c: options, namespaces, the
 * children's harness, records and repeated runs; net_child.c: the children;
 * net_fleet.c: fanout, straggler, egress, elastic; net_engine.c: delta and
 * FP8 through the engine).  Internal to bench/refit_bench. */
#ifndef REFIT_BENCH_NET_INTERNAL_H
#define REFIT_BENCH_NET_INTERNAL_H

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "tool_netns.h"
#include "tool_proc.h"

typedef struct {
    const char *model, *out, *src, *dst;
    uint32_t receivers, max_readers, chunk_kb;
    double link_mbps; /* emulated per-link rate (0: none) */
    double queue_ms;  /* --queue-ms: the longest a packet waits in a port's tbf queue (0: 50) */
    /* --tcp-cc NAME|host: the namespaces' TCP congestion control (NULL:
     * cubic, Linux's default; "host": what a new namespace gets here, bbr on
     * this VM, whose PROBE_RTT stalls each connection 200 ms every 10 s
     * behind a full queue: bench/results/fleet-2026-12-07/tcp-cc/) */
    const char *tcp_cc;
    bool verify;
    char dir[64], url[96], job[48];
    const char *net; /* "shm" or "netns" (NULL: the scenario's default) */
    bool max_readers_set, dst_set, link_set;
    const char *transport;      /* "shm" or "ucx" (netns) */
    tool_netns_t ns;            /* netns: this run's namespaces and links */
    bool netns;                 /* the run used them */
    double delta;               /* delta scenario: share of elements changed per version (publishers offer deltas) */
    uint32_t versions;          /* delta scenario */
    const char *pub_transports; /* publishers' transports when not `transport` (fp8: "shm,ucx") */
    unsigned threads;           /* receivers' copy (and delta apply) threads; 0: 1 */
    bool joiner_starts_during;  /* elastic: the joiner's process starts during the others' pulls */
    bool joiner_unprepared;     /* elastic: the joiner does not call refit_receiver_prepare before its pull */
    const char *topts;          /* --transport-options: added to every child's transport options */
    bool no_digest;             /* --no-digest: publishers compute no content digests, receivers check none */
} nb_opts_t;

/* ---- child processes ---- */
/* ---- child processes, driven over pipes --------------------------------- */

/* A child (tools/common/tool_proc.h): commands are lines on to_child, its
 * replies lines on from_child. */
typedef tool_proc_t child_t;

typedef struct {
    bool publisher;
    uint32_t rank;
    int slot;             /* receivers: relay slot (-1 none) */
    const char *throttle; /* REFIT_TEST_THROTTLE for this child */
    int node;             /* netns: the node (namespace) it runs in; -1: this host's */
    bool no_delta;        /* receivers: always pull in full */
    int fp8;              /* 1: an FP8 relay of bf16 rank `rank`; 2: a receiver of that rank's FP8 arena */
    bool prepare;         /* receivers: refit_receiver_prepare in its start-up, before "ready" */
} role_t;


typedef struct {
    int st;
    uint64_t version, trainer_bytes, relay_bytes, bytes, early, ahead, late, delta_base;
    double begin, end, transfer_ms, verify_ms;
    double digest_ms;    /* the digests' check after the transfer (its hashing pass too, if not fused) */
    int digest_fused;    /* the copies hashed what they wrote */
    uint64_t unverified; /* bytes no digest covered */
    size_t holders;
    char list[1024];
} result_t;

typedef struct {
    char name[64], expected[160];
    double observed, limit;
    char op[3]; /* "<=", ">=", "<", "==": a timing check on the median; "" a requirement of every run */
    bool passed;
} assert_rec_t;

#define MAX_ASSERTS 12
#define MAX_RUNS 15

typedef struct {
    FILE *f; /* metrics, as written */
    char *buf;
    size_t len;
    char *cfg; /* the config object */
    int nmetrics, nasserts;
    assert_rec_t as[MAX_ASSERTS];
    const nb_opts_t *o;
    const char *scenario;
} out_t;

/* ---- net.c ---- */
bool nb_get_result(child_t *c, result_t *r);
bool nb_net_up(nb_opts_t *o, const char *scenario, uint32_t nodes);
bool nb_netns_possible(char *why, size_t n);
bool nb_netns_up(nb_opts_t *o, uint32_t nodes, double mbps, char *why, size_t n);
bool nb_node_rate(const nb_opts_t *o, uint32_t node, double mbps);
bool nb_publish_all(child_t *pubs, uint32_t n, uint64_t v);
bool nb_start_publishers(const nb_opts_t *o, child_t *pubs, uint32_t n, const char *throttle, uint64_t version);
/* The REFIT_TEST_THROTTLE list pacing n holders of kind at mbps (holder slow
 * at slow_mbps), NULL for none.  Exits 2, saying why, when this refit-bench
 * links the shipped library, which has no pacing (flavour.c). */
char *nb_throttle_all(const char *kind, uint32_t n, double mbps, uint32_t slow, double slow_mbps);
/* Whether this refit-bench links the test flavour of the library (its
 * emulated links need REFIT_TEST_THROTTLE): flavour.c, compiled per program. */
extern const bool nb_paced_links;
child_t nb_spawn(const nb_opts_t *o, const role_t *r);
const char *child_topts(void);
const char *nb_reply(child_t *c, int timeout_ms, char *buf, size_t n);
double nb_span(const result_t *r, size_t n);
/* The same span to the end of each pull's digest check (end + digest_ms): the pulls as verified. */
double nb_span_checked(const result_t *r, size_t n);
int nb_out_end(out_t *j, const char *notes);
int nb_parse(int argc, char **argv, nb_opts_t *o, const char *src, const char *dst, uint32_t receivers, double link);
int nb_repeat(const char *scenario, int (*once)(int, char **), int argc, char **argv, int dflt);
uint32_t nb_world_of(const char *spec);
void nb_check(out_t *j, const char *name, const char *expected, double observed, const char *op, double limit);
void nb_fresh_registry(nb_opts_t *o);
void nb_metric(out_t *j, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void nb_netns_down(nb_opts_t *o);
void nb_out_begin(out_t *j, const char *scenario, const nb_opts_t *o, const char *extra_config);
void nb_require(out_t *j, const char *name, const char *expected, double observed, bool passed);
void nb_result_json(out_t *j, const char *name, const result_t *r, size_t n);
void nb_rm_registry(const nb_opts_t *o);
void nb_send_cmd(child_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void nb_stop(child_t *c, bool kill_it);

/* ---- net_child.c: the children's main loops (commands on in, replies on out) ---- */
void child_receiver(const nb_opts_t *o, const role_t *r, FILE *in, int out);
void child_fp8_relay(const nb_opts_t *o, const role_t *r, FILE *in, int out);
void child_publisher(const nb_opts_t *o, const role_t *r, FILE *in, int out);

#endif
