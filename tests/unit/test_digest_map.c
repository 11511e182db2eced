/* The digest map (data/digest.h): copies that hash what they move give, per
 * destination placement, exactly refit_digest_local's sums over the memory
 * written, with every kernel, for any cut of the copies (odd bytes, pieces
 * across rows and placements, in any order, in threads), fused with the copy
 * or hashed in place after a caller's copy; the plan executor's fused path on
 * real layout pairs. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/digest.h"
#include "layout/manifest.h"
#include "plan/plan.h"
#include "testutil.h"
#include "tool_local.h"
#include "util/util.h"

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static refit_digest_key_t *key_impl(refit_digest_impl_t impl)
{
    uint8_t raw[32];
    for (int i = 0; i < 32; i++) raw[i] = (uint8_t)(i * 37 + 5);
    refit_digest_key_t *k = NULL;
    if (refit_digest_key_create_impl(raw, impl, &k) != REFIT_OK) return NULL; /* a kernel this CPU lacks */
    return k;
}

static void add_tensor(refit_manifest_t *m, const char *name, refit_dtype_t dt, uint32_t ndim, const uint64_t *shape,
                       uint32_t *cid)
{
    refit_tensor_info_t t = {name, dt, ndim, {0}};
    for (uint32_t d = 0; d < ndim; d++) t.shape[d] = shape[d];
    REFIT_ASSERT_OK(refit_manifest_add_canonical(m, &t, cid));
}

static void add_local(refit_manifest_t *m, const char *name, refit_dtype_t dt, uint32_t ndim, const uint64_t *shape,
                      uint64_t off, uint32_t *lid)
{
    refit_tensor_info_t t = {name, dt, ndim, {0}};
    for (uint32_t d = 0; d < ndim; d++) t.shape[d] = shape[d];
    REFIT_ASSERT_OK(refit_manifest_add_local(m, &t, 0, off, lid));
}

static void place(refit_manifest_t *m, uint32_t cid, uint32_t lid, uint32_t ndim, const uint64_t *coff,
                  const uint64_t *ext, const uint64_t *loff)
{
    refit_placement_t p = {.canon = cid, .local = lid, .ndim = ndim};
    for (uint32_t d = 0; d < ndim; d++) {
        p.canon_offset[d] = coff[d];
        p.extent[d] = ext[d];
        p.local_offset[d] = loff[d];
    }
    REFIT_ASSERT_OK(refit_manifest_add_placement(m, &p));
}

/* One region holding: two bf16 tensors side by side in the columns of one
 * local tensor (rows with gaps: a segment per row), a contiguous bf16 box,
 * a 1-D f32 tensor, an fp8 box whose rows are an odd number of bytes (no
 * digest: copied as a gap), a 3-D tensor (no digest), a box cut in both
 * dimensions (no digest), and padding between the local tensors. */
static refit_manifest_t *mixed_manifest(void)
{
    refit_manifest_identity_t id = {"mapped", "hand", 0, 1};
    refit_manifest_t *m = NULL;
    REFIT_ASSERT_OK(refit_manifest_create(&id, &m));
    uint32_t region, c[7], l[6];
    REFIT_ASSERT_OK(refit_manifest_add_region(m, 1 << 16, &region));
    uint64_t sa[2] = {9, 40}, sb[2] = {9, 23}, sc[2] = {64, 100}, sd[1] = {777}, se[2] = {5, 13}, sf[3] = {3, 4, 6},
             sg[2] = {20, 30};
    add_tensor(m, "a", REFIT_DTYPE_BF16, 2, sa, &c[0]);
    add_tensor(m, "b", REFIT_DTYPE_BF16, 2, sb, &c[1]);
    add_tensor(m, "c", REFIT_DTYPE_BF16, 2, sc, &c[2]);
    add_tensor(m, "d", REFIT_DTYPE_F32, 1, sd, &c[3]);
    add_tensor(m, "e", REFIT_DTYPE_F8_E4M3, 2, se, &c[4]);
    add_tensor(m, "f", REFIT_DTYPE_BF16, 3, sf, &c[5]);
    add_tensor(m, "g", REFIT_DTYPE_BF16, 2, sg, &c[6]);
    uint64_t lab[2] = {9, 63}, lc[2] = {30, 100}, ld[1] = {777}, le[2] = {5, 13}, lf[3] = {3, 4, 6}, lg[2] = {10, 15};
    add_local(m, "ab", REFIT_DTYPE_BF16, 2, lab, 2, &l[0]); /* odd-aligned? no: 2 bytes in, an even start */
    add_local(m, "c", REFIT_DTYPE_BF16, 2, lc, 2048, &l[1]);
    add_local(m, "d", REFIT_DTYPE_F32, 1, ld, 8192 + 6, &l[2]);
    add_local(m, "e", REFIT_DTYPE_F8_E4M3, 2, le, 12000 + 1, &l[3]);
    add_local(m, "f", REFIT_DTYPE_BF16, 3, lf, 12200, &l[4]);
    add_local(m, "g", REFIT_DTYPE_BF16, 2, lg, 12800, &l[5]);
    uint64_t z[3] = {0, 0, 0}, c17[2] = {0, 40}, r7[2] = {7, 0}, g0[2] = {4, 6};
    place(m, c[0], l[0], 2, z, sa, z);
    place(m, c[1], l[0], 2, z, sb, c17); /* b's columns follow a's in each row of "ab" */
    uint64_t ec[2] = {30, 100};
    place(m, c[2], l[1], 2, r7, ec, z); /* rows 7..36 of c: whole rows */
    place(m, c[3], l[2], 1, z, sd, z);
    place(m, c[4], l[3], 2, z, se, z);
    place(m, c[5], l[4], 3, z, sf, z);
    place(m, c[6], l[5], 2, g0, lg, z); /* cut in both dimensions */
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    return m;
}

