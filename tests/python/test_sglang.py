"""refit inside the real SGLang 0.5.23 (sglang from PyPI, on this machine's CPU), through refit's SGLang receiver
(python/refit/sglang: SGLang's custom weight loader in every TP worker; docs/sglang.md).

ctest `sglang_engine` runs this with the python of scripts/sglang-venv.sh (REFIT_LIBRARY and REFIT_BIN name the
build's library and refit binary).  Each case runs tests/python/sglang_driver.py in its own process and checks
what it wrote: see the driver's docstring for the steps.  Checkpoints: tests/python/vllm_models.py (transformers,
random weights, v1 and v2 differ in every tensor), the same tiny Qwen3 (tied embeddings) and Qwen3-MoE as the
vLLM test.

A STAND-IN runs here: SGLang's kernel package sgl_kernel has no CPU build on PyPI, and SGLang 0.5.23 does not
import without it, so tests/python/sglang_stub/sgl_kernel (pure torch assign_req_to_token_pool_cpu; every other
name raises NotImplementedError when called) is first on PYTHONPATH.  Scheduler, model runner, model classes,
weight loaders and parameter layouts are SGLang's own; which kernel names SGLang imported and called is asserted
below and printed.

Timings go to $REFIT_SGLANG_BENCH_JSON (ctest: the build directory's sglang-update-cpu.json): refit's update against
SGLang's own update_weights_from_tensor for the same bytes, same run.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import vllm_models  # noqa: E402

import refit as refit_pkg  # noqa: E402  (the workers must run this same package: worktree_site/sitecustomize.py)

REFIT_BIN = os.environ.get("REFIT_BIN") or os.path.join(ROOT, "build", "refit")
BENCH_JSON = os.environ.get("REFIT_SGLANG_BENCH_JSON")
TPS = [int(t) for t in os.environ.get("REFIT_SGLANG_TP", "1").split(",")]

# (model, tp, source layout of the trainer stand-ins)
CASES = [(kind, tp, src) for tp in TPS
         for kind, src in ((vllm_models.DENSE, "megatron:tp=2"), (vllm_models.MOE, "megatron:tp=2,ep=2"))]
MEDIUM = "medium-qwen3-moe"
if os.environ.get("REFIT_SGLANG_MEDIUM") == "1":  # the measurement case (bench), not run by ctest
    CASES.append((MEDIUM, 1, "megatron:tp=2,ep=2"))
_bench = []
# tp > 1: a column-parallel tensor whose source covers only its first half of rows (TP rank 0's slice)
ONE_RANK = {vllm_models.DENSE: "layers.0.mlp.gate_proj.weight",
            vllm_models.MOE: "layers.0.mlp.experts.0.gate_proj.weight"}


@pytest.fixture(scope="session")
def ckpts(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ckpt"))
    paths = vllm_models.write_all(root)
    if any(c[0] == MEDIUM for c in CASES):
        for ver, seed in (("v1", 1), ("v2", 2)):  # 354 MB in bf16, as tests/python/test_vllm.py's
            paths[(MEDIUM, ver)] = vllm_models.write(
                vllm_models.MOE, os.path.join(root, ver, MEDIUM), seed, vocab_size=32000, hidden_size=1024,
                num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4, head_dim=64, num_experts=16,
                moe_intermediate_size=512)
        paths[(MEDIUM, "bad")] = None
    return paths


@pytest.fixture(scope="session", autouse=True)
def bench_json():
    yield
    if BENCH_JSON and _bench:
        os.makedirs(os.path.dirname(os.path.abspath(BENCH_JSON)), exist_ok=True)
        with open(BENCH_JSON, "w") as f:
            json.dump({"what": "refit's SGLang update (RefitSglang.update: begin_weight_update, the refit custom "
                               "loader in every TP worker, end_weight_update) against SGLang's own "
                               "update_weights_from_tensor for the same bytes (the v2 checkpoint's tensors already "
                               "in the driver's memory), between the same begin/end calls, same run; "
                               "tests/python/test_sglang.py",
                       "date": time.strftime("%Y-%m-%d"), "cases": _bench}, f, indent=1)


def _run(ckpts, kind, tp, src, tmp_path):
    cfg = {"v1": ckpts[(kind, "v1")], "v2": ckpts[(kind, "v2")], "bad": ckpts[(kind, "bad")], "tp": tp,
           "src_layout": src, "refit": REFIT_BIN, "work": str(tmp_path / "work"), "versions": 4,
           "negative": kind != MEDIUM, "one_rank_tensor": ONE_RANK[kind] if kind in ONE_RANK else None}
    if kind == MEDIUM:  # long requests, so that they are still decoding when the 354 MB version is staged
        cfg.update(context_length=256, max_total_tokens=2048, inflight_tokens=240)  # its max_position_embeddings
    cfg_path, out = tmp_path / "config.json", tmp_path / "out.json"
    cfg_path.write_text(json.dumps(cfg))
    log = tmp_path / "driver.log"
    t = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.run([sys.executable, os.path.join(HERE, "sglang_driver.py"), str(cfg_path), str(out)],
                           stdout=f, stderr=subprocess.STDOUT, timeout=900)
    secs = time.perf_counter() - t
    text = log.read_text(errors="replace")
    steps = [l for l in text.splitlines() if l.startswith("sglang_driver:")]
    print(f"{kind} tp={tp}: driver {secs:.0f} s\n" + "\n".join(steps))
    res = json.loads(out.read_text()) if out.exists() else {}
    if p.returncode != 0 or not res.get("ok"):
        tail = "\n".join(text.splitlines()[-80:])
        pytest.fail(f"sglang_driver.py failed (exit {p.returncode}); its log ends:\n{tail}")
    res["driver_s"] = secs
    return res


@pytest.mark.parametrize("case", CASES, ids=[f"{k}-tp{t}" for k, t, _ in CASES])
def test_refit_into_sglang(ckpts, case, tmp_path):
    kind, tp, src = case
    moe = kind != vllm_models.DENSE
    r = _run(ckpts, kind, tp, src, tmp_path)

    # v1 and v2 differ everywhere the test looks, so equality below means something.
    assert not r["v1_vs_reference"]["equal"]
    assert r["v1_generation"] != r["reference_generation"]
    assert all(len(g["tokens"]) == 8 and len(g["logprobs"]) == 8 for g in r["reference_generation"])

    # The refit: every parameter and buffer of every worker equals an SGLang started on v2, generation identical.
    cmp = r["refit_vs_reference"]
    assert cmp["equal"], "\n".join(cmp["mismatches"])
    assert cmp["tensors"] > 0
    assert r["refit_generation"] == r["reference_generation"]  # tokens and logprobs, exactly

    # What the workers derived from the live model: SGLang's layout is the vllm scheme's (fused expert names).
    first = r["updates"][0]["outcome"]
    assert first["ok"] and len(first["workers"]) == tp
    hf = json.load(open(os.path.join(ckpts[(kind, "v2")], "config.json")))
    for w in first["workers"]:
        init, rep = w["init"], w["report"]
        assert init["layout"] == f"vllm:tp={tp},pad=64" or init["layout"].startswith(f"vllm:tp={tp},")
        assert init["tp"] == tp and init["mode"] == "staged"
        assert init["package"] == os.path.dirname(os.path.abspath(refit_pkg.__file__)), init["package"]
        assert init["names"] == ("fused" if moe else None)
        assert set(init["kinds"]) == ({"linear", "embedding", "norm", "moe"} if moe else
                                      {"linear", "embedding", "norm"})
        assert rep["version"] == 1 and rep["planned"] and rep["transport"] == "shm"
        assert rep["apply_ms"] >= 0
    pad_rows = -(-hf["vocab_size"] // 64) * 64 - hf["vocab_size"]
    padding = pad_rows * hf["hidden_size"] * 2 * (1 if hf.get("tie_word_embeddings") else 2)
    held = sum(c["bytes"] for w in first["workers"] for c in w["init"]["kinds"].values())
    assert sum(w["report"]["bytes"] for w in first["workers"]) == held - padding
    if moe:  # every worker holds 1/tp of every expert (no expert parallel)
        n_exp = hf.get("num_experts", hf.get("num_local_experts"))
        experts = hf["num_hidden_layers"] * n_exp * 3 * hf["moe_intermediate_size"] * hf["hidden_size"] * 2
        assert all(w["init"]["kinds"]["moe"]["bytes"] == experts // tp for w in first["workers"])
    for u in r["updates"][1:]:  # later versions reuse the plan
        assert u["outcome"]["ok"]
        assert all(not w["report"]["planned"] and w["report"]["version"] == u["version"]
                   for w in u["outcome"]["workers"])

    if kind == MEDIUM:
        assert r["negative"] == []
    else:
        _check_negative(r, kind, tp)

    # SGLang's own update_weights_from_tensor for the same bytes: right too.
    own = r["sglang_update_from_tensor"]
    assert own["vs_reference"]["equal"], "\n".join(own["vs_reference"]["mismatches"])
    assert own["generation_same_as_reference"]

    # SGLang's update_weights_from_distributed (gloo, the driver broadcasting) ran: timed beside refit, not checked
    # for bytes (the engine holds v2 already at that step).
    assert "Succeeded" in r["sglang_update_from_distributed"]["answer"], r["sglang_update_from_distributed"]

    # refit after SGLang's own path: exact again.
    again = r["refit_again"]
    assert again["vs_reference"]["equal"], "\n".join(again["vs_reference"]["mismatches"])
    assert again["generation_same_as_reference"]

    # Direct mode (no staging arena): back to v1 through SGLang's own path, then refit writes the live parameters.
    d = r["direct"]
    assert d["back_to_v1"]["vs_v1"]["equal"], "\n".join(d["back_to_v1"]["vs_v1"]["mismatches"])
    assert d["vs_reference"]["equal"], "\n".join(d["vs_reference"]["mismatches"])
    assert d["generation_same_as_reference"]
    assert all(w["init"]["mode"] == "direct" and w["init"]["staging_bytes"] == 0 and w["report"]["version"] == 4
               for w in d["outcome"]["workers"])

    if kind != MEDIUM:
        _check_inflight(r, tp)

    # Which names of the stand-in sgl_kernel SGLang used: it imports several (copy_all_layer_kv_cache_cpu, ...), and
    # calls none but (at most) the pure-torch assign_req_to_token_pool_cpu: no kernel path of the stand-in's ran.
    k = r["kernels"]
    print("sgl_kernel stand-in: imported", k["imported"], "called", k["called"])
    assert "copy_all_layer_kv_cache_cpu" in k["imported"], k
    assert set(k["called"]) <= {"assign_req_to_token_pool_cpu"}, k
    _bench.append(_bench_case(kind, tp, src, r))
    shutil.rmtree(tmp_path / "work", ignore_errors=True)


def _spans_switch(spans, old, new, lo, n):
    """The request's weight-version spans: `old` for its first k tokens, `new` for the rest, lo <= k < n."""
    assert [s["version"] for s in spans] == [old, new], spans
    k = spans[0]["end"]
    assert spans[0]["start"] == 0 and spans[1]["start"] == k and spans[1]["end"] == n, spans
    assert lo <= k < n, (spans, lo)
    return k


