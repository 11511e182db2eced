/* Models from config.json files (the published configs of real models must
 * give exactly the built-in models), refit_model_open, built-in lookups and
 * the errors of config reading. */
#include "testutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "model/model.h"

/* ---- published config.json files ------------------------------------------ */

/* Qwen/Qwen3-30B-A3B */
static const char QWEN3_30B_A3B[] = "{\n"
                                    "  \"architectures\": [\"Qwen3MoeForCausalLM\"],\n"
                                    "  \"attention_bias\": false,\n"
                                    "  \"attention_dropout\": 0.0,\n"
                                    "  \"bos_token_id\": 151643,\n"
                                    "  \"decoder_sparse_step\": 1,\n"
                                    "  \"eos_token_id\": 151645,\n"
                                    "  \"head_dim\": 128,\n"
                                    "  \"hidden_act\": \"silu\",\n"
                                    "  \"hidden_size\": 2048,\n"
                                    "  \"initializer_range\": 0.02,\n"
                                    "  \"intermediate_size\": 6144,\n"
                                    "  \"max_position_embeddings\": 40960,\n"
                                    "  \"max_window_layers\": 48,\n"
                                    "  \"mlp_only_layers\": [],\n"
                                    "  \"model_type\": \"qwen3_moe\",\n"
                                    "  \"moe_intermediate_size\": 768,\n"
                                    "  \"norm_topk_prob\": true,\n"
                                    "  \"num_attention_heads\": 32,\n"
                                    "  \"num_experts\": 128,\n"
                                    "  \"num_experts_per_tok\": 8,\n"
                                    "  \"num_hidden_layers\": 48,\n"
                                    "  \"num_key_value_heads\": 4,\n"
                                    "  \"output_router_logits\": false,\n"
                                    "  \"rms_norm_eps\": 1e-06,\n"
                                    "  \"rope_scaling\": null,\n"
                                    "  \"rope_theta\": 1000000.0,\n"
                                    "  \"router_aux_loss_coef\": 0.001,\n"
                                    "  \"sliding_window\": null,\n"
                                    "  \"tie_word_embeddings\": false,\n"
                                    "  \"torch_dtype\": \"bfloat16\",\n"
                                    "  \"transformers_version\": \"4.51.0\",\n"
                                    "  \"use_cache\": true,\n"
                                    "  \"use_sliding_window\": false,\n"
                                    "  \"vocab_size\": 151936\n"
                                    "}\n";

/* deepseek-ai/DeepSeek-V3 (its weights are published in fp8 with scales; the
 * model describes them in bf16, as the built-in does) */
static const char DEEPSEEK_V3[] = "{\n"
                                  "  \"architectures\": [\"DeepseekV3ForCausalLM\"],\n"
                                  "  \"attention_bias\": false,\n"
                                  "  \"attention_dropout\": 0.0,\n"
                                  "  \"auto_map\": {\n"
                                  "    \"AutoConfig\": \"configuration_deepseek.DeepseekV3Config\",\n"
                                  "    \"AutoModel\": \"modeling_deepseek.DeepseekV3Model\",\n"
                                  "    \"AutoModelForCausalLM\": \"modeling_deepseek.DeepseekV3ForCausalLM\"\n"
                                  "  },\n"
                                  "  \"aux_loss_alpha\": 0.001,\n"
                                  "  \"bos_token_id\": 0,\n"
                                  "  \"eos_token_id\": 1,\n"
                                  "  \"ep_size\": 1,\n"
                                  "  \"first_k_dense_replace\": 3,\n"
                                  "  \"hidden_act\": \"silu\",\n"
                                  "  \"hidden_size\": 7168,\n"
                                  "  \"initializer_range\": 0.02,\n"
                                  "  \"intermediate_size\": 18432,\n"
                                  "  \"kv_lora_rank\": 512,\n"
                                  "  \"max_position_embeddings\": 163840,\n"
                                  "  \"model_type\": \"deepseek_v3\",\n"
                                  "  \"moe_intermediate_size\": 2048,\n"
                                  "  \"moe_layer_freq\": 1,\n"
                                  "  \"n_group\": 8,\n"
                                  "  \"n_routed_experts\": 256,\n"
                                  "  \"n_shared_experts\": 1,\n"
                                  "  \"norm_topk_prob\": true,\n"
                                  "  \"num_attention_heads\": 128,\n"
                                  "  \"num_experts_per_tok\": 8,\n"
                                  "  \"num_hidden_layers\": 61,\n"
                                  "  \"num_key_value_heads\": 128,\n"
                                  "  \"num_nextn_predict_layers\": 1,\n"
                                  "  \"q_lora_rank\": 1536,\n"
                                  "  \"qk_nope_head_dim\": 128,\n"
                                  "  \"qk_rope_head_dim\": 64,\n"
                                  "  \"quantization_config\": {\n"
                                  "    \"activation_scheme\": \"dynamic\",\n"
                                  "    \"fmt\": \"e4m3\",\n"
                                  "    \"quant_method\": \"fp8\",\n"
                                  "    \"weight_block_size\": [128, 128]\n"
                                  "  },\n"
                                  "  \"rms_norm_eps\": 1e-06,\n"
                                  "  \"rope_scaling\": {\n"
                                  "    \"beta_fast\": 32,\n"
                                  "    \"beta_slow\": 1,\n"
                                  "    \"factor\": 40,\n"
                                  "    \"mscale\": 1.0,\n"
                                  "    \"mscale_all_dim\": 1.0,\n"
                                  "    \"original_max_position_embeddings\": 4096,\n"
                                  "    \"type\": \"yarn\"\n"
                                  "  },\n"
                                  "  \"rope_theta\": 10000,\n"
                                  "  \"routed_scaling_factor\": 2.5,\n"
                                  "  \"scoring_func\": \"sigmoid\",\n"
                                  "  \"tie_word_embeddings\": false,\n"
                                  "  \"topk_group\": 4,\n"
                                  "  \"topk_method\": \"noaux_tc\",\n"
                                  "  \"torch_dtype\": \"bfloat16\",\n"
                                  "  \"transformers_version\": \"4.33.1\",\n"
                                  "  \"use_cache\": true,\n"
                                  "  \"v_head_dim\": 128,\n"
                                  "  \"vocab_size\": 129280\n"
                                  "}\n";

/* moonshotai/Kimi-K2-Instruct (model_type kimi_k2, DeepSeek-V3 classes) */
static const char KIMI_K2[] = "{\n"
                              "  \"architectures\": [\"DeepseekV3ForCausalLM\"],\n"
                              "  \"attention_bias\": false,\n"
                              "  \"first_k_dense_replace\": 1,\n"
                              "  \"hidden_size\": 7168,\n"
                              "  \"intermediate_size\": 18432,\n"
                              "  \"kv_lora_rank\": 512,\n"
                              "  \"model_type\": \"kimi_k2\",\n"
                              "  \"moe_intermediate_size\": 2048,\n"
                              "  \"moe_layer_freq\": 1,\n"
                              "  \"n_group\": 1,\n"
                              "  \"n_routed_experts\": 384,\n"
                              "  \"n_shared_experts\": 1,\n"
                              "  \"num_attention_heads\": 64,\n"
                              "  \"num_experts_per_tok\": 8,\n"
                              "  \"num_hidden_layers\": 61,\n"
                              "  \"num_key_value_heads\": 64,\n"
                              "  \"q_lora_rank\": 1536,\n"
                              "  \"qk_nope_head_dim\": 128,\n"
                              "  \"qk_rope_head_dim\": 64,\n"
                              "  \"tie_word_embeddings\": false,\n"
                              "  \"topk_method\": \"noaux_tc\",\n"
                              "  \"torch_dtype\": \"bfloat16\",\n"
                              "  \"v_head_dim\": 128,\n"
                              "  \"vocab_size\": 163840\n"
                              "}\n";

