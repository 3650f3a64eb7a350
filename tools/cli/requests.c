/* `nopad generate --input requests.jsonl --output results.jsonl`: a file of requests through the
 * engine (nopad_engine_*), which fuses whatever is running into one packed step per iteration.
 *
 * Every input line is a JSON object {"id", "prompt", "max_tokens", "temperature", "top_k",
 * "top_p", "min_p", "repetition_penalty", "seed", "ignore_eos", "stop"} of which only "prompt" is
 * required (the command's options give the other defaults; "id" defaults to the line number).
 * Every line gets one output line, in completion order: {"id", "text", "tokens",
 * "finish_reason"}, or {"id", "error"} for a line that could not run. Lines are submitted as the
 * engine's queue takes them, and results written as requests end, so a file larger than the KV
 * pool streams through it. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "output.h"
#include "requests.h"

/* One line of the input. */
typedef struct line_request {
    int64_t line_no;
    int64_t nul_column;       /* 1-based column of a NUL byte in the line; 0: none */
    char *id_json;            /* the "id" as JSON text (a string or a number), or the line number */
    nopad_request *req;       /* NULL once answered */
    char **stops;             /* "stop" strings */
    int32_t n_stops;
    void **user;              /* on_token's argument: {the finished list, the line's index} */
} line_request;

/* What the engine's callback hands to the main thread: the indices of requests that ended. */
typedef struct finished_list {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int64_t *items;
    size_t n, cap;
    int failed; /* out of memory in the callback */
} finished_list;

typedef struct requests_run {
    const requests_options *o;
    nopad_model *model;
    nopad_engine *engine;
    FILE *in, *out;
    output_file output;       /* out, written whole at the end */
    line_request *lines;
    size_t n_lines, lines_cap;
    finished_list done;
    int64_t answered, errors, tokens;
    double start, last_progress;
    int progress;
} requests_run;

static void on_token(void *user, uint64_t request_id, int32_t token, const char *text,
                     nopad_finish_reason finish) {
    (void)request_id;
    (void)token;
    (void)text;
    if (finish == NOPAD_FINISH_NONE) return;
    /* user: {the finished list, the line's index} */
    finished_list *f = (finished_list *)((void **)user)[0];
    const int64_t index = (int64_t)(intptr_t)((void **)user)[1];
    pthread_mutex_lock(&f->lock);
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 64;
        int64_t *items = realloc(f->items, cap * sizeof *items);
        if (!items) {
            f->failed = 1;
            pthread_cond_signal(&f->cond);
            pthread_mutex_unlock(&f->lock);
            return;
        }
        f->items = items;
        f->cap = cap;
    }
    f->items[f->n++] = index;
    pthread_cond_signal(&f->cond);
    pthread_mutex_unlock(&f->lock);
}

/* ---- output ------------------------------------------------------------------------------ */

static int write_json_line(requests_run *r, cJSON *obj) {
    char *s = cJSON_PrintUnformatted(obj);
    if (!s) {
        print_error("out of memory");
        return -1;
    }
    const int bad = fputs(s, r->out) < 0 || fputc('\n', r->out) == EOF || fflush(r->out) != 0;
    free(s);
    if (bad) {
        print_error("cannot write to %s: %s", r->o->output_path ? r->o->output_path : "stdout",
                    strerror(errno));
        return -1;
    }
    return 0;
}

/* {"id": ..., "error": why} for a line that could not run. */
static int answer_error(requests_run *r, line_request *l, const char *why) {
    cJSON *obj = cJSON_CreateObject();
    cJSON *id = l->id_json ? cJSON_Parse(l->id_json) : NULL;
    if (!obj) return -1;
    if (id) cJSON_AddItemToObject(obj, "id", id);
    else cJSON_AddNumberToObject(obj, "id", (double)l->line_no);
    cJSON_AddStringToObject(obj, "error", why);
    int rc = write_json_line(r, obj);
    cJSON_Delete(obj);
    r->errors++;
    r->answered++;
    return rc;
}

