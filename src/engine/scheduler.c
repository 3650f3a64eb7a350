/* The scheduler's rules (scheduler.h) over the running and waiting lines and the block manager. */
#include "engine/scheduler.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

nopad_status scheduler_init(scheduler *s, kv_blocks *kv, request_queue *queue,
                            int32_t max_step_tokens, int32_t max_running, int prefix_sharing) {
    memset(s, 0, sizeof *s);
    s->kv = kv;
    s->queue = queue;
    s->block_size = kv->block_size;
    s->max_step_tokens = max_step_tokens;
    s->max_running = max_running;
    s->prefix_sharing = prefix_sharing;
    s->step = malloc((size_t)max_running * sizeof *s->step);
    nopad_status st = s->step ? request_list_reserve(&s->running, max_running)
                              : nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "engine: out of memory");
    if (st != NOPAD_OK) scheduler_free(s);
    return st;
}

void scheduler_free(scheduler *s) {
    request_list_free(&s->running);
    request_list_free(&s->waiting);
    free(s->step);
    memset(s, 0, sizeof *s);
}

nopad_status scheduler_add(scheduler *s, request *r) {
    /* room for every running request too, so a preemption never has to allocate */
    nopad_status st = request_list_reserve(&s->waiting, s->waiting.n + s->running.n + 1);
    if (st == NOPAD_OK) s->waiting.items[s->waiting.n++] = r;
    return st;
}

/* ---- blocks --------------------------------------------------------------------------------- */

static int32_t blocks_for(const scheduler *s, int32_t n_tokens) {
    return (n_tokens + s->block_size - 1) / s->block_size;
}

/* Takes the blocks r needs to hold its first `n_tokens` tokens (the caller made sure there are). */
static void take_blocks(scheduler *s, request *r, int32_t n_tokens) {
    while (r->n_blocks < blocks_for(s, n_tokens)) {
        const int32_t b = kv_blocks_take(s->kv);
        assert(b >= 0);
        r->blocks[r->n_blocks++] = b;
    }
}

/* Releases every block of r, the last first, so that its prefix stays cached the longest. */
static void release_blocks(scheduler *s, request *r) {
    while (r->n_blocks > 0) kv_blocks_release(s->kv, r->blocks[--r->n_blocks]);
    r->n_hashed = 0;
    r->n_computed = 0;
}

/* A request about to be admitted takes the published blocks holding its leading full blocks,
 * keeping at least its last token to compute. Returns the tokens found. */
static int32_t share_prefix(scheduler *s, request *r) {
    if (!s->prefix_sharing) return 0;
    const int32_t bs = s->block_size, limit = (r->n_tokens - 1) / bs;
    uint64_t parent = 0;
    int32_t j = 0;
    for (; j < limit; j++) {
        const int32_t *tokens = r->tokens + (size_t)j * bs;
        const uint64_t h = kv_blocks_hash(parent, tokens, bs);
        const int32_t b = kv_blocks_find(s->kv, h, parent, tokens);
        if (b < 0) break;
        r->blocks[j] = b;
        r->block_hashes[j] = h;
        parent = h;
    }
    r->n_blocks = r->n_hashed = j;
    r->n_computed = j * bs;
    return j * bs;
}

/* ---- planning ------------------------------------------------------------------------------- */

static void plan_item(scheduler *s, request *r, int32_t n_new) {
    take_blocks(s, r, r->n_computed + n_new);
    s->step[s->n_step++] = (sched_item){.r = r, .n_new = n_new};
    s->n_step_tokens += n_new;
}

/* The running request at index i goes back to the head of the waiting line, without blocks. */
static void preempt(scheduler *s, int32_t i) {
    request *r = s->running.items[i];
    release_blocks(s, r);
    r->admitted = 0;
    request_list_remove(&s->running, i);
    memmove(s->waiting.items + 1, s->waiting.items, (size_t)s->waiting.n * sizeof *s->waiting.items);
    s->waiting.items[0] = r;
    s->waiting.n++;
    s->preemptions++;
    request_note_preempted(r);
}

/* How many of r's next `want` tokens fit in the step's budget and the blocks it can have. */
static int32_t chunk_that_fits(const scheduler *s, const request *r, int32_t want) {
    int32_t n = want;
    const int32_t budget = s->max_step_tokens - s->n_step_tokens;
    if (n > budget) n = budget;
    const int64_t room = ((int64_t)r->n_blocks + kv_blocks_available(s->kv)) * s->block_size -
                         r->n_computed;
    if (n > room) n = (int32_t)room;
    return n > 0 ? n : 0;
}

