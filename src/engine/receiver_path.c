/* Receivers, the path: which way a pull's bytes come (refit_rx_path_t,
 * engine.h), decided in one place.
 *
 * At create, the route (refit_rx_route), from the receiver's params, its
 * memory domain and its transports: host memory, or GPU memory none of
 * whose transports writes it, takes the host path (every holder of the
 * bytes, relays included: the only route that opens relays); GPU memory
 * that a transport writes takes the GPU path, bf16 or FP8.  Per pull
 * (refit_rx_transfer): the delta when every source the plan reads offers
 * one from what this memory holds, else the route; the host path then
 * chooses between a direct pull and chunks by the holders it picked
 * (receiver_transfer.c, host_run).  The report's path says which ran. */
#include <inttypes.h>

#include "engine/receiver_internal.h"

const char *refit_rx_path_name(refit_rx_path_t path)
{
    switch (path) {
    case REFIT_RX_PATH_NONE: return "none";
    case REFIT_RX_PATH_HOST_DIRECT: return "host_direct";
    case REFIT_RX_PATH_HOST_FLEET: return "host_fleet";
    case REFIT_RX_PATH_GPU_DIRECT: return "gpu_direct";
    case REFIT_RX_PATH_GPU_FP8: return "gpu_fp8";
    case REFIT_RX_PATH_DELTA: return "delta";
    }
    return "unknown";
}

refit_status_t refit_rx_route(const refit_receiver_t *r, refit_rx_path_t *out)
{
    /* The host path (chunks, holders, relays) runs in host memory: a GPU
     * receiver takes it when none of its transports writes GPU memory, so
     * that every pull goes through its pinned staging anyway (relays then
     * serve from the staging). */
    bool gpu_writable = false;
    for (uint32_t t = 0; r->params.device >= 0 && t < r->ts.n; t++)
        if (refit_transport_caps(r->ts.ops[t]) & REFIT_TCAP_DEVICE_DST) gpu_writable = true;
    if (gpu_writable) {
        *out = r->fp8 ? REFIT_RX_PATH_GPU_FP8 : REFIT_RX_PATH_GPU_DIRECT;
        return REFIT_OK;
    }
    if (r->fp8)
        return refit_error(REFIT_ERR_UNSUPPORTED,
                           "an FP8 receiver quantizes on the GPU through cuda_ipc, which is not among "
                           "its transports (\"%s\")",
                           refit_transports_for_device(r->params.transports, r->params.device));
    *out = REFIT_RX_PATH_HOST_FLEET; /* the host path: its pulls run direct when their holders qualify */
    return REFIT_OK;
}

refit_status_t refit_rx_transfer(pull_t *p)
{
    refit_receiver_t *r = p->r;
    refit_pull_report_t *rep = p->rep;
    if (refit_rx_delta_eligible(p)) {
        refit_status_t st = refit_rx_delta_pull(p);
        if (!st) {
            rep->path = REFIT_RX_PATH_DELTA;
            return REFIT_OK;
        }
        /* A delta that failed before it wrote anything leaves the memory
         * as it was, one that failed while applying leaves it unusable:
         * either way the full transfer rewrites every byte, unless time is up. */
        if (st == REFIT_ERR_TIMEOUT || refit_now() > p->deadline) return st;
        refit_log(REFIT_LOG_INFO, "%s: delta of version %" PRIu64 " not applied (%s); pulling in full", r->reader, p->v,
                  refit_last_error());
        rep->delta_base = rep->delta_units = rep->bytes = rep->requests = 0;
        rep->sources = 0;
    }
    return refit_rx_full_transfer(p);
}
