/* The encoder forward: embeddings, then one loop over layers. Post-LayerNorm (BERT):
 *   x1 = LN(x + attn(x)·Woᵀ + bo),   x = LN(x1 + act(x1·W1ᵀ + b1)·W2ᵀ + b2)
 * Every tensor is packed [T, ...]; only the attention op looks at sequence boundaries.
 * Under tensor parallelism a rank runs its heads and intermediate columns (Hl, Il: encoder.h);
 * the two products over them, attn·Woᵀ and ffn·W2ᵀ, are partial sums that one all-reduce each
 * makes whole before the LayerNorm. A sequence-parallel forward (model/tp.h) reduce-scatters them
 * instead, each rank LayerNorms its block of rows, and the next column-split GEMM (FFN-in, the next
 * layer's QKV) gathers the blocks first. */
#include <math.h>
#include <string.h>

#include "model/encoder.h"
#include "parallel/comm.h"
#include "util/error.h"

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        nopad_status st_ = (expr);                                                                 \
        if (st_ != NOPAD_OK) return st_;                                                           \
    } while (0)

void encoder_workspace_free(nopad_backend *be, encoder_workspace *ws) {
    void *bufs[] = {ws->hidden, ws->embed,  ws->qkv,    ws->context, ws->attn,
                    ws->ffn,    ws->pooled, ws->tokens, ws->types,   ws->cu_seqlens,
                    ws->head,   ws->logits, ws->seq};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->free(be, bufs[i]);
    const uint32_t generation = ws->generation + 1; /* the buffers are gone: graphs naming them too */
    memset(ws, 0, sizeof *ws);
    ws->generation = generation;
}

nopad_status encoder_workspace_reserve(nopad_backend *be, const model_config *cfg, const tp_shard *tp,
                                       encoder_workspace *ws, int32_t n_tokens, int32_t n_seqs) {
    if (n_tokens <= ws->capacity_tokens && n_seqs <= ws->capacity_seqs) return NOPAD_OK;
    /* Grow geometrically so a stream of slightly larger batches does not reallocate each time. */
    int32_t tokens = n_tokens > ws->capacity_tokens ? n_tokens : ws->capacity_tokens;
    int32_t seqs = n_seqs > ws->capacity_seqs ? n_seqs : ws->capacity_seqs;
    if (ws->capacity_tokens && tokens > ws->capacity_tokens && tokens < 2 * ws->capacity_tokens)
        tokens = 2 * ws->capacity_tokens;
    encoder_workspace_free(be, ws);
    const size_t T = (size_t)tokens, B = (size_t)seqs, es = nopad_dtype_size(be->dtype);
    const size_t H = (size_t)cfg->hidden_size, I = (size_t)cfg->intermediate_size;
    const size_t E = (size_t)cfg->embedding_size;
    const int sharded = tp && tp->size > 1;
    const size_t Hl = sharded ? (size_t)tp->heads * (size_t)cfg->head_size : H;
    const size_t Il = sharded ? (size_t)tp->ffn : I;
    nopad_status st = NOPAD_OK;
#define ALLOC(field, n_bytes)                                                                      \
    if (st == NOPAD_OK) {                                                                          \
        st = be->alloc(be, (n_bytes), (void **)&ws->field);                                        \
        ws->bytes += (n_bytes);                                                                    \
    }
    ALLOC(hidden, T * H * es);
    if (E != H) ALLOC(embed, T * E * es);
    ALLOC(qkv, T * 3 * Hl * es);
    ALLOC(context, T * Hl * es);
    /* a sequence-parallel forward's padded chunks (tp.h): size · ceil(T / size) <= T + size - 1 rows */
    const size_t Tseq = tp && tp->seq_min_tokens > 0 ? T + (size_t)tp->size - 1 : 0;
    ALLOC(attn, (Tseq ? Tseq : T) * H * es);
    if (Tseq) ALLOC(seq, Tseq * H * es);
    ALLOC(ffn, T * Il * es);
    ALLOC(pooled, B * H * es);
    if (cfg->head.present) {
        ALLOC(head, B * H * es);
        ALLOC(logits, B * (size_t)cfg->head.num_labels * es);
    }
    ALLOC(tokens, T * sizeof(int32_t));
    ALLOC(types, T * sizeof(int32_t));
    ALLOC(cu_seqlens, (B + 1) * sizeof(int32_t));
#undef ALLOC
    if (st != NOPAD_OK) {
        encoder_workspace_free(be, ws);
        return nopad_wrap_error(st, "workspace for %d tokens", tokens);
    }
    ws->capacity_tokens = tokens;
    ws->capacity_seqs = seqs;
    return NOPAD_OK;
}