/* meta-llama/Meta-Llama-3-8B (no head_dim: hidden_size / num_attention_heads) */
static const char LLAMA3_8B[] = "{\n"
                                "  \"architectures\": [\"LlamaForCausalLM\"],\n"
                                "  \"attention_bias\": false,\n"
                                "  \"attention_dropout\": 0.0,\n"
                                "  \"bos_token_id\": 128000,\n"
                                "  \"eos_token_id\": 128001,\n"
                                "  \"hidden_act\": \"silu\",\n"
                                "  \"hidden_size\": 4096,\n"
                                "  \"initializer_range\": 0.02,\n"
                                "  \"intermediate_size\": 14336,\n"
                                "  \"max_position_embeddings\": 8192,\n"
                                "  \"model_type\": \"llama\",\n"
                                "  \"num_attention_heads\": 32,\n"
                                "  \"num_hidden_layers\": 32,\n"
                                "  \"num_key_value_heads\": 8,\n"
                                "  \"pretraining_tp\": 1,\n"
                                "  \"rms_norm_eps\": 1e-05,\n"
                                "  \"rope_scaling\": null,\n"
                                "  \"rope_theta\": 500000.0,\n"
                                "  \"tie_word_embeddings\": false,\n"
                                "  \"torch_dtype\": \"bfloat16\",\n"
                                "  \"transformers_version\": \"4.40.0.dev0\",\n"
                                "  \"use_cache\": true,\n"
                                "  \"vocab_size\": 128256\n"
                                "}\n";

/* Qwen/Qwen3-8B */
static const char QWEN3_8B[] = "{\n"
                               "  \"architectures\": [\"Qwen3ForCausalLM\"],\n"
                               "  \"attention_bias\": false,\n"
                               "  \"head_dim\": 128,\n"
                               "  \"hidden_size\": 4096,\n"
                               "  \"intermediate_size\": 12288,\n"
                               "  \"model_type\": \"qwen3\",\n"
                               "  \"num_attention_heads\": 32,\n"
                               "  \"num_hidden_layers\": 36,\n"
                               "  \"num_key_value_heads\": 8,\n"
                               "  \"tie_word_embeddings\": false,\n"
                               "  \"torch_dtype\": \"bfloat16\",\n"
                               "  \"vocab_size\": 151936\n"
                               "}\n";

/* ---- a temporary directory ------------------------------------------------ */

static char g_tmp[256];

