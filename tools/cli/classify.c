/* `nopad classify` and `nopad rerank`: lines of text through a model's sequence-classification
 * head. classify scores each line alone; rerank scores the query paired with each line (a
 * cross-encoder: the tokenizer's pair template, a one-label head). Lines are read as a stream and
 * run in batches of at most --batch-tokens tokens, one nopad_classify_packed call per batch; one
 * JSON object per line comes out, in input order. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "cli.h"
#include "nopad.h"
#include "output.h"

enum { DEFAULT_BATCH_TOKENS = 16384 };

static const char classify_help[] =
    "usage: nopad classify --model DIR [options]\n"
    "\n"
    "Reads lines of UTF-8 text (stdin, or --input) and writes one JSON object per line (stdout,\n"
    "or --output), in input order, from the folder's sequence-classification head\n"
    "(BertForSequenceClassification, XLMRobertaForSequenceClassification,\n"
    "DebertaV2ForSequenceClassification, ...; labels from config.json's id2label):\n"
    "  {\"label\": NAME, \"score\": P, \"logits\": [...]}   P = the label's softmax probability\n"
    "  {\"score\": P, \"logit\": X}                          a one-label head: P = sigmoid(X)\n";

static const char rerank_help[] =
    "usage: nopad rerank --model DIR --query TEXT [options]\n"
    "\n"
    "Reads lines of UTF-8 text (documents; stdin, or --input) and scores the query paired with\n"
    "each, as a cross-encoder reranker does: the pair goes through the tokenizer's pair template\n"
    "([CLS] query [SEP] line [SEP], <s> query </s></s> line </s>) into a one-label head. Writes\n"
    "one JSON object per line, in input order (sort by score yourself):\n"
    "  {\"index\": I, \"score\": P, \"logit\": X}            I = the 0-based line, P = sigmoid(X)\n";

static const char common_help[] =
    "\n"
    "options:\n"
    "  --model DIR         Hugging Face model folder with a classification head and a tokenizer\n"
    "                      [required]\n"
    "  --query TEXT        (rerank) the query every line is paired with [required]\n"
    "  --input FILE        read lines from FILE ('-': stdin, the default)\n"
    "  --output FILE       write to FILE ('-': stdout, the default)\n"
    "  --truncate          cut sequences longer than the model's maximum (a pair cuts the longer\n"
    "                      text first); without it a longer sequence is an error\n"
    "  --batch-tokens N    tokens per forward pass (default 16384)\n"
    "  --threads N         CPU threads (default: OpenMP's default)\n"
    "  --device D          cpu (default) or cuda\n"
    "  --dtype T           fp32 (the CPU's), fp16 (CUDA's default) or bf16\n"
    "  -h, --help          show this help\n"
    "\n"
    "A bad line stops the run with a message naming it, exit status 1; an --output file is then\n"
    "left as it was (it is written to a temporary file beside it and renamed at the end).\n";

typedef struct run {
    int rerank;
    nopad_model *model;
    const nopad_tokenizer *tok;
    nopad_model_info info;
    int32_t num_labels;
    FILE *in, *out;
    output_file file;             /* out, written whole at the end */
    const char *in_name, *out_name;
    int32_t *tokens, *types, *cu; /* the pending batch: [T], [T], [B+1] */
    size_t tokens_cap, types_cap, cu_cap;
    int32_t n_seqs;
    int64_t n_tokens, first_line; /* first_line: 1-based line of sequence 0 */
    float *logits;                /* [B, num_labels] */
    size_t logits_cap;
} run;

/* Writes one batch's results and empties it. */
static int flush(run *r) {
    if (r->n_seqs == 0) return 0;
    const int32_t L = r->num_labels;
    if (reserve((void **)&r->logits, &r->logits_cap, (size_t)r->n_seqs * L, sizeof(float))) return -1;
    const int with_types = r->rerank && r->info.type_vocab_size > 1;
    nopad_status st = nopad_classify_packed(r->model, r->n_seqs, r->cu, r->tokens, with_types ? r->types : NULL,
                                            r->logits);
    if (st != NOPAD_OK) {
        print_error("lines %" PRId64 "-%" PRId64 ": %s", r->first_line, r->first_line + r->n_seqs - 1,
                    library_error(st));
        return -1;
    }
    for (int32_t s = 0; s < r->n_seqs; s++) {
        const float *x = r->logits + (size_t)s * L;
        for (int32_t l = 0; l < L; l++)
            if (!isfinite(x[l])) {
                print_error("line %" PRId64 ": the logits contain %s", r->first_line + s, isnan(x[l]) ? "NaN" : "infinity");
                return -1;
            }
        if (r->rerank) {
            fprintf(r->out, "{\"index\": %" PRId64 ", \"score\": %.9g, \"logit\": %.9g}\n", r->first_line + s - 1,
                    1.0 / (1.0 + exp(-(double)x[0])), x[0]);
        } else if (L == 1) {
            fprintf(r->out, "{\"score\": %.9g, \"logit\": %.9g}\n", 1.0 / (1.0 + exp(-(double)x[0])), x[0]);
        } else {
            int32_t best = 0;
            double sum = 0;
            for (int32_t l = 1; l < L; l++)
                if (x[l] > x[best]) best = l;
            for (int32_t l = 0; l < L; l++) sum += exp((double)x[l] - x[best]);
            fputs("{\"label\": \"", r->out);
            for (const char *c = nopad_model_label(r->model, best); *c; c++) { // a JSON string
                if (*c == '"' || *c == '\\') fprintf(r->out, "\\%c", *c);
                else if ((unsigned char)*c < 0x20) fprintf(r->out, "\\u%04x", (unsigned char)*c);
                else fputc(*c, r->out);
            }
            fprintf(r->out, "\", \"score\": %.9g, \"logits\": [", 1.0 / sum);
            for (int32_t l = 0; l < L; l++) fprintf(r->out, "%s%.9g", l ? ", " : "", x[l]);
            fputs("]}\n", r->out);
        }
    }
    if (ferror(r->out)) {
        print_error("cannot write %s: %s", r->out_name, strerror(errno));
        return -1;
    }
    r->first_line += r->n_seqs;
    r->n_seqs = 0;
    r->n_tokens = 0;
    return 0;
}

