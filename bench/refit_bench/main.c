/* refit-bench: the benchmark scenarios of refit, a program of its own beside
 * the refit command (ucx_perftest beside ucx_info, valkey-benchmark beside
 * valkey-cli).  Built on the public API (include/refit) against librefit.so.
 *
 *   refit-bench --scenario NAME [options]     one JSON record on stdout
 *   refit-bench netns NODES [--link-mbps X]   network namespaces for a script (netns.c)
 *
 * Scenarios: gpu.c (gpu, colocated: they run `refit demo`, the program beside
 * this one), net.c (fanout, elastic, straggler, egress, and delta / fp8 with
 * --net), data.c (delta, partial, fp8 on this host).  `refit bench ARGS`
 * runs this program.  Exit status: 0, 1 a failed run, 2 a usage error, 77 a
 * scenario this build or host cannot run. */
#include <stdio.h>
#include <string.h>

#include "bench.h"

static void print_help(FILE *f)
{
    fprintf(f, "usage: refit-bench --scenario NAME [options]   (also: refit bench --scenario NAME ...)\n"
               "\n"
               "  --scenario gpu: refit over cuda_ipc between two GPUs against the raw peer copy and\n"
               "    an NCCL broadcast baseline, all in one run, one JSON record (docs/gpu.md)\n"
               "    --model M --src LAYOUT --dst LAYOUT --src-device N --dst-device N --cycles K\n"
               "    --iters N --out FILE --skip-nccl --skip-baseline --transport-options OPTS\n"
               "  --scenario colocated: publishers and receivers on one GPU (--device N) against a\n"
               "    device-to-device copy of the same bytes, prepared and cold first refits; --dst\n"
               "    repeatable (default vllm:tp=1 and vllm:tp=2), --no-cold (docs/gpu.md: Colocated)\n"
               "  --scenario delta|partial|fp8: fleet data features on this host (processes, shared\n"
               "    memory): --model M --src LAYOUT --dst LAYOUT [--fraction F --versions K]\n"
               "    [--select PATTERNS] [--threads N] --out FILE; delta --net shm|netns: through\n"
               "    publishers and receivers (a full and a delta receiver in turn, --link-mbps X)\n"
               "  --scenario fanout|elastic|straggler|egress: the fleet on this host (processes, shm),\n"
               "    one JSON record with assertions; --model M --receivers N --src L --dst L\n"
               "    --max-readers N --chunk-kb N --link-mbps X --verify --out FILE (README: Fleet);\n"
               "    fanout --net netns (its default as root): each process a network namespace with\n"
               "    tbf-limited links, bytes over UCX; --net shm: all on this host's shared memory\n"
               "  fleet scenarios and delta --net: --no-digest (publishers and receivers without content\n"
               "    digests: the off arm of bench/digest-ab-paths.sh)\n"
               "\n"
               "usage: refit-bench netns NODES [--link-mbps X]: that many network namespaces on a bridge\n"
               "  (as --net netns makes them; root), one line per node \"NAMESPACE ADDRESS INTERFACE\", then\n"
               "  READY; all taken down when standard input ends (for scripts: tests/cli/test_netns.sh)\n"
               "\n"
               "layouts: hf | megatron:tp=,pp=,ep=,etp=,dp=,pad= | vllm:tp=,ep=,dp=,pad=   (docs/layouts.md)\n");
}

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} g_scenarios[] = {
    {"gpu", bench_gpu},
    {"fanout", bench_fanout},
    {"elastic", bench_elastic},
    {"straggler", bench_straggler},
    {"egress", bench_egress},
    {"delta", bench_delta},
    {"partial", bench_partial},
    {"fp8", bench_fp8},
    {"colocated", bench_colocated},
};

int main(int argc, char **argv)
{
    const char *scenario = NULL;
    if (argc >= 2 && !strcmp(argv[1], "netns")) return bench_netns(argc, argv);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h") || !strcmp(argv[i], "help")) {
            print_help(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--scenario") && i + 1 < argc) scenario = argv[i + 1];
        else if (!strncmp(argv[i], "--scenario=", 11)) scenario = argv[i] + 11;
    }
    for (size_t k = 0; scenario && k < sizeof(g_scenarios) / sizeof(g_scenarios[0]); k++)
        if (!strcmp(g_scenarios[k].name, scenario)) return g_scenarios[k].run(argc, argv);
    return tool_usage("bench",
                      "--scenario is one of gpu, colocated, fanout, elastic, straggler, egress, delta, partial, fp8");
}
