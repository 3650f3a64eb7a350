/* One training step's forward and backward on the packed token stream. The forward is the
 * encoder of model/encoder.c, op for op, except that it keeps what the backward needs: each
 * layer's input, QKV, attention output and log-sum-exp, both LayerNorm inputs (s1, s2) and
 * outputs, and the FFN before and after its activation. Post-LayerNorm (BERT):
 *   s1 = x + attn(x)·Woᵀ + bo,  x1 = LN(s1),  u = x1·W1ᵀ + b1,  s2 = x1 + act(u)·W2ᵀ + b2,  x' = LN(s2)
 * The backward walks the layers in reverse with one gradient buffer for the residual stream:
 * each LayerNorm's gradient is also the gradient of its residual input, and the GEMMs add their
 * input gradient onto it (gemm_backward's accumulate_dx). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"
#include "util/error.h"

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        nopad_status st_ = (expr);                                                                 \
        if (st_ != NOPAD_OK) return st_;                                                           \
    } while (0)

/* base + `elements` elements of the backend's dtype (activations are [.., T, ..] slices of a
 * buffer sized for the budget). */
static void *at(const train_context *ctx, const void *base, size_t elements) {
    return (char *)base + elements * ctx->model->elem_size;
}

/* Dropout sites of a step: 0 after the embeddings, 1 + 2l after layer l's attention output
 * projection, 2 + 2l after its FFN output; layer l's attention probabilities are site l of the
 * attention's own counters (util/philox.h). Each step has its own key, and a mask bit is keyed by
 * the example's number and the token's position in its sequence (ctx->batch_examples), so it
 * does not depend on where the sequence sits in the batch or on which rank computes it. */
enum { DROP_EMBED = 0 };
static int drop_attn(int l) { return 1 + 2 * l; }
static int drop_ffn(int l) { return 2 + 2 * l; }

static uint64_t dropout_key(const train_context *ctx) {
    return ctx->dropout_seed + (uint64_t)ctx->model->step * 0x9E3779B97F4A7C15ull;
}

/* Layer l's attention-probability dropout, NULL when off: the step's key, the layer as its site. */
static const nopad_attention_dropout *attention_drop(const train_context *ctx, int l,
                                                     nopad_attention_dropout *buf) {
    if (!(ctx->attention_dropout > 0)) return NULL;
    *buf = (nopad_attention_dropout){ctx->attention_dropout, dropout_key(ctx), (uint32_t)l,
                                     ctx->batch_examples};
    return buf;
}

/* y[T, H] = dropout(x) (+ residual): the site's mask; the backward is the same call on a gradient. */
static nopad_status drop(const train_context *ctx, const nopad_seqs *seqs, int site, void *y,
                         const void *x, const void *residual) {
    nopad_backend *be = ctx->model->be;
    return be->dropout(be, y, x, residual, seqs, ctx->batch_examples, ctx->model->cfg.hidden_size,
                       ctx->dropout, dropout_key(ctx), (uint32_t)site);
}

