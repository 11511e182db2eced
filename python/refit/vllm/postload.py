"""The CPU post-load steps: after a complete pull, rebuild what vLLM derives from the loader's tensors, by running
vLLM's own process_weights_after_loading on the staged bytes (linear weights into oneDNN / sgl-kernel handles,
MoE w13 / w2 prepacked) and rebuilding the embeddings' matmul handler from the parameter the pull wrote."""
import time
from typing import Dict

import torch

from .classify import CPU_MOE_KERNELS
from .errors import RefitVllmError


@torch.no_grad()
def apply(items, staged_views: Dict[str, torch.Tensor], model, platform: str) -> Dict[str, float]:
    """Runs each staged or CPU-embedding item's post-load step once (an MoE layer once for its w13 and w2).
    Returns ms per path."""
    ms: Dict[str, float] = {}
    seen = set()
    for it in items:
        t = time.perf_counter()
        if it.path == "linear-cpu":
            linear_cpu(it, staged_views[it.name])
        elif it.path == "moe-cpu":
            if id(it.module) in seen:
                continue
            seen.add(id(it.module))
            moe_cpu(it.module, it.name.rpartition(".")[0], staged_views)
        elif it.path == "embedding" and platform == "cpu":
            # embed_tokens and lm_head (tied or not): every module holding this parameter rebuilds its matmul
            # handler from it (vLLM's UnquantizedEmbeddingMethod.process_weights_after_loading on the CPU).
            for mod in _holders(model, it.param):
                mod.quant_method.process_weights_after_loading(mod)
        else:
            continue
        ms[it.path] = ms.get(it.path, 0.0) + (time.perf_counter() - t) * 1e3
    return ms


def _holders(model, param):
    return [mod for mod in model.modules()
            if any(p is param for p in mod._parameters.values()) and getattr(mod, "quant_method", None)]


def linear_cpu(it, w: torch.Tensor):
    """vLLM's CPU linear: the loader's weight goes into a oneDNN / sgl-kernel handle and the parameter becomes
    empty.  Run exactly that on the staged weight w, then put the original (empty) Parameter object back so that
    the module keeps its weight_loader for vLLM's own reloads."""
    mod, orig = it.module, it.module.weight
    if w.dtype != orig.dtype:
        w = w.to(orig.dtype)
    mod.register_parameter("weight", torch.nn.Parameter(w, requires_grad=False))
    try:
        mod.quant_method.process_weights_after_loading(mod)
    finally:
        mod.register_parameter("weight", orig)


def moe_cpu(layer, prefix: str, staged_views: Dict[str, torch.Tensor]):
    """vLLM's CPU MoE: after loading, the experts kernel pads and prepacks w13/w2.  Run the kernel's own step
    on a stand-in layer holding the staged tensors and copy its result into the live storage."""
    kernel = layer.quant_method.moe_kernel.fused_experts
    mc = getattr(kernel, "moe_config", None)
    if (type(kernel).__name__ in CPU_MOE_KERNELS and getattr(kernel, "_use_zentorch", True) is False
            and mc is not None and kernel._padded_intermediate_size(mc) == mc.intermediate_size_per_partition
            and hasattr(torch.ops._C, "prepack_moe_weight")):
        # What that step amounts to without padding: vLLM's prepack op, straight into the live storage.
        for a in ("w13_weight", "w2_weight"):
            torch.ops._C.prepack_moe_weight(staged_views[f"{prefix}.{a}"], getattr(layer, a).data, kernel.isa)
        return
    proxy = torch.nn.Module()
    for a in ("moe_config", "activation"):
        if hasattr(layer, a):
            object.__setattr__(proxy, a, getattr(layer, a))
    proxy.register_parameter("w13_weight", torch.nn.Parameter(staged_views[prefix + ".w13_weight"],
                                                             requires_grad=False))
    proxy.register_parameter("w2_weight", torch.nn.Parameter(staged_views[prefix + ".w2_weight"],
                                                            requires_grad=False))
    kernel.process_weights_after_loading(proxy)
    for a in ("w13_weight", "w2_weight"):
        new, live = getattr(proxy, a), getattr(layer, a)
        if new.shape != live.shape or new.dtype != live.dtype:
            raise RefitVllmError(f"{prefix}.{a}: the CPU MoE prepacking gave {new.dtype} {list(new.shape)}, the "
                                 f"live parameter is {live.dtype} {list(live.shape)}")
        if new.data_ptr() != live.data_ptr():
            live.data.copy_(new)
