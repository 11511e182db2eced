/* The dtensor scheme (issue #33): layout strings, exact placements of FSDP2's
 * chunks for uneven shapes (dims not divisible by the mesh, ranks with empty
 * chunks), TP x FSDP (tied embeddings, transformers' packed_colwise experts),
 * HSDP, expert-parallel meshes, the refusals by name, and byte-verified plans
 * from dtensor sources into vllm (TP and EP), hf and megatron destinations
 * with 0 redundant bytes. */
#include "testutil.h"
#include "layout/layout.h"

#include <stdio.h>
#include <string.h>

static void parse_and_normalize(void **state)
{
    (void)state;
    struct {
        const char *in, *out;
        uint32_t world;
    } cases[] = {
        {"dtensor", "dtensor:dp_shard=1,dp_replicate=1,tp=1,experts=fused", 1},
        {"dtensor:dp_shard=64", "dtensor:dp_shard=64,dp_replicate=1,tp=1,experts=fused", 64},
        {"dtensor:dp_replicate=2,dp_shard=2", "dtensor:dp_shard=2,dp_replicate=2,tp=1,experts=fused", 4},
        {"dtensor:tp=2,dp_shard=3,experts=split", "dtensor:dp_shard=3,dp_replicate=1,tp=2,experts=split", 6},
        {"dtensor:dp_replicate=2,dp_shard=4,tp=8", "dtensor:dp_shard=4,dp_replicate=2,tp=8,experts=fused", 64},
        {"dtensor:ep=2,tp=2,dp_shard=2", "dtensor:dp_shard=2,dp_replicate=1,tp=2,ep=2,experts=fused", 4},
        {"dtensor:dp_shard=4,ep=1", "dtensor:dp_shard=4,dp_replicate=1,tp=1,experts=fused", 4},
        {"dtensor:dp_shard=8,ep=4", "dtensor:dp_shard=8,dp_replicate=1,tp=1,ep=4,experts=fused", 8},
    };
    for (size_t i = 0; i < REFIT_ARRAY_LEN(cases); i++) {
        refit_layout_t *l = t_layout(cases[i].in);
        assert_string_equal(refit_layout_string(l), cases[i].out);
        assert_int_equal(refit_layout_world(l), cases[i].world);
        refit_layout_destroy(l);
    }
    refit_layout_t *l = NULL;
    REFIT_ASSERT_ERR(refit_layout_parse("dtensor:dp=2", &l), REFIT_ERR_PARSE, "unknown knob 'dp'");
    REFIT_ASSERT_ERR(refit_layout_parse("dtensor:dp_shard=0", &l), REFIT_ERR_PARSE, "dp_shard=0");
    REFIT_ASSERT_ERR(refit_layout_parse("dtensor:dp_shard=2,dp_shard=2", &l), REFIT_ERR_PARSE, "given twice");
    REFIT_ASSERT_ERR(refit_layout_parse("dtensor:experts=grouped", &l), REFIT_ERR_PARSE, "experts=grouped");
    REFIT_ASSERT_ERR(refit_layout_parse("dtensor:cp=2", &l), REFIT_ERR_UNSUPPORTED, "no cp mesh dimension");
    REFIT_ASSERT_ERR(refit_layout_parse("dtensor:pp=2", &l), REFIT_ERR_UNSUPPORTED, "no pp mesh dimension");
    REFIT_ASSERT_ERR(refit_layout_parse("dtensor:ep=0", &l), REFIT_ERR_PARSE, "ep=0");
    /* ep must tile the (dp_shard, tp) ranks: 6 ranks, ep 4. */
    REFIT_ASSERT_ERR(refit_layout_parse("dtensor:dp_shard=3,tp=2,ep=4", &l), REFIT_ERR_GEOMETRY,
                     "ep=4 does not divide dp_shard x tp = 6");
    REFIT_ASSERT_ERR(refit_layout_parse("dtensor:dp_shard=2,dp_replicate=2,ep=2", &l), REFIT_ERR_UNSUPPORTED,
                     "no replicate dimension");
    REFIT_ASSERT_ERR(refit_layout_parse("dtensor:dp_shard=2,ep=2,experts=split", &l), REFIT_ERR_UNSUPPORTED,
                     "ep=2 with experts=split");
    REFIT_ASSERT_ERR(refit_layout_parse("dtensor:dp_shard=128,dp_replicate=256", &l), REFIT_ERR_GEOMETRY,
                     "32768 ranks");
    assert_null(l);
}

