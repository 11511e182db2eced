/*
 * data/digest.h - layout-independent content digests (internal API).
 *
 * A receiver verifies the bytes it pulled against digests its sources
 * computed, whatever the two layouts are, without the synthetic truth.
 *
 * Canonical coordinates.  A canonical tensor of ndim 1 or 2 is read as a
 * matrix of R rows by U units, a unit being 2 bytes of a row (one bf16/f16
 * element, half an f32, two fp8 bytes); ndim 1 is one row.  Unit values are
 * the raw 16-bit patterns, little-endian, read as signed int16.  With a
 * 32-byte key, two independent lanes l = 0, 1 have
 *   column keys  K_l[j]    = m_l(j >> 16) * k_l[j mod 65536]  (mod 2^32), odd, where
 *     k_l        a table of 65536 odd int16 per lane, and
 *     m_l(b)     odd uint32 from a keyed mix of the block index b (m_l(0) = 1),
 *   row keys     r_l(t, i) odd uint32 from a keyed mix of (tensor id, row i),
 *   tensor id    t = a keyed 64-bit hash of the canonical name,
 * and the digest of a box B = rows [a,b) x units [c,d) of tensor t is
 *   D_l(B) = sum_{i in [a,b)} r_l(t,i) * sum_{j in [c,d)} K_l[j] * v_ij  (mod 2^32).
 * Column keys do not repeat along a row: units j and j + 65536 share k_l but
 * not m_l.  Rows of at most 65,536 units have m_l = 1 throughout (digests as
 * before the blocks were keyed).  D is additive over any partition of a box.  Boxes whose column start or
 * width is not a whole number of units, tensors whose rows are an odd number
 * of bytes, and tensors of ndim >= 3 are not digestible: they are reported
 * as unverifiable, never "verified".
 *
 * Publisher: for every digestible placement (a box [a,b) x [c,d) of its
 * manifest), prefix tables P[k] = D(rows [a,a+k) x units [c,d)), k = 0..b-a,
 * and Q[k] = D(rows [a,b) x units [c,c+k)), k = 0..d-c (P[b-a] = Q[d-c] = D(box)).
 * The table of a manifest is those arrays, P then Q, for every digestible
 * placement in placement order; each entry is 8 bytes: lane 0 then lane 1,
 * little-endian uint32.  Offsets depend on the manifest alone
 * (refit_digest_table_offsets), so a receiver computes them from the
 * source's manifest.
 *
 * Receiver: a destination box that spans whole rows (c = 0, d = U) gets its
 * expected digest from P entries of the source boxes that meet its rows, one
 * that spans every row (a = 0, b = R) from Q entries; one cut in both
 * dimensions is unverifiable.  Per canonical tensor, one source box of every
 * set of identical boxes (replicas) is used: the usable one of the lowest
 * source index; the distinct boxes must partition the tensor (otherwise its
 * placements are unverifiable).  Each (destination box, source box) pair
 * needs at most 2 entries (hi minus lo; P[0] = Q[0] = 0 is never fetched;
 * Q[end] is fetched as P[end], the same value); entries are fetched once.
 * Padding (local bytes no placement covers) is part of no digest.
 *
 * Strength, against faults and bugs (someone without the key).  A change of
 * one unit, by any d != 0, changes both lanes, always: r_l and K_l[j] are odd
 * and 0 < |d| < 2^16, so r * K * d != 0 mod 2^32.  Two changed units of one
 * row, d1 at j1 and d2 at j2, keep a lane only when d1 K[j1] + d2 K[j2] = 0
 * mod 2^32: in one block of 65,536 units this needs d1 k[j1] = -d2 k[j2]
 * exactly (both products are below 2^31), true for at most one of the 2^15
 * odd values of k[j1], so at most 2^-15 per lane; in two blocks it is a
 * condition on an odd 32-bit multiplier, at most 2^(v-31) per lane with 2^v
 * the largest power of two dividing d1 (at most 2^-16).  So +d at j and -d at
 * j + 65536 (the same 16-bit key k) are caught unless m_l(b) and m_l(b+1)
 * agree in their low 32-v bits.  Swapping two units of a row keeps a lane
 * only when their keys are equal (2^-15 in one block; across blocks as for
 * pairs, d = the difference of the two units);
 * swapping two rows only when (r_i - r_i')(s_i - s_i') = 0 mod 2^32 for their
 * row keys and dot products s, about 2^(v-31) per lane with 2^v dividing
 * s_i - s_i'.  Changes of many units keep a lane with a probability of about
 * 2^(v-31), 2^v the largest power of two dividing all of them (bf16 sign
 * flips: v = 15).  The lanes draw their keys from independent bits of keyed
 * hashes, so a pattern keeps both with about the square of these figures.
 * Linear and keyed with a key every process of the job holds, this guards
 * against faults and bugs, not against someone who knows the key, or who can
 * read tables together with the bytes they cover (and solve for the keys):
 * it is no MAC.
 *
 * Ownership and threads: a key is immutable after creation and may be used
 * by any number of threads at once.  A plan copies what it needs from the
 * manifests (they may be destroyed afterwards), is immutable after creation
 * and may be shared by threads.  Every function is reentrant; functions that
 * take `threads` run helpers with refit_run_threads and return after all of
 * them.  Outputs are written only on success (except the documented partial
 * writes of refit_digest_table_fill into the caller's table).
 */
