/* The described cluster: its numbers, parsed from "key=value,..." or JSON.
 *
 * Rates are what each wire carries per direction.  The protocol's overhead
 * is derived, not fitted: over TCP each segment of mtu - 52 payload bytes
 * (IPv4 20 + TCP 20 + timestamps 12) costs mtu + l2 wire bytes (l2: 14 for
 * the Ethernet header a tc qdisc counts on a veth, 38 on a physical port with
 * preamble, FCS and gap), and every second segment is acknowledged by a
 * 52 + l2 byte frame on the reverse path; over RDMA each mtu payload bytes
 * cost mtu + l2 (l2 26: InfiniBand LRH, BTH, ICRC, VCRC). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"
#include "util/json.h"
#include "util/util.h"

void sim_cluster_defaults(sim_cluster_t *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->name, sizeof(c->name), "default");
    c->gpus = 8;
    c->nics = 8;
    c->nic = 50e9;     /* 400 Gbit/s */
    c->nvlink = 450e9; /* H100/H200 NVLink 4: 900 GB/s both ways */
    c->pcie = 64e9;    /* Gen5 x16 */
    c->spine = 1;
    c->leaf = 32;
    c->proto = SIM_RDMA;
    c->mtu = 4096;
    c->eff = 0;
    c->ack = -1;
    c->rtt = 10e-6;
    c->req_queue = 0;
    c->control = 2e-3;
    c->discover = 0;
    c->plan_s = -1;
    c->connect = 0;
    c->apply_ns = 20;
    c->dst_at = -1;
    c->l2 = -1;
    for (int i = 0; i < SIM_MAX_PLACE; i++) c->src_gpu[i] = c->dst_gpu[i] = -1;
}

/* A rate with its unit: 400Gb / 400Gbit (bits), 50GB, 100MB, 25Mb; plain: GB/s. */
static int parse_rate(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0 || !isfinite(v)) return -1;
    while (*end == ' ') end++;
    double mul = 1e9;
    if (!*end) mul = 1e9;
    else if (!strncmp(end, "Tb", 2)) mul = 1e12 / 8;
    else if (!strncmp(end, "TB", 2)) mul = 1e12;
    else if (!strncmp(end, "Gb", 2)) mul = 1e9 / 8;
    else if (!strncmp(end, "GB", 2)) mul = 1e9;
    else if (!strncmp(end, "Mb", 2)) mul = 1e6 / 8;
    else if (!strncmp(end, "MB", 2)) mul = 1e6;
    else if (!strncmp(end, "KB", 2) || !strncmp(end, "kB", 2)) mul = 1e3;
    else return -1;
    *out = v * mul;
    return 0;
}

/* A time: 10us, 2ms, 0.5s; plain: seconds. */
static int parse_time(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v)) return -1;
    if (!*end || !strcmp(end, "s")) *out = v;
    else if (!strcmp(end, "ms")) *out = v * 1e-3;
    else if (!strcmp(end, "us")) *out = v * 1e-6;
    else if (!strcmp(end, "ns")) *out = v * 1e-9;
    else return -1;
    return 0;
}

/* Bytes: 1MiB, 512KiB, 4096; plain: bytes. */
static int parse_bytes(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0 || !isfinite(v)) return -1;
    if (!*end) *out = v;
    else if (!strcmp(end, "KiB")) *out = v * 1024;
    else if (!strcmp(end, "MiB")) *out = v * 1048576;
    else if (!strcmp(end, "KB")) *out = v * 1e3;
    else if (!strcmp(end, "MB")) *out = v * 1e6;
    else return -1;
    return 0;
}

static int parse_u32(const char *s, uint32_t *out)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (end == s || *end || v > UINT32_MAX) return -1;
    *out = (uint32_t)v;
    return 0;
}

/* "0/0/1" (option strings) into a placement list. */
static int parse_list(const char *s, int32_t *list, uint32_t *n)
{
    uint32_t k = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= (long)SIM_MAX_GPUS || k >= SIM_MAX_PLACE) return -1;
        list[k++] = (int32_t)v;
        p = end;
        if (*p == '/' || *p == ':' || *p == ' ') p++;
        else if (*p) return -1;
    }
    *n = k;
    return 0;
}

/* A count of at most max: an error naming the field, the value and the bound. */
static refit_status_t parse_count(const char *key, const char *val, uint32_t min, uint32_t max, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    if (end == val || *end || val[0] == '-' || errno == ERANGE || v < min)
        return refit_error(REFIT_ERR_INVALID_ARG, "cluster: bad value '%s' for %s (an integer %u..%u)", val, key, min,
                           max);
    if (v > max)
        return refit_error(REFIT_ERR_INVALID_ARG, "cluster: %s = %s is more than the simulator's bound of %u", key, val,
                           max);
    *out = (uint32_t)v;
    return REFIT_OK;
}

