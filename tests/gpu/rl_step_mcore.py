#!/usr/bin/env python3
"""A GPU RL step with real parts (issue 36): Megatron-Core trains on the GPU and refits a transformers model.

    trainer   one process, cuda:0, torch.distributed world 1 (NCCL): a Megatron-Core GPTModel (local layer spec,
              bf16 through Float16Module: examples/grpo_ray/mcore.py) of a tiny Qwen3-MoE; its parameters bound
              by refit.adapters.megatron (views into one GPU arena) and published by a GPU Publisher (cuda_ipc).
              Each step: Megatron's own forward with labels (its per-token cross-entropy), a policy-gradient-shaped
              loss (the per-token losses weighted by fixed advantages), backward, an AdamW step on the bf16
              parameters (the arena changes in place), then publish version = step, wait for the receiver's ack
              and for its readers.  Saves, per version, its log-probs of an eval prompt (eval mode) and its state.
    receiver  another process, on the last GPU (cuda:0 with one: colocated): a transformers Qwen3MoeForCausalLM of
              the same config with other random weights, bound by refit.adapters.hf; pulls every version and saves
              its log-probs of the prompt.
    driver    per version, the native reference: a transformers model of the same config loaded (load_state_dict)
              from the trainer's state converted by mcore.to_hf (the example's own Megatron -> HF rules) on the
              receiver's device.  Gates: the receiver's weights (its canonical tensors) equal the trainer's
              state converted by mcore.to_hf, byte for byte; KL(native || receiver) and KL(trainer || receiver)
              below KL_GATE (other kernels: Megatron's, transformers' loaded another way); every step's loss
              finite and every step changed the weights; every pull checked against the trainer's GPU digest
              tables with no byte unverified.  Step times and pull times are reported.

Usage (a CUDA machine with megatron-core importable and refit built with CUDA; REFIT_LIBRARY names it):
    rl_step_mcore.py [--steps 4] [--workdir DIR] [--out FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "examples", "grpo_ray"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

from e2e_qwen3_moe import PROMPT, build_model, canonical_state, config, save_checkpoint  # noqa: E402

LAYOUT = "megatron:tp=1,ep=1,pad=0"
KL_GATE = 5e-3
SEQ = 24
BATCH = 4


def log_probs(logits):
    import torch
    return torch.log_softmax(logits.float(), dim=-1).cpu()


def batch(step, vocab, device):
    """The step's 'rollouts': fixed token sequences and advantages (seeded by the step)."""
    import torch
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, vocab, (BATCH, SEQ + 1), generator=g)
    adv = torch.randn(BATCH, 1, generator=g).expand(BATCH, SEQ)
    return ids[:, :-1].to(device), ids[:, 1:].to(device), adv.to(device)


def causal(n, device):
    import torch
    return torch.triu(torch.ones(1, 1, n, n, dtype=torch.bool, device=device), diagonal=1)  # True: masked


