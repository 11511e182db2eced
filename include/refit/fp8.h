/*
 * refit/fp8.h - FP8 targets: block-quantized e4m3 linear weights.
 *
 * A receiver whose engine serves an FP8 checkpoint (Qwen3-30B-A3B-FP8,
 * DeepSeek-V3) stores each linear weight as float8 e4m3 (fn: finite, max 448)
 * in 128x128 blocks, with one fp32 `weight_scale_inv` per block
 * (dequantized value = fp8 value * scale_inv).  The publishers hold bf16.
 *
 * Design: quantization happens at the source side, so that the wire carries
 * fp8 bytes and scales (about half the bf16 bytes).  A quantizer must see a
 * whole block, and a block must be the same block the checkpoint would have:
 * the FP8 target is derived from the receiver's bf16 layout (the vllm scheme),
 * and every placement of a quantized tensor must start on the 128 grid in
 * both the canonical and the local tensor and cover whole blocks (or end at
 * the canonical edge); otherwise the target is refused (REFIT_ERR_GEOMETRY),
 * as vLLM refuses block-quantized shards that cut blocks.  The source-side
 * stage executes the ordinary bf16 plan for the receiver's layout into a
 * staging image where the sources are (no wire), quantizes each block
 * (refit_fp8_stage) into the receiver's FP8 arena image, and the receiver
 * pulls that arena: one contiguous copy.
 *
 * Quantizer (per block): amax = max |x|; scale = amax / 448 (fp32; 1 when
 * amax is 0); q = e4m3(x / scale) rounded to nearest, ties to even, saturated
 * at 448; weight_scale_inv = scale.
 */
#ifndef REFIT_FP8_H
#define REFIT_FP8_H

#include "refit/manifest.h"

#ifdef __cplusplus
extern "C" {
#endif

#define REFIT_FP8_BLOCK 128
#define REFIT_FP8_MAX 448.0f

/* float -> e4m3fn, round to nearest even, saturating to +-448; NaN -> 0x7f. */
REFIT_API uint8_t refit_fp8_e4m3_from_f32(float x);
REFIT_API float refit_fp8_e4m3_to_f32(uint8_t b);
REFIT_API float refit_bf16_to_f32(uint16_t b);

/* Quantizes one block (rows x cols <= 128x128) of bf16 with row stride ld
 * (elements) into q (row stride ldq bytes); returns the block's scale_inv. */
REFIT_API float refit_fp8_quantize_block(const uint16_t *x, uint64_t ld, uint32_t rows, uint32_t cols, uint8_t *q,
                                         uint64_t ldq);

typedef struct refit_fp8_target refit_fp8_target_t;

typedef struct {
    const char *name;    /* "...qkv_proj.weight", "...qkv_proj.weight_scale_inv", "...input_layernorm.weight" */
    refit_dtype_t dtype; /* F8_E4M3, F32 (scales), or the bf16 tensor's own dtype (kept as is) */
    uint32_t ndim;
    uint64_t shape[REFIT_MAX_DIMS];
    uint64_t offset, bytes; /* in the FP8 arena */
    uint32_t local;         /* the bf16 manifest's local tensor it comes from */
} refit_fp8_tensor_t;

/* The FP8 variant of a bf16 receiver manifest (one region): linear weights
 * (2-d "*_proj.weight", 3-d expert "w13_weight"/"w2_weight") become e4m3 plus
 * a scale tensor [lead.., ceil(R/128), ceil(C/128)] fp32; embeddings, lm_head,
 * norms and the router stay as they are.  REFIT_ERR_GEOMETRY naming the
 * tensor and placement if a block would straddle shards. */
REFIT_API refit_status_t refit_fp8_target_create(const refit_manifest_t *bf16, refit_fp8_target_t **out);
REFIT_API void refit_fp8_target_destroy(refit_fp8_target_t *t);
REFIT_API uint64_t refit_fp8_target_bytes(const refit_fp8_target_t *t);
REFIT_API uint32_t refit_fp8_target_num_tensors(const refit_fp8_target_t *t);
REFIT_API const refit_fp8_tensor_t *refit_fp8_target_tensor(const refit_fp8_target_t *t, uint32_t i);
/* Quantized weights (and their scales) in the target. */
REFIT_API uint32_t refit_fp8_target_num_quantized(const refit_fp8_target_t *t);

/* The FP8 target as a manifest of its own (layout "<bf16 layout>+fp8", same
 * model, rank and world; one region of refit_fp8_target_bytes): quantized
 * weights are F8_E4M3 local tensors placed from F8_E4M3 canonical tensors of
 * the same names and shapes, their scales F32 local tensors
 * ("<name>_scale_inv") placed from canonical "<canonical>_scale_inv" tensors
 * [.., ceil(R/128), ceil(C/128)] with the same boxes on the block grid; the
 * rest as in the bf16 manifest.  A stage that publishes its FP8 arena under
 * this manifest and a receiver that holds it plan between them like any two
 * layouts (refit_fp8_relay_* in refit/engine.h). */
REFIT_API refit_status_t refit_fp8_target_manifest(const refit_fp8_target_t *t, const refit_manifest_t *bf16,
                                                   refit_manifest_t **out);

/* The source-side stage: from the receiver's bf16 image (region 0 of the
 * bf16 manifest, as its plan writes it) to the FP8 arena image.  threads 0:
 * one per CPU. */
REFIT_API refit_status_t refit_fp8_stage(const refit_fp8_target_t *t, const void *bf16_image, void *fp8_arena,
                                         unsigned threads);

#ifdef __cplusplus
}
#endif
#endif
