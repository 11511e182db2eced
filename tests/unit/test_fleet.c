/* The fleet's scheduling rules (src/engine/fleet/fleet_rules.c) on their own: no
 * transports, no threads, and a clock of the test's own (the `now` every rule
 * takes), so that shares, steals from slower holders, re-reads of overdue
 * chunks and failover are checked at exact times. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine/fleet/fleet.h"

#define NC 8
#define CHUNK 1000

typedef struct {
    refit_fleet_holder_t h[3];
    refit_fleet_chunk_t c[NC];
    uint64_t keys[1];
    refit_fleet_sched_t S;
} fixture_t;

/* nh trainer holders of the one planned source (DP replicas: same mirror
 * key), NC free chunks of CHUNK bytes, shared out. */
static void setup(fixture_t *f, uint32_t nh)
{
    static int dummy_peer;
    memset(f, 0, sizeof(*f));
    f->keys[0] = 42;
    for (uint32_t i = 0; i < nh; i++) {
        f->h[i].id = i;
        f->h[i].peer = (refit_peer_t *)(void *)&dummy_peer;
        f->h[i].mirror_key = 42;
    }
    for (uint32_t i = 0; i < NC; i++) f->c[i] = (refit_fleet_chunk_t){.first = i, .n = 1, .bytes = CHUNK};
    f->S = (refit_fleet_sched_t){.h = f->h, .nh = nh, .plan_keys = f->keys, .nplan = 1, .c = f->c, .nc = NC};
    refit_fleet_share(&f->S, 0);
}

/* Holder h claims at `now` and finishes after `secs` of its own time. */
static refit_fleet_chunk_t *read_one(fixture_t *f, uint32_t h, double now, double secs)
{
    bool none_left = false;
    refit_fleet_chunk_t *c = refit_fleet_claim(&f->S, h, now, &none_left);
    if (c) refit_fleet_chunk_done(&f->S, h, c, c->bytes, secs, secs, false);
    return c;
}

static void shares_are_equal_by_bytes(void **state)
{
    (void)state;
    fixture_t f;
    setup(&f, 2);
    uint32_t mine[2] = {0, 0};
    for (uint32_t i = 0; i < NC; i++) {
        assert_true(f.c[i].pref < 2);
        mine[f.c[i].pref]++;
    }
    assert_int_equal(mine[0], NC / 2);
    assert_int_equal(mine[1], NC / 2);
}

static void equal_holders_keep_their_shares(void **state)
{
    (void)state;
    fixture_t f;
    setup(&f, 2);
    double now = 0;
    /* Both equally fast: each reads its own share, then finds nothing it may take. */
    for (uint32_t k = 0; k < NC / 2; k++, now += 0.01) {
        refit_fleet_chunk_t *a = read_one(&f, 0, now, 0.01), *b = read_one(&f, 1, now, 0.01);
        assert_non_null(a);
        assert_non_null(b);
        assert_int_equal(a->pref, 0);
        assert_int_equal(b->pref, 1);
    }
    bool none_left = false;
    assert_null(refit_fleet_claim(&f.S, 0, now, &none_left));
    assert_true(none_left);
    assert_int_equal(f.S.done, NC);
    assert_int_equal(f.h[0].taken + f.h[1].taken, 0);
}

