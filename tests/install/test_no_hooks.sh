#!/usr/bin/env bash
# ctest installed_no_hooks: what `cmake --install` installs carries no test
# hook (src/engine/test_hooks.h; docs/env.md), and the check can fail.
#   1. the installed librefit.so, librefit.a and refit hold no REFIT_TEST_ name; the test
#      flavour (librefit-test.so) holds them (so a scan that finds nothing is a scan that works);
#      nothing of the test flavour is installed;
#   2. the installed refit and refit-bench load the installed librefit.so.0;
#   3. behaviour: with REFIT_TEST_CORRUPT_DELTA=1 the installed refit-bench's delta pulls still
#      apply deltas and verify, while the build tree's refit-bench (the test flavour) sees its
#      deltas corrupted (none applied; the full pulls that follow still verify);
#   4. the installed refit-bench refuses a scenario that needs paced links (REFIT_TEST_THROTTLE)
#      instead of measuring unpaced ones;
#   5. no getenv in src/ outside src/util/env.c and src/engine/test_hooks.c.
# Usage: test_no_hooks.sh BUILD_DIR SOURCE_DIR TEST_FLAVOUR_LIB BUILD_TREE_REFIT_BENCH
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
testlib=$3
treebench=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "installed_no_hooks: FAIL: $*" >&2; exit 1; }
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }

# 1. Names.
so=$(find "$prefix" -name 'librefit.so.0' | head -1)
[ -n "$so" ] || fail "no librefit.so.0 installed"
libdir=$(dirname "$so")
hooked() { strings -a "$1" | { grep -o 'REFIT_TEST_[A-Z_]*' || true; } | sort -u | tr '\n' ' '; }
for f in "$(readlink -f "$so")" "$libdir/librefit.a" "$prefix/bin/refit"; do
  [ -f "$f" ] || fail "$f was not installed"
  names=$(hooked "$f")
  [ -z "$names" ] || fail "installed $f holds test hook names: $names"
done
names=$(hooked "$(readlink -f "$testlib")")
for want in REFIT_TEST_THROTTLE REFIT_TEST_PAUSE_MS REFIT_TEST_CORRUPT_DELTA; do
  grep -qw "$want" <<<"$names" || fail "the test flavour $testlib lacks $want (found: '$names'): the scan finds nothing"
done
# (strings' output is captured first: grep -q stops reading early, and under pipefail a SIGPIPE'd strings fails.)
words=$(strings -a "$(readlink -f "$testlib")")
grep -qx REFIT_UNSAFE_RMA <<<"$words" || fail "the test flavour lacks REFIT_UNSAFE_RMA"
words=$(strings -a "$(readlink -f "$so")")
! grep -qx REFIT_UNSAFE_RMA <<<"$words" || fail "the installed library reads REFIT_UNSAFE_RMA"
stray=$(find "$prefix" -name '*refit-test*')
[ -z "$stray" ] || fail "the test flavour was installed: $stray"

# 2. The installed programs load the installed library.
for p in refit refit-bench; do
  [ -x "$prefix/bin/$p" ] || fail "bin/$p was not installed"
  libs=$(ldd "$prefix/bin/$p")
  loaded=$(sed -n 's/^\s*librefit\.so\.0 => \(\S*\) .*/\1/p' <<<"$libs")
  [ -n "$loaded" ] && [ "$loaded" -ef "$so" ] || fail "installed $p does not load $so: $libs"
  ! grep -q "librefit-test" <<<"$libs" || fail "installed $p loads the test flavour: $libs"
done

# 3. A hook set in the environment: ignored by the install, seen by the test flavour.
passed() { # json-file assertion -> "True" or "False"
  python3 -c 'import json,sys; o=json.load(open(sys.argv[1])); print([a["passed"] for a in o["assertions"] if a["name"]==sys.argv[2]][0])' "$1" "$2"
}
delta=(--scenario delta --net shm --runs 1 --model tiny-moe --versions 3)
REFIT_TEST_CORRUPT_DELTA=1 "$prefix/bin/refit-bench" "${delta[@]}" >"$tmp/installed.json" ||
  fail "installed refit-bench --scenario delta under REFIT_TEST_CORRUPT_DELTA=1: exit $?"
[ "$(passed "$tmp/installed.json" bit_exact)" = True ] || fail "installed: not bit exact: $(cat "$tmp/installed.json")"
[ "$(passed "$tmp/installed.json" deltas_applied)" = True ] ||
  fail "installed: REFIT_TEST_CORRUPT_DELTA changed what the installed library does: $(cat "$tmp/installed.json")"
REFIT_TEST_CORRUPT_DELTA=1 "$treebench" "${delta[@]}" >"$tmp/tree.json" || fail "build tree refit-bench: exit $?"
[ "$(passed "$tmp/tree.json" bit_exact)" = True ] || fail "test flavour: not bit exact: $(cat "$tmp/tree.json")"
[ "$(passed "$tmp/tree.json" deltas_applied)" = False ] ||
  fail "the test flavour ignored REFIT_TEST_CORRUPT_DELTA (deltas applied): this check cannot fail"
echo "REFIT_TEST_CORRUPT_DELTA=1: installed refit-bench applies deltas, the test flavour's are refused"

# 4. Paced links: refused by the installed refit-bench, with the reason.
rc=0
"$prefix/bin/refit-bench" --scenario straggler --net shm --runs 1 --model tiny-moe >"$tmp/s.json" 2>"$tmp/s.err" || rc=$?
[ "$rc" = 2 ] && grep -q "need the test flavour" "$tmp/s.err" ||
  fail "installed refit-bench --scenario straggler (paced links): exit $rc, '$(cat "$tmp/s.err")'"

# 5. One place reads the environment.
calls=$(grep -rn '\bgetenv\s*(' "$src/src" --include='*.c' --include='*.cu' --include='*.h' |
        grep -v "^$src/src/util/env.c:\|^$src/src/engine/test_hooks.c:" || true)
[ -z "$calls" ] || fail "getenv outside src/util/env.c (docs/env.md): $calls"
echo "installed_no_hooks: OK"
