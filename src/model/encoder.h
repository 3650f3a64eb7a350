/* The BERT-family encoder, written once against the op table. All five families reduce to the
 * same post-LayerNorm layer; they differ only in tensor names, token types, position offset,
 * (ALBERT) a factorised embedding with shared layers, which the loader resolves, and (DeBERTa)
 * relative-position terms in the attention scores instead of absolute positions.
 *
 * Tensor parallelism (model/tp.h, Megatron's layout): a rank holds the QKV rows and FFN-in rows
 * of its heads / intermediate columns, and the matching input columns of the attention-output
 * and FFN-out GEMMs; their products are partial sums made whole by one all-reduce each, before
 * the LayerNorm adds the (whole) bias and the residual. Everything else is whole on every rank.
 * Below, Hl = tp.heads · head_size and Il = tp.ffn are a rank's local sizes (H and I at tp 1). */
#ifndef NOPAD_MODEL_ENCODER_H
#define NOPAD_MODEL_ENCODER_H

#include "backend/backend.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/tp.h"

/* The weights of one post-LayerNorm encoder layer (the BERT family's), in the backend's memory. */
typedef struct encoder_layer {
    void *qkv_weight;       // [3Hl, H] query | key | value rows (of this rank's heads), fused at load
    void *qkv_bias;         // [3Hl]
    void *attn_out_weight;  // [H, Hl] the input columns of this rank's heads
    void *attn_out_bias;    // [H] whole: added once, after the all-reduce
    void *attn_ln_weight;   // [H]
    void *attn_ln_bias;     // [H]
    void *ffn_in_weight;    // [Il, H]
    void *ffn_in_bias;      // [Il]
    void *ffn_out_weight;   // [H, Il]
    void *ffn_out_bias;     // [H] whole: added once, after the all-reduce
    void *ffn_ln_weight;    // [H]
    void *ffn_ln_bias;      // [H]
    /* DeBERTa: the relative embeddings projected by this layer's key and query weights, derived
     * once at load (they depend on weights only); NULL for a term the model lacks */
    void *rel_pos_key;      // [2k, Hl] content -> position (c2p), this rank's heads' columns
    void *rel_pos_query;    // [2k, Hl] position -> content (p2c)
} encoder_layer;

typedef struct encoder_weights {
    void *word_embeddings;     // [V, E]
    void *position_embeddings; // [P, E], NULL without absolute positions (DeBERTa-v3)
    void *type_embeddings;     // [TV, E], NULL when the family has no token types
    void *embed_ln_weight;     // [E]
    void *embed_ln_bias;       // [E]
    void *embed_proj_weight;   // [H, E] ALBERT only, else NULL
    void *embed_proj_bias;     // [H]
    void *head_dense_weight;   // [H, H] the classification head's pooler (cfg->head), or NULL
    void *head_dense_bias;     // [H]
    void *head_out_weight;     // [L, H] its classifier, L = cfg->head.num_labels
    void *head_out_bias;       // [L]
    encoder_layer *layers;     // [n_layer_weights] distinct weight sets
    int n_layer_weights;
    const encoder_layer **schedule; // [n_steps] the weights applied at each step (ALBERT shares)
    int n_steps;
    int64_t n_params;          // parameters of the whole model (shared ones counted once), the same
                               // on every rank
    tp_shard tp;               // the part this rank holds (size 1: everything)
    char weights_dtype[8];     // "F32", "F16", "BF16" or "mixed"
    void **allocations;        // every backend buffer, for freeing
    int n_allocations;
    size_t bytes;              // backend memory of all weight tensors (this rank's)
} encoder_weights;

/* Loads and checks every tensor the config needs from the checkpoint, converts to the backend's
 * dtype and uploads. `where` (the folder) prefixes messages. `tp` (from tp_shard_plan; NULL or
 * size 1: the whole model) is the part this rank loads: backend memory holds only the shard, host
 * memory one whole tensor at a time. */
