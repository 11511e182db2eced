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
 * machine:  nvcc -O2 -arch=sm_90 -o ipc_probe bench/ipc_probe.cu -lcuda && ./ipc_probe GB */
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

int main(int argc, char **argv)
{
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
