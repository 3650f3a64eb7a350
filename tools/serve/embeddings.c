/* POST /v1/embeddings and TEI's POST /embed on the encoder; TEI's POST /predict and /rerank on
 * its sequence-classification head (the same queue and thread: a batch holds jobs of one kind,
 * and a classification batch goes through nopad_classify_packed).
 *
 * Requests are tokenized on their connection's thread and queued; one batcher thread takes the
 * queued requests in turn, up to --embed-batch-tokens tokens, and runs them as one packed
 * batch through the encoder (nopad_encode_packed: no padding, each input its own sequence); a
 * request whose inputs are all done gets its connection woken with its rows. A larger request
 * thus runs in chunks between other requests, and is dropped between chunks once its client has
 * left. Pooled rows come back
 * unnormalised; each request's normalisation (and Matryoshka `dimensions`) is applied to its own
 * rows, so requests with different settings still share a batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

typedef struct embed_job {
    waiter w;                 /* w.lock guards done, status, st, error, refs */
    int refs;                 /* the HTTP request's and the batcher's (until it drops the job) */
    int32_t n;                /* inputs */
    int32_t *cu;              /* [n + 1] */
    int32_t *ids;             /* [cu[n]] */
    int classify;             /* 1: the head's logits (/predict, /rerank); 0: pooled rows */
    int32_t *types;           /* [cu[n]] token types of pairs, or NULL (all 0) */
    int32_t width;            /* of a row of out: the hidden size, or the head's labels */
    float *out;               /* [n, width] pooled, unnormalised, or logits; filled chunk by chunk */
    int32_t taken;            /* inputs handed to batches so far (the batcher's alone) */
    int done;
    int status;               /* once done: 200, 499 (the client left), 503 (shutdown), 500 */
    char error[512];
    struct embed_job *next;
} embed_job;

/* The batcher's queue holds the jobs with inputs left, in turn: a batch takes whole jobs from the
 * head on, up to --embed-batch-tokens; a job larger than that runs alone, a chunk of the budget a
 * batch, and goes back to the tail after each. A request that came during a large one's chunk
 * runs in the next batch: it waits for about one chunk, not for the whole large request. */
struct embed_batcher {
    server *srv;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    embed_job *head, *tail;
    embed_job **running;      /* [n_running] the jobs in the batch being computed */
    int n_running;
    int32_t held;             /* jobs accepted and not yet answered: queued or running */
    int stop;
};

static void job_release(embed_job *j) {
    pthread_mutex_lock(&j->w.lock);
    const int left = --j->refs;
    pthread_mutex_unlock(&j->w.lock);
    if (left) return;
    pthread_mutex_destroy(&j->w.lock);
    free(j->cu);
    free(j->ids);
    free(j->types);
    free(j->out);
    free(j);
}

/* With j->w.lock held: the job's answer is decided (the first decision stands); its connection
 * is woken to send it. */
static void end_job(embed_job *j, int status, const char *error) {
    if (j->done) return;
    j->done = 1;
    j->status = status;
    if (error) snprintf(j->error, sizeof j->error, "%s", error);
    waiter_wake(&j->w);
}

static void finish_job(embed_job *j, int status, const char *error) {
    pthread_mutex_lock(&j->w.lock);
    end_job(j, status, error);
    pthread_mutex_unlock(&j->w.lock);
}

/* With b->lock held: whether the job can be dropped from the queue: answered already (the
 * shutdown), or its client left (libmicrohttpd does not watch a suspended connection, so the
 * socket is looked at here); such a job is ended with 499 and counted as cancelled. */
static int job_abandoned(embed_batcher *b, embed_job *j) {
    pthread_mutex_lock(&j->w.lock);
    const int gone = !j->done && (!j->w.conn || waiter_client_gone(&j->w));
    if (gone) end_job(j, 499, "the client left");
    const int drop = j->done;
    pthread_mutex_unlock(&j->w.lock);
    if (gone) metrics_cancelled(&b->srv->metrics);
    return drop;
}