static int setup_dir(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(g_tmp, sizeof(g_tmp), "%s/refit-config-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(g_tmp) ? 0 : -1;
}

/* Paths created, removed (deepest first) by teardown. */
static char *g_made[64];
static size_t g_nmade;

static const char *remember(char *path)
{
    assert_non_null(path);
    assert_true(g_nmade < sizeof(g_made) / sizeof(g_made[0]));
    return g_made[g_nmade++] = path;
}

static int teardown_dir(void **state)
{
    (void)state;
    while (g_nmade) {
        char *p = g_made[--g_nmade];
        struct stat sb;
        if (stat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) rmdir(p);
        else unlink(p);
        free(p);
    }
    return rmdir(g_tmp);
}

/* Makes g_tmp/dir (once) and returns its path. */
static const char *make_dir(const char *dir)
{
    char *p = malloc(strlen(g_tmp) + strlen(dir) + 2);
    assert_non_null(p);
    sprintf(p, "%s/%s", g_tmp, dir);
    if (mkdir(p, 0700) != 0) {
        assert_int_equal(errno, EEXIST);
        free(p);
        for (size_t i = 0; i < g_nmade; i++)
            if (strcmp(g_made[i] + strlen(g_tmp) + 1, dir) == 0) return g_made[i];
        fail_msg("%s exists but was not made here", dir);
    }
    return remember(p);
}

/* Writes text as g_tmp/dir/name (dir made if needed); returns the file path. */
static const char *write_config(const char *dir, const char *name, const char *text)
{
    const char *d = make_dir(dir);
    char *p = malloc(strlen(d) + strlen(name) + 2);
    assert_non_null(p);
    sprintf(p, "%s/%s", d, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
    for (size_t i = 0; i < g_nmade; i++)
        if (strcmp(g_made[i], p) == 0) {
            free(p);
            return g_made[i];
        }
    return remember(p);
}

/* The config text with field key's value (the rest of its line, less a
 * trailing comma) replaced by value, or the line removed when value is NULL;
 * a key not in the text is added first. */
static char *with_field(const char *base, const char *key, const char *value)
{
    char pat[128];
    snprintf(pat, sizeof(pat), "\n  \"%s\": ", key);
    const char *at = strstr(base, pat);
    size_t cap = strlen(base) + (value ? strlen(value) : 0) + strlen(pat) + 8;
    char *out = malloc(cap);
    assert_non_null(out);
    if (!at) {
        assert_non_null(value);
        assert_int_equal(base[0], '{');
        snprintf(out, cap, "{\n  \"%s\": %s,%s", key, value, base + 1);
        return out;
    }
    const char *eol = strchr(at + 1, '\n');
    bool comma = eol[-1] == ',';
    size_t head = (size_t)(at - base);
    if (value) snprintf(out, cap, "%.*s%s%s%s%s", (int)head, base, pat, value, comma ? "," : "", eol);
    else if (comma || base[head - 1] != ',') snprintf(out, cap, "%.*s%s", (int)head, base, eol);
    else snprintf(out, cap, "%.*s%s", (int)head - 1, base, eol); /* the last field: drop the comma before it */
    return out;
}

/* ---- comparisons ---------------------------------------------------------- */

static void assert_same_tensors(const refit_model_t *a, const refit_model_t *b)
{
    assert_int_equal(refit_model_num_tensors(a), refit_model_num_tensors(b));
    for (size_t i = 0; i < refit_model_num_tensors(a); i++) {
        refit_tensor_info_t ta, tb;
        REFIT_ASSERT_OK(refit_model_tensor(a, i, &ta));
        REFIT_ASSERT_OK(refit_model_tensor(b, i, &tb));
        if (strcmp(ta.name, tb.name) != 0) fail_msg("tensor %zu: %s vs %s", i, ta.name, tb.name);
        assert_int_equal(ta.dtype, tb.dtype);
        assert_int_equal(ta.ndim, tb.ndim);
        for (uint32_t d = 0; d < ta.ndim; d++)
            if (ta.shape[d] != tb.shape[d])
                fail_msg("tensor %s dim %u: %llu vs %llu", ta.name, d, (unsigned long long)ta.shape[d],
                         (unsigned long long)tb.shape[d]);
    }
    assert_true(refit_model_total_bytes(a) == refit_model_total_bytes(b));
}

/* The config (in g_tmp/dir/config.json) read by file and by directory gives
 * the built-in model `builtin` (whose total is `bytes`), named dir. */
static void check_published(const char *dir, const char *text, const char *builtin, uint64_t bytes)
{
    const char *file = write_config(dir, "config.json", text);
    refit_model_t *fromfile, *fromdir, *ref;
    REFIT_ASSERT_OK(refit_model_from_config(file, &fromfile));
    REFIT_ASSERT_OK(refit_model_from_config(make_dir(dir), &fromdir));
    REFIT_ASSERT_OK(refit_model_builtin(builtin, &ref));
    assert_same_tensors(fromfile, ref);
    assert_same_tensors(fromdir, ref);
    assert_true(refit_model_total_bytes(fromfile) == bytes);
    assert_string_equal(refit_model_name(fromfile), dir);
    assert_string_equal(refit_model_name(fromdir), dir);
    /* The internal specs agree number for number, name aside. */
    refit_model_spec_t sa = fromfile->spec, sb = ref->spec;
    memset(sa.name, 0, sizeof(sa.name));
    memset(sb.name, 0, sizeof(sb.name));
    assert_memory_equal(&sa, &sb, sizeof(sa));
    refit_model_destroy(fromfile);
    refit_model_destroy(fromdir);
    refit_model_destroy(ref);
}

static void test_qwen3_30b_a3b(void **state)
{
    (void)state;
    check_published("Qwen3-30B-A3B", QWEN3_30B_A3B, "qwen3-30b-a3b", 61064245248ULL);
}

static void test_deepseek_v3(void **state)
{
    (void)state;
    /* The main model's 671.03 B parameters and its MTP layer's 11.61 B
     * (num_nextn_predict_layers 1; DeepSeek's "14B MTP module" also counts
     * the layer's copies of the embedding and output head, 2 x 0.93 B, which
     * are the main model's and not canonical tensors). */
    check_published("DeepSeek-V3", DEEPSEEK_V3, "deepseek-v3", 1365273005056ULL);
}

static void test_kimi_k2(void **state)
{
    (void)state;
    check_published("Kimi-K2-Instruct", KIMI_K2, "kimi-k2", 2052816510976ULL);
}

static void test_llama3_8b(void **state)
{
    (void)state;
    check_published("Meta-Llama-3-8B", LLAMA3_8B, "llama3-8b", 16060522496ULL);
}

static void test_qwen3_8b(void **state)
{
    (void)state;
    check_published("Qwen3-8B", QWEN3_8B, "qwen3-8b", 16381470720ULL);
}

/* ---- built-in models ------------------------------------------------------ */

static void test_builtin_totals(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        uint64_t bytes;
    } real[] = {
        {"qwen3-30b-a3b", 61064245248ULL}, {"qwen3-8b", 16381470720ULL},  {"llama3-8b", 16060522496ULL},
        {"deepseek-v3", 1365273005056ULL}, {"kimi-k2", 2052816510976ULL}, {"qwen3-235b-a22b", 470187269120ULL},
        {"llama3-70b", 141107412992ULL},
    };
    for (size_t i = 0; i < sizeof(real) / sizeof(real[0]); i++) {
        refit_model_t *m;
        REFIT_ASSERT_OK(refit_model_builtin(real[i].name, &m));
        if (refit_model_total_bytes(m) != real[i].bytes)
            fail_msg("%s: %llu bytes, want %llu", real[i].name, (unsigned long long)refit_model_total_bytes(m),
                     (unsigned long long)real[i].bytes);
        uint64_t bytes = 0, params = 0;
        for (size_t t = 0; t < refit_model_num_tensors(m); t++) {
            refit_tensor_info_t ti;
            REFIT_ASSERT_OK(refit_model_tensor(m, t, &ti));
            bytes += refit_tensor_nbytes(&ti);
            params += refit_tensor_numel(&ti);
        }
        assert_true(bytes == real[i].bytes);
        /* The published parameter count of Llama-3-8B. */
        if (strcmp(real[i].name, "llama3-8b") == 0) assert_true(params == 8030261248ULL);
        refit_model_destroy(m);
    }
}

static void test_builtin_names(void **state)
{
    (void)state;
    size_t n = 0;
    for (const char *name; (name = refit_model_builtin_name(n)); n++) {
        refit_model_t *m = NULL, *opened = NULL;
        REFIT_ASSERT_OK(refit_model_builtin(name, &m));
        assert_string_equal(refit_model_name(m), name);
        assert_true(refit_model_num_tensors(m) > 0);
        assert_true(refit_model_total_bytes(m) > 0);
        REFIT_ASSERT_OK(refit_model_open(name, &opened));
        assert_same_tensors(m, opened);
        refit_model_destroy(m);
        refit_model_destroy(opened);
    }
    assert_true(n >= 11);
    assert_null(refit_model_builtin_name(n));
    assert_null(refit_model_builtin_name((size_t)-1));
    refit_model_t *m = (refit_model_t *)&m;
    REFIT_ASSERT_ERR(refit_model_builtin("qwen3-31b", &m), REFIT_ERR_NOT_FOUND, "qwen3-31b");
    REFIT_ASSERT_ERR(refit_model_builtin("QWEN3-8B", &m), REFIT_ERR_NOT_FOUND, "known: qwen3-8b, qwen3-30b-a3b");
    REFIT_ASSERT_ERR(refit_model_builtin("", &m), REFIT_ERR_NOT_FOUND, "tiny-mla");
    assert_ptr_equal(m, (refit_model_t *)&m);
    REFIT_ASSERT_ERR(refit_model_builtin(NULL, &m), REFIT_ERR_INVALID_ARG, NULL);
    REFIT_ASSERT_ERR(refit_model_builtin("tiny-moe", NULL), REFIT_ERR_INVALID_ARG, NULL);
    refit_model_destroy(NULL);
}

static void test_find_tensor(void **state)
{
    (void)state;
    refit_model_t *m;
    REFIT_ASSERT_OK(refit_model_builtin("qwen3-30b-a3b", &m));
    size_t n = refit_model_num_tensors(m);
    /* embed, 48 x (2 norms + 4 attention + 2 qk norms + router + 128 x 3 experts), final norm, lm_head */
    assert_int_equal(n, 1 + 48 * (2 + 4 + 2 + 1 + 128 * 3) + 2);
    assert_int_equal(refit_model_find_tensor(m, "model.embed_tokens.weight"), 0);
    assert_int_equal(refit_model_find_tensor(m, "lm_head.weight"), (int64_t)n - 1);
    assert_int_equal(refit_model_find_tensor(m, "model.norm.weight"), (int64_t)n - 2);
    int64_t i = refit_model_find_tensor(m, "model.layers.47.mlp.experts.127.down_proj.weight");
    assert_true(i > 0);
    refit_tensor_info_t t;
    REFIT_ASSERT_OK(refit_model_tensor(m, (size_t)i, &t));
    assert_string_equal(t.name, "model.layers.47.mlp.experts.127.down_proj.weight");
    assert_int_equal(t.ndim, 2);
    assert_int_equal(t.shape[0], 2048);
    assert_int_equal(t.shape[1], 768);
    for (size_t k = 0; k < n; k += 97) {
        REFIT_ASSERT_OK(refit_model_tensor(m, k, &t));
        assert_int_equal(refit_model_find_tensor(m, t.name), (int64_t)k);
    }
    assert_int_equal(refit_model_find_tensor(m, "model.layers.48.input_layernorm.weight"), -1);
    assert_int_equal(refit_model_find_tensor(m, "model.layers.0.mlp.experts.128.up_proj.weight"), -1);
    assert_int_equal(refit_model_find_tensor(m, ""), -1);
    assert_int_equal(refit_model_find_tensor(m, NULL), -1);
    assert_int_equal(refit_model_find_tensor(NULL, "lm_head.weight"), -1);
    REFIT_ASSERT_ERR(refit_model_tensor(m, n, &t), REFIT_ERR_INVALID_ARG, "out of range");
    refit_model_destroy(m);
    /* Tied embeddings: no lm_head. */
    REFIT_ASSERT_OK(refit_model_builtin("tiny-tied", &m));
    assert_int_equal(refit_model_find_tensor(m, "lm_head.weight"), -1);
    assert_true(refit_model_find_tensor(m, "model.embed_tokens.weight") == 0);
    refit_model_destroy(m);
}

/* ---- variations on the published configs ---------------------------------- */

static refit_model_t *from_text(const char *text, const char *hint)
{
    refit_model_t *m = NULL;
    REFIT_ASSERT_OK(refit_model_from_config_text(text, strlen(text), hint, &m));
    return m;
}

static void test_defaults_and_options(void **state)
{
    (void)state;
    refit_model_t *m, *ref;
    /* No num_key_value_heads (or null): one kv head per head. */
    char *t = with_field(LLAMA3_8B, "num_key_value_heads", NULL);
    m = from_text(t, NULL);
    assert_string_equal(refit_model_name(m), "custom");
    assert_int_equal(m->spec.kv_heads, 32);
    assert_int_equal(m->spec.head_dim, 128);
    refit_model_destroy(m);
    free(t);
    t = with_field(LLAMA3_8B, "num_key_value_heads", "null");
    m = from_text(t, "");
    assert_int_equal(m->spec.kv_heads, 32);
    assert_string_equal(refit_model_name(m), "custom");
    refit_model_destroy(m);
    free(t);
    /* head_dim given explicitly, unlike hidden / heads (as Qwen3 does). */
    t = with_field(LLAMA3_8B, "head_dim", "64");
    m = from_text(t, "x");
    assert_int_equal(m->spec.head_dim, 64);
    refit_model_destroy(m);
    free(t);
    /* Tied embeddings: the built-in's tensors less lm_head. */
    t = with_field(LLAMA3_8B, "tie_word_embeddings", "true");
    m = from_text(t, NULL);
    REFIT_ASSERT_OK(refit_model_builtin("llama3-8b", &ref));
    assert_int_equal(refit_model_num_tensors(m) + 1, refit_model_num_tensors(ref));
    assert_int_equal(refit_model_find_tensor(m, "lm_head.weight"), -1);
    assert_true(refit_model_total_bytes(m) == refit_model_total_bytes(ref) - 128256ULL * 4096 * 2);
    refit_model_destroy(m);
    refit_model_destroy(ref);
    free(t);
    /* No tie_word_embeddings: untied. No torch_dtype: bf16. */
    char *t2 = with_field(LLAMA3_8B, "tie_word_embeddings", NULL);
    t = with_field(t2, "torch_dtype", NULL);
    m = from_text(t, NULL);
    assert_false(m->spec.tie);
    assert_int_equal(m->spec.dtype, REFIT_DTYPE_BF16);
    refit_model_destroy(m);
    /* "dtype" (newer transformers) instead of torch_dtype. */
    free(t2);
    t2 = t;
    t = with_field(t2, "dtype", "\"float32\"");
    m = from_text(t, NULL);
    assert_int_equal(m->spec.dtype, REFIT_DTYPE_F32);
    assert_true(refit_model_total_bytes(m) == 8030261248ULL * 4);
    refit_model_destroy(m);
    free(t);
    free(t2);
    t = with_field(QWEN3_8B, "torch_dtype", "\"float16\"");
    m = from_text(t, NULL);
    refit_tensor_info_t ti;
    REFIT_ASSERT_OK(refit_model_tensor(m, 0, &ti));
    assert_int_equal(ti.dtype, REFIT_DTYPE_F16);
    refit_model_destroy(m);
    free(t);
    /* mistral is read as a dense llama-style model, without qk norms. */
    t = with_field(LLAMA3_8B, "model_type", "\"mistral\"");
    m = from_text(t, NULL);
    REFIT_ASSERT_OK(refit_model_builtin("llama3-8b", &ref));
    assert_same_tensors(m, ref);
    refit_model_destroy(m);
    refit_model_destroy(ref);
    free(t);
    /* qwen3 has q_norm/k_norm; the same numbers as llama do not. */
    t = with_field(QWEN3_8B, "model_type", "\"llama\"");
    m = from_text(t, NULL);
    assert_false(m->spec.qk_norm);
    assert_int_equal(refit_model_find_tensor(m, "model.layers.0.self_attn.q_norm.weight"), -1);
    refit_model_destroy(m);
    free(t);
    /* An unknown model_type with the DeepSeek-V3 class, as some fine-tunes
     * have: read through architectures. */
    t = with_field(KIMI_K2, "model_type", "\"kimi_k2_custom\"");
    m = from_text(t, NULL);
    REFIT_ASSERT_OK(refit_model_builtin("kimi-k2", &ref));
    assert_same_tensors(m, ref);
    refit_model_destroy(m);
    refit_model_destroy(ref);
    free(t);
    /* No topk_method: no router bias (DeepSeek-V2 style routing). */
    t = with_field(DEEPSEEK_V3, "topk_method", "\"greedy\"");
    m = from_text(t, NULL);
    assert_false(m->spec.router_bias);
    assert_int_equal(refit_model_find_tensor(m, "model.layers.3.mlp.gate.e_score_correction_bias"), -1);
    refit_model_destroy(m);
    free(t);
    /* num_nextn_predict_layers: the MTP layer model.layers.61 (MoE, with eh_proj
     * [H, 2H]); 0 or absent: none. */
    m = from_text(DEEPSEEK_V3, NULL);
    assert_int_equal(m->spec.mtp_layers, 1);
    int64_t eh = refit_model_find_tensor(m, "model.layers.61.eh_proj.weight");
    assert_true(eh > 0);
    assert_int_equal(m->tensors.data[eh].shape[1], 2 * 7168);
    assert_true(refit_model_find_tensor(m, "model.layers.61.mlp.experts.255.down_proj.weight") > 0);
    assert_int_equal(refit_model_find_tensor(m, "model.layers.62.enorm.weight"), -1);
    refit_model_destroy(m);
    t = with_field(DEEPSEEK_V3, "num_nextn_predict_layers", "0");
    m = from_text(t, NULL);
    assert_int_equal(refit_model_find_tensor(m, "model.layers.61.eh_proj.weight"), -1);
    assert_true(refit_model_total_bytes(m) == 1342052868096ULL); /* the 671 B of the main model */
    refit_model_destroy(m);
    free(t);
    /* No shared experts; first_k_dense_replace 0 (every layer MoE). */
    t2 = with_field(DEEPSEEK_V3, "n_shared_experts", "null");
    t = with_field(t2, "first_k_dense_replace", "0");
    m = from_text(t, NULL);
    assert_int_equal(m->spec.shared_experts, 0);
    assert_int_equal(m->spec.first_dense, 0);
    assert_int_equal(refit_model_find_tensor(m, "model.layers.0.mlp.gate_proj.weight"), -1);
    assert_int_equal(refit_model_find_tensor(m, "model.layers.0.mlp.shared_experts.up_proj.weight"), -1);
    assert_true(refit_model_find_tensor(m, "model.layers.0.mlp.experts.255.up_proj.weight") > 0);
    refit_model_destroy(m);
    free(t);
    free(t2);
    /* Qwen3-MoE without the optional fields. */
    t2 = with_field(QWEN3_30B_A3B, "mlp_only_layers", NULL);
    t = with_field(t2, "decoder_sparse_step", NULL);
    free(t2);
    t2 = with_field(t, "intermediate_size", NULL);
    m = from_text(t2, NULL);
    REFIT_ASSERT_OK(refit_model_builtin("qwen3-30b-a3b", &ref));
    assert_int_equal(m->spec.intermediate, 0);
    assert_same_tensors(m, ref);
    refit_model_destroy(m);
    refit_model_destroy(ref);
    free(t);
    free(t2);
}

/* Numbers near 2^32 are refused by the limits, naming the field, before any
 * product of them is formed (the builder's 64-bit overflow checks stay as a
 * second line). */
static void test_huge_numbers(void **state)
{
    (void)state;
    refit_model_t *m = (refit_model_t *)&m;
    char *t = with_field(DEEPSEEK_V3, "qk_nope_head_dim", "4294967295");
    REFIT_ASSERT_ERR(refit_model_from_config_text(t, strlen(t), NULL, &m), REFIT_ERR_INVALID_ARG,
                     "qk_nope_head_dim 4294967295 is above refit's limit of 4096");
    free(t);
    char *t2 = with_field(LLAMA3_8B, "hidden_size", "4294967264");
    t = with_field(t2, "vocab_size", "4294967295");
    REFIT_ASSERT_ERR(refit_model_from_config_text(t, strlen(t), NULL, &m), REFIT_ERR_INVALID_ARG,
                     "hidden_size 4294967264 is above refit's limit of 65536");
    assert_ptr_equal(m, (refit_model_t *)&m);
    free(t);
    free(t2);
}

static void test_names(void **state)
{
    (void)state;
    refit_model_t *m;
    /* _name_or_path wins when usable. */
    char *t = with_field(QWEN3_8B, "_name_or_path", "\"Qwen/Qwen3-8B\"");
    const char *file = write_config("some-dir", "config.json", t);
    REFIT_ASSERT_OK(refit_model_from_config(file, &m));
    assert_string_equal(refit_model_name(m), "Qwen/Qwen3-8B");
    refit_model_destroy(m);
    free(t);
    /* Too long (a training job's path): the directory's name. */
    t = with_field(QWEN3_8B, "_name_or_path",
                   "\"/mnt/checkpoints/experiments/2025-01-01/qwen3-8b-sft-run-42/global_step_1000/actor\"");
    file = write_config("some-dir", "config.json", t);
    REFIT_ASSERT_OK(refit_model_from_config(file, &m));
    assert_string_equal(refit_model_name(m), "some-dir");
    refit_model_destroy(m);
    free(t);
    /* Empty, not a string, or holding control characters: likewise. */
    static const char *const unusable[] = {"\"\"", "42", "null", "\"a\\nb\"", "\"a\\u0000b\""};
    for (size_t i = 0; i < sizeof(unusable) / sizeof(unusable[0]); i++) {
        t = with_field(QWEN3_8B, "_name_or_path", unusable[i]);
        m = from_text(t, "hint");
        assert_string_equal(refit_model_name(m), "hint");
        refit_model_destroy(m);
        free(t);
    }
    /* A directory name longer than a name: cut at 63 bytes, between characters. */
    char longdir[128];
    memset(longdir, 'd', 62);
    strcpy(longdir + 62, "\xC3\xA9tail"); /* 'é' straddles byte 63 */
    file = write_config(longdir, "config.json", QWEN3_8B);
    REFIT_ASSERT_OK(refit_model_from_config(file, &m));
    assert_int_equal(strlen(refit_model_name(m)), 62);
    assert_memory_equal(refit_model_name(m), longdir, 62);
    refit_model_destroy(m);
    m = from_text(QWEN3_8B, "\x01weird\x7fname");
    assert_string_equal(refit_model_name(m), "_weird_name");
    refit_model_destroy(m);
    /* A relative path still names its directory. */
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof(cwd)));
    assert_int_equal(chdir(make_dir("some-dir")), 0);
    REFIT_ASSERT_OK(refit_model_from_config("config.json", &m));
    assert_string_equal(refit_model_name(m), "some-dir");
    refit_model_destroy(m);
    REFIT_ASSERT_OK(refit_model_from_config(".", &m));
    assert_string_equal(refit_model_name(m), "some-dir");
    refit_model_destroy(m);
    assert_int_equal(chdir(cwd), 0);
}

