/* refit publish, refit pull and refit demo: the runtime from the command line.
 *
 * publish and pull run one rank each and print one JSON object per version
 * on stdout; demo starts P publishers and R receivers as child processes of
 * this very binary, drives K refit cycles, and prints a table (or --json). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tool.h"

typedef struct {
    const char *model, *layout, *registry, *job, *group, *transports, *topts, *reader;
    const char *from_st, *dump; /* publish --from-safetensors DIR, pull --dump DIR */
    uint64_t rank, versions, first, acks, timeout_ms, threads, hold_ms, lease_ms, dead_ms;
    int device; /* -1: host memory */
    bool snapshot, json, verify, newest, no_delta, no_digest, prepare, fp8;
    bool acks_set, hold_set; /* --acks, --hold-ms given (publish: acks default to 1 without either) */
    double delta; /* publish: delta mode, this share of elements changing per version; pull: the truth's share */
} rt_opts_t;

enum {
    O_MODEL = 1,
    O_LAYOUT,
    O_RANK,
    O_REGISTRY,
    O_JOB,
    O_GROUP,
    O_TRANSPORTS,
    O_TOPTS,
    O_MODE,
    O_VERSIONS,
    O_FIRST,
    O_ACKS,
    O_TIMEOUT,
    O_JSON,
    O_VERIFY,
    O_THREADS,
    O_HOLD,
    O_NEWEST,
    O_READER,
    O_LEASE,
    O_DEAD,
    O_DEVICE,
    O_FROM_ST,
    O_DUMP,
    O_DELTA,
    O_NO_DELTA,
    O_NO_DIGEST,
    O_PREPARE,
    O_FP8
};

static const struct option g_rt_opts[] = {{"model", required_argument, 0, O_MODEL},
                                          {"layout", required_argument, 0, O_LAYOUT},
                                          {"rank", required_argument, 0, O_RANK},
                                          {"registry", required_argument, 0, O_REGISTRY},
                                          {"job", required_argument, 0, O_JOB},
                                          {"group", required_argument, 0, O_GROUP},
                                          {"transports", required_argument, 0, O_TRANSPORTS},
                                          {"transport-options", required_argument, 0, O_TOPTS},
                                          {"mode", required_argument, 0, O_MODE},
                                          {"versions", required_argument, 0, O_VERSIONS},
                                          {"first", required_argument, 0, O_FIRST},
                                          {"acks", required_argument, 0, O_ACKS},
                                          {"timeout-ms", required_argument, 0, O_TIMEOUT},
                                          {"json", no_argument, 0, O_JSON},
                                          {"verify", no_argument, 0, O_VERIFY},
                                          {"threads", required_argument, 0, O_THREADS},
                                          {"hold-ms", required_argument, 0, O_HOLD},
                                          {"newest", no_argument, 0, O_NEWEST},
                                          {"reader", required_argument, 0, O_READER},
                                          {"lease-ms", required_argument, 0, O_LEASE},
                                          {"dead-ms", required_argument, 0, O_DEAD},
                                          {"device", required_argument, 0, O_DEVICE},
                                          {"from-safetensors", required_argument, 0, O_FROM_ST},
                                          {"dump", required_argument, 0, O_DUMP},
                                          {"delta", required_argument, 0, O_DELTA},
                                          {"no-delta", no_argument, 0, O_NO_DELTA},
                                          {"no-digest", no_argument, 0, O_NO_DIGEST},
                                          {"prepare", no_argument, 0, O_PREPARE},
                                          {"fp8", no_argument, 0, O_FP8},
                                          {0, 0, 0, 0}};

