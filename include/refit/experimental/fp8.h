/*
 * refit/experimental/fp8.h - FP8 targets: block-quantized e4m3 linear weights.
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
 *
 * EXPERIMENTAL (docs/api.md): no ABI promise.  Exported for refit's own tools
 * and tests (version node REFIT_EXPERIMENTAL of src/refit.map); a release may
 * change or remove any declaration here without a new soname.
 */
#ifndef REFIT_FP8_H
#define REFIT_FP8_H

#include "refit/engine.h"
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
 * layouts (refit_fp8_relay_*, below). */
REFIT_API refit_status_t refit_fp8_target_manifest(const refit_fp8_target_t *t, const refit_manifest_t *bf16,
                                                   refit_manifest_t **out);

/* The source-side stage: from the receiver's bf16 image (region 0 of the
 * bf16 manifest, as its plan writes it) to the FP8 arena image.  threads 0:
 * one per CPU. */
REFIT_API refit_status_t refit_fp8_stage(const refit_fp8_target_t *t, const void *bf16_image, void *fp8_arena,
                                         unsigned threads);

/* An FP8 receiver's target (params.fp8): its tensors, offsets and sizes in
 * region 0; NULL for a bf16 receiver.  Owned by the receiver. */
REFIT_API const struct refit_fp8_target *refit_receiver_fp8_target(const refit_receiver_t *r);

/* ---- FP8 relays ------------------------------------------------------------
 * A receiver whose engine serves an FP8 checkpoint holds block-quantized
 * weights (refit/fp8.h).  An FP8 relay runs where the bf16 bytes are cheap
 * to read (next to the trainer, over shm): it pulls one bf16 vLLM rank as a
 * receiver, quantizes each version into an FP8 arena and publishes it as
 * that rank of the layout "<bf16 layout>+fp8" (refit_fp8_target_manifest) in
 * a group of its own.  FP8 receivers are ordinary receivers of that group
 * with FP8 manifests: they plan and pull like any other, across FP8 layouts
 * too (blocks are canonical blocks), and the wire carries fp8 bytes and
 * scales.  One relay per bf16 rank of the FP8 layout's world. */
typedef struct refit_fp8_relay refit_fp8_relay_t;
typedef struct {
    size_t size; /* sizeof(refit_fp8_relay_report_t) as the caller compiled it: REFIT_FP8_RELAY_REPORT_INIT */
    uint64_t version;
    uint64_t bf16_bytes, fp8_bytes;                /* pulled, published */
    double pull_ms, wait_ms, stage_ms, publish_ms; /* wait: for the FP8 readers of the previous version (in place) */
} refit_fp8_relay_report_t;
#ifdef __cplusplus
#define REFIT_FP8_RELAY_REPORT_INIT      \
    {                                    \
        sizeof(refit_fp8_relay_report_t) \
    }
#else
#define REFIT_FP8_RELAY_REPORT_INIT              \
    {                                            \
        .size = sizeof(refit_fp8_relay_report_t) \
    }
#endif
/* rp: the bf16 side (host memory; its group is the trainer's); pp: the FP8
 * side, pp->group naming another group (both read by size, as for
 * refit_receiver_create and refit_publisher_create).  On success the relay
 * owns bf16; on failure the caller keeps it (as for every create function).
 * REFIT_ERR_GEOMETRY when the layout cuts FP8 blocks. */
REFIT_API refit_status_t refit_fp8_relay_create(const refit_receiver_params_t *rp, const refit_publisher_params_t *pp,
                                                refit_manifest_t *bf16, refit_fp8_relay_t **out);
/* Pulls `version` (or REFIT_VERSION_NEWEST) in bf16, quantizes, publishes
 * the same version number in FP8.  In in-place mode it first waits (up to
 * timeout_ms) for the readers of the FP8 version it published last; if they
 * stay, the step fails with REFIT_ERR_TIMEOUT, and the next step (for that
 * version or NEWEST) publishes the version it had pulled, without pulling,
 * and returns; a newer version waits for the step after. */
REFIT_API refit_status_t refit_fp8_relay_step(refit_fp8_relay_t *x, uint64_t version, int timeout_ms,
                                              refit_fp8_relay_report_t *rep);
REFIT_API void refit_fp8_relay_destroy(refit_fp8_relay_t *x);

#ifdef __cplusplus
}
#endif
#endif