static void test_open(void **state)
{
    (void)state;
    refit_model_t *m, *ref;
    write_config("Meta-Llama-3-8B", "config.json", LLAMA3_8B);
    REFIT_ASSERT_OK(refit_model_open(make_dir("Meta-Llama-3-8B"), &m));
    REFIT_ASSERT_OK(refit_model_builtin("llama3-8b", &ref));
    assert_same_tensors(m, ref);
    assert_string_equal(refit_model_name(m), "Meta-Llama-3-8B");
    refit_model_destroy(m);
    refit_model_destroy(ref);
    const char *file = write_config("Meta-Llama-3-8B", "other.json", LLAMA3_8B);
    REFIT_ASSERT_OK(refit_model_open(file, &m));
    refit_model_destroy(m);
    m = (refit_model_t *)&m;
    REFIT_ASSERT_ERR(refit_model_open("no-such-model", &m), REFIT_ERR_NOT_FOUND,
                     "'no-such-model' is neither a built-in model nor a readable file");
    REFIT_ASSERT_ERR(refit_model_open("no-such-model", &m), REFIT_ERR_NOT_FOUND, "qwen3-30b-a3b");
    REFIT_ASSERT_ERR(refit_model_open("/nonexistent/config.json", &m), REFIT_ERR_NOT_FOUND, "tiny-dense");
    /* A directory without a config.json is a path, but not a model. */
    REFIT_ASSERT_ERR(refit_model_open(make_dir("empty"), &m), REFIT_ERR_IO, "config.json");
    assert_ptr_equal(m, (refit_model_t *)&m);
    REFIT_ASSERT_ERR(refit_model_open(NULL, &m), REFIT_ERR_INVALID_ARG, NULL);
}

