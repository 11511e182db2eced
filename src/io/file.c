/* Regular-file checks for checkpoint files (see file.h).  stat() first, so
 * that a FIFO or a device is never opened at all; O_NONBLOCK on the open
 * itself and fstat() after it, so that a path replaced between the two calls
 * cannot make open() wait for a writer or hand us a device. */
#include "io/file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* "a FIFO" etc. for a mode that is not a regular file. */
static const char *kind_of(mode_t mode)
{
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a plain file";
}

static refit_status_t not_regular(const char *path, mode_t mode)
{
    return refit_error(REFIT_ERR_IO, "%s is %s, not a regular file", path, kind_of(mode));
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
