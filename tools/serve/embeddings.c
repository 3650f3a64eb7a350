/* POST /v1/embeddings and TEI's POST /embed on the encoder; TEI's POST /predict and /rerank on
 * its sequence-classification head (the same queue and thread: a batch holds jobs of one kind,
 * and a classification batch goes through nopad_classify_packed).
 *
 * Requests are tokenized on their connection's thread and queued; one batcher thread takes every
 * queued request (up to --embed-batch-tokens tokens; a larger request runs alone) and runs them
 * as one packed batch through the encoder (nopad_encode_packed: no padding, each input its own
 * sequence), then wakes each request's connection with its rows. Pooled rows come back
 * unnormalised; each request's normalisation (and Matryoshka `dimensions`) is applied to its own
 * rows, so requests with different settings still share a batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

typedef struct embed_job {
    waiter w;                 /* w.lock guards done, st, refs */
    int refs;                 /* the HTTP request's and the batcher's (while queued) */
    int32_t n;                /* inputs */
    int32_t *cu;              /* [n + 1] */
    int32_t *ids;             /* [cu[n]] */
    int classify;             /* 1: the head's logits (/predict, /rerank); 0: pooled rows */
    int32_t *types;           /* [cu[n]] token types of pairs, or NULL (all 0) */
    float *out;               /* [n, hidden] pooled, unnormalised; or [n, num_labels] logits */
    int done;
    nopad_status st;
    char error[512];
    struct embed_job *next;
} embed_job;

