/* Manifest builder, validation, signature and accessors.  The binary codec is
 * in manifest_codec.c.  Validation is shared by finalize and decode, so a
 * decoded manifest is exactly as trustworthy as one built locally. */
#include "layout/manifest.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "plan/box.h"

static refit_status_t check_string(const char *s, const char *what)
{
    if (!s) return refit_error(REFIT_ERR_INVALID_ARG, "%s is NULL", what);
    size_t n = strlen(s);
    if (n == 0 || n > REFIT_MANIFEST_MAX_NAME)
        return refit_error(REFIT_ERR_INVALID_ARG, "%s has length %zu (must be 1..%d)", what, n,
                           REFIT_MANIFEST_MAX_NAME);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            return refit_error(REFIT_ERR_INVALID_ARG, "%s has a byte 0x%02x at %zu (names are printable ASCII)", what,
                               (unsigned char)s[i], i);
    return REFIT_OK;
}

refit_status_t refit_manifest_create(const refit_manifest_identity_t *id, refit_manifest_t **out)
{
    refit_status_t st;
    if (!id || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_manifest_create: NULL argument");
    if ((st = check_string(id->model, "model name")) || (st = check_string(id->layout, "layout string"))) return st;
    if (id->world == 0 || id->rank >= id->world)
        return refit_error(REFIT_ERR_INVALID_ARG, "rank %u is not below world size %u", id->rank, id->world);
    if (id->world > REFIT_MANIFEST_MAX_WORLD)
        return refit_error(REFIT_ERR_INVALID_ARG, "world size %u is above refit's limit of %u", id->world,
                           REFIT_MANIFEST_MAX_WORLD);
    refit_manifest_t *m = calloc(1, sizeof(*m));
    if (!m) goto err_nomem;
    m->model = refit_strdup(id->model);
    m->layout = refit_strdup(id->layout);
    if (!m->model || !m->layout) goto err_free;
    m->rank = id->rank;
    m->world = id->world;
    *out = m;
    return REFIT_OK;
err_free:
    refit_manifest_destroy(m);
err_nomem:
    return refit_error(REFIT_ERR_NO_MEMORY, "creating a manifest");
}

void refit_manifest_destroy(refit_manifest_t *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->canon.len; i++) free(m->canon.data[i].name);
    for (size_t i = 0; i < m->locals.len; i++) free(m->locals.data[i].d.name);
    for (size_t i = 0; i < m->attrs.len; i++) {
        free(m->attrs.data[i].key);
        free(m->attrs.data[i].val);
    }
    REFIT_VEC_FREE(&m->regions);
    REFIT_VEC_FREE(&m->canon);
    REFIT_VEC_FREE(&m->locals);
    REFIT_VEC_FREE(&m->placements);
    REFIT_VEC_FREE(&m->attrs);
    refit_strmap_free(&m->canon_index);
    refit_strmap_free(&m->local_index);
    free(m->pl_start);
    free(m->pl_list);
    free(m->placed);
    free(m->model);
    free(m->layout);
    free(m);
}

static refit_status_t check_building(const refit_manifest_t *m)
{
    if (!m) return refit_error(REFIT_ERR_INVALID_ARG, "manifest is NULL");
    if (m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "manifest is finalized and can no longer change");
    return REFIT_OK;
}

static refit_status_t check_tensor_info(const refit_tensor_info_t *t, const char *what)
{
    refit_status_t st;
    if (!t) return refit_error(REFIT_ERR_INVALID_ARG, "%s is NULL", what);
    if ((st = check_string(t->name, what))) return st;
    if (refit_dtype_size(t->dtype) == 0)
        return refit_error(REFIT_ERR_INVALID_ARG, "%s %s has invalid dtype %d", what, t->name, (int)t->dtype);
    if (t->ndim < 1 || t->ndim > REFIT_MAX_DIMS)
        return refit_error(REFIT_ERR_INVALID_ARG, "%s %s has %u dims (must be 1..%d)", what, t->name, t->ndim,
                           REFIT_MAX_DIMS);
    if (refit_tensor_nbytes(t) == 0)
        return refit_error(REFIT_ERR_INVALID_ARG, "%s %s has a zero dimension or a size that overflows", what, t->name);
    return REFIT_OK;
}

