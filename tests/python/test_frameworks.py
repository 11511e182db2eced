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
    nemo_trainer_main(a) if a.get("nemo") else actor_main(a)