#ifndef REFIT_DATA_DIGEST_H
#define REFIT_DATA_DIGEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "refit/manifest.h"

typedef struct refit_digest_key refit_digest_key_t;

/* One digest or partial sum: lanes are uint32, arithmetic wraps mod 2^32. */
typedef struct {
    uint32_t lane[2];
} refit_dsum_t;

/* Which kernel a key uses.  Both give identical results. */
typedef enum {
    REFIT_DIGEST_IMPL_AUTO = 0,   /* AVX-512 when the CPU and OS have it, else AVX2 when the CPU has it, else scalar */
    REFIT_DIGEST_IMPL_SCALAR = 1, /* portable C */
    REFIT_DIGEST_IMPL_AVX2 = 2,   /* x86-64 AVX2 (_mm256_madd_epi16) */
    REFIT_DIGEST_IMPL_AVX512 = 3, /* x86-64 AVX-512 F + BW + VL (_mm512_madd_epi16, masked tails) */
} refit_digest_impl_t;

/* Derives the column-key tables and seeds from a 32-byte key (about 256 KiB).
 * *out is the caller's; destroy it with refit_digest_key_destroy.
 * REFIT_ERR_INVALID_ARG for NULL arguments, REFIT_ERR_NO_MEMORY. */
refit_status_t refit_digest_key_create(const uint8_t key[32], refit_digest_key_t **out);
/* The same with a chosen kernel (tests, benchmarks): REFIT_ERR_UNSUPPORTED
 * for AVX2 or AVX-512 (F, BW, VL) on a CPU, OS (no ZMM state) or build without it;
 * REFIT_ERR_INVALID_ARG for an unknown impl. */
refit_status_t refit_digest_key_create_impl(const uint8_t key[32], refit_digest_impl_t impl, refit_digest_key_t **out);
/* The kernel the key resolved to (SCALAR, AVX2 or AVX512, never AUTO). */
refit_digest_impl_t refit_digest_key_impl(const refit_digest_key_t *k);
/* "scalar", "avx2", "avx512" ("auto" for AUTO, "?" for others). */
const char *refit_digest_impl_name(refit_digest_impl_t impl);
/* NULL is accepted. */
void refit_digest_key_destroy(refit_digest_key_t *k);

/* ---- Low level: exposed for tests and for a fused copy+hash loop. ---- */

/* Keyed 64-bit id of a canonical tensor name (NUL-terminated). */
uint64_t refit_digest_tensor_id(const refit_digest_key_t *k, const char *canonical_name);
/* Row keys r_0(t,row), r_1(t,row): odd values. */
refit_dsum_t refit_digest_row_key(const refit_digest_key_t *k, uint64_t tensor_id, uint64_t row);
/* sum_{j < n} K[first_unit + j] * v_j, K with its block multipliers: n units
 * (2n bytes, any alignment) at `units`. */
