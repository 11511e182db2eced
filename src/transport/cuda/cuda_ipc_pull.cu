/* The cuda_ipc transport's pull (cuda_ipc.cu has the rest and the design
 * notes): host destinations registered once, the cached table per (plan,
 * sources, device, access width) - a batch (plan/batch.h), or a
 * quantize-on-copy table for FP8 receivers - run as one launch, local copies
 * partly as runtime copies, GPU turns, and the sources' liveness after the
 * copy. */
#include "transport/cuda/cuda_ipc_internal.h"

extern "C" {
#include "plan/plan.h" /* refit_plan_view */
}

/* Registers host destination memory (once). */
static refit_status_t ensure_registered(refit_transport_t *t, void *base, uint64_t len)
{
    refit_status_t st = REFIT_OK;
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < t->registered.len; i++)
        if (t->registered.data[i].base == base) {
            if (t->registered.data[i].len >= len) goto out;
            refit_gpu_host_unregister(base);
            t->registered.data[i] = t->registered.data[--t->registered.len];
            break;
        }
    if ((st = refit_gpu_host_register(base, len))) goto out;
    if (REFIT_VEC_PUSH(&t->registered, ((reg_t){base, len})) != 0) {
        refit_gpu_host_unregister(base);
        st = refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc: registrations");
    }
out:
    pthread_mutex_unlock(&t->lock);
    return st;
}

/* The regions of b that the kernel keeps when the others go to copy calls
 * (refit_gpu_batch_region_by_copy), as a table of their own. */
static refit_status_t kernel_part(const refit_batch_t *b, uint64_t min_bytes, refit_batch_t *out)
{
    *out = *b;
    out->regions = (refit_batch_region_t *)malloc((b->n ? b->n : 1) * sizeof(refit_batch_region_t));
    out->src_slot_base = (uint32_t *)malloc((b->nsrcs + 1) * sizeof(uint32_t));
    if (!out->regions || !out->src_slot_base) {
        free(out->regions);
        free(out->src_slot_base);
        return refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc: batch table");
    }
    memcpy(out->src_slot_base, b->src_slot_base, (b->nsrcs + 1) * sizeof(uint32_t));
    out->n = 0;
    out->nchunks = out->bytes = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        if (refit_gpu_batch_region_by_copy(&b->regions[i], min_bytes)) continue;
        refit_batch_region_t r = b->regions[i];
        r.first_chunk = out->nchunks;
        out->nchunks += (r.units + r.chunk_units - 1) / r.chunk_units;
        out->bytes += r.units << r.shift;
        out->regions[out->n++] = r;
    }
    return REFIT_OK;
}

/* The cached table for (plan, sources, device, access width) - a batch, or
 * with fp8 a quantize-on-copy table - built on first use. */
static refit_status_t get_exec(refit_transport_t *t, const refit_plan_t *plan, const uint8_t *only, size_t nsrc,
                               int dev, uint32_t max_shift, bool local, const refit_pull_fp8_t *fp8,
                               exec_entry_t **entry)
{
    refit_plan_key_t key;
    refit_plan_key(plan, &key);
    size_t nreg;
    refit_plan_regions(plan, &nreg);
    uint64_t oh = 0x6f6e6c79;
    for (size_t s = 0; s < nsrc; s++) oh = refit_mix64(oh ^ (only[s] + 2 * s));
    const void *target = fp8 ? fp8->target : NULL;
    exec_entry_t *victim = &t->exec[0];
    for (int i = 0; i < EXEC_CACHE; i++) {
        exec_entry_t *e = &t->exec[i];
        bool used = e->batch || e->fp8;
        if (used && e->key.src == key.src && e->key.dst == key.dst && e->nregions == nreg && e->only_hash == oh &&
            e->dev == dev && e->max_shift == max_shift && e->fp8_target == target) {
            e->last_used = ++t->uses;
            *entry = e;
            return REFIT_OK;
        }
        if (!used || e->last_used < victim->last_used) victim = e;
    }
    refit_batch_opts_t o;
    memset(&o, 0, sizeof(o));
    o.max_shift = max_shift;
    o.copies = true;
    o.only = only;
    refit_gpu_batch_t *g = NULL;
    refit_gpu_fp8_t *f = NULL;
    refit_status_t st;
    if (target) {
        refit_fp8_table_t x;
        if ((st = refit_fp8_table_build(plan, fp8->bf16, fp8->target, &o, &x))) return st;
        st = refit_gpu_fp8_create(dev, &x, &f);
        refit_fp8_table_free(&x);
    } else {
        refit_batch_t b;
        if (local) o.chunk_bytes = KERNEL_CHUNK;
        if ((st = refit_batch_build(plan, &o, &b))) return st;
        st = refit_gpu_batch_create(dev, &b, &g);
        refit_batch_free(&b);
    }
    if (st) return st;
    refit_gpu_batch_destroy(victim->batch);
    refit_gpu_batch_destroy(victim->small);
    refit_gpu_fp8_destroy(victim->fp8);
    refit_gpu_digest_fused_destroy(victim->fused);
    refit_gpu_batch_destroy(victim->rest);
    victim->fused = NULL;
    victim->rest = NULL;
    victim->fused_state = 0;
    victim->fused_g = NULL;
    victim->small = NULL;
    victim->small_built = false;
    victim->key = key;
    victim->nregions = nreg;
    victim->only_hash = oh;
    victim->dev = dev;
    victim->max_shift = max_shift;
    victim->batch = g;
    victim->fp8 = f;
    victim->fp8_target = target;
    victim->last_used = ++t->uses;
    *entry = victim;
    return REFIT_OK;
}