static refit_status_t tdesc_from_info(refit_tdesc_t *d, const refit_tensor_info_t *t)
{
    d->name = refit_strdup(t->name);
    if (!d->name) return refit_error(REFIT_ERR_NO_MEMORY, "copying tensor name");
    d->dtype = t->dtype;
    d->ndim = t->ndim;
    memset(d->shape, 0, sizeof(d->shape));
    memcpy(d->shape, t->shape, t->ndim * sizeof(uint64_t));
    return REFIT_OK;
}

refit_status_t refit_manifest_add_region(refit_manifest_t *m, uint64_t size, uint32_t *id)
{
    refit_status_t st;
    if ((st = check_building(m))) return st;
    if (size == 0) return refit_error(REFIT_ERR_INVALID_ARG, "region of size 0");
    if (m->regions.len >= REFIT_MANIFEST_MAX_ENTRIES) return refit_error(REFIT_ERR_INVALID_ARG, "too many regions");
    if (REFIT_VEC_PUSH(&m->regions, size)) return refit_error(REFIT_ERR_NO_MEMORY, "adding a region");
    if (id) *id = (uint32_t)(m->regions.len - 1);
    return REFIT_OK;
}

static bool same_shape(const refit_tdesc_t *d, const refit_tensor_info_t *t)
{
    if (d->dtype != t->dtype || d->ndim != t->ndim) return false;
    for (uint32_t i = 0; i < t->ndim; i++)
        if (d->shape[i] != t->shape[i]) return false;
    return true;
}

refit_status_t refit_manifest_add_canonical(refit_manifest_t *m, const refit_tensor_info_t *t, uint32_t *id)
{
    refit_status_t st;
    uint32_t found;
    if ((st = check_building(m)) || (st = check_tensor_info(t, "canonical tensor"))) return st;
    if (refit_strmap_get(&m->canon_index, t->name, &found)) {
        if (!same_shape(&m->canon.data[found], t))
            return refit_error(REFIT_ERR_MISMATCH, "canonical tensor %s declared twice with different dtype or shape",
                               t->name);
        if (id) *id = found;
        return REFIT_OK;
    }
    if (m->canon.len >= REFIT_MANIFEST_MAX_ENTRIES) return refit_error(REFIT_ERR_INVALID_ARG, "too many tensors");
    refit_tdesc_t d;
    if ((st = tdesc_from_info(&d, t))) return st;
    if (REFIT_VEC_PUSH(&m->canon, d)) goto err_nomem;
    if (refit_strmap_put(&m->canon_index, m->canon.data[m->canon.len - 1].name, (uint32_t)(m->canon.len - 1))) {
        m->canon.len--;
        goto err_nomem;
    }
    if (id) *id = (uint32_t)(m->canon.len - 1);
    return REFIT_OK;
err_nomem:
    free(d.name);
    return refit_error(REFIT_ERR_NO_MEMORY, "adding canonical tensor %s", t->name);
}

refit_status_t refit_manifest_add_local(refit_manifest_t *m, const refit_tensor_info_t *t, uint32_t region,
                                        uint64_t offset, uint32_t *id)
{
    refit_status_t st;
    uint32_t found;
    if ((st = check_building(m)) || (st = check_tensor_info(t, "local tensor"))) return st;
    if (refit_strmap_get(&m->local_index, t->name, &found))
        return refit_error(REFIT_ERR_INVALID_ARG, "local tensor %s declared twice", t->name);
    if (m->locals.len >= REFIT_MANIFEST_MAX_ENTRIES) return refit_error(REFIT_ERR_INVALID_ARG, "too many tensors");
    refit_local_t l = {.region = region, .offset = offset, .nbytes = refit_tensor_nbytes(t)};
    if ((st = tdesc_from_info(&l.d, t))) return st;
    if (REFIT_VEC_PUSH(&m->locals, l)) goto err_nomem;
    if (refit_strmap_put(&m->local_index, m->locals.data[m->locals.len - 1].d.name, (uint32_t)(m->locals.len - 1))) {
        m->locals.len--;
        goto err_nomem;
    }
    if (id) *id = (uint32_t)(m->locals.len - 1);
    return REFIT_OK;
err_nomem:
    free(l.d.name);
    return refit_error(REFIT_ERR_NO_MEMORY, "adding local tensor %s", t->name);
}

refit_status_t refit_manifest_add_placement(refit_manifest_t *m, const refit_placement_t *p)
{
    refit_status_t st;
    if ((st = check_building(m))) return st;
    if (!p) return refit_error(REFIT_ERR_INVALID_ARG, "placement is NULL");
    if (m->placements.len >= REFIT_MANIFEST_MAX_ENTRIES)
        return refit_error(REFIT_ERR_INVALID_ARG, "too many placements");
    if (REFIT_VEC_PUSH(&m->placements, *p)) return refit_error(REFIT_ERR_NO_MEMORY, "adding a placement");
    return REFIT_OK;
}