/* What torch.chunk(t, n, dim) gives rank k, computed as torch does it
 * (pieces of ceil(N/n) until N is used up, then empty ones), independently
 * of the scheme's closed form. */
static void torch_chunk(uint64_t N, uint64_t n, uint64_t k, uint64_t *off, uint64_t *len)
{
    uint64_t c = (N + n - 1) / n, pos = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t sz = pos + c <= N ? c : N - pos;
        if (i == k) {
            *off = pos;
            *len = sz;
            return;
        }
        pos += sz;
    }
}

static int local_of(const refit_manifest_t *m, const char *name, refit_tensor_info_t *out)
{
    for (uint32_t i = 0; i < refit_manifest_num_locals(m); i++) {
        refit_manifest_local(m, i, out, NULL, NULL);
        if (!strcmp(out->name, name)) return (int)i;
    }
    return -1;
}

static uint32_t placements_of_local(const refit_manifest_t *m, uint32_t local, refit_placement_t *first)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < refit_manifest_num_placements(m); i++) {
        refit_placement_t p;
        refit_manifest_placement(m, i, &p);
        if (p.local != local) continue;
        if (n++ == 0 && first) *first = p;
    }
    return n;
}

static bool colwise(const char *n, bool tie)
{
    static const char *const suf[] = {".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".gate_proj.weight",
                                      ".up_proj.weight"};
    if (!strcmp(n, "lm_head.weight") || (tie && !strcmp(n, "model.embed_tokens.weight"))) return true;
    for (size_t i = 0; i < REFIT_ARRAY_LEN(suf); i++) {
        size_t a = strlen(n), b = strlen(suf[i]);
        if (a >= b && !strcmp(n + a - b, suf[i])) return true;
    }
    return false;
}

static bool rowwise(const char *n)
{
    size_t a = strlen(n);
    return (a >= 14 && !strcmp(n + a - 14, ".o_proj.weight")) || (a >= 17 && !strcmp(n + a - 17, ".down_proj.weight"));
}

/* The experts a rank's fused tensors hold and their padded count, and its
 * chunk of the intermediate dim: FSDP's chunk of the experts (ep = 1), or
 * FSDP's chunk over efsdp = F*T/ep of EP chunk rank % ep (rank = e + ep*g,
 * transformers' expert mesh); TP's chunk of I (ep = 1 only). */
static void expert_share(const refit_model_spec_t *s, uint32_t F, uint32_t T, uint32_t ep, uint32_t rank, uint64_t *eo,
                         uint64_t *el, uint64_t *P, uint64_t *io, uint64_t *il)
{
    *io = 0;
    *il = s->moe_intermediate;
    if (ep > 1) {
        uint64_t po = 0, pl = 0, ef = (uint64_t)F * T / ep;
        torch_chunk(s->experts, ep, rank % ep, &po, &pl);
        torch_chunk(pl, ef, rank / ep, eo, el);
        *eo += po;
        *P = (pl + ef - 1) / ef;
        return;
    }
    torch_chunk(s->experts, F, (rank / T) % F, eo, el);
    *P = (s->experts + F - 1) / F;
    if (T > 1) torch_chunk(s->moe_intermediate, T, rank % T, io, il);
}

/* Every non-expert parameter of every rank against torch.chunk of the TP
 * shard (tp placements of transformers' plan), the local padded to FSDP2's
 * chunk 0; the fused experts against the chunk of the expert dim (and of the
 * intermediate dim under TP).  Returns the number of (rank, parameter) pairs
 * with an empty chunk. */
