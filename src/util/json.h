/* A small strict JSON (RFC 8259) parser into a read-only tree.
 *
 * Strict means: one value per text (surrounding whitespace only; a leading
 * UTF-8 byte order mark is skipped, as RFC 8259 allows), UTF-8 checked
 * everywhere, no control characters in strings, only the escapes of the RFC
 * (\uXXXX surrogate pairs are joined, lone surrogates rejected), no leading
 * zeros, NaN, Infinity, comments or trailing commas, numbers whose magnitude
 * overflows a double rejected, and no duplicate keys in one object.  Nesting
 * deeper than REFIT_JSON_MAX_DEPTH is refused.  The parser and the tree use no
 * recursion, so neither depth nor size can exhaust the C stack.
 *
 * Errors are REFIT_ERR_PARSE with the detail "line L column C: what" (lines
 * and columns from 1; columns count characters, not bytes), REFIT_ERR_NO_MEMORY
 * or REFIT_ERR_INVALID_ARG.
 *
 * Every accessor accepts NULL and values of the wrong type, answering NULL,
 * 0 or false, so lookups chain: refit_json_int(refit_json_get(o, "k"), &v).
 */
#ifndef REFIT_JSON_H
#define REFIT_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "refit/status.h"

#define REFIT_JSON_MAX_DEPTH 64

typedef struct refit_json refit_json_t;

typedef enum {
    REFIT_JSON_NONE = 0, /* refit_json_type(NULL) */
    REFIT_JSON_NULL,
    REFIT_JSON_BOOL,
    REFIT_JSON_NUMBER,
    REFIT_JSON_STRING,
    REFIT_JSON_ARRAY,
    REFIT_JSON_OBJECT,
} refit_json_type_t;

/* Parses text[0, len) (it need not be NUL-terminated).  *out is the root of
 * the tree, freed with refit_json_free; every value and string in the tree
 * lives as long as the root. */
refit_status_t refit_json_parse(const char *text, size_t len, refit_json_t **out);
/* Frees a tree returned by refit_json_parse (its root only); NULL is accepted. */
void refit_json_free(refit_json_t *root);

refit_json_type_t refit_json_type(const refit_json_t *v);
/* "null", "boolean", "number", "string", "array", "object"; "missing" for NONE. */
const char *refit_json_type_name(refit_json_type_t type);

/* true and *out if v is a boolean. */
bool refit_json_bool(const refit_json_t *v, bool *out);
/* true and *out if v is a number written as an integer (no fraction, no
 * exponent) in [-2^63, 2^63-1]; such values are exact. */
bool refit_json_int(const refit_json_t *v, int64_t *out);
/* true and *out (nearest double) if v is any number. */
bool refit_json_double(const refit_json_t *v, double *out);
/* The decoded UTF-8 bytes of a string (NUL-terminated; *len, if len is not
 * NULL, counts the bytes without the terminator, and may exceed strlen when
 * the string holds \u0000); NULL if v is not a string. */
const char *refit_json_string(const refit_json_t *v, size_t *len);

/* Elements of an array or members of an object; 0 for other values. */
size_t refit_json_len(const refit_json_t *v);
/* The i-th element of an array or value of the i-th member of an object (in
 * document order); NULL if out of range or v is neither. */
const refit_json_t *refit_json_at(const refit_json_t *v, size_t i);
/* The key of an object's i-th member (document order), like refit_json_string. */
const char *refit_json_key(const refit_json_t *obj, size_t i, size_t *len);
/* The value of an object's member named key; NULL if absent or obj is not an
 * object.  Hashed for large objects. */
const refit_json_t *refit_json_get(const refit_json_t *obj, const char *key);

#endif
