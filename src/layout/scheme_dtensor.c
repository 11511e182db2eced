/* The dtensor scheme: a transformers model whose parameters are DTensors
 * sharded by torch's FSDP2 (fully_shard), optionally over a tensor-parallel
 * mesh dimension, with HSDP's replicate dimension, or with the routed experts
 * on an expert-parallel mesh.
 *
 * Mesh (dp_replicate, dp_shard, tp), row-major as init_device_mesh makes it:
 * rank = t + tp*(f + dp_shard*r).  Names are the model's own parameter names
 * (transformers 5: routed experts fused as mlp.experts.gate_up_proj [E, 2I, H]
 * = per expert [gate; up] and mlp.experts.down_proj [E, H, I]; experts=split:
 * transformers 4's mlp.experts.{e}.{gate,up,down}_proj.weight).
 *
 * Placements, from torch 2.13's and transformers 5.19's own code:
 *  - tp (transformers' base_model_tp_plan and the causal LM's _tp_plan):
 *    q/k/v/gate/up_proj and lm_head colwise = Shard(0); o/down_proj rowwise =
 *    Shard(1); with tied embeddings the config adds embed_tokens
 *    "embedding_rowwise" (configuration_utils.py), Shard(0) of the one tied
 *    parameter, so it is placed as colwise; fused experts: gate_up_proj
 *    "packed_colwise" = _StridedShard(1, split_factor=2) (rank t holds gate
 *    chunk t then up chunk t), down_proj rowwise = Shard(2); everything else
 *    (norms, the router mlp.gate) Replicate.
 *  - dp_shard: FSDP2's default Shard(0) on the TP-local tensor
 *    (_fsdp_param.py _init_sharded_param: _chunk_with_empty of the local
 *    tensor).  Over a colwise TP shard the DTensor placement is
 *    _StridedShard(0, split_factor=tp): rank (f, t) holds chunk f of TP chunk
 *    t, a contiguous row range, which is what is placed here.
 *  - dp_replicate: Replicate.
 *  - ep (transformers' base_model_ep_plan, "grouped_gemm"): the fused experts
 *    Shard(0) over an expert mesh (efsdp, ep) = (dp_shard*tp/ep, ep),
 *    row-major over the same ranks (distributed/utils.py
 *    initialize_distributed_mesh): rank = e + ep*g; FSDP2 shards the EP-local
 *    experts over efsdp, _StridedShard(0, split_factor=ep): rank (g, e) holds
 *    chunk g of EP chunk e, a contiguous range of whole experts.  The EP plan
 *    replaces the TP rules of the experts (resolve_parallel_plans).
 *  - chunks are torch.chunk's: ceil(N/n) rows each, the last short, trailing
 *    ones empty (placement_types.py Shard.local_shard_size_and_offset).
 * Each local tensor is FSDP2's padded sharded storage
 * (FSDPParam._sharded_param_data viewed as padded_sharded_param_size: every
 * rank ceil(N/n) rows); only its first rows (to_local()) are placed, so an
 * empty chunk is a local tensor with no placement.
 * Refused by name: split experts or MLA attention under tp > 1, ep with split
 * experts, with dp_replicate, with experts that do not divide by ep or with
 * no experts, an ep that does not divide dp_shard*tp, a TP chunk that is
 * empty. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/layout.h"

static refit_status_t parse_count(const char *spec, const char *key, const char *val, uint32_t max, uint32_t *slot)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(val, &end, 10);
    bool digits = end != val && !*end && val[0] != '-';
    if (digits && (errno == ERANGE || v > max))
        return refit_error(REFIT_ERR_GEOMETRY, "layout '%s': %s=%s is above refit's limit of %u", spec, key, val, max);
    if (errno || !digits || v == 0)
        return refit_error(REFIT_ERR_PARSE, "layout '%s': %s=%s is not a positive integer", spec, key, val);
    if (*slot != UINT32_MAX) return refit_error(REFIT_ERR_PARSE, "layout '%s': %s given twice", spec, key);
    *slot = (uint32_t)v;
    return REFIT_OK;
}

static refit_status_t parse_knob(refit_layout_t *l, const char *spec, char *kv)
{
    char *eq = strchr(kv, '=');
    if (!eq) return refit_error(REFIT_ERR_PARSE, "layout '%s': '%s' is not knob=value", spec, kv);
    *eq = '\0';
    const char *v = eq + 1;
    if (!strcmp(kv, "dp_shard")) return parse_count(spec, kv, v, REFIT_LAYOUT_MAX_DP, &l->dp);
    if (!strcmp(kv, "dp_replicate")) return parse_count(spec, kv, v, REFIT_LAYOUT_MAX_DP, &l->rep);
    if (!strcmp(kv, "tp")) return parse_count(spec, kv, v, REFIT_LAYOUT_MAX_TP, &l->tp);
    if (!strcmp(kv, "experts")) {
        uint32_t f = !strcmp(v, "fused") ? 1 : !strcmp(v, "split") ? 0 : UINT32_MAX;
        if (f == UINT32_MAX)
            return refit_error(
                REFIT_ERR_PARSE,
                "layout '%s': experts=%s is neither fused (transformers 5: mlp.experts.gate_up_proj) nor "
                "split (transformers 4: mlp.experts.{e}.gate_proj.weight)",
                spec, v);
        if (l->fused != UINT32_MAX) return refit_error(REFIT_ERR_PARSE, "layout '%s': experts given twice", spec);
        l->fused = f;
        return REFIT_OK;
    }
    if (!strcmp(kv, "ep")) return parse_count(spec, kv, v, REFIT_LAYOUT_MAX_EP, &l->ep);
    if (!strcmp(kv, "cp") || !strcmp(kv, "pp"))
        return refit_error(REFIT_ERR_UNSUPPORTED,
                           "layout '%s': dtensor has no %s mesh dimension (context and pipeline parallel meshes are "
                           "not described; dtensor takes dp_shard, dp_replicate, tp, ep, experts)",
                           spec, kv);
    return refit_error(REFIT_ERR_PARSE,
                       "layout '%s': unknown knob '%s' (dtensor takes dp_shard, dp_replicate, tp, ep, experts)", spec,
                       kv);
}

refit_status_t refit_scheme_dtensor_parse(refit_layout_t *l, const char *spec, const char *args)
{
    char buf[256];
    refit_status_t st;
    if (strlen(args) >= sizeof(buf)) return refit_error(REFIT_ERR_PARSE, "layout '%s' is too long", spec);
    strcpy(buf, args);
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save))
        if ((st = parse_knob(l, spec, kv))) return st;
    if (l->dp == UINT32_MAX) l->dp = 1;
    if (l->rep == UINT32_MAX) l->rep = 1;
    if (l->tp == UINT32_MAX) l->tp = 1;
    if (l->fused == UINT32_MAX) l->fused = 1;
    if (l->ep == UINT32_MAX) l->ep = 1;
    l->pp = l->etp = 1;
    l->pad = l->first = l->last = 0;
    l->names = REFIT_VLLM_NAMES_FUSED;
    if (l->ep > 1) {
        /* transformers' expert mesh (distributed/utils.py): (pp, efsdp, ep) over the ranks of (pp, fsdp, tp), so
         * efsdp = fsdp*tp/ep; it has no replicate dimension, and only the fused experts have an EP plan. */
        if (l->rep > 1)
            return refit_error(REFIT_ERR_UNSUPPORTED,
                               "layout '%s': ep=%u with dp_replicate=%u is not described (transformers' expert mesh "
                               "(efsdp, ep) has no replicate dimension)",
                               spec, l->ep, l->rep);
        if (!l->fused)
            return refit_error(REFIT_ERR_UNSUPPORTED,
                               "layout '%s': ep=%u with experts=split is not described (expert parallel is "
                               "transformers 5's plan for its fused 3-d experts)",
                               spec, l->ep);
        if ((uint64_t)l->dp * l->tp % l->ep)
            return refit_error(REFIT_ERR_GEOMETRY,
                               "layout '%s': ep=%u does not divide dp_shard x tp = %llu (the expert mesh is "
                               "(dp_shard*tp/ep, ep) over the same ranks)",
                               spec, l->ep, (unsigned long long)l->dp * l->tp);
    }
    int n = snprintf(l->str, sizeof(l->str), "dtensor:dp_shard=%u,dp_replicate=%u,tp=%u", l->dp, l->rep, l->tp);
    if (l->ep > 1) n += snprintf(l->str + n, sizeof(l->str) - (size_t)n, ",ep=%u", l->ep);
    snprintf(l->str + n, sizeof(l->str) - (size_t)n, ",experts=%s", l->fused ? "fused" : "split");
    return REFIT_OK;
}

