#!/usr/bin/env bash
# The programs built on the public API only (refit, refit-bench) use librefit.so and
# nothing but what it exports: each one needs librefit.so.0, defines none of
# the library's own functions (no librefit.a inside), and every refit_*
# symbol it leaves undefined is in the library's dynamic symbol table.
# Usage: test_public_api.sh LIBREFIT_SO PROGRAM...
set -u
so="$1"
shift
fail=0
exported=$(nm -D --defined-only "$so" | awk '{print $3}' | sort -u)
[ "$(echo "$exported" | grep -c '^refit_')" -gt 50 ] || { echo "FAIL: $so exports too few refit_ symbols"; exit 1; }
for prog in "$@"; do
    name=$(basename "$prog")
    readelf -d "$prog" | grep -q 'NEEDED.*\[librefit\.so\.0\]' || { echo "FAIL: $name does not link librefit.so.0"; fail=1; }
    # the library's own entry points, if linked in statically, would be defined here
    own=$(nm --defined-only "$prog" | awk '{print $3}' | grep -xE 'refit_(plan_create|receiver_create|publisher_create|manifest_encode|model_open)' || true)
    [ -z "$own" ] || { echo "FAIL: $name contains the library's code: $own"; fail=1; }
    missing=$(nm -u "$prog" | awk '{print $2}' | grep '^refit_' | sort -u | comm -23 - <(echo "$exported"))
    if [ -n "$missing" ]; then
        echo "FAIL: $name uses refit symbols librefit.so does not export:"; echo "$missing"; fail=1
    fi
    n=$(nm -u "$prog" | awk '{print $2}' | grep -c '^refit_')
    [ "$n" -gt 0 ] || { echo "FAIL: $name uses no refit_ symbol from the library"; fail=1; }
    [ "$fail" -ne 0 ] || echo "ok: $name: $n refit_ symbols, all exported by $(basename "$so")"
done
exit $fail