static refit_status_t set_key(sim_cluster_t *c, const char *key, const char *val)
{
    int bad = 0;
    if (!strcmp(key, "nodes")) return parse_count(key, val, 0, SIM_MAX_GPUS, &c->nodes);
    if (!strcmp(key, "gpus")) return parse_count(key, val, 1, SIM_MAX_NODE_GPUS, &c->gpus);
    if (!strcmp(key, "nics")) return parse_count(key, val, 1, SIM_MAX_NODE_GPUS, &c->nics);
    if (!strcmp(key, "nvdomain")) return parse_count(key, val, 0, SIM_MAX_GPUS, &c->nvdomain);
    if (!strcmp(key, "leaf")) return parse_count(key, val, 1, SIM_MAX_GPUS, &c->leaf);
    if (!strcmp(key, "dst_at")) {
        uint32_t at = 0;
        if (!strcmp(val, "-1")) { /* the default: after the trainer */
            c->dst_at = -1;
            return REFIT_OK;
        }
        refit_status_t st = parse_count(key, val, 0, SIM_MAX_GPUS - 1, &at);
        if (!st) c->dst_at = at;
        return st;
    }
    if (!strcmp(key, "name")) snprintf(c->name, sizeof(c->name), "%s", val);
    else if (!strcmp(key, "nic")) bad = parse_rate(val, &c->nic) || c->nic <= 0;
    else if (!strcmp(key, "nvlink")) bad = parse_rate(val, &c->nvlink);
    else if (!strcmp(key, "pcie")) bad = parse_rate(val, &c->pcie);
    else if (!strcmp(key, "spine")) c->spine = atof(val), bad = !(c->spine >= 0);
    else if (!strcmp(key, "proto")) {
        if (!strcmp(val, "rdma")) c->proto = SIM_RDMA;
        else if (!strcmp(val, "tcp")) c->proto = SIM_TCP;
        else bad = 1;
    } else if (!strcmp(key, "mtu")) bad = parse_u32(val, &c->mtu) || c->mtu < 576;
    else if (!strcmp(key, "l2")) c->l2 = atof(val), bad = !(c->l2 >= 0);
    else if (!strcmp(key, "eff")) c->eff = atof(val), bad = !(c->eff > 0 && c->eff <= 1);
    else if (!strcmp(key, "ack")) c->ack = atof(val), bad = !(c->ack >= 0);
    else if (!strcmp(key, "rtt")) bad = parse_time(val, &c->rtt);
    else if (!strcmp(key, "req_queue")) bad = parse_bytes(val, &c->req_queue);
    else if (!strcmp(key, "control")) bad = parse_time(val, &c->control);
    else if (!strcmp(key, "discover")) bad = parse_time(val, &c->discover);
    else if (!strcmp(key, "plan")) bad = parse_time(val, &c->plan_s);
    else if (!strcmp(key, "connect")) bad = parse_time(val, &c->connect);
    else if (!strcmp(key, "first")) c->first = atoi(val) != 0;
    else if (!strcmp(key, "apply_ns")) c->apply_ns = atof(val), bad = !(c->apply_ns >= 0);
    else if (!strcmp(key, "src_gpus")) bad = parse_list(val, c->src_gpu, &c->nsrc_gpu);
    else if (!strcmp(key, "dst_gpus")) bad = parse_list(val, c->dst_gpu, &c->ndst_gpu);
    else return refit_error(REFIT_ERR_INVALID_ARG, "cluster: unknown key '%s'", key);
    if (bad && (!strcmp(key, "src_gpus") || !strcmp(key, "dst_gpus")))
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "cluster: bad value '%s' for %s (at most %d GPU indices, each below the simulator's "
                           "bound of %u GPUs)",
                           val, key, SIM_MAX_PLACE, SIM_MAX_GPUS);
    if (bad) return refit_error(REFIT_ERR_INVALID_ARG, "cluster: bad value '%s' for %s", val, key);
    return REFIT_OK;
}

