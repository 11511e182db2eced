/* Verification: a receiver's check of the bytes it pulled, after the
 * transfer and before the commit, behind one small interface so that the
 * engine does not know which check it runs, and the memory domain
 * (transport/memdom.h) keeps to memory operations.
 *
 * Implementations:
 *   - the synthetic truth (refit_verify_truth, truth.c; tests and tools): every byte
 *     against its formula (refit/experimental/truth.h), on the host, or on the GPU
 *     through the CUDA folder's refit_verify_truth_gpu (FP8 arenas too);
 *   - content digests (the receiver's, engine/receiver_verify.c): the memory
 *     hashed and compared with the sources' digest tables.
 * A check is synchronous, reads the memory and writes nothing in it. */
#ifndef REFIT_VERIFY_H
#define REFIT_VERIFY_H

#include <stdbool.h>
#include <stdint.h>

#include "refit/experimental/fp8.h"
#include "refit/manifest.h"
#include "refit/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The memory to check: the regions of layout m holding `version`. */
typedef struct {
    const refit_manifest_t *m;     /* its layout (an FP8 receiver's: the bf16 one) */
    const refit_fp8_target_t *fp8; /* NULL, or bases[0] is the arena of this FP8 target of m */
    int device;                    /* -1: host memory, else the GPU holding it */
    const void *const *bases;      /* region i of m at bases[i] */
    uint64_t version;
    double fraction; /* (0, 1]: the truth's delta fraction (refit_truth_value_delta; host only); 1: a whole step */
} refit_verify_mem_t;

typedef struct refit_verifier {
    const char *name; /* "truth", "digests" */
    /* Checks mem; REFIT_ERR_VERIFY names the first tensor or byte that
     * differs, REFIT_ERR_UNSUPPORTED memory this check cannot read.  user:
     * the implementation's context (NULL for the truth). */
    refit_status_t (*check)(void *user, const refit_verify_mem_t *mem);
} refit_verifier_t;

/* The synthetic truth (truth.c): host memory here, GPU memory through
 * refit_verify_truth_gpu where the library has CUDA. */
extern const refit_verifier_t refit_verify_truth;

/* The truth on a GPU (src/transport/cuda/verify_truth.cu); absent without CUDA. */
#ifdef REFIT_HAVE_CUDA
refit_status_t refit_verify_truth_gpu(const refit_verify_mem_t *mem);

/* Content digests (data/digest.h) of device memory, bit for bit the CPU's (digest.cu).  A work list is
 * built once from a finalized manifest and the device addresses of its regions (bases[r] on device dev)
 * and run every version: `table` false for a receiver's own sums (refit_digest_local's), true for a
 * publisher's table (refit_digest_table_fill's).  Runs are synchronous, on a stream of their own.
 * REFIT_ERR_INVALID_ARG, REFIT_ERR_NO_MEMORY, REFIT_ERR_TRANSPORT (a CUDA call failed),
 * REFIT_ERR_INTERNAL (table: a placement's row and column totals differ: its memory changed). */
typedef struct refit_gpu_digest refit_gpu_digest_t;
struct refit_digest_key;
refit_status_t refit_gpu_digest_create(int dev, const struct refit_digest_key *k, const refit_manifest_t *m,
                                       void *const *bases, bool table, refit_gpu_digest_t **out);
void refit_gpu_digest_destroy(refit_gpu_digest_t *g);
/* sums[i] (host, one per placement of the manifest) = the sums refit_digest_local writes. */
refit_status_t refit_gpu_digest_local_run(refit_gpu_digest_t *g, void *sums);
/* The same sums, each box first copied from src_delta bytes further (same layout, device memory) into
 * its place and hashed in that pass: the fused copy's cost (bench; the engine's copies are the plan's). */
refit_status_t refit_gpu_digest_copy_run(refit_gpu_digest_t *g, int64_t src_delta, void *sums);
/* table: device memory of refit_digest_table_bytes(m) bytes, 8-byte aligned. */
refit_status_t refit_gpu_digest_table_run(refit_gpu_digest_t *g, void *table);

/* A receiver's check on the device (refit_digest_check's sums, made where the sums are): built once per
 * digest plan (of the manifest g was made for) over sources [0, nsrcs); each run reads the plan's entries
 * straight from the sources' tables in device memory (tables[s]: the address of source s's table, readable
 * by kernels on g's device; NULL for sources the plan fetches nothing from), sums them and compares with
 * the receiver's sums, so that only a count crosses to the host.  summed: g's sums were already made by
 * the pull's copies (refit_gpu_digest_sums_begin, below); else they are made first, in a pass over the
 * memory.  *mismatches: placements whose digests differ (0: every verifiable one matches); *first (may be
 * NULL) the first such placement; when *mismatches > 0 the sums are copied to sums (host, one per
 * placement) for refit_digest_check's detailed error.  REFIT_ERR_INVALID_ARG, REFIT_ERR_NO_MEMORY,
 * REFIT_ERR_TRANSPORT. */
typedef struct refit_gpu_digest_check refit_gpu_digest_check_t;
struct refit_digest_plan;
refit_status_t refit_gpu_digest_check_create(const refit_gpu_digest_t *g, const struct refit_digest_plan *plan,
                                             uint32_t nsrcs, refit_gpu_digest_check_t **out);
void refit_gpu_digest_check_destroy(refit_gpu_digest_check_t *c);
refit_status_t refit_gpu_digest_verify_run(refit_gpu_digest_t *g, refit_gpu_digest_check_t *c,
                                           const void *const *tables, bool summed, uint64_t *mismatches,
                                           uint32_t *first, void *sums);

/* A plan's copy that hashes what it writes, in one kernel (the cuda_ipc pull's, for a receiver's GPU memory):
 * runs[i] writes len bytes at device address dst from slots[slot] + src_off (slots: the launch's source
 * addresses; pad: the caller's, untouched).  create (once per plan) cuts g's tiles (a receiver's: table false) where the runs that write
 * them change and sends back, in *rest (malloc'ed, the caller's; *nrest may be 0), the bytes of the runs no
 * digest covers (to be copied some other way).  REFIT_ERR_UNSUPPORTED when a digested row is not written
 * whole by the runs in whole 2-byte units, or two runs write the same bytes (copy and hash separately then).
 * launch zeroes g's sums and starts the kernel on g's stream (slots uploaded when they changed); the sums
 * are then those refit_gpu_digest_local_run gives for the memory written, bit for bit; _wait waits for it,
 * _sums copies them out (host, one per placement; waits). */
typedef struct {
    uint64_t dst, len, src_off;
    uint32_t slot, pad;
} refit_gpu_run_t;
typedef struct {
    size_t run;
    uint64_t off, len;
} refit_gpu_rest_t;
typedef struct refit_gpu_digest_fused refit_gpu_digest_fused_t;
refit_status_t refit_gpu_digest_fused_create(const refit_gpu_digest_t *g, const refit_gpu_run_t *runs, size_t n,
                                             uint32_t nslots, refit_gpu_digest_fused_t **out, refit_gpu_rest_t **rest,
                                             size_t *nrest);
void refit_gpu_digest_fused_destroy(refit_gpu_digest_fused_t *f);
refit_status_t refit_gpu_digest_fused_launch(refit_gpu_digest_t *g, refit_gpu_digest_fused_t *f, const uint64_t *slots);
refit_status_t refit_gpu_digest_wait(refit_gpu_digest_t *g);
refit_status_t refit_gpu_digest_sums(refit_gpu_digest_t *g, void *sums);
#endif

#ifdef __cplusplus
}
#endif
#endif
