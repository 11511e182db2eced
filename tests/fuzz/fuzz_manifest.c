/* Fuzz target for the manifest decoder.
 *
 * Each input is decoded twice: as given (so the header and checksum checks
 * are exercised) and with its length field and checksum rewritten to match
 * (so mutations reach the parser and validation behind the checksum).  An
 * accepted input must re-encode to exactly the same bytes (the format has one
 * encoding per manifest) and decode again to the same signature.  A failure
 * must leave the output untouched and carry a known code and a detail. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layout/manifest.h"
#include "layout/manifest_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const uint8_t *data, size_t size)
{
    refit_manifest_t *m = (refit_manifest_t *)(uintptr_t)0x1;
    refit_status_t st = refit_manifest_decode(data, size, &m);
    if (st != REFIT_OK) {
        if (m != (refit_manifest_t *)(uintptr_t)0x1) abort(); /* output written on failure */
        switch (st) {
        case REFIT_ERR_CORRUPT:
        case REFIT_ERR_UNSUPPORTED:
        case REFIT_ERR_INVALID_ARG:
        case REFIT_ERR_OUT_OF_BOUNDS:
        case REFIT_ERR_OVERLAP:
        case REFIT_ERR_MISMATCH:
        case REFIT_ERR_NO_MEMORY: break;
        default: abort();
        }
        if (refit_last_error()[0] == '\0') abort();
        return;
    }
    uint64_t sig = refit_manifest_signature(m);
    if (sig == 0 || sig != refit_manifest_compute_signature(m)) abort();

    void *buf = NULL;
    size_t len = 0;
    if (refit_manifest_encode(m, &buf, &len) != REFIT_OK) abort();
    if (len != size || memcmp(buf, data, size) != 0) abort(); /* one encoding per manifest */
    refit_manifest_t *again = NULL;
    if (refit_manifest_decode(buf, len, &again) != REFIT_OK) abort();
    if (refit_manifest_signature(again) != sig) abort();
    refit_manifest_destroy(again);
    free(buf);
    refit_manifest_destroy(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    refit_clear_error();
    check(data, size);
    if (size >= REFIT_MANIFEST_HEADER_SIZE + REFIT_MANIFEST_TRAILER_SIZE && size <= (1u << 20)) {
        uint8_t *copy = malloc(size);
        if (!copy) return 0;
        memcpy(copy, data, size);
        refit_manifest_reseal(copy, size);
        refit_clear_error();
        check(copy, size);
        free(copy);
    }
    return 0;
}
