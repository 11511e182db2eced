/* UCX over TCP against a plain TCP stream, between two network namespaces.
 *
 *   bench_ucx_tcp [--size BYTES] [--reps N] [--rows RUN] [--ucx-opts OPTS] [--pub-opts OPTS]
 *                 [--loopback | --mbps RATE]
 *
 * (root; makes two namespaces on a bridge, 10.77.0.1 and 10.77.0.2, with
 * tools/common/tool_netns.h, deleted at the end; with --loopback every
 * process runs in the first namespace and both streams go over its
 * 127.0.0.1; with --mbps both veth ports are shaped by tbf to RATE MB/s,
 * 1e6 bytes/s).  In the same run it measures
 *   (a) a plain TCP stream: one socket, SIZE bytes from a buffer in the
 *       first namespace into a buffer in the second (default kernel
 *       settings), and
 *   (b) refit's ucx pull of the same SIZE bytes (one plan region), the
 *       publisher in the first namespace, the receiver in the second,
 * each repeated REPS times (default 3), alternating (a) and (b) so that
 * other load on the host hits both alike, and prints the medians as JSON:
 *   {"tcp_gbps":..,"ucx_gbps":..,"ratio":..,"lanes":..,...}
 * With --rows RUN, (b) pulls a strided plan instead: rows of RUN bytes every
 * 2*RUN bytes of the source, packed in the destination (half the bytes; a
 * tensor-parallel column slice), and ucx_gbps counts the bytes moved.
 * Both sides' buffers are faulted in before timing; GB/s are 1e9 bytes/s.
 * "tcp_cc" names the namespaces' TCP congestion control (the host's default,
 * inherited; both arms run it).
 * The pulled bytes are checked against the pattern after the last rep.
 *
 * Helper modes (run by the above inside the namespaces):
 *   --tcp-send PORT SIZE REPS | --tcp-recv HOST PORT SIZE REPS
 *   --publish SIZE OPTS        | --pull HEXDESC SIZE OPTS REPS */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "plan/plan.h"
#include "tool_netns.h"
#include "transport/transport.h"
#include "ucx_netns.h"

#define SEED 4242

static void *buffer(uint64_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "mmap %" PRIu64 ": %s\n", size, strerror(errno));
        exit(2);
    }
    return p;
}

static int tcp_send(int port, uint64_t size, int reps)
{
    unsigned char *buf = buffer(size);
    nn_fill(buf, size, SEED);
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (bind(ls, (struct sockaddr *)&a, sizeof(a)) || listen(ls, 4)) {
        perror("tcp-send: bind/listen");
        return 2;
    }
    printf("READY\n");
    fflush(stdout);
    for (int r = 0; r < reps; r++) {
        int s = accept(ls, NULL, NULL);
        if (s < 0) return 2;
        for (uint64_t off = 0; off < size;) {
            ssize_t n = send(s, buf + off, size - off, 0);
            if (n <= 0) return 2;
            off += (uint64_t)n;
        }
        close(s);
    }
    close(ls);
    return 0;
}

/* Waits for the orchestrator's "GO" line before each rep. */
static bool wait_go(void)
{
    char line[16];
    return fgets(line, sizeof(line), stdin) && !strncmp(line, "GO", 2);
}

static int tcp_recv(const char *host, int port, uint64_t size, int reps)
{
    unsigned char *buf = buffer(size);
    printf("READY\n");
    fflush(stdout);
    for (int r = 0; r < reps; r++) {
        if (!wait_go()) return 2;
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, host, &a.sin_addr);
        double t0 = nn_now();
        if (connect(s, (struct sockaddr *)&a, sizeof(a))) {
            perror("tcp-recv: connect");
            return 2;
        }
        uint64_t off = 0;
        while (off < size) {
            ssize_t n = recv(s, buf + off, size - off, 0);
            if (n <= 0) break;
            off += (uint64_t)n;
        }
        double dt = nn_now() - t0;
        close(s);
        if (off != size) return 2;
        printf("TCP %.4f\n", (double)size / dt / 1e9);
        fflush(stdout);
    }
    printf("VERIFY %s\n", nn_check(buf, size, SEED, 0) == UINT64_MAX ? "ok" : "bad");
    return 0;
}

static int publish(uint64_t size, const char *opts)
{
    const refit_transport_ops_t *ops = &refit_transport_ucx;
    refit_transport_t *t;
    void *desc;
    size_t len;
    unsigned char *buf = buffer(size);
    nn_fill(buf, size, SEED);
    if (ops->create(opts, &t) || ops->expose(t, buf, size, &desc, &len)) {
        fprintf(stderr, "publish: %s\n", refit_last_error());
        return 2;
    }
    char *hex = nn_hex(desc, len);
    printf("DESC %s\n", hex);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    ops->unexpose(t, buf);
    ops->destroy(t);
    free(hex);
    free(desc);
    return 0;
}

