/* The file backend: one directory per job (DIR/<job>/), one file per key.
 *
 * File names: a key's bytes, with every byte outside [A-Za-z0-9._:@-] (and a
 * leading '.') written %XX, so "trainer/src/0/hb" is "trainer%2Fsrc%2F0%2Fhb".
 * Names starting with '.' are ours: ".lock", ".tmp.*" (never keys).
 *
 * File contents: a 16-byte header, then the value:
 *   0 magic "RFKV", 4 u32 = 0 (reserved), 8 u64 expiry (CLOCK_REALTIME ms
 *   since the epoch; 0 = never), all little-endian.
 * Expired files read as absent; clocks of processes sharing a directory over
 * a network filesystem must agree.
 *
 * Writes: put writes a temp file and renames it over the key (atomic for
 * readers; no fsync: the registry describes live processes, nothing of it
 * must survive a host crash).  put_new links a temp file to the key name
 * (link fails if the name exists).
 *
 * Expired files are unlinked lazily (by get, list and put_new).  Unlinking
 * by name is racy: between reading "expired" and unlink(), another process
 * may rename a fresh file over the name, and unlink would remove that fresh
 * lease.  So every process's renames and links hold a shared flock on
 * DIR/<job>/.lock, and removal of expired files (re-checked after locking)
 * holds it exclusively.  Readers never lock; garbage collection only tries
 * (LOCK_NB) and skips when busy; writers wait for the lock at most
 * LOCK_TIMEOUT_MS.
 *
 * Waiting: an inotify watch on the job directory, opened at open() so that
 * no change is lost; events on our own '.' files are ignored.
 *
 * Trust: the directory is the boundary.  DIR and DIR/<job> are created 0700;
 * an existing one must be a directory owned by this user and not writable
 * by group or others (else anyone could replace entries), and files are
 * created 0600.  DIR/<job>/.secret holds the job's secret when no other is
 * given (registry.c): 32 random bytes, made by the first process (linked
 * into place, so concurrent openers agree), 0600, refused if it is not a
 * regular file of ours that only we can read.
 *
 * Every value, .lock and .secret is opened O_NONBLOCK | O_NOFOLLOW and
 * must be a regular file (a FIFO would block open() past every timeout): any
 * other kind under a key's name is REFIT_ERR_CORRUPT naming it.  Temporary
 * files are created O_EXCL | O_NOFOLLOW.
 *
 * Thread safety: `mu` serialises the operations of one object (they share
 * the lock file descriptor); `wait_mu` serialises waiters, so a blocked
 * wait never holds up a put. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io/file.h"
#include "registry/backend.h"
#include "util/crypto.h"

#define HDR_SIZE 16u
#define MAX_VALUE (1ull << 30)
#define LOCK_TIMEOUT_MS 2000
#define WATCH_MASK (IN_MOVED_TO | IN_CLOSE_WRITE | IN_DELETE | IN_CREATE)

struct refit_kv {
    pthread_mutex_t mu;
    pthread_mutex_t wait_mu;
    char *path; /* DIR/<job> */
    int dirfd;
    int lockfd;
    int inofd;
    unsigned long tmp_seq;
};

/* ---- helpers ------------------------------------------------------------ */

static uint64_t realtime_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static bool safe_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-' || c == ':' || c == '@';
}

/* Key -> file name; false if it does not fit NAME_MAX. */
static bool encode_name(const char *key, char name[NAME_MAX + 1])
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (size_t i = 0; key[i]; i++) {
        unsigned char c = (unsigned char)key[i];
        if (safe_char((char)c) && !(i == 0 && c == '.')) {
            if (o + 1 > NAME_MAX) return false;
            name[o++] = (char)c;
        } else {
            if (o + 3 > NAME_MAX) return false;
            name[o++] = '%';
            name[o++] = hex[c >> 4];
            name[o++] = hex[c & 15];
        }
    }
    name[o] = '\0';
    return o > 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* File name -> key (malloc'ed); NULL for names that are not keys (ours, foreign). */
static char *decode_name(const char *name)
{
    if (name[0] == '.' || !name[0]) return NULL;
    size_t n = strlen(name);
    char *key = malloc(n + 1);
    if (!key) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (name[i] != '%') {
            key[o++] = name[i];
            continue;
        }
        int hi = i + 2 < n ? hexval(name[i + 1]) : -1;
        int lo = hi >= 0 ? hexval(name[i + 2]) : -1;
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
            free(key);
            return NULL;
        }
        key[o++] = (char)(hi * 16 + lo);
        i += 2;
    }
    key[o] = '\0';
    return key;
}

