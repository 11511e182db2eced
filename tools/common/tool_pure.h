/* Internal code of librefit that the programs beside it (refit, refit-bench)
 * use too, built a second time into the static helper library refit_tool_pure
 * (cmake/tools.cmake): pure code with no state of its own, so two copies in one
 * process (librefit.so's, hidden, and this one) cannot disagree.  The
 * programs include only this header, never src/; tool_pure.c includes it
 * together with the library's own headers, so a declaration here that drifts
 * from the code it restates fails the build.
 *
 * What is here and why it is not public: a strict JSON reader (the programs
 * read each other's JSON records; src/util/json.h documents it), the
 * kernel's random bytes (src/util/crypto.h), URL redaction for messages
 * (src/util/util.h) and the shm socket directory refit picks when not told
 * (src/util/userdir.h: `refit preflight` reports it).  None belongs to the library's job of moving weights. */
#ifndef REFIT_TOOL_PURE_H
#define REFIT_TOOL_PURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "refit/status.h"

/* The JSON reader (src/util/json.c): a read-only tree; every accessor accepts
 * NULL and values of the wrong type, answering NULL, 0 or false. */
typedef struct refit_json refit_json_t;
/* Parses text[0, len); *out is the root, freed with refit_json_free.
 * REFIT_ERR_PARSE ("line L column C: what"), _NO_MEMORY or _INVALID_ARG. */
refit_status_t refit_json_parse(const char *text, size_t len, refit_json_t **out);
void refit_json_free(refit_json_t *root);
bool refit_json_bool(const refit_json_t *v, bool *out);
/* A number written as an integer in [-2^63, 2^63-1]. */
bool refit_json_int(const refit_json_t *v, int64_t *out);
/* Any number (false for every other type). */
bool refit_json_double(const refit_json_t *v, double *out);
const char *refit_json_string(const refit_json_t *v, size_t *len);
size_t refit_json_len(const refit_json_t *v);
const refit_json_t *refit_json_at(const refit_json_t *v, size_t i);
const char *refit_json_key(const refit_json_t *obj, size_t i, size_t *len);
const refit_json_t *refit_json_get(const refit_json_t *obj, const char *key);

/* Fills buf from the kernel (getrandom); REFIT_ERR_INTERNAL if it cannot. */
refit_status_t refit_random_bytes(void *buf, size_t n);

/* A copy of a URL with any password replaced by "***", for messages; NULL on OOM. */
char *refit_redact_url(const char *url);

/* The shm socket directory named by configuration (src/util/userdir.h):
 * option (shm.dir=), $REFIT_RUNTIME_DIR, $XDG_RUNTIME_DIR/refit; false when
 * none: each job's own, named from its key. */
bool refit_runtime_dir(const char *option, char *out, size_t n, const char **source);

#endif
