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
 *                          counter-based, so that is its whole state
 *
 * Each file is written under a temporary name and renamed, so an interrupted save leaves the
 * previous file whole. */
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
} train_state;

const char *train_optimizer_kind_name(train_optimizer_kind kind); // "adamw", "lamb"

/* Writes the four files into `dir` (created when missing; its parent must exist). The step count
 * is the model's. */
nopad_status train_checkpoint_save(const train_model *m, const train_state *state, const char *dir);

/* Loads a folder saved by train_checkpoint_save for `task`: the weights (train_model_load), the
 * moments and the step count into *out, the rest into *state. A folder without
 * optimizer.safetensors or trainer_state.json, or saved for another task (checked before the
 * weights are read, and named: NOPAD_ERR_INVALID_ARGUMENT), is an error. */
nopad_status train_checkpoint_load(nopad_backend *be, const char *dir, train_task task,
                                   train_model *out, train_state *state);

#endif