nopad_status encoder_embed(nopad_backend *be, const model_config *cfg, const encoder_weights *w,
                           encoder_workspace *ws, const nopad_seqs *seqs, const int32_t *tokens,
                           const int32_t *types, void *hidden) {
    // x[T, H] = LN(word[tokens] + pos + type) (ALBERT: at E into ws->embed; projected by the layers)
    const int32_t dim = w->embed_proj_weight ? cfg->embedding_size : cfg->hidden_size;
    return be->embed(be, w->embed_proj_weight ? ws->embed : hidden, tokens, types, seqs,
                               cfg->position_offset, cfg->vocab_size, cfg->max_position_embeddings,
                               cfg->type_vocab_size, w->word_embeddings, w->position_embeddings,
                               w->type_embeddings, w->embed_ln_weight, w->embed_ln_bias,
                               cfg->layer_norm_eps, dim);
}

nopad_status encoder_layers(nopad_backend *be, const model_config *cfg, const encoder_weights *w,
                            encoder_workspace *ws, const nopad_seqs *seqs, int32_t n_rows,
                            void *hidden) {
    const int32_t T = n_rows, H = cfg->hidden_size, E = cfg->embedding_size;
    // this rank's heads and intermediate columns (all of them at tp 1)
    const int32_t heads = w->tp.heads, Hl = heads * cfg->head_size, Il = w->tp.ffn;
    const comm_type elem = comm_type_of(be->dtype);
    const float eps = cfg->layer_norm_eps;
    // sequence parallelism: this rank LayerNorms rows [row0, row0 + rows) only (all T without it)
    tp_seq sq;
    const int seq = tp_seq_plan(&w->tp, T, &sq);
    const size_t own = seq ? (size_t)sq.row0 * H * nopad_dtype_size(be->dtype) : 0;
    const int32_t nr = seq ? sq.rows : T;
    // DeBERTa scales by 1/sqrt(d · (1 + its number of relative terms)), every other family 1/sqrt(d)
    const int32_t scale_factor = cfg->attention_scale_factor > 0 ? cfg->attention_scale_factor : 1;
    const float scale = 1.0f / sqrtf((float)cfg->head_size * (float)scale_factor);
    const nopad_rel_positions rel = {.att_span = cfg->rel.att_span,
                                     .position_buckets = cfg->rel.position_buckets,
                                     .max_relative_positions = cfg->rel.max_relative_positions};

    // ALBERT: x[T, H] = embed[T, E] · Wprojᵀ + b
    if (w->embed_proj_weight)
        TRY(be->gemm(be, hidden, ws->embed, w->embed_proj_weight, w->embed_proj_bias, NULL, T,
                       E, H, NOPAD_EPILOGUE_BIAS, cfg->activation));

    // x[T, H], the residual stream: `hidden`, whole on every rank; a sequence-parallel forward keeps
    // it in ws->seq after the first layer (each rank's rows), and gathers it into hidden at the end
    void *x = hidden;
    for (int step = 0; step < w->n_steps; step++) {
        const encoder_layer *L = w->schedule[step];
        // qkv[T, 3Hl] = x · Wqkvᵀ + bqkv
        if (x != hidden)
            TRY(tp_ag_linear(be, &w->tp, &sq, ws->qkv, x, L->qkv_weight, NOPAD_WEIGHT_DTYPE, L->qkv_bias, T, H,
                             3 * Hl, NOPAD_EPILOGUE_BIAS, cfg->activation));
        else
            TRY(be->gemm(be, ws->qkv, x, L->qkv_weight, L->qkv_bias, NULL, T, H, 3 * Hl,
                           NOPAD_EPILOGUE_BIAS, cfg->activation));
        // context[T, Hl] = softmax(q·kᵀ·scale)·v per sequence and head; DeBERTa adds its
        // relative terms q·pos_keyᵀ and k·pos_queryᵀ to the scores
        if (L->rel_pos_key || L->rel_pos_query)
            TRY(be->attention_rel(be, ws->context, ws->qkv, seqs, heads, cfg->head_size,
                                  scale, L->rel_pos_key, L->rel_pos_query, &rel));
        else
            TRY(be->attention(be, ws->context, ws->qkv, seqs, heads, cfg->head_size,
                              scale, 0));
        // x1[T, H] = LN(x + context · Woᵀ + bo), the product summed over the ranks' heads
        char *x1 = ws->attn;
        if (seq) {
            TRY(tp_linear_rs(be, &w->tp, &sq, x1, ws->context, L->attn_out_weight, NOPAD_WEIGHT_DTYPE, NULL, T,
                             Hl, H, NOPAD_EPILOGUE_NONE, cfg->activation));
        } else {
            TRY(be->gemm(be, x1, ws->context, L->attn_out_weight, NULL, NULL, T, Hl, H,
                           NOPAD_EPILOGUE_NONE, cfg->activation));
            if (w->tp.comm) TRY(comm_all_reduce(w->tp.comm, be, x1, (size_t)T * H, elem, COMM_SUM));
        }
        if (nr > 0)
            TRY(be->layernorm(be, x1 + own, L->attn_out_bias, (char *)x + own, L->attn_ln_weight,
                              L->attn_ln_bias, eps, nr, H));
        // ffn[T, Il] = act(x1 · W1ᵀ + b1)
        if (seq)
            TRY(tp_ag_linear(be, &w->tp, &sq, ws->ffn, x1, L->ffn_in_weight, NOPAD_WEIGHT_DTYPE, L->ffn_in_bias, T,
                             H, Il, NOPAD_EPILOGUE_BIAS_ACT, cfg->activation));
        else
            TRY(be->gemm(be, ws->ffn, x1, L->ffn_in_weight, L->ffn_in_bias, NULL, T, H, Il,
                           NOPAD_EPILOGUE_BIAS_ACT, cfg->activation));
        // x[T, H] = LN(x1 + ffn · W2ᵀ + b2), the product summed over the ranks' columns
        if (seq) {
            x = ws->seq; /* the old x is spent: x1 carries the stream */
            TRY(tp_linear_rs(be, &w->tp, &sq, x, ws->ffn, L->ffn_out_weight, NOPAD_WEIGHT_DTYPE, NULL, T, Il, H,
                             NOPAD_EPILOGUE_NONE, cfg->activation));
        } else {
            TRY(be->gemm(be, x, ws->ffn, L->ffn_out_weight, NULL, NULL, T, Il, H,
                           NOPAD_EPILOGUE_NONE, cfg->activation));
            if (w->tp.comm) TRY(comm_all_reduce(w->tp.comm, be, x, (size_t)T * H, elem, COMM_SUM));
        }
        if (nr > 0)
            TRY(be->layernorm(be, (char *)x + own, L->ffn_out_bias, x1 + own, L->ffn_ln_weight,
                              L->ffn_ln_bias, eps, nr, H));
    }
    if (x != hidden) { // the ranks' rows of the last hidden states, gathered whole
        TRY(comm_all_gather(w->tp.comm, be, x, (char *)x + own, (size_t)sq.chunk * H, elem));
        TRY(be->copy(be, hidden, x, (size_t)T * H * nopad_dtype_size(be->dtype)));
    }
    return NOPAD_OK;
}

