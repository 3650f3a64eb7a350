/* POST /v1/completions, /v1/chat/completions and /v1/responses: one engine request per choice
 * (n of them, seeds seed, seed + 1, ...: the engine's prefix cache shares the prompt's KV blocks).
 *
 * The engine's thread hands each token's text to its choice's job (on_token) and has the waker
 * thread resume the connection (serve.h), which answers once every choice has ended (plain JSON)
 * or sends the text as Server-Sent Events as it comes (stream: true; every wake-up sends what
 * came since, each choice's chunks with its index, then `data: [DONE]`). A client that leaves
 * cancels its requests (nopad_request_free), which frees their KV blocks at the engine's next
 * iteration; a stream notices at its next write. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"
#include "structured.h"
#include "tool_calls.h"

struct gen_job {
    waiter w;                  /* choice 0's: wl of every choice */
    waiter *wl;                /* wl->lock guards everything below but the list links, in every
                                  choice of the request: one lock, one connection */
    gen_job *lead;             /* choice 0 (itself for choice 0) */
    int index;                 /* the choice's */
    gen_job **choices;         /* the lead's: its n_choices choices, itself first */
    int n_choices;
    server *srv;
    http_req *q;               /* NULL once the HTTP request has ended */
    int refs;                  /* the HTTP request's and the engine's (and the lead's: one for
                                  every other choice, which keeps the lead's lock alive) */
    gen_kind kind;
    int stream, include_usage;
    char id[40];
    long long created;
    nopad_request *req;        /* the MHD thread's alone */
    uint64_t engine_id;
    double t0;
    int32_t prompt_tokens, n_tokens;
    /* min_tokens, done here: the engine runs with ignore_eos (and without the stop ids), and the
     * first end id or stop id after min_tokens tokens ends the request (cancels it) */
    int32_t min_tokens;
    int32_t *end_ids;
    int32_t n_end_ids;
    int stopped;               /* ended that way */
    /* logprobs: every generated id (on_token), and how many the stream has reported;
     * top_logprobs: the alternatives a position lists (gen_request's) */
    int logprobs;
    int32_t top_logprobs;
    int32_t *ids;
    int32_t ids_cap, lp_sent;
    size_t lp_offset;          /* completions' text_offset of the next token, in characters (code
                                  points: what OpenAI's and vLLM's clients index) */
    char *text;                /* everything released so far */
    size_t text_len, text_cap, streamed; /* bytes of text already sent as events */
    int oom, done;
    /* tools offered (chat): the answer is parsed for calls at its end, and a stream holds back
     * what may be the start of one (tool_calls.h) */
    int tools, max_calls, called;
    chat_tool_format tool_format;
    int tool_choice_required;  /* "required" or named (tool_choice_name, "" for "required") */
    char tool_choice_name[72];
    /* /v1/responses: what its object repeats, its message item's id, its events' numbers */
    char *instructions;
    double temperature, top_p;
    int32_t max_output_tokens; /* -1: not given */
    char msg_id[40];
    long seq;
    int has_message;           /* the output holds the message item (streamed: announced) */
    char *final_text;          /* the message's text once done (with calls: the text outside them) */
    int answer_parsed;         /* with tools: the calls, parsed once so events and object agree */
    tool_answer answer;
    char (*call_ids)[32];
    int shutdown;              /* ended by the shutdown's deadline before the engine ended it */
    nopad_finish_reason finish;
    /* the event stream */
    char *out;
    size_t out_len, out_cap, out_pos;
    int role_sent, end_sent;   /* this choice's first and last chunks */
    int stream_ended;          /* the lead's: [DONE] written (responses: the last event) */
    /* server->jobs (under srv->jobs_lock) */
    gen_job *prev, *next;
    int listed, ended;
};

static uint64_t random_seed(server *s);

/* With the lock: every choice of lead's request has ended. */
static int all_done(const gen_job *lead) {
    for (int i = 0; i < lead->n_choices; i++)
        if (!lead->choices[i]->done) return 0;
    return 1;
}

static const char *finish_name(const gen_job *j) {
    if (j->called) return "tool_calls";
    if (j->stopped) return "stop";
    return nopad_finish_reason_name(j->finish);
}

static void job_release(gen_job *j) {
    pthread_mutex_lock(&j->wl->lock);
    const int left = --j->refs;
    pthread_mutex_unlock(&j->wl->lock);
    if (left) return;
    gen_job *lead = j->lead;
    if (lead == j) {
        pthread_mutex_destroy(&j->w.lock);
        free(j->choices);
    }
    free(j->end_ids);
    free(j->instructions);
    free(j->final_text);
    free(j->call_ids);
    tool_answer_free(&j->answer);
    free(j->ids);
    free(j->text);
    free(j->out);
    free(j);
    if (lead != j) job_release(lead); /* the choice's hold on the lead's lock */
}

static void release_job(void *arg) { job_release(arg); }

static void unlist(server *s, gen_job *j) {
    pthread_mutex_lock(&s->jobs_lock);
    if (j->listed) {
        if (j->prev) j->prev->next = j->next;
        else s->jobs = j->next;
        if (j->next) j->next->prev = j->prev;
        j->listed = 0;
    }
    j->ended = 1;
    pthread_mutex_unlock(&s->jobs_lock);
}

/* With s->jobs_lock held, j listed: answers j now (503, or a stream's error event) without
 * waiting for the engine, which acts on a cancel only between steps (a long prompt's step takes
 * seconds on the CPU) while libmicrohttpd must not be stopped with a connection suspended. */
static void end_by_shutdown(gen_job *j) {
    pthread_mutex_lock(&j->wl->lock);
    if (!j->done) {
        j->shutdown = j->done = 1;
        j->finish = NOPAD_FINISH_CANCELLED;
        waiter_wake(j->wl);
    }
    pthread_mutex_unlock(&j->wl->lock);
}

static int is_end_id(const gen_job *j, int32_t token) {
    for (int32_t i = 0; i < j->n_end_ids; i++)
        if (j->end_ids[i] == token) return 1;
    return 0;
}

/* On the engine's thread: keep it short. */
static void on_token(void *user, uint64_t request_id, int32_t token, const char *text,
                     nopad_finish_reason finish) {
    gen_job *j = user;
    server *s = j->srv;
    int cancel = 0;
    const int last = finish != NOPAD_FINISH_NONE;
    pthread_mutex_lock(&j->wl->lock);
    if (j->shutdown) { /* answered already (gen_cancel_all): its reference goes with the last call */
        pthread_mutex_unlock(&j->wl->lock);
        if (last) {
            unlist(s, j);
            job_release(j);
        }
        return;
    }
    if (!j->stopped && token >= 0) {
        if (j->logprobs && j->n_tokens == j->ids_cap) {
            const int32_t cap = j->ids_cap ? 2 * j->ids_cap : 64;
            int32_t *grown = realloc(j->ids, (size_t)cap * sizeof *grown);
            if (grown) j->ids = grown, j->ids_cap = cap;
            else j->oom = cancel = 1;
        }
        if (j->logprobs && j->n_tokens < j->ids_cap) j->ids[j->n_tokens] = token;
        if (j->n_tokens++ == 0) metrics_ttft(&s->metrics, serve_now() - j->t0);
        if (j->min_tokens > 0 && j->n_tokens > j->min_tokens && is_end_id(j, token))
            j->stopped = cancel = 1;
        const size_t n = text ? strlen(text) : 0;
        if (n && j->text_len + n + 1 > j->text_cap) {
            size_t cap = j->text_cap ? j->text_cap : 256;
            while (cap < j->text_len + n + 1) cap *= 2;
            char *t = realloc(j->text, cap);
            if (t) {
                j->text = t;
                j->text_cap = cap;
            } else {
                j->oom = cancel = 1;
            }
        }
        if (n && !j->oom) {
            memcpy(j->text + j->text_len, text, n);
            j->text_len += n;
            j->text[j->text_len] = '\0';
        }
    }
    if (last) {
        j->finish = finish;
        j->done = 1;
    }
    /* a stream sends each token as it comes; a plain answer waits for the end. The resume itself
     * goes to the waker thread (serve.h), which holds a reference until it is done. */
    const int wake = j->stream || last;
    if (wake) j->refs++;
    pthread_mutex_unlock(&j->wl->lock);
    if (wake) waker_post(s, j->wl, release_job, j);
    if (cancel) nopad_engine_cancel(s->engine, request_id);
    if (last) {
        unlist(s, j);
        job_release(j); /* the engine's reference: the last call */
    }
}

