/* The shm transport against hostile peers and inputs (docs/security.md): memory is
 * handed over by the publisher, never named by a descriptor; a receiver gets
 * read-only memory it cannot write, map writable, reopen writable or
 * resize; a peer without the job's key gets nothing and is told so; another
 * user cannot reach the socket; forged descriptors are refused; and a
 * receiver pulls the right bytes, from memfd and from attached memory
 * (process_vm_readv of the pid the kernel reported), and notices a
 * publisher that died. */
#include "testutil.h"
#include "transport/transport.h"
#include "util/crypto.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static const refit_transport_ops_t *ops = &refit_transport_shm;

/* The wire format (mirrors shm.c). */
#define SHM_MAGIC 0x4d485352u
typedef struct {
    uint32_t magic, version;
    uint64_t region_id, size;
    char sock[48];
    char boot_id[40];
} w_desc_t;
typedef struct {
    uint32_t magic, type;
    uint8_t nonce[16];
} w_hello_t;
typedef struct {
    uint32_t magic, type;
    uint8_t nonce[16];
    uint8_t proof[32];
} w_challenge_t;
typedef struct {
    uint32_t magic, type;
    uint8_t proof[32];
    uint32_t nregions, pad;
    uint64_t id;
} w_auth1_t;
typedef struct {
    uint32_t magic, type, nregions, nfds;
    uint32_t kind, pad;
    uint64_t size, offset, addr;
} w_grant1_t;

static char g_dir[64];

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31u + seed);
}

static refit_transport_t *make(const uint8_t *key)
{
    char opt[PATH_MAX + 8];
    snprintf(opt, sizeof(opt), "dir=%s", g_dir);
    refit_transport_t *t;
    REFIT_ASSERT_OK(ops->create(opt, &t));
    if (key) ops->set_key(t, key);
    return t;
}

static refit_plan_t *whole_plan(uint64_t size)
{
    refit_plan_t *p = calloc(1, sizeof(*p));
    p->nsrcs = 1;
    p->src_bytes = calloc(1, sizeof(uint64_t));
    refit_plan_region_t r = {.run = size};
    REFIT_VEC_PUSH(&p->regions, r);
    p->src_bytes[0] = size;
    return p;
}

static void pull_check(refit_transport_t *rt, refit_peer_t *peer, const unsigned char *want, uint64_t size)
{
    unsigned char *got = calloc(1, size);
    refit_plan_t *plan = whole_plan(size);
    refit_pull_ctl_t ctl = {.deadline = refit_now() + 10, .threads = 1};
    REFIT_ASSERT_OK(ops->pull(rt, (refit_peer_t *const[]){peer}, plan, (void *const[]){got}, &ctl, NULL));
    assert_memory_equal(got, want, size);
    refit_plan_destroy(plan);
    free(got);
}

/* memfd and attached memory both arrive; the descriptor names no pid, fd or
 * address, only a socket name and a random region id. */
static void pulls_both_kinds(void **state)
{
    (void)state;
    refit_transport_t *pt = make(NULL), *rt = make(NULL);
    const uint64_t size = 1u << 20;
    void *mem;
    REFIT_ASSERT_OK(ops->alloc(pt, size, &mem));
    fill(mem, size, 3);
    unsigned char *att = malloc(size);
    fill(att, size, 9);
    void *d[2];
    size_t l[2];
    REFIT_ASSERT_OK(ops->expose(pt, mem, size, &d[0], &l[0]));
    REFIT_ASSERT_OK(ops->expose(pt, att, size, &d[1], &l[1]));
    w_desc_t w;
    memcpy(&w, d[0], sizeof(w));
    assert_int_equal(l[0], sizeof(w));
    assert_null(memchr(w.sock, '/', sizeof(w.sock)));
    for (int i = 0; i < 2; i++) {
        refit_peer_t *peer;
        REFIT_ASSERT_OK(ops->connect(rt, (const void *const[]){d[i]}, &l[i], 1, &peer));
        pull_check(rt, peer, i ? att : mem, size);
        ops->disconnect(peer);
    }
    ops->unexpose(pt, mem);
    ops->unexpose(pt, att);
    ops->free(pt, mem, size);
    free(att);
    free(d[0]);
    free(d[1]);
    ops->destroy(rt);
    ops->destroy(pt);
}