refit_status_t refit_scheme_dtensor_check(const refit_layout_t *l, const refit_model_spec_t *s)
{
    if (l->ep > 1 && !s->experts)
        return refit_error(REFIT_ERR_UNSUPPORTED, "%s: ep=%u, but %s has no experts", l->str, l->ep, s->name);
    if (l->ep > 1 && s->experts % l->ep)
        return refit_error(REFIT_ERR_UNSUPPORTED,
                           "%s: %u experts do not split evenly over ep=%u (transformers' grouped_gemm refuses it: "
                           "MoEParamShard \"Cannot evenly shard\")",
                           l->str, s->experts, l->ep);
    if (l->tp == 1) return REFIT_OK;
    if (s->experts && !l->fused)
        return refit_error(REFIT_ERR_UNSUPPORTED,
                           "%s: %s's experts as transformers 4's separate modules (experts=split) under tp > 1 are "
                           "not described (transformers 5's fused experts are: experts=fused)",
                           l->str, s->name);
    if (s->arch == REFIT_ARCH_MLA)
        return refit_error(REFIT_ERR_UNSUPPORTED, "%s: MLA attention under tp > 1 is not described by dtensor", l->str);
    return REFIT_OK;
}

/* torch.chunk's rule: chunk k of n over N rows. */
static void chunk(uint64_t N, uint64_t n, uint64_t k, uint64_t *off, uint64_t *len)
{
    uint64_t c = (N + n - 1) / n, a = k * c;
    *off = a < N ? a : N;
    *len = a < N ? REFIT_MIN(c, N - a) : 0;
}

