/* Writes the seed corpus of fuzz_manifest into a directory: valid encodings
 * of small manifests of varied shapes, plus truncated, corrupt and
 * well-formed-but-invalid ones.  Not part of the build; to regenerate:
 *
 *   cc -std=c11 -D_GNU_SOURCE -Iinclude -Isrc tests/fuzz/gen_manifest_corpus.c \
 *      BUILD/librefit.a -lm -lpthread -o /tmp/gen && /tmp/gen tests/fuzz/corpus/manifest
 *
 * Manifests that finalize would reject are written by marking them finalized
 * by hand (the encoder trusts a finalized manifest), so the decoder sees the
 * bytes a hostile peer could send. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/manifest.h"
#include "layout/manifest_codec.h"

#define DIMS(...) ((const uint64_t[REFIT_MAX_DIMS]){__VA_ARGS__})

static const char *g_dir;

static void die(const char *what)
{
    fprintf(stderr, "gen_manifest_corpus: %s: %s\n", what, refit_last_error());
    exit(1);
}

static void ok(refit_status_t st, const char *what)
{
    if (st != REFIT_OK) die(what);
}

static refit_manifest_t *mk(const char *model, const char *layout, uint32_t rank, uint32_t world)
{
    refit_manifest_identity_t id = {model, layout, rank, world};
    refit_manifest_t *m;
    ok(refit_manifest_create(&id, &m), "create");
    return m;
}

static uint32_t canon(refit_manifest_t *m, const char *name, refit_dtype_t dt, uint32_t nd, const uint64_t *shape)
{
    refit_tensor_info_t t = {.name = name, .dtype = dt, .ndim = nd};
    memcpy(t.shape, shape, nd * sizeof(uint64_t));
    uint32_t id;
    ok(refit_manifest_add_canonical(m, &t, &id), name);
    return id;
}

static uint32_t local(refit_manifest_t *m, const char *name, refit_dtype_t dt, uint32_t nd, const uint64_t *shape,
                      uint32_t region, uint64_t offset)
{
    refit_tensor_info_t t = {.name = name, .dtype = dt, .ndim = nd};
    memcpy(t.shape, shape, nd * sizeof(uint64_t));
    uint32_t id;
    ok(refit_manifest_add_local(m, &t, region, offset, &id), name);
    return id;
}

static void place(refit_manifest_t *m, uint32_t c, uint32_t l, uint32_t nd, const uint64_t *coff, const uint64_t *ext,
                  const uint64_t *loff)
{
    refit_placement_t p = {.canon = c, .local = l, .ndim = nd};
    memcpy(p.canon_offset, coff, sizeof(p.canon_offset));
    memcpy(p.extent, ext, sizeof(p.extent));
    memcpy(p.local_offset, loff, sizeof(p.local_offset));
    ok(refit_manifest_add_placement(m, &p), "placement");
}

static void write_file(const char *name, const void *buf, size_t len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* Encodes m (finalizing it, or, if `force`, marking it finalized unchecked),
 * writes it under `name`, and returns the encoding. */
static uint8_t *emit(refit_manifest_t *m, const char *name, bool force, size_t *len)
{
    void *buf;
    if (force) {
        m->finalized = true;
        m->signature = 1;
    } else {
        ok(refit_manifest_finalize(m), name);
    }
    ok(refit_manifest_encode(m, &buf, len), name);
    write_file(name, buf, *len);
    refit_manifest_destroy(m);
    return buf;
}

static refit_manifest_t *tiny(void)
{
    refit_manifest_t *m = mk("m", "l", 0, 1);
    ok(refit_manifest_add_region(m, 64, NULL), "region");
    uint32_t c = canon(m, "w", REFIT_DTYPE_F32, 1, DIMS(8));
    uint32_t l = local(m, "w", REFIT_DTYPE_F32, 1, DIMS(8), 0, 0);
    place(m, c, l, 1, DIMS(0), DIMS(8), DIMS(0));
    return m;
}

