/* Prometheus metrics of the server (see metrics.h). */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double latency_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75,
                                        1.0,   2.5,  5.0,   7.5,  10.0,  20.0, 40.0, 80.0};
static const double step_bounds[] = {0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064,
                                     0.128,  0.256, 0.512, 1.024, 2.048};

static const char *const route_names[N_ROUTES] = {
    [ROUTE_COMPLETIONS] = "/v1/completions", [ROUTE_CHAT] = "/v1/chat/completions",
    [ROUTE_RESPONSES] = "/v1/responses",
    [ROUTE_EMBEDDINGS] = "/v1/embeddings",   [ROUTE_EMBED] = "/embed",
    [ROUTE_PREDICT] = "/predict",            [ROUTE_RERANK] = "/rerank",
    [ROUTE_MODELS] = "/v1/models",           [ROUTE_HEALTH] = "/health",
    [ROUTE_METRICS] = "/metrics",            [ROUTE_OTHER] = "other",
};

const char *metrics_route_name(metrics_route r) {
    return r >= 0 && r < N_ROUTES ? route_names[r] : "other";
}

static void hist_init(histogram *h, const double *bounds, int n) {
    *h = (histogram){.bounds = bounds, .n_bounds = n};
}

static void hist_observe(histogram *h, double x) {
    int b = 0;
    while (b < h->n_bounds && x > h->bounds[b]) b++;
    h->counts[b]++;
    h->count++;
    h->sum += x;
}

void metrics_init(metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->lock, NULL);
    const int nl = (int)(sizeof latency_bounds / sizeof *latency_bounds);
    hist_init(&m->ttft, latency_bounds, nl);
    hist_init(&m->latency, latency_bounds, nl);
    hist_init(&m->step, step_bounds, (int)(sizeof step_bounds / sizeof *step_bounds));
    m->steps_seen = -1;
}

void metrics_destroy(metrics *m) { pthread_mutex_destroy(&m->lock); }

void metrics_request(metrics *m, metrics_route route, int status, double seconds) {
    pthread_mutex_lock(&m->lock);
    int s = 0;
    while (s < m->n_statuses && m->statuses[s] != status) s++;
    if (s == m->n_statuses && s < METRICS_MAX_STATUSES) m->statuses[m->n_statuses++] = status;
    if (s < METRICS_MAX_STATUSES) m->requests[route][s]++;
    if (route <= ROUTE_RERANK && status == 200) hist_observe(&m->latency, seconds);
    pthread_mutex_unlock(&m->lock);
}

void metrics_tokens(metrics *m, int64_t prompt, int64_t completion) {
    pthread_mutex_lock(&m->lock);
    m->prompt_tokens += (uint64_t)prompt;
    m->completion_tokens += (uint64_t)completion;
    pthread_mutex_unlock(&m->lock);
}

void metrics_cancelled(metrics *m) {
    pthread_mutex_lock(&m->lock);
    m->cancelled++;
    pthread_mutex_unlock(&m->lock);
}

void metrics_ttft(metrics *m, double seconds) {
    pthread_mutex_lock(&m->lock);
    hist_observe(&m->ttft, seconds);
    pthread_mutex_unlock(&m->lock);
}

void metrics_embed_batch(metrics *m, int64_t inputs, int64_t tokens) {
    pthread_mutex_lock(&m->lock);
    m->embed_inputs += (uint64_t)inputs;
    m->embed_tokens += (uint64_t)tokens;
    m->embed_batches++;
    pthread_mutex_unlock(&m->lock);
}

void metrics_engine_steps(metrics *m, const nopad_engine_stats *st) {
    pthread_mutex_lock(&m->lock);
    if (m->steps_seen >= 0 && st->steps > m->steps_seen && st->last_step_ms >= 0)
        hist_observe(&m->step, st->last_step_ms / 1000.0);
    m->steps_seen = st->steps;
    pthread_mutex_unlock(&m->lock);
}

/* ---- rendering ------------------------------------------------------------------------------ */

typedef struct out {
    char *s;
    size_t len, cap;
    int failed;
} out;

