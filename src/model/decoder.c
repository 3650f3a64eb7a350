/* The decoder graph, one loop over layers on the op table:
 *
 *   h = embed(tokens) (+ learned positions, GPT-2)
 *   per layer:  xn = norm1(h); qkv = xn·Wqkvᵀ (+b); rope(q, k) (LLaMA) and store k, v
 *               attn = causal paged attention(q; the sequence's cached keys and values)
 *               h = attn·Woᵀ (+b) + h; xn = norm2(h)                  (one add_norm)
 *               h = down(act(up(xn))) + h; xn = next layer's norm1(h)  (LLaMA: silu(gate)·up)
 *   logits = final_norm(h[rows])·lm_headᵀ, rows = each sequence's last new token (or all)
 *
 * A step is packed: T new tokens of B sequences, whatever each brings (a prompt chunk, one
 * decode token). Positions come from each sequence's history length, so a prompt split into
 * chunks gives the logits it gives whole. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/decoder.h"
#include "util/error.h"

void decoder_rope_inv_freq(const model_config *cfg, float *out) {
    const int32_t half = cfg->head_size / 2;
    for (int32_t i = 0; i < half; i++) {
        /* HF: 1 / base^(2i / D), the exponent and the power in float32 */
        float expo = (float)(2 * i) / (float)cfg->head_size;
        float f = 1.0f / powf(cfg->rope_theta, expo);
        const rope_scaling *r = &cfg->rope;
        if (r->kind == ROPE_SCALING_LINEAR) {
            f /= r->factor;
        } else if (r->kind == ROPE_SCALING_LLAMA3) {
            const float old = (float)r->original_max_positions;
            const float low_wavelen = old / r->low_freq_factor;
            const float high_wavelen = old / r->high_freq_factor;
            const float wavelen = 2.0f * 3.14159265358979323846f / f;
            float scaled = wavelen > low_wavelen ? f / r->factor : f;
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                const float smooth = (old / wavelen - r->low_freq_factor) /
                                     (r->high_freq_factor - r->low_freq_factor);
                scaled = (1.0f - smooth) * scaled / r->factor + smooth * scaled;
            }
            f = scaled;
        }
        out[i] = f;
    }
}

/* ---- state ---------------------------------------------------------------------------------- */

static nopad_status alloc(nopad_backend *be, decoder_state *s, size_t bytes, void **out) {
    nopad_status st = be->alloc(be, bytes ? bytes : 1, out);
    if (st == NOPAD_OK) s->bytes += bytes;
    return st;
}

nopad_status decoder_state_init(nopad_backend *be, const model_config *cfg, const decoder_weights *w,
                                int32_t max_tokens, int32_t kv_tokens, int32_t block_size, decoder_state *s) {
    memset(s, 0, sizeof *s);
    if (block_size <= 0) block_size = 16;
    if (max_tokens <= 0) max_tokens = 2048;
    if (kv_tokens <= 0) kv_tokens = 8192;
    s->block_size = block_size;
    s->n_blocks = (kv_tokens + block_size - 1) / block_size;
    s->max_tokens = max_tokens;
    const size_t es = nopad_dtype_size(be->dtype);
    const size_t T = (size_t)max_tokens, H = (size_t)cfg->hidden_size;
    /* this rank's heads and intermediate columns (all of them with tp 1) */
    const tp_shard *tp = &w->tp;
    const size_t D = (size_t)cfg->head_size, nh = (size_t)tp->heads, kvh = (size_t)tp->kv_heads,
                 F = (size_t)tp->ffn;
    s->pad_block = s->n_blocks;
    const size_t slots = ((size_t)s->n_blocks + 1) * block_size;
    s->k_cache = calloc((size_t)cfg->num_layers, sizeof *s->k_cache);
    s->v_cache = calloc((size_t)cfg->num_layers, sizeof *s->v_cache);
    s->free_blocks = malloc((size_t)s->n_blocks * sizeof *s->free_blocks);
    if (!s->k_cache || !s->v_cache || !s->free_blocks)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "decoder: out of memory");
    nopad_status st = NOPAD_OK;
    for (int32_t l = 0; l < cfg->num_layers && st == NOPAD_OK; l++) {
        st = alloc(be, s, slots * kvh * D * es, &s->k_cache[l]);
        if (st == NOPAD_OK) st = alloc(be, s, slots * kvh * D * es, &s->v_cache[l]);
    }
    if (st != NOPAD_OK)
        return nopad_wrap_error(st, "decoder: the KV cache of %d tokens (%d layers x %zu KV heads x "
                                    "%zu) does not fit; ask for fewer KV tokens",
                                kv_tokens, cfg->num_layers, kvh, D);
    /* blocks are handed out lowest first */
    for (int32_t b = 0; b < s->n_blocks; b++) s->free_blocks[b] = s->n_blocks - 1 - b;
    s->n_free = s->n_blocks;
    const size_t mlp = cfg->family == FAMILY_LLAMA ? 2 * F : F;
    /* the residual stream's buffers: with tensor parallelism, room for a sequence-parallel step's
     * padded chunks (tp.h: size · ceil(T / size) <= T + size - 1 rows) */
    const size_t Th = T + (tp->comm ? (size_t)tp->size - 1 : 0);
    if (st == NOPAD_OK) st = alloc(be, s, Th * H * sizeof(float), (void **)&s->h);
    if (st == NOPAD_OK) st = alloc(be, s, Th * H * es, &s->tmp);
    if (st == NOPAD_OK) st = alloc(be, s, Th * H * es, &s->xn);
    if (st == NOPAD_OK) st = alloc(be, s, T * (nh + 2 * kvh) * D * es, &s->qkv);
    if (st == NOPAD_OK) st = alloc(be, s, T * nh * D * es, &s->attn);
    if (st == NOPAD_OK) st = alloc(be, s, T * mlp * es, &s->mlp);
    if (st == NOPAD_OK) st = alloc(be, s, T * F * es, &s->act);
    if (st == NOPAD_OK) st = alloc(be, s, T * H * sizeof(float), (void **)&s->last);
    /* the LM head runs in row chunks, so the logits buffer holds a chunk, not T rows */
    s->logit_rows = max_tokens < 256 ? max_tokens : 256;
    if (st == NOPAD_OK)
        st = alloc(be, s, (size_t)s->logit_rows * (size_t)cfg->vocab_size * sizeof(float),
                   (void **)&s->logits);
    if (st == NOPAD_OK && tp->comm)
        st = alloc(be, s, (size_t)tp->size * s->logit_rows * (size_t)tp->vocab_stride * sizeof(float),
                   (void **)&s->logits_parts);
    /* the greedy triples: every rank's with tensor parallelism, one process's where the backend
     * merges them on the device */
    if (st == NOPAD_OK && (tp->comm || be->greedy_merge_begin))
        st = alloc(be, s, (size_t)tp->size * s->logit_rows * 3 * sizeof(float), (void **)&s->best_parts);
    if (st == NOPAD_OK && tp->comm) {
        s->host_best = malloc((size_t)tp->size * s->logit_rows * 3 * sizeof(float));
        if (!s->host_best) st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "decoder: out of memory");
    }
    /* tokens, positions, slots [T each]; rows [B], cu_q [B+1], seqlen_k [B]; table [B, max] */
    const size_t max_blocks = ((size_t)cfg->max_position_embeddings + block_size - 1) / block_size;
    s->i32_count = 6 * T + 1 + T * max_blocks;
    if (st == NOPAD_OK) st = alloc(be, s, s->i32_count * sizeof(int32_t), (void **)&s->i32);
    if (st == NOPAD_OK) st = alloc(be, s, T * sizeof(int32_t), (void **)&s->feed);
    s->host_i32 = malloc(s->i32_count * sizeof(int32_t));
    if (st == NOPAD_OK && !s->host_i32)
        st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "decoder: out of memory");
    sampler_scratch_init(&s->scratch);
    return st;
}

