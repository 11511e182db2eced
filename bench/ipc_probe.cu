/* bench/ipc_probe.cu - why a colocated refit copies slower than a plain
 * device-to-device copy (issue 16): times, on one GPU, cudaMemcpyAsync
 * device to device of the same bytes from
 *   (a) a buffer of this process (cudaMalloc),
 *   (b) a buffer of another process opened with cudaIpcOpenMemHandle (what
 *       cuda_ipc does today), and the time the open took,
 *   (c) a buffer of another process exported as a POSIX file descriptor
 *       (CUDA VMM: cuMemCreate, cuMemExportToShareableHandle), imported and
 *       mapped here (cuMemImportFromShareableHandle, cuMemMap,
 *       cuMemSetAccess), and the time that took.
 * The exporting process is a forked child that talks over a unix socket
 * (the descriptor travels with SCM_RIGHTS).  Build and run on the GPU
 * machine:  nvcc -O2 -arch=sm_90 -o ipc_probe bench/ipc_probe.cu -lcuda && ./ipc_probe GB
 *
 * ./ipc_probe replay TRACE [FILL_MS] replays the copy calls of the last pull
 * in TRACE (written by a receiver run with REFIT_CUDA_TRACE=TRACE, cuda_ipc
 * copy=auto) at the same offsets in allocations of the same sizes, timing
 * each call with events:
 *   own:      every allocation in this process;
 *   ipc:      each source allocation made by its own child process, opened
 *             here with cudaIpcOpenMemHandle (as cuda_ipc does);
 *   ipc-fill: the same right after the children ran pattern kernels on their
 *             sources for FILL_MS (default 250: the publishers' truth fill);
 *   ipc-busy: the same while the children run such kernels (time slicing);
 *   one:      a single copy of as many bytes (from the largest source).
 * Prints one line per mode and, per copy call, the refit's time and the
 * replays' (replay-copies.txt in the current directory).
 *
 * ./ipc_probe sizes BYTES... : for each size, a child process cudaMallocs a
 * buffer of exactly that many bytes; this process opens it with
 * cudaIpcOpenMemHandle (timed) and copies 8 GiB from its start and 8 GiB
 * from its end into a buffer of its own (medians of 3, events), against the
 * same copies from a buffer of its own. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                                 \
    do {                                                                                      \
        cudaError_t e = (x);                                                                  \
        if (e) {                                                                              \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)
#define DK(x)                                                             \
    do {                                                                  \
        CUresult e = (x);                                                 \
        if (e) {                                                          \
            const char *m;                                                \
            cuGetErrorString(e, &m);                                      \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, m); \
            exit(1);                                                      \
        }                                                                 \
    } while (0)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__global__ void pattern(unsigned long long *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = i * 0x9e3779b97f4a7c15ull;
}

static void send_fd(int s, int fd, const void *buf, size_t len)
{
    struct msghdr m;
    memset(&m, 0, sizeof m);
    struct iovec io = {(void *)buf, len};
    char c[CMSG_SPACE(sizeof(int))];
    memset(c, 0, sizeof c);
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    if (fd >= 0) {
        m.msg_control = c;
        m.msg_controllen = sizeof c;
        struct cmsghdr *h = CMSG_FIRSTHDR(&m);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(h), &fd, sizeof(int));
    }
    if (sendmsg(s, &m, 0) < 0) {
        perror("sendmsg");
        exit(1);
    }
}

static int recv_fd(int s, void *buf, size_t len)
{
    struct msghdr m;
    memset(&m, 0, sizeof m);
    struct iovec io = {buf, len};
    char c[CMSG_SPACE(sizeof(int))];
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    m.msg_control = c;
    m.msg_controllen = sizeof c;
    if (recvmsg(s, &m, MSG_WAITALL) < 0) {
        perror("recvmsg");
        exit(1);
    }
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    int fd = -1;
    if (h && h->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(h), sizeof(int));
    return fd;
}

static double time_copy(void *dst, const void *src, size_t n, cudaStream_t st)
{
    double best[5];
    for (int i = -1; i < 5; i++) {
        double t0 = now();
        CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, st));
        CK(cudaStreamSynchronize(st));
        if (i >= 0) best[i] = now() - t0;
    }
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            if (best[j] < best[i]) {
                double t = best[i];
                best[i] = best[j];
                best[j] = t;
            }
    return best[2];
}

static int replay_main(int argc, char **argv);
static int sizes_main(int argc, char **argv);

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "replay")) return replay_main(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "sizes")) return sizes_main(argc, argv);
    size_t gb = argc > 1 ? strtoull(argv[1], 0, 10) : 16, n = gb << 30;
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    pid_t pid = fork();
    if (pid == 0) { /* the exporter: a cudaMalloc buffer (IPC handle) and a VMM buffer (fd) */
        close(sv[0]);
        CK(cudaSetDevice(0));
        void *a;
        CK(cudaMalloc(&a, n));
        pattern<<<1024, 256>>>((unsigned long long *)a, n / 8);
        cudaIpcMemHandle_t h;
        CK(cudaIpcGetMemHandle(&h, a));
        DK(cuInit(0));
        CUdevice dev;
        DK(cuDeviceGet(&dev, 0));
        CUmemAllocationProp p;
        memset(&p, 0, sizeof p);
        p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = 0;
        p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        size_t gran;
        DK(cuMemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
        CUmemGenericAllocationHandle vh;
        DK(cuMemCreate(&vh, n, &p, 0));
        CUdeviceptr va;
        DK(cuMemAddressReserve(&va, n, 0, 0, 0));
        DK(cuMemMap(va, n, 0, vh, 0));
        CUmemAccessDesc ad;
        memset(&ad, 0, sizeof ad);
        ad.location = p.location;
        ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        DK(cuMemSetAccess(va, n, &ad, 1));
        pattern<<<1024, 256>>>((unsigned long long *)va, n / 8);
        CK(cudaDeviceSynchronize());
        int fd = -1;
        DK(cuMemExportToShareableHandle(&fd, vh, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        send_fd(sv[1], fd, &h, sizeof h);
        char done;
        if (read(sv[1], &done, 1) != 1) {
        }
        return 0;
    }
    close(sv[1]);
    cudaIpcMemHandle_t h;
    int fd = recv_fd(sv[0], &h, sizeof h);
    CK(cudaSetDevice(0));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void *mine, *dst;
    CK(cudaMalloc(&mine, n));
    CK(cudaMalloc(&dst, n));
    pattern<<<1024, 256>>>((unsigned long long *)mine, n / 8);
    CK(cudaMemset(dst, 1, n));
    CK(cudaDeviceSynchronize());
    double t_local = time_copy(dst, mine, n, st);
    double t0 = now();
    void *ipc;
    CK(cudaIpcOpenMemHandle(&ipc, h, cudaIpcMemLazyEnablePeerAccess));
    double t_open = now() - t0;
    double t_ipc = time_copy(dst, ipc, n, st);
    DK(cuInit(0));
    t0 = now();
    CUmemGenericAllocationHandle vh;
    DK(cuMemImportFromShareableHandle(&vh, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CUdeviceptr va;
    DK(cuMemAddressReserve(&va, n, 0, 0, 0));
    DK(cuMemMap(va, n, 0, vh, 0));
    CUmemAccessDesc ad;
    memset(&ad, 0, sizeof ad);
    ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ad.location.id = 0;
    ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    DK(cuMemSetAccess(va, n, &ad, 1));
    double t_vmm_open = now() - t0;
    double t_vmm = time_copy(dst, (void *)va, n, st);
    printf(
        "{\"gb\":%zu,\"local_copy_s\":%.6f,\"ipc_open_s\":%.6f,\"ipc_copy_s\":%.6f,\"vmm_import_map_s\":%.6f,\"vmm_copy_s\":%.6f}\n",
        gb, t_local, t_open, t_ipc, t_vmm_open, t_vmm);
    printf("local %.2f GB/s, cudaIpc-opened %.2f GB/s (open %.1f ms), VMM fd-imported %.2f GB/s (import+map %.1f ms)\n",
           n / t_local / 1e9, n / t_ipc / 1e9, t_open * 1e3, n / t_vmm / 1e9, t_vmm_open * 1e3);
    if (write(sv[0], "x", 1) != 1) {
    }
    waitpid(pid, NULL, 0);
    return 0;
}

/* ---- replay ------------------------------------------------------------- */

#define MAXA 16
#define MAXC 8192

typedef struct {
    unsigned long long base;
    size_t size;
} tr_alloc_t;

static tr_alloc_t g_src[MAXA], g_dst[MAXA];
static int g_nsrc, g_ndst, g_nc;
static int c_sa[MAXC], c_da[MAXC];
static size_t c_so[MAXC], c_do[MAXC], c_n[MAXC];
static double c_refit[MAXC];

static int find_alloc(const tr_alloc_t *a, int n, unsigned long long p, size_t *off)
{
    for (int i = 0; i < n; i++)
        if (p >= a[i].base && p < a[i].base + a[i].size) {
            *off = p - a[i].base;
            return i;
        }
    return -1;
}

static void parse_trace(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        exit(1);
    }
    char line[512];
    unsigned long long sp[MAXC], dp[MAXC];
    while (fgets(line, sizeof line, f)) {
        unsigned long long b, s, d;
        size_t n;
        unsigned k;
        double dur;
        if (!strncmp(line, "pull ", 5)) g_nsrc = g_ndst = g_nc = 0; /* keep the last pull */
        else if (sscanf(line, "alloc src %u base %llx size %zu", &k, &b, &n) == 3 && g_nsrc < MAXA)
            g_src[g_nsrc++] = (tr_alloc_t){b, n};
        else if (sscanf(line, "alloc dst %u base %llx size %zu", &k, &b, &n) == 3 && g_ndst < MAXA)
            g_dst[g_ndst++] = (tr_alloc_t){b, n};
        else if (sscanf(line, "copy %u src %llx dst %llx bytes %zu start %*f ms dur %lf", &k, &s, &d, &n, &dur) == 5 &&
                 g_nc < MAXC) {
            sp[g_nc] = s;
            dp[g_nc] = d;
            c_n[g_nc] = n;
            c_refit[g_nc] = dur;
            g_nc++;
        }
    }
    fclose(f);
    for (int i = 0; i < g_nc; i++) {
        c_sa[i] = find_alloc(g_src, g_nsrc, sp[i], &c_so[i]);
        c_da[i] = find_alloc(g_dst, g_ndst, dp[i], &c_do[i]);
        if (c_sa[i] < 0 || c_da[i] < 0 || c_so[i] + c_n[i] > g_src[c_sa[i]].size ||
            c_do[i] + c_n[i] > g_dst[c_da[i]].size) {
            fprintf(stderr, "replay: copy %d lies outside the traced allocations\n", i);
            exit(1);
        }
    }
}

/* One replay of every copy call on st; per-call times into ms[]; returns the span. */
static double replay_once(void *const *src, void *const *dst, cudaStream_t st, cudaEvent_t *ev, double *ms)
{
    for (int i = 0; i < g_nc; i++) {
        CK(cudaEventRecord(ev[i], st));
        CK(cudaMemcpyAsync((char *)dst[c_da[i]] + c_do[i], (const char *)src[c_sa[i]] + c_so[i], c_n[i],
                           cudaMemcpyDeviceToDevice, st));
    }
    CK(cudaEventRecord(ev[g_nc], st));
    CK(cudaStreamSynchronize(st));
    for (int i = 0; i < g_nc; i++) {
        float x;
        CK(cudaEventElapsedTime(&x, ev[i], ev[i + 1]));
        ms[i] = x;
    }
    float span;
    CK(cudaEventElapsedTime(&span, ev[0], ev[g_nc]));
    return span;
}

static double med(double *v, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (v[j] < v[i]) {
                double t = v[i];
                v[i] = v[j];
                v[j] = t;
            }
    return v[n / 2];
}

static void child_loop(int s, size_t n)
{
    void *a = NULL;
    char c;
    while (read(s, &c, 1) == 1) {
        if (c == 'A') {
            CK(cudaSetDevice(0));
            CK(cudaMalloc(&a, n));
            pattern<<<1024, 256>>>((unsigned long long *)a, n / 8);
            CK(cudaDeviceSynchronize());
            cudaIpcMemHandle_t h;
            CK(cudaIpcGetMemHandle(&h, a));
            if (write(s, &h, sizeof h) != (ssize_t)sizeof h) exit(1);
        } else if (c == 'F') { /* pattern kernels for the given milliseconds, then answer */
            double ms;
            if (read(s, &ms, sizeof ms) != (ssize_t)sizeof ms) exit(1);
            double t0 = now();
            while ((now() - t0) * 1e3 < ms) {
                pattern<<<1024, 256>>>((unsigned long long *)a, n / 8);
                CK(cudaDeviceSynchronize());
            }
            if (write(s, "f", 1) != 1) exit(1);
        } else break;
    }
    exit(0);
}

static int replay_main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: ipc_probe replay TRACE [FILL_MS]\n");
        return 2;
    }
    double fill_ms = argc > 3 ? atof(argv[3]) : 250;
    parse_trace(argv[2]);
    size_t total = 0;
    for (int i = 0; i < g_nc; i++) total += c_n[i];
    printf("replay: %d copy calls, %.3f GB, %d source and %d destination allocations\n", g_nc, total / 1e9, g_nsrc,
           g_ndst);
    if (!g_nc) return 1;
    int sock[MAXA];
    pid_t kids[MAXA];
    for (int a = 0; a < g_nsrc; a++) { /* before this process touches CUDA */
        int sv[2];
        socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
        kids[a] = fork();
        if (kids[a] == 0) {
            close(sv[0]);
            child_loop(sv[1], g_src[a].size);
        }
        close(sv[1]);
        sock[a] = sv[0];
    }
    CK(cudaSetDevice(0));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    static cudaEvent_t ev[MAXC + 1];
    for (int i = 0; i <= g_nc; i++) CK(cudaEventCreate(&ev[i]));
    void *dst[MAXA], *src[MAXA];
    for (int a = 0; a < g_ndst; a++) {
        CK(cudaMalloc(&dst[a], g_dst[a].size));
        CK(cudaMemset(dst[a], 1, g_dst[a].size));
    }
    static double per_own[MAXC], per_ipc[MAXC], per_fill[MAXC], tmp[MAXC];
    double spans[7];
    const int R = 5;
    /* own */
    for (int a = 0; a < g_nsrc; a++) {
        CK(cudaMalloc(&src[a], g_src[a].size));
        pattern<<<1024, 256>>>((unsigned long long *)src[a], g_src[a].size / 8);
    }
    CK(cudaDeviceSynchronize());
    replay_once(src, dst, st, ev, tmp); /* warm-up */
    for (int r = 0; r < R; r++) spans[r] = replay_once(src, dst, st, ev, r == R / 2 ? per_own : tmp);
    double own = med(spans, R);
    /* one copy of as many bytes, from the largest source */
    int big = 0;
    for (int a = 1; a < g_nsrc; a++)
        if (g_src[a].size > g_src[big].size) big = a;
    size_t one_n = g_src[big].size < g_dst[0].size ? g_src[big].size : g_dst[0].size;
    one_n &= ~(size_t)255;
    for (int r = 0; r <= R; r++) {
        CK(cudaEventRecord(ev[0], st));
        CK(cudaMemcpyAsync(dst[0], src[big], one_n, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(ev[1], st));
        CK(cudaStreamSynchronize(st));
        float x;
        CK(cudaEventElapsedTime(&x, ev[0], ev[1]));
        if (r) spans[r - 1] = x;
    }
    double one = med(spans, R);
    for (int a = 0; a < g_nsrc; a++) CK(cudaFree(src[a]));
    /* ipc: the sources in child processes */
    for (int a = 0; a < g_nsrc; a++)
        if (write(sock[a], "A", 1) != 1) return 1;
    for (int a = 0; a < g_nsrc; a++) {
        cudaIpcMemHandle_t h;
        if (recv(sock[a], &h, sizeof h, MSG_WAITALL) != (ssize_t)sizeof h) return 1;
        double t0 = now();
        CK(cudaIpcOpenMemHandle(&src[a], h, cudaIpcMemLazyEnablePeerAccess));
        printf("ipc: opened source %d (%.1f GB) in %.2f ms\n", a, g_src[a].size / 1e9, (now() - t0) * 1e3);
    }
    replay_once(src, dst, st, ev, tmp);
    for (int r = 0; r < R; r++) spans[r] = replay_once(src, dst, st, ev, r == R / 2 ? per_ipc : tmp);
    double ipc = med(spans, R);
    /* ipc-fill: right after the children's kernels; ipc-busy: during them */
    double fills[3], busy[3];
    for (int r = 0; r < 3; r++) {
        for (int a = 0; a < g_nsrc; a++)
            if (write(sock[a], "F", 1) != 1 || write(sock[a], &fill_ms, sizeof fill_ms) != (ssize_t)sizeof fill_ms)
                return 1;
        char c;
        for (int a = 0; a < g_nsrc; a++)
            if (read(sock[a], &c, 1) != 1) return 1;
        fills[r] = replay_once(src, dst, st, ev, r == 1 ? per_fill : tmp);
    }
    for (int r = 0; r < 3; r++) {
        double ms = 200;
        for (int a = 0; a < g_nsrc; a++)
            if (write(sock[a], "F", 1) != 1 || write(sock[a], &ms, sizeof ms) != (ssize_t)sizeof ms) return 1;
        usleep(30000);
        busy[r] = replay_once(src, dst, st, ev, tmp);
        char c;
        for (int a = 0; a < g_nsrc; a++)
            if (read(sock[a], &c, 1) != 1) return 1;
    }
    double refit = 0;
    for (int i = 0; i < g_nc; i++) refit += c_refit[i];
    printf("refit (trace, sum of calls)  %8.3f ms %7.1f GB/s\n", refit, total / refit / 1e6);
    printf("replay own                   %8.3f ms %7.1f GB/s (median of %d)\n", own, total / own / 1e6, R);
    printf("replay ipc                   %8.3f ms %7.1f GB/s (median of %d)\n", ipc, total / ipc / 1e6, R);
    printf("replay ipc-fill (%.0f ms)     %8.3f %8.3f %8.3f ms\n", fill_ms, fills[0], fills[1], fills[2]);
    printf("replay ipc-busy (200 ms)     %8.3f %8.3f %8.3f ms\n", busy[0], busy[1], busy[2]);
    printf("one copy of %.2f GB          %8.3f ms %7.1f GB/s\n", one_n / 1e9, one, one_n / one / 1e6);
    FILE *f = fopen("replay-copies.txt", "w");
    if (f) {
        fprintf(f,
                "# call bytes src_alloc src_off dst_off refit_ms own_ms ipc_ms ipc_fill_ms (refit GB/s, own GB/s)\n");
        for (int i = 0; i < g_nc; i++)
            fprintf(f, "%d %zu %d %zu %zu %.4f %.4f %.4f %.4f (%.0f, %.0f)\n", i, c_n[i], c_sa[i], c_so[i], c_do[i],
                    c_refit[i], per_own[i], per_ipc[i], per_fill[i], c_n[i] / c_refit[i] / 1e6,
                    c_n[i] / per_own[i] / 1e6);
        fclose(f);
    }
    for (int a = 0; a < g_nsrc; a++) {
        if (write(sock[a], "Q", 1) != 1) {
        }
        waitpid(kids[a], NULL, 0);
    }
    return 0;
}

/* ---- sizes ---------------------------------------------------------------- */

static double copy_ms(void *dst, const void *src, size_t n, cudaStream_t st)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    double v[3];
    for (int i = -1; i < 3; i++) {
        CK(cudaEventRecord(a, st));
        CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(b, st));
        CK(cudaStreamSynchronize(st));
        float x;
        CK(cudaEventElapsedTime(&x, a, b));
        if (i >= 0) v[i] = x;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return med(v, 3);
}

