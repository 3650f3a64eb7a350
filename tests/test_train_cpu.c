/* Padding-free training on the CPU against PyTorch (fixtures by scripts/make_train_fixtures.py:
 * a tiny BERT, a packed batch of 4 sequences, one step of HF BertForMaskedLM and
 * BertForSequenceClassification in float64, dropout off). Bounds, both sides computing the same
 * formulas (nopad in float32 with double accumulators, the fixture in float64):
 *   loss within 1e-5 relative; every parameter's gradient within 1e-4 row-relative (rows of a
 *   matrix, a vector as one row) — the observed errors are ~1e-6, float32 rounding through two
 *   layers; parameters after two AdamW and two LAMB steps within 1e-5 absolute (parameters are
 *   O(0.1 .. 1), one step moves them by ~1e-3).
 * The optimiser checks start from the fixture's gradients, not from ours: Adam's first step is
 * m̂ / √v̂ ≈ sign(g), so on near-zero gradients a float32 gradient error would show as a whole
 * step, and would test the gradients a second time rather than the optimiser. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "golden.h"
#include "train/train.h"

static const double LOSS_BOUND = 1e-5, GRAD_BOUND = 1e-4, PARAM_BOUND = 1e-5;

/* As scripts/make_train_fixtures.py's OPT. */
static train_optimizer fixture_optimizer(void) {
    train_optimizer o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f,
                         .weight_decay = 0.01f, .max_grad_norm = 1.0f};
    return o;
}
static const float STEP2_GRAD_SCALE = -2.0f;

typedef struct fixture {
    safetensors_file file;
    int32_t *ids, *types, *cu, *positions, *mlm_labels, *labels;
    float *targets;
    int32_t n_seqs, n_tokens, n_masked;
    double loss;
} fixture;

static void fixture_load(const char *name, fixture *f) {
    char rel[128];
    snprintf(rel, sizeof rel, "train/%s_step.safetensors", name);
    memset(f, 0, sizeof *f);
    assert_nopad_ok(safetensors_open(test_data_path(rel), &f->file));
    int64_t n_tok, n_cu, n_masked;
    f->ids = golden_copy(&f->file, "input_ids", ST_I32, &n_tok);
    f->types = golden_copy(&f->file, "token_type_ids", ST_I32, NULL);
    f->cu = golden_copy(&f->file, "cu_seqlens", ST_I32, &n_cu);
    double *loss = golden_copy(&f->file, "loss", ST_F64, NULL);
    f->loss = loss[0];
    free(loss);
    f->n_seqs = (int32_t)n_cu - 1;
    f->n_tokens = (int32_t)n_tok;
    if (golden_has(&f->file, "mlm_positions")) {
        f->positions = golden_copy(&f->file, "mlm_positions", ST_I32, &n_masked);
        f->mlm_labels = golden_copy(&f->file, "mlm_labels", ST_I32, NULL);
        f->n_masked = (int32_t)n_masked;
    }
    if (golden_has(&f->file, "labels")) f->labels = golden_copy(&f->file, "labels", ST_I32, NULL);
    if (golden_has(&f->file, "targets")) f->targets = golden_copy(&f->file, "targets", ST_F32, NULL);
}

static void fixture_free(fixture *f) {
    free(f->ids), free(f->types), free(f->cu), free(f->positions), free(f->mlm_labels);
    free(f->labels), free(f->targets);
    safetensors_close(&f->file);
}

static train_batch fixture_batch(const fixture *f) {
    train_batch b = {.n_seqs = f->n_seqs, .cu_seqlens = f->cu, .tokens = f->ids, .types = f->types,
                     .n_masked = f->n_masked, .mlm_positions = f->positions,
                     .mlm_labels = f->mlm_labels, .labels = f->labels, .targets = f->targets};
    return b;
}

static nopad_backend *cpu(void) {
    nopad_backend *be = NULL;
    assert_nopad_ok(nopad_backend_cpu_create(2, &be));
    return be;
}

static void load(nopad_backend *be, const char *folder, train_task task, train_model *m) {
    char rel[128];
    snprintf(rel, sizeof rel, "train/%s", folder);
    assert_nopad_ok(train_model_load(be, test_data_path(rel), task, m));
}

