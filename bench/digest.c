/* bench_digest: throughput of content digests (src/data/digest.h) next to a
 * single-thread memcpy of the same memory, in the same run.
 *
 *   receiver: refit_digest_local over one vLLM tp=2 rank of qwen3-30b-a3b-mini
 *             (1 and 2 threads; the scalar kernel too, for reference);
 *   publisher: refit_digest_table_fill over one Megatron ep=8 rank of the same
 *             model, and the table's size as a fraction of the placed bytes;
 *   planning: digest plan of every vLLM tp=2 rank from the 8 ep=8 sources,
 *             for the mini model and the real qwen3-30b-a3b (manifests only).
 *
 * Usage: bench_digest [REPS] (default 5; each figure is the best of REPS runs)
 * Prints one JSON object on stdout. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "digest_common.h"
#include "data/digest.h"
#include "layout/manifest.h"
#include "refit/experimental/all.h"
#include "util/util.h"

static void *arena_of(const refit_manifest_t *m)
{
    uint64_t size = refit_manifest_region_size(m, 0);
    void *a = aligned_alloc(4096, (size + 4095) / 4096 * 4096);
    if (!a) exit(1);
    CHECK(refit_truth_fill(m, &a, 1)); /* touches every page */
    return a;
}

static uint64_t placed_bytes(const refit_manifest_t *m)
{
    uint64_t b = 0;
    for (size_t i = 0; i < m->placements.len; i++) {
        const refit_placement_t *p = &m->placements.data[i];
        uint64_t v = refit_dtype_size(m->canon.data[p->canon].dtype);
        for (uint32_t d = 0; d < p->ndim; d++) v *= p->extent[d];
        b += v;
    }
    return b;
}

static double best_local(const refit_digest_key_t *k, const refit_manifest_t *m, void *arena, refit_dsum_t *out,
                         unsigned threads, int reps)
{
    double best = 1e9;
    for (int r = 0; r < reps; r++) {
        double t0 = refit_now();
        CHECK(refit_digest_local(k, m, (const void *const *)&arena, out, threads));
        best = REFIT_MIN(best, refit_now() - t0);
    }
    return best;
}

static double best_fill(const refit_digest_key_t *k, const refit_manifest_t *m, void *arena, void *table,
                        unsigned threads, int reps)
{
    double best = 1e9;
    for (int r = 0; r < reps; r++) {
        double t0 = refit_now();
        CHECK(refit_digest_table_fill(k, m, (const void *const *)&arena, table, threads));
        best = REFIT_MIN(best, refit_now() - t0);
    }
    return best;
}