/* ---- answers ------------------------------------------------------------------------------- */

/* The completion tokens of every choice (lead: choice 0). */
static int32_t completion_tokens(const gen_job *lead) {
    int32_t n = 0;
    for (int i = 0; i < lead->n_choices; i++) n += lead->choices[i]->n_tokens;
    return n;
}

/* The prompt counted once (its KV blocks are shared), the choices' completions summed. */
static cJSON *usage_json(const gen_job *lead) {
    cJSON *u = cJSON_CreateObject();
    if (!u) return NULL;
    cJSON_AddNumberToObject(u, "prompt_tokens", lead->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", completion_tokens(lead));
    cJSON_AddNumberToObject(u, "total_tokens", lead->prompt_tokens + completion_tokens(lead));
    return u;
}

/* {"id", "object", "created", "model", "choices": [choice]} */
static cJSON *envelope(const gen_job *j, const char *object, cJSON *choice) {
    cJSON *root = cJSON_CreateObject(), *choices = cJSON_CreateArray();
    if (!root || !choices || !choice) {
        cJSON_Delete(root);
        cJSON_Delete(choices);
        cJSON_Delete(choice);
        return NULL;
    }
    cJSON_AddStringToObject(root, "id", j->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)j->created);
    cJSON_AddStringToObject(root, "model", j->srv->decoder_name);
    cJSON_AddItemToArray(choices, choice);
    cJSON_AddItemToObject(root, "choices", choices);
    return root;
}

/* A choice: completions {"index", "text", "logprobs", "finish_reason"}; chat {"index",
 * "message"|"delta", "logprobs", "finish_reason"}. text NULL: no text field (a chat delta {}). */
static cJSON *choice_json(const gen_job *j, const char *text, size_t len, int delta, int role,
                          const char *finish, cJSON *logprobs) {
    cJSON *c = cJSON_CreateObject();
    if (!c) {
        cJSON_Delete(logprobs);
        return NULL;
    }
    cJSON_AddNumberToObject(c, "index", j->index);
    char *t = NULL;
    if (text) {
        t = malloc(len + 1);
        if (!t) {
            cJSON_Delete(c);
            return NULL;
        }
        memcpy(t, text, len);
        t[len] = '\0';
    }
    if (j->kind == GEN_COMPLETION) {
        cJSON_AddStringToObject(c, "text", t ? t : "");
    } else {
        cJSON *m = cJSON_CreateObject();
        if (m) {
            if (role) cJSON_AddStringToObject(m, "role", "assistant");
            if (t) cJSON_AddStringToObject(m, "content", t);
            cJSON_AddItemToObject(c, delta ? "delta" : "message", m);
        }
    }
    free(t);
    if (logprobs) cJSON_AddItemToObject(c, "logprobs", logprobs);
    else cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    return c;
}

/* One token's text alone (special tokens as themselves), for the logprobs entries. */
static char *token_text(const gen_job *j, int32_t id) {
    size_t len = 0;
    char small[128];
    if (!j->srv->dec_tok) return strdup("");
    nopad_status st = nopad_detokenize(j->srv->dec_tok, &id, 1, 0, small, sizeof small, &len);
    if (st == NOPAD_OK) return strdup(small);
    if (st != NOPAD_ERR_BUFFER_TOO_SMALL) return strdup("");
    char *big = malloc(len + 1);
    if (big && nopad_detokenize(j->srv->dec_tok, &id, 1, 0, big, len + 1, &len) != NOPAD_OK) big[0] = '\0';
    return big;
}

/* A log-probability as JSON can hold it: -inf (an id that top-k, top-p, min-p or a constraint
 * dropped) is -9999.0, as vLLM reports it. */
static double finite_logprob(float lp) { return lp >= -9999.0f ? (double)lp : -9999.0; }

/* Chat's {"token", "logprob", "bytes"}: token is the id decoded alone (a token that is part of a
 * character is U+FFFD there, as nopad_detokenize gives it), bytes its raw bytes
 * (nopad_tokenizer_token_bytes), whose runs over several tokens make the characters; for a
 * tokenizer whose tokens have no bytes of their own (WordPiece, Unigram), the text's. NULL when out
 * of memory. */
static cJSON *chat_token_json(const gen_job *j, int32_t id, const char *text, float lp) {
    cJSON *entry = cJSON_CreateObject(), *bytes = cJSON_CreateArray();
    if (!entry || !bytes) {
        cJSON_Delete(entry), cJSON_Delete(bytes);
        return NULL;
    }
    uint8_t raw[256];
    size_t n_raw = 0;
    if (nopad_tokenizer_token_bytes(j->srv->dec_tok, id, raw, sizeof raw, &n_raw) == NOPAD_OK) {
        for (size_t i = 0; i < n_raw; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber(raw[i]));
    } else {
        for (const unsigned char *b = (const unsigned char *)text; *b; b++)
            cJSON_AddItemToArray(bytes, cJSON_CreateNumber(*b));
    }
    cJSON_AddStringToObject(entry, "token", text);
    cJSON_AddNumberToObject(entry, "logprob", finite_logprob(lp));
    cJSON_AddItemToObject(entry, "bytes", bytes);
    return entry;
}

/* The alternatives of one position, most likely first (ids -1, past the vocabulary, left out):
 * chat [{"token", "logprob", "bytes"}]; completions {token: logprob}, with the chosen token added
 * when it is not among them (OpenAI's legacy API: up to logprobs + 1 entries; two ids of the same
 * text share a key, the more likely one's value kept). NULL when out of memory. */
static cJSON *top_json(gen_job *j, const int32_t *ids, const float *lps, int32_t chosen, const char *chosen_text,
                       float chosen_lp) {
    const int chat = j->kind != GEN_COMPLETION;
    cJSON *top = chat ? cJSON_CreateArray() : cJSON_CreateObject();
    int has_chosen = 0;
    for (int32_t k = 0; top && k < j->top_logprobs; k++) {
        if (ids[k] < 0) continue;
        char *t = token_text(j, ids[k]);
        if (!t) {
            cJSON_Delete(top);
            return NULL;
        }
        has_chosen |= ids[k] == chosen;
        if (chat) cJSON_AddItemToArray(top, chat_token_json(j, ids[k], t, lps[k]));
        else if (!cJSON_HasObjectItem(top, t)) cJSON_AddNumberToObject(top, t, finite_logprob(lps[k]));
        free(t);
    }
    if (top && !chat && !has_chosen && !cJSON_HasObjectItem(top, chosen_text))
        cJSON_AddNumberToObject(top, chosen_text, finite_logprob(chosen_lp));
    return top;
}

/* With the job's lock: the logprobs of generated tokens [from, to) in the answer's format:
 * completions {"tokens", "token_logprobs", "top_logprobs" (null for logprobs 0), "text_offset"},
 * chat {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}. The
 * values are the engine's (the sampler's, nopad.h: nopad_request_logprobs and
 * nopad_request_top_logprobs). NULL when out of memory. */
