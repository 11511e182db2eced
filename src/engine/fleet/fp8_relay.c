/* FP8 relays: a bf16 receiver and an FP8 publisher in one object.  Each step
 * pulls a version of one bf16 rank, quantizes it into the FP8 arena
 * (refit_fp8_stage) and publishes the arena under the target's own manifest
 * (refit_fp8_target_manifest), so FP8 receivers plan and pull it like any
 * source, and the wire from the relay to them carries FP8 bytes and scales. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "refit/experimental/fp8.h"

struct refit_fp8_relay {
    refit_receiver_t *rx;
    refit_publisher_t *tx;
    refit_fp8_target_t *target;
    void *image, *arena;
    uint64_t image_bytes, arena_bytes;
    uint64_t published;
    bool in_place;
    unsigned threads;
    refit_manifest_t *bf16; /* the caller's, owned once made (the receiver holds a copy) */
};

/* The caller's params read by size (refit/engine.h), then checked. */
static refit_status_t relay_params(const refit_receiver_params_t *rp, const refit_publisher_params_t *pp,
                                   refit_receiver_params_t *rin, refit_publisher_params_t *pin)
{
    refit_status_t st;
    if ((st = refit_params_in(rin, sizeof(*rin), rp, REFIT_RECEIVER_PARAMS_SIZE_1, "refit_receiver_params_t")) ||
        (st = refit_params_in(pin, sizeof(*pin), pp, REFIT_PUBLISHER_PARAMS_SIZE_1, "refit_publisher_params_t")))
        return st;
    const char *rg = rin->group && rin->group[0] ? rin->group : "trainer";
    if (!pin->group || !pin->group[0] || !strcmp(pin->group, rg))
        return refit_error(REFIT_ERR_INVALID_ARG, "an FP8 relay publishes into a group of its own (not \"%s\")", rg);
    if (rin->device >= 0 || pin->device >= 0)
        return refit_error(REFIT_ERR_UNSUPPORTED, "FP8 relays quantize in host memory");
    return REFIT_OK;
}

refit_status_t refit_fp8_relay_create(const refit_receiver_params_t *rp, const refit_publisher_params_t *pp,
                                      refit_manifest_t *bf16, refit_fp8_relay_t **out)
{
    refit_status_t st;
    refit_receiver_params_t rin;
    refit_publisher_params_t pin;
    if (!rp || !pp || !bf16 || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_fp8_relay_create: NULL argument");
    if ((st = relay_params(rp, pp, &rin, &pin))) return st;
    refit_fp8_relay_t *x = calloc(1, sizeof(*x));
    if (!x) return refit_error(REFIT_ERR_NO_MEMORY, "fp8 relay");
    refit_manifest_t *fm = NULL, *mine = NULL;
    if ((st = refit_fp8_target_create(bf16, &x->target))) goto err;
    if ((st = refit_fp8_target_manifest(x->target, bf16, &fm))) goto err;
    x->image_bytes = refit_manifest_region_size(bf16, 0);
    x->arena_bytes = refit_fp8_target_bytes(x->target);
    x->in_place = pin.mode == REFIT_MODE_IN_PLACE;
    x->threads = rin.threads;
    /* the relay's receiver takes a copy: the caller's manifest stays the caller's until the relay is made */
    if ((st = refit_manifest_copy(bf16, &mine))) goto err;
    if ((st = refit_receiver_create(&rin, mine, &x->rx))) goto err;
    mine = NULL; /* the receiver owns it */
    if ((st = refit_receiver_alloc(x->rx, 0, &x->image))) goto err;
    if ((st = refit_publisher_create(&pin, fm, &x->tx))) goto err;
    fm = NULL;
    if ((st = refit_publisher_alloc(x->tx, 0, &x->arena))) goto err;
    x->bf16 = bf16; /* ours from here on */
    *out = x;
    return REFIT_OK;
err:
    refit_error_prefix("FP8 relay");
    refit_manifest_destroy(fm);
    refit_manifest_destroy(mine);
    refit_fp8_relay_destroy(x);
    return st;
}

refit_status_t refit_fp8_relay_step(refit_fp8_relay_t *x, uint64_t version, int timeout_ms,
                                    refit_fp8_relay_report_t *rep)
{
    if (!x) return refit_error(REFIT_ERR_INVALID_ARG, "FP8 relay is NULL");
    if (rep) {
        refit_status_t st = refit_out_check(rep->size, REFIT_END_OF(refit_fp8_relay_report_t, publish_ms),
                                            "refit_fp8_relay_report_t");
        if (st) return st;
    }
    refit_fp8_relay_report_t r;
    memset(&r, 0, sizeof(r));
    refit_pull_report_t pr = REFIT_PULL_REPORT_INIT;
    double t0 = refit_now();
    refit_status_t st = REFIT_OK;
    uint64_t have = refit_receiver_committed(x->rx);
    if (have > x->published && refit_receiver_usable(x->rx) && (version == REFIT_VERSION_NEWEST || version == have)) {
        /* A step before this one pulled `have` but could not publish it
         * (its readers did not leave in time): the image still holds it. */
        pr.version = have;
    } else if ((st = refit_receiver_pull(x->rx, version, timeout_ms, &pr))) {
        refit_error_prefix("FP8 relay: pulling the bf16 version");
        return st;
    }
    r.version = pr.version;
    r.bf16_bytes = pr.bytes;
    r.pull_ms = (refit_now() - t0) * 1e3;
    /* In place: the arena is rewritten only once no reader holds the version in it. */
    double t1 = refit_now();
    if (x->in_place && x->published && (st = refit_publisher_wait_readers(x->tx, x->published, timeout_ms))) {
        refit_error_prefix("FP8 relay: readers of version %" PRIu64, x->published);
        return st;
    }
    r.wait_ms = (refit_now() - t1) * 1e3;
    t1 = refit_now();
    if ((st = refit_fp8_stage(x->target, x->image, x->arena, x->threads))) return st;
    r.stage_ms = (refit_now() - t1) * 1e3;
    t1 = refit_now();
    if ((st = refit_publisher_publish(x->tx, pr.version))) {
        refit_error_prefix("FP8 relay: publishing version %" PRIu64, pr.version);
        return st;
    }
    r.publish_ms = (refit_now() - t1) * 1e3;
    x->published = pr.version;
    r.fp8_bytes = x->arena_bytes;
    if (rep) refit_out_write(rep, rep->size, &r, sizeof(r));
    return REFIT_OK;
}

void refit_fp8_relay_destroy(refit_fp8_relay_t *x)
{
    if (!x) return;
    refit_publisher_destroy(x->tx);
    refit_receiver_destroy(x->rx);
    refit_fp8_target_destroy(x->target);
    refit_manifest_destroy(x->bf16);
    free(x);
}
