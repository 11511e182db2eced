/* FP8 targets: e4m3 conversion, 128x128 block quantization, the FP8 variant
 * of a bf16 receiver layout (with its grid alignment check) and the
 * source-side stage.  See refit/experimental/fp8.h. */
#include "refit/experimental/fp8.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/fp8_hd.h"
#include "layout/manifest.h"

#define B REFIT_FP8_BLOCK

/* Inline bodies for the hot loops (fp8_hd.h, shared with the GPU kernel):
 * the exported functions are interposable in the shared library, so calls
 * to them from this file would not be inlined. */
#define bf16f refit_fp8_hd_bf16
#define e4m3 refit_fp8_hd_e4m3

float refit_bf16_to_f32(uint16_t b) { return bf16f(b); }

uint8_t refit_fp8_e4m3_from_f32(float x) { return e4m3(x); }

float refit_fp8_e4m3_to_f32(uint8_t b)
{
    int e = (b >> 3) & 15, m = b & 7;
    float v;
    if ((b & 0x7f) == 0x7f) v = NAN;
    else if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return (b & 0x80) ? -v : v;
}

float refit_fp8_quantize_block(const uint16_t *x, uint64_t ld, uint32_t rows, uint32_t cols, uint8_t *q, uint64_t ldq)
{
    /* amax on the bit patterns (refit_fp8_hd_absbits) */
    int16_t m = 0; /* 16-bit lanes: the loop vectorizes */
    for (uint32_t r = 0; r < rows; r++) {
        const uint16_t *restrict xr = x + r * ld;
        for (uint32_t c = 0; c < cols; c++) {
            int16_t a = (int16_t)refit_fp8_hd_absbits(xr[c]);
            m = a > m ? a : m;
        }
    }
    float scale = refit_fp8_hd_scale(m);
    for (uint32_t r = 0; r < rows; r++) {
        const uint16_t *restrict xr = x + r * ld;
        uint8_t *restrict qr = q + r * ldq;
        for (uint32_t c = 0; c < cols; c++) qr[c] = refit_fp8_hd_quantize(xr[c], scale);
    }
    return scale;
}

typedef struct {
    refit_fp8_tensor_t t;
    char *name;
    int kind;       /* 0 copy, 1 fp8 weight, 2 scales (written with the weight) */
    uint32_t scale; /* kind 1: index of its scale tensor */
    uint64_t src_offset, lead, rows, cols;
} entry_t;

struct refit_fp8_target {
    entry_t *e;
    uint32_t n, nq;
    uint64_t bytes;
};

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static bool is_linear(const refit_local_t *l)
{
    const char *n = l->d.name;
    if (l->d.dtype != REFIT_DTYPE_BF16 || strstr(n, "embed") || strstr(n, "lm_head")) return false;
    if (l->d.ndim == 2 && ends_with(n, "_proj.weight")) return true;
    return l->d.ndim == 3 && (ends_with(n, "w13_weight") || ends_with(n, "w2_weight"));
}

void refit_fp8_target_destroy(refit_fp8_target_t *t)
{
    if (!t) return;
    for (uint32_t i = 0; i < t->n; i++) free(t->e[i].name);
    free(t->e);
    free(t);
}

static refit_status_t check_grid(const refit_manifest_t *m, const refit_local_t *l, const refit_placement_t *p)
{
    const refit_tdesc_t *c = &m->canon.data[p->canon];
    uint32_t cn = p->ndim, ln = l->d.ndim;
    if (cn < 2) return refit_error(REFIT_ERR_GEOMETRY, "fp8: %s holds %s, which is not a matrix", l->d.name, c->name);
    for (int k = 0; k < 2; k++) {
        uint32_t cd = cn - 2 + (uint32_t)k, ld = ln - 2 + (uint32_t)k;
        uint64_t co = p->canon_offset[cd], ex = p->extent[cd], lo = p->local_offset[ld];
        if (co % B || lo % B || (ex % B && co + ex != c->shape[cd]))
            return refit_error(REFIT_ERR_GEOMETRY,
                               "fp8: %s [%llu, +%llu) of %s land at %llu of %s: not on the %u-element block grid "
                               "(a block would straddle shards)",
                               k ? "columns" : "rows", (unsigned long long)co, (unsigned long long)ex, c->name,
                               (unsigned long long)lo, l->d.name, B);
    }
    return REFIT_OK;
}