static bool key_ok(const char *key)
{
    if (!key || !*key) return false;
    for (const char *p = key; *p; p++)
        if (*p <= ' ' || *p > '~') return false;
    return true;
}

static refit_status_t bad_key(const refit_kv_t *kv, const char *key)
{
    return refit_error(REFIT_ERR_INVALID_ARG, "file registry %s: key \"%.300s\" is empty, too long or not printable",
                       kv->path, key ? key : "(null)");
}

static refit_status_t io_error(const refit_kv_t *kv, const char *what, const char *name, int err)
{
    return refit_error(REFIT_ERR_REGISTRY, "file registry %s/%s: %s: %s", kv->path, name, what, strerror(err));
}

/* A key's file that is not a regular file was put there by hand, not by a
 * registry client: hostile or broken, refused as a corrupt value. */
static refit_status_t not_regular(const refit_kv_t *kv, const char *name, mode_t mode)
{
    return refit_error(REFIT_ERR_CORRUPT, "file registry %s/%s is %s, not a regular file: not a registry value",
                       kv->path, name, refit_file_kind(mode));
}

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Reads exactly len bytes; returns bytes read (< len at end of file) or -1. */
static ssize_t read_full(int fd, void *buf, size_t len)
{
    char *p = buf;
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, p + got, len - got);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}


/* Takes the job lock (LOCK_SH or LOCK_EX), retrying for at most timeout_ms
 * (0: a single try).  false if not taken. */
static bool lock_take(refit_kv_t *kv, int op, int timeout_ms)
{
    uint64_t deadline = refit_now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        if (flock(kv->lockfd, op | LOCK_NB) == 0) return true;
        if (errno == EINTR) continue;
        if (errno != EWOULDBLOCK || refit_now_ns() >= deadline) return false;
        struct timespec ts = {0, 500000}; /* 0.5 ms */
        nanosleep(&ts, NULL);
    }
}

static void lock_drop(refit_kv_t *kv) { flock(kv->lockfd, LOCK_UN); }

static refit_status_t lock_or_fail(refit_kv_t *kv, int op, const char *what)
{
    if (lock_take(kv, op, LOCK_TIMEOUT_MS)) return REFIT_OK;
    int err = errno;
    if (err == EWOULDBLOCK)
        return refit_error(REFIT_ERR_REGISTRY, "file registry %s: %s: .lock busy for %d ms", kv->path, what,
                           LOCK_TIMEOUT_MS);
    return refit_error(REFIT_ERR_REGISTRY, "file registry %s: %s: flock: %s", kv->path, what, strerror(err));
}

/* Reads file `name`: *present false if absent or expired; else (val != NULL)
 * the value, malloc'ed.  *expired tells absent from expired. */