def _check_inflight(r, tp):
    f = r["inflight"]
    n = f["tokens_per_request"]
    # a. single phase under the in_place pause: the requests in flight completed, every token of them; the state is
    # the native v1 start's byte for byte; each request's tokens switch from the previous label to "1" at the token
    # it had reached (the driver's earlier view of it is a lower bound)
    a = f["single"]
    assert all(a["done"]) and a["final_tokens"] == [n] * len(a["done"]), a
    assert f["single_vs_v1"]["equal"], "\n".join(f["single_vs_v1"]["mismatches"])
    old = a["weight_versions"][0][0]["version"]
    for spans, lo in zip(a["weight_versions"], a["tokens_before"]):
        _spans_switch(spans, old, "1", max(lo, 1), n)
    assert a["driver"]["pause"] == "in_place" and a["driver"]["label_answer"][0], a["driver"]
    # b. two phase: stage returned while every worker's staging thread waited for version 2 (not yet published),
    # decoding went on (>= 4 tokens) before the publish, the commit made the state the native v2 start's byte for
    # byte, the requests completed, spans switch "1" -> "2" at or after the token reached when staged
    b = f["two"]
    assert all(b["done"]) and b["final_tokens"] == [n] * len(b["done"]), b
    assert [w["state"] for w in b["waiting"]] == ["staging"] * tp and all(w["version"] == 2 for w in b["waiting"])
    assert [w["state"] for w in b["staged"]] == ["staged"] * tp and all(w["version"] == 2 for w in b["staged"])
    t = b["tokens"]
    assert sum(t["at_staged"]) >= sum(t["at_stage_return"]) + 4, t
    assert f["two_vs_reference"]["equal"], "\n".join(f["two_vs_reference"]["mismatches"])
    assert f["two_generation_same_as_reference"]
    for spans, lo in zip(b["weight_versions"], t["at_staged"]):
        _spans_switch(spans, "1", "2", lo, n)
    assert len(b["commit_workers"]) == tp and all(w["report"]["version"] == 2 and w["report"]["apply_ms"] >= 0
                                                  for w in b["commit_workers"]), b["commit_workers"]
    # c. refusals, the state still the reference's
    ref = {x["case"]: x for x in f["refusals"]}
    assert "nothing is staged" in ref["commit-nothing-staged"]["error"], ref
    assert "REFIT_ERR_TIMEOUT" in ref["stage-timeout-is-staged"]["error"] and \
        "staging version 99 failed" in ref["stage-timeout-is-staged"]["error"], ref
    assert "staging version 99 failed" in ref["stage-timeout-commit"]["error"], ref
    assert "every worker keeps the weights it served before" in ref["stage-timeout-commit"]["error"], ref
    if tp > 1:
        e = ref["one-rank-commit"]["error"]
        assert "REFIT_ERR_UNCOVERED" in e and "worker rank 1" in e and "worker rank 0" not in e, e
        assert "worker rank 1" in ref["one-rank-is-staged"]["error"], ref
    assert f["after_refusals_vs_reference"]["equal"], "\n".join(f["after_refusals_vs_reference"]["mismatches"])
    # SGLang 0.5.23 finding (prefix cache): with no flush, a new request sharing a prefix is served KV the previous
    # weights computed: PROBE after the in_place commit differs from the native v2 start's, its prompt taken from the
    # cache; flushed once idle, it is the native start's exactly
    probe = lambda p: (p["tokens"], p["logprobs"])  # noqa: E731
    assert probe(f["probe_at_v1"]) == probe(r["v1_probe"])
    assert f["probe_stale"]["cached_tokens"] > 0 and probe(f["probe_stale"]) != probe(r["reference_probe"]), f
    assert f["flush_when_idle"] and f["probe_flushed"]["cached_tokens"] == 0
    assert probe(f["probe_flushed"]) == probe(r["reference_probe"])
    # d. retract: the requests completed, every token, the state the native v1 start's, PROBE too (flushed)
    d = f["retract"]
    assert all(d["done"]) and d["final_tokens"] == [n] * len(d["done"]), d
    assert f["retract_vs_v1"]["equal"], "\n".join(f["retract_vs_v1"]["mismatches"])
    assert probe(f["probe_after_retract"]) == probe(r["v1_probe"])
    for spans, lo in zip(d["weight_versions"], d["tokens_before"]):
        _spans_switch(spans, "2", "3", max(lo, 1), n)


