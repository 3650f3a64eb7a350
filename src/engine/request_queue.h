/* The door between the threads that submit requests and the engine thread: a bounded queue of
 * new requests (mutex + condition variable, on which the idle engine sleeps) and the list of
 * requests in flight, by which a request can be cancelled by id. */
#ifndef NOPAD_ENGINE_REQUEST_QUEUE_H
#define NOPAD_ENGINE_REQUEST_QUEUE_H

#include <pthread.h>
#include <stdint.h>

#include "engine/request.h"

/* A growable array of requests. */
typedef struct request_list {
    request **items;
    int32_t n, cap;
} request_list;

nopad_status request_list_reserve(request_list *l, int32_t n);
/* Appends (room reserved or grown; NOPAD_ERR_OUT_OF_MEMORY otherwise). */
nopad_status request_list_push(request_list *l, request *r);
/* Removes item i, keeping the order of the others. */
void request_list_remove(request_list *l, int32_t i);
void request_list_free(request_list *l);

typedef struct request_queue {
    pthread_mutex_t lock;
    pthread_cond_t wake;    // the engine: a new request, or closing
    request_list incoming;  // submitted, not yet taken by the engine, oldest first
    request_list live;      // every request the engine has not retired
    int32_t n_pending;      // submitted and not yet admitted, at most max_pending
    int32_t max_pending;
    uint64_t last_id;
    int closed;
} request_queue;

void request_queue_init(request_queue *q, int32_t max_pending);
/* After the engine has retired every request. */
void request_queue_destroy(request_queue *q);

/* The id the next request gets (from 1). */
uint64_t request_queue_next_id(request_queue *q);
/* Hands a new request to the engine. NOPAD_ERR_QUEUE_FULL when max_pending requests wait
 * already; NOPAD_ERR_INVALID_ARGUMENT after request_queue_close. */
nopad_status request_queue_push(request_queue *q, request *r);
/* The engine takes every new request into `to` (in submission order), first sleeping until there
 * is one or the queue closes when `wait` is set. Returns 1 once the queue is closed. */
int request_queue_take(request_queue *q, request_list *to, int wait);
/* A request that was pending has been admitted: one more may be submitted. */
void request_queue_admitted(request_queue *q);
/* The engine is done with r (ended, delivered): it leaves the list in flight. */
void request_queue_retire(request_queue *q, request *r);
/* Flags the request in flight with this id for cancellation; 0 when there is none. */
int request_queue_cancel(request_queue *q, uint64_t id);
/* Refuses new requests and wakes the engine to end. */
void request_queue_close(request_queue *q);
/* Requests submitted and not yet taken by the engine. */
int32_t request_queue_incoming(request_queue *q);

#endif