static int parse_rt(const char *cmd, int argc, char **argv, rt_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->versions = 1;
    o->first = 1;
    o->timeout_ms = 60000;
    o->device = -1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", g_rt_opts, NULL)) != -1) {
        uint64_t *num = NULL;
        switch (c) {
        case O_MODEL: o->model = optarg; break;
        case O_LAYOUT: o->layout = optarg; break;
        case O_REGISTRY: o->registry = optarg; break;
        case O_JOB: o->job = optarg; break;
        case O_GROUP: o->group = optarg; break;
        case O_TRANSPORTS: o->transports = optarg; break;
        case O_TOPTS: o->topts = optarg; break;
        case O_READER: o->reader = optarg; break;
        case O_FROM_ST: o->from_st = optarg; break;
        case O_DUMP: o->dump = optarg; break;
        case O_MODE:
            if (!strcmp(optarg, "snapshot")) o->snapshot = true;
            else if (strcmp(optarg, "in-place")) return tool_usage(cmd, "--mode is in-place or snapshot");
            break;
        case O_DELTA: {
            char *end;
            o->delta = strtod(optarg, &end);
            if (*end || !(o->delta > 0 && o->delta < 1))
                return tool_usage(cmd, "--delta takes the share of elements that change per version, in (0, 1)");
            break;
        }
        case O_NO_DELTA: o->no_delta = true; break;
        case O_NO_DIGEST: o->no_digest = true; break;
        case O_PREPARE: o->prepare = true; break;
        case O_FP8: o->fp8 = true; break;
        case O_JSON: o->json = true; break;
        case O_VERIFY: o->verify = true; break;
        case O_NEWEST: o->newest = true; break;
        case O_RANK: num = &o->rank; break;
        case O_VERSIONS: num = &o->versions; break;
        case O_FIRST: num = &o->first; break;
        case O_ACKS: num = &o->acks, o->acks_set = true; break;
        case O_TIMEOUT: num = &o->timeout_ms; break;
        case O_THREADS: num = &o->threads; break;
        case O_HOLD: num = &o->hold_ms, o->hold_set = true; break;
        case O_LEASE: num = &o->lease_ms; break;
        case O_DEAD: num = &o->dead_ms; break;
        case O_DEVICE: {
            uint64_t d;
            if (tool_parse_u64(optarg, &d) || d > 1024) return tool_usage(cmd, "--device takes a CUDA device number");
            o->device = (int)d;
            break;
        }
        default: return tool_usage(cmd, "unknown option");
        }
        if (num && tool_parse_u64(optarg, num)) return tool_usage(cmd, "numeric options take non-negative integers");
    }
    if (optind < argc) return tool_usage(cmd, "unexpected argument");
    if (o->from_st) {
        if (strcmp(cmd, "publish")) return tool_usage(cmd, "--from-safetensors is a publish option");
        if (!o->model) o->model = o->from_st; /* the checkpoint's config.json */
        if (!o->layout) o->layout = "hf";
        if (o->device >= 0) return tool_usage(cmd, "--from-safetensors publishes from host memory (no --device)");
    }
    if (o->dump && strcmp(cmd, "pull")) return tool_usage(cmd, "--dump is a pull option");
    if (o->no_delta && strcmp(cmd, "pull")) return tool_usage(cmd, "--no-delta is a pull option");
    if (o->prepare && strcmp(cmd, "pull")) return tool_usage(cmd, "--prepare is a pull option");
    if (o->fp8 && strcmp(cmd, "pull")) return tool_usage(cmd, "--fp8 is a pull option");
    if (o->fp8 && o->dump) return tool_usage(cmd, "--dump writes bf16 tensors; an --fp8 receiver holds FP8");
    if (o->delta > 0 && (o->from_st || o->device >= 0))
        return tool_usage(cmd, "--delta needs host memory filled with the synthetic truth");
    if (!o->model || !o->layout) return tool_usage(cmd, "--model and --layout are required");
    /* A publisher that waits for no one replaced each version before a
     * receiver could lease it (the receiver: REFIT_ERR_STALE) and exited
     * under the last one's transfer ("died during the transfer"): without
     * --acks or --hold-ms it waits for one receiver to commit each version. */
    if (!strcmp(cmd, "publish") && !o->acks_set && !o->hold_set) o->acks = 1;
    if (o->timeout_ms > INT32_MAX || o->first == 0) return tool_usage(cmd, "bad --timeout-ms or --first");
    return 0;
}

static refit_status_t rank_manifest(const rt_opts_t *o, refit_manifest_t **out)
{
    return refit_manifest_for_rank(o->model, o->layout, (uint32_t)o->rank, out);
}

