#define _XOPEN_SOURCE 700 /* nftw, mkdtemp */
#include "testutil.h"

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
