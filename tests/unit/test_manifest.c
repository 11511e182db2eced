/* Manifest builder, validation (finalize), signature and binary codec. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/manifest.h"
#include "layout/manifest_codec.h"

#define DIMS(...) ((const uint64_t[REFIT_MAX_DIMS]){__VA_ARGS__})
#define BF16 REFIT_DTYPE_BF16
#define F32 REFIT_DTYPE_F32

/* ---- helpers ------------------------------------------------------------ */

static refit_manifest_t *new_manifest(const char *model, const char *layout, uint32_t rank, uint32_t world)
{
    refit_manifest_identity_t id = {model, layout, rank, world};
    refit_manifest_t *m = NULL;
    REFIT_ASSERT_OK(refit_manifest_create(&id, &m));
    assert_non_null(m);
    return m;
}

static refit_tensor_info_t tinfo(const char *name, refit_dtype_t dt, uint32_t ndim,
                                 const uint64_t shape[REFIT_MAX_DIMS])
{
    refit_tensor_info_t t = {.name = name, .dtype = dt, .ndim = ndim};
    memcpy(t.shape, shape, sizeof(t.shape));
    return t;
}

static uint32_t region(refit_manifest_t *m, uint64_t size)
{
    uint32_t id = 99;
    REFIT_ASSERT_OK(refit_manifest_add_region(m, size, &id));
    return id;
}

static uint32_t canon(refit_manifest_t *m, const char *name, refit_dtype_t dt, uint32_t ndim,
                      const uint64_t shape[REFIT_MAX_DIMS])
{
    refit_tensor_info_t t = tinfo(name, dt, ndim, shape);
    uint32_t id = 99;
    REFIT_ASSERT_OK(refit_manifest_add_canonical(m, &t, &id));
    return id;
}

static uint32_t local(refit_manifest_t *m, const char *name, refit_dtype_t dt, uint32_t ndim,
                      const uint64_t shape[REFIT_MAX_DIMS], uint32_t reg, uint64_t offset)
{
    refit_tensor_info_t t = tinfo(name, dt, ndim, shape);
    uint32_t id = 99;
    REFIT_ASSERT_OK(refit_manifest_add_local(m, &t, reg, offset, &id));
    return id;
}

static refit_placement_t pl(uint32_t c, uint32_t l, uint32_t ndim, const uint64_t coff[REFIT_MAX_DIMS],
                            const uint64_t ext[REFIT_MAX_DIMS], const uint64_t loff[REFIT_MAX_DIMS])
{
    refit_placement_t p = {.canon = c, .local = l, .ndim = ndim};
    memcpy(p.canon_offset, coff, sizeof(p.canon_offset));
    memcpy(p.extent, ext, sizeof(p.extent));
    memcpy(p.local_offset, loff, sizeof(p.local_offset));
    return p;
}

static void place(refit_manifest_t *m, uint32_t c, uint32_t l, uint32_t ndim, const uint64_t coff[REFIT_MAX_DIMS],
                  const uint64_t ext[REFIT_MAX_DIMS], const uint64_t loff[REFIT_MAX_DIMS])
{
    refit_placement_t p = pl(c, l, ndim, coff, ext, loff);
    REFIT_ASSERT_OK(refit_manifest_add_placement(m, &p));
}

/* A small custom model, rank 1 of 4, written as placements directly:
 *   gate [6,4] + up [6,4]        -> gate_up [12,4]           (fused, two placements)
 *   e0.gate/e1.gate/e0.up/e1.up  -> w13 [2,12,4]             (3-d, 2-d boxes at a leading index)
 *   embed [10,4]                 -> embed [16,4]             (rows 10..15 are padding)
 *   o_proj [4,8] columns 4..8    -> o_proj [4,4]             (a tensor-parallel column slice)
 *   norm f32 [4]                 -> norm [4] in region 1
 * Region 0 is 512 bytes (the tail is unused), region 1 is 64. */
static refit_manifest_t *small_model(void)
{
    refit_manifest_t *m = new_manifest("tiny-moe", "custom:test", 1, 4);
    uint32_t r0 = region(m, 512), r1 = region(m, 64);
    uint32_t gate = canon(m, "gate", BF16, 2, DIMS(6, 4)), up = canon(m, "up", BF16, 2, DIMS(6, 4));
    uint32_t eg0 = canon(m, "e0.gate", BF16, 2, DIMS(6, 4)), eg1 = canon(m, "e1.gate", BF16, 2, DIMS(6, 4));
    uint32_t eu0 = canon(m, "e0.up", BF16, 2, DIMS(6, 4)), eu1 = canon(m, "e1.up", BF16, 2, DIMS(6, 4));
    uint32_t emb = canon(m, "embed", BF16, 2, DIMS(10, 4));
    uint32_t o = canon(m, "o_proj", BF16, 2, DIMS(4, 8));
    uint32_t norm = canon(m, "norm", F32, 1, DIMS(4));

    uint32_t lgu = local(m, "gate_up", BF16, 2, DIMS(12, 4), r0, 0);         /* 96 bytes */
    uint32_t lw13 = local(m, "w13", BF16, 3, DIMS(2, 12, 4), r0, 96);        /* 192 bytes */
    uint32_t lemb = local(m, "embed_padded", BF16, 2, DIMS(16, 4), r0, 288); /* 128 bytes */
    uint32_t lo = local(m, "o_proj_tp", BF16, 2, DIMS(4, 4), r0, 416);       /* 32 bytes */
    uint32_t lnorm = local(m, "norm", F32, 1, DIMS(4), r1, 0);               /* 16 bytes */

    place(m, gate, lgu, 2, DIMS(0, 0), DIMS(6, 4), DIMS(0, 0));
    place(m, up, lgu, 2, DIMS(0, 0), DIMS(6, 4), DIMS(6, 0));
    place(m, eg0, lw13, 2, DIMS(0, 0), DIMS(6, 4), DIMS(0, 0, 0));
    place(m, eu0, lw13, 2, DIMS(0, 0), DIMS(6, 4), DIMS(0, 6, 0));
    place(m, eg1, lw13, 2, DIMS(0, 0), DIMS(6, 4), DIMS(1, 0, 0));
    place(m, eu1, lw13, 2, DIMS(0, 0), DIMS(6, 4), DIMS(1, 6, 0));
    place(m, emb, lemb, 2, DIMS(0, 0), DIMS(10, 4), DIMS(0, 0));
    place(m, o, lo, 2, DIMS(0, 4), DIMS(4, 4), DIMS(0, 0));
    place(m, norm, lnorm, 1, DIMS(0), DIMS(4), DIMS(0));
    return m;
}

