/* refit-bench --scenario gpu: the GPU benchmark, all in one run.
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
 *      src -> dst GPU (cudaMemcpyPeerAsync; also the bench's own copy
 *      kernel over P2P);
 *   3. the NCCL baseline: pack the source layout into one buffer, broadcast
 *      it, unpack into the destination layout (the bench's batched copy
 *      kernel, one launch per plan), verified.
 * Prints one JSON object (and writes it to --out).
 *
 * refit-bench --scenario colocated (bench_colocated below): everything on
 * one GPU against a device-to-device copy of the same bytes.  Both run
 * `refit demo` (the program beside refit-bench) for the refit phases and
 * the baselines of gpu_baseline.h in this process. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "gpu_baseline.h"
#include "tool_proc.h"

/* Runs argv (argv[0]: the path of refit) and returns its stdout; stderr passes through. */
static char *run_capture(char *const argv[], int *status) { return tool_proc_capture(argv[0], argv, status); }

static double jnum(const refit_json_t *o, const char *k)
{
    double d = 0;
    refit_json_double(refit_json_get(o, k), &d);
    return d;
}

/* What both GPU scenarios need before they start: a CUDA build (77:
 * skipped), `refit` beside this program (the demo runs in it), a device; and
 * the command line, for the record.  0 when ready, else the exit code. */
static int gpu_bench_ready(int argc, char **argv, char *refit_path, size_t rn, char *cmdline, size_t cn)
{
    if (!(refit_features() & REFIT_FEATURE_CUDA)) {
        fprintf(stderr, "refit bench: this refit was built without CUDA\n");
        return 77;
    }
    if (tool_sibling("refit", refit_path, rn))
        return tool_fail(refit_error(REFIT_ERR_IO, "cannot locate refit beside refit-bench"), "bench");
    if (refit_gpu_count() < 1) {
        fprintf(stderr, "refit bench: no CUDA device here\n");
        return 1;
    }
    snprintf(cmdline, cn, "refit bench");
    for (int i = 1; i < argc; i++) {
        size_t l = strlen(cmdline);
        snprintf(cmdline + l, cn - l, " %s", argv[i]);
    }
    return 0;
}

