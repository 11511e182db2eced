/* refit_manifest_for_rank (refit/layout.h): model name + layout string +
 * rank -> manifest, what every program that starts a rank does first. */
#include "refit/layout.h"
#include "refit/model.h"

refit_status_t refit_manifest_for_rank(const char *model, const char *layout, uint32_t rank, refit_manifest_t **out)
{
    refit_model_t *m = NULL;
    refit_layout_t *l = NULL;
    refit_status_t st = refit_model_open(model, &m);
    if (!st) st = refit_layout_parse(layout, &l);
    if (!st) st = refit_layout_manifest(l, m, rank, out);
    refit_layout_destroy(l);
    refit_model_destroy(m);
    return st;
}