void train_context_free(train_context *ctx) {
    nopad_backend *be = ctx->model ? ctx->model->be : NULL;
    void *bufs[] = {ctx->hidden,    ctx->qkv,      ctx->attn,     ctx->lse,       ctx->attn_sum,
                    ctx->attn_norm, ctx->ffn_pre,  ctx->ffn_act,  ctx->ffn_sum,   ctx->d_hidden,
                    ctx->d_attn,    ctx->d_qkv,    ctx->d_ffn,    ctx->head_in,   ctx->head_pre,
                    ctx->head_act,  ctx->head_norm, ctx->d_head_a, ctx->d_head_b, ctx->logits,
                    ctx->losses,    ctx->targets,  ctx->tokens,   ctx->types,     ctx->cu_seqlens,
                    ctx->rows,      ctx->labels,   ctx->d_drop,   ctx->examples};
    for (size_t i = 0; be && i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->free(be, bufs[i]);
    memset(ctx, 0, sizeof *ctx);
}

nopad_status train_context_init(train_model *m, int32_t max_tokens, int32_t max_seqs,
                                train_context *ctx) {
    memset(ctx, 0, sizeof *ctx);
    if (max_tokens < 1 || max_seqs < 1 || max_seqs > max_tokens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training context: token budget %d and "
                               "sequence budget %d (need 1 <= sequences <= tokens)", max_tokens,
                               max_seqs);
    ctx->model = m;
    ctx->max_tokens = max_tokens;
    ctx->max_seqs = max_seqs;
    nopad_backend *be = m->be;
    const model_config *c = &m->cfg;
    const size_t T = (size_t)max_tokens, B = (size_t)max_seqs, L = (size_t)c->num_layers;
    const size_t H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    const size_t heads = (size_t)c->num_heads, f = m->elem_size, f32 = sizeof(float);
    const size_t classes = m->task == TRAIN_TASK_MLM ? (size_t)c->vocab_size : (size_t)m->num_labels;
    nopad_status st = NOPAD_OK;
#define ALLOC(field, bytes)                                                                        \
    if (st == NOPAD_OK) st = be->alloc(be, (bytes), (void **)&ctx->field)
    ALLOC(hidden, (L + 1) * T * H * f);
    ALLOC(qkv, L * T * 3 * H * f);
    ALLOC(attn, L * T * H * f);
    ALLOC(lse, L * T * heads * f32);
    ALLOC(attn_sum, L * T * H * f);
    ALLOC(attn_norm, L * T * H * f);
    ALLOC(ffn_pre, L * T * I * f);
    ALLOC(ffn_act, L * T * I * f);
    ALLOC(ffn_sum, L * T * H * f);
    ALLOC(d_hidden, T * H * f);
    ALLOC(d_attn, T * H * f);
    ALLOC(d_qkv, T * 3 * H * f);
    ALLOC(d_ffn, T * I * f);
    ALLOC(d_drop, T * H * f);
    ALLOC(head_in, T * H * f); /* R <= T rows: masked tokens, or sequences */
    ALLOC(head_pre, T * H * f);
    ALLOC(head_act, T * H * f);
    ALLOC(head_norm, T * H * f);
    ALLOC(d_head_a, T * H * f);
    ALLOC(d_head_b, T * H * f);
    ALLOC(logits, T * classes * f);
    ALLOC(losses, T * f32);
    ALLOC(targets, B * f32);
    ALLOC(tokens, T * sizeof(int32_t));
    ALLOC(types, T * sizeof(int32_t));
    ALLOC(cu_seqlens, (B + 1) * sizeof(int32_t));
    ALLOC(examples, B * sizeof(int64_t));
    ALLOC(rows, T * sizeof(int32_t));
    ALLOC(labels, T * sizeof(int32_t));
#undef ALLOC
    if (st != NOPAD_OK) {
        train_context_free(ctx);
        return nopad_wrap_error(st, "training context for %d tokens", max_tokens);
    }
    return NOPAD_OK;
}

/* Bad input is an error naming the first bad field, before anything is enqueued. */
static nopad_status check_batch(const train_context *ctx, const train_batch *b) {
    const train_model *m = ctx->model;
    const model_config *c = &m->cfg;
    if (b->n_seqs < 1 || !b->cu_seqlens || !b->tokens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: empty (no sequences)");
    if (b->n_seqs > ctx->max_seqs)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: %d sequences, the "
                               "context holds %d", b->n_seqs, ctx->max_seqs);
    if (b->cu_seqlens[0] != 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: cu_seqlens[0] = %d, "
                               "expected 0", b->cu_seqlens[0]);
    for (int32_t s = 0; s < b->n_seqs; s++) {
        const int32_t len = b->cu_seqlens[s + 1] - b->cu_seqlens[s];
        if (len < 1 || len > c->max_position_embeddings)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: sequence %d has "
                                   "%d tokens, expected 1 to %d", s, len, c->max_position_embeddings);
    }
    const int32_t T = b->cu_seqlens[b->n_seqs];
    if (T > ctx->max_tokens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: %d tokens, the "
                               "context's budget is %d", T, ctx->max_tokens);
    for (int32_t t = 0; t < T; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= c->vocab_size)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: token %d is id "
                                   "%d, outside the vocabulary [0, %d)", t, b->tokens[t], c->vocab_size);
        if (b->types && (b->types[t] < 0 || b->types[t] >= c->type_vocab_size))
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: token %d has "
                                   "type %d, outside [0, %d)", t, b->types[t], c->type_vocab_size);
    }
    if (m->task == TRAIN_TASK_MLM) {
        if (b->n_masked < 1 || !b->mlm_positions || !b->mlm_labels)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: no masked "
                                   "tokens (the MLM loss needs at least one)");
        if (b->n_masked > T)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: %d masked "
                                   "tokens in a batch of %d", b->n_masked, T);
        for (int32_t i = 0; i < b->n_masked; i++) {
            if (b->mlm_positions[i] < 0 || b->mlm_positions[i] >= T)
                return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: masked "
                                       "position %d is %d, outside [0, %d)", i, b->mlm_positions[i], T);
            if (b->mlm_labels[i] < 0 || b->mlm_labels[i] >= c->vocab_size)
                return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: MLM label "
                                       "%d is %d, outside the vocabulary [0, %d)", i,
                                       b->mlm_labels[i], c->vocab_size);
        }
    } else if (m->num_labels == 1) {
        if (!b->targets)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: a regression "
                                   "head (1 label) needs targets");
        for (int32_t s = 0; s < b->n_seqs; s++)
            if (!isfinite(b->targets[s]))
                return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: target %d "
                                       "is not a finite number", s);
    } else {
        if (!b->labels)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: a "
                                   "classification head needs labels");
        for (int32_t s = 0; s < b->n_seqs; s++)
            if (b->labels[s] < 0 || b->labels[s] >= m->num_labels)
                return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training batch: label %d is "
                                       "%d, outside [0, %d)", s, b->labels[s], m->num_labels);
    }
    return NOPAD_OK;
}

