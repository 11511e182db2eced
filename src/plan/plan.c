/* The reshard planner.
 *
 * 1. Index: every canonical tensor the destination places is looked up in
 *    every source (dtype and shape must agree); source placements are
 *    bucketed by destination canonical id.
 * 2. Cover: each destination placement box B is covered greedily by distinct
 *    source boxes (replicas of the same box form one group): uncovered parts
 *    of B are intersected with each group's box and the remainder is kept as
 *    the result of box subtraction.  Anything left uncovered fails the plan.
 * 3. Choose: each piece goes to the least-loaded replica of its group (ties
 *    rotate by the destination rank); large pieces are split by rows across
 *    replicas so that all of them serve at once.
 * 4. Lower: a piece becomes one strided region: trailing dimensions that are
 *    contiguous on both sides merge into the run, the rest become loops.
 * 5. Prove: pieces of one destination box are pairwise disjoint (sweep), lie
 *    inside it and inside their source box, and their volumes add up; every
 *    region lies inside its memory regions.  Then coalesce.
 * Padding (local bytes no placement covers) becomes zero-fill regions. */
#include "plan/plan.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "plan/box.h"

typedef struct {
    uint32_t src;       /* source index */
    uint32_t placement; /* placement index in that source */
    refit_box_t box;    /* canonical box it holds */
} cand_t;

typedef REFIT_VEC(refit_box_t) boxvec_t;

typedef struct {
    refit_box_t box; /* canonical coordinates */
    uint32_t dst_pl; /* destination placement */
    uint32_t src, src_pl;
} piece_t;

typedef struct {
    const refit_manifest_t *const *srcs;
    size_t nsrcs;
    const refit_manifest_t *dst;
    refit_plan_params_t params;
    uint32_t seed;
    /* candidates bucketed by destination canonical id (CSR) */
    size_t *bucket_start;
    cand_t *cands;
    REFIT_VEC(piece_t) pieces;
    uint64_t *load; /* bytes assigned per source so far */
    refit_plan_t *plan;
} planner_t;

uint64_t refit_plan_region_bytes(const refit_plan_region_t *r)
{
    uint64_t b = r->run;
    for (uint32_t i = 0; i < r->nloops; i++) b *= r->count[i];
    return b;
}

uint64_t refit_region_src_end(const refit_plan_region_t *r)
{
    uint64_t e = r->src_offset + r->run;
    for (uint32_t i = 0; i < r->nloops; i++) e += (r->count[i] - 1) * r->src_stride[i];
    return e;
}

uint64_t refit_region_dst_end(const refit_plan_region_t *r)
{
    uint64_t e = r->dst_offset + r->run;
    for (uint32_t i = 0; i < r->nloops; i++) e += (r->count[i] - 1) * r->dst_stride[i];
    return e;
}

static int cmp_cand(const void *pa, const void *pb)
{
    const cand_t *a = pa, *b = pb;
    int c = refit_box_cmp(&a->box, &b->box);
    if (c) return c;
    if (a->src != b->src) return a->src < b->src ? -1 : 1;
    return a->placement < b->placement ? -1 : (a->placement > b->placement);
}

