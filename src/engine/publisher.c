/* Publishers.  The first publish exposes every region through every
 * transport (descriptors go into the manifest's attributes), stores the
 * manifest and starts the heartbeat; each publish then writes one small
 * version record.  In snapshot mode two staging arenas alternate, and one is
 * reused only after the readers of the version it held are done.
 *
 * Delta mode: each buffer also has one delta arena per region, exposed as
 * region nregions + r (attribute "refit.delta" holds nregions).  publish(v)
 * encodes v against the kept copy of the previous version into the arenas of
 * v's buffer and names that base in v's record (delta_base); a delta that
 * does not fit its arena is not offered.  The arenas of a buffer are
 * rewritten only when its memory is (in-place: after the caller waited for
 * the readers; snapshot: after wait_leases on the version it held), so a
 * reader never sees a delta change under it without the record changing.
 *
 * Content digests (host memory, unless no_digest): each buffer also has a
 * digest table (data/digest.h: prefix sums of keyed row and column
 * marginals of every placement, in canonical coordinates), exposed as the
 * region after the delta arenas (attribute "refit.digest" holds its index)
 * and filled at each publish from the bytes published, under the same rule
 * as the arenas: rewritten only when its buffer's memory is.
 *
 * Version stamps (host memory): each buffer also has a stamp (engine/stamp.h),
 * the region after the digest table (attribute "refit.stamp"), that says which
 * version the buffer holds: cleared before anything in the buffer may change
 * (in place: when wait_readers returns; snapshot: before the copy), set once
 * the version, its arenas and its table are in place, before its record is
 * written; its head moves after the record is written.  Receivers compare it
 * with the record before and after they read, so an old record put back in
 * the registry never labels the bytes of another version. */
#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "data/delta_hashed.h"
#include "data/digest.h"
#include "engine/engine.h"
#include "engine/memdom.h"
#include "engine/metrics.h"
#include "engine/stamp.h"
#include "engine/test_hooks.h"
#include "refit/experimental/delta.h"
#include "verify/verify.h"

#define NBUF_SNAPSHOT 2

struct refit_publisher {
    refit_registry_t *reg;
    char *strings; /* the params' strings, copied at create (refit_strings_own) */
    char group[104];
    refit_manifest_t *m;
    refit_publisher_params_t params;
    const refit_memdom_t *dom; /* where its memory is: host, or params.device's GPU */
    refit_tset_t ts;
    refit_source_info_t info;
    uint32_t nregions;
    void **mem;                                    /* the caller's view: region bases (alloc'ed or attached) */
    int *mem_owner;                                /* transport index that allocated mem[r], or -1 */
    void *stage[NBUF_SNAPSHOT][REFIT_MAX_REGIONS]; /* snapshot staging arenas */
    int stage_owner[NBUF_SNAPSHOT][REFIT_MAX_REGIONS];
    uint64_t stage_version[NBUF_SNAPSHOT];
    uint32_t next_buffer;
    bool announced;
    uint64_t last_version;
    void *enc; /* the encoded manifest, kept to re-announce */
    size_t enc_len;
    refit_delta_encoder_t *denc;                    /* delta mode */
    void *darena[NBUF_SNAPSHOT][REFIT_MAX_REGIONS]; /* delta arenas, per buffer and region */
    int darena_owner[NBUF_SNAPSHOT][REFIT_MAX_REGIONS];
    uint64_t dcap[REFIT_MAX_REGIONS];
    refit_publish_delta_t last_delta;
    uint32_t rec_flags;       /* refit_publisher_stamp */
    refit_digest_key_t *dkey; /* content digests: NULL when off */
    uint64_t dbytes;          /* table size */
    void *dtable[NBUF_SNAPSHOT];
    int dtable_owner[NBUF_SNAPSHOT];
    struct refit_gpu_digest *gdig[NBUF_SNAPSHOT]; /* GPU memory: the table's kernels over that buffer */
    uint64_t table_version[NBUF_SNAPSHOT];        /* the version whose table dtable[b] holds (0: none) */
    /* A delta publisher's table from the encoder's changes (REFIT_DIGEST_TABLE=full: none); made at the
     * first publish, watching the encoder from then on. */
    refit_digest_changes_t *dchg;
    bool dchg_tried;
    bool dchg_watching;              /* this version's changes are noted (watch_changes) */
    double digest_ms;                /* the last version's table: filled, or updated from the changes */
    void *stamp[NBUF_SNAPSHOT];      /* version stamps (host memory only; NULL otherwise) */
    uint64_t stamped[NBUF_SNAPSHOT]; /* the version each stamp names (0: none) */
    int stamp_owner[NBUF_SNAPSHOT];
    refit_version_record_t last_rec; /* under lock */
    /* Held across "last_rec := v, write v's record" and across the heartbeat's
     * re-announce (read last_rec, write it): a re-announce never writes an
     * older record after a newer one (the stamps would then refuse every pull
     * as a replay until the next publish). */
    pthread_mutex_t rec_lock;
    bool have_rec;
    /* Fencing: the store's epoch when we last looked, and when we last saw
     * the registry lose our entries (0: never; under lock). */
    uint64_t epoch;
    double lost_at;
    /* heartbeat thread */
    pthread_t hb;
    bool hb_running, hb_stop;
    pthread_mutex_t lock;
    pthread_cond_t cond;
};

