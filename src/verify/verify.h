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
#endif

#ifdef __cplusplus
}
#endif
#endif