/* The encoder forward, keeping every layer's activations (layer l's input is hidden[l]). */
static nopad_status encoder_forward_train(train_context *ctx, const nopad_seqs *seqs) {
    const train_model *m = ctx->model;
    nopad_backend *be = m->be;
    const model_config *c = &m->cfg;
    const int32_t T = seqs->n_tokens, H = c->hidden_size, I = c->intermediate_size;
    const size_t TH = (size_t)T * H, TI = (size_t)T * I;
    const float eps = c->layer_norm_eps, scale = 1.0f / sqrtf((float)c->head_size);
    const train_view *w = &m->w;
    // x[T, H] = LN(word[tokens] + pos + type)
    TRY(be->embed(be, ctx->hidden, ctx->tokens, ctx->types, seqs, c->position_offset,
                  c->vocab_size, c->max_position_embeddings, c->type_vocab_size, w->word, w->pos,
                  w->type, w->embed_ln_w, w->embed_ln_b, eps, H));
    const int dropout = ctx->dropout > 0;
    if (dropout) TRY(drop(ctx, seqs, DROP_EMBED, ctx->hidden, ctx->hidden, NULL));
    for (int l = 0; l < c->num_layers; l++) {
        const train_layer *L = &w->layers[l];
        void *x = at(ctx, ctx->hidden, l * TH), *x_next = at(ctx, ctx->hidden, (l + 1) * TH);
        void *qkv = at(ctx, ctx->qkv, l * 3 * TH), *attn = at(ctx, ctx->attn, l * TH);
        float *lse = ctx->lse + (size_t)l * T * c->num_heads;
        void *s1 = at(ctx, ctx->attn_sum, l * TH), *x1 = at(ctx, ctx->attn_norm, l * TH);
        void *u = at(ctx, ctx->ffn_pre, l * TI), *a = at(ctx, ctx->ffn_act, l * TI);
        void *s2 = at(ctx, ctx->ffn_sum, l * TH);
        // qkv[T, 3H] = x·Wqkvᵀ + bqkv;  attn[T, H] = softmax(q·kᵀ·scale)·v, lse[T, heads]
        TRY(be->gemm(be, qkv, x, L->qkv_w, L->qkv_b, NULL, T, H, 3 * H, NOPAD_EPILOGUE_BIAS, c->activation));
        nopad_attention_dropout ad;
        TRY(be->attention_lse(be, attn, lse, qkv, seqs, c->num_heads, c->head_size, scale, 0,
                              attention_drop(ctx, l, &ad)));
        // s1[T, H] = x + attn·Woᵀ + bo;  x1 = LN(s1)
        if (dropout) { // s1 = x + dropout(attn·Woᵀ + bo)
            TRY(be->gemm(be, s1, attn, L->attn_out_w, L->attn_out_b, NULL, T, H, H,
                         NOPAD_EPILOGUE_BIAS, c->activation));
            TRY(drop(ctx, seqs, drop_attn(l), s1, s1, x));
        } else {
            TRY(be->gemm(be, s1, attn, L->attn_out_w, L->attn_out_b, x, T, H, H,
                         NOPAD_EPILOGUE_BIAS_RESIDUAL, c->activation));
        }
        TRY(be->copy(be, x1, s1, TH * m->elem_size));
        TRY(be->layernorm(be, x1, NULL, NULL, L->attn_ln_w, L->attn_ln_b, eps, T, H));
        // u[T, I] = x1·W1ᵀ + b1;  a = act(u): one kernel where the backend fuses them
        const nopad_status fused = be->gemm_act_aux ? be->gemm_act_aux(be, a, u, x1, L->ffn_in_w, L->ffn_in_b,
                                                                        T, H, I, c->activation)
                                                    : NOPAD_ERR_UNSUPPORTED;
        if (fused == NOPAD_ERR_UNSUPPORTED) {
            TRY(be->gemm(be, u, x1, L->ffn_in_w, L->ffn_in_b, NULL, T, H, I, NOPAD_EPILOGUE_BIAS, c->activation));
            TRY(be->activation(be, a, u, T, I, c->activation));
        } else {
            TRY(fused);
        }
        // s2[T, H] = x1 + a·W2ᵀ + b2;  x' = LN(s2)
        if (dropout) { // s2 = x1 + dropout(a·W2ᵀ + b2)
            TRY(be->gemm(be, s2, a, L->ffn_out_w, L->ffn_out_b, NULL, T, I, H, NOPAD_EPILOGUE_BIAS,
                         c->activation));
            TRY(drop(ctx, seqs, drop_ffn(l), s2, s2, x1));
        } else {
            TRY(be->gemm(be, s2, a, L->ffn_out_w, L->ffn_out_b, x1, T, I, H,
                         NOPAD_EPILOGUE_BIAS_RESIDUAL, c->activation));
        }
        TRY(be->copy(be, x_next, s2, TH * m->elem_size));
        TRY(be->layernorm(be, x_next, NULL, NULL, L->ffn_ln_w, L->ffn_ln_b, eps, T, H));
    }
    return NOPAD_OK;
}