/* The fixture's float32 tensor `prefix` + name, checked to have the tensor's element count. */
static float *fixture_tensor(const fixture *f, const char *prefix, const train_tensor *t) {
    char key[160];
    snprintf(key, sizeof key, "%s%s", prefix, t->name);
    int64_t n;
    float *x = golden_copy(&f->file, key, ST_F32, &n);
    assert_int_equal(n, t->rows * t->cols);
    return x;
}

/* Every gradient of m against the fixture's grad.<name>. */
static void expect_gradients(const char *what, const train_model *m, const fixture *f) {
    double worst = 0;
    const char *worst_name = "";
    int checked = 0;
    for (int32_t i = 0; i < m->n_tensors; i++) {
        const train_tensor *t = &m->tensors[i];
        float *want = fixture_tensor(f, "grad.", t);
        const float *got = m->grads + t->offset;
        const int64_t rows = t->cols == 1 ? 1 : t->rows, cols = t->cols == 1 ? t->rows : t->cols;
        if (strstr(t->name, "key.bias")) {
            /* Zero in exact arithmetic (a key bias shifts every score of a query row by q·b, which
             * softmax ignores): both sides hold rounding noise, so bound it by the value bias's
             * gradient instead of comparing noise with noise. */
            char value[96];
            snprintf(value, sizeof value, "%.*svalue.bias", (int)(strstr(t->name, "key.bias") - t->name), t->name);
            const train_tensor *v = train_model_find(m, value);
            assert_non_null(v);
            double got_sq = 0, v_sq = 0;
            for (int64_t k = 0; k < t->rows; k++) {
                got_sq += (double)got[k] * got[k];
                v_sq += (double)m->grads[v->offset + k] * m->grads[v->offset + k];
            }
            if (!(sqrt(got_sq) <= GRAD_BOUND * sqrt(v_sq)))
                fail_msg("%s: %s gradient norm %.3e, not ~0 against the value bias's %.3e", what,
                         t->name, sqrt(got_sq), sqrt(v_sq));
        } else {
            const double err = test_max_row_rel_error(got, want, rows, cols);
            if (!(err <= worst)) worst = isnan(err) ? INFINITY : err, worst_name = t->name;
            if (!(err <= GRAD_BOUND))
                fail_msg("%s: gradient of %s: row-relative error %.3e > %.0e", what, t->name, err, GRAD_BOUND);
        }
        checked++;
        free(want);
    }
    printf("  %s: %d gradients, worst row-relative error %.2e (%s)\n", what, checked, worst, worst_name);
}

static void expect_loss(const char *what, double got, double want) {
    const double rel = fabs(got - want) / fabs(want);
    printf("  %s: loss %.7f (PyTorch %.7f), relative error %.2e\n", what, got, want, rel);
    if (!(rel <= LOSS_BOUND)) fail_msg("%s: loss %.8f, PyTorch %.8f: relative error %.3e", what, got, want, rel);
}

static void test_mlm_step(void **state) {
    nopad_backend *be = cpu();
    train_model m;
    load(be, "bert_mlm", TRAIN_TASK_MLM, &m);
    fixture f;
    fixture_load("mlm", &f);
    train_context ctx;
    assert_nopad_ok(train_context_init(&m, 64, 8, &ctx));
    const train_batch b = fixture_batch(&f);
    double loss = NAN;
    assert_nopad_ok(train_forward_backward(&ctx, &b, &loss));
    expect_loss("mlm", loss, f.loss);
    expect_gradients("mlm", &m, &f);
    /* A second step on the same batch gives the same gradients: they are reset, not added. */
    assert_nopad_ok(train_forward_backward(&ctx, &b, &loss));
    expect_gradients("mlm, again", &m, &f);
    train_context_free(&ctx);
    fixture_free(&f);
    train_model_free(&m);
    be->destroy(be);
}

/* Two optimiser steps from the saved weights with the fixture's gradients (then scaled by
 * STEP2_GRAD_SCALE), against the fixture's parameters after them. */
