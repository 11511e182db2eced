/* The table of built-in transports, and the device memory domain built in
 * (transport/memdom.h). */
#include <string.h>

#include "transport/memdom.h"
#include "transport/transport.h"

const refit_transport_ops_t *refit_transport_find(const char *name)
{
    static const refit_transport_ops_t *const all[] = {
        &refit_transport_shm,
#ifdef REFIT_HAVE_CUDA
        &refit_transport_cuda_ipc,
#endif
#ifdef REFIT_HAVE_UCX
        &refit_transport_ucx,
#endif
    };
    for (size_t i = 0; name && i < sizeof(all) / sizeof(all[0]); i++)
        if (strcmp(all[i]->name, name) == 0) return all[i];
    return NULL;
}

const refit_memdom_t *refit_memdom_device(void)
{
#ifdef REFIT_HAVE_CUDA
    return &refit_memdom_cuda;
#else
    return NULL;
#endif
}