static void emit(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(out *o, const char *fmt, ...) {
    if (o->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const int n = vsnprintf(o->s ? o->s + o->len : NULL, o->s ? o->cap - o->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->failed = 1;
            return;
        }
        if (o->s && o->len + (size_t)n < o->cap) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = o->cap ? o->cap * 2 : 8192;
        while (cap < o->len + (size_t)n + 1) cap *= 2;
        char *p = realloc(o->s, cap);
        if (!p) {
            o->failed = 1;
            return;
        }
        o->s = p;
        o->cap = cap;
    }
}

static void emit_hist(out *o, const char *name, const char *help, const histogram *h) {
    emit(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < h->n_bounds; b++) {
        cum += h->counts[b];
        emit(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[b], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    emit(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
         (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->count);
}

static void emit_one(out *o, const char *name, const char *type, const char *help, double v) {
    emit(o, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

char *metrics_render(metrics *m, const metrics_gauges *g, size_t *len) {
    out o = {0};
    pthread_mutex_lock(&m->lock);
    emit(&o, "# HELP nopad_requests_total HTTP requests answered, by route and status (499: the "
             "client left before its answer)\n# TYPE nopad_requests_total counter\n");
    for (int r = 0; r < N_ROUTES; r++)
        for (int s = 0; s < m->n_statuses; s++)
            if (m->requests[r][s])
                emit(&o, "nopad_requests_total{route=\"%s\",status=\"%d\"} %llu\n", route_names[r],
                     m->statuses[s], (unsigned long long)m->requests[r][s]);
    emit_one(&o, "nopad_prompt_tokens_total", "counter",
             "prompt tokens of answered generation requests", (double)m->prompt_tokens);
    emit_one(&o, "nopad_completion_tokens_total", "counter",
             "tokens generated for answered generation requests (their usage.completion_tokens)",
             (double)m->completion_tokens);
    emit_one(&o, "nopad_requests_cancelled_total", "counter",
             "requests (generation, embeddings) cancelled because their client left", (double)m->cancelled);
    emit_one(&o, "nopad_embedding_inputs_total", "counter", "inputs embedded", (double)m->embed_inputs);
    emit_one(&o, "nopad_embedding_tokens_total", "counter", "tokens through the encoder",
             (double)m->embed_tokens);
    emit_one(&o, "nopad_embedding_batches_total", "counter",
             "encoder batches run (requests arriving together share one)", (double)m->embed_batches);
    emit_hist(&o, "nopad_time_to_first_token_seconds",
              "from a generation request's arrival to its first token", &m->ttft);
    emit_hist(&o, "nopad_request_duration_seconds",
              "from a request's arrival to its answer (generation and embeddings, status 200)",
              &m->latency);
    emit_hist(&o, "nopad_step_seconds",
              "engine step time (the last step's, sampled every few milliseconds)", &m->step);
    pthread_mutex_unlock(&m->lock);
    if (g->have_engine) {
        const nopad_engine_stats *e = &g->engine;
        emit_one(&o, "nopad_requests_waiting", "gauge", "generation requests queued, not yet running",
                 e->waiting);
        emit_one(&o, "nopad_requests_running", "gauge", "generation requests running", e->running);
        emit_one(&o, "nopad_kv_blocks_used", "gauge", "KV blocks held by running requests",
                 e->kv_blocks_used);
        emit_one(&o, "nopad_kv_blocks_cached", "gauge",
                 "KV blocks held by no request, keeping computed prefixes", e->kv_blocks_cached);
        emit_one(&o, "nopad_kv_blocks_total", "gauge", "KV blocks in the pool", e->kv_blocks_total);
        emit_one(&o, "nopad_kv_block_size", "gauge", "tokens per KV block", e->kv_block_size);
        emit_one(&o, "nopad_engine_steps_total", "counter", "packed steps run", (double)e->steps);
        emit_one(&o, "nopad_engine_tokens_generated_total", "counter",
                 "tokens generated, for any request (cancelled ones too)",
                 (double)e->tokens_generated);
        emit_one(&o, "nopad_engine_prompt_tokens_computed_total", "counter",
                 "prompt tokens computed", (double)e->prompt_tokens_computed);
        emit_one(&o, "nopad_engine_prompt_tokens_shared_total", "counter",
                 "prompt tokens read from shared KV blocks", (double)e->prompt_tokens_shared);
        emit_one(&o, "nopad_engine_preemptions_total", "counter", "requests preempted",
                 (double)e->preemptions);
        emit_one(&o, "nopad_engine_tokens_per_second", "gauge",
                 "tokens per second over the last 64 steps", e->tokens_per_s);
    }
    if (g->have_embed)
        emit_one(&o, "nopad_embedding_queue", "gauge", "embedding requests waiting or running",
                 g->embed_queue);
    emit_one(&o, "nopad_http_inflight", "gauge", "requests being answered", g->http_inflight);
    emit_one(&o, "nopad_draining", "gauge", "1 once SIGTERM asked the server to stop", g->draining);
    if (o.failed) {
        free(o.s);
        return NULL;
    }
    *len = o.len;
    return o.s;
}
