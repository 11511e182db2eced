/* Shared by the fleet simulator's files: fleet_sim.c (events, links, setup, the run) and fleet_sim_rx.c
 * (the receivers). */
#ifndef REFIT_SIM_FLEET_SIM_H
#define REFIT_SIM_FLEET_SIM_H

#include "sim_internal.h"

enum { EV_BEGIN, EV_SELECT, EV_XFER, EV_TRY, EV_REQ, EV_REFRESH, EV_END, EV_COMMIT, EV_DELTA, EV_TICK };
enum { FL_CHUNK = 1, FL_DIRECT, FL_FLUID, FL_DELTA };

typedef struct {
    double t;
    uint64_t seq;
    uint32_t type, rx, w;
    uint64_t gen;
} ev_t;

typedef struct {
    uint32_t h;
    uint64_t gen;
    bool busy, sleeping, stopped;
    bool ahead;  /* c was asked for before its relay had it (refit_fleet_claim_ahead) */
    bool parked; /* ... and the request waits at the relay for it */
    refit_fleet_chunk_t *c;
    double t0;
    bool rows;
    uint64_t bytes;
} worker_t;

typedef struct {
    uint32_t idx, rank, replica, plan;
    int slot;
    uint32_t gpu;
    int state; /* 0 idle, 1 setup, 2 select, 3 transfer, 4 data in place, 5 committed */
    double begin, xfer, end;
    uint64_t sel_gen;
    bool waiting;
    /* holders */
    uint32_t nh;
    refit_fleet_holder_t *H;
    int32_t *hsrc; /* >= 0: trainer rank; < 0: -(receiver + 1), a relay */
    uint32_t *hgpu;
    uint64_t *plan_keys;
    refit_fleet_sched_t S;
    bool direct, with_trainer;
    /* as a relay */
    bool announced, data_done, complete;
    uint32_t readers;
    /* tokens held */
    bool trainer_token;
    uint32_t held[REFIT_MAX_RELAYS_SIM];
    uint32_t nheld;
    /* chunks */
    worker_t *W;
    uint32_t nw;
    /* fluid */
    uint32_t *hflow;  /* per holder: active flow, UINT32_MAX none */
    double *hbytes;   /* per holder: payload bytes assigned so far */
    double total;     /* payload bytes this receiver reads */
    double recv_done; /* payload bytes of flows finished */
    uint32_t flows_left;
    double idle; /* seconds of request gaps its workers cannot hide */
    /* delta */
    int phase;
    /* results */
    uint64_t bytes_trainer, bytes_relay;
    uint32_t used;
    char first_holder[32];
} rx_t;

typedef struct {
    const sim_fleet_t *f;
    const sim_cluster_t *c;
    sim_plans_t P;
    sim_net_t *net;
    rx_t *rx;
    uint32_t nrx;
    uint32_t *src_gpu;
    uint32_t *tokens; /* trainer load tokens per destination rank */
    double now;
    REFIT_VEC(ev_t) heap;
    uint64_t seq;
    bool dirty;
    uint64_t chunk;
    unsigned workers;
    bool fluid, net_transport, static_plan;
    /* links */
    uint32_t ngpu, nnode;
    uint32_t *l_nvtx, *l_nvrx, *l_pctx, *l_pcrx, *l_nictx, *l_nicrx, *l_up, *l_down;
    /* delta, per plan: table and payload bytes per source, units applied */
    double **d_table, **d_payload;
    double *d_units;
    /* stats */
    uint64_t events, flows;
    uint32_t parked; /* workers whose requests wait at a relay (answer_parked has nothing to do at 0) */
    REFIT_VEC(sim_sample_t) samples;
    double *last_util;
    char err[256];
    refit_status_t st;
} sim_t;

/* fleet_sim.c */
void fsim_push(sim_t *s, double t, uint32_t type, uint32_t rx, uint32_t w, uint64_t gen);
uint64_t fsim_user_of(uint32_t kind, uint32_t rx, uint32_t idx);
uint32_t fsim_nic_of(const sim_t *s, uint32_t gpu);
double fsim_request_delay(const sim_t *s, uint32_t g);
uint32_t fsim_start_flow(sim_t *s, uint32_t from, uint32_t to, double bytes, uint64_t user);

/* fleet_sim_rx.c */
bool fsim_fluid_caps(sim_t *s);
double fsim_fluid_catchup(const sim_t *s);
void fsim_flow_done(sim_t *s, uint32_t flow);
void fsim_handle(sim_t *s, const ev_t *e);

#endif