/* The finished request of line l: its text, token count and finish reason. */
static int answer(requests_run *r, line_request *l) {
    nopad_request_stats st;
    nopad_status s = nopad_request_get_stats(l->req, &st);
    size_t len = 0;
    char *text = NULL;
    if (s == NOPAD_OK) s = nopad_request_text(l->req, NULL, 0, &len);
    if (s == NOPAD_OK || s == NOPAD_ERR_BUFFER_TOO_SMALL) {
        text = malloc(len + 1);
        s = text ? nopad_request_text(l->req, text, len + 1, &len) : NOPAD_ERR_OUT_OF_MEMORY;
    }
    /* an error that ended the request: read_ids returns it once every id is read */
    if (s == NOPAD_OK && st.finish == NOPAD_FINISH_ERROR) {
        int32_t ids[64], n;
        nopad_finish_reason fin;
        do s = nopad_request_read(l->req, ids, 64, &n, &fin, 0);
        while (s == NOPAD_OK && fin == NOPAD_FINISH_NONE && n > 0);
    }
    int rc;
    if (s != NOPAD_OK) {
        rc = answer_error(r, l, library_error(s));
    } else {
        cJSON *obj = cJSON_CreateObject(), *id = cJSON_Parse(l->id_json);
        if (!obj || !id) {
            cJSON_Delete(obj);
            cJSON_Delete(id);
            free(text);
            print_error("out of memory");
            return -1;
        }
        cJSON_AddItemToObject(obj, "id", id);
        cJSON_AddStringToObject(obj, "text", text);
        cJSON_AddNumberToObject(obj, "tokens", st.generated_tokens);
        cJSON_AddNumberToObject(obj, "prompt_tokens", st.prompt_tokens);
        cJSON_AddStringToObject(obj, "finish_reason", nopad_finish_reason_name(st.finish));
        rc = write_json_line(r, obj);
        cJSON_Delete(obj);
        r->tokens += st.generated_tokens;
        r->answered++;
    }
    free(text);
    nopad_request_free(l->req);
    l->req = NULL;
    return rc;
}

/* "\r requests 12 / 40 done, 3312 tokens/s, ETA 9 s" on a terminal, at most 4 times a second. */
static void show_progress(requests_run *r, int final) {
    if (!r->progress) return;
    const double t = now_seconds();
    if (!final && t - r->last_progress < 0.25) return;
    const double elapsed = t - r->start > 1e-9 ? t - r->start : 1e-9;
    const double rate = (double)r->answered / elapsed;
    const int64_t left = (int64_t)r->n_lines - r->answered;
    fprintf(stderr, "\r requests %" PRId64 " / %zu done, %.0f tokens/s", r->answered, r->n_lines,
            (double)r->tokens / elapsed);
    if (!final && r->answered > 0) fprintf(stderr, ", ETA %.0f s   ", (double)left / rate);
    else fputs("              ", stderr);
    if (final) fputc('\n', stderr);
    fflush(stderr);
    progress_line_open = !final;
    r->last_progress = t;
}

/* Writes the answers of every request that ended; waits up to wait_ms for one when none has. */
static int collect(requests_run *r, int wait_ms) {
    pthread_mutex_lock(&r->done.lock);
    if (r->done.n == 0 && wait_ms > 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += (long)wait_ms * 1000000L;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&r->done.cond, &r->done.lock, &until);
    }
    const int failed = r->done.failed;
    size_t n = r->done.n;
    int64_t *items = NULL;
    if (n) {
        items = malloc(n * sizeof *items);
        if (items) {
            memcpy(items, r->done.items, n * sizeof *items);
            r->done.n = 0;
        }
    }
    pthread_mutex_unlock(&r->done.lock);
    if (failed || (n && !items)) {
        free(items);
        print_error("out of memory");
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) rc = answer(r, &r->lines[items[i]]);
    free(items);
    show_progress(r, 0);
    return rc;
}

/* ---- input ------------------------------------------------------------------------------- */

/* A JSON number that is a whole number in [lo, hi], or the reason why not. */
static const char *get_int(const cJSON *obj, const char *name, long lo, long hi, long *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!v || cJSON_IsNull(v)) return NULL;
    static __thread char why[160];
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= (double)lo && v->valuedouble <= (double)hi) ||
        v->valuedouble != floor(v->valuedouble)) {
        snprintf(why, sizeof why, "\"%s\" must be a whole number in [%ld, %ld]", name, lo, hi);
        return why;
    }
    *out = (long)v->valuedouble;
    return NULL;
}