refit_status_t refit_fp8_target_create(const refit_manifest_t *m, refit_fp8_target_t **out)
{
    if (!m || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_fp8_target_create: NULL argument");
    if (!m->finalized || m->regions.len != 1)
        return refit_error(REFIT_ERR_INVALID_ARG, "fp8: needs a finalized manifest with one region");
    refit_fp8_target_t *t = calloc(1, sizeof(*t));
    if (!t || !(t->e = calloc(m->locals.len * 2 + 1, sizeof(entry_t)))) {
        free(t);
        return refit_error(REFIT_ERR_NO_MEMORY, "fp8 target");
    }
    refit_status_t st = REFIT_OK;
    uint64_t off = 0;
    for (uint32_t li = 0; li < m->locals.len && !st; li++) {
        const refit_local_t *l = &m->locals.data[li];
        bool q = is_linear(l);
        for (uint32_t k = m->pl_start[li]; q && k < m->pl_start[li + 1] && !st; k++)
            st = check_grid(m, l, &m->placements.data[m->pl_list[k]]);
        if (st) break;
        entry_t *e = &t->e[t->n++];
        e->name = strdup(l->d.name);
        if (!e->name) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "fp8 target");
            break;
        }
        e->src_offset = l->offset;
        e->t.local = li;
        e->t.ndim = l->d.ndim;
        memcpy(e->t.shape, l->d.shape, sizeof e->t.shape);
        off = (off + 255) & ~(uint64_t)255;
        e->t.offset = off;
        if (!q) {
            e->t.dtype = l->d.dtype;
            e->t.bytes = l->nbytes;
            off += e->t.bytes;
            continue;
        }
        e->kind = 1;
        e->t.dtype = REFIT_DTYPE_F8_E4M3;
        e->rows = l->d.shape[l->d.ndim - 2];
        e->cols = l->d.shape[l->d.ndim - 1];
        e->lead = l->d.ndim == 3 ? l->d.shape[0] : 1;
        e->t.bytes = e->lead * e->rows * e->cols;
        off += e->t.bytes;
        t->nq++;
        entry_t *s = &t->e[t->n];
        e->scale = t->n++;
        size_t nl = strlen(l->d.name) + 16;
        if (!(s->name = malloc(nl))) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "fp8 target");
            break;
        }
        snprintf(s->name, nl, "%s_scale_inv", l->d.name);
        s->kind = 2;
        s->t.local = li;
        s->t.dtype = REFIT_DTYPE_F32;
        s->t.ndim = l->d.ndim;
        memcpy(s->t.shape, l->d.shape, sizeof s->t.shape);
        s->t.shape[s->t.ndim - 2] = (e->rows + B - 1) / B;
        s->t.shape[s->t.ndim - 1] = (e->cols + B - 1) / B;
        off = (off + 255) & ~(uint64_t)255;
        s->t.offset = off;
        s->t.bytes = e->lead * s->t.shape[s->t.ndim - 2] * s->t.shape[s->t.ndim - 1] * 4;
        off += s->t.bytes;
    }
    if (st) {
        refit_fp8_target_destroy(t);
        return st;
    }
    for (uint32_t i = 0; i < t->n; i++) t->e[i].t.name = t->e[i].name;
    t->bytes = (off + 255) & ~(uint64_t)255;
    *out = t;
    return REFIT_OK;
}

uint64_t refit_fp8_target_bytes(const refit_fp8_target_t *t) { return t->bytes; }
uint32_t refit_fp8_target_num_tensors(const refit_fp8_target_t *t) { return t->n; }
uint32_t refit_fp8_target_num_quantized(const refit_fp8_target_t *t) { return t->nq; }
const refit_fp8_tensor_t *refit_fp8_target_tensor(const refit_fp8_target_t *t, uint32_t i)
{
    return i < t->n ? &t->e[i].t : NULL;
}

/* Work units: one copy, or one matrix (lead index) of a quantized weight. */
typedef struct {
    const refit_fp8_target_t *t;
    const unsigned char *src;
    unsigned char *dst;
    uint64_t (*units)[2]; /* entry, lead */
    size_t n;
    atomic_size_t next;
} stage_t;

static void stage_unit(const stage_t *s, uint64_t ei, uint64_t k)
{
    const entry_t *e = &s->t->e[ei];
    if (e->kind == 0) {
        memcpy(s->dst + e->t.offset, s->src + e->src_offset, e->t.bytes);
        return;
    }
    const entry_t *sc = &s->t->e[e->scale];
    uint64_t br = (e->rows + B - 1) / B, bc = (e->cols + B - 1) / B;
    const uint16_t *x = (const uint16_t *)(const void *)(s->src + e->src_offset) + k * e->rows * e->cols;
    uint8_t *q = s->dst + e->t.offset + k * e->rows * e->cols;
    float *scale = (float *)(void *)(s->dst + sc->t.offset) + k * br * bc;
    for (uint64_t i = 0; i < br; i++)
        for (uint64_t j = 0; j < bc; j++) {
            uint32_t rows = (uint32_t)(e->rows - i * B < B ? e->rows - i * B : B);
            uint32_t cols = (uint32_t)(e->cols - j * B < B ? e->cols - j * B : B);
            scale[i * bc + j] = refit_fp8_quantize_block(x + i * B * e->cols + j * B, e->cols, rows, cols,
                                                         q + i * B * e->cols + j * B, e->cols);
        }
}

static void *stage_worker(void *arg)
{
    stage_t *s = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&s->next, 1);
        if (i >= s->n) break;
        stage_unit(s, s->units[i][0], s->units[i][1]);
    }
    return NULL;
}