static void fill_random(uint8_t *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
}

/* Copies src into dst through the map in pieces cut at random (odd) places,
 * in a shuffled order; fused (in_place false) or hashed after a memcpy. */
static uint64_t copy_in_pieces(const refit_digest_map_t *map, uint8_t *dst, const uint8_t *src, uint64_t size,
                               bool in_place, refit_dsum_t *acc)
{
    uint64_t cuts[64], n = 0, pos = 0;
    while (pos < size && n < 63) {
        cuts[n++] = pos;
        pos += 1 + rnd() % (size / 16);
    }
    cuts[n] = size;
    uint64_t order[64];
    for (uint64_t i = 0; i < n; i++) order[i] = i;
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = rnd() % i, t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    uint64_t hashed = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t a = cuts[order[i]], len = cuts[order[i] + 1] - a;
        if (in_place) memcpy(dst + a, src + a, len);
        hashed += refit_digest_map_copy(map, 0, a, dst + a, in_place ? NULL : src + a, len, acc);
    }
    return hashed;
}

static void mixed_cuts(void **state)
{
    (void)state;
    refit_manifest_t *m = mixed_manifest();
    uint64_t size = refit_manifest_region_size(m, 0);
    uint32_t np = refit_manifest_num_placements(m);
    uint8_t *src = malloc(size), *dst = malloc(size);
    refit_dsum_t *want = calloc(np, sizeof(*want)), *got = calloc(np, sizeof(*got)), *first = calloc(np, sizeof(*got));
    assert_non_null(src);
    assert_non_null(dst);
    fill_random(src, size);
    refit_digest_impl_t impls[] = {REFIT_DIGEST_IMPL_SCALAR, REFIT_DIGEST_IMPL_AVX2, REFIT_DIGEST_IMPL_AVX512};
    unsigned kernels = 0;
    for (size_t ki = 0; ki < REFIT_ARRAY_LEN(impls); ki++) {
        refit_digest_key_t *k = key_impl(impls[ki]);
        if (!k) continue;
        kernels++;
        refit_digest_map_t *map = NULL;
        REFIT_ASSERT_OK(refit_digest_map_create(k, m, &map));
        /* a, b (9 rows each), c (30 rows), d: what refit_digest_local digests. */
        uint64_t mapped = 9 * 40 * 2 + 9 * 23 * 2 + 30 * 200 + 777 * 4;
        assert_int_equal(refit_digest_map_bytes(map), mapped);
        REFIT_ASSERT_OK(refit_digest_local(k, m, (const void *const *)&src, want, 1));
        for (int round = 0; round < 40; round++) {
            bool in_place = round % 2;
            memset(dst, 0xee, size);
            memset(got, 0, np * sizeof(*got));
            assert_int_equal(copy_in_pieces(map, dst, src, size, in_place, got), mapped);
            assert_memory_equal(dst, src, size);
            for (uint32_t i = 0; i < np; i++)
                if (got[i].lane[0] != want[i].lane[0] || got[i].lane[1] != want[i].lane[1])
                    fail_msg("%s round %d placement %u: %08x%08x, refit_digest_local %08x%08x",
                             refit_digest_impl_name(impls[ki]), round, i, got[i].lane[0], got[i].lane[1],
                             want[i].lane[0], want[i].lane[1]);
        }
        if (kernels == 1) memcpy(first, want, np * sizeof(*want));
        assert_memory_equal(first, want, np * sizeof(*want)); /* the kernels agree */
        /* A byte changed after its copy is not what the fused sums saw: the map
         * hashes what it moved, the local pass what is there. */
        memset(got, 0, np * sizeof(*got));
        refit_digest_map_copy(map, 0, 0, dst, src, size, got);
        assert_memory_equal(got, want, np * sizeof(*want));
        dst[2048 + 200 * 3 + 5] ^= 1;
        refit_dsum_t *after = calloc(np, sizeof(*after));
        REFIT_ASSERT_OK(refit_digest_local(k, m, (const void *const *)&dst, after, 1));
        assert_memory_not_equal(after, got, np * sizeof(*got));
        free(after);
        /* Out of range: copied, nothing hashed. */
        assert_int_equal(refit_digest_map_copy(map, 7, 0, dst, src, 64, got), 0);
        assert_memory_equal(dst, src, 64);
        refit_digest_map_destroy(map);
        refit_digest_key_destroy(k);
    }
    assert_true(kernels >= 1);
    print_message("map cuts: %u kernels agree with refit_digest_local\n", kernels);
    free(src);
    free(dst);
    free(want);
    free(got);
    free(first);
    refit_manifest_destroy(m);
}

