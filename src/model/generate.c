/* Generation on a decoder: sequences (a history in the context's paged KV pool), one packed step
 * over any mix of sequences (nopad_decode), and nopad_generate, which runs prompts together and
 * lets each leave as soon as it is done. The KV pool is a stack of free block ids: a growing
 * sequence takes blocks, a freed one gives them back; nothing is ever copied. */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "model/sampling.h"
#include "util/error.h"

struct nopad_sequence {
    nopad_context *ctx;
    int32_t length;   /* tokens in the history */
    int32_t *blocks;  /* [n_blocks] block ids, in order */
    int32_t n_blocks, cap;
    int32_t *tokens;  /* [length] the ids of the history (the repetition penalty reads them) */
    int32_t tokens_cap;
};

nopad_generate_params nopad_generate_default_params(void) {
    nopad_generate_params p = {.max_tokens = 128, .ignore_eos = 0,
                               .sampling = nopad_sampling_default_params()};
    return p;
}

static nopad_status need_decoder(const nopad_context *c, const char *fn) {
    if (!c) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: context is NULL", fn);
    if (!c->model->cfg.causal)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: %s is an encoder; generation needs a decoder (gpt2, llama, "
                               "mistral, qwen2)",
                               fn, c->model->cfg.model_type);
    return NOPAD_OK;
}

nopad_status nopad_sequence_create(nopad_context *ctx, nopad_sequence **out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_sequence_create: out is NULL");
    *out = NULL;
    nopad_status st = need_decoder(ctx, "nopad_sequence_create");
    if (st != NOPAD_OK) return st;
    nopad_sequence *s = calloc(1, sizeof *s);
    if (!s) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_sequence_create: out of memory");
    s->ctx = ctx;
    *out = s;
    return NOPAD_OK;
}

void nopad_sequence_free(nopad_sequence *s) {
    if (!s) return;
    nopad_context *c = s->ctx;
    pthread_mutex_lock(&c->lock);
    for (int32_t i = s->n_blocks; i-- > 0;) c->dec.free_blocks[c->dec.n_free++] = s->blocks[i];
    pthread_mutex_unlock(&c->lock);
    free(s->blocks);
    free(s->tokens);
    free(s);
}

int32_t nopad_sequence_length(const nopad_sequence *s) { return s ? s->length : 0; }

/* Takes the blocks sequence s needs to hold `length` tokens from the pool (the caller holds the
 * lock and has checked there are enough). */
static nopad_status grow(decoder_state *d, nopad_sequence *s, int32_t length) {
    const int32_t need = (length + d->block_size - 1) / d->block_size;
    if (need > s->cap) {
        int32_t cap = need > 2 * s->cap ? need : 2 * s->cap;
        int32_t *blocks = realloc(s->blocks, (size_t)cap * sizeof *blocks);
        if (!blocks) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_decode: out of memory");
        s->blocks = blocks;
        s->cap = cap;
    }
    while (s->n_blocks < need) s->blocks[s->n_blocks++] = d->free_blocks[--d->n_free];
    return NOPAD_OK;
}

/* Room for `length` ids in s->tokens. */
static nopad_status reserve_tokens(nopad_sequence *s, int32_t length) {
    if (length <= s->tokens_cap) return NOPAD_OK;
    int32_t cap = length > 2 * s->tokens_cap ? length : 2 * s->tokens_cap;
    int32_t *t = realloc(s->tokens, (size_t)cap * sizeof *t);
    if (!t) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_decode: out of memory");
    s->tokens = t;
    s->tokens_cap = cap;
    return NOPAD_OK;
}

/* Each sequence's history after the step, back to back, for the repetition penalty: the ids it
 * already holds and the step's new ones. *history and *cu_history are malloc'ed. */
static nopad_status step_histories(int32_t B, nopad_sequence *const *seqs, const int32_t *cu,
                                   const int32_t *tokens, int32_t **history, int32_t **cu_history) {
    size_t total = 0;
    for (int32_t b = 0; b < B; b++) total += (size_t)seqs[b]->length + (size_t)(cu[b + 1] - cu[b]);
    int32_t *h = malloc((total ? total : 1) * sizeof *h), *ch = malloc(((size_t)B + 1) * sizeof *ch);
    if (!h || !ch) {
        free(h);
        free(ch);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_decode_sample: out of memory");
    }
    ch[0] = 0;
    for (int32_t b = 0; b < B; b++) {
        const int32_t n_old = seqs[b]->length, n_new = cu[b + 1] - cu[b];
        if (n_old) memcpy(h + ch[b], seqs[b]->tokens, (size_t)n_old * sizeof *h);
        memcpy(h + ch[b] + n_old, tokens + cu[b], (size_t)n_new * sizeof *h);
        ch[b + 1] = ch[b] + n_old + n_new;
    }
    *history = h;
    *cu_history = ch;
    return NOPAD_OK;
}

