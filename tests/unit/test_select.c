/* Partial refit: a narrowed manifest keeps whole fused local tensors, plans
 * and pulls only them, verifies only them, and leaves the rest untouched. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

static void fused_expansion(void **state)
{
    (void)state;
    refit_manifest_t *m = t_manifest_named("tiny-moe", "vllm:tp=2", 0), *s;
    refit_select_report_t rep = {.size = 4, .locals = 9}; /* too small: refused, nothing made or written */
    s = NULL;
    REFIT_ASSERT_ERR(refit_manifest_select(m, "model.layers.1.self_attn.q_proj.weight", false, &s, &rep),
                     REFIT_ERR_INVALID_ARG, "refit_select_report_t: size is 4");
    assert_null(s);
    assert_int_equal(rep.locals, 9);
    rep.size = sizeof(rep);
    REFIT_ASSERT_OK(refit_manifest_select(m, "model.layers.1.self_attn.q_proj.weight", false, &s, &rep));
    assert_int_equal(rep.locals, 1);
    assert_int_equal(rep.canon_named, 1);
    assert_int_equal(rep.canon_pulled, 3); /* q, k, v: qkv_proj is refreshed whole */
    assert_int_equal(refit_manifest_num_locals(s), 1);
    assert_int_equal(refit_manifest_num_placements(s), 3);
    refit_tensor_info_t t;
    uint32_t region;
    uint64_t off, off0 = 0;
    refit_manifest_local(s, 0, &t, &region, &off);
    assert_string_equal(t.name, "model.layers.1.self_attn.qkv_proj.weight");
    for (uint32_t i = 0; i < refit_manifest_num_locals(m); i++) {
        refit_tensor_info_t u;
        refit_manifest_local(m, i, &u, &region, &off0);
        if (!strcmp(u.name, t.name)) break;
    }
    assert_int_equal(off, off0); /* same place in the same memory */
    assert_int_not_equal(refit_manifest_signature(s), refit_manifest_signature(m));
    refit_manifest_destroy(s);
    /* gate_proj of layer 0 pulls the whole gate_up (dense tiny-dense). */
    refit_manifest_t *d = t_manifest_named("tiny-dense", "vllm:tp=2", 1);
    REFIT_ASSERT_OK(refit_manifest_select(d, "model.layers.0.mlp.gate_proj.weight", false, &s, &rep));
    assert_int_equal(rep.canon_pulled, 2);
    refit_manifest_destroy(s);
    refit_manifest_destroy(d);
    /* One expert: the w13/w2 of every layer holding it, with all its experts. */
    REFIT_ASSERT_OK(refit_manifest_select(m, "expert:5", false, &s, &rep));
    assert_int_equal(rep.locals, 8);          /* 4 layers x (w13, w2) */
    assert_int_equal(rep.canon_named, 4 * 3); /* gate, up, down of expert 5 per layer */
    assert_int_equal(rep.canon_pulled, 4 * 8 * 3);
    refit_manifest_destroy(s);
    refit_manifest_destroy(m);
    /* With expert parallel, expert 5 lives on rank 1 only. */
    m = t_manifest_named("tiny-moe", "vllm:tp=2,ep=2", 0);
    REFIT_ASSERT_ERR(refit_manifest_select(m, "expert:5", false, &s, &rep), REFIT_ERR_NOT_FOUND, "expert");
    REFIT_ASSERT_ERR(refit_manifest_select(m, "layer:x", false, &s, &rep), REFIT_ERR_PARSE, "number");
    REFIT_ASSERT_ERR(refit_manifest_select(m, "a,,b", false, &s, &rep), REFIT_ERR_PARSE, "empty");
    refit_manifest_destroy(m);
}

/* Sources at version 2, destination at version 1; pull only layer 2 and the
 * lm_head: those are version 2, everything else still version 1. */
static void partial_pull(void **state)
{
    (void)state;
    refit_manifest_t *src[2], *dst = t_manifest_named("tiny-moe", "vllm:tp=2", 1), *sel, *rest;
    void *sb[2];
    const void *const *sbp[2];
    for (int i = 0; i < 2; i++) {
        src[i] = t_manifest_named("tiny-moe", "megatron:ep=2", (uint32_t)i);
        sb[i] = malloc(refit_manifest_region_size(src[i], 0));
        sbp[i] = (const void *const *)&sb[i];
        REFIT_ASSERT_OK(refit_truth_fill(src[i], &sb[i], 1));
    }
    uint64_t ds = refit_manifest_region_size(dst, 0);
    void *mem = malloc(ds);
    memset(mem, 0x5a, ds);
    refit_plan_t *full, *part;
    refit_plan_stats_t fs = REFIT_PLAN_STATS_INIT, ps = REFIT_PLAN_STATS_INIT;
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)src, 2, dst, NULL, &full));
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(full, (const void *const *const *)sbp, &mem, 1));
    REFIT_ASSERT_OK(refit_truth_verify(dst, (const void *const *)&mem, 1, NULL));
    for (int i = 0; i < 2; i++) REFIT_ASSERT_OK(refit_truth_fill(src[i], &sb[i], 2));
    refit_select_report_t rep = REFIT_SELECT_REPORT_INIT;
    REFIT_ASSERT_OK(refit_manifest_select(dst, "layer:2,lm_head.weight", false, &sel, &rep));
    REFIT_ASSERT_OK(refit_manifest_select(dst, "layer:2,lm_head.weight", true, &rest, NULL));
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)src, 2, sel, NULL, &part));
    refit_plan_stats(full, &fs);
    refit_plan_stats(part, &ps);
    assert_int_equal(ps.bytes_written, rep.bytes - ps.bytes_fill);
    assert_true(ps.bytes_read < fs.bytes_read / 3);
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(part, (const void *const *const *)sbp, &mem, 1));
    REFIT_ASSERT_OK(refit_truth_verify(sel, (const void *const *)&mem, 2, NULL));  /* pulled */
    REFIT_ASSERT_OK(refit_truth_verify(rest, (const void *const *)&mem, 1, NULL)); /* untouched */
    REFIT_ASSERT_ERR(refit_truth_verify(dst, (const void *const *)&mem, 2, NULL), REFIT_ERR_VERIFY, "");
    refit_plan_destroy(full);
    refit_plan_destroy(part);
    refit_manifest_destroy(sel);
    refit_manifest_destroy(rest);
    refit_manifest_destroy(dst);
    for (int i = 0; i < 2; i++) {
        refit_manifest_destroy(src[i]);
        free(sb[i]);
    }
    free(mem);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(fused_expansion), cmocka_unit_test(partial_pull)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
