#define _XOPEN_SOURCE 700 /* nftw, mkdtemp */
#include "testutil.h"

#include "model/sampling.h"

#include <cjson/cJSON.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *test_data_path(const char *rel) {
    static char buf[4096];
    const char *root = getenv("NOPAD_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : "tests/data", rel);
    return buf;
}

nopad_status test_load_capturing(const char *path, nopad_weights weights, nopad_model **m, char **err) {
    nopad_model_params p = nopad_model_default_params();
    p.weights = weights;
    fflush(stderr);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    const int saved = dup(2);
    assert_true(saved >= 0);
    dup2(fileno(tmp), 2);
    nopad_status st = nopad_model_load(path, &p, m);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    long n = ftell(tmp);
    rewind(tmp);
    *err = calloc((size_t)n + 1, 1);
    assert_int_equal(fread(*err, 1, (size_t)n, tmp), (size_t)n);
    fclose(tmp);
    fputs(*err, stderr);
    return st;
}

const char *test_minilm_dir(void) {
    static char buf[4096];
    const char *dir = getenv("NOPAD_MINILM_DIR");
    if (!dir || !*dir) return NULL;
    snprintf(buf, sizeof buf, "%s/config.json", dir);
    struct stat st;
    if (stat(buf, &st) != 0) return NULL;
    snprintf(buf, sizeof buf, "%s", dir);
    return buf;
}

char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len) *len = (size_t)n;
    }
    return buf;
}

/* Remove one entry of the temporary tree (nftw callback, children first). */
static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static char temp_root_path[256];

