/* Training data (src/train/data.c): reading and tokenizing a corpus, token-budget batches, dynamic
 * MLM masking. The tokenizer is a WordPiece vocab.txt written here: [PAD] [UNK] [CLS] [SEP] [MASK]
 * (ids 0-4) and 59 two-letter words (ids 5-63), so the ids fit the tiny BERT of
 * tests/data/train and its batches can run a training step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "train/data.h"

enum { N_SPECIAL = 5, VOCAB = 64, N_WORDS = VOCAB - N_SPECIAL };

static nopad_tokenizer *make_tokenizer(void) {
    nopad_tokenizer *tok = test_word_tokenizer(N_WORDS);
    assert_int_equal(nopad_tokenizer_vocab_size(tok), VOCAB);
    return tok;
}

/* A text corpus of n lines of lo..hi random words, now and then a literal [MASK] or [UNK] (special
 * tokens inside the text, which must never be chosen either) and blank lines between. */
static const char *write_corpus(int n, int lo, int hi, uint64_t seed) {
    size_t cap = (size_t)n * (size_t)(hi + 2) * 8 + 64, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    uint64_t s = seed;
    for (int i = 0; i < n; i++) {
        const int words = lo + (int)(test_rand_u32(&s) % (uint32_t)(hi - lo + 1));
        for (int w = 0; w < words; w++) {
            const uint32_t r = test_rand_u32(&s);
            if (r % 97 == 0) len += (size_t)sprintf(buf + len, "%s", r & 128 ? "[MASK]" : "[UNK]");
            else {
                char wd[3];
                test_word((int)(r % N_WORDS), wd);
                len += (size_t)sprintf(buf + len, "%s", wd);
            }
            buf[len++] = w + 1 < words ? ' ' : '\n';
        }
        if (i % 10 == 9) buf[len++] = '\n';
    }
    const char *path = test_write_temp(1, ".txt", buf, len);
    free(buf);
    return path;
}

static train_data_params mlm_params(int32_t max_length) {
    train_data_params p = train_data_default_params();
    p.max_length = max_length;
    p.vocab_size = VOCAB;
    return p;
}

static int is_special(int32_t id) { return id < N_SPECIAL; }

/* Every example exactly once per epoch, no batch over its budget, sequences and types as the
 * dataset has them, the tokens equal to the dataset's except at the masked positions, masked
 * positions never on a special token, the labels the original ids. Returns the batches. */
static int check_epoch(train_loader *l, uint32_t epoch) {
    const train_dataset *d = l->data;
    int *seen = calloc((size_t)d->n_examples, sizeof(int));
    assert_non_null(seen);
    assert_nopad_ok(train_loader_seek(l, epoch, 0));
    int batches = 0;
    while (train_loader_next(l)) {
        const train_batch *b = &l->batch;
        batches++;
        assert_true(b->n_seqs >= 1 && b->n_seqs <= l->max_seqs);
        assert_int_equal(b->cu_seqlens[0], 0);
        const int32_t T = b->cu_seqlens[b->n_seqs];
        assert_true(T <= l->max_tokens);
        int32_t m = 0;
        for (int32_t s = 0; s < b->n_seqs; s++) {
            const int32_t e = l->examples[s], at = b->cu_seqlens[s];
            const int32_t len = b->cu_seqlens[s + 1] - at;
            assert_int_equal(seen[e]++, 0);
            assert_int_equal(len, d->offsets[e + 1] - d->offsets[e]);
            for (int32_t i = 0; i < len; i++) {
                const int32_t orig = d->ids[d->offsets[e] + i];
                assert_int_equal(b->types[at + i], i < d->type0_len[e] ? 0 : 1);
                if (m < b->n_masked && b->mlm_positions[m] == at + i) {
                    assert_false(is_special(orig));
                    assert_int_equal(b->mlm_labels[m], orig);
                    assert_true(b->tokens[at + i] == 4 || !is_special(b->tokens[at + i]));
                    m++;
                } else {
                    assert_int_equal(b->tokens[at + i], orig);
                }
            }
            if (b->labels) assert_int_equal(b->labels[s], d->labels[e]);
            if (b->targets) assert_true(b->targets[s] == d->targets[e]);
        }
        assert_int_equal(m, b->n_masked); // positions increasing, all inside the batch
        if (d->params.task == TRAIN_TASK_MLM) assert_true(b->n_masked >= 1);
    }
    for (int32_t e = 0; e < d->n_examples; e++) assert_int_equal(seen[e], 1);
    assert_int_equal(train_loader_next(l), 0);
    free(seen);
    return batches;
}

