/* The cuda_ipc transport's pull (cuda_ipc.cu has the rest and the design
 * notes): host destinations registered once, the cached table per (plan,
 * sources, device, access width) - a batch (plan/batch.h), or a
 * quantize-on-copy table for FP8 receivers - run as one launch, local copies
 * partly as runtime copies, GPU turns, and the sources' liveness after the
 * copy. */
#include "transport/cuda/cuda_ipc_internal.h"

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
 * with ctl->fp8 a quantize-on-copy table - built on first use. */
static refit_status_t get_exec(refit_transport_t *t, const refit_plan_t *plan, const uint8_t *only, size_t nsrc,
                               int dev, uint32_t max_shift, bool local, const refit_pull_ctl_t *ctl,
                               exec_entry_t **entry)
{
    refit_plan_key_t key;
    refit_plan_key(plan, &key);
    size_t nreg;
    refit_plan_regions(plan, &nreg);
    uint64_t oh = 0x6f6e6c79;
    for (size_t s = 0; s < nsrc; s++) oh = refit_mix64(oh ^ (only[s] + 2 * s));
    const void *target = ctl ? ctl->fp8 : NULL;
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
        if ((st = refit_fp8_table_build(plan, ctl->fp8_bf16, ctl->fp8, &o, &x))) return st;
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
    refit_status_t s2 = refit_gpu_fp8_wait(f, st ? NULL : ctl->tick, ctl->user,
                                           st ? 0 : ctl->deadline); /* never mid-flight */
    if (!st) st = s2;
    refit_gpu_turn_give(turn);
    free(slots);
    return st;
}

/* A pull, or with warm its preparation only (the checks, the device, peer
 * access and the cached table), moving nothing. */
