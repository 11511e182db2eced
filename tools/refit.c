/* The refit command.
 *
 *   refit plan     --model M --src LAYOUT --dst LAYOUT [--rank R | --all-ranks]
 *                  [--json] [--execute [--version V] [--dump DIR]]
 *   refit models   [--json]
 *   refit manifest --model M --layout LAYOUT [--rank R]
 *   refit version
 *
 * Exit status: 0 success, 1 a refit error (printed with its name and detail),
 * 2 a usage error. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tool.h"
#include "tool_local.h"
#include "refit/experimental/all.h"

int cmd_preflight(int argc, char **argv); /* tools/preflight.c */


static void print_help(FILE *f)
{
    fprintf(
        f,
        "usage: refit COMMAND [options]\n"
        "\n"
        "commands:\n"
        "  plan      compute (and optionally execute and verify) the byte plan between two layouts\n"
        "            --model M         built-in model name or path to a Hugging Face config.json\n"
        "            --src LAYOUT      e.g. megatron:tp=1,pp=1,ep=8   (source / trainer layout)\n"
        "            --dst LAYOUT      e.g. vllm:tp=2                 (destination / rollout layout)\n"
        "            --rank R          plan destination rank R (default 0)\n"
        "            --all-ranks       plan every destination rank\n"
        "            --json            print one JSON object\n"
        "            --execute         fill synthetic sources in memory, run each plan, verify every byte\n"
        "            --version V       weights version for --execute (default 1)\n"
        "            --dump DIR        with --execute, write DIR/rank-R/model.safetensors per destination rank\n"
        "            --split-bytes N   split replicated pieces above N bytes across replicas (default 4 MiB)\n"
        "  publish   one trainer rank: --model M --layout L [--rank R] [--versions K] ... (docs/runtime.md);\n"
        "            --acks N waits for N receivers to commit each version (default 1, or 0 with --hold-ms MS,\n"
        "            which serves MS after the last version); --timeout-ms bounds each wait\n"
        "            --from-safetensors DIR publishes a Hugging Face checkpoint (model.safetensors.index.json\n"
        "            + shards, or model.safetensors): --layout hf (default) maps the shard files, no copy;\n"
        "            any other --layout L --rank R copies that rank's cut (e.g. megatron:tp=2,ep=2)\n"
        "            --delta F: offer each version also as a delta from the last (F: the share of\n"
        "            elements the synthetic truth changes per version)\n"
        "  pull      one rollout rank: --model M --layout L [--rank R] [--versions K] [--verify] ...;\n"
        "            --dump DIR writes the pulled local tensors to DIR/rank-R/model.safetensors;\n"
        "            --delta F: verify against the truth that changes F per version; --no-delta: pull in full\n"
        "            --prepare: plan and connect (open IPC handles) before the first pull\n"
        "            --fp8: the receiver holds block-FP8 weights, quantized on the GPU while pulled\n"
        "            (--device, cuda_ipc; verified against the CPU quantizer)\n"
        "  publish, pull, demo: --no-digest skips content digests (publishers compute none; receivers\n"
        "            commit bytes unchecked against them: docs/security.md)\n"
        "  demo      publishers and receivers as processes, K verified cycles (README first lines):\n"
        "            --model M --src L --dst L --cycles K --transport shm|ucx --mode in-place|snapshot\n"
        "            --replicas N --delta F --src-device N --dst-device N --no-digest --prepare --fp8 --json\n"
        "            --digest-ab[=N]: N pairs (3) of whole demos with digests on and off, the on/off ratio\n"
        "  models    list built-in models with their tensor counts and sizes\n"
        "  manifest  print one rank's local tensors and placements: --model M --layout LAYOUT [--rank R]\n"
        "  bench     the benchmarks are their own program, refit-bench (beside refit; 'refit-bench --help');\n"
        "            refit bench ARGS runs refit-bench ARGS\n"
        "  gpus      list the CUDA devices here (JSON; count 0 without CUDA or a GPU)\n"
        "  preflight check this host for a job before it starts: transports and UCX lanes, RDMA, GPUs, memlock,\n"
        "            memory, /dev/shm, the registry (reach, a probe key, latency), the secret, the clock, the plan;\n"
        "            pass/warn/fail with a remedy per line, exit 1 on a fail (docs/operations.md)\n"
        "            --registry URL --job J --transports LIST --transport-options OPTS --device N\n"
        "            --model M --src L --dst L --role trainer|rollout --ranks R,S-T|all --mode in-place|snapshot\n"
        "            --shm-need BYTES --json\n"
        "  simulate  predict a refit on a described cluster: the real planner for every destination rank,\n"
        "            the engine's fleet rules (relays, chunks, stealing), max-min fair flows over NICs,\n"
        "            NVLink, PCIe and spine (docs/scale.md): --model M --src L --dst L --replicas N\n"
        "            [--relays --max-readers K] --cluster PRESET|key=value,...|@FILE.json [--json]\n"
        "            [--plot FILE.png]; --calibrate: against the measured runs in bench/results;\n"
        "            --plan-scale: every destination rank planned with --threads N; --presets\n"
        "  version   print the library version\n"
        "\n"
        "layouts: hf | megatron:tp=,pp=,ep=,etp=,dp=,pad= | vllm:tp=,ep=,dp=,pad=   (docs/layouts.md)\n"
        "environment: REFIT_LOG_LEVEL=error|warn|info|debug|trace; metrics: REFIT_METRICS_FILE=PATH.prom,\n"
        "             REFIT_METRICS_ADDR=127.0.0.1:PORT (Prometheus; docs/operations.md)\n");
}


