/* The vllm scheme: vLLM's parameter layout.
 *
 * Rank r of tp*dp: tp_rank = r % tp.  Attention and dense MLPs are split over
 * tp and replicated over dp.  Facts (docs/layouts.md has the sources):
 *  - qkv_proj per rank is [q of its heads; k of its kv heads; v of them];
 *    when tp > kv heads, rank t holds kv head t / (tp / kv) (replicated);
 *  - gate_up_proj per rank is [gate shard; up shard];
 *  - experts: w13_weight [E_local, 2*I_shard, H] ([gate; up] per expert) and
 *    w2_weight [E_local, H, I_shard], under mlp.experts.routed_experts. in
 *    vLLM 0.32 (names=routed) and mlp.experts. before (names=fused, the
 *    default, also SGLang's).  These are the loader's layout: kernels may
 *    rewrite them after loading (python/refit/vllm/postload.py deals with
 *    that).  Expert parallel (ep = tp*dp): rank r holds experts
 *    r*base + min(r, E%ep) .., base = E/ep, the first E%ep ranks one more,
 *    unsplit.  Otherwise every rank holds every expert, split over tp*dp;
 *  - vocabulary padded to a multiple of pad (64), split evenly, padding rows
 *    at the global end; lm_head absent when tied;
 *  - MLA: fused_qkv_a_proj = [q_a_proj; kv_a_proj_with_mqa] replicated,
 *    q_b_proj / kv_b_proj column parallel, o_proj row parallel, shared
 *    experts TP-split even with expert parallel;
 *  - draft=mtp: vLLM's DeepSeek MTP draft model (DeepSeekMTP,
 *    model_executor/models/deepseek_mtp.py of vLLM 0.32) holds, per MTP
 *    layer N, model.layers.N.{enorm,hnorm,shared_head.norm}.weight, the
 *    replicated eh_proj.weight [H, 2H] (a plain torch Linear, not split over
 *    tp) and the decoder layer under model.layers.N.mtp_block. with the
 *    target's fusions and splits; its embed_tokens and shared_head.head are
 *    the target's modules (shared by vLLM at load), so not in this layout. */
#include <stdio.h>

#include "layout/layout.h"

#define RULE(cond, ...)                                                   \
    do {                                                                  \
        if (!(cond)) return refit_error(REFIT_ERR_GEOMETRY, __VA_ARGS__); \
    } while (0)

static uint64_t padded_vocab(const refit_layout_t *l, const refit_model_spec_t *s)
{
    return l->pad ? refit_round_up(s->vocab, l->pad) : s->vocab;
}

refit_status_t refit_scheme_vllm_check(const refit_layout_t *l, const refit_model_spec_t *s)
{
    RULE(s->heads % l->tp == 0, "%s: %u attention heads are not divisible by tp=%u", l->str, s->heads, l->tp);
    if (s->arch != REFIT_ARCH_MLA)
        RULE(s->kv_heads % l->tp == 0 || l->tp % s->kv_heads == 0,
             "%s: %u kv heads and tp=%u: one must divide the other", l->str, s->kv_heads, l->tp);
    if (s->experts == 0 || s->first_dense > 0)
        RULE(s->intermediate % l->tp == 0, "%s: intermediate_size %u is not divisible by tp=%u", l->str,
             s->intermediate, l->tp);
    if (s->experts) {
        if (l->ep > 1) RULE(s->experts >= l->ep, "%s: %u experts cannot fill ep=%u ranks", l->str, s->experts, l->ep);
        else
            RULE(s->moe_intermediate % (l->tp * l->dp) == 0,
                 "%s: without expert parallel, moe_intermediate_size %u must be divisible by tp x dp = %u", l->str,
                 s->moe_intermediate, l->tp * l->dp);
        RULE((uint64_t)s->shared_experts * s->moe_intermediate % l->tp == 0,
             "%s: the shared experts' width %u is not divisible by tp=%u", l->str,
             s->shared_experts * s->moe_intermediate, l->tp);
    } else {
        RULE(l->ep == 1, "%s: ep=%u needs a model with experts; %s is dense", l->str, l->ep, s->name);
    }
    RULE(l->pp == 1, "%s: pipeline parallel is not supported for vllm layouts", l->str);
    RULE(l->draft != REFIT_VLLM_DRAFT_MTP || s->mtp_layers > 0,
         "%s: model %s has no MTP layer (num_nextn_predict_layers is 0): there is no MTP draft to describe", l->str,
         s->name);
    RULE(padded_vocab(l, s) % l->tp == 0, "%s: vocab %u padded to %llu is not divisible by tp=%u", l->str, s->vocab,
         (unsigned long long)padded_vocab(l, s), l->tp);
    return REFIT_OK;
}

