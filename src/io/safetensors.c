/* safetensors writer: 8-byte little-endian header length, JSON header
 * (padded with spaces to a multiple of 8), then every tensor's bytes in
 * manifest order.  Written to an exclusive temporary of a random name in the
 * file's directory, which must be ours and closed to others (io/file.h:
 * refit_outfile_*), and renamed into place. */
#include "refit/experimental/safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "io/file.h"
#include "layout/manifest.h"

static const char *st_dtype(refit_dtype_t d)
{
    switch (d) {
    case REFIT_DTYPE_BF16: return "BF16";
    case REFIT_DTYPE_F16: return "F16";
    case REFIT_DTYPE_F32: return "F32";
    case REFIT_DTYPE_F8_E4M3: return "F8_E4M3";
    case REFIT_DTYPE_I32: return "I32";
    case REFIT_DTYPE_I64: return "I64";
    case REFIT_DTYPE_U8: return "U8";
    default: return NULL;
    }
}

typedef struct {
    char *buf;
    size_t len, cap;
    bool oom;
} sbuf_t;

static void sb_put(sbuf_t *s, const char *fmt, ...) REFIT_PRINTF(2, 3);
static void sb_put(sbuf_t *s, const char *fmt, ...)
{
    if (s->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(s->buf ? s->buf + s->len : NULL, s->buf ? s->cap - s->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            s->oom = true;
            return;
        }
        if (s->buf && s->len + (size_t)n < s->cap) {
            s->len += (size_t)n;
            return;
        }
        size_t ncap = (s->cap ? s->cap * 2 : 4096) + (size_t)n;
        char *p = realloc(s->buf, ncap);
        if (!p) {
            s->oom = true;
            return;
        }
        s->buf = p;
        s->cap = ncap;
    }
}

static void sb_json_string(sbuf_t *s, const char *str)
{
    sb_put(s, "\"");
    for (const char *p = str; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') sb_put(s, "\\%c", c);
        else if (c < 0x20) sb_put(s, "\\u%04x", c);
        else sb_put(s, "%c", c);
    }
    sb_put(s, "\"");
}

refit_status_t refit_safetensors_write(const char *path, const refit_manifest_t *m, const void *const *region_bases)
{
    refit_status_t st = REFIT_OK;
    if (!path || !m || !region_bases)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_safetensors_write: NULL argument");
    sbuf_t h = {0};
    uint64_t off = 0;
    sb_put(&h, "{\"__metadata__\":{\"format\":\"pt\",\"refit_model\":");
    sb_json_string(&h, m->model);
    sb_put(&h, ",\"refit_layout\":");
    sb_json_string(&h, m->layout);
    sb_put(&h, ",\"refit_rank\":\"%u\"}", m->rank);
    for (size_t i = 0; i < m->locals.len; i++) {
        const refit_local_t *l = &m->locals.data[i];
        const char *dt = st_dtype(l->d.dtype);
        if (!dt) {
            free(h.buf);
            return refit_error(REFIT_ERR_UNSUPPORTED, "%s: dtype %s has no safetensors name", l->d.name,
                               refit_dtype_name(l->d.dtype));
        }
        sb_put(&h, ",");
        sb_json_string(&h, l->d.name);
        sb_put(&h, ":{\"dtype\":\"%s\",\"shape\":[", dt);
        for (uint32_t d = 0; d < l->d.ndim; d++) sb_put(&h, "%s%llu", d ? "," : "", (unsigned long long)l->d.shape[d]);
        sb_put(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + l->nbytes));
        off += l->nbytes;
    }
    sb_put(&h, "}");
    while (!h.oom && h.len % 8) sb_put(&h, " ");
    if (h.oom) {
        free(h.buf);
        return refit_error(REFIT_ERR_NO_MEMORY, "safetensors header for %s", path);
    }
    /* Through an exclusive temporary in a directory only we can write: a
     * predictable "<path>.tmp.<pid>" opened with fopen followed any symbolic
     * link another user put there first. */
    refit_outfile_t o;
    if ((st = refit_outfile_open(&o, path, 0666, true))) goto out;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    refit_outfile_write(&o, len8, 8);
    refit_outfile_write(&o, h.buf, h.len);
    for (size_t i = 0; !o.failed && i < m->locals.len; i++) {
        const refit_local_t *l = &m->locals.data[i];
        refit_outfile_write(&o, (const unsigned char *)region_bases[l->region] + l->offset, l->nbytes);
    }
    st = refit_outfile_commit(&o, path);
out:
    free(h.buf);
    return st;
}
