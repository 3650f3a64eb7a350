/* The training loop behind nopad_train (include/nopad.h): load the model (a new head when asked
 * for, or a checkpoint to resume), read the data, run epochs of token-budget batches with a
 * warmup + linear-decay learning rate, clip and step the optimiser, log each step, save the
 * checkpoint with the source's tokenizer files, and evaluate. Everything below it is src/train:
 * train_model_load_new_head, train_checkpoint_load, train_dataset_load and train_loader (or
 * train_stream for data streamed a window at a time),
 * train_forward_backward, train_clip_grad_norm, train_*_step, train_predict,
 * train_checkpoint_save. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "nopad.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/dp.h"
#include "train/schedule.h"
#include "train/stream.h"
#include "train/train.h"
#include "util/error.h"
#include "util/file.h"
#include "util/knobs.h"
#include "util/types.h"

nopad_train_params nopad_train_default_params(void) {
    return (nopad_train_params){
        .task = NOPAD_TRAIN_MLM, .num_labels = 0, .epochs = 3, .lr = 5e-5, .warmup_ratio = 0.1,
        .warmup_steps = -1, .batch_tokens = 4096, .batch_seqs = 32, .seed = 42,
        .optimizer = NOPAD_TRAIN_ADAMW, .weight_decay = 0.01, .max_grad_norm = 1.0,
        .save_every = 0, .truncate = 0, .n_threads = 0, .on_step = NULL, .user = NULL,
        .resume_dir = NULL, .device = NOPAD_DEVICE_CPU, .device_index = 0, .dtype = NOPAD_DTYPE_F32,
        .log_path = NULL, .log_batches = 0, .dropout = -1, .stream = 0,
        .stream_buffer = (int64_t)64 << 20, .eval_every = 0, .eval_every_epoch = 0,
        .save_best = 0, .best_metric = NOPAD_TRAIN_METRIC_AUTO, .early_stop = 0, .on_eval = NULL,
        .whole_word_mask = 0, .pack_lines = 0, .early_stop_min_delta = 0, .attention_dropout = -1,
        .dp_exchange = 1};
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
    if (!p->output_dir[0] || (p->resume_dir && !p->resume_dir[0]))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: %s is empty, expected a "
                               "folder's path", !p->output_dir[0] ? "output_dir" : "resume_dir");
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
    if (!(p->dropout == -1 || (p->dropout >= 0 && p->dropout < 1)))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: dropout %g is outside "
                               "[0, 1) (-1: the config's hidden_dropout_prob)", p->dropout);
    if (!(p->attention_dropout == -1 || (p->attention_dropout >= 0 && p->attention_dropout < 1)))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: attention_dropout %g is "
                               "outside [0, 1) (-1: dropout when set, else the config's "
                               "attention_probs_dropout_prob)", p->attention_dropout);
    if (!(p->weight_decay >= 0 && p->weight_decay < 1))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: weight decay %g, expected in [0, 1)",
                               p->weight_decay);
    if (p->task == NOPAD_TRAIN_MLM && p->num_labels != 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: num_labels is for "
                               "classification, not MLM");
    if (p->whole_word_mask != 0 && (p->whole_word_mask != 1 || p->task != NOPAD_TRAIN_MLM))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: whole_word_mask %d; it is 0 "
                               "or 1, and 1 is for masked-LM", p->whole_word_mask);
    if (p->pack_lines != 0 && (p->pack_lines != 1 || p->task != NOPAD_TRAIN_MLM))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: pack_lines %d; it is 0 or 1, "
                               "and 1 is for masked-LM", p->pack_lines);
    if (p->pack_lines && p->stream)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "nopad_train: pack_lines packs the data held in "
                               "memory; it does not stream yet (stream = 0, `nopad train --no-stream`)");
    if (p->device != NOPAD_DEVICE_CPU && p->device != NOPAD_DEVICE_CUDA)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: device %d is not cpu or cuda",
                               (int)p->device);
    if (p->stream && p->stream_buffer < 1024)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: stream buffer of %lld "
                               "bytes, expected >= 1024", (long long)p->stream_buffer);
    if (p->save_every < 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: save_every %lld, expected >= 0",
                               (long long)p->save_every);
    if (p->eval_every < 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: eval_every %lld, expected "
                               ">= 0 (0: evaluate only at the end)", (long long)p->eval_every);
    if (p->early_stop < 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: early_stop %d, expected "
                               ">= 0 (0: off)", p->early_stop);
    if (!(p->early_stop_min_delta >= 0 && isfinite(p->early_stop_min_delta)))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: early_stop_min_delta %g, "
                               "expected a finite number >= 0", p->early_stop_min_delta);
    if (p->early_stop_min_delta > 0 && p->early_stop == 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: early_stop_min_delta needs "
                               "early_stop (the evaluations without such an improvement that stop "
                               "the run)");
    if ((unsigned)p->best_metric > NOPAD_TRAIN_METRIC_ACCURACY)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: unknown best_metric %d",
                               (int)p->best_metric);
    const int periodic = p->eval_every > 0 || p->eval_every_epoch;
    const char *needs = periodic ? (p->eval_every > 0 ? "eval_every" : "eval_every_epoch")
                      : p->save_best ? "save_best" : p->early_stop ? "early_stop" : NULL;
    if (needs && !p->eval_path)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: %s needs eval_path (the "
                               "data to evaluate on)", needs);
    if (needs && !periodic)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: %s needs eval_every or "
                               "eval_every_epoch (the evaluations it picks from)", needs);
    if (p->task == NOPAD_TRAIN_MLM && p->best_metric == NOPAD_TRAIN_METRIC_ACCURACY)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: best_metric accuracy is "
                               "for classification (MLM has an eval loss)");
    return NOPAD_OK;
}

/* Everything one run holds, freed by run_free. */
typedef struct run {
    nopad_backend *be;
    nopad_tokenizer *tok;
    train_model model;
    train_dataset data, eval;
    train_loader loader, eval_loader;
    train_stream stream;    // the training data when streamed (then data and loader are unused)
    train_context ctx;
    train_dp dp;            // data-parallel over several ranks (then loader is unused)
    int32_t rank;           // in the run's communicator; rank 0 alone writes files
    FILE *log;
    int have_model, have_data, have_eval, have_loader, have_eval_loader, have_ctx, streaming, have_dp;
} run;

