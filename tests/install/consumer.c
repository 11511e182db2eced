/* A program outside the tree, built against an installed refit (see
 * test_install.sh): refit's public headers and library only.  It plans
 * tiny-dense from megatron tp=2 to one hf rank, checks the plan's byte count
 * against the model's size, moves the bytes of version 3 with the plan and
 * verifies every one.  Exits 0 only if all of that holds. */
#include <refit/refit.h>
#include <refit/experimental/truth.h> /* the synthetic truth: experimental, installed all the same */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                                        \
    do {                                                                                                   \
        refit_status_t st_ = (call);                                                                       \
        if (st_ != REFIT_OK) {                                                                             \
            fprintf(stderr, "consumer: %s: %s (%s)\n", #call, refit_status_name(st_), refit_last_error()); \
            return 1;                                                                                      \
        }                                                                                                  \
    } while (0)

static void **alloc_regions(const refit_manifest_t *m)
{
    uint32_t n = refit_manifest_num_regions(m);
    void **bases = calloc(n ? n : 1, sizeof(*bases));
    for (uint32_t r = 0; bases && r < n; r++) bases[r] = calloc(1, refit_manifest_region_size(m, r));
    return bases;
}

int main(void)
{
    int major = -1, minor = -1, patch = -1;
    const char *v = refit_version(&major, &minor, &patch);
    if (major != REFIT_VERSION_MAJOR || minor != REFIT_VERSION_MINOR || patch != REFIT_VERSION_PATCH) {
        fprintf(stderr, "consumer: library %s, headers %d.%d.%d\n", v, REFIT_VERSION_MAJOR, REFIT_VERSION_MINOR,
                REFIT_VERSION_PATCH);
        return 1;
    }
    unsigned features = refit_features();
    if (!(features & REFIT_FEATURE_SHM)) return fprintf(stderr, "consumer: no shm feature\n"), 1;
    printf("refit %s features", v);
    for (unsigned bit = 1; bit; bit <<= 1)
        if (features & bit) printf(" %s", refit_feature_name(bit));
    printf("\n");
    double t0 = refit_now();

    refit_model_t *model;
    refit_layout_t *src_layout, *dst_layout;
    CHECK(refit_model_builtin("tiny-dense", &model));
    CHECK(refit_layout_parse("megatron:tp=2", &src_layout));
    CHECK(refit_layout_parse("hf", &dst_layout));
    refit_manifest_t *srcs[2], *dst;
    for (uint32_t r = 0; r < 2; r++) CHECK(refit_layout_manifest(src_layout, model, r, &srcs[r]));
    CHECK(refit_layout_manifest(dst_layout, model, 0, &dst));

    refit_plan_t *plan;
    CHECK(refit_plan_create((const refit_manifest_t *const *)srcs, 2, dst, NULL, &plan));
    refit_plan_stats_t stats = REFIT_PLAN_STATS_INIT;
    refit_plan_stats(plan, &stats);
    uint64_t total = refit_model_total_bytes(model);
    printf("plan: %llu bytes written, %llu read, %zu regions; model %llu bytes\n",
           (unsigned long long)stats.bytes_written, (unsigned long long)stats.bytes_read, stats.regions,
           (unsigned long long)total);
    if (stats.bytes_written != total || stats.bytes_read != total || stats.regions == 0) {
        fprintf(stderr, "consumer: the plan does not cover the model exactly once\n");
        return 1;
    }

    void **src_bases[2], **dst_bases = alloc_regions(dst);
    for (uint32_t r = 0; r < 2; r++) {
        src_bases[r] = alloc_regions(srcs[r]);
        CHECK(refit_truth_fill(srcs[r], src_bases[r], 3));
    }
    CHECK(refit_plan_execute_memcpy(plan, (const void *const *const *)src_bases, dst_bases, 1));
    refit_truth_report_t rep = REFIT_TRUTH_REPORT_INIT;
    CHECK(refit_truth_verify(dst, (const void *const *)dst_bases, 3, &rep));
    if (rep.bytes_checked != total || rep.mismatches != 0) {
        fprintf(stderr, "consumer: verified %llu bytes of %llu\n", (unsigned long long)rep.bytes_checked,
                (unsigned long long)total);
        return 1;
    }
    if (!(refit_now() >= t0)) return fprintf(stderr, "consumer: clock went back\n"), 1;
    printf("verified %llu bytes\n", (unsigned long long)rep.bytes_checked);

    for (uint32_t r = 0; r < 2; r++) {
        for (uint32_t k = 0; k < refit_manifest_num_regions(srcs[r]); k++) free(src_bases[r][k]);
        free(src_bases[r]);
        refit_manifest_destroy(srcs[r]);
    }
    for (uint32_t k = 0; k < refit_manifest_num_regions(dst); k++) free(dst_bases[k]);
    free(dst_bases);
    refit_plan_destroy(plan);
    refit_manifest_destroy(dst);
    refit_layout_destroy(src_layout);
    refit_layout_destroy(dst_layout);
    refit_model_destroy(model);
    return 0;
}
