/* Requests: the copy of what was asked, and the stream of results between the engine thread
 * (request_deliver, request_end) and the caller (nopad_request_read, nopad_request_text, ...). */
#include "engine/request.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/constraint.h"
#include "util/error.h"

double request_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double ms_since_submit(const request *r) { return 1e3 * (request_now() - r->submit_time); }

nopad_request_params nopad_request_default_params(void) {
    nopad_request_params p = {.max_tokens = 128, .sampling = nopad_sampling_default_params()};
    return p;
}

const char *nopad_finish_reason_name(nopad_finish_reason finish) {
    switch (finish) {
    case NOPAD_FINISH_NONE: return "none";
    case NOPAD_FINISH_LENGTH: return "length";
    case NOPAD_FINISH_STOP: return "stop";
    case NOPAD_FINISH_CANCELLED: return "cancelled";
    case NOPAD_FINISH_ERROR: return "error";
    }
    return "unknown";
}

static void request_destroy(request *r) {
    if (!r) return;
    free(r->tokens);
    free(r->logprobs);
    free(r->top_ids);
    free(r->top_lps);
    free(r->logit_bias);
    free(r->blocks);
    free(r->block_hashes);
    free(r->stop_ids);
    grammar_matcher_free(r->matcher);
    free(r->mask);
    constraint_unref(r->constraint);
    nopad_decode_stream_free(r->detok);
    stop_text_free(&r->stop);
    free(r->text);
    free(r->error_message);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->changed);
    free(r);
}

nopad_status request_create(const nopad_request_params *p, const int32_t *prompt, int32_t n_prompt,
                            int32_t block_size, const nopad_tokenizer *tok, uint64_t id,
                            request **out) {
    *out = NULL;
    request *r = calloc(1, sizeof *r);
    if (!r) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_engine_submit: out of memory");
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->changed, NULL);
    r->id = id;
    r->submit_time = request_now();
    r->n_prompt = n_prompt;
    r->max_tokens = p->max_tokens;
    r->ignore_eos = p->ignore_eos;
    r->sampling = p->sampling;
    r->on_token = p->on_token;
    r->user = p->user;
    r->refs = 2;
    r->admitted_ms = r->first_token_ms = r->finished_ms = -1;
    const size_t cap = (size_t)n_prompt + (size_t)p->max_tokens;
    const size_t max_blocks = (cap + (size_t)block_size - 1) / (size_t)block_size;
    r->tokens = malloc(cap * sizeof *r->tokens);
    r->blocks = malloc(max_blocks * sizeof *r->blocks);
    r->block_hashes = malloc(max_blocks * sizeof *r->block_hashes);
    r->stop_ids = malloc(((size_t)p->n_stop_ids + 1) * sizeof *r->stop_ids);
    if (p->logprobs) r->logprobs = calloc((size_t)p->max_tokens, sizeof *r->logprobs);
    const size_t k = (size_t)p->top_logprobs, n_bias = (size_t)p->sampling.n_logit_bias;
    r->top_logprobs = p->top_logprobs;
    if (k) {
        r->top_ids = malloc((size_t)p->max_tokens * k * sizeof *r->top_ids);
        r->top_lps = malloc((size_t)p->max_tokens * k * sizeof *r->top_lps);
    }
    /* the caller's pairs may go once submit returns */
    if (n_bias) {
        r->logit_bias = malloc(n_bias * sizeof *r->logit_bias);
        if (r->logit_bias) memcpy(r->logit_bias, p->sampling.logit_bias, n_bias * sizeof *r->logit_bias);
    }
    r->sampling.logit_bias = r->logit_bias;
    nopad_status st = NOPAD_OK;
    if (!r->tokens || !r->blocks || !r->block_hashes || !r->stop_ids || (p->logprobs && !r->logprobs) ||
        (k && (!r->top_ids || !r->top_lps)) || (n_bias && !r->logit_bias))
        st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_engine_submit: out of memory");
    if (st == NOPAD_OK) {
        memcpy(r->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
        r->n_tokens = n_prompt;
        if (p->n_stop_ids) memcpy(r->stop_ids, p->stop_ids, (size_t)p->n_stop_ids * sizeof *p->stop_ids);
        r->n_stop_ids = p->n_stop_ids;
        st = stop_text_init(&r->stop, p->stop_strings, p->n_stop_strings);
        if (st != NOPAD_OK) st = nopad_wrap_error(st, "nopad_engine_submit");
    }
    if (st == NOPAD_OK && tok) st = nopad_decode_stream_create(tok, 1, &r->detok);
    if (st == NOPAD_OK && p->constraint) {
        constraint_ref(p->constraint);
        r->constraint = p->constraint;
        st = grammar_matcher_create(constraint_grammar(p->constraint), &r->matcher);
    }
    if (st != NOPAD_OK) {
        request_destroy(r);
        return st;
    }
    *out = r;
    return NOPAD_OK;
}

