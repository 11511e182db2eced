/* Constants and helpers of the manifest wire format (manifest_codec.c), for
 * the codec itself and for tests and fuzz targets that build or patch
 * encodings by hand. */
#ifndef REFIT_MANIFEST_CODEC_H
#define REFIT_MANIFEST_CODEC_H

#include <stddef.h>
#include <stdint.h>

#define REFIT_MANIFEST_FORMAT_VERSION 1u
/* magic (4) + version (2) + flags (2) + total length (8) */
#define REFIT_MANIFEST_HEADER_SIZE 16u
/* the trailing checksum */
#define REFIT_MANIFEST_TRAILER_SIZE 8u

/* The checksum of an encoding of `len` bytes (checksum included): the hash of
 * its first len - 8 bytes.  len must be at least REFIT_MANIFEST_TRAILER_SIZE. */
uint64_t refit_manifest_checksum(const void *buf, size_t len);
/* Rewrites the total-length field and the trailing checksum of an encoding of
 * `len` bytes so that they match its contents; for tests and fuzzing, which
 * patch encodings and want the decoder to look past the checksum.  Does
 * nothing if len < REFIT_MANIFEST_HEADER_SIZE + REFIT_MANIFEST_TRAILER_SIZE. */
void refit_manifest_reseal(void *buf, size_t len);

#endif