static void a_slower_holder_loses_its_share(void **state)
{
    (void)state;
    fixture_t f;
    setup(&f, 2);
    double now = 0;
    /* Three chunks each: holder 1 takes 10x as long per byte. */
    for (uint32_t k = 0; k < 3; k++) {
        assert_non_null(read_one(&f, 0, now, 0.01));
        assert_non_null(read_one(&f, 1, now, 0.1));
        now += 0.1;
    }
    /* Holder 0 reads its last chunk, then takes holder 1's last free one. */
    refit_fleet_chunk_t *c = read_one(&f, 0, now, 0.01);
    assert_non_null(c);
    assert_int_equal(c->pref, 0);
    c = read_one(&f, 0, now, 0.01);
    assert_non_null(c);
    assert_int_equal(c->pref, 1);
    assert_int_equal(f.h[0].taken, 1);

    /* A clearly slower holder keeps one chunk in flight, not more: its
     * second worker gets nothing while the first is busy, and may claim
     * again once that chunk is done. */
    fixture_t g;
    setup(&g, 2);
    now = 0;
    for (uint32_t k = 0; k < 3; k++) {
        assert_non_null(read_one(&g, 0, now, 0.01));
        assert_non_null(read_one(&g, 1, now, 0.1));
        now += 0.1;
    }
    /* Both chunks left in its share: without the rule it would take the second. */
    for (size_t i = 0; i < NC; i++)
        if (g.c[i].state == REFIT_CHUNK_FREE) g.c[i].pref = 1;
    bool none_left = false;
    refit_fleet_chunk_t *first = refit_fleet_claim(&g.S, 1, now, &none_left);
    assert_non_null(first);
    assert_null(refit_fleet_claim(&g.S, 1, now, &none_left));
    assert_false(none_left);
    /* The fast holder is not held back: it takes the last free chunk. */
    assert_non_null(refit_fleet_claim(&g.S, 0, now, &none_left));
    refit_fleet_chunk_done(&g.S, 1, first, first->bytes, 0.1, 0.1, false);
    assert_int_equal(g.S.done, NC - 1);
}

static void an_overdue_chunk_is_read_again(void **state)
{
    (void)state;
    fixture_t f;
    setup(&f, 2);
    /* Holder 1 claims a chunk at t=0 and never finishes it; holder 0 reads
     * everything else (mean chunk time 0.01 s). */
    bool none_left = false;
    refit_fleet_chunk_t *stuck = refit_fleet_claim(&f.S, 1, 0, &none_left);
    assert_non_null(stuck);
    double now = 0;
    for (uint32_t k = 0; k < NC / 2; k++, now += 0.01) assert_non_null(read_one(&f, 0, now, 0.01));
    /* Holder 1's other free chunks: holder 0 may take them only once holder 1
     * is clearly slower, which a chunk in flight for over 10x what holder 0
     * takes (+100 ms: 0.2 s here) shows; then it takes them, and last re-reads
     * the stuck one. */
    assert_null(refit_fleet_claim(&f.S, 0, 0.1, &none_left));
    assert_false(none_left);
    refit_fleet_chunk_t *c;
    uint32_t taken = 0;
    while ((c = read_one(&f, 0, 0.25, 0.01))) {
        if (c == stuck) break;
        taken++;
    }
    assert_int_equal(taken, NC / 2 - 1);
    /* The stuck one itself: re-read once it has been in flight for more than
     * 4x the mean chunk time + 100 ms (0.14 s here), not before. */
    fixture_t g;
    setup(&g, 2);
    stuck = refit_fleet_claim(&g.S, 1, 0, &none_left);
    for (uint32_t i = 0; i < NC; i++)
        if (&g.c[i] != stuck) {
            g.c[i].state = REFIT_CHUNK_DONE;
            g.S.done++;
        }
    g.S.time_sum = 0.01 * (NC - 1);
    g.S.time_n = NC - 1;
    assert_null(refit_fleet_claim(&g.S, 0, 0.13, &none_left));
    assert_false(none_left);
    c = refit_fleet_claim(&g.S, 0, 0.15, &none_left);
    assert_ptr_equal(c, stuck);
    assert_int_equal(c->dup, 1);
    assert_int_equal(g.h[0].steals, 1);
    /* Whichever read finishes first makes it done; the other is a duplicate. */
    assert_true(refit_fleet_chunk_done(&g.S, 0, c, c->bytes, 0.01, 0.01, false));
    assert_false(refit_fleet_chunk_done(&g.S, 1, c, c->bytes, 0.2, 0.2, false));
    assert_int_equal(g.S.done, NC);
    assert_null(refit_fleet_claim(&g.S, 1, 0.3, &none_left));
    assert_true(none_left);
}