void refit_tdesc_strides(const refit_tdesc_t *d, uint64_t strides[REFIT_MAX_DIMS])
{
    uint64_t s = 1;
    for (int i = (int)d->ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= d->shape[i];
    }
    for (uint32_t i = d->ndim; i < REFIT_MAX_DIMS; i++) strides[i] = 0;
}

/* The box a placement covers in its local tensor's coordinates. */
static void placement_local_box(const refit_manifest_t *m, const refit_placement_t *p, refit_box_t *b)
{
    const refit_tdesc_t *l = &m->locals.data[p->local].d;
    uint32_t lead = l->ndim - p->ndim;
    b->ndim = l->ndim;
    for (uint32_t d = 0; d < l->ndim; d++) {
        b->off[d] = p->local_offset[d];
        b->ext[d] = d < lead ? 1 : p->extent[d - lead];
    }
}

refit_box_t refit_placement_box(const refit_placement_t *p)
{
    refit_box_t b = {.ndim = p->ndim};
    for (uint32_t d = 0; d < p->ndim; d++) {
        b.off[d] = p->canon_offset[d];
        b.ext[d] = p->extent[d];
    }
    return b;
}

uint64_t refit_placement_local_index(const refit_manifest_t *m, const refit_placement_t *p,
                                     const uint64_t cpoint[REFIT_MAX_DIMS])
{
    const refit_tdesc_t *l = &m->locals.data[p->local].d;
    uint64_t st[REFIT_MAX_DIMS];
    refit_tdesc_strides(l, st);
    uint32_t lead = l->ndim - p->ndim;
    uint64_t idx = 0;
    for (uint32_t d = 0; d < l->ndim; d++) {
        uint64_t c = p->local_offset[d];
        if (d >= lead) c += cpoint[d - lead] - p->canon_offset[d - lead];
        idx += c * st[d];
    }
    return idx;
}

static refit_status_t validate_placement(const refit_manifest_t *m, size_t i)
{
    const refit_placement_t *p = &m->placements.data[i];
    if (p->canon >= m->canon.len || p->local >= m->locals.len)
        return refit_error(REFIT_ERR_INVALID_ARG, "placement %zu refers to tensor ids %u/%u out of range", i, p->canon,
                           p->local);
    const refit_tdesc_t *c = &m->canon.data[p->canon];
    const refit_tdesc_t *l = &m->locals.data[p->local].d;
    if (p->ndim != c->ndim)
        return refit_error(REFIT_ERR_INVALID_ARG, "placement %zu of %s has %u dims, the tensor has %u", i, c->name,
                           p->ndim, c->ndim);
    if (l->ndim < c->ndim)
        return refit_error(REFIT_ERR_MISMATCH,
                           "placement %zu: local tensor %s has fewer dims (%u) than canonical %s (%u)", i, l->name,
                           l->ndim, c->name, c->ndim);
    if (l->dtype != c->dtype)
        return refit_error(REFIT_ERR_MISMATCH, "placement %zu: local tensor %s is %s but canonical %s is %s", i,
                           l->name, refit_dtype_name(l->dtype), c->name, refit_dtype_name(c->dtype));
    uint32_t lead = l->ndim - c->ndim;
    for (uint32_t d = 0; d < c->ndim; d++) {
        uint64_t end;
        if (p->extent[d] == 0)
            return refit_error(REFIT_ERR_INVALID_ARG, "placement %zu of %s has zero extent in dim %u", i, c->name, d);
        if (!refit_add_u64(p->canon_offset[d], p->extent[d], &end) || end > c->shape[d])
            return refit_error(REFIT_ERR_OUT_OF_BOUNDS,
                               "placement %zu: box of %s ends at %" PRIu64 " in dim %u, beyond its size %" PRIu64, i,
                               c->name, p->canon_offset[d] + p->extent[d], d, c->shape[d]);
        if (!refit_add_u64(p->local_offset[lead + d], p->extent[d], &end) || end > l->shape[lead + d])
            return refit_error(
                REFIT_ERR_OUT_OF_BOUNDS,
                "placement %zu of %s: local box ends at %" PRIu64 " in dim %u of %s, beyond its size %" PRIu64, i,
                c->name, p->local_offset[lead + d] + p->extent[d], lead + d, l->name, l->shape[lead + d]);
    }
    for (uint32_t d = 0; d < lead; d++)
        if (p->local_offset[d] >= l->shape[d])
            return refit_error(REFIT_ERR_OUT_OF_BOUNDS,
                               "placement %zu of %s: local index %" PRIu64 " in dim %u of %s beyond its size %" PRIu64,
                               i, c->name, p->local_offset[d], d, l->name, l->shape[d]);
    return REFIT_OK;
}

