/* Padding-free training of BERT-family encoders (issue 24): the parameters and their gradients,
 * a training context (activations kept for the backward, sized by a token budget), one step's
 * forward and backward through the masked-LM or sequence-classification head, and the AdamW and
 * LAMB updates. Everything runs on the op table (backend.h), on the packed token stream:
 * activations are [T, ...] with T the real tokens of the batch, and the MLM head and its loss see
 * only the masked rows, so no FLOP is spent on padding in the forward or the backward.
 *
 * What is here: BERT (post-LayerNorm, token types, learned positions), float32 master weights,
 * gradients and moments, and a copy of the weights in the backend's dtype for the ops (the CPU
 * backend computes on the float32 weights themselves; CUDA on a bf16 / fp16 copy). See docs/training.md for what is
 * left (CUDA ops, bf16 compute copies, dropout, data, checkpoints, the CLI). */
#ifndef NOPAD_TRAIN_TRAIN_H
#define NOPAD_TRAIN_TRAIN_H

#include <stdint.h>

#include "backend/backend.h"
#include "io/model_config.h"

typedef enum train_task {
    TRAIN_TASK_MLM = 0,      /* BertForMaskedLM: transform + tied decoder, loss on masked rows */
    TRAIN_TASK_CLASSIFY = 1, /* BertForSequenceClassification: pooler + classifier; 1 label =
                                regression (squared error), more = softmax cross-entropy */
} train_task;

/* One encoder layer's parameters: in the compute dtype (train_model.weights) for the ops, or their
 * float32 gradients (train_model.grads): the same layout over either buffer. */
typedef struct train_layer {
    void *qkv_w;      // [3H, H] query | key | value rows (HF's three tensors, contiguous)
    void *qkv_b;      // [3H]
    void *attn_out_w; // [H, H]
    void *attn_out_b; // [H]
    void *attn_ln_w;  // [H]
    void *attn_ln_b;  // [H]
    void *ffn_in_w;   // [I, H]
    void *ffn_in_b;   // [I]
    void *ffn_out_w;  // [H, I]
    void *ffn_out_b;  // [H]
    void *ffn_ln_w;   // [H]
    void *ffn_ln_b;   // [H]
} train_layer;

/* Every parameter of a model with its head, as pointers into one flat buffer. */
typedef struct train_view {
    void *word;         // [V, H] also the MLM decoder's weight (tied)
    void *pos;          // [P, H]
    void *type;         // [TV, H]
    void *embed_ln_w;   // [H]
    void *embed_ln_b;   // [H]
    train_layer *layers; // [L]
    /* TRAIN_TASK_MLM */
    void *mlm_dense_w;  // [H, H]
    void *mlm_dense_b;  // [H]
    void *mlm_ln_w;     // [H]
    void *mlm_ln_b;     // [H]
    void *mlm_bias;     // [V] the decoder's bias
    /* TRAIN_TASK_CLASSIFY */
    void *pool_w;       // [H, H]
    void *pool_b;       // [H]
    void *cls_w;        // [C, H]
    void *cls_b;        // [C]
} train_view;

/* One named tensor of the flat buffers: HF's name, where it lives, whether it takes weight decay. */
typedef struct train_tensor {
    char name[96];
    int64_t offset;     // elements into params / grads / moments
    int64_t rows, cols; // [rows, cols]; cols = 1 for a vector
    int decay;          // 0 for biases and LayerNorm parameters (BERT's recipe)
} train_tensor;

typedef struct train_model {
    nopad_backend *be;
    model_config cfg;
    train_task task;
    int32_t num_labels;   // TRAIN_TASK_CLASSIFY: the classifier's outputs
    char prefix[16];      // "bert." for task checkpoints, "" for a bare encoder
    train_tensor *tensors;
    int32_t n_tensors;
    int64_t n_params;
    float *params;        // [n_params] float32 master weights, backend memory
    void *weights;        // [n_params] the copy in the backend's dtype that the ops compute with,
                          // refreshed by each optimiser step (== params on a float32 backend)
    size_t elem_size;     // bytes of one element of the backend's dtype (activations, weights)
    float *grads;         // [n_params] float32
    float *adam_m;        // [n_params] optimiser moments (zero until the first step)
    float *adam_v;        // [n_params]
    int64_t step;         // optimiser steps taken
    int new_head;         // 1: the head (or part of it) was not in the checkpoint and was created
    train_view w, g;      // views of weights (compute dtype) and grads (float32)
} train_model;

