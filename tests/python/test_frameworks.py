"""Framework adapters: refit's veRL checkpoint engine against the real `verl` package (verl 0.9.1 from PyPI,
installed --no-deps with the few packages verl.checkpoint_engine imports), and the NeMo-RL style synchronizer
with a stand-in controller (NeMo-RL is not installable from PyPI).

veRL: the engine is found the way veRL finds a custom engine (verl.utils.import_utils.import_external_libs on
custom_backend_module, then CheckpointEngineRegistry.new(backend, is_master=..., bucket_size=..., **engine_kwargs)),
is a subclass of verl's CheckpointEngine with every abstract method implemented, and is driven in the order
veRL's CheckpointEngineManager drives engines (prepare on every worker, build_topology, init_process_group with each
worker's slice, send_weights on every actor rank / receive_weights on every rollout worker, finalize); the tensors
the rollout yields equal the checkpoint's byte for byte, for two versions.  Refused with a clear error: a tensor
missing, one of the wrong shape, a rollout started before any trainer.

veRL with local shards (issue #33): two real torch processes shard the model with FSDP2's fully_shard over gloo;
on each, refit's engine (made by veRL's registry, topology from its build_topology) is handed what veRL hands its
own delta_sharded engine - the training engine, here a stand-in object holding the fully_shard-ed module in
.module, because veRL's FSDPEngine cannot be imported in this venv (verl is installed --no-deps and
verl.workers.engine.fsdp needs peft) - and publishes its own shards (no gather, no copy) for version 3 and,
after a real forward/backward/AdamW step, version 4; the rollout engine's receive_weights yields tensors equal
byte for byte to the checkpoint and to FSDP2's own full_tensor() of the stepped model.
"""
import asyncio
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)


def _ckpt_tensors(path, bump=0.0):
    import torch
    from safetensors.torch import load_file
    t = load_file(os.path.join(path, "model.safetensors"))
    import refit
    canon = {x.name for x in refit.Model(path).tensors()}
    # transformers 5 may save fused experts; the canonical (per-expert) names are what veRL's engines yield
    assert canon <= set(t), sorted(canon - set(t))[:5]
    return {n: (t[n] + bump).to(t[n].dtype) if bump else t[n] for n in sorted(canon)}


def _engines_topology(cls, n_actor, n_rollout, engines):
    meta = [e.prepare() for e in engines]
    actor_kw, rollout_kw = cls.build_topology(n_actor, n_rollout, meta)
    for i, e in enumerate(engines[:n_actor]):
        e.init_process_group(**{k: v[i] for k, v in actor_kw.items()})
    for i, e in enumerate(engines[n_actor:]):
        e.init_process_group(**{k: v[i] for k, v in rollout_kw.items()})


def actor_main(args):
    """Two actor ranks (torch rank 0 is veRL's is_master) sending two versions."""
    import refit.verl_engine  # noqa: F401  (what custom_backend_module does)
    from verl.checkpoint_engine.base import CheckpointEngineRegistry
    kw = dict(registry=args["registry"], job=args["job"], model=args["model"], timeout_ms=60000)
    engines = [CheckpointEngineRegistry.new("refit", is_master=(r == 0), bucket_size=1 << 20, **kw) for r in range(2)]
    cls = type(engines[0])
    _engines_topology(cls, 2, 0, engines)

    async def run():
        for v, bump in ((3, 0.0), (4, 0.5)):
            tensors = _ckpt_tensors(args["model"], bump)
            m = await asyncio.gather(*[e.send_weights(iter(tensors.items()), global_steps=v) for e in engines])
            assert m[0]["refit/version"] == v and m[1] == {}, m
            engines[0]._pub.wait_acks(v, 1, 60000)
        for e in engines:
            e.finalize()
    asyncio.run(run())
    engines[0]._pub.wait_readers(4, 60000)
    for e in engines:
        e.shutdown()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    import vllm_models
    d = tmp_path_factory.mktemp("fw")
    return vllm_models.write(vllm_models.MOE, str(d / "tiny-qwen3-moe"), 1)