static void a_failed_holder_s_share_goes_at_once(void **state)
{
    (void)state;
    fixture_t f;
    setup(&f, 2);
    f.h[1].failed = true;
    bool none_left = false;
    for (uint32_t k = 0; k < NC; k++) assert_non_null(read_one(&f, 0, 0, 0.01));
    assert_null(refit_fleet_claim(&f.S, 0, 0, &none_left));
    assert_true(none_left);
    /* A holder of other bytes (another mirror key) serves nothing. */
    fixture_t g;
    setup(&g, 1);
    g.h[0].mirror_key = 7;
    assert_null(refit_fleet_claim(&g.S, 0, 0, &none_left));
    assert_true(none_left);
}

/* Asking a relay ahead (refit_fleet_claim_ahead): only a waitable relay
 * still receiving; the front of its share first, one chunk per claim; never
 * a chunk that is busy or done, nor another holder's share; a relay that has
 * chunks written gets those first from refit_fleet_claim. */
static void a_relay_is_asked_ahead_in_order(void **state)
{
    (void)state;
    fixture_t f;
    setup(&f, 2);
    uint8_t avail0[NC] = {0}, avail1[NC] = {0};
    uint8_t *avail[3] = {avail0, avail1, NULL};
    f.S.avail = avail;
    /* holder 1: a relay of our layout, still receiving; holder 0: a trainer rank. */
    f.h[1].mirror_dst = true;
    f.h[1].partial = true;
    f.S.h[1].progress_region = 1;
    refit_fleet_share(&f.S, 0);
    uint32_t mine = 0;
    for (size_t i = 0; i < NC; i++) mine += f.c[i].pref == 1;
    assert_true(mine > 1 && mine < NC);
    /* Not waitable yet (its progress not matched): nothing ahead. */
    assert_null(refit_fleet_claim_ahead(&f.S, 1, 0));
    f.h[1].waitable = true;
    assert_null(refit_fleet_claim_ahead(&f.S, 0, 0)); /* a trainer rank is never asked ahead */
    size_t first = NC, second = NC;
    for (size_t i = 0; i < NC && second == NC; i++)
        if (f.c[i].pref == 1) *(first == NC ? &first : &second) = i;
    refit_fleet_chunk_t *a = refit_fleet_claim_ahead(&f.S, 1, 0.5);
    assert_non_null(a);
    assert_int_equal(a - f.c, first);
    assert_int_equal(a->state, REFIT_CHUNK_BUSY);
    assert_int_equal(a->owner, 1);
    refit_fleet_chunk_t *b = refit_fleet_claim_ahead(&f.S, 1, 0.5);
    assert_non_null(b);
    assert_int_equal(b - f.c, second);
    assert_int_equal(f.h[1].ahead, 2);
    /* Every chunk of its share taken: nothing more ahead, and none of holder 0's. */
    while (refit_fleet_claim_ahead(&f.S, 1, 0.5)) {
    }
    for (size_t i = 0; i < NC; i++)
        assert_int_equal(f.c[i].state, f.c[i].pref == 1 ? REFIT_CHUNK_BUSY : REFIT_CHUNK_FREE);
    assert_int_equal(f.h[1].ahead, mine);
    /* A relay that has committed (not partial) is read whole, not ahead. */
    fixture_t g;
    setup(&g, 1);
    g.h[0].mirror_dst = true;
    g.h[0].waitable = true;
    assert_null(refit_fleet_claim_ahead(&g.S, 0, 0));
    /* A failed relay: nothing. */
    g.h[0].partial = true;
    g.h[0].failed = true;
    assert_null(refit_fleet_claim_ahead(&g.S, 0, 0));

    /* A relay clearly slower than the trainer rank beside it keeps one chunk
     * in flight, asked ahead or not (held_back). */
    fixture_t k;
    setup(&k, 2);
    uint8_t av0[NC] = {0}, av1[NC] = {0};
    uint8_t *av[3] = {av0, av1, NULL};
    k.S.avail = av;
    double now = 0;
    for (uint32_t i = 0; i < 3; i++, now += 0.1) {
        assert_non_null(read_one(&k, 0, now, 0.01));
        assert_non_null(read_one(&k, 1, now, 0.1));
    }
    k.h[1].mirror_dst = k.h[1].partial = k.h[1].waitable = true;
    uint32_t free_left = 0;
    for (size_t i = 0; i < NC; i++)
        if (k.c[i].state == REFIT_CHUNK_FREE) k.c[i].pref = 1, free_left++;
    assert_int_equal(free_left, 2); /* two it could be asked for ahead */
    assert_non_null(refit_fleet_claim_ahead(&k.S, 1, now));
    assert_null(refit_fleet_claim_ahead(&k.S, 1, now));
}

