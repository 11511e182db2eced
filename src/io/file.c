/* Regular-file checks for checkpoint files (see file.h).  stat() first, so
 * that a FIFO or a device is never opened at all; O_NONBLOCK on the open
 * itself and fstat() after it, so that a path replaced between the two calls
 * cannot make open() wait for a writer or hand us a device.
 *
 * Output files (refit_outfile_*): a predictable temporary name ("<path>.tmp.
 * <pid>") opened with fopen let anyone who can write the directory put a
 * symbolic link there first and have us overwrite whatever it points to
 * with our bytes.  So the temporary's name is random, it is created
 * exclusively without following links, and every call names it relative to
 * one descriptor of the directory. */
#include "io/file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/crypto.h"

const char *refit_file_kind(unsigned mode)
{
    if (S_ISLNK(mode)) return "a symbolic link";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a plain file";
}

static refit_status_t not_regular(const char *path, mode_t mode)
{
    return refit_error(REFIT_ERR_IO, "%s is %s, not a regular file", path, refit_file_kind(mode));
}

refit_status_t refit_open_regular(const char *path, int *fd_out, uint64_t *size)
{
    struct stat sb;
    if (stat(path, &sb) != 0) return refit_error(REFIT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return not_regular(path, sb.st_mode);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return refit_error(REFIT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0) {
        refit_status_t st = refit_error(REFIT_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
        close(fd);
        return st;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return not_regular(path, sb.st_mode);
    }
    /* Regular files ignore O_NONBLOCK; clear it anyway so callers' reads are
     * plain blocking reads whatever the file system. */
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    *fd_out = fd;
    *size = (uint64_t)sb.st_size;
    return REFIT_OK;
}

refit_status_t refit_read_regular(const char *path, size_t max, char **buf, size_t *len)
{
    refit_status_t st;
    int fd;
    uint64_t size;
    if ((st = refit_open_regular(path, &fd, &size))) return st;
    if (size > max) {
        close(fd);
        return refit_error(REFIT_ERR_IO, "%s is %" PRIu64 " bytes, more than the %zu this file may hold", path, size,
                           max);
    }
    char *b = malloc((size_t)size + 1);
    if (!b) {
        close(fd);
        return refit_error(REFIT_ERR_NO_MEMORY, "reading %s (%" PRIu64 " bytes)", path, size);
    }
    /* Up to max + 1 bytes: a file that grew since fstat is caught, not cut. */
    size_t got = 0, cap = (size_t)size;
    for (;;) {
        if (got == cap) {
            if (cap >= max) {
                char probe;
                ssize_t more = read(fd, &probe, 1);
                if (more < 0 && errno == EINTR) continue;
                if (more == 0) break;
                st = more < 0
                         ? refit_error(REFIT_ERR_IO, "cannot read %s: %s", path, strerror(errno))
                         : refit_error(REFIT_ERR_IO, "%s holds more than the %zu bytes this file may hold", path, max);
                goto err;
            }
            size_t ncap = cap < 4096 ? 4096 : cap * 2;
            if (ncap > max) ncap = max;
            char *nb = realloc(b, ncap + 1);
            if (!nb) {
                st = refit_error(REFIT_ERR_NO_MEMORY, "reading %s", path);
                goto err;
            }
            b = nb;
            cap = ncap;
        }
        ssize_t n = read(fd, b + got, cap - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            st = refit_error(REFIT_ERR_IO, "cannot read %s: %s", path, strerror(errno));
            goto err;
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    close(fd);
    b[got] = '\0';
    *buf = b;
    *len = got;
    return REFIT_OK;
err:
    free(b);
    close(fd);
    return st;
}

/* ---- output files --------------------------------------------------------- */

static void outfile_free(refit_outfile_t *o)
{
    if (o->fd >= 0) close(o->fd);
    if (o->dirfd >= 0) close(o->dirfd);
    free(o->dir);
    free(o->name);
    o->fd = o->dirfd = -1;
    o->dir = o->name = NULL;
}

refit_status_t refit_outfile_open(refit_outfile_t *o, const char *path, unsigned mode, bool private_dir)
{
    memset(o, 0, sizeof(*o));
    o->fd = o->dirfd = -1;
    if (!path || !path[0]) return refit_error(REFIT_ERR_INVALID_ARG, "no file name to write");
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!base[0] || strcmp(base, ".") == 0 || strcmp(base, "..") == 0 || strlen(base) > NAME_MAX)
        return refit_error(REFIT_ERR_INVALID_ARG, "%s does not end in a file name", path);
    o->name = refit_strdup(base);
    o->dir = slash == path ? refit_strdup("/")
             : slash       ? refit_asprintf("%.*s", (int)(slash - path), path)
                           : refit_strdup(".");
    refit_status_t st = REFIT_OK;
    if (!o->name || !o->dir) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "writing %s", path);
        goto free_o;
    }
    o->dirfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (o->dirfd < 0) {
        st = refit_error(REFIT_ERR_IO, "cannot write %s: directory %s: %s", path, o->dir, strerror(errno));
        goto free_o;
    }
    struct stat sb;
    if (fstat(o->dirfd, &sb) != 0) {
        st = refit_error(REFIT_ERR_IO, "cannot write %s: directory %s: %s", path, o->dir, strerror(errno));
        goto free_o;
    }
    if (private_dir && sb.st_uid != geteuid()) {
        st = refit_error(REFIT_ERR_AUTH,
                         "refusing to write %s: its directory %s belongs to uid %u, not to this user (uid %u), who "
                         "could replace the file or point its name elsewhere; write into a directory of your own",
                         path, o->dir, (unsigned)sb.st_uid, (unsigned)geteuid());
        goto free_o;
    }
    if (private_dir && (sb.st_mode & 022) && !(sb.st_mode & S_ISVTX)) {
        st = refit_error(REFIT_ERR_AUTH,
                         "refusing to write %s: its directory %s is writable by group or others (mode %04o), who "
                         "could replace the file; chmod go-w %s (or +t) or write into a directory of your own",
                         path, o->dir, (unsigned)(sb.st_mode & 07777), o->dir);
        goto free_o;
    }
    for (int tries = 0; o->fd < 0; tries++) {
        uint8_t r[8];
        if ((st = refit_random_bytes(r, sizeof(r)))) goto free_o;
        snprintf(o->tmp, sizeof(o->tmp), ".%.60s.%02x%02x%02x%02x%02x%02x%02x%02x.tmp", base, r[0], r[1], r[2], r[3],
                 r[4], r[5], r[6], r[7]);
        o->fd = openat(o->dirfd, o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode_t)mode);
        if (o->fd < 0 && (errno != EEXIST || tries >= 10)) {
            st = refit_error(REFIT_ERR_IO, "cannot create %s/%s: %s", o->dir, o->tmp, strerror(errno));
            goto free_o;
        }
    }
    return REFIT_OK;

free_o:
    outfile_free(o);
    return st;
}

void refit_outfile_write(refit_outfile_t *o, const void *buf, size_t len)
{
    const char *p = buf;
    while (!o->failed && len > 0) {
        ssize_t n = write(o->fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            o->failed = true;
            o->err = n < 0 ? errno : EIO;
            break;
        }
        p += n;
        len -= (size_t)n;
    }
}

refit_status_t refit_outfile_commit(refit_outfile_t *o, const char *path)
{
    refit_status_t st = REFIT_OK;
    int fd = o->fd;
    o->fd = -1;
    if (close(fd) != 0 && !o->failed) {
        o->failed = true;
        o->err = errno;
    }
    if (o->failed) st = refit_error(REFIT_ERR_IO, "writing %s: %s", path, strerror(o->err));
    else if (renameat(o->dirfd, o->tmp, o->dirfd, o->name) != 0)
        st = refit_error(REFIT_ERR_IO, "writing %s: rename: %s", path, strerror(errno));
    if (st) unlinkat(o->dirfd, o->tmp, 0);
    outfile_free(o);
    return st;
}

void refit_outfile_abort(refit_outfile_t *o)
{
    if (o->dirfd >= 0 && o->tmp[0]) unlinkat(o->dirfd, o->tmp, 0);
    outfile_free(o);
}