/* A manifest with one region, canonical A bf16 [8,4] and local LA bf16
 * [8,4] at offset 0, for the validation tests to break. */
static refit_manifest_t *base(uint64_t region_size)
{
    refit_manifest_t *m = new_manifest("model", "layout", 0, 1);
    region(m, region_size);
    canon(m, "A", BF16, 2, DIMS(8, 4));
    local(m, "LA", BF16, 2, DIMS(8, 4), 0, 0);
    return m;
}

static void assert_same_manifest(const refit_manifest_t *a, const refit_manifest_t *b)
{
    refit_manifest_identity_t ia, ib;
    refit_manifest_identity(a, &ia);
    refit_manifest_identity(b, &ib);
    assert_string_equal(ia.model, ib.model);
    assert_string_equal(ia.layout, ib.layout);
    assert_int_equal(ia.rank, ib.rank);
    assert_int_equal(ia.world, ib.world);
    assert_int_equal(refit_manifest_num_regions(a), refit_manifest_num_regions(b));
    for (uint32_t i = 0; i < refit_manifest_num_regions(a); i++)
        assert_int_equal(refit_manifest_region_size(a, i), refit_manifest_region_size(b, i));
    assert_int_equal(refit_manifest_num_canonical(a), refit_manifest_num_canonical(b));
    for (uint32_t i = 0; i < refit_manifest_num_canonical(a); i++) {
        refit_tensor_info_t ta, tb;
        refit_manifest_canonical(a, i, &ta);
        refit_manifest_canonical(b, i, &tb);
        assert_string_equal(ta.name, tb.name);
        assert_int_equal(ta.dtype, tb.dtype);
        assert_int_equal(ta.ndim, tb.ndim);
        assert_memory_equal(ta.shape, tb.shape, ta.ndim * sizeof(uint64_t));
    }
    assert_int_equal(refit_manifest_num_locals(a), refit_manifest_num_locals(b));
    for (uint32_t i = 0; i < refit_manifest_num_locals(a); i++) {
        refit_tensor_info_t ta, tb;
        uint32_t ra, rb;
        uint64_t oa, ob;
        refit_manifest_local(a, i, &ta, &ra, &oa);
        refit_manifest_local(b, i, &tb, &rb, &ob);
        assert_string_equal(ta.name, tb.name);
        assert_int_equal(ta.dtype, tb.dtype);
        assert_int_equal(ta.ndim, tb.ndim);
        assert_memory_equal(ta.shape, tb.shape, ta.ndim * sizeof(uint64_t));
        assert_int_equal(ra, rb);
        assert_int_equal(oa, ob);
    }
    assert_int_equal(refit_manifest_num_placements(a), refit_manifest_num_placements(b));
    for (uint32_t i = 0; i < refit_manifest_num_placements(a); i++) {
        refit_placement_t pa, pb;
        refit_tensor_info_t lt;
        refit_manifest_placement(a, i, &pa);
        refit_manifest_placement(b, i, &pb);
        assert_int_equal(pa.canon, pb.canon);
        assert_int_equal(pa.local, pb.local);
        assert_int_equal(pa.ndim, pb.ndim);
        assert_memory_equal(pa.canon_offset, pb.canon_offset, pa.ndim * sizeof(uint64_t));
        assert_memory_equal(pa.extent, pb.extent, pa.ndim * sizeof(uint64_t));
        refit_manifest_local(a, pa.local, &lt, NULL, NULL);
        assert_memory_equal(pa.local_offset, pb.local_offset, lt.ndim * sizeof(uint64_t));
    }
    assert_int_equal(refit_manifest_signature(a), refit_manifest_signature(b));
}

/* ---- builder ------------------------------------------------------------ */

static void test_builder_happy_path(void **state)
{
    (void)state;
    refit_manifest_t *m = small_model();
    assert_int_equal(refit_manifest_signature(m), 0); /* not yet finalized */
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    uint64_t sig = refit_manifest_signature(m);
    assert_true(sig != 0);
    REFIT_ASSERT_OK(refit_manifest_finalize(m)); /* a no-op */
    assert_int_equal(refit_manifest_signature(m), sig);

    refit_manifest_identity_t id;
    refit_manifest_identity(m, &id);
    assert_string_equal(id.model, "tiny-moe");
    assert_string_equal(id.layout, "custom:test");
    assert_int_equal(id.rank, 1);
    assert_int_equal(id.world, 4);
    assert_int_equal(refit_manifest_num_regions(m), 2);
    assert_int_equal(refit_manifest_region_size(m, 0), 512);
    assert_int_equal(refit_manifest_region_size(m, 1), 64);
    assert_int_equal(refit_manifest_num_canonical(m), 9);
    assert_int_equal(refit_manifest_num_locals(m), 5);
    assert_int_equal(refit_manifest_num_placements(m), 9);

    refit_tensor_info_t t;
    uint32_t r;
    uint64_t off;
    refit_manifest_canonical(m, 8, &t);
    assert_string_equal(t.name, "norm");
    assert_int_equal(t.dtype, F32);
    assert_int_equal(t.ndim, 1);
    assert_int_equal(t.shape[0], 4);
    refit_manifest_local(m, 1, &t, &r, &off);
    assert_string_equal(t.name, "w13");
    assert_int_equal(t.ndim, 3);
    assert_int_equal(t.shape[0], 2);
    assert_int_equal(t.shape[1], 12);
    assert_int_equal(t.shape[2], 4);
    assert_int_equal(r, 0);
    assert_int_equal(off, 96);

    refit_placement_t p;
    refit_manifest_placement(m, 5, &p); /* e1.up -> w13[1, 6:12, :] */
    assert_int_equal(p.canon, 5);
    assert_int_equal(p.local, 1);
    assert_int_equal(p.local_offset[0], 1);
    assert_int_equal(p.local_offset[1], 6);
    assert_int_equal(p.extent[0], 6);
    /* element (e1.up row 2, col 3) lands at w13[1, 8, 3] */
    uint64_t cpoint[REFIT_MAX_DIMS] = {2, 3};
    assert_int_equal(refit_placement_local_index(m, &m->placements.data[5], cpoint), 1 * 48 + 8 * 4 + 3);

    /* After finalize only attributes may change. */
    refit_tensor_info_t extra = tinfo("extra", BF16, 1, DIMS(2));
    REFIT_ASSERT_ERR(refit_manifest_add_canonical(m, &extra, NULL), REFIT_ERR_INVALID_ARG, "finalized");
    REFIT_ASSERT_ERR(refit_manifest_add_region(m, 8, NULL), REFIT_ERR_INVALID_ARG, "finalized");
    REFIT_ASSERT_OK(refit_manifest_set_attr(m, "ucx.rkey", "abc", 3));
    REFIT_ASSERT_OK(refit_manifest_set_attr(m, "ucx.rkey", "abcd", 4)); /* replaces */
    const void *val;
    size_t len;
    REFIT_ASSERT_OK(refit_manifest_get_attr(m, "ucx.rkey", &val, &len));
    assert_int_equal(len, 4);
    assert_memory_equal(val, "abcd", 4);
    REFIT_ASSERT_ERR(refit_manifest_get_attr(m, "nope", &val, &len), REFIT_ERR_NOT_FOUND, "nope");
    assert_int_equal(refit_manifest_signature(m), sig);
    refit_manifest_destroy(m);
    refit_manifest_destroy(NULL);
}

