/* Streaming training data (src/train/stream.c) against the same corpus held in memory
 * (src/train/data.c): every example once an epoch with the masking the in-memory dataset gives it
 * (the masks are keyed by the example's corpus index), for blocks cut mid-line, windows smaller
 * and larger than the corpus, CRLF and a last line without '\n'; batches within budget; the same
 * seed the same batches, other seeds and epochs others; a stream re-opened and seeked to a saved
 * position continuing as one that did not stop; memory bounded by the window for a corpus of 20
 * windows; the errors, named by file and line as in memory. Corpora: text generated here over the
 * 59 two-letter words of test_word_tokenizer (the tiny BERT's vocabulary), the committed
 * tests/data/train/cls_train.jsonl, and, with the MiniLM folder, Debian's licence texts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "testutil.h"
#include "train/stream.h"

enum { N_WORDS = 59, VOCAB = 64 };

/* n lines of lo..hi words; every 7th line ends in CRLF, every 10th is followed by a blank line,
 * now and then a literal [MASK] or [UNK]; the last line has no '\n' when `tail` is 0. */
static char *make_corpus(int n, int lo, int hi, uint64_t seed, int tail, size_t *len) {
    size_t cap = (size_t)n * (size_t)(hi + 3) * 8 + 64;
    char *buf = malloc(cap);
    assert_non_null(buf);
    uint64_t s = seed;
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        const int words = lo + (int)(test_rand_u32(&s) % (uint32_t)(hi - lo + 1));
        for (int w = 0; w < words; w++) {
            const uint32_t r = test_rand_u32(&s);
            if (w) buf[k++] = ' ';
            if (r % 97 == 0) k += (size_t)sprintf(buf + k, "%s", r & 128 ? "[MASK]" : "[UNK]");
            else {
                char wd[3];
                test_word((int)(r % N_WORDS), wd);
                k += (size_t)sprintf(buf + k, "%s", wd);
            }
        }
        if (i % 7 == 3) buf[k++] = '\r';
        if (i + 1 < n || tail) buf[k++] = '\n';
        if (i % 10 == 9 && i + 1 < n) buf[k++] = '\n';
    }
    *len = k;
    return buf;
}

static train_data_params mlm_params(int32_t max_length) {
    train_data_params p = train_data_default_params();
    p.max_length = max_length;
    p.vocab_size = VOCAB;
    return p;
}

/* A digest of the current batch (FNV-1a over its arrays). */
static uint64_t batch_digest(const train_batch *b) {
    uint64_t h = 1469598103934665603ull;
    const int32_t T = b->cu_seqlens[b->n_seqs];
    const struct { const int32_t *v; int32_t n; } parts[] = {
        {b->cu_seqlens, b->n_seqs + 1}, {b->tokens, T}, {b->types, T},
        {b->mlm_positions, b->mlm_positions ? b->n_masked : 0},
        {b->mlm_labels, b->mlm_labels ? b->n_masked : 0}, {b->labels, b->labels ? b->n_seqs : 0}};
    for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++)
        for (int32_t i = 0; i < parts[p].n; i++) h = (h ^ (uint32_t)parts[p].v[i]) * 1099511628211ull;
    return h;
}

/* One streamed epoch against the in-memory dataset `d` of the same file: every example exactly
 * once, each sequence the example's ids, types and line, masked exactly as train_mask_example
 * masks it in memory, each batch within its budgets. Returns the number of batches. */
