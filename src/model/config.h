/* Internal: the Hugging Face config.json reader (config.c), one step below
 * refit_model_from_config_text: text to spec, without building the tensor
 * table.  Lets the config fuzzer see the numbers before it builds a model. */
#ifndef REFIT_MODEL_CONFIG_H
#define REFIT_MODEL_CONFIG_H

#include "model/model.h"

/* Reads config.json text into *spec (written only on success).  name_hint
 * names the model when the config's "_name_or_path" is absent or unusable
 * (NULL or "": "custom").  The numbers are checked as read (REFIT_ERR_*
 * as for refit_model_from_config); refit_model_from_spec checks the rest. */
refit_status_t refit_config_to_spec(const char *text, size_t len, const char *name_hint, refit_model_spec_t *spec);

#endif