static bool same_desc(const refit_tdesc_t *a, const refit_tdesc_t *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (uint32_t d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

static void shape_str(const refit_tdesc_t *t, char *buf, size_t n)
{
    size_t pos = (size_t)snprintf(buf, n, "%s[", refit_dtype_name(t->dtype));
    for (uint32_t d = 0; d < t->ndim && pos < n; d++)
        pos += (size_t)snprintf(buf + pos, n - pos, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
    if (pos < n) snprintf(buf + pos, n - pos, "]");
}

/* Step 1: check identities, dtypes and shapes; bucket candidates. */
static refit_status_t build_index(planner_t *P)
{
    const refit_manifest_t *dst = P->dst;
    size_t nc = dst->canon.len, total = 0;
    for (size_t s = 0; s < P->nsrcs; s++) {
        const refit_manifest_t *m = P->srcs[s];
        if (!m) continue;
        if (!m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "source %zu's manifest is not finalized", s);
        if (strcmp(m->model, dst->model) != 0)
            return refit_error(REFIT_ERR_IDENTITY, "source %zu (%s rank %u) describes model %s, the destination %s", s,
                               m->layout, m->rank, m->model, dst->model);
        total += m->placements.len;
    }
    P->bucket_start = calloc(nc + 1, sizeof(size_t));
    P->cands = malloc((total ? total : 1) * sizeof(cand_t));
    uint32_t **map = calloc(P->nsrcs ? P->nsrcs : 1, sizeof(uint32_t *));
    refit_status_t st = REFIT_OK;
    if (!P->bucket_start || !P->cands || !map) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "planner index");
        goto out;
    }
    /* Map each source canonical id to the destination's id (or UINT32_MAX). */
    for (size_t s = 0; s < P->nsrcs; s++) {
        const refit_manifest_t *m = P->srcs[s];
        if (!m) continue;
        map[s] = malloc((m->canon.len ? m->canon.len : 1) * sizeof(uint32_t));
        if (!map[s]) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "planner index");
            goto out;
        }
        for (size_t c = 0; c < m->canon.len; c++) {
            uint32_t d;
            map[s][c] = UINT32_MAX;
            if (!refit_strmap_get(&dst->canon_index, m->canon.data[c].name, &d)) continue;
            if (!same_desc(&m->canon.data[c], &dst->canon.data[d])) {
                char a[96], b[96];
                shape_str(&m->canon.data[c], a, sizeof(a));
                shape_str(&dst->canon.data[d], b, sizeof(b));
                st = refit_error(REFIT_ERR_MISMATCH,
                                 "tensor %s is %s in source %zu (%s rank %u) but %s in the destination",
                                 m->canon.data[c].name, a, s, m->layout, m->rank, b);
                goto out;
            }
            map[s][c] = d;
        }
        for (size_t i = 0; i < m->placements.len; i++) {
            uint32_t d = map[s][m->placements.data[i].canon];
            if (d != UINT32_MAX) P->bucket_start[d + 1]++;
        }
    }
    for (size_t c = 0; c < nc; c++) P->bucket_start[c + 1] += P->bucket_start[c];
    size_t *fill = malloc((nc ? nc : 1) * sizeof(size_t));
    if (!fill) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "planner index");
        goto out;
    }
    memcpy(fill, P->bucket_start, nc * sizeof(size_t));
    for (size_t s = 0; s < P->nsrcs; s++) {
        const refit_manifest_t *m = P->srcs[s];
        if (!m) continue;
        for (size_t i = 0; i < m->placements.len; i++) {
            uint32_t d = map[s][m->placements.data[i].canon];
            if (d == UINT32_MAX) continue;
            cand_t *c = &P->cands[fill[d]++];
            c->src = (uint32_t)s;
            c->placement = (uint32_t)i;
            c->box = refit_placement_box(&m->placements.data[i]);
        }
    }
    free(fill);
    for (size_t c = 0; c < nc; c++)
        qsort(P->cands + P->bucket_start[c], P->bucket_start[c + 1] - P->bucket_start[c], sizeof(cand_t), cmp_cand);
out:
    for (size_t s = 0; map && s < P->nsrcs; s++) free(map[s]);
    free(map);
    return st;
}

static refit_status_t push_piece(planner_t *P, const refit_box_t *box, uint32_t dst_pl, const cand_t *c)
{
    piece_t p = {*box, dst_pl, c->src, c->placement};
    if (REFIT_VEC_PUSH(&P->pieces, p)) return refit_error(REFIT_ERR_NO_MEMORY, "planner pieces");
    P->load[c->src] += refit_box_volume(box) *
                       refit_dtype_size(P->dst->canon.data[P->dst->placements.data[dst_pl].canon].dtype);
    return REFIT_OK;
}

