/* Box arithmetic (intersect, contains, subtract) and the sort-and-sweep overlap
 * detector, checked against brute force on random boxes. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "plan/box.h"
#include "util/util.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;

static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static uint64_t rnd_below(uint64_t n) { return rnd() % n; }

static refit_box_t box2(uint64_t o0, uint64_t e0, uint64_t o1, uint64_t e1)
{
    return (refit_box_t){.ndim = 2, .off = {o0, o1}, .ext = {e0, e1}};
}

/* A random box inside [0, span) in every dim, extents >= 1. */
static refit_box_t random_box(uint32_t ndim, uint64_t span)
{
    refit_box_t b = {.ndim = ndim};
    for (uint32_t d = 0; d < ndim; d++) {
        b.off[d] = rnd_below(span);
        b.ext[d] = 1 + rnd_below(span - b.off[d]);
    }
    return b;
}

/* Field by field: the struct has padding after ndim. */
static void assert_box_equal(const refit_box_t *a, const refit_box_t *b)
{
    assert_int_equal(a->ndim, b->ndim);
    for (uint32_t d = 0; d < a->ndim; d++) {
        assert_int_equal(a->off[d], b->off[d]);
        assert_int_equal(a->ext[d], b->ext[d]);
    }
}

static bool point_in(const refit_box_t *b, const uint64_t pt[REFIT_MAX_DIMS])
{
    for (uint32_t d = 0; d < b->ndim; d++)
        if (pt[d] < b->off[d] || pt[d] >= b->off[d] + b->ext[d]) return false;
    return true;
}

/* Advances pt through [0, span)^ndim; false when done. */
static bool next_point(uint64_t pt[REFIT_MAX_DIMS], uint32_t ndim, uint64_t span)
{
    for (uint32_t d = 0; d < ndim; d++) {
        if (++pt[d] < span) return true;
        pt[d] = 0;
    }
    return false;
}

static bool brute_overlap(const refit_box_t *a, const refit_box_t *b)
{
    for (uint32_t d = 0; d < a->ndim; d++)
        if (a->off[d] + a->ext[d] <= b->off[d] || b->off[d] + b->ext[d] <= a->off[d]) return false;
    return true;
}

/* ---- intersect / contains / volume / format ---------------------------- */

static void test_intersect_contains_examples(void **state)
{
    (void)state;
    refit_box_t a = box2(0, 8, 0, 4), b = box2(4, 8, 2, 4), r;
    assert_true(refit_box_intersect(&a, &b, &r));
    assert_int_equal(r.ndim, 2);
    assert_int_equal(r.off[0], 4);
    assert_int_equal(r.ext[0], 4);
    assert_int_equal(r.off[1], 2);
    assert_int_equal(r.ext[1], 2);
    assert_int_equal(refit_box_volume(&r), 8);
    assert_true(refit_box_intersect(&a, &b, NULL));
    /* touching in one dim: no shared element */
    refit_box_t t = box2(8, 2, 0, 4);
    assert_false(refit_box_intersect(&a, &t, &r));
    t = box2(0, 8, 4, 1);
    assert_false(refit_box_intersect(&a, &t, NULL));
    /* identical boxes intersect in themselves */
    assert_true(refit_box_intersect(&a, &a, &r));
    assert_box_equal(&r, &a);

    assert_true(refit_box_contains(&a, &a));
    refit_box_t in = box2(2, 6, 1, 3);
    assert_true(refit_box_contains(&a, &in));
    assert_false(refit_box_contains(&in, &a));
    refit_box_t edge = box2(2, 7, 1, 3); /* ends at 9 > 8 */
    assert_false(refit_box_contains(&a, &edge));
    assert_false(refit_box_contains(&a, &b));

    char buf[64];
    assert_string_equal(refit_box_format(&b, buf, sizeof(buf)), "[4:12, 2:6]");
    char tiny[5];
    refit_box_format(&b, tiny, sizeof(tiny)); /* truncates without overflowing */
    assert_string_equal(tiny, "[4:1");
}

static void test_intersect_contains_random(void **state)
{
    (void)state;
    const uint64_t span = 6;
    for (int iter = 0; iter < 3000; iter++) {
        uint32_t nd = 1 + (uint32_t)rnd_below(4);
        refit_box_t a = random_box(nd, span), b = random_box(nd, span), r;
        bool hit = refit_box_intersect(&a, &b, &r);
        assert_int_equal(hit, brute_overlap(&a, &b));
        uint64_t pt[REFIT_MAX_DIMS] = {0};
        uint64_t both = 0;
        do {
            bool in_ab = point_in(&a, pt) && point_in(&b, pt);
            both += in_ab;
            if (hit) assert_int_equal(in_ab, point_in(&r, pt));
        } while (next_point(pt, nd, span));
        assert_int_equal(hit ? refit_box_volume(&r) : 0, both);
        if (hit) {
            assert_true(refit_box_contains(&a, &r));
            assert_true(refit_box_contains(&b, &r));
        }
        /* contains agrees with "every point of inner is in outer" */
        bool all_in = true;
        memset(pt, 0, sizeof(pt));
        do
            if (point_in(&b, pt) && !point_in(&a, pt)) all_in = false;
        while (next_point(pt, nd, span));
        assert_int_equal(refit_box_contains(&a, &b), all_in);
    }
}

