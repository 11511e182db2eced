#include "testutil.h"

#include <stdio.h>
#include <string.h>

#include "util/util.h"

/* Every test process runs its job with one shared test secret (a redis
 * registry refuses to run without one), unless the test says otherwise;
 * tests of the secret lookup itself unset it. */
__attribute__((constructor)) static void t_default_secret(void)
{
    setenv("REFIT_SECRET", "refit unit tests: not a real secret", 0);
}

void refit_test_assert_err(refit_status_t got, refit_status_t want, const char *needle, const char *expr,
                           const char *file, int line)
{
    if (got != want) {
        fprintf(stderr, "%s returned %s (%s), want %s\n", expr, refit_status_name(got), refit_last_error(),
                refit_status_name(want));
        _fail(file, line);
    }
    if (needle && !strstr(refit_last_error(), needle)) {
        fprintf(stderr, "%s: detail \"%s\" lacks \"%s\"\n", expr, refit_last_error(), needle);
        _fail(file, line);
    }
}

refit_model_t *t_model(const char *name)
{
    refit_model_t *m = NULL;
    REFIT_ASSERT_OK(refit_model_builtin(name, &m));
    return m;
}

refit_layout_t *t_layout(const char *spec)
{
    refit_layout_t *l = NULL;
    REFIT_ASSERT_OK(refit_layout_parse(spec, &l));
    return l;
}

refit_manifest_t *t_manifest(const refit_model_t *m, const char *spec, uint32_t rank)
{
    refit_layout_t *l = t_layout(spec);
    refit_manifest_t *man = NULL;
    REFIT_ASSERT_OK(refit_layout_manifest(l, m, rank, &man));
    refit_layout_destroy(l);
    return man;
}

refit_manifest_t *t_manifest_named(const char *model, const char *spec, uint32_t rank)
{
    refit_model_t *m = t_model(model);
    refit_manifest_t *man = t_manifest(m, spec, rank);
    refit_model_destroy(m);
    return man;
}

int t_find_placement(const refit_manifest_t *m, const char *local, const char *canon, uint64_t crow,
                     refit_placement_t *out)
{
    for (uint32_t i = 0; i < refit_manifest_num_placements(m); i++) {
        refit_placement_t p;
        refit_tensor_info_t lt, ct;
        refit_manifest_placement(m, i, &p);
        refit_manifest_local(m, p.local, &lt, NULL, NULL);
        refit_manifest_canonical(m, p.canon, &ct);
        if (strcmp(lt.name, local) == 0 && strcmp(ct.name, canon) == 0 && p.canon_offset[0] == crow) {
            if (out) *out = p;
            return (int)i;
        }
    }
    return -1;
}

uint32_t t_execute_pair(const char *model_name, const char *src_spec, const char *dst_spec, uint64_t v)
{
    refit_model_t *model = t_model(model_name);
    refit_layout_t *src = t_layout(src_spec), *dst = t_layout(dst_spec);
    tool_local_set_t set;
    REFIT_ASSERT_OK(tool_local_set_create(model, src, true, v, &set));
    uint32_t world = refit_layout_world(dst);
    for (uint32_t r = 0; r < world; r++) {
        refit_manifest_t *dm = NULL;
        REFIT_ASSERT_OK(refit_layout_manifest(dst, model, r, &dm));
        tool_local_result_t res;
        refit_status_t st = tool_local_run(&set, dm, true, v, NULL, NULL, &res);
        if (st != REFIT_OK)
            fail_msg("%s: %s -> %s rank %u: %s: %s", model_name, src_spec, dst_spec, r, refit_status_name(st),
                     refit_last_error());
        assert_int_equal(res.stats.bytes_redundant, 0);
        assert_int_equal(res.stats.bytes_read, res.stats.bytes_written);
        assert_true(res.stats.bytes_written > 0);
        /* Verification looked at every byte of the arena's tensors. */
        assert_int_equal(res.verify.bytes_checked, res.stats.bytes_written + res.stats.bytes_fill);
        assert_int_equal(res.verify.mismatches, 0);
        refit_manifest_destroy(dm);
    }
    tool_local_set_destroy(&set);
    refit_layout_destroy(src);
    refit_layout_destroy(dst);
    refit_model_destroy(model);
    return world;
}

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void t_msleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