static const char *get_float(const cJSON *obj, const char *name, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!v || cJSON_IsNull(v)) return NULL;
    static __thread char why[160];
    if (!cJSON_IsNumber(v)) {
        snprintf(why, sizeof why, "\"%s\" must be a number", name);
        return why;
    }
    *out = v->valuedouble;
    return NULL;
}

/* Whether a string of the JSON object `text` holds the escape \u0000, which cJSON decodes to a
 * NUL byte that would end the C string there, silently cutting a prompt or stop string short.
 * The top-level field it is in (its name, as written) goes to field[cap]. */
static int find_nul_escape(const char *text, char *field, size_t cap) {
    int depth = 0, expect_key = 0;
    const char *key = "";
    size_t key_len = 0;
    for (const char *p = text; *p; p++) {
        if (*p == '{' || *p == '[') {
            expect_key = ++depth == 1 && *p == '{';
        } else if (*p == '}' || *p == ']') {
            depth--;
        } else if (*p == ',' && depth == 1) {
            expect_key = 1;
        } else if (*p == '"') {
            const char *start = ++p;
            int nul = 0;
            for (; *p && *p != '"'; p++)
                if (*p == '\\') {
                    nul |= p[1] == 'u' && !strncmp(p + 2, "0000", 4);
                    if (p[1]) p++;
                }
            if (depth == 1 && expect_key) key = start, key_len = (size_t)(p - start), expect_key = 0;
            if (nul) {
                snprintf(field, cap, "%.*s", (int)(key_len < 64 ? key_len : 64), key);
                return 1;
            }
            if (!*p) break;
        }
    }
    return 0;
}

/* Parses line l's JSON into params (strings kept in l) or says why it cannot run. */
static const char *parse_line(requests_run *r, line_request *l, const char *text, cJSON **root,
                              nopad_request_params *p) {
    if (l->nul_column) {
        static __thread char why[160];
        snprintf(why, sizeof why, "a NUL byte at column %" PRId64 " (JSON text has none; a string "
                 "may not hold one either)", l->nul_column);
        return why;
    }
    *root = cJSON_Parse(text);
    if (!*root || !cJSON_IsObject(*root)) return "not a JSON object";
    char field[72];
    if (strstr(text, "\\u0000") && find_nul_escape(text, field, sizeof field)) {
        static __thread char why[160];
        snprintf(why, sizeof why, "\"%s\" holds a NUL character (\\u0000), which nopad would cut "
                 "the text at; remove it", field);
        return why;
    }
    const cJSON *obj = *root;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(obj, "id");
    if (id && !cJSON_IsNull(id)) {
        if (!cJSON_IsString(id) && !cJSON_IsNumber(id)) return "\"id\" must be a string or a number";
        free(l->id_json);
        l->id_json = cJSON_PrintUnformatted(id);
        if (!l->id_json) return "out of memory";
    }
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(obj, "prompt");
    if (!cJSON_IsString(prompt)) return "\"prompt\" (a string) is required";
    *p = nopad_request_default_params();
    p->prompt_text = prompt->valuestring;
    const requests_options *o = r->o;
    long max_tokens = o->max_tokens, top_k = o->top_k, ignore = o->ignore_eos, seed_l = -1;
    double temperature = o->temperature, top_p = o->top_p, min_p = o->min_p,
           penalty = o->repetition_penalty;
    const char *bad = get_int(obj, "max_tokens", 1, INT32_MAX, &max_tokens);
    if (!bad) bad = get_int(obj, "top_k", 0, INT32_MAX, &top_k);
    if (!bad) bad = get_float(obj, "temperature", &temperature);
    if (!bad) bad = get_float(obj, "top_p", &top_p);
    if (!bad) bad = get_float(obj, "min_p", &min_p);
    if (!bad) bad = get_float(obj, "repetition_penalty", &penalty);
    /* a JSON number is a double: whole numbers are exact up to 2^53 */
    if (!bad) bad = get_int(obj, "seed", 0, 1L << 53, &seed_l);
    if (bad) return bad;
    const cJSON *ie = cJSON_GetObjectItemCaseSensitive(obj, "ignore_eos");
    if (ie && !cJSON_IsNull(ie)) {
        if (!cJSON_IsBool(ie)) return "\"ignore_eos\" must be true or false";
        ignore = cJSON_IsTrue(ie);
    }
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(obj, "stop");
    if (stop && !cJSON_IsNull(stop)) {
        const int n = cJSON_IsString(stop) ? 1 : cJSON_IsArray(stop) ? cJSON_GetArraySize(stop) : -1;
        if (n < 0) return "\"stop\" must be a string or an array of strings";
        l->stops = calloc((size_t)(n ? n : 1), sizeof *l->stops);
        if (!l->stops) return "out of memory";
        for (int i = 0; i < n; i++) {
            const cJSON *s = cJSON_IsString(stop) ? stop : cJSON_GetArrayItem(stop, i);
            if (!cJSON_IsString(s) || !s->valuestring[0]) return "\"stop\" must hold non-empty strings";
            l->stops[i] = strdup(s->valuestring);
            if (!l->stops[i]) return "out of memory";
            l->n_stops++;
        }
    }
    p->max_tokens = (int32_t)max_tokens;
    p->ignore_eos = (int)ignore;
    p->sampling.temperature = (float)temperature;
    p->sampling.top_k = (int32_t)top_k;
    p->sampling.top_p = (float)top_p;
    p->sampling.min_p = (float)min_p;
    p->sampling.repetition_penalty = (float)penalty;
    p->sampling.seed = seed_l >= 0 ? (uint64_t)seed_l : o->seed;
    p->stop_strings = (const char *const *)l->stops;
    p->n_stop_strings = l->n_stops;
    return NULL;
}

