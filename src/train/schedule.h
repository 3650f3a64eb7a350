/* Learning-rate schedules (issue 24): the learning rate of each optimiser step, as Hugging Face's
 * transformers computes it (optimization.py), so a run configured like an HF Trainer run takes
 * the same steps:
 *
 *   TRAIN_SCHEDULE_CONSTANT     lr, after the warmup
 *   TRAIN_SCHEDULE_LINEAR       get_linear_schedule_with_warmup: lr·s/W during the warmup, then
 *                               lr·max(0, (N - s) / max(1, N - W)), down to 0 at step N
 *   TRAIN_SCHEDULE_POLYNOMIAL   get_polynomial_decay_schedule_with_warmup: the same warmup, then
 *                               (lr - lr_end)·(1 - (s - W)/(N - W))^power + lr_end, and lr_end
 *                               from step N on
 *
 * with s the number of optimiser steps already taken (0 for the first update: HF's LambdaLR is
 * stepped after optimizer.step(), so with a warmup the first update has learning rate 0), W the
 * warmup steps and N the total steps. The warmup is lr·s/max(1, W) for s < W. */
#ifndef NOPAD_TRAIN_SCHEDULE_H
#define NOPAD_TRAIN_SCHEDULE_H

#include <stdint.h>

typedef enum train_schedule_kind {
    TRAIN_SCHEDULE_LINEAR = 0,
    TRAIN_SCHEDULE_POLYNOMIAL = 1,
    TRAIN_SCHEDULE_CONSTANT = 2,
} train_schedule_kind;

typedef struct train_schedule {
    train_schedule_kind kind; // default TRAIN_SCHEDULE_LINEAR
    double lr;                // the peak learning rate (after the warmup)
    int64_t warmup_steps;     // W >= 0
    int64_t total_steps;      // N >= 1 (LINEAR, POLYNOMIAL)
    double lr_end;            // POLYNOMIAL: the final learning rate; default 1e-7 (HF's)
    double power;             // POLYNOMIAL: default 1.0 (HF's)
} train_schedule;

/* LINEAR, no warmup, one step, lr 5e-5 (HF's TrainingArguments default), lr_end 1e-7, power 1. */
train_schedule train_schedule_defaults(void);

/* The learning rate of the update that follows `step` updates already taken. */
double train_schedule_lr(const train_schedule *s, int64_t step);

/* "linear", "polynomial", "constant" (trainer_state.json), and back: 0 on success, -1 for an
 * unknown name. */
const char *train_schedule_kind_name(train_schedule_kind kind);
int train_schedule_kind_from_name(const char *name, train_schedule_kind *out);

/* The warmup of a fraction of the steps, as HF's warmup_ratio: ceil(ratio·total_steps). */
int64_t train_schedule_warmup_steps(double ratio, int64_t total_steps);

#endif