/* The least-loaded replica among group[0..n); ties rotate with the seed. */
static const cand_t *pick_replica(const planner_t *P, const cand_t *group, size_t n)
{
    const cand_t *best = NULL;
    uint64_t best_key_load = 0, best_key_rot = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t load = P->load[group[i].src];
        uint64_t rot = (group[i].src + P->nsrcs - (P->seed % (P->nsrcs ? P->nsrcs : 1))) % (P->nsrcs ? P->nsrcs : 1);
        if (!best || load < best_key_load || (load == best_key_load && rot < best_key_rot)) {
            best = &group[i];
            best_key_load = load;
            best_key_rot = rot;
        }
    }
    return best;
}

/* Step 3 for one piece covered by a replica group. */
static refit_status_t assign(planner_t *P, const refit_box_t *piece, uint32_t dst_pl, const cand_t *group, size_t n)
{
    refit_status_t st;
    size_t es = refit_dtype_size(P->dst->canon.data[P->dst->placements.data[dst_pl].canon].dtype);
    uint64_t bytes = refit_box_volume(piece) * es;
    uint64_t split = P->params.split_bytes ? P->params.split_bytes : (4u << 20);
    uint64_t chunks = 1;
    if (n > 1 && bytes > split && piece->ext[0] > 1) {
        chunks = (bytes + split - 1) / split;
        if (chunks > n) chunks = n;
        if (chunks > piece->ext[0]) chunks = piece->ext[0];
    }
    uint64_t rows = piece->ext[0], done = 0;
    for (uint64_t k = 0; k < chunks; k++) {
        refit_box_t b = *piece;
        uint64_t take = rows / chunks + (k < rows % chunks ? 1 : 0);
        b.off[0] = piece->off[0] + done;
        b.ext[0] = take;
        done += take;
        if ((st = push_piece(P, &b, dst_pl, pick_replica(P, group, n)))) return st;
    }
    return REFIT_OK;
}

static refit_status_t uncovered_error(const planner_t *P, uint32_t dst_pl, const refit_box_t *box)
{
    const refit_manifest_t *dst = P->dst;
    const refit_placement_t *p = &dst->placements.data[dst_pl];
    char b[160], missing[256] = "";
    size_t pos = 0, nmissing = 0;
    for (size_t s = 0; s < P->nsrcs; s++)
        if (!P->srcs[s]) {
            if (pos < sizeof(missing))
                pos += (size_t)snprintf(missing + pos, sizeof(missing) - pos, "%s%zu", nmissing ? ", " : "", s);
            nmissing++;
        }
    refit_box_format(box, b, sizeof(b));
    if (nmissing)
        return refit_error(REFIT_ERR_MISSING_SOURCE,
                           "tensor %s box %s (for destination %s) is held by no source; source slot(s) %s missing",
                           dst->canon.data[p->canon].name, b, dst->locals.data[p->local].d.name, missing);
    return refit_error(REFIT_ERR_UNCOVERED, "tensor %s box %s (for destination %s) is held by no source",
                       dst->canon.data[p->canon].name, b, dst->locals.data[p->local].d.name);
}