static int pull(const char *hex, uint64_t size, const char *opts, int reps, uint64_t rows)
{
    const refit_transport_ops_t *ops = &refit_transport_ucx;
    refit_transport_t *t;
    refit_peer_t *peer;
    size_t len;
    void *desc = nn_unhex(hex, &len);
    if (!desc || ops->create(opts, &t) || ops->connect(t, (const void *const[]){desc}, &len, 1, &peer)) {
        fprintf(stderr, "pull: %s\n", refit_last_error());
        return 2;
    }
    unsigned char *buf = buffer(size);
    refit_plan_t *plan = calloc(1, sizeof(*plan));
    plan->nsrcs = 1;
    plan->src_bytes = calloc(1, sizeof(uint64_t));
    refit_plan_region_t r = {.run = size};
    uint64_t moved = size;
    if (rows) {
        r = (refit_plan_region_t){
            .run = rows, .nloops = 1, .count = {size / (2 * rows)}, .src_stride = {2 * rows}, .dst_stride = {rows}};
        moved = r.count[0] * rows;
    }
    if (!plan->src_bytes || REFIT_VEC_PUSH(&plan->regions, r)) return 2;
    printf("READY\n");
    fflush(stdout);
    for (int i = 0; i < reps; i++) {
        if (!wait_go()) return 2;
        refit_pull_stats_t st = {0};
        refit_pull_ctl_t ctl = {.deadline = refit_now() + 120};
        double t0 = nn_now();
        if (ops->pull(t, (refit_peer_t *const[]){peer}, plan, (void *const[]){buf}, &ctl, &st)) {
            fprintf(stderr, "pull: %s\n", refit_last_error());
            return 2;
        }
        double dt = nn_now() - t0;
        printf("UCX %.4f %s\n", (double)moved / dt / 1e9, st.lanes);
        fflush(stdout);
    }
    bool ok = true;
    if (!rows) ok = nn_check(buf, size, SEED, 0) == UINT64_MAX;
    for (uint64_t i = 0; rows && ok && i < r.count[0]; i++)
        ok = nn_check(buf + i * rows, rows, SEED, 2 * rows * i) == UINT64_MAX;
    printf("VERIFY %s\n", ok ? "ok" : "bad");
    refit_plan_destroy(plan);
    ops->disconnect(peer);
    ops->destroy(t);
    free(desc);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static tool_netns_t ns; /* SIGINT and SIGTERM take it down (tool_netns_up) */

int main(int argc, char **argv)
{
    if (argc >= 5 && !strcmp(argv[1], "--tcp-send"))
        return tcp_send(atoi(argv[2]), strtoull(argv[3], NULL, 0), atoi(argv[4]));
    if (argc >= 6 && !strcmp(argv[1], "--tcp-recv"))
        return tcp_recv(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 0), atoi(argv[5]));
    if (argc >= 4 && !strcmp(argv[1], "--publish")) return publish(strtoull(argv[2], NULL, 0), argv[3]);
    if (argc >= 7 && !strcmp(argv[1], "--pull"))
        return pull(argv[2], strtoull(argv[3], NULL, 0), argv[4], atoi(argv[5]), strtoull(argv[6], NULL, 0));

    uint64_t size = 2ull << 30;
    int reps = 3;
    uint64_t rows = 0;
    const char *ucx_opts = "", *pub_opts = "";
    bool loopback = false;
    double mbps = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--size") && i + 1 < argc) size = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--ucx-opts") && i + 1 < argc) ucx_opts = argv[++i];
        else if (!strcmp(argv[i], "--pub-opts") && i + 1 < argc) pub_opts = argv[++i];
        else if (!strcmp(argv[i], "--loopback")) loopback = true;
        else if (!strcmp(argv[i], "--mbps") && i + 1 < argc) mbps = atof(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--size BYTES] [--reps N] [--rows RUN] [--ucx-opts OPTS] [--pub-opts OPTS] "
                    "[--loopback | --mbps RATE]\n",
                    argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 50) reps = 3;
    if (mbps < 0 || (loopback && mbps > 0)) {
        fprintf(stderr, "bench_ucx_tcp: --mbps takes a positive rate and shapes the veth ports, not the loopback\n");
        return 2;
    }
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (sl <= 0) return 2;
    self[sl] = 0;
    char why[128], ns_a[32], ns_b[32], addr_a[32];
    if (!tool_netns_possible(why, sizeof(why)) || !tool_netns_up(&ns, 2, mbps, why, sizeof(why))) {
        fprintf(stderr, "bench_ucx_tcp: cannot make the namespaces: %s\n", why);
        return 2;
    }
    tool_netns_name(&ns, 0, ns_a, sizeof(ns_a));
    tool_netns_name(&ns, loopback ? 0 : 1, ns_b, sizeof(ns_b));
    if (loopback) snprintf(addr_a, sizeof(addr_a), "127.0.0.1");
    else tool_netns_addr(0, addr_a, sizeof(addr_a));
    int rc = 2;
    char sz[32], rp[16], rw[32], line[70000];
    snprintf(rw, sizeof(rw), "%" PRIu64, rows);
    snprintf(sz, sizeof(sz), "%" PRIu64, size);
    snprintf(rp, sizeof(rp), "%d", reps);
    double tcp[50], ucx[50];
    int ntcp = 0, nucx = 0;
    char lanes[256] = "";
    bool verified = true;

    /* Both pairs of processes start; then rep by rep, (a) then (b). */
    nn_child_t snd, rcv, pub, sub;
    nn_spawn(&snd, ns_a, (char *const[]){self, "--tcp-send", "47001", sz, rp, NULL});
    /* The publisher listens on its end of the veth (listeners bind one address). */
    char popts[512];
    snprintf(popts, sizeof(popts), "listen=%s%s%s", addr_a, pub_opts[0] ? "," : "", pub_opts);
    nn_spawn(&pub, ns_a, (char *const[]){self, "--publish", sz, popts, NULL});
    int sub_rc = -1;
    bool started = false;
    if (!nn_readline(&snd, line, sizeof(line), 60) || strcmp(line, "READY")) {
        fprintf(stderr, "tcp sender did not start\n");
    } else if (!nn_readline(&pub, line, sizeof(line), 60) || strncmp(line, "DESC ", 5)) {
        fprintf(stderr, "publisher did not start\n");
    } else {
        nn_spawn(&rcv, ns_b, (char *const[]){self, "--tcp-recv", addr_a, "47001", sz, rp, NULL});
        nn_spawn(&sub, ns_b, (char *const[]){self, "--pull", line + 5, sz, (char *)ucx_opts, rp, rw, NULL});
        started = nn_readline(&rcv, line, sizeof(line), 60) && !strcmp(line, "READY") &&
                  nn_readline(&sub, line, sizeof(line), 60) && !strcmp(line, "READY");
        if (!started) fprintf(stderr, "receivers did not start\n");
        for (int r = 0; started && r < reps; r++) {
            if (write(rcv.in, "GO\n", 3) != 3 || !nn_readline(&rcv, line, sizeof(line), 120) ||
                strncmp(line, "TCP ", 4))
                break;
            tcp[ntcp++] = atof(line + 4);
            if (write(sub.in, "GO\n", 3) != 3 || !nn_readline(&sub, line, sizeof(line), 300) ||
                strncmp(line, "UCX ", 4))
                break;
            char *sp = strchr(line + 4, ' ');
            ucx[nucx++] = atof(line + 4);
            if (sp) snprintf(lanes, sizeof(lanes), "%s", sp + 1);
        }
        for (nn_child_t *c = &rcv; c; c = c == &rcv ? &sub : NULL)
            if (started && nn_readline(c, line, sizeof(line), 60) && !strncmp(line, "VERIFY ", 7))
                verified &= !strcmp(line + 7, "ok");
            else verified = false;
        nn_finish(&rcv, 10);
        sub_rc = nn_finish(&sub, 10);
    }
    nn_finish(&snd, 10);
    nn_finish(&pub, 10);
    if (ntcp != reps || nucx != reps || sub_rc != 0) {
        fprintf(stderr, "bench_ucx_tcp: incomplete (tcp runs %d, ucx runs %d, receiver exit %d)\n", ntcp, nucx, sub_rc);
        goto out;
    }
    double ts[50], us[50];
    memcpy(ts, tcp, sizeof(double) * (size_t)ntcp);
    memcpy(us, ucx, sizeof(double) * (size_t)nucx);
    qsort(ts, (size_t)ntcp, sizeof(double), cmp_double);
    qsort(us, (size_t)nucx, sizeof(double), cmp_double);
    double tm = ts[ntcp / 2], um = us[nucx / 2];
    printf("{\"tcp_gbps\":%.3f,\"ucx_gbps\":%.3f,\"ratio\":%.3f,\"lanes\":\"%s\",\"bytes\":%" PRIu64
           ",\"reps\":%d,\"tcp_runs\":[",
           tm, um, um / tm, lanes, size, reps);
    for (int i = 0; i < ntcp; i++) printf("%s%.3f", i ? "," : "", tcp[i]);
    printf("],\"ucx_runs\":[");
    for (int i = 0; i < nucx; i++) printf("%s%.3f", i ? "," : "", ucx[i]);
    /* Both arms' TCP congestion control: the namespaces' (they inherit the host's default; docs/measured.md#bbr:
     * bbr stalls links whose queue stays full), as tool_netns_up read it. */
    printf("],\"rows\":%" PRIu64 ",\"link\":\"%s\",\"mbps\":%g,\"ucx_opts\":\"%s\",\"pub_opts\":\"%s\","
           "\"tcp_cc\":\"%s\",\"verified\":%s}\n",
           rows, loopback ? "loopback" : "veth", mbps, ucx_opts, pub_opts, ns.tcp_cc[0] ? ns.tcp_cc : "unknown",
           verified ? "true" : "false");
    rc = verified ? 0 : 1;
out:
    tool_netns_down(&ns);
    return rc;
}
