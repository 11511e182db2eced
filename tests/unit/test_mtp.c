/* Multi-token-prediction (MTP) layers (issue 35): DeepSeek-V3's
 * num_nextn_predict_layers in the model spec, and how the layouts hold them:
 * hf (every canonical tensor), megatron mtp=N (megatron-core's mtp.layers.*
 * on the last stage), vllm draft=mtp (vLLM's DeepSeekMTP draft model), and
 * the layouts that hold none (the vllm target, dtensor, megatron without
 * mtp=).  Model tiny-mtp: tiny-mla (3 layers: 1 dense, 2 MoE) with two MTP
 * layers, model.layers.3 and model.layers.4. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "refit/experimental/safetensors.h"

#include "layout/layout.h"
#include "model/model.h"
#include "tool_local.h"

static int has_local(const refit_manifest_t *m, const char *name)
{
    for (uint32_t i = 0; i < refit_manifest_num_locals(m); i++) {
        refit_tensor_info_t t;
        refit_manifest_local(m, i, &t, NULL, NULL);
        if (!strcmp(t.name, name)) return 1;
    }
    return 0;
}

/* The number of local tensors whose name starts with `prefix`. */
static uint32_t count_locals(const refit_manifest_t *m, const char *prefix)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < refit_manifest_num_locals(m); i++) {
        refit_tensor_info_t t;
        refit_manifest_local(m, i, &t, NULL, NULL);
        n += strncmp(t.name, prefix, strlen(prefix)) == 0;
    }
    return n;
}

static void local_shape2(const refit_manifest_t *m, const char *name, uint64_t d0, uint64_t d1)
{
    for (uint32_t i = 0; i < refit_manifest_num_locals(m); i++) {
        refit_tensor_info_t t;
        refit_manifest_local(m, i, &t, NULL, NULL);
        if (strcmp(t.name, name)) continue;
        assert_int_equal(t.ndim, 2);
        assert_int_equal(t.shape[0], d0);
        assert_int_equal(t.shape[1], d1);
        return;
    }
    fail_msg("no local tensor %s", name);
}

/* A placement of canonical rows [crow, crow + n) (all columns) at local row lrow. */
static void expect_rows(const refit_manifest_t *m, const char *local, const char *canon, uint64_t crow, uint64_t n,
                        uint64_t lrow)
{
    refit_placement_t p;
    if (t_find_placement(m, local, canon, crow, &p) < 0)
        fail_msg("no placement of %s row %llu in %s", canon, (unsigned long long)crow, local);
    assert_int_equal(p.extent[0], n);
    refit_tensor_info_t lt;
    refit_manifest_local(m, p.local, &lt, NULL, NULL);
    assert_int_equal(p.local_offset[lt.ndim == 3 ? 1 : 0], lrow);
}

static void canonical_tensors(void **state)
{
    (void)state;
    refit_model_t *m = t_model("tiny-mtp"), *base = t_model("tiny-mla");
    /* Two MTP layers, each a decoder layer (MoE: 2 norms, 7 attention tensors,
     * gate + bias, 8 x 3 experts, 3 shared) and enorm, hnorm, eh_proj,
     * shared_head.norm. */
    const size_t per = 2 + 7 + 2 + 24 + 3 + 4;
    assert_int_equal(refit_model_num_tensors(m), refit_model_num_tensors(base) + 2 * per);
    int64_t eh = refit_model_find_tensor(m, "model.layers.4.eh_proj.weight");
    assert_true(eh >= 0);
    refit_tensor_info_t t;
    REFIT_ASSERT_OK(refit_model_tensor(m, (size_t)eh, &t));
    assert_int_equal(t.ndim, 2);
    assert_int_equal(t.shape[0], 64);
    assert_int_equal(t.shape[1], 128); /* [embedding; hidden] */
    assert_true(refit_model_tensor_is_mtp(m, (size_t)eh));
    assert_true(refit_model_find_tensor(m, "model.layers.3.mlp.experts.7.down_proj.weight") >= 0);
    assert_true(refit_model_find_tensor(m, "model.layers.3.mlp.gate.e_score_correction_bias") >= 0);
    assert_true(refit_model_find_tensor(m, "model.layers.3.shared_head.norm.weight") >= 0);
    /* The checkpoint's copies of the embedding and the output head in the MTP
     * layer are the main model's: not canonical. */
    assert_true(refit_model_find_tensor(m, "model.layers.3.embed_tokens.weight") < 0);
    assert_true(refit_model_find_tensor(m, "model.layers.3.shared_head.head.weight") < 0);
    assert_true(refit_model_find_tensor(m, "model.layers.5.enorm.weight") < 0);
    int64_t main_norm = refit_model_find_tensor(m, "model.layers.2.input_layernorm.weight");
    assert_false(refit_model_tensor_is_mtp(m, (size_t)main_norm));
    uint32_t mtp = 0;
    for (size_t i = 0; i < refit_model_num_tensors(m); i++) mtp += refit_model_tensor_is_mtp(m, i);
    assert_int_equal(mtp, 2 * per);
    /* The main model's tensors are tiny-mla's, in the same order. */
    for (size_t i = 0, j = 0; i < refit_model_num_tensors(m); i++) {
        if (refit_model_tensor_is_mtp(m, i)) continue;
        refit_tensor_info_t a, b;
        REFIT_ASSERT_OK(refit_model_tensor(m, i, &a));
        REFIT_ASSERT_OK(refit_model_tensor(base, j++, &b));
        assert_string_equal(a.name, b.name);
    }
    refit_model_destroy(base);
    refit_model_destroy(m);
}