refit_dsum_t refit_digest_dot(const refit_digest_key_t *k, const void *units, uint64_t first_unit, uint64_t n);
/* acc += r(t,row) * sum_{j < n} K[first_unit + j] * v_j: one row segment, e.g.
 * right after a copy loop wrote it, while it is in cache. */
void refit_digest_span(const refit_digest_key_t *k, uint64_t tensor_id, uint64_t row, uint64_t first_unit,
                       const void *p, uint64_t n, refit_dsum_t *acc);
/* acc += D(rows [row, row+nrows) x units [first_unit, first_unit+n)) with
 * row i at p + (i - row) * stride bytes: a strided copy region in one call. */
void refit_digest_rows(const refit_digest_key_t *k, uint64_t tensor_id, uint64_t row, uint64_t nrows,
                       uint64_t first_unit, const void *p, uint64_t stride, uint64_t n, refit_dsum_t *acc);
/* Copy and hash in one pass: copies nrows rows of n units (2n bytes each)
 * from src (row i at src + i * src_stride bytes) to dst (row i at dst + i *
 * dst_stride) and adds D(rows [row, row+nrows) x units [first_unit,
 * first_unit+n)) of the copied bytes to acc; bit for bit the result of the
 * copies followed by refit_digest_rows over dst, with every kernel.  Any
 * alignment and strides; src and dst must not overlap (memcpy's rule);
 * nrows or n 0 copies nothing and leaves acc.  A region that covers only a
 * piece of each row (the plan cuts rows across sources and regions) adds
 * exactly its share: D is additive, so the calls for the pieces of a box, in
 * any order and with any kernels, sum to D(box). */
void refit_digest_copy_rows(const refit_digest_key_t *k, uint64_t tensor_id, uint64_t row, uint64_t nrows,
                            uint64_t first_unit, void *dst, uint64_t dst_stride, const void *src, uint64_t src_stride,
                            uint64_t n, refit_dsum_t *acc);

/* ---- Work lists: the passes over memory, for kernels outside this folder (GPU). ---- */

/* Rows [row, row+nrows) x units [first_unit, first_unit+n) of the box of placement pl (canonical tensor
 * tensor_id), row i at p + (i - row) * stride bytes; rel: the item's first row counted from the box's first. */
typedef struct {
    const uint8_t *p;
    uint64_t stride, tensor_id, row, nrows, first_unit, n, rel;
    uint32_t pl;
} refit_digest_item_t;
/* The items refit_digest_local (table false: the placements it digests) or refit_digest_table_fill (table
 * true: every digestible placement) would hash, of about 512 KiB each, whole rows, in placement order;
 * bases[r] is region r's address (any address space: only offsets are added).  *items is malloc'ed, the
 * caller's (free); *n may be 0.  REFIT_ERR_INVALID_ARG, REFIT_ERR_NO_MEMORY. */
refit_status_t refit_digest_items(const refit_digest_key_t *k, const refit_manifest_t *m, const void *const *bases,
                                  bool table, refit_digest_item_t **items, size_t *n);
/* The 16-bit column keys of lane `lane` (65536 int16, odd) and the seeds a kernel elsewhere needs to
 * compute row keys and block multipliers exactly as this one does (data/digest_internal.h). */
const int16_t *refit_digest_key_columns(const refit_digest_key_t *k, int lane);
void refit_digest_key_seeds(const refit_digest_key_t *k, uint64_t *row_seed, uint64_t *blk_seed);

/* ---- Publisher: the table of a manifest. ---- */

/* Bytes of the table of a finalized manifest (0 if none of its placements
 * is digestible, or m is NULL or not finalized). */