/* Lets kernels on device e write device d's memory (once per process). */
static refit_status_t enable_peer(refit_transport_t *t, int e, int d)
{
    refit_status_t st = REFIT_OK;
    if (e == d || e < 0 || d < 0 || e >= 64 || d >= 64) return REFIT_OK;
    pthread_mutex_lock(&t->lock);
    bool done = (t->peer_enabled[e] >> d) & 1;
    pthread_mutex_unlock(&t->lock);
    if (done) return REFIT_OK;
    int saved = current_device();
    cudaError_t err;
    if (!refit_gpu_can_access_peer(e, d)) {
        st = refit_error(REFIT_ERR_TRANSPORT, "cuda_ipc: GPU %d cannot write GPU %d directly (no peer access)", e, d);
        goto out;
    }
    CK(cudaSetDevice(e));
    err = cudaDeviceEnablePeerAccess(d, 0);
    if (err != cudaSuccess && err != cudaErrorPeerAccessAlreadyEnabled) CK(err);
    cudaGetLastError();
    pthread_mutex_lock(&t->lock);
    t->peer_enabled[e] |= 1ull << d;
    pthread_mutex_unlock(&t->lock);
out:
    if (saved >= 0) cudaSetDevice(saved);
    return st;
}

static uint32_t align_shift(uint64_t a)
{
    uint32_t s = 4;
    while (s && (a & ((1ull << s) - 1))) s--;
    return s;
}

/* copy=auto on one GPU (source, destination and the work on one device):
 * regions whose runs are contiguous and of at least COPY_MIN_BYTES go to
 * cudaMemcpyAsync, the runtime's
 * device-to-device copy, which on an H200 moves 2.15 TB/s where the batch
 * kernel moves 1.75 TB/s on one flat region; the rest (small tensors, short
 * rows such as the 768-byte rows of column-split experts) stays with the
 * batch kernel, launched on its own stream so that it runs beside the
 * copies.  Each copy call costs a few microseconds of its own, hence the
 * floor: Qwen3-30B-A3B to vllm:tp=1 is 196 calls of 16 MiB and more (59.3 GB)
 * and 481 smaller ones (1.7 GB, left to the kernel). */
#define COPY_MIN_BYTES (16ull << 20)

/* REFIT_CUDA_TRACE=FILE (diagnostics, docs/gpu.md "Colocated"): appends
 * the pull's allocations (opened sources, destinations: base and size, so
 * that bench/ipc_probe.cu can replay the copies at the same offsets), its
 * host times and one line per copy call with its GPU time. */
