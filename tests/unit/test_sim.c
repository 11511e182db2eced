/* The simulator (tools/sim): max-min fair rates against their definition, the
 * cluster description, the fleet rules it shares with the engine, chunk and
 * fluid runs agreeing, planner threads not changing plans, the PNG writer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "engine/fleet/fleet.h"
#include "sim.h"

static sim_path_t path2(uint32_t a, double wa, uint32_t b, double wb)
{
    sim_path_t p;
    memset(&p, 0, sizeof(p));
    p.link[p.n] = a, p.w[p.n] = (float)wa, p.data[p.n++] = true;
    if (b != UINT32_MAX) p.link[p.n] = b, p.w[p.n] = (float)wb, p.data[p.n++] = true;
    return p;
}

static void maxmin_known(void **state)
{
    (void)state;
    sim_net_t *net;
    REFIT_ASSERT_OK(sim_net_create(&net));
    uint32_t A = sim_net_link(net, "A", SIM_LINK_NIC_TX, 10), B = sim_net_link(net, "B", SIM_LINK_NIC_TX, 20);
    sim_path_t p1 = path2(A, 1, UINT32_MAX, 0), p2 = path2(A, 1, B, 1), p3 = path2(B, 1, UINT32_MAX, 0);
    uint32_t f1 = sim_net_start(net, &p1, 1000, 0, 1, 0), f2 = sim_net_start(net, &p2, 1000, 0, 2, 0),
             f3 = sim_net_start(net, &p3, 1000, 0, 3, 0);
    sim_net_solve(net);
    assert_true(fabs(sim_net_flow(net, f1)->rate - 5) < 1e-9);
    assert_true(fabs(sim_net_flow(net, f2)->rate - 5) < 1e-9);
    assert_true(fabs(sim_net_flow(net, f3)->rate - 15) < 1e-9);
    /* Time to the first completion, and completion itself. */
    assert_true(fabs(sim_net_next(net) - 1000.0 / 15) < 1e-9);
    uint32_t done[4], nd = 0;
    sim_net_advance(net, 1000.0 / 15, 1e-12, done, 4, &nd);
    assert_int_equal(nd, 1);
    assert_int_equal(done[0], f3);
    sim_net_solve(net); /* f3 gone: f2 is still held to 5 by A */
    assert_true(fabs(sim_net_flow(net, f2)->rate - 5) < 1e-9);
    sim_net_destroy(net);
}

static void maxmin_weights_and_caps(void **state)
{
    (void)state;
    sim_net_t *net;
    REFIT_ASSERT_OK(sim_net_create(&net));
    uint32_t L = sim_net_link(net, "L", SIM_LINK_NIC_TX, 10);
    sim_path_t heavy = path2(L, 2, UINT32_MAX, 0), light = path2(L, 1, UINT32_MAX, 0);
    uint32_t f1 = sim_net_start(net, &heavy, 1e6, 0, 0, 0), f2 = sim_net_start(net, &light, 1e6, 0, 0, 0);
    sim_net_solve(net);
    assert_true(fabs(sim_net_flow(net, f1)->rate - 10.0 / 3) < 1e-9); /* 2r + r = 10 */
    assert_true(fabs(sim_net_flow(net, f2)->rate - 10.0 / 3) < 1e-9);
    sim_net_set_cap(net, f2, 1);
    sim_net_solve(net);
    assert_true(fabs(sim_net_flow(net, f2)->rate - 1) < 1e-9);
    assert_true(fabs(sim_net_flow(net, f1)->rate - 4.5) < 1e-9); /* (10 - 1) / 2 */
    sim_net_destroy(net);
}

static uint64_t g_rng = 88172645463325252ULL;
static uint32_t rnd(uint32_t n)
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

/* Random networks: every allocation must be feasible and max-min fair, i.e.
 * each flow is at its cap or crosses a full link on which no flow gets more
 * (rates compared per unit of weight on that link). */