static refit_status_t apply_json(sim_cluster_t *c, const char *text)
{
    refit_json_t *root = NULL;
    refit_status_t st = refit_json_parse(text, strlen(text), &root);
    if (st) return st;
    if (refit_json_type(root) != REFIT_JSON_OBJECT) {
        refit_json_free(root);
        return refit_error(REFIT_ERR_INVALID_ARG, "cluster: JSON must be an object");
    }
    for (size_t i = 0; i < refit_json_len(root) && !st; i++) {
        const char *key = refit_json_key(root, i, NULL);
        const refit_json_t *v = refit_json_at(root, i);
        char buf[256];
        double d;
        if (refit_json_type(v) == REFIT_JSON_STRING) {
            snprintf(buf, sizeof(buf), "%s", refit_json_string(v, NULL));
        } else if (refit_json_double(v, &d)) {
            snprintf(buf, sizeof(buf), "%.17g", d);
        } else if (refit_json_type(v) == REFIT_JSON_BOOL) {
            bool b = false;
            refit_json_bool(v, &b);
            snprintf(buf, sizeof(buf), "%d", b ? 1 : 0);
        } else if (refit_json_type(v) == REFIT_JSON_ARRAY) {
            size_t pos = 0;
            buf[0] = '\0';
            for (size_t k = 0; k < refit_json_len(v) && pos < sizeof(buf) - 16; k++) {
                int64_t x;
                if (!refit_json_int(refit_json_at(v, k), &x)) {
                    st = refit_error(REFIT_ERR_INVALID_ARG, "cluster: %s must hold integers", key);
                    break;
                }
                pos += (size_t)snprintf(buf + pos, sizeof(buf) - pos, "%s%lld", k ? "/" : "", (long long)x);
            }
        } else {
            st = refit_error(REFIT_ERR_INVALID_ARG, "cluster: %s: unsupported value", key);
        }
        if (!st) st = set_key(c, key, buf);
    }
    refit_json_free(root);
    return st;
}

refit_status_t sim_cluster_apply(sim_cluster_t *c, const char *text)
{
    if (!text || !*text) return REFIT_OK;
    const char *p = text;
    while (*p == ' ' || *p == '\n' || *p == '\t') p++;
    if (*p == '{') return apply_json(c, p);
    char *copy = strdup(text);
    if (!copy) return refit_error(REFIT_ERR_NO_MEMORY, "cluster");
    refit_status_t st = REFIT_OK;
    char *save = NULL;
    for (char *kv = strtok_r(copy, ",", &save); kv && !st; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            st = refit_error(REFIT_ERR_INVALID_ARG, "cluster: '%s' is not key=value", kv);
            break;
        }
        *eq = '\0';
        st = set_key(c, kv, eq + 1);
    }
    free(copy);
    return st;
}

void sim_cluster_finish(sim_cluster_t *c)
{
    double l2 = c->l2 >= 0 ? c->l2 : c->proto == SIM_TCP ? 38 : 26;
    if (c->eff <= 0) {
        if (c->proto == SIM_TCP) c->eff = (double)(c->mtu - 52) / ((double)c->mtu + l2);
        else c->eff = (double)c->mtu / ((double)c->mtu + l2);
    }
    if (c->ack < 0) c->ack = c->proto == SIM_TCP ? (52.0 + l2) / (2.0 * (double)(c->mtu - 52)) : 0;
    if (!c->nvdomain) c->nvdomain = c->gpus;
    if (c->nics > c->gpus) c->nics = c->gpus;
}

static void rate_str(double r, char *buf, size_t n)
{
    if (r >= 1e9) snprintf(buf, n, "%.4g GB/s", r / 1e9);
    else snprintf(buf, n, "%.4g MB/s", r / 1e6);
}

void sim_cluster_describe(const sim_cluster_t *c, char *buf, size_t n)
{
    char nic[32], nvl[32], pcie[32];
    rate_str(c->nic, nic, sizeof(nic));
    rate_str(c->nvlink, nvl, sizeof(nvl));
    rate_str(c->pcie, pcie, sizeof(pcie));
    snprintf(buf, n,
             "%s: %u GPU(s)/node, %u NIC(s)/node at %s (%.0f Gbit/s) each way, %s, MTU %u (payload %.2f%%%s), "
             "NVLink %s per GPU in domains of %u, PCIe %s, spine %s, rtt %.0f us%s",
             c->name, c->gpus, c->nics, nic, c->nic * 8 / 1e9, c->proto == SIM_TCP ? "TCP" : "RDMA", c->mtu,
             c->eff * 100, c->ack > 0 ? ", acks on the reverse path" : "", c->nvlink > 0 ? nvl : "none", c->nvdomain,
             c->pcie > 0 ? pcie : "unlimited", c->spine > 1 ? "oversubscribed" : "non-blocking", c->rtt * 1e6,
             c->first ? ", first pull" : "");
}
