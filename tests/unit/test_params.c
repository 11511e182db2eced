/* Params with a size (refit/engine.h): the one copy by size (refit_params_in),
 * what each create function refuses, the _INIT macros' defaults by name, and
 * the region limit REFIT_MAX_REGIONS (a publisher of more than the old limit
 * of 64 regions publishes, and a receiver pulls every byte of it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_procs.h"
#include "testutil.h"
#include "util/util.h"

/* A caller's structure from an older header (two fields) and the library's (three). */
typedef struct {
    size_t size;
    uint32_t a;
    uint64_t b;
} lib_params_t;
typedef struct {
    size_t size;
    uint32_t a;
} old_params_t;

static void test_params_in_copies_by_size(void **state)
{
    (void)state;
    lib_params_t dst;
    memset(&dst, 0xAB, sizeof(dst));
    old_params_t old = {.size = sizeof(old), .a = 7};
    REFIT_ASSERT_OK(refit_params_in(&dst, sizeof(dst), &old, REFIT_END_OF(old_params_t, a), "lib_params_t"));
    assert_int_equal(dst.size, sizeof(dst)); /* the library's own size from here on */
    assert_int_equal(dst.a, 7);
    assert_int_equal(dst.b, 0); /* past the caller's size: 0, the field's default */
    lib_params_t full = {.size = sizeof(full), .a = 1, .b = 2};
    REFIT_ASSERT_OK(refit_params_in(&dst, sizeof(dst), &full, REFIT_END_OF(old_params_t, a), "lib_params_t"));
    assert_int_equal(dst.b, 2);
}

static void test_params_in_refuses_other_sizes(void **state)
{
    (void)state;
    lib_params_t dst = {.size = 1, .a = 5, .b = 6}, src = {.size = sizeof(src) + 8};
    REFIT_ASSERT_ERR(refit_params_in(&dst, sizeof(dst), &src, 12, "lib_params_t"), REFIT_ERR_INVALID_ARG,
                     "lib_params_t: size is 32, this library takes 12 to 24");
    src.size = 11;
    REFIT_ASSERT_ERR(refit_params_in(&dst, sizeof(dst), &src, 12, "lib_params_t"), REFIT_ERR_INVALID_ARG,
                     "lib_params_t: size is 11");
    assert_int_equal(dst.size, 1); /* untouched */
    assert_int_equal(dst.a, 5);
    assert_int_equal(dst.b, 6);
}

static void test_init_macros_set_size_and_defaults(void **state)
{
    (void)state;
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    assert_int_equal(pp.size, sizeof(pp));
    assert_int_equal(pp.device, -1);
    assert_int_equal(pp.mode, REFIT_MODE_IN_PLACE);
    assert_null(pp.registry);
    assert_int_equal(pp.heartbeat_ms, 0);
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    assert_int_equal(rp.size, sizeof(rp));
    assert_int_equal(rp.device, -1);
    assert_int_equal(rp.relay_slot, -1);
    assert_int_equal(rp.verify, REFIT_VERIFY_NONE);
    assert_false(rp.fp8);
    refit_plan_params_t pl = REFIT_PLAN_PARAMS_INIT;
    assert_int_equal(pl.size, sizeof(pl));
    assert_int_equal(pl.split_bytes, 0);
    /* Nothing released had a smaller layout yet: the first layout is the whole structure. */
    assert_true(REFIT_PUBLISHER_PARAMS_SIZE_1 <= sizeof(pp) && sizeof(pp) - REFIT_PUBLISHER_PARAMS_SIZE_1 < 8);
    assert_true(REFIT_RECEIVER_PARAMS_SIZE_1 <= sizeof(rp) && sizeof(rp) - REFIT_RECEIVER_PARAMS_SIZE_1 < 8);
    assert_true(REFIT_PLAN_PARAMS_SIZE_1 <= sizeof(pl) && sizeof(pl) - REFIT_PLAN_PARAMS_SIZE_1 < 8);
}

/* A manifest of n regions, one bf16 tensor of 64 elements each ("t<i>"), or
 * (packed) one region holding all n tensors one after another. */
