/* Streaming training data: blocks of the file, shuffled per epoch, read a window at a time. */
#include "train/stream.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        const nopad_status st_ = (expr);                                                           \
        if (st_ != NOPAD_OK) return st_;                                                           \
    } while (0)

static const int64_t MIB = (int64_t)1 << 20;

train_stream_params train_stream_default_params(void) {
    return (train_stream_params){.block_bytes = MIB, .window_blocks = 64};
}

train_stream_params train_stream_params_for_buffer(int64_t buffer_bytes) {
    int64_t block = buffer_bytes / 16;
    if (block > MIB) block = MIB;
    if (block < 64) block = 64;
    int64_t blocks = buffer_bytes / block;
    if (blocks < 1) blocks = 1;
    if (blocks > INT32_MAX) blocks = INT32_MAX;
    return (train_stream_params){.block_bytes = block, .window_blocks = (int32_t)blocks};
}

static nopad_status ensure_text(train_stream *s, size_t n) {
    if (n <= s->text_cap) return NOPAD_OK;
    size_t cap = s->text_cap ? s->text_cap : 4096;
    while (cap < n) cap *= 2;
    char *t = realloc(s->text, cap);
    if (!t) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", s->path);
    s->text = t;
    s->text_cap = cap;
    return NOPAD_OK;
}

/* n bytes of the file from `from` into s->text + at; fewer means the file shrank since it was
 * opened, which would silently change the epoch, so it is an error. */
static nopad_status read_exact(train_stream *s, size_t at, int64_t from, size_t n) {
    for (size_t done = 0; done < n;) {
        const ssize_t k = pread(s->fd, s->text + at + done, n - done, (off_t)(from + (int64_t)done));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return nopad_set_error(NOPAD_ERR_IO, "%s: read failed: %s", s->path, strerror(errno));
        if (k == 0)
            return nopad_set_error(NOPAD_ERR_IO, "%s: the file changed while training read it "
                                   "(%lld bytes when opened)", s->path, (long long)s->size);
        done += (size_t)k;
    }
    return NOPAD_OK;
}

/* Block b's lines into s->text: the first line that starts in the block at *lines, the bytes
 * where its lines may start (*owned), and up to the end of the last one (*len: it may run past
 * the block, by at most a window's text). *first_line numbers the first line; *newlines counts
 * the '\n' bytes inside the block. */
static nopad_status read_block(train_stream *s, int32_t b, const char **lines, size_t *owned,
                               size_t *len, int64_t *first_line, int64_t *newlines) {
    const int64_t start = (int64_t)b * s->block_bytes;
    const int64_t end = start + s->block_bytes < s->size ? start + s->block_bytes : s->size;
    const int64_t from = start ? start - 1 : 0; // the byte before says whether a line starts here
    size_t n = (size_t)(end - from);
    TRY(ensure_text(s, n));
    TRY(read_exact(s, 0, from, n));
    *newlines = 0;
    for (size_t i = (size_t)(start - from); i < n; i++) *newlines += s->text[i] == '\n';
    size_t p = 0;
    if (start) {
        const char *nl = memchr(s->text, '\n', n);
        p = nl ? (size_t)(nl - s->text) + 1 : n;
    }
    *first_line = start ? s->newlines_before[b] + (s->text[0] == '\n' ? 1 : 2) : 1;
    *owned = *len = 0;
    *lines = s->text;
    if (p >= n) return NOPAD_OK; // no line starts in this block
    size_t last = n; // the start of the last line starting in the block
    while (last > p && s->text[last - 1] != '\n') last--;
    const int64_t window_bytes = s->block_bytes * s->window_blocks;
    size_t total = n;
    while (s->text[total - 1] != '\n' && from + (int64_t)total < s->size) {
        if ((int64_t)(total - last) > window_bytes) {
            int64_t line = *first_line;
            for (size_t i = p; i < last; i++) line += s->text[i] == '\n';
            return nopad_set_error(NOPAD_ERR_TOO_LONG, "%s: line %lld is longer than the stream's "
                                   "window of %lld bytes (a larger stream buffer holds it)",
                                   s->path, (long long)line, (long long)window_bytes);
        }
        int64_t more = s->size - (from + (int64_t)total);
        if (more > s->block_bytes) more = s->block_bytes;
        TRY(ensure_text(s, total + (size_t)more));
        TRY(read_exact(s, total, from + (int64_t)total, (size_t)more));
        const char *nl = memchr(s->text + total, '\n', (size_t)more);
        total = nl ? (size_t)(nl - s->text) + 1 : total + (size_t)more;
    }
    *lines = s->text + p;
    *owned = n - p;
    *len = total - p;
    return NOPAD_OK;
}