typedef enum { TP_REPLICATE, TP_COLWISE, TP_ROWWISE } tp_style_t;

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static tp_style_t tp_style(const char *name, bool tie)
{
    static const char *const col[] = {".q_proj.weight",  ".k_proj.weight", ".v_proj.weight", ".gate_proj.weight",
                                      ".up_proj.weight", ".q_proj.bias",   ".k_proj.bias",   ".v_proj.bias"};
    if (!strcmp(name, "lm_head.weight")) return TP_COLWISE;
    /* transformers 5.19 adds embed_tokens "embedding_rowwise" (Shard(0) of an Embedding) to the plan of a tied
     * config, so the one parameter is vocab-parallel like lm_head; untied, embed_tokens has no rule. */
    if (tie && !strcmp(name, "model.embed_tokens.weight")) return TP_COLWISE;
    for (size_t i = 0; i < REFIT_ARRAY_LEN(col); i++)
        if (ends_with(name, col[i])) return TP_COLWISE;
    if (ends_with(name, ".o_proj.weight") || ends_with(name, ".down_proj.weight")) return TP_ROWWISE;
    return TP_REPLICATE;
}

/* One parameter that is not a fused expert: TP box, then FSDP's dim-0 chunk
 * of the TP-local tensor, into a padded local tensor of the same name. */
static void param(refit_lbuild_t *b, const refit_layout_t *l, const refit_tensor_info_t *t, uint32_t tr, uint32_t fr)
{
    uint64_t coff[REFIT_MAX_DIMS] = {0}, ext[REFIT_MAX_DIMS], lshape[REFIT_MAX_DIMS];
    for (uint32_t d = 0; d < t->ndim; d++) ext[d] = t->shape[d];
    tp_style_t st = l->tp > 1 ? tp_style(t->name, b->model->spec.tie) : TP_REPLICATE;
    uint32_t tdim = st == TP_COLWISE ? 0 : 1;
    if (st != TP_REPLICATE) {
        if (tdim >= t->ndim) {
            b->st = refit_error(REFIT_ERR_UNSUPPORTED, "%s: %s has %u dims, its tp style shards dim %u", l->str,
                                t->name, t->ndim, tdim);
            return;
        }
        chunk(t->shape[tdim], l->tp, tr, &coff[tdim], &ext[tdim]);
        if (ext[tdim] == 0) {
            b->st = refit_error(REFIT_ERR_UNSUPPORTED,
                                "%s: tp rank %u's chunk of %s (dim %u of %llu over tp=%u) is empty; FSDP2 over an "
                                "empty TP shard is not described",
                                l->str, tr, t->name, tdim, (unsigned long long)t->shape[tdim], l->tp);
            return;
        }
    }
    memcpy(lshape, ext, sizeof(lshape));
    uint64_t n0 = ext[0], foff, flen;
    chunk(n0, l->dp, fr, &foff, &flen);
    lshape[0] = (n0 + l->dp - 1) / l->dp; /* FSDP2 pads every rank to chunk 0's size */
    uint32_t id = refit_lb_local(b, t->dtype, t->ndim, lshape, "%s", t->name);
    if (b->st || flen == 0) return;
    coff[0] += foff;
    ext[0] = flen;
    uint64_t loff[REFIT_MAX_DIMS] = {0};
    refit_lb_box(b, id, t->name, coff, ext, loff);
}

