/* `nopad generate`: a decoder answers a prompt (--prompt) or each line of a file (--input),
 * streaming the new text to stdout as the tokens are chosen.
 *
 * Lines of a file are generated in groups (--batch prompts at once, as many as the KV pool
 * holds): one nopad_generate call per group, each token through the prompt's decode stream. The
 * answers still come out in input order: the first unfinished prompt of the group is written as
 * it grows, the others are held until it ends. */
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "cli.h"
#include "nopad.h"
#include "output.h"
#include "requests.h"

enum { DEFAULT_KV_TOKENS = 8192, KV_BLOCK = 16, DEFAULT_BATCH = 16 };

static const char generate_help[] =
    "usage: nopad generate --model M (--prompt TEXT | --input FILE) [options]\n"
    "\n"
    "Generates text with a decoder (gpt2, llama, mistral, qwen2) and writes the new text to\n"
    "stdout as it is produced (the prompt is not repeated), then a newline. The prompt goes in\n"
    "as it is, through the model's tokenizer with its special tokens added as Hugging Face adds\n"
    "them: apply the model's chat template yourself. Special tokens (the end of sequence) are\n"
    "left out of the text.\n"
    "\n"
    "options:\n"
    "  --model M               a .gguf file or a Hugging Face model folder [required]\n"
    "  --prompt TEXT           one prompt (a shell's $'...' writes newlines)\n"
    "  --input FILE            one prompt per line of FILE ('-': stdin); each answer is\n"
    "                          followed by a newline, in input order (an answer holding\n"
    "                          newlines spans several lines). In the lines, the two characters\n"
    "                          \\n stand for a newline and \\\\ for a backslash (any other\n"
    "                          backslash is kept); a trailing '\\r' is dropped\n"
    "  --max-tokens N          new tokens per prompt at most (default 128; 0: check the prompts\n"
    "                          and print nothing)\n"
    "  --temperature T         0 (default): greedy, the most likely token; > 0: sample from\n"
    "                          softmax(logits / T)\n"
    "  --top-k K               sample among the K most likely tokens (default 0: all)\n"
    "  --top-p P               ... among the fewest whose probability reaches P, in (0, 1]\n"
    "                          (default 1: all)\n"
    "  --min-p P               drop tokens below P x the top probability, in [0, 1) (default 0)\n"
    "  --repetition-penalty R  tokens already in the prompt or answer: logit / R when positive,\n"
    "                          logit * R when negative (Hugging Face's rule; default 1: off)\n"
    "  --seed S                the random stream of sampling (default 0); a prompt gives the\n"
    "                          same answer alone or beside others\n"
    "  --ignore-eos            do not stop at the model's end-of-sequence token\n"
    "  --batch N               --input: prompts generated together (default 16; 1 when the\n"
    "                          input is a terminal), as many as the KV pool holds\n"
    "  --output FILE           request-file mode: --input holds one JSON request a line,\n"
    "                          {\"id\", \"prompt\", \"max_tokens\", \"temperature\", \"top_k\",\n"
    "                          \"top_p\", \"min_p\", \"repetition_penalty\", \"seed\",\n"
    "                          \"ignore_eos\", \"stop\"} (only \"prompt\" required; the options\n"
    "                          above give the defaults; \"id\" defaults to the line number), run\n"
    "                          through the engine, which fuses every running request into one\n"
    "                          step; FILE ('-': stdout) gets one JSON line per request as it\n"
    "                          ends: {\"id\", \"text\", \"tokens\", \"prompt_tokens\",\n"
    "                          \"finish_reason\"} (\"length\", \"stop\") or {\"id\", \"error\"};\n"
    "                          progress on stderr when it is a terminal. FILE is written to a\n"
    "                          temporary file beside it and renamed at the end (a failed run\n"
    "                          leaves an old FILE as it was); it may not be the --input file\n"
    "  --max-running N         request-file mode: requests running at once (default 256)\n"
    "  --step-tokens N         request-file mode: tokens in one step (default 2048)\n"
    "  --kv-tokens N           the KV pool in tokens, over the prompts running together (default\n"
    "                          8192); each prompt needs its length + --max-tokens\n"
    "  --device D              cpu (default) or cuda\n"
    "  --dtype T               compute dtype: fp32 (CPU default), fp16 (CUDA default) or bf16\n"
    "  --threads N             CPU threads (default: OpenMP's default)\n"
    "  --weights W             how a GGUF file's quantized weights are held: auto (default:\n"
    "                          native on the CPU, else the compute dtype), native (as stored,\n"
    "                          where the backend runs the format; the rest dequantised, said on\n"
    "                          stderr), f32, f16, bf16 (dequantised; the compute dtype's), fp8\n"
    "                          (CUDA: the linear layers quantized to FP8 E4M3 per output\n"
    "                          channel; docs/fp8.md)\n"
    TP_HELP
    "  -h, --help              show this help\n"
    "\n"
    "errors:\n"
    "  A bad line (invalid UTF-8, no tokens, too long for the model's context or the KV pool)\n"
    "  stops the run with a message naming the line, exit status 1; answers of earlier lines\n"
    "  are already written. In request-file mode a bad line gets its {\"id\", \"error\"} line\n"
    "  and the others still run; the exit status is then 1. A bad option value is exit status 2.\n";

