/* The engine: its thread runs
 *
 *   loop { take new requests (sleeping while there is nothing to do), end cancelled ones,
 *          plan step n+1 (scheduler.h), pack it and queue its forward (decoder_forward_launch)
 *          while step n still runs; wait for step n's ids and append each to its request; queue
 *          step n+1's sampling; deliver step n's ids while the device runs step n+1 (text, stop
 *          strings, callbacks; retire finished requests) }
 *
 * Step n+1 is planned before step n's ids are back: a request whose id is on its way brings it
 * as a placeholder that the device fills in from step n's sampling (decoder.h), so the device
 * need not wait for the host between steps. Only a decode-only step n+1 (a graph replay) is
 * queued before step n's ids are taken; one with prompt chunks takes them first (see
 * engine_main). Where the backend samples on the host (the CPU), the overlap gains nothing and by
 * default step n's ids are taken before step n+1 is planned (nopad_engine_params.overlap_steps).
 *
 * An id's own ends (a stop id, EOS, max_tokens) are judged when it arrives, so a request they end
 * is not planned again (a request whose coming id reaches max_tokens is not planned either); a
 * stop id, EOS or stop string may end a request that a launched step holds already, and that
 * step's id for it is dropped.
 *
 * over a context of its own, whose KV pool it manages through kv_blocks; and the public
 * functions that create it, submit to it, cancel in it, read its counters and free it. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/constraint.h"
#include "engine/kv_blocks.h"
#include "engine/mask_pool.h"
#include "engine/request_queue.h"
#include "engine/scheduler.h"
#include "model/model_internal.h"
#include "model/sampling.h"
#include "util/error.h"

enum { RATE_STEPS = 64 }; /* steps remembered for tokens_per_s */

/* A launched step until its ids are taken: the plan it runs and the arrays its output fills. */
typedef struct launched_step {
    sched_item *items;               // [R] the plan
    int32_t n, n_tokens;             // rows and tokens
    int32_t *ids;                    // [R] sampled
    float *logprobs;                 // [R] their log-probabilities (steps with a row asking)
    int32_t *top_ids;                // [R, n_top] each row's most likely ids (n_top: the step's
    float *top_lps;                  // largest top_logprobs) and their log-probabilities
    nopad_sampling_params *sampling; // [R]
    uint64_t *draws;                 // [R]
    const uint32_t **masks;          // [R] each row's allowed ids (a constrained request's), or NULL
    decoder_output out;
    double t_launch;                 // seconds (request_now)
} launched_step;

struct nopad_engine {
    nopad_model *model;
    nopad_context *ctx;
    nopad_engine_params params;
    const nopad_tokenizer *tok;
    /* constrained decoding: the vocabulary's token bytes as a trie, built at the first request
     * with a constraint (under trie_lock: submits may come from several threads) */
    grammar_token_trie *trie;
    mask_pool *mask_pool;               /* made with the trie where the host has cores to spare */
    grammar_mask_cache *mask_cache;     /* the masks every request's equal states share (with the trie) */
    pthread_mutex_t trie_lock;
    /* a step's constrained rows, for the mask workers: [R] each */
    grammar_matcher **mask_matchers;
    uint32_t **mask_bitmaps;
    int32_t *mask_rows;
    kv_blocks kv;
    request_queue queue;
    scheduler sched;
    pthread_t thread;
    int thread_started;

    /* a step's packed arrays, for max_running requests and max_step_tokens tokens (read before
     * its launch returns) */
    int32_t max_blocks;                 // blocks of one request at most (the model's context)
    int32_t *cu_q, *tokens, *seqlen_k;  // [R + 1], [T], [R]
    int32_t *table;                     // [R, max_blocks]
    int32_t *history, *cu_history;      // repetition penalty: [sum of histories], [R + 1]
    size_t history_cap;
    /* two launched steps at most: one whose ids are coming, one queued behind it */
    launched_step steps[2];
    int next_slot;                      // the one the next launch uses
    launched_step *in_flight;           // the step whose ids are coming, or NULL
    int overlap;                        // step n+1 is launched before step n's ids are taken
    double last_taken;                  // when the last step's ids were taken (step times)
    char *text;                         // a token's released text
    size_t text_len, text_cap;
    request **pending;                  // [R] requests whose newest id awaits delivery (a reference each)
    int32_t n_pending;

    /* counters, under stats_lock */
    pthread_mutex_t stats_lock;
    nopad_engine_stats stats;
    double rate_start[RATE_STEPS], rate_end[RATE_STEPS]; // the last steps' times
    int64_t rate_tokens[RATE_STEPS];                     // and ids delivered
    int64_t n_rate;
};

nopad_engine_params nopad_engine_default_params(void) {
    nopad_engine_params p = {.max_step_tokens = 2048, .max_running = 256, .kv_cache_tokens = 0,
                             .kv_block_size = 0, .max_queue = 1024, .prefix_sharing = 1,
                             .overlap_steps = -1};
    return p;
}

/* ---- the engine thread ---------------------------------------------------------------------- */

/* The request leaves the engine: blocks back to the pool, out of the lists, the engine's
 * reference dropped; while a launched step holds it, only the first two, the rest when that
 * step's ids are taken. (Its blocks may go to a request of a later step at once: the device runs
 * steps in order.) */
