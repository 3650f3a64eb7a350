/* `nopad train`: fine-tune (classification) or train with masked LM a BERT model, with a progress
 * line on stderr, and save an HF model folder (nopad_train in include/nopad.h); --resume
 * continues a saved run. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "nopad.h"

static const char train_help[] =
    "usage: nopad train --model DIR --task mlm|classify --data FILE --output DIR [options]\n"
    "\n"
    "Trains a BERT model (CPU: float32) on packed batches with no padding, and saves an HF\n"
    "model folder (config.json, model.safetensors, the tokenizer files) plus the optimiser state\n"
    "to --output. The defaults fine-tune a small model such as all-MiniLM-L6-v2 without tuning:\n"
    "AdamW, learning rate 5e-5 with a linear warmup over 10% of the steps and a linear decay to 0,\n"
    "gradients clipped to norm 1, 3 epochs, batches of at most 4096 tokens and 32 sequences.\n"
    "\n"
    "data:\n"
    "  classify   JSONL, one object a line: {\"text\": ..., \"label\": 0..N-1} (and \"text_pair\"\n"
    "             for pairs); with --num-labels 1 the label is any number (regression)\n"
    "  mlm        one text example a line (or JSONL {\"text\": ...} when FILE ends in .jsonl);\n"
    "             15% of the tokens masked afresh each epoch (--whole-word-mask: of the words)\n"
    "\n"
    "options:\n"
    "  --model DIR         HF BERT folder with its tokenizer [required]\n"
    "  --task T            mlm or classify [required]\n"
    "  --data FILE         training data [required]\n"
    "  --output DIR        where to save the checkpoint (created; its parent must exist) [required]\n"
    "  --num-labels N      classify: the number of labels; when the model has no classifier (a\n"
    "                      plain BertModel or sentence-transformers folder) a new pooler and\n"
    "                      classifier are created (HF's initialisation, from --seed)\n"
    "  --eval FILE         data to evaluate after training: prints 'eval accuracy: X' (classify)\n"
    "                      or 'eval loss: X' (mlm, regression) on stdout\n"
    "  --eval-every N      also evaluate --eval after every N steps (or 'epoch': at the end of\n"
    "                      each epoch), and at the last step: a line each on stdout, a line in\n"
    "                      --log, the history in trainer_state.json\n"
    "  --save-best         keep the weights of the best evaluation in OUTPUT/best (a model folder\n"
    "                      like OUTPUT; eval_results.json names its step); OUTPUT gets the last\n"
    "  --best-metric M     what 'best' is: accuracy (higher; the default for classify) or loss\n"
    "                      (lower; the default for mlm and regression); a tie keeps the earlier\n"
    "  --early-stop K      stop after K evaluations in a row without improving on the best\n"
    "  --early-stop-min-delta X\n"
    "                      an improvement counts for --early-stop only when the metric beats\n"
    "                      the last counted one by more than X (default 0)\n"
    "  --epochs N          passes over the data (default 3)\n"
    "  --lr X              peak learning rate (default 5e-5)\n"
    "  --warmup X          warmup: a fraction of the steps when below 1 (default 0.1), else a\n"
    "                      number of steps\n"
    "  --batch-tokens N    token budget of a batch (default 4096; at least the model maximum)\n"
    "  --batch-seqs N      at most N sequences a batch (default 32)\n"
    "  --optimizer O       adamw (default) or lamb\n"
    "  --weight-decay X    default 0.01 (not on biases and LayerNorm parameters)\n"
    "  --max-grad-norm X   gradient clipping by global norm (default 1; 0: none)\n"
    "  --dropout P         dropout after the embeddings and each sub-layer, in [0, 1) (default:\n"
    "                      config.json's hidden_dropout_prob, BERT's 0.1; 0: off)\n"
    "  --attention-dropout P\n"
    "                      dropout of the attention probabilities (default: --dropout when\n"
    "                      given, else config.json's attention_probs_dropout_prob, BERT's 0.1;\n"
    "                      0: off; with --resume, unset rates are the checkpoint's)\n"
    "  --seed N            data order, masking and a new head's weights (default 42)\n"
    "  --save-every N      also save the checkpoint to --output every N steps\n"
    "  --resume DIR        continue the run saved in DIR (by --save-every or at the end): its\n"
    "                      weights, optimiser moments, step, schedule and place in the data; give\n"
    "                      the flags the run was started with (another --optimizer, --lr, --epochs,\n"
    "                      batch budget or --seed is an error naming both values); DIR may be\n"
    "                      --output\n"
    "  --stop-after N      stop after step N (the schedule still spans the whole run), saving the\n"
    "                      checkpoint; --resume continues it\n"
    "  --log FILE          one JSON line a step: step, epoch, loss, lr, grad_norm, tokens\n"
    "  --device D          cpu (default) or cuda\n"
    "  --dtype T           cuda: bf16 (default) or fp16 compute, float32 master weights; the CPU\n"
    "                      trains in fp32\n"
    "  --truncate          cut examples longer than the model maximum; without it such a line\n"
    "                      is an error naming it\n"
    "  --whole-word-mask   mlm: mask whole words (a WordPiece piece and the '##' pieces after\n"
    "                      it) instead of single pieces\n"
    "  --pack-lines        mlm: concatenate the lines (each with its [CLS] ... [SEP]) and cut\n"
    "                      them into examples of the model maximum, as HF's run_mlm.py without\n"
    "                      --line_by_line; the data is held in memory\n"
    "  --stream            read the training data a window at a time instead of tokenizing it\n"
    "                      whole into memory (4 bytes a token): memory bounded by the window\n"
    "                      whatever the corpus size; blocks of the file shuffled per epoch, the\n"
    "                      examples of a window shuffled together. The default for data over\n"
    "                      1 GiB a process (said on stderr); --no-stream holds such data in\n"
    "                      memory. With --nproc each process reads its 1/N of each window\n"
    "  --stream-buffer S   the text a streamed window holds (default 64M; k, M, G suffixes;\n"
    "                      at least 1k): more mixes the data better; the loader holds about\n"
    "                      2.5x S (English text, WordPiece), 1/N of it a process with --nproc\n"
    "  --nproc N           train data-parallel over N processes of this machine (one per GPU with\n"
    "                      --device cuda), started under mpirun: each reads 1/N of --data and\n"
    "                      computes a batch of --batch-tokens and --batch-seqs, so a step's batch\n"
    "                      is N times that (the run of one process given N times the budgets,\n"
    "                      whose checkpoints it reads and writes); each step's sequences are\n"
    "                      exchanged so that the processes hold equal work. Under a launcher\n"
    "                      (mpirun -np N nopad train ...) its processes train together without it.\n"
    "                      Only the first process prints and writes files (docs/training.md)\n"
    "  --no-exchange       with several processes, train each on the sequences it read (no\n"
    "                      exchange before the steps: the same result, unbalanced work)\n"
    "  --threads N         CPU threads (default: OpenMP's default)\n"
    "  --quiet             no progress line\n"
    "  -h, --help          show this help\n"
    "\n"
    "A checkpoint is written whole: into OUTPUT's staging folder .NAME.nopad-partial beside it,\n"
    "then renamed into place, so an interrupted save leaves the previous one (the next run removes\n"
    "the leftover); what else OUTPUT holds is kept. SIGINT (Ctrl-C) or SIGTERM stops the run after\n"
    "its current step and saves the checkpoint (exit status 130 or 143); a second one stops it at\n"
    "once.\n"
    "\n"
    "On --device cuda, training needs the CUDA backend's training ops; until a build has them the\n"
    "run stops at once with an error naming the first one missing.\n";

enum {
    OPT_MODEL = 256, OPT_TASK, OPT_DATA, OPT_OUTPUT, OPT_NUM_LABELS, OPT_EVAL, OPT_EPOCHS, OPT_LR,
    OPT_WARMUP, OPT_BATCH_TOKENS, OPT_BATCH_SEQS, OPT_OPTIMIZER, OPT_WEIGHT_DECAY,
    OPT_MAX_GRAD_NORM, OPT_DROPOUT, OPT_SEED, OPT_SAVE_EVERY, OPT_TRUNCATE, OPT_THREADS, OPT_QUIET,
    OPT_RESUME, OPT_STOP_AFTER, OPT_LOG, OPT_LOG_BATCHES, OPT_DEVICE, OPT_DTYPE, OPT_STREAM,
    OPT_NO_STREAM, OPT_STREAM_BUFFER, OPT_EVAL_EVERY, OPT_SAVE_BEST, OPT_BEST_METRIC,
    OPT_EARLY_STOP, OPT_WHOLE_WORD_MASK, OPT_PACK_LINES, OPT_EARLY_STOP_MIN_DELTA,
    OPT_ATTENTION_DROPOUT, OPT_NPROC, OPT_NO_EXCHANGE,
};

static const struct option long_options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"task", required_argument, NULL, OPT_TASK},
    {"data", required_argument, NULL, OPT_DATA},
    {"output", required_argument, NULL, OPT_OUTPUT},
    {"num-labels", required_argument, NULL, OPT_NUM_LABELS},
    {"eval", required_argument, NULL, OPT_EVAL},
    {"eval-every", required_argument, NULL, OPT_EVAL_EVERY},
    {"save-best", no_argument, NULL, OPT_SAVE_BEST},
    {"best-metric", required_argument, NULL, OPT_BEST_METRIC},
    {"early-stop", required_argument, NULL, OPT_EARLY_STOP},
    {"early-stop-min-delta", required_argument, NULL, OPT_EARLY_STOP_MIN_DELTA},
    {"epochs", required_argument, NULL, OPT_EPOCHS},
    {"lr", required_argument, NULL, OPT_LR},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"batch-tokens", required_argument, NULL, OPT_BATCH_TOKENS},
    {"batch-seqs", required_argument, NULL, OPT_BATCH_SEQS},
    {"optimizer", required_argument, NULL, OPT_OPTIMIZER},
    {"weight-decay", required_argument, NULL, OPT_WEIGHT_DECAY},
    {"max-grad-norm", required_argument, NULL, OPT_MAX_GRAD_NORM},
    {"dropout", required_argument, NULL, OPT_DROPOUT},
    {"attention-dropout", required_argument, NULL, OPT_ATTENTION_DROPOUT},
    {"seed", required_argument, NULL, OPT_SEED},
    {"save-every", required_argument, NULL, OPT_SAVE_EVERY},
    {"truncate", no_argument, NULL, OPT_TRUNCATE},
    {"whole-word-mask", no_argument, NULL, OPT_WHOLE_WORD_MASK},
    {"pack-lines", no_argument, NULL, OPT_PACK_LINES},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"nproc", required_argument, NULL, OPT_NPROC},
    {"no-exchange", no_argument, NULL, OPT_NO_EXCHANGE},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"resume", required_argument, NULL, OPT_RESUME},
    {"stop-after", required_argument, NULL, OPT_STOP_AFTER},
    {"log", required_argument, NULL, OPT_LOG},
    /* not in --help: each log line also holds its batch (scripts/train_curve_hf.py replays them) */
    {"log-batches", no_argument, NULL, OPT_LOG_BATCHES},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"stream", no_argument, NULL, OPT_STREAM},
    {"no-stream", no_argument, NULL, OPT_NO_STREAM},
    {"stream-buffer", required_argument, NULL, OPT_STREAM_BUFFER},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* What the command line sets beside nopad_train_params. */
