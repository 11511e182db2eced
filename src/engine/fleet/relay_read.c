/* Relays, reading (relay.c's top comment): the relays of our rank whose
 * layout mirrors ours (checked once per layout: mirrors_ours), found
 * holding a version from the same trainer records, with room for a reader
 * (load tokens), leased and connected as holders (refit_relays_find); their
 * leases and tokens renewed during the pull and their stamps checked after
 * it (refit_relays_holds). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/fleet/relay_internal.h"
#include "engine/stamp.h"
#include "engine/test_hooks.h"

/* The relay's progress region (its last, named by an attribute), -1: none. */
static int progress_region_of(const refit_manifest_t *m)
{
    const void *v;
    size_t len;
    uint32_t idx;
    if (refit_manifest_get_attr(m, "refit.progress", &v, &len) || len != sizeof(idx)) return -1;
    memcpy(&idx, v, sizeof(idx));
    return idx + 1 == m->regions.len && m->regions.data[idx] >= REFIT_PROGRESS_BYTES ? (int)idx : -1;
}

/* The relay's key: its manifest's mirror key without the progress region. */
static uint64_t relay_key(const refit_manifest_t *m, int *progress_region)
{
    refit_manifest_t tmp = *m;
    *progress_region = progress_region_of(m);
    if (*progress_region >= 0) tmp.regions.len--;
    return refit_fleet_mirror_key(&tmp);
}

/* Slot j's manifest (group g), whose record says `signature`; NULL unless
 * it decodes to that signature (a decode recomputes it from the content). */
static refit_manifest_t *fetch_relay_manifest(refit_relays_t *R, const char *g, uint64_t signature)
{
    void *buf = NULL;
    size_t len = 0;
    refit_manifest_t *m = NULL;
    if (refit_registry_get_manifest(R->reg, g, 0, &buf, &len)) return NULL;
    R->fetches++;
    refit_status_t st = refit_manifest_decode(buf, len, &m);
    free(buf);
    if (st) return NULL;
    if (m->signature != signature) {
        refit_manifest_destroy(m);
        return NULL;
    }
    return m;
}

/* Index of relay layout `signature` among those checked to mirror ours, -1: none. */
static int mirror_index(const refit_relays_t *R, uint64_t signature)
{
    for (uint32_t i = 0; i < R->nmirror; i++)
        if (R->mirror_sig[i] == signature) return (int)i;
    return -1;
}

/* Whether relay layout `signature` mirrors ours: remembered, or fetched from
 * slot group g and checked (then *m holds it). */
static bool mirrors_ours(refit_relays_t *R, const char *g, uint64_t signature, int *pr, refit_manifest_t **m)
{
    *m = NULL;
    int i = mirror_index(R, signature);
    if (i >= 0) {
        *pr = R->mirror_progress[i];
        return true;
    }
    refit_manifest_t *x = fetch_relay_manifest(R, g, signature);
    if (!x || relay_key(x, pr) != R->key) { /* another layout: not a mirror of ours */
        refit_manifest_destroy(x);
        return false;
    }
    if (R->nmirror < REFIT_MAX_RELAYS) {
        R->mirror_sig[R->nmirror] = signature;
        R->mirror_progress[R->nmirror++] = *pr;
    }
    *m = x;
    return true;
}


/* Takes a load token on `g` for v if fewer than cap readers hold one (cap 0: no limit). */
static bool take_token(refit_relays_t *R, const char *g, uint64_t v, const char *reader, uint32_t cap)
{
    char lg[104];
    load_group(g, lg, sizeof(lg));
    if (!cap) return true;
    uint32_t n = 0;
    if (refit_registry_lease_count(R->reg, lg, v, &n) || !refit_fleet_room(n, cap)) return false;
    if (refit_registry_lease_acquire(R->reg, lg, v, reader, LOAD_TTL_MS)) return false;
    if (refit_registry_lease_count(R->reg, lg, v, &n) || n > cap) { /* raced: back off */
        refit_registry_lease_release(R->reg, lg, v, reader);
        return false;
    }
    return true;
}

static void drop_token(refit_relays_t *R, const char *g, uint64_t v, const char *reader)
{
    char lg[104];
    load_group(g, lg, sizeof(lg));
    refit_registry_lease_release(R->reg, lg, v, reader);
}