static void retire(nopad_engine *e, request *r) {
    scheduler_remove(&e->sched, r);
    if (r->in_step > 0) {
        r->ended = 1;
        return;
    }
    if (r->retired) return;
    r->retired = 1;
    request_queue_retire(&e->queue, r);
    pthread_mutex_lock(&e->stats_lock);
    e->stats.requests_finished++;
    pthread_mutex_unlock(&e->stats_lock);
    request_unref(r);
}

static void end_and_retire(nopad_engine *e, request *r, nopad_finish_reason finish,
                           nopad_status error) {
    if (!r->ended) request_end(r, finish, error); /* not twice: an ended one has its end */
    retire(e, r);
}

/* Ends every request in the engine, new ones included. */
static void end_all(nopad_engine *e, nopad_finish_reason finish, nopad_status error) {
    scheduler *s = &e->sched;
    while (s->running.n > 0) end_and_retire(e, s->running.items[s->running.n - 1], finish, error);
    while (s->waiting.n > 0) end_and_retire(e, s->waiting.items[s->waiting.n - 1], finish, error);
}

static void end_cancelled(nopad_engine *e) {
    request_list *lines[2] = {&e->sched.running, &e->sched.waiting};
    for (int k = 0; k < 2; k++)
        for (int32_t i = lines[k]->n; i-- > 0;)
            if (atomic_load(&lines[k]->items[i]->cancel))
                end_and_retire(e, lines[k]->items[i], NOPAD_FINISH_CANCELLED, NOPAD_OK);
}

static int append_text(nopad_engine *e, const char *text, size_t len) {
    if (e->text_len + len + 1 > e->text_cap) {
        size_t cap = e->text_cap ? e->text_cap : 256;
        while (cap < e->text_len + len + 1) cap *= 2;
        char *t = realloc(e->text, cap);
        if (!t) return -1;
        e->text = t;
        e->text_cap = cap;
    }
    memcpy(e->text + e->text_len, text, len);
    e->text_len += len;
    e->text[e->text_len] = '\0';
    return 0;
}

/* Whether r's newest id ends it by itself: a stop id, EOS (unless ignored), max_tokens reached. */
static nopad_finish_reason id_finish(const nopad_engine *e, const request *r) {
    const model_config *cfg = &e->model->cfg;
    const int32_t id = r->tokens[r->n_tokens - 1];
    for (int32_t k = 0; k < r->n_stop_ids; k++)
        if (id == r->stop_ids[k]) return NOPAD_FINISH_STOP;
    for (int32_t k = 0; k < cfg->n_eos && !r->ignore_eos; k++)
        if (id == cfg->eos_token_ids[k]) return NOPAD_FINISH_STOP;
    /* a whole document that admits nothing more (its EOS would be the only choice left) */
    if (r->matcher && grammar_matcher_is_accepting(r->matcher) && !grammar_matcher_can_continue(r->matcher))
        return NOPAD_FINISH_STOP;
    if (r->n_tokens - r->n_prompt == r->max_tokens) return NOPAD_FINISH_LENGTH;
    return NOPAD_FINISH_NONE;
}

/* The newest id of r is in r->tokens and `finish` is id_finish's judgement of it: its text
 * (e->text) and whether it ends the request, a stop string included (NOPAD_FINISH_ERROR with the
 * thread's message when its text ran out of memory). */
static nopad_finish_reason judge_token(nopad_engine *e, request *r, nopad_finish_reason finish) {
    const int32_t id = r->tokens[r->n_tokens - 1];
    e->text_len = 0;
    const char *piece = "", *out;
    size_t len = 0, out_len;
    /* ids past the tokenizer's vocabulary (a padded embedding) have no text */
    if (r->detok && id < nopad_tokenizer_vocab_size(e->tok) &&
        nopad_decode_stream_step(r->detok, id, &piece, &len) != NOPAD_OK) {
        piece = "";
        len = 0;
    }
    int hit = stop_text_add(&r->stop, piece, len, &out, &out_len);
    if (hit >= 0 && append_text(e, out, out_len)) hit = -1;
    if (hit == 1) finish = NOPAD_FINISH_STOP;
    if (finish != NOPAD_FINISH_NONE && hit == 0) {
        /* the end: what the decode stream and the stop strings held back comes out */
        if (r->detok && nopad_decode_stream_flush(r->detok, &piece, &len) == NOPAD_OK && len) {
            hit = stop_text_add(&r->stop, piece, len, &out, &out_len);
            if (hit >= 0 && append_text(e, out, out_len)) hit = -1;
        }
        if (hit == 0) {
            hit = stop_text_flush(&r->stop, &out, &out_len);
            if (hit >= 0 && append_text(e, out, out_len)) hit = -1;
        }
    }
    if (hit < 0) {
        nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "request %llu: out of memory for its text",
                        (unsigned long long)r->id);
        return NOPAD_FINISH_ERROR;
    }
    return finish;
}

/* Packs the planned step (s->step) into the step arrays: each request's new tokens, the id still
 * on its way from the step before as its placeholder (-1 - its row there). */
