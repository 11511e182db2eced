/* The small internal interface to the CUDA code (src/transport/cuda/).
 *
 * Plain C types only: the tools and the GPU tests include this header and
 * call these functions under #ifdef REFIT_HAVE_CUDA; the engine reaches them
 * only through the CUDA memory domain (memdom.cu, transport/memdom.h), the
 * GPU truth (verify_truth.cu, verify/verify.h) and the cuda_ipc transport; nothing outside this folder includes a CUDA header.
 * Every function saves and restores the calling thread's current device. */
#ifndef REFIT_GPU_H
#define REFIT_GPU_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "plan/batch.h"
#include "refit/experimental/gpu.h" /* refit_gpu_count, _info, _can_access_peer, truth fill and verify */
#include "refit/manifest.h"
#include "refit/plan.h"
#include "refit/experimental/truth.h"
#include "verify/verify.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The device's UUID ("GPU-..."), without creating a context on it. */
refit_status_t refit_gpu_uuid(int dev, char out[48]);

/* Lets kernels on dev read and write peer's memory (cudaDeviceEnablePeerAccess; idempotent). */
refit_status_t refit_gpu_enable_peer(int dev, int peer);

/* Device memory on dev, zeroed.  REFIT_ERR_NO_MEMORY / REFIT_ERR_UNSUPPORTED. */
refit_status_t refit_gpu_alloc(int dev, uint64_t size, void **out);
void refit_gpu_free(void *p);
/* Pinned host memory (zeroed). */
refit_status_t refit_gpu_host_alloc(uint64_t size, void **out);
void refit_gpu_host_free(void *p);
/* Synchronous copy between any two of host and device memory. */
refit_status_t refit_gpu_copy(void *dst, const void *src, uint64_t n);

/* refit_gpu_truth_verify (refit/experimental/gpu.h) runs truth_table.h's walk on the
 * device, counts mismatches there and copies one counter (and the first
 * mismatch) back. */
/* The positional digest (truth_hd.h) of n bytes of device memory (8-byte aligned). */
refit_status_t refit_gpu_digest(int dev, const void *p, uint64_t n, uint64_t *out);

/* Content digests of device memory (refit_gpu_digest_*): verify/verify.h. */

/* A batch table resident on one device with a stream of its own: one
 * kernel launch executes it (see plan/batch.h). */
typedef struct refit_gpu_batch refit_gpu_batch_t;
refit_status_t refit_gpu_batch_create(int dev, const refit_batch_t *b, refit_gpu_batch_t **out);
void refit_gpu_batch_destroy(refit_gpu_batch_t *g);
/* Launches it; slots[i] is slot i's device-visible address.  The slot
 * table is uploaded only when it changed.  Counts launches and uploads. */
refit_status_t refit_gpu_batch_launch(refit_gpu_batch_t *g, const uint64_t *slots, uint64_t *launches,
                                      uint64_t *uploads);
/* Executes the batch with the runtime's device-to-device copies instead of
 * the kernel (source and destination memory of this batch's device): one
 * cudaMemcpyAsync per contiguous run, or one cudaMemcpy2DAsync per strided
 * loop, on the batch's stream; wait with refit_gpu_batch_wait.  min_bytes
 * 0: every region; else only the regions refit_gpu_batch_region_by_copy
 * selects (the caller runs the others, e.g. as a kernel on another stream).
 * Counts the copy calls in *ops. */
refit_status_t refit_gpu_batch_copy(refit_gpu_batch_t *g, const uint64_t *slots, uint64_t min_bytes, uint64_t *ops);
/* Whether region r goes to device-to-device copy calls: a copy region whose
 * runs are contiguous (one call each) of at least min_bytes. */
bool refit_gpu_batch_region_by_copy(const refit_batch_region_t *r, uint64_t min_bytes);
/* GPU turns: kernels of different processes on one GPU are time-sliced, not
 * run together, so work of several processes on one GPU goes faster one
 * after the other.  Takes GPU dev's turn (an flock on
 * /dev/shm/refit-<uid>-<UUID>.turn, per user) after sleeping grace_s,
 * waiting up to max_wait_s; returns what refit_gpu_turn_give releases, or
 * -1 when no turn was taken (the work then runs anyway). */
int refit_gpu_turn_take(int dev, double grace_s, double max_wait_s);
void refit_gpu_turn_give(int turn);
/* Waits for the launch, calling tick about every 10 ms (a non-zero status
 * is returned once the kernel is done: a kernel is not cancelled).
 * deadline: refit_now() limit (0: none), REFIT_ERR_TIMEOUT past it. */
refit_status_t refit_gpu_batch_wait(refit_gpu_batch_t *g, refit_status_t (*tick)(void *), void *user, double deadline);
const refit_batch_t *refit_gpu_batch_table(const refit_gpu_batch_t *g);
/* Waits for a cudaEvent_t recorded on dev's stream as refit_gpu_batch_wait
 * does; `what` names the work in errors ("copy kernel"). */
refit_status_t refit_gpu_event_wait(void *event, int dev, const char *what, refit_status_t (*tick)(void *), void *user,
                                    double deadline);
int refit_gpu_batch_device(const refit_gpu_batch_t *g);
/* g copies inside one GPU: its launches take 2 blocks per multiprocessor
 * (faster there on an H200; copies over NVLink keep every block that fits). */
void refit_gpu_batch_local(refit_gpu_batch_t *g);
/* g's later work waits for what `first` has issued so far (its last event). */
refit_status_t refit_gpu_batch_after(refit_gpu_batch_t *g, refit_gpu_batch_t *first);
/* Diagnostics (docs/gpu.md, "Colocated"): REFIT_CUDA_TRACE=FILE (NULL when
 * unset) makes copy calls and launches record timing events;
 * refit_gpu_batch_trace_print writes, once both batches are waited for, one
 * line per copy call of `copies` and the span of `kernel` (either NULL). */
const char *refit_gpu_trace_path(void);
void refit_gpu_batch_trace_print(refit_gpu_batch_t *copies, refit_gpu_batch_t *kernel, FILE *f);

/* The fills (zero padding) of a plan into device memory dst_bases on dev:
 * one launch, synchronous.  No-op without fills. */
refit_status_t refit_gpu_plan_fills(const refit_plan_t *plan, int dev, void *const *dst_bases, uint64_t *launches);

/* Host memory made readable and writable by kernels (mapped, portable). */
refit_status_t refit_gpu_host_register(void *p, uint64_t n);
void refit_gpu_host_unregister(void *p);

#ifdef __cplusplus
}
#endif
#endif