typedef struct slice {
    embed_job *job;
    int32_t from, to;         /* inputs [from, to) of the job */
} slice;

/* Runs the slices as one packed batch, writing each input's row into its job's out. Returns the
 * status and fills error[512] when it fails. */
static nopad_status run_batch(embed_batcher *b, const slice *sl, int n, char *error) {
    server *s = b->srv;
    int32_t seqs = 0, tokens = 0;
    for (int i = 0; i < n; i++) {
        const embed_job *j = sl[i].job;
        seqs += sl[i].to - sl[i].from;
        tokens += j->cu[sl[i].to] - j->cu[sl[i].from];
    }
    const int classify = sl[0].job->classify;
    const int32_t H = sl[0].job->width;
    int with_types = 0;
    for (int i = 0; i < n; i++) with_types |= sl[i].job->types != NULL;
    int32_t *cu = malloc(((size_t)seqs + 1) * sizeof *cu);
    int32_t *ids = malloc((size_t)tokens * sizeof *ids);
    int32_t *types = with_types ? calloc((size_t)tokens, sizeof *types) : NULL;
    float *pooled = malloc((size_t)seqs * (size_t)H * sizeof *pooled);
    nopad_status st = NOPAD_ERR_OUT_OF_MEMORY;
    snprintf(error, 512, "out of memory");
    if (cu && ids && pooled && (types || !with_types)) {
        int32_t k = 0, t = 0;
        cu[0] = 0;
        for (int i = 0; i < n; i++) {
            const embed_job *j = sl[i].job;
            const int32_t first = j->cu[sl[i].from], len = j->cu[sl[i].to] - first;
            memcpy(ids + t, j->ids + first, (size_t)len * sizeof *ids);
            if (j->types) memcpy(types + t, j->types + first, (size_t)len * sizeof *types);
            for (int32_t q = sl[i].from; q < sl[i].to; q++) cu[++k] = t + j->cu[q + 1] - first;
            t += len;
        }
        nopad_encode_params ep = nopad_encode_default_params();
        ep.normalize = 0;
        ep.batch_tokens = (int32_t)s->o.embed_batch_tokens;
        st = classify ? nopad_classify_packed(s->encoder, seqs, cu, ids, types, pooled)
                      : nopad_encode_packed(s->encoder, seqs, cu, ids, NULL, &ep, NULL, pooled);
        if (st != NOPAD_OK) snprintf(error, 512, "%s", nopad_last_error());
    }
    if (st == NOPAD_OK) {
        metrics_embed_batch(&s->metrics, seqs, tokens);
        int32_t row = 0;
        for (int i = 0; i < n; i++) {
            const int32_t rows = sl[i].to - sl[i].from;
            memcpy(sl[i].job->out + (size_t)sl[i].from * H, pooled + (size_t)row * H,
                   (size_t)rows * (size_t)H * sizeof *pooled);
            row += rows;
        }
    }
    free(cu);
    free(ids);
    free(types);
    free(pooled);
    return st;
}

/* With b->lock held: unlinks the queue's head. */
static embed_job *pop_head(embed_batcher *b) {
    embed_job *j = b->head;
    b->head = j->next;
    if (!b->head) b->tail = NULL;
    j->next = NULL;
    return j;
}

static void push_tail(embed_batcher *b, embed_job *j) {
    j->next = NULL;
    if (b->tail) b->tail->next = j;
    else b->head = j;
    b->tail = j;
}