static void run_free(run *r) {
    if (r->log) fclose(r->log);
    if (r->have_ctx) train_context_free(&r->ctx);
    if (r->have_dp) train_dp_free(&r->dp);
    if (r->have_eval_loader) train_loader_free(&r->eval_loader);
    if (r->have_loader) train_loader_free(&r->loader);
    if (r->streaming) train_stream_close(&r->stream);
    if (r->have_eval) train_dataset_free(&r->eval);
    if (r->have_data) train_dataset_free(&r->data);
    if (r->have_model) train_model_free(&r->model);
    if (r->tok) nopad_tokenizer_free(r->tok);
    if (r->be) r->be->destroy(r->be);
}

static train_data_params data_params(const run *r, const nopad_train_params *p, const char *path) {
    train_data_params dp = train_data_default_params();
    dp.format = p->task == NOPAD_TRAIN_CLASSIFY || ends_with(path, ".jsonl") ? TRAIN_DATA_JSONL
                                                                            : TRAIN_DATA_LINES;
    dp.task = p->task == NOPAD_TRAIN_CLASSIFY ? TRAIN_TASK_CLASSIFY : TRAIN_TASK_MLM;
    dp.num_labels = r->model.num_labels;
    dp.max_length = r->model.cfg.max_position_embeddings;
    dp.vocab_size = r->model.cfg.vocab_size;
    dp.truncate = p->truncate;
    dp.whole_word = p->task == NOPAD_TRAIN_MLM && p->whole_word_mask;
    dp.pack = p->task == NOPAD_TRAIN_MLM && p->pack_lines;
    return dp;
}

static nopad_status load_data(run *r, const nopad_train_params *p, const char *path, train_dataset *out) {
    const train_data_params dp = data_params(r, p, path);
    return train_dataset_load(path, r->tok, &dp, out);
}

/* The training data's position: an epoch, the window of a streamed one (0 in memory) and the
 * examples of the epoch's (or window's) order already batched. */
static nopad_status data_seek(run *r, uint32_t epoch, int32_t window, int32_t cursor) {
    if (r->have_dp) return train_dp_seek(&r->dp, epoch, window, cursor);
    if (r->streaming) return train_stream_seek(&r->stream, epoch, window, cursor);
    if (window != 0)
        return nopad_set_error(NOPAD_ERR_FORMAT, "window %d of an epoch whose data is held in "
                               "memory (it has one)", window);
    return train_loader_seek(&r->loader, epoch, cursor);
}

/* The next batch of the epoch, or NULL at its end. */
static nopad_status data_next(run *r, const train_batch **batch) {
    int got = 0;
    if (r->streaming) {
        nopad_status st = train_stream_next(&r->stream, &got);
        if (st != NOPAD_OK) return st;
    } else {
        got = train_loader_next(&r->loader);
    }
    const train_loader *l = r->streaming ? &r->stream.loader : &r->loader;
    *batch = got ? &l->batch : NULL;
    return NOPAD_OK;
}

/* Every batch of every epoch, counted ahead (the packing of a shuffled order varies by epoch;
 * streamed data is read once an epoch for it, without training). */
static nopad_status count_steps(run *r, int32_t epochs, int64_t *total) {
    *total = 0;
    for (int32_t e = 0; e < epochs; e++) {
        if (r->have_dp) {
            int64_t n = 0;
            nopad_status st = train_dp_count_batches(&r->dp, (uint32_t)e, &n);
            if (st != NOPAD_OK) return st;
            *total += n;
            continue;
        }
        if (r->streaming) {
            int64_t n = 0;
            nopad_status st = train_stream_count_batches(&r->stream, (uint32_t)e, &n);
            if (st != NOPAD_OK) return st;
            *total += n;
            continue;
        }
        nopad_status st = train_loader_seek(&r->loader, (uint32_t)e, 0);
        if (st != NOPAD_OK) return st;
        while (train_loader_next(&r->loader)) (*total)++;
    }
    return NOPAD_OK;
}

/* The eval data's mean loss (over batches, weighted by their rows) and, for classification with
 * labels, the accuracy of the argmax of the logits. Data-parallel ranks take every size-th batch
 * from their rank on, and add up their sums in rank order, so every rank gets the same numbers. */
