/* refit simulate: the real planner and the engine's fleet rules on a
 * described cluster (tools/sim/sim.h).  Also --calibrate (predicted against
 * measured runs) and --plan-scale (every destination rank planned with
 * threads). */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim.h"
#include "tool.h"

/* Named clusters: the usual building blocks (numbers from vendor data sheets). */
static const struct {
    const char *name, *spec, *what;
} g_presets[] = {
    {"hgx-h100", "name=hgx-h100,gpus=8,nics=8,nic=400Gb,nvlink=450GB,pcie=64GB,proto=rdma,mtu=4096",
     "HGX H100/H200 nodes: 8 GPUs, 8 x 400 Gbit/s RDMA NICs (one per GPU), NVLink 4 (900 GB/s both ways) in the node"},
    {"gb200-nvl72", "name=gb200-nvl72,gpus=4,nics=4,nic=400Gb,nvlink=900GB,nvdomain=72,pcie=64GB,proto=rdma,mtu=4096",
     "GB200 NVL72: trays of 4 GPUs with 4 x 400 Gbit/s NICs, NVLink 5 (1.8 TB/s both ways) across 72 GPUs"},
    {"gb200-rdma", "name=gb200-rdma,gpus=4,nics=4,nic=400Gb,nvlink=900GB,nvdomain=4,pcie=64GB,proto=rdma,mtu=4096",
     "GB200 trays of 4 GPUs, NVLink only inside the tray, 4 x 400 Gbit/s NICs (fleets that use RDMA between trays)"},
    {"h200-pair", "name=h200-pair,nodes=1,gpus=2,nics=1,nic=400Gb,nvlink=395GB,pcie=55GB,proto=rdma",
     "the two H200s measured here: NVLink NV18 at the measured 395 GB/s peer copy"},
};

static int usage(void)
{
    fprintf(stderr,
            "usage: refit simulate --model M --src LAYOUT --dst LAYOUT [--replicas N] [--rank R]\n"
            "         [--relays|--no-relays] [--max-readers K] [--chunk-kb N] [--workers N]\n"
            "         [--transport ucx|shm|cuda_ipc] [--delta F] [--mode auto|chunks|fluid]\n"
            "         [--cluster PRESET|key=value,...|JSON|@FILE]... [--threads N] [--spread S]\n"
            "         [--json] [--out FILE] [--plot FILE.png]\n"
            "       refit simulate --calibrate [--results DIR] [--ignore tbf|wire|relays] [--tolerance X] [--json]\n"
            "       refit simulate --plan-scale --model M --src L --dst L [--threads N] [--max-ms CPU_MS]\n"
            "       refit simulate --presets\n"
            "cluster keys: nodes gpus nics nic nvlink nvdomain pcie spine leaf proto mtu l2 eff ack rtt req_queue\n"
            "  control discover plan connect first apply_ns src_gpus dst_gpus dst_at (rates: 400Gb, 50GB, 100MB)\n");
    return 2;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0) break;
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

static int apply_cluster(sim_cluster_t *c, const char *arg)
{
    for (size_t i = 0; i < sizeof(g_presets) / sizeof(g_presets[0]); i++)
        if (!strcmp(arg, g_presets[i].name)) {
            refit_status_t st = sim_cluster_apply(c, g_presets[i].spec);
            return st ? tool_fail(st, "cluster preset") : 0;
        }
    char *text = NULL;
    if (arg[0] == '@' && !(text = slurp(arg + 1))) {
        fprintf(stderr, "refit simulate: cannot read %s\n", arg + 1);
        return 1;
    }
    refit_status_t st = sim_cluster_apply(c, text ? text : arg);
    free(text);
    return st ? tool_fail(st, "cluster") : 0;
}

static int calibrate(const char *dir, const char *ignore, double tol, bool json)
{
    sim_calib_row_t *rows = NULL;
    size_t n = 0;
    refit_status_t st = sim_calibrate(dir, ignore, &rows, &n);
    if (st) return tool_fail(st, "calibrate");
    int bad = 0;
    if (json) printf("{\"tolerance\":%g,\"ignore\":\"%s\",\"rows\":[", tol, ignore ? ignore : "");
    else printf("%-34s %12s %12s %8s  %s\n", "scenario (measured in)", "measured", "predicted", "error", "what");
    for (size_t i = 0; i < n; i++) {
        sim_calib_row_t *r = &rows[i];
        bool ok = fabs(r->error) <= tol;
        bad += !ok;
        if (json) {
            printf("%s{\"name\":\"%s\",\"source\":\"%s\",\"measured_s\":%.6f,\"predicted_s\":%.6f,\"error\":%.4f,"
                   "\"within\":%s,\"note\":",
                   i ? "," : "", r->name, r->source, r->measured_s, r->predicted_s, r->error, ok ? "true" : "false");
            tool_json_string(stdout, r->note);
            printf("}");
        } else {
            printf("%-34s %11.3fs %11.3fs %+7.1f%%%s %s\n", r->name, r->measured_s, r->predicted_s, r->error * 100,
                   ok ? " " : "!", r->note);
        }
    }
    if (json) printf("],\"outside\":%d}\n", bad);
    else
        printf("%zu comparisons, %d outside +-%.0f%%%s%s\n", n, bad, tol * 100, ignore ? " (model term left out: " : "",
               ignore ? ignore : "");
    if (!json && ignore) printf(")\n");
    free(rows);
    return bad ? 1 : 0;
}