static nopad_status decode_locked(nopad_context *c, int32_t B, nopad_sequence *const *seqs,
                                  const int32_t *cu, const int32_t *tokens, int all_logits,
                                  decoder_output *out) {
    const model_config *cfg = &c->model->cfg;
    decoder_state *d = &c->dec;
    /* every check first: a refused step changes nothing */
    if (B <= 0 || !seqs || !cu || !tokens || cu[0] != 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_decode: need n_seqs >= 1, sequences, cu_tokens starting at 0 "
                               "and tokens");
    int32_t need_blocks = 0;
    for (int32_t b = 0; b < B; b++) {
        const nopad_sequence *s = seqs[b];
        if (!s || s->ctx != c)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "nopad_decode: sequence %d is NULL or belongs to another context", b);
        for (int32_t k = 0; k < b; k++)
            if (seqs[k] == s)
                return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                       "nopad_decode: sequence %d appears twice in one step", b);
        const int32_t n = cu[b + 1] - cu[b];
        if (n < 1)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "nopad_decode: sequence %d brings %d tokens (at least 1)", b, n);
        if ((int64_t)s->length + n > cfg->max_position_embeddings)
            return nopad_set_error(NOPAD_ERR_TOO_LONG,
                                   "nopad_decode: sequence %d would hold %lld tokens, more than the "
                                   "model's context of %d",
                                   b, (long long)s->length + n, cfg->max_position_embeddings);
        need_blocks += (s->length + n + d->block_size - 1) / d->block_size - s->n_blocks;
    }
    const int32_t T = cu[B];
    if (T > d->max_tokens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_decode: %d tokens in one step, the context's workspace holds "
                               "%d (max_batch_tokens); split the prompt into chunks",
                               T, d->max_tokens);
    for (int32_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= cfg->vocab_size)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "nopad_decode: token %d is id %d, outside the vocabulary [0, %d)",
                                   t, tokens[t], cfg->vocab_size);
    if (need_blocks > d->n_free)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY,
                               "nopad_decode: the KV pool is exhausted: the step needs %d blocks "
                               "of %d tokens, %d of %d are free (free finished sequences, or ask "
                               "for a larger kv_cache_tokens)",
                               need_blocks, d->block_size, d->n_free, d->n_blocks);

    int32_t max_blocks = 1;
    for (int32_t b = 0; b < B; b++) {
        const int32_t nb = (seqs[b]->length + cu[b + 1] - cu[b] + d->block_size - 1) / d->block_size;
        if (nb > max_blocks) max_blocks = nb;
    }
    int32_t *table = calloc((size_t)B * max_blocks + B, sizeof *table);
    if (!table) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_decode: out of memory");
    int32_t *seqlen = table + (size_t)B * max_blocks;
    /* keep what each sequence had, to give back blocks if the step fails */
    int32_t *had = malloc((size_t)B * sizeof *had);
    int32_t *history = NULL, *cu_history = NULL;
    nopad_status st = had ? NOPAD_OK : nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "out of memory");
    for (int32_t b = 0; b < B && st == NOPAD_OK; b++) {
        nopad_sequence *s = seqs[b];
        had[b] = s->n_blocks;
        seqlen[b] = s->length + cu[b + 1] - cu[b];
        st = reserve_tokens(s, seqlen[b]);
        if (st == NOPAD_OK) st = grow(d, s, seqlen[b]);
        if (st == NOPAD_OK) memcpy(table + (size_t)b * max_blocks, s->blocks, (size_t)s->n_blocks * sizeof *table);
    }
    int penalty = 0;
    for (int32_t b = 0; out->ids && b < B; b++)
        penalty |= out->params[b].repetition_penalty != 1.0f || out->params[b].presence_penalty != 0.0f ||
                   out->params[b].frequency_penalty != 0.0f;
    if (st == NOPAD_OK && penalty) {
        st = step_histories(B, seqs, cu, tokens, &history, &cu_history);
        out->history = history;
        out->cu_history = cu_history;
    }
    if (st == NOPAD_OK) {
        const decoder_batch batch = {.n_seqs = B, .cu_q = cu, .tokens = tokens, .seqlen_k = seqlen,
                                     .block_table = table, .max_blocks = max_blocks,
                                     .all_logits = all_logits};
        st = tp_decoder_step(c, &batch, out);
    }
    for (int32_t b = 0; b < B && had; b++) {
        nopad_sequence *s = seqs[b];
        if (st == NOPAD_OK) {
            memcpy(s->tokens + s->length, tokens + cu[b], (size_t)(cu[b + 1] - cu[b]) * sizeof *tokens);
            s->length = seqlen[b];
        } else { /* the sequence keeps only the blocks it had */
            while (s->n_blocks > had[b]) d->free_blocks[d->n_free++] = s->blocks[--s->n_blocks];
        }
    }
    if (st == NOPAD_OK) c->forwards++;
    free(history);
    free(cu_history);
    free(had);
    free(table);
    return st;
}