refit_status_t refit_manifest_validate(const refit_manifest_t *m)
{
    refit_status_t st;
    char b1[160], b2[160];
    if (m->world == 0 || m->rank >= m->world)
        return refit_error(REFIT_ERR_INVALID_ARG, "rank %u is not below world size %u", m->rank, m->world);
    /* Local tensors lie inside their regions and never share bytes. */
    refit_box_t *boxes = NULL;
    uint32_t *groups = NULL;
    size_t n = m->locals.len > m->placements.len ? m->locals.len : m->placements.len;
    if (n) {
        boxes = malloc(n * sizeof(*boxes));
        groups = malloc(n * sizeof(*groups));
        if (!boxes || !groups) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "validating a manifest");
            goto out;
        }
    }
    for (size_t i = 0; i < m->locals.len; i++) {
        const refit_local_t *l = &m->locals.data[i];
        uint64_t end;
        if (l->region >= m->regions.len) {
            st = refit_error(REFIT_ERR_INVALID_ARG, "local tensor %s is in region %u of %zu", l->d.name, l->region,
                             m->regions.len);
            goto out;
        }
        if (!refit_add_u64(l->offset, l->nbytes, &end) || end > m->regions.data[l->region]) {
            st = refit_error(REFIT_ERR_OUT_OF_BOUNDS,
                             "local tensor %s (bytes %" PRIu64 "..%" PRIu64 ") lies outside region %u of %" PRIu64
                             " bytes",
                             l->d.name, l->offset, l->offset + l->nbytes, l->region, m->regions.data[l->region]);
            goto out;
        }
        boxes[i] = (refit_box_t){.ndim = 1, .off = {l->offset}, .ext = {l->nbytes}};
        groups[i] = l->region;
    }
    size_t oi, oj;
    int err;
    if (refit_boxes_find_overlap(boxes, groups, m->locals.len, &oi, &oj, &err)) {
        st = refit_error(REFIT_ERR_OVERLAP, "local tensors %s and %s share bytes of region %u",
                         m->locals.data[oi].d.name, m->locals.data[oj].d.name, m->locals.data[oi].region);
        goto out;
    }
    if (err) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "validating a manifest");
        goto out;
    }
    /* Placements are in bounds and never write the same local element twice. */
    for (size_t i = 0; i < m->placements.len; i++) {
        if ((st = validate_placement(m, i))) goto out;
        placement_local_box(m, &m->placements.data[i], &boxes[i]);
        groups[i] = m->placements.data[i].local;
    }
    if (refit_boxes_find_overlap(boxes, groups, m->placements.len, &oi, &oj, &err)) {
        const refit_placement_t *a = &m->placements.data[oi], *b = &m->placements.data[oj];
        st = refit_error(REFIT_ERR_OVERLAP, "placements of %s and %s overlap in local tensor %s at %s and %s",
                         m->canon.data[a->canon].name, m->canon.data[b->canon].name, m->locals.data[a->local].d.name,
                         refit_box_format(&boxes[oi], b1, sizeof(b1)), refit_box_format(&boxes[oj], b2, sizeof(b2)));
        goto out;
    }
    st = err ? refit_error(REFIT_ERR_NO_MEMORY, "validating a manifest") : REFIT_OK;
out:
    free(boxes);
    free(groups);
    return st;
}

static void hash_tdesc(refit_hasher_t *h, const refit_tdesc_t *d)
{
    refit_hasher_bytes(h, d->name, strlen(d->name));
    refit_hasher_u64(h, (uint64_t)d->dtype);
    refit_hasher_u64(h, d->ndim);
    for (uint32_t i = 0; i < d->ndim; i++) refit_hasher_u64(h, d->shape[i]);
}

