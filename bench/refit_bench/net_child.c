/* The children of the fleet scenarios: a publisher, an FP8 relay, a receiver,
 * each driven by lines on its command pipe (net.c: nb_spawn). */
#include "net_internal.h"

void child_publisher(const nb_opts_t *o, const role_t *r, FILE *in, int out)
{
    refit_manifest_t *m;
    if (refit_manifest_for_rank(o->model, o->src, r->rank, &m)) _exit(3);
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = o->url;
    pp.job = o->job;
    pp.transports = o->pub_transports ? o->pub_transports : o->transport;
    pp.transport_options = child_topts();
    pp.mode = REFIT_MODE_SNAPSHOT;
    pp.delta = o->delta > 0;
    pp.no_digest = o->no_digest;
    refit_publisher_t *p;
    void *base[64];
    if (refit_publisher_create(&pp, m, &p)) _exit(3);
    for (uint32_t i = 0; i < refit_manifest_num_regions(m); i++)
        if (refit_publisher_alloc(p, i, &base[i])) _exit(3);
    /* Delta: a memcpy of the rank's bytes after each publish, the yardstick of its digest table's cost. */
    uint64_t shard = 0;
    for (uint32_t i = 0; i < refit_manifest_num_regions(m); i++)
        if (refit_manifest_region_size(m, i) > shard) shard = refit_manifest_region_size(m, i);
    void *scratch = o->delta > 0 ? malloc(shard ? shard : 1) : NULL;
    if (o->delta > 0 && !scratch) _exit(3);
    if (scratch) memset(scratch, 1, shard);
    char line[128];
    while (fgets(line, sizeof(line), in)) {
        unsigned long long v;
        refit_status_t st = REFIT_OK;
        double publish_ms = 0, copy_ms = 0;
        if (sscanf(line, "publish %llu", &v) == 1) {
            /* The truth costs seconds per GB to compute: only when receivers
             * verify, or when only a share of it changes (delta). */
            if (o->delta > 0) st = refit_truth_fill_delta(m, base, v, o->delta);
            else if (o->verify) st = refit_truth_fill(m, base, v);
            else
                for (uint32_t i = 0; i < refit_manifest_num_regions(m); i++)
                    memset(base[i], (int)(v & 0xff), refit_manifest_region_size(m, i));
            double t0 = refit_now();
            if (!st) st = refit_publisher_publish(p, v);
            publish_ms = (refit_now() - t0) * 1e3;
            t0 = refit_now();
            for (uint32_t i = 0; scratch && i < refit_manifest_num_regions(m); i++)
                memcpy(scratch, base[i], refit_manifest_region_size(m, i));
            copy_ms = (refit_now() - t0) * 1e3;
        } else if (line[0] == 'q') {
            break;
        }
        char buf[600];
        refit_publish_delta_t d = REFIT_PUBLISH_DELTA_INIT;
        int n = snprintf(buf, sizeof(buf), "%d %s\n", (int)st, st ? refit_last_error() : "");
        if (!st && o->delta > 0 && !refit_publisher_last_delta(p, &d))
            n = snprintf(buf, sizeof(buf), "0 %" PRIu64 " %" PRIu64 " %.3f %.3f %.3f %u %.3f\n", d.base_version,
                         d.bytes, d.encode_ms, publish_ms, refit_publisher_digest_ms(p), d.table_from_delta, copy_ms);
        if (write(out, buf, (size_t)n) != n) _exit(4);
    }
    free(scratch);
    refit_publisher_destroy(p);
    _exit(0);
}

/* REFIT_OK if the FP8 arena equals the quantization of version v's truth. */
static refit_status_t fp8_check(const refit_manifest_t *bf16, const refit_fp8_target_t *t, const void *arena,
                                uint64_t v)
{
    uint64_t n = refit_fp8_target_bytes(t);
    void *img = calloc(1, refit_manifest_region_size(bf16, 0));
    unsigned char *want = calloc(1, n);
    refit_status_t st = img && want ? REFIT_OK : refit_error(REFIT_ERR_NO_MEMORY, "fp8 check");
    if (!st) st = refit_truth_fill(bf16, &img, v);
    if (!st) st = refit_fp8_stage(t, img, want, 1);
    if (!st && memcmp(arena, want, n)) {
        uint64_t i = 0;
        while (i < n && ((const unsigned char *)arena)[i] == want[i]) i++;
        st = refit_error(REFIT_ERR_VERIFY, "the FP8 arena differs from the reference at byte %" PRIu64, i);
    }
    free(img);
    free(want);
    return st;
}