nopad_status encoder_weights_load(nopad_backend *be, const model_config *cfg,
                                  const safetensors_checkpoint *ckpt, const char *where,
                                  encoder_weights *out, const tp_shard *tp);
void encoder_weights_free(nopad_backend *be, encoder_weights *w);

/* Activations of one forward, sized for `capacity_tokens` tokens and `capacity_seqs` sequences. */
typedef struct encoder_workspace {
    int32_t capacity_tokens;
    int32_t capacity_seqs;
    void *hidden;      // [T, H] the residual stream; the output of the last layer
    void *embed;       // [T, E] ALBERT only
    void *qkv;         // [T, 3Hl]
    void *context;     // [T, Hl] attention output of this rank's heads
    void *attn;        // [T, H] x1 (encoder.c); T + tp - 1 rows where sequence parallelism may run
    void *seq;         // [T + tp - 1, H] a sequence-parallel forward's residual stream (NULL: none)
    void *ffn;         // [T, Il]
    void *pooled;      // [B, H]
    void *head;        // [B, H] the classification head's pooled rows (models with a head)
    void *logits;      // [B, L]
    int32_t *tokens;   // [T]
    int32_t *types;    // [T]
    int32_t *cu_seqlens; // [B+1]
    size_t bytes;        // backend memory of all of the above
    uint32_t generation; // bumped whenever the buffers move (recorded graphs name them)
} encoder_workspace;

/* tp: the weights' shard (NULL: the whole model), which sizes the per-head and FFN buffers. */
nopad_status encoder_workspace_reserve(nopad_backend *be, const model_config *cfg, const tp_shard *tp,
                                       encoder_workspace *ws, int32_t n_tokens, int32_t n_seqs);
void encoder_workspace_free(nopad_backend *be, encoder_workspace *ws);

/* Runs the encoder on tokens[T] (types[T] or NULL) in backend memory; `hidden` [T, H] carries
 * the residual stream and ends holding the last hidden states (ws->hidden, or a caller's buffer).
 * Only enqueues work: no allocation and no host synchronisation. */
nopad_status encoder_forward(nopad_backend *be, const model_config *cfg, const encoder_weights *w,
                             encoder_workspace *ws, const nopad_seqs *seqs, const int32_t *tokens,
                             const int32_t *types, void *hidden);

/* The two halves of encoder_forward, for callers that replay the layers as a recorded graph.
 * encoder_embed writes the T rows of the batch. encoder_layers runs every layer on n_rows >= T
 * rows: row-wise ops (GEMMs, LayerNorms) see all n_rows, attention only the rows inside
 * seqs->cu_seqlens; rows past T are slack whose values are never read back. */
nopad_status encoder_embed(nopad_backend *be, const model_config *cfg, const encoder_weights *w,
                           encoder_workspace *ws, const nopad_seqs *seqs, const int32_t *tokens,
                           const int32_t *types, void *hidden);
nopad_status encoder_layers(nopad_backend *be, const model_config *cfg, const encoder_weights *w,
                            encoder_workspace *ws, const nopad_seqs *seqs, int32_t n_rows,
                            void *hidden);

/* The classification head on hidden[T, H] (cfg->head): logits[B, L] = act(hidden[first token of
 * each sequence]·W1ᵀ + b1)·W2ᵀ + b2, into ws->logits. */
nopad_status encoder_classify(nopad_backend *be, const model_config *cfg, const encoder_weights *w,
                              encoder_workspace *ws, const nopad_seqs *seqs, const void *hidden);

/* The token-count bucket of a batch whose layers replay a recorded graph: n_tokens rounded up to
 * a multiple of 1/16 of the power of two at or below it, at least 16. The slack is under 1/16 of
 * n_tokens from 256 tokens up (under 16 rows below), and there are 16 buckets per doubling, so a
 * few dozen graphs cover every batch up to cuda_graph_max_tokens. */
int32_t encoder_token_bucket(int32_t n_tokens);


#endif
