/* The dtensor scheme: a transformers model whose parameters are DTensors
 * sharded by torch's FSDP2 (fully_shard), optionally over a tensor-parallel
 * mesh dimension and with HSDP's replicate dimension.
 *
 * Mesh (dp_replicate, dp_shard, tp), row-major as init_device_mesh makes it:
 * rank = t + tp*(f + dp_shard*r).  Names are the model's own parameter names
 * (transformers 5: routed experts fused as mlp.experts.gate_up_proj [E, 2I, H]
 * = per expert [gate; up] and mlp.experts.down_proj [E, H, I]; experts=split:
 * transformers 4's mlp.experts.{e}.{gate,up,down}_proj.weight).
 *
 * Placements, from torch 2.13's own code:
 *  - tp (transformers' base_model_tp_plan and the causal LM's _tp_plan):
 *    q/k/v/gate/up_proj and lm_head colwise = Shard(0); o/down_proj rowwise =
 *    Shard(1); everything else Replicate.
 *  - dp_shard: FSDP2's default Shard(0) on the TP-local tensor
 *    (_fsdp_param.py _init_sharded_param: _chunk_with_empty of the local
 *    tensor).  Over a colwise TP shard the DTensor placement is
 *    _StridedShard(0, split_factor=tp): rank (f, t) holds chunk f of TP chunk
 *    t, a contiguous row range, which is what is placed here.
 *  - dp_replicate: Replicate.
 *  - chunks are torch.chunk's: ceil(N/n) rows each, the last short, trailing
 *    ones empty (placement_types.py Shard.local_shard_size_and_offset).
 * Each local tensor is FSDP2's padded sharded storage
 * (FSDPParam._sharded_param_data viewed as padded_sharded_param_size: every
 * rank ceil(N/n) rows); only its first rows (to_local()) are placed, so an
 * empty chunk is a local tensor with no placement.
 * Refused by name: experts or MLA attention under tp > 1, tied embeddings
 * under tp > 1, a TP chunk that is empty. */
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
    if (!strcmp(kv, "ep") || !strcmp(kv, "cp") || !strcmp(kv, "pp"))
        return refit_error(REFIT_ERR_UNSUPPORTED,
                           "layout '%s': dtensor has no %s mesh dimension (expert, context and pipeline parallel "
                           "meshes are not described; dtensor takes dp_shard, dp_replicate, tp, experts)",
                           spec, kv);
    return refit_error(REFIT_ERR_PARSE,
                       "layout '%s': unknown knob '%s' (dtensor takes dp_shard, dp_replicate, tp, experts)", spec, kv);
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
    l->pp = l->ep = l->etp = 1;
    l->pad = l->first = l->last = 0;
    l->names = REFIT_VLLM_NAMES_FUSED;
    snprintf(l->str, sizeof(l->str), "dtensor:dp_shard=%u,dp_replicate=%u,tp=%u,experts=%s", l->dp, l->rep, l->tp,
             l->fused ? "fused" : "split");
    return REFIT_OK;
}

refit_status_t refit_scheme_dtensor_check(const refit_layout_t *l, const refit_model_spec_t *s)
{
    if (l->tp == 1) return REFIT_OK;
    if (s->experts)
        return refit_error(
            REFIT_ERR_UNSUPPORTED,
            "%s: %s has experts; expert tensors under tp > 1 (transformers' packed_colwise gate_up_proj, "
            "expert parallel meshes) are not described by the dtensor scheme (use tp=1)",
            l->str, s->name);
    if (s->arch == REFIT_ARCH_MLA)
        return refit_error(REFIT_ERR_UNSUPPORTED, "%s: MLA attention under tp > 1 is not described by dtensor", l->str);
    if (s->tie)
        return refit_error(REFIT_ERR_UNSUPPORTED,
                           "%s: %s ties its embeddings: one parameter that transformers' tp plan replicates as "
                           "embed_tokens and shards colwise as lm_head; dtensor refuses tied embeddings under tp > 1",
                           l->str, s->name);
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

static tp_style_t tp_style(const char *name)
{
    static const char *const col[] = {".q_proj.weight",  ".k_proj.weight", ".v_proj.weight", ".gate_proj.weight",
                                      ".up_proj.weight", ".q_proj.bias",   ".k_proj.bias",   ".v_proj.bias"};
    if (!strcmp(name, "lm_head.weight")) return TP_COLWISE;
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
    tp_style_t st = l->tp > 1 ? tp_style(t->name) : TP_REPLICATE;
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

/* Transformers 5's fused experts of one layer, Shard(0) over the experts. */
static void fused_experts(refit_lbuild_t *b, const refit_layout_t *l, uint32_t layer, uint32_t fr)
{
    const refit_model_spec_t *s = &b->model->spec;
    const uint64_t E = s->experts, I = s->moe_intermediate, H = s->hidden, P = (E + l->dp - 1) / l->dp;
    uint64_t off, len;
    chunk(E, l->dp, fr, &off, &len);
    char pre[64], canon[128];
    snprintf(pre, sizeof(pre), "model.layers.%u.mlp.experts", layer);
    uint32_t gu = refit_lb_local(b, 0, 3, (uint64_t[]){P, 2 * I, H}, "%s.gate_up_proj", pre);
    uint32_t dn = refit_lb_local(b, 0, 3, (uint64_t[]){P, H, I}, "%s.down_proj", pre);
    for (uint64_t j = 0; j < len && !b->st; j++) {
        unsigned long long e = off + j;
        snprintf(canon, sizeof(canon), "%s.%llu.gate_proj.weight", pre, e);
        refit_lb_rows(b, gu, j, 0, canon, 0, I);
        snprintf(canon, sizeof(canon), "%s.%llu.up_proj.weight", pre, e);
        refit_lb_rows(b, gu, j, I, canon, 0, I);
        snprintf(canon, sizeof(canon), "%s.%llu.down_proj.weight", pre, e);
        refit_lb_rows(b, dn, j, 0, canon, 0, H);
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
            if (refit_spec_layer_is_moe(&m->spec, layer)) fused_experts(b, l, layer, fr);
    return b->st;
}
