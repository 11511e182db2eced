/* The digest plan: which source table entries a receiver fetches and how it combines them into the sum of
 * each of its placements (see digest.h), and the check of its own sums against them. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "data/digest_internal.h"

#define LOG_UNVERIFIABLE_MAX 16

static const char *const g_reason_names[REFIT_DIGEST_REASON_COUNT] = {"verifiable", "ndim>=3",      "odd-bytes",
                                                                      "cut-both",   "no-partition", "source-box"};

const char *refit_digest_reason_name(refit_digest_reason_t r)
{
    return (unsigned)r < REFIT_DIGEST_REASON_COUNT ? g_reason_names[r] : "unknown";
}

typedef refit_digest_term_t term_t;

struct refit_digest_plan {
    uint32_t n;           /* destination placements */
    uint8_t *reason;      /* per placement */
    uint64_t *bytes;      /* per placement */
    uint32_t *canon;      /* per placement: destination canonical id */
    refit_box_t *boxes;   /* per placement: canonical box */
    uint32_t *term_start; /* n + 1 */
    term_t *terms;
    refit_digest_fetch_t *fetches;
    size_t nfetches;
    char **names; /* destination canonical names */
    uint32_t ncanon;
    refit_digest_plan_stats_t stats;
};

/* A source box of a destination canonical tensor. */
typedef struct {
    uint32_t canon; /* destination canonical id */
    uint32_t src, pl;
    refit_box_t box;
    cbox_t cb;
    uint64_t poff; /* P array in the source's table; UINT64_MAX: not digestible */
} cand_t;
typedef REFIT_VEC(cand_t) cands_t;

static int cmp_cand(const void *x, const void *y)
{
    const cand_t *a = x, *b = y;
    if (a->canon != b->canon) return a->canon < b->canon ? -1 : 1;
    int c = refit_box_cmp(&a->box, &b->box);
    if (c) return c;
    if (a->src != b->src) return a->src < b->src ? -1 : 1;
    return a->pl < b->pl ? -1 : (a->pl > b->pl);
}

typedef struct {
    uint32_t src, pl; /* the destination placement (pl) that needs it */
    uint64_t off;
    int32_t sign;
} rawterm_t;
typedef REFIT_VEC(rawterm_t) rawterms_t;

static int cmp_fetch(const void *x, const void *y)
{
    const refit_digest_fetch_t *a = x, *b = y;
    if (a->src != b->src) return a->src < b->src ? -1 : 1;
    return a->offset < b->offset ? -1 : (a->offset > b->offset);
}