int cmd_publish(int argc, char **argv)
{
    rt_opts_t o;
    int rc = parse_rt("publish", argc, argv, &o);
    if (rc) return rc;
    refit_status_t st;
    refit_manifest_t *m = NULL;
    refit_publisher_t *p = NULL;
    void *base = NULL;
    refit_hf_source_t *hf = NULL;
    refit_manifest_t *hfm = NULL; /* --from-safetensors with another layout: the checkpoint's own manifest */
    if (o.from_st) {
        refit_model_t *model = NULL;
        if ((st = refit_model_open(o.model, &model))) return tool_fail(st, "model");
        st = refit_hf_source_open(o.from_st, model, &hf, &m);
        refit_model_destroy(model);
        if (st) return tool_fail(st, "safetensors");
        if (strcmp(o.layout, "hf") != 0) {
            /* A rank of another layout: its manifest, filled below from the
             * mapped shards by a plan (this rank's boxes only). */
            hfm = m;
            m = NULL;
            if ((st = rank_manifest(&o, &m))) {
                refit_manifest_destroy(hfm);
                refit_hf_source_close(hf);
                return tool_fail(st, "manifest");
            }
        } else if (o.rank) {
            refit_manifest_destroy(m);
            refit_hf_source_close(hf);
            return tool_usage("publish", "--layout hf has one rank, 0");
        }
    } else if ((st = rank_manifest(&o, &m))) return tool_fail(st, "manifest");
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = o.registry;
    pp.job = o.job;
    pp.group = o.group;
    pp.transports = o.transports;
    pp.transport_options = o.topts;
    pp.mode = o.snapshot ? REFIT_MODE_SNAPSHOT : REFIT_MODE_IN_PLACE;
    pp.dead_ms = (uint32_t)o.dead_ms;
    pp.device = o.device;
    pp.delta = o.delta > 0;
    pp.no_digest = o.no_digest;
    if ((st = refit_publisher_create(&pp, m, &p))) {
        refit_manifest_destroy(m);
        refit_manifest_destroy(hfm);
        refit_hf_source_close(hf);
        return tool_fail(st, "publisher");
    }
    if (hfm) {
        /* The cut is copied once into the publisher's memory; every version
         * publishes the same bytes. */
        refit_plan_t *plan = NULL;
        refit_plan_params_t pl = REFIT_PLAN_PARAMS_INIT;
        const refit_manifest_t *srcs[1] = {hfm};
        double t0 = refit_now();
        if ((st = refit_publisher_alloc(p, 0, &base)) || (st = refit_plan_create(srcs, 1, m, &pl, &plan))) {
            rc = tool_fail(st, "plan from the checkpoint");
            goto out;
        }
        uint32_t nr = refit_hf_source_num_regions(hf);
        const void **rb = calloc(nr ? nr : 1, sizeof(*rb));
        if (!rb) {
            refit_plan_destroy(plan);
            rc = tool_fail(REFIT_ERR_NO_MEMORY, "plan from the checkpoint");
            goto out;
        }
        for (uint32_t r = 0; r < nr; r++) rb[r] = refit_hf_source_region(hf, r);
        const void *const *sb[1] = {rb};
        void *db[1] = {base};
        st = refit_plan_execute_memcpy(plan, sb, db, 0);
        refit_plan_stats_t ps = REFIT_PLAN_STATS_INIT;
        refit_plan_stats(plan, &ps);
        free(rb);
        refit_plan_destroy(plan);
        if (st) {
            rc = tool_fail(st, "copying from the checkpoint");
            goto out;
        }
        if (!o.json)
            printf("rank %" PRIu64 " of %s: %" PRIu64 " bytes cut from %s in %.1f ms\n", o.rank, o.layout,
                   ps.bytes_written, o.from_st, (refit_now() - t0) * 1e3);
    } else if (hf) {
        /* Cold start from disk: the mapped shard files are the regions, read
         * by the transports where they lie; every version publishes the
         * same bytes. */
        for (uint32_t r = 0; r < refit_hf_source_num_regions(hf); r++)
            if ((st = refit_publisher_attach(p, r, refit_hf_source_region(hf, r)))) {
                rc = tool_fail(st, "attach");
                goto out;
            }
    } else if ((st = refit_publisher_alloc(p, 0, &base))) {
        rc = tool_fail(st, "memory");
        goto out;
    }
    for (uint64_t v = o.first; v < o.first + o.versions; v++) {
        double t0 = refit_now();
        if (hf) st = REFIT_OK; /* the checkpoint's bytes, mapped or cut above */
        else if (o.device >= 0 && (refit_features() & REFIT_FEATURE_CUDA))
            st = refit_gpu_truth_fill(m, o.device, &base, v);
        else if (o.delta > 0) st = refit_truth_fill_delta(m, &base, v, o.delta);
        else st = refit_truth_fill(m, &base, v); /* m is owned by p and lives as long */
        if (st) {
            rc = tool_fail(st, "fill");
            goto out;
        }
        double t1 = refit_now();
        if ((st = refit_publisher_publish(p, v))) {
            rc = tool_fail(st, "publish");
            goto out;
        }
        double t2 = refit_now();
        refit_publish_delta_t d = REFIT_PUBLISH_DELTA_INIT;
        if (o.delta > 0) refit_publisher_last_delta(p, &d);
        if (o.json)
            printf("{\"event\":\"published\",\"rank\":%" PRIu64 ",\"version\":%" PRIu64
                   ",\"fill_ms\":%.3f,\"publish_ms\":%.3f,\"at_s\":%.6f,\"delta_base\":%" PRIu64
                   ",\"delta_bytes\":%" PRIu64
                   ",\"delta_encode_ms\":%.3f,\"digest_ms\":%.3f,\"digest_table\":\"%s\"}\n",
                   o.rank, v, (t1 - t0) * 1e3, (t2 - t1) * 1e3, t2, d.base_version, d.bytes, d.encode_ms,
                   refit_publisher_digest_ms(p),
                   o.no_digest          ? "off"
                   : d.table_from_delta ? "delta"
                                        : "pass");
        else if (d.base_version)
            printf("rank %" PRIu64 " published version %" PRIu64 " (fill %.1f ms, publish %.2f ms; delta from %" PRIu64
                   ": %" PRIu64 " bytes, encoded in %.1f ms)\n",
                   o.rank, v, (t1 - t0) * 1e3, (t2 - t1) * 1e3, d.base_version, d.bytes, d.encode_ms);
        else
            printf("rank %" PRIu64 " published version %" PRIu64 " (fill %.1f ms, publish %.2f ms)\n", o.rank, v,
                   (t1 - t0) * 1e3, (t2 - t1) * 1e3);
        fflush(stdout);
        if (o.acks && (st = refit_publisher_wait_acks(p, v, (uint32_t)o.acks, (int)o.timeout_ms))) {
            if (st == REFIT_ERR_TIMEOUT) {
                char what[512];
                snprintf(what, sizeof(what), "%s", refit_last_error());
                refit_error(st,
                            "%s: --acks %" PRIu64 "%s waits for that many receivers to commit each version (run them "
                            "with the same --job and --registry; more time: --timeout-ms; none: --acks 0)",
                            what, o.acks, o.acks_set ? "" : " (the default without --hold-ms)");
            }
            rc = tool_fail(st, "waiting for receivers");
            goto out;
        }
        if (!o.snapshot && v + 1 < o.first + o.versions &&
            (st = refit_publisher_wait_readers(p, v, (int)o.timeout_ms))) {
            rc = tool_fail(st, "waiting for readers");
            goto out;
        }
    }
    if (o.hold_ms) usleep((useconds_t)(o.hold_ms * 1000));
    /* Receivers still reading the last version (beyond --acks) finish before
     * this process and its memory go. */
    if (o.versions && (st = refit_publisher_wait_readers(p, o.first + o.versions - 1, (int)o.timeout_ms)))
        fprintf(stderr, "refit: publish: exiting while receivers still read version %" PRIu64 ": %s\n",
                o.first + o.versions - 1, refit_last_error());
out:
    refit_publisher_destroy(p);
    refit_manifest_destroy(hfm);
    refit_hf_source_close(hf);
    return rc;
}