static decoder_batch pack_step(nopad_engine *e) {
    const scheduler *s = &e->sched;
    const int32_t B = s->n_step;
    int32_t max_blocks = 1, T = 0;
    e->cu_q[0] = 0;
    for (int32_t b = 0; b < B; b++) {
        const request *r = s->step[b].r;
        const int32_t n = s->step[b].n_new;
        for (int32_t i = 0; i < n; i++) {
            const int32_t p = r->n_computed + i;
            e->tokens[T + i] = p < r->n_tokens ? r->tokens[p] : -1 - r->inflight_row;
        }
        T += n;
        e->cu_q[b + 1] = T;
        e->seqlen_k[b] = r->n_computed + n;
        if (r->n_blocks > max_blocks) max_blocks = r->n_blocks;
    }
    for (int32_t b = 0; b < B; b++) {
        const request *r = s->step[b].r;
        int32_t *row = e->table + (size_t)b * max_blocks;
        memcpy(row, r->blocks, (size_t)r->n_blocks * sizeof *row);
        memset(row + r->n_blocks, 0, (size_t)(max_blocks - r->n_blocks) * sizeof *row);
    }
    return (decoder_batch){.n_seqs = B, .cu_q = e->cu_q, .tokens = e->tokens, .seqlen_k = e->seqlen_k,
                           .block_table = e->table, .max_blocks = max_blocks, .all_logits = 0};
}

/* What the sampling of launched step `l` reads, built once the step before's ids are in (they
 * set each row's draw index and its history): parameters, draw counters, histories where a
 * repetition penalty reads them. */
static nopad_status sampling_inputs(nopad_engine *e, launched_step *l) {
    size_t history = 0;
    int penalty = 0, want_logprobs = 0;
    int32_t n_top = 0, masked = 0;
    for (int32_t b = 0; b < l->n; b++) {
        const request *r = l->items[b].r;
        l->masks[b] = NULL;
        if (r->matcher && l->items[b].generates && !r->ended) {
            /* the ids before this one are in (the step before was taken): the matcher is there */
            e->mask_matchers[masked] = r->matcher;
            e->mask_bitmaps[masked] = r->mask;
            e->mask_rows[masked++] = b;
            l->masks[b] = r->mask;
        }
        l->sampling[b] = r->sampling;
        l->draws[b] = (uint64_t)(r->n_tokens - r->n_prompt); /* the index of the id it samples */
        penalty |= r->sampling.repetition_penalty != 1.0f || r->sampling.presence_penalty != 0.0f ||
                   r->sampling.frequency_penalty != 0.0f;
        want_logprobs |= r->logprobs != NULL;
        if (r->top_logprobs > n_top) n_top = r->top_logprobs;
        history += (size_t)l->items[b].computed_after;
    }
    if (masked) {
        const double t0 = request_now();
        int32_t empty = -1;
        if (e->mask_pool && masked > 1) {
            empty = mask_pool_run(e->mask_pool, e->mask_cache, e->mask_matchers, e->mask_bitmaps, masked);
        } else {
            for (int32_t j = 0; j < masked && empty < 0; j++)
                if (grammar_token_mask_shared(e->mask_cache, e->mask_matchers[j], e->mask_bitmaps[j]) == 0) empty = j;
        }
        const double ms = 1e3 * (request_now() - t0);
        pthread_mutex_lock(&e->stats_lock);
        e->stats.masks_built += masked;
        e->stats.mask_ms += ms;
        pthread_mutex_unlock(&e->stats_lock);
        if (empty >= 0) {
            const request *r = l->items[e->mask_rows[empty]].r;
            return nopad_set_error(NOPAD_ERR_INTERNAL, "request %llu: its constraint allows no next token "
                                   "after %d generated", (unsigned long long)r->id, r->n_tokens - r->n_prompt);
        }
    }
    l->out = (decoder_output){.ids = l->ids, .params = l->sampling, .draws = l->draws,
                              .logprobs = want_logprobs ? l->logprobs : NULL, .masks = masked ? l->masks : NULL,
                              .n_top = n_top, .top_ids = n_top ? l->top_ids : NULL,
                              .top_logprobs = n_top ? l->top_lps : NULL};
    if (!penalty) return NOPAD_OK;
    if (history > e->history_cap) {
        int32_t *h = realloc(e->history, history * sizeof *h);
        if (!h) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY,
                                       "engine step: out of memory for %zu history ids", history);
        e->history = h;
        e->history_cap = history;
    }
    /* each row's history: every id of its sequence up to and with this step's (all known now but
     * for a request that ended meanwhile, whose row is dropped) */
    e->cu_history[0] = 0;
    for (int32_t b = 0; b < l->n; b++) {
        const request *r = l->items[b].r;
        int32_t n = l->items[b].computed_after;
        if (n > r->n_tokens) n = r->n_tokens;
        memcpy(e->history + e->cu_history[b], r->tokens, (size_t)n * sizeof(int32_t));
        e->cu_history[b + 1] = e->cu_history[b] + n;
    }
    l->out.history = e->history;
    l->out.cu_history = e->cu_history;
    return NOPAD_OK;
}

