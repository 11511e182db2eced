/* libucp opened at run time (REFIT_UCX_DLOPEN; see ucx_dl.h).  One attempt per process: its result, and the
 * loader's message when it failed, are kept for every later transport. */
#ifdef REFIT_UCX_DLOPEN
#define REFIT_UCX_DL_IMPL
#include "transport/ucx/ucx_dl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "util/util.h"

#define UCX_DL_LIBRARY "libucp.so.0"

struct ucx_dl_functions ucx_dl;
static pthread_once_t dl_once = PTHREAD_ONCE_INIT;
static char dl_failure[512]; /* empty: loaded */

/* Resolved through the libucp handle: dlsym searches its dependencies too (libucs for ucs_status_string). */
static void dl_open(void)
{
    void *h = dlopen(UCX_DL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(dl_failure, sizeof(dl_failure), "cannot load %s (%s)", UCX_DL_LIBRARY, dlerror());
        return;
    }
#define UCX_DL_RESOLVE(name)                                               \
    if (!(ucx_dl.name = (__typeof__(ucx_dl.name))dlsym(h, #name))) {       \
        snprintf(dl_failure, sizeof(dl_failure),                           \
                 "%s has no %s (a UCX older than the one refit was built " \
                 "against?)",                                              \
                 UCX_DL_LIBRARY, #name);                                   \
        return;                                                            \
    }
    REFIT_UCX_FUNCTIONS(UCX_DL_RESOLVE)
#undef UCX_DL_RESOLVE
}

refit_status_t ucx_dl_load(void)
{
    pthread_once(&dl_once, dl_open);
    if (dl_failure[0])
        return refit_error(REFIT_ERR_UNSUPPORTED,
                           "ucx: %s: install UCX (pip install libucx-cu12, or the "
                           "system's libucx0)",
                           dl_failure);
    return REFIT_OK;
}
#else
typedef int ucx_dl_unused; /* ISO C wants a translation unit to declare something */
#endif
