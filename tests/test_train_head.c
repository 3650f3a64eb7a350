/* A new head for fine-tuning (train_model_load_new_head): a checkpoint without the task's head
 * (here the tiny BertForMaskedLM of tests/data/train, which has no pooler and no classifier) gets
 * one initialised as HF's _init_weights does it: Linear weights normal(0, initializer_range =
 * 0.02 in its config.json), biases 0, LayerNorm weights 1.
 *   - the encoder's tensors are the checkpoint's, bit for bit;
 *   - the new weights' sample mean and standard deviation are those of N(0, 0.02²) within 5
 *     standard errors (pooler: 1024 draws: mean within 5·0.02/√1024, std within
 *     5·0.02/√(2·1024)), the biases 0;
 *   - the same seed gives the same head, another seed another;
 *   - a fresh 3-label head's first loss is near ln 3 (logits of ~0.06: |W| ~ 0.02 over 32 inputs
 *     in (-1, 1)), train_predict's logits give that loss (cross-entropy in double, 1e-6), and a
 *     step runs;
 *   - without a label count, or with one that the checkpoint's classifier contradicts, an error
 *     that says what is missing or what differs; a missing encoder tensor is still an error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "train/train.h"

static float *download(nopad_backend *be, const float *src, int64_t n) {
    float *h = malloc((size_t)n * sizeof *h);
    assert_non_null(h);
    assert_nopad_ok(be->download_f32(be, h, src, (size_t)n));
    return h;
}

static void expect_normal(nopad_backend *be, const float *w, int64_t n, double std) {
    float *h = download(be, w, n);
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; i++) sum += h[i], sq += (double)h[i] * h[i];
    const double mean = sum / n, sd = sqrt(sq / n - mean * mean);
    assert_true(fabs(mean) < 5 * std / sqrt((double)n));
    assert_true(fabs(sd - std) < 5 * std / sqrt(2.0 * n));
    free(h);
}

static void expect_filled(nopad_backend *be, const float *w, int64_t n, float v) {
    float *h = download(be, w, n);
    for (int64_t i = 0; i < n; i++) assert_true(h[i] == v);
    free(h);
}

static void test_new_classifier(void **state) {
    nopad_backend *be = NULL;
    assert_nopad_ok(nopad_backend_cpu_create(2, &be));
    const char *mlm = test_data_path("train/bert_mlm");
    train_model base, a, b, c;
    assert_nopad_ok(train_model_load(be, mlm, TRAIN_TASK_MLM, &base));
    assert_false(base.new_head);
    assert_nopad_ok(train_model_load_new_head(be, mlm, TRAIN_TASK_CLASSIFY, 3, 7, &a));
    assert_true(a.new_head);
    assert_int_equal(a.num_labels, 3);
    const int64_t H = a.cfg.hidden_size;
    // the encoder is the checkpoint's
    const char *names[] = {"bert.embeddings.word_embeddings.weight",
                           "bert.encoder.layer.1.output.dense.weight",
                           "bert.encoder.layer.0.attention.self.value.bias"};
    for (int i = 0; i < 3; i++) {
        const train_tensor *t0 = train_model_find(&base, names[i]), *t1 = train_model_find(&a, names[i]);
        assert_non_null(t0);
        assert_non_null(t1);
        const int64_t n = t0->rows * t0->cols;
        float *x = download(be, base.params + t0->offset, n), *y = download(be, a.params + t1->offset, n);
        assert_memory_equal(x, y, (size_t)n * sizeof *x);
        free(x);
        free(y);
    }
    // HF's initialisation
    expect_normal(be, a.w.pool_w, H * H, 0.02);
    expect_normal(be, a.w.cls_w, 3 * H, 0.02);
    expect_filled(be, a.w.pool_b, H, 0.0f);
    expect_filled(be, a.w.cls_b, 3, 0.0f);
    // the seed decides it
    assert_nopad_ok(train_model_load_new_head(be, mlm, TRAIN_TASK_CLASSIFY, 3, 7, &b));
    assert_nopad_ok(train_model_load_new_head(be, mlm, TRAIN_TASK_CLASSIFY, 3, 8, &c));
    float *wa = download(be, a.w.cls_w, 3 * H), *wb = download(be, b.w.cls_w, 3 * H),
          *wc = download(be, c.w.cls_w, 3 * H);
    assert_memory_equal(wa, wb, (size_t)(3 * H) * sizeof *wa);
    assert_memory_not_equal(wa, wc, (size_t)(3 * H) * sizeof *wa);
    free(wa), free(wb), free(wc);
    // a first step: the loss of near-uniform logits
    const int32_t cu[] = {0, 5, 12, 14}, labels[] = {0, 2, 1};
    int32_t tokens[14];
    for (int i = 0; i < 14; i++) tokens[i] = 5 + (i * 7) % 50;
    tokens[0] = tokens[5] = tokens[12] = 2;
    train_batch batch = {.n_seqs = 3, .cu_seqlens = cu, .tokens = tokens, .labels = labels};
    train_context ctx;
    assert_nopad_ok(train_context_init(&a, 32, 4, &ctx));
    double loss = 0;
    assert_nopad_ok(train_forward_backward(&ctx, &batch, &loss));
    assert_true(fabs(loss - log(3.0)) < 0.1);
    // train_predict's logits give the step's loss: mean of logsumexp - logit[label]
    float logits[9];
    assert_nopad_ok(train_predict(&ctx, &batch, logits));
    double ce = 0;
    for (int s = 0; s < 3; s++) {
        double z = 0;
        for (int k = 0; k < 3; k++) z += exp(logits[3 * s + k]);
        ce += (log(z) - logits[3 * s + labels[s]]) / 3;
    }
    assert_true(fabs(ce - loss) < 1e-6);
    train_optimizer opt = train_optimizer_defaults();
    assert_nopad_ok(train_adamw_step(&a, &opt));
    train_context_free(&ctx);
    train_model_free(&a), train_model_free(&b), train_model_free(&c), train_model_free(&base);
    be->destroy(be);
}

static void test_new_mlm_head(void **state) {
    nopad_backend *be = NULL;
    assert_nopad_ok(nopad_backend_cpu_create(2, &be));
    train_model m;
    const char *cls = test_data_path("train/bert_cls");
    assert_nopad_error(train_model_load(be, cls, TRAIN_TASK_MLM, &m), NOPAD_ERR_FORMAT,
                       "cls.predictions");
    assert_nopad_ok(train_model_load_new_head(be, cls, TRAIN_TASK_MLM, 0, 1, &m));
    assert_true(m.new_head);
    const int64_t H = m.cfg.hidden_size;
    expect_normal(be, m.w.mlm_dense_w, H * H, 0.02);
    expect_filled(be, m.w.mlm_dense_b, H, 0.0f);
    expect_filled(be, m.w.mlm_ln_w, H, 1.0f);
    expect_filled(be, m.w.mlm_ln_b, H, 0.0f);
    expect_filled(be, m.w.mlm_bias, m.cfg.vocab_size, 0.0f);
    train_model_free(&m);
    be->destroy(be);
}

static void test_errors(void **state) {
    nopad_backend *be = NULL;
    assert_nopad_ok(nopad_backend_cpu_create(2, &be));
    train_model m;
    char mlm[1024], cls[1024]; // test_data_path's buffer is reused
    snprintf(mlm, sizeof mlm, "%s", test_data_path("train/bert_mlm"));
    snprintf(cls, sizeof cls, "%s", test_data_path("train/bert_cls"));
    // no classifier and no label count: say how to start one
    assert_nopad_error(train_model_load(be, mlm, TRAIN_TASK_CLASSIFY, &m), NOPAD_ERR_FORMAT,
                       "--num-labels");
    assert_nopad_error(train_model_load_new_head(be, mlm, TRAIN_TASK_CLASSIFY, 0, 1, &m),
                       NOPAD_ERR_FORMAT, "no classifier.weight");
    // a classifier of 3 labels is not one of 2
    assert_nopad_error(train_model_load_new_head(be, cls, TRAIN_TASK_CLASSIFY, 2, 1, &m),
                       NOPAD_ERR_INVALID_ARGUMENT, "3 labels");
    assert_nopad_error(train_model_load_new_head(be, cls, TRAIN_TASK_CLASSIFY, -1, 1, &m),
                       NOPAD_ERR_INVALID_ARGUMENT, "num_labels");
    // the checkpoint's own head, taken as it is
    assert_nopad_ok(train_model_load_new_head(be, cls, TRAIN_TASK_CLASSIFY, 0, 1, &m));
    assert_false(m.new_head);
    assert_int_equal(m.num_labels, 3);
    train_model_free(&m);
    assert_nopad_ok(train_model_load_new_head(be, cls, TRAIN_TASK_CLASSIFY, 3, 1, &m));
    assert_false(m.new_head);
    train_model_free(&m);
    be->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_classifier),
        cmocka_unit_test(test_new_mlm_head),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