/* 1. the newest token of every running request past its prompt */
static void plan_decodes(scheduler *s) {
    for (int32_t i = 0; i < s->running.n; i++) {
        request *r = s->running.items[i];
        const int32_t known = r->n_tokens + r->n_inflight; /* with the ids on their way */
        if (known - r->n_computed != 1) continue;
        if (r->n_inflight > 0 && known - r->n_prompt >= r->max_tokens) continue; /* that id is its last */
        const int32_t need = blocks_for(s, known) - r->n_blocks;
        int self_preempted = 0;
        while (need > kv_blocks_available(s->kv) && !self_preempted) {
            /* the latest admitted comes last in the running line: not planned yet */
            self_preempted = s->running.items[s->running.n - 1] == r;
            preempt(s, s->running.n - 1);
        }
        if (!self_preempted) plan_item(s, r, 1);
    }
}

/* 2. the next prompt chunk of running requests still reading their prompt */
static void plan_prompt_chunks(scheduler *s) {
    for (int32_t i = 0; i < s->running.n; i++) {
        request *r = s->running.items[i];
        const int32_t remaining = r->n_tokens + r->n_inflight - r->n_computed;
        if (remaining <= 1) continue; /* a decode, planned already */
        const int32_t n = chunk_that_fits(s, r, remaining);
        if (n > 0) plan_item(s, r, n);
    }
}

/* 3. admissions, in waiting order */
static void plan_admissions(scheduler *s) {
    while (s->waiting.n > 0 && s->running.n < s->max_running &&
           s->n_step_tokens < s->max_step_tokens) {
        request *r = s->waiting.items[0];
        if (r->n_inflight > 0) return; /* preempted with an id on its way: it comes back after it */
        const int32_t shared = share_prefix(s, r);
        const int32_t n = chunk_that_fits(s, r, r->n_tokens - r->n_computed);
        if (n == 0) { /* no block for it: it waits, first in line */
            release_blocks(s, r);
            return;
        }
        request_list_remove(&s->waiting, 0);
        s->running.items[s->running.n++] = r;
        r->admitted = ++s->admissions;
        if (!r->started) {
            r->started = 1;
            request_queue_admitted(s->queue);
        }
        s->tokens_shared += shared;
        request_note_admitted(r, shared);
        plan_item(s, r, n);
    }
}

void scheduler_plan(scheduler *s) {
    for (;;) {
        s->n_step = 0;
        s->n_step_tokens = 0;
        plan_decodes(s);
        plan_prompt_chunks(s);
        plan_admissions(s);
        if (s->n_step > 0 || s->running.n == 0) return;
        /* nothing to plan before a launched step's ids are in: no deadlock */
        for (int32_t i = 0; i < s->running.n; i++)
            if (s->running.items[i]->n_inflight > 0) return;
        /* 4. running requests hold blocks that each other need and none can go on */
        preempt(s, s->running.n - 1);
    }
}

void scheduler_launched(scheduler *s) {
    for (int32_t i = 0; i < s->n_step; i++) {
        sched_item *it = &s->step[i];
        request *r = it->r;
        r->n_computed += it->n_new;
        it->computed_after = r->n_computed;
        it->generates = r->n_computed == r->n_tokens + r->n_inflight;
        if (it->generates) {
            r->n_inflight++;
            r->inflight_row = i;
        }
    }
}

void scheduler_ran(scheduler *s, const sched_item *items, int32_t n) {
    if (!s->prefix_sharing) return;
    const int32_t bs = s->block_size;
    for (int32_t i = 0; i < n; i++) {
        request *r = items[i].r;
        /* preempted or ended since (its blocks gone), or its tokens not all known: nothing to publish */
        if (!r->admitted || r->ended || items[i].computed_after > r->n_computed ||
            items[i].computed_after > r->n_tokens)
            continue;
        /* full blocks become findable only now that their keys and values are written */
        for (int32_t j = r->n_hashed; j < items[i].computed_after / bs; j++) {
            const uint64_t parent = j > 0 ? r->block_hashes[j - 1] : 0;
            const int32_t *tokens = r->tokens + (size_t)j * bs;
            r->block_hashes[j] = kv_blocks_hash(parent, tokens, bs);
            kv_blocks_publish(s->kv, r->blocks[j], r->block_hashes[j], parent, tokens);
            r->n_hashed = j + 1;
        }
    }
}

void scheduler_prune(scheduler *s) {
    int32_t k = 0;
    s->n_step_tokens = 0;
    for (int32_t i = 0; i < s->n_step; i++)
        if (s->step[i].r->admitted) {
            s->step[k++] = s->step[i];
            s->n_step_tokens += s->step[i].n_new;
        }
    s->n_step = k;
}

void scheduler_remove(scheduler *s, request *r) {
    release_blocks(s, r);
    r->admitted = 0;
    for (int32_t i = 0; i < s->running.n; i++)
        if (s->running.items[i] == r) {
            request_list_remove(&s->running, i);
            return;
        }
    for (int32_t i = 0; i < s->waiting.n; i++)
        if (s->waiting.items[i] == r) {
            request_list_remove(&s->waiting, i);
            return;
        }
}