static void test_load_text(void **state) {
    (void)state;
    nopad_tokenizer *tok = make_tokenizer();
    const char *text = "aa ab\n\n  \r\nac [MASK] ad\r\nb [SEP]\nba\n";
    const char *path = test_write_temp(1, ".txt", text, strlen(text));
    train_data_params p = mlm_params(32);
    train_dataset d;
    assert_nopad_ok(train_dataset_load(path, tok, &p, &d));
    // "b" is not in the vocabulary: [UNK]: "b [SEP]" has nothing to mask, "ba" is an example
    assert_int_equal(d.n_examples, 3);
    assert_int_equal(d.n_skipped, 3);
    const int32_t want[] = {2, 5, 6, 3, 2, 7, 4, 8, 3, 2, 31, 3};
    assert_int_equal(d.n_tokens, 12);
    for (int i = 0; i < 12; i++) assert_int_equal(d.ids[i], want[i]);
    assert_int_equal(d.line[1], 4);
    assert_int_equal(d.line[2], 6);
    train_dataset_free(&d);
    // classification keeps every example: [CLS] [UNK] [SEP] [SEP]
    const char *jsonl = "{\"text\": \"b [SEP]\", \"label\": 1}\n";
    path = test_write_temp(1, ".jsonl", jsonl, strlen(jsonl));
    p.format = TRAIN_DATA_JSONL;
    p.task = TRAIN_TASK_CLASSIFY;
    assert_nopad_ok(train_dataset_load(path, tok, &p, &d));
    assert_int_equal(d.n_tokens, 4);
    p = mlm_params(32);
    assert_int_equal(d.mask_id, 4);
    for (int i = 0; i < N_SPECIAL; i++) assert_int_equal(d.special[i], 1);
    assert_int_equal(d.n_plain, N_WORDS);
    train_dataset_free(&d);
    nopad_tokenizer_free(tok);
}