static refit_manifest_t *many_regions(uint32_t n, bool packed, uint32_t rank)
{
    refit_manifest_identity_t id = {"many-regions", packed ? "packed" : "split", rank, 1};
    refit_manifest_t *m;
    REFIT_ASSERT_OK(refit_manifest_create(&id, &m));
    uint32_t reg = 0;
    if (packed) REFIT_ASSERT_OK(refit_manifest_add_region(m, (uint64_t)n * 128, &reg));
    for (uint32_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof(name), "t%u", i);
        refit_tensor_info_t t = {.name = name, .dtype = REFIT_DTYPE_BF16, .ndim = 1, .shape = {64}};
        uint32_t canon, local;
        REFIT_ASSERT_OK(refit_manifest_add_canonical(m, &t, &canon));
        if (!packed) REFIT_ASSERT_OK(refit_manifest_add_region(m, 128, &reg));
        REFIT_ASSERT_OK(refit_manifest_add_local(m, &t, reg, packed ? (uint64_t)i * 128 : 0, &local));
        refit_placement_t p = {.canon = canon, .local = local, .ndim = 1, .extent = {64}};
        REFIT_ASSERT_OK(refit_manifest_add_placement(m, &p));
    }
    REFIT_ASSERT_OK(refit_manifest_finalize(m));
    return m;
}

static void test_create_refuses_params_of_other_sizes(void **state)
{
    (void)state;
    refit_manifest_t *m = many_regions(2, true, 0);
    refit_publisher_t *p = NULL;
    refit_receiver_t *r = NULL;
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.size = sizeof(pp) + 8; /* a program built against newer headers */
    REFIT_ASSERT_ERR(refit_publisher_create(&pp, m, &p), REFIT_ERR_INVALID_ARG, "refit_publisher_params_t: size is");
    pp.size = REFIT_PUBLISHER_PARAMS_SIZE_1 - 1;
    REFIT_ASSERT_ERR(refit_publisher_create(&pp, m, &p), REFIT_ERR_INVALID_ARG, "refit_publisher_params_t: size is");
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.size = sizeof(unsigned); /* the old `unsigned version` = 6 in its place reads as a size too small */
    REFIT_ASSERT_ERR(refit_receiver_create(&rp, m, &r), REFIT_ERR_INVALID_ARG, "refit_receiver_params_t: size is");
    assert_null(p);
    assert_null(r);
    refit_manifest_destroy(m); /* still the caller's: every create leaves it on failure */
}

static void test_publisher_region_limit(void **state)
{
    (void)state;
    refit_manifest_t *m = many_regions(REFIT_MAX_REGIONS + 1, false, 0);
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = "file:/nonexistent/never-opened";
    refit_publisher_t *p = NULL;
    char want[64];
    snprintf(want, sizeof(want), "at most %u (REFIT_MAX_REGIONS)", REFIT_MAX_REGIONS);
    REFIT_ASSERT_ERR(refit_publisher_create(&pp, m, &p), REFIT_ERR_INVALID_ARG, want);
    refit_manifest_destroy(m);
}

/* More regions than the old limit of 64 (REFIT_MAX_REGIONS; snapshot and delta mode: every
 * region's staging and delta arenas), published and pulled over shm. */
static void test_many_regions_publish_and_pull(void **state)
{
    (void)state;
    const uint32_t n = REFIT_MAX_REGIONS;
    reg_t g;
    reg_file(&g);
    refit_manifest_t *sm = many_regions(n, false, 0), *dm = many_regions(n, true, 0);
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = g.url;
    pp.job = g.job;
    pp.transports = "shm";
    pp.mode = REFIT_MODE_SNAPSHOT;
    pp.delta = true;
    refit_publisher_t *p;
    REFIT_ASSERT_OK(refit_publisher_create(&pp, sm, &p));
    void **bases = calloc(n, sizeof(void *));
    for (uint32_t r = 0; r < n; r++) REFIT_ASSERT_OK(refit_publisher_alloc(p, r, &bases[r]));
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g.url;
    rp.job = g.job;
    rp.transports = "shm";
    rp.verify = REFIT_VERIFY_TRUTH;
    rp.threads = 2;
    refit_receiver_t *r;
    void *dbase;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, dm, &r));
    REFIT_ASSERT_OK(refit_receiver_alloc(r, 0, &dbase));
    for (uint64_t v = 1; v <= 2; v++) {
        REFIT_ASSERT_OK(refit_truth_fill(sm, bases, v));
        REFIT_ASSERT_OK(refit_publisher_publish(p, v));
        refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
        REFIT_ASSERT_OK(refit_receiver_pull(r, v, 5000, &rep));
        assert_int_equal(rep.version, v);
        refit_manifest_t *check = many_regions(n, true, 0);
        REFIT_ASSERT_OK(refit_truth_verify(check, (const void *const *)&dbase, v, NULL));
        refit_manifest_destroy(check);
    }
    refit_receiver_destroy(r);
    refit_publisher_destroy(p);
    free(bases);
    t_rm_tree(g.dir);
}