static void test_builder_canonical_dedup_and_duplicates(void **state)
{
    (void)state;
    refit_manifest_t *m = base(1024);
    assert_int_equal(canon(m, "A", BF16, 2, DIMS(8, 4)), 0); /* the same tensor again: its first id */
    assert_int_equal(refit_manifest_num_canonical(m), 1);
    refit_tensor_info_t t = tinfo("A", BF16, 2, DIMS(8, 5));
    REFIT_ASSERT_ERR(refit_manifest_add_canonical(m, &t, NULL), REFIT_ERR_MISMATCH, "declared twice");
    t = tinfo("A", F32, 2, DIMS(8, 4));
    REFIT_ASSERT_ERR(refit_manifest_add_canonical(m, &t, NULL), REFIT_ERR_MISMATCH, "declared twice");
    t = tinfo("LA", BF16, 1, DIMS(4));
    REFIT_ASSERT_ERR(refit_manifest_add_local(m, &t, 0, 512, NULL), REFIT_ERR_INVALID_ARG, "declared twice");
    t = tinfo("Z", BF16, 2, DIMS(8, 0));
    REFIT_ASSERT_ERR(refit_manifest_add_canonical(m, &t, NULL), REFIT_ERR_INVALID_ARG, "zero dimension");
    t = tinfo("Z", (refit_dtype_t)42, 1, DIMS(8));
    REFIT_ASSERT_ERR(refit_manifest_add_canonical(m, &t, NULL), REFIT_ERR_INVALID_ARG, "invalid dtype");
    t = tinfo("Z", BF16, 5, DIMS(1, 1, 1, 1));
    REFIT_ASSERT_ERR(refit_manifest_add_canonical(m, &t, NULL), REFIT_ERR_INVALID_ARG, "5 dims");
    t = tinfo("Z", BF16, 2, DIMS(UINT64_C(1) << 40, UINT64_C(1) << 40));
    REFIT_ASSERT_ERR(refit_manifest_add_canonical(m, &t, NULL), REFIT_ERR_INVALID_ARG, "overflows");
    REFIT_ASSERT_ERR(refit_manifest_add_region(m, 0, NULL), REFIT_ERR_INVALID_ARG, "size 0");
    REFIT_ASSERT_OK(refit_manifest_finalize(m)); /* the failures left nothing behind */
    refit_manifest_destroy(m);
}

static void test_create_rejects_bad_identity(void **state)
{
    (void)state;
    refit_manifest_t *m = NULL;
    char longname[REFIT_MANIFEST_MAX_NAME + 2];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    REFIT_ASSERT_ERR(refit_manifest_create(&(refit_manifest_identity_t){"m", "l", 4, 4}, &m), REFIT_ERR_INVALID_ARG,
                     "rank 4 is not below world size 4");
    REFIT_ASSERT_ERR(refit_manifest_create(&(refit_manifest_identity_t){"m", "l", 0, 0}, &m), REFIT_ERR_INVALID_ARG,
                     "world size 0");
    REFIT_ASSERT_ERR(refit_manifest_create(&(refit_manifest_identity_t){"", "l", 0, 1}, &m), REFIT_ERR_INVALID_ARG,
                     "model name has length 0");
    REFIT_ASSERT_ERR(refit_manifest_create(&(refit_manifest_identity_t){"m", longname, 0, 1}, &m),
                     REFIT_ERR_INVALID_ARG, "layout string has length 256");
    REFIT_ASSERT_ERR(refit_manifest_create(&(refit_manifest_identity_t){NULL, "l", 0, 1}, &m), REFIT_ERR_INVALID_ARG,
                     "model name is NULL");
    REFIT_ASSERT_ERR(refit_manifest_create(&(refit_manifest_identity_t){"m\x1b[31m", "l", 0, 1}, &m),
                     REFIT_ERR_INVALID_ARG, "byte 0x1b at 1 (names are printable ASCII)");
    assert_null(m);
}

/* ---- validation (finalize) --------------------------------------------- */

static void test_validate_box_beyond_canonical(void **state)
{
    (void)state;
    refit_manifest_t *m = base(1024);
    place(m, 0, 0, 2, DIMS(6, 0), DIMS(4, 4), DIMS(0, 0));
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_OUT_OF_BOUNDS, "box of A ends at 10 in dim 0");
    assert_int_equal(refit_manifest_signature(m), 0);
    refit_manifest_destroy(m);

    /* an offset so large that offset + extent overflows */
    m = base(1024);
    place(m, 0, 0, 2, DIMS(0, UINT64_MAX), DIMS(1, 2), DIMS(0, 0));
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_OUT_OF_BOUNDS, "in dim 1, beyond its size 4");
    refit_manifest_destroy(m);
}

static void test_validate_box_beyond_local(void **state)
{
    (void)state;
    refit_manifest_t *m = base(1024);
    canon(m, "B", BF16, 2, DIMS(16, 4));
    place(m, 1, 0, 2, DIMS(0, 0), DIMS(8, 4), DIMS(4, 0));
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_OUT_OF_BOUNDS, "local box ends at 12 in dim 0 of LA");
    refit_manifest_destroy(m);

    /* a leading index beyond a 3-d local tensor */
    m = base(1024);
    local(m, "W3", BF16, 3, DIMS(2, 8, 4), 0, 64);
    place(m, 0, 1, 2, DIMS(0, 0), DIMS(8, 4), DIMS(2, 0, 0));
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_OUT_OF_BOUNDS, "local index 2 in dim 0 of W3");
    refit_manifest_destroy(m);
}

static void test_validate_local_outside_region(void **state)
{
    (void)state;
    refit_manifest_t *m = base(32); /* LA needs 64 bytes */
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_OUT_OF_BOUNDS, "LA (bytes 0..64) lies outside region 0");
    refit_manifest_destroy(m);

    m = base(1024);
    local(m, "far", BF16, 1, DIMS(4), 0, UINT64_MAX - 2); /* offset + size overflows */
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_OUT_OF_BOUNDS, "local tensor far");
    refit_manifest_destroy(m);

    m = base(1024);
    local(m, "elsewhere", BF16, 1, DIMS(4), 3, 0);
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_INVALID_ARG, "elsewhere is in region 3 of 1");
    refit_manifest_destroy(m);
}

