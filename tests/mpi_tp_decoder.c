/* Tensor-parallel decoders against one process, run under mpirun at 2, 3 and 4 ranks (the tp is
 * the world's size). Rank 0 loads each model split (tp_size = world) and whole (tp_size 1) and
 * compares them; every other rank follows (nopad_tp_follow). Models: the tiny GPT-2 and LLaMA
 * family decoders of tests/data/models (GQA, MQA, Qwen2's QKV biases, linear RoPE scaling) and
 * SmolLM2 (9 query heads, 3 key/value heads) when its GGUF is present. A tp the model cannot be
 * split by must be refused on every rank with the sizes that work.
 *
 * What must hold:
 *   - logits of prompt steps (all rows) and of decode steps within 1e-5 of one process, relative
 *     to each row's norm: float32 on both sides, and the split only changes the order in which the
 *     row-parallel products are summed (partial sums of H/tp or F/tp terms, then the all-reduce);
 *   - greedy and seeded-sampling generations: the same ids;
 *   - the engine with requests arriving at random times from three threads: every request's ids
 *     equal to the same request's on the one-process engine (greedy; the engine's own rounding
 *     note in nopad.h applies alike to both). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi_lib.h" /* a failure on any rank ends the job: no rank waits in a collective */

static int32_t world, rank;
static const char *model_path; /* the model being compared, for the messages */

