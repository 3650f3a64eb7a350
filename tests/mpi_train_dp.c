/* Data-parallel training (src/train/dp.c through train_run, the loop behind nopad_train), run
 * under mpirun at 2, 3 and 4 ranks on the tiny BERTs of tests/data/train (hidden 32, 2 layers,
 * 64 ids, 32 positions):
 *   - N ranks of B tokens and S sequences each against one process of N·B and N·S (run on rank 0
 *     with a world of one inside the same job): every step's loss and every parameter after 5
 *     steps within the bounds below, every step's batch as logged (log_batches) the same, with
 *     the exchange off and on, masked LM with AdamW and with LAMB, and 3-label classification
 *     with AdamW, all without dropout; then masked LM with AdamW and classification with LAMB
 *     with dropout and attention dropout at 0.2 (masks keyed by the example: the same bounds);
 *     masked LM on packed lines; and both tasks streamed in small windows;
 *   - the exchange on data skewed on purpose (rank 0 reads every long line): the most loaded
 *     rank's tokens over the mean, averaged over the run, above 1.3 as read and at most 1.1 after
 *     the exchange, and the results those of the run without it;
 *   - a checkpoint written by N ranks at step 3 loads in one process, and one process resumed
 *     from it takes steps 4-6 as the N ranks' run that did not stop.
 *
 * The bounds: the ranks compute the same per-row gradients as one process, summed in another
 * order (each rank's rows, then across ranks), so the gradients differ by float32 rounding of a
 * sum (a few 1e-7 relative). AdamW's and LAMB's updates are lr·m/(√v + eps): a gradient entry
 * far above eps moves its parameter by lr·(1 ± that rounding), but an entry that is zero in exact
 * arithmetic (the key biases' gradients: softmax ignores a shift of a row's scores) is rounding
 * noise in both runs, and Adam's first step turns noise into ±lr·|g|/(|g| + eps). With lr 1e-4
 * and AdamW's eps 1e-8, that noise (about 1e-9) moves a key bias by at most ~1e-5, so parameters
 * are compared within 1e-5 absolute (the bound) at lr 1e-4; the losses within 1e-5
 * relative (observed: see the printed maxima). */
#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "mpi_lib.h"
#include "parallel/comm.h"
#include "train/checkpoint.h"
#include "train/dp.h"
#include "train_lib.h"

enum { N_WORDS = 59, MAX_STEPS = 16 };

static nopad_comm *world;
static int32_t RANK, RANKS;

/* Every step's loss, from on_step; a stop after `stop_at` steps (0: none). */
typedef struct steps {
    double loss[MAX_STEPS + 1];
    int64_t stop_at;
} steps;

static int on_step(void *user, const nopad_train_progress *p) {
    steps *s = user;
    if (p->step <= MAX_STEPS) s->loss[p->step] = p->loss;
    return s->stop_at > 0 && p->step >= s->stop_at;
}

/* n lines of lo..hi random words (the same text on every rank: drawn from the seed alone). Lines
 * [0, n_long) are long and dense: 13-14 words joined by commas, each comma a token of its own
 * ([UNK]), so 27-29 tokens in about 41 bytes; the others sparse, their words three spaces apart
 * (about 5 bytes a token). */
static const char *corpus(int n, int n_long, int lo, int hi, uint64_t seed) {
    char *buf = malloc((size_t)n * 31 * 5 + 1);
    assert_non_null(buf);
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t d = mpi_draw(seed, 0, (uint64_t)i * 64);
        const int words = i < n_long ? 13 + (int)(d % 2) : lo + (int)(d % (uint64_t)(hi - lo + 1));
        for (int w = 0; w < words; w++) {
            char wd[3];
            test_word((int)(mpi_draw(seed, 1, (uint64_t)i * 64 + (uint64_t)w) % N_WORDS), wd);
            len += (size_t)sprintf(buf + len, "%s%s", wd, w + 1 == words ? "\n" : i < n_long ? "," : "   ");
        }
    }
    const char *path = test_write_temp(2, ".txt", buf, len);
    free(buf);
    return path;
}

