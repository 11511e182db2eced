"""refit.adapters.megatron on a live Megatron-Core GPTModel (megatron-core from PyPI), on the CPU.

Two real torch.distributed (gloo) processes build a GPTModel with Megatron-Core's local layer spec
(get_gpt_layer_local_spec, use_cpu_initialization=True, Float16Module for bf16), shaped like a tiny Qwen3-MoE
(examples/grpo_ray/mcore.py), at tp=2 and at ep=2; each binds its parameters with refit.adapters.megatron and
publishes them.  Checked:
  - zero copy: every parameter is a view into the binding's arena (its data_ptr lies in it), the values are the
    model's own, and a write through the parameter is a write to the arena;
  - a receiver of the `hf` layout in this process pulls version 1 and gets, byte for byte, what the example's own
    Megatron -> Hugging Face conversion (mcore.to_hf, written from Megatron-Core's layout rules, not refit's)
    makes of every rank's parameters; after one seeded update per rank, version 2 likewise;
  - the Transformer Engine spec's names (the norms fused into linear_qkv / linear_fc1, TEGroupedMLP's
    linear_fc1.weight{j}) bind the same memory the same way (the TE spec itself needs CUDA to build);
  - refused with the names: fp32 norms (no Float16Module), a layout of another geometry.

Run: REFIT_LIBRARY=build/librefit.so python -m pytest tests/python/test_megatron_core.py (a venv with
megatron-core, torch, transformers: scripts/vllm-venv.sh's).
"""
import json
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "examples", "grpo_ray"))
sys.path.insert(0, HERE)


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def te_names(named):
    """The Transformer Engine spec's names of a local-spec model's parameters (what a TE GPTModel calls them)."""
    import re
    out = {}
    for n, p in named:
        n = n.replace(".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight")
        m = re.match(r"^(.*\.mlp\.experts)\.local_experts\.(\d+)\.(linear_fc[12])\.weight$", n)
        if m:
            n = f"{m.group(1)}.{m.group(3)}.weight{m.group(2)}"
        out[n] = p
    return out


def rank_main(args):
    """One trainer rank: build, bind, check zero copy, publish versions 1 and 2."""
    import torch
    import mcore
    import refit
    rank, world, tp, ep = args["rank"], 2, args["tp"], args["ep"]
    os.environ["MASTER_PORT"] = str(args["port"])
    mcore.init_parallel(rank, world, tp, ep)
    hf_cfg = json.load(open(os.path.join(args["model"], "config.json")))
    model = mcore.build(hf_cfg, tp, ep)
    rmodel = refit.Model(args["model"])
    out = {"rank": rank}
    # Finding (megatron-core 0.16.1): the default MoE token dispatcher (alltoall) allocates a CUDA stream in its
    # constructor, so the model does not build on the CPU; allgather does.  Re-checked here.
    try:
        mcore.build(hf_cfg, tp, ep, dispatcher="alltoall")
        out["alltoall"] = "built"
    except Exception as e:
        out["alltoall"] = f"{type(e).__name__}: {e}"
    if True:  # refusals first (nothing is bound by a refused call)
        from megatron.core.transformer.module import Float16Module  # noqa: F401
        raw = model.module  # the GPTModel inside Float16Module, cast back to fp32 norms
        for n, p in raw.named_parameters():
            if "layernorm" in n:
                p.data = p.data.float()
        try:
            refit.adapters.megatron(raw.named_parameters(), rmodel, args["layout"], rank)
            out["fp32"] = "bound"
        except refit.adapters.AdapterError as e:
            out["fp32"] = str(e)
        for n, p in raw.named_parameters():
            if "layernorm" in n:
                p.data = p.data.to(torch.bfloat16)
        other = "megatron:ep=2,pad=0" if tp == 2 else "megatron:tp=2,pad=0"
        try:
            refit.adapters.megatron(model.named_parameters(), rmodel, other, rank)
            out["geometry"] = "bound"
        except refit.adapters.AdapterError as e:
            out["geometry"] = str(e)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = list(model.named_parameters())
    out["params"] = len(params)

    def in_arena(b):
        lo, hi = b.arena.data_ptr(), b.arena.data_ptr() + b.arena.numel()
        return [n for n, p in params if not (lo <= p.data_ptr() and p.data_ptr() + p.numel() * p.element_size() <= hi)]
    # the Transformer Engine spec's names bind the same parameters (a first binding, replaced by the next)
    bte = refit.adapters.megatron(te_names(model.named_parameters()), rmodel, args["layout"], rank)
    out["te_outside_arena"] = in_arena(bte)
    out["te_locals"] = len(bte.manifest.locals())
    b = refit.adapters.megatron(model.named_parameters(), rmodel, args["layout"], rank)
    lo = b.arena.data_ptr()
    out["outside_arena"] = in_arena(b)
    out["changed_by_bind"] = [n for n, p in params if not torch.equal(p.detach(), before[n])]
    # a write through the parameter is a write to the arena
    p0 = params[0][1]
    with torch.no_grad():
        old = p0.detach().clone()
        p0.add_(1)
        l0 = {l.name: l for l in b.manifest.locals()}
        arena_bytes = b.arena[p0.data_ptr() - lo:p0.data_ptr() - lo + p0.numel() * p0.element_size()]
        out["write_through"] = bool(torch.equal(arena_bytes.view(p0.dtype).view(p0.shape), p0.detach()))
        p0.copy_(old)
    out["arena_bytes"] = b.arena.numel()
    out["locals"] = len(l0)
    with refit.Publisher(b.manifest, registry=args["registry"], job=args["job"]) as pub:
        b.attach(pub)
        for v in (1, 2):
            if v == 2:
                from megatron.core import parallel_state as ps
                mcore.update(model, v, tp_rank=ps.get_tensor_model_parallel_rank(),
                             ep_rank=ps.get_expert_model_parallel_rank())
            torch.save(mcore.local_state(model), os.path.join(args["work"], f"state-v{v}-rank{rank}.pt"))
            pub.publish(v)
            pub.wait_acks(v, 1, 120000)
            pub.wait_readers(v, 120000)
    json.dump(out, open(args["out"], "w"))


