/* CUDA backend: the op table in fp16 or bf16 with fp32 accumulation. Each entry makes the backend's
 * device current and calls its op family: gemm/ (skinny GEMM, CUTLASS, cuBLASLt; gemm/gemm.h says
 * which when), attention/ (one dispatcher over the fused kernels), embed.cu, norm.cu, pool.cu,
 * pack.cu; memory and staging are in memory.c, the graph cache in graphs.c. Every op enqueues on
 * the backend's stream and returns: nothing synchronises inside a forward. */
#ifdef NOPAD_HAVE_CUDA

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/attention/attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/deberta/attention_rel.h"
#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/decoder_ops.h"
#include "backend/cuda/sampling_ops.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/quant/fp8.h"
#include "backend/cuda/quant/fp8_gemm.h"
#include "backend/cuda/quant/quant.h"
#include "backend/cuda/quant/quant_gemm.h"
#include "backend/cuda/state.h"
#include "backend/cuda/train/train_ops.h"
#include "util/error.h"

/* ---- the ops ---------------------------------------------------------------------------------- */

static nopad_status cu_pack_padded(nopad_backend *be, const int32_t *tokens, const int32_t *types,
                                   const int32_t *lengths, int32_t n_seqs, int32_t max_len,
                                   int32_t max_seqlen, int32_t n_tokens, int32_t *cu_out,
                                   int32_t *tokens_out, int32_t *types_out) {
    CUDA_ENTER(be, s);
    return cuda_pack_padded(tokens, types, lengths, n_seqs, max_len, max_seqlen, n_tokens, cu_out,
                            tokens_out, types_out, s->pack_bad, s->stream);
}

static nopad_status cu_unpack_padded(nopad_backend *be, void *out, const void *x, const int32_t *cu,
                                     int32_t n_seqs, int32_t max_len, int32_t dim) {
    CUDA_ENTER(be, s);
    /* rows of F16 or BF16: two bytes an element */
    return cuda_unpack_padded(out, x, cu, n_seqs, max_len, (size_t)dim * 2, s->stream);
}

static nopad_status cu_linear(nopad_backend *be, void *out, const void *x, const void *w,
                              const void *bias, const void *residual, int32_t n_tokens,
                              int32_t n_in, int32_t n_out, nopad_epilogue epilogue,
                              nopad_activation act) {
    CUDA_ENTER(be, s);
    return cuda_gemm_linear(&s->lt, be->dtype, out, x, w, bias, residual, n_tokens, n_in, n_out, epilogue, act,
                            s->stream);
}

static nopad_status cu_embed_layernorm(nopad_backend *be, void *out, const int32_t *tokens,
                                       const int32_t *types, const nopad_seqs *seqs,
                                       int32_t position_offset, int32_t vocab_size,
                                       int32_t n_positions, int32_t type_vocab_size,
                                       const void *word, const void *pos, const void *type,
                                       const void *ln_weight, const void *ln_bias, float eps,
                                       int32_t dim) {
    CUDA_ENTER(be, s);
    return cuda_embed_layernorm(be->dtype, out, tokens, types, seqs->cu_seqlens, seqs->n_seqs,
                                seqs->n_tokens, position_offset, vocab_size, n_positions,
                                type_vocab_size, word, pos,
                                type, ln_weight, ln_bias, eps, dim, s->stream);
}

static nopad_status cu_bias_residual_layernorm(nopad_backend *be, void *x, const void *bias,
                                               const void *residual, const void *ln_weight,
                                               const void *ln_bias, float eps, int32_t n_tokens,
                                               int32_t dim) {
    CUDA_ENTER(be, s);
    return cuda_bias_residual_layernorm(be->dtype, x, bias, residual, ln_weight, ln_bias, eps,
                                        n_tokens, dim, s->stream);
}

static nopad_status cu_attention_varlen(nopad_backend *be, void *out, const void *qkv,
                                        const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                                        float scale, int causal) {
    CUDA_ENTER(be, s);
    return cuda_attention(be->dtype, out, qkv, seqs->cu_seqlens, seqs->n_seqs, seqs->n_tokens, seqs->max_seqlen,
                          n_heads, head_size, scale, causal, s->attention_ws, s->stream);
}

