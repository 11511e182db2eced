/* The cuda_ipc transport: same host, GPU memory, pulled over NVLink/PCIe
 * (docs/gpu.md, "How cuda_ipc works", is the design).
 *
 *  - Publisher: alloc() is cudaMalloc on the transport's device; expose()
 *    finds the allocation holding the region (cuMemGetAddressRange through
 *    the runtime's driver entry points: nothing links libcuda) and describes
 *    it by its IPC handle, offset, size, device UUID and the publisher's pid,
 *    start time and boot id.
 *  - Receiver: connect() checks the publisher is on this host and alive and
 *    opens each handle once (cached, reference counted; a descriptor of this
 *    very process is used directly).  pull() runs a cached table - the plan as
 *    a batch (plan/batch.h), or a quantize-on-copy table for FP8 receivers
 *    (plan/fp8_table.h) - as one launch with a slot table uploaded only when
 *    bases change; local copies (copy=auto) also use runtime copies for long
 *    runs (COPY_MIN_BYTES).  Receivers on one GPU take its turn around their
 *    copy (turns=auto: local copies).  After the copy every source must still
 *    be alive (REFIT_ERR_PEER).  warm() builds the table for prepare(). */
#include "transport/cuda/cuda_ipc_internal.h"

static refit_status_t ipc_create(const char *options, refit_transport_t **out)
{
    refit_transport_t *t = (refit_transport_t *)calloc(1, sizeof(*t));
    if (!t) return refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc transport");
    t->device = -1;
    const char *p = options ? strstr(options, "device=") : NULL;
    if (p && (p == options || p[-1] == ',')) {
        char *end;
        long v = strtol(p + 7, &end, 10);
        if (end == p + 7 || v < -1 || v > 1024 || (*end && *end != ',')) {
            free(t);
            return refit_error(REFIT_ERR_INVALID_ARG, "cuda_ipc: bad option '%s' (device=N)", options);
        }
        t->device = (int)v;
    }
    /* exec=dst (default): the receiver's GPU pulls over P2P; exec=src: the
     * source's GPU pushes; exec=alt: even receiver ranks pull, odd ones push,
     * which spreads the copies of receivers that share a GPU over both GPUs
     * (kernels of different processes on one GPU take turns). */
    long rank = 0;
    const char *rk = options ? strstr(options, "rank=") : NULL;
    if (rk && (rk == options || rk[-1] == ',')) rank = strtol(rk + 5, NULL, 10);
    const char *x = options ? strstr(options, "exec=") : NULL;
    if (x && (x == options || x[-1] == ',')) {
        bool end = !x[8] || x[8] == ',';
        if (end && !strncmp(x + 5, "src", 3)) t->exec_src = true;
        else if (end && !strncmp(x + 5, "alt", 3)) t->exec_src = rank % 2 == 1;
        else if (!end || strncmp(x + 5, "dst", 3)) {
            free(t);
            return refit_error(REFIT_ERR_INVALID_ARG, "cuda_ipc: bad option '%s' (exec=dst|src|alt)", options);
        }
    }
    t->turns = -1;
    const char *tu = options ? strstr(options, "turns=") : NULL;
    if (tu && (tu == options || tu[-1] == ',')) {
        size_t l = strcspn(tu + 6, ",");
        if (l == 1 && (tu[6] == '0' || tu[6] == '1')) t->turns = tu[6] - '0';
        else if (l == 4 && !strncmp(tu + 6, "auto", 4)) t->turns = -1;
        else {
            free(t);
            return refit_error(REFIT_ERR_INVALID_ARG, "cuda_ipc: bad option '%s' (turns=auto|0|1)", options);
        }
    }
    const char *cm = options ? strstr(options, "copy=") : NULL;
    if (cm && (cm == options || cm[-1] == ',')) {
        size_t l = strcspn(cm + 5, ",");
        if (l == 4 && !strncmp(cm + 5, "auto", 4)) t->copy_mode = 0;
        else if (l == 6 && !strncmp(cm + 5, "kernel", 6)) t->copy_mode = 1;
        else if (l == 6 && !strncmp(cm + 5, "memcpy", 6)) t->copy_mode = 2;
        else {
            free(t);
            return refit_error(REFIT_ERR_INVALID_ARG, "cuda_ipc: bad option '%s' (copy=auto|kernel|memcpy)", options);
        }
    }
    pthread_mutex_init(&t->lock, NULL);
    *out = t;
    return REFIT_OK;
}