/* Rank 0's folder name on every rank (rank 0 writes the checkpoints; every rank reads them). */
static void shared_dir(char out[512]) {
    if (RANK == 0) snprintf(out, 512, "%s", test_make_temp_dir(3));
    assert_nopad_ok(comm_host_broadcast(world, out, 512, 0));
}

static nopad_train_params params(const char *model, const char *data, train_task task,
                                 nopad_train_optimizer opt, int32_t tokens, int32_t seqs) {
    nopad_train_params p = nopad_train_default_params();
    p.model_dir = model;
    p.data_path = data;
    p.task = task == TRAIN_TASK_MLM ? NOPAD_TRAIN_MLM : NOPAD_TRAIN_CLASSIFY;
    p.optimizer = opt;
    p.epochs = 2;
    p.lr = 1e-4;
    p.warmup_steps = 2;
    p.batch_tokens = tokens;
    p.batch_seqs = seqs;
    p.seed = 1234;
    p.n_threads = 1;
    p.dropout = 0;
    p.on_step = on_step;
    return p;
}

static double loss_diff(const steps *a, const steps *b, int64_t from, int64_t to) {
    double worst = 0;
    for (int64_t s = from; s <= to; s++) {
        assert_true(a->loss[s] > 0 && b->loss[s] > 0);
        const double d = fabs(a->loss[s] - b->loss[s]) / fabs(b->loss[s]);
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

/* One process (train_run without a communicator) on rank 0 with the global budget, while the
 * others wait. */
static void reference(const nopad_train_params *dp, const char *out, steps *s,
                      nopad_train_result *res) {
    if (RANK == 0) {
        nopad_train_params p = *dp;
        p.batch_tokens = dp->batch_tokens * RANKS;
        p.batch_seqs = dp->batch_seqs * RANKS;
        p.output_dir = out;
        p.user = s;
        assert_nopad_ok(train_run(&p, NULL, 1, res));
    }
    assert_nopad_ok(comm_barrier(world, NULL));
}

static void data_parallel(const nopad_train_params *dp, const char *out, int exchange, steps *s,
                          nopad_train_result *res) {
    nopad_train_params p = *dp;
    p.output_dir = out;
    p.user = s;
    assert_nopad_ok(train_run(&p, world, exchange, res));
}

/* What a comparison varies: `dropout` both the hidden and the attention dropout (their masks keyed
 * by the example, so the same wherever a sequence is computed); `pack`: pack_lines (the ranks cut
 * one process's pieces); `stream_buffer` > 0: the data streamed with that buffer (each rank reads
 * its blocks of each window), against one process streaming it. */
typedef struct variant {
    float dropout;
    int pack;
    int64_t stream_buffer;
} variant;

/* Rank 0: every step of the N ranks' log (log_batches) holds the batch of one process's: the same
 * sequences, ids, types, masked rows and labels, and sequence_ranks naming a rank for each. */
static void expect_logged_batches(const char *ref_log, const char *dp_log) {
    size_t len_a = 0, len_b = 0;
    char *a = test_read_file(ref_log, &len_a), *b = test_read_file(dp_log, &len_b);
    static const char *const fields[] = {"cu_seqlens", "input_ids", "token_type_ids", "mlm_positions",
                                         "mlm_labels", "labels", "targets"};
    int logged = 0;
    char *save_a = NULL, *save_b = NULL;
    for (char *la = strtok_r(a, "\n", &save_a), *lb = strtok_r(b, "\n", &save_b); la && lb;
         la = strtok_r(NULL, "\n", &save_a), lb = strtok_r(NULL, "\n", &save_b)) {
        cJSON *ja = cJSON_Parse(la), *jb = cJSON_Parse(lb);
        assert_non_null(ja);
        assert_non_null(jb);
        if (cJSON_GetObjectItem(ja, "loss")) {
            assert_non_null(cJSON_GetObjectItem(ja, "cu_seqlens"));
            for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++) {
                const cJSON *fa = cJSON_GetObjectItem(ja, fields[k]);
                if (fa && !cJSON_Compare(fa, cJSON_GetObjectItem(jb, fields[k]), 1))
                    fail_msg("step %d: %s differs from one process's", logged + 1, fields[k]);
            }
            const cJSON *ranks = cJSON_GetObjectItem(jb, "sequence_ranks");
            assert_non_null(ranks);
            assert_int_equal(cJSON_GetArraySize(ranks), cJSON_GetArraySize(cJSON_GetObjectItem(ja, "cu_seqlens")) - 1);
            for (const cJSON *r = ranks->child; r; r = r->next) assert_true(r->valueint >= 0 && r->valueint < RANKS);
            logged++;
        }
        cJSON_Delete(ja);
        cJSON_Delete(jb);
    }
    assert_int_equal(logged, 5);
    free(a), free(b);
}

/* N ranks x (B, S) against one process x (N·B, N·S): 5 steps, exchange off and on, their batches
 * logged (log_batches) and compared too. */
static void check_against_one(const char *which, train_task task, nopad_train_optimizer opt,
                              const char *data_path, int32_t tokens, int32_t seqs, variant v) {
    const float dropout = v.dropout;
    const int pack = v.pack;
    char data[600]; /* test_data_path's buffer is reused by train_test_model_folder */
    snprintf(data, sizeof data, "%s", data_path);
    char model[512];
    train_test_model_folder(which, 1, model);
    nopad_train_params p = params(model, data, task, opt, tokens, seqs);
    p.dropout = p.attention_dropout = dropout;
    p.pack_lines = pack;
    p.stream = v.stream_buffer > 0;
    p.stream_buffer = v.stream_buffer > 0 ? v.stream_buffer : p.stream_buffer;
    p.log_batches = 1;
    char ref_dir[512], dp_dir[512], ref_log[600], dp_log[600];
    shared_dir(ref_dir);
    snprintf(ref_log, sizeof ref_log, "%s/log.jsonl", ref_dir);
    p.log_path = ref_log;
    steps ref = {.stop_at = 5};
    nopad_train_result ref_res;
    reference(&p, ref_dir, &ref, &ref_res);
    for (int exchange = 0; exchange <= 1; exchange++) {
        shared_dir(dp_dir);
        snprintf(dp_log, sizeof dp_log, "%s/log.jsonl", dp_dir);
        p.log_path = dp_log;
        steps got = {.stop_at = 5};
        nopad_train_result res;
        data_parallel(&p, dp_dir, exchange, &got, &res);
        assert_int_equal(res.steps, 5);
        if (RANK == 0) {
            assert_int_equal(ref_res.steps, 5);
            assert_int_equal(res.n_examples, ref_res.n_examples);
            const double dl = loss_diff(&got, &ref, 1, 5), dw = train_test_max_param_diff(dp_dir, ref_dir, task);
            printf("%s %s%s%s%s, %d ranks, exchange %s: %d examples, losses within %.2e relative, parameters "
                   "%.2e\n", task == TRAIN_TASK_MLM ? "MLM" : "classification",
                   opt == NOPAD_TRAIN_LAMB ? "LAMB" : "AdamW", dropout > 0 ? " with dropout" : "",
                   pack ? " on packed lines" : "", p.stream ? " streamed" : "", RANKS, exchange ? "on" : "off",
                   res.n_examples, dl, dw);
            assert_true(dl <= 1e-5);
            assert_true(dw <= 1e-5);
            expect_logged_batches(ref_log, dp_log);
        }
        assert_nopad_ok(comm_barrier(world, NULL));
    }
}

static const char *mlm_data(void) { return corpus(160, 40, 2, 29, 17); }

static void test_mlm_adamw(void **state) {
    (void)state;
    check_against_one("train/bert_mlm", TRAIN_TASK_MLM, NOPAD_TRAIN_ADAMW, mlm_data(), 96, 8, (variant){0});
}

static void test_mlm_lamb(void **state) {
    (void)state;
    check_against_one("train/bert_mlm", TRAIN_TASK_MLM, NOPAD_TRAIN_LAMB, mlm_data(), 96, 8, (variant){0});
}

static void test_classify_adamw(void **state) {
    (void)state;
    check_against_one("train/bert_cls", TRAIN_TASK_CLASSIFY, NOPAD_TRAIN_ADAMW,
                      test_data_path("train/cls_train.jsonl"), 64, 6, (variant){0});
}

/* With dropout and attention dropout at 0.2: a data-parallel run draws one process's masks. */
static void test_mlm_adamw_dropout(void **state) {
    (void)state;
    check_against_one("train/bert_mlm", TRAIN_TASK_MLM, NOPAD_TRAIN_ADAMW, mlm_data(), 96, 8, (variant){.dropout = 0.2f});
}

/* pack_lines: the lines concatenated and cut into pieces of the model's 32 positions, a piece
 * starting in one rank's share and ending in the next ones' where the cut falls so. */
static void test_mlm_packed(void **state) {
    (void)state;
    check_against_one("train/bert_mlm", TRAIN_TASK_MLM, NOPAD_TRAIN_ADAMW, mlm_data(), 96, 8, (variant){.dropout = 0.1f, .pack = 1});
}

/* Streamed in blocks of 64 bytes, 16 a window (a buffer of 1 KiB: about 25 lines a window, so the
 * 5 steps cross windows), each rank reading its blocks of each window; masked LM with dropout,
 * classification with LAMB. */
static void test_streamed(void **state) {
    (void)state;
    check_against_one("train/bert_mlm", TRAIN_TASK_MLM, NOPAD_TRAIN_ADAMW, mlm_data(), 96, 8,
                      (variant){.dropout = 0.1f, .stream_buffer = 1024});
    check_against_one("train/bert_cls", TRAIN_TASK_CLASSIFY, NOPAD_TRAIN_LAMB,
                      test_data_path("train/cls_train.jsonl"), 64, 6, (variant){.stream_buffer = 1024});
}

static void test_classify_lamb_dropout(void **state) {
    (void)state;
    check_against_one("train/bert_cls", TRAIN_TASK_CLASSIFY, NOPAD_TRAIN_LAMB,
                      test_data_path("train/cls_train.jsonl"), 64, 6, (variant){.dropout = 0.2f});
}

/* The run's mean of the most loaded rank's tokens over the mean rank's, as read and after the
 * exchange, from the log rank 0 wrote. */
static void log_balance(const char *log, double *before, double *after) {
    size_t len = 0;
    char *text = test_read_file(log, &len);
    double max_before = 0, max_after = 0, total = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const cJSON *t = cJSON_GetObjectItem(j, "tokens");
        if (t) {
            total += t->valuedouble;
            max_before += cJSON_GetObjectItem(j, "rank_tokens_max_before")->valuedouble;
            max_after += cJSON_GetObjectItem(j, "rank_tokens_max")->valuedouble;
            assert_int_equal(cJSON_GetObjectItem(j, "ranks")->valueint, RANKS);
        }
        cJSON_Delete(j);
    }
    free(text);
    *before = max_before * RANKS / total;
    *after = max_after * RANKS / total;
}

