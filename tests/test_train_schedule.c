/* Learning-rate schedules and AdamW's gradient clipping (src/train/schedule.c, train_model.c).
 *
 * The expected learning rates are transformers' formulas (optimization.py) worked by hand at
 * chosen steps, with s the optimiser steps already taken, W the warmup, N the total:
 *   get_linear_schedule_with_warmup:  s < W: s/W;  else max(0, (N - s) / max(1, N - W))
 *   get_polynomial_decay_schedule_with_warmup (lr_end, power): s < W: s/W; s > N: lr_end/lr;
 *       else ((lr - lr_end)·(1 - (s - W)/(N - W))^power + lr_end) / lr
 * each a factor of the peak lr. Clipping is torch.nn.utils.clip_grad_norm_: norm = ‖all
 * gradients‖₂, gradients times min(1, max_norm / (norm + 1e-6)), checked on the tiny BERT's
 * gradient buffer filled with known values against the formula in double. */
#include <math.h>
#include <stdlib.h>

#include "testutil.h"
#include "train/schedule.h"
#include "train/train.h"

/* lr within 1e-12 relative (double arithmetic on both sides) */
static void expect_lr(const train_schedule *s, int64_t step, double want) {
    const double got = train_schedule_lr(s, step);
    if (fabs(got - want) > 1e-12 * fabs(want) + 1e-18) {
        print_error("step %lld: lr %.17g, expected %.17g\n", (long long)step, got, want);
        fail();
    }
}

static void test_linear(void **state) {
    train_schedule s = train_schedule_defaults();
    s.lr = 5e-5, s.warmup_steps = 10, s.total_steps = 100;
    expect_lr(&s, 0, 0.0);              // 0/10: HF's first update with a warmup has lr 0
    expect_lr(&s, 1, 5e-6);             // 1/10
    expect_lr(&s, 5, 2.5e-5);           // 5/10
    expect_lr(&s, 10, 5e-5);            // (100 - 10) / 90 = 1: the peak
    expect_lr(&s, 55, 2.5e-5);          // 45/90
    expect_lr(&s, 99, 5e-5 / 90);       // 1/90
    expect_lr(&s, 100, 0.0);            // 0/90
    expect_lr(&s, 130, 0.0);            // max(0, -30/90)
    // no warmup: (N - s) / N from the first step
    s.warmup_steps = 0, s.total_steps = 8;
    expect_lr(&s, 0, 5e-5);             // 8/8
    expect_lr(&s, 6, 5e-5 * 0.25);      // 2/8
    // warmup W = 1: max(1, W) = 1, the peak from step 1 on
    s.warmup_steps = 1, s.total_steps = 3;
    expect_lr(&s, 0, 0.0);
    expect_lr(&s, 1, 5e-5);             // (3 - 1) / 2
    expect_lr(&s, 2, 2.5e-5);           // 1/2
    // HF's warmup_ratio: ceil(ratio · N)
    assert_int_equal(train_schedule_warmup_steps(0.1, 100), 10);
    assert_int_equal(train_schedule_warmup_steps(0.1, 25), 3);   // ceil(2.5)
    assert_int_equal(train_schedule_warmup_steps(0.1, 1), 1);    // ceil(0.1)
    assert_int_equal(train_schedule_warmup_steps(0.0, 100), 0);
}

