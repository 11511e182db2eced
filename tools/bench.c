/* refit bench --scenario gpu: the GPU benchmark, all in one run.
 *
 *   1. refit: `refit demo` over cuda_ipc (publisher processes on --src-device,
 *      receiver processes on --dst-device, file registry), K versions, every
 *      byte verified on the GPU; steady state = the median of versions 2..K.
 *      The receivers share one GPU, so by default the copy kernels alternate
 *      between the two GPUs (cuda_ipc.exec=alt: receiver rank 0 pulls on the
 *      destination GPU, rank 1 pushes from the source GPU); kernels of two
 *      processes on one GPU would take turns (bench/results: 0.182 s with
 *      exec=dst or src, 0.164 s with alt, 0.163 s for one receiver alone).
 *      refit_s is the wall span of one refit: from the earliest receiver's
 *      discovery round to the latest receiver's end of transfer (data in
 *      place, padding written, sources re-checked), across processes.
 *   2. the raw limit: one peer copy of the same number of bytes
 *      src -> dst GPU (cudaMemcpyPeerAsync; also the copy kernel alone);
 *   3. the NCCL baseline: pack the source layout into one buffer, broadcast
 *      it, unpack into the destination layout, verified.
 * Prints one JSON object (and writes it to --out).
 *
 *   refit gpus: the CUDA devices here as JSON (count 0 without any). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tool.h"
#include "util/json.h"
#include "util/util.h"
#ifdef REFIT_HAVE_CUDA
#include "transport/cuda/gpu.h"
#endif

#ifndef REFIT_UCX_CUDA_STATUS
#define REFIT_UCX_CUDA_STATUS "unknown"
#endif

#ifdef REFIT_HAVE_CUDA
static void print_gpu(FILE *f, int dev)
{
    refit_gpu_info_t g;
    if (refit_gpu_info(dev, &g)) {
        fprintf(f, "{\"device\":%d,\"error\":", dev);
        tool_json_string(f, refit_last_error());
        fprintf(f, "}");
        return;
    }
    fprintf(f, "{\"device\":%d,\"name\":", dev);
    tool_json_string(f, g.name);
    fprintf(f, ",\"uuid\":\"%s\",\"pci\":\"%s\",\"memory\":%" PRIu64 ",\"free_memory\":%" PRIu64
               ",\"sms\":%d,\"cc\":\"%d.%d\",\"driver_api\":%d,\"runtime\":%d}",
            g.uuid, g.pci, g.memory, g.free_memory, g.sms, g.cc_major, g.cc_minor, g.driver, g.runtime);
}
#endif

int cmd_gpus(int argc, char **argv)
{
    (void)argc;
    (void)argv;
#ifdef REFIT_HAVE_CUDA
    int n = refit_gpu_count();
    printf("{\"cuda\":true,\"count\":%d,\"devices\":[", n);
    for (int d = 0; d < n; d++) {
        if (d) printf(",");
        print_gpu(stdout, d);
    }
    printf("],\"peer_access\":[");
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++)
            if (a != b) printf("%s[%d,%d,%s]", a + b > 1 || a ? "," : "", a, b, refit_gpu_can_access_peer(a, b) ? "true" : "false");
    printf("],\"ucx\":");
#else
    printf("{\"cuda\":false,\"count\":0,\"devices\":[],\"ucx\":");
#endif
    tool_json_string(stdout, REFIT_UCX_CUDA_STATUS);
    printf("}\n");
    return 0;
}

#ifdef REFIT_HAVE_CUDA
/* Runs argv (this binary) and returns its stdout; stderr passes through. */
static char *run_capture(char *const argv[], int *status)
{
    int fds[2];
    if (pipe(fds) != 0) return NULL;
    pid_t pid = fork();
    if (pid < 0) return NULL;
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(fds[1]);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (len + 4096 > cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        ssize_t n = read(fds[0], buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        len += (size_t)n;
    }
    close(fds[0]);
    if (buf) buf[len] = '\0';
    waitpid(pid, status, 0);
    return buf;
}

static double jnum(const refit_json_t *o, const char *k)
{
    double d = 0;
    refit_json_double(refit_json_get(o, k), &d);
    return d;
}
#endif

/* The GPU scenario (this file). */
static int bench_gpu(int argc, char **argv);

/* Fleet scenarios live in their own files (tools/bench_net.c, tools/bench_data.c). */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} g_scenarios[] = {
    {"gpu", bench_gpu},           {"fanout", bench_fanout}, {"elastic", bench_elastic}, {"straggler", bench_straggler},
    {"egress", bench_egress},     {"delta", bench_delta},   {"partial", bench_partial}, {"fp8", bench_fp8},
};

