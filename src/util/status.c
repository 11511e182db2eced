/* Status names and messages come from the one X-macro list in status.h; the
 * last-error detail is a thread-local buffer written by refit_error(). */
#include "util/util.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char g_last_error[1024];

const char *refit_status_name(refit_status_t status)
{
    switch (status) {
#define REFIT_NAME_(name, value, msg) \
    case REFIT_##name: return "REFIT_" #name;
        REFIT_STATUS_MAP(REFIT_NAME_)
#undef REFIT_NAME_
    }
    return "REFIT_UNKNOWN";
}

const char *refit_status_message(refit_status_t status)
{
    switch (status) {
#define REFIT_MSG_(name, value, msg) \
    case REFIT_##name: return msg;
        REFIT_STATUS_MAP(REFIT_MSG_)
#undef REFIT_MSG_
    }
    return "unknown status code";
}

const char *refit_last_error(void) { return g_last_error; }

void refit_clear_error(void) { g_last_error[0] = '\0'; }

refit_status_t refit_error(refit_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof(g_last_error), fmt, ap);
    va_end(ap);
    refit_log(REFIT_LOG_DEBUG, "%s: %s", refit_status_name(status), g_last_error);
    return status;
}

refit_status_t refit_error_prefix(const char *fmt, ...)
{
    char prefix[512], old[sizeof(g_last_error)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    memcpy(old, g_last_error, sizeof(old));
    snprintf(g_last_error, sizeof(g_last_error), "%.400s: %.600s", prefix, old);
    return REFIT_OK;
}
