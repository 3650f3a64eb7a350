/* Training checkpoints (src/train/checkpoint.c): resuming is exact, and the saved folder is an
 * inference model. On the tiny BERTs of tests/data/train, with batches from the data loader over a
 * corpus of the 64 ids they know (a WordPiece vocab.txt written here, as in test_train_data.c):
 *   - 3 steps, save, load into a fresh model and context, 2 more steps: the parameters, both Adam
 *     moments, the step count and the last two losses equal those of 5 uninterrupted steps bit for
 *     bit (the CPU float32 step is deterministic; the data loader resumes from the saved seed,
 *     epoch and cursor, the learning rate from the saved schedule, and the steps cross an epoch
 *     boundary); for MLM with AdamW and with LAMB, and for classification;
 *   - nopad_model_load reads the saved folder, and its encoder's hidden states for a batch equal
 *     the training forward's on the saved weights (within 1e-5 row-relative: two code paths of
 *     float32, the same formulas);
 *   - a checkpoint of another task, a missing state or moments file, a malformed state: errors
 *     that name the file and field; the dropout rates read back (0 when a state lacks them), each
 *     in [0, 1);
 *   - the evaluations of a run (history, metric, best) read back exactly, and the weights alone
 *     (a run's best) with the step they are of. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "util/file.h"

enum { N_SPECIAL = 5, VOCAB = 64, N_WORDS = VOCAB - N_SPECIAL, MAX_TOKENS = 96, MAX_SEQS = 8 };

static nopad_tokenizer *make_tokenizer(void) {
    nopad_tokenizer *tok = test_word_tokenizer(N_WORDS);
    return tok;
}

/* 12 examples of 1-20 words: text lines, or JSONL with labels 0-2 (every third with a pair). */
static void load_corpus(const nopad_tokenizer *tok, train_task task, train_dataset *d) {
    char buf[4096];
    size_t len = 0;
    uint64_t s = 99;
    for (int i = 0; i < 12; i++) {
        char text[2][256];
        for (int part = 0; part < 2; part++) {
            size_t n = 0;
            const int words = 1 + (int)(test_rand_u32(&s) % 20);
            for (int w = 0; w < words; w++) {
                char wd[3];
                test_word((int)(test_rand_u32(&s) % N_WORDS), wd);
                n += (size_t)sprintf(text[part] + n, "%s%s", w ? " " : "", wd);
            }
        }
        if (task == TRAIN_TASK_MLM) len += (size_t)sprintf(buf + len, "%s\n", text[0]);
        else if (i % 3 == 0)
            len += (size_t)sprintf(buf + len, "{\"text\": \"%s\", \"text_pair\": \"%s\", \"label\": %d}\n",
                                   text[0], text[1], i % 3);
        else len += (size_t)sprintf(buf + len, "{\"text\": \"%s\", \"label\": %d}\n", text[0], i % 3);
    }
    const char *path = test_write_temp(1, ".txt", buf, len);
    train_data_params p = train_data_default_params();
    p.task = task;
    p.format = task == TRAIN_TASK_MLM ? TRAIN_DATA_LINES : TRAIN_DATA_JSONL;
    p.num_labels = 3;
    p.max_length = 32;
    p.vocab_size = VOCAB;
    p.truncate = 1;
    assert_nopad_ok(train_dataset_load(path, tok, &p, d));
}

typedef struct run {
    train_model m;
    train_context ctx;
    train_loader loader;
    train_state state;
    double losses[8];
} run;

static const char *folder(train_task task) {
    return test_data_path(task == TRAIN_TASK_MLM ? "train/bert_mlm" : "train/bert_cls");
}

static void run_start(nopad_backend *be, const train_dataset *d, train_task task,
                      train_optimizer_kind kind, run *r) {
    memset(r, 0, sizeof *r);
    assert_nopad_ok(train_model_load(be, folder(task), task, &r->m));
    r->state.kind = kind;
    r->state.opt = train_optimizer_defaults();
    r->state.opt.lr = 1e-3f;
    r->state.data_seed = 0x0123456789ABCDEFull; // above 2^53: the seed must survive JSON
    r->state.schedule = train_schedule_defaults();
    r->state.schedule.kind = TRAIN_SCHEDULE_POLYNOMIAL;
    r->state.schedule.lr = 1e-3 / 3; // not a float: the schedule's doubles must survive JSON
    r->state.schedule.warmup_steps = 2;
    r->state.schedule.total_steps = 5;
    r->state.schedule.power = 0.5;
    r->state.epochs = 2;
    r->state.batch_tokens = MAX_TOKENS;
    r->state.batch_seqs = MAX_SEQS;
    assert_nopad_ok(train_context_init(&r->m, MAX_TOKENS, MAX_SEQS, &r->ctx));
    assert_nopad_ok(train_loader_init(d, MAX_TOKENS, MAX_SEQS, r->state.data_seed, &r->loader));
}

