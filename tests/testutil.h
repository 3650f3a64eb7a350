/* Helpers shared by the test programs (cmocka). */
#ifndef NOPAD_TESTUTIL_H
#define NOPAD_TESTUTIL_H

#include <setjmp.h> /* cmocka needs these before cmocka.h */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "nopad.h"

/* $NOPAD_TEST_DATA/<rel> in a static buffer (tests/data in the source tree). */
const char *test_data_path(const char *rel);
/* $NOPAD_MINILM_DIR, or NULL when unset or missing. */
const char *test_minilm_dir(void);
/* Reads a whole file; returns NULL on failure. Caller frees. */
char *test_read_file(const char *path, size_t *len);
/* Writes `len` bytes to a fresh temporary file and returns its path (static buffer per call
 * index `slot` 0..7). */
const char *test_write_temp(int slot, const char *suffix, const void *data, size_t len);
/* Creates a fresh empty temporary folder and returns its path (static buffer per slot 0..7). */
const char *test_make_temp_dir(int slot);
/* max over rows of |a_r - b_r|_2 / max(|b_r|_2, 1e-6) for [rows, cols] matrices. */
double test_max_row_rel_error(const float *a, const float *b, int64_t rows, int64_t cols);
/* Fails with both lists and the first difference unless got[n] equals the JSON array `want` of
 * ids; `label` names the case (e.g. "[ids] line 12: \"text\""). */
struct cJSON;
void test_expect_ids(const char *label, const int32_t *got, int32_t n, const struct cJSON *want);
/* nopad_decode_sample against sample_token (model/sampling.h) on the logits nopad_decode gives
 * for the same steps: the B prompts (cu, ids) run `steps` steps on context c, once through each
 * call on separate sequences, each step's sampled ids fed to both, three parameter sets in turn
 * (greedy; temperature + top-k + top-p; temperature + repetition penalty + min-p), each sequence
 * with its own seed. Every id must equal the host's choice with the history the penalty reads
 * (the prompt and the ids sampled before), the log-probs within 1e-5. Returns the ids checked. */
int test_decode_sample_matches_host(nopad_context *c, int32_t vocab, int32_t B, const int32_t *cu,
                                    const int32_t *ids, int steps, const char *label);
/* The training tests' word-level vocabulary: ids 0..4 are [PAD] [UNK] [CLS] [SEP] [MASK], id 5 + k
 * the two-letter word test_word(k) ("aa", "ab", ...). A WordPiece tokenizer of it, from a
 * vocab.txt in a fresh temporary folder. */
void test_word(int k, char out[3]);
nopad_tokenizer *test_word_tokenizer(int n_words);
/* with_pieces: each word followed by its "##" continuation piece (id 5 + 2k, 6 + 2k), so that
 * longer words split into WordPiece pieces */
nopad_tokenizer *test_wordpiece_tokenizer(int n_words, int with_pieces);
/* The bytes of a hex string ("6869" -> "hi"), NUL-terminated, in *len bytes. Caller frees. */
char *test_hex_decode(const char *hex, size_t *len);
/* The texts of tests/data/tokenizer/corpus.jsonl (each line's "hex"), by line; free with
 * test_corpus_free. */
typedef struct test_corpus {
    char **text;
    size_t *len;
    int n;
} test_corpus;
test_corpus test_corpus_load(void);
void test_corpus_free(test_corpus *c);
/* Cosine similarity of two vectors of n floats, in double. */
double test_cosine(const float *a, const float *b, int64_t n);
/* Uniform floats in [lo, hi) from a fixed-seed xorshift generator. */
void test_fill_uniform(float *x, int64_t n, float lo, float hi, uint64_t *state);
uint32_t test_rand_u32(uint64_t *state);
/* One thread's work in the tests of contexts on several threads: nopad_encode(ctx, batches[i % n])
 * for i < reps · n, hidden states (no pooling) of batch k into out[k]; the first failure stops it
 * and stays in st. Pass it to pthread_create with test_encode_job_run. */
typedef struct test_encode_job {
    nopad_context *ctx;
    const nopad_batch *batches; /* [n_batches] */
    int n_batches, reps;
    float **out;                /* [n_batches], each [T_k, H] */
    nopad_status st;
} test_encode_job;
void *test_encode_job_run(void *job);

/* Asserts `status == NOPAD_OK`, printing nopad_last_error() otherwise. */
#define assert_nopad_ok(expr)                                                                      \
    do {                                                                                           \
        nopad_status st_ = (expr);                                                                 \
        if (st_ != NOPAD_OK) fail_msg("%s -> %s: %s", #expr, nopad_status_string(st_),             \
                                      nopad_last_error());                                         \
    } while (0)
/* Asserts a failure with the given status whose message contains `needle`. */
#define assert_nopad_error(expr, want_status, needle)                                              \
    do {                                                                                           \
        nopad_status st_ = (expr);                                                                 \
        if (st_ != (want_status))                                                                  \
            fail_msg("%s -> %s (want %s): %s", #expr, nopad_status_string(st_),                    \
                     nopad_status_string(want_status), nopad_last_error());                        \
        if (!strstr(nopad_last_error(), (needle)))                                                 \
            fail_msg("%s: message \"%s\" does not mention \"%s\"", #expr, nopad_last_error(),      \
                     (needle));                                                                    \
    } while (0)

#endif