static refit_status_t connect_relay(refit_relays_t *R, const refit_tset_t *ts, relay_src_t *s, uint32_t *tidx)
{
    uint32_t n = (uint32_t)s->m->regions.len;
    if (refit_stamp_region(s->m) == (int64_t)n) n++; /* its version stamp follows its regions */
    refit_status_t st = REFIT_ERR_TRANSPORT;
    for (uint32_t t = 0; t < ts->n; t++) {
        if (s->peer[t]) {
            *tidx = t;
            return REFIT_OK;
        }
        const void *descs[REFIT_MAX_REGIONS + 1]; /* its regions and its stamp */
        size_t lens[REFIT_MAX_REGIONS + 1];
        bool have = n <= REFIT_MAX_REGIONS + 1;
        for (uint32_t i = 0; i < n && have; i++) {
            char key[96];
            refit_desc_key(key, sizeof(key), ts->ops[t]->name, i, 0);
            have = refit_manifest_get_attr(s->m, key, &descs[i], &lens[i]) == REFIT_OK;
        }
        if (have && !(st = ts->ops[t]->connect(ts->ctx[t], descs, lens, n, &s->peer[t]))) {
            *tidx = t;
            return REFIT_OK;
        }
    }
    (void)R;
    return st;
}

/* Slot j's version stamp (engine/stamp.h) against the record it was leased
 * by: the relay's memory holds that version (before its bytes are read, and
 * after).  REFIT_OK for a relay without one. */
static refit_status_t check_stamp(const refit_tset_t *ts, relay_src_t *s, uint32_t j, const char *when)
{
    int64_t sr = refit_stamp_region(s->m);
    if (sr != (int64_t)s->m->regions.len) return REFIT_OK;
    uint32_t t = 0;
    while (t < ts->n && !s->peer[t]) t++;
    if (t == ts->n) return refit_error(REFIT_ERR_INTERNAL, "relay slot %u is not connected", j);
    unsigned char buf[REFIT_STAMP_BYTES];
    refit_plan_region_t reg = {.src_region = (uint32_t)sr, .run = REFIT_STAMP_BYTES};
    uint64_t sb = REFIT_STAMP_BYTES;
    struct refit_plan one = refit_plan_view(&reg, 1, &sb, 1);
    refit_peer_t *peers[1] = {s->peer[t]};
    void *dst[1] = {buf};
    refit_pull_ctl_t ctl = {.deadline = refit_now() + 10, .threads = 1};
    refit_pull_stats_t ps = {0};
    refit_stamp_t stamp;
    refit_version_record_t rec = {
        .version = s->version, .incarnation = s->incarnation, .signature = s->signature, .buffer = 0};
    refit_status_t st = ts->ops[t]->pull(ts->ctx[t], peers, &one, dst, &ctl, &ps);
    if (!st) st = refit_stamp_decode(buf, 0, &stamp);
    if (!st) st = refit_stamp_matches(&stamp, &rec, 0, when);
    if (st) refit_error_prefix("relay slot %u", j);
    return st;
}

/* Every slot's record and heartbeat, in one registry round trip. */
typedef struct {
    char groups[REFIT_MAX_RELAYS][104];
    refit_version_record_t recs[REFIT_MAX_RELAYS];
    uint8_t present[REFIT_MAX_RELAYS], alive[REFIT_MAX_RELAYS];
} heads_t;

static bool read_heads(refit_relays_t *R, heads_t *H)
{
    const char *gp[REFIT_MAX_RELAYS];
    for (uint32_t j = 0; j < REFIT_MAX_RELAYS; j++) {
        relay_group(R, j, H->groups[j], sizeof(H->groups[j]));
        gp[j] = H->groups[j];
    }
    if (refit_registry_heads(R->reg, gp, REFIT_MAX_RELAYS, H->recs, H->present, H->alive)) {
        refit_log(REFIT_LOG_WARN, "looking for relays: %s", refit_last_error());
        return false;
    }
    return true;
}

/* Other relays alive whose layout is one checked to mirror ours (whatever
 * version they hold; nothing fetched). */
static uint32_t count_mirrors(const refit_relays_t *R, const heads_t *H)
{
    uint32_t n = 0;
    for (uint32_t j = 0; j < REFIT_MAX_RELAYS; j++)
        n += (int)j != R->slot && H->present[j] && H->alive[j] && mirror_index(R, H->recs[j].signature) >= 0;
    return n;
}

/* Slot s (group g) as its record `rec` describes it: known to mirror our
 * layout (its manifest fetched when it had not been checked), or false. */
static bool learn_slot(refit_relays_t *R, const refit_tset_t *ts, relay_src_t *s, const char *g,
                       const refit_version_record_t *rec)
{
    if (s->known && s->signature == rec->signature && s->incarnation == rec->incarnation) return true;
    refit_relay_src_drop(ts, s);
    int pr;
    refit_manifest_t *m;
    if (!mirrors_ours(R, g, rec->signature, &pr, &m)) return false;
    s->m = m;
    s->known = true;
    s->progress_region = pr;
    s->signature = rec->signature;
    s->incarnation = rec->incarnation;
    return true;
}

