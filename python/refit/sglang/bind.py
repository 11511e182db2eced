"""The binding: a live SGLang model described as a refit receiver of its TP worker's `vllm` layout (SGLang's
parameter layout is vLLM's: docs/layouts.md says where they were compared), the memory the pull writes, and the
step that makes the pulled bytes the live weights.

Every tensor this receiver handles is *direct*: on the CPU without AMX (what SGLang 0.5.23 runs here) the live
parameter is the loader's tensor and no post-load step rewrites it (UnquantizedLinearMethod, UnquantizedEmbedding-
Method, UnquantizedFusedMoEMethod and RMSNorm keep their parameters as loaded).  Layers whose runtime format is not
the loader's (AMX-packed CPU weights, quantized methods, other MoE kernels) are refused at bind, by name.

Two memory modes:
  staged (default)  region 0 is a staging arena holding every local tensor; the pull writes it, then, after every
                    TP worker has agreed that its pull succeeded, apply() copies the arena into the live parameters.
                    A failed pull on any worker leaves every worker's parameters as they were, byte for byte.
  direct            one region per parameter, whose memory is the live parameter's storage: no extra memory and no
                    copy, but a pull that fails after its transfer began may leave a mix of versions (as in the vLLM
                    backend's direct tensors).  Failures found before the transfer (a wrong shape, a missing
                    source) write nothing in either mode.
No parameter is moved or re-allocated: the storage SGLang holds stays the storage."""
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from ..adapters import ALIGN, AdapterError
from ..core import Layout, Manifest, Receiver, torch_dtype
from ..vllm.geometry import detect_names, vocab_pad
from .errors import RefitSglangError
from .geometry import platform_name, refit_model, worker_geometry

# (module, class) of SGLang 0.5.23 whose parameters stay as loaded on the CPU without AMX; matched exactly
_QUANT_METHODS = {
    ("sglang.srt.layers.quantization.unquant", "UnquantizedLinearMethod"): "linear",
    ("sglang.srt.layers.quantization.unquant", "UnquantizedEmbeddingMethod"): "embedding",
    ("sglang.srt.layers.quantization.unquant", "UnquantizedFusedMoEMethod"): "moe",
}
_PLAIN_MODULES = {("sglang.srt.layers.layernorm", "RMSNorm"): "norm"}


@dataclass
class Item:
    name: str
    local: object  # core.Local of the scheme's manifest
    module: object
    param: object
    kind: str  # linear, embedding, moe, norm


def _class_key(obj):
    t = type(obj)
    return (t.__module__, t.__qualname__)


def classify(name: str, module) -> str:
    """The kind of a parameter's module, or RefitSglangError naming what refit has not checked."""
    if getattr(module, "use_intel_amx_backend", False):
        raise RefitSglangError(f"{name}: SGLang packs this layer for AMX after loading (use_intel_amx_backend); "
                               "refit's SGLang receiver handles only layers whose parameters are the loader's "
                               "tensors (CPUs without AMX, here)")
    qm = getattr(module, "quant_method", None)
    if qm is None:
        kind = _PLAIN_MODULES.get(_class_key(module))
        if kind is None:
            raise RefitSglangError(f"{name}: layer class {type(module).__module__}.{type(module).__qualname__} is "
                                   "not one refit has checked (its post-load processing is unknown)")
        return kind
    kind = _QUANT_METHODS.get(_class_key(qm))
    if kind is None:
        raise RefitSglangError(f"{name}: quantization method {type(qm).__qualname__} of "
                               f"{type(module).__qualname__} is not supported (refit moves unquantized weights)")
    return kind


def _refuse_model(model):
    qc = getattr(model, "quant_config", None)
    if qc is not None:
        raise RefitSglangError(f"quantization {qc.get_name() if hasattr(qc, 'get_name') else qc!r} is not supported")
    if callable(getattr(model, "post_load_weights", None)):
        raise RefitSglangError(f"{type(model).__name__} has a model-level post_load_weights step that refit does "
                               "not run")