static unsigned check_layout_ep(const char *model, uint32_t F, uint32_t R, uint32_t T, uint32_t EP)
{
    char spec[96];
    snprintf(spec, sizeof(spec), "dtensor:dp_shard=%u,dp_replicate=%u,tp=%u,ep=%u", F, R, T, EP);
    refit_model_t *m = t_model(model);
    const refit_model_spec_t *s = &m->spec;
    unsigned empty = 0;
    for (uint32_t rank = 0; rank < F * R * T; rank++) {
        uint32_t t = rank % T, f = (rank / T) % F;
        refit_manifest_t *man = t_manifest(m, spec, rank);
        for (size_t i = 0; i < m->tensors.len; i++) {
            refit_tensor_info_t ct, lt;
            refit_model_tensor(m, i, &ct);
            if (strstr(ct.name, ".mlp.experts.")) continue;
            int li = local_of(man, ct.name, &lt);
            assert_true(li >= 0);
            uint64_t o0 = 0, n0 = ct.shape[0], o1 = 0, n1 = ct.ndim > 1 ? ct.shape[1] : 0;
            if (T > 1 && colwise(ct.name, s->tie)) torch_chunk(ct.shape[0], T, t, &o0, &n0);
            if (T > 1 && rowwise(ct.name)) torch_chunk(ct.shape[1], T, t, &o1, &n1);
            uint64_t fo = 0, fl = 0;
            torch_chunk(n0, F, f, &fo, &fl);
            assert_int_equal(lt.ndim, ct.ndim);
            assert_int_equal(lt.shape[0], (n0 + F - 1) / F);
            if (ct.ndim > 1) assert_int_equal(lt.shape[1], n1);
            refit_placement_t p;
            uint32_t np = placements_of_local(man, (uint32_t)li, &p);
            assert_int_equal(np, fl ? 1 : 0);
            empty += fl == 0;
            if (!fl) continue;
            assert_int_equal(p.canon_offset[0], o0 + fo);
            assert_int_equal(p.extent[0], fl);
            assert_int_equal(p.local_offset[0], 0);
            if (ct.ndim > 1) {
                assert_int_equal(p.canon_offset[1], o1);
                assert_int_equal(p.extent[1], n1);
            }
        }
        for (uint32_t layer = 0; s->experts && layer < s->layers; layer++) {
            if (!refit_spec_layer_is_moe(s, layer)) continue;
            char gname[128], dname[128], canon[128];
            uint64_t eo = 0, el = 0, P = 0, io = 0, il = 0;
            expert_share(s, F, T, EP, rank, &eo, &el, &P, &io, &il);
            snprintf(gname, sizeof(gname), "model.layers.%u.mlp.experts.gate_up_proj", layer);
            snprintf(dname, sizeof(dname), "model.layers.%u.mlp.experts.down_proj", layer);
            refit_tensor_info_t lt, dt;
            int gu = local_of(man, gname, &lt), dn = local_of(man, dname, &dt);
            assert_true(gu >= 0 && dn >= 0);
            assert_int_equal(lt.ndim, 3);
            assert_int_equal(lt.shape[0], P);
            assert_int_equal(lt.shape[1], 2 * il);
            assert_int_equal(lt.shape[2], s->hidden);
            assert_int_equal(dt.shape[0], P);
            assert_int_equal(dt.shape[1], s->hidden);
            assert_int_equal(dt.shape[2], il);
            assert_int_equal(placements_of_local(man, (uint32_t)gu, NULL), 2 * el);
            assert_int_equal(placements_of_local(man, (uint32_t)dn, NULL), el);
            for (uint64_t j = 0; j < el; j++) {
                refit_placement_t p;
                unsigned long long e = eo + j;
                /* packed_colwise: gate chunk t at row 0, up chunk t at row il */
                snprintf(canon, sizeof(canon), "model.layers.%u.mlp.experts.%llu.gate_proj.weight", layer, e);
                assert_true(t_find_placement(man, gname, canon, io, &p) >= 0);
                assert_int_equal(p.local_offset[0], j);
                assert_int_equal(p.local_offset[1], 0);
                assert_int_equal(p.extent[0], il);
                snprintf(canon, sizeof(canon), "model.layers.%u.mlp.experts.%llu.up_proj.weight", layer, e);
                assert_true(t_find_placement(man, gname, canon, io, &p) >= 0);
                assert_int_equal(p.local_offset[0], j);
                assert_int_equal(p.local_offset[1], il);
                assert_int_equal(p.extent[0], il);
                snprintf(canon, sizeof(canon), "model.layers.%u.mlp.experts.%llu.down_proj.weight", layer, e);
                assert_true(t_find_placement(man, dname, canon, 0, &p) >= 0);
                assert_int_equal(p.local_offset[0], j);
                assert_int_equal(p.canon_offset[1], io);
                assert_int_equal(p.extent[0], s->hidden);
                assert_int_equal(p.extent[1], il);
            }
            empty += el == 0;
        }
        refit_manifest_destroy(man);
    }
    refit_model_destroy(m);
    return empty;
}