/* The sums kept through updates (acc) equal refit_digest_local of the memory, placement by placement (want:
 * scratch of as many entries). */
static void expect_sums(const refit_digest_key_t *k, const refit_manifest_t *m, uint8_t *mem, const refit_dsum_t *acc,
                        refit_dsum_t *want, const char *what)
{
    REFIT_ASSERT_OK(refit_digest_local(k, m, (const void *const *)&mem, want, 1));
    for (uint32_t i = 0; i < refit_manifest_num_placements(m); i++)
        if (memcmp(&acc[i], &want[i], sizeof(acc[i])))
            fail_msg("%s: placement %u: %08x%08x, refit_digest_local %08x%08x", what, i, acc[i].lane[0], acc[i].lane[1],
                     want[i].lane[0], want[i].lane[1]);
}

/* Updates (a delta's apply): single units, odd-placed pairs and ranges overwritten through the map keep the
 * sums equal to refit_digest_local of the memory as it is now, with every kernel. */
static void updates(void **state)
{
    (void)state;
    refit_manifest_t *m = mixed_manifest();
    uint64_t size = refit_manifest_region_size(m, 0);
    uint32_t np = refit_manifest_num_placements(m);
    uint8_t *mem = malloc(size), *want_mem = malloc(size), *news = malloc(size);
    refit_dsum_t *acc = calloc(np, sizeof(*acc)), *want = calloc(np, sizeof(*want));
    refit_digest_impl_t impls[] = {REFIT_DIGEST_IMPL_SCALAR, REFIT_DIGEST_IMPL_AVX2, REFIT_DIGEST_IMPL_AVX512};
    for (size_t ki = 0; ki < REFIT_ARRAY_LEN(impls); ki++) {
        refit_digest_key_t *k = key_impl(impls[ki]);
        if (!k) continue;
        refit_digest_map_t *map = NULL;
        REFIT_ASSERT_OK(refit_digest_map_create(k, m, &map));
        fill_random(mem, size);
        REFIT_ASSERT_OK(refit_digest_local(k, m, (const void *const *)&mem, acc, 1));
        memcpy(want_mem, mem, size);
        refit_digest_cursor_t cur = {0};
        unsigned units = 0;
        uint64_t last = 0;
        for (int i = 0; i < 8000; i++) {
            uint64_t kind = rnd() % 8, off, len;
            if (kind < 2) { /* one aligned unit anywhere */
                off = (rnd() % (size / 2)) * 2;
                len = 2;
                units++;
            } else if (kind < 5) { /* a sparse delta's next change: ascending, a few units on (the same row, the
                                      next rows, the next key block or segment: the cursor's kept row and block) */
                off = last + 2 * (1 + rnd() % 48);
                if (off + 2 > size) off = (rnd() % 64) * 2;
                len = 2;
                units++;
            } else if (kind < 7) { /* an odd-placed pair, a single byte */
                off = rnd() % (size - 2) | 1;
                len = 1 + rnd() % 2;
            } else { /* a range across rows and segments */
                off = rnd() % size;
                len = 1 + rnd() % REFIT_MIN(size - off, 3000);
            }
            fill_random(news, len);
            memcpy(want_mem + off, news, len);
            refit_digest_map_update(map, &cur, 0, off, mem + off, news, len, acc);
            last = off & ~(uint64_t)1;
            if (i == 2000) refit_digest_cursor_flush(&cur); /* a flush part-way changes nothing */
        }
        refit_digest_cursor_flush(&cur);
        assert_memory_equal(mem, want_mem, size);
        char what[64];
        snprintf(what, sizeof what, "%s, after %u unit updates", refit_digest_impl_name(impls[ki]), units);
        expect_sums(k, m, mem, acc, want, what);
        refit_digest_map_destroy(map);
        refit_digest_key_destroy(k);
    }
    free(mem);
    free(want_mem);
    free(news);
    free(acc);
    free(want);
    refit_manifest_destroy(m);
}

