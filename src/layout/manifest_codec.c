/* Binary manifest codec: refit_manifest_encode / refit_manifest_decode.
 *
 * Wire format, version 1.  Integers are little-endian.  "varint" is unsigned
 * LEB128 (7 bits a byte, low group first, high bit set on every byte but the
 * last), at most 10 bytes and minimal (no trailing zero groups), so a
 * manifest has exactly one encoding.  "str" is a u16 length (1..255) and that
 * many bytes, none of them NUL, no terminator.
 *
 *   offset  field
 *   0       magic      "RFTM"
 *   4       version    u16 = 1            (other values: REFIT_ERR_UNSUPPORTED)
 *   6       flags      u16 = 0            (no flag defined yet; any set bit:
 *                                           REFIT_ERR_UNSUPPORTED)
 *   8       length     u64                total bytes, checksum included
 *   16      identity   model str, layout str, rank u32, world u32
 *           regions    count varint; count x size u64
 *           canonical  count varint; per tensor:
 *                        name str, dtype u8 (refit_dtype_t), ndim u8 (1..4),
 *                        shape: ndim x varint
 *           locals     count varint; per tensor:
 *                        name str, dtype u8, ndim u8, shape: ndim x varint,
 *                        region varint (u32), offset varint (bytes into the region)
 *           placements count varint; per placement:
 *                        canon varint (u32 id), local varint (u32 id),
 *                        ndim u8 (the canonical tensor's),
 *                        ndim x (canon_offset varint, extent varint),
 *                        local_offset: one varint per dim of the LOCAL tensor
 *           attributes count varint; per attribute:
 *                        key str, value length u32, value bytes
 *   len-8   checksum   u64 = refit_hash64(bytes [0, len-8), CHECKSUM_SEED)
 *
 * Ids are positions in the lists above.  Varints keep a qwen3 manifest (many
 * thousands of placements of small numbers) to a few bytes per placement.
 *
 * Decoding treats input as hostile: header and checksum are checked first,
 * then every read is bounds-checked against the bytes before the checksum,
 * every count is bounded by REFIT_MANIFEST_MAX_ENTRIES and by the bytes left
 * before anything is allocated for it (so what a decode allocates grows with
 * its input's size only), the world (which sizes receivers' tables, and is
 * not tied to the bytes) by REFIT_MANIFEST_MAX_WORLD, and strings, dtypes,
 * ndims and ids are range-checked (REFIT_ERR_CORRUPT, naming the field and
 * byte offset).  The
 * manifest is then built through the public builder and finalized, so the
 * same validation as for a local manifest applies and its codes (e.g.
 * REFIT_ERR_OUT_OF_BOUNDS, REFIT_ERR_OVERLAP) come back unchanged, with the
 * byte offset prefixed to the detail. */
#include "layout/manifest_codec.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "layout/manifest.h"

static const uint8_t MAGIC[4] = {'R', 'F', 'T', 'M'};
#define CHECKSUM_SEED 0x5246544d31ULL /* "RFTM1" */

/* Smallest encoding of one entry of each list, to bound counts by the bytes
 * that remain. */
#define MIN_REGION 8u    /* size u64 */
#define MIN_TENSOR 6u    /* str (2 + 1), dtype, ndim, one shape varint */
#define MIN_LOCAL 8u     /* tensor + region + offset */
#define MIN_PLACEMENT 6u /* canon, local, ndim, offset + extent, local offset */
#define MIN_ATTR 7u      /* str (2 + 1), value length u32 */

uint64_t refit_manifest_checksum(const void *buf, size_t len)
{
    return refit_hash64(buf, len - REFIT_MANIFEST_TRAILER_SIZE, CHECKSUM_SEED);
}


void refit_manifest_reseal(void *buf, size_t len)
{
    if (len < REFIT_MANIFEST_HEADER_SIZE + REFIT_MANIFEST_TRAILER_SIZE) return;
    uint8_t *p = buf;
    refit_put_le(p + 8, len, 8);
    refit_put_le(p + len - REFIT_MANIFEST_TRAILER_SIZE, refit_manifest_checksum(p, len), 8);
}