static cJSON *logprobs_json(gen_job *j, int32_t from, int32_t to) {
    /* only [from, to) is read: a stream copies each token's values once */
    const size_t k = (size_t)j->top_logprobs, slots = (size_t)(to > from ? to - from : 1);
    float *lp = malloc(slots * sizeof *lp);
    int32_t *top_ids = k ? malloc(slots * k * sizeof *top_ids) : NULL;
    float *top_lps = k ? malloc(slots * k * sizeof *top_lps) : NULL;
    int32_t n = 0, n_top = 0;
    if (!lp || (k && (!top_ids || !top_lps)) || !j->req ||
        nopad_request_logprobs_from(j->req, from, lp, to - from, &n) != NOPAD_OK || n < to ||
        (k && (nopad_request_top_logprobs_from(j->req, from, top_ids, top_lps, to - from, &n_top) != NOPAD_OK ||
               n_top < to))) {
        free(lp), free(top_ids), free(top_lps);
        return NULL;
    }
    cJSON *o = cJSON_CreateObject();
    const int chat = j->kind != GEN_COMPLETION; /* /v1/responses lists chat's entries */
    cJSON *content = chat ? cJSON_CreateArray() : NULL;
    cJSON *tokens = chat ? NULL : cJSON_CreateArray(), *values = chat ? NULL : cJSON_CreateArray();
    cJSON *offsets = chat ? NULL : cJSON_CreateArray(), *tops = chat || !k ? NULL : cJSON_CreateArray();
    int ok = o && (chat ? content != NULL : tokens && values && offsets && (!k || tops));
    for (int32_t i = from; ok && i < to; i++) {
        char *t = token_text(j, j->ids[i]);
        const char *text = t ? t : "";
        const size_t r = (size_t)(i - from); /* its place in what was read */
        cJSON *top = k ? top_json(j, top_ids + r * k, top_lps + r * k, j->ids[i], text, lp[r]) : NULL;
        ok = !k || top;
        if (chat) {
            cJSON *entry = ok ? chat_token_json(j, j->ids[i], text, lp[r]) : NULL;
            ok = entry != NULL;
            if (entry) {
                cJSON_AddItemToObject(entry, "top_logprobs", top ? top : cJSON_CreateArray());
                cJSON_AddItemToArray(content, entry);
            } else {
                cJSON_Delete(top);
            }
        } else {
            cJSON_AddItemToArray(tokens, cJSON_CreateString(text));
            cJSON_AddItemToArray(values, cJSON_CreateNumber(finite_logprob(lp[r])));
            cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)j->lp_offset));
            if (top) cJSON_AddItemToArray(tops, top);
            for (const unsigned char *b = (const unsigned char *)text; *b; b++)
                j->lp_offset += (*b & 0xC0) != 0x80; /* characters, as clients index the text */
        }
        free(t);
    }
    free(lp), free(top_ids), free(top_lps);
    if (!ok) {
        cJSON_Delete(o), cJSON_Delete(content), cJSON_Delete(tokens), cJSON_Delete(values), cJSON_Delete(offsets),
            cJSON_Delete(tops);
        return NULL;
    }
    if (chat) {
        cJSON_AddItemToObject(o, "content", content);
        cJSON_AddNullToObject(o, "refusal");
    } else {
        cJSON_AddItemToObject(o, "tokens", tokens);
        cJSON_AddItemToObject(o, "token_logprobs", values);
        if (tops) cJSON_AddItemToObject(o, "top_logprobs", tops);
        else cJSON_AddNullToObject(o, "top_logprobs");
        cJSON_AddItemToObject(o, "text_offset", offsets);
    }
    return o;
}

/* With the job's lock: /v1/responses' "logprobs" of an output_text part or event, the entries of
 * generated tokens [from, to) as chat lists them; [] without logprobs. NULL when out of memory. */
static cJSON *response_logprobs(gen_job *j, int32_t from, int32_t to) {
    if (!j->logprobs || from >= to) return cJSON_CreateArray();
    cJSON *o = logprobs_json(j, from, to);
    cJSON *content = o ? cJSON_DetachItemFromObject(o, "content") : NULL;
    cJSON_Delete(o);
    return content;
}

/* "call_" and 24 random hex digits, as OpenAI's ids look. */
static void call_id(server *s, char out[32]) {
    static const char hex[] = "0123456789abcdef";
    memcpy(out, "call_", 5);
    for (int half = 0; half < 2; half++) {
        uint64_t x = random_seed(s);
        for (int k = 0; k < 12; k++, x >>= 4) out[5 + 12 * half + k] = hex[x & 15];
    }
    out[29] = '\0';
}

/* [{"index"?, "id", "type": "function", "function": {"name", "arguments"}}]; index in a stream's
 * delta only, as OpenAI sends them. */
static cJSON *tool_calls_json(server *s, const tool_answer *a, int with_index) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < a->n_calls; i++) {
        cJSON *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
        char id[32];
        call_id(s, id);
        if (!c || !f) {
            cJSON_Delete(c), cJSON_Delete(f), cJSON_Delete(arr);
            return NULL;
        }
        if (with_index) cJSON_AddNumberToObject(c, "index", i);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(f, "name", a->calls[i].name);
        cJSON_AddStringToObject(f, "arguments", a->calls[i].arguments);
        cJSON_AddItemToObject(c, "function", f);
        cJSON_AddItemToArray(arr, c);
    }
    return arr;
}

/* A chat choice whose answer called tools: message {"role", "content" (null when none),
 * "tool_calls"}, or a stream's delta {"content"?, "tool_calls"} (content: what was not sent yet). */
static cJSON *tool_choice_json(const gen_job *j, const tool_answer *a, const char *content, int delta,
                               cJSON *logprobs) {
    cJSON *c = cJSON_CreateObject(), *m = cJSON_CreateObject(), *calls = tool_calls_json(j->srv, a, delta);
    if (!c || !m || !calls) {
        cJSON_Delete(c), cJSON_Delete(m), cJSON_Delete(calls), cJSON_Delete(logprobs);
        return NULL;
    }
    cJSON_AddNumberToObject(c, "index", j->index);
    if (!delta) cJSON_AddStringToObject(m, "role", "assistant");
    if (content) cJSON_AddStringToObject(m, "content", content);
    else if (!delta) cJSON_AddNullToObject(m, "content");
    cJSON_AddItemToObject(m, "tool_calls", calls);
    cJSON_AddItemToObject(c, delta ? "delta" : "message", m);
    if (logprobs) cJSON_AddItemToObject(c, "logprobs", logprobs);
    else cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    return c;
}

/* With the job's lock, j done: parses the answer for calls (tools offered). 0 (a->n_calls 0: no
 * call, the answer is text), -1 out of memory. */
static int parse_calls(gen_job *j, tool_answer *a) {
    *a = (tool_answer){0};
    if (!j->tools) return 0;
    if (tool_answer_parse(j->tool_format, j->text ? j->text : "", j->text_len, j->max_calls, a))
        return -1;
    j->called = a->n_calls > 0;
    return 0;
}

/* With the lock, j (/v1/responses) done: its calls parsed once, their ids made then. -1 when
 * out of memory. */
static int response_calls(gen_job *j) {
    if (j->answer_parsed) return 0;
    if (parse_calls(j, &j->answer)) return -1;
    j->answer_parsed = 1;
    if (!j->answer.n_calls) return 0;
    if (!(j->call_ids = calloc((size_t)j->answer.n_calls, sizeof *j->call_ids))) return -1;
    for (int k = 0; k < j->answer.n_calls; k++) call_id(j->srv, j->call_ids[k]);
    return 0;
}

/* Why an ended request has no answer: the engine's error, or a cancellation (the shutdown). */
static void failure(gen_job *j, api_error *e) {
    if (j->oom) {
        api_fail(e, 500, "server_error", NULL, NULL, "out of memory for the answer");
    } else if (j->finish == NOPAD_FINISH_ERROR) {
        /* the error's status and message come once the ids are read */
        int32_t ids[256], n = 0;
        nopad_finish_reason fin;
        nopad_status st = NOPAD_OK;
        do st = nopad_request_read(j->req, ids, 256, &n, &fin, 0);
        while (st == NOPAD_OK && fin == NOPAD_FINISH_NONE && n > 0);
        api_fail(e, 500, "server_error", NULL, NULL, "generation failed: %s",
                 st != NOPAD_OK ? nopad_last_error() : "unknown error");
    } else {
        api_fail(e, 503, "server_error", "cancelled", NULL,
                 "the request was cancelled: the server is shutting down");
    }
}

static int failed(const gen_job *j) {
    return j->oom || j->finish == NOPAD_FINISH_ERROR || (j->finish == NOPAD_FINISH_CANCELLED && !j->stopped);
}

/* ---- /v1/responses ------------------------------------------------------------------------- */

/* The answer's message item: {"type": "message", "id", "status", "role", "content":
 * [{"type": "output_text", "text", "annotations": []}]} (content empty while in progress). */