/* Tells a data-parallel rank that gradient bucket `bucket` is written (train_context.grads_ready). */
static nopad_status grads_ready(const train_context *ctx, int32_t bucket) {
    return ctx->grads_ready ? ctx->grads_ready(ctx->grads_user, bucket) : NOPAD_OK;
}

/* The encoder backward from ctx->d_hidden [T, H] (the gradient of the last layer's output) down
 * to the embedding tables. */
static nopad_status encoder_backward(train_context *ctx, const nopad_seqs *seqs) {
    const train_model *m = ctx->model;
    nopad_backend *be = m->be;
    const model_config *c = &m->cfg;
    const int32_t T = seqs->n_tokens, H = c->hidden_size, I = c->intermediate_size;
    const size_t TH = (size_t)T * H, TI = (size_t)T * I;
    const float eps = c->layer_norm_eps, scale = 1.0f / sqrtf((float)c->head_size);
    void *d = ctx->d_hidden; // [T, H]
    const int dropout = ctx->dropout > 0;
    for (int l = c->num_layers - 1; l >= 0; l--) {
        const train_layer *L = &m->w.layers[l], *G = &m->g.layers[l];
        const void *x = at(ctx, ctx->hidden, l * TH);
        const void *qkv = at(ctx, ctx->qkv, l * 3 * TH), *attn = at(ctx, ctx->attn, l * TH);
        const float *lse = ctx->lse + (size_t)l * T * c->num_heads;
        const void *s1 = at(ctx, ctx->attn_sum, l * TH), *x1 = at(ctx, ctx->attn_norm, l * TH);
        const void *u = at(ctx, ctx->ffn_pre, l * TI), *a = at(ctx, ctx->ffn_act, l * TI);
        const void *s2 = at(ctx, ctx->ffn_sum, l * TH);
        // d = ∂L/∂s2 (in place), the gradient of x1 through the residual and of a·W2ᵀ; db2 = Σ d
        // (with dropout the branch's gradient is dropout(d), and db2 its sum)
        TRY(be->layernorm_backward(be, d, G->ffn_ln_w, G->ffn_ln_b, dropout ? NULL : G->ffn_out_b,
                                   d, s2, L->ffn_ln_w, eps, T, H));
        const void *d_branch = d;
        if (dropout) {
            TRY(drop(ctx, seqs, drop_ffn(l), ctx->d_drop, d, NULL));
            d_branch = ctx->d_drop;
        }
        // d_ffn[T, I] = ∂L/∂u = (d·W2) ⊙ act'(u) (one kernel where the backend fuses it), dW2 += dᵀ·a
        const nopad_status fused_dx = be->gemm_dx_act ? be->gemm_dx_act(be, ctx->d_ffn, d_branch, L->ffn_out_w, u,
                                                                        T, I, H, c->activation)
                                                      : NOPAD_ERR_UNSUPPORTED;
        if (fused_dx != NOPAD_ERR_UNSUPPORTED) TRY(fused_dx);
        TRY(be->gemm_backward(be, fused_dx == NOPAD_OK ? NULL : ctx->d_ffn, G->ffn_out_w,
                              dropout ? G->ffn_out_b : NULL, d_branch, a, L->ffn_out_w, T, I, H, 0));
        if (fused_dx != NOPAD_OK)
            TRY(be->activation_backward(be, ctx->d_ffn, NULL, ctx->d_ffn, u, T, I, c->activation));
        // d += d_ffn·W1 (d is now ∂L/∂x1), dW1 += d_ffnᵀ·x1, db1 += Σ d_ffn
        TRY(be->gemm_backward(be, d, G->ffn_in_w, G->ffn_in_b, ctx->d_ffn, x1, L->ffn_in_w, T, H, I, 1));
        // d = ∂L/∂s1 (in place), the gradient of x through the residual; dbo = Σ d (or of the
        // dropped branch's gradient)
        TRY(be->layernorm_backward(be, d, G->attn_ln_w, G->attn_ln_b, dropout ? NULL : G->attn_out_b,
                                   d, s1, L->attn_ln_w, eps, T, H));
        d_branch = d;
        if (dropout) {
            TRY(drop(ctx, seqs, drop_attn(l), ctx->d_drop, d, NULL));
            d_branch = ctx->d_drop;
        }
        // d_attn[T, H] = d·Wo, dWo += dᵀ·attn
        TRY(be->gemm_backward(be, ctx->d_attn, G->attn_out_w, dropout ? G->attn_out_b : NULL,
                              d_branch, attn, L->attn_out_w, T, H, H, 0));
        // d_qkv[T, 3H] from the attention backward (probabilities recomputed from lse)
        nopad_attention_dropout ad;
        TRY(be->attention_backward(be, ctx->d_qkv, ctx->d_attn, qkv, attn, lse, seqs,
                                   c->num_heads, c->head_size, scale, 0, attention_drop(ctx, l, &ad)));
        // d += d_qkv·Wqkv (d is now ∂L/∂x), dWqkv += d_qkvᵀ·x, dbqkv += Σ d_qkv
        TRY(be->gemm_backward(be, d, G->qkv_w, G->qkv_b, ctx->d_qkv, x, L->qkv_w, T, H, 3 * H, 1));
        TRY(grads_ready(ctx, c->num_layers - l)); /* layer l's gradients are whole */
    }
    if (dropout) TRY(drop(ctx, seqs, DROP_EMBED, d, d, NULL));
    TRY(be->embed_backward(be, m->g.word, m->g.pos, m->g.type, m->g.embed_ln_w,
                           m->g.embed_ln_b, d, ctx->tokens, ctx->types, seqs,
                           c->position_offset, m->w.word, m->w.pos, m->w.type,
                           m->w.embed_ln_w, eps, H));
    return grads_ready(ctx, c->num_layers + 1);
}

