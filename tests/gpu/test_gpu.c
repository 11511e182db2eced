/* GPU tests (need a CUDA device; exit 77 = skipped otherwise):
 *  - the truth kernels write what refit_truth_fill writes and find every
 *    wrong byte; the digest kernel agrees with the CPU;
 *  - the batch copy kernel executes plans (copies and fills, 16-byte and
 *    narrow accesses) byte for byte;
 *  - the engine end to end in one process over cuda_ipc: GPU -> GPU (a
 *    second GPU when there is one), GPU -> host (mapped), host (shm) -> GPU
 *    (pinned staging); steady state is one kernel launch per refit.
 * Multi-process CUDA IPC runs in test_gpu_demo.sh.
 *
 * Self-contained (no cmocka), so that it builds on GPU machines without the
 * test libraries. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "refit/experimental/all.h"
#include "layout/manifest.h"
#include "plan/batch.h"
#include "tool_local.h"
#include "plan/plan.h"
#include "truth/truth_table.h"
#include "util/util.h"
#ifdef REFIT_HAVE_CUDA
#include "transport/cuda/gpu.h"

#include "gputest.h"


static int g_dst_dev; /* 1 with two GPUs, else 0 */

static void truth_case(const char *model, const char *spec)
{
    refit_model_t *md = t_model(model);
    refit_layout_t *lay = t_layout(spec);
    for (uint32_t r = 0; r < refit_layout_world(lay); r++) {
        refit_manifest_t *m = t_manifest(md, spec, r);
        uint64_t size = refit_manifest_region_size(m, 0);
        void *d = gpu_arena(0, m), *cpu = calloc(1, size);
        REFIT_ASSERT_OK(refit_gpu_truth_fill(m, 0, &d, 5));
        REFIT_ASSERT_OK(refit_truth_fill(m, &cpu, 5));
        unsigned char *h = host_copy(d, size);
        for (uint32_t li = 0; li < refit_manifest_num_locals(m); li++) {
            refit_tensor_info_t info;
            uint32_t reg;
            uint64_t off;
            refit_manifest_local(m, li, &info, &reg, &off);
            assert_memory_equal(h + off, (char *)cpu + off, refit_tensor_nbytes(&info));
        }
        refit_truth_report_t rep = REFIT_TRUTH_REPORT_INIT;
        REFIT_ASSERT_OK(refit_gpu_truth_verify(m, 0, (const void *const *)&d, 5, &rep));
        assert_int_equal(rep.mismatches, 0);
        REFIT_ASSERT_ERR(refit_gpu_truth_verify(m, 0, (const void *const *)&d, 6, &rep), REFIT_ERR_VERIFY, "wrong");
        assert_true(rep.mismatches > rep.elements_checked / 2);
        /* one flipped bit in the last tensor's last byte */
        refit_tensor_info_t info;
        uint32_t reg;
        uint64_t off;
        refit_manifest_local(m, refit_manifest_num_locals(m) - 1, &info, &reg, &off);
        uint64_t at = off + refit_tensor_nbytes(&info) - 1;
        h[at] ^= 0x10;
        REFIT_ASSERT_OK(refit_gpu_copy((char *)d + at, h + at, 1));
        REFIT_ASSERT_ERR(refit_gpu_truth_verify(m, 0, (const void *const *)&d, 5, &rep), REFIT_ERR_VERIFY, "expected");
        assert_int_equal(rep.mismatches, 1);
        uint64_t dg = 0;
        REFIT_ASSERT_OK(refit_gpu_digest(0, d, size, &dg));
        assert_int_equal(dg, refit_digest_host(h, size));
        REFIT_ASSERT_OK(refit_gpu_digest(0, d, size - 3, &dg));
        assert_int_equal(dg, refit_digest_host(h, size - 3));
        free(h);
        free(cpu);
        refit_gpu_free(d);
        refit_manifest_destroy(m);
    }
    refit_layout_destroy(lay);
    refit_model_destroy(md);
}

static void test_truth(void **state)
{
    (void)state;
    truth_case("tiny-moe", "megatron:tp=2,ep=2");
    truth_case("tiny-dense", "megatron:tp=2");
    truth_case("tiny-mla", "vllm:tp=2");
}

