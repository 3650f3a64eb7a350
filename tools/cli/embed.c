/* `nopad embed`: lines of text (or token ids) in, one embedding per line out.
 *
 * Input is read as a stream and encoded in batches of at most --batch-tokens tokens, one
 * nopad_encode_packed call per batch, so memory stays bounded by one batch whatever the input
 * size (except .npy written to a pipe, see struct writer in output.h). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "cli.h"
#include "input.h"
#include "nopad.h"
#include "output.h"

enum { DEFAULT_BATCH_TOKENS = 16384 };

static const char embed_help[] =
    "usage: nopad embed --model DIR [options]\n"
    "\n"
    "Reads lines of UTF-8 text (stdin, or --input) and writes one embedding per line (stdout, or\n"
    "--output), in input order. Every line is one input, empty lines included (an empty line\n"
    "embeds just the special tokens, e.g. [CLS] [SEP]). Lines end at '\\n'; a trailing '\\r' is\n"
    "dropped; a last line without '\\n' counts. An input with no lines at all is an error.\n"
    "\n"
    "options:\n"
    "  --model DIR         Hugging Face model folder (config.json, model.safetensors) [required]\n"
    "  --input FILE        read lines from FILE ('-': stdin, the default)\n"
    "  --output FILE       write to FILE ('-': stdout, the default)\n"
    "  --ids               lines are whitespace-separated decimal token ids, used exactly as given\n"
    "                      (no special tokens are added); each id < the vocabulary size, each\n"
    "                      line at least one id. No tokenizer is needed.\n"
    "  --pooling P         cls, mean, max, or none (the last hidden state of every token);\n"
    "                      default: the folder's sentence-transformers pooling, else cls\n"
    "  --normalize         L2-normalise pooled embeddings\n"
    "  --no-normalize      do not; default: the folder's sentence-transformers setting\n"
    "  --format F          jsonl or npy; default: npy when --output ends in .npy, else jsonl\n"
    "  --truncate          cut sequences longer than the model's maximum sequence length (text\n"
    "                      keeps its closing special token; --ids lines keep their first ids);\n"
    "                      without it a longer sequence is an error\n"
    "  --batch-tokens N    tokens per forward pass (default 16384); lines are grouped in input\n"
    "                      order up to N tokens, a longer sequence runs alone\n"
    "  --device D          cpu (default) or cuda\n"
    "  --dtype T           compute dtype: fp32 (CPU default; the CPU runs fp32 only), fp16 (CUDA\n"
    "                      default) or bf16\n"
    "  --threads N         CPU threads (default: OpenMP's default)\n"
    TP_HELP
    "  -h, --help          show this help\n"
    "\n"
    "output:\n"
    "  jsonl, pooled       one JSON array of H floats per input line\n"
    "  jsonl, --pooling none\n"
    "                      one JSON array per input line, holding one array of H floats per token\n"
    "  npy, pooled         one float32 array [B, H], B = the number of input lines\n"
    "  npy, --pooling none one float32 array [T, H]: every token of every line, back to back in\n"
    "                      input order (T = the total token count)\n"
    "  Floats are written with 9 significant digits, which read back as the same float32.\n"
    "\n"
    "errors:\n"
    "  A bad line (invalid UTF-8, a bad token id, an empty --ids line, a sequence too long without\n"
    "  --truncate) or a non-finite result stops the run with a message naming the line, exit\n"
    "  status 1. An --output file is then left as it was (it is written to a temporary file\n"
    "  beside it and renamed at the end); stdout has the embeddings of earlier lines. An\n"
    "  --output that is the --input file is refused. Progress goes to stderr when it is a\n"
    "  terminal and the run takes over 1 s.\n";

/* ---- batches --------------------------------------------------------------------------------- */

/* Lines waiting for one nopad_encode_packed call. */
typedef struct batch {
    int32_t *tokens;      /* [T] ids of the batch's sequences, back to back */
    int32_t *cu_seqlens;  /* [n_seqs + 1] */
    size_t tokens_cap, seqs_cap;
    int32_t n_seqs;
    int64_t n_tokens;
    int64_t first_line;   /* 1-based input line of sequence 0, for messages */
    float *out;           /* [n_seqs, H] pooled or [T, H] hidden states */
    size_t out_cap;       /* in floats */
} batch;

