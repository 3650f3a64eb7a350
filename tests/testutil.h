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
/* nopad_model_load of path (CPU) with `weights`, what the load writes to stderr captured into *err
 * (the caller frees) and still echoed to stderr, for the test's log. */
nopad_status test_load_capturing(const char *path, nopad_weights weights, nopad_model **m, char **err);
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
/* row_argmax's reference (backend.h), one row of cols floats in double: the max and its lowest
 * column (at -1: none), whether the row holds NaN or +inf (bad), the exact sum
 * z = Σ e^(x_j - max) and spread = Σ e^(x_j - max)·|x_j - max| / z (what rounding x_j - max to
 * float costs, see test_expsum_bound). z and spread are 0 for a bad row or one without a max. */
typedef struct test_argmax_ref {
    float top;
    int32_t at;
    int bad;
    double z, spread;
} test_argmax_ref;
test_argmax_ref test_reference_row_argmax(const float *x, int32_t cols);
/* A bound of |z_op - z| / z for an op's Σ_j expf(x_j - max) over cols columns (u = 2^-24; z >= 1,
 * the max's own term being 1). Each term: x_j - max is rounded to float once, so the term is
 * e^(d(1+δ)), |δ| <= u, off by |d|·u of itself (spread·u of z in all); expf is within 2 ulp (4u:
 * CUDA's documented bound, glibc's is 1). The sum: a running float32 sum of n nonnegative terms
 * (float_sum) is within (n - 1)·u (Higham, Accuracy and Stability of Numerical Algorithms, 4.2),
 * 3e-4 at 5000 columns and 9e-3 at 151936, where it drifts 2e-5 and 3e-4 in practice; a double sum
 * within n·2^-53, then one rounding to float (u). Terms that underflow lose under 2^-148 each,
 * nothing beside z >= 1; the 1% covers that and the second-order products. */
double test_expsum_bound(int32_t cols, double spread, int float_sum);
/* The bfloat16 bits of f rounded to nearest even (a NaN stays a NaN), and a bfloat16's value:
 * written here by hand, apart from the library's conversions that the tests check. */
uint16_t test_f32_to_bf16(float f);
float test_bf16_to_f32(uint16_t h);
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
