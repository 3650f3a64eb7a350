/* What the data-parallel training tests (tests/test_train_dp.c in one process, tests/mpi_train_dp.c
 * under mpirun) share: a model folder made from one of the tiny BERTs of tests/data/train, and the
 * largest difference between the parameters two runs saved. */
#ifndef NOPAD_TESTS_TRAIN_LIB_H
#define NOPAD_TESTS_TRAIN_LIB_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "train/train.h"

/* dir/name holding the bytes of the test data file `rel` (under tests/data). */
static inline void train_test_copy_data(const char *rel, const char *dir, const char *name) {
    size_t len = 0;
    char *data = test_read_file(test_data_path(rel), &len);
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
    free(data);
}

/* out (a folder made in temp slot `slot`): the tiny BERT `which` ("train/bert_mlm" or
 * "train/bert_cls": config.json and model.safetensors) with the 64-id vocabulary. */
static inline void train_test_model_folder(const char *which, int slot, char out[512]) {
    snprintf(out, 512, "%s", test_make_temp_dir(slot));
    char rel[256];
    snprintf(rel, sizeof rel, "%s/config.json", which);
    train_test_copy_data(rel, out, "config.json");
    snprintf(rel, sizeof rel, "%s/model.safetensors", which);
    train_test_copy_data(rel, out, "model.safetensors");
    train_test_copy_data("train/vocab.txt", out, "vocab.txt");
}

/* The largest |a_i - b_i| over every parameter of the models saved in folders a and b (NaN when
 * either holds one), loaded for `task` on the CPU. */
static inline double train_test_max_param_diff(const char *a, const char *b, train_task task) {
    nopad_backend *be = NULL;
    const nopad_backend_params bp = {.device = NOPAD_DEVICE_CPU, .dtype = NOPAD_DTYPE_F32, .n_threads = 1};
    assert_nopad_ok(nopad_backend_create(&bp, &be));
    train_model ma, mb;
    assert_nopad_ok(train_model_load(be, a, task, &ma));
    assert_nopad_ok(train_model_load(be, b, task, &mb));
    assert_int_equal(ma.n_params, mb.n_params);
    double worst = 0;
    for (int64_t i = 0; i < ma.n_params; i++) {
        const double d = fabs((double)ma.params[i] - (double)mb.params[i]);
        if (!(d <= worst)) worst = d; /* NaN propagates */
    }
    train_model_free(&ma);
    train_model_free(&mb);
    be->destroy(be);
    return worst;
}

#endif
