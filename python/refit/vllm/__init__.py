"""refit as a vLLM weight-transfer backend: LLM(..., weight_transfer_config={"backend": "refit"}).

vLLM (0.32) creates one engine per worker process through WeightTransferEngineFactory (the `refit` name is
registered by refit.vllm.plugin, a `vllm.general_plugins` entry point) and drives it with
init_weight_transfer_engine(init_info), then start_weight_update / update_weights / finish_weight_update per
refit, and shutdown.  Each worker is one refit Receiver of the `vllm` layout for its own rank, derived from
the worker's vllm_config (tp, dp, expert parallel) and its live model (expert parameter names, shapes).

What a pull writes, per parameter class (docs/vllm.md has the table and the measured costs):
  - direct: the live parameter is the loader's tensor (norms; embeddings and lm_head; on CUDA every linear and
    the Triton MoE experts): the receiver's memory region *is* the parameter's storage, the pull writes it in
    place.  On the CPU the embeddings' matmul handler (used by lm_head) is rebuilt from it afterwards.
  - staged: the runtime tensor is something vLLM derives from the loader's tensor after loading (the CPU
    backend packs every linear weight into a oneDNN / sgl-kernel handle and replaces the parameter with an
    empty one; the CPU MoE backend prepacks w13/w2): the pull writes the loader's layout into a staging arena,
    then the layer's own post-load step (vLLM's code) runs on it and its result lands in the live storage.
Anything else -- a quantization method, an MoE backend, a platform or a layer this module has not been checked
against -- is refused at init_weight_transfer_engine with an error that names it.

The modules, one responsibility each:
  errors    RefitVllmError and its subclasses per status family
  info      RefitInitInfo, RefitUpdateInfo (init_info and update_info, checked)
  geometry  the worker's parallel geometry, platform, refit model and layout options
  classify  the path of each live tensor (direct, embedding, linear-cpu, moe-cpu), or a refusal naming it
  bind      VllmBinding: the live model (target or draft) as a receiver manifest and its memory
  draft     draft targets (issue 35): which speculative drafts refit describes, their identity
  postload  the CPU post-load steps run after a pull
  derived   derived state (issue 35): MLA's W_UK_T / W_UV, re-derived by vLLM's own step after a pull or commit
  executor  realign_worker_replies, the workaround for vLLM 0.32's executor after a failed call
  backend   RefitWeightTransferEngine, the engine vLLM drives
  inflight  two-phase updates (init_info stage="host"): the worker's Stager, and stage / commit / versions for
            the driver (docs/vllm.md, "Refit while generating")
  plugin    register(), the vllm.general_plugins entry point (imports neither torch nor vLLM)

The names below are loaded on first use, so that `import refit.vllm.plugin` (which vLLM does in every process)
stays light.
"""
import importlib

_EXPORTS = {
    "RefitWeightTransferEngine": "backend", "RefitInitInfo": "info", "RefitUpdateInfo": "info",
    "RefitVllmError": "errors", "VllmBinding": "bind", "detect_names": "geometry",
    "realign_worker_replies": "executor", "BACKEND_NAME": "plugin", "register": "plugin",
    "RefitVllmStagingBudget": "inflight", "RefitVllmCommitIncomplete": "inflight",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
