#include "testutil.h"

#include <stdio.h>
#include <string.h>

void refit_test_assert_err(refit_status_t got, refit_status_t want, const char *needle, const char *expr,
                           const char *file, int line)
{
    if (got != want) {
        fprintf(stderr, "%s returned %s (%s), want %s\n", expr, refit_status_name(got), refit_last_error(),
                refit_status_name(want));
        _fail(file, line);
    }
    if (needle && !strstr(refit_last_error(), needle)) {
        fprintf(stderr, "%s: detail \"%s\" lacks \"%s\"\n", expr, refit_last_error(), needle);
        _fail(file, line);
    }
}