static unsigned check_layout(const char *model, uint32_t F, uint32_t R, uint32_t T)
{
    return check_layout_ep(model, F, R, T, 1);
}

static void placements_match_torch_chunk(void **state)
{
    (void)state;
    /* tiny-tied: kv 1 x head_dim 16 = 16 k rows, hidden 64, vocab 1001; 7
     * ranks: chunks of 3 rows, rank 5 holds 1, rank 6 none. */
    assert_true(check_layout("tiny-tied", 7, 1, 1) > 0);
    assert_int_equal(check_layout("tiny-dense", 4, 1, 1), 0);
    /* q_norm 16 over 5: 4, 4, 4, 4, 0. */
    assert_true(check_layout("tiny-dense", 5, 1, 1) > 0);
    /* 8 experts over 6: 2,2,2,2,0,0. */
    assert_true(check_layout("tiny-moe", 6, 1, 1) > 0);
    assert_int_equal(check_layout("tiny-moe", 3, 2, 1), 0);
    assert_true(check_layout("tiny-mla", 9, 1, 1) > 0);
    /* TP x FSDP: tp=3 leaves 32 k rows as 11, 11, 10; FSDP 4 of 10 is 3,3,3,1. */
    check_layout("tiny-dense", 4, 1, 3);
    check_layout("tiny-dense", 3, 2, 2);
    assert_true(check_layout("tiny-dense", 7, 1, 2) > 0);
    /* Tied embeddings under TP: the one parameter vocab-parallel (1001 rows
     * over tp 2: 501, 500; FSDP 3 of 500: 167, 167, 166). */
    check_layout("tiny-tied", 3, 1, 2);
    check_layout("tiny-tied", 2, 2, 2);
    /* Experts under TP (packed_colwise): moe_intermediate 32 over tp 3 is
     * 11, 11, 10; 8 experts over dp_shard 3: 3, 3, 2; over 6: 2,2,2,2,0,0. */
    check_layout("tiny-moe", 3, 1, 3);
    assert_true(check_layout("tiny-moe", 6, 1, 2) > 0);
    check_layout("tiny-moe", 2, 2, 2);
    /* Expert-parallel meshes: ep = tp (transformers' from_pretrained), ep > tp
     * (efsdp = 1: whole EP chunks), ep on a 1-d FSDP mesh. */
    check_layout_ep("tiny-moe", 2, 1, 2, 2);
    check_layout_ep("tiny-moe", 2, 1, 2, 4);
    check_layout_ep("tiny-moe", 4, 1, 1, 2);
    check_layout_ep("tiny-moe", 8, 1, 1, 4);
    check_layout_ep("tiny-mla", 4, 1, 1, 4);
}