uint64_t refit_manifest_compute_signature(const refit_manifest_t *m)
{
    refit_hasher_t h;
    refit_hasher_init(&h, 0x7265666974ULL);
    refit_hasher_bytes(&h, m->model, strlen(m->model));
    refit_hasher_bytes(&h, m->layout, strlen(m->layout));
    refit_hasher_u64(&h, m->rank);
    refit_hasher_u64(&h, m->world);
    refit_hasher_u64(&h, m->regions.len);
    for (size_t i = 0; i < m->regions.len; i++) refit_hasher_u64(&h, m->regions.data[i]);
    refit_hasher_u64(&h, m->canon.len);
    for (size_t i = 0; i < m->canon.len; i++) hash_tdesc(&h, &m->canon.data[i]);
    refit_hasher_u64(&h, m->locals.len);
    for (size_t i = 0; i < m->locals.len; i++) {
        hash_tdesc(&h, &m->locals.data[i].d);
        refit_hasher_u64(&h, m->locals.data[i].region);
        refit_hasher_u64(&h, m->locals.data[i].offset);
    }
    refit_hasher_u64(&h, m->placements.len);
    for (size_t i = 0; i < m->placements.len; i++) {
        const refit_placement_t *p = &m->placements.data[i];
        uint32_t lnd = m->locals.data[p->local].d.ndim;
        refit_hasher_u64(&h, ((uint64_t)p->canon << 32) | p->local);
        for (uint32_t d = 0; d < p->ndim; d++) {
            refit_hasher_u64(&h, p->canon_offset[d]);
            refit_hasher_u64(&h, p->extent[d]);
        }
        for (uint32_t d = 0; d < lnd; d++) refit_hasher_u64(&h, p->local_offset[d]);
    }
    uint64_t s = refit_hasher_done(&h);
    return s ? s : 1; /* 0 means "not finalized" */
}

refit_status_t refit_manifest_finalize(refit_manifest_t *m)
{
    refit_status_t st;
    if (!m) return refit_error(REFIT_ERR_INVALID_ARG, "manifest is NULL");
    if (m->finalized) return REFIT_OK;
    if ((st = refit_manifest_validate(m))) return st;
    size_t nl = m->locals.len, np = m->placements.len;
    m->pl_start = calloc(nl + 1, sizeof(uint32_t));
    m->pl_list = malloc((np ? np : 1) * sizeof(uint32_t));
    m->placed = calloc(nl ? nl : 1, sizeof(uint64_t));
    if (!m->pl_start || !m->pl_list || !m->placed) {
        free(m->pl_start), free(m->pl_list), free(m->placed);
        m->pl_start = m->pl_list = NULL;
        m->placed = NULL;
        return refit_error(REFIT_ERR_NO_MEMORY, "finalizing a manifest");
    }
    for (size_t i = 0; i < np; i++) {
        const refit_placement_t *p = &m->placements.data[i];
        uint64_t v = 1;
        for (uint32_t d = 0; d < p->ndim; d++) v *= p->extent[d];
        m->placed[p->local] += v;
        m->pl_start[p->local + 1]++;
    }
    for (size_t l = 0; l < nl; l++) m->pl_start[l + 1] += m->pl_start[l];
    for (size_t i = 0; i < np; i++) {
        uint32_t l = m->placements.data[i].local;
        m->pl_list[m->pl_start[l]++] = (uint32_t)i;
    }
    for (size_t l = nl; l > 0; l--) m->pl_start[l] = m->pl_start[l - 1];
    m->pl_start[0] = 0;
    m->signature = refit_manifest_compute_signature(m);
    m->finalized = true;
    return REFIT_OK;
}

refit_status_t refit_manifest_set_attr(refit_manifest_t *m, const char *key, const void *val, size_t len)
{
    refit_status_t st;
    if (!m) return refit_error(REFIT_ERR_INVALID_ARG, "manifest is NULL");
    if ((st = check_string(key, "attribute key"))) return st;
    if (len && !val) return refit_error(REFIT_ERR_INVALID_ARG, "attribute %s: NULL value", key);
    void *copy = malloc(len ? len : 1);
    if (!copy) return refit_error(REFIT_ERR_NO_MEMORY, "attribute %s", key);
    if (len) memcpy(copy, val, len);
    for (size_t i = 0; i < m->attrs.len; i++)
        if (strcmp(m->attrs.data[i].key, key) == 0) {
            free(m->attrs.data[i].val);
            m->attrs.data[i].val = copy;
            m->attrs.data[i].len = len;
            return REFIT_OK;
        }
    refit_attr_t a = {refit_strdup(key), copy, len};
    if (!a.key || REFIT_VEC_PUSH(&m->attrs, a)) {
        free(a.key);
        free(copy);
        return refit_error(REFIT_ERR_NO_MEMORY, "attribute %s", key);
    }
    return REFIT_OK;
}