static cJSON *response_message(gen_job *j, int with_text) {
    cJSON *item = cJSON_CreateObject(), *content = cJSON_CreateArray();
    if (!item || !content) {
        cJSON_Delete(item), cJSON_Delete(content);
        return NULL;
    }
    cJSON_AddStringToObject(item, "type", "message");
    cJSON_AddStringToObject(item, "id", j->msg_id);
    cJSON_AddStringToObject(item, "status", with_text ? (j->finish == NOPAD_FINISH_LENGTH ? "incomplete" : "completed")
                                                      : "in_progress");
    cJSON_AddStringToObject(item, "role", "assistant");
    if (with_text) {
        cJSON *part = cJSON_CreateObject();
        if (part) {
            cJSON_AddStringToObject(part, "type", "output_text");
            cJSON_AddStringToObject(part, "text", j->final_text ? j->final_text : j->text ? j->text : "");
            cJSON_AddItemToObject(part, "annotations", cJSON_CreateArray());
            cJSON_AddItemToObject(part, "logprobs", response_logprobs(j, 0, j->n_tokens));
            cJSON_AddItemToArray(content, part);
        }
    }
    cJSON_AddItemToObject(item, "content", content);
    return item;
}

/* Call k's output item {"type": "function_call", "id": "fc_...", "call_id", "name",
 * "arguments", "status"} (arguments "" while in progress, as OpenAI announces it). */
static cJSON *call_item(const gen_job *j, int k, int complete) {
    cJSON *item = cJSON_CreateObject();
    if (!item) return NULL;
    char id[40];
    snprintf(id, sizeof id, "fc_%s", j->call_ids[k] + 5);
    cJSON_AddStringToObject(item, "type", "function_call");
    cJSON_AddStringToObject(item, "id", id);
    cJSON_AddStringToObject(item, "call_id", j->call_ids[k]);
    cJSON_AddStringToObject(item, "name", j->answer.calls[k].name);
    cJSON_AddStringToObject(item, "arguments", complete ? j->answer.calls[k].arguments : "");
    cJSON_AddStringToObject(item, "status", complete ? "completed" : "in_progress");
    return item;
}

/* The response object: in progress (no output, no usage) or final (completed, or incomplete when
 * max_output_tokens ended it). */
static cJSON *response_json(gen_job *j, int final) {
    cJSON *r = cJSON_CreateObject(), *output = cJSON_CreateArray();
    if (!r || !output) {
        cJSON_Delete(r), cJSON_Delete(output);
        return NULL;
    }
    const int cut = final && j->finish == NOPAD_FINISH_LENGTH && !j->answer.n_calls;
    cJSON_AddStringToObject(r, "id", j->id);
    cJSON_AddStringToObject(r, "object", "response");
    cJSON_AddNumberToObject(r, "created_at", (double)j->created);
    cJSON_AddStringToObject(r, "status", !final ? "in_progress" : cut ? "incomplete" : "completed");
    cJSON_AddNullToObject(r, "error");
    if (cut) {
        cJSON *d = cJSON_AddObjectToObject(r, "incomplete_details");
        if (d) cJSON_AddStringToObject(d, "reason", "max_output_tokens");
    } else {
        cJSON_AddNullToObject(r, "incomplete_details");
    }
    if (j->instructions) cJSON_AddStringToObject(r, "instructions", j->instructions);
    else cJSON_AddNullToObject(r, "instructions");
    if (j->max_output_tokens > 0) cJSON_AddNumberToObject(r, "max_output_tokens", j->max_output_tokens);
    else cJSON_AddNullToObject(r, "max_output_tokens");
    cJSON_AddObjectToObject(r, "metadata");
    cJSON_AddStringToObject(r, "model", j->srv->decoder_name);
    if (final && j->has_message) cJSON_AddItemToArray(output, response_message(j, 1));
    for (int k = 0; final && k < j->answer.n_calls; k++) cJSON_AddItemToArray(output, call_item(j, k, 1));
    cJSON_AddItemToObject(r, "output", output);
    cJSON_AddTrueToObject(r, "parallel_tool_calls");
    cJSON_AddFalseToObject(r, "store"); /* nothing is kept after the answer */
    cJSON_AddNumberToObject(r, "temperature", j->temperature);
    cJSON *text = cJSON_AddObjectToObject(r, "text");
    cJSON *format = text ? cJSON_AddObjectToObject(text, "format") : NULL;
    if (format) cJSON_AddStringToObject(format, "type", "text");
    if (j->tool_choice_name[0]) {
        cJSON *choice = cJSON_AddObjectToObject(r, "tool_choice");
        if (choice) cJSON_AddStringToObject(choice, "type", "function");
        if (choice) cJSON_AddStringToObject(choice, "name", j->tool_choice_name);
    } else {
        cJSON_AddStringToObject(r, "tool_choice", j->tool_choice_required ? "required" : j->tools ? "auto" : "none");
    }
    cJSON_AddItemToObject(r, "tools", cJSON_CreateArray());
    cJSON_AddNumberToObject(r, "top_logprobs", j->top_logprobs);
    cJSON_AddNumberToObject(r, "top_p", j->top_p);
    cJSON_AddStringToObject(r, "truncation", "disabled");
    if (final) {
        cJSON *u = cJSON_AddObjectToObject(r, "usage");
        if (u) {
            cJSON_AddNumberToObject(u, "input_tokens", j->prompt_tokens);
            cJSON *d = cJSON_AddObjectToObject(u, "input_tokens_details");
            if (d) cJSON_AddNumberToObject(d, "cached_tokens", 0);
            cJSON_AddNumberToObject(u, "output_tokens", j->n_tokens);
            d = cJSON_AddObjectToObject(u, "output_tokens_details");
            if (d) cJSON_AddNumberToObject(d, "reasoning_tokens", 0);
            cJSON_AddNumberToObject(u, "total_tokens", j->prompt_tokens + j->n_tokens);
        }
    } else {
        cJSON_AddNullToObject(r, "usage");
    }
    return r;
}

/* "event: TYPE\ndata: {"type": TYPE, "sequence_number", ...obj's fields}\n\n"; deletes obj. */
static int out_put(gen_job *j, const char *s, size_t n);
static int response_event(gen_job *j, const char *type, cJSON *obj) {
    cJSON *ev = cJSON_CreateObject();
    if (!ev || !obj) {
        cJSON_Delete(ev), cJSON_Delete(obj);
        return -1;
    }
    cJSON_AddStringToObject(ev, "type", type);
    cJSON_AddNumberToObject(ev, "sequence_number", (double)j->seq++);
    while (obj->child) {
        cJSON *item = cJSON_DetachItemViaPointer(obj, obj->child);
        cJSON_AddItemToObject(ev, item->string, item); /* the key is copied before the old one goes */
    }
    cJSON_Delete(obj);
    char *s = cJSON_PrintUnformatted(ev);
    cJSON_Delete(ev);
    if (!s) return -1;
    const int rc = out_put(j, "event: ", 7) || out_put(j, type, strlen(type)) || out_put(j, "\ndata: ", 7) ||
                   out_put(j, s, strlen(s)) || out_put(j, "\n\n", 2);
    free(s);
    return rc;
}

/* {"response": the object} */
static cJSON *wrap_response(gen_job *j, int final) {
    cJSON *o = cJSON_CreateObject();
    if (o) cJSON_AddItemToObject(o, "response", response_json(j, final));
    return o;
}

/* {"item_id", "output_index": 0, "content_index": 0} and more fields to follow. */
static cJSON *text_event(const gen_job *j) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "item_id", j->msg_id);
    cJSON_AddNumberToObject(o, "output_index", 0);
    cJSON_AddNumberToObject(o, "content_index", 0);
    return o;
}

static cJSON *text_part(const char *text) {
    cJSON *p = cJSON_CreateObject();
    if (!p) return NULL;
    cJSON_AddStringToObject(p, "type", "output_text");
    cJSON_AddStringToObject(p, "text", text);
    cJSON_AddItemToObject(p, "annotations", cJSON_CreateArray());
    return p;
}

/* The message item's announcement: output_item.added, content_part.added. */
static int start_message(gen_job *j) {
    cJSON *item = cJSON_CreateObject(), *te = text_event(j);
    if (item) {
        cJSON_AddNumberToObject(item, "output_index", 0);
        cJSON_AddItemToObject(item, "item", response_message(j, 0));
    }
    if (te) cJSON_AddItemToObject(te, "part", text_part(""));
    j->has_message = 1;
    return response_event(j, "response.output_item.added", item) ||
           response_event(j, "response.content_part.added", te);
}

