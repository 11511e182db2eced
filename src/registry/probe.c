/* include/refit/experimental/probe.h, the registry's part: a handle opened as a rank
 * would open it, and one timed round trip of the lease protocol. */
#include "registry/registry.h"

#include "refit/engine.h"

refit_status_t refit_registry_connect(const char *url, const char *job, const char *secret_file, refit_registry_t **out)
{
    if (!url) url = refit_default_registry();
    if (!secret_file) return refit_registry_open(url, job, out);
    refit_registry_auth_t auth = {.secret_file = secret_file};
    return refit_registry_open_auth(url, job, &auth, out);
}

refit_status_t refit_registry_probe(refit_registry_t *r, const char *reader, double *take_ms, double *check_ms,
                                    double *release_ms)
{
    uint64_t token;
    double a = refit_now();
    refit_status_t st = refit_registry_lease_take(r, "preflight", 1, reader, 10000, &token);
    double b = refit_now();
    if (!st) st = refit_registry_lease_holds(r, "preflight", 1, reader, token);
    double c = refit_now();
    if (!st) st = refit_registry_lease_release(r, "preflight", 1, reader);
    double e = refit_now();
    if (take_ms) *take_ms = (b - a) * 1e3;
    if (check_ms) *check_ms = (c - b) * 1e3;
    if (release_ms) *release_ms = (e - c) * 1e3;
    return st;
}