static bool same_desc(const refit_tdesc_t *a, const refit_tdesc_t *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (uint32_t d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

void refit_digest_plan_destroy(refit_digest_plan_t *p)
{
    if (!p) return;
    if (p->names)
        for (uint32_t c = 0; c < p->ncanon; c++) free(p->names[c]);
    free(p->names);
    free(p->reason);
    free(p->bytes);
    free(p->canon);
    free(p->boxes);
    free(p->term_start);
    free(p->terms);
    free(p->fetches);
    free(p);
}

/* Collects the usable source boxes of the destination's tensors, sorted by
 * tensor then box then source. */
static refit_status_t gather(const refit_manifest_t *const *srcs, size_t nsrcs, const uint8_t *usable,
                             const refit_manifest_t *dst, cands_t *out)
{
    for (size_t s = 0; s < nsrcs; s++) {
        const refit_manifest_t *m = srcs[s];
        if (!m || (usable && !usable[s])) continue;
        uint64_t *offs = malloc(REFIT_MAX(m->placements.len, 1) * sizeof(*offs));
        uint32_t *map = malloc(REFIT_MAX(m->canon.len, 1) * sizeof(*map));
        if (!offs || !map) {
            free(offs);
            free(map);
            return refit_error(REFIT_ERR_NO_MEMORY, "digest plan: source %zu", s);
        }
        refit_status_t st = REFIT_OK;
        for (size_t c = 0; c < m->canon.len && !st; c++) {
            uint32_t d;
            map[c] = UINT32_MAX;
            if (!refit_strmap_get(&dst->canon_index, m->canon.data[c].name, &d)) continue;
            if (!same_desc(&m->canon.data[c], &dst->canon.data[d]))
                st = refit_error(REFIT_ERR_MISMATCH,
                                 "digest plan: tensor %s differs in dtype or shape between source %zu "
                                 "(%s rank %u) and the destination",
                                 m->canon.data[c].name, s, m->layout, m->rank);
            map[c] = d;
        }
        refit_digest_table_offsets(m, offs);
        for (uint32_t i = 0; i < m->placements.len && !st; i++) {
            const refit_placement_t *p = &m->placements.data[i];
            if (map[p->canon] == UINT32_MAX) continue;
            cand_t c = {
                .canon = map[p->canon], .src = (uint32_t)s, .pl = i, .box = refit_placement_box(p), .poff = offs[i]};
            cbox_of(&m->canon.data[p->canon], p, &c.cb);
            if (REFIT_VEC_PUSH(out, c)) st = refit_error(REFIT_ERR_NO_MEMORY, "digest plan: source boxes");
        }
        free(offs);
        free(map);
        if (st) return st;
    }
    if (out->len) qsort(out->data, out->len, sizeof(cand_t), cmp_cand);
    return REFIT_OK;
}

/* Whether the distinct usable source boxes of a tensor partition it. */
enum { PART_OK = 0, PART_VOLUME = 1, PART_OVERLAP = 2 };

/* Keeps one box of every run of identical boxes (the lowest source) and
 * checks, per tensor, that the distinct boxes partition it.  Fills start
 * (ncanon + 1, CSR over the compacted candidates), part[canon] (PART_*) and
 * vol[canon] (elements the distinct boxes hold). */
static refit_status_t dedupe_and_partition(const refit_manifest_t *dst, cand_t *c, size_t *nc, uint32_t *start,
                                           uint8_t *part, uint64_t *vols)
{
    size_t w = 0, n = *nc;
    for (size_t r = 0; r < n; r++)
        if (w == 0 || c[w - 1].canon != c[r].canon || refit_box_cmp(&c[w - 1].box, &c[r].box)) c[w++] = c[r];
    *nc = w;
    uint32_t ncanon = (uint32_t)dst->canon.len;
    memset(start, 0, (ncanon + 1) * sizeof(*start));
    for (size_t i = 0; i < w; i++) start[c[i].canon + 1]++;
    for (uint32_t t = 0; t < ncanon; t++) start[t + 1] += start[t];
    refit_box_t *boxes = malloc(REFIT_MAX(w, 1) * sizeof(*boxes));
    uint32_t *groups = calloc(REFIT_MAX(w, 1), sizeof(*groups));
    if (!boxes || !groups) {
        free(boxes);
        free(groups);
        return refit_error(REFIT_ERR_NO_MEMORY, "digest plan: partition check");
    }
    refit_status_t st = REFIT_OK;
    for (uint32_t t = 0; t < ncanon && !st; t++) {
        const refit_tdesc_t *d = &dst->canon.data[t];
        uint64_t numel = 1, vol = 0;
        for (uint32_t k = 0; k < d->ndim; k++) numel *= d->shape[k];
        size_t m = 0;
        for (uint32_t i = start[t]; i < start[t + 1]; i++) {
            boxes[m++] = c[i].box;
            if (!refit_add_u64(vol, refit_box_volume(&c[i].box), &vol)) vol = UINT64_MAX;
        }
        part[t] = vol == numel ? PART_OK : PART_VOLUME;
        vols[t] = vol;
        if (part[t] == PART_OK && m > 1) {
            size_t i, j;
            int err = 0;
            if (refit_boxes_find_overlap(boxes, groups, m, &i, &j, &err)) part[t] = PART_OVERLAP;
            if (err) st = refit_error(REFIT_ERR_NO_MEMORY, "digest plan: partition check");
        }
    }
    free(boxes);
    free(groups);
    return st;
}

/* The P (rows) or Q (columns) entry x of a source box, Q's last as P's last. */
static uint64_t entry_offset(const cand_t *s, bool by_rows, uint64_t x)
{
    if (by_rows || x == s->cb.n) return s->poff + (by_rows ? x : s->cb.nrows) * 8;
    return s->poff + (s->cb.nrows + 1 + x) * 8;
}

static refit_digest_reason_t plan_placement(const refit_manifest_t *dst, uint32_t i, const cand_t *cands,
                                            const uint32_t *start, const uint8_t *part, rawterms_t *terms, int *oom)
{
    const refit_placement_t *p = &dst->placements.data[i];
    cbox_t b;
    refit_digest_reason_t r = cbox_of(&dst->canon.data[p->canon], p, &b);
    if (r) return r;
    bool by_rows = cbox_full_rows(&b);
    if (!by_rows && !cbox_all_rows(&b)) return REFIT_DIGEST_UNV_CUT_BOTH;
    if (part[p->canon] != PART_OK) return REFIT_DIGEST_UNV_NO_PARTITION;
    size_t mark = terms->len;
    refit_box_t db = refit_placement_box(p), x;
    for (uint32_t k = start[p->canon]; k < start[p->canon + 1]; k++) {
        const cand_t *s = &cands[k];
        if (!refit_box_intersect(&db, &s->box, &x)) continue;
        if (s->poff == UINT64_MAX) {
            terms->len = mark;
            return REFIT_DIGEST_UNV_SOURCE_BOX;
        }
        uint64_t lo, hi, base;
        if (by_rows) {
            lo = REFIT_MAX(b.a, s->cb.a);
            hi = REFIT_MIN(b.a + b.nrows, s->cb.a + s->cb.nrows);
            base = s->cb.a;
        } else {
            lo = REFIT_MAX(b.c, s->cb.c);
            hi = REFIT_MIN(b.c + b.n, s->cb.c + s->cb.n);
            base = s->cb.c;
        }
        rawterm_t t = {.src = s->src, .pl = i, .off = entry_offset(s, by_rows, hi - base), .sign = 1};
        if (REFIT_VEC_PUSH(terms, t)) goto oom;
        if (lo > base) {
            t.off = entry_offset(s, by_rows, lo - base);
            t.sign = -1;
            if (REFIT_VEC_PUSH(terms, t)) goto oom;
        }
    }
    return REFIT_DIGEST_VERIFIABLE;
oom:
    *oom = 1;
    return REFIT_DIGEST_VERIFIABLE;
}

/* The arguments' checks: finalized manifests of one model. */
static refit_status_t check_inputs(const refit_manifest_t *const *srcs, size_t nsrcs, const refit_manifest_t *dst,
                                   refit_digest_plan_t **out)
{
    if (!dst || !out || (!srcs && nsrcs))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_plan_create: NULL argument");
    if (nsrcs > UINT32_MAX) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_plan_create: %zu sources", nsrcs);
    if (!dst->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "digest plan: the destination is not finalized");
    for (size_t s = 0; s < nsrcs; s++) {
        const refit_manifest_t *m = srcs[s];
        if (!m) continue;
        if (!m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "digest plan: source %zu is not finalized", s);
        if (strcmp(m->model, dst->model) != 0)
            return refit_error(REFIT_ERR_IDENTITY,
                               "digest plan: source %zu (%s rank %u) describes model %s, the "
                               "destination %s",
                               s, m->layout, m->rank, m->model, dst->model);
    }
    return REFIT_OK;
}

/* An empty plan for dst's n placements and ncanon canonical tensors (their
 * names copied); NULL when out of memory. */
static refit_digest_plan_t *plan_alloc(const refit_manifest_t *dst)
{
    uint32_t ncanon = (uint32_t)dst->canon.len, n = (uint32_t)dst->placements.len;
    refit_digest_plan_t *P = calloc(1, sizeof(*P));
    if (!P) return NULL;
    P->n = n;
    P->ncanon = ncanon;
    P->reason = calloc(REFIT_MAX(n, 1), 1);
    P->bytes = calloc(REFIT_MAX(n, 1), sizeof(*P->bytes));
    P->canon = calloc(REFIT_MAX(n, 1), sizeof(*P->canon));
    P->boxes = calloc(REFIT_MAX(n, 1), sizeof(*P->boxes));
    P->term_start = calloc((size_t)n + 1, sizeof(*P->term_start));
    P->names = calloc(REFIT_MAX(ncanon, 1), sizeof(*P->names));
    bool ok = P->reason && P->bytes && P->canon && P->boxes && P->term_start && P->names;
    for (uint32_t c = 0; ok && c < ncanon; c++) ok = (P->names[c] = refit_strdup(dst->canon.data[c].name)) != NULL;
    if (ok) return P;
    refit_digest_plan_destroy(P);
    return NULL;
}

/* Says at INFO why placement i (reason r) is unverifiable. */
static void log_unverifiable(const refit_manifest_t *dst, const refit_digest_plan_t *P, uint32_t i,
                             refit_digest_reason_t r, const uint8_t *part, const uint64_t *vols)
{
    const refit_placement_t *p = &dst->placements.data[i];
    const refit_tdesc_t *t = &dst->canon.data[p->canon];
    char box[160], why[96] = "";
    uint64_t numel = 1;
    for (uint32_t d = 0; d < t->ndim; d++) numel *= t->shape[d];
    if (r == REFIT_DIGEST_UNV_NO_PARTITION && part[p->canon] == PART_OVERLAP)
        snprintf(why, sizeof(why), " (usable source boxes overlap)");
    else if (r == REFIT_DIGEST_UNV_NO_PARTITION)
        snprintf(why, sizeof(why), " (usable source boxes hold %" PRIu64 " of %" PRIu64 " elements)", vols[p->canon],
                 numel);
    refit_log(REFIT_LOG_INFO, "digest: %s %s (destination %s rank %u placement %u) is unverifiable: %s%s", t->name,
              refit_box_format(&P->boxes[i], box, sizeof(box)), dst->layout, dst->rank, i, refit_digest_reason_name(r),
              why);
}

static void log_summary(const refit_manifest_t *dst, const refit_digest_plan_t *P)
{
    refit_log(REFIT_LOG_INFO,
              "digest: %s rank %u: %" PRIu64 " of %" PRIu64 " placements (%" PRIu64 " of %" PRIu64
              " bytes) unverifiable: ndim %" PRIu64 ", odd bytes %" PRIu64 ", cut both %" PRIu64
              ", no partition %" PRIu64 ", source box %" PRIu64,
              dst->layout, dst->rank, P->stats.placements - P->stats.verifiable, P->stats.placements,
              P->stats.unverifiable_bytes, P->stats.bytes, P->stats.unverifiable[1], P->stats.unverifiable[2],
              P->stats.unverifiable[3], P->stats.unverifiable[4], P->stats.unverifiable[5]);
}

/* Each entry of raw fetched once, sorted by source and offset; the terms
 * point at their fetch.  false: out of memory. */
static bool build_fetches(refit_digest_plan_t *P, const rawterms_t *raw)
{
    P->fetches = malloc(REFIT_MAX(raw->len, 1) * sizeof(*P->fetches));
    P->terms = malloc(REFIT_MAX(raw->len, 1) * sizeof(*P->terms));
    if (!P->fetches || !P->terms) return false;
    for (size_t i = 0; i < raw->len; i++) P->fetches[i] = (refit_digest_fetch_t){raw->data[i].src, raw->data[i].off};
    if (raw->len) qsort(P->fetches, raw->len, sizeof(*P->fetches), cmp_fetch);
    size_t nf = 0;
    for (size_t i = 0; i < raw->len; i++)
        if (nf == 0 || cmp_fetch(&P->fetches[nf - 1], &P->fetches[i])) P->fetches[nf++] = P->fetches[i];
    P->nfetches = nf;
    for (size_t i = 0; i < raw->len; i++) {
        refit_digest_fetch_t key = {raw->data[i].src, raw->data[i].off};
        const refit_digest_fetch_t *f = bsearch(&key, P->fetches, nf, sizeof(key), cmp_fetch);
        P->terms[i] = (term_t){(uint32_t)(f - P->fetches), raw->data[i].sign};
    }
    P->stats.fetches = nf;
    return true;
}

refit_status_t refit_digest_plan_create(const refit_manifest_t *const *srcs, size_t nsrcs, const uint8_t *usable,
                                        const refit_manifest_t *dst, refit_digest_plan_t **out)
{
    refit_status_t st = check_inputs(srcs, nsrcs, dst, out);
    if (st) return st;
    cands_t cands = {0};
    rawterms_t raw = {0};
    uint32_t ncanon = (uint32_t)dst->canon.len, n = (uint32_t)dst->placements.len;
    uint32_t *start = calloc(ncanon + 1, sizeof(*start));
    uint8_t *part = calloc(REFIT_MAX(ncanon, 1), sizeof(*part));
    uint64_t *vols = calloc(REFIT_MAX(ncanon, 1), sizeof(*vols));
    refit_digest_plan_t *P = plan_alloc(dst);
    if (!start || !part || !vols || !P) goto oom;
    if ((st = gather(srcs, nsrcs, usable, dst, &cands))) goto fail;
    if ((st = dedupe_and_partition(dst, cands.data, &cands.len, start, part, vols))) goto fail;
    unsigned logged = 0;
    for (uint32_t i = 0; i < n; i++) {
        const refit_placement_t *p = &dst->placements.data[i];
        const refit_tdesc_t *t = &dst->canon.data[p->canon];
        P->canon[i] = p->canon;
        P->boxes[i] = refit_placement_box(p);
        P->bytes[i] = refit_box_volume(&P->boxes[i]) * refit_dtype_size(t->dtype);
        int oom = 0;
        refit_digest_reason_t r = plan_placement(dst, i, cands.data, start, part, &raw, &oom);
        if (oom) goto oom;
        P->reason[i] = (uint8_t)r;
        P->term_start[i + 1] = (uint32_t)raw.len;
        P->stats.placements++;
        P->stats.bytes += P->bytes[i];
        if (r == REFIT_DIGEST_VERIFIABLE) {
            P->stats.verifiable++;
            continue;
        }
        P->stats.unverifiable[r]++;
        P->stats.unverifiable_bytes += P->bytes[i];
        if (logged++ < LOG_UNVERIFIABLE_MAX) log_unverifiable(dst, P, i, r, part, vols);
    }
    if (logged) log_summary(dst, P);
    if (!build_fetches(P, &raw)) goto oom;
    *out = P;
    P = NULL;
    goto done;
oom:
    st = refit_error(REFIT_ERR_NO_MEMORY, "digest plan of %s rank %u", dst->layout, dst->rank);
fail:
done:
    refit_digest_plan_destroy(P);
    REFIT_VEC_FREE(&cands);
    REFIT_VEC_FREE(&raw);
    free(start);
    free(part);
    free(vols);
    return st;
}

const refit_digest_fetch_t *refit_digest_plan_fetches(const refit_digest_plan_t *p, size_t *n)
{
    *n = p->nfetches;
    return p->fetches;
}

const refit_digest_term_t *refit_digest_plan_terms(const refit_digest_plan_t *p, const uint32_t **start, uint32_t *n)
{
    *start = p->term_start;
    *n = p->n;
    return p->terms;
}

void refit_digest_plan_stats(const refit_digest_plan_t *p, refit_digest_plan_stats_t *out) { *out = p->stats; }

refit_digest_reason_t refit_digest_plan_reason(const refit_digest_plan_t *p, uint32_t i)
{
    return (refit_digest_reason_t)p->reason[i];
}

refit_status_t refit_digest_check(const refit_digest_plan_t *p, const void *fetched, const refit_dsum_t *local,
                                  refit_digest_report_t *report)
{
    if (!p || !local || (!fetched && p->nfetches))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_check: NULL argument");
    const uint8_t *f = fetched;
    refit_digest_report_t rep = {0};
    uint32_t first = UINT32_MAX;
    refit_dsum_t first_exp = {{0, 0}};
    for (uint32_t i = 0; i < p->n; i++) {
        if (p->reason[i] != REFIT_DIGEST_VERIFIABLE) continue;
        refit_dsum_t e = {{0, 0}};
        for (uint32_t t = p->term_start[i]; t < p->term_start[i + 1]; t++) {
            uint32_t v[2];
            memcpy(v, f + (size_t)p->terms[t].fetch * 8, 8);
            if (p->terms[t].sign > 0) {
                e.lane[0] += v[0];
                e.lane[1] += v[1];
            } else {
                e.lane[0] -= v[0];
                e.lane[1] -= v[1];
            }
        }
        rep.checked++;
        rep.bytes += p->bytes[i];
        if (e.lane[0] == local[i].lane[0] && e.lane[1] == local[i].lane[1]) continue;
        if (rep.mismatches++ == 0) {
            first = i;
            first_exp = e;
        }
    }
    if (report) *report = rep;
    if (!rep.mismatches) return REFIT_OK;
    /* The sources the first mismatching placement was checked against. */
    char srcs[128] = "";
    size_t pos = 0, nseen = 0;
    uint32_t seen[16];
    for (uint32_t t = p->term_start[first]; t < p->term_start[first + 1] && nseen < REFIT_ARRAY_LEN(seen); t++) {
        uint32_t s = p->fetches[p->terms[t].fetch].src;
        bool dup = false;
        for (size_t q = 0; q < nseen; q++) dup = dup || seen[q] == s;
        if (dup) continue;
        seen[nseen++] = s;
        pos += (size_t)snprintf(srcs + pos, sizeof(srcs) - pos, "%s%u", pos ? ", " : "", s);
        if (pos >= sizeof(srcs)) break;
    }
    char box[160];
    refit_status_t st = refit_error(
        REFIT_ERR_VERIFY,
        "digest mismatch in %s %s (destination placement %u): expected %08" PRIx32 "%08" PRIx32 " from source(s) %s, "
        "computed %08" PRIx32 "%08" PRIx32,
        p->names[p->canon[first]], refit_box_format(&p->boxes[first], box, sizeof(box)), first, first_exp.lane[0],
        first_exp.lane[1], srcs, local[first].lane[0], local[first].lane[1]);
    if (rep.mismatches > 1) refit_error_prefix("%" PRIu64 " placements differ; the first", rep.mismatches);
    return st;
}