/* ---- decoder ops (decoder.cu) ---- */
static nopad_status cu_embed_tokens(nopad_backend *be, float *out, const int32_t *tokens, const int32_t *feed,
                                    const int32_t *positions, int32_t n_tokens, int32_t vocab_size,
                                    int32_t vocab0, int32_t vocab_rows, int32_t n_positions, const void *word,
                                    const void *pos, int32_t dim) {
    CUDA_ENTER(be, s);
    return cuda_dec_embed_tokens(be->dtype, out, tokens, feed, positions, n_tokens, vocab_size, vocab0, vocab_rows,
                                 n_positions, word, pos, dim, s->stream);
}
static nopad_status cu_norm(nopad_backend *be, void *out, const float *x, const void *w, const void *b, float eps,
                            int32_t n_tokens, int32_t dim, int rms) {
    CUDA_ENTER(be, s);
    /* x is only read: the kernel writes the stream back only when it adds to it */
    return cuda_dec_norm(be->dtype, out, (float *)x, NULL, w, b, eps, n_tokens, dim, rms, s->stream);
}
static nopad_status cu_add_norm(nopad_backend *be, void *out, float *h, const void *x, const void *w, const void *b,
                                float eps, int32_t n_tokens, int32_t dim, int rms) {
    CUDA_ENTER(be, s);
    return cuda_dec_norm(be->dtype, out, h, x, w, b, eps, n_tokens, dim, rms, s->stream);
}
static nopad_status cu_residual_add(nopad_backend *be, float *h, const void *x, int32_t n_tokens, int32_t dim) {
    CUDA_ENTER(be, s);
    return cuda_dec_residual_add(be->dtype, h, x, n_tokens, dim, s->stream);
}
static nopad_status cu_rope_kv_store(nopad_backend *be, void *qkv, void *k_cache, void *v_cache,
                                     const int32_t *positions, const int32_t *slots, int32_t n_tokens,
                                     int32_t n_heads, int32_t n_kv_heads, int32_t head_size, const float *inv_freq) {
    CUDA_ENTER(be, s);
    return cuda_dec_rope_kv_store(be->dtype, qkv, k_cache, v_cache, positions, slots, n_tokens, n_heads, n_kv_heads,
                                  head_size, inv_freq, s->stream);
}
/* Grows *buf to `need` bytes. Graphs recorded earlier name the old buffer, so they are forgotten;
 * while a graph is being recorded nothing may be allocated: the caller's shape must have run
 * once outside (graph_run records a key the second time it comes). */
static nopad_status grow_workspace(nopad_backend *be, cuda_state *s, void **buf, size_t *bytes, size_t need,
                                   const char *what) {
    if (need <= *bytes) return NOPAD_OK;
    enum cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s->stream, &capturing) != cudaSuccess) cudaGetLastError();
    if (capturing != cudaStreamCaptureStatusNone)
        return nopad_set_error(NOPAD_ERR_INTERNAL, "cuda %s: the workspace must grow during a graph recording",
                               what);
    if (*buf) {
        cuda_graph_clear(be); /* synchronises the stream */
        cudaFree(*buf);
        *buf = NULL;
        *bytes = 0;
    }
    nopad_status st = cuda_check(cudaMalloc(buf, need), what);
    if (st == NOPAD_OK) *bytes = need;
    return st;
}

/* The paged attention's workspaces for kv, grown as needed. */
static nopad_status paged_workspace(nopad_backend *be, cuda_state *s, const nopad_kv_batch *kv, int32_t n_heads,
                                    int32_t n_kv_heads, int32_t head_size, cuda_dec_attention_ws *ws) {
    size_t split_bytes, expand_bytes;
    cuda_dec_attention_workspace(kv, be->dtype, n_heads, n_kv_heads, head_size, &split_bytes, &expand_bytes);
    nopad_status st = grow_workspace(be, s, (void **)&s->split_ws, &s->split_ws_bytes, split_bytes,
                                     "attention workspace");
    if (st == NOPAD_OK)
        st = grow_workspace(be, s, &s->expand_ws, &s->expand_ws_bytes, expand_bytes, "attention workspace");
    *ws = (cuda_dec_attention_ws){.split = s->split_ws, .expand = s->expand_ws, .attention = s->attention_ws};
    return st;
}

static nopad_status cu_attention_paged(nopad_backend *be, void *out, const void *qkv, const void *k_cache,
                                       const void *v_cache, const nopad_kv_batch *kv, int32_t n_heads,
                                       int32_t n_kv_heads, int32_t head_size, float scale) {
    CUDA_ENTER(be, s);
    cuda_dec_attention_ws ws;
    nopad_status st = paged_workspace(be, s, kv, n_heads, n_kv_heads, head_size, &ws);
    if (st != NOPAD_OK) return st;
    return cuda_dec_attention_paged(be->dtype, out, qkv, k_cache, v_cache, kv, n_heads, n_kv_heads, head_size,
                                    scale, &ws, s->stream);
}

static nopad_status cu_attention_paged_rope(nopad_backend *be, void *out, const void *qkv, void *k_cache,
                                            void *v_cache, const nopad_kv_batch *kv, int32_t n_heads,
                                            int32_t n_kv_heads, int32_t head_size, float scale,
                                            const float *inv_freq) {
    CUDA_ENTER(be, s);
    cuda_dec_attention_ws ws;
    nopad_status st = paged_workspace(be, s, kv, n_heads, n_kv_heads, head_size, &ws);
    if (st != NOPAD_OK) return st;
    return cuda_dec_attention_paged_rope(be->dtype, out, qkv, k_cache, v_cache, kv, n_heads, n_kv_heads,
                                         head_size, scale, inv_freq, &ws, s->stream);
}
/* ---- DeBERTa's relative attention (deberta/attention_rel.cu) ---- */
/* The table row of distance d: clamp(bucket(d) + k, 0, 2k - 1), the CPU's exact function. */
static int32_t rel_row(int32_t d, const nopad_rel_positions *rel) {
    const int32_t r = nopad_rel_bucket(d, rel) + rel->att_span;
    return r < 0 ? 0 : r > 2 * rel->att_span - 1 ? 2 * rel->att_span - 1 : r;
}

