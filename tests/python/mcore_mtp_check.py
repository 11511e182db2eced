"""Issue 35, run by hand (not a ctest: ~15 s idle, a minute on the loaded VM): the megatron layout's MTP block
(megatron:...,mtp=N) against a real Megatron-Core GPTModel (megatron-core 0.16.1 from the vLLM venv) with one MTP
layer, built on the CPU at tp=2 (two gloo processes), tiny-mtp's numbers (MLA, MoE with expert bias, shared expert).

    REFIT_LIBRARY=build/librefit.so PYTHONPATH=python .../vllm-venv/bin/python tests/python/mcore_mtp_check.py

Megatron-Core builds only its local layer spec without Transformer Engine, and 0.16.1's MLA needs three stand-ins to
build there (core attention, which holds no parameters; the TELinear check; the rotary table's CUDA device), none of
which changes a parameter's name or shape.  Each rank's mtp.* parameters (and the router's expert_bias buffer) are
mapped to the Transformer Engine names the layout uses (refit.adapters.megatron_names, plus the local spec's MLA
q_layernorm / kv_layernorm, which TE fuses into linear_q_up_proj / linear_kv_up_proj) and compared, name and shape,
with the layout's local tensors.  Known difference, reported and not a failure: the local spec splits
linear_q_down_proj / linear_kv_down_proj over tp, the TE spec (refit's megatron scheme) replicates them."""
import json
import os
import socket
import subprocess
import sys

DOWN = (".self_attention.linear_q_down_proj.weight", ".self_attention.linear_kv_down_proj.weight")
NORMS = ((".self_attention.q_layernorm.weight", ".self_attention.linear_q_up_proj.layer_norm_weight"),
         (".self_attention.kv_layernorm.weight", ".self_attention.linear_kv_up_proj.layer_norm_weight"))


def rank_main(rank, world, port):
    import torch
    torch.cuda.current_device = lambda: "cpu"  # MLA's rotary table asks for the CUDA device (names/shapes unaffected)
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    import megatron.core.transformer.multi_latent_attention as mla
    mla.HAVE_TE = False  # its TELinear import yields no class without Transformer Engine
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer.transformer_config import MLATransformerConfig
    cfg = MLATransformerConfig(
        num_layers=3, hidden_size=64, num_attention_heads=8, ffn_hidden_size=96, q_lora_rank=32, kv_lora_rank=16,
        qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=8, qk_layernorm=True, normalization="RMSNorm",
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False,
        use_cpu_initialization=True, params_dtype=torch.bfloat16, bf16=True, tensor_model_parallel_size=world,
        sequence_parallel=False, num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=16,
        moe_grouped_gemm=False, moe_shared_expert_intermediate_size=16, moe_layer_freq=[0, 1, 1],
        moe_token_dispatcher_type="allgather", moe_router_enable_expert_bias=True, moe_router_score_function="sigmoid",
        mtp_num_layers=1, rope_type="rope", multi_latent_attention=True)
    block = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization="RMSNorm")

    class NoCoreAttention(torch.nn.Module):  # 0.16.1's local DotProductAttention refuses MLA's k_channels
        def __init__(self, *a, **k):
            super().__init__()

    for ls in block.layer_specs:
        ls.submodules.self_attention.submodules.core_attention = NoCoreAttention
    mtp = get_gpt_mtp_block_spec(cfg, block.layer_specs[-1], use_transformer_engine=False)
    model = GPTModel(config=cfg, transformer_layer_spec=block, vocab_size=1024, max_sequence_length=64,
                     position_embedding_type="rope", mtp_block_spec=mtp)
    out = {n: [str(p.dtype), list(p.shape)] for n, p in model.named_parameters()}
    out.update({n: [str(b.dtype), list(b.shape)] for n, b in model.named_buffers() if n.endswith("expert_bias")})
    print("JSON" + json.dumps(out), flush=True)


def check(rank, live):
    import refit
    from refit.adapters import megatron_names
    locs = {l.name: l for l in refit.Layout("megatron:tp=2,mtp=1").manifest(refit.Model("tiny-mtp"), rank).locals()}
    want = {n: l for n, l in locs.items() if n.startswith("mtp.")}
    names = megatron_names([n for n in live if n.startswith("mtp.")], set(locs))
    got = {}
    for n, t in names.items():
        for a, b in NORMS:
            t = t[:-len(a)] + b if t.endswith(a) else t
        got[t] = live[n]
    problems, known = [], []
    for n in sorted(set(want) | set(got)):
        if n not in got or n not in want:
            problems.append(f"{n}: only in {'the layout' if n in want else 'megatron-core'}")
            continue
        shape = list(want[n].shape)
        if got[n][1] != shape:
            (known if n.endswith(DOWN) else problems).append(f"{n}: megatron-core {got[n][1]}, layout {shape}")
    return {"rank": rank, "compared": len(want), "problems": problems, "known_local_spec_differences": known,
            "eh_proj": got.get("mtp.layers.0.eh_proj.weight")}


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "rank", str(r), str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for r in range(2)]
    res = []
    for r, p in enumerate(procs):
        text, _ = p.communicate(timeout=600)
        line = next((l for l in text.splitlines() if l.startswith("JSON")), None)
        if p.returncode or line is None:
            sys.exit(f"rank {r} failed (exit {p.returncode})")
        res.append(check(r, json.loads(line[4:])))
    print(json.dumps(res, indent=1))
    sys.exit(1 if any(x["problems"] for x in res) else 0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        rank_main(int(sys.argv[2]), 2, int(sys.argv[3]))
    else:
        main()