static void note_step(nopad_engine *e, double t0, double t1, int64_t generated, int64_t computed) {
    pthread_mutex_lock(&e->stats_lock);
    nopad_engine_stats *st = &e->stats;
    st->steps++;
    st->tokens_generated += generated;
    st->prompt_tokens_computed += computed;
    st->last_step_ms = 1e3 * (t1 - t0);
    e->rate_start[e->n_rate % RATE_STEPS] = t0;
    e->rate_end[e->n_rate % RATE_STEPS] = t1;
    e->rate_tokens[e->n_rate % RATE_STEPS] = generated;
    e->n_rate++;
    pthread_mutex_unlock(&e->stats_lock);
}

/* Delivers the ids waiting in e->pending: text, stop strings, the reader's stream. A request that
 * ends here leaves (retire: at once, or when the launched step that holds it is taken, its id
 * there dropped). */
static void deliver_pending(nopad_engine *e) {
    for (int32_t i = 0; i < e->n_pending; i++) {
        request *r = e->pending[i];
        if (!r->retired && !r->ended) { /* else cancelled, or its step failed, since its id came */
            nopad_finish_reason finish = judge_token(e, r, r->ending);
            finish = request_deliver(r, e->text, e->text_len, finish, NOPAD_ERR_OUT_OF_MEMORY);
            if (finish != NOPAD_FINISH_NONE) retire(e, r);
        }
        request_unref(r);
    }
    e->n_pending = 0;
}

/* The requests of launched step `l` end with its error (st); the others go on. */
static void fail_step(nopad_engine *e, launched_step *l, nopad_status st) {
    nopad_wrap_error(st, "engine step of %d requests, %d tokens", l->n, l->n_tokens);
    for (int32_t b = 0; b < l->n; b++) {
        request *r = l->items[b].r;
        r->in_step--;
        if (l->items[b].generates) r->n_inflight--;
    }
    for (int32_t b = 0; b < l->n; b++) end_and_retire(e, l->items[b].r, NOPAD_FINISH_ERROR, st);
}

/* Packs the planned step and queues its forward behind the step in flight; NULL when there is
 * nothing to launch or the launch failed (its requests end with the error). */
static launched_step *launch_forward(nopad_engine *e) {
    scheduler *s = &e->sched;
    if (s->n_step == 0) return NULL;
    launched_step *l = &e->steps[e->next_slot];
    const decoder_batch batch = pack_step(e);
    pthread_mutex_lock(&e->ctx->lock);
    nopad_status st = tp_decoder_forward(e->ctx, &batch, 1); /* on every rank of a split model */
    pthread_mutex_unlock(&e->ctx->lock);
    if (st != NOPAD_OK) {
        /* nothing of it runs: the plan's blocks go back with the requests */
        nopad_wrap_error(st, "engine step of %d requests, %d tokens", s->n_step, s->n_step_tokens);
        for (int32_t b = 0; b < s->n_step; b++) end_and_retire(e, s->step[b].r, NOPAD_FINISH_ERROR, st);
        return NULL;
    }
    scheduler_launched(s);
    memcpy(l->items, s->step, (size_t)s->n_step * sizeof *l->items);
    l->n = s->n_step;
    l->n_tokens = s->n_step_tokens;
    l->t_launch = request_now();
    for (int32_t b = 0; b < l->n; b++) l->items[b].r->in_step++;
    e->next_slot ^= 1;
    return l;
}

/* Queues the sampling of launched step `l` (its forward queued, the step before taken); on
 * failure its requests end with the error and it is not in flight. */
static void launch_output(nopad_engine *e, launched_step *l) {
    nopad_status st = sampling_inputs(e, l);
    pthread_mutex_lock(&e->ctx->lock);
    if (st == NOPAD_OK)
        st = tp_decoder_output(e->ctx, &l->out);
    pthread_mutex_unlock(&e->ctx->lock);
    if (st != NOPAD_OK) {
        fail_step(e, l, st);
        return;
    }
    e->in_flight = l;
}

/* Waits for the step in flight and takes its ids: every request whose row generates gets its id
 * (appended; delivered by deliver_pending) and leaves the scheduler if the id ends it; rows of
 * requests that ended meanwhile are dropped. */
