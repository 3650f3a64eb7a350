/* A request inside the engine: what was asked (copied at submit), its place in the KV pool (the
 * engine thread's alone), and the stream of its results, which the engine thread appends to and
 * any reader thread takes from under the request's lock.
 *
 * The caller's handle and the engine each hold a reference; whichever lets go last frees it, so a
 * handle outlives the engine and the engine may finish a request whose handle is gone. */
#ifndef NOPAD_ENGINE_REQUEST_H
#define NOPAD_ENGINE_REQUEST_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "engine/stop_text.h"
#include "grammar/grammar.h"
#include "nopad.h"

struct nopad_request {
    uint64_t id;
    double submit_time;            // seconds (monotonic clock)

    /* what was asked */
    int32_t n_prompt, max_tokens;
    int ignore_eos;
    nopad_sampling_params sampling; // its logit_bias points to logit_bias below
    nopad_logit_bias *logit_bias;  // [sampling.n_logit_bias] the request's copy, or NULL
    int32_t *stop_ids, n_stop_ids;
    nopad_request_fn on_token;
    void *user;
    const nopad_constraint *constraint; // NULL, or a reference held while the request lives
    grammar_matcher *matcher;      // the engine thread's: the output so far, through the constraint
    uint32_t *mask;                // [(vocab + 31) / 32] the allowed ids of its next step

    /* the engine thread's: the sequence and its KV blocks */
    int32_t *tokens;               // [n_prompt + max_tokens] the prompt, then each generated id
    float *logprobs;               // [max_tokens] each generated id's log-probability, or NULL
                                   // (not asked); written before the id is delivered
    int32_t top_logprobs;          // k: the most likely ids kept per generated id (0: none)
    int32_t *top_ids;              // [max_tokens, k] each generated id's step's top ids, or NULL
    float *top_lps;                // [max_tokens, k] their log-probabilities; both written before
                                   // the id is delivered
    int32_t n_tokens;              // prompt + generated so far
    int32_t n_computed;            // leading tokens whose keys and values are in `blocks` (or
                                   // being written there by a launched step)
    int32_t n_inflight;            // ids still coming from launched steps (tokens[n_tokens ..])
    int32_t inflight_row;          // the newest one's row in its step (the next step's placeholder)
    int32_t *blocks, n_blocks;     // [blocks for n_prompt + max_tokens] in sequence order
    uint64_t *block_hashes;        // [same] content hash of each published full block
    int32_t n_hashed;              // leading blocks whose hash is known
    uint64_t admitted;             // admission order (later admissions are preempted first); 0: waiting
    int started;                   // admitted once (no longer counted against max_queue)
    nopad_decode_stream *detok;    // the model's tokenizer, or NULL without one
    stop_text stop;                // the text, held back where a stop string may begin
    /* the engine thread's: where the request stands between a step and its delivery */
    nopad_finish_reason ending;    // its newest id ends it (stop id, EOS, max_tokens): out of the
                                   // scheduler already, its delivery to come
    int in_step;                   // launched steps that hold it and whose ids are not taken yet
    int ended;                     // it ended while in a launched step: it leaves once that step's
                                   // ids are taken, and their ids for it are dropped
    int retired;                   // left the engine (request_queue_retire done)

    /* the results, under `lock` */
    pthread_mutex_t lock;
    pthread_cond_t changed;        // a new id, or the end
    int32_t n_delivered, n_read;   // generated ids delivered (tokens[n_prompt ..]) and read
    char *text;                    // [text_len] released text
    size_t text_len, text_cap;
    nopad_finish_reason finish;
    nopad_status error;            // NOPAD_FINISH_ERROR: the failed step's status and message
    char *error_message;
    int32_t prompt_shared, preemptions;
    double admitted_ms, first_token_ms, finished_ms;
    int refs;

    atomic_int cancel;             // set by any thread; the engine acts on it
    int32_t live_index;            // its place in the queue's list of requests in flight
};
typedef struct nopad_request request;

/* A request for params, its prompt already ids (checked by the caller), refs = 2 (the handle and
 * the engine). `tok` may be NULL (no text). */
nopad_status request_create(const nopad_request_params *params, const int32_t *prompt,
                            int32_t n_prompt, int32_t block_size, const nopad_tokenizer *tok,
                            uint64_t id, request **out);

/* Takes / drops one reference; the last frees the request. */
void request_ref(request *r);
void request_unref(request *r);

/* The engine thread's side. Appends the newest generated id (tokens[n_tokens - 1]) and `text` to
 * the stream, and ends the request when finish != NONE (NOPAD_FINISH_ERROR: with `error` and the
 * thread's last message); then calls on_token. Returns how the request stands: `finish`, or
 * NOPAD_FINISH_ERROR when its text ran out of memory. */
nopad_finish_reason request_deliver(request *r, const char *text, size_t text_len,
                                    nopad_finish_reason finish, nopad_status error);
/* Ends the request without a new id (cancelled, or an error with the thread's last message). */
void request_end(request *r, nopad_finish_reason finish, nopad_status error);
/* Records the admission, sharing and preemption counters readers see in the request's stats. */
void request_note_admitted(request *r, int32_t prompt_shared);
void request_note_preempted(request *r);

/* Seconds on the monotonic clock. */
double request_now(void);

#endif