/* ---- subtract ----------------------------------------------------------- */

static void check_subtract(const refit_box_t *a, const refit_box_t *b)
{
    refit_box_t out[2 * REFIT_MAX_DIMS], isect;
    size_t n = refit_box_subtract(a, b, out);
    assert_true(n <= 2 * (size_t)a->ndim);
    bool hit = refit_box_intersect(a, b, &isect);
    if (!hit) {
        assert_int_equal(n, 1);
        assert_box_equal(&out[0], a);
        return;
    }
    uint64_t vol = refit_box_volume(&isect);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(out[i].ndim, a->ndim);
        for (uint32_t d = 0; d < a->ndim; d++) assert_true(out[i].ext[d] >= 1);
        assert_true(refit_box_contains(a, &out[i]));
        assert_false(refit_box_intersect(&out[i], b, NULL));
        for (size_t j = 0; j < i; j++) assert_false(refit_box_intersect(&out[i], &out[j], NULL));
        vol += refit_box_volume(&out[i]);
    }
    assert_int_equal(vol, refit_box_volume(a));
}

static void test_subtract_examples(void **state)
{
    (void)state;
    refit_box_t a = box2(0, 8, 0, 8), out[2 * REFIT_MAX_DIMS];
    refit_box_t hole = box2(2, 2, 3, 2); /* strictly inside: 4 pieces */
    assert_int_equal(refit_box_subtract(&a, &hole, out), 4);
    check_subtract(&a, &hole);
    assert_int_equal(refit_box_subtract(&a, &a, out), 0); /* nothing left */
    refit_box_t big = box2(0, 100, 0, 100);
    assert_int_equal(refit_box_subtract(&a, &big, out), 0);
    refit_box_t far = box2(8, 4, 0, 8); /* touching: a is returned whole */
    assert_int_equal(refit_box_subtract(&a, &far, out), 1);
    assert_box_equal(&out[0], &a);
    refit_box_t top = box2(0, 3, 0, 8); /* a row prefix: one piece, the rest of the rows */
    assert_int_equal(refit_box_subtract(&a, &top, out), 1);
    assert_int_equal(out[0].off[0], 3);
    assert_int_equal(out[0].ext[0], 5);
    assert_int_equal(out[0].ext[1], 8);
    refit_box_t a4 = {.ndim = 4, .off = {0, 0, 0, 0}, .ext = {4, 4, 4, 4}};
    refit_box_t c4 = {.ndim = 4, .off = {1, 1, 1, 1}, .ext = {2, 2, 2, 2}};
    assert_int_equal(refit_box_subtract(&a4, &c4, out), 8);
    check_subtract(&a4, &c4);
}

static void test_subtract_random(void **state)
{
    (void)state;
    for (int iter = 0; iter < 20000; iter++) {
        uint32_t nd = 1 + (uint32_t)rnd_below(4);
        refit_box_t a = random_box(nd, 10), b = random_box(nd, 10);
        if (iter % 7 == 0) b = a;
        check_subtract(&a, &b);
        check_subtract(&b, &a);
    }
    /* point-exact on small grids: every point of a is in b or in exactly one piece */
    for (int iter = 0; iter < 2000; iter++) {
        uint32_t nd = 1 + (uint32_t)rnd_below(4);
        const uint64_t span = 5;
        refit_box_t a = random_box(nd, span), b = random_box(nd, span), out[2 * REFIT_MAX_DIMS];
        size_t n = refit_box_subtract(&a, &b, out);
        uint64_t pt[REFIT_MAX_DIMS] = {0};
        do {
            int in_pieces = 0;
            for (size_t i = 0; i < n; i++) in_pieces += point_in(&out[i], pt);
            int want = point_in(&a, pt) && !point_in(&b, pt);
            assert_int_equal(in_pieces, want);
        } while (next_point(pt, nd, span));
    }
}

/* ---- find_overlap ------------------------------------------------------- */

static bool brute_find(const refit_box_t *boxes, const uint32_t *groups, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if ((!groups || groups[i] == groups[j]) && brute_overlap(&boxes[i], &boxes[j])) return true;
    return false;
}