static void test_determinism_and_batches(void **state) {
    (void)state;
    nopad_tokenizer *tok = make_tokenizer();
    const char *path = write_corpus(300, 1, 60, 7);
    train_data_params p = mlm_params(128);
    train_dataset d;
    assert_nopad_ok(train_dataset_load(path, tok, &p, &d));
    assert_int_equal(d.n_examples, 300);
    train_loader a, b, c, small;
    assert_nopad_ok(train_loader_init(&d, 256, 64, 42, &a));
    assert_nopad_ok(train_loader_init(&d, 256, 64, 42, &b));
    assert_nopad_ok(train_loader_init(&d, 256, 64, 43, &c));
    assert_nopad_ok(train_loader_init(&d, 62, 3, 42, &small)); // the longest example is 62
    for (uint32_t epoch = 0; epoch < 3; epoch++) {
        check_epoch(&a, epoch);
        check_epoch(&small, epoch);
    }
    // the same seed: the same batches, bit for bit
    assert_nopad_ok(train_loader_seek(&a, 1, 0));
    assert_nopad_ok(train_loader_seek(&b, 1, 0));
    int n = 0;
    while (train_loader_next(&a)) {
        assert_int_equal(train_loader_next(&b), 1);
        const int32_t T = a.batch.cu_seqlens[a.batch.n_seqs];
        assert_int_equal(a.batch.n_seqs, b.batch.n_seqs);
        assert_memory_equal(a.batch.cu_seqlens, b.batch.cu_seqlens, (size_t)(a.batch.n_seqs + 1) * 4);
        assert_memory_equal(a.batch.tokens, b.batch.tokens, (size_t)T * 4);
        assert_int_equal(a.batch.n_masked, b.batch.n_masked);
        assert_memory_equal(a.batch.mlm_positions, b.batch.mlm_positions, (size_t)a.batch.n_masked * 4);
        n++;
    }
    assert_int_equal(train_loader_next(&b), 0);
    assert_true(n >= 300 * 30 / 256);
    // another seed or epoch: another order
    assert_nopad_ok(train_loader_seek(&a, 0, 0));
    assert_nopad_ok(train_loader_seek(&c, 0, 0));
    assert_memory_not_equal(a.order, c.order, 300 * 4);
    int32_t *epoch0 = malloc(300 * 4);
    memcpy(epoch0, a.order, 300 * 4);
    assert_nopad_ok(train_loader_seek(&a, 1, 0));
    assert_memory_not_equal(a.order, epoch0, 300 * 4);
    // the masking of an example depends on (seed, epoch, example), not on its batch: the masked
    // tokens of each example under budget 256 equal those under budget 62 / 3 sequences
    int32_t *tokens = calloc((size_t)d.n_tokens, 4);
    char *masked = calloc((size_t)d.n_tokens, 1);
    assert_nopad_ok(train_loader_seek(&a, 2, 0));
    assert_nopad_ok(train_loader_seek(&small, 2, 0));
    for (train_loader *l = &a;; l = &small) {
        for (int m = 0; train_loader_next(l);) {
            for (int32_t s = 0; s < l->batch.n_seqs; s++) {
                const int32_t at = l->batch.cu_seqlens[s], e = l->examples[s];
                const int32_t len = l->batch.cu_seqlens[s + 1] - at;
                for (int32_t i = 0; i < len; i++) {
                    const int64_t k = d.offsets[e] + i;
                    const int hit = m < l->batch.n_masked && l->batch.mlm_positions[m] == at + i;
                    m += hit;
                    if (l == &a) tokens[k] = l->batch.tokens[at + i], masked[k] = (char)hit;
                    else {
                        assert_int_equal(tokens[k], l->batch.tokens[at + i]);
                        assert_int_equal(masked[k], hit);
                    }
                }
            }
            m = 0;
        }
        if (l == &small) break;
    }
    // resuming mid-epoch: the batches from a cursor equal the tail of the full epoch
    assert_nopad_ok(train_loader_seek(&a, 1, 0));
    assert_int_equal(train_loader_next(&a), 1);
    assert_int_equal(train_loader_next(&a), 1);
    const int32_t cursor = a.cursor;
    assert_int_equal(train_loader_next(&a), 1);
    int32_t *third = malloc((size_t)a.batch.cu_seqlens[a.batch.n_seqs] * 4);
    memcpy(third, a.batch.tokens, (size_t)a.batch.cu_seqlens[a.batch.n_seqs] * 4);
    assert_nopad_ok(train_loader_seek(&b, 1, cursor));
    assert_int_equal(train_loader_next(&b), 1);
    assert_memory_equal(b.batch.tokens, third, (size_t)a.batch.cu_seqlens[a.batch.n_seqs] * 4);
    free(third), free(tokens), free(masked), free(epoch0);
    train_loader_free(&a), train_loader_free(&b), train_loader_free(&c), train_loader_free(&small);
    train_dataset_free(&d);
    nopad_tokenizer_free(tok);
}

/* The masking proportions over ~6 · 10^5 maskable tokens (4000 lines of 20-80 words, 3 epochs).
 * Each token is chosen independently with p = 0.15 (exactly 644245094 / 2^32), plus one token in
 * each example where none was: E[chosen] = Σ_e (p n_e + (1-p)^n_e), Var ≈ Σ_e n_e p (1-p). Of the
 * X chosen, [MASK] ~ Binomial(X, 0.8); the random replacement (0.1) draws one of the 59 plain ids,
 * so it equals the original with probability 1/59: a token left as it was has probability
 * 0.1 + 0.1/59, a different plain id 0.1 · 58/59. Each count must lie within 5 standard
 * deviations of its mean: a false failure has probability below 6e-7 per count (normal
 * approximation, fine at these counts; the seeds are fixed, so the test is deterministic and the
 * bound only has to be loose enough for a correct generator), while a 1-point error in a rate
 * (15% -> 14%) is ~20σ off. */
