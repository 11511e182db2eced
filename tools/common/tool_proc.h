/* Child processes of the refit programs (refit demo, refit-bench): one
 * harness for starting them with pipes, reading their lines with a bound,
 * capturing their output, and stopping and reaping them with a bound. */
#ifndef REFIT_TOOL_PROC_H
#define REFIT_TOOL_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* A child with a pipe each way: to_child (its command input; -1 for an
 * exec'd child) and from_child (what it writes: its stdout when exec'd). */
typedef struct {
    pid_t pid;
    int to_child, from_child;
} tool_proc_t;

/* Runs path with argv, its stdout into from_child (stderr passes through).
 * 0, or -1 (errno) when no pipe or process could be made. */
int tool_proc_exec(tool_proc_t *p, const char *path, char *const argv[]);

/* Forks a child that runs body(ctx, in, out) (in: read end of to_child,
 * out: write end of from_child) and exits with its return value.  With
 * die_with_parent, the child is killed when this process dies (it never
 * outlives a benchmark that crashed).  0, or -1 (errno). */
int tool_proc_fork(tool_proc_t *p, int (*body)(void *ctx, int in, int out), void *ctx, bool die_with_parent);

/* One line from the child (up to and including '\n'), waiting at most
 * timeout_ms; "" on timeout, end of file or a dead child.  Returns buf. */
const char *tool_proc_line(tool_proc_t *p, int timeout_ms, char *buf, size_t n);

/* Everything an exec'd child (path, argv) writes to stdout until it ends
 * (malloc'd, NUL-terminated; NULL when it could not start or on no memory),
 * and its wait status in *status. */
char *tool_proc_capture(const char *path, char *const argv[], int *status);

/* Waits up to timeout_s for the child to end on its own (a child that does
 * one thing and exits), then kills it (SIGKILL).  Closes both pipes; returns
 * the wait status (-1 if there was no child). */
int tool_proc_wait(tool_proc_t *p, double timeout_s);

/* Stops the child: writes quit (quit_len bytes) to it, or kills it
 * (SIGKILL) with kill_it or when the write fails; waits up to grace_s for it
 * to end, then kills it.  Closes both pipes; returns the wait status (-1 if
 * there was no child). */
int tool_proc_stop(tool_proc_t *p, const void *quit, size_t quit_len, bool kill_it, double grace_s);

/* How a child ended, for messages: "exited with status 1", "was killed by
 * signal 9 (Killed)". */
void tool_proc_describe(int status, char *buf, size_t size);

#endif