static refit_status_t pull_or_warm(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                                   void *const *dst_bases, const refit_pull_ctl_t *ctl, refit_pull_stats_t *stats,
                                   bool warm)
{
    refit_status_t st = REFIT_OK;
    size_t nsrc = refit_plan_num_sources(plan), n;
    const refit_plan_region_t *regs = refit_plan_regions(plan, &n);
    uint8_t *only = (uint8_t *)calloc(nsrc ? nsrc : 1, 1);
    uint64_t *dst_end = NULL, *slots = NULL, bytes = 0, launches = 0, uploads = 0, copies = 0;
    bool memcpy_used = false;
    uint32_t ndst = 0;
    int dev = -1, src_dev = -1, dst_dev = -1;
    bool host_dst = false;
    refit_gpu_batch_t *g = NULL;
    exec_entry_t *ex = NULL;
    if (!only) return refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc pull");
    for (size_t s = 0; s < nsrc; s++)
        if (peers[s]) {
            only[s] = 1;
            if (dev < 0) dev = peers[s]->dev;
            if (src_dev < 0) src_dev = peers[s]->src_dev;
        }
    for (size_t i = 0; i < n; i++)
        if (regs[i].dst_region + 1 > ndst) ndst = regs[i].dst_region + 1;
    dst_end = (uint64_t *)calloc(ndst ? ndst : 1, sizeof(uint64_t));
    if (!dst_end) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc pull");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (!only[regs[i].src] && ctl && ctl->fp8) { /* a block fed by two transports cannot be quantized by one */
            st = refit_error(REFIT_ERR_UNSUPPORTED,
                             "cuda_ipc: FP8 quantize-on-copy needs every source through cuda_ipc "
                             "(source %u is not)",
                             regs[i].src);
            goto out;
        }
        if (!only[regs[i].src]) continue;
        const refit_peer_t *p = peers[regs[i].src];
        if (regs[i].src_region >= p->n || refit_region_src_end(&regs[i]) > p->regions[regs[i].src_region].size) {
            st = refit_error(REFIT_ERR_CORRUPT, "cuda_ipc: the plan reads past region %u of source %u",
                             regs[i].src_region, regs[i].src);
            goto out;
        }
        uint64_t e = refit_region_dst_end(&regs[i]);
        if (e > dst_end[regs[i].dst_region]) dst_end[regs[i].dst_region] = e;
        bytes += refit_plan_region_bytes(&regs[i]);
    }
    /* Where the kernel runs: the destination's device; for host memory, the
     * device the handles were opened on (the memory is registered, mapped). */
    {
        uint64_t align = 0;
        if (ctl && ctl->fp8 && (ndst != 1 || pointer_device(dst_bases[0]) < 0)) {
            st = refit_error(REFIT_ERR_UNSUPPORTED, "cuda_ipc: FP8 quantize-on-copy writes one region of GPU memory");
            goto out;
        }
        for (uint32_t r = 0; r < ndst; r++) {
            if (!dst_end[r]) continue;
            int d = pointer_device(dst_bases[r]);
            if (d < 0) {
                host_dst = true;
                if ((st = ensure_registered(t, dst_bases[r], dst_end[r]))) goto out;
            } else {
                dst_dev = d;
            }
            align |= (uint64_t)(uintptr_t)dst_bases[r];
        }
        for (size_t s = 0; s < nsrc; s++)
            for (uint32_t r = 0; only[s] && r < peers[s]->n; r++)
                align |= (uint64_t)(uintptr_t)peers[s]->regions[r].ptr;
        /* dev is where the handles were opened: the source's GPU with
         * exec=src (or for host destinations), else the destination's. */
        if (!host_dst && !t->exec_src && dst_dev >= 0) dev = dst_dev;
        if (dev < 0) {
            st = refit_error(REFIT_ERR_TRANSPORT, "cuda_ipc: no device to run the copy on");
            goto out;
        }
        if (!host_dst && dst_dev >= 0 && (st = enable_peer(t, dev, dst_dev))) goto out;
        if (src_dev >= 0 && (st = enable_peer(t, dev, src_dev))) goto out;
        bool local = !host_dst && src_dev == dev && dst_dev == dev; /* copies inside one GPU */
        if ((st = get_exec(t, plan, only, nsrc, dev, align_shift(align), local, ctl, &ex))) goto out;
        g = ex->batch;
        if (warm) goto out;
    }
    if (ex->fp8) {
        bool local = src_dev == dev && dst_dev == dev;
        if ((st = fp8_run(t, ex->fp8, peers, only, nsrc, dst_bases[0], dev, local, ctl, &launches, &uploads))) goto out;
    } else {
        const refit_batch_t *b = refit_gpu_batch_table(g);
        slots = (uint64_t *)calloc(b->nslots ? b->nslots : 1, sizeof(uint64_t));
        if (!slots) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc pull");
            goto out;
        }
        for (size_t s = 0; s < nsrc; s++)
            for (uint32_t k = b->src_slot_base[s]; only[s] && k < b->src_slot_base[s + 1]; k++) {
                uint32_t r = k - b->src_slot_base[s];
                slots[k] = r < peers[s]->n ? (uint64_t)(uintptr_t)peers[s]->regions[r].ptr : 0;
            }
        for (uint32_t k = b->dst_slot_base; k < b->nslots; k++)
            slots[k] = (uint64_t)(uintptr_t)dst_bases[k - b->dst_slot_base];
        /* Local (source, destination and kernel on one GPU): copy=auto takes
         * the runtime's device-to-device copies (see the notes at the top). */
        bool local = !host_dst && src_dev == dev && dst_dev == dev;
        if (local) refit_gpu_batch_local(g);
        memcpy_used = local && t->copy_mode != 1;
        uint64_t min_copy = t->copy_mode == 2 ? 0 : COPY_MIN_BYTES;
        if (memcpy_used && min_copy && !ex->small_built) { /* copy=auto: the small regions as a kernel of their own */
            refit_batch_t kb;
            if ((st = kernel_part(b, min_copy, &kb))) goto out;
            if (kb.n && !(st = refit_gpu_batch_create(dev, &kb, &ex->small))) refit_gpu_batch_local(ex->small);
            refit_batch_free(&kb);
            if (st) goto out;
            ex->small_built = true;
        }
        refit_gpu_batch_t *small = memcpy_used && min_copy ? ex->small : NULL;
        bool turns = t->turns == 1 || (t->turns == -1 && local);
        /* REFIT_CUDA_SMALL=after|before (diagnostics): the small regions' kernel
         * after or before the copies instead of beside them */
        const char *order = small ? refit_diag()->cuda_small : NULL;
        int small_order = order ? (!strcmp(order, "after") ? 1 : !strcmp(order, "before") ? 2 : 0) : 0;
        double t0 = refit_now();
        int turn = turns ? refit_gpu_turn_take(dev, 0, 2.0) : -1;
        double t1 = refit_now();
        if (small && small_order != 1)
            st = refit_gpu_batch_launch(small, slots, &launches, &uploads); /* its own stream: runs beside the copies */
        if (!st && memcpy_used) {
            if (small && small_order == 2) st = refit_gpu_batch_after(g, small);
            if (!st) st = refit_gpu_batch_copy(g, slots, min_copy, &copies);
            if (!st && small && small_order == 1 && !(st = refit_gpu_batch_after(small, g)))
                st = refit_gpu_batch_launch(small, slots, &launches, &uploads);
        } else if (!st) st = refit_gpu_batch_launch(g, slots, &launches, &uploads);
        double t2 = refit_now();
        if (!st) st = refit_gpu_batch_wait(g, ctl ? ctl->tick : NULL, ctl ? ctl->user : NULL, ctl ? ctl->deadline : 0);
        if (small) {
            refit_status_t s2 = refit_gpu_batch_wait(small, NULL, NULL, 0); /* a kernel is never abandoned mid-flight */
            if (!st) st = s2;
        }
        refit_gpu_turn_give(turn);
        if (!st && refit_gpu_trace_path())
            trace_pull(t, peers, nsrc, only, dst_bases, ndst, memcpy_used ? g : NULL, memcpy_used ? small : g,
                       small_order, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (refit_now() - t1) * 1e3);
        if (st) goto out;
    }
    for (size_t s = 0; s < nsrc; s++)
        if (only[s] && refit_proc_start_time(peers[s]->pid) != peers[s]->start_time) {
            st = refit_error(REFIT_ERR_PEER, "cuda_ipc: source process %u died during the transfer", peers[s]->pid);
            goto out;
        }
    if (stats) {
        stats->bytes += bytes;
        stats->requests += launches + uploads + copies;
        stats->launches += launches + copies;
        if (ex->fp8)
            snprintf(stats->lanes, sizeof(stats->lanes),
                     "cuda_ipc:fp8 quantize-on-copy GPU%d->GPU%d, kernel on GPU%d (%" PRIu64 " launch%s, %" PRIu64
                     " upload%s)",
                     src_dev, dst_dev, dev, launches, launches == 1 ? "" : "es", uploads, uploads == 1 ? "" : "s");
        else if (memcpy_used)
            snprintf(stats->lanes, sizeof(stats->lanes),
                     "cuda_ipc:local GPU%d->GPU%d on GPU%d: %" PRIu64 " cudaMemcpy(2D)Async + %" PRIu64
                     " kernel launch%s",
                     src_dev, dst_dev, dev, copies, launches, launches == 1 ? "" : "es");
        else
            snprintf(stats->lanes, sizeof(stats->lanes),
                     "cuda_ipc:%s GPU%d->%s%d, kernel on GPU%d (%" PRIu64 " launch%s, %" PRIu64 " upload%s)",
                     host_dst ? "mapped-host"
                              : (src_dev == dst_dev ? "local"
                                 : dev == dst_dev   ? "p2p-pull"
                                                    : "p2p-push"),
                     src_dev, host_dst ? "host" : "GPU", host_dst ? -1 : dst_dev, dev, launches,
                     launches == 1 ? "" : "es", uploads, uploads == 1 ? "" : "s");
    }
out:
    free(only);
    free(dst_end);
    free(slots);
    return st;
}

refit_status_t cuda_ipc_pull(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                             void *const *dst_bases, const refit_pull_ctl_t *ctl, refit_pull_stats_t *stats)
{
    return pull_or_warm(t, peers, plan, dst_bases, ctl, stats, false);
}

refit_status_t cuda_ipc_warm(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                             void *const *dst_bases, const refit_pull_ctl_t *ctl)
{
    return pull_or_warm(t, peers, plan, dst_bases, ctl, NULL, true);
}