static void maxmin_random(void **state)
{
    (void)state;
    for (int trial = 0; trial < 200; trial++) {
        sim_net_t *net;
        REFIT_ASSERT_OK(sim_net_create(&net));
        uint32_t nl = 2 + rnd(10), nf = 1 + rnd(30);
        for (uint32_t l = 0; l < nl; l++) sim_net_link(net, "x", SIM_LINK_NIC_TX, 1 + rnd(100));
        uint32_t ids[40];
        for (uint32_t i = 0; i < nf; i++) {
            sim_path_t p;
            memset(&p, 0, sizeof(p));
            uint32_t k = 1 + rnd(4);
            for (uint32_t j = 0; j < k; j++) {
                uint32_t l = rnd(nl);
                bool dup = false;
                for (uint32_t q = 0; q < p.n; q++) dup |= p.link[q] == l;
                if (dup) continue;
                p.link[p.n] = l;
                p.w[p.n] = (float)(rnd(3) ? 1.0 : 0.05 + rnd(100) / 50.0);
                p.data[p.n++] = true;
            }
            ids[i] = sim_net_start(net, &p, 1e9, rnd(4) ? 0 : 0.5 + rnd(40), i, 0);
        }
        sim_net_solve(net);
        uint32_t n;
        sim_link_t *lk = sim_net_links(net, &n);
        double load[16] = {0};
        for (uint32_t i = 0; i < nf; i++) {
            const sim_flow_t *f = sim_net_flow(net, ids[i]);
            assert_true(f->rate >= 0);
            if (f->cap > 0) assert_true(f->rate <= f->cap * (1 + 1e-9));
            for (uint32_t k = 0; k < f->path.n; k++) load[f->path.link[k]] += f->rate * f->path.w[k];
        }
        for (uint32_t l = 0; l < nl; l++) assert_true(load[l] <= lk[l].cap * (1 + 1e-9));
        for (uint32_t i = 0; i < nf; i++) {
            const sim_flow_t *f = sim_net_flow(net, ids[i]);
            if (f->cap > 0 && f->rate >= f->cap * (1 - 1e-9)) continue;
            bool bottleneck = false;
            for (uint32_t k = 0; k < f->path.n && !bottleneck; k++) {
                uint32_t l = f->path.link[k];
                if (load[l] < lk[l].cap * (1 - 1e-7)) continue;
                bool top = true;
                for (uint32_t j = 0; j < nf && top; j++) {
                    const sim_flow_t *g = sim_net_flow(net, ids[j]);
                    for (uint32_t q = 0; q < g->path.n; q++)
                        if (g->path.link[q] == l && g->rate > f->rate * (1 + 1e-7) + 1e-9) top = false;
                }
                bottleneck = top;
            }
            if (!bottleneck) fail_msg("trial %d: flow %u (rate %g) has no bottleneck", trial, i, f->rate);
        }
        sim_net_destroy(net);
    }
}

/* The tree rule the engine's receivers follow (receiver.c fleet_select, relay.c tokens). */
static void pick_rule(void **state)
{
    (void)state;
    assert_int_equal(refit_fleet_pick(0, 0, 0, false), REFIT_FLEET_PICK_ALL);
    assert_int_equal(refit_fleet_pick(0, 3, 3, false), REFIT_FLEET_PICK_ALL);
    assert_int_equal(refit_fleet_pick(2, 1, 4, false), REFIT_FLEET_PICK_RELAYS);
    assert_int_equal(refit_fleet_pick(2, 0, 0, false), REFIT_FLEET_PICK_TRAINER_IF_ROOM);
    assert_int_equal(refit_fleet_pick(2, 0, 3, false), REFIT_FLEET_PICK_WAIT);
    /* A receiver that read a relay last time leaves the trainer to the one that read it. */
    assert_int_equal(refit_fleet_pick(2, 0, 0, true), REFIT_FLEET_PICK_WAIT);
    assert_int_equal(refit_fleet_pick(2, 1, 1, true), REFIT_FLEET_PICK_RELAYS);
    assert_int_equal(refit_fleet_pick(0, 0, 0, true), REFIT_FLEET_PICK_ALL);
    assert_true(refit_fleet_room(5, 0));
    assert_true(refit_fleet_room(1, 2));
    assert_false(refit_fleet_room(2, 2));
}

