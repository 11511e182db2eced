/* Internal view of a model: its spec (architecture numbers) and the canonical
 * tensor table derived from it.  Layout schemes read the spec directly. */
#ifndef REFIT_MODEL_INTERNAL_H
#define REFIT_MODEL_INTERNAL_H

#include "refit/model.h"
#include "util/strmap.h"
#include "util/util.h"

typedef enum {
    REFIT_ARCH_DENSE = 1, /* llama / qwen3 dense: GQA attention, gated MLP */
    REFIT_ARCH_MOE = 2,   /* qwen3_moe: GQA attention, every layer MoE */
    REFIT_ARCH_MLA = 3,   /* deepseek_v3 / kimi_k2: MLA attention, first_dense dense layers then MoE */
} refit_arch_t;

typedef struct refit_model_spec {
    char name[64];
    refit_arch_t arch;
    refit_dtype_t dtype;       /* of the weights (bf16 for every built-in) */
    uint32_t hidden;           /* hidden_size */
    uint32_t layers;           /* num_hidden_layers (the main layers; MTP layers are mtp_layers) */
    uint32_t heads;            /* num_attention_heads */
    uint32_t kv_heads;         /* num_key_value_heads (GQA groups); MLA: = heads */
    uint32_t head_dim;         /* GQA: head_dim (hidden/heads when config omits it) */
    uint32_t intermediate;     /* intermediate_size of dense MLP layers */
    uint32_t experts;          /* num_experts / n_routed_experts; 0 for dense models */
    uint32_t moe_intermediate; /* moe_intermediate_size, per expert */
    uint32_t shared_experts;   /* n_shared_experts (MLA); shared MLP width = shared_experts*moe_intermediate */
    uint32_t first_dense;      /* first_k_dense_replace (MLA): layers [0, first_dense) are dense */
    uint32_t vocab;            /* vocab_size */
    bool tie;                  /* tie_word_embeddings: no lm_head.weight */
    bool qk_norm;              /* per-head q_norm/k_norm [head_dim] (qwen3) */
    bool router_bias;          /* mlp.gate.e_score_correction_bias [experts] fp32 (deepseek_v3) */
    /* MLA numbers (arch == REFIT_ARCH_MLA) */
    uint32_t q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim;
    /* num_nextn_predict_layers (MLA: DeepSeek-V3's multi-token prediction):
     * layers [layers, layers + mtp_layers) are MTP layers, each a decoder layer
     * (MoE) plus enorm, hnorm, eh_proj [H, 2H] and shared_head.norm.  Their
     * embed_tokens and shared_head.head, copies of the main model's in the
     * checkpoint (shared by Megatron-Core and vLLM), are not canonical. */
    uint32_t mtp_layers;
} refit_model_spec_t;

typedef struct {
    char *name;
    refit_dtype_t dtype;
    uint32_t ndim;
    uint64_t shape[REFIT_MAX_DIMS];
    bool mtp; /* a tensor of an MTP layer */
} refit_tdesc_t;


struct refit_model {
    refit_model_spec_t spec;
    REFIT_VEC(refit_tdesc_t) tensors;
    refit_strmap_t index; /* name -> position in tensors */
    uint64_t total_bytes;
};

/* True if layer l (global index) has a MoE MLP. */
static inline bool refit_spec_layer_is_moe(const refit_model_spec_t *s, uint32_t l)
{
    return s->experts > 0 && l >= s->first_dense;
}

/* True if canonical tensor i is a tensor of an MTP layer (layouts of
 * runtimes without MTP layers leave them out). */
static inline bool refit_model_tensor_is_mtp(const refit_model_t *m, size_t i) { return m->tensors.data[i].mtp; }

/* Builds a model (canonical table included) from a spec, after checking that
 * its numbers are consistent (REFIT_ERR_INVALID_ARG naming the field). */
refit_status_t refit_model_from_spec(const refit_model_spec_t *spec, refit_model_t **out);

/* refit_model_from_config on the text of a config.json (len bytes, not
 * necessarily NUL-terminated); name_hint names the model when the config's
 * "_name_or_path" is absent or unusable (NULL: "custom"). */
refit_status_t refit_model_from_config_text(const char *text, size_t len, const char *name_hint, refit_model_t **out);

/* The built-in spec table (name == NULL terminates). */
const refit_model_spec_t *refit_builtin_specs(void);

#endif