/* The numbers of the cases above, by hand: a check of the reference too. */
static void placements_by_hand(void **state)
{
    (void)state;
    refit_model_t *m = t_model("tiny-tied");
    refit_placement_t p;
    refit_tensor_info_t lt;
    refit_manifest_t *r5 = t_manifest(m, "dtensor:dp_shard=7", 5), *r6 = t_manifest(m, "dtensor:dp_shard=7", 6);
    const char *k = "model.layers.0.self_attn.k_proj.weight";
    assert_true(t_find_placement(r5, k, k, 15, &p) >= 0);
    assert_int_equal(p.extent[0], 1);
    assert_int_equal(p.extent[1], 64);
    int li = local_of(r6, k, &lt);
    assert_true(li >= 0);
    assert_int_equal(lt.shape[0], 3); /* FSDP2 pads every rank to chunk 0 */
    assert_int_equal(placements_of_local(r6, (uint32_t)li, NULL), 0);
    /* vocab 1001 over 7: 143 rows each, exactly. */
    assert_true(t_find_placement(r6, "model.embed_tokens.weight", "model.embed_tokens.weight", 858, &p) >= 0);
    assert_int_equal(p.extent[0], 143);
    refit_manifest_destroy(r5);
    refit_manifest_destroy(r6);
    refit_model_destroy(m);

    m = t_model("tiny-dense");
    /* rank 11 of dp_shard=4 x tp=3: t=2, f=3; k rows 22..32 of TP rank 2, FSDP chunk 3 of 10 = row 9. */
    refit_manifest_t *r = t_manifest(m, "dtensor:dp_shard=4,tp=3", 11);
    k = "model.layers.1.self_attn.k_proj.weight";
    assert_true(t_find_placement(r, k, k, 31, &p) >= 0);
    assert_int_equal(p.extent[0], 1);
    local_of(r, k, &lt);
    assert_int_equal(lt.shape[0], 3);
    /* o_proj [64, 128] rowwise: TP rank 2 holds columns 86..128 (43, 43, 42), FSDP chunk 3 of 64 rows = 48..64. */
    const char *o = "model.layers.1.self_attn.o_proj.weight";
    assert_true(t_find_placement(r, o, o, 48, &p) >= 0);
    assert_int_equal(p.canon_offset[1], 86);
    assert_int_equal(p.extent[0], 16);
    assert_int_equal(p.extent[1], 42);
    /* Norms are replicated over tp: FSDP chunk 3 of 64 = 48..64. */
    assert_true(t_find_placement(r, "model.norm.weight", "model.norm.weight", 48, &p) >= 0);
    assert_int_equal(p.extent[0], 16);
    refit_manifest_destroy(r);
    refit_model_destroy(m);

    m = t_model("tiny-moe");
    r = t_manifest(m, "dtensor:dp_shard=6", 4);
    li = local_of(r, "model.layers.0.mlp.experts.down_proj", &lt);
    assert_true(li >= 0);
    assert_int_equal(lt.shape[0], 2);
    assert_int_equal(placements_of_local(r, (uint32_t)li, NULL), 0);
    refit_manifest_destroy(r);
    r = t_manifest(m, "dtensor:dp_shard=6", 3);
    assert_true(t_find_placement(r, "model.layers.3.mlp.experts.gate_up_proj",
                                 "model.layers.3.mlp.experts.7.gate_proj.weight", 0, &p) >= 0);
    assert_int_equal(p.local_offset[0], 1);
    assert_int_equal(p.local_offset[1], 0);
    refit_manifest_destroy(r);
    /* Experts under tp 3 x dp_shard 3, rank 5 = (f 1, t 2): experts 3..6,
     * intermediate rows 22..32 (11, 11, 10): gate at local row 0, up at 10. */
    r = t_manifest(m, "dtensor:dp_shard=3,tp=3", 5);
    assert_true(t_find_placement(r, "model.layers.2.mlp.experts.gate_up_proj",
                                 "model.layers.2.mlp.experts.4.up_proj.weight", 22, &p) >= 0);
    assert_int_equal(p.local_offset[0], 1);
    assert_int_equal(p.local_offset[1], 10);
    assert_int_equal(p.extent[0], 10);
    assert_int_equal(p.extent[1], 64);
    assert_true(t_find_placement(r, "model.layers.2.mlp.experts.down_proj",
                                 "model.layers.2.mlp.experts.5.down_proj.weight", 0, &p) >= 0);
    assert_int_equal(p.local_offset[0], 2);
    assert_int_equal(p.canon_offset[1], 22);
    assert_int_equal(p.extent[1], 10);
    li = local_of(r, "model.layers.2.mlp.experts.gate_up_proj", &lt);
    assert_int_equal(lt.shape[0], 3);
    assert_int_equal(lt.shape[1], 20);
    refit_manifest_destroy(r);
    /* ep 4 over dp_shard 2 x tp 2 (efsdp 1): rank 3 holds experts 6, 7 whole. */
    r = t_manifest(m, "dtensor:dp_shard=2,tp=2,ep=4", 3);
    assert_true(t_find_placement(r, "model.layers.0.mlp.experts.gate_up_proj",
                                 "model.layers.0.mlp.experts.6.gate_proj.weight", 0, &p) >= 0);
    assert_int_equal(p.local_offset[0], 0);
    assert_int_equal(p.extent[0], 32);
    refit_manifest_destroy(r);
    /* ep 2 over dp_shard 4 (efsdp 2): rank 1 = (g 0, e 1) holds experts 4, 5;
     * rank 2 = (g 1, e 0) experts 2, 3. */
    r = t_manifest(m, "dtensor:dp_shard=4,ep=2", 2);
    assert_true(t_find_placement(r, "model.layers.0.mlp.experts.down_proj",
                                 "model.layers.0.mlp.experts.2.down_proj.weight", 0, &p) >= 0);
    assert_int_equal(p.local_offset[0], 0);
    refit_manifest_destroy(r);
    r = t_manifest(m, "dtensor:dp_shard=4,ep=2", 1);
    assert_true(t_find_placement(r, "model.layers.0.mlp.experts.down_proj",
                                 "model.layers.0.mlp.experts.5.down_proj.weight", 0, &p) >= 0);
    assert_int_equal(p.local_offset[0], 1);
    refit_manifest_destroy(r);
    /* Split experts (transformers 4 names): each expert's weight is chunked itself. */
    r = t_manifest(m, "dtensor:dp_shard=3,experts=split", 2);
    const char *g = "model.layers.0.mlp.experts.5.gate_proj.weight";
    assert_true(t_find_placement(r, g, g, 22, &p) >= 0);
    assert_int_equal(p.extent[0], 10); /* 32 rows: 11, 11, 10 */
    refit_manifest_destroy(r);
    refit_model_destroy(m);

    /* Tied under tp 2 x dp_shard 2, rank 3 = (f 1, t 1): vocab rows 501..1001
     * of TP rank 1 (501, 500), FSDP chunk 1 of 500 = 250..500: rows 751..1001. */
    m = t_model("tiny-tied");
    r = t_manifest(m, "dtensor:dp_shard=2,tp=2", 3);
    assert_true(t_find_placement(r, "model.embed_tokens.weight", "model.embed_tokens.weight", 751, &p) >= 0);
    assert_int_equal(p.extent[0], 250);
    assert_int_equal(p.extent[1], 64);
    local_of(r, "model.embed_tokens.weight", &lt);
    assert_int_equal(lt.shape[0], 250);
    assert_int_equal(local_of(r, "lm_head.weight", &lt), -1);
    refit_manifest_destroy(r);
    refit_model_destroy(m);
}

