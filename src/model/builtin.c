/* Built-in model specs.  Real models carry the numbers of their published
 * Hugging Face config.json; tiny models exist for tests (small enough to fill
 * and verify every byte in every layout of the test matrix). */
#include "model/model.h"

#define BF16 REFIT_DTYPE_BF16

static const refit_model_spec_t g_specs[] = {
    /* Qwen/Qwen3-8B */
    {.name = "qwen3-8b", .arch = REFIT_ARCH_DENSE, .dtype = BF16, .hidden = 4096, .layers = 36, .heads = 32,
     .kv_heads = 8, .head_dim = 128, .intermediate = 12288, .vocab = 151936, .qk_norm = true},
    /* Qwen/Qwen3-30B-A3B: 61,064,245,248 bytes in bf16 */
    {.name = "qwen3-30b-a3b", .arch = REFIT_ARCH_MOE, .dtype = BF16, .hidden = 2048, .layers = 48, .heads = 32,
     .kv_heads = 4, .head_dim = 128, .intermediate = 6144, .experts = 128, .moe_intermediate = 768,
     .vocab = 151936, .qk_norm = true},
    /* Qwen/Qwen3-235B-A22B */
    {.name = "qwen3-235b-a22b", .arch = REFIT_ARCH_MOE, .dtype = BF16, .hidden = 4096, .layers = 94, .heads = 64,
     .kv_heads = 4, .head_dim = 128, .intermediate = 12288, .experts = 128, .moe_intermediate = 1536,
     .vocab = 151936, .qk_norm = true},
    /* meta-llama/Meta-Llama-3-8B */
    {.name = "llama3-8b", .arch = REFIT_ARCH_DENSE, .dtype = BF16, .hidden = 4096, .layers = 32, .heads = 32,
     .kv_heads = 8, .head_dim = 128, .intermediate = 14336, .vocab = 128256},
    /* meta-llama/Meta-Llama-3-70B */
    {.name = "llama3-70b", .arch = REFIT_ARCH_DENSE, .dtype = BF16, .hidden = 8192, .layers = 80, .heads = 64,
     .kv_heads = 8, .head_dim = 128, .intermediate = 28672, .vocab = 128256},
    /* deepseek-ai/DeepSeek-V3 (the 61 main layers; the MTP layer is not included) */
    {.name = "deepseek-v3", .arch = REFIT_ARCH_MLA, .dtype = BF16, .hidden = 7168, .layers = 61, .heads = 128,
     .kv_heads = 128, .intermediate = 18432, .experts = 256, .moe_intermediate = 2048, .shared_experts = 1,
     .first_dense = 3, .vocab = 129280, .router_bias = true, .q_lora_rank = 1536, .kv_lora_rank = 512,
     .qk_nope_dim = 128, .qk_rope_dim = 64, .v_head_dim = 128},
    /* moonshotai/Kimi-K2-Instruct */
    {.name = "kimi-k2", .arch = REFIT_ARCH_MLA, .dtype = BF16, .hidden = 7168, .layers = 61, .heads = 64,
     .kv_heads = 64, .intermediate = 18432, .experts = 384, .moe_intermediate = 2048, .shared_experts = 1,
     .first_dense = 1, .vocab = 163840, .router_bias = true, .q_lora_rank = 1536, .kv_lora_rank = 512,
     .qk_nope_dim = 128, .qk_rope_dim = 64, .v_head_dim = 128},
    /* The demo's model: qwen3-30b-a3b's structure (48 layers, 128 experts, 32
     * heads / 4 kv heads, q/k norms, real vocabulary) with narrower matrices,
     * 1.06 GB in bf16, so that trainer and rollout ranks fit one small host. */
    {.name = "qwen3-30b-a3b-mini", .arch = REFIT_ARCH_MOE, .dtype = BF16, .hidden = 256, .layers = 48, .heads = 32,
     .kv_heads = 4, .head_dim = 32, .intermediate = 768, .experts = 128, .moe_intermediate = 96, .vocab = 151936,
     .qk_norm = true},
    /* Test models.  tiny-dense: GQA with 2 kv heads (fewer than tp 4 and 8),
     * odd vocab, head_dim != hidden/heads as in Qwen3. */
    {.name = "tiny-dense", .arch = REFIT_ARCH_DENSE, .dtype = BF16, .hidden = 64, .layers = 4, .heads = 8,
     .kv_heads = 2, .head_dim = 16, .intermediate = 96, .vocab = 997, .qk_norm = true},
    /* tiny-tied: tied embeddings, llama style (no qk norm), 1 kv head. */
    {.name = "tiny-tied", .arch = REFIT_ARCH_DENSE, .dtype = BF16, .hidden = 64, .layers = 2, .heads = 4,
     .kv_heads = 1, .head_dim = 16, .intermediate = 64, .vocab = 1001, .tie = true},
    /* tiny-moe: Qwen3-MoE shaped, 8 experts, 2 kv heads, odd vocab. */
    {.name = "tiny-moe", .arch = REFIT_ARCH_MOE, .dtype = BF16, .hidden = 64, .layers = 4, .heads = 8,
     .kv_heads = 2, .head_dim = 16, .intermediate = 192, .experts = 8, .moe_intermediate = 32, .vocab = 997,
     .qk_norm = true},
    /* tiny-mla: DeepSeek-V3 shaped: MLA, 1 dense layer, shared expert, router bias. */
    {.name = "tiny-mla", .arch = REFIT_ARCH_MLA, .dtype = BF16, .hidden = 64, .layers = 3, .heads = 8,
     .kv_heads = 8, .intermediate = 96, .experts = 8, .moe_intermediate = 16, .shared_experts = 1,
     .first_dense = 1, .vocab = 997, .router_bias = true, .q_lora_rank = 32, .kv_lora_rank = 16,
     .qk_nope_dim = 8, .qk_rope_dim = 4, .v_head_dim = 8},
    /* FP8 targets: every linear dimension a multiple of 128, so
     * 128x128 blocks align with vLLM tp=2 shards (head_dim 128, 2 kv heads,
     * expert width 256).  tiny-fp8 for tests; qwen3-fp8-mini (~0.4 GB) for the bench. */
    {.name = "tiny-fp8", .arch = REFIT_ARCH_MOE, .dtype = BF16, .hidden = 256, .layers = 2, .heads = 4,
     .kv_heads = 2, .head_dim = 128, .intermediate = 512, .experts = 4, .moe_intermediate = 256, .vocab = 1000,
     .qk_norm = true},
    {.name = "qwen3-fp8-mini", .arch = REFIT_ARCH_MOE, .dtype = BF16, .hidden = 1024, .layers = 4, .heads = 8,
     .kv_heads = 2, .head_dim = 128, .intermediate = 2048, .experts = 32, .moe_intermediate = 512, .vocab = 8192,
     .qk_norm = true},
    {.name = ""},
};

const refit_model_spec_t *refit_builtin_specs(void) { return g_specs; }
