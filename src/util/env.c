/* The environment, read in one place (env.h): settings at each call through
 * one table of names, diagnostics once under pthread_once into a struct of
 * copies, so that no module caches a variable lazily on its own (two did,
 * with a flag and no lock). */
#include "util/env.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_names[REFIT_ENV_COUNT] = {
#define REFIT_ENV_NAME(id, name) name,
    REFIT_ENV_SETTINGS(REFIT_ENV_NAME)
#undef REFIT_ENV_NAME
};

char *refit_env(refit_env_t var)
{
    if ((unsigned)var >= REFIT_ENV_COUNT) return NULL;
    return getenv(g_names[var]);
}

const char *refit_env_name(refit_env_t var) { return (unsigned)var < REFIT_ENV_COUNT ? g_names[var] : "?"; }

static pthread_once_t g_diag_once = PTHREAD_ONCE_INIT;
static refit_diag_t g_diag;

static const char *copy_of(const char *name)
{
    const char *v = getenv(name);
    return v ? strdup(v) : NULL;
}

static void diag_read(void)
{
    g_diag.log_level = copy_of("REFIT_LOG_LEVEL");
    g_diag.cuda_trace = copy_of("REFIT_CUDA_TRACE");
    g_diag.cuda_small = copy_of("REFIT_CUDA_SMALL");
    g_diag.digest_pass = copy_of("REFIT_DIGEST_PASS");
    g_diag.digest_table = copy_of("REFIT_DIGEST_TABLE");
    g_diag.cuda_alloc_round = copy_of("REFIT_CUDA_ALLOC_ROUND");
    g_diag.digest_trace = copy_of("REFIT_DIGEST_TRACE");
    g_diag.digest_gpu = copy_of("REFIT_DIGEST_GPU");
    g_diag.fleet_trace = copy_of("REFIT_FLEET_TRACE");
}

const refit_diag_t *refit_diag(void)
{
    pthread_once(&g_diag_once, diag_read);
    return &g_diag;
}