typedef struct generate_options {
    const char *model, *prompt, *input_path, *output_path;
    long max_tokens, top_k, kv_tokens, batch, threads, max_running, step_tokens, tp;
    double temperature, top_p, min_p, repetition_penalty;
    uint64_t seed;
    int ignore_eos, batch_given;
    nopad_device device;
    nopad_dtype dtype;
    int dtype_given;
    nopad_weights weights;
} generate_options;

enum {
    OPT_MODEL = 256,
    OPT_PROMPT,
    OPT_INPUT,
    OPT_MAX_TOKENS,
    OPT_TEMPERATURE,
    OPT_TOP_K,
    OPT_TOP_P,
    OPT_MIN_P,
    OPT_REPETITION_PENALTY,
    OPT_SEED,
    OPT_IGNORE_EOS,
    OPT_BATCH,
    OPT_KV_TOKENS,
    OPT_DEVICE,
    OPT_DTYPE,
    OPT_THREADS,
    OPT_OUTPUT,
    OPT_MAX_RUNNING,
    OPT_STEP_TOKENS,
    OPT_TP,
    OPT_WEIGHTS,
};

static const struct option long_options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"prompt", required_argument, NULL, OPT_PROMPT},
    {"input", required_argument, NULL, OPT_INPUT},
    {"max-tokens", required_argument, NULL, OPT_MAX_TOKENS},
    {"temperature", required_argument, NULL, OPT_TEMPERATURE},
    {"top-k", required_argument, NULL, OPT_TOP_K},
    {"top-p", required_argument, NULL, OPT_TOP_P},
    {"min-p", required_argument, NULL, OPT_MIN_P},
    {"repetition-penalty", required_argument, NULL, OPT_REPETITION_PENALTY},
    {"seed", required_argument, NULL, OPT_SEED},
    {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"kv-tokens", required_argument, NULL, OPT_KV_TOKENS},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"output", required_argument, NULL, OPT_OUTPUT},
    {"max-running", required_argument, NULL, OPT_MAX_RUNNING},
    {"step-tokens", required_argument, NULL, OPT_STEP_TOKENS},
    {"tp", required_argument, NULL, OPT_TP},
    {"weights", required_argument, NULL, OPT_WEIGHTS},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* A number in the range the library accepts (the same rules as its sampling check), else a
 * message and -1: bad values are refused before the model loads. */
static int in_range(const char *name, const char *s, double v, double lo, int lo_open, double hi,
                    int hi_open, const char *what) {
    if ((lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi)) return 0;
    print_error("%s must be %s, got '%s'", name, what, s);
    return -1;
}