/* FP8 relay child: "step V" answers "status version pull_ms stage_ms publish_ms bf16_bytes fp8_bytes". */
void child_fp8_relay(const nb_opts_t *o, const role_t *r, FILE *in, int out)
{
    refit_manifest_t *m;
    if (refit_manifest_for_rank(o->model, o->dst, r->rank, &m)) _exit(3);
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = o->url;
    rp.job = o->job;
    rp.transports = "shm"; /* next to the trainer */
    rp.threads = 1;
    rp.verify = REFIT_VERIFY_NONE; /* the FP8 receiver checks the end result against the truth */
    char reader[48];
    snprintf(reader, sizeof(reader), "fp8relay%u", r->rank);
    rp.reader = reader;
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = o->url;
    pp.job = o->job;
    pp.group = "fp8";
    pp.transports = o->transport;
    pp.transport_options = child_topts();
    refit_fp8_relay_t *x;
    if (refit_fp8_relay_create(&rp, &pp, m, &x)) {
        char buf[600];
        int n = snprintf(buf, sizeof(buf), "fail %s\n", refit_last_error());
        if (write(out, buf, (size_t)n) != n) _exit(4);
        _exit(3);
    }
    if (write(out, "ready\n", 6) != 6) _exit(4);
    char line[128];
    while (fgets(line, sizeof(line), in)) {
        unsigned long long v;
        if (line[0] == 'q') break;
        if (sscanf(line, "step %llu", &v) != 1) continue;
        refit_fp8_relay_report_t rep = REFIT_FP8_RELAY_REPORT_INIT;
        refit_status_t st = refit_fp8_relay_step(x, v, 120000, &rep);
        char buf[700];
        int n = st ? snprintf(buf, sizeof(buf), "%d %s\n", (int)st, refit_last_error())
                   : snprintf(buf, sizeof(buf), "0 %" PRIu64 " %.3f %.3f %.3f %" PRIu64 " %" PRIu64 "\n", rep.version,
                              rep.pull_ms, rep.stage_ms, rep.publish_ms, rep.bf16_bytes, rep.fp8_bytes);
        if (write(out, buf, (size_t)n) != n) _exit(4);
    }
    refit_fp8_relay_destroy(x);
    _exit(0);
}

/* Receiver child: "pull V" (0: newest) answers one line:
 *   status version begin end transfer_ms trainer_bytes relay_bytes bytes holders early ahead late
 *   delta_base verify_ms digest_ms digest_fused unverified_bytes "name=bytes,..."
 * (early: chunks read from relays still receiving the version; ahead: of
 * those, asked for before the relay had them; late: such requests not
 * answered in time). */
