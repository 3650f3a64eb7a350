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