size_t train_stream_bytes(const train_stream *s) {
    size_t loader = 0;
    if (s->have_loader) {
        const size_t T = (size_t)s->max_tokens, B = (size_t)s->max_seqs;
        loader = (size_t)s->data.n_examples * sizeof(int32_t) + (4 * T + 4 * B + 1) * sizeof(int32_t);
    }
    return train_dataset_bytes(&s->data) + loader + s->text_cap +
           (size_t)s->n_blocks * (2 * sizeof(int64_t) + sizeof(int32_t)) + sizeof(int64_t);
}

static void note_peak(train_stream *s) {
    const size_t now = train_stream_bytes(s);
    if (now > s->peak_bytes) s->peak_bytes = now;
}

/* An example over the batch budget, named as train_loader_init names it (before training). */
static nopad_status check_budget(const train_stream *s) {
    const train_dataset *d = &s->data;
    for (int32_t e = 0; e < d->n_examples; e++) {
        const int64_t len = d->offsets[e + 1] - d->offsets[e];
        if (len > s->max_tokens)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "%s: the example of line %lld has %lld tokens, more than the "
                                   "batch budget of %d", s->path, (long long)d->line[e],
                                   (long long)len, s->max_tokens);
    }
    return NOPAD_OK;
}

/* The '\n' bytes of each of the share's blocks into newlines_before (made a prefix by scan). */
static nopad_status count_newlines(train_stream *s) {
    for (int32_t b = s->share_first; b < s->share_end; b++) {
        const int64_t start = (int64_t)b * s->block_bytes;
        const int64_t end = start + s->block_bytes < s->size ? start + s->block_bytes : s->size;
        TRY(ensure_text(s, (size_t)(end - start)));
        TRY(read_exact(s, 0, start, (size_t)(end - start)));
        int64_t n = 0;
        for (int64_t i = 0; i < end - start; i++) n += s->text[i] == '\n';
        s->newlines_before[b] = n;
    }
    return NOPAD_OK;
}

/* The share's blocks tokenized and counted: first_example[b] = the examples of block b (made a
 * prefix by scan), and the share's tokens, truncated and skipped lines. */
static nopad_status count_examples(train_stream *s) {
    for (int32_t b = s->share_first; b < s->share_end; b++) {
        const char *lines;
        size_t owned, len;
        int64_t first_line, in_block;
        TRY(read_block(s, b, &lines, &owned, &len, &first_line, &in_block));
        train_dataset_clear(&s->data);
        TRY(train_dataset_add_lines(&s->data, s->tok, lines, len, owned, s->path, first_line, 0));
        TRY(check_budget(s));
        s->first_example[b] = s->data.n_examples;
        s->n_tokens += s->data.n_tokens;
        s->n_truncated += s->data.n_truncated;
        s->n_skipped += s->data.n_skipped;
        note_peak(s);
    }
    return NOPAD_OK;
}

/* Counts for every block: the share's own, then summed over the ranks (sum: each rank holds
 * zeros for the blocks of the others). */
static nopad_status sum_counts(train_stream *s, nopad_status st, int64_t *values, size_t n,
                               train_stream_sum_fn sum, void *user) {
    return sum ? sum(user, st, values, n) : st;
}

/* The pass of train_stream_open: the share's blocks (every block for one process) in file order,
 * their '\n' bytes counted (line numbers), then tokenized and counted; with several ranks the
 * counts of every rank's blocks are summed after each half. */
