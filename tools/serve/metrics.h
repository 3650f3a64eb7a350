/* The server's Prometheus metrics: counters of requests by route and status, tokens in and out,
 * embedding inputs, and histograms of time to first token, request latency and engine step time;
 * rendered with the engine's and the embedding batcher's gauges (queue, running, KV blocks) as
 * Prometheus text for GET /metrics. Thread-safe (one mutex). */
#ifndef NOPAD_TOOLS_SERVE_METRICS_H
#define NOPAD_TOOLS_SERVE_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "nopad.h"

typedef enum metrics_route {
    ROUTE_COMPLETIONS,
    ROUTE_CHAT,
    ROUTE_RESPONSES,
    ROUTE_EMBEDDINGS,
    ROUTE_EMBED, /* TEI */
    ROUTE_PREDICT, /* TEI */
    ROUTE_RERANK,  /* TEI */
    ROUTE_MODELS,
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_OTHER,
    N_ROUTES
} metrics_route;

enum { METRICS_MAX_STATUSES = 16, HIST_MAX_BUCKETS = 24 };

typedef struct histogram {
    const double *bounds; /* upper bounds in seconds, increasing */
    int n_bounds;
    uint64_t counts[HIST_MAX_BUCKETS + 1]; /* per bucket (not cumulative); the last: +Inf */
    uint64_t count;
    double sum;
} histogram;

typedef struct metrics {
    pthread_mutex_t lock;
    uint64_t requests[N_ROUTES][METRICS_MAX_STATUSES]; /* by route and status index */
    int statuses[METRICS_MAX_STATUSES];                /* the status codes seen, in order */
    int n_statuses;
    uint64_t prompt_tokens, completion_tokens;         /* of answered generation requests */
    uint64_t cancelled;                                /* requests ended by their client leaving */
    uint64_t embed_inputs, embed_tokens, embed_batches;
    histogram ttft, latency, step;
    int64_t steps_seen;                                /* engine steps already observed */
} metrics;

void metrics_init(metrics *m);
void metrics_destroy(metrics *m);

/* One answered request. HTTP status 499 stands for a client that left before its answer. */
void metrics_request(metrics *m, metrics_route route, int status, double seconds);
void metrics_tokens(metrics *m, int64_t prompt, int64_t completion);
void metrics_cancelled(metrics *m);
void metrics_ttft(metrics *m, double seconds);
void metrics_embed_batch(metrics *m, int64_t inputs, int64_t tokens);
/* Observes the engine's steps since the last call from a fresh snapshot: the last step's time
 * once per new step (a poller calls it; steps faster than its period are sampled). */
void metrics_engine_steps(metrics *m, const nopad_engine_stats *st);

/* Gauges that live elsewhere, read when /metrics is asked. */
typedef struct metrics_gauges {
    int have_engine;
    nopad_engine_stats engine;
    int have_embed;
    int32_t embed_queue;    /* embedding requests waiting or running */
    int32_t http_inflight;  /* requests being answered */
    int draining;
} metrics_gauges;

/* The Prometheus text (version 0.0.4) as a new string, or NULL when out of memory. */
char *metrics_render(metrics *m, const metrics_gauges *g, size_t *len);

const char *metrics_route_name(metrics_route r);

#endif