class SglangBinding:
    """A live SGLang model as a refit receiver of its worker's vllm layout: manifest, memory, apply step."""

    def __init__(self, model, identity: Optional[str] = None, mode: str = "staged"):
        t0 = time.perf_counter()
        if mode not in ("staged", "direct"):
            raise RefitSglangError(f"mode {mode!r}: use 'staged' or 'direct'", "refit sglang receiver", -1)
        self.model, self.mode = model, mode
        _refuse_model(model)
        self.platform = platform_name()
        if self.platform != "cpu":
            raise RefitSglangError(f"platform {self.platform}: refit's SGLang receiver has been checked on the CPU "
                                   "only (SGLang 0.5.23, SGLANG_USE_CPU_ENGINE=1)")
        self.geometry = g = worker_geometry()
        params = dict(model.named_parameters())
        self.names = detect_names(params)
        if self.names == "routed":
            raise RefitSglangError("the model names its experts mlp.experts.routed_experts.*, which SGLang 0.5.23 "
                                   "does not; refit has not checked this model class")
        self.rmodel = refit_model(model.config, identity)
        self.layout = Layout(f"vllm:tp={g['tp']},pad={vocab_pad(params, self.rmodel, g['tp'])}")
        scheme = self.layout.manifest(self.rmodel, g["rank"])
        self.layout_str = scheme.identity["layout"]
        self.items = self._match(scheme.locals(), params)
        self.device = next(iter(params.values())).device
        self._build_manifest(scheme)
        self.kinds = self._summarize()
        self.init_ms = (time.perf_counter() - t0) * 1e3

    def _match(self, locs, params) -> List[Item]:
        """The scheme's local tensors matched to SGLang's parameters by name, classified, their dtype, shape and
        contiguity checked; every difference raised at once (AdapterError)."""
        g = self.geometry
        expected = {l.name for l in locs}
        missing = [l.name for l in locs if l.name not in params]
        unexpected = [n for n in params if n not in expected]
        if missing or unexpected:
            raise AdapterError(f"{self.layout_str} rank {g['rank']} of {self.rmodel.name} against SGLang's "
                               f"{type(self.model).__name__}", missing, unexpected, [])
        items, bad = [], []
        for l in locs:
            p = params[l.name]
            module = self.model.get_submodule(l.name.rpartition(".")[0])
            items.append(Item(l.name, l, module, p, classify(l.name, module)))
            if torch_dtype(l.dtype) != p.dtype or tuple(p.shape) != tuple(l.shape) or not p.is_contiguous():
                bad.append(f"{l.name}: SGLang holds {str(p.dtype).replace('torch.', '')} {list(p.shape)}"
                           f"{'' if p.is_contiguous() else ' (not contiguous)'}, {self.layout_str} has "
                           f"{l.dtype} {list(l.shape)}")
        if bad:
            raise AdapterError(f"{self.layout_str} rank {g['rank']} of {self.rmodel.name}", [], [], bad)
        return items

    def _build_manifest(self, scheme):
        g = self.geometry
        m = Manifest.build(self.rmodel.name, self.layout_str, g["rank"], self.layout.world)
        self.regions, self.staged = [], {}
        if self.mode == "staged":
            offsets, off = {}, 0
            for it in self.items:
                offsets[it.name] = off
                off += -(-it.local.nbytes // ALIGN) * ALIGN
            m.add_region(max(off, ALIGN))
            arena = torch.zeros(max(off, ALIGN), dtype=torch.uint8, device=self.device)
            self.regions.append(arena)
            for it in self.items:
                m.add_local(it.name, it.local.dtype, it.local.shape, 0, offsets[it.name])
                self.staged[it.name] = (arena[offsets[it.name]:offsets[it.name] + it.local.nbytes]
                                        .view(torch_dtype(it.local.dtype)).view(it.local.shape))
        else:
            for it in self.items:
                r = m.add_region(it.local.nbytes)
                m.add_local(it.name, it.local.dtype, it.local.shape, r, 0)
                self.regions.append(it.param.data)
        for c in scheme.canonical():
            m.add_canonical(c.name, c.dtype, c.shape)
        for p in scheme.placements():
            m.add_placement(p.canonical, p.local, p.canon_offset, p.extent, p.local_offset)
        m.finalize()
        self.manifest = m

    def _summarize(self) -> Dict[str, dict]:
        out: Dict[str, dict] = {}
        for it in self.items:
            c = out.setdefault(it.kind, {"tensors": 0, "bytes": 0})
            c["tensors"] += 1
            c["bytes"] += it.local.nbytes
        return out

    @property
    def staging_bytes(self) -> int:
        return self.regions[0].numel() if self.mode == "staged" else 0

    def attach(self, rx: Receiver):
        for r, mem in enumerate(self.regions):
            rx.attach(r, mem)

    @torch.no_grad()
    def apply(self) -> float:
        """After every worker's pull succeeded: staged mode copies the arena into the live parameters (in place,
        same storage); direct mode has nothing left to do.  Returns ms."""
        t = time.perf_counter()
        if self.mode == "staged":
            for it in self.items:
                it.param.data.copy_(self.staged[it.name])
        return (time.perf_counter() - t) * 1e3