static uint64_t physical_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}


static int cmd_plan(int argc, char **argv)
{
    const char *model_name = NULL, *src_spec = NULL, *dst_spec = NULL, *dump = NULL;
    uint64_t rank = 0, version = 1, split = 0;
    bool all = false, json = false, execute = false, rank_given = false;
    enum { O_MODEL = 1, O_SRC, O_DST, O_RANK, O_ALL, O_JSON, O_EXEC, O_VERSION, O_DUMP, O_SPLIT, O_HELP };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL}, {"src", required_argument, 0, O_SRC},
        {"dst", required_argument, 0, O_DST},     {"rank", required_argument, 0, O_RANK},
        {"all-ranks", no_argument, 0, O_ALL},     {"json", no_argument, 0, O_JSON},
        {"execute", no_argument, 0, O_EXEC},      {"version", required_argument, 0, O_VERSION},
        {"dump", required_argument, 0, O_DUMP},   {"split-bytes", required_argument, 0, O_SPLIT},
        {"help", no_argument, 0, O_HELP},         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_MODEL: model_name = optarg; break;
        case O_SRC: src_spec = optarg; break;
        case O_DST: dst_spec = optarg; break;
        case O_RANK:
            if (tool_parse_u64(optarg, &rank) || rank > UINT32_MAX)
                return tool_usage("plan", "--rank takes a rank number");
            rank_given = true;
            break;
        case O_ALL: all = true; break;
        case O_JSON: json = true; break;
        case O_EXEC: execute = true; break;
        case O_VERSION:
            if (tool_parse_u64(optarg, &version)) return tool_usage("plan", "--version takes a non-negative integer");
            break;
        case O_DUMP: dump = optarg; break;
        case O_SPLIT:
            if (tool_parse_u64(optarg, &split) || split == 0)
                return tool_usage("plan", "--split-bytes takes a positive integer");
            break;
        case O_HELP: print_help(stdout); return 0;
        default: return tool_usage("plan", "unknown option");
        }
    }
    if (optind < argc) return tool_usage("plan", "unexpected argument");
    if (!model_name || !src_spec || !dst_spec) return tool_usage("plan", "--model, --src and --dst are required");
    if (all && rank_given) return tool_usage("plan", "--rank and --all-ranks exclude each other");
    if (dump && !execute) return tool_usage("plan", "--dump needs --execute");

    int rc = 1;
    refit_status_t st;
    refit_model_t *model = NULL;
    refit_layout_t *src = NULL, *dst = NULL;
    tool_local_set_t set = {0};
    if ((st = refit_model_open(model_name, &model))) return tool_fail(st, "model");
    if ((st = refit_layout_parse(src_spec, &src))) {
        tool_fail(st, "--src");
        goto out;
    }
    if ((st = refit_layout_parse(dst_spec, &dst))) {
        tool_fail(st, "--dst");
        goto out;
    }
    if ((st = refit_layout_check(src, model))) {
        tool_fail(st, "--src");
        goto out;
    }
    if ((st = refit_layout_check(dst, model))) {
        tool_fail(st, "--dst");
        goto out;
    }
    uint32_t world = refit_layout_world(dst);
    if (!all && rank >= world) {
        fprintf(stderr, "refit plan: --rank %" PRIu64 " is not below the destination world size %u\n", rank, world);
        rc = 2;
        goto out;
    }
    if (execute) {
        /* Sources hold the model at least once; the destination arena is one rank. */
        uint64_t need = refit_model_total_bytes(model) * 2, have = physical_memory();
        if (have && need > have / 2) {
            fprintf(stderr,
                    "refit plan: --execute needs about %.1f GB of memory for %s, this machine has %.1f GB; "
                    "plan without --execute, or use a smaller model\n",
                    (double)need / 1e9, refit_model_name(model), (double)have / 1e9);
            goto out;
        }
    }
    double t0 = refit_now();
    if ((st = tool_local_set_create(model, src, execute, version, &set))) {
        tool_fail(st, "building source manifests");
        goto out;
    }
    double src_ms = (refit_now() - t0) * 1e3;
    refit_plan_params_t params = REFIT_PLAN_PARAMS_INIT;
    params.split_bytes = split;
    if (json) {
        printf("{\"model\":");
        tool_json_string(stdout, refit_model_name(model));
        printf(",\"src\":");
        tool_json_string(stdout, refit_layout_string(src));
        printf(",\"dst\":");
        tool_json_string(stdout, refit_layout_string(dst));
        printf(",\"model_bytes\":%" PRIu64
               ",\"src_ranks\":%u,\"dst_ranks\":%u,\"src_manifest_ms\":%.3f,\"executed\":%s,"
               "\"ranks\":[",
               refit_model_total_bytes(model), set.n, world, src_ms, execute ? "true" : "false");
    } else {
        printf("model %s (%" PRIu64 " bytes)\nsrc   %s (%u ranks, manifests built in %.1f ms)\ndst   %s (%u ranks)\n\n",
               refit_model_name(model), refit_model_total_bytes(model), refit_layout_string(src), set.n, src_ms,
               refit_layout_string(dst), world);
        printf("%5s %16s %16s %10s %12s %9s %8s %7s %9s%s\n", "rank", "bytes_written", "bytes_read", "redundant",
               "padding", "regions", "pieces", "sources", "plan_ms", execute ? "   verified" : "");
    }
    uint32_t first = all ? 0 : (uint32_t)rank, last = all ? world : (uint32_t)rank + 1;
    bool ok = true;
    for (uint32_t r = first; r < last; r++) {
        refit_manifest_t *dm = NULL;
        tool_local_result_t res;
        char path[4096] = "";
        if ((st = refit_layout_manifest(dst, model, r, &dm))) {
            tool_fail(st, "destination manifest");
            ok = false;
            break;
        }
        if (dump && (st = tool_dump_path(dump, r, path, sizeof(path)))) {
            tool_fail(st, "plan --dump");
            refit_manifest_destroy(dm);
            ok = false;
            break;
        }
        st = tool_local_run(&set, dm, execute, version, &params, dump ? path : NULL, &res);
        refit_manifest_destroy(dm);
        if (st) {
            char what[64];
            snprintf(what, sizeof(what), "destination rank %u", r);
            tool_fail(st, what);
            ok = false;
            break;
        }
        const refit_plan_stats_t *s = &res.stats;
        if (json) {
            printf("%s{\"rank\":%u,\"bytes_written\":%" PRIu64 ",\"bytes_read\":%" PRIu64
                   ",\"bytes_redundant\":%" PRIu64 ",\"bytes_padding\":%" PRIu64
                   ",\"regions\":%zu,\"fills\":%zu,\"pieces\":%zu,\"sources\":%zu,"
                   "\"plan_ms\":%.3f",
                   r == first ? "" : ",", r, s->bytes_written, s->bytes_read, s->bytes_redundant, s->bytes_fill,
                   s->regions, s->fills, s->pieces, s->sources_used, s->plan_ms);
            if (execute)
                printf(",\"verified\":true,\"bytes_verified\":%" PRIu64 ",\"exec_ms\":%.3f", res.verify.bytes_checked,
                       res.exec_ms);
            printf("}");
        } else {
            printf("%5u %16" PRIu64 " %16" PRIu64 " %10" PRIu64 " %12" PRIu64 " %9zu %8zu %7zu %9.2f%s\n", r,
                   s->bytes_written, s->bytes_read, s->bytes_redundant, s->bytes_fill, s->regions, s->pieces,
                   s->sources_used, s->plan_ms, execute ? "   yes" : "");
        }
        fflush(stdout);
    }
    if (json) printf("],\"ok\":%s}\n", ok ? "true" : "false");
    else if (ok && execute)
        printf("\nevery destination byte verified against the synthetic truth of version %" PRIu64 "\n", version);
    rc = ok ? 0 : 1;