def test_verl_registry_and_base_class(ckpt, tmp_path):
    import verl.checkpoint_engine.base as vb
    from verl.utils.import_utils import import_external_libs
    import_external_libs("refit.verl_engine")  # veRL's loader for checkpoint_engine.custom_backend_module
    cls = vb.CheckpointEngineRegistry.get("refit")
    import refit.verl_engine as ve
    assert cls is ve.RefitCheckpointEngine and ve.HAVE_VERL
    assert issubclass(cls, vb.CheckpointEngine) and not getattr(cls, "__abstractmethods__", None)
    e = vb.CheckpointEngineRegistry.new("refit", is_master=True, bucket_size=1 << 20, registry=f"file:{tmp_path}",
                                        job="j", model=ckpt)
    assert isinstance(e, vb.CheckpointEngine) and e.wire_format == "named_tensors"
    with pytest.raises(Exception, match="engine_kwargs.refit.registry"):
        vb.CheckpointEngineRegistry.new("refit", is_master=True, bucket_size=1 << 20, job="j", model=ckpt)


def test_verl_roundtrip(ckpt, tmp_path):
    import torch
    import refit
    import refit.verl_engine  # noqa: F401
    from verl.checkpoint_engine.base import CheckpointEngineRegistry
    reg = f"file:{tmp_path}/reg"
    args = {"registry": reg, "job": "verl", "model": ckpt}
    # the rollout before any trainer: a clear timeout, nothing yielded
    early = CheckpointEngineRegistry.new("refit", bucket_size=1 << 20, registry=reg, job="verl", model=ckpt,
                                         timeout_ms=1500)
    _engines_topology(type(early), 0, 1, [early])

    async def drain(e, v):
        return {n: t.clone() async for n, t in e.receive_weights(global_steps=v)}
    with pytest.raises(refit.RefitError, match="TIMEOUT"):
        asyncio.run(drain(early, 3))
    early.shutdown()

    actor = subprocess.Popen([sys.executable, __file__, json.dumps(args)])
    try:
        rx = CheckpointEngineRegistry.new("refit", bucket_size=1 << 20, registry=reg, job="verl", model=ckpt,
                                          timeout_ms=120000)
        _engines_topology(type(rx), 0, 1, [rx])
        for v, bump in ((3, 0.0), (4, 0.5)):
            got = asyncio.run(drain(rx, v))
            want = _ckpt_tensors(ckpt, bump)
            assert set(got) == set(want)
            bad = [n for n in want if not torch.equal(got[n].view(torch.uint8), want[n].contiguous().view(torch.uint8))]
            assert not bad, bad[:5]
            assert rx.metrics["refit/version"] == v
            rx.finalize()
        rx.shutdown()
    finally:
        assert actor.wait(timeout=180) == 0


def fsdp_actor_main(a):
    """One veRL actor rank with FSDP2 shards (see the module docstring)."""
    import types
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM
    import refit.verl_engine  # noqa: F401
    from verl.checkpoint_engine.base import CheckpointEngineRegistry
    rank = a["rank"]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a["port"]))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))
    model = AutoModelForCausalLM.from_pretrained(a["model"], dtype=torch.bfloat16)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    e = CheckpointEngineRegistry.new("refit", is_master=(rank == 0), bucket_size=1 << 20, registry=a["registry"],
                                     job=a["job"], model=a["model"], timeout_ms=120000)
    meta = [{"backend": "refit", "is_master": r == 0, "job": a["job"]} for r in range(2)]
    meta[rank] = e.prepare()
    actor_kw, _ = type(e).build_topology(2, 1, meta)
    e.init_process_group(**{k: v[rank] for k, v in actor_kw.items()})
    engine = types.SimpleNamespace(module=model)  # stand-in for veRL's FSDPEngine (see the module docstring)
    out = {"rank": rank, "role": e.role}

    async def run():
        out["m3"] = await e.send_weights(engine, global_steps=3)
        e._pub.wait_acks(3, 1, 120000)
        e.wait_readers()  # before the step overwrites the shards in place
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(7))
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        full = {n: p.full_tensor() for n, p in model.named_parameters()}  # a collective: FSDP2's own gather
        if rank == 0:
            torch.save(full, os.path.join(a["work"], "v4.pt"))
        dist.barrier()
        out["m4"] = await e.send_weights(engine, global_steps=4)
        e._pub.wait_acks(4, 1, 120000)
        try:
            await e.send_weights(engine, global_steps=4)
        except Exception as err:
            out["again"] = str(err)
    asyncio.run(run())
    b = e._binding
    out["own_storage"] = all(reg.data_ptr() == p._local_tensor.untyped_storage().data_ptr()
                             for (n, p), reg in zip(b.params.items(), b.regions))
    e._pub.wait_readers(4, 120000)
    e.shutdown()
    json.dump(out, open(a["out"], "w"))
    dist.destroy_process_group()