/* Local names are lp + suffix, canonical names cp + suffix (lp != cp for the
 * decoder layer of an MTP draft: model.layers.N.mtp_block.*). */
static void whole(refit_lbuild_t *b, const char *lp, const char *cp, const char *suffix)
{
    char ln[256], cn[256];
    snprintf(ln, sizeof(ln), "%s.%s", lp, suffix);
    snprintf(cn, sizeof(cn), "%s.%s", cp, suffix);
    refit_lb_whole(b, ln, cn);
}

static void attention_gqa(refit_lbuild_t *b, const refit_model_spec_t *s, const char *lp, const char *cp, uint32_t tp,
                          uint32_t t)
{
    const uint64_t H = s->hidden, hd = s->head_dim, qh = s->heads / tp;
    const uint64_t kvh = s->kv_heads >= tp ? s->kv_heads / tp : 1;
    const uint64_t kv0 = s->kv_heads >= tp ? t * kvh : t / (tp / s->kv_heads);
    char name[256];
    uint32_t qkv = refit_lb_local(b, 0, 2, (uint64_t[]){(qh + 2 * kvh) * hd, H}, "%s.self_attn.qkv_proj.weight", lp);
    snprintf(name, sizeof(name), "%s.self_attn.q_proj.weight", cp);
    refit_lb_rows(b, qkv, 0, 0, name, t * qh * hd, qh * hd);
    snprintf(name, sizeof(name), "%s.self_attn.k_proj.weight", cp);
    refit_lb_rows(b, qkv, 0, qh * hd, name, kv0 * hd, kvh * hd);
    snprintf(name, sizeof(name), "%s.self_attn.v_proj.weight", cp);
    refit_lb_rows(b, qkv, 0, (qh + kvh) * hd, name, kv0 * hd, kvh * hd);
    uint64_t cols = s->heads * hd / tp;
    uint32_t o = refit_lb_local(b, 0, 2, (uint64_t[]){H, cols}, "%s.self_attn.o_proj.weight", lp);
    snprintf(name, sizeof(name), "%s.self_attn.o_proj.weight", cp);
    refit_lb_cols(b, o, 0, name, t * cols, cols);
    if (s->qk_norm) {
        whole(b, lp, cp, "self_attn.q_norm.weight");
        whole(b, lp, cp, "self_attn.k_norm.weight");
    }
}