/* The device table of rows by distance for `rel`, built on the host (the bucket's float32 ceil must
 * land where the CPU's does) and uploaded when the setting changes: once per model, outside any
 * graph recording (a graph's first run is direct). The rows are monotone in the distance and
 * saturate at 0 and 2k - 1; the table stops where both ends have. */
static nopad_status rel_rows_table(nopad_backend *be, cuda_state *s, const nopad_rel_positions *rel) {
    if (s->rel_rows && s->rel_key[0] == rel->att_span && s->rel_key[1] == rel->position_buckets &&
        s->rel_key[2] == rel->max_relative_positions)
        return NOPAD_OK;
    enum { MAX_SAT = 1 << 20 };
    int32_t sat = 0;
    while (sat < MAX_SAT && (rel_row(sat, rel) != 2 * rel->att_span - 1 || rel_row(-sat, rel) != 0)) sat++;
    if (sat >= MAX_SAT)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda attention_rel: the buckets (k %d, buckets %d, max %d) do "
                               "not saturate within %d", rel->att_span, rel->position_buckets,
                               rel->max_relative_positions, MAX_SAT);
    int32_t *host = malloc((size_t)(2 * sat + 1) * sizeof *host);
    if (!host) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cuda attention_rel: bucket table");
    for (int32_t d = -sat; d <= sat; d++) host[d + sat] = rel_row(d, rel);
    size_t bytes = 0;
    void *buf = s->rel_rows;
    /* a new buffer each time (grow_workspace clears the graphs that name the old one) */
    nopad_status st = grow_workspace(be, s, &buf, &bytes, (size_t)(2 * sat + 1) * sizeof *host, "attention_rel table");
    s->rel_rows = buf; /* on failure: the old table (a recording refused the change) or NULL */
    if (st != NOPAD_OK) {
        free(host);
        return st;
    }
    /* on the backend's stream (a non-blocking one does not wait for the legacy stream's copies),
     * then waited for, so `host` can go; no recording is under way here (grow_workspace says so) */
    st = cuda_check(cudaMemcpyAsync(s->rel_rows, host, (size_t)(2 * sat + 1) * sizeof *host, cudaMemcpyHostToDevice,
                                    s->stream),
                    "attention_rel table");
    if (st == NOPAD_OK) st = cuda_check(cudaStreamSynchronize(s->stream), "attention_rel table");
    free(host);
    if (st != NOPAD_OK) {
        cudaFree(s->rel_rows);
        s->rel_rows = NULL;
        return st;
    }
    s->rel_key[0] = rel->att_span, s->rel_key[1] = rel->position_buckets, s->rel_key[2] = rel->max_relative_positions;
    s->rel_sat = sat;
    return NOPAD_OK;
}

static nopad_status cu_attention_rel(nopad_backend *be, void *out, const void *qkv, const nopad_seqs *seqs,
                                     int32_t n_heads, int32_t head_size, float scale, const void *pos_key,
                                     const void *pos_query, const nopad_rel_positions *rel) {
    CUDA_ENTER(be, s);
    if (seqs->n_tokens == 0) return NOPAD_OK;
    if (rel->att_span < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "attention_rel: att_span %d, need >= 1", rel->att_span);
    nopad_status st = rel_rows_table(be, s, rel);
    if (st != NOPAD_OK) return st;
    /* the table rows the longest sequence reaches; shorter ones reach a sub-range */
    const int32_t max_len = seqs->max_seqlen > 0 ? seqs->max_seqlen : 1;
    const int32_t r_lo = rel_row(-(max_len - 1), rel), W = rel_row(max_len - 1, rel) - r_lo + 1;
    /* c2p | p2c, each [T, heads, W] float32 or [T, heads, Wp] fp16 (the op says which) */
    const size_t each = cuda_attention_rel_term_bytes(seqs->n_tokens, n_heads, head_size, W);
    const int terms = (pos_key != NULL) + (pos_query != NULL);
    st = grow_workspace(be, s, (void **)&s->rel_ws, &s->rel_ws_bytes, (size_t)terms * each,
                        "attention_rel workspace");
    if (st != NOPAD_OK) return st;
    const cuda_attention_rel_args a = {
        .out = out, .qkv = qkv, .cu_seqlens = seqs->cu_seqlens, .n_seqs = seqs->n_seqs, .n_tokens = seqs->n_tokens,
        .max_seqlen = max_len, .n_heads = n_heads, .head_size = head_size, .scale = scale, .pos_key = pos_key,
        .pos_query = pos_query, .rows = s->rel_rows, .sat = s->rel_sat, .r_lo = r_lo, .W = W,
        .c2p = pos_key ? s->rel_ws : NULL, .p2c = pos_query ? (float *)((char *)s->rel_ws + (pos_key ? each : 0)) : NULL};
    return cuda_attention_rel(be->dtype, &a, s->stream);
}