static void layout_strings(void **state)
{
    (void)state;
    refit_layout_t *l = t_layout("megatron:tp=2,mtp=2");
    assert_string_equal(refit_layout_string(l), "megatron:tp=2,pp=1,ep=1,etp=2,dp=1,pad=128,mtp=2");
    refit_layout_destroy(l);
    l = t_layout("megatron:tp=2,mtp=0"); /* the default: no MTP layers, the string unchanged */
    assert_string_equal(refit_layout_string(l), "megatron:tp=2,pp=1,ep=1,etp=2,dp=1,pad=128");
    refit_layout_destroy(l);
    l = t_layout("vllm:tp=2,draft=mtp,names=routed");
    assert_string_equal(refit_layout_string(l), "vllm:tp=2,ep=1,dp=1,pad=64,names=routed,draft=mtp");
    refit_layout_destroy(l);
    refit_layout_t *bad = (refit_layout_t *)0x1;
    REFIT_ASSERT_ERR(refit_layout_parse("vllm:draft=eagle", &bad), REFIT_ERR_PARSE,
                     "draft=eagle is not a draft model refit describes");
    REFIT_ASSERT_ERR(refit_layout_parse("vllm:draft=mtp,draft=mtp", &bad), REFIT_ERR_PARSE, "draft given twice");
    REFIT_ASSERT_ERR(refit_layout_parse("vllm:mtp=1", &bad), REFIT_ERR_PARSE, "unknown knob 'mtp'");
    REFIT_ASSERT_ERR(refit_layout_parse("megatron:draft=mtp", &bad), REFIT_ERR_PARSE, "unknown knob 'draft'");
    REFIT_ASSERT_ERR(refit_layout_parse("megatron:mtp=17", &bad), REFIT_ERR_GEOMETRY, "above refit's limit of 16");
    REFIT_ASSERT_ERR(refit_layout_parse("megatron:mtp=-1", &bad), REFIT_ERR_PARSE, "not a non-negative integer");
    REFIT_ASSERT_ERR(refit_layout_parse("hf:mtp=1", &bad), REFIT_ERR_PARSE, "hf takes no knobs");
    assert_ptr_equal(bad, (refit_layout_t *)0x1);
    /* Against the model: more MTP layers than it has; an MTP draft of a model without one. */
    refit_model_t *m = t_model("tiny-mtp"), *mla = t_model("tiny-mla"), *dense = t_model("tiny-dense");
    l = t_layout("megatron:mtp=3");
    REFIT_ASSERT_ERR(refit_layout_check(l, m), REFIT_ERR_GEOMETRY, "mtp=3 MTP layers, but model tiny-mtp has 2");
    REFIT_ASSERT_ERR(refit_layout_check(l, dense), REFIT_ERR_GEOMETRY, "model tiny-dense has 0");
    refit_layout_destroy(l);
    l = t_layout("vllm:tp=2,draft=mtp");
    REFIT_ASSERT_OK(refit_layout_check(l, m));
    refit_manifest_t *out = (refit_manifest_t *)0x1;
    REFIT_ASSERT_ERR(refit_layout_manifest(l, mla, 0, &out), REFIT_ERR_GEOMETRY,
                     "model tiny-mla has no MTP layer (num_nextn_predict_layers is 0)");
    assert_ptr_equal(out, (refit_manifest_t *)0x1);
    refit_layout_destroy(l);
    refit_model_destroy(dense);
    refit_model_destroy(mla);
    refit_model_destroy(m);
}