def test_verl_fsdp_local_shards(ckpt, tmp_path):
    import socket
    import torch
    import refit
    import refit.verl_engine as ve
    from verl.checkpoint_engine.base import CheckpointEngineRegistry
    from test_fsdp import canonical_of
    with pytest.raises(Exception, match="not sharded by FSDP2"):  # an unsharded module: refused by name
        ve._fsdp_module(torch.nn.Linear(2, 2))
    reg, job = f"file:{tmp_path}/reg", "verl-fsdp"
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    procs = []
    for r in range(2):
        a = {"fsdp": True, "rank": r, "port": port, "registry": reg, "job": job, "model": ckpt, "work": str(tmp_path),
             "out": f"{tmp_path}/rank{r}.json"}
        procs.append(subprocess.Popen([sys.executable, __file__, json.dumps(a)]))
    ok = False
    try:
        rx = CheckpointEngineRegistry.new("refit", bucket_size=1 << 20, registry=reg, job=job, model=ckpt,
                                          timeout_ms=120000)
        _engines_topology(type(rx), 0, 1, [rx])

        async def drain(v):
            return {n: t.clone() async for n, t in rx.receive_weights(global_steps=v)}
        rmodel = refit.Model(ckpt)
        for v in (3, 4):
            got = asyncio.run(drain(v))
            want = _ckpt_tensors(ckpt) if v == 3 else canonical_of(torch.load(f"{tmp_path}/v4.pt"), rmodel)
            assert set(got) == set(want)
            bad = [n for n in want if not torch.equal(got[n].view(torch.uint8), want[n].contiguous().view(torch.uint8))]
            assert not bad, (v, bad[:5])
            assert rx.metrics["refit/version"] == v and rx.metrics["refit/sources"] == 2, rx.metrics
            if v == 4:
                v3 = _ckpt_tensors(ckpt)
                assert sum(torch.equal(got[n], v3[n]) for n in want) < len(want) // 2  # the step changed them
            rx.finalize()
        rx.shutdown()
        ok = True
    finally:
        if not ok:
            for p in procs:
                p.kill()
        rcs = [p.wait(timeout=300) for p in procs]
    assert rcs == [0, 0], rcs
    outs = [json.load(open(f"{tmp_path}/rank{r}.json")) for r in range(2)]
    assert [o["role"] for o in outs] == ["publisher", "drain"], outs  # veRL's roles; both publish their shards
    for r, o in enumerate(outs):
        assert o["own_storage"], o
        for k in ("m3", "m4"):
            assert o[k]["refit/layout"] == "dtensor:dp_shard=2,dp_replicate=1,tp=1,experts=fused", o
            assert o[k]["refit/layout_rank"] == r and o[k]["refit/copied_bytes"] == 0 and o[k]["refit/bytes"] > 0, o
        assert "not newer than the last published version 4" in o["again"], o
    total = sum(t.numel() * t.element_size() for t in _ckpt_tensors(ckpt).values())
    assert outs[0]["m3"]["refit/bytes"] + outs[1]["m3"]["refit/bytes"] == total  # each byte once, no gather


def test_verl_refuses_incomplete_or_misshaped(ckpt, tmp_path):
    import torch
    import refit
    import refit.verl_engine  # noqa: F401
    from verl.checkpoint_engine.base import CheckpointEngineRegistry
    e = CheckpointEngineRegistry.new("refit", is_master=True, bucket_size=1 << 20, registry=f"file:{tmp_path}/r",
                                     job="bad", model=ckpt)
    _engines_topology(type(e), 1, 0, [e])
    t = _ckpt_tensors(ckpt)
    first = sorted(t)[0]
    short = {n: x for n, x in t.items() if n != first}
    with pytest.raises(refit.RefitError, match=f"not sent .*{first}"):
        asyncio.run(e.send_weights(iter(short.items()), global_steps=1))
    wrong = dict(t)
    wrong[first] = torch.zeros(3, 3, dtype=t[first].dtype)
    with pytest.raises(refit.RefitError, match=f"{first}: .*\\[3, 3\\], the model has"):
        asyncio.run(e.send_weights(iter(wrong.items()), global_steps=1))
    assert e._published == 0
    e.shutdown()


