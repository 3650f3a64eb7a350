/* Training checkpoints (issue 24): a folder that is at once an HF model folder and a resumable
 * training state.
 *
 *   config.json            BERT's config (architectures BertForMaskedLM or
 *                          BertForSequenceClassification, id2label, problem_type "regression"
 *                          for one label), written from the model's config
 *   model.safetensors      every parameter in float32 under HF's names (the tied MLM decoder is
 *                          the word embeddings, as HF saves it); nopad_model_load and HF's
 *                          from_pretrained read the folder as it is
 *   optimizer.safetensors  the Adam moments, "exp_avg.<name>" and "exp_avg_sq.<name>"
 *   trainer_state.json     the step count, the optimiser and its hyperparameters (the clipping
 *                          bound included), the learning-rate schedule (a function of the step
 *                          count, so its parameters are its whole state), the run's shape
 *                          (epochs, batch budgets) and where the data loader stands (seed,
 *                          epoch, streamed window, cursor): the data's generator is
 *                          counter-based, so that is its whole state; and the evaluations run
 *                          during training (step, epoch, eval loss and accuracy) with the metric
 *                          that picks the best of them
 *
 * A save writes the folder whole: every file into a staging folder beside it, fsynced, which
 * then takes the folder's place in one rename (util/file.h), so that an interrupted save leaves
 * the previous checkpoint whole and no temporary behind once the next save or resume has run.
 * Each file records the step (trainer_state.json's "step", the safetensors files' metadata
 * "step"); a load refuses a folder whose files disagree. */
#ifndef NOPAD_TRAIN_CHECKPOINT_H
#define NOPAD_TRAIN_CHECKPOINT_H

#include <stdint.h>

#include "train/schedule.h"
#include "train/train.h"

typedef enum train_optimizer_kind {
    TRAIN_OPT_ADAMW = 0,
    TRAIN_OPT_LAMB = 1,
} train_optimizer_kind;

/* What a checkpoint holds besides the tensors: everything a resumed run needs to take the same
 * steps as one that did not stop. */
/* What picks the best evaluation of a run: the lower eval loss, or the higher accuracy; a tie
 * keeps the earlier step. NONE: the run evaluates only at its end (nothing is recorded). */
typedef enum train_metric {
    TRAIN_METRIC_NONE = 0,
    TRAIN_METRIC_LOSS = 1,
    TRAIN_METRIC_ACCURACY = 2,
} train_metric;

/* One evaluation during training. */
typedef struct train_eval {
    int64_t step;     // steps taken when it ran
    int32_t epoch;    // 0-based epoch of that step
    int32_t examples; // of the eval data
    double loss;      // the mean eval loss
    double accuracy;  // classification with >= 2 labels, else -1
} train_eval;

typedef struct train_state {
    train_optimizer_kind kind;
    train_optimizer opt;      // opt.lr: the last step's; the schedule gives the next
    train_schedule schedule;
    uint64_t data_seed;       // the loader: seed, epoch, the window of a streamed epoch (0 in
    uint32_t epoch;           // memory) and the cursor within the epoch or window
    int32_t window;
    int32_t cursor;
    int64_t stream_buffer;    // the text of a streamed window; 0: the data was held in memory
    int32_t epochs;           // the run's shape: passes over the data and the batch budgets
    int32_t batch_tokens;     // (nopad_train_params', checked on resume)
    int32_t batch_seqs;
    float dropout;            // the step's dropout rate (masks follow from the seed and step)
    float attention_dropout;  // the attention probabilities' dropout rate
    int whole_word;           // MLM masks chose whole words (nopad_train_params.whole_word_mask)
    int pack_lines;           // MLM examples were packed lines (nopad_train_params.pack_lines)
    train_metric metric;      // what the best evaluation is by; NONE: none are recorded
    train_eval *evals;        // [n_evals] the run's evaluations in step order (train_state_free)
    int32_t n_evals;
} train_state;

const char *train_optimizer_kind_name(train_optimizer_kind kind); // "adamw", "lamb"
const char *train_metric_name(train_metric metric);               // "none", "loss", "accuracy"

/* Appends an evaluation to the state's history (its step after the last one's). */
nopad_status train_state_add_eval(train_state *s, const train_eval *e);
/* The index of the best evaluation by s->metric (the earliest of equals), or -1 without any. */
int32_t train_state_best(const train_state *s);
/* Whether `a` improves on `b` under `metric` (strictly: lower loss, higher accuracy). */
int train_metric_better(train_metric metric, const train_eval *a, const train_eval *b);
/* Early stopping's count: the evaluations since the last one that improved by more than
 * min_delta on the reference, which starts at the first evaluation and moves to each such
 * improvement (Keras' EarlyStopping); with min_delta 0, the evaluations since the best. 0
 * without evaluations. */
int32_t train_state_stale(const train_state *s, double min_delta);
/* Frees the history and clears it. */
void train_state_free(train_state *s);

/* The tokenizer files a checkpoint copies from its source folder (those that exist), so that it
 * is a whole model folder (nopad embed, from_pretrained with its tokenizer). */
extern const char *const TRAIN_TOKENIZER_FILES[];
extern const size_t TRAIN_N_TOKENIZER_FILES;

/* Writes the four files, and the tokenizer files of `tokenizer_from` (NULL: none), as the folder
 * `dir` whole (folder_stage_* in util/file.h: written and fsynced beside it, then renamed into its
 * place; the parent must exist; what an old `dir` holds besides is kept). The step count is the
 * model's, recorded in each file. */
nopad_status train_checkpoint_save(const train_model *m, const train_state *state, const char *dir,
                                   const char *tokenizer_from);

/* Writes the weights alone as the folder `dir`, whole as train_checkpoint_save writes its:
 * model.safetensors and config.json, eval_results.json ({"step", "epoch", "eval_loss",
 * "eval_accuracy" when there is one, "eval_examples", "metric"}) and the tokenizer files of
 * tokenizer_from (NULL: none). For a run's best evaluation. */
nopad_status train_checkpoint_save_weights(const train_model *m, const train_eval *e,
                                           train_metric metric, const char *dir,
                                           const char *tokenizer_from);
/* The step of dir/eval_results.json (written by train_checkpoint_save_weights). */
nopad_status train_checkpoint_weights_step(const char *dir, int64_t *step);

/* Loads a folder saved by train_checkpoint_save for `task`: the weights (train_model_load), the
 * moments and the step count into *out, the rest into *state (its history allocated: free it
 * with train_state_free). A folder without
 * optimizer.safetensors or trainer_state.json, or saved for another task (checked before the
 * weights are read, and named: NOPAD_ERR_INVALID_ARGUMENT), is an error; so is one whose files
 * record different steps (NOPAD_ERR_FORMAT, naming both). */
nopad_status train_checkpoint_load(nopad_backend *be, const char *dir, train_task task,
                                   train_model *out, train_state *state);

#endif