static int text_delta(gen_job *j, const char *text, size_t len) {
    if (!j->has_message && start_message(j)) return -1;
    cJSON *d = text_event(j);
    char *t = malloc(len + 1);
    if (d && t) {
        memcpy(t, text, len);
        t[len] = '\0';
        cJSON_AddStringToObject(d, "delta", t);
        /* the tokens generated since the last delta (a held-back piece of text reports its
         * tokens with the delta before it, as chat's chunks do) */
        cJSON_AddItemToObject(d, "logprobs", response_logprobs(j, j->lp_sent, j->n_tokens));
        j->lp_sent = j->n_tokens;
    }
    free(t);
    return response_event(j, "response.output_text.delta", t ? d : (cJSON_Delete(d), NULL));
}

/* With the job's lock: a /v1/responses stream's events for what came since the last call, as the
 * openai client's responses stream reads them: response.created and .in_progress; the message
 * item (output_item.added, content_part.added) once it has text, an output_text.delta per
 * release, output_text.done, content_part.done, output_item.done; with tools, each call an item
 * after it (output_item.added, function_call_arguments.delta and .done, output_item.done); then
 * .completed or .incomplete. A failure is an "error" event. With tools, what may be a call waits
 * for the end (tool_calls.h), and so does white space that leads the text (it may be all there is
 * before a call). The stream ends without [DONE], as OpenAI's does. */
static int fill_response_events(gen_job *j) {
    if (j->end_sent) return 0;
    if (!j->role_sent) {
        if (response_event(j, "response.created", wrap_response(j, 0)) ||
            response_event(j, "response.in_progress", wrap_response(j, 0)))
            return -1;
        j->role_sent = 1;
    }
    const int ok = j->done && !failed(j);
    if (ok && j->tools && response_calls(j)) return -1;
    const int calls = j->answer.n_calls > 0;
    const char *text = j->text ? j->text : "";
    size_t release = j->text_len;
    if (j->tools && !(ok && !calls)) {
        release = tool_text_releasable(j->tool_format, text, j->text_len);
        size_t lead = 0;
        while (lead < release && strchr(" \t\r\n", text[lead])) lead++;
        if (release < j->streamed || (!j->has_message && lead == release)) release = j->streamed;
    }
    if (release > j->streamed) {
        if (text_delta(j, text + j->streamed, release - j->streamed)) return -1;
        j->streamed = release;
    }
    if (!j->done) return 0;
    if (failed(j)) {
        api_error e;
        failure(j, &e);
        cJSON *err = cJSON_CreateObject();
        if (err) {
            if (e.code) cJSON_AddStringToObject(err, "code", e.code);
            else cJSON_AddStringToObject(err, "code", e.type);
            cJSON_AddStringToObject(err, "message", e.message);
            cJSON_AddNullToObject(err, "param");
        }
        if (response_event(j, "error", err)) return -1;
    } else {
        if (calls) {
            /* the content not sent yet: the calls' content (trimmed) after what was streamed */
            const char *sent = text;
            size_t n_sent = j->streamed;
            while (n_sent && strchr(" \t\r\n", *sent)) sent++, n_sent--;
            const char *rest = j->answer.content;
            if (rest && strlen(rest) >= n_sent && strncmp(rest, sent, n_sent) == 0) rest += n_sent;
            else rest = "";
            if (*rest && text_delta(j, rest, strlen(rest))) return -1;
            j->final_text = malloc(j->streamed + strlen(rest) + 1);
            if (!j->final_text) return -1;
            memcpy(j->final_text, text, j->streamed);
            strcpy(j->final_text + j->streamed, rest);
        } else if (!j->has_message && start_message(j)) { /* an answer without text has its item */
            return -1;
        }
        if (j->has_message) {
            const char *final = j->final_text ? j->final_text : text;
            cJSON *done = text_event(j), *part = text_event(j), *item = cJSON_CreateObject();
            if (done) {
                cJSON_AddStringToObject(done, "text", final);
                cJSON_AddItemToObject(done, "logprobs", response_logprobs(j, 0, j->n_tokens));
            }
            if (part) cJSON_AddItemToObject(part, "part", text_part(final));
            if (item) {
                cJSON_AddNumberToObject(item, "output_index", 0);
                cJSON_AddItemToObject(item, "item", response_message(j, 1));
            }
            if (response_event(j, "response.output_text.done", done) ||
                response_event(j, "response.content_part.done", part) ||
                response_event(j, "response.output_item.done", item))
                return -1;
        }
        for (int k = 0; k < j->answer.n_calls; k++) {
            const int index = j->has_message + k;
            char item_id[40];
            snprintf(item_id, sizeof item_id, "fc_%s", j->call_ids[k] + 5);
            cJSON *added = cJSON_CreateObject(), *delta = cJSON_CreateObject(),
                  *args = cJSON_CreateObject(), *done = cJSON_CreateObject();
            if (!added || !delta || !args || !done) {
                cJSON_Delete(added), cJSON_Delete(delta), cJSON_Delete(args), cJSON_Delete(done);
                return -1;
            }
            cJSON_AddNumberToObject(added, "output_index", index);
            cJSON_AddItemToObject(added, "item", call_item(j, k, 0));
            cJSON_AddStringToObject(delta, "item_id", item_id);
            cJSON_AddNumberToObject(delta, "output_index", index);
            cJSON_AddStringToObject(delta, "delta", j->answer.calls[k].arguments);
            cJSON_AddStringToObject(args, "item_id", item_id);
            cJSON_AddNumberToObject(args, "output_index", index);
            cJSON_AddStringToObject(args, "name", j->answer.calls[k].name);
            cJSON_AddStringToObject(args, "arguments", j->answer.calls[k].arguments);
            cJSON_AddNumberToObject(done, "output_index", index);
            cJSON_AddItemToObject(done, "item", call_item(j, k, 1));
            if (response_event(j, "response.output_item.added", added) ||
                response_event(j, "response.function_call_arguments.delta", delta) ||
                response_event(j, "response.function_call_arguments.done", args) ||
                response_event(j, "response.output_item.done", done))
                return -1;
        }
        const int cut = j->finish == NOPAD_FINISH_LENGTH && !calls;
        if (response_event(j, cut ? "response.incomplete" : "response.completed", wrap_response(j, 1)))
            return -1;
        metrics_tokens(&j->srv->metrics, j->prompt_tokens, j->n_tokens);
    }
    j->end_sent = j->stream_ended = 1;
    if (j->q) http_count(j->q, 200);
    return 0;
}

/* With the job's lock: choice j's part of a plain answer, or NULL (out of memory). */
static cJSON *plain_choice(gen_job *j) {
    cJSON *lp = j->logprobs ? logprobs_json(j, 0, j->n_tokens) : NULL;
    tool_answer calls;
    if (parse_calls(j, &calls)) {
        cJSON_Delete(lp);
        return NULL;
    }
    cJSON *choice = NULL;
    if (calls.n_calls) {
        choice = tool_choice_json(j, &calls, calls.content, 0, lp);
        if (choice) cJSON_ReplaceItemInObject(choice, "finish_reason", cJSON_CreateString("tool_calls"));
    } else {
        choice = choice_json(j, j->text ? j->text : "", j->text_len, 0, 1, finish_name(j), lp);
    }
    tool_answer_free(&calls);
    return choice;
}

/* The answer once every choice has ended (lead: choice 0): the first failure's error, or the
 * choices in index order. */
static enum MHD_Result answer_plain(http_req *q, gen_job *lead) {
    for (int i = 0; i < lead->n_choices; i++)
        if (failed(lead->choices[i])) {
            api_error e;
            failure(lead->choices[i], &e);
            return http_reply_error(q, &e);
        }
    if (lead->kind == GEN_RESPONSES) {
        pthread_mutex_lock(&lead->wl->lock);
        int rc = lead->tools ? response_calls(lead) : 0;
        if (!rc && lead->answer.n_calls && lead->answer.content)
            rc = !(lead->final_text = strdup(lead->answer.content));
        lead->has_message = !lead->answer.n_calls || lead->answer.content;
        cJSON *root = rc ? NULL : response_json(lead, 1);
        pthread_mutex_unlock(&lead->wl->lock);
        if (!root) {
            api_error e;
            api_fail(&e, 500, "server_error", NULL, NULL, "out of memory for the answer");
            return http_reply_error(q, &e);
        }
        metrics_tokens(&lead->srv->metrics, lead->prompt_tokens, lead->n_tokens);
        return http_reply_json(q, 200, root);
    }
    pthread_mutex_lock(&lead->wl->lock);
    cJSON *root = envelope(lead, lead->kind == GEN_CHAT ? "chat.completion" : "text_completion",
                           plain_choice(lead));
    cJSON *choices = root ? cJSON_GetObjectItemCaseSensitive(root, "choices") : NULL;
    for (int i = 1; root && i < lead->n_choices; i++) {
        cJSON *c = plain_choice(lead->choices[i]);
        if (!c) {
            cJSON_Delete(root);
            root = NULL;
        } else {
            cJSON_AddItemToArray(choices, c);
        }
    }
    pthread_mutex_unlock(&lead->wl->lock);
    if (!root) {
        api_error e;
        api_fail(&e, 500, "server_error", NULL, NULL, "out of memory for the answer");
        return http_reply_error(q, &e);
    }
    cJSON_AddItemToObject(root, "usage", usage_json(lead));
    metrics_tokens(&lead->srv->metrics, lead->prompt_tokens, completion_tokens(lead));
    return http_reply_json(q, 200, root);
}