static const char *or_default(const char *s, const char *d) { return s && s[0] ? s : d; }

refit_status_t refit_publisher_create(const refit_publisher_params_t *params, refit_manifest_t *m,
                                      refit_publisher_t **out)
{
    refit_status_t st;
    const refit_publisher_params_t defaults = REFIT_PUBLISHER_PARAMS_INIT;
    refit_publisher_params_t in;
    if (!m || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_publisher_create: NULL argument");
    if ((st = refit_params_in(&in, sizeof(in), params ? params : &defaults, REFIT_PUBLISHER_PARAMS_SIZE_1,
                              "refit_publisher_params_t")))
        return st;
    if (!m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "the publisher's manifest is not finalized");
    if (m->regions.len > REFIT_MAX_REGIONS)
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "the publisher's manifest has %zu regions; at most %u (REFIT_MAX_REGIONS)",
                           (size_t)m->regions.len, REFIT_MAX_REGIONS);
    refit_publisher_t *p = calloc(1, sizeof(*p));
    if (!p) return refit_error(REFIT_ERR_NO_MEMORY, "publisher");
    p->params = in;
    if ((st = refit_memdom_for(p->params.device, &p->dom))) {
        free(p);
        return st;
    }
    if (p->params.delta && p->params.device >= 0) {
        int dev = p->params.device;
        free(p);
        return refit_error(REFIT_ERR_UNSUPPORTED, "delta refit needs host memory; this publisher's is on GPU %d", dev);
    }
    if (!p->params.delta_max_pct) p->params.delta_max_pct = 10;
    if (p->params.delta_max_pct > 100) p->params.delta_max_pct = 100;
    {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        unsigned cap = ncpu > 0 ? (unsigned)ncpu : 1;
        if (!p->params.delta_threads) p->params.delta_threads = 4;
        if (p->params.delta_threads > cap) p->params.delta_threads = cap;
    }
    if (!p->params.heartbeat_ms) p->params.heartbeat_ms = 200;
    if (!p->params.lease_ms) p->params.lease_ms = 10000;
    if (!p->params.dead_ms) p->params.dead_ms = 2000;
    if (p->params.dead_ms < 2 * p->params.heartbeat_ms) p->params.dead_ms = 2 * p->params.heartbeat_ms;
    snprintf(p->group, sizeof(p->group), "%s", or_default(p->params.group, "trainer"));
    const char **const strs[] = {&p->params.registry,   &p->params.job,         &p->params.group,
                                 &p->params.transports, &p->params.secret_file, &p->params.transport_options};
    if (refit_strings_own(strs, sizeof(strs) / sizeof(strs[0]), &p->strings)) {
        free(p);
        return refit_error(REFIT_ERR_NO_MEMORY, "publisher");
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_init(&p->rec_lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    p->nregions = (uint32_t)m->regions.len;
    p->mem = calloc(p->nregions ? p->nregions : 1, sizeof(void *));
    p->mem_owner = malloc((p->nregions ? p->nregions : 1) * sizeof(int));
    if (!p->mem || !p->mem_owner) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "publisher");
        goto err;
    }
    for (uint32_t r = 0; r < p->nregions; r++) p->mem_owner[r] = -1;
    if ((st = refit_check_name("group", p->group))) goto err;
    {
        refit_registry_auth_t auth = {p->params.secret_file, p->params.insecure};
        if ((st = refit_registry_open_auth(refit_registry_url_or_default(p->params.registry),
                                           or_default(p->params.job, "default"), &auth, &p->reg)))
            goto err;
    }
    {
        char *opts = refit_options_for_device(p->params.transport_options, p->params.device, m->rank);
        if (!opts) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "publisher");
            goto err;
        }
        st = refit_tset_open(&p->ts, refit_transports_for_device(p->params.transports, p->params.device), opts,
                             refit_registry_key(p->reg, REFIT_KEY_CONNECTION));
        free(opts);
        if (st) goto err;
    }
    if (p->params.delta) {
        refit_delta_params_t dp = {REFIT_DELTA_SPARSE, 0, p->params.delta_threads};
        if ((st = refit_delta_encoder_create(m->regions.data, p->nregions, &dp, &p->denc))) {
            refit_error_prefix("delta refit for rank %u", m->rank);
            goto err;
        }
        for (uint32_t r = 0; r < p->nregions; r++)
            p->dcap[r] = (refit_delta_table_bytes(m->regions.data[r]) +
                          m->regions.data[r] / 100 * p->params.delta_max_pct + 4095) &
                         ~(uint64_t)4095;
    }
    /* Content digests: of host memory with the CPU's kernels, of GPU memory
     * with the GPU's (transport/cuda/digest.cu, the same values; the table
     * then lives in GPU memory too).  A library without CUDA has no GPU
     * publishers. */
    if (!p->params.no_digest && refit_digest_table_bytes(m) &&
        (st = refit_digest_key_create(refit_registry_key(p->reg, REFIT_KEY_DIGEST), &p->dkey)))
        goto err;
    if (p->dkey) p->dbytes = refit_digest_table_bytes(m);
    p->info.incarnation = refit_random_u64();
    p->info.pid = (uint32_t)getpid();
    refit_hostname(p->info.host, sizeof(p->info.host));
    p->m = m;
    *out = p;
    return REFIT_OK;
err:
    p->m = NULL; /* the caller keeps the manifest on failure */
    refit_publisher_destroy(p);
    return st;
}

