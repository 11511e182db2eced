/* Temporary: replaced by config.c (HF config.json reader). */
#include "model/model.h"

refit_status_t refit_model_from_config(const char *path, refit_model_t **out)
{
    (void)out;
    return refit_error(REFIT_ERR_UNSUPPORTED, "config.json reading is not built yet (%s)", path ? path : "");
}

refit_status_t refit_model_open(const char *name_or_path, refit_model_t **out)
{
    return refit_model_builtin(name_or_path, out);
}