/* A wide tensor whose rows cross a column-key block (its columns from 1000 on) and rows of 49 units (a row from
 * (double) u * (1 / 49) is one less at some exact multiples). */
static refit_manifest_t *wide_manifest(void)
{
    refit_manifest_identity_t id = {"mapped", "wide", 0, 1};
    refit_manifest_t *m = NULL;
    REFIT_ASSERT_OK(refit_manifest_create(&id, &m));
    uint32_t region, c[2], l[2];
    REFIT_ASSERT_OK(refit_manifest_add_region(m, 2 * (2 * 69000 + 97 * 49) + 64, &region));
    uint64_t sw[2] = {2, 70000}, lw[2] = {2, 69000}, sn[2] = {97, 49}, z[2] = {0, 0}, cw[2] = {0, 1000};
    add_tensor(m, "w", REFIT_DTYPE_BF16, 2, sw, &c[0]);
    add_tensor(m, "n", REFIT_DTYPE_BF16, 2, sn, &c[1]);
    add_local(m, "w", REFIT_DTYPE_BF16, 2, lw, 0, &l[0]);
    add_local(m, "n", REFIT_DTYPE_BF16, 2, sn, 2 * 2 * 69000 + 64, &l[1]);
    place(m, c[0], l[0], 2, cw, lw, z);
    place(m, c[1], l[1], 2, z, sn, z);
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    return m;
}

/* refit_digest_map_update_units (a sparse delta's apply in batches): runs of ascending units, a few at odd
 * offsets or outside every placement, written through the map, keep the sums equal to refit_digest_local of the
 * memory as it is now, with every kernel (the AVX-512 one 16 units at a time), in the mixed manifest's segments
 * and in rows that cross a key block or have 49 units. */
static void update_units(void **state)
{
    (void)state;
    refit_manifest_t *ms[2] = {mixed_manifest(), wide_manifest()};
    refit_digest_impl_t impls[] = {REFIT_DIGEST_IMPL_SCALAR, REFIT_DIGEST_IMPL_AVX2, REFIT_DIGEST_IMPL_AVX512};
    enum { B = 300 };
    uint64_t offs[B];
    uint16_t vals[B];
    for (int mi = 0; mi < 2; mi++) {
        refit_manifest_t *m = ms[mi];
        uint64_t size = refit_manifest_region_size(m, 0);
        uint32_t np = refit_manifest_num_placements(m);
        uint8_t *mem = malloc(size), *want_mem = malloc(size);
        refit_dsum_t *acc = calloc(np, sizeof(*acc)), *want = calloc(np, sizeof(*want));
        for (size_t ki = 0; ki < REFIT_ARRAY_LEN(impls); ki++) {
            refit_digest_key_t *k = key_impl(impls[ki]);
            if (!k) continue;
            refit_digest_map_t *map = NULL;
            REFIT_ASSERT_OK(refit_digest_map_create(k, m, &map));
            fill_random(mem, size);
            REFIT_ASSERT_OK(refit_digest_local(k, m, (const void *const *)&mem, acc, 1));
            memcpy(want_mem, mem, size);
            refit_digest_cursor_t cur = {0};
            for (int i = 0; i < 400; i++) {
                uint32_t n = 1 + (uint32_t)(rnd() % B);
                uint64_t off = (rnd() % (size / 2)) * 2;
                uint32_t got = 0;
                for (; got < n && off + 2 <= size; got++) {
                    offs[got] = rnd() % 20 || !off ? off : off - 1; /* one in 20 at an odd offset */
                    vals[got] = (uint16_t)rnd();
                    memcpy(want_mem + offs[got], &vals[got], 2);
                    off += 2 * (1 + rnd() % (rnd() % 2 ? 3 : 60));
                }
                refit_digest_map_update_units(map, &cur, 0, mem, offs, vals, got, acc);
                if (i == 100) refit_digest_cursor_flush(&cur); /* a flush part-way changes nothing */
            }
            refit_digest_cursor_flush(&cur);
            assert_memory_equal(mem, want_mem, size);
            char what[64];
            snprintf(what, sizeof what, "%s, manifest %d", refit_digest_impl_name(impls[ki]), mi);
            expect_sums(k, m, mem, acc, want, what);
            refit_digest_map_destroy(map);
            refit_digest_key_destroy(k);
        }
        free(mem);
        free(want_mem);
        free(acc);
        free(want);
        refit_manifest_destroy(m);
    }
}