/* One step: the next batch (the next epoch's first at an epoch's end), forward, backward, update. */
static void step(run *r) {
    if (!train_loader_next(&r->loader)) {
        assert_nopad_ok(train_loader_seek(&r->loader, r->loader.epoch + 1, 0));
        assert_int_equal(train_loader_next(&r->loader), 1);
    }
    double loss = 0;
    assert_nopad_ok(train_forward_backward(&r->ctx, &r->loader.batch, &loss));
    r->losses[r->m.step] = loss;
    r->state.opt.lr = (float)train_schedule_lr(&r->state.schedule, r->m.step); // as nopad_train
    if (r->state.kind == TRAIN_OPT_ADAMW) assert_nopad_ok(train_adamw_step(&r->m, &r->state.opt));
    else assert_nopad_ok(train_lamb_step(&r->m, &r->state.opt, NULL));
    r->state.epoch = r->loader.epoch;
    r->state.cursor = r->loader.cursor;
}

static void run_free(run *r) {
    train_loader_free(&r->loader);
    train_context_free(&r->ctx);
    train_model_free(&r->m);
}

static float *download(const train_model *m, const float *buf) {
    float *host = malloc((size_t)m->n_params * sizeof *host);
    assert_non_null(host);
    assert_nopad_ok(m->be->download_f32(m->be, host, buf, (size_t)m->n_params));
    return host;
}

static void assert_same_buffer(const train_model *a, const float *ba, const train_model *b,
                               const float *bb, const char *what) {
    float *x = download(a, ba), *y = download(b, bb);
    if (memcmp(x, y, (size_t)a->n_params * sizeof *x) != 0) {
        for (int32_t i = 0; i < a->n_tensors; i++) {
            const train_tensor *t = &a->tensors[i];
            if (memcmp(x + t->offset, y + t->offset, (size_t)(t->rows * t->cols) * sizeof *x))
                fail_msg("%s of '%s' differ after resuming", what, t->name);
        }
    }
    free(x), free(y);
}

/* The saved folder as an inference model: hidden states of the batch the resumed run is on. */
static void check_inference(const char *dir, run *r) {
    nopad_model *model = NULL;
    nopad_model_params mp = nopad_model_default_params();
    assert_nopad_ok(nopad_model_load(dir, &mp, &model));
    const train_batch *b = &r->loader.batch;
    const int32_t T = b->cu_seqlens[b->n_seqs], H = r->m.cfg.hidden_size, L = r->m.cfg.num_layers;
    float *got = malloc((size_t)T * H * sizeof(float)), *want = malloc((size_t)T * H * sizeof(float));
    nopad_encode_params ep = nopad_encode_default_params();
    ep.pooling = NOPAD_POOLING_NONE;
    assert_nopad_ok(nopad_encode_packed(model, b->n_seqs, b->cu_seqlens, b->tokens, b->types, &ep,
                                        got, NULL));
    // the training forward of this batch ran on the saved weights: its last hidden states
    assert_nopad_ok(r->m.be->download_f32(r->m.be, want, (const float *)r->ctx.hidden + (size_t)L * T * H,
                                          (size_t)T * H));
    const double err = test_max_row_rel_error(got, want, T, H);
    print_message("saved folder as an inference model: hidden states within %.2e\n", err);
    assert_true(err < 1e-5);
    free(got), free(want);
    nopad_model_free(model);
}

