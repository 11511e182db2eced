/* Internal: where refit keeps a user's private files when it is not told
 * (the shm transport's sockets, the default file registry), in one place for
 * the library and `refit preflight` (tools/common/tool_pure.h restates it).
 *
 * Never a name under a directory every user may write that another user can
 * guess: a fixed "/tmp/refit-<uid>" let anyone create it first (ours or not,
 * refit refused it: shm and the default registry were disabled for the
 * victim).  So the directories come from the environment (a per-user
 * directory the system made), or - shm only, where the processes of one job
 * share a secret - from the job's key.  docs/security.md and docs/runtime.md
 * describe the order to users. */
#ifndef REFIT_UTIL_USERDIR_H
#define REFIT_UTIL_USERDIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The shm socket directory named by configuration: option (shm.dir=), else
 * $REFIT_RUNTIME_DIR, else $XDG_RUNTIME_DIR/refit (XDG_RUNTIME_DIR
 * absolute).  false when none is set: then each job's directory is
 * refit_job_runtime_dir's. *source says which it was ("shm.dir",
 * "REFIT_RUNTIME_DIR", "XDG_RUNTIME_DIR"). */
bool refit_runtime_dir(const char *option, char *out, size_t n, const char **source);

/* The runtime directory of a job when none is configured:
 * "/tmp/refit-<uid>-<16 hex digits>", the digits an HMAC of the job's
 * connection key.  Every process of the job on this host computes the same
 * name; a user without the job's secret cannot guess it, so cannot create it
 * first (for a job without a secret, --insecure, anyone can). */
void refit_job_runtime_dir(const uint8_t key[32], char *out, size_t n);

/* The default file registry's directory: $XDG_RUNTIME_DIR/refit/registry,
 * else $HOME/.cache/refit/registry (HOME absolute, not "/"), else the same
 * under this user's home directory in the passwd database.  false when there
 * is none (no shared fallback). */
bool refit_default_registry_dir(char *out, size_t n);

#endif