static void trace_pull(refit_transport_t *t, refit_peer_t *const *peers, size_t nsrc, const uint8_t *only,
                       void *const *dst_bases, uint32_t ndst, refit_gpu_batch_t *copies, refit_gpu_batch_t *kernel,
                       int small_order, double turn_ms, double issue_ms, double done_ms)
{
    (void)t;
    FILE *f = fopen(refit_gpu_trace_path(), "a");
    if (!f) return;
    static unsigned pulls;
    get_range_fn gr = get_range();
    const char *order = small_order == 1 ? "after" : small_order == 2 ? "before" : "beside";
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    fprintf(f, "pull %u pid %d at %lld.%06ld order %s turn %.3f ms issue %.3f ms issue+wait %.3f ms\n", ++pulls,
            (int)getpid(), (long long)now.tv_sec, now.tv_nsec / 1000, order, turn_ms, issue_ms, done_ms);
    for (size_t s = 0; s < nsrc; s++)
        for (uint32_t r = 0; only[s] && r < peers[s]->n; r++) {
            void *b = peers[s]->regions[r].base;
            bool seen = !b;
            for (size_t s2 = 0; !seen && s2 <= s; s2++)
                for (uint32_t r2 = 0; !seen && only[s2] && r2 < (s2 == s ? r : peers[s2]->n); r2++)
                    seen = peers[s2]->regions[r2].base == b;
            unsigned long long base = 0;
            size_t size = 0;
            if (!seen && gr && gr(&base, &size, (unsigned long long)(uintptr_t)b) == 0)
                fprintf(f, "alloc src %zu base %p size %zu\n", s, b, size);
        }
    unsigned long long shown[64];
    uint32_t nshown = 0;
    for (uint32_t k = 0; k < ndst; k++) {
        unsigned long long base = 0;
        size_t size = 0;
        if (!dst_bases[k] || !gr || gr(&base, &size, (unsigned long long)(uintptr_t)dst_bases[k]) != 0) continue;
        bool seen = false;
        for (uint32_t i = 0; i < nshown; i++) seen |= shown[i] == base;
        if (seen) continue;
        if (nshown < 64) shown[nshown++] = base;
        fprintf(f, "alloc dst %u base 0x%llx size %zu\n", k, base, size);
    }
    refit_gpu_batch_trace_print(copies, kernel, f);
    fclose(f);
}

/* A quantize-on-copy table: every source region's slot, the arena, one
 * launch (under the GPU's turn when the copy is local), then the wait. */
static refit_status_t fp8_run(refit_transport_t *t, refit_gpu_fp8_t *f, refit_peer_t *const *peers, const uint8_t *only,
                              size_t nsrc, void *arena, int dev, bool local, const refit_pull_ctl_t *ctl,
                              uint64_t *launches, uint64_t *uploads)
{
    const refit_fp8_table_t *x = refit_gpu_fp8_table(f);
    uint64_t *slots = (uint64_t *)calloc(x->nslots ? x->nslots : 1, sizeof(uint64_t));
    if (!slots) return refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc pull");
    for (size_t s = 0; s < nsrc && s < x->nsrcs; s++)
        for (uint32_t k = x->src_slot_base[s]; only[s] && k < x->src_slot_base[s + 1]; k++) {
            uint32_t r = k - x->src_slot_base[s];
            slots[k] = r < peers[s]->n ? (uint64_t)(uintptr_t)peers[s]->regions[r].ptr : 0;
        }
    slots[x->dst_slot] = (uint64_t)(uintptr_t)arena;
    bool turns = t->turns == 1 || (t->turns == -1 && local);
    int turn = turns ? refit_gpu_turn_take(dev, 0, 2.0) : -1;
    refit_status_t st = refit_gpu_fp8_launch(f, slots, launches, uploads);
    refit_status_t s2 = refit_gpu_fp8_wait(f, st || !ctl ? NULL : ctl->tick, ctl ? ctl->user : NULL,
                                           st || !ctl ? 0 : ctl->deadline); /* never mid-flight */
    if (!st) st = s2;
    refit_gpu_turn_give(turn);
    free(slots);
    return st;
}

/* One pull (or warm) in progress: its arguments and what it found out. */
typedef struct {
    refit_transport_t *t;
    refit_peer_t *const *peers;
    const refit_plan_t *plan;
    void *const *dst_bases;
    const refit_pull_ctl_t *ctl;
    const refit_pull_fp8_t *fp8; /* NULL: a plain copy */
    size_t nsrc;
    uint8_t *only;     /* [nsrc]: sources read through this transport */
    uint64_t *dst_end; /* [ndst]: the end of what the plan writes in each destination region */
    uint32_t ndst;
    int dev, src_dev, dst_dev; /* where the work runs, the sources' GPU, the destination's GPU */
    bool host_dst, memcpy_used, fused;
    uint64_t bytes, launches, uploads, copies;
    exec_entry_t *ex;
} ipc_pull_t;

/* The sources this transport reads (x->only) and the plan's checks: every
 * region inside its source region; with FP8, every source through us. */
