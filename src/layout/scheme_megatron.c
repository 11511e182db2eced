/* The megatron scheme: Megatron-Core with the Transformer Engine layer spec.
 *
 * Rank r of tp*pp*dp: tp_rank = r % tp, dp_rank = (r / tp) % dp,
 * pp_rank = r / (tp*dp).  Inside a stage the experts regroup the tp*dp ranks
 * as etp_rank + etp*(ep_rank + ep*edp_rank).  Layer numbers are local to the
 * stage.  Facts (docs/layouts.md has the sources):
 *  - linear_qkv rows are interleaved by query group ([q of the group's heads;
 *    k; v] per group) and each TP rank holds a plain 1/tp row slice of that
 *    global tensor, so whole groups when tp <= groups and half groups
 *    otherwise; its layer_norm_weight is the input norm;
 *  - linear_fc1 is [gate shard; up shard] per TP shard, and its
 *    layer_norm_weight is the post-attention norm (dense layers); MoE layers
 *    carry pre_mlp_layernorm instead;
 *  - TE grouped experts linear_fc1.weight{j}/linear_fc2.weight{j}, j local,
 *    global expert ep_rank*E/ep + j, intermediate split over etp;
 *  - vocabulary padded to a multiple of pad*tp (pad=0: none), padded rows at
 *    the global end; output_layer on the last stage unless tied;
 *  - mtp=N (Megatron-Core's mtp_num_layers; megatron-core 0.16.1,
 *    transformer/multi_token_prediction.py): MultiTokenPredictionBlock
 *    `mtp` on the last stage, layer i (canonical model.layers.{L+i}) holding
 *    enorm / hnorm (norms of the embedding and of the hidden state),
 *    eh_proj [H/tp, 2H] (column parallel over [embedding; hidden]), the
 *    decoder layer as transformer_layer.* (the decoder's names) and
 *    final_layernorm (shared_head.norm); the embedding and output layer are
 *    the main model's, and with pp > 1 the last stage keeps its own tied
 *    copy of the embedding (embedding.word_embeddings.weight). */
#include <stdio.h>

#include "layout/layout.h"

#define RULE(cond, ...)                                                   \
    do {                                                                  \
        if (!(cond)) return refit_error(REFIT_ERR_GEOMETRY, __VA_ARGS__); \
    } while (0)

static uint64_t padded_vocab(const refit_layout_t *l, const refit_model_spec_t *s)
{
    return l->pad ? refit_round_up(s->vocab, (uint64_t)l->pad * l->tp) : s->vocab;
}

/* Layers [*start, *start + *count) of a pipeline stage.  first= and last=
 * fix the first and last stages' counts (Megatron-Core's
 * num_layers_in_first/last_pipeline_stage); the other stages split the rest
 * evenly.  Returns false if they cannot. */
static bool stage_layers(const refit_layout_t *l, uint32_t layers, uint32_t stage, uint32_t *start, uint32_t *count)
{
    uint32_t pp = l->pp, fixed = 0, even = pp;
    if (l->first) fixed += l->first, even--;
    if (l->last) fixed += l->last, even--;
    if (fixed > layers || (even == 0 && fixed != layers)) return false;
    uint32_t rest = layers - fixed;
    if (even && rest % even) return false;
    uint32_t per = even ? rest / even : 0, pos = 0;
    for (uint32_t k = 0; k <= stage; k++) {
        uint32_t n = (k == 0 && l->first) ? l->first : (k == pp - 1 && l->last) ? l->last : per;
        if (k == stage) {
            *start = pos;
            *count = n;
        }
        pos += n;
    }
    return true;
}

