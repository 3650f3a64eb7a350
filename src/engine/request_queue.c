/* The request queue: submit side (any thread) and take side (the engine thread), one lock. */
#include "engine/request_queue.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

nopad_status request_list_reserve(request_list *l, int32_t n) {
    if (n <= l->cap) return NOPAD_OK;
    int32_t cap = l->cap ? l->cap : 16;
    while (cap < n) cap *= 2;
    request **items = realloc(l->items, (size_t)cap * sizeof *items);
    if (!items) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "engine: out of memory for %d requests", n);
    l->items = items;
    l->cap = cap;
    return NOPAD_OK;
}

nopad_status request_list_push(request_list *l, request *r) {
    nopad_status st = request_list_reserve(l, l->n + 1);
    if (st == NOPAD_OK) l->items[l->n++] = r;
    return st;
}

void request_list_remove(request_list *l, int32_t i) {
    memmove(l->items + i, l->items + i + 1, (size_t)(l->n - i - 1) * sizeof *l->items);
    l->n--;
}

void request_list_free(request_list *l) {
    free(l->items);
    memset(l, 0, sizeof *l);
}

void request_queue_init(request_queue *q, int32_t max_pending) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->wake, NULL);
    q->max_pending = max_pending;
}

void request_queue_destroy(request_queue *q) {
    request_list_free(&q->incoming);
    request_list_free(&q->live);
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->wake);
}

uint64_t request_queue_next_id(request_queue *q) {
    pthread_mutex_lock(&q->lock);
    const uint64_t id = ++q->last_id;
    pthread_mutex_unlock(&q->lock);
    return id;
}

nopad_status request_queue_push(request_queue *q, request *r) {
    pthread_mutex_lock(&q->lock);
    nopad_status st = NOPAD_OK;
    if (q->closed)
        st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                             "nopad_engine_submit: the engine is being freed; no request is taken");
    else if (q->n_pending >= q->max_pending)
        st = nopad_set_error(NOPAD_ERR_QUEUE_FULL,
                             "nopad_engine_submit: %d requests wait already (max_queue %d); retry "
                             "when some have started",
                             q->n_pending, q->max_pending);
    if (st == NOPAD_OK) st = request_list_reserve(&q->live, q->live.n + 1);
    if (st == NOPAD_OK) st = request_list_push(&q->incoming, r);
    if (st == NOPAD_OK) {
        r->live_index = q->live.n;
        q->live.items[q->live.n++] = r;
        q->n_pending++;
        pthread_cond_signal(&q->wake);
    }
    pthread_mutex_unlock(&q->lock);
    return st;
}

int request_queue_take(request_queue *q, request_list *to, int wait) {
    pthread_mutex_lock(&q->lock);
    while (wait && q->incoming.n == 0 && !q->closed) pthread_cond_wait(&q->wake, &q->lock);
    /* room first, so a failure leaves the requests in the queue for the next try; an empty queue
     * may have no list at all (memcpy from NULL is undefined, even of 0 bytes) */
    if (q->incoming.n > 0 && request_list_reserve(to, to->n + q->incoming.n) == NOPAD_OK) {
        memcpy(to->items + to->n, q->incoming.items, (size_t)q->incoming.n * sizeof *to->items);
        to->n += q->incoming.n;
        q->incoming.n = 0;
    }
    const int closed = q->closed;
    pthread_mutex_unlock(&q->lock);
    return closed;
}

void request_queue_admitted(request_queue *q) {
    pthread_mutex_lock(&q->lock);
    q->n_pending--;
    pthread_mutex_unlock(&q->lock);
}

void request_queue_retire(request_queue *q, request *r) {
    pthread_mutex_lock(&q->lock);
    if (!r->started) q->n_pending--;
    /* the last request takes r's place */
    request *moved = q->live.items[--q->live.n];
    q->live.items[r->live_index] = moved;
    moved->live_index = r->live_index;
    pthread_mutex_unlock(&q->lock);
}

int request_queue_cancel(request_queue *q, uint64_t id) {
    int found = 0;
    pthread_mutex_lock(&q->lock);
    for (int32_t i = 0; i < q->live.n && !found; i++)
        if (q->live.items[i]->id == id) {
            atomic_store(&q->live.items[i]->cancel, 1);
            found = 1;
        }
    pthread_mutex_unlock(&q->lock);
    return found;
}

void request_queue_close(request_queue *q) {
    pthread_mutex_lock(&q->lock);
    q->closed = 1;
    pthread_cond_signal(&q->wake);
    pthread_mutex_unlock(&q->lock);
}

int32_t request_queue_incoming(request_queue *q) {
    pthread_mutex_lock(&q->lock);
    const int32_t n = q->incoming.n;
    pthread_mutex_unlock(&q->lock);
    return n;
}
