"""Derived state (issue 35): runtime tensors vLLM computes from loaded ones after loading, and the layers that own
them.  Today: multi-head latent attention (DeepSeek-V2/V3, Kimi-K2).

vLLM 0.32's MLAAttention.process_weights_after_loading (model_executor/layers/attention/mla_attention.py) splits
kv_b_proj's weight [heads*(nope+v), kv_lora] into the absorbed matrices W_UK_T [heads, nope, kv_lora] and W_UV
[heads, kv_lora, v] (replace_parameter(..., prefer_copy=True): registered as parameters of the attention layer on
the first load, copied into in place on a reload).  They are not checkpoint tensors: the vllm layout does not
describe them, and a refit that rewrote kv_b_proj alone would leave decode (which multiplies by W_UK_T / W_UV)
on the old version.  The backend therefore leaves them out of the manifest and runs vLLM's own step again after
kv_b_proj has its new bytes (after the pull, or inside the two-phase commit, after the live copies).

On the CPU, vLLM keeps kv_b_proj's weight as a plain tensor (it marks the layer _cpu_skip_gemm_dispatch: no packed
matmul handle) and, when the activation dtype is the weight's, the split returns views: W_UK_T and W_UV alias
kv_b_proj's storage.  Re-running the step is then a copy onto itself; it is still run, so that a model whose
dtype differs (fresh tensors) is refreshed too.

Only the configurations checked against vLLM 0.32 are accepted: the CPU reference backend's CPUMLAImpl, without
the AMX path (which packs W_UK / W_UV itself and empties kv_b_proj), decode-context-parallel query replication,
the aiter FP4 / FP8 paths, a quantized kv_b_proj or a sparse-MLA indexer; anything else is refused by name."""
import time
from typing import Dict, List

import torch

from .errors import RefitVllmError

DERIVED_ATTRS = ("W_UK_T", "W_UV")  # what MLAAttention derives on the unquantized, non-AMX path
# MLA-named classes of vLLM 0.32 whose post-load behaviour refit has read: the wrapper and DeepSeek's attention
# module own only ordinary linear layers and norms; MLAAttention's own step is the one run here.
KNOWN_MLA_CLASSES = ("MLAAttention", "MultiHeadLatentAttentionWrapper", "DeepseekV2MLAAttention")
CHECKED_IMPLS = {"cpu": ("CPUMLAImpl",)}


def _mla_class():
    try:
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    except ImportError:
        return None
    return MLAAttention


def find_mla(model, platform: str) -> List[tuple]:
    """Every MLA attention layer of the model as (name, layer); refuses, by name, an MLA layer or configuration
    refit has not checked (see the module docstring)."""
    mla_cls = _mla_class()
    out = []
    for name, mod in model.named_modules():
        cname = type(mod).__name__
        if ("MLA" not in cname and "LatentAttention" not in cname) or cname.startswith("_"):
            continue
        if cname not in KNOWN_MLA_CLASSES:
            raise RefitVllmError(f"{name}: multi-head latent attention class {cname} is not one refit has checked "
                                 "(its post-load derivation is unknown)")
        if cname != "MLAAttention":
            continue
        if mla_cls is None or type(mod) is not mla_cls:
            raise RefitVllmError(f"{name}: {type(mod).__module__}.{cname} is not vLLM 0.32's MLAAttention")
        _check_layer(name, mod, platform)
        out.append((name, mod))
    return out


def _check_layer(name, mod, platform):
    impl = type(getattr(mod, "impl", None)).__name__
    if impl not in CHECKED_IMPLS.get(platform, ()):
        raise RefitVllmError(f"{name}: MLA backend {impl} on {platform} is not one refit has checked (checked: "
                             f"{CHECKED_IMPLS}); its post-load step may pack or quantize W_UK / W_UV differently")
    why = [flag for flag in ("is_amx_bmm_enabled", "dcp_q_replicate", "is_aiter_triton_fp4_bmm_enabled",
                             "is_aiter_triton_fp8_bmm_enabled") if getattr(mod, flag, False)]
    if getattr(getattr(mod, "impl", None), "indexer", None) is not None:
        why.append("a sparse-MLA indexer")
    if getattr(mod, "quant_config", None) is not None:
        why.append("quant_config")
    kv_b = getattr(mod, "kv_b_proj", None)
    w = getattr(kv_b, "weight", None)
    if w is None or w.dim() != 2 or w.numel() == 0:
        why.append("kv_b_proj without a 2-D weight")
    if why:
        raise RefitVllmError(f"{name}: MLA with {', '.join(why)} is not supported: vLLM derives its decode "
                             "matrices from kv_b_proj in ways refit has not been checked against")


def derived_names(mla: List[tuple], params) -> List[str]:
    """The live parameter names that are MLA's derived tensors (left out of the manifest)."""
    return [f"{n}.{a}" for n, _ in mla for a in DERIVED_ATTRS if f"{n}.{a}" in params]


def kv_b_names(mla: List[tuple], model) -> Dict[str, str]:
    """name of each MLA layer -> the model's (first, deduplicated) name of its kv_b_proj weight."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    return {n: by_id.get(id(mod.kv_b_proj.weight), "?") for n, mod in mla}


@torch.no_grad()
def refresh(mla: List[tuple], act_dtype) -> Dict[str, float]:
    """vLLM's own MLAAttention.process_weights_after_loading on every MLA layer (W_UK_T / W_UV from the live
    kv_b_proj, copied in place).  Returns {"mla-derived": ms}."""
    if not mla:
        return {}
    t = time.perf_counter()
    for name, mod in mla:
        before = {a: getattr(mod, a, None) for a in DERIVED_ATTRS}
        mod.process_weights_after_loading(act_dtype)
        for a, old in before.items():  # prefer_copy must have written in place: same objects, same storage
            new = getattr(mod, a, None)
            if old is not None and (new is not old or new.data_ptr() != old.data_ptr()):
                raise RefitVllmError(f"{name}.{a}: vLLM's MLA post-load step replaced the tensor instead of "
                                     "copying into it (shape or dtype changed?)")
    return {"mla-derived": (time.perf_counter() - t) * 1e3}


def act_dtype(vllm_config):
    """The dtype vLLM's loader passes to the attention layers' post-load step (model_config.dtype)."""
    return vllm_config.model_config.dtype