refit_status_t refit_scheme_megatron_check(const refit_layout_t *l, const refit_model_spec_t *s)
{
    uint32_t a, n;
    RULE(stage_layers(l, s->layers, 0, &a, &n),
         "%s: %u layers do not split evenly over pp=%u pipeline stages (set first= and/or last= to the layers of "
         "the first/last stage, as Megatron-Core's num_layers_in_first/last_pipeline_stage)",
         l->str, s->layers, l->pp);
    RULE(s->heads % l->tp == 0, "%s: %u attention heads are not divisible by tp=%u", l->str, s->heads, l->tp);
    if (s->arch != REFIT_ARCH_MLA)
        RULE(s->kv_heads % l->tp == 0 || l->tp % s->kv_heads == 0,
             "%s: %u query groups and tp=%u: one must divide the other", l->str, s->kv_heads, l->tp);
    if (s->experts == 0 || s->first_dense > 0)
        RULE(s->intermediate % l->tp == 0, "%s: intermediate_size %u is not divisible by tp=%u", l->str,
             s->intermediate, l->tp);
    if (s->experts) {
        RULE(s->experts % l->ep == 0, "%s: %u experts are not divisible by ep=%u", l->str, s->experts, l->ep);
        RULE(s->moe_intermediate % l->etp == 0, "%s: moe_intermediate_size %u is not divisible by etp=%u", l->str,
             s->moe_intermediate, l->etp);
        RULE((uint64_t)s->shared_experts * s->moe_intermediate % l->tp == 0,
             "%s: the shared experts' width %u is not divisible by tp=%u", l->str,
             s->shared_experts * s->moe_intermediate, l->tp);
    } else {
        RULE(l->ep == 1, "%s: ep=%u needs a model with experts; %s is dense", l->str, l->ep, s->name);
    }
    RULE(padded_vocab(l, s) % l->tp == 0, "%s: vocab %u (pad=%u) is not divisible by tp=%u", l->str, s->vocab, l->pad,
         l->tp);
    RULE(l->mtp <= s->mtp_layers, "%s: mtp=%u MTP layers, but model %s has %u (num_nextn_predict_layers)", l->str,
         l->mtp, s->name, s->mtp_layers);
    if (l->mtp)
        RULE(s->hidden % l->tp == 0, "%s: hidden_size %u is not divisible by tp=%u (the MTP eh_proj)", l->str,
             s->hidden, l->tp);
    return REFIT_OK;
}

/* Rows of a TP shard of a column-parallel weight whose rows are [gate; up]
 * per shard: shard k of n holds gate rows k*I/n.. then up rows k*I/n... */
static void gate_up_shard(refit_lbuild_t *b, uint32_t local, uint64_t lead, const char *gate, const char *up,
                          uint64_t width, uint32_t k, uint32_t n)
{
    uint64_t w = width / n;
    refit_lb_rows(b, local, lead, 0, gate, k * w, w);
    refit_lb_rows(b, local, lead, w, up, k * w, w);
}

static void attention_gqa(refit_lbuild_t *b, const refit_model_spec_t *s, const char *lp, const char *cp, uint32_t tp,
                          uint32_t t)
{
    const uint64_t H = s->hidden, hd = s->head_dim, G = s->kv_heads, qpg = s->heads / G;
    const uint64_t rows = (s->heads + 2 * G) * hd, per = rows / tp;
    char name[256];
    snprintf(name, sizeof(name), "%s.input_layernorm.weight", cp);
    uint32_t ln = refit_lb_local(b, 0, 1, (uint64_t[]){H}, "%sself_attention.linear_qkv.layer_norm_weight", lp);
    refit_lb_rows(b, ln, 0, 0, name, 0, H);
    /* The global interleaved tensor, one segment per (group, q|k|v). */
    refit_fused_seg_t *segs = malloc(3 * G * sizeof(*segs));
    if (!segs) {
        if (!b->st) b->st = refit_error(REFIT_ERR_NO_MEMORY, "qkv segments");
        return;
    }
    for (uint64_t g = 0; g < G; g++) {
        uint64_t f = g * (qpg + 2) * hd;
        segs[3 * g] = (refit_fused_seg_t){"", g * qpg * hd, f, qpg * hd};
        segs[3 * g + 1] = (refit_fused_seg_t){"", g * hd, f + qpg * hd, hd};
        segs[3 * g + 2] = (refit_fused_seg_t){"", g * hd, f + (qpg + 1) * hd, hd};
        snprintf(segs[3 * g].canon, sizeof(segs[0].canon), "%s.self_attn.q_proj.weight", cp);
        snprintf(segs[3 * g + 1].canon, sizeof(segs[0].canon), "%s.self_attn.k_proj.weight", cp);
        snprintf(segs[3 * g + 2].canon, sizeof(segs[0].canon), "%s.self_attn.v_proj.weight", cp);
    }
    uint32_t qkv = refit_lb_local(b, 0, 2, (uint64_t[]){per, H}, "%sself_attention.linear_qkv.weight", lp);
    refit_lb_fused_rows(b, qkv, segs, 3 * G, t * per, (t + 1) * per);
    free(segs);
    if (s->qk_norm) {
        uint32_t q = refit_lb_local(b, 0, 1, (uint64_t[]){hd}, "%sself_attention.q_layernorm.weight", lp);
        snprintf(name, sizeof(name), "%s.self_attn.q_norm.weight", cp);
        refit_lb_rows(b, q, 0, 0, name, 0, hd);
        uint32_t k = refit_lb_local(b, 0, 1, (uint64_t[]){hd}, "%sself_attention.k_layernorm.weight", lp);
        snprintf(name, sizeof(name), "%s.self_attn.k_norm.weight", cp);
        refit_lb_rows(b, k, 0, 0, name, 0, hd);
    }
    uint64_t cols = s->heads * hd / tp;
    uint32_t o = refit_lb_local(b, 0, 2, (uint64_t[]){H, cols}, "%sself_attention.linear_proj.weight", lp);
    snprintf(name, sizeof(name), "%s.self_attn.o_proj.weight", cp);
    refit_lb_cols(b, o, 0, name, t * cols, cols);
}

