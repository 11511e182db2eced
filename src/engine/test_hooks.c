/* The test hooks (test_hooks.h).  Compiled twice: into the test flavour with
 * REFIT_TEST_HOOKS, reading the environment, and into the shipped library
 * without it, where each hook is a constant "off" and no variable name is
 * compiled in.  The one file of src/ besides util/env.c that calls getenv. */
#include "engine/test_hooks.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef REFIT_TEST_HOOKS

/* The value of "kind:index=VALUE" in the list env names, 0 if absent. */
static double holder_value(const char *name, const char *kind, uint32_t index)
{
    const char *env = getenv(name);
    if (!env || !env[0]) return 0;
    char want[48];
    int n = snprintf(want, sizeof(want), "%s:%u=", kind, index);
    for (const char *p = env; p && *p;) {
        if (!strncmp(p, want, (size_t)n)) return atof(p + n);
        p = strchr(p, ',');
        if (p) p++;
    }
    return 0;
}

double refit_test_throttle(const char *kind, uint32_t index)
{
    return holder_value("REFIT_TEST_THROTTLE", kind, index) * 1e6;
}

double refit_test_read_delay(const char *kind, uint32_t index)
{
    return holder_value("REFIT_TEST_READ_DELAY_MS", kind, index) * 1e-3;
}

unsigned refit_test_pause_ms(void)
{
    const char *pause = getenv("REFIT_TEST_PAUSE_MS");
    int ms = pause ? atoi(pause) : 0;
    /* Says that the pause begins: a test waits for the file, not for a guess of how long the way there takes. */
    const char *mark = ms > 0 ? getenv("REFIT_TEST_PAUSE_FILE") : NULL;
    if (mark && mark[0]) {
        int fd = open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0) close(fd);
    }
    return ms > 0 ? (unsigned)ms : 0;
}

bool refit_test_corrupt_delta(void) { return getenv("REFIT_TEST_CORRUPT_DELTA") != NULL; }

int refit_test_stamp_broken(void)
{
    const char *k = getenv("REFIT_TEST_STAMP_BROKEN");
    return k && k[0] ? atoi(k) : -1;
}

const char *refit_test_unsafe_rma(void) { return getenv("REFIT_UNSAFE_RMA"); }

#else /* the shipped library: every hook off */

double refit_test_throttle(const char *kind, uint32_t index)
{
    (void)kind;
    (void)index;
    return 0;
}

double refit_test_read_delay(const char *kind, uint32_t index)
{
    (void)kind;
    (void)index;
    return 0;
}

unsigned refit_test_pause_ms(void) { return 0; }

bool refit_test_corrupt_delta(void) { return false; }

int refit_test_stamp_broken(void) { return -1; }

const char *refit_test_unsafe_rma(void) { return NULL; }

#endif