/* Submits line l, waiting for room while the engine's queue is full. */
static int submit_line(requests_run *r, size_t index, const char *text) {
    line_request *l = &r->lines[index];
    cJSON *root = NULL;
    nopad_request_params p;
    char id_buf[32];
    snprintf(id_buf, sizeof id_buf, "%" PRId64, l->line_no);
    l->id_json = strdup(id_buf);
    if (!l->id_json) {
        print_error("out of memory");
        return -1;
    }
    const char *why = parse_line(r, l, text, &root, &p);
    int rc = 0;
    if (why) {
        char msg[320];
        snprintf(msg, sizeof msg, "line %" PRId64 ": %s", l->line_no, why);
        rc = answer_error(r, l, msg);
    } else {
        void **user = malloc(2 * sizeof *user);
        if (!user) {
            cJSON_Delete(root);
            print_error("out of memory");
            return -1;
        }
        user[0] = &r->done;
        user[1] = (void *)(intptr_t)index;
        p.on_token = on_token;
        p.user = user;
        l->user = user;
        for (;;) {
            nopad_status s = nopad_engine_submit(r->engine, &p, &l->req);
            if (s == NOPAD_ERR_QUEUE_FULL) { /* make room: answer what has ended */
                if (collect(r, 50)) {
                    rc = -1;
                    break;
                }
                continue;
            }
            if (s != NOPAD_OK) {
                char msg[1100];
                snprintf(msg, sizeof msg, "line %" PRId64 ": %s", l->line_no, library_error(s));
                l->req = NULL;
                rc = answer_error(r, l, msg);
            }
            break;
        }
    }
    cJSON_Delete(root);
    return rc;
}

static int read_lines(requests_run *r, char ***texts) {
    char *line = NULL;
    size_t cap = 0, texts_cap = 0;
    int64_t line_no = 0;
    *texts = NULL;
    for (;;) {
        errno = 0;
        ssize_t got = getline(&line, &cap, r->in);
        if (got < 0) {
            if (ferror(r->in)) {
                print_error("cannot read %s: %s", r->o->input_path ? r->o->input_path : "stdin",
                            strerror(errno));
                free(line);
                return -1;
            }
            break;
        }
        line_no++;
        size_t len = (size_t)got;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        size_t k = 0;
        while (k < len && (line[k] == ' ' || line[k] == '\t')) k++;
        if (k == len) continue; /* blank lines are no requests */
        if (reserve((void **)&r->lines, &r->lines_cap, r->n_lines + 1, sizeof *r->lines) ||
            reserve((void **)texts, &texts_cap, r->n_lines + 1, sizeof **texts)) {
            free(line);
            return -1;
        }
        const char *nul = memchr(line, 0, len);
        r->lines[r->n_lines] = (line_request){.line_no = line_no,
                                              .nul_column = nul ? nul - line + 1 : 0};
        (*texts)[r->n_lines] = strdup(line);
        if (!(*texts)[r->n_lines]) {
            free(line);
            print_error("out of memory");
            return -1;
        }
        r->n_lines++;
    }
    free(line);
    return 0;
}