static void attention_mla(refit_lbuild_t *b, const refit_model_spec_t *s, const char *lp, const char *cp, uint32_t tp,
                          uint32_t t)
{
    const uint64_t H = s->hidden, qk = s->qk_nope_dim + s->qk_rope_dim;
    char name[256];
    uint32_t fa = refit_lb_local(b, 0, 2, (uint64_t[]){s->q_lora_rank + s->kv_lora_rank + s->qk_rope_dim, H},
                                 "%s.self_attn.fused_qkv_a_proj.weight", lp);
    snprintf(name, sizeof(name), "%s.self_attn.q_a_proj.weight", cp);
    refit_lb_rows(b, fa, 0, 0, name, 0, s->q_lora_rank);
    snprintf(name, sizeof(name), "%s.self_attn.kv_a_proj_with_mqa.weight", cp);
    refit_lb_rows(b, fa, 0, s->q_lora_rank, name, 0, s->kv_lora_rank + s->qk_rope_dim);
    whole(b, lp, cp, "self_attn.q_a_layernorm.weight");
    whole(b, lp, cp, "self_attn.kv_a_layernorm.weight");
    uint64_t qrows = s->heads * qk / tp, kvrows = s->heads * (s->qk_nope_dim + s->v_head_dim) / tp;
    uint32_t qb = refit_lb_local(b, 0, 2, (uint64_t[]){qrows, s->q_lora_rank}, "%s.self_attn.q_b_proj.weight", lp);
    snprintf(name, sizeof(name), "%s.self_attn.q_b_proj.weight", cp);
    refit_lb_rows(b, qb, 0, 0, name, t * qrows, qrows);
    uint32_t kvb = refit_lb_local(b, 0, 2, (uint64_t[]){kvrows, s->kv_lora_rank}, "%s.self_attn.kv_b_proj.weight", lp);
    snprintf(name, sizeof(name), "%s.self_attn.kv_b_proj.weight", cp);
    refit_lb_rows(b, kvb, 0, 0, name, t * kvrows, kvrows);
    uint64_t cols = s->heads * s->v_head_dim / tp;
    uint32_t o = refit_lb_local(b, 0, 2, (uint64_t[]){H, cols}, "%s.self_attn.o_proj.weight", lp);
    snprintf(name, sizeof(name), "%s.self_attn.o_proj.weight", cp);
    refit_lb_cols(b, o, 0, name, t * cols, cols);
}

/* gate_up_proj + down_proj of a TP-split gated MLP (dense or shared experts). */
static void gated_mlp(refit_lbuild_t *b, const refit_model_spec_t *s, const char *lp, const char *cp, const char *what,
                      uint64_t I, uint32_t tp, uint32_t t)
{
    char gate[256], up[256], down[256];
    const uint64_t w = I / tp;
    snprintf(gate, sizeof(gate), "%s.%s.gate_proj.weight", cp, what);
    snprintf(up, sizeof(up), "%s.%s.up_proj.weight", cp, what);
    snprintf(down, sizeof(down), "%s.%s.down_proj.weight", cp, what);
    uint32_t gu = refit_lb_local(b, 0, 2, (uint64_t[]){2 * w, s->hidden}, "%s.%s.gate_up_proj.weight", lp, what);
    refit_lb_rows(b, gu, 0, 0, gate, t * w, w);
    refit_lb_rows(b, gu, 0, w, up, t * w, w);
    uint32_t dn = refit_lb_local(b, 0, 2, (uint64_t[]){s->hidden, w}, "%s.%s.down_proj.weight", lp, what);
    refit_lb_cols(b, dn, 0, down, t * w, w);
}

static void mlp_moe(refit_lbuild_t *b, const refit_model_spec_t *s, const refit_layout_t *l, const char *lp,
                    const char *cp, uint32_t rank, uint32_t t)
{
    const uint64_t H = s->hidden, E = s->experts, Im = s->moe_intermediate;
    uint64_t e0, ne, shard, nshards;
    if (l->ep > 1) {
        uint64_t base = E / l->ep, rem = E % l->ep;
        e0 = rank * base + REFIT_MIN(rank, rem);
        ne = base + (rank < rem ? 1 : 0);
        shard = 0;
        nshards = 1;
    } else {
        e0 = 0;
        ne = E;
        shard = rank;
        nshards = (uint64_t)l->tp * l->dp;
    }
    const uint64_t w = Im / nshards;
    char gate[256], up[256], down[256];
    whole(b, lp, cp, "mlp.gate.weight");
    if (s->router_bias) whole(b, lp, cp, "mlp.gate.e_score_correction_bias");
    const char *ex = l->names == REFIT_VLLM_NAMES_ROUTED ? "mlp.experts.routed_experts" : "mlp.experts";
    uint32_t w13 = refit_lb_local(b, 0, 3, (uint64_t[]){ne, 2 * w, H}, "%s.%s.w13_weight", lp, ex);
    uint32_t w2 = refit_lb_local(b, 0, 3, (uint64_t[]){ne, H, w}, "%s.%s.w2_weight", lp, ex);
    for (uint64_t j = 0; j < ne && !b->st; j++) {
        unsigned long long e = (unsigned long long)(e0 + j);
        snprintf(gate, sizeof(gate), "%s.mlp.experts.%llu.gate_proj.weight", cp, e);
        snprintf(up, sizeof(up), "%s.mlp.experts.%llu.up_proj.weight", cp, e);
        snprintf(down, sizeof(down), "%s.mlp.experts.%llu.down_proj.weight", cp, e);
        refit_lb_rows(b, w13, j, 0, gate, shard * w, w);
        refit_lb_rows(b, w13, j, w, up, shard * w, w);
        refit_lb_cols(b, w2, j, down, shard * w, w);
    }
    if (s->shared_experts) gated_mlp(b, s, lp, cp, "mlp.shared_experts", (uint64_t)s->shared_experts * Im, l->tp, t);
}