static void check_optimizer(int lamb) {
    nopad_backend *be = cpu();
    train_model m;
    load(be, "bert_mlm", TRAIN_TASK_MLM, &m);
    fixture f;
    fixture_load("mlm", &f);
    const train_optimizer opt = fixture_optimizer();
    double *norms = lamb ? golden_copy(&f.file, "lamb_grad_norms", ST_F64, NULL) : NULL;
    for (int step = 0; step < 2; step++) {
        for (int32_t i = 0; i < m.n_tensors; i++) {
            float *g = fixture_tensor(&f, "grad.", &m.tensors[i]);
            for (int64_t k = 0; k < m.tensors[i].rows * m.tensors[i].cols; k++)
                m.grads[m.tensors[i].offset + k] = step ? g[k] * STEP2_GRAD_SCALE : g[k];
            free(g);
        }
        float norm = NAN;
        if (lamb) {
            assert_nopad_ok(train_lamb_step(&m, &opt, &norm));
            const double rel = fabs(norm - norms[step]) / norms[step];
            if (!(rel <= 1e-5)) fail_msg("LAMB step %d: gradient norm %.7f, PyTorch %.7f", step + 1, norm, norms[step]);
        } else {
            assert_nopad_ok(train_adamw_step(&m, &opt));
        }
    }
    assert_int_equal(m.step, 2);
    double worst = 0;
    const char *worst_name = "";
    for (int32_t i = 0; i < m.n_tensors; i++) {
        const train_tensor *t = &m.tensors[i];
        float *want = fixture_tensor(&f, lamb ? "lamb." : "adamw.", t);
        for (int64_t k = 0; k < t->rows * t->cols; k++) {
            const double err = fabs((double)m.params[t->offset + k] - want[k]);
            if (!(err <= worst)) worst = isnan(err) ? INFINITY : err, worst_name = t->name;
        }
        free(want);
    }
    printf("  %s, 2 steps: worst parameter error %.2e (%s)\n", lamb ? "LAMB" : "AdamW", worst, worst_name);
    if (!(worst <= PARAM_BOUND))
        fail_msg("%s: parameter %s off by %.3e > %.0e", lamb ? "LAMB" : "AdamW", worst_name, worst, PARAM_BOUND);
    free(norms);
    fixture_free(&f);
    train_model_free(&m);
    be->destroy(be);
}

static void test_adamw(void **state) { check_optimizer(0); }
static void test_lamb(void **state) { check_optimizer(1); }

static void check_classify(const char *folder, const char *name, int32_t num_labels) {
    nopad_backend *be = cpu();
    train_model m;
    load(be, folder, TRAIN_TASK_CLASSIFY, &m);
    assert_int_equal(m.num_labels, num_labels);
    fixture f;
    fixture_load(name, &f);
    train_context ctx;
    assert_nopad_ok(train_context_init(&m, 64, 8, &ctx));
    const train_batch b = fixture_batch(&f);
    double loss = NAN;
    assert_nopad_ok(train_forward_backward(&ctx, &b, &loss));
    expect_loss(name, loss, f.loss);
    expect_gradients(name, &m, &f);
    train_context_free(&ctx);
    fixture_free(&f);
    train_model_free(&m);
    be->destroy(be);
}

static void test_classify_step(void **state) { check_classify("bert_cls", "cls", 3); }
static void test_regression_step(void **state) { check_classify("bert_reg", "reg", 1); }