static void attention_mla(refit_lbuild_t *b, const refit_model_spec_t *s, const char *lp, const char *cp, uint32_t tp,
                          uint32_t t)
{
    const uint64_t H = s->hidden, qk = s->qk_nope_dim + s->qk_rope_dim;
    char name[256];
#define WHOLE_AS(local_suffix, canon_suffix)                     \
    do {                                                         \
        char ln_[256];                                           \
        snprintf(ln_, sizeof(ln_), "%s%s", lp, local_suffix);    \
        snprintf(name, sizeof(name), "%s.%s", cp, canon_suffix); \
        refit_lb_whole(b, ln_, name);                            \
    } while (0)
    WHOLE_AS("input_layernorm.weight", "input_layernorm.weight");
    WHOLE_AS("self_attention.linear_q_down_proj.weight", "self_attn.q_a_proj.weight");
    WHOLE_AS("self_attention.linear_q_up_proj.layer_norm_weight", "self_attn.q_a_layernorm.weight");
    uint64_t qrows = s->heads * qk / tp;
    uint32_t qu = refit_lb_local(b, 0, 2, (uint64_t[]){qrows, s->q_lora_rank},
                                 "%sself_attention.linear_q_up_proj.weight", lp);
    snprintf(name, sizeof(name), "%s.self_attn.q_b_proj.weight", cp);
    refit_lb_rows(b, qu, 0, 0, name, t * qrows, qrows);
    WHOLE_AS("self_attention.linear_kv_down_proj.weight", "self_attn.kv_a_proj_with_mqa.weight");
    WHOLE_AS("self_attention.linear_kv_up_proj.layer_norm_weight", "self_attn.kv_a_layernorm.weight");
    uint64_t kvrows = s->heads * (s->qk_nope_dim + s->v_head_dim) / tp;
    uint32_t kvu = refit_lb_local(b, 0, 2, (uint64_t[]){kvrows, s->kv_lora_rank},
                                  "%sself_attention.linear_kv_up_proj.weight", lp);
    snprintf(name, sizeof(name), "%s.self_attn.kv_b_proj.weight", cp);
    refit_lb_rows(b, kvu, 0, 0, name, t * kvrows, kvrows);
    uint64_t cols = s->heads * s->v_head_dim / tp;
    uint32_t o = refit_lb_local(b, 0, 2, (uint64_t[]){H, cols}, "%sself_attention.linear_proj.weight", lp);
    snprintf(name, sizeof(name), "%s.self_attn.o_proj.weight", cp);
    refit_lb_cols(b, o, 0, name, t * cols, cols);
#undef WHOLE_AS
}

static void mlp_dense(refit_lbuild_t *b, const refit_model_spec_t *s, const char *lp, const char *cp, uint32_t tp,
                      uint32_t t)
{
    const uint64_t H = s->hidden, I = s->intermediate;
    char gate[256], up[256], down[256], norm[256];
    snprintf(norm, sizeof(norm), "%s.post_attention_layernorm.weight", cp);
    uint32_t ln = refit_lb_local(b, 0, 1, (uint64_t[]){H}, "%smlp.linear_fc1.layer_norm_weight", lp);
    refit_lb_rows(b, ln, 0, 0, norm, 0, H);
    snprintf(gate, sizeof(gate), "%s.mlp.gate_proj.weight", cp);
    snprintf(up, sizeof(up), "%s.mlp.up_proj.weight", cp);
    snprintf(down, sizeof(down), "%s.mlp.down_proj.weight", cp);
    uint32_t fc1 = refit_lb_local(b, 0, 2, (uint64_t[]){2 * I / tp, H}, "%smlp.linear_fc1.weight", lp);
    gate_up_shard(b, fc1, 0, gate, up, I, t, tp);
    uint32_t fc2 = refit_lb_local(b, 0, 2, (uint64_t[]){H, I / tp}, "%smlp.linear_fc2.weight", lp);
    refit_lb_cols(b, fc2, 0, down, t * (I / tp), I / tp);
}