static void test_mask_proportions(void **state) {
    (void)state;
    nopad_tokenizer *tok = make_tokenizer();
    const char *path = write_corpus(4000, 20, 80, 11);
    train_data_params p = mlm_params(128);
    train_dataset d;
    assert_nopad_ok(train_dataset_load(path, tok, &p, &d));
    int32_t *tokens = malloc(128 * 4), *pos = malloc(128 * 4), *labels = malloc(128 * 4);
    const double pm = 644245094.0 / 4294967296.0;
    double expect = 0, var = 0;
    long chosen = 0, n_mask = 0, n_same = 0, n_random = 0, fallback = 0;
    for (uint32_t epoch = 0; epoch < 3; epoch++) {
        for (int32_t e = 0; e < d.n_examples; e++) {
            const int32_t len = (int32_t)(d.offsets[e + 1] - d.offsets[e]);
            const int32_t *ids = d.ids + d.offsets[e];
            int32_t n = 0;
            for (int32_t i = 0; i < len; i++) n += !d.special[ids[i]];
            expect += pm * n + pow(1 - pm, n);
            var += n * pm * (1 - pm);
            const int32_t m = train_mask_example(&d, 1234, epoch, e, tokens, pos, labels);
            assert_true(m >= 1 && m <= n);
            fallback += m == 1;
            chosen += m;
            for (int32_t k = 0; k < m; k++) {
                assert_true(k == 0 || pos[k] > pos[k - 1]);
                assert_false(d.special[ids[pos[k]]]);
                assert_int_equal(labels[k], ids[pos[k]]);
                const int32_t t = tokens[pos[k]];
                if (t == d.mask_id) n_mask++;
                else if (t == labels[k]) n_same++;
                else {
                    assert_false(d.special[t]);
                    n_random++;
                }
            }
            for (int32_t i = 0, k = 0; i < len; i++) {
                if (k < m && pos[k] == i) k++;
                else assert_int_equal(tokens[i], ids[i]);
            }
        }
    }
    const double X = (double)chosen;
    const double q_same = 0.1 + 0.1 / N_WORDS, q_random = 0.1 * (N_WORDS - 1) / N_WORDS;
    const double sd = sqrt(var), sd_mask = sqrt(X * 0.8 * 0.2);
    const double sd_same = sqrt(X * q_same * (1 - q_same)), sd_rand = sqrt(X * q_random * (1 - q_random));
    print_message("chosen %ld (expected %.0f ± %.0f, %.4f of maskable), [MASK] %.4f, same %.4f, "
                  "random %.4f\n", chosen, expect, sd, X / (expect / pm), n_mask / X, n_same / X,
                  n_random / X);
    assert_true(X > 5e4);
    assert_true(fabs(X - expect) < 5 * sd);
    assert_true(fabs(n_mask - 0.8 * X) < 5 * sd_mask);
    assert_true(fabs(n_same - q_same * X) < 5 * sd_same);
    assert_true(fabs(n_random - q_random * X) < 5 * sd_rand);
    (void)fallback;
    // a short example where no token may be chosen still gets exactly one
    const char *one = "aa\n";
    path = test_write_temp(1, ".txt", one, strlen(one));
    train_dataset s;
    assert_nopad_ok(train_dataset_load(path, tok, &p, &s));
    for (uint32_t epoch = 0; epoch < 50; epoch++) {
        assert_int_equal(train_mask_example(&s, 5, epoch, 0, tokens, pos, labels), 1);
        assert_int_equal(pos[0], 1);
    }
    train_dataset_free(&s);
    free(tokens), free(pos), free(labels);
    train_dataset_free(&d);
    nopad_tokenizer_free(tok);
}

/* Whole-word masking on a WordPiece vocabulary of 20 two-letter words and their "##" forms, text
 * words of 1-4 pieces: a word's pieces are chosen all together or not at all, about mask_prob of
 * the words are chosen, each example gets at least one word, and the same draws give the same
 * masks. A BPE tokenizer (RoBERTa's, no "##" pieces) is refused with a message saying why. */
