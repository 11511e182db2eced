#!/usr/bin/env bash
# Installs a build of refit into a temporary prefix and builds consumer.c
# against the installed tree only: with CMake (find_package(refit), shared and
# static) and with pkg-config; each program plans, moves and verifies a tiny
# model (consumer.c).  Also checks what was installed: headers (each compiles
# alone as C and C++), the SONAME, the symbols the library exports, the tool,
# the package files.
# Usage: test_install.sh BUILD_DIR ["extra C flags", e.g. -fsanitize=...]
set -euo pipefail
build=$(cd "$1" && pwd)
extra=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test_install: FAIL: $*" >&2; exit 1; }
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }

# What landed.
[ -f "$prefix/include/refit/refit.h" ] && [ -f "$prefix/include/refit/version.h" ] || fail "headers missing"
for h in "$here"/../../include/refit/*.h; do
  [ -f "$prefix/include/refit/$(basename "$h")" ] || fail "header $(basename "$h") not installed"
done
so=$(find "$prefix" -name 'librefit.so.0' | head -1)
[ -n "$so" ] && [ -L "$so" ] || fail "librefit.so.0 (a link to the versioned file) missing"
libdir=$(dirname "$so")
[ -L "$libdir/librefit.so" ] && [ -f "$libdir/librefit.a" ] || fail "librefit.so link or librefit.a missing"
soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "librefit.so.0" ] || fail "SONAME is '$soname'"
# Every exported function or variable carries the refit_ prefix (none of the
# internals); refit_now and refit_version are among them, under the stable
# version node (src/refit.map; docs/api.md).
vsyms=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TDBRVW]$/ {print $3}')
grep -qx 'refit_now@@REFIT_1' <<<"$vsyms" || fail "refit_now is not exported as refit_now@@REFIT_1"
grep -qx 'refit_version@@REFIT_1' <<<"$vsyms" || fail "refit_version is not exported as refit_version@@REFIT_1"
syms=$(sed 's/@.*//' <<<"$vsyms")
stray=$(echo "$syms" | grep -v '^refit_' | grep -v '^_init$\|^_fini$' || true)
[ -z "$stray" ] || fail "exported without the refit_ prefix: ${stray:0:400}"
version=$(sed -n 's/^#define REFIT_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$prefix/include/refit/version.h" | paste -sd.)
out=$("$prefix/bin/refit" version) || fail "installed refit version"
[[ $out == "refit $version "* ]] || fail "installed refit version says '$out', the headers $version"
[ -f "$libdir/cmake/refit/refitConfig.cmake" ] && [ -f "$libdir/pkgconfig/refit.pc" ] || fail "package files missing"
echo "installed: $(cd "$prefix" && find . -type f -o -type l | sort | tr '\n' ' ')"
# Each installed header compiles on its own, strictly, as C11 and as C++17.
for h in "$prefix"/include/refit/*.h; do
  printf '#include <refit/%s>\nint main(void) { return 0; }\n' "$(basename "$h")" |
    cc -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$prefix/include" -x c - || fail "$h alone (C)"
  if command -v c++ >/dev/null; then
    printf '#include <refit/%s>\nint main() { return 0; }\n' "$(basename "$h")" |
      c++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only -I"$prefix/include" -x c++ - || fail "$h alone (C++)"
  fi
done

# 1. CMake: find_package(refit) from the prefix only.
cmake -S "$here" -B "$tmp/cmake" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_FLAGS="$extra" \
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; fail "consumer configure"; }
found=$(sed -n 's/^refit_DIR:PATH=//p' "$tmp/cmake/CMakeCache.txt")
[ "$found" = "$libdir/cmake/refit" ] || fail "find_package found refit at '$found'"
ninja -C "$tmp/cmake" >"$tmp/ninja.log" 2>&1 || { cat "$tmp/ninja.log"; fail "consumer build (cmake)"; }
# (ldd's output is captured first: grep -q stops reading early, and under pipefail a SIGPIPE'd ldd fails.)
libs=$(ldd "$tmp/cmake/consumer")
grep -q "librefit.so.0 => $libdir/" <<<"$libs" || fail "consumer does not load the installed librefit.so.0: $libs"
"$tmp/cmake/consumer" || fail "consumer (cmake, shared)"
if [ -x "$tmp/cmake/consumer_static" ]; then
  libs=$(ldd "$tmp/cmake/consumer_static")
  ! grep -q librefit <<<"$libs" || fail "consumer_static loads librefit.so"
  "$tmp/cmake/consumer_static" >/dev/null || fail "consumer (cmake, static)"
  echo "cmake: shared and static consumers passed"
else
  echo "cmake: refit::refit_static not defined here (its dependencies are missing): shared only"
fi

# 2. pkg-config, from the prefix only.
export PKG_CONFIG_PATH=$libdir/pkgconfig PKG_CONFIG_LIBDIR=$libdir/pkgconfig:/usr/lib/x86_64-linux-gnu/pkgconfig:/usr/share/pkgconfig
[ "$(pkg-config --variable=libdir refit)" -ef "$libdir" ] || fail "refit.pc's libdir is $(pkg-config --variable=libdir refit)"
# shellcheck disable=SC2046,SC2086
cc -std=c11 -Wall -Wextra -Werror $extra "$here/consumer.c" -o "$tmp/consumer_pc" $(pkg-config --cflags --libs refit) \
   -Wl,-rpath,"$libdir" || fail "consumer build (pkg-config)"
libs=$(ldd "$tmp/consumer_pc")
grep -q "librefit.so.0 => $libdir/" <<<"$libs" || fail "consumer_pc does not load the installed librefit.so.0: $libs"
"$tmp/consumer_pc" || fail "consumer (pkg-config)"
echo "test_install: OK"
