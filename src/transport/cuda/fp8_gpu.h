/* Quantize-on-copy on the GPU (fp8_copy.cu): a quantize-on-copy table
 * (plan/fp8_table.h) resident on one device, run as one launch of the FP8
 * kernel plus one of the batch kernel for the tensors kept as they are.
 * Plain C interface, like gpu.h; every function saves and restores the
 * calling thread's current device. */
#ifndef REFIT_FP8_GPU_H
#define REFIT_FP8_GPU_H

#include "plan/fp8_table.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct refit_gpu_fp8 refit_gpu_fp8_t;

/* Uploads the table to dev (the table may be freed afterwards). */
refit_status_t refit_gpu_fp8_create(int dev, const refit_fp8_table_t *x, refit_gpu_fp8_t **out);
void refit_gpu_fp8_destroy(refit_gpu_fp8_t *g);
/* Launches it: slots[i] is slot i's device-visible address (the table's
 * numbering); the slot table is uploaded only when it changed.  Counts
 * launches and uploads. */
refit_status_t refit_gpu_fp8_launch(refit_gpu_fp8_t *g, const uint64_t *slots, uint64_t *launches, uint64_t *uploads);
/* Waits for the launch like refit_gpu_batch_wait (tick every ~10 ms; a kernel is not cancelled). */
refit_status_t refit_gpu_fp8_wait(refit_gpu_fp8_t *g, refit_status_t (*tick)(void *), void *user, double deadline);
/* Test support (measuring kernel variants in one run): the number of
 * shared-memory stages of the kernel for whole aligned blocks, 2 (the
 * default), 3 or 4; REFIT_ERR_INVALID_ARG for others. */
refit_status_t refit_gpu_fp8_set_kernel(refit_gpu_fp8_t *g, int stages);
/* The table's slot numbering (nsrcs, src_slot_base, dst_slot, nslots) and sizes, as built. */
const refit_fp8_table_t *refit_gpu_fp8_table(const refit_gpu_fp8_t *g);

/* An FP8 receiver's arena (device memory on dev) against the bf16 truth of
 * `version` (refit/experimental/truth.h) quantized on dev by the same kernel;
 * REFIT_ERR_VERIFY naming the first tensor that differs. */
refit_status_t refit_gpu_fp8_truth_verify(const refit_manifest_t *bf16, const refit_fp8_target_t *t, int dev,
                                          const void *arena, uint64_t version);

/* Test support: q[i * nscales + k] = e4m3(bf16 i / scales[k]) for every
 * bf16 pattern i (65536) on device dev, by the kernel's own arithmetic. */
refit_status_t refit_gpu_fp8_quantize_all(int dev, const float *scales, uint32_t nscales, uint8_t *q);

/* Test support: the whole-block path's arithmetic against fp8_hd.h's for
 * every bf16 x and every block maximum that can hold it, on dev. */
refit_status_t refit_gpu_fp8_check_all(int dev, uint64_t *mismatches, uint64_t *checked, uint16_t *first_x,
                                       uint16_t *first_amax);

#ifdef __cplusplus
}
#endif
#endif