void request_ref(request *r) {
    pthread_mutex_lock(&r->lock);
    r->refs++;
    pthread_mutex_unlock(&r->lock);
}

void request_unref(request *r) {
    pthread_mutex_lock(&r->lock);
    const int last = --r->refs == 0;
    pthread_mutex_unlock(&r->lock);
    if (last) request_destroy(r);
}

/* ---- the engine thread's side --------------------------------------------------------------- */

/* Room for len more bytes of text and its NUL (the engine thread alone writes the text). */
static int reserve_text(request *r, size_t len) {
    if (r->text_len + len + 1 <= r->text_cap) return 0;
    size_t cap = r->text_cap ? r->text_cap : 256;
    while (cap < r->text_len + len + 1) cap *= 2;
    pthread_mutex_lock(&r->lock);
    char *t = realloc(r->text, cap);
    if (t) {
        r->text = t;
        r->text_cap = cap;
    }
    pthread_mutex_unlock(&r->lock);
    return t ? 0 : -1;
}

/* Keeps an error's status and the thread's last message for the reader. */
static void note_error(request *r, nopad_status error) {
    char *message = strdup(nopad_last_error());
    pthread_mutex_lock(&r->lock);
    r->error = error;
    free(r->error_message);
    r->error_message = message;
    pthread_mutex_unlock(&r->lock);
}

/* Marks the end (under the lock); the decode stream is done with. */
static void finish_locked(request *r, nopad_finish_reason finish) {
    r->finish = finish;
    r->finished_ms = ms_since_submit(r);
    nopad_decode_stream_free(r->detok);
    r->detok = NULL;
}

/* Readers see the id and the end before on_token runs: when the call with the end comes, the
 * request's stats and text already show it. */
nopad_finish_reason request_deliver(request *r, const char *text, size_t text_len,
                                    nopad_finish_reason finish, nopad_status error) {
    const int32_t token = r->tokens[r->n_tokens - 1];
    if (reserve_text(r, text_len) != 0) { /* the id still arrives; the request ends, saying why */
        finish = NOPAD_FINISH_ERROR;
        error = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "request %llu: out of memory for its text",
                                (unsigned long long)r->id);
        text = "";
        text_len = 0;
    }
    if (finish == NOPAD_FINISH_ERROR) note_error(r, error);
    pthread_mutex_lock(&r->lock);
    r->n_delivered = r->n_tokens - r->n_prompt;
    if (r->first_token_ms < 0) r->first_token_ms = ms_since_submit(r);
    memcpy(r->text + r->text_len, text, text_len);
    r->text_len += text_len;
    r->text[r->text_len] = '\0';
    if (finish != NOPAD_FINISH_NONE) finish_locked(r, finish);
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
    if (r->on_token) r->on_token(r->user, r->id, token, text, finish);
    return finish;
}

void request_end(request *r, nopad_finish_reason finish, nopad_status error) {
    if (finish == NOPAD_FINISH_ERROR) note_error(r, error);
    pthread_mutex_lock(&r->lock);
    finish_locked(r, finish);
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
    if (r->on_token) r->on_token(r->user, r->id, -1, "", finish);
}