static refit_status_t read_file(refit_kv_t *kv, const char *name, bool *present, bool *expired, void **val, size_t *len)
{
    *present = false;
    *expired = false;
    /* Anyone who can write the directory can put a FIFO, a device or a
     * symbolic link under a key's name: a blocking open() of a FIFO waits for
     * a writer forever (past every timeout), a device reads without end.  So
     * never block, never follow, and read only regular files. */
    int fd = openat(kv->dirfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY);
    if (fd < 0) {
        if (errno == ENOENT) return REFIT_OK;
        if (errno == ELOOP) return not_regular(kv, name, S_IFLNK);
        return io_error(kv, "open", name, errno);
    }
    refit_status_t st = REFIT_OK;
    struct stat sb;
    uint8_t hdr[HDR_SIZE];
    if (fstat(fd, &sb) != 0) {
        st = io_error(kv, "fstat", name, errno);
        goto close_fd;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = not_regular(kv, name, sb.st_mode);
        goto close_fd;
    }
    ssize_t got = read_full(fd, hdr, HDR_SIZE);
    if (got < 0) {
        st = io_error(kv, "read", name, errno);
        goto close_fd;
    }
    if ((size_t)got < HDR_SIZE || memcmp(hdr, "RFKV", 4) != 0 || (uint64_t)sb.st_size < HDR_SIZE ||
        (uint64_t)sb.st_size - HDR_SIZE > MAX_VALUE) {
        st = refit_error(REFIT_ERR_CORRUPT, "file registry %s/%s: not a registry file (bad header or size)", kv->path,
                         name);
        goto close_fd;
    }
    uint64_t expiry = refit_get_le(hdr + 8, 8);
    if (expiry != 0 && expiry <= realtime_ms()) {
        *expired = true;
        goto close_fd;
    }
    if (val) {
        size_t n = (size_t)sb.st_size - HDR_SIZE;
        void *buf = malloc(n ? n : 1);
        if (!buf) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "file registry %s/%s: %zu bytes", kv->path, name, n);
            goto close_fd;
        }
        got = read_full(fd, buf, n);
        if (got < 0 || (size_t)got != n) {
            st = got < 0 ? io_error(kv, "read", name, errno)
                         : refit_error(REFIT_ERR_CORRUPT, "file registry %s/%s: truncated", kv->path, name);
            free(buf);
            goto close_fd;
        }
        *val = buf;
        *len = n;
    }
    *present = true;

close_fd:
    close(fd);
    return st;
}

/* Removes the files among names[] that are still expired, if the job lock is
 * free right now (garbage collection is best effort). */
static void collect_expired(refit_kv_t *kv, char *const *names, size_t n)
{
    if (n == 0 || !lock_take(kv, LOCK_EX, 0)) return;
    for (size_t i = 0; i < n; i++) {
        bool present = false, expired = false;
        if (read_file(kv, names[i], &present, &expired, NULL, NULL) == REFIT_OK && expired)
            unlinkat(kv->dirfd, names[i], 0);
    }
    lock_drop(kv);
}

/* Creates a temp file holding header + value; *tmp is its name. */
static refit_status_t write_temp(refit_kv_t *kv, const void *val, size_t len, uint32_t ttl_ms, char tmp[64])
{
    if ((uint64_t)len > MAX_VALUE)
        return refit_error(REFIT_ERR_INVALID_ARG, "file registry %s: value of %zu bytes too large", kv->path, len);
    uint8_t hdr[HDR_SIZE] = {'R', 'F', 'K', 'V'};
    refit_put_le(hdr + 8, ttl_ms ? realtime_ms() + ttl_ms : 0, 8);
    int fd = -1;
    for (int tries = 0; fd < 0; tries++) {
        snprintf(tmp, 64, ".tmp.%ld.%lu", (long)getpid(), kv->tmp_seq++);
        fd = openat(kv->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0 && (errno != EEXIST || tries > 100)) return io_error(kv, "create", tmp, errno);
    }
    if (write_all(fd, hdr, HDR_SIZE) != 0 || write_all(fd, val, len) != 0) {
        refit_status_t st = io_error(kv, "write", tmp, errno);
        close(fd);
        unlinkat(kv->dirfd, tmp, 0);
        return st;
    }
    if (close(fd) != 0) {
        refit_status_t st = io_error(kv, "close", tmp, errno);
        unlinkat(kv->dirfd, tmp, 0);
        return st;
    }
    return REFIT_OK;
}

/* ---- operations --------------------------------------------------------- */

static void file_close(refit_kv_t *kv);

/* Creates every missing directory of path (mkdir -p). */
static int mkdirs(char *path)
{
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        int rc = mkdir(path, 0700);
        int err = errno;
        *p = c;
        if (rc != 0 && err != EEXIST) {
            errno = err;
            return -1;
        }
        if (c == '\0') return 0;
    }
}