uint64_t refit_digest_table_bytes(const refit_manifest_t *m);
/* Byte offset of each placement's P array in the table (its Q array follows
 * (rows + 1) entries later), UINT64_MAX for placements that are not
 * digestible; `offsets` has refit_manifest_num_placements(m) entries.
 * Returns the table's size, as refit_digest_table_bytes. */
uint64_t refit_digest_table_offsets(const refit_manifest_t *m, uint64_t *offsets);
/* Fills `table` (refit_digest_table_bytes(m) bytes, 8-byte aligned, the
 * caller's) from the memory of the manifest's regions: bases[r] is region r.
 * threads: 0 = one per CPU.  The memory must not change during the call.
 * Errors: REFIT_ERR_INVALID_ARG (NULL argument, manifest not finalized,
 * table not 8-byte aligned), REFIT_ERR_NO_MEMORY, REFIT_ERR_INTERNAL (a
 * placement's P and Q totals differ: the memory changed during the fill);
 * on failure the table's contents are unspecified. */
refit_status_t refit_digest_table_fill(const refit_digest_key_t *k, const refit_manifest_t *m, const void *const *bases,
                                       void *table, unsigned threads);

/* Bytes [off, off+len) of region `region`. */
typedef struct {
    uint32_t region;
    uint64_t off, len;
} refit_digest_range_t;
/* Updates `table`, the table of the memory at old_bases (refit_digest_table_fill's, or this function's), to the
 * table of the memory at bases, from the bytes that changed: ranges[0..nranges) must cover every byte where
 * the two differ, and must not overlap (a byte in two ranges counts twice); they may start or end anywhere,
 * even inside a 2-byte unit, and cover bytes that did not change.  The table is linear in the memory: a
 * unit changed by d at row i, column t of a box adds r(i) K[t] d to the P entries after row i and the Q
 * entries after column t, so the cost is that of the changed bytes (ranges in address order need no search)
 * plus one pass over the table entries of the placements they meet.  The same table as a fill of the new
 * memory, bit for bit.  Neither memory may change during the call.  Errors: REFIT_ERR_INVALID_ARG (NULL
 * argument, manifest not finalized, table not 8-byte aligned, a range outside its region or in a region with
 * no memory), REFIT_ERR_NO_MEMORY (the table unchanged), REFIT_ERR_INTERNAL (a placement's row and column totals
 * disagree: the memory changed during the call; the placements before it were updated, so the table must be
 * filled again). */
refit_status_t refit_digest_table_update(const refit_digest_key_t *k, const refit_manifest_t *m,
                                         const void *const *bases, const void *const *old_bases,
                                         const refit_digest_range_t *ranges, size_t nranges, void *table);

/* The same sums kept across calls and workers, for a caller that meets the changed bytes in a pass of its own
 * (a delta publisher's encoder: publisher.c).  create: for manifest m (kept, not copied).  note: bytes
 * [off, off + len) of region `region` may differ; `now` and `before` are that region's two memories (its byte
 * 0); worker w (< REFIT_DIGEST_CHANGES_WORKERS) is one thread's accumulator, a worker used by one thread at a
 * time; notes of one worker in address order need no search.  Returns false, and the sums become unusable until
 * the next apply or reset, on a range outside its region or out of memory.  apply: adds every worker's sums to
 * `table` (the table of the memories `before`, as refit_digest_table_update), then clears them; errors as
 * refit_digest_table_update's (a failed note: REFIT_ERR_NO_MEMORY, the table unchanged).  reset: drops the sums. */
#define REFIT_DIGEST_CHANGES_WORKERS 64
typedef struct refit_digest_changes refit_digest_changes_t;
refit_status_t refit_digest_changes_create(const refit_digest_key_t *k, const refit_manifest_t *m,
                                           refit_digest_changes_t **out);
bool refit_digest_changes_note(refit_digest_changes_t *c, unsigned w, uint32_t region, uint64_t off, uint64_t len,
                               const void *now, const void *before);
/* note for changed units: the n 2-byte units at region bytes off + 2 * units[i] (off even; units ascending) may
 * differ, the encoder's list of a sparse chunk (one call per chunk, not per unit). */