static int batch_add(batch *b, const int32_t *ids, int32_t n, int64_t line_no) {
    if (b->n_seqs == 0) {
        b->first_line = line_no;
        if (reserve((void **)&b->cu_seqlens, &b->seqs_cap, 1, sizeof(int32_t))) return -1;
        b->cu_seqlens[0] = 0;
    }
    if (b->n_tokens + n > INT32_MAX) { /* cu_seqlens is int32; --batch-tokens keeps T far below */
        print_error("line %" PRId64 ": batch exceeds 2^31 tokens", line_no);
        return -1;
    }
    if (reserve((void **)&b->tokens, &b->tokens_cap, (size_t)(b->n_tokens + n), sizeof(int32_t)) ||
        reserve((void **)&b->cu_seqlens, &b->seqs_cap, (size_t)b->n_seqs + 2, sizeof(int32_t)))
        return -1;
    memcpy(b->tokens + b->n_tokens, ids, (size_t)n * sizeof(int32_t));
    b->n_tokens += n;
    b->n_seqs++;
    b->cu_seqlens[b->n_seqs] = (int32_t)b->n_tokens;
    return 0;
}

/* Everything one embed run owns; freed in one place on every path. */
typedef struct embed_run {
    nopad_model *model;
    const nopad_tokenizer *tok; /* owned by the model */
    nopad_model_info info;
    nopad_encode_params encode;
    int per_token;              /* resolved pooling is none */
    FILE *in;
    const char *in_name;
    writer out;
    output_file file; /* out.f, written whole at the end */
    batch b;
    progress prog;
    char *line;
    size_t line_cap;
    int32_t *ids;               /* [ids_cap] the current line's ids */
    size_t ids_cap;
} embed_run;

/* Encodes the pending batch, writes its results and empties it. */
static int flush_batch(embed_run *r) {
    batch *b = &r->b;
    if (b->n_seqs == 0) return 0;
    const int32_t H = r->info.hidden_size;
    const size_t rows = (size_t)(r->per_token ? b->n_tokens : b->n_seqs);
    if (reserve((void **)&b->out, &b->out_cap, rows * (size_t)H, sizeof(float))) return -1;
    nopad_status status =
        nopad_encode_packed(r->model, b->n_seqs, b->cu_seqlens, b->tokens, NULL, &r->encode,
                            r->per_token ? b->out : NULL, r->per_token ? NULL : b->out);
    if (status != NOPAD_OK) {
        if (b->n_seqs == 1)
            print_error("line %" PRId64 ": %s", b->first_line, library_error(status));
        else
            print_error("lines %" PRId64 "-%" PRId64 ": %s", b->first_line,
                        b->first_line + b->n_seqs - 1, library_error(status));
        return -1;
    }
    /* A NaN or infinity means a broken model or overflow; never pass it on silently (and JSON
     * cannot hold it). */
    for (size_t i = 0; i < rows * (size_t)H; i++) {
        if (!isfinite(b->out[i])) {
            int32_t s = 0;
            if (r->per_token)
                while (s + 1 < b->n_seqs && (size_t)b->cu_seqlens[s + 1] <= i / (size_t)H) s++;
            else
                s = (int32_t)(i / (size_t)H);
            print_error("line %" PRId64 ": the embedding contains %s", b->first_line + s,
                        isnan(b->out[i]) ? "NaN" : "infinity");
            return -1;
        }
    }
    if (writer_batch(&r->out, b->n_seqs, b->cu_seqlens, b->out)) return -1;
    r->prog.lines += b->n_seqs;
    r->prog.tokens += b->n_tokens;
    progress_show(&r->prog, 0);
    b->n_seqs = 0;
    b->n_tokens = 0;
    return 0;
}

typedef struct embed_options {
    const char *model_dir, *input_path, *output_path;
    int ids;
    nopad_pooling pooling;
    int normalize;   /* -1: the folder's default */
    int format;      /* -1: from the output name */
    int truncate;
    int32_t batch_tokens;
    nopad_device device;
    nopad_dtype dtype;
    int dtype_given; /* 0: fp32 on the CPU, fp16 on CUDA */
    int threads;
    int32_t tp;
} embed_options;

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