nopad_model_params requests_model_params(const requests_options *o) {
    nopad_model_params mp = nopad_model_default_params();
    mp.device = o->device;
    mp.dtype = o->dtype;
    mp.n_threads = o->threads;
    /* the engine has a context (and KV pool) of its own: the model's default one stays small */
    mp.kv_cache_tokens = 16;
    mp.max_batch_tokens = 16;
    mp.tp_size = o->tp;
    mp.weights = o->weights;
    return mp;
}

int generate_requests(const requests_options *o) {
    requests_run r = {.o = o};
    pthread_mutex_init(&r.done.lock, NULL);
    pthread_cond_init(&r.done.cond, NULL);
    char **texts = NULL;
    int rc = EXIT_ERROR;
    r.in = stdin;
    if (o->input_path) {
        r.in = fopen(o->input_path, "rb");
        if (!r.in) {
            print_error("cannot open input '%s': %s", o->input_path, strerror(errno));
            goto done;
        }
    }
    /* nothing is written before the input is read and the model loaded (an output that is the
     * input was refused with the options): a bad model path leaves every file as it was */
    if (read_lines(&r, &texts)) goto done;
    const nopad_model_params mp = requests_model_params(o);
    r.model = open_model_with(o->model, &mp);
    if (!r.model) goto done;
    if (!model_is_decoder(r.model)) {
        print_error("model '%s' is an encoder; nopad generate runs decoders (gpt2, llama, mistral, "
                    "qwen2)",
                    o->model);
        goto done;
    }
    nopad_engine_params ep = nopad_engine_default_params();
    ep.kv_cache_tokens = o->kv_tokens;
    if (o->max_running > 0) ep.max_running = o->max_running;
    if (o->step_tokens > 0) ep.max_step_tokens = o->step_tokens;
    if (ep.max_running > ep.max_step_tokens) ep.max_running = ep.max_step_tokens;
    nopad_status st = nopad_engine_create(r.model, &ep, &r.engine);
    if (st != NOPAD_OK) {
        print_error("%s", library_error(st));
        goto done;
    }
    if (output_open(&r.output, o->output_path)) goto done;
    r.out = r.output.f;
    r.progress = isatty(fileno(stderr));
    r.start = r.last_progress = now_seconds();
    int failed = 0;
    for (size_t i = 0; i < r.n_lines && !failed; i++) {
        failed = submit_line(&r, i, texts[i]);
        if (!failed) failed = collect(&r, 0);
    }
    while (!failed && r.answered < (int64_t)r.n_lines) failed = collect(&r, 200);
    show_progress(&r, 1);
    /* lines that failed have their error lines: the file is whole, so it replaces the old one */
    if (failed || output_commit(&r.output)) goto done;
    const double elapsed = now_seconds() - r.start;
    fprintf(stderr, "nopad: %zu requests (%" PRId64 " failed), %" PRId64 " tokens in %.2f s, "
            "%.0f tokens/s\n",
            r.n_lines, r.errors, r.tokens, elapsed, elapsed > 0 ? (double)r.tokens / elapsed : 0.0);
    rc = r.errors ? EXIT_ERROR : EXIT_OK;
done:
    nopad_engine_free(r.engine); /* cancels what is left (a write error) */
    for (size_t i = 0; i < r.n_lines; i++) {
        line_request *l = &r.lines[i];
        nopad_request_free(l->req);
        free(l->user);
        free(l->id_json);
        for (int32_t k = 0; k < l->n_stops; k++) free(l->stops[k]);
        free(l->stops);
        if (texts) free(texts[i]);
    }
    free(texts);
    free(r.lines);
    free(r.done.items);
    pthread_mutex_destroy(&r.done.lock);
    pthread_cond_destroy(&r.done.cond);
    nopad_model_free(r.model);
    if (r.in && r.in != stdin) fclose(r.in);
    output_discard(&r.output);
    return rc;
}