/* The sum of the n per-row losses the loss op wrote: the step's one read back to the host. */
static nopad_status sum_loss(train_context *ctx, int32_t n, double *loss) {
    nopad_backend *be = ctx->model->be;
    float *losses = malloc((size_t)n * sizeof *losses);
    if (!losses) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "training loss: out of memory");
    nopad_status st = be->download(be, losses, ctx->losses, (size_t)n * sizeof *losses);
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += losses[i];
    free(losses);
    *loss = sum;
    return st;
}

/* What the loss's gradient is divided by: the batch's rows, or the global batch's. */
static float grad_scale(const train_context *ctx, int32_t rows) {
    return 1.0f / (float)(ctx->loss_rows > 0 ? ctx->loss_rows : rows);
}


/* BertForMaskedLM's head on the M masked rows only: t = LN(act(h·Wtᵀ + bt)), logits = t·wordᵀ +
 * bias (the decoder is the word embedding table); cross-entropy with mean over M, whose op also
 * leaves the logits' gradient in place. */
static nopad_status mlm_head_forward(train_context *ctx, const nopad_seqs *seqs, int32_t M) {
    const train_model *m = ctx->model;
    nopad_backend *be = m->be;
    const model_config *c = &m->cfg;
    const int32_t H = c->hidden_size, V = c->vocab_size;
    const void *h = at(ctx, ctx->hidden, (size_t)c->num_layers * seqs->n_tokens * H); // [T, H]
    // head_in[M, H] = h[positions]
    TRY(be->select_rows(be, ctx->head_in, h, ctx->rows, M, H));
    // head_pre = head_in·Wtᵀ + bt;  head_act = act(head_pre);  head_norm = LN(head_act)
    TRY(be->gemm(be, ctx->head_pre, ctx->head_in, m->w.mlm_dense_w, m->w.mlm_dense_b, NULL, M, H,
                 H, NOPAD_EPILOGUE_BIAS, c->activation));
    TRY(be->activation(be, ctx->head_act, ctx->head_pre, M, H, c->activation));
    TRY(be->copy(be, ctx->head_norm, ctx->head_act, (size_t)M * H * m->elem_size));
    TRY(be->layernorm(be, ctx->head_norm, NULL, NULL, m->w.mlm_ln_w, m->w.mlm_ln_b,
                      c->layer_norm_eps, M, H));
    // logits[M, V] = head_norm·wordᵀ + bias; then their gradient in place, scaled by 1/M
    TRY(be->gemm(be, ctx->logits, ctx->head_norm, m->w.word, m->w.mlm_bias, NULL, M, H, V,
                 NOPAD_EPILOGUE_BIAS, c->activation));
    return be->cross_entropy(be, ctx->losses, ctx->logits, ctx->logits, ctx->labels, M, V,
                             grad_scale(ctx, M));
}