static void *batcher_main(void *arg) {
    embed_batcher *b = arg;
    const int64_t budget = b->srv->o.embed_batch_tokens;
    slice *batch = NULL;
    size_t cap = 0;
    char error[512];
    pthread_mutex_lock(&b->lock);
    for (;;) {
        while (!b->head && !b->stop) pthread_cond_wait(&b->cond, &b->lock);
        if (b->stop) { /* the server has stopped: no connection is left to answer */
            while (b->head) {
                embed_job *j = pop_head(b);
                b->held--;
                finish_job(j, 503, "the server is shutting down");
                job_release(j);
            }
            break;
        }
        /* the batch: whole jobs from the head on, up to the budget, or a chunk of a larger one */
        int n = 0;
        int64_t tokens = 0;
        while (b->head && b->head->taken == b->head->n) { /* no input at all: nothing to compute */
            embed_job *j = pop_head(b);
            b->held--;
            finish_job(j, 200, NULL);
            job_release(j);
        }
        while (b->head && (n == 0 || (tokens < budget && b->head->classify == batch[0].job->classify))) {
            embed_job *j = b->head;
            if (job_abandoned(b, j)) {
                pop_head(b);
                b->held--;
                job_release(j);
                continue;
            }
            if ((size_t)n == cap) {
                size_t c = cap ? 2 * cap : 64;
                slice *p = realloc(batch, c * sizeof *p);
                if (!p) break;
                batch = p;
                cap = c;
            }
            /* whole requests while they fit; one larger than the room left waits for a batch of
             * its own, where it runs as far as the budget goes (one input at least) */
            if (n > 0 && tokens + j->cu[j->n] - j->cu[j->taken] > budget) break;
            int32_t to = j->taken;
            while (to < j->n && (to == j->taken || tokens + j->cu[to + 1] - j->cu[j->taken] <= budget)) to++;
            batch[n++] = (slice){j, j->taken, to};
            tokens += j->cu[to] - j->cu[j->taken];
            j->taken = to;
            pop_head(b);
            if (to < j->n) break; /* alone, and the budget is spent: the rest waits its turn */
        }
        if (n == 0) {
            if (b->head && cap == 0) { /* out of memory for the list: fail the head rather than spin */
                embed_job *j = pop_head(b);
                b->held--;
                finish_job(j, 500, "out of memory");
                job_release(j);
            }
            continue;
        }
        embed_job **running = realloc(b->running, (size_t)n * sizeof *running);
        if (running) { /* for embed_cancel_all; without it the shutdown waits for this batch */
            b->running = running;
            for (int i = 0; i < n; i++) b->running[b->n_running++] = batch[i].job;
        }
        pthread_mutex_unlock(&b->lock);
        const nopad_status st = run_batch(b, batch, n, error);
        pthread_mutex_lock(&b->lock);
        b->n_running = 0;
        for (int i = 0; i < n; i++) {
            embed_job *j = batch[i].job;
            if (st != NOPAD_OK) finish_job(j, 500, error);
            else if (j->taken == j->n) finish_job(j, 200, NULL);
            pthread_mutex_lock(&j->w.lock);
            const int done = j->done;
            pthread_mutex_unlock(&j->w.lock);
            if (done) {
                b->held--;
                job_release(j);
            } else {
                push_tail(b, j); /* behind what came meanwhile */
            }
        }
    }
    pthread_mutex_unlock(&b->lock);
    free(batch);
    return NULL;
}

nopad_status embed_batcher_start(server *s, embed_batcher **out) {
    embed_batcher *b = calloc(1, sizeof *b);
    if (!b) return NOPAD_ERR_OUT_OF_MEMORY;
    b->srv = s;
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
    if (pthread_create(&b->thread, NULL, batcher_main, b) != 0) {
        pthread_mutex_destroy(&b->lock);
        pthread_cond_destroy(&b->cond);
        free(b);
        return NOPAD_ERR_INTERNAL;
    }
    *out = b;
    return NOPAD_OK;
}

void embed_cancel_all(embed_batcher *b) {
    if (!b) return;
    pthread_mutex_lock(&b->lock);
    for (embed_job *j = b->head; j; j = j->next)
        finish_job(j, 503, "the server is shutting down");
    for (int i = 0; i < b->n_running; i++)
        finish_job(b->running[i], 503, "the server is shutting down");
    pthread_cond_signal(&b->cond); /* the queued ones are dropped at the next batch */
    pthread_mutex_unlock(&b->lock);
}