static void resume_case(train_task task, train_optimizer_kind kind) {
    nopad_tokenizer *tok = make_tokenizer();
    train_dataset d;
    load_corpus(tok, task, &d);
    nopad_backend *be = NULL;
    assert_nopad_ok(nopad_backend_cpu_create(2, &be));

    run full;
    run_start(be, &d, task, kind, &full);
    for (int i = 0; i < 5; i++) step(&full);
    assert_true(full.loader.epoch >= 1); // the steps crossed an epoch boundary

    run first;
    run_start(be, &d, task, kind, &first);
    for (int i = 0; i < 3; i++) step(&first);
    const char *dir = test_make_temp_dir(2);
    char sub[600];
    snprintf(sub, sizeof sub, "%s/step3", dir); // created by the save
    assert_nopad_ok(train_checkpoint_save(&first.m, &first.state, sub, NULL));
    const train_state saved = first.state;
    run_free(&first);

    run resumed;
    memset(&resumed, 0, sizeof resumed);
    assert_nopad_ok(train_checkpoint_load(be, sub, task, &resumed.m, &resumed.state));
    assert_int_equal(resumed.m.step, 3);
    assert_int_equal(resumed.state.kind, kind);
    assert_memory_equal(&resumed.state.opt, &saved.opt, sizeof saved.opt);
    const train_schedule *a = &resumed.state.schedule, *b = &saved.schedule; // (padding differs)
    assert_true(a->kind == b->kind && a->lr == b->lr && a->warmup_steps == b->warmup_steps &&
                a->total_steps == b->total_steps && a->lr_end == b->lr_end && a->power == b->power);
    assert_int_equal(resumed.state.epochs, saved.epochs);
    assert_int_equal(resumed.state.batch_tokens, saved.batch_tokens);
    assert_int_equal(resumed.state.batch_seqs, saved.batch_seqs);
    assert_true(resumed.state.data_seed == saved.data_seed);
    assert_int_equal(resumed.state.epoch, saved.epoch);
    assert_int_equal(resumed.state.cursor, saved.cursor);
    assert_nopad_ok(train_context_init(&resumed.m, MAX_TOKENS, MAX_SEQS, &resumed.ctx));
    assert_nopad_ok(train_loader_init(&d, MAX_TOKENS, MAX_SEQS, resumed.state.data_seed,
                                      &resumed.loader));
    assert_nopad_ok(train_loader_seek(&resumed.loader, resumed.state.epoch, resumed.state.cursor));
    step(&resumed);
    check_inference(sub, &resumed);
    step(&resumed);

    assert_int_equal(resumed.m.step, 5);
    assert_true(resumed.losses[3] == full.losses[3] && resumed.losses[4] == full.losses[4]);
    assert_same_buffer(&full.m, full.m.params, &resumed.m, resumed.m.params, "parameters");
    assert_same_buffer(&full.m, full.m.adam_m, &resumed.m, resumed.m.adam_m, "first moments");
    assert_same_buffer(&full.m, full.m.adam_v, &resumed.m, resumed.m.adam_v, "second moments");
    run_free(&resumed);
    run_free(&full);
    be->destroy(be);
    train_dataset_free(&d);
    nopad_tokenizer_free(tok);
}

