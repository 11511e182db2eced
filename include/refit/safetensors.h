/*
 * refit/safetensors.h - writing a rank's local tensors as a safetensors file.
 *
 * The file is the real format: an 8-byte little-endian header length, a JSON
 * header mapping each tensor name to {"dtype","shape","data_offsets"}, then
 * the data.  Names are the local tensor names of the manifest.
 */
#ifndef REFIT_SAFETENSORS_H
#define REFIT_SAFETENSORS_H

#include "refit/manifest.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes every local tensor of m (bytes from region_bases) to `path`
 * (created or truncated; written to a temporary name and renamed).
 * REFIT_ERR_IO with the path and errno text on failure. */
REFIT_API refit_status_t refit_safetensors_write(const char *path, const refit_manifest_t *m,
                                                 const void *const *region_bases);

#ifdef __cplusplus
}
#endif
#endif