def _check_negative(r, kind, tp):
    neg = {n["job"]: n for n in r["negative"]}
    assert set(neg) == {"bad-shape", "bad-name"} | ({"one-rank"} if tp > 1 else set())
    if tp > 1:
        # The TP agreement: rank 0 pulled version 1 (its slice is covered), rank 1 could not; neither applied it.
        one = neg["one-rank"]
        ws = {w["rank"]: w for w in one["outcome"]["workers"]}
        assert sorted(ws) == list(range(tp))
        assert ws[0]["error"] is None and ws[0]["report"]["version"] == 1, ws[0]
        assert all(ws[k]["error"] is not None and ws[k]["report"] is None for k in range(1, tp)), ws
        assert [e["rank"] for e in one["outcome"]["errors"]] == list(range(1, tp))
        msg = one["error"]["message"]
        assert "REFIT_ERR_UNCOVERED" in msg and r["one_rank_tensor"] in msg and "worker rank 1" in msg, msg
        assert "worker rank 0" not in msg, msg
    bs, bn = neg["bad-shape"]["error"], neg["bad-name"]["error"]
    assert bs is not None and bn is not None
    assert bs["type"] == "RefitSglangDataError" and "DataError" in bs["families"]
    assert "REFIT_ERR_MISMATCH" in bs["message"]
    wrong = {vllm_models.MOE: "experts.0.gate_proj.weight is bf16[32, 128]",
             vllm_models.DENSE: "mlp.gate_proj.weight is bf16[128, 128]"}[kind]
    assert wrong in bs["message"], bs["message"]
    assert "REFIT_ERR_UNCOVERED" in bn["message"]
    assert r["wrong_name_tensor"] in bn["message"] and "held by no source" in bn["message"], bn["message"]
    for n in neg.values():
        assert "nothing was written" in n["error"]["message"]
        assert n["state_vs_v1"]["equal"], "\n".join(n["state_vs_v1"]["mismatches"])
        assert n["generation_same_as_v1"]


