/* Data-parallel padding-free training (issue 41): every rank of a communicator holds the whole
 * model and trains on its part of each global batch; the gradients are summed across ranks, so a
 * step equals one process's step on the whole global batch.
 *
 * - Data: each rank tokenizes the lines that start in its share of the file's bytes
 *   (train_dataset_load_shard); the ranks then exchange the examples' lengths (4 bytes an
 *   example), so each knows every example's length and which rank read it. The global batches
 *   are those one process makes with the global budget (train_loader's shuffle and packing over
 *   all examples, from the same seed), and an example's masking and dropout masks are keyed by
 *   its number in the corpus, so a run's steps do not depend on the world size. Packed lines are
 *   cut into one process's pieces across the shares; streamed data is read a window at a time,
 *   each rank reading its blocks of the window (train_dp_init_stream).
 * - The exchange: the sequences of a global batch start on the ranks that read them, which is
 *   unbalanced (one rank may hold twice another's tokens, and every all-reduce waits for the
 *   slowest). train_balance_plan reassigns them from the lengths alone, balancing each rank's
 *   work (tokens and Σ L²) and moving as few sequences as it can; only those move (one
 *   comm_all_to_allv of their ids, types, masked positions and labels). Which rank computes a
 *   sequence changes only the order of float sums, never what is summed.
 * - The step: a rank's sequences go through the forward and backward in micro-batches of the
 *   context's budget, their loss's gradient divided by the global batch's rows (masked tokens or
 *   sequences), so the sum of every rank's gradients is the gradient of the global mean loss. The
 *   gradients are summed in buckets (the head, each layer, the embeddings, in the order the
 *   backward finishes them), each all-reduce issued as soon as the backward has written its
 *   bucket for the last time. Then every rank takes the same optimiser step on the same
 *   gradients (LAMB's and clipping's norms are of the summed gradients: global by construction).
 */
#ifndef NOPAD_TRAIN_DP_H
#define NOPAD_TRAIN_DP_H

#include <stdint.h>

#include "parallel/comm.h"
#include "train/data.h"
#include "train/stream.h"
#include "train/train.h"

/* ---- the balance plan (a pure function of the lengths) ---------------------------------------- */

/* The ranks the n sequences of a global batch go to: sequence i, of lengths[i] tokens, is on rank
 * owner[i] (in [0, ranks)) and goes to dest[i]. A rank's work is its tokens (the GEMMs', norms')
 * and its Σ L² (attention's); the plan lowers Σ over ranks of both's squared deviations from their
 * means (relative to the means), one sequence at a time, each time the move (or, where no move
 * helps, the swap of a longer for a shorter sequence) that lowers it most, until every rank is
 * within 5% of both means or nothing lowers it (2% moves up to half the sequences of a skewed
 * batch, against 46% at 5%). Balancing the larger of the two alone gets stuck
 * where one rank holds the long sequences and another the many short ones, each over in one
 * measure (1.12x on a batch of 28- and 7-token sequences). A balanced batch moves nothing.
 * Deterministic (ties to the lowest index and rank): every rank computes the same plan. Returns
 * the number of sequences that end on another rank than their owner's. */
int32_t train_balance_plan(const int32_t *lengths, const int32_t *owner, int32_t n, int32_t ranks,
                           int32_t *dest);

/* ---- data ------------------------------------------------------------------------------------ */

/* Rank `rank` of `ranks`'s share of the file at `path`: the examples of the lines that start in
 * bytes [rank·size/ranks, (rank+1)·size/ranks), tokenized as train_dataset_load tokenizes them,
 * with their file line numbers; index[] counts from 0 on this rank (train_dp_init adds the
 * examples of the ranks before it, making them the corpus's numbers). A rank may get no example.
 * With params->pack the lines are kept whole here; train_dp_init cuts every rank's share into the
 * pieces one process cuts from the whole file (a piece may start in one share and end in the
 * next). */
nopad_status train_dataset_load_shard(const char *path, const nopad_tokenizer *tok,
                                      const train_data_params *params, int32_t rank, int32_t ranks,
                                      train_dataset *out);

/* ---- gradient buckets -------------------------------------------------------------------------- */

/* The gradients in the order the backward finishes them: bucket 0 the head's, bucket 1 + k layer
 * L-1-k's, bucket L + 1 the embeddings' (the word table last: the tied MLM decoder adds to it
 * first). train_context.grads_ready is called with these numbers. */
