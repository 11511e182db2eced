"""refit.fsdp.dtensor on a model sharded by torch's real FSDP2 (torch.distributed.fsdp.fully_shard), on the CPU.

Real torch.distributed (gloo) processes load a tiny transformers checkpoint (tests/python/vllm_models.py: a
Qwen3-MoE with fused 3-d experts under transformers 5, and a dense Qwen3 with tied embeddings), shard it with
fully_shard per decoder layer and at the root - plain FSDP over 2 and 4 processes, HSDP over a 2x2 (replicate x
shard) mesh, and FSDP over TP on a 2x2 (dp_shard x tp) mesh (parallelize_module with transformers' own tp plan:
q/k/v/gate/up colwise, o/down rowwise, lm_head colwise; untied embeddings, since the scheme refuses tied ones
under TP) - and bind each rank's shards with refit.fsdp.dtensor, which checks every parameter against the
library's dtensor layout (torch's compute_local_shape_and_global_offset against the manifest's box, FSDP2's
padded storage size against the padded local tensor).  Each rank publishes version 1, takes a real optimizer
step (forward, backward, AdamW) and publishes version 2.  Checked:
  - zero copy: every region is the parameter's own storage, and no storage moved across the optimizer step;
  - receivers of the `hf` layout and of `vllm:tp=2` (both ranks) in this process, refit's C receiver through
    the binding, pull both versions; the hf tensors equal, byte for byte, the checkpoint (v1) and the full
    state dict gathered by FSDP2's own full_tensor() after the step (v2, fused experts split per expert here);
    every box of the vllm destination equals the same bytes of those tensors;
  - refusals by name: fp32 sharded parameters against the bf16 checkpoint.

Run: REFIT_LIBRARY=build/librefit.so python -m pytest tests/python/test_fsdp.py (the vLLM venv: torch 2.13 and
transformers 5.19).
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
sys.path.insert(0, HERE)
# A venv with refit installed editable from another checkout (scikit-build-core's finder comes before sys.path):
# this checkout's package must be the one that matches this build's library.
sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable_skbc_refit")]

TP_PLAN = {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
           "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
           "mlp.down_proj": "rowwise"}


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tp(model, tp_mesh):
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    plan = {}
    for i in range(len(model.model.layers)):
        for k, style in TP_PLAN.items():
            plan[f"model.layers.{i}.{k}"] = ColwiseParallel() if style == "colwise" else RowwiseParallel()
    plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    parallelize_module(model, tp_mesh, plan)


def rank_main(a):
    import torch
    import torch.distributed as dist
    import refit
    import refit.fsdp
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a["port"]))
    dist.init_process_group("gloo", rank=a["rank"], world_size=a["world"])
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM
    R, F, T = a["rep"], a["shard"], a["tp"]
    model = AutoModelForCausalLM.from_pretrained(a["model"], dtype=torch.bfloat16)
    if T > 1:
        mesh = init_device_mesh("cpu", (F, T), mesh_dim_names=("dp_shard", "tp"))
        _tp(model, mesh["tp"])
        dp = mesh["dp_shard"]
    elif R > 1:
        dp = init_device_mesh("cpu", (R, F), mesh_dim_names=("dp_replicate", "dp_shard"))
    else:
        dp = init_device_mesh("cpu", (F,), mesh_dim_names=("dp_shard",))
    for layer in model.model.layers:
        fully_shard(layer, mesh=dp)
    fully_shard(model, mesh=dp)
    rmodel = refit.Model(a["model"])
    out = {"rank": a["rank"]}
    # refused by name: fp32 sharded storage (fp32 master weights) against the bf16 checkpoint
    if T == 1:
        m32 = AutoModelForCausalLM.from_pretrained(a["model"], dtype=torch.float32)
        fully_shard(m32, mesh=dp)
        try:
            refit.fsdp.dtensor(m32, rmodel)
            out["fp32"] = "bound"
        except refit.adapters.AdapterError as e:
            out["fp32"] = str(e)
        del m32
    b = refit.adapters.dtensor(model, rmodel)
    out.update(layout=b.layout, layout_rank=b.rank, regions=len(b.regions), params=len(b.params), copied=b.copied)
    out["not_own_storage"] = [n for n, p in b.params.items() if n not in b.copied and
                              (b.regions[b.region_of[n]].data_ptr() != p._local_tensor.untyped_storage().data_ptr()
                               or b.regions[b.region_of[n]].numel() != p._local_tensor.untyped_storage().nbytes())]
    before = b.addresses()
    with refit.Publisher(b.manifest, registry=a["registry"], job=a["job"]) as pub:
        b.attach(pub)
        b.publish(pub, 1)  # = b.sync() (the packed copies, if any) + pub.publish(1)
        pub.wait_acks(1, a["receivers"], 120000)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(7)
        x = torch.randint(0, model.config.vocab_size, (2, 8), generator=g)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        if T > 1:
            # q_norm / k_norm act on this TP rank's heads only: their gradients are partial sums, to be summed
            # over tp (transformers' tp plan: "replicated_with_grad_allreduce").  Without this the tp replicas
            # diverge after the step, and refit's receivers refuse version 2 (digest mismatch), as seen here.
            for n, p in model.named_parameters():
                if n.endswith(("q_norm.weight", "k_norm.weight")):
                    dist.all_reduce(p.grad._local_tensor, group=mesh["tp"].get_group())
        opt.step()
        opt.zero_grad()
        out["loss"] = float(loss.detach())
        out["moved"] = [n for n, ad in b.addresses().items() if ad != before[n]]
        full = {n: p.full_tensor() for n, p in model.named_parameters()}  # a collective: every rank
        if a["rank"] == 0:
            torch.save(full, os.path.join(a["work"], f"{a['job']}-v2.pt"))
        dist.barrier()
        b.publish(pub, 2)
        pub.wait_acks(2, a["receivers"], 120000)
        pub.wait_readers(2, 120000)
    json.dump(out, open(a["out"], "w"))
    dist.destroy_process_group()


def canonical_of(full, rmodel):
    """Live (transformers 5) names -> the checkpoint's canonical names: fused experts split per expert."""
    canon = {t.name for t in rmodel.tensors()}
    out = {}
    for n, t in full.items():
        if n.endswith(".mlp.experts.gate_up_proj"):
            pre, i = n[:-len(".gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{pre}.{e}.gate_proj.weight"] = t[e, :i]
                out[f"{pre}.{e}.up_proj.weight"] = t[e, i:]
        elif n.endswith(".mlp.experts.down_proj"):
            pre = n[:-len(".down_proj")]
            for e in range(t.shape[0]):
                out[f"{pre}.{e}.down_proj.weight"] = t[e]
        elif n in canon:
            out[n] = t
    assert set(out) == canon, sorted(canon ^ set(out))[:5]
    return out


def boxes_differ(manifest, got, want):
    """Every placement of a destination manifest: its box of the received local tensor against the same box of
    the canonical tensor (indexing done here, not by refit)."""
    import torch
    bad = []
    for p in manifest.placements():
        lt = got[p.local]
        lead = lt.dim() - len(p.extent)
        idx = tuple(p.local_offset[:lead]) + tuple(slice(o, o + e) for o, e in zip(p.local_offset[lead:], p.extent))
        cidx = tuple(slice(o, o + e) for o, e in zip(p.canon_offset, p.extent))
        a, b = lt[idx].contiguous(), want[p.canonical][cidx].contiguous()
        if a.shape != b.shape or not torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8)):
            bad.append(f"{p.canonical} -> {p.local} {p.canon_offset}")
    return bad


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    import vllm_models
    d = tmp_path_factory.mktemp("fsdp")
    return {"moe": vllm_models.write(vllm_models.MOE, str(d / "moe" / vllm_models.MOE), 1),
            "dense": vllm_models.write(vllm_models.DENSE, str(d / "dense" / vllm_models.DENSE), 1),
            "untied": vllm_models.write(vllm_models.DENSE, str(d / "untied" / vllm_models.DENSE), 2,
                                        tie_word_embeddings=False),
            # 47 layers: 47 * 11 + 3 = 520 parameters a rank, more than a publisher's 511 regions
            "deep": vllm_models.write(vllm_models.MOE, str(d / "deep" / vllm_models.MOE), 4, num_hidden_layers=47)}


