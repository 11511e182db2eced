/* The digest's passes over memory: the receiver's box sums of its own placements (refit_digest_local) and the
 * publisher's table of row and column sums (refit_digest_table_fill); the kernels are in digest_kernel.c,
 * which sums a receiver compares in digest_plan.c.
 *
 * Work is split into items of whole rows of one placement (up to ITEM_BYTES)
 * that threads take from a shared counter; sums mod 2^32 do not depend on
 * the split, so results are identical for any thread count. */
#include <string.h>

#include "data/digest_internal.h"

#define ITEM_BYTES (512u << 10)

/* ------------------------------------------------ table layout */

uint64_t refit_digest_table_offsets(const refit_manifest_t *m, uint64_t *offsets)
{
    if (!m || !m->finalized) return 0;
    uint64_t off = 0;
    for (size_t i = 0; i < m->placements.len; i++) {
        const refit_placement_t *p = &m->placements.data[i];
        cbox_t b;
        if (cbox_of(&m->canon.data[p->canon], p, &b) != REFIT_DIGEST_VERIFIABLE) {
            if (offsets) offsets[i] = UINT64_MAX;
            continue;
        }
        if (offsets) offsets[i] = off;
        off += table_entries(&b) * 8;
    }
    return off;
}

uint64_t refit_digest_table_bytes(const refit_manifest_t *m) { return refit_digest_table_offsets(m, NULL); }

uint64_t digest_box_offset(const refit_manifest_t *m, const refit_placement_t *p, uint64_t *stride)
{
    const refit_local_t *l = &m->locals.data[p->local];
    uint64_t es = refit_dtype_size(l->d.dtype), lst[REFIT_MAX_DIMS];
    refit_tdesc_strides(&l->d, lst);
    *stride = p->ndim == 2 ? lst[l->d.ndim - 2] * es : 0;
    return l->offset + refit_placement_local_index(m, p, p->canon_offset) * es;
}

/* Address of the box's first unit and the bytes between its rows. */
static const uint8_t *box_memory(const refit_manifest_t *m, const refit_placement_t *p, const void *const *bases,
                                 uint64_t *stride)
{
    return (const uint8_t *)bases[m->locals.data[p->local].region] + digest_box_offset(m, p, stride);
}

/* ------------------------------------------------ work items and threads */

/* Rows [rel, rel+nrows) of the box of placement pl. */
typedef struct {
    const uint8_t *p; /* first unit of the item's first row */
    uint64_t stride, tid, row, nrows, j, n, rel;
    uint32_t pl;
    bool whole; /* the item is its placement's whole box */
} item_t;

typedef REFIT_VEC(item_t) items_t;

/* Splits a box into items of about ITEM_BYTES (whole rows). */
static int push_items(items_t *v, uint32_t pl, const cbox_t *b, uint64_t tid, const uint8_t *p, uint64_t stride)
{
    uint64_t rowb = REFIT_MAX(b->n * 2, 1), per = REFIT_MAX(ITEM_BYTES / rowb, 1);
    for (uint64_t r = 0; r < b->nrows; r += per) {
        item_t it = {.p = p + r * stride,
                     .stride = stride,
                     .tid = tid,
                     .row = b->a + r,
                     .nrows = REFIT_MIN(per, b->nrows - r),
                     .j = b->c,
                     .n = b->n,
                     .rel = r,
                     .pl = pl,
                     .whole = per >= b->nrows};
        if (REFIT_VEC_PUSH(v, it)) return -1;
    }
    return 0;
}

static size_t next_index(size_t *counter) { return __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED); }

/* ------------------------------------------------------ receiver's own */

typedef struct {
    const refit_digest_key_t *k;
    const item_t *items;
    size_t nitems, next;
    refit_dsum_t *part; /* per item */
} local_job_t;