static refit_status_t check_plan(ipc_pull_t *x)
{
    size_t n;
    const refit_plan_region_t *regs = refit_plan_regions(x->plan, &n);
    x->only = (uint8_t *)calloc(x->nsrc ? x->nsrc : 1, 1);
    if (!x->only) return refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc pull");
    for (size_t s = 0; s < x->nsrc; s++)
        if (x->peers[s]) {
            x->only[s] = 1;
            if (x->dev < 0) x->dev = x->peers[s]->dev;
            if (x->src_dev < 0) x->src_dev = x->peers[s]->src_dev;
        }
    for (size_t i = 0; i < n; i++)
        if (regs[i].dst_region + 1 > x->ndst) x->ndst = regs[i].dst_region + 1;
    x->dst_end = (uint64_t *)calloc(x->ndst ? x->ndst : 1, sizeof(uint64_t));
    if (!x->dst_end) return refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc pull");
    for (size_t i = 0; i < n; i++) {
        if (!x->only[regs[i].src] && x->fp8) /* a block fed by two transports cannot be quantized by one */
            return refit_error(REFIT_ERR_UNSUPPORTED,
                               "cuda_ipc: FP8 quantize-on-copy needs every source through cuda_ipc "
                               "(source %u is not)",
                               regs[i].src);
        if (!x->only[regs[i].src]) continue;
        const refit_peer_t *p = x->peers[regs[i].src];
        if (regs[i].src_region >= p->n || refit_region_src_end(&regs[i]) > p->regions[regs[i].src_region].size)
            return refit_error(REFIT_ERR_CORRUPT, "cuda_ipc: the plan reads past region %u of source %u",
                               regs[i].src_region, regs[i].src);
        uint64_t e = refit_region_dst_end(&regs[i]);
        if (e > x->dst_end[regs[i].dst_region]) x->dst_end[regs[i].dst_region] = e;
        x->bytes += refit_plan_region_bytes(&regs[i]);
    }
    return REFIT_OK;
}

/* Where the kernel runs: the destination's device; for host memory, the
 * device the handles were opened on (the memory is registered, mapped).
 * Then peer access and the cached table (x->ex). */
static refit_status_t place(ipc_pull_t *x)
{
    refit_status_t st;
    uint64_t align = 0;
    if (x->fp8 && (x->ndst != 1 || pointer_device(x->dst_bases[0]) < 0))
        return refit_error(REFIT_ERR_UNSUPPORTED, "cuda_ipc: FP8 quantize-on-copy writes one region of GPU memory");
    for (uint32_t r = 0; r < x->ndst; r++) {
        if (!x->dst_end[r]) continue;
        int d = pointer_device(x->dst_bases[r]);
        if (d < 0) {
            x->host_dst = true;
            if ((st = ensure_registered(x->t, x->dst_bases[r], x->dst_end[r]))) return st;
        } else {
            x->dst_dev = d;
        }
        align |= (uint64_t)(uintptr_t)x->dst_bases[r];
    }
    for (size_t s = 0; s < x->nsrc; s++)
        for (uint32_t r = 0; x->only[s] && r < x->peers[s]->n; r++)
            align |= (uint64_t)(uintptr_t)x->peers[s]->regions[r].ptr;
    /* dev is where the handles were opened: the source's GPU with exec=src
     * (or for host destinations), else the destination's. */
    if (!x->host_dst && !x->t->exec_src && x->dst_dev >= 0) x->dev = x->dst_dev;
    if (x->dev < 0) return refit_error(REFIT_ERR_TRANSPORT, "cuda_ipc: no device to run the copy on");
    if (!x->host_dst && x->dst_dev >= 0 && (st = enable_peer(x->t, x->dev, x->dst_dev))) return st;
    if (x->src_dev >= 0 && (st = enable_peer(x->t, x->dev, x->src_dev))) return st;
    bool local = !x->host_dst && x->src_dev == x->dev && x->dst_dev == x->dev; /* copies inside one GPU */
    return get_exec(x->t, x->plan, x->only, x->nsrc, x->dev, align_shift(align), local, x->fp8, &x->ex);
}

/* The batch's slot table: every source region's address, then the
 * destination regions'. */
static uint64_t *batch_slots(const ipc_pull_t *x, const refit_batch_t *b)
{
    uint64_t *slots = (uint64_t *)calloc(b->nslots ? b->nslots : 1, sizeof(uint64_t));
    if (!slots) return NULL;
    for (size_t s = 0; s < x->nsrc; s++)
        for (uint32_t k = b->src_slot_base[s]; x->only[s] && k < b->src_slot_base[s + 1]; k++) {
            uint32_t r = k - b->src_slot_base[s];
            slots[k] = r < x->peers[s]->n ? (uint64_t)(uintptr_t)x->peers[s]->regions[r].ptr : 0;
        }
    for (uint32_t k = b->dst_slot_base; k < b->nslots; k++)
        slots[k] = (uint64_t)(uintptr_t)x->dst_bases[k - b->dst_slot_base];
    return slots;
}

