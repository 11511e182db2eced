/* Shared by the digest benchmarks (bench/digest.c, bench/digest_fused.c): a fatal CHECK, the host line of
 * their JSON records, and a manifest from a layout spec. */
#ifndef REFIT_BENCH_DIGEST_COMMON_H
#define REFIT_BENCH_DIGEST_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "layout/manifest.h"
#include "refit/refit.h"

#define CHECK(expr)                                                                             \
    do {                                                                                        \
        refit_status_t st_ = (expr);                                                            \
        if (st_) {                                                                              \
            fprintf(stderr, "%s: %s: %s\n", #expr, refit_status_name(st_), refit_last_error()); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

/* The host: CPU model, online CPUs and the load average when the run began
 * (other processes share the machines these figures come from). */
static inline void host_json(char *buf, size_t size)
{
    char model[128] = "unknown", line[256];
    double load = -1;
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(model, sizeof(model), "%s", strchr(line, ':') + 2);
            model[strcspn(model, "\n\"")] = '\0';
            break;
        }
    if (f) fclose(f);
    if ((f = fopen("/proc/loadavg", "r"))) {
        if (fscanf(f, "%lf", &load) != 1) load = -1;
        fclose(f);
    }
    snprintf(buf, size, "  \"host\": {\"cpu\": \"%s\", \"cpus\": %ld, \"loadavg_1min_at_start\": %.2f},\n", model,
             sysconf(_SC_NPROCESSORS_ONLN), load);
}

static inline refit_manifest_t *manifest(const refit_model_t *model, const char *spec, uint32_t rank)
{
    refit_layout_t *l;
    refit_manifest_t *m;
    CHECK(refit_layout_parse(spec, &l));
    CHECK(refit_layout_manifest(l, model, rank, &m));
    refit_layout_destroy(l);
    return m;
}

#endif
