/* The registry: where manifests, heartbeats, version records and leases live.
 *
 * One job (a namespace) holds source groups (e.g. "trainer"); each source
 * rank of a group stores its encoded manifest, a heartbeat that expires, and
 * a version record per publish.  Receivers take leases on the version they
 * read; a publisher in in-place mode retires a version (no new leases) and
 * waits for its leases to drain before overwriting its memory.
 *
 * URLs: "file:DIR" (embedded, no server; processes on one host or a shared
 * filesystem; atomic renames, inotify for waits) and "redis://HOST:PORT"
 * (a real Redis through hiredis; pub/sub for waits).
 *
 * Thread safety: one registry object may be used from several threads (the
 * publisher's heartbeat thread and its caller); backends serialise access.
 * Every call is bounded in time: a backend that cannot reach its store
 * returns REFIT_ERR_REGISTRY within its I/O timeout (and reconnects on the
 * next call). */
#ifndef REFIT_REGISTRY_H
#define REFIT_REGISTRY_H

#include "refit/experimental/probe.h" /* the exported part: connect, secure, secret_source, probe, close */
#include "util/util.h"

typedef struct refit_registry refit_registry_t;

/* Authentication (docs/security.md).  Every value the registry stores
 * carries an HMAC-SHA-256 tag under a key derived from the job's secret and
 * bound to the value's key, and every value read is checked: a value written
 * without the secret (or moved to another key) is refused with
 * REFIT_ERR_AUTH naming the key.  The secret is looked up in this order:
 *   secret_file, else $REFIT_SECRET_FILE: a regular file of at least 16
 *     bytes, owned by this user, not readable by group or others;
 *   $REFIT_SECRET: the secret itself (16..4096 characters).  The first open
 *     that uses it copies it into the process's copy (pages left out of core
 *     dumps) and removes it from the environment, its bytes overwritten;
 *     later opens use that copy (or a new $REFIT_SECRET set meanwhile).
 *     Processes exec'ed after that do not inherit it: pass them
 *     REFIT_SECRET_FILE.  Not read when a secret file is given;
 *   insecure, else $REFIT_INSECURE=1: a fixed, public key: anyone who can
 *     write the registry or reach a listener is trusted (logged once);
 *   file: registries: DIR/<job>/.secret, 32 random bytes created (0600) by
 *     the first process to open the job; every process that can open the
 *     job directory (0700, ours) shares it;
 *   otherwise (redis) REFIT_ERR_AUTH: a networked registry needs a secret.
 * Keys for other uses (transport connections, content digests) are derived
 * from the same secret (refit_registry_key); the secret passes, and the keys
 * live, on pages left out of core dumps (refit_secret_alloc). */
typedef struct {
    const char *secret_file;
    bool insecure;
} refit_registry_auth_t;

/* Drops the process's copy of $REFIT_SECRET (tests: an open without a
 * secret in the environment then finds none). */
void refit_registry_forget_env_secret(void);

/* Opens a registry for `job` (namespace; [A-Za-z0-9._-], 1..64 chars, not
 * starting with '.').  auth NULL: the environment and defaults above.
 * REFIT_ERR_INVALID_ARG for a malformed URL or job, REFIT_ERR_UNSUPPORTED for
 * a scheme not built in (e.g. redis without hiredis), REFIT_ERR_REGISTRY if
 * the store cannot be reached or created (detail names URL and reason),
 * REFIT_ERR_AUTH if no usable secret was found (the detail says where it looked). */
refit_status_t refit_registry_open_auth(const char *url, const char *job, const refit_registry_auth_t *auth,
                                        refit_registry_t **out);
refit_status_t refit_registry_open(const char *url, const char *job, refit_registry_t **out);

typedef enum { REFIT_KEY_CONNECTION = 0, REFIT_KEY_DIGEST = 1 } refit_key_use_t;
/* A 32-byte key derived from the job's secret for `use` (valid while r is open). */
const uint8_t *refit_registry_key(const refit_registry_t *r, refit_key_use_t use);
/* False when the registry runs with the public key (insecure). */
bool refit_registry_secure(const refit_registry_t *r);
/* Where the secret came from ("file /path", "$REFIT_SECRET", "job directory", "insecure"). */
const char *refit_registry_secret_source(const refit_registry_t *r);
void refit_registry_close(refit_registry_t *r);
const char *refit_registry_url(const refit_registry_t *r);

/* ---- sources ------------------------------------------------------------ */
typedef struct {
    uint64_t incarnation; /* random per publisher process start */
    uint32_t pid;
    char host[64];
} refit_source_info_t;

/* Stores rank's encoded manifest (replacing any previous one). */
refit_status_t refit_registry_put_manifest(refit_registry_t *r, const char *group, uint32_t rank, const void *buf,
                                           size_t len);
/* Fetches it (malloc'ed; free it).  REFIT_ERR_NOT_FOUND if absent. */
refit_status_t refit_registry_get_manifest(refit_registry_t *r, const char *group, uint32_t rank, void **buf,
                                           size_t *len);
/* Refreshes rank's heartbeat; it expires ttl_ms later unless refreshed. */
refit_status_t refit_registry_heartbeat(refit_registry_t *r, const char *group, uint32_t rank,
                                        const refit_source_info_t *info, uint32_t ttl_ms);
/* The same, and *was_absent = true if the heartbeat had expired or vanished
 * before this beat (the publisher stalled, or the store lost its data): the
 * caller should write its manifest and record again. */
refit_status_t refit_registry_beat(refit_registry_t *r, const char *group, uint32_t rank,
                                   const refit_source_info_t *info, uint32_t ttl_ms, bool *was_absent);
