"""The trainer side of the example: a real Megatron-Core GPTModel on the CPU, and what the loop does with it.

    build(hf_config, tp, ep)        a GPTModel with Megatron-Core's local layer spec (get_gpt_layer_local_spec: what
                                    builds without Transformer Engine), gloo, use_cpu_initialization=True, bf16
                                    (Float16Module), shaped like the Hugging Face config (Qwen3-MoE: qk norms,
                                    SwiGLU experts, untied lm_head).  torch.distributed and Megatron's parallel
                                    state must be initialized first (init_parallel).
    update(model, step, scale)      the "training step": Megatron's forward needs a GPU, so on the CPU the step is
                                    a seeded update of the parameters, p += scale * lr * N(0, 1), the noise seeded
                                    by (parameter name, step, and the shard for parameters that are sharded), so
                                    that replicated parameters stay equal on every rank that holds them.
    local_state(model)              this rank's parameters (Megatron names) as CPU tensors.
    to_hf(states, cfg, tp, ep)      every rank's local_state -> the Hugging Face checkpoint's tensors (canonical
                                    names and shapes): the example's own conversion, written from Megatron-Core's
                                    layout rules, independent of refit's planner (which it checks).

Names: the local spec's (decoder.layers.N.input_layernorm.weight, pre_mlp_layernorm.weight,
self_attention.linear_qkv.weight, mlp.router.weight, mlp.experts.local_experts.J.linear_fc1.weight, ...), with
Float16Module's "module." prefix.
"""
import os
import zlib

import torch

LR = 2e-3


def init_parallel(rank: int, world: int, tp: int, ep: int, addr: str = "127.0.0.1", port: int = 29500):
    """gloo process group and Megatron's parallel state (tp * dp = world; ep divides dp * tp)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    os.environ.setdefault("MASTER_ADDR", addr)
    os.environ.setdefault("MASTER_PORT", str(port))
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world)
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)


def build(hf_config: dict, tp: int, ep: int, seed: int = 1234, dispatcher: str = "allgather"):
    """A Megatron-Core GPTModel (local spec, CPU, bf16) of a Qwen3-MoE or Qwen3 Hugging Face config dict."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig
    c = hf_config
    experts = n_experts(c) or None
    torch.manual_seed(seed)
    kw = dict(num_layers=c["num_hidden_layers"], hidden_size=c["hidden_size"],
              num_attention_heads=c["num_attention_heads"], num_query_groups=c["num_key_value_heads"],
              kv_channels=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
              ffn_hidden_size=c["intermediate_size"], normalization="RMSNorm", layernorm_epsilon=c["rms_norm_eps"],
              gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False,
              qk_layernorm=True, use_cpu_initialization=True, params_dtype=torch.bfloat16, bf16=True,
              tensor_model_parallel_size=tp, expert_model_parallel_size=ep, sequence_parallel=False,
              init_method_std=0.02)
    if experts:
        # alltoall (the default) allocates a CUDA stream in its constructor; allgather builds on the CPU.
        kw.update(num_moe_experts=experts, moe_router_topk=c["num_experts_per_tok"],
                  moe_ffn_hidden_size=c["moe_intermediate_size"], moe_grouped_gemm=False,
                  moe_token_dispatcher_type=dispatcher)
    cfg = TransformerConfig(**kw)
    spec = get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False, qk_layernorm=True,
                                    normalization="RMSNorm")
    model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=c["vocab_size"],
                     max_sequence_length=c["max_position_embeddings"],
                     share_embeddings_and_output_weights=bool(c.get("tie_word_embeddings")),
                     position_embedding_type="rope", rotary_base=int(rope_theta(c)))
    # Float16Module casts every parameter to bf16 (without it the local spec's norms stay fp32), as Megatron's
    # training loop does for bf16.
    return Float16Module(cfg, model)


def n_experts(c: dict) -> int:
    """transformers 5 writes Qwen3-MoE's expert count as num_local_experts, 4.x as num_experts."""
    return int(c.get("num_experts") or c.get("num_local_experts") or 0)


def rope_theta(c: dict) -> float:
    return float((c.get("rope_parameters") or {}).get("rope_theta") or c.get("rope_theta") or 10000.0)


def _shard_key(name: str, p, tp_rank: int, ep_rank: int) -> str:
    """What distinguishes this rank's copy of a parameter: experts differ per (ep, tp) rank, tensor-parallel
    parameters per tp rank; the rest (norms, router) and every data-parallel replica are the same tensor and must
    get the same update (as Megatron's gradient all-reduce keeps them equal).  Megatron marks linear weights
    tensor_model_parallel even at tp=1, so the expert test comes first."""
    if ".local_experts." in name:
        return f"|ep{ep_rank}|tp{tp_rank}"
    if getattr(p, "tensor_model_parallel", False):
        return f"|tp{tp_rank}"
    return ""