/* fused, 3-d with leading index, padding rows, column slice, two regions */
static refit_manifest_t *small_model(void)
{
    refit_manifest_t *m = mk("tiny-moe", "custom:test", 1, 4);
    ok(refit_manifest_add_region(m, 512, NULL), "region");
    ok(refit_manifest_add_region(m, 64, NULL), "region");
    uint32_t gate = canon(m, "gate", REFIT_DTYPE_BF16, 2, DIMS(6, 4));
    uint32_t up = canon(m, "up", REFIT_DTYPE_BF16, 2, DIMS(6, 4));
    uint32_t e0 = canon(m, "e0.gate", REFIT_DTYPE_BF16, 2, DIMS(6, 4));
    uint32_t e1 = canon(m, "e1.gate", REFIT_DTYPE_BF16, 2, DIMS(6, 4));
    uint32_t emb = canon(m, "embed", REFIT_DTYPE_BF16, 2, DIMS(10, 4));
    uint32_t o = canon(m, "o_proj", REFIT_DTYPE_BF16, 2, DIMS(4, 8));
    uint32_t norm = canon(m, "norm", REFIT_DTYPE_F32, 1, DIMS(4));
    uint32_t lgu = local(m, "gate_up", REFIT_DTYPE_BF16, 2, DIMS(12, 4), 0, 0);
    uint32_t lw = local(m, "w1", REFIT_DTYPE_BF16, 3, DIMS(2, 6, 4), 0, 96);
    uint32_t le = local(m, "embed_padded", REFIT_DTYPE_BF16, 2, DIMS(16, 4), 0, 192);
    uint32_t lo = local(m, "o_proj_tp", REFIT_DTYPE_BF16, 2, DIMS(4, 4), 0, 320);
    uint32_t ln = local(m, "norm", REFIT_DTYPE_F32, 1, DIMS(4), 1, 0);
    place(m, gate, lgu, 2, DIMS(0, 0), DIMS(6, 4), DIMS(0, 0));
    place(m, up, lgu, 2, DIMS(0, 0), DIMS(6, 4), DIMS(6, 0));
    place(m, e0, lw, 2, DIMS(0, 0), DIMS(6, 4), DIMS(0, 0, 0));
    place(m, e1, lw, 2, DIMS(0, 0), DIMS(6, 4), DIMS(1, 0, 0));
    place(m, emb, le, 2, DIMS(0, 0), DIMS(10, 4), DIMS(0, 0));
    place(m, o, lo, 2, DIMS(0, 4), DIMS(4, 4), DIMS(0, 0));
    place(m, norm, ln, 1, DIMS(0), DIMS(4), DIMS(0));
    ok(refit_manifest_set_attr(m, "ucx.rkey", "\x01\x02\x00\xff", 4), "attr");
    ok(refit_manifest_set_attr(m, "addr", "", 0), "attr");
    return m;
}

/* 4-d tensors, 4-d boxes, and 2-d boxes at two leading indices of a 4-d local */
static refit_manifest_t *four_d(void)
{
    refit_manifest_t *m = mk("conv", "custom:4d", 2, 3);
    ok(refit_manifest_add_region(m, 4096, NULL), "region");
    uint32_t k = canon(m, "kernel", REFIT_DTYPE_F16, 4, DIMS(4, 3, 2, 2));
    uint32_t a = canon(m, "a", REFIT_DTYPE_F16, 2, DIMS(2, 2));
    uint32_t lk = local(m, "kernel_half", REFIT_DTYPE_F16, 4, DIMS(2, 3, 2, 2), 0, 0);
    uint32_t la = local(m, "stack", REFIT_DTYPE_F16, 4, DIMS(2, 2, 2, 2), 0, 1024);
    place(m, k, lk, 4, DIMS(2, 0, 0, 0), DIMS(2, 3, 2, 2), DIMS(0, 0, 0, 0));
    place(m, a, la, 2, DIMS(0, 0), DIMS(2, 2), DIMS(1, 0, 0, 0));
    place(m, a, la, 2, DIMS(0, 0), DIMS(2, 2), DIMS(0, 1, 0, 0));
    return m;
}

