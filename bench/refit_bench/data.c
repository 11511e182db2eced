/* refit bench scenarios: delta, partial, fp8 (fleet data features).
 *
 * Each runs on one host with processes and shared memory: publisher
 * processes hold the source ranks' memory in shared mappings (what the shm
 * transport reads, zero copy), receiver processes plan once and pull from
 * those mappings.  Parent and children talk over pipes; results come back in
 * a shared control block.  Prints one JSON object
 * {"scenario":..,"metrics":{..},"assertions":[..]} and writes it to --out.
 * Exit status 0 when every assertion passed, 3 when one failed. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "tool_proc.h"

#define MAXR 16
#define MAXV 32

/* ---- options, JSON ---- */

typedef struct {
    const char *model, *src, *dst, *out, *format, *select;
    double fraction;
    uint64_t versions;
    unsigned threads;
} bopts_t;

static int parse_opts(int argc, char **argv, bopts_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--scenario") || !strncmp(a, "--scenario=", 11)) {
            if (!strchr(a, '=')) i++;
            continue;
        }
        if (!v) return tool_usage("bench", "an option is missing its value");
        if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--src")) o->src = v;
        else if (!strcmp(a, "--dst")) o->dst = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--format")) o->format = v;
        else if (!strcmp(a, "--select")) o->select = v;
        else if (!strcmp(a, "--fraction")) o->fraction = strtod(v, NULL);
        else if (!strcmp(a, "--versions")) {
            if (tool_parse_u64(v, &o->versions) || o->versions < 2 || o->versions > MAXV - 2)
                return tool_usage("bench", "--versions is 2..30");
        } else if (!strcmp(a, "--threads")) o->threads = (unsigned)strtoul(v, NULL, 10);
        else return tool_usage("bench", "options: --model --src --dst --fraction --versions --format --select --threads --out");
        i++;
    }
    return 0;
}

typedef struct {
    char *buf;
    size_t len, cap;
    int failed;
    int nassert;
} jout_t;