static void test_whole_word_mask(void **state) {
    (void)state;
    enum { W = 20 };
    nopad_tokenizer *tok = test_wordpiece_tokenizer(W, 1);
    /* a corpus of words made of 1-4 pieces */
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    uint64_t rs = 77;
    for (int line = 0; line < 2000; line++) {
        const int words = 1 + (int)(test_rand_u32(&rs) % 30);
        for (int w = 0; w < words; w++) {
            const int pieces = 1 + (int)(test_rand_u32(&rs) % 4);
            for (int k = 0; k < pieces; k++) {
                char wd[3];
                test_word((int)(test_rand_u32(&rs) % W), wd);
                len += (size_t)sprintf(buf + len, "%s", wd);
            }
            buf[len++] = w + 1 < words ? ' ' : '\n';
        }
    }
    const char *corpus = test_write_temp(1, ".txt", buf, len);
    free(buf);
    train_data_params p = train_data_default_params();
    p.max_length = 256;
    p.whole_word = 1;
    train_dataset d;
    assert_nopad_ok(train_dataset_load(corpus, tok, &p, &d));
    assert_non_null(d.continues);
    int32_t *tokens = malloc(256 * 4), *pos = malloc(256 * 4), *labels = malloc(256 * 4);
    int32_t *tokens2 = malloc(256 * 4), *pos2 = malloc(256 * 4), *labels2 = malloc(256 * 4);
    char *picked = malloc(256);
    const double pm = 644245094.0 / 4294967296.0;
    double expect = 0, var = 0;
    long chosen_words = 0, multi_piece = 0;
    for (uint32_t epoch = 0; epoch < 3; epoch++) {
        for (int32_t e = 0; e < d.n_examples; e++) {
            const int32_t n_ids = (int32_t)(d.offsets[e + 1] - d.offsets[e]);
            const int32_t *ids = d.ids + d.offsets[e];
            const int32_t m = train_mask_example(&d, 99, epoch, e, tokens, pos, labels);
            assert_int_equal(train_mask_example(&d, 99, epoch, e, tokens2, pos2, labels2), m);
            assert_memory_equal(tokens, tokens2, (size_t)n_ids * 4);
            assert_memory_equal(pos, pos2, (size_t)m * 4);
            assert_true(m >= 1);
            memset(picked, 0, (size_t)n_ids);
            for (int32_t k = 0; k < m; k++) {
                assert_true(k == 0 || pos[k] > pos[k - 1]);
                assert_false(d.special[ids[pos[k]]]);
                assert_int_equal(labels[k], ids[pos[k]]);
                picked[pos[k]] = 1;
            }
            /* words: a piece not starting with ## and the ## pieces after it */
            int32_t words = 0, words_chosen = 0;
            for (int32_t i = 0; i < n_ids;) {
                if (d.special[ids[i]]) {
                    assert_false(picked[i]);
                    i++;
                    continue;
                }
                int32_t j = i + 1;
                while (j < n_ids && !d.special[ids[j]] && d.continues[ids[j]]) j++;
                for (int32_t q = i; q < j; q++)
                    if (picked[q] != picked[i])
                        fail_msg("example %d epoch %u: the word at %d..%d is partly chosen", e, epoch, i, j - 1);
                words++;
                if (picked[i]) words_chosen++, multi_piece += j - i > 1;
                i = j;
            }
            expect += pm * words + pow(1 - pm, words);
            var += words * pm * (1 - pm);
            chosen_words += words_chosen;
        }
    }
    print_message("whole words chosen %ld (expected %.0f ± %.0f), %ld of them of several pieces\n",
                  chosen_words, expect, sqrt(var), multi_piece);
    assert_true(chosen_words > 10000 && multi_piece > 1000);
    assert_true(fabs((double)chosen_words - expect) < 5 * sqrt(var));
    free(tokens), free(pos), free(labels), free(tokens2), free(pos2), free(labels2), free(picked);
    train_dataset_free(&d);
    nopad_tokenizer_free(tok);

    /* no "##" pieces to find words by: refused */
    nopad_tokenizer *bpe = NULL;
    assert_nopad_ok(nopad_tokenizer_load(test_data_path("models/roberta_text"), &bpe));
    train_data_params pb = train_data_default_params();
    pb.max_length = 64;
    pb.whole_word = 1;
    const char *text = "hello world\n";
    assert_int_equal(train_dataset_load(test_write_temp(1, ".txt", text, strlen(text)), bpe, &pb, &d),
                     NOPAD_ERR_UNSUPPORTED);
    assert_non_null(strstr(nopad_last_error(), "whole-word masking needs a WordPiece tokenizer"));
    nopad_tokenizer_free(bpe);
}

