/* Embedding writers (JSON lines and .npy, in input order) and the progress line on stderr. */
#ifndef NOPAD_TOOLS_CLI_OUTPUT_H
#define NOPAD_TOOLS_CLI_OUTPUT_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

typedef enum out_format { FORMAT_JSONL = 0, FORMAT_NPY = 1 } out_format;

/* Writes rows of H floats in input order. An .npy file needs its row count in the header,
 * unknown while streaming: a regular file gets a placeholder header that is rewritten at the
 * end; anything else (a pipe, or a file opened for appending, where every write lands at the
 * end) has its rows held in memory and written at the end. The caller fills the first five
 * fields, zeroes the rest, and closes f. Every function prints why it fails and returns -1. */
typedef struct writer {
    FILE *f;
    const char *name;      /* for messages: the path or "stdout" */
    out_format format;
    int per_token;         /* --pooling none: rows are tokens, not sequences */
    int32_t hidden;        /* H */
    int64_t rows;          /* rows written (npy) */
    int seekable;          /* npy: header rewritten in place at header_pos */
    off_t header_pos;
    float *held;           /* [rows, H] npy rows kept for the end when f cannot seek */
    size_t held_cap;       /* in floats */
} writer;

int writer_begin(writer *w);
/* out is [n_seqs, H] pooled, or [T, H] per token with cu_seqlens[n_seqs+1]; values finite. */
int writer_batch(writer *w, int32_t n_seqs, const int32_t *cu_seqlens, const float *out);
/* Completes the .npy header (or writes everything held) and flushes. */
int writer_end(writer *w);
void writer_free(writer *w); /* frees the held rows, not f */

/* An output file that appears whole or not at all: written to a temporary file beside it
 * (".NAME.nopad-PID.tmp", same folder, so the rename cannot cross file systems), fsynced and
 * renamed over NAME at the end, so that a failed or interrupted run leaves an existing file as it
 * was. A path that is not a regular file (stdout, a pipe, /dev/null) is written in place; a link
 * to a regular file has its target replaced. SIGINT, SIGTERM and SIGHUP remove the temporary
 * before the process ends. */
typedef struct output_file {
    FILE *f;
    const char *name; /* for messages: the path given, or "stdout" */
    char *path;       /* the file the temporary replaces; NULL: written in place */
    char *tmp;
} output_file;

/* Before anything is read or written: refuses (prints why, -1) an empty --output and an output
 * that is the same file as the input (the same device and inode, whatever the names; input NULL:
 * stdin), which writing the output would destroy. */
int output_check(const char *output, const char *input);
/* Opens path (NULL: stdout) for writing; prints why and returns -1 when it cannot. */
int output_open(output_file *of, const char *path);
/* Flushes, fsyncs and closes, then renames the temporary into place; prints why and returns -1
 * (the temporary removed) when a write failed. */
int output_commit(output_file *of);
/* Closes and removes the temporary (the old file, if any, stays); a no-op after output_commit. */
void output_discard(output_file *of);

/* A "\r embedded ..." line on stderr, only when enabled (stderr is a terminal) and the run has
 * taken over a second (a quick run or a log file stays clean), at most 4 times a second. */
typedef struct progress {
    int enabled;
    int shown;
    double start, last;
    int64_t lines, tokens;
} progress;

void progress_show(progress *p, int final);

#endif