/* Step 2 for one destination placement. */
static refit_status_t cover(planner_t *P, uint32_t dst_pl)
{
    refit_status_t st = REFIT_OK;
    const refit_placement_t *p = &P->dst->placements.data[dst_pl];
    refit_box_t want = refit_placement_box(p);
    boxvec_t todo = {0}, next = {0};
    if (REFIT_VEC_PUSH(&todo, want)) return refit_error(REFIT_ERR_NO_MEMORY, "planner");
    const cand_t *c = P->cands + P->bucket_start[p->canon], *end = P->cands + P->bucket_start[p->canon + 1];
    while (c < end && todo.len) {
        const cand_t *g = c; /* replica group: identical boxes */
        while (g < end && refit_box_cmp(&g->box, &c->box) == 0) g++;
        if (refit_box_intersect(&c->box, &want, NULL)) {
            next.len = 0;
            for (size_t u = 0; u < todo.len; u++) {
                refit_box_t isect, rest[2 * REFIT_MAX_DIMS];
                if (!refit_box_intersect(&todo.data[u], &c->box, &isect)) {
                    if (REFIT_VEC_PUSH(&next, todo.data[u])) goto nomem;
                    continue;
                }
                if ((st = assign(P, &isect, dst_pl, c, (size_t)(g - c)))) goto out;
                size_t nr = refit_box_subtract(&todo.data[u], &c->box, rest);
                for (size_t r = 0; r < nr; r++)
                    if (REFIT_VEC_PUSH(&next, rest[r])) goto nomem;
            }
            boxvec_t tmp = todo;
            todo = next;
            next = tmp;
        }
        c = g;
    }
    if (todo.len) st = uncovered_error(P, dst_pl, &todo.data[0]);
out:
    REFIT_VEC_FREE(&todo);
    REFIT_VEC_FREE(&next);
    return st;
nomem:
    st = refit_error(REFIT_ERR_NO_MEMORY, "planner");
    goto out;
}

/* Byte strides of the canonical dims of a placement's local tensor, and the
 * byte offset (within its region) of canonical point `at`. */
static void local_geometry(const refit_manifest_t *m, const refit_placement_t *p, const uint64_t *at,
                           uint64_t strides[REFIT_MAX_DIMS], uint64_t *offset)
{
    const refit_local_t *l = &m->locals.data[p->local];
    uint64_t st[REFIT_MAX_DIMS];
    size_t es = refit_dtype_size(l->d.dtype);
    refit_tdesc_strides(&l->d, st);
    uint32_t lead = l->d.ndim - p->ndim;
    for (uint32_t d = 0; d < p->ndim; d++) strides[d] = st[lead + d] * es;
    *offset = l->offset + refit_placement_local_index(m, p, at) * es;
}

/* Step 4: one piece to one strided region. */
static void lower(const planner_t *P, const piece_t *pc, refit_plan_region_t *r)
{
    const refit_manifest_t *sm = P->srcs[pc->src], *dm = P->dst;
    const refit_placement_t *sp = &sm->placements.data[pc->src_pl], *dp = &dm->placements.data[pc->dst_pl];
    uint64_t ss[REFIT_MAX_DIMS], ds[REFIT_MAX_DIMS];
    memset(r, 0, sizeof(*r));
    r->src = pc->src;
    r->src_region = sm->locals.data[sp->local].region;
    r->dst_region = dm->locals.data[dp->local].region;
    local_geometry(sm, sp, pc->box.off, ss, &r->src_offset);
    local_geometry(dm, dp, pc->box.off, ds, &r->dst_offset);
    int d = (int)pc->box.ndim - 1;
    r->run = pc->box.ext[d] * ss[d]; /* innermost stride is the element size on both sides */
    for (d--; d >= 0 && ss[d] == r->run && ds[d] == r->run; d--) r->run *= pc->box.ext[d];
    for (; d >= 0; d--) {
        if (pc->box.ext[d] == 1) continue;
        r->count[r->nloops] = pc->box.ext[d];
        r->src_stride[r->nloops] = ss[d];
        r->dst_stride[r->nloops] = ds[d];
        r->nloops++;
    }
}