/* row slices with large offsets (multi-byte varints), u8/i64/f8 dtypes */
static refit_manifest_t *many_rows(void)
{
    refit_manifest_t *m = mk("qwen3-like", "megatron:tp=2,pp=1,ep=1,dp=1", 1, 2);
    ok(refit_manifest_add_region(m, UINT64_C(1) << 40, NULL), "region");
    uint32_t c = canon(m, "model.embed_tokens.weight", REFIT_DTYPE_BF16, 2, DIMS(151936, 4096));
    uint32_t l = local(m, "embedding.word_embeddings.weight", REFIT_DTYPE_BF16, 2, DIMS(75968, 4096), 0,
                       UINT64_C(1) << 33);
    for (uint64_t r = 0; r < 48; r++) place(m, c, l, 2, DIMS(75968 + r * 1582, 0), DIMS(1582, 4096), DIMS(r * 1582, 0));
    uint32_t u = canon(m, "bytes", REFIT_DTYPE_U8, 1, DIMS(300));
    uint32_t lu = local(m, "bytes", REFIT_DTYPE_U8, 1, DIMS(300), 0, 0);
    place(m, u, lu, 1, DIMS(0), DIMS(300), DIMS(0));
    uint32_t i = canon(m, "ids", REFIT_DTYPE_I64, 1, DIMS(16));
    uint32_t li = local(m, "ids", REFIT_DTYPE_I64, 1, DIMS(16), 0, 512);
    place(m, i, li, 1, DIMS(0), DIMS(16), DIMS(0));
    uint32_t f = canon(m, "fp8", REFIT_DTYPE_F8_E4M3, 2, DIMS(128, 128));
    uint32_t lf = local(m, "fp8", REFIT_DTYPE_F8_E4M3, 2, DIMS(128, 64), 0, 1024);
    place(m, f, lf, 2, DIMS(0, 64), DIMS(128, 64), DIMS(0, 0));
    return m;
}

static refit_manifest_t *long_names(void)
{
    char name[REFIT_MANIFEST_MAX_NAME + 1];
    memset(name, 'n', REFIT_MANIFEST_MAX_NAME);
    name[REFIT_MANIFEST_MAX_NAME] = '\0';
    refit_manifest_t *m = mk(name, name, REFIT_MANIFEST_MAX_WORLD - 1, REFIT_MANIFEST_MAX_WORLD);
    ok(refit_manifest_add_region(m, 16, NULL), "region");
    uint32_t c = canon(m, name, REFIT_DTYPE_I32, 1, DIMS(4));
    uint32_t l = local(m, name, REFIT_DTYPE_I32, 1, DIMS(4), 0, 0);
    place(m, c, l, 1, DIMS(0), DIMS(4), DIMS(0));
    ok(refit_manifest_set_attr(m, name, name, REFIT_MANIFEST_MAX_NAME), "attr");
    return m;
}