bool refit_digest_changes_note_units(refit_digest_changes_t *c, unsigned w, uint32_t region, uint64_t off,
                                     const uint16_t *units, uint32_t n, const void *now, const void *before);
refit_status_t refit_digest_changes_apply(refit_digest_changes_t *c, void *table);
void refit_digest_changes_reset(refit_digest_changes_t *c);
void refit_digest_changes_destroy(refit_digest_changes_t *c);

/* ---- Receiver: the digest plan. ---- */

/* Why a destination placement is or is not verifiable. */
typedef enum {
    REFIT_DIGEST_VERIFIABLE = 0,
    REFIT_DIGEST_UNV_NDIM = 1,         /* canonical tensor of ndim >= 3 */
    REFIT_DIGEST_UNV_ODD_BYTES = 2,    /* row, column start or width not whole 2-byte units */
    REFIT_DIGEST_UNV_CUT_BOTH = 3,     /* the box spans neither whole rows nor every row */
    REFIT_DIGEST_UNV_NO_PARTITION = 4, /* the distinct usable source boxes overlap or leave a gap */
    REFIT_DIGEST_UNV_SOURCE_BOX = 5,   /* a source box it needs is not digestible (odd bytes) */
    REFIT_DIGEST_REASON_COUNT = 6
} refit_digest_reason_t;
/* "verifiable", "ndim>=3", "odd-bytes", "cut-both", "no-partition", "source-box". */
const char *refit_digest_reason_name(refit_digest_reason_t r);

typedef struct refit_digest_plan refit_digest_plan_t;

/* Builds the digest plan of destination `dst` from sources srcs[0..nsrcs)
 * (all finalized; srcs[i] NULL is a missing rank; usable may be NULL = all,
 * else usable[i] != 0 says source i may be used).  Built once per (sources,
 * destination) and reused every step.  *out is the caller's.  Errors:
 * REFIT_ERR_INVALID_ARG (NULL dst/out, nsrcs > UINT32_MAX, a manifest not
 * finalized), REFIT_ERR_IDENTITY (a source of another model),
 * REFIT_ERR_MISMATCH (a tensor whose dtype or shape differs between a
 * source and dst), REFIT_ERR_NO_MEMORY.  Unverifiable placements are not
 * errors: they are counted in the stats and logged at INFO. */
refit_status_t refit_digest_plan_create(const refit_manifest_t *const *srcs, size_t nsrcs, const uint8_t *usable,
                                        const refit_manifest_t *dst, refit_digest_plan_t **out);
/* NULL is accepted. */
void refit_digest_plan_destroy(refit_digest_plan_t *p);

/* One table entry to fetch: 8 bytes at `offset` in source `src`'s table. */
typedef struct {
    uint32_t src;
    uint64_t offset;
} refit_digest_fetch_t;
/* The entries to fetch, sorted by source then offset, each once; the array
 * lives as long as the plan.  *n may be 0. */
const refit_digest_fetch_t *refit_digest_plan_fetches(const refit_digest_plan_t *p, size_t *n);
/* How the plan sums the fetched entries, for a check made elsewhere (the GPU's: verify/verify.h): the
 * expected digest of destination placement i (< *n, verifiable when refit_digest_plan_reason says so) is
 * the sum over terms [(*start)[i], (*start)[i+1]) of entry `fetch` of refit_digest_plan_fetches, added
 * (sign +1) or subtracted (-1), lane by lane mod 2^32: what refit_digest_check computes.  The arrays live
 * as long as the plan; *start has *n + 1 entries. */
typedef struct {
    uint32_t fetch;
    int32_t sign; /* +1 or -1 */
} refit_digest_term_t;
const refit_digest_term_t *refit_digest_plan_terms(const refit_digest_plan_t *p, const uint32_t **start, uint32_t *n);