void decoder_state_free(nopad_backend *be, const model_config *cfg, decoder_state *s) {
    if (!be) return;
    for (int32_t l = 0; l < cfg->num_layers; l++) {
        if (s->k_cache && s->k_cache[l]) be->free(be, s->k_cache[l]);
        if (s->v_cache && s->v_cache[l]) be->free(be, s->v_cache[l]);
    }
    void *bufs[] = {s->h,    s->tmp,    s->xn,          s->qkv, s->attn, s->mlp,
                    s->act,  s->last,   s->logits,      s->i32, s->feed, s->logits_parts,
                    s->best_parts};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->free(be, bufs[i]);
    free(s->k_cache);
    free(s->v_cache);
    free(s->free_blocks);
    free(s->host_i32);
    free(s->host_best);
    sampler_scratch_free(&s->scratch);
    memset(s, 0, sizeof *s);
}

/* ---- the step ------------------------------------------------------------------------------- */

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        nopad_status st_ = (expr);                                                                 \
        if (st_ != NOPAD_OK) return st_;                                                           \
    } while (0)

/* A step's device-side view, what the recorded part of a step reads. */
typedef struct step_call {
    nopad_backend *be;
    const model_config *cfg;
    const decoder_weights *w;
    decoder_state *s;
    nopad_kv_batch kv;
    const int32_t *d_tokens, *d_pos, *d_slots, *d_rows;
    int32_t n_tokens, n_rows; /* n_rows: rows of h the LM head reads (B, or T for all logits) */
    int gather;               /* the rows are each sequence's last token, gathered from h */
    int32_t head_rows;        /* rows of logits computed inside (the first chunk; 0: none) */
    int seq;                  /* sequence-parallel (tp.h): the residual stream split by rows */
    tp_seq sq;                /* with seq: this rank's rows */
} step_call;

/* The LM head's float32 logits out32[T, N] = x[T, K] · wᵀ, either storage. */
static nopad_status linear_f32(nopad_backend *be, float *out32, const void *x, const void *w,
                               nopad_weight_format format, int32_t T, int32_t K, int32_t N) {
    if (format == NOPAD_WEIGHT_DTYPE) return be->gemm_f32(be, out32, x, w, T, K, N);
    return be->gemm_q(be, out32, x, w, format, NULL, NULL, T, K, N, NOPAD_EPILOGUE_NONE, NOPAD_ACT_GELU, 1);
}

/* With tensor parallelism, the partial sums of the ranks' [T, hidden] sub-layer outputs (or
 * embedding rows) made whole; nothing with tp 1. */