static void batch_case(const char *model, const char *src_spec, const char *dst_spec, uint32_t max_shift)
{
    refit_model_t *md = t_model(model);
    refit_layout_t *sl = t_layout(src_spec), *dl = t_layout(dst_spec);
    uint32_t ns = refit_layout_world(sl);
    refit_manifest_t **sm = calloc(ns, sizeof(void *));
    void **sa = calloc(ns, sizeof(void *));
    for (uint32_t s = 0; s < ns; s++) {
        sm[s] = t_manifest(md, src_spec, s);
        sa[s] = gpu_arena(0, sm[s]);
        REFIT_ASSERT_OK(refit_gpu_truth_fill(sm[s], 0, &sa[s], 9));
    }
    for (uint32_t r = 0; r < refit_layout_world(dl); r++) {
        refit_manifest_t *dm = t_manifest(md, dst_spec, r);
        refit_plan_t *plan;
        REFIT_ASSERT_OK(refit_plan_create((const refit_manifest_t *const *)sm, ns, dm, NULL, &plan));
        refit_batch_opts_t o = {.max_shift = max_shift, .copies = true, .fills = true, .chunk_bytes = 8192};
        refit_batch_t b;
        REFIT_ASSERT_OK(refit_batch_build(plan, &o, &b));
        void *d = gpu_arena(g_dst_dev, dm);
        /* poison, so that a byte nobody writes is caught */
        uint64_t size = refit_manifest_region_size(dm, 0);
        void *poison = malloc(size);
        memset(poison, 0xee, size);
        REFIT_ASSERT_OK(refit_gpu_copy(d, poison, size));
        free(poison);
        uint64_t *slots = calloc(b.nslots, sizeof(uint64_t));
        for (uint32_t s = 0; s < ns; s++)
            for (uint32_t k = b.src_slot_base[s]; k < b.src_slot_base[s + 1]; k++)
                slots[k] = (uint64_t)(uintptr_t)sa[s];
        for (uint32_t k = b.dst_slot_base; k < b.nslots; k++) slots[k] = (uint64_t)(uintptr_t)d;
        refit_gpu_batch_t *g;
        REFIT_ASSERT_OK(refit_gpu_enable_peer(g_dst_dev, 0)); /* the kernel on the destination reads GPU 0 */
        REFIT_ASSERT_OK(refit_gpu_batch_create(g_dst_dev, &b, &g));
        uint64_t launches = 0, uploads = 0;
        REFIT_ASSERT_OK(refit_gpu_batch_launch(g, slots, &launches, &uploads));
        REFIT_ASSERT_OK(refit_gpu_batch_wait(g, NULL, NULL, 0));
        REFIT_ASSERT_OK(refit_gpu_batch_launch(g, slots, &launches, &uploads)); /* same slots: no upload */
        REFIT_ASSERT_OK(refit_gpu_batch_wait(g, NULL, NULL, 0));
        assert_int_equal(launches, b.nchunks ? 2 : 0);
        assert_int_equal(uploads, 1);
        REFIT_ASSERT_OK(refit_gpu_truth_verify(dm, g_dst_dev, (const void *const *)&d, 9, NULL));
        refit_gpu_batch_destroy(g);
        free(slots);
        refit_gpu_free(d);
        refit_batch_free(&b);
        refit_plan_destroy(plan);
        refit_manifest_destroy(dm);
    }
    for (uint32_t s = 0; s < ns; s++) {
        refit_gpu_free(sa[s]);
        refit_manifest_destroy(sm[s]);
    }
    free(sm);
    free(sa);
    refit_layout_destroy(sl);
    refit_layout_destroy(dl);
    refit_model_destroy(md);
}

static void test_batch(void **state)
{
    (void)state;
    batch_case("tiny-moe", "megatron:ep=2", "vllm:tp=2", 4);
    batch_case("tiny-moe", "megatron:ep=2", "vllm:tp=2", 0);
    batch_case("tiny-moe", "hf", "megatron:tp=4", 4); /* padding: fills */
    batch_case("tiny-mla", "megatron:tp=2", "vllm:tp=2", 3);
    batch_case("qwen3-30b-a3b-mini", "megatron:ep=8", "vllm:tp=2", 4);
}


