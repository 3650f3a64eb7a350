/* Decoder models (GPT-2, the LLaMA family): weights, the paged KV cache of a context, and one
 * forward step over a packed batch of new tokens from any mix of sequences (prompt chunks and
 * single decode tokens alike). Written once against the op table. */
#ifndef NOPAD_MODEL_DECODER_H
#define NOPAD_MODEL_DECODER_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "io/model_config.h"
#include "model/sampling.h"
#include "model/tp.h"

/* Shapes with tensor parallelism (model/tp.h): H, KVH and F are this rank's query heads, key/value
 * heads and intermediate columns (tp.heads, tp.kv_heads, tp.ffn); V is its vocabulary rows
 * (tp.vocab_rows). O's and down's biases are held by rank 0 only: they join the partial sums
 * once. With tp 1 they are the model's sizes. */
typedef struct decoder_layer {
    /* how each matrix is stored (backend.h): the backend's dtype, or a GGUF block format kept as
     * in the file (gemm_q reads it) */
    nopad_weight_format qkv_format, o_format, up_format, down_format;
    void *norm1_w, *norm1_b;  // [hidden] (b: LayerNorm only)
    void *qkv_w, *qkv_b;      // [(H + 2·KVH)·D, hidden], [(H + 2·KVH)·D] or NULL
    void *o_w, *o_b;          // [hidden, H·D], [hidden] or NULL
    void *norm2_w, *norm2_b;  // [hidden]
    void *up_w, *up_b;        // LLaMA: [2F, hidden] gate | up, no bias; GPT-2: [F, hidden], [F]
    void *down_w, *down_b;    // [hidden, F], [hidden] or NULL
} decoder_layer;

typedef struct decoder_weights {
    void *tok_emb;            // [V, hidden]
    void *pos_emb;            // [P, hidden] (GPT-2) or NULL
    decoder_layer *layers;    // [num_layers]
    void *final_norm_w, *final_norm_b;
    void *lm_head;            // [V, hidden]; = tok_emb when tied
    nopad_weight_format tok_emb_format, lm_head_format; /* as the layers' formats */
    void *map;                // the GGUF file's mapping when weights point into it, else NULL
    size_t map_size;
    nopad_weight_group *groups; // [n_groups] the weights by group and format, for info
    int32_t n_groups;
    float *inv_freq;          // [D/2] rotary frequencies, scaled (backend memory, float32) or NULL
    void **allocations;       // everything above, for freeing
    int32_t n_allocations;
    size_t bytes;
    int64_t n_params;
    const char *weights_dtype; /* of the checkpoint ("F32", "BF16", "Q4_1", ...) */
    tp_shard tp;              /* the part of the model these weights are (tp.size 1: all of it) */
} decoder_weights;

/* From a Hugging Face folder's safetensors (names of GPT2LMHeadModel / LlamaForCausalLM /
 * Qwen2ForCausalLM / MistralForCausalLM, with or without a task prefix). */
struct safetensors_checkpoint;
/* tp: the rank's shard (tp_shard_plan), NULL: the whole model. Only the shard reaches the backend;
 * the host holds one tensor at a time. fp8 (docs/fp8.md): 0, F8_E4M3 weights with their
 * `weight_scale` stay FP8 where the backend runs it (else dequantised, with a notice); > 0
 * (--weights fp8), the LLaMA family's linear weights are quantized to FP8 E4M3 per output channel
 * too (a backend without FP8 kernels, GPT-2 or tp > 1: NOPAD_ERR_UNSUPPORTED); < 0 (a float
 * --weights), everything is dequantised to the backend's dtype. */
nopad_status decoder_weights_load_st(nopad_backend *be, const model_config *cfg, const tp_shard *tp,
                                     const struct safetensors_checkpoint *ckpt, const char *where, int fp8,
                                     decoder_weights *out);
/* From a GGUF file (llama.cpp's names); the Q and K rows llama.cpp's converter permuted for its
 * rotary layout are put back. With `native`, each linear weight and the token embeddings stay in
 * the file's block format where the backend runs it (nopad_backend_runs_format; one process,
 * tp 1): a lone tensor is read where the file's mapping holds it (which the weights then own:
 * f->map is taken), a fused one (Q|K|V, gate|up) is copied block for block. Everything else is
 * dequantised to float32 and converted to the backend's dtype, and with `native` a one-line
 * notice on stderr names each group and format that was (once per model). */
struct gguf_file;
nopad_status decoder_weights_load_gguf(nopad_backend *be, const model_config *cfg, const tp_shard *tp,
                                       struct gguf_file *f, int native, int fp8, decoder_weights *out);
void decoder_weights_free(nopad_backend *be, decoder_weights *w);

/* The inverse frequencies of rotary embeddings for cfg (HF's _compute_*_rope_parameters:
 * default, linear, llama3), [head_size / 2]. */
void decoder_rope_inv_freq(const model_config *cfg, float *out);