static void test_validate_locals_overlap(void **state)
{
    (void)state;
    refit_manifest_t *m = base(1024);
    local(m, "LB", BF16, 2, DIMS(8, 4), 0, 32); /* LA is bytes 0..64 */
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_OVERLAP, "local tensors LA and LB share bytes of region 0");
    refit_manifest_destroy(m);

    /* adjacent tensors, and the same offsets in another region, are fine */
    m = base(1024);
    region(m, 64);
    local(m, "LB", BF16, 2, DIMS(8, 4), 0, 64);
    local(m, "LC", BF16, 2, DIMS(8, 4), 1, 0);
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    refit_manifest_destroy(m);
}

static void test_validate_placements_overlap(void **state)
{
    (void)state;
    refit_manifest_t *m = base(1024);
    local(m, "L16", BF16, 2, DIMS(16, 4), 0, 64);
    canon(m, "B", BF16, 2, DIMS(8, 4));
    place(m, 0, 1, 2, DIMS(0, 0), DIMS(8, 4), DIMS(0, 0));
    place(m, 1, 1, 2, DIMS(0, 0), DIMS(8, 4), DIMS(7, 0)); /* row 7 twice */
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_OVERLAP,
                     "placements of A and B overlap in local tensor L16");
    refit_manifest_destroy(m);

    /* the same box twice */
    m = base(1024);
    place(m, 0, 0, 2, DIMS(0, 0), DIMS(8, 4), DIMS(0, 0));
    place(m, 0, 0, 2, DIMS(0, 0), DIMS(8, 4), DIMS(0, 0));
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_OVERLAP, "[0:8, 0:4]");
    refit_manifest_destroy(m);

    /* 3-d: two boxes at the same leading index */
    m = base(1024);
    local(m, "W3", BF16, 3, DIMS(2, 8, 4), 0, 64);
    canon(m, "B", BF16, 2, DIMS(8, 4));
    place(m, 0, 1, 2, DIMS(0, 0), DIMS(8, 4), DIMS(1, 0, 0));
    place(m, 1, 1, 2, DIMS(0, 0), DIMS(8, 4), DIMS(1, 0, 0));
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_OVERLAP, "in local tensor W3");
    refit_manifest_destroy(m);
}

static void test_validate_touching_placements_accepted(void **state)
{
    (void)state;
    refit_manifest_t *m = base(1024);
    local(m, "L16", BF16, 2, DIMS(16, 4), 0, 64);
    canon(m, "B", BF16, 2, DIMS(8, 4));
    place(m, 0, 1, 2, DIMS(0, 0), DIMS(8, 4), DIMS(0, 0));
    place(m, 1, 1, 2, DIMS(0, 0), DIMS(8, 4), DIMS(8, 0)); /* rows touch at 8 */
    /* column halves of A side by side in LA */
    place(m, 0, 0, 2, DIMS(0, 0), DIMS(8, 2), DIMS(0, 0));
    place(m, 0, 0, 2, DIMS(0, 2), DIMS(8, 2), DIMS(0, 2));
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    refit_manifest_destroy(m);
}

static void test_validate_dtype_and_rank_mismatch(void **state)
{
    (void)state;
    refit_manifest_t *m = base(1024);
    canon(m, "F", F32, 2, DIMS(8, 4));
    place(m, 1, 0, 2, DIMS(0, 0), DIMS(8, 4), DIMS(0, 0));
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_MISMATCH, "local tensor LA is bf16 but canonical F is f32");
    refit_manifest_destroy(m);

    m = base(1024);
    local(m, "flat", BF16, 1, DIMS(32), 0, 64);
    place(m, 0, 1, 2, DIMS(0, 0), DIMS(8, 4), DIMS(0));
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_MISMATCH, "fewer dims (1) than canonical A (2)");
    refit_manifest_destroy(m);
}

static void test_validate_bad_ids_ndim_extent(void **state)
{
    (void)state;
    refit_manifest_t *m = base(1024);
    place(m, 5, 0, 2, DIMS(0, 0), DIMS(8, 4), DIMS(0, 0));
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_INVALID_ARG, "tensor ids 5/0 out of range");
    refit_manifest_destroy(m);

    m = base(1024);
    place(m, 0, 7, 2, DIMS(0, 0), DIMS(8, 4), DIMS(0, 0));
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_INVALID_ARG, "tensor ids 0/7 out of range");
    refit_manifest_destroy(m);

    m = base(1024);
    place(m, 0, 0, 1, DIMS(0), DIMS(8), DIMS(0, 0));
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_INVALID_ARG, "has 1 dims, the tensor has 2");
    refit_manifest_destroy(m);

    m = base(1024);
    place(m, 0, 0, 2, DIMS(0, 0), DIMS(8, 0), DIMS(0, 0));
    REFIT_ASSERT_ERR(refit_manifest_finalize(m), REFIT_ERR_INVALID_ARG, "zero extent in dim 1");
    refit_manifest_destroy(m);

    REFIT_ASSERT_ERR(refit_manifest_add_placement(NULL, NULL), REFIT_ERR_INVALID_ARG, "NULL");
    REFIT_ASSERT_ERR(refit_manifest_finalize(NULL), REFIT_ERR_INVALID_ARG, "NULL");
}

/* ---- codec -------------------------------------------------------------- */

static void encode(const refit_manifest_t *m, uint8_t **buf, size_t *len)
{
    void *b = NULL;
    REFIT_ASSERT_OK(refit_manifest_encode(m, &b, len));
    *buf = b;
}

static void test_codec_round_trip(void **state)
{
    (void)state;
    refit_manifest_t *m = small_model();
    uint8_t *buf;
    size_t len;
    void *dummy = NULL;
    size_t dlen = 0;
    REFIT_ASSERT_ERR(refit_manifest_encode(m, &dummy, &dlen), REFIT_ERR_INVALID_ARG, "not finalized");
    assert_null(dummy);
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    REFIT_ASSERT_OK(refit_manifest_set_attr(m, "ucx.rkey", "\x01\x00\x02", 3));
    REFIT_ASSERT_OK(refit_manifest_set_attr(m, "empty", NULL, 0));
    encode(m, &buf, &len);
    assert_memory_equal(buf, "RFTM", 4);
    assert_true(len < 400); /* compact: 9 placements, 9 + 5 tensors */

    refit_manifest_t *d = NULL;
    REFIT_ASSERT_OK(refit_manifest_decode(buf, len, &d));
    assert_same_manifest(m, d);
    const void *val;
    size_t vlen;
    REFIT_ASSERT_OK(refit_manifest_get_attr(d, "ucx.rkey", &val, &vlen));
    assert_int_equal(vlen, 3);
    assert_memory_equal(val, "\x01\x00\x02", 3);
    REFIT_ASSERT_OK(refit_manifest_get_attr(d, "empty", &val, &vlen));
    assert_int_equal(vlen, 0);
    /* a decoded manifest is finalized */
    REFIT_ASSERT_ERR(refit_manifest_add_region(d, 8, NULL), REFIT_ERR_INVALID_ARG, "finalized");

    /* one manifest, one encoding */
    uint8_t *buf2;
    size_t len2;
    encode(d, &buf2, &len2);
    assert_int_equal(len, len2);
    assert_memory_equal(buf, buf2, len);
    free(buf2);
    free(buf);
    refit_manifest_destroy(d);
    refit_manifest_destroy(m);
}