static nopad_status scan(train_stream *s, train_stream_sum_fn sum, void *user) {
    const size_t n = (size_t)s->n_blocks;
    memset(s->newlines_before, 0, (n + 1) * sizeof(int64_t));
    memset(s->first_example, 0, (n + 1) * sizeof(int64_t));
    TRY(sum_counts(s, count_newlines(s), s->newlines_before, n, sum, user));
    int64_t before = 0;
    for (size_t b = 0; b < n; b++) { /* counts into prefixes */
        const int64_t in_block = s->newlines_before[b];
        s->newlines_before[b] = before;
        before += in_block;
    }
    nopad_status st = count_examples(s);
    train_dataset_clear(&s->data);
    int64_t totals[3] = {s->n_tokens, s->n_truncated, s->n_skipped};
    s->first_example[n] = 0;
    if (sum) { /* the blocks' example counts and the totals, in one sum */
        int64_t *all = malloc((n + 3) * sizeof *all);
        if (all) {
            memcpy(all, s->first_example, n * sizeof *all);
            memcpy(all + n, totals, sizeof totals);
        } else {
            st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", s->path);
        }
        st = sum_counts(s, st, all, all ? n + 3 : 0, sum, user); /* agreed first: no sum after a failure */
        if (st == NOPAD_OK) {
            memcpy(s->first_example, all, n * sizeof *all);
            memcpy(totals, all + n, sizeof totals);
        }
        free(all);
    }
    TRY(st);
    s->n_tokens = totals[0], s->n_truncated = totals[1], s->n_skipped = totals[2];
    int64_t examples = 0;
    for (size_t b = 0; b <= n; b++) {
        const int64_t in_block = s->first_example[b];
        s->first_example[b] = examples;
        examples += in_block;
    }
    s->n_examples = examples;
    if (examples == 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: no training example (%lld lines "
                               "skipped: blank, or nothing to mask)", s->path,
                               (long long)s->n_skipped);
    return NOPAD_OK;
}

/* Reads and tokenizes window w of the epoch's block order, and a loader over it at cursor 0. */
static nopad_status load_window(train_stream *s, int32_t w) {
    if (s->have_loader) train_loader_free(&s->loader);
    s->have_loader = 0;
    train_dataset_clear(&s->data);
    s->window = w;
    if (w >= s->n_windows) return NOPAD_OK;
    const int32_t first = w * s->window_blocks;
    const int32_t last = s->n_blocks - first < s->window_blocks ? s->n_blocks : first + s->window_blocks;
    for (int32_t i = first; i < last; i++) {
        const int32_t b = s->block_order[i];
        const int64_t expect = s->first_example[b + 1] - s->first_example[b];
        if (expect == 0) continue; // no example starts here: nothing to read
        if (b < s->share_first || b >= s->share_end) continue; // another rank's
        const char *lines;
        size_t owned, len;
        int64_t first_line, newlines;
        TRY(read_block(s, b, &lines, &owned, &len, &first_line, &newlines));
        const int32_t before = s->data.n_examples;
        TRY(train_dataset_add_lines(&s->data, s->tok, lines, len, owned, s->path, first_line,
                                    s->first_example[b]));
        if (s->data.n_examples - before != expect)
            return nopad_set_error(NOPAD_ERR_IO, "%s: the file changed while training read it "
                                   "(block %d had %lld examples when opened, now %d)", s->path, b,
                                   (long long)expect, s->data.n_examples - before);
    }
    if (s->data.n_examples > 0 && s->ranks == 1) {
        TRY(train_loader_init(&s->data, s->max_tokens, s->max_seqs, s->seed, &s->loader));
        s->have_loader = 1;
        s->loader.window = (uint32_t)w;
        TRY(train_loader_seek(&s->loader, s->epoch, 0));
    }
    note_peak(s);
    return NOPAD_OK;
}

nopad_status train_stream_open(const char *path, const nopad_tokenizer *tok,
                               const train_data_params *params, const train_stream_params *sp,
                               int32_t max_tokens, int32_t max_seqs, uint64_t seed,
                               train_stream *out) {
    return train_stream_open_share(path, tok, params, sp, max_tokens, max_seqs, seed, 0, 1, NULL, NULL, out);
}

int32_t train_stream_share_first(int32_t n_blocks, int32_t rank, int32_t ranks) {
    return (int32_t)((int64_t)n_blocks * rank / ranks);
}

int32_t train_stream_block_reader(const train_stream *s, int32_t b) {
    int32_t r = (int32_t)((int64_t)b * s->ranks / (s->n_blocks > 0 ? s->n_blocks : 1));
    while (r + 1 < s->ranks && train_stream_share_first(s->n_blocks, r + 1, s->ranks) <= b) r++;
    while (r > 0 && train_stream_share_first(s->n_blocks, r, s->ranks) > b) r--;
    return r;
}

nopad_status train_stream_open_share(const char *path, const nopad_tokenizer *tok,
                                     const train_data_params *params, const train_stream_params *sp,
                                     int32_t max_tokens, int32_t max_seqs, uint64_t seed, int32_t rank,
                                     int32_t ranks, train_stream_sum_fn sum, void *user, train_stream *out) {
    memset(out, 0, sizeof *out);
    out->fd = -1;
    if (!path || !tok || !params || !sp || ranks < 1 || rank < 0 || rank >= ranks || (ranks > 1 && !sum))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_stream_open: NULL argument, or rank %d "
                               "of %d", rank, ranks);
    if (sp->block_bytes < 1 || sp->window_blocks < 1 || max_tokens < 1 || max_seqs < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_stream_open: blocks of %lld "
                               "bytes, %d a window, batches of %d tokens and %d sequences: "
                               "expected >= 1 of each", (long long)sp->block_bytes,
                               sp->window_blocks, max_tokens, max_seqs);
    out->tok = tok;
    out->block_bytes = sp->block_bytes;
    out->window_blocks = sp->window_blocks;
    out->max_tokens = max_tokens;
    out->max_seqs = max_seqs;
    out->seed = seed;
    out->ranks = ranks;
    nopad_status st = train_dataset_init(tok, params, &out->data);
    if (st != NOPAD_OK) return st;
    out->path = strdup(path);
    if (!out->path) st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    struct stat info;
    if (st == NOPAD_OK && ((out->fd = open(path, O_RDONLY)) < 0 || fstat(out->fd, &info) != 0))
        st = nopad_set_error(NOPAD_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    if (st == NOPAD_OK && !S_ISREG(info.st_mode))
        st = nopad_set_error(NOPAD_ERR_IO, "%s: not a regular file", path);
    if (st == NOPAD_OK) {
        out->size = (int64_t)info.st_size;
        const int64_t blocks = (out->size + out->block_bytes - 1) / out->block_bytes;
        if (blocks >= INT32_MAX)
            st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: %lld blocks of %lld bytes, too "
                                 "many (a larger buffer makes larger blocks)", path,
                                 (long long)blocks, (long long)out->block_bytes);
        out->n_blocks = (int32_t)blocks;
        out->n_windows = (int32_t)((blocks + out->window_blocks - 1) / out->window_blocks);
        out->share_first = train_stream_share_first(out->n_blocks, rank, ranks);
        out->share_end = train_stream_share_first(out->n_blocks, rank + 1, ranks);
    }
    if (st == NOPAD_OK) {
        const size_t n = (size_t)out->n_blocks;
        out->newlines_before = malloc((n + 1) * sizeof(int64_t));
        out->first_example = malloc((n + 1) * sizeof(int64_t));
        out->block_order = malloc((n + 1) * sizeof(int32_t));
        if (!out->newlines_before || !out->first_example || !out->block_order)
            st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    /* with several ranks the scan's sums are collective: every rank takes part, failed or not */
    if (sum) st = sum(user, st, NULL, 0);
    if (st == NOPAD_OK) st = scan(out, sum, user);
    if (st == NOPAD_OK && ranks == 1) st = train_stream_seek(out, 0, 0, 0); /* a rank's: by train_dp */
    if (st != NOPAD_OK) train_stream_close(out);
    return st;
}

nopad_status train_stream_seek(train_stream *s, uint32_t epoch, int32_t window, int32_t cursor) {
    if (window < 0 || window > s->n_windows)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_stream_seek: window %d outside "
                               "[0, %d]", window, s->n_windows);
    s->epoch = epoch;
    train_shuffle(s->block_order, s->n_blocks, s->seed, epoch, 0, TRAIN_SHUFFLE_BLOCKS);
    TRY(load_window(s, window));
    const int32_t n = s->have_loader ? s->data.n_examples : 0;
    if (cursor < 0 || cursor > n)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_stream_seek: cursor %d outside "
                               "[0, %d] (window %d of epoch %u)", cursor, n, window, epoch);
    if (s->have_loader) TRY(train_loader_seek(&s->loader, epoch, cursor));
    return NOPAD_OK;
}

nopad_status train_stream_next(train_stream *s, int *got) {
    for (;;) {
        if (s->have_loader && train_loader_next(&s->loader)) {
            *got = 1;
            return NOPAD_OK;
        }
        if (s->window >= s->n_windows) {
            *got = 0;
            return NOPAD_OK;
        }
        TRY(load_window(s, s->window + 1));
    }
}

nopad_status train_stream_count_batches(train_stream *s, uint32_t epoch, int64_t *n) {
    *n = 0;
    TRY(train_stream_seek(s, epoch, 0, 0));
    for (int got = 1;;) {
        TRY(train_stream_next(s, &got));
        if (!got) return NOPAD_OK;
        (*n)++;
    }
}

void train_stream_close(train_stream *s) {
    if (!s) return;
    if (s->have_loader) train_loader_free(&s->loader);
    train_dataset_free(&s->data);
    if (s->fd >= 0) close(s->fd);
    free(s->path), free(s->newlines_before), free(s->first_example), free(s->block_order);
    free(s->text);
    memset(s, 0, sizeof *s);
    s->fd = -1;
}
