/* Streaming training data (issue 24): a corpus too large to hold tokenized is read a window at a
 * time, with memory bounded by the window, not by the corpus.
 *
 * The file is cut into blocks of block_bytes; a block owns the lines that start in it (the last
 * may run past its end). Each epoch visits the blocks in an order shuffled from (seed, epoch);
 * window w of the epoch is blocks w·W .. w·W + W - 1 of that order, read and tokenized together
 * (train_dataset_add_lines), its examples shuffled from (seed, epoch, w) and packed into
 * token-budget batches by a train_loader, as a dataset in memory is. An example's masking is
 * keyed by its index in the corpus, so it equals the in-memory masking of the same file.
 *
 * Opening reads the file once in order: it counts the '\n' bytes before each block (line
 * numbers for messages) and tokenizes every line, keeping only counts (examples per block,
 * tokens, truncated and skipped lines), so a bad line fails before training, named by file and
 * line as in memory. What is held besides the window: three numbers a block.
 *
 * A position is (epoch, window, cursor within the window's order): re-reading the window gives
 * the same examples, order and batches, which is how a resumed run continues. */
#ifndef NOPAD_TRAIN_STREAM_H
#define NOPAD_TRAIN_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "train/data.h"

/* The window's text and the blocks it is cut into. The loader's memory is that text tokenized
 * (4 bytes a token, 36 an example, arrays grown by doubling), plus one block's text and three
 * numbers a block: 2.5x the window's text on Debian's licences with MiniLM's WordPiece. */
typedef struct train_stream_params {
    int64_t block_bytes;   // 1 MiB
    int32_t window_blocks; // 64
} train_stream_params;
train_stream_params train_stream_default_params(void);
/* Blocks of min(1 MiB, buffer / 16) bytes (at least 64), as many as fill `buffer_bytes`: 16 or
 * more a window, so a window mixes as many places of the file. */
train_stream_params train_stream_params_for_buffer(int64_t buffer_bytes);

typedef struct train_stream {
    /* the corpus */
    char *path;
    int fd;
    int64_t size;
    const nopad_tokenizer *tok;
    int64_t block_bytes;
    int32_t window_blocks, n_blocks, n_windows;
    int64_t *newlines_before; // [n_blocks] '\n' bytes before each block's start
    int64_t *first_example;   // [n_blocks + 1] corpus index of each block's first example
    int64_t n_examples, n_tokens, n_truncated, n_skipped;
    /* the blocks this process reads: every one, or a data-parallel rank's [share_first, share_end)
     * of `ranks` (train_stream_open_share) */
    int32_t ranks, share_first, share_end;
    /* batching */
    int32_t max_tokens, max_seqs;
    uint64_t seed;
    uint32_t epoch;           // the epoch of block_order
    int32_t window;           // the window loaded (n_windows: past the epoch's last)
    int32_t *block_order;     // [n_blocks] this epoch's
    train_dataset data;       // the window's examples
    train_loader loader;      // over data; loader.batch is the current batch
    int have_loader;          // 0 when the window has no example
    char *text;               // one block's lines
    size_t text_cap;
    size_t peak_bytes;        // the most train_stream_bytes has been
} train_stream;

/* Opens `path`, reads it once (see above) and positions the stream at the start of epoch 0.
 * Errors are train_dataset_load's (file and line named), plus a line longer than the window's
 * text (NOPAD_ERR_TOO_LONG: give a larger buffer) and an example over the batch budget. */
nopad_status train_stream_open(const char *path, const nopad_tokenizer *tok,
                               const train_data_params *params, const train_stream_params *sp,
                               int32_t max_tokens, int32_t max_seqs, uint64_t seed,
                               train_stream *out);
/* Data-parallel streaming (train/dp.h): rank `rank` of `ranks` reads the blocks of its 1/N of the
 * file (blocks share_first(rank) .. share_first(rank + 1) - 1), and only those: its '\n' bytes and
 * examples are counted at opening, then summed with the other ranks' by `sum` (collective: every
 * rank's values added in place, after the ranks agree on `st`, each rank's status so far: a
 * failure on one is returned on all; called with n = 0 to agree alone), so every rank knows every
 * block's line numbers and example count, and each window's reading (train_stream_seek) reads the
 * rank's blocks of the window only, without a loader (train_dp packs the window's examples of
 * every rank). Lines, example numbers and windows are those of train_stream_open on the whole file
 * with the same parameters; the stream is not positioned (train_dp seeks it). ranks 1: the stream
 * of train_stream_open (sum unused). */
typedef nopad_status (*train_stream_sum_fn)(void *user, nopad_status st, int64_t *values, size_t n);
nopad_status train_stream_open_share(const char *path, const nopad_tokenizer *tok,
                                     const train_data_params *params, const train_stream_params *sp,
                                     int32_t max_tokens, int32_t max_seqs, uint64_t seed, int32_t rank,
                                     int32_t ranks, train_stream_sum_fn sum, void *user, train_stream *out);
/* The first block of rank `rank` of `ranks` among n_blocks, and the rank that reads block b. */
int32_t train_stream_share_first(int32_t n_blocks, int32_t rank, int32_t ranks);
int32_t train_stream_block_reader(const train_stream *s, int32_t b);

/* Positions the stream at example `cursor` of window `window` of epoch `epoch` (what a
 * checkpoint saved: s->epoch, s->window, s->loader.cursor after a batch). */
nopad_status train_stream_seek(train_stream *s, uint32_t epoch, int32_t window, int32_t cursor);
/* The next batch into s->loader.batch and *got = 1, or *got = 0 at the end of the epoch (then
 * seek to the next one). Reading the next window may fail (I/O, or the file changed since it was
 * opened). */
nopad_status train_stream_next(train_stream *s, int *got);
/* The batches of epoch `epoch`, counted by reading it (the learning-rate schedule needs the
 * run's step count); leaves the stream at the end of that epoch. */
nopad_status train_stream_count_batches(train_stream *s, uint32_t epoch, int64_t *n);
/* The bytes the stream holds now: the window, its loader, the block text and the block tables. */
size_t train_stream_bytes(const train_stream *s);
void train_stream_close(train_stream *s);

#endif
