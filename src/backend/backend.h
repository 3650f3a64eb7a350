/* The op table: every operation a model graph needs, on packed tensors, named by family
 * (memory, graphs, pack/unpack, embedding, gemm, norm, attention, pooling). It knows no model:
 * model/ composes these ops into layers, and a new model family adds ops here only where it needs
 * a new kind of operation (e.g. RMSNorm, RoPE, paged attention), never a model's layer.
 *
 * Activations are [T, ...] with T = total real tokens of the batch; sequences are delimited by
 * cu_seqlens[B+1] (int32, in the backend's memory). Tensor pointers live in the backend's memory
 * (host for CPU, device for CUDA) and hold elements of the backend's dtype (`be->dtype`); weights
 * are [out, in] row-major as in nn.Linear, so a linear layer is y = x · Wᵀ (+ epilogue).
 * Fusions (bias+GELU in the GEMM, bias+residual+LayerNorm) are ops here so the model code stays one
 * loop over layers and every backend gets the fused path. Ops enqueue work and return; the CPU
 * backend runs them synchronously.
 *
 * One backend object is one stream of work on one device (a nopad_context owns one); memory one
 * backend allocates is usable by every backend of the same kind and device (the model's weights
 * are allocated once and read by every context). */
#ifndef NOPAD_BACKEND_H
#define NOPAD_BACKEND_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "nopad.h"
#include "util/types.h"