/* ---- encoding ---------------------------------------------------------- */

/* Writes into p, or (p == NULL) only counts, so one routine sizes and fills. */
typedef struct {
    uint8_t *p;
    size_t pos;
} writer_t;

static void w_fixed(writer_t *w, uint64_t v, unsigned n)
{
    if (w->p) refit_put_le(w->p + w->pos, v, n);
    w->pos += n;
}

static void w_varint(writer_t *w, uint64_t v)
{
    do {
        uint8_t b = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) b |= 0x80;
        if (w->p) w->p[w->pos] = b;
        w->pos++;
    } while (v);
}

static void w_bytes(writer_t *w, const void *src, size_t n)
{
    if (w->p && n) memcpy(w->p + w->pos, src, n);
    w->pos += n;
}

static void w_str(writer_t *w, const char *s)
{
    size_t n = strlen(s); /* 1..REFIT_MANIFEST_MAX_NAME: checked by the builder */
    w_fixed(w, n, 2);
    w_bytes(w, s, n);
}

static void w_tensor(writer_t *w, const refit_tdesc_t *d)
{
    w_str(w, d->name);
    w_fixed(w, (uint64_t)d->dtype, 1);
    w_fixed(w, d->ndim, 1);
    for (uint32_t i = 0; i < d->ndim; i++) w_varint(w, d->shape[i]);
}

static void write_manifest(writer_t *w, const refit_manifest_t *m)
{
    w_bytes(w, MAGIC, sizeof(MAGIC));
    w_fixed(w, REFIT_MANIFEST_FORMAT_VERSION, 2);
    w_fixed(w, 0, 2);
    w_fixed(w, 0, 8); /* total length: patched in by refit_manifest_reseal */
    w_str(w, m->model);
    w_str(w, m->layout);
    w_fixed(w, m->rank, 4);
    w_fixed(w, m->world, 4);
    w_varint(w, m->regions.len);
    for (size_t i = 0; i < m->regions.len; i++) w_fixed(w, m->regions.data[i], 8);
    w_varint(w, m->canon.len);
    for (size_t i = 0; i < m->canon.len; i++) w_tensor(w, &m->canon.data[i]);
    w_varint(w, m->locals.len);
    for (size_t i = 0; i < m->locals.len; i++) {
        const refit_local_t *l = &m->locals.data[i];
        w_tensor(w, &l->d);
        w_varint(w, l->region);
        w_varint(w, l->offset);
    }
    w_varint(w, m->placements.len);
    for (size_t i = 0; i < m->placements.len; i++) {
        const refit_placement_t *p = &m->placements.data[i];
        w_varint(w, p->canon);
        w_varint(w, p->local);
        w_fixed(w, p->ndim, 1);
        for (uint32_t d = 0; d < p->ndim; d++) {
            w_varint(w, p->canon_offset[d]);
            w_varint(w, p->extent[d]);
        }
        uint32_t lnd = m->locals.data[p->local].d.ndim;
        for (uint32_t d = 0; d < lnd; d++) w_varint(w, p->local_offset[d]);
    }
    w_varint(w, m->attrs.len);
    for (size_t i = 0; i < m->attrs.len; i++) {
        w_str(w, m->attrs.data[i].key);
        w_fixed(w, m->attrs.data[i].len, 4);
        w_bytes(w, m->attrs.data[i].val, m->attrs.data[i].len);
    }
    w->pos += REFIT_MANIFEST_TRAILER_SIZE; /* checksum: also written by reseal */
}

