"""refit inside SGLang (0.5.23): a receiver in every SGLang TP worker, reached through SGLang's custom weight loader
(update_weights_from_tensor with load_format=refit.sglang.worker.load; no patch to SGLang).  docs/sglang.md.

    eng = sglang.Engine(model_path=..., **refit.sglang.engine_args(), ...)
    refit.sglang.RefitSglang(eng, registry=..., job=...).update(version)

The modules:
  errors   RefitSglangError and its family subclasses
  geometry the worker's TP geometry, platform and refit model, from SGLang's own state
  bind     SglangBinding: the live model as a receiver manifest of the vllm layout, its memory, the apply step
  worker   load(), the custom loader SGLang runs in each TP worker: pull, agree, apply, outcome to the driver
  engine   RefitSglang (the driver side) and engine_args()
Names load on first use, so that importing refit.sglang imports neither torch nor SGLang."""
import importlib

_EXPORTS = {"RefitSglang": "engine", "engine_args": "engine", "RefitSglangError": "errors",
            "SglangBinding": "bind", "LOADER": "worker", "load": "worker"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
