/* Training data (issue 24): examples read from a file and tokenized once, shuffled per epoch from a
 * seed, packed into token-budget batches with no padding (cu_seqlens), and for masked-LM training
 * masked dynamically: each epoch draws a fresh masking of every example from a counter-based
 * generator (Philox4x32-10) keyed by (seed, epoch, example), so the masking is reproducible and
 * does not depend on how examples are batched.
 *
 * Inputs:
 *   TRAIN_DATA_LINES  one example per line of plain text (blank lines are skipped, and for MLM
 *                     lines with no token that can be masked: only [UNK]s or special tokens);
 *   TRAIN_DATA_JSONL  one JSON object per line: "text" (a string), optional "text_pair" (a
 *                     string: the pair is [CLS] a [SEP] b [SEP], b and its [SEP] of token type 1,
 *                     from the single template's prefix and suffix: BERT's pair template),
 *                     and for classification "label": an integer in [0, num_labels), or any
 *                     finite number for regression (num_labels == 1).
 * train_dataset_load holds the whole corpus tokenized in memory (int32 ids); src/train/stream.h
 * reads a corpus too large for that a window of blocks at a time, building its windows with
 * train_dataset_init / train_dataset_add_lines. */
#ifndef NOPAD_TRAIN_DATA_H
#define NOPAD_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "nopad.h"
#include "train/train.h"

typedef enum train_data_format {
    TRAIN_DATA_LINES = 0,
    TRAIN_DATA_JSONL = 1,
} train_data_format;

typedef struct train_data_params {
    train_data_format format; // default TRAIN_DATA_LINES
    train_task task;          // MLM: no labels read; CLASSIFY: "label" required (JSONL only)
    int32_t num_labels;       // CLASSIFY: labels in [0, num_labels); 1 = regression targets
    int32_t max_length;       // the model maximum, special tokens included (>= 3)
    int32_t vocab_size;       // the model's: every id must be below it (0: the tokenizer's)
    int truncate;             // 1: cut longer examples (a pair: the longer side first); 0: error
    float mask_prob;          // MLM: share of non-special tokens chosen; default 0.15
    int whole_word;           // MLM: choose whole words (a WordPiece word: a piece and the "##"
                              // pieces after it), each with probability mask_prob; default 0
    int pack;                 // MLM, train_dataset_parse / _load: the lines (each with its
                              // [CLS] ... [SEP], of any length: no truncation, no error) concatenated
                              // in file order and cut into examples of max_length tokens, the last
                              // one shorter; default 0
} train_data_params;
train_data_params train_data_default_params(void);

/* The tokenized corpus (or a streamed window of it): example i is ids[offsets[i] .. offsets[i+1]),
 * its first type0_len[i] tokens of token type 0 and the rest of type 1. */
typedef struct train_dataset {
    train_data_params params;
    int32_t n_examples;
    int64_t n_tokens;
    int32_t *ids;          // [n_tokens]
    int64_t *offsets;      // [n_examples + 1]
    int32_t *type0_len;    // [n_examples]
    int64_t *line;         // [n_examples] 1-based line of the file, for messages
    int64_t *index;        // [n_examples] the example's place among the corpus's examples (in
                           // memory: i; a streamed window: where its lines are), which keys its
                           // masking, so the masks do not depend on how the corpus is read
    int32_t *labels;       // [n_examples] CLASSIFY with num_labels > 1, else NULL
    float *targets;        // [n_examples] CLASSIFY with num_labels == 1, else NULL
    int32_t n_truncated;   // examples cut to max_length
    int32_t n_skipped;     // blank lines; MLM: lines with no token that can be masked
    /* masking */
    int32_t vocab_size;
    int32_t mask_id;       // the tokenizer's [MASK] (<mask>); -1 when it has none (CLASSIFY)
    uint8_t *special;      // [vocab_size] 1: never masked nor drawn as a random replacement
    int32_t *plain_ids;    // the ids that are not special: the random replacements
    int32_t n_plain;
    uint8_t *continues;    // [vocab_size] 1: a piece that continues the word before it (WordPiece's
                           // "##" pieces); NULL unless whole_word
    int64_t cap_tokens;    // allocated lengths of ids and of the per-example arrays (appending)
    int32_t cap_examples;
} train_dataset;

/* Reads and tokenizes `path`. Errors name the file and line: a line that is not a JSON object,
 * a missing or mistyped field, a label out of range or not an integer, invalid UTF-8, a line
 * longer than max_length with truncate off (NOPAD_ERR_TOO_LONG), an id at or above vocab_size,
 * and a corpus with no example. MLM needs a [MASK] token in the tokenizer. */
nopad_status train_dataset_load(const char *path, const nopad_tokenizer *tok,
                                const train_data_params *params, train_dataset *out);
/* The same on `len` bytes of text in memory (not NUL-terminated; `path` names it in messages). */
nopad_status train_dataset_parse(const char *text, size_t len, const char *path,
                                 const nopad_tokenizer *tok, const train_data_params *params,
                                 train_dataset *out);
