/* The test suite's hooks into the engine, in one place.
 *
 * Tests (and the benchmarks that emulate links on one host) steer the engine
 * through environment variables: REFIT_TEST_THROTTLE paces holders,
 * REFIT_TEST_PAUSE_MS pauses a receiver once it has committed to a transfer,
 * REFIT_TEST_CORRUPT_DELTA makes a delta publisher offer broken deltas
 * (docs/runtime.md, "Fault injection").  They are compiled into the library
 * only when CMake's REFIT_TEST_HOOKS is on (by default, when the tests are
 * built); otherwise every hook below is a constant "off" and the library
 * holds no REFIT_TEST_ name at all (the ctest no_test_hooks checks). */
#ifndef REFIT_ENGINE_TEST_HOOKS_H
#define REFIT_ENGINE_TEST_HOOKS_H

#include <stdbool.h>
#include <stdint.h>

#ifdef REFIT_TEST_HOOKS
/* REFIT_TEST_THROTTLE="trainer:1=50,relay:0=10" (MB/s): the emulated link
 * rate of holder kind:index in bytes/s, 0 for none. */
double refit_test_throttle(const char *kind, uint32_t index);
/* REFIT_TEST_PAUSE_MS: how long a receiver sleeps after it has marked its
 * memory unusable and before it transfers (0: not at all). */
unsigned refit_test_pause_ms(void);
/* REFIT_TEST_CORRUPT_DELTA: whether a delta publisher corrupts what it offers. */
bool refit_test_corrupt_delta(void);
#else
static inline double refit_test_throttle(const char *kind, uint32_t index)
{
    (void)kind;
    (void)index;
    return 0;
}
static inline unsigned refit_test_pause_ms(void) { return 0; }
static inline bool refit_test_corrupt_delta(void) { return false; }
#endif

#endif