static nopad_status tp_sum(nopad_backend *be, const tp_shard *tp, void *x, size_t n, comm_type t) {
    return tp->comm ? comm_all_reduce(tp->comm, be, x, n, t, COMM_SUM) : NOPAD_OK;
}

/* A column-split linear layer of the step (QKV, gate|up): out[T, N] from x[T, K], of which a
 * sequence-parallel step's rank holds its rows only: the others' are gathered first. */
static nopad_status column_linear(const step_call *c, void *out, void *x, const void *w, nopad_weight_format format,
                                  const void *bias, int32_t K, int32_t N, nopad_epilogue epilogue,
                                  nopad_activation act) {
    if (c->seq) return tp_ag_linear(c->be, &c->w->tp, &c->sq, out, x, w, format, bias, c->n_tokens, K, N, epilogue, act);
    return tp_linear(c->be, out, x, w, format, bias, c->n_tokens, K, N, epilogue, act);
}

/* A row-split linear layer of the step (O, down): out[T, H] = x[T, K] · wᵀ summed over the ranks,
 * every row on every rank (the all-reduce), or a sequence-parallel step's rank's rows. */
static nopad_status row_linear(const step_call *c, void *out, const void *x, const void *w, nopad_weight_format format,
                               const void *bias, int32_t K) {
    nopad_backend *be = c->be;
    const int32_t T = c->n_tokens, H = c->cfg->hidden_size;
    const nopad_epilogue epilogue = bias ? NOPAD_EPILOGUE_BIAS : NOPAD_EPILOGUE_NONE;
    if (c->seq) return tp_linear_rs(be, &c->w->tp, &c->sq, out, x, w, format, bias, T, K, H, epilogue, NOPAD_ACT_GELU);
    TRY(tp_linear(be, out, x, w, format, bias, T, K, H, epilogue, NOPAD_ACT_GELU));
    return tp_sum(be, &c->w->tp, out, (size_t)T * H, comm_type_of(be->dtype));
}

/* With tensor parallelism, the rank's part of the LM head for rows xn[n, hidden]: the columns of
 * its vocabulary rows into s->logits, packed [n, vocab_rows] (the full logits are gathered from
 * there only when the output needs them, tp_head_logits). The first chunk's part runs inside the
 * recorded step, whatever the output's parameters turn out to be. */
static nopad_status tp_head_part(nopad_backend *be, const model_config *cfg, const decoder_weights *w,
                                 decoder_state *s, const void *xn, int32_t n) {
    const tp_shard *tp = &w->tp;
    if (tp->vocab_rows == 0) return NOPAD_OK;
    return linear_f32(be, s->logits, xn, w->lm_head, w->lm_head_format, n, cfg->hidden_size, tp->vocab_rows);
}

/* Each greedy row's triple of the rank's part (row_argmax: max, id, exp-sum), all-gathered from
 * every rank into best_parts [tp, n, 3]: greedy rows merge those (tp_greedy, greedy_merge_begin)
 * without gathering the logits. Queued with the output, after the replay, as the one-process
 * path's row_argmax is: inside the recorded step, this and the part's place in logits_parts
 * made a forced world of one 5-7% slower a decode step than one process (H100, 32-64 rows,
 * bench/results/tp_world1_2026-12-07f_H100). */
static nopad_status tp_head_best(nopad_backend *be, const decoder_weights *w, decoder_state *s, int32_t n) {
    const tp_shard *tp = &w->tp;
    float *best = s->best_parts + (size_t)tp->rank * n * 3;
    TRY(be->row_argmax(be, best, s->logits, n, tp->vocab_rows, tp->vocab_rows, tp->vocab0));
    return comm_all_gather(tp->comm, be, s->best_parts, best, (size_t)n * 3, COMM_F32);
}

/* The ranks' parts of the LM head (tp_head_part) all-gathered and each rank's block put in place:
 * logits[n, V] float32, the same on every rank. */
static nopad_status tp_head_logits(nopad_backend *be, const model_config *cfg, const decoder_weights *w,
                                   decoder_state *s, int32_t n) {
    const tp_shard *tp = &w->tp;
    const int32_t V = cfg->vocab_size;
    const size_t part = (size_t)n * tp->vocab_stride; /* a rank's block: [n, vocab_rows] packed */
    /* the rank's part leaves s->logits before the blocks are copied back over it (stream order) */
    TRY(comm_all_gather(tp->comm, be, s->logits_parts, s->logits, part, COMM_F32));
    for (int32_t r = 0; r < tp->size; r++) {
        const int32_t v0 = r * tp->vocab_stride;
        const int32_t rows = V - v0 < tp->vocab_stride ? (V - v0 > 0 ? V - v0 : 0) : tp->vocab_stride;
        if (rows > 0)
            TRY(be->copy_2d(be, s->logits + v0, (size_t)V * sizeof(float), s->logits_parts + (size_t)r * part,
                            (size_t)rows * sizeof(float), (size_t)rows * sizeof(float), (size_t)n));
    }
    return NOPAD_OK;
}