/* A registry directory must be ours and closed to writes by others. */
static refit_status_t check_dir_fd(int fd, const char *path)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return refit_error(REFIT_ERR_REGISTRY, "file registry %s: fstat: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return refit_error(REFIT_ERR_REGISTRY, "file registry %s is not a directory", path);
    if (sb.st_uid != geteuid())
        return refit_error(REFIT_ERR_AUTH,
                           "file registry %s belongs to uid %u, not to this user (uid %u): anyone owning it could "
                           "forge or remove entries; use a directory of your own",
                           path, (unsigned)sb.st_uid, (unsigned)geteuid());
    if (sb.st_mode & 022)
        return refit_error(REFIT_ERR_AUTH,
                           "file registry %s is writable by group or others (mode %04o): they could forge or remove "
                           "entries; chmod go-w it or use a directory of your own",
                           path, (unsigned)(sb.st_mode & 07777));
    return REFIT_OK;
}

/* DIR itself as above; every directory above it must belong to us or root
 * and, if others may write it, be sticky (as /tmp): otherwise its owner
 * could move our directory away and put one of theirs in its place. */
static refit_status_t check_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return refit_error(REFIT_ERR_REGISTRY, "file registry %s: open: %s", path, strerror(errno));
    refit_status_t st = check_dir_fd(fd, path);
    close(fd);
    char *up = realpath(path, NULL);
    if (!up) return st ? st : refit_error(REFIT_ERR_REGISTRY, "file registry %s: realpath: %s", path, strerror(errno));
    for (char *slash = strrchr(up, '/'); !st && slash; slash = strrchr(up, '/')) {
        if (slash == up) slash[1] = '\0';
        else *slash = '\0';
        struct stat sb;
        if (stat(up, &sb) != 0) {
            st = refit_error(REFIT_ERR_REGISTRY, "file registry %s: stat %s: %s", path, up, strerror(errno));
        } else if ((sb.st_uid != geteuid() && sb.st_uid != 0) || ((sb.st_mode & 022) && !(sb.st_mode & S_ISVTX))) {
            st = refit_error(REFIT_ERR_AUTH,
                             "file registry %s: its parent %s belongs to uid %u (mode %04o): its owner or group could "
                             "replace the registry; use a directory under one that only you or root control",
                             path, up, (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777));
        }
        if (slash == up) break;
    }
    free(up);
    return st;
}

/* Reads DIR/<job>/.secret, creating it first if absent. */
static refit_status_t file_job_secret(refit_kv_t *kv, uint8_t out[32])
{
    for (int tries = 0; tries < 3; tries++) {
        int fd = openat(kv->dirfd, ".secret", O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd >= 0) {
            struct stat sb;
            refit_status_t st = REFIT_OK;
            if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077) ||
                sb.st_size != 32)
                st = refit_error(REFIT_ERR_AUTH,
                                 "file registry %s/.secret is not a 32-byte regular file readable only by this user",
                                 kv->path);
            else if (read_full(fd, out, 32) != 32)
                st = refit_error(REFIT_ERR_AUTH, "file registry %s/.secret: short read", kv->path);
            close(fd);
            return st;
        }
        if (errno != ENOENT) return io_error(kv, "open", ".secret", errno);
        uint8_t secret[32];
        refit_status_t st = refit_random_bytes(secret, sizeof(secret));
        char tmp[64];
        snprintf(tmp, sizeof(tmp), ".tmp.secret.%ld.%lu", (long)getpid(), kv->tmp_seq++);
        int w = st ? -1 : openat(kv->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (!st && w < 0) st = io_error(kv, "create", tmp, errno);
        if (!st) {
            /* Closed whether or not the write worked. */
            int e = write_all(w, secret, sizeof(secret)) != 0 ? errno : 0;
            if (close(w) != 0 && !e) e = errno;
            if (e) st = io_error(kv, "write", tmp, e);
        }
        refit_wipe(secret, sizeof(secret));
        /* link fails if another process put its secret first: then read theirs. */
        if (!st && linkat(kv->dirfd, tmp, kv->dirfd, ".secret", 0) != 0 && errno != EEXIST)
            st = io_error(kv, "link", ".secret", errno);
        unlinkat(kv->dirfd, tmp, 0);
        if (st) return st;
    }
    return refit_error(REFIT_ERR_REGISTRY, "file registry %s: .secret keeps vanishing", kv->path);
}