struct embed_batcher {
    server *srv;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    embed_job *head, *tail;
    int32_t queued;
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

static void finish_job(embed_job *j, nopad_status st, const char *error) {
    pthread_mutex_lock(&j->w.lock);
    j->st = st;
    if (error) snprintf(j->error, sizeof j->error, "%s", error);
    j->done = 1;
    waiter_wake(&j->w);
    pthread_mutex_unlock(&j->w.lock);
    job_release(j);
}

/* Runs jobs[0..n) as one packed batch. */
static void run_batch(embed_batcher *b, embed_job **jobs, int n) {
    server *s = b->srv;
    int32_t seqs = 0, tokens = 0;
    for (int i = 0; i < n; i++) {
        seqs += jobs[i]->n;
        tokens += jobs[i]->cu[jobs[i]->n];
    }
    const int classify = jobs[0]->classify;
    int with_types = 0;
    for (int i = 0; i < n; i++) with_types |= jobs[i]->types != NULL;
    /* the row width: the hidden size, or the head's labels */
    const int32_t H = classify ? nopad_model_num_labels(s->encoder) : s->enc_info.hidden_size;
    int32_t *cu = malloc(((size_t)seqs + 1) * sizeof *cu);
    int32_t *ids = malloc((size_t)tokens * sizeof *ids);
    int32_t *types = with_types ? calloc((size_t)tokens, sizeof *types) : NULL;
    float *pooled = malloc((size_t)seqs * (size_t)H * sizeof *pooled);
    nopad_status st = NOPAD_ERR_OUT_OF_MEMORY;
    char error[512] = "out of memory";
    if (cu && ids && pooled && (types || !with_types)) {
        int32_t k = 0, t = 0;
        cu[0] = 0;
        for (int i = 0; i < n; i++) {
            const embed_job *j = jobs[i];
            memcpy(ids + t, j->ids, (size_t)j->cu[j->n] * sizeof *ids);
            if (j->types) memcpy(types + t, j->types, (size_t)j->cu[j->n] * sizeof *types);
            for (int32_t q = 0; q < j->n; q++) cu[k + q + 1] = t + j->cu[q + 1];
            k += j->n;
            t += j->cu[j->n];
        }
        nopad_encode_params ep = nopad_encode_default_params();
        ep.normalize = 0;
        ep.batch_tokens = (int32_t)s->o.embed_batch_tokens;
        st = classify ? nopad_classify_packed(s->encoder, seqs, cu, ids, types, pooled)
                      : nopad_encode_packed(s->encoder, seqs, cu, ids, NULL, &ep, NULL, pooled);
        if (st != NOPAD_OK) snprintf(error, sizeof error, "%s", nopad_last_error());
    }
    if (st == NOPAD_OK) metrics_embed_batch(&s->metrics, seqs, tokens);
    int32_t row = 0;
    for (int i = 0; i < n; i++) {
        embed_job *j = jobs[i];
        if (st == NOPAD_OK) {
            j->out = malloc((size_t)j->n * (size_t)H * sizeof *j->out);
            if (j->out) memcpy(j->out, pooled + (size_t)row * H, (size_t)j->n * (size_t)H * sizeof *j->out);
        }
        row += j->n;
        finish_job(j, st == NOPAD_OK && !j->out ? NOPAD_ERR_OUT_OF_MEMORY : st,
                   st == NOPAD_OK && j->out ? NULL : error);
    }
    free(cu);
    free(ids);
    free(types);
    free(pooled);
}

static void *batcher_main(void *arg) {
    embed_batcher *b = arg;
    const int64_t budget = b->srv->o.embed_batch_tokens;
    embed_job **batch = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&b->lock);
    for (;;) {
        while (!b->head && !b->stop) pthread_cond_wait(&b->cond, &b->lock);
        if (!b->head) break; /* stopping, nothing left */
        int n = 0;
        int64_t tokens = 0;
        while (b->head && (n == 0 || (tokens + b->head->cu[b->head->n] <= budget &&
                                      b->head->classify == batch[0]->classify))) {
            if ((size_t)n == cap) {
                size_t c = cap ? 2 * cap : 64;
                embed_job **p = realloc(batch, c * sizeof *p);
                if (!p) break;
                batch = p;
                cap = c;
            }
            embed_job *j = b->head;
            b->head = j->next;
            if (!b->head) b->tail = NULL;
            b->queued--;
            tokens += j->cu[j->n];
            batch[n++] = j;
        }
        pthread_mutex_unlock(&b->lock);
        if (n) run_batch(b, batch, n);
        else { /* out of memory for the list: fail the first job rather than spin */
            pthread_mutex_lock(&b->lock);
            embed_job *j = b->head;
            b->head = j->next;
            if (!b->head) b->tail = NULL;
            b->queued--;
            pthread_mutex_unlock(&b->lock);
            finish_job(j, NOPAD_ERR_OUT_OF_MEMORY, "out of memory");
        }
        pthread_mutex_lock(&b->lock);
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

/* Finishes what is queued, then stops the thread. */
void embed_batcher_stop(embed_batcher *b) {
    if (!b) return;
    pthread_mutex_lock(&b->lock);
    b->stop = 1;
    pthread_cond_signal(&b->cond);
    pthread_mutex_unlock(&b->lock);
    pthread_join(b->thread, NULL);
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->cond);
    free(b);
}

int32_t embed_batcher_queue(embed_batcher *b) {
    pthread_mutex_lock(&b->lock);
    const int32_t n = b->queued;
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

static enum MHD_Result answer(http_req *q, const embed_request *r, embed_job *j) {
    server *s = q->srv;
    if (j->st != NOPAD_OK) {
        api_error e;
        api_fail(&e, 500, "server_error", NULL, NULL, "embedding failed: %s", j->error);
        return http_reply_error(q, &e);
    }
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
 * (the job released) and returns -1. */
static int enqueue(http_req *q, embed_job *j, api_error *e) {
    server *s = q->srv;
    embed_batcher *b = s->batcher;
    j->w.conn = q->conn;
    pthread_mutex_lock(&b->lock);
    const int full = b->queued >= s->o.max_queue;
    if (!full) {
        j->refs = 2;
        if (b->tail) b->tail->next = j;
        else b->head = j;
        b->tail = j;
        b->queued++;
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
    if (j->st != NOPAD_OK) {
        api_error e;
        api_fail(&e, 500, "server_error", NULL, NULL, "classification failed: %s", j->error);
        return http_reply_error(q, &e);
    }
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