/* ---- the event stream ----------------------------------------------------------------------- */

/* Into the lead's event buffer: the choices' events share the connection. */
static int out_put(gen_job *choice, const char *s, size_t n) {
    gen_job *j = choice->lead;
    if (j->out_len + n > j->out_cap) {
        size_t cap = j->out_cap ? j->out_cap : 1024;
        while (cap < j->out_len + n) cap *= 2;
        char *o = realloc(j->out, cap);
        if (!o) return -1;
        j->out = o;
        j->out_cap = cap;
    }
    memcpy(j->out + j->out_len, s, n);
    j->out_len += n;
    return 0;
}

/* "data: <json>\n\n"; deletes obj. */
static int out_event(gen_job *j, cJSON *obj) {
    char *s = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!s) return -1;
    const int rc = out_put(j, "data: ", 6) || out_put(j, s, strlen(s)) || out_put(j, "\n\n", 2);
    free(s);
    return rc;
}

static const char *chunk_object(const gen_job *j) {
    return j->kind == GEN_CHAT ? "chat.completion.chunk" : "text_completion";
}

/* With the job's lock: choice j's events for what came since the last call, up to its last chunk
 * (or its error event). */
static int fill_events(gen_job *j) {
    if (j->kind == GEN_CHAT && !j->role_sent) {
        if (out_event(j, envelope(j, chunk_object(j), choice_json(j, "", 0, 1, 1, NULL, NULL)))) return -1;
        j->role_sent = 1;
    }
    if (j->end_sent || j->lead->stream_ended) return 0;
    /* with tools, what may be a call waits for the end (then sent as calls, or as text) */
    tool_answer calls = {0};
    if (j->done && !j->end_sent && !failed(j) && parse_calls(j, &calls)) return -1;
    size_t release = j->text_len;
    if (j->tools && !(j->done && !calls.n_calls)) {
        /* white space that leads the text waits too: it may be all there is before a call */
        const char *text = j->text ? j->text : "";
        release = tool_text_releasable(j->tool_format, text, j->text_len);
        size_t lead = 0;
        while (lead < release && strchr(" \t\r\n", text[lead])) lead++;
        if (release < j->streamed || (!j->streamed && lead == release)) release = j->streamed;
    }
    if (release > j->streamed) {
        cJSON *lp = j->logprobs && j->n_tokens > j->lp_sent ? logprobs_json(j, j->lp_sent, j->n_tokens) : NULL;
        if (lp) j->lp_sent = j->n_tokens;
        if (out_event(j, envelope(j, chunk_object(j),
                                  choice_json(j, j->text + j->streamed, release - j->streamed,
                                              1, 0, NULL, lp)))) {
            tool_answer_free(&calls);
            return -1;
        }
        j->streamed = release;
    }
    if (calls.n_calls) {
        /* the content not sent yet: the calls' content (trimmed) after the text streamed before
         * the first call (white space before it left out) */
        const char *sent = j->text ? j->text : "";
        size_t n_sent = j->streamed;
        while (n_sent && strchr(" \t\r\n", *sent)) sent++, n_sent--;
        const char *rest = calls.content;
        if (rest && strlen(rest) >= n_sent && strncmp(rest, sent, n_sent) == 0) rest += n_sent;
        else rest = NULL;
        const int rc = out_event(j, envelope(j, chunk_object(j),
                                             tool_choice_json(j, &calls, rest && *rest ? rest : NULL, 1, NULL)));
        tool_answer_free(&calls);
        if (rc) return -1;
    }
    if (j->done && !j->end_sent) {
        if (failed(j)) {
            api_error e;
            failure(j, &e);
            cJSON *root = cJSON_CreateObject(), *err = cJSON_CreateObject();
            if (root && err) {
                cJSON_AddItemToObject(root, "error", err);
                cJSON_AddStringToObject(err, "message", e.message);
                cJSON_AddStringToObject(err, "type", e.type);
                cJSON_AddNullToObject(err, "param");
                if (e.code) cJSON_AddStringToObject(err, "code", e.code);
                else cJSON_AddNullToObject(err, "code");
            } else {
                cJSON_Delete(err);
            }
            if (out_event(j, root)) return -1;
        } else {
            if (out_event(j, envelope(j, chunk_object(j),
                                      choice_json(j, j->kind == GEN_CHAT ? NULL : "", 0, 1, 0,
                                                  finish_name(j),
                                                  j->logprobs && j->n_tokens > j->lp_sent
                                                      ? logprobs_json(j, j->lp_sent, j->n_tokens)
                                                      : NULL))))
                return -1;
        }
        j->end_sent = 1;
    }
    return 0;
}

/* With the lock: every choice's events (lead: choice 0), then, once all have ended, the usage
 * chunk when asked and [DONE]; a choice that failed ends the stream after its error event. */
static int fill_all(gen_job *lead) {
    if (lead->stream_ended) return 0;
    int ended = 1, failure = 0;
    for (int i = 0; i < lead->n_choices; i++) {
        gen_job *c = lead->choices[i];
        if (fill_events(c)) return -1;
        ended &= c->end_sent;
        failure |= c->end_sent && failed(c);
    }
    if (!ended && !failure) return 0;
    if (!failure) {
        if (lead->include_usage) {
            cJSON *root = envelope(lead, chunk_object(lead), cJSON_CreateObject());
            if (!root) return -1;
            cJSON_DeleteItemFromObject(root, "choices");
            cJSON_AddItemToObject(root, "choices", cJSON_CreateArray());
            cJSON_AddItemToObject(root, "usage", usage_json(lead));
            if (out_event(lead, root)) return -1;
        }
        metrics_tokens(&lead->srv->metrics, lead->prompt_tokens, completion_tokens(lead));
    }
    if (out_put(lead, "data: [DONE]\n\n", 14)) return -1;
    lead->stream_ended = 1;
    if (lead->q) http_count(lead->q, 200);
    return 0;
}

