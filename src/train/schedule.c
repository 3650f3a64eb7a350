/* Learning-rate schedules: transformers' optimization.py formulas, in double. */
#include "train/schedule.h"

#include <math.h>
#include <string.h>

static const char *const KIND_NAMES[] = {"linear", "polynomial", "constant"};

train_schedule train_schedule_defaults(void) {
    return (train_schedule){.kind = TRAIN_SCHEDULE_LINEAR, .lr = 5e-5, .warmup_steps = 0,
                            .total_steps = 1, .lr_end = 1e-7, .power = 1.0};
}

double train_schedule_lr(const train_schedule *s, int64_t step) {
    const int64_t W = s->warmup_steps, N = s->total_steps;
    if (step < W) return s->lr * (double)step / (double)(W > 1 ? W : 1);
    switch (s->kind) {
    case TRAIN_SCHEDULE_CONSTANT:
        return s->lr;
    case TRAIN_SCHEDULE_POLYNOMIAL: {
        /* HF: lr_end / lr_init past the end; the decay over N - W steps otherwise (W < N) */
        if (step > N || N <= W) return s->lr_end;
        const double remaining = 1.0 - (double)(step - W) / (double)(N - W);
        return (s->lr - s->lr_end) * pow(remaining, s->power) + s->lr_end;
    }
    case TRAIN_SCHEDULE_LINEAR:
    default: {
        const double f = (double)(N - step) / (double)(N - W > 1 ? N - W : 1);
        return s->lr * (f > 0 ? f : 0);
    }
    }
}

int64_t train_schedule_warmup_steps(double ratio, int64_t total_steps) {
    if (!(ratio > 0)) return 0;
    return (int64_t)ceil(ratio * (double)total_steps);
}

const char *train_schedule_kind_name(train_schedule_kind kind) {
    return (unsigned)kind <= TRAIN_SCHEDULE_CONSTANT ? KIND_NAMES[kind] : "unknown";
}

int train_schedule_kind_from_name(const char *name, train_schedule_kind *out) {
    for (int k = 0; k <= TRAIN_SCHEDULE_CONSTANT; k++)
        if (!strcmp(name, KIND_NAMES[k])) {
            *out = (train_schedule_kind)k;
            return 0;
        }
    return -1;
}
