/* What a simulation found, as JSON and as a short table. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/fleet/fleet.h"
#include "sim.h"

static const char *kind_name(sim_link_kind_t k)
{
    switch (k) {
    case SIM_LINK_NIC_TX: return "nic-tx";
    case SIM_LINK_NIC_RX: return "nic-rx";
    case SIM_LINK_NVL_TX: return "nvlink-out";
    case SIM_LINK_NVL_RX: return "nvlink-in";
    case SIM_LINK_PCIE: return "pcie";
    case SIM_LINK_UP: return "spine-up";
    case SIM_LINK_DOWN: return "spine-down";
    case SIM_LINK_CAP: return "cap";
    }
    return "?";
}

static void jstr(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

static double util(const sim_link_t *l, double T) { return l->cap > 0 && T > 0 ? l->wire / (l->cap * T) : 0; }

void sim_result_json(FILE *out, const sim_fleet_t *f, const sim_cluster_t *c, const sim_result_t *r)
{
    char desc[512];
    sim_cluster_describe(c, desc, sizeof(desc));
    double T = r->refit_s;
    fprintf(out, "{\"model\":");
    jstr(out, f->model);
    fprintf(out, ",\"src\":");
    jstr(out, f->src);
    fprintf(out, ",\"dst\":");
    jstr(out, f->dst);
    fprintf(out,
            ",\"replicas\":%u,\"receivers\":%u,\"relays\":%s,\"max_readers\":%u,\"chunk_kb\":%u,\"workers\":%u,"
            "\"transport\":",
            f->replicas, r->receivers, f->relays ? "true" : "false", f->max_readers, f->chunk_kb ? f->chunk_kb : 2048,
            f->workers                                        ? f->workers
            : !(f->transport && !strcmp(f->transport, "shm")) ? REFIT_FLEET_NET_WORKERS
                                                              : 2);
    jstr(out, f->transport ? f->transport : "ucx");
    fprintf(out, ",\"delta\":%g,\"mode\":\"%s\",", f->delta, r->mode == SIM_MODE_FLUID ? "fluid" : "chunks");
    fprintf(out, "\"cluster\":{\"name\":");
    jstr(out, c->name);
    fprintf(
        out,
        ",\"nodes\":%u,\"gpus_per_node\":%u,\"nics_per_node\":%u,\"nic_bytes_per_s\":%.6g,\"nvlink_bytes_per_s\":%.6g,"
        "\"nvlink_domain\":%u,\"pcie_bytes_per_s\":%.6g,\"spine_oversubscription\":%g,\"proto\":\"%s\",\"mtu\":%u,"
        "\"wire_efficiency\":%.5f,\"ack_overhead\":%.5f,\"rtt_s\":%.3g,\"request_queue_bytes\":%.6g,"
        "\"control_s\":%.3g,\"first_pull\":%s,\"description\":",
        c->nodes, c->gpus, c->nics, c->nic, c->nvlink, c->nvdomain, c->pcie, c->spine,
        c->proto == SIM_TCP ? "tcp" : "rdma", c->mtu, c->eff, c->ack, c->rtt, c->req_queue, c->control,
        c->first ? "true" : "false");
    jstr(out, desc);
    fprintf(out, "},");
    fprintf(out,
            "\"planning\":{\"src_ranks\":%u,\"dst_ranks\":%u,\"manifests_ms\":%.3f,\"plan_wall_ms\":%.3f,"
            "\"plan_ms_max\":%.3f,\"plan_ms_sum\":%.3f,\"threads\":%u},",
            r->src_world, r->dst_world, r->manifests_ms, r->plan_wall_ms, r->plan_ms_max, r->plan_ms_sum,
            r->plan_threads);
    fprintf(out,
            "\"model_bytes\":%" PRIu64 ",\"bytes_per_receiver_max\":%" PRIu64 ",\"wire_bytes\":%" PRIu64
            ",\"trainer_egress_bytes\":%" PRIu64 ",\"relay_egress_bytes\":%" PRIu64
            ",\"predicted_refit_s\":%.6f,\"transfer_s\":%.6f,\"mean_receiver_s\":%.6f,",
            r->model_bytes, r->rank_bytes_max, r->wire_bytes, r->trainer_egress, r->relay_egress, r->refit_s,
            r->transfer_s, r->mean_rx_s);
    fprintf(out, "\"bottleneck\":");
    if (r->bottleneck != UINT32_MAX && r->bottleneck < r->nlinks) {
        const sim_link_t *b = &r->links[r->bottleneck];
        fprintf(out, "{\"link\":");
        jstr(out, b->name);
        fprintf(out, ",\"kind\":\"%s\",\"utilisation\":%.4f,\"full_s\":%.6f,\"capacity_bytes_per_s\":%.6g}",
                kind_name(b->kind), util(b, T), b->full_s, b->cap);
    } else {
        fprintf(out, "null");
    }
    fprintf(out, ",\"links\":[");
    int n = 0;
    for (uint32_t l = 0; l < r->nlinks; l++) {
        const sim_link_t *x = &r->links[l];
        if (x->wire <= 0) continue;
        fprintf(out, "%s{\"name\":", n++ ? "," : "");
        jstr(out, x->name);
        fprintf(out,
                ",\"kind\":\"%s\",\"capacity_bytes_per_s\":%.6g,\"wire_bytes\":%.0f,\"payload_bytes\":%.0f,"
                "\"utilisation\":%.4f,\"full_s\":%.6f}",
                kind_name(x->kind), x->cap, x->wire, x->payload, util(x, T), x->full_s);
    }
    fprintf(out, "],\"bytes_per_nic\":[");
    n = 0;
    for (uint32_t l = 0; l < r->nlinks; l++) {
        const sim_link_t *x = &r->links[l];
        if (x->kind != SIM_LINK_NIC_TX || l + 1 >= r->nlinks) continue;
        const sim_link_t *y = &r->links[l + 1]; /* its rx twin */
        if (x->payload <= 0 && y->payload <= 0) continue;
        const char *nm = strchr(x->name, ' ');
        fprintf(out, "%s{\"nic\":", n++ ? "," : "");
        jstr(out, nm ? nm + 1 : x->name);
        fprintf(out, ",\"tx_bytes\":%.0f,\"rx_bytes\":%.0f}", x->payload, y->payload);
    }
    fprintf(out, "],\"receivers\":[");
    for (uint32_t i = 0; r->rx && i < r->receivers; i++) {
        const sim_rx_result_t *x = &r->rx[i];
        fprintf(out,
                "%s{\"rank\":%u,\"replica\":%u,\"gpu\":%u,\"begin_s\":%.6f,\"transfer_begin_s\":%.6f,\"end_s\":%.6f,"
                "\"trainer_bytes\":%" PRIu64 ",\"relay_bytes\":%" PRIu64
                ",\"holders\":%u,\"direct\":%s,\"first_holder\":",
                i ? "," : "", x->rank, x->replica, x->gpu, x->begin, x->xfer, x->end, x->bytes_trainer, x->bytes_relay,
                x->holders, x->direct ? "true" : "false");
        jstr(out, x->first_holder);
        fprintf(out, "}");
    }
    fprintf(out, "],\"simulation\":{\"events\":%" PRIu64 ",\"flows\":%" PRIu64 ",\"wall_ms\":%.1f}}\n", r->events,
            r->flows, r->sim_wall_ms);
}