static void test_codec_round_trip_many_placements(void **state)
{
    (void)state;
    /* 4096 row slices of a [4096, 64] tensor into 4 local tensors: varints
     * keep each placement to a handful of bytes. */
    refit_manifest_t *m = new_manifest("big", "rows", 3, 8);
    region(m, UINT64_C(1) << 40);
    uint32_t c = canon(m, "W", BF16, 2, DIMS(4096, 64));
    uint32_t l[4];
    const char *names[4] = {"L0", "L1", "L2", "L3"};
    for (int i = 0; i < 4; i++) l[i] = local(m, names[i], BF16, 2, DIMS(1024, 64), 0, (uint64_t)i * 1024 * 128);
    for (uint64_t r = 0; r < 4096; r++) place(m, c, l[r % 4], 2, DIMS(r, 0), DIMS(1, 64), DIMS(r / 4, 0));
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    uint8_t *buf;
    size_t len;
    encode(m, &buf, &len);
    assert_true(len < 4096 * 12); /* at most 11 bytes a placement here */
    refit_manifest_t *d = NULL;
    REFIT_ASSERT_OK(refit_manifest_decode(buf, len, &d));
    assert_same_manifest(m, d);
    free(buf);
    refit_manifest_destroy(d);
    refit_manifest_destroy(m);
}

typedef struct {
    uint64_t region_size, local_offset, canon_rows, canon_offset;
    uint32_t rank;
    const char *layout;
} sig_knobs_t;

static uint64_t sig_of(sig_knobs_t k, bool with_attr)
{
    refit_manifest_t *m = new_manifest("model", k.layout, k.rank, 4);
    region(m, k.region_size);
    canon(m, "W", BF16, 2, DIMS(k.canon_rows, 4));
    local(m, "L", BF16, 2, DIMS(8, 4), 0, k.local_offset);
    place(m, 0, 0, 2, DIMS(k.canon_offset, 0), DIMS(8, 4), DIMS(0, 0));
    if (with_attr) REFIT_ASSERT_OK(refit_manifest_set_attr(m, "addr", "before", 6));
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    uint64_t s = refit_manifest_signature(m);
    if (with_attr) {
        REFIT_ASSERT_OK(refit_manifest_set_attr(m, "addr", "after finalize", 14));
        assert_int_equal(refit_manifest_signature(m), s);
    }
    refit_manifest_destroy(m);
    return s;
}

static void test_signature_sensitivity(void **state)
{
    (void)state;
    const sig_knobs_t b = {1024, 0, 16, 0, 0, "tp=2"};
    uint64_t s0 = sig_of(b, false);
    assert_int_equal(sig_of(b, false), s0); /* stable */
    assert_int_equal(sig_of(b, true), s0);  /* attributes do not count */
    sig_knobs_t v[6] = {b, b, b, b, b, b};
    v[0].region_size = 2048;
    v[1].local_offset = 64;
    v[2].canon_rows = 24;
    v[3].canon_offset = 8;
    v[4].rank = 1;
    v[5].layout = "tp=4";
    uint64_t seen[7] = {s0};
    for (int i = 0; i < 6; i++) {
        seen[i + 1] = sig_of(v[i], false);
        for (int j = 0; j <= i; j++) assert_true(seen[i + 1] != seen[j]);
    }
}

static void test_decode_every_truncation(void **state)
{
    (void)state;
    refit_manifest_t *m = small_model();
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    REFIT_ASSERT_OK(refit_manifest_set_attr(m, "k", "value", 5));
    uint8_t *buf;
    size_t len;
    encode(m, &buf, &len);
    for (size_t n = 0; n < len; n++) {
        refit_manifest_t *d = (refit_manifest_t *)(uintptr_t)0x1; /* must stay untouched */
        uint8_t *copy = malloc(n ? n : 1);                        /* exactly n bytes, so ASan sees any over-read */
        memcpy(copy, buf, n);
        REFIT_ASSERT_ERR(refit_manifest_decode(copy, n, &d), REFIT_ERR_CORRUPT, "byte");
        assert_true(d == (refit_manifest_t *)(uintptr_t)0x1);
        free(copy);
    }
    /* truncated bodies with a length field and checksum that match: the
     * parser itself must find the end */
    for (size_t n = REFIT_MANIFEST_HEADER_SIZE; n < len - REFIT_MANIFEST_TRAILER_SIZE; n++) {
        size_t clen = n + REFIT_MANIFEST_TRAILER_SIZE;
        uint8_t *copy = malloc(clen);
        memcpy(copy, buf, n);
        refit_manifest_reseal(copy, clen);
        refit_manifest_t *d = NULL;
        REFIT_ASSERT_ERR(refit_manifest_decode(copy, clen, &d), REFIT_ERR_CORRUPT, "byte");
        assert_null(d);
        free(copy);
    }
    free(buf);
    refit_manifest_destroy(m);
}

static void test_decode_bit_flips(void **state)
{
    (void)state;
    refit_manifest_t *m = small_model();
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    uint8_t *buf;
    size_t len;
    encode(m, &buf, &len);
    for (size_t pos = 0; pos < len; pos++)
        for (int bit = 0; bit < 8; bit++) {
            buf[pos] ^= (uint8_t)(1u << bit);
            refit_manifest_t *d = NULL;
            if (pos >= 4 && pos < 8) /* version and flags: read before the checksum */
                REFIT_ASSERT_ERR(refit_manifest_decode(buf, len, &d), REFIT_ERR_UNSUPPORTED, "at byte");
            else REFIT_ASSERT_ERR(refit_manifest_decode(buf, len, &d), REFIT_ERR_CORRUPT, NULL);
            if (pos >= 16) assert_non_null(strstr(refit_last_error(), "checksum mismatch"));
            assert_null(d);
            buf[pos] ^= (uint8_t)(1u << bit);
        }
    refit_manifest_t *d = NULL;
    REFIT_ASSERT_OK(refit_manifest_decode(buf, len, &d)); /* restored */
    refit_manifest_destroy(d);
    free(buf);
    refit_manifest_destroy(m);
}

