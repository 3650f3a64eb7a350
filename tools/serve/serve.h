/* `nopad serve`: what the server's files share. One concept per file:
 *   serve.c          the command: options, loading the models, start, SIGTERM, shutdown
 *   http.c           libmicrohttpd glue: routing, bodies, API key, replies, suspend / resume
 *   generation.c     /v1/completions, /v1/chat/completions and /v1/responses on the engine,
 *                    plain and SSE
 *   embeddings.c     /v1/embeddings and TEI's /embed, /predict and /rerank, batched across
 *                    requests by one thread
 *   openai.c         the request bodies, parsed and checked; the error object
 *   chat_template.c  messages (and tools) -> prompt, by template family
 *   tool_calls.c     an answer's text -> tool calls
 *   metrics.c        Prometheus counters and histograms
 * It uses the public API (nopad.h) and the CLI's helpers (cli.h) only. */
#ifndef NOPAD_TOOLS_SERVE_H
#define NOPAD_TOOLS_SERVE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "chat_template.h"
#include "metrics.h"
#include "nopad.h"
#include "openai.h"

typedef struct serve_options {
    const char *model, *embedding_model, *host, *api_key, *chat_template;
    long port, max_queue, max_body_bytes, http_threads, kv_tokens, max_running, step_tokens;
    long embed_batch_tokens, threads, shutdown_timeout;
    long tp;                  /* --tp: ranks the generation model (else the embedding one) is split over */
    nopad_device device;
    nopad_dtype dtype;
    int dtype_given;
    nopad_weights weights;    /* --weights */
} serve_options;

typedef struct gen_job gen_job;
typedef struct embed_batcher embed_batcher;
typedef struct waiter waiter;

/* A resume asked for from the engine's thread (waker_post): the waiter, and what to release once
 * it is done (the owner's reference that kept the waiter alive). */
typedef struct wake_item {
    waiter *w;
    void (*release)(void *arg);
    void *arg;
} wake_item;

typedef struct server {
    serve_options o;
    /* generation (NULL engine: no decoder loaded) */
    nopad_model *decoder;
    nopad_engine *engine;
    const nopad_tokenizer *dec_tok;
    nopad_model_info dec_info;
    char decoder_name[256];
    chat_template tmpl;
    int has_template;
    int32_t context_tokens;  /* prompt + completion at most: the model's context, the KV pool */
    /* embeddings (NULL batcher: no encoder loaded) */
    nopad_model *encoder;
    const nopad_tokenizer *enc_tok;
    nopad_model_info enc_info;
    char encoder_name[256];
    embed_batcher *batcher;
    /* the rest */
    metrics metrics;
    atomic_int draining;      /* SIGTERM came: new requests get 503 */
    atomic_int inflight;      /* HTTP requests between their first byte and their end */
    atomic_uint_fast64_t next_id;
    long long created;        /* Unix time of the start, for /v1/models */
    pthread_mutex_t jobs_lock; /* the generation requests not yet ended, for the shutdown */
    gen_job *jobs;
    int cancelling;           /* under jobs_lock: the shutdown's deadline passed (gen_cancel_all) */
    /* the waker thread (http.c): resumes posted from the engine's thread */
    pthread_mutex_t wake_lock;
    pthread_cond_t wake_cond;
    wake_item *wake_items;
    size_t wake_n, wake_cap;
    int wake_stop, waker_started;
    pthread_t waker;
} server;

/* ---- http.c --------------------------------------------------------------------------------- */

/* Waking a suspended connection from another thread. `lock` guards the owner's state and these
 * fields; a connection is suspended only with it held and only while open. */
struct waiter {
    pthread_mutex_t lock;
    struct MHD_Connection *conn; /* NULL once the request has ended */
    int suspended;
};
/* With w->lock held, on the connection's MHD thread (access handler or content reader). */
void waiter_sleep(waiter *w);
/* With w->lock held, from any thread: resumes the connection if it sleeps. */
void waiter_wake(waiter *w);
/* With w->lock held, from any thread: 1 when the client has closed (or reset) the connection.
 * libmicrohttpd does not watch a suspended connection, so a long job asks this between chunks. */
int waiter_client_gone(waiter *w);

/* The engine's thread hands its resumes to the waker thread: MHD_resume_connection writes to
 * libmicrohttpd's wake-up pipe, a system call that, made for every token of every stream on the
 * engine's thread, held up every step (32 streams: 93.5% of the engine's tokens/s in-process).
 * waker_post (w->lock not held) queues waiter_wake(w) and then release(arg), signalling the
 * waker only when the queue was empty; waker_stop resumes what is queued, then joins. */
int waker_start(server *s);
void waker_post(server *s, waiter *w, void (*release)(void *arg), void *arg);
void waker_stop(server *s);

/* One HTTP request (libmicrohttpd's per-request pointer). */
typedef struct http_req {
    server *srv;
    struct MHD_Connection *conn;
    metrics_route route;
    double t0;               /* arrival, CLOCK_MONOTONIC seconds */
    char *body;
    size_t len, cap;
    int too_large;           /* the body passed --max-body-bytes: it is dropped, 413 follows */
    int counted;             /* its status went into the metrics */
    char allow[40];          /* the path's methods: a 405's Allow header */
    gen_job *gen;            /* the generation it started, if any */
    struct embed_job *emb;   /* the embedding (or classification) it waits for, if any */
} http_req;

struct MHD_Daemon *http_start(server *s, char *err, size_t err_len);
/* The port the daemon listens on (for --port 0). */
int http_port(struct MHD_Daemon *d);

/* Replies. Each counts the request in the metrics and returns what the handler returns. */
enum MHD_Result http_reply(http_req *q, int status, const char *content_type, char *body,
                           size_t len); /* takes body (malloc'd) */
enum MHD_Result http_reply_json(http_req *q, int status, cJSON *obj); /* deletes obj */
enum MHD_Result http_reply_error(http_req *q, const api_error *e);
/* The status of a request into the metrics, once. */
void http_count(http_req *q, int status);

/* ---- generation.c --------------------------------------------------------------------------- */

/* The routes; called when the body is complete and again after each resume. */
enum MHD_Result gen_handle(http_req *q, gen_kind kind);
/* The request ended (answered, or its client left): cancels what still runs. */
void gen_request_closed(http_req *q, int completed_ok);
/* Cancels every generation request not yet ended (the shutdown's deadline passed), and answers
 * each at once (503, or a stream's error event) without waiting for the engine's step to end, and
 * every request started afterwards: no connection stays suspended for MHD_stop_daemon. */
void gen_cancel_all(server *s);

/* ---- embeddings.c --------------------------------------------------------------------------- */

nopad_status embed_batcher_start(server *s, embed_batcher **out);
void embed_batcher_stop(embed_batcher *b);
/* Answers every embedding request not yet answered with 503 at once (the shutdown's deadline
 * passed), the one being computed included: no connection stays suspended for MHD_stop_daemon. */
void embed_cancel_all(embed_batcher *b);
int32_t embed_batcher_queue(embed_batcher *b);
enum MHD_Result embed_handle(http_req *q, int tei);
/* TEI's /predict (rerank 0) and /rerank (1) on the encoder's classification head, through the
 * same batcher (a batch holds one kind of work). */
enum MHD_Result classify_handle(http_req *q, int rerank);
void embed_request_closed(http_req *q);

/* ---- serve.c -------------------------------------------------------------------------------- */

/* CLOCK_MONOTONIC seconds (cli.h's now_seconds). */
double serve_now(void);

#endif