enum {
    OPT_MODEL = 256, OPT_INPUT, OPT_OUTPUT, OPT_IDS, OPT_POOLING, OPT_NORMALIZE, OPT_NO_NORMALIZE,
    OPT_FORMAT, OPT_TRUNCATE, OPT_BATCH_TOKENS, OPT_DEVICE, OPT_DTYPE, OPT_THREADS, OPT_TP
};

static const struct option long_options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"input", required_argument, NULL, OPT_INPUT},
    {"output", required_argument, NULL, OPT_OUTPUT},
    {"ids", no_argument, NULL, OPT_IDS},
    {"pooling", required_argument, NULL, OPT_POOLING},
    {"normalize", no_argument, NULL, OPT_NORMALIZE},
    {"no-normalize", no_argument, NULL, OPT_NO_NORMALIZE},
    {"format", required_argument, NULL, OPT_FORMAT},
    {"truncate", no_argument, NULL, OPT_TRUNCATE},
    {"batch-tokens", required_argument, NULL, OPT_BATCH_TOKENS},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"tp", required_argument, NULL, OPT_TP},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Returns 0 to run, 1 when help was printed, -1 on a usage error (already reported). */
static int parse_embed_options(int argc, char **argv, embed_options *o) {
    *o = (embed_options){.pooling = NOPAD_POOLING_MODEL, .normalize = -1, .format = -1,
                         .batch_tokens = DEFAULT_BATCH_TOKENS, .tp = 1};
    cli_parser p = cli_parser_start(argc, argv, long_options);
    int c;
    while ((c = cli_getopt(&p)) != -1) {
        long v = 0;
        switch (c) {
        case 'h': fputs(embed_help, stdout); return 1;
        case OPT_MODEL: o->model_dir = optarg; break;
        case OPT_INPUT: o->input_path = optarg; break;
        case OPT_OUTPUT: o->output_path = optarg; break;
        case OPT_IDS: o->ids = 1; break;
        case OPT_NORMALIZE: o->normalize = 1; break;
        case OPT_NO_NORMALIZE: o->normalize = 0; break;
        case OPT_TRUNCATE: o->truncate = 1; break;
        case OPT_POOLING:
            if (parse_pooling(optarg, &o->pooling)) return -1;
            break;
        case OPT_FORMAT:
            if (strcmp(optarg, "jsonl") == 0) o->format = FORMAT_JSONL;
            else if (strcmp(optarg, "npy") == 0) o->format = FORMAT_NPY;
            else {
                print_error("unknown format '%s' (expected jsonl or npy)", optarg);
                return -1;
            }
            break;
        case OPT_DEVICE:
            if (parse_device(optarg, &o->device)) return -1;
            break;
        case OPT_DTYPE:
            if (parse_dtype(optarg, &o->dtype)) return -1;
            o->dtype_given = 1;
            break;
        case OPT_THREADS:
            if (parse_int("--threads", optarg, 0, 4096, &v)) return -1;
            o->threads = (int)v;
            break;
        case OPT_TP:
            if (parse_int("--tp", optarg, 1, TP_MAX, &v)) return -1;
            o->tp = (int32_t)v;
            break;
        case OPT_BATCH_TOKENS:
            if (parse_int("--batch-tokens", optarg, 1, INT32_MAX / 2, &v)) return -1;
            o->batch_tokens = (int32_t)v;
            break;
        default: cli_print_opt_error(&p); return -1;
        }
    }
    if (!o->model_dir) {
        print_error("missing --model DIR");
        return -1;
    }
    if (o->pooling == NOPAD_POOLING_NONE && o->normalize == 1) {
        print_error("--normalize applies to pooled embeddings, not to --pooling none");
        return -1;
    }
    if (o->input_path && strcmp(o->input_path, "-") == 0) o->input_path = NULL;
    if (o->output_path && strcmp(o->output_path, "-") == 0) o->output_path = NULL;
    if (o->format < 0) o->format = o->output_path && ends_with(o->output_path, ".npy");
    return output_check(o->output_path, o->input_path);
}
static void embed_run_free(embed_run *r) {
    if (r->in && r->in != stdin) fclose(r->in);
    output_discard(&r->file);
    writer_free(&r->out);
    free(r->b.tokens);
    free(r->b.cu_seqlens);
    free(r->b.out);
    free(r->line);
    free(r->ids);
    nopad_model_free(r->model);
}