int32_t train_grad_buckets(const train_model *m);
void train_grad_bucket(const train_model *m, int32_t bucket, int64_t *offset, int64_t *count);

/* ---- the data-parallel run ------------------------------------------------------------------- */

/* The balance of one step or a run: tokens per rank, the largest rank's before and after the
 * exchange, and the mean (summed over steps for a run). */
typedef struct train_dp_balance {
    int64_t steps;
    int64_t max_before, max_after; // tokens of the most loaded rank, summed over steps
    int64_t total;                 // tokens of the global batches (mean = total / ranks)
    int64_t moved_seqs, moved_tokens;
} train_dp_balance;

/* A global batch planned and sent on its way: the next step's is staged (planned, its records
 * built, its exchange started) as the current step begins, so that its exchange overlaps the
 * current step's forward and backward (MPI moves it inside their gradient all-reduces). */
typedef struct train_dp_staged {
    int valid;                     // staged; n_batch 0: the epoch's end
    int32_t n_batch, batch_tokens; // sequences and tokens
    int32_t *batch;                // [global_seqs] example numbers, in the loader's order
    int32_t *owner, *dest, *blen;  // [global_seqs] who read it, who computes it, its length
    int32_t *send, *recv;          // the exchange's records out and in (6·global_seqs + 3·global_tokens words)
    size_t *counts;                // [4 · size] send counts and offsets, receive counts and offsets
    int32_t cursor;                // the loader's position after this batch
    train_dp_balance balance;
    comm_host_request *exchange;   // in flight; NULL once received, or when nothing moves
} train_dp_staged;

typedef struct train_dp {
    nopad_comm *comm;
    int32_t rank, size;
    int exchange;                 // 1: balance each global batch across the ranks
    train_model *model;
    train_dataset *local;         // this rank's share (streamed: its blocks of the window); index[] the
                                  // corpus's example numbers
    train_stream *stream;         // streamed data (train_dp_init_stream), else NULL
    int32_t window;               // streamed: the window loaded (0 in memory)
    /* the corpus (streamed: the window), every rank's examples together */
    int32_t n_examples;
    int32_t *lengths;             // [n_examples] tokens of each
    int32_t *reader, *local_index; // [n_examples] the rank that read each, and where in its `local`
    int32_t cap_examples;         // the arrays' length
    /* the global loader: train_loader's order and packing over every example */
    int32_t global_tokens, global_seqs;
    int32_t local_tokens, local_seqs; // one forward's budget (the context's)
    uint64_t seed;
    uint32_t epoch;
    int32_t cursor;               // after the current step's batch (what a checkpoint saves)
    int32_t pack_cursor;          // after the staged batch's
    int32_t *order;               // [n_examples]
    /* the global batch of this step, and the next one's staged */
    int32_t n_batch, batch_tokens; // sequences and tokens of this step's
    train_dp_staged staged[2];
    int32_t next;                 // staged[next] is the next step's
    train_dp_staged *now;         // the step's plan (its batch, owners and destinations), once taken
    /* this rank's sequences of the step, as records (dp.c: length, type-0 length, masked count,
     * label or target bits, example number, then ids, masked positions and their labels, each
     * `length` long); records hold 6·global_seqs + 3·global_tokens words: a whole global batch */
    int32_t *records;
    int32_t n_mine;
    /* one micro-batch */
    train_batch micro;
    int32_t *cu_seqlens, *tokens, *types, *mlm_positions, *mlm_labels, *labels;
    float *targets;
    int64_t *examples;            // [local_seqs] the micro-batch's example numbers
    double *loss_sums;            // [size] each rank's loss sum of the step
    /* the global batch gathered on one rank (train_dp_gather_batch; allocated at its first call) */
    train_batch gathered;
    int32_t *gathered_records, *gathered_ranks;
    int32_t *g_cu_seqlens, *g_tokens, *g_types, *g_mlm_positions, *g_mlm_labels, *g_labels;
    float *g_targets;
    int64_t *g_examples;
    train_dp_balance step_balance, run_balance;
    nopad_status bucket_status;   // the first failed bucket all-reduce of a backward
} train_dp;

/* Collective. Every rank gives its share (train_dataset_load_shard), whose indices become the
 * corpus's; the global batch budgets are the ranks' budgets times the ranks, one forward's those
 * of the context the step runs on. An example longer than local_tokens, or no example in any
 * share, is an error on every rank. */