/* Step 5: the proof. */
static refit_status_t prove(const planner_t *P)
{
    const refit_manifest_t *dst = P->dst;
    size_t np = P->pieces.len;
    refit_status_t st = REFIT_OK;
    uint64_t *vol = calloc(dst->placements.len ? dst->placements.len : 1, sizeof(uint64_t));
    refit_box_t *boxes = malloc((np ? np : 1) * sizeof(*boxes));
    uint32_t *groups = malloc((np ? np : 1) * sizeof(*groups));
    if (!vol || !boxes || !groups) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "coverage proof");
        goto out;
    }
    for (size_t i = 0; i < np; i++) {
        const piece_t *pc = &P->pieces.data[i];
        refit_box_t db = refit_placement_box(&dst->placements.data[pc->dst_pl]);
        refit_box_t sb = refit_placement_box(&P->srcs[pc->src]->placements.data[pc->src_pl]);
        if (!refit_box_contains(&db, &pc->box) || !refit_box_contains(&sb, &pc->box)) {
            st = refit_error(REFIT_ERR_INTERNAL, "piece %zu of %s lies outside its source or destination box", i,
                             dst->canon.data[dst->placements.data[pc->dst_pl].canon].name);
            goto out;
        }
        vol[pc->dst_pl] += refit_box_volume(&pc->box);
        boxes[i] = pc->box;
        groups[i] = pc->dst_pl;
    }
    size_t a, b;
    int err;
    if (refit_boxes_find_overlap(boxes, groups, np, &a, &b, &err)) {
        char s1[160];
        st = refit_error(REFIT_ERR_INTERNAL, "two pieces of %s overlap at %s",
                         dst->canon.data[dst->placements.data[groups[a]].canon].name,
                         refit_box_format(&boxes[a], s1, sizeof(s1)));
        goto out;
    }
    if (err) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "coverage proof");
        goto out;
    }
    for (size_t i = 0; i < dst->placements.len; i++) {
        refit_box_t db = refit_placement_box(&dst->placements.data[i]);
        if (vol[i] != refit_box_volume(&db)) {
            st = refit_error(REFIT_ERR_INTERNAL, "pieces of %s cover %" PRIu64 " of %" PRIu64 " elements",
                             dst->canon.data[dst->placements.data[i].canon].name, vol[i], refit_box_volume(&db));
            goto out;
        }
    }
out:
    free(vol);
    free(boxes);
    free(groups);
    return st;
}

static refit_status_t check_region_bounds(const planner_t *P, const refit_plan_region_t *r)
{
    const refit_manifest_t *dm = P->dst;
    if (r->dst_region >= dm->regions.len || refit_region_dst_end(r) > dm->regions.data[r->dst_region])
        return refit_error(REFIT_ERR_INTERNAL, "a region writes past destination region %u", r->dst_region);
    if (r->src == REFIT_PLAN_FILL) return REFIT_OK;
    const refit_manifest_t *sm = P->srcs[r->src];
    if (r->src_region >= sm->regions.len || refit_region_src_end(r) > sm->regions.data[r->src_region])
        return refit_error(REFIT_ERR_INTERNAL, "a region reads past region %u of source %u", r->src_region, r->src);
    return REFIT_OK;
}

/* Padding: local bytes of the destination that no placement covers. */
static refit_status_t plan_fills(planner_t *P)
{
    const refit_manifest_t *dm = P->dst;
    refit_status_t st = REFIT_OK;
    for (uint32_t li = 0; li < dm->locals.len && !st; li++) {
        const refit_local_t *l = &dm->locals.data[li];
        refit_box_t *boxes;
        size_t n;
        if ((st = refit_manifest_padding(dm, li, &boxes, &n))) return st;
        uint64_t st_el[REFIT_MAX_DIMS];
        size_t es = refit_dtype_size(l->d.dtype);
        refit_tdesc_strides(&l->d, st_el);
        for (size_t u = 0; u < n && !st; u++) {
            const refit_box_t *bx = &boxes[u];
            refit_plan_region_t r = {.src = REFIT_PLAN_FILL, .dst_region = l->region};
            uint64_t off = 0;
            for (uint32_t d = 0; d < bx->ndim; d++) off += bx->off[d] * st_el[d];
            r.dst_offset = l->offset + off * es;
            int d = (int)bx->ndim - 1;
            r.run = bx->ext[d] * es;
            for (d--; d >= 0 && st_el[d] * es == r.run; d--) r.run *= bx->ext[d];
            for (; d >= 0; d--) {
                if (bx->ext[d] == 1) continue;
                r.count[r.nloops] = bx->ext[d];
                r.dst_stride[r.nloops] = st_el[d] * es;
                r.nloops++;
            }
            if ((st = check_region_bounds(P, &r))) break;
            if (REFIT_VEC_PUSH(&P->plan->fills, r)) st = refit_error(REFIT_ERR_NO_MEMORY, "planning fills");
            else P->plan->stats.bytes_fill += refit_plan_region_bytes(&r);
        }
        free(boxes);
    }
    return st;
}

