/* safetensors reader and the "hf" source (a Hugging Face checkpoint directory
 * mapped read-only and described as an hf-layout manifest, one region per
 * shard).  Every header is validated completely before use; the file is
 * untrusted input (tests/fuzz/fuzz_safetensors.c). */
#include "refit/experimental/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/file.h"
#include "model/model.h"
#include "refit/engine.h"
#include "util/json.h"
#include "util/util.h"

typedef struct {
    const char *name; /* into the JSON tree */
    refit_tensor_info_t info;
    uint64_t begin, end; /* into the data section */
} st_entry_t;

struct refit_safetensors {
    const unsigned char *buf;
    size_t len;
    void *map; /* non-NULL when this reader mapped the file */
    refit_json_t *root;
    uint64_t data_start;
    st_entry_t *e;
    size_t n;
};

static const struct {
    const char *name;
    refit_dtype_t dtype; /* INVALID: valid safetensors, no refit dtype */
    unsigned size;
} g_dtypes[] = {
    {"BF16", REFIT_DTYPE_BF16, 2},       {"F16", REFIT_DTYPE_F16, 2}, {"F32", REFIT_DTYPE_F32, 4},
    {"F8_E4M3", REFIT_DTYPE_F8_E4M3, 1}, {"I32", REFIT_DTYPE_I32, 4}, {"I64", REFIT_DTYPE_I64, 8},
    {"U8", REFIT_DTYPE_U8, 1},
};

static void st_free(refit_safetensors_t *f)
{
    if (!f) return;
    free(f->e);
    refit_json_free(f->root);
    if (f->map) munmap(f->map, f->len);
    free(f);
}