/* More regions than one SCM_RIGHTS message can carry (the kernel's
 * SCM_MAX_FD is 253): one connect to 600 memfd regions (and attached ones
 * between them) maps every one and pulls its bytes.  Before, sendmsg failed
 * with EINVAL in the publisher, silently, and the receiver was told
 * "broke off the handshake". */
static void many_regions_one_peer(void **state)
{
    (void)state;
    enum { N = 600 };
    refit_transport_t *pt = make(NULL), *rt = make(NULL);
    const uint64_t size = 4096 + 64;
    void *mem[N];
    void *d[N];
    size_t l[N];
    for (int i = 0; i < N; i++) {
        if (i % 7 == 3) mem[i] = malloc(size); /* attached memory: no descriptor to send */
        else REFIT_ASSERT_OK(ops->alloc(pt, size, &mem[i]));
        fill(mem[i], size, (unsigned)i);
        REFIT_ASSERT_OK(ops->expose(pt, mem[i], size, &d[i], &l[i]));
    }
    refit_peer_t *peer;
    REFIT_ASSERT_OK(ops->connect(rt, (const void *const *)d, l, N, &peer));
    unsigned char *got = calloc(1, size);
    refit_plan_t *plan = calloc(1, sizeof(*plan));
    plan->nsrcs = 1;
    plan->src_bytes = calloc(1, sizeof(uint64_t));
    plan->src_bytes[0] = size;
    REFIT_VEC_PUSH(&plan->regions, ((refit_plan_region_t){.run = size}));
    refit_pull_ctl_t ctl = {.deadline = refit_now() + 10, .threads = 1};
    for (int i = 0; i < N; i += 37) {
        plan->regions.data[0].src_region = (uint32_t)i;
        memset(got, 0, size);
        REFIT_ASSERT_OK(ops->pull(rt, (refit_peer_t *const[]){peer}, plan, (void *const[]){got}, &ctl, NULL));
        assert_memory_equal(got, mem[i], size);
    }
    refit_plan_destroy(plan);
    free(got);
    ops->disconnect(peer);
    for (int i = 0; i < N; i++) {
        ops->unexpose(pt, mem[i]);
        if (i % 7 == 3) free(mem[i]);
        else ops->free(pt, mem[i], size);
        free(d[i]);
    }
    ops->destroy(rt);
    ops->destroy(pt);
}

/* A raw client that speaks the protocol with `key` and asks for region id:
 * returns the fd it was granted (-1 if none) and the answer's type. */
static int raw_fd(const char *sock, uint64_t id, const uint8_t key[32], uint32_t *type)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%.40s", g_dir, sock);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_int_equal(connect(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
    w_hello_t h = {SHM_MAGIC, 1, {0}};
    memset(h.nonce, 7, 16);
    assert_int_equal(send(s, &h, sizeof(h), 0), sizeof(h));
    w_challenge_t c;
    assert_int_equal(recv(s, &c, sizeof(c), 0), sizeof(c));
    w_auth1_t a = {SHM_MAGIC, 3, {0}, 1, 0, id};
    refit_hmac_t m;
    const char *label = "refit shm receiver proof";
    refit_hmac_init(&m, key, 32);
    refit_hmac_update(&m, label, strlen(label) + 1);
    refit_hmac_update(&m, h.nonce, 16);
    refit_hmac_update(&m, c.nonce, 16);
    refit_hmac_final(&m, a.proof);
    assert_int_equal(send(s, &a, sizeof(a), 0), sizeof(a));
    w_grant1_t g = {0};
    char ctl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&g, sizeof(g)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    ssize_t n = recvmsg(s, &mh, 0);
    assert_true(n >= 8);
    *type = g.type;
    int fd = -1;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    if (cm && cm->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(cm), sizeof(int));
    close(s);
    return fd;
}