static int64_t check_epoch(train_stream *s, const train_dataset *d, uint32_t epoch) {
    char *seen = calloc((size_t)d->n_examples, 1);
    int32_t *tokens = malloc((size_t)d->params.max_length * 4), *pos = malloc((size_t)d->params.max_length * 4);
    int32_t *labels = malloc((size_t)d->params.max_length * 4);
    assert_true(seen && tokens && pos && labels);
    const int mlm = d->params.task == TRAIN_TASK_MLM;
    assert_nopad_ok(train_stream_seek(s, epoch, 0, 0));
    int64_t batches = 0;
    for (int got = 1;;) {
        assert_nopad_ok(train_stream_next(s, &got));
        if (!got) break;
        batches++;
        const train_batch *b = &s->loader.batch;
        assert_true(b->n_seqs >= 1 && b->n_seqs <= s->max_seqs);
        assert_true(b->cu_seqlens[b->n_seqs] <= s->max_tokens);
        int32_t m = 0;
        for (int32_t q = 0; q < b->n_seqs; q++) {
            const int32_t w = s->loader.examples[q], at = b->cu_seqlens[q];
            const int64_t g = s->data.index[w];
            assert_true(g >= 0 && g < d->n_examples);
            assert_int_equal(seen[g]++, 0);
            const int32_t len = b->cu_seqlens[q + 1] - at;
            assert_int_equal(len, d->offsets[g + 1] - d->offsets[g]);
            assert_int_equal(s->data.line[w], d->line[g]);
            for (int32_t i = 0; i < len; i++)
                assert_int_equal(b->types[at + i], i < d->type0_len[g] ? 0 : 1);
            if (!mlm) {
                assert_memory_equal(b->tokens + at, d->ids + d->offsets[g], (size_t)len * 4);
                assert_int_equal(b->labels[q], d->labels[g]);
                continue;
            }
            const int32_t n = train_mask_example(d, s->seed, epoch, (int32_t)g, tokens, pos, labels);
            assert_memory_equal(b->tokens + at, tokens, (size_t)len * 4);
            for (int32_t k = 0; k < n; k++, m++) {
                assert_int_equal(b->mlm_positions[m], at + pos[k]);
                assert_int_equal(b->mlm_labels[m], labels[k]);
            }
        }
        if (mlm) assert_int_equal(m, b->n_masked);
    }
    for (int32_t e = 0; e < d->n_examples; e++) assert_int_equal(seen[e], 1);
    free(seen), free(tokens), free(pos), free(labels);
    return batches;
}

/* The file at `path` streamed with blocks of `block` bytes, `window` a window, against memory. */
static void check_file(const char *path, const nopad_tokenizer *tok, const train_data_params *p,
                       int64_t block, int32_t window, int32_t max_tokens, int32_t max_seqs) {
    train_dataset d;
    assert_nopad_ok(train_dataset_load(path, tok, p, &d));
    const train_stream_params sp = {.block_bytes = block, .window_blocks = window};
    train_stream s;
    assert_nopad_ok(train_stream_open(path, tok, p, &sp, max_tokens, max_seqs, 42, &s));
    assert_int_equal(s.n_examples, d.n_examples);
    assert_int_equal(s.n_tokens, d.n_tokens);
    assert_int_equal(s.n_skipped, d.n_skipped);
    assert_int_equal(s.n_truncated, d.n_truncated);
    for (uint32_t epoch = 0; epoch < 2; epoch++) {
        const int64_t batches = check_epoch(&s, &d, epoch);
        int64_t counted = 0;
        assert_nopad_ok(train_stream_count_batches(&s, epoch, &counted));
        assert_int_equal(counted, batches);
    }
    print_message("%s: blocks of %lld, %d a window: %d blocks, %d windows, %d examples\n", path,
                  (long long)block, window, s.n_blocks, s.n_windows, d.n_examples);
    train_stream_close(&s);
    train_dataset_free(&d);
}