/* logits[n, V] float32 = xn[n, hidden] · lm_headᵀ, on every rank of a split model alike. */
static nopad_status lm_head(nopad_backend *be, const model_config *cfg, const decoder_weights *w,
                            decoder_state *s, const void *xn, int32_t n) {
    if (!w->tp.comm)
        return linear_f32(be, s->logits, xn, w->lm_head, w->lm_head_format, n, cfg->hidden_size, cfg->vocab_size);
    TRY(tp_head_part(be, cfg, w, s, xn, n));
    return tp_head_logits(be, cfg, w, s, n);
}

/* embed .. layers .. final norm, and the first chunk of the LM head: only ops, on buffers that
 * stay put, so that a decode step can be recorded once and replayed. With tensor parallelism the
 * heads, intermediate columns and vocabulary rows are this rank's (model/tp.h), and sums make the
 * residual stream whole on every rank: after the embedding, and after each layer's O and down
 * projections. A sequence-parallel step (c->seq) reduce-scatters there instead: each rank adds and
 * norms its block of rows, which the next column-split GEMM gathers, and the stream is gathered
 * whole after the last layer for the final norm and the LM head, which run as without it. */
static nopad_status step_forward(void *ctx) {
    const step_call *c = ctx;
    nopad_backend *be = c->be;
    const model_config *cfg = c->cfg;
    const decoder_weights *w = c->w;
    const tp_shard *tp = &w->tp;
    decoder_state *s = c->s;
    const int32_t T = c->n_tokens, H = cfg->hidden_size, D = cfg->head_size, nh = tp->heads,
                  kvh = tp->kv_heads, F = tp->ffn, V = cfg->vocab_size;
    const int llama = cfg->family == FAMILY_LLAMA, rms = cfg->norm == NORM_RMSNORM;
    const float eps = cfg->layer_norm_eps;
    const size_t es = nopad_dtype_size(be->dtype);
    /* the rows this rank adds and norms: all T, or a sequence-parallel step's block (at their own
     * places in h, xn and tmp) */
    const int32_t r0 = c->seq ? c->sq.row0 : 0, nr = c->seq ? c->sq.rows : T;
    float *h_own = s->h + (size_t)r0 * H;
    void *xn_own = (char *)s->xn + (size_t)r0 * H * es, *tmp_own = (char *)s->tmp + (size_t)r0 * H * es;
    /* GPT-2's learned positions join the sum once: rank 0 adds them */
    if (w->tok_emb_format == NOPAD_WEIGHT_DTYPE)
        TRY(be->embed_tokens(be, s->h, c->d_tokens, s->feed, llama ? NULL : c->d_pos, T, V, tp->vocab0,
                             tp->vocab_rows, cfg->max_position_embeddings, w->tok_emb,
                             tp->rank == 0 ? w->pos_emb : NULL, H));
    else
        TRY(be->embed_tokens_q(be, s->h, c->d_tokens, s->feed, llama ? NULL : c->d_pos, T, V, tp->vocab0,
                               tp->vocab_rows, cfg->max_position_embeddings, w->tok_emb, w->tok_emb_format,
                               tp->rank == 0 ? w->pos_emb : NULL, H));
    if (c->seq) /* every rank's rows summed into their owner's block */
        TRY(comm_reduce_scatter(tp->comm, be, h_own, s->h, (size_t)c->sq.chunk * H, COMM_F32, COMM_SUM));
    else
        TRY(tp_sum(be, tp, s->h, (size_t)T * H, COMM_F32));
    const int32_t qkv_dim = (nh + 2 * kvh) * D;
    /* decode (one new token a sequence): RoPE and the KV store inside the attention, where the
     * backend fuses them */
    const int decode_fused = be->attention_paged_rope && c->kv.max_q == 1 && c->kv.n_tokens == c->kv.n_seqs;
    const float scale = 1.0f / sqrtf((float)D);
    /* a sub-layer's output joins h32 in the same pass that norms the next sub-layer's input */
    if (nr > 0) TRY(be->norm(be, xn_own, h_own, w->layers[0].norm1_w, w->layers[0].norm1_b, eps, nr, H, rms));
    for (int32_t l = 0; l < cfg->num_layers; l++) {
        const decoder_layer *L = &w->layers[l];
        TRY(column_linear(c, s->qkv, s->xn, L->qkv_w, L->qkv_format, L->qkv_b, H, qkv_dim,
                          L->qkv_b ? NOPAD_EPILOGUE_BIAS : NOPAD_EPILOGUE_NONE, NOPAD_ACT_GELU));
        if (decode_fused) {
            TRY(be->attention_paged_rope(be, s->attn, s->qkv, s->k_cache[l], s->v_cache[l], &c->kv, nh,
                                         kvh, D, scale, llama ? w->inv_freq : NULL));
        } else {
            TRY(be->rope_kv_store(be, s->qkv, s->k_cache[l], s->v_cache[l], c->d_pos, c->d_slots, T, nh,
                                  kvh, D, llama ? w->inv_freq : NULL));
            TRY(be->attention_paged(be, s->attn, s->qkv, s->k_cache[l], s->v_cache[l], &c->kv, nh,
                                    kvh, D, scale));
        }
        TRY(row_linear(c, s->tmp, s->attn, L->o_w, L->o_format, L->o_b, nh * D));
        if (nr > 0) TRY(be->add_norm(be, xn_own, h_own, tmp_own, L->norm2_w, L->norm2_b, eps, nr, H, rms));
        if (llama) {
            /* the fused gate|up + SwiGLU GEMM has no gathering form: a sequence-parallel step runs
             * the two */
            if (be->gemm_swiglu && L->up_format == NOPAD_WEIGHT_DTYPE && !c->seq) {
                TRY(be->gemm_swiglu(be, s->act, s->mlp, s->xn, L->up_w, T, H, F));
            } else {
                TRY(column_linear(c, s->mlp, s->xn, L->up_w, L->up_format, NULL, H, 2 * F, NOPAD_EPILOGUE_NONE,
                                  NOPAD_ACT_GELU));
                TRY(be->swiglu(be, s->act, s->mlp, T, F));
            }
        } else {
            TRY(column_linear(c, s->act, s->xn, L->up_w, L->up_format, L->up_b, H, F, NOPAD_EPILOGUE_BIAS_ACT,
                              cfg->activation));
        }
        TRY(row_linear(c, s->tmp, s->act, L->down_w, L->down_format, L->down_b, F));
        if (nr == 0) continue;
        if (l + 1 < cfg->num_layers) {
            const decoder_layer *next = &w->layers[l + 1];
            TRY(be->add_norm(be, xn_own, h_own, tmp_own, next->norm1_w, next->norm1_b, eps, nr, H, rms));
        } else {
            TRY(be->residual_add(be, h_own, tmp_own, nr, H)); /* the final norm reads only the rows asked */
        }
    }
    if (c->n_rows == 0) return NOPAD_OK;
    if (c->seq) /* the stream whole again: the rows asked may be any rank's */
        TRY(comm_all_gather(tp->comm, be, s->h, h_own, (size_t)c->sq.chunk * H, COMM_F32));
    const float *src = s->h;
    if (c->gather) {
        TRY(be->gather_rows(be, s->last, s->h, c->d_rows, c->n_rows, H));
        src = s->last;
    }
    TRY(be->norm(be, s->xn, src, w->final_norm_w, w->final_norm_b, eps, c->n_rows, H, rms));
    if (c->head_rows > 0)
        TRY(tp->comm ? tp_head_part(be, cfg, w, s, s->xn, c->head_rows) : lm_head(be, cfg, w, s, s->xn, c->head_rows));
    return NOPAD_OK;
}

