"""Draft targets (issue 35): a speculative draft model refitted as a target of its own.

vLLM 0.32's worker retargets the weight-transfer engine at the draft model between start_draft_weight_update and
finish_weight_update (Worker._set_draft_weight_update_target -> engine.set_weight_update_target(draft model, the
speculative config's draft_model_config); finish and every failure reset it).  refit binds a second receiver to the
draft model the first time a draft session starts (VllmBinding with its own manifest) and keeps it; an update in a
draft session pulls into the draft and runs the draft's post-load steps (its CPU linear packing, MoE prepacking
and MLA derivation).

Which drafts: DeepSeek MTP (method "mtp", vLLM's DeepSeekMTP): the same model as the target, its MTP layers (the
vllm layout's draft=mtp), from the target's publishers (they must hold the MTP layers: megatron mtp=N, or hf);
the draft's embedding and lm_head are the target's modules (vLLM shares them at load) and arrive with the target.
A draft model (method "draft_model"): a model of its own (its own config, refit model and identity), from its own
publishers (init_info draft_group / draft_model).  Anything else (EAGLE heads, other MTP architectures) is refused
by name: their parameter layouts are not described by refit."""
from typing import Optional

from .errors import RefitVllmError

MTP_CLASSES = ("DeepSeekMTP",)  # vLLM 0.32 MTP draft classes whose layout refit describes (vllm draft=mtp)


def draft_kind(vllm_config, model) -> str:
    """"mtp" or "model" for the draft model vLLM retargeted the engine at; RefitVllmError naming what refit does
    not describe."""
    sc = getattr(vllm_config, "speculative_config", None)
    if sc is None or getattr(sc, "draft_model_config", None) is None:
        raise RefitVllmError("a draft weight update was started, but vLLM has no speculative draft model configured")
    method, cls = getattr(sc, "method", None), type(model).__name__
    if method == "mtp" and cls in MTP_CLASSES:
        return "mtp"
    if method == "draft_model":
        return "model"
    raise RefitVllmError(f"draft model {cls} (speculative method {method!r}) is not one refit describes: refit "
                         f"refits DeepSeek MTP drafts (method \"mtp\": {', '.join(MTP_CLASSES)}) and draft models of "
                         "method \"draft_model\"")


def draft_identity(kind: str, info) -> Optional[str]:
    """The refit model name the draft's publishers publish under: init_info draft_model when given; an MTP draft
    is the target's model (init_info model, or derived from the same config directory); a draft model's is
    derived from its own config directory."""
    if info.draft_model is not None:
        return info.draft_model
    return info.model if kind == "mtp" else None
