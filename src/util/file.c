#define _GNU_SOURCE /* renameat2, nftw */
#include "util/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
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

/* ---- writing ------------------------------------------------------------------------------- */

static nopad_status write_all(int fd, const char *path, const void *data, size_t len) {
    const char *p = data;
    while (len) {
        const ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return nopad_set_error(NOPAD_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        p += n;
        len -= (size_t)n;
    }
    return NOPAD_OK;
}

nopad_status write_file_synced(const char *path, const void *head, size_t head_len,
                               const void *body, size_t body_len) {
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return nopad_set_error(NOPAD_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    nopad_status st = write_all(fd, path, head, head_len);
    if (st == NOPAD_OK) st = write_all(fd, path, body, body_len);
    if (st == NOPAD_OK && fsync(fd) != 0)
        st = nopad_set_error(NOPAD_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    if (close(fd) != 0 && st == NOPAD_OK)
        st = nopad_set_error(NOPAD_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return st;
}

static nopad_status copy_one(const char *src, const char *dst) {
    char *data = NULL;
    size_t len = 0;
    nopad_status st = read_file(src, 0, &data, &len);
    if (st == NOPAD_OK) st = write_file_synced(dst, data, len, NULL, 0);
    free(data);
    return st;
}

nopad_status copy_files(const char *from, const char *to, const char *const *names, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char src[PATH_MAX], dst[PATH_MAX];
        snprintf(src, sizeof src, "%s/%s", from, names[i]);
        snprintf(dst, sizeof dst, "%s/%s", to, names[i]);
        if (!file_exists(src)) continue;
        nopad_status st = copy_one(src, dst);
        if (st != NOPAD_OK) return st;
    }
    return NOPAD_OK;
}

/* ---- folders written whole --------------------------------------------------------------------- */

/* PARENT/.NAME.nopad-SUFFIX beside dir = PARENT/NAME, and PARENT (with its '/', or "" for the
 * current folder) in parent when given. */
static nopad_status sibling(const char *dir, const char *suffix, char *out, size_t cap,
                            char *parent) {
    size_t len = strlen(dir), b;
    while (len > 1 && dir[len - 1] == '/') len--;
    for (b = len; b > 0 && dir[b - 1] != '/'; b--) {}
    const int base_len = (int)(len - b);
    const char *base = dir + b;
    if (base_len == 0 || (base_len == 1 && base[0] == '.') || (base_len == 2 && !strncmp(base, "..", 2)))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "'%s': expected a folder's name (not '', "
                               "'.', '..' or '/')", dir);
    const int n = snprintf(out, cap, "%.*s.%.*s.nopad-%s", (int)b, dir, base_len, base, suffix);
    if (n < 0 || (size_t)n >= cap)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "'%s': the path is too long", dir);
    if (parent) snprintf(parent, PATH_MAX, "%.*s", (int)b, dir);
    return NOPAD_OK;
}

/* fsync of a file or folder: the bytes, or the names in it, are on disk once it returns. */
static void sync_path(const char *path) {
    const int fd = open(path[0] ? path : ".", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void remove_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) == 0) nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Hard-links (a copy where links are refused) into `to` every entry of `from` that `to` lacks,
 * folders entry by entry. A temporary file of an earlier writer of a file `to` holds
 * ("NAME.tmp" beside NAME) and staging folders are left behind, to go with the old folder. */
static nopad_status link_missing(const char *from, const char *to) {
    DIR *d = opendir(from);
    if (!d) return nopad_set_error(NOPAD_ERR_IO, "%s: cannot read the folder: %s", from, strerror(errno));
    nopad_status st = NOPAD_OK;
    const struct dirent *e;
    while (st == NOPAD_OK && (e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        const size_t n = strlen(name);
        if (!strcmp(name, ".") || !strcmp(name, "..") || strstr(name, ".nopad-partial") ||
            strstr(name, ".nopad-old"))
            continue;
        char src[PATH_MAX], dst[PATH_MAX];
        struct stat sb;
        snprintf(src, sizeof src, "%s/%s", from, name);
        snprintf(dst, sizeof dst, "%s/%s", to, name);
        if (lstat(dst, &sb) == 0) continue; /* the new folder's own */
        if (n > 4 && !strcmp(name + n - 4, ".tmp")) {
            snprintf(dst, sizeof dst, "%s/%.*s", to, (int)(n - 4), name);
            if (lstat(dst, &sb) == 0) continue;
            snprintf(dst, sizeof dst, "%s/%s", to, name);
        }
        if (lstat(src, &sb) != 0) continue; /* gone meanwhile */
        if (S_ISDIR(sb.st_mode)) {
            if (mkdir(dst, sb.st_mode & 07777) != 0)
                st = nopad_set_error(NOPAD_ERR_IO, "%s: cannot create the folder: %s", dst, strerror(errno));
            if (st == NOPAD_OK) st = link_missing(src, dst);
            if (st == NOPAD_OK) sync_path(dst);
        } else if (S_ISLNK(sb.st_mode)) {
            char target[PATH_MAX];
            const ssize_t len = readlink(src, target, sizeof target - 1);
            if (len >= 0) target[len] = 0;
            if (len < 0 || symlink(target, dst) != 0)
                st = nopad_set_error(NOPAD_ERR_IO, "%s: cannot keep the link: %s", src, strerror(errno));
        } else if (link(src, dst) != 0) {
            st = S_ISREG(sb.st_mode) ? copy_one(src, dst)
                                     : nopad_set_error(NOPAD_ERR_IO, "%s: cannot keep it in the new "
                                                       "folder: %s", src, strerror(errno));
        }
    }
    closedir(d);
    return st;
}

/* dir, or the folder it leads to when it is a symbolic link: the link stays, its folder is the
 * one replaced (staged beside it, on its file system). */
static const char *through_link(const char *dir, char *buf) {
    struct stat sb;
    if (lstat(dir, &sb) == 0 && S_ISLNK(sb.st_mode) && realpath(dir, buf)) return buf;
    return dir;
}

nopad_status folder_stage_recover(const char *dir) {
    char stage[PATH_MAX], old[PATH_MAX], real[PATH_MAX];
    dir = through_link(dir, real);
    nopad_status st = sibling(dir, "partial", stage, sizeof stage, NULL);
    if (st == NOPAD_OK) st = sibling(dir, "old", old, sizeof old, NULL);
    if (st != NOPAD_OK) return st;
    struct stat sb;
    /* cut between the two renames of a swap without RENAME_EXCHANGE: the staging folder was
     * whole before the first */
    if (lstat(dir, &sb) != 0 && lstat(old, &sb) == 0 && rename(stage, dir) != 0 && rename(old, dir) != 0)
        return nopad_set_error(NOPAD_ERR_IO, "%s: cannot restore it from %s: %s", dir, old, strerror(errno));
    remove_tree(stage);
    remove_tree(old);
    return NOPAD_OK;
}

nopad_status folder_stage_check(const char *dir) {
    char name[PATH_MAX], real[PATH_MAX], up[PATH_MAX] = ".";
    dir = through_link(dir, real);
    nopad_status st = sibling(dir, "partial", name, sizeof name, NULL);
    struct stat d, at, parent;
    if (st != NOPAD_OK || stat(dir, &d) != 0) return st;
    /* the swap would leave the process in the removed old folder, where relative paths fail */
    for (int depth = 0; depth < 256 && stat(up, &at) == 0; depth++) {
        if (at.st_dev == d.st_dev && at.st_ino == d.st_ino)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s holds the current folder, which "
                                   "replacing it would remove: give another folder", dir);
        const size_t n = strlen(up);
        if (n + 4 > sizeof up) break;
        memcpy(up + n, "/..", 4);
        if (stat(up, &parent) != 0 || (parent.st_dev == at.st_dev && parent.st_ino == at.st_ino))
            break; /* the root */
    }
    return NOPAD_OK;
}

nopad_status folder_stage_begin(const char *dir, char *stage, size_t cap) {
    char real[PATH_MAX];
    dir = through_link(dir, real);
    nopad_status st = folder_stage_check(dir);
    if (st == NOPAD_OK) st = folder_stage_recover(dir);
    if (st == NOPAD_OK) st = sibling(dir, "partial", stage, cap, NULL);
    if (st == NOPAD_OK && mkdir(stage, 0755) != 0)
        st = nopad_set_error(NOPAD_ERR_IO, "%s: cannot create the folder (staging it in %s): %s",
                             dir, stage, strerror(errno));
    return st;
}

void folder_stage_abort(const char *stage) { remove_tree(stage); }

/* Puts the whole staging folder in the place of the non-empty folder dir. */
static nopad_status swap_in(const char *dir, const char *stage) {
#ifdef RENAME_EXCHANGE
    if (renameat2(AT_FDCWD, stage, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) return NOPAD_OK;
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
        return nopad_set_error(NOPAD_ERR_IO, "%s: cannot put %s in its place: %s", dir, stage,
                               strerror(errno));
#endif
    /* a file system without the exchange: two renames, which folder_stage_recover completes */
    char old[PATH_MAX];
    nopad_status st = sibling(dir, "old", old, sizeof old, NULL);
    if (st != NOPAD_OK) return st;
    remove_tree(old);
    if (rename(dir, old) != 0)
        return nopad_set_error(NOPAD_ERR_IO, "%s: cannot move it aside: %s", dir, strerror(errno));
    if (rename(stage, dir) != 0) {
        st = nopad_set_error(NOPAD_ERR_IO, "%s: cannot put %s in its place: %s", dir, stage,
                             strerror(errno));
        rename(old, dir);
        return st;
    }
    remove_tree(old);
    return NOPAD_OK;
}

nopad_status folder_stage_commit(const char *dir, const char *stage) {
    char parent[PATH_MAX], unused[PATH_MAX], real[PATH_MAX];
    dir = through_link(dir, real);
    nopad_status st = sibling(dir, "partial", unused, sizeof unused, parent);
    struct stat sb;
    const int exists = st == NOPAD_OK && lstat(dir, &sb) == 0;
    if (exists && !S_ISDIR(sb.st_mode))
        st = nopad_set_error(NOPAD_ERR_IO, "%s: not a folder", dir);
    if (st == NOPAD_OK && exists) st = link_missing(dir, stage);
    if (st == NOPAD_OK) {
        sync_path(stage);
        if (rename(stage, dir) != 0) { /* an absent or empty dir is replaced by a plain rename */
            if (errno == ENOTEMPTY || errno == EEXIST) st = swap_in(dir, stage);
            else st = nopad_set_error(NOPAD_ERR_IO, "%s: cannot put %s in its place: %s", dir,
                                      stage, strerror(errno));
        }
    }
    if (st != NOPAD_OK) {
        folder_stage_abort(stage);
        return st;
    }
    sync_path(parent);
    remove_tree(stage); /* after an exchange: the old folder */
    return NOPAD_OK;
}
