/* `nopad tokenize`: lines of text in, one line of token ids (or token strings) out per line; with
 * --decode, lines of ids in, their text out. Only the tokenizer is loaded, never the weights. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "cli.h"
#include "nopad.h"

static const char tokenize_help[] =
    "usage: nopad tokenize --model M [options]\n"
    "\n"
    "Reads lines of UTF-8 text (stdin, or --input) and prints one line per input line: the\n"
    "line's token ids, separated by spaces, exactly as Hugging Face tokenizers gives them. With\n"
    "--decode the lines are token ids and each prints as its text. Lines end at '\\n'; a trailing\n"
    "'\\r' is dropped; a last line without '\\n' counts.\n"
    "\n"
    "options:\n"
    "  --model M        a model folder, a tokenizer folder (tokenizer.json, or vocab.txt with an\n"
    "                   optional tokenizer_config.json) or a .gguf file [required]\n"
    "  --input FILE     read lines from FILE ('-': stdin, the default)\n"
    "  --no-special     no special tokens: none added around the text ([CLS] ... [SEP],\n"
    "                   <s> ... </s>); with --decode, special tokens are left out of the text\n"
    "  --tokens         print token strings instead of ids, as the vocabulary spells them\n"
    "                   (Ġhello, ##ing, ▁the, <0x0A>, [CLS]);\n"
    "                   '\\' and the characters that would break the line are escaped: \\\\, \\n,\n"
    "                   \\t, \\r, \\x20 (a space inside a token), \\xNN (other control bytes),\n"
    "                   \\uNNNN (U+0080-U+009F, U+2028, U+2029)\n"
    "  --decode         lines are token ids separated by spaces or tabs; print the text they\n"
    "                   decode to (Hugging Face's decode; an empty line decodes to an empty\n"
    "                   line; a text holding a newline spans several lines)\n"
    "  -h, --help       show this help\n"
    "\n"
    "errors:\n"
    "  A line that is not valid UTF-8, an id that is not a number or outside the vocabulary\n"
    "  stops the run with a message naming the line, exit status 1. Earlier lines are already\n"
    "  printed. A tokenizer nopad does not support is named in the message.\n";

typedef struct tokenize_options {
    const char *model, *input_path;
    int no_special, tokens, decode;
} tokenize_options;

enum { OPT_MODEL = 256, OPT_INPUT, OPT_NO_SPECIAL, OPT_TOKENS, OPT_DECODE };

static const struct option long_options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"input", required_argument, NULL, OPT_INPUT},
    {"no-special", no_argument, NULL, OPT_NO_SPECIAL},
    {"tokens", no_argument, NULL, OPT_TOKENS},
    {"decode", no_argument, NULL, OPT_DECODE},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Returns 0 to run, 1 when help was printed, -1 on a usage error (already reported). */
static int parse_tokenize_options(int argc, char **argv, tokenize_options *o) {
    *o = (tokenize_options){0};
    cli_parser p = cli_parser_start(argc, argv, long_options);
    int c;
    while ((c = cli_getopt(&p)) != -1) {
        switch (c) {
        case 'h': fputs(tokenize_help, stdout); return 1;
        case OPT_MODEL: o->model = optarg; break;
        case OPT_INPUT: o->input_path = optarg; break;
        case OPT_NO_SPECIAL: o->no_special = 1; break;
        case OPT_TOKENS: o->tokens = 1; break;
        case OPT_DECODE: o->decode = 1; break;
        default: cli_print_opt_error(&p); return -1;
        }
    }
    if (!o->model) {
        print_error("missing --model M");
        return -1;
    }
    if (o->tokens && o->decode) {
        print_error("--tokens and --decode do not go together (--decode prints text)");
        return -1;
    }
    if (o->input_path && strcmp(o->input_path, "-") == 0) o->input_path = NULL;
    return 0;
}

/* Everything one run owns; freed in one place. */
typedef struct tokenize_run {
    nopad_tokenizer *tok;
    int32_t vocab_size;
    FILE *in;
    const char *in_name;
    char *line;
    size_t line_cap;
    int32_t *ids;
    size_t ids_cap;
    char *out; /* the output line */
    size_t out_len, out_cap;
} tokenize_run;