/* Publishers of src_spec (device src_dev, -1 host over shm) and one receiver
 * per destination rank (device dst_dev, -1 host), all in this process. */
/* A GPU publisher's memory changed after its table was made: a fresh receiver refuses version v (before it is
 * retired). */
static void scribbled_refused(const reg_t *g, const char *model, const char *dst_spec, int dst_dev, void *pb0,
                              uint64_t v)
{
    unsigned char byte;
    REFIT_ASSERT_OK(refit_gpu_copy(&byte, (unsigned char *)pb0 + 64, 1));
    byte ^= 0x10;
    REFIT_ASSERT_OK(refit_gpu_copy((unsigned char *)pb0 + 64, &byte, 1));
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g->url;
    rp.job = g->job;
    rp.device = dst_dev;
    rp.reader = "scribbled";
    rp.transports = "cuda_ipc";
    if (dst_dev < 0) rp.transport_options = "cuda_ipc.device=0";
    refit_receiver_t *late;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(model, dst_spec, 0), &late));
    void *lb;
    REFIT_ASSERT_OK(refit_receiver_alloc(late, 0, &lb));
    REFIT_ASSERT_ERR(refit_receiver_pull(late, v, 20000, NULL), REFIT_ERR_VERIFY,
                     "does not match what its publishers published");
    refit_receiver_destroy(late);
    byte ^= 0x10;
    REFIT_ASSERT_OK(refit_gpu_copy((unsigned char *)pb0 + 64, &byte, 1));
}