refit_status_t refit_manifest_encode(const refit_manifest_t *m, void **buf, size_t *len)
{
    if (!m || !buf || !len) return refit_error(REFIT_ERR_INVALID_ARG, "refit_manifest_encode: NULL argument");
    if (!m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "refit_manifest_encode: manifest is not finalized");
    if (m->attrs.len > REFIT_MANIFEST_MAX_ENTRIES)
        return refit_error(REFIT_ERR_INVALID_ARG, "manifest has %zu attributes (at most %u can be encoded)",
                           m->attrs.len, REFIT_MANIFEST_MAX_ENTRIES);
    for (size_t i = 0; i < m->attrs.len; i++)
        if (m->attrs.data[i].len > UINT32_MAX)
            return refit_error(REFIT_ERR_INVALID_ARG, "attribute %s has %zu bytes (at most %" PRIu32 " can be encoded)",
                               m->attrs.data[i].key, m->attrs.data[i].len, UINT32_MAX);
    writer_t w = {NULL, 0};
    write_manifest(&w, m);
    size_t n = w.pos;
    uint8_t *out = malloc(n);
    if (!out) return refit_error(REFIT_ERR_NO_MEMORY, "encoding a manifest of %zu bytes", n);
    w = (writer_t){out, 0};
    write_manifest(&w, m);
    refit_manifest_reseal(out, n);
    *buf = out;
    *len = n;
    return REFIT_OK;
}

/* ---- decoding ---------------------------------------------------------- */

/* Reads [pos, end) of buf; `sec`/`idx` name the entry being read (sec NULL
 * outside lists) for error details. */
typedef struct {
    const uint8_t *buf;
    size_t pos, end;
    const char *sec;
    size_t idx;
} reader_t;

/* "canonical tensor 3 shape" or "model" */
static const char *where(const reader_t *r, const char *field, char *out, size_t size)
{
    if (r->sec) snprintf(out, size, "%s %zu %s", r->sec, r->idx, field);
    else snprintf(out, size, "%s", field);
    return out;
}

static refit_status_t r_need(const reader_t *r, size_t n, const char *field)
{
    char wb[128];
    if (r->end - r->pos < n)
        return refit_error(REFIT_ERR_CORRUPT, "truncated at byte %zu reading %s (%zu bytes needed, %zu left)", r->pos,
                           where(r, field, wb, sizeof(wb)), n, r->end - r->pos);
    return REFIT_OK;
}

static refit_status_t r_fixed(reader_t *r, unsigned n, const char *field, uint64_t *v)
{
    refit_status_t st;
    if ((st = r_need(r, n, field))) return st;
    *v = refit_get_le(r->buf + r->pos, n);
    r->pos += n;
    return REFIT_OK;
}

static refit_status_t r_varint(reader_t *r, const char *field, uint64_t *v)
{
    char wb[128];
    uint64_t x = 0;
    size_t start = r->pos;
    for (unsigned i = 0;; i++) {
        if (r->pos >= r->end)
            return refit_error(REFIT_ERR_CORRUPT, "truncated at byte %zu reading %s (varint starting at byte %zu)",
                               r->pos, where(r, field, wb, sizeof(wb)), start);
        uint8_t b = r->buf[r->pos++];
        if (i == 9 && b > 1)
            return refit_error(REFIT_ERR_CORRUPT, "varint at byte %zu reading %s exceeds 64 bits", start,
                               where(r, field, wb, sizeof(wb)));
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            if (b == 0 && i > 0)
                return refit_error(REFIT_ERR_CORRUPT, "non-minimal varint at byte %zu reading %s", start,
                                   where(r, field, wb, sizeof(wb)));
            break;
        }
    }
    *v = x;
    return REFIT_OK;
}

static refit_status_t r_varint32(reader_t *r, const char *field, uint32_t *v)
{
    char wb[128];
    refit_status_t st;
    uint64_t x;
    size_t start = r->pos;
    if ((st = r_varint(r, field, &x))) return st;
    if (x > UINT32_MAX)
        return refit_error(REFIT_ERR_CORRUPT, "%s at byte %zu is %" PRIu64 ", beyond 32 bits",
                           where(r, field, wb, sizeof(wb)), start, x);
    *v = (uint32_t)x;
    return REFIT_OK;
}