static void human(double b, char *buf, size_t n)
{
    if (b >= 1e12) snprintf(buf, n, "%.2f TB", b / 1e12);
    else if (b >= 1e9) snprintf(buf, n, "%.2f GB", b / 1e9);
    else snprintf(buf, n, "%.1f MB", b / 1e6);
}

void sim_result_table(FILE *out, const sim_fleet_t *f, const sim_cluster_t *c, const sim_result_t *r)
{
    char desc[512], a[32], b[32], d[32], e[32];
    sim_cluster_describe(c, desc, sizeof(desc));
    double T = r->refit_s;
    fprintf(out, "%s  %s -> %s  x%u replica(s): %u receivers, relays %s", f->model, f->src, f->dst, f->replicas,
            r->receivers, f->relays ? "on" : "off");
    if (f->relays) fprintf(out, " (max_readers %u)", f->max_readers);
    fprintf(out, ", %s, %s mode%s\n", f->transport ? f->transport : "ucx",
            r->mode == SIM_MODE_FLUID ? "fluid" : "chunk", f->delta > 0 ? ", delta refit" : "");
    fprintf(out, "cluster   %s\n", desc);
    fprintf(
        out, "planning  %u x %u ranks: manifests %.0f ms, %u plan(s) in %.0f ms on %u thread(s) (largest %.1f ms)\n",
        r->src_world, r->dst_world, r->manifests_ms, r->dst_world, r->plan_wall_ms, r->plan_threads, r->plan_ms_max);
    human((double)r->rank_bytes_max, a, sizeof(a));
    human((double)r->wire_bytes, b, sizeof(b));
    human((double)r->trainer_egress, d, sizeof(d));
    human((double)r->relay_egress, e, sizeof(e));
    fprintf(out, "predicted refit %.3f s (first transfer to last data in place %.3f s; mean receiver %.3f s)\n", T,
            r->transfer_s, r->mean_rx_s);
    fprintf(out, "bytes     %s per receiver (largest); %s read in all: %s from trainer ranks, %s from relays\n", a, b,
            d, e);
    if (r->bottleneck != UINT32_MAX && r->bottleneck < r->nlinks) {
        const sim_link_t *x = &r->links[r->bottleneck];
        fprintf(out, "bottleneck %s: %.0f%% used over the refit, full for %.3f s\n", x->name, util(x, T) * 100,
                x->full_s);
    }
    fprintf(out, "%-12s %6s %10s %10s %12s  %s\n", "links", "count", "mean util", "max util", "bytes/link", "busiest");
    for (int k = SIM_LINK_NIC_TX; k <= SIM_LINK_DOWN; k++) {
        uint32_t cnt = 0, best = UINT32_MAX;
        double sum = 0, mx = 0, bytes = 0;
        for (uint32_t l = 0; l < r->nlinks; l++) {
            const sim_link_t *x = &r->links[l];
            if ((int)x->kind != k || x->wire <= 0) continue;
            double u = util(x, T);
            cnt++;
            sum += u;
            bytes += x->payload;
            if (u > mx || best == UINT32_MAX) mx = u, best = l;
        }
        if (!cnt) continue;
        human(bytes / cnt, a, sizeof(a));
        fprintf(out, "%-12s %6u %9.1f%% %9.1f%% %12s  %s\n", kind_name((sim_link_kind_t)k), cnt, sum / cnt * 100,
                mx * 100, a, r->links[best].name);
    }
}