# ---------------------------------------------------------------- NeMo-RL style synchronizer (stand-in controller)


def nemo_trainer_main(args):
    import torch
    import refit
    from refit.nemo_rl import RefitWeightSynchronizer
    model = refit.Model(args["model"])
    tensors = _ckpt_tensors(args["model"])
    params = {n: torch.nn.Parameter(t.clone(), requires_grad=False) for n, t in tensors.items()}
    b = refit.adapters.bind_layout(params, model, "hf", 0)
    s = RefitWeightSynchronizer(args["registry"], "nemo")
    s.init_communicator("trainer", binding=b)
    for v in (1, 2):
        if v == 2:
            with torch.no_grad():
                for p in params.values():
                    p.add_(1.0)
        s.sync_weights(v)
        assert not s.is_stale(v) and s.is_stale(v + 1)
        s._ep.wait_acks(v, 1, 60000)
    s._ep.wait_readers(2, 60000)
    s.shutdown()


def test_nemo_rl_synchronizer(ckpt, tmp_path):
    import torch
    import refit
    from refit.nemo_rl import RefitWeightSynchronizer
    reg = f"file:{tmp_path}/reg"
    model = refit.Model(ckpt)
    want = _ckpt_tensors(ckpt)
    params = {n: torch.nn.Parameter(torch.zeros_like(t), requires_grad=False) for n, t in want.items()}
    b = refit.adapters.bind_layout(params, model, "hf", 0)
    s = RefitWeightSynchronizer(reg, "nemo", timeout_ms=1500)
    with pytest.raises(refit.RefitError, match="init_communicator first"):
        s.sync_weights(1)
    s.init_communicator("rollout", binding=b)
    assert s.is_stale(1)
    with pytest.raises(refit.RefitError, match="TIMEOUT"):  # a rollout before any trainer
        s.sync_weights(1)
    assert all(torch.count_nonzero(p) == 0 for p in params.values())  # nothing written
    s.timeout_ms = 120000
    tr = subprocess.Popen([sys.executable, __file__, json.dumps({"registry": reg, "model": ckpt, "nemo": True})])
    try:
        for v, bump in ((1, 0.0), (2, 1.0)):
            r = s.sync_weights(v)
            assert r["version"] == v and not s.is_stale(v)
            for n, t in want.items():
                assert torch.equal(params[n].detach(), (t + bump).to(t.dtype)), n
    finally:
        assert tr.wait(timeout=180) == 0
    s.shutdown()


def test_refit_errors_cross_process_boundaries():
    """Ray (and multiprocessing) pickle exceptions: a refit error must arrive with its own status and text (it
    used to arrive re-wrapped as REFIT_ERR_UNSUPPORTED: REFIT_ERR_TIMEOUT: ...)."""
    import pickle
    from refit.adapters import AdapterError
    from refit import DataError, RefitTimeout
    from refit.vllm.errors import RefitVllmDataError, RefitVllmError, RefitVllmTimeout
    # A RefitVllmError is also of its status's family class (a timeout is a RefitTimeout), before and after pickling.
    e = pickle.loads(pickle.dumps(RefitVllmError("update to version 3 failed", "update_weights", -42)))
    assert type(e) is RefitVllmTimeout and e.status == -42 and str(e).startswith("REFIT_ERR_TIMEOUT: update to")
    assert isinstance(e, RefitVllmError) and isinstance(e, RefitTimeout)
    m = pickle.loads(pickle.dumps(RefitVllmError("bad shape", "update_weights", -20)))
    assert type(m) is RefitVllmDataError and isinstance(m, DataError) and m.name == "REFIT_ERR_MISMATCH"
    a = pickle.loads(pickle.dumps(AdapterError("x", ["m"], ["u"], [])))
    assert a.missing == ["m"] and a.unexpected == ["u"] and "missing (1): m" in str(a)


if __name__ == "__main__":
    a = json.loads(sys.argv[1])
    if a.get("nemo"):
        nemo_trainer_main(a)
    elif a.get("fsdp"):
        fsdp_actor_main(a)
    else:
        actor_main(a)