static nopad_status evaluate(run *r, nopad_train_result *out) {
    train_loader *l = &r->eval_loader;
    const int32_t C = r->model.num_labels;
    float *logits = NULL;
    if (r->model.task == TRAIN_TASK_CLASSIFY && C > 1) {
        logits = malloc((size_t)l->max_seqs * (size_t)C * sizeof *logits);
        if (!logits) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "evaluation: out of memory");
    }
    double loss_sum = 0;
    int64_t rows = 0, correct = 0, seqs = 0, batch = 0;
    const int32_t ranks = r->have_dp ? r->dp.size : 1, me = r->have_dp ? r->dp.rank : 0;
    /* the forward alone, without dropout (HF's model.eval()) */
    const float dropout = r->ctx.dropout, attention_dropout = r->ctx.attention_dropout;
    r->ctx.dropout = 0;
    r->ctx.attention_dropout = 0;
    nopad_status st = train_loader_seek(l, 0, 0);
    while (st == NOPAD_OK && train_loader_next(l)) {
        if (batch++ % ranks != me) continue;
        const train_batch *b = &l->batch;
        double loss = 0;
        st = train_forward(&r->ctx, b);
        if (st == NOPAD_OK) st = train_read_loss(&r->ctx, &loss);
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
    r->ctx.dropout = dropout;
    r->ctx.attention_dropout = attention_dropout;
    if (st != NOPAD_OK) return nopad_wrap_error(st, "evaluation");
    if (r->have_dp) {
        double *sums = calloc(4 * (size_t)ranks, sizeof *sums), *mine = sums + 4 * (size_t)me;
        if (!sums) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "evaluation: out of memory");
        mine[0] = loss_sum, mine[1] = (double)rows, mine[2] = (double)correct, mine[3] = (double)seqs;
        st = comm_all_gather(r->dp.comm, NULL, sums, mine, 4 * sizeof *sums, COMM_BYTE);
        loss_sum = 0, rows = correct = seqs = 0;
        for (int32_t k = 0; st == NOPAD_OK && k < ranks; k++) {
            loss_sum += sums[4 * k];
            rows += (int64_t)sums[4 * k + 1], correct += (int64_t)sums[4 * k + 2];
            seqs += (int64_t)sums[4 * k + 3];
        }
        free(sums);
        if (st != NOPAD_OK) return nopad_wrap_error(st, "evaluation");
    }
    out->eval_examples = (int32_t)seqs;
    out->eval_loss = rows ? loss_sum / (double)rows : -1;
    out->eval_accuracy = r->model.task == TRAIN_TASK_CLASSIFY && C > 1 && seqs ?
                             (double)correct / (double)seqs : -1;
    return NOPAD_OK;
}

/* `x` in the fewest digits that read back to it (0.003, not 0.0030000000000000001). */
static const char *shortest(double x, char buf[32]) {
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, 32, "%.*g", digits, x);
        if (strtod(buf, NULL) == x) break;
    }
    return buf;
}

/* A float as the double of its shortest decimal (0.1f as 0.1, not 0.100000001): how a float
 * setting is named; distinct floats stay distinct. */
static double float_decimal(float x) {
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
        if ((float)strtod(buf, NULL) == x) break;
    }
    return strtod(buf, NULL);
}

/* A resumed run must be the saved one continued: the same optimiser, schedule, data order and
 * batches, or its steps would not be those of a run that did not stop. Each mismatch is named
 * with both values. */
static nopad_status check_resume(const nopad_train_params *p, const train_state *want,
                                 const train_state *saved, const train_model *m) {
    const char *dir = p->resume_dir;
    static const char hint[] = "a resumed run keeps the settings it was started with (to train on "
                               "with others, start a new run from the folder as the model)";
    if (want->kind != saved->kind)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "resuming %s: optimizer %s, but the "
                               "checkpoint was trained with %s; %s", dir,
                               train_optimizer_kind_name(want->kind),
                               train_optimizer_kind_name(saved->kind), hint);
    if (p->num_labels != 0 && p->num_labels != m->num_labels)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "resuming %s: num_labels %d, but the "
                               "checkpoint's classifier has %d; %s", dir, p->num_labels,
                               m->num_labels, hint);
    if (want->data_seed != saved->data_seed)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "resuming %s: seed %" PRIu64 ", but the "
                               "checkpoint's is %" PRIu64 "; %s", dir, want->data_seed,
                               saved->data_seed, hint);
    const struct { const char *what; double given, saved; } numbers[] = {
        {"epochs", want->epochs, saved->epochs},
        {"batch_tokens", want->batch_tokens, saved->batch_tokens},
        {"batch_seqs", want->batch_seqs, saved->batch_seqs},
        {"learning rate", want->schedule.lr, saved->schedule.lr},
        {"warmup steps", (double)want->schedule.warmup_steps, (double)saved->schedule.warmup_steps},
        {"weight decay", float_decimal(want->opt.weight_decay), float_decimal(saved->opt.weight_decay)},
        {"max_grad_norm", float_decimal(want->opt.max_grad_norm), float_decimal(saved->opt.max_grad_norm)},
        {"eps", float_decimal(want->opt.eps), float_decimal(saved->opt.eps)},
        {"dropout", float_decimal(want->dropout), float_decimal(saved->dropout)},
        {"attention_dropout", float_decimal(want->attention_dropout),
         float_decimal(saved->attention_dropout)},
        {"whole_word_mask", want->whole_word, saved->whole_word},
        {"pack_lines", want->pack_lines, saved->pack_lines},
        {"stream buffer (0: the data held in memory)", (double)want->stream_buffer,
         (double)saved->stream_buffer},
    };
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++)
        if (numbers[i].given != numbers[i].saved) {
            char a[32], b[32];
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "resuming %s: %s %s, but the "
                                   "checkpoint's is %s; %s", dir, numbers[i].what,
                                   shortest(numbers[i].given, a), shortest(numbers[i].saved, b), hint);
        }
    if (want->schedule.kind != saved->schedule.kind)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "resuming %s: schedule %s, but the "
                               "checkpoint's is %s; %s", dir,
                               train_schedule_kind_name(want->schedule.kind),
                               train_schedule_kind_name(saved->schedule.kind), hint);
    if (want->schedule.total_steps != saved->schedule.total_steps)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "resuming %s: the data gives %lld steps "
                               "over %d epochs, but the checkpoint's run had %lld (another data "
                               "file?)", dir, (long long)want->schedule.total_steps, want->epochs,
                               (long long)saved->schedule.total_steps);
    if (m->step > saved->schedule.total_steps)
        return nopad_set_error(NOPAD_ERR_FORMAT, "resuming %s: step %lld is past the run's %lld "
                               "steps", dir, (long long)m->step,
                               (long long)saved->schedule.total_steps);
    return NOPAD_OK;
}