int cmd_bench(int argc, char **argv)
{
    const char *scenario = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--scenario") && i + 1 < argc) scenario = argv[i + 1];
        else if (!strncmp(argv[i], "--scenario=", 11)) scenario = argv[i] + 11;
    }
    for (size_t k = 0; scenario && k < sizeof(g_scenarios) / sizeof(g_scenarios[0]); k++)
        if (!strcmp(g_scenarios[k].name, scenario)) return g_scenarios[k].run(argc, argv);
    return tool_usage("bench", "--scenario is one of gpu, fanout, elastic, straggler, egress, delta, partial, fp8");
}

static int bench_gpu(int argc, char **argv)
{
    const char *scenario = NULL, *model = "qwen3-30b-a3b", *src = "megatron:ep=2", *dst = "vllm:tp=2", *out_path = NULL,
               *topts = NULL;
    uint64_t src_dev = 0, dst_dev = 1, cycles = 6, iters = 5, timeout_s = 900;
    bool skip_nccl = false, skip_baseline = false;
    enum { B_SCENARIO = 1, B_MODEL, B_SRC, B_DST, B_SDEV, B_DDEV, B_CYCLES, B_ITERS, B_OUT, B_SKIP_NCCL, B_TOPTS, B_TIMEOUT,
           B_SKIP_BASE };
    static const struct option opts[] = {
        {"scenario", required_argument, 0, B_SCENARIO}, {"model", required_argument, 0, B_MODEL},
        {"src", required_argument, 0, B_SRC},           {"dst", required_argument, 0, B_DST},
        {"src-device", required_argument, 0, B_SDEV},   {"dst-device", required_argument, 0, B_DDEV},
        {"cycles", required_argument, 0, B_CYCLES},     {"iters", required_argument, 0, B_ITERS},
        {"out", required_argument, 0, B_OUT},           {"skip-nccl", no_argument, 0, B_SKIP_NCCL},
        {"transport-options", required_argument, 0, B_TOPTS}, {"timeout-s", required_argument, 0, B_TIMEOUT},
        {"skip-baseline", no_argument, 0, B_SKIP_BASE}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        uint64_t *num = NULL;
        switch (c) {
        case B_SCENARIO: scenario = optarg; break;
        case B_MODEL: model = optarg; break;
        case B_SRC: src = optarg; break;
        case B_DST: dst = optarg; break;
        case B_OUT: out_path = optarg; break;
        case B_TOPTS: topts = optarg; break;
        case B_SKIP_NCCL: skip_nccl = true; break;
        case B_SKIP_BASE: skip_baseline = true; break;
        case B_SDEV: num = &src_dev; break;
        case B_DDEV: num = &dst_dev; break;
        case B_CYCLES: num = &cycles; break;
        case B_ITERS: num = &iters; break;
        case B_TIMEOUT: num = &timeout_s; break;
        default: return tool_usage("bench", "unknown option");
        }
        if (num && tool_parse_u64(optarg, num)) return tool_usage("bench", "numeric options take non-negative integers");
    }
    if (optind < argc) return tool_usage("bench", "unexpected argument");
    if (!scenario || strcmp(scenario, "gpu")) return tool_usage("bench", "--scenario gpu is the one scenario here");
    if (!topts) topts = "cuda_ipc.exec=alt";
    if (cycles < 2 || cycles > 100 || iters < 1 || iters > 32 || src_dev > 64 || dst_dev > 64)
        return tool_usage("bench", "--cycles 2..100, --iters 1..32");
#ifndef REFIT_HAVE_CUDA
    (void)out_path;
    (void)topts;
    (void)skip_nccl;
    (void)skip_baseline;
    (void)model;
    (void)src;
    (void)dst;
    fprintf(stderr, "refit bench: this refit was built without CUDA\n");
    return 77;
#else
    if (refit_gpu_count() < 1) {
        fprintf(stderr, "refit bench: no CUDA device here\n");
        return 1;
    }
    /* The command line, for the record. */
    char cmdline[2048] = "refit bench";
    for (int i = 1; i < argc; i++) {
        size_t l = strlen(cmdline);
        snprintf(cmdline + l, sizeof(cmdline) - l, " %s", argv[i]);
    }
    /* 1. refit, in child processes (CUDA stays uninitialised here until they are done). */
    char ncyc[32], sdev[16], ddev[16], tmo[32];
    snprintf(ncyc, sizeof(ncyc), "%" PRIu64, cycles);
    snprintf(sdev, sizeof(sdev), "%" PRIu64, src_dev);
    snprintf(ddev, sizeof(ddev), "%" PRIu64, dst_dev);
    snprintf(tmo, sizeof(tmo), "%" PRIu64, timeout_s);
    char *args[40];
    int a = 0;
    args[a++] = "refit", args[a++] = "demo", args[a++] = "--json";
    args[a++] = "--model", args[a++] = (char *)model, args[a++] = "--src", args[a++] = (char *)src;
    args[a++] = "--dst", args[a++] = (char *)dst, args[a++] = "--transport", args[a++] = "cuda_ipc";
    args[a++] = "--src-device", args[a++] = sdev, args[a++] = "--dst-device", args[a++] = ddev;
    args[a++] = "--cycles", args[a++] = ncyc, args[a++] = "--timeout-s", args[a++] = tmo;
    if (topts) args[a++] = "--transport-options", args[a++] = (char *)topts;
    args[a] = NULL;
    fprintf(stderr, "refit bench: refit phase: %s -> %s over cuda_ipc, GPU %s -> GPU %s, %s versions\n", src, dst, sdev,
            ddev, ncyc);
    double t0 = refit_now();
    int status = 0;
    char *demo_out = run_capture(args, &status);
    double refit_phase_s = refit_now() - t0;
    refit_json_t *demo = NULL;
    const char *js = demo_out ? strchr(demo_out, '{') : NULL;
    if (!js || refit_json_parse(js, strlen(js), &demo)) {
        fprintf(stderr, "refit bench: the refit phase printed no result (status %d)\n", status);
        demo = NULL;
    }
    bool refit_verified = false;
    if (demo) refit_json_bool(refit_json_get(demo, "verified"), &refit_verified);
    double refit_s = demo ? jnum(demo, "steady_span_ms") / 1e3 : 0;
    double refit_xfer_s = demo ? jnum(demo, "steady_transfer_ms") / 1e3 : 0;
    double p2c_s = demo ? jnum(demo, "steady_publish_to_commit_ms") / 1e3 : 0;
    int64_t bytes = 0;
    if (demo) refit_json_int(refit_json_get(demo, "bytes_per_cycle"), &bytes);
    const refit_json_t *pc = demo ? refit_json_get(demo, "per_cycle") : NULL;
    size_t npc = refit_json_len(pc);
    double open_ms = npc ? jnum(refit_json_at(pc, 0), "connect_ms") : 0;
    double reg_ms = npc ? jnum(refit_json_at(pc, 0), "publish_ms") : 0;
    double launches = 0, steady_connect = 0;
    for (size_t k = 1; k < npc; k++) {
        launches = REFIT_MAX(launches, jnum(refit_json_at(pc, k), "launches"));
        steady_connect = REFIT_MAX(steady_connect, jnum(refit_json_at(pc, k), "connect_ms"));
    }
    /* 2 and 3. the baselines, in this process. */
    refit_gpu_baseline_t b;
    memset(&b, 0, sizeof(b));
    refit_status_t bst = REFIT_OK;
    char berr[512] = "";
    if (!skip_baseline) {
        fprintf(stderr, "refit bench: baselines: raw peer copy and NCCL broadcast (pack, broadcast, unpack)\n");
        refit_gpu_baseline_cfg_t cfg = {model, src, dst, (int)src_dev, (int)dst_dev, (uint32_t)iters, 0,
                                        (uint64_t)bytes, skip_nccl};
        bst = refit_gpu_baseline(&cfg, &b);
        if (bst) {
            snprintf(berr, sizeof(berr), "%s: %s", refit_status_name(bst), refit_last_error());
            fprintf(stderr, "refit bench: baseline: %s\n", berr);
        }
    }
    /* The record. */
    char *res = NULL;
    size_t rlen = 0;
    FILE *f = open_memstream(&res, &rlen);
    if (!f) return tool_fail(refit_error(REFIT_ERR_NO_MEMORY, "bench"), "bench");
    struct utsname un;
    uname(&un);
    char host[128] = "", date[64] = "";
    gethostname(host, sizeof(host) - 1);
    time_t now = time(NULL);
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    fprintf(f, "{\"scenario\":\"gpu\",\"command\":");
    tool_json_string(f, cmdline);
    fprintf(f, ",\"date\":\"%s\",\"host\":", date);
    tool_json_string(f, host);
    fprintf(f, ",\"kernel\":");
    tool_json_string(f, un.release);
    fprintf(f, ",\"nccl_nvls_enable\":");
    tool_json_string(f, getenv("NCCL_NVLS_ENABLE") ? getenv("NCCL_NVLS_ENABLE") : "(unset)");
    fprintf(f, ",\"gpus\":[");
    print_gpu(f, (int)src_dev);
    fprintf(f, ",");
    print_gpu(f, (int)dst_dev);
    fprintf(f, "],\"p2p\":%s,\"ucx\":", refit_gpu_can_access_peer((int)dst_dev, (int)src_dev) ? "true" : "false");
    tool_json_string(f, REFIT_UCX_CUDA_STATUS);
    fprintf(f, ",\"model\":");
    tool_json_string(f, model);
    fprintf(f, ",\"src\":");
    tool_json_string(f, src);
    fprintf(f, ",\"dst\":");
    tool_json_string(f, dst);
    double peer = b.peer_copy_s, nccl = b.nccl_s;
    bool verified = refit_verified && (skip_baseline || skip_nccl || (b.nccl_ran && b.verified));
    fprintf(f,
            ",\"bytes\":%" PRId64 ",\"refit_s\":%.6f,\"refit_gbps\":%.2f,\"refit_transfer_s\":%.6f,"
            "\"publish_to_commit_s\":%.6f,\"peer_copy_s\":%.6f,\"peer_copy_gbps\":%.2f,\"peer_copy_kernel_s\":%.6f,"
            "\"peer_copy_kernel_gbps\":%.2f,\"limit_ratio\":%.4f,\"nccl_s\":%.6f,\"nccl_gbps\":%.2f,\"nccl_ratio\":%.4f,"
            "\"nccl_pack_s\":%.6f,\"nccl_bcast_s\":%.6f,\"nccl_bcast_gbps\":%.2f,\"nccl_unpack_s\":%.6f,"
            "\"kernel_launches_per_refit\":%.0f,\"handle_open_ms\":%.3f,\"steady_connect_ms\":%.3f,"
            "\"registration_ms\":%.3f,\"refit_verified\":%s,\"nccl_verified\":%s,\"verified\":%s,"
            "\"limit_ratio_ok\":%s,\"beats_nccl\":%s,\"refit_phase_s\":%.1f",
            bytes, refit_s, refit_s > 0 ? bytes / refit_s / 1e9 : 0, refit_xfer_s, p2c_s, peer,
            peer > 0 ? b.peer_bytes / peer / 1e9 : 0, b.peer_copy_kernel_s,
            b.peer_copy_kernel_s > 0 ? b.peer_bytes / b.peer_copy_kernel_s / 1e9 : 0, peer > 0 ? refit_s / peer : 0, nccl,
            nccl > 0 ? b.packed_bytes / nccl / 1e9 : 0, refit_s > 0 ? nccl / refit_s : 0, b.pack_s, b.bcast_s,
            b.bcast_s > 0 ? b.packed_bytes / b.bcast_s / 1e9 : 0, b.unpack_s, launches, open_ms, steady_connect, reg_ms,
            refit_verified ? "true" : "false", b.nccl_ran && b.verified ? "true" : "false", verified ? "true" : "false",
            peer > 0 && refit_s > 0 && refit_s <= 1.2 * peer ? "true" : "false",
            nccl > 0 && refit_s > 0 && refit_s < nccl ? "true" : "false", refit_phase_s);
    fprintf(f, ",\"baseline\":{\"error\":");
    tool_json_string(f, berr);
    fprintf(f, ",\"note\":");
    tool_json_string(f, b.note);
    fprintf(f, ",\"model_bytes\":%" PRIu64 ",\"packed_bytes\":%" PRIu64 ",\"peer_bytes\":%" PRIu64 ",\"iters\":%u,"
               "\"nccl_version\":%d,\"nccl_library\":",
            b.bytes, b.packed_bytes, b.peer_bytes, b.iters, b.nccl_version);
    tool_json_string(f, b.nccl_library);
    fprintf(f, ",\"pack_launches\":%" PRIu64 ",\"unpack_launches\":%" PRIu64 ",\"bcast_calls\":%" PRIu64
               ",\"digest_src\":\"%016" PRIx64 "\",\"digest_dst\":\"%016" PRIx64 "\",\"peer_copy_runs_s\":[",
            b.pack_launches, b.unpack_launches, b.bcast_calls, b.digest_src, b.digest_dst);
    for (uint32_t i = 0; i < b.iters && peer > 0; i++) fprintf(f, "%s%.6f", i ? "," : "", b.peer_copy_runs[i]);
    fprintf(f, "],\"nccl_runs_s\":[");
    for (uint32_t i = 0; i < b.iters && b.nccl_ran; i++) fprintf(f, "%s%.6f", i ? "," : "", b.nccl_runs[i]);
    fprintf(f, "]},\"refit\":%s}\n", js && demo ? js : "null");
    fclose(f);
    /* demo's JSON ends in a newline: keep the record on one line */
    for (size_t i = 0; i + 1 < rlen; i++)
        if (res[i] == '\n') res[i] = ' ';
    fputs(res, stdout);
    if (out_path) {
        FILE *o = fopen(out_path, "w");
        if (!o || fputs(res, o) < 0 || fclose(o) != 0) fprintf(stderr, "refit bench: cannot write %s\n", out_path);
    }
    fprintf(stderr,
            "\nrefit bench (gpu): %s %s -> %s, %.2f GB per refit\n"
            "  refit      %.4f s  (%.1f GB/s; transfer %.4f s; %.0f kernel launches; handle open %.1f ms)  %s\n"
            "  peer copy  %.4f s  (%.1f GB/s; copy kernel alone %.4f s)\n"
            "  NCCL       %.4f s  (pack %.4f + broadcast %.4f + unpack %.4f)\n"
            "  limit_ratio %.3f (target <= 1.2)   nccl_ratio %.3f (> 1 means refit is faster)\n",
            model, src, dst, bytes / 1e9, refit_s, refit_s > 0 ? bytes / refit_s / 1e9 : 0, refit_xfer_s, launches, open_ms,
            verified ? "verified" : "NOT VERIFIED", peer, peer > 0 ? b.peer_bytes / peer / 1e9 : 0, b.peer_copy_kernel_s,
            nccl, b.pack_s, b.bcast_s, b.unpack_s, peer > 0 ? refit_s / peer : 0, refit_s > 0 ? nccl / refit_s : 0);
    free(res);
    refit_json_free(demo);
    free(demo_out);
    return verified && !bst ? 0 : 1;
#endif
}