static void take_step(nopad_engine *e) {
    launched_step *l = e->in_flight;
    scheduler *s = &e->sched;
    e->in_flight = NULL;
    pthread_mutex_lock(&e->ctx->lock);
    nopad_status st = tp_decoder_wait(e->ctx, &l->out);
    if (st == NOPAD_OK) e->ctx->forwards++;
    pthread_mutex_unlock(&e->ctx->lock);
    if (st != NOPAD_OK) {
        fail_step(e, l, st);
        return;
    }
    const double now = request_now();
    /* a step's time: from its launch, or from the step before's end where it queued behind it */
    const double t0 = l->t_launch > e->last_taken ? l->t_launch : e->last_taken;
    e->last_taken = now;
    int64_t generated = 0, computed = 0;
    for (int32_t b = 0; b < l->n; b++) {
        const sched_item *it = &l->items[b];
        /* every token fed but a request's newest generated one is prompt (or recomputed) work */
        computed += it->n_new - (it->generates && it->computed_after > it->r->n_prompt);
    }
    scheduler_ran(s, l->items, l->n);
    for (int32_t b = 0; b < l->n; b++) {
        const sched_item *it = &l->items[b];
        request *r = it->r;
        r->in_step--;
        if (it->generates) r->n_inflight--;
        if (r->ended) { /* it ended while this step ran: the id is dropped */
            if (r->in_step == 0) retire(e, r);
            continue;
        }
        if (!it->generates) continue; /* a prompt chunk short of the end */
        const int32_t index = r->n_tokens - r->n_prompt; /* its place in the output */
        if (r->logprobs) r->logprobs[index] = l->logprobs[b]; /* before its id */
        if (r->top_ids) { /* the step's first top_logprobs of its n_top */
            const size_t k = (size_t)r->top_logprobs, n_top = (size_t)l->out.n_top;
            memcpy(r->top_ids + index * k, l->top_ids + b * n_top, k * sizeof *r->top_ids);
            memcpy(r->top_lps + index * k, l->top_lps + b * n_top, k * sizeof *r->top_lps);
        }
        r->tokens[r->n_tokens++] = l->ids[b];
        generated++;
        if (r->matcher && (!grammar_matcher_accept_token(r->matcher, e->trie, l->ids[b]) ||
                           grammar_matcher_commit(r->matcher) != NOPAD_OK)) {
            /* the mask allowed only ids the matcher takes: a broken invariant, not the model's */
            r->n_tokens--;
            end_and_retire(e, r, NOPAD_FINISH_ERROR,
                           nopad_set_error(NOPAD_ERR_INTERNAL, "request %llu: id %d was sampled under its "
                                           "constraint's mask but the constraint refuses it",
                                           (unsigned long long)r->id, l->ids[b]));
            continue;
        }
        r->ending = id_finish(e, r);
        if (r->ending != NOPAD_FINISH_NONE) scheduler_remove(s, r); /* its blocks back before the next plan */
        request_ref(r);
        e->pending[e->n_pending++] = r;
    }
    note_step(e, t0, now, generated, computed);
}

static void note_lines(nopad_engine *e) {
    pthread_mutex_lock(&e->stats_lock);
    nopad_engine_stats *st = &e->stats;
    st->running = e->sched.running.n;
    st->waiting = e->sched.waiting.n;
    st->kv_blocks_used = e->kv.n_used;
    st->kv_blocks_cached = e->kv.n_cached;
    st->prompt_tokens_shared = e->sched.tokens_shared;
    st->preemptions = e->sched.preemptions;
    pthread_mutex_unlock(&e->stats_lock);
}

static void *engine_main(void *arg) {
    nopad_engine *e = arg;
    scheduler *s = &e->sched;
    request_list arrivals = {0};
    for (;;) {
        const int idle = s->running.n == 0 && s->waiting.n == 0 && e->n_pending == 0 && !e->in_flight;
        const int closed = request_queue_take(&e->queue, &arrivals, idle);
        for (int32_t i = 0; i < arrivals.n; i++)
            if (scheduler_add(s, arrivals.items[i]) != NOPAD_OK) {
                request_end(arrivals.items[i], NOPAD_FINISH_ERROR, NOPAD_ERR_OUT_OF_MEMORY);
                request_queue_retire(&e->queue, arrivals.items[i]);
                request_unref(arrivals.items[i]);
            }
        arrivals.n = 0;
        if (closed) {
            if (e->in_flight) take_step(e);
            deliver_pending(e);
            end_all(e, NOPAD_FINISH_CANCELLED, NOPAD_OK);
            note_lines(e);
            break;
        }
        end_cancelled(e);
        if (e->in_flight && !e->overlap) {
            take_step(e);
            deliver_pending(e);
        }
        scheduler_plan(s);
        note_lines(e);
        /* a step with prompt chunks is launched op by op, a millisecond or more of host time
         * (a decode-only step replays its graph in microseconds): the ids of the step before,
         * first tokens among them, are not held back for that */
        if (e->in_flight && s->n_step_tokens > s->n_step) {
            take_step(e);
            deliver_pending(e);
            scheduler_prune(s); /* the requests those ids ended */
        }
        launched_step *next = launch_forward(e);
        if (e->in_flight) take_step(e); /* step n's ids, while step n+1 queues behind it */
        if (next) launch_output(e, next);
        deliver_pending(e); /* while the device runs step n+1 */
        note_lines(e);
    }
    request_list_free(&arrivals);
    return NULL;
}

/* ---- the public functions ------------------------------------------------------------------- */

static void engine_destroy(nopad_engine *e) {
    scheduler_free(&e->sched);
    kv_blocks_free(&e->kv);
    request_queue_destroy(&e->queue);
    nopad_context_free(e->ctx);
    pthread_mutex_destroy(&e->stats_lock);
    mask_pool_free(e->mask_pool);
    grammar_mask_cache_free(e->mask_cache);
    grammar_token_trie_free(e->trie);
    pthread_mutex_destroy(&e->trie_lock);
    free(e->mask_matchers);
    free(e->mask_bitmaps);
    free(e->mask_rows);
    free(e->cu_q);
    free(e->tokens);
    free(e->seqlen_k);
    free(e->table);
    for (int k = 0; k < 2; k++) {
        free(e->steps[k].items);
        free(e->steps[k].ids);
        free(e->steps[k].logprobs);
        free(e->steps[k].top_ids);
        free(e->steps[k].top_lps);
        free(e->steps[k].sampling);
        free(e->steps[k].draws);
        free(e->steps[k].masks);
    }
    free(e->history);
    free(e->cu_history);
    free(e->text);
    free(e->pending);
    free(e);
}

