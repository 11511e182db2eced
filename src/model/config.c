/* Models from Hugging Face config.json files, and refit_model_open.
 *
 * The reader maps a config's model_type (or, failing that, its architectures
 * entry) to one of the spec families and reads the numbers that family needs.
 * It refuses, naming the field, what the canonical tensor table cannot
 * describe (dense layers among Qwen3-MoE layers, attention biases, MLA without
 * query compression, ...) rather than build a model with the wrong tensors.
 * Fields it does not need are ignored; so is quantization_config, as the
 * built-in models describe unquantized weights. */
#include "model/config.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/file.h"
#include "util/json.h"

typedef struct {
    const char *model_type;
    const char *architecture; /* the transformers class that loads it */
    refit_arch_t arch;
    bool qk_norm;
} family_t;

static const family_t g_families[] = {
    {"qwen3", "Qwen3ForCausalLM", REFIT_ARCH_DENSE, true},
    {"qwen3_moe", "Qwen3MoeForCausalLM", REFIT_ARCH_MOE, true},
    {"llama", "LlamaForCausalLM", REFIT_ARCH_DENSE, false},
    {"mistral", "MistralForCausalLM", REFIT_ARCH_DENSE, false},
    {"deepseek_v3", "DeepseekV3ForCausalLM", REFIT_ARCH_MLA, false},
    {"kimi_k2", "DeepseekV3ForCausalLM", REFIT_ARCH_MLA, false},
};

#define SUPPORTED_TYPES "qwen3, qwen3_moe, llama, mistral, deepseek_v3, kimi_k2"

/* A config string shown in a message: at most 48 bytes, control characters
 * replaced, so that a hostile value cannot garble the detail. */
