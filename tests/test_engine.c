/* The engine (src/engine/) on the CPU backend: requests arriving from many threads at random
 * times give, greedy and seeded, the same tokens as each alone (nopad_generate on a context of its
 * own); stop ids end them where the alone output has them; cancellations, pool exhaustion
 * (preemption and recomputation) and prefix sharing change nothing in any output; the pool comes
 * back whole; bad input is refused at submit with a clear status. The load tests run twice: with
 * the CPU's default of taking each step's ids before planning the next, and with the overlap the
 * CUDA backend uses (step n+1 planned and launched before step n's ids are back: placeholders
 * filled in from step n's sampling, rows of requests that step n ends dropped). The block manager and the stop-string filter are tested on their own first. With
 * NOPAD_SMOLLM2_GGUF (skipped without it): text prompts, streamed text, stop strings, and
 * random arrivals on a real model. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/kv_blocks.h"
#include "engine/stop_text.h"
#include "model/sampling.h"
#include "testutil.h"

enum { MAX_IDS = 512 };

/* A test's engine parameters: the defaults, with the overlap its cmocka state names (NULL: the
 * backend's default, which on the CPU takes each step's ids before planning the next). */
static int OVERLAP_ON = 1;
static nopad_engine_params test_params(void **state) {
    nopad_engine_params ep = nopad_engine_default_params();
    if (state && *state) ep.overlap_steps = *(const int *)*state;
    return ep;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_us(uint32_t us) {
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static nopad_model *load_fixture(const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", name);
    nopad_model *m = NULL;
    assert_nopad_ok(nopad_model_load(test_data_path(rel), NULL, &m));
    return m;
}

/* The SmolLM2 GGUF, or NULL (with a note) when it is not there. */
static nopad_model *load_smollm2(void) {
    const char *path = getenv("NOPAD_SMOLLM2_GGUF");
    if (!path || access(path, R_OK) != 0) {
        printf("  (NOPAD_SMOLLM2_GGUF not set or missing: SmolLM2 part skipped)\n");
        return NULL;
    }
    nopad_model *m = NULL;
    /* dequantised: the engine's steps batch requests as they come, and only float weights make a
     * row's logits independent of its batch but for float rounding (the weights kept quantized
     * round each row's activations to int8, and a 1e-7 difference can round a value the other
     * way: test_quant_decoder) */
    nopad_model_params p = nopad_model_default_params();
    p.weights = NOPAD_WEIGHTS_F32;
    assert_nopad_ok(nopad_model_load(path, &p, &m));
    return m;
}

/* What a request gives alone: nopad_generate on a context of its own, one prompt. */
static int32_t generate_alone(nopad_context *c, const int32_t *prompt, int32_t n_prompt,
                              int32_t max_tokens, const nopad_sampling_params *sampling,
                              int32_t *out) {
    nopad_generate_params gp = nopad_generate_default_params();
    gp.max_tokens = max_tokens;
    gp.ignore_eos = 1;
    gp.sampling = *sampling;
    const int32_t cu[2] = {0, n_prompt};
    int32_t count = 0;
    assert_nopad_ok(nopad_generate(c, 1, cu, prompt, &gp, out, &count, NULL, NULL));
    return count;
}

/* Reads a request to its end into ids[cap], `chunk` ids at most per read; returns the ids read. */
static int32_t read_all(nopad_request *r, int32_t *ids, int32_t cap, int32_t chunk,
                        nopad_finish_reason *finish) {
    int32_t n = 0;
    *finish = NOPAD_FINISH_NONE;
    while (*finish == NOPAD_FINISH_NONE) {
        int32_t got = 0;
        assert_nopad_ok(nopad_request_read(r, ids + n, chunk < cap - n ? chunk : cap - n, &got,
                                           finish, -1));
        n += got;
        if (n == cap && *finish == NOPAD_FINISH_NONE) fail_msg("more than %d ids", cap);
    }
    return n;
}

/* Waits until the engine has retired `n` requests and nothing runs or waits. */
static nopad_engine_stats wait_idle(nopad_engine *e, int64_t n) {
    nopad_engine_stats st;
    const double t0 = now_s();
    for (;;) {
        assert_nopad_ok(nopad_engine_get_stats(e, &st));
        if (st.requests_finished >= n && st.running == 0 && st.waiting == 0) return st;
        if (now_s() - t0 > 30) fail_msg("engine not idle after 30 s: %lld of %lld requests retired",
                                        (long long)st.requests_finished, (long long)n);
        sleep_us(1000);
    }
}

static void expect_same_ids(const char *what, int k, const int32_t *got, int32_t n_got,
                            const int32_t *want, int32_t n_want) {
    for (int32_t i = 0; i < n_got && i < n_want; i++)
        if (got[i] != want[i])
            fail_msg("%s request %d: token %d is %d, alone it is %d", what, k, i, got[i], want[i]);
    if (n_got != n_want) fail_msg("%s request %d: %d tokens, alone %d", what, k, n_got, n_want);
}

/* ---- the block manager and the stop-string filter on their own ----------------------------- */

static void test_kv_blocks(void **state) {
    kv_blocks m;
    assert_nopad_ok(kv_blocks_init(&m, 4, 2));
    const int32_t a[2] = {5, 6}, b[2] = {7, 8};
    const uint64_t ha = kv_blocks_hash(0, a, 2), hb = kv_blocks_hash(ha, b, 2);
    assert_true(ha != hb && ha != kv_blocks_hash(1, a, 2));
    const int32_t x = kv_blocks_take(&m), y = kv_blocks_take(&m);
    assert_int_equal(x, 0); /* the lowest ids first */
    assert_int_equal(y, 1);
    assert_int_equal(kv_blocks_find(&m, ha, 0, a), -1); /* not published yet */
    kv_blocks_publish(&m, x, ha, 0, a);
    kv_blocks_publish(&m, y, hb, ha, b);
    assert_int_equal(kv_blocks_find(&m, ha, 0, a), x); /* shared: two references */
    assert_int_equal(m.ref[x], 2);
    assert_int_equal(kv_blocks_find(&m, hb, 0, b), -1); /* same hash, other parent: no */
    kv_blocks_release(&m, x);
    kv_blocks_release(&m, x);
    kv_blocks_release(&m, y);
    assert_int_equal(m.n_used, 0);
    assert_int_equal(m.n_cached, 2);
    assert_int_equal(kv_blocks_available(&m), 4);
    /* a duplicate of published content stays private and goes back to the free blocks */
    const int32_t z = kv_blocks_take(&m);
    kv_blocks_publish(&m, z, ha, 0, a);
    assert_int_equal(m.hash[z], 0);
    kv_blocks_release(&m, z);
    assert_int_equal(m.n_free, 2);
    /* a cached block found again leaves the cache */
    assert_int_equal(kv_blocks_find(&m, hb, ha, b), y);
    assert_int_equal(m.n_cached, 1);
    kv_blocks_release(&m, y); /* now x is the least recently used */
    int32_t t[4];
    for (int i = 0; i < 4; i++) t[i] = kv_blocks_take(&m);
    assert_int_equal(t[2], x); /* free ones first, then the cache, oldest first */
    assert_int_equal(t[3], y);
    assert_int_equal(m.evictions, 2);
    assert_int_equal(kv_blocks_take(&m), -1);
    assert_int_equal(kv_blocks_find(&m, ha, 0, a), -1); /* evicted content is forgotten */
    for (int i = 0; i < 4; i++) kv_blocks_release(&m, t[i]);
    assert_int_equal(m.n_free, 4);
    kv_blocks_free(&m);
}

/* Feeds pieces, returns the released text and whether a stop string ended it. */
static int stop_feed(stop_text *s, const char *const *pieces, int n, char *got) {
    got[0] = '\0';
    for (int i = 0; i < n; i++) {
        const char *out;
        size_t len;
        const int hit = stop_text_add(s, pieces[i], strlen(pieces[i]), &out, &len);
        assert_true(hit >= 0);
        strncat(got, out, len);
        if (hit) return 1;
    }
    const char *out;
    size_t len;
    assert_int_equal(stop_text_flush(s, &out, &len), 0);
    strncat(got, out, len);
    return 0;
}

static void test_stop_text(void **state) {
    const char *const stops[] = {"END", "\n\n"};
    stop_text s;
    char got[256];
    /* a stop string across three pieces: nothing after its start is released */
    assert_nopad_ok(stop_text_init(&s, stops, 2));
    const char *const p1[] = {"Hello E", "N", "D world"};
    assert_int_equal(stop_feed(&s, p1, 3, got), 1);
    assert_string_equal(got, "Hello ");
    stop_text_free(&s);
    /* a held prefix that does not complete comes out with the next piece */
    assert_nopad_ok(stop_text_init(&s, stops, 2));
    const char *const p2[] = {"a E", "Nx", "\n", "b\n"};
    assert_int_equal(stop_feed(&s, p2, 4, got), 0);
    assert_string_equal(got, "a ENx\nb\n");
    stop_text_free(&s);
    /* the earliest stop string wins */
    assert_nopad_ok(stop_text_init(&s, stops, 2));
    const char *const p3[] = {"x\n\nyEND"};
    assert_int_equal(stop_feed(&s, p3, 1, got), 1);
    assert_string_equal(got, "x");
    stop_text_free(&s);
    /* none: everything passes at once */
    assert_nopad_ok(stop_text_init(&s, NULL, 0));
    const char *out;
    size_t len;
    assert_int_equal(stop_text_add(&s, "EN", 2, &out, &len), 0);
    assert_int_equal(len, 2);
    stop_text_free(&s);
    const char *const empty[] = {"ok", ""};
    assert_nopad_error(stop_text_init(&s, empty, 2), NOPAD_ERR_INVALID_ARGUMENT, "stop string 1 is empty");
}

/* ---- random arrivals from many threads ------------------------------------------------------ */

enum { N_THREADS = 8, N_JOBS = 64 }; /* the tiny models' load; SmolLM2 gets a quarter */

typedef enum { KEEP = 0, CANCEL_AT_SUBMIT, CANCEL_WHILE_READING, CANCEL_BY_ID, FREE_UNREAD } fate;

typedef struct job {
    nopad_engine *engine;
    int32_t prompt[256], n_prompt, max_tokens;
    nopad_sampling_params sampling;
    fate fate;
    int32_t cancel_after;                 /* CANCEL_WHILE_READING / BY_ID: ids read first */
    int32_t stop_id;                      /* >= 0: a stop id (greedy KEEP jobs), from the alone output */
    int use_callback;
    uint32_t delay_us;                    /* before its submission */
    nopad_request *r;
    int32_t want[128], n_want;            /* alone */
    int32_t got[MAX_IDS], n_got;
    nopad_finish_reason finish;
    pthread_mutex_t cb_lock;              /* the callback's view */
    pthread_cond_t cb_ended;
    int32_t cb_ids[MAX_IDS], n_cb;
    nopad_finish_reason cb_finish;
    int cb_after_end;                     /* calls after the one with a finish: must stay 0 */
    int cb_unended;                       /* last calls before the request showed its end: 0 */
    _Atomic(nopad_request *) handle;      /* r, for the callback */
} job;

static void on_token(void *user, uint64_t id, int32_t token, const char *text,
                     nopad_finish_reason finish) {
    job *j = user;
    pthread_mutex_lock(&j->cb_lock);
    if (j->cb_finish != NOPAD_FINISH_NONE) j->cb_after_end++;
    if (token >= 0 && j->n_cb < MAX_IDS) j->cb_ids[j->n_cb++] = token;
    j->cb_finish = finish;
    /* the last call finds the request ended (when its submitter has the handle already) */
    nopad_request *r = atomic_load(&j->handle);
    nopad_request_stats st;
    if (finish != NOPAD_FINISH_NONE && r &&
        (nopad_request_get_stats(r, &st) != NOPAD_OK || st.finish != finish))
        j->cb_unended++;
    pthread_cond_broadcast(&j->cb_ended);
    pthread_mutex_unlock(&j->cb_lock);
}

static void submit_job(job *j) {
    nopad_request_params p = nopad_request_default_params();
    p.prompt_ids = j->prompt;
    p.n_prompt_ids = j->n_prompt;
    p.max_tokens = j->max_tokens;
    p.ignore_eos = 1;
    p.sampling = j->sampling;
    if (j->stop_id >= 0) {
        p.stop_ids = &j->stop_id;
        p.n_stop_ids = 1;
    }
    if (j->use_callback) {
        p.on_token = on_token;
        p.user = j;
    }
    assert_nopad_ok(nopad_engine_submit(j->engine, &p, &j->r));
    atomic_store(&j->handle, j->r);
    if (j->fate == CANCEL_AT_SUBMIT) assert_nopad_ok(nopad_request_cancel(j->r));
}

static void read_job(job *j, uint64_t *rng) {
    if (j->fate == FREE_UNREAD) { /* freeing cancels it; its blocks must come back all the same */
        nopad_request_free(j->r);
        j->r = NULL;
        j->finish = NOPAD_FINISH_CANCELLED;
        return;
    }
    j->finish = NOPAD_FINISH_NONE;
    int cancelled = 0;
    while (j->finish == NOPAD_FINISH_NONE) {
        int32_t got = 0;
        const int32_t cap = 1 + (int32_t)(test_rand_u32(rng) % 4);
        assert_nopad_ok(nopad_request_read(j->r, j->got + j->n_got, cap, &got, &j->finish, -1));
        j->n_got += got;
        if (!cancelled && j->n_got >= j->cancel_after &&
            (j->fate == CANCEL_WHILE_READING || j->fate == CANCEL_BY_ID)) {
            if (j->fate == CANCEL_BY_ID) {
                /* it may have ended and been retired just now: then the id is unknown */
                const nopad_status st = nopad_engine_cancel(j->engine, nopad_request_id(j->r));
                assert_true(st == NOPAD_OK || st == NOPAD_ERR_INVALID_ARGUMENT);
            } else {
                assert_nopad_ok(nopad_request_cancel(j->r));
            }
            cancelled = 1;
        }
    }
}

typedef struct worker {
    job *jobs;
    int n;
    uint64_t rng;
} worker;

static void *worker_run(void *arg) {
    worker *w = arg;
    for (int k = 0; k < w->n; k++) {
        sleep_us(w->jobs[k].delay_us);
        submit_job(&w->jobs[k]);
    }
    for (int k = 0; k < w->n; k++) read_job(&w->jobs[k], &w->rng);
    return NULL;
}

/* What the outputs are checked against: the alone context, and the sampled outputs that left
 * their alone path at a draw that rounding can move. */
typedef struct checker {
    nopad_context *alone;
    int32_t vocab;
    int near_boundary;
} checker;

/* The logits [vocab] after j's prompt and out[0, n_out), from one prefill on the alone context. */
static float *logits_after(const checker *c, const job *j, const int32_t *out, int32_t n_out,
                           int32_t *history) {
    const int32_t n = j->n_prompt + n_out;
    memcpy(history, j->prompt, (size_t)j->n_prompt * sizeof *history);
    memcpy(history + j->n_prompt, out, (size_t)n_out * sizeof *history);
    float *logits = malloc((size_t)c->vocab * sizeof *logits);
    assert_non_null(logits);
    nopad_sequence *s;
    assert_nopad_ok(nopad_sequence_create(c->alone, &s));
    const int32_t cu[2] = {0, n};
    assert_nopad_ok(nopad_decode(c->alone, 1, &s, cu, history, 0, logits));
    nopad_sequence_free(s);
    return logits;
}

/* Can `id` be the draw from logits moved by rounding-sized amounts (1e-5 of their largest
 * magnitude, 64 random tries)? Then the draw sits at a boundary of the sampling (a top-p cut, the
 * inverse CDF) that a different summation order of the same arithmetic crosses. */
static int draw_at_boundary(const checker *c, const float *logits, const nopad_sampling_params *p,
                            const int32_t *history, int32_t n_history, uint64_t step, int32_t id) {
    const int32_t V = c->vocab;
    float *moved = malloc((size_t)V * sizeof *moved), top = 0;
    for (int32_t v = 0; v < V; v++) top = fabsf(logits[v]) > top ? fabsf(logits[v]) : top;
    sampler_scratch scratch;
    sampler_scratch_init(&scratch);
    uint64_t rng = 12345;
    int seen = 0;
    for (int t = 0; t < 64 && !seen; t++) {
        for (int32_t v = 0; v < V; v++) {
            const float u = (float)(test_rand_u32(&rng) >> 8) * 0x1.0p-24f * 2.0f - 1.0f;
            moved[v] = logits[v] + 1e-5f * top * u;
        }
        int32_t got;
        assert_nopad_ok(sample_token(&scratch, moved, V, p, history, n_history, step, &got, NULL));
        seen = got == id;
    }
    sampler_scratch_free(&scratch);
    free(moved);
    return seen;
}

/* Greedy: the ids alone, else a failure naming the logit gap at the first difference. Sampled:
 * the same, or a first difference at a boundary draw (counted), after which the histories part. */
static void check_ids(const char *what, int k, const job *j, checker *c, int32_t n_expected) {
    int32_t i = 0;
    while (i < j->n_got && i < n_expected && j->got[i] == j->want[i]) i++;
    if (i == j->n_got && i == n_expected) return;
    if (i == j->n_got || i == n_expected)
        fail_msg("%s request %d: %d tokens, alone %d", what, k, j->n_got, n_expected);
    int32_t history[512];
    float *logits = logits_after(c, j, j->got, i, history);
    if (j->sampling.temperature > 0 &&
        draw_at_boundary(c, logits, &j->sampling, history, j->n_prompt + i, (uint64_t)i, j->got[i])) {
        c->near_boundary++;
        free(logits);
        return;
    }
    fail_msg("%s request %d (%s): token %d is %d, alone %d; alone logits %.9g and %.9g (relative "
             "gap %.3g)",
             what, k, j->sampling.temperature > 0 ? "sampled" : "greedy", i, j->got[i], j->want[i],
             logits[j->got[i]], logits[j->want[i]],
             fabs(logits[j->got[i]] - logits[j->want[i]]) /
                 fmax(fabs(logits[j->want[i]]), 1e-30));
}

static void check_job(const char *what, int k, const job *j, checker *c) {
    if (j->fate == FREE_UNREAD) return;
    if (j->fate == KEEP) {
        assert_int_equal(j->finish, j->stop_id >= 0 ? NOPAD_FINISH_STOP : NOPAD_FINISH_LENGTH);
        check_ids(what, k, j, c, j->n_want);
    } else { /* what came before the cancellation is the same; it may have finished first */
        assert_true(j->finish == NOPAD_FINISH_CANCELLED || j->finish == NOPAD_FINISH_LENGTH);
        check_ids(what, k, j, c, j->finish == NOPAD_FINISH_LENGTH ? j->n_want : j->n_got);
    }
    if (j->use_callback) { /* the callback saw the same ids in order, and the end once */
        pthread_mutex_lock((pthread_mutex_t *)&j->cb_lock); /* a reader may see the end first */
        while (j->cb_finish == NOPAD_FINISH_NONE)
            pthread_cond_wait((pthread_cond_t *)&j->cb_ended, (pthread_mutex_t *)&j->cb_lock);
        pthread_mutex_unlock((pthread_mutex_t *)&j->cb_lock);
        expect_same_ids("callback", k, j->cb_ids, j->n_cb, j->got, j->n_got);
        assert_int_equal(j->cb_finish, j->finish);
        assert_int_equal(j->cb_after_end, 0);
        assert_int_equal(j->cb_unended, 0);
    }
}

/* Runs jobs[n] from N_THREADS threads, n / N_THREADS each, and checks each. */
static double run_jobs(const char *what, job *jobs, int n, uint64_t seed, checker *c) {
    worker w[N_THREADS];
    pthread_t t[N_THREADS];
    const double t0 = now_s();
    for (int i = 0; i < N_THREADS; i++) {
        w[i] = (worker){.jobs = jobs + i * (n / N_THREADS), .n = n / N_THREADS, .rng = seed + (uint64_t)i};
        assert_int_equal(pthread_create(&t[i], NULL, worker_run, &w[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) pthread_join(t[i], NULL);
    const double seconds = now_s() - t0;
    for (int k = 0; k < n; k++) check_job(what, k, &jobs[k], c);
    return seconds;
}

/* n random jobs over a model of context `ctx_len` and vocabulary `vocab`: prompts of 1 to
 * max_prompt ids, 1 to max_new tokens; every eighth sampled with a seed (and a repetition
 * penalty), a sixth of them cancelled one way or another. The alone outputs come from `alone`. */
static job *make_jobs(int n, nopad_engine *e, nopad_context *alone, int32_t vocab, int32_t ctx_len,
                      int32_t max_prompt, int32_t max_new, int with_fates, uint64_t *rng) {
    job *jobs = calloc((size_t)n, sizeof *jobs);
    assert_non_null(jobs);
    for (int k = 0; k < n; k++) {
        job *j = &jobs[k];
        j->engine = e;
        pthread_mutex_init(&j->cb_lock, NULL);
        pthread_cond_init(&j->cb_ended, NULL);
        j->n_prompt = 1 + (int32_t)(test_rand_u32(rng) % (uint32_t)max_prompt);
        for (int32_t i = 0; i < j->n_prompt; i++) j->prompt[i] = (int32_t)(test_rand_u32(rng) % (uint32_t)vocab);
        int32_t room = ctx_len - j->n_prompt;
        if (room > max_new) room = max_new;
        j->max_tokens = 1 + (int32_t)(test_rand_u32(rng) % (uint32_t)room);
        j->sampling = nopad_sampling_default_params();
        if (k % 8 == 3) {
            j->sampling.temperature = 0.8f;
            j->sampling.top_p = 0.9f;
            j->sampling.repetition_penalty = 1.3f;
            j->sampling.seed = 1000 + (uint64_t)k;
        }
        j->use_callback = k % 3 == 1;
        j->delay_us = test_rand_u32(rng) % 3000;
        j->fate = KEEP;
        if (with_fates && k % 6 == 5) {
            j->fate = (fate)(1 + (k / 6) % 4);
            if (j->fate != FREE_UNREAD) j->max_tokens = room; /* long enough to be caught running */
            j->cancel_after = 1 + (int32_t)(test_rand_u32(rng) % 3);
        }
        j->n_want = generate_alone(alone, j->prompt, j->n_prompt, j->max_tokens, &j->sampling, j->want);
        j->stop_id = -1;
        if (k % 7 == 4 && j->fate == KEEP && j->sampling.temperature == 0 && j->n_want >= 2) {
            /* it ends at the first time its alone output has that id, the id delivered */
            j->stop_id = j->want[j->n_want / 2];
            int32_t first = 0;
            while (j->want[first] != j->stop_id) first++;
            j->n_want = first + 1;
        }
    }
    return jobs;
}

static void free_jobs(job *jobs, int n) {
    for (int k = 0; k < n; k++) {
        nopad_request_free(jobs[k].r);
        pthread_mutex_destroy(&jobs[k].cb_lock);
        pthread_cond_destroy(&jobs[k].cb_ended);
    }
    free(jobs);
}

static int count_fate(const job *jobs, int n, fate f, nopad_finish_reason finish) {
    int count = 0;
    for (int k = 0; k < n; k++) count += jobs[k].fate == f && jobs[k].finish == finish;
    return count;
}

static void test_random_arrivals(void **state) {
    nopad_model *m = load_fixture("llama_gqa");
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(m, &info));
    nopad_context *alone;
    assert_nopad_ok(nopad_context_create(m, NULL, &alone));
    nopad_engine_params ep = test_params(state);
    ep.max_step_tokens = 64; /* prompts up to 100 ids come in chunks */
    ep.max_running = 24;
    nopad_engine *e;
    assert_nopad_ok(nopad_engine_create(m, &ep, &e));
    uint64_t rng = 22;
    job *jobs = make_jobs(N_JOBS, e, alone, info.vocab_size, info.max_position_embeddings, 100, 60, 1, &rng);
    checker c = {.alone = alone, .vocab = info.vocab_size};
    const double seconds = run_jobs("random arrivals", jobs, N_JOBS, 7, &c);
    const nopad_engine_stats st = wait_idle(e, N_JOBS);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_true(st.kv_blocks_cached <= st.kv_blocks_total);
    const int cancelled = count_fate(jobs, N_JOBS, CANCEL_AT_SUBMIT, NOPAD_FINISH_CANCELLED) +
                          count_fate(jobs, N_JOBS, CANCEL_WHILE_READING, NOPAD_FINISH_CANCELLED) +
                          count_fate(jobs, N_JOBS, CANCEL_BY_ID, NOPAD_FINISH_CANCELLED);
    assert_true(count_fate(jobs, N_JOBS, CANCEL_AT_SUBMIT, NOPAD_FINISH_CANCELLED) > 0);
    int64_t tokens = 0;
    int stopped = 0;
    for (int k = 0; k < N_JOBS; k++) {
        tokens += jobs[k].n_got;
        stopped += jobs[k].stop_id >= 0;
    }
    assert_true(stopped > 0);
    printf("  llama_gqa, %d requests from %d threads%s: %lld tokens in %.2f s over %lld steps, %d "
           "ended by a stop id, %d cancelled in flight (+%d freed unread), %lld preemptions, %lld "
           "prompt tokens shared, %d sampled outputs parted at a boundary draw; pool after: %d "
           "used, %d cached of %d\n",
           N_JOBS, N_THREADS, ep.overlap_steps > 0 ? ", steps overlapped" : "", (long long)tokens,
           seconds, (long long)st.steps, stopped, cancelled,
           count_fate(jobs, N_JOBS, FREE_UNREAD, NOPAD_FINISH_CANCELLED), (long long)st.preemptions,
           (long long)st.prompt_tokens_shared, c.near_boundary, st.kv_blocks_used,
           st.kv_blocks_cached, st.kv_blocks_total);
    free_jobs(jobs, N_JOBS);
    nopad_engine_free(e);
    nopad_context_free(alone);
    nopad_model_free(m);
}

/* A pool far smaller than the load: requests are preempted and computed again, and every output
 * is still each request's own. */
static void test_pool_exhaustion(void **state) {
    nopad_model *m = load_fixture("llama_gqa");
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(m, &info));
    nopad_context *alone;
    assert_nopad_ok(nopad_context_create(m, NULL, &alone));
    nopad_engine_params ep = test_params(state);
    ep.max_step_tokens = 48;
    ep.kv_cache_tokens = 160; /* 20 blocks of 8: a request holds up to 16 */
    ep.kv_block_size = 8;
    nopad_engine *e;
    assert_nopad_ok(nopad_engine_create(m, &ep, &e));
    uint64_t rng = 5;
    job *jobs = make_jobs(N_JOBS, e, alone, info.vocab_size, info.max_position_embeddings, 60, 60, 0, &rng);
    checker c = {.alone = alone, .vocab = info.vocab_size};
    const double seconds = run_jobs("pool exhaustion", jobs, N_JOBS, 11, &c);
    const nopad_engine_stats st = wait_idle(e, N_JOBS);
    printf("  llama_gqa, %d requests over a pool of %d blocks of %d: %lld preemptions, %lld steps "
           "in %.2f s, %lld prompt tokens computed (recomputation included), %d sampled outputs "
           "parted at a boundary draw\n",
           N_JOBS, st.kv_blocks_total, st.kv_block_size, (long long)st.preemptions,
           (long long)st.steps, seconds, (long long)st.prompt_tokens_computed, c.near_boundary);
    assert_true(st.preemptions > 0);
    assert_int_equal(st.kv_blocks_used, 0);
    free_jobs(jobs, N_JOBS);
    nopad_engine_free(e);
    nopad_context_free(alone);
    nopad_model_free(m);
}

/* ---- prefix sharing ------------------------------------------------------------------------- */

enum { PREFIX = 70, N_SHARERS = 12 };

/* Runs one request first (its prompt blocks get published), then the others at once; returns the
 * engine's counters. out[k] receives request k's ids. */
static nopad_engine_stats run_sharers(void **state, nopad_model *m, int sharing,
                                      int32_t prompts[][PREFIX + 20], const int32_t *lengths,
                                      int32_t out[][32], int32_t *shared_per_request) {
    nopad_engine_params ep = test_params(state);
    ep.prefix_sharing = sharing;
    ep.max_step_tokens = 128;
    nopad_engine *e;
    assert_nopad_ok(nopad_engine_create(m, &ep, &e));
    nopad_request *r[N_SHARERS];
    nopad_request_params p = nopad_request_default_params();
    p.max_tokens = 32;
    p.ignore_eos = 1;
    for (int k = 0; k < N_SHARERS; k++) {
        p.prompt_ids = prompts[k];
        p.n_prompt_ids = lengths[k];
        assert_nopad_ok(nopad_engine_submit(e, &p, &r[k]));
        if (k == 0) { /* the first ends before the others come */
            nopad_finish_reason f;
            assert_int_equal(read_all(r[0], out[0], 32, 5, &f), 32);
        }
    }
    for (int k = 1; k < N_SHARERS; k++) {
        nopad_finish_reason f;
        assert_int_equal(read_all(r[k], out[k], 32, 7, &f), 32);
        assert_int_equal(f, NOPAD_FINISH_LENGTH);
    }
    const nopad_engine_stats st = wait_idle(e, N_SHARERS);
    for (int k = 0; k < N_SHARERS; k++) {
        nopad_request_stats rs;
        assert_nopad_ok(nopad_request_get_stats(r[k], &rs));
        assert_int_equal(rs.prompt_tokens, lengths[k]);
        assert_int_equal(rs.generated_tokens, 32);
        assert_true(rs.first_token_ms >= rs.admitted_ms && rs.finished_ms >= rs.first_token_ms);
        shared_per_request[k] = rs.prompt_tokens_shared;
        nopad_request_free(r[k]);
    }
    assert_int_equal(st.kv_blocks_used, 0);
    nopad_engine_free(e);
    return st;
}

static void test_prefix_sharing(void **state) {
    nopad_model *m = load_fixture("llama_gqa");
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(m, &info));
    nopad_context *alone;
    assert_nopad_ok(nopad_context_create(m, NULL, &alone));
    static int32_t prompts[N_SHARERS][PREFIX + 20], on[N_SHARERS][32], off[N_SHARERS][32];
    int32_t lengths[N_SHARERS], shared_on[N_SHARERS], shared_off[N_SHARERS];
    uint64_t rng = 99;
    for (int i = 0; i < PREFIX; i++) prompts[0][i] = (int32_t)(test_rand_u32(&rng) % (uint32_t)info.vocab_size);
    for (int k = 0; k < N_SHARERS; k++) {
        memcpy(prompts[k], prompts[0], PREFIX * sizeof(int32_t));
        /* request 1 repeats request 0; request 2 is exactly 64 ids, four whole blocks */
        lengths[k] = k == 2 ? 64 : PREFIX + 1 + (int32_t)(test_rand_u32(&rng) % 19);
        if (k == 1) lengths[1] = lengths[0];
        for (int i = PREFIX; i < lengths[k]; i++)
            prompts[k][i] = k == 1 ? prompts[0][i] : (int32_t)(test_rand_u32(&rng) % (uint32_t)info.vocab_size);
    }
    const nopad_engine_stats s_on = run_sharers(state, m, 1, prompts, lengths, on, shared_on);
    const nopad_engine_stats s_off = run_sharers(state, m, 0, prompts, lengths, off, shared_off);
    const nopad_sampling_params greedy = nopad_sampling_default_params();
    for (int k = 0; k < N_SHARERS; k++) {
        int32_t want[32];
        const int32_t n = generate_alone(alone, prompts[k], lengths[k], 32, &greedy, want);
        expect_same_ids("prefix sharing on", k, on[k], 32, want, n);
        expect_same_ids("prefix sharing off", k, off[k], 32, want, n);
        assert_int_equal(shared_off[k], 0);
    }
    /* block size 16: the others find the prefix's 4 full blocks; the repeat finds all of its own
     * full blocks, and the 64-id prompt 3 of its 4 (its last id is computed) */
    assert_int_equal(shared_on[0], 0);
    assert_int_equal(shared_on[1], (lengths[0] - 1) / 16 * 16);
    assert_int_equal(shared_on[2], 48);
    int64_t want_shared = 0;
    for (int k = 1; k < N_SHARERS; k++) {
        if (k > 2) assert_int_equal(shared_on[k], 64);
        want_shared += shared_on[k];
    }
    assert_int_equal(s_on.prompt_tokens_shared, want_shared);
    assert_int_equal(s_off.prompt_tokens_shared, 0);
    assert_int_equal(s_off.kv_blocks_cached, 0);
    assert_true(s_on.kv_blocks_cached > 0);
    printf("  prefix of %d ids, %d requests: %lld prompt tokens shared, %lld computed (%lld without "
           "sharing); outputs equal\n",
           PREFIX, N_SHARERS, (long long)s_on.prompt_tokens_shared,
           (long long)s_on.prompt_tokens_computed, (long long)s_off.prompt_tokens_computed);
    assert_int_equal(s_on.prompt_tokens_computed + s_on.prompt_tokens_shared, s_off.prompt_tokens_computed);
    nopad_context_free(alone);
    nopad_model_free(m);
}

/* ---- bad input and clean ends --------------------------------------------------------------- */

typedef struct gate {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int open, waiting;
} gate;

/* Holds the engine thread in the first request's first callback until the test opens the gate. */
static void hold_engine(void *user, uint64_t id, int32_t token, const char *text,
                        nopad_finish_reason finish) {
    gate *g = user;
    pthread_mutex_lock(&g->lock);
    g->waiting = 1;
    pthread_cond_broadcast(&g->cond);
    while (!g->open) pthread_cond_wait(&g->cond, &g->lock);
    pthread_mutex_unlock(&g->lock);
}

static void test_bad_input(void **state) {
    nopad_model *m = load_fixture("llama_gqa");
    nopad_engine_params ep = nopad_engine_default_params();
    ep.kv_cache_tokens = 64;
    ep.kv_block_size = 16;
    ep.max_running = 1;
    ep.max_queue = 2;
    nopad_engine *e;
    assert_nopad_ok(nopad_engine_create(m, &ep, &e));
    const int32_t ids[4] = {5, 6, 7, 8};
    nopad_request *r = NULL;
    nopad_request_params p = nopad_request_default_params();
    p.max_tokens = 4;
    assert_nopad_error(nopad_engine_submit(e, &p, &r), NOPAD_ERR_INVALID_ARGUMENT, "neither is set");
    p.prompt_ids = ids;
    p.n_prompt_ids = 0;
    assert_nopad_error(nopad_engine_submit(e, &p, &r), NOPAD_ERR_INVALID_ARGUMENT, "the prompt is empty");
    p.n_prompt_ids = 4;
    p.prompt_text = "hi";
    assert_nopad_error(nopad_engine_submit(e, &p, &r), NOPAD_ERR_INVALID_ARGUMENT, "both are set");
    p.prompt_ids = NULL;
    assert_nopad_error(nopad_engine_submit(e, &p, &r), NOPAD_ERR_INVALID_ARGUMENT, "needs a tokenizer");
    p.prompt_ids = ids;
    p.prompt_text = NULL;
    const char *const stop[] = {"x"};
    p.stop_strings = stop;
    p.n_stop_strings = 1;
    assert_nopad_error(nopad_engine_submit(e, &p, &r), NOPAD_ERR_INVALID_ARGUMENT, "stop strings need a tokenizer");
    p.n_stop_strings = 0;
    const int32_t bad_ids[2] = {5, 307};
    p.prompt_ids = bad_ids;
    p.n_prompt_ids = 2;
    assert_nopad_error(nopad_engine_submit(e, &p, &r), NOPAD_ERR_INVALID_ARGUMENT, "outside the vocabulary [0, 307)");
    p.prompt_ids = ids;
    p.n_prompt_ids = 4;
    p.max_tokens = 0;
    assert_nopad_error(nopad_engine_submit(e, &p, &r), NOPAD_ERR_INVALID_ARGUMENT, "max_tokens is 0");
    p.max_tokens = 125;
    assert_nopad_error(nopad_engine_submit(e, &p, &r), NOPAD_ERR_TOO_LONG, "the model's context of 128");
    p.max_tokens = 62; /* 4 + 62 - 1 = 65 tokens of KV: 5 blocks, the pool has 4 */
    assert_nopad_error(nopad_engine_submit(e, &p, &r), NOPAD_ERR_TOO_LONG, "could never run");
    p.max_tokens = 61; /* 64 tokens: the whole pool */
    p.sampling.temperature = -1;
    assert_nopad_error(nopad_engine_submit(e, &p, &r), NOPAD_ERR_INVALID_ARGUMENT, "temperature");
    p.sampling = nopad_sampling_default_params();
    assert_null(r);
    assert_nopad_error(nopad_engine_cancel(e, 12345), NOPAD_ERR_INVALID_ARGUMENT, "no request with id 12345");

    /* queue full: the engine is held inside the first request's callback, so nothing is admitted
     * while two more wait; the fourth is refused and accepted once the queue has moved */
    gate g = {.open = 0};
    pthread_mutex_init(&g.lock, NULL);
    pthread_cond_init(&g.cond, NULL);
    nopad_request_params held = p;
    held.on_token = hold_engine;
    held.user = &g;
    nopad_request *q[4];
    assert_nopad_ok(nopad_engine_submit(e, &held, &q[0]));
    pthread_mutex_lock(&g.lock);
    while (!g.waiting) pthread_cond_wait(&g.cond, &g.lock);
    pthread_mutex_unlock(&g.lock);
    assert_nopad_ok(nopad_engine_submit(e, &p, &q[1]));
    assert_nopad_ok(nopad_engine_submit(e, &p, &q[2]));
    assert_nopad_error(nopad_engine_submit(e, &p, &q[3]), NOPAD_ERR_QUEUE_FULL, "max_queue 2");
    assert_null(q[3]);
    nopad_engine_stats st;
    assert_nopad_ok(nopad_engine_get_stats(e, &st));
    assert_int_equal(st.running, 1);
    assert_int_equal(st.waiting, 2);
    assert_true(st.kv_blocks_used > 0);
    /* a request freed unread while it waits: cancelled, nothing leaks */
    nopad_request_free(q[2]);
    pthread_mutex_lock(&g.lock);
    g.open = 1;
    pthread_cond_broadcast(&g.cond);
    pthread_mutex_unlock(&g.lock);
    nopad_finish_reason f;
    int32_t out[MAX_IDS], n;
    assert_int_equal(read_all(q[0], out, MAX_IDS, 8, &f), 61);
    assert_int_equal(f, NOPAD_FINISH_LENGTH);
    /* cancelling an ended request leaves it as it was */
    assert_nopad_ok(nopad_request_cancel(q[0]));
    assert_nopad_ok(nopad_request_read(q[0], out, 8, &n, &f, 0));
    assert_int_equal(n, 0);
    assert_int_equal(f, NOPAD_FINISH_LENGTH);
    /* once retired (with q[2], before q[1] can start), its id is unknown */
    for (;;) {
        assert_nopad_ok(nopad_engine_get_stats(e, &st));
        if (st.requests_finished >= 2) break;
        sleep_us(500);
    }
    assert_nopad_error(nopad_engine_cancel(e, nopad_request_id(q[0])), NOPAD_ERR_INVALID_ARGUMENT, "no request");
    assert_nopad_ok(nopad_engine_submit(e, &p, &q[3]));
    assert_int_equal(read_all(q[1], out, MAX_IDS, 64, &f), 61);
    assert_int_equal(read_all(q[3], out, MAX_IDS, 64, &f), 61);
    st = wait_idle(e, 4);
    assert_int_equal(st.kv_blocks_used, 0);
    for (int k = 0; k < 4; k++)
        if (k != 2) nopad_request_free(q[k]);
    nopad_request_free(NULL);
    assert_nopad_error(nopad_request_read(NULL, out, 1, &n, &f, 0), NOPAD_ERR_INVALID_ARGUMENT, "need a request");
    pthread_mutex_destroy(&g.lock);
    pthread_cond_destroy(&g.cond);

    /* reads with a time limit; a cancelled request gives back its blocks */
    p.max_tokens = 61;
    assert_nopad_ok(nopad_engine_submit(e, &p, &r));
    assert_nopad_ok(nopad_request_read(r, out, 1, &n, &f, 0));
    assert_true(n <= 1);
    assert_nopad_ok(nopad_request_read(r, out, 1, &n, &f, 1000));
    assert_int_equal(n, 1);
    assert_nopad_ok(nopad_request_cancel(r));
    int32_t total = 1;
    do {
        assert_nopad_ok(nopad_request_read(r, out, 8, &n, &f, 50));
        total += n;
    } while (f == NOPAD_FINISH_NONE);
    assert_true(f == NOPAD_FINISH_CANCELLED || (f == NOPAD_FINISH_LENGTH && total == 61));
    st = wait_idle(e, 5);
    assert_int_equal(st.kv_blocks_used, 0);
    nopad_request_free(r);
    assert_string_equal(nopad_finish_reason_name(NOPAD_FINISH_CANCELLED), "cancelled");
    assert_string_equal(nopad_status_string(NOPAD_ERR_QUEUE_FULL), "queue full");

    /* freeing the engine with requests in flight cancels them; their handles stay readable */
    nopad_request *live[2];
    p.max_tokens = 40;
    for (int k = 0; k < 2; k++) assert_nopad_ok(nopad_engine_submit(e, &p, &live[k]));
    nopad_engine_free(e);
    for (int k = 0; k < 2; k++) {
        n = read_all(live[k], out, MAX_IDS, 64, &f);
        assert_true(f == NOPAD_FINISH_CANCELLED || (f == NOPAD_FINISH_LENGTH && n == 40));
        nopad_request_free(live[k]);
    }

    /* an encoder, and parameters out of range */
    nopad_model *enc = load_fixture("bert_a");
    assert_nopad_error(nopad_engine_create(enc, NULL, &e), NOPAD_ERR_INVALID_ARGUMENT, "is an encoder");
    assert_null(e);
    nopad_model_free(enc);
    ep = nopad_engine_default_params();
    ep.max_queue = 0;
    assert_nopad_error(nopad_engine_create(m, &ep, &e), NOPAD_ERR_INVALID_ARGUMENT, "max_queue 0");
    nopad_engine_free(NULL);
    nopad_model_free(m);
}

/* An engine closed without ever taking a request (a server stopped before its first request, a
 * request file with no lines): the engine thread's last look at the empty queue copies nothing,
 * which UBSan checks (memcpy from the empty queue's NULL list), and nothing leaks. */
static void test_idle_engine(void **state) {
    (void)state;
    nopad_model *m = load_fixture("llama_gqa");
    nopad_engine *e = NULL;
    assert_nopad_ok(nopad_engine_create(m, NULL, &e));
    sleep_us(2000); /* the engine thread is waiting on the empty queue */
    nopad_engine_free(e);
    assert_nopad_ok(nopad_engine_create(m, NULL, &e)); /* and freed at once */
    nopad_engine_free(e);
    nopad_model_free(m);
}

/* A caller may ask for counts only: nopad_request_logprobs and nopad_request_read with a NULL
 * buffer of capacity 0 (memcpy from or to NULL is undefined even for 0 bytes; the ASan/UBSan job
 * runs this). */
static void test_count_only_reads(void **state) {
    (void)state;
    nopad_model *m = load_fixture("llama_gqa");
    nopad_engine *e = NULL;
    assert_nopad_ok(nopad_engine_create(m, NULL, &e));
    const int32_t prompt[] = {5, 17, 3, 42};
    nopad_request_params p = nopad_request_default_params();
    p.prompt_ids = prompt;
    p.n_prompt_ids = 4;
    p.max_tokens = 6;
    p.ignore_eos = 1;
    p.logprobs = 1;
    nopad_request *r;
    assert_nopad_ok(nopad_engine_submit(e, &p, &r));
    int32_t ids[MAX_IDS], n = -1;
    nopad_finish_reason finish;
    assert_int_equal(read_all(r, ids, MAX_IDS, 64, &finish), 6);
    assert_nopad_ok(nopad_request_logprobs(r, NULL, 0, &n));
    assert_int_equal(n, 6);
    n = -1;
    assert_nopad_ok(nopad_request_read(r, NULL, 0, &n, &finish, 0));
    assert_int_equal(n, 0);
    assert_int_equal(finish, NOPAD_FINISH_LENGTH);
    nopad_request_free(r);
    nopad_engine_free(e);
    nopad_model_free(m);
}

/* ---- SmolLM2: text, stop strings, random arrivals on a real model --------------------------- */

typedef struct text_log {
    char text[4096];
    nopad_finish_reason finish;
    pthread_mutex_t lock;
    pthread_cond_t ended;
} text_log;

static void log_text(void *user, uint64_t id, int32_t token, const char *text,
                     nopad_finish_reason finish) {
    text_log *l = user;
    pthread_mutex_lock(&l->lock);
    strncat(l->text, text, sizeof l->text - strlen(l->text) - 1);
    l->finish = finish;
    pthread_cond_broadcast(&l->ended);
    pthread_mutex_unlock(&l->lock);
}

/* Runs prompt_text greedily; the text of nopad_request_text, which the callback's pieces add up to. */
static void run_text(nopad_engine *e, const char *prompt, const char *stop, int32_t *ids,
                     int32_t *n_ids, char *text, nopad_finish_reason *finish) {
    nopad_request_params p = nopad_request_default_params();
    p.prompt_text = prompt;
    p.max_tokens = 24;
    text_log log = {.text = ""};
    pthread_mutex_init(&log.lock, NULL);
    pthread_cond_init(&log.ended, NULL);
    p.on_token = log_text;
    p.user = &log;
    if (stop) {
        p.stop_strings = &stop;
        p.n_stop_strings = 1;
    }
    nopad_request *r;
    assert_nopad_ok(nopad_engine_submit(e, &p, &r));
    *n_ids = read_all(r, ids, MAX_IDS, 64, finish);
    size_t len;
    assert_nopad_ok(nopad_request_text(r, text, 4096, &len));
    pthread_mutex_lock(&log.lock); /* the reader may see the end before the last call is done */
    while (log.finish == NOPAD_FINISH_NONE) pthread_cond_wait(&log.ended, &log.lock);
    pthread_mutex_unlock(&log.lock);
    assert_string_equal(log.text, text);
    assert_int_equal(log.finish, *finish);
    pthread_mutex_destroy(&log.lock);
    pthread_cond_destroy(&log.ended);
    nopad_request_free(r);
}

static void test_smollm2(void **state) {
    nopad_model *m = load_smollm2();
    if (!m) return;
    const nopad_tokenizer *tok = nopad_model_tokenizer(m);
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(m, &info));
    nopad_engine_params ep = test_params(state);
    ep.max_step_tokens = 256;
    ep.kv_cache_tokens = 4096;
    nopad_engine *e;
    assert_nopad_ok(nopad_engine_create(m, &ep, &e));

    /* the text is the ids' text; a stop string taken from it ends the same run before it */
    int32_t ids[MAX_IDS], stop_ids[MAX_IDS], n, n_stop;
    static char text[4096], stop_text_out[4096], whole[4096];
    nopad_finish_reason f;
    const char *prompt = "The capital of France is";
    run_text(e, prompt, NULL, ids, &n, text, &f);
    size_t len;
    assert_nopad_ok(nopad_detokenize(tok, ids, (size_t)n, 1, whole, sizeof whole, &len));
    if (f == NOPAD_FINISH_LENGTH) assert_string_equal(text, whole);
    printf("  SmolLM2: \"%s\" ->%s (%d ids, %s)\n", prompt, text, n, nopad_finish_reason_name(f));
    const size_t text_len = strlen(text);
    assert_true(text_len > 12);
    char stop[5];
    memcpy(stop, text + text_len / 2, 4);
    stop[4] = '\0';
    run_text(e, prompt, stop, stop_ids, &n_stop, stop_text_out, &f);
    assert_int_equal(f, NOPAD_FINISH_STOP);
    const size_t cut = (size_t)(strstr(text, stop) - text);
    assert_int_equal(strlen(stop_text_out), cut);
    assert_memory_equal(stop_text_out, text, cut);
    assert_true(n_stop <= n);
    assert_memory_equal(stop_ids, ids, (size_t)n_stop * sizeof *ids);
    /* and its ids end with the one that completed the stop string: the engine launches the next
     * step before it sees the text, and that step's id for the request must not come */
    static char upto[4096];
    assert_nopad_ok(nopad_detokenize(tok, stop_ids, (size_t)n_stop, 1, upto, sizeof upto, &len));
    assert_non_null(strstr(upto, stop));
    assert_nopad_ok(nopad_detokenize(tok, stop_ids, (size_t)n_stop - 1, 1, upto, sizeof upto, &len));
    assert_null(strstr(upto, stop));
    printf("  stop string \"%s\": %d ids, text \"%s\"\n", stop, n_stop, stop_text_out);

    /* random arrivals: 16 requests, prompts of 1 to 200 ids, up to 6 new tokens, against each alone */
    nopad_context *alone;
    nopad_context_params cp = nopad_context_default_params();
    cp.max_batch_tokens = 256;
    cp.kv_cache_tokens = 512;
    assert_nopad_ok(nopad_context_create(m, &cp, &alone));
    uint64_t rng = 3;
    const double t0 = now_s();
    const int n_jobs = N_JOBS / 4;
    job *jobs = make_jobs(n_jobs, e, alone, info.vocab_size, 1024, 200, 6, 1, &rng);
    const double t_alone = now_s() - t0;
    checker c = {.alone = alone, .vocab = info.vocab_size};
    const double seconds = run_jobs("SmolLM2 random arrivals", jobs, n_jobs, 17, &c);
    const nopad_engine_stats st = wait_idle(e, n_jobs + 2);
    assert_int_equal(st.kv_blocks_used, 0);
    printf("  SmolLM2, %d requests from %d threads: %.2f s in the engine (%lld steps), %.2f s one "
           "by one alone, %d sampled outputs parted at a boundary draw\n",
           n_jobs, N_THREADS, seconds, (long long)st.steps, t_alone, c.near_boundary);
    free_jobs(jobs, n_jobs);
    nopad_context_free(alone);
    nopad_engine_free(e);
    nopad_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_blocks),
        cmocka_unit_test(test_stop_text),
        cmocka_unit_test(test_random_arrivals),
        cmocka_unit_test_prestate(test_random_arrivals, &OVERLAP_ON),
        cmocka_unit_test(test_pool_exhaustion),
        cmocka_unit_test_prestate(test_pool_exhaustion, &OVERLAP_ON),
        cmocka_unit_test(test_prefix_sharing),
        cmocka_unit_test_prestate(test_prefix_sharing, &OVERLAP_ON),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_idle_engine),
        cmocka_unit_test(test_count_only_reads),
        cmocka_unit_test(test_smollm2),
        cmocka_unit_test_prestate(test_smollm2, &OVERLAP_ON),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
