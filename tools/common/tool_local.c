/* Synthetic in-process sources and destinations (see tool_local.h). */
#include "tool_local.h"

#include <stdlib.h>
#include <string.h>

void tool_local_set_destroy(tool_local_set_t *s)
{
    if (!s) return;
    for (uint32_t i = 0; i < s->n; i++) {
        if (s->manifests) refit_manifest_destroy(s->manifests[i]);
        if (s->arenas) free(s->arenas[i]);
    }
    free(s->manifests);
    free(s->arenas);
    free(s->bases);
    memset(s, 0, sizeof(*s));
}

refit_status_t tool_local_set_create(const refit_model_t *model, const refit_layout_t *layout, bool fill,
                                     uint64_t version, tool_local_set_t *out)
{
    refit_status_t st;
    tool_local_set_t s = {.n = refit_layout_world(layout)};
    s.manifests = calloc(s.n, sizeof(*s.manifests));
    s.arenas = calloc(s.n, sizeof(*s.arenas));
    s.bases = calloc(s.n, sizeof(*s.bases));
    if (!s.manifests || !s.arenas || !s.bases) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "allocating %u source ranks", s.n);
        goto err;
    }
    for (uint32_t i = 0; i < s.n; i++) {
        if ((st = refit_layout_manifest(layout, model, i, &s.manifests[i]))) goto err;
        s.bases[i] = (const void *const *)&s.arenas[i];
        if (!fill) continue;
        uint64_t size = refit_manifest_region_size(s.manifests[i], 0);
        s.arenas[i] = malloc(size);
        if (!s.arenas[i]) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "allocating %llu bytes for rank %u", (unsigned long long)size, i);
            goto err;
        }
        if ((st = refit_truth_fill(s.manifests[i], &s.arenas[i], version))) goto err;
    }
    *out = s;
    return REFIT_OK;
err:
    tool_local_set_destroy(&s);
    return st;
}

refit_status_t tool_local_run(const tool_local_set_t *src, const refit_manifest_t *dst, bool execute, uint64_t version,
                              const refit_plan_params_t *params, const char *dump_path, tool_local_result_t *out)
{
    refit_status_t st;
    refit_plan_t *plan = NULL;
    void *arena = NULL;
    tool_local_result_t res = {.stats = REFIT_PLAN_STATS_INIT, .verify = REFIT_TRUTH_REPORT_INIT};
    if ((st = refit_plan_create((const refit_manifest_t *const *)src->manifests, src->n, dst, params, &plan)))
        return st;
    if ((st = refit_plan_stats(plan, &res.stats))) goto out;
    if (execute) {
        uint64_t size = refit_manifest_region_size(dst, 0);
        arena = malloc(size);
        if (!arena) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "allocating %llu destination bytes", (unsigned long long)size);
            goto out;
        }
        memset(arena, 0xa5, size); /* poison */
        double t0 = refit_now();
        if ((st = refit_plan_execute_memcpy(plan, src->bases, &arena, 0))) goto out;
        res.exec_ms = (refit_now() - t0) * 1e3;
        if ((st = refit_truth_verify(dst, (const void *const *)&arena, version, &res.verify))) goto out;
        if (dump_path && (st = refit_safetensors_write(dump_path, dst, (const void *const *)&arena))) goto out;
    }
    if (out) *out = res;
out:
    free(arena);
    refit_plan_destroy(plan);
    return st;
}