static int sizes_main(int argc, char **argv)
{
    int n = argc - 2;
    if (n < 1 || n > MAXA) {
        fprintf(stderr, "usage: ipc_probe sizes BYTES... (1..%d sizes)\n", MAXA);
        return 2;
    }
    size_t sz[MAXA];
    int sock[MAXA];
    pid_t kids[MAXA];
    const size_t span = 8ull << 30;
    for (int i = 0; i < n; i++) {
        sz[i] = strtoull(argv[i + 2], NULL, 0);
        if (sz[i] < span) {
            fprintf(stderr, "sizes: each at least 8 GiB\n");
            return 2;
        }
    }
    for (int i = 0; i < n; i++) { /* before this process touches CUDA */
        int sv[2];
        socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
        kids[i] = fork();
        if (kids[i] == 0) {
            close(sv[0]);
            child_loop(sv[1], sz[i]);
        }
        close(sv[1]);
        sock[i] = sv[0];
    }
    CK(cudaSetDevice(0));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void *dst, *mine;
    CK(cudaMalloc(&dst, span));
    CK(cudaMalloc(&mine, span));
    CK(cudaMemset(dst, 1, span));
    pattern<<<1024, 256>>>((unsigned long long *)mine, span / 8);
    CK(cudaDeviceSynchronize());
    double own = copy_ms(dst, mine, span, st);
    printf("sizes: own buffer: 8 GiB in %.3f ms, %.1f GB/s\n", own, span / own / 1e6);
    for (int i = 0; i < n; i++) {
        if (write(sock[i], "A", 1) != 1) return 1;
        cudaIpcMemHandle_t h;
        if (recv(sock[i], &h, sizeof h, MSG_WAITALL) != (ssize_t)sizeof h) return 1;
        void *p;
        double t0 = now();
        CK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
        double open_ms = (now() - t0) * 1e3;
        double head = copy_ms(dst, p, span, st);
        double tail = copy_ms(dst, (char *)p + ((sz[i] - span) & ~(size_t)255), span, st);
        printf("sizes: %zu bytes (%s2 MiB multiple, %s64 KiB multiple): open %.2f ms, head %.1f GB/s, tail %.1f GB/s\n",
               sz[i], sz[i] % (2u << 20) ? "no " : "", sz[i] % (64u << 10) ? "no " : "", open_ms, span / head / 1e6,
               span / tail / 1e6);
        fflush(stdout);
        CK(cudaIpcCloseMemHandle(p));
        if (write(sock[i], "Q", 1) != 1) return 1;
        waitpid(kids[i], NULL, 0);
    }
    return 0;
}
