/* Layout strings, geometry rules that do not depend on the model, and the
 * local-tensor/placement emitters shared by the scheme files. */
#include "layout/layout.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

uint64_t refit_round_up(uint64_t x, uint64_t m) { return m ? (x + m - 1) / m * m : x; }

static uint32_t gcd32(uint32_t a, uint32_t b)
{
    while (b) {
        uint32_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

typedef struct {
    const char *name;
    size_t field;
    bool megatron, vllm;
    uint32_t max; /* REFIT_LAYOUT_MAX_* for the parallel sizes; pad, first and last allocate nothing */
} knob_t;

static const knob_t g_knobs[] = {
    {"tp", offsetof(refit_layout_t, tp), true, true, REFIT_LAYOUT_MAX_TP},
    {"pp", offsetof(refit_layout_t, pp), true, false, REFIT_LAYOUT_MAX_PP},
    {"ep", offsetof(refit_layout_t, ep), true, true, REFIT_LAYOUT_MAX_EP},
    {"etp", offsetof(refit_layout_t, etp), true, false, REFIT_LAYOUT_MAX_ETP},
    {"dp", offsetof(refit_layout_t, dp), true, true, REFIT_LAYOUT_MAX_DP},
    {"pad", offsetof(refit_layout_t, pad), true, true, 65536},
    {"first", offsetof(refit_layout_t, first), true, false, 65536},
    {"last", offsetof(refit_layout_t, last), true, false, 65536},
    {"mtp", offsetof(refit_layout_t, mtp), true, false, REFIT_MODEL_MAX_MTP_LAYERS},
};

static refit_status_t parse_knobs(refit_layout_t *l, const char *spec, const char *args)
{
    char buf[256];
    if (strlen(args) >= sizeof(buf)) return refit_error(REFIT_ERR_PARSE, "layout '%s' is too long", spec);
    strcpy(buf, args);
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) return refit_error(REFIT_ERR_PARSE, "layout '%s': '%s' is not knob=value", spec, kv);
        *eq = '\0';
        if (l->scheme == REFIT_SCHEME_VLLM && strcmp(kv, "names") == 0) {
            uint32_t v = !strcmp(eq + 1, "fused")    ? REFIT_VLLM_NAMES_FUSED
                         : !strcmp(eq + 1, "routed") ? REFIT_VLLM_NAMES_ROUTED
                                                     : UINT32_MAX;
            if (v == UINT32_MAX)
                return refit_error(
                    REFIT_ERR_PARSE,
                    "layout '%s': names=%s is neither routed (vLLM 0.32: "
                    "mlp.experts.routed_experts.w13_weight) nor fused (older vLLM: mlp.experts.w13_weight)",
                    spec, eq + 1);
            if (l->names != UINT32_MAX) return refit_error(REFIT_ERR_PARSE, "layout '%s': names given twice", spec);
            l->names = v;
            continue;
        }
        if (l->scheme == REFIT_SCHEME_VLLM && strcmp(kv, "draft") == 0) {
            if (strcmp(eq + 1, "mtp") != 0)
                return refit_error(REFIT_ERR_PARSE,
                                   "layout '%s': draft=%s is not a draft model refit describes (draft=mtp: vLLM's "
                                   "DeepSeek MTP draft; leave draft out for the target model)",
                                   spec, eq + 1);
            if (l->draft != UINT32_MAX) return refit_error(REFIT_ERR_PARSE, "layout '%s': draft given twice", spec);
            l->draft = REFIT_VLLM_DRAFT_MTP;
            continue;
        }
        const knob_t *k = NULL;
        for (size_t i = 0; i < REFIT_ARRAY_LEN(g_knobs); i++)
            if (strcmp(g_knobs[i].name, kv) == 0 &&
                (l->scheme == REFIT_SCHEME_MEGATRON ? g_knobs[i].megatron : g_knobs[i].vllm))
                k = &g_knobs[i];
        if (!k)
            return refit_error(REFIT_ERR_PARSE, "layout '%s': unknown knob '%s' (%s takes %s)", spec, kv,
                               l->scheme == REFIT_SCHEME_MEGATRON ? "megatron" : "vllm",
                               l->scheme == REFIT_SCHEME_MEGATRON ? "tp, pp, ep, etp, dp, pad, first, last, mtp"
                                                                  : "tp, ep, dp, pad, names, draft");
        char *end;
        errno = 0;
        unsigned long v = strtoul(eq + 1, &end, 10);
        bool zero_ok = strcmp(k->name, "pad") == 0 || strcmp(k->name, "first") == 0 || strcmp(k->name, "last") == 0 ||
                       strcmp(k->name, "mtp") == 0;
        bool digits = end != eq + 1 && !*end && eq[1] != '-';
        if (digits && (errno == ERANGE || v > k->max))
            return refit_error(REFIT_ERR_GEOMETRY, "layout '%s': %s=%s is above refit's limit of %u", spec, kv, eq + 1,
                               k->max);
        if (errno || !digits || (!zero_ok && v == 0))
            return refit_error(REFIT_ERR_PARSE, "layout '%s': %s=%s is not a %s integer", spec, kv, eq + 1,
                               zero_ok ? "non-negative" : "positive");
        uint32_t *slot = (uint32_t *)((char *)l + k->field);
        if (*slot != UINT32_MAX) return refit_error(REFIT_ERR_PARSE, "layout '%s': %s given twice", spec, kv);
        *slot = (uint32_t)v;
    }
    return REFIT_OK;
}

