#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

nopad_status read_file(const char *path, size_t limit, char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one; the
     * type check below then refuses it. Regular files ignore the flag. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return nopad_set_error(NOPAD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    nopad_status st = NOPAD_OK;
    if (fstat(fd, &sb) != 0)
        st = nopad_set_error(NOPAD_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = nopad_set_error(NOPAD_ERR_IO, "%s: not a regular file%s", path,
                             S_ISDIR(sb.st_mode) ? " (it is a folder)" : "");
    else if (sb.st_size < 0 || (limit && (uint64_t)sb.st_size > limit))
        st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: %lld bytes, more than the %zu-byte limit", path,
                             (long long)sb.st_size, limit);
    size_t size = st == NOPAD_OK ? (size_t)sb.st_size : 0, used = 0;
    char *buf = st == NOPAD_OK ? malloc(size + 1) : NULL;
    if (st == NOPAD_OK && !buf) st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: %zu bytes", path, size);
    while (st == NOPAD_OK && used < size) {
        ssize_t got = read(fd, buf + used, size - used);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) st = nopad_set_error(NOPAD_ERR_IO, "%s: read error: %s", path, strerror(errno));
        if (got <= 0) break; /* 0: the file shrank since fstat; keep what was read */
        used += (size_t)got;
    }
    close(fd);
    if (st != NOPAD_OK) {
        free(buf);
        return st;
    }
    buf[used] = '\0';
    *data = buf;
    *len = used;
    return NOPAD_OK;
}

int file_exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0; /* lstat: a broken or looping link is there too, and read_file says why */
}
