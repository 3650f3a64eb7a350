/* libmicrohttpd glue: a thread pool of --http-threads polling threads serves every connection;
 * a request that waits for the engine or the embedding batcher suspends its connection
 * (MHD_suspend_connection) and the thread that completes it resumes it, so no thread blocks on a
 * generation. Bodies are collected up to --max-body-bytes; the API key is checked before the body
 * is read. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "serve.h"

void waiter_sleep(waiter *w) {
    if (w->conn && !w->suspended) {
        w->suspended = 1;
        MHD_suspend_connection(w->conn);
    }
}

void waiter_wake(waiter *w) {
    if (w->suspended && w->conn) {
        w->suspended = 0;
        MHD_resume_connection(w->conn);
    }
}

int waiter_client_gone(waiter *w) {
    if (!w->conn) return 1;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(w->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    char c;
    const ssize_t n = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    /* 0: the client's end of stream; a pipelined next request (n > 0) or no data yet: still there */
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void wake_now(const wake_item *it) {
    pthread_mutex_lock(&it->w->lock);
    waiter_wake(it->w);
    pthread_mutex_unlock(&it->w->lock);
    if (it->release) it->release(it->arg);
}

static void *waker_main(void *arg) {
    server *s = arg;
    wake_item *spare = NULL; /* the other of two queues: swapped, so posting never waits long */
    size_t spare_cap = 0;
    pthread_mutex_lock(&s->wake_lock);
    for (;;) {
        while (s->wake_n == 0 && !s->wake_stop) pthread_cond_wait(&s->wake_cond, &s->wake_lock);
        if (s->wake_n == 0) break; /* stopping, nothing queued */
        wake_item *items = s->wake_items;
        const size_t n = s->wake_n, cap = s->wake_cap;
        s->wake_items = spare, s->wake_cap = spare_cap, s->wake_n = 0;
        pthread_mutex_unlock(&s->wake_lock);
        for (size_t i = 0; i < n; i++) wake_now(&items[i]);
        spare = items, spare_cap = cap;
        pthread_mutex_lock(&s->wake_lock);
    }
    pthread_mutex_unlock(&s->wake_lock);
    free(spare);
    return NULL;
}

int waker_start(server *s) {
    pthread_mutex_init(&s->wake_lock, NULL);
    pthread_cond_init(&s->wake_cond, NULL);
    s->waker_started = pthread_create(&s->waker, NULL, waker_main, s) == 0;
    return s->waker_started ? 0 : -1;
}

void waker_post(server *s, waiter *w, void (*release)(void *arg), void *arg) {
    const wake_item it = {w, release, arg};
    if (!s->waker_started) {
        wake_now(&it);
        return;
    }
    pthread_mutex_lock(&s->wake_lock);
    if (s->wake_n == s->wake_cap) {
        const size_t cap = s->wake_cap ? 2 * s->wake_cap : 64;
        wake_item *grown = realloc(s->wake_items, cap * sizeof *grown);
        if (!grown) { /* out of memory: resume here, as before the waker */
            pthread_mutex_unlock(&s->wake_lock);
            wake_now(&it);
            return;
        }
        s->wake_items = grown, s->wake_cap = cap;
    }
    s->wake_items[s->wake_n++] = it;
    const int first = s->wake_n == 1; /* otherwise the waker is signalled or busy already */
    pthread_mutex_unlock(&s->wake_lock);
    if (first) pthread_cond_signal(&s->wake_cond);
}

void waker_stop(server *s) {
    if (!s->waker_started) return;
    pthread_mutex_lock(&s->wake_lock);
    s->wake_stop = 1;
    pthread_mutex_unlock(&s->wake_lock);
    pthread_cond_signal(&s->wake_cond);
    pthread_join(s->waker, NULL);
    s->waker_started = 0;
    free(s->wake_items);
    s->wake_items = NULL;
    s->wake_n = s->wake_cap = 0;
    pthread_cond_destroy(&s->wake_cond);
    pthread_mutex_destroy(&s->wake_lock);
}

