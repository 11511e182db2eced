/* Shared helpers for the unit tests (cmocka). */
#ifndef REFIT_TESTUTIL_H
#define REFIT_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "refit/refit.h"

/* Asserts a refit call succeeded, printing the last-error detail if not. */
#define REFIT_ASSERT_OK(expr)                                                                         \
    do {                                                                                              \
        refit_status_t st_ = (expr);                                                                  \
        if (st_ != REFIT_OK) fail_msg("%s -> %s: %s", #expr, refit_status_name(st_), refit_last_error()); \
    } while (0)
/* Asserts a refit call failed with `code` and that the detail contains `needle`. */
#define REFIT_ASSERT_ERR(expr, code, needle) refit_test_assert_err((expr), (code), (needle), #expr, __FILE__, __LINE__)
void refit_test_assert_err(refit_status_t got, refit_status_t want, const char *needle, const char *expr,
                           const char *file, int line);

#endif