static void test_decode_bad_arguments(void **state)
{
    (void)state;
    refit_manifest_t *d = NULL;
    REFIT_ASSERT_ERR(refit_manifest_decode(NULL, 10, &d), REFIT_ERR_INVALID_ARG, "NULL");
    REFIT_ASSERT_ERR(refit_manifest_decode("RFTM", 4, NULL), REFIT_ERR_INVALID_ARG, "NULL");
    REFIT_ASSERT_ERR(refit_manifest_decode(NULL, 0, &d), REFIT_ERR_CORRUPT, "truncated at byte 0 reading magic");
    REFIT_ASSERT_ERR(refit_manifest_encode(NULL, NULL, NULL), REFIT_ERR_INVALID_ARG, "NULL");
    assert_null(d);
}

/* ---- hostile encodings -------------------------------------------------- */

/* A hand-written encoding of a tiny manifest; offsets of the fields that the
 * tests patch are recorded as it is written.  It must equal what
 * refit_manifest_encode produces for the same manifest. */
typedef struct {
    uint8_t b[512];
    size_t n;
    size_t version, flags, model, rank, region_count, region_size, canon_count, c0_dtype, c0_ndim, c0_shape0, c1_name,
        local_count, l0_region, l0_offset, place_count, p0_canon, p0_local, p0_ext0, p1_loff0, attr_count, a0_vlen,
        trailer;
} hand_t;

static void h_le(hand_t *h, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) h->b[h->n++] = (uint8_t)(v >> (8 * i));
}
static void h_str(hand_t *h, const char *s)
{
    h_le(h, strlen(s), 2);
    memcpy(h->b + h->n, s, strlen(s));
    h->n += strlen(s);
}
static void h_byte(hand_t *h, uint8_t v) { h->b[h->n++] = v; } /* also a one-byte varint */

/* model "m", layout "l", rank 0 of 2, region [256], canonical W [8,4] and
 * V [4,4] bf16, local L [12,4] bf16 at 0: W -> rows 0..8, V -> rows 8..12;
 * attribute k = "v1". */
static void hand_encoding(hand_t *h)
{
    memset(h, 0, sizeof(*h));
    memcpy(h->b, "RFTM", 4);
    h->n = 4;
    h->version = h->n, h_le(h, 1, 2);
    h->flags = h->n, h_le(h, 0, 2);
    h_le(h, 0, 8); /* length: by reseal */
    h->model = h->n, h_str(h, "m");
    h_str(h, "l");
    h->rank = h->n, h_le(h, 0, 4);
    h_le(h, 2, 4);
    h->region_count = h->n, h_byte(h, 1);
    h->region_size = h->n, h_le(h, 256, 8);
    h->canon_count = h->n, h_byte(h, 2);
    h_str(h, "W");
    h->c0_dtype = h->n, h_byte(h, REFIT_DTYPE_BF16);
    h->c0_ndim = h->n, h_byte(h, 2);
    h->c0_shape0 = h->n, h_byte(h, 8);
    h_byte(h, 4);
    h->c1_name = h->n, h_str(h, "V");
    h_byte(h, REFIT_DTYPE_BF16), h_byte(h, 2), h_byte(h, 4), h_byte(h, 4);
    h->local_count = h->n, h_byte(h, 1);
    h_str(h, "L");
    h_byte(h, REFIT_DTYPE_BF16), h_byte(h, 2), h_byte(h, 12), h_byte(h, 4);
    h->l0_region = h->n, h_byte(h, 0);
    h->l0_offset = h->n, h_byte(h, 0);
    h->place_count = h->n, h_byte(h, 2);
    h->p0_canon = h->n, h_byte(h, 0);
    h->p0_local = h->n, h_byte(h, 0);
    h_byte(h, 2);
    h_byte(h, 0);
    h->p0_ext0 = h->n, h_byte(h, 8);
    h_byte(h, 0), h_byte(h, 4);               /* dim 1: offset 0, extent 4 */
    h_byte(h, 0), h_byte(h, 0);               /* local offset */
    h_byte(h, 1), h_byte(h, 0), h_byte(h, 2); /* V -> L, 2 dims */
    h_byte(h, 0), h_byte(h, 4), h_byte(h, 0), h_byte(h, 4);
    h->p1_loff0 = h->n, h_byte(h, 8);
    h_byte(h, 0);
    h->attr_count = h->n, h_byte(h, 1);
    h_str(h, "k");
    h->a0_vlen = h->n, h_le(h, 2, 4);
    memcpy(h->b + h->n, "v1", 2);
    h->n += 2;
    h->trailer = h->n;
    h->n += REFIT_MANIFEST_TRAILER_SIZE;
    refit_manifest_reseal(h->b, h->n);
}

/* Replaces `oldlen` bytes at `at` by `rep` (may change the length), then fixes
 * the length field and checksum so that only the parser can object. */
static void patch(hand_t *h, size_t at, size_t oldlen, const void *rep, size_t replen)
{
    assert_true(h->n - oldlen + replen <= sizeof(h->b));
    memmove(h->b + at + replen, h->b + at + oldlen, h->n - at - oldlen);
    memcpy(h->b + at, rep, replen);
    h->n = h->n - oldlen + replen;
    refit_manifest_reseal(h->b, h->n);
}

static void patch_byte(hand_t *h, size_t at, uint8_t v) { patch(h, at, 1, &v, 1); }

static void patch_varint(hand_t *h, size_t at, uint64_t v)
{
    uint8_t tmp[10];
    size_t n = 0;
    do {
        tmp[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) tmp[n] |= 0x80;
        n++;
    } while (v);
    patch(h, at, 1, tmp, n);
}

static refit_status_t decode_hand(const hand_t *h)
{
    refit_manifest_t *d = NULL;
    uint8_t *copy = malloc(h->n); /* exact size, so ASan sees any over-read */
    memcpy(copy, h->b, h->n);
    refit_status_t st = refit_manifest_decode(copy, h->n, &d);
    free(copy);
    if (st == REFIT_OK) {
        assert_non_null(d);
        refit_manifest_destroy(d);
    } else {
        assert_null(d);
    }
    return st;
}