static nopad_status cu_gemm_f32(nopad_backend *be, float *out, const void *x, const void *w, int32_t n_tokens,
                                int32_t n_in, int32_t n_out) {
    CUDA_ENTER(be, s);
    if (n_tokens == 0) return NOPAD_OK;
    if (n_tokens <= cuda_gemv_max_tokens() && cuda_gemv_supported(n_tokens, n_in, n_out)) {
        nopad_status st = cuda_gemv_f32(be->dtype, out, x, w, n_tokens, n_in, n_out, s->stream);
        if (st != NOPAD_ERR_UNSUPPORTED) return st;
    }
    return cuda_lt_matmul_f32(&s->lt, be->dtype, out, x, w, n_tokens, n_in, n_out, s->stream);
}
static nopad_status cu_gemm_swiglu(nopad_backend *be, void *out, void *gate_up, const void *x, const void *w,
                                   int32_t n_tokens, int32_t n_in, int32_t n_ffn) {
    CUDA_ENTER(be, s);
    if (n_tokens == 0) return NOPAD_OK;
    if (cuda_gemm_gemv_swiglu_wins(n_tokens, n_in, n_ffn)) {
        nopad_status st = cuda_gemv_swiglu(be->dtype, out, x, w, n_tokens, n_in, n_ffn, s->stream);
        if (st != NOPAD_ERR_UNSUPPORTED) return st;
    }
    nopad_status st = cuda_gemm_linear(&s->lt, be->dtype, gate_up, x, w, NULL, NULL, n_tokens, n_in, 2 * n_ffn,
                                       NOPAD_EPILOGUE_NONE, NOPAD_ACT_GELU, s->stream);
    if (st != NOPAD_OK) return st;
    return cuda_dec_swiglu(be->dtype, out, gate_up, n_tokens, n_ffn, s->stream);
}
/* The sampling's buffers grown to `need` bytes each: sample_dev (device) and sample_host (pinned
 * staging, so that the ids' download runs without the host: a pageable one would hold the caller
 * until the step before it had run). No graph names them (sampling runs after the recorded part of
 * a step), so growing them keeps the graphs; they grow by doubling, as the penalty's histories grow
 * every step. */
static nopad_status sample_staging(cuda_state *s, size_t need) {
    if (!s->sample_done) {
        nopad_status st = cuda_check(cudaEventCreateWithFlags(&s->sample_done, cudaEventDisableTiming),
                                     "sampling event");
        if (st != NOPAD_OK) return st;
    }
    if (need > s->sample_dev_bytes) {
        if (s->sample_dev) {
            cudaStreamSynchronize(s->stream);
            cudaFree(s->sample_dev);
            s->sample_dev = NULL;
            s->sample_dev_bytes = 0;
        }
        const size_t bytes = need < 4096 ? 8192 : 2 * need;
        nopad_status st = cuda_check(cudaMalloc(&s->sample_dev, bytes), "sampling buffer");
        if (st != NOPAD_OK) return st;
        s->sample_dev_bytes = bytes;
    }
    if (need > s->sample_host_bytes) {
        if (s->sample_host) cudaFreeHost(s->sample_host);
        s->sample_host = NULL;
        s->sample_host_bytes = 0;
        nopad_status st = cuda_check(cudaMallocHost(&s->sample_host, 2 * need), "sampling staging");
        if (st != NOPAD_OK) return st;
        s->sample_host_bytes = 2 * need;
    }
    return NOPAD_OK;
}

/* The sampling staging, device and host alike: what comes back first, then what goes up, so that
 * each direction is one copy:
 *   ids [n] | logprobs [n] | top ids [n, k] | top logprobs [n, k] |
 *   rows [n] | history [n_hist] | logit_bias pairs [n_bias] | masks [n_masked, (vocab + 31) / 32]
 * (the back part a multiple of 8 bytes: the rows' 64-bit fields stay aligned). */
static size_t sample_back_bytes(int32_t n, int32_t n_top) {
    return (size_t)n * (1 + (size_t)n_top) * (sizeof(int32_t) + sizeof(float));
}

/* Sampling in two halves: sample_begin queues the inputs' upload (rows, histories, logit_bias
 * pairs and masks in one copy), the kernel and the outputs' download into pinned staging (the
 * call returns at once); sample_wait waits for them, the step's one synchronisation. The next
 * step's forward may be queued in between (it reads the ids from ids_out); its sampling is not:
 * the staging is one. */