void request_note_admitted(request *r, int32_t prompt_shared) {
    pthread_mutex_lock(&r->lock);
    if (r->admitted_ms < 0) {
        r->admitted_ms = ms_since_submit(r);
        r->prompt_shared = prompt_shared < r->n_prompt ? prompt_shared : r->n_prompt;
    }
    pthread_mutex_unlock(&r->lock);
}

void request_note_preempted(request *r) {
    pthread_mutex_lock(&r->lock);
    r->preemptions++;
    pthread_mutex_unlock(&r->lock);
}

/* ---- the caller's side ---------------------------------------------------------------------- */

nopad_status nopad_request_read(nopad_request *r, int32_t *ids, int32_t capacity, int32_t *n_ids,
                                nopad_finish_reason *finish, int32_t timeout_ms) {
    if (n_ids) *n_ids = 0;
    if (finish) *finish = NOPAD_FINISH_NONE;
    if (!r || !n_ids || !finish || capacity < 0 || (capacity > 0 && !ids))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_request_read: need a request, ids[capacity >= 0], n_ids and "
                               "finish (got %s%s%s, capacity %d)",
                               r ? "" : "no request ", n_ids ? "" : "no n_ids ",
                               finish ? "" : "no finish ", capacity);
    struct timespec deadline;
    if (timeout_ms > 0) {
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&r->lock);
    while (r->n_read == r->n_delivered && r->finish == NOPAD_FINISH_NONE && timeout_ms != 0) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&r->changed, &r->lock);
        } else if (pthread_cond_timedwait(&r->changed, &r->lock, &deadline) == ETIMEDOUT) {
            break;
        }
    }
    int32_t n = r->n_delivered - r->n_read;
    if (n > capacity) n = capacity;
    if (n > 0) memcpy(ids, r->tokens + r->n_prompt + r->n_read, (size_t)n * sizeof *ids);
    r->n_read += n;
    *n_ids = n;
    nopad_status st = NOPAD_OK;
    if (r->n_read == r->n_delivered && r->finish != NOPAD_FINISH_NONE) {
        *finish = r->finish;
        if (r->finish == NOPAD_FINISH_ERROR)
            st = nopad_set_error(r->error, "request %llu: %s", (unsigned long long)r->id,
                                 r->error_message ? r->error_message : "the step failed");
    }
    pthread_mutex_unlock(&r->lock);
    return st;
}

nopad_status nopad_request_text(nopad_request *r, char *text, size_t capacity, size_t *text_len) {
    if (!r || !text_len || (capacity > 0 && !text))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_request_text: need a request, text[capacity] and text_len");
    pthread_mutex_lock(&r->lock);
    const size_t len = r->text_len;
    *text_len = len;
    nopad_status st = NOPAD_OK;
    if (capacity > len) {
        if (len) memcpy(text, r->text, len);
        text[len] = '\0';
    } else {
        st = nopad_set_error(NOPAD_ERR_BUFFER_TOO_SMALL,
                             "nopad_request_text: the text is %zu bytes, capacity %zu holds it "
                             "without its NUL",
                             len, capacity);
    }
    pthread_mutex_unlock(&r->lock);
    return st;
}

/* Ids [first, first + min(capacity, delivered - first)) of a request's per-id records. */
static int32_t range_count(int32_t delivered, int32_t first, int32_t capacity) {
    const int32_t avail = delivered > first ? delivered - first : 0;
    return avail < capacity ? avail : capacity;
}

