/* Quantize-on-copy: a bf16 plan turned into a table that writes an FP8
 * receiver's arena (refit/experimental/fp8.h) straight from the bf16 sources.
 *
 * The receiver plans its bf16 layout from the trainer's shards as usual; the
 * table then says, for every 128x128 block of every quantized weight matrix,
 * where its rows lie in the sources: a list of pieces, each a box of the
 * block whose rows are evenly spaced in one source region.  A kernel takes a
 * block, gathers it (one piece covering the whole block is the common case,
 * read with 16-byte loads), takes its amax, and writes e4m3 bytes and the
 * block's scale: the bf16 bytes are read once and never written anywhere.
 * Elements no piece covers are the plan's padding (zeros), quantized as
 * zeros.  Tensors the target keeps as they are (embeddings, norms, router)
 * are the plan's own regions and fills, moved to their place in the arena:
 * an ordinary batch table (plan/batch.h) with the same slots.
 *
 * Slots are numbered as in plan/batch.h: the sources' regions first
 * (src_slot_base[s] + region), then the arena (dst_slot). */
#ifndef REFIT_PLAN_FP8_TABLE_H
#define REFIT_PLAN_FP8_TABLE_H

#include "plan/batch.h"
#include "refit/experimental/fp8.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t first_block;  /* prefix sum of blocks over the matrices */
    uint64_t dst_offset;   /* the matrix's e4m3 bytes in the arena (row stride: cols) */
    uint64_t scale_offset; /* its scales in the arena: fp32 [ceil(rows/128)][bcols] */
    uint32_t rows, cols, bcols, pad_;
} refit_fp8_matrix_t;

typedef struct {
    uint64_t src_offset; /* bytes from the slot's base to element (r0, c0) */
    uint64_t src_stride; /* bytes between consecutive rows */
    uint32_t src_slot;
    uint8_t r0, r1, c0, c1; /* the box inside the block: rows [r0, r1), columns [c0, c1) (r1, c1 <= 128) */
} refit_fp8_piece_t;

typedef struct {
    refit_fp8_matrix_t *mats;
    uint32_t nmats;
    uint64_t nblocks;
    uint32_t *block_piece; /* nblocks + 1: pieces of block b are [block_piece[b], block_piece[b+1]) */
    refit_fp8_piece_t *pieces;
    uint64_t npieces;
    uint64_t full_blocks;    /* whole 128x128 blocks of one 16-byte aligned piece (the kernel's fast path) */
    uint32_t *fast, *slow;   /* the blocks that are (full_blocks of them) and are not (nblocks - full_blocks) */
    uint64_t quantized_bf16; /* bf16 bytes the pieces read */
    uint64_t quantized_out;  /* e4m3 and scale bytes written */
    refit_batch_t copy;      /* kept tensors and their padding, in the arena; slots as below */
    uint32_t nsrcs;
    uint32_t *src_slot_base;   /* nsrcs + 1 */
    uint32_t dst_slot, nslots; /* the arena's slot; slots in all */
} refit_fp8_table_t;

/* From a plan whose destination is the bf16 manifest `bf16` (one region)
 * and the FP8 target made from it.  o: the copy batch's options (chunk,
 * max_shift, only; copies and fills are both taken).  REFIT_ERR_GEOMETRY if
 * a region does not fit the target (odd offsets, a region across a matrix
 * edge the table cannot split). */
refit_status_t refit_fp8_table_build(const refit_plan_t *plan, const refit_manifest_t *bf16,
                                     const refit_fp8_target_t *t, const refit_batch_opts_t *o, refit_fp8_table_t *out);
void refit_fp8_table_free(refit_fp8_table_t *x);

/* Matrix of block b (the last whose first_block <= b). */
REFIT_HD static inline uint32_t refit_fp8_table_matrix(const refit_fp8_matrix_t *m, uint32_t n, uint64_t b)
{
    uint32_t i;
    REFIT_HD_LAST_LE(i, m, n, first_block, b);
    return i;
}

/* Runs the table on the CPU, block by block (the reference for the kernel:
 * the same pieces, the same arithmetic, fp8_hd.h); slots[i] is slot i's base. */
refit_status_t refit_fp8_table_execute_host(const refit_fp8_table_t *x, void *const *slots);

#ifdef __cplusplus
}
#endif
#endif
