"""refit.fsdp.dtensor on a model sharded by torch's real FSDP2 (torch.distributed.fsdp.fully_shard), on the CPU.

Real torch.distributed (gloo) processes load a tiny transformers checkpoint (tests/python/vllm_models.py: a
Qwen3-MoE with fused 3-d experts under transformers 5, and a dense Qwen3 with tied embeddings) and shard it two
ways.  "torch" cases: fully_shard per decoder layer and at the root - plain FSDP over 2 and 4 processes, HSDP
over a 2x2 (replicate x shard) mesh, and FSDP over TP on a 2x2 (dp_shard x tp) mesh with torch's
parallelize_module and TP_PLAN (q/k/v/gate/up colwise, o/down rowwise, lm_head colwise; untied).  "transformers"
cases: transformers 5.19's own distributed code (_transformers_distribute: the model's tp plan, ep plan and fsdp
plan, as from_pretrained(distributed_config=...) applies them) on a 2x2 (fsdp x tp) mesh - the tied dense Qwen3
(one vocab-parallel parameter), the Qwen3-MoE with packed_colwise experts, and the Qwen3-MoE with expert
parallel (ep=2: grouped_gemm experts on transformers' (efsdp, ep) mesh).  Each rank binds its shards with
refit.fsdp.dtensor, which checks every parameter against the library's dtensor layout (the global indices
torch's own placements give each dimension of to_local() against every box of the manifest, the storage
against the padded local tensor), publishes version 1, takes a real optimizer step (forward, backward, AdamW)
and publishes version 2.  Checked:
  - zero copy: every region is the parameter's own storage, and no storage moved across the optimizer step;
  - receivers of the `hf` layout and of `vllm:tp=2` (both ranks) in this process, refit's C receiver through
    the binding, pull both versions; the hf tensors equal, byte for byte, the checkpoint (v1) and the full
    state dict gathered by FSDP2's own full_tensor() after the step (v2, fused experts split per expert here);
    every box of the vllm destination equals the same bytes of those tensors;
  - refusals by name: fp32 sharded parameters against the bf16 checkpoint; a tied model under torch's
    parallelize_module (the tie is broken: lm_head.weight unexpected); a binding made before FSDP2's lazy init
    moved the tied parameter (publish refuses, nothing published);
  - what transformers and torch did (check_transformers_placements): the placements of the tied embedding, the
    packed experts, the router and the EP experts; the tied parameter managed by two FSDP2 groups, one of whose
    buffers goes stale after the step where the vocab chunk is short.

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


def _transformers_distribute(model, T, F, E):
    from fsdp_publisher import transformers_distribute  # transformers' own TP / EP / FSDP2 (see there)
    return transformers_distribute(model, T, F, E)


class _NoEndpoint:
    def publish(self, version):
        pass


def _fsdp_copies(model, param):
    """For each FSDP2 parameter group that manages `param` (FSDPParam.sharded_param is param): its module's name and
    whether the group's sharded buffer (what it all-gathers for the forward) holds param's local bytes."""
    import torch
    from torch.distributed.fsdp import FSDPModule
    out = []
    for name, m in model.named_modules():
        if isinstance(m, FSDPModule):
            for g in m._get_fsdp_state()._fsdp_param_groups:
                for fp in g.fsdp_params:
                    if fp.sharded_param is param:
                        lt = param._local_tensor
                        out.append([name or "(root)", torch.equal(fp._sharded_param_data[:lt.numel()].view_as(lt), lt)])
    return out


def _placements(model, names):
    """{name: [str(placement), ...] + mesh dim names} of the named parameters (what torch / transformers did)."""
    ps = dict(model.named_parameters())
    return {n: [repr(x) for x in ps[n].placements] + list(ps[n].device_mesh.mesh_dim_names or ())
            for n in names if n in ps}


def rank_main(a):
    """One gloo process of the world: runs the cases of a["runs"] one after the other (each its own job)."""
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a["port"]))
    dist.init_process_group("gloo", rank=a["rank"], world_size=a["world"])
    outs = [rank_run(dict(a, **run)) for run in a["runs"]]
    json.dump(outs, open(a["out"], "w"))
    dist.destroy_process_group()


def rank_run(a):
    import torch
    import torch.distributed as dist
    import refit
    import refit.fsdp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM
    R, F, T, E = a["rep"], a["shard"], a["tp"], a["ep"]
    out = {"rank": a["rank"]}
    model = AutoModelForCausalLM.from_pretrained(a["model"], dtype=torch.bfloat16)
    if a["plan"] == "transformers" and model.config.tie_word_embeddings:
        # torch's parallelize_module with the plan of the torch cases (TP_PLAN, lm_head colwise): it registers a
        # new parameter on lm_head, so the tie is gone - lm_head.weight vocab-parallel, embed_tokens.weight still
        # replicated - and the adapter refuses the model, naming both
        m2 = AutoModelForCausalLM.from_pretrained(a["model"], dtype=torch.bfloat16)
        mesh2 = init_device_mesh("cpu", (F, T), mesh_dim_names=("dp_shard", "tp"))
        _tp(m2, mesh2["tp"])
        out["torch_tie_kept"] = m2.lm_head.weight is m2.model.embed_tokens.weight
        for layer in m2.model.layers:
            fully_shard(layer, mesh=mesh2["dp_shard"])
        fully_shard(m2, mesh=mesh2["dp_shard"])
        try:
            refit.fsdp.dtensor(m2, refit.Model(a["model"]))
            out["torch_tied"] = "bound"
        except refit.adapters.AdapterError as e:
            out["torch_tied"] = str(e)
        del m2
    if a["plan"] == "transformers":
        model = _transformers_distribute(model, T, F, E)
        names = ["model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.experts.gate_up_proj",
                 "model.layers.0.mlp.experts.down_proj", "model.layers.0.mlp.gate.weight"]
        out["placements"] = _placements(model, names)
        out["tied"] = model.lm_head.weight is model.model.embed_tokens.weight
        early = refit.fsdp.dtensor(model, refit.Model(a["model"]))  # bound before FSDP2's lazy init
        if a["warm"]:  # FSDP2's lazy init (first forward) may move storage that was replaced after fully_shard
            from fsdp_publisher import warm
            warm(model)  # a forward, then reshard(): transformers' fsdp plan keeps its tail unsharded until backward
        try:  # refused (nothing published) if the lazy init moved a parameter's storage since `early` was bound
            early.publish(_NoEndpoint(), 1)
            out["early"] = "published"
        except refit.adapters.AdapterError as e:
            out["early"] = str(e)
    elif T > 1:
        mesh = init_device_mesh("cpu", (F, T), mesh_dim_names=("dp_shard", "tp"))
        _tp(model, mesh["tp"])
        dp = mesh["dp_shard"]
    elif R > 1:
        dp = init_device_mesh("cpu", (R, F), mesh_dim_names=("dp_replicate", "dp_shard"))
    else:
        dp = init_device_mesh("cpu", (F,), mesh_dim_names=("dp_shard",))
    if a["plan"] != "transformers":
        for layer in model.model.layers:
            fully_shard(layer, mesh=dp)
        fully_shard(model, mesh=dp)
    rmodel = refit.Model(a["model"])
    # refused by name: fp32 sharded storage (fp32 master weights) against the bf16 checkpoint
    if T == 1 and a["plan"] == "torch":
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
        if T > 1 and a["plan"] == "torch":
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
        if T > 1:  # the parameters tp replicates (1-d DTensors on the dp mesh) are still equal on every tp rank
            groups = [dist.new_group([g * T + t for t in range(T)]) for g in range(R * F)]
            out["tp_replicas_differ"] = []
            for n, p in model.named_parameters():
                if p.device_mesh.ndim == 1:
                    lt = p._local_tensor.float()  # exact for bf16; gloo all-gathers neither bf16 nor int16
                    peers = [torch.empty_like(lt) for _ in range(T)]
                    dist.all_gather(peers, lt, group=groups[a["rank"] // T])
                    if not all(torch.equal(q, peers[0]) for q in peers):
                        out["tp_replicas_differ"].append(n)
        if a["plan"] == "transformers" and model.config.tie_word_embeddings:
            out["tied_copies"] = _fsdp_copies(model, model.model.embed_tokens.weight)
        full = {n: p.full_tensor() for n, p in model.named_parameters()}  # a collective: every rank
        if a["rank"] == 0:
            torch.save(full, os.path.join(a["work"], f"{a['job']}-v2.pt"))
        dist.barrier()
        b.publish(pub, 2)
        pub.wait_acks(2, a["receivers"], 120000)
        pub.wait_readers(2, 120000)
    return out


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


# (checkpoint, dp_replicate, dp_shard, tp, ep, plan): plan "torch" = fully_shard per layer (+ torch's
# parallelize_module with TP_PLAN); "transformers" = transformers' own plans and fsdp plan (_transformers_distribute)
CASES = {"fsdp2-moe": ("moe", 1, 2, 1, 1, "torch"), "fsdp4-dense": ("dense", 1, 4, 1, 1, "torch"),
         "hsdp2x2-moe": ("moe", 2, 2, 1, 1, "torch"), "tp2xfsdp2-dense": ("untied", 1, 2, 2, 1, "torch"),
         "fsdp2-moe-520params": ("deep", 1, 2, 1, 1, "torch"),
         "tp2xfsdp2-tied-transformers": ("dense", 1, 2, 2, 1, "transformers"),
         "tp2xfsdp2-moe-transformers": ("moe", 1, 2, 2, 1, "transformers"),
         "ep2xfsdp2-moe-transformers": ("moe", 1, 2, 2, 2, "transformers"),
         # ep 2 over a 1-d fsdp 4 (tp 1): efsdp 2; transformers' from_pretrained refuses ep != tp (its
         # prepare_distribute_model), its maybe_distribute_model runs it
         "ep2-fsdp4-moe-transformers": ("moe", 1, 4, 1, 2, "transformers")}
# Cases of one world size run one after the other in the same processes (one process start and import for all)
GROUPS = {c: [c] for c in list(CASES)[:5]}
GROUPS["transformers-2x2-tied-moe-ep"] = [c for c in CASES if c.endswith("-transformers")]


@pytest.mark.parametrize("group", list(GROUPS))
def test_fully_shard_publishes(tmp_path, ckpts, group):
    cases = GROUPS[group]
    worlds = {CASES[c][1] * CASES[c][2] * CASES[c][3] for c in cases}
    assert len(worlds) == 1, worlds
    world, port = worlds.pop(), _port()
    dests = [("hf", 0), ("vllm:tp=2", 0), ("vllm:tp=2", 1)]
    runs = []
    for c in cases:
        kind, rep, shard, tp, ep, plan = CASES[c]
        runs.append({"rep": rep, "shard": shard, "tp": tp, "ep": ep, "plan": plan, "model": ckpts[kind],
                     "job": f"fsdp-{c}"})
    procs, outs = [], []
    for r in range(world):
        a = {"rank": r, "world": world, "runs": runs, "warm": os.environ.get("FSDP_TEST_WARM", "1") == "1",
             "port": port, "registry": f"file:{tmp_path}/reg", "work": str(tmp_path), "receivers": len(dests),
             "out": f"{tmp_path}/rank{r}.json"}
        outs.append(a["out"])
        procs.append(subprocess.Popen([sys.executable, __file__, json.dumps(a)], env=dict(os.environ)))
    ok = False
    try:
        for run in runs:
            receive_and_compare(tmp_path, run, dests, procs, world)
        ok = True
    finally:
        if not ok:  # do not leave the ranks waiting for acks that will not come
            for p in procs:
                p.kill()
        rcs = [p.wait(timeout=300) for p in procs]
    assert rcs == [0] * world, rcs
    res = [json.load(open(o)) for o in outs]
    for i, c in enumerate(cases):
        check_ranks(c, [r[i] for r in res], world)


def receive_and_compare(tmp_path, run, dests, procs, world):
    """Receivers of `dests` in this process pull versions 1 and 2 of run["job"]; every byte compared with the
    checkpoint (v1) and with the state rank 0 gathered with full_tensor() after the step (v2)."""
    import torch
    from safetensors.torch import load_file
    import refit
    model_dir, job = run["model"], run["job"]
    rmodel = refit.Model(model_dir)
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


def check_ranks(case, res, world):
    kind, rep, shard, tp, ep, plan = CASES[case]
    want_layout = f"dtensor:dp_shard={shard},dp_replicate={rep},tp={tp}{f',ep={ep}' if ep > 1 else ''},experts=fused"
    assert sorted(r["layout_rank"] for r in res) == list(range(world)), res
    for r in res:
        assert r["layout"] == want_layout, r
        assert r["not_own_storage"] == [] and r["moved"] == [] and r["regions"] > 0, r
        if kind == "deep":  # 520 parameters: 510 zero-copy regions and one of the 10 smallest, copied (q/k norms)
            assert r["params"] == 520 and r["regions"] == 511 and len(r["copied"]) == 10, r
            assert all(n.endswith(("q_norm.weight", "k_norm.weight")) for n in r["copied"]), r["copied"]
        else:
            assert r["copied"] == [] and r["regions"] == r["params"], r
        if tp > 1:  # q/k norms (and the MoE router) after the step: summed gradients keep the replicas equal
            assert r["tp_replicas_differ"] == [], r["tp_replicas_differ"]
        if tp == 1 and plan == "torch":
            assert "mis-shaped or wrong dtype" in r["fp32"] and "model.embed_tokens.weight: f32" in r["fp32"], r["fp32"]
    if plan == "transformers":
        check_transformers_placements(case, res)


# What transformers 5.19 + torch 2.13 did, per case (docs/layouts.md, the dtensor section).
STRIDED_TP, SHARD_TP = "_StridedShard(dim=0, sf=2)", "Shard(dim=0)"


def check_transformers_placements(case, res):
    for r in res:
        pl = r["placements"]
        if case == "tp2xfsdp2-tied-transformers":
            # the config adds embed_tokens "embedding_rowwise" when tied: the one parameter is vocab-parallel
            # (Shard(0) over tp) like lm_head, and from_pretrained's tie_weights keeps it one parameter
            assert r["tied"] and pl["model.embed_tokens.weight"] == [STRIDED_TP, SHARD_TP, "fsdp", "tp"], r
            assert r["torch_tie_kept"] is False, r
            assert "unexpected (1): lm_head.weight" in r["torch_tied"], r["torch_tied"]
            assert "mis-shaped or wrong dtype (1):\n    model.embed_tokens.weight: " in r["torch_tied"], r["torch_tied"]
            # FSDP2 manages the tied parameter twice: in the (embed_tokens, norm) group of transformers' fsdp plan and
            # in the root's (as lm_head.weight, tied after fully_shard).  Where the vocab chunk is short (250 rows:
            # 63 and 62 per tp rank, ranks 2 and 3), the root's lazy init copies it into a new padded buffer and
            # moves the parameter there: a binding made before the first forward is refused (moved) ...
            short = r["rank"] // 2 == 1
            assert (r["early"] == "published") != short, r["early"]
            assert short <= ("model.embed_tokens.weight: the sharded storage moved" in r["early"]), r["early"]
            # ... and after the optimizer step the other group's buffer no longer holds the parameter's bytes (the
            # buffer it all-gathers for the forward is stale); refit publishes the parameter's own (= full_tensor())
            assert [c for c in r["tied_copies"] if c[0] != "model.norm"] == \
                [["(root)", not short], ["model.embed_tokens", True]], r["tied_copies"]
        else:
            assert r["early"] == "published", r["early"]  # nothing replaced after fully_shard: nothing moves
        if case == "tp2xfsdp2-moe-transformers":
            # packed_colwise: _StridedShard(1, 2) over tp (gate chunk t, up chunk t); FSDP2's Shard(0) of the experts
            assert pl["model.layers.0.mlp.experts.gate_up_proj"] == \
                [SHARD_TP, "_StridedShard(dim=1, sf=2)", "fsdp", "tp"], r
            assert pl["model.layers.0.mlp.experts.down_proj"] == [SHARD_TP, "Shard(dim=2)", "fsdp", "tp"], r
            assert pl["model.layers.0.mlp.gate.weight"] == [SHARD_TP, "fsdp"], r  # the router: replicated over tp
            assert pl["model.embed_tokens.weight"] == [SHARD_TP, "fsdp"], r  # untied: no embedding rule
            assert pl["lm_head.weight"] == [STRIDED_TP, SHARD_TP, "fsdp", "tp"], r
        elif case in ("ep2xfsdp2-moe-transformers", "ep2-fsdp4-moe-transformers"):
            # grouped_gemm: Shard(0) over ep; FSDP2 over efsdp: _StridedShard(0, ep)
            for n in ("gate_up_proj", "down_proj"):
                assert pl[f"model.layers.0.mlp.experts.{n}"] == [STRIDED_TP, SHARD_TP, "efsdp", "ep"], r


if __name__ == "__main__":
    rank_main(json.loads(sys.argv[1]))
