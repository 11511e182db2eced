/* Layout strings, geometry rules, and the layout facts of docs/layouts.md checked
 * placement by placement on small models. */
#include "testutil.h"

#include <string.h>

static void parse_and_normalize(void **state)
{
    (void)state;
    struct {
        const char *in, *out;
        uint32_t world;
    } cases[] = {
        {"hf", "hf", 1},
        {"megatron:ep=8", "megatron:tp=1,pp=1,ep=8,etp=1,dp=8,pad=128", 8},
        {"megatron:tp=2,ep=4", "megatron:tp=2,pp=1,ep=4,etp=2,dp=4,pad=128", 8},
        {"megatron:tp=2,ep=2,etp=1", "megatron:tp=2,pp=1,ep=2,etp=1,dp=1,pad=128", 2},
        {"megatron:tp=4,pp=2,dp=2,pad=0", "megatron:tp=4,pp=2,ep=1,etp=4,dp=2,pad=0", 16},
        {"megatron:pp=4,ep=64,first=16", "megatron:tp=1,pp=4,ep=64,etp=1,dp=64,pad=128,first=16", 256},
        {"vllm:tp=2", "vllm:tp=2,ep=1,dp=1,pad=64", 2},
        {"vllm:tp=2,ep=8", "vllm:tp=2,ep=8,dp=4,pad=64", 8},
        {"vllm:tp=1,dp=3,ep=3", "vllm:tp=1,ep=3,dp=3,pad=64", 3},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        refit_layout_t *l = t_layout(cases[i].in);
        assert_string_equal(refit_layout_string(l), cases[i].out);
        assert_int_equal(refit_layout_world(l), cases[i].world);
        refit_layout_destroy(l);
    }
}

static void parse_errors(void **state)
{
    (void)state;
    refit_layout_t *l = NULL;
    REFIT_ASSERT_ERR(refit_layout_parse("deepspeed:tp=2", &l), REFIT_ERR_NOT_FOUND,
                     "unknown layout scheme 'deepspeed'");
    REFIT_ASSERT_ERR(refit_layout_parse("megatron:tq=2", &l), REFIT_ERR_PARSE, "unknown knob 'tq'");
    REFIT_ASSERT_ERR(refit_layout_parse("vllm:pp=2", &l), REFIT_ERR_PARSE, "unknown knob 'pp'");
    REFIT_ASSERT_ERR(refit_layout_parse("megatron:tp=0", &l), REFIT_ERR_PARSE, "tp=0");
    REFIT_ASSERT_ERR(refit_layout_parse("megatron:tp=-1", &l), REFIT_ERR_PARSE, "tp=-1");
    REFIT_ASSERT_ERR(refit_layout_parse("megatron:tp=2x", &l), REFIT_ERR_PARSE, "tp=2x");
    REFIT_ASSERT_ERR(refit_layout_parse("megatron:tp", &l), REFIT_ERR_PARSE, "not knob=value");
    REFIT_ASSERT_ERR(refit_layout_parse("megatron:tp=2,tp=4", &l), REFIT_ERR_PARSE, "given twice");
    REFIT_ASSERT_ERR(refit_layout_parse("hf:tp=2", &l), REFIT_ERR_PARSE, "hf takes no knobs");
    /* Framework rules that do not depend on the model. */
    REFIT_ASSERT_ERR(refit_layout_parse("megatron:tp=2,ep=4,dp=1", &l), REFIT_ERR_GEOMETRY,
                     "must divide tensor x data parallel");
    REFIT_ASSERT_ERR(refit_layout_parse("vllm:tp=2,ep=4,dp=1", &l), REFIT_ERR_GEOMETRY, "1 (off) or tp x dp = 2");
    REFIT_ASSERT_ERR(refit_layout_parse("vllm:tp=4,ep=2", &l), REFIT_ERR_GEOMETRY, "not 2");
    REFIT_ASSERT_ERR(refit_layout_parse("megatron:first=3", &l), REFIT_ERR_GEOMETRY, "need pp >= 2");
    assert_null(l);
}

