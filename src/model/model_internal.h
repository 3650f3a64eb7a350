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
#include "model/tp.h"
#include "nopad.h"
#include "parallel/comm.h"

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
    /* tensor parallelism (model/tp.c): the group, this rank's shard; rank 0 leads, the others
     * follow (nopad_tp_follow) */
    nopad_comm *comm;         /* NULL with tp 1 */
    tp_shard tp;
    int following;            /* this rank runs the leader's messages */
    int loaded;               /* the load succeeded (every rank's did, or none's: same files, same
                                 checks): the leader's messages have listeners */
    pthread_mutex_t tp_lock;  /* the leader: one message and the work it announces at a time */
    int32_t tp_contexts;      /* the leader: contexts announced so far (their ids) */
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
    int32_t tp_id;             /* its id in the tensor-parallel messages (0: the model's default) */
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

/* Runs the encoder on a checked batch in backend memory (context.c); tp_encoder_forward first
 * announces it to the other ranks. */
nopad_status context_run_encoder(nopad_context *c, const nopad_seqs *seqs, int32_t rows, const int32_t *tokens,
                                 const int32_t *types, void *hidden);

/* Loads a follower rank's shard (model.c): as nopad_model_load, marked following, on `comm` (a
 * worker's world, which the model then owns) or, when NULL, on the launcher's world. */
nopad_status model_load_follower(const char *dir, const nopad_model_params *params, nopad_comm *comm,
                                 nopad_model **out);

/* The leader's side of a split model with no launcher (tp.c): starts params->tp_size - 1 workers
 * on this machine (nopad-worker), sends them `dir` and `params`, and returns the world of them
 * and this process (rank 0). */
nopad_status tp_start_workers(const char *dir, const nopad_model_params *params, nopad_comm **out);

/* ---- tensor parallelism: the leader's side of the step messages (tp.c) -------------------------
 * Each runs the call on this rank; on the leader of a split model it first tells the other ranks
 * to run the same one. With tp 1 they are the plain calls. */
nopad_status tp_context_created(nopad_context *c);
void tp_context_freed(nopad_context *c);
void tp_model_freed(nopad_model *m);
nopad_status tp_decoder_forward(nopad_context *c, const decoder_batch *b, int want_rows);
nopad_status tp_decoder_output(nopad_context *c, const decoder_output *out);
nopad_status tp_decoder_wait(nopad_context *c, const decoder_output *out);
nopad_status tp_decoder_step(nopad_context *c, const decoder_batch *b, const decoder_output *out);
nopad_status tp_encoder_forward(nopad_context *c, const nopad_seqs *seqs, int32_t rows, const int32_t *tokens,
                                const int32_t *types, void *hidden);

#endif