int cmd_pull(int argc, char **argv)
{
    rt_opts_t o;
    int rc = parse_rt("pull", argc, argv, &o);
    if (rc) return rc;
    refit_status_t st;
    refit_manifest_t *m = NULL;
    refit_receiver_t *r = NULL;
    void *base;
    if ((st = rank_manifest(&o, &m))) return tool_fail(st, "manifest");
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = o.registry;
    rp.job = o.job;
    rp.group = o.group;
    rp.transports = o.transports;
    rp.transport_options = o.topts;
    rp.reader = o.reader;
    rp.threads = (unsigned)o.threads;
    rp.lease_ms = (uint32_t)o.lease_ms;
    rp.verify = o.verify ? REFIT_VERIFY_TRUTH : REFIT_VERIFY_NONE;
    rp.device = o.device;
    rp.no_delta = o.no_delta;
    rp.no_digest = o.no_digest;
    rp.truth_fraction = o.delta;
    rp.fp8 = o.fp8;
    if ((st = refit_receiver_create(&rp, m, &r))) {
        refit_manifest_destroy(m);
        return tool_fail(st, "receiver");
    }
    if ((st = refit_receiver_alloc(r, 0, &base))) {
        rc = tool_fail(st, "memory");
        goto out;
    }
    if (o.prepare) { /* plan and connect (open IPC handles) before the first pull */
        double ms = 0;
        if ((st = refit_receiver_prepare(r, (int)o.timeout_ms, &ms))) {
            rc = tool_fail(st, "prepare");
            goto out;
        }
        if (o.json) printf("{\"event\":\"prepared\",\"rank\":%" PRIu64 ",\"prepare_ms\":%.3f}\n", o.rank, ms);
        else printf("rank %" PRIu64 " prepared in %.1f ms\n", o.rank, ms);
        fflush(stdout);
    }
    for (uint64_t i = 0; i < o.versions; i++) {
        refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
        uint64_t want = o.newest ? REFIT_VERSION_NEWEST : o.first + i;
        st = refit_receiver_pull(r, want, (int)o.timeout_ms, &rep);
        if (st) {
            if (o.json) {
                printf("{\"event\":\"failed\",\"rank\":%" PRIu64 ",\"status\":\"%s\",\"error\":", o.rank,
                       refit_status_name(st));
                tool_json_string(stdout, refit_last_error());
                printf(",\"usable\":%s,\"committed\":%" PRIu64 "}\n", refit_receiver_usable(r) ? "true" : "false",
                       refit_receiver_committed(r));
                fflush(stdout);
            }
            rc = tool_fail(st, "pull");
            goto out;
        }
        if (o.json) {
            printf(
                "{\"event\":\"pulled\",\"rank\":%" PRIu64 ",\"version\":%" PRIu64 ",\"bytes\":%" PRIu64
                ",\"sources\":%u,\"planned\":%s,\"manifests_read\":%u,\"wait_ms\":%.3f,\"discover_ms\":%.3f,"
                "\"plan_ms\":%.3f,\"transfer_ms\":%.3f,\"verify_ms\":%.3f,\"total_ms\":%.3f,\"verified\":%s,"
                "\"connect_ms\":%.3f,\"requests\":%" PRIu64 ",\"launches\":%" PRIu64
                ",\"begin_s\":%.6f,\"end_s\":%.6f,\"transfer_begin_s\":%.6f,\"device\":%d,\"delta_base\":%" PRIu64
                ",\"digest_ms\":%.3f,\"digest_bytes\":%" PRIu64 ",\"unverified_bytes\":%" PRIu64
                ",\"stamp_ms\":%.3f,\"unstamped_sources\":%u,\"path\":\"%s\",\"digest_fused\":%s,\"transport\":\"%s\","
                "\"lanes\":",
                o.rank, rep.version, rep.bytes, rep.sources, rep.planned ? "true" : "false", rep.manifests_read,
                rep.wait_ms, rep.discover_ms, rep.plan_ms, rep.transfer_ms, rep.verify_ms, rep.total_ms,
                o.verify ? "true" : "false", rep.connect_ms, rep.requests, rep.launches, rep.begin_s, rep.end_s,
                rep.transfer_begin_s, o.device, rep.delta_base, rep.digest_ms, rep.digest_bytes, rep.unverified_bytes,
                rep.stamp_ms, rep.unstamped_sources, refit_rx_path_name((refit_rx_path_t)rep.path),
                rep.digest_fused ? "true" : "false", rep.transport);
            tool_json_string(stdout, rep.lanes);
            printf("}\n");
        } else {
            char how[64] = "";
            if (rep.delta_base) snprintf(how, sizeof(how), " (a delta from %" PRIu64 ")", rep.delta_base);
            printf("rank %" PRIu64 " pulled version %" PRIu64 "%s: %" PRIu64
                   " bytes from %u sources over %s in %.1f ms "
                   "(discover %.2f, plan %.2f, transfer %.1f, verify %.1f)%s\n",
                   o.rank, rep.version, how, rep.bytes, rep.sources, rep.transport, rep.total_ms, rep.discover_ms,
                   rep.plan_ms, rep.transfer_ms, rep.verify_ms, o.verify ? ", verified" : "");
        }
        fflush(stdout);
    }
    if (o.dump && o.device < 0) {
        /* The receiver's local tensors as DIR/rank-R/model.safetensors (as refit plan --dump). */
        char path[4096];
        if ((st = tool_dump_path(o.dump, o.rank, path, sizeof(path)))) {
            rc = tool_fail(st, "pull --dump");
            goto out;
        }
        const void *bases[1] = {base};
        if ((st = refit_safetensors_write(path, m, bases))) {
            rc = tool_fail(st, "dump");
            goto out;
        }
        if (!o.json) printf("rank %" PRIu64 " wrote %s\n", o.rank, path);
    } else if (o.dump) {
        rc = tool_usage("pull", "--dump needs host memory (no --device)");
    }
out:
    refit_receiver_destroy(r);
    return rc;
}