typedef struct train_cli {
    int quiet;
    int64_t stop_after; /* 0: run to the end */
    int dtype_given;
    int stream_given;   /* --stream or --no-stream: no choice by the data's size */
    long nproc;         /* 0: the launcher's world (1 without one) */
} train_cli;

/* Data over this size is streamed unless --no-stream says otherwise. */
static const int64_t AUTO_STREAM_BYTES = (int64_t)1 << 30;

/* A byte count with an optional binary k, M or G suffix ("64M"). */
static int parse_size(const char *name, const char *s, int64_t lo, int64_t *out) {
    char *end = NULL;
    const long long v = strtoll(s, &end, 10);
    int shift = 0;
    if (end && (*end == 'k' || *end == 'K')) shift = 10, end++;
    else if (end && *end == 'M') shift = 20, end++;
    else if (end && *end == 'G') shift = 30, end++;
    if (end == s || *end || v < 0 || v > (INT64_MAX >> shift) || ((int64_t)v << shift) < lo) {
        print_error("%s %s: expected a size of at least %lld bytes, such as 64M, 512k or 4096", name,
                    s, (long long)lo);
        return -1;
    }
    *out = (int64_t)v << shift;
    return 0;
}

/* Returns 0 to run, 1 when help was printed, -1 on a usage error (already reported). */
static int parse_train_options(int argc, char **argv, nopad_train_params *o, train_cli *cl) {
    *o = nopad_train_default_params();
    int task_given = 0;
    cli_parser p = cli_parser_start(argc, argv, long_options);
    int c;
    while ((c = cli_getopt(&p)) != -1) {
        long v = 0;
        double x = 0;
        switch (c) {
        case 'h': fputs(train_help, stdout); return 1;
        case OPT_MODEL: o->model_dir = optarg; break;
        case OPT_DATA: o->data_path = optarg; break;
        case OPT_OUTPUT: o->output_dir = optarg; break;
        case OPT_EVAL: o->eval_path = optarg; break;
        case OPT_TRUNCATE: o->truncate = 1; break;
        case OPT_WHOLE_WORD_MASK: o->whole_word_mask = 1; break;
        case OPT_PACK_LINES: o->pack_lines = 1; break;
        case OPT_QUIET: cl->quiet = 1; break;
        case OPT_RESUME: o->resume_dir = optarg; break;
        case OPT_LOG: o->log_path = optarg; break;
        case OPT_LOG_BATCHES: o->log_batches = 1; break;
        case OPT_STREAM: o->stream = 1, cl->stream_given = 1; break;
        case OPT_NO_STREAM: o->stream = 0, cl->stream_given = 1; break;
        case OPT_EVAL_EVERY:
            if (strcmp(optarg, "epoch") == 0) {
                o->eval_every_epoch = 1;
                break;
            }
            {
                char *end = NULL;
                errno = 0;
                const long long n = strtoll(optarg, &end, 10);
                if (errno || end == optarg || *end || n < 1 || n > INT32_MAX) {
                    print_error("--eval-every %s: expected a number of steps >= 1, or 'epoch'", optarg);
                    return -1;
                }
                o->eval_every = n;
            }
            break;
        case OPT_SAVE_BEST: o->save_best = 1; break;
        case OPT_BEST_METRIC:
            if (strcmp(optarg, "loss") == 0) o->best_metric = NOPAD_TRAIN_METRIC_LOSS;
            else if (strcmp(optarg, "accuracy") == 0) o->best_metric = NOPAD_TRAIN_METRIC_ACCURACY;
            else {
                print_error("unknown --best-metric '%s' (expected loss or accuracy)", optarg);
                return -1;
            }
            break;
        case OPT_EARLY_STOP:
            if (parse_int("--early-stop", optarg, 1, INT32_MAX, &v)) return -1;
            o->early_stop = (int32_t)v;
            break;
        case OPT_STREAM_BUFFER:
            if (parse_size("--stream-buffer", optarg, 1024, &o->stream_buffer)) return -1;
            break;
        case OPT_EARLY_STOP_MIN_DELTA:
            if (parse_float("--early-stop-min-delta", optarg, &x)) return -1;
            if (!(x >= 0 && x < 1e300)) {
                print_error("--early-stop-min-delta %s: expected a number >= 0", optarg);
                return -1;
            }
            o->early_stop_min_delta = x;
            break;
        case OPT_DEVICE:
            if (parse_device(optarg, &o->device)) return -1;
            break;
        case OPT_DTYPE:
            if (parse_dtype(optarg, &o->dtype)) return -1;
            cl->dtype_given = 1;
            break;
        case OPT_STOP_AFTER:
            if (parse_int("--stop-after", optarg, 1, INT32_MAX, &v)) return -1;
            cl->stop_after = v;
            break;
        case OPT_TASK:
            if (strcmp(optarg, "mlm") == 0) o->task = NOPAD_TRAIN_MLM;
            else if (strcmp(optarg, "classify") == 0) o->task = NOPAD_TRAIN_CLASSIFY;
            else {
                print_error("unknown task '%s' (expected mlm or classify)", optarg);
                return -1;
            }
            task_given = 1;
            break;
        case OPT_OPTIMIZER:
            if (strcmp(optarg, "adamw") == 0) o->optimizer = NOPAD_TRAIN_ADAMW;
            else if (strcmp(optarg, "lamb") == 0) o->optimizer = NOPAD_TRAIN_LAMB;
            else {
                print_error("unknown optimizer '%s' (expected adamw or lamb)", optarg);
                return -1;
            }
            break;
        case OPT_NUM_LABELS:
            if (parse_int("--num-labels", optarg, 1, 1 << 20, &v)) return -1;
            o->num_labels = (int32_t)v;
            break;
        case OPT_EPOCHS:
            if (parse_int("--epochs", optarg, 1, 1000000, &v)) return -1;
            o->epochs = (int32_t)v;
            break;
        case OPT_BATCH_TOKENS:
            if (parse_int("--batch-tokens", optarg, 1, INT32_MAX / 2, &v)) return -1;
            o->batch_tokens = (int32_t)v;
            break;
        case OPT_BATCH_SEQS:
            if (parse_int("--batch-seqs", optarg, 1, 1 << 20, &v)) return -1;
            o->batch_seqs = (int32_t)v;
            break;
        case OPT_SAVE_EVERY:
            if (parse_int("--save-every", optarg, 1, INT32_MAX, &v)) return -1;
            o->save_every = v;
            break;
        case OPT_NPROC:
            if (parse_int("--nproc", optarg, 1, TP_MAX, &cl->nproc)) return -1;
            break;
        case OPT_NO_EXCHANGE: o->dp_exchange = 0; break;
        case OPT_THREADS:
            if (parse_int("--threads", optarg, 0, 4096, &v)) return -1;
            o->n_threads = (int)v;
            break;
        case OPT_SEED:
            if (parse_u64("--seed", optarg, &o->seed)) return -1;
            break;
        case OPT_LR:
            if (parse_float("--lr", optarg, &x)) return -1;
            if (!(x > 0 && x < 1)) {
                print_error("--lr %s: expected a learning rate in (0, 1)", optarg);
                return -1;
            }
            o->lr = x;
            break;
        case OPT_WARMUP:
            if (parse_float("--warmup", optarg, &x)) return -1;
            if (x < 0 || (x >= 1 && x != (double)(int64_t)x) || x > 1e12) {
                print_error("--warmup %s: expected a fraction of the steps in [0, 1) or a whole "
                            "number of steps", optarg);
                return -1;
            }
            if (x < 1) o->warmup_ratio = x, o->warmup_steps = -1;
            else o->warmup_steps = (int64_t)x;
            break;
        case OPT_WEIGHT_DECAY:
            if (parse_float("--weight-decay", optarg, &x)) return -1;
            if (!(x >= 0 && x < 1)) {
                print_error("--weight-decay %s: expected a value in [0, 1)", optarg);
                return -1;
            }
            o->weight_decay = x;
            break;
        case OPT_MAX_GRAD_NORM:
            if (parse_float("--max-grad-norm", optarg, &x)) return -1;
            if (x < 0) {
                print_error("--max-grad-norm %s: expected a norm >= 0 (0: no clipping)", optarg);
                return -1;
            }
            o->max_grad_norm = x;
            break;
        case OPT_DROPOUT:
            if (parse_float("--dropout", optarg, &x)) return -1;
            if (!(x >= 0 && x < 1)) {
                print_error("--dropout %s: expected a rate in [0, 1) (0: off)", optarg);
                return -1;
            }
            o->dropout = x;
            break;
        case OPT_ATTENTION_DROPOUT:
            if (parse_float("--attention-dropout", optarg, &x)) return -1;
            if (!(x >= 0 && x < 1)) {
                print_error("--attention-dropout %s: expected a rate in [0, 1) (0: off)", optarg);
                return -1;
            }
            o->attention_dropout = x;
            break;
        default: cli_print_opt_error(&p); return -1;
        }
    }
    const char *missing = !o->model_dir ? "--model DIR" : !task_given ? "--task mlm|classify"
                        : !o->data_path ? "--data FILE" : !o->output_dir ? "--output DIR" : NULL;
    if (missing) {
        print_error("missing %s", missing);
        return -1;
    }
    const char *empty = !o->output_dir[0] ? "--output" : o->resume_dir && !o->resume_dir[0] ? "--resume"
                      : o->log_path && !o->log_path[0] ? "--log" : NULL;
    if (empty) {
        print_error("%s '': expected a %s path", empty, strcmp(empty, "--log") ? "folder's" : "file's");
        return -1;
    }
    /* the log is written from its start: it must not be the data it is about */
    struct stat log_info, data_info;
    const char *inputs[] = {o->data_path, o->eval_path};
    for (int i = 0; i < 2 && o->log_path && stat(o->log_path, &log_info) == 0; i++)
        if (inputs[i] && stat(inputs[i], &data_info) == 0 && data_info.st_dev == log_info.st_dev &&
            data_info.st_ino == log_info.st_ino) {
            print_error("--log '%s' is the %s file: writing the log would destroy it", o->log_path,
                        i ? "--eval" : "--data");
            return -1;
        }
    if (o->task == NOPAD_TRAIN_MLM && o->num_labels) {
        print_error("--num-labels is for --task classify");
        return -1;
    }
    if (o->early_stop_min_delta > 0 && !o->early_stop) {
        print_error("--early-stop-min-delta needs --early-stop K");
        return -1;
    }
    const int periodic = o->eval_every > 0 || o->eval_every_epoch;
    const char *needs_eval = periodic ? "--eval-every" : o->save_best ? "--save-best"
                           : o->early_stop ? "--early-stop"
                           : o->best_metric != NOPAD_TRAIN_METRIC_AUTO ? "--best-metric" : NULL;
    if (needs_eval && !o->eval_path) {
        print_error("%s needs --eval FILE (the data to evaluate on)", needs_eval);
        return -1;
    }
    if (needs_eval && !periodic) {
        print_error("%s needs --eval-every N|epoch (the evaluations it picks from)", needs_eval);
        return -1;
    }
    if (o->task == NOPAD_TRAIN_MLM && o->best_metric == NOPAD_TRAIN_METRIC_ACCURACY) {
        print_error("--best-metric accuracy is for --task classify (mlm has an eval loss)");
        return -1;
    }
    if (o->log_batches && !o->log_path) {
        print_error("--log-batches needs --log FILE");
        return -1;
    }
    /* CUDA computes in bf16 unless told otherwise; the CPU only in fp32 */
    if (!cl->dtype_given) o->dtype = o->device == NOPAD_DEVICE_CUDA ? NOPAD_DTYPE_BF16 : NOPAD_DTYPE_F32;
    if (o->device == NOPAD_DEVICE_CPU && o->dtype != NOPAD_DTYPE_F32) {
        print_error("--dtype %s: the CPU trains in fp32 (bf16 and fp16 are for --device cuda)",
                    o->dtype == NOPAD_DTYPE_BF16 ? "bf16" : "fp16");
        return -1;
    }
    if (o->device == NOPAD_DEVICE_CUDA && o->dtype == NOPAD_DTYPE_F32) {
        print_error("--dtype fp32: CUDA training computes in bf16 or fp16 (with float32 master weights)");
        return -1;
    }
    return 0;
}