static const char *shown(const char *s, size_t len, char buf[64])
{
    size_t n = 0;
    for (size_t i = 0; i < len && n < 48; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[n++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    if (n < len) memcpy(buf + n, "...", 3), n += 3;
    buf[n] = '\0';
    return buf;
}

static bool absent(const refit_json_t *v) { return !v || refit_json_type(v) == REFIT_JSON_NULL; }

/* What a config value is, for "must be ..., not <what>" messages. */
static const char *describe(const refit_json_t *v, char buf[64])
{
    int64_t i;
    double d;
    if (refit_json_int(v, &i)) snprintf(buf, 64, "%" PRId64, i);
    else if (refit_json_double(v, &d)) {
        snprintf(buf, 60, "%.17g", d);
        if (!strpbrk(buf, ".e")) strcat(buf, ".0"); /* 2048.0 is not an integer: do not show "2048" */
    } else
        snprintf(buf, 64, "a%s %s",
                 refit_json_type(v) == REFIT_JSON_ARRAY || refit_json_type(v) == REFIT_JSON_OBJECT ? "n" : "",
                 refit_json_type_name(refit_json_type(v)));
    return buf;
}

/* A count field: an integer in [min, UINT32_MAX] (min is 0 or 1).  Absent or
 * null: dflt if not required. */
static refit_status_t get_u32(const refit_json_t *cfg, const char *key, bool required, uint32_t min, uint32_t dflt,
                              uint32_t *out)
{
    const refit_json_t *v = refit_json_get(cfg, key);
    if (absent(v)) {
        if (required) return refit_error(REFIT_ERR_INVALID_ARG, "missing field \"%s\"%s", key, v ? " (null)" : "");
        *out = dflt;
        return REFIT_OK;
    }
    int64_t i;
    if (!refit_json_int(v, &i) || i < (int64_t)min || i > (int64_t)UINT32_MAX) {
        char buf[64];
        return refit_error(REFIT_ERR_INVALID_ARG, "field \"%s\" must be a %s integer below 2^32, not %s", key,
                           min ? "positive" : "non-negative", describe(v, buf));
    }
    *out = (uint32_t)i;
    return REFIT_OK;
}

static refit_status_t get_bool(const refit_json_t *cfg, const char *key, bool dflt, bool *out)
{
    const refit_json_t *v = refit_json_get(cfg, key);
    if (absent(v)) {
        *out = dflt;
        return REFIT_OK;
    }
    if (!refit_json_bool(v, out)) {
        char buf[64];
        return refit_error(REFIT_ERR_INVALID_ARG, "field \"%s\" must be true or false, not %s", key, describe(v, buf));
    }
    return REFIT_OK;
}

/* An optional string field: *out NULL when absent or null. */
static refit_status_t get_string(const refit_json_t *cfg, const char *key, const char **out, size_t *len)
{
    const refit_json_t *v = refit_json_get(cfg, key);
    *out = NULL;
    *len = 0;
    if (absent(v)) return REFIT_OK;
    if (!(*out = refit_json_string(v, len))) {
        char buf[64];
        return refit_error(REFIT_ERR_INVALID_ARG, "field \"%s\" must be a string, not %s", key, describe(v, buf));
    }
    return REFIT_OK;
}

static bool str_is(const char *s, size_t len, const char *want)
{
    return s && len == strlen(want) && memcmp(s, want, len) == 0;
}

static refit_status_t pick_family(const refit_json_t *cfg, const family_t **out)
{
    refit_status_t st;
    const char *type;
    size_t type_len;
    if ((st = get_string(cfg, "model_type", &type, &type_len))) return st;
    for (size_t f = 0; f < REFIT_ARRAY_LEN(g_families); f++)
        if (str_is(type, type_len, g_families[f].model_type)) {
            *out = &g_families[f];
            return REFIT_OK;
        }
    /* Fallback: a model_type we do not know (fine-tunes may rename it) whose
     * checkpoint loads with a class we do. */
    const refit_json_t *archs = refit_json_get(cfg, "architectures");
    for (size_t a = 0; a < refit_json_len(archs); a++) {
        size_t len;
        const char *name = refit_json_string(refit_json_at(archs, a), &len);
        for (size_t f = 0; f < REFIT_ARRAY_LEN(g_families); f++)
            if (str_is(name, len, g_families[f].architecture)) {
                refit_log(REFIT_LOG_INFO, "config.json: reading model_type %s as %s (architectures lists %s)",
                          type ? "unknown" : "absent", g_families[f].model_type, g_families[f].architecture);
                *out = &g_families[f];
                return REFIT_OK;
            }
    }
    if (!type)
        return refit_error(
            REFIT_ERR_INVALID_ARG,
            "missing field \"model_type\" (and no supported \"architectures\" entry); supported: " SUPPORTED_TYPES);
    char buf[64];
    return refit_error(REFIT_ERR_UNSUPPORTED, "model_type \"%s\" is not supported (supported: " SUPPORTED_TYPES ")",
                       shown(type, type_len, buf));
}

static refit_status_t get_dtype(const refit_json_t *cfg, refit_dtype_t *out)
{
    static const struct {
        const char *name;
        refit_dtype_t dtype;
    } names[] = {{"bfloat16", REFIT_DTYPE_BF16}, {"float16", REFIT_DTYPE_F16}, {"float32", REFIT_DTYPE_F32}};
    static const char *const keys[] = {"torch_dtype", "dtype"};
    refit_status_t st;
    for (size_t k = 0; k < REFIT_ARRAY_LEN(keys); k++) {
        const char *s;
        size_t len;
        if ((st = get_string(cfg, keys[k], &s, &len))) return st;
        if (!s) continue;
        for (size_t i = 0; i < REFIT_ARRAY_LEN(names); i++)
            if (str_is(s, len, names[i].name)) {
                *out = names[i].dtype;
                return REFIT_OK;
            }
        char buf[64];
        return refit_error(REFIT_ERR_UNSUPPORTED, "%s \"%s\" is not supported (bfloat16, float16 or float32)", keys[k],
                           shown(s, len, buf));
    }
    *out = REFIT_DTYPE_BF16;
    return REFIT_OK;
}

/* Fields that, when true, add tensors the canonical table does not have. */
static refit_status_t refuse_flags(const refit_json_t *cfg)
{
    static const char *const flags[] = {"attention_bias", "mlp_bias"};
    refit_status_t st;
    for (size_t i = 0; i < REFIT_ARRAY_LEN(flags); i++) {
        bool on;
        if ((st = get_bool(cfg, flags[i], false, &on))) return st;
        if (on) return refit_error(REFIT_ERR_UNSUPPORTED, "\"%s\": true (bias tensors) is not supported", flags[i]);
    }
    return REFIT_OK;
}

/* GQA attention (dense and Qwen3-MoE): kv heads and head_dim, with the
 * defaults transformers applies. */
static refit_status_t read_gqa(const refit_json_t *cfg, refit_model_spec_t *s)
{
    refit_status_t st;
    if ((st = get_u32(cfg, "num_key_value_heads", false, 1, s->heads, &s->kv_heads))) return st;
    const refit_json_t *hd = refit_json_get(cfg, "head_dim");
    if (!absent(hd)) return get_u32(cfg, "head_dim", true, 1, 0, &s->head_dim);
    if (s->hidden % s->heads)
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "no \"head_dim\", and hidden_size %u is not a multiple of num_attention_heads %u", s->hidden,
                           s->heads);
    s->head_dim = s->hidden / s->heads;
    return REFIT_OK;
}

static refit_status_t read_moe(const refit_json_t *cfg, refit_model_spec_t *s)
{
    refit_status_t st;
    uint32_t step;
    /* transformers 5 writes Qwen3-MoE's expert count as "num_local_experts". */
    const char *experts_key = absent(refit_json_get(cfg, "num_experts")) &&
                                      !absent(refit_json_get(cfg, "num_local_experts"))
                                  ? "num_local_experts"
                                  : "num_experts";
    if ((st = get_u32(cfg, experts_key, true, 1, 0, &s->experts)) ||
        (st = get_u32(cfg, "moe_intermediate_size", true, 1, 0, &s->moe_intermediate)) ||
        (st = get_u32(cfg, "intermediate_size", false, 1, 0, &s->intermediate)) ||
        (st = get_u32(cfg, "decoder_sparse_step", false, 1, 1, &step)))
        return st;
    if (step != 1)
        return refit_error(REFIT_ERR_UNSUPPORTED,
                           "\"decoder_sparse_step\": %u is not supported (only 1: every layer MoE)", step);
    const refit_json_t *only = refit_json_get(cfg, "mlp_only_layers");
    if (!absent(only) && refit_json_type(only) != REFIT_JSON_ARRAY) {
        char buf[64];
        return refit_error(REFIT_ERR_INVALID_ARG, "field \"mlp_only_layers\" must be an array, not %s",
                           describe(only, buf));
    }
    if (refit_json_len(only))
        return refit_error(REFIT_ERR_UNSUPPORTED,
                           "\"mlp_only_layers\" lists %zu layers; dense layers in a Qwen3-MoE model are not supported",
                           refit_json_len(only));
    return REFIT_OK;
}

static refit_status_t read_mla(const refit_json_t *cfg, refit_model_spec_t *s)
{
    refit_status_t st;
    const refit_json_t *q = refit_json_get(cfg, "q_lora_rank");
    int64_t qv;
    if (q && (refit_json_type(q) == REFIT_JSON_NULL || (refit_json_int(q, &qv) && qv == 0)))
        return refit_error(REFIT_ERR_UNSUPPORTED,
                           "\"q_lora_rank\": %s (MLA without query compression) is not supported",
                           refit_json_type(q) == REFIT_JSON_NULL ? "null" : "0");
    uint32_t freq;
    if ((st = get_u32(cfg, "q_lora_rank", true, 1, 0, &s->q_lora_rank)) ||
        (st = get_u32(cfg, "kv_lora_rank", true, 1, 0, &s->kv_lora_rank)) ||
        (st = get_u32(cfg, "qk_nope_head_dim", true, 1, 0, &s->qk_nope_dim)) ||
        (st = get_u32(cfg, "qk_rope_head_dim", true, 1, 0, &s->qk_rope_dim)) ||
        (st = get_u32(cfg, "v_head_dim", true, 1, 0, &s->v_head_dim)) ||
        (st = get_u32(cfg, "intermediate_size", true, 1, 0, &s->intermediate)) ||
        (st = get_u32(cfg, "moe_intermediate_size", true, 1, 0, &s->moe_intermediate)) ||
        (st = get_u32(cfg, "n_routed_experts", true, 1, 0, &s->experts)) ||
        (st = get_u32(cfg, "n_shared_experts", false, 0, 0, &s->shared_experts)) ||
        (st = get_u32(cfg, "first_k_dense_replace", true, 0, 0, &s->first_dense)) ||
        (st = get_u32(cfg, "moe_layer_freq", false, 1, 1, &freq)) ||
        (st = get_u32(cfg, "num_nextn_predict_layers", false, 0, 0, &s->mtp_layers)))
        return st;
    if (freq != 1)
        return refit_error(REFIT_ERR_UNSUPPORTED,
                           "\"moe_layer_freq\": %u is not supported (only 1: every layer after the dense ones MoE)",
                           freq);
    const char *topk;
    size_t topk_len;
    if ((st = get_string(cfg, "topk_method", &topk, &topk_len))) return st;
    s->router_bias = str_is(topk, topk_len, "noaux_tc");
    s->kv_heads = s->heads; /* MLA: every head has its own keys and values */
    return REFIT_OK;
}

/* Copies src into dst[cap] whole code points at most, control characters
 * replaced; "" if nothing fits. */
static void copy_name(char *dst, size_t cap, const char *src, size_t len)
{
    size_t n = REFIT_MIN(len, cap - 1);
    if (n < len)
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80) n--; /* do not split a UTF-8 sequence */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = c < 0x20 || c == 0x7f ? '_' : (char)c;
    }
    dst[n] = '\0';
}