static nopad_status logprobs_from(nopad_request *r, int32_t first, float *out, int32_t capacity, int32_t *n,
                                  const char *fn) {
    if (!r || !n || first < 0 || capacity < 0 || (capacity > 0 && !out))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: need a request, first >= 0, out[capacity >= 0] "
                               "and n", fn);
    if (!r->logprobs)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: request %llu was submitted without logprobs", fn,
                               (unsigned long long)r->id);
    pthread_mutex_lock(&r->lock);
    const int32_t delivered = r->n_delivered;
    /* out may be NULL with capacity 0 (a caller asking for the count only): memcpy must not see it */
    const int32_t n_copy = range_count(delivered, first, capacity);
    if (n_copy > 0) memcpy(out, r->logprobs + first, (size_t)n_copy * sizeof *out);
    pthread_mutex_unlock(&r->lock);
    *n = delivered;
    return NOPAD_OK;
}

nopad_status nopad_request_logprobs(nopad_request *r, float *out, int32_t capacity, int32_t *n) {
    return logprobs_from(r, 0, out, capacity, n, "nopad_request_logprobs");
}

nopad_status nopad_request_logprobs_from(nopad_request *r, int32_t first, float *out, int32_t capacity,
                                         int32_t *n) {
    return logprobs_from(r, first, out, capacity, n, "nopad_request_logprobs_from");
}

static nopad_status top_logprobs_from(nopad_request *r, int32_t first, int32_t *ids, float *logprobs,
                                      int32_t capacity, int32_t *n, const char *fn) {
    if (!r || !n || first < 0 || capacity < 0 || (capacity > 0 && (!ids || !logprobs)))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: need a request, first >= 0, ids and logprobs "
                               "[capacity * top_logprobs] (capacity >= 0) and n", fn);
    if (!r->top_ids)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: request %llu was submitted with top_logprobs 0", fn,
                               (unsigned long long)r->id);
    pthread_mutex_lock(&r->lock);
    const int32_t delivered = r->n_delivered;
    const int32_t n_copy = range_count(delivered, first, capacity);
    const size_t k = (size_t)r->top_logprobs, entries = (size_t)(n_copy > 0 ? n_copy : 0) * k;
    if (entries) {
        memcpy(ids, r->top_ids + (size_t)first * k, entries * sizeof *ids);
        memcpy(logprobs, r->top_lps + (size_t)first * k, entries * sizeof *logprobs);
    }
    pthread_mutex_unlock(&r->lock);
    *n = delivered;
    return NOPAD_OK;
}

nopad_status nopad_request_top_logprobs(nopad_request *r, int32_t *ids, float *logprobs, int32_t capacity,
                                        int32_t *n) {
    return top_logprobs_from(r, 0, ids, logprobs, capacity, n, "nopad_request_top_logprobs");
}

nopad_status nopad_request_top_logprobs_from(nopad_request *r, int32_t first, int32_t *ids, float *logprobs,
                                             int32_t capacity, int32_t *n) {
    return top_logprobs_from(r, first, ids, logprobs, capacity, n, "nopad_request_top_logprobs_from");
}

uint64_t nopad_request_id(const nopad_request *r) { return r ? r->id : 0; }

nopad_status nopad_request_cancel(nopad_request *r) {
    if (!r) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_request_cancel: request is NULL");
    /* the engine acts on it at its next iteration; an ended request ignores it */
    atomic_store(&r->cancel, 1);
    return NOPAD_OK;
}

void nopad_request_free(nopad_request *r) {
    if (!r) return;
    atomic_store(&r->cancel, 1);
    request_unref(r);
}

nopad_status nopad_request_get_stats(nopad_request *r, nopad_request_stats *out) {
    if (!r || !out)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_request_get_stats: request or out is NULL");
    pthread_mutex_lock(&r->lock);
    *out = (nopad_request_stats){
        .prompt_tokens = r->n_prompt,
        .prompt_tokens_shared = r->prompt_shared,
        .generated_tokens = r->n_delivered,
        .preemptions = r->preemptions,
        .finish = r->finish,
        .admitted_ms = r->admitted_ms,
        .first_token_ms = r->first_token_ms,
        .finished_ms = r->finished_ms,
    };
    pthread_mutex_unlock(&r->lock);
    return NOPAD_OK;
}