/* Rank 0 reads the long lines: they fill the first 1/N of the file's bytes, at 3.5 times the
 * others' tokens a byte. Batches of 512 tokens a rank, so that a sequence is a few percent of a
 * rank's share. */
static void test_skewed_exchange(void **state) {
    (void)state;
    const int n = 1600;
    /* long lines of ~41 bytes, short ones of ~23 (5 words): n_long·41·(N-1) = (n - n_long)·23 */
    const int n_long = 23 * n / (41 * (RANKS - 1) + 23);
    const char *data = corpus(n, n_long, 2, 8, 23);
    char model[512];
    train_test_model_folder("train/bert_mlm", 1, model);
    nopad_train_params p = params(model, data, TRAIN_TASK_MLM, NOPAD_TRAIN_ADAMW, 512, 64);
    p.on_step = NULL;
    p.epochs = 1;
    double ratio[2][2] = {{0}};
    char dirs[2][512];
    for (int exchange = 0; exchange <= 1; exchange++) {
        shared_dir(dirs[exchange]);
        char log[600];
        snprintf(log, sizeof log, "%s/log.jsonl", dirs[exchange]);
        p.log_path = log;
        nopad_train_result res;
        data_parallel(&p, dirs[exchange], exchange, NULL, &res);
        if (RANK == 0) log_balance(log, &ratio[exchange][0], &ratio[exchange][1]);
    }
    if (RANK == 0) {
        printf("skewed data, %d ranks: the most loaded rank over the mean, %.3f as read, %.3f after "
               "the exchange; parameters equal to the run without it within %.2e\n", RANKS,
               ratio[1][0], ratio[1][1], train_test_max_param_diff(dirs[0], dirs[1], TRAIN_TASK_MLM));
        assert_true(ratio[0][0] > 1.3);
        assert_true(fabs(ratio[0][1] - ratio[0][0]) < 1e-12); /* nothing moves without it */
        assert_true(fabs(ratio[1][0] - ratio[0][0]) < 1e-12); /* the same batches */
        assert_true(ratio[1][1] <= 1.1);
        assert_true(train_test_max_param_diff(dirs[0], dirs[1], TRAIN_TASK_MLM) <= 1e-5);
    }
    assert_nopad_ok(comm_barrier(world, NULL));
}

