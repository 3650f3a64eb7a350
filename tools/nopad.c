/* nopad — the command-line front end.
 *
 *   nopad embed --model DIR [options]   text (or token id) lines in, one embedding per line out
 *   nopad info --model DIR [--json]     what a model folder holds
 *
 * Uses the public API only (include/nopad.h). Input is read as a stream and encoded in batches of
 * at most --batch-tokens tokens, one nopad_encode_packed call per batch, so memory stays bounded
 * by one batch whatever the input size (except .npy written to a pipe, see struct writer). */
#define _POSIX_C_SOURCE 200809L /* getline, fileno, fseeko, isatty, clock_gettime */

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "nopad.h"

enum { EXIT_OK = 0, EXIT_ERROR = 1, EXIT_USAGE = 2 };
enum { DEFAULT_BATCH_TOKENS = 16384 };

/* ---- help texts ---------------------------------------------------------------------------- */

static const char main_help[] =
    "usage: nopad <command> [options]\n"
    "\n"
    "Padding-free inference for BERT-family encoders (BERT, RoBERTa, DistilBERT, ALBERT).\n"
    "\n"
    "commands:\n"
    "  embed     embed lines of text (or token ids), one embedding per line\n"
    "  info      describe a model folder\n"
    "  bench     time the encoder on random batches (the ENC workload)\n"
    "\n"
    "options:\n"
    "  -h, --help       show this help; 'nopad <command> --help' shows a command's options\n"
    "  -V, --version    print the version\n"
    "\n"
    "exit status: 0 success, 1 error (message on stderr), 2 bad command line.\n";

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
    "  status 1. Embeddings of earlier lines may already have been written; an .npy output is\n"
    "  then incomplete. Progress goes to stderr when it is a terminal and the run takes over 1 s.\n";

static const char info_help[] =
    "usage: nopad info --model DIR [--json] [--device D] [--dtype T]\n"
    "\n"
    "Loads a model folder and prints its architecture, sizes, tokenizer and default pooling.\n"
    "\n"
    "options:\n"
    "  --model DIR     Hugging Face model folder [required]\n"
    "  --json          print one JSON object instead of aligned 'key: value' lines\n"
    "  --device D      cpu (default) or cuda\n"
    "  --dtype T       compute dtype: fp32 (CPU default), fp16 (CUDA default) or bf16\n"
    "  -h, --help      show this help\n";

/* ---- messages ------------------------------------------------------------------------------ */

/* Set while a progress line without its newline is on stderr, so that a message starts afresh. */
static int progress_line_open;

#if defined(__GNUC__)
#define PRINTF_LIKE(a, b) __attribute__((format(printf, a, b)))
#else
#define PRINTF_LIKE(a, b)
#endif

