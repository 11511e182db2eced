/* data/delta_hashed.h - a delta's apply that keeps the receiver's digests (internal). */
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

#endif