/* Digest plans of every vllm:tp=2 rank from the megatron:ep=8 sources. */
static void plan_figures(const char *model_name, bool last)
{
    refit_model_t *model;
    CHECK(refit_model_builtin(model_name, &model));
    refit_manifest_t *srcs[8];
    uint64_t table = 0, data = 0;
    for (uint32_t s = 0; s < 8; s++) {
        srcs[s] = manifest(model, "megatron:ep=8", s);
        table += refit_digest_table_bytes(srcs[s]);
        data += placed_bytes(srcs[s]);
    }
    printf("    \"%s\": {\"source_table_bytes\": %" PRIu64 ", \"source_bytes\": %" PRIu64 ", \"table_fraction\": %.5f, "
           "\"destinations\": [",
           model_name, table, data, (double)table / (double)data);
    for (uint32_t r = 0; r < 2; r++) {
        refit_manifest_t *dm = manifest(model, "vllm:tp=2", r);
        refit_digest_plan_t *dp;
        double t0 = refit_now();
        CHECK(refit_digest_plan_create((const refit_manifest_t *const *)srcs, 8, NULL, dm, &dp));
        double ms = (refit_now() - t0) * 1e3;
        refit_digest_plan_stats_t st;
        refit_digest_plan_stats(dp, &st);
        printf("%s{\"rank\": %u, \"placements\": %" PRIu64 ", \"verifiable\": %" PRIu64 ", \"bytes\": %" PRIu64
               ", \"unverifiable_bytes\": %" PRIu64 ", \"fetches\": %" PRIu64 ", \"fetch_bytes\": %" PRIu64
               ", \"plan_ms\": %.1f}",
               r ? ", " : "", r, st.placements, st.verifiable, st.bytes, st.unverifiable_bytes, st.fetches,
               st.fetches * 8, ms);
        refit_digest_plan_destroy(dp);
        refit_manifest_destroy(dm);
    }
    printf("]}%s\n", last ? "" : ",");
    for (uint32_t s = 0; s < 8; s++) refit_manifest_destroy(srcs[s]);
    refit_model_destroy(model);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (reps < 1) reps = 1;
    char host[512];
    host_json(host, sizeof(host)); /* before the run loads the machine */
    const char *model_name = "qwen3-30b-a3b-mini";
    refit_model_t *model;
    CHECK(refit_model_builtin(model_name, &model));
    uint8_t raw[32];
    for (int i = 0; i < 32; i++) raw[i] = (uint8_t)(i * 37 + 1);
    refit_digest_key_t *k, *ks;
    CHECK(refit_digest_key_create(raw, &k));
    CHECK(refit_digest_key_create_impl(raw, REFIT_DIGEST_IMPL_SCALAR, &ks));

    /* Receiver: a vLLM tp=2 rank. */
    refit_manifest_t *dm = manifest(model, "vllm:tp=2", 0);
    uint64_t region = refit_manifest_region_size(dm, 0), placed = placed_bytes(dm);
    void *arena = arena_of(dm), *copy = aligned_alloc(4096, (region + 4095) / 4096 * 4096);
    if (!copy) return 1;
    memset(copy, 1, region);
    double tcopy = 1e9;
    for (int r = 0; r < reps; r++) {
        double t0 = refit_now();
        memcpy(copy, arena, region);
        tcopy = REFIT_MIN(tcopy, refit_now() - t0);
    }
    refit_dsum_t *d1 = malloc(dm->placements.len * sizeof(*d1)), *d2 = malloc(dm->placements.len * sizeof(*d2)),
                 *d3 = malloc(dm->placements.len * sizeof(*d3));
    double t1 = best_local(k, dm, arena, d1, 1, reps), t2 = best_local(k, dm, arena, d2, 2, reps);
    double ts = best_local(ks, dm, arena, d3, 1, reps > 2 ? 2 : reps);
    if (memcmp(d1, d2, dm->placements.len * sizeof(*d1)) || memcmp(d1, d3, dm->placements.len * sizeof(*d1))) {
        fprintf(stderr, "digests differ between thread counts or kernels\n");
        return 1;
    }
    /* Rows of the receiver's placements: the kernel's per-row work. */
    uint64_t rows = 0;
    for (size_t i = 0; i < dm->placements.len; i++)
        rows += dm->placements.data[i].ndim == 2 ? dm->placements.data[i].extent[0] : 1;

    /* Publisher: a Megatron ep=8 rank (and the receiver's own manifest as a
     * publisher, as a relay would be). */
    refit_manifest_t *sm = manifest(model, "megatron:ep=8", 0);
    void *sarena = arena_of(sm);
    uint64_t sbytes = placed_bytes(sm), tbytes = refit_digest_table_bytes(sm), tdst = refit_digest_table_bytes(dm);
    void *table = aligned_alloc(64, (tbytes + 63) / 64 * 64);
    if (!table) return 1;
    memset(table, 0, tbytes);
    double f1 = best_fill(k, sm, sarena, table, 1, reps), f2 = best_fill(k, sm, sarena, table, 2, reps);

    printf("{\n  \"bench\": \"digest\",\n%s  \"model\": \"%s\",\n  \"kernel\": \"%s\",\n  \"reps\": %d,\n", host,
           model_name, refit_digest_impl_name(refit_digest_key_impl(k)), reps);
    printf("  \"receiver\": {\"layout\": \"vllm:tp=2\", \"rank\": 0, \"placements\": %zu, \"rows\": %" PRIu64
           ", \"placed_bytes\": %" PRIu64 ", \"region_bytes\": %" PRIu64 ",\n",
           dm->placements.len, rows, placed, region);
    printf("    \"memcpy_1t_gbps\": %.2f, \"digest_local_1t_gbps\": %.2f, \"digest_local_2t_gbps\": %.2f, "
           "\"digest_local_scalar_1t_gbps\": %.2f,\n",
           region / tcopy / 1e9, placed / t1 / 1e9, placed / t2 / 1e9, placed / ts / 1e9);
    printf("    \"digest_local_1t_vs_memcpy\": %.3f, \"digest_local_2t_vs_memcpy\": %.3f, \"ns_per_row_1t\": %.1f,\n",
           (placed / t1) / (region / tcopy), (placed / t2) / (region / tcopy), t1 * 1e9 / (double)rows);
    printf("    \"table_bytes_as_publisher\": %" PRIu64 ", \"table_fraction_as_publisher\": %.5f},\n", tdst,
           (double)tdst / (double)placed);
    printf(
        "  \"publisher\": {\"layout\": \"megatron:ep=8\", \"rank\": 0, \"placements\": %zu, \"placed_bytes\": %" PRIu64
        ", \"table_bytes\": %" PRIu64 ", \"table_fraction\": %.5f,\n",
        sm->placements.len, sbytes, tbytes, (double)tbytes / (double)sbytes);
    printf("    \"table_fill_1t_gbps\": %.2f, \"table_fill_2t_gbps\": %.2f},\n", sbytes / f1 / 1e9, sbytes / f2 / 1e9);
    printf("  \"plans\": {\n");
    plan_figures("qwen3-30b-a3b-mini", false);
    plan_figures("qwen3-30b-a3b", true);
    printf("  }\n}\n");

    free(d1);
    free(d2);
    free(d3);
    free(table);
    free(sarena);
    free(arena);
    free(copy);
    refit_manifest_destroy(sm);
    refit_manifest_destroy(dm);
    refit_digest_key_destroy(k);
    refit_digest_key_destroy(ks);
    refit_model_destroy(model);
    return 0;
}