/* One JSON array of int32 to the log. */
static void log_ints(FILE *f, const char *key, const int32_t *v, int32_t n) {
    fprintf(f, ", \"%s\": [", key);
    for (int32_t i = 0; i < n; i++) fprintf(f, i ? ",%d" : "%d", v[i]);
    fputc(']', f);
}

/* The step's line of the JSONL log: what it computed, and with log_batches the batch itself. */
static nopad_status log_step(run *r, const nopad_train_params *p, const nopad_train_progress *pr,
                             const train_batch *b, const int32_t *seq_ranks, int32_t batch_tokens) {
    FILE *f = r->log;
    fprintf(f, "{\"step\": %lld, \"epoch\": %d, \"loss\": %.17g, \"lr\": %.9g, "
               "\"grad_norm\": %.9g, \"tokens\": %d", (long long)pr->step, (int)pr->epoch,
            pr->loss, pr->lr, pr->grad_norm, batch_tokens);
    if (r->have_dp) { /* the tokens each rank held: the most loaded before and after the exchange */
        const train_dp_balance *bal = &r->dp.step_balance;
        fprintf(f, ", \"ranks\": %d, \"rank_tokens_max_before\": %lld, \"rank_tokens_max\": %lld, "
                   "\"moved_sequences\": %lld", (int)r->dp.size, (long long)bal->max_before,
                (long long)bal->max_after, (long long)bal->moved_seqs);
    }
    if (p->log_batches && b) {
        const int32_t T = b->cu_seqlens[b->n_seqs];
        log_ints(f, "cu_seqlens", b->cu_seqlens, b->n_seqs + 1);
        log_ints(f, "input_ids", b->tokens, T);
        if (b->types) log_ints(f, "token_type_ids", b->types, T);
        if (r->model.task == TRAIN_TASK_MLM) {
            log_ints(f, "mlm_positions", b->mlm_positions, b->n_masked);
            log_ints(f, "mlm_labels", b->mlm_labels, b->n_masked);
        } else if (b->labels && r->model.num_labels > 1) {
            log_ints(f, "labels", b->labels, b->n_seqs);
        } else if (b->targets) {
            fputs(", \"targets\": [", f);
            for (int32_t s = 0; s < b->n_seqs; s++) fprintf(f, s ? ",%.9g" : "%.9g", (double)b->targets[s]);
            fputc(']', f);
        }
        if (seq_ranks) log_ints(f, "sequence_ranks", seq_ranks, b->n_seqs); /* who computed each */
    }
    fputs("}\n", f);
    if (ferror(f))
        return nopad_set_error(NOPAD_ERR_IO, "%s: write failed: %s", p->log_path, strerror(errno));
    return NOPAD_OK;
}

/* Rank 0 writes the checkpoint (every rank holds the same weights and moments). */
static nopad_status save(run *r, const nopad_train_params *p, const train_state *state) {
    if (r->rank != 0) return NOPAD_OK;
    return train_checkpoint_save(&r->model, state, p->output_dir, p->model_dir);
}

/* output_dir/best, the best evaluation's weights. */
static void best_dir(const nopad_train_params *p, const char *root, char out[4096]) {
    snprintf(out, 4096, "%s/best", root ? root : p->output_dir);
}

/* The weights of evaluation `e` to output_dir/best, with the tokenizer files. */
static nopad_status save_best(run *r, const nopad_train_params *p, const train_eval *e,
                              train_metric metric) {
    if (mkdir(p->output_dir, 0755) != 0 && errno != EEXIST)
        return nopad_set_error(NOPAD_ERR_IO, "%s: cannot create the folder: %s", p->output_dir,
                               strerror(errno));
    char dir[4096];
    best_dir(p, NULL, dir);
    nopad_status st = train_checkpoint_save_weights(&r->model, e, metric, dir, p->model_dir);
    return st == NOPAD_OK ? NOPAD_OK : nopad_wrap_error(st, "saving the best weights (step %lld)",
                                                        (long long)e->step);
}

/* The evaluation's line of the JSONL log. */
static nopad_status log_eval(run *r, const nopad_train_params *p, const nopad_train_eval *e) {
    FILE *f = r->log;
    fprintf(f, "{\"step\": %lld, \"epoch\": %d, \"eval_loss\": %.17g", (long long)e->step,
            (int)e->epoch, e->loss);
    if (e->accuracy >= 0) fprintf(f, ", \"eval_accuracy\": %.17g", e->accuracy);
    fprintf(f, ", \"eval_examples\": %d, \"is_best\": %s}\n", e->examples,
            e->is_best ? "true" : "false");
    if (fflush(f) != 0 || ferror(f))
        return nopad_set_error(NOPAD_ERR_IO, "%s: write failed: %s", p->log_path, strerror(errno));
    return NOPAD_OK;
}

/* The best evaluation so far and how many came after it, into the public form. */
static void describe_eval(const train_state *state, int32_t i, nopad_train_eval *out) {
    const train_eval *e = &state->evals[i];
    const int32_t best = train_state_best(state);
    const train_eval *b = &state->evals[best];
    *out = (nopad_train_eval){
        .step = e->step, .epoch = e->epoch, .examples = e->examples, .loss = e->loss,
        .accuracy = e->accuracy,
        .metric = state->metric == TRAIN_METRIC_ACCURACY ? NOPAD_TRAIN_METRIC_ACCURACY
                                                         : NOPAD_TRAIN_METRIC_LOSS,
        .is_best = best == i, .best_step = b->step,
        .best_value = state->metric == TRAIN_METRIC_ACCURACY ? b->accuracy : b->loss,
        .since_best = i - best, .evaluations = i + 1};
}