static void ipc_destroy(refit_transport_t *t)
{
    if (!t) return;
    for (int i = 0; i < EXEC_CACHE; i++) {
        refit_gpu_batch_destroy(t->exec[i].batch);
        refit_gpu_batch_destroy(t->exec[i].small);
        refit_gpu_fp8_destroy(t->exec[i].fp8);
        refit_gpu_digest_fused_destroy(t->exec[i].fused);
        refit_gpu_batch_destroy(t->exec[i].rest);
    }
    for (uint32_t i = 0; i < t->nopened; i++)
        if (t->opened[i].base) cudaIpcCloseMemHandle(t->opened[i].base);
    for (size_t i = 0; i < t->registered.len; i++) refit_gpu_host_unregister(t->registered.data[i].base);
    for (size_t i = 0; i < t->allocs.len; i++) refit_gpu_free(t->allocs.data[i].base);
    REFIT_VEC_FREE(&t->allocs);
    REFIT_VEC_FREE(&t->registered);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static refit_status_t ipc_alloc(refit_transport_t *t, uint64_t size, void **base)
{
    int dev = t->device >= 0 ? t->device : 0;
    refit_status_t st = refit_gpu_alloc(dev, size, base);
    if (st) return st;
    pthread_mutex_lock(&t->lock);
    int rc = REFIT_VEC_PUSH(&t->allocs, ((reg_t){*base, size}));
    pthread_mutex_unlock(&t->lock);
    if (rc) {
        refit_gpu_free(*base);
        return refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc: allocation table");
    }
    return REFIT_OK;
}

static void ipc_free(refit_transport_t *t, void *base, uint64_t size)
{
    (void)size;
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < t->allocs.len; i++)
        if (t->allocs.data[i].base == base) {
            refit_gpu_free(base);
            t->allocs.data[i] = t->allocs.data[--t->allocs.len];
            break;
        }
    pthread_mutex_unlock(&t->lock);
}

static bool g_warned_pages; /* once per process */

static refit_status_t ipc_expose(refit_transport_t *t, void *base, uint64_t size, void **desc, size_t *len)
{
    refit_status_t st = REFIT_OK;
    (void)t;
    int dev = pointer_device(base), saved = current_device();
    if (dev < 0)
        return refit_error(REFIT_ERR_UNSUPPORTED, "cuda_ipc exposes GPU memory only (this region is host memory)");
    ipc_desc_t *d = (ipc_desc_t *)calloc(1, sizeof(*d));
    if (!d) return refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc descriptor");
    unsigned long long alloc_base = (unsigned long long)(uintptr_t)base;
    size_t alloc_size = 0;
    get_range_fn range = get_range();
    cudaIpcMemHandle_t h;
    char uuid[48];
    if ((st = refit_gpu_uuid(dev, uuid))) goto out;
    CK(cudaSetDevice(dev));
    if (range && range(&alloc_base, &alloc_size, (unsigned long long)(uintptr_t)base) != 0) {
        st = refit_error(REFIT_ERR_TRANSPORT, "cuda_ipc: cannot find the allocation holding %p", base);
        goto out;
    }
    if (alloc_size && (uintptr_t)base + size > alloc_base + alloc_size) {
        st = refit_error(REFIT_ERR_INVALID_ARG, "cuda_ipc: a region spans more than one allocation");
        goto out;
    }
    if (alloc_size % (2u << 20) && !g_warned_pages) { /* memory attached from elsewhere (ours are whole 2 MiB) */
        g_warned_pages = true;
        refit_log(REFIT_LOG_WARN,
                  "cuda_ipc: exposing an allocation of %zu bytes, not a multiple of 2 MiB: other processes map it "
                  "with small pages and copy from it about 20%% slower (docs/gpu.md, Colocated)",
                  alloc_size);
    }
    CK(cudaIpcGetMemHandle(&h, (void *)(uintptr_t)alloc_base));
    d->magic = IPC_MAGIC;
    d->version = IPC_DESC_VERSION;
    d->pid = (uint32_t)getpid();
    d->device = dev;
    d->start_time = refit_proc_start_time(d->pid);
    d->offset = (uint64_t)((uintptr_t)base - alloc_base);
    d->size = size;
    d->addr = (uint64_t)(uintptr_t)base;
    refit_boot_id(d->boot_id);
    memcpy(d->uuid, uuid, sizeof(d->uuid));
    memcpy(d->handle, &h, sizeof(h));
out:
    if (saved >= 0) cudaSetDevice(saved);
    if (st) {
        free(d);
        return st;
    }
    *desc = d;
    *len = sizeof(*d);
    return REFIT_OK;
}