static int embed_stream(embed_run *r, const embed_options *o) {
    const int32_t max_length = r->info.max_seq_length > 0 ? r->info.max_seq_length : 0;
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
        size_t len = (size_t)got;
        if (len && r->line[len - 1] == '\n') len--;
        if (len && r->line[len - 1] == '\r') len--;
        int32_t n = 0;
        int rc = o->ids ? parse_id_line(r->line, len, line_no, r->info.vocab_size, max_length,
                                        o->truncate, &r->ids, &r->ids_cap, &n)
                        : tokenize_line(r->tok, r->line, len, line_no, max_length, o->truncate,
                                        &r->ids, &r->ids_cap, &n);
        if (rc) return -1;
        if (r->b.n_seqs > 0 && r->b.n_tokens + n > o->batch_tokens && flush_batch(r)) return -1;
        if (batch_add(&r->b, r->ids, n, line_no)) return -1;
    }
    if (line_no == 0) {
        print_error("no input lines in %s (an empty batch; give at least one line)", r->in_name);
        return -1;
    }
    if (flush_batch(r) || writer_end(&r->out)) return -1;
    progress_show(&r->prog, 1);
    return 0;
}

int cmd_embed(int argc, char **argv) {
    embed_options o;
    int parsed = parse_embed_options(argc, argv, &o);
    if (parsed > 0) return EXIT_OK;
    if (parsed < 0) {
        fputs("usage: nopad embed --model DIR [options]   (nopad embed --help lists them)\n",
              stderr);
        return EXIT_USAGE;
    }
    nopad_model_params mp = model_params(o.device, o.dtype, o.dtype_given, o.threads);
    mp.tp_size = o.tp;
    const int rank = tp_begin(o.tp, o.device);
    if (rank < 0) return EXIT_ERROR;
    if (rank > 0) return tp_follow(o.model_dir, &mp);
    embed_run r = {0};
    nopad_status status;
    int rc = EXIT_ERROR;
    /* Input first: a missing file fails before the (slow) model load. */
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
    r.model = open_model_with(o.model_dir, &mp);
    if (!r.model) goto done;
    status = nopad_model_get_info(r.model, &r.info);
    if (status != NOPAD_OK) {
        print_error("%s", library_error(status));
        goto done;
    }
    if (r.info.is_decoder) {
        print_error("model '%s' is a decoder (%s); nopad embed runs encoders: use nopad generate "
                    "for it",
                    o.model_dir, r.info.family);
        goto done;
    }
    r.tok = nopad_model_tokenizer(r.model);
    if (!o.ids && !r.tok && nopad_model_tokenizer_error(r.model)) {
        print_error("the tokenizer of model folder '%s' is not supported (%s), so text cannot be "
                    "embedded; use --ids",
                    o.model_dir, nopad_model_tokenizer_error(r.model));
        goto done;
    }
    if (!o.ids && !r.tok) {
        print_error("model folder '%s' has no tokenizer.json or vocab.txt; use --ids",
                    o.model_dir);
        goto done;
    }
    r.encode = nopad_encode_default_params();
    r.encode.pooling = o.pooling == NOPAD_POOLING_MODEL ? r.info.pooling : o.pooling;
    if (r.encode.pooling == NOPAD_POOLING_MODEL) r.encode.pooling = NOPAD_POOLING_CLS;
    r.encode.normalize = o.normalize;
    r.per_token = r.encode.pooling == NOPAD_POOLING_NONE;
    if (r.per_token) r.encode.normalize = 0;

    /* Output last, so that a failed load leaves an existing file alone. */
    if (output_open(&r.file, o.output_path)) goto done;
    r.out.f = r.file.f;
    r.out.name = r.file.name;
    r.out.format = (out_format)o.format;
    r.out.per_token = r.per_token;
    r.out.hidden = r.info.hidden_size;
    if (writer_begin(&r.out)) goto done;
    r.prog.enabled = isatty(STDERR_FILENO);
    r.prog.start = r.prog.last = now_seconds();
    if (embed_stream(&r, &o) == 0 && output_commit(&r.file) == 0) rc = EXIT_OK;
done:
    embed_run_free(&r);
    return rc;
}