static refit_status_t file_open(const char *rest, const char *job, refit_kv_t **out)
{
    refit_kv_t *kv = calloc(1, sizeof(*kv));
    if (!kv) return refit_error(REFIT_ERR_NO_MEMORY, "file registry %s", rest);
    kv->dirfd = kv->lockfd = kv->inofd = -1;
    pthread_mutex_init(&kv->mu, NULL);
    pthread_mutex_init(&kv->wait_mu, NULL);
    refit_status_t st = REFIT_OK;
    kv->path = refit_asprintf("%s/%s", rest, job);
    if (!kv->path) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "file registry %s", rest);
        goto close_kv;
    }
    if (mkdirs(kv->path) != 0) {
        st = refit_error(REFIT_ERR_REGISTRY, "file registry %s: cannot create it: %s", kv->path, strerror(errno));
        goto close_kv;
    }
    if ((st = check_dir(rest))) goto close_kv;
    kv->dirfd = open(kv->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (kv->dirfd < 0) {
        st = refit_error(REFIT_ERR_REGISTRY, "file registry %s: open: %s", kv->path, strerror(errno));
        goto close_kv;
    }
    if ((st = check_dir_fd(kv->dirfd, kv->path))) goto close_kv;
    /* O_NONBLOCK: a FIFO in its place must not hold open() up either. */
    kv->lockfd = openat(kv->dirfd, ".lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0600);
    if (kv->lockfd < 0) {
        st = errno == ELOOP ? not_regular(kv, ".lock", S_IFLNK)
                            : refit_error(REFIT_ERR_REGISTRY, "file registry %s: cannot create .lock: %s", kv->path,
                                          strerror(errno));
        goto close_kv;
    }
    struct stat lsb;
    if (fstat(kv->lockfd, &lsb) != 0) {
        st = refit_error(REFIT_ERR_REGISTRY, "file registry %s/.lock: fstat: %s", kv->path, strerror(errno));
        goto close_kv;
    }
    if (!S_ISREG(lsb.st_mode)) {
        st = not_regular(kv, ".lock", lsb.st_mode);
        goto close_kv;
    }
    kv->inofd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (kv->inofd < 0 || inotify_add_watch(kv->inofd, kv->path, WATCH_MASK) < 0) {
        st = refit_error(REFIT_ERR_REGISTRY, "file registry %s: inotify: %s", kv->path, strerror(errno));
        goto close_kv;
    }
    *out = kv;
    return REFIT_OK;

close_kv:
    file_close(kv);
    return st;
}

static void file_close(refit_kv_t *kv)
{
    if (!kv) return;
    if (kv->inofd >= 0) close(kv->inofd);
    if (kv->lockfd >= 0) close(kv->lockfd);
    if (kv->dirfd >= 0) close(kv->dirfd);
    pthread_mutex_destroy(&kv->wait_mu);
    pthread_mutex_destroy(&kv->mu);
    free(kv->path);
    free(kv);
}

static refit_status_t file_put(refit_kv_t *kv, const char *key, const void *val, size_t len, uint32_t ttl_ms)
{
    char name[NAME_MAX + 1], tmp[64];
    if (!key_ok(key) || !encode_name(key, name)) return bad_key(kv, key);
    pthread_mutex_lock(&kv->mu);
    refit_status_t st = write_temp(kv, val, len, ttl_ms, tmp);
    if (st) goto unlock;
    st = lock_or_fail(kv, LOCK_SH, "put");
    if (st) goto remove_temp;
    if (renameat(kv->dirfd, tmp, kv->dirfd, name) != 0) st = io_error(kv, "rename", name, errno);
    lock_drop(kv);
    if (!st) goto unlock;
remove_temp:
    unlinkat(kv->dirfd, tmp, 0);
unlock:
    pthread_mutex_unlock(&kv->mu);
    return st;
}

static refit_status_t file_put_new(refit_kv_t *kv, const char *key, const void *val, size_t len, uint32_t ttl_ms)
{
    char name[NAME_MAX + 1], tmp[64];
    if (!key_ok(key) || !encode_name(key, name)) return bad_key(kv, key);
    pthread_mutex_lock(&kv->mu);
    refit_status_t st = write_temp(kv, val, len, ttl_ms, tmp);
    if (st) goto unlock;
    st = lock_or_fail(kv, LOCK_SH, "put_new");
    if (st) goto remove_temp;
    int rc = linkat(kv->dirfd, tmp, kv->dirfd, name, 0);
    int err = errno;
    lock_drop(kv);
    if (rc != 0 && err == EEXIST) {
        /* Present: busy unless expired.  Replacing an expired file needs the
         * exclusive lock, so that no fresh file can take its place between
         * our check and our unlink. */
        st = lock_or_fail(kv, LOCK_EX, "put_new");
        if (st) goto remove_temp;
        bool present = false, expired = false;
        st = read_file(kv, name, &present, &expired, NULL, NULL);
        if (!st && present) st = refit_error(REFIT_ERR_BUSY, "file registry %s: key %s exists", kv->path, key);
        if (!st && expired) unlinkat(kv->dirfd, name, 0);
        if (!st) {
            rc = linkat(kv->dirfd, tmp, kv->dirfd, name, 0);
            err = errno;
        }
        lock_drop(kv);
        if (st) goto remove_temp;
    }
    if (rc != 0) st = io_error(kv, "link", name, err);
remove_temp:
    unlinkat(kv->dirfd, tmp, 0);
unlock:
    pthread_mutex_unlock(&kv->mu);
    return st;
}

static refit_status_t file_get_many(refit_kv_t *kv, const char *const *keys, size_t n, void **vals, size_t *lens)
{
    for (size_t i = 0; i < n; i++)
        if (!key_ok(keys[i])) return bad_key(kv, keys[i]);
    void **v = calloc(n ? n : 1, sizeof(*v));
    size_t *l = calloc(n ? n : 1, sizeof(*l));
    char **expired_names = calloc(n ? n : 1, sizeof(*expired_names));
    size_t nexpired = 0;
    refit_status_t st = REFIT_OK;
    if (!v || !l || !expired_names) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "file registry %s: get of %zu keys", kv->path, n);
        goto free_arrays;
    }
    pthread_mutex_lock(&kv->mu);
    for (size_t i = 0; i < n && !st; i++) {
        char name[NAME_MAX + 1];
        if (!encode_name(keys[i], name)) {
            st = bad_key(kv, keys[i]);
            break;
        }
        bool present = false, expired = false;
        st = read_file(kv, name, &present, &expired, &v[i], &l[i]);
        if (!st && expired && (expired_names[nexpired] = refit_strdup(name))) nexpired++;
    }
    if (!st) collect_expired(kv, expired_names, nexpired);
    pthread_mutex_unlock(&kv->mu);
    if (!st) {
        memcpy(vals, v, n * sizeof(*v));
        memcpy(lens, l, n * sizeof(*l));
    } else {
        for (size_t i = 0; i < n; i++) free(v[i]);
    }