static void remove_temp_root(void) {
    if (temp_root_path[0]) nftw(temp_root_path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh directory per test process, made by mkdtemp and removed at exit.
 * Why not /tmp/nopad-test-<pid>: in containers pids repeat from run to run,
 * and a directory left by an earlier run (killed, or another user's) made
 * mkdir of the test folders fail with EEXIST. */
static const char *temp_root(void) {
    if (!temp_root_path[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(temp_root_path, sizeof temp_root_path, "%s/nopad-test-XXXXXX",
                 tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(temp_root_path)) {
            fprintf(stderr, "testutil: mkdtemp(%s) failed\n", temp_root_path);
            abort();
        }
        atexit(remove_temp_root);
    }
    return temp_root_path;
}

const char *test_write_temp(int slot, const char *suffix, const void *data, size_t len) {
    static char paths[8][512];
    static int counter;
    char *p = paths[slot & 7];
    snprintf(p, sizeof paths[0], "%s/f%d%s", temp_root(), counter++, suffix ? suffix : "");
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    if (len) assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
    return p;
}

const char *test_make_temp_dir(int slot) {
    static char paths[8][512];
    static int counter;
    char *p = paths[slot & 7];
    snprintf(p, sizeof paths[0], "%s/d%d", temp_root(), counter++);
    assert_int_equal(mkdir(p, 0700), 0);
    return p;
}

double test_max_row_rel_error(const float *a, const float *b, int64_t rows, int64_t cols) {
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double diff = 0, ref = 0;
        for (int64_t c = 0; c < cols; c++) {
            double d = (double)a[r * cols + c] - (double)b[r * cols + c];
            diff += d * d;
            ref += (double)b[r * cols + c] * b[r * cols + c];
        }
        double rel = sqrt(diff) / fmax(sqrt(ref), 1e-6);
        if (isnan(rel)) return INFINITY;
        if (rel > worst) worst = rel;
    }
    return worst;
}

uint32_t test_rand_u32(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return (uint32_t)(x >> 32);
}

void test_fill_uniform(float *x, int64_t n, float lo, float hi, uint64_t *state) {
    for (int64_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)(test_rand_u32(state) >> 8) / 16777216.0f;
}

test_argmax_ref test_reference_row_argmax(const float *x, int32_t cols) {
    test_argmax_ref r = {.top = -INFINITY, .at = -1};
    for (int32_t j = 0; j < cols; j++) {
        r.bad |= isnan(x[j]) || x[j] == INFINITY;
        if (x[j] > r.top) r.top = x[j], r.at = j;
    }
    if (r.bad || r.at < 0) return r;
    double spread = 0.0;
    for (int32_t j = 0; j < cols; j++) {
        if (x[j] == -INFINITY) continue; /* adds 0 (and 0·inf to the spread) */
        const double d = (double)x[j] - r.top, t = exp(d);
        r.z += t;
        spread += t * fabs(d);
    }
    r.spread = spread / r.z;
    return r;
}

double test_expsum_bound(int32_t cols, double spread, int float_sum) {
    const double u = 0x1p-24, sum = float_sum ? (cols - 1) * u : cols * 0x1p-53 + u;
    return 1.01 * (sum + 4 * u + spread * u);
}

uint16_t test_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu)) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7FFFu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

float test_bf16_to_f32(uint16_t h) {
    const uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

double test_cosine(const float *a, const float *b, int64_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return ab / sqrt(aa * bb);
}

void *test_encode_job_run(void *arg) {
    test_encode_job *job = arg;
    nopad_encode_params none = nopad_encode_default_params();
    none.pooling = NOPAD_POOLING_NONE;
    job->st = NOPAD_OK;
    for (int i = 0; i < job->reps * job->n_batches && job->st == NOPAD_OK; i++)
        job->st = nopad_encode(job->ctx, &job->batches[i % job->n_batches], &none, job->out[i % job->n_batches], NULL);
    return NULL;
}

char *test_hex_decode(const char *hex, size_t *len) {
    const size_t n = strlen(hex) / 2;
    char *out = malloc(n + 1);
    assert_non_null(out);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
        out[i] = (char)v;
    }
    out[n] = '\0';
    *len = n;
    return out;
}

void test_expect_ids(const char *label, const int32_t *got, int32_t n, const cJSON *want) {
    const int n_want = cJSON_GetArraySize(want);
    int k = 0;
    while (k < n && k < n_want && got[k] == cJSON_GetArrayItem(want, k)->valueint) k++;
    if (k == n && k == n_want) return;
    char have[4096] = "", exp[4096] = "";
    for (int j = 0; j < n && strlen(have) < sizeof have - 16; j++)
        snprintf(have + strlen(have), sizeof have - strlen(have), "%d ", got[j]);
    for (int j = 0; j < n_want && strlen(exp) < sizeof exp - 16; j++)
        snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%d ", cJSON_GetArrayItem(want, j)->valueint);
    fail_msg("%s\n  first difference at id %d\n  expected (%d): %s\n  got      (%d): %s", label, k, n_want, exp,
             n, have);
}

test_corpus test_corpus_load(void) {
    test_corpus c = {0};
    size_t size;
    const char *path = test_data_path("tokenizer/corpus.jsonl");
    char *data = test_read_file(path, &size);
    if (!data) fail_msg("cannot read %s", path);
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        c.text = realloc(c.text, (size_t)(c.n + 1) * sizeof *c.text);
        c.len = realloc(c.len, (size_t)(c.n + 1) * sizeof *c.len);
        assert_true(c.text && c.len);
        c.text[c.n] = test_hex_decode(cJSON_GetObjectItem(j, "hex")->valuestring, &c.len[c.n]);
        c.n++;
        cJSON_Delete(j);
    }
    free(data);
    return c;
}

void test_corpus_free(test_corpus *c) {
    for (int i = 0; i < c->n; i++) free(c->text[i]);
    free(c->text);
    free(c->len);
}

