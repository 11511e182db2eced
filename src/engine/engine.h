/* Internal helpers shared by publishers and receivers. */
#ifndef REFIT_ENGINE_INTERNAL_H
#define REFIT_ENGINE_INTERNAL_H

#include "layout/manifest.h"
#include "refit/engine.h"
#include "plan/plan.h"
#include "refit/experimental/truth.h"
#include "registry/registry.h"
#include "transport/transport.h"

#define REFIT_MAX_TRANSPORTS 4

/* The smallest size a caller may give a sized output (refit/engine.h): the
 * end of the last field of its first sized version.  Never change these;
 * fields added later lie past them. */
#define REFIT_PULL_REPORT_SIZE_V1 REFIT_END_OF(refit_pull_report_t, digest_ms)
#define REFIT_HOLDER_STAT_SIZE_V1 REFIT_END_OF(refit_holder_stat_t, early)

typedef struct {
    uint32_t n;
    const refit_transport_ops_t *ops[REFIT_MAX_TRANSPORTS];
    refit_transport_t *ctx[REFIT_MAX_TRANSPORTS];
} refit_tset_t;

/* Parses "shm,ucx" (NULL: every built-in transport, shm first) and creates
 * each with its options taken from `options` ("ucx.listen=...,shm.x=..."),
 * giving each the connection key (32 bytes; NULL: the public key). */
refit_status_t refit_tset_open(refit_tset_t *ts, const char *names, const char *options, const uint8_t *key);
void refit_tset_close(refit_tset_t *ts);

/* Manifest attribute naming one region's descriptor for one transport and buffer. */
void refit_desc_key(char *buf, size_t n, const char *transport, uint32_t region, uint32_t buffer);

/* Validates a group or reader name ([A-Za-z0-9._:-], 1..100). */
refit_status_t refit_check_name(const char *what, const char *s);

/* transport_options plus "cuda_ipc.device=N" for device >= 0 (unless the
 * options already name one) and "cuda_ipc.rank=R"; malloc'ed, NULL on OOM. */
char *refit_options_for_device(const char *options, int device, uint32_t rank);
/* The transports to open: `names`, or for device memory when none are
 * named, "cuda_ipc". */
const char *refit_transports_for_device(const char *names, int device);

uint64_t refit_random_u64(void);
/* url when it is set, else refit_default_registry() (looked up only then:
 * the default is fixed at its first use in a process). */
const char *refit_registry_url_or_default(const char *url);

/* Flags every later record of this publisher carries (relays: the low 32
 * bits of the origin of the version they serve, so that readers skip a
 * relay of another trainer incarnation without reading it). */
void refit_publisher_stamp(refit_publisher_t *p, uint32_t flags);
/* Its exposed memory changed (transport.h: notify). */
void refit_publisher_notify(refit_publisher_t *p);
/* Buffer `buffer`'s memory may be rewritten from now on: its version stamp
 * (engine/stamp.h) is cleared, so no reader commits what it reads there
 * until the next publish (relays, before their receiver writes again). */
void refit_publisher_rewriting(refit_publisher_t *p, uint32_t buffer);
void refit_hostname(char *buf, size_t n);

#endif
