/* CUDA runtime glue: devices (count, identity, peers), memory (device,
 * pinned host), the device guard and grid sizing the kernels' launchers use
 * (gpu.cu), and GPU turns and event waits (see gpu.h). */
#include "transport/cuda/gpu_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

/* ---- devices ------------------------------------------------------------ */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_count = -1;
static const void *g_kernels[4];
static int g_blocks[4][64]; /* resident blocks per kernel and device (0: not yet known) */

refit_status_t gpu_enter(int dev, devguard_t *g)
{
    refit_status_t st = REFIT_OK;
    g->saved = -1;
    if (dev < 0 || dev >= refit_gpu_count())
        return refit_error(REFIT_ERR_UNSUPPORTED, "CUDA device %d is not here (%d device(s))", dev, refit_gpu_count());
    CK(cudaGetDevice(&g->saved));
    if (g->saved != dev) CK(cudaSetDevice(dev));
out:
    return st;
}

void gpu_leave(devguard_t *g)
{
    int cur = -1;
    if (g->saved >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != g->saved) cudaSetDevice(g->saved);
}

extern "C" int refit_gpu_count(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_count < 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) {
            n = 0;
            cudaGetLastError();
        }
        g_count = n;
    }
    int n = g_count;
    pthread_mutex_unlock(&g_lock);
    return n;
}

int gpu_grid_for(int dev, uint64_t nchunks, const void *kernel)
{
    pthread_mutex_lock(&g_lock);
    int k = 0;
    while (k < 3 && g_kernels[k] && g_kernels[k] != kernel) k++;
    g_kernels[k] = kernel;
    int per = dev < 64 ? g_blocks[k][dev] : 0;
    pthread_mutex_unlock(&g_lock);
    if (!per) {
        int sms = 0, occ = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, THREADS, 0);
        per = (sms > 0 ? sms : 1) * (occ > 0 ? occ : 4);
        pthread_mutex_lock(&g_lock);
        if (dev < 64) g_blocks[k][dev] = per;
        pthread_mutex_unlock(&g_lock);
    }
    return nchunks < (uint64_t)per ? (int)(nchunks ? nchunks : 1) : per;
}

static void format_uuid(const cudaDeviceProp *p, char *out, size_t n)
{
    const unsigned char *u = (const unsigned char *)p->uuid.bytes;
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3],
             u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

extern "C" refit_status_t refit_gpu_uuid(int dev, char out[48])
{
    refit_status_t st = REFIT_OK;
    cudaDeviceProp p;
    out[0] = '\0';
    if (dev < 0 || dev >= refit_gpu_count())
        return refit_error(REFIT_ERR_UNSUPPORTED, "CUDA device %d is not here", dev);
    CK(cudaGetDeviceProperties(&p, dev));
    format_uuid(&p, out, 48);
out:
    return st;
}

extern "C" refit_status_t refit_gpu_info(int dev, refit_gpu_info_t *o)
{
    refit_status_t st = REFIT_OK;
    devguard_t g;
    memset(o, 0, sizeof(*o));
    if ((st = gpu_enter(dev, &g))) return st;
    {
        cudaDeviceProp p;
        size_t fr = 0, tot = 0;
        CK(cudaGetDeviceProperties(&p, dev));
        snprintf(o->name, sizeof(o->name), "%s", p.name);
        format_uuid(&p, o->uuid, sizeof(o->uuid));
        snprintf(o->pci, sizeof(o->pci), "%04x:%02x:%02x.0", p.pciDomainID, p.pciBusID, p.pciDeviceID);
        o->memory = p.totalGlobalMem;
        o->sms = p.multiProcessorCount;
        o->cc_major = p.major;
        o->cc_minor = p.minor;
        CK(cudaMemGetInfo(&fr, &tot));
        o->free_memory = fr;
        CK(cudaDriverGetVersion(&o->driver));
        CK(cudaRuntimeGetVersion(&o->runtime));
    }
out:
    gpu_leave(&g);
    return st;
}

