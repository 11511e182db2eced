/* The test suite's hooks into the library, in one place.
 *
 * Tests (and the benchmarks that emulate links on one host) steer the engine
 * through environment variables: REFIT_TEST_THROTTLE paces holders,
 * REFIT_TEST_PAUSE_MS pauses a receiver once it has committed to a transfer
 * (and creates the file REFIT_TEST_PAUSE_FILE names as the pause begins),
 * REFIT_TEST_READ_DELAY_MS holds a holder's chunk reads back,
 * REFIT_TEST_CORRUPT_DELTA makes a delta publisher offer broken deltas,
 * REFIT_TEST_STAMP_BROKEN fails a source's stamp read after a transfer,
 * REFIT_UNSAFE_RMA=1 lets the UCX transport take rma=emulated (docs/env.md,
 * "Test flavour only").
 *
 * The library is built in two flavours from the same objects; only
 * test_hooks.c is compiled twice (CMakeLists.txt): the shipped librefit
 * (refit_shared, refit_static: what is installed and what the wheel carries)
 * with REFIT_TEST_HOOKS undefined, where every hook below answers "off" and no
 * REFIT_TEST_ name is compiled in, and the test flavour (refit_test_shared,
 * refit_test_static: librefit-test) with it, which the unit tests and the
 * build tree's refit-bench link.  ctest installed_no_hooks checks both.
 *
 * The hooks read the environment at each call (tests change it between
 * calls); they are called where a holder, a transfer or a publish begins,
 * never per byte. */
#ifndef REFIT_ENGINE_TEST_HOOKS_H
#define REFIT_ENGINE_TEST_HOOKS_H

#include <stdbool.h>
#include <stdint.h>

/* REFIT_TEST_THROTTLE="trainer:1=50,relay:0=10" (MB/s): the emulated link
 * rate of holder kind:index in bytes/s, 0 for none. */
double refit_test_throttle(const char *kind, uint32_t index);
/* REFIT_TEST_READ_DELAY_MS="relay:0=300": how long every chunk read from
 * holder kind:index waits before it copies, in seconds (0: none).  Its
 * chunks then stay in flight long enough to be re-read by other holders,
 * and its late copies land after theirs (tests of a redone chunk). */
double refit_test_read_delay(const char *kind, uint32_t index);
/* REFIT_TEST_PAUSE_MS: how long a receiver sleeps after it has marked its
 * memory unusable and before it transfers (0: not at all). */
unsigned refit_test_pause_ms(void);
/* REFIT_TEST_CORRUPT_DELTA: whether a delta publisher corrupts what it offers. */
bool refit_test_corrupt_delta(void);
/* REFIT_TEST_STAMP_BROKEN=K: the source rank whose stamp read after a
 * transfer fails as a failed connection's would (the receiver connects to it
 * again); -1 when unset. */
int refit_test_stamp_broken(void);
/* REFIT_UNSAFE_RMA: its value (the UCX transport accepts rma=emulated only
 * for "1"); NULL when unset and always in the shipped flavour. */
const char *refit_test_unsafe_rma(void);

#endif