/* Packed lines: the pieces, laid end to end, are the line-by-line examples laid end to end (none
 * dropped here: every 32-token window holds a word; lines longer than 32 tokens are cut, not
 * refused), each of max_length tokens but the last,
 * keyed by their number, with the line of their first token; every piece gets a masked token. */
static void test_pack_lines(void **state) {
    (void)state;
    nopad_tokenizer *tok = make_tokenizer();
    const char *path = write_corpus(300, 1, 40, 5);
    train_data_params p = mlm_params(512); /* line by line: lines of up to 42 tokens fit */
    train_dataset lines, packed;
    assert_nopad_ok(train_dataset_load(path, tok, &p, &lines));
    p = mlm_params(32); /* packed: longer lines are cut too, not refused */
    p.pack = 1;
    assert_nopad_ok(train_dataset_load(path, tok, &p, &packed));
    assert_int_equal(packed.n_tokens, lines.n_tokens);
    assert_memory_equal(packed.ids, lines.ids, (size_t)lines.n_tokens * sizeof(int32_t));
    assert_int_equal(packed.n_examples, (int32_t)((lines.n_tokens + 31) / 32));
    int32_t *tokens = malloc(32 * 4), *pos = malloc(32 * 4), *labels = malloc(32 * 4);
    for (int32_t e = 0, src = 0; e < packed.n_examples; e++) {
        const int64_t at = packed.offsets[e], len = packed.offsets[e + 1] - at;
        assert_int_equal(at, (int64_t)e * 32);
        assert_true(len == 32 || (e + 1 == packed.n_examples && len >= 1 && len <= 32));
        assert_int_equal(packed.index[e], e);
        assert_int_equal(packed.type0_len[e], len);
        while (lines.offsets[src + 1] <= at) src++;
        assert_int_equal(packed.line[e], lines.line[src]);
        assert_true(train_mask_example(&packed, 3, 0, e, tokens, pos, labels) >= 1);
    }
    free(tokens), free(pos), free(labels);
    train_dataset_free(&lines);
    train_dataset_free(&packed);
    nopad_tokenizer_free(tok);
}

static void test_classification(void **state) {
    (void)state;
    nopad_tokenizer *tok = make_tokenizer();
    const char *jsonl = "{\"text\": \"aa ab\", \"label\": 2}\n"
                        "\n"
                        "{\"text\": \"ac\", \"text_pair\": \"ad ae af\", \"label\": 0}\n"
                        "{\"text\": \"\", \"label\": 1, \"extra\": [1, 2]}\n";
    const char *path = test_write_temp(1, ".jsonl", jsonl, strlen(jsonl));
    train_data_params p = mlm_params(32);
    p.format = TRAIN_DATA_JSONL;
    p.task = TRAIN_TASK_CLASSIFY;
    p.num_labels = 3;
    train_dataset d;
    assert_nopad_ok(train_dataset_load(path, tok, &p, &d));
    assert_int_equal(d.n_examples, 3);
    assert_null(d.targets);
    assert_int_equal(d.labels[0], 2), assert_int_equal(d.labels[1], 0), assert_int_equal(d.labels[2], 1);
    // [CLS] ac [SEP] ad ae af [SEP], types 0 0 0 1 1 1 1
    const int32_t want[] = {2, 7, 3, 8, 9, 10, 3};
    assert_int_equal(d.offsets[2] - d.offsets[1], 7);
    for (int i = 0; i < 7; i++) assert_int_equal(d.ids[d.offsets[1] + i], want[i]);
    assert_int_equal(d.type0_len[1], 3);
    assert_int_equal(d.offsets[3] - d.offsets[2], 2); // [CLS] [SEP]
    train_loader l;
    assert_nopad_ok(train_loader_init(&d, 9, 8, 3, &l));
    for (uint32_t epoch = 0; epoch < 4; epoch++) check_epoch(&l, epoch);
    train_loader_free(&l);
    train_dataset_free(&d);

    // regression: any finite number
    const char *reg = "{\"text\": \"aa\", \"label\": 0.25}\n{\"text\": \"ab\", \"label\": -3}\n";
    path = test_write_temp(1, ".jsonl", reg, strlen(reg));
    p.num_labels = 1;
    assert_nopad_ok(train_dataset_load(path, tok, &p, &d));
    assert_null(d.labels);
    assert_true(d.targets[0] == 0.25f && d.targets[1] == -3.0f);
    assert_nopad_ok(train_loader_init(&d, 8, 8, 3, &l));
    check_epoch(&l, 0);
    train_loader_free(&l);
    train_dataset_free(&d);

    // truncation: a single text keeps [SEP]; a pair is cut longest side first
    const char *lng = "{\"text\": \"aa ab ac ad ae af ag\", \"text_pair\": \"ba bb\", \"label\": 0}\n"
                      "{\"text\": \"aa ab ac ad ae af ag ah\", \"label\": 0}\n";
    path = test_write_temp(1, ".jsonl", lng, strlen(lng));
    p.num_labels = 2;
    p.max_length = 8;
    assert_nopad_error(train_dataset_load(path, tok, &p, &d), NOPAD_ERR_TOO_LONG, "line 1: 12 tokens");
    p.truncate = 1;
    assert_nopad_ok(train_dataset_load(path, tok, &p, &d));
    assert_int_equal(d.n_truncated, 2);
    const int32_t cut0[] = {2, 5, 6, 7, 3, 31, 32, 3}, cut1[] = {2, 5, 6, 7, 8, 9, 10, 3};
    for (int i = 0; i < 8; i++) assert_int_equal(d.ids[i], cut0[i]);
    for (int i = 0; i < 8; i++) assert_int_equal(d.ids[8 + i], cut1[i]);
    assert_int_equal(d.type0_len[0], 5);
    train_dataset_free(&d);
    nopad_tokenizer_free(tok);
}

