/* The engine's memory domains (transport/memdom.h): host memory here, GPU
 * memory where the library was built with it. */
#ifndef REFIT_ENGINE_MEMDOM_H
#define REFIT_ENGINE_MEMDOM_H

#include "transport/memdom.h"

extern const refit_memdom_t refit_memdom_host;

/* The domain of memory on `device` (-1: host memory).
 * REFIT_ERR_UNSUPPORTED: GPU memory in a library built without CUDA. */
refit_status_t refit_memdom_for(int device, const refit_memdom_t **out);

#endif