CASES = [("moe", 1, 2, 1), ("dense", 1, 4, 1), ("moe", 2, 2, 1), ("untied", 1, 2, 2), ("deep", 1, 2, 1)]


@pytest.mark.parametrize("kind,rep,shard,tp", CASES, ids=["fsdp2-moe", "fsdp4-dense", "hsdp2x2-moe",
                                                         "tp2xfsdp2-dense", "fsdp2-moe-520params"])
def test_fully_shard_publishes(tmp_path, ckpts, kind, rep, shard, tp):
    import torch
    from safetensors.torch import load_file
    import refit
    model_dir = ckpts[kind]
    world, job, port = rep * shard * tp, f"fsdp-{kind}-{rep}-{shard}-{tp}", _port()
    rmodel = refit.Model(model_dir)
    dests = [("hf", 0), ("vllm:tp=2", 0), ("vllm:tp=2", 1)]
    procs, outs = [], []
    for r in range(world):
        a = {"rank": r, "world": world, "rep": rep, "shard": shard, "tp": tp, "port": port, "model": model_dir,
             "job": job, "registry": f"file:{tmp_path}/reg", "work": str(tmp_path), "receivers": len(dests),
             "out": f"{tmp_path}/rank{r}.json"}
        outs.append(a["out"])
        procs.append(subprocess.Popen([sys.executable, __file__, json.dumps(a)], env=dict(os.environ)))
    ok = False
    try:
        rxs = []
        for spec, r in dests:
            m = refit.Layout(spec).manifest(rmodel, r)
            # one reader name each: the default ("<host>:<pid>:r<rank>") is the same for hf and vllm rank 0 here
            rx = refit.Receiver(m, registry=f"file:{tmp_path}/reg", job=job, reader=f"{spec.replace('=', '')}:r{r}")
            rx.alloc(0)
            rxs.append((spec, r, m, rx))
        ck = load_file(os.path.join(model_dir, "model.safetensors"))
        v1 = {t.name: ck[t.name] for t in rmodel.tensors()}
        for v in (1, 2):
            want = v1 if v == 1 else None  # v2: the state rank 0 saves before it publishes 2
            for spec, r, m, rx in rxs:
                rep_ = None
                for _ in range(48):
                    assert all(p.poll() in (None, 0) for p in procs), [p.poll() for p in procs]
                    try:
                        rep_ = rx.pull(v, 5000)
                        break
                    except refit.RefitError as e:
                        if "TIMEOUT" not in str(e):
                            raise
                assert rep_ is not None and rep_.version == v and rep_.sources == world, rep_
                if want is None:
                    want = canonical_of(torch.load(os.path.join(tmp_path, f"{job}-v2.pt")), rmodel)
                got = rx.tensors()
                if spec == "hf":
                    bad = [n for n in want if not torch.equal(got[n].view(torch.uint8), want[n].contiguous()
                                                             .view(torch.uint8))]
                    assert not bad, f"{job} v{v} hf: {len(bad)} tensors differ, e.g. {bad[:5]}"
                    if v == 2:  # the step changed every tensor but routed experts no token of the batch chose
                        same = [n for n in want if torch.equal(want[n], v1[n])]
                        assert len(same) < len(want) // 2 and all(".mlp.experts." in n for n in same), same[:5]
                bad = boxes_differ(m, got, want)
                assert not bad, f"{job} v{v} {spec} rank {r}: {len(bad)} boxes differ, e.g. {bad[:5]}"
        for _, _, _, rx in rxs:
            rx.close()
        ok = True
    finally:
        if not ok:  # do not leave the ranks waiting for acks that will not come
            for p in procs:
                p.kill()
        rcs = [p.wait(timeout=300) for p in procs]
    assert rcs == [0] * world, rcs
    res = [json.load(open(o)) for o in outs]
    want_layout = f"dtensor:dp_shard={shard},dp_replicate={rep},tp={tp},experts=fused"
    assert sorted(r["layout_rank"] for r in res) == list(range(world)), res
    for r in res:
        assert r["layout"] == want_layout, r
        assert r["not_own_storage"] == [] and r["moved"] == [] and r["regions"] > 0, r
        if kind == "deep":  # 520 parameters: 510 zero-copy regions and one of the 10 smallest, copied (q/k norms)
            assert r["params"] == 520 and r["regions"] == 511 and len(r["copied"]) == 10, r
            assert all(n.endswith(("q_norm.weight", "k_norm.weight")) for n in r["copied"]), r["copied"]
        else:
            assert r["copied"] == [] and r["regions"] == r["params"], r
        if tp == 1:
            assert "mis-shaped or wrong dtype" in r["fp32"] and "model.embed_tokens.weight: f32" in r["fp32"], r["fp32"]


if __name__ == "__main__":
    rank_main(json.loads(sys.argv[1]))