void http_count(http_req *q, int status) {
    if (q->counted) return;
    q->counted = 1;
    metrics_request(&q->srv->metrics, q->route, status, serve_now() - q->t0);
}

enum MHD_Result http_reply(http_req *q, int status, const char *content_type, char *body,
                           size_t len) {
    if (!body) {
        static const char oom[] = "{\"error\": {\"message\": \"out of memory\", \"type\": "
                                  "\"server_error\", \"param\": null, \"code\": null}}";
        body = strdup(oom);
        if (!body) return MHD_NO;
        len = strlen(body);
        status = 500;
        content_type = "application/json";
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (status == 429) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 405) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, q->allow);
    if (atomic_load(&q->srv->draining)) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    http_count(q, status);
    enum MHD_Result ok = MHD_queue_response(q->conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

enum MHD_Result http_reply_json(http_req *q, int status, cJSON *obj) {
    char *text = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    return http_reply(q, status, "application/json", text, text ? strlen(text) : 0);
}

enum MHD_Result http_reply_error(http_req *q, const api_error *e) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_CreateObject();
    if (!root || !err) {
        cJSON_Delete(root);
        cJSON_Delete(err);
        return http_reply(q, 500, NULL, NULL, 0);
    }
    cJSON_AddItemToObject(root, "error", err);
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0]) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    if (e->code) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    return http_reply_json(q, e->status, root);
}

static enum MHD_Result reply_fail(http_req *q, int status, const char *type, const char *code,
                                  const char *message) {
    api_error e;
    api_fail(&e, status, type, code, NULL, "%s", message);
    return http_reply_error(q, &e);
}

/* ---- the small routes ---------------------------------------------------------------------- */

static cJSON *model_entry(server *s, const char *name, const nopad_model_info *info, const char *kind) {
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON_AddStringToObject(m, "id", name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->created);
    cJSON_AddStringToObject(m, "owned_by", "nopad");
    cJSON_AddStringToObject(m, "type", kind);
    cJSON_AddNumberToObject(m, "max_model_len",
                            info->is_decoder ? s->context_tokens : info->max_seq_length);
    return m;
}

static enum MHD_Result handle_models(http_req *q) {
    server *s = q->srv;
    cJSON *root = cJSON_CreateObject(), *data = cJSON_CreateArray();
    if (root && data) {
        cJSON_AddStringToObject(root, "object", "list");
        cJSON_AddItemToObject(root, "data", data);
        if (s->engine) cJSON_AddItemToArray(data, model_entry(s, s->decoder_name, &s->dec_info, "generation"));
        if (s->batcher) cJSON_AddItemToArray(data, model_entry(s, s->encoder_name, &s->enc_info, "embedding"));
    } else {
        cJSON_Delete(data);
    }
    return http_reply_json(q, 200, root);
}

static enum MHD_Result handle_health(http_req *q) {
    const int draining = atomic_load(&q->srv->draining);
    cJSON *root = cJSON_CreateObject();
    if (root) cJSON_AddStringToObject(root, "status", draining ? "draining" : "ok");
    return http_reply_json(q, draining ? 503 : 200, root);
}