/* Bad batches are errors naming what is wrong, before any work; the model is untouched. */
static void test_bad_input(void **state) {
    nopad_backend *be = cpu();
    train_model mlm, cls;
    load(be, "bert_mlm", TRAIN_TASK_MLM, &mlm);
    load(be, "bert_cls", TRAIN_TASK_CLASSIFY, &cls);
    fixture f, fc;
    fixture_load("mlm", &f);
    fixture_load("cls", &fc);
    train_context ctx, cctx;
    assert_nopad_ok(train_context_init(&mlm, 64, 8, &ctx));
    assert_nopad_ok(train_context_init(&cls, 64, 8, &cctx));
    double loss;
    train_batch b = fixture_batch(&f);
    b.n_seqs = 0;
    assert_nopad_error(train_forward_backward(&ctx, &b, &loss), NOPAD_ERR_INVALID_ARGUMENT, "empty");
    b = fixture_batch(&f);
    b.n_masked = 0;
    assert_nopad_error(train_forward_backward(&ctx, &b, &loss), NOPAD_ERR_INVALID_ARGUMENT, "no masked");
    int32_t labels[64];
    memcpy(labels, f.mlm_labels, (size_t)f.n_masked * sizeof *labels);
    labels[f.n_masked - 1] = 64; /* the vocabulary has 64 ids */
    b = fixture_batch(&f);
    b.mlm_labels = labels;
    assert_nopad_error(train_forward_backward(&ctx, &b, &loss), NOPAD_ERR_INVALID_ARGUMENT, "MLM label");
    int32_t positions[64];
    memcpy(positions, f.positions, (size_t)f.n_masked * sizeof *positions);
    positions[0] = f.n_tokens;
    b = fixture_batch(&f);
    b.mlm_positions = positions;
    assert_nopad_error(train_forward_backward(&ctx, &b, &loss), NOPAD_ERR_INVALID_ARGUMENT, "masked position");
    int32_t ids[64];
    memcpy(ids, f.ids, (size_t)f.n_tokens * sizeof *ids);
    ids[5] = -1;
    b = fixture_batch(&f);
    b.tokens = ids;
    assert_nopad_error(train_forward_backward(&ctx, &b, &loss), NOPAD_ERR_INVALID_ARGUMENT, "vocabulary");
    const int32_t long_cu[2] = {0, 33}; /* 32 positions */
    int32_t long_ids[33] = {0};
    b = (train_batch){.n_seqs = 1, .cu_seqlens = long_cu, .tokens = long_ids, .n_masked = 1,
                      .mlm_positions = positions + 1, .mlm_labels = f.mlm_labels};
    assert_nopad_error(train_forward_backward(&ctx, &b, &loss), NOPAD_ERR_INVALID_ARGUMENT, "1 to 32");
    /* classification labels out of range, in both directions */
    int32_t cls_labels[8];
    memcpy(cls_labels, fc.labels, (size_t)fc.n_seqs * sizeof *cls_labels);
    cls_labels[2] = 3;
    b = fixture_batch(&fc);
    b.labels = cls_labels;
    assert_nopad_error(train_forward_backward(&cctx, &b, &loss), NOPAD_ERR_INVALID_ARGUMENT, "label 2 is 3");
    cls_labels[2] = -1;
    assert_nopad_error(train_forward_backward(&cctx, &b, &loss), NOPAD_ERR_INVALID_ARGUMENT, "label 2 is -1");
    /* a context too small for the batch */
    train_context small;
    assert_nopad_ok(train_context_init(&mlm, 16, 8, &small));
    b = fixture_batch(&f);
    assert_nopad_error(train_forward_backward(&small, &b, &loss), NOPAD_ERR_INVALID_ARGUMENT, "budget is 16");
    train_context_free(&small);
    /* the step still works after the refusals */
    b = fixture_batch(&f);
    assert_nopad_ok(train_forward_backward(&ctx, &b, &loss));
    expect_loss("mlm after refusals", loss, f.loss);
    train_context_free(&ctx);
    train_context_free(&cctx);
    fixture_free(&f);
    fixture_free(&fc);
    train_model_free(&mlm);
    train_model_free(&cls);
    be->destroy(be);
}

/* The loss of the batch at the model's current weights, its dropout masks fixed (same step). */
static double loss_at(train_context *ctx, const train_batch *b) {
    double loss = NAN;
    assert_nopad_ok(train_forward(ctx, b));
    assert_nopad_ok(train_read_loss(ctx, &loss));
    return loss;
}

/* Dropout in the step: hidden dropout (after the embeddings and each sub-layer), attention
 * dropout (the attention probabilities) and both, p = 0.1 each. The masks are a function of (seed,
 * step, site), so with the step fixed the loss is a smooth function of the weights and the
 * backward's gradient is its derivative. Checked as a directional derivative along the gradient,
 * by central differences in float32 (h = 1e-2 along the unit direction: the curvature term is
 * O(h²) ~1e-4 relative, the rounding term ~1e-7 / h · |loss| ~ 1e-5): within 1e-2. Also: the same
 * step gives the same loss twice, another step or seed other masks, p = 0 the plain step bit for
 * bit. */