/* A str into out[REFIT_MANIFEST_MAX_NAME + 1], NUL-terminated. */
static refit_status_t r_str(reader_t *r, const char *field, char *out)
{
    char wb[128];
    refit_status_t st;
    uint64_t n;
    size_t start = r->pos;
    if ((st = r_fixed(r, 2, field, &n))) return st;
    if (n == 0 || n > REFIT_MANIFEST_MAX_NAME)
        return refit_error(REFIT_ERR_CORRUPT, "%s at byte %zu has length %" PRIu64 " (must be 1..%d)",
                           where(r, field, wb, sizeof(wb)), start, n, REFIT_MANIFEST_MAX_NAME);
    if ((st = r_need(r, (size_t)n, field))) return st;
    const uint8_t *s = r->buf + r->pos;
    const uint8_t *nul = memchr(s, 0, (size_t)n);
    if (nul)
        return refit_error(REFIT_ERR_CORRUPT, "%s at byte %zu contains a NUL byte at byte %zu",
                           where(r, field, wb, sizeof(wb)), start, (size_t)(nul - r->buf));
    memcpy(out, s, (size_t)n);
    out[n] = '\0';
    r->pos += (size_t)n;
    return REFIT_OK;
}

/* A list count, bounded by the format's limit and by the bytes left given the
 * smallest encoding of one entry, so no hostile count causes a big allocation. */
static refit_status_t r_count(reader_t *r, const char *what, size_t min_entry, uint32_t *count)
{
    refit_status_t st;
    uint64_t n;
    size_t start = r->pos;
    if ((st = r_varint(r, what, &n))) return st;
    if (n > REFIT_MANIFEST_MAX_ENTRIES)
        return refit_error(REFIT_ERR_CORRUPT, "%s at byte %zu is %" PRIu64 ", beyond the limit of %u", what, start, n,
                           REFIT_MANIFEST_MAX_ENTRIES);
    if (n > (r->end - r->pos) / min_entry)
        return refit_error(REFIT_ERR_CORRUPT,
                           "%s at byte %zu is %" PRIu64 ", more than the %zu bytes left at byte %zu can hold", what,
                           start, n, r->end - r->pos, r->pos);
    *count = (uint32_t)n;
    return REFIT_OK;
}

/* name, dtype, ndim, shape; t->name points at namebuf. */
static refit_status_t r_tensor(reader_t *r, refit_tensor_info_t *t, char *namebuf)
{
    char wb[128];
    refit_status_t st;
    uint64_t v;
    size_t at;
    memset(t, 0, sizeof(*t));
    if ((st = r_str(r, "name", namebuf))) return st;
    t->name = namebuf;
    at = r->pos;
    if ((st = r_fixed(r, 1, "dtype", &v))) return st;
    if (v == REFIT_DTYPE_INVALID || v >= REFIT_DTYPE_COUNT_)
        return refit_error(REFIT_ERR_CORRUPT, "%s (%s) at byte %zu is %" PRIu64 ", not a known dtype",
                           where(r, "dtype", wb, sizeof(wb)), namebuf, at, v);
    t->dtype = (refit_dtype_t)v;
    at = r->pos;
    if ((st = r_fixed(r, 1, "ndim", &v))) return st;
    if (v < 1 || v > REFIT_MAX_DIMS)
        return refit_error(REFIT_ERR_CORRUPT, "%s (%s) at byte %zu is %" PRIu64 " (must be 1..%d)",
                           where(r, "ndim", wb, sizeof(wb)), namebuf, at, v, REFIT_MAX_DIMS);
    t->ndim = (uint32_t)v;
    for (uint32_t d = 0; d < t->ndim; d++)
        if ((st = r_varint(r, "shape", &t->shape[d]))) return st;
    return REFIT_OK;
}