static void cluster_parse(void **state)
{
    (void)state;
    sim_cluster_t *c = malloc(sizeof(*c));
    assert_non_null(c);
    sim_cluster_defaults(c);
    REFIT_ASSERT_OK(sim_cluster_apply(c, "nic=400Gb,nvlink=395GB,gpus=4,nics=2,rtt=20us,proto=tcp,mtu=1500,l2=14"));
    sim_cluster_finish(c);
    assert_true(fabs(c->nic - 50e9) < 1);
    assert_true(fabs(c->nvlink - 395e9) < 1);
    assert_int_equal(c->gpus, 4);
    assert_true(fabs(c->rtt - 20e-6) < 1e-12);
    assert_true(fabs(c->eff - 1448.0 / 1514.0) < 1e-12);
    assert_true(fabs(c->ack - 66.0 / (2 * 1448.0)) < 1e-12);
    sim_cluster_defaults(c);
    REFIT_ASSERT_OK(sim_cluster_apply(c, "{\"nic\": \"100MB\", \"gpus\": 1, \"dst_gpus\": [3, 4], \"first\": true}"));
    assert_true(fabs(c->nic - 1e8) < 1e-3);
    assert_int_equal(c->ndst_gpu, 2);
    assert_int_equal(c->dst_gpu[1], 4);
    assert_true(c->first);
    REFIT_ASSERT_ERR(sim_cluster_apply(c, "nic=400Gb,bogus=1"), REFIT_ERR_INVALID_ARG, "bogus");
    REFIT_ASSERT_ERR(sim_cluster_apply(c, "nic=fast"), REFIT_ERR_INVALID_ARG, "nic");
    free(c);
}

static sim_cluster_t *host_cluster_rtt(double rate_mb, const char *rtt)
{
    sim_cluster_t *c = malloc(sizeof(*c));
    assert_non_null(c);
    sim_cluster_defaults(c);
    char spec[200];
    snprintf(spec, sizeof(spec), "gpus=1,nics=1,nic=%gMB,nvlink=0,pcie=0,proto=tcp,mtu=1500,l2=14,rtt=%s", rate_mb,
             rtt);
    REFIT_ASSERT_OK(sim_cluster_apply(c, spec));
    sim_cluster_finish(c);
    return c;
}

static sim_cluster_t *host_cluster(double rate_mb) { return host_cluster_rtt(rate_mb, "100us"); }

/* No DP replica, no relay: every receiver pulls the plan directly, and four
 * of them share the one trainer node's link. */
static void direct_pulls_share_the_trainer(void **state)
{
    (void)state;
    sim_cluster_t *c = host_cluster(1000);
    sim_fleet_t f = SIM_FLEET_INIT;
    f.model = "qwen3-30b-a3b-mini";
    f.src = "megatron:tp=1";
    f.dst = "vllm:tp=4";
    f.only_rank = 0;
    f.replicas = 4;
    sim_result_t r;
    REFIT_ASSERT_OK(sim_fleet_run(&f, c, &r));
    for (uint32_t i = 0; i < r.receivers; i++) assert_true(r.rx[i].direct);
    double want = 4.0 * (double)r.rank_bytes_max / (1e9 * c->eff) + c->control * 1.5;
    assert_true(fabs(r.refit_s / want - 1) < 0.01);
    assert_string_equal(r.links[r.bottleneck].name, "nic-tx node0.0");
    assert_int_equal(r.trainer_egress, 4 * r.rank_bytes_max);
    sim_result_free(&r);
    free(c);
}

/* Relays (a chain with max_readers 1): the trainer sends one copy; the chunk
 * replay and the fluid model agree. */