static void geometry_against_model(void **state)
{
    (void)state;
    refit_model_t *moe = t_model("tiny-moe"), *dense = t_model("tiny-dense"), *q = t_model("qwen3-30b-a3b");
    struct {
        refit_model_t *m;
        const char *spec;
        const char *needle;
    } bad[] = {
        {moe, "megatron:tp=16", "attention heads are not divisible by tp=16"},
        {moe, "megatron:pp=3", "4 layers do not split evenly over pp=3"},
        {moe, "megatron:ep=16,dp=16", "8 experts are not divisible by ep=16"},
        {moe, "megatron:tp=2,pad=0", "vocab 997 (pad=0) is not divisible by tp=2"},
        {dense, "megatron:ep=2,dp=2", "needs a model with experts"},
        {dense, "vllm:tp=3", "attention heads are not divisible by tp=3"},
        {moe, "vllm:tp=1,dp=16,ep=16", "8 experts cannot fill ep=16"},
        {q, "megatron:pp=5", "48 layers do not split evenly over pp=5"},
        {q, "megatron:pp=4,first=21,last=20", "48 layers do not split evenly"},
        {q, "megatron:tp=64", "attention heads are not divisible by tp=64"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        refit_layout_t *l = t_layout(bad[i].spec);
        REFIT_ASSERT_ERR(refit_layout_check(l, bad[i].m), REFIT_ERR_GEOMETRY, bad[i].needle);
        refit_manifest_t *man = NULL;
        REFIT_ASSERT_ERR(refit_layout_manifest(l, bad[i].m, 0, &man), REFIT_ERR_GEOMETRY, bad[i].needle);
        assert_null(man);
        refit_layout_destroy(l);
    }
    refit_layout_t *l = t_layout("megatron:pp=4,first=12,last=12");
    REFIT_ASSERT_OK(refit_layout_check(l, q));
    refit_layout_destroy(l);
    refit_model_destroy(moe);
    refit_model_destroy(dense);
    refit_model_destroy(q);
}

/* Asserts that local tensor `local` has a placement of rows [crow, crow+n) of
 * canonical `canon` landing at local row `lrow` (in slot `lead` of a 3-d tensor). */
static void expect_rows(const refit_manifest_t *m, const char *local, const char *canon, uint64_t crow, uint64_t n,
                        uint64_t lead, uint64_t lrow)
{
    refit_placement_t p;
    if (t_find_placement(m, local, canon, crow, &p) < 0)
        fail_msg("no placement of %s row %llu in %s", canon, (unsigned long long)crow, local);
    assert_int_equal(p.extent[0], n);
    refit_tensor_info_t lt;
    refit_manifest_local(m, p.local, &lt, NULL, NULL);
    if (lt.ndim == 3) {
        assert_int_equal(p.local_offset[0], lead);
        assert_int_equal(p.local_offset[1], lrow);
    } else {
        assert_int_equal(p.local_offset[0], lrow);
    }
}

static void local_shape(const refit_manifest_t *m, const char *name, uint32_t ndim, uint64_t d0, uint64_t d1,
                        uint64_t d2)
{
    for (uint32_t i = 0; i < refit_manifest_num_locals(m); i++) {
        refit_tensor_info_t t;
        refit_manifest_local(m, i, &t, NULL, NULL);
        if (strcmp(t.name, name)) continue;
        assert_int_equal(t.ndim, ndim);
        assert_int_equal(t.shape[0], d0);
        if (ndim > 1) assert_int_equal(t.shape[1], d1);
        if (ndim > 2) assert_int_equal(t.shape[2], d2);
        return;
    }
    fail_msg("no local tensor %s", name);
}

static int has_local(const refit_manifest_t *m, const char *name)
{
    for (uint32_t i = 0; i < refit_manifest_num_locals(m); i++) {
        refit_tensor_info_t t;
        refit_manifest_local(m, i, &t, NULL, NULL);
        if (!strcmp(t.name, name)) return 1;
    }
    return 0;
}

/* tiny-dense: 8 heads, 2 kv groups, head_dim 16: a group is 4 q heads (64
 * rows) + k (16) + v (16) = 96 rows of the interleaved linear_qkv. */
static void megatron_qkv_interleaved(void **state)
{
    (void)state;
    refit_model_t *m = t_model("tiny-dense");
    const char *qkv = "decoder.layers.1.self_attention.linear_qkv.weight";
    refit_manifest_t *r0 = t_manifest(m, "megatron:tp=1", 0);
    local_shape(r0, qkv, 2, 192, 64, 0);
    expect_rows(r0, qkv, "model.layers.1.self_attn.q_proj.weight", 0, 64, 0, 0);
    expect_rows(r0, qkv, "model.layers.1.self_attn.k_proj.weight", 0, 16, 0, 64);
    expect_rows(r0, qkv, "model.layers.1.self_attn.v_proj.weight", 0, 16, 0, 80);
    expect_rows(r0, qkv, "model.layers.1.self_attn.q_proj.weight", 64, 64, 0, 96);
    expect_rows(r0, qkv, "model.layers.1.self_attn.k_proj.weight", 16, 16, 0, 160);
    expect_rows(r0, qkv, "model.layers.1.self_attn.v_proj.weight", 16, 16, 0, 176);
    refit_manifest_destroy(r0);
    /* tp=4 > 2 groups: a plain 48-row slice of the interleaved tensor; rank 1
     * holds the last 16 q rows of group 0, then its k and v. */
    refit_manifest_t *r1 = t_manifest(m, "megatron:tp=4", 1);
    local_shape(r1, qkv, 2, 48, 64, 0);
    expect_rows(r1, qkv, "model.layers.1.self_attn.q_proj.weight", 48, 16, 0, 0);
    expect_rows(r1, qkv, "model.layers.1.self_attn.k_proj.weight", 0, 16, 0, 16);
    expect_rows(r1, qkv, "model.layers.1.self_attn.v_proj.weight", 0, 16, 0, 32);
    assert_int_equal(t_find_placement(r1, qkv, "model.layers.1.self_attn.q_proj.weight", 64, NULL), -1);
    refit_manifest_destroy(r1);
    /* The input norm is fused into linear_qkv; q/k norms are Qwen3's layernorms. */
    refit_manifest_t *r = t_manifest(m, "megatron:tp=2", 1);
    expect_rows(r, "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
                "model.layers.0.input_layernorm.weight", 0, 64, 0, 0);
    expect_rows(r, "decoder.layers.0.mlp.linear_fc1.layer_norm_weight",
                "model.layers.0.post_attention_layernorm.weight", 0, 64, 0, 0);
    expect_rows(r, "decoder.layers.0.self_attention.q_layernorm.weight", "model.layers.0.self_attn.q_norm.weight", 0,
                16, 0, 0);
    /* linear_fc1 per shard is [gate shard; up shard]; fc2 and linear_proj are row parallel (column slices). */
    expect_rows(r, "decoder.layers.0.mlp.linear_fc1.weight", "model.layers.0.mlp.gate_proj.weight", 48, 48, 0, 0);
    expect_rows(r, "decoder.layers.0.mlp.linear_fc1.weight", "model.layers.0.mlp.up_proj.weight", 48, 48, 0, 48);
    refit_placement_t p;
    assert_true(t_find_placement(r, "decoder.layers.0.mlp.linear_fc2.weight", "model.layers.0.mlp.down_proj.weight", 0,
                                 &p) >= 0);
    assert_int_equal(p.canon_offset[1], 48);
    assert_int_equal(p.extent[1], 48);
    assert_int_equal(p.extent[0], 64);
    assert_true(t_find_placement(r, "decoder.layers.0.self_attention.linear_proj.weight",
                                 "model.layers.0.self_attn.o_proj.weight", 0, &p) >= 0);
    assert_int_equal(p.canon_offset[1], 64);
    assert_int_equal(p.extent[1], 64);
    refit_manifest_destroy(r);
    refit_model_destroy(m);
}

static void megatron_pipeline_and_vocab(void **state)
{
    (void)state;
    refit_model_t *m = t_model("tiny-moe");
    /* pp=2, tp=2, dp=1: ranks 0,1 stage 0 (layers 0-1), ranks 2,3 stage 1 (layers 2-3, local numbers 0-1). */
    refit_manifest_t *s1 = t_manifest(m, "megatron:tp=2,pp=2", 3);
    assert_false(has_local(s1, "embedding.word_embeddings.weight"));
    assert_true(has_local(s1, "output_layer.weight"));
    assert_true(has_local(s1, "decoder.final_layernorm.weight"));
    assert_false(has_local(s1, "decoder.layers.2.pre_mlp_layernorm.weight"));
    expect_rows(s1, "decoder.layers.0.pre_mlp_layernorm.weight", "model.layers.2.post_attention_layernorm.weight", 0,
                64, 0, 0);
    /* vocab 997 padded to a multiple of 128*2 = 1024: rank 1 of tp holds rows 512..1023, 485 real. */
    local_shape(s1, "output_layer.weight", 2, 512, 64, 0);
    expect_rows(s1, "output_layer.weight", "lm_head.weight", 512, 485, 0, 0);
    refit_manifest_destroy(s1);
    refit_manifest_t *s0 = t_manifest(m, "megatron:tp=2,pp=2", 0);
    assert_true(has_local(s0, "embedding.word_embeddings.weight"));
    assert_false(has_local(s0, "output_layer.weight"));
    local_shape(s0, "embedding.word_embeddings.weight", 2, 512, 64, 0);
    refit_manifest_destroy(s0);
    /* pad=0 (Megatron-Bridge): no padding at all. */
    refit_manifest_t *np = t_manifest(m, "megatron:pad=0", 0);
    local_shape(np, "embedding.word_embeddings.weight", 2, 997, 64, 0);
    refit_manifest_destroy(np);
    /* Uneven stages: first=1 puts layer 0 alone on stage 0, layers 1-3 on stage 1. */
    refit_manifest_t *u = t_manifest(m, "megatron:pp=2,first=1", 1);
    expect_rows(u, "decoder.layers.2.pre_mlp_layernorm.weight", "model.layers.3.post_attention_layernorm.weight", 0, 64,
                0, 0);
    refit_manifest_destroy(u);
    refit_model_destroy(m);
}

static void megatron_experts(void **state)
{
    (void)state;
    refit_model_t *m = t_model("tiny-moe"); /* 8 experts, moe_intermediate 32 */
    /* ep=4: rank 2 holds global experts 4 and 5 as local 0 and 1. */
    refit_manifest_t *r = t_manifest(m, "megatron:ep=4", 2);
    expect_rows(r, "decoder.layers.0.mlp.experts.linear_fc1.weight1", "model.layers.0.mlp.experts.5.gate_proj.weight",
                0, 32, 0, 0);
    expect_rows(r, "decoder.layers.0.mlp.experts.linear_fc1.weight1", "model.layers.0.mlp.experts.5.up_proj.weight", 0,
                32, 0, 32);
    assert_false(has_local(r, "decoder.layers.0.mlp.experts.linear_fc1.weight2"));
    expect_rows(r, "decoder.layers.0.mlp.router.weight", "model.layers.0.mlp.gate.weight", 0, 8, 0, 0);
    refit_manifest_destroy(r);
    /* tp=2, ep=2, etp=2 -> dp=2, world 4.  Rank 3: tp_rank 1, local rank 3 ->
     * etp_rank 1, ep_rank 1: experts 4..7, second half of the intermediate. */
    r = t_manifest(m, "megatron:tp=2,ep=2", 3);
    local_shape(r, "decoder.layers.0.mlp.experts.linear_fc1.weight0", 2, 32, 64, 0);
    expect_rows(r, "decoder.layers.0.mlp.experts.linear_fc1.weight0", "model.layers.0.mlp.experts.4.gate_proj.weight",
                16, 16, 0, 0);
    expect_rows(r, "decoder.layers.0.mlp.experts.linear_fc1.weight0", "model.layers.0.mlp.experts.4.up_proj.weight", 16,
                16, 0, 16);
    refit_placement_t p;
    assert_true(t_find_placement(r, "decoder.layers.0.mlp.experts.linear_fc2.weight3",
                                 "model.layers.0.mlp.experts.7.down_proj.weight", 0, &p) >= 0);
    assert_int_equal(p.canon_offset[1], 16);
    assert_int_equal(p.extent[1], 16);
    refit_manifest_destroy(r);
    /* MLA with router bias in fp32 and shared experts split over tp. */
    refit_model_t *mla = t_model("tiny-mla");
    r = t_manifest(mla, "megatron:tp=2,ep=2", 1);
    refit_tensor_info_t t;
    for (uint32_t i = 0; i < refit_manifest_num_locals(r); i++) {
        refit_manifest_local(r, i, &t, NULL, NULL);
        if (!strcmp(t.name, "decoder.layers.1.mlp.router.expert_bias")) break;
    }
    assert_string_equal(t.name, "decoder.layers.1.mlp.router.expert_bias");
    assert_int_equal(t.dtype, REFIT_DTYPE_F32);
    expect_rows(r, "decoder.layers.1.mlp.shared_experts.linear_fc1.weight",
                "model.layers.1.mlp.shared_experts.gate_proj.weight", 8, 8, 0, 0);
    expect_rows(r, "decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight",
                "model.layers.0.self_attn.q_a_layernorm.weight", 0, 32, 0, 0);
    expect_rows(r, "decoder.layers.0.self_attention.linear_kv_up_proj.weight",
                "model.layers.0.self_attn.kv_b_proj.weight", 64, 64, 0, 0);
    assert_true(has_local(r, "decoder.layers.0.mlp.linear_fc1.weight")); /* layer 0 is dense */
    assert_false(has_local(r, "decoder.layers.0.mlp.router.weight"));
    refit_manifest_destroy(r);
    refit_model_destroy(mla);
    refit_model_destroy(m);
}

static void vllm_attention(void **state)
{
    (void)state;
    refit_model_t *m = t_model("tiny-dense"); /* 8 heads, 2 kv heads */
    const char *qkv = "model.layers.0.self_attn.qkv_proj.weight";
    /* tp=2: 4 q heads and 1 kv head per rank. */
    refit_manifest_t *r = t_manifest(m, "vllm:tp=2", 1);
    local_shape(r, qkv, 2, (4 + 2) * 16, 64, 0);
    expect_rows(r, qkv, "model.layers.0.self_attn.q_proj.weight", 64, 64, 0, 0);
    expect_rows(r, qkv, "model.layers.0.self_attn.k_proj.weight", 16, 16, 0, 64);
    expect_rows(r, qkv, "model.layers.0.self_attn.v_proj.weight", 16, 16, 0, 80);
    refit_manifest_destroy(r);
    /* tp=8 > 2 kv heads: rank 5 holds q head 5 and kv head 5 / (8/2) = 1. */
    r = t_manifest(m, "vllm:tp=8", 5);
    local_shape(r, qkv, 2, 3 * 16, 64, 0);
    expect_rows(r, qkv, "model.layers.0.self_attn.q_proj.weight", 80, 16, 0, 0);
    expect_rows(r, qkv, "model.layers.0.self_attn.k_proj.weight", 16, 16, 0, 16);
    expect_rows(r, qkv, "model.layers.0.self_attn.v_proj.weight", 16, 16, 0, 32);
    expect_rows(r, "model.layers.0.mlp.gate_up_proj.weight", "model.layers.0.mlp.gate_proj.weight", 60, 12, 0, 0);
    expect_rows(r, "model.layers.0.mlp.gate_up_proj.weight", "model.layers.0.mlp.up_proj.weight", 60, 12, 0, 12);
    /* vocab 997 -> 1024 (multiple of 64), 128 rows per rank. */
    local_shape(r, "model.embed_tokens.weight", 2, 128, 64, 0);
    expect_rows(r, "model.embed_tokens.weight", "model.embed_tokens.weight", 640, 128, 0, 0);
    refit_manifest_destroy(r);
    r = t_manifest(m, "vllm:tp=8", 7);
    expect_rows(r, "lm_head.weight", "lm_head.weight", 896, 101, 0, 0);
    refit_manifest_destroy(r);
    refit_model_destroy(m);
    /* Tied embeddings: no lm_head anywhere. */
    m = t_model("tiny-tied");
    r = t_manifest(m, "vllm:tp=2", 0);
    assert_false(has_local(r, "lm_head.weight"));
    refit_manifest_destroy(r);
    r = t_manifest(m, "megatron:tp=2", 0);
    assert_false(has_local(r, "output_layer.weight"));
    refit_manifest_destroy(r);
    /* ... except Megatron's last pipeline stage, which keeps a synced copy of the embedding. */
    r = t_manifest(m, "megatron:tp=2,pp=2", 3);
    expect_rows(r, "output_layer.weight", "model.embed_tokens.weight", 512, 489, 0, 0);
    refit_manifest_destroy(r);
    refit_model_destroy(m);
}

static void vllm_experts(void **state)
{
    (void)state;
    refit_model_t *m = t_model("tiny-moe"); /* 8 experts, moe_intermediate 32 */
    /* No expert parallel: every expert on every rank, intermediate split over tp. */
    refit_manifest_t *r = t_manifest(m, "vllm:tp=4", 3);
    local_shape(r, "model.layers.0.mlp.experts.w13_weight", 3, 8, 16, 64);
    local_shape(r, "model.layers.0.mlp.experts.w2_weight", 3, 8, 64, 8);
    expect_rows(r, "model.layers.0.mlp.experts.w13_weight", "model.layers.0.mlp.experts.6.gate_proj.weight", 24, 8, 6,
                0);
    expect_rows(r, "model.layers.0.mlp.experts.w13_weight", "model.layers.0.mlp.experts.6.up_proj.weight", 24, 8, 6, 8);
    refit_manifest_destroy(r);
    /* dp=2 without expert parallel: split over tp*dp = 4. */
    r = t_manifest(m, "vllm:tp=2,dp=2", 3);
    local_shape(r, "model.layers.0.mlp.experts.w13_weight", 3, 8, 16, 64);
    expect_rows(r, "model.layers.0.mlp.experts.w13_weight", "model.layers.0.mlp.experts.0.gate_proj.weight", 24, 8, 0,
                0);
    local_shape(r, "model.layers.0.self_attn.qkv_proj.weight", 2, (4 + 2) * 16, 64, 0);
    refit_manifest_destroy(r);
    /* Expert parallel, 8 experts over 3 ranks: 3, 3, 2 (linear placement). */
    r = t_manifest(m, "vllm:tp=1,dp=3,ep=3", 1);
    local_shape(r, "model.layers.0.mlp.experts.w13_weight", 3, 3, 64, 64);
    expect_rows(r, "model.layers.0.mlp.experts.w13_weight", "model.layers.0.mlp.experts.3.gate_proj.weight", 0, 32, 0,
                0);
    expect_rows(r, "model.layers.0.mlp.experts.w13_weight", "model.layers.0.mlp.experts.5.up_proj.weight", 0, 32, 2,
                32);
    refit_manifest_destroy(r);
    r = t_manifest(m, "vllm:tp=1,dp=3,ep=3", 2);
    local_shape(r, "model.layers.0.mlp.experts.w13_weight", 3, 2, 64, 64);
    expect_rows(r, "model.layers.0.mlp.experts.w13_weight", "model.layers.0.mlp.experts.6.gate_proj.weight", 0, 32, 0,
                0);
    refit_manifest_destroy(r);
    refit_model_destroy(m);
    t_execute_pair("tiny-moe", "megatron:ep=4", "vllm:tp=1,dp=3,ep=3", 9);
    /* MLA in vllm: fused_qkv_a_proj = [q_a; kv_a_with_mqa], replicated. */
    m = t_model("tiny-mla");
    r = t_manifest(m, "vllm:tp=4", 2);
    local_shape(r, "model.layers.0.self_attn.fused_qkv_a_proj.weight", 2, 32 + 16 + 4, 64, 0);
    expect_rows(r, "model.layers.0.self_attn.fused_qkv_a_proj.weight",
                "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 0, 20, 0, 32);
    expect_rows(r, "model.layers.0.self_attn.q_b_proj.weight", "model.layers.0.self_attn.q_b_proj.weight", 48, 24, 0,
                0);
    refit_manifest_destroy(r);
    refit_model_destroy(m);
}

/* names=: vLLM 0.32 puts the routed experts under mlp.experts.routed_experts
 * (checked in the real engine by tests/python/test_vllm.py), older vLLM and
 * SGLang directly under mlp.experts; the placements are the same. */
static void vllm_expert_names(void **state)
{
    (void)state;
    refit_layout_t *l = t_layout("vllm:tp=2,ep=2,names=routed");
    assert_string_equal(refit_layout_string(l), "vllm:tp=2,ep=2,dp=1,pad=64,names=routed");
    refit_layout_destroy(l);
    l = t_layout("vllm:names=fused");
    assert_string_equal(refit_layout_string(l), "vllm:tp=1,ep=1,dp=1,pad=64"); /* the default, unchanged */
    refit_layout_destroy(l);
    refit_layout_t *bad = (refit_layout_t *)0x1;
    REFIT_ASSERT_ERR(refit_layout_parse("vllm:names=v2", &bad), REFIT_ERR_PARSE,
                     "names=v2 is neither routed (vLLM 0.32: mlp.experts.routed_experts.w13_weight) nor fused");
    assert_ptr_equal(bad, (refit_layout_t *)0x1);
    REFIT_ASSERT_ERR(refit_layout_parse("vllm:names=routed,names=fused", &bad), REFIT_ERR_PARSE, "names given twice");
    REFIT_ASSERT_ERR(refit_layout_parse("megatron:names=routed", &bad), REFIT_ERR_PARSE, "unknown knob 'names'");
    REFIT_ASSERT_ERR(refit_layout_parse("vllm:tp=2,pp=2", &bad), REFIT_ERR_PARSE, "tp, ep, dp, pad, names");

    refit_model_t *m = t_model("tiny-moe");
    refit_manifest_t *r = t_manifest(m, "vllm:tp=1,dp=3,ep=3,names=routed", 1);
    local_shape(r, "model.layers.0.mlp.experts.routed_experts.w13_weight", 3, 3, 64, 64);
    local_shape(r, "model.layers.0.mlp.experts.routed_experts.w2_weight", 3, 3, 64, 32);
    expect_rows(r, "model.layers.0.mlp.experts.routed_experts.w13_weight",
                "model.layers.0.mlp.experts.5.up_proj.weight", 0, 32, 2, 32);
    /* Only the two expert tensors per layer are renamed: everything else is the default layout's. */
    refit_manifest_t *f = t_manifest(m, "vllm:tp=1,dp=3,ep=3", 1);
    assert_int_equal(refit_manifest_num_locals(r), refit_manifest_num_locals(f));
    assert_int_equal(refit_manifest_region_size(r, 0), refit_manifest_region_size(f, 0));
    uint32_t renamed = 0;
    for (uint32_t i = 0; i < refit_manifest_num_locals(r); i++) {
        refit_tensor_info_t a, b;
        uint32_t ra, rb;
        uint64_t oa, ob;
        refit_manifest_local(r, i, &a, &ra, &oa);
        refit_manifest_local(f, i, &b, &rb, &ob);
        assert_int_equal(oa, ob);
        assert_null(strstr(a.name, ".mlp.experts.w"));
        if (strcmp(a.name, b.name) != 0) {
            assert_non_null(strstr(a.name, ".mlp.experts.routed_experts.w"));
            renamed++;
        }
    }
    assert_int_equal(renamed, 2 * 4); /* w13 and w2 of tiny-moe's four layers */
    refit_manifest_destroy(f);
    refit_manifest_destroy(r);
    refit_model_destroy(m);
    assert_int_equal(t_execute_pair("tiny-moe", "megatron:tp=2,ep=2", "vllm:tp=2,names=routed", 2), 2);
    assert_int_equal(t_execute_pair("tiny-moe", "vllm:tp=1,dp=3,ep=3,names=routed", "vllm:tp=2", 2), 2);
}

static void manifests_differ_by_rank_not_by_step(void **state)
{
    (void)state;
    refit_model_t *m = t_model("tiny-moe");
    refit_manifest_t *a = t_manifest(m, "vllm:tp=2", 0), *b = t_manifest(m, "vllm:tp=2", 0),
                     *c = t_manifest(m, "vllm:tp=2", 1);
    assert_int_equal(refit_manifest_signature(a), refit_manifest_signature(b));
    assert_int_not_equal(refit_manifest_signature(a), refit_manifest_signature(c));
    refit_manifest_destroy(a);
    refit_manifest_destroy(b);
    refit_manifest_destroy(c);
    refit_model_destroy(m);
}

/* Geometries whose products are absurd are refused at parse time, before any
 * world-sized array or per-rank manifest exists (docs/security.md: megatron:dp=65536
 * made `refit plan --all-ranks` allocate 12.5 GB; ep*etp overflowing 32 bits
 * divided by zero). */
static void geometry_limits(void **state)
{
    (void)state;
    struct {
        const char *spec;
        const char *needle;
    } bad[] = {
        {"megatron:dp=65536", "dp=65536 is above refit's limit of 16384"},
        {"megatron:ep=65536,etp=65536,dp=1", "ep=65536 is above refit's limit of 16384"},
        {"megatron:tp=1025", "tp=1025 is above refit's limit of 1024"},
        {"megatron:pp=1025", "pp=1025 is above refit's limit of 1024"},
        {"megatron:etp=2048", "etp=2048 is above refit's limit of 1024"},
        {"vllm:dp=16385", "dp=16385 is above refit's limit of 16384"},
        {"vllm:tp=4294967296", "tp=4294967296 is above refit's limit of 1024"},
        {"megatron:tp=1024,pp=1024", "1048576 ranks (tp 1024 x pp 1024 x dp 1) is above refit's limit of 16384"},
        {"megatron:tp=8,pp=16,dp=256", "32768 ranks (tp 8 x pp 16 x dp 256) is above refit's limit of 16384"},
        {"vllm:tp=128,dp=256", "32768 ranks (tp 128 x pp 1 x dp 256) is above refit's limit of 16384"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        refit_layout_t *l = (refit_layout_t *)&l;
        refit_status_t st = refit_layout_parse(bad[i].spec, &l);
        if (st != REFIT_ERR_GEOMETRY || !strstr(refit_last_error(), bad[i].needle))
            fail_msg("%s: %s \"%s\", want REFIT_ERR_GEOMETRY \"%s\"", bad[i].spec, refit_status_name(st),
                     refit_last_error(), bad[i].needle);
        assert_ptr_equal(l, (refit_layout_t *)&l);
    }
    /* At the limits: Llama-3.1-405B's 16,384-GPU pretraining layout, a 16,384-rank
     * vLLM expert-parallel fleet, and every knob at its own limit. */
    struct {
        const char *spec;
        uint32_t world;
    } good[] = {
        {"megatron:tp=8,pp=16,dp=128", 16384},
        {"vllm:tp=128,dp=128,ep=16384", 16384},
        {"megatron:tp=1024,pp=16", 16384},
        {"megatron:pp=1024,dp=16", 16384},
        {"megatron:tp=16,etp=1024,ep=16,dp=1024", 16384},
        {"megatron:dp=16384,ep=16384,etp=1", 16384},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        refit_layout_t *l = t_layout(good[i].spec);
        assert_int_equal(refit_layout_world(l), good[i].world);
        refit_layout_destroy(l);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parse_and_normalize),
        cmocka_unit_test(parse_errors),
        cmocka_unit_test(geometry_against_model),
        cmocka_unit_test(megatron_qkv_interleaved),
        cmocka_unit_test(megatron_pipeline_and_vocab),
        cmocka_unit_test(megatron_experts),
        cmocka_unit_test(vllm_attention),
        cmocka_unit_test(vllm_experts),
        cmocka_unit_test(manifests_differ_by_rank_not_by_step),
        cmocka_unit_test(geometry_limits),
        cmocka_unit_test(vllm_expert_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
