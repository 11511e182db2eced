/* Element types: sizes, names, parsing; tensor sizes. */
#include <string.h>
#include <strings.h>

#include "refit/types.h"
#include "util/util.h"

static const struct {
    const char *name;
    size_t size;
    const char *aliases[3];
} g_dtypes[REFIT_DTYPE_COUNT_] = {
    [REFIT_DTYPE_BF16] = {"bf16", 2, {"bfloat16", NULL}},
    [REFIT_DTYPE_F16] = {"f16", 2, {"float16", "half", NULL}},
    [REFIT_DTYPE_F32] = {"f32", 4, {"float32", "float", NULL}},
    [REFIT_DTYPE_F8_E4M3] = {"f8_e4m3", 1, {"float8_e4m3fn", "fp8", NULL}},
    [REFIT_DTYPE_I32] = {"i32", 4, {"int32", NULL}},
    [REFIT_DTYPE_I64] = {"i64", 8, {"int64", NULL}},
    [REFIT_DTYPE_U8] = {"u8", 1, {"uint8", NULL}},
};

size_t refit_dtype_size(refit_dtype_t dtype)
{
    return dtype > 0 && dtype < REFIT_DTYPE_COUNT_ ? g_dtypes[dtype].size : 0;
}

const char *refit_dtype_name(refit_dtype_t dtype)
{
    return dtype > 0 && dtype < REFIT_DTYPE_COUNT_ ? g_dtypes[dtype].name : "invalid";
}

refit_dtype_t refit_dtype_parse(const char *name)
{
    if (!name) return REFIT_DTYPE_INVALID;
    for (int d = 1; d < REFIT_DTYPE_COUNT_; d++) {
        if (strcasecmp(name, g_dtypes[d].name) == 0) return (refit_dtype_t)d;
        for (int a = 0; g_dtypes[d].aliases[a]; a++)
            if (strcasecmp(name, g_dtypes[d].aliases[a]) == 0) return (refit_dtype_t)d;
    }
    return REFIT_DTYPE_INVALID;
}

uint64_t refit_tensor_numel(const refit_tensor_info_t *t)
{
    if (!t || t->ndim < 1 || t->ndim > REFIT_MAX_DIMS) return 0;
    uint64_t n = 1;
    for (uint32_t i = 0; i < t->ndim; i++)
        if (!refit_mul_u64(n, t->shape[i], &n)) return 0;
    return n;
}

uint64_t refit_tensor_nbytes(const refit_tensor_info_t *t)
{
    uint64_t n = refit_tensor_numel(t), b;
    return refit_mul_u64(n, refit_dtype_size(t ? t->dtype : REFIT_DTYPE_INVALID), &b) ? b : 0;
}