typedef struct {
    uint64_t placements;                              /* destination placements */
    uint64_t verifiable;                              /* ... of which verifiable */
    uint64_t bytes;                                   /* bytes of all destination placements */
    uint64_t unverifiable_bytes;                      /* ... of the unverifiable ones */
    uint64_t fetches;                                 /* table entries to fetch */
    uint64_t unverifiable[REFIT_DIGEST_REASON_COUNT]; /* placements by reason ([0]: 0) */
} refit_digest_plan_stats_t;
void refit_digest_plan_stats(const refit_digest_plan_t *p, refit_digest_plan_stats_t *out);
/* Why destination placement i is (un)verifiable (i < placements). */
refit_digest_reason_t refit_digest_plan_reason(const refit_digest_plan_t *p, uint32_t i);

/* The receiver's own digests: out[i] = D(box of destination placement i) for
 * the placements whose box alone allows it (not ndim >= 3, odd bytes or cut
 * in both dimensions; 0 for those), computed from the memory of dst's
 * regions (bases[r] = region r); out has refit_manifest_num_placements(dst)
 * entries.  threads: 0 = one per CPU.  Errors: REFIT_ERR_INVALID_ARG (NULL
 * argument, dst not finalized), REFIT_ERR_NO_MEMORY. */
refit_status_t refit_digest_local(const refit_digest_key_t *k, const refit_manifest_t *dst, const void *const *bases,
                                  refit_dsum_t *out, unsigned threads);

typedef struct {
    uint64_t checked;    /* verifiable placements compared */
    uint64_t bytes;      /* their bytes */
    uint64_t mismatches; /* placements whose digests differ */
} refit_digest_report_t;
/* Compares: fetched = the 8 bytes of every fetch of the plan, in order (any
 * alignment); local = refit_digest_local's output for the plan's destination.
 * REFIT_ERR_VERIFY when any verifiable placement differs, with a detail naming
 * the first one's canonical tensor, its box, the destination placement and
 * the sources used, prefixed by the count when several differ;
 * REFIT_ERR_INVALID_ARG for NULL arguments (fetched may be NULL when there is
 * nothing to fetch).  report (may be NULL) is written whether or not the
 * digests match. */
refit_status_t refit_digest_check(const refit_digest_plan_t *p, const void *fetched, const refit_dsum_t *local,
                                  refit_digest_report_t *report);

/* ---- Receiver: the digest map, for copy paths that hash what they write. ---- */

/* Where the receiver's own digests live in its memory: for every placement
 * refit_digest_local digests, the byte ranges of its rows in their region,
 * with their canonical coordinates, sorted by (region, offset).  Built once
 * per destination manifest (it depends on nothing else) and immutable after;
 * it keeps a pointer to k (which must outlive it) and copies what it needs
 * of the manifest.  A copy path that moves every byte of a pull through
 * refit_digest_map_copy gets, in acc, exactly refit_digest_local's output for
 * the memory it wrote, without a second pass (docs/digest.md). */
typedef struct refit_digest_map refit_digest_map_t;
/* REFIT_ERR_INVALID_ARG (NULL, not finalized), REFIT_ERR_NO_MEMORY,
 * REFIT_ERR_INTERNAL (two placements' rows share bytes: not a finalized
 * manifest's). */
refit_status_t refit_digest_map_create(const refit_digest_key_t *k, const refit_manifest_t *dst,
                                       refit_digest_map_t **out);
/* NULL is accepted. */
void refit_digest_map_destroy(refit_digest_map_t *m);
/* Bytes the map's ranges cover: a pull whose copies hashed this many bytes
 * (each byte once: a plan writes every destination byte once) has summed
 * every placement refit_digest_local would. */
uint64_t refit_digest_map_bytes(const refit_digest_map_t *m);
/* Copies len bytes from src to dst, which is byte `off` of the destination's
 * region `region`, and adds the digest of the mapped bytes among them into
 * acc[placement] (acc: one entry per destination placement; added with
 * atomic operations, so any number of threads may share it).  src NULL:
 * dst already holds the bytes (a copy that was not this one, e.g. a
 * transport's receive): hash them in place.  A piece may start or end
 * anywhere, even inside a 2-byte unit (a unit's low and high byte add up
 * separately: v = lo + 256 * (int8)hi).  src and dst must not overlap.
 * Returns the mapped bytes hashed (count them against
 * refit_digest_map_bytes).  A region out of range hashes nothing. */
