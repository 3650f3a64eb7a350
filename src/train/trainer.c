/* The training loop behind nopad_train (include/nopad.h): load the model (a new head when asked
 * for), read the data, run epochs of token-budget batches with a warmup + linear-decay learning
 * rate, clip and step the optimiser, save the checkpoint with the source's tokenizer files, and
 * evaluate. Everything below it is src/train: train_model_load_new_head, train_dataset_load,
 * train_loader, train_forward_backward, train_clip_grad_norm, train_*_step, train_predict,
 * train_checkpoint_save. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nopad.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/schedule.h"
#include "train/train.h"
#include "util/error.h"
#include "util/file.h"

nopad_train_params nopad_train_default_params(void) {
    return (nopad_train_params){
        .task = NOPAD_TRAIN_MLM, .num_labels = 0, .epochs = 3, .lr = 5e-5, .warmup_ratio = 0.1,
        .warmup_steps = -1, .batch_tokens = 4096, .batch_seqs = 32, .seed = 42,
        .optimizer = NOPAD_TRAIN_ADAMW, .weight_decay = 0.01, .max_grad_norm = 1.0,
        .save_every = 0, .truncate = 0, .n_threads = 0, .on_step = NULL, .user = NULL};
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static nopad_status check_params(const nopad_train_params *p) {
    const char *missing = !p->model_dir ? "model_dir" : !p->data_path ? "data_path"
                        : !p->output_dir ? "output_dir" : NULL;
    if (missing) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: %s is required", missing);
    if (p->task != NOPAD_TRAIN_MLM && p->task != NOPAD_TRAIN_CLASSIFY)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: unknown task %d", (int)p->task);
    if (p->optimizer != NOPAD_TRAIN_ADAMW && p->optimizer != NOPAD_TRAIN_LAMB)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: unknown optimizer %d",
                               (int)p->optimizer);
    if (p->epochs < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: epochs %d, expected >= 1", p->epochs);
    if (!(p->lr > 0 && p->lr < 1))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: learning rate %g, expected in (0, 1)", p->lr);
    if (!(p->warmup_ratio >= 0 && p->warmup_ratio <= 1))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: warmup ratio %g, expected in [0, 1]",
                               p->warmup_ratio);
    if (p->batch_tokens < 1 || p->batch_seqs < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: batch of %d tokens and %d "
                               "sequences, expected >= 1 of each", p->batch_tokens, p->batch_seqs);
    if (!(p->weight_decay >= 0 && p->weight_decay < 1))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: weight decay %g, expected in [0, 1)",
                               p->weight_decay);
    if (p->task == NOPAD_TRAIN_MLM && p->num_labels != 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: num_labels is for "
                               "classification, not MLM");
    if (p->save_every < 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: save_every %lld, expected >= 0",
                               (long long)p->save_every);
    return NOPAD_OK;
}

/* Copies the tokenizer files of the source folder that exist into the checkpoint folder, so the
 * checkpoint is a whole model folder (nopad embed, from_pretrained with its tokenizer). */
static nopad_status copy_tokenizer_files(const char *from, const char *to) {
    static const char *const names[] = {"tokenizer.json", "tokenizer_config.json",
                                        "special_tokens_map.json", "vocab.txt", "vocab.json",
                                        "merges.txt", "added_tokens.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char src[4096], dst[4096];
        snprintf(src, sizeof src, "%s/%s", from, names[i]);
        snprintf(dst, sizeof dst, "%s/%s", to, names[i]);
        if (!file_exists(src)) continue;
        char *data = NULL;
        size_t len = 0;
        nopad_status st = read_file(src, (size_t)1 << 28, &data, &len);
        if (st != NOPAD_OK) return st;
        FILE *f = fopen(dst, "wb");
        const int ok = f && fwrite(data, 1, len, f) == len;
        const int closed = f && fclose(f) == 0;
        free(data);
        if (!ok || !closed)
            return nopad_set_error(NOPAD_ERR_IO, "%s: cannot write: %s", dst, strerror(errno));
    }
    return NOPAD_OK;
}

/* Everything one run holds, freed by run_free. */
typedef struct run {
    nopad_backend *be;
    nopad_tokenizer *tok;
    train_model model;
    train_dataset data, eval;
    train_loader loader, eval_loader;
    train_context ctx;
    int have_model, have_data, have_eval, have_loader, have_eval_loader, have_ctx;
} run;