typedef struct {
    const void *const *const *bases;
} pvm_t;

/* A caller's copy function (what shm's process_vm_readv path is): the executor hashes in place after it. */
static refit_status_t plain_copy(void *user, uint32_t src, uint32_t region, uint64_t off, void *dst, uint64_t len)
{
    const pvm_t *c = user;
    memcpy(dst, (const uint8_t *)c->bases[src][region] + off, len);
    return REFIT_OK;
}

/* Many small regions (8-byte runs, short strided ones, a source the
 * options leave out between them) and a few long ones, as a digest
 * fetch's view: the executor batches the small ones into tasks, and every
 * byte lands where a region-by-region reference puts it, with threads and
 * with a caller's copy; the left-out source's bytes are not written. */
static void small_regions(void **state)
{
    (void)state;
    enum { N = 20000, SRC = 1 << 22, DST = 1 << 22 };
    uint8_t *src[2] = {malloc(SRC), malloc(SRC)};
    uint8_t *dst = malloc(DST), *want = malloc(DST);
    assert_non_null(src[0]);
    assert_non_null(src[1]);
    assert_non_null(dst);
    assert_non_null(want);
    for (size_t i = 0; i < SRC; i++) src[0][i] = (uint8_t)(i * 7 + 1), src[1][i] = (uint8_t)(i * 13 + 5);
    refit_plan_region_t *regs = calloc(N + 2, sizeof(*regs));
    assert_non_null(regs);
    uint64_t sb[2] = {0, 0}, doff = 0;
    size_t n = 0;
    for (size_t i = 0; i < N; i++) {
        refit_plan_region_t *r = &regs[n++];
        r->src = i % 5 == 3 ? 1 : 0;
        r->src_offset = (i * 2056) % (SRC - 4096);
        r->dst_offset = doff;
        if (i % 7 == 2) { /* a short strided one: 3 rows of 24 bytes */
            r->nloops = 1;
            r->run = 24;
            r->count[0] = 3;
            r->src_stride[0] = 100;
            r->dst_stride[0] = 24;
            doff += 72;
        } else {
            r->run = 8;
            doff += 8;
        }
        sb[r->src] += refit_plan_region_bytes(r);
    }
    for (int k = 0; k < 2; k++) { /* two long ones, cut into tasks of their own */
        refit_plan_region_t *r = &regs[n++];
        r->src_offset = (uint64_t)k * (1 << 20);
        r->dst_offset = doff;
        r->run = 1 << 20;
        doff += r->run;
        sb[0] += r->run;
    }
    assert_true(doff <= DST);
    memset(want, 0xEE, DST);
    for (size_t i = 0; i < n; i++) {
        if (regs[i].src == 1) continue;
        for (uint64_t row = 0; row < refit_region_rows(&regs[i]); row++) {
            uint64_t so, dof;
            refit_region_row_offsets(&regs[i], row, &so, &dof);
            memcpy(want + dof, src[0] + so, regs[i].run);
        }
    }
    const void *b0[1] = {src[0]}, *b1[1] = {src[1]};
    const void *const *bases[2] = {b0, b1};
    void *dsts[1] = {dst};
    struct refit_plan view = refit_plan_view(regs, n, sb, 2);
    uint8_t only[2] = {1, 0};
    pvm_t pc = {bases};
    for (int variant = 0; variant < 3; variant++) {
        memset(dst, 0xEE, DST);
        refit_exec_opts_t o = {.threads = variant ? 2 : 1, .only = only, .skip_fills = true};
        if (variant == 2) {
            o.copy = plain_copy;
            o.user = &pc;
        }
        REFIT_ASSERT_OK(refit_plan_execute(&view, bases, dsts, &o));
        assert_memory_equal(dst, want, DST);
    }
    print_message("%zu regions (%" PRIu64 " bytes) executed equal to the reference, 3 ways\n", n, sb[0]);
    free(regs);
    free(src[0]);
    free(src[1]);
    free(dst);
    free(want);
}