static void dropout_case(float hidden, float attention) {
    nopad_backend *be = cpu();
    train_model m;
    load(be, "bert_mlm", TRAIN_TASK_MLM, &m);
    fixture f;
    fixture_load("mlm", &f);
    train_context ctx;
    assert_nopad_ok(train_context_init(&m, 64, 8, &ctx));
    const train_batch b = fixture_batch(&f);
    const double plain = loss_at(&ctx, &b);
    ctx.dropout = hidden;
    ctx.attention_dropout = attention;
    ctx.dropout_seed = 1234;
    double loss = NAN;
    assert_nopad_ok(train_forward_backward(&ctx, &b, &loss));
    assert_true(loss != plain);
    assert_true(loss_at(&ctx, &b) == loss);
    const int64_t n = m.n_params;
    float *p0 = malloc((size_t)n * sizeof(float)), *g = malloc((size_t)n * sizeof(float));
    float *p1 = malloc((size_t)n * sizeof(float));
    memcpy(p0, m.params, (size_t)n * sizeof(float));
    memcpy(g, m.grads, (size_t)n * sizeof(float));
    double gnorm = 0;
    for (int64_t i = 0; i < n; i++) gnorm += (double)g[i] * g[i];
    gnorm = sqrt(gnorm);
    const double h = 1e-2;
    double side[2];
    for (int k = 0; k < 2; k++) {
        const double sign = k ? -1.0 : 1.0;
        for (int64_t i = 0; i < n; i++) p1[i] = (float)(p0[i] + sign * h * g[i] / gnorm);
        assert_nopad_ok(train_model_set_params(&m, 0, p1, n));
        side[k] = loss_at(&ctx, &b);
    }
    const double fd = (side[0] - side[1]) / (2 * h);
    print_message("dropout %.1f, attention dropout %.1f: loss %.6f (without %.6f), |g| %.6f, central "
                  "difference %.6f\n", hidden, attention, loss, plain, gnorm, fd);
    assert_true(fabs(fd - gnorm) <= 1e-2 * gnorm);
    assert_nopad_ok(train_model_set_params(&m, 0, p0, n));
    /* another step, another seed: other masks */
    m.step = 1;
    assert_true(loss_at(&ctx, &b) != loss);
    m.step = 0;
    ctx.dropout_seed = 99;
    assert_true(loss_at(&ctx, &b) != loss);
    /* p = 0 is the plain step */
    ctx.dropout = 0.0f;
    ctx.attention_dropout = 0.0f;
    assert_true(loss_at(&ctx, &b) == plain);
    free(p0), free(p1), free(g);
    train_context_free(&ctx);
    fixture_free(&f);
    train_model_free(&m);
    be->destroy(be);
}

static void test_dropout_step(void **state) {
    (void)state;
    dropout_case(0.1f, 0.0f);
    dropout_case(0.0f, 0.1f);
    dropout_case(0.1f, 0.1f);
}

/* Loading refuses what it cannot train, naming the reason. */
static void test_load_errors(void **state) {
    nopad_backend *be = cpu();
    train_model m;
    /* a head that is not in the checkpoint */
    assert_nopad_error(train_model_load(be, test_data_path("train/bert_mlm"), TRAIN_TASK_CLASSIFY, &m),
                       NOPAD_ERR_FORMAT, "classifier.weight");
    assert_nopad_error(train_model_load(be, test_data_path("train/bert_cls"), TRAIN_TASK_MLM, &m),
                       NOPAD_ERR_FORMAT, "cls.predictions");
    /* a family other than BERT */
    assert_nopad_error(train_model_load(be, test_data_path("models/distilbert_a"), TRAIN_TASK_MLM, &m),
                       NOPAD_ERR_UNSUPPORTED, "BERT");
    /* a backend without the training ops (as CUDA is today) */
    be->attention_backward = NULL;
    assert_nopad_error(train_model_load(be, test_data_path("train/bert_mlm"), TRAIN_TASK_MLM, &m),
                       NOPAD_ERR_UNSUPPORTED, "attention_backward");
    be->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlm_step),        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_lamb),            cmocka_unit_test(test_classify_step),
        cmocka_unit_test(test_regression_step), cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_load_errors),     cmocka_unit_test(test_dropout_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