/* Whether transport i can expose this publisher's memory (GPU or host). */
static bool can_expose(const refit_publisher_t *p, uint32_t i)
{
    unsigned caps = refit_transport_caps(p->ts.ops[i]);
    return p->params.device >= 0 ? (caps & REFIT_TCAP_DEVICE_SRC) != 0 : (caps & REFIT_TCAP_HOST_SRC) != 0;
}

static refit_status_t alloc_with(refit_publisher_t *p, uint64_t size, void **base, int *owner)
{
    for (uint32_t i = 0; i < p->ts.n; i++)
        if (p->ts.ops[i]->alloc && can_expose(p, i)) {
            *owner = (int)i;
            return p->ts.ops[i]->alloc(p->ts.ctx[i], size, base);
        }
    *owner = -1;
    if (p->params.device >= 0)
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "GPU memory (device %d) needs a transport that exposes it (cuda_ipc); transports here: %s",
                           p->params.device, p->params.transports ? p->params.transports : "the defaults");
    void *mem = NULL;
    if (posix_memalign(&mem, 4096, size ? size : 1)) return refit_error(REFIT_ERR_NO_MEMORY, "%" PRIu64 " bytes", size);
    memset(mem, 0, size);
    *base = mem;
    return REFIT_OK;
}

static void note_change(void *ctx, unsigned worker, uint32_t region, uint64_t off, uint64_t len, const uint16_t *units,
                        uint32_t n, const void *now, const void *before)
{
    /* a failure shows at the apply */
    if (units) (void)refit_digest_changes_note_units(ctx, worker, region, off, units, n, now, before);
    else (void)refit_digest_changes_note(ctx, worker, region, off, len, now, before);
}

/* Above this share of changed units (per mille, of the last version) a delta publisher fills its next table.
 * The notes cost 5-7 ns a changed unit, a fill about a memcpy of the shard: the table from the changes cost about
 * 0.5 x a memcpy at 1%, 0.8 x at 2%, 1.2-1.3 x at 4%, a fill 0.95-1.15 x (bench_digest_notes, one rank of the
 * benchmark's delta scenario, one thread, 2026-12-08; docs/digest.md). */
#define DIGEST_CHANGES_MAX_PERMILLE 30

/* A delta publisher of host memory watches its encoder's changes from its first publish on, so that each
 * table after the first is the one before plus what changed (docs/digest.md); off with REFIT_DIGEST_TABLE=full,
 * or when the sums cannot be made (then every table is filled, as without delta).  A version that follows one
 * which changed more than DIGEST_CHANGES_MAX_PERMILLE per mille of its units is not watched: its table is filled. */
static void watch_changes(refit_publisher_t *p)
{
    if (!p->dchg_tried && p->denc && p->dkey && p->params.device < 0) {
        p->dchg_tried = true;
        const char *how = refit_diag()->digest_table;
        if (how && !strcmp(how, "full")) return;
        if (refit_digest_changes_create(p->dkey, p->m, &p->dchg)) {
            refit_log(REFIT_LOG_WARN, "rank %u: digest tables are filled in full: %s", p->m->rank, refit_last_error());
            return;
        }
    }
    if (!p->dchg) return;
    const refit_publish_delta_t *d = &p->last_delta;
    bool many = d->version && d->region_bytes &&
                d->changed_units * 2 * 1000 > d->region_bytes * (uint64_t)DIGEST_CHANGES_MAX_PERMILLE;
    p->dchg_watching = !many;
    refit_delta_encoder_watch(p->denc, many ? NULL : note_change, many ? NULL : p->dchg);
}

/* Buffer b's table for `version` from the table of `base` plus the changes the encoder noted while it went from
 * base to version; false (sums dropped) when it did not, no buffer holds base's table, or the apply failed: the
 * caller fills the table. */
static bool table_from_changes(refit_publisher_t *p, uint32_t b, uint64_t base, uint64_t version)
{
    if (!p->dchg) return false;
    if (!p->dchg_watching) { /* nothing was noted; nothing older may stay */
        refit_digest_changes_reset(p->dchg);
        return false;
    }
    int from = -1;
    for (uint32_t k = 0; k < NBUF_SNAPSHOT && base; k++)
        if (p->table_version[k] == base) from = (int)k;
    if (from < 0 || refit_delta_encoder_version(p->denc) != version) {
        refit_digest_changes_reset(p->dchg);
        return false;
    }
    if ((uint32_t)from != b) memcpy(p->dtable[b], p->dtable[from], p->dbytes);
    refit_status_t st = refit_digest_changes_apply(p->dchg, p->dtable[b]);
    if (st)
        refit_log(REFIT_LOG_WARN, "rank %u: the digest table of version %" PRIu64 " is filled in full: %s", p->m->rank,
                  version, refit_last_error());
    return !st;
}

/* The digest table of buffer b from the memory src holds: the CPU's pass, or the GPU's kernels (their
 * work list built at the buffer's first version: the addresses do not change). */