static void test_polynomial(void **state) {
    train_schedule s = train_schedule_defaults();
    s.kind = TRAIN_SCHEDULE_POLYNOMIAL;
    s.lr = 1e-3, s.warmup_steps = 10, s.total_steps = 100, s.lr_end = 1e-7, s.power = 2.0;
    expect_lr(&s, 4, 4e-4);                                  // 4/10
    expect_lr(&s, 10, 1e-3);                                 // (lr - lr_end)·1² + lr_end
    expect_lr(&s, 55, (1e-3 - 1e-7) * 0.25 + 1e-7);          // remaining 1 - 45/90 = 0.5, squared
    expect_lr(&s, 82, (1e-3 - 1e-7) * 0.04 + 1e-7);          // remaining 1 - 72/90 = 0.2
    expect_lr(&s, 100, 1e-7);                                // remaining 0: lr_end
    expect_lr(&s, 250, 1e-7);                                // past N: lr_end
    // power 1 (HF's default) and lr_end 0 is the linear schedule
    train_schedule lin = s;
    lin.kind = TRAIN_SCHEDULE_LINEAR;
    s.power = 1.0, s.lr_end = 0.0;
    for (int64_t step = 0; step <= 110; step += 11) expect_lr(&s, step, train_schedule_lr(&lin, step));
    // BERT's pretraining recipe (power 0.5 in MLPerf's LAMB runs): 1 - 30/90 = 2/3, its root
    s.power = 0.5, s.lr_end = 0.0;
    expect_lr(&s, 40, 1e-3 * sqrt(2.0 / 3.0));
}

static void test_constant(void **state) {
    train_schedule s = train_schedule_defaults();
    s.kind = TRAIN_SCHEDULE_CONSTANT;
    s.lr = 2e-5, s.warmup_steps = 4, s.total_steps = 10;
    expect_lr(&s, 2, 1e-5);
    expect_lr(&s, 4, 2e-5);
    expect_lr(&s, 1000, 2e-5);
}

/* Fills the gradients with values of a known norm, clips, and compares with the formula. */
static void clip_case(nopad_backend *be, train_model *m, float amplitude, float max_norm) {
    float *g = malloc((size_t)m->n_params * sizeof *g);
    float *got = malloc((size_t)m->n_params * sizeof *got);
    assert_non_null(g);
    assert_non_null(got);
    uint64_t rng = 5;
    test_fill_uniform(g, m->n_params, -amplitude, amplitude, &rng);
    double sum_sq = 0;
    for (int64_t i = 0; i < m->n_params; i++) sum_sq += (double)g[i] * g[i];
    const double norm = sqrt(sum_sq);
    assert_nopad_ok(be->upload_f32(be, m->grads, g, (size_t)m->n_params));
    float reported = -1;
    assert_nopad_ok(train_clip_grad_norm(m, max_norm, &reported));
    assert_true(fabs(reported - norm) <= 1e-6 * norm);
    assert_nopad_ok(be->download_f32(be, got, m->grads, (size_t)m->n_params));
    double coef = max_norm > 0 ? max_norm / (norm + 1e-6) : 1.0;
    if (coef > 1.0) coef = 1.0;
    double max_err = 0, clipped_sq = 0;
    for (int64_t i = 0; i < m->n_params; i++) {
        const double want = g[i] * coef;
        max_err = fmax(max_err, fabs(got[i] - want));
        clipped_sq += (double)got[i] * got[i];
    }
    // float32 products: half an ulp of values below the amplitude
    assert_true(max_err <= amplitude * 1e-7);
    if (coef < 1.0) assert_true(fabs(sqrt(clipped_sq) - max_norm) <= 1e-5 * max_norm);
    free(g);
    free(got);
}

static void test_clip(void **state) {
    nopad_backend *be = NULL;
    assert_nopad_ok(nopad_backend_cpu_create(2, &be));
    train_model m;
    assert_nopad_ok(train_model_load(be, test_data_path("train/bert_cls"), TRAIN_TASK_CLASSIFY, &m));
    // ~28k parameters, uniform in ±0.1: norm ≈ 0.1·√(n/3) ≈ 9.7, above the bound: clipped
    clip_case(be, &m, 0.1f, 1.0f);
    // ±1e-3: norm ≈ 0.1, below the bound: untouched
    clip_case(be, &m, 1e-3f, 1.0f);
    // max_norm 0: measures only
    clip_case(be, &m, 0.1f, 0.0f);
    train_model_free(&m);
    be->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_polynomial),
        cmocka_unit_test(test_constant),
        cmocka_unit_test(test_clip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
