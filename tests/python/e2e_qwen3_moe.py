#!/usr/bin/env python3
"""A real model refitted end to end: a small Qwen3-MoE built with transformers (random weights, no download).

    driver   builds the model (seed 0, bf16), writes its canonical state dict as a sharded HF checkpoint
             (model.safetensors.index.json + shards) and the model's config.json, computes reference logits on a
             fixed prompt; then takes one optimizer step (the trainer changing the weights), writes the second
             checkpoint (a single model.safetensors) and the reference logits after the step.
    publisher ranks (megatron:tp=2,ep=2,etp=1, world 2): a Megatron-style module tree (Megatron-Core's local names
             and shapes, as tests/python/bridge_check.py checks them against Megatron-Bridge) bound by
             refit.adapters.megatron, so its parameters are views into one arena; the arena is filled from the
             checkpoint with refit's own plan (hf source -> this megatron rank, refit.HfSource over the C
             safetensors reader), attached to a Publisher (its storage is the published memory), published as
             version 1; after every receiver acked and the readers drained, refilled from checkpoint 2 and
             published as version 2.
    receiver a transformers Qwen3MoeForCausalLM built from the same config with other random weights, bound by
             refit.adapters.hf (the hf layout 1:1 with transformers 4.x; per-expert placements into the fused
             expert tensors of transformers 5.x), so the model's own parameters are the receiver's memory;
             pulls version 1, computes logits, pulls version 2, computes logits.
    The driver checks torch.equal(receiver logits, reference logits) for both versions.

Usage: e2e_qwen3_moe.py [--device cpu|cuda] [--workdir DIR] [--out FILE]
With --device cuda the publishers' arenas live on cuda:0 and the receiver's model on the last GPU (cuda:1 with
two), moved by the cuda_ipc transport (refit built with CUDA).  Prints one JSON object (and writes it to --out).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

LAYOUT = "megatron:tp=2,ep=2,etp=1"
PROMPT = [3, 17, 42, 99, 5, 7, 128, 201, 33, 64, 12, 249]


def config():
    from transformers import Qwen3MoeConfig
    kw = dict(vocab_size=250, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
              decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, tie_word_embeddings=False,
              max_position_embeddings=128, rms_norm_eps=1e-6)
    cfg = Qwen3MoeConfig(**kw)
    if hasattr(cfg, "dtype"):  # transformers 5 ("torch_dtype" is deprecated there)
        cfg.dtype = "bfloat16"
    else:
        cfg.torch_dtype = "bfloat16"
    return cfg


def build_model(cfg, seed, device):
    import torch
    from transformers import Qwen3MoeForCausalLM
    torch.manual_seed(seed)
    m = Qwen3MoeForCausalLM(cfg).to(device=device, dtype=torch.bfloat16)
    m.eval()
    return m


def logits(model, device):
    import torch
    with torch.no_grad():
        return model(torch.tensor([PROMPT], device=device)).logits.float().cpu()


def canonical_state(model, rmodel):
    """The model's weights under canonical (HF checkpoint) names, whatever the transformers version."""
    import refit
    named = dict(model.named_parameters())
    out = {}
    for p in refit.adapters.hf_placements(named, rmodel):
        t = named[p.local].detach()
        if len(p.local_offset) > len(p.extent):  # fused experts: [E, rows, cols]
            e = p.local_offset[0]
            t = t[e, p.local_offset[1]:p.local_offset[1] + p.extent[0], :]
        out[p.canonical] = t.to("cpu").contiguous().clone()
    return out


def save_checkpoint(state, directory, shards):
    from safetensors.torch import save_file
    os.makedirs(directory, exist_ok=True)
    names = list(state)
    if shards == 1:
        save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
        return
    per = -(-len(names) // shards)
    wm = {}
    for s in range(shards):
        part = names[s * per:(s + 1) * per]
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: state[n] for n in part}, os.path.join(directory, fn), metadata={"format": "pt"})
        wm.update({n: fn for n in part})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
                   "weight_map": wm}, f, indent=1)