/* Whether the history's last evaluation is of step `step`. */
static int evaluated_at(const train_state *state, int64_t step) {
    return state->n_evals > 0 && state->evals[state->n_evals - 1].step == step;
}

/* One evaluation of the run's history, after the step just taken: evaluates, records it in the
 * state (saved with the next checkpoint), saves the weights when it is the best and save_best
 * asks, logs it and tells on_eval. *stop is set when on_eval asks or early_stop says so. */
static nopad_status record_eval(run *r, const nopad_train_params *p, train_state *state,
                                int32_t epoch, nopad_train_result *out, int *stop) {
    nopad_train_result res;
    nopad_status st = evaluate(r, &res);
    if (st != NOPAD_OK) return nopad_wrap_error(st, "at step %lld", (long long)r->model.step);
    const train_eval e = {.step = r->model.step, .epoch = epoch, .examples = res.eval_examples,
                          .loss = res.eval_loss, .accuracy = res.eval_accuracy};
    st = train_state_add_eval(state, &e);
    if (st != NOPAD_OK) return st;
    nopad_train_eval ev;
    describe_eval(state, state->n_evals - 1, &ev);
    if (ev.is_best && p->save_best && r->rank == 0) {
        st = save_best(r, p, &e, state->metric);
        if (st != NOPAD_OK) return st;
    }
    if (r->log) {
        st = log_eval(r, p, &ev);
        if (st != NOPAD_OK) return st;
    }
    if (p->on_eval && p->on_eval(p->user, &ev) != 0) *stop = 1;
    if (p->early_stop > 0 && train_state_stale(state, p->early_stop_min_delta) >= p->early_stop)
        *stop = out->early_stopped = 1;
    return NOPAD_OK;
}

/* Resuming with save_best: the checkpoint's best evaluation must have its weights in
 * resume_dir/best (a later one of the same run is retaken, so it may be ahead when that is
 * output_dir/best too); from another folder they are copied into output_dir/best. */
static nopad_status resume_best(const nopad_train_params *p, const train_state *state) {
    const int32_t b = train_state_best(state);
    if (!p->save_best || b < 0) return NOPAD_OK;
    const int64_t want = state->evals[b].step;
    char from[4096], to[4096];
    best_dir(p, p->resume_dir, from);
    best_dir(p, NULL, to);
    int64_t have = -1;
    char why[512] = "another step's are there";
    nopad_status st = train_checkpoint_weights_step(from, &have);
    if (st != NOPAD_OK) snprintf(why, sizeof why, "%s", nopad_last_error());
    struct stat sf, so;
    const int same = stat(p->resume_dir, &sf) == 0 && stat(p->output_dir, &so) == 0 &&
                     sf.st_dev == so.st_dev && sf.st_ino == so.st_ino;
    if (st != NOPAD_OK || have < want || (have > want && !same))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "resuming %s with save_best: its best "
                               "evaluation (step %lld) has no weights in %s (%s); resume from the "
                               "folder the run saved to, or without save_best", p->resume_dir,
                               (long long)want, from, why);
    if (same) return NOPAD_OK;
    if (mkdir(p->output_dir, 0755) != 0 && errno != EEXIST)
        return nopad_set_error(NOPAD_ERR_IO, "%s: cannot create the folder: %s", p->output_dir,
                               strerror(errno));
    /* written whole, as a save writes it */
    static const char *const weights[] = {"model.safetensors", "config.json", "eval_results.json"};
    char stage[4096];
    st = folder_stage_begin(to, stage, sizeof stage);
    if (st != NOPAD_OK) return st;
    st = copy_files(from, stage, weights, 3);
    if (st == NOPAD_OK) st = copy_files(from, stage, TRAIN_TOKENIZER_FILES, TRAIN_N_TOKENIZER_FILES);
    if (st == NOPAD_OK) return folder_stage_commit(to, stage);
    folder_stage_abort(stage);
    return st;
}

