/* Receivers, the plan cache and the connections to sources.
 *
 * Plans depend only on the manifests' layout parts (refit_plan_key_of): a
 * receiver keeps the last PLAN_CACHE of them, with what was built for each
 * later (delta indices, the digest plan), and reuses one whenever the sources'
 * signatures come back.  Peers are cached per source incarnation and staging
 * buffer, and dropped when a source's manifest is read again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/receiver_internal.h"

static void drop_plan(cached_plan_t *cp)
{
    for (uint32_t i = 0; i < cp->ndsrc; i++) {
        refit_delta_index_destroy(cp->dsrc[i].ix);
        free(cp->dsrc[i].wire);
    }
    free(cp->dsrc);
    refit_plan_destroy(cp->plan);
    refit_digest_plan_destroy(cp->dplan);
    free(cp->dregs);
    free(cp->dregion);
#ifdef REFIT_HAVE_CUDA
    refit_gpu_digest_check_destroy(cp->gchk);
#endif
    free(cp->dusable);
    memset(cp, 0, sizeof(*cp));
}

void refit_rx_drop_plans(refit_receiver_t *r)
{
    for (int i = 0; i < PLAN_CACHE; i++) drop_plan(&r->plans[i]);
}

static cached_plan_t *find_plan(refit_receiver_t *r, const refit_plan_key_t *key)
{
    for (int i = 0; i < PLAN_CACHE; i++)
        if (r->plans[i].plan && r->plans[i].key.src == key->src && r->plans[i].key.dst == key->dst) {
            r->plans[i].last_used = ++r->uses;
            return &r->plans[i];
        }
    return NULL;
}

static cached_plan_t *keep_plan(refit_receiver_t *r, const refit_plan_key_t *key, refit_plan_t *plan)
{
    int victim = 0;
    for (int i = 1; i < PLAN_CACHE; i++)
        if (r->plans[i].last_used < r->plans[victim].last_used) victim = i;
    drop_plan(&r->plans[victim]);
    r->plans[victim] = (cached_plan_t){.key = *key, .plan = plan, .last_used = ++r->uses};
    return &r->plans[victim];
}

refit_status_t refit_rx_plan_for(pull_t *p, bool *made)
{
    refit_receiver_t *r = p->r;
    refit_plan_key_t key;
    refit_plan_key_of(p->srcs, r->world, r->m, &key);
    *made = false;
    if ((p->cp = find_plan(r, &key))) return REFIT_OK;
    refit_plan_t *plan;
    refit_status_t st = refit_plan_create(p->srcs, r->world, r->m, NULL, &plan);
    if (st) return st;
    p->cp = keep_plan(r, &key, plan);
    *made = true;
    return REFIT_OK;
}

void refit_rx_drop_peers(refit_receiver_t *r, source_t *s)
{
    for (uint32_t t = 0; t < REFIT_MAX_TRANSPORTS; t++)
        for (uint32_t b = 0; b < MAX_BUFFERS; b++)
            if (s->peer[t][b]) {
                r->ts.ops[t]->disconnect(s->peer[t][b]);
                s->peer[t][b] = NULL;
            }
}

void refit_rx_drop_source(refit_receiver_t *r, source_t *s)
{
    refit_rx_drop_peers(r, s);
    refit_manifest_destroy(s->m);
    s->m = NULL;
    s->signature = s->incarnation = 0;
    s->transport = -1;
}

refit_status_t refit_rx_connect(refit_receiver_t *r, uint32_t k, uint32_t b, int *tidx)
{
    source_t *s = &r->src[k];
    refit_status_t st = REFIT_OK, first = REFIT_OK;
    char first_detail[512] = "";
    uint32_t n = (uint32_t)s->m->regions.len;
    n += refit_rx_delta_regions(s->m);              /* a delta publisher's arenas follow its regions */
    n += refit_rx_digest_region(s->m) >= 0 ? 1 : 0; /* then its digest table */
    n += refit_rx_stamp_region(s->m) >= 0 ? 1 : 0;  /* then its version stamp */
    for (uint32_t t = 0; t < r->ts.n; t++) {
        if (s->peer[t][b]) {
            *tidx = (int)t;
            return REFIT_OK;
        }
        const void **descs = calloc(n ? n : 1, sizeof(void *));
        size_t *lens = calloc(n ? n : 1, sizeof(size_t));
        if (!descs || !lens) {
            free(descs);
            free(lens);
            return refit_error(REFIT_ERR_NO_MEMORY, "connecting");
        }
        bool have = true;
        for (uint32_t i = 0; i < n && have; i++) {
            char key[96];
            refit_desc_key(key, sizeof(key), r->ts.ops[t]->name, i, b);
            have = refit_manifest_get_attr(s->m, key, &descs[i], &lens[i]) == REFIT_OK;
        }
        if (have) st = r->ts.ops[t]->connect(r->ts.ctx[t], descs, lens, n, &s->peer[t][b]);
        free(descs);
        free(lens);
        if (have && !st) {
            *tidx = (int)t;
            return REFIT_OK;
        }
        if (have && !first) {
            first = st;
            snprintf(first_detail, sizeof(first_detail), "%s", refit_last_error());
        }
    }
    if (first) return refit_error(first, "source rank %u: %s", k, first_detail);
    return refit_error(REFIT_ERR_TRANSPORT, "source rank %u exposes none of this receiver's transports", k);
}

refit_status_t refit_rx_connect_recorded(refit_receiver_t *r, const snapshot_t *s, uint32_t k, int *tidx)
{
    uint32_t b = s->recs[k].buffer;
    if (b >= MAX_BUFFERS) return refit_error(REFIT_ERR_CORRUPT, "source rank %u names staging buffer %u", k, b);
    return refit_rx_connect(r, k, b, tidx);
}