static int cmp_region(const void *pa, const void *pb)
{
    const refit_plan_region_t *a = pa, *b = pb;
    if (a->src != b->src) return a->src < b->src ? -1 : 1;
    if (a->src_region != b->src_region) return a->src_region < b->src_region ? -1 : 1;
    if (a->dst_region != b->dst_region) return a->dst_region < b->dst_region ? -1 : 1;
    if (a->dst_offset != b->dst_offset) return a->dst_offset < b->dst_offset ? -1 : 1;
    return 0;
}

void refit_plan_key_of(const refit_manifest_t *const *srcs, size_t nsrcs, const refit_manifest_t *dst,
                       refit_plan_key_t *out)
{
    refit_hasher_t h;
    refit_hasher_init(&h, 0x706c616e);
    refit_hasher_u64(&h, nsrcs);
    for (size_t i = 0; i < nsrcs; i++) refit_hasher_u64(&h, srcs[i] ? refit_manifest_signature(srcs[i]) : 0);
    out->src = refit_hasher_done(&h);
    out->dst = dst ? refit_manifest_signature(dst) : 0;
}

refit_status_t refit_plan_create(const refit_manifest_t *const *srcs, size_t nsrcs, const refit_manifest_t *dst,
                                 const refit_plan_params_t *params, refit_plan_t **out)
{
    refit_status_t st;
    uint64_t t0 = refit_now_ns();
    if (!dst || !out || (nsrcs && !srcs)) return refit_error(REFIT_ERR_INVALID_ARG, "refit_plan_create: NULL argument");
    if (!dst->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "the destination manifest is not finalized");
    if (nsrcs > UINT32_MAX - 1) return refit_error(REFIT_ERR_INVALID_ARG, "too many sources");
    const refit_plan_params_t defaults = REFIT_PLAN_PARAMS_INIT;
    planner_t P = {.srcs = srcs, .nsrcs = nsrcs, .dst = dst};
    if ((st = refit_params_in(&P.params, sizeof(P.params), params ? params : &defaults, REFIT_PLAN_PARAMS_SIZE_1,
                              "refit_plan_params_t")))
        return st;
    P.seed = P.params.use_seed ? P.params.balance_seed : dst->rank;
    P.plan = calloc(1, sizeof(refit_plan_t));
    P.load = calloc(nsrcs ? nsrcs : 1, sizeof(uint64_t));
    if (!P.plan || !P.load) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "allocating a plan");
        goto err;
    }
    refit_plan_t *plan = P.plan;
    plan->nsrcs = nsrcs;
    if ((st = build_index(&P))) goto err;
    for (size_t i = 0; i < dst->placements.len; i++)
        if ((st = cover(&P, (uint32_t)i))) goto err;
    if ((st = prove(&P))) goto err;
    if (REFIT_VEC_RESERVE(&plan->regions, P.pieces.len)) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "plan regions");
        goto err;
    }
    for (size_t i = 0; i < P.pieces.len; i++) {
        refit_plan_region_t r;
        lower(&P, &P.pieces.data[i], &r);
        if ((st = check_region_bounds(&P, &r))) goto err;
        plan->regions.data[plan->regions.len++] = r;
        plan->stats.bytes_read += refit_plan_region_bytes(&r);
    }
    for (size_t i = 0; i < dst->placements.len; i++) {
        const refit_placement_t *p = &dst->placements.data[i];
        uint64_t v = refit_dtype_size(dst->canon.data[p->canon].dtype);
        for (uint32_t d = 0; d < p->ndim; d++) v *= p->extent[d];
        plan->stats.bytes_written += v;
    }
    plan->stats.pieces = P.pieces.len;
    qsort(plan->regions.data, plan->regions.len, sizeof(refit_plan_region_t), cmp_region);
    if (!P.params.no_coalesce && (st = refit_plan_coalesce(plan))) goto err;
    uint64_t moved = 0;
    plan->src_bytes = calloc(nsrcs ? nsrcs : 1, sizeof(uint64_t));
    if (!plan->src_bytes) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "plan");
        goto err;
    }
    for (size_t i = 0; i < plan->regions.len; i++) {
        const refit_plan_region_t *r = &plan->regions.data[i];
        if ((st = check_region_bounds(&P, r))) goto err;
        uint64_t b = refit_plan_region_bytes(r);
        moved += b;
        plan->src_bytes[r->src] += b;
    }
    if (moved != plan->stats.bytes_read || moved != plan->stats.bytes_written) {
        st = refit_error(REFIT_ERR_INTERNAL, "plan moves %" PRIu64 " bytes, read %" PRIu64 ", placements need %" PRIu64,
                         moved, plan->stats.bytes_read, plan->stats.bytes_written);
        goto err;
    }
    plan->stats.bytes_redundant = plan->stats.bytes_read - plan->stats.bytes_written;
    plan->stats.regions = plan->regions.len;
    for (size_t s = 0; s < nsrcs; s++) plan->stats.sources_used += plan->src_bytes[s] > 0;
    if ((st = plan_fills(&P))) goto err;
    plan->stats.fills = plan->fills.len;
    refit_plan_key_of(srcs, nsrcs, dst, &plan->key);
    plan->stats.plan_ms = (double)(refit_now_ns() - t0) / 1e6;
    free(P.bucket_start);
    free(P.cands);
    free(P.load);
    REFIT_VEC_FREE(&P.pieces);
    *out = plan;
    return REFIT_OK;