static void jp(jout_t *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jp(jout_t *j, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(j->buf ? j->buf + j->len : NULL, j->buf ? j->cap - j->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (j->buf && j->len + (size_t)n < j->cap) {
            j->len += (size_t)n;
            return;
        }
        size_t cap = j->cap ? j->cap * 2 : 65536;
        while (cap < j->len + (size_t)n + 1) cap *= 2;
        char *nb = realloc(j->buf, cap);
        if (!nb) return;
        j->buf = nb;
        j->cap = cap;
    }
}

static void jassert(jout_t *j, const char *name, const char *expected, const char *observed, bool passed)
{
    jp(j, "%s{\"name\":\"%s\",\"expected\":\"%s\",\"observed\":\"%s\",\"passed\":%s}", j->nassert++ ? "," : "", name,
       expected, observed, passed ? "true" : "false");
    if (!passed) j->failed = 1;
}

static int jfinish(jout_t *j, const char *out)
{
    jp(j, "]}\n");
    refit_status_t st = tool_report_write(j->buf, out);
    free(j->buf);
    if (st) return tool_fail(st, "bench");
    return j->failed ? 3 : 0;
}

static void *shmap(size_t n)
{
    void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
    if (!n) return 0;
    double t[MAXV];
    memcpy(t, v, n * sizeof(double));
    qsort(t, n, sizeof(double), cmp_double);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* ---- children: a command pipe in, a status pipe out ---- */

/* A child (tools/common/tool_proc.h): to_child carries uint64_t commands
 * (0: exit), from_child one status byte per command. */
typedef tool_proc_t child_t;

typedef int (*child_fn)(void *ctx, uint32_t rank, uint64_t cmd);

typedef struct {
    child_fn fn;
    void *ctx;
    uint32_t rank;
} child_body_t;

static int child_loop(void *vb, int in, int out)
{
    const child_body_t *b = vb;
    for (;;) {
        uint64_t cmd;
        if (read(in, &cmd, sizeof cmd) != (ssize_t)sizeof cmd || cmd == 0) return 0;
        char rc = (char)b->fn(b->ctx, b->rank, cmd);
        if (write(out, &rc, 1) != 1) return 1;
    }
}

static int spawn(child_t *c, child_fn fn, void *ctx, uint32_t rank)
{
    /* Failing to start a process ends the bench (children already started
     * see their command pipe close and exit). */
    child_body_t body = {fn, ctx, rank};
    if (tool_proc_fork(c, child_loop, &body, false))
        exit(tool_fail(refit_error(REFIT_ERR_IO, "fork: %s", strerror(errno)), "bench"));
    return 0;
}

/* Sends cmd to children [0, n) at once and waits for all; non-zero if any failed. */
static int round_all(child_t *c, uint32_t n, const uint64_t *cmds)
{
    int bad = 0;
    for (uint32_t i = 0; i < n; i++)
        if (cmds[i] && write(c[i].to_child, &cmds[i], sizeof(uint64_t)) != (ssize_t)sizeof(uint64_t)) bad = 1;
    for (uint32_t i = 0; i < n; i++) {
        char rc = 1;
        if (cmds[i] && (read(c[i].from_child, &rc, 1) != 1 || rc)) bad = 1;
    }
    return bad;
}

static void stop_all(child_t *c, uint32_t n)
{
    uint64_t z = 0;
    for (uint32_t i = 0; i < n; i++) tool_proc_stop(&c[i], &z, sizeof z, false, 30);
}

/* ---- common setup: model, manifests of both layouts ---- */

typedef struct {
    refit_model_t *model;
    refit_layout_t *sl, *dl;
    uint32_t ns, nd;
    refit_manifest_t *src[MAXR], *dst[MAXR];
} setup_t;

static refit_status_t setup(setup_t *s, const bopts_t *o)
{
    memset(s, 0, sizeof(*s));
    refit_status_t st;
    if ((st = refit_model_open(o->model, &s->model)) || (st = refit_layout_parse(o->src, &s->sl)) ||
        (st = refit_layout_parse(o->dst, &s->dl)))
        return st;
    s->ns = refit_layout_world(s->sl);
    s->nd = refit_layout_world(s->dl);
    if (s->ns > MAXR || s->nd > MAXR) return refit_error(REFIT_ERR_INVALID_ARG, "at most %d ranks a side here", MAXR);
    for (uint32_t r = 0; r < s->ns; r++)
        if ((st = refit_layout_manifest(s->sl, s->model, r, &s->src[r]))) return st;
    for (uint32_t r = 0; r < s->nd; r++)
        if ((st = refit_layout_manifest(s->dl, s->model, r, &s->dst[r]))) return st;
    return REFIT_OK;
}

static void teardown(setup_t *s)
{
    for (uint32_t r = 0; r < s->ns; r++) refit_manifest_destroy(s->src[r]);
    for (uint32_t r = 0; r < s->nd; r++) refit_manifest_destroy(s->dst[r]);
    refit_layout_destroy(s->sl);
    refit_layout_destroy(s->dl);
    refit_model_destroy(s->model);
}

/* ==== delta ==== */

typedef struct {
    /* publishers, per version */
    double encode_ms[MAXV][MAXR], fill_ms[MAXV][MAXR];
    uint64_t delta_len[MAXR], sparse_bytes[MAXV][MAXR], blocks64_bytes[MAXV][MAXR], blocks512_bytes[MAXV][MAXR];
    uint64_t changed_units[MAXV][MAXR], region_bytes[MAXR];
    /* receivers, per version */
    double full_ms[MAXV][MAXR], delta_ms[MAXV][MAXR], verify_ms[MAXV][MAXR], plan_ms[MAXR], index_ms[MAXR];
    uint64_t full_bytes[MAXV][MAXR], wire_bytes[MAXV][MAXR];
    int mode[MAXV][MAXR]; /* 1 full (no base), 2 delta, 3 full after a refused delta */
    int verified[MAXV][MAXR], exact[MAXV][MAXR];
    char err[MAXR][256];
} dctl_t;

typedef struct {
    const bopts_t *o;
    setup_t *s;
    dctl_t *ctl;
    unsigned char *sbase[MAXR]; /* shared: sources' memory */
    unsigned char *dbuf[MAXR];  /* shared: the delta each source published */
    uint64_t dcap[MAXR];
    /* per child process */
    unsigned char *prev;        /* publisher: what it last published */
    unsigned char *mem, *scratch, *wire[MAXR];
    refit_plan_t *plan;
    refit_delta_index_t *ix[MAXR];
    uint64_t have;
} dctx_t;

#define CMD_SKIP (1ull << 62)
#define REPS 3

static int delta_pub(void *vc, uint32_t r, uint64_t cmd)
{
    dctx_t *c = vc;
    dctl_t *ctl = c->ctl;
    uint64_t v = cmd, sz = refit_manifest_region_size(c->s->src[r], 0);
    void *base = c->sbase[r];
    double t0 = refit_now();
    /* The trainer's step: a fraction of the elements changes. */
    if (refit_truth_fill_delta(c->s->src[r], &base, v, c->o->fraction)) goto fail;
    ctl->fill_ms[v][r] = (refit_now() - t0) * 1e3;
    if (v > 1) {
        void *d;
        size_t len;
        refit_delta_params_t sp = {REFIT_DELTA_SPARSE, 0, 1};
        t0 = refit_now();
        if (refit_delta_encode(c->prev, base, sz, v - 1, v, &sp, &d, &len)) goto fail;
        ctl->encode_ms[v][r] = (refit_now() - t0) * 1e3;
        refit_delta_info_t info = REFIT_DELTA_INFO_INIT;
        refit_delta_info(d, len, &info);
        ctl->changed_units[v][r] = info.changed_units;
        ctl->sparse_bytes[v][r] = len;
        if (len > c->dcap[r]) goto fail;
        memcpy(c->dbuf[r], d, len);
        ctl->delta_len[r] = len;
        free(d);
        for (int k = 0; k < 2; k++) { /* the alternative: changed blocks (measured, not shipped) */
            refit_delta_params_t bp = {REFIT_DELTA_BLOCKS, k ? 512u : 64u, 1};
            if (refit_delta_encode(c->prev, base, sz, v - 1, v, &bp, &d, &len)) goto fail;
            (k ? ctl->blocks512_bytes : ctl->blocks64_bytes)[v][r] = len;
            free(d);
        }
    }
    memcpy(c->prev, base, sz); /* keep what was published */
    return 0;
fail:
    snprintf(ctl->err[r], sizeof ctl->err[r], "publisher %u: %s", r, refit_last_error());
    return 1;
}

static int delta_recv(void *vc, uint32_t r, uint64_t cmd)
{
    dctx_t *c = vc;
    dctl_t *ctl = c->ctl;
    setup_t *s = c->s;
    uint64_t v = cmd & ~CMD_SKIP;
    refit_manifest_t *m = s->dst[r];
    uint64_t dsize = refit_manifest_region_size(m, 0);
    refit_status_t st;
    if (!c->plan) { /* once: plan, index, memory (as a receiver caches its plan) */
        double t0 = refit_now();
        if ((st = refit_plan_create((const refit_manifest_t *const *)s->src, s->ns, m, NULL, &c->plan))) goto fail;
        ctl->plan_ms[r] = (refit_now() - t0) * 1e3;
        t0 = refit_now();
        for (uint32_t k = 0; k < s->ns; k++) {
            if (!refit_plan_source_bytes(c->plan, k)) continue;
            if ((st = refit_delta_index_create(c->plan, k, 0, refit_manifest_region_size(s->src[k], 0), &c->ix[k])))
                goto fail;
            if (!(c->wire[k] = malloc(c->dcap[k]))) goto fail;
        }
        ctl->index_ms[r] = (refit_now() - t0) * 1e3;
        c->mem = malloc(dsize);
        c->scratch = malloc(dsize);
        if (!c->mem || !c->scratch) goto fail;
        memset(c->mem, 0, dsize);
        memset(c->scratch, 0, dsize);
    }
    if (cmd & CMD_SKIP) return 0; /* this receiver misses the version */
    const void *const *sb[MAXR];
    void *sbp[MAXR];
    for (uint32_t k = 0; k < s->ns; k++) {
        sbp[k] = c->sbase[k];
        sb[k] = (const void *const *)&sbp[k];
    }
    /* The full refit of this version (into scratch), timed as the reference,
     * and the refit proper into mem: a delta when mem holds the base, else
     * full.  The host is shared: each timing is the best of REPS (a delta
     * applied again writes the same bytes, so repeating it is harmless).  The
     * two alternate, so that every delta starts after a full refit has gone
     * through the caches, as it would after serving: back to back, a delta
     * would find the lines it wrote last time still cached. */
    refit_plan_stats_t ps = REFIT_PLAN_STATS_INIT;
    refit_plan_stats(c->plan, &ps);
    double t0, full_best = 1e300, best = 1e300;
    uint64_t wire = 0;
    int mode = c->have ? 2 : 1;
    for (int rep = 0; rep < REPS; rep++) {
        t0 = refit_now();
        if ((st = refit_plan_execute_memcpy(c->plan, (const void *const *const *)sb, (void *const *)&c->scratch,
                                            c->o->threads)))
            goto fail;
        if ((refit_now() - t0) * 1e3 < full_best) full_best = (refit_now() - t0) * 1e3;
        if (mode != 2) continue;
        t0 = refit_now();
        wire = 0;
        for (uint32_t k = 0; k < s->ns && mode == 2; k++) {
            if (!c->ix[k]) continue;
            /* Fetch the header and table, then only the chunks the plan reads. */
            memcpy(c->wire[k], c->dbuf[k], 64);
            uint64_t hb = refit_delta_header_bytes(c->wire[k], 64), nch;
            memcpy(c->wire[k], c->dbuf[k], hb);
            wire += hb;
            refit_delta_info_t info = REFIT_DELTA_INFO_INIT;
            if ((st = refit_delta_info(c->wire[k], hb, &info))) goto fail;
            if (info.base_version != c->have) { /* no base: full refit */
                mode = 3;
                break;
            }
            const uint8_t *need = refit_delta_index_need(c->ix[k], &nch);
            for (uint64_t ch = 0; ch < nch; ch++) {
                if (!need[ch]) continue;
                uint64_t off, n;
                refit_delta_chunk_payload(c->wire[k], ch, &off, &n);
                memcpy(c->wire[k] + off, c->dbuf[k] + off, n);
                wire += n;
            }
            if ((st = refit_delta_apply_threads(c->ix[k], c->wire[k], info.total_bytes, c->have, (void *const *)&c->mem,
                                                c->o->threads ? c->o->threads : 1, NULL)))
                goto fail;
        }
        if (mode == 2 && (refit_now() - t0) * 1e3 < best) best = (refit_now() - t0) * 1e3;
    }
    ctl->full_ms[v][r] = full_best;
    ctl->full_bytes[v][r] = ps.bytes_read + ps.bytes_fill;
    if (mode != 2) {
        t0 = refit_now();
        if ((st = refit_plan_execute_memcpy(c->plan, (const void *const *const *)sb, (void *const *)&c->mem,
                                            c->o->threads)))
            goto fail;
        wire = ps.bytes_read + ps.bytes_fill;
        best = (refit_now() - t0) * 1e3;
    }
    ctl->delta_ms[v][r] = best;
    ctl->wire_bytes[v][r] = wire;
    ctl->mode[v][r] = mode;
    c->have = v;
    t0 = refit_now();
    ctl->verified[v][r] = refit_truth_verify_delta(m, (const void *const *)&c->mem, v, c->o->fraction, NULL) == REFIT_OK;
    if (!ctl->verified[v][r]) snprintf(ctl->err[r], sizeof ctl->err[r], "receiver %u: %s", r, refit_last_error());
    ctl->verify_ms[v][r] = (refit_now() - t0) * 1e3;
    ctl->exact[v][r] = !memcmp(c->mem, c->scratch, dsize);
    return 0;
fail:
    snprintf(ctl->err[r], sizeof ctl->err[r], "receiver %u: %s", r, refit_last_error());
    return 1;
}

int bench_delta(int argc, char **argv)
{
    /* The engine end to end (tools/bench_net.c), over netns unless --net shm;
     * --net none: the delta data path in this process (encode, apply). */
    int none = 0;
    for (int i = 1; i < argc; i++)
        if ((!strcmp(argv[i], "--net") && i + 1 < argc && !strcmp(argv[i + 1], "none")) || !strcmp(argv[i], "--net=none"))
            none = i;
    if (!none) return bench_delta_net(argc, argv);
    int skip = strcmp(argv[none], "--net=none") ? 2 : 1;
    for (int i = none; i + skip <= argc; i++) argv[i] = argv[i + skip]; /* argv[argc] is NULL */
    argc -= skip;
    bopts_t o = {.model = "qwen3-30b-a3b-mini", .src = "megatron:ep=2", .dst = "vllm:tp=2", .fraction = 0.01,
                 .versions = 4, .threads = 1};
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    setup_t s;
    refit_status_t st = setup(&s, &o);
    if (st) return tool_fail(st, "bench delta");
    dctl_t *ctl = shmap(sizeof(dctl_t));
    dctx_t c = {.o = &o, .s = &s, .ctl = ctl};
    if (!ctl) return tool_fail(refit_error(REFIT_ERR_NO_MEMORY, "shared memory"), "bench delta");
    uint64_t total_src = 0;
    for (uint32_t k = 0; k < s.ns; k++) {
        uint64_t sz = refit_manifest_region_size(s.src[k], 0);
        total_src += sz;
        ctl->region_bytes[k] = sz;
        c.dcap[k] = 64 + ((sz + 131071) / 131072) * 16 + sz;
        c.sbase[k] = shmap(sz);
        c.dbuf[k] = shmap(c.dcap[k]);
        if (!c.sbase[k] || !c.dbuf[k]) return tool_fail(refit_error(REFIT_ERR_NO_MEMORY, "shared memory"), "bench delta");
    }
    child_t pubs[MAXR], recvs[MAXR];
    for (uint32_t k = 0; k < s.ns; k++) {
        dctx_t *pc = malloc(sizeof(dctx_t));
        *pc = c;
        pc->prev = malloc(ctl->region_bytes[k]); /* the child's own copy after fork */
        if (!pc->prev || spawn(&pubs[k], delta_pub, pc, k)) return tool_fail(refit_error(REFIT_ERR_IO, "fork"), "bench delta");
        free(pc->prev); /* the child has its own */
        free(pc);
    }
    for (uint32_t r = 0; r < s.nd; r++)
        if (spawn(&recvs[r], delta_recv, &c, r)) return tool_fail(refit_error(REFIT_ERR_IO, "fork"), "bench delta");
    /* Versions 1..K for every receiver; then receiver 0 misses K+1 and must
     * refit K+2 in full (its memory lacks the delta's base). */
    uint64_t K = o.versions, last = K + 2;
    int bad = 0;
    for (uint64_t v = 1; v <= last && !bad; v++) {
        uint64_t cmds[MAXR];
        for (uint32_t k = 0; k < s.ns; k++) cmds[k] = v;
        bad |= round_all(pubs, s.ns, cmds);
        for (uint32_t r = 0; r < s.nd; r++) cmds[r] = v == K + 1 && r == 0 ? (v | CMD_SKIP) : v;
        if (!bad) bad |= round_all(recvs, s.nd, cmds);
    }
    stop_all(pubs, s.ns);
    stop_all(recvs, s.nd);
    for (uint32_t r = 0; r < MAXR; r++)
        if (ctl->err[r][0]) fprintf(stderr, "refit: bench delta: %s\n", ctl->err[r]);
    if (bad) return tool_fail(refit_error(REFIT_ERR_INTERNAL, "a bench process failed"), "bench delta");

    /* Steady state: versions 2..K (every receiver took a delta). */
    double full_v[MAXV], delta_v[MAXV], enc_v[MAXV];
    size_t n = 0;
    uint64_t full_b = 0, wire_b = 0, sp = 0, b64 = 0, b512 = 0, changed = 0;
    bool exact = true, verified = true;
    for (uint64_t v = 1; v <= last; v++)
        for (uint32_t r = 0; r < s.nd; r++) {
            if (v == K + 1 && r == 0) continue;
            exact &= ctl->exact[v][r] != 0;
            verified &= ctl->verified[v][r] != 0;
        }
    for (uint64_t v = 2; v <= K; v++, n++) {
        double fm = 0, dm = 0, em = 0;
        for (uint32_t r = 0; r < s.nd; r++) {
            if (ctl->full_ms[v][r] > fm) fm = ctl->full_ms[v][r];
            if (ctl->delta_ms[v][r] > dm) dm = ctl->delta_ms[v][r];
            full_b += ctl->full_bytes[v][r];
            wire_b += ctl->wire_bytes[v][r];
        }
        for (uint32_t k = 0; k < s.ns; k++) {
            if (ctl->encode_ms[v][k] > em) em = ctl->encode_ms[v][k];
            sp += ctl->sparse_bytes[v][k];
            b64 += ctl->blocks64_bytes[v][k];
            b512 += ctl->blocks512_bytes[v][k];
            changed += ctl->changed_units[v][k];
        }
        full_v[n] = fm;
        delta_v[n] = dm;
        enc_v[n] = em;
    }
    uint64_t src_bytes_k = total_src * (K - 1);
    double full_ms = median(full_v, n), delta_ms = median(delta_v, n), enc_ms = median(enc_v, n);
    double wire_ratio = full_b ? (double)wire_b / (double)full_b : 1, time_ratio = full_ms > 0 ? delta_ms / full_ms : 1;
    jout_t j = {0};
    jp(&j, "{\"scenario\":\"delta\",\"metrics\":{\"model\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"fraction\":%g,"
           "\"versions\":%" PRIu64 ",\"threads_per_receiver\":%u,\"source_bytes\":%" PRIu64 ",",
       o.model, refit_layout_string(s.sl), refit_layout_string(s.dl), o.fraction, K, o.threads, total_src);
    jp(&j, "\"changed_unit_fraction\":%.5f,", (double)changed * 2 / (double)src_bytes_k);
    jp(&j, "\"full_refit_ms\":%.3f,\"delta_refit_ms\":%.3f,\"time_ratio\":%.4f,", full_ms, delta_ms, time_ratio);
    jp(&j, "\"full_refit_bytes\":%" PRIu64 ",\"delta_wire_bytes\":%" PRIu64 ",\"wire_ratio\":%.4f,", full_b / n,
       wire_b / n, wire_ratio);
    jp(&j, "\"publisher_encode_ms\":%.3f,\"encoding_bytes_over_source_bytes\":{\"sparse\":%.4f,\"blocks64\":%.4f,"
           "\"blocks512\":%.4f},",
       enc_ms, (double)sp / (double)src_bytes_k, (double)b64 / (double)src_bytes_k, (double)b512 / (double)src_bytes_k);
    jp(&j, "\"plan_ms\":%.3f,\"delta_index_ms\":%.3f,\"per_version\":[", ctl->plan_ms[0], ctl->index_ms[0]);
    for (uint64_t v = 1; v <= last; v++) {
        jp(&j, "%s{\"version\":%" PRIu64 ",\"receivers\":[", v > 1 ? "," : "", v);
        for (uint32_t r = 0; r < s.nd; r++)
            jp(&j, "%s{\"mode\":\"%s\",\"ms\":%.3f,\"wire_bytes\":%" PRIu64 ",\"full_ms\":%.3f,\"verified\":%s,"
                   "\"equals_full_refit\":%s}",
               r ? "," : "",
               ctl->mode[v][r] == 2 ? "delta" : ctl->mode[v][r] == 1 ? "full" : ctl->mode[v][r] == 3 ? "full (no base)" : "skipped",
               ctl->delta_ms[v][r], ctl->wire_bytes[v][r], ctl->full_ms[v][r], ctl->verified[v][r] ? "true" : "false",
               ctl->exact[v][r] ? "true" : "false");
        jp(&j, "]}");
    }
    jp(&j, "]},\"assertions\":[");
    char obs[128];
    snprintf(obs, sizeof obs, "%s", exact && verified ? "true" : "false");
    jassert(&j, "bit_exact", "every version equals the truth and a full refit, byte for byte", obs, exact && verified);
    snprintf(obs, sizeof obs, "%.4f", wire_ratio);
    jassert(&j, "wire_bytes_ratio", "<= 0.05", obs, wire_ratio <= 0.05);
    snprintf(obs, sizeof obs, "%.4f", time_ratio);
    jassert(&j, "time_ratio", "<= 0.15", obs, time_ratio <= 0.15);
    int fb = ctl->mode[K + 2][0], others = ctl->mode[K + 2][s.nd > 1 ? 1 : 0];
    snprintf(obs, sizeof obs, "receiver 0: %s, verified %s; receiver %u: %s", fb == 3 ? "full" : "not full",
             ctl->verified[K + 2][0] ? "yes" : "no", s.nd > 1 ? 1 : 0, others == 2 ? "delta" : "other");
    jassert(&j, "full_refit_without_base", "receiver 0 (missed the base version) refits in full, verified; the others take the delta",
            obs, fb == 3 && ctl->verified[K + 2][0] && (s.nd == 1 || others == 2));
    munmap(ctl, sizeof(dctl_t));
    teardown(&s);
    return jfinish(&j, o.out);
}

/* ==== partial and fp8: publishers fill shared memory, receivers pull ==== */

typedef struct {
    double ms[4][MAXR];          /* per phase */
    uint64_t bytes[4][MAXR];
    int ok[4][MAXR];
    refit_select_report_t sel[MAXR];
    char err[MAXR][256];
} pctl_t;

typedef struct {
    const bopts_t *o;
    setup_t *s;
    pctl_t *ctl;
    unsigned char *sbase[MAXR];
    unsigned char *arena[MAXR]; /* fp8: shared FP8 arena per destination rank */
    uint64_t arena_bytes[MAXR];
    /* per receiver process */
    refit_plan_t *plan, *part;
    refit_manifest_t *sel, *rest;
    unsigned char *mem;
} pctx_t;

static int fill_pub(void *vc, uint32_t r, uint64_t v)
{
    pctx_t *c = vc;
    void *b = c->sbase[r];
    if (refit_truth_fill(c->s->src[r], &b, v)) {
        snprintf(c->ctl->err[r], sizeof c->ctl->err[r], "publisher %u: %s", r, refit_last_error());
        return 1;
    }
    return 0;
}

static void src_bases(pctx_t *c, void **sbp, const void *const **sb)
{
    for (uint32_t k = 0; k < c->s->ns; k++) {
        sbp[k] = c->sbase[k];
        sb[k] = (const void *const *)&sbp[k];
    }
}

/* Phases: 1 full pull of v1 (+ a timed full pull of v2 into scratch for
 * reference); 2 partial pull of v2, then verify. */
static int partial_recv(void *vc, uint32_t r, uint64_t cmd)
{
    pctx_t *c = vc;
    pctl_t *ctl = c->ctl;
    setup_t *s = c->s;
    refit_manifest_t *m = s->dst[r];
    uint64_t ds = refit_manifest_region_size(m, 0);
    void *sbp[MAXR];
    const void *const *sb[MAXR];
    src_bases(c, sbp, sb);
    refit_status_t st;
    if (cmd == 1) {
        if ((st = refit_plan_create((const refit_manifest_t *const *)s->src, s->ns, m, NULL, &c->plan)) ||
            (ctl->sel[r].size = sizeof(ctl->sel[r]), st = refit_manifest_select(m, c->o->select, false, &c->sel,
                                                                                 &ctl->sel[r])) ||
            (st = refit_manifest_select(m, c->o->select, true, &c->rest, NULL)) ||
            (st = refit_plan_create((const refit_manifest_t *const *)s->src, s->ns, c->sel, NULL, &c->part)))
            goto fail;
        if (!(c->mem = malloc(ds))) goto fail;
        if ((st = refit_plan_execute_memcpy(c->plan, (const void *const *const *)sb, (void *const *)&c->mem, c->o->threads)))
            goto fail;
        ctl->ok[0][r] = refit_truth_verify(m, (const void *const *)&c->mem, 1, NULL) == REFIT_OK;
        return 0;
    }
    /* v2: the full refit timed into scratch, then the partial one into mem. */
    refit_plan_stats_t fs = REFIT_PLAN_STATS_INIT, ps = REFIT_PLAN_STATS_INIT;
    refit_plan_stats(c->plan, &fs);
    refit_plan_stats(c->part, &ps);
    unsigned char *scratch = malloc(ds);
    if (!scratch) goto fail;
    memset(scratch, 0, ds);
    double best = 1e300, t0;
    for (int rep = 0; rep < REPS; rep++) {
        t0 = refit_now();
        if ((st = refit_plan_execute_memcpy(c->plan, (const void *const *const *)sb, (void *const *)&scratch, c->o->threads)))
            goto fail;
        if ((refit_now() - t0) * 1e3 < best) best = (refit_now() - t0) * 1e3;
    }
    free(scratch);
    ctl->ms[0][r] = best;
    ctl->bytes[0][r] = fs.bytes_read + fs.bytes_fill;
    best = 1e300;
    for (int rep = 0; rep < REPS; rep++) {
        t0 = refit_now();
        if ((st = refit_plan_execute_memcpy(c->part, (const void *const *const *)sb, (void *const *)&c->mem, c->o->threads)))
            goto fail;
        if ((refit_now() - t0) * 1e3 < best) best = (refit_now() - t0) * 1e3;
    }
    ctl->ms[1][r] = best;
    ctl->bytes[1][r] = ps.bytes_read + ps.bytes_fill;
    t0 = refit_now();
    ctl->ok[1][r] = refit_truth_verify(c->sel, (const void *const *)&c->mem, 2, NULL) == REFIT_OK;
    ctl->ms[2][r] = (refit_now() - t0) * 1e3;
    ctl->ok[2][r] = refit_truth_verify(c->rest, (const void *const *)&c->mem, 1, NULL) == REFIT_OK;
    /* Fused tensors whole: every kept local carries all its placements. */
    int whole = 1;
    for (uint32_t i = 0; i < refit_manifest_num_locals(c->sel); i++) {
        refit_tensor_info_t t, u;
        uint32_t reg;
        uint64_t off;
        refit_manifest_local(c->sel, i, &t, &reg, &off);
        uint32_t a = 0, b = 0;
        for (uint32_t k = 0; k < refit_manifest_num_placements(c->sel); k++) {
            refit_placement_t p;
            refit_manifest_placement(c->sel, k, &p);
            a += p.local == i;
        }
        for (uint32_t j = 0; j < refit_manifest_num_locals(m); j++) {
            refit_manifest_local(m, j, &u, &reg, &off);
            if (strcmp(u.name, t.name)) continue;
            for (uint32_t k = 0; k < refit_manifest_num_placements(m); k++) {
                refit_placement_t p;
                refit_manifest_placement(m, k, &p);
                b += p.local == j;
            }
        }
        whole &= a == b;
    }
    ctl->ok[3][r] = whole;
    return 0;
fail:
    snprintf(ctl->err[r], sizeof ctl->err[r], "receiver %u: %s", r, refit_last_error());
    return 1;
}

int bench_partial(int argc, char **argv)
{
    bopts_t o = {.model = "qwen3-30b-a3b-mini", .src = "megatron:ep=2", .dst = "vllm:tp=2",
                 .select = "layer:7,model.layers.20.self_attn.q_proj.weight,lm_head.weight", .threads = 1, .versions = 2};
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    setup_t s;
    refit_status_t st = setup(&s, &o);
    if (st) return tool_fail(st, "bench partial");
    pctl_t *ctl = shmap(sizeof(pctl_t));
    pctx_t c = {.o = &o, .s = &s, .ctl = ctl};
    for (uint32_t k = 0; k < s.ns; k++)
        if (!(c.sbase[k] = shmap(refit_manifest_region_size(s.src[k], 0))))
            return tool_fail(refit_error(REFIT_ERR_NO_MEMORY, "shared memory"), "bench partial");
    child_t pubs[MAXR], recvs[MAXR];
    for (uint32_t k = 0; k < s.ns; k++) spawn(&pubs[k], fill_pub, &c, k);
    for (uint32_t r = 0; r < s.nd; r++) spawn(&recvs[r], partial_recv, &c, r);
    uint64_t cmds[MAXR];
    int bad = 0;
    for (uint64_t v = 1; v <= 2 && !bad; v++) {
        for (uint32_t k = 0; k < MAXR; k++) cmds[k] = v;
        bad |= round_all(pubs, s.ns, cmds);
        if (!bad) bad |= round_all(recvs, s.nd, cmds);
    }
    stop_all(pubs, s.ns);
    stop_all(recvs, s.nd);
    for (uint32_t r = 0; r < MAXR; r++)
        if (ctl->err[r][0]) fprintf(stderr, "refit: bench partial: %s\n", ctl->err[r]);
    if (bad) return tool_fail(refit_error(REFIT_ERR_INTERNAL, "a bench process failed"), "bench partial");
    double fm = 0, pm = 0;
    uint64_t fb = 0, pb = 0, named = 0, pulled = 0, locals = 0;
    bool sel_ok = true, rest_ok = true, whole = true;
    for (uint32_t r = 0; r < s.nd; r++) {
        if (ctl->ms[0][r] > fm) fm = ctl->ms[0][r];
        if (ctl->ms[1][r] > pm) pm = ctl->ms[1][r];
        fb += ctl->bytes[0][r];
        pb += ctl->bytes[1][r];
        named += ctl->sel[r].canon_named;
        pulled += ctl->sel[r].canon_pulled;
        locals += ctl->sel[r].locals;
        sel_ok &= ctl->ok[1][r] && ctl->ok[0][r];
        rest_ok &= ctl->ok[2][r] != 0;
        whole &= ctl->ok[3][r] != 0;
    }
    jout_t j = {0};
    jp(&j, "{\"scenario\":\"partial\",\"metrics\":{\"model\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"select\":", o.model,
       refit_layout_string(s.sl), refit_layout_string(s.dl));
    char *sel_json = NULL;
    size_t sl = 0;
    FILE *mf = open_memstream(&sel_json, &sl);
    if (mf) {
        tool_json_string(mf, o.select);
        fclose(mf);
    }
    jp(&j, "%s,", sel_json ? sel_json : "\"\"");
    free(sel_json);
    jp(&j, "\"local_tensors_pulled\":%" PRIu64 ",\"canonical_named\":%" PRIu64 ",\"canonical_pulled\":%" PRIu64 ",", locals,
       named, pulled);
    jp(&j, "\"full_refit_ms\":%.3f,\"partial_refit_ms\":%.3f,\"full_bytes\":%" PRIu64 ",\"partial_bytes\":%" PRIu64
           ",\"bytes_ratio\":%.4f,\"time_ratio\":%.4f},\"assertions\":[",
       fm, pm, fb, pb, fb ? (double)pb / (double)fb : 0, fm > 0 ? pm / fm : 0);
    char obs[128];
    jassert(&j, "selected_tensors_verified", "the kept local tensors equal version 2 of the truth", sel_ok ? "true" : "false", sel_ok);
    jassert(&j, "others_untouched", "every other local tensor still equals version 1", rest_ok ? "true" : "false", rest_ok);
    snprintf(obs, sizeof obs, "%s; %" PRIu64 " canonical tensors pulled for %" PRIu64 " named", whole ? "whole" : "cut",
             pulled, named);
    jassert(&j, "fused_whole", "each kept fused tensor carries all its placements", obs, whole && pulled >= named);
    snprintf(obs, sizeof obs, "%.4f", fb ? (double)pb / (double)fb : 1);
    jassert(&j, "bytes_only_selected", "< 1 (only the selected tensors move)", obs, pb < fb);
    munmap(ctl, sizeof(pctl_t));
    teardown(&s);
    return jfinish(&j, o.out);
}

/* fp8: a stage process per destination rank, where the sources are, runs the
 * bf16 plan into a staging image and quantizes it into the shared FP8 arena;
 * the receiver pulls the arena (the wire carries fp8 bytes and scales) and
 * checks it against its own recomputation from the truth.  Phase 1 stage,
 * phase 2 receive; the bf16 full refit is timed for reference. */
static int fp8_stage_proc(void *vc, uint32_t r, uint64_t cmd)
{
    pctx_t *c = vc;
    pctl_t *ctl = c->ctl;
    setup_t *s = c->s;
    (void)cmd;
    refit_status_t st;
    refit_fp8_target_t *t = NULL;
    refit_manifest_t *m = s->dst[r];
    void *sbp[MAXR];
    const void *const *sb[MAXR];
    src_bases(c, sbp, sb);
    unsigned char *img = malloc(refit_manifest_region_size(m, 0));
    if (!img) goto fail;
    if ((st = refit_plan_create((const refit_manifest_t *const *)s->src, s->ns, m, NULL, &c->plan)) ||
        (st = refit_fp8_target_create(m, &t)))
        goto fail;
    double best = 1e300, t0;
    for (int rep = 0; rep < REPS; rep++) {
        t0 = refit_now();
        if ((st = refit_plan_execute_memcpy(c->plan, (const void *const *const *)sb, (void *const *)&img, c->o->threads)) ||
            (st = refit_fp8_stage(t, img, c->arena[r], c->o->threads)))
            goto fail;
        if ((refit_now() - t0) * 1e3 < best) best = (refit_now() - t0) * 1e3;
    }
    ctl->ms[0][r] = best;
    free(img);
    refit_fp8_target_destroy(t);
    return 0;
fail:
    free(img);
    refit_fp8_target_destroy(t);
    snprintf(ctl->err[r], sizeof ctl->err[r], "stage %u: %s", r, refit_last_error());
    return 1;
}

static int fp8_recv(void *vc, uint32_t r, uint64_t cmd)
{
    pctx_t *c = vc;
    pctl_t *ctl = c->ctl;
    setup_t *s = c->s;
    refit_manifest_t *m = s->dst[r];
    refit_status_t st;
    refit_fp8_target_t *t = NULL;
    uint64_t ds = refit_manifest_region_size(m, 0), ab = c->arena_bytes[r];
    unsigned char *mem = malloc(ab), *bf = malloc(ds), *want = calloc(1, ab);
    void *sbp[MAXR];
    const void *const *sb[MAXR];
    src_bases(c, sbp, sb);
    if (!mem || !bf || !want) goto fail;
    memset(mem, 0, ab);
    memset(bf, 0, ds);
    if ((st = refit_fp8_target_create(m, &t))) goto fail;
    /* The pull: one contiguous copy of the FP8 arena. */
    double best = 1e300, t0;
    for (int rep = 0; rep < REPS; rep++) {
        t0 = refit_now();
        memcpy(mem, c->arena[r], ab);
        if ((refit_now() - t0) * 1e3 < best) best = (refit_now() - t0) * 1e3;
    }
    ctl->ms[1][r] = best;
    ctl->bytes[1][r] = ab;
    /* Reference: the bf16 full refit of the same layout. */
    if ((st = refit_plan_create((const refit_manifest_t *const *)s->src, s->ns, m, NULL, &c->plan))) goto fail;
    refit_plan_stats_t ps = REFIT_PLAN_STATS_INIT;
    refit_plan_stats(c->plan, &ps);
    best = 1e300;
    for (int rep = 0; rep < REPS; rep++) {
        t0 = refit_now();
        if ((st = refit_plan_execute_memcpy(c->plan, (const void *const *const *)sb, (void *const *)&bf, c->o->threads)))
            goto fail;
        if ((refit_now() - t0) * 1e3 < best) best = (refit_now() - t0) * 1e3;
    }
    ctl->ms[2][r] = best;
    ctl->bytes[2][r] = ps.bytes_read + ps.bytes_fill;
    /* Check: recompute from the truth here and compare every byte. */
    void *bp = bf;
    if ((st = refit_truth_fill(m, &bp, cmd))) goto fail;
    if ((st = refit_fp8_stage(t, bf, want, c->o->threads))) goto fail;
    ctl->ok[1][r] = !memcmp(mem, want, ab);
    for (uint32_t i = 0; i < refit_fp8_target_num_tensors(t); i++) { /* the quantized tensors alone */
        const refit_fp8_tensor_t *e = refit_fp8_target_tensor(t, i);
        if (e->dtype == REFIT_DTYPE_F8_E4M3) ctl->bytes[3][r] += e->bytes, ctl->bytes[0][r] += e->bytes;
        else if (e->dtype == REFIT_DTYPE_F32 && strstr(e->name, "_scale_inv")) ctl->bytes[0][r] += e->bytes;
    }
    refit_fp8_target_destroy(t);
    free(mem);
    free(bf);
    free(want);
    return 0;
fail:
    refit_fp8_target_destroy(t);
    free(mem);
    free(bf);
    free(want);
    snprintf(ctl->err[r], sizeof ctl->err[r], "receiver %u: %s", r, refit_last_error());
    return 1;
}

int bench_fp8(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) /* --net: the engine end to end (tools/bench_net.c) */
        if (!strcmp(argv[i], "--net") || !strncmp(argv[i], "--net=", 6)) return bench_fp8_net(argc, argv);
    bopts_t o = {.model = "qwen3-fp8-mini", .src = "megatron:ep=2", .dst = "vllm:tp=2", .threads = 1, .versions = 2};
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    setup_t s;
    refit_status_t st = setup(&s, &o);
    if (st) return tool_fail(st, "bench fp8");
    pctl_t *ctl = shmap(sizeof(pctl_t));
    pctx_t c = {.o = &o, .s = &s, .ctl = ctl};
    uint64_t arena_total = 0, bf16_total = 0;
    uint32_t nq = 0;
    for (uint32_t r = 0; r < s.nd; r++) {
        refit_fp8_target_t *t;
        if ((st = refit_fp8_target_create(s.dst[r], &t))) return tool_fail(st, "bench fp8");
        c.arena_bytes[r] = refit_fp8_target_bytes(t);
        nq += refit_fp8_target_num_quantized(t);
        refit_fp8_target_destroy(t);
        arena_total += c.arena_bytes[r];
        bf16_total += refit_manifest_region_size(s.dst[r], 0);
        if (!(c.arena[r] = shmap(c.arena_bytes[r]))) return tool_fail(refit_error(REFIT_ERR_NO_MEMORY, "shm"), "bench fp8");
    }
    for (uint32_t k = 0; k < s.ns; k++)
        if (!(c.sbase[k] = shmap(refit_manifest_region_size(s.src[k], 0))))
            return tool_fail(refit_error(REFIT_ERR_NO_MEMORY, "shared memory"), "bench fp8");
    /* A layout whose shards cut blocks is refused up front (the first of
     * tp=4, 8, 16 that is valid for the model and cuts a block). */
    char refused[300] = "no misaligned layout tried";
    for (unsigned tp = 4; tp <= 16; tp *= 2) {
        char spec[32];
        snprintf(spec, sizeof spec, "vllm:tp=%u", tp);
        refit_layout_t *l4;
        refit_manifest_t *m4;
        refit_fp8_target_t *t4;
        if (refit_layout_parse(spec, &l4)) continue;
        if (refit_layout_check(l4, s.model) || refit_layout_manifest(l4, s.model, 0, &m4)) {
            refit_layout_destroy(l4);
            continue;
        }
        refit_status_t s4 = refit_fp8_target_create(m4, &t4);
        if (s4 == REFIT_ERR_GEOMETRY) snprintf(refused, sizeof refused, "%s refused (REFIT_ERR_GEOMETRY)", spec);
        else if (!s4) {
            snprintf(refused, sizeof refused, "%s accepted (aligned)", spec);
            refit_fp8_target_destroy(t4);
        }
        refit_manifest_destroy(m4);
        refit_layout_destroy(l4);
        if (s4 == REFIT_ERR_GEOMETRY) break;
    }
    child_t pubs[MAXR], stages[MAXR], recvs[MAXR];
    for (uint32_t k = 0; k < s.ns; k++) spawn(&pubs[k], fill_pub, &c, k);
    uint64_t cmds[MAXR];
    for (uint32_t k = 0; k < MAXR; k++) cmds[k] = 1;
    int bad = round_all(pubs, s.ns, cmds);
    stop_all(pubs, s.ns);
    for (uint32_t r = 0; r < s.nd && !bad; r++) spawn(&stages[r], fp8_stage_proc, &c, r);
    if (!bad) {
        bad |= round_all(stages, s.nd, cmds);
        stop_all(stages, s.nd);
    }
    for (uint32_t r = 0; r < s.nd && !bad; r++) spawn(&recvs[r], fp8_recv, &c, r);
    if (!bad) {
        bad |= round_all(recvs, s.nd, cmds);
        stop_all(recvs, s.nd);
    }
    for (uint32_t r = 0; r < MAXR; r++)
        if (ctl->err[r][0]) fprintf(stderr, "refit: bench fp8: %s\n", ctl->err[r]);
    if (bad) return tool_fail(refit_error(REFIT_ERR_INTERNAL, "a bench process failed"), "bench fp8");
    double stage_ms = 0, pull_ms = 0, bf16_ms = 0;
    uint64_t wire = 0, bfb = 0, qb = 0, qbf = 0;
    bool exact = true;
    for (uint32_t r = 0; r < s.nd; r++) {
        if (ctl->ms[0][r] > stage_ms) stage_ms = ctl->ms[0][r];
        if (ctl->ms[1][r] > pull_ms) pull_ms = ctl->ms[1][r];
        if (ctl->ms[2][r] > bf16_ms) bf16_ms = ctl->ms[2][r];
        wire += ctl->bytes[1][r];
        bfb += ctl->bytes[2][r];
        qb += ctl->bytes[0][r];
        qbf += 2 * ctl->bytes[3][r];
        exact &= ctl->ok[1][r] != 0;
    }
    jout_t j = {0};
    jp(&j, "{\"scenario\":\"fp8\",\"metrics\":{\"model\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"block\":%d,"
           "\"quantized_tensors\":%u,\"fp8_wire_bytes\":%" PRIu64 ",\"bf16_refit_bytes\":%" PRIu64 ",\"wire_ratio\":%.4f,"
           "\"source_stage_ms\":%.3f,\"fp8_pull_ms\":%.3f,\"bf16_refit_ms\":%.3f,\"destination_bf16_bytes\":%" PRIu64 ",",
       o.model, refit_layout_string(s.sl), refit_layout_string(s.dl), REFIT_FP8_BLOCK, nq, wire, bfb,
       bfb ? (double)wire / (double)bfb : 0, stage_ms, pull_ms, bf16_ms, bf16_total);
    jp(&j, "\"linear_fp8_and_scale_bytes\":%" PRIu64 ",\"linear_bf16_bytes\":%" PRIu64 ",\"linear_ratio\":%.4f},",
       qb, qbf, qbf ? (double)qb / (double)qbf : 0);
    jp(&j, "\"assertions\":[");
    char obs[128];
    jassert(&j, "fp8_bits_exact", "the pulled FP8 arena (e4m3 weights, fp32 scale_inv) equals the receiver's own quantization of the truth, byte for byte",
            exact ? "true" : "false", exact);
    snprintf(obs, sizeof obs, "%.4f (whole arena %.4f)", qbf ? (double)qb / (double)qbf : 1, bfb ? (double)wire / (double)bfb : 1);
    jassert(&j, "wire_carries_fp8", "quantized weights move as fp8 + scales: <= 0.51 of their bf16 bytes; the arena < the bf16 refit",
            obs, qbf && (double)qb / (double)qbf <= 0.51 && wire < bfb);
    jassert(&j, "misaligned_refused", "a vllm tp whose shards cut 128x128 blocks is refused", refused, strstr(refused, "refused") != NULL);
    (void)arena_total;
    munmap(ctl, sizeof(pctl_t));
    teardown(&s);
    return jfinish(&j, o.out);
}
