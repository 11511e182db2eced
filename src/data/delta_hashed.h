/* data/delta_hashed.h - a delta's apply that keeps the receiver's digests, and an encoder that tells the
 * publisher's digests what changed (internal). */
#ifndef REFIT_DATA_DELTA_HASHED_H
#define REFIT_DATA_DELTA_HASHED_H

#include "data/digest.h"
#include "refit/experimental/delta.h"

/* refit_delta_apply_threads, and with map (the destination's digest map) every byte written goes through
 * refit_digest_map_update: acc, the sums of the memory before the apply (refit_digest_local's output for
 * it), holds those of the memory after it.  A failed apply leaves acc as unknown as the memory.
 * REFIT_ERR_INVALID_ARG for a map without acc; otherwise as refit_delta_apply_threads. */
refit_status_t refit_delta_apply_hashed(const refit_delta_index_t *ix, const void *delta, size_t len,
                                        uint64_t have_version, void *const *dst_bases, unsigned threads,
                                        refit_delta_apply_stats_t *stats, const refit_digest_map_t *map,
                                        refit_dsum_t *acc);

/* The encoder's changed bytes, told as it finds them: before each chunk's kept copy is updated, fn gets the
 * chunk of region `region` that starts at region byte `off`, with that region's new memory (`now`) and the kept
 * copy (`before`), from encoder thread `worker` (< the encoder's threads, at most 64; a worker's calls are in
 * address order): units NULL when the chunk is encoded dense (its len bytes may all differ), else the n 2-byte
 * units at off + 2 * units[i] (ascending) that differ.  fn NULL: none (the default). */
typedef void (*refit_delta_changed_fn)(void *ctx, unsigned worker, uint32_t region, uint64_t off, uint64_t len,
                                       const uint16_t *units, uint32_t n, const void *now, const void *before);
void refit_delta_encoder_watch(refit_delta_encoder_t *e, refit_delta_changed_fn fn, void *ctx);

#endif
