/* A cmocka setup and teardown for tests that move digest_pub_rows4_min_units (the threshold of the AVX-512 four-row
 * publisher kernel, src/data/digest_kernel.c): rows4_keep saves its value, rows4_restore puts it back, also after a
 * failed assertion left the test early.  rows4_default holds the saved value meanwhile. */
#ifndef REFIT_TEST_ROWS4_FIXTURE_H
#define REFIT_TEST_ROWS4_FIXTURE_H

#include <stdint.h>

#include "data/digest_internal.h"

static uint64_t rows4_default;

static int rows4_keep(void **state)
{
    (void)state;
    rows4_default = digest_pub_rows4_min_units;
    return 0;
}

static int rows4_restore(void **state)
{
    (void)state;
    digest_pub_rows4_min_units = rows4_default;
    return 0;
}

#endif