/* copy=auto's small regions as a kernel of their own (once per table). */
static refit_status_t ensure_small(ipc_pull_t *x, const refit_batch_t *b, uint64_t min_copy)
{
    exec_entry_t *ex = x->ex;
    if (ex->small_built) return REFIT_OK;
    refit_batch_t kb;
    refit_status_t st = kernel_part(b, min_copy, &kb);
    if (st) return st;
    if (kb.n && !(st = refit_gpu_batch_create(x->dev, &kb, &ex->small))) refit_gpu_batch_local(ex->small);
    refit_batch_free(&kb);
    if (!st) ex->small_built = true;
    return st;
}

/* The batch table's run: one launch, or on one GPU (copy=auto) the runtime's
 * device-to-device copies with the small regions' kernel beside them (see
 * the notes at COPY_MIN_BYTES), under the GPU's turn; then the wait. */
static refit_status_t batch_run(ipc_pull_t *x)
{
    refit_transport_t *t = x->t;
    refit_gpu_batch_t *g = x->ex->batch;
    const refit_batch_t *b = refit_gpu_batch_table(g);
    const refit_pull_ctl_t *ctl = x->ctl;
    uint64_t *slots = batch_slots(x, b);
    if (!slots) return refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc pull");
    refit_status_t st = REFIT_OK;
    bool local = !x->host_dst && x->src_dev == x->dev && x->dst_dev == x->dev;
    if (local) refit_gpu_batch_local(g);
    x->memcpy_used = local && t->copy_mode != 1;
    uint64_t min_copy = t->copy_mode == 2 ? 0 : COPY_MIN_BYTES;
    if (x->memcpy_used && min_copy && (st = ensure_small(x, b, min_copy))) goto out;
    {
        refit_gpu_batch_t *small = x->memcpy_used && min_copy ? x->ex->small : NULL;
        bool turns = t->turns == 1 || (t->turns == -1 && local);
        /* REFIT_CUDA_SMALL=after|before (diagnostics): the small regions' kernel
         * after or before the copies instead of beside them */
        const char *order = small ? refit_diag()->cuda_small : NULL;
        int small_order = order ? (!strcmp(order, "after") ? 1 : !strcmp(order, "before") ? 2 : 0) : 0;
        double t0 = refit_now();
        int turn = turns ? refit_gpu_turn_take(x->dev, 0, 2.0) : -1;
        double t1 = refit_now();
        if (small && small_order != 1)
            st = refit_gpu_batch_launch(small, slots, &x->launches,
                                        &x->uploads); /* its own stream: beside the copies */
        if (!st && x->memcpy_used) {
            if (small && small_order == 2) st = refit_gpu_batch_after(g, small);
            if (!st) st = refit_gpu_batch_copy(g, slots, min_copy, &x->copies);
            if (!st && small && small_order == 1 && !(st = refit_gpu_batch_after(small, g)))
                st = refit_gpu_batch_launch(small, slots, &x->launches, &x->uploads);
        } else if (!st) st = refit_gpu_batch_launch(g, slots, &x->launches, &x->uploads);
        double t2 = refit_now();
        if (!st) st = refit_gpu_batch_wait(g, ctl ? ctl->tick : NULL, ctl ? ctl->user : NULL, ctl ? ctl->deadline : 0);
        if (small) {
            refit_status_t s2 = refit_gpu_batch_wait(small, NULL, NULL, 0); /* a kernel is never abandoned mid-flight */
            if (!st) st = s2;
        }
        refit_gpu_turn_give(turn);
        if (!st && refit_gpu_trace_path())
            trace_pull(t, x->peers, x->nsrc, x->only, x->dst_bases, x->ndst, x->memcpy_used ? g : NULL,
                       x->memcpy_used ? small : g, small_order, (t1 - t0) * 1e3, (t2 - t1) * 1e3,
                       (refit_now() - t1) * 1e3);
    }
out:
    free(slots);
    return st;
}

/* ---- copy and hash in one kernel (ctl->gdig) ---- */

static uint64_t dst_hash(const ipc_pull_t *x)
{
    return refit_hash64(x->dst_bases, x->ndst * sizeof(void *), 0x66757365 /* "fuse" */);
}