/* The strings a params structure points at may be freed once create returned (engine.h, "Ownership"): here
 * they are overwritten and freed right after each create, and the publisher still publishes, the receiver
 * still pulls every byte of two versions, each reading its registry and job every time (ASan: no read of the
 * freed strings).  Before create copied them, the engine kept the caller's pointers. */
static char *scratch(const char *s)
{
    char *d = strdup(s);
    assert_non_null(d);
    return d;
}

static void wipe(char *s)
{
    memset(s, 'X', strlen(s));
    free(s);
}

static void test_params_strings_freed_after_create(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    refit_manifest_t *sm = many_regions(3, false, 0), *dm = many_regions(3, true, 0);
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    char *preg = scratch(g.url), *pjob = scratch(g.job), *ptr = scratch("shm"), *pgrp = scratch("trainer");
    pp.registry = preg;
    pp.job = pjob;
    pp.transports = ptr;
    pp.group = pgrp;
    refit_publisher_t *p;
    REFIT_ASSERT_OK(refit_publisher_create(&pp, sm, &p));
    wipe(preg), wipe(pjob), wipe(ptr), wipe(pgrp);
    void *bases[3];
    for (uint32_t r = 0; r < 3; r++) REFIT_ASSERT_OK(refit_publisher_alloc(p, r, &bases[r]));
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    char *rreg = scratch(g.url), *rjob = scratch(g.job), *rtr = scratch("shm"), *rrd = scratch("reader-1");
    rp.registry = rreg;
    rp.job = rjob;
    rp.transports = rtr;
    rp.reader = rrd;
    rp.verify = REFIT_VERIFY_TRUTH;
    refit_receiver_t *r;
    void *dbase;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, dm, &r));
    wipe(rreg), wipe(rjob), wipe(rtr), wipe(rrd);
    REFIT_ASSERT_OK(refit_receiver_alloc(r, 0, &dbase));
    for (uint64_t v = 1; v <= 2; v++) {
        REFIT_ASSERT_OK(refit_truth_fill(sm, bases, v));
        REFIT_ASSERT_OK(refit_publisher_publish(p, v));
        refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
        REFIT_ASSERT_OK(refit_receiver_pull(r, v, 5000, &rep));
        assert_int_equal(rep.version, v);
        REFIT_ASSERT_OK(refit_publisher_wait_acks(p, v, 1, 5000));
    }
    refit_receiver_destroy(r);
    refit_publisher_destroy(p);
    t_rm_tree(g.dir);
}

/* A relay publishes its regions and a progress region: one of REFIT_MAX_REGIONS regions is refused at
 * create (it used to fail at its first serve, in the middle of a pull), one fewer is taken. */
static void test_relay_region_limit(void **state)
{
    (void)state;
    reg_t g;
    reg_file(&g);
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g.url;
    rp.job = g.job;
    rp.transports = "shm";
    rp.relay_slot = 0;
    refit_manifest_t *m = many_regions(REFIT_MAX_REGIONS, false, 0); /* a region per tensor */
    refit_receiver_t *r;
    REFIT_ASSERT_ERR(refit_receiver_create(&rp, m, &r), REFIT_ERR_INVALID_ARG, "a relay serves at most 510");
    refit_manifest_destroy(m); /* the caller's on failure */
    m = many_regions(REFIT_MAX_REGIONS - 1, false, 0);
    REFIT_ASSERT_OK(refit_receiver_create(&rp, m, &r));
    refit_receiver_destroy(r);
    t_rm_tree(g.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_in_copies_by_size),
        cmocka_unit_test(test_params_in_refuses_other_sizes),
        cmocka_unit_test(test_init_macros_set_size_and_defaults),
        cmocka_unit_test(test_create_refuses_params_of_other_sizes),
        cmocka_unit_test(test_publisher_region_limit),
        cmocka_unit_test(test_many_regions_publish_and_pull),
        cmocka_unit_test(test_params_strings_freed_after_create),
        cmocka_unit_test(test_relay_region_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
