/* Models: consistency checks on a spec, the canonical tensor table (Hugging
 * Face names and full shapes, in checkpoint order) and accessors.  The
 * table is built once per model; lookups by name go through a hash map.
 *
 * The table is built twice over: a first pass counts its tensors and bytes
 * without allocating anything, so that the limits of refit/model.h are
 * checked on the very table the second pass will build (no separate formula
 * to keep in step with add_layer), and the second allocates it in one go. */
#include "model/model.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    refit_model_t *m; /* NULL: count only */
    const refit_model_spec_t *s;
    uint64_t tensors, bytes;
    bool mtp; /* the tensors being added belong to an MTP layer */
    refit_status_t st;
} builder_t;

static void add(builder_t *b, refit_dtype_t dtype, uint32_t ndim, uint64_t d0, uint64_t d1, const char *fmt, ...)
    REFIT_PRINTF(6, 7);

static void add(builder_t *b, refit_dtype_t dtype, uint32_t ndim, uint64_t d0, uint64_t d1, const char *fmt, ...)
{
    if (b->st) return;
    uint64_t bytes;
    bool overflow = !refit_mul_u64(d0, ndim > 1 ? d1 : 1, &bytes) ||
                    !refit_mul_u64(bytes, refit_dtype_size(dtype), &bytes) ||
                    !refit_add_u64(b->bytes, bytes, &b->bytes);
    b->tensors++;
    if (!b->m && !overflow) return; /* counting: names only for messages */
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    if (overflow) {
        b->st = refit_error(REFIT_ERR_INVALID_ARG, "model %s: the size of %s overflows 64 bits", b->s->name, name);
        return;
    }
    refit_tdesc_t t = {.name = refit_strdup(name), .dtype = dtype, .ndim = ndim, .shape = {d0, d1}, .mtp = b->mtp};
    if (!t.name || REFIT_VEC_PUSH(&b->m->tensors, t)) {
        free(t.name);
        b->st = refit_error(REFIT_ERR_NO_MEMORY, "building the tensor table");
    }
}

/* x * y for a dimension; 0 (and the builder fails) if it overflows. */
static uint64_t mul_dim(builder_t *b, uint64_t x, uint64_t y)
{
    uint64_t r;
    if (refit_mul_u64(x, y, &r)) return r;
    if (!b->st)
        b->st = refit_error(REFIT_ERR_INVALID_ARG, "model %s: a tensor dimension overflows 64 bits", b->s->name);
    return 0;
}