static void mlp_moe(refit_lbuild_t *b, const refit_model_spec_t *s, const refit_layout_t *l, const char *lp,
                    const char *cp, uint32_t t, uint32_t local_rank)
{
    const uint64_t H = s->hidden, E = s->experts, Im = s->moe_intermediate;
    const uint32_t etp_rank = local_rank % l->etp, ep_rank = (local_rank / l->etp) % l->ep;
    const uint64_t per = E / l->ep, w = Im / l->etp;
    char gate[256], up[256], down[256], name[256];
    snprintf(name, sizeof(name), "%s.post_attention_layernorm.weight", cp);
    uint32_t ln = refit_lb_local(b, 0, 1, (uint64_t[]){H}, "%spre_mlp_layernorm.weight", lp);
    refit_lb_rows(b, ln, 0, 0, name, 0, H);
    uint32_t router = refit_lb_local(b, 0, 2, (uint64_t[]){E, H}, "%smlp.router.weight", lp);
    snprintf(name, sizeof(name), "%s.mlp.gate.weight", cp);
    refit_lb_rows(b, router, 0, 0, name, 0, E);
    if (s->router_bias) {
        uint32_t bias = refit_lb_local(b, REFIT_DTYPE_F32, 1, (uint64_t[]){E}, "%smlp.router.expert_bias", lp);
        snprintf(name, sizeof(name), "%s.mlp.gate.e_score_correction_bias", cp);
        refit_lb_rows(b, bias, 0, 0, name, 0, E);
    }
    for (uint64_t j = 0; j < per; j++) {
        uint64_t e = ep_rank * per + j;
        snprintf(gate, sizeof(gate), "%s.mlp.experts.%llu.gate_proj.weight", cp, (unsigned long long)e);
        snprintf(up, sizeof(up), "%s.mlp.experts.%llu.up_proj.weight", cp, (unsigned long long)e);
        uint32_t fc1 = refit_lb_local(b, 0, 2, (uint64_t[]){2 * w, H}, "%smlp.experts.linear_fc1.weight%llu", lp,
                                      (unsigned long long)j);
        gate_up_shard(b, fc1, 0, gate, up, Im, etp_rank, l->etp);
    }
    for (uint64_t j = 0; j < per; j++) {
        uint64_t e = ep_rank * per + j;
        snprintf(down, sizeof(down), "%s.mlp.experts.%llu.down_proj.weight", cp, (unsigned long long)e);
        uint32_t fc2 = refit_lb_local(b, 0, 2, (uint64_t[]){H, w}, "%smlp.experts.linear_fc2.weight%llu", lp,
                                      (unsigned long long)j);
        refit_lb_cols(b, fc2, 0, down, etp_rank * w, w);
    }
    if (s->shared_experts) {
        const uint64_t Is = (uint64_t)s->shared_experts * Im;
        snprintf(gate, sizeof(gate), "%s.mlp.shared_experts.gate_proj.weight", cp);
        snprintf(up, sizeof(up), "%s.mlp.shared_experts.up_proj.weight", cp);
        snprintf(down, sizeof(down), "%s.mlp.shared_experts.down_proj.weight", cp);
        uint32_t fc1 = refit_lb_local(b, 0, 2, (uint64_t[]){2 * Is / l->tp, H},
                                      "%smlp.shared_experts.linear_fc1.weight", lp);
        gate_up_shard(b, fc1, 0, gate, up, Is, t, l->tp);
        uint32_t fc2 = refit_lb_local(b, 0, 2, (uint64_t[]){H, Is / l->tp}, "%smlp.shared_experts.linear_fc2.weight",
                                      lp);
        refit_lb_cols(b, fc2, 0, down, t * (Is / l->tp), Is / l->tp);
    }
}

static void vocab_shard(refit_lbuild_t *b, const refit_model_spec_t *s, uint64_t vp, uint32_t tp, uint32_t t,
                        const char *local, const char *canon)
{
    uint64_t per = vp / tp, lo = t * per;
    uint32_t id = refit_lb_local(b, 0, 2, (uint64_t[]){per, s->hidden}, "%s", local);
    if (lo < s->vocab) refit_lb_rows(b, id, 0, 0, canon, lo, REFIT_MIN(per, s->vocab - lo));
}