static void test_resume_mlm_adamw(void **state) {
    (void)state;
    resume_case(TRAIN_TASK_MLM, TRAIN_OPT_ADAMW);
}
static void test_resume_mlm_lamb(void **state) {
    (void)state;
    resume_case(TRAIN_TASK_MLM, TRAIN_OPT_LAMB);
}
static void test_resume_classify(void **state) {
    (void)state;
    resume_case(TRAIN_TASK_CLASSIFY, TRAIN_OPT_ADAMW);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_errors(void **state) {
    (void)state;
    nopad_backend *be = NULL;
    assert_nopad_ok(nopad_backend_cpu_create(2, &be));
    train_model m;
    assert_nopad_ok(train_model_load(be, folder(TRAIN_TASK_CLASSIFY), TRAIN_TASK_CLASSIFY, &m));
    train_state s = {.kind = TRAIN_OPT_LAMB, .opt = train_optimizer_defaults(),
                     .schedule = train_schedule_defaults(), .data_seed = 1, .dropout = 0.1f,
                     .attention_dropout = 0.2f};
    m.step = 2; // the step the states written below give: the weights and moments record it too
    const char *dir = test_make_temp_dir(3);
    assert_nopad_ok(train_checkpoint_save(&m, &s, dir, NULL));
    train_model_free(&m);
    train_model out;
    train_state got;
    // a classification checkpoint is not an MLM one: said so before the weights are read
    assert_nopad_error(train_checkpoint_load(be, dir, TRAIN_TASK_MLM, &out, &got),
                       NOPAD_ERR_INVALID_ARGUMENT, "of task \"classify\", not \"mlm\"");
    assert_nopad_ok(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &out, &got));
    assert_int_equal(out.num_labels, 3);
    assert_int_equal(got.kind, TRAIN_OPT_LAMB);
    assert_true(got.dropout == 0.1f && got.attention_dropout == 0.2f); // the rates read back
    train_model_free(&out);

    const char *good = "{\"format\": \"nopad-train-2\", \"task\": \"classify\", \"num_labels\": 3, "
                       "\"step\": 2, \"optimizer\": {\"name\": \"lamb\", \"lr\": 1, \"beta1\": 0.9, "
                       "\"beta2\": 0.99, \"eps\": 1e-6, \"weight_decay\": 0, \"max_grad_norm\": 1}, "
                       "\"schedule\": {\"kind\": \"linear\", \"lr\": 5e-5, \"warmup_steps\": 3, "
                       "\"total_steps\": 30, \"lr_end\": 1e-7, \"power\": 1}, "
                       "\"data\": {\"seed\": \"18446744073709551615\", \"epoch\": 4, \"cursor\": 5, "
                       "\"epochs\": 6, \"batch_tokens\": 96, \"batch_seqs\": 8}}";
    write_text(dir, "trainer_state.json", good);
    assert_nopad_ok(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &out, &got));
    assert_int_equal(out.step, 2);
    assert_true(got.data_seed == UINT64_MAX && got.epoch == 4 && got.cursor == 5);
    assert_true(got.epochs == 6 && got.batch_tokens == 96 && got.batch_seqs == 8);
    assert_true(got.window == 0 && got.stream_buffer == 0); // a -2 state held its data in memory
    assert_true(got.dropout == 0 && got.attention_dropout == 0); // older states: trained without
    train_model_free(&out);
    { // the dropout rates: read back, each in [0, 1)
        static const struct { const char *rates, *needle; } cases[] = {
            {"\"dropout\": 0.1, \"attention_dropout\": 0.25, ", NULL},
            {"\"attention_dropout\": 1, ", "\"attention_dropout\" 1 is outside [0, 1)"},
            {"\"attention_dropout\": -0.5, ", "\"attention_dropout\" -0.5 is outside [0, 1)"},
            {"\"attention_dropout\": \"0.1\", ", "\"attention_dropout\" has the wrong JSON type"},
            {"\"dropout\": 1, ", "\"dropout\" 1 is outside [0, 1)"},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            char text[1024];
            const char *at = strstr(good, "\"schedule\"");
            snprintf(text, sizeof text, "%.*s%s%s", (int)(at - good), good, cases[i].rates, at);
            write_text(dir, "trainer_state.json", text);
            if (!cases[i].needle) {
                assert_nopad_ok(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &out, &got));
                assert_true(got.dropout == 0.1f && got.attention_dropout == 0.25f);
                train_model_free(&out);
            } else {
                assert_nopad_error(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &out, &got),
                                   NOPAD_ERR_FORMAT, cases[i].needle);
            }
        }
    }
    { // -3: a streamed run's window and buffer
        char text[1024];
        const char *at = strstr(good, "\"cursor\": 5");
        snprintf(text, sizeof text, "%.*s\"window\": 7, \"stream_buffer\": 65536, %s",
                 (int)(at - good), good, at);
        memcpy(strstr(text, "nopad-train-2"), "nopad-train-3", 13);
        write_text(dir, "trainer_state.json", text);
        assert_nopad_ok(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &out, &got));
        assert_true(got.window == 7 && got.stream_buffer == 65536 && got.cursor == 5);
        train_model_free(&out);
        memcpy(strstr(text, "65536"), "-6553", 5);
        write_text(dir, "trainer_state.json", text);
        assert_nopad_error(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &out, &got),
                           NOPAD_ERR_FORMAT, "\"stream_buffer\" is -6553");
        write_text(dir, "trainer_state.json", good);
        assert_nopad_ok(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &out, &got));
    }
    assert_true(got.schedule.kind == TRAIN_SCHEDULE_LINEAR && got.schedule.lr == 5e-5 &&
                got.schedule.warmup_steps == 3 && got.schedule.total_steps == 30 &&
                got.schedule.lr_end == 1e-7 && got.schedule.power == 1);
    train_model_free(&out);
    static const struct { const char *from, *to; nopad_status st; const char *needle; } bad[] = {
        {"\"step\": 2", "\"step\": \"2\"", NOPAD_ERR_FORMAT, "field \"step\" has the wrong JSON type"},
        {"\"step\": 2", "\"step\": -1", NOPAD_ERR_FORMAT, "\"step\" is -1"},
        {"\"step\": 2, ", "", NOPAD_ERR_FORMAT, "no \"step\" field"},
        {"\"task\": \"classify\"", "\"task\": \"mlm\"", NOPAD_ERR_INVALID_ARGUMENT, "task \"mlm\""},
        {"\"num_labels\": 3", "\"num_labels\": 2", NOPAD_ERR_FORMAT, "num_labels 2"},
        {"\"lamb\"", "\"sgd\"", NOPAD_ERR_UNSUPPORTED, "optimizer \"sgd\""},
        {"nopad-train-2", "nopad-train-1", NOPAD_ERR_UNSUPPORTED, "format \"nopad-train-1\""},
        {"\"linear\"", "\"cosine\"", NOPAD_ERR_UNSUPPORTED, "schedule \"cosine\""},
        {"\"total_steps\": 30, ", "", NOPAD_ERR_FORMAT, "no \"total_steps\" field"},
        {"\"warmup_steps\": 3", "\"warmup_steps\": 2.5", NOPAD_ERR_FORMAT, "\"warmup_steps\" is 2.5"},
        {"\"lr\": 5e-5", "\"lr\": -5e-5", NOPAD_ERR_FORMAT, "schedule learning rates"},
        {"\"batch_seqs\": 8", "\"batch_seqs\": \"8\"", NOPAD_ERR_FORMAT, "\"batch_seqs\" has the wrong"},
        {"\"schedule\": {", "\"schedule_\": {", NOPAD_ERR_FORMAT, "no \"schedule\" field"},
        {"\"18446744073709551615\"", "\"-3\"", NOPAD_ERR_FORMAT, "data seed \"-3\""},
        {"\"18446744073709551615\"", "\"18446744073709551616\"", NOPAD_ERR_FORMAT, "data seed"},
        {"\"cursor\": 5", "\"cursor\": 0.5", NOPAD_ERR_FORMAT, "\"cursor\" is 0.5"},
        {"\"eps\": 1e-6", "\"eps\": null", NOPAD_ERR_FORMAT, "\"eps\" has the wrong JSON type"},
        {"{\"format\"", "[{\"format\"", NOPAD_ERR_FORMAT, "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[1024];
        const char *at = strstr(good, bad[i].from);
        assert_non_null(at);
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - good), good, bad[i].to,
                 at + strlen(bad[i].from));
        write_text(dir, "trainer_state.json", text);
        assert_nopad_error(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &out, &got), bad[i].st,
                           bad[i].needle);
        assert_nopad_error(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &out, &got), bad[i].st,
                           "trainer_state.json");
    }
    char path[700];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    assert_int_equal(unlink(path), 0);
    assert_nopad_error(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &out, &got), NOPAD_ERR_IO,
                       "trainer_state.json");
    write_text(dir, "trainer_state.json", good);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    assert_int_equal(unlink(path), 0);
    assert_nopad_error(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &out, &got), NOPAD_ERR_IO,
                       "optimizer.safetensors");
    // a save into a folder whose parent is missing
    assert_nopad_ok(train_model_load(be, folder(TRAIN_TASK_CLASSIFY), TRAIN_TASK_CLASSIFY, &m));
    assert_nopad_error(train_checkpoint_save(&m, &s, "/nonexistent/a/b", NULL), NOPAD_ERR_IO, "/nonexistent/a/b");
    train_model_free(&m);
    be->destroy(be);
}