void child_receiver(const nb_opts_t *o, const role_t *r, FILE *in, int out)
{
    if (r->throttle) setenv("REFIT_TEST_THROTTLE", r->throttle, 1);
    refit_manifest_t *m, *bf16 = NULL;
    refit_fp8_target_t *target = NULL;
    if (refit_manifest_for_rank(o->model, o->dst, r->rank, &m)) _exit(3);
    if (r->fp8 == 2) { /* the FP8 arena of that bf16 rank */
        bf16 = m;
        if (refit_fp8_target_create(bf16, &target) || refit_fp8_target_manifest(target, bf16, &m)) _exit(3);
    }
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = o->url;
    rp.job = o->job;
    rp.group = r->fp8 == 2 ? "fp8" : NULL;
    rp.transports = o->transport;
    rp.transport_options = child_topts();
    rp.threads = o->threads ? o->threads : 1;
    rp.verify = o->verify && !r->fp8 ? REFIT_VERIFY_TRUTH : REFIT_VERIFY_NONE;
    rp.relay_slot = r->slot;
    rp.max_readers = o->max_readers;
    rp.chunk_kb = o->chunk_kb;
    rp.relay_heartbeat_ms = 100;
    rp.no_delta = r->no_delta;
    rp.truth_fraction = o->delta;
    rp.no_digest = o->no_digest;
    refit_receiver_t *rc;
    void *base;
    if (refit_receiver_create(&rp, m, &rc)) _exit(3);
    /* An inference engine's weights are resident before it pulls (loaded, or
     * dummy-initialized): the memory is touched here, in the node's start-up,
     * not by the first pull's page faults. */
    for (uint32_t i = 0; i < refit_manifest_num_regions(m); i++) {
        if (refit_receiver_alloc(rc, i, &base)) _exit(3);
        memset(base, 0, refit_manifest_region_size(m, i)); /* host memory: rp.device is not set */
    }
    /* A node joining a running job gets ready while its engine starts
     * (refit/engine.h): the world's manifests read and the plan made before
     * it needs weights.  60 s: the sources have published by then here. */
    if (r->prepare && refit_receiver_prepare(rc, 60000, NULL)) _exit(3);
    if (write(out, "ready\n", 6) != 6) _exit(4);
    char line[128];
    while (fgets(line, sizeof(line), in)) {
        unsigned long long v;
        if (line[0] == 'q') break;
        if (sscanf(line, "pull %llu", &v) != 1) continue;
        refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
        /* 600 s: the straggler scenario's slowed receiver needs ~120 s at its 2.5 MB/s (120 s was its
         * deadline, and a run 2% slower failed). */
        refit_status_t st = refit_receiver_pull(rc, v ? v : REFIT_VERSION_NEWEST, 600000, &rep);
        if (!st && target && o->verify) { /* every byte against a quantization of the truth done here */
            double t0 = refit_now();
            st = fp8_check(bf16, target, base, rep.version);
            rep.verify_ms = (refit_now() - t0) * 1e3;
        }
        refit_holder_stat_t hs[32] = {REFIT_HOLDER_STAT_INIT};
        size_t nh = 0;
        if (refit_receiver_holders(rc, hs, 32, &nh)) nh = 0;
        uint64_t tb = 0, rb = 0, early = 0, ahead = 0, late = 0;
        char list[1024] = "";
        size_t pos = 0;
        for (size_t i = 0; i < nh && i < 32; i++) {
            if (!strncmp(hs[i].name, "trainer:", 8)) tb += hs[i].bytes;
            else rb += hs[i].bytes;
            early += hs[i].early;
            ahead += hs[i].ahead;
            late += hs[i].late;
            if (pos < sizeof(list) - 64)
                pos += (size_t)snprintf(list + pos, sizeof(list) - pos, "%s%s=%" PRIu64 "%s", pos ? "," : "",
                                        hs[i].name, hs[i].bytes, hs[i].failed ? "!" : "");
        }
        char buf[1400];
        int n = snprintf(buf, sizeof(buf),
                         "%d %" PRIu64 " %.6f %.6f %.3f %" PRIu64 " %" PRIu64 " %" PRIu64 " %zu %" PRIu64 " %" PRIu64
                         " %" PRIu64 " %" PRIu64 " %.3f %.3f %d %" PRIu64 " %s\n",
                         (int)st, rep.version, rep.begin_s, rep.end_s, rep.transfer_ms, tb, rb, rep.bytes, nh, early,
                         ahead, late, rep.delta_base, rep.verify_ms, rep.digest_ms, rep.digest_fused ? 1 : 0,
                         rep.unverified_bytes, list[0] ? list : "-");
        if (st) n = snprintf(buf, sizeof(buf), "%d 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 %s\n", (int)st, refit_last_error());
        for (char *c = buf; *c && c < buf + n - 1; c++)
            if (*c == '\n') *c = ' ';
        if (write(out, buf, (size_t)n) != n) _exit(4);
    }
    refit_receiver_destroy(rc);
    refit_fp8_target_destroy(target);
    refit_manifest_destroy(bf16);
    _exit(0);
}