/* The ids (and types) of one line: the text alone, or the query paired with it. */
static int tokenize(run *r, const char *query, const char *text, size_t len, int64_t line_no, int truncate,
                    int32_t **ids, size_t *ids_cap, int32_t **types, size_t *types_cap, int32_t *n) {
    nopad_tokenize_params tp = nopad_tokenize_default_params();
    tp.truncate = truncate;
    tp.max_length = r->info.max_seq_length;
    for (;;) {
        const int32_t cap = *ids_cap > INT32_MAX ? INT32_MAX : (int32_t)*ids_cap;
        nopad_status st = r->rerank
                              ? nopad_tokenize_pair(r->tok, query, strlen(query), text, len, &tp, *ids, *types, cap, n)
                              : nopad_tokenize(r->tok, text, len, &tp, *ids, cap, n);
        if (st == NOPAD_ERR_BUFFER_TOO_SMALL && *n > cap) {
            if (reserve((void **)ids, ids_cap, (size_t)*n, sizeof(int32_t)) ||
                reserve((void **)types, types_cap, (size_t)*n, sizeof(int32_t)))
                return -1;
            continue;
        }
        if (st == NOPAD_ERR_TOO_LONG) {
            print_error("line %" PRId64 ": %s of %" PRId32 " tokens is longer than the model's maximum sequence "
                        "length %" PRId32 " (--truncate cuts it)",
                        line_no, r->rerank ? "the pair" : "sequence", *n, tp.max_length);
            return -1;
        }
        if (st != NOPAD_OK) {
            print_error("line %" PRId64 ": %s", line_no, library_error(st));
            return -1;
        }
        if (*n == 0) {
            print_error("line %" PRId64 ": the line gives no tokens", line_no);
            return -1;
        }
        return 0;
    }
}

enum { OPT_MODEL = 256, OPT_QUERY, OPT_INPUT, OPT_OUTPUT, OPT_TRUNCATE, OPT_BATCH_TOKENS, OPT_THREADS,
       OPT_DEVICE, OPT_DTYPE };