/* A model trained from a bare encoder (its table's names without "bert.", as train_model_load
 * gives them for a BertModel folder) is saved under HF's task-model names, moments included, and
 * loads back. */
static void test_bare_encoder_names(void **state) {
    (void)state;
    nopad_backend *be = NULL;
    assert_nopad_ok(nopad_backend_cpu_create(2, &be));
    train_model m;
    assert_nopad_ok(train_model_load(be, folder(TRAIN_TASK_MLM), TRAIN_TASK_MLM, &m));
    assert_string_equal(m.prefix, "bert.");
    for (int32_t i = 0; i < m.n_tensors; i++) {
        char *name = m.tensors[i].name;
        if (!strncmp(name, "bert.", 5)) memmove(name, name + 5, strlen(name + 5) + 1);
    }
    m.prefix[0] = 0;
    train_state s = {.kind = TRAIN_OPT_ADAMW, .opt = train_optimizer_defaults(),
                     .schedule = train_schedule_defaults(), .data_seed = 3};
    const char *dir = test_make_temp_dir(4);
    assert_nopad_ok(train_checkpoint_save(&m, &s, dir, NULL));
    char path[700];
    static const char *const want[] = {"bert.embeddings.word_embeddings.weight",
                                       "bert.encoder.layer.1.output.LayerNorm.bias",
                                       "cls.predictions.bias"};
    static const char *const files[] = {"model.safetensors", "optimizer.safetensors"};
    static const char *const kinds[] = {"", "exp_avg.", "exp_avg_sq."};
    for (int f = 0; f < 2; f++) {
        safetensors_file st;
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        assert_nopad_ok(safetensors_open(path, &st));
        assert_int_equal(st.n_tensors, (f + 1) * m.n_tensors);
        for (int k = f ? 1 : 0; k < (f ? 3 : 1); k++)
            for (int i = 0; i < 3; i++) {
                char name[160];
                snprintf(name, sizeof name, "%s%s", kinds[k], want[i]);
                if (!safetensors_find(&st, name)) fail_msg("%s has no '%s'", path, name);
            }
        assert_null(safetensors_find(&st, "embeddings.word_embeddings.weight"));
        safetensors_close(&st);
    }
    train_model back;
    train_state got;
    assert_nopad_ok(train_checkpoint_load(be, dir, TRAIN_TASK_MLM, &back, &got));
    assert_string_equal(back.prefix, "bert.");
    assert_same_buffer(&m, m.params, &back, back.params, "parameters");
    train_model_free(&back);
    train_model_free(&m);
    be->destroy(be);
}

/* A text file's contents (the test's own files: small). */
static char *slurp(const char *dir, const char *name) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

/* The evaluations of a run: the history and its metric read back exactly, the best by each
 * metric (a tie keeps the earlier step), the weights alone with eval_results.json naming their
 * step, a -3 state (no history), and each malformed history an error naming the field. */