/* Its backward from the logits' gradient; leaves ∂L/∂hidden in ctx->d_hidden. */
static nopad_status mlm_head_backward(train_context *ctx, const nopad_seqs *seqs, int32_t M) {
    const train_model *m = ctx->model;
    nopad_backend *be = m->be;
    const model_config *c = &m->cfg;
    const int32_t H = c->hidden_size, V = c->vocab_size;
    // the decoder (tied: its weight gradient adds onto the word table's)
    TRY(be->gemm_backward(be, ctx->d_head_a, m->g.word, m->g.mlm_bias, ctx->logits,
                          ctx->head_norm, m->w.word, M, H, V, 0));
    TRY(be->layernorm_backward(be, ctx->d_head_a, m->g.mlm_ln_w, m->g.mlm_ln_b, NULL,
                               ctx->d_head_a, ctx->head_act, m->w.mlm_ln_w, c->layer_norm_eps, M, H));
    TRY(be->activation_backward(be, ctx->d_head_a, m->g.mlm_dense_b, ctx->d_head_a, ctx->head_pre,
                                M, H, c->activation));
    TRY(be->gemm_backward(be, ctx->d_head_b, m->g.mlm_dense_w, NULL, ctx->d_head_a, ctx->head_in,
                          m->w.mlm_dense_w, M, H, H, 0));
    // ∂L/∂hidden: zero but on the masked rows
    TRY(be->zero(be, ctx->d_hidden, (size_t)seqs->n_tokens * H * m->elem_size));
    return be->scatter_add_rows(be, ctx->d_hidden, ctx->rows, ctx->d_head_b, M, H);
}

