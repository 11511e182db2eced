/* Logging: silent unless REFIT_LOG_LEVEL or refit_log_set_level() asks. The
 * level is parsed from the environment's (util/env.h: read once) on first
 * use; the level itself is one atomic int, so threads that log while another
 * sets it see one value or the other. */
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static refit_log_sink_t g_sink;
static void *g_sink_user;
static int g_level = -1; /* -1: not yet read from the environment */

static void default_sink(refit_log_level_t level, const char *line, void *user)
{
    static const char *names[] = {"off", "error", "warn", "info", "debug", "trace"};
    (void)user;
    fprintf(stderr, "refit %s: %s\n", names[level], line);
}

refit_log_level_t refit_log_get_level(void)
{
    int now = __atomic_load_n(&g_level, __ATOMIC_RELAXED);
    if (now < 0) {
        const char *env = refit_diag()->log_level;
        int level = REFIT_LOG_OFF;
        if (env) {
            static const char *names[] = {"off", "error", "warn", "info", "debug", "trace"};
            for (int i = 0; i < 6; i++)
                if (strcasecmp(env, names[i]) == 0) level = i;
            if (env[0] >= '0' && env[0] <= '5' && env[1] == '\0') level = env[0] - '0';
        }
        /* only if still unread: a refit_log_set_level() meanwhile wins */
        if (__atomic_compare_exchange_n(&g_level, &now, level, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) now = level;
    }
    return (refit_log_level_t)now;
}

void refit_log_set_level(refit_log_level_t level) { __atomic_store_n(&g_level, (int)level, __ATOMIC_RELAXED); }

void refit_log_set_sink(refit_log_sink_t sink, void *user)
{
    g_sink = sink;
    g_sink_user = user;
}

void refit_log(refit_log_level_t level, const char *fmt, ...)
{
    if (level == REFIT_LOG_OFF || (int)level > (int)refit_log_get_level()) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    (g_sink ? g_sink : default_sink)(level, line, g_sink ? g_sink_user : NULL);
}