static void engine_case(const char *model, const char *src_spec, int src_dev, const char *dst_spec, int dst_dev,
                        bool expect_one_launch)
{
    reg_t g;
    reg_file(&g);
    refit_layout_t *sl = t_layout(src_spec), *dl = t_layout(dst_spec);
    uint32_t ns = refit_layout_world(sl), nd = refit_layout_world(dl);
    refit_publisher_t **pub = calloc(ns, sizeof(void *));
    refit_manifest_t **pm = calloc(ns, sizeof(void *));
    void **pb = calloc(ns, sizeof(void *));
    for (uint32_t s = 0; s < ns; s++) {
        refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
        pp.registry = g.url;
        pp.job = g.job;
        pp.device = src_dev;
        pp.transports = src_dev >= 0 ? "cuda_ipc" : "shm";
        pm[s] = t_manifest_named(model, src_spec, s);
        REFIT_ASSERT_OK(refit_publisher_create(&pp, pm[s], &pub[s]));
        REFIT_ASSERT_OK(refit_publisher_alloc(pub[s], 0, &pb[s]));
    }
    refit_receiver_t **rx = calloc(nd, sizeof(void *));
    void **rb = calloc(nd, sizeof(void *));
    refit_manifest_t **rm = calloc(nd, sizeof(void *));
    for (uint32_t r = 0; r < nd; r++) {
        refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
        rp.registry = g.url;
        rp.job = g.job;
        rp.verify = REFIT_VERIFY_TRUTH;
        rp.device = dst_dev;
        rp.transports = src_dev >= 0 ? "cuda_ipc" : "shm";
        if (src_dev >= 0 && dst_dev < 0) rp.transport_options = "cuda_ipc.device=0";
        REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(model, dst_spec, r), &rx[r]));
        REFIT_ASSERT_OK(refit_receiver_alloc(rx[r], 0, &rb[r]));
        rm[r] = t_manifest_named(model, dst_spec, r);
    }
    for (uint64_t v = 1; v <= 3; v++) {
        for (uint32_t s = 0; s < ns; s++) {
            if (src_dev >= 0) REFIT_ASSERT_OK(refit_gpu_truth_fill(pm[s], src_dev, &pb[s], v));
            else REFIT_ASSERT_OK(refit_truth_fill(pm[s], &pb[s], v));
            REFIT_ASSERT_OK(refit_publisher_publish(pub[s], v));
        }
        for (uint32_t r = 0; r < nd; r++) {
            refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
            REFIT_ASSERT_OK(refit_receiver_pull(rx[r], v, 20000, &rep));
            assert_int_equal(rep.version, v);
            assert_true(rep.bytes > 0);
            assert_true(rep.end_s >= rep.begin_s && rep.begin_s > 0);
            if (v > 1) assert_false(rep.planned);
            /* The path: GPU memory a transport writes (cuda_ipc) is the GPU path; host memory,
             * or GPU memory fed over shm (through its staging), the host path, direct over shm. */
            if (dst_dev >= 0 && src_dev >= 0) assert_int_equal(rep.path, REFIT_RX_PATH_GPU_DIRECT);
            else if (src_dev < 0) assert_int_equal(rep.path, REFIT_RX_PATH_HOST_DIRECT);
            else assert_true(rep.path == REFIT_RX_PATH_HOST_DIRECT || rep.path == REFIT_RX_PATH_HOST_FLEET);
            if (v > 1 && expect_one_launch)
                assert_true(rep.launches >= 1 && rep.launches <= 2); /* the copy, and fills if any */
            /* Every byte checked against the publishers' content digests, GPU memory too (GPU publishers'
             * tables and a GPU receiver's sums by the GPU's kernels). */
            if (rep.unverified_bytes != 0 || rep.digest_bytes == 0)
                FAIL("%s -> %s v%llu rank %u: %llu bytes checked against digests, %llu unverified", src_spec, dst_spec,
                     (unsigned long long)v, r, (unsigned long long)rep.digest_bytes,
                     (unsigned long long)rep.unverified_bytes);
            /* independent proof, outside the engine */
            if (dst_dev >= 0)
                REFIT_ASSERT_OK(refit_gpu_truth_verify(rm[r], dst_dev, (const void *const *)&rb[r], v, NULL));
            else REFIT_ASSERT_OK(refit_truth_verify(rm[r], (const void *const *)&rb[r], v, NULL));
            printf("  %s -> %s v%llu rank %u: %llu bytes, %llu launches, transfer %.2f ms, %s\n", src_spec, dst_spec,
                   (unsigned long long)v, r, (unsigned long long)rep.bytes, (unsigned long long)rep.launches,
                   rep.transfer_ms, rep.lanes);
        }
        if (src_dev >= 0 && v == 3) scribbled_refused(&g, model, dst_spec, dst_dev, pb[0], v);
        for (uint32_t s = 0; s < ns; s++) REFIT_ASSERT_OK(refit_publisher_wait_readers(pub[s], v, 10000));
    }
    for (uint32_t r = 0; r < nd; r++) {
        refit_receiver_destroy(rx[r]);
        refit_manifest_destroy(rm[r]);
    }
    for (uint32_t s = 0; s < ns; s++) refit_publisher_destroy(pub[s]);
    free(rx);
    free(rb);
    free(rm);
    free(pub);
    free(pm);
    free(pb);
    refit_layout_destroy(sl);
    refit_layout_destroy(dl);
    t_rm_tree(g.dir);
}

/* Host-memory publishers of every rank of src_spec over shm (delta mode or
 * not), in this process (at most 8 ranks). */
typedef struct {
    refit_publisher_t *pub[8];
    refit_manifest_t *m[8];
    void *base[8];
    uint32_t n;
} host_pubs_t;

static void host_pubs_start(host_pubs_t *h, const reg_t *g, const char *model, const char *src_spec, bool delta)
{
    refit_layout_t *sl = t_layout(src_spec);
    h->n = refit_layout_world(sl);
    refit_layout_destroy(sl);
    assert_true(h->n <= 8);
    for (uint32_t s = 0; s < h->n; s++) {
        refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
        pp.registry = g->url;
        pp.job = g->job;
        pp.transports = "shm";
        pp.delta = delta;
        h->m[s] = t_manifest_named(model, src_spec, s);
        REFIT_ASSERT_OK(refit_publisher_create(&pp, h->m[s], &h->pub[s]));
        REFIT_ASSERT_OK(refit_publisher_alloc(h->pub[s], 0, &h->base[s]));
    }
}

static void host_pubs_stop(host_pubs_t *h)
{
    for (uint32_t s = 0; s < h->n; s++) refit_publisher_destroy(h->pub[s]);
}

/* Delta refit into GPU memory: host publishers offer deltas over shm; the
 * GPU receiver's pulls go through its pinned staging, so the delta applies
 * there and the staging goes up.  Every version checked on the host against
 * the change-fraction truth; versions 2.. must be deltas of a few percent. */