/* Returns 0 to run, 1 when help was printed, -1 on a usage error (already reported). */
static int parse_generate_options(int argc, char **argv, generate_options *o) {
    *o = (generate_options){.max_tokens = 128, .top_p = 1.0, .repetition_penalty = 1.0,
                            .kv_tokens = DEFAULT_KV_TOKENS, .batch = DEFAULT_BATCH, .tp = 1};
    cli_parser p = cli_parser_start(argc, argv, long_options);
    int c;
    while ((c = cli_getopt(&p)) != -1) {
        const char *v = optarg;
        int bad = 0;
        switch (c) {
        case 'h': fputs(generate_help, stdout); return 1;
        case OPT_MODEL: o->model = v; break;
        case OPT_PROMPT: o->prompt = v; break;
        case OPT_INPUT: o->input_path = v; break;
        case OPT_MAX_TOKENS: bad = parse_int("--max-tokens", v, 0, INT32_MAX, &o->max_tokens); break;
        case OPT_TEMPERATURE:
            bad = parse_float("--temperature", v, &o->temperature) ||
                  in_range("--temperature", v, o->temperature, 0, 0, FLT_MAX, 0,
                           "0 (greedy) or a number > 0");
            break;
        case OPT_TOP_K: bad = parse_int("--top-k", v, 0, INT32_MAX, &o->top_k); break;
        case OPT_TOP_P:
            bad = parse_float("--top-p", v, &o->top_p) ||
                  in_range("--top-p", v, o->top_p, 0, 1, 1, 0, "in (0, 1] (1: off)");
            break;
        case OPT_MIN_P:
            bad = parse_float("--min-p", v, &o->min_p) ||
                  in_range("--min-p", v, o->min_p, 0, 0, 1, 1, "in [0, 1) (0: off)");
            break;
        case OPT_REPETITION_PENALTY:
            bad = parse_float("--repetition-penalty", v, &o->repetition_penalty) ||
                  in_range("--repetition-penalty", v, o->repetition_penalty, 0, 1, FLT_MAX, 0,
                           "a number > 0 (1: off)");
            break;
        case OPT_SEED: bad = parse_u64("--seed", v, &o->seed); break;
        case OPT_IGNORE_EOS: o->ignore_eos = 1; break;
        case OPT_BATCH:
            bad = parse_int("--batch", v, 1, 4096, &o->batch);
            o->batch_given = 1;
            break;
        case OPT_KV_TOKENS: bad = parse_int("--kv-tokens", v, 1, INT32_MAX, &o->kv_tokens); break;
        case OPT_DEVICE: bad = parse_device(v, &o->device); break;
        case OPT_DTYPE:
            bad = parse_dtype(v, &o->dtype);
            o->dtype_given = 1;
            break;
        case OPT_THREADS: bad = parse_int("--threads", v, 0, 4096, &o->threads); break;
        case OPT_OUTPUT: o->output_path = v; break;
        case OPT_MAX_RUNNING: bad = parse_int("--max-running", v, 1, 65536, &o->max_running); break;
        case OPT_STEP_TOKENS: bad = parse_int("--step-tokens", v, 1, 1 << 20, &o->step_tokens); break;
        case OPT_TP: bad = parse_int("--tp", v, 1, TP_MAX, &o->tp); break;
        case OPT_WEIGHTS: bad = parse_weights(v, &o->weights); break;
        default: cli_print_opt_error(&p); return -1;
        }
        if (bad) return -1;
    }
    if (!o->model) {
        print_error("missing --model M");
        return -1;
    }
    if (!o->prompt == !o->input_path) {
        print_error("%s", o->prompt ? "give --prompt or --input, not both"
                                    : "missing --prompt TEXT or --input FILE");
        return -1;
    }
    if (o->output_path && !o->input_path) {
        print_error("--output is the request-file mode: give the requests with --input FILE");
        return -1;
    }
    if (o->input_path && strcmp(o->input_path, "-") == 0) o->input_path = NULL; /* stdin */
    if (o->output_path && strcmp(o->output_path, "-") != 0 &&
        output_check(o->output_path, o->input_path))
        return -1;
    if (o->output_path && strcmp(o->output_path, "-") == 0) o->output_path = ""; /* stdout */
    return 0;
}