/* MTP layer i (megatron-core's mtp.layers.{i}), canonical model.layers.{L+i}. */
static void mtp_layer(refit_lbuild_t *b, const refit_model_spec_t *s, const refit_layout_t *l, uint32_t i, uint32_t t,
                      uint32_t local_rank)
{
    const uint32_t layer = s->layers + i;
    const uint64_t H = s->hidden, rows = H / l->tp;
    char lp[64], tl[96], cp[64], name[256], local[256];
    snprintf(lp, sizeof(lp), "mtp.layers.%u.", i);
    snprintf(tl, sizeof(tl), "%stransformer_layer.", lp);
    snprintf(cp, sizeof(cp), "model.layers.%u", layer);
    static const char *const norms[][2] = {{"enorm.weight", "enorm.weight"},
                                           {"hnorm.weight", "hnorm.weight"},
                                           {"final_layernorm.weight", "shared_head.norm.weight"}};
    for (size_t k = 0; k < REFIT_ARRAY_LEN(norms); k++) {
        snprintf(local, sizeof(local), "%s%s", lp, norms[k][0]);
        snprintf(name, sizeof(name), "%s.%s", cp, norms[k][1]);
        refit_lb_whole(b, local, name);
    }
    uint32_t eh = refit_lb_local(b, 0, 2, (uint64_t[]){rows, 2 * H}, "%seh_proj.weight", lp);
    snprintf(name, sizeof(name), "%s.eh_proj.weight", cp);
    refit_lb_rows(b, eh, 0, 0, name, t * rows, rows);
    if (s->arch == REFIT_ARCH_MLA) attention_mla(b, s, tl, cp, l->tp, t);
    else attention_gqa(b, s, tl, cp, l->tp, t);
    if (refit_spec_layer_is_moe(s, layer)) mlp_moe(b, s, l, tl, cp, t, local_rank);
    else mlp_dense(b, s, tl, cp, l->tp, t);
}

refit_status_t refit_scheme_megatron(refit_lbuild_t *b, const refit_layout_t *l, uint32_t rank)
{
    const refit_model_spec_t *s = &b->model->spec;
    const uint32_t t = rank % l->tp, stage = rank / (l->tp * l->dp), local_rank = rank % (l->tp * l->dp);
    uint32_t first_layer = 0, nlayers = 0;
    stage_layers(l, s->layers, stage, &first_layer, &nlayers);
    const uint64_t vp = padded_vocab(l, s);
    if (stage == 0) vocab_shard(b, s, vp, l->tp, t, "embedding.word_embeddings.weight", "model.embed_tokens.weight");
    for (uint32_t i = 0; i < nlayers && !b->st; i++) {
        uint32_t layer = first_layer + i;
        char lp[64], cp[64];
        snprintf(lp, sizeof(lp), "decoder.layers.%u.", i);
        snprintf(cp, sizeof(cp), "model.layers.%u", layer);
        if (s->arch == REFIT_ARCH_MLA) attention_mla(b, s, lp, cp, l->tp, t);
        else attention_gqa(b, s, lp, cp, l->tp, t);
        if (refit_spec_layer_is_moe(s, layer)) mlp_moe(b, s, l, lp, cp, t, local_rank);
        else mlp_dense(b, s, lp, cp, l->tp, t);
    }
    if (stage == l->pp - 1) {
        refit_lb_whole(b, "decoder.final_layernorm.weight", "model.norm.weight");
        if (!s->tie) vocab_shard(b, s, vp, l->tp, t, "output_layer.weight", "lm_head.weight");
        /* Tied and pipelined: the last stage keeps its own copy of the
         * embedding as output_layer (synced by Megatron after each step). */
        else if (l->pp > 1) vocab_shard(b, s, vp, l->tp, t, "output_layer.weight", "model.embed_tokens.weight");
        /* The MTP stage needs the embedding: a tied copy when it is not stage 0. */
        if (l->mtp && l->pp > 1)
            vocab_shard(b, s, vp, l->tp, t, "embedding.word_embeddings.weight", "model.embed_tokens.weight");
        for (uint32_t i = 0; i < l->mtp && !b->st; i++) mtp_layer(b, s, l, i, t, local_rank);
    }
    return b->st;
}
