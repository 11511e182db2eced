"""The asynchronous RL example (examples/grpo_async/run_async.py, issue 32) end to end on Ray: megatron-core tp=2
trainer ranks publish version k+1 while a real vLLM (CPU) rollout keeps generating with version k and commits k+1
between two decode steps (the `refit` backend's two-phase update); asserted from the JSON it writes, not from its
exit code alone.  REFIT_RL_ASYNC_ARGS adds arguments; REFIT_RL_ASYNC_JSON copies the JSON somewhere.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def test_rl_async(tmp_path):
    out = tmp_path / "rl-async"
    extra = shlex.split(os.environ.get("REFIT_RL_ASYNC_ARGS", ""))
    cmd = [sys.executable, os.path.join(ROOT, "examples", "grpo_async", "run_async.py"), "--steps", "3",
           "--out", str(out)]
    r = subprocess.run(cmd + extra, timeout=1200)
    res = json.load(open(out / "rl-async.json"))
    if os.environ.get("REFIT_RL_ASYNC_JSON"):
        shutil.copy(out / "rl-async.json", os.environ["REFIT_RL_ASYNC_JSON"])
    steps = res["steps"]
    assert [s["version"] for s in steps] == [1, 2, 3, 4]
    assert res["init_report"]["stage"] == "host"
    kl_max = res["config"]["kl_max"]
    for s in steps:
        # the KL gate: completions generated entirely with that version, scored by the refitted rollout, a vLLM
        # started natively on the trainer's weights of that version, and the trainer-side model
        assert 0 <= s["kl"] <= kl_max and 0 <= s["kl_native"] <= kl_max, s
        assert abs(s["kl"] - s["kl_native"]) <= 1e-6 + 0.05 * s["kl_native"], s
        assert s["trainer_vs_vllm_max_abs"] > 0 and s["probe_tokens"] > 0, s  # two implementations: not trivially 0
    for s in steps[1:]:
        # asynchronous: the version was committed while groups were decoding, the pause is the commit alone, and
        # the engine produced tokens while the worker pulled and prepared the version
        assert s["in_flight_at_commit"] > 0 and s["spanning_samples"] > 0, s
        assert 0 < s["pause_ms"] < s["round_s"] * 1e3, s
        assert 0 < s["bytes_copied"] <= res["init_report"]["staging_bytes"], s
        assert s["trainer"] and all(t["publish_s"] >= 0 for t in s["trainer"])
        assert sum(s["staleness"].values()) == s["trained_on"]["samples"] > 0, s
        assert all(0 <= int(h) <= res["config"]["max_staleness"] for h in s["staleness"]), s
    # one-step off-policy: step 1 trains on version 1's samples (on-policy), later steps on samples begun one
    # version behind the trainer
    assert set(steps[1]["staleness"]) == {"0"}
    assert any(s["staleness"].get("1") for s in steps[2:])
    assert sum(s["decode_steps_beside_staging"] for s in steps[1:]) > 0
    # vLLM's per-completion version spans: contiguous, and each change of version exactly where it was committed
    vc = res["version_check"]
    assert vc["problems"] == [] and vc["spanning"] > 0 and vc["completions"] > 0
    assert [c["version"] for c in res["commits"]] == [1, 2, 3, 4]
    assert res["passed"] and res["gate_failures"] == []
    assert r.returncode == 0
    assert os.path.getsize(out / "rl-async.png") > 1000