static void check_find(const refit_box_t *boxes, const uint32_t *groups, size_t n)
{
    size_t i = SIZE_MAX, j = SIZE_MAX;
    int err = 7;
    bool found = refit_boxes_find_overlap(boxes, groups, n, &i, &j, &err);
    assert_int_equal(err, 0);
    assert_int_equal(found, brute_find(boxes, groups, n));
    if (found) {
        assert_true(i < j);
        assert_true(j < n);
        if (groups) assert_int_equal(groups[i], groups[j]);
        assert_true(brute_overlap(&boxes[i], &boxes[j]));
    }
}

/* Splits [0, span)^ndim into a grid of cells at random cut points and returns
 * up to `max` of them (disjoint; neighbours touch). */
static size_t grid_cells(uint32_t ndim, uint64_t span, refit_box_t *out, size_t max)
{
    uint64_t cuts[REFIT_MAX_DIMS][6];
    size_t ncut[REFIT_MAX_DIMS];
    for (uint32_t d = 0; d < ndim; d++) {
        /* sorted distinct cut points 0 = c0 < c1 < ... < c_k = span */
        size_t k = 1 + (size_t)rnd_below(4);
        cuts[d][0] = 0;
        size_t m = 1;
        for (size_t q = 1; q < k; q++) {
            uint64_t c = cuts[d][m - 1] + 1 + rnd_below(3);
            if (c >= span) break;
            cuts[d][m++] = c;
        }
        cuts[d][m] = span;
        ncut[d] = m; /* m cells in dim d */
    }
    size_t n = 0, idx[REFIT_MAX_DIMS] = {0};
    for (;;) {
        if (n == max) break;
        refit_box_t b = {.ndim = ndim};
        for (uint32_t d = 0; d < ndim; d++) {
            b.off[d] = cuts[d][idx[d]];
            b.ext[d] = cuts[d][idx[d] + 1] - cuts[d][idx[d]];
        }
        out[n++] = b;
        uint32_t d = 0;
        while (d < ndim && ++idx[d] == ncut[d]) idx[d++] = 0;
        if (d == ndim) break;
    }
    return n;
}

static void shuffle(refit_box_t *boxes, uint32_t *groups, size_t n)
{
    for (size_t k = n; k > 1; k--) {
        size_t r = (size_t)rnd_below(k);
        refit_box_t tb = boxes[k - 1];
        boxes[k - 1] = boxes[r];
        boxes[r] = tb;
        uint32_t tg = groups[k - 1];
        groups[k - 1] = groups[r];
        groups[r] = tg;
    }
}

static void test_find_overlap_random(void **state)
{
    (void)state;
    enum { MAXN = 64 };
    refit_box_t boxes[MAXN];
    uint32_t groups[MAXN];
    size_t positives = 0, negatives = 0;
    for (int iter = 0; iter < 6000; iter++) {
        uint32_t nd = 1 + (uint32_t)rnd_below(4);
        uint32_t ngroups = 1 + (uint32_t)rnd_below(3);
        size_t n;
        switch (iter % 3) {
        case 0: /* free random boxes in a small space: touching and overlapping both common */
            n = (size_t)rnd_below(MAXN / 2);
            for (size_t k = 0; k < n; k++) {
                boxes[k] = random_box(nd, 8);
                groups[k] = (uint32_t)rnd_below(ngroups);
            }
            break;
        case 1: /* disjoint grid cells per group (neighbours touch) */
        default:
            n = 0;
            for (uint32_t g = 0; g < ngroups; g++) {
                size_t got = grid_cells(nd, 8, boxes + n, MAXN / 3 - 1);
                for (size_t k = 0; k < got; k++) groups[n + k] = g;
                n += got;
            }
            if (iter % 3 == 2 && n > 0) { /* inject: duplicate one cell, or grow one into its neighbour */
                size_t k = (size_t)rnd_below(n);
                boxes[n] = boxes[k];
                groups[n] = groups[k];
                if (rnd() & 1) { /* shifted by its extent: touches the original (and may overlap a
                                    neighbour); one less and it overlaps the original */
                    uint32_t d = (uint32_t)rnd_below(nd);
                    boxes[n].off[d] += boxes[n].ext[d];
                    if (rnd() & 1) boxes[n].off[d] -= 1;
                }
                n++;
            }
            shuffle(boxes, groups, n);
            break;
        }
        check_find(boxes, groups, n);
        check_find(boxes, NULL, n); /* no groups: all conflict */
        if (brute_find(boxes, groups, n)) positives++;
        else negatives++;
    }
    /* both outcomes are well represented */
    assert_true(positives > 1000);
    assert_true(negatives > 1000);
}