nopad_status nopad_engine_create(nopad_model *model, const nopad_engine_params *params,
                                 nopad_engine **out) {
    static const char fn[] = "nopad_engine_create";
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    *out = NULL;
    if (!model) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: model is NULL", fn);
    if (!model->cfg.causal)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: %s is an encoder; the engine runs decoders (gpt2, llama, "
                               "mistral, qwen2)",
                               fn, model->cfg.model_type);
    nopad_engine_params p = params ? *params : nopad_engine_default_params();
    if (p.max_step_tokens < 1 || p.max_running < 1 || p.max_queue < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: max_step_tokens %d, max_running %d and max_queue %d must each "
                               "be >= 1",
                               fn, p.max_step_tokens, p.max_running, p.max_queue);
    /* every running request brings at least one token a step */
    if (p.max_running > p.max_step_tokens) p.max_running = p.max_step_tokens;

    nopad_engine *e = calloc(1, sizeof *e);
    if (!e) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    e->model = model;
    e->tok = nopad_model_tokenizer(model);
    pthread_mutex_init(&e->stats_lock, NULL);
    pthread_mutex_init(&e->trie_lock, NULL);
    request_queue_init(&e->queue, p.max_queue);
    nopad_context_params cp = nopad_context_default_params();
    cp.max_batch_tokens = p.max_step_tokens;
    cp.kv_cache_tokens = p.kv_cache_tokens;
    cp.kv_block_size = p.kv_block_size;
    nopad_status st = nopad_context_create(model, &cp, &e->ctx);
    if (st == NOPAD_OK) {
        decoder_state *d = &e->ctx->dec;
        p.kv_cache_tokens = d->n_blocks * d->block_size;
        p.kv_block_size = d->block_size;
        /* the engine hands out the context's blocks itself: none is left on the context's stack */
        d->n_free = 0;
        st = kv_blocks_init(&e->kv, d->n_blocks, d->block_size);
    }
    e->params = p;
    if (st == NOPAD_OK)
        st = scheduler_init(&e->sched, &e->kv, &e->queue, p.max_step_tokens, p.max_running,
                            p.prefix_sharing);
    if (st == NOPAD_OK) {
        const size_t R = (size_t)p.max_running;
        e->max_blocks = (model->cfg.max_position_embeddings + p.kv_block_size - 1) / p.kv_block_size;
        e->cu_q = malloc((R + 1) * sizeof *e->cu_q);
        e->tokens = malloc((size_t)p.max_step_tokens * sizeof *e->tokens);
        e->seqlen_k = malloc(R * sizeof *e->seqlen_k);
        e->table = malloc(R * (size_t)e->max_blocks * sizeof *e->table);
        e->cu_history = malloc((R + 1) * sizeof *e->cu_history);
        e->pending = malloc(R * sizeof *e->pending);
        e->mask_matchers = malloc(R * sizeof *e->mask_matchers);
        e->mask_bitmaps = malloc(R * sizeof *e->mask_bitmaps);
        e->mask_rows = malloc(R * sizeof *e->mask_rows);
        int ok = e->cu_q && e->tokens && e->seqlen_k && e->table && e->cu_history && e->pending &&
                 e->mask_matchers && e->mask_bitmaps && e->mask_rows;
        for (int k = 0; k < 2; k++) {
            launched_step *l = &e->steps[k];
            l->items = malloc(R * sizeof *l->items);
            l->ids = malloc(R * sizeof *l->ids);
            l->logprobs = malloc(R * sizeof *l->logprobs);
            l->top_ids = malloc(R * NOPAD_MAX_TOP_LOGPROBS * sizeof *l->top_ids);
            l->top_lps = malloc(R * NOPAD_MAX_TOP_LOGPROBS * sizeof *l->top_lps);
            l->sampling = malloc(R * sizeof *l->sampling);
            l->draws = malloc(R * sizeof *l->draws);
            l->masks = malloc(R * sizeof *l->masks);
            ok = ok && l->items && l->ids && l->logprobs && l->top_ids && l->top_lps && l->sampling && l->draws &&
                 l->masks;
        }
        if (!ok) st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        /* the overlap pays where the device samples while the host goes on; on a backend that
         * samples on the host it would only hold each id back by a step */
        e->overlap = p.overlap_steps < 0 ? e->ctx->be->sample_begin != NULL : p.overlap_steps != 0;
    }
    e->stats.kv_blocks_total = e->kv.n_blocks;
    e->stats.kv_block_size = e->kv.block_size;
    if (st == NOPAD_OK) {
        if (pthread_create(&e->thread, NULL, engine_main, e) != 0)
            st = nopad_set_error(NOPAD_ERR_INTERNAL, "%s: could not start the engine thread", fn);
        else
            e->thread_started = 1;
    }
    if (st != NOPAD_OK) {
        engine_destroy(e);
        return st;
    }
    *out = e;
    return NOPAD_OK;
}

void nopad_engine_free(nopad_engine *e) {
    if (!e) return;
    request_queue_close(&e->queue);
    if (e->thread_started) pthread_join(e->thread, NULL);
    engine_destroy(e);
}

