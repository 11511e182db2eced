#!/usr/bin/env bash
# Builds refit twice, plainly and under AddressSanitizer + UndefinedBehavior-
# Sanitizer, and runs every test (unit, integration, fuzz-corpus replays) in
# both builds.  Exits non-zero if anything fails.
#
#   scripts/test.sh          everything, both builds (what CI runs)
#   scripts/test.sh quick    the C unit tests and the fuzz-corpus replays
#                            (ctest labels unit, fuzz) in the plain build only:
#                            no venvs, no network namespaces, a few minutes
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
if [ "${1:-}" = quick ]; then
  scripts/build.sh build -DREFIT_WERROR=ON
  exec ctest --test-dir build --output-on-failure -j "$jobs" -L '^(unit|fuzz)$'
fi
[ $# -eq 0 ] || { echo "usage: scripts/test.sh [quick]" >&2; exit 2; }
scripts/build.sh build -DREFIT_WERROR=ON
ctest --test-dir build --output-on-failure -j "$jobs"
scripts/build.sh build-asan -DREFIT_WERROR=ON -DREFIT_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"