int test_decode_sample_matches_host(nopad_context *c, int32_t V, int32_t B, const int32_t *cu,
                                    const int32_t *ids, int steps, const char *label) {
    nopad_sampling_params sets[3];
    for (int k = 0; k < 3; k++) sets[k] = nopad_sampling_default_params();
    sets[1].temperature = 0.7f;
    sets[1].top_k = 7;
    sets[1].top_p = 0.9f;
    sets[2].temperature = 1.2f;
    sets[2].repetition_penalty = 1.3f;
    sets[2].min_p = 0.02f;
    sampler_scratch scratch;
    sampler_scratch_init(&scratch);
    int checked = 0;
    for (int k = 0; k < 3; k++) {
        nopad_sequence **a = calloc((size_t)B, sizeof *a), **b = calloc((size_t)B, sizeof *b);
        nopad_sampling_params *p = malloc((size_t)B * sizeof *p);
        uint64_t *draws = calloc((size_t)B, sizeof *draws);
        int32_t *hist = malloc(((size_t)cu[B] + (size_t)steps * B) * sizeof *hist);
        int32_t *hcu = malloc(((size_t)B + 1) * sizeof *hcu), *got = malloc((size_t)B * sizeof *got);
        int32_t *cu1 = malloc(((size_t)B + 1) * sizeof *cu1), *next = malloc((size_t)B * sizeof *next);
        int32_t *sampled = malloc((size_t)B * steps * sizeof *sampled);
        float *logits = malloc((size_t)B * V * sizeof *logits), *lp = malloc((size_t)B * sizeof *lp);
        for (int32_t i = 0; i < B; i++) {
            assert_int_equal(nopad_sequence_create(c, &a[i]), NOPAD_OK);
            assert_int_equal(nopad_sequence_create(c, &b[i]), NOPAD_OK);
            p[i] = sets[k];
            p[i].seed = 77 + (uint64_t)i;
            cu1[i] = i;
        }
        cu1[B] = B;
        const int32_t *scu = cu, *tokens = ids;
        for (int step = 0; step < steps; step++) {
            assert_int_equal(nopad_decode(c, B, a, scu, tokens, 0, logits), NOPAD_OK);
            assert_int_equal(nopad_decode_sample(c, B, b, scu, tokens, p, draws, got, lp), NOPAD_OK);
            int32_t at = 0; /* the history: the prompt, then the ids sampled before this step */
            for (int32_t i = 0; i < B; i++) {
                hcu[i] = at;
                memcpy(hist + at, ids + cu[i], (size_t)(cu[i + 1] - cu[i]) * sizeof *hist);
                at += cu[i + 1] - cu[i];
                for (int j = 0; j < step; j++) hist[at++] = sampled[i * steps + j];
            }
            hcu[B] = at;
            for (int32_t i = 0; i < B; i++) {
                int32_t want;
                float want_lp;
                assert_int_equal(sample_token(&scratch, logits + (size_t)i * V, V, &p[i], hist + hcu[i],
                                              hcu[i + 1] - hcu[i], draws[i], &want, &want_lp),
                                 NOPAD_OK);
                if (got[i] != want)
                    fail_msg("%s set %d step %d sequence %d: nopad_decode_sample chose %d, the host %d",
                             label, k, step, i, got[i], want);
                if (!(fabsf(lp[i] - want_lp) <= 1e-5f))
                    fail_msg("%s set %d step %d sequence %d: log-prob %.7f, the host %.7f", label, k, step,
                             i, lp[i], want_lp);
                next[i] = sampled[i * steps + step] = got[i];
                draws[i]++;
                checked++;
            }
            scu = cu1;
            tokens = next;
        }
        /* invalid parameters: an error, and the sequences keep their lengths */
        const int32_t len0 = nopad_sequence_length(b[0]);
        p[B - 1].top_p = 0.0f;
        assert_int_equal(nopad_decode_sample(c, B, b, cu1, next, p, draws, got, NULL),
                         NOPAD_ERR_INVALID_ARGUMENT);
        assert_int_equal(nopad_sequence_length(b[0]), len0);
        for (int32_t i = 0; i < B; i++) {
            nopad_sequence_free(a[i]);
            nopad_sequence_free(b[i]);
        }
        free(a); free(b); free(p); free(draws); free(hist); free(hcu); free(got); free(cu1); free(next);
        free(sampled); free(logits); free(lp);
    }
    sampler_scratch_free(&scratch);
    return checked;
}

void test_word(int k, char out[3]) {
    out[0] = (char)('a' + k / 26), out[1] = (char)('a' + k % 26), out[2] = 0;
}

nopad_tokenizer *test_word_tokenizer(int n_words) { return test_wordpiece_tokenizer(n_words, 0); }

nopad_tokenizer *test_wordpiece_tokenizer(int n_words, int with_pieces) {
    const char *dir = test_make_temp_dir(0);
    char path[600];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n", f);
    for (int k = 0; k < n_words; k++) {
        char w[3];
        test_word(k, w);
        fprintf(f, with_pieces ? "%s\n##%s\n" : "%s\n", w, w);
    }
    fclose(f);
    nopad_tokenizer *tok = NULL;
    assert_nopad_ok(nopad_tokenizer_load(dir, &tok));
    return tok;
}