static nopad_status sample_on_host(nopad_backend *be, const model_config *cfg, decoder_state *s,
                                   const decoder_output *out, int32_t r0, int32_t n);

/* Rows [r0, r0 + n) of the step's output from the logits chunk in s->logits. With `queue` (the
 * step's only chunk) the device sampling is left running where the backend can: s->ids_pending.
 * Sampled ids also land in s->feed, where the next step's tokens may name them. */
static nopad_status step_output(nopad_backend *be, const model_config *cfg, decoder_state *s,
                                const decoder_output *out, int32_t r0, int32_t n, int queue) {
    const int32_t V = cfg->vocab_size;
    if (out->logits) return be->download(be, out->logits + (size_t)r0 * V, s->logits,
                                         (size_t)n * V * sizeof(float));
    const int32_t *cu_h = out->cu_history;
    if (queue && r0 == 0 && be->sample_begin && be->sample_wait) {
        nopad_status st = be->sample_begin(be, s->logits, n, V, out->params, out->draws, out->history, cu_h,
                                           out->masks, out->logprobs != NULL, out->n_top, s->feed);
        if (st == NOPAD_OK) s->ids_pending = n;
        return st;
    }
    nopad_status st = sample_on_host(be, cfg, s, out, r0, n);
    /* the next step may name these ids before its launch (tokens < 0): they go up like the
     * device sampling's */
    return st == NOPAD_OK ? be->upload_i32(be, s->feed + r0, out->ids + r0, (size_t)n) : st;
}

/* step_output's sampling that returns with the ids on the host: the backend's sampling op, else
 * the host sampler on downloaded logits. */
