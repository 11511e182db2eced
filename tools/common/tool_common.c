/* The helpers every refit program (refit, refit-bench) shares: error and
 * usage messages, number parsing, JSON strings. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tool_common.h"

int tool_fail(refit_status_t st, const char *what)
{
    fprintf(stderr, "refit: %s: %s (%s)\n", what, refit_last_error()[0] ? refit_last_error() : refit_status_message(st),
            refit_status_name(st));
    return 1;
}

int tool_usage(const char *cmd, const char *msg)
{
    fprintf(stderr, "refit %s: %s\nrun 'refit help' for usage\n", cmd, msg);
    return 2;
}

int tool_parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') return -1;
    *out = v;
    return 0;
}

void tool_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", (unsigned char)*s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

void tool_print_gpu(FILE *f, int dev)
{
    refit_gpu_info_t g;
    if (refit_gpu_info(dev, &g)) {
        fprintf(f, "{\"device\":%d,\"error\":", dev);
        tool_json_string(f, refit_last_error());
        fprintf(f, "}");
        return;
    }
    fprintf(f, "{\"device\":%d,\"name\":", dev);
    tool_json_string(f, g.name);
    fprintf(f,
            ",\"uuid\":\"%s\",\"pci\":\"%s\",\"memory\":%" PRIu64 ",\"free_memory\":%" PRIu64
            ",\"sms\":%d,\"cc\":\"%d.%d\",\"driver_api\":%d,\"runtime\":%d}",
            g.uuid, g.pci, g.memory, g.free_memory, g.sms, g.cc_major, g.cc_minor, g.driver, g.runtime);
}

#ifndef REFIT_UCX_CUDA_STATUS
#define REFIT_UCX_CUDA_STATUS "unknown"
#endif
const char *tool_ucx_cuda_status(void) { return REFIT_UCX_CUDA_STATUS; }

int tool_sibling(const char *name, char *out, size_t size)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) return -1;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash) return -1;
    slash[1] = '\0';
    int w = snprintf(out, size, "%s%s", self, name);
    return w < 0 || (size_t)w >= size ? -1 : 0;
}

refit_status_t tool_report_write(const char *record, const char *out_path)
{
    fputs(record, stdout);
    fflush(stdout);
    if (!out_path) return REFIT_OK;
    FILE *f = fopen(out_path, "w");
    if (!f) return refit_error(REFIT_ERR_IO, "cannot write %s: %s", out_path, strerror(errno));
    bool ok = fputs(record, f) >= 0;
    ok &= fclose(f) == 0;
    return ok ? REFIT_OK : refit_error(REFIT_ERR_IO, "cannot write %s: %s", out_path, strerror(errno));
}

/* A dump directory only we can write into (or sticky: others cannot move
 * our files); path names it in errors. */
static refit_status_t dump_dir_ok(int fd, const char *path)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0) return refit_error(REFIT_ERR_IO, "--dump: %s: %s", path, strerror(errno));
    if (sb.st_uid != geteuid())
        return refit_error(REFIT_ERR_AUTH,
                           "--dump: %s belongs to uid %u, not to this user (uid %u): its owner could have the dump "
                           "written elsewhere or replace it; dump into a directory of your own",
                           path, (unsigned)sb.st_uid, (unsigned)geteuid());
    if ((sb.st_mode & 022) && !(sb.st_mode & S_ISVTX))
        return refit_error(REFIT_ERR_AUTH,
                           "--dump: %s is writable by group or others (mode %04o): they could have the dump "
                           "written elsewhere or replace it; chmod go-w %s or dump into a directory of your own",
                           path, (unsigned)(sb.st_mode & 07777), path);
    return REFIT_OK;
}

refit_status_t tool_dump_path(const char *dump, uint64_t rank, char *out, size_t size)
{
    char sub[32];
    snprintf(sub, sizeof(sub), "rank-%" PRIu64, rank);
    if ((size_t)snprintf(out, size, "%s/%s/model.safetensors", dump, sub) >= size)
        return refit_error(REFIT_ERR_INVALID_ARG, "--dump: %s is too long a path", dump);
    if (mkdir(dump, 0755) != 0 && errno != EEXIST)
        return refit_error(REFIT_ERR_IO, "--dump: cannot create %s: %s", dump, strerror(errno));
    int dfd = open(dump, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return refit_error(REFIT_ERR_IO, "--dump: cannot open %s: %s", dump, strerror(errno));
    refit_status_t st = dump_dir_ok(dfd, dump);
    int rfd = -1;
    if (!st && mkdirat(dfd, sub, 0755) != 0 && errno != EEXIST)
        st = refit_error(REFIT_ERR_IO, "--dump: cannot create %s/%s: %s", dump, sub, strerror(errno));
    if (!st && (rfd = openat(dfd, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
        int err = errno;
        struct stat lsb;
        bool link = fstatat(dfd, sub, &lsb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lsb.st_mode);
        st = err == ELOOP || err == ENOTDIR
                 ? refit_error(REFIT_ERR_AUTH,
                               "--dump: %s/%s is %s, not a directory of ours: refusing to write through it; "
                               "remove it (refit makes it)",
                               dump, sub, link ? "a symbolic link" : "not a directory")
                 : refit_error(REFIT_ERR_IO, "--dump: cannot open %s/%s: %s", dump, sub, strerror(err));
    }
    if (!st) {
        char sub_path[4200];
        snprintf(sub_path, sizeof(sub_path), "%s/%s", dump, sub);
        st = dump_dir_ok(rfd, sub_path);
    }
    if (rfd >= 0) close(rfd);
    close(dfd);
    return st;
}
