/* The process harness of tools/common/tool_proc.h: fork and exec with
 * pipes, bounded reads (poll), bounded reaping (WNOHANG, then SIGKILL). */
#include "tool_proc.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int tool_proc_exec(tool_proc_t *p, const char *path, char *const argv[])
{
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        errno = e;
        return -1;
    }
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execv(path, argv);
        _exit(127);
    }
    close(fds[1]);
    *p = (tool_proc_t){pid, -1, fds[0]};
    return 0;
}

int tool_proc_fork(tool_proc_t *p, int (*body)(void *ctx, int in, int out), void *ctx, bool die_with_parent)
{
    int a[2], b[2];
    if (pipe(a)) return -1;
    if (pipe(b)) {
        close(a[0]);
        close(a[1]);
        return -1;
    }
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(a[0]), close(a[1]), close(b[0]), close(b[1]);
        errno = e;
        return -1;
    }
    if (pid == 0) {
        if (die_with_parent) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1); /* it died before the line above */
        }
        close(a[1]);
        close(b[0]);
        _exit(body(ctx, a[0], b[1]));
    }
    close(a[0]);
    close(b[1]);
    *p = (tool_proc_t){pid, a[1], b[0]};
    return 0;
}

const char *tool_proc_line(tool_proc_t *p, int timeout_ms, char *buf, size_t n)
{
    size_t len = 0;
    double t0 = now_s();
    buf[0] = '\0';
    while (len < n - 1 && (now_s() - t0) * 1e3 < timeout_ms) {
        struct pollfd pfd = {p->from_child, POLLIN, 0};
        if (poll(&pfd, 1, 100) <= 0) continue;
        ssize_t got = read(p->from_child, buf + len, 1);
        if (got <= 0) break;
        if (buf[len++] == '\n') break;
    }
    buf[len] = '\0';
    return buf;
}

char *tool_proc_capture(const char *path, char *const argv[], int *status)
{
    tool_proc_t p;
    if (tool_proc_exec(&p, path, argv)) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (len + 4096 > cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        ssize_t n = read(p.from_child, buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        len += (size_t)n;
    }
    close(p.from_child);
    if (buf) buf[len] = '\0';
    waitpid(p.pid, status, 0);
    return buf;
}

int tool_proc_stop(tool_proc_t *p, const void *quit, size_t quit_len, bool kill_it, double grace_s)
{
    if (p->pid <= 0) return -1;
    if (kill_it || !quit || p->to_child < 0 || write(p->to_child, quit, quit_len) != (ssize_t)quit_len)
        kill(p->pid, SIGKILL);
    return tool_proc_wait(p, grace_s);
}

int tool_proc_wait(tool_proc_t *p, double timeout_s)
{
    if (p->pid <= 0) return -1;
    double t0 = now_s();
    int status = -1;
    while (waitpid(p->pid, &status, WNOHANG) == 0) {
        if (now_s() - t0 > timeout_s) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &status, 0);
            break;
        }
        usleep(5000);
    }
    if (p->to_child >= 0) close(p->to_child);
    if (p->from_child >= 0) close(p->from_child);
    *p = (tool_proc_t){0, -1, -1};
    return status;
}

void tool_proc_describe(int status, char *buf, size_t size)
{
    if (WIFEXITED(status)) snprintf(buf, size, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, size, "was killed by signal %d (%s)%s", WTERMSIG(status), strsignal(WTERMSIG(status)),
                 WCOREDUMP(status) ? ", core dumped" : "");
    else snprintf(buf, size, "ended with wait status 0x%x", (unsigned)status);
}