refit_status_t refit_fp8_stage(const refit_fp8_target_t *t, const void *bf16_image, void *fp8_arena, unsigned threads)
{
    if (!t || !bf16_image || !fp8_arena) return refit_error(REFIT_ERR_INVALID_ARG, "refit_fp8_stage: NULL argument");
    size_t n = 0;
    for (uint32_t i = 0; i < t->n; i++) n += t->e[i].kind == 1 ? t->e[i].lead : t->e[i].kind == 0;
    stage_t s = {.t = t, .src = bf16_image, .dst = fp8_arena};
    s.units = malloc((n ? n : 1) * sizeof(*s.units));
    if (!s.units) return refit_error(REFIT_ERR_NO_MEMORY, "fp8 stage");
    for (uint32_t i = 0; i < t->n; i++) {
        if (t->e[i].kind == 2) continue;
        uint64_t lead = t->e[i].kind == 1 ? t->e[i].lead : 1;
        for (uint64_t k = 0; k < lead; k++) {
            s.units[s.n][0] = i;
            s.units[s.n][1] = k;
            s.n++;
        }
    }
    atomic_init(&s.next, 0);
    refit_run_threads(stage_worker, &s, threads);
    free(s.units);
    return REFIT_OK;
}

/* ---- the FP8 target as a manifest ----------------------------------------- */

/* Canonical id in `out` for bf16 canonical c as kind (0 kept, 1 fp8 weight,
 * 2 its scales), declared on first use (add_canonical returns the first id
 * of a name again, and refuses the same name with another dtype or shape:
 * a canonical tensor held both quantized and not). */
static refit_status_t canon_for(const refit_manifest_t *m, uint32_t c, int kind, refit_manifest_t *out, uint32_t *id)
{
    const refit_tdesc_t *d = &m->canon.data[c];
    char name[REFIT_MANIFEST_MAX_NAME + 16];
    refit_tensor_info_t ti = {.name = name, .dtype = d->dtype, .ndim = d->ndim};
    memcpy(ti.shape, d->shape, sizeof(ti.shape));
    snprintf(name, sizeof(name), "%s%s", d->name, kind == 2 ? "_scale_inv" : "");
    if (kind == 1) ti.dtype = REFIT_DTYPE_F8_E4M3;
    if (kind == 2) {
        ti.dtype = REFIT_DTYPE_F32;
        ti.shape[d->ndim - 2] = (d->shape[d->ndim - 2] + B - 1) / B;
        ti.shape[d->ndim - 1] = (d->shape[d->ndim - 1] + B - 1) / B;
    }
    refit_status_t st = refit_manifest_add_canonical(out, &ti, id);
    if (st) refit_error_prefix("fp8 manifest: canonical %s", name);
    return st;
}

refit_status_t refit_fp8_target_manifest(const refit_fp8_target_t *t, const refit_manifest_t *m, refit_manifest_t **out)
{
    if (!t || !m || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_fp8_target_manifest: NULL argument");
    if (!m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "fp8 manifest: the bf16 manifest is not finalized");
    char layout[REFIT_MANIFEST_MAX_NAME + 1];
    int n = snprintf(layout, sizeof(layout), "%s+fp8", m->layout);
    if (n < 0 || (size_t)n >= sizeof(layout))
        return refit_error(REFIT_ERR_INVALID_ARG, "fp8 manifest: layout name too long");
    refit_manifest_identity_t id = {.model = m->model, .layout = layout, .rank = m->rank, .world = m->world};
    refit_manifest_t *f = NULL;
    uint32_t region;
    refit_status_t st = refit_manifest_create(&id, &f);
    if (!st) st = refit_manifest_add_region(f, t->bytes, &region);
    for (uint32_t i = 0; i < t->n && !st; i++) {
        const entry_t *e = &t->e[i];
        uint32_t li = e->t.local, lid;
        refit_tensor_info_t ti = {.name = e->name, .dtype = e->t.dtype, .ndim = e->t.ndim};
        memcpy(ti.shape, e->t.shape, sizeof(ti.shape));
        if ((st = refit_manifest_add_local(f, &ti, region, e->t.offset, &lid))) break;
        for (uint32_t k = m->pl_start[li]; k < m->pl_start[li + 1] && !st; k++) {
            refit_placement_t p = m->placements.data[m->pl_list[k]];
            if ((st = canon_for(m, p.canon, e->kind, f, &p.canon))) break;
            p.local = lid;
            if (e->kind == 2) { /* the same box on the 128-element block grid (checked at create) */
                uint32_t cn = p.ndim, ln = e->t.ndim;
                for (uint32_t k2 = 0; k2 < 2; k2++) {
                    p.canon_offset[cn - 2 + k2] /= B;
                    p.extent[cn - 2 + k2] = (p.extent[cn - 2 + k2] + B - 1) / B;
                    p.local_offset[ln - 2 + k2] /= B;
                }
            }
            st = refit_manifest_add_placement(f, &p);
        }
    }
    if (!st) st = refit_manifest_finalize(f);
    if (st) {
        refit_manifest_destroy(f);
        return st;
    }
    *out = f;
    return REFIT_OK;
}
