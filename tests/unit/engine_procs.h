/* The engine tests' processes and fixtures (test_engine*.c): publishers and
 * relays in child processes driven over pipes, helpers that act at a time,
 * registries and receivers.  Every child runs on tools/common's process
 * harness (tool_proc.h): forked with a pipe each way, dying with the test,
 * its lines read and its end awaited with a bound. */
#ifndef REFIT_ENGINE_PROCS_H
#define REFIT_ENGINE_PROCS_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "testutil.h"
#include "tool_proc.h"

/* ---- publisher processes, driven line by line over pipes ----------------- */

typedef tool_proc_t pub_t; /* to_child: commands; from_child: one answer line per command */

typedef struct {
    const char *model, *layout, *registry, *job, *transports, *topts;
    refit_publish_mode_t mode;
    uint32_t dead_ms;
    bool attach;  /* the caller's own (not shared) memory: read with process_vm_readv */
    double delta; /* > 0: a delta publisher, its truth changing this share of elements per version */
} pubcfg_t;

/* A publisher process of rank `rank` of c (its memory allocated, or the
 * caller's own with c->attach).  Commands, one answer line each ("<status
 * name> <detail>"): "publish V" (fill with the truth of V and publish; a
 * delta publisher answers "REFIT_OK base=B bytes=N of=R"), "scribble V"
 * (overwrite without publishing), "wait V MS" (wait_readers), "quit". */
pub_t pub_start(const pubcfg_t *c, uint32_t rank);
/* Sends a command; returns the status name the child answered (bounded: 30 s). */
const char *pub_cmd(pub_t *p, const char *fmt, ...);
/* The next answer line of a publisher (bounded: 30 s; a static buffer). */
const char *pub_read(pub_t *p);
/* Asks the publisher to quit (killed after 10 s); reaps it, closes its pipes. */
void pub_stop(pub_t *p);
/* SIGKILLs the publisher and reaps it. */
void pub_kill(pub_t *p);

#define PUB_OK(p, ...)                                                      \
    do {                                                                    \
        const char *r_ = pub_cmd((p), __VA_ARGS__);                         \
        if (strncmp(r_, "REFIT_OK", 8)) fail_msg("publisher said: %s", r_); \
    } while (0)

/* ---- helper processes that act at a time ---------------------------------- */

/* A child that SIGKILLs `victim` after_ms from now; reap it with killer_done. */
tool_proc_t kill_after(pid_t victim, int after_ms);
/* Waits (<= 10 s) for a kill_after child to have done its kill and ended. */
void killer_done(tool_proc_t *k);

/* ---- fixtures ------------------------------------------------------------- */

typedef struct {
    char dir[64];
    char url[96];
    char job[32];
} reg_t;

/* A fresh file registry in a temporary directory, and a job name of its own. */
void reg_file(reg_t *g);
/* A receiver of rank `rank` of layout, truth-verified, 2 threads, 16 KiB
 * chunks; its region allocated into *base. */
refit_receiver_t *receiver(const char *model, const char *layout, uint32_t rank, const reg_t *g, const char *transports,
                           uint32_t lease_ms, void **base);
/* Independent proof: the receiver memory equals the truth of version v. */
void expect_truth(const char *model, const char *layout, uint32_t rank, void *base, uint64_t v);

/* ---- relays: receivers in child processes that serve what they pulled ---- */

/* to_child: 'q' (quit), 'n' (pull the newest again, verify it, answer "ok vN HOLDER,... MS" or "fail ERROR");
 * from_child: answer lines */
typedef tool_proc_t relay_t;

/* What a relay process is started with. */
typedef struct {
    const reg_t *g;
    const char *model, *layout;
    uint32_t rank, max_readers;
    int slot;
    uint64_t version;
} relay_arg_t;

/* In a relay process: its receiver (shm, truth-verified, one thread, 16 KiB
 * chunks, relay heartbeat 100 ms), its region allocated into *base; NULL
 * when it cannot be made. */
refit_receiver_t *relay_receiver(const relay_arg_t *x, void **base);
/* A receiver process (relay slot `slot`) that pulls `version` (NEWEST if 0),
 * verifies it, answers "ok vN HOLDER,... MS" / "fail ERROR", then serves
 * (and pulls the newest again on 'n') until "quit" or its death;
 * relay_pulled waits for its answer. */
relay_t relay_spawn(const reg_t *g, const char *model, const char *layout, uint32_t rank, int slot, uint64_t version,
                    uint32_t max_readers);
/* The relay's next answer line (bounded: 15 s) must start with `want`. */
void relay_answer(relay_t *x, char *buf, size_t cap, const char *want);
void relay_pulled(relay_t *x);
/* relay_spawn, then relay_pulled. */
relay_t relay_start(const reg_t *g, const char *model, const char *layout, uint32_t rank, int slot, uint64_t version,
                    uint32_t max_readers);
/* Asks the relay to quit, or kills it (killed anyway after 10 s); reaps it. */
void relay_stop(relay_t *x, bool kill_it);

/* The holder called `name` in a pull's holder statistics, or NULL. */
const refit_holder_stat_t *holder(const refit_holder_stat_t *hs, size_t n, const char *name);
/* A receiver of a fleet (relays allowed, at most max_readers of its own
 * readers per relay), truth-verified, one thread, 16 KiB chunks. */
refit_receiver_t *fleet_receiver(const char *model, const char *layout, uint32_t rank, const reg_t *g,
                                 uint32_t max_readers, void **base);

#endif