def _bench_case(kind, tp, src, r):
    steady = [u["outcome"] for u in r["updates"][1:]]
    own = r["sglang_update_from_tensor"]
    med = statistics.median(o["driver"]["total_ms"] for o in steady)
    return {"model": kind, "tp": tp, "trainer_layout": src, "env": r["env"], "driver_s": round(r["driver_s"], 1),
            "bytes_pulled": [w["report"]["bytes"] for w in r["updates"][0]["outcome"]["workers"]],
            "checkpoint_bytes_given_to_update_weights_from_tensor": own["checkpoint_bytes"],
            "refit_first": _phases(r["updates"][0]["outcome"]),
            "refit_steady": [_phases(o) for o in steady],
            "refit_steady_median_total_ms": round(med, 3),
            "sglang_update_weights_from_tensor": {k: round(own[k], 3) for k in ("begin_ms", "update_ms", "end_ms",
                                                                                 "total_ms")},
            "refit_vs_update_weights_from_tensor": round(med / own["total_ms"], 3),
            "sglang_update_weights_from_distributed": {k: round(r["sglang_update_from_distributed"][k], 3)
                                                       for k in ("begin_ms", "update_ms", "end_ms", "total_ms")},
            "refit_direct_first": _phases(r["direct"]["outcome"]),
            "inflight": _inflight_figures(r.get("inflight"))}


