/* Reading whole files, the one way every loader does it. */
#ifndef NOPAD_UTIL_FILE_H
#define NOPAD_UTIL_FILE_H

#include <stddef.h>

#include "nopad.h"

/* Reads the regular file `path` (at most `limit` bytes; 0: no limit) into a NUL-terminated
 * buffer the caller frees. A missing or unreadable file is NOPAD_ERR_IO naming the path; a
 * folder, FIFO or device is refused before anything is read from it (NOPAD_ERR_IO, "not a
 * regular file"), so a named pipe in place of a model file cannot block the caller; a larger
 * file than `limit` is NOPAD_ERR_FORMAT. */
nopad_status read_file(const char *path, size_t limit, char **data, size_t *len);

/* Whether `path` exists as anything, a broken or looping symbolic link included: callers that skip
 * absent optional files must still read (and so reject with a reason) a file that is there but bad. */
int file_exists(const char *path);

#endif
