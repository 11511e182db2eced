/* refit bench scenarios: delta, partial, fp8 (fleet data features).
 *
 * Each runs on one host with processes and shared memory: publisher
 * processes hold the source ranks' memory in shared mappings (what the shm
 * transport reads, zero copy), receiver processes plan once and pull from
 * those mappings.  Parent and children talk over pipes; results come back in
 * a shared control block.  Prints one JSON object
 * {"scenario":..,"metrics":{..},"assertions":[..]} and writes it to --out.
 * Exit status 0 when every assertion passed, 3 when one failed. */
#include "data_internal.h"

/* ---- options, JSON ---- */


int bd_parse_opts(int argc, char **argv, bopts_t *o)
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
        else
            return tool_usage("bench",
                              "options: --model --src --dst --fraction --versions --format --select --threads --out");
        i++;
    }
    return 0;
}


void bd_jp(jout_t *j, const char *fmt, ...)
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

void bd_jassert(jout_t *j, const char *name, const char *expected, const char *observed, bool passed)
{
    bd_jp(j, "%s{\"name\":\"%s\",\"expected\":\"%s\",\"observed\":\"%s\",\"passed\":%s}", j->nassert++ ? "," : "", name,
          expected, observed, passed ? "true" : "false");
    if (!passed) j->failed = 1;
}

int bd_jfinish(jout_t *j, const char *out)
{
    bd_jp(j, "]}\n");
    refit_status_t st = tool_report_write(j->buf, out);
    free(j->buf);
    if (st) return tool_fail(st, "bench");
    return j->failed ? 3 : 0;
}

void *bd_shmap(size_t n)
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

int bd_spawn(child_t *c, child_fn fn, void *ctx, uint32_t rank)
{
    /* Failing to start a process ends the bench (children already started
     * see their command pipe close and exit). */
    child_body_t body = {fn, ctx, rank};
    if (tool_proc_fork(c, child_loop, &body, false))
        exit(tool_fail(refit_error(REFIT_ERR_IO, "fork: %s", strerror(errno)), "bench"));
    return 0;
}

/* Sends cmd to children [0, n) at once and waits for all; non-zero if any failed. */
int bd_round_all(child_t *c, uint32_t n, const uint64_t *cmds)
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

void bd_stop_all(child_t *c, uint32_t n)
{
    uint64_t z = 0;
    for (uint32_t i = 0; i < n; i++) tool_proc_stop(&c[i], &z, sizeof z, false, 30);
}

/* ---- common setup: model, manifests of both layouts ---- */


refit_status_t bd_setup(setup_t *s, const bopts_t *o)
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

