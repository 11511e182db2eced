/* Temporary until manifest_codec.c lands. */
#include "layout/manifest.h"
refit_status_t refit_manifest_encode(const refit_manifest_t *m, void **buf, size_t *len)
{
    (void)m, (void)buf, (void)len;
    return refit_error(REFIT_ERR_UNSUPPORTED, "manifest encoding not built yet");
}
refit_status_t refit_manifest_decode(const void *buf, size_t len, refit_manifest_t **out)
{
    (void)buf, (void)len, (void)out;
    return refit_error(REFIT_ERR_UNSUPPORTED, "manifest decoding not built yet");
}