/* ---- one group of prompts ------------------------------------------------------------------ */

typedef struct gen_prompt {
    int64_t line_no;          /* 1-based input line; 0 for --prompt */
    nopad_decode_stream *ds;
    char *held;               /* text not written yet (the prompt is not first in line) */
    size_t held_len, held_cap;
    int32_t produced;
    int done;                 /* its last token came (end of sequence or --max-tokens) */
} gen_prompt;

/* Everything one run owns; freed in one place. */
typedef struct generate_run {
    nopad_model *model;
    const nopad_tokenizer *tok;
    nopad_model_info info;
    nopad_generate_params params;
    FILE *in;
    const char *in_name;
    char *line;
    size_t line_cap;
    char *text;               /* the unescaped line */
    size_t text_cap;
    /* the group */
    gen_prompt *prompts;
    size_t prompts_cap;
    int32_t n, head;          /* prompts in the group; the first one not written out */
    int32_t *tokens, *cu;
    size_t tokens_cap, cu_cap;
    int64_t n_tokens, kv_blocks; /* KV blocks the group needs at most */
    int64_t kv_pool_blocks;
    int32_t max_group;
    int failed;               /* a write or decode failed inside the token callback */
} generate_run;

static int write_out(generate_run *r, const char *s, size_t n) {
    if (r->failed) return -1;
    if ((n && fwrite(s, 1, n, stdout) != n) || fflush(stdout) != 0) {
        print_error("cannot write to stdout: %s", strerror(errno));
        r->failed = 1;
        return -1;
    }
    return 0;
}

/* Writes prompt q's held text, and when it is done the text its decode stream holds back and
 * the closing newline. */
static int release(generate_run *r, gen_prompt *q) {
    if (write_out(r, q->held, q->held_len)) return -1;
    q->held_len = 0;
    if (!q->done) return 0;
    const char *tail;
    size_t len;
    nopad_status st = nopad_decode_stream_flush(q->ds, &tail, &len);
    if (st != NOPAD_OK) {
        print_error("%s", library_error(st));
        r->failed = 1;
        return -1;
    }
    return write_out(r, tail, len) || write_out(r, "\n", 1) ? -1 : 0;
}

/* Writes out, in order, the prompts from the head on that are done, and what the new head holds
 * so far. */
static int advance(generate_run *r) {
    while (r->head < r->n) {
        gen_prompt *q = &r->prompts[r->head];
        if (release(r, q)) return -1;
        if (!q->done) break;
        r->head++;
    }
    return 0;
}

static int hold(generate_run *r, gen_prompt *q, const char *s, size_t n) {
    if (reserve((void **)&q->held, &q->held_cap, q->held_len + n, 1)) {
        r->failed = 1;
        return -1;
    }
    memcpy(q->held + q->held_len, s, n);
    q->held_len += n;
    return 0;
}

/* nopad_token_fn: the library has chosen `token` for prompt i of the group. */
static int on_token(void *user, int32_t i, int32_t token) {
    generate_run *r = user;
    if (r->failed) return 1;
    gen_prompt *q = &r->prompts[i];
    const char *text;
    size_t len;
    nopad_status st = nopad_decode_stream_step(q->ds, token, &text, &len);
    if (st != NOPAD_OK) {
        print_error("%s", library_error(st));
        r->failed = 1;
        return 1;
    }
    q->produced++;
    /* The library stops a prompt at max_tokens and at any end-of-sequence id; the first one (the
     * one nopad_model_info names) is the only one there is in most models. A prompt that ends
     * at another is written out when the group ends. */
    if (q->produced >= r->params.max_tokens ||
        (!r->params.ignore_eos && token == r->info.eos_token_id))
        q->done = 1;
    if (i == r->head) {
        if (write_out(r, text, len)) return 1;
        if (q->done && advance(r)) return 1;
    } else if (hold(r, q, text, len)) {
        return 1;
    }
    return 0;
}