/* The plan executor with a map: every placement's sum equals the local pass
 * over the result, the bytes are the truth's, and the hashed count is the
 * map's; with the map's threads, a caller's copy, and plans not coalesced. */
static void run_pair(const char *model_name, const char *src_spec, const char *dst_spec)
{
    refit_model_t *model = t_model(model_name);
    refit_layout_t *sl = t_layout(src_spec), *dl = t_layout(dst_spec);
    tool_local_set_t set;
    REFIT_ASSERT_OK(tool_local_set_create(model, sl, true, 5, &set));
    refit_digest_key_t *k = key_impl(REFIT_DIGEST_IMPL_AUTO);
    const refit_manifest_t *const *srcs = (const refit_manifest_t *const *)set.manifests;
    refit_manifest_t *dm = NULL;
    REFIT_ASSERT_OK(refit_layout_manifest(dl, model, refit_layout_world(dl) - 1, &dm));
    uint32_t np = refit_manifest_num_placements(dm);
    refit_digest_map_t *map = NULL;
    REFIT_ASSERT_OK(refit_digest_map_create(k, dm, &map));
    uint64_t size = refit_manifest_region_size(dm, 0);
    void *arena = malloc(size);
    refit_dsum_t *want = calloc(np, sizeof(*want)), *got = calloc(np, sizeof(*got));
    for (int variant = 0; variant < 4; variant++) {
        refit_plan_params_t pp = REFIT_PLAN_PARAMS_INIT;
        pp.no_coalesce = variant >= 2;
        refit_plan_t *plan = NULL;
        REFIT_ASSERT_OK(refit_plan_create(srcs, set.n, dm, &pp, &plan));
        memset(arena, 0xa5, size);
        memset(got, 0, np * sizeof(*got));
        uint64_t hashed = 0;
        pvm_t pc = {set.bases};
        refit_exec_opts_t o = {.threads = 2, .dmap = map, .dacc = got, .dbytes = &hashed};
        if (variant % 2) {
            o.copy = plain_copy;
            o.user = &pc;
        }
        REFIT_ASSERT_OK(refit_plan_execute(plan, set.bases, &arena, &o));
        REFIT_ASSERT_OK(refit_truth_verify(dm, (const void *const *)&arena, 5, NULL));
        REFIT_ASSERT_OK(refit_digest_local(k, dm, (const void *const *)&arena, want, 2));
        assert_int_equal(hashed, refit_digest_map_bytes(map));
        assert_memory_equal(got, want, np * sizeof(*want));
        refit_plan_destroy(plan);
    }
    print_message("%s %s -> %s: %" PRIu64 " bytes hashed while copied, %u placements equal\n", model_name, src_spec,
                  dst_spec, refit_digest_map_bytes(map), np);
    assert_true(refit_digest_map_bytes(map) > 0);
    free(arena);
    free(want);
    free(got);
    refit_digest_map_destroy(map);
    refit_manifest_destroy(dm);
    refit_digest_key_destroy(k);
    tool_local_set_destroy(&set);
    refit_layout_destroy(sl);
    refit_layout_destroy(dl);
    refit_model_destroy(model);
}

static void executor_pairs(void **state)
{
    (void)state;
    run_pair("tiny-moe", "megatron:ep=8", "vllm:tp=2");
    run_pair("tiny-moe", "megatron:tp=2,pp=2,ep=4", "vllm:tp=4,ep=4");
    run_pair("tiny-dense", "megatron:tp=4,pp=2", "vllm:tp=2");
    run_pair("tiny-mla", "megatron:tp=2,ep=2", "hf");
}