static refit_status_t fill_table(refit_publisher_t *p, uint32_t b, void *const *src)
{
    if (p->params.device < 0)
        return refit_digest_table_fill(p->dkey, p->m, (const void *const *)src, p->dtable[b], p->params.delta_threads);
#ifdef REFIT_HAVE_CUDA
    refit_status_t st;
    refit_gpu_digest_t *g = p->gdig[b];
    if (!g && (st = refit_gpu_digest_create(p->params.device, p->dkey, p->m, src, true, &g))) return st;
    p->gdig[b] = g;
    return refit_gpu_digest_table_run(g, p->dtable[b]);
#else
    return refit_error(REFIT_ERR_UNSUPPORTED, "digests of GPU memory need a refit built with CUDA");
#endif
}

static void free_with(refit_publisher_t *p, void *base, uint64_t size, int owner)
{
    if (!base) return;
    if (owner >= 0) p->ts.ops[owner]->free(p->ts.ctx[owner], base, size);
    else free(base);
}

refit_status_t refit_publisher_alloc(refit_publisher_t *p, uint32_t region, void **base)
{
    if (!p || !base || region >= p->nregions)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_publisher_alloc: bad region %u", region);
    if (p->mem[region]) return refit_error(REFIT_ERR_INVALID_ARG, "region %u already has memory", region);
    refit_status_t st = alloc_with(p, p->m->regions.data[region], &p->mem[region], &p->mem_owner[region]);
    if (st) p->mem[region] = NULL;
    else *base = p->mem[region];
    return st;
}

refit_status_t refit_publisher_attach(refit_publisher_t *p, uint32_t region, void *base)
{
    if (!p || !base || region >= p->nregions)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_publisher_attach: bad region %u", region);
    if (p->mem[region]) return refit_error(REFIT_ERR_INVALID_ARG, "region %u already has memory", region);
    if (p->announced) return refit_error(REFIT_ERR_INVALID_ARG, "memory cannot change after the first publish");
    p->mem[region] = base;
    p->mem_owner[region] = -2; /* the caller's */
    return REFIT_OK;
}

/* After the registry failed (e.g. a Redis restart that lost its data), the
 * manifest and the last record are written again. */
static refit_status_t reannounce(refit_publisher_t *p)
{
    refit_status_t st = refit_registry_put_manifest(p->reg, p->group, p->m->rank, p->enc, p->enc_len);
    pthread_mutex_lock(&p->rec_lock);
    pthread_mutex_lock(&p->lock);
    refit_version_record_t rec = p->last_rec;
    bool have = p->have_rec;
    pthread_mutex_unlock(&p->lock);
    if (!st && have) st = refit_registry_publish(p->reg, p->group, p->m->rank, &rec);
    pthread_mutex_unlock(&p->rec_lock);
    return st;
}