/* libmicrohttpd's content reader, on the connection's thread. */
static ssize_t read_events(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    gen_job *j = cls;
    pthread_mutex_lock(&j->wl->lock);
    if (j->out_pos == j->out_len) {
        j->out_pos = j->out_len = 0;
        if (j->kind == GEN_RESPONSES ? fill_response_events(j) : fill_all(j)) {
            pthread_mutex_unlock(&j->wl->lock);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    if (j->out_pos < j->out_len) {
        size_t n = j->out_len - j->out_pos;
        if (n > max) n = max;
        memcpy(buf, j->out + j->out_pos, n);
        j->out_pos += n;
        pthread_mutex_unlock(&j->wl->lock);
        return (ssize_t)n;
    }
    if (j->stream_ended) {
        pthread_mutex_unlock(&j->wl->lock);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    waiter_sleep(j->wl); /* until the next token: on_token resumes the connection */
    pthread_mutex_unlock(&j->wl->lock);
    return 0;
}

/* ---- starting a request -------------------------------------------------------------------- */

static int tokenize(server *s, const char *text, int32_t **ids, int32_t *n, api_error *e) {
    nopad_tokenize_params tp = nopad_tokenize_default_params();
    int32_t cap = (int32_t)(strlen(text) < 1000000 ? strlen(text) + 16 : 1000016);
    for (int attempt = 0; attempt < 2; attempt++) {
        *ids = malloc((size_t)cap * sizeof **ids);
        if (!*ids) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        nopad_status st = nopad_tokenize(s->dec_tok, text, strlen(text), &tp, *ids, cap, n);
        if (st == NOPAD_OK) return 0;
        free(*ids);
        *ids = NULL;
        if (st == NOPAD_ERR_BUFFER_TOO_SMALL && attempt == 0) {
            cap = *n;
            continue;
        }
        return api_fail(e, st == NOPAD_ERR_INVALID_ARGUMENT ? 400 : 500,
                        st == NOPAD_ERR_INVALID_ARGUMENT ? "invalid_request_error" : "server_error",
                        NULL, NULL, "cannot tokenize the prompt: %s", nopad_last_error());
    }
    return api_fail(e, 500, "server_error", NULL, NULL, "cannot tokenize the prompt");
}

/* The prompt's ids: the text tokenized, the ids given, or the messages through the template. */
static int prompt_ids(server *s, const gen_request *r, int32_t **ids, int32_t *n, api_error *e) {
    if (r->kind != GEN_COMPLETION) {
        if (!s->has_template)
            return api_fail(e, 400, "invalid_request_error", "no_chat_template",
                            r->kind == GEN_CHAT ? "messages" : "input",
                            "the model has no chat template: use /v1/completions, or start the "
                            "server with --chat-template NAME");
        size_t len;
        const int offer = r->n_tools && !r->tool_choice_none;
        char *text = chat_template_apply_tools(&s->tmpl, r->messages, r->n_messages, r->tools,
                                               offer ? r->n_tools : 0, &len);
        if (!text) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        const int rc = tokenize(s, text, ids, n, e);
        free(text);
        return rc;
    }
    if (r->prompt) return tokenize(s, r->prompt, ids, n, e);
    for (int32_t i = 0; i < r->n_prompt_ids; i++)
        if (r->prompt_ids[i] >= s->dec_info.vocab_size)
            return api_fail(e, 400, "invalid_request_error", "invalid_value", "prompt",
                            "'prompt' holds token id %d, outside the vocabulary [0, %d)",
                            r->prompt_ids[i], s->dec_info.vocab_size);
    *ids = malloc((size_t)r->n_prompt_ids * sizeof **ids);
    if (!*ids) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    memcpy(*ids, r->prompt_ids, (size_t)r->n_prompt_ids * sizeof **ids);
    *n = r->n_prompt_ids;
    return 0;
}

/* The text of token ids (special tokens left out, as the answers' text), or NULL when out of
 * memory. */
static char *detokenize(server *s, const int32_t *ids, int32_t n) {
    size_t len = 0, cap = 256;
    for (int attempt = 0; attempt < 2; attempt++) {
        char *text = malloc(cap);
        if (!text) return NULL;
        nopad_status st = nopad_detokenize(s->dec_tok, ids, (size_t)n, 1, text, cap, &len);
        if (st == NOPAD_OK) return text;
        free(text);
        if (st != NOPAD_ERR_BUFFER_TOO_SMALL) return strdup("");
        cap = len + 1;
    }
    return NULL;
}

static uint64_t random_seed(server *s) {
    uint64_t x = atomic_fetch_add(&s->next_id, 1) * 0x9E3779B97F4A7C15ull;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    x ^= (uint64_t)ts.tv_nsec * 0xBF58476D1CE4E5B9ull ^ (uint64_t)ts.tv_sec;
    x ^= x >> 31;
    return x;
}

/* Choice i of n_choices (i > 0: of lead's request), not yet submitted: the HTTP request's
 * reference and the engine's (and, for i > 0, one on the lead). NULL when out of memory. */
static gen_job *new_choice(http_req *q, const gen_request *r, gen_job *lead, int i, int n_choices,
                           int32_t prompt_tokens) {
    server *s = q->srv;
    gen_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->srv = s;
    j->q = q;
    j->refs = 2;
    j->index = i;
    if (lead) {
        j->lead = lead;
        j->wl = &lead->w;
        pthread_mutex_lock(&lead->w.lock);
        lead->refs++;
        pthread_mutex_unlock(&lead->w.lock);
        memcpy(j->id, lead->id, sizeof j->id);
    } else {
        j->lead = j;
        j->wl = &j->w;
        pthread_mutex_init(&j->w.lock, NULL);
        j->w.conn = q->conn;
        j->choices = calloc((size_t)n_choices, sizeof *j->choices);
        if (!j->choices) {
            pthread_mutex_destroy(&j->w.lock);
            free(j);
            return NULL;
        }
        if (r->kind == GEN_RESPONSES) /* OpenAI's ids: a prefix and hex */
            snprintf(j->id, sizeof j->id, "resp_%016llx%08llx", (unsigned long long)random_seed(s),
                     (unsigned long long)atomic_fetch_add(&s->next_id, 1) & 0xffffffffull);
        else
            snprintf(j->id, sizeof j->id, "%s-%llu", r->kind == GEN_CHAT ? "chatcmpl" : "cmpl",
                     (unsigned long long)atomic_fetch_add(&s->next_id, 1));
    }
    j->kind = r->kind;
    j->stream = r->stream;
    j->include_usage = r->include_usage;
    j->tools = r->kind != GEN_COMPLETION && r->n_tools && !r->tool_choice_none;
    j->tool_format = chat_template_tool_format(&s->tmpl);
    j->max_calls = r->parallel_tool_calls ? 0 : 1;
    j->tool_choice_required = r->tool_choice_required;
    if (r->tool_choice_named >= 0)
        snprintf(j->tool_choice_name, sizeof j->tool_choice_name, "%s", r->tools[r->tool_choice_named].name);
    j->created = (long long)time(NULL);
    j->t0 = q->t0;
    j->prompt_tokens = prompt_tokens;
    j->logprobs = r->logprobs;
    j->top_logprobs = r->top_logprobs;
    int oom = 0;
    if (r->kind == GEN_RESPONSES) {
        snprintf(j->msg_id, sizeof j->msg_id, "msg_%016llx", (unsigned long long)random_seed(s));
        j->temperature = r->temperature;
        j->top_p = r->top_p;
        j->max_output_tokens = r->max_tokens;
        oom |= r->instructions && !(j->instructions = strdup(r->instructions));
    }
    if (r->echo) { /* the prompt leads the text, as the first thing released */
        j->text = r->prompt ? strdup(r->prompt) : detokenize(s, r->prompt_ids, r->n_prompt_ids);
        oom |= !j->text;
        j->text_len = j->text ? strlen(j->text) : 0;
        j->text_cap = j->text_len + 1;
    }
    if (r->min_tokens > 0) {
        /* the end ids the engine would stop at, and the stop ids, are watched here instead */
        j->min_tokens = r->min_tokens;
        j->end_ids = malloc(((size_t)r->n_stop_ids + 1) * sizeof *j->end_ids);
        oom |= !j->end_ids;
        if (j->end_ids && r->n_stop_ids) memcpy(j->end_ids, r->stop_ids, (size_t)r->n_stop_ids * sizeof *j->end_ids);
        j->n_end_ids = r->n_stop_ids;
        if (j->end_ids && !r->ignore_eos && s->dec_info.eos_token_id >= 0)
            j->end_ids[j->n_end_ids++] = s->dec_info.eos_token_id;
    }
    if (oom) {
        j->refs = 1; /* no call will come */
        job_release(j);
        return NULL;
    }
    return j;
}

/* Submits choice j (its seed: the request's + its index, else a random one) and lists it; on
 * success it joins its lead's choices. -1 with e filled when the engine refuses it (j is gone). */
static int submit_choice(server *s, gen_job *j, const gen_request *r, const int32_t *ids, int32_t n,
                         int32_t max_tokens, api_error *e) {
    nopad_request_params p = nopad_request_default_params();
    p.prompt_ids = ids;
    p.n_prompt_ids = n;
    p.max_tokens = max_tokens;
    p.ignore_eos = r->ignore_eos;
    p.sampling.temperature = (float)r->temperature;
    p.sampling.top_k = r->top_k;
    p.sampling.top_p = (float)r->top_p;
    p.sampling.min_p = (float)r->min_p;
    p.sampling.repetition_penalty = (float)r->repetition_penalty;
    p.sampling.presence_penalty = (float)r->presence_penalty;
    p.sampling.frequency_penalty = (float)r->frequency_penalty;
    p.sampling.logit_bias = r->logit_bias;
    p.sampling.n_logit_bias = r->n_logit_bias;
    p.sampling.seed = r->has_seed ? r->seed + (uint64_t)j->index : random_seed(s);
    p.stop_strings = (const char *const *)r->stops;
    p.n_stop_strings = r->n_stops;
    p.stop_ids = r->stop_ids;
    p.n_stop_ids = r->n_stop_ids;
    if (r->min_tokens > 0) { /* watched in on_token */
        p.ignore_eos = 1;
        p.stop_ids = NULL;
        p.n_stop_ids = 0;
    }
    p.on_token = on_token;
    p.logprobs = r->logprobs;
    p.top_logprobs = r->top_logprobs;
    p.constraint = r->constraint; /* the engine's request holds its own reference */
    p.user = j;
    nopad_status st = nopad_engine_submit(s->engine, &p, &j->req);
    if (st != NOPAD_OK) {
        const char *msg = nopad_last_error();
        if (st == NOPAD_ERR_QUEUE_FULL)
            api_fail(e, 429, "rate_limit_error", "queue_full", NULL,
                     "the server is busy (%ld requests are waiting): retry later", s->o.max_queue);
        else if (st == NOPAD_ERR_TOO_LONG)
            api_fail(e, 400, "invalid_request_error", "context_length_exceeded", "max_tokens", "%s", msg);
        else if (st == NOPAD_ERR_INVALID_ARGUMENT)
            api_fail(e, 400, "invalid_request_error", "invalid_value", NULL, "%s", msg);
        else if (st == NOPAD_ERR_UNSUPPORTED)
            api_fail(e, 400, "invalid_request_error", "unsupported_value", NULL, "%s", msg);
        else
            api_fail(e, 500, "server_error", NULL, NULL, "%s", msg);
        j->refs = 1; /* no call will come */
        job_release(j);
        return -1;
    }
    pthread_mutex_lock(&j->wl->lock);
    j->lead->choices[j->lead->n_choices++] = j;
    pthread_mutex_unlock(&j->wl->lock);
    pthread_mutex_lock(&s->jobs_lock);
    j->engine_id = nopad_request_id(j->req);
    if (!j->ended) {
        j->listed = 1;
        j->prev = NULL;
        j->next = s->jobs;
        if (s->jobs) s->jobs->prev = j;
        s->jobs = j;
        if (s->cancelling) end_by_shutdown(j);
    }
    pthread_mutex_unlock(&s->jobs_lock);
    return 0;
}

/* The HTTP request's end (lead: choice 0): every choice cancelled if it still runs (its blocks
 * go back) and the request's references released, the lead's last. */
static void drop_choices(gen_job *lead) {
    pthread_mutex_lock(&lead->wl->lock);
    lead->w.conn = NULL;
    for (int i = 0; i < lead->n_choices; i++) lead->choices[i]->q = NULL;
    const int n = lead->n_choices;
    pthread_mutex_unlock(&lead->wl->lock);
    for (int i = n - 1; i >= 0; i--) {
        gen_job *c = lead->choices[i];
        nopad_request_free(c->req);
        c->req = NULL;
        job_release(c);
    }
}

/* Submits r's choices; on success *out is the lead (choice 0; q holds a reference on every
 * choice, the engine another). */
static int start(http_req *q, const gen_request *r, gen_job **out, api_error *e) {
    server *s = q->srv;
    int32_t *ids = NULL, n = 0;
    for (int32_t k = 0; k < r->n_logit_bias; k++)
        if (r->logit_bias[k].id >= s->dec_info.vocab_size)
            return api_fail(e, 400, "invalid_request_error", "invalid_value", "logit_bias",
                            "'logit_bias' key '%d' is outside the vocabulary [0, %d)", r->logit_bias[k].id,
                            s->dec_info.vocab_size);
    if (prompt_ids(s, r, &ids, &n, e)) return -1;
    const int32_t ctx = s->context_tokens;
    if (n >= ctx) {
        free(ids);
        return api_fail(e, 400, "invalid_request_error", "context_length_exceeded",
                        r->kind == GEN_CHAT ? "messages" : r->kind == GEN_RESPONSES ? "input" : "prompt",
                        "This model's maximum context length is %d tokens. However, your prompt "
                        "has %d tokens (no room for a completion).",
                        ctx, n);
    }
    int32_t max_tokens = r->max_tokens;
    if (max_tokens <= 0) max_tokens = r->kind == GEN_COMPLETION && ctx - n > 16 ? 16 : ctx - n;
    if ((int64_t)n + max_tokens > ctx) {
        free(ids);
        return api_fail(e, 400, "invalid_request_error", "context_length_exceeded",
                        r->kind == GEN_RESPONSES ? "max_output_tokens" : "max_tokens",
                        "This model's maximum context length is %d tokens. However, you requested "
                        "%lld tokens (%d in the prompt, %d in the completion).",
                        ctx, (long long)n + max_tokens, n, max_tokens);
    }
    const int n_choices = r->n > 1 ? r->n : 1;
    gen_job *lead = NULL;
    int rc = 0;
    for (int i = 0; i < n_choices && !rc; i++) {
        gen_job *j = new_choice(q, r, lead, i, n_choices, n);
        if (!j) {
            rc = api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            break;
        }
        if (!lead) lead = j;
        rc = submit_choice(s, j, r, ids, n, max_tokens, e);
        if (rc && j == lead) lead = NULL; /* gone with its refusal */
    }
    free(ids);
    if (rc) {
        if (lead) drop_choices(lead);
        return -1;
    }
    *out = lead;
    return 0;
}

enum MHD_Result gen_handle(http_req *q, gen_kind kind) {
    server *s = q->srv;
    gen_job *j = q->gen;
    if (!j) {
        api_error e;
        if (!s->engine) {
            api_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                     "this server has no generation model (start it with --model FILE.gguf|DIR "
                     "of a decoder)");
            return http_reply_error(q, &e);
        }
        gen_request r;
        if (openai_parse_generation(q->body ? q->body : "", q->len, kind, &r, &e))
            return http_reply_error(q, &e);
        if (r.model && strcmp(r.model, s->decoder_name) != 0) {
            api_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                     "The model '%.200s' does not exist: this server generates with '%s'", r.model,
                     s->decoder_name);
            gen_request_free(&r);
            return http_reply_error(q, &e);
        }
        /* tool_choice required / named: the constraint needs the template's call format (without a
         * template start() refuses the chat) */
        if (r.tool_choice_required && s->has_template &&
            structured_tool_choice(&r, chat_template_tool_format(&s->tmpl), &r.constraint, &e)) {
            gen_request_free(&r);
            return http_reply_error(q, &e);
        }
        const int stream = r.stream;
        const int rc = start(q, &r, &j, &e);
        gen_request_free(&r);
        if (rc) return http_reply_error(q, &e);
        q->gen = j;
        if (stream) {
            struct MHD_Response *resp =
                MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, read_events, j, NULL);
            if (!resp) return MHD_NO;
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
            MHD_add_response_header(resp, "X-Accel-Buffering", "no");
            enum MHD_Result ok = MHD_queue_response(q->conn, 200, resp);
            MHD_destroy_response(resp);
            return ok;
        }
    }
    pthread_mutex_lock(&j->wl->lock);
    const int done = all_done(j);
    if (!done) waiter_sleep(j->wl); /* on_token resumes it at each choice's end */
    pthread_mutex_unlock(&j->wl->lock);
    return done ? answer_plain(q, j) : MHD_YES;
}

void gen_request_closed(http_req *q, int completed_ok) {
    (void)completed_ok;
    gen_job *lead = q->gen;
    q->gen = NULL;
    pthread_mutex_lock(&lead->wl->lock);
    const int done = all_done(lead);
    pthread_mutex_unlock(&lead->wl->lock);
    if (!done) metrics_cancelled(&q->srv->metrics);
    drop_choices(lead);
}

void gen_cancel_all(server *s) {
    pthread_mutex_lock(&s->jobs_lock);
    s->cancelling = 1; /* a job listed from now on is ended by start() */
    size_t n = 0;
    for (gen_job *j = s->jobs; j; j = j->next) n++;
    uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    n = 0;
    for (gen_job *j = s->jobs; j; j = j->next) {
        end_by_shutdown(j);
        if (ids) ids[n++] = j->engine_id;
    }
    pthread_mutex_unlock(&s->jobs_lock);
    for (size_t i = 0; i < n; i++) nopad_engine_cancel(s->engine, ids[i]); /* ended ones: refused */
    free(ids);
}