/* Ends the thread after its batch; what is left is dropped (no connection is left to answer). */
void embed_batcher_stop(embed_batcher *b) {
    if (!b) return;
    pthread_mutex_lock(&b->lock);
    b->stop = 1;
    pthread_cond_signal(&b->cond);
    pthread_mutex_unlock(&b->lock);
    pthread_join(b->thread, NULL);
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->cond);
    free(b->running);
    free(b);
}

int32_t embed_batcher_queue(embed_batcher *b) {
    pthread_mutex_lock(&b->lock);
    const int32_t n = b->held;
    pthread_mutex_unlock(&b->lock);
    return n;
}

/* ---- the routes ------------------------------------------------------------------------------ */

/* The inputs as one packed stream of ids: texts tokenized, ids checked. */
static int pack_inputs(server *s, const embed_request *r, embed_job *j, api_error *e) {
    const int32_t maxlen = s->enc_info.max_seq_length;
    const int32_t vocab = s->enc_info.vocab_size;
    size_t cap = 0, total = 0;
    j->cu = malloc(((size_t)r->n_inputs + 1) * sizeof *j->cu);
    if (!j->cu) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    j->cu[0] = 0;
    nopad_tokenize_params tp = nopad_tokenize_default_params();
    tp.truncate = r->truncate;
    tp.max_length = maxlen;
    const char *name = r->tei ? "inputs" : "input";
    for (int i = 0; i < r->n_inputs; i++) {
        const size_t room = r->texts ? strlen(r->texts[i]) + 16 : (size_t)r->n_ids[i];
        if (total + room > cap) {
            size_t c = cap ? cap : 1024;
            while (c < total + room) c *= 2;
            int32_t *p = realloc(j->ids, c * sizeof *p);
            if (!p) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            j->ids = p;
            cap = c;
        }
        int32_t n = 0;
        if (r->texts) {
            nopad_status st;
            for (;;) {
                st = nopad_tokenize(s->enc_tok, r->texts[i], strlen(r->texts[i]), &tp, j->ids + total,
                                    (int32_t)(cap - total), &n);
                if (st != NOPAD_ERR_BUFFER_TOO_SMALL) break;
                int32_t *p = realloc(j->ids, (total + (size_t)n) * sizeof *p);
                if (!p) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
                j->ids = p;
                cap = total + (size_t)n;
            }
            if (st == NOPAD_ERR_TOO_LONG)
                return api_fail(e, 400, "invalid_request_error", "context_length_exceeded", name,
                                "%s[%d] has %d tokens; the model takes at most %d%s", name, i, n,
                                maxlen, r->tei ? " (set \"truncate\": true to cut it)" : "");
            if (st != NOPAD_OK)
                return api_fail(e, 400, "invalid_request_error", "invalid_value", name,
                                "%s[%d]: %s", name, i, nopad_last_error());
        } else {
            n = r->n_ids[i];
            if (n > maxlen) {
                if (!r->truncate)
                    return api_fail(e, 400, "invalid_request_error", "context_length_exceeded", name,
                                    "%s[%d] has %d tokens; the model takes at most %d", name, i, n,
                                    maxlen);
                n = maxlen;
            }
            for (int32_t k = 0; k < n; k++) {
                if (r->ids[i][k] >= vocab)
                    return api_fail(e, 400, "invalid_request_error", "invalid_value", name,
                                    "%s[%d] holds token id %d, outside the vocabulary [0, %d)",
                                    name, i, r->ids[i][k], vocab);
                j->ids[total + (size_t)k] = r->ids[i][k];
            }
        }
        total += (size_t)n;
        if (total > INT32_MAX / 2)
            return api_fail(e, 413, "invalid_request_error", "too_many_tokens", name,
                            "the inputs hold too many tokens");
        j->cu[i + 1] = (int32_t)total;
    }
    j->n = r->n_inputs;
    return 0;
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* One row as JSON text: "[x, ...]" or a base64 string of little-endian float32s. */
static char *row_text(const float *x, int32_t d, int base64) {
    if (base64) {
        const size_t n = (size_t)d * 4, len = 4 * ((n + 2) / 3);
        char *s = malloc(len + 3);
        if (!s) return NULL;
        const unsigned char *p = (const unsigned char *)x; /* x86 and ARM Linux are little-endian */
        size_t o = 0;
        s[o++] = '"';
        for (size_t i = 0; i < n; i += 3) {
            const unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) |
                               (i + 2 < n ? p[i + 2] : 0);
            s[o++] = b64[v >> 18 & 63];
            s[o++] = b64[v >> 12 & 63];
            s[o++] = i + 1 < n ? b64[v >> 6 & 63] : '=';
            s[o++] = i + 2 < n ? b64[v & 63] : '=';
        }
        s[o++] = '"';
        s[o] = '\0';
        return s;
    }
    char *s = malloc((size_t)d * 18 + 3);
    if (!s) return NULL;
    size_t o = 0;
    s[o++] = '[';
    for (int32_t i = 0; i < d; i++)
        o += (size_t)snprintf(s + o, 18, i ? ",%.9g" : "%.9g", (double)x[i]);
    s[o++] = ']';
    s[o] = '\0';
    return s;
}

