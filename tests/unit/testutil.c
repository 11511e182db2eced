#include "testutil.h"

#include <stdio.h>
#include <string.h>
#include <stdio.h>

void refit_test_assert_err(refit_status_t got, refit_status_t want, const char *needle, const char *expr,
                           const char *file, int line)
{
    if (got != want) {
        fprintf(stderr, "%s returned %s (%s), want %s\n", expr, refit_status_name(got), refit_last_error(),
                refit_status_name(want));
        _fail(file, line);
    }
    if (needle && !strstr(refit_last_error(), needle)) {
        fprintf(stderr, "%s: detail \"%s\" lacks \"%s\"\n", expr, refit_last_error(), needle);
        _fail(file, line);
    }
}

refit_model_t *t_model(const char *name)
{
    refit_model_t *m = NULL;
    REFIT_ASSERT_OK(refit_model_builtin(name, &m));
    return m;
}

refit_layout_t *t_layout(const char *spec)
{
    refit_layout_t *l = NULL;
    REFIT_ASSERT_OK(refit_layout_parse(spec, &l));
    return l;
}

refit_manifest_t *t_manifest(const refit_model_t *m, const char *spec, uint32_t rank)
{
    refit_layout_t *l = t_layout(spec);
    refit_manifest_t *man = NULL;
    REFIT_ASSERT_OK(refit_layout_manifest(l, m, rank, &man));
    refit_layout_destroy(l);
    return man;
}

int t_find_placement(const refit_manifest_t *m, const char *local, const char *canon, uint64_t crow,
                     refit_placement_t *out)
{
    for (uint32_t i = 0; i < refit_manifest_num_placements(m); i++) {
        refit_placement_t p;
        refit_tensor_info_t lt, ct;
        refit_manifest_placement(m, i, &p);
        refit_manifest_local(m, p.local, &lt, NULL, NULL);
        refit_manifest_canonical(m, p.canon, &ct);
        if (strcmp(lt.name, local) == 0 && strcmp(ct.name, canon) == 0 && p.canon_offset[0] == crow) {
            if (out) *out = p;
            return (int)i;
        }
    }
    return -1;
}

uint32_t t_execute_pair(const char *model_name, const char *src_spec, const char *dst_spec, uint64_t v)
{
    refit_model_t *model = t_model(model_name);
    refit_layout_t *src = t_layout(src_spec), *dst = t_layout(dst_spec);
    refit_local_set_t set;
    REFIT_ASSERT_OK(refit_local_set_create(model, src, true, v, &set));
    uint32_t world = refit_layout_world(dst);
    for (uint32_t r = 0; r < world; r++) {
        refit_manifest_t *dm = NULL;
        REFIT_ASSERT_OK(refit_layout_manifest(dst, model, r, &dm));
        refit_local_result_t res;
        refit_status_t st = refit_local_run(&set, dm, true, v, NULL, NULL, &res);
        if (st != REFIT_OK)
            fail_msg("%s: %s -> %s rank %u: %s: %s", model_name, src_spec, dst_spec, r, refit_status_name(st),
                     refit_last_error());
        assert_int_equal(res.stats.bytes_redundant, 0);
        assert_int_equal(res.stats.bytes_read, res.stats.bytes_written);
        assert_true(res.stats.bytes_written > 0);
        /* Verification looked at every byte of the arena's tensors. */
        assert_int_equal(res.verify.bytes_checked, res.stats.bytes_written + res.stats.bytes_fill);
        assert_int_equal(res.verify.mismatches, 0);
        refit_manifest_destroy(dm);
    }
    refit_local_set_destroy(&set);
    refit_layout_destroy(src);
    refit_layout_destroy(dst);
    refit_model_destroy(model);
    return world;
}