extern "C" bool refit_gpu_can_access_peer(int dev, int peer)
{
    int ok = 0;
    if (dev == peer) return true;
    if (cudaDeviceCanAccessPeer(&ok, dev, peer) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return ok != 0;
}

extern "C" refit_status_t refit_gpu_enable_peer(int dev, int peer)
{
    refit_status_t st = REFIT_OK;
    devguard_t g;
    if (dev == peer) return REFIT_OK;
    if (!refit_gpu_can_access_peer(dev, peer))
        return refit_error(REFIT_ERR_TRANSPORT, "GPU %d cannot access GPU %d directly (no peer access)", dev, peer);
    if ((st = gpu_enter(dev, &g))) return st;
    {
        cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
        else CK(e);
    }
out:
    gpu_leave(&g);
    return st;
}

/* Allocations are whole multiples of ALLOC_ROUND.  A cudaMalloc whose size
 * is not a multiple of 2 MiB (a publisher's arena: 32,073,216,000 bytes for
 * Qwen3-30B-A3B megatron:ep=2) reads as fast as any in its own process, but
 * opened in another with cudaIpcOpenMemHandle on one H200 it took 170 ms
 * to open and every copy from it ran at 1.65 TB/s instead of 2.07
 * (bench/ipc_probe.cu replay, docs/gpu.md "Colocated").  REFIT_CUDA_ALLOC_ROUND
 * (bytes, 0: none) overrides it, for that comparison. */
#define ALLOC_ROUND (2ull << 20)

static uint64_t alloc_round(void)
{
    const char *e = refit_diag()->cuda_alloc_round; /* read once, under pthread_once (util/env.h) */
    return e && *e ? strtoull(e, NULL, 0) : ALLOC_ROUND;
}

extern "C" refit_status_t refit_gpu_alloc(int dev, uint64_t size, void **out)
{
    refit_status_t st = REFIT_OK;
    devguard_t g;
    void *p = NULL;
    uint64_t r = alloc_round(), n = size ? size : 1;
    *out = NULL;
    if (r > 1 && n % r) n += r - n % r;
    if ((st = gpu_enter(dev, &g))) return st;
    CK(cudaMalloc(&p, n));
    CK(cudaMemset(p, 0, n));
    CK(cudaDeviceSynchronize());
    *out = p;
    p = NULL;
out:
    if (p) cudaFree(p);
    if (st) refit_error_prefix("GPU %d: %" PRIu64 " bytes", dev, size);
    gpu_leave(&g);
    return st;
}

extern "C" void refit_gpu_free(void *p)
{
    if (p) cudaFree(p);
}

extern "C" refit_status_t refit_gpu_host_alloc(uint64_t size, void **out)
{
    refit_status_t st = REFIT_OK;
    *out = NULL;
    if (!refit_gpu_count()) return refit_error(REFIT_ERR_UNSUPPORTED, "pinned memory needs a CUDA device");
    CK(cudaHostAlloc(out, size ? size : 1, cudaHostAllocPortable | cudaHostAllocMapped));
    memset(*out, 0, size);
out:
    return st;
}

extern "C" void refit_gpu_host_free(void *p)
{
    if (p) cudaFreeHost(p);
}

extern "C" refit_status_t refit_gpu_copy(void *dst, const void *src, uint64_t n)
{
    refit_status_t st = REFIT_OK;
    CK(cudaMemcpy(dst, src, n, cudaMemcpyDefault));
    CK(cudaStreamSynchronize(0)); /* a device-to-device cudaMemcpy returns before it is done */
out:
    return st;
}

extern "C" refit_status_t refit_gpu_host_register(void *p, uint64_t n)
{
    refit_status_t st = REFIT_OK;
    CK(cudaHostRegister(p, n, cudaHostRegisterMapped | cudaHostRegisterPortable));
out:
    return st;
}

extern "C" void refit_gpu_host_unregister(void *p)
{
    if (p && cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

/* ---- GPU turns (see gpu.h) ------------------------------------------------ */

static int g_turn_fd[64];
static bool g_turn_init;

extern "C" int refit_gpu_turn_take(int dev, double grace_s, double max_wait_s)
{
    if (dev < 0 || dev >= 64) return -1;
    pthread_mutex_lock(&g_lock);
    if (!g_turn_init) {
        for (int d = 0; d < 64; d++) g_turn_fd[d] = -1;
        g_turn_init = true;
    }
    int fd = g_turn_fd[dev];
    if (fd == -1) {
        char uuid[48], path[128];
        fd = -2;
        pthread_mutex_unlock(&g_lock);
        bool have = refit_gpu_uuid(dev, uuid) == REFIT_OK;
        pthread_mutex_lock(&g_lock);
        if (have) {
            snprintf(path, sizeof(path), "/dev/shm/refit-%u-%s.turn", (unsigned)getuid(), uuid);
            int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
            if (f >= 0) fd = f;
        }
        if (g_turn_fd[dev] == -1) g_turn_fd[dev] = fd;
        else if (fd >= 0) {
            close(fd);
            fd = g_turn_fd[dev];
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (fd < 0) return -1;
    if (grace_s > 0) usleep((useconds_t)(grace_s * 1e6));
    double until = refit_now() + max_wait_s;
    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
        if (errno != EWOULDBLOCK && errno != EINTR) return -1;
        if (refit_now() > until) return -1;
        usleep(20);
    }
}

extern "C" void refit_gpu_turn_give(int fd)
{
    if (fd >= 0) flock(fd, LOCK_UN);
}

extern "C" refit_status_t refit_gpu_event_wait(void *event, int dev, const char *what, refit_status_t (*tick)(void *),
                                               void *user, double deadline)
{
    refit_status_t later = REFIT_OK;
    char detail[512] = "";
    double last = refit_now();
    for (;;) {
        cudaError_t e = cudaEventQuery((cudaEvent_t)event);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady)
            return refit_error(REFIT_ERR_TRANSPORT, "GPU %d %s: %s", dev, what, cudaGetErrorString(e));
        double now = refit_now();
        if (!later && tick && now - last > 0.01) {
            last = now;
            if ((later = tick(user))) snprintf(detail, sizeof(detail), "%s", refit_last_error());
        }
        if (!later && deadline > 0 && now > deadline) {
            later = refit_error(REFIT_ERR_TIMEOUT, "the GPU %s ran past its deadline", what);
            snprintf(detail, sizeof(detail), "%s", refit_last_error());
        }
        usleep(20);
    }
    if (later) return refit_error(later, "%s", detail);
    return REFIT_OK;
}