static nopad_status sample_on_host(nopad_backend *be, const model_config *cfg, decoder_state *s,
                                   const decoder_output *out, int32_t r0, int32_t n) {
    const int32_t V = cfg->vocab_size;
    const int32_t *cu_h = out->cu_history;
    const size_t k = (size_t)out->n_top;
    if (be->sample) {
        const uint32_t *const *masks = out->masks ? out->masks + r0 : NULL;
        int32_t *top_ids = k ? out->top_ids + r0 * k : NULL;
        float *top_lps = k ? out->top_logprobs + r0 * k : NULL;
        /* the chunk's histories start at cu_h[r0]: hand the op offsets from there */
        if (!cu_h || r0 == 0)
            return be->sample(be, s->logits, n, V, out->params + r0, out->draws + r0, out->history, cu_h, masks,
                              out->ids + r0, out->logprobs ? out->logprobs + r0 : NULL, out->n_top, top_ids,
                              top_lps);
        int32_t *cu = malloc(((size_t)n + 1) * sizeof *cu);
        if (!cu) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "decoder step: out of memory");
        for (int32_t r = 0; r <= n; r++) cu[r] = cu_h[r0 + r] - cu_h[r0];
        nopad_status st = be->sample(be, s->logits, n, V, out->params + r0, out->draws + r0,
                                     out->history + cu_h[r0], cu, masks, out->ids + r0,
                                     out->logprobs ? out->logprobs + r0 : NULL, out->n_top, top_ids, top_lps);
        free(cu);
        return st;
    }
    /* host sampling, on a backend without a sampling op */
    float *host = malloc((size_t)n * V * sizeof *host);
    if (!host) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "decoder step: out of memory");
    nopad_status st = be->download(be, host, s->logits, (size_t)n * V * sizeof(float));
    float *rows = host;
    for (int32_t r = 0; r < n && st == NOPAD_OK; r++) {
        const int32_t b = r0 + r;
        const uint32_t *mask = out->masks ? out->masks[b] : NULL;
        if (mask) /* a constrained row: the ids its constraint refuses cannot be chosen */
            for (int32_t t = 0; t < V; t++)
                if (!(mask[t >> 5] >> (t & 31) & 1u)) rows[(size_t)r * V + t] = -INFINITY;
        const int32_t *hist = cu_h ? out->history + cu_h[b] : NULL;
        const int32_t n_hist = cu_h ? cu_h[b + 1] - cu_h[b] : 0;
        st = sample_token(&s->scratch, rows + (size_t)r * V, V, &out->params[b], hist, n_hist,
                          out->draws[b], &out->ids[b], out->logprobs ? &out->logprobs[b] : NULL);
        if (st == NOPAD_OK && k)
            st = sampling_top_logprobs(&s->scratch, out->n_top, out->top_ids + b * k, out->top_logprobs + b * k);
        if (st != NOPAD_OK) st = nopad_wrap_error(st, "sequence %d of the step", b);
    }
    free(host);
    return st;
}

/* The batch size a decode step is recorded and replayed at: B rounded up to 1, 2, 4, 8, a multiple
 * of 8 to 64, of 16 to 128, of 32 to 256, then of 64; at most cap. An engine's batch shrinks and
 * grows one request at a time; without buckets every size would be recorded on its own (and 256
 * sizes would not fit the backend's graph cache). The padding rows cost little: a decode step's
 * time is the weights' read, which does not grow with a few more rows. */
static int32_t batch_bucket(int32_t B, int32_t cap) {
    int32_t b;
    if (B <= 8) {
        b = 1;
        while (b < B) b *= 2;
    } else {
        const int32_t step = B <= 64 ? 8 : B <= 128 ? 16 : B <= 256 ? 32 : 64;
        b = (B + step - 1) / step * step;
    }
    return b < cap ? b : cap;
}

/* The smallest power of two >= n, at most cap. */
static int32_t width_bucket(int32_t n, int32_t cap) {
    int32_t w = 1;
    while (w < n && w < cap) w *= 2;
    return w < cap ? w : cap;
}

nopad_status decoder_step(nopad_backend *be, const model_config *cfg, const decoder_weights *w,
                          decoder_state *s, const decoder_batch *batch, const decoder_output *out) {
    nopad_status st = decoder_forward_launch(be, cfg, w, s, batch, out->logits || out->ids);
    if (st == NOPAD_OK) st = decoder_output_launch(be, cfg, w, s, out);
    nopad_status waited = decoder_step_wait(be, s, out);
    return st != NOPAD_OK ? st : waited;
}

nopad_status decoder_step_wait(nopad_backend *be, decoder_state *s, const decoder_output *out) {
    const int32_t n = s->ids_pending;
    if (n == 0) return NOPAD_OK;
    s->ids_pending = 0;
    return be->sample_wait(be, out->ids, out->logprobs, n, out->n_top, out->top_ids, out->top_logprobs);
}