static void test_hand_encoding_matches_encoder(void **state)
{
    (void)state;
    hand_t h;
    hand_encoding(&h);
    refit_manifest_t *m = new_manifest("m", "l", 0, 2);
    region(m, 256);
    canon(m, "W", BF16, 2, DIMS(8, 4));
    canon(m, "V", BF16, 2, DIMS(4, 4));
    local(m, "L", BF16, 2, DIMS(12, 4), 0, 0);
    place(m, 0, 0, 2, DIMS(0, 0), DIMS(8, 4), DIMS(0, 0));
    place(m, 1, 0, 2, DIMS(0, 0), DIMS(4, 4), DIMS(8, 0));
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    REFIT_ASSERT_OK(refit_manifest_set_attr(m, "k", "v1", 2));
    uint8_t *buf;
    size_t len;
    encode(m, &buf, &len);
    assert_int_equal(len, h.n);
    assert_memory_equal(buf, h.b, len);
    REFIT_ASSERT_OK(decode_hand(&h));
    free(buf);
    refit_manifest_destroy(m);
}

#define HOSTILE(mutation, code, needle)                  \
    do {                                                 \
        hand_t h;                                        \
        hand_encoding(&h);                               \
        mutation;                                        \
        REFIT_ASSERT_ERR(decode_hand(&h), code, needle); \
    } while (0)

static void test_decode_hostile_header(void **state)
{
    (void)state;
    HOSTILE(patch(&h, 0, 4, "RFTX", 4), REFIT_ERR_CORRUPT, "bad magic at byte 0");
    HOSTILE(patch_byte(&h, h.version, 2), REFIT_ERR_UNSUPPORTED, "format version 2 at byte 4");
    HOSTILE(patch_byte(&h, h.flags, 1), REFIT_ERR_UNSUPPORTED, "unknown flags 0x1 at byte 6");
    HOSTILE((h.b[8] ^= 1), REFIT_ERR_CORRUPT, "length field at byte 8"); /* not resealed */
    HOSTILE((h.b[h.trailer] ^= 1), REFIT_ERR_CORRUPT, "checksum mismatch");
    HOSTILE((h.n = 20, memcpy(h.b + 8, "\x14\0\0\0\0\0\0\0", 8)), REFIT_ERR_CORRUPT,
            "truncated at byte 20 reading checksum");
    HOSTILE(patch(&h, h.trailer, 0, "\0", 1), REFIT_ERR_CORRUPT, "1 unparsed bytes at byte");
}

static void test_decode_hostile_counts(void **state)
{
    (void)state;
    HOSTILE(patch_varint(&h, h.region_count, UINT64_C(1) << 40), REFIT_ERR_CORRUPT, "region count at byte 30");
    HOSTILE(patch_varint(&h, h.region_count, UINT64_MAX), REFIT_ERR_CORRUPT, "beyond the limit");
    HOSTILE(patch_varint(&h, h.place_count, REFIT_MANIFEST_MAX_ENTRIES), REFIT_ERR_CORRUPT, "placement count at byte");
    HOSTILE(patch_varint(&h, h.canon_count, 1000), REFIT_ERR_CORRUPT, "more than the");
    HOSTILE(patch_varint(&h, h.attr_count, REFIT_MANIFEST_MAX_ENTRIES + 1), REFIT_ERR_CORRUPT, "beyond the limit");
    HOSTILE(patch_byte(&h, h.place_count, 3), REFIT_ERR_CORRUPT, "placement 2");
    HOSTILE(patch_byte(&h, h.canon_count, 3), REFIT_ERR_CORRUPT, "byte");
    HOSTILE(patch_byte(&h, h.attr_count, 0), REFIT_ERR_CORRUPT, "unparsed bytes");
    HOSTILE(patch(&h, h.a0_vlen, 4, "\xff\xff\xff\xff", 4), REFIT_ERR_CORRUPT, "truncated at byte");
}

static void test_decode_hostile_fields(void **state)
{
    (void)state;
    /* strings */
    HOSTILE(patch(&h, h.model, 2, "\0\0", 2), REFIT_ERR_CORRUPT, "model at byte 16 has length 0");
    HOSTILE(patch(&h, h.model, 2, "\x00\x01", 2), REFIT_ERR_CORRUPT, "has length 256");
    HOSTILE(patch(&h, h.model, 3, "\x02\x00m\0", 4), REFIT_ERR_CORRUPT, "contains a NUL byte at byte 19");
    HOSTILE(patch(&h, h.c1_name, 3, "\x01\x00W", 3), REFIT_ERR_CORRUPT, "repeats the name W");
    /* dtypes, ndims */
    HOSTILE(patch_byte(&h, h.c0_dtype, 0), REFIT_ERR_CORRUPT, "canonical tensor 0 dtype (W)");
    HOSTILE(patch_byte(&h, h.c0_dtype, REFIT_DTYPE_COUNT_), REFIT_ERR_CORRUPT, "not a known dtype");
    HOSTILE(patch_byte(&h, h.c0_ndim, 0), REFIT_ERR_CORRUPT, "canonical tensor 0 ndim (W)");
    HOSTILE(patch_byte(&h, h.c0_ndim, REFIT_MAX_DIMS + 1), REFIT_ERR_CORRUPT, "must be 1..4");
    /* varints */
    HOSTILE(patch(&h, h.c0_shape0, 1, "\x88\x00", 2), REFIT_ERR_CORRUPT, "non-minimal varint");
    HOSTILE(patch(&h, h.c0_shape0, 1, "\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f", 10), REFIT_ERR_CORRUPT,
            "exceeds 64 bits");
    HOSTILE(patch_varint(&h, h.l0_region, UINT64_C(1) << 33), REFIT_ERR_CORRUPT, "beyond 32 bits");
    /* ids */
    HOSTILE(patch_byte(&h, h.p0_canon, 2), REFIT_ERR_CORRUPT, "placement 0 canonical id");
    HOSTILE(patch_varint(&h, h.p0_local, 1), REFIT_ERR_CORRUPT, "placement 0 local id");
    HOSTILE(patch_varint(&h, h.p0_local, UINT32_MAX), REFIT_ERR_CORRUPT, "beyond the 1 local tensors");
    HOSTILE(patch_byte(&h, h.a0_vlen - 1, 'l'), REFIT_OK, NULL); /* a different key is fine */
}

