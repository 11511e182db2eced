"""Tiny checkpoints for the vLLM tests (tests/python/test_vllm.py), written by transformers with random weights.

Two architectures vLLM 0.32 serves on the CPU: a Qwen3-MoE (8 experts, top-2, untied lm_head, vocabulary 250 so
that vLLM's 64-padding adds rows) and a dense Qwen3 with tied embeddings.  Sizes respect the CPU kernels: head_dim
32 (a CPU attention size), hidden and per-rank MoE intermediate multiples of 32 (the CPU MoE kernel's alignment)
at tp=2.  Each version is a directory named after the model (`<root>/v1/tiny-qwen3-moe`), so every version has
the same refit identity (a config directory's base name).

    python vllm_models.py ROOT     # writes ROOT/{v1,v2,bad}/{tiny-qwen3-moe,tiny-qwen3}
"""
import os
import sys

MOE = "tiny-qwen3-moe"
DENSE = "tiny-qwen3"
MLA = "tiny-deepseek-v3"  # issue 35: MLA + MoE with the score-correction bias (see mla_config)


def _common(**kw):
    base = dict(vocab_size=250, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=32, max_position_embeddings=256, rms_norm_eps=1e-6, torch_dtype="bfloat16")
    base.update(kw)
    return base


def config(kind: str, bad: bool = False, **over):
    """The transformers config of `kind` (MOE or DENSE); bad=True changes one shape (the negative test)."""
    from transformers import Qwen3Config, Qwen3MoeConfig
    if kind == MOE:
        kw = dict(intermediate_size=256, moe_intermediate_size=32 if bad else 64, num_experts=8, num_experts_per_tok=2,
                  norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)
        return Qwen3MoeConfig(**_common(**dict(kw, **over)))
    if kind == DENSE:
        return Qwen3Config(**_common(**dict(dict(intermediate_size=128 if bad else 256, tie_word_embeddings=True),
                                            **over)))
    raise ValueError(kind)


def mla_config():
    """A DeepSeek-V3 as small as vLLM 0.32's CPU MLA backend allows: its decode kernel (cpu_mla.py) only takes a
    latent cache of kv_lora_rank + qk_rope_head_dim = 512 + 64 = 576 (320 fails with "Unsupported block size: 16",
    96 with "Head dimension 96 is not supported by MLA"); everything else tiny.  Layer 0 dense, layer 1 MoE (8
    routed experts in 2 groups, 1 shared, sigmoid scores + e_score_correction_bias: topk_method "noaux_tc", which
    vLLM needs to create the bias and transformers 5.19's DeepseekV3Config does not write)."""
    from transformers import DeepseekV3Config
    return DeepseekV3Config(vocab_size=256, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                            num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
                            num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                            n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=64,
                            kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32,
                            max_position_embeddings=256, rope_scaling=None, tie_word_embeddings=False,
                            torch_dtype="bfloat16", num_nextn_predict_layers=0)


BIAS = "e_score_correction_bias"


def write_mla(out: str, seed: int, bias_from: str = None):
    """The tiny DeepSeek-V3 (mla_config) with random weights (as write()) and a random routing bias (uniform
    -0.5..0.5, large against sigmoid scores, so it changes which experts are chosen), saved as DeepSeek's
    checkpoints keep it: fp32 (transformers holds it as a bf16 buffer and would save it so).  bias_from: a
    checkpoint written by this function whose tensors are kept, all but the bias (the bias-only v2)."""
    import json
    import shutil
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    if bias_from is None:
        model = AutoModelForCausalLM.from_config(mla_config()).to(torch.bfloat16)
        randomize(model)
        model.save_pretrained(out)
        with open(os.path.join(out, "config.json")) as f:
            cfg = json.load(f)
        cfg.update(topk_method="noaux_tc", scoring_func="sigmoid")
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
    else:
        shutil.copytree(bias_from, out, dirs_exist_ok=True)
    sd = load_file(os.path.join(out, "model.safetensors"))
    for k in sd:
        if k.endswith(BIAS):
            sd[k] = torch.empty(sd[k].shape, dtype=torch.float32).uniform_(-0.5, 0.5)
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return out


def add_mtp(src: str, out: str, seed: int):
    """The write_mla checkpoint `src` with one DeepSeek MTP layer (num_nextn_predict_layers=1): layer 2 = layer 1's
    tensors plus enorm, hnorm, eh_proj, shared_head.norm and shared_head.head, random (transformers writes no MTP
    layer; the names are the ones vLLM 0.32's DeepSeekMTP loads)."""
    import json
    import shutil
    import torch
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, out, dirs_exist_ok=True)
    sd = load_file(os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    h, v, last = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    g = torch.Generator().manual_seed(seed)
    for k in list(sd):
        if k.startswith(f"model.layers.{last - 1}."):
            sd[k.replace(f"model.layers.{last - 1}.", f"model.layers.{last}.")] = sd[k].clone()
    for n, shape in (("enorm.weight", [h]), ("hnorm.weight", [h]), ("shared_head.norm.weight", [h]),
                     ("eh_proj.weight", [h, 2 * h]), ("shared_head.head.weight", [v, h])):
        t = torch.rand(shape, generator=g) + 0.5 if len(shape) == 1 else torch.randn(shape, generator=g) * 0.05
        sd[f"model.layers.{last}.{n}"] = t.to(torch.bfloat16)
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg["num_nextn_predict_layers"] = 1
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return out


def randomize(model):
    """normal(0, 0.05) for matrices, uniform(0.5, 1.5) for norms and biases, in place (the caller seeds torch)."""
    import torch
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.05)
            else:
                p.uniform_(0.5, 1.5)


def write(kind: str, out: str, seed: int, bad: bool = False, **over):
    """Random weights (normal(0, 0.05) for matrices, uniform(0.5, 1.5) for norms: every value differs between
    seeds), bf16, saved with save_pretrained as one model.safetensors."""
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(kind, bad, **over)).to(torch.bfloat16)
    randomize(model)
    model.save_pretrained(out)
    return out


def write_all(root: str):
    paths = {}
    for kind in (MOE, DENSE):
        for ver, seed in (("v1", 1), ("v2", 2)):
            paths[(kind, ver)] = write(kind, os.path.join(root, ver, kind), seed)
        paths[(kind, "bad")] = write(kind, os.path.join(root, "bad", kind), 3, bad=True)
    return paths


if __name__ == "__main__":
    for k, v in write_all(sys.argv[1]).items():
        print(k, v)