static void add_layer(builder_t *b, const refit_model_spec_t *s, uint32_t l)
{
    const refit_dtype_t dt = s->dtype;
    const uint64_t H = s->hidden;
    const char *p = "model.layers";
    add(b, dt, 1, H, 0, "%s.%u.input_layernorm.weight", p, l);
    if (s->arch == REFIT_ARCH_MLA) {
        uint64_t qk = (uint64_t)s->qk_nope_dim + s->qk_rope_dim;
        add(b, dt, 2, s->q_lora_rank, H, "%s.%u.self_attn.q_a_proj.weight", p, l);
        add(b, dt, 1, s->q_lora_rank, 0, "%s.%u.self_attn.q_a_layernorm.weight", p, l);
        add(b, dt, 2, mul_dim(b, s->heads, qk), s->q_lora_rank, "%s.%u.self_attn.q_b_proj.weight", p, l);
        add(b, dt, 2, (uint64_t)s->kv_lora_rank + s->qk_rope_dim, H, "%s.%u.self_attn.kv_a_proj_with_mqa.weight", p, l);
        add(b, dt, 1, s->kv_lora_rank, 0, "%s.%u.self_attn.kv_a_layernorm.weight", p, l);
        add(b, dt, 2, mul_dim(b, s->heads, (uint64_t)s->qk_nope_dim + s->v_head_dim), s->kv_lora_rank,
            "%s.%u.self_attn.kv_b_proj.weight", p, l);
        add(b, dt, 2, H, (uint64_t)s->heads * s->v_head_dim, "%s.%u.self_attn.o_proj.weight", p, l);
    } else {
        uint64_t q = (uint64_t)s->heads * s->head_dim, kv = (uint64_t)s->kv_heads * s->head_dim;
        add(b, dt, 2, q, H, "%s.%u.self_attn.q_proj.weight", p, l);
        add(b, dt, 2, kv, H, "%s.%u.self_attn.k_proj.weight", p, l);
        add(b, dt, 2, kv, H, "%s.%u.self_attn.v_proj.weight", p, l);
        add(b, dt, 2, H, q, "%s.%u.self_attn.o_proj.weight", p, l);
        if (s->qk_norm) {
            add(b, dt, 1, s->head_dim, 0, "%s.%u.self_attn.q_norm.weight", p, l);
            add(b, dt, 1, s->head_dim, 0, "%s.%u.self_attn.k_norm.weight", p, l);
        }
    }
    add(b, dt, 1, H, 0, "%s.%u.post_attention_layernorm.weight", p, l);
    if (!refit_spec_layer_is_moe(s, l)) {
        add(b, dt, 2, s->intermediate, H, "%s.%u.mlp.gate_proj.weight", p, l);
        add(b, dt, 2, s->intermediate, H, "%s.%u.mlp.up_proj.weight", p, l);
        add(b, dt, 2, H, s->intermediate, "%s.%u.mlp.down_proj.weight", p, l);
        return;
    }
    add(b, dt, 2, s->experts, H, "%s.%u.mlp.gate.weight", p, l);
    if (s->router_bias) add(b, REFIT_DTYPE_F32, 1, s->experts, 0, "%s.%u.mlp.gate.e_score_correction_bias", p, l);
    for (uint32_t e = 0; e < s->experts; e++) {
        add(b, dt, 2, s->moe_intermediate, H, "%s.%u.mlp.experts.%u.gate_proj.weight", p, l, e);
        add(b, dt, 2, s->moe_intermediate, H, "%s.%u.mlp.experts.%u.up_proj.weight", p, l, e);
        add(b, dt, 2, H, s->moe_intermediate, "%s.%u.mlp.experts.%u.down_proj.weight", p, l, e);
    }
    if (s->shared_experts) {
        uint64_t is = (uint64_t)s->shared_experts * s->moe_intermediate;
        add(b, dt, 2, is, H, "%s.%u.mlp.shared_experts.gate_proj.weight", p, l);
        add(b, dt, 2, is, H, "%s.%u.mlp.shared_experts.up_proj.weight", p, l);
        add(b, dt, 2, H, is, "%s.%u.mlp.shared_experts.down_proj.weight", p, l);
    }
}

/* MTP layer l (l >= layers; DeepSeek-V3's model.layers.61): a decoder layer
 * and the tensors that feed it, as DeepSeek's checkpoints name them:
 * enorm (the next token's embedding), hnorm (the previous depth's hidden
 * state), eh_proj [H, 2H] over their concatenation [embedding; hidden] and
 * shared_head.norm before the (shared) output head. */
static void add_mtp_layer(builder_t *b, const refit_model_spec_t *s, uint32_t l)
{
    const uint64_t H = s->hidden;
    b->mtp = true;
    add_layer(b, s, l);
    add(b, s->dtype, 1, H, 0, "model.layers.%u.enorm.weight", l);
    add(b, s->dtype, 1, H, 0, "model.layers.%u.hnorm.weight", l);
    add(b, s->dtype, 2, H, 2 * H, "model.layers.%u.eh_proj.weight", l);
    add(b, s->dtype, 1, H, 0, "model.layers.%u.shared_head.norm.weight", l);
    b->mtp = false;
}

/* Every canonical tensor, in checkpoint order (counted only when b->m is NULL). */
static void build_table(builder_t *b)
{
    const refit_model_spec_t *s = b->s;
    const uint64_t V = s->vocab, H = s->hidden;
    add(b, s->dtype, 2, V, H, "model.embed_tokens.weight");
    for (uint32_t l = 0; l < s->layers && !b->st; l++) add_layer(b, s, l);
    for (uint32_t i = 0; i < s->mtp_layers && !b->st; i++) add_mtp_layer(b, s, s->layers + i);
    add(b, s->dtype, 1, H, 0, "model.norm.weight");
    if (!s->tie) add(b, s->dtype, 2, V, H, "lm_head.weight");
}