/* Loads an HF folder (config.json + safetensors) for `task`: the encoder and the task's head,
 * which must be in the checkpoint (BertForMaskedLM: cls.predictions.*; BertForSequenceClassification:
 * bert.pooler.*, classifier.*; the label count is the classifier's; train_model_load_new_head
 * creates a missing head). Only BERT (model_type
 * "bert") for now: another family is NOPAD_ERR_UNSUPPORTED. The backend needs the training ops. */
nopad_status train_model_load(nopad_backend *be, const char *dir, train_task task,
                              train_model *out);
/* The same, creating a head the checkpoint lacks (fine-tuning starts from a bare BertModel, such
 * as a sentence-transformers folder, or an MLM checkpoint): each missing head tensor is made as
 * HF's _init_weights makes it — Linear weights normal(0, initializer_range of config.json, 0.02
 * without), biases 0, LayerNorm weights 1 — from `seed`, and m->new_head is set. CLASSIFY: the
 * classifier has num_labels outputs (a classifier in the checkpoint must have that many; 0 takes
 * the checkpoint's, which must then have one); a missing pooler is created too. Encoder tensors
 * must all be in the checkpoint. */
nopad_status train_model_load_new_head(nopad_backend *be, const char *dir, train_task task,
                                       int32_t num_labels, uint64_t seed, train_model *out);
void train_model_free(train_model *m);
/* Sets n parameters from element `offset` of the flat buffer (host float32): the master weights
 * and the compute copy. */
nopad_status train_model_set_params(train_model *m, int64_t offset, const float *host, int64_t n);
/* The tensor called `name` (HF's name), or NULL. */
const train_tensor *train_model_find(const train_model *m, const char *name);

/* One packed batch, in host memory. */
typedef struct train_batch {
    int32_t n_seqs;            // B >= 1
    const int32_t *cu_seqlens; // [B+1], cu[0] = 0, every length in [1, max_position_embeddings]
    const int32_t *tokens;     // [T]
    const int32_t *types;      // [T] or NULL (all 0)
    const int64_t *examples;   // [B] each sequence's number in the corpus, which keys its dropout
                               // masks; NULL: sequence s is example s
    /* TRAIN_TASK_MLM: the masked rows (packed indices) and the ids to predict there */
    int32_t n_masked;          // M >= 1
    const int32_t *mlm_positions; // [M] in [0, T)
    const int32_t *mlm_labels;    // [M] in [0, V)
    /* TRAIN_TASK_CLASSIFY */
    const int32_t *labels;     // [B] in [0, num_labels) when num_labels > 1
    const float *targets;      // [B] when num_labels == 1 (regression)
} train_batch;

/* The mutable state of one stream of training steps: the activations of a forward kept for its
 * backward, gradient scratch, and the batch's ids, all sized for a token budget. */
typedef struct train_context {
    train_model *model;
    int32_t max_tokens, max_seqs;
    /* Activations and their gradients are in the backend's dtype (model->elem_size bytes an
     * element); log-sum-exps, losses and targets in float32. */
    /* [L+1, T, H] the input of each layer, the last entry the encoder's output */
    void *hidden;
    /* per layer, [L, T, ...] */
    void *qkv;       // [L, T, 3H]
    void *attn;      // [L, T, H] attention output (context)
    float *lse;      // [L, T, heads] float32
    void *attn_sum;  // [L, T, H] s1 = x + attn·Woᵀ + bo, the first LayerNorm's input
    void *attn_norm; // [L, T, H] x1 = LN(s1)
    void *ffn_pre;   // [L, T, I] x1·W1ᵀ + b1
    void *ffn_act;   // [L, T, I] GELU of it
    void *ffn_sum;   // [L, T, H] s2 = x1 + ffn·W2ᵀ + b2, the second LayerNorm's input
    /* gradient scratch */
    void *d_hidden;  // [T, H] the gradient flowing down the residual stream
    void *d_attn;    // [T, H]
    void *d_qkv;     // [T, 3H]
    void *d_ffn;     // [T, I]
    /* heads: rows are the masked tokens (MLM) or the sequences (classification), R <= T */
    void *head_in;   // [R, H] gathered rows / CLS rows
    void *head_pre;  // [R, H] dense output before the activation
    void *head_act;  // [R, H] after it (MLM: the LayerNorm's input)
    void *head_norm; // [R, H] MLM: after the LayerNorm
    void *d_head_a;  // [R, H]
    void *d_head_b;  // [R, H]
    void *logits;    // [R, max(V, C)], then their gradient in place
    float *losses;    // [R] float32
    float *targets;   // [B] regression targets
    int32_t *tokens, *types, *cu_seqlens, *rows, *labels; // [T], [T], [B+1], [T], [T]
    int64_t *examples; // [B] the batch's example numbers
    const int64_t *batch_examples; // the last uploaded batch's: examples, or NULL when it had none
    void *d_drop;     // [T, H] the gradient of a dropped sub-layer output
    /* Dropout after the embeddings and after each sub-layer's output projection, before the
     * residual add (BERT's hidden_dropout_prob); 0 (the default of a new context) turns it off.
     * attention_dropout drops the attention probabilities (BERT's
     * attention_probs_dropout_prob; 0 turns it off). Masks come from Philox counters keyed by
     * dropout_seed and the model's step count, the site, and each token's example number
     * (train_batch.examples) and position in its sequence, so the backward regenerates them, a
     * resumed run draws the same ones, and a data-parallel run draws those of one process. */
    float dropout;
    float attention_dropout;
    uint64_t dropout_seed;
    /* Data-parallel ranks (train/dp.h) set these for a step and clear them after; 0 / NULL is one
     * process's step. loss_rows: the rows the loss's gradient is a mean over (0: the batch's
     * own), the global batch's on every rank, so the ranks' gradients sum to the global mean's.
     * accumulate: train_backward adds onto the gradients instead of zeroing them first (a rank's
     * later micro-batches). grads_ready: called with each gradient bucket's number
     * (train_grad_bucket) as soon as the backward has written that bucket for the last time,
     * the head's first and the embeddings' last; its error ends the backward. */
    int32_t loss_rows;
    int accumulate;
    nopad_status (*grads_ready)(void *user, int32_t bucket);
    void *grads_user;
    /* the batch of the last train_forward, for train_backward and train_read_loss */
    nopad_seqs seqs;
    int32_t forward_rows; // the rows its loss is the mean of (masked tokens or sequences); 0: none
} train_context;

