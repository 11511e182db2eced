/* Helpers shared by tests/unit/test_ucx.c and bench/ucx_tcp.c: child
 * processes run inside a network namespace with `ip netns exec` (the
 * namespaces are tools/common/tool_netns.h's), line I/O with timeouts, and
 * the byte pattern both sides agree on.  Header-only (static functions); for
 * tests and benchmarks, never the library. */
#ifndef REFIT_UCX_NETNS_H
#define REFIT_UCX_NETNS_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline double nn_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The pattern: 8-byte word k of a buffer with seed s. */
static inline uint64_t nn_word(uint64_t seed, uint64_t k)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + k;
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dULL;
    x ^= x >> 33;
    return x;
}

static inline void nn_fill(void *p, uint64_t size, uint64_t seed)
{
    unsigned char *b = p;
    uint64_t k = 0;
    for (; k + 8 <= size; k += 8) {
        uint64_t w = nn_word(seed, k / 8);
        memcpy(b + k, &w, 8);
    }
    for (; k < size; k++) b[k] = (unsigned char)(nn_word(seed, k / 8) >> (8 * (k % 8)));
}

/* Offset of the first byte of [p, p+len) that differs from the pattern of
 * a buffer with `seed` at offset `off`, or UINT64_MAX. */
static inline uint64_t nn_check(const void *p, uint64_t len, uint64_t seed, uint64_t off)
{
    const unsigned char *b = p;
    for (uint64_t i = 0; i < len; i++) {
        uint64_t o = off + i;
        if ((o % 8) == 0 && i + 8 <= len) {
            uint64_t w = nn_word(seed, o / 8), g;
            memcpy(&g, b + i, 8);
            if (g == w) {
                i += 7;
                continue;
            }
        }
        if (b[i] != (unsigned char)(nn_word(seed, o / 8) >> (8 * (o % 8)))) return i;
    }
    return UINT64_MAX;
}


/* A child running `ip netns exec NS argv...` with pipes to its stdin and
 * from its stdout (stderr is inherited). */
typedef struct {
    pid_t pid;
    int in, out; /* write end of its stdin, read end of its stdout */
    char buf[65536];
    size_t len;
} nn_child_t;

static inline int nn_spawn(nn_child_t *c, const char *ns, char *const argv[])
{
    int pin[2], pout[2];
    memset(c, 0, sizeof(*c));
    c->pid = -1;
    if (pipe(pin) || pipe(pout)) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(pin[0], 0);
        dup2(pout[1], 1);
        close(pin[0]), close(pin[1]), close(pout[0]), close(pout[1]);
        char *args[64];
        int k = 0;
        if (ns) {
            args[k++] = "ip", args[k++] = "netns", args[k++] = "exec";
            args[k++] = (char *)ns;
        }
        for (int i = 0; argv[i] && k < 63; i++) args[k++] = argv[i];
        args[k] = NULL;
        execvp(args[0], args);
        _exit(127);
    }
    close(pin[0]);
    close(pout[1]);
    c->pid = pid;
    c->in = pin[1];
    c->out = pout[0];
    return 0;
}

/* Reads one line of the child's stdout (without '\n') into line; false on
 * EOF or timeout. */
static inline bool nn_readline(nn_child_t *c, char *line, size_t cap, double secs)
{
    double until = nn_now() + secs;
    for (;;) {
        char *nl = memchr(c->buf, '\n', c->len);
        if (nl) {
            size_t n = (size_t)(nl - c->buf);
            snprintf(line, cap, "%.*s", (int)n, c->buf);
            memmove(c->buf, nl + 1, c->len - n - 1);
            c->len -= n + 1;
            return true;
        }
        double left = until - nn_now();
        if (left <= 0 || c->len == sizeof(c->buf)) return false;
        struct pollfd pf = {c->out, POLLIN, 0};
        int r = poll(&pf, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        ssize_t got = read(c->out, c->buf + c->len, sizeof(c->buf) - c->len);
        if (got <= 0) return false;
        c->len += (size_t)got;
    }
}

/* Closes the child's stdin and waits at most secs for it (then kills it);
 * its exit status, or -1. */
static inline int nn_finish(nn_child_t *c, double secs)
{
    if (c->pid <= 0) return -1;
    if (c->in >= 0) close(c->in), c->in = -1;
    double until = nn_now() + secs;
    int wst = 0;
    for (;;) {
        pid_t r = waitpid(c->pid, &wst, WNOHANG);
        if (r == c->pid) break;
        if (nn_now() > until) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, &wst, 0);
            wst = -1;
            break;
        }
        usleep(2000);
    }
    if (c->out >= 0) close(c->out), c->out = -1;
    c->pid = -1;
    return wst == -1 ? -1 : WIFEXITED(wst) ? WEXITSTATUS(wst) : -1;
}

/* Hex encoding of descriptors passed on command lines. */
static inline char *nn_hex(const void *p, size_t n)
{
    static const char d[] = "0123456789abcdef";
    char *s = malloc(2 * n + 1);
    if (!s) return NULL;
    for (size_t i = 0; i < n; i++) {
        s[2 * i] = d[((const unsigned char *)p)[i] >> 4];
        s[2 * i + 1] = d[((const unsigned char *)p)[i] & 15];
    }
    s[2 * n] = 0;
    return s;
}

static inline void *nn_unhex(const char *s, size_t *n)
{
    size_t len = strlen(s);
    if (len % 2) return NULL;
    unsigned char *p = malloc(len / 2 + 1);
    if (!p) return NULL;
    for (size_t i = 0; i < len / 2; i++) {
        unsigned v = 0;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) {
            free(p);
            return NULL;
        }
        p[i] = (unsigned char)v;
    }
    *n = len / 2;
    return p;
}

#endif