static void test_equals_memory(void **state) {
    (void)state;
    nopad_tokenizer *tok = test_word_tokenizer(N_WORDS);
    size_t len;
    char *text = make_corpus(600, 1, 40, 3, 0, &len); // ~36 KB, the last line without '\n'
    const char *path = test_write_temp(1, ".txt", text, len);
    const train_data_params p = mlm_params(64);
    check_file(path, tok, &p, 97, 5, 256, 16);      // blocks cut mid-line, 75 windows
    check_file(path, tok, &p, 64, 4, 64, 3);        // blocks shorter than most lines
    check_file(path, tok, &p, 4096, 3, 256, 16);    // 3 windows
    check_file(path, tok, &p, (int64_t)1 << 20, 64, 256, 16); // one block, one window
    free(text);
    text = make_corpus(300, 1, 40, 4, 1, &len); // ending in '\n'
    path = test_write_temp(1, ".txt", text, len);
    check_file(path, tok, &p, 128, 4, 256, 16);
    free(text);
    // truncation counts as in memory
    train_data_params cut = mlm_params(12);
    cut.truncate = 1;
    check_file(path, tok, &cut, 200, 2, 24, 4);
    // classification on the committed JSONL, labels checked
    train_data_params cls = mlm_params(64);
    cls.format = TRAIN_DATA_JSONL;
    cls.task = TRAIN_TASK_CLASSIFY;
    cls.num_labels = 2;
    check_file(test_data_path("train/cls_train.jsonl"), tok, &cls, 64, 4, 64, 8);
    nopad_tokenizer_free(tok);

    // a real corpus: Debian's licence texts with MiniLM's WordPiece, when both are there
    const char *minilm = test_minilm_dir();
    static const char *const licences[] = {"GPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "LGPL-2.1"};
    char *all = NULL;
    size_t total = 0;
    for (size_t i = 0; i < sizeof licences / sizeof licences[0]; i++) {
        char lp[128];
        snprintf(lp, sizeof lp, "/usr/share/common-licenses/%s", licences[i]);
        char *t = test_read_file(lp, &len);
        if (!t) continue;
        all = realloc(all, total + len);
        assert_non_null(all);
        memcpy(all + total, t, len);
        total += len;
        free(t);
    }
    const char *licence_path = all ? test_write_temp(2, ".txt", all, total) : NULL;
    free(all);
    if (!minilm || total < 100000) {
        print_message("skipped the licence corpus (MiniLM folder or /usr/share/common-licenses "
                      "missing)\n");
        return;
    }
    nopad_tokenizer *wp = NULL;
    assert_nopad_ok(nopad_tokenizer_load(minilm, &wp));
    train_data_params lp = train_data_default_params();
    lp.max_length = 128;
    lp.truncate = 1;
    check_file(licence_path, wp, &lp, 4096, 8, 1024, 32);
    nopad_tokenizer_free(wp);
}

/* Every batch from the stream's position to the end of epoch 1, with the position after each. */
typedef struct trace {
    int n;
    uint64_t digest[4096];
    uint32_t epoch[4096];
    int32_t window[4096], cursor[4096];
} trace;

static void record(train_stream *s, trace *t) {
    t->n = 0;
    for (int got = 1;;) {
        assert_nopad_ok(train_stream_next(s, &got));
        if (!got) {
            if (s->epoch >= 1) return;
            assert_nopad_ok(train_stream_seek(s, s->epoch + 1, 0, 0));
            continue;
        }
        assert_true(t->n < 4096);
        t->digest[t->n] = batch_digest(&s->loader.batch);
        t->epoch[t->n] = s->epoch, t->window[t->n] = s->window, t->cursor[t->n] = s->loader.cursor;
        t->n++;
    }
}

static void test_determinism_and_resume(void **state) {
    (void)state;
    nopad_tokenizer *tok = test_word_tokenizer(N_WORDS);
    size_t len;
    char *text = make_corpus(500, 1, 30, 9, 1, &len);
    const char *path = test_write_temp(1, ".txt", text, len);
    free(text);
    const train_data_params p = mlm_params(48);
    const train_stream_params sp = {.block_bytes = 256, .window_blocks = 6};
    static trace straight, again, other, resumed;
    train_stream a, b, c;
    assert_nopad_ok(train_stream_open(path, tok, &p, &sp, 128, 8, 42, &a));
    assert_nopad_ok(train_stream_open(path, tok, &p, &sp, 128, 8, 42, &b));
    assert_nopad_ok(train_stream_open(path, tok, &p, &sp, 128, 8, 43, &c));
    assert_true(a.n_windows >= 5);
    record(&a, &straight);
    record(&b, &again);
    record(&c, &other);
    // the same seed: the same batches; another seed: others; epoch 1 is not epoch 0 again
    assert_int_equal(straight.n, again.n);
    assert_memory_equal(straight.digest, again.digest, (size_t)straight.n * 8);
    int same = 0, first1 = 0;
    for (int i = 0; i < straight.n && i < other.n; i++) same += straight.digest[i] == other.digest[i];
    assert_int_equal(same, 0);
    while (straight.epoch[first1] == 0) first1++;
    for (int i = 0; i < first1 && first1 + i < straight.n; i++)
        assert_true(straight.digest[i] != straight.digest[first1 + i]);
    // resuming: a fresh stream seeked to the position after batch k gives batches k+1 ... of the
    // run that did not stop, across windows and into the next epoch
    const int stops[] = {0, 1, first1 / 3, first1 / 2, first1 - 1, first1, straight.n - 2};
    for (size_t i = 0; i < sizeof stops / sizeof stops[0]; i++) {
        const int k = stops[i];
        train_stream r;
        assert_nopad_ok(train_stream_open(path, tok, &p, &sp, 128, 8, 42, &r));
        assert_nopad_ok(train_stream_seek(&r, straight.epoch[k], straight.window[k], straight.cursor[k]));
        record(&r, &resumed);
        assert_int_equal(resumed.n, straight.n - k - 1);
        assert_memory_equal(resumed.digest, straight.digest + k + 1, (size_t)resumed.n * 8);
        train_stream_close(&r);
    }
    // a window is cut at its end: the batch after a window's last starts the next window
    int crossings = 0;
    for (int i = 1; i < straight.n; i++) crossings += straight.window[i] != straight.window[i - 1];
    assert_true(crossings >= a.n_windows);
    assert_nopad_error(train_stream_seek(&a, 0, a.n_windows + 1, 0), NOPAD_ERR_INVALID_ARGUMENT, "window");
    assert_nopad_error(train_stream_seek(&a, 0, 0, 100000), NOPAD_ERR_INVALID_ARGUMENT, "cursor 100000");
    train_stream_close(&a), train_stream_close(&b), train_stream_close(&c);
    nopad_tokenizer_free(tok);
}

/* A corpus of 20 windows: the stream's memory stays that of a window (and about what a corpus of
 * 2 windows takes), while the dataset in memory grows with the corpus. */
static void test_memory_bound(void **state) {
    (void)state;
    nopad_tokenizer *tok = test_word_tokenizer(N_WORDS);
    const train_data_params p = mlm_params(64);
    const train_stream_params sp = {.block_bytes = 4096, .window_blocks = 16};
    const int64_t window_bytes = sp.block_bytes * sp.window_blocks;
    size_t peak[2] = {0, 0};
    for (int big = 0; big < 2; big++) {
        size_t len = 0;
        char *text = NULL;
        for (int n = 500;; n += n / 2) { // the smallest corpus of at least 2 or 20 windows
            free(text);
            text = make_corpus(n, 1, 40, 21, 1, &len);
            if ((int64_t)len >= (big ? 20 : 2) * window_bytes) break;
        }
        const char *path = test_write_temp(1, ".txt", text, len);
        free(text);
        train_stream s;
        assert_nopad_ok(train_stream_open(path, tok, &p, &sp, 512, 32, 42, &s));
        for (uint32_t epoch = 0; epoch < 2; epoch++) {
            int64_t n = 0;
            assert_nopad_ok(train_stream_count_batches(&s, epoch, &n));
            assert_true(n > 0);
        }
        peak[big] = s.peak_bytes;
        train_dataset d;
        assert_nopad_ok(train_dataset_load(path, tok, &p, &d));
        const size_t in_memory = train_dataset_bytes(&d) + len; // the text is read whole first
        print_message("corpus %zu bytes (%.1f windows): stream peak %zu bytes (%.2f x the window's "
                      "text), in memory %zu\n", len, (double)len / (double)window_bytes, peak[big],
                      (double)peak[big] / (double)window_bytes, in_memory);
        // the window's text tokenized: 4 bytes a token (a word and its space are 3 bytes), 40 an
        // example, with up to 2x from doubling, plus a block's text and the loader's batch
        assert_true(peak[big] <= (size_t)(4 * window_bytes));
        if (big) assert_true(peak[big] * 5 < in_memory);
        train_dataset_free(&d);
        train_stream_close(&s);
    }
    assert_true(peak[1] <= 2 * peak[0]);
    nopad_tokenizer_free(tok);
}

static void expect_error(const nopad_tokenizer *tok, const train_data_params *p, const char *text,
                         int64_t block, int32_t window, int32_t max_tokens, nopad_status want,
                         const char *needle, int in_memory_too) {
    const char *path = test_write_temp(1, ".txt", text, strlen(text));
    const train_stream_params sp = {.block_bytes = block, .window_blocks = window};
    train_stream s;
    assert_nopad_error(train_stream_open(path, tok, p, &sp, max_tokens, 8, 1, &s), want, needle);
    assert_null(s.text); // nothing left allocated
    train_dataset d; // the same message as in memory, where the case exists there
    if (in_memory_too) assert_nopad_error(train_dataset_load(path, tok, p, &d), want, needle);
}

static void test_errors(void **state) {
    (void)state;
    nopad_tokenizer *tok = test_word_tokenizer(N_WORDS);
    train_data_params p = mlm_params(16);
    expect_error(tok, &p, "", 64, 2, 64, NOPAD_ERR_INVALID_ARGUMENT, "no training example", 1);
    expect_error(tok, &p, "\n  \n\r\n", 2, 2, 64, NOPAD_ERR_INVALID_ARGUMENT,
                 "no training example (3 lines skipped", 1);
    // line numbers across blocks cut mid-line: the bad line is the 9th
    const char *bad = "aa ab\nac ad ae\n\nba bb bc\r\nbd\nbe bf bg bh\n\n\nca \xff cb\ncc\n";
    expect_error(tok, &p, bad, 7, 2, 64, NOPAD_ERR_INVALID_ARGUMENT, "line 9", 1);
    expect_error(tok, &p, "aa\nab ac ad ae af ag ah ai aj ak al am an ao ap aq ar as at\nau\n", 8, 8,
                 64, NOPAD_ERR_TOO_LONG, "line 2: 21 tokens", 1);
    // a line longer than the window's text (16 bytes) cannot be held
    expect_error(tok, &p, "aa\nab ac ad ae af ag ah\nau\n", 4, 4, 64, NOPAD_ERR_TOO_LONG,
                 "line 2 is longer than the stream's window of 16 bytes", 0);
    expect_error(tok, &p, "aa\naa ab ac ad\n", 4, 4, 5, NOPAD_ERR_INVALID_ARGUMENT,
                 "line 2 has 6 tokens, more than the batch budget of 5", 0);
    p.format = TRAIN_DATA_JSONL;
    p.task = TRAIN_TASK_CLASSIFY;
    p.num_labels = 2;
    expect_error(tok, &p, "{\"text\": \"aa\", \"label\": 0}\n{\"text\": \"ab\", \"label\": 1}\n"
                          "{\"text\": \"ac\", \"label\": 2}\n", 16, 4, 64,
                 NOPAD_ERR_INVALID_ARGUMENT, "line 3: label 2 out of range", 1);
    train_stream s;
    const train_stream_params sp = train_stream_default_params();
    assert_nopad_error(train_stream_open("/nonexistent/corpus.txt", tok, &p, &sp, 64, 8, 1, &s),
                       NOPAD_ERR_IO, "/nonexistent/corpus.txt");
    nopad_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equals_memory),
        cmocka_unit_test(test_determinism_and_resume),
        cmocka_unit_test(test_memory_bound),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