out:
    tool_local_set_destroy(&set);
    refit_layout_destroy(src);
    refit_layout_destroy(dst);
    refit_model_destroy(model);
    return rc;
}

static int cmd_models(int argc, char **argv)
{
    bool json = argc > 1 && strcmp(argv[1], "--json") == 0;
    if (json) printf("[");
    for (size_t i = 0; refit_model_builtin_name(i); i++) {
        refit_model_t *m;
        refit_status_t st = refit_model_builtin(refit_model_builtin_name(i), &m);
        if (st) return tool_fail(st, "model");
        if (json)
            printf("%s{\"name\":\"%s\",\"tensors\":%zu,\"bytes\":%" PRIu64 "}", i ? "," : "", refit_model_name(m),
                   refit_model_num_tensors(m), refit_model_total_bytes(m));
        else
            printf("%-18s %8zu tensors %18" PRIu64 " bytes\n", refit_model_name(m), refit_model_num_tensors(m),
                   refit_model_total_bytes(m));
        refit_model_destroy(m);
    }
    if (json) printf("]\n");
    return 0;
}

static int cmd_manifest(int argc, char **argv)
{
    const char *model_name = NULL, *spec = NULL;
    uint64_t rank = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model_name = argv[++i];
        else if (!strcmp(argv[i], "--layout") && i + 1 < argc) spec = argv[++i];
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc) {
            if (tool_parse_u64(argv[++i], &rank) || rank > UINT32_MAX)
                return tool_usage("manifest", "--rank takes a number");
        } else return tool_usage("manifest", "usage: refit manifest --model M --layout LAYOUT [--rank R]");
    }
    if (!model_name || !spec) return tool_usage("manifest", "--model and --layout are required");
    refit_model_t *model = NULL;
    refit_layout_t *layout = NULL;
    refit_manifest_t *m = NULL;
    refit_status_t st;
    int rc = 1;
    if ((st = refit_model_open(model_name, &model))) return tool_fail(st, "model");
    if ((st = refit_layout_parse(spec, &layout)) || (st = refit_layout_manifest(layout, model, (uint32_t)rank, &m))) {
        tool_fail(st, "manifest");
        goto out;
    }
    refit_manifest_identity_t id;
    refit_manifest_identity(m, &id);
    void *enc;
    size_t enc_len;
    if ((st = refit_manifest_encode(m, &enc, &enc_len))) {
        tool_fail(st, "encode");
        goto out;
    }
    free(enc);
    printf("model %s  layout %s  rank %u of %u  signature %016" PRIx64 "  region 0: %" PRIu64
           " bytes  encoded: %zu bytes\n",
           id.model, id.layout, id.rank, id.world, refit_manifest_signature(m), refit_manifest_region_size(m, 0),
           enc_len);
    for (uint32_t i = 0; i < refit_manifest_num_locals(m); i++) {
        refit_tensor_info_t t;
        uint64_t off;
        refit_manifest_local(m, i, &t, NULL, &off);
        printf("  %-64s %-5s [", t.name, refit_dtype_name(t.dtype));
        for (uint32_t d = 0; d < t.ndim; d++) printf("%s%" PRIu64, d ? ", " : "", t.shape[d]);
        printf("] @%" PRIu64 "\n", off);
        for (uint32_t k = 0; k < refit_manifest_num_placements(m); k++) {
            refit_placement_t p;
            refit_manifest_placement(m, k, &p);
            if (p.local != i) continue;
            refit_tensor_info_t ct;
            refit_manifest_canonical(m, p.canon, &ct);
            printf("      <- %s [", ct.name);
            for (uint32_t d = 0; d < p.ndim; d++)
                printf("%s%" PRIu64 ":%" PRIu64, d ? ", " : "", p.canon_offset[d], p.canon_offset[d] + p.extent[d]);
            printf("] at (");
            for (uint32_t d = 0; d < t.ndim; d++) printf("%s%" PRIu64, d ? ", " : "", p.local_offset[d]);
            printf(")\n");
        }
    }
    rc = 0;
