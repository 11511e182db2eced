/* Internal: opening files of a checkpoint directory (config.json, the
 * safetensors index, shards) that refit did not write and must not trust to
 * be what their names say.  Only regular files are opened: a FIFO would block
 * open() or read() forever, a device could be read without end, and neither a
 * directory nor a socket holds a checkpoint.
 *
 * And writing files that others may read or replace (safetensors dumps, the
 * metrics textfile) without ever writing through a name someone else chose:
 * refit_outfile_*. */
#ifndef REFIT_IO_FILE_H
#define REFIT_IO_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

/* "a FIFO", "a symbolic link", ... for a mode that is not a regular file. */
const char *refit_file_kind(unsigned mode);

/* Opens path read-only (close-on-exec) if it is a regular file, following
 * symbolic links; *fd and *size (bytes) are written only on success.  Never
 * blocks on a FIFO: the file is checked before it is opened, and the open
 * descriptor again (O_NONBLOCK, then fstat), so a file swapped between the
 * two checks is refused too.  REFIT_ERR_IO naming the path and what it is
 * ("... is a FIFO, not a regular file") or the errno of open/stat. */
refit_status_t refit_open_regular(const char *path, int *fd, uint64_t *size);

/* The whole of a regular file into a fresh buffer (free() it), NUL-terminated
 * (the NUL not counted in *len); REFIT_ERR_IO as for refit_open_regular, or if
 * the file holds more than max bytes. */
refit_status_t refit_read_regular(const char *path, size_t max, char **buf, size_t *len);

/* ---- writing: an exclusive temporary, renamed into place ----
 * refit_outfile_open opens the directory of path once and creates, in it, a
 * temporary of a random name with O_CREAT | O_EXCL | O_NOFOLLOW (a symbolic
 * link or a file someone put in the way is never opened); commit renames it
 * over the final name with renameat (a symbolic link at the final name is
 * replaced, never followed).  Both act on the directory opened at first, so a
 * path swapped in between cannot redirect the write.  With private_dir the
 * directory must also be this user's and closed to writes by group and others
 * unless sticky (then others cannot move our file away either): else
 * REFIT_ERR_AUTH naming the directory, its owner and mode, and what to do. */
typedef struct {
    int dirfd, fd;
    bool failed; /* a write failed: commit refuses, errno text kept in err */
    int err;
    char *dir, *name; /* malloc'ed: the directory and the final name in it */
    char tmp[96];
} refit_outfile_t;

/* mode: of the final file (umask applies).  On failure nothing is left
 * behind and *o needs no abort. */
refit_status_t refit_outfile_open(refit_outfile_t *o, const char *path, unsigned mode, bool private_dir);
/* Appends len bytes (errors are kept for commit). */
void refit_outfile_write(refit_outfile_t *o, const void *buf, size_t len);
/* Closes the temporary and renames it into place; on any failure (an earlier
 * write's too) removes it: REFIT_ERR_IO naming path.  Frees *o either way. */
refit_status_t refit_outfile_commit(refit_outfile_t *o, const char *path);
/* Removes the temporary and frees *o. */
void refit_outfile_abort(refit_outfile_t *o);

#endif