/* One decoder layer (global index `layer`): local names under lp, canonical
 * names under cp. */
static void decoder_layer(refit_lbuild_t *b, const refit_layout_t *l, uint32_t layer, const char *lp, const char *cp,
                          uint32_t rank, uint32_t t)
{
    const refit_model_spec_t *s = &b->model->spec;
    whole(b, lp, cp, "input_layernorm.weight");
    if (s->arch == REFIT_ARCH_MLA) attention_mla(b, s, lp, cp, l->tp, t);
    else attention_gqa(b, s, lp, cp, l->tp, t);
    whole(b, lp, cp, "post_attention_layernorm.weight");
    if (refit_spec_layer_is_moe(s, layer)) mlp_moe(b, s, l, lp, cp, rank, t);
    else gated_mlp(b, s, lp, cp, "mlp", s->intermediate, l->tp, t);
}

static void vocab_shard(refit_lbuild_t *b, const refit_model_spec_t *s, uint64_t vp, uint32_t tp, uint32_t t,
                        const char *name)
{
    uint64_t per = vp / tp, lo = t * per;
    uint32_t id = refit_lb_local(b, 0, 2, (uint64_t[]){per, s->hidden}, "%s", name);
    if (lo < s->vocab) refit_lb_rows(b, id, 0, 0, name, lo, REFIT_MIN(per, s->vocab - lo));
}

/* vLLM's DeepSeekMTP draft: per MTP layer the tensors around the decoder
 * layer, then the decoder layer under mtp_block. */
static refit_status_t mtp_draft(refit_lbuild_t *b, const refit_layout_t *l, uint32_t rank, uint32_t t)
{
    const refit_model_spec_t *s = &b->model->spec;
    for (uint32_t i = 0; i < s->mtp_layers && !b->st; i++) {
        const uint32_t layer = s->layers + i;
        char cp[64], lp[80];
        snprintf(cp, sizeof(cp), "model.layers.%u", layer);
        snprintf(lp, sizeof(lp), "%s.mtp_block", cp);
        whole(b, cp, cp, "enorm.weight");
        whole(b, cp, cp, "hnorm.weight");
        whole(b, cp, cp, "eh_proj.weight");
        whole(b, cp, cp, "shared_head.norm.weight");
        decoder_layer(b, l, layer, lp, cp, rank, t);
    }
    return b->st;
}

refit_status_t refit_scheme_vllm(refit_lbuild_t *b, const refit_layout_t *l, uint32_t rank)
{
    const refit_model_spec_t *s = &b->model->spec;
    const uint32_t t = rank % l->tp;
    if (l->draft == REFIT_VLLM_DRAFT_MTP) return mtp_draft(b, l, rank, t);
    const uint64_t vp = padded_vocab(l, s);
    vocab_shard(b, s, vp, l->tp, t, "model.embed_tokens.weight");
    for (uint32_t layer = 0; layer < s->layers && !b->st; layer++) {
        char p[64];
        snprintf(p, sizeof(p), "model.layers.%u", layer);
        decoder_layer(b, l, layer, p, p, rank, t);
    }
    refit_lb_whole(b, "model.norm.weight", "model.norm.weight");
    if (!s->tie) vocab_shard(b, s, vp, l->tp, t, "lm_head.weight");
    return b->st;
}