/* The prompt of p as ids in *ids (malloc'ed), checked against the model. */
static nopad_status prompt_ids(const nopad_engine *e, const nopad_request_params *p, int32_t **ids,
                               int32_t *n) {
    static const char fn[] = "nopad_engine_submit";
    *ids = NULL;
    *n = 0;
    const model_config *cfg = &e->model->cfg;
    if ((p->prompt_ids != NULL) == (p->prompt_text != NULL))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: give the prompt as prompt_ids or as prompt_text (%s)", fn,
                               p->prompt_ids ? "both are set" : "neither is set");
    if (p->prompt_ids) {
        if (p->n_prompt_ids < 1)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "%s: the prompt is empty (n_prompt_ids %d; at least 1 id)", fn,
                                   p->n_prompt_ids);
        for (int32_t i = 0; i < p->n_prompt_ids; i++)
            if (p->prompt_ids[i] < 0 || p->prompt_ids[i] >= cfg->vocab_size)
                return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                       "%s: prompt id %d is %d, outside the vocabulary [0, %d)",
                                       fn, i, p->prompt_ids[i], cfg->vocab_size);
        *ids = malloc((size_t)p->n_prompt_ids * sizeof **ids);
        if (!*ids) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        memcpy(*ids, p->prompt_ids, (size_t)p->n_prompt_ids * sizeof **ids);
        *n = p->n_prompt_ids;
        return NOPAD_OK;
    }
    if (!e->tok)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: prompt_text needs a tokenizer and the model has none; give "
                               "prompt_ids",
                               fn);
    const nopad_tokenize_params tp = nopad_tokenize_default_params();
    const size_t len = strlen(p->prompt_text);
    int32_t need = 0;
    nopad_status st = nopad_tokenize(e->tok, p->prompt_text, len, &tp, NULL, 0, &need);
    if (st != NOPAD_OK && st != NOPAD_ERR_BUFFER_TOO_SMALL) return nopad_wrap_error(st, "%s: prompt_text", fn);
    if (need < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: the prompt is empty (prompt_text of %zu bytes gives no ids)",
                               fn, len);
    *ids = malloc((size_t)need * sizeof **ids);
    if (!*ids) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    st = nopad_tokenize(e->tok, p->prompt_text, len, &tp, *ids, need, n);
    if (st != NOPAD_OK) {
        free(*ids);
        *ids = NULL;
        return nopad_wrap_error(st, "%s: prompt_text", fn);
    }
    return NOPAD_OK;
}

/* A constrained request needs the vocabulary's trie (built once, here) and one process's
 * sampling: a split model's ranks would each need the masks. */
static nopad_status constraint_ready(nopad_engine *e, const char *fn) {
    if (!e->tok)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: a constraint needs the model's tokenizer (its "
                               "tokens' bytes) and the model has none", fn);
    if (e->model->comm)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: constrained decoding on a model split over %d ranks "
                               "is not supported yet", fn, e->model->tp.size);
    pthread_mutex_lock(&e->trie_lock);
    nopad_status st = NOPAD_OK;
    if (!e->trie) {
        const model_config *cfg = &e->model->cfg;
        st = grammar_token_trie_from_tokenizer(e->tok, cfg->eos_token_ids, cfg->n_eos, &e->trie);
        if (st != NOPAD_OK) st = nopad_wrap_error(st, "%s: the vocabulary's trie for constrained decoding", fn);
        else if (grammar_token_trie_vocab_size(e->trie) > cfg->vocab_size) {
            /* the masks hold the model's vocabulary: a larger tokenizer's would not fit them */
            st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: the tokenizer has %d tokens, the model's "
                                 "vocabulary %d", fn, grammar_token_trie_vocab_size(e->trie), cfg->vocab_size);
            grammar_token_trie_free(e->trie);
            e->trie = NULL;
        }
        /* 512 states: a schema's structural states, and a bounded string's every count, for the
         * requests under way (SmolLM2: 3 MB of masks) */
        if (st == NOPAD_OK && (st = grammar_mask_cache_create(e->trie, 512, &e->mask_cache)) != NOPAD_OK) {
            grammar_token_trie_free(e->trie);
            e->trie = NULL;
        }
    }
    /* the host's spare cores build a step's masks side by side: up to 8 threads with the engine's */
    if (st == NOPAD_OK && !e->mask_pool) {
        /* 7: 14 built a step's masks no faster on a 16-core host (docs/grammar.md) */
        const long cores = sysconf(_SC_NPROCESSORS_ONLN);
        const int workers = cores > 8 ? 7 : (int)cores - 1;
        if (workers >= 1 && (st = mask_pool_create(workers, &e->mask_pool)) != NOPAD_OK)
            st = nopad_wrap_error(st, "%s: the constraint masks' workers", fn);
    }
    pthread_mutex_unlock(&e->trie_lock);
    return st;
}

/* top_logprobs in range. It and logit_bias need one process's sampling: a split model's ranks
 * would each need the pairs, and its greedy merge keeps no top ids. */
static nopad_status sampling_extras_ready(const nopad_engine *e, const nopad_request_params *p, const char *fn) {
    if (p->top_logprobs < 0 || p->top_logprobs > NOPAD_MAX_TOP_LOGPROBS)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: top_logprobs is %d; it must be in [0, %d]", fn,
                               p->top_logprobs, NOPAD_MAX_TOP_LOGPROBS);
    if (e->model->comm && (p->top_logprobs > 0 || p->sampling.n_logit_bias > 0))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: %s on a model split over %d ranks is not supported yet",
                               fn, p->top_logprobs > 0 ? "top_logprobs" : "logit_bias", e->model->tp.size);
    return NOPAD_OK;
}

