/* Fuzzes the JSON parser: any input either fails cleanly or gives a tree
 * whose every value is walked (without recursion) and checked for the
 * parser's promises: NUL-terminated strings, integers equal to their double,
 * every key found again by lookup (keys are unique). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)           \
    do {                   \
        if (!(c)) abort(); \
    } while (0)

typedef struct {
    const refit_json_t *v;
    size_t next; /* the next element or member to visit */
} frame_t;

static void check_scalar(const refit_json_t *v)
{
    size_t len;
    const char *s = refit_json_string(v, &len);
    if (s) CHECK(s[len] == '\0');
    int64_t i;
    double d;
    if (refit_json_int(v, &i)) CHECK(refit_json_double(v, &d) && d == (double)i);
    bool b;
    CHECK(refit_json_bool(v, &b) == (refit_json_type(v) == REFIT_JSON_BOOL));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    refit_json_t *root;
    if (refit_json_parse((const char *)data, size, &root) != REFIT_OK) return 0;
    frame_t stack[REFIT_JSON_MAX_DEPTH + 1];
    size_t depth = 0;
    stack[depth++] = (frame_t){root, 0};
    check_scalar(root);
    while (depth) {
        const refit_json_t *v = stack[depth - 1].v;
        size_t i = stack[depth - 1].next++;
        if (i >= refit_json_len(v)) {
            CHECK(refit_json_at(v, i) == NULL);
            depth--;
            continue;
        }
        const refit_json_t *child = refit_json_at(v, i);
        CHECK(child);
        if (refit_json_type(v) == REFIT_JSON_OBJECT) {
            size_t klen;
            const char *key = refit_json_key(v, i, &klen);
            CHECK(key && key[klen] == '\0');
            if (strlen(key) == klen) CHECK(refit_json_get(v, key) == child);
        }
        check_scalar(child);
        if (refit_json_type(child) == REFIT_JSON_ARRAY || refit_json_type(child) == REFIT_JSON_OBJECT) {
            CHECK(depth < REFIT_JSON_MAX_DEPTH);
            stack[depth++] = (frame_t){child, 0};
        }
    }
    refit_json_free(root);
    return 0;
}
