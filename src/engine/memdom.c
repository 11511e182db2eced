/* The host memory domain (transport/memdom.h), and the choice of a domain
 * for a device number. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "engine/memdom.h"
#include "plan/plan.h"
#include "refit/experimental/truth.h"

static refit_status_t host_alloc(int dev, uint64_t size, void **out)
{
    (void)dev;
    void *p = NULL;
    if (posix_memalign(&p, 4096, size ? size : 1))
        return refit_error(REFIT_ERR_NO_MEMORY, "%" PRIu64 " bytes of host memory", size);
    memset(p, 0, size); /* fault the pages in now, not during the first refit */
    *out = p;
    return REFIT_OK;
}

static void host_free(void *p) { free(p); }

static refit_status_t host_copy(void *dst, const void *src, uint64_t n)
{
    memcpy(dst, src, n);
    return REFIT_OK;
}

static refit_status_t host_staging_alloc(uint64_t size, void **out) { return host_alloc(-1, size, out); }

static refit_status_t host_fills(const refit_plan_t *plan, int dev, void *const *bases, uint64_t *launches)
{
    (void)dev;
    (void)launches;
    /* No source selected: the plan's fills only. */
    uint8_t *only = calloc(plan->nsrcs ? plan->nsrcs : 1, 1);
    if (!only) return refit_error(REFIT_ERR_NO_MEMORY, "fills");
    refit_exec_opts_t fo = {.threads = 1, .only = only};
    refit_status_t st = refit_plan_execute(plan, NULL, bases, &fo);
    free(only);
    return st;
}

static refit_status_t host_truth_verify(const refit_manifest_t *m, int dev, const void *const *bases, uint64_t version,
                                        double fraction)
{
    (void)dev;
    return refit_truth_verify_delta(m, bases, version, fraction, NULL);
}

const refit_memdom_t refit_memdom_host = {
    .name = "host",
    .alloc = host_alloc,
    .free = host_free,
    .copy = host_copy,
    .staging_alloc = host_staging_alloc,
    .staging_free = host_free,
    .fills = host_fills,
    .truth_verify = host_truth_verify,
};

refit_status_t refit_memdom_for(int device, const refit_memdom_t **out)
{
    const refit_memdom_t *d = device < 0 ? &refit_memdom_host : refit_memdom_device();
    if (!d) return refit_error(REFIT_ERR_UNSUPPORTED, "GPU memory (device %d) needs a refit built with CUDA", device);
    *out = d;
    return REFIT_OK;
}