/* BertForSequenceClassification's head on the B first tokens: p = tanh(h[CLS]·Wpᵀ + bp),
 * logits = p·Wcᵀ + bc; cross-entropy (or squared error for one label) with mean over B, the
 * logits' gradient left in place. */
static nopad_status classify_head_forward(train_context *ctx, const nopad_seqs *seqs, int with_loss) {
    const train_model *m = ctx->model;
    nopad_backend *be = m->be;
    const model_config *c = &m->cfg;
    const int32_t H = c->hidden_size, B = seqs->n_seqs, C = m->num_labels;
    const void *h = at(ctx, ctx->hidden, (size_t)c->num_layers * seqs->n_tokens * H); // [T, H]
    // head_in[B, H] = h[first token of each sequence]
    TRY(be->pool(be, ctx->head_in, h, seqs, H, NOPAD_POOLING_CLS));
    TRY(be->gemm(be, ctx->head_pre, ctx->head_in, m->w.pool_w, m->w.pool_b, NULL, B, H, H,
                 NOPAD_EPILOGUE_BIAS, c->activation));
    TRY(be->activation(be, ctx->head_act, ctx->head_pre, B, H, NOPAD_ACT_TANH));
    // logits[B, C]
    TRY(be->gemm(be, ctx->logits, ctx->head_act, m->w.cls_w, m->w.cls_b, NULL, B, H, C,
                 NOPAD_EPILOGUE_BIAS, c->activation));
    if (!with_loss) return NOPAD_OK;
    if (C == 1)
        return be->squared_error(be, ctx->losses, ctx->logits, ctx->logits, ctx->targets, B,
                                 grad_scale(ctx, B));
    return be->cross_entropy(be, ctx->losses, ctx->logits, ctx->logits, ctx->labels, B, C,
                             grad_scale(ctx, B));
}

static nopad_status classify_head_backward(train_context *ctx, const nopad_seqs *seqs) {
    const train_model *m = ctx->model;
    nopad_backend *be = m->be;
    const int32_t H = m->cfg.hidden_size, B = seqs->n_seqs, C = m->num_labels;
    TRY(be->gemm_backward(be, ctx->d_head_a, m->g.cls_w, m->g.cls_b, ctx->logits, ctx->head_act,
                          m->w.cls_w, B, H, C, 0));
    TRY(be->activation_backward(be, ctx->d_head_a, m->g.pool_b, ctx->d_head_a, ctx->head_pre, B,
                                H, NOPAD_ACT_TANH));
    TRY(be->gemm_backward(be, ctx->d_head_b, m->g.pool_w, NULL, ctx->d_head_a, ctx->head_in,
                          m->w.pool_w, B, H, H, 0));
    // ∂L/∂hidden: zero but on each sequence's first row (cu_seqlens[0 .. B-1])
    TRY(be->zero(be, ctx->d_hidden, (size_t)seqs->n_tokens * H * m->elem_size));
    return be->scatter_add_rows(be, ctx->d_hidden, ctx->cu_seqlens, ctx->d_head_b, B, H);
}