static void ipc_unexpose(refit_transport_t *t, void *base)
{
    (void)t;
    (void)base;
}

static void release_open(refit_transport_t *t, void *base)
{
    pthread_mutex_lock(&t->lock);
    for (uint32_t i = 0; i < t->nopened; i++)
        if (t->opened[i].base == base && --t->opened[i].refs == 0) {
            cudaIpcCloseMemHandle(base);
            t->opened[i] = t->opened[--t->nopened];
            break;
        }
    pthread_mutex_unlock(&t->lock);
}

static void ipc_disconnect(refit_peer_t *p)
{
    if (!p) return;
    for (uint32_t i = 0; i < p->n; i++)
        if (p->regions[i].base) release_open(p->t, p->regions[i].base);
    free(p->regions);
    free(p);
}

/* Opens (or finds) the allocation of handle h on device dev. */
static refit_status_t open_handle(refit_transport_t *t, const unsigned char *h, int dev, void **base)
{
    refit_status_t st = REFIT_OK;
    pthread_mutex_lock(&t->lock);
    for (uint32_t i = 0; i < t->nopened; i++)
        if (t->opened[i].dev == dev && memcmp(t->opened[i].handle, h, CUDA_IPC_HANDLE_SIZE) == 0) {
            t->opened[i].refs++;
            *base = t->opened[i].base;
            pthread_mutex_unlock(&t->lock);
            return REFIT_OK;
        }
    int saved = current_device();
    cudaIpcMemHandle_t mh;
    memcpy(&mh, h, sizeof(mh));
    void *p = NULL;
    if (t->nopened == MAX_OPEN) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc: more than %d open handles", MAX_OPEN);
        goto out;
    }
    CK(cudaSetDevice(dev));
    CK(cudaIpcOpenMemHandle(&p, mh, cudaIpcMemLazyEnablePeerAccess));
    memcpy(t->opened[t->nopened].handle, h, CUDA_IPC_HANDLE_SIZE);
    t->opened[t->nopened].dev = dev;
    t->opened[t->nopened].base = p;
    t->opened[t->nopened].refs = 1;
    t->nopened++;
    *base = p;
out:
    if (saved >= 0) cudaSetDevice(saved);
    pthread_mutex_unlock(&t->lock);
    return st;
}