/* One replica's placements cover every canonical byte exactly once; with
 * dp_replicate=R every byte R times, and tensors that tp replicates T times
 * more. */
static void coverage_once_per_replica(void **state)
{
    (void)state;
    const char *models[] = {"tiny-moe", "tiny-dense", "tiny-tied", "tiny-mla"};
    const char *specs[] = {"dtensor:dp_shard=7", "dtensor:dp_shard=3,dp_replicate=2", "dtensor:dp_shard=4,tp=3",
                           "dtensor:dp_shard=4,ep=2", "dtensor:dp_shard=2,tp=2,ep=4"};
    for (size_t a = 0; a < REFIT_ARRAY_LEN(models); a++)
        for (size_t b = 0; b < REFIT_ARRAY_LEN(specs); b++) {
            refit_model_t *m = t_model(models[a]);
            refit_layout_t *l = t_layout(specs[b]);
            if (refit_layout_check(l, m) != REFIT_OK) {
                refit_layout_destroy(l);
                refit_model_destroy(m);
                continue;
            }
            uint64_t total = 0, placed = 0;
            for (size_t i = 0; i < m->tensors.len; i++) {
                refit_tensor_info_t t;
                refit_model_tensor(m, i, &t);
                uint32_t T = strstr(specs[b], "tp=3") ? 3 : strstr(specs[b], "tp=2") ? 2 : 1;
                bool split = colwise(t.name, m->spec.tie) || rowwise(t.name) || strstr(t.name, ".mlp.experts.");
                total += refit_tensor_nbytes(&t) * (split ? 1 : T);
            }
            for (uint32_t r = 0; r < refit_layout_world(l); r++) {
                refit_manifest_t *man = t_manifest(m, specs[b], r);
                for (uint32_t i = 0; i < refit_manifest_num_placements(man); i++) {
                    refit_placement_t p;
                    refit_tensor_info_t ct;
                    refit_manifest_placement(man, i, &p);
                    refit_manifest_canonical(man, p.canon, &ct);
                    uint64_t n = refit_dtype_size(ct.dtype);
                    for (uint32_t d = 0; d < p.ndim; d++) n *= p.extent[d];
                    placed += n;
                }
                refit_manifest_destroy(man);
            }
            uint32_t rep = strstr(specs[b], "dp_replicate=2") ? 2 : 1;
            assert_int_equal(placed, rep * total);
            refit_layout_destroy(l);
            refit_model_destroy(m);
        }
}