static nopad_status cu_sample_begin(nopad_backend *be, float *logits, int32_t n, int32_t vocab,
                                    const nopad_sampling_params *params, const uint64_t *draws,
                                    const int32_t *history, const int32_t *cu_history, const uint32_t *const *masks,
                                    int want_logprobs, int32_t n_top, int32_t *ids_out) {
    CUDA_ENTER(be, s);
    s->sample_pending = 0;
    if (n <= 0) return NOPAD_OK;
    const int32_t n_hist = cu_history ? cu_history[n] : 0;
    const size_t words = ((size_t)vocab + 31) / 32;
    size_t n_bias = 0, n_masked = 0;
    for (int32_t r = 0; r < n; r++) {
        n_bias += params[r].n_logit_bias > 0 ? (size_t)params[r].n_logit_bias : 0;
        n_masked += masks && masks[r];
    }
    const size_t back = sample_back_bytes(n, n_top);
    const size_t rows_bytes = (size_t)n * sizeof(cuda_sample_row);
    const size_t hist_off = back + rows_bytes, bias_off = hist_off + (size_t)n_hist * sizeof(int32_t);
    const size_t mask_off = bias_off + n_bias * sizeof(nopad_logit_bias);
    const size_t need = mask_off + n_masked * words * sizeof(uint32_t);
    nopad_status st = sample_staging(s, need);
    if (st != NOPAD_OK) return st;
    char *h = s->sample_host, *d = s->sample_dev;
    cuda_sample_row *rows = (cuda_sample_row *)(h + back);
    nopad_logit_bias *bias = (nopad_logit_bias *)(h + bias_off);
    uint32_t *mask = (uint32_t *)(h + mask_off);
    int32_t bias_at = 0, mask_index = 0;
    for (int32_t r = 0; r < n; r++) {
        const nopad_sampling_params *p = &params[r];
        const int32_t n_b = p->n_logit_bias > 0 ? p->n_logit_bias : 0;
        if (n_b) memcpy(bias + bias_at, p->logit_bias, (size_t)n_b * sizeof *bias);
        const int masked = masks && masks[r];
        if (masked) memcpy(mask + (size_t)mask_index * words, masks[r], words * sizeof *mask);
        mask_index += masked;
        rows[r] = (cuda_sample_row){.temperature = p->temperature, .top_p = p->top_p, .min_p = p->min_p,
                                    .repetition_penalty = p->repetition_penalty,
                                    .presence_penalty = p->presence_penalty,
                                    .frequency_penalty = p->frequency_penalty, .top_k = p->top_k,
                                    .history_start = cu_history ? cu_history[r] : 0,
                                    .history_len = cu_history ? cu_history[r + 1] - cu_history[r] : 0,
                                    .bias_start = bias_at, .bias_len = p->n_logit_bias,
                                    .mask_index = masked ? mask_index : 0, .seed = p->seed, .step = draws[r]};
        bias_at += n_b;
    }
    if (n_hist) memcpy(h + hist_off, history, (size_t)n_hist * sizeof(int32_t));
    st = cuda_check(cudaMemcpyAsync(d + back, h + back, need - back, cudaMemcpyHostToDevice, s->stream),
                    "sampling upload");
    int32_t *d_ids = ids_out ? ids_out : (int32_t *)d;
    float *d_logprobs = (float *)(d + (size_t)n * sizeof(int32_t));
    int32_t *d_top_ids = (int32_t *)(d + (size_t)n * (sizeof(int32_t) + sizeof(float)));
    float *d_top_lps = (float *)(d_top_ids + (size_t)n * n_top);
    if (st == NOPAD_OK)
        st = cuda_sample_rows(logits, n, vocab, (const cuda_sample_row *)(d + back), (const int32_t *)(d + hist_off),
                              (const nopad_logit_bias *)(d + bias_off), (const uint32_t *)(d + mask_off), d_ids,
                              want_logprobs ? d_logprobs : NULL, n_top, d_top_ids, d_top_lps, s->stream);
    /* the outputs sit side by side in the staging: one copy back unless the ids went to ids_out
     * (then the ids, and what follows them in a second copy) */
    const size_t id_bytes = (size_t)n * sizeof(int32_t);
    const size_t rest = (want_logprobs || n_top ? (size_t)n * sizeof(float) : 0) +
                        (size_t)n * n_top * (sizeof(int32_t) + sizeof(float));
    if (st == NOPAD_OK)
        st = cuda_check(cudaMemcpyAsync(h, d_ids, ids_out ? id_bytes : id_bytes + rest, cudaMemcpyDeviceToHost,
                                        s->stream),
                        "sampling download");
    if (st == NOPAD_OK && ids_out && rest)
        st = cuda_check(cudaMemcpyAsync(h + id_bytes, d + id_bytes, rest, cudaMemcpyDeviceToHost, s->stream),
                        "sampling download");
    if (st == NOPAD_OK) st = cuda_check(cudaEventRecord(s->sample_done, s->stream), "sampling event");
    if (st == NOPAD_OK) s->sample_pending = n;
    return st;
}

/* The greedy merge in sample_begin's halves: the kernel writes ids (into ids_out) and
 * log-probabilities where sample_wait reads them back, ids [n] | logprobs [n] as sample_begin lays
 * them out. */
static nopad_status cu_greedy_merge_begin(nopad_backend *be, const float *best, int32_t parts, int32_t n,
                                          int want_logprobs, int32_t *ids_out) {
    CUDA_ENTER(be, s);
    s->sample_pending = 0;
    if (n <= 0) return NOPAD_OK;
    const size_t id_bytes = (size_t)n * sizeof(int32_t);
    nopad_status st = sample_staging(s, sample_back_bytes(n, 0));
    if (st != NOPAD_OK) return st;
    char *h = s->sample_host, *d = s->sample_dev;
    float *d_logprobs = (float *)(d + id_bytes);
    st = cuda_greedy_merge(best, parts, n, ids_out, want_logprobs ? d_logprobs : NULL, s->stream);
    if (st == NOPAD_OK)
        st = cuda_check(cudaMemcpyAsync(h, ids_out, id_bytes, cudaMemcpyDeviceToHost, s->stream),
                        "greedy merge download");
    if (st == NOPAD_OK && want_logprobs)
        st = cuda_check(cudaMemcpyAsync(h + id_bytes, d_logprobs, (size_t)n * sizeof(float),
                                        cudaMemcpyDeviceToHost, s->stream),
                        "greedy merge download");
    if (st == NOPAD_OK) st = cuda_check(cudaEventRecord(s->sample_done, s->stream), "greedy merge event");
    if (st == NOPAD_OK) s->sample_pending = n;
    return st;
}