static void test_decode_hostile_semantics(void **state)
{
    (void)state;
    /* Well-formed encodings of invalid manifests get finalize's codes. */
    HOSTILE(patch_byte(&h, h.p0_ext0, 9), REFIT_ERR_OUT_OF_BOUNDS, "box of W ends at 9 in dim 0, beyond its size 8");
    HOSTILE(patch_varint(&h, h.p0_ext0, UINT64_MAX), REFIT_ERR_OUT_OF_BOUNDS, "beyond its size");
    HOSTILE(patch_byte(&h, h.p1_loff0, 4), REFIT_ERR_OVERLAP, "placements of W and V overlap in local tensor L");
    HOSTILE(patch_byte(&h, h.p1_loff0, 9), REFIT_ERR_OUT_OF_BOUNDS, "local box ends at 13");
    HOSTILE(patch(&h, h.rank, 4, "\x02\0\0\0", 4), REFIT_ERR_INVALID_ARG, "rank 2 is not below world size 2");
    HOSTILE(patch_byte(&h, h.c0_dtype, REFIT_DTYPE_F32), REFIT_ERR_MISMATCH, "is bf16 but canonical W is f32");
    HOSTILE(patch(&h, h.region_size, 8, "\x20\0\0\0\0\0\0\0", 8), REFIT_ERR_OUT_OF_BOUNDS, "outside region 0");
    HOSTILE(patch(&h, h.region_size, 8, "\0\0\0\0\0\0\0\0", 8), REFIT_ERR_INVALID_ARG, "region 0 at byte");
    HOSTILE(patch_byte(&h, h.l0_region, 1), REFIT_ERR_INVALID_ARG, "is in region 1 of 1");
    HOSTILE(patch_varint(&h, h.l0_offset, 250), REFIT_ERR_OUT_OF_BOUNDS, "lies outside region 0");
    HOSTILE(patch_byte(&h, h.c0_shape0, 0), REFIT_ERR_INVALID_ARG, "zero dimension");
    HOSTILE(patch_byte(&h, h.p0_ext0, 0), REFIT_ERR_INVALID_ARG, "zero extent");
}

static void test_decode_duplicate_local_and_attr(void **state)
{
    (void)state;
    refit_manifest_t *m = new_manifest("m", "l", 0, 1);
    region(m, 256);
    local(m, "L", BF16, 1, DIMS(4), 0, 0);
    local(m, "M", BF16, 1, DIMS(4), 0, 8);
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    REFIT_ASSERT_OK(refit_manifest_set_attr(m, "a", "x", 1));
    REFIT_ASSERT_OK(refit_manifest_set_attr(m, "b", "y", 1));
    uint8_t *buf;
    size_t len;
    encode(m, &buf, &len);
    uint8_t *hit = memmem(buf, len, "\x01\x00M", 3);
    assert_non_null(hit);
    hit[2] = 'L';
    refit_manifest_reseal(buf, len);
    refit_manifest_t *d = NULL;
    REFIT_ASSERT_ERR(refit_manifest_decode(buf, len, &d), REFIT_ERR_CORRUPT, "local tensor 1 at byte");
    assert_non_null(strstr(refit_last_error(), "repeats the name L"));
    hit[2] = 'M';
    hit = memmem(buf, len,
                 "\x01\x00"
                 "b",
                 3);
    assert_non_null(hit);
    hit[2] = 'a';
    refit_manifest_reseal(buf, len);
    REFIT_ASSERT_ERR(refit_manifest_decode(buf, len, &d), REFIT_ERR_CORRUPT, "attribute 1 at byte");
    assert_non_null(strstr(refit_last_error(), "repeats the key a"));
    assert_null(d);
    free(buf);
    refit_manifest_destroy(m);
}

/* The world sizes receivers' tables (one entry per source rank), and unlike
 * the counts it is not tied to the encoding's length: a forged manifest of a
 * few bytes with world 131,072 decoded (docs/security.md).  It is bounded like a
 * layout's world, by decode and by create. */
static void test_world_limit(void **state)
{
    (void)state;
    hand_t ref;
    hand_encoding(&ref);
    const size_t world_at = ref.rank + 4;
    char needle[96];
    snprintf(needle, sizeof(needle), "world at byte %zu is 131072, beyond the limit of 16384", world_at);
    HOSTILE(patch(&h, world_at, 4, "\x00\x00\x02\x00", 4), REFIT_ERR_CORRUPT, needle);
    HOSTILE(patch(&h, world_at, 4, "\x01\x40\x00\x00", 4), REFIT_ERR_CORRUPT, "is 16385, beyond the limit of 16384");
    HOSTILE(patch(&h, world_at, 4, "\xff\xff\xff\xff", 4), REFIT_ERR_CORRUPT, "is 4294967295, beyond the limit");
    HOSTILE(patch(&h, world_at, 4, "\x00\x40\x00\x00", 4), REFIT_OK, NULL); /* 16384: the limit itself */
    HOSTILE((patch(&h, world_at, 4, "\x00\x40\x00\x00", 4), patch(&h, h.rank, 4, "\xff\x3f\x00\x00", 4)), REFIT_OK,
            NULL); /* its last rank */
    refit_manifest_t *m = NULL;
    REFIT_ASSERT_ERR(refit_manifest_create(&(refit_manifest_identity_t){"m", "l", 0, 16385}, &m), REFIT_ERR_INVALID_ARG,
                     "world size 16385 is above refit's limit of 16384");
    REFIT_ASSERT_ERR(refit_manifest_create(&(refit_manifest_identity_t){"m", "l", 131071, 131072}, &m),
                     REFIT_ERR_INVALID_ARG, "world size 131072 is above refit's limit of 16384");
    assert_null(m);
    REFIT_ASSERT_OK(refit_manifest_create(&(refit_manifest_identity_t){"m", "l", 16383, 16384}, &m));
    refit_manifest_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builder_happy_path),
        cmocka_unit_test(test_builder_canonical_dedup_and_duplicates),
        cmocka_unit_test(test_create_rejects_bad_identity),
        cmocka_unit_test(test_validate_box_beyond_canonical),
        cmocka_unit_test(test_validate_box_beyond_local),
        cmocka_unit_test(test_validate_local_outside_region),
        cmocka_unit_test(test_validate_locals_overlap),
        cmocka_unit_test(test_validate_placements_overlap),
        cmocka_unit_test(test_validate_touching_placements_accepted),
        cmocka_unit_test(test_validate_dtype_and_rank_mismatch),
        cmocka_unit_test(test_validate_bad_ids_ndim_extent),
        cmocka_unit_test(test_codec_round_trip),
        cmocka_unit_test(test_codec_round_trip_many_placements),
        cmocka_unit_test(test_signature_sensitivity),
        cmocka_unit_test(test_decode_every_truncation),
        cmocka_unit_test(test_decode_bit_flips),
        cmocka_unit_test(test_decode_bad_arguments),
        cmocka_unit_test(test_hand_encoding_matches_encoder),
        cmocka_unit_test(test_decode_hostile_header),
        cmocka_unit_test(test_decode_hostile_counts),
        cmocka_unit_test(test_decode_hostile_fields),
        cmocka_unit_test(test_decode_hostile_semantics),
        cmocka_unit_test(test_decode_duplicate_local_and_attr),
        cmocka_unit_test(test_world_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
