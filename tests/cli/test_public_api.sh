#!/usr/bin/env bash
# The programs built on the public API only (refit, refit-bench) use librefit.so and
# nothing but what it exports: each one needs librefit.so.0, defines none of
# the library's own functions (no librefit.a inside), and every refit_*
# symbol it leaves undefined is in the library's dynamic symbol table.
# Their own sources see only the public headers: no object of refit,
# refit-bench or their helper libraries refit_tool_common / refit_tool_local
# is compiled with an include path into src/ (the build's compile commands),
# and no #include in tools/, tools/common/ or bench/refit_bench/ names an
# internal header (only include/refit/* and files of tools/common/, their own
# folder or tools/sim/sim.h).  The two parts compiled against src/ on
# purpose, refit_tool_pure (tools/common/tool_pure.c) and refit_sim
# (tools/sim/), are named in cmake/tools.cmake.  refit-bench is linked twice
# (the build tree's against the test flavour librefit-test.so.0, the installed
# one against librefit.so.0): both flavours export the same symbols.
# Usage: test_public_api.sh LIBREFIT_SO LIBREFIT_TEST_SO SOURCE_DIR COMPILE_COMMANDS_JSON PROGRAM...
set -u
so="$1"
testso="$2"
root="$3"
commands="$4"
shift 4
fail=0

# Include paths into src/ in the compile commands of the programs' own objects.
python3 - "$root" "$commands" <<'PY' || fail=1
import json, os, re, sys
root, commands = sys.argv[1], sys.argv[2]
src = os.path.realpath(os.path.join(root, "src"))
targets = ["refit", "refit-bench", "refit_bench_obj", "refit_bench_shipped", "refit_tool_common", "refit_tool_local"]
seen = {t: 0 for t in targets}
bad = 0
for e in json.load(open(commands)):
    m = re.search(r"CMakeFiles/([^/ ]+)\.dir/", e.get("output", "") + " " + e["command"])
    if not m or m.group(1) not in seen:
        continue
    seen[m.group(1)] += 1
    for d in re.findall(r"(?:-I|-isystem |-iquote |-idirafter )\s*(\S+)", e["command"]):
        d = os.path.realpath(os.path.join(e["directory"], d))
        if d == src or d.startswith(src + os.sep):
            print(f"FAIL: {e['file']} is compiled with the internal include path {d}")
            bad = 1
for t, n in seen.items():
    if n == 0:
        print(f"FAIL: no compile command of target {t} in {commands}")
        bad = 1
if not bad:
    print("ok: " + ", ".join(f"{t} ({n} objects)" for t, n in seen.items()) + ": no include path into src/")
sys.exit(bad)
PY

# #include "..." lines of the programs' sources: public headers or their own files only.
nsrc=0
for f in "$root"/tools/*.[ch] "$root"/tools/common/*.[ch] "$root"/bench/refit_bench/*.[ch]; do
    [ "$f" = "$root/tools/common/tool_pure.c" ] && continue # checks tool_pure.h against src/ (refit_tool_pure)
    nsrc=$((nsrc + 1))
    dir=$(dirname "$f")
    while IFS= read -r inc; do
        case "$inc" in
        refit/*) [ -f "$root/include/$inc" ] && continue ;;
        */*) ;;
        *) { [ -f "$dir/$inc" ] || [ -f "$root/tools/common/$inc" ] || [ "$inc" = sim.h ]; } && continue ;;
        esac
        echo "FAIL: ${f#"$root"/} includes \"$inc\" (not a public header nor one of the programs' own)"
        fail=1
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done
[ "$nsrc" -gt 20 ] || { echo "FAIL: only $nsrc source files found under $root/tools and bench/refit_bench"; fail=1; }
[ "$fail" -ne 0 ] || echo "ok: $nsrc source files include only public headers and their own"

exported=$(nm -D --defined-only "$so" | awk '{print $3}' | sed 's/@.*//' | sort -u) # names without their version node (refit_x@@REFIT_1)
[ "$(echo "$exported" | grep -c '^refit_')" -gt 50 ] || { echo "FAIL: $so exports too few refit_ symbols"; exit 1; }
texported=$(nm -D --defined-only "$testso" | awk '{print $3}' | sed 's/@.*//' | sort -u)
if [ "$exported" != "$texported" ]; then
    echo "FAIL: the two flavours export different symbols (< $(basename "$so"), > $(basename "$testso")):"
    diff <(echo "$exported") <(echo "$texported") | head -20; fail=1
fi
for prog in "$@"; do
    name=$(basename "$prog")
    readelf -d "$prog" | grep -qE 'NEEDED.*\[librefit(-test)?\.so\.0\]' ||
        { echo "FAIL: $name does not link librefit.so.0 (or librefit-test.so.0)"; fail=1; }
    # the library's own entry points, if linked in statically, would be defined here
    own=$(nm --defined-only "$prog" | awk '{print $3}' | grep -xE 'refit_(plan_create|receiver_create|publisher_create|manifest_encode|model_open)' || true)
    [ -z "$own" ] || { echo "FAIL: $name contains the library's code: $own"; fail=1; }
    missing=$(nm -u "$prog" | awk '{print $2}' | sed 's/@.*//' | grep '^refit_' | sort -u | comm -23 - <(echo "$exported"))
    if [ -n "$missing" ]; then
        echo "FAIL: $name uses refit symbols librefit.so does not export:"; echo "$missing"; fail=1
    fi
    n=$(nm -u "$prog" | awk '{print $2}' | grep -c '^refit_')
    [ "$n" -gt 0 ] || { echo "FAIL: $name uses no refit_ symbol from the library"; fail=1; }
    [ "$fail" -ne 0 ] || echo "ok: $name: $n refit_ symbols, all exported by $(basename "$so")"
done
exit $fail