void train_dataset_free(train_dataset *d);

/* The parts of train_dataset_parse, for a reader that builds the dataset piece by piece:
 * init checks the parameters and reads the tokenizer's special tokens into an empty dataset;
 * add_lines appends the examples of the lines that start in text[0, owned) (text[0] starts a
 * line; each runs to its '\n' or to text[len]), the first being line `first_line` of `path` and
 * example `first_index` of the corpus; clear empties it, keeping its memory. A dataset built so
 * keeps labels and targets arrays whatever the task, and may have no example. */
nopad_status train_dataset_init(const nopad_tokenizer *tok, const train_data_params *params,
                                train_dataset *out);
nopad_status train_dataset_add_lines(train_dataset *d, const nopad_tokenizer *tok, const char *text,
                                     size_t len, size_t owned, const char *path,
                                     int64_t first_line, int64_t first_index);
void train_dataset_clear(train_dataset *d);
/* params.pack (masked LM): the dataset's examples, lying one after another in ids, cut anew into
 * pieces of max_length tokens (train_dataset_parse does it to the whole file). A piece starts at
 * first_cut and every max_length tokens after it while it starts inside the dataset's own tokens;
 * the last ones run on into tail[n_tail], the tokens that follow the dataset's in the file (a
 * data-parallel rank's share: the next ranks' first tokens; tokens before first_cut end the
 * previous rank's last piece). Pieces are numbered from 0 (index), and one with no token that can
 * be masked is dropped (n_skipped). */
nopad_status train_dataset_pack(train_dataset *d, int64_t first_cut, const int32_t *tail, int64_t n_tail);
/* The bytes the dataset has allocated. */
size_t train_dataset_bytes(const train_dataset *d);

/* The masked-LM corruption of example `example` in epoch `epoch`, drawn from (seed, epoch,
 * index[example]): each non-special token is chosen with probability mask_prob (an example where
 * none is chosen gets one chosen uniformly, as BERT's max(1, ...), so every batch has a masked
 * token); with whole_word, each word instead, all of its pieces together (the draw at its first
 * piece; none chosen: one word chosen uniformly). Of the chosen pieces, 80% become [MASK], 10% a
 * uniformly drawn non-special id, 10% stay, each piece drawn on its own. Writes the example's
 * ids, corrupted, to tokens[len], the chosen positions (0-based within the example, increasing)
 * to positions and the original ids to labels (each up to len entries), and returns how many were
 * chosen. */
int32_t train_mask_example(const train_dataset *d, uint64_t seed, uint32_t epoch, int32_t example,
                           int32_t *tokens, int32_t *positions, int32_t *labels);

/* order[0, n) = 0 .. n-1 shuffled from (seed, epoch, window): the examples of a loader's epoch
 * (TRAIN_SHUFFLE_EXAMPLES), or a streamed epoch's blocks (TRAIN_SHUFFLE_BLOCKS, drawn apart). */
typedef enum train_shuffle_kind {
    TRAIN_SHUFFLE_EXAMPLES = 1,
    TRAIN_SHUFFLE_BLOCKS = 2,
} train_shuffle_kind;
void train_shuffle(int32_t *order, int32_t n, uint64_t seed, uint32_t epoch, uint32_t window,
                   train_shuffle_kind kind);

/* Batches over a dataset: each epoch visits every example once, in an order shuffled from
 * (seed, epoch, window), packing consecutive examples of that order into a batch until the next
 * one would exceed max_tokens tokens or max_seqs sequences. `window` is 0 for a dataset in
 * memory; a streamed window sets it to its number, so each window of an epoch shuffles apart. */
typedef struct train_loader {
    const train_dataset *data;
    int32_t max_tokens, max_seqs;
    uint64_t seed;
    uint32_t epoch;
    uint32_t window;
    int32_t cursor;        // examples of this epoch's order already batched
    int32_t *order;        // [n_examples] this epoch's order
    /* the current batch; batch's pointers point here */
    train_batch batch;
    int32_t *examples;     // [max_seqs] the example index of each sequence of the batch
    int64_t *numbers;      // [max_seqs] its number in the corpus (data->index): batch.examples
    int32_t *cu_seqlens, *tokens, *types, *mlm_positions, *mlm_labels, *labels;
    float *targets;
} train_loader;

/* A loader positioned at the start of epoch 0. Every example must fit max_tokens (else
 * NOPAD_ERR_INVALID_ARGUMENT naming its line). */
nopad_status train_loader_init(const train_dataset *d, int32_t max_tokens, int32_t max_seqs,
                               uint64_t seed, train_loader *out);
/* Positions the loader at example `cursor` of epoch `epoch`'s order (resuming: the epoch and
 * cursor a checkpoint saved). */
nopad_status train_loader_seek(train_loader *l, uint32_t epoch, int32_t cursor);
/* Fills l->batch with the next batch and returns 1, or returns 0 at the end of the epoch (then
 * seek to the next one). */
int train_loader_next(train_loader *l);
void train_loader_free(train_loader *l);

#endif
