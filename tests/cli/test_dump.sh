#!/usr/bin/env bash
# --dump DIR into a directory another local user can write (issue 28):
# refused, naming the directory and what to do, and the files a planted
# symbolic link points at keep their bytes.  The links sit where refit used to
# write its predictable temporary (DIR/rank-R/model.safetensors.tmp.<pid>:
# bash -c ... exec keeps the pid) and where DIR/rank-R goes.  Another user is
# uid 65534 (nobody), by chown, when running as root (else those cases skip).
# Usage: test_dump.sh PATH_TO_REFIT
set -u
refit=$1
tmp=$(mktemp -d /tmp/refit-dump-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok: $1"; }
bad() { fail=$((fail + 1)); echo "FAIL: $1"; }
P=(plan --model tiny-moe --src megatron:ep=4 --dst vllm:tp=2 --rank 0 --execute)
precious=$'the victim\'s own bytes\n'
intact() { # intact NAME FILE: FILE still holds $precious
  if cmp -s "$2" "$tmp/ref"; then ok "$1: $2 keeps its bytes"; else bad "$1: $2 was overwritten ($(wc -c <"$2") bytes)"; fi
}
# attack NAME DIR NEEDLE: plants the link at the old temp name, runs plan --dump DIR, wants a refusal naming NEEDLE
attack() {
  local name=$1 dir=$2 needle=$3 out rc
  out=$(bash -c 'ln -s "$1" "$2/rank-0/model.safetensors.tmp.$$" 2>/dev/null; exec "${@:3}"' _ "$tmp/victim" "$dir" \
    "$refit" "${P[@]}" --dump "$dir" 2>&1); rc=$?
  if [ "$rc" -eq 0 ]; then bad "$name: plan --dump succeeded: $out"
  elif ! grep -qF -- "$needle" <<<"$out"; then bad "$name: output lacks '$needle': $out"
  else ok "$name: refused ($needle)"; fi
  intact "$name" "$tmp/victim"
  [ ! -e "$dir/rank-0/model.safetensors" ] && ok "$name: nothing dumped" || bad "$name: a dump was written"
}
printf %s "$precious" >"$tmp/victim"
printf %s "$precious" >"$tmp/ref"

# A directory group and others may write (0777, as a shared scratch directory).
mkdir -m 0777 "$tmp/open" "$tmp/open/rank-0"
chmod 0777 "$tmp/open" "$tmp/open/rank-0"
attack "group/other-writable" "$tmp/open" "is writable by group or others (mode 0777)"

# DIR/rank-0 a symbolic link to a directory of ours that holds a model.safetensors.
mkdir -m 0700 "$tmp/mine" "$tmp/elsewhere"
printf %s "$precious" >"$tmp/elsewhere/model.safetensors"
ln -s "$tmp/elsewhere" "$tmp/mine/rank-0"
out=$("$refit" "${P[@]}" --dump "$tmp/mine" 2>&1); rc=$?
[ "$rc" -ne 0 ] && grep -qF "rank-0 is a symbolic link" <<<"$out" && ok "rank dir symlink: refused" \
  || bad "rank dir symlink: exit $rc: $out"
intact "rank dir symlink" "$tmp/elsewhere/model.safetensors"

if [ "$(id -u)" -eq 0 ]; then
  # A directory of another user (they made it, and rank-0 in it).
  mkdir -m 0755 "$tmp/theirs" "$tmp/theirs/rank-0"
  chown 65534 "$tmp/theirs" "$tmp/theirs/rank-0"
  attack "another user's directory" "$tmp/theirs" "belongs to uid 65534"
  # Ours and sticky (as /tmp): others may create entries; rank-0 made by another user first.
  mkdir -m 1777 "$tmp/sticky"
  chmod 1777 "$tmp/sticky"
  mkdir -m 0777 "$tmp/sticky/rank-0"
  chown 65534 "$tmp/sticky/rank-0"
  attack "their rank dir in a sticky one of ours" "$tmp/sticky" "rank-0 belongs to uid 65534"
else
  echo "skip: another user's directories (needs root for chown)"
fi

# Directories of ours: written, and nothing but the dump is left behind.
mkdir -m 1777 "$tmp/sticky2"
chmod 1777 "$tmp/sticky2"
for d in "$tmp/fresh/dump" "$tmp/sticky2"; do
  [ "$d" = "$tmp/fresh/dump" ] && mkdir -m 0755 "$tmp/fresh"
  if out=$("$refit" "${P[@]}" --dump "$d" 2>&1) && [ -s "$d/rank-0/model.safetensors" ] &&
    [ "$(ls -A "$d/rank-0")" = "model.safetensors" ] &&
    python3 -c 'import struct,sys,json; b=open(sys.argv[1],"rb").read(); n=struct.unpack("<Q",b[:8])[0]; json.loads(b[8:8+n])' \
      "$d/rank-0/model.safetensors"; then
    ok "dump into $d: a safetensors file, no temporaries left"
  else bad "dump into $d: $out; $(ls -la "$d/rank-0" 2>&1)"; fi
done
[ "$(stat -c %a "$tmp/fresh/dump/rank-0")" = 755 ] && ok "rank dir made 0755" || bad "rank dir mode $(stat -c %a "$tmp/fresh/dump/rank-0")"

echo "dump: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