/* declared tensors without placements (all padding), several regions */
static refit_manifest_t *unplaced(void)
{
    refit_manifest_t *m = mk("m", "pad", 0, 2);
    for (int r = 0; r < 3; r++) ok(refit_manifest_add_region(m, 128, NULL), "region");
    canon(m, "c", REFIT_DTYPE_BF16, 3, DIMS(2, 2, 2));
    local(m, "x", REFIT_DTYPE_BF16, 3, DIMS(2, 2, 2), 2, 64);
    local(m, "y", REFIT_DTYPE_BF16, 1, DIMS(32), 1, 0);
    return m;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    g_dir = argv[1];
    size_t len;
    uint8_t *buf;

    free(emit(mk("empty", "none", 0, 1), "valid_empty", false, &len));
    buf = emit(tiny(), "valid_tiny", false, &len);
    write_file("trunc_tiny_half", buf, len / 2);
    write_file("trunc_tiny_header", buf, REFIT_MANIFEST_HEADER_SIZE - 3);
    buf[len / 2] ^= 0x10;
    write_file("corrupt_tiny_bitflip", buf, len);
    buf[len / 2] ^= 0x10;
    buf[4] = 2;
    refit_manifest_reseal(buf, len);
    write_file("unsupported_version", buf, len);
    buf[4] = 1;
    buf[len - REFIT_MANIFEST_TRAILER_SIZE - 4] = 0x7f; /* the placement's canonical offset, resealed */
    refit_manifest_reseal(buf, len);
    write_file("sealed_box_beyond", buf, len);
    free(buf);

    buf = emit(small_model(), "valid_small_model", false, &len);
    write_file("trunc_small_model_body", buf, len - 11);
    size_t cut = len - 20;
    memcpy(buf + cut, buf + len - REFIT_MANIFEST_TRAILER_SIZE, REFIT_MANIFEST_TRAILER_SIZE);
    refit_manifest_reseal(buf, cut + REFIT_MANIFEST_TRAILER_SIZE);
    write_file("sealed_truncated_body", buf, cut + REFIT_MANIFEST_TRAILER_SIZE);
    free(buf);

    free(emit(four_d(), "valid_four_d", false, &len));
    free(emit(many_rows(), "valid_many_rows", false, &len));
    free(emit(long_names(), "valid_long_names", false, &len));
    free(emit(unplaced(), "valid_unplaced", false, &len));

    /* well-formed encodings that finalize rejects */
    refit_manifest_t *m = tiny();
    place(m, 0, 0, 1, DIMS(0), DIMS(8), DIMS(0));
    free(emit(m, "invalid_overlap", true, &len));
    m = tiny();
    ok(refit_manifest_add_region(m, 8, NULL), "region");
    local(m, "v", REFIT_DTYPE_F32, 1, DIMS(4), 1, 0);
    free(emit(m, "invalid_local_outside_region", true, &len));
    m = tiny();
    canon(m, "h", REFIT_DTYPE_F16, 1, DIMS(8));
    place(m, 1, 0, 1, DIMS(0), DIMS(8), DIMS(0));
    free(emit(m, "invalid_dtype_mismatch", true, &len));
    m = tiny();
    m->rank = 5;
    free(emit(m, "invalid_rank", true, &len));
    m = four_d();
    place(m, 1, 1, 2, DIMS(0, 0), DIMS(2, 2), DIMS(1, 1, 1, 0));
    free(emit(m, "invalid_box_beyond_local", true, &len));

    /* worlds beyond REFIT_MANIFEST_MAX_WORLD (receivers size tables by it):
     * the world field of a valid encoding patched and resealed */
    static const struct {
        const char *name;
        uint32_t rank, world;
    } worlds[] = {
        {"invalid_world_131072", 0, 131072},
        {"invalid_world_beyond_limit", REFIT_MANIFEST_MAX_WORLD, REFIT_MANIFEST_MAX_WORLD + 1},
        {"invalid_world_u32_max", 0, UINT32_MAX},
    };
    buf = emit(tiny(), "valid_tiny", false, &len);
    const size_t rank_at = REFIT_MANIFEST_HEADER_SIZE + 2 + 1 + 2 + 1; /* after model "m" and layout "l" */
    for (size_t i = 0; i < sizeof(worlds) / sizeof(worlds[0]); i++) {
        refit_put_le(buf + rank_at, worlds[i].rank, 4);
        refit_put_le(buf + rank_at + 4, worlds[i].world, 4);
        refit_manifest_reseal(buf, len);
        write_file(worlds[i].name, buf, len);
    }
    free(buf);
    return 0;
}
