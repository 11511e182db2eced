# shellcheck shell=bash disable=SC2154,SC2034  # name, venv, recipe, marker: set by the builder; reqs_a, py, pip: used by it
# Sourced by the venv builders (scripts/vllm-venv.sh, sglang-venv.sh, bridge-venv.sh): the steps they all take.
# Before sourcing, the builder sets `name` (its log prefix), `venv` (an absolute path), `recipe` (what a complete
# venv was built from) and `marker` (the file holding the recipe once every step worked).  Progress goes to
# stderr; a builder's only stdout line is the venv's python.
log() { echo "$name: $*" >&2; }
die() { log "FAILED: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

venv_complete_already() { [ -f "$marker" ] && [ "$(cat "$marker")" = "$recipe" ] && [ -x "$venv/bin/python" ]; }

# Prints the venv's python and exits when a run with this recipe completed it; otherwise takes the venv's lock
# (held until the builder exits) and looks again: another run may have finished it meanwhile.
venv_reuse_or_lock() {
  if venv_complete_already; then
    log "reusing $venv (complete)"
    echo "$venv/bin/python"
    exit 0
  fi
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
  if venv_complete_already; then
    log "reusing $venv (completed by another run)"
    echo "$venv/bin/python"
    exit 0
  fi
}

# Debian's python3-venv (ensurepip) from apt when missing, as scripts/deps.sh installs packages; then the venv,
# made again in place (an incomplete one is completed, never deleted), its marker removed first.  Sets t_all
# (the build's start), py and pip.
venv_create() {
  t_all=$(now)
  log "building $venv"
  local t
  if ! dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "install ok installed"; then
    t=$(now)
    log "installing python3-venv from apt"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null; } >&2 ||
      die "apt-get install python3-venv"
    log "python3-venv installed in $(since "$t")"
  fi
  t=$(now)
  rm -f "$marker"
  python3 -m venv "$venv" >&2 || die "python3 -m venv $venv"
  log "venv created in $(since "$t")"
  py="$venv/bin/python"
  pip=("$py" -m pip install --no-input --progress-bar off --disable-pip-version-check --retries 2 --timeout 60 -q)
}

# pip install "$@" into the venv, timed.
step() {
  local t
  t=$(now)
  log "pip install $*"
  "${pip[@]}" "$@" >&2 || die "pip install $* (is PyPI reachable?)"
  log "  done in $(since "$t")"
}

# Fills reqs_a with the requirements of the installed distribution $1 from its metadata, markers evaluated for
# this interpreter and machine, without the names in $2 (space-separated, normalized).
venv_requirements() {
  local reqs
  reqs=$("$py" - "$1" "$2" <<'PYEOF'
import importlib.metadata as md, re, sys
from packaging.requirements import Requirement
skip = set(sys.argv[2].split())
out = []
for s in md.requires(sys.argv[1]) or []:
    r = Requirement(s)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    if re.sub(r"[-_.]+", "-", r.name).lower() in skip:
        continue
    out.append(str(r).split(";")[0].strip())
print("\n".join(out))
PYEOF
  ) || die "reading $1's requirements (packaging missing?)"
  [ -n "$reqs" ] || die "$1 lists no requirements"
  mapfile -t reqs_a <<<"$reqs"
}

# Writes the marker (every step worked) and prints the venv's python.
venv_done() {
  echo "$recipe" >"$marker"
  log "complete in $(since "$t_all"); $(du -sh "$venv" 2>/dev/null | cut -f1) at $venv"
  echo "$venv/bin/python"
}