static void refusals(void **state)
{
    (void)state;
    refit_model_t *moe = t_model("tiny-moe"), *tied = t_model("tiny-tied"), *dense = t_model("tiny-dense"),
                  *mla = t_model("tiny-mla");
    refit_manifest_t *out = NULL;
    /* transformers 4's separate expert modules under TP: not described. */
    refit_layout_t *l = t_layout("dtensor:dp_shard=2,tp=2,experts=split");
    REFIT_ASSERT_ERR(refit_layout_check(l, moe), REFIT_ERR_UNSUPPORTED, "experts=split) under tp > 1");
    REFIT_ASSERT_ERR(refit_layout_manifest(l, moe, 0, &out), REFIT_ERR_UNSUPPORTED, "transformers 4");
    REFIT_ASSERT_OK(refit_layout_check(l, dense)); /* no experts: split or fused is moot */
    refit_layout_destroy(l);
    l = t_layout("dtensor:dp_shard=2,tp=2");
    REFIT_ASSERT_OK(refit_layout_check(l, moe));
    REFIT_ASSERT_OK(refit_layout_check(l, tied));
    REFIT_ASSERT_ERR(refit_layout_check(l, mla), REFIT_ERR_UNSUPPORTED, "MLA attention under tp > 1");
    refit_layout_destroy(l);
    /* ep on a model without experts; 8 experts over ep 16 (uneven). */
    l = t_layout("dtensor:dp_shard=4,ep=4");
    REFIT_ASSERT_ERR(refit_layout_check(l, dense), REFIT_ERR_UNSUPPORTED, "ep=4, but tiny-dense has no experts");
    refit_layout_destroy(l);
    l = t_layout("dtensor:dp_shard=3,ep=3");
    REFIT_ASSERT_ERR(refit_layout_manifest(l, moe, 0, &out), REFIT_ERR_UNSUPPORTED,
                     "8 experts do not split evenly over ep=3");
    refit_layout_destroy(l);
    /* 128 q rows over tp=33: chunks of 4, TP rank 32's is empty (so are its
     * gate/up chunks of 96 rows); rank 31 holds rows 124..128. */
    l = t_layout("dtensor:tp=33");
    REFIT_ASSERT_OK(refit_layout_manifest(l, dense, 31, &out));
    refit_manifest_destroy(out);
    out = NULL;
    REFIT_ASSERT_ERR(refit_layout_manifest(l, dense, 32, &out), REFIT_ERR_UNSUPPORTED,
                     "tp rank 32's chunk of model.layers.0.");
    refit_layout_destroy(l);
    /* moe_intermediate 8 over tp=5: chunks of 2, TP rank 4's is empty (every
     * attention and vocab chunk is not: k rows 64 as 13,13,13,13,12). */
    static const char narrow[] = "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"num_hidden_layers\": 1, "
                                 "\"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 16, "
                                 "\"intermediate_size\": 64, \"moe_intermediate_size\": 8, \"num_experts\": 4, "
                                 "\"vocab_size\": 100, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\"}";
    refit_model_t *nm = NULL;
    REFIT_ASSERT_OK(refit_model_from_config_text(narrow, strlen(narrow), "narrow-moe", &nm));
    l = t_layout("dtensor:tp=5");
    REFIT_ASSERT_OK(refit_layout_manifest(l, nm, 3, &out));
    refit_manifest_destroy(out);
    out = NULL;
    REFIT_ASSERT_ERR(refit_layout_manifest(l, nm, 4, &out), REFIT_ERR_UNSUPPORTED,
                     "tp rank 4's chunk of model.layers.0.mlp.experts (moe_intermediate_size 8 over tp=5) is empty");
    assert_null(out);
    refit_layout_destroy(l);
    refit_model_destroy(nm);
    refit_model_destroy(moe);
    refit_model_destroy(tied);
    refit_model_destroy(dense);
    refit_model_destroy(mla);
}

