/*
 * refit/model.h - model specs and their canonical tensors.
 *
 * A model is an architecture with its numbers.  Its canonical tensors are the
 * tensors of the model in Hugging Face naming and full (unsharded) shape, in a
 * fixed order: model.embed_tokens.weight, then layer by layer, then
 * model.norm.weight and lm_head.weight (absent when embeddings are tied).
 * A DeepSeek-V3-style model with num_nextn_predict_layers > 0 has its
 * multi-token-prediction (MTP) layers after the main ones, numbered on
 * (model.layers.{num_hidden_layers + i}.*: the decoder layer's tensors, enorm,
 * hnorm, eh_proj, shared_head.norm; the checkpoint's copies of the embedding
 * and output head in that layer are the main model's and not listed).
 * Every layout is described relative to these.
 *
 * Built-in models carry the numbers of their published config.json; any other
 * model is read from a Hugging Face config.json.  Objects are immutable once
 * created and may be shared between threads.
 */
#ifndef REFIT_MODEL_H
#define REFIT_MODEL_H

#include <stdbool.h>

#include "refit/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct refit_model refit_model_t;

/* Limits on a model's numbers, checked (with REFIT_ERR_INVALID_ARG naming the
 * config field, its value and the limit) before the tensor table is
 * allocated, so that numbers which parse but describe no real model cannot
 * make refit allocate without bound.  Each is several times the largest
 * published model's: Llama-3.1-405B (126 layers, hidden 16,384, intermediate
 * 53,248, 128 heads), Kimi-K2 (384 experts, ~70,000 tensors, ~2.1 TB in
 * bf16), DeepSeek-V3 (q_lora_rank 1,536), Gemma 3 (vocabulary 262,144). */
#define REFIT_MODEL_MAX_LAYERS 1024u              /* num_hidden_layers */
#define REFIT_MODEL_MAX_MTP_LAYERS 16u            /* num_nextn_predict_layers (DeepSeek-V3: 1) */
#define REFIT_MODEL_MAX_HIDDEN 65536u             /* hidden_size */
#define REFIT_MODEL_MAX_INTERMEDIATE 262144u      /* intermediate_size, moe_intermediate_size */
#define REFIT_MODEL_MAX_HEADS 4096u               /* num_attention_heads, num_key_value_heads */
#define REFIT_MODEL_MAX_HEAD_DIM 4096u            /* head_dim, qk_nope/qk_rope/v_head_dim */
#define REFIT_MODEL_MAX_LORA_RANK 65536u          /* q_lora_rank, kv_lora_rank */
#define REFIT_MODEL_MAX_EXPERTS 4096u             /* num_experts / n_routed_experts */
#define REFIT_MODEL_MAX_SHARED_EXPERTS 64u        /* n_shared_experts */
#define REFIT_MODEL_MAX_VOCAB 4194304u            /* vocab_size (2^22) */
#define REFIT_MODEL_MAX_TENSORS 1048576u          /* canonical tensors (2^20) */
#define REFIT_MODEL_MAX_BYTES (UINT64_C(1) << 46) /* all canonical tensors: 64 TiB */
#define REFIT_MODEL_MAX_CONFIG_BYTES (64u << 20)  /* a config.json file (real ones: a few KB) */

/* A built-in model by name ("qwen3-30b-a3b", "tiny-moe", ...).
 * REFIT_ERR_NOT_FOUND if no such model; the detail lists the known names. */
REFIT_API refit_status_t refit_model_builtin(const char *name, refit_model_t **out);

/* A model from a Hugging Face config.json (a file, or a directory holding one).
 * Supported model_type values: qwen3, qwen3_moe, llama, mistral, deepseek_v3,
 * kimi_k2.  REFIT_ERR_IO if unreadable, not a regular file (a FIFO, a device,
 * a directory or a socket: refused before reading) or larger than
 * REFIT_MODEL_MAX_CONFIG_BYTES, REFIT_ERR_PARSE for malformed JSON (with line
 * and column), REFIT_ERR_UNSUPPORTED for an unknown model_type,
 * REFIT_ERR_INVALID_ARG for missing or inconsistent numbers, or numbers above
 * the limits above (named). */
REFIT_API refit_status_t refit_model_from_config(const char *path, refit_model_t **out);

/* A built-in name, or else a path to a config.json or its directory. */
REFIT_API refit_status_t refit_model_open(const char *name_or_path, refit_model_t **out);

/* Destroys a model; NULL is accepted. */
REFIT_API void refit_model_destroy(refit_model_t *model);

/* The model's name (the built-in name, or "<name_or_path of config>" as given). */
REFIT_API const char *refit_model_name(const refit_model_t *model);
REFIT_API size_t refit_model_num_tensors(const refit_model_t *model);
/* The i-th canonical tensor; REFIT_ERR_INVALID_ARG if i is out of range.
 * out->name lives as long as the model. */
REFIT_API refit_status_t refit_model_tensor(const refit_model_t *model, size_t i, refit_tensor_info_t *out);
/* Index of a canonical tensor by name, or -1. */
REFIT_API int64_t refit_model_find_tensor(const refit_model_t *model, const char *name);
/* Sum of the canonical tensors' bytes. */
REFIT_API uint64_t refit_model_total_bytes(const refit_model_t *model);

/* Built-in names, for listings: index 0.. until NULL. */
REFIT_API const char *refit_model_builtin_name(size_t i);

#ifdef __cplusplus
}
#endif
#endif