static void *local_worker(void *arg)
{
    local_job_t *J = arg;
    for (size_t i; (i = next_index(&J->next)) < J->nitems;) {
        const item_t *it = &J->items[i];
        digest_rows_any(J->k, it->tid, it->row, it->nrows, it->j, it->p, it->stride, it->n, J->part[i].lane);
    }
    return NULL;
}

uint64_t *digest_tensor_ids(const refit_digest_key_t *k, const refit_manifest_t *m)
{
    uint64_t *t = malloc(REFIT_MAX(m->canon.len, 1) * sizeof(*t));
    if (t)
        for (size_t c = 0; c < m->canon.len; c++) t[c] = refit_digest_tensor_id(k, m->canon.data[c].name);
    return t;
}

refit_status_t refit_digest_local(const refit_digest_key_t *k, const refit_manifest_t *dst, const void *const *bases,
                                  refit_dsum_t *out, unsigned threads)
{
    if (!k || !dst || !bases || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_local: NULL argument");
    if (!dst->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_local: manifest is not finalized");
    refit_status_t st = REFIT_OK;
    items_t items = {0};
    refit_dsum_t *part = NULL;
    uint64_t *tids = digest_tensor_ids(k, dst);
    if (!tids) goto oom;
    for (uint32_t i = 0; i < dst->placements.len; i++) {
        const refit_placement_t *p = &dst->placements.data[i];
        cbox_t b;
        if (cbox_of(&dst->canon.data[p->canon], p, &b) != REFIT_DIGEST_VERIFIABLE) continue;
        if (!cbox_full_rows(&b) && !cbox_all_rows(&b)) continue;
        uint64_t stride;
        const uint8_t *mem = box_memory(dst, p, bases, &stride);
        if (push_items(&items, i, &b, tids[p->canon], mem, stride)) goto oom;
    }
    part = calloc(REFIT_MAX(items.len, 1), sizeof(*part));
    if (!part) goto oom;
    local_job_t J = {.k = k, .items = items.data, .nitems = items.len, .part = part};
    if (items.len <= 1) threads = 1;
    refit_run_threads(local_worker, &J, threads);
    memset(out, 0, dst->placements.len * sizeof(*out));
    for (size_t i = 0; i < items.len; i++) {
        out[items.data[i].pl].lane[0] += part[i].lane[0];
        out[items.data[i].pl].lane[1] += part[i].lane[1];
    }
    goto done;
oom:
    st = refit_error(REFIT_ERR_NO_MEMORY, "digest: work list of %u placements", (unsigned)dst->placements.len);
done:
    free(part);
    REFIT_VEC_FREE(&items);
    free(tids);
    return st;
}

/* ------------------------------------------------------------ publisher */

typedef struct {
    const refit_digest_key_t *k;
    const item_t *items;
    size_t nitems, next;
    uint32_t *table;      /* entries: 2 uint32 each */
    const uint64_t *offs; /* per placement: P offset (bytes) */
    const cbox_t *boxes;  /* per placement */
    uint64_t max_n;
    /* finalize phase */
    const uint32_t *pls; /* digestible placements */
    size_t npls, next_pl;
    int failed;    /* a worker's scratch allocation failed */
    size_t bad_pl; /* SIZE_MAX or a placement whose P and Q totals differ */
} fill_job_t;

static void *fill_worker(void *arg)
{
    fill_job_t *J = arg;
    uint32_t *g = malloc(REFIT_MAX(J->max_n, 1) * 2 * sizeof(uint32_t));
    size_t sb = digest_pub_scratch_bytes(J->k, J->max_n);
    void *scratch = sb ? aligned_alloc(64, (sb + 63) / 64 * 64) : NULL;
    if (!g || (sb && !scratch)) {
        __atomic_store_n(&J->failed, 1, __ATOMIC_RELAXED);
        free(g);
        free(scratch);
        return NULL;
    }
    for (size_t i; (i = next_index(&J->next)) < J->nitems;) {
        const item_t *it = &J->items[i];
        uint32_t *g0 = g, *g1 = g + it->n;
        uint32_t *P = J->table + J->offs[it->pl] / 4;
        uint32_t *Q = P + 2 * (J->boxes[it->pl].nrows + 1);
        digest_pub_rows_any(J->k, it->tid, it->row, it->nrows, it->j, it->p, it->stride, it->n, P + 2 * (it->rel + 1),
                            g, scratch);
        if (it->whole) {
            for (uint64_t t = 0; t < it->n; t++) {
                Q[2 * (t + 1)] = g0[t];
                Q[2 * (t + 1) + 1] = g1[t];
            }
        } else {
            for (uint64_t t = 0; t < it->n; t++) {
                __atomic_fetch_add(&Q[2 * (t + 1)], g0[t], __ATOMIC_RELAXED);
                __atomic_fetch_add(&Q[2 * (t + 1) + 1], g1[t], __ATOMIC_RELAXED);
            }
        }
    }
    free(g);
    free(scratch);
    return NULL;
}

/* P: row terms -> prefix sums.  Q: column sums gamma_j -> prefix sums of K[j] * gamma_j, K[j] with its
 * block's multiplier (one keyed hash per block the box's columns meet). */
static void *finalize_worker(void *arg)
{
    fill_job_t *J = arg;
    const refit_digest_key_t *k = J->k;
    for (size_t x; (x = next_index(&J->next_pl)) < J->npls;) {
        uint32_t pl = J->pls[x];
        const cbox_t *b = &J->boxes[pl];
        uint32_t *P = J->table + J->offs[pl] / 4, *Q = P + 2 * (b->nrows + 1);
        uint32_t s0 = 0, s1 = 0;
        P[0] = P[1] = 0;
        for (uint64_t r = 1; r <= b->nrows; r++) {
            s0 += P[2 * r];
            s1 += P[2 * r + 1];
            P[2 * r] = s0;
            P[2 * r + 1] = s1;
        }
        uint32_t q0 = 0, q1 = 0, m[2] = {1, 1};
        uint64_t blk = UINT64_MAX;
        Q[0] = Q[1] = 0;
        for (uint64_t t = 0; t < b->n; t++) {
            uint64_t j = b->c + t;
            size_t jj = (size_t)(j & (KCOLS - 1));
            if (j >> KBITS != blk) block_mult(k, blk = j >> KBITS, m);
            q0 += m[0] * (uint32_t)(int32_t)k->kc[0][jj] * Q[2 * (t + 1)];
            q1 += m[1] * (uint32_t)(int32_t)k->kc[1][jj] * Q[2 * (t + 1) + 1];
            Q[2 * (t + 1)] = q0;
            Q[2 * (t + 1) + 1] = q1;
        }
        if (q0 != s0 || q1 != s1) {
            size_t none = SIZE_MAX;
            __atomic_compare_exchange_n(&J->bad_pl, &none, (size_t)pl, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

refit_status_t refit_digest_table_fill(const refit_digest_key_t *k, const refit_manifest_t *m, const void *const *bases,
                                       void *table, unsigned threads)
{
    if (!k || !m || !bases || (!table && refit_digest_table_bytes(m)))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_table_fill: NULL argument");
    if (!m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_table_fill: manifest is not finalized");
    if ((uintptr_t)table % 8)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_table_fill: table not 8-byte aligned");
    refit_status_t st = REFIT_OK;
    size_t np = m->placements.len;
    items_t items = {0};
    uint64_t *offs = malloc(REFIT_MAX(np, 1) * sizeof(*offs));
    cbox_t *boxes = calloc(REFIT_MAX(np, 1), sizeof(*boxes));
    uint32_t *pls = malloc(REFIT_MAX(np, 1) * sizeof(*pls));
    uint64_t *tids = digest_tensor_ids(k, m);
    if (!offs || !boxes || !pls || !tids) goto oom;
    refit_digest_table_offsets(m, offs);
    size_t npls = 0;
    uint64_t max_n = 0;
    for (uint32_t i = 0; i < np; i++) {
        if (offs[i] == UINT64_MAX) continue;
        const refit_placement_t *p = &m->placements.data[i];
        cbox_of(&m->canon.data[p->canon], p, &boxes[i]);
        uint64_t stride;
        const uint8_t *mem = box_memory(m, p, bases, &stride);
        size_t first = items.len;
        if (push_items(&items, i, &boxes[i], tids[p->canon], mem, stride)) goto oom;
        if (items.len - first > 1) /* several items add into the Q slots */
            memset((uint8_t *)table + offs[i] + (boxes[i].nrows + 1) * 8, 0, (boxes[i].n + 1) * 8);
        max_n = REFIT_MAX(max_n, boxes[i].n);
        pls[npls++] = i;
    }
    fill_job_t J = {.k = k,
                    .items = items.data,
                    .nitems = items.len,
                    .table = table,
                    .offs = offs,
                    .boxes = boxes,
                    .max_n = max_n,
                    .pls = pls,
                    .npls = npls,
                    .bad_pl = SIZE_MAX};
    unsigned t1 = threads, t2 = threads;
    if (items.len <= 1) t1 = 1;
    if (npls <= 1) t2 = 1;
    refit_run_threads(fill_worker, &J, t1);
    if (J.failed) goto oom;
    refit_run_threads(finalize_worker, &J, t2);
    if (J.bad_pl != SIZE_MAX) {
        const refit_placement_t *p = &m->placements.data[J.bad_pl];
        st = refit_error(REFIT_ERR_INTERNAL,
                         "digest table of %s rank %u: placement %zu (%s) sums differently by rows and by columns: "
                         "its memory changed during the fill",
                         m->layout, m->rank, J.bad_pl, m->canon.data[p->canon].name);
    }
    goto done;
oom:
    st = refit_error(REFIT_ERR_NO_MEMORY, "digest table of %s rank %u: work list", m->layout, m->rank);
done:
    REFIT_VEC_FREE(&items);
    free(offs);
    free(boxes);
    free(pls);
    free(tids);
    return st;
}

/* ------------------------------------------------------------ work lists */

refit_status_t refit_digest_items(const refit_digest_key_t *k, const refit_manifest_t *m, const void *const *bases,
                                  bool table, refit_digest_item_t **out, size_t *nout)
{
    if (!k || !m || !bases || !out || !nout)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_items: NULL argument");
    if (!m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_items: manifest is not finalized");
    items_t items = {0};
    uint64_t *tids = digest_tensor_ids(k, m);
    bool oom = !tids;
    for (uint32_t i = 0; !oom && i < m->placements.len; i++) {
        const refit_placement_t *p = &m->placements.data[i];
        cbox_t b;
        if (cbox_of(&m->canon.data[p->canon], p, &b) != REFIT_DIGEST_VERIFIABLE) continue;
        if (!table && !cbox_full_rows(&b) && !cbox_all_rows(&b)) continue;
        uint64_t stride;
        const uint8_t *mem = box_memory(m, p, bases, &stride);
        oom = push_items(&items, i, &b, tids[p->canon], mem, stride) != 0;
    }
    free(tids);
    refit_digest_item_t *v = oom ? NULL : malloc(REFIT_MAX(items.len, 1) * sizeof(*v));
    if (!v) {
        REFIT_VEC_FREE(&items);
        return refit_error(REFIT_ERR_NO_MEMORY, "digest: work list of %u placements", (unsigned)m->placements.len);
    }
    for (size_t i = 0; i < items.len; i++) {
        const item_t *it = &items.data[i];
        v[i] = (refit_digest_item_t){.p = it->p,
                                     .stride = it->stride,
                                     .tensor_id = it->tid,
                                     .row = it->row,
                                     .nrows = it->nrows,
                                     .first_unit = it->j,
                                     .n = it->n,
                                     .rel = it->rel,
                                     .pl = it->pl};
    }
    *out = v;
    *nout = items.len;
    REFIT_VEC_FREE(&items);
    return REFIT_OK;
}