err:
    free(P.bucket_start);
    free(P.cands);
    free(P.load);
    REFIT_VEC_FREE(&P.pieces);
    refit_plan_destroy(P.plan);
    return st;
}

void refit_plan_destroy(refit_plan_t *plan)
{
    if (!plan) return;
    REFIT_VEC_FREE(&plan->regions);
    REFIT_VEC_FREE(&plan->fills);
    free(plan->src_bytes);
    free(plan);
}

refit_status_t refit_plan_stats(const refit_plan_t *plan, refit_plan_stats_t *out)
{
    if (!plan || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_plan_stats: NULL argument");
    refit_status_t st = refit_out_check(out->size, REFIT_END_OF(refit_plan_stats_t, plan_ms), "refit_plan_stats_t");
    if (st) return st;
    refit_out_write(out, out->size, &plan->stats, sizeof(plan->stats));
    return REFIT_OK;
}

const refit_plan_region_t *refit_plan_regions(const refit_plan_t *plan, size_t *n)
{
    *n = plan->regions.len;
    return plan->regions.data;
}

const refit_plan_region_t *refit_plan_fills(const refit_plan_t *plan, size_t *n)
{
    *n = plan->fills.len;
    return plan->fills.data;
}

uint64_t refit_plan_source_bytes(const refit_plan_t *plan, uint32_t src)
{
    return src < plan->nsrcs ? plan->src_bytes[src] : 0;
}

size_t refit_plan_num_sources(const refit_plan_t *plan) { return plan->nsrcs; }
void refit_plan_key(const refit_plan_t *plan, refit_plan_key_t *out) { *out = plan->key; }