static const struct option long_options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"query", required_argument, NULL, OPT_QUERY},
    {"input", required_argument, NULL, OPT_INPUT},
    {"output", required_argument, NULL, OPT_OUTPUT},
    {"truncate", no_argument, NULL, OPT_TRUNCATE},
    {"batch-tokens", required_argument, NULL, OPT_BATCH_TOKENS},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int run_command(int argc, char **argv, int rerank) {
    const char *name = rerank ? "rerank" : "classify";
    const char *model_dir = NULL, *query = NULL, *input = NULL, *output = NULL;
    int truncate = 0, threads = 0, dtype_given = 0;
    nopad_device device = NOPAD_DEVICE_CPU;
    nopad_dtype dtype = NOPAD_DTYPE_F32;
    int32_t batch_tokens = DEFAULT_BATCH_TOKENS;
    cli_parser p = cli_parser_start(argc, argv, long_options);
    int c;
    while ((c = cli_getopt(&p)) != -1) {
        long v = 0;
        switch (c) {
        case 'h':
            fputs(rerank ? rerank_help : classify_help, stdout);
            fputs(common_help, stdout);
            return EXIT_OK;
        case OPT_MODEL: model_dir = optarg; break;
        case OPT_QUERY: query = optarg; break;
        case OPT_INPUT: input = strcmp(optarg, "-") ? optarg : NULL; break;
        case OPT_OUTPUT: output = strcmp(optarg, "-") ? optarg : NULL; break;
        case OPT_TRUNCATE: truncate = 1; break;
        case OPT_BATCH_TOKENS:
            if (parse_int("--batch-tokens", optarg, 1, INT32_MAX / 2, &v)) goto usage;
            batch_tokens = (int32_t)v;
            break;
        case OPT_THREADS:
            if (parse_int("--threads", optarg, 0, 4096, &v)) goto usage;
            threads = (int)v;
            break;
        case OPT_DEVICE:
            if (parse_device(optarg, &device)) goto usage;
            break;
        case OPT_DTYPE:
            if (parse_dtype(optarg, &dtype)) goto usage;
            dtype_given = 1;
            break;
        default: cli_print_opt_error(&p); goto usage;
        }
    }
    if (!model_dir) {
        print_error("missing --model DIR");
        goto usage;
    }
    if (rerank && !query) {
        print_error("missing --query TEXT (the query every line is paired with)");
        goto usage;
    }
    if (!rerank && query) {
        print_error("--query belongs to nopad rerank; nopad classify scores each line alone");
        goto usage;
    }
    if (output_check(output, input)) goto usage;

    run r = {.rerank = rerank, .in = stdin, .out = stdout, .in_name = "stdin", .out_name = "stdout", .first_line = 1};
    char *line = NULL;
    size_t line_cap = 0, ids_cap = 0, types_cap = 0;
    int32_t *ids = NULL, *types = NULL;
    int rc = EXIT_ERROR;
    if (input && !(r.in = fopen(input, "rb"))) {
        print_error("cannot open input '%s': %s", input, strerror(errno));
        goto done;
    }
    if (input) r.in_name = input;
    if (!(r.model = open_model(model_dir, device, dtype, dtype_given, threads))) goto done;
    nopad_status st = nopad_model_get_info(r.model, &r.info);
    if (st != NOPAD_OK) {
        print_error("%s", library_error(st));
        goto done;
    }
    r.num_labels = nopad_model_num_labels(r.model);
    if (r.info.is_decoder || r.num_labels == 0) {
        print_error("model '%s' has no sequence-classification head (config.json's architectures is not a "
                    "*ForSequenceClassification); nopad %s needs one",
                    model_dir, name);
        goto done;
    }
    if (rerank && r.num_labels != 1) {
        print_error("model '%s' has %d labels; nopad rerank needs a one-label head (a cross-encoder); use nopad "
                    "classify for it",
                    model_dir, r.num_labels);
        goto done;
    }
    if (!(r.tok = nopad_model_tokenizer(r.model))) {
        const char *why = nopad_model_tokenizer_error(r.model);
        print_error("model folder '%s' has %s, so text cannot be scored", model_dir,
                    why ? "an unsupported tokenizer" : "no tokenizer.json or vocab.txt");
        goto done;
    }
    if (output_open(&r.file, output)) goto done;
    r.out = r.file.f;
    r.out_name = r.file.name;
    int64_t line_no = 0;
    for (;;) {
        errno = 0;
        const ssize_t got = getline(&line, &line_cap, r.in);
        if (got < 0) {
            if (ferror(r.in)) {
                print_error("cannot read %s: %s", r.in_name, errno ? strerror(errno) : "error");
                goto done;
            }
            break;
        }
        line_no++;
        size_t len = (size_t)got;
        if (len && line[len - 1] == '\n') len--;
        if (len && line[len - 1] == '\r') len--;
        int32_t n = 0;
        if (reserve((void **)&types, &types_cap, ids_cap ? ids_cap : 1, sizeof(int32_t)) ||
            tokenize(&r, query, line, len, line_no, truncate, &ids, &ids_cap, &types, &types_cap, &n))
            goto done;
        if (r.n_seqs > 0 && r.n_tokens + n > batch_tokens && flush(&r)) goto done;
        if (reserve((void **)&r.tokens, &r.tokens_cap, (size_t)(r.n_tokens + n), sizeof(int32_t)) ||
            reserve((void **)&r.types, &r.types_cap, (size_t)(r.n_tokens + n), sizeof(int32_t)) ||
            reserve((void **)&r.cu, &r.cu_cap, (size_t)r.n_seqs + 2, sizeof(int32_t)))
            goto done;
        memcpy(r.tokens + r.n_tokens, ids, (size_t)n * sizeof(int32_t));
        if (rerank) memcpy(r.types + r.n_tokens, types, (size_t)n * sizeof(int32_t));
        r.cu[0] = 0;
        r.n_tokens += n;
        r.cu[++r.n_seqs] = (int32_t)r.n_tokens;
    }
    if (line_no == 0) {
        print_error("no input lines in %s (give at least one line)", r.in_name);
        goto done;
    }
    if (flush(&r) == 0 && output_commit(&r.file) == 0) rc = EXIT_OK;
done:
    if (r.in && r.in != stdin) fclose(r.in);
    output_discard(&r.file);
    free(line), free(ids), free(types), free(r.tokens), free(r.types), free(r.cu), free(r.logits);
    nopad_model_free(r.model);
    return rc;
usage:
    fprintf(stderr, "usage: nopad %s --model DIR%s [options]   (nopad %s --help lists them)\n", name,
            rerank ? " --query TEXT" : "", name);
    return EXIT_USAGE;
}

int cmd_classify(int argc, char **argv) { return run_command(argc, argv, 0); }
int cmd_rerank(int argc, char **argv) { return run_command(argc, argv, 1); }