/* vLLM's DeepSeekMTP draft at tp=2, rank 1 (names as vLLM 0.32 lists them in
 * the real engine: tests/python/test_vllm_mla.py). */
static void vllm_draft(void **state)
{
    (void)state;
    refit_model_t *m = t_model("tiny-mtp");
    refit_manifest_t *r = t_manifest(m, "vllm:tp=2,draft=mtp,names=routed", 1);
    /* only MTP layers: no embedding, no main layer, no lm_head */
    assert_int_equal(count_locals(r, "model.layers.3."), count_locals(r, "model.layers.4."));
    assert_int_equal(count_locals(r, "model.layers.3.") + count_locals(r, "model.layers.4."),
                     refit_manifest_num_locals(r));
    assert_false(has_local(r, "model.embed_tokens.weight"));
    assert_false(has_local(r, "model.layers.3.shared_head.head.weight"));
    /* eh_proj is a plain torch Linear in vLLM: whole on every rank */
    local_shape2(r, "model.layers.3.eh_proj.weight", 64, 128);
    expect_rows(r, "model.layers.3.eh_proj.weight", "model.layers.3.eh_proj.weight", 0, 64, 0);
    expect_rows(r, "model.layers.4.enorm.weight", "model.layers.4.enorm.weight", 0, 64, 0);
    expect_rows(r, "model.layers.4.hnorm.weight", "model.layers.4.hnorm.weight", 0, 64, 0);
    expect_rows(r, "model.layers.4.shared_head.norm.weight", "model.layers.4.shared_head.norm.weight", 0, 64, 0);
    /* the decoder layer under mtp_block, fused and split as the target's */
    const char *fa = "model.layers.3.mtp_block.self_attn.fused_qkv_a_proj.weight";
    local_shape2(r, fa, 32 + 16 + 4, 64);
    expect_rows(r, fa, "model.layers.3.self_attn.kv_a_proj_with_mqa.weight", 0, 20, 32);
    /* kv_b_proj [8 heads x (8 + 8), 16]: rank 1 holds heads 4..7 */
    expect_rows(r, "model.layers.3.mtp_block.self_attn.kv_b_proj.weight", "model.layers.3.self_attn.kv_b_proj.weight",
                64, 64, 0);
    expect_rows(r, "model.layers.4.mtp_block.mlp.shared_experts.gate_up_proj.weight",
                "model.layers.4.mlp.shared_experts.up_proj.weight", 8, 8, 8);
    expect_rows(r, "model.layers.4.mtp_block.mlp.experts.routed_experts.w13_weight",
                "model.layers.4.mlp.experts.5.gate_proj.weight", 8, 8, 0);
    assert_true(has_local(r, "model.layers.4.mtp_block.mlp.gate.e_score_correction_bias"));
    assert_true(has_local(r, "model.layers.4.mtp_block.input_layernorm.weight"));
    refit_manifest_destroy(r);
    /* The target's vllm layout holds no MTP layer (vLLM's target model has none). */
    r = t_manifest(m, "vllm:tp=2", 0);
    assert_int_equal(count_locals(r, "model.layers.3."), 0);
    assert_true(has_local(r, "model.layers.2.mlp.experts.w13_weight"));
    refit_manifest_destroy(r);
    /* Nor does a transformers model (dtensor: DeepseekV3ForCausalLM ignores model.layers.{L}.*). */
    r = t_manifest(m, "dtensor:dp_shard=2", 0);
    assert_int_equal(count_locals(r, "model.layers.3."), 0);
    refit_manifest_destroy(r);
    /* hf: a checkpoint holds them. */
    r = t_manifest(m, "hf", 0);
    assert_true(has_local(r, "model.layers.4.eh_proj.weight"));
    assert_int_equal(refit_manifest_num_locals(r), refit_model_num_tensors(m));
    refit_manifest_destroy(r);
    refit_model_destroy(m);
}