/* A context for batches of at most max_tokens tokens and max_seqs sequences. */
nopad_status train_context_init(train_model *m, int32_t max_tokens, int32_t max_seqs,
                                train_context *out);
void train_context_free(train_context *ctx);

/* One step's forward and backward: checks the batch (ids, types, lengths, positions and labels
 * in range; nothing empty), sets the model's gradients to those of the batch's mean loss, and
 * writes that loss to *loss. The mean is over the masked tokens (MLM) or the sequences. A loss
 * that is not finite is NOPAD_ERR_INVALID_ARGUMENT (the gradients are then not to be used). The
 * loss read back after the backward is enqueued is the step's one host synchronisation. */
nopad_status train_forward_backward(train_context *ctx, const train_batch *batch, double *loss);
/* The same in three parts, for timing and for callers that read the loss later: train_forward
 * checks and uploads the batch and enqueues the forward, the head and its loss (whose op also
 * leaves the logits' gradient); train_backward zeroes the gradients and enqueues the backward
 * of the last forward; train_read_loss waits for the loss and writes its mean. */
nopad_status train_forward(train_context *ctx, const train_batch *batch);
nopad_status train_backward(train_context *ctx);
nopad_status train_read_loss(train_context *ctx, double *loss);
/* The same as the sum of the rows' losses (data-parallel ranks add theirs up). */
nopad_status train_read_loss_sum(train_context *ctx, double *sum);

/* TRAIN_TASK_CLASSIFY: the forward alone, writing the batch's logits [B, num_labels] to host
 * memory (evaluation). The batch is checked as for a step (labels in range). */
nopad_status train_predict(train_context *ctx, const train_batch *batch, float *logits);

/* The hyperparameters of an optimiser; train_optimizer_defaults gives BERT's (MLPerf's). */
typedef struct train_optimizer {
    float lr;            // 1e-4
    float beta1, beta2;  // 0.9, 0.999
    float eps;           // 1e-6
    float weight_decay;  // 0.01, on tensors whose train_tensor.decay is set
    float max_grad_norm; // 1.0 (LAMB; <= 0: no clipping)
} train_optimizer;
train_optimizer train_optimizer_defaults(void);

/* One update of every parameter from the model's gradients, counting m->step. LAMB writes the
 * global gradient norm before clipping to *grad_norm (NULL: not wanted). */
nopad_status train_adamw_step(train_model *m, const train_optimizer *opt);
nopad_status train_lamb_step(train_model *m, const train_optimizer *opt, float *grad_norm);
/* Gradient clipping before an AdamW step, as HF's Trainer does it (torch's clip_grad_norm_):
 * every gradient times min(1, max_norm / (norm + 1e-6)), norm the global L2 norm of all of them,
 * written to *grad_norm before clipping (NULL: not wanted). max_norm <= 0 only measures. LAMB
 * clips by itself (train_optimizer.max_grad_norm). */
nopad_status train_clip_grad_norm(train_model *m, float max_norm, float *grad_norm);

#endif
