/* Version stamps: what a publisher's memory says it holds, read by receivers
 * over the same authenticated connection as the bytes.
 *
 * A registry record says "rank k published version v in buffer b"; it is
 * signed, but a signature binds a value to its key, not to its time: anyone
 * who can write the store can put an older authentic record back.  So the
 * record alone never decides which bytes a receiver commits.  Every host
 * publisher (and every relay, which is one) exposes one small region per
 * buffer, its stamp, and keeps it true:
 *
 *   0  magic "RFST"          24 signature u64 (the manifest's layout)
 *   4  format u16 = 1        32 buffer u32
 *   6  size u16 = 64         36 reserved u32 = 0
 *   8  version u64           40 head u64: the newest version this publisher
 *   16 incarnation u64          has published (any buffer); 48..63 reserved
 *
 * `version` is 0 while the buffer holds no published version: before its
 * first publish, and from the moment the publisher may rewrite it (in place:
 * wait_readers returned; snapshot: before the copy into it; a relay: its
 * withdraw) until the next version is in it, its delta arenas and digest
 * table filled.  A version is stamped before its record is written, and
 * `head` moves after the record is written.
 *
 * A receiver reads the stamps of every source it uses before the bytes move
 * and again after the last byte it depends on (data, delta arenas, digest
 * entries) has been read.  Since a buffer is stamped with a version once and
 * unstamped before anything in it changes, equal stamps before and after
 * that name the record's version, incarnation, signature and buffer prove
 * that everything read in between was that version's.  A NEWEST pull also
 * compares `head` with the registry: a source that has published a version
 * newer than the record the registry still holds for it means the record
 * was replayed or rolled back.
 *
 * Stamps live in publisher memory and are written with atomic stores; a
 * reader may see a torn stamp only while it changes, which fails the
 * comparison (safe).  GPU publishers have no stamp yet (docs/security.md). */
#ifndef REFIT_ENGINE_STAMP_H
#define REFIT_ENGINE_STAMP_H

#include <stdint.h>

#include "refit/manifest.h"
#include "registry/registry.h"

#define REFIT_STAMP_BYTES 64u

/* The fields of a stamp. */
typedef struct {
    uint64_t version, incarnation, signature, head;
    uint32_t buffer;
} refit_stamp_t;

/* Writes a fresh stamp (version 0, head 0) into publisher memory. */
void refit_stamp_init(void *mem, uint64_t incarnation, uint64_t signature, uint32_t buffer);
/* The buffer holds version v (0: none, it may be rewritten from now on). */
void refit_stamp_set_version(void *mem, uint64_t v);
/* The newest version published, after its record is in the registry. */
void refit_stamp_set_head(void *mem, uint64_t head);

/* The index of a manifest's stamp region ("refit.stamp"), -1 when it has
 * none (a GPU publisher, or one older than stamps).  Callers check it is the
 * index they expect (after the regions, arenas and digest table). */
int64_t refit_stamp_region(const refit_manifest_t *m);

/* Decodes REFIT_STAMP_BYTES read from source rank `rank`: REFIT_ERR_CORRUPT
 * (naming the rank) for anything that is not a stamp. */
refit_status_t refit_stamp_decode(const void *bytes, uint32_t rank, refit_stamp_t *out);

/* Whether stamp s names exactly what record rec says: version, incarnation,
 * signature and buffer.  On a mismatch, REFIT_ERR_STALE when the buffer is
 * unstamped (being rewritten) or another incarnation holds it, else
 * REFIT_ERR_REPLAY; the detail names the rank and both sides.  (A receiver
 * that finds a newer version than its record asks the registry again before
 * it says REPLAY: receiver_verify.c.) */
refit_status_t refit_stamp_matches(const refit_stamp_t *s, const refit_version_record_t *rec, uint32_t rank,
                                   const char *what);

#endif