nopad_status decoder_forward_launch(nopad_backend *be, const model_config *cfg, const decoder_weights *w,
                                    decoder_state *s, const decoder_batch *batch, int want_rows) {
    s->out_rows = 0;
    s->out_pending = 0; /* a forward whose output was never launched is dropped */
    const int32_t B = batch->n_seqs, T = batch->cu_q[B];
    if (T <= 0 || T > s->max_tokens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "decoder step: %d new tokens, the workspace holds 1 to %d", T,
                               s->max_tokens);
    /* a token < 0 names a row of the step before, whose sampled id is still on its way */
    for (int32_t t = 0; t < T; t++)
        if (batch->tokens[t] < 0 && -1 - (int64_t)batch->tokens[t] >= s->feed_rows)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "decoder step: token %d stands for the id of row %lld of the step "
                                   "before, which sampled %d ids",
                                   t, (long long)(-1 - (int64_t)batch->tokens[t]), s->feed_rows);
    s->feed_rows = 0; /* this step's output replaces the feed */
    const int32_t max_blocks_cap =
        (int32_t)((s->i32_count - 6 * (size_t)s->max_tokens - 1) / (size_t)s->max_tokens);
    if (batch->max_blocks > max_blocks_cap)
        return nopad_set_error(NOPAD_ERR_INTERNAL, "decoder step: block table too wide");
    const int decode_only = T == B && !batch->all_logits;
    const int recorded = decode_only && be->graph_run;
    /* a decode step's table width is rounded up to a power of two and, when it is recorded, its
     * batch up to a bucket (batch_bucket), so that steps share a few recorded graphs as histories
     * grow and requests come and go; the launches size for the width. Padding rows are one token
     * each at position 0 of a sequence that holds only the pad block. */
    const int32_t width = decode_only ? width_bucket(batch->max_blocks, max_blocks_cap)
                                      : batch->max_blocks;
    const int32_t Bp = recorded ? batch_bucket(B, s->max_tokens) : B, Tp = recorded ? Bp : T;

    /* host index arrays, laid out as on the device:
     * tokens [T] | positions [T] | slots [T] | rows [B] | cu_q [B+1] | seqlen_k [B] | table [B, width]
     * (T and B padded: Tp, Bp) */
    int32_t *h = s->host_i32;
    int32_t *positions = h + Tp, *slots = h + 2 * Tp, *rows = h + 3 * Tp, *cu = rows + Bp,
            *seqlen = cu + Bp + 1, *table = seqlen + Bp;
    const size_t n_i32 = (size_t)(table - h) + (size_t)Bp * width;
    memcpy(h, batch->tokens, (size_t)T * sizeof *h);
    memcpy(cu, batch->cu_q, ((size_t)B + 1) * sizeof *cu);
    memcpy(seqlen, batch->seqlen_k, (size_t)B * sizeof *seqlen);
    for (int32_t b = B; b < Bp; b++) {
        h[b] = 0;
        positions[b] = 0;
        slots[b] = s->pad_block * s->block_size;
        rows[b] = b;
        cu[b + 1] = b + 1;
        seqlen[b] = 1;
        table[(size_t)b * width] = s->pad_block;
        for (int32_t j = 1; j < width; j++) table[(size_t)b * width + j] = 0;
    }
    int32_t max_q = 0, max_k = 0;
    int no_history = 1;
    for (int32_t b = 0; b < B; b++) {
        const int32_t n_new = batch->cu_q[b + 1] - batch->cu_q[b];
        const int32_t first = batch->seqlen_k[b] - n_new;
        const int32_t *blocks = batch->block_table + (size_t)b * batch->max_blocks;
        for (int32_t i = 0; i < n_new; i++) {
            const int32_t t = batch->cu_q[b] + i, p = first + i;
            positions[t] = p;
            slots[t] = blocks[p / s->block_size] * s->block_size + p % s->block_size;
        }
        memcpy(table + (size_t)b * width, blocks, (size_t)batch->max_blocks * sizeof *table);
        for (int32_t j = batch->max_blocks; j < width; j++) table[(size_t)b * width + j] = 0;
        rows[b] = batch->cu_q[b + 1] - 1;
        if (n_new > max_q) max_q = n_new;
        if (batch->seqlen_k[b] > max_k) max_k = batch->seqlen_k[b];
        if (first > 0) no_history = 0;
    }
    TRY(be->upload_i32(be, s->i32, h, n_i32));
    const int32_t *d = s->i32;
    const int32_t *d_cu = d + 3 * Tp + Bp;
    step_call call = {
        .be = be, .cfg = cfg, .w = w, .s = s,
        .kv = {.n_seqs = Bp, .n_tokens = Tp, .max_q = max_q,
               .max_k = decode_only ? width * s->block_size : max_k,
               .no_history = no_history, .cu_q = d_cu, .seqlen_k = d_cu + Bp + 1,
               .block_table = d_cu + 2 * Bp + 1, .max_blocks = width, .block_size = s->block_size},
        .d_tokens = d, .d_pos = d + Tp, .d_slots = d + 2 * Tp, .d_rows = d + 3 * Tp,
        .n_tokens = Tp,
        .n_rows = !want_rows ? 0 : batch->all_logits ? T : Bp,
        .gather = !batch->all_logits,
    };
    /* the first chunk of the LM head (with tensor parallelism the rank's part, tp_head_part; the
     * greedy triples and the logits are gathered with the output, as it needs them) */
    call.head_rows = call.n_rows < s->logit_rows ? call.n_rows : s->logit_rows;
    /* sequence parallelism for prompt steps of enough rows (tp.h); decode steps, few rows and
     * recorded in CUDA graphs, keep the all-reduces */
    call.seq = !decode_only && tp_seq_plan(&w->tp, T, &call.sq);
    if (recorded) {
        /* tagged -1 / -2: the encoder's keys end in 0 */
        const int64_t key[4] = {Bp, width, call.n_rows, -1 - no_history};
        TRY(be->graph_run(be, key, step_forward, &call));
        /* the replay's collectives are NCCL's: the watchdog times them from here */
        if (w->tp.comm) TRY(comm_watch(w->tp.comm, be));
    } else {
        TRY(step_forward(&call));
    }
    s->out_rows = !want_rows ? 0 : batch->all_logits ? T : B; /* the padding's left out */
    s->out_pending = 1;
    return NOPAD_OK;
}

/* Every row's choice is the arg-max of its logits (greedy, nothing changes the logits). A split
 * model's ranks decide it alike: masks and top ids, which only the leader would see, never reach
 * one (the engine refuses them there). */
static int all_greedy(const decoder_output *out, int32_t rows) {
    for (int32_t r = 0; r < rows; r++) {
        const nopad_sampling_params *p = &out->params[r];
        const int penalised = (p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
                               p->frequency_penalty != 0.0f) && out->cu_history;
        if (p->temperature != 0.0f || penalised || p->n_logit_bias > 0) return 0;
    }
    return 1;
}