/* alive[k] = 1 if rank k's heartbeat has not expired (infos[k] filled when
 * infos != NULL), for k < world.  One round trip where the backend allows. */
refit_status_t refit_registry_alive(refit_registry_t *r, const char *group, uint32_t world, uint8_t *alive,
                                    refit_source_info_t *infos);
/* Removes rank's manifest, heartbeat and record (a clean shutdown). */
refit_status_t refit_registry_remove_source(refit_registry_t *r, const char *group, uint32_t rank);

/* ---- versions ----------------------------------------------------------- */
typedef struct {
    uint64_t version;     /* the training step */
    uint64_t signature;   /* layout signature of the manifest the bytes follow */
    uint64_t incarnation; /* of the publisher that published it */
    uint32_t buffer;      /* snapshot buffer index (0 in in-place mode) */
    uint32_t flags;
    uint64_t delta_base; /* the publisher also offers a delta from this version (0: none) */
} refit_version_record_t;

/* Rank publishes a version record (replacing its previous one) and notifies waiters. */
refit_status_t refit_registry_publish(refit_registry_t *r, const char *group, uint32_t rank,
                                      const refit_version_record_t *rec);
/* Records of ranks 0..world-1: present[k] = 0 where none.  One round trip where the backend allows. */
refit_status_t refit_registry_records(refit_registry_t *r, const char *group, uint32_t world,
                                      refit_version_record_t *recs, uint8_t *present);

/* Rank 0's record and liveness in each of n groups (relay groups, which
 * have one rank each), in one round trip where the backend allows.  A value
 * that does not decode is logged and reported absent. */
refit_status_t refit_registry_heads(refit_registry_t *r, const char *const *groups, uint32_t n,
                                    refit_version_record_t *recs, uint8_t *present, uint8_t *alive);

/* Stores `val` under `key` (inside the job) signed as the registry signs its
 * own values: for tests and tools that need to write an entry by hand. */
refit_status_t refit_registry_put_signed(refit_registry_t *r, const char *key, const void *val, size_t len,
                                         uint32_t ttl_ms);

/* ---- the store's epoch ---------------------------------------------------- */
/* A random value the first user of the job stores (no expiry); a store that
 * lost its data (Redis restarted without persistence, the directory wiped)
 * comes back with another one, created by whoever looks first.  *created is
 * set when this call created it. */
refit_status_t refit_registry_epoch(refit_registry_t *r, uint64_t *epoch, bool *created);

/* ---- leases ------------------------------------------------------------- */
/* Marks `version` retired: later lease_acquire calls on it fail with REFIT_ERR_STALE. */
refit_status_t refit_registry_retire(refit_registry_t *r, const char *group, uint64_t version);
/* Takes (or renews) reader's lease on version, expiring ttl_ms later.
 * REFIT_ERR_STALE (and no lease left behind) if the version is retired. */
refit_status_t refit_registry_lease_acquire(refit_registry_t *r, const char *group, uint64_t version,
                                            const char *reader, uint32_t ttl_ms);
refit_status_t refit_registry_lease_release(refit_registry_t *r, const char *group, uint64_t version,
                                            const char *reader);
/* Fenced leases (receivers reading a trainer's memory): take() acquires as
 * lease_acquire and stores a fresh random token in the lease (*token);
 * renew() re-acquires only while the lease still holds that token
 * (REFIT_ERR_STALE "lease lost" if it vanished - deleted, expired, or the
 * store lost its data - or holds another token); holds() checks the same
 * without writing.  A reader commits only if holds() passes after its
 * transfer: a publisher that saw no lease may have rewritten its memory. */
refit_status_t refit_registry_lease_take(refit_registry_t *r, const char *group, uint64_t version, const char *reader,
                                         uint32_t ttl_ms, uint64_t *token);
refit_status_t refit_registry_lease_renew(refit_registry_t *r, const char *group, uint64_t version, const char *reader,
                                          uint32_t ttl_ms, uint64_t token);
refit_status_t refit_registry_lease_holds(refit_registry_t *r, const char *group, uint64_t version, const char *reader,
                                          uint64_t token);
/* Deletes every lease on `version` (a publisher that must reuse its memory
 * after its readers' time ran out: a reader whose lease is gone fails its
 * lease_holds check after its transfer, so it never commits bytes read
 * while the memory was rewritten).  *n (may be NULL): leases deleted. */
refit_status_t refit_registry_lease_revoke(refit_registry_t *r, const char *group, uint64_t version, uint32_t *n);
/* Unexpired leases on version whose values are authentic (a forged lease
 * key is logged and not counted). */
refit_status_t refit_registry_lease_count(refit_registry_t *r, const char *group, uint64_t version, uint32_t *n);

/* ---- receivers' acknowledgements ---------------------------------------- */
/* Reader reports that it committed `version` (replacing its previous report;
 * a report expires after an hour without a newer one). */
refit_status_t refit_registry_ack(refit_registry_t *r, const char *group, const char *reader, uint64_t version);
/* Readers whose last authentic report is >= version. */
refit_status_t refit_registry_acks(refit_registry_t *r, const char *group, uint64_t version, uint32_t *n);

/* ---- waiting ------------------------------------------------------------ */
/* Blocks until something in this job changed since the previous call to
 * refit_registry_wait on this object (or since open), or timeout_ms passed
 * (REFIT_ERR_TIMEOUT).  No busy polling: inotify (file) or pub/sub (redis).
 * Changes are never lost: a change between two calls makes the next return
 * at once. */
refit_status_t refit_registry_wait(refit_registry_t *r, int timeout_ms);

#endif