/* megatron-core's MultiTokenPredictionBlock (mtp.layers.*) on the last stage. */
static void megatron_mtp(void **state)
{
    (void)state;
    refit_model_t *m = t_model("tiny-mtp");
    refit_manifest_t *r = t_manifest(m, "megatron:tp=2,ep=2,mtp=2", 1);
    /* eh_proj column parallel: rank 1 holds output rows 32..63 */
    local_shape2(r, "mtp.layers.1.eh_proj.weight", 32, 128);
    expect_rows(r, "mtp.layers.1.eh_proj.weight", "model.layers.4.eh_proj.weight", 32, 32, 0);
    expect_rows(r, "mtp.layers.0.enorm.weight", "model.layers.3.enorm.weight", 0, 64, 0);
    expect_rows(r, "mtp.layers.0.hnorm.weight", "model.layers.3.hnorm.weight", 0, 64, 0);
    expect_rows(r, "mtp.layers.0.final_layernorm.weight", "model.layers.3.shared_head.norm.weight", 0, 64, 0);
    /* the decoder layer with the decoder's names under transformer_layer */
    expect_rows(r, "mtp.layers.0.transformer_layer.self_attention.linear_kv_up_proj.weight",
                "model.layers.3.self_attn.kv_b_proj.weight", 64, 64, 0);
    expect_rows(r, "mtp.layers.1.transformer_layer.pre_mlp_layernorm.weight",
                "model.layers.4.post_attention_layernorm.weight", 0, 64, 0);
    assert_true(has_local(r, "mtp.layers.1.transformer_layer.mlp.router.expert_bias"));
    /* ep=2, etp=2 -> rank 1 is ep rank 0: experts 0..3, second half of each */
    expect_rows(r, "mtp.layers.0.transformer_layer.mlp.experts.linear_fc1.weight3",
                "model.layers.3.mlp.experts.3.gate_proj.weight", 8, 8, 0);
    assert_false(has_local(r, "mtp.layers.0.transformer_layer.mlp.experts.linear_fc1.weight4"));
    refit_manifest_destroy(r);
    /* Without mtp=: none */
    r = t_manifest(m, "megatron:tp=2,ep=2", 1);
    assert_int_equal(count_locals(r, "mtp."), 0);
    refit_manifest_destroy(r);
    /* mtp=1 of 2: the first MTP layer only */
    r = t_manifest(m, "megatron:mtp=1", 0);
    assert_true(has_local(r, "mtp.layers.0.eh_proj.weight"));
    assert_false(has_local(r, "mtp.layers.1.eh_proj.weight"));
    refit_manifest_destroy(r);
    /* pp=2: the MTP block and a tied copy of the embedding on the last stage */
    r = t_manifest(m, "megatron:pp=2,first=1,mtp=2", 0);
    assert_int_equal(count_locals(r, "mtp."), 0);
    assert_true(has_local(r, "embedding.word_embeddings.weight"));
    refit_manifest_destroy(r);
    r = t_manifest(m, "megatron:pp=2,first=1,mtp=2", 1);
    assert_true(count_locals(r, "mtp.layers.1.") > 0);
    assert_true(has_local(r, "embedding.word_embeddings.weight"));
    assert_true(has_local(r, "output_layer.weight"));
    refit_manifest_destroy(r);
    refit_model_destroy(m);
}

/* Plans executed on synthetic truth (every byte derived from its canonical
 * tensor's name and its element's global index), every destination byte
 * verified against the destination's placements (so these check coverage and
 * execution; which local tensor holds which canonical one is checked by the
 * placements asserted above, and against the real vLLM by test_vllm_mla.py). */
static void executed_plans(void **state)
{
    (void)state;
    /* Megatron with its MTP block -> vLLM's MTP draft, with and without expert parallel. */
    t_execute_pair("tiny-mtp", "megatron:tp=2,ep=2,mtp=2", "vllm:tp=2,draft=mtp,names=routed", 3);
    t_execute_pair("tiny-mtp", "megatron:tp=2,pp=2,first=1,mtp=2", "vllm:tp=4,ep=4,draft=mtp", 4);
    /* A checkpoint -> the draft; Megatron with MTP -> a whole checkpoint (every canonical tensor). */
    t_execute_pair("tiny-mtp", "hf", "vllm:tp=1,draft=mtp", 5);
    t_execute_pair("tiny-mtp", "megatron:tp=2,ep=2,pp=2,first=1,mtp=2", "hf", 6);
    /* The target is served by sources with or without MTP layers. */
    t_execute_pair("tiny-mtp", "megatron:tp=2,ep=2", "vllm:tp=2", 7);
    t_execute_pair("tiny-mtp", "megatron:tp=2,ep=2,mtp=2", "vllm:tp=2", 8);
    t_execute_pair("tiny-mtp", "dtensor:dp_shard=4", "vllm:tp=2,ep=2", 9);
}