static refit_status_t check_spec(const refit_model_spec_t *s)
{
#define REQUIRE(cond, ...) \
    if (!(cond)) return refit_error(REFIT_ERR_INVALID_ARG, __VA_ARGS__)
    REQUIRE(s->name[0], "model spec without a name");
    REQUIRE(s->arch == REFIT_ARCH_DENSE || s->arch == REFIT_ARCH_MOE || s->arch == REFIT_ARCH_MLA,
            "model %s: unknown architecture %d", s->name, (int)s->arch);
    REQUIRE(refit_dtype_size(s->dtype) > 0, "model %s: invalid dtype", s->name);
    REQUIRE(s->hidden > 0 && s->layers > 0 && s->heads > 0 && s->vocab > 0,
            "model %s: hidden_size, num_hidden_layers, num_attention_heads and vocab_size must be positive", s->name);
    /* Limits before any rule that multiplies or divides the numbers. */
    const bool mla = s->arch == REFIT_ARCH_MLA;
    const struct {
        const char *field; /* as config.json names it */
        uint32_t value, max;
    } lim[] = {
        {"num_hidden_layers", s->layers, REFIT_MODEL_MAX_LAYERS},
        {"num_nextn_predict_layers", s->mtp_layers, REFIT_MODEL_MAX_MTP_LAYERS},
        {"hidden_size", s->hidden, REFIT_MODEL_MAX_HIDDEN},
        {"num_attention_heads", s->heads, REFIT_MODEL_MAX_HEADS},
        {"num_key_value_heads", s->kv_heads, REFIT_MODEL_MAX_HEADS},
        {"head_dim", s->head_dim, REFIT_MODEL_MAX_HEAD_DIM},
        {"intermediate_size", s->intermediate, REFIT_MODEL_MAX_INTERMEDIATE},
        {mla ? "n_routed_experts" : "num_experts", s->experts, REFIT_MODEL_MAX_EXPERTS},
        {"moe_intermediate_size", s->moe_intermediate, REFIT_MODEL_MAX_INTERMEDIATE},
        {"n_shared_experts", s->shared_experts, REFIT_MODEL_MAX_SHARED_EXPERTS},
        {"vocab_size", s->vocab, REFIT_MODEL_MAX_VOCAB},
        {"q_lora_rank", s->q_lora_rank, REFIT_MODEL_MAX_LORA_RANK},
        {"kv_lora_rank", s->kv_lora_rank, REFIT_MODEL_MAX_LORA_RANK},
        {"qk_nope_head_dim", s->qk_nope_dim, REFIT_MODEL_MAX_HEAD_DIM},
        {"qk_rope_head_dim", s->qk_rope_dim, REFIT_MODEL_MAX_HEAD_DIM},
        {"v_head_dim", s->v_head_dim, REFIT_MODEL_MAX_HEAD_DIM},
    };
    for (size_t i = 0; i < REFIT_ARRAY_LEN(lim); i++)
        REQUIRE(lim[i].value <= lim[i].max, "model %s: %s %u is above refit's limit of %u", s->name, lim[i].field,
                lim[i].value, lim[i].max);
    if (s->arch == REFIT_ARCH_MLA) {
        REQUIRE(s->q_lora_rank > 0 && s->kv_lora_rank > 0 && s->qk_nope_dim > 0 && s->qk_rope_dim > 0 &&
                    s->v_head_dim > 0,
                "model %s: MLA needs q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim > 0",
                s->name);
    } else {
        REQUIRE(s->kv_heads > 0 && s->head_dim > 0, "model %s: num_key_value_heads and head_dim must be positive",
                s->name);
        REQUIRE(s->heads % s->kv_heads == 0,
                "model %s: num_attention_heads %u is not a multiple of num_key_value_heads %u", s->name, s->heads,
                s->kv_heads);
    }
    REQUIRE(s->mtp_layers == 0 || s->arch == REFIT_ARCH_MLA,
            "model %s: MTP layers (num_nextn_predict_layers %u) are supported for DeepSeek-V3-style (MLA) models only",
            s->name, s->mtp_layers);
    if (s->arch == REFIT_ARCH_MOE || s->arch == REFIT_ARCH_MLA) {
        REQUIRE(s->experts > 0 && s->moe_intermediate > 0,
                "model %s: a MoE model needs num_experts and moe_intermediate_size", s->name);
    } else {
        REQUIRE(s->experts == 0, "model %s: a dense model cannot have experts", s->name);
    }
    REQUIRE(s->first_dense <= s->layers, "model %s: first_k_dense_replace %u exceeds %u layers", s->name,
            s->first_dense, s->layers);
    bool has_dense = s->experts == 0 || s->first_dense > 0;
    REQUIRE(!has_dense || s->intermediate > 0, "model %s: dense layers need intermediate_size", s->name);
    REQUIRE(s->arch == REFIT_ARCH_MOE || s->arch == REFIT_ARCH_MLA || !s->router_bias,
            "model %s: router bias without experts", s->name);
    return REFIT_OK;
#undef REQUIRE
}