/* Slot s's own manifest (its transport descriptors), fetched when it is
 * first read; its signature is one checked before, and its own layout is
 * checked again all the same (the signature is a 64-bit hash).  False when
 * it cannot be read (read again next time). */
static bool own_manifest(refit_relays_t *R, relay_src_t *s, const char *g)
{
    if (s->m) return true;
    int pr;
    s->m = fetch_relay_manifest(R, g, s->signature);
    if (s->m && (relay_key(s->m, &pr) != R->key || pr != s->progress_region)) {
        refit_manifest_destroy(s->m);
        s->m = NULL;
    }
    return s->m != NULL;
}

void refit_relays_learn(refit_relays_t *R, const refit_tset_t *ts)
{
    heads_t H;
    if (!R || !read_heads(R, &H)) return;
    for (uint32_t j = 0; j < REFIT_MAX_RELAYS; j++)
        if ((int)j != R->slot && H.present[j] && H.alive[j] && learn_slot(R, ts, &R->src[j], H.groups[j], &H.recs[j]))
            own_manifest(R, &R->src[j], H.groups[j]);
    R->mirrors_alive = count_mirrors(R, &H);
}

uint32_t refit_relays_mirrors_alive(const refit_relays_t *R) { return R ? R->mirrors_alive : 0; }

uint32_t refit_relays_find(refit_relays_t *R, const refit_tset_t *ts, uint64_t v, uint64_t origin, const char *reader,
                           uint32_t lease_ms, refit_fleet_holder_t *out, uint32_t max, uint32_t *holding,
                           bool only_upstream)
{
    uint32_t nh = 0;
    *holding = 0;
    heads_t H;
    if (!read_heads(R, &H)) return 0;
    R->mirrors_alive = count_mirrors(R, &H);
    R->coming = 0;
    R->upstream_coming = false;
    for (uint32_t j = 0; j < REFIT_MAX_RELAYS; j++) {
        /* A relay of our layout, alive, still at an older version (it has not begun v: a receiver that committed
         * before, or withdrew its memory to receive again). */
        if ((int)j == R->slot || !H.present[j] || !H.alive[j] || H.recs[j].version >= v ||
            mirror_index(R, H.recs[j].signature) < 0)
            continue;
        R->coming++;
        if ((int)j == R->upstream) R->upstream_coming = true;
    }
    for (uint32_t k = 0; k < REFIT_MAX_RELAYS && nh < max; k++) {
        /* The relay read last time first (its connection is open). */
        uint32_t j = k;
        if (R->upstream >= 0) j = k == 0 ? (uint32_t)R->upstream : k <= (uint32_t)R->upstream ? k - 1 : k;
        relay_src_t *s = &R->src[j];
        if ((int)j == R->slot) continue;
        const char *g = H.groups[j];
        const refit_version_record_t *rec = &H.recs[j];
        /* A relay of another trainer incarnation's version is no holder (its progress says so too). */
        if (!H.present[j] || rec->version != v || !H.alive[j] || rec->flags != (uint32_t)origin) continue;
        if (!learn_slot(R, ts, s, g, rec)) continue;
        (*holding)++;
        if (only_upstream && (int)j != R->upstream) continue; /* counted, not taken */
        if (!take_token(R, g, v, reader, R->params.max_readers)) continue;
        s->loaded = R->params.max_readers != 0;
        if (refit_registry_lease_take(R->reg, g, v, reader, lease_ms, &s->token)) { /* retired: it moves on */
            if (s->loaded) drop_token(R, g, v, reader);
            s->loaded = false;
            continue;
        }
        s->leased = true;
        s->version = v;
        uint32_t t;
        bool readable = own_manifest(R, s, g);
        if (!readable) (*holding)--; /* no holder for us this time */
        if (!readable || connect_relay(R, ts, s, &t) || check_stamp(ts, s, j, "before reading it")) {
            if (readable) refit_log(REFIT_LOG_INFO, "%s: relay slot %u skipped: %s", reader, j, refit_last_error());
            refit_registry_lease_release(R->reg, g, v, reader);
            if (s->loaded) drop_token(R, g, v, reader);
            s->leased = s->loaded = false;
            continue;
        }
        refit_fleet_holder_t *h = &out[nh++];
        memset(h, 0, sizeof(*h));
        snprintf(h->name, sizeof(h->name), "relay:%u", j);
        h->transport = t;
        h->peer = s->peer[t];
        h->mirror_dst = true;
        h->progress_region = s->progress_region;
        h->rate = refit_test_throttle("relay", j);
        h->delay_s = refit_test_read_delay("relay", j);
        h->id = j;
    }
    return nh;
}

