"""A veRL checkpoint engine named "refit" (verl.checkpoint_engine: CheckpointEngine, CheckpointEngineRegistry).

Switched on by configuration, with nothing to import by hand:

    actor_rollout_ref.rollout.checkpoint_engine.backend=refit
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=refit.verl_engine
    actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.refit.registry=redis://10.0.0.5:6379
    actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.refit.job=grpo-7
    actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.refit.model=/ckpt/Qwen3-30B-A3B   # its config.json

veRL imports custom_backend_module in the actor and rollout workers and in its CheckpointEngineManager before it
asks CheckpointEngineRegistry for the backend; importing this module registers RefitCheckpointEngine under "refit".

What veRL hands an engine (checked in verl 0.9.1): on the actor side, send_weights(weights) with a generator of
(Hugging Face name, full tensor) pairs from the training engine's get_per_tensor_param() on every actor rank (the
gather happens inside that generator); on the rollout side, receive_weights() must yield (name, tensor) pairs that
the server adapter loads into the inference engine (vLLM's / SGLang's load_weights).  Within that contract refit
is the transport: the master actor rank (is_master, torch rank 0) copies each tensor once into an arena laid out
as refit's `hf` layout of the model and publishes it as version global_steps; every rollout worker pulls that
version into an arena of its own (shm on one host, UCX across hosts; planned once, verified by content digests)
and yields views of it, no copy.  The other actor ranks drain the generator (it runs collectives) and send
nothing.  Every canonical tensor of the model must arrive exactly once with its dtype and shape, or send_weights
raises naming the tensors and publishes nothing.

Local shards, no gather (issue #33, docs/fsdp.md): send_weights also takes the training engine itself - what veRL
0.9.1 hands its own "delta_sharded" engine (`send_weights(self.actor.engine, ...)` in engine_workers.py) - or the
FSDP2 module.  Then every actor rank (master or not) binds its FSDP2 shards with refit.fsdp.dtensor (the
parameters' own sharded storage, no copy) once, and publishes its rank of the `dtensor` layout; the rollout side
is unchanged (its `hf` arena is filled from all the actor ranks' shards, each byte once).  veRL 0.9.1 hands a
backend other than "delta_sharded" the gathered generator, so this path needs the worker to pass its engine (a
one-line change in ActorRolloutRefWorker.update_weights, or a subclass); refit does not patch veRL.
"""
import asyncio
import time
from typing import Any, Optional

from .core import DataError, Layout, Model, Publisher, Receiver, torch_dtype, _arg_error

try:  # the real base class and registry when veRL is installed
    from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
    HAVE_VERL = True
except ImportError:  # importable without veRL (docs, tests of the engine alone)
    HAVE_VERL = False

    class CheckpointEngine:  # type: ignore[no-redef]
        wire_format = "named_tensors"

    class CheckpointEngineRegistry:  # type: ignore[no-redef]
        _registry: dict = {}

        def register(backend):
            def wrapper(cls):
                CheckpointEngineRegistry._registry[backend] = cls
                return cls
            return wrapper

BACKEND_NAME = "refit"


def _fsdp_module(weights):
    """The FSDP2 (fully_shard) module behind what send_weights was handed, or None for an iterable of tensors:
    an nn.Module, or a training engine holding one in .module (veRL's FSDP engine).  FSDP1 is refused by name."""
    try:
        import torch
    except ImportError:
        return None
    mod = weights if isinstance(weights, torch.nn.Module) else getattr(weights, "module", None)
    if not isinstance(mod, torch.nn.Module):
        return None
    from torch.distributed.fsdp import FSDPModule
    if isinstance(mod, FSDPModule) or any(isinstance(m, FSDPModule) for m in mod.modules()):
        return mod
    raise _arg_error(f"send_weights got a {type(weights).__name__} whose module ({type(mod).__name__}) is not "
                     "sharded by FSDP2's fully_shard (FSDP1 and unsharded modules: hand the gathered generator "
                     "instead)", "send_weights")


async def _aiter(it):
    if hasattr(it, "__aiter__"):
        async for x in it:
            yield x
    else:
        for x in it:
            yield x