def role_trainer(a):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    import mcore
    import refit
    torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(a.port))
    dist.init_process_group("nccl", rank=0, world_size=1)
    ps.initialize_model_parallel(tensor_model_parallel_size=1, expert_model_parallel_size=1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    # Finding (megatron-core 0.16.1 without Transformer Engine): moe_utils imports te_general_gemm inside a
    # try whose except leaves the name undefined, and the router's gating (RouterGatingLinearFunction) tests
    # `te_general_gemm is not None`: every MoE forward on the GPU raises NameError.  Defining it as None takes
    # the path the code means for no Transformer Engine (a torch matmul).
    from megatron.core.transformer.moe import moe_utils
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    mdir = os.path.join(a.workdir, "tiny-qwen3-moe")
    cfg = json.load(open(os.path.join(mdir, "config.json")))
    model = mcore.build(cfg, 1, 1).cuda()
    rmodel = refit.Model(mdir)
    binding = refit.adapters.megatron(model.named_parameters(), rmodel, LAYOUT, 0)
    lo, hi = binding.arena.data_ptr(), binding.arena.data_ptr() + binding.arena.numel()
    out = {"role": "trainer", "arena_bytes": binding.arena.numel(), "arena_device": str(binding.arena.device),
           "params_in_arena": all(lo <= p.data_ptr() < hi for p in model.parameters()), "steps": []}
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    eval_ids = torch.tensor([PROMPT], device="cuda:0")
    pos_eval = torch.arange(len(PROMPT), device="cuda:0").unsqueeze(0)
    pos = torch.arange(SEQ, device="cuda:0").unsqueeze(0).expand(BATCH, SEQ)
    pub = refit.Publisher(binding.manifest, registry=a.registry, job=a.job, device=0, transports="cuda_ipc")
    with pub:
        binding.attach(pub)
        for step in range(1, a.steps + 1):
            before = binding.arena.clone()
            ids, labels, adv = batch(step, cfg["vocab_size"], "cuda:0")
            model.train()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            per_token = model(ids, pos, causal(SEQ, "cuda:0"), labels=labels)  # Megatron's cross-entropy [b, s]
            loss = (adv * per_token.float()).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            model.eval()
            with torch.no_grad():
                lp = log_probs(model(eval_ids, pos_eval, causal(len(PROMPT), "cuda:0")))
            torch.save(lp, os.path.join(a.workdir, f"trainer-logprobs-v{step}.pt"))
            torch.save(mcore.local_state(model), os.path.join(a.workdir, f"trainer-state-v{step}.pt"))
            t2 = time.perf_counter()
            pub.publish(step)
            pub.wait_acks(step, 1, 120000)
            pub.wait_readers(step, 120000)
            t3 = time.perf_counter()
            out["steps"].append({"version": step, "loss": float(loss), "train_step_ms": round((t1 - t0) * 1e3, 3),
                                 "publish_to_ack_ms": round((t3 - t2) * 1e3, 3),
                                 "weights_changed": not torch.equal(before, binding.arena)})
    print(json.dumps(out), flush=True)


def role_receiver(a):
    import torch
    import refit
    from transformers import AutoConfig
    dev = torch.cuda.device_count() - 1
    device = f"cuda:{dev}"
    mdir = os.path.join(a.workdir, "tiny-qwen3-moe")
    model = build_model(AutoConfig.from_pretrained(mdir), 4321, device)
    rmodel = refit.Model(mdir)
    binding = refit.adapters.hf(model.named_parameters(), rmodel)
    out = {"role": "receiver", "device": device, "pulls": []}
    ids = torch.tensor([PROMPT], device=device)
    with refit.Receiver(binding.manifest, registry=a.registry, job=a.job, device=dev, transports="cuda_ipc") as rx:
        binding.attach(rx)
        for v in range(1, a.steps + 1):
            rep = rx.pull(v, timeout_ms=120000)
            with torch.no_grad():
                torch.save(log_probs(model(ids).logits), os.path.join(a.workdir, f"recv-logprobs-v{v}.pt"))
            torch.save(canonical_state(model, rmodel), os.path.join(a.workdir, f"recv-state-v{v}.pt"))
            out["pulls"].append({"version": v, "bytes": rep.bytes, "total_ms": round(rep.total_ms, 3),
                                 "transfer_ms": round(rep.transfer_ms, 3), "transport": rep.transport,
                                 "unverified_bytes": rep.unverified_bytes,
                                 "digest_bytes": rep.digest_bytes, "unstamped_sources": rep.unstamped_sources})
    print(json.dumps(out), flush=True)


def run_roles(a):
    common = [sys.executable, os.path.abspath(__file__), "--workdir", a.workdir, "--registry", a.registry,
              "--job", a.job, "--steps", str(a.steps), "--lr", str(a.lr), "--port", str(a.port)]
    procs = [subprocess.Popen(common + ["--role", r], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in ("trainer", "receiver")]
    outs, ok = [], True
    for p in procs:
        try:
            so, se = p.communicate(timeout=480)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        if p.returncode != 0:
            ok = False
            sys.stderr.write(f"--- {p.args[-1]} exit {p.returncode}\n{se[-6000:]}\n")
        last = so.strip().splitlines()[-1] if so.strip() else ""
        outs.append(json.loads(last) if last.startswith("{") else {"stderr": se[-3000:]})
    return ok, outs


def driver(a):
    import torch
    import transformers
    import megatron.core
    import mcore
    t0 = time.time()
    device = f"cuda:{torch.cuda.device_count() - 1}"
    cfg = config()
    mdir = os.path.join(a.workdir, "tiny-qwen3-moe")
    cfg.save_pretrained(mdir)
    ok, (tr, rx) = run_roles(a)
    res = {"test": "rl_step_mcore", "torch": torch.__version__, "transformers": transformers.__version__,
           "megatron_core": megatron.core.__version__, "gpus": torch.cuda.device_count(), "layout_src": LAYOUT,
           "processes_ok": ok, "trainer": tr, "receiver": rx, "versions": []}
    passed = ok and tr.get("params_in_arena")
    if ok:
        hcfg = json.load(open(os.path.join(mdir, "config.json")))
        from transformers import AutoModelForCausalLM
        for v in range(1, a.steps + 1):
            # the native load: the trainer's state as a checkpoint, read by transformers' own loader (which, in
            # transformers 5, fuses the per-expert tensors itself)
            state = mcore.to_hf([torch.load(os.path.join(a.workdir, f"trainer-state-v{v}.pt"))], hcfg, 1, 1)
            ck = os.path.join(a.workdir, f"native-v{v}")
            save_checkpoint(state, ck, shards=1)
            cfg.save_pretrained(ck)
            native = AutoModelForCausalLM.from_pretrained(ck, dtype=torch.bfloat16).to(device).eval()
            with torch.no_grad():
                ref = log_probs(native(torch.tensor([PROMPT], device=device)).logits)
            got = torch.load(os.path.join(a.workdir, f"recv-logprobs-v{v}.pt"))
            trn = torch.load(os.path.join(a.workdir, f"trainer-logprobs-v{v}.pt"))
            recv = torch.load(os.path.join(a.workdir, f"recv-state-v{v}.pt"))
            differ = sorted(n for n in state if n not in recv or not torch.equal(state[n], recv[n]))
            kl_t = float((trn.exp() * (trn - got)).sum(-1).mean())
            kl_n = float((ref.exp() * (ref - got)).sum(-1).mean())
            step = tr["steps"][v - 1]
            row = {"version": v, "weights_equal_trainer": not differ and len(recv) == len(state),
                   "tensors_differing": differ[:5], "kl_native_receiver": kl_n, "kl_trainer_receiver": kl_t,
                   "logprobs_equal_native": bool(torch.equal(got, ref)),
                   "max_abs_logprob_native_receiver": float((got - ref).abs().max()),
                   "loss": step["loss"], "weights_changed": step["weights_changed"]}
            res["versions"].append(row)
            passed = passed and row["weights_equal_trainer"] and kl_n < KL_GATE and kl_t < KL_GATE and \
                step["weights_changed"] and abs(step["loss"]) < 1e6
    # every pull verified against the trainer's GPU digest tables: no byte unverified, some checked
    pulls = rx.get("pulls", []) if ok else []
    res["pulls_verified"] = bool(pulls) and all(p["unverified_bytes"] == 0 and p["digest_bytes"] > 0 for p in pulls)
    res["kl_gate"] = KL_GATE
    res["passed"] = bool(passed and res["pulls_verified"] and len(res["versions"]) == a.steps >= 3)
    res["seconds"] = round(time.time() - t0, 2)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--workdir")
    ap.add_argument("--out")
    ap.add_argument("--role", default="driver")
    ap.add_argument("--registry")
    ap.add_argument("--job")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    if a.role == "trainer":
        return role_trainer(a)
    if a.role == "receiver":
        return role_receiver(a)
    a.workdir = a.workdir or tempfile.mkdtemp(prefix="refit-rl-mcore-")
    a.registry = "file:" + os.path.join(a.workdir, "registry")
    a.job = f"rl-mcore-{os.getpid()}"
    if not a.port:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            a.port = s.getsockname()[1]
    res = driver(a)
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    sys.exit(0 if res["passed"] else 1)


if __name__ == "__main__":
    main()