static void *heartbeat_main(void *arg)
{
    refit_publisher_t *p = arg;
    bool lost = false;
    pthread_mutex_lock(&p->lock);
    while (!p->hb_stop) {
        pthread_mutex_unlock(&p->lock);
        bool absent = false;
        refit_status_t st = refit_registry_beat(p->reg, p->group, p->m->rank, &p->info, p->params.dead_ms, &absent);
        if (!st && absent) {
            /* Our entry was gone: the store lost its data (its epoch
             * changed, or cannot be read), and leases may have vanished with
             * it; or this beat came later than dead_ms (a process starved of
             * CPU) and the entry expired, which says nothing about leases:
             * fencing then held up the next version for a lease lifetime
             * (10 s) on a busy host. */
            uint64_t e = 0;
            bool same = !refit_registry_epoch(p->reg, &e, NULL);
            pthread_mutex_lock(&p->lock);
            same = same && e == p->epoch;
            if (!same) p->lost_at = refit_now();
            pthread_mutex_unlock(&p->lock);
            refit_log(same ? REFIT_LOG_INFO : REFIT_LOG_WARN, "rank %u of %s: heartbeat entry was gone: %s", p->m->rank,
                      p->group,
                      same ? "it expired (this beat came later than dead_ms); same store"
                           : "the store lost its data; leases are trusted again after a lease lifetime");
        }
        if (!st && (lost || absent) && !(st = reannounce(p))) {
            refit_log(REFIT_LOG_INFO, "rank %u: registry is back; manifest and record written again", p->m->rank);
            lost = false;
        }
        if (st) {
            lost = true;
            refit_log(REFIT_LOG_WARN, "rank %u heartbeat: %s", p->m->rank, refit_last_error());
        }
        pthread_mutex_lock(&p->lock);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)p->params.heartbeat_ms * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        while (!p->hb_stop && pthread_cond_timedwait(&p->cond, &p->lock, &ts) == 0) {
        }
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* First publish: stage buffers, expose, store the manifest, start the heartbeat. */
static refit_status_t announce(refit_publisher_t *p)
{
    refit_status_t st;
    uint32_t nbuf = p->params.mode == REFIT_MODE_SNAPSHOT ? NBUF_SNAPSHOT : 1;
    void *enc = NULL;
    size_t enc_len = 0;
    for (uint32_t b = 0; b < nbuf && p->params.mode == REFIT_MODE_SNAPSHOT; b++)
        for (uint32_t r = 0; r < p->nregions; r++)
            if (!p->stage[b][r] && (st = alloc_with(p, p->m->regions.data[r], &p->stage[b][r], &p->stage_owner[b][r])))
                return st;
    for (uint32_t b = 0; b < nbuf && p->denc; b++)
        for (uint32_t r = 0; r < p->nregions; r++)
            if (!p->darena[b][r] && (st = alloc_with(p, p->dcap[r], &p->darena[b][r], &p->darena_owner[b][r])))
                return st;
    for (uint32_t b = 0; b < nbuf && p->dkey; b++)
        if (!p->dtable[b] && (st = alloc_with(p, p->dbytes, &p->dtable[b], &p->dtable_owner[b]))) return st;
    for (uint32_t b = 0; b < nbuf && p->params.device < 0; b++) {
        if (!p->stamp[b] && (st = alloc_with(p, REFIT_STAMP_BYTES, &p->stamp[b], &p->stamp_owner[b]))) return st;
        refit_stamp_init(p->stamp[b], p->info.incarnation, p->m->signature, b);
    }
    uint32_t exposing = 0;
    for (uint32_t t = 0; t < p->ts.n; t++) exposing += can_expose(p, t);
    uint32_t dreg = p->nregions + (p->denc ? p->nregions : 0); /* the digest table's index */
    uint32_t sreg = dreg + (p->dkey ? 1 : 0);                  /* the stamp's */
    if (!exposing)
        return refit_error(REFIT_ERR_INVALID_ARG, "none of the transports exposes %s memory",
                           p->params.device >= 0 ? "GPU" : "host");
    for (uint32_t t = 0; t < p->ts.n; t++)
        for (uint32_t b = 0; b < nbuf && can_expose(p, t); b++)
            for (uint32_t r = 0; r < p->nregions; r++) {
                void *base = p->params.mode == REFIT_MODE_SNAPSHOT ? p->stage[b][r] : p->mem[r];
                void *desc;
                size_t len;
                char key[96];
                if ((st = p->ts.ops[t]->expose(p->ts.ctx[t], base, p->m->regions.data[r], &desc, &len))) return st;
                refit_desc_key(key, sizeof(key), p->ts.ops[t]->name, r, b);
                st = refit_manifest_set_attr(p->m, key, desc, len);
                free(desc);
                if (st) return st;
                if (!p->denc) continue;
                if ((st = p->ts.ops[t]->expose(p->ts.ctx[t], p->darena[b][r], p->dcap[r], &desc, &len))) return st;
                refit_desc_key(key, sizeof(key), p->ts.ops[t]->name, p->nregions + r, b);
                st = refit_manifest_set_attr(p->m, key, desc, len);
                free(desc);
                if (st) return st;
            }
    for (uint32_t t = 0; t < p->ts.n && p->dkey; t++)
        for (uint32_t b = 0; b < nbuf && can_expose(p, t); b++) {
            void *desc;
            size_t len;
            char key[96];
            if ((st = p->ts.ops[t]->expose(p->ts.ctx[t], p->dtable[b], p->dbytes, &desc, &len))) return st;
            refit_desc_key(key, sizeof(key), p->ts.ops[t]->name, dreg, b);
            st = refit_manifest_set_attr(p->m, key, desc, len);
            free(desc);
            if (st) return st;
        }
    for (uint32_t t = 0; t < p->ts.n && p->stamp[0]; t++)
        for (uint32_t b = 0; b < nbuf && can_expose(p, t); b++) {
            void *desc;
            size_t len;
            char key[96];
            if ((st = p->ts.ops[t]->expose(p->ts.ctx[t], p->stamp[b], REFIT_STAMP_BYTES, &desc, &len))) return st;
            refit_desc_key(key, sizeof(key), p->ts.ops[t]->name, sreg, b);
            st = refit_manifest_set_attr(p->m, key, desc, len);
            free(desc);
            if (st) return st;
        }
    if (p->dkey && (st = refit_manifest_set_attr(p->m, "refit.digest", &dreg, sizeof(dreg)))) return st;
    if (p->stamp[0] && (st = refit_manifest_set_attr(p->m, "refit.stamp", &sreg, sizeof(sreg)))) return st;
    if (p->denc && (st = refit_manifest_set_attr(p->m, "refit.delta", &p->nregions, sizeof(p->nregions)))) return st;
    uint32_t nb = nbuf;
    if ((st = refit_manifest_set_attr(p->m, "refit.buffers", &nb, sizeof(nb)))) return st;
    if ((st = refit_manifest_encode(p->m, &enc, &enc_len))) return st;
    p->enc = enc;
    p->enc_len = enc_len;
    if ((st = refit_registry_epoch(p->reg, &p->epoch, NULL))) return st;
    if ((st = refit_registry_put_manifest(p->reg, p->group, p->m->rank, enc, enc_len))) return st;
    if ((st = refit_registry_heartbeat(p->reg, p->group, p->m->rank, &p->info, p->params.dead_ms))) return st;
    if (pthread_create(&p->hb, NULL, heartbeat_main, p) != 0)
        return refit_error(REFIT_ERR_NO_MEMORY, "starting the heartbeat thread");
    p->hb_running = true;
    p->announced = true;
    return REFIT_OK;
}

/* Whether the store lost its data since we last looked (its epoch changed):
 * then leases may have vanished with it, and the version's retired marker
 * too, which is written again. */
static refit_status_t check_epoch(refit_publisher_t *p, uint64_t version)
{
    uint64_t e = 0;
    refit_status_t st = refit_registry_epoch(p->reg, &e, NULL);
    if (st) return st;
    pthread_mutex_lock(&p->lock); /* the heartbeat thread reads it */
    uint64_t was = p->epoch;
    p->epoch = e;
    pthread_mutex_unlock(&p->lock);
    if (e == was || was == 0) return REFIT_OK;
    refit_log(REFIT_LOG_WARN,
              "rank %u of %s: the registry lost its data (epoch %016" PRIx64 " -> %016" PRIx64
              "); leases on version %" PRIu64 " are trusted again after %u ms",
              p->m->rank, p->group, was, e, version, p->params.lease_ms);
    pthread_mutex_lock(&p->lock);
    p->lost_at = refit_now();
    pthread_mutex_unlock(&p->lock);
    return refit_registry_retire(p->reg, p->group, version);
}

/* Retires `version` and waits until no reader holds it.  "No lease" is
 * believed only when the registry has not lost its data within the last
 * lease lifetime: a reader whose lease vanished with the data may still be
 * reading (it finds out at its next renewal, or when it checks its lease
 * before committing, and then discards what it read).  A wait fences once,
 * for the first loss it sees: a store that keeps losing its data (an epoch
 * key deleted every few ms) fenced every wait to its timeout before, and
 * what protects a reader is its own check. */
static refit_status_t wait_leases(refit_publisher_t *p, uint64_t version, int timeout_ms)
{
    refit_status_t st;
    if ((st = check_epoch(p, version))) return st;
    if ((st = refit_registry_retire(p->reg, p->group, version))) return st;
    double deadline = refit_now() + timeout_ms / 1e3, before = -1, fence_from = 0;
    bool said = false;
    for (;;) {
        uint32_t n = 0;
        if ((st = refit_registry_lease_count(p->reg, p->group, version, &n))) return st;
        if (n == 0 && (st = check_epoch(p, version))) return st;
        pthread_mutex_lock(&p->lock);
        double lost = p->lost_at;
        pthread_mutex_unlock(&p->lock);
        if (before < 0) before = lost && refit_now() - lost < p->params.lease_ms / 1e3 ? 0 : lost;
        if (!fence_from && lost != before) fence_from = lost;
        double since_loss = fence_from ? refit_now() - fence_from : 1e30;
        bool fenced = since_loss < p->params.lease_ms / 1e3;
        if (n == 0 && !fenced) return REFIT_OK;
        if (n == 0 && !said) {
            refit_log(REFIT_LOG_INFO,
                      "rank %u: no lease on version %" PRIu64 ", but the registry lost its data %.0f ms "
                      "ago: waiting out a lease lifetime (%u ms)",
                      p->m->rank, version, since_loss * 1e3, p->params.lease_ms);
            said = true;
        }
        double left = deadline - refit_now();
        if (left <= 0) {
            if (n == 0)
                return refit_error(REFIT_ERR_TIMEOUT,
                                   "version %" PRIu64 ": the registry lost its data %.0f ms ago, and a reader whose "
                                   "lease vanished with it may still read for up to %u ms (lease_ms); waited %d ms",
                                   version, since_loss * 1e3, p->params.lease_ms, timeout_ms);
            return refit_error(REFIT_ERR_TIMEOUT, "%u reader(s) still hold version %" PRIu64 " after %d ms", n, version,
                               timeout_ms);
        }
        /* A release is a registry change; an expiry is not, so wake up now and then. */
        int slice = (int)(left * 1e3) < 100 ? (int)(left * 1e3) + 1 : 100;
        st = refit_registry_wait(p->reg, slice);
        if (st && st != REFIT_ERR_TIMEOUT) return st;
    }
}

/* Fault injection for the test suite: swaps the first two indices of every
 * sparse chunk in buffer b's arenas, which a receiver must refuse while
 * applying (indices must ascend) and then pull in full. */
static void corrupt_for_test(refit_publisher_t *p, uint32_t b)
{
    for (uint32_t r = 0; r < p->nregions; r++) {
        unsigned char *a = p->darena[b][r];
        uint64_t nch = (refit_delta_table_bytes(p->m->regions.data[r]) - 64) / 16;
        for (uint64_t c = 0; c < nch; c++) {
            unsigned char *e = a + 64 + c * 16;
            uint64_t off;
            uint32_t count, kind;
            memcpy(&off, e, 8);
            memcpy(&count, e + 8, 4);
            memcpy(&kind, e + 12, 4);
            if (kind != 1 || count < 2) continue; /* sparse, two changes at least */
            uint16_t i0, i1;
            memcpy(&i0, a + off, 2);
            memcpy(&i1, a + off + 2, 2);
            memcpy(a + off, &i1, 2);
            memcpy(a + off + 2, &i0, 2);
        }
    }
}

/* Encodes `version` (in p->mem) against the kept copy into buffer b's delta
 * arenas; returns the base it offers (0: none). */
static uint64_t offer_delta(refit_publisher_t *p, uint32_t b, uint64_t version)
{
    uint64_t base = refit_delta_encoder_version(p->denc);
    void *deltas[REFIT_MAX_REGIONS] = {0};
    size_t lens[REFIT_MAX_REGIONS] = {0};
    refit_publish_delta_t *ld = &p->last_delta;
    memset(ld, 0, sizeof(*ld));
    ld->version = version;
    double t0 = refit_now();
    /* The arenas' old deltas name another version: they stop passing as this one's. */
    for (uint32_t r = 0; r < p->nregions; r++) memset(p->darena[b][r], 0, 64);
    refit_status_t st = refit_delta_encoder_publish(p->denc, (const void *const *)p->mem, version, deltas, lens);
    bool fits = !st && base;
    for (uint32_t r = 0; r < p->nregions; r++) {
        fits = fits && deltas[r] && lens[r] <= p->dcap[r];
        ld->bytes += lens[r];
        ld->region_bytes += p->m->regions.data[r];
        refit_delta_info_t info = REFIT_DELTA_INFO_INIT;
        if (deltas[r] && !refit_delta_info(deltas[r], lens[r], &info)) ld->changed_units += info.changed_units;
    }
    /* Payloads first, headers last: a header names the version only once its bytes are in place. */
    for (uint32_t r = 0; r < p->nregions && fits; r++)
        memcpy((char *)p->darena[b][r] + 64, (char *)deltas[r] + 64, lens[r] - 64);
    if (fits && refit_test_corrupt_delta()) corrupt_for_test(p, b);
    for (uint32_t r = 0; r < p->nregions && fits; r++) memcpy(p->darena[b][r], deltas[r], 64);
    for (uint32_t r = 0; r < p->nregions; r++) free(deltas[r]);
    ld->encode_ms = (refit_now() - t0) * 1e3;
    if (st)
        refit_log(REFIT_LOG_WARN, "rank %u: version %" PRIu64 " is offered in full only: %s", p->m->rank, version,
                  refit_last_error());
    else if (base && !fits)
        refit_log(REFIT_LOG_INFO,
                  "rank %u: the delta of version %" PRIu64 " (%" PRIu64 " bytes) exceeds %u%% of the "
                  "regions; offered in full only",
                  p->m->rank, version, ld->bytes, p->params.delta_max_pct);
    ld->base_version = fits ? base : 0;
    return ld->base_version;
}

void refit_publisher_stamp(refit_publisher_t *p, uint32_t flags)
{
    if (p) p->rec_flags = flags;
}

void refit_publisher_notify(refit_publisher_t *p)
{
    for (uint32_t i = 0; p && i < p->ts.n; i++) {
        const refit_transport_wait_t *w = refit_transport_wait(p->ts.ops[i]); /* only conditional pulls wait */
        if (w && p->ts.ctx[i]) w->notify(p->ts.ctx[i]);
    }
}

double refit_publisher_digest_ms(const refit_publisher_t *p) { return p ? p->digest_ms : 0; }

refit_status_t refit_publisher_last_delta(const refit_publisher_t *p, refit_publish_delta_t *out)
{
    if (!p || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_publisher_last_delta: NULL argument");
    refit_status_t st = refit_out_check(out->size, REFIT_END_OF(refit_publish_delta_t, encode_ms),
                                        "refit_publish_delta_t");
    if (st) return st;
    if (!p->denc) return refit_error(REFIT_ERR_INVALID_ARG, "this publisher was not created with delta");
    refit_out_write(out, out->size, &p->last_delta, sizeof(p->last_delta));
    return REFIT_OK;
}

static refit_status_t publish_version(refit_publisher_t *p, uint64_t version)
{
    refit_status_t st;
    if (version == 0 || version == REFIT_VERSION_NEWEST || version <= p->last_version)
        return refit_error(REFIT_ERR_INVALID_ARG, "version %" PRIu64 " is not after the last published %" PRIu64,
                           version, p->last_version);
    for (uint32_t r = 0; r < p->nregions; r++)
        if (!p->mem[r]) return refit_error(REFIT_ERR_INVALID_ARG, "region %u has no memory (alloc or attach it)", r);
    if (!p->announced && (st = announce(p))) return st;
    refit_version_record_t rec = {
        .version = version, .signature = p->m->signature, .incarnation = p->info.incarnation, .flags = p->rec_flags};
    if (p->params.mode == REFIT_MODE_SNAPSHOT) {
        uint32_t b = p->next_buffer;
        /* Readers get dead_ms * 4; after a registry that lost its data, a lease lifetime more (wait_leases). */
        if (p->stage_version[b] &&
            (st = wait_leases(p, p->stage_version[b], (int)(p->params.dead_ms * 4 + p->params.lease_ms))))
            return st;
        refit_publisher_rewriting(p, b); /* readers of what it held commit nothing from here on */
        for (uint32_t r = 0; r < p->nregions; r++) {
            if ((st = p->dom->copy(p->stage[b][r], p->mem[r], p->m->regions.data[r]))) return st;
        }
        p->stage_version[b] = version;
        p->next_buffer = (b + 1) % NBUF_SNAPSHOT;
        rec.buffer = b;
    } else refit_publisher_rewriting(p, 0); /* already so when the caller waited for its readers */
    uint64_t base = p->denc ? refit_delta_encoder_version(p->denc) : 0;
    watch_changes(p);
    if (p->denc) rec.delta_base = offer_delta(p, rec.buffer, version);
    if (p->dkey) {
        double t0 = refit_now();
        void *const *src = p->params.mode == REFIT_MODE_SNAPSHOT ? p->stage[rec.buffer] : p->mem;
        bool updated = table_from_changes(p, rec.buffer, base, version);
        if (!updated) {
            p->table_version[rec.buffer] = 0; /* until the fill is done */
            if ((st = fill_table(p, rec.buffer, src))) {
                refit_error_prefix("rank %u, digests of version %" PRIu64, p->m->rank, version);
                return st;
            }
        }
        p->table_version[rec.buffer] = version;
        p->digest_ms = (refit_now() - t0) * 1e3;
        p->last_delta.table_from_delta = updated;
    }
    if (p->stamp[rec.buffer]) refit_stamp_set_version(p->stamp[rec.buffer], version);
    p->stamped[rec.buffer] = version;
    pthread_mutex_lock(&p->rec_lock);
    pthread_mutex_lock(&p->lock);
    p->last_rec = rec;
    p->have_rec = true;
    pthread_mutex_unlock(&p->lock);
    st = refit_registry_publish(p->reg, p->group, p->m->rank, &rec);
    pthread_mutex_unlock(&p->rec_lock);
    if (st) return st;
    p->last_version = version;
    for (uint32_t b = 0; b < NBUF_SNAPSHOT; b++)
        if (p->stamp[b]) refit_stamp_set_head(p->stamp[b], version);
    return REFIT_OK;
}

/* publish_version, counted once in the process's metrics (metrics.c). */
refit_status_t refit_publisher_publish(refit_publisher_t *p, uint64_t version)
{
    if (!p) return refit_error(REFIT_ERR_INVALID_ARG, "publisher is NULL");
    double t0 = refit_now();
    refit_status_t st = publish_version(p, version);
    refit_metrics_publish(p->params.job, p->group, p->m, st, version, refit_now() - t0, p->digest_ms,
                          p->denc ? &p->last_delta : NULL);
    return st;
}

refit_status_t refit_publisher_wait_readers(refit_publisher_t *p, uint64_t version, int timeout_ms)
{
    if (!p) return refit_error(REFIT_ERR_INVALID_ARG, "publisher is NULL");
    refit_status_t st = wait_leases(p, version, timeout_ms);
    /* In place, the caller rewrites its memory next: from now on no reader
     * may commit what it reads there (a reader whose lease vanished from the
     * registry sees the cleared stamp). */
    if (!st && p->params.mode != REFIT_MODE_SNAPSHOT && p->stamped[0] && version >= p->stamped[0])
        refit_publisher_rewriting(p, 0);
    return st;
}

void refit_publisher_rewriting(refit_publisher_t *p, uint32_t buffer)
{
    if (!p || buffer >= NBUF_SNAPSHOT) return;
    if (p->stamp[buffer]) refit_stamp_set_version(p->stamp[buffer], 0);
    p->stamped[buffer] = 0;
}

refit_status_t refit_publisher_wait_acks(refit_publisher_t *p, uint64_t version, uint32_t n, int timeout_ms)
{
    refit_status_t st;
    if (!p) return refit_error(REFIT_ERR_INVALID_ARG, "publisher is NULL");
    /* Polls every 10 ms rather than waking on every registry change: a group's
     * publishers would otherwise all wake at every heartbeat, lease and
     * publish, and compete with the receivers' discovery for the registry and
     * the CPUs.  Acks are a driver's convenience, on no receiver's path. */
    double deadline = refit_now() + timeout_ms / 1e3;
    for (;;) {
        uint32_t have = 0;
        if ((st = refit_registry_acks(p->reg, p->group, version, &have))) return st;
        if (have >= n) return REFIT_OK;
        if (refit_now() > deadline)
            return refit_error(REFIT_ERR_TIMEOUT, "%u of %u receivers committed version %" PRIu64 " within %d ms", have,
                               n, version, timeout_ms);
        usleep(10000);
    }
}

void refit_publisher_destroy(refit_publisher_t *p)
{
    if (!p) return;
    if (p->hb_running) {
        pthread_mutex_lock(&p->lock);
        p->hb_stop = true;
        pthread_cond_signal(&p->cond);
        pthread_mutex_unlock(&p->lock);
        pthread_join(p->hb, NULL);
    }
    if (p->reg && p->announced) refit_registry_remove_source(p->reg, p->group, p->m->rank);
    for (uint32_t b = 0; p->m && b < NBUF_SNAPSHOT; b++) {
        free_with(p, p->dtable[b], p->dbytes, p->dtable_owner[b]);
        free_with(p, p->stamp[b], REFIT_STAMP_BYTES, p->stamp_owner[b]);
    }
#ifdef REFIT_HAVE_CUDA
    for (uint32_t b = 0; b < NBUF_SNAPSHOT; b++) refit_gpu_digest_destroy(p->gdig[b]);
#endif
    refit_digest_changes_destroy(p->dchg);
    refit_digest_key_destroy(p->dkey);
    for (uint32_t b = 0; p->m && b < NBUF_SNAPSHOT; b++)
        for (uint32_t r = 0; r < p->nregions && r < 64; r++) {
            free_with(p, p->stage[b][r], p->m->regions.data[r], p->stage_owner[b][r]);
            free_with(p, p->darena[b][r], p->dcap[r], p->darena_owner[b][r]);
        }
    refit_delta_encoder_destroy(p->denc);
    /* Memory from refit_publisher_alloc is ours; attached memory is the caller's. */
    for (uint32_t r = 0; p->m && p->mem && p->mem_owner && r < p->nregions; r++)
        if (p->mem_owner[r] != -2) free_with(p, p->mem[r], p->m->regions.data[r], p->mem_owner[r]);
    refit_tset_close(&p->ts);
    refit_registry_close(p->reg);
    refit_manifest_destroy(p->m);
    free(p->enc);
    free(p->mem);
    free(p->mem_owner);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->rec_lock);
    pthread_cond_destroy(&p->cond);
    free(p->strings);
    free(p);
}