/* "H:MM:SS" or "MM:SS". */
static void format_duration(double s, char *out, size_t size) {
    if (!(s >= 0) || s > 1e8) {
        snprintf(out, size, "?");
        return;
    }
    const long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, size, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(out, size, "%02ld:%02ld", t / 60, t % 60);
}

typedef struct progress_state {
    int quiet;
    int enabled;   /* a terminal: "\r" updates; else one line every `every` steps */
    int64_t every;
    double last;
    int64_t first_step; /* the step before this run's first (a resumed run's checkpoint), or -1 */
    int64_t stop_after; /* 0: never */
    int silent;         /* a data-parallel process other than the first: prints nothing */
} progress_state;

/* SIGINT or SIGTERM: the run stops after the step it is in and saves its checkpoint, whole, as
 * --stop-after does, rather than dying inside a save; a second signal ends it at once (the next
 * run removes the unfinished save). */
static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig) {
    static const char note[] = "\nnopad: stopping after this step to save the checkpoint (again: "
                               "stop at once)\n";
    interrupted = sig;
    signal(sig, SIG_DFL);
    if (write(STDERR_FILENO, note, sizeof note - 1) < 0) {} /* async-signal-safe */
}

/* Progress on stderr, and the stop of --stop-after or a signal. */
static int on_step(void *user, const nopad_train_progress *p) {
    progress_state *ps = user;
    if (ps->first_step < 0) ps->first_step = p->step - 1;
    const int stop = (ps->stop_after > 0 && p->step >= ps->stop_after) || interrupted;
    if (ps->quiet) return stop;
    const int last = p->step == p->total_steps || stop;
    const double t = now_seconds();
    if (ps->enabled) {
        if (!last && t - ps->last < 0.25) return stop;
    } else if (!last && p->step % ps->every != 0) {
        return stop;
    }
    ps->last = t;
    const double per_step = p->elapsed_s / (double)(p->step - ps->first_step);
    char eta[32];
    format_duration(per_step * (double)(p->total_steps - p->step), eta, sizeof eta);
    fprintf(stderr, "%sstep %" PRId64 "/%" PRId64 "  epoch %d/%d  loss %.4f  lr %.3g  %.0f tokens/s"
                    "  ETA %s%s",
            ps->enabled ? "\r" : "", p->step, p->total_steps, p->epoch + 1, p->epochs, p->loss,
            p->lr, p->elapsed_s > 0 ? (double)p->tokens / p->elapsed_s : 0.0, eta,
            ps->enabled ? "   " : "\n");
    if (ps->enabled && last) fputc('\n', stderr);
    fflush(stderr);
    progress_line_open = ps->enabled && !last;
    return stop;
}

