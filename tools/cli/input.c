/* The functions of input.h. */
#include "input.h"

#include <inttypes.h>

#include "cli.h"

int tokenize_line(const nopad_tokenizer *tok, const char *text, size_t len, int64_t line_no,
                  int32_t max_length, int truncate, int32_t **ids, size_t *cap, int32_t *n_ids) {
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

/* Offset of the first byte of s[0..len) that is a control byte or not part of valid UTF-8, or len
 * when there is none: such a byte is named by value rather than printed. */
static size_t first_unprintable(const unsigned char *s, size_t len) {
    for (size_t k = 0; k < len;) {
        const unsigned char c = s[k];
        if (c < 0x20 || c == 0x7f) return k;
        if (c < 0x80) {
            k++;
            continue;
        }
        size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (n == 0 || k + n > len) return k;
        unsigned lo = 0x80, hi = 0xbf; /* the range of the second byte (no overlongs/surrogates) */
        if (c == 0xe0) lo = 0xa0;
        else if (c == 0xed) hi = 0x9f;
        else if (c == 0xf0) lo = 0x90;
        else if (c == 0xf4) hi = 0x8f;
        if (s[k + 1] < lo || s[k + 1] > hi) return k;
        for (size_t m = 2; m < n; m++)
            if ((s[k + m] & 0xc0) != 0x80) return k;
        k += n;
    }
    return len;
}

int parse_id_line(const char *line, size_t len, int64_t line_no, int32_t vocab_size,
                  int32_t max_length, int truncate, int32_t **ids, size_t *cap, int32_t *n_ids) {
    size_t n = 0;
    size_t i = 0;
    for (;;) {
        while (i < len && is_blank(line[i])) i++;
        if (i == len) break;
        size_t start = i;
        while (i < len && !is_blank(line[i])) i++;
        const char *token = line + start;
        int width = (int)(i - start < 40 ? i - start : 40); /* shown in messages */
        while (width > 0 && (size_t)width < i - start && ((unsigned char)token[width] & 0xc0) == 0x80)
            width--; /* not in the middle of a UTF-8 character */
        const size_t column = start + 1;
        size_t j = token[0] == '-' ? 1 : 0;
        int all_digits = j < i - start;
        for (size_t k = j; k < i - start; k++)
            if (token[k] < '0' || token[k] > '9') all_digits = 0;
        if (!all_digits) {
            /* A control byte (a NUL, ESC, a stray '\r') or one that is not UTF-8 is named by
             * value and column: printed as text it would cut the message short or garble the
             * terminal. */
            const size_t bad = first_unprintable((const unsigned char *)token, i - start);
            if (bad < i - start) {
                print_error("line %" PRId64 ", token %zu: byte 0x%02x at column %zu is not part of "
                            "a number (--ids expects decimal token ids separated by spaces or tabs)",
                            line_no, n + 1, (unsigned)(unsigned char)token[bad], column + bad);
                return -1;
            }
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