/* What a receiver holds is read-only: no write, no writable mapping, not
 * even through a fresh open of /proc/self/fd/N, no resizing (which would
 * crash the publisher).  The previous code opened /proc/PID/fd/N by the
 * numbers in the descriptor. */
/* shm has no extensions: an FP8 receiver or a conditional reader asks and is
 * told no (the caller refuses), instead of shm refusing inside its pull. */
static void no_extensions(void **state)
{
    (void)state;
    assert_null(refit_transport_ext(&refit_transport_shm, REFIT_TEXT_FP8));
    assert_null(refit_transport_ext(&refit_transport_shm, REFIT_TEXT_WAIT));
    assert_null(refit_transport_fp8(&refit_transport_shm));
    assert_null(refit_transport_wait(&refit_transport_shm));
    assert_null(refit_transport_ext(&refit_transport_shm, (refit_transport_ext_kind_t)99));
}

static void memory_is_read_only(void **state)
{
    (void)state;
    uint8_t zero[32] = {0};
    refit_transport_t *pt = make(NULL);
    const uint64_t size = 64u << 10;
    void *mem;
    REFIT_ASSERT_OK(ops->alloc(pt, size, &mem));
    fill(mem, size, 5);
    void *d;
    size_t l;
    REFIT_ASSERT_OK(ops->expose(pt, mem, size, &d, &l));
    w_desc_t w;
    memcpy(&w, d, sizeof(w));
    uint32_t type = 0;
    int fd = raw_fd(w.sock, w.region_id, zero, &type);
    assert_int_equal(type, 4); /* a grant */
    assert_true(fd >= 0);
    errno = 0;
    assert_true(mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
    assert_int_equal(write(fd, "x", 1), -1);
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    int rw = open(path, O_RDWR);
    if (rw >= 0) { /* the reopen itself may succeed: the seals still hold */
        assert_int_equal(write(rw, "x", 1), -1);
        assert_int_equal(errno, EPERM);
        assert_true(mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0) == MAP_FAILED);
        assert_int_equal(ftruncate(rw, 0), -1);
        assert_int_equal(ftruncate(rw, (off_t)size * 2), -1);
        close(rw);
    }
    void *ro = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(ro != MAP_FAILED);
    assert_memory_equal(ro, mem, size);
    munmap(ro, size);
    close(fd);
    unsigned char want[64u << 10];
    fill(want, size, 5);
    assert_memory_equal(mem, want, size); /* the publisher's bytes are intact */
    ((unsigned char *)mem)[0] ^= 1;       /* and its own mapping still writes */
    ops->unexpose(pt, mem);
    ops->free(pt, mem, size);
    free(d);
    ops->destroy(pt);
}

/* Keys: a receiver and a publisher of different jobs (or a fake publisher)
 * refuse each other; a raw client with a wrong proof gets no descriptor. */
static void wrong_key_refused(void **state)
{
    (void)state;
    uint8_t ka[32], kb[32];
    memset(ka, 1, 32);
    memset(kb, 2, 32);
    refit_transport_t *pt = make(ka), *rt = make(kb);
    const uint64_t size = 4096;
    void *mem;
    REFIT_ASSERT_OK(ops->alloc(pt, size, &mem));
    void *d;
    size_t l;
    REFIT_ASSERT_OK(ops->expose(pt, mem, size, &d, &l));
    refit_peer_t *peer = NULL;
    REFIT_ASSERT_ERR(ops->connect(rt, (const void *const[]){d}, &l, 1, &peer), REFIT_ERR_AUTH,
                     "did not prove the job's secret");
    w_desc_t w;
    memcpy(&w, d, sizeof(w));
    uint32_t type = 0;
    int fd = raw_fd(w.sock, w.region_id, kb, &type);
    assert_int_equal(fd, -1);
    assert_int_equal(type, 5); /* refused */
    ops->set_key(rt, ka);
    REFIT_ASSERT_OK(ops->connect(rt, (const void *const[]){d}, &l, 1, &peer));
    ops->disconnect(peer);
    ops->unexpose(pt, mem);
    ops->free(pt, mem, size);
    free(d);
    ops->destroy(rt);
    ops->destroy(pt);
}