static void run_free(run *r) {
    if (r->have_ctx) train_context_free(&r->ctx);
    if (r->have_eval_loader) train_loader_free(&r->eval_loader);
    if (r->have_loader) train_loader_free(&r->loader);
    if (r->have_eval) train_dataset_free(&r->eval);
    if (r->have_data) train_dataset_free(&r->data);
    if (r->have_model) train_model_free(&r->model);
    if (r->tok) nopad_tokenizer_free(r->tok);
    if (r->be) r->be->destroy(r->be);
}

static nopad_status load_data(run *r, const nopad_train_params *p, const char *path, train_dataset *out) {
    train_data_params dp = train_data_default_params();
    dp.format = p->task == NOPAD_TRAIN_CLASSIFY || ends_with(path, ".jsonl") ? TRAIN_DATA_JSONL
                                                                            : TRAIN_DATA_LINES;
    dp.task = p->task == NOPAD_TRAIN_CLASSIFY ? TRAIN_TASK_CLASSIFY : TRAIN_TASK_MLM;
    dp.num_labels = r->model.num_labels;
    dp.max_length = r->model.cfg.max_position_embeddings;
    dp.vocab_size = r->model.cfg.vocab_size;
    dp.truncate = p->truncate;
    return train_dataset_load(path, r->tok, &dp, out);
}

/* Every batch of every epoch, counted ahead (the packing of a shuffled order varies by epoch). */
static nopad_status count_steps(train_loader *l, int32_t epochs, int64_t *total) {
    *total = 0;
    for (int32_t e = 0; e < epochs; e++) {
        nopad_status st = train_loader_seek(l, (uint32_t)e, 0);
        if (st != NOPAD_OK) return st;
        while (train_loader_next(l)) (*total)++;
    }
    return train_loader_seek(l, 0, 0);
}

/* The eval data's mean loss (over batches, weighted by their rows) and, for classification with
 * labels, the accuracy of the argmax of the logits. */
static nopad_status evaluate(run *r, nopad_train_result *out) {
    train_loader *l = &r->eval_loader;
    const int32_t C = r->model.num_labels;
    float *logits = NULL;
    if (r->model.task == TRAIN_TASK_CLASSIFY && C > 1) {
        logits = malloc((size_t)l->max_seqs * (size_t)C * sizeof *logits);
        if (!logits) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "evaluation: out of memory");
    }
    double loss_sum = 0;
    int64_t rows = 0, correct = 0, seqs = 0;
    nopad_status st = train_loader_seek(l, 0, 0);
    while (st == NOPAD_OK && train_loader_next(l)) {
        const train_batch *b = &l->batch;
        double loss = 0;
        /* a step's forward and backward for the loss (the gradients are not applied) */
        st = train_forward_backward(&r->ctx, b, &loss);
        if (st != NOPAD_OK) break;
        const int64_t n = r->model.task == TRAIN_TASK_MLM ? b->n_masked : b->n_seqs;
        loss_sum += loss * (double)n;
        rows += n;
        seqs += b->n_seqs;
        if (!logits) continue;
        st = train_predict(&r->ctx, b, logits);
        for (int32_t s = 0; s < b->n_seqs && st == NOPAD_OK; s++) {
            int32_t best = 0;
            for (int32_t k = 1; k < C; k++)
                if (logits[(size_t)s * C + k] > logits[(size_t)s * C + best]) best = k;
            correct += best == b->labels[s];
        }
    }
    free(logits);
    if (st != NOPAD_OK) return nopad_wrap_error(st, "evaluation");
    out->eval_examples = (int32_t)seqs;
    out->eval_loss = rows ? loss_sum / (double)rows : -1;
    out->eval_accuracy = r->model.task == TRAIN_TASK_CLASSIFY && C > 1 && seqs ?
                             (double)correct / (double)seqs : -1;
    return NOPAD_OK;
}

static nopad_status save(run *r, const nopad_train_params *p, const train_state *state) {
    nopad_status st = train_checkpoint_save(&r->model, state, p->output_dir);
    if (st == NOPAD_OK) st = copy_tokenizer_files(p->model_dir, p->output_dir);
    return st;
}