int bench_gpu(int argc, char **argv)
{
    const char *scenario = NULL, *model = "qwen3-30b-a3b", *src = "megatron:ep=2", *dst = "vllm:tp=2", *out_path = NULL,
               *topts = NULL;
    uint64_t src_dev = 0, dst_dev = 1, cycles = 6, iters = 5, timeout_s = 900;
    bool skip_nccl = false, skip_baseline = false;
    enum {
        B_SCENARIO = 1,
        B_MODEL,
        B_SRC,
        B_DST,
        B_SDEV,
        B_DDEV,
        B_CYCLES,
        B_ITERS,
        B_OUT,
        B_SKIP_NCCL,
        B_TOPTS,
        B_TIMEOUT,
        B_SKIP_BASE
    };
    static const struct option opts[] = {{"scenario", required_argument, 0, B_SCENARIO},
                                         {"model", required_argument, 0, B_MODEL},
                                         {"src", required_argument, 0, B_SRC},
                                         {"dst", required_argument, 0, B_DST},
                                         {"src-device", required_argument, 0, B_SDEV},
                                         {"dst-device", required_argument, 0, B_DDEV},
                                         {"cycles", required_argument, 0, B_CYCLES},
                                         {"iters", required_argument, 0, B_ITERS},
                                         {"out", required_argument, 0, B_OUT},
                                         {"skip-nccl", no_argument, 0, B_SKIP_NCCL},
                                         {"transport-options", required_argument, 0, B_TOPTS},
                                         {"timeout-s", required_argument, 0, B_TIMEOUT},
                                         {"skip-baseline", no_argument, 0, B_SKIP_BASE},
                                         {0, 0, 0, 0}};
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
        if (num && tool_parse_u64(optarg, num))
            return tool_usage("bench", "numeric options take non-negative integers");
    }
    if (optind < argc) return tool_usage("bench", "unexpected argument");
    if (!scenario || strcmp(scenario, "gpu")) return tool_usage("bench", "--scenario gpu is the one scenario here");
    if (!topts) topts = "cuda_ipc.exec=alt";
    if (cycles < 2 || cycles > 100 || iters < 1 || iters > 32 || src_dev > 64 || dst_dev > 64)
        return tool_usage("bench", "--cycles 2..100, --iters 1..32");
    char refit_path[4096], cmdline[2048];
    int rc = gpu_bench_ready(argc, argv, refit_path, sizeof(refit_path), cmdline, sizeof(cmdline));
    if (rc) return rc;
    /* 1. refit, in child processes (CUDA stays uninitialised here until they are done). */
    char ncyc[32], sdev[16], ddev[16], tmo[32];
    snprintf(ncyc, sizeof(ncyc), "%" PRIu64, cycles);
    snprintf(sdev, sizeof(sdev), "%" PRIu64, src_dev);
    snprintf(ddev, sizeof(ddev), "%" PRIu64, dst_dev);
    snprintf(tmo, sizeof(tmo), "%" PRIu64, timeout_s);
    char *args[40];
    int a = 0;
    args[a++] = refit_path, args[a++] = "demo", args[a++] = "--json";
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
        launches = TOOL_MAX(launches, jnum(refit_json_at(pc, k), "launches"));
        steady_connect = TOOL_MAX(steady_connect, jnum(refit_json_at(pc, k), "connect_ms"));
    }
    /* 2 and 3. the baselines, in this process. */
    bench_gpu_baseline_t b;
    memset(&b, 0, sizeof(b));
    refit_status_t bst = REFIT_OK;
    char berr[512] = "";
    if (!skip_baseline) {
        fprintf(stderr, "refit bench: baselines: raw peer copy and NCCL broadcast (pack, broadcast, unpack)\n");
        bench_gpu_baseline_cfg_t cfg = {model,           src,      dst, (int)src_dev, (int)dst_dev, (uint32_t)iters, 0,
                                        (uint64_t)bytes, skip_nccl};
        bst = bench_gpu_baseline(&cfg, &b);
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
    tool_print_gpu(f, (int)src_dev);
    fprintf(f, ",");
    tool_print_gpu(f, (int)dst_dev);
    fprintf(f, "],\"p2p\":%s,\"ucx\":", refit_gpu_can_access_peer((int)dst_dev, (int)src_dev) ? "true" : "false");
    tool_json_string(f, tool_ucx_cuda_status());
    fprintf(f, ",\"model\":");
    tool_json_string(f, model);
    fprintf(f, ",\"src\":");
    tool_json_string(f, src);
    fprintf(f, ",\"dst\":");
    tool_json_string(f, dst);
    double peer = b.peer_copy_s, nccl = b.nccl_s;
    bool verified = refit_verified && (skip_baseline || skip_nccl || (b.nccl_ran && b.verified));
    fprintf(
        f,
        ",\"bytes\":%" PRId64 ",\"refit_s\":%.6f,\"refit_gbps\":%.2f,\"refit_transfer_s\":%.6f,"
        "\"publish_to_commit_s\":%.6f,\"peer_copy_s\":%.6f,\"peer_copy_gbps\":%.2f,\"peer_copy_bench_kernel_s\":%.6f,"
        "\"peer_copy_bench_kernel_gbps\":%.2f,\"limit_ratio\":%.4f,\"nccl_s\":%.6f,\"nccl_gbps\":%.2f,\"nccl_ratio\":%.4f,"
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
    fprintf(f,
            ",\"model_bytes\":%" PRIu64 ",\"packed_bytes\":%" PRIu64 ",\"peer_bytes\":%" PRIu64 ",\"iters\":%u,"
            "\"nccl_version\":%d,\"nccl_library\":",
            b.bytes, b.packed_bytes, b.peer_bytes, b.iters, b.nccl_version);
    tool_json_string(f, b.nccl_library);
    fprintf(f,
            ",\"pack_launches\":%" PRIu64 ",\"unpack_launches\":%" PRIu64 ",\"bcast_calls\":%" PRIu64
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
    if (tool_report_write(res, out_path)) fprintf(stderr, "refit bench: %s\n", refit_last_error());
    fprintf(stderr,
            "\nrefit bench (gpu): %s %s -> %s, %.2f GB per refit\n"
            "  refit      %.4f s  (%.1f GB/s; transfer %.4f s; %.0f kernel launches; handle open %.1f ms)  %s\n"
            "  peer copy  %.4f s  (%.1f GB/s; the bench's copy kernel %.4f s)\n"
            "  NCCL       %.4f s  (pack %.4f + broadcast %.4f + unpack %.4f)\n"
            "  limit_ratio %.3f (target <= 1.2)   nccl_ratio %.3f (> 1 means refit is faster)\n",
            model, src, dst, bytes / 1e9, refit_s, refit_s > 0 ? bytes / refit_s / 1e9 : 0, refit_xfer_s, launches,
            open_ms, verified ? "verified" : "NOT VERIFIED", peer, peer > 0 ? b.peer_bytes / peer / 1e9 : 0,
            b.peer_copy_kernel_s, nccl, b.pack_s, b.bcast_s, b.unpack_s, peer > 0 ? refit_s / peer : 0,
            refit_s > 0 ? nccl / refit_s : 0);
    free(res);
    refit_json_free(demo);
    free(demo_out);
    return verified && !bst ? 0 : 1;
}

/* refit bench --scenario colocated: publishers and receivers on ONE GPU (the
 * deployment of NeMo-RL and veRL, training and generation sharing GPUs).
 * For each --dst layout (default vllm:tp=1 and vllm:tp=2), in one run:
 *   1. refit, first refit prepared: `refit demo --prepare` over cuda_ipc,
 *      --src-device = --dst-device; each receiver calls
 *      refit_receiver_prepare (plan, open IPC handles) when the sources have
 *      published, then pulls.  refit_s = the steady span (median of
 *      versions 2..K), first_refit_s = version 1's span, prepare_s = what
 *      the preparation took (before the first pull);
 *   2. the same without --prepare: the cold first refit, handles opened in
 *      the first pull (cold_first_refit_s, handle_open_ms);
 *   3. the limit: a device-to-device cudaMemcpyAsync of the same number of
 *      bytes on that GPU (and the batch copy kernel on them as one region),
 *      digest-checked.
 * limit_ratio = refit_s / d2d_copy_s (target <= 1.15), first_refit_ratio =
 * first_refit_s / refit_s (target <= 2).  Every refit byte is verified on
 * the GPU by the demo's receivers. */
int bench_colocated(int argc, char **argv)
{
    const char *model = "qwen3-30b-a3b", *src = "megatron:ep=2", *out_path = NULL, *topts = NULL;
    const char *dsts[8];
    int ndst = 0;
    uint64_t dev = 0, cycles = 6, iters = 5, timeout_s = 600;
    bool no_cold = false;
    enum { C_SCENARIO = 1, C_MODEL, C_SRC, C_DST, C_DEV, C_CYCLES, C_ITERS, C_OUT, C_TOPTS, C_TIMEOUT, C_NO_COLD };
    static const struct option opts[] = {{"scenario", required_argument, 0, C_SCENARIO},
                                         {"model", required_argument, 0, C_MODEL},
                                         {"src", required_argument, 0, C_SRC},
                                         {"dst", required_argument, 0, C_DST},
                                         {"device", required_argument, 0, C_DEV},
                                         {"cycles", required_argument, 0, C_CYCLES},
                                         {"iters", required_argument, 0, C_ITERS},
                                         {"out", required_argument, 0, C_OUT},
                                         {"transport-options", required_argument, 0, C_TOPTS},
                                         {"timeout-s", required_argument, 0, C_TIMEOUT},
                                         {"no-cold", no_argument, 0, C_NO_COLD},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        uint64_t *num = NULL;
        switch (c) {
        case C_SCENARIO: break;
        case C_MODEL: model = optarg; break;
        case C_SRC: src = optarg; break;
        case C_DST:
            if (ndst == 8) return tool_usage("bench", "at most 8 --dst");
            dsts[ndst++] = optarg;
            break;
        case C_OUT: out_path = optarg; break;
        case C_TOPTS: topts = optarg; break;
        case C_NO_COLD: no_cold = true; break;
        case C_DEV: num = &dev; break;
        case C_CYCLES: num = &cycles; break;
        case C_ITERS: num = &iters; break;
        case C_TIMEOUT: num = &timeout_s; break;
        default: return tool_usage("bench", "unknown option");
        }
        if (num && tool_parse_u64(optarg, num))
            return tool_usage("bench", "numeric options take non-negative integers");
    }
    if (optind < argc) return tool_usage("bench", "unexpected argument");
    if (!ndst) dsts[ndst++] = "vllm:tp=1", dsts[ndst++] = "vllm:tp=2";
    if (cycles < 2 || cycles > 100 || iters < 1 || iters > 32 || dev > 64)
        return tool_usage("bench", "--cycles 2..100, --iters 1..32");
    char refit_path[4096], cmdline[2048];
    int rc = gpu_bench_ready(argc, argv, refit_path, sizeof(refit_path), cmdline, sizeof(cmdline));
    if (rc) return rc;
    char *res = NULL;
    size_t rlen = 0;
    FILE *f = open_memstream(&res, &rlen);
    if (!f) return tool_fail(refit_error(REFIT_ERR_NO_MEMORY, "bench"), "bench");
    char host[128] = "", date[64] = "", ncyc[32], sdev[16], tmo[32];
    gethostname(host, sizeof(host) - 1);
    time_t now = time(NULL);
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    snprintf(ncyc, sizeof(ncyc), "%" PRIu64, cycles);
    snprintf(sdev, sizeof(sdev), "%" PRIu64, dev);
    snprintf(tmo, sizeof(tmo), "%" PRIu64, timeout_s);
    fprintf(f, "{\"scenario\":\"colocated\",\"command\":");
    tool_json_string(f, cmdline);
    fprintf(f, ",\"date\":\"%s\",\"host\":", date);
    tool_json_string(f, host);
    fprintf(f, ",\"model\":");
    tool_json_string(f, model);
    fprintf(f, ",\"src\":");
    tool_json_string(f, src);
    fprintf(f, ",\"device\":%" PRIu64 ",\"runs\":[", dev);
    bool all_verified = true;
    double worst_limit = 0, worst_first = 0;
    for (int di = 0; di < ndst; di++) {
        const char *dst = dsts[di];
        char *outs[2] = {NULL, NULL};
        refit_json_t *demo[2] = {NULL, NULL};
        bool ok[2] = {false, false};
        for (int cold = 0; cold < (no_cold ? 1 : 2); cold++) {
            char *args[40];
            int a = 0;
            args[a++] = refit_path, args[a++] = "demo", args[a++] = "--json";
            args[a++] = "--model", args[a++] = (char *)model, args[a++] = "--src", args[a++] = (char *)src;
            args[a++] = "--dst", args[a++] = (char *)dst, args[a++] = "--transport", args[a++] = "cuda_ipc";
            args[a++] = "--src-device", args[a++] = sdev, args[a++] = "--dst-device", args[a++] = sdev;
            args[a++] = "--cycles", args[a++] = cold ? "3" : ncyc, args[a++] = "--timeout-s", args[a++] = tmo;
            if (!cold) args[a++] = "--prepare";
            if (topts) args[a++] = "--transport-options", args[a++] = (char *)topts;
            args[a] = NULL;
            fprintf(stderr, "refit bench: colocated %s -> %s on GPU %s%s\n", src, dst, sdev,
                    cold ? ", cold first refit (no --prepare)" : ", receivers prepared");
            int status = 0;
            outs[cold] = run_capture(args, &status);
            const char *js = outs[cold] ? strchr(outs[cold], '{') : NULL;
            if (!js || refit_json_parse(js, strlen(js), &demo[cold])) {
                fprintf(stderr, "refit bench: the refit phase printed no result (status %d)\n", status);
                demo[cold] = NULL;
            }
            if (demo[cold]) refit_json_bool(refit_json_get(demo[cold], "verified"), &ok[cold]);
        }
        double refit_s = demo[0] ? jnum(demo[0], "steady_span_ms") / 1e3 : 0;
        double xfer_s = demo[0] ? jnum(demo[0], "steady_transfer_ms") / 1e3 : 0;
        double prepare_s = demo[0] ? jnum(demo[0], "prepare_ms") / 1e3 : 0;
        int64_t bytes = 0;
        if (demo[0]) refit_json_int(refit_json_get(demo[0], "bytes_per_cycle"), &bytes);
        const refit_json_t *pc = demo[0] ? refit_json_get(demo[0], "per_cycle") : NULL;
        double first_s = refit_json_len(pc) ? jnum(refit_json_at(pc, 0), "span_ms") / 1e3 : 0;
        double first_connect = refit_json_len(pc) ? jnum(refit_json_at(pc, 0), "connect_ms") : 0;
        const refit_json_t *pcc = demo[1] ? refit_json_get(demo[1], "per_cycle") : NULL;
        double cold_s = refit_json_len(pcc) ? jnum(refit_json_at(pcc, 0), "span_ms") / 1e3 : 0;
        double cold_open = refit_json_len(pcc) ? jnum(refit_json_at(pcc, 0), "connect_ms") : 0;
        double cold_steady = demo[1] ? jnum(demo[1], "steady_span_ms") / 1e3 : 0;
        bench_gpu_d2d_t d;
        memset(&d, 0, sizeof(d));
        char derr[512] = "";
        refit_status_t dst_st = REFIT_ERR_UNSUPPORTED;
        if (bytes > 0) {
            fprintf(stderr, "refit bench: limit: device-to-device copy of %" PRId64 " bytes on GPU %s\n", bytes, sdev);
            dst_st = bench_gpu_d2d_baseline((int)dev, (uint64_t)bytes, (uint32_t)iters, &d);
            if (dst_st) snprintf(derr, sizeof(derr), "%s: %s", refit_status_name(dst_st), refit_last_error());
        } else snprintf(derr, sizeof(derr), "no refit result: no byte count to copy");
        double limit = d.copy_s > 0 && refit_s > 0 ? refit_s / d.copy_s : 0;
        double first_ratio = refit_s > 0 ? first_s / refit_s : 0;
        bool verified = ok[0] && (no_cold || ok[1]) && !dst_st;
        all_verified &= verified;
        if (!verified) rc = 1;
        worst_limit = limit > worst_limit ? limit : worst_limit;
        worst_first = first_ratio > worst_first ? first_ratio : worst_first;
        fprintf(f, "%s{\"dst\":", di ? "," : "");
        tool_json_string(f, dst);
        fprintf(
            f,
            ",\"bytes\":%" PRId64 ",\"refit_s\":%.6f,\"refit_gbps\":%.2f,\"refit_transfer_s\":%.6f,"
            "\"d2d_copy_s\":%.6f,\"d2d_copy_gbps\":%.2f,\"d2d_bytes\":%" PRIu64 ",\"bench_copy_kernel_s\":%.6f,"
            "\"bench_copy_kernel_gbps\":%.2f,\"limit_ratio\":%.4f,\"limit_ratio_ok\":%s,"
            "\"first_refit_s\":%.6f,\"first_refit_ratio\":%.4f,\"first_refit_ok\":%s,\"first_connect_ms\":%.3f,"
            "\"prepare_s\":%.6f,\"cold_first_refit_s\":%.6f,\"cold_handle_open_ms\":%.3f,\"cold_steady_refit_s\":%.6f,"
            "\"cold_first_refit_ratio\":%.4f,\"refit_verified\":%s,\"d2d_verified\":%s,\"verified\":%s,\"d2d_error\":",
            bytes, refit_s, refit_s > 0 ? bytes / refit_s / 1e9 : 0, xfer_s, d.copy_s,
            d.copy_s > 0 ? d.bytes / d.copy_s / 1e9 : 0, d.bytes, d.kernel_s,
            d.kernel_s > 0 ? d.bytes / d.kernel_s / 1e9 : 0, limit, limit > 0 && limit <= 1.15 ? "true" : "false",
            first_s, first_ratio, first_ratio > 0 && first_ratio <= 2 ? "true" : "false", first_connect, prepare_s,
            cold_s, cold_open, cold_steady, cold_steady > 0 ? cold_s / cold_steady : 0,
            ok[0] && (no_cold || ok[1]) ? "true" : "false", !dst_st ? "true" : "false", verified ? "true" : "false");
        tool_json_string(f, derr);
        fprintf(f, ",\"d2d_copy_runs_s\":[");
        for (uint32_t i = 0; i < d.iters && d.copy_s > 0; i++) fprintf(f, "%s%.6f", i ? "," : "", d.copy_runs[i]);
        const char *js0 = outs[0] ? strchr(outs[0], '{') : NULL, *js1 = outs[1] ? strchr(outs[1], '{') : NULL;
        fprintf(f, "],\"refit\":%s,\"refit_cold\":%s}", js0 && demo[0] ? js0 : "null", js1 && demo[1] ? js1 : "null");
        fprintf(
            stderr,
            "refit bench (colocated): %s -> %s, %.2f GB\n"
            "  refit      %.4f s (%.1f GB/s)  first refit %.4f s (prepared in %.3f s before it; cold: %.4f s, handles %.1f ms)\n"
            "  d2d copy   %.4f s (%.1f GB/s; the bench's copy kernel %.4f s)\n"
            "  limit_ratio %.3f (target <= 1.15)  first_refit_ratio %.3f (target <= 2)  %s\n",
            src, dst, bytes / 1e9, refit_s, refit_s > 0 ? bytes / refit_s / 1e9 : 0, first_s, prepare_s, cold_s,
            cold_open, d.copy_s, d.copy_s > 0 ? d.bytes / d.copy_s / 1e9 : 0, d.kernel_s, limit, first_ratio,
            verified ? "verified" : "NOT VERIFIED");
        for (int k = 0; k < 2; k++) {
            refit_json_free(demo[k]);
            free(outs[k]);
        }
    }
    fprintf(
        f,
        "],\"limit_ratio\":%.4f,\"first_refit_ratio\":%.4f,\"limit_ratio_ok\":%s,\"first_refit_ok\":%s,\"verified\":%s}\n",
        worst_limit, worst_first, worst_limit > 0 && worst_limit <= 1.15 ? "true" : "false",
        worst_first > 0 && worst_first <= 2 ? "true" : "false", all_verified ? "true" : "false");
    fclose(f);
    for (size_t i = 0; i + 1 < rlen; i++)
        if (res[i] == '\n') res[i] = ' ';
    if (tool_report_write(res, out_path)) fprintf(stderr, "refit bench: %s\n", refit_last_error());
    free(res);
    return rc;
}