static enum MHD_Result handle_metrics(http_req *q) {
    server *s = q->srv;
    metrics_gauges g = {.draining = atomic_load(&s->draining),
                        .http_inflight = atomic_load(&s->inflight)};
    if (s->engine) g.have_engine = nopad_engine_get_stats(s->engine, &g.engine) == NOPAD_OK;
    if (s->batcher) {
        g.have_embed = 1;
        g.embed_queue = embed_batcher_queue(s->batcher);
    }
    size_t len = 0;
    char *text = metrics_render(&s->metrics, &g, &len);
    return http_reply(q, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
}

/* ---- routing ------------------------------------------------------------------------------- */

typedef struct route {
    const char *path, *method;
    metrics_route id;
    int needs_key;
} route;

static const route routes[] = {
    {"/v1/completions", "POST", ROUTE_COMPLETIONS, 1},
    {"/v1/chat/completions", "POST", ROUTE_CHAT, 1},
    {"/v1/responses", "POST", ROUTE_RESPONSES, 1},
    {"/v1/embeddings", "POST", ROUTE_EMBEDDINGS, 1},
    {"/embed", "POST", ROUTE_EMBED, 1},
    {"/predict", "POST", ROUTE_PREDICT, 1},
    {"/rerank", "POST", ROUTE_RERANK, 1},
    {"/v1/models", "GET", ROUTE_MODELS, 1},
    {"/health", "GET", ROUTE_HEALTH, 0},
    {"/metrics", "GET", ROUTE_METRICS, 0},
};
enum { N_ROUTE_ENTRIES = sizeof routes / sizeof routes[0] };

/* A constant-time comparison of the key, so its length and bytes do not leak through timing. */
static int key_matches(const char *got, const char *want) {
    const size_t n = strlen(want), m = got ? strlen(got) : 0;
    unsigned diff = (unsigned)(n ^ m);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)want[i] ^ (unsigned char)(i < m ? got[i] : 0);
    return got && diff == 0;
}

/* The first call for a request: route, method, key, draining, the announced body size. Returns
 * MHD_YES with *done = 0 to read the body, or the reply's result with *done = 1. */
static enum MHD_Result first_call(http_req *q, const char *url, const char *method, int *done) {
    server *s = q->srv;
    *done = 1;
    const route *rt = NULL;
    char *allow = q->allow; /* the path's methods */
    /* HEAD is GET without the body, which libmicrohttpd leaves out of a HEAD's answer */
    const char *as = strcmp(method, "HEAD") == 0 ? "GET" : method;
    for (int i = 0; i < N_ROUTE_ENTRIES; i++)
        if (strcmp(url, routes[i].path) == 0) {
            const int get = strcmp(routes[i].method, "GET") == 0;
            snprintf(allow + strlen(allow), sizeof q->allow - strlen(allow), "%s%s%s", allow[0] ? ", " : "",
                     routes[i].method, get ? ", HEAD" : "");
            if (strcmp(as, routes[i].method) == 0) rt = &routes[i];
        }
    q->route = rt ? rt->id : ROUTE_OTHER;
    if (!allow[0]) {
        char msg[300];
        snprintf(msg, sizeof msg, "no route %.200s", url);
        return reply_fail(q, 404, "invalid_request_error", "not_found", msg);
    }
    if (!rt) {
        char msg[300];
        snprintf(msg, sizeof msg, "%.200s takes %s, not %.20s", url, allow, method);
        return reply_fail(q, 405, "invalid_request_error", "method_not_allowed", msg);
    }
    if (atomic_load(&s->draining) && rt->id != ROUTE_HEALTH && rt->id != ROUTE_METRICS)
        return reply_fail(q, 503, "server_error", "shutting_down", "the server is shutting down");
    if (s->o.api_key && rt->needs_key) {
        const char *auth = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        const char *key = auth && strncmp(auth, "Bearer ", 7) == 0 ? auth + 7 : NULL;
        if (!key_matches(key, s->o.api_key))
            return reply_fail(q, 401, "invalid_request_error", "invalid_api_key",
                              auth ? "invalid API key" : "missing API key: send 'Authorization: Bearer <key>'");
    }
    const char *cl = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > (unsigned long long)s->o.max_body_bytes) {
        char msg[200];
        snprintf(msg, sizeof msg, "the body (%.30s bytes) is over the limit of %ld bytes", cl,
                 s->o.max_body_bytes);
        return reply_fail(q, 413, "invalid_request_error", "body_too_large", msg);
    }
    *done = 0;
    return MHD_YES;
}