def _spawn(tmp, model_dir, tp, ep, spec, job):
    port = _port()
    procs, outs = [], []
    for r in range(2):
        a = {"rank": r, "tp": tp, "ep": ep, "port": port, "model": model_dir, "spec": spec, "job": job,
             "layout": f"megatron:tp={tp},ep={ep},pad=0", "registry": f"file:{tmp}/reg", "work": str(tmp),
             "out": f"{tmp}/{job}-rank{r}.json"}
        outs.append(a["out"])
        procs.append(subprocess.Popen([sys.executable, __file__, json.dumps(a)], env=dict(os.environ)))
    return procs, outs


def _finish(procs, outs):
    rcs = [p.wait(timeout=300) for p in procs]
    assert rcs == [0, 0], rcs
    return [json.load(open(o)) for o in outs]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import vllm_models
    d = tmp_path_factory.mktemp("mc")
    return vllm_models.write(vllm_models.MOE, str(d / "tiny-qwen3-moe"), 1)


@pytest.mark.parametrize("tp,ep,spec", [(2, 1, "local"), (1, 2, "local")])
def test_live_gptmodel_publishes(tmp_path, model_dir, tp, ep, spec):
    import torch
    import mcore
    import refit
    hf_cfg = json.load(open(os.path.join(model_dir, "config.json")))
    job = f"mc-{tp}-{ep}-{spec}"
    procs, outs = _spawn(tmp_path, model_dir, tp, ep, spec, job)
    try:
        rmodel = refit.Model(model_dir)
        m = refit.Layout("hf").manifest(rmodel, 0)
        with refit.Receiver(m, registry=f"file:{tmp_path}/reg", job=job) as rx:
            rx.alloc(0)
            for v in (1, 2):
                rep = None
                for _ in range(240):  # fail fast when a rank died
                    assert all(p.poll() in (None, 0) for p in procs), [p.poll() for p in procs]
                    try:
                        rep = rx.pull(v, 500)
                        break
                    except refit.RefitError as e:
                        if "TIMEOUT" not in str(e):
                            raise
                assert rep is not None
                assert rep.version == v and rep.sources == 2
                got = rx.tensors()
                states = [torch.load(os.path.join(tmp_path, f"state-v{v}-rank{r}.pt")) for r in range(2)]
                want = mcore.to_hf(states, hf_cfg, tp, ep)
                assert set(got) == set(want)
                bad = [n for n in want if not torch.equal(got[n].view(torch.uint8), want[n].contiguous()
                                                         .view(torch.uint8))]
                assert not bad, f"version {v}: {len(bad)} tensors differ, e.g. {bad[:5]}"
                if v == 2:  # the update changed every tensor
                    assert not any(torch.equal(got[n], v1[n]) for n in want)
                v1 = {n: t.clone() for n, t in got.items()}
    finally:
        res = _finish(procs, outs)
    for r in res:
        assert r["outside_arena"] == [] and r["changed_by_bind"] == [] and r["write_through"], r
        assert r["params"] == r["locals"] == r["te_locals"] > 0 and r["te_outside_arena"] == [], r
        # refusals: fp32 norms (no Float16Module) and another geometry, each naming the tensors
        assert "mis-shaped or wrong dtype" in r["fp32"] and "layer_norm_weight: parameter f32" in r["fp32"], r["fp32"]
        assert "mis-shaped" in r["geometry"] and "linear_qkv.weight" in r["geometry"], r["geometry"]
        assert "CUDA" in r["alltoall"] and "MoELayer" in r["alltoall"], r["alltoall"]


if __name__ == "__main__":
    rank_main(json.loads(sys.argv[1]))