static int out_put(tokenize_run *r, const char *s, size_t n) {
    if (reserve((void **)&r->out, &r->out_cap, r->out_len + n + 1, 1)) return -1;
    memcpy(r->out + r->out_len, s, n);
    r->out_len += n;
    return 0;
}

/* A token string on one line: backslash, whitespace and control characters escaped. */
static int put_token(tokenize_run *r, const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        char esc[16];
        int k = 0;
        size_t width = 1;
        if (c == '\\') k = snprintf(esc, sizeof esc, "\\\\");
        else if (c == '\n') k = snprintf(esc, sizeof esc, "\\n");
        else if (c == '\t') k = snprintf(esc, sizeof esc, "\\t");
        else if (c == '\r') k = snprintf(esc, sizeof esc, "\\r");
        else if (c <= 0x20 || c == 0x7f) k = snprintf(esc, sizeof esc, "\\x%02x", c);
        else if (c == 0xc2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 &&
                 (unsigned char)s[i + 1] <= 0x9f) { /* U+0080..U+009F: C1 controls */
            k = snprintf(esc, sizeof esc, "\\u%04x", (unsigned char)s[i + 1]);
            width = 2;
        } else if (c == 0xe2 && i + 2 < n && (unsigned char)s[i + 1] == 0x80 &&
                   ((unsigned char)s[i + 2] == 0xa8 || (unsigned char)s[i + 2] == 0xa9)) {
            k = snprintf(esc, sizeof esc, "\\u%04x", 0x2000 + ((unsigned char)s[i + 2] - 0x80));
            width = 3; /* U+2028, U+2029: line and paragraph separators */
        }
        if (k > 0) {
            if (out_put(r, esc, (size_t)k)) return -1;
        } else if (out_put(r, s + i, 1)) {
            return -1;
        }
        i += width;
    }
    return 0;
}

/* One line of text -> its ids, or token strings. */
static int tokenize_text(tokenize_run *r, const tokenize_options *o, const char *text,
                         size_t len, int64_t line_no) {
    nopad_tokenize_params tp = nopad_tokenize_default_params();
    tp.add_special_tokens = !o->no_special;
    int32_t n = 0;
    for (;;) {
        int32_t cap = r->ids_cap > INT32_MAX ? INT32_MAX : (int32_t)r->ids_cap;
        nopad_status st = nopad_tokenize(r->tok, text, len, &tp, r->ids, cap, &n);
        if (st == NOPAD_ERR_BUFFER_TOO_SMALL && n > cap) {
            if (reserve((void **)&r->ids, &r->ids_cap, (size_t)n, sizeof(int32_t))) return -1;
            continue;
        }
        if (st != NOPAD_OK) {
            print_error("line %" PRId64 ": %s", line_no, library_error(st));
            return -1;
        }
        break;
    }
    for (int32_t i = 0; i < n; i++) {
        if (i > 0 && out_put(r, " ", 1)) return -1;
        if (o->tokens) {
            size_t tlen;
            const char *t = nopad_tokenizer_id_to_token(r->tok, r->ids[i], &tlen);
            char missing[32];
            if (!t) { /* an id the vocab skips (only a template can give one) */
                tlen = (size_t)snprintf(missing, sizeof missing, "<id %" PRId32 ">", r->ids[i]);
                t = missing;
            }
            if (put_token(r, t, tlen)) return -1;
        } else {
            char num[16];
            int k = snprintf(num, sizeof num, "%" PRId32, r->ids[i]);
            if (out_put(r, num, (size_t)k)) return -1;
        }
    }
    return 0;
}

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f'; }

