/* Partial refit: narrowing a manifest to whole local tensors. */
#include "refit/experimental/select.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/manifest.h"

#define MAX_PATTERNS 64

typedef struct {
    char *pat[MAX_PATTERNS];
    size_t n;
} pats_t;

static void pats_free(pats_t *p)
{
    for (size_t i = 0; i < p->n; i++) free(p->pat[i]);
}

static refit_status_t pats_parse(const char *s, pats_t *p)
{
    memset(p, 0, sizeof(*p));
    const char *c = s;
    while (*c) {
        const char *e = strchr(c, ',');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        if (len == 0 || len > 200 || p->n == MAX_PATTERNS) {
            pats_free(p);
            return refit_error(REFIT_ERR_PARSE, "select: empty, too long or too many patterns in \"%s\"", s);
        }
        char tok[256], buf[300];
        memcpy(tok, c, len);
        tok[len] = '\0';
        char *end;
        if (!strncmp(tok, "layer:", 6) || !strncmp(tok, "expert:", 7)) {
            bool layer = tok[0] == 'l';
            const char *num = tok + (layer ? 6 : 7);
            unsigned long v = strtoul(num, &end, 10);
            if (!*num || *end) {
                pats_free(p);
                return refit_error(REFIT_ERR_PARSE, "select: \"%s\" needs a number", tok);
            }
            snprintf(buf, sizeof buf, layer ? "model.layers.%lu.*" : "model.layers.*.mlp.experts.%lu.*", v);
        } else {
            snprintf(buf, sizeof buf, "%s", tok);
        }
        if (!(p->pat[p->n++] = strdup(buf))) {
            pats_free(p);
            return refit_error(REFIT_ERR_NO_MEMORY, "select");
        }
        c += len;
        if (*c == ',') c++;
    }
    if (!p->n) return refit_error(REFIT_ERR_PARSE, "select: no pattern");
    return REFIT_OK;
}

static bool matches(const pats_t *p, const char *name)
{
    for (size_t i = 0; i < p->n; i++)
        if (fnmatch(p->pat[i], name, 0) == 0) return true;
    return false;
}

refit_status_t refit_manifest_select(const refit_manifest_t *m, const char *patterns, bool invert,
                                     refit_manifest_t **out, refit_select_report_t *report)
{
    if (!m || !patterns || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_manifest_select: NULL argument");
    if (!m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "refit_manifest_select: manifest is not finalized");
    if (report) {
        refit_status_t st = refit_out_check(report->size, REFIT_END_OF(refit_select_report_t, bytes),
                                            "refit_select_report_t");
        if (st) return st;
    }
    pats_t pats;
    refit_status_t st = pats_parse(patterns, &pats);
    if (st) return st;
    refit_select_report_t rep = {0};
    uint32_t nl = (uint32_t)m->locals.len, nc = (uint32_t)m->canon.len;
    uint8_t *keep = calloc(nl ? nl : 1, 1), *named = calloc(nc ? nc : 1, 1), *pulled = calloc(nc ? nc : 1, 1);
    uint32_t *cmap = calloc(nc ? nc : 1, sizeof(uint32_t)), *lmap = calloc(nl ? nl : 1, sizeof(uint32_t));
    refit_manifest_t *o = NULL;
    char *layout = NULL;
    if (!keep || !named || !pulled || !cmap || !lmap) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "select");
        goto done;
    }
    for (uint32_t c = 0; c < nc; c++) named[c] = matches(&pats, m->canon.data[c].name);
    for (size_t i = 0; i < m->placements.len; i++) {
        const refit_placement_t *p = &m->placements.data[i];
        if (named[p->canon]) keep[p->local] = 1;
    }
    for (uint32_t l = 0; l < nl; l++) {
        if (invert) keep[l] = !keep[l];
        if (keep[l]) {
            rep.locals++;
            rep.bytes += m->locals.data[l].nbytes;
        }
    }
    for (size_t i = 0; i < m->placements.len; i++) {
        const refit_placement_t *p = &m->placements.data[i];
        if (keep[p->local]) pulled[p->canon] = 1;
    }
    for (uint32_t c = 0; c < nc; c++) {
        rep.canon_named += named[c] && pulled[c];
        rep.canon_pulled += pulled[c];
    }
    if (!rep.locals) {
        st = refit_error(REFIT_ERR_NOT_FOUND, "select: no local tensor of rank %u holds a tensor matching \"%s\"%s",
                         m->rank, patterns, invert ? " (inverted)" : "");
        goto done;
    }
    size_t ll = strlen(m->layout) + strlen(patterns) + 16;
    if (!(layout = malloc(ll))) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "select");
        goto done;
    }
    snprintf(layout, ll, "%s|select%s=%s", m->layout, invert ? "!" : "", patterns);
    refit_manifest_identity_t id = {m->model, layout, m->rank, m->world};
    if ((st = refit_manifest_create(&id, &o))) goto done;
    for (size_t r = 0; r < m->regions.len; r++) {
        uint32_t rid;
        if ((st = refit_manifest_add_region(o, m->regions.data[r], &rid))) goto done;
    }
    for (uint32_t c = 0; c < nc; c++) {
        if (!pulled[c]) continue;
        const refit_tdesc_t *d = &m->canon.data[c];
        refit_tensor_info_t t = {d->name, d->dtype, d->ndim, {0}};
        memcpy(t.shape, d->shape, sizeof t.shape);
        if ((st = refit_manifest_add_canonical(o, &t, &cmap[c]))) goto done;
    }
    for (uint32_t l = 0; l < nl; l++) {
        if (!keep[l]) continue;
        const refit_local_t *x = &m->locals.data[l];
        refit_tensor_info_t t = {x->d.name, x->d.dtype, x->d.ndim, {0}};
        memcpy(t.shape, x->d.shape, sizeof t.shape);
        if ((st = refit_manifest_add_local(o, &t, x->region, x->offset, &lmap[l]))) goto done;
    }
    for (size_t i = 0; i < m->placements.len; i++) {
        refit_placement_t p = m->placements.data[i];
        if (!keep[p.local]) continue;
        p.canon = cmap[p.canon];
        p.local = lmap[p.local];
        if ((st = refit_manifest_add_placement(o, &p))) goto done;
    }
    st = refit_manifest_finalize(o);
done:
    if (st) {
        refit_manifest_destroy(o);
        o = NULL;
    }
    free(layout);
    free(keep);
    free(named);
    free(pulled);
    free(cmap);
    free(lmap);
    pats_free(&pats);
    *out = o;
    if (report && !st) refit_out_write(report, report->size, &rep, sizeof(rep));
    return st;
}