static nopad_status cu_sample_wait(nopad_backend *be, int32_t *ids, float *logprobs, int32_t n, int32_t n_top,
                                   int32_t *top_ids, float *top_logprobs) {
    CUDA_ENTER(be, s);
    if (n <= 0) return NOPAD_OK;
    if (s->sample_pending != n)
        return nopad_set_error(NOPAD_ERR_INTERNAL, "cuda sampling: waiting for %d ids, %d were asked for", n,
                               s->sample_pending);
    s->sample_pending = 0;
    /* the sampling's event, not the stream: the next step's forward, queued behind the sampling
     * (the engine's overlap), runs on while the host takes these ids and builds that step's
     * sampling inputs (constraint masks among them) */
    nopad_status st = cuda_check(cudaEventSynchronize(s->sample_done), "sampling");
    if (st != NOPAD_OK) return st;
    const char *h = (const char *)s->sample_host;
    const size_t id_bytes = (size_t)n * sizeof(int32_t), top_bytes = (size_t)n * n_top * sizeof(int32_t);
    memcpy(ids, h, id_bytes);
    if (logprobs) memcpy(logprobs, h + id_bytes, (size_t)n * sizeof(float));
    if (n_top > 0) {
        memcpy(top_ids, h + 2 * id_bytes, top_bytes);
        memcpy(top_logprobs, h + 2 * id_bytes + top_bytes, (size_t)n * n_top * sizeof(float));
    }
    for (int32_t r = 0; r < n; r++)
        if (ids[r] < 0)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "sampling: the logits of row %d hold NaN or +inf, or are all -inf (after its "
                                   "mask); no id can be chosen",
                                   r);
    return NOPAD_OK;
}

static nopad_status cu_sample(nopad_backend *be, float *logits, int32_t n, int32_t vocab,
                              const nopad_sampling_params *params, const uint64_t *draws, const int32_t *history,
                              const int32_t *cu_history, const uint32_t *const *masks, int32_t *ids, float *logprobs,
                              int32_t n_top, int32_t *top_ids, float *top_logprobs) {
    nopad_status st = cu_sample_begin(be, logits, n, vocab, params, draws, history, cu_history, masks,
                                      logprobs != NULL, n_top, NULL);
    return st == NOPAD_OK ? cu_sample_wait(be, ids, logprobs, n, n_top, top_ids, top_logprobs) : st;
}
static nopad_status cu_swiglu(nopad_backend *be, void *out, const void *gate_up, int32_t n_tokens, int32_t dim) {
    CUDA_ENTER(be, s);
    return cuda_dec_swiglu(be->dtype, out, gate_up, n_tokens, dim, s->stream);
}
static nopad_status cu_gather_rows(nopad_backend *be, float *out, const float *x, const int32_t *rows, int32_t n,
                                   int32_t dim) {
    CUDA_ENTER(be, s);
    return cuda_dec_gather_rows(out, x, rows, n, dim, s->stream);
}
static nopad_status cu_row_argmax(nopad_backend *be, float *best, const float *x, int32_t rows, int32_t cols,
                                  int32_t ld, int32_t id0) {
    CUDA_ENTER(be, s);
    return cuda_row_argmax(best, x, rows, cols, ld, id0, s->stream);
}

/* ---- weights in a block format (quant/quant.h) ---- */
/* A decode step's few tokens on the quantized GEMV (the weights read once, dequantised in
 * registers); more tokens dequantise the weight into split_ws (results that end within one op)
 * and run the ordinary GEMM with its epilogue (quant/quant_gemm.h: at most about 64 MiB of
 * scratch, larger weights in slices of rows). */
