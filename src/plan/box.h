/* N-d boxes (offset + extent per dimension) and the operations the planner and
 * the manifest validator need: intersection, containment, subtraction and a
 * sort-and-sweep overlap detector. */
#ifndef REFIT_BOX_H
#define REFIT_BOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "refit/types.h"

typedef struct {
    uint32_t ndim;
    uint64_t off[REFIT_MAX_DIMS];
    uint64_t ext[REFIT_MAX_DIMS];
} refit_box_t;

/* Product of extents (no overflow check: callers validated shapes). */
uint64_t refit_box_volume(const refit_box_t *b);
/* True and *out = a ∩ b if they share at least one element (same ndim). */
bool refit_box_intersect(const refit_box_t *a, const refit_box_t *b, refit_box_t *out);
/* True if inner lies entirely inside outer. */
bool refit_box_contains(const refit_box_t *outer, const refit_box_t *inner);
/* Orders boxes of the same ndim by offset, then extent, dimension by dimension (for sorting). */
int refit_box_cmp(const refit_box_t *a, const refit_box_t *b);
/* a minus b as at most 2*ndim disjoint boxes written to out; returns the count.
 * If a and b do not intersect, out[0] = a and 1 is returned. */
size_t refit_box_subtract(const refit_box_t *a, const refit_box_t *b, refit_box_t out[2 * REFIT_MAX_DIMS]);

/* Overlap detection over n boxes, each tagged with a group (boxes of different
 * groups never conflict: e.g. placements into different local tensors).
 * Sort-and-sweep along dimension 0, O(n log n + k) for k candidate pairs that
 * overlap in dimension 0.  Returns true and the indices of one overlapping
 * pair (*i < *j) if any two boxes of the same group share an element.
 * Returns -1 through *err on OOM (and false). */
bool refit_boxes_find_overlap(const refit_box_t *boxes, const uint32_t *groups, size_t n, size_t *i, size_t *j,
                              int *err);

/* Formats a box as "[a:b, c:d]" into buf; returns buf. */
char *refit_box_format(const refit_box_t *b, char *buf, size_t size);

#endif
