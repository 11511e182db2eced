/* The engine's side of refit/metrics.h: one call per event, from the end of
 * refit_receiver_pull and of refit_publisher_publish.  Neither ever fails
 * nor changes the caller's status or report. */
#ifndef REFIT_ENGINE_METRICS_H
#define REFIT_ENGINE_METRICS_H

#include "refit/engine.h"
#include "refit/experimental/metrics.h"

/* A pull ended with `st`; rep is the report the pull filled (on failure
 * only the status is counted).  job NULL: "default". */
void refit_metrics_pull(const char *job, const char *group, const refit_manifest_t *m, refit_status_t st,
                        const refit_pull_report_t *rep);

/* A publish of `version` ended with `st` after `seconds`; digest_ms as
 * refit_publisher_digest_ms; delta: the publisher's last delta (NULL when
 * it is not a delta publisher). */
void refit_metrics_publish(const char *job, const char *group, const refit_manifest_t *m, refit_status_t st,
                           uint64_t version, double seconds, double digest_ms, const refit_publish_delta_t *delta);

#endif