static void where(const gen_prompt *q, char *buf, size_t cap) {
    if (q->line_no > 0) snprintf(buf, cap, "line %" PRId64, q->line_no);
    else snprintf(buf, cap, "the prompt");
}

/* Generates for the group and writes every answer; empties the group. */
static int run_group(generate_run *r) {
    if (r->n == 0) return 0;
    int rc = 0;
    if (r->params.max_tokens > 0) {
        r->head = 0;
        nopad_status st = nopad_generate(nopad_model_context(r->model), r->n, r->cu, r->tokens,
                                         &r->params, NULL, NULL, on_token, r);
        if (st != NOPAD_OK) {
            char at[48];
            where(&r->prompts[0], at, sizeof at);
            if (r->n == 1) print_error("%s: %s", at, library_error(st));
            else print_error("lines %" PRId64 "-%" PRId64 ": %s", r->prompts[0].line_no,
                             r->prompts[r->n - 1].line_no, library_error(st));
            rc = -1;
        }
        for (int32_t i = 0; i < r->n; i++) r->prompts[i].done = 1;
        if (rc == 0 && (r->failed || advance(r))) rc = -1;
        if (r->failed) rc = -1;
    }
    for (int32_t i = 0; i < r->n; i++) {
        nopad_decode_stream_free(r->prompts[i].ds);
        free(r->prompts[i].held);
    }
    r->n = 0;
    r->n_tokens = 0;
    r->kv_blocks = 0;
    return rc;
}

/* A bad prompt: the group's earlier prompts are answered first, then the message is printed. */
static int refuse(generate_run *r, const char *at, const char *why) {
    run_group(r);
    print_error("%s%s", at, why);
    return -1;
}

/* Adds one prompt (text[len]) to the group, running the group first when it is full. */
static int add_prompt(generate_run *r, const char *text, size_t len, int64_t line_no) {
    gen_prompt probe = {.line_no = line_no};
    char at[48], why[1024];
    where(&probe, at, sizeof at);
    /* tokenize after the group's tokens */
    nopad_tokenize_params tp = nopad_tokenize_default_params();
    int32_t n = 0;
    for (;;) {
        size_t room = r->tokens_cap - (size_t)r->n_tokens;
        int32_t cap = room > INT32_MAX ? INT32_MAX : (int32_t)room;
        nopad_status st = nopad_tokenize(r->tok, text, len, &tp, r->tokens + r->n_tokens, cap, &n);
        if (st == NOPAD_ERR_BUFFER_TOO_SMALL && n > cap) {
            if (reserve((void **)&r->tokens, &r->tokens_cap, (size_t)r->n_tokens + (size_t)n,
                        sizeof(int32_t)))
                return -1;
            continue;
        }
        if (st != NOPAD_OK) {
            snprintf(why, sizeof why, ": %s", library_error(st));
            return refuse(r, at, why);
        }
        break;
    }
    if (n == 0) return refuse(r, at, " gives no tokens");
    const int64_t total = (int64_t)n + r->params.max_tokens;
    if (total > r->info.max_position_embeddings) {
        snprintf(why, sizeof why, ": %" PRId32 " tokens and --max-tokens %" PRId32 " pass the "
                 "model's context of %" PRId32 " tokens",
                 n, r->params.max_tokens, r->info.max_position_embeddings);
        return refuse(r, at, why);
    }
    const int64_t blocks = (total + KV_BLOCK - 1) / KV_BLOCK;
    if (blocks > r->kv_pool_blocks) {
        snprintf(why, sizeof why, ": %" PRId32 " tokens and --max-tokens %" PRId32 " need a KV "
                 "pool of %" PRId64 " tokens (--kv-tokens)",
                 n, r->params.max_tokens, blocks * KV_BLOCK);
        return refuse(r, at, why);
    }
    if (r->n > 0 && (r->n >= r->max_group || r->kv_blocks + blocks > r->kv_pool_blocks)) {
        /* the group is full: move the new prompt's ids to the front and run the group first */
        int32_t *ids = malloc((size_t)n * sizeof *ids);
        if (!ids) {
            print_error("out of memory");
            return -1;
        }
        memcpy(ids, r->tokens + r->n_tokens, (size_t)n * sizeof *ids);
        int rc = run_group(r);
        if (rc == 0) memcpy(r->tokens, ids, (size_t)n * sizeof *ids);
        free(ids);
        if (rc) return -1;
    }
    if (reserve((void **)&r->prompts, &r->prompts_cap, (size_t)r->n + 1, sizeof *r->prompts) ||
        reserve((void **)&r->cu, &r->cu_cap, (size_t)r->n + 2, sizeof *r->cu))
        return -1;
    gen_prompt *q = &r->prompts[r->n];
    *q = (gen_prompt){.line_no = line_no};
    nopad_status st = nopad_decode_stream_create(r->tok, 1, &q->ds);
    if (st != NOPAD_OK) {
        print_error("%s", library_error(st));
        return -1;
    }
    r->cu[0] = 0;
    r->n_tokens += n;
    r->cu[++r->n] = (int32_t)r->n_tokens;
    r->kv_blocks += blocks;
    return 0;
}