uint64_t refit_digest_map_copy(const refit_digest_map_t *m, uint32_t region, uint64_t off, void *dst, const void *src,
                               uint64_t len, refit_dsum_t *acc);
/* The same for nrows runs of len bytes, run i at off + i * dst_stride (dst +
 * i * dst_stride) from src + i * src_stride: a plan region's innermost loop
 * in one call, and in one kernel call when its rows are consecutive rows of
 * one placement (each run at the same column of its row, whole units),
 * else run by run.  Returns the mapped bytes hashed. */
uint64_t refit_digest_map_copy_rows(const refit_digest_map_t *m, uint32_t region, uint64_t off, uint64_t dst_stride,
                                    void *dst, const void *src, uint64_t src_stride, uint64_t len, uint64_t nrows,
                                    refit_dsum_t *acc);
/* Moves the sums in `from` (one entry per destination placement, like acc)
 * of every placement with mapped bytes in [off, off + len) of region
 * `region` into acc (added atomically; NULL acc: dropped), and zeroes those
 * entries of `from`.  A copy that may have to be thrown away (a fleet chunk
 * read that another read of the same chunk overlapped) hashes into a
 * scratch array of its own; this keeps its sums or drops them, touching only
 * the entries of the placements the copy could have written.  `from` is the
 * caller's alone (not atomic). */
void refit_digest_map_fold(const refit_digest_map_t *m, uint32_t region, uint64_t off, uint64_t len, refit_dsum_t *from,
                           refit_dsum_t *acc);
/* Where the last update was (refit_digest_map_update) and the sums its
 * units have not yet added into acc: zero it before the first ({0}), one per
 * thread, and refit_digest_cursor_flush it before reading acc. */
typedef struct {
    const void *seg;
    uint64_t row;    /* UINT64_MAX: none kept */
    uint64_t row_lo; /* the region byte where row `row` of seg starts (a unit in it needs no division) */
    uint32_t r[2];
    uint64_t blk; /* 1 + the key block whose multipliers mb holds (0: none) */
    uint32_t mb[2];
    refit_dsum_t *pacc; /* NULL: nothing pending */
    uint32_t ppl;       /* the placement of the pending sums */
    uint32_t pend[2];
} refit_digest_cursor_t;
/* Overwrites len bytes at dst (byte `off` of region `region`) with src's
 * and adds, for the mapped bytes among them, D(new) - D(old) into acc
 * (atomically): the sums of memory that held them stay the sums of memory
 * that holds them now (a delta's apply: the cost is that of the changed
 * bytes, not of the memory).  One aligned 2-byte unit (a sparse change)
 * takes a fast path that keeps its segment and row key in c and sums its
 * change in c while the placement stays the same (an atomic add per unit
 * waits for every store before it, the write of each changed unit's cache
 * line among them); anything else is hashed before and after the copy.
 * src must not be NULL. */
void refit_digest_map_update(const refit_digest_map_t *m, refit_digest_cursor_t *c, uint32_t region, uint64_t off,
                             void *dst, const void *src, uint64_t len, refit_dsum_t *acc);
/* refit_digest_map_update of n 2-byte units: unit x's new value vals[x] (host order) at byte offs[x] of region
 * `region`, whose memory starts at dst.  The units of one segment are summed together, 16 at a time with the
 * AVX-512 kernel (a sparse delta's apply, docs/digest.md). */
void refit_digest_map_update_units(const refit_digest_map_t *m, refit_digest_cursor_t *c, uint32_t region, uint8_t *dst,
                                   const uint64_t *offs, const uint16_t *vals, uint32_t n, refit_dsum_t *acc);
/* Adds the sums c holds into their acc (atomically); c stays usable. */
void refit_digest_cursor_flush(refit_digest_cursor_t *c);

#endif