/* The metric's value as the lines print it. */
static void print_metric(nopad_train_metric metric, double value) {
    if (metric == NOPAD_TRAIN_METRIC_ACCURACY) printf("eval accuracy %.4f", value);
    else printf("eval loss %.6f", value);
}

/* A line on stdout for each evaluation during the run (by the first process of several). */
static int on_eval(void *user, const nopad_train_eval *e) {
    const progress_state *ps = user;
    if (ps->silent) return 0;
    if (progress_line_open) fputc('\n', stderr);
    progress_line_open = 0;
    printf("eval at step %" PRId64 " (epoch %d): loss %.6f", e->step, e->epoch + 1, e->loss);
    if (e->accuracy >= 0) printf("  accuracy %.4f", e->accuracy);
    if (e->is_best) {
        fputs("  best\n", stdout);
    } else {
        printf("  (best: step %" PRId64 ", ", e->best_step);
        print_metric(e->metric, e->best_value);
        fputs(")\n", stdout);
    }
    fflush(stdout);
    return 0;
}

int cmd_train(int argc, char **argv) {
    nopad_train_params o;
    train_cli cl = {0};
    const int parsed = parse_train_options(argc, argv, &o, &cl);
    if (parsed > 0) return EXIT_OK;
    if (parsed < 0) {
        fputs("usage: nopad train --model DIR --task mlm|classify --data FILE --output DIR "
              "[options]   (nopad train --help lists them)\n",
              stderr);
        return EXIT_USAGE;
    }
    /* --nproc N: N processes under mpirun (this one execs it); under a launcher, its world */
    const int32_t world = nopad_world_size(), rank = nopad_world_rank();
    if (cl.nproc > 1 && world == 1) {
        start_under_mpirun("--nproc", cl.nproc, o.device);
        return EXIT_ERROR;
    }
    if (cl.nproc > 0 && world != cl.nproc) {
        if (rank == 0) /* the others see the same, and stop without repeating it */
            print_error("--nproc %ld needs a world of %ld processes, and the launcher started %d: "
                        "run mpirun -np %ld (or srun -n %ld), or give no --nproc under a launcher",
                        cl.nproc, cl.nproc, (int)world, cl.nproc, cl.nproc);
        return EXIT_ERROR;
    }
    if (rank > 0) cl.quiet = 1;
    /* Files first: a missing one fails before the model load. */
    const char *files[] = {o.data_path, o.eval_path};
    for (int i = 0; i < 2; i++)
        if (files[i] && access(files[i], R_OK) != 0) {
            print_error("cannot read %s '%s'", i ? "--eval" : "--data", files[i]);
            return EXIT_ERROR;
        }
    /* data too large to hold tokenized is streamed, and the run says so (with several processes,
     * each holds its share of the file: that is what must fit) */
    struct stat info;
    if (!cl.stream_given && !o.pack_lines && stat(o.data_path, &info) == 0 &&
        (int64_t)info.st_size / world > AUTO_STREAM_BYTES) {
        o.stream = 1;
        if (!cl.quiet && rank == 0)
            fprintf(stderr, "%s is %.1f GiB%s: streaming it in windows of %.0f MiB (--no-stream "
                            "holds it in memory)\n", o.data_path,
                    (double)info.st_size / (double)AUTO_STREAM_BYTES, world > 1 ? ", over 1 a process" : "",
                    (double)o.stream_buffer / (1 << 20));
    }
    progress_state ps = {.quiet = cl.quiet, .enabled = isatty(STDERR_FILENO), .every = 10,
                         .first_step = -1, .stop_after = cl.stop_after, .silent = rank > 0};
    o.on_step = on_step;
    o.on_eval = on_eval;
    o.user = &ps;
    const double start = now_seconds();
    nopad_train_result res;
    struct sigaction sa = {.sa_handler = on_interrupt}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    const nopad_status st = nopad_train(&o, &res);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (st != NOPAD_OK) {
        if (rank > 0) print_error("rank %d: %s", (int)rank, library_error(st));
        else print_error("%s", library_error(st));
        return EXIT_ERROR;
    }
    if (rank > 0) return interrupted ? 128 + interrupted : EXIT_OK; /* the first process reports */
    if (interrupted) {
        if (progress_line_open) fputc('\n', stderr);
        progress_line_open = 0;
        fprintf(stderr, "nopad: interrupted (%s) at step %" PRId64 ": the checkpoint is saved in "
                        "%s; --resume %s continues the run\n",
                interrupted == SIGINT ? "SIGINT" : "SIGTERM", res.steps, o.output_dir, o.output_dir);
        return 128 + interrupted;
    }
    if (!cl.quiet) {
        if (res.resumed_step)
            fprintf(stderr, "resumed from %s at step %" PRId64 "\n", o.resume_dir, res.resumed_step);
        if (res.new_head)
            fprintf(stderr, "new %s head initialised (seed %" PRIu64 ")\n",
                    o.task == NOPAD_TRAIN_CLASSIFY ? "classification" : "masked-LM", o.seed);
        char took[32];
        format_duration(now_seconds() - start, took, sizeof took);
        fprintf(stderr, "trained %" PRId64 " steps on %d examples (%d truncated%s) in %s: loss "
                        "%.4f -> %.4f; saved %s\n",
                res.steps - res.resumed_step, res.n_examples, res.n_truncated,
                o.stream ? ", streamed" : "", took, res.first_loss, res.last_loss, o.output_dir);
        if (res.dp_steps > 0) { /* the exchange's effect, in tokens per process and step */
            const double steps = (double)res.dp_steps, mean = (double)res.dp_tokens / res.dp_ranks;
            fprintf(stderr, "data-parallel over %d process%s, %" PRId64 " steps: tokens per process and "
                            "step %.1f on average; the most loaded process %.1f (%.3fx) as read, %.1f (%.3fx) "
                            "%s; %" PRId64 " sequences (%" PRId64 " tokens) moved\n",
                    (int)res.dp_ranks, res.dp_ranks == 1 ? "" : "es", res.dp_steps, mean / steps,
                    (double)res.dp_max_read / steps, (double)res.dp_max_read / mean,
                    (double)res.dp_max_computed / steps, (double)res.dp_max_computed / mean,
                    o.dp_exchange ? "after the exchange" : "(no exchange)", res.dp_moved_seqs,
                    res.dp_moved_tokens);
        }
    }
    if (o.eval_path) {
        if (res.eval_accuracy >= 0) printf("eval accuracy: %.4f\n", res.eval_accuracy);
        if (res.eval_loss >= 0) printf("eval loss: %.4f\n", res.eval_loss);
    }
    if (res.early_stopped && o.early_stop_min_delta > 0)
        printf("stopped early at step %" PRId64 ": %d evaluations without improving by more than "
               "%g\n", res.steps, o.early_stop, o.early_stop_min_delta);
    else if (res.early_stopped)
        printf("stopped early at step %" PRId64 ": %d evaluations without improving on step %"
               PRId64 "'s\n", res.steps, o.early_stop, res.best_step);
    if (res.best_step > 0) {
        printf("best: step %" PRId64 " of %d evaluation%s, ", res.best_step, res.evaluations,
               res.evaluations == 1 ? "" : "s");
        print_metric(res.best_metric, res.best_value);
        if (o.save_best) printf(" (its weights in %s/best)", o.output_dir);
        fputc('\n', stdout);
    }
    return EXIT_OK;
}