static void test_evaluations(void **state) {
    (void)state;
    nopad_backend *be = NULL;
    assert_nopad_ok(nopad_backend_cpu_create(2, &be));
    train_model m;
    assert_nopad_ok(train_model_load(be, folder(TRAIN_TASK_CLASSIFY), TRAIN_TASK_CLASSIFY, &m));
    m.step = 12;
    train_state s = {.kind = TRAIN_OPT_ADAMW, .opt = train_optimizer_defaults(),
                     .schedule = train_schedule_defaults(), .data_seed = 5,
                     .metric = TRAIN_METRIC_ACCURACY};
    s.schedule.lr = 0.1 + 0.2; // 17 digits: the schedule's doubles read back exactly too
    assert_int_equal(train_state_best(&s), -1);
    /* doubles that need 17 digits; accuracy ties at steps 6 and 9, the lowest loss last */
    const train_eval evals[] = {
        {.step = 3, .epoch = 0, .examples = 8, .loss = 1.0 / 3.0, .accuracy = 0.5},
        {.step = 6, .epoch = 1, .examples = 8, .loss = 0.1 + 0.2, .accuracy = 0.75},
        {.step = 9, .epoch = 2, .examples = 8, .loss = 0.3, .accuracy = 0.75},
        {.step = 12, .epoch = 3, .examples = 8, .loss = 2.0 / 7.0, .accuracy = 0.625},
    };
    for (int i = 0; i < 4; i++) assert_nopad_ok(train_state_add_eval(&s, &evals[i]));
    assert_nopad_error(train_state_add_eval(&s, &evals[3]), NOPAD_ERR_INVALID_ARGUMENT,
                       "at step 12 after one at step 12");
    assert_int_equal(train_state_best(&s), 1);
    /* early stopping's count: since the best (accuracy 0.75 at 6, tied at 9), or since the last
     * improvement by more than 0.2 (none after the first), or 0.25 - 1e-9 (6 counts) */
    assert_int_equal(train_state_stale(&s, 0), 2);
    assert_int_equal(train_state_stale(&s, 0.2), 2);
    assert_int_equal(train_state_stale(&s, 0.25), 3);
    assert_int_equal(train_state_stale(&s, 0.25 - 1e-9), 2);
    s.metric = TRAIN_METRIC_LOSS;
    assert_int_equal(train_state_best(&s), 3);
    /* losses 0.3333, 0.30000000000000004, 0.3, 0.2857: each one an improvement; by more than
     * 0.04 only the last against the first (0.0476); by more than 0.05 none */
    assert_int_equal(train_state_stale(&s, 0), 0);
    assert_int_equal(train_state_stale(&s, 0.04), 0);
    assert_int_equal(train_state_stale(&s, 0.05), 3);
    s.metric = TRAIN_METRIC_ACCURACY;
    const char *dir = test_make_temp_dir(5);
    assert_nopad_ok(train_checkpoint_save(&m, &s, dir, NULL));
    train_model back;
    train_state got;
    assert_nopad_ok(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &back, &got));
    train_model_free(&back);
    assert_int_equal(got.metric, TRAIN_METRIC_ACCURACY);
    assert_int_equal(got.n_evals, 4);
    for (int i = 0; i < 4; i++) {
        const train_eval *a = &evals[i], *b = &got.evals[i];
        assert_true(a->step == b->step && a->epoch == b->epoch && a->examples == b->examples);
        assert_true(a->loss == b->loss && a->accuracy == b->accuracy); // bit for bit
    }
    assert_int_equal(train_state_best(&got), 1);
    assert_true(got.schedule.lr == 0.1 + 0.2);
    train_state_free(&got);
    assert_null(got.evals);
    const char *text = slurp(dir, "trainer_state.json");
    assert_non_null(strstr(text, "\"format\":\t\"nopad-train-5\""));
    assert_non_null(strstr(text, "\"best\":\t{\n\t\t\"metric\":\t\"accuracy\",\n\t\t\"step\":\t6,"));

    /* the weights alone: the checkpoint's model.safetensors, and the step beside them */
    char best[700];
    snprintf(best, sizeof best, "%s/best", dir);
    assert_nopad_ok(train_checkpoint_save_weights(&m, &evals[1], TRAIN_METRIC_ACCURACY, best, NULL));
    int64_t step = 0;
    assert_nopad_ok(train_checkpoint_weights_step(best, &step));
    assert_int_equal(step, 6);
    {
        char a[1400], b[1400];
        snprintf(a, sizeof a, "%s/model.safetensors", dir);
        snprintf(b, sizeof b, "%s/model.safetensors", best);
        FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
        assert_true(fa && fb);
        int ca, cb;
        size_t n = 0;
        do {
            ca = fgetc(fa), cb = fgetc(fb), n++;
        } while (ca == cb && ca != EOF);
        fclose(fa), fclose(fb);
        assert_int_equal(ca, cb);
        assert_true(n > 1000);
        snprintf(a, sizeof a, "%s/optimizer.safetensors", best);
        assert_int_equal(access(a, F_OK), -1);
    }
    assert_non_null(strstr(slurp(best, "eval_results.json"), "\"metric\":\t\"accuracy\""));
    assert_nopad_ok(train_model_load(be, best, TRAIN_TASK_CLASSIFY, &back)); // a model folder
    train_model_free(&back);
    assert_nopad_error(train_checkpoint_weights_step(dir, &step), NOPAD_ERR_IO, "eval_results.json");

    /* a -3 state has no history */
    char good[1 << 16];
    snprintf(good, sizeof good, "%s", slurp(dir, "trainer_state.json"));
    {
        char old[1 << 16];
        const char *at = strstr(good, ",\n\t\"eval_metric\"");
        assert_non_null(at);
        snprintf(old, sizeof old, "%.*s\n}\n", (int)(at - good), good);
        memcpy(strstr(old, "nopad-train-5"), "nopad-train-3", 13);
        write_text(dir, "trainer_state.json", old);
        assert_nopad_ok(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &back, &got));
        train_model_free(&back);
        assert_int_equal(got.metric, TRAIN_METRIC_NONE);
        assert_int_equal(got.n_evals, 0);
    }
    static const struct { const char *from, *to; const char *needle; } bad[] = {
        {"\"eval_metric\":\t\"accuracy\"", "\"eval_metric\":\t\"f1\"", "eval_metric \"f1\""},
        {"\"evaluations\":\t[", "\"evaluations_\":\t[", "no \"evaluations\" field"},
        {"\"step\":\t3,", "\"step\":\t7,", "an evaluation at step 6 after one at step 7"},
        {"\"step\":\t12,\n\t\t\t\"epoch\"", "\"step\":\t13,\n\t\t\t\"epoch\"",
         "an evaluation at step 13, past the checkpoint's step 12"},
        {"\"eval_accuracy\":\t0.5,", "\"eval_accuracy\":\t1.5,", "eval_accuracy 1.5 is outside"},
        {"\"eval_accuracy\":\t0.5,", "", "evaluation 1 has no \"eval_accuracy\""},
        {"\"eval_loss\":\t0.3,", "\"eval_loss\":\t-0.3,", "eval_loss -0.3 is negative"},
        {"\"step\":\t3,", "\"step\":\t0,", "\"step\" is 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char edited[1 << 16];
        const char *at = strstr(good, bad[i].from);
        if (!at) fail_msg("no '%s' in %s", bad[i].from, good);
        snprintf(edited, sizeof edited, "%.*s%s%s", (int)(at - good), good, bad[i].to,
                 at + strlen(bad[i].from));
        write_text(dir, "trainer_state.json", edited);
        assert_nopad_error(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &back, &got),
                           NOPAD_ERR_FORMAT, bad[i].needle);
    }
    train_state_free(&s);
    train_model_free(&m);
    be->destroy(be);
}