refit_status_t refit_model_from_spec(const refit_model_spec_t *spec, refit_model_t **out)
{
    refit_status_t st;
    if (!spec || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_model_from_spec: NULL argument");
    if ((st = check_spec(spec))) return st;
    builder_t count = {.s = spec};
    build_table(&count);
    if ((st = count.st)) return st;
    if (count.tensors > REFIT_MODEL_MAX_TENSORS)
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "model %s: %" PRIu64
                           " tensors (num_hidden_layers %u, %u experts) are above refit's limit of %u",
                           spec->name, count.tensors, spec->layers, spec->experts, REFIT_MODEL_MAX_TENSORS);
    if (count.bytes > REFIT_MODEL_MAX_BYTES)
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "model %s: %" PRIu64 " bytes of weights are above refit's limit of %" PRIu64 " (64 TiB)",
                           spec->name, count.bytes, REFIT_MODEL_MAX_BYTES);
    refit_model_t *m = calloc(1, sizeof(*m));
    if (!m) return refit_error(REFIT_ERR_NO_MEMORY, "allocating a model");
    m->spec = *spec;
    if (REFIT_VEC_RESERVE(&m->tensors, count.tensors)) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "allocating a table of %" PRIu64 " tensors", count.tensors);
        goto err_model;
    }
    builder_t b = {.m = m, .s = &m->spec};
    build_table(&b);
    if ((st = b.st)) goto err_model;
    m->total_bytes = b.bytes;
    for (size_t i = 0; i < m->tensors.len; i++)
        if (refit_strmap_put(&m->index, m->tensors.data[i].name, (uint32_t)i)) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "indexing the tensor table");
            goto err_model;
        }
    *out = m;
    return REFIT_OK;
err_model:
    refit_model_destroy(m);
    return st;
}

void refit_model_destroy(refit_model_t *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->tensors.len; i++) free(m->tensors.data[i].name);
    REFIT_VEC_FREE(&m->tensors);
    refit_strmap_free(&m->index);
    free(m);
}

refit_status_t refit_model_builtin(const char *name, refit_model_t **out)
{
    if (!name || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_model_builtin: NULL argument");
    const refit_model_spec_t *specs = refit_builtin_specs();
    for (size_t i = 0; specs[i].name[0]; i++)
        if (strcmp(specs[i].name, name) == 0) return refit_model_from_spec(&specs[i], out);
    char known[1024];
    size_t pos = 0;
    for (size_t i = 0; specs[i].name[0] && pos < sizeof(known); i++)
        pos += (size_t)snprintf(known + pos, sizeof(known) - pos, "%s%s", i ? ", " : "", specs[i].name);
    return refit_error(REFIT_ERR_NOT_FOUND, "no built-in model named '%s' (known: %s)", name, known);
}

const char *refit_model_builtin_name(size_t i)
{
    const refit_model_spec_t *specs = refit_builtin_specs();
    for (size_t k = 0; specs[k].name[0]; k++)
        if (k == i) return specs[k].name;
    return NULL;
}

const char *refit_model_name(const refit_model_t *m) { return m->spec.name; }
size_t refit_model_num_tensors(const refit_model_t *m) { return m->tensors.len; }
uint64_t refit_model_total_bytes(const refit_model_t *m) { return m->total_bytes; }

refit_status_t refit_model_tensor(const refit_model_t *m, size_t i, refit_tensor_info_t *out)
{
    if (!m || !out || i >= m->tensors.len)
        return refit_error(REFIT_ERR_INVALID_ARG, "tensor index %zu out of range", i);
    const refit_tdesc_t *t = &m->tensors.data[i];
    out->name = t->name;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof(out->shape));
    return REFIT_OK;
}

int64_t refit_model_find_tensor(const refit_model_t *m, const char *name)
{
    uint32_t i;
    return m && name && refit_strmap_get(&m->index, name, &i) ? (int64_t)i : -1;
}
