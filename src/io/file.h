/* Internal: opening files of a checkpoint directory (config.json, the
 * safetensors index, shards) that refit did not write and must not trust to
 * be what their names say.  Only regular files are opened: a FIFO would block
 * open() or read() forever, a device could be read without end, and neither a
 * directory nor a socket holds a checkpoint. */
#ifndef REFIT_IO_FILE_H
#define REFIT_IO_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

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

#endif
