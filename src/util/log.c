/* Logging: silent unless REFIT_LOG_LEVEL or refit_log_set_level() asks. The
 * level is read from the environment once, lazily. */
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
    if (g_level < 0) {
        const char *env = getenv("REFIT_LOG_LEVEL");
        int level = REFIT_LOG_OFF;
        if (env) {
            static const char *names[] = {"off", "error", "warn", "info", "debug", "trace"};
            for (int i = 0; i < 6; i++)
                if (strcasecmp(env, names[i]) == 0) level = i;
            if (env[0] >= '0' && env[0] <= '5' && env[1] == '\0') level = env[0] - '0';
        }
        g_level = level;
    }
    return (refit_log_level_t)g_level;
}

void refit_log_set_level(refit_log_level_t level) { g_level = (int)level; }

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