/* A job that ended without rows: its error reply; MHD_NO (closes the connection) when the client
 * left, counted as 499. */
static enum MHD_Result answer_failed(http_req *q, const embed_job *j, const char *what) {
    api_error e;
    if (j->status == 499) {
        http_count(q, 499);
        return MHD_NO;
    }
    if (j->status == 503)
        api_fail(&e, 503, "server_error", "cancelled", NULL, "the request was cancelled: %s", j->error);
    else
        api_fail(&e, 500, "server_error", NULL, NULL, "%s failed: %s", what, j->error);
    return http_reply_error(q, &e);
}

static enum MHD_Result answer(http_req *q, const embed_request *r, embed_job *j) {
    server *s = q->srv;
    if (j->status != 200) return answer_failed(q, j, "embedding");
    const int32_t H = s->enc_info.hidden_size, d = r->dimensions > 0 ? r->dimensions : H;
    const int normalize = r->normalize < 0 ? s->enc_info.normalize : r->normalize;
    cJSON *root = r->tei ? cJSON_CreateArray() : cJSON_CreateObject();
    cJSON *data = r->tei ? root : cJSON_CreateArray();
    int ok = root && data;
    for (int32_t i = 0; i < j->n && ok; i++) {
        float *x = j->out + (size_t)i * H;
        if (normalize) {
            double ss = 0;
            for (int32_t k = 0; k < d; k++) ss += (double)x[k] * x[k];
            const double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
            for (int32_t k = 0; k < d; k++) x[k] = (float)(x[k] * inv);
        }
        char *text = row_text(x, d, r->base64);
        cJSON *raw = text ? cJSON_CreateRaw(text) : NULL;
        free(text);
        if (!raw) {
            ok = 0;
            break;
        }
        if (r->tei) {
            cJSON_AddItemToArray(data, raw);
        } else {
            cJSON *item = cJSON_CreateObject();
            if (!item) {
                cJSON_Delete(raw);
                ok = 0;
                break;
            }
            cJSON_AddStringToObject(item, "object", "embedding");
            cJSON_AddNumberToObject(item, "index", i);
            cJSON_AddItemToObject(item, "embedding", raw);
            cJSON_AddItemToArray(data, item);
        }
    }
    if (ok && !r->tei) {
        cJSON_AddStringToObject(root, "object", "list");
        cJSON_AddItemToObject(root, "data", data);
        cJSON_AddStringToObject(root, "model", s->encoder_name);
        cJSON *u = cJSON_CreateObject();
        if (u) {
            cJSON_AddNumberToObject(u, "prompt_tokens", j->cu[j->n]);
            cJSON_AddNumberToObject(u, "total_tokens", j->cu[j->n]);
            cJSON_AddItemToObject(root, "usage", u);
        }
    } else if (!ok) {
        if (data != root) cJSON_Delete(data);
        cJSON_Delete(root);
        root = NULL;
    }
    return http_reply_json(q, ok ? 200 : 500, root);
}

