/* The ucx transport: publishers and receivers in one process, in forked
 * processes, and across two network namespaces; strided plans checked byte
 * by byte against the memcpy executor; dead publishers, deadlines, ticks,
 * require=rdma.
 *
 * The binary also has helper modes used by the namespace test (and by
 * bench/ucx_tcp.c's twin modes):
 *   test_ucx --publish SIZE SEED OPTIONS   exposes SIZE bytes of pattern SEED,
 *                                           prints the descriptor in hex,
 *                                           serves until stdin closes
 *   test_ucx --receive HEXDESC SIZE SEED OPTIONS
 *                                           pulls it all, checks every byte,
 *                                           prints the lanes; exit 0 if right */
#include "testutil.h"
#include "plan/plan.h"
#include "transport/transport.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef REFIT_HAVE_UCX

static const refit_transport_ops_t *ops = &refit_transport_ucx;

/* ---- patterns ---------------------------------------------------------- */

static void fill(void *p, uint64_t size, uint64_t seed)
{
    unsigned char *b = p;
    uint64_t k = 0;
    for (; k + 8 <= size; k += 8) {
        uint64_t w = refit_mix64(seed * 0x9e3779b97f4a7c15ULL + k / 8);
        memcpy(b + k, &w, 8);
    }
    for (; k < size; k++) b[k] = (unsigned char)(refit_mix64(seed * 0x9e3779b97f4a7c15ULL + k / 8) >> (8 * (k % 8)));
}

static void *big_alloc(uint64_t size)
{
    void *p = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    return p;
}

static void big_free(void *p, uint64_t size) { munmap(p, size ? size : 1); }

/* ---- hand-made plans --------------------------------------------------- */

static refit_plan_t *plan_new(size_t nsrcs)
{
    refit_plan_t *p = calloc(1, sizeof(*p));
    assert_non_null(p);
    p->nsrcs = nsrcs;
    p->src_bytes = calloc(nsrcs, sizeof(uint64_t));
    assert_non_null(p->src_bytes);
    return p;
}

static void plan_add(refit_plan_t *p, refit_plan_region_t r)
{
    assert_int_equal(REFIT_VEC_PUSH(&p->regions, r), 0);
    p->src_bytes[r.src] += refit_plan_region_bytes(&r);
    p->stats.bytes_written += refit_plan_region_bytes(&r);
    p->stats.regions++;
}

static refit_plan_region_t R(uint32_t src, uint32_t sreg, uint32_t dreg, uint64_t so, uint64_t dof, uint64_t run)
{
    return (refit_plan_region_t){.src = src, .src_region = sreg, .dst_region = dreg, .src_offset = so,
                                 .dst_offset = dof, .run = run};
}

static refit_plan_region_t loop(refit_plan_region_t r, uint64_t count, uint64_t ss, uint64_t ds)
{
    r.count[r.nloops] = count;
    r.src_stride[r.nloops] = ss;
    r.dst_stride[r.nloops] = ds;
    r.nloops++;
    return r;
}

/* ---- in-process publishers -------------------------------------------- */

typedef struct {
    refit_transport_t *t;
    uint32_t n;
    void *base[4];
    uint64_t size[4];
    void *desc[4];
    size_t len[4];
} pub_t;

static void pub_open(pub_t *p, const char *opts, uint32_t n, const uint64_t *sizes, uint64_t seed)
{
    memset(p, 0, sizeof(*p));
    REFIT_ASSERT_OK(ops->create(opts, &p->t));
    p->n = n;
    for (uint32_t i = 0; i < n; i++) {
        p->size[i] = sizes[i];
        p->base[i] = big_alloc(sizes[i]);
        fill(p->base[i], sizes[i], seed + i);
        REFIT_ASSERT_OK(ops->expose(p->t, p->base[i], sizes[i], &p->desc[i], &p->len[i]));
    }
}

static void pub_close(pub_t *p)
{
    for (uint32_t i = 0; i < p->n; i++) {
        ops->unexpose(p->t, p->base[i]);
        big_free(p->base[i], p->size[i]);
        free(p->desc[i]);
    }
    ops->destroy(p->t);
}

static refit_peer_t *pub_connect(refit_transport_t *rt, const pub_t *p)
{
    refit_peer_t *peer = NULL;
    REFIT_ASSERT_OK(ops->connect(rt, (const void *const *)p->desc, p->len, p->n, &peer));
    return peer;
}