nopad_status nopad_train(const nopad_train_params *p, nopad_train_result *out) {
    if (!p || !out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: NULL argument");
    /* under a launcher, its world trains data-parallel; NOPAD_COMM_FORCE sends one process through
     * the same path, its collectives through MPI or NCCL (the path's cost, measured alone) */
    const int32_t world = nopad_world_size();
    nopad_comm *comm = NULL;
    if (world > 1 || knob_int(KNOB_COMM_FORCE)) {
        nopad_status st = comm_world(world, &comm);
        if (st != NOPAD_OK) return nopad_wrap_error(st, "nopad_train over the launcher's %d processes",
                                                    (int)world);
    }
    nopad_status st = train_run(p, comm, p->dp_exchange != 0, out);
    comm_free(comm);
    return st;
}

nopad_status train_run(const nopad_train_params *p, nopad_comm *comm, int exchange,
                       nopad_train_result *out) {
    if (!p || !out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: NULL argument");
    memset(out, 0, sizeof *out);
    out->eval_accuracy = out->eval_loss = out->best_value = -1;
    const int32_t ranks = comm ? comm_size(comm) : 1;
    const int parallel = comm != NULL; /* the data-parallel path, at any size (one: forced) */
    run r = {0};
    r.rank = comm ? comm_rank(comm) : 0;
    nopad_status st = check_params(p);
    if (st != NOPAD_OK) return st;
    const train_task task = p->task == NOPAD_TRAIN_CLASSIFY ? TRAIN_TASK_CLASSIFY : TRAIN_TASK_MLM;
#define CHECK(expr)                                                                                \
    do {                                                                                           \
        st = (expr);                                                                               \
        if (st != NOPAD_OK) goto done;                                                             \
    } while (0)
    /* the device's backend; train_model_load refuses one without the training ops, naming one */
    /* with several ranks on CUDA, each takes a GPU of its machine: device_index + its local rank */
    const int32_t device_index = p->device_index + (parallel && p->device == NOPAD_DEVICE_CUDA
                                                        ? comm_local_rank(comm) : 0);
    const nopad_backend_params bp = {.device = p->device, .device_index = device_index,
                                     .dtype = p->dtype, .n_threads = p->n_threads};
    train_state saved = {0}, state = {0}; /* their histories freed at the end */
    /* what an interrupted save left (util/file.h): the folders whole again, no temporaries */
    char best_out[4096];
    best_dir(p, NULL, best_out);
    struct stat out_info; /* refused now rather than at the first save, after the steps */
    if (r.rank == 0) { /* the folders rank 0 writes; the others read resume_dir once it is whole */
        if (stat(p->output_dir, &out_info) == 0 && !S_ISDIR(out_info.st_mode))
            st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "output_dir %s is a file, not a folder",
                                 p->output_dir);
        if (st == NOPAD_OK) st = folder_stage_check(p->output_dir);
        if (st == NOPAD_OK) st = folder_stage_recover(p->output_dir);
        if (st == NOPAD_OK) st = folder_stage_recover(best_out);
        if (st == NOPAD_OK && p->resume_dir) st = folder_stage_recover(p->resume_dir);
    }
    if (parallel) st = train_dp_agree(comm, st, "nopad_train: the output and resume folders");
    if (st != NOPAD_OK) goto done;
    CHECK(nopad_backend_create(&bp, &r.be));
    if (p->resume_dir) {
        st = train_checkpoint_load(r.be, p->resume_dir, task, &r.model, &saved);
        if (st != NOPAD_OK) {
            st = nopad_wrap_error(st, "resuming from %s", p->resume_dir);
            goto done;
        }
        out->resumed_step = r.model.step;
    } else {
        CHECK(train_model_load_new_head(r.be, p->model_dir, task, p->num_labels, p->seed, &r.model));
    }
    r.have_model = 1;
    CHECK(nopad_tokenizer_load(p->model_dir, &r.tok));
    out->num_labels = r.model.num_labels;
    out->new_head = r.model.new_head;
    /* what the best evaluation is by: accuracy where there is one, unless asked otherwise */
    const int periodic = p->eval_every > 0 || p->eval_every_epoch;
    const int has_accuracy = r.model.task == TRAIN_TASK_CLASSIFY && r.model.num_labels > 1;
    if (p->best_metric == NOPAD_TRAIN_METRIC_ACCURACY && !has_accuracy) {
        st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: best_metric accuracy, but "
                             "a one-label head (regression) has only an eval loss");
        goto done;
    }
    const train_metric metric = !periodic ? TRAIN_METRIC_NONE
                              : p->best_metric == NOPAD_TRAIN_METRIC_LOSS ? TRAIN_METRIC_LOSS
                              : p->best_metric == NOPAD_TRAIN_METRIC_ACCURACY || has_accuracy
                                  ? TRAIN_METRIC_ACCURACY : TRAIN_METRIC_LOSS;
    /* a batch holds at least one example of the longest; with several ranks the global batch is
     * theirs together, each rank's forward the budget given */
    const int32_t max_len = r.model.cfg.max_position_embeddings;
    const int32_t budget = p->batch_tokens > max_len ? p->batch_tokens : max_len;
    const int64_t global_tokens64 = (int64_t)ranks * p->batch_tokens;
    const int64_t global_seqs64 = (int64_t)ranks * p->batch_seqs;
    if (global_tokens64 > INT32_MAX || global_seqs64 > INT32_MAX) {
        st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_train: %d ranks of %d tokens and %d "
                             "sequences: a global batch over %d", (int)ranks, p->batch_tokens,
                             p->batch_seqs, INT32_MAX);
        goto done;
    }
    const int32_t global_tokens = global_tokens64 > max_len ? (int32_t)global_tokens64 : max_len;
    if (parallel && p->stream) { /* each rank reads its blocks of each window */
        const train_data_params dp = data_params(&r, p, p->data_path);
        const train_stream_params sp = train_stream_params_for_buffer(p->stream_buffer);
        CHECK(train_stream_open_share(p->data_path, r.tok, &dp, &sp, budget, p->batch_seqs, p->seed, r.rank,
                                      ranks, train_dp_sum_counts, comm, &r.stream));
        r.streaming = 1;
        CHECK(train_dp_init_stream(comm, exchange, &r.model, &r.stream, budget, p->batch_seqs, global_tokens,
                                   (int32_t)global_seqs64, p->seed, &r.dp));
        r.have_dp = 1;
        out->n_examples = r.stream.n_examples < INT32_MAX ? (int32_t)r.stream.n_examples : INT32_MAX;
        out->n_truncated = r.stream.n_truncated < INT32_MAX ? (int32_t)r.stream.n_truncated : INT32_MAX;
    } else if (parallel) {
        const train_data_params dp = data_params(&r, p, p->data_path);
        st = train_dataset_load_shard(p->data_path, r.tok, &dp, r.rank, ranks, &r.data);
        r.have_data = st == NOPAD_OK;
        CHECK(train_dp_agree(comm, st, "reading the training data"));
        CHECK(train_dp_init(comm, exchange, &r.model, &r.data, budget, p->batch_seqs, global_tokens,
                            (int32_t)global_seqs64, p->seed, &r.dp));
        r.have_dp = 1;
        int32_t truncated = r.data.n_truncated;
        CHECK(comm_all_reduce(comm, NULL, &truncated, 1, COMM_I32, COMM_SUM));
        out->n_examples = r.dp.n_examples;
        out->n_truncated = truncated;
    } else if (p->stream) {
        const train_data_params dp = data_params(&r, p, p->data_path);
        const train_stream_params sp = train_stream_params_for_buffer(p->stream_buffer);
        CHECK(train_stream_open(p->data_path, r.tok, &dp, &sp, budget, p->batch_seqs, p->seed,
                                &r.stream));
        r.streaming = 1;
        out->n_examples = r.stream.n_examples < INT32_MAX ? (int32_t)r.stream.n_examples : INT32_MAX;
        out->n_truncated = r.stream.n_truncated < INT32_MAX ? (int32_t)r.stream.n_truncated : INT32_MAX;
    } else {
        CHECK(load_data(&r, p, p->data_path, &r.data));
        r.have_data = 1;
        out->n_examples = r.data.n_examples;
        out->n_truncated = r.data.n_truncated;
        CHECK(train_loader_init(&r.data, budget, p->batch_seqs, p->seed, &r.loader));
        r.have_loader = 1;
    }
    if (p->eval_path) { /* evaluation data is held in memory */
        CHECK(load_data(&r, p, p->eval_path, &r.eval));
        r.have_eval = 1;
    }
    if (r.have_eval) {
        CHECK(train_loader_init(&r.eval, budget, p->batch_seqs, p->seed, &r.eval_loader));
        r.have_eval_loader = 1;
    }
    CHECK(train_context_init(&r.model, budget, p->batch_seqs, &r.ctx));
    r.have_ctx = 1;
    r.ctx.dropout = p->dropout < 0 ? r.model.cfg.hidden_dropout_prob : (float)p->dropout;
    /* unset, it follows an explicit dropout (one knob turns both off), else the config's */
    r.ctx.attention_dropout = p->attention_dropout >= 0 ? (float)p->attention_dropout
                            : p->dropout >= 0           ? (float)p->dropout
                                                        : r.model.cfg.attention_probs_dropout_prob;
    if (p->resume_dir) { /* resumed, an unset rate is the one the run trained with (a checkpoint
                          * saved before attention dropout existed recorded 0, and its config.json
                          * has no attention_probs_dropout_prob, which defaults to 0.1) */
        if (p->dropout < 0) r.ctx.dropout = saved.dropout;
        if (p->dropout < 0 && p->attention_dropout < 0) r.ctx.attention_dropout = saved.attention_dropout;
    }
    r.ctx.dropout_seed = p->seed ^ 0xD1B54A32D192ED03ull; /* not the data's stream */

    int64_t total = 0;
    CHECK(count_steps(&r, p->epochs, &total));
    state = (train_state){.kind = p->optimizer == NOPAD_TRAIN_LAMB ? TRAIN_OPT_LAMB : TRAIN_OPT_ADAMW,
                          .opt = train_optimizer_defaults(), .schedule = train_schedule_defaults(),
                          .data_seed = p->seed, .epochs = p->epochs,
                          .batch_tokens = (int32_t)global_tokens64,
                          .batch_seqs = (int32_t)global_seqs64,
                          .dropout = r.ctx.dropout, .attention_dropout = r.ctx.attention_dropout,
                          .stream_buffer = p->stream ? p->stream_buffer : 0,
                          .metric = metric, .whole_word = p->whole_word_mask,
                          .pack_lines = p->pack_lines};
    state.schedule.lr = p->lr;
    state.schedule.total_steps = total;
    state.schedule.warmup_steps = p->warmup_steps >= 0
                                      ? p->warmup_steps
                                      : train_schedule_warmup_steps(p->warmup_ratio, total);
    state.opt.weight_decay = (float)p->weight_decay;
    state.opt.max_grad_norm = (float)p->max_grad_norm;
    if (p->optimizer == NOPAD_TRAIN_ADAMW) state.opt.eps = 1e-8f; /* torch's AdamW, HF's default */
    if (p->resume_dir) {
        CHECK(check_resume(p, &state, &saved, &r.model));
        state.epoch = saved.epoch;
        state.window = saved.window;
        state.cursor = saved.cursor;
        /* the evaluations so far, and with them the best: kept by a run that evaluates no more,
         * and by the default metric (one asked for must be the checkpoint's) */
        if (saved.metric != TRAIN_METRIC_NONE) {
            if (p->best_metric != NOPAD_TRAIN_METRIC_AUTO && metric != TRAIN_METRIC_NONE &&
                metric != saved.metric) {
                st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "resuming %s: best metric %s, but "
                                     "the checkpoint's is %s (its best evaluation would not be "
                                     "this run's)", p->resume_dir, train_metric_name(metric),
                                     train_metric_name(saved.metric));
                goto done;
            }
            state.metric = saved.metric;
            state.evals = saved.evals, state.n_evals = saved.n_evals;
            saved.evals = NULL, saved.n_evals = 0;
        }
        if (r.rank == 0) st = resume_best(p, &state);
        if (parallel) st = train_dp_agree(comm, st, "resuming the best weights");
        if (st != NOPAD_OK) goto done;
    }
    if (r.rank == 0 && p->log_path && !(r.log = fopen(p->log_path, "w"))) {
        st = nopad_set_error(NOPAD_ERR_IO, "%s: cannot create the log: %s", p->log_path, strerror(errno));
        goto done;
    }

    const double start = seconds();
    const int64_t first_step = r.model.step;
    int64_t tokens = 0;
    int stop = 0;
    /* a run that stopped early stays stopped (unless resumed with more patience) */
    if (periodic && p->early_stop > 0 && state.n_evals > 0 &&
        train_state_stale(&state, p->early_stop_min_delta) >= p->early_stop)
        stop = out->early_stopped = 1;
    /* a resumed run starts where the checkpoint's loader stood (an epoch's end moves on) */
    for (uint32_t e = state.epoch; e < (uint32_t)p->epochs && !stop; e++) {
        const int resumed = e == state.epoch;
        CHECK(data_seek(&r, e, resumed ? state.window : 0, resumed ? state.cursor : 0));
        while (!stop) {
            const train_batch *b = NULL;
            int32_t batch_tokens = 0;
            const int64_t step = r.model.step; /* updates already taken */
            double loss = 0;
            if (r.have_dp) {
                int got = 0;
                CHECK(train_dp_next(&r.dp, &got));
                if (!got) break;
                batch_tokens = r.dp.batch_tokens;
                st = train_dp_forward_backward(&r.dp, &r.ctx, &loss);
            } else {
                CHECK(data_next(&r, &b));
                if (!b) break;
                batch_tokens = b->cu_seqlens[b->n_seqs];
                st = train_forward_backward(&r.ctx, b, &loss);
            }
            if (st != NOPAD_OK) {
                st = nopad_wrap_error(st, "step %lld (epoch %u)", (long long)step + 1, e + 1);
                goto done;
            }
            state.opt.lr = (float)train_schedule_lr(&state.schedule, step);
            float norm = 0;
            if (state.kind == TRAIN_OPT_LAMB) {
                CHECK(train_lamb_step(&r.model, &state.opt, &norm));
            } else {
                CHECK(train_clip_grad_norm(&r.model, state.opt.max_grad_norm, &norm));
                CHECK(train_adamw_step(&r.model, &state.opt));
            }
            tokens += batch_tokens;
            if (step == first_step) out->first_loss = loss;
            out->last_loss = loss;
            state.epoch = e;
            state.window = r.streaming ? r.stream.window : 0;
            state.cursor = r.have_dp ? r.dp.cursor : r.streaming ? r.stream.loader.cursor : r.loader.cursor;
            const nopad_train_progress pr = {
                .step = r.model.step, .total_steps = total, .epoch = (int32_t)e,
                .epochs = p->epochs, .loss = loss, .lr = state.opt.lr, .grad_norm = norm,
                .tokens = tokens, .elapsed_s = seconds() - start};
            const int32_t *seq_ranks = NULL;
            if (r.have_dp && p->log_batches && p->log_path) /* the global batch, on rank 0 */
                CHECK(train_dp_gather_batch(&r.dp, 0, &b, &seq_ranks));
            if (r.log) CHECK(log_step(&r, p, &pr, b, seq_ranks, batch_tokens));
            /* evaluated before the save, so a checkpoint holds the evaluations of its steps */
            if (p->eval_every > 0 && r.model.step % p->eval_every == 0)
                CHECK(record_eval(&r, p, &state, (int32_t)e, out, &stop));
            if (p->save_every > 0 && r.model.step % p->save_every == 0) CHECK(save(&r, p, &state));
            if (p->on_step && p->on_step(p->user, &pr) != 0) stop = 1;
            if (r.have_dp) CHECK(train_dp_any(&r.dp, &stop)); /* a stop on any rank stops all */
        }
        /* the epoch's end (a run stopped on its last step evaluates it when resumed) */
        if (!stop && p->eval_every_epoch && !evaluated_at(&state, r.model.step)) {
            CHECK(record_eval(&r, p, &state, (int32_t)e, out, &stop));
            if (r.have_dp) CHECK(train_dp_any(&r.dp, &stop));
        }
    }
    if (r.have_dp) { /* the exchange's effect, in tokens per rank and step (the CLI prints it) */
        const train_dp_balance *b = &r.dp.run_balance;
        out->dp_ranks = ranks;
        out->dp_steps = b->steps;
        out->dp_tokens = b->total;
        out->dp_max_read = b->max_before;
        out->dp_max_computed = b->max_after;
        out->dp_moved_seqs = b->moved_seqs;
        out->dp_moved_tokens = b->moved_tokens;
    }
    out->steps = r.model.step;
    /* the run's last step is evaluated too when evaluations are recorded */
    if (periodic && r.model.step == total && !evaluated_at(&state, r.model.step))
        CHECK(record_eval(&r, p, &state, (int32_t)state.epoch, out, &stop));
    CHECK(save(&r, p, &state));
    if (r.have_eval && evaluated_at(&state, r.model.step)) {
        const train_eval *last = &state.evals[state.n_evals - 1];
        out->eval_examples = last->examples;
        out->eval_loss = last->loss;
        out->eval_accuracy = last->accuracy;
    } else if (r.have_eval) {
        CHECK(evaluate(&r, out));
    }
    out->evaluations = state.n_evals;
    const int32_t best = train_state_best(&state);
    if (best >= 0) {
        out->best_metric = state.metric == TRAIN_METRIC_ACCURACY ? NOPAD_TRAIN_METRIC_ACCURACY
                                                                 : NOPAD_TRAIN_METRIC_LOSS;
        out->best_step = state.evals[best].step;
        out->best_value = state.metric == TRAIN_METRIC_ACCURACY ? state.evals[best].accuracy
                                                                : state.evals[best].loss;
    }
#undef CHECK
done:
    run_free(&r);
    train_state_free(&state);
    train_state_free(&saved);
    return st;
}