static void expect_error(const nopad_tokenizer *tok, const train_data_params *p, const char *text,
                         nopad_status want, const char *needle) {
    const char *path = test_write_temp(1, ".jsonl", text, strlen(text));
    train_dataset d;
    memset(&d, 0xAB, sizeof d);
    assert_nopad_error(train_dataset_load(path, tok, p, &d), want, needle);
    assert_null(d.ids); // nothing left allocated
}

static void test_errors(void **state) {
    (void)state;
    nopad_tokenizer *tok = make_tokenizer();
    train_data_params p = mlm_params(32);
    expect_error(tok, &p, "", NOPAD_ERR_INVALID_ARGUMENT, "no training example");
    expect_error(tok, &p, "\n  \n\r\n", NOPAD_ERR_INVALID_ARGUMENT, "no training example (3 lines");
    // MLM: truncation leaves nothing to mask (the word is cut, the [UNK]s stay): skipped
    train_data_params cut = mlm_params(5);
    cut.truncate = 1;
    expect_error(tok, &cut, "[UNK] b [MASK] aa\n", NOPAD_ERR_INVALID_ARGUMENT, "(1 lines skipped");
    expect_error(tok, &p, "aa \xff ab\n", NOPAD_ERR_INVALID_ARGUMENT, "line 1");
    train_data_params big = mlm_params(32);
    big.vocab_size = 20; // the tokenizer's ids above the model's vocabulary
    expect_error(tok, &big, "aa cg\n", NOPAD_ERR_INVALID_ARGUMENT, "line 1: token id 63");
    train_dataset d;
    assert_nopad_error(train_dataset_load("/nonexistent/corpus.txt", tok, &p, &d), NOPAD_ERR_IO,
                       "/nonexistent/corpus.txt");

    p.format = TRAIN_DATA_JSONL;
    p.task = TRAIN_TASK_CLASSIFY;
    p.num_labels = 3;
    const char *ok = "{\"text\": \"aa\", \"label\": 0}\n";
    char buf[256];
    snprintf(buf, sizeof buf, "%s%s{\"text\": \"aa\", \"label\": 3}\n", ok, ok);
    expect_error(tok, &p, buf, NOPAD_ERR_INVALID_ARGUMENT, "line 3: label 3 out of range, expected 0 to 2");
    snprintf(buf, sizeof buf, "%s{\"text\": \"aa\", \"label\": -1}\n", ok);
    expect_error(tok, &p, buf, NOPAD_ERR_INVALID_ARGUMENT, "line 2: label -1 out of range");
    snprintf(buf, sizeof buf, "%s{\"text\": \"aa\", \"label\": 1.5}\n", ok);
    expect_error(tok, &p, buf, NOPAD_ERR_FORMAT, "line 2: label 1.5 is not an integer");
    snprintf(buf, sizeof buf, "%s{\"text\": \"aa\", \"label\": \"1\"}\n", ok);
    expect_error(tok, &p, buf, NOPAD_ERR_FORMAT, "\"label\" has the wrong JSON type");
    snprintf(buf, sizeof buf, "%s%s{\"text\": \"aa\", \"label\": 1\n", ok, ok);
    expect_error(tok, &p, buf, NOPAD_ERR_FORMAT, "line 3: not valid JSON");
    snprintf(buf, sizeof buf, "%s[1, 2]\n", ok);
    expect_error(tok, &p, buf, NOPAD_ERR_FORMAT, "line 2: not a JSON object");
    expect_error(tok, &p, "{\"label\": 1}\n", NOPAD_ERR_FORMAT, "line 1: no \"text\" field");
    expect_error(tok, &p, "{\"text\": 5, \"label\": 1}\n", NOPAD_ERR_FORMAT, "\"text\" has the wrong");
    expect_error(tok, &p, "{\"text\": \"aa\", \"text_pair\": 1, \"label\": 1}\n", NOPAD_ERR_FORMAT,
                 "\"text_pair\" has the wrong");
    expect_error(tok, &p, "{\"text\": \"aa\"}\n", NOPAD_ERR_FORMAT, "line 1: no \"label\" field");
    p.num_labels = 1;
    expect_error(tok, &p, "{\"text\": \"aa\", \"label\": 1e300}\n", NOPAD_ERR_FORMAT, "not a finite");
    p.format = TRAIN_DATA_LINES;
    expect_error(tok, &p, "aa\n", NOPAD_ERR_INVALID_ARGUMENT, "classification reads JSONL");

    // an example longer than a loader's budget
    p = mlm_params(32);
    const char *text = "aa\naa ab ac ad\n";
    const char *path = test_write_temp(1, ".txt", text, strlen(text));
    assert_nopad_ok(train_dataset_load(path, tok, &p, &d));
    train_loader l;
    assert_nopad_error(train_loader_init(&d, 5, 4, 0, &l), NOPAD_ERR_INVALID_ARGUMENT,
                       "line 2 has 6 tokens, more than the batch budget of 5");
    assert_nopad_ok(train_loader_init(&d, 6, 4, 0, &l));
    assert_nopad_error(train_loader_seek(&l, 0, 3), NOPAD_ERR_INVALID_ARGUMENT, "cursor 3");
    train_loader_free(&l);
    train_dataset_free(&d);
    nopad_tokenizer_free(tok);
}

