"""The RL loop example (examples/grpo_ray/run.py) end to end, on Ray, with real megatron-core trainer ranks and a
real vLLM (CPU) rollout: 3 steps, its KL gate, the swap-only comparison and the three bad inputs, asserted from
the JSON it writes (not from its exit code alone).

REFIT_RL_ARGS adds arguments (e.g. "--trainer fsdp --registry redis"); REFIT_RL_JSON copies the JSON somewhere.
With --rollout sglang the rollout (and the native and swap-only engines) is the real SGLang 0.5.23, refitted through
refit.sglang, in child processes under the SGLang venv's python (examples/grpo_ray/sglang_rollout.py).
With --trainer fsdp the trainer ranks are torch's real fully_shard over gloo (examples/grpo_ray/fsdp_trainer.py):
each publishes its own FSDP2 shards (the dtensor layout, no gather, no copy) after a real forward/backward/AdamW
step, which is asserted too.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def test_rl_loop(tmp_path):
    out = tmp_path / "rl"
    extra = shlex.split(os.environ.get("REFIT_RL_ARGS", ""))
    cmd = [sys.executable, os.path.join(ROOT, "examples", "grpo_ray", "run.py"), "--steps", "3", "--out", str(out)]
    r = subprocess.run(cmd + extra, timeout=1500)
    res = json.load(open(out / "rl-loop.json"))
    if os.environ.get("REFIT_RL_JSON"):
        shutil.copy(out / "rl-loop.json", os.environ["REFIT_RL_JSON"])
    steps = res["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    fsdp = "--trainer" in extra and extra[extra.index("--trainer") + 1] == "fsdp"
    sgl = "--rollout" in extra and extra[extra.index("--rollout") + 1] == "sglang"
    assert res["config"]["rollout"] == ("sglang" if sgl else "vllm") + " tp=1 (CPU)"
    if fsdp:
        # every trainer rank published its own shards of the dtensor layout: half the model's bytes each (this
        # model's every dim 0 is even), together the whole model exactly once
        tr = res["trainer"]
        assert [t["layout"] for t in tr] == ["dtensor:dp_shard=2,dp_replicate=1,tp=1,experts=fused"] * 2, tr
        assert [t["layout_rank"] for t in tr] == [0, 1] and tr[0]["region_bytes"] == tr[1]["region_bytes"], tr
        assert all(s["refit_report"]["bytes"] == 2 * tr[0]["region_bytes"] for s in steps), steps
        for s in steps[1:]:
            # a real step on each rank's half of the batch: the shards changed, in place (storage not moved)
            assert len(s["train"]) == 2 and all(t["seqs"] > 0 and t["elements_changed"] > 1000 and
                                                t["storage_moved"] == [] for t in s["train"]), s["train"]
        assert res["config"]["trainer"].startswith("torch fully_shard")
    kl_max = res["config"]["kl_max"]
    for s in steps:
        # every step refitted through refit (2 trainer sources over shm) and passed the gate
        assert s["refit_report"]["sources"] == 2 and s["refit_report"]["bytes"] > 0, s
        assert 0 <= s["kl"] <= kl_max and 0 <= s["kl_native"] <= kl_max, s
        assert abs(s["kl"] - s["kl_native"]) <= 1e-6 + 0.05 * s["kl_native"], s
        # the KL is not trivially zero: two implementations (transformers, vLLM) in bf16 differ a little
        assert s["trainer_vs_vllm_max_abs"] > 0, s
        assert s["tokens"] > 0 and s["refit_s"] > 0 and s["swap_s"] > 0 and s["swap_load_s"] > 0, s
    if sgl:
        # SGLang refitted through refit scores exactly as an SGLang started natively on the same weights, and so
        # does SGLang's own update_weights_from_tensor path (the swap-only engine): no unpacked-experts effect.
        for s in steps:
            assert s["refit_vs_native_max_abs"] == 0 and s["kl"] == s["kl_native"], s
            assert s["swap_vs_native_max_abs"] == 0, s
            rep = s["refit_report"]
            assert rep["transport"] == "shm" and rep["planned"] == (s["step"] == 0), rep
        child = res["env"]["rollout_child"]
        assert child["sglang"] == "0.5.23", child
        import refit
        assert child["refit"] == os.path.dirname(os.path.abspath(refit.__file__)), child  # the package under test
        # Finding (SGLang 0.5.23, logprob_result_processor.py): input_token_logprobs reports the token id clipped
        # to 0 when it is >= vocab_size - 1, and the log-probability beside it is the token's own (closer to the
        # trainer-side model's log-probability of that token than of token 0).
        c = res["sglang_input_id_clip"]
        top = c["vocab_size"] - 1
        assert top in c["tokens"]
        assert c["reported_ids"] == [0 if t >= top else t for t in c["tokens"]], c
        noise = max(s["trainer_vs_vllm_max_abs"] for s in steps)
        for t, lv, own, zero in zip(c["tokens"], c["sglang_logprobs"], c["trainer_logprobs_of_token"],
                                    c["trainer_logprobs_of_token_0"]):
            assert abs(lv - own) <= noise, c
            if t == top:
                assert abs(lv - own) < abs(lv - zero), c
    else:
        # Finding (vLLM 0.32, CPU, MoE; docs/vllm.md finding 3): vLLM's own update path (layerwise reload +
        # load_weights) does not reproduce a native start of the same weights: the experts stay unpacked.  The
        # swap-only engine's log-probabilities differ from the native engine's, and its KL is above the gate.
        for s in steps:
            assert s["swap_vs_native_max_abs"] > 1e-3 and s["kl_swap"] > kl_max, s
    # the weights changed every step (the trainer's update reached vLLM)
    assert all(s["reward"] >= 0 for s in steps[1:])
    assert res["passed"] and res["gate_failures"] == []
    assert r.returncode == 0
    # the trainer's parameters are views into the published arena
    assert all(t["all_params_in_arena"] for t in res["trainer"])
    f = res["faults"]
    assert f["rollout_before_trainer"]["weights_kept"] and "REFIT_ERR_TIMEOUT" in f["rollout_before_trainer"]["error"]
    assert "no source of group trainer appeared" in f["rollout_before_trainer"]["error"]
    assert f["rank_died_mid_publish"]["weights_kept"]
    assert "nothing was written" in f["rank_died_mid_publish"]["error"]
    assert any(k in f["rank_died_mid_publish"]["error"] for k in ("REFIT_ERR_MISSING_SOURCE", "REFIT_ERR_TIMEOUT"))
    assert f["layout_mismatch"]["weights_kept"] and "REFIT_ERR_MISMATCH" in f["layout_mismatch"]["error"]
    assert "in the destination" in f["layout_mismatch"]["error"]
    assert os.path.getsize(out / "rl-loop.png") > 1000
