/*
 * refit/types.h - element types and tensor descriptions shared by every module.
 */
#ifndef REFIT_TYPES_H
#define REFIT_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "refit/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most dimensions any canonical or local tensor may have. */
#define REFIT_MAX_DIMS 4

typedef enum {
    REFIT_DTYPE_INVALID = 0,
    REFIT_DTYPE_BF16 = 1,
    REFIT_DTYPE_F16 = 2,
    REFIT_DTYPE_F32 = 3,
    REFIT_DTYPE_F8_E4M3 = 4,
    REFIT_DTYPE_I32 = 5,
    REFIT_DTYPE_I64 = 6,
    REFIT_DTYPE_U8 = 7,
    REFIT_DTYPE_COUNT_ = 8
} refit_dtype_t;

/* Bytes per element; 0 for an invalid dtype. */
REFIT_API size_t refit_dtype_size(refit_dtype_t dtype);
/* "bf16", "f32", ... ; "invalid" for unknown values. */
REFIT_API const char *refit_dtype_name(refit_dtype_t dtype);
/* Parses "bf16"/"bfloat16"/"BF16", "f32"/"float32"/"F32", ...; REFIT_DTYPE_INVALID if unknown. */
REFIT_API refit_dtype_t refit_dtype_parse(const char *name);

/* A tensor by name, element type and shape (row-major, shape[0] outermost).
 * In outputs of refit calls `name` points into the owning object and lives as
 * long as it does. */
typedef struct {
    const char *name;
    refit_dtype_t dtype;
    uint32_t ndim; /* 1..REFIT_MAX_DIMS */
    uint64_t shape[REFIT_MAX_DIMS];
} refit_tensor_info_t;

/* Elements and bytes of a tensor; 0 if ndim is out of range or on overflow. */
REFIT_API uint64_t refit_tensor_numel(const refit_tensor_info_t *info);
REFIT_API uint64_t refit_tensor_nbytes(const refit_tensor_info_t *info);

#ifdef __cplusplus
}
#endif
#endif