void bd_teardown(setup_t *s)
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
    unsigned char *prev; /* publisher: what it last published */
    unsigned char *mem, *scratch, *wire[MAXR];
    refit_plan_t *plan;
    refit_delta_index_t *ix[MAXR];
    uint64_t have;
} dctx_t;


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
    ctl->verified[v][r] = refit_truth_verify_delta(m, (const void *const *)&c->mem, v, c->o->fraction, NULL) ==
                          REFIT_OK;
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
        if ((!strcmp(argv[i], "--net") && i + 1 < argc && !strcmp(argv[i + 1], "none")) ||
            !strcmp(argv[i], "--net=none"))
            none = i;
    if (!none) return bench_delta_net(argc, argv);
    int skip = strcmp(argv[none], "--net=none") ? 2 : 1;
    for (int i = none; i + skip <= argc; i++) argv[i] = argv[i + skip]; /* argv[argc] is NULL */
    argc -= skip;
    bopts_t o = {.model = "qwen3-30b-a3b-mini",
                 .src = "megatron:ep=2",
                 .dst = "vllm:tp=2",
                 .fraction = 0.01,
                 .versions = 4,
                 .threads = 1};
    int rc = bd_parse_opts(argc, argv, &o);
    if (rc) return rc;
    setup_t s;
    refit_status_t st = bd_setup(&s, &o);
    if (st) return tool_fail(st, "bench delta");
    dctl_t *ctl = bd_shmap(sizeof(dctl_t));
    dctx_t c = {.o = &o, .s = &s, .ctl = ctl};
    if (!ctl) return tool_fail(refit_error(REFIT_ERR_NO_MEMORY, "shared memory"), "bench delta");
    uint64_t total_src = 0;
    for (uint32_t k = 0; k < s.ns; k++) {
        uint64_t sz = refit_manifest_region_size(s.src[k], 0);
        total_src += sz;
        ctl->region_bytes[k] = sz;
        c.dcap[k] = 64 + ((sz + 131071) / 131072) * 16 + sz;
        c.sbase[k] = bd_shmap(sz);
        c.dbuf[k] = bd_shmap(c.dcap[k]);
        if (!c.sbase[k] || !c.dbuf[k])
            return tool_fail(refit_error(REFIT_ERR_NO_MEMORY, "shared memory"), "bench delta");
    }
    child_t pubs[MAXR], recvs[MAXR];
    for (uint32_t k = 0; k < s.ns; k++) {
        dctx_t *pc = malloc(sizeof(dctx_t));
        *pc = c;
        pc->prev = malloc(ctl->region_bytes[k]); /* the child's own copy after fork */
        if (!pc->prev || bd_spawn(&pubs[k], delta_pub, pc, k))
            return tool_fail(refit_error(REFIT_ERR_IO, "fork"), "bench delta");
        free(pc->prev); /* the child has its own */
        free(pc);
    }
    for (uint32_t r = 0; r < s.nd; r++)
        if (bd_spawn(&recvs[r], delta_recv, &c, r)) return tool_fail(refit_error(REFIT_ERR_IO, "fork"), "bench delta");
    /* Versions 1..K for every receiver; then receiver 0 misses K+1 and must
     * refit K+2 in full (its memory lacks the delta's base). */
    uint64_t K = o.versions, last = K + 2;
    int bad = 0;
    for (uint64_t v = 1; v <= last && !bad; v++) {
        uint64_t cmds[MAXR];
        for (uint32_t k = 0; k < s.ns; k++) cmds[k] = v;
        bad |= bd_round_all(pubs, s.ns, cmds);
        for (uint32_t r = 0; r < s.nd; r++) cmds[r] = v == K + 1 && r == 0 ? (v | CMD_SKIP) : v;
        if (!bad) bad |= bd_round_all(recvs, s.nd, cmds);
    }
    bd_stop_all(pubs, s.ns);
    bd_stop_all(recvs, s.nd);
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
    bd_jp(&j,
          "{\"scenario\":\"delta\",\"metrics\":{\"model\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"fraction\":%g,"
          "\"versions\":%" PRIu64 ",\"threads_per_receiver\":%u,\"source_bytes\":%" PRIu64 ",",
          o.model, refit_layout_string(s.sl), refit_layout_string(s.dl), o.fraction, K, o.threads, total_src);
    bd_jp(&j, "\"changed_unit_fraction\":%.5f,", (double)changed * 2 / (double)src_bytes_k);
    bd_jp(&j, "\"full_refit_ms\":%.3f,\"delta_refit_ms\":%.3f,\"time_ratio\":%.4f,", full_ms, delta_ms, time_ratio);
    bd_jp(&j, "\"full_refit_bytes\":%" PRIu64 ",\"delta_wire_bytes\":%" PRIu64 ",\"wire_ratio\":%.4f,", full_b / n,
          wire_b / n, wire_ratio);
    bd_jp(&j,
          "\"publisher_encode_ms\":%.3f,\"encoding_bytes_over_source_bytes\":{\"sparse\":%.4f,\"blocks64\":%.4f,"
          "\"blocks512\":%.4f},",
          enc_ms, (double)sp / (double)src_bytes_k, (double)b64 / (double)src_bytes_k,
          (double)b512 / (double)src_bytes_k);
    bd_jp(&j, "\"plan_ms\":%.3f,\"delta_index_ms\":%.3f,\"per_version\":[", ctl->plan_ms[0], ctl->index_ms[0]);
    for (uint64_t v = 1; v <= last; v++) {
        bd_jp(&j, "%s{\"version\":%" PRIu64 ",\"receivers\":[", v > 1 ? "," : "", v);
        for (uint32_t r = 0; r < s.nd; r++)
            bd_jp(&j,
                  "%s{\"mode\":\"%s\",\"ms\":%.3f,\"wire_bytes\":%" PRIu64 ",\"full_ms\":%.3f,\"verified\":%s,"
                  "\"equals_full_refit\":%s}",
                  r ? "," : "",
                  ctl->mode[v][r] == 2   ? "delta"
                  : ctl->mode[v][r] == 1 ? "full"
                  : ctl->mode[v][r] == 3 ? "full (no base)"
                                         : "skipped",
                  ctl->delta_ms[v][r], ctl->wire_bytes[v][r], ctl->full_ms[v][r],
                  ctl->verified[v][r] ? "true" : "false", ctl->exact[v][r] ? "true" : "false");
        bd_jp(&j, "]}");
    }
    bd_jp(&j, "]},\"assertions\":[");
    char obs[128];
    snprintf(obs, sizeof obs, "%s", exact && verified ? "true" : "false");
    bd_jassert(&j, "bit_exact", "every version equals the truth and a full refit, byte for byte", obs,
               exact && verified);
    snprintf(obs, sizeof obs, "%.4f", wire_ratio);
    bd_jassert(&j, "wire_bytes_ratio", "<= 0.05", obs, wire_ratio <= 0.05);
    snprintf(obs, sizeof obs, "%.4f", time_ratio);
    bd_jassert(&j, "time_ratio", "<= 0.15", obs, time_ratio <= 0.15);
    int fb = ctl->mode[K + 2][0], others = ctl->mode[K + 2][s.nd > 1 ? 1 : 0];
    snprintf(obs, sizeof obs, "receiver 0: %s, verified %s; receiver %u: %s", fb == 3 ? "full" : "not full",
             ctl->verified[K + 2][0] ? "yes" : "no", s.nd > 1 ? 1 : 0, others == 2 ? "delta" : "other");
    bd_jassert(&j, "full_refit_without_base",
               "receiver 0 (missed the base version) refits in full, verified; the others take the delta", obs,
               fb == 3 && ctl->verified[K + 2][0] && (s.nd == 1 || others == 2));
    munmap(ctl, sizeof(dctl_t));
    bd_teardown(&s);
    return bd_jfinish(&j, o.out);
}

/* ==== partial and fp8: publishers fill shared memory, receivers pull ==== */