out:
    refit_manifest_destroy(m);
    refit_layout_destroy(layout);
    refit_model_destroy(model);
    return rc;
}

/* The library's version and the optional parts built into it
 * (refit_features()): "refit 0.1.0 (registries: file redis; transports: shm cuda_ipc ucx)". */
static int cmd_version(void)
{
    unsigned f = refit_features();
    printf("refit %s (registries: file%s; transports: shm%s%s)\n", refit_version(NULL, NULL, NULL),
           f & REFIT_FEATURE_REDIS ? " redis" : "", f & REFIT_FEATURE_CUDA ? " cuda_ipc" : "",
           f & REFIT_FEATURE_UCX ? " ucx" : "");
    return 0;
}

/* The benchmarks are their own program, refit-bench, beside this one:
 * `refit bench ARGS` runs `refit-bench ARGS` (and says where it is). */
static int cmd_bench_forward(int argc, char **argv)
{
    char path[4096];
    if (tool_sibling("refit-bench", path, sizeof(path)) || access(path, X_OK))
        snprintf(path, sizeof(path), "refit-bench"); /* not beside refit: look in $PATH */
    fprintf(stderr, "refit bench: the benchmarks are the program refit-bench; running %s\n", path);
    argv[0] = path;
    execvp(path, argv);
    fprintf(stderr, "refit bench: cannot run %s: %s\n", path, strerror(errno));
    return 127;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        print_help(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "plan")) return cmd_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "models")) return cmd_models(argc - 1, argv + 1);
    if (!strcmp(cmd, "manifest")) return cmd_manifest(argc - 1, argv + 1);
    if (!strcmp(cmd, "publish")) return cmd_publish(argc - 1, argv + 1);
    if (!strcmp(cmd, "pull")) return cmd_pull(argc - 1, argv + 1);
    if (!strcmp(cmd, "demo")) return cmd_demo(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench_forward(argc - 1, argv + 1);
    if (!strcmp(cmd, "gpus")) return cmd_gpus(argc - 1, argv + 1);
    if (!strcmp(cmd, "simulate")) return cmd_simulate(argc - 1, argv + 1);
    if (!strcmp(cmd, "preflight")) return cmd_preflight(argc - 1, argv + 1);
    if (!strcmp(cmd, "version")) return cmd_version();
    fprintf(stderr, "refit: unknown command '%s'\n", cmd);
    print_help(stderr);
    return 2;
}