/* After a builder call failed: keep its code and detail, say where. */
static refit_status_t at_entry(refit_status_t st, const reader_t *r, size_t start)
{
    if (r->sec) refit_error_prefix("manifest encoding, %s %zu at byte %zu", r->sec, r->idx, start);
    else refit_error_prefix("manifest encoding, identity at byte %zu", start);
    return st;
}

static refit_status_t read_header(reader_t *r, size_t len)
{
    refit_status_t st;
    uint64_t v;
    if ((st = r_need(r, sizeof(MAGIC), "magic"))) return st;
    if (memcmp(r->buf, MAGIC, sizeof(MAGIC)) != 0)
        return refit_error(REFIT_ERR_CORRUPT, "bad magic at byte 0: not a refit manifest");
    r->pos = sizeof(MAGIC);
    if ((st = r_fixed(r, 2, "format version", &v))) return st;
    if (v != REFIT_MANIFEST_FORMAT_VERSION)
        return refit_error(REFIT_ERR_UNSUPPORTED, "format version %" PRIu64 " at byte 4 (this build reads %u)", v,
                           REFIT_MANIFEST_FORMAT_VERSION);
    if ((st = r_fixed(r, 2, "flags", &v))) return st;
    if (v != 0) return refit_error(REFIT_ERR_UNSUPPORTED, "unknown flags 0x%" PRIx64 " at byte 6", v);
    if ((st = r_fixed(r, 8, "total length", &v))) return st;
    if (v > len)
        return refit_error(REFIT_ERR_CORRUPT,
                           "truncated at byte %zu: the length field at byte 8 says %" PRIu64 " bytes", len, v);
    if (v < len)
        return refit_error(REFIT_ERR_CORRUPT,
                           "%zu bytes of trailing garbage at byte %" PRIu64 " (the length field at byte 8 says %" PRIu64
                           ")",
                           len - (size_t)v, v, v);
    if (len < REFIT_MANIFEST_HEADER_SIZE + REFIT_MANIFEST_TRAILER_SIZE)
        return refit_error(REFIT_ERR_CORRUPT, "truncated at byte %zu reading checksum", len);
    uint64_t want = refit_get_le(r->buf + len - REFIT_MANIFEST_TRAILER_SIZE, 8);
    uint64_t got = refit_manifest_checksum(r->buf, len);
    if (want != got)
        return refit_error(REFIT_ERR_CORRUPT,
                           "checksum mismatch at byte %zu: stored %016" PRIx64 ", computed %016" PRIx64,
                           len - REFIT_MANIFEST_TRAILER_SIZE, want, got);
    r->end = len - REFIT_MANIFEST_TRAILER_SIZE;
    return REFIT_OK;
}

static refit_status_t read_identity(reader_t *r, refit_manifest_t **out)
{
    refit_status_t st;
    char model[REFIT_MANIFEST_MAX_NAME + 1], layout[REFIT_MANIFEST_MAX_NAME + 1];
    uint64_t rank, world;
    size_t start = r->pos;
    size_t at;
    if ((st = r_str(r, "model", model)) || (st = r_str(r, "layout", layout)) || (st = r_fixed(r, 4, "rank", &rank)))
        return st;
    at = r->pos;
    if ((st = r_fixed(r, 4, "world", &world))) return st;
    /* Receivers size tables by their sources' world: bounded before use. */
    if (world > REFIT_MANIFEST_MAX_WORLD)
        return refit_error(REFIT_ERR_CORRUPT, "world at byte %zu is %" PRIu64 ", beyond the limit of %u", at, world,
                           REFIT_MANIFEST_MAX_WORLD);
    refit_manifest_identity_t id = {model, layout, (uint32_t)rank, (uint32_t)world};
    if ((st = refit_manifest_create(&id, out))) return at_entry(st, r, start);
    return REFIT_OK;
}