/* Descriptors are data from the registry: a socket name that leaves the
 * directory, another host's boot id, a region id never exposed, a socket of
 * something that is not a refit publisher: each refused, naming why. */
static void forged_descriptors(void **state)
{
    (void)state;
    refit_transport_t *pt = make(NULL), *rt = make(NULL);
    const uint64_t size = 4096;
    void *mem;
    REFIT_ASSERT_OK(ops->alloc(pt, size, &mem));
    void *d;
    size_t l;
    REFIT_ASSERT_OK(ops->expose(pt, mem, size, &d, &l));
    w_desc_t good, w;
    memcpy(&good, d, sizeof(good));
    refit_peer_t *peer = NULL;
    const void *dp[1] = {&w};
    size_t wl = sizeof(w);
    w = good;
    snprintf(w.sock, sizeof(w.sock), "../../run/other.sock");
    REFIT_ASSERT_ERR(ops->connect(rt, dp, &wl, 1, &peer), REFIT_ERR_CORRUPT, "names socket");
    w = good;
    snprintf(w.boot_id, sizeof(w.boot_id), "not-this-host");
    REFIT_ASSERT_ERR(ops->connect(rt, dp, &wl, 1, &peer), REFIT_ERR_TRANSPORT, "another host");
    w = good;
    w.region_id ^= 1;
    REFIT_ASSERT_ERR(ops->connect(rt, dp, &wl, 1, &peer), REFIT_ERR_STALE, "no longer exposed");
    w = good;
    snprintf(w.sock, sizeof(w.sock), "nobody-listens-here");
    REFIT_ASSERT_ERR(ops->connect(rt, dp, &wl, 1, &peer), REFIT_ERR_PEER, "connecting");
    /* A listener that is not a refit publisher: it answers garbage. */
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/impostor", g_dir);
    unlink(sa.sun_path);
    int ls = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    assert_int_equal(bind(ls, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(ls, 4), 0);
    pid_t kid = fork();
    if (kid == 0) {
        int c = accept(ls, NULL, NULL);
        char junk[512];
        if (recv(c, junk, sizeof(junk), 0) > 0) {
            w_challenge_t ch = {SHM_MAGIC, 2, {0}, {0}};
            memset(ch.proof, 0x33, sizeof(ch.proof));
            send(c, &ch, sizeof(ch), 0);
        }
        sleep(1);
        _exit(0);
    }
    w = good;
    snprintf(w.sock, sizeof(w.sock), "impostor");
    REFIT_ASSERT_ERR(ops->connect(rt, dp, &wl, 1, &peer), REFIT_ERR_AUTH, "did not prove");
    waitpid(kid, NULL, 0);
    close(ls);
    unlink(sa.sun_path);
    ops->unexpose(pt, mem);
    ops->free(pt, mem, size);
    free(d);
    ops->destroy(rt);
    ops->destroy(pt);
}

/* Another user cannot even reach the socket (the directory is 0700), and a
 * directory others may enter is refused. */
static void other_user_refused(void **state)
{
    (void)state;
    char opt[PATH_MAX + 16], open_dir[128];
    snprintf(open_dir, sizeof(open_dir), "%s-open", g_dir);
    mkdir(open_dir, 0755);
    chmod(open_dir, 0755);
    snprintf(opt, sizeof(opt), "dir=%s", open_dir);
    refit_transport_t *t;
    REFIT_ASSERT_ERR(ops->create(opt, &t), REFIT_ERR_AUTH, "0700");
    rmdir(open_dir);
    if (geteuid() != 0) {
        print_message("[  SKIPPED ] the other-user case needs root (to become nobody)\n");
        return;
    }
    refit_transport_t *pt = make(NULL);
    void *mem;
    REFIT_ASSERT_OK(ops->alloc(pt, 4096, &mem));
    void *d;
    size_t l;
    REFIT_ASSERT_OK(ops->expose(pt, mem, 4096, &d, &l));
    w_desc_t w;
    memcpy(&w, d, sizeof(w));
    pid_t kid = fork();
    if (kid == 0) {
        if (setresgid(65534, 65534, 65534) || setresuid(65534, 65534, 65534)) _exit(2);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%.40s", g_dir, w.sock);
        int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        _exit(connect(s, (struct sockaddr *)&sa, sizeof(sa)) == 0 ? 1 : errno == EACCES ? 0 : 3);
    }
    int status = 0;
    waitpid(kid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0); /* EACCES */
    ops->unexpose(pt, mem);
    ops->free(pt, mem, 4096);
    free(d);
    ops->destroy(pt);
}

/* A publisher process that dies after the receiver connected: the pull
 * reports it (its pidfd), even though the mapping still reads fine. */
static void dead_publisher_noticed(void **state)
{
    (void)state;
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t kid = fork();
    if (kid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        refit_transport_t *pt = make(NULL);
        void *mem, *d;
        size_t l;
        if (ops->alloc(pt, 1u << 20, &mem) || ops->expose(pt, mem, 1u << 20, &d, &l)) _exit(2);
        fill(mem, 1u << 20, 1);
        if (write(p[1], d, l) != (ssize_t)l) _exit(3);
        pause();
        _exit(0);
    }
    close(p[1]);
    w_desc_t w;
    assert_int_equal(read(p[0], &w, sizeof(w)), sizeof(w));
    refit_transport_t *rt = make(NULL);
    refit_peer_t *peer;
    size_t wl = sizeof(w);
    REFIT_ASSERT_OK(ops->connect(rt, (const void *const[]){&w}, &wl, 1, &peer));
    unsigned char want[1u << 10];
    fill(want, sizeof(want), 1);
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    unsigned char *got = calloc(1, 1u << 20);
    refit_plan_t *plan = whole_plan(1u << 20);
    refit_pull_ctl_t ctl = {.deadline = refit_now() + 10, .threads = 1};
    REFIT_ASSERT_ERR(ops->pull(rt, (refit_peer_t *const[]){peer}, plan, (void *const[]){got}, &ctl, NULL),
                     REFIT_ERR_PEER, "died");
    refit_plan_destroy(plan);
    free(got);
    ops->disconnect(peer);
    ops->destroy(rt);
    close(p[0]);
}

/* Checks of squatted_tmp_fallback, in a child with a /tmp of its own; 0 or
 * the number of the check that failed (77: no mount namespace here). */
static int squat_checks(void)
{
    if (unshare(CLONE_NEWNS) != 0) return 77;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 || mount("tmpfs", "/tmp", "tmpfs", 0, "mode=1777") != 0)
        return 77;
    unsetenv("REFIT_RUNTIME_DIR");
    unsetenv("XDG_RUNTIME_DIR");
    /* Another user made the old fallback first. */
    char squat[64];
    snprintf(squat, sizeof(squat), "/tmp/refit-%u", (unsigned)geteuid());
    if (mkdir(squat, 0777) != 0 || chmod(squat, 0777) != 0 || chown(squat, 65534, 65534) != 0) return 1;
    uint8_t key[32], other[32];
    memset(key, 0x42, sizeof(key));
    memset(other, 0x17, sizeof(other));
    refit_transport_t *pt = NULL, *rt = NULL, *xt = NULL;
    if (ops->create(NULL, &pt) || ops->create(NULL, &rt) || ops->create(NULL, &xt)) return 2;
    ops->set_key(pt, key);
    ops->set_key(rt, key);
    const uint64_t size = 1u << 16;
    void *mem, *d;
    size_t l;
    if (ops->alloc(pt, size, &mem) || ops->expose(pt, mem, size, &d, &l)) return 3;
    fill(mem, size, 5);
    /* The job's directory: /tmp/refit-<uid>-<16 hex>, ours, 0700. */
    char name[300] = "";
    int n = 0;
    DIR *dir = opendir("/tmp");
    for (struct dirent *e; dir && (e = readdir(dir));)
        if (!strncmp(e->d_name, squat + 5, strlen(squat) - 5) && e->d_name[strlen(squat) - 5] == '-')
            n++, snprintf(name, sizeof(name), "/tmp/%s", e->d_name);
    if (dir) closedir(dir);
    struct stat sb;
    if (n != 1 || strlen(name) != strlen(squat) + 17 || lstat(name, &sb) != 0 || !S_ISDIR(sb.st_mode) ||
        sb.st_uid != geteuid() || (sb.st_mode & 0777) != 0700)
        return 4;
    /* A receiver of the job finds the socket there and pulls the bytes. */
    refit_peer_t *peer;
    if (ops->connect(rt, (const void *const[]){d}, &l, 1, &peer)) return 5;
    unsigned char *got = calloc(1, size);
    refit_plan_t *plan = whole_plan(size);
    refit_pull_ctl_t ctl = {.deadline = refit_now() + 10, .threads = 1};
    if (ops->pull(rt, (refit_peer_t *const[]){peer}, plan, (void *const[]){got}, &ctl, NULL) ||
        memcmp(got, mem, size) != 0)
        return 6;
    refit_plan_destroy(plan);
    free(got);
    ops->disconnect(peer);
    /* Another job's key names another directory: no socket of ours there. */
    ops->set_key(xt, other);
    if (ops->connect(xt, (const void *const[]){d}, &l, 1, &peer) == REFIT_OK) return 7;
    /* A transport without a key (as refit_transport_check opens them) cannot
     * serve, and says what to set. */
    refit_transport_t *nt = NULL;
    void *d2;
    size_t l2;
    if (ops->create(NULL, &nt)) return 8;
    if (ops->expose(nt, mem, size, &d2, &l2) != REFIT_ERR_INVALID_ARG ||
        !strstr(refit_last_error(), "REFIT_RUNTIME_DIR"))
        return 9;
    ops->destroy(nt);
    ops->unexpose(pt, mem);
    ops->free(pt, mem, size);
    free(d);
    ops->destroy(xt);
    ops->destroy(rt);
    ops->destroy(pt);
    /* The job's directory left with its last publisher. */
    if (lstat(name, &sb) == 0) return 10;
    return 0;
}