#ifdef __cplusplus
extern "C" { /* the CUDA sources include this header; its functions are C */
#endif

typedef enum nopad_epilogue {
    NOPAD_EPILOGUE_NONE = 0,          /* y = x·Wᵀ */
    NOPAD_EPILOGUE_BIAS = 1,          /* y = x·Wᵀ + b */
    NOPAD_EPILOGUE_BIAS_ACT = 2,      /* y = act(x·Wᵀ + b) */
    NOPAD_EPILOGUE_BIAS_RESIDUAL = 3, /* y = x·Wᵀ + b + residual */
} nopad_epilogue;

typedef struct nopad_backend nopad_backend;

/* Sequence boundaries of a packed batch, as every op that needs them receives them. */
typedef struct nopad_seqs {
    int32_t n_seqs;            /* B */
    int32_t n_tokens;          /* T = cu_seqlens[B] */
    int32_t max_seqlen;        /* max_i (cu_seqlens[i+1] - cu_seqlens[i]) */
    const int32_t *cu_seqlens; /* [B+1] in backend memory */
} nopad_seqs;

/* Dropout of the attention probabilities (training; BERT's attention_probs_dropout_prob): the
 * probability P_ij of query i and key j (positions inside their sequence) of head h, in sequence
 * s of the batch, is kept and scaled by 1/(1 - p) when
 * attention_dropout_bits(key, site, h, examples[s], i, j) >= p·2³² (util/philox.h), else it is 0.
 * Keyed by the example's number, a sequence's mask does not depend on where it sits in the batch
 * (or on which data-parallel rank computes it). The softmax's normaliser is that of the undropped
 * scores, as in torch's dropout(softmax(S)). A counter per score: the backward regenerates the
 * mask instead of storing it. */
typedef struct nopad_attention_dropout {
    float p;                 /* in [0, 1); 0: off */
    uint64_t key;            /* the step's key */
    uint32_t site;           /* the layer, < 2^15 */
    const int64_t *examples; /* [B] in backend memory: each sequence's example number; NULL:
                                sequence s is example s */
} nopad_attention_dropout;

/* DeBERTa's relative positions, as attention_rel reads them. */
typedef struct nopad_rel_positions {
    int32_t att_span;               /* k: the position tables have 2k rows */
    int32_t position_buckets;       /* > 0: relative distances log-bucketed; <= 0: i - j as is */
    int32_t max_relative_positions; /* the distance the log buckets reach */
} nopad_rel_positions;

/* The bucket of the relative distance rel = i - j (HF make_log_bucket_position), one definition
 * for every backend's attention_rel. Distances within ±buckets/2 stay as they are; beyond, they
 * grow logarithmically so that max_relative_positions - 1 lands on bucket buckets - 1. Computed
 * in float32 as torch does it (int64 true division gives float32), so the ceil lands on the same
 * integer (tests/test_deberta.c checks ±2047 against torch). */
static inline int32_t nopad_rel_bucket(int32_t rel, const nopad_rel_positions *p) {
    if (p->position_buckets <= 0) return rel;
    const int32_t mid = p->position_buckets / 2;
    const int32_t abs_rel = rel < 0 ? -rel : rel;
    if (abs_rel <= mid) return rel;
    const float log_pos =
        ceilf(logf((float)abs_rel / (float)mid) /
              logf((float)((double)(p->max_relative_positions - 1) / (double)mid)) * (float)(mid - 1)) +
        (float)mid;
    return rel < 0 ? -(int32_t)log_pos : (int32_t)log_pos;
}

/* The op families, for the capability query. */
typedef enum nopad_op {
    NOPAD_OP_PACK = 0, /* pack and unpack */
    NOPAD_OP_EMBED,
    NOPAD_OP_GEMM,
    NOPAD_OP_LAYERNORM,
    NOPAD_OP_ATTENTION,
    NOPAD_OP_POOL,     /* pool and l2_normalize */
    NOPAD_OP_GRAPH,    /* recording and replaying a sequence of ops (graph_run) */
    NOPAD_OP_DECODER,  /* embed_tokens, norm, residual_add, add_norm, rope_kv_store,
                          attention_paged, swiglu, gather_rows, gemm_f32 */
} nopad_op;

/* A decoder step's view of its sequences' KV history in the paged cache. The cache of one layer
 * is K and V, each [n_blocks · block_size, n_kv_heads, head_size]; sequence b's key j lives in
 * slot block_table[b · max_blocks + j / block_size] · block_size + j % block_size. The step adds
 * cu_q[b+1] - cu_q[b] new tokens to sequence b, which then holds seqlen_k[b] keys: new token i
 * sits at position seqlen_k[b] - n_new + i and attends to keys 0 .. that position (causal). */
typedef struct nopad_kv_batch {
    int32_t n_seqs;              /* B */
    int32_t n_tokens;            /* T = cu_q[B], new tokens in the step */
    int32_t max_q, max_k;        /* longest new span, longest history (or upper bounds): they
                                    size launches */
    int no_history;              /* every sequence starts the step empty (prompts only): a backend
                                    may run plain causal attention over the new tokens */
    const int32_t *cu_q;         /* [B+1] */
    const int32_t *seqlen_k;     /* [B] */
    const int32_t *block_table;  /* [B, max_blocks] */
    int32_t max_blocks, block_size;
} nopad_kv_batch;

/* How a weight matrix is stored in backend memory. NOPAD_WEIGHT_DTYPE: elements of the backend's
 * dtype, what every op reads. The others are read by gemm_q and embed_tokens_q only: GGUF's block
 * formats, kept as the file stores them (numbered as ggml numbers its types): each row of K values
 * is K / block blocks back to back, row n at w + n · row_bytes; and FP8 E4M3 with a float32 scale
 * per output row (numbered past ggml's types): w [N, K] as N rows of K E4M3 bytes (row n at
 * w + n · K), then the N scales at w + align16(N · K), row n's values code · scale[n]
 * (docs/fp8.md). */
typedef enum nopad_weight_format {
    NOPAD_WEIGHT_DTYPE = 0,
    NOPAD_WEIGHT_Q4_0 = 2, /* blocks of 32 */
    NOPAD_WEIGHT_Q4_1 = 3,
    NOPAD_WEIGHT_Q5_0 = 6,
    NOPAD_WEIGHT_Q5_1 = 7,
    NOPAD_WEIGHT_Q8_0 = 8,
    NOPAD_WEIGHT_Q4_K = 12, /* super-blocks of 256 */
    NOPAD_WEIGHT_Q5_K = 13,
    NOPAD_WEIGHT_Q6_K = 14,
    NOPAD_WEIGHT_FP8_E4M3 = 256, /* per output channel scales; CUDA (Hopper) only */
    NOPAD_WEIGHT_MIXED = 257,    /* runs of rows in block formats of their own: nopad_mixed_weight */
    NOPAD_WEIGHT_Q4_K_R8 = 258,  /* Q4_K laid out by the CPU at load, 8 rows interleaved (pack_q; the CPU's
                                    backend/cpu/quant.h says how); gemm_q only, never a file's */
    NOPAD_WEIGHT_Q6_K_R8 = 259,  /* Q6_K likewise */
    NOPAD_WEIGHT_Q4_1_R8 = 260,  /* Q4_1 likewise */
    NOPAD_WEIGHT_Q8_0_R8 = 261,  /* Q8_0 likewise */
} nopad_weight_format;

/* A fused weight whose parts are stored in different block formats (a Q4_K_M file's Q|K|V: Q and K
 * in Q4_K, V in Q6_K), kept as stored rather than dequantised: this header, NOPAD_MIXED_HEADER bytes,
 * then part 0's rows[0] rows in format[0] (as the block format stores them), part 1's, and so on. A
 * gemm_q over it is one gemm per part into its columns of out [T, Σ rows], so each output equals
 * what the part alone would give. gemm_q only: the embeddings never take it. The CPU runs it. */
enum { NOPAD_MIXED_PARTS = 4, NOPAD_MIXED_HEADER = 64 };
typedef struct nopad_mixed_weight {
    uint32_t n_parts;
    uint32_t format[NOPAD_MIXED_PARTS]; /* nopad_weight_format, each a block format */
    int32_t rows[NOPAD_MIXED_PARTS];
} nopad_mixed_weight;

/* Where the N float32 scales of an FP8 E4M3 weight [N, K] start: after the codes, 16-byte aligned. */
static inline size_t nopad_fp8_scales_offset(int64_t n_out, int64_t n_in) {
    return ((size_t)n_out * (size_t)n_in + 15) / 16 * 16;
}

/* What a capability query describes; each op reads the fields it needs. */
typedef struct nopad_op_shape {
    int32_t n_tokens, n_in, n_out; /* gemm: [T, K] · [N, K]ᵀ; layernorm: n_in = dim */
    int32_t n_heads, head_size;    /* attention */
    int causal;                    /* attention */
    nopad_epilogue epilogue;       /* gemm */
    nopad_activation act;          /* gemm with NOPAD_EPILOGUE_BIAS_ACT */
    nopad_weight_format weight_format; /* gemm: the weight's storage (a block format: gemm_q's) */
} nopad_op_shape;

/* One parameter tensor as the optimiser ops see it. Training keeps float32 master weights, their
 * float32 gradients and the moments on every backend; the ops of a step compute with a copy of
 * the weights in the backend's dtype (bf16 / fp16 on CUDA), which the optimiser refreshes. */
typedef struct nopad_opt_tensor {
    float *param;        /* [n] master weights, updated in place */
    const float *grad;   /* [n] float32 (clip_grad_norm scales it in place) */
    float *m, *v;        /* [n] first and second moments, updated in place */
    void *param_compute; /* [n] in the backend's dtype: written with the updated weights; NULL
                            when the backend computes on the master weights (CPU, float32) */
    int64_t n;
    float weight_decay;  /* 0 for biases and LayerNorm parameters */
} nopad_opt_tensor;

/* The hyperparameters of one optimiser step, shared by every tensor of the list. */
typedef struct nopad_opt_step {
    float lr, beta1, beta2, eps;
    float max_grad_norm; /* LAMB: clip by the global gradient norm; <= 0: no clipping */
    int64_t step;        /* 1 for the first step (bias correction) */
} nopad_opt_step;

struct nopad_backend {
    const char *name;  /* "cpu", "cuda" */
    nopad_dtype dtype; /* element type of every tensor the ops see */
    void *impl;        /* backend-private state */
    size_t extra_bytes; /* memory the backend holds beyond tensors it was asked for (GEMM
                           workspace, staging), for reporting */
    /* The device this backend works on and its native stream (a cudaStream_t), for the
     * communicator (parallel/), which enqueues NCCL's collectives on that stream; -1 and NULL on
     * the CPU. */
    int32_t device;
    void *native_stream;

    void (*destroy)(nopad_backend *be);

    /* ---- memory ---------------------------------------------------------------------------- */
    nopad_status (*alloc)(nopad_backend *be, size_t bytes, void **out);
    void (*free)(nopad_backend *be, void *ptr);
    /* Host float32 -> backend tensor of n elements (converted to be->dtype). */
    nopad_status (*upload_f32)(nopad_backend *be, void *dst, const float *src, size_t n);
    /* Backend tensor of n elements -> host float32. */
    nopad_status (*download_f32)(nopad_backend *be, float *dst, const void *src, size_t n);
    /* Host -> backend memory, `bytes` as they are (float32 master weights, ids). */
    nopad_status (*upload)(nopad_backend *be, void *dst, const void *src, size_t bytes);
    /* Backend memory -> host, `bytes` as they are (float32 tensors, ids); waits for the copy. */
    nopad_status (*download)(nopad_backend *be, void *dst, const void *src, size_t bytes);
    /* Host int32 -> backend int32 buffer. */
    nopad_status (*upload_i32)(nopad_backend *be, int32_t *dst, const int32_t *src, size_t n);
    /* Waits for all enqueued work (no-op on CPU). Never called inside a forward. */
    nopad_status (*synchronize)(nopad_backend *be);
    /* Releases staging memory kept from loading (may be NULL). Called once the weights are up. */
    void (*release_staging)(nopad_backend *be);
    /* dst = src, bytes of backend memory (enqueued like an op). */
    nopad_status (*copy)(nopad_backend *be, void *dst, const void *src, size_t bytes);
    /* rows × width bytes of backend memory: row i from src + i·src_pitch to dst + i·dst_pitch
     * (enqueued like an op; the tensor-parallel LM head puts each rank's logit columns in place). */
    nopad_status (*copy_2d)(nopad_backend *be, void *dst, size_t dst_pitch, const void *src,
                            size_t src_pitch, size_t width, size_t rows);

    /* ---- recorded graphs (NULL where the backend has none; the CPU runs ops directly) ------- */
    /* Replays the graph recorded under `key`, or records one by calling record(ctx) — which
     * must only enqueue ops of this backend, on buffers that stay put — and then replays it.
     * A backend that cannot record runs record(ctx) directly instead, so the work always
     * happens once. Keys are the caller's: equal keys must mean identical work. */
    nopad_status (*graph_run)(nopad_backend *be, const int64_t key[4],
                              nopad_status (*record)(void *ctx), void *ctx);
    /* Forgets every recorded graph (the buffers they name were freed or moved). */
    void (*graph_clear)(nopad_backend *be);
    int64_t graph_replays, graphs_recorded; /* counters kept by graph_run */
    int32_t graphs_held;

    /* Whether this backend runs `op` on the shape described (fields the op does not use are
     * ignored; shape may be NULL for "at all"), so a model can choose before it enqueues
     * anything. An op it cannot run at all is also NULL in the table. */
    int (*supports)(nopad_backend *be, nopad_op op, const nopad_op_shape *shape);

    /* ---- pack / unpack: right-padded batches in backend memory (NULL where none) ------------ */
    /* cu_out[B+1] from lengths[B]; tokens_out[n_tokens] (types_out, or NULL) gathered from
     * tokens[B, max_len] (types or NULL). Lengths are not read back to the host: if they do not
     * fit [1, min(max_len, max_seqlen)] or add up to n_tokens, the ids are poisoned (NaN rows out)
     * and cu_out stays a valid layout. Needs n_tokens >= n_seqs. */
    nopad_status (*pack)(nopad_backend *be, const int32_t *tokens, const int32_t *types,
                         const int32_t *lengths, int32_t n_seqs, int32_t max_len,
                         int32_t max_seqlen, int32_t n_tokens, int32_t *cu_out,
                         int32_t *tokens_out, int32_t *types_out);
    /* out[B, max_len, dim] = the rows of x[T, dim] per sequence of cu[B+1], zeros past each end. */
    nopad_status (*unpack)(nopad_backend *be, void *out, const void *x, const int32_t *cu,
                           int32_t n_seqs, int32_t max_len, int32_t dim);

    /* ---- embedding ------------------------------------------------------------------------- */
    /* out[T, E] = LayerNorm(word[tokens] + pos[position_offset + t - start(seq)] + type[types])
     * word [V, E], pos [P, E] or NULL (no absolute positions: DeBERTa-v3; CPU only for now),
     * type [TV, E] or NULL (no token types); types[T] or NULL (= 0).
     * V, P, TV bound the ids: backends that cannot check them before the launch (device-side
     * input) must poison the row rather than read out of bounds. */
    nopad_status (*embed)(nopad_backend *be, void *out, const int32_t *tokens,
                          const int32_t *types, const nopad_seqs *seqs,
                          int32_t position_offset, int32_t vocab_size,
                          int32_t n_positions, int32_t type_vocab_size,
                          const void *word, const void *pos,
                          const void *type, const void *ln_weight, const void *ln_bias,
                          float eps, int32_t dim);

    /* ---- gemm ------------------------------------------------------------------------------ */
    /* out[T, N] = epilogue(x[T, K] · w[N, K]ᵀ). bias [N] (unless NONE); residual [T, N] for
     * BIAS_RESIDUAL (may alias out). */
    nopad_status (*gemm)(nopad_backend *be, void *out, const void *x, const void *w,
                         const void *bias, const void *residual, int32_t n_tokens, int32_t n_in,
                         int32_t n_out, nopad_epilogue epilogue, nopad_activation act);

    /* ---- norm ------------------------------------------------------------------------------ */
    /* x[T, dim] = LayerNorm(x + bias + residual) in place; bias [dim] or NULL, residual [T, dim]
     * or NULL. One pass. */
    nopad_status (*layernorm)(nopad_backend *be, void *x, const void *bias,
                              const void *residual, const void *ln_weight,
                              const void *ln_bias, float eps, int32_t n_tokens,
                              int32_t dim);

    /* ---- attention ------------------------------------------------------------------------- */
    /* Variable-length multi-head attention on packed QKV.
     * qkv [T, 3, n_heads, head_size] (the fused QKV projection's output: Q | K | V blocks of
     * n_heads·head_size each), out [T, n_heads·head_size]. Each token attends to the tokens of
     * its own sequence (only to earlier ones and itself when causal). */
    nopad_status (*attention)(nopad_backend *be, void *out, const void *qkv,
                              const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                              float scale, int causal);
    /* DeBERTa-v2/v3's disentangled attention: `attention` (not causal) whose scores carry the
     * relative-position terms, computed per sequence from the packed stream (no [B, S, S] bias):
     *   s_ij = scale · (q_i·k_j + q_i·pos_key[r_ij] + k_j·pos_query[r_ij]),
     *   r_ij = clamp(nopad_rel_bucket(i - j, rel) + k, 0, 2k - 1), k = rel->att_span,
     * i, j positions inside the sequence, head h reading columns h·head_size of each table.
     * pos_key, pos_query [2k, n_heads·head_size] (the relative embeddings projected by the
     * layer's key and query weights), either NULL for a term the model does not have (c2p, p2c).
     * NULL where the backend has none yet. */
    nopad_status (*attention_rel)(nopad_backend *be, void *out, const void *qkv,
                                  const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                                  float scale, const void *pos_key, const void *pos_query,
                                  const nopad_rel_positions *rel);

    /* ---- pooling --------------------------------------------------------------------------- */
    /* out[B, dim] = pooling of x[T, dim] over each sequence (CLS: first token; MEAN; MAX). */
    nopad_status (*pool)(nopad_backend *be, void *out, const void *x, const nopad_seqs *seqs,
                         int32_t dim, nopad_pooling mode);

    /* x[rows, dim] /= max(‖row‖₂, 1e-12) in place (as torch.nn.functional.normalize). */
    nopad_status (*l2_normalize)(nopad_backend *be, void *x, int32_t rows, int32_t dim);

    /* ---- training: backward ops, losses, optimisers (NULL where the backend has none yet) ---- */
    /* The backward of each forward op above, for padding-free training (src/train/). Mixed
     * precision: activations, weights and the gradients of activations are in the backend's
     * dtype (`void *`); gradients of parameters are float32 on every backend (`float *`, the
     * names ending in 32), summed over tokens in float32 at least. Gradients of parameters
     * accumulate (+=), so a parameter used twice (the tied MLM decoder, ALBERT's shared layers)
     * and micro-batches add up; gradients of activations are written (=) unless an op says
     * otherwise. A gradient buffer may alias the upstream gradient where an op says so. Ids and
     * labels are checked by the caller on the host before anything is enqueued. */
    /* dst[0 .. bytes) = 0. */
    nopad_status (*zero)(nopad_backend *be, void *dst, size_t bytes);
    /* Backward of gemm's y[T, N] = x[T, K]·w[N, K]ᵀ (+ b) given dy [T, N]:
     *   dx[T, K] = dy·w (+= when accumulate_dx; NULL: skipped)
     *   dw32[N, K] += dyᵀ·x (NULL: skipped)
     *   db32[N] += Σ_t dy (NULL: skipped) */
    nopad_status (*gemm_backward)(nopad_backend *be, void *dx, float *dw32, float *db32, const void *dy,
                                  const void *x, const void *w, int32_t n_tokens, int32_t n_in,
                                  int32_t n_out, int accumulate_dx);
    /* y[T, dim] = act(x) elementwise: training keeps the pre-activation x for the backward (the
     * forward's fused bias+act epilogue does not). */
    nopad_status (*activation)(nopad_backend *be, void *y, const void *x, int32_t n_tokens,
                               int32_t dim, nopad_activation act);
    /* dx[T, dim] = dy ⊙ act'(x) from the pre-activation x (dx may alias dy); db32[dim] += Σ_t dx
     * when db32 is not NULL (the gradient of the bias that x includes). */
    nopad_status (*activation_backward)(nopad_backend *be, void *dx, float *db32, const void *dy,
                                        const void *x, int32_t n_tokens, int32_t dim,
                                        nopad_activation act);
    /* Optional fusions of an activation into the GEMMs around it (the FFN's), NULL where a
     * backend has none; either may return NOPAD_ERR_UNSUPPORTED for a dtype, activation or shape
     * it does not fuse, and the caller then runs gemm + activation / gemm_backward +
     * activation_backward, which compute the same:
     *   gemm_act_aux: y[T, N] = act(x[T, K]·w[N, K]ᵀ + b), aux[T, N] = x·wᵀ + b (the pre-activation
     *                 the backward needs)
     *   gemm_dx_act:  dx[T, K] = (dy[T, N]·w) ⊙ act'(aux[T, K]): gemm_backward's dx (not
     *                 accumulated) through the activation whose pre-activation is aux; the bias
     *                 gradient Σ_t dx is left to the caller */
    nopad_status (*gemm_act_aux)(nopad_backend *be, void *y, void *aux, const void *x, const void *w,
                                 const void *b, int32_t n_tokens, int32_t n_in, int32_t n_out,
                                 nopad_activation act);
    nopad_status (*gemm_dx_act)(nopad_backend *be, void *dx, const void *dy, const void *w, const void *aux,
                                int32_t n_tokens, int32_t n_in, int32_t n_out, nopad_activation act);
    /* Dropout of a packed batch's rows with a counter-based generator: y[t, c] = x[t, c] / (1 - p)
     * when hidden_dropout_bits(key, site, examples[s], t - cu_seqlens[s], c) >= p·2³²
     * (util/philox.h), t being a row of sequence s, else 0; plus residual[t, c] when residual is
     * not NULL (a sub-layer's dropped output joining the residual stream in one pass). x, y,
     * residual are [seqs->n_tokens, dim]; 0 <= p < 1, y may alias x. examples: [B] in backend
     * memory, each sequence's number in the corpus (NULL: sequence s is example s), so a token's
     * mask is the same wherever its sequence sits. It is its own backward: the same call
     * (residual NULL) on dy regenerates the mask from the counters, so no mask is stored. A step
     * gives each dropout site its own number. */
    nopad_status (*dropout)(nopad_backend *be, void *y, const void *x, const void *residual,
                            const nopad_seqs *seqs, const int64_t *examples, int32_t dim, float p,
                            uint64_t key, uint32_t site);
    /* Backward of layernorm's fused form y = LN(s)·w + b with s = x + bias + residual, from the
     * LayerNorm's input s [T, dim] (which training keeps; mean and variance are recomputed) and
     * dy [T, dim]: ds[T, dim] = ∂L/∂s, which is also the gradient of x and of residual (ds may
     * alias dy); dw32[dim] += Σ_t dy ⊙ (s - mean)/std, db32[dim] += Σ_t dy; dbias32[dim] +=
     * Σ_t ds when dbias32 is not NULL. */
    nopad_status (*layernorm_backward)(nopad_backend *be, void *ds, float *dw32, float *db32,
                                       float *dbias32, const void *dy, const void *s, const void *w,
                                       float eps, int32_t n_tokens, int32_t dim);
    /* Backward of embed (same ids, tables and sizes): the sum word + pos + type is recomputed
     * from the tables, then dy [T, E] (clobbered: it ends holding the gradient of that sum) goes
     * through the LayerNorm into d_ln_w32, d_ln_b32 [E] and is scatter-added into d_word32 [V, E],
     * d_pos32 [P, E] and d_type32 [TV, E] (NULL when type is NULL) at each token's rows. */
    nopad_status (*embed_backward)(nopad_backend *be, float *d_word32, float *d_pos32,
                                   float *d_type32, float *d_ln_w32, float *d_ln_b32, void *dy,
                                   const int32_t *tokens, const int32_t *types, const nopad_seqs *seqs,
                                   int32_t position_offset, const void *word, const void *pos,
                                   const void *type, const void *ln_weight, float eps,
                                   int32_t dim);
    /* attention, also writing lse32[T, n_heads] (float32) = log Σ_j exp(scale·q·k_j) of every
     * query row and head, which the backward reuses instead of the probabilities. With drop
     * (not NULL, p > 0) the probabilities are dropped before they weight V: out = (P ⊙ Z)·v,
     * Z = the mask of nopad_attention_dropout; lse stays that of the undropped P. */
    nopad_status (*attention_lse)(nopad_backend *be, void *out, float *lse32, const void *qkv,
                                  const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                                  float scale, int causal, const nopad_attention_dropout *drop);
    /* Backward of attention_lse, FlashAttention-2's way: dqkv [T, 3, n_heads, head_size] from
     * dout [T, n_heads·head_size] and the forward's qkv, out and lse32, per sequence and head:
     * P = exp(scale·q·kᵀ - lse), D_i = dout_i·out_i, dS = P ⊙ (Z ⊙ dout·vᵀ - D),
     * dq = scale·dS·k, dk = scale·dSᵀ·q, dv = (P ⊙ Z)ᵀ·dout, with the forward's drop (Z = 1
     * without; D_i = Σ_j P_ij·Z_ij·(dout_i·v_j) either way, since out holds the dropped P). */
    nopad_status (*attention_backward)(nopad_backend *be, void *dqkv, const void *dout,
                                       const void *qkv, const void *out, const float *lse32,
                                       const nopad_seqs *seqs, int32_t n_heads,
                                       int32_t head_size, float scale, int causal,
                                       const nopad_attention_dropout *drop);
    /* x[rows[i], :] += src[i, :] for i < n (x [*, dim], src [n, dim]); rows may repeat. The
     * backward of gather_rows (the MLM head's masked rows) and of CLS pooling (rows =
     * cu_seqlens). */
    nopad_status (*scatter_add_rows)(nopad_backend *be, void *x, const int32_t *rows,
                                     const void *src, int32_t n, int32_t dim);
    /* out[n, dim] = x[rows[i], :] in the backend's dtype (the MLM head's masked rows; the
     * decoder's gather_rows is its float32 twin). */
    nopad_status (*select_rows)(nopad_backend *be, void *out, const void *x, const int32_t *rows,
                                int32_t n, int32_t dim);
    /* Softmax cross-entropy of logits [n, classes] against labels[n] (in [0, classes)):
     * losses32[n] (float32) = logsumexp(row) - row[label], and dlogits [n, classes] =
     * (softmax(row) - onehot(label))·grad_scale (dlogits may alias logits). */
    nopad_status (*cross_entropy)(nopad_backend *be, float *losses32, void *dlogits,
                                  const void *logits, const int32_t *labels, int32_t n,
                                  int32_t classes, float grad_scale);
    /* Squared error of pred[n] against target32[n] (float32): losses32[n] = (pred - target)²,
     * dpred[n] = 2·(pred - target)·grad_scale (dpred may alias pred). */
    nopad_status (*squared_error)(nopad_backend *be, float *losses32, void *dpred,
                                  const void *pred, const float *target32, int32_t n,
                                  float grad_scale);
    /* One AdamW step on every tensor of the list (torch.optim.AdamW: decoupled weight decay,
     * bias correction): p -= lr·(wd·p + m̂ / (√v̂ + eps)). The list is host memory. */
    nopad_status (*adamw)(nopad_backend *be, const nopad_opt_tensor *tensors, int32_t n_tensors,
                          const nopad_opt_step *h);
    /* One LAMB step (NVIDIA apex FusedLAMB as MLPerf BERT runs it: adam_w_mode, bias correction,
     * grad averaging): the global norm of every gradient of the list; gradients divided by
     * norm / max_grad_norm when it is larger; Adam moments; u = m̂ / (√v̂ + eps) + wd·p;
     * p -= lr·r·u with the trust ratio r = ‖p‖ / ‖u‖ on tensors with weight decay (1 when a
     * norm is 0, and on tensors without decay). grad_norm32 (float32 in backend memory, or
     * NULL) receives the global norm before clipping. */
    nopad_status (*lamb)(nopad_backend *be, const nopad_opt_tensor *tensors, int32_t n_tensors,
                         const nopad_opt_step *h, float *grad_norm32);
    /* torch.nn.utils.clip_grad_norm_ over every gradient of the list (what HF's Trainer runs
     * before AdamW): the global L2 norm, then, when max_norm > 0, every gradient times
     * min(1, max_norm / (norm + 1e-6)). The gradients are updated in place (grad is the caller's
     * gradient buffer). grad_norm32 (float32 in backend memory, or NULL) receives the norm
     * before clipping. */
    nopad_status (*clip_grad_norm)(nopad_backend *be, const nopad_opt_tensor *tensors,
                                   int32_t n_tensors, float max_norm, float *grad_norm32);

    /* ---- decoder ops (NULL where the backend has none yet) ---------------------------------- */
    /* The residual stream of a decoder is float32 on every backend (h32, x32 below): rounding it
     * to half precision after every layer costs about 1e-2 relative error over 30 layers. */
    /* out32[T, dim] = word[tokens[t]] (+ pos[positions[t]] when pos is not NULL); a token
     * t < 0 stands for feed[-1 - t] (the ids the step before sampled, still on the device: the
     * next step is launched before they come back; feed may be NULL when no token is negative);
     * ids outside [0, vocab_size) or positions outside [0, n_positions) give a NaN row.
     * word holds the rows of ids [vocab0, vocab0 + vocab_rows) (a tensor-parallel rank's share of
     * the vocabulary; 0 and vocab_size: all of it); a valid id outside them gives a zero row (plus
     * its position's, when pos is not NULL). */
    nopad_status (*embed_tokens)(nopad_backend *be, float *out32, const int32_t *tokens,
                                 const int32_t *feed, const int32_t *positions, int32_t n_tokens,
                                 int32_t vocab_size, int32_t vocab0, int32_t vocab_rows,
                                 int32_t n_positions, const void *word, const void *pos,
                                 int32_t dim);
    /* out[T, dim] = LayerNorm(x32)·w + b (b may be NULL) or, rms, x32 / sqrt(mean(x32²) + eps)·w. */
    nopad_status (*norm)(nopad_backend *be, void *out, const float *x32, const void *w,
                         const void *b, float eps, int32_t n_tokens, int32_t dim, int rms);
    /* h32[T, dim] += x[T, dim] (x in the backend's dtype). */
    nopad_status (*residual_add)(nopad_backend *be, float *h32, const void *x, int32_t n_tokens,
                                 int32_t dim);
    /* h32 += x, then out = norm(h32) as `norm` computes it: a sub-layer's output joins the
     * residual stream and the next sub-layer's input is normed, in one pass. */
    nopad_status (*add_norm)(nopad_backend *be, void *out, float *h32, const void *x,
                             const void *w, const void *b, float eps, int32_t n_tokens,
                             int32_t dim, int rms);
    /* qkv [T, n_heads + 2·n_kv_heads, head_size] (Q heads, then K, then V): when inv_freq is not
     * NULL, rotary embeddings in place on the Q and K heads, HF's rotate_half convention (for
     * i < head_size/2 the pair (x[i], x[i + head_size/2]) turns by positions[t]·inv_freq[i];
     * inv_freq [head_size/2] float32 in backend memory); then the K and V heads are copied into
     * k_cache / v_cache [slots, n_kv_heads, head_size] at slots[t]. */
    nopad_status (*rope_kv_store)(nopad_backend *be, void *qkv, void *k_cache, void *v_cache,
                                  const int32_t *positions, const int32_t *slots,
                                  int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                                  int32_t head_size, const float *inv_freq);
    /* out[T, n_heads·head_size]: causal attention of the Q heads of qkv over each sequence's
     * paged keys and values (nopad_kv_batch); query head h reads KV head h / (n_heads /
     * n_kv_heads) (grouped-query attention). A backend may read kv's index arrays and the cache
     * rows of positions before each sequence's new tokens while the ops before it still run:
     * those must be in place before the step's first op (host uploads and earlier steps are). */
    nopad_status (*attention_paged)(nopad_backend *be, void *out, const void *qkv,
                                    const void *k_cache, const void *v_cache,
                                    const nopad_kv_batch *kv, int32_t n_heads, int32_t n_kv_heads,
                                    int32_t head_size, float scale);
    /* rope_kv_store (positions: each sequence's new token at seqlen_k - 1; slots: through the
     * block table) then attention_paged, fused where the backend can, for steps of one new token
     * per sequence (kv->max_q == 1, n_tokens == n_seqs: decode). qkv is left as it came. NULL: the
     * caller runs the two ops. */
    nopad_status (*attention_paged_rope)(nopad_backend *be, void *out, const void *qkv, void *k_cache,
                                         void *v_cache, const nopad_kv_batch *kv, int32_t n_heads,
                                         int32_t n_kv_heads, int32_t head_size, float scale,
                                         const float *inv_freq);
    /* out[T, F] = silu(gate_up[:, :F]) · gate_up[:, F:] (gate_up [T, 2F]). */
    nopad_status (*swiglu)(nopad_backend *be, void *out, const void *gate_up, int32_t n_tokens,
                           int32_t dim);
    /* out[T, F] = silu(x·w[0:F]ᵀ) ⊙ (x·w[F:2F]ᵀ) for x [T, K], w [2F, K] (LLaMA's gate and up
     * projections stacked): gemm then swiglu, fused where the backend can; gate_up [T, 2F] is
     * scratch it may use. NULL: the caller runs gemm and swiglu. */
    nopad_status (*gemm_swiglu)(nopad_backend *be, void *out, void *gate_up, const void *x,
                                const void *w, int32_t n_tokens, int32_t n_in, int32_t n_ffn);
    /* out32[n, dim] = x32[rows[i]] (the rows whose logits a step needs). */
    nopad_status (*gather_rows)(nopad_backend *be, float *out32, const float *x32,
                                const int32_t *rows, int32_t n, int32_t dim);
    /* out32[T, N] = x[T, K] · w[N, K]ᵀ with a float32 output (the LM head: logits are never
     * rounded to the compute dtype). */
    nopad_status (*gemm_f32)(nopad_backend *be, float *out32, const void *x, const void *w,
                             int32_t n_tokens, int32_t n_in, int32_t n_out);
    /* A greedy choice over a share of the vocabulary (a tensor-parallel rank's logit columns),
     * to be merged across ranks without gathering the logits: for each row r of x32[rows, ld]
     * (float32, its first cols columns), best[r] = {the largest value, id0 + the lowest column
     * holding it, Σ_j exp(x_j - max) summed in double and rounded once} as three floats (ids are
     * exact below 2^24; a float32 running sum would drift ~1e-4 relative at 150k ids).
     * A row holding NaN or +inf gives {NaN, -1, 0}; a row of -inf only (or cols 0) gives
     * {-inf, -1, 0}. */
    nopad_status (*row_argmax)(nopad_backend *be, float *best, const float *x32, int32_t rows,
                               int32_t cols, int32_t ld, int32_t id0);
    /* Sampling on the device (NULL: the caller samples on the host from downloaded logits).
     * ids[n] (host) = the next id of each row of logits32 [n, vocab] (backend memory, float32,
     * clobbered), chosen as sample_token (model/sampling.h) chooses it: params[n] and draws[n]
     * (host) each row's parameters and draw counter, history (host) the ids of every row's
     * prompt and output for the penalties, row r's at [cu_history[r], cu_history[r+1]).
     * masks (host) [n] or NULL: row r's allowed ids, bit t of word t / 32 ((vocab + 31) / 32
     * words; masks[r] NULL: every id), the refused ids -inf before anything else (the host
     * sampler's caller does the same). logprobs[n] (host) or NULL. n_top (0 to
     * NOPAD_MAX_TOP_LOGPROBS): top_ids and top_logprobs [n, n_top] (host) receive each row's
     * sampling_top_logprobs. Waits for the ids: the step's one host synchronisation. A row of
     * NaN / +inf / all -inf logits (after its mask) is NOPAD_ERR_INVALID_ARGUMENT naming the row. */
    nopad_status (*sample)(nopad_backend *be, float *logits32, int32_t n, int32_t vocab,
                           const nopad_sampling_params *params, const uint64_t *draws,
                           const int32_t *history, const int32_t *cu_history, const uint32_t *const *masks,
                           int32_t *ids, float *logprobs, int32_t n_top, int32_t *top_ids, float *top_logprobs);
    /* sample in two halves, where the backend can leave the work running: sample_begin queues it
     * (the inputs, masks included, are read before it returns) and returns; sample_wait(n, n_top)
     * waits for its n ids (their log-probabilities when sample_begin was asked for them, and the
     * top n_top of each row when it asked for as many) and checks them as sample does. In between,
     * only work queued behind the sampling may run on the backend (the next step's forward). The
     * ids also land in ids_out[n] on the device (the next step's feed; NULL: not kept). NULL: only
     * sample. */
    nopad_status (*sample_begin)(nopad_backend *be, float *logits32, int32_t n, int32_t vocab,
                                 const nopad_sampling_params *params, const uint64_t *draws,
                                 const int32_t *history, const int32_t *cu_history,
                                 const uint32_t *const *masks, int want_logprobs, int32_t n_top,
                                 int32_t *ids_out);
    nopad_status (*sample_wait)(nopad_backend *be, int32_t *ids, float *logprobs, int32_t n, int32_t n_top,
                                int32_t *top_ids, float *top_logprobs);
    /* The greedy choice of a split model's rows from its ranks' row_argmax triples, merged on the
     * device, as sample_begin samples: best[parts, n, 3] (backend memory, part k's row r at
     * (k * n + r) * 3) merged as sampling_merge_greedy (model/sampling.h) merges them; the ids
     * land in ids_out[n] (the next step's feed) and come back through sample_wait(n, 0), with
     * their log-probabilities when want_logprobs. NULL: the caller merges on the host. */
    nopad_status (*greedy_merge_begin)(nopad_backend *be, const float *best, int32_t parts, int32_t n,
                                       int want_logprobs, int32_t *ids_out);

    /* ---- weights in a block format (NULL where the backend runs none: its models dequantise;
     * nopad_backend_runs_format says which formats and row lengths a backend runs) ----------- */
    /* gemm with w [N, K] in block format `format`: out[T, N] = epilogue(x[T, K] · wᵀ), in the
     * backend's dtype, or float32 when out_f32 (the LM head, as gemm_f32). */
    nopad_status (*gemm_q)(nopad_backend *be, void *out, const void *x, const void *w,
                           nopad_weight_format format, const void *bias, const void *residual,
                           int32_t n_tokens, int32_t n_in, int32_t n_out, nopad_epilogue epilogue,
                           nopad_activation act, int out_f32);
    /* Optional (NULL: weights are held as the file stores them). packed_format: the format a linear
     * weight of `format`, rows × cols, is held in when the backend lays it out at load for its
     * kernels (the CPU: Q4_K, Q6_K, Q4_1 and Q8_0 in groups of 8 interleaved rows, NOPAD_WEIGHT_Q4_K_R8 / _Q6_K_R8 / _Q4_1_R8 /
     * _Q8_0_R8), with its bytes
     * in *bytes; else `format` itself, *bytes untouched. pack_q: dst (backend memory, those bytes)
     * = the rows at src (host memory, as stored) in that layout. Never for embeddings (their rows
     * are gathered one at a time). */
    nopad_weight_format (*packed_format)(nopad_backend *be, nopad_weight_format format, int64_t rows, int64_t cols,
                                         size_t *bytes);
    nopad_status (*pack_q)(nopad_backend *be, void *dst, const void *src, nopad_weight_format format, int64_t rows,
                           int64_t cols);
    /* embed_tokens with the rows of word in block format `format`, each dequantised as it is
     * gathered. */
    nopad_status (*embed_tokens_q)(nopad_backend *be, float *out32, const int32_t *tokens,
                                   const int32_t *feed, const int32_t *positions, int32_t n_tokens,
                                   int32_t vocab_size, int32_t vocab0, int32_t vocab_rows,
                                   int32_t n_positions, const void *word, nopad_weight_format format,
                                   const void *pos, int32_t dim);
};

/* Whether `be` runs linear layers and embedding gathers on weights of `format` with rows of
 * n_in values: always for NOPAD_WEIGHT_DTYPE; for a block format, when the backend has gemm_q and
 * embed_tokens_q and its supports(NOPAD_OP_GEMM) accepts the format and row length (a backend
 * without them, CUDA today, runs dequantised weights only). */
static inline int nopad_backend_runs_format(nopad_backend *be, nopad_weight_format format, int32_t n_in) {
    if (format == NOPAD_WEIGHT_DTYPE) return 1;
    /* every field assigned, no initializer list: the CUDA sources compile this as C++, which has
     * no designated initializers before C++20 and warns of members a {0} leaves out */
    nopad_op_shape shape;
    shape.n_tokens = 1, shape.n_in = n_in, shape.n_out = 1;
    shape.n_heads = 0, shape.head_size = 0, shape.causal = 0;
    shape.epilogue = NOPAD_EPILOGUE_NONE, shape.act = NOPAD_ACT_GELU;
    shape.weight_format = format;
    return be->gemm_q && be->embed_tokens_q && be->supports(be, NOPAD_OP_GEMM, &shape);
}

/* What a backend is created for: the device and its ordinal, the compute dtype, and the
 * device-specific settings. */
typedef struct nopad_backend_params {
    nopad_device device;
    int32_t device_index; /* CUDA device ordinal */
    nopad_dtype dtype;
    int n_threads;        /* CPU threads; <= 0: OpenMP's default */
    void *cuda_stream;    /* a cudaStream_t of the caller's, or NULL: the backend's own */
} nopad_backend_params;

/* Creates the backend for `p` (backend.c: the one place that knows every backend). A device this
 * build lacks, or a dtype the device does not compute in, is a clear NOPAD_ERR_UNSUPPORTED. */
nopad_status nopad_backend_create(const nopad_backend_params *p, nopad_backend **out);

/* NOPAD_OK for drop NULL, or p in [0, 1) with a site below 2^15 (its counters' room); else an
 * INVALID_ARGUMENT naming `op` and the value. Every backend's attention_lse and
 * attention_backward check their drop with it. */
nopad_status nopad_attention_dropout_check(const char *op, const nopad_attention_dropout *drop);

/* The constructors behind it. CPU: float32, OpenBLAS + OpenMP. */
nopad_status nopad_backend_cpu_create(int n_threads, nopad_backend **out);

#ifdef __cplusplus
}
#endif
#endif