typedef struct {
    const char *base;
    const char *key;
    const char *value;         /* NULL: field removed */
    const char *key2, *value2; /* a second change, if key2 */
    refit_status_t want;
    const char *needle;
} bad_t;

static void test_errors(void **state)
{
    (void)state;
    static const bad_t cases[] = {
        /* missing numbers */
        {QWEN3_30B_A3B, "hidden_size", NULL, NULL, NULL, REFIT_ERR_INVALID_ARG, "missing field \"hidden_size\""},
        {QWEN3_30B_A3B, "num_hidden_layers", "null", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "missing field \"num_hidden_layers\" (null)"},
        {QWEN3_30B_A3B, "num_experts", NULL, NULL, NULL, REFIT_ERR_INVALID_ARG, "missing field \"num_experts\""},
        {QWEN3_30B_A3B, "moe_intermediate_size", NULL, NULL, NULL, REFIT_ERR_INVALID_ARG, "\"moe_intermediate_size\""},
        {LLAMA3_8B, "intermediate_size", NULL, NULL, NULL, REFIT_ERR_INVALID_ARG,
         "missing field \"intermediate_size\""},
        {LLAMA3_8B, "vocab_size", NULL, NULL, NULL, REFIT_ERR_INVALID_ARG, "missing field \"vocab_size\""},
        {DEEPSEEK_V3, "kv_lora_rank", NULL, NULL, NULL, REFIT_ERR_INVALID_ARG, "missing field \"kv_lora_rank\""},
        {DEEPSEEK_V3, "q_lora_rank", NULL, NULL, NULL, REFIT_ERR_INVALID_ARG, "missing field \"q_lora_rank\""},
        {DEEPSEEK_V3, "first_k_dense_replace", NULL, NULL, NULL, REFIT_ERR_INVALID_ARG, "\"first_k_dense_replace\""},
        {DEEPSEEK_V3, "n_routed_experts", NULL, NULL, NULL, REFIT_ERR_INVALID_ARG, "\"n_routed_experts\""},
        /* numbers that are not positive 32-bit integers */
        {QWEN3_30B_A3B, "hidden_size", "-2048", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "\"hidden_size\" must be a positive integer below 2^32, not -2048"},
        {QWEN3_30B_A3B, "hidden_size", "0", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "\"hidden_size\" must be a positive integer"},
        {QWEN3_30B_A3B, "hidden_size", "2048.5", NULL, NULL, REFIT_ERR_INVALID_ARG, "not 2048.5"},
        {QWEN3_30B_A3B, "hidden_size", "2048.0", NULL, NULL, REFIT_ERR_INVALID_ARG, "\"hidden_size\""},
        {QWEN3_30B_A3B, "hidden_size", "2.048e3", NULL, NULL, REFIT_ERR_INVALID_ARG, "\"hidden_size\""},
        {QWEN3_30B_A3B, "num_experts", "4294967296", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "\"num_experts\" must be a positive integer below 2^32, not 4294967296"},
        {QWEN3_30B_A3B, "num_experts", "99999999999999999999999", NULL, NULL, REFIT_ERR_INVALID_ARG, "\"num_experts\""},
        {QWEN3_30B_A3B, "num_experts", "1e30", NULL, NULL, REFIT_ERR_INVALID_ARG, "\"num_experts\""},
        {QWEN3_30B_A3B, "vocab_size", "\"151936\"", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "\"vocab_size\" must be a positive integer below 2^32, not a string"},
        {QWEN3_30B_A3B, "vocab_size", "[151936]", NULL, NULL, REFIT_ERR_INVALID_ARG, "not an array"},
        {QWEN3_30B_A3B, "num_key_value_heads", "0", NULL, NULL, REFIT_ERR_INVALID_ARG, "\"num_key_value_heads\""},
        {QWEN3_30B_A3B, "head_dim", "-1", NULL, NULL, REFIT_ERR_INVALID_ARG, "\"head_dim\""},
        {DEEPSEEK_V3, "first_k_dense_replace", "-1", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "\"first_k_dense_replace\" must be a non-negative integer"},
        {DEEPSEEK_V3, "v_head_dim", "true", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "\"v_head_dim\" must be a positive integer below 2^32, not a boolean"},
        {QWEN3_30B_A3B, "tie_word_embeddings", "0", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "\"tie_word_embeddings\" must be true or false, not 0"},
        {QWEN3_30B_A3B, "torch_dtype", "16", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "\"torch_dtype\" must be a string, not 16"},
        {QWEN3_30B_A3B, "mlp_only_layers", "{}", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "\"mlp_only_layers\" must be an array, not an object"},
        /* numbers that do not add up (checked on the spec) */
        {LLAMA3_8B, "num_key_value_heads", "5", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "not a multiple of num_key_value_heads 5"},
        {LLAMA3_8B, "num_attention_heads", "30", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "hidden_size 4096 is not a multiple of num_attention_heads 30"},
        {DEEPSEEK_V3, "first_k_dense_replace", "62", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "first_k_dense_replace 62 exceeds 61 layers"},
        /* what the tensor table cannot describe */
        {QWEN3_30B_A3B, "mlp_only_layers", "[0, 47]", NULL, NULL, REFIT_ERR_UNSUPPORTED,
         "\"mlp_only_layers\" lists 2 layers"},
        {QWEN3_30B_A3B, "decoder_sparse_step", "2", NULL, NULL, REFIT_ERR_UNSUPPORTED, "\"decoder_sparse_step\": 2"},
        {DEEPSEEK_V3, "q_lora_rank", "null", NULL, NULL, REFIT_ERR_UNSUPPORTED, "\"q_lora_rank\": null"},
        {DEEPSEEK_V3, "q_lora_rank", "0", NULL, NULL, REFIT_ERR_UNSUPPORTED, "\"q_lora_rank\": 0"},
        {DEEPSEEK_V3, "moe_layer_freq", "2", NULL, NULL, REFIT_ERR_UNSUPPORTED, "\"moe_layer_freq\": 2"},
        {LLAMA3_8B, "attention_bias", "true", NULL, NULL, REFIT_ERR_UNSUPPORTED, "\"attention_bias\""},
        {LLAMA3_8B, "mlp_bias", "true", NULL, NULL, REFIT_ERR_UNSUPPORTED, "\"mlp_bias\""},
        {LLAMA3_8B, "torch_dtype", "\"float8_e4m3fn\"", NULL, NULL, REFIT_ERR_UNSUPPORTED,
         "torch_dtype \"float8_e4m3fn\" is not supported"},
        {LLAMA3_8B, "model_type", "\"mixtral\"", "architectures", "[\"MixtralForCausalLM\"]", REFIT_ERR_UNSUPPORTED,
         "model_type \"mixtral\" is not supported (supported: qwen3, qwen3_moe, llama, mistral, deepseek_v3, kimi_k2)"},
        {QWEN3_8B, "model_type", "\"qwen2\"", "architectures", "[\"Qwen2ForCausalLM\"]", REFIT_ERR_UNSUPPORTED,
         "\"qwen2\""},
        {QWEN3_8B, "model_type", "\"qwen3\\nx\"", "architectures", "null", REFIT_ERR_UNSUPPORTED, "\"qwen3?x\""},
        {QWEN3_8B, "model_type", "3", NULL, NULL, REFIT_ERR_INVALID_ARG, "\"model_type\" must be a string"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *t = with_field(cases[i].base, cases[i].key, cases[i].value);
        if (cases[i].key2) {
            char *t2 = with_field(t, cases[i].key2, cases[i].value2);
            free(t);
            t = t2;
        }
        const char *file = write_config("errors", "config.json", t);
        refit_model_t *m = (refit_model_t *)&m;
        refit_status_t st = refit_model_from_config(file, &m);
        if (st != cases[i].want || !strstr(refit_last_error(), cases[i].needle))
            fail_msg("case %zu (%s = %s): %s \"%s\", want %s \"%s\"", i, cases[i].key,
                     cases[i].value ? cases[i].value : "(removed)", refit_status_name(st), refit_last_error(),
                     refit_status_name(cases[i].want), cases[i].needle);
        /* The detail starts with the file. */
        assert_int_equal(strncmp(refit_last_error(), file, strlen(file)), 0);
        assert_ptr_equal(m, (refit_model_t *)&m);
        free(t);
    }
    refit_model_t *m = NULL;
    /* Neither model_type nor a known architecture. */
    char *t2 = with_field(QWEN3_8B, "model_type", NULL);
    char *t = with_field(t2, "architectures", "[\"Qwen2ForCausalLM\"]");
    REFIT_ASSERT_ERR(refit_model_from_config_text(t, strlen(t), NULL, &m), REFIT_ERR_INVALID_ARG,
                     "missing field \"model_type\"");
    free(t);
    /* ...but a known architecture alone is enough. */
    t = with_field(t2, "architectures", "[\"Qwen3ForCausalLM\"]");
    REFIT_ASSERT_OK(refit_model_from_config_text(t, strlen(t), NULL, &m));
    assert_true(m->spec.qk_norm);
    refit_model_destroy(m);
    m = NULL;
    free(t);
    free(t2);
    /* Not an object. */
    REFIT_ASSERT_ERR(refit_model_from_config_text("[1, 2]", 6, NULL, &m), REFIT_ERR_INVALID_ARG,
                     "holds an object, not an array");
    REFIT_ASSERT_ERR(refit_model_from_config_text("null", 4, NULL, &m), REFIT_ERR_INVALID_ARG, "not a null");
    /* Malformed JSON: the file, line and column. */
    const char *file = write_config("errors", "config.json",
                                    "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 4096,,\n}\n");
    REFIT_ASSERT_ERR(refit_model_from_config(file, &m), REFIT_ERR_PARSE, "line 3 column 23: unexpected ','");
    assert_int_equal(strncmp(refit_last_error(), file, strlen(file)), 0);
    t = with_field(LLAMA3_8B, "hidden_size", "04096");
    REFIT_ASSERT_ERR(refit_model_from_config_text(t, strlen(t), NULL, &m), REFIT_ERR_PARSE, "leading zero");
    free(t);
    file = write_config("errors", "config.json", "");
    REFIT_ASSERT_ERR(refit_model_from_config(file, &m), REFIT_ERR_PARSE, "line 1 column 1: unexpected end of input");
    /* Missing and unreadable files. */
    char missing[512];
    snprintf(missing, sizeof(missing), "%s/nowhere/config.json", g_tmp);
    REFIT_ASSERT_ERR(refit_model_from_config(missing, &m), REFIT_ERR_IO, missing);
    REFIT_ASSERT_ERR(refit_model_from_config(missing, &m), REFIT_ERR_IO, "No such file or directory");
    const char *empty = make_dir("empty");
    REFIT_ASSERT_ERR(refit_model_from_config(empty, &m), REFIT_ERR_IO, "empty/config.json: No such file or directory");
    /* A directory named config.json inside the directory. */
    make_dir("nested");
    make_dir("nested/config.json");
    REFIT_ASSERT_ERR(refit_model_from_config(make_dir("nested"), &m), REFIT_ERR_IO,
                     "nested/config.json is a directory, not a regular file");
    if (geteuid() != 0) { /* root reads anything */
        file = write_config("errors", "config.json", LLAMA3_8B);
        assert_int_equal(chmod(file, 0), 0);
        REFIT_ASSERT_ERR(refit_model_from_config(file, &m), REFIT_ERR_IO, "Permission denied");
        assert_int_equal(chmod(file, 0600), 0);
    }
    REFIT_ASSERT_ERR(refit_model_from_config(NULL, &m), REFIT_ERR_INVALID_ARG, NULL);
    REFIT_ASSERT_ERR(refit_model_from_config(file, NULL), REFIT_ERR_INVALID_ARG, NULL);
    REFIT_ASSERT_ERR(refit_model_from_config("", &m), REFIT_ERR_IO, NULL);
    REFIT_ASSERT_ERR(refit_model_from_config_text(LLAMA3_8B, strlen(LLAMA3_8B), NULL, NULL), REFIT_ERR_INVALID_ARG,
                     NULL);
    assert_null(m);
}

/* meta-llama/Llama-3.1-405B (the largest dense model; rope_scaling trimmed) */
static const char LLAMA31_405B[] = "{\n"
                                   "  \"architectures\": [\"LlamaForCausalLM\"],\n"
                                   "  \"hidden_size\": 16384,\n"
                                   "  \"intermediate_size\": 53248,\n"
                                   "  \"model_type\": \"llama\",\n"
                                   "  \"num_attention_heads\": 128,\n"
                                   "  \"num_hidden_layers\": 126,\n"
                                   "  \"num_key_value_heads\": 8,\n"
                                   "  \"rope_scaling\": null,\n"
                                   "  \"tie_word_embeddings\": false,\n"
                                   "  \"torch_dtype\": \"bfloat16\",\n"
                                   "  \"vocab_size\": 128256\n"
                                   "}\n";

/* Numbers that parse but describe no real model are refused before the
 * tensor table is allocated (docs/security.md: num_hidden_layers=1e8 allocated 15 GB),
 * naming the field, its value and the limit; the largest real models load. */
static void test_limits(void **state)
{
    (void)state;
    static const bad_t over[] = {
        {QWEN3_30B_A3B, "num_hidden_layers", "100000000", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "num_hidden_layers 100000000 is above refit's limit of 1024"},
        {QWEN3_30B_A3B, "num_hidden_layers", "1025", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "num_hidden_layers 1025 is above refit's limit of 1024"},
        {QWEN3_8B, "hidden_size", "65537", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "hidden_size 65537 is above refit's limit of 65536"},
        {QWEN3_8B, "num_attention_heads", "4097", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "num_attention_heads 4097 is above refit's limit of 4096"},
        {QWEN3_8B, "num_key_value_heads", "8192", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "num_key_value_heads 8192 is above refit's limit of 4096"},
        {QWEN3_8B, "head_dim", "4097", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "head_dim 4097 is above refit's limit of 4096"},
        {QWEN3_8B, "intermediate_size", "262145", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "intermediate_size 262145 is above refit's limit of 262144"},
        {QWEN3_8B, "vocab_size", "4194305", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "vocab_size 4194305 is above refit's limit of 4194304"},
        {QWEN3_30B_A3B, "num_experts", "4097", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "num_experts 4097 is above refit's limit of 4096"},
        {QWEN3_30B_A3B, "moe_intermediate_size", "262145", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "moe_intermediate_size 262145 is above refit's limit of 262144"},
        {DEEPSEEK_V3, "n_routed_experts", "100000", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "n_routed_experts 100000 is above refit's limit of 4096"},
        {DEEPSEEK_V3, "n_shared_experts", "65", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "n_shared_experts 65 is above refit's limit of 64"},
        {DEEPSEEK_V3, "q_lora_rank", "65537", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "q_lora_rank 65537 is above refit's limit of 65536"},
        {DEEPSEEK_V3, "kv_lora_rank", "65537", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "kv_lora_rank 65537 is above refit's limit of 65536"},
        {DEEPSEEK_V3, "qk_rope_head_dim", "4097", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "qk_rope_head_dim 4097 is above refit's limit of 4096"},
        {DEEPSEEK_V3, "v_head_dim", "4097", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "v_head_dim 4097 is above refit's limit of 4096"},
        {DEEPSEEK_V3, "num_nextn_predict_layers", "17", NULL, NULL, REFIT_ERR_INVALID_ARG,
         "num_nextn_predict_layers 17 is above refit's limit of 16"},
        /* each number within its limit, their products not: the tensor count, the bytes */
        {QWEN3_30B_A3B, "num_hidden_layers", "1024", "num_experts", "4096", REFIT_ERR_INVALID_ARG,
         "12592131 tensors (num_hidden_layers 1024, 4096 experts) are above refit's limit of 1048576"},
        {LLAMA3_8B, "num_hidden_layers", "1024", "intermediate_size", "262144", REFIT_ERR_INVALID_ARG, NULL},
    };
    for (size_t i = 0; i < sizeof(over) / sizeof(over[0]); i++) {
        char *t = with_field(over[i].base, over[i].key, over[i].value);
        if (over[i].key2) {
            char *t2 = with_field(t, over[i].key2, over[i].value2);
            free(t);
            t = t2;
        }
        if (!over[i].needle) { /* the bytes case also needs a wide hidden size */
            char *t2 = with_field(t, "hidden_size", "65536");
            free(t);
            t = t2;
        }
        const char *needle = over[i].needle ? over[i].needle
                                            : "bytes of weights are above refit's limit of 70368744177664";
        const char *file = write_config("limits", "config.json", t);
        refit_model_t *m = (refit_model_t *)&m;
        refit_status_t st = refit_model_from_config(file, &m);
        if (st != over[i].want || !strstr(refit_last_error(), needle))
            fail_msg("case %zu (%s = %s): %s \"%s\", want %s \"%s\"", i, over[i].key, over[i].value,
                     refit_status_name(st), refit_last_error(), refit_status_name(over[i].want), needle);
        assert_int_equal(strncmp(refit_last_error(), file, strlen(file)), 0);
        assert_ptr_equal(m, (refit_model_t *)&m);
        free(t);
    }
    /* A spec built in code meets the same limits. */
    refit_model_spec_t spec = refit_builtin_specs()[0];
    spec.layers = UINT32_MAX;
    refit_model_t *m = (refit_model_t *)&m;
    REFIT_ASSERT_ERR(refit_model_from_spec(&spec, &m), REFIT_ERR_INVALID_ARG,
                     "num_hidden_layers 4294967295 is above refit's limit of 1024");
    assert_ptr_equal(m, (refit_model_t *)&m);
    /* The largest real models load: every built-in (Kimi-K2 and DeepSeek-V3
     * among them), Llama-3.1-405B, and numbers at their limits. */
    for (const refit_model_spec_t *s = refit_builtin_specs(); s->name[0]; s++) {
        REFIT_ASSERT_OK(refit_model_from_spec(s, &m));
        refit_model_destroy(m);
    }
    m = from_text(LLAMA31_405B, NULL);
    assert_int_equal(refit_model_num_tensors(m), 3 + 126 * 9);
    assert_true(refit_model_total_bytes(m) > UINT64_C(810000000000)); /* 405.9e9 parameters in bf16 */
    refit_model_destroy(m);
    char *t2 = with_field(QWEN3_8B, "vocab_size", "4194304");
    char *t = with_field(t2, "num_hidden_layers", "1024");
    m = from_text(t, NULL);
    assert_int_equal(refit_model_num_tensors(m), 3 + 1024 * 11);
    refit_model_destroy(m);
    free(t);
    free(t2);
}

/* A FIFO, a device or a socket where config.json should be is refused without
 * reading it: opening a FIFO for reading blocked forever (docs/security.md), a device
 * could be read without end.  The alarm turns a hang into a failure. */
static void test_not_regular(void **state)
{
    (void)state;
    alarm(30);
    refit_model_t *m = (refit_model_t *)&m;
    const char *dir = make_dir("fifo");
    char *p = malloc(strlen(dir) + 16);
    assert_non_null(p);
    sprintf(p, "%s/config.json", dir);
    assert_int_equal(mkfifo(p, 0600), 0);
    remember(p);
    REFIT_ASSERT_ERR(refit_model_from_config(dir, &m), REFIT_ERR_IO, "config.json is a FIFO, not a regular file");
    REFIT_ASSERT_ERR(refit_model_from_config(p, &m), REFIT_ERR_IO, "is a FIFO, not a regular file");
    REFIT_ASSERT_ERR(refit_model_open(dir, &m), REFIT_ERR_IO, "is a FIFO, not a regular file");
    dir = make_dir("chardev");
    p = malloc(strlen(dir) + 16);
    assert_non_null(p);
    sprintf(p, "%s/config.json", dir);
    assert_int_equal(symlink("/dev/null", p), 0);
    remember(p);
    REFIT_ASSERT_ERR(refit_model_open(dir, &m), REFIT_ERR_IO, "is a character device, not a regular file");
    dir = make_dir("socket");
    p = malloc(strlen(dir) + 16);
    assert_non_null(p);
    sprintf(p, "%s/config.json", dir);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    assert_true(strlen(p) < sizeof(sa.sun_path));
    strcpy(sa.sun_path, p);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    remember(p);
    REFIT_ASSERT_ERR(refit_model_open(dir, &m), REFIT_ERR_IO, "is a socket, not a regular file");
    close(fd);
    assert_ptr_equal(m, (refit_model_t *)&m);
    alarm(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_30b_a3b),
        cmocka_unit_test(test_deepseek_v3),
        cmocka_unit_test(test_kimi_k2),
        cmocka_unit_test(test_llama3_8b),
        cmocka_unit_test(test_qwen3_8b),
        cmocka_unit_test(test_builtin_totals),
        cmocka_unit_test(test_builtin_names),
        cmocka_unit_test(test_find_tensor),
        cmocka_unit_test(test_defaults_and_options),
        cmocka_unit_test(test_huge_numbers),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_open),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_not_regular),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