static nopad_status cu_gemm_q(nopad_backend *be, void *out, const void *x, const void *w, nopad_weight_format format,
                              const void *bias, const void *residual, int32_t n_tokens, int32_t n_in, int32_t n_out,
                              nopad_epilogue epilogue, nopad_activation act, int out_f32) {
    CUDA_ENTER(be, s);
    if (n_tokens == 0) return NOPAD_OK;
    if (format == NOPAD_WEIGHT_FP8_E4M3) { /* quant/fp8.h: the GEMV, or cuBLASLt's FP8 GEMM */
        if (n_tokens <= CUDA_FP8_GEMV_MAX_T && !(out_f32 && epilogue != NOPAD_EPILOGUE_NONE))
            return cuda_fp8_gemv(be->dtype, out, x, w, epilogue == NOPAD_EPILOGUE_NONE ? NULL : bias,
                                 epilogue == NOPAD_EPILOGUE_BIAS_RESIDUAL ? residual : NULL, n_tokens, n_in, n_out,
                                 epilogue == NOPAD_EPILOGUE_BIAS_ACT ? (int)act : -1, out_f32, s->stream);
        nopad_status fst = grow_workspace(be, s, (void **)&s->split_ws, &s->split_ws_bytes,
                                          cuda_fp8_gemm_scratch_bytes(n_tokens, n_in, n_out), "fp8 gemm scratch");
        return fst != NOPAD_OK ? fst
                               : cuda_fp8_gemm(&s->lt, be->dtype, out, x, w, bias, residual, n_tokens, n_in, n_out,
                                               epilogue, act, out_f32, s->split_ws, s->stream);
    }
    if (!cuda_quant_runs(format, n_in))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "cuda gemm_q: weight format %d with rows of %d values is not one the CUDA backend "
                               "runs (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 in blocks of 32; Q4_K, Q5_K, Q6_K of 256)",
                               (int)format, n_in);
    if (out_f32 && epilogue != NOPAD_EPILOGUE_NONE)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cuda gemm_q: a float32 output takes no epilogue (got %d)",
                               (int)epilogue);
    if (n_tokens <= CUDA_QGEMV_MAX_T)
        return cuda_qgemv(be->dtype, out, x, w, format, epilogue == NOPAD_EPILOGUE_NONE ? NULL : bias,
                          epilogue == NOPAD_EPILOGUE_BIAS_RESIDUAL ? residual : NULL, n_tokens, n_in, n_out,
                          epilogue == NOPAD_EPILOGUE_BIAS_ACT ? (int)act : -1, out_f32, s->stream);
    nopad_status st = grow_workspace(be, s, (void **)&s->split_ws, &s->split_ws_bytes,
                                     cuda_quant_gemm_scratch_bytes(n_tokens, n_in, n_out, out_f32), "gemm_q scratch");
    if (st != NOPAD_OK) return st;
    return cuda_quant_gemm(&s->lt, be->dtype, out, x, w, format, bias, residual, n_tokens, n_in, n_out, epilogue, act,
                           out_f32, s->split_ws, s->stream);
}
static nopad_status cu_embed_tokens_q(nopad_backend *be, float *out, const int32_t *tokens, const int32_t *feed,
                                      const int32_t *positions, int32_t n_tokens, int32_t vocab_size, int32_t vocab0,
                                      int32_t vocab_rows, int32_t n_positions, const void *word,
                                      nopad_weight_format format, const void *pos, int32_t dim) {
    CUDA_ENTER(be, s);
    return cuda_quant_embed_tokens(be->dtype, out, tokens, feed, positions, n_tokens, vocab_size, vocab0, vocab_rows,
                                   n_positions, word, format, pos, dim, s->stream);
}

/* Every op and shape, except attention heads over 128 (the generic kernel's limit) and weights in
 * a block format other than quant/'s eight or with rows that are not whole blocks. */
static int cu_supports(nopad_backend *be, nopad_op op, const nopad_op_shape *shape) {
    (void)be;
    if (op == NOPAD_OP_ATTENTION && shape) return shape->head_size >= 1 && shape->head_size <= 128;
    if (op == NOPAD_OP_GEMM && shape && shape->weight_format == NOPAD_WEIGHT_FP8_E4M3)
        return cuda_fp8_runs(shape->n_in);
    if (op == NOPAD_OP_GEMM && shape && shape->weight_format != NOPAD_WEIGHT_DTYPE)
        return cuda_quant_runs(shape->weight_format, shape->n_in);
    return 1;
}

static nopad_status cu_pool(nopad_backend *be, void *out, const void *x, const nopad_seqs *seqs,
                            int32_t dim, nopad_pooling mode) {
    CUDA_ENTER(be, s);
    return cuda_pool(be->dtype, out, x, seqs->cu_seqlens, seqs->n_seqs, dim, mode, s->stream);
}

static nopad_status cu_l2_normalize(nopad_backend *be, void *x, int32_t rows, int32_t dim) {
    CUDA_ENTER(be, s);
    return cuda_l2_normalize(be->dtype, x, rows, dim, s->stream);
}

static void cu_destroy(nopad_backend *be) {
    cuda_state *s = state_of(be);
    if (s) {
        cuda_use_device(s);
        if (s->stream) cudaStreamSynchronize(s->stream);
        cuda_graph_destroy_all(s);
        cuda_train_gemm_optim_release(s);
        cuda_lt_destroy(&s->lt);
        if (s->scratch) cudaFree(s->scratch);
        if (s->pack_bad) cudaFree(s->pack_bad);
        if (s->attention_ws) cudaFree(s->attention_ws);
        if (s->split_ws) cudaFree(s->split_ws);
        if (s->expand_ws) cudaFree(s->expand_ws);
        if (s->sample_dev) cudaFree(s->sample_dev);
        if (s->attn_bwd_ws) cudaFree(s->attn_bwd_ws);
        if (s->rel_ws) cudaFree(s->rel_ws);
        if (s->rel_rows) cudaFree(s->rel_rows);
        if (s->sample_host) cudaFreeHost(s->sample_host);
        if (s->sample_done) cudaEventDestroy(s->sample_done);
        if (s->own_stream && s->stream) cudaStreamDestroy(s->stream);
        free(s);
    }
    free(be);
}