static double process_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* --max-ms bounds the CPU time (all threads) of the threaded run's manifests
 * and plans: wall time on a shared machine says more about the neighbours. */
static int plan_scale(const char *model, const char *src, const char *dst, unsigned threads, double max_ms, bool json)
{
    sim_plan_scale_t one, many;
    refit_status_t st = sim_plan_scale(model, src, dst, 1, &one);
    double c0 = process_cpu_ms();
    if (!st) st = sim_plan_scale(model, src, dst, threads, &many);
    double cpu = process_cpu_ms() - c0;
    if (st) return tool_fail(st, "plan-scale");
    bool same = one.digest == many.digest;
    double speedup = many.plan_wall_ms > 0 ? one.plan_wall_ms / many.plan_wall_ms : 0;
    if (json)
        printf(
            "{\"model\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"src_ranks\":%u,\"dst_ranks\":%u,\"manifests_ms\":%.1f,"
            "\"plan_wall_ms_1_thread\":%.1f,\"plan_wall_ms\":%.1f,\"threads\":%u,\"speedup\":%.2f,\"plan_ms_max\":%.1f,"
            "\"bytes_per_rank_max\":%" PRIu64 ",\"redundant\":%" PRIu64 ",\"same_plans\":%s,\"cpu_ms\":%.1f}\n",
            model, src, dst, many.src_world, many.dst_world, many.manifests_ms, one.plan_wall_ms, many.plan_wall_ms,
            many.threads, speedup, many.plan_ms_max, many.bytes_max, many.redundant, same ? "true" : "false", cpu);
    else
        printf("%s %s -> %s: %u source manifests + %u destination in %.0f ms; %u plans: %.0f ms on 1 thread, %.0f ms "
               "on %u (x%.2f); largest plan %.1f ms; %" PRIu64 " bytes per rank, %" PRIu64 " redundant; plans %s; "
               "CPU %.0f ms\n",
               model, src, dst, many.src_world, many.dst_world, many.manifests_ms, many.dst_world, one.plan_wall_ms,
               many.plan_wall_ms, many.threads, speedup, many.plan_ms_max, many.bytes_max, many.redundant,
               same ? "identical" : "DIFFER", cpu);
    if (!same) return 1;
    if (max_ms > 0 && cpu > max_ms) {
        fprintf(stderr, "refit simulate: planning took %.0f ms of CPU, over the bound of %.0f ms\n", cpu, max_ms);
        return 1;
    }
    return 0;
}

enum {
    O_MODEL = 1,
    O_SRC,
    O_DST,
    O_REPLICAS,
    O_RANK,
    O_RELAYS,
    O_NORELAYS,
    O_MAXR,
    O_CHUNK,
    O_WORKERS,
    O_TRANSPORT,
    O_DELTA,
    O_MODE,
    O_CLUSTER,
    O_THREADS,
    O_SPREAD,
    O_JSON,
    O_OUT,
    O_PLOT,
    O_CALIB,
    O_RESULTS,
    O_IGNORE,
    O_TOL,
    O_PSCALE,
    O_MAXMS,
    O_PRESETS,
    O_HELP
};

