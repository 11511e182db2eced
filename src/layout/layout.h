/* Internal: parsed layouts and the helpers scheme files use to emit local
 * tensors and placements into a manifest. */
#ifndef REFIT_LAYOUT_INTERNAL_H
#define REFIT_LAYOUT_INTERNAL_H

#include "layout/manifest.h"
#include "model/model.h"
#include "refit/layout.h"

typedef enum {
    REFIT_SCHEME_HF = 1,
    REFIT_SCHEME_MEGATRON = 2,
    REFIT_SCHEME_VLLM = 3,
    REFIT_SCHEME_DTENSOR = 4
} refit_scheme_t;

struct refit_layout {
    refit_scheme_t scheme;
    uint32_t tp, pp, ep, etp, dp, pad;
    uint32_t first, last; /* megatron: layers of the first / last pipeline stage (0: even split) */
    uint32_t names;       /* vllm: REFIT_VLLM_NAMES_* (expert parameter names of the vLLM version) */
    uint32_t mtp;         /* megatron: MTP layers the trainer holds (mtp.layers.*, last stage); 0: none */
    uint32_t draft;       /* vllm: REFIT_VLLM_DRAFT_* (the target model, or the MTP draft model) */
    uint32_t rep;         /* dtensor: dp_replicate (HSDP's replicate mesh dim); dp is dp_shard */
    uint32_t fused;       /* dtensor: experts as transformers 5's fused 3-d mlp.experts.gate_up_proj / down_proj */
    uint32_t world;
    char str[160];
};

/* vllm names=: the routed experts' parameters are mlp.experts.w13_weight /
 * w2_weight (fused, vLLM before the MoE runner refactor; SGLang) or
 * mlp.experts.routed_experts.w13_weight / w2_weight (routed, vLLM 0.32). */
enum { REFIT_VLLM_NAMES_FUSED = 0, REFIT_VLLM_NAMES_ROUTED = 1 };

/* vllm draft=: the layout of the target model (none, the default: the main
 * layers, as vLLM's model runner holds them) or of vLLM's DeepSeek MTP draft
 * model (draft=mtp: the MTP layers only, as DeepSeekMTP names them, with the
 * target's tensor parallel split). */
enum { REFIT_VLLM_DRAFT_NONE = 0, REFIT_VLLM_DRAFT_MTP = 1 };

#define REFIT_LAYOUT_ALIGN 256

/* Emits local tensors packed into region 0 and placements onto canonical
 * tensors of the model.  Errors are sticky: after the first failure every
 * call is a no-op and `st` holds the status. */
typedef struct {
    refit_manifest_t *m;
    const refit_model_t *model;
    uint64_t cursor; /* next free byte of region 0 */
    refit_status_t st;
} refit_lbuild_t;

/* Declares a local tensor of the model's dtype (or `dtype` if not INVALID);
 * returns its id, or UINT32_MAX after an error. */
uint32_t refit_lb_local(refit_lbuild_t *b, refit_dtype_t dtype, uint32_t ndim, const uint64_t *shape, const char *fmt,
                        ...) REFIT_PRINTF(5, 6);
/* Places rows [crow, crow+nrows) of canonical tensor `canon` (all of its other
 * dims) at row `lrow` of local tensor `local`; for a 3-d local tensor the
 * rows land in slot `lead` of dim 0 (pass 0 otherwise). */
void refit_lb_rows(refit_lbuild_t *b, uint32_t local, uint64_t lead, uint64_t lrow, const char *canon, uint64_t crow,
                   uint64_t nrows);
/* Places columns [ccol, ccol+ncols) of 2-d canonical `canon` (all rows) at
 * column 0 of `local` (slot `lead` of dim 0 for a 3-d local tensor). */
void refit_lb_cols(refit_lbuild_t *b, uint32_t local, uint64_t lead, const char *canon, uint64_t ccol, uint64_t ncols);
/* Places the box [coff, coff+ext) of canonical `canon` at `loff` of `local`
 * (offsets and extents in the canonical's dims; loff in the local's). */
void refit_lb_box(refit_lbuild_t *b, uint32_t local, const char *canon, const uint64_t *coff, const uint64_t *ext,
                  const uint64_t *loff);
/* A whole canonical tensor as its own local tensor named `local_name`. */
void refit_lb_whole(refit_lbuild_t *b, const char *local_name, const char *canon);

/* One contiguous run of rows of a fused (concatenated or interleaved) tensor. */
typedef struct {
    char canon[200];
    uint64_t crow; /* first row in the canonical tensor */
    uint64_t frow; /* first row in the fused global tensor */
    uint64_t nrows;
} refit_fused_seg_t;
/* Places the rows [lo, hi) of a fused global tensor, described by segments,
 * at local rows starting from 0. */
void refit_lb_fused_rows(refit_lbuild_t *b, uint32_t local, const refit_fused_seg_t *segs, size_t nsegs, uint64_t lo,
                         uint64_t hi);

uint64_t refit_round_up(uint64_t x, uint64_t m);

refit_status_t refit_scheme_hf(refit_lbuild_t *b, const refit_layout_t *l, uint32_t rank);
refit_status_t refit_scheme_megatron(refit_lbuild_t *b, const refit_layout_t *l, uint32_t rank);
refit_status_t refit_scheme_vllm(refit_lbuild_t *b, const refit_layout_t *l, uint32_t rank);
refit_status_t refit_scheme_dtensor(refit_lbuild_t *b, const refit_layout_t *l, uint32_t rank);
/* Parses the knobs of "dtensor:..." (args: what follows the colon, may be
 * empty) into l and writes its normalized string. */
refit_status_t refit_scheme_dtensor_parse(refit_layout_t *l, const char *spec, const char *args);
refit_status_t refit_scheme_dtensor_check(const refit_layout_t *l, const refit_model_spec_t *s);
refit_status_t refit_scheme_megatron_check(const refit_layout_t *l, const refit_model_spec_t *s);
refit_status_t refit_scheme_vllm_check(const refit_layout_t *l, const refit_model_spec_t *s);

#endif
