/* The encoder forward: embeddings, then one loop over layers. Post-LayerNorm (BERT):
 *   x1 = LN(x + attn(x)·Woᵀ + bo),   x = LN(x1 + act(x1·W1ᵀ + b1)·W2ᵀ + b2)
 * Every tensor is packed [T, ...]; only the attention op looks at sequence boundaries. */
#include <math.h>
#include <string.h>

#include "model/encoder.h"
#include "util/error.h"

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        nopad_status st_ = (expr);                                                                 \
        if (st_ != NOPAD_OK) return st_;                                                           \
    } while (0)

void encoder_workspace_free(nopad_backend *be, encoder_workspace *ws) {
    void *bufs[] = {ws->hidden, ws->embed,  ws->qkv,    ws->context, ws->attn,
                    ws->ffn,    ws->pooled, ws->tokens, ws->types,   ws->cu_seqlens};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->free(be, bufs[i]);
    const uint32_t generation = ws->generation + 1; /* the buffers are gone: graphs naming them too */
    memset(ws, 0, sizeof *ws);
    ws->generation = generation;
}

nopad_status encoder_workspace_reserve(nopad_backend *be, const encoder_config *cfg,
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
    nopad_status st = NOPAD_OK;
#define ALLOC(field, n_bytes)                                                                      \
    if (st == NOPAD_OK) {                                                                          \
        st = be->alloc(be, (n_bytes), (void **)&ws->field);                                        \
        ws->bytes += (n_bytes);                                                                    \
    }
    ALLOC(hidden, T * H * es);
    if (E != H) ALLOC(embed, T * E * es);
    ALLOC(qkv, T * 3 * H * es);
    ALLOC(context, T * H * es);
    ALLOC(attn, T * H * es);
    ALLOC(ffn, T * I * es);
    ALLOC(pooled, B * H * es);
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

nopad_status encoder_embed(nopad_backend *be, const encoder_config *cfg, const encoder_weights *w,
                           encoder_workspace *ws, const nopad_seqs *seqs, const int32_t *tokens,
                           const int32_t *types, void *hidden) {
    // x[T, H] = LN(word[tokens] + pos + type) (ALBERT: at E into ws->embed; projected by the layers)
    const int32_t dim = w->embed_proj_weight ? cfg->embedding_size : cfg->hidden_size;
    return be->embed_layernorm(be, w->embed_proj_weight ? ws->embed : hidden, tokens, types, seqs,
                               cfg->position_offset, cfg->vocab_size, cfg->max_position_embeddings,
                               cfg->type_vocab_size, w->word_embeddings, w->position_embeddings,
                               w->type_embeddings, w->embed_ln_weight, w->embed_ln_bias,
                               cfg->layer_norm_eps, dim);
}

nopad_status encoder_layers(nopad_backend *be, const encoder_config *cfg, const encoder_weights *w,
                            encoder_workspace *ws, const nopad_seqs *seqs, int32_t n_rows,
                            void *hidden) {
    const int32_t T = n_rows, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int32_t E = cfg->embedding_size;
    const float eps = cfg->layer_norm_eps;
    const float scale = 1.0f / sqrtf((float)cfg->head_size);

    // ALBERT: x[T, H] = embed[T, E] · Wprojᵀ + b
    if (w->embed_proj_weight)
        TRY(be->linear(be, hidden, ws->embed, w->embed_proj_weight, w->embed_proj_bias, NULL, T,
                       E, H, NOPAD_EPILOGUE_BIAS, cfg->activation));

    /* Where the backend runs the whole stack in one call for this batch, that is all. */
    if (be->encoder_layers && be->encoder_layers_takes &&
        be->encoder_layers_takes(be, T, w->n_steps, H, cfg->num_heads, cfg->head_size, I))
        return be->encoder_layers(be, hidden, w->schedule, w->n_steps, seqs, H, cfg->num_heads,
                                  cfg->head_size, I, eps, scale, cfg->activation, ws->qkv,
                                  ws->context, ws->attn, ws->ffn);

    /* With few tokens every kernel is latency-bound, so where the backend fuses a LayerNorm
     * into the linear layer that consumes it (layernorm_linear), the layer's two LayerNorm
     * kernels go: the GEMM before each LayerNorm adds bias and residual in its epilogue and
     * stores the un-normalised sum s, and the next linear layer normalises s as it reads it,
     * storing LN(s) for the residual that follows. Buffers in that loop:
     *   ws->attn     s1 = x + context·Woᵀ + bo, then s2 = x1 + ffn·W2ᵀ + b2
     *   ws->context  context (unless attention_linear keeps it), then x1 = LN(s1) (written by
     *                the FFN-in op)
     *   hidden       x = LN(s2) of the layer before (written by the qkv op), finally the output */
    const int fuse_ln = be->layernorm_linear && be->layernorm_linear_takes &&
                        be->layernorm_linear_takes(be, T, H, 3 * H) &&
                        be->layernorm_linear_takes(be, T, H, I);
    /* Likewise the attention, where the backend fuses it into the attention-out linear layer
     * (attention_linear: the context never goes to memory). */
    const int fuse_attn = be->attention_linear && be->attention_linear_takes &&
                          be->attention_linear_takes(be, seqs, cfg->num_heads, cfg->head_size, H);
    for (int step = 0; step < w->n_steps; step++) {
        const encoder_layer *L = w->schedule[step];
        const encoder_layer *prev = step > 0 ? w->schedule[step - 1] : NULL;
        const int last = step + 1 == w->n_steps;
        if (fuse_ln && prev) {
            // x[T, H] = LN(s2) with the layer before's FFN LayerNorm; qkv[T, 3H] = x · Wqkvᵀ + bqkv
            TRY(be->layernorm_linear(be, ws->qkv, hidden, ws->attn, prev->ffn_ln_weight,
                                     prev->ffn_ln_bias, eps, L->qkv_weight, L->qkv_bias, NULL, T,
                                     H, 3 * H, NOPAD_EPILOGUE_BIAS, cfg->activation));
        } else {
            // qkv[T, 3H] = x · Wqkvᵀ + bqkv
            TRY(be->linear(be, ws->qkv, hidden, L->qkv_weight, L->qkv_bias, NULL, T, H, 3 * H,
                           NOPAD_EPILOGUE_BIAS, cfg->activation));
        }
        // context[T, H] = softmax(q·kᵀ·scale)·v per sequence and head, then
        // attn[T, H] = context · Woᵀ (LayerNorm op after) or s1 = x + context · Woᵀ + bo (fused)
        const nopad_epilogue out_ep = fuse_ln ? NOPAD_EPILOGUE_BIAS_RESIDUAL : NOPAD_EPILOGUE_NONE;
        const void *out_bias = fuse_ln ? L->attn_out_bias : NULL, *out_residual = fuse_ln ? hidden : NULL;
        if (fuse_attn) {
            TRY(be->attention_linear(be, ws->attn, ws->context, ws->qkv, seqs, cfg->num_heads,
                                     cfg->head_size, scale, L->attn_out_weight, out_bias,
                                     out_residual, H, out_ep, cfg->activation));
        } else {
            TRY(be->attention_varlen(be, ws->context, ws->qkv, seqs, cfg->num_heads,
                                     cfg->head_size, scale, 0));
            TRY(be->linear(be, ws->attn, ws->context, L->attn_out_weight, out_bias, out_residual,
                           T, H, H, out_ep, cfg->activation));
        }
        void *x1; /* [T, H] = LN(x + context · Woᵀ + bo), the FFN's input and residual */
        if (fuse_ln) {
            // x1 = LN(s1) into context (read by the ops before); ffn[T, I] = act(x1 · W1ᵀ + b1)
            x1 = ws->context;
            TRY(be->layernorm_linear(be, ws->ffn, x1, ws->attn, L->attn_ln_weight,
                                     L->attn_ln_bias, eps, L->ffn_in_weight, L->ffn_in_bias,
                                     NULL, T, H, I, NOPAD_EPILOGUE_BIAS_ACT, cfg->activation));
        } else {
            // x1 = LN(x + context · Woᵀ + bo)
            x1 = ws->attn;
            TRY(be->bias_residual_layernorm(be, x1, L->attn_out_bias, hidden, L->attn_ln_weight,
                                            L->attn_ln_bias, eps, T, H));
            // ffn[T, I] = act(x1 · W1ᵀ + b1)
            TRY(be->linear(be, ws->ffn, x1, L->ffn_in_weight, L->ffn_in_bias, NULL, T, H, I,
                           NOPAD_EPILOGUE_BIAS_ACT, cfg->activation));
        }
        if (fuse_ln && !last) {
            // s2[T, H] = x1 + ffn · W2ᵀ + b2 (normalised by the next layer's qkv op)
            TRY(be->linear(be, ws->attn, ws->ffn, L->ffn_out_weight, L->ffn_out_bias, x1, T, I,
                           H, NOPAD_EPILOGUE_BIAS_RESIDUAL, cfg->activation));
        } else {
            // x[T, H] = LN(x1 + ffn · W2ᵀ + b2)
            TRY(be->linear(be, hidden, ws->ffn, L->ffn_out_weight, NULL, NULL, T, I, H,
                           NOPAD_EPILOGUE_NONE, cfg->activation));
            TRY(be->bias_residual_layernorm(be, hidden, L->ffn_out_bias, x1, L->ffn_ln_weight,
                                            L->ffn_ln_bias, eps, T, H));
        }
    }
    return NOPAD_OK;
}

nopad_status encoder_forward(nopad_backend *be, const encoder_config *cfg, const encoder_weights *w,
                             encoder_workspace *ws, const nopad_seqs *seqs, const int32_t *tokens,
                             const int32_t *types, void *hidden) {
    TRY(encoder_embed(be, cfg, w, ws, seqs, tokens, types, hidden));
    return encoder_layers(be, cfg, w, ws, seqs, seqs->n_tokens, hidden);
}

int32_t encoder_token_bucket(int32_t n_tokens) {
    int32_t pow2 = 1;
    while (pow2 <= n_tokens / 2) pow2 *= 2;
    const int32_t step = pow2 / 16 > 16 ? pow2 / 16 : 16;
    return (int32_t)(((int64_t)n_tokens + step - 1) / step * step);
}