def update(model, step: int, scale: float = 1.0, tp_rank: int = 0, ep_rank: int = 0):
    """p += scale * LR * N(0, 1), seeded per (name, step[, shard])."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            g = torch.Generator().manual_seed(zlib.crc32(f"{name}|{step}{_shard_key(name, p, tp_rank, ep_rank)}"
                                                         .encode()))
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            p.add_((noise * (scale * LR)).to(p.dtype))


def local_state(model):
    return {n[len("module."):] if n.startswith("module.") else n: p.detach().to("cpu").clone()
            for n, p in model.named_parameters()}


def to_hf(states, c: dict, tp: int, ep: int):
    """states[rank] = local_state of rank (rank = ep_rank * tp + tp_rank for world = tp * ep, Megatron's default
    order with dp = ep here).  Returns {canonical name: tensor}."""
    heads, groups = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or c["hidden_size"] // heads
    E = n_experts(c)
    world = len(states)
    etp = tp  # Megatron-Core's default expert tensor parallel size
    tp_ranks = [states[r] for r in range(tp)]  # dense parameters: the first tp ranks hold every tp shard

    def cat(name, dim, ranks=tp_ranks):
        return torch.cat([s[name] for s in ranks], dim=dim)

    out = {"model.embed_tokens.weight": cat("embedding.word_embeddings.weight", 0),
           "model.norm.weight": tp_ranks[0]["decoder.final_layernorm.weight"]}
    if not c.get("tie_word_embeddings"):
        out["lm_head.weight"] = cat("output_layer.weight", 0)
    per_group = heads // groups
    for i in range(c["num_hidden_layers"]):
        mp, hp = f"decoder.layers.{i}.", f"model.layers.{i}."
        out[hp + "input_layernorm.weight"] = tp_ranks[0][mp + "input_layernorm.weight"]
        out[hp + "post_attention_layernorm.weight"] = tp_ranks[0][mp + "pre_mlp_layernorm.weight"]
        qkv = cat(mp + "self_attention.linear_qkv.weight", 0)  # interleaved per query group
        qkv = qkv.view(groups, (per_group + 2) * hd, -1)
        out[hp + "self_attn.q_proj.weight"] = qkv[:, :per_group * hd].reshape(heads * hd, -1)
        out[hp + "self_attn.k_proj.weight"] = qkv[:, per_group * hd:(per_group + 1) * hd].reshape(groups * hd, -1)
        out[hp + "self_attn.v_proj.weight"] = qkv[:, (per_group + 1) * hd:].reshape(groups * hd, -1)
        out[hp + "self_attn.o_proj.weight"] = cat(mp + "self_attention.linear_proj.weight", 1)
        out[hp + "self_attn.q_norm.weight"] = tp_ranks[0][mp + "self_attention.q_layernorm.weight"]
        out[hp + "self_attn.k_norm.weight"] = tp_ranks[0][mp + "self_attention.k_layernorm.weight"]
        if E:
            out[hp + "mlp.gate.weight"] = tp_ranks[0][mp + "mlp.router.weight"]
            per_ep = E // ep
            for e in range(E):
                er, j = divmod(e, per_ep)
                ranks = [states[er * tp + t] for t in range(etp)]
                fc1 = [s[f"{mp}mlp.experts.local_experts.{j}.linear_fc1.weight"] for s in ranks]
                half = fc1[0].shape[0] // 2
                out[f"{hp}mlp.experts.{e}.gate_proj.weight"] = torch.cat([f[:half] for f in fc1], 0)
                out[f"{hp}mlp.experts.{e}.up_proj.weight"] = torch.cat([f[half:] for f in fc1], 0)
                out[f"{hp}mlp.experts.{e}.down_proj.weight"] = torch.cat(
                    [s[f"{mp}mlp.experts.local_experts.{j}.linear_fc2.weight"] for s in ranks], 1)
        else:
            fc1 = [s[mp + "mlp.linear_fc1.weight"] for s in tp_ranks]
            half = fc1[0].shape[0] // 2
            out[hp + "mlp.gate_proj.weight"] = torch.cat([f[:half] for f in fc1], 0)
            out[hp + "mlp.up_proj.weight"] = torch.cat([f[half:] for f in fc1], 0)
            out[hp + "mlp.down_proj.weight"] = cat(mp + "mlp.linear_fc2.weight", 1)
    assert world == tp * ep or ep == 1, (world, tp, ep)
    return {k: v.contiguous() for k, v in out.items()}
