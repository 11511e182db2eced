/* Version stamps (stamp.h): their encoding, and the comparison with a record. */
#include <inttypes.h>
#include <string.h>

#include "engine/stamp.h"
#include "util/util.h"

#define STAMP_MAGIC "RFST"
#define STAMP_FORMAT 1u
#define OFF_VERSION 8
#define OFF_INCARNATION 16
#define OFF_SIGNATURE 24
#define OFF_BUFFER 32
#define OFF_HEAD 40

/* Publisher memory is little-endian x86-64/aarch64 memory read by peers as
 * bytes: the 64-bit fields are stored whole (atomically), so a reader never
 * sees half of one. */
static void store64(void *mem, unsigned off, uint64_t v)
{
    uint8_t le[8];
    uint64_t word;
    refit_put_le(le, v, 8);
    memcpy(&word, le, 8);
    __atomic_store_n((uint64_t *)(void *)((uint8_t *)mem + off), word, __ATOMIC_SEQ_CST);
    /* A cleared stamp must be seen before any store that follows it (the
     * buffer's rewrite): a seq_cst store alone does not order later plain
     * stores on aarch64 (stlr), a full fence does. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

void refit_stamp_init(void *mem, uint64_t incarnation, uint64_t signature, uint32_t buffer)
{
    uint8_t *p = mem; /* before it is exposed: plain stores */
    memset(p, 0, REFIT_STAMP_BYTES);
    memcpy(p, STAMP_MAGIC, 4);
    refit_put_le(p + 4, STAMP_FORMAT, 2);
    refit_put_le(p + 6, REFIT_STAMP_BYTES, 2);
    refit_put_le(p + OFF_INCARNATION, incarnation, 8);
    refit_put_le(p + OFF_SIGNATURE, signature, 8);
    refit_put_le(p + OFF_BUFFER, buffer, 4);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

int64_t refit_stamp_region(const refit_manifest_t *m)
{
    const void *v;
    size_t len;
    uint32_t idx;
    if (!m || refit_manifest_get_attr(m, "refit.stamp", &v, &len) || len != sizeof(idx)) return -1;
    memcpy(&idx, v, sizeof(idx));
    return idx;
}

void refit_stamp_set_version(void *mem, uint64_t v) { store64(mem, OFF_VERSION, v); }

void refit_stamp_set_head(void *mem, uint64_t head) { store64(mem, OFF_HEAD, head); }

refit_status_t refit_stamp_decode(const void *bytes, uint32_t rank, refit_stamp_t *out)
{
    const uint8_t *p = bytes;
    if (memcmp(p, STAMP_MAGIC, 4) != 0 || refit_get_le(p + 4, 2) != STAMP_FORMAT ||
        refit_get_le(p + 6, 2) != REFIT_STAMP_BYTES || refit_get_le(p + 36, 4) != 0)
        return refit_error(REFIT_ERR_CORRUPT, "source rank %u: its version stamp is not one (format, size or magic)",
                           rank);
    *out = (refit_stamp_t){.version = refit_get_le(p + OFF_VERSION, 8),
                           .incarnation = refit_get_le(p + OFF_INCARNATION, 8),
                           .signature = refit_get_le(p + OFF_SIGNATURE, 8),
                           .buffer = (uint32_t)refit_get_le(p + OFF_BUFFER, 4),
                           .head = refit_get_le(p + OFF_HEAD, 8)};
    return REFIT_OK;
}

refit_status_t refit_stamp_matches(const refit_stamp_t *s, const refit_version_record_t *rec, uint32_t rank,
                                   const char *what)
{
    if (s->incarnation != rec->incarnation)
        return refit_error(REFIT_ERR_STALE,
                           "%s: source rank %u is incarnation %016" PRIx64 ", its record names %016" PRIx64
                           " (the source restarted, or an old record was put back): version %" PRIu64 " not committed",
                           what, rank, s->incarnation, rec->incarnation, rec->version);
    if (s->buffer != rec->buffer || s->signature != rec->signature)
        return refit_error(REFIT_ERR_REPLAY,
                           "%s: source rank %u's record names buffer %u of layout %016" PRIx64
                           ", its memory is buffer %u of layout %016" PRIx64 ": the record is not the source's",
                           what, rank, rec->buffer, rec->signature, s->buffer, s->signature);
    if (s->version == rec->version) return REFIT_OK;
    if (s->version == 0)
        return refit_error(REFIT_ERR_STALE,
                           "%s: source rank %u retired version %" PRIu64
                           " (buffer %u may be rewritten, its newest is %" PRIu64 "): not committed",
                           what, rank, rec->version, rec->buffer, s->head);
    return refit_error(REFIT_ERR_REPLAY,
                       "%s: source rank %u's buffer %u holds version %" PRIu64
                       ", but the record read names version %" PRIu64
                       " there (a replayed or stale registry value): not committed",
                       what, rank, rec->buffer, s->version, rec->version);
}