def module_tree(manifest):
    """A torch module tree whose named_parameters() are the manifest's local tensors (Megatron-Core names)."""
    import torch
    import refit
    root = torch.nn.Module()
    for l in manifest.locals():
        *path, leaf = l.name.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, torch.nn.Module())
            mod = getattr(mod, part)
        mod.register_parameter(leaf, torch.nn.Parameter(torch.zeros(l.shape, dtype=refit.torch_dtype(l.dtype))))
    return root


def role_publisher(a):
    import torch
    import refit
    dev = 0 if a.device == "cuda" else -1
    rmodel = refit.Model(os.path.join(a.workdir, "tiny-qwen3-moe"))
    layout = refit.Layout(LAYOUT)
    # The trainer's module: Megatron names/shapes (module_tree stands in for a Megatron-Core GPTModel).
    trainer = module_tree(layout.manifest(rmodel, a.rank))
    if dev >= 0:
        trainer = trainer.to(f"cuda:{dev}")
    binding = refit.adapters.megatron(trainer.named_parameters(), rmodel, LAYOUT, a.rank)
    staging = torch.zeros(binding.arena.numel(), dtype=torch.uint8) if dev >= 0 else binding.arena

    def load(version):
        with refit.HfSource(os.path.join(a.workdir, f"ckpt-v{version}"), rmodel) as hf:
            plan = refit.Plan([hf.manifest], binding.manifest)
            plan.execute([hf.regions], [staging])
            st = plan.stats()
        if dev >= 0:
            binding.arena.copy_(staging)
        return st

    stats = load(1)
    pub = refit.Publisher(binding.manifest, registry=a.registry, job=a.job, device=dev,
                          transports="cuda_ipc" if dev >= 0 else "shm")
    with pub:
        binding.attach(pub)
        pub.publish(1)
        pub.wait_acks(1, 1, 120000)
        pub.wait_readers(1, 120000)
        load(2)  # in place: the readers of version 1 are gone
        pub.publish(2)
        pub.wait_acks(2, 1, 120000)
    print(json.dumps({"role": "publisher", "rank": a.rank, "plan_bytes": stats.bytes_written,
                      "plan_regions": stats.regions, "plan_fill": stats.bytes_fill}), flush=True)


def role_receiver(a):
    import torch
    import refit
    from transformers import AutoConfig
    torch.set_num_threads(1)
    ndev = torch.cuda.device_count() if a.device == "cuda" else 0
    dev = ndev - 1 if ndev else -1
    device = f"cuda:{dev}" if dev >= 0 else "cpu"
    cfg = AutoConfig.from_pretrained(os.path.join(a.workdir, "tiny-qwen3-moe"))
    model = build_model(cfg, 1234, device)
    rmodel = refit.Model(os.path.join(a.workdir, "tiny-qwen3-moe"))
    binding = refit.adapters.hf(model.named_parameters(), rmodel)
    before = logits(model, device)
    out = {"role": "receiver", "device": device, "manifest_layout": binding.manifest.identity["layout"]}
    with refit.Receiver(binding.manifest, registry=a.registry, job=a.job, device=dev,
                        transports="cuda_ipc" if dev >= 0 else "shm") as rcv:
        binding.attach(rcv)
        # the parameters are views into the receiver's memory
        p0 = next(model.parameters())
        a0 = binding.arena.data_ptr()
        out["params_in_arena"] = all(a0 <= p.data_ptr() < a0 + binding.arena.numel() for p in model.parameters())
        for v in (1, 2):
            rep = rcv.pull(v, timeout_ms=120000)
            torch.save(logits(model, device), os.path.join(a.workdir, f"recv-logits-v{v}.pt"))
            out[f"v{v}"] = {"bytes": rep.bytes, "sources": rep.sources, "transport": rep.transport,
                            "total_ms": round(rep.total_ms, 3)}
        del p0
    torch.save(before, os.path.join(a.workdir, "recv-logits-before.pt"))
    print(json.dumps(out), flush=True)