/* Executed plans, every destination byte verified against the synthetic
 * truth, 0 redundant bytes (t_execute_pair asserts it). */
static void plans_into_every_receiver(void **state)
{
    (void)state;
    const char *srcs[] = {"dtensor:dp_shard=2", "dtensor:dp_shard=7", "dtensor:dp_shard=3,dp_replicate=2",
                          "dtensor:dp_shard=6,experts=split", "dtensor:dp_shard=16"};
    const char *moe_dsts[] = {
        "hf", "vllm:tp=1", "vllm:tp=2", "vllm:tp=4,ep=4", "vllm:tp=2,ep=4", "megatron:tp=2", "megatron:tp=2,pp=2,ep=4"};
    unsigned ranks = 0;
    for (size_t a = 0; a < REFIT_ARRAY_LEN(srcs); a++)
        for (size_t b = 0; b < REFIT_ARRAY_LEN(moe_dsts); b++)
            ranks += t_execute_pair("tiny-moe", srcs[a], moe_dsts[b], 3);
    const char *dense_srcs[] = {"dtensor:dp_shard=5", "dtensor:dp_shard=4,tp=3",
                                "dtensor:dp_shard=2,dp_replicate=2,tp=2"};
    const char *dense_dsts[] = {"hf", "vllm:tp=2", "vllm:tp=8", "megatron:tp=4,pp=2"};
    for (size_t a = 0; a < REFIT_ARRAY_LEN(dense_srcs); a++)
        for (size_t b = 0; b < REFIT_ARRAY_LEN(dense_dsts); b++)
            ranks += t_execute_pair("tiny-dense", dense_srcs[a], dense_dsts[b], 4);
    ranks += t_execute_pair("tiny-tied", "dtensor:dp_shard=7", "vllm:tp=4", 5);
    ranks += t_execute_pair("tiny-tied", "dtensor:dp_shard=2,dp_replicate=2", "megatron:tp=2,pp=2", 5);
    ranks += t_execute_pair("tiny-mla", "dtensor:dp_shard=9", "vllm:tp=2,ep=2", 6);
    ranks += t_execute_pair("tiny-mla", "dtensor:dp_shard=4", "megatron:tp=2,ep=2", 6);
    /* Experts under TP (packed_colwise), EP meshes, tied embeddings under TP. */
    const char *tp_srcs[] = {"dtensor:dp_shard=2,tp=2", "dtensor:dp_shard=3,tp=3", "dtensor:dp_shard=2,tp=2,ep=2",
                             "dtensor:dp_shard=4,ep=2", "dtensor:dp_shard=2,tp=2,ep=4"};
    const char *tp_dsts[] = {
        "hf", "vllm:tp=2", "vllm:tp=4,ep=4", "vllm:tp=2,ep=4", "megatron:tp=2,pp=2,ep=4", "megatron:tp=4,etp=2,ep=2"};
    for (size_t a = 0; a < REFIT_ARRAY_LEN(tp_srcs); a++)
        for (size_t b = 0; b < REFIT_ARRAY_LEN(tp_dsts); b++)
            ranks += t_execute_pair("tiny-moe", tp_srcs[a], tp_dsts[b], 7);
    ranks += t_execute_pair("tiny-tied", "dtensor:dp_shard=3,tp=2", "vllm:tp=4", 8);
    ranks += t_execute_pair("tiny-tied", "dtensor:dp_shard=2,dp_replicate=2,tp=2", "megatron:tp=2,pp=2", 8);
    ranks += t_execute_pair("tiny-tied", "dtensor:dp_shard=2,tp=2", "hf", 8);
    ranks += t_execute_pair("tiny-mla", "dtensor:dp_shard=4,ep=4", "vllm:tp=2,ep=2", 9);
    print_message("dtensor sources: %u destination ranks verified\n", ranks);
    assert_true(ranks > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parse_and_normalize),
        cmocka_unit_test(placements_match_torch_chunk),
        cmocka_unit_test(placements_by_hand),
        cmocka_unit_test(coverage_once_per_replica),
        cmocka_unit_test(refusals),
        cmocka_unit_test(plans_into_every_receiver),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