/* The loader's batches are what a training step takes: one epoch of MLM steps on the tiny BERT. */
static void test_batches_train(void **state) {
    (void)state;
    nopad_tokenizer *tok = make_tokenizer();
    const char *path = write_corpus(40, 1, 30, 5);
    train_data_params p = mlm_params(32);
    p.truncate = 1;
    train_dataset d;
    assert_nopad_ok(train_dataset_load(path, tok, &p, &d));
    nopad_backend *be = NULL;
    assert_nopad_ok(nopad_backend_cpu_create(2, &be));
    train_model m;
    assert_nopad_ok(train_model_load(be, test_data_path("train/bert_mlm"), TRAIN_TASK_MLM, &m));
    train_context ctx;
    assert_nopad_ok(train_context_init(&m, 96, 8, &ctx));
    train_loader l;
    assert_nopad_ok(train_loader_init(&d, 96, 8, 9, &l));
    int steps = 0;
    while (train_loader_next(&l)) {
        double loss = 0;
        assert_nopad_ok(train_forward_backward(&ctx, &l.batch, &loss));
        assert_true(isfinite(loss) && loss > 0);
        steps++;
    }
    assert_true(steps >= 40 * 17 / 96);
    train_loader_free(&l);
    train_context_free(&ctx);
    train_model_free(&m);
    be->destroy(be);
    train_dataset_free(&d);
    nopad_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_text),        cmocka_unit_test(test_determinism_and_batches),
        cmocka_unit_test(test_mask_proportions), cmocka_unit_test(test_whole_word_mask),
        cmocka_unit_test(test_pack_lines),
        cmocka_unit_test(test_classification),
        cmocka_unit_test(test_errors),           cmocka_unit_test(test_batches_train),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
