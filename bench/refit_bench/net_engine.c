/* Delta and FP8 through publishers, relays and receivers (--net shm|netns). */
#include "net_internal.h"

/* ---- delta through the engine ---------------------------------------------- */

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_of(double *v, size_t n)
{
    if (!n) return 0;
    qsort(v, n, sizeof(double), cmp_dbl);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Publishers in delta mode change --fraction of their elements per version;
 * per version, a full receiver (no_delta) pulls it, then a delta receiver of
 * the same layout and rank, one after the other so that each has the links
 * (or the CPUs) to itself.  Both verify every byte against the truth. */
static int delta_net_once(int argc, char **argv)
{
    nb_opts_t o;
    int rc = nb_parse(argc, argv, &o, "megatron:ep=2", "vllm:tp=2", 1, 0);
    if (rc) return rc;
    if (o.delta <= 0) o.delta = 0.01;
    if (o.delta >= 1) return tool_usage("bench", "--fraction is a share of elements, below 1");
    if (!o.versions) o.versions = 4;
    if (o.versions < 2 || o.versions > 30) return tool_usage("bench", "--versions is 2..30");
    o.verify = true; /* bit-exactness is what this scenario asserts */
    o.receivers = 2;
    bool net = !o.net || !strcmp(o.net, "netns"); /* the goal is stated for links */
    uint32_t P = nb_world_of(o.src);
    if (!P || P > 62) return tool_usage("bench", "--src names a layout of 1..62 ranks");
    if (net && !nb_net_up(&o, "delta", P + 2)) return 1;
    nb_fresh_registry(&o);
    child_t pubs[64], full, delta;
    for (uint32_t k = 0; k < P; k++)
        pubs[k] = nb_spawn(&o, &(role_t){true, k, -1, NULL, net ? (int)k : -1, false, 0, false});
    full = nb_spawn(&o, &(role_t){false, 0, -1, NULL, net ? (int)P : -1, true, 0, false});
    delta = nb_spawn(&o, &(role_t){false, 0, -1, NULL, net ? (int)P + 1 : -1, false, 0, false});
    uint32_t V = o.versions;
    result_t rf[32], rd[32];
    double enc[32] = {0}, pub[32] = {0}, dig[32] = {0}, cpy[32] = {0};
    uint32_t from_delta[32] = {0};
    uint64_t dbytes[32] = {0}, base[32] = {0};
    uint32_t verified = 0;
    bool ok = true;
    char buf[700];
    for (uint32_t v = 1; v <= V && ok; v++) {
        for (uint32_t k = 0; k < P; k++) nb_send_cmd(&pubs[k], "publish %u", v);
        for (uint32_t k = 0; k < P; k++) {
            uint64_t b = 0, n = 0;
            double e = 0, t = 0, dm = 0, cm = 0;
            unsigned fd = 0;
            nb_reply(&pubs[k], 600000, buf, sizeof(buf));
            if (sscanf(buf, "0 %" SCNu64 " %" SCNu64 " %lf %lf %lf %u %lf", &b, &n, &e, &t, &dm, &fd, &cm) != 7) {
                fprintf(stderr, "refit bench delta: publisher %u: %s", k, buf[0] ? buf : "no answer\n");
                ok = false;
                continue;
            }
            if (e > enc[v]) enc[v] = e; /* the slowest rank sets the pace */
            if (t > pub[v]) pub[v] = t;
            if (dm > dig[v]) dig[v] = dm;
            if (cm > cpy[v]) cpy[v] = cm;
            from_delta[v] += fd;
            dbytes[v] += n;
            base[v] = b;
        }
        if (!ok) break;
        /* A failed pull (a verification failure among them) is counted, not fatal. */
        nb_send_cmd(&full, "pull %u", v);
        if (!nb_get_result(&full, &rf[v]))
            fprintf(stderr, "refit bench delta: full receiver, version %u: %s\n", v, rf[v].list);
        else verified++;
        nb_send_cmd(&delta, "pull %u", v);
        if (!nb_get_result(&delta, &rd[v]))
            fprintf(stderr, "refit bench delta: delta receiver, version %u: %s\n", v, rd[v].list);
        else verified++;
        if (rf[v].st == -999 || rd[v].st == -999) ok = false; /* no answer: a receiver is gone */
    }
    nb_stop(&full, false);
    nb_stop(&delta, false);
    for (uint32_t k = 0; k < P; k++) nb_stop(&pubs[k], false);
    nb_rm_registry(&o);
    nb_netns_down(&o);
    if (!ok) return tool_fail(REFIT_ERR_PEER, "bench delta");
    /* Steady state: versions 2..V. */
    double tf[32], td[32], te[32], tp[32], tg[32], tc[32];
    uint32_t tables_from_delta = 0;
    uint64_t fb = 0, db = 0;
    bool all_delta = true;
    size_t n = 0;
    for (uint32_t v = 2; v <= V; v++, n++) {
        tf[n] = (rf[v].end - rf[v].begin) * 1e3;
        td[n] = (rd[v].end - rd[v].begin) * 1e3;
        te[n] = enc[v];
        tp[n] = pub[v];
        tg[n] = dig[v];
        tc[n] = cpy[v];
        tables_from_delta += from_delta[v];
        fb += rf[v].bytes;
        db += rd[v].bytes;
        all_delta &= rd[v].delta_base == v - 1 && rf[v].delta_base == 0;
    }
    double full_ms = median_of(tf, n), delta_ms = median_of(td, n), ratio = delta_ms / full_ms;
    /* As verified: the transfer and then the digest check (bench/digest-ab-paths.sh compares with --no-digest). */
    double cf[32], cd[32], dd[32];
    uint32_t dfused = 0;
    uint64_t unverified = 0;
    for (uint32_t v = 2, i = 0; v <= V; v++, i++) {
        cf[i] = (rf[v].end - rf[v].begin) * 1e3 + rf[v].digest_ms; /* tf, td: sorted by median_of */
        cd[i] = (rd[v].end - rd[v].begin) * 1e3 + rd[v].digest_ms;
        dd[i] = rd[v].digest_ms;
        dfused += rd[v].digest_fused != 0;
        unverified += rf[v].unverified + rd[v].unverified;
    }
    double full_checked = median_of(cf, n), delta_checked = median_of(cd, n), delta_digest = median_of(dd, n);
    double wire = (double)db / (double)fb;
    out_t j = {0};
    char extra[96];
    snprintf(extra, sizeof(extra), "\"fraction\":%g,\"versions\":%u,\"threads_per_receiver\":%u", o.delta, V,
             o.threads ? o.threads : 1);
    nb_out_begin(&j, "delta", &o, extra);
    nb_metric(&j, "full_refit_ms", "%.3f", full_ms);
    nb_metric(&j, "delta_refit_ms", "%.3f", delta_ms);
    nb_metric(&j, "time_ratio", "%.4f", ratio);
    nb_metric(&j, "full_refit_bytes", "%" PRIu64, fb / n);
    nb_metric(&j, "delta_wire_bytes", "%" PRIu64, db / n);
    nb_metric(&j, "wire_ratio", "%.4f", wire);
    nb_metric(&j, "full_checked_ms", "%.3f", full_checked);
    nb_metric(&j, "delta_checked_ms", "%.3f", delta_checked);
    nb_metric(&j, "delta_digest_ms", "%.3f", delta_digest);
    nb_metric(&j, "delta_digest_fused_pulls", "%u", dfused);
    nb_metric(&j, "unverified_bytes", "%" PRIu64, unverified);
    nb_metric(&j, "publisher_encode_ms", "%.3f", median_of(te, n));
    nb_metric(&j, "publisher_publish_ms", "%.3f", median_of(tp, n));
    /* Its digest table: the time publish spent on it after the encoder (an update from the encoder's changes,
     * whose notes are in encode_ms; or a fill), and a memcpy of the rank's bytes right after (the slowest rank
     * of each, per version). */
    nb_metric(&j, "publisher_digest_ms", "%.3f", median_of(tg, n));
    nb_metric(&j, "publisher_memcpy_ms", "%.3f", median_of(tc, n));
    nb_metric(&j, "publisher_tables_from_delta", "%u", tables_from_delta);
    fprintf(j.f, ",\"per_version\":[");
    for (uint32_t v = 1; v <= V; v++)
        fprintf(j.f,
                "%s{\"version\":%u,\"offered_base\":%" PRIu64 ",\"delta_bytes_offered\":%" PRIu64
                ",\"encode_ms\":%.3f,\"full\":{\"ms\":%.3f,\"bytes\":%" PRIu64 ",\"verify_ms\":%.1f},"
                "\"delta\":{\"ms\":%.3f,\"bytes\":%" PRIu64 ",\"applied_base\":%" PRIu64 ",\"verify_ms\":%.1f}}",
                v > 1 ? "," : "", v, base[v], dbytes[v], enc[v], (rf[v].end - rf[v].begin) * 1e3, rf[v].bytes,
                rf[v].verify_ms, (rd[v].end - rd[v].begin) * 1e3, rd[v].bytes, rd[v].delta_base, rd[v].verify_ms);
    fprintf(j.f, "]");
    j.nmetrics++;
    char exp[96];
    snprintf(exp, sizeof(exp), "%u (every pull of both receivers verified against the truth)", 2 * V);
    nb_require(&j, "bit_exact", exp, verified, verified == 2 * V);
    nb_require(&j, "deltas_applied", "the delta receiver applied a delta from v-1 for every v >= 2 (1 = yes)",
               all_delta ? 1 : 0, all_delta);
    nb_require(&j, "wire_bytes_ratio", "<= 0.05", wire, wire <= 0.05);
    nb_check(&j, "time_ratio", "<= 0.15", ratio, "<=", 0.15);
    return nb_out_end(
        &j, net ? "each process a node (network namespace, tbf at link_mbps on both directions), UCX/TCP; "
                  "times from the discovery round that found the version to the data in place (verification "
                  "after, not timed); full and delta receivers pull one after the other."
                : "shm on one host: a full refit is a memory copy here, and the delta's scattered writes into "
                  "the receiver's memory cost a fair share of it, so the time ratio stays far above the wire "
                  "ratio; over a link it follows the bytes.");
}

/* ---- FP8 through the engine -------------------------------------------------- */

/* Node 0 is the trainer's host: the bf16 publishers and one FP8 relay per
 * bf16 rank of --dst (reading the publishers over shm, quantizing, publishing
 * in group "fp8").  Node 1 holds a receiver of rank 0's FP8 arena, node 2 a
 * bf16 receiver of the same rank; per version the bf16 receiver pulls, then
 * the relays step, then the FP8 receiver pulls, each with the links to
 * itself.  Every FP8 byte is checked against a quantization of the truth
 * made in the receiver's process. */
static int fp8_net_once(int argc, char **argv)
{
    nb_opts_t o;
    int rc = nb_parse(argc, argv, &o, "megatron:ep=2", "vllm:tp=2", 1, 0);
    if (rc) return rc;
    if (!strcmp(o.model, "qwen3-30b-a3b-mini")) o.model = "qwen3-fp8-mini"; /* head_dim 32 cuts FP8 blocks */
    if (!o.versions) o.versions = 2;
    if (o.versions > 30) return tool_usage("bench", "--versions is 1..30");
    o.verify = true;
    o.receivers = 2;
    bool net = !strcmp(o.net, "netns");
    uint32_t P = nb_world_of(o.src), W = nb_world_of(o.dst);
    if (!P || P > 32 || !W || W > 16) return tool_usage("bench", "--src is 1..32 ranks, --dst 1..16");
    { /* A layout that cuts FP8 blocks: say so before starting anything. */
        refit_manifest_t *m;
        refit_fp8_target_t *t;
        refit_status_t st = refit_manifest_for_rank(o.model, o.dst, 0, &m);
        if (!st) {
            st = refit_fp8_target_create(m, &t);
            refit_fp8_target_destroy(t);
            refit_manifest_destroy(m);
        }
        if (st) return tool_fail(st, "bench fp8");
    }
    if (net) o.pub_transports = "shm,ucx"; /* the relays read the trainer over shm on node 0 */
    if (net && !nb_net_up(&o, "fp8", 3)) return 1;
    nb_fresh_registry(&o);
    child_t pubs[32], relays[16], fp8rx, bfrx;
    for (uint32_t k = 0; k < P; k++)
        pubs[k] = nb_spawn(&o, &(role_t){true, k, -1, NULL, net ? 0 : -1, false, 0, false});
    for (uint32_t k = 0; k < W; k++)
        relays[k] = nb_spawn(&o, &(role_t){false, k, -1, NULL, net ? 0 : -1, false, 1, false});
    fp8rx = nb_spawn(&o, &(role_t){false, 0, -1, NULL, net ? 1 : -1, false, 2, false});
    bfrx = nb_spawn(&o, &(role_t){false, 0, -1, NULL, net ? 2 : -1, false, 0, false});
    uint32_t V = o.versions;
    result_t rb[32], rf[32];
    double relay_ms[32] = {0}, stage_ms[32] = {0};
    uint64_t relay_bf16 = 0, relay_fp8 = 0;
    uint32_t verified = 0;
    bool ok = true;
    char buf[800];
    for (uint32_t v = 1; v <= V && ok; v++) {
        ok = nb_publish_all(pubs, P, v);
        if (!ok) {
            fprintf(stderr, "refit bench fp8: publishing version %u failed\n", v);
            break;
        }
        nb_send_cmd(&bfrx, "pull %u", v);
        if (nb_get_result(&bfrx, &rb[v])) verified++;
        else fprintf(stderr, "refit bench fp8: bf16 receiver, version %u: %s\n", v, rb[v].list);
        for (uint32_t k = 0; k < W; k++) nb_send_cmd(&relays[k], "step %u", v);
        for (uint32_t k = 0; k < W; k++) {
            unsigned long long ver, b16, b8;
            double pm, sm, tm;
            nb_reply(&relays[k], 600000, buf, sizeof(buf));
            if (sscanf(buf, "0 %llu %lf %lf %lf %llu %llu", &ver, &pm, &sm, &tm, &b16, &b8) != 6) {
                fprintf(stderr, "refit bench fp8: relay %u: %s", k, buf[0] ? buf : "no answer\n");
                ok = false;
                continue;
            }
            if (k == 0) {
                relay_ms[v] = pm + sm + tm;
                stage_ms[v] = sm;
                relay_bf16 = b16;
                relay_fp8 = b8;
            }
        }
        if (!ok) break;
        nb_send_cmd(&fp8rx, "pull %u", v);
        if (nb_get_result(&fp8rx, &rf[v])) verified++;
        else fprintf(stderr, "refit bench fp8: FP8 receiver, version %u: %s\n", v, rf[v].list);
        if (rb[v].st == -999 || rf[v].st == -999) ok = false;
    }
    nb_stop(&fp8rx, false);
    nb_stop(&bfrx, false);
    for (uint32_t k = 0; k < W; k++) nb_stop(&relays[k], false);
    for (uint32_t k = 0; k < P; k++) nb_stop(&pubs[k], false);
    nb_rm_registry(&o);
    nb_netns_down(&o);
    if (!ok) return tool_fail(REFIT_ERR_PEER, "bench fp8");
    /* The last version (the first planned and connected). */
    double tb[32], tf[32], tr[32], ts[32];
    size_t n = 0;
    for (uint32_t v = V > 1 ? 2 : 1; v <= V; v++, n++) {
        tb[n] = (rb[v].end - rb[v].begin) * 1e3;
        tf[n] = (rf[v].end - rf[v].begin) * 1e3;
        tr[n] = relay_ms[v];
        ts[n] = stage_ms[v];
    }
    double bf16_ms = median_of(tb, n), fp8_ms = median_of(tf, n), relay = median_of(tr, n);
    double wire = (double)rf[V].bytes / (double)rb[V].bytes;
    out_t j = {0};
    char extra[96];
    snprintf(extra, sizeof(extra), "\"versions\":%u,\"relays\":%u", V, W);
    nb_out_begin(&j, "fp8", &o, extra);
    nb_metric(&j, "bf16_pull_ms", "%.3f", bf16_ms);
    nb_metric(&j, "fp8_pull_ms", "%.3f", fp8_ms);
    nb_metric(&j, "relay_step_ms", "%.3f", relay);
    nb_metric(&j, "relay_stage_ms", "%.3f", median_of(ts, n));
    nb_metric(&j, "fp8_end_to_end_ms", "%.3f", relay + fp8_ms);
    nb_metric(&j, "bf16_wire_bytes", "%" PRIu64, rb[V].bytes);
    nb_metric(&j, "fp8_wire_bytes", "%" PRIu64, rf[V].bytes);
    nb_metric(&j, "relay_bf16_bytes", "%" PRIu64, relay_bf16);
    nb_metric(&j, "relay_fp8_arena_bytes", "%" PRIu64, relay_fp8);
    nb_metric(&j, "wire_ratio", "%.4f", wire);
    nb_metric(&j, "fp8_pull_time_ratio", "%.4f", fp8_ms / bf16_ms);
    char exp[96];
    snprintf(exp, sizeof(exp), "%u (bf16 pulls verified against the truth, FP8 pulls against its quantization)", 2 * V);
    nb_require(&j, "fp8_bits_exact", exp, verified, verified == 2 * V);
    nb_require(&j, "wire_carries_fp8", "< 0.6 (fp8 bytes and scales over the link, not bf16)", wire, wire < 0.6);
    return nb_out_end(&j,
                      net ? "node 0 holds the trainer ranks and the FP8 relays (bf16 read over shm there), the FP8 and "
                            "bf16 receivers are nodes of their own behind tbf at link_mbps, UCX/TCP; fp8_end_to_end is "
                            "the relay's step (pull, quantize, publish) plus the FP8 pull."
                          : "shm on one host: relays, receivers and publishers share the CPUs; the wire ratio is the "
                            "figure that carries over to a network.");
}

/* ---- entry points (bench.h) ---- */

int bench_delta_net(int argc, char **argv) { return nb_repeat("delta", delta_net_once, argc, argv, 5); }

int bench_fp8_net(int argc, char **argv) { return nb_repeat("fp8", fp8_net_once, argc, argv, 1); }