static void engine_delta_case(const char *model, const char *src_spec, const char *dst_spec, int dst_dev)
{
    const double f = 0.02;
    reg_t g;
    reg_file(&g);
    host_pubs_t h;
    host_pubs_start(&h, &g, model, src_spec, true);
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g.url;
    rp.job = g.job;
    rp.device = dst_dev;
    rp.transports = "shm";
    refit_receiver_t *rx;
    void *rb;
    refit_manifest_t *rm = t_manifest_named(model, dst_spec, 0);
    REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(model, dst_spec, 0), &rx));
    REFIT_ASSERT_OK(refit_receiver_alloc(rx, 0, &rb));
    uint64_t size = refit_manifest_region_size(rm, 0), full = 0;
    void *host = malloc(size);
    assert_non_null(host);
    for (uint64_t v = 1; v <= 4; v++) {
        for (uint32_t s = 0; s < h.n; s++) {
            REFIT_ASSERT_OK(refit_truth_fill_delta(h.m[s], &h.base[s], v, f));
            REFIT_ASSERT_OK(refit_publisher_publish(h.pub[s], v));
        }
        refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
        REFIT_ASSERT_OK(refit_receiver_pull(rx, v, 20000, &rep));
        if (v == 1) full = rep.bytes;
        /* v1 in full through the staging (the host path over shm), then deltas applied there. */
        assert_int_equal(rep.path, v == 1 ? REFIT_RX_PATH_HOST_DIRECT : REFIT_RX_PATH_DELTA);
        if (rep.delta_base != v - 1 || (v > 1 && rep.bytes * 5 >= full)) /* 2%: 4 bytes a change, whole chunks */
            FAIL("version %llu: %llu bytes (full %llu), delta from %llu, lanes %s", (unsigned long long)v,
                 (unsigned long long)rep.bytes, (unsigned long long)full, (unsigned long long)rep.delta_base,
                 rep.lanes);
        REFIT_ASSERT_OK(refit_gpu_copy(host, rb, size));
        REFIT_ASSERT_OK(refit_truth_verify_delta(rm, (const void *const *)&host, v, f, NULL));
        printf("  delta into GPU %d: %s -> %s v%llu: %llu bytes (delta from %llu), transfer %.2f ms, %s\n", dst_dev,
               src_spec, dst_spec, (unsigned long long)v, (unsigned long long)rep.bytes,
               (unsigned long long)rep.delta_base, rep.transfer_ms, rep.lanes);
        for (uint32_t s = 0; s < h.n; s++) REFIT_ASSERT_OK(refit_publisher_wait_readers(h.pub[s], v, 10000));
    }
    free(host);
    refit_receiver_destroy(rx);
    refit_manifest_destroy(rm);
    host_pubs_stop(&h);
    t_rm_tree(g.dir);
}

/* Relays on GPU receivers: host publishers over shm, two GPU receivers of
 * the same rank, one reader per holder.  A pulls from the trainer and then
 * serves the version from its pinned staging; B reads all of it from A. */