void *cuda_backend_stream(nopad_backend *be) { return state_of(be)->stream; }

nopad_status nopad_backend_cuda_create(nopad_dtype dtype, int device, void *stream, nopad_backend **out) {
    *out = NULL;
    if (dtype != NOPAD_DTYPE_F16 && dtype != NOPAD_DTYPE_BF16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "cuda: compute dtype must be F16 or BF16 (F32 runs on the CPU backend)");
    int n_devices = 0;
    cudaError_t err = cudaGetDeviceCount(&n_devices);
    if (err != cudaSuccess || n_devices == 0) {
        cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_BACKEND, "cuda: no usable GPU (%s)",
                               err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    }
    if (device < 0 || device >= n_devices)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cuda: device %d does not exist (this machine has %d: 0..%d)",
                               device, n_devices, n_devices - 1);
    /* the backend's stream, handle and buffers belong to this device; every op of the backend
     * makes it current (cuda_use_device) */
    err = cudaSetDevice(device);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_BACKEND, "cuda: cannot use device %d: %s", device, cudaGetErrorString(err));
    }
    nopad_backend *be = calloc(1, sizeof *be);
    cuda_state *s = calloc(1, sizeof *s);
    if (!be || !s) {
        free(be);
        free(s);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cuda: cannot allocate the backend");
    }
    be->impl = s;
    be->destroy = cu_destroy;
    s->device = device;
    nopad_status st = NOPAD_OK;
    if (stream) {
        s->stream = (cudaStream_t)stream;
    } else {
        st = cuda_check(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "stream");
        s->own_stream = st == NOPAD_OK;
    }
    if (st == NOPAD_OK) st = cuda_lt_init(&s->lt);
    if (st == NOPAD_OK) st = cuda_check(cudaMalloc((void **)&s->pack_bad, sizeof(int32_t)), "flag");
    if (st == NOPAD_OK) st = cuda_check(cudaMalloc(&s->attention_ws, NOPAD_ATTENTION_WORKSPACE_BYTES), "workspace");
    /* zeroed on the backend's stream, which may not synchronise with the legacy default one */
    if (st == NOPAD_OK)
        st = cuda_check(cudaMemsetAsync(s->attention_ws, 0, NOPAD_ATTENTION_WORKSPACE_BYTES, s->stream), "workspace");
    if (st == NOPAD_OK) st = cuda_check(cudaStreamSynchronize(s->stream), "workspace");
    if (st != NOPAD_OK) {
        cu_destroy(be);
        return st;
    }
    be->name = "cuda";
    be->device = device;
    be->native_stream = s->stream;
    be->dtype = dtype;
    be->extra_bytes = FIXED_EXTRA_BYTES;
    be->alloc = cuda_mem_alloc;
    be->free = cuda_mem_free;
    be->upload_f32 = cuda_mem_upload_f32;
    be->download_f32 = cuda_mem_download_f32;
    be->upload_i32 = cuda_mem_upload_i32;
    be->upload = cuda_mem_upload;
    be->download = cuda_mem_download;
    be->synchronize = cuda_mem_synchronize;
    be->release_staging = cuda_mem_release_staging;
    be->copy = cuda_mem_copy;
    be->copy_2d = cuda_mem_copy_2d;
    be->graph_run = cuda_graph_run;
    be->graph_clear = cuda_graph_clear;
    be->supports = cu_supports;
    be->pack = cu_pack_padded;
    be->unpack = cu_unpack_padded;
    be->embed = cu_embed_layernorm;
    be->gemm = cu_linear;
    be->layernorm = cu_bias_residual_layernorm;
    be->attention = cu_attention_varlen;
    be->attention_rel = cu_attention_rel;
    be->pool = cu_pool;
    be->l2_normalize = cu_l2_normalize;
    be->embed_tokens = cu_embed_tokens;
    be->norm = cu_norm;
    be->residual_add = cu_residual_add;
    be->add_norm = cu_add_norm;
    be->rope_kv_store = cu_rope_kv_store;
    be->attention_paged = cu_attention_paged;
    be->attention_paged_rope = cu_attention_paged_rope;
    be->swiglu = cu_swiglu;
    be->gather_rows = cu_gather_rows;
    be->gemm_f32 = cu_gemm_f32;
    be->row_argmax = cu_row_argmax;
    be->gemm_swiglu = cu_gemm_swiglu;
    be->sample = cu_sample;
    be->sample_begin = cu_sample_begin;
    be->sample_wait = cu_sample_wait;
    be->greedy_merge_begin = cu_greedy_merge_begin;
    be->gemm_q = cu_gemm_q;
    be->embed_tokens_q = cu_embed_tokens_q;
    /* training (train/): each op family fills its entries */
    cuda_train_install_ops(be);
    cuda_train_install_gemm_optim(be);
    cuda_train_install_attention(be);
    *out = be;
    return NOPAD_OK;
}

#endif /* NOPAD_HAVE_CUDA */
