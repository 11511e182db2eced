#!/usr/bin/env bash
# refit plan with dtensor sources (issue #33): the seed's model, Qwen3-30B-A3B,
# from a 64-way FSDP2 source (dtensor:dp_shard=64) into vLLM TP2 plans with 0
# redundant bytes, reads what it writes, and writes the same bytes as the same
# destination planned from a megatron source; the plan time of one rank is
# printed.  Tiny models execute and verify every byte (FSDP, HSDP, TP x FSDP
# with experts and with tied embeddings, expert-parallel meshes); refusals are
# named.
# Usage: test_dtensor.sh PATH_TO_REFIT
set -u
refit=$1
tmp=$(mktemp -d /tmp/refit-dtensor-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok: $1"; }
bad() { fail=$((fail + 1)); echo "FAIL: $1"; }
expect() { # expect NAME WANT_RC NEEDLE -- command...
  local name=$1 want=$2 needle=$3; shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -ne "$want" ]; then bad "$name: exit $rc, want $want: $out"; return; fi
  if [ -n "$needle" ] && ! grep -qF -- "$needle" <<<"$out"; then bad "$name: output lacks '$needle': $out"; return; fi
  ok "$name"
}

"$refit" plan --model qwen3-30b-a3b --src dtensor:dp_shard=64 --dst vllm:tp=2 --all-ranks --json >"$tmp/fsdp.json" \
  || bad "dtensor plan failed"
"$refit" plan --model qwen3-30b-a3b --src megatron:ep=8 --dst vllm:tp=2 --all-ranks --json >"$tmp/meg.json" \
  || bad "megatron plan failed"
if python3 - "$tmp/fsdp.json" "$tmp/meg.json" <<'PY'
import json, sys
f, m = (json.load(open(p)) for p in sys.argv[1:3])
assert f["src_ranks"] == 64 and f["dst_ranks"] == 2 and len(f["ranks"]) == 2, f
for a, b in zip(f["ranks"], m["ranks"]):
    assert a["bytes_redundant"] == 0, a
    assert a["bytes_read"] == a["bytes_written"] == b["bytes_written"] > 0, (a, b)
    assert a["sources"] == 64, a
# Both ranks together hold every byte once plus the replicated norms and routers twice.
assert sum(r["bytes_written"] for r in f["ranks"]) >= f["model_bytes"], f
print("qwen3-30b-a3b dtensor:dp_shard=64 -> vllm:tp=2: %s; source manifests %.1f ms" %
      (", ".join("rank %d %d bytes, %d regions, plan %.1f ms" % (r["rank"], r["bytes_written"], r["regions"],
                                                                 r["plan_ms"]) for r in f["ranks"]),
       f["src_manifest_ms"]))
PY
then ok "qwen3-30b-a3b 64-way FSDP into vllm tp=2"; else bad "qwen3-30b-a3b 64-way FSDP into vllm tp=2"; fi

# The seed's model from TP x FSDP (transformers' plan: experts packed_colwise) and expert-parallel sources.
for src in dtensor:dp_shard=32,tp=2 dtensor:dp_shard=8,tp=8,ep=8; do
  if "$refit" plan --model qwen3-30b-a3b --src "$src" --dst vllm:tp=2 --all-ranks --json >"$tmp/tp.json" &&
     python3 - "$tmp/tp.json" "$tmp/fsdp.json" "$src" <<'PY'
import json, sys
t, f = (json.load(open(p)) for p in sys.argv[1:3])
assert t["src_ranks"] == 64 and len(t["ranks"]) == 2, t
for a, b in zip(t["ranks"], f["ranks"]):
    assert a["bytes_redundant"] == 0 and a["bytes_read"] == a["bytes_written"] == b["bytes_written"], (a, b)
print("qwen3-30b-a3b %s -> vllm:tp=2: %s" % (sys.argv[3], ", ".join(
    "rank %d %d regions from %d sources, plan %.1f ms" % (r["rank"], r["regions"], r["sources"], r["plan_ms"])
    for r in t["ranks"])))
PY
  then ok "qwen3-30b-a3b $src into vllm tp=2"; else bad "qwen3-30b-a3b $src into vllm tp=2"; fi
done

expect "fsdp execute" 0 "every destination byte verified" -- \
  "$refit" plan --model tiny-moe --src dtensor:dp_shard=6 --dst vllm:tp=2,ep=2 --all-ranks --execute
expect "hsdp execute" 0 "every destination byte verified" -- \
  "$refit" plan --model tiny-moe --src dtensor:dp_shard=3,dp_replicate=2 --dst megatron:tp=2 --all-ranks --execute
expect "tp x fsdp execute" 0 "every destination byte verified" -- \
  "$refit" plan --model tiny-dense --src dtensor:dp_shard=2,tp=2 --dst hf --all-ranks --execute
expect "experts under tp x fsdp execute" 0 "every destination byte verified" -- \
  "$refit" plan --model tiny-moe --src dtensor:dp_shard=2,tp=2 --dst vllm:tp=2 --all-ranks --execute
expect "expert-parallel mesh execute" 0 "every destination byte verified" -- \
  "$refit" plan --model tiny-moe --src dtensor:dp_shard=2,tp=2,ep=2 --dst megatron:tp=2,ep=2 --all-ranks --execute
expect "tied embeddings under tp execute" 0 "every destination byte verified" -- \
  "$refit" plan --model tiny-tied --src dtensor:dp_shard=2,tp=2 --dst vllm:tp=2 --all-ranks --execute
expect "split experts under tp refused" 1 "experts=split) under tp > 1 are not described" -- \
  "$refit" plan --model tiny-moe --src dtensor:dp_shard=2,tp=2,experts=split --dst vllm:tp=2
expect "ep mesh on a dense model refused" 1 "ep=2, but tiny-dense has no experts" -- \
  "$refit" plan --model tiny-dense --src dtensor:dp_shard=2,ep=2 --dst vllm:tp=2
expect "cp mesh refused" 1 "dtensor has no cp mesh dimension" -- \
  "$refit" plan --model tiny-moe --src dtensor:cp=2 --dst vllm:tp=2
expect "unknown knob" 1 "unknown knob 'fsdp'" -- \
  "$refit" plan --model tiny-moe --src dtensor:fsdp=2 --dst vllm:tp=2

echo "dtensor cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
