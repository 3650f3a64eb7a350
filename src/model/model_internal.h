/* The public objects' insides, shared by model.c (loading, what a model is) and context.c (running
 * batches on it). */
#ifndef NOPAD_MODEL_INTERNAL_H
#define NOPAD_MODEL_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "backend/backend.h"
#include "io/model_config.h"
#include "io/st_pipeline.h"
#include "model/decoder.h"
#include "model/encoder.h"
#include "nopad.h"

/* Loaded once, read-only afterwards: config, weights, tokenizer. */
struct nopad_model {
    char *dir;
    nopad_model_params params;
    model_config cfg;
    st_pipeline pipeline;
    int32_t max_seq_length;   /* longest sequence accepted (sentence-transformers or positions) */
    nopad_backend *be;        /* the backend the weights live in; the default context runs on it */
    encoder_weights weights;  /* encoders */
    decoder_weights dec;      /* decoders (cfg.causal) */
    nopad_tokenizer *tokenizer;
    const char *tokenizer_kind;
    char *tokenizer_error;    /* why the folder's tokenizer is unsupported, or NULL */
    char *chat_template;      /* decoders: the chat template text the model ships, or NULL */
    char **labels;            /* [cfg.head.num_labels] the classifier's id2label, or NULL */
    nopad_context *context;   /* the default context */
};

/* One stream of work: its backend (stream, graph cache, GEMM plans), its workspace. */
struct nopad_context {
    nopad_model *model;
    nopad_context_params params;
    nopad_backend *be;
    int owns_backend;          /* 0 for the default context, which runs on the model's */
    encoder_workspace ws;
    decoder_state dec;         /* decoders: the KV pool and the step workspace */
    pthread_mutex_t lock;      /* one call at a time: the workspace is this context's */
    uint32_t graph_generation; /* the workspace generation the backend's graphs were recorded on */
    int64_t forwards;
};

/* Creates a context on `be` (owned: freed with the context) or, when be is NULL, on a new
 * backend of the model's device and dtype. */
nopad_status context_create(nopad_model *model, const nopad_context_params *params, nopad_backend *be,
                            nopad_context **out);

/* Frees a context, the model's default one included (nopad_context_free leaves that one alone). */
void context_destroy(nopad_context *c);

/* Creates a backend for a model's device and dtype (`p`) on `cuda_stream` (CUDA; NULL: its own):
 * the model's own, which loads the weights and serves the default context, or another context's. */
nopad_status context_create_backend(const nopad_model_params *p, void *cuda_stream, nopad_backend **out);

#endif