/* The plan's runs, one per innermost copy (from the batch's slots; pad: the
 * destination region), then the fused table over them and the rest as a
 * batch (x->ex->fused, ->rest); fused_state 2 where the plan cannot be fused. */
static refit_status_t build_fused(ipc_pull_t *x, refit_gpu_digest_t *gd)
{
    exec_entry_t *ex = x->ex;
    const refit_batch_t *b = refit_gpu_batch_table(ex->batch);
    size_t nreg;
    const refit_plan_region_t *regs = refit_plan_regions(x->plan, &nreg);
    REFIT_VEC(refit_gpu_run_t) runs = {};
    refit_gpu_rest_t *rest = NULL;
    size_t nrest = 0;
    refit_gpu_digest_fused_t *f = NULL;
    refit_gpu_batch_t *rb = NULL;
    refit_status_t st = REFIT_OK;
    for (size_t i = 0; i < nreg && !st; i++) {
        const refit_plan_region_t *r = &regs[i];
        if (!x->only[r->src] || !r->run) continue;
        uint64_t c[3] = {1, 1, 1};
        for (uint32_t k = 0; k < r->nloops && k < 3; k++) c[k] = r->count[k];
        for (uint64_t d2 = 0; d2 < c[2] && !st; d2++)
            for (uint64_t d1 = 0; d1 < c[1] && !st; d1++)
                for (uint64_t d0 = 0; d0 < c[0] && !st; d0++) {
                    uint64_t d[3] = {d0, d1, d2}, so = r->src_offset, dof = r->dst_offset;
                    for (uint32_t k = 0; k < r->nloops && k < 3; k++) {
                        so += d[k] * r->src_stride[k];
                        dof += d[k] * r->dst_stride[k];
                    }
                    refit_gpu_run_t g = {(uint64_t)(uintptr_t)x->dst_bases[r->dst_region] + dof, r->run, so,
                                         b->src_slot_base[r->src] + r->src_region, r->dst_region};
                    if (REFIT_VEC_PUSH(&runs, g) < 0) st = refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc: fused copy");
                }
    }
    if (!st) st = refit_gpu_digest_fused_create(gd, runs.data, runs.len, b->nslots, &f, &rest, &nrest);
    if (st == REFIT_ERR_UNSUPPORTED) {
        refit_log(REFIT_LOG_INFO, "cuda_ipc: copying and hashing apart: %s", refit_last_error());
        ex->fused_state = 2;
        st = REFIT_OK;
        goto out;
    }
    if (!st && nrest) {
        refit_plan_region_t *rr = (refit_plan_region_t *)calloc(nrest, sizeof(*rr));
        if (!rr) st = refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc: fused copy");
        for (size_t i = 0; !st && i < nrest; i++) {
            const refit_gpu_run_t *g = &runs.data[rest[i].run];
            uint32_t s = 0; /* the source whose slots hold g's */
            while (s + 1 < b->nsrcs && b->src_slot_base[s + 1] <= g->slot) s++;
            rr[i].src = s;
            rr[i].src_region = g->slot - b->src_slot_base[s];
            rr[i].dst_region = g->pad;
            rr[i].src_offset = g->src_off + rest[i].off;
            rr[i].dst_offset = g->dst - (uint64_t)(uintptr_t)x->dst_bases[g->pad] + rest[i].off;
            rr[i].run = rest[i].len;
        }
        if (!st) {
            refit_plan_t view = refit_plan_view(rr, nrest, NULL, x->nsrc);
            refit_batch_opts_t o;
            memset(&o, 0, sizeof(o));
            o.max_shift = ex->max_shift;
            o.copies = true;
            o.only = x->only;
            refit_batch_t rb_table;
            if (!(st = refit_batch_build(&view, &o, &rb_table))) {
                st = refit_gpu_batch_create(x->dev, &rb_table, &rb);
                refit_batch_free(&rb_table);
            }
        }
        free(rr);
    }
    if (!st) {
        ex->fused = f;
        ex->rest = rb;
        ex->fused_state = 1;
        ex->fused_g = gd;
        ex->fused_dst = dst_hash(x);
        f = NULL;
        rb = NULL;
    }
out:
    refit_gpu_digest_fused_destroy(f);
    refit_gpu_batch_destroy(rb);
    free(rest);
    REFIT_VEC_FREE(&runs);
    return st;
}

/* Hashing while copying: asked for (ctl->gdig), the receiver's GPU runs the
 * kernel, every source of the plan is ours. */
