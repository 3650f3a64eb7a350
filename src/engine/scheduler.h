/* The scheduler: which requests bring which tokens to the next packed step, and the KV blocks
 * they need for them. Every iteration:
 *   1. each running request past its prompt brings its newest token, in admission order; when
 *      its next block cannot be had, the latest-admitted request is preempted (its blocks freed,
 *      it waits at the head of the queue to compute its tokens again) until it can;
 *   2. running requests still reading their prompt bring their next chunk, in admission order,
 *      as far as the step's token budget and the free blocks go;
 *   3. waiting requests are admitted in order (preempted ones first), each with a first chunk,
 *      while the budget, max_running and the blocks allow; a new request first takes the
 *      published blocks that hold its prompt's leading full blocks (prefix sharing), at most
 *      floor((n - 1) / block_size) of them, so its last token is always computed;
 *   4. a step with nothing in it while requests run (each holds blocks the others need) preempts
 *      the latest-admitted and plans again: the earliest one alone always fits, since submit
 *      refuses a request the whole pool cannot hold.
 * A request's id may still be on its way from a launched step (n_inflight): the step after is
 * planned as if it were there (the decode brings it as a placeholder the device fills in), except
 * that a request whose coming id is its last (max_tokens) is not planned, and a preempted one is
 * not admitted again until its id is in.
 * The engine thread alone uses it. */
#ifndef NOPAD_ENGINE_SCHEDULER_H
#define NOPAD_ENGINE_SCHEDULER_H

#include <stdint.h>

#include "engine/kv_blocks.h"
#include "engine/request_queue.h"

/* One request's part of a step: tokens[n_computed .. n_computed + n_new) of its sequence. */
typedef struct sched_item {
    request *r;
    int32_t n_new;
    /* set by scheduler_launched: */
    int32_t computed_after;   // the request's n_computed once the step has run
    int generates;            // the step's id for it is its next token (the row ends its tokens)
} sched_item;

typedef struct scheduler {
    kv_blocks *kv;
    request_queue *queue;     // told when a new request is admitted (it no longer counts as waiting)
    int32_t block_size, max_step_tokens, max_running;
    int prefix_sharing;
    request_list running;     // admitted, in admission order
    request_list waiting;     // not admitted, the next to admit first
    uint64_t admissions;
    sched_item *step;         // [max_running] the planned step
    int32_t n_step, n_step_tokens;
    int64_t preemptions, tokens_shared;
} scheduler;

nopad_status scheduler_init(scheduler *s, kv_blocks *kv, request_queue *queue,
                            int32_t max_step_tokens, int32_t max_running, int prefix_sharing);
void scheduler_free(scheduler *s);

/* New requests join the waiting line at its end. */
nopad_status scheduler_add(scheduler *s, request *r);

/* Plans the next step into s->step (empty only when no request is running or waiting), taking the
 * KV blocks it needs. */
void scheduler_plan(scheduler *s);

/* The planned step is launched: each request's new tokens count as computed, and a row whose id
 * will be its request's next token marks that id as coming (n_inflight, inflight_row = the row). */
void scheduler_launched(scheduler *s);

/* A launched step of n items has run: the full blocks it filled are published for sharing (of the
 * requests still holding them). */
void scheduler_ran(scheduler *s, const sched_item *items, int32_t n);

/* The planned step loses the requests removed since it was planned (their blocks are back). */
void scheduler_prune(scheduler *s);

/* The request leaves (ended): its blocks are released at once. */
void scheduler_remove(scheduler *s, request *r);

#endif
