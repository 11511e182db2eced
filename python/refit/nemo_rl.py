"""A NeMo-RL style weight synchronizer over refit: init_communicator / sync_weights / is_stale / shutdown.

NeMo-RL is not installable from PyPI (the `nemo-rl` name there is a 0.0.0 placeholder), so this class follows the
interface NeMo-RL's weight synchronization is described by, and is tested with a stand-in controller
(tests/python/test_frameworks.py), not against NeMo-RL itself.

One object per process, in one of two roles:

    trainer (each Megatron rank):
        sync = RefitWeightSynchronizer(registry="redis://10.0.0.5:6379", job="grpo-7")
        sync.init_communicator("trainer", binding=refit.adapters.megatron(model.named_parameters(), rmodel,
                                                                          "megatron:tp=2,ep=2", rank))
        ... train step ...
        sync.sync_weights(step)           # waits for the last version's readers, then publishes `step`

    rollout (a vLLM engine with weight_transfer_config={"backend": "refit"}, or any bound model):
        sync.init_communicator("rollout", llm=llm)                 # or binding=refit.adapters.hf(...)
        if sync.is_stale(step): sync.sync_weights(step)            # refit to `step`; raises and keeps the
                                                                   # previous weights on failure

The trainer's parameters are the published memory (zero copy, refit.adapters); the rollout pulls only its own
slices.  sync_weights returns a dict of timings; failures raise refit.RefitError (or vLLM's error, which names the
failing worker ranks) and leave the rollout on its last good version.
"""
import time
from typing import Optional

from .core import Publisher, Receiver, RefitError, _arg_error


class RefitWeightSynchronizer:
    def __init__(self, registry: str, job: str, *, group: str = "trainer", timeout_ms: int = 60000, **endpoint_opts):
        self.registry, self.job, self.group, self.timeout_ms = registry, job, group, timeout_ms
        self.opts = endpoint_opts
        self.role: Optional[str] = None
        self.version = 0  # trainer: last published; rollout: last applied
        self._ep = None
        self._llm = None

    def init_communicator(self, role: str, *, binding=None, llm=None):
        """role "trainer" with a refit.adapters Binding of this rank's parameters; role "rollout" with a vLLM LLM
        (its refit backend is initialized here) or a Binding of the rollout model's parameters."""
        if self.role is not None:
            raise _arg_error(f"init_communicator: already initialized as {self.role}", "init_communicator")
        if role == "trainer":
            if binding is None:
                raise _arg_error("a trainer needs binding= (refit.adapters.megatron(...))", "init_communicator")
            self._ep = Publisher(binding.manifest, registry=self.registry, job=self.job, group=self.group, **self.opts)
            binding.attach(self._ep)
        elif role == "rollout":
            if (binding is None) == (llm is None):
                raise _arg_error("a rollout needs exactly one of binding= and llm=", "init_communicator")
            if llm is not None:
                llm.collective_rpc("init_weight_transfer_engine", args=(
                    {"registry": self.registry, "job": self.job, "group": self.group, "timeout_ms": self.timeout_ms},))
                self._llm = llm
            else:
                self._ep = Receiver(binding.manifest, registry=self.registry, job=self.job, group=self.group,
                                    **self.opts)
                binding.attach(self._ep)
        else:
            raise _arg_error(f"role is 'trainer' or 'rollout', not {role!r}", "init_communicator")
        self.role = role

    def _need(self):
        if self.role is None:
            raise _arg_error("call init_communicator first", "RefitWeightSynchronizer")

    def sync_weights(self, version: int) -> dict:
        """trainer: publish `version` (after the previous version's readers are done); rollout: refit to it."""
        self._need()
        t = time.perf_counter()
        if self.role == "trainer":
            if version <= self.version:
                raise _arg_error(f"version {version} is not newer than {self.version}", "sync_weights")
            if self.version:
                self._ep.wait_readers(self.version, self.timeout_ms)
            self._ep.publish(version)
            self.version = version
            return {"version": version, "publish_s": time.perf_counter() - t}
        if self._llm is not None:
            self._llm.start_weight_update()
            self._llm.update_weights({"update_info": {"version": version}})
            self._llm.finish_weight_update()
            self.version = version
            return {"version": version, "refit_s": time.perf_counter() - t}
        rep = self._ep.pull(version, self.timeout_ms)
        self.version = rep.version
        return {"version": rep.version, "refit_s": time.perf_counter() - t, "bytes": rep.bytes,
                "transfer_ms": rep.transfer_ms, "transport": rep.transport}

    def is_stale(self, version: int) -> bool:
        """rollout: whether its weights are older than `version` (the trainer's step, which the controller knows);
        trainer: whether `version` has not been published yet."""
        self._need()
        return self.version < version

    def shutdown(self):
        if self._ep is not None:
            self._ep.close()
        if self._llm is not None:
            try:
                self._llm.collective_rpc("shutdown_weight_transfer_engine")
            except Exception:  # older vLLM: the engine is shut down with the LLM
                pass
        self._ep = self._llm = None
        self.role = None
