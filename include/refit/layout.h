/*
 * refit/layout.h - layout schemes and geometries.
 *
 * A layout string names a scheme and its geometry:
 *   "hf"                                  one rank holding every canonical tensor
 *   "megatron:tp=T,pp=P,ep=E,etp=X,dp=D,pad=N"
 *                                         Megatron-Core (Transformer Engine spec)
 *   "vllm:tp=T,ep=E,dp=D,pad=N"           vLLM
 *   "dtensor:dp_shard=F,dp_replicate=R,tp=T,experts=fused|split"
 *                                         PyTorch FSDP2 (fully_shard) DTensors, HSDP and
 *                                         FSDP over TP, transformers parameter names
 * Omitted knobs take defaults: tp=pp=ep=1; megatron etp=tp, dp = the least
 * value for which ep*etp divides tp*dp, pad=128 (vocab padded to a multiple of
 * pad*tp as Megatron-LM does; pad=0 for none, as Megatron-Bridge); vllm dp=1,
 * pad=64 (vocab padded to a multiple of 64).  docs/layouts.md spells out every
 * tensor of every scheme, the rank order, and what is covered.
 *
 * Rank order.  megatron: rank = tp_rank + tp*(dp_rank + dp*pp_rank); inside a
 * pipeline stage, experts regroup the tp*dp ranks as
 * etp_rank + etp*(ep_rank + ep*edp_rank).  vllm: rank = tp_rank + tp*dp_rank;
 * with expert parallel (ep = tp*dp) the expert rank is the rank.
 */
#ifndef REFIT_LAYOUT_H
#define REFIT_LAYOUT_H

#include "refit/manifest.h"
#include "refit/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct refit_layout refit_layout_t;

/* Limits on geometries, checked by refit_layout_parse before anything is
 * allocated: a world of W ranks means W manifests for `refit plan
 * --all-ranks` and world-sized tables in every receiver.  Generous for real
 * jobs (Llama-3.1-405B pretrained on 16,384 GPUs as tp=8, pp=16, dp=128;
 * DeepSeek-V3 serves with ep=320), finite for hostile strings.  The world
 * limit is the manifest's (REFIT_MANIFEST_MAX_WORLD), so every layout's
 * manifests decode. */
#define REFIT_LAYOUT_MAX_TP 1024u
#define REFIT_LAYOUT_MAX_PP 1024u
#define REFIT_LAYOUT_MAX_ETP 1024u
#define REFIT_LAYOUT_MAX_EP REFIT_MANIFEST_MAX_WORLD
#define REFIT_LAYOUT_MAX_DP REFIT_MANIFEST_MAX_WORLD
#define REFIT_LAYOUT_MAX_WORLD REFIT_MANIFEST_MAX_WORLD /* tp x pp x dp */

/* Parses a layout string.  REFIT_ERR_PARSE for syntax errors and unknown
 * knobs, REFIT_ERR_NOT_FOUND for unknown schemes, REFIT_ERR_GEOMETRY for a
 * geometry that breaks its framework's rules independent of the model (e.g.
 * megatron ep*etp not dividing tp*dp, vllm ep not 1 or tp*dp) or a knob or
 * world above the limits above, each with a detail naming the rule. */
REFIT_API refit_status_t refit_layout_parse(const char *spec, refit_layout_t **out);
REFIT_API void refit_layout_destroy(refit_layout_t *layout);

/* The normalized string, every knob explicit (e.g. "megatron:tp=1,pp=1,ep=8,etp=1,dp=8,pad=128"). */
REFIT_API const char *refit_layout_string(const refit_layout_t *layout);
/* Number of ranks. */
REFIT_API uint32_t refit_layout_world(const refit_layout_t *layout);

/* Checks the geometry against a model: heads, kv groups, layers, experts,
 * intermediate sizes and vocab divisible as the scheme needs.
 * REFIT_ERR_GEOMETRY with a detail naming the rule and the numbers. */
REFIT_API refit_status_t refit_layout_check(const refit_layout_t *layout, const refit_model_t *model);

/* The finalized manifest of one rank: one memory region (an arena) holding
 * every local tensor in declaration order, each aligned to 256 bytes. */
REFIT_API refit_status_t refit_layout_manifest(const refit_layout_t *layout, const refit_model_t *model, uint32_t rank,
                                               refit_manifest_t **out);
/* The same from names: the model `model` (a built-in name or a config.json
 * path, as refit_model_open takes), the layout string `layout`, rank `rank`.
 * Errors as refit_model_open, refit_layout_parse and refit_layout_manifest. */
REFIT_API refit_status_t refit_manifest_for_rank(const char *model, const char *layout, uint32_t rank,
                                                 refit_manifest_t **out);

#ifdef __cplusplus
}
#endif
#endif