/* A save is written whole (util/file.h's staging folder): a save that fails between files, or
 * one cut short (a kill leaves the staging folder), leaves the previous checkpoint as it was and
 * loadable; the next save removes the leftover, keeps what else the folder holds (best/, the
 * user's files) and writes the new step; two renames cut between (file systems without
 * RENAME_EXCHANGE) are completed; and a folder of files from two saves (each file records its
 * step) is refused, naming both steps. */
static void test_interrupted_save(void **state) {
    (void)state;
    nopad_backend *be = NULL;
    assert_nopad_ok(nopad_backend_cpu_create(2, &be));
    train_model m;
    assert_nopad_ok(train_model_load(be, folder(TRAIN_TASK_CLASSIFY), TRAIN_TASK_CLASSIFY, &m));
    train_state s = {.kind = TRAIN_OPT_ADAMW, .opt = train_optimizer_defaults(),
                     .schedule = train_schedule_defaults(), .data_seed = 7};
    const char *root = test_make_temp_dir(6);
    char dir[700], stage[800], path[2048], other[700], bad_tok[700];
    snprintf(dir, sizeof dir, "%s/ckpt", root);
    snprintf(stage, sizeof stage, "%s/.ckpt.nopad-partial", root);
    m.step = 3;
    assert_nopad_ok(train_checkpoint_save(&m, &s, dir, NULL));
    write_text(dir, "notes.txt", "the user's");
    snprintf(path, sizeof path, "%s/best", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    write_text(path, "eval_results.json", "{\"step\": 3}");

    /* a save failing after the weights, moments and state are written: tokenizer_from holds a
     * folder where vocab.txt should be */
    snprintf(bad_tok, sizeof bad_tok, "%s/bad_tok", root);
    assert_int_equal(mkdir(bad_tok, 0755), 0);
    snprintf(path, sizeof path, "%s/vocab.txt", bad_tok);
    assert_int_equal(mkdir(path, 0755), 0);
    m.step = 4;
    assert_nopad_error(train_checkpoint_save(&m, &s, dir, bad_tok), NOPAD_ERR_IO, "vocab.txt");
    assert_int_equal(access(stage, F_OK), -1); // the failed save's staging folder is gone
    train_model back;
    train_state got;
    assert_nopad_ok(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &back, &got));
    assert_int_equal(back.step, 3);
    train_model_free(&back);
    train_state_free(&got);

    /* a save cut short by a kill: its staging folder holds some files of step 4 */
    assert_int_equal(mkdir(stage, 0755), 0);
    snprintf(other, sizeof other, "%s/step4", root);
    assert_nopad_ok(train_checkpoint_save(&m, &s, other, NULL));
    snprintf(path, sizeof path, "cp %s/model.safetensors %s/", other, stage);
    assert_int_equal(system(path), 0);
    assert_nopad_ok(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &back, &got));
    assert_int_equal(back.step, 3);
    train_model_free(&back);
    train_state_free(&got);
    /* the next save: the leftover gone, the folder's other files kept, step 5 whole */
    m.step = 5;
    assert_nopad_ok(train_checkpoint_save(&m, &s, dir, NULL));
    assert_int_equal(access(stage, F_OK), -1);
    assert_string_equal(slurp(dir, "notes.txt"), "the user's");
    assert_string_equal(slurp(dir, "best/eval_results.json"), "{\"step\": 3}");
    assert_nopad_ok(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &back, &got));
    assert_int_equal(back.step, 5);
    train_model_free(&back);
    train_state_free(&got);

    /* cut between the two renames of a swap without RENAME_EXCHANGE: the folder moved aside,
     * the whole new one still staged; and cut before the staging folder was complete */
    char old[800];
    snprintf(old, sizeof old, "%s/.ckpt.nopad-old", root);
    assert_int_equal(rename(dir, old), 0);
    snprintf(path, sizeof path, "cp -r %s %s", other, stage);
    assert_int_equal(system(path), 0);
    assert_nopad_ok(folder_stage_recover(dir));
    assert_int_equal(access(stage, F_OK), -1);
    assert_int_equal(access(old, F_OK), -1);
    assert_nopad_ok(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &back, &got));
    assert_int_equal(back.step, 4);
    train_model_free(&back);
    train_state_free(&got);
    assert_int_equal(rename(dir, old), 0);
    assert_nopad_ok(folder_stage_recover(dir));
    assert_nopad_ok(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &back, &got));
    assert_int_equal(back.step, 4);
    train_model_free(&back);
    train_state_free(&got);

    /* files of two saves in one folder: step 4's state beside step 5's weights, or moments */
    m.step = 5;
    assert_nopad_ok(train_checkpoint_save(&m, &s, dir, NULL));
    snprintf(path, sizeof path, "cp %s/trainer_state.json %s/", other, dir);
    assert_int_equal(system(path), 0);
    assert_nopad_error(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &back, &got), NOPAD_ERR_FORMAT,
                       "a mix of saves: trainer_state.json is of step 4, model.safetensors of step 5");
    snprintf(path, sizeof path, "cp %s/model.safetensors %s/", other, dir);
    assert_int_equal(system(path), 0);
    assert_nopad_error(train_checkpoint_load(be, dir, TRAIN_TASK_CLASSIFY, &back, &got), NOPAD_ERR_FORMAT,
                       "trainer_state.json is of step 4, optimizer.safetensors of step 5");
    /* a folder given through a symbolic link: the link stays, the folder it leads to is saved */
    char link_path[800];
    snprintf(link_path, sizeof link_path, "%s/link", root);
    assert_int_equal(symlink(other, link_path), 0);
    m.step = 6;
    assert_nopad_ok(train_checkpoint_save(&m, &s, link_path, NULL));
    struct stat sb;
    assert_int_equal(lstat(link_path, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    assert_nopad_ok(train_checkpoint_load(be, other, TRAIN_TASK_CLASSIFY, &back, &got));
    assert_int_equal(back.step, 6);
    train_model_free(&back);
    train_state_free(&got);
    train_model_free(&m);
    be->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_mlm_adamw), cmocka_unit_test(test_resume_mlm_lamb),
        cmocka_unit_test(test_resume_classify),  cmocka_unit_test(test_errors),
        cmocka_unit_test(test_bare_encoder_names), cmocka_unit_test(test_evaluations),
        cmocka_unit_test(test_interrupted_save),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
