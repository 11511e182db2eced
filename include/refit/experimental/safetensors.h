/*
 * refit/experimental/safetensors.h - safetensors files: writing a rank's local tensors,
 * reading (validating) files, and Hugging Face checkpoint directories as an
 * "hf" source for a publisher (cold start from disk).
 *
 * The file is the real format: an 8-byte little-endian header length, a JSON
 * header mapping each tensor name to {"dtype","shape","data_offsets"}, then
 * the data.  Names are the local tensor names of the manifest.
 *
 * EXPERIMENTAL (docs/api.md): no ABI promise.  Exported for refit's own tools
 * and tests (version node REFIT_EXPERIMENTAL of src/refit.map); a release may
 * change or remove any declaration here without a new soname.
 */
#ifndef REFIT_SAFETENSORS_H
#define REFIT_SAFETENSORS_H

#include "refit/manifest.h"
#include "refit/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes every local tensor of m (bytes from region_bases) to `path`
 * (created or replaced): written to an exclusive temporary of a random name
 * in path's directory (never following a symbolic link) and renamed over
 * path (a symbolic link there is replaced, not followed).  The directory must
 * belong to this user and not be writable by group or others unless sticky:
 * else REFIT_ERR_AUTH naming it (another user could swap the file).
 * REFIT_ERR_IO with the path and errno text on other failures. */
REFIT_API refit_status_t refit_safetensors_write(const char *path, const refit_manifest_t *m,
                                                 const void *const *region_bases);

/* ---- reading ----
 * A reader validates the whole header before answering anything: the 8-byte
 * length (at most REFIT_SAFETENSORS_MAX_HEADER and inside the file), strict
 * JSON (src/util/json.h), every entry an object with a known "dtype", a
 * "shape" of at most REFIT_MAX_DIMS non-negative integers and "data_offsets"
 * [begin, end] with begin <= end <= the data section's size, end - begin equal
 * to the shape's bytes, and no two tensors sharing bytes.  Errors:
 * REFIT_ERR_CORRUPT (truncated file, huge header, offsets past the end of the
 * file), REFIT_ERR_PARSE (JSON, with line and column; a field of the wrong
 * type), REFIT_ERR_UNSUPPORTED (a dtype refit has no name for, more than
 * REFIT_MAX_DIMS dims), REFIT_ERR_MISMATCH (data_offsets do not match dtype
 * and shape), REFIT_ERR_OVERLAP; each detail names the tensor. */
#define REFIT_SAFETENSORS_MAX_HEADER (100u << 20)

typedef struct refit_safetensors refit_safetensors_t;

/* Parses a file image held in memory (buf must outlive the reader). */
REFIT_API refit_status_t refit_safetensors_parse(const void *buf, size_t len, refit_safetensors_t **out);
/* Maps a file read-only (MAP_SHARED) and parses it; REFIT_ERR_IO naming the path. */
REFIT_API refit_status_t refit_safetensors_open(const char *path, refit_safetensors_t **out);
REFIT_API void refit_safetensors_close(refit_safetensors_t *f);
/* Tensors in header order (__metadata__ excluded). */
REFIT_API size_t refit_safetensors_count(const refit_safetensors_t *f);
/* Tensor i: name/dtype/shape (ndim 0 for a scalar; name lives as long as f)
 * and its bytes [offset, offset + nbytes) counted from the start of the file. */
REFIT_API refit_status_t refit_safetensors_tensor(const refit_safetensors_t *f, size_t i, refit_tensor_info_t *info,
                                                  uint64_t *offset, uint64_t *nbytes);
/* Index of a tensor by name, or -1. */
REFIT_API int64_t refit_safetensors_find(const refit_safetensors_t *f, const char *name);
/* The file image (the mapping for open) and its size. */
REFIT_API const void *refit_safetensors_data(const refit_safetensors_t *f);
REFIT_API uint64_t refit_safetensors_size(const refit_safetensors_t *f);

/* ---- Hugging Face checkpoints as an "hf" source ----
 * Opens DIR/model.safetensors.index.json (its "weight_map" names the shards)
 * or else DIR/model.safetensors, maps every shard and builds the finalized
 * manifest of an hf-layout source (model = refit_model_name(model), layout
 * "hf", rank 0, world 1) with one region per shard file (the whole file, at
 * most 64 shards): each canonical tensor of the model is a local tensor at its
 * byte offset in its shard, placed whole.  Tensors of the files that are not
 * canonical (rotary caches, an MTP layer's copies of the embedding and head;
 * every MTP layer when the model has none) are left out.  Errors: a canonical
 * tensor missing (REFIT_ERR_NOT_FOUND, naming it and how many others, and
 * saying when they are the model's MTP layers) or of
 * another dtype or shape (REFIT_ERR_MISMATCH), a shard that does not read
 * (as refit_safetensors_open), an index naming a tensor its shard lacks.
 * The caller owns *manifest (give it to refit_publisher_create) and attaches
 * region r to refit_hf_source_region(src, r); src must outlive the publisher. */
typedef struct refit_hf_source refit_hf_source_t;
REFIT_API refit_status_t refit_hf_source_open(const char *dir, const refit_model_t *model, refit_hf_source_t **src,
                                              refit_manifest_t **manifest);
REFIT_API uint32_t refit_hf_source_num_regions(const refit_hf_source_t *src);
REFIT_API void *refit_hf_source_region(const refit_hf_source_t *src, uint32_t region);
REFIT_API const char *refit_hf_source_file(const refit_hf_source_t *src, uint32_t region);
REFIT_API void refit_hf_source_close(refit_hf_source_t *src);

#ifdef __cplusplus
}
#endif
#endif