nopad_status nopad_train(const nopad_train_params *p, nopad_train_result *out) {
    if (!p || !out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: NULL argument");
    memset(out, 0, sizeof *out);
    out->eval_accuracy = out->eval_loss = -1;
    nopad_status st = check_params(p);
    if (st != NOPAD_OK) return st;
    run r = {0};
    const train_task task = p->task == NOPAD_TRAIN_CLASSIFY ? TRAIN_TASK_CLASSIFY : TRAIN_TASK_MLM;
#define CHECK(expr)                                                                                \
    do {                                                                                           \
        st = (expr);                                                                               \
        if (st != NOPAD_OK) goto done;                                                             \
    } while (0)
    CHECK(nopad_backend_cpu_create(p->n_threads, &r.be));
    CHECK(train_model_load_new_head(r.be, p->model_dir, task, p->num_labels, p->seed, &r.model));
    r.have_model = 1;
    CHECK(nopad_tokenizer_load(p->model_dir, &r.tok));
    out->num_labels = r.model.num_labels;
    out->new_head = r.model.new_head;
    CHECK(load_data(&r, p, p->data_path, &r.data));
    r.have_data = 1;
    out->n_examples = r.data.n_examples;
    out->n_truncated = r.data.n_truncated;
    if (p->eval_path) {
        CHECK(load_data(&r, p, p->eval_path, &r.eval));
        r.have_eval = 1;
    }
    /* a batch holds at least one example of the longest */
    const int32_t max_len = r.model.cfg.max_position_embeddings;
    const int32_t budget = p->batch_tokens > max_len ? p->batch_tokens : max_len;
    CHECK(train_loader_init(&r.data, budget, p->batch_seqs, p->seed, &r.loader));
    r.have_loader = 1;
    if (r.have_eval) {
        CHECK(train_loader_init(&r.eval, budget, p->batch_seqs, p->seed, &r.eval_loader));
        r.have_eval_loader = 1;
    }
    CHECK(train_context_init(&r.model, budget, p->batch_seqs, &r.ctx));
    r.have_ctx = 1;

    int64_t total = 0;
    CHECK(count_steps(&r.loader, p->epochs, &total));
    train_schedule sched = train_schedule_defaults();
    sched.lr = p->lr;
    sched.total_steps = total;
    sched.warmup_steps = p->warmup_steps >= 0 ? p->warmup_steps
                                              : train_schedule_warmup_steps(p->warmup_ratio, total);
    train_state state = {.kind = p->optimizer == NOPAD_TRAIN_LAMB ? TRAIN_OPT_LAMB : TRAIN_OPT_ADAMW,
                         .opt = train_optimizer_defaults(), .data_seed = p->seed};
    state.opt.weight_decay = (float)p->weight_decay;
    state.opt.max_grad_norm = (float)p->max_grad_norm;
    if (p->optimizer == NOPAD_TRAIN_ADAMW) state.opt.eps = 1e-8f; /* torch's AdamW, HF's default */

    const double start = seconds();
    int64_t tokens = 0;
    int stop = 0;
    for (int32_t e = 0; e < p->epochs && !stop; e++) {
        CHECK(train_loader_seek(&r.loader, (uint32_t)e, 0));
        while (!stop && train_loader_next(&r.loader)) {
            const train_batch *b = &r.loader.batch;
            const int64_t step = r.model.step; /* updates already taken */
            double loss = 0;
            st = train_forward_backward(&r.ctx, b, &loss);
            if (st != NOPAD_OK) {
                st = nopad_wrap_error(st, "step %lld (epoch %d)", (long long)step + 1, (int)e + 1);
                goto done;
            }
            state.opt.lr = (float)train_schedule_lr(&sched, step);
            float norm = 0;
            if (state.kind == TRAIN_OPT_LAMB) {
                CHECK(train_lamb_step(&r.model, &state.opt, &norm));
            } else {
                CHECK(train_clip_grad_norm(&r.model, state.opt.max_grad_norm, &norm));
                CHECK(train_adamw_step(&r.model, &state.opt));
            }
            tokens += b->cu_seqlens[b->n_seqs];
            if (step == 0) out->first_loss = loss;
            out->last_loss = loss;
            out->steps = r.model.step;
            state.epoch = r.loader.epoch;
            state.cursor = r.loader.cursor;
            if (p->save_every > 0 && r.model.step % p->save_every == 0) CHECK(save(&r, p, &state));
            if (p->on_step) {
                const nopad_train_progress pr = {
                    .step = r.model.step, .total_steps = total, .epoch = e, .epochs = p->epochs,
                    .loss = loss, .lr = state.opt.lr, .grad_norm = norm, .tokens = tokens,
                    .elapsed_s = seconds() - start};
                stop = p->on_step(p->user, &pr) != 0;
            }
        }
    }
    CHECK(save(&r, p, &state));
    if (r.have_eval) CHECK(evaluate(&r, out));
#undef CHECK
done:
    run_free(&r);
    return st;
}