static void errors(void **state)
{
    (void)state;
    refit_digest_key_t *k = key_impl(REFIT_DIGEST_IMPL_AUTO);
    refit_manifest_t *m = mixed_manifest();
    refit_digest_map_t *map = NULL;
    REFIT_ASSERT_ERR(refit_digest_map_create(NULL, m, &map), REFIT_ERR_INVALID_ARG, "NULL");
    REFIT_ASSERT_ERR(refit_digest_map_create(k, m, NULL), REFIT_ERR_INVALID_ARG, "NULL");
    refit_manifest_identity_t id = {"x", "hand", 0, 1};
    refit_manifest_t *open = NULL;
    REFIT_ASSERT_OK(refit_manifest_create(&id, &open));
    REFIT_ASSERT_ERR(refit_digest_map_create(k, open, &map), REFIT_ERR_INVALID_ARG, "finalized");
    refit_exec_opts_t o = {.dmap = (const refit_digest_map_t *)1};
    refit_plan_t *plan = NULL;
    REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)&m, 1, m, NULL, &plan));
    void *mem = calloc(1, refit_manifest_region_size(m, 0));
    const void *const *sb = (const void *const *)&mem;
    REFIT_ASSERT_ERR(refit_plan_execute(plan, &sb, &mem, &o), REFIT_ERR_INVALID_ARG, "digest map");
    free(mem);
    refit_plan_destroy(plan);
    refit_manifest_destroy(open);
    refit_manifest_destroy(m);
    /* A region the map does not have: every run of a loop copied, nothing hashed. */
    refit_manifest_t *mm = mixed_manifest();
    REFIT_ASSERT_OK(refit_digest_map_create(k, mm, &map));
    uint8_t src[64], dst[64] = {0}, want[64] = {0};
    refit_dsum_t acc[8] = {{{0, 0}}};
    for (int i = 0; i < 64; i++) src[i] = (uint8_t)(i + 1);
    for (int r = 0; r < 4; r++) memcpy(want + r * 16, src + r * 8, 8);
    assert_int_equal(refit_digest_map_copy_rows(map, 5, 0, 16, dst, src, 8, 8, 4, acc), 0);
    assert_memory_equal(dst, want, sizeof(dst));
    refit_digest_map_destroy(map);
    refit_manifest_destroy(mm);
    /* A manifest no digest covers (one 3-D tensor): a map of no bytes, which copies plainly. */
    refit_manifest_t *m3 = NULL;
    refit_manifest_identity_t id3 = {"x3", "hand", 0, 1};
    REFIT_ASSERT_OK(refit_manifest_create(&id3, &m3));
    uint32_t reg3, c3, l3;
    REFIT_ASSERT_OK(refit_manifest_add_region(m3, 4096, &reg3));
    uint64_t s3[3] = {2, 4, 8}, z3[3] = {0, 0, 0};
    add_tensor(m3, "t", REFIT_DTYPE_BF16, 3, s3, &c3);
    add_local(m3, "t", REFIT_DTYPE_BF16, 3, s3, 0, &l3);
    place(m3, c3, l3, 3, z3, s3, z3);
    REFIT_ASSERT_OK(refit_manifest_finalize(m3));
    REFIT_ASSERT_OK(refit_digest_map_create(k, m3, &map));
    assert_int_equal(refit_digest_map_bytes(map), 0);
    memset(dst, 0, sizeof(dst));
    assert_int_equal(refit_digest_map_copy_rows(map, 0, 0, 16, dst, src, 8, 8, 4, acc), 0);
    assert_memory_equal(dst, want, sizeof(dst));
    assert_int_equal(refit_digest_map_copy(map, 0, 0, dst, src, 64, acc), 0);
    assert_memory_equal(dst, src, 64);
    refit_digest_cursor_t cur = {0};
    refit_digest_map_update(map, &cur, 0, 2, dst + 2, src + 40, 2, acc);
    refit_digest_cursor_flush(&cur);
    assert_memory_equal(dst + 2, src + 40, 2);
    refit_digest_map_destroy(map);
    refit_manifest_destroy(m3);
    refit_digest_map_destroy(NULL);
    assert_int_equal(refit_digest_map_bytes(NULL), 0);
    refit_digest_key_destroy(k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mixed_cuts),     cmocka_unit_test(updates),       cmocka_unit_test(update_units),
        cmocka_unit_test(executor_pairs), cmocka_unit_test(small_regions), cmocka_unit_test(errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