/* A line of the input file with \n and \\ turned into a newline and a backslash. */
static int unescape(generate_run *r, const char *s, size_t len, size_t *out_len) {
    if (reserve((void **)&r->text, &r->text_cap, len + 1, 1)) return -1;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '\\' && i + 1 < len && (s[i + 1] == 'n' || s[i + 1] == '\\')) {
            r->text[k++] = s[i + 1] == 'n' ? '\n' : '\\';
            i++;
        } else {
            r->text[k++] = s[i];
        }
    }
    *out_len = k;
    return 0;
}

static int generate_lines(generate_run *r) {
    int64_t line_no = 0;
    for (;;) {
        errno = 0;
        ssize_t got = getline(&r->line, &r->line_cap, r->in);
        if (got < 0) {
            if (ferror(r->in) || (errno && !feof(r->in))) {
                print_error("cannot read %s: %s", r->in_name, errno ? strerror(errno) : "error");
                return -1;
            }
            break;
        }
        line_no++;
        size_t len = (size_t)got, text_len;
        if (len && r->line[len - 1] == '\n') len--;
        if (len && r->line[len - 1] == '\r') len--;
        if (unescape(r, r->line, len, &text_len) || add_prompt(r, r->text, text_len, line_no))
            return -1;
    }
    return run_group(r);
}

static void generate_run_free(generate_run *r) {
    for (int32_t i = 0; i < r->n; i++) {
        nopad_decode_stream_free(r->prompts[i].ds);
        free(r->prompts[i].held);
    }
    if (r->in && r->in != stdin) fclose(r->in);
    nopad_model_free(r->model);
    free(r->line);
    free(r->text);
    free(r->prompts);
    free(r->tokens);
    free(r->cu);
}

/* What the model is loaded with, on rank 0 and (--tp) every other rank alike. */
static nopad_model_params generate_model_params(const generate_options *o) {
    nopad_model_params mp = model_params(o->device, o->dtype, o->dtype_given, (int)o->threads);
    mp.kv_cache_tokens = (int32_t)o->kv_tokens;
    mp.kv_block_size = KV_BLOCK;
    mp.tp_size = (int32_t)o->tp;
    mp.weights = o->weights;
    return mp;
}