free_arrays:
    for (size_t i = 0; i < nexpired; i++) free(expired_names[i]);
    free(expired_names);
    free(l);
    free(v);
    return st;
}

static refit_status_t file_del(refit_kv_t *kv, const char *key)
{
    char name[NAME_MAX + 1];
    if (!key_ok(key) || !encode_name(key, name)) return bad_key(kv, key);
    pthread_mutex_lock(&kv->mu);
    refit_status_t st = REFIT_OK;
    if (unlinkat(kv->dirfd, name, 0) != 0 && errno != ENOENT) st = io_error(kv, "unlink", name, errno);
    pthread_mutex_unlock(&kv->mu);
    return st;
}

static refit_status_t file_list(refit_kv_t *kv, const char *prefix, char ***keys_out, size_t *n_out)
{
    REFIT_VEC(char *) keys = {0};
    REFIT_VEC(char *) expired_names = {0};
    size_t plen = strlen(prefix);
    refit_status_t st = REFIT_OK;
    pthread_mutex_lock(&kv->mu);
    int fd = dup(kv->dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        st = refit_error(REFIT_ERR_REGISTRY, "file registry %s: list: %s", kv->path, strerror(errno));
        if (fd >= 0) close(fd);
        goto unlock;
    }
    rewinddir(d);
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno) st = refit_error(REFIT_ERR_REGISTRY, "file registry %s: readdir: %s", kv->path, strerror(errno));
            break;
        }
        char *key = decode_name(e->d_name);
        if (!key) continue;
        if (strncmp(key, prefix, plen) != 0) {
            free(key);
            continue;
        }
        bool present = false, expired = false;
        st = read_file(kv, e->d_name, &present, &expired, NULL, NULL);
        if (!st && present && REFIT_VEC_PUSH(&keys, key) == 0) continue;
        free(key);
        if (st) break;
        if (expired) {
            char *name = refit_strdup(e->d_name);
            if (name && REFIT_VEC_PUSH(&expired_names, name) != 0) free(name);
            continue;
        }
        if (present) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "file registry %s: list", kv->path);
            break;
        }
    }
    closedir(d);
    if (!st) collect_expired(kv, expired_names.data, expired_names.len);