int cmd_simulate(int argc, char **argv)
{
    static const struct option opts[] = {{"model", required_argument, 0, O_MODEL},
                                         {"src", required_argument, 0, O_SRC},
                                         {"dst", required_argument, 0, O_DST},
                                         {"replicas", required_argument, 0, O_REPLICAS},
                                         {"rank", required_argument, 0, O_RANK},
                                         {"relays", no_argument, 0, O_RELAYS},
                                         {"no-relays", no_argument, 0, O_NORELAYS},
                                         {"max-readers", required_argument, 0, O_MAXR},
                                         {"chunk-kb", required_argument, 0, O_CHUNK},
                                         {"workers", required_argument, 0, O_WORKERS},
                                         {"transport", required_argument, 0, O_TRANSPORT},
                                         {"delta", required_argument, 0, O_DELTA},
                                         {"mode", required_argument, 0, O_MODE},
                                         {"cluster", required_argument, 0, O_CLUSTER},
                                         {"threads", required_argument, 0, O_THREADS},
                                         {"spread", required_argument, 0, O_SPREAD},
                                         {"json", no_argument, 0, O_JSON},
                                         {"out", required_argument, 0, O_OUT},
                                         {"plot", required_argument, 0, O_PLOT},
                                         {"calibrate", no_argument, 0, O_CALIB},
                                         {"results", required_argument, 0, O_RESULTS},
                                         {"ignore", required_argument, 0, O_IGNORE},
                                         {"tolerance", required_argument, 0, O_TOL},
                                         {"plan-scale", no_argument, 0, O_PSCALE},
                                         {"max-ms", required_argument, 0, O_MAXMS},
                                         {"presets", no_argument, 0, O_PRESETS},
                                         {"help", no_argument, 0, O_HELP},
                                         {0, 0, 0, 0}};
    sim_fleet_t f = SIM_FLEET_INIT;
    sim_cluster_t *c = malloc(sizeof(*c));
    if (!c) return tool_fail(REFIT_ERR_NO_MEMORY, "simulate");
    sim_cluster_defaults(c);
    bool json = false, calib = false, pscale = false, relays_set = false, maxr_set = false;
    const char *out = NULL, *plot = NULL, *results = "bench/results", *ignore = NULL;
    double tol = 0.15, max_ms = 0;
    int rc = 0, c_;
    optind = 1;
    while ((c_ = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c_) {
        case O_MODEL: f.model = optarg; break;
        case O_SRC: f.src = optarg; break;
        case O_DST: f.dst = optarg; break;
        case O_REPLICAS: f.replicas = (uint32_t)atoi(optarg); break;
        case O_RANK: f.only_rank = (uint32_t)atoi(optarg); break;
        case O_RELAYS: f.relays = true, relays_set = true; break;
        case O_NORELAYS: f.relays = false, relays_set = true; break;
        case O_MAXR: f.max_readers = (uint32_t)atoi(optarg), maxr_set = true; break;
        case O_CHUNK: f.chunk_kb = (uint32_t)atoi(optarg); break;
        case O_WORKERS: f.workers = (uint32_t)atoi(optarg); break;
        case O_TRANSPORT: f.transport = optarg; break;
        case O_DELTA: f.delta = atof(optarg); break;
        case O_MODE:
            if (!strcmp(optarg, "auto")) f.mode = SIM_MODE_AUTO;
            else if (!strcmp(optarg, "chunks")) f.mode = SIM_MODE_CHUNKS;
            else if (!strcmp(optarg, "fluid")) f.mode = SIM_MODE_FLUID;
            else rc = usage();
            break;
        case O_CLUSTER: rc = apply_cluster(c, optarg); break;
        case O_THREADS: f.threads = (unsigned)atoi(optarg); break;
        case O_SPREAD: f.start_spread = atof(optarg); break;
        case O_JSON: json = true; break;
        case O_OUT: out = optarg; break;
        case O_PLOT: plot = optarg, f.timeline = true; break;
        case O_CALIB: calib = true; break;
        case O_RESULTS: results = optarg; break;
        case O_IGNORE: ignore = optarg; break;
        case O_TOL: tol = atof(optarg); break;
        case O_PSCALE: pscale = true; break;
        case O_MAXMS: max_ms = atof(optarg); break;
        case O_PRESETS:
            for (size_t i = 0; i < sizeof(g_presets) / sizeof(g_presets[0]); i++)
                printf("%-12s %s\n             %s\n", g_presets[i].name, g_presets[i].what, g_presets[i].spec);
            free(c);
            return 0;
        case O_HELP:
            free(c);
            usage();
            return 0;
        default: rc = usage(); break;
        }
        if (rc) {
            free(c);
            return rc;
        }
    }
    if (calib) {
        free(c);
        return calibrate(results, ignore, tol, json);
    }
    if (!f.model || !f.src || !f.dst) {
        free(c);
        return usage();
    }
    if (pscale) {
        free(c);
        return plan_scale(f.model, f.src, f.dst, f.threads, max_ms, json);
    }
    if (relays_set && f.relays && !maxr_set) f.max_readers = 2;
    (void)relays_set;
    sim_cluster_finish(c);
    sim_result_t r;
    refit_status_t st = sim_fleet_run(&f, c, &r);
    if (st) {
        rc = tool_fail(st, "simulate");
        sim_result_free(&r);
        free(c);
        return rc;
    }
    if (json) sim_result_json(stdout, &f, c, &r);
    else sim_result_table(stdout, &f, c, &r);
    if (out) {
        FILE *fo = fopen(out, "w");
        if (!fo) rc = tool_fail(REFIT_ERR_IO, "writing --out");
        else {
            sim_result_json(fo, &f, c, &r);
            fclose(fo);
        }
    }
    if (plot && (st = sim_plot_png(plot, &f, c, &r))) rc = tool_fail(st, "plot");
    sim_result_free(&r);
    free(c);
    return rc;
}