/* One line of ids -> their text. */
static int decode_ids(tokenize_run *r, const tokenize_options *o, const char *line, size_t len,
                      int64_t line_no) {
    size_t n = 0;
    for (size_t i = 0;;) {
        while (i < len && is_blank(line[i])) i++;
        if (i == len) break;
        const size_t start = i;
        while (i < len && !is_blank(line[i])) i++;
        const char *token = line + start;
        const size_t tlen = i - start;
        int digits = 1;
        for (size_t k = token[0] == '-' ? 1 : 0; k < tlen; k++)
            if (token[k] < '0' || token[k] > '9') digits = 0;
        if (!digits || (tlen == 1 && token[0] == '-')) {
            /* a control byte or one outside ASCII is named by value, never printed */
            for (size_t k = 0; k < tlen; k++) {
                const unsigned char c = (unsigned char)token[k];
                if (c < 0x20 || c >= 0x7f) {
                    print_error("line %" PRId64 ", token %zu: byte 0x%02x at column %zu is not "
                                "part of a number (--decode reads decimal token ids separated "
                                "by spaces or tabs)",
                                line_no, n + 1, c, start + k + 1);
                    return -1;
                }
            }
            print_error("line %" PRId64 ", token %zu (column %zu): '%.*s' is not a number "
                        "(--decode reads decimal token ids)",
                        line_no, n + 1, start + 1, (int)(tlen < 40 ? tlen : 40), token);
            return -1;
        }
        int64_t v = 0;
        for (size_t k = token[0] == '-' ? 1 : 0; k < tlen && v <= INT32_MAX; k++)
            v = v * 10 + (token[k] - '0');
        if (token[0] == '-' || v >= r->vocab_size) {
            print_error("line %" PRId64 ", token %zu (column %zu): token id %.*s is outside the "
                        "vocabulary (%" PRId32 " ids, 0 to %" PRId32 ")",
                        line_no, n + 1, start + 1, (int)(tlen < 40 ? tlen : 40), token,
                        r->vocab_size, r->vocab_size - 1);
            return -1;
        }
        if (reserve((void **)&r->ids, &r->ids_cap, n + 1, sizeof(int32_t))) return -1;
        r->ids[n++] = (int32_t)v;
    }
    size_t text_len = 0;
    nopad_status st = nopad_detokenize(r->tok, r->ids, n, o->no_special, NULL, 0, &text_len);
    if (st == NOPAD_ERR_BUFFER_TOO_SMALL) {
        if (reserve((void **)&r->out, &r->out_cap, text_len + 1, 1)) return -1;
        st = nopad_detokenize(r->tok, r->ids, n, o->no_special, r->out, r->out_cap, &text_len);
    }
    if (st != NOPAD_OK) {
        print_error("line %" PRId64 ": %s", line_no, library_error(st));
        return -1;
    }
    r->out_len = text_len;
    return 0;
}

static int tokenize_stream(tokenize_run *r, const tokenize_options *o) {
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
        r->out_len = 0;
        if (o->decode ? decode_ids(r, o, r->line, len, line_no)
                      : tokenize_text(r, o, r->line, len, line_no))
            return -1;
        if ((r->out_len && fwrite(r->out, 1, r->out_len, stdout) != r->out_len) ||
            putchar('\n') == EOF) {
            print_error("cannot write to stdout: %s", strerror(errno));
            return -1;
        }
    }
    if (fflush(stdout) != 0) {
        print_error("cannot write to stdout: %s", strerror(errno));
        return -1;
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    tokenize_options o;
    int parsed = parse_tokenize_options(argc, argv, &o);
    if (parsed > 0) return EXIT_OK;
    if (parsed < 0) {
        fputs("usage: nopad tokenize --model M [options]   (nopad tokenize --help lists them)\n",
              stderr);
        return EXIT_USAGE;
    }
    tokenize_run r = {0};
    int rc = EXIT_ERROR;
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
    nopad_status st = nopad_tokenizer_load(o.model, &r.tok);
    if (st != NOPAD_OK) {
        print_error("%s", library_error(st));
        goto done;
    }
    r.vocab_size = nopad_tokenizer_vocab_size(r.tok);
    if (tokenize_stream(&r, &o) == 0) rc = EXIT_OK;
done:
    if (r.in && r.in != stdin) fclose(r.in);
    nopad_tokenizer_free(r.tok);
    free(r.line);
    free(r.ids);
    free(r.out);
    return rc;
}