/* Sources that hold no MTP layer cannot serve the draft: the plan names the
 * first MTP tensor nobody holds. */
static void draft_without_mtp_sources(void **state)
{
    (void)state;
    refit_model_t *m = t_model("tiny-mtp");
    const char *srcs[] = {"megatron:tp=2,ep=2", "dtensor:dp_shard=2", "megatron:pp=2,first=1,mtp=1"};
    for (size_t i = 0; i < REFIT_ARRAY_LEN(srcs); i++) {
        refit_layout_t *l = t_layout(srcs[i]);
        tool_local_set_t set;
        REFIT_ASSERT_OK(tool_local_set_create(m, l, false, 0, &set));
        refit_manifest_t *dst = t_manifest(m, "vllm:tp=2,draft=mtp", 0);
        refit_plan_t *plan = (refit_plan_t *)0x1;
        REFIT_ASSERT_ERR(refit_plan_create((const refit_manifest_t *const *)set.manifests, set.n, dst, NULL, &plan),
                         REFIT_ERR_UNCOVERED, "is held by no source");
        /* mtp=1 of 2 covers model.layers.3, not model.layers.4 */
        if (!strstr(refit_last_error(), i == 2 ? "model.layers.4." : "model.layers.3."))
            fail_msg("%s: %s", srcs[i], refit_last_error());
        assert_ptr_equal(plan, (refit_plan_t *)0x1);
        refit_manifest_destroy(dst);
        tool_local_set_destroy(&set);
        refit_layout_destroy(l);
    }
    refit_model_destroy(m);
}

/* A checkpoint directory of `model` (hf layout, zeros) at dir/model.safetensors. */
static void write_checkpoint(const char *model, const char *dir)
{
    refit_model_t *m = t_model(model);
    refit_manifest_t *hf = t_manifest(m, "hf", 0);
    uint64_t size = refit_manifest_region_size(hf, 0);
    void *arena = calloc(1, size);
    assert_non_null(arena);
    char path[512];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    const void *bases[1] = {arena};
    REFIT_ASSERT_OK(refit_safetensors_write(path, hf, bases));
    free(arena);
    refit_manifest_destroy(hf);
    refit_model_destroy(m);
}

/* Checkpoints and MTP layers: a checkpoint without them refused for a model
 * with them, naming the MTP layers; one with them serves a model without. */
static void checkpoints(void **state)
{
    (void)state;
    char root[] = "/tmp/refit-test-mtp-XXXXXX", main_only[600], with_mtp[600];
    assert_non_null(mkdtemp(root));
    snprintf(main_only, sizeof(main_only), "%s/main", root);
    snprintf(with_mtp, sizeof(with_mtp), "%s/mtp", root);
    write_checkpoint("tiny-mla", main_only);
    write_checkpoint("tiny-mtp", with_mtp);
    refit_model_t *mtp = t_model("tiny-mtp"), *mla = t_model("tiny-mla");
    refit_hf_source_t *src = NULL;
    refit_manifest_t *m = NULL;
    REFIT_ASSERT_ERR(refit_hf_source_open(main_only, mtp, &src, &m), REFIT_ERR_NOT_FOUND,
                     "model.layers.3.input_layernorm.weight of model tiny-mtp is in no shard (84 canonical tensors "
                     "missing, all of the MTP layers: a checkpoint without them needs a config with "
                     "num_nextn_predict_layers 0)");
    assert_null(m);
    REFIT_ASSERT_OK(refit_hf_source_open(with_mtp, mla, &src, &m));
    assert_int_equal(refit_manifest_num_locals(m), refit_model_num_tensors(mla));
    refit_manifest_destroy(m);
    refit_hf_source_close(src);
    REFIT_ASSERT_OK(refit_hf_source_open(with_mtp, mtp, &src, &m));
    assert_int_equal(refit_manifest_num_locals(m), refit_model_num_tensors(mtp));
    refit_manifest_destroy(m);
    refit_hf_source_close(src);
    refit_model_destroy(mla);
    refit_model_destroy(mtp);
    assert_int_equal(t_rm_tree(root), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(canonical_tensors), cmocka_unit_test(layout_strings),
        cmocka_unit_test(vllm_draft),        cmocka_unit_test(megatron_mtp),
        cmocka_unit_test(executed_plans),    cmocka_unit_test(draft_without_mtp_sources),
        cmocka_unit_test(checkpoints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
