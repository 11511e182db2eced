"""A vLLM worker as refit sees it: its parallel geometry and ranks, its platform, the refit model of vLLM's
model, and the vllm layout's options (expert names, vocabulary pad) that its live parameters imply."""
import json
import os
import tempfile
from typing import Optional

from ..adapters import AdapterError, vllm_expert_names
from ..core import Model
from .errors import RefitVllmError


def worker_geometry(vllm_config) -> dict:
    """tp, dp, expert parallel and this worker's ranks; refuses what the vllm layout cannot describe."""
    from vllm.distributed import get_tensor_model_parallel_rank
    pc = vllm_config.parallel_config
    if pc.pipeline_parallel_size != 1:
        raise RefitVllmError(f"pipeline_parallel_size={pc.pipeline_parallel_size}: the vllm layout has no pipeline "
                             "stages; run vLLM with pipeline_parallel_size=1")
    if getattr(pc, "decode_context_parallel_size", 1) not in (None, 1) or \
            getattr(pc, "prefill_context_parallel_size", 1) not in (None, 1):
        raise RefitVllmError("context parallel is not supported by the vllm layout")
    tp, dp = pc.tensor_parallel_size, pc.data_parallel_size
    ep = bool(pc.enable_expert_parallel)
    t = get_tensor_model_parallel_rank()
    d = pc.data_parallel_rank if dp > 1 else 0
    return {"tp": tp, "dp": dp, "ep": tp * dp if ep else 1, "tp_rank": t, "dp_rank": d, "rank": t + tp * d,
            "placement": getattr(pc, "expert_placement_strategy", "linear"),
            "eplb": bool(getattr(pc, "enable_eplb", False))}


def platform_name() -> str:
    """vLLM's current platform: "cpu", "rocm", "cuda", or the platform class's name."""
    from vllm.platforms import current_platform
    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_rocm():
        return "rocm"
    if current_platform.is_cuda():
        return "cuda"
    return type(current_platform).__name__


def detect_names(param_names) -> Optional[str]:
    """The vllm layout's names= for these parameter names (refit.adapters.vllm_expert_names): "routed", "fused", or
    None for a model without experts."""
    try:
        return vllm_expert_names(param_names)
    except AdapterError as e:
        raise RefitVllmError(e.detail) from None


def refit_model(model_config, identity: Optional[str]) -> Model:
    """The refit model spec of vLLM's model: its config.json, named as refit names a config directory (the
    directory's base name unless the config has _name_or_path), or `identity` when given."""
    path = model_config.model
    cfg_file = os.path.join(path, "config.json") if os.path.isdir(path) else None
    if cfg_file and os.path.isfile(cfg_file) and identity is None:
        return Model(path)
    if cfg_file and os.path.isfile(cfg_file):
        with open(cfg_file) as f:
            cfg = json.load(f)
    else:  # a hub id: the config vLLM loaded
        cfg = model_config.hf_config.to_dict()
    cfg["_name_or_path"] = identity or os.path.basename(path.rstrip("/")) or "model"
    with tempfile.TemporaryDirectory(prefix="refit-vllm-") as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        return Model(d)


def vocab_pad(params, rmodel: Model, tp: int) -> int:
    """The vllm layout's pad= that gives the live embedding's padded vocabulary: vLLM's 64 unless the model pads
    otherwise (the smallest pad p with round_up(V, p) equal to the live rows x tp)."""
    emb = params.get("model.embed_tokens.weight")
    vocab = next((t.shape[0] for t in rmodel.tensors() if t.name == "model.embed_tokens.weight"), None)
    if emb is None or vocab is None or emb.dim() != 2:
        return 64
    vp = emb.shape[0] * tp
    if vp == -(-vocab // 64) * 64 or vp < vocab:
        return 64  # the default, or a mismatch the shape check reports
    for p in range(vp - vocab + 1, min(vp, 65536) + 1):
        if vp % p == 0:
            return p
    return 64