def _inflight_figures(f):
    """Step 9's pauses (the driver's whole call: pause, SGLang's calls, continue) and what the workers did."""
    if not f:
        return None
    rnd = lambda d: {k: round(v, 3) for k, v in d.items() if isinstance(v, float)}  # noqa: E731
    return {"pauses_ms": rnd(f["pauses_ms"]),
            "single_in_place": rnd(f["single"]["driver"]),
            "single_in_place_workers": [rnd(w) for w in f["single"]["reports"]],
            "stage": rnd(f["two"]["stage_driver"]),
            "staging_pull_ms": [round(s["report"]["pull_ms"], 3) for s in f["two"]["staged"]],
            "commit": rnd(f["two"]["commit_driver"]),
            "commit_apply_ms": [round(w["report"]["apply_ms"], 3) for w in f["two"]["commit_workers"]],
            "tokens": f["two"]["tokens"], "retract": rnd(f["retract"]["driver"])}


def _phases(o):
    w0 = o["workers"][0]["report"]
    return {"total_ms": round(o["driver"]["total_ms"], 3), "update_call_ms": round(o["driver"]["update_ms"], 3),
            "rank0": {k: round(w0[k], 3) for k in ("pull_ms", "plan_ms", "transfer_ms", "verify_ms", "apply_ms")}}


STARTUP_TP2 = r'''
import sys
sys.path.insert(0, sys.argv[2])
import sglang_driver
sglang_driver._set_env(sys.argv[3], 2)
eng, secs = sglang_driver.start(sys.argv[1], {"tp": 2})
print("REFIT-TP2-STARTED", secs, flush=True)
sglang_driver.stop(eng)
'''