nopad_status nopad_decode(nopad_context *c, int32_t n_seqs, nopad_sequence *const *seqs,
                          const int32_t *cu_tokens, const int32_t *tokens, int all_logits,
                          float *logits) {
    nopad_status st = need_decoder(c, "nopad_decode");
    if (st != NOPAD_OK) return st;
    if (!logits) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_decode: logits is NULL");
    decoder_output out = {.logits = logits};
    pthread_mutex_lock(&c->lock);
    st = decode_locked(c, n_seqs, seqs, cu_tokens, tokens, all_logits, &out);
    pthread_mutex_unlock(&c->lock);
    return st;
}

nopad_status nopad_decode_sample(nopad_context *c, int32_t n_seqs, nopad_sequence *const *seqs,
                                 const int32_t *cu_tokens, const int32_t *tokens,
                                 const nopad_sampling_params *params, const uint64_t *draws,
                                 int32_t *out_ids, float *out_logprobs) {
    nopad_status st = need_decoder(c, "nopad_decode_sample");
    if (st != NOPAD_OK) return st;
    if (!out_ids) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_decode_sample: out_ids is NULL");
    if (n_seqs <= 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_decode_sample: n_seqs is %d (at least 1)",
                               n_seqs);
    nopad_sampling_params *p = malloc((size_t)n_seqs * sizeof *p);
    uint64_t *dr = malloc((size_t)n_seqs * sizeof *dr);
    if (!p || !dr) st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_decode_sample: out of memory");
    for (int32_t b = 0; b < n_seqs && st == NOPAD_OK; b++) {
        p[b] = params ? params[b] : nopad_sampling_default_params();
        dr[b] = draws ? draws[b] : 0;
        st = sampling_check_vocab(&p[b], c->model->cfg.vocab_size);
        if (st != NOPAD_OK) st = nopad_wrap_error(st, "nopad_decode_sample: sequence %d", b);
    }
    if (st == NOPAD_OK) {
        decoder_output out = {.ids = out_ids, .logprobs = out_logprobs, .params = p, .draws = dr};
        pthread_mutex_lock(&c->lock);
        st = decode_locked(c, n_seqs, seqs, cu_tokens, tokens, 0, &out);
        pthread_mutex_unlock(&c->lock);
    }
    free(p);
    free(dr);
    return st;
}

/* A prompt chunk whose logits nobody reads: the step stops before the LM head. */
static nopad_status feed_locked(nopad_context *c, nopad_sequence *seq, const int32_t *tokens,
                                int32_t n) {
    const int32_t cu[2] = {0, n};
    decoder_output out = {0};
    pthread_mutex_lock(&c->lock);
    nopad_status st = decode_locked(c, 1, &seq, cu, tokens, 0, &out);
    pthread_mutex_unlock(&c->lock);
    return st;
}

/* ---- nopad_generate ------------------------------------------------------------------------- */

typedef struct gen_seq {
    nopad_sequence *seq;
    int32_t last;       /* the token the next step feeds */
    int32_t produced;
    int done;
} gen_seq;