#define CHECK(st)                                                                                      \
    do {                                                                                           \
        nopad_status st_ = (st);                                                                   \
        if (st_ != NOPAD_OK) fail_msg("rank %d: %s: %s", rank, #st, nopad_last_error());            \
    } while (0)

static uint32_t next_u32(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (uint32_t)(*s >> 11);
}

static nopad_model_params params_for(int32_t tp) {
    nopad_model_params p = nopad_model_default_params();
    p.tp_size = tp;
    /* a split model holds float weights (a GGUF's are dequantised): so does the whole one it is
     * compared with */
    p.weights = NOPAD_WEIGHTS_F32;
    p.max_batch_tokens = 256;
    p.kv_cache_tokens = 2048;
    return p;
}

/* |a - b| per row within tol of the row's norm (test_max_row_rel_error) */
static void logits_close(const char *what, const float *got, const float *want, int64_t rows, int64_t V) {
    const double err = test_max_row_rel_error(got, want, rows, V);
    if (!(err <= 1e-5)) fail_msg("%s: logits of tp %d differ from one process by %.3g (row-relative)", what, world, err);
}

/* Prompt steps with every row's logits, then decode steps, on both models. */
static void compare_logits(nopad_model *one, nopad_model *tp, int32_t V, uint64_t *rng) {
    enum { B = 3 };
    nopad_sequence *s1[B], *s2[B];
    for (int b = 0; b < B; b++) {
        CHECK(nopad_sequence_create(nopad_model_context(one), &s1[b]));
        CHECK(nopad_sequence_create(nopad_model_context(tp), &s2[b]));
    }
    /* lengths 1, the longest the test uses, and one in between */
    const int32_t lens[B] = {1, 1 + (int32_t)(next_u32(rng) % 40), 64};
    int32_t cu[B + 1] = {0};
    for (int b = 0; b < B; b++) cu[b + 1] = cu[b] + lens[b];
    int32_t *ids = malloc((size_t)cu[B] * sizeof *ids);
    for (int32_t t = 0; t < cu[B]; t++) ids[t] = (int32_t)(next_u32(rng) % (uint32_t)V);
    float *l1 = malloc((size_t)cu[B] * V * sizeof *l1), *l2 = malloc((size_t)cu[B] * V * sizeof *l2);
    CHECK(nopad_decode(nopad_model_context(one), B, s1, cu, ids, 1, l1));
    CHECK(nopad_decode(nopad_model_context(tp), B, s2, cu, ids, 1, l2));
    logits_close("prompt step", l2, l1, cu[B], V);
    int32_t cu1[B + 1] = {0, 1, 2, 3}, next[B];
    for (int step = 0; step < 4; step++) {
        for (int b = 0; b < B; b++) next[b] = (int32_t)(next_u32(rng) % (uint32_t)V);
        CHECK(nopad_decode(nopad_model_context(one), B, s1, cu1, next, 0, l1));
        CHECK(nopad_decode(nopad_model_context(tp), B, s2, cu1, next, 0, l2));
        logits_close("decode step", l2, l1, B, V);
    }
    for (int b = 0; b < B; b++) {
        nopad_sequence_free(s1[b]);
        nopad_sequence_free(s2[b]);
    }
    free(ids), free(l1), free(l2);
}

/* nopad_decode_sample with log-probabilities, greedy (each rank's best id merged, no logits
 * gathered) and seeded sampling (logits gathered): the same ids, log-probabilities within 1e-4.
 * Why 1e-4: a log-probability moves by at most twice the largest change of a logit of its row, and
 * the logits themselves differ between tp and one process by up to ~7e-6 of the row's norm
 * (compare_logits: SmolLM2's 30 layers at tp 3), about 7e-5 absolute for the whole row's difference
 * vector, of which one logit's change is a small part (measured: well inside 1e-4); the merge of
 * the ranks' exp-sums (each summed in double, rounded to float) adds ~1e-7. */
static void compare_decode_sample(nopad_model *one, nopad_model *tp, int32_t V, uint64_t *rng, int seeded) {
    enum { B = 3 };
    nopad_sequence *s1[B], *s2[B];
    for (int b = 0; b < B; b++) {
        CHECK(nopad_sequence_create(nopad_model_context(one), &s1[b]));
        CHECK(nopad_sequence_create(nopad_model_context(tp), &s2[b]));
    }
    int32_t cu[B + 1] = {0, 1, 9, 30}, ids[30];
    for (int32_t t = 0; t < cu[B]; t++) ids[t] = (int32_t)(next_u32(rng) % (uint32_t)V);
    nopad_sampling_params p[B];
    uint64_t draws[B];
    for (int b = 0; b < B; b++) {
        p[b] = nopad_sampling_default_params();
        if (seeded) p[b].temperature = 0.7f, p[b].top_k = 20, p[b].seed = 77 + (uint64_t)b;
    }
    int32_t id1[B], id2[B], cu1[B + 1] = {0, 1, 2, 3};
    float lp1[B], lp2[B];
    for (int step = 0; step < 5; step++) {
        for (int b = 0; b < B; b++) draws[b] = (uint64_t)step;
        int32_t fed[B]; /* the ids step - 1 chose, fed to both (id1 is overwritten below) */
        memcpy(fed, id1, sizeof fed);
        const int32_t *c = step == 0 ? cu : cu1, *in = step == 0 ? ids : fed;
        CHECK(nopad_decode_sample(nopad_model_context(one), B, s1, c, in, p, draws, id1, lp1));
        CHECK(nopad_decode_sample(nopad_model_context(tp), B, s2, c, in, p, draws, id2, lp2));
        for (int b = 0; b < B; b++) {
            if (id1[b] != id2[b])
                fail_msg("%s decode_sample step %d row %d: tp %d chose %d, one process %d",
                         seeded ? "seeded" : "greedy", step, b, world, id2[b], id1[b]);
            const double tol = 1e-4 * (fabs(lp1[b]) > 1 ? fabs(lp1[b]) : 1);
            if (!(fabs(lp1[b] - lp2[b]) <= tol))
                fail_msg("%s: %s decode_sample step %d row %d: log-probability %.8g at tp %d, %.8g in one process",
                         model_path, seeded ? "seeded" : "greedy", step, b, lp2[b], world, lp1[b]);
        }
    }
    for (int b = 0; b < B; b++) {
        nopad_sequence_free(s1[b]);
        nopad_sequence_free(s2[b]);
    }
}

static void compare_generate(nopad_model *one, nopad_model *tp, int32_t V, uint64_t *rng, int seeded) {
    enum { N = 2, MAX = 12 };
    int32_t cu[N + 1] = {0, 5, 5 + 1 + (int32_t)(next_u32(rng) % 20)};
    int32_t *prompt = malloc((size_t)cu[N] * sizeof *prompt);
    for (int32_t t = 0; t < cu[N]; t++) prompt[t] = (int32_t)(next_u32(rng) % (uint32_t)V);
    nopad_generate_params g = nopad_generate_default_params();
    g.max_tokens = MAX;
    g.ignore_eos = 1;
    if (seeded) {
        g.sampling.temperature = 0.9f;
        g.sampling.top_p = 0.95f;
        g.sampling.seed = 1234;
    }
    int32_t out1[N * MAX], out2[N * MAX], n1[N], n2[N];
    CHECK(nopad_generate(nopad_model_context(one), N, cu, prompt, &g, out1, n1, NULL, NULL));
    CHECK(nopad_generate(nopad_model_context(tp), N, cu, prompt, &g, out2, n2, NULL, NULL));
    for (int i = 0; i < N; i++) {
        assert_int_equal(n1[i], n2[i]);
        for (int32_t k = 0; k < n1[i]; k++)
            if (out1[i * MAX + k] != out2[i * MAX + k])
                fail_msg("%s generation, prompt %d, token %d: tp %d chose %d, one process %d",
                         seeded ? "seeded" : "greedy", i, k, world, out2[i * MAX + k], out1[i * MAX + k]);
    }
    free(prompt);
}

/* ---- the engine: requests from three threads at random times --------------------------------- */

enum { THREADS = 3, PER_THREAD = 3, REQUESTS = THREADS * PER_THREAD, GEN = 10, PROMPT_MAX = 40 };

typedef struct engine_run {
    nopad_engine *engine;
    int32_t prompts[REQUESTS][PROMPT_MAX], prompt_len[REQUESTS];
    int32_t ids[REQUESTS][GEN], n_ids[REQUESTS];
    int random_delays;
} engine_run;

typedef struct thread_arg {
    engine_run *run;
    int thread;
} thread_arg;

static void *submit_thread(void *arg_) {
    thread_arg *arg = arg_;
    engine_run *run = arg->run;
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)(arg->thread + 1);
    nopad_request *reqs[PER_THREAD];
    for (int k = 0; k < PER_THREAD; k++) {
        const int i = arg->thread * PER_THREAD + k;
        if (run->random_delays) {
            struct timespec d = {0, (long)(next_u32(&rng) % 20) * 1000000L};
            nanosleep(&d, NULL);
        }
        nopad_request_params rp = nopad_request_default_params();
        rp.prompt_ids = run->prompts[i];
        rp.n_prompt_ids = run->prompt_len[i];
        rp.max_tokens = GEN;
        rp.ignore_eos = 1;
        if (nopad_engine_submit(run->engine, &rp, &reqs[k]) != NOPAD_OK) {
            fprintf(stderr, "submit: %s\n", nopad_last_error());
            reqs[k] = NULL;
        }
    }
    for (int k = 0; k < PER_THREAD; k++) {
        const int i = arg->thread * PER_THREAD + k;
        run->n_ids[i] = -1;
        if (!reqs[k]) continue;
        int32_t n = 0, got;
        nopad_finish_reason finish = NOPAD_FINISH_NONE;
        while (finish == NOPAD_FINISH_NONE && n < GEN) {
            if (nopad_request_read(reqs[k], run->ids[i] + n, GEN - n, &got, &finish, -1) != NOPAD_OK) break;
            n += got;
        }
        run->n_ids[i] = n;
        nopad_request_free(reqs[k]);
    }
    return NULL;
}