nopad_status encoder_forward(nopad_backend *be, const model_config *cfg, const encoder_weights *w,
                             encoder_workspace *ws, const nopad_seqs *seqs, const int32_t *tokens,
                             const int32_t *types, void *hidden) {
    TRY(encoder_embed(be, cfg, w, ws, seqs, tokens, types, hidden));
    return encoder_layers(be, cfg, w, ws, seqs, seqs->n_tokens, hidden);
}

nopad_status encoder_classify(nopad_backend *be, const model_config *cfg, const encoder_weights *w,
                              encoder_workspace *ws, const nopad_seqs *seqs, const void *hidden) {
    const int32_t B = seqs->n_seqs, H = cfg->hidden_size, L = cfg->head.num_labels;
    // pooled[B, H] = the first token of each sequence ([CLS], <s>)
    TRY(be->pool(be, ws->pooled, hidden, seqs, H, NOPAD_POOLING_CLS));
    // head[B, H] = act(pooled · W1ᵀ + b1)
    TRY(be->gemm(be, ws->head, ws->pooled, w->head_dense_weight, w->head_dense_bias, NULL, B, H, H,
                 NOPAD_EPILOGUE_BIAS_ACT, cfg->head.act));
    // logits[B, L] = head · W2ᵀ + b2
    return be->gemm(be, ws->logits, ws->head, w->head_out_weight, w->head_out_bias, NULL, B, H, L,
                    NOPAD_EPILOGUE_BIAS, cfg->head.act);
}

int32_t encoder_token_bucket(int32_t n_tokens) {
    int32_t pow2 = 1;
    while (pow2 <= n_tokens / 2) pow2 *= 2;
    const int32_t step = pow2 / 16 > 16 ? pow2 / 16 : 16;
    return (int32_t)(((int64_t)n_tokens + step - 1) / step * step);
}