static void set_name(const refit_json_t *cfg, const char *hint, refit_model_spec_t *s)
{
    size_t len;
    const char *n = refit_json_string(refit_json_get(cfg, "_name_or_path"), &len);
    bool usable = n && len > 0 && len < sizeof(s->name);
    for (size_t i = 0; usable && i < len; i++) usable = (unsigned char)n[i] >= 0x20 && n[i] != 0x7f;
    if (usable) {
        copy_name(s->name, sizeof(s->name), n, len);
        return;
    }
    if (hint) copy_name(s->name, sizeof(s->name), hint, strlen(hint));
    if (!s->name[0]) copy_name(s->name, sizeof(s->name), "custom", 6);
}

static refit_status_t read_spec(const refit_json_t *cfg, const char *name_hint, refit_model_spec_t *s)
{
    refit_status_t st;
    const family_t *fam = NULL;
    if (refit_json_type(cfg) != REFIT_JSON_OBJECT)
        return refit_error(REFIT_ERR_INVALID_ARG, "a config.json holds an object, not a%s %s",
                           refit_json_type(cfg) == REFIT_JSON_ARRAY ? "n" : "",
                           refit_json_type_name(refit_json_type(cfg)));
    if ((st = pick_family(cfg, &fam))) return st;
    s->arch = fam->arch;
    s->qk_norm = fam->qk_norm;
    if ((st = get_u32(cfg, "hidden_size", true, 1, 0, &s->hidden)) ||
        (st = get_u32(cfg, "num_hidden_layers", true, 1, 0, &s->layers)) ||
        (st = get_u32(cfg, "num_attention_heads", true, 1, 0, &s->heads)) ||
        (st = get_u32(cfg, "vocab_size", true, 1, 0, &s->vocab)) ||
        (st = get_bool(cfg, "tie_word_embeddings", false, &s->tie)) || (st = get_dtype(cfg, &s->dtype)) ||
        (st = refuse_flags(cfg)))
        return st;
    switch (fam->arch) {
    case REFIT_ARCH_DENSE:
        if ((st = read_gqa(cfg, s)) || (st = get_u32(cfg, "intermediate_size", true, 1, 0, &s->intermediate)))
            return st;
        break;
    case REFIT_ARCH_MOE:
        if ((st = read_gqa(cfg, s)) || (st = read_moe(cfg, s))) return st;
        break;
    case REFIT_ARCH_MLA:
        if ((st = read_mla(cfg, s))) return st;
        break;
    }
    set_name(cfg, name_hint, s);
    return REFIT_OK;
}