static int cmp_begin(const void *a, const void *b)
{
    const st_entry_t *x = *(const st_entry_t *const *)a, *y = *(const st_entry_t *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

static refit_status_t parse_entry(const char *name, const refit_json_t *v, uint64_t data_len, st_entry_t *out)
{
    if (refit_json_type(v) != REFIT_JSON_OBJECT)
        return refit_error(REFIT_ERR_PARSE, "safetensors tensor \"%s\": entry is a %s, not an object", name,
                           refit_json_type_name(refit_json_type(v)));
    for (size_t k = 0; k < refit_json_len(v); k++) {
        const char *key = refit_json_key(v, k, NULL);
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return refit_error(REFIT_ERR_PARSE, "safetensors tensor \"%s\": unknown field \"%s\"", name, key);
    }
    const char *dt = refit_json_string(refit_json_get(v, "dtype"), NULL);
    if (!dt) return refit_error(REFIT_ERR_PARSE, "safetensors tensor \"%s\": \"dtype\" missing or not a string", name);
    int di = -1;
    for (size_t i = 0; i < REFIT_ARRAY_LEN(g_dtypes); i++)
        if (!strcmp(dt, g_dtypes[i].name)) di = (int)i;
    if (di < 0)
        return refit_error(REFIT_ERR_UNSUPPORTED,
                           "safetensors tensor \"%s\": dtype \"%.32s\" is not supported "
                           "(BF16, F16, F32, F8_E4M3, I32, I64, U8)",
                           name, dt);
    const refit_json_t *shape = refit_json_get(v, "shape");
    if (refit_json_type(shape) != REFIT_JSON_ARRAY)
        return refit_error(REFIT_ERR_PARSE, "safetensors tensor \"%s\": \"shape\" missing or not an array", name);
    size_t nd = refit_json_len(shape);
    if (nd > REFIT_MAX_DIMS)
        return refit_error(REFIT_ERR_UNSUPPORTED, "safetensors tensor \"%s\": %zu dims (at most %d)", name, nd,
                           REFIT_MAX_DIMS);
    memset(out, 0, sizeof(*out));
    out->name = name;
    out->info.name = name;
    out->info.dtype = g_dtypes[di].dtype;
    out->info.ndim = (uint32_t)nd;
    uint64_t bytes = g_dtypes[di].size;
    bool overflow = false;
    for (size_t d = 0; d < nd; d++) {
        int64_t x;
        if (!refit_json_int(refit_json_at(shape, d), &x) || x < 0)
            return refit_error(REFIT_ERR_PARSE, "safetensors tensor \"%s\": shape[%zu] is not a non-negative integer",
                               name, d);
        out->info.shape[d] = (uint64_t)x;
        if (x && bytes > UINT64_MAX / (uint64_t)x) overflow = true;
        else bytes *= (uint64_t)x;
    }
    const refit_json_t *offs = refit_json_get(v, "data_offsets");
    int64_t b, e;
    if (refit_json_type(offs) != REFIT_JSON_ARRAY || refit_json_len(offs) != 2 ||
        !refit_json_int(refit_json_at(offs, 0), &b) || !refit_json_int(refit_json_at(offs, 1), &e) || b < 0 || e < 0)
        return refit_error(REFIT_ERR_PARSE,
                           "safetensors tensor \"%s\": \"data_offsets\" is not [begin, end] "
                           "of non-negative integers",
                           name);
    if (b > e)
        return refit_error(REFIT_ERR_CORRUPT, "safetensors tensor \"%s\": data_offsets [%lld, %lld] end before begin",
                           name, (long long)b, (long long)e);
    if ((uint64_t)e > data_len)
        return refit_error(REFIT_ERR_CORRUPT,
                           "safetensors tensor \"%s\": data_offsets [%lld, %lld] past the end of "
                           "the file (data section is %llu bytes)",
                           name, (long long)b, (long long)e, (unsigned long long)data_len);
    if (overflow || (uint64_t)(e - b) != bytes)
        return refit_error(REFIT_ERR_MISMATCH,
                           "safetensors tensor \"%s\": data_offsets [%lld, %lld] hold %lld bytes, "
                           "dtype %s and its shape need %s%llu",
                           name, (long long)b, (long long)e, (long long)(e - b), dt, overflow ? "more than " : "",
                           (unsigned long long)(overflow ? UINT64_MAX : bytes));
    out->begin = (uint64_t)b;
    out->end = (uint64_t)e;
    return REFIT_OK;
}

static refit_status_t st_parse(refit_safetensors_t *f)
{
    if (f->len < 8)
        return refit_error(REFIT_ERR_CORRUPT, "safetensors: file is %zu bytes, shorter than its 8-byte header length",
                           f->len);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)f->buf[i] << (8 * i);
    if (hl > REFIT_SAFETENSORS_MAX_HEADER)
        return refit_error(REFIT_ERR_CORRUPT, "safetensors: header length %llu exceeds the %u-byte limit",
                           (unsigned long long)hl, REFIT_SAFETENSORS_MAX_HEADER);
    if (hl > f->len - 8)
        return refit_error(REFIT_ERR_CORRUPT,
                           "safetensors: header length %llu exceeds the file (%zu bytes after the "
                           "length)",
                           (unsigned long long)hl, f->len - 8);
    if (hl < 2)
        return refit_error(REFIT_ERR_CORRUPT, "safetensors: header length %llu is too short for a JSON object",
                           (unsigned long long)hl);
    refit_status_t st = refit_json_parse((const char *)f->buf + 8, (size_t)hl, &f->root);
    if (st) {
        refit_error_prefix("safetensors header");
        return st;
    }
    if (refit_json_type(f->root) != REFIT_JSON_OBJECT)
        return refit_error(REFIT_ERR_PARSE, "safetensors header is a %s, not an object",
                           refit_json_type_name(refit_json_type(f->root)));
    f->data_start = 8 + hl;
    uint64_t data_len = f->len - f->data_start;
    size_t nm = refit_json_len(f->root);
    f->e = calloc(nm ? nm : 1, sizeof(*f->e));
    st_entry_t **order = calloc(nm ? nm : 1, sizeof(*order));
    if (!f->e || !order) {
        free(order);
        return refit_error(REFIT_ERR_NO_MEMORY, "safetensors: %zu entries", nm);
    }
    for (size_t i = 0; i < nm; i++) {
        const char *key = refit_json_key(f->root, i, NULL);
        const refit_json_t *v = refit_json_at(f->root, i);
        if (!strcmp(key, "__metadata__")) {
            if (refit_json_type(v) != REFIT_JSON_OBJECT) {
                free(order);
                return refit_error(REFIT_ERR_PARSE, "safetensors: __metadata__ is not an object");
            }
            continue;
        }
        if ((st = parse_entry(key, v, data_len, &f->e[f->n]))) {
            free(order);
            return st;
        }
        order[f->n] = &f->e[f->n];
        f->n++;
    }
    qsort(order, f->n, sizeof(*order), cmp_begin);
    const st_entry_t *prev = NULL;
    for (size_t i = 0; i < f->n; i++) {
        if (order[i]->begin == order[i]->end) continue;
        if (prev && order[i]->begin < prev->end) {
            st = refit_error(REFIT_ERR_OVERLAP,
                             "safetensors tensors \"%s\" [%llu, %llu) and \"%s\" [%llu, %llu) share "
                             "bytes",
                             prev->name, (unsigned long long)prev->begin, (unsigned long long)prev->end, order[i]->name,
                             (unsigned long long)order[i]->begin, (unsigned long long)order[i]->end);
            break;
        }
        prev = order[i];
    }
    free(order);
    return st;
}

refit_status_t refit_safetensors_parse(const void *buf, size_t len, refit_safetensors_t **out)
{
    if ((!buf && len) || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_safetensors_parse: NULL argument");
    refit_safetensors_t *f = calloc(1, sizeof(*f));
    if (!f) return refit_error(REFIT_ERR_NO_MEMORY, "safetensors reader");
    f->buf = buf;
    f->len = len;
    refit_status_t st = st_parse(f);
    if (st) {
        st_free(f);
        return st;
    }
    *out = f;
    return REFIT_OK;
}

refit_status_t refit_safetensors_open(const char *path, refit_safetensors_t **out)
{
    if (!path || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_safetensors_open: NULL argument");
    /* A regular file only: opening a FIFO named model.safetensors blocked
     * `publish --from-safetensors` forever. */
    int fd;
    uint64_t size;
    refit_status_t st = refit_open_regular(path, &fd, &size);
    if (st) return st;
    if (size < 8) {
        close(fd);
        return refit_error(REFIT_ERR_CORRUPT,
                           "%s: safetensors file is %llu bytes, shorter than its 8-byte header "
                           "length",
                           path, (unsigned long long)size);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (map == MAP_FAILED) return refit_error(REFIT_ERR_IO, "cannot map %s: %s", path, strerror(err));
    refit_safetensors_t *f = calloc(1, sizeof(*f));
    if (!f) {
        munmap(map, (size_t)size);
        return refit_error(REFIT_ERR_NO_MEMORY, "safetensors reader");
    }
    f->buf = map;
    f->map = map;
    f->len = (size_t)size;
    st = st_parse(f);
    if (st) {
        refit_error_prefix("%s", path);
        st_free(f);
        return st;
    }
    *out = f;
    return REFIT_OK;
}

void refit_safetensors_close(refit_safetensors_t *f) { st_free(f); }
size_t refit_safetensors_count(const refit_safetensors_t *f) { return f ? f->n : 0; }
const void *refit_safetensors_data(const refit_safetensors_t *f) { return f ? f->buf : NULL; }
uint64_t refit_safetensors_size(const refit_safetensors_t *f) { return f ? f->len : 0; }

refit_status_t refit_safetensors_tensor(const refit_safetensors_t *f, size_t i, refit_tensor_info_t *info,
                                        uint64_t *offset, uint64_t *nbytes)
{
    if (!f || i >= f->n) return refit_error(REFIT_ERR_INVALID_ARG, "safetensors tensor %zu out of range", i);
    if (info) *info = f->e[i].info;
    if (offset) *offset = f->data_start + f->e[i].begin;
    if (nbytes) *nbytes = f->e[i].end - f->e[i].begin;
    return REFIT_OK;
}

int64_t refit_safetensors_find(const refit_safetensors_t *f, const char *name)
{
    if (!f || !name) return -1;
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->e[i].name, name)) return (int64_t)i;
    return -1;
}

/* ---- the hf source ---- */

#define HF_MAX_SHARDS REFIT_MAX_REGIONS /* one region per shard */
#define HF_MAX_INDEX_BYTES (64u << 20)  /* real indexes: a few MB */

struct refit_hf_source {
    uint32_t n;
    refit_safetensors_t *f[HF_MAX_SHARDS];
    char *path[HF_MAX_SHARDS];
    refit_json_t *index;    /* the parsed index (NULL for a single model.safetensors) */
    const refit_json_t *wm; /* its weight_map: the shard of every tensor */
};

void refit_hf_source_close(refit_hf_source_t *s)
{
    if (!s) return;
    for (uint32_t i = 0; i < s->n; i++) {
        refit_safetensors_close(s->f[i]);
        free(s->path[i]);
    }
    refit_json_free(s->index);
    free(s);
}

uint32_t refit_hf_source_num_regions(const refit_hf_source_t *s) { return s ? s->n : 0; }
void *refit_hf_source_region(const refit_hf_source_t *s, uint32_t r)
{
    return s && r < s->n ? (void *)(uintptr_t)refit_safetensors_data(s->f[r]) : NULL;
}
const char *refit_hf_source_file(const refit_hf_source_t *s, uint32_t r) { return s && r < s->n ? s->path[r] : NULL; }

static refit_status_t add_shard(refit_hf_source_t *s, const char *dir, const char *file)
{
    for (uint32_t i = 0; i < s->n; i++)
        if (!strcmp(strrchr(s->path[i], '/') + 1, file)) return REFIT_OK;
    if (strchr(file, '/') || !strcmp(file, "..") || !*file)
        return refit_error(REFIT_ERR_CORRUPT, "index names shard \"%s\", not a file of the directory", file);
    if (s->n == HF_MAX_SHARDS)
        return refit_error(REFIT_ERR_UNSUPPORTED,
                           "more than %u shards (a publisher has at most REFIT_MAX_REGIONS regions)", HF_MAX_SHARDS);
    char *p = refit_asprintf("%s/%s", dir, file);
    if (!p) return refit_error(REFIT_ERR_NO_MEMORY, "path");
    refit_status_t st = refit_safetensors_open(p, &s->f[s->n]);
    if (st) {
        free(p);
        return st;
    }
    s->path[s->n++] = p;
    return REFIT_OK;
}

static refit_status_t open_shards(refit_hf_source_t *s, const char *dir)
{
    char *idx = refit_asprintf("%s/model.safetensors.index.json", dir);
    if (!idx) return refit_error(REFIT_ERR_NO_MEMORY, "path");
    refit_status_t st;
    if (access(idx, F_OK) != 0) {
        free(idx);
        char *single = refit_asprintf("%s/model.safetensors", dir);
        if (!single) return refit_error(REFIT_ERR_NO_MEMORY, "path");
        bool there = access(single, F_OK) == 0;
        free(single);
        if (!there)
            return refit_error(REFIT_ERR_IO, "%s holds neither model.safetensors.index.json nor model.safetensors",
                               dir);
        return add_shard(s, dir, "model.safetensors");
    }
    char *text = NULL;
    size_t len = 0;
    refit_json_t *root = NULL;
    if ((st = refit_read_regular(idx, HF_MAX_INDEX_BYTES, &text, &len))) goto out;
    if ((st = refit_json_parse(text, len, &root))) {
        refit_error_prefix("%s", idx);
        goto out;
    }
    const refit_json_t *wm = NULL;
    wm = refit_json_get(root, "weight_map");
    if (refit_json_type(wm) != REFIT_JSON_OBJECT) {
        st = refit_error(REFIT_ERR_PARSE, "%s: \"weight_map\" missing or not an object", idx);
        goto out;
    }
    for (size_t i = 0; i < refit_json_len(wm); i++) {
        const char *file = refit_json_string(refit_json_at(wm, i), NULL);
        if (!file) {
            st = refit_error(REFIT_ERR_PARSE, "%s: weight_map[\"%s\"] is not a string", idx,
                             refit_json_key(wm, i, NULL));
            goto out;
        }
        if ((st = add_shard(s, dir, file))) goto out;
        /* The index must not name a tensor its shard lacks. */
        const char *tname = refit_json_key(wm, i, NULL);
        for (uint32_t k = 0; k < s->n; k++)
            if (!strcmp(strrchr(s->path[k], '/') + 1, file) && refit_safetensors_find(s->f[k], tname) < 0) {
                st = refit_error(REFIT_ERR_CORRUPT, "%s: tensor %s is mapped to %s, which does not hold it", idx, tname,
                                 file);
                goto out;
            }
    }
out:
    if (st) refit_json_free(root);
    else {
        s->index = root;
        s->wm = wm;
    }
    free(text);
    free(idx);
    return st;
}

refit_status_t refit_hf_source_open(const char *dir, const refit_model_t *model, refit_hf_source_t **src,
                                    refit_manifest_t **manifest)
{
    if (!dir || !model || !src || !manifest)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_hf_source_open: NULL argument");
    refit_hf_source_t *s = calloc(1, sizeof(*s));
    if (!s) return refit_error(REFIT_ERR_NO_MEMORY, "hf source");
    refit_manifest_t *m = NULL;
    refit_status_t st = open_shards(s, dir);
    if (st) goto fail;
    refit_manifest_identity_t id = {refit_model_name(model), "hf", 0, 1};
    if ((st = refit_manifest_create(&id, &m))) goto fail;
    for (uint32_t r = 0; r < s->n; r++) {
        uint32_t rid;
        if ((st = refit_manifest_add_region(m, refit_safetensors_size(s->f[r]), &rid))) goto fail;
    }
    size_t nt = refit_model_num_tensors(model), missing = 0, missing_mtp = 0;
    const char *first_missing = NULL;
    for (size_t i = 0; i < nt; i++) {
        refit_tensor_info_t t;
        if ((st = refit_model_tensor(model, i, &t))) goto fail;
        uint32_t r = 0;
        int64_t k = -1;
        if (s->wm) { /* the index says which shard holds it */
            const char *file = refit_json_string(refit_json_get(s->wm, t.name), NULL);
            for (; file && r < s->n && k < 0; r++)
                if (!strcmp(strrchr(s->path[r], '/') + 1, file)) k = refit_safetensors_find(s->f[r], t.name);
        } else {
            for (; r < s->n && k < 0; r++) k = refit_safetensors_find(s->f[r], t.name);
        }
        if (k < 0) {
            if (!missing++) first_missing = t.name;
            missing_mtp += refit_model_tensor_is_mtp(model, i);
            continue;
        }
        r--;
        refit_tensor_info_t ft;
        uint64_t off;
        refit_safetensors_tensor(s->f[r], (size_t)k, &ft, &off, NULL);
        bool same = ft.dtype == t.dtype && ft.ndim == t.ndim;
        for (uint32_t d = 0; same && d < t.ndim; d++) same = ft.shape[d] == t.shape[d];
        if (!same) {
            char a[96] = "", b[96] = "";
            for (uint32_t d = 0; d < t.ndim; d++)
                snprintf(a + strlen(a), sizeof(a) - strlen(a), "%s%llu", d ? "," : "", (unsigned long long)t.shape[d]);
            for (uint32_t d = 0; d < ft.ndim; d++)
                snprintf(b + strlen(b), sizeof(b) - strlen(b), "%s%llu", d ? "," : "", (unsigned long long)ft.shape[d]);
            st = refit_error(REFIT_ERR_MISMATCH, "%s: %s is %s [%s] in the file, the model %s has %s [%s]", s->path[r],
                             t.name, refit_dtype_name(ft.dtype), b, refit_model_name(model), refit_dtype_name(t.dtype),
                             a);
            goto fail;
        }
        uint32_t cid, lid;
        if ((st = refit_manifest_add_canonical(m, &t, &cid)) || (st = refit_manifest_add_local(m, &t, r, off, &lid)))
            goto fail;
        refit_placement_t p = {.canon = cid, .local = lid, .ndim = t.ndim};
        for (uint32_t d = 0; d < t.ndim; d++) p.extent[d] = t.shape[d];
        if ((st = refit_manifest_add_placement(m, &p))) goto fail;
    }
    if (missing) {
        st = refit_error(REFIT_ERR_NOT_FOUND, "%s: %s of model %s is in no shard (%zu canonical tensors missing%s)",
                         dir, first_missing, refit_model_name(model), missing,
                         missing == missing_mtp ? ", all of the MTP layers: a checkpoint without them needs a config "
                                                  "with num_nextn_predict_layers 0"
                                                : "");
        goto fail;
    }
    if ((st = refit_manifest_finalize(m))) goto fail;
    *src = s;
    *manifest = m;
    return REFIT_OK;
fail:
    refit_manifest_destroy(m);
    refit_hf_source_close(s);
    return st;
}