static refit_status_t read_regions(reader_t *r, refit_manifest_t *m)
{
    refit_status_t st;
    uint32_t n;
    if ((st = r_count(r, "region count", MIN_REGION, &n))) return st;
    if (REFIT_VEC_RESERVE(&m->regions, n)) return refit_error(REFIT_ERR_NO_MEMORY, "decoding %u regions", n);
    r->sec = "region";
    for (r->idx = 0; r->idx < n; r->idx++) {
        uint64_t size;
        size_t start = r->pos;
        if ((st = r_fixed(r, 8, "size", &size))) return st;
        if ((st = refit_manifest_add_region(m, size, NULL))) return at_entry(st, r, start);
    }
    r->sec = NULL;
    return REFIT_OK;
}

static refit_status_t read_canonical(reader_t *r, refit_manifest_t *m)
{
    refit_status_t st;
    uint32_t n, found;
    char name[REFIT_MANIFEST_MAX_NAME + 1];
    if ((st = r_count(r, "canonical tensor count", MIN_TENSOR, &n))) return st;
    if (REFIT_VEC_RESERVE(&m->canon, n)) return refit_error(REFIT_ERR_NO_MEMORY, "decoding %u canonical tensors", n);
    r->sec = "canonical tensor";
    for (r->idx = 0; r->idx < n; r->idx++) {
        refit_tensor_info_t t;
        size_t start = r->pos;
        if ((st = r_tensor(r, &t, name))) return st;
        /* add_canonical would fold a repeated name into its first id. */
        if (refit_strmap_get(&m->canon_index, name, &found))
            return refit_error(REFIT_ERR_CORRUPT, "canonical tensor %zu at byte %zu repeats the name %s of tensor %u",
                               r->idx, start, name, found);
        if ((st = refit_manifest_add_canonical(m, &t, NULL))) return at_entry(st, r, start);
    }
    r->sec = NULL;
    return REFIT_OK;
}

static refit_status_t read_locals(reader_t *r, refit_manifest_t *m)
{
    refit_status_t st;
    uint32_t n, found;
    char name[REFIT_MANIFEST_MAX_NAME + 1];
    if ((st = r_count(r, "local tensor count", MIN_LOCAL, &n))) return st;
    if (REFIT_VEC_RESERVE(&m->locals, n)) return refit_error(REFIT_ERR_NO_MEMORY, "decoding %u local tensors", n);
    r->sec = "local tensor";
    for (r->idx = 0; r->idx < n; r->idx++) {
        refit_tensor_info_t t;
        uint32_t region;
        uint64_t offset;
        size_t start = r->pos;
        if ((st = r_tensor(r, &t, name)) || (st = r_varint32(r, "region", &region)) ||
            (st = r_varint(r, "offset", &offset)))
            return st;
        if (refit_strmap_get(&m->local_index, name, &found))
            return refit_error(REFIT_ERR_CORRUPT, "local tensor %zu at byte %zu repeats the name %s of tensor %u",
                               r->idx, start, name, found);
        if ((st = refit_manifest_add_local(m, &t, region, offset, NULL))) return at_entry(st, r, start);
    }
    r->sec = NULL;
    return REFIT_OK;
}