static void print_error(const char *fmt, ...) PRINTF_LIKE(1, 2);
static void print_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (progress_line_open) fputc('\n', stderr);
    progress_line_open = 0;
    fputs("nopad: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* The library's message for a failed call, or the status name when it left none. */
static const char *library_error(nopad_status status) {
    const char *message = nopad_last_error();
    return message && message[0] ? message : nopad_status_string(status);
}

/* ---- command-line parsing ------------------------------------------------------------------ */

/* One parsed option: its name ("--model") and value (NULL for flags). */
typedef struct option_arg {
    char name[64];
    const char *value;
} option_arg;

static int in_list(const char *const *list, const char *name) {
    for (int i = 0; list[i]; i++)
        if (strcmp(list[i], name) == 0) return 1;
    return 0;
}

/* Splits argv[*i] into an option name and, for the options in `takes_value`, its value, given as
 * "--name VALUE" or "--name=VALUE". Returns 0, or prints why and returns -1. */
static int next_option(int argc, char **argv, int *i, const char *const *takes_value,
                       option_arg *opt) {
    const char *arg = argv[*i];
    if (arg[0] != '-' || arg[1] == '\0') {
        print_error("unexpected argument '%s'", arg);
        return -1;
    }
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    if (n >= sizeof opt->name) {
        print_error("unknown option '%s'", arg);
        return -1;
    }
    memcpy(opt->name, arg, n);
    opt->name[n] = '\0';
    opt->value = NULL;
    if (in_list(takes_value, opt->name)) {
        if (eq) {
            opt->value = eq + 1;
        } else if (*i + 1 < argc) {
            opt->value = argv[++*i];
        } else {
            print_error("option %s needs a value", opt->name);
            return -1;
        }
    } else if (eq) {
        print_error("option %s takes no value", opt->name);
        return -1;
    }
    return 0;
}

/* Parses a whole decimal integer in [lo, hi]. */
static int parse_int(const char *name, const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi) {
        print_error("%s expects an integer in [%ld, %ld], got '%s'", name, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static const char *pooling_name(nopad_pooling p) {
    switch (p) {
    case NOPAD_POOLING_MODEL: return "model";
    case NOPAD_POOLING_NONE: return "none";
    case NOPAD_POOLING_CLS: return "cls";
    case NOPAD_POOLING_MEAN: return "mean";
    case NOPAD_POOLING_MAX: return "max";
    }
    return "unknown";
}

static int parse_pooling(const char *s, nopad_pooling *out) {
    static const nopad_pooling all[] = {NOPAD_POOLING_NONE, NOPAD_POOLING_CLS, NOPAD_POOLING_MEAN,
                                        NOPAD_POOLING_MAX};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(s, pooling_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    }
    print_error("unknown pooling '%s' (expected cls, mean, max or none)", s);
    return -1;
}

static int parse_device(const char *s, nopad_device *out) {
    if (strcmp(s, "cpu") == 0) *out = NOPAD_DEVICE_CPU;
    else if (strcmp(s, "cuda") == 0) *out = NOPAD_DEVICE_CUDA;
    else {
        print_error("unknown device '%s' (expected cpu or cuda)", s);
        return -1;
    }
    return 0;
}

static int parse_dtype(const char *s, nopad_dtype *out) {
    if (strcmp(s, "fp32") == 0) *out = NOPAD_DTYPE_F32;
    else if (strcmp(s, "fp16") == 0) *out = NOPAD_DTYPE_F16;
    else if (strcmp(s, "bf16") == 0) *out = NOPAD_DTYPE_BF16;
    else {
        print_error("unknown dtype '%s' (expected fp32, fp16 or bf16)", s);
        return -1;
    }
    return 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* ---- model loading (shared by embed and info) ---------------------------------------------- */

/* Loads `dir`, or prints why not and returns NULL. The folder is checked here first so that a
 * mistyped path reads as such rather than as a missing config.json. */
static nopad_model *open_model(const char *dir, nopad_device device, nopad_dtype dtype,
                               int dtype_given, int n_threads) {
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT) print_error("model folder '%s' does not exist", dir);
        else print_error("model folder '%s': %s", dir, strerror(errno));
        return NULL;
    }
    if (!S_ISDIR(st.st_mode)) {
        print_error("model folder '%s' is not a folder", dir);
        return NULL;
    }
    nopad_model_params params = nopad_model_default_params();
    params.device = device;
    /* without --dtype: the CPU computes in fp32, the GPU in fp16 */
    params.dtype = dtype_given ? dtype : device == NOPAD_DEVICE_CUDA ? NOPAD_DTYPE_F16 : NOPAD_DTYPE_F32;
    params.n_threads = n_threads;
    nopad_model *model = NULL;
    nopad_status status = nopad_model_load(dir, &params, &model);
    if (status != NOPAD_OK) {
        print_error("cannot load model '%s': %s", dir, library_error(status));
        nopad_model_free(model);
        return NULL;
    }
    return model;
}

/* ---- growable buffers ---------------------------------------------------------------------- */

/* Makes room for `n` elements of `size` bytes in *buf (capacity *cap elements). */
static int reserve(void **buf, size_t *cap, size_t n, size_t size) {
    if (n <= *cap) return 0;
    size_t new_cap = *cap ? *cap : 64;
    while (new_cap < n) new_cap *= 2;
    if (new_cap > SIZE_MAX / size) new_cap = n;
    void *p = realloc(*buf, new_cap * size);
    if (!p) {
        print_error("out of memory (%zu bytes)", new_cap * size);
        return -1;
    }
    *buf = p;
    *cap = new_cap;
    return 0;
}

/* ---- .npy output --------------------------------------------------------------------------- */

/* .npy format 1.0: magic, version, a little-endian u16 header length, then a Python dict literal
 * padded with spaces and ending in '\n' so that the data starts at a multiple of 64 bytes. The
 * header is always NPY_HEADER_BYTES long, room for any shape, so that it can be rewritten in
 * place once the row count is known. */
enum { NPY_HEADER_BYTES = 128 };

static int write_npy_header(FILE *f, int64_t rows, int32_t cols) {
    const uint16_t one = 1;
    const char endian = *(const unsigned char *)&one == 1 ? '<' : '>'; /* floats are host order */
    char header[NPY_HEADER_BYTES];
    memset(header, ' ', sizeof header);
    memcpy(header, "\x93NUMPY\x01\x00", 8);
    header[8] = (char)((NPY_HEADER_BYTES - 10) & 0xff);
    header[9] = (char)((NPY_HEADER_BYTES - 10) >> 8);
    char dict[NPY_HEADER_BYTES];
    int n = snprintf(dict, sizeof dict,
                     "{'descr': '%cf4', 'fortran_order': False, 'shape': (%" PRId64 ", %" PRId32
                     "), }",
                     endian, rows, cols);
    if (n < 0 || n > NPY_HEADER_BYTES - 11) return -1; /* cannot happen: the dict is < 100 bytes */
    memcpy(header + 10, dict, (size_t)n);
    header[NPY_HEADER_BYTES - 1] = '\n';
    return fwrite(header, 1, sizeof header, f) == sizeof header ? 0 : -1;
}

/* ---- output writer ------------------------------------------------------------------------- */

typedef enum out_format { FORMAT_JSONL = 0, FORMAT_NPY = 1 } out_format;

/* Writes results in input order. An .npy file needs its row count in the header, unknown while
 * streaming: a regular file gets a placeholder header that is rewritten at the end; anything
 * else (a pipe, or a file opened for appending, where every write lands at the end) has its rows
 * held in memory and written at the end. */
typedef struct writer {
    FILE *f;
    const char *name;      /* for messages: the path or "stdout" */
    out_format format;
    int per_token;         /* --pooling none: rows are tokens, not sequences */
    int32_t hidden;        /* H */
    int64_t rows;          /* rows written (npy) */
    int seekable;          /* npy: header rewritten in place at header_pos */
    off_t header_pos;
    float *held;           /* [rows, H] npy rows kept for the end when f cannot seek */
    size_t held_cap;       /* in floats */
} writer;

static int writer_failed(writer *w) {
    print_error("cannot write %s: %s", w->name, errno ? strerror(errno) : "write error");
    return -1;
}

static int writer_begin(writer *w) {
    if (w->format != FORMAT_NPY) return 0;
    struct stat st;
    w->seekable = 0;
    int flags = fcntl(fileno(w->f), F_GETFL);
    if (fstat(fileno(w->f), &st) == 0 && S_ISREG(st.st_mode) && flags >= 0 && !(flags & O_APPEND)) {
        w->header_pos = ftello(w->f);
        w->seekable = w->header_pos >= 0;
    }
    if (w->seekable && write_npy_header(w->f, 0, w->hidden) != 0) return writer_failed(w);
    return 0;
}

/* One JSON array of n floats. "%.9g" round-trips a float32 exactly; values are finite (checked
 * by the caller) since JSON has no NaN or infinity. */
static void write_json_row(FILE *f, const float *x, int32_t n) {
    fputc('[', f);
    for (int32_t i = 0; i < n; i++) {
        if (i) fputc(',', f);
        fprintf(f, "%.9g", (double)x[i]);
    }
    fputc(']', f);
}

/* out is [n_seqs, H] pooled, or [T, H] per token with cu_seqlens[n_seqs+1]. */
static int writer_batch(writer *w, int32_t n_seqs, const int32_t *cu_seqlens, const float *out) {
    const int32_t H = w->hidden;
    const size_t rows = (size_t)(w->per_token ? cu_seqlens[n_seqs] : n_seqs);
    errno = 0;
    if (w->format == FORMAT_NPY) {
        if (w->seekable) {
            if (fwrite(out, sizeof(float) * (size_t)H, rows, w->f) != rows) return writer_failed(w);
        } else {
            size_t have = (size_t)w->rows * (size_t)H;
            if (reserve((void **)&w->held, &w->held_cap, have + rows * (size_t)H, sizeof(float)))
                return -1;
            memcpy(w->held + have, out, rows * (size_t)H * sizeof(float));
        }
        w->rows += (int64_t)rows;
        return 0;
    }
    for (int32_t s = 0; s < n_seqs; s++) {
        if (w->per_token) {
            fputc('[', w->f);
            for (int32_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; t++) {
                if (t > cu_seqlens[s]) fputc(',', w->f);
                write_json_row(w->f, out + (size_t)t * (size_t)H, H);
            }
            fputc(']', w->f);
        } else {
            write_json_row(w->f, out + (size_t)s * (size_t)H, H);
        }
        fputc('\n', w->f);
    }
    if (ferror(w->f)) return writer_failed(w);
    return 0;
}

/* Completes the .npy header (or writes everything held) and flushes. */
static int writer_end(writer *w) {
    errno = 0;
    if (w->format == FORMAT_NPY) {
        if (w->seekable) {
            if (fseeko(w->f, w->header_pos, SEEK_SET) != 0 ||
                write_npy_header(w->f, w->rows, w->hidden) != 0 || fseeko(w->f, 0, SEEK_END) != 0)
                return writer_failed(w);
        } else {
            size_t n = (size_t)w->rows;
            if (write_npy_header(w->f, w->rows, w->hidden) != 0 ||
                (n && fwrite(w->held, sizeof(float) * (size_t)w->hidden, n, w->f) != n))
                return writer_failed(w);
        }
    }
    if (fflush(w->f) != 0 || ferror(w->f)) return writer_failed(w);
    return 0;
}

/* ---- progress ------------------------------------------------------------------------------ */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A "\r embedded ..." line on stderr, only when stderr is a terminal and the run has taken over a
 * second (a quick run or a log file stays clean), at most 4 times a second. */
typedef struct progress {
    int enabled;
    int shown;
    double start, last;
    int64_t lines, tokens;
} progress;

static void progress_show(progress *p, int final) {
    if (!p->enabled) return;
    double t = now_seconds();
    if (!final && (t - p->start < 1.0 || t - p->last < 0.25)) return;
    if (final && !p->shown) return;
    double elapsed = t - p->start > 1e-9 ? t - p->start : 1e-9;
    fprintf(stderr, "\r embedded %" PRId64 " lines, %" PRId64 " tokens, %.0f tokens/s ", p->lines,
            p->tokens, (double)p->tokens / elapsed);
    if (final) fputc('\n', stderr);
    fflush(stderr);
    progress_line_open = !final;
    p->shown = 1;
    p->last = t;
}

/* ---- embed: one input line to token ids ---------------------------------------------------- */

/* Tokenizes one text line into *ids, growing it as needed. A sequence over max_length without
 * truncation is measured again without the limit so that the message can give both lengths. */
static int tokenize_line(const nopad_tokenizer *tok, const char *text, size_t len, int64_t line_no,
                         int32_t max_length, int truncate, int32_t **ids, size_t *cap,
                         int32_t *n_ids) {
    nopad_tokenize_params tp = nopad_tokenize_default_params();
    tp.add_special_tokens = 1;
    tp.truncate = truncate;
    tp.max_length = max_length;
    int measuring = 0;
    for (;;) {
        int32_t n = 0;
        int32_t capacity = *cap > INT32_MAX ? INT32_MAX : (int32_t)*cap;
        nopad_status status = nopad_tokenize(tok, text, len, &tp, *ids, capacity, &n);
        if (status == NOPAD_ERR_BUFFER_TOO_SMALL && n > capacity) {
            if (reserve((void **)ids, cap, (size_t)n, sizeof(int32_t))) return -1;
            continue;
        }
        if (status == NOPAD_ERR_TOO_LONG && !measuring) {
            measuring = 1;
            tp.max_length = 0;
            continue;
        }
        if (status != NOPAD_OK) {
            print_error("line %" PRId64 ": %s", line_no, library_error(status));
            return -1;
        }
        if (measuring) {
            print_error("line %" PRId64 ": sequence of %" PRId32 " tokens is longer than the "
                        "model's maximum sequence length %" PRId32 " (--truncate cuts it)",
                        line_no, n, max_length);
            return -1;
        }
        if (n == 0) { /* only a tokenizer without special tokens can give this */
            print_error("line %" PRId64 ": the line gives no tokens", line_no);
            return -1;
        }
        *n_ids = n;
        return 0;
    }
}

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f'; }

/* Parses one --ids line: whitespace-separated decimal ids in [0, vocab_size). */
static int parse_id_line(const char *line, size_t len, int64_t line_no, int32_t vocab_size,
                         int32_t max_length, int truncate, int32_t **ids, size_t *cap,
                         int32_t *n_ids) {
    size_t n = 0;
    size_t i = 0;
    for (;;) {
        while (i < len && is_blank(line[i])) i++;
        if (i == len) break;
        size_t start = i;
        while (i < len && !is_blank(line[i])) i++;
        const char *token = line + start;
        const int width = (int)(i - start < 40 ? i - start : 40); /* shown in messages */
        const size_t column = start + 1;
        size_t j = token[0] == '-' ? 1 : 0;
        int all_digits = j < i - start;
        for (size_t k = j; k < i - start; k++)
            if (token[k] < '0' || token[k] > '9') all_digits = 0;
        if (!all_digits) {
            print_error("line %" PRId64 ", token %zu (column %zu): '%.*s' is not a number "
                        "(--ids expects decimal token ids)",
                        line_no, n + 1, column, width, token);
            return -1;
        }
        if (j == 1) {
            print_error("line %" PRId64 ", token %zu (column %zu): token id %.*s is negative",
                        line_no, n + 1, column, width, token);
            return -1;
        }
        int64_t v = 0;
        for (size_t k = 0; k < i - start && v < vocab_size; k++) v = v * 10 + (token[k] - '0');
        if (v >= vocab_size) { /* the loop stops early on long numbers, so no overflow */
            print_error("line %" PRId64 ", token %zu (column %zu): token id %.*s is out of range "
                        "(the vocabulary has %" PRId32 " ids, 0 to %" PRId32 ")",
                        line_no, n + 1, column, width, token, vocab_size, vocab_size - 1);
            return -1;
        }
        if (reserve((void **)ids, cap, n + 1, sizeof(int32_t))) return -1;
        (*ids)[n++] = (int32_t)v;
    }
    if (n == 0) {
        print_error("line %" PRId64 ": empty line (--ids needs at least one token id per line)",
                    line_no);
        return -1;
    }
    if (max_length > 0 && n > (size_t)max_length) {
        if (!truncate) {
            print_error("line %" PRId64 ": sequence of %zu tokens is longer than the model's "
                        "maximum sequence length %" PRId32 " (--truncate cuts it)",
                        line_no, n, max_length);
            return -1;
        }
        n = (size_t)max_length;
    }
    *n_ids = (int32_t)n;
    return 0;
}

/* ---- embed: batches ------------------------------------------------------------------------ */

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
} embed_options;

/* Returns 0 to run, 1 when help was printed, -1 on a usage error (already reported). */
static int parse_embed_options(int argc, char **argv, embed_options *o) {
    static const char *const takes_value[] = {"--model",  "--input",  "--output",       "--pooling",
                                              "--format", "--device", "--dtype",        "--threads",
                                              "--batch-tokens",       NULL};
    *o = (embed_options){.pooling = NOPAD_POOLING_MODEL, .normalize = -1, .format = -1,
                         .batch_tokens = DEFAULT_BATCH_TOKENS};
    for (int i = 2; i < argc; i++) {
        option_arg opt;
        long v = 0;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(embed_help, stdout);
            return 1;
        }
        if (next_option(argc, argv, &i, takes_value, &opt)) return -1;
        const char *val = opt.value;
        if (strcmp(opt.name, "--model") == 0) o->model_dir = val;
        else if (strcmp(opt.name, "--input") == 0) o->input_path = val;
        else if (strcmp(opt.name, "--output") == 0) o->output_path = val;
        else if (strcmp(opt.name, "--ids") == 0) o->ids = 1;
        else if (strcmp(opt.name, "--normalize") == 0) o->normalize = 1;
        else if (strcmp(opt.name, "--no-normalize") == 0) o->normalize = 0;
        else if (strcmp(opt.name, "--truncate") == 0) o->truncate = 1;
        else if (strcmp(opt.name, "--pooling") == 0) {
            if (parse_pooling(val, &o->pooling)) return -1;
        } else if (strcmp(opt.name, "--format") == 0) {
            if (strcmp(val, "jsonl") == 0) o->format = FORMAT_JSONL;
            else if (strcmp(val, "npy") == 0) o->format = FORMAT_NPY;
            else {
                print_error("unknown format '%s' (expected jsonl or npy)", val);
                return -1;
            }
        } else if (strcmp(opt.name, "--device") == 0) {
            if (parse_device(val, &o->device)) return -1;
        } else if (strcmp(opt.name, "--dtype") == 0) {
            if (parse_dtype(val, &o->dtype)) return -1;
            o->dtype_given = 1;
        } else if (strcmp(opt.name, "--threads") == 0) {
            if (parse_int("--threads", val, 0, 4096, &v)) return -1;
            o->threads = (int)v;
        } else if (strcmp(opt.name, "--batch-tokens") == 0) {
            if (parse_int("--batch-tokens", val, 1, INT32_MAX / 2, &v)) return -1;
            o->batch_tokens = (int32_t)v;
        } else {
            print_error("unknown option '%s'", opt.name);
            return -1;
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
    return 0;
}

static void embed_run_free(embed_run *r) {
    if (r->in && r->in != stdin) fclose(r->in);
    if (r->out.f && r->out.f != stdout) fclose(r->out.f);
    free(r->out.held);
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

static int cmd_embed(int argc, char **argv) {
    embed_options o;
    int parsed = parse_embed_options(argc, argv, &o);
    if (parsed > 0) return EXIT_OK;
    if (parsed < 0) {
        fputs("usage: nopad embed --model DIR [options]   (nopad embed --help lists them)\n",
              stderr);
        return EXIT_USAGE;
    }
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
    r.model = open_model(o.model_dir, o.device, o.dtype, o.dtype_given, o.threads);
    if (!r.model) goto done;
    status = nopad_model_get_info(r.model, &r.info);
    if (status != NOPAD_OK) {
        print_error("%s", library_error(status));
        goto done;
    }
    r.tok = nopad_model_tokenizer(r.model);
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
    r.out.f = stdout;
    r.out.name = "stdout";
    if (o.output_path) {
        r.out.name = o.output_path;
        r.out.f = fopen(o.output_path, "wb");
        if (!r.out.f) {
            print_error("cannot open output '%s': %s", o.output_path, strerror(errno));
            goto done;
        }
    }
    r.out.format = (out_format)o.format;
    r.out.per_token = r.per_token;
    r.out.hidden = r.info.hidden_size;
    if (writer_begin(&r.out)) goto done;
    r.prog.enabled = isatty(STDERR_FILENO);
    r.prog.start = r.prog.last = now_seconds();
    if (embed_stream(&r, &o) == 0) rc = EXIT_OK;
done:
    embed_run_free(&r);
    return rc;
}

/* ---- info ---------------------------------------------------------------------------------- */

/* Shortest decimal that reads back as the same float: 1e-12, not 9.99999996e-13. */
static void format_float(char *buf, size_t cap, float x) {
    for (int precision = 1; precision <= 9; precision++) {
        snprintf(buf, cap, "%.*g", precision, (double)x);
        if (strtof(buf, NULL) == x) return;
    }
}

static const char *or_unknown(const char *s) { return s && s[0] ? s : "unknown"; }

static void print_field(const char *key, const char *fmt, ...) PRINTF_LIKE(2, 3);
static void print_field(const char *key, const char *fmt, ...) {
    char label[64];
    snprintf(label, sizeof label, "%s:", key);
    printf("%-21s ", label);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
}

static void print_info_text(const nopad_model_info *m) {
    char eps[32];
    format_float(eps, sizeof eps, m->layer_norm_eps);
    print_field("family", "%s", or_unknown(m->family));
    print_field("model type", "%s", or_unknown(m->model_type));
    print_field("vocab size", "%" PRId32, m->vocab_size);
    print_field("hidden size", "%" PRId32, m->hidden_size);
    if (m->embedding_size != m->hidden_size)
        print_field("embedding size", "%" PRId32, m->embedding_size);
    print_field("layers", "%" PRId32, m->num_layers);
    print_field("heads", "%" PRId32, m->num_heads);
    print_field("head size", "%" PRId32, m->head_size);
    print_field("intermediate size", "%" PRId32, m->intermediate_size);
    print_field("max positions", "%" PRId32, m->max_position_embeddings);
    print_field("max sequence length", "%" PRId32, m->max_seq_length);
    print_field("token types", "%" PRId32, m->type_vocab_size);
    print_field("activation", "%s", or_unknown(m->activation));
    print_field("layer norm eps", "%s", eps);
    print_field("weights dtype", "%s", or_unknown(m->weights_dtype));
    print_field("compute dtype", "%s", or_unknown(m->compute_dtype));
    print_field("parameters", "%" PRId64 " (%.2fM)", m->n_params, (double)m->n_params / 1e6);
    print_field("tokenizer", "%s", m->has_tokenizer ? or_unknown(m->tokenizer_kind) : "none");
    print_field("pooling", "%s", pooling_name(m->pooling));
    print_field("normalize", "%s", m->normalize ? "yes" : "no");
}

static int print_info_json(const nopad_model_info *m) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return -1;
    char eps[32];
    format_float(eps, sizeof eps, m->layer_norm_eps);
    cJSON_AddStringToObject(o, "family", or_unknown(m->family));
    cJSON_AddStringToObject(o, "model_type", or_unknown(m->model_type));
    cJSON_AddNumberToObject(o, "vocab_size", m->vocab_size);
    cJSON_AddNumberToObject(o, "hidden_size", m->hidden_size);
    cJSON_AddNumberToObject(o, "embedding_size", m->embedding_size);
    cJSON_AddNumberToObject(o, "num_layers", m->num_layers);
    cJSON_AddNumberToObject(o, "num_heads", m->num_heads);
    cJSON_AddNumberToObject(o, "head_size", m->head_size);
    cJSON_AddNumberToObject(o, "intermediate_size", m->intermediate_size);
    cJSON_AddNumberToObject(o, "max_position_embeddings", m->max_position_embeddings);
    cJSON_AddNumberToObject(o, "max_seq_length", m->max_seq_length);
    cJSON_AddNumberToObject(o, "type_vocab_size", m->type_vocab_size);
    cJSON_AddStringToObject(o, "activation", or_unknown(m->activation));
    cJSON_AddNumberToObject(o, "layer_norm_eps", strtod(eps, NULL)); /* 1e-12, not 9.99e-13 */
    cJSON_AddStringToObject(o, "weights_dtype", or_unknown(m->weights_dtype));
    cJSON_AddStringToObject(o, "compute_dtype", or_unknown(m->compute_dtype));
    cJSON_AddNumberToObject(o, "n_params", (double)m->n_params); /* exact below 2^53 */
    cJSON_AddBoolToObject(o, "has_tokenizer", m->has_tokenizer != 0);
    cJSON_AddStringToObject(o, "tokenizer", m->has_tokenizer ? or_unknown(m->tokenizer_kind)
                                                             : "none");
    cJSON_AddStringToObject(o, "pooling", pooling_name(m->pooling));
    cJSON_AddBoolToObject(o, "normalize", m->normalize != 0);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return -1;
    puts(text);
    cJSON_free(text);
    return 0;
}

static int cmd_info(int argc, char **argv) {
    static const char *const takes_value[] = {"--model", "--device", "--dtype", NULL};
    const char *model_dir = NULL;
    int json = 0;
    nopad_device device = NOPAD_DEVICE_CPU;
    nopad_dtype dtype = NOPAD_DTYPE_F32;
    int dtype_given = 0;
    for (int i = 2; i < argc; i++) {
        option_arg opt;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(info_help, stdout);
            return EXIT_OK;
        }
        int bad = next_option(argc, argv, &i, takes_value, &opt);
        if (!bad) {
            if (strcmp(opt.name, "--model") == 0) model_dir = opt.value;
            else if (strcmp(opt.name, "--json") == 0) json = 1;
            else if (strcmp(opt.name, "--device") == 0) bad = parse_device(opt.value, &device);
            else if (strcmp(opt.name, "--dtype") == 0) bad = parse_dtype(opt.value, &dtype), dtype_given = 1;
            else {
                print_error("unknown option '%s'", opt.name);
                bad = 1;
            }
        }
        if (bad) {
            fputs("usage: nopad info --model DIR [--json]   (nopad info --help)\n", stderr);
            return EXIT_USAGE;
        }
    }
    if (!model_dir) {
        print_error("missing --model DIR");
        fputs("usage: nopad info --model DIR [--json]   (nopad info --help)\n", stderr);
        return EXIT_USAGE;
    }
    nopad_model *model = open_model(model_dir, device, dtype, dtype_given, 0);
    if (!model) return EXIT_ERROR;
    nopad_model_info info;
    nopad_status status = nopad_model_get_info(model, &info);
    int rc = EXIT_OK;
    if (status != NOPAD_OK) {
        print_error("%s", library_error(status));
        rc = EXIT_ERROR;
    } else if (json) {
        if (print_info_json(&info)) {
            print_error("out of memory");
            rc = EXIT_ERROR;
        }
    } else {
        print_info_text(&info);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        print_error("cannot write stdout: %s", strerror(errno));
        rc = EXIT_ERROR;
    }
    nopad_model_free(model);
    return rc;
}

/* ---- main ---------------------------------------------------------------------------------- */

/* OpenBLAS picks its kernels when the program starts. On CPUs it does not recognise (some virtual
 * machines) it falls back to its SSE3 ("Prescott") kernels, about half as fast as the AVX2 /
 * AVX-512 ones. Restart once with the family this CPU supports, unless the user chose one. */
static void pick_blas_kernels(char **argv) {
    if (getenv("OPENBLAS_CORETYPE") || strcmp(nopad_cpu_blas_kernels(), "Prescott") != 0) return;
    const char *core = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                       : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                         : NULL;
    if (!core || setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
    execv("/proc/self/exe", argv); /* returns only on failure: carry on with the slow kernels */
}

int main(int argc, char **argv) {
    pick_blas_kernels(argv);
    if (argc < 2) {
        fputs(main_help, stderr);
        return EXIT_USAGE;
    }
    const char *command = argv[1];
    if (strcmp(command, "-h") == 0 || strcmp(command, "--help") == 0 ||
        strcmp(command, "help") == 0) {
        fputs(main_help, stdout);
        return EXIT_OK;
    }
    if (strcmp(command, "-V") == 0 || strcmp(command, "--version") == 0) {
        printf("nopad %s\n", nopad_version());
        return EXIT_OK;
    }
    if (strcmp(command, "embed") == 0) return cmd_embed(argc, argv);
    if (strcmp(command, "info") == 0) return cmd_info(argc, argv);
    if (strcmp(command, "bench") == 0) return cmd_bench(argc, argv);
    if (command[0] == '-') print_error("unknown option '%s'", command);
    else print_error("unknown command '%s'", command);
    fputs(main_help, stderr);
    return EXIT_USAGE;
}
