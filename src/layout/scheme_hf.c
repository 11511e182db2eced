/* The hf scheme: one rank holding every canonical tensor under its own name,
 * as a Hugging Face checkpoint does. */
#include "layout/layout.h"

refit_status_t refit_scheme_hf(refit_lbuild_t *b, const refit_layout_t *l, uint32_t rank)
{
    (void)l;
    (void)rank;
    for (size_t i = 0; i < b->model->tensors.len && !b->st; i++)
        refit_lb_whole(b, b->model->tensors.data[i].name, b->model->tensors.data[i].name);
    return b->st;
}
