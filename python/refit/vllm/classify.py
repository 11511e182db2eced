"""Which path each live tensor takes: direct (the pull writes the live parameter in place), embedding (direct, and
on the CPU the matmul handler is rebuilt afterwards), linear-cpu or moe-cpu (staged: the pull writes the loader's
layout into the staging arena and vLLM's own post-load step runs on it).  Only layer, quantization-method and
MoE-kernel classes checked against vLLM 0.32 are accepted, by exact class; anything else is refused by name."""
from .errors import RefitVllmError

_UNQ_LINEAR = ("vllm.model_executor.layers.linear", "UnquantizedLinearMethod")
_UNQ_EMBED = ("vllm.model_executor.layers.vocab_parallel_embedding", "UnquantizedEmbeddingMethod")
_GATE_LINEAR = ("vllm.model_executor.layers.fused_moe.router.gate_linear", "_GateLinearMethod")
_GATE = ("vllm.model_executor.layers.fused_moe.router.gate_linear", "GateLinear")
_UNQ_MOE = ("vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method", "UnquantizedFusedMoEMethod")

# vLLM 0.32's CPU MoE kernels (fused_moe/experts/cpu_moe.py): after loading they zero-pad the intermediate
# dimension to the kernel's alignment (when needed) and prepack w13 / w2 with prepack_moe_weight for their ISA.
CPU_MOE_KERNELS = ("CPUUnquantizedExperts", "X86CPUUnquantizedExperts", "ArmCPUUnquantizedExperts",
                   "PowerCPUUnquantizedExperts")

STAGED = ("linear-cpu", "moe-cpu")  # the paths whose tensors go through the staging arena


def _exact(obj, module_path: str, cls_name: str) -> bool:
    """obj's class is exactly vllm's module_path.cls_name (a subclass may process weights differently)."""
    import importlib
    try:
        cls = getattr(importlib.import_module(module_path), cls_name)
    except (ImportError, AttributeError):
        return False
    return type(obj) is cls


def moe_backend(module) -> str:
    """The name of an MoE layer's unquantized backend (e.g. "TRITON", "CPU"), or "unknown"."""
    qm = module.quant_method
    return getattr(getattr(qm, "unquantized_backend", None), "name", "unknown")


def _classify_moe(name: str, module, qm, platform: str) -> str:
    backend = moe_backend(module)
    if backend == "CPU":
        kernel = type(getattr(getattr(qm, "moe_kernel", None), "fused_experts", None)).__name__
        if kernel not in CPU_MOE_KERNELS:
            raise RefitVllmError(f"{name}: CPU MoE kernel {kernel} is not one refit has checked")
        return "moe-cpu"
    if backend in ("TRITON", "BATCHED_TRITON") and platform == "cuda":
        return "direct"
    raise RefitVllmError(
        f"{name}: MoE backend {backend} is not supported: refit writes the loader's layout directly for "
        "TRITON / BATCHED_TRITON and runs the CPU backend's prepacking; other backends rewrite w13/w2 after "
        "loading in ways refit has not been checked against (start vLLM with moe_backend=\"triton\")")


def classify(name: str, module, platform: str) -> str:
    """The path of one local tensor: direct, embedding (direct + handler rebuilt on the CPU), linear-cpu,
    moe-cpu; raises RefitVllmError naming what is not supported."""
    qm = getattr(module, "quant_method", None)
    mcls = type(module).__name__
    attr = name.rpartition(".")[2]
    if qm is None:
        import torch
        from vllm.model_executor.layers.layernorm import RMSNorm
        if type(module) is RMSNorm:
            return "direct"
        if type(module) is torch.nn.Linear and attr == "weight" and module.bias is None:
            # A plain torch Linear (DeepSeek MTP's eh_proj in vLLM 0.32): F.linear on the live weight at every call,
            # no post-load step on any platform: written in place.
            return "direct"
        raise RefitVllmError(f"{name}: layer class {mcls} is not one refit has checked (its post-load processing "
                             "is unknown)")
    qcls = type(qm).__name__
    # The MoE gate (GateLinear) keeps UnquantizedLinearMethod on the CPU; _GateLinearMethod only where the ROCm
    # bf16x3 split is on (refused: it derives a split weight).
    gate = _exact(qm, *_GATE_LINEAR) and not getattr(module, "allow_rocm_bf16x3_router_gemm", True)
    if attr == "e_score_correction_bias" and _exact(module, *_GATE) and (gate or _exact(qm, *_UNQ_LINEAR)):
        # DeepSeek-V3's routing bias: an fp32 Parameter vLLM registers on the gate; the router reads it by
        # reference (fused_topk_bias_router: .data at every call), no post-load step: written in place.
        return "direct"
    if _exact(qm, *_UNQ_LINEAR) or gate:  # the MoE gate's method: the unquantized one, on the CPU unchanged
        if platform == "cpu":
            if attr != "weight":  # a bias: the CPU sgl-kernel path converts it to fp32 after loading
                raise RefitVllmError(f"{name}: {attr} of {mcls} is not a tensor refit has checked on the CPU "
                                     "(vLLM's CPU linear post-load step may convert it)")
            if getattr(module, "_cpu_skip_gemm_dispatch", False):
                # MLA's kv_b_proj: vLLM keeps the weight live (cpu_linear = F.linear on it) and derives W_UK_T /
                # W_UV from it; written in place, the derivation re-run afterwards (derived.py).
                return "direct"
            return "linear-cpu"
        if platform == "cuda":
            return "direct"
    elif _exact(qm, *_UNQ_EMBED):
        if platform in ("cpu", "cuda"):
            return "embedding"
    elif _exact(qm, *_UNQ_MOE):
        return _classify_moe(name, module, qm, platform)
    else:
        raise RefitVllmError(f"{name}: quantization method {qcls} of {mcls} is not supported (refit moves "
                             "unquantized weights; quantized layers repack or rescale after loading)")
    raise RefitVllmError(f"{name}: {qcls} on platform {platform} is not supported (refit handles cpu and cuda)")