refit_status_t refit_layout_parse(const char *spec, refit_layout_t **out)
{
    refit_status_t st;
    if (!spec || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_layout_parse: NULL argument");
    refit_layout_t l;
    memset(&l, 0xff, sizeof(l)); /* every knob "unset" */
    const char *colon = strchr(spec, ':');
    size_t nlen = colon ? (size_t)(colon - spec) : strlen(spec);
    if (nlen == 2 && strncmp(spec, "hf", 2) == 0) l.scheme = REFIT_SCHEME_HF;
    else if (nlen == 8 && strncmp(spec, "megatron", 8) == 0) l.scheme = REFIT_SCHEME_MEGATRON;
    else if (nlen == 4 && strncmp(spec, "vllm", 4) == 0) l.scheme = REFIT_SCHEME_VLLM;
    else if (nlen == 7 && strncmp(spec, "dtensor", 7) == 0) l.scheme = REFIT_SCHEME_DTENSOR;
    else
        return refit_error(REFIT_ERR_NOT_FOUND,
                           "unknown layout scheme '%.*s' in '%s' (known: hf, megatron, vllm, dtensor)", (int)nlen, spec,
                           spec);
    if (l.scheme == REFIT_SCHEME_DTENSOR) {
        if ((st = refit_scheme_dtensor_parse(&l, spec, colon ? colon + 1 : ""))) return st;
    } else if (l.scheme == REFIT_SCHEME_HF) {
        if (colon && colon[1]) return refit_error(REFIT_ERR_PARSE, "layout '%s': hf takes no knobs", spec);
        l.tp = l.pp = l.ep = l.etp = l.dp = 1;
        l.pad = l.first = l.last = 0;
        l.names = REFIT_VLLM_NAMES_FUSED;
        l.mtp = 0;
        l.draft = REFIT_VLLM_DRAFT_NONE;
    } else if (colon && colon[1] && (st = parse_knobs(&l, spec, colon + 1))) {
        return st;
    }
    if (l.scheme != REFIT_SCHEME_DTENSOR) l.rep = 1, l.fused = 0;
    if (l.scheme != REFIT_SCHEME_MEGATRON) l.mtp = 0;
    if (l.scheme != REFIT_SCHEME_VLLM) l.draft = REFIT_VLLM_DRAFT_NONE;
    if (l.tp == UINT32_MAX) l.tp = 1;
    if (l.pp == UINT32_MAX) l.pp = 1;
    if (l.ep == UINT32_MAX) l.ep = 1;
    if (l.scheme == REFIT_SCHEME_MEGATRON) {
        if (l.etp == UINT32_MAX) l.etp = l.tp;
        l.names = REFIT_VLLM_NAMES_FUSED;
        uint32_t ee = l.ep * l.etp;
        if (l.dp == UINT32_MAX) l.dp = ee / gcd32(ee, l.tp); /* least dp with ee | tp*dp */
        if (l.pad == UINT32_MAX) l.pad = 128;
        if (l.first == UINT32_MAX) l.first = 0;
        if (l.last == UINT32_MAX) l.last = 0;
        if (l.mtp == UINT32_MAX) l.mtp = 0;
        if ((l.first || l.last) && l.pp < 2)
            return refit_error(REFIT_ERR_GEOMETRY, "layout '%s': first= and last= need pp >= 2", spec);
        if ((uint64_t)l.tp * l.dp % ee != 0)
            return refit_error(REFIT_ERR_GEOMETRY,
                               "layout '%s': expert parallel x expert tensor parallel (%u x %u = %u) must divide "
                               "tensor x data parallel (%u x %u = %u)",
                               spec, l.ep, l.etp, ee, l.tp, l.dp, l.tp * l.dp);
        int n = snprintf(l.str, sizeof(l.str), "megatron:tp=%u,pp=%u,ep=%u,etp=%u,dp=%u,pad=%u", l.tp, l.pp, l.ep,
                         l.etp, l.dp, l.pad);
        if (l.first) n += snprintf(l.str + n, sizeof(l.str) - (size_t)n, ",first=%u", l.first);
        if (l.last) n += snprintf(l.str + n, sizeof(l.str) - (size_t)n, ",last=%u", l.last);
        if (l.mtp) snprintf(l.str + n, sizeof(l.str) - (size_t)n, ",mtp=%u", l.mtp);
    } else if (l.scheme == REFIT_SCHEME_VLLM) {
        if (l.dp == UINT32_MAX) l.dp = l.ep > l.tp && l.ep % l.tp == 0 ? l.ep / l.tp : 1;
        if (l.pad == UINT32_MAX) l.pad = 64;
        l.etp = 1;
        l.first = l.last = 0;
        if (l.ep != 1 && l.ep != l.tp * l.dp)
            return refit_error(REFIT_ERR_GEOMETRY,
                               "layout '%s': vllm's expert parallel size is 1 (off) or tp x dp = %u (on), not %u", spec,
                               l.tp * l.dp, l.ep);
        if (l.names == UINT32_MAX) l.names = REFIT_VLLM_NAMES_FUSED;
        if (l.draft == UINT32_MAX) l.draft = REFIT_VLLM_DRAFT_NONE;
        snprintf(l.str, sizeof(l.str), "vllm:tp=%u,ep=%u,dp=%u,pad=%u%s%s", l.tp, l.ep, l.dp, l.pad,
                 l.names == REFIT_VLLM_NAMES_ROUTED ? ",names=routed" : "",
                 l.draft == REFIT_VLLM_DRAFT_MTP ? ",draft=mtp" : "");
    } else if (l.scheme == REFIT_SCHEME_HF) {
        snprintf(l.str, sizeof(l.str), "hf");
    }
    /* Each knob is within its limit (parse_knobs), so the products above fit
     * 32 bits; their product, the world, is bounded here. */
    uint64_t world = (uint64_t)l.tp * l.pp * l.dp * l.rep;
    if (world > REFIT_LAYOUT_MAX_WORLD)
        return refit_error(
            REFIT_ERR_GEOMETRY,
            "layout '%s': a world of %" PRIu64 " ranks (tp %u x pp %u x dp %u%s) is above refit's limit of %u", spec,
            world, l.tp, l.pp, l.dp * l.rep, l.rep > 1 ? ", replicate included" : "", REFIT_LAYOUT_MAX_WORLD);
    l.world = (uint32_t)world;
    refit_layout_t *p = malloc(sizeof(*p));
    if (!p) return refit_error(REFIT_ERR_NO_MEMORY, "allocating a layout");
    *p = l;
    *out = p;
    return REFIT_OK;
}

void refit_layout_destroy(refit_layout_t *l) { free(l); }
const char *refit_layout_string(const refit_layout_t *l) { return l->str; }
uint32_t refit_layout_world(const refit_layout_t *l) { return l->world; }

refit_status_t refit_layout_check(const refit_layout_t *l, const refit_model_t *model)
{
    if (!l || !model) return refit_error(REFIT_ERR_INVALID_ARG, "refit_layout_check: NULL argument");
    switch (l->scheme) {
    case REFIT_SCHEME_MEGATRON: return refit_scheme_megatron_check(l, &model->spec);
    case REFIT_SCHEME_VLLM: return refit_scheme_vllm_check(l, &model->spec);
    case REFIT_SCHEME_DTENSOR: return refit_scheme_dtensor_check(l, &model->spec);
    default: return REFIT_OK;
    }
}

refit_status_t refit_layout_manifest(const refit_layout_t *l, const refit_model_t *model, uint32_t rank,
                                     refit_manifest_t **out)
{
    refit_status_t st;
    if (!l || !model || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_layout_manifest: NULL argument");
    if ((st = refit_layout_check(l, model))) return st;
    if (rank >= l->world)
        return refit_error(REFIT_ERR_INVALID_ARG, "rank %u is not below the world size %u of %s", rank, l->world,
                           l->str);
    refit_manifest_identity_t id = {model->spec.name, l->str, rank, l->world};
    refit_lbuild_t b = {.model = model};
    if ((st = refit_manifest_create(&id, &b.m))) return st;
    switch (l->scheme) {
    case REFIT_SCHEME_HF: st = refit_scheme_hf(&b, l, rank); break;
    case REFIT_SCHEME_MEGATRON: st = refit_scheme_megatron(&b, l, rank); break;
    case REFIT_SCHEME_VLLM: st = refit_scheme_vllm(&b, l, rank); break;
    case REFIT_SCHEME_DTENSOR: st = refit_scheme_dtensor(&b, l, rank); break;
    }
    if (!st) st = b.st;
    if (!st) st = refit_manifest_add_region(b.m, b.cursor ? b.cursor : REFIT_LAYOUT_ALIGN, NULL);
    if (!st) st = refit_manifest_finalize(b.m);
    if (st) {
        refit_error_prefix("%s rank %u of %s", model->spec.name, rank, l->str);
        refit_manifest_destroy(b.m);
        return st;
    }
    *out = b.m;
    return REFIT_OK;
}

/* ---- emitters ---------------------------------------------------------- */

uint32_t refit_lb_local(refit_lbuild_t *b, refit_dtype_t dtype, uint32_t ndim, const uint64_t *shape, const char *fmt,
                        ...)
{
    if (b->st) return UINT32_MAX;
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    refit_tensor_info_t t = {.name = name, .dtype = dtype ? dtype : b->model->spec.dtype, .ndim = ndim};
    memcpy(t.shape, shape, ndim * sizeof(uint64_t));
    uint32_t id;
    uint64_t off = refit_round_up(b->cursor, REFIT_LAYOUT_ALIGN);
    if ((b->st = refit_manifest_add_local(b->m, &t, 0, off, &id))) return UINT32_MAX;
    b->cursor = off + refit_tensor_nbytes(&t);
    return id;
}

static uint32_t canon_id(refit_lbuild_t *b, const char *canon)
{
    int64_t i = refit_model_find_tensor(b->model, canon);
    if (i < 0) {
        b->st = refit_error(REFIT_ERR_INTERNAL, "scheme refers to %s, which model %s does not have", canon,
                            b->model->spec.name);
        return UINT32_MAX;
    }
    refit_tensor_info_t info;
    refit_model_tensor(b->model, (size_t)i, &info);
    uint32_t id;
    if ((b->st = refit_manifest_add_canonical(b->m, &info, &id))) return UINT32_MAX;
    return id;
}

static void place(refit_lbuild_t *b, uint32_t local, const char *canon, const uint64_t *coff, const uint64_t *ext,
                  const uint64_t *loff)
{
    if (b->st) return;
    uint32_t c = canon_id(b, canon);
    if (b->st) return;
    refit_placement_t p = {.canon = c, .local = local, .ndim = b->m->canon.data[c].ndim};
    memcpy(p.canon_offset, coff, p.ndim * sizeof(uint64_t));
    memcpy(p.extent, ext, p.ndim * sizeof(uint64_t));
    memcpy(p.local_offset, loff, b->m->locals.data[local].d.ndim * sizeof(uint64_t));
    b->st = refit_manifest_add_placement(b->m, &p);
}

void refit_lb_box(refit_lbuild_t *b, uint32_t local, const char *canon, const uint64_t *coff, const uint64_t *ext,
                  const uint64_t *loff)
{
    place(b, local, canon, coff, ext, loff);
}

void refit_lb_rows(refit_lbuild_t *b, uint32_t local, uint64_t lead, uint64_t lrow, const char *canon, uint64_t crow,
                   uint64_t nrows)
{
    if (b->st || nrows == 0) return;
    uint32_t c = canon_id(b, canon);
    if (b->st) return;
    const refit_tdesc_t *cd = &b->m->canon.data[c];
    uint64_t coff[REFIT_MAX_DIMS] = {crow}, ext[REFIT_MAX_DIMS] = {nrows}, loff[REFIT_MAX_DIMS] = {0};
    for (uint32_t d = 1; d < cd->ndim; d++) ext[d] = cd->shape[d];
    uint32_t lnd = b->m->locals.data[local].d.ndim;
    if (lnd > cd->ndim) {
        loff[0] = lead;
        loff[lnd - cd->ndim] = lrow;
    } else {
        loff[0] = lrow;
    }
    place(b, local, canon, coff, ext, loff);
}

void refit_lb_cols(refit_lbuild_t *b, uint32_t local, uint64_t lead, const char *canon, uint64_t ccol, uint64_t ncols)
{
    if (b->st) return;
    uint32_t c = canon_id(b, canon);
    if (b->st) return;
    const refit_tdesc_t *cd = &b->m->canon.data[c];
    uint64_t coff[REFIT_MAX_DIMS] = {0, ccol}, ext[REFIT_MAX_DIMS] = {cd->shape[0], ncols}, loff[REFIT_MAX_DIMS] = {0};
    if (b->m->locals.data[local].d.ndim == 3) loff[0] = lead;
    place(b, local, canon, coff, ext, loff);
}

void refit_lb_whole(refit_lbuild_t *b, const char *local_name, const char *canon)
{
    if (b->st) return;
    uint32_t c = canon_id(b, canon);
    if (b->st) return;
    const refit_tdesc_t cd = b->m->canon.data[c];
    uint32_t l = refit_lb_local(b, cd.dtype, cd.ndim, cd.shape, "%s", local_name);
    uint64_t zero[REFIT_MAX_DIMS] = {0};
    if (!b->st) place(b, l, canon, zero, cd.shape, zero);
}

void refit_lb_fused_rows(refit_lbuild_t *b, uint32_t local, const refit_fused_seg_t *segs, size_t nsegs, uint64_t lo,
                         uint64_t hi)
{
    for (size_t i = 0; i < nsegs && !b->st; i++) {
        uint64_t s0 = segs[i].frow, s1 = segs[i].frow + segs[i].nrows;
        uint64_t a = s0 > lo ? s0 : lo, z = s1 < hi ? s1 : hi;
        if (a < z) refit_lb_rows(b, local, 0, a - lo, segs[i].canon, segs[i].crow + (a - s0), z - a);
    }
}