/* N ranks stop at step 3 (saving); one process resumes from that folder with the global budget
 * to step 6; the N ranks' run to step 6 is the reference. */
static void test_resume_at_one(void **state) {
    (void)state;
    char model[512];
    train_test_model_folder("train/bert_mlm", 1, model);
    const char *data = mlm_data();
    nopad_train_params p = params(model, data, TRAIN_TASK_MLM, NOPAD_TRAIN_LAMB, 96, 8);
    char stopped[512], straight[512], resumed[512];
    shared_dir(stopped);
    shared_dir(straight);
    shared_dir(resumed);
    steps first = {.stop_at = 3}, whole = {.stop_at = 6}, rest = {.stop_at = 6};
    nopad_train_result res;
    data_parallel(&p, stopped, 1, &first, &res);
    assert_int_equal(res.steps, 3);
    data_parallel(&p, straight, 1, &whole, &res);
    assert_int_equal(res.steps, 6);
    if (RANK == 0) {
        nopad_train_params q = p;
        q.batch_tokens *= RANKS;
        q.batch_seqs *= RANKS;
        q.resume_dir = stopped;
        q.output_dir = resumed;
        q.user = &rest;
        assert_nopad_ok(train_run(&q, NULL, 1, &res));
        assert_int_equal(res.resumed_step, 3);
        assert_int_equal(res.steps, 6);
        const double dl = loss_diff(&rest, &whole, 4, 6), dw = train_test_max_param_diff(resumed, straight, TRAIN_TASK_MLM);
        printf("%d ranks stopped at step 3, resumed in one process to step 6: losses within %.2e, "
               "parameters %.2e of the %d ranks' straight run\n", RANKS, dl, dw, RANKS);
        assert_true(dl <= 1e-5);
        assert_true(dw <= 1e-5);
        /* another global budget is refused, naming both */
        q.batch_tokens = p.batch_tokens;
        q.output_dir = resumed;
        assert_int_equal(train_run(&q, NULL, 1, &res), NOPAD_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(nopad_last_error(), "batch_tokens"));
    }
    assert_nopad_ok(comm_barrier(world, NULL));
}

int main(void) {
    if (comm_world(nopad_world_size(), &world) != NOPAD_OK) {
        fprintf(stderr, "mpi_train_dp: %s\n", nopad_last_error());
        return 1;
    }
    RANK = comm_rank(world);
    RANKS = comm_size(world);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlm_adamw),      cmocka_unit_test(test_mlm_lamb),
        cmocka_unit_test(test_classify_adamw), cmocka_unit_test(test_mlm_adamw_dropout),
        cmocka_unit_test(test_classify_lamb_dropout), cmocka_unit_test(test_mlm_packed),
        cmocka_unit_test(test_streamed),
        cmocka_unit_test(test_skewed_exchange),
        cmocka_unit_test(test_resume_at_one),
    };
    const int failed = MPI_RUN_TESTS(tests);
    comm_free(world);
    return failed;
}