/* Queues a packed job for the batcher (q->emb = j), or fills e with a 429 when the queue is full
 * (or a 500 without memory for its rows; the job released) and returns -1. */
static int enqueue(http_req *q, embed_job *j, api_error *e) {
    server *s = q->srv;
    embed_batcher *b = s->batcher;
    j->w.conn = q->conn;
    j->width = j->classify ? nopad_model_num_labels(s->encoder) : s->enc_info.hidden_size;
    j->out = malloc(((size_t)j->n * (size_t)j->width + 1) * sizeof *j->out);
    if (!j->out) {
        job_release(j);
        return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    pthread_mutex_lock(&b->lock);
    const int full = b->held >= s->o.max_queue;
    if (!full) {
        j->refs = 2;
        push_tail(b, j);
        b->held++;
        pthread_cond_signal(&b->cond);
    }
    pthread_mutex_unlock(&b->lock);
    if (full) {
        job_release(j);
        return api_fail(e, 429, "rate_limit_error", "queue_full", NULL,
                        "the server is busy (%ld embedding requests are waiting): retry later", s->o.max_queue);
    }
    q->emb = j;
    return 0;
}

enum MHD_Result embed_handle(http_req *q, int tei) {
    server *s = q->srv;
    api_error e;
    embed_request r;
    embed_job *j = q->emb;
    if (!s->batcher) {
        api_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                 "this server has no embedding model (start it with --embedding-model DIR)");
        return http_reply_error(q, &e);
    }
    /* parsed again after the wake-up: the body is kept, and parsing is cheap next to encoding */
    if (openai_parse_embeddings(q->body ? q->body : "", q->len, tei, &r, &e)) return http_reply_error(q, &e);
    enum MHD_Result result = MHD_YES;
    if (r.model && strcmp(r.model, s->encoder_name) != 0) {
        api_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                 "The model '%.200s' does not exist: this server embeds with '%s'", r.model,
                 s->encoder_name);
        result = http_reply_error(q, &e);
    } else if (r.dimensions > s->enc_info.hidden_size) {
        api_fail(&e, 400, "invalid_request_error", "invalid_value", "dimensions",
                 "'dimensions' must be at most %d, the model's size", s->enc_info.hidden_size);
        result = http_reply_error(q, &e);
    } else if (!j) {
        j = calloc(1, sizeof *j);
        if (!j) {
            api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
            result = http_reply_error(q, &e);
        } else if (pthread_mutex_init(&j->w.lock, NULL), j->refs = 1, pack_inputs(s, &r, j, &e)) {
            job_release(j);
            result = http_reply_error(q, &e);
        } else if (enqueue(q, j, &e)) {
            result = http_reply_error(q, &e);
        }
    }
    if (q->emb) {
        pthread_mutex_lock(&j->w.lock);
        const int done = j->done;
        if (!done) waiter_sleep(&j->w);
        pthread_mutex_unlock(&j->w.lock);
        if (done) result = answer(q, &r, j);
    }
    embed_request_free(&r);
    return result;
}

void embed_request_closed(http_req *q) {
    embed_job *j = q->emb;
    q->emb = NULL;
    pthread_mutex_lock(&j->w.lock);
    j->w.conn = NULL;
    pthread_mutex_unlock(&j->w.lock);
    job_release(j);
}

/* ---- TEI's /predict and /rerank ---------------------------------------------------------------- */

/* Each input (a text, or a pair through the tokenizer's pair template) as one packed stream;
 * the pairs' token types when the model has token types. */