/* Transformers 5's fused experts of one layer.  Whole experts per rank: FSDP2's
 * Shard(0) over the experts (ep = 1), or chunk g of EP chunk e (ep > 1).
 * Under tp > 1 (ep = 1) each rank holds the intermediate chunk t of every
 * expert it holds: gate_up_proj [P, 2*It, H] = [gate rows; up rows] of that
 * chunk (packed_colwise), down_proj [P, H, It] its columns (rowwise). */
static void fused_experts(refit_lbuild_t *b, const refit_layout_t *l, uint32_t layer, uint32_t rank)
{
    const refit_model_spec_t *s = &b->model->spec;
    const uint64_t E = s->experts, I = s->moe_intermediate, H = s->hidden;
    uint64_t off, len, P, ioff = 0, ilen = I;
    if (l->ep > 1) {
        const uint32_t e = rank % l->ep, g = rank / l->ep, efsdp = l->dp * l->tp / l->ep;
        uint64_t eo, el;
        chunk(E, l->ep, e, &eo, &el);
        chunk(el, efsdp, g, &off, &len);
        off += eo;
        P = (el + efsdp - 1) / efsdp;
    } else {
        chunk(E, l->dp, (rank / l->tp) % l->dp, &off, &len);
        P = (E + l->dp - 1) / l->dp;
        if (l->tp > 1) chunk(I, l->tp, rank % l->tp, &ioff, &ilen);
    }
    char pre[64], canon[128];
    snprintf(pre, sizeof(pre), "model.layers.%u.mlp.experts", layer);
    if (ilen == 0) {
        b->st = refit_error(REFIT_ERR_UNSUPPORTED,
                            "%s: tp rank %u's chunk of %s (moe_intermediate_size %llu over tp=%u) is empty; FSDP2 over "
                            "an empty TP shard is not described",
                            l->str, rank % l->tp, pre, (unsigned long long)I, l->tp);
        return;
    }
    uint32_t gu = refit_lb_local(b, 0, 3, (uint64_t[]){P, 2 * ilen, H}, "%s.gate_up_proj", pre);
    uint32_t dn = refit_lb_local(b, 0, 3, (uint64_t[]){P, H, ilen}, "%s.down_proj", pre);
    for (uint64_t j = 0; j < len && !b->st; j++) {
        unsigned long long e = off + j;
        snprintf(canon, sizeof(canon), "%s.%llu.gate_proj.weight", pre, e);
        refit_lb_rows(b, gu, j, 0, canon, ioff, ilen);
        snprintf(canon, sizeof(canon), "%s.%llu.up_proj.weight", pre, e);
        refit_lb_rows(b, gu, j, ilen, canon, ioff, ilen);
        snprintf(canon, sizeof(canon), "%s.%llu.down_proj.weight", pre, e);
        refit_lb_box(b, dn, canon, (uint64_t[]){0, ioff}, (uint64_t[]){H, ilen}, (uint64_t[]){j, 0, 0});
    }
}

static bool is_routed_expert(const char *name) { return strstr(name, ".mlp.experts.") != NULL; }

refit_status_t refit_scheme_dtensor(refit_lbuild_t *b, const refit_layout_t *l, uint32_t rank)
{
    const refit_model_t *m = b->model;
    const uint32_t tr = rank % l->tp, fr = (rank / l->tp) % l->dp;
    for (size_t i = 0; i < m->tensors.len && !b->st; i++) {
        refit_tensor_info_t t;
        refit_model_tensor(m, i, &t);
        if (refit_model_tensor_is_mtp(m, i)) continue; /* transformers' models hold no MTP layers */
        if (l->fused && is_routed_expert(t.name)) continue;
        param(b, l, &t, tr, fr);
    }
    if (l->fused)
        for (uint32_t layer = 0; layer < m->spec.layers && !b->st; layer++)
            if (refit_spec_layer_is_moe(&m->spec, layer)) fused_experts(b, l, layer, rank);
    return b->st;
}