/* The batch's ids, types and cu_seqlens into the context; the sequences' description. */
static nopad_status upload_inputs(train_context *ctx, const train_batch *b, nopad_seqs *seqs) {
    nopad_backend *be = ctx->model->be;
    const int32_t B = b->n_seqs, T = b->cu_seqlens[B];
    int32_t max_len = 0;
    for (int32_t s = 0; s < B; s++)
        if (b->cu_seqlens[s + 1] - b->cu_seqlens[s] > max_len) max_len = b->cu_seqlens[s + 1] - b->cu_seqlens[s];
    TRY(be->upload_i32(be, ctx->tokens, b->tokens, (size_t)T));
    if (b->types) TRY(be->upload_i32(be, ctx->types, b->types, (size_t)T));
    else TRY(be->zero(be, ctx->types, (size_t)T * sizeof(int32_t)));
    TRY(be->upload_i32(be, ctx->cu_seqlens, b->cu_seqlens, (size_t)B + 1));
    if (b->examples) TRY(be->upload(be, ctx->examples, b->examples, (size_t)B * sizeof(int64_t)));
    ctx->batch_examples = b->examples ? ctx->examples : NULL;
    *seqs = (nopad_seqs){B, T, max_len, ctx->cu_seqlens};
    return NOPAD_OK;
}

nopad_status train_predict(train_context *ctx, const train_batch *b, float *logits) {
    train_model *m = ctx->model;
    nopad_backend *be = m->be;
    if (m->task != TRAIN_TASK_CLASSIFY)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_predict: the model has no "
                               "classification head");
    TRY(check_batch(ctx, b));
    nopad_seqs seqs;
    TRY(upload_inputs(ctx, b, &seqs));
    ctx->forward_rows = 0; /* no loss: nothing for train_backward */
    TRY(encoder_forward_train(ctx, &seqs));
    TRY(classify_head_forward(ctx, &seqs, 0));
    return be->download_f32(be, logits, ctx->logits, (size_t)seqs.n_seqs * m->num_labels);
}

nopad_status train_forward(train_context *ctx, const train_batch *b) {
    train_model *m = ctx->model;
    nopad_backend *be = m->be;
    ctx->forward_rows = 0;
    TRY(check_batch(ctx, b));
    const int32_t B = b->n_seqs;
    TRY(upload_inputs(ctx, b, &ctx->seqs));
    if (m->task == TRAIN_TASK_MLM) {
        TRY(be->upload_i32(be, ctx->rows, b->mlm_positions, (size_t)b->n_masked));
        TRY(be->upload_i32(be, ctx->labels, b->mlm_labels, (size_t)b->n_masked));
    } else if (m->num_labels == 1) {
        TRY(be->upload(be, ctx->targets, b->targets, (size_t)B * sizeof(float)));
    } else {
        TRY(be->upload_i32(be, ctx->labels, b->labels, (size_t)B));
    }
    TRY(encoder_forward_train(ctx, &ctx->seqs));
    if (m->task == TRAIN_TASK_MLM) TRY(mlm_head_forward(ctx, &ctx->seqs, b->n_masked));
    else TRY(classify_head_forward(ctx, &ctx->seqs, 1));
    ctx->forward_rows = m->task == TRAIN_TASK_MLM ? b->n_masked : B;
    return NOPAD_OK;
}

nopad_status train_backward(train_context *ctx) {
    train_model *m = ctx->model;
    nopad_backend *be = m->be;
    if (ctx->forward_rows < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_backward: no forward to go "
                               "back through (call train_forward first)");
    if (!ctx->accumulate) TRY(be->zero(be, m->grads, (size_t)m->n_params * sizeof(float)));
    if (m->task == TRAIN_TASK_MLM) TRY(mlm_head_backward(ctx, &ctx->seqs, ctx->forward_rows));
    else TRY(classify_head_backward(ctx, &ctx->seqs));
    TRY(grads_ready(ctx, 0)); /* the head's (the tied word table's come with the embeddings) */
    return encoder_backward(ctx, &ctx->seqs);
}

nopad_status train_read_loss_sum(train_context *ctx, double *sum) {
    if (ctx->forward_rows < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_read_loss: no forward ran");
    return sum_loss(ctx, ctx->forward_rows, sum);
}

nopad_status train_read_loss(train_context *ctx, double *loss) {
    TRY(train_read_loss_sum(ctx, loss));
    *loss /= ctx->forward_rows;
    return NOPAD_OK;
}

nopad_status train_forward_backward(train_context *ctx, const train_batch *b, double *loss) {
    TRY(train_forward(ctx, b));
    TRY(train_backward(ctx));
    TRY(train_read_loss(ctx, loss));
    if (!isfinite(*loss))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training step: the loss is %g", *loss);
    return NOPAD_OK;
}