int cmd_generate(int argc, char **argv) {
    generate_options o;
    int parsed = parse_generate_options(argc, argv, &o);
    if (parsed > 0) return EXIT_OK;
    if (parsed < 0) {
        fputs("usage: nopad generate --model M (--prompt TEXT | --input FILE) [options]   "
              "(nopad generate --help lists them)\n",
              stderr);
        return EXIT_USAGE;
    }
    const int rank = tp_begin(o.tp, o.device);
    if (rank < 0) return EXIT_ERROR;
    if (o.output_path) {
        const requests_options ro = {
            .model = o.model, .input_path = o.input_path,
            .output_path = o.output_path[0] ? o.output_path : NULL,
            .max_tokens = o.max_tokens > 0 ? o.max_tokens : 128, .top_k = o.top_k,
            .temperature = o.temperature, .top_p = o.top_p, .min_p = o.min_p,
            .repetition_penalty = o.repetition_penalty, .seed = o.seed, .ignore_eos = o.ignore_eos,
            .kv_tokens = (int32_t)o.kv_tokens, .max_running = (int32_t)o.max_running,
            .step_tokens = (int32_t)o.step_tokens, .device = o.device,
            .dtype = o.dtype_given ? o.dtype
                     : o.device == NOPAD_DEVICE_CUDA ? NOPAD_DTYPE_F16 : NOPAD_DTYPE_F32,
            .threads = (int)o.threads, .tp = (int32_t)o.tp, .weights = o.weights};
        if (rank > 0) {
            const nopad_model_params mp = requests_model_params(&ro);
            return tp_follow(o.model, &mp);
        }
        return generate_requests(&ro);
    }
    const nopad_model_params mp = generate_model_params(&o);
    if (rank > 0) return tp_follow(o.model, &mp);
    generate_run r = {0};
    int rc = EXIT_ERROR;
    /* Input first: a missing file fails before the (slow) model load. */
    if (!o.prompt) {
        r.in = stdin;
        r.in_name = "stdin";
        if (o.input_path) {
            r.in_name = o.input_path;
            r.in = fopen(o.input_path, "rb");
            if (!r.in) {
                print_error("cannot open input '%s': %s", o.input_path, strerror(errno));
                goto done;
            }
        }
    }
    r.model = open_model_with(o.model, &mp);
    if (!r.model) goto done;
    nopad_status st = nopad_model_get_info(r.model, &r.info);
    if (st != NOPAD_OK) {
        print_error("%s", library_error(st));
        goto done;
    }
    if (!r.info.is_decoder) {
        print_error("model '%s' is an encoder (%s); nopad generate runs decoders (gpt2, llama, "
                    "mistral, qwen2): use nopad embed for it",
                    o.model, r.info.family);
        goto done;
    }
    r.tok = nopad_model_tokenizer(r.model);
    if (!r.tok) {
        const char *why = nopad_model_tokenizer_error(r.model);
        print_error("model '%s' has no tokenizer nopad supports (%s), so text prompts cannot be "
                    "read",
                    o.model, why ? why : "none found");
        goto done;
    }
    r.params = nopad_generate_default_params();
    r.params.max_tokens = (int32_t)o.max_tokens;
    r.params.ignore_eos = o.ignore_eos;
    r.params.sampling.temperature = (float)o.temperature;
    r.params.sampling.top_k = (int32_t)o.top_k;
    r.params.sampling.top_p = (float)o.top_p;
    r.params.sampling.min_p = (float)o.min_p;
    r.params.sampling.repetition_penalty = (float)o.repetition_penalty;
    r.params.sampling.seed = o.seed;
    r.kv_pool_blocks = (o.kv_tokens + KV_BLOCK - 1) / KV_BLOCK;
    r.max_group = (int32_t)o.batch;
    if (r.in && !o.batch_given && isatty(fileno(r.in))) r.max_group = 1; /* answer as typed */
    if (o.prompt) {
        if (add_prompt(&r, o.prompt, strlen(o.prompt), 0) == 0 && run_group(&r) == 0)
            rc = EXIT_OK;
    } else if (generate_lines(&r) == 0) {
        rc = EXIT_OK;
    }
done:
    generate_run_free(&r);
    return rc;
}