/* Pulls `plan` from the publishers and compares with the memcpy executor. */
static void pull_and_check(refit_transport_t *rt, refit_peer_t *const *peers, pub_t *const *pubs, size_t npubs,
                           const refit_plan_t *plan, const uint64_t *dst_sizes, uint32_t ndst,
                           refit_pull_stats_t *stats)
{
    void *got[4], *want[4];
    const void *sb[4][4];
    const void *const *src_bases[4];
    for (size_t s = 0; s < npubs; s++) {
        for (uint32_t r = 0; r < pubs[s]->n; r++) sb[s][r] = pubs[s]->base[r];
        src_bases[s] = sb[s];
    }
    for (uint32_t d = 0; d < ndst; d++) {
        got[d] = big_alloc(dst_sizes[d]);
        want[d] = big_alloc(dst_sizes[d]);
        memset(got[d], 0xee, dst_sizes[d]);
        memset(want[d], 0xee, dst_sizes[d]);
    }
    REFIT_ASSERT_OK(refit_plan_execute_memcpy(plan, src_bases, want, 2));
    refit_pull_ctl_t ctl = {.deadline = refit_now() + 60};
    REFIT_ASSERT_OK(ops->pull(rt, peers, plan, got, &ctl, stats));
    for (uint32_t d = 0; d < ndst; d++) {
        if (memcmp(got[d], want[d], dst_sizes[d])) {
            const unsigned char *g = got[d], *w = want[d];
            uint64_t i = 0;
            while (g[i] == w[i]) i++;
            fail_msg("destination region %u differs first at byte %" PRIu64 " (got %02x want %02x)", d, i, g[i], w[i]);
        }
        big_free(got[d], dst_sizes[d]);
        big_free(want[d], dst_sizes[d]);
    }
}

/* Strided regions of every shape, two sources (one with two regions), two
 * destination regions; small chunks so long runs are split and short ones
 * batched. */
static void strided_two_sources(void **state)
{
    (void)state;
    pub_t a, b;
    uint64_t as[] = {(1u << 20) + 13, 3u << 20}, bs[] = {6u << 20};
    pub_open(&a, "listen=127.0.0.1", 2, as, 100);
    pub_open(&b, NULL, 1, bs, 200);
    refit_transport_t *rt;
    REFIT_ASSERT_OK(ops->create("chunk=256K,inflight=3", &rt));
    refit_peer_t *peers[2] = {pub_connect(rt, &a), pub_connect(rt, &b)};

    refit_plan_t *plan = plan_new(2);
    /* dst 0: [0, 3M) a long run split into chunks */
    plan_add(plan, R(0, 1, 0, 5, 7, (3u << 20) - 100));
    /* dst 0: [3.5M, ..) 1000 runs of 3 bytes, strides 7 / 5 */
    plan_add(plan, loop(R(0, 0, 0, 11, (7u << 19), 3), 1000, 7, 5));
    /* dst 0: three loops, innermost rows adjacent on both sides (coalesce) */
    plan_add(plan, loop(loop(loop(R(0, 0, 0, 9000, (4u << 20), 16), 4, 16, 16), 3, 100, 64), 5, 1000, 256));
    /* dst 1: rows of 100000 bytes every 200000 from b */
    plan_add(plan, loop(R(1, 0, 1, 1, 0, 100000), 20, 200000, 100000));
    /* dst 1: a whole region's tail from a region 0, odd sizes */
    plan_add(plan, R(0, 0, 1, 1000, 2100000, (1u << 20) + 13 - 1000));
    /* dst 1: rows that coalesce into one run */
    plan_add(plan, loop(R(1, 0, 1, (5u << 20), 3200000, 64), 100, 64, 64));
    uint64_t ds[] = {5u << 20, 4u << 20};
    refit_pull_stats_t stats = {0};
    pub_t *pubs[] = {&a, &b};
    pull_and_check(rt, peers, pubs, 2, plan, ds, 2, &stats);
    print_message("lanes: %s, %" PRIu64 " bytes, %" PRIu64 " requests\n", stats.lanes, stats.bytes, stats.requests);
    assert_true(strncmp(stats.lanes, "ucx:", 4) == 0);
    assert_true(stats.bytes > 0);
    refit_plan_destroy(plan);
    ops->disconnect(peers[0]);
    ops->disconnect(peers[1]);
    ops->destroy(rt);
    pub_close(&a);
    pub_close(&b);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(strided_two_sources),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void)
{
    printf("test_ucx: skipped: refit was built without UCX (install libucx-dev and reconfigure)\n");
    return 0;
}

#endif