double t_ms_since(double t0) { return (refit_now() - t0) * 1e3; }

int t_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

bool t_in_path(const char *prog)
{
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    char buf[PATH_MAX];
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, p, prog);
        if (access(buf, X_OK) == 0) return true;
        p += n;
        if (*p == ':') p++;
    }
    return false;
}

int t_rm_tree(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return unlink(path);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char sub[PATH_MAX];
        snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
        t_rm_tree(sub);
    }
    closedir(d);
    return rmdir(path);
}

bool t_redis_ping(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    struct timeval tv = {0, 200000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char buf[16] = {0};
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && send(fd, "PING\r\n", 6, MSG_NOSIGNAL) == 6 &&
              recv(fd, buf, sizeof(buf) - 1, 0) >= 5 &&
              (strncmp(buf, "+PONG", 5) == 0 || strncmp(buf, "-NOAUTH", 7) == 0); /* up, and wants AUTH */
    close(fd);
    return ok;
}

void t_redis_stop(t_redis_t *r)
{
    if (r->pid <= 0) return;
    kill(r->pid, SIGTERM);
    double t0 = refit_now();
    int status;
    while (waitpid(r->pid, &status, WNOHANG) == 0) {
        if (t_ms_since(t0) > 5000) {
            kill(r->pid, SIGKILL);
            waitpid(r->pid, &status, 0);
            break;
        }
        t_msleep(5);
    }
    r->pid = 0;
}

bool t_redis_start(t_redis_t *r, int port) { return t_redis_start_with(r, port, NULL); }

bool t_redis_start_with(t_redis_t *r, int port, const char *const *extra)
{
    if (!r->dir[0]) {
        snprintf(r->dir, sizeof(r->dir), "/tmp/refit-redis-XXXXXX");
        if (!mkdtemp(r->dir)) return false;
    }
    r->port = port ? port : t_free_port();
    char ports[16];
    snprintf(ports, sizeof(ports), "%d", r->port);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        if (getppid() != parent) _exit(1);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
            dup2(null, 1);
            dup2(null, 2);
        }
        const char *argv[64] = {"redis-server", "--port", ports,         "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no",     "--daemonize", "no",     "--dir",     r->dir};
        int n = 13;
        for (int i = 0; extra && extra[i] && n < 63; i++) argv[n++] = extra[i];
        argv[n] = NULL;
        execvp("redis-server", (char *const *)argv);
        _exit(127);
    }
    r->pid = pid;
    double t0 = refit_now();
    while (t_ms_since(t0) < 5000) {
        if (t_redis_ping(r->port)) return true;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            r->pid = 0;
            return false;
        }
        t_msleep(10);
    }
    t_redis_stop(r);
    return false;
}

unsigned char *t_fp8_arena(const char *model, const char *spec, uint32_t rank, uint64_t v, refit_manifest_t **fp8m)
{
    refit_manifest_t *m = t_manifest_named(model, spec, rank);
    void *img = calloc(1, refit_manifest_region_size(m, 0));
    assert_non_null(img);
    REFIT_ASSERT_OK(refit_truth_fill(m, &img, v));
    refit_fp8_target_t *t;
    REFIT_ASSERT_OK(refit_fp8_target_create(m, &t));
    unsigned char *arena = calloc(1, refit_fp8_target_bytes(t));
    assert_non_null(arena);
    REFIT_ASSERT_OK(refit_fp8_stage(t, img, arena, 1));
    REFIT_ASSERT_OK(refit_fp8_target_manifest(t, m, fp8m));
    assert_int_equal(refit_manifest_region_size(*fp8m, 0), refit_fp8_target_bytes(t));
    refit_fp8_target_destroy(t);
    refit_manifest_destroy(m);
    free(img);
    return arena;
}
