/*
 * refit/model.h - model specs and their canonical tensors.
 *
 * A model is an architecture with its numbers.  Its canonical tensors are the
 * tensors of the model in Hugging Face naming and full (unsharded) shape, in a
 * fixed order: model.embed_tokens.weight, then layer by layer, then
 * model.norm.weight and lm_head.weight (absent when embeddings are tied).
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

/* A built-in model by name ("qwen3-30b-a3b", "tiny-moe", ...).
 * REFIT_ERR_NOT_FOUND if no such model; the detail lists the known names. */
REFIT_API refit_status_t refit_model_builtin(const char *name, refit_model_t **out);

/* A model from a Hugging Face config.json (a file, or a directory holding one).
 * Supported model_type values: qwen3, qwen3_moe, llama, mistral, deepseek_v3,
 * kimi_k2.  REFIT_ERR_IO if unreadable, REFIT_ERR_PARSE for malformed JSON
 * (with line and column), REFIT_ERR_UNSUPPORTED for an unknown model_type,
 * REFIT_ERR_INVALID_ARG for missing or inconsistent numbers (named). */
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