@pytest.mark.skipif(2 not in TPS, reason="runs beside the tp=2 cases (REFIT_SGLANG_TP=2: ctest sglang_engine_tp2)")
def test_sglang_cpu_tp2_needs_nccl_off(ckpts, tmp_path):
    """SGLang 0.5.23 finding: with tp_size=2 on its CPU platform the engine starts only when SGLang's pynccl turns
    itself off.  init_model_parallel_group (distributed/parallel_state.py) asks for pynccl on every platform but
    NPU, XPU and mooncake, and PyNcclCommunicator(device=cpu) raises "Expected a cuda device, but got: cpu" in
    every scheduler once torch's CUDA wheel's libnccl has loaded (it loads on a machine without a GPU);
    PyNcclCommunicator disables itself when that library does not load (pynccl.py ~73-81), whose path is
    SGLANG_NCCL_SO_PATH (pynccl_wrapper.py ~39-65).  Without the variable: the failure, asserted here (about 45 s),
    so that this test says so the day SGLang stops needing it.  With it (a path that does not exist,
    sglang_driver.NO_NCCL): the tp=2 cases of test_refit_into_sglang start and pass in the same run."""
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, REFIT_SGLANG_KEEP_NCCL="1")  # sglang_driver._set_env then leaves SGLANG_NCCL_SO_PATH
    env.pop("SGLANG_NCCL_SO_PATH", None)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", STARTUP_TP2, ckpts[(vllm_models.DENSE, "v1")], HERE, str(work)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400, env=env)
    secs = time.perf_counter() - t
    print(f"tp=2 with torch's libnccl: exit {p.returncode} after {secs:.0f} s")
    assert "REFIT-TP2-STARTED" not in p.stdout, "SGLang now starts with tp=2 on the CPU without SGLANG_NCCL_SO_PATH"
    assert p.returncode != 0
    assert "PyNcclCommunicator" in p.stdout and "Expected a cuda device, but got: cpu" in p.stdout, p.stdout[-3000:]


def test_receiver_refusals_and_loader_never_raises(tmp_path):
    """No engine: the receiver's classification refuses what it has not checked, by name, and the custom loader
    (which SGLang runs inside its scheduler, where an exception kills the engine) reports a broken request in its
    outcome file instead of raising."""
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # SGLang's CPU paths, with the stand-in sgl_kernel
    sys.path.insert(0, os.path.join(HERE, "sglang_stub"))
    import torch
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    from refit.sglang import RefitSglangError
    from refit.sglang.bind import classify
    from refit.sglang.worker import encode_request, load

    norm = RMSNorm(8)
    assert classify("model.norm.weight", norm) == "norm"
    lin = torch.nn.Module()
    lin.quant_method = UnquantizedLinearMethod()
    assert classify("model.layers.0.mlp.down_proj.weight", lin) == "linear"
    lin.use_intel_amx_backend = True  # what SGLang sets when it packs a layer for AMX after loading
    with pytest.raises(RefitSglangError, match="down_proj.weight: SGLang packs this layer for AMX"):
        classify("model.layers.0.mlp.down_proj.weight", lin)
    with pytest.raises(ValueError, match="layer class torch.nn.modules.linear.Linear is not one refit has checked"):
        classify("x.weight", torch.nn.Linear(2, 2))
    odd = torch.nn.Module()
    odd.quant_method = object()
    with pytest.raises(RefitSglangError, match="quantization method object of Module is not supported"):
        classify("y.weight", odd)

    result = tmp_path / "outcome.json"
    req = encode_request({"op": "update", "registry": "file:" + str(tmp_path / "none"), "job": "j",
                          "result": str(result)})
    assert load(torch.nn.Linear(2, 2), req) is None  # outside an engine: no TP group; reported, not raised
    doc = json.loads(result.read_text())
    assert doc["ok"] is False and doc["errors"] and doc["errors"][0]["rank"] == 0
    load(torch.nn.Linear(2, 2), [("something-else", torch.zeros(1))])  # no request at all: returns too