static enum MHD_Result dispatch(http_req *q) {
    switch (q->route) {
    case ROUTE_COMPLETIONS: return gen_handle(q, GEN_COMPLETION);
    case ROUTE_CHAT: return gen_handle(q, GEN_CHAT);
    case ROUTE_RESPONSES: return gen_handle(q, GEN_RESPONSES);
    case ROUTE_EMBEDDINGS: return embed_handle(q, 0);
    case ROUTE_EMBED: return embed_handle(q, 1);
    case ROUTE_PREDICT: return classify_handle(q, 0);
    case ROUTE_RERANK: return classify_handle(q, 1);
    case ROUTE_MODELS: return handle_models(q);
    case ROUTE_HEALTH: return handle_health(q);
    case ROUTE_METRICS: return handle_metrics(q);
    default: return reply_fail(q, 404, "invalid_request_error", "not_found", "no such route");
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls) {
    server *s = cls;
    http_req *q = *req_cls;
    if (!q) {
        q = calloc(1, sizeof *q);
        if (!q) return MHD_NO;
        q->srv = s;
        q->conn = conn;
        q->t0 = serve_now();
        *req_cls = q;
        atomic_fetch_add(&s->inflight, 1);
        int done;
        enum MHD_Result r = first_call(q, url, method, &done);
        if (done) q->too_large = -1; /* answered: whatever body follows is dropped */
        return r;
    }
    if (*upload_data_size) {
        const size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (q->too_large) return MHD_YES;
        if (q->len + n > (size_t)s->o.max_body_bytes) {
            q->too_large = 1;
            free(q->body);
            q->body = NULL;
            q->len = q->cap = 0;
            return MHD_YES;
        }
        if (q->len + n + 1 > q->cap) {
            size_t cap = q->cap ? q->cap : 4096;
            while (cap < q->len + n + 1) cap *= 2;
            char *b = realloc(q->body, cap);
            if (!b) return MHD_NO;
            q->body = b;
            q->cap = cap;
        }
        memcpy(q->body + q->len, upload_data, n);
        q->len += n;
        q->body[q->len] = '\0';
        return MHD_YES;
    }
    if (q->too_large < 0) return MHD_YES; /* answered on the first call */
    if (q->too_large) {
        char msg[120];
        snprintf(msg, sizeof msg, "the body is over the limit of %ld bytes", s->o.max_body_bytes);
        return reply_fail(q, 413, "invalid_request_error", "body_too_large", msg);
    }
    return dispatch(q);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe) {
    server *s = cls;
    http_req *q = *req_cls;
    if (!q) return;
    *req_cls = NULL;
    http_count(q, 499); /* no answer went out: the client left (or the server stopped) */
    if (q->gen) gen_request_closed(q, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
    if (q->emb) embed_request_closed(q);
    free(q->body);
    free(q);
    atomic_fetch_sub(&s->inflight, 1);
}

static void on_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    fputs("nopad serve: libmicrohttpd: ", stderr);
    vfprintf(stderr, fmt, ap);
}

struct MHD_Daemon *http_start(server *s, char *err, size_t err_len) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%ld", s->o.port);
    int rc = getaddrinfo(s->o.host, port, &hints, &ai);
    if (rc != 0 || !ai) {
        snprintf(err, err_len, "--host '%s': %s", s->o.host, rc ? gai_strerror(rc) : "no address");
        if (ai) freeaddrinfo(ai);
        return NULL;
    }
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)s->o.port, NULL, NULL, on_request, s,
        MHD_OPTION_EXTERNAL_LOGGER, on_log, NULL, /* first, so that every message goes through it */
        MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->o.http_threads,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)4096,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) snprintf(err, err_len, "cannot listen on %s:%ld (in use, or not an address of this machine)",
                     s->o.host, s->o.port);
    return d;
}

int http_port(struct MHD_Daemon *d) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    return info ? (int)info->port : -1;
}