nopad_status nopad_generate(nopad_context *c, int32_t n, const int32_t *cu, const int32_t *prompt,
                            const nopad_generate_params *params, int32_t *out_tokens,
                            int32_t *out_counts, nopad_token_fn on_token, void *user) {
    nopad_status st = need_decoder(c, "nopad_generate");
    if (st != NOPAD_OK) return st;
    const nopad_generate_params p = params ? *params : nopad_generate_default_params();
    if (n <= 0 || !cu || !prompt || cu[0] != 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_generate: need n_prompts >= 1, cu_prompts starting at 0 and "
                               "prompt tokens");
    if (p.max_tokens < 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_generate: max_tokens %d < 0",
                               p.max_tokens);
    const model_config *cfg = &c->model->cfg;
    st = sampling_check_vocab(&p.sampling, cfg->vocab_size);
    if (st != NOPAD_OK) return st;
    for (int32_t i = 0; i < n; i++) {
        if (cu[i + 1] - cu[i] < 1)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "nopad_generate: prompt %d is empty (at least one token)", i);
        if (cu[i + 1] - cu[i] + (int64_t)p.max_tokens > cfg->max_position_embeddings)
            return nopad_set_error(NOPAD_ERR_TOO_LONG,
                                   "nopad_generate: prompt %d (%d tokens) + max_tokens %d exceeds "
                                   "the model's context of %d",
                                   i, cu[i + 1] - cu[i], p.max_tokens, cfg->max_position_embeddings);
    }
    if (out_counts)
        for (int32_t i = 0; i < n; i++) out_counts[i] = 0;
    if (p.max_tokens == 0) return NOPAD_OK;

    gen_seq *g = calloc((size_t)n, sizeof *g);
    nopad_sequence **batch = malloc((size_t)n * sizeof *batch);
    int32_t *idx = malloc((size_t)n * sizeof *idx), *bcu = malloc(((size_t)n + 1) * sizeof *bcu);
    int32_t *btok = malloc((size_t)(cu[n] > n ? cu[n] : n) * sizeof *btok);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    nopad_sampling_params *bparams = malloc((size_t)n * sizeof *bparams);
    uint64_t *draws = malloc((size_t)n * sizeof *draws);
    if (!g || !batch || !idx || !bcu || !btok || !ids || !bparams || !draws)
        st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_generate: out of memory");
    for (int32_t i = 0; i < n && st == NOPAD_OK; i++) st = nopad_sequence_create(c, &g[i].seq);
    /* a sequence's first step feeds its prompt (a prompt longer than the workspace goes in chunks
     * on its own first), each later step its last token; prompts that do not fit in a step's
     * workspace wait for the next one */
    while (st == NOPAD_OK) {
        int32_t B = 0, T = 0;
        bcu[0] = 0;
        for (int32_t i = 0; i < n; i++) {
            if (g[i].done) continue;
            const int first = nopad_sequence_length(g[i].seq) == 0;
            const int32_t *src = first ? prompt + cu[i] : &g[i].last;
            const int32_t len = first ? cu[i + 1] - cu[i] : 1;
            if (first && len > c->dec.max_tokens) { /* a long prompt alone, chunk by chunk */
                for (int32_t off = 0; off < len - 1 && st == NOPAD_OK;) {
                    int32_t chunk = len - 1 - off < c->dec.max_tokens ? len - 1 - off : c->dec.max_tokens;
                    st = feed_locked(c, g[i].seq, src + off, chunk);
                    off += chunk;
                }
                src += len - 1;
                if (st != NOPAD_OK) break;
                if (T + 1 > c->dec.max_tokens) continue; /* its last token goes next step */
                btok[T] = *src;
                T += 1;
            } else {
                if (T + len > c->dec.max_tokens) continue; /* the next step takes it */
                memcpy(btok + T, src, (size_t)len * sizeof(int32_t));
                T += len;
            }
            batch[B] = g[i].seq;
            idx[B] = i;
            bparams[B] = p.sampling;
            draws[B] = (uint64_t)g[i].produced;
            bcu[++B] = T;
        }
        if (st != NOPAD_OK || B == 0) break;
        st = nopad_decode_sample(c, B, batch, bcu, btok, bparams, draws, ids, NULL);
        for (int32_t k = 0; k < B && st == NOPAD_OK; k++) {
            gen_seq *s = &g[idx[k]];
            const int32_t id = ids[k];
            s->last = id;
            if (out_tokens) out_tokens[(size_t)idx[k] * p.max_tokens + s->produced] = id;
            s->produced++;
            if (out_counts) out_counts[idx[k]] = s->produced;
            int stop = on_token ? on_token(user, idx[k], id) : 0;
            for (int32_t e = 0; e < cfg->n_eos && !p.ignore_eos; e++)
                if (id == cfg->eos_token_ids[e]) stop = 1;
            if (stop || s->produced >= p.max_tokens) {
                s->done = 1;
                nopad_sequence_free(s->seq); /* its blocks go back at once */
                s->seq = NULL;
            }
        }
    }
    for (int32_t i = 0; g && i < n; i++) nopad_sequence_free(g[i].seq);
    free(g);
    free(batch);
    free(idx);
    free(bcu);
    free(btok);
    free(ids);
    free(bparams);
    free(draws);
    return st;
}