nopad_status train_dp_init(nopad_comm *comm, int exchange, train_model *m, train_dataset *local,
                           int32_t local_tokens, int32_t local_seqs, int32_t global_tokens,
                           int32_t global_seqs, uint64_t seed, train_dp *out);
void train_dp_free(train_dp *dp);

/* Streamed data: `stream`, opened by train_stream_open_share (rank and ranks the communicator's,
 * train_dp_sum_counts as its sum with the communicator as user), read a window at a time: the
 * windows of one process streaming the file with the same parameters, each rank reading its
 * blocks of each window, the window's lengths exchanged when it is read (one all-to-all-v), its
 * global batches train_loader's over it (from the same seed, epoch and window). A window's end
 * reads the next one (collective), so the next step's exchange does not overlap that step.
 * Collective, as train_dp_init. */
nopad_status train_dp_init_stream(nopad_comm *comm, int exchange, train_model *m, train_stream *stream,
                                  int32_t local_tokens, int32_t local_seqs, int32_t global_tokens,
                                  int32_t global_seqs, uint64_t seed, train_dp *out);
/* train_stream_sum_fn over the communicator `comm` (a nopad_comm *): agrees on st, then sums n
 * int64 values across the ranks. */
nopad_status train_dp_sum_counts(void *comm, nopad_status st, int64_t *values, size_t n);

/* The loader's position: example `cursor` of window `window` (0 in memory) of epoch `epoch`'s
 * order (what a checkpoint saves, the same numbers as one process's train_loader or
 * train_stream). Collective when streamed. */
nopad_status train_dp_seek(train_dp *dp, uint32_t epoch, int32_t window, int32_t cursor);
/* The global batches of an epoch, from the lengths alone (streamed: reading every window,
 * collective; the position is then lost: seek). */
nopad_status train_dp_count_batches(train_dp *dp, uint32_t epoch, int64_t *n);
/* Collective. The next global batch: planned (the same on every rank), exchanged, and this
 * rank's sequences built; *got = 0 at the epoch's end. The batch after it is staged at once: its
 * exchange runs while this one computes. */
nopad_status train_dp_next(train_dp *dp, int *got);
/* Collective. The step's forward and backward on this rank's sequences and the gradients summed
 * across ranks; *loss is the global batch's mean loss, the same on every rank. */
nopad_status train_dp_forward_backward(train_dp *dp, train_context *ctx, double *loss);

/* Collective. The step's global batch on rank `root` (after train_dp_next): its sequences in the
 * loader's order, as one process's loader packs them (the same ids, types, masked positions,
 * labels and example numbers), and ranks[B] the rank that computed each (after the exchange);
 * the other ranks send theirs and get NULLs. For logging (log_batches): one message of the
 * batch's records to the root. */
nopad_status train_dp_gather_batch(train_dp *dp, int32_t root, const train_batch **batch, const int32_t **ranks);

/* Collective: the largest of every rank's flag (a stop asked for on any rank stops them all). */
nopad_status train_dp_any(train_dp *dp, int *flag);
/* Collective: fails on every rank when `st` failed on one, naming the rank (the others' message
 * says which rank failed; the failing rank keeps its own). */
nopad_status train_dp_agree(nopad_comm *comm, nopad_status st, const char *what);

/* ---- the loop ---------------------------------------------------------------------------- */

/* nopad_train (include/nopad.h) over `comm`: NULL trains as one process; a communicator trains
 * data-parallel over its ranks (with the exchange when `exchange` is set; a communicator of one
 * rank runs the same path, collectives included), each rank of
 * p->batch_tokens and p->batch_seqs, so the global batch is theirs times the ranks and the run
 * takes the steps of one process given that budget (a checkpoint records the global budget: it
 * resumes at any world size that keeps it). Rank 0 alone writes the checkpoints, the best weights
 * and the log, and prints the exchange's balance at the end; every rank evaluates (the same
 * weights, so the same metrics) and calls on_step and on_eval; a stop asked for on any rank stops
 * every rank after the same step; log_batches logs each global batch once (rank 0), as one process
 * logs it, with the rank of each sequence, and pack_lines cuts one process's pieces; streamed data
 * (stream) is read by every rank a window at a time, each its blocks of the window
 * (train_dp_init_stream).
 * nopad_train calls it with the launcher's world (nopad_world_size) when it has several ranks or
 * NOPAD_COMM_FORCE is set, else with NULL; the exchange on. */
nopad_status train_run(const nopad_train_params *p, nopad_comm *comm, int exchange,
                       nopad_train_result *out);

#endif