@CheckpointEngineRegistry.register(BACKEND_NAME)
class RefitCheckpointEngine(CheckpointEngine):
    """engine_kwargs: registry (required), job (required), model (a config.json directory or a built-in refit
    model name, required), group ("verl"), transports, transport_options, timeout_ms (60000), secret_file."""

    wire_format = "named_tensors"

    def __init__(self, bucket_size: int = 0, is_master: bool = False, *, registry: str = None, job: str = None,
                 model: str = None, group: str = "verl", transports: str = None, transport_options: str = None,
                 timeout_ms: int = 60000, secret_file: str = None, **unused):
        missing = [k for k, v in (("registry", registry), ("job", job), ("model", model)) if not v]
        if missing:
            raise _arg_error("the refit checkpoint engine needs engine_kwargs.refit." + ", .".join(missing),
                             "RefitCheckpointEngine")
        self.bucket_size, self.is_master = bucket_size, is_master
        self.opts = dict(registry=registry, job=job, group=group, transports=transports,
                         transport_options=transport_options, secret_file=secret_file)
        self.model_ref, self.timeout_ms = model, timeout_ms
        self.role: Optional[str] = None
        self.rank = 0
        self._model: Optional[Model] = None
        self._pub: Optional[Publisher] = None
        self._rx: Optional[Receiver] = None
        self._views: dict = {}
        self._binding = None  # refit.fsdp.FsdpBinding when publishing local shards
        self._addresses: dict = {}
        self._published = 0
        self.metrics: dict = {}

    # -- topology (veRL's CheckpointEngineManager: prepare on every worker, build_topology once, then
    #    init_process_group on every worker with its slice of the topology)

    def prepare(self) -> dict[str, Any]:
        return {"backend": BACKEND_NAME, "is_master": bool(self.is_master), "job": self.opts["job"]}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list):
        """Actor workers come first in `metadata`.  The master actor rank publishes; rollout workers receive; no
        process group is formed (the registry is the rendezvous)."""
        actor_meta = metadata[:actor_wg_world_size]
        masters = [i for i, m in enumerate(actor_meta) if m and m.get("is_master")]
        pub = masters[0] if masters else 0
        actor = {"role": ["publisher" if i == pub else "drain" for i in range(actor_wg_world_size)],
                 "rank": list(range(actor_wg_world_size))}
        rollout = {"role": ["receiver"] * rollout_world_size, "rank": list(range(rollout_world_size))}
        return actor, rollout

    def init_process_group(self, role: str = None, rank: int = 0, **unused):
        if role not in ("publisher", "drain", "receiver"):
            raise _arg_error(f"unknown role {role!r} for the refit checkpoint engine", "init_process_group")
        self.role, self.rank = role, rank

    def finalize(self):
        """Publisher and receiver stay up between steps (the plan is reused); nothing to free per step."""

    def shutdown(self):
        for ep in (self._pub, self._rx):
            if ep is not None:
                ep.close()
        self._pub = self._rx = None

    # -- the data path

    def _refit_model(self) -> Model:
        if self._model is None:
            self._model = Model(self.model_ref)
        return self._model

    def _endpoint(self, cls):
        import torch
        m = Layout("hf").manifest(self._refit_model(), 0)
        ep = cls(m, **self.opts)
        ep.alloc(0)
        self._views = {n: t for n, t in ep.tensors().items()}
        assert all(isinstance(t, torch.Tensor) for t in self._views.values())
        return ep

    def _next_version(self, global_steps):
        version = int(global_steps) if global_steps is not None else self._published + 1
        if version <= self._published:
            raise _arg_error(f"global_steps {version} is not newer than the last published version "
                             f"{self._published}", "send_weights")
        return version

    async def _send_shards(self, module, global_steps):
        """Every actor rank: publish this rank's FSDP2 shards in place (the dtensor layout), no gather, no copy."""
        from .fsdp import dtensor
        t0 = time.perf_counter()
        if self._pub is not None and self._binding is None:
            raise _arg_error("this refit checkpoint engine already publishes gathered tensors (hf layout); it cannot "
                             "switch to local shards", "send_weights")
        if self._binding is None:
            b = dtensor(module, self._refit_model())
            pub = Publisher(b.manifest, **self.opts)
            b.attach(pub)
            self._binding, self._pub, self._addresses = b, pub, b.addresses()
        version = self._next_version(global_steps)
        moved = [n for n, a in self._binding.addresses().items() if a != self._addresses.get(n)]
        if moved:  # FSDP2 replaced the sharded storage (reset_sharded_param: model.to(), load_state_dict ...)
            raise DataError(-20, f"send_weights(version {version}): nothing published: the sharded storage of "
                                 f"{len(moved)} parameters moved since it was bound ({', '.join(moved[:5])}); "
                                 "start a new engine to bind again", "send_weights")
        if self._published:
            # the caller has already stepped the optimizer, in place: readers of the last version must be done
            # before that (wait_readers(last) ahead of optimizer.step()); here it is checked once more
            await asyncio.to_thread(self._pub.wait_readers, self._published, self.timeout_ms)
        t1 = time.perf_counter()
        copied = self._binding.sync()  # only a rank of more parameters than regions copies (its smallest ones)
        t2 = time.perf_counter()
        self._pub.publish(version)
        self._published = version
        self.metrics = {"refit/version": version, "refit/bytes": sum(r.numel() for r in self._binding.regions),
                        "refit/layout": self._binding.layout, "refit/layout_rank": self._binding.rank,
                        "refit/copied_bytes": copied, "refit/copy_s": t2 - t1 if copied else 0.0,
                        "refit/bind_s": t1 - t0, "refit/publish_s": time.perf_counter() - t2}
        return dict(self.metrics)

    def wait_readers(self, timeout_ms: Optional[int] = None):
        """Local shards: blocks until the readers of the last published version are done (call before the
        optimizer step that overwrites the shards in place)."""
        if self._pub is not None and self._published:
            self._pub.wait_readers(self._published, timeout_ms or self.timeout_ms)

    async def send_weights(self, weights, global_steps: Optional[int] = None):
        module = _fsdp_module(weights)
        if module is not None:
            return await self._send_shards(module, global_steps)
        role = self.role or ("publisher" if self.is_master else "drain")
        t0 = time.perf_counter()
        if role != "publisher":
            async for _ in _aiter(weights):
                pass
            return {}
        if self._binding is not None:
            raise _arg_error("this refit checkpoint engine publishes local shards; it cannot switch to gathered "
                             "tensors", "send_weights")
        if self._pub is None:
            self._pub = self._endpoint(Publisher)
        version = self._next_version(global_steps)
        if self._published:
            # in-place: the arena is what receivers read; wait until the last version's readers are done
            await asyncio.to_thread(self._pub.wait_readers, self._published, self.timeout_ms)
        seen, problems, nbytes = set(), [], 0
        async for name, t in _aiter(weights):
            dst = self._views.get(name)
            if dst is None:
                problems.append(f"{name}: not a tensor of {self._refit_model().name}")
            elif name in seen:
                problems.append(f"{name}: sent twice")
            elif tuple(t.shape) != tuple(dst.shape) or t.dtype != dst.dtype:
                problems.append(f"{name}: {t.dtype} {list(t.shape)}, the model has {dst.dtype} {list(dst.shape)}")
            else:
                dst.copy_(t, non_blocking=False)
                nbytes += t.numel() * t.element_size()
            seen.add(name)
        lacking = [n for n in self._views if n not in seen]
        if lacking:
            problems.append(f"not sent ({len(lacking)}): " + ", ".join(lacking[:10]) + (" ..." if len(lacking) > 10
                                                                                         else ""))
        if problems:
            raise DataError(-20, f"send_weights(version {version}) of {self._refit_model().name}: nothing published: "
                                  + "; ".join(problems[:20]), "send_weights")
        t1 = time.perf_counter()
        self._pub.publish(version)
        self._published = version
        self.metrics = {"refit/version": version, "refit/bytes": nbytes, "refit/copy_s": t1 - t0,
                        "refit/publish_s": time.perf_counter() - t1}
        return dict(self.metrics)

    async def receive_weights(self, global_steps: Optional[int] = None):
        if self._rx is None:
            self._rx = self._endpoint(Receiver)
        version = int(global_steps) if global_steps is not None else None
        rep = await asyncio.to_thread(self._rx.pull, version, self.timeout_ms)
        self.metrics = {"refit/version": rep.version, "refit/bytes": rep.bytes, "refit/sources": rep.sources,
                        "refit/transfer_ms": rep.transfer_ms,
                        "refit/total_ms": rep.total_ms, "refit/transport": rep.transport}
        for name, t in self._views.items():
            yield name, t


__all__ = ["RefitCheckpointEngine", "BACKEND_NAME", "HAVE_VERL"]