refit_status_t refit_manifest_get_attr(const refit_manifest_t *m, const char *key, const void **val, size_t *len)
{
    for (size_t i = 0; m && key && i < m->attrs.len; i++)
        if (strcmp(m->attrs.data[i].key, key) == 0) {
            if (val) *val = m->attrs.data[i].val;
            if (len) *len = m->attrs.data[i].len;
            return REFIT_OK;
        }
    return refit_error(REFIT_ERR_NOT_FOUND, "manifest has no attribute %s", key ? key : "(null)");
}

void refit_manifest_identity(const refit_manifest_t *m, refit_manifest_identity_t *out)
{
    out->model = m->model;
    out->layout = m->layout;
    out->rank = m->rank;
    out->world = m->world;
}

uint64_t refit_manifest_signature(const refit_manifest_t *m) { return m->finalized ? m->signature : 0; }
uint32_t refit_manifest_num_regions(const refit_manifest_t *m) { return (uint32_t)m->regions.len; }
uint64_t refit_manifest_region_size(const refit_manifest_t *m, uint32_t r) { return m->regions.data[r]; }
uint32_t refit_manifest_num_canonical(const refit_manifest_t *m) { return (uint32_t)m->canon.len; }
uint32_t refit_manifest_num_locals(const refit_manifest_t *m) { return (uint32_t)m->locals.len; }
uint32_t refit_manifest_num_placements(const refit_manifest_t *m) { return (uint32_t)m->placements.len; }

static void info_of(const refit_tdesc_t *d, refit_tensor_info_t *out)
{
    out->name = d->name;
    out->dtype = d->dtype;
    out->ndim = d->ndim;
    memcpy(out->shape, d->shape, sizeof(out->shape));
}

void refit_manifest_canonical(const refit_manifest_t *m, uint32_t id, refit_tensor_info_t *out)
{
    info_of(&m->canon.data[id], out);
}

void refit_manifest_local(const refit_manifest_t *m, uint32_t id, refit_tensor_info_t *out, uint32_t *region,
                          uint64_t *offset)
{
    const refit_local_t *l = &m->locals.data[id];
    if (out) info_of(&l->d, out);
    if (region) *region = l->region;
    if (offset) *offset = l->offset;
}

void refit_manifest_placement(const refit_manifest_t *m, uint32_t i, refit_placement_t *out)
{
    *out = m->placements.data[i];
}

typedef REFIT_VEC(refit_box_t) boxvec_t;

refit_status_t refit_manifest_padding(const refit_manifest_t *m, uint32_t li, refit_box_t **boxes_out, size_t *n_out)
{
    const refit_local_t *l = &m->locals.data[li];
    boxvec_t todo = {0}, next = {0};
    refit_box_t whole = {.ndim = l->d.ndim};
    uint64_t numel = 1;
    for (uint32_t d = 0; d < l->d.ndim; d++) whole.ext[d] = l->d.shape[d], numel *= l->d.shape[d];
    *boxes_out = NULL;
    *n_out = 0;
    if (m->placed[li] == numel) return REFIT_OK;
    if (REFIT_VEC_PUSH(&todo, whole)) goto nomem;
    for (uint32_t k = m->pl_start[li]; k < m->pl_start[li + 1] && todo.len; k++) {
        refit_box_t pb;
        placement_local_box(m, &m->placements.data[m->pl_list[k]], &pb);
        next.len = 0;
        for (size_t u = 0; u < todo.len; u++) {
            refit_box_t rest[2 * REFIT_MAX_DIMS];
            size_t nr = refit_box_subtract(&todo.data[u], &pb, rest);
            for (size_t r = 0; r < nr; r++)
                if (REFIT_VEC_PUSH(&next, rest[r])) goto nomem;
        }
        boxvec_t tmp = todo;
        todo = next;
        next = tmp;
    }
    REFIT_VEC_FREE(&next);
    *boxes_out = todo.data;
    *n_out = todo.len;
    return REFIT_OK;
nomem:
    REFIT_VEC_FREE(&todo);
    REFIT_VEC_FREE(&next);
    return refit_error(REFIT_ERR_NO_MEMORY, "computing padding of %s", l->d.name);
}