/* Greedy rows of a split model, without gathering the logits: each rank finds the best id of its
 * vocabulary rows (row_argmax: max, id, exp-sum), the ranks all-gather these triples [tp, n, 3],
 * and each rank merges them the same way: the largest max wins, the lowest rank on ties (ranks
 * hold ids in order, so the lowest id wins, as in sample_token), and the log-probability is
 * -log Σ_r sum_r · exp(max_r - max). The ids go up to the feed like the host sampler's. */
static nopad_status tp_greedy(nopad_backend *be, const model_config *cfg, const decoder_weights *w,
                              decoder_state *s, const decoder_output *out, int32_t out_rows) {
    const tp_shard *tp = &w->tp;
    const int32_t H = cfg->hidden_size;
    const size_t es = nopad_dtype_size(be->dtype);
    for (int32_t r0 = 0; r0 < out_rows; r0 += s->logit_rows) {
        const int32_t n = out_rows - r0 < s->logit_rows ? out_rows - r0 : s->logit_rows;
        /* the first chunk's part came with the step (step_forward) */
        if (r0 > 0) TRY(tp_head_part(be, cfg, w, s, (const char *)s->xn + (size_t)r0 * H * es, n));
        TRY(tp_head_best(be, w, s, n));
        TRY(be->download(be, s->host_best, s->best_parts, (size_t)tp->size * n * 3 * sizeof(float)));
        for (int32_t r = 0; r < n; r++) {
            nopad_status st = sampling_merge_greedy(s->host_best, tp->size, n, r, &out->ids[r0 + r],
                                                    out->logprobs ? &out->logprobs[r0 + r] : NULL);
            if (st != NOPAD_OK) return nopad_wrap_error(st, "sequence %d of the step", r0 + r);
        }
    }
    /* the next step may name these ids before its launch (tokens < 0) */
    return be->upload_i32(be, s->feed, out->ids, (size_t)out_rows);
}

nopad_status decoder_output_launch(nopad_backend *be, const model_config *cfg, const decoder_weights *w,
                                   decoder_state *s, const decoder_output *out) {
    if (!s->out_pending)
        return nopad_set_error(NOPAD_ERR_INTERNAL, "decoder step: no forward launched for this output");
    if (s->ids_pending)
        return nopad_set_error(NOPAD_ERR_INTERNAL,
                               "decoder step: the ids of the step before are not taken yet (decoder_step_wait)");
    s->out_pending = 0;
    const int32_t out_rows = s->out_rows;
    if (out_rows > 0 && !out->logits && !out->ids)
        return nopad_set_error(NOPAD_ERR_INTERNAL, "decoder step: the forward kept %d rows that nobody takes",
                               out_rows);
    const size_t es = nopad_dtype_size(be->dtype);
    const int32_t H = cfg->hidden_size;
    if (w->tp.comm && out->ids)
        for (int32_t r = 0; r < out_rows; r++)
            if (out->params[r].n_logit_bias > 0) /* its pairs stay in the leader's memory */
                return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "decoder step: row %d has a logit_bias; a split "
                                       "model (tp_size > 1) samples without one", r);
    /* Greedy rows (no penalty, bias, mask or top list) of one chunk, where the backend merges on
     * the device: row_argmax's triples (with tensor parallelism the step's own, every rank's) and
     * the merge, which writes the feed; the host waits for the ids in decoder_step_wait, as after
     * sample_begin. The same ids and log-probabilities as the sampler, and faster than its general
     * kernel (H100, docs/decoder.md: a decode step of 64 rows 1.33 against 1.45 ms). */
    const int greedy = out->ids && !out->masks && out->n_top == 0 && all_greedy(out, out_rows);
    if (greedy && out_rows <= s->logit_rows && be->greedy_merge_begin && be->sample_wait && be->row_argmax) {
        if (w->tp.comm) TRY(tp_head_best(be, w, s, out_rows));
        else TRY(be->row_argmax(be, s->best_parts, s->logits, out_rows, cfg->vocab_size, cfg->vocab_size, 0));
        TRY(be->greedy_merge_begin(be, s->best_parts, w->tp.size, out_rows, out->logprobs != NULL, s->feed));
        s->ids_pending = out_rows;
        s->feed_rows = out_rows;
        return NOPAD_OK;
    }
    if (w->tp.comm && greedy) { /* on the host: the CPU backend, or rows past one chunk */
        TRY(tp_greedy(be, cfg, w, s, out, out_rows));
        s->feed_rows = out_rows;
        return NOPAD_OK;
    }
    for (int32_t r0 = 0; r0 < out_rows; r0 += s->logit_rows) {
        const int32_t n = out_rows - r0 < s->logit_rows ? out_rows - r0 : s->logit_rows;
        /* the first chunk came with the step: with tensor parallelism, only the rank's part */
        if (r0 > 0) TRY(lm_head(be, cfg, w, s, (const char *)s->xn + (size_t)r0 * H * es, n));
        else if (w->tp.comm) TRY(tp_head_logits(be, cfg, w, s, n));
        TRY(step_output(be, cfg, s, out, r0, n, out_rows <= s->logit_rows));
    }
    if (out->ids) s->feed_rows = out_rows;
    return NOPAD_OK;
}