/* A piece of 4 rows of 100 bytes, read from a trainer rank (rows 400 apart)
 * into rows dst_stride apart. */
static refit_plan_region_t four_rows(uint64_t dst_stride)
{
    refit_plan_region_t r;
    memset(&r, 0, sizeof(r));
    r.src = 0;
    r.src_region = 3;
    r.dst_region = 1;
    r.src_offset = 1000;
    r.dst_offset = 5000;
    r.run = 100;
    r.nloops = 1;
    r.count[0] = 4;
    r.src_stride[0] = 400;
    r.dst_stride[0] = dst_stride;
    return r;
}

static void a_relay_s_piece_is_one_span_unless_its_rows_leave_gaps(void **state)
{
    (void)state;
    refit_fleet_holder_t trainer, relay;
    memset(&trainer, 0, sizeof(trainer));
    memset(&relay, 0, sizeof(relay));
    relay.mirror_dst = true;
    /* A trainer's piece is read as planned. */
    refit_plan_region_t r = four_rows(100), want = r;
    refit_fleet_piece_from(&trainer, true, &r);
    assert_memory_equal(&r, &want, sizeof(r));
    /* A relay still receiving, rows back to back where we put them: one run
     * of the 400 bytes, from the relay's copy of our destination region. */
    refit_fleet_piece_from(&relay, true, &r);
    assert_int_equal(r.nloops, 0);
    assert_int_equal(r.run, 400);
    assert_int_equal(r.src_region, 1);
    assert_int_equal(r.src_offset, 5000);
    assert_int_equal(r.dst_region, 1);
    assert_int_equal(r.dst_offset, 5000);
    assert_int_equal(refit_plan_region_bytes(&r), 400);
    /* Rows 200 apart: a relay still receiving is read row by row (the gaps
     * may be chunks it has not written), a complete one in one span. */
    r = four_rows(200);
    refit_fleet_piece_from(&relay, true, &r);
    assert_int_equal(r.nloops, 1);
    assert_int_equal(r.run, 100);
    assert_int_equal(r.count[0], 4);
    assert_int_equal(r.src_stride[0], 200);
    assert_int_equal(r.src_region, 1);
    assert_int_equal(r.src_offset, 5000);
    assert_int_equal(refit_plan_region_bytes(&r), 400);
    r = four_rows(200);
    refit_fleet_piece_from(&relay, false, &r);
    assert_int_equal(r.nloops, 0);
    assert_int_equal(r.run, 700);
    assert_int_equal(r.src_offset, 5000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shares_are_equal_by_bytes),
        cmocka_unit_test(equal_holders_keep_their_shares),
        cmocka_unit_test(a_slower_holder_loses_its_share),
        cmocka_unit_test(an_overdue_chunk_is_read_again),
        cmocka_unit_test(a_failed_holder_s_share_goes_at_once),
        cmocka_unit_test(a_relay_is_asked_ahead_in_order),
        cmocka_unit_test(a_relay_s_piece_is_one_span_unless_its_rows_leave_gaps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
