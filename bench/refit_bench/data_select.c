/* refit-bench --scenario partial and fp8 on one host (data.c has the harness). */
#include "data_internal.h"

typedef struct {
    double ms[4][MAXR]; /* per phase */
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
            (ctl->sel[r].size = sizeof(ctl->sel[r]),
             st = refit_manifest_select(m, c->o->select, false, &c->sel, &ctl->sel[r])) ||
            (st = refit_manifest_select(m, c->o->select, true, &c->rest, NULL)) ||
            (st = refit_plan_create((const refit_manifest_t *const *)s->src, s->ns, c->sel, NULL, &c->part)))
            goto fail;
        if (!(c->mem = malloc(ds))) goto fail;
        if ((st = refit_plan_execute_memcpy(c->plan, (const void *const *const *)sb, (void *const *)&c->mem,
                                            c->o->threads)))
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
        if ((st = refit_plan_execute_memcpy(c->plan, (const void *const *const *)sb, (void *const *)&scratch,
                                            c->o->threads)))
            goto fail;
        if ((refit_now() - t0) * 1e3 < best) best = (refit_now() - t0) * 1e3;
    }
    free(scratch);
    ctl->ms[0][r] = best;
    ctl->bytes[0][r] = fs.bytes_read + fs.bytes_fill;
    best = 1e300;
    for (int rep = 0; rep < REPS; rep++) {
        t0 = refit_now();
        if ((st = refit_plan_execute_memcpy(c->part, (const void *const *const *)sb, (void *const *)&c->mem,
                                            c->o->threads)))
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
    bopts_t o = {.model = "qwen3-30b-a3b-mini",
                 .src = "megatron:ep=2",
                 .dst = "vllm:tp=2",
                 .select = "layer:7,model.layers.20.self_attn.q_proj.weight,lm_head.weight",
                 .threads = 1,
                 .versions = 2};
    int rc = bd_parse_opts(argc, argv, &o);
    if (rc) return rc;
    setup_t s;
    refit_status_t st = bd_setup(&s, &o);
    if (st) return tool_fail(st, "bench partial");
    pctl_t *ctl = bd_shmap(sizeof(pctl_t));
    pctx_t c = {.o = &o, .s = &s, .ctl = ctl};
    for (uint32_t k = 0; k < s.ns; k++)
        if (!(c.sbase[k] = bd_shmap(refit_manifest_region_size(s.src[k], 0))))
            return tool_fail(refit_error(REFIT_ERR_NO_MEMORY, "shared memory"), "bench partial");
    child_t pubs[MAXR], recvs[MAXR];
    for (uint32_t k = 0; k < s.ns; k++) bd_spawn(&pubs[k], fill_pub, &c, k);
    for (uint32_t r = 0; r < s.nd; r++) bd_spawn(&recvs[r], partial_recv, &c, r);
    uint64_t cmds[MAXR];
    int bad = 0;
    for (uint64_t v = 1; v <= 2 && !bad; v++) {
        for (uint32_t k = 0; k < MAXR; k++) cmds[k] = v;
        bad |= bd_round_all(pubs, s.ns, cmds);
        if (!bad) bad |= bd_round_all(recvs, s.nd, cmds);
    }
    bd_stop_all(pubs, s.ns);
    bd_stop_all(recvs, s.nd);
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
    bd_jp(&j,
          "{\"scenario\":\"partial\",\"metrics\":{\"model\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"select\":", o.model,
          refit_layout_string(s.sl), refit_layout_string(s.dl));
    char *sel_json = NULL;
    size_t sl = 0;
    FILE *mf = open_memstream(&sel_json, &sl);
    if (mf) {
        tool_json_string(mf, o.select);
        fclose(mf);
    }
    bd_jp(&j, "%s,", sel_json ? sel_json : "\"\"");
    free(sel_json);
    bd_jp(&j, "\"local_tensors_pulled\":%" PRIu64 ",\"canonical_named\":%" PRIu64 ",\"canonical_pulled\":%" PRIu64 ",",
          locals, named, pulled);
    bd_jp(&j,
          "\"full_refit_ms\":%.3f,\"partial_refit_ms\":%.3f,\"full_bytes\":%" PRIu64 ",\"partial_bytes\":%" PRIu64
          ",\"bytes_ratio\":%.4f,\"time_ratio\":%.4f},\"assertions\":[",
          fm, pm, fb, pb, fb ? (double)pb / (double)fb : 0, fm > 0 ? pm / fm : 0);
    char obs[128];
    bd_jassert(&j, "selected_tensors_verified", "the kept local tensors equal version 2 of the truth",
               sel_ok ? "true" : "false", sel_ok);
    bd_jassert(&j, "others_untouched", "every other local tensor still equals version 1", rest_ok ? "true" : "false",
               rest_ok);
    snprintf(obs, sizeof obs, "%s; %" PRIu64 " canonical tensors pulled for %" PRIu64 " named", whole ? "whole" : "cut",
             pulled, named);
    bd_jassert(&j, "fused_whole", "each kept fused tensor carries all its placements", obs, whole && pulled >= named);
    snprintf(obs, sizeof obs, "%.4f", fb ? (double)pb / (double)fb : 1);
    bd_jassert(&j, "bytes_only_selected", "< 1 (only the selected tensors move)", obs, pb < fb);
    munmap(ctl, sizeof(pctl_t));
    bd_teardown(&s);
    return bd_jfinish(&j, o.out);
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
        if ((st = refit_plan_execute_memcpy(c->plan, (const void *const *const *)sb, (void *const *)&img,
                                            c->o->threads)) ||
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
        if ((st = refit_plan_execute_memcpy(c->plan, (const void *const *const *)sb, (void *const *)&bf,
                                            c->o->threads)))
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
    int rc = bd_parse_opts(argc, argv, &o);
    if (rc) return rc;
    setup_t s;
    refit_status_t st = bd_setup(&s, &o);
    if (st) return tool_fail(st, "bench fp8");
    pctl_t *ctl = bd_shmap(sizeof(pctl_t));
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
        if (!(c.arena[r] = bd_shmap(c.arena_bytes[r])))
            return tool_fail(refit_error(REFIT_ERR_NO_MEMORY, "shm"), "bench fp8");
    }
    for (uint32_t k = 0; k < s.ns; k++)
        if (!(c.sbase[k] = bd_shmap(refit_manifest_region_size(s.src[k], 0))))
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
    for (uint32_t k = 0; k < s.ns; k++) bd_spawn(&pubs[k], fill_pub, &c, k);
    uint64_t cmds[MAXR];
    for (uint32_t k = 0; k < MAXR; k++) cmds[k] = 1;
    int bad = bd_round_all(pubs, s.ns, cmds);
    bd_stop_all(pubs, s.ns);
    for (uint32_t r = 0; r < s.nd && !bad; r++) bd_spawn(&stages[r], fp8_stage_proc, &c, r);
    if (!bad) {
        bad |= bd_round_all(stages, s.nd, cmds);
        bd_stop_all(stages, s.nd);
    }
    for (uint32_t r = 0; r < s.nd && !bad; r++) bd_spawn(&recvs[r], fp8_recv, &c, r);
    if (!bad) {
        bad |= bd_round_all(recvs, s.nd, cmds);
        bd_stop_all(recvs, s.nd);
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
    bd_jp(
        &j,
        "{\"scenario\":\"fp8\",\"metrics\":{\"model\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"block\":%d,"
        "\"quantized_tensors\":%u,\"fp8_wire_bytes\":%" PRIu64 ",\"bf16_refit_bytes\":%" PRIu64 ",\"wire_ratio\":%.4f,"
        "\"source_stage_ms\":%.3f,\"fp8_pull_ms\":%.3f,\"bf16_refit_ms\":%.3f,\"destination_bf16_bytes\":%" PRIu64 ",",
        o.model, refit_layout_string(s.sl), refit_layout_string(s.dl), REFIT_FP8_BLOCK, nq, wire, bfb,
        bfb ? (double)wire / (double)bfb : 0, stage_ms, pull_ms, bf16_ms, bf16_total);
    bd_jp(&j, "\"linear_fp8_and_scale_bytes\":%" PRIu64 ",\"linear_bf16_bytes\":%" PRIu64 ",\"linear_ratio\":%.4f},",
          qb, qbf, qbf ? (double)qb / (double)qbf : 0);
    bd_jp(&j, "\"assertions\":[");
    char obs[128];
    bd_jassert(
        &j, "fp8_bits_exact",
        "the pulled FP8 arena (e4m3 weights, fp32 scale_inv) equals the receiver's own quantization of the truth, byte for byte",
        exact ? "true" : "false", exact);
    snprintf(obs, sizeof obs, "%.4f (whole arena %.4f)", qbf ? (double)qb / (double)qbf : 1,
             bfb ? (double)wire / (double)bfb : 1);
    bd_jassert(&j, "wire_carries_fp8",
               "quantized weights move as fp8 + scales: <= 0.51 of their bf16 bytes; the arena < the bf16 refit", obs,
               qbf && (double)qb / (double)qbf <= 0.51 && wire < bfb);
    bd_jassert(&j, "misaligned_refused", "a vllm tp whose shards cut 128x128 blocks is refused", refused,
               strstr(refused, "refused") != NULL);
    (void)arena_total;
    munmap(ctl, sizeof(pctl_t));
    bd_teardown(&s);
    return bd_jfinish(&j, o.out);
}