unlock:
    pthread_mutex_unlock(&kv->mu);
    for (size_t i = 0; i < expired_names.len; i++) free(expired_names.data[i]);
    REFIT_VEC_FREE(&expired_names);
    if (st) {
        for (size_t i = 0; i < keys.len; i++) free(keys.data[i]);
        REFIT_VEC_FREE(&keys);
        return st;
    }
    *keys_out = keys.data;
    *n_out = keys.len;
    return REFIT_OK;
}

/* Reads every queued inotify event; *changed set if one names a key file.
 * -1 with errno on a read error. */
static int drain_events(refit_kv_t *kv, bool *changed)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t n = read(kv->inofd, buf, sizeof(buf));
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) return 0;
            return -1;
        }
        for (ssize_t off = 0; off + (ssize_t)sizeof(struct inotify_event) <= n;) {
            const struct inotify_event *ev = (const struct inotify_event *)(buf + off);
            /* An overflowed queue lost events: report a change. */
            if ((ev->mask & (IN_Q_OVERFLOW | IN_IGNORED)) || (ev->len > 0 && ev->name[0] != '.')) *changed = true;
            off += (ssize_t)sizeof(struct inotify_event) + ev->len;
        }
    }
}

static refit_status_t file_wait(refit_kv_t *kv, int timeout_ms)
{
    uint64_t deadline = refit_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
    refit_status_t st = REFIT_OK;
    pthread_mutex_lock(&kv->wait_mu);
    for (;;) {
        bool changed = false;
        if (drain_events(kv, &changed) != 0) {
            st = refit_error(REFIT_ERR_REGISTRY, "file registry %s: inotify read: %s", kv->path, strerror(errno));
            break;
        }
        if (changed) break;
        uint64_t now = refit_now_ns();
        if (now >= deadline) {
            st = refit_error(REFIT_ERR_TIMEOUT, "file registry %s: no change within %d ms", kv->path, timeout_ms);
            break;
        }
        struct pollfd pfd = {.fd = kv->inofd, .events = POLLIN};
        int ms = (int)((deadline - now + 999999u) / 1000000u);
        if (poll(&pfd, 1, ms) < 0 && errno != EINTR) {
            st = refit_error(REFIT_ERR_REGISTRY, "file registry %s: poll: %s", kv->path, strerror(errno));
            break;
        }
    }
    pthread_mutex_unlock(&kv->wait_mu);
    return st;
}

const refit_kv_ops_t refit_kv_file_ops = {
    .scheme = "file",
    .open = file_open,
    .close = file_close,
    .put = file_put,
    .put_new = file_put_new,
    .get_many = file_get_many,
    .del = file_del,
    .list = file_list,
    .wait = file_wait,
    .job_secret = file_job_secret,
};