static bool fusable(const ipc_pull_t *x)
{
    const refit_pull_ctl_t *ctl = x->ctl;
    bool ok = ctl && ctl->gdig && ctl->ghashed && !x->host_dst && x->dev == x->dst_dev && x->ex->batch;
    size_t nreg;
    const refit_plan_region_t *regs = refit_plan_regions(x->plan, &nreg);
    for (size_t i = 0; ok && i < nreg; i++) ok = x->only[regs[i].src];
    return ok;
}

/* The copy through the receiver's fused kernel (its sums made as it writes),
 * the bytes no digest covers beside it, under the GPU's turn; *done false
 * where this plan cannot be fused (the caller copies as it would). */
static refit_status_t fused_run(ipc_pull_t *x, bool *done)
{
    refit_transport_t *t = x->t;
    exec_entry_t *ex = x->ex;
    refit_gpu_digest_t *gd = x->ctl->gdig;
    *done = false;
    if (ex->fused_state && (ex->fused_g != gd || (ex->fused_state == 1 && ex->fused_dst != dst_hash(x)))) {
        refit_gpu_digest_fused_destroy(ex->fused);
        refit_gpu_batch_destroy(ex->rest);
        ex->fused = NULL;
        ex->rest = NULL;
        ex->fused_state = 0;
    }
    refit_status_t st = ex->fused_state ? REFIT_OK : build_fused(x, gd);
    if (st || ex->fused_state != 1) return st;
    const refit_batch_t *b = refit_gpu_batch_table(ex->batch);
    uint64_t *slots = batch_slots(x, b), *rslots = ex->rest ? batch_slots(x, refit_gpu_batch_table(ex->rest)) : NULL;
    if (!slots || (ex->rest && !rslots)) {
        free(slots);
        free(rslots);
        return refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc pull");
    }
    bool local = !x->host_dst && x->src_dev == x->dev && x->dst_dev == x->dev;
    if (local && ex->rest) refit_gpu_batch_local(ex->rest);
    bool turns = t->turns == 1 || (t->turns == -1 && local);
    int turn = turns ? refit_gpu_turn_take(x->dev, 0, 2.0) : -1;
    if (ex->rest) st = refit_gpu_batch_launch(ex->rest, rslots, &x->launches, &x->uploads);
    refit_status_t sf = refit_gpu_digest_fused_launch(gd, ex->fused, slots);
    if (!sf) x->launches++;
    if (!st) st = sf;
    const refit_pull_ctl_t *ctl = x->ctl;
    refit_status_t s2 = ex->rest
                            ? refit_gpu_batch_wait(ex->rest, st ? NULL : ctl->tick, ctl->user, st ? 0 : ctl->deadline)
                            : REFIT_OK;
    refit_status_t s3 = refit_gpu_digest_wait(gd); /* never abandoned mid-flight */
    if (!st) st = s2;
    if (!st) st = s3;
    refit_gpu_turn_give(turn);
    free(slots);
    free(rslots);
    if (!st) *done = true;
    return st;
}

/* What carried the bytes, in stats->lanes. */
static void describe(const ipc_pull_t *x, refit_pull_stats_t *stats)
{
    int src_dev = x->src_dev, dst_dev = x->dst_dev, dev = x->dev;
    uint64_t launches = x->launches, uploads = x->uploads;
    if (x->ex->fp8)
        snprintf(stats->lanes, sizeof(stats->lanes),
                 "cuda_ipc:fp8 quantize-on-copy GPU%d->GPU%d, kernel on GPU%d (%" PRIu64 " launch%s, %" PRIu64
                 " upload%s)",
                 src_dev, dst_dev, dev, launches, launches == 1 ? "" : "es", uploads, uploads == 1 ? "" : "s");
    else if (x->fused)
        snprintf(stats->lanes, sizeof(stats->lanes),
                 "cuda_ipc:%s GPU%d->GPU%d, copy+digest kernel on GPU%d (%" PRIu64 " launch%s, %" PRIu64 " upload%s)",
                 src_dev == dst_dev ? "local" : "p2p-pull", src_dev, dst_dev, dev, launches, launches == 1 ? "" : "es",
                 uploads, uploads == 1 ? "" : "s");
    else if (x->memcpy_used)
        snprintf(stats->lanes, sizeof(stats->lanes),
                 "cuda_ipc:local GPU%d->GPU%d on GPU%d: %" PRIu64 " cudaMemcpy(2D)Async + %" PRIu64 " kernel launch%s",
                 src_dev, dst_dev, dev, x->copies, launches, launches == 1 ? "" : "es");
    else
        snprintf(stats->lanes, sizeof(stats->lanes),
                 "cuda_ipc:%s GPU%d->%s%d, kernel on GPU%d (%" PRIu64 " launch%s, %" PRIu64 " upload%s)",
                 x->host_dst ? "mapped-host"
                             : (src_dev == dst_dev ? "local"
                                : dev == dst_dev   ? "p2p-pull"
                                                   : "p2p-push"),
                 src_dev, x->host_dst ? "host" : "GPU", x->host_dst ? -1 : dst_dev, dev, launches,
                 launches == 1 ? "" : "es", uploads, uploads == 1 ? "" : "s");
}