def driver(a):
    import torch
    import refit
    import transformers
    torch.set_num_threads(1)
    t0 = time.time()
    # the reference runs on the receiver's device (the last GPU), so that only the process differs
    device = f"cuda:{torch.cuda.device_count() - 1}" if a.device == "cuda" else "cpu"
    if a.device == "cuda" and torch.cuda.device_count() == 0:
        raise SystemExit("--device cuda: no CUDA device visible to torch")
    cfg = config()
    os.makedirs(a.workdir, exist_ok=True)
    cfg.save_pretrained(os.path.join(a.workdir, "tiny-qwen3-moe"))
    model = build_model(cfg, 0, device)
    rmodel = refit.Model(os.path.join(a.workdir, "tiny-qwen3-moe"))
    save_checkpoint(canonical_state(model, rmodel), os.path.join(a.workdir, "ckpt-v1"), shards=3)
    ref1 = logits(model, device)
    # the trainer's optimizer step
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = torch.tensor([PROMPT], device=device)
    loss = model(ids, labels=ids).loss
    loss.backward()
    opt.step()
    model.eval()
    save_checkpoint(canonical_state(model, rmodel), os.path.join(a.workdir, "ckpt-v2"), shards=1)
    ref2 = logits(model, device)
    assert not torch.equal(ref1, ref2), "the optimizer step changed nothing"

    registry = "file:" + os.path.join(a.workdir, "registry")
    job = f"e2e-{os.getpid()}"
    common = [sys.executable, os.path.abspath(__file__), "--device", a.device, "--workdir", a.workdir,
              "--registry", registry, "--job", job]
    procs = [subprocess.Popen(common + ["--role", "publisher", "--rank", str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    procs.append(subprocess.Popen(common + ["--role", "receiver"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True))
    outs = []
    ok = True
    for p in procs:
        try:
            so, se = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        if p.returncode != 0:
            ok = False
            sys.stderr.write(f"--- {p.args[-3:]} exit {p.returncode}\n{se}\n")
        outs.append(json.loads(so.strip().splitlines()[-1]) if so.strip() else {"stderr": se[-2000:]})
    result = {"test": "e2e_qwen3_moe", "device": a.device, "torch": torch.__version__,
              "transformers": transformers.__version__, "library": refit.library_path, "layout_src": LAYOUT,
              "processes_ok": ok, "processes": outs}
    if ok:
        before = torch.load(os.path.join(a.workdir, "recv-logits-before.pt"))
        got1 = torch.load(os.path.join(a.workdir, "recv-logits-v1.pt"))
        got2 = torch.load(os.path.join(a.workdir, "recv-logits-v2.pt"))
        result.update({"before_differs": not torch.equal(before, ref1), "v1_equal": torch.equal(got1, ref1),
                       "v2_equal": torch.equal(got2, ref2), "v1_v2_differ": not torch.equal(ref1, ref2)})
    result["passed"] = bool(ok and result.get("v1_equal") and result.get("v2_equal") and result.get("before_differs")
                            and outs[-1].get("params_in_arena"))
    result["seconds"] = round(time.time() - t0, 2)
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--workdir")
    ap.add_argument("--out")
    ap.add_argument("--role", default="driver")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--registry")
    ap.add_argument("--job")
    a = ap.parse_args()
    if a.role == "publisher":
        return role_publisher(a)
    if a.role == "receiver":
        return role_receiver(a)
    if not a.workdir:
        a.workdir = tempfile.mkdtemp(prefix="refit-e2e-")
    res = driver(a)
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    sys.exit(0 if res["passed"] else 1)


if __name__ == "__main__":
    main()