static void relays_chunks_and_fluid_agree(void **state)
{
    (void)state;
    sim_cluster_t *c = host_cluster(1000);
    sim_fleet_t f = SIM_FLEET_INIT;
    f.model = "qwen3-30b-a3b-mini";
    f.src = "megatron:tp=1";
    f.dst = "vllm:tp=4";
    f.only_rank = 0;
    f.replicas = 4;
    f.relays = true;
    f.max_readers = 1;
    f.workers = 1;
    f.mode = SIM_MODE_CHUNKS;
    sim_result_t a, b;
    REFIT_ASSERT_OK(sim_fleet_run(&f, c, &a));
    f.mode = SIM_MODE_FLUID;
    REFIT_ASSERT_OK(sim_fleet_run(&f, c, &b));
    assert_int_equal(a.mode, SIM_MODE_CHUNKS);
    assert_int_equal(b.mode, SIM_MODE_FLUID);
    assert_int_equal(a.trainer_egress, a.rank_bytes_max); /* one copy leaves the trainer */
    assert_int_equal(b.trainer_egress, b.rank_bytes_max);
    double one = (double)a.rank_bytes_max / (1e9 * c->eff);
    assert_true(a.refit_s < 1.2 * one); /* a chain pipelines: nowhere near 4x */
    if (fabs(a.refit_s / b.refit_s - 1) > 0.05) fail_msg("chunks %.4f s, fluid %.4f s", a.refit_s, b.refit_s);
    /* Deterministic. */
    sim_result_t a2;
    f.mode = SIM_MODE_CHUNKS;
    REFIT_ASSERT_OK(sim_fleet_run(&f, c, &a2));
    assert_true(a2.refit_s == a.refit_s);
    sim_result_free(&a);
    sim_result_free(&a2);
    sim_result_free(&b);
    free(c);
}

/* A chain over a network transport: a reader asks its relay for the next
 * chunks before the relay has them (conditional requests, the engine's
 * refit_fleet_claim_ahead), so each hop ends within a chunk and two round
 * trips of the one before (17-32 ms here); with a progress read and then a
 * request per chunk, as the model had it before, hops were 54-138 ms apart.
 * A long round trip makes the difference plain. */
static void chain_hops_follow_by_one_chunk(void **state)
{
    (void)state;
    sim_cluster_t *c = host_cluster_rtt(1000, "20ms");
    sim_fleet_t f = SIM_FLEET_INIT;
    f.model = "qwen3-30b-a3b-mini";
    f.src = "megatron:tp=1";
    f.dst = "vllm:tp=4";
    f.only_rank = 0;
    f.replicas = 6;
    f.relays = true;
    f.max_readers = 1;
    f.mode = SIM_MODE_CHUNKS;
    sim_result_t r;
    REFIT_ASSERT_OK(sim_fleet_run(&f, c, &r));
    assert_int_equal(r.receivers, 6);
    double end[6];
    for (uint32_t i = 0; i < 6; i++) end[i] = r.rx[i].end;
    for (uint32_t i = 1; i < 6; i++) /* sort: the chain's order */
        for (uint32_t j = i; j > 0 && end[j] < end[j - 1]; j--) {
            double t = end[j];
            end[j] = end[j - 1];
            end[j - 1] = t;
        }
    double chunk_s = 2048.0 * 1024 / (1e9 * c->eff);
    for (uint32_t i = 1; i < 6; i++) {
        double lag = end[i] - end[i - 1];
        if (lag > chunk_s + 2 * c->rtt)
            fail_msg("hop %u ends %.1f ms after the one before (chunk %.1f ms, rtt %.0f ms)", i, lag * 1e3,
                     chunk_s * 1e3, c->rtt * 1e3);
    }
    sim_result_free(&r);
    free(c);
}

/* DP replicas share a receiver's chunks equally (the egress rule); a slow
 * replica loses its share to the fast one (stealing), in both modes. */