static refit_status_t read_placements(reader_t *r, refit_manifest_t *m)
{
    char wb[128];
    refit_status_t st;
    uint32_t n;
    if ((st = r_count(r, "placement count", MIN_PLACEMENT, &n))) return st;
    if (REFIT_VEC_RESERVE(&m->placements, n)) return refit_error(REFIT_ERR_NO_MEMORY, "decoding %u placements", n);
    r->sec = "placement";
    for (r->idx = 0; r->idx < n; r->idx++) {
        refit_placement_t p;
        uint64_t v;
        size_t start = r->pos, at;
        memset(&p, 0, sizeof(p));
        at = r->pos;
        if ((st = r_varint32(r, "canonical id", &p.canon))) return st;
        if (p.canon >= m->canon.len)
            return refit_error(REFIT_ERR_CORRUPT, "%s at byte %zu is %u, beyond the %zu canonical tensors",
                               where(r, "canonical id", wb, sizeof(wb)), at, p.canon, m->canon.len);
        at = r->pos;
        if ((st = r_varint32(r, "local id", &p.local))) return st;
        /* Needed right away: it says how many local offsets follow. */
        if (p.local >= m->locals.len)
            return refit_error(REFIT_ERR_CORRUPT, "%s at byte %zu is %u, beyond the %zu local tensors",
                               where(r, "local id", wb, sizeof(wb)), at, p.local, m->locals.len);
        at = r->pos;
        if ((st = r_fixed(r, 1, "ndim", &v))) return st;
        if (v < 1 || v > REFIT_MAX_DIMS)
            return refit_error(REFIT_ERR_CORRUPT, "%s at byte %zu is %" PRIu64 " (must be 1..%d)",
                               where(r, "ndim", wb, sizeof(wb)), at, v, REFIT_MAX_DIMS);
        p.ndim = (uint32_t)v;
        for (uint32_t d = 0; d < p.ndim; d++)
            if ((st = r_varint(r, "canonical offset", &p.canon_offset[d])) ||
                (st = r_varint(r, "extent", &p.extent[d])))
                return st;
        uint32_t lnd = m->locals.data[p.local].d.ndim;
        for (uint32_t d = 0; d < lnd; d++)
            if ((st = r_varint(r, "local offset", &p.local_offset[d]))) return st;
        if ((st = refit_manifest_add_placement(m, &p))) return at_entry(st, r, start);
    }
    r->sec = NULL;
    return REFIT_OK;
}

static refit_status_t read_attrs(reader_t *r, refit_manifest_t *m)
{
    refit_status_t st;
    uint32_t n;
    char key[REFIT_MANIFEST_MAX_NAME + 1];
    if ((st = r_count(r, "attribute count", MIN_ATTR, &n))) return st;
    r->sec = "attribute";
    for (r->idx = 0; r->idx < n; r->idx++) {
        uint64_t vlen;
        size_t start = r->pos, before = m->attrs.len;
        if ((st = r_str(r, "key", key)) || (st = r_fixed(r, 4, "value length", &vlen)) ||
            (st = r_need(r, (size_t)vlen, "value")))
            return st;
        if ((st = refit_manifest_set_attr(m, key, r->buf + r->pos, (size_t)vlen))) return at_entry(st, r, start);
        r->pos += (size_t)vlen;
        if (m->attrs.len == before) /* set_attr replaced an earlier value */
            return refit_error(REFIT_ERR_CORRUPT, "attribute %zu at byte %zu repeats the key %s", r->idx, start, key);
    }
    r->sec = NULL;
    return REFIT_OK;
}

refit_status_t refit_manifest_decode(const void *buf, size_t len, refit_manifest_t **out)
{
    refit_status_t st;
    refit_manifest_t *m = NULL;
    if ((!buf && len) || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_manifest_decode: NULL argument");
    reader_t r = {buf, 0, len, NULL, 0};
    if ((st = read_header(&r, len))) return st;
    if ((st = read_identity(&r, &m))) return st;
    if ((st = read_regions(&r, m)) || (st = read_canonical(&r, m)) || (st = read_locals(&r, m)) ||
        (st = read_placements(&r, m)) || (st = read_attrs(&r, m)))
        goto err_destroy;
    if (r.pos != r.end) {
        st = refit_error(REFIT_ERR_CORRUPT, "%zu unparsed bytes at byte %zu, before the checksum", r.end - r.pos,
                         r.pos);
        goto err_destroy;
    }
    if ((st = refit_manifest_finalize(m))) {
        refit_error_prefix("decoded manifest");
        goto err_destroy;
    }
    *out = m;
    return REFIT_OK;
err_destroy:
    refit_manifest_destroy(m);
    return st;
}

refit_status_t refit_manifest_copy(const refit_manifest_t *m, refit_manifest_t **out)
{
    void *enc = NULL;
    size_t len = 0;
    refit_status_t st = refit_manifest_encode(m, &enc, &len);
    if (!st) st = refit_manifest_decode(enc, len, out);
    free(enc);
    return st;
}