static refit_status_t ipc_connect(refit_transport_t *t, const void *const *descs, const size_t *lens, uint32_t n,
                                  refit_peer_t **out)
{
    refit_status_t st = REFIT_OK;
    char my_boot[40];
    refit_boot_id(my_boot);
    refit_peer_t *p = (refit_peer_t *)calloc(1, sizeof(*p));
    if (!p || !(p->regions = (ipc_region_t *)calloc(n ? n : 1, sizeof(ipc_region_t)))) {
        free(p);
        return refit_error(REFIT_ERR_NO_MEMORY, "cuda_ipc peer");
    }
    p->t = t;
    p->n = n;
    p->dev = p->src_dev = -1;
    if (!refit_gpu_count()) {
        st = refit_error(REFIT_ERR_UNSUPPORTED, "cuda_ipc: no CUDA device in this process");
        goto err;
    }
    for (uint32_t i = 0; i < n; i++) {
        ipc_desc_t d;
        if (!descs[i] || lens[i] != sizeof(d)) {
            st = refit_error(REFIT_ERR_CORRUPT, "cuda_ipc: region %u descriptor has %zu bytes, want %zu", i, lens[i],
                             sizeof(d));
            goto err;
        }
        memcpy(&d, descs[i], sizeof(d));
        d.boot_id[39] = d.uuid[47] = '\0';
        if (d.magic != IPC_MAGIC || d.version != IPC_DESC_VERSION) {
            st = refit_error(REFIT_ERR_CORRUPT,
                             "cuda_ipc: region %u descriptor is not a version-%d cuda_ipc descriptor", i,
                             IPC_DESC_VERSION);
            goto err;
        }
        if (strcmp(d.boot_id, my_boot) != 0) {
            st = refit_error(REFIT_ERR_TRANSPORT, "cuda_ipc: the source runs on another host (boot id %s, ours %s)",
                             d.boot_id, my_boot);
            goto err;
        }
        if (refit_proc_start_time(d.pid) != d.start_time) {
            st = refit_error(REFIT_ERR_PEER, "cuda_ipc: source process %u is gone (or its pid was reused)", d.pid);
            goto err;
        }
        p->pid = d.pid;
        p->start_time = d.start_time;
        p->regions[i].size = d.size;
        if (p->src_dev < 0) p->src_dev = device_by_uuid(d.uuid);
        if (p->dev < 0) p->dev = (t->exec_src && p->src_dev >= 0) || t->device < 0 ? p->src_dev : t->device;
        if (p->dev < 0) {
            st = refit_error(REFIT_ERR_TRANSPORT,
                             "cuda_ipc: the source's GPU %s is not visible here, and no device= is set", d.uuid);
            goto err;
        }
        if (p->src_dev >= 0 && !refit_gpu_can_access_peer(p->dev, p->src_dev)) {
            st = refit_error(REFIT_ERR_TRANSPORT, "cuda_ipc: GPU %d cannot read GPU %d directly (no peer access)",
                             p->dev, p->src_dev);
            goto err;
        }
        if (d.pid == (uint32_t)getpid()) {
            p->regions[i].ptr = (void *)(uintptr_t)d.addr;
            continue;
        }
        void *base = NULL;
        if ((st = open_handle(t, d.handle, p->dev, &base))) goto err;
        p->regions[i].base = base;
        p->regions[i].ptr = (char *)base + d.offset;
    }
    *out = p;
    return REFIT_OK;
err:
    ipc_disconnect(p); /* undoes the opens made so far */
    return st;
}

static refit_status_t ipc_region_ptr(refit_peer_t *p, uint32_t region, void **ptr, int *dev)
{
    if (!p || region >= p->n || !ptr || !dev)
        return refit_error(REFIT_ERR_INVALID_ARG, "cuda_ipc: no region %u of this source", region);
    *ptr = p->regions[region].ptr;
    /* opened here: on p->dev; the receiver's own process: wherever it lives */
    *dev = p->regions[region].base ? p->dev : pointer_device(*ptr);
    return REFIT_OK;
}

static refit_status_t ipc_alive(const refit_peer_t *p)
{
    if (refit_proc_start_time(p->pid) != p->start_time)
        return refit_error(REFIT_ERR_PEER, "cuda_ipc: source process %u died", p->pid);
    return REFIT_OK;
}

static const refit_transport_devmem_t ipc_devmem = {ipc_region_ptr, ipc_alive};

/* Extensions: quantize-on-copy for FP8 receivers (cuda_ipc_pull.cu), the
 * sources' memory as mapped here; no conditional pulls. */
static const void *ipc_ext(refit_transport_ext_kind_t kind)
{
    if (kind == REFIT_TEXT_DEVMEM) return &ipc_devmem;
    return kind == REFIT_TEXT_FP8 ? &cuda_ipc_fp8_ext : NULL;
}

extern "C" const refit_transport_ops_t refit_transport_cuda_ipc = {
    "cuda_ipc",    REFIT_TCAP_DEVICE_SRC | REFIT_TCAP_DEVICE_DST | REFIT_TCAP_HOST_DST,
    ipc_create,    ipc_destroy,
    ipc_alloc,     ipc_free,
    ipc_expose,    ipc_unexpose,
    ipc_connect,   ipc_disconnect,
    cuda_ipc_pull, NULL, /* set_key: IPC handles are opened by CUDA, not over a connection (docs/security.md) */
    cuda_ipc_warm, ipc_ext,
};