void refit_relays_set_upstream(refit_relays_t *R, int upstream)
{
    if (R) R->upstream = upstream >= REFIT_MAX_RELAYS ? REFIT_RELAYS_NONE : upstream;
}

int refit_relays_upstream(const refit_relays_t *R) { return R ? R->upstream : REFIT_RELAYS_NONE; }

uint32_t refit_relays_coming(const refit_relays_t *R, bool *upstream)
{
    *upstream = R && R->upstream_coming;
    return R ? R->coming : 0;
}

uint32_t refit_relays_fetches(const refit_relays_t *R) { return R ? R->fetches : 0; }

/* Trainer load is counted per receiver rank: readers of the same bytes. */
static void trainer_load_name(const refit_relays_t *R, char *buf, size_t n)
{
    snprintf(buf, n, "%.40s.r%u", R->group, R->rank);
}

bool refit_relays_trainer_token(refit_relays_t *R, uint64_t v, const char *reader, uint32_t cap)
{
    char g[104];
    trainer_load_name(R, g, sizeof(g));
    if (!take_token(R, g, v, reader, cap)) return false;
    R->trainer_loaded = cap != 0;
    R->trainer_version = v;
    return true;
}

refit_status_t refit_relays_renew(refit_relays_t *R, const char *reader, uint32_t lease_ms)
{
    if (!R) return REFIT_OK;
    double now = refit_now();
    if (now - R->renewed < LOAD_TTL_MS / 3e3) return REFIT_OK;
    R->renewed = now;
    char g[104], lg[104];
    for (uint32_t j = 0; j < REFIT_MAX_RELAYS; j++) {
        relay_src_t *s = &R->src[j];
        if (!s->leased) continue;
        relay_group(R, j, g, sizeof(g));
        refit_status_t st = refit_registry_lease_renew(R->reg, g, s->version, reader, lease_ms, s->token);
        if (st) /* retired or revoked: this relay's memory may be rewritten now */
            return refit_error(st, "relay slot %u: %s", j, refit_last_error());
        if (s->loaded) {
            load_group(g, lg, sizeof(lg));
            refit_registry_lease_acquire(R->reg, lg, s->version, reader, LOAD_TTL_MS);
        }
    }
    if (R->trainer_loaded) {
        trainer_load_name(R, g, sizeof(g));
        load_group(g, lg, sizeof(lg));
        refit_registry_lease_acquire(R->reg, lg, R->trainer_version, reader, LOAD_TTL_MS);
    }
    return REFIT_OK;
}

refit_status_t refit_relays_holds(refit_relays_t *R, const refit_tset_t *ts, const char *reader)
{
    if (!R) return REFIT_OK;
    char g[104];
    for (uint32_t j = 0; j < REFIT_MAX_RELAYS; j++) {
        relay_src_t *s = &R->src[j];
        if (!s->leased) continue;
        relay_group(R, j, g, sizeof(g));
        refit_status_t st = refit_registry_lease_holds(R->reg, g, s->version, reader, s->token);
        if (st) return refit_error(st, "relay slot %u: %s", j, refit_last_error());
        /* A relay that died during the transfer (its readers failed over)
         * cannot be read again; what was read from it was checked before
         * (and against the trainer's digests), and a dead relay writes
         * nothing more. */
        if ((st = check_stamp(ts, s, j, "after reading it")) == REFIT_ERR_PEER) {
            refit_log(REFIT_LOG_INFO, "%s: relay slot %u died during the transfer: %s", reader, j, refit_last_error());
            st = REFIT_OK;
        }
        if (st) return st;
    }
    return REFIT_OK;
}

void refit_relays_release_as(refit_relays_t *R, const char *reader)
{
    if (!R) return;
    char g[104];
    for (uint32_t j = 0; j < REFIT_MAX_RELAYS; j++) {
        relay_src_t *s = &R->src[j];
        relay_group(R, j, g, sizeof(g));
        if (s->leased) refit_registry_lease_release(R->reg, g, s->version, reader);
        if (s->loaded) drop_token(R, g, s->version, reader);
        s->leased = s->loaded = false;
    }
    if (R->trainer_loaded) {
        trainer_load_name(R, g, sizeof(g));
        drop_token(R, g, R->trainer_version, reader);
    }
    R->trainer_loaded = false;
}