static void gpu_relay_case(const char *model, const char *src_spec, const char *dst_spec, int dst_dev)
{
    reg_t g;
    reg_file(&g);
    host_pubs_t h;
    host_pubs_start(&h, &g, model, src_spec, false);
    refit_receiver_t *rx[2];
    void *rb[2];
    for (int i = 0; i < 2; i++) {
        refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
        rp.registry = g.url;
        rp.job = g.job;
        rp.device = dst_dev;
        rp.transports = "shm";
        rp.verify = REFIT_VERIFY_TRUTH;
        rp.relay_slot = i;
        rp.max_readers = 1;
        rp.reader = i ? "gpu-b" : "gpu-a";
        REFIT_ASSERT_OK(refit_receiver_create(&rp, t_manifest_named(model, dst_spec, 0), &rx[i]));
        REFIT_ASSERT_OK(refit_receiver_alloc(rx[i], 0, &rb[i]));
    }
    refit_manifest_t *rm = t_manifest_named(model, dst_spec, 0);
    uint64_t size = refit_manifest_region_size(rm, 0);
    for (uint64_t v = 1; v <= 2; v++) {
        for (uint32_t s = 0; s < h.n; s++) {
            REFIT_ASSERT_OK(refit_truth_fill(h.m[s], &h.base[s], v));
            REFIT_ASSERT_OK(refit_publisher_publish(h.pub[s], v));
        }
        refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
        REFIT_ASSERT_OK(refit_receiver_pull(rx[0], v, 20000, &rep));
        REFIT_ASSERT_OK(refit_receiver_pull(rx[1], v, 20000, &rep));
        assert_int_equal(rep.path, REFIT_RX_PATH_HOST_FLEET); /* a relay among its holders: chunks */
        refit_holder_stat_t hs[8] = {REFIT_HOLDER_STAT_INIT};
        size_t nh = 0;
        REFIT_ASSERT_OK(refit_receiver_holders(rx[1], hs, 8, &nh));
        uint64_t from_relay = 0, from_trainer = 0;
        for (size_t i = 0; i < nh && i < 8; i++) {
            if (!strncmp(hs[i].name, "relay:0", 7)) from_relay += hs[i].bytes;
            if (!strncmp(hs[i].name, "trainer:", 8)) from_trainer += hs[i].bytes;
        }
        if (from_relay < size / 2 || from_trainer)
            FAIL("version %llu: B read %llu bytes from relay 0 and %llu from the trainer (%zu holders; lanes %s)",
                 (unsigned long long)v, (unsigned long long)from_relay, (unsigned long long)from_trainer, nh,
                 rep.lanes);
        for (int i = 0; i < 2; i++)
            REFIT_ASSERT_OK(refit_gpu_truth_verify(rm, dst_dev, (const void *const *)&rb[i], v, NULL));
        printf("  GPU relay: %s -> %s v%llu: B read %llu bytes from A's staging, transfer %.2f ms, %s\n", src_spec,
               dst_spec, (unsigned long long)v, (unsigned long long)from_relay, rep.transfer_ms, rep.lanes);
        for (uint32_t s = 0; s < h.n; s++) REFIT_ASSERT_OK(refit_publisher_wait_readers(h.pub[s], v, 10000));
    }
    for (int i = 0; i < 2; i++) refit_receiver_destroy(rx[i]);
    refit_manifest_destroy(rm);
    host_pubs_stop(&h);
    t_rm_tree(g.dir);
}

static void test_engine(void **state)
{
    (void)state;
    engine_case("tiny-moe", "megatron:ep=2", 0, "vllm:tp=2", g_dst_dev, true);
    engine_case("tiny-moe", "megatron:tp=2", 0, "vllm:tp=2", -1, true);          /* GPU -> host, mapped */
    engine_case("tiny-moe", "megatron:ep=2", -1, "vllm:tp=2", g_dst_dev, false); /* host (shm) -> GPU */
    engine_case("tiny-moe", "hf", 0, "megatron:tp=4", g_dst_dev, true);          /* padding on the GPU */
    engine_delta_case("tiny-moe", "megatron:ep=2", "vllm:tp=2", g_dst_dev);
    engine_delta_case("qwen3-30b-a3b-mini", "megatron:ep=2", "vllm:tp=2", g_dst_dev);
    gpu_relay_case("tiny-moe", "megatron:ep=2", "vllm:tp=2", g_dst_dev);
    gpu_relay_case("qwen3-30b-a3b-mini", "megatron:ep=2", "vllm:tp=2", g_dst_dev);
}
#endif

int main(void)
{
#ifndef REFIT_HAVE_CUDA
    printf("SKIP: refit was built without CUDA (REFIT_WITH_CUDA=OFF or no CUDA toolkit)\n");
    return 77;
#else
    g_dst_dev = gputest_dst_device();
    int n = refit_gpu_count();
    printf("GPU tests on %d device(s), destination device %d\n", n, g_dst_dev);
    test_truth(NULL);
    printf("ok truth kernels (fill, verify, digest)\n");
    test_batch(NULL);
    printf("ok batch copy kernel\n");
    test_engine(NULL);
    printf(
        "ok engine over cuda_ipc (GPU->GPU, GPU->host, host->GPU), deltas into GPU memory, relays on GPU receivers\n");
    return 0;
#endif
}