/* No XDG_RUNTIME_DIR or REFIT_RUNTIME_DIR (containers, batch jobs, su), and
 * another user created /tmp/refit-<uid> first: shm still works (the job's
 * own directory, named from its key, which they cannot guess), where the
 * fixed fallback refused the squatted directory and disabled shm.  In a
 * mount namespace with a /tmp of its own, so no other process sees it. */
static void squatted_tmp_fallback(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        print_message("[  SKIPPED ] needs root (a private /tmp, another user's directory)\n");
        return;
    }
    pid_t kid = fork();
    assert_true(kid >= 0);
    if (kid == 0) _exit(squat_checks());
    int status = 0;
    double t0 = refit_now();
    pid_t got = 0;
    while ((got = waitpid(kid, &status, WNOHANG)) == 0 && t_ms_since(t0) < 20000) t_msleep(10);
    if (got == 0) {
        kill(kid, SIGKILL);
        waitpid(kid, &status, 0);
        fail_msg("the squatted /tmp case did not finish in 20 s");
    }
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) {
        print_message("[  SKIPPED ] no mount namespace here (unshare or mount refused)\n");
        return;
    }
    if (WEXITSTATUS(status) != 0) fail_msg("squatted /tmp check %d failed", WEXITSTATUS(status));
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/refit-shm-test-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    t_rm_tree(g_dir);
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pulls_both_kinds),       cmocka_unit_test(many_regions_one_peer),
        cmocka_unit_test(memory_is_read_only),    cmocka_unit_test(wrong_key_refused),
        cmocka_unit_test(forged_descriptors),     cmocka_unit_test(other_user_refused),
        cmocka_unit_test(dead_publisher_noticed), cmocka_unit_test(squatted_tmp_fallback),
        cmocka_unit_test(no_extensions),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