static void test_find_overlap_small_cases(void **state)
{
    (void)state;
    size_t i, j;
    int err;
    refit_box_t b[3] = {box2(0, 4, 0, 4), box2(4, 4, 0, 4), box2(0, 4, 4, 4)};
    uint32_t g[3] = {0, 0, 0};
    assert_false(refit_boxes_find_overlap(b, g, 0, &i, &j, &err));
    assert_false(refit_boxes_find_overlap(b, g, 1, &i, &j, &err));
    assert_false(refit_boxes_find_overlap(b, g, 3, &i, &j, &err)); /* touching in dim 0 and in dim 1 */
    b[2] = b[0];                                                   /* identical boxes overlap */
    assert_true(refit_boxes_find_overlap(b, g, 3, &i, &j, &err));
    assert_int_equal(i, 0);
    assert_int_equal(j, 2);
    g[2] = 1; /* ... unless in different groups */
    assert_false(refit_boxes_find_overlap(b, g, 3, &i, &j, &err));
    /* a long box that starts first must still be compared with a later one */
    refit_box_t c[3] = {box2(0, 100, 5, 1), box2(10, 1, 0, 4), box2(50, 1, 0, 8)};
    uint32_t h[3] = {0, 0, 0};
    assert_true(refit_boxes_find_overlap(c, h, 3, &i, &j, &err));
    assert_int_equal(i, 0);
    assert_int_equal(j, 2);
}

static void test_find_overlap_many_row_slices(void **state)
{
    (void)state;
    enum { N = 20000 };
    refit_box_t *boxes = malloc(N * sizeof(*boxes));
    uint32_t *groups = malloc(N * sizeof(*groups));
    uint32_t *rows = malloc(N * sizeof(*rows));
    assert_non_null(boxes);
    assert_non_null(groups);
    assert_non_null(rows);
    for (uint32_t k = 0; k < N; k++) rows[k] = k;
    for (uint32_t k = N; k > 1; k--) { /* shuffled order */
        uint32_t r = (uint32_t)rnd_below(k), t = rows[k - 1];
        rows[k - 1] = rows[r];
        rows[r] = t;
    }
    for (uint32_t k = 0; k < N; k++) {
        boxes[k] = box2(rows[k], 1, 0, 4096);
        groups[k] = 0;
    }
    size_t i = 0, j = 0;
    int err = 1;
    assert_false(refit_boxes_find_overlap(boxes, groups, N, &i, &j, &err));
    assert_int_equal(err, 0);
    /* one slice grows into the next row */
    uint32_t victim = 12345, below = 0;
    for (uint32_t k = 0; k < N; k++)
        if (rows[k] == rows[victim] + 1) below = k;
    boxes[victim].ext[0] = 2;
    assert_true(refit_boxes_find_overlap(boxes, groups, N, &i, &j, &err));
    assert_int_equal(err, 0);
    assert_int_equal(i, REFIT_MIN(victim, below));
    assert_int_equal(j, REFIT_MAX(victim, below));
    free(boxes);
    free(groups);
    free(rows);
}

static void test_find_overlap_many_column_slices(void **state)
{
    (void)state;
    enum { N = 20000 };
    refit_box_t *boxes = malloc(N * sizeof(*boxes));
    uint32_t *groups = malloc(N * sizeof(*groups));
    uint32_t *rows = malloc(N * sizeof(*rows));
    assert_non_null(boxes);
    assert_non_null(groups);
    assert_non_null(rows);
    for (uint32_t k = 0; k < N; k++) rows[k] = k;
    for (uint32_t k = N; k > 1; k--) { /* shuffled order */
        uint32_t r = (uint32_t)rnd_below(k), t = rows[k - 1];
        rows[k - 1] = rows[r];
        rows[r] = t;
    }
    for (uint32_t k = 0; k < N; k++) {
        boxes[k] = box2(0, 4096, rows[k], 1); /* all share dim 0: the sweep must pick dim 1 */
        groups[k] = 0;
    }
    size_t i = 0, j = 0;
    int err = 1;
    assert_false(refit_boxes_find_overlap(boxes, groups, N, &i, &j, &err));
    assert_int_equal(err, 0);
    /* one slice grows into the next column */
    uint32_t victim = 12345, below = 0;
    for (uint32_t k = 0; k < N; k++)
        if (rows[k] == rows[victim] + 1) below = k;
    boxes[victim].ext[1] = 2;
    assert_true(refit_boxes_find_overlap(boxes, groups, N, &i, &j, &err));
    assert_int_equal(err, 0);
    assert_int_equal(i, REFIT_MIN(victim, below));
    assert_int_equal(j, REFIT_MAX(victim, below));
    free(boxes);
    free(groups);
    free(rows);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_intersect_contains_examples),
        cmocka_unit_test(test_intersect_contains_random),
        cmocka_unit_test(test_subtract_examples),
        cmocka_unit_test(test_subtract_random),
        cmocka_unit_test(test_find_overlap_small_cases),
        cmocka_unit_test(test_find_overlap_random),
        cmocka_unit_test(test_find_overlap_many_row_slices),
        cmocka_unit_test(test_find_overlap_many_column_slices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
