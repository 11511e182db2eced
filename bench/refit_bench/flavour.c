/* Which flavour of the library this refit-bench links (cmake/tools.cmake
 * compiles this file once per program, the rest of refit-bench once): the
 * build tree's refit-bench links librefit-test, whose pacing hook
 * (REFIT_TEST_THROTTLE) emulates links on one host; the installed one links
 * the shipped librefit, which has none, so its scenarios that need pacing
 * refuse to run instead of measuring unpaced links (net.c nb_throttle_all). */
#include "net_internal.h"

const bool nb_paced_links = BENCH_PACED_LINKS;