/* A context's decoder state: the paged KV pool and the step workspace. */
typedef struct decoder_state {
    int32_t block_size, n_blocks;
    void **k_cache, **v_cache;   // [num_layers] each [(n_blocks + 1) · block_size, KVH, D]
    int32_t pad_block;           // = n_blocks: a block outside the pool, the only one that the
                                 // padding rows of a bucketed decode step write and read
    int32_t *free_blocks;        // stack of free block ids
    int32_t n_free;
    int32_t max_tokens;          // the step workspace's token budget
    /* workspace (backend memory) */
    float *h;                    // [T, hidden] residual stream, float32 on every backend
    void *tmp;                   // [T, hidden] a sub-layer's output before it joins h
    void *xn;                    // [T, hidden] normed input of a sub-layer
    void *qkv;                   // [T, (H + 2·KVH)·D]
    void *attn;                  // [T, H·D]
    void *mlp;                   // [T, 2F] (gate | up, or GPT-2's F)
    void *act;                   // [T, F]
    float *last;                 // [T, hidden] float32 rows of h whose logits are asked for
    float *logits;               // [logit_rows, V] float32: one chunk of the LM head's output
                                 // (V: the whole vocabulary, every rank's columns in place)
    float *logits_parts;         // tp > 1: [tp, logit_rows, vocab_stride] every rank's columns
                                 // of the chunk, as the all-gather leaves them; else NULL
    float *best_parts;           // [tp, logit_rows, 3] every rank's greedy triples (backend
                                 // row_argmax) with tp > 1, or one process's where the backend
                                 // merges them on the device; else NULL
    float *host_best;            // their host copy, merged by every rank alike
    int32_t logit_rows;          // rows of logits computed at a time
    int32_t *i32;                // a step's tokens, positions, slots, rows, cu_q, seqlen_k, table
    int32_t *host_i32;           // their host copy, built each step and sent up in one copy
    size_t i32_count;
    sampler_scratch scratch;     // host sampling, for backends without a sampling op
    int32_t ids_pending;         // ids of a launched step still coming (decoder_step_wait)
    int32_t *feed;               // [max_tokens] backend memory: the ids the last step sampled,
                                 // which the next step's tokens may name (token -1 - row)
    int32_t feed_rows;           // rows of feed that hold them (0: none)
    int32_t out_rows;            // rows of output the launched forward left to decoder_output_launch
    int out_pending;             // a forward is launched, its output not yet
    size_t bytes;
} decoder_state;

/* Sized for the part of the model `w` holds (its tensor-parallel shard). */
nopad_status decoder_state_init(nopad_backend *be, const model_config *cfg, const decoder_weights *w,
                                int32_t max_tokens, int32_t kv_tokens, int32_t block_size, decoder_state *s);
void decoder_state_free(nopad_backend *be, const model_config *cfg, decoder_state *s);

/* One step's input, on the host: B sequences, each bringing new tokens. */
typedef struct decoder_batch {
    int32_t n_seqs;
    const int32_t *cu_q;         // [B+1] new tokens per sequence
    const int32_t *tokens;       // [T] ids; -1 - r: the id the step before samples for its row r
    const int32_t *seqlen_k;     // [B] keys after the step (history + new)
    const int32_t *block_table;  // [B, max_blocks], blocks already reserved for seqlen_k keys
    int32_t max_blocks;
    int all_logits;              // 1: logits of every new token; 0: of each sequence's last
} decoder_batch;

/* What a step gives back: nothing (a prompt chunk whose logits nobody needs), logits [B or T, V]
 * float32 on the host, or each sequence's next id chosen by `params` (sampling on the device
 * where the backend has it, else on the host). */
typedef struct decoder_output {
    float *logits;                        // host [B or T, V], or NULL
    int32_t *ids;                         // host [B]: sample (logits NULL), or NULL
    float *logprobs;                      // host [B] or NULL
    const nopad_sampling_params *params;  // [B]
    const uint64_t *draws;                // [B] draw counters
    const int32_t *history, *cu_history;  // host: ids for the penalties, [B+1] (or NULL)
    const uint32_t *const *masks;         // host [B]: row b's allowed ids, bit t of word t/32
                                          // ((V + 31) / 32 words; NULL: all), or NULL for none;
                                          // read before decoder_output_launch returns
    int32_t n_top;                        // 0..NOPAD_MAX_TOP_LOGPROBS most likely ids per row
                                          // (0 on a split model, as masks are NULL there)
    int32_t *top_ids;                     // host [B, n_top] (sampling_top_logprobs), or NULL
    float *top_logprobs;                  // host [B, n_top], or NULL
} decoder_output;

/* Runs the step. Decode-only steps (one new token per sequence) replay a recorded graph per
 * (batch size, block-table width) where the backend records graphs. */
nopad_status decoder_step(nopad_backend *be, const model_config *cfg, const decoder_weights *w,
                          decoder_state *s, const decoder_batch *batch, const decoder_output *out);
/* decoder_step in three parts, so that the host works while the device runs steps, and the next
 * step is queued before the ids of this one are back:
 *
 *   forward_launch(n) · output_launch(n) · forward_launch(n+1) · wait(n) · output_launch(n+1) · ...
 *
 * decoder_forward_launch queues the step's forward (want_rows: it has an output); the batch's
 * arrays are read before it returns. A token t < 0 of the batch stands for the id that the step
 * before sampled for its row -1 - t (feed), so a decode step can be queued before its tokens are
 * known. decoder_output_launch queues the output: logits downloaded, or ids sampled (on the device
 * where the backend samples on its own, the logits in one chunk, it returns with them still
 * coming, else after the sampling). decoder_step_wait returns once out->ids (and out->logprobs)
 * hold them; `out`'s arrays stay put until then. A step's output is launched and waited for
 * before the next step's output is launched. */
nopad_status decoder_forward_launch(nopad_backend *be, const model_config *cfg, const decoder_weights *w,
                                    decoder_state *s, const decoder_batch *batch, int want_rows);
nopad_status decoder_output_launch(nopad_backend *be, const model_config *cfg, const decoder_weights *w,
                                   decoder_state *s, const decoder_output *out);
nopad_status decoder_step_wait(nopad_backend *be, decoder_state *s, const decoder_output *out);

#endif
