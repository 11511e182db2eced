/* Fuzzes the config.json reader along refit_model_from_config's path (text to
 * spec to model).  The tensor table grows with layers x experts, so models
 * whose table would pass ~20k tensors are read to a spec only: building them
 * is correct but slow, and the fuzzer would report it as a hang. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)           \
    do {                   \
        if (!(c)) abort(); \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    refit_model_spec_t spec;
    if (refit_config_to_spec(text, size, "fuzz", &spec) != REFIT_OK) return 0;
    CHECK(memchr(spec.name, '\0', sizeof(spec.name)) && spec.name[0]);
    if ((uint64_t)spec.layers * (32 + 3 * (uint64_t)spec.experts) > 20000) return 0;
    refit_model_t *m;
    if (refit_model_from_config_text(text, size, "fuzz", &m) != REFIT_OK) return 0;
    CHECK(strcmp(refit_model_name(m), spec.name) == 0);
    uint64_t total = 0;
    for (size_t i = 0; i < refit_model_num_tensors(m); i++) {
        refit_tensor_info_t t;
        CHECK(refit_model_tensor(m, i, &t) == REFIT_OK);
        CHECK(refit_model_find_tensor(m, t.name) == (int64_t)i);
        total += refit_tensor_nbytes(&t);
    }
    CHECK(total == refit_model_total_bytes(m));
    refit_model_destroy(m);
    return 0;
}