nopad_status nopad_engine_submit(nopad_engine *e, const nopad_request_params *p,
                                 nopad_request **out) {
    static const char fn[] = "nopad_engine_submit";
    if (out) *out = NULL;
    if (!e || !p || !out)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: engine, params and out must not be NULL", fn);
    const model_config *cfg = &e->model->cfg;
    if (p->max_tokens < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: max_tokens is %d (at least 1)", fn,
                               p->max_tokens);
    if (p->n_stop_ids < 0 || (p->n_stop_ids > 0 && !p->stop_ids) || p->n_stop_strings < 0 ||
        (p->n_stop_strings > 0 && !p->stop_strings))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: %d stop ids at %p and %d stop strings at %p (counts >= 0, "
                               "arrays for counts > 0)",
                               fn, p->n_stop_ids, (const void *)p->stop_ids, p->n_stop_strings,
                               (const void *)p->stop_strings);
    if (p->n_stop_strings > 0 && !e->tok)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: stop strings need a tokenizer and the model has none; use "
                               "stop_ids",
                               fn);
    nopad_status st = sampling_check_vocab(&p->sampling, cfg->vocab_size);
    if (st != NOPAD_OK) return nopad_wrap_error(st, "%s", fn);
    if ((st = sampling_extras_ready(e, p, fn)) != NOPAD_OK) return st;
    if (p->constraint && (st = constraint_ready(e, fn)) != NOPAD_OK) return st;
    int32_t *prompt, n_prompt;
    st = prompt_ids(e, p, &prompt, &n_prompt);
    if (st != NOPAD_OK) return st;
    /* the last generated id is never fed back, so the KV holds one token less than the total */
    const int64_t total = (int64_t)n_prompt + p->max_tokens;
    const int64_t blocks = (total - 1 + e->kv.block_size - 1) / e->kv.block_size;
    if (total > cfg->max_position_embeddings)
        st = nopad_set_error(NOPAD_ERR_TOO_LONG,
                             "%s: prompt of %d ids + max_tokens %d exceeds the model's context "
                             "of %d",
                             fn, n_prompt, p->max_tokens, cfg->max_position_embeddings);
    else if (blocks > e->kv.n_blocks)
        st = nopad_set_error(NOPAD_ERR_TOO_LONG,
                             "%s: prompt of %d ids + max_tokens %d needs %lld KV blocks of %d "
                             "tokens, the engine's whole pool holds %d (kv_cache_tokens %d); it "
                             "could never run",
                             fn, n_prompt, p->max_tokens, (long long)blocks, e->kv.block_size,
                             e->kv.n_blocks, e->params.kv_cache_tokens);
    request *r = NULL;
    if (st == NOPAD_OK)
        st = request_create(p, prompt, n_prompt, e->kv.block_size, e->tok,
                            request_queue_next_id(&e->queue), &r);
    free(prompt);
    if (st == NOPAD_OK && r->matcher) {
        /* the model's whole vocabulary: ids past the tokenizer's (a padded embedding) stay 0 */
        r->mask = calloc((size_t)(cfg->vocab_size + 31) / 32, sizeof *r->mask);
        if (!r->mask) {
            request_unref(r);
            request_unref(r);
            r = NULL;
            st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        }
    }
    if (st == NOPAD_OK) {
        st = request_queue_push(&e->queue, r);
        if (st != NOPAD_OK) { /* never seen by the engine: both references go */
            request_unref(r);
            request_unref(r);
            r = NULL;
        }
    }
    *out = r;
    return st;
}

nopad_status nopad_engine_cancel(nopad_engine *e, uint64_t request_id) {
    if (!e) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_engine_cancel: engine is NULL");
    if (!request_queue_cancel(&e->queue, request_id))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_engine_cancel: no request with id %llu is in flight (never "
                               "submitted to this engine, or already ended)",
                               (unsigned long long)request_id);
    return NOPAD_OK;
}

nopad_status nopad_engine_get_stats(nopad_engine *e, nopad_engine_stats *out) {
    if (!e || !out)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_engine_get_stats: engine or out is NULL");
    const int32_t incoming = request_queue_incoming(&e->queue);
    const double now = request_now();
    pthread_mutex_lock(&e->stats_lock);
    *out = e->stats;
    out->waiting += incoming;
    out->tokens_per_s = 0;
    const int64_t n = e->n_rate < RATE_STEPS ? e->n_rate : RATE_STEPS;
    const double t_end = n ? e->rate_end[(e->n_rate - 1) % RATE_STEPS] : 0;
    if (n > 0 && now - t_end < 1.0) { /* over the remembered steps, idle gaps included */
        const double t_start = e->rate_start[(e->n_rate - n) % RATE_STEPS];
        int64_t tokens = 0;
        for (int64_t i = 0; i < n; i++) tokens += e->rate_tokens[i];
        if (t_end > t_start) out->tokens_per_s = (double)tokens / (t_end - t_start);
    }
    pthread_mutex_unlock(&e->stats_lock);
    return NOPAD_OK;
}