static void run_engine(nopad_model *m, engine_run *run) {
    nopad_engine_params ep = nopad_engine_default_params();
    ep.max_step_tokens = 64; /* prompts are read in chunks across steps, beside decodes */
    ep.kv_cache_tokens = 1024;
    CHECK(nopad_engine_create(m, &ep, &run->engine));
    pthread_t threads[THREADS];
    thread_arg args[THREADS];
    for (int t = 0; t < THREADS; t++) {
        args[t] = (thread_arg){run, t};
        pthread_create(&threads[t], NULL, submit_thread, &args[t]);
    }
    for (int t = 0; t < THREADS; t++) pthread_join(threads[t], NULL);
    nopad_engine_free(run->engine);
}

static void compare_engine(nopad_model *one, nopad_model *tp, int32_t V, uint64_t *rng) {
    static engine_run a, b;
    memset(&a, 0, sizeof a);
    for (int i = 0; i < REQUESTS; i++) {
        a.prompt_len[i] = 1 + (int32_t)(next_u32(rng) % PROMPT_MAX);
        /* a shared beginning for some: the prefix cache is in play */
        for (int32_t t = 0; t < a.prompt_len[i]; t++)
            a.prompts[i][t] = i % 3 == 0 && t < 20 ? (int32_t)(t * 7 % V) : (int32_t)(next_u32(rng) % (uint32_t)V);
    }
    b = a;
    a.random_delays = 0;
    b.random_delays = 1;
    run_engine(one, &a);
    run_engine(tp, &b);
    for (int i = 0; i < REQUESTS; i++) {
        assert_int_equal(a.n_ids[i], GEN);
        assert_int_equal(b.n_ids[i], GEN);
        for (int k = 0; k < GEN; k++)
            if (a.ids[i][k] != b.ids[i][k])
                fail_msg("engine request %d token %d: tp %d gave %d, one process %d", i, k, world, b.ids[i][k],
                         a.ids[i][k]);
    }
}