refit_status_t refit_config_to_spec(const char *text, size_t len, const char *name_hint, refit_model_spec_t *spec)
{
    refit_status_t st;
    refit_json_t *cfg;
    if (!spec) return refit_error(REFIT_ERR_INVALID_ARG, "refit_config_to_spec: NULL argument");
    if ((st = refit_json_parse(text, len, &cfg))) return st;
    refit_model_spec_t s = {0};
    st = read_spec(cfg, name_hint, &s);
    refit_json_free(cfg);
    if (st) return st;
    *spec = s;
    return REFIT_OK;
}

refit_status_t refit_model_from_config_text(const char *text, size_t len, const char *name_hint, refit_model_t **out)
{
    refit_status_t st;
    refit_model_spec_t spec;
    if (!out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_model_from_config_text: NULL argument");
    if ((st = refit_config_to_spec(text, len, name_hint, &spec))) return st;
    return refit_model_from_spec(&spec, out);
}

/* The name of the directory holding file (fresh string), NULL if there is
 * none to speak of (the root, or out of memory). */
static char *dir_name_of(const char *file)
{
    char *full = realpath(file, NULL);
    char *p = full ? full : refit_strdup(file);
    if (!p) return NULL;
    char *slash = strrchr(p, '/');
    char *name = NULL;
    if (slash) {
        *slash = '\0'; /* p is now the directory */
        char *base = strrchr(p, '/');
        base = base ? base + 1 : p;
        if (*base && strcmp(base, ".") != 0 && strcmp(base, "..") != 0) name = refit_strdup(base);
    }
    free(p);
    return name;
}

refit_status_t refit_model_from_config(const char *path, refit_model_t **out)
{
    refit_status_t st;
    if (!path || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_model_from_config: NULL argument");
    struct stat sb;
    bool is_dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    char *file = is_dir ? refit_asprintf("%s%sconfig.json", path, *path && path[strlen(path) - 1] == '/' ? "" : "/")
                        : refit_strdup(path);
    if (!file) return refit_error(REFIT_ERR_NO_MEMORY, "reading %s", path);
    char *text = NULL;
    size_t len = 0;
    /* A regular file only: a FIFO named config.json blocked here forever. */
    if ((st = refit_read_regular(file, REFIT_MODEL_MAX_CONFIG_BYTES, &text, &len))) goto err_file;
    char *hint = dir_name_of(file);
    st = refit_model_from_config_text(text, len, hint, out);
    if (st) refit_error_prefix("%s", file);
    free(hint);
    free(text);
err_file:
    free(file);
    return st;
}

refit_status_t refit_model_open(const char *name_or_path, refit_model_t **out)
{
    if (!name_or_path || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_model_open: NULL argument");
    const char *known;
    for (size_t i = 0; (known = refit_model_builtin_name(i)); i++)
        if (strcmp(known, name_or_path) == 0) return refit_model_builtin(name_or_path, out);
    struct stat sb;
    if (stat(name_or_path, &sb) != 0) {
        const char *why = strerror(errno);
        char list[512];
        size_t pos = 0;
        for (size_t i = 0; (known = refit_model_builtin_name(i)) && pos < sizeof(list); i++)
            pos += (size_t)snprintf(list + pos, sizeof(list) - pos, "%s%s", i ? ", " : "", known);
        return refit_error(
            REFIT_ERR_NOT_FOUND,
            "'%s' is neither a built-in model nor a readable file or directory (%s); built-in models: %s", name_or_path,
            why, list);
    }
    return refit_model_from_config(name_or_path, out);
}
