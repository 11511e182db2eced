#!/usr/bin/env bash
# Formats refit's C and CUDA sources with clang-format 14 and the repository's .clang-format.
#
#   scripts/format.sh                 reformats every tracked *.c, *.h, *.cu, *.cuh in place
#   scripts/format.sh --check         changes nothing; lists each file that differs with the number of
#                                     lines that would change, then the total per folder; exits 1 if any
#   scripts/format.sh [--check] PATH  only the files under PATH (files or folders; several allowed)
#
# Exits 77 (ctest's "skipped") when clang-format 14 is missing: scripts/deps.sh installs it.
# $CLANG_FORMAT names another binary (it must be version 14: other versions format differently).
set -euo pipefail
cd "$(dirname "$0")/.."

check=0
paths=()
for a in "$@"; do
  case "$a" in
    --check) check=1 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "format: unknown option $a" >&2; exit 2 ;;
    *) paths+=("$a") ;;
  esac
done

cf="${CLANG_FORMAT:-}"
if [ -z "$cf" ]; then
  for c in clang-format-14 clang-format; do
    if command -v "$c" >/dev/null 2>&1 && "$c" --version | grep -q "version 14\."; then cf="$c"; break; fi
  done
fi
if [ -z "$cf" ] || ! command -v "$cf" >/dev/null 2>&1; then
  echo "format: clang-format 14 not found (scripts/deps.sh installs clang-format-14): skipped"
  exit 77
fi

# Tracked sources (and untracked ones git does not ignore); outside a checkout, every source below.
list_files() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files --cached --others --exclude-standard -- "$@" | grep -E '\.(c|h|cu|cuh)$' || true
  else
    find "${@:-.}" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
      -not -path '*/build*' | sed 's|^\./||'
  fi
}
mapfile -t files < <(list_files "${paths[@]}" | sort -u)

if [ "$check" -eq 0 ]; then
  for f in "${files[@]}"; do [ -f "$f" ] && "$cf" --style=file -i "$f"; done
  exit 0
fi

differ=0
declare -A per_dir
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  n=$("$cf" --style=file "$f" | diff "$f" - | grep -c '^[<>]' || true)
  if [ "$n" -gt 0 ]; then
    echo "$f: $n lines differ"
    differ=$((differ + 1))
    d=$(dirname "$f")
    per_dir[$d]=$(( ${per_dir[$d]:-0} + n ))
  fi
done
if [ "$differ" -gt 0 ]; then
  echo "format: $differ of ${#files[@]} files differ from .clang-format (scripts/format.sh reformats them); lines per folder:"
  for d in "${!per_dir[@]}"; do printf '  %6d  %s\n' "${per_dir[$d]}" "$d"; done | sort -k2
  exit 1
fi
echo "format: ${#files[@]} files follow .clang-format"