/* ---- per model -------------------------------------------------------------------------------- */

static void check_model(const char *path) {
    model_path = path;
    nopad_model_params p = params_for(world);
    if (rank != 0) {
        const nopad_status st = nopad_tp_follow(path, &p);
        /* a refused tp is refused here too, with the same words */
        if (st != NOPAD_OK && !(st == NOPAD_ERR_INVALID_ARGUMENT && strstr(nopad_last_error(), "tp that work")))
            fail_msg("rank %d following %s: %s", rank, path, nopad_last_error());
        return;
    }
    nopad_model_params p1 = params_for(1);
    nopad_model *one = NULL, *tp = NULL;
    CHECK(nopad_model_load(path, &p1, &one));
    nopad_model_info info;
    CHECK(nopad_model_get_info(one, &info));
    const int32_t kvh = info.num_kv_heads;
    const int fits = info.num_heads % world == 0 && info.intermediate_size % world == 0 &&
                     (kvh % world == 0 || world % kvh == 0);
    const nopad_status st = nopad_model_load(path, &p, &tp);
    if (!fits) {
        if (st != NOPAD_ERR_INVALID_ARGUMENT || !strstr(nopad_last_error(), "tp that work"))
            fail_msg("%s (%d heads, %d KV heads, intermediate %d) at tp %d: expected a refusal naming the tp "
                     "that work, got status %d: %s",
                     path, info.num_heads, kvh, info.intermediate_size, world, st, nopad_last_error());
        nopad_model_free(one);
        return;
    }
    CHECK(st);
    nopad_model_info tinfo;
    CHECK(nopad_model_get_info(tp, &tinfo));
    assert_int_equal(tinfo.tp_size, world);
    size_t w1 = 0, w2 = 0, ws, other;
    CHECK(nopad_model_memory(one, &w1, &ws, &other));
    CHECK(nopad_model_memory(tp, &w2, &ws, &other));
    if (!(w2 < w1)) fail_msg("%s: rank 0 holds %zu bytes of weights split over %d, %zu whole", path, w2, world, w1);
    uint64_t rng = 0x5eed0000ull + (uint64_t)world;
    compare_logits(one, tp, info.vocab_size, &rng);
    compare_decode_sample(one, tp, info.vocab_size, &rng, 0);
    compare_decode_sample(one, tp, info.vocab_size, &rng, 1);
    compare_generate(one, tp, info.vocab_size, &rng, 0);
    compare_generate(one, tp, info.vocab_size, &rng, 1);
    compare_engine(one, tp, info.vocab_size, &rng);
    nopad_model_free(tp);
    nopad_model_free(one);
}

static void test_tiny_decoders(void **state) {
    (void)state;
    static const char *const models[] = {"models/gpt2_dec", "models/llama_gqa", "models/llama_linear",
                                         "models/llama_mqa", "models/qwen2_bias"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) check_model(test_data_path(models[i]));
}

static void test_smollm2(void **state) {
    (void)state;
    const char *gguf = getenv("NOPAD_SMOLLM2_GGUF");
    FILE *f = gguf ? fopen(gguf, "rb") : NULL;
    if (!f) {
        if (rank == 0) fprintf(stderr, "SmolLM2 GGUF absent ($NOPAD_SMOLLM2_GGUF): skipped\n");
        skip();
    }
    fclose(f);
    check_model(gguf);
}

int main(void) {
    world = nopad_world_size();
    rank = nopad_world_rank();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_decoders),
        cmocka_unit_test(test_smollm2),
    };
    return MPI_RUN_TESTS(tests);
}