static void replicas_share_and_steal(void **state)
{
    (void)state;
    sim_cluster_t *c = host_cluster(100);
    sim_fleet_t f = SIM_FLEET_INIT;
    f.model = "qwen3-30b-a3b-mini";
    f.src = "megatron:tp=1,dp=4";
    f.dst = "vllm:tp=2";
    f.replicas = 2;
    f.workers = 1;
    sim_result_t r;
    REFIT_ASSERT_OK(sim_fleet_run(&f, c, &r));
    double mean = 0, dev = 0;
    for (uint32_t l = 0; l < 4; l++) mean += r.links[2 * l].payload / 4; /* nic-tx of trainer nodes 0..3 */
    for (uint32_t l = 0; l < 4; l++) dev = fmax(dev, fabs(r.links[2 * l].payload / mean - 1));
    assert_true(dev < 0.05);
    sim_result_free(&r);
    double src_rate[2] = {0, 10e6};
    f.src = "megatron:tp=1,dp=2";
    f.dst = "vllm:tp=4";
    f.only_rank = 0;
    f.replicas = 1;
    f.src_rate = src_rate;
    for (int m = 0; m < 2; m++) {
        f.mode = m ? SIM_MODE_FLUID : SIM_MODE_CHUNKS;
        REFIT_ASSERT_OK(sim_fleet_run(&f, c, &r));
        double ideal = (double)r.rank_bytes_max / (110e6 * c->eff); /* both replicas' rates together */
        if (r.refit_s > 1.25 * ideal)
            fail_msg("mode %d: %.2f s with a slow replica (ideal %.2f s)", m, r.refit_s, ideal);
        sim_result_free(&r);
    }
    free(c);
}

/* A delta refit moves the payloads of the chunks the plan reads. */
static void delta_moves_less(void **state)
{
    (void)state;
    sim_cluster_t *c = host_cluster(100);
    sim_fleet_t f = SIM_FLEET_INIT;
    f.model = "qwen3-30b-a3b-mini";
    f.src = "megatron:ep=2";
    f.dst = "vllm:tp=2";
    f.only_rank = 0;
    f.delta = 0.01;
    sim_result_t r;
    REFIT_ASSERT_OK(sim_fleet_run(&f, c, &r));
    assert_true(r.wire_bytes > r.rank_bytes_max / 100);
    assert_true(r.wire_bytes < r.rank_bytes_max / 20);
    sim_result_free(&r);
    free(c);
}

static void planner_threads(void **state)
{
    (void)state;
    sim_plan_scale_t one, two, other;
    REFIT_ASSERT_OK(sim_plan_scale("tiny-moe", "megatron:tp=2,ep=4", "vllm:tp=4,ep=4", 1, &one));
    REFIT_ASSERT_OK(sim_plan_scale("tiny-moe", "megatron:tp=2,ep=4", "vllm:tp=4,ep=4", 3, &two));
    REFIT_ASSERT_OK(sim_plan_scale("tiny-moe", "megatron:tp=2,ep=4", "vllm:tp=2", 3, &other));
    assert_int_equal(one.dst_world, 4);
    assert_true(one.digest == two.digest);
    assert_true(one.digest != other.digest);
    assert_int_equal(one.redundant, 0);
    REFIT_ASSERT_ERR(sim_plan_scale("tiny-moe", "megatron:tp=2,ep=4", "vllm:tp=3", 2, &other), REFIT_ERR_GEOMETRY, "");
}

static void png_file(void **state)
{
    (void)state;
    uint8_t px[4 * 3 * 3];
    for (size_t i = 0; i < sizeof(px); i++) px[i] = (uint8_t)(i * 37);
    char path[] = "/tmp/refit-test-sim-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    REFIT_ASSERT_OK(sim_png_write(path, px, 4, 3));
    FILE *f = fopen(path, "rb");
    uint8_t head[24];
    assert_int_equal(fread(head, 1, 24, f), 24);
    fclose(f);
    unlink(path);
    assert_memory_equal(head, "\x89PNG\r\n\x1a\n", 8);
    assert_memory_equal(head + 12, "IHDR", 4);
    assert_int_equal(head[19], 4); /* width */
    assert_int_equal(head[23], 3); /* height */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(maxmin_known),
        cmocka_unit_test(maxmin_weights_and_caps),
        cmocka_unit_test(maxmin_random),
        cmocka_unit_test(pick_rule),
        cmocka_unit_test(cluster_parse),
        cmocka_unit_test(direct_pulls_share_the_trainer),
        cmocka_unit_test(relays_chunks_and_fluid_agree),
        cmocka_unit_test(chain_hops_follow_by_one_chunk),
        cmocka_unit_test(replicas_share_and_steal),
        cmocka_unit_test(delta_moves_less),
        cmocka_unit_test(planner_threads),
        cmocka_unit_test(png_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