static int pack_classify(server *s, const classify_request *r, embed_job *j, api_error *e) {
    const char *name = r->rerank ? "texts" : "inputs";
    int any_pair = 0;
    for (int i = 0; i < r->n_inputs; i++) any_pair |= r->b[i] != NULL;
    const int with_types = any_pair && s->enc_info.type_vocab_size > 1;
    nopad_tokenize_params tp = nopad_tokenize_default_params();
    tp.truncate = r->truncate;
    tp.max_length = s->enc_info.max_seq_length;
    size_t cap = 0, total = 0;
    int32_t *types = NULL; /* [cap] scratch for the types of one input */
    if (!(j->cu = malloc(((size_t)r->n_inputs + 1) * sizeof *j->cu)))
        return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    j->cu[0] = 0;
    int rc = 0;
    for (int i = 0; i < r->n_inputs && rc == 0; i++) {
        int32_t n = 0;
        nopad_status st;
        for (;;) {
            const int32_t room = (int32_t)(cap - total);
            st = r->b[i] ? nopad_tokenize_pair(s->enc_tok, r->a[i], strlen(r->a[i]), r->b[i], strlen(r->b[i]), &tp,
                                               j->ids ? j->ids + total : NULL, types, room, &n)
                         : nopad_tokenize(s->enc_tok, r->a[i], strlen(r->a[i]), &tp, j->ids ? j->ids + total : NULL,
                                          room, &n);
            if (st != NOPAD_ERR_BUFFER_TOO_SMALL) break;
            size_t c = cap ? 2 * cap : 1024;
            while (c < total + (size_t)n) c *= 2;
            int32_t *p = realloc(j->ids, c * sizeof *p), *tt = p ? realloc(types, (c - total) * sizeof *tt) : NULL;
            if (p) j->ids = p;
            if (tt) types = tt;
            if (!p || !tt) {
                rc = api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
                break;
            }
            cap = c;
        }
        if (rc) break;
        if (st == NOPAD_ERR_TOO_LONG)
            rc = api_fail(e, 400, "invalid_request_error", "context_length_exceeded", name,
                          "%s[%d] has %d tokens; the model takes at most %d (set \"truncate\": true to cut it)", name,
                          i, n, tp.max_length);
        else if (st != NOPAD_OK)
            rc = api_fail(e, 400, "invalid_request_error", "invalid_value", name, "%s[%d]: %s", name, i,
                          nopad_last_error());
        else if (n == 0)
            rc = api_fail(e, 400, "invalid_request_error", "invalid_value", name, "%s[%d] gives no tokens", name, i);
        else if (with_types) {
            int32_t *p = realloc(j->types, (total + (size_t)n) * sizeof *p);
            if (!p) {
                rc = api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
                break;
            }
            j->types = p;
            for (int32_t k = 0; k < n; k++) j->types[total + (size_t)k] = r->b[i] ? types[k] : 0;
        }
        total += (size_t)n;
        j->cu[i + 1] = (int32_t)total;
    }
    free(types);
    j->n = r->n_inputs;
    return rc;
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* One input's labels with their scores, best first: [{"score", "label"}, ...]. */
static cJSON *predictions(const server *s, const float *x, int32_t L, int raw) {
    cJSON *list = cJSON_CreateArray();
    double *score = malloc((size_t)L * sizeof *score);
    int32_t *order = malloc((size_t)L * sizeof *order);
    if (!list || !score || !order) {
        cJSON_Delete(list);
        list = NULL;
        goto done;
    }
    double mx = x[0], sum = 0;
    for (int32_t l = 1; l < L; l++) mx = x[l] > mx ? x[l] : mx;
    for (int32_t l = 0; l < L; l++) sum += exp((double)x[l] - mx);
    for (int32_t l = 0; l < L; l++) {
        score[l] = raw ? x[l] : L == 1 ? sigmoid(x[l]) : exp((double)x[l] - mx) / sum;
        order[l] = l;
    }
    for (int32_t a = 1; a < L; a++) /* insertion sort, best first; labels are few */
        for (int32_t b = a; b > 0 && score[order[b]] > score[order[b - 1]]; b--) {
            const int32_t t = order[b];
            order[b] = order[b - 1];
            order[b - 1] = t;
        }
    for (int32_t k = 0; k < L; k++) {
        cJSON *item = cJSON_CreateObject();
        if (!item) continue;
        cJSON_AddNumberToObject(item, "score", score[order[k]]);
        cJSON_AddStringToObject(item, "label", nopad_model_label(s->encoder, order[k]));
        cJSON_AddItemToArray(list, item);
    }
done:
    free(score);
    free(order);
    return list;
}

static enum MHD_Result answer_classify(http_req *q, const classify_request *r, embed_job *j) {
    server *s = q->srv;
    if (j->status != 200) return answer_failed(q, j, "classification");
    const int32_t L = nopad_model_num_labels(s->encoder);
    cJSON *root = NULL;
    if (r->rerank) { /* [{"index", "score"(, "text")}], best first */
        int *order = malloc((size_t)j->n * sizeof *order);
        root = order ? cJSON_CreateArray() : NULL;
        for (int i = 0; root && i < j->n; i++) order[i] = i;
        for (int a = 1; root && a < j->n; a++)
            for (int b = a; b > 0 && j->out[order[b]] > j->out[order[b - 1]]; b--) {
                const int t = order[b];
                order[b] = order[b - 1];
                order[b - 1] = t;
            }
        for (int k = 0; root && k < j->n; k++) {
            cJSON *item = cJSON_CreateObject();
            if (!item) continue;
            cJSON_AddNumberToObject(item, "index", order[k]);
            cJSON_AddNumberToObject(item, "score", r->raw_scores ? j->out[order[k]] : sigmoid(j->out[order[k]]));
            if (r->return_text) cJSON_AddStringToObject(item, "text", r->b[order[k]]);
            cJSON_AddItemToArray(root, item);
        }
        free(order);
    } else if (!r->batch) {
        root = predictions(s, j->out, L, r->raw_scores);
    } else {
        root = cJSON_CreateArray();
        for (int i = 0; root && i < j->n; i++) {
            cJSON *one = predictions(s, j->out + (size_t)i * L, L, r->raw_scores);
            if (one) cJSON_AddItemToArray(root, one);
        }
    }
    if (!root) {
        api_error e;
        api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        return http_reply_error(q, &e);
    }
    return http_reply_json(q, 200, root);
}

enum MHD_Result classify_handle(http_req *q, int rerank) {
    server *s = q->srv;
    api_error e;
    classify_request r;
    embed_job *j = q->emb;
    if (!s->batcher) {
        api_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                 "this server has no encoder (start it with --embedding-model DIR, a folder with a "
                 "sequence-classification head)");
        return http_reply_error(q, &e);
    }
    /* parsed again after the wake-up, as embed_handle does */
    if (openai_parse_classify(q->body ? q->body : "", q->len, rerank, &r, &e)) return http_reply_error(q, &e);
    enum MHD_Result result = MHD_YES;
    const int32_t L = nopad_model_num_labels(s->encoder);
    if (L == 0) {
        api_fail(&e, 400, "invalid_request_error", "model_not_classifier", NULL,
                 "the model '%s' has no sequence-classification head (config.json's architectures is not a "
                 "*ForSequenceClassification): %s needs one",
                 s->encoder_name, rerank ? "/rerank" : "/predict");
        result = http_reply_error(q, &e);
    } else if (rerank && L != 1) {
        api_fail(&e, 400, "invalid_request_error", "model_not_reranker", NULL,
                 "the model '%s' has %d labels; /rerank needs a one-label head (a cross-encoder): use /predict",
                 s->encoder_name, L);
        result = http_reply_error(q, &e);
    } else if (!j) {
        j = calloc(1, sizeof *j);
        if (!j) {
            api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
            result = http_reply_error(q, &e);
        } else if (pthread_mutex_init(&j->w.lock, NULL), j->refs = 1, j->classify = 1, pack_classify(s, &r, j, &e)) {
            job_release(j);
            result = http_reply_error(q, &e);
        } else if (enqueue(q, j, &e)) {
            result = http_reply_error(q, &e);
        }
    }
    if (q->emb) {
        pthread_mutex_lock(&j->w.lock);
        const int done = j->done;
        if (!done) waiter_sleep(&j->w);
        pthread_mutex_unlock(&j->w.lock);
        if (done) result = answer_classify(q, &r, j);
    }
    classify_request_free(&r);
    return result;
}
