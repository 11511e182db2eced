/* include/refit/experimental/probe.h, the transports' part: which are built in, and
 * whether a set of them opens with given options (as a publisher's would). */
#include "engine/engine.h"
#include "refit/experimental/probe.h"

bool refit_transport_built(const char *name) { return name && refit_transport_find(name) != NULL; }

refit_status_t refit_transport_check(const char *names, const char *options)
{
    refit_tset_t ts;
    refit_status_t st = refit_tset_open(&ts, names, options, NULL);
    if (st) return st;
    refit_tset_close(&ts);
    return REFIT_OK;
}
