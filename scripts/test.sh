#!/usr/bin/env bash
# Builds refit twice, plainly and under AddressSanitizer + UndefinedBehavior-
# Sanitizer, and runs every test (unit, integration, fuzz-corpus replays) in
# both builds.  Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
scripts/build.sh build -DREFIT_WERROR=ON
ctest --test-dir build --output-on-failure -j "$jobs"
scripts/build.sh build-asan -DREFIT_WERROR=ON -DREFIT_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"
