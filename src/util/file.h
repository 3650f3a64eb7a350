/* Reading whole files, the one way every loader does it; writing folders whole. */
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

/* Writes head then body to `path` (created or truncated) and fsyncs it. */
nopad_status write_file_synced(const char *path, const void *head, size_t head_len,
                               const void *body, size_t body_len);

/* Copies the files of names[n] that exist in `from` into `to` (fsynced). */
nopad_status copy_files(const char *from, const char *to, const char *const *names, size_t n);

/* A folder written whole: its new content goes into a staging folder beside it
 * (PARENT/.NAME.nopad-partial), which then takes its place in one rename, so that a reader (or a
 * run interrupted at any point, even by SIGKILL or a power cut) sees the old folder or the new
 * one, never a mix:
 *   folder_stage_begin   removes what an interrupted earlier write left (folder_stage_recover)
 *                        and creates the staging folder, its path in stage[cap];
 *   (the caller writes the new files into stage, each fsynced)
 *   folder_stage_commit  hard-links into stage whatever the old folder holds that the new one
 *                        does not (a best/ subfolder, a log file, the user's own files: they are
 *                        kept, as when files were overwritten in place), fsyncs stage, swaps it
 *                        with `dir` (renameat2 RENAME_EXCHANGE; a plain rename when `dir` is
 *                        absent or empty), fsyncs the parent and removes the old folder;
 *   folder_stage_abort   removes the staging folder after a failed write.
 * The parent of `dir` must exist. A `dir` that is a symbolic link keeps it: the folder it leads
 * to is the one replaced. */
nopad_status folder_stage_begin(const char *dir, char *stage, size_t cap);
/* What folder_stage_begin checks first, for a caller to refuse a folder before long work: a name
 * ('', '.', '..', '/' are none) and not the current folder or one holding it (NOPAD_ERR_INVALID_ARGUMENT). */
nopad_status folder_stage_check(const char *dir);
nopad_status folder_stage_commit(const char *dir, const char *stage);
void folder_stage_abort(const char *stage);
/* Finishes or undoes what an interrupted folder_stage_commit left beside `dir`: `dir` is whole
 * afterwards (the new folder where the swap had begun, else the old) and no temporary is left. */
nopad_status folder_stage_recover(const char *dir);

#endif