/* A pull, or with warm its preparation only (the checks, the device, peer
 * access and the cached table), moving nothing; quantized as fp8 says where
 * it is not NULL. */
static refit_status_t pull_or_warm(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                                   void *const *dst_bases, const refit_pull_ctl_t *ctl, const refit_pull_fp8_t *fp8,
                                   refit_pull_stats_t *stats, bool warm)
{
    ipc_pull_t x;
    memset(&x, 0, sizeof(x));
    x.t = t;
    x.peers = peers;
    x.plan = plan;
    x.dst_bases = dst_bases;
    x.ctl = ctl;
    x.fp8 = fp8;
    x.nsrc = refit_plan_num_sources(plan);
    x.dev = x.src_dev = x.dst_dev = -1;
    refit_status_t st = check_plan(&x);
    if (st || (st = place(&x))) goto out;
    if (warm) { /* with a hasher, its fused table too (built on the host: the first pull's largest cost) */
        if (!x.ex->fp8 && fusable(&x) && !x.ex->fused_state) st = build_fused(&x, ctl->gdig);
        goto out;
    }
    if (x.ex->fp8) {
        bool local = x.src_dev == x.dev && x.dst_dev == x.dev;
        st = fp8_run(t, x.ex->fp8, peers, x.only, x.nsrc, dst_bases[0], x.dev, local, ctl, &x.launches, &x.uploads);
    } else {
        bool done = false;
        if (fusable(&x) && (st = fused_run(&x, &done))) goto out;
        if (done) x.fused = true;
        else st = batch_run(&x);
    }
    if (st) goto out;
    for (size_t s = 0; s < x.nsrc; s++)
        if (x.only[s] && refit_proc_start_time(peers[s]->pid) != peers[s]->start_time) {
            st = refit_error(REFIT_ERR_PEER, "cuda_ipc: source process %u died during the transfer", peers[s]->pid);
            goto out;
        }
    if (x.fused) *ctl->ghashed = true;
    if (stats) {
        stats->bytes += x.bytes;
        stats->requests += x.launches + x.uploads + x.copies;
        stats->launches += x.launches + x.copies;
        describe(&x, stats);
    }
out:
    free(x.only);
    free(x.dst_end);
    return st;
}

refit_status_t cuda_ipc_pull(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                             void *const *dst_bases, const refit_pull_ctl_t *ctl, refit_pull_stats_t *stats)
{
    return pull_or_warm(t, peers, plan, dst_bases, ctl, NULL, stats, false);
}

refit_status_t cuda_ipc_warm(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                             void *const *dst_bases, const refit_pull_ctl_t *ctl)
{
    return pull_or_warm(t, peers, plan, dst_bases, ctl, NULL, NULL, true);
}

static refit_status_t fp8_args(const refit_pull_fp8_t *fp8)
{
    if (!fp8 || !fp8->target || !fp8->bf16)
        return refit_error(REFIT_ERR_INVALID_ARG, "cuda_ipc: an FP8 pull without its target or bf16 manifest");
    return REFIT_OK;
}

static refit_status_t fp8_pull(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                               void *const *dst_bases, const refit_pull_ctl_t *ctl, const refit_pull_fp8_t *fp8,
                               refit_pull_stats_t *stats)
{
    refit_status_t st = fp8_args(fp8);
    return st ? st : pull_or_warm(t, peers, plan, dst_bases, ctl, fp8, stats, false);
}

static refit_status_t fp8_warm(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                               void *const *dst_bases, const refit_pull_ctl_t *ctl, const refit_pull_fp8_t *fp8)
{
    refit_status_t st = fp8_args(fp8);
    return st ? st : pull_or_warm(t, peers, plan, dst_bases, ctl, fp8, NULL, true);
}

extern "C" const refit_transport_fp8_t cuda_ipc_fp8_ext = {fp8_pull, fp8_warm};
