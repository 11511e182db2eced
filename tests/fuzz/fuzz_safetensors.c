/* Fuzzes the safetensors reader: any input either fails cleanly (a status
 * and a detail) or gives tensors whose every promise holds: byte ranges inside
 * the file, equal to dtype size times the shape's elements, pairwise disjoint,
 * and every name found again by lookup. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "refit/experimental/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)           \
    do {                   \
        if (!(c)) abort(); \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    refit_safetensors_t *f = NULL;
    refit_status_t st = refit_safetensors_parse(data, size, &f);
    if (st) {
        CHECK(f == NULL && refit_last_error()[0] != '\0');
        return 0;
    }
    size_t n = refit_safetensors_count(f);
    uint64_t *b = calloc(n ? n : 1, sizeof(uint64_t)), *e = calloc(n ? n : 1, sizeof(uint64_t));
    CHECK(b && e);
    for (size_t i = 0; i < n; i++) {
        refit_tensor_info_t t;
        uint64_t off, nb;
        CHECK(refit_safetensors_tensor(f, i, &t, &off, &nb) == REFIT_OK);
        CHECK(off >= 8 && off <= size && nb <= size - off);
        uint64_t want = refit_dtype_size(t.dtype);
        for (uint32_t d = 0; d < t.ndim; d++) want *= t.shape[d];
        CHECK(want == nb);
        CHECK(refit_safetensors_find(f, t.name) >= 0);
        b[i] = off;
        e[i] = off + nb;
        for (size_t j = 0; j < i; j++)
            if (b[i] < e[i] && b[j] < e[j]) CHECK(e[i] <= b[j] || e[j] <= b[i]);
    }
    CHECK(refit_safetensors_tensor(f, n, NULL, NULL, NULL) != REFIT_OK);
    free(b);
    free(e);
    refit_safetensors_close(f);
    return 0;
}
