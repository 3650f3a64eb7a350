/* The public model object: loads a Hugging Face folder (config, weights on the chosen backend,
 * tokenizer, sentence-transformers pipeline) and describes it. Running batches is context.c's. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "model/model_internal.h"
#include "io/chat_template.h"
#include "io/gguf.h"
#include "io/gguf_config.h"
#include "io/hf_config.h"
#include "io/st_pipeline.h"
#include "io/safetensors.h"
#include "model/encoder.h"
#include "util/error.h"
#include "util/knobs.h"
#include "util/types.h"
#include "util/file.h"
#include "io/tokenizer_internal.h"

nopad_model_params nopad_model_default_params(void) {
    nopad_model_params p = {.device = NOPAD_DEVICE_CPU, .device_index = 0, .dtype = NOPAD_DTYPE_F32, .n_threads = 0,
                            .max_batch_tokens = 0, .cuda_stream = NULL,
                            .cuda_graph_max_tokens = 0, .kv_cache_tokens = 0, .kv_block_size = 0};
    return p;
}

static const char *family_name(model_family f) {
    switch (f) {
    case FAMILY_BERT: return "BERT";
    case FAMILY_ROBERTA: return "RoBERTa";
    case FAMILY_DISTILBERT: return "DistilBERT";
    case FAMILY_ALBERT: return "ALBERT";
    case FAMILY_DEBERTA_V2: return "DeBERTa-v2";
    case FAMILY_GPT2: return "GPT-2";
    case FAMILY_LLAMA: return "LLaMA";
    }
    return "?";
}

/* The default context runs on the weights' backend (its stream, one GEMM workspace). */
static nopad_status create_default_context(nopad_model *m) {
    const nopad_context_params cp = {.max_batch_tokens = m->params.max_batch_tokens,
                                     .cuda_stream = m->params.cuda_stream,
                                     .cuda_graph_max_tokens = m->params.cuda_graph_max_tokens,
                                     .kv_cache_tokens = m->params.kv_cache_tokens,
                                     .kv_block_size = m->params.kv_block_size};
    return context_create(m, &cp, m->be, &m->context);
}

/* The model's backend and, with tensor parallelism, its group and shard: once the config is
 * known, before any weight is read. A split model's rank r works on GPU r of its machine (its
 * local rank), and collectives on the backend's memory are prepared (comm_attach: every rank). */
static nopad_status create_backend(nopad_model *m) {
    nopad_status st = NOPAD_OK;
    const int32_t tp = m->params.tp_size > 1 ? m->params.tp_size : 1;
    /* NOPAD_COMM_FORCE: a model of one rank still runs its collectives (through NCCL on CUDA), to
     * test that path and measure what it costs on one GPU */
    if (tp > 1 || knob_int(KNOB_COMM_FORCE)) {
        if (tp > 1 && !m->following && nopad_world_rank() != 0)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "nopad_model_load: this is rank %d of a tensor-parallel world of %d; rank 0 "
                                   "loads the model and leads, every other rank calls nopad_tp_follow",
                                   nopad_world_rank(), tp);
        if (m->comm) /* a worker the leader started: its world came with the leader's message */
            st = NOPAD_OK;
        else if (tp > 1 && !m->following && nopad_world_size() <= 1)
            st = tp_start_workers(m->dir, &m->params, &m->comm); /* no launcher: start the other ranks */
        else
            st = comm_world(tp, &m->comm);
        if (st == NOPAD_OK && tp > 1 && m->params.device == NOPAD_DEVICE_CUDA)
            m->params.device_index = comm_local_rank(m->comm);
    }
    if (st == NOPAD_OK)
        st = tp_shard_plan(&m->cfg, m->comm, m->comm ? comm_rank(m->comm) : 0, tp, &m->tp);
    /* rank 0's choice of sequence parallelism (NOPAD_TP_SEQUENCE_PARALLEL) for every rank: ranks
     * that chose apart would meet in different collectives */
    if (st == NOPAD_OK && m->comm)
        st = comm_host_broadcast(m->comm, &m->tp.seq_min_tokens, sizeof m->tp.seq_min_tokens, 0);
    if (st == NOPAD_OK) st = context_create_backend(&m->params, m->params.cuda_stream, &m->be);
    if (st == NOPAD_OK && m->comm) st = comm_attach(m->comm, m->be);
    return st;
}

/* A decoder from one GGUF file: config, weights and tokenizer from its metadata and tensors. */
static nopad_status load_gguf_model(nopad_model *m, const char *path) {
    gguf_file f;
    nopad_status st = gguf_open(path, &f);
    if (st != NOPAD_OK) return st;
    st = gguf_model_config(&f, &m->cfg);
    if (st == NOPAD_OK) st = chat_template_from_gguf(&f, &m->chat_template);
    if (st == NOPAD_OK) st = create_backend(m);
    /* block formats stay as stored where asked for (each backend keeps the formats its kernels
     * run, nopad_backend_runs_format, and dequantises the rest with a notice), and by default on
     * the CPU in one process. CUDA's default stays dequantised to the compute dtype: its quantized
     * GEMV decodes SmolLM2 Q4_1 1.07-1.31x slower than the fp16 copy (bench/RESULTS.md QUANT), so
     * --weights native buys memory there, not speed, for now. A split model (tp > 1) runs none. */
    const nopad_weights w = m->params.weights;
    const int native = w == NOPAD_WEIGHTS_NATIVE || (w == NOPAD_WEIGHTS_AUTO && m->params.device == NOPAD_DEVICE_CPU &&
                                                     m->params.tp_size <= 1);
    if (st == NOPAD_OK)
        st = decoder_weights_load_gguf(m->be, &m->cfg, &m->tp, &f, native, w == NOPAD_WEIGHTS_FP8, &m->dec);
    gguf_close(&f);
    if (st != NOPAD_OK) return st;
    if (m->be->release_staging) m->be->release_staging(m->be);
    m->max_seq_length = m->cfg.max_position_embeddings;
    st = create_default_context(m);
    if (st != NOPAD_OK) return st;
    st = tokenizer_from_gguf_file(path, &m->tokenizer);
    if (st == NOPAD_ERR_UNSUPPORTED) {
        m->tokenizer_error = strdup(nopad_last_error());
        fprintf(stderr, "nopad: warning: %s; the model loads without a tokenizer (token ids work)\n",
                nopad_last_error());
        nopad_clear_error();
        m->tokenizer_kind = "unsupported";
        return NOPAD_OK;
    }
    m->tokenizer_kind = "gguf";
    return st;
}

/* ".gguf" at the end of `path`, in any case: the user meant a GGUF file, not a folder. */
static int has_gguf_suffix(const char *path) {
    size_t n = strlen(path);
    return n >= 5 && strcasecmp(path + n - 5, ".gguf") == 0;
}

/* The first bytes of a file that is no GGUF, for the message: printable ASCII as is, others as
 * \xNN. */
static void describe_magic(const unsigned char *magic, size_t got, char *out, size_t cap) {
    size_t k = 0;
    out[0] = '\0';
    for (size_t i = 0; i < got && k + 5 < cap; i++) {
        const int plain =
            magic[i] >= 0x20 && magic[i] < 0x7f && magic[i] != '"' && magic[i] != '\\';
        k += (size_t)snprintf(out + k, cap - k, plain ? "%c" : "\\x%02x", magic[i]);
    }
}

#define MODEL_IS "a model is a folder with config.json or a .gguf file"

static nopad_status load_model(nopad_model *m, const char *dir) {
    char path[4096];
    /* the CLI's and the Python package's words for the ways a model path is not a model: what
     * it is, and what was expected */
    const int gguf_name = has_gguf_suffix(dir);
    const char *what = gguf_name ? "GGUF file" : "model folder";
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return errno == ENOENT ? nopad_set_error(NOPAD_ERR_IO, "%s '%s' does not exist", what, dir)
                               : nopad_set_error(NOPAD_ERR_IO, "%s '%s': %s", what, dir,
                                                 strerror(errno));
    if (S_ISREG(sb.st_mode)) {
        /* a file is a model only as GGUF; say so before the GGUF reader's own words */
        unsigned char magic[4] = {0};
        FILE *f = fopen(dir, "rb");
        if (!f)
            return nopad_set_error(NOPAD_ERR_IO, "%s '%s': cannot open: %s", what, dir,
                                   strerror(errno));
        size_t got = fread(magic, 1, 4, f);
        fclose(f);
        if (got == 4 && memcmp(magic, "GGUF", 4) == 0) return load_gguf_model(m, dir);
        char seen[32];
        describe_magic(magic, got, seen, sizeof seen);
        char why[96];
        if (got < 4) snprintf(why, sizeof why, "%zu bytes, shorter than the magic \"GGUF\"", got);
        else snprintf(why, sizeof why, "magic \"%s\", expected \"GGUF\"", seen);
        if (gguf_name)
            return nopad_set_error(NOPAD_ERR_FORMAT, "'%s' is not a GGUF file (%s); " MODEL_IS,
                                   dir, why);
        return nopad_set_error(NOPAD_ERR_IO,
                               "model folder '%s' is not a folder, nor a GGUF file (%s); " MODEL_IS,
                               dir, why);
    }
    if (!S_ISDIR(sb.st_mode))
        return nopad_set_error(NOPAD_ERR_IO, "%s '%s' is not a %s; " MODEL_IS, what, dir,
                               gguf_name ? "regular file" : "folder");

    snprintf(path, sizeof path, "%s/config.json", dir);
    char *json;
    size_t len;
    nopad_status st = read_file(path, 0, &json, &len);
    if (st != NOPAD_OK) return st;
    st = hf_config_parse(json, len, path, &m->cfg);
    if (st == NOPAD_OK && !m->cfg.causal) st = hf_config_head(json, len, path, &m->cfg, &m->labels);
    free(json);
    if (st != NOPAD_OK) return st;

    st = st_pipeline_load(dir, &m->pipeline);
    if (st == NOPAD_OK && m->cfg.causal) st = chat_template_from_folder(dir, &m->chat_template);
    if (st != NOPAD_OK) return st;
    m->max_seq_length = m->cfg.max_position_embeddings - m->cfg.position_offset;
    if (m->pipeline.max_seq_length > 0 && m->pipeline.max_seq_length < m->max_seq_length)
        m->max_seq_length = m->pipeline.max_seq_length;

    st = create_backend(m);
    if (st != NOPAD_OK) return st;

    if (m->cfg.rel.enabled && !m->be->attention_rel)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: DeBERTa's relative attention has no kernel on the %s backend",
                               dir, m->be->name);

    safetensors_checkpoint ckpt;
    st = safetensors_checkpoint_open(dir, &ckpt);
    if (st != NOPAD_OK) return st;
    /* decoder_weights_load_st's fp8: quantize (weights fp8), keep F8 weights (auto, native) or
     * dequantise them (a float choice) */
    const nopad_weights wc = m->params.weights;
    const int fp8 = wc == NOPAD_WEIGHTS_FP8 ? 1 : wc == NOPAD_WEIGHTS_AUTO || wc == NOPAD_WEIGHTS_NATIVE ? 0 : -1;
    if (fp8 > 0 && !m->cfg.causal)
        st = nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: fp8 weights are for decoders; an encoder holds its weights "
                             "in the compute dtype (weights auto)", dir);
    else
        st = m->cfg.causal ? decoder_weights_load_st(m->be, &m->cfg, &m->tp, &ckpt, dir, fp8, &m->dec)
                           : encoder_weights_load(m->be, &m->cfg, &ckpt, dir, &m->weights, &m->tp);
    safetensors_checkpoint_close(&ckpt);
    if (st != NOPAD_OK) return st;
    /* the fp32 staging of the largest tensor (the word embeddings) is not needed any more */
    if (m->be->release_staging) m->be->release_staging(m->be);

    st = create_default_context(m);
    if (st != NOPAD_OK) return st;

    m->tokenizer_kind = "none";
    /* present as anything: a tokenizer file that is there but bad (a folder, a FIFO, a link loop)
     * is an error from the tokenizer loader, never a silent fallback */
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int has_json = file_exists(path);
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    int has_vocab = file_exists(path);
    if (has_json || has_vocab) {
        st = nopad_tokenizer_load(dir, &m->tokenizer);
        /* A tokenizer nopad does not implement (a model type, a normalizer, ...) leaves the model
         * usable with token ids; a broken file (NOPAD_ERR_FORMAT, IO) still fails the load. */
        if (st == NOPAD_ERR_UNSUPPORTED) {
            m->tokenizer_error = strdup(nopad_last_error());
            if (!m->tokenizer_error)
                return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_model_load: out of memory");
            fprintf(stderr,
                    "nopad: warning: %s; the model loads without a tokenizer (token ids work, text "
                    "does not)\n",
                    m->tokenizer_error);
            nopad_clear_error();
            m->tokenizer_kind = "unsupported";
            return NOPAD_OK;
        }
        if (st != NOPAD_OK) return st;
        m->tokenizer_kind = has_json ? "tokenizer.json" : "vocab.txt";
    }
    return NOPAD_OK;
}

/* The weights choice against the compute dtype: a float choice names the dtype the weights are
 * held in, which is the compute dtype's. */
static nopad_status check_weights(const nopad_model_params *p) {
    static const struct { nopad_weights w; nopad_dtype dtype; const char *name; } floats[] = {
        {NOPAD_WEIGHTS_F32, NOPAD_DTYPE_F32, "f32"},
        {NOPAD_WEIGHTS_F16, NOPAD_DTYPE_F16, "f16"},
        {NOPAD_WEIGHTS_BF16, NOPAD_DTYPE_BF16, "bf16"},
    };
    if (p->weights == NOPAD_WEIGHTS_AUTO || p->weights == NOPAD_WEIGHTS_NATIVE) return NOPAD_OK;
    /* FP8 E4M3 weights run on CUDA's FP8 kernels (Hopper: cuBLASLt's FP8 GEMM, a GEMV converting
     * E4M3 with sm_89's cvt); the loader quantizes them (docs/fp8.md) */
    if (p->weights == NOPAD_WEIGHTS_FP8) {
        if (p->device != NOPAD_DEVICE_CUDA)
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                   "nopad_model_load: weights fp8 is not supported yet on the CPU: fp8 weights run on "
                                   "CUDA (Hopper); use auto, native, f32, f16 or bf16");
        return NOPAD_OK;
    }
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++)
        if (p->weights == floats[i].w) {
            if (p->dtype != floats[i].dtype)
                return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                       "nopad_model_load: weights %s are held in the compute dtype, which is %s: "
                                       "ask for that compute dtype too (or weights auto / native)",
                                       floats[i].name, nopad_dtype_name(p->dtype));
            return NOPAD_OK;
        }
    return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                           "nopad_model_load: weights %d is not a nopad_weights value (auto, native, f32, f16, "
                           "bf16, fp8)",
                           (int)p->weights);
}

static nopad_status model_load(const char *dir, const nopad_model_params *params, int following,
                               nopad_comm *comm, nopad_model **out) {
    if (!out || !dir || !*dir) comm_free(comm);
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_model_load: out is NULL");
    *out = NULL;
    if (!dir || !*dir)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_model_load: no folder given");
    nopad_model *m = calloc(1, sizeof *m);
    if (!m) {
        comm_free(comm);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_model_load: out of memory");
    }
    pthread_mutex_init(&m->tp_lock, NULL);
    m->following = following;
    m->comm = comm;
    m->params = params ? *params : nopad_model_default_params();
    m->dir = strdup(dir);
    nopad_status st = m->dir ? check_weights(&m->params) : nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == NOPAD_OK) st = load_model(m, dir);
    if (st != NOPAD_OK) {
        nopad_model_free(m);
        return st;
    }
    m->loaded = 1; /* a split model's followers run its messages from here on */
    *out = m;
    return NOPAD_OK;
}

nopad_status nopad_model_load(const char *dir, const nopad_model_params *params, nopad_model **out) {
    return model_load(dir, params, 0, NULL, out);
}

nopad_status model_load_follower(const char *dir, const nopad_model_params *params, nopad_comm *comm,
                                 nopad_model **out) {
    return model_load(dir, params, 1, comm, out);
}

void nopad_model_free(nopad_model *m) {
    if (!m) return;
    context_destroy(m->context);
    if (m->loaded) tp_model_freed(m); /* the other ranks of a split model stop following */
    if (m->be) {
        encoder_weights_free(m->be, &m->weights);
        decoder_weights_free(m->be, &m->dec);
        m->be->destroy(m->be);
    }
    nopad_tokenizer_free(m->tokenizer);
    free(m->tokenizer_error);
    free(m->chat_template);
    hf_labels_free(m->labels, m->cfg.head.num_labels);
    comm_free(m->comm);
    pthread_mutex_destroy(&m->tp_lock);
    free(m->dir);
    free(m);
}

nopad_status nopad_model_get_stats(const nopad_model *m, nopad_model_stats *out) {
    if (!m || !out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_model_get_stats: NULL argument");
    return nopad_context_get_stats(m->context, out);
}

nopad_status nopad_model_memory(const nopad_model *m, size_t *weights_bytes,
                                size_t *workspace_bytes, size_t *backend_bytes) {
    if (!m) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_model_memory: model is NULL");
    if (weights_bytes) *weights_bytes = m->weights.bytes + m->dec.bytes;
    return nopad_context_memory(m->context, workspace_bytes, backend_bytes);
}

int32_t nopad_model_weight_groups(const nopad_model *m, nopad_weight_group *out, int32_t cap) {
    if (!m) return 0;
    if (m->cfg.causal) {
        for (int32_t i = 0; i < m->dec.n_groups && i < cap; i++) out[i] = m->dec.groups[i];
        return m->dec.n_groups;
    }
    /* encoders: one group, as the checkpoint stores it */
    if (cap > 0)
        out[0] = (nopad_weight_group){.name = "all", .format = nopad_dtype_name(m->be->dtype),
                                      .stored = m->weights.weights_dtype,
                                      .n_tensors = 0, .bytes = m->weights.bytes};
    return 1;
}

nopad_context *nopad_model_context(nopad_model *m) { return m ? m->context : NULL; }

int32_t nopad_model_num_labels(const nopad_model *m) {
    return m && m->cfg.head.present ? m->cfg.head.num_labels : 0;
}

const char *nopad_model_label(const nopad_model *m, int32_t id) {
    if (!m || !m->labels || id < 0 || id >= m->cfg.head.num_labels) return NULL;
    return m->labels[id];
}

const nopad_tokenizer *nopad_model_tokenizer(const nopad_model *m) {
    return m ? m->tokenizer : NULL;
}

const char *nopad_model_tokenizer_error(const nopad_model *m) {
    return m ? m->tokenizer_error : NULL;
}

const char *nopad_model_chat_template(const nopad_model *m) { return m ? m->chat_template : NULL; }

nopad_status nopad_model_get_info(const nopad_model *m, nopad_model_info *out) {
    if (!m || !out)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_model_get_info: NULL argument");
    const model_config *c = &m->cfg;
    memset(out, 0, sizeof *out);
    out->model_type = c->model_type;
    out->family = family_name(c->family);
    out->activation = c->activation_name;
    out->weights_dtype = c->causal ? m->dec.weights_dtype : m->weights.weights_dtype;
    out->compute_dtype = nopad_dtype_name(m->be->dtype);
    out->vocab_size = c->vocab_size;
    out->hidden_size = c->hidden_size;
    out->embedding_size = c->embedding_size;
    out->num_layers = c->num_layers;
    out->num_heads = c->num_heads;
    out->head_size = c->head_size;
    out->intermediate_size = c->intermediate_size;
    out->max_position_embeddings = c->max_position_embeddings;
    out->max_seq_length = m->max_seq_length;
    out->type_vocab_size = c->type_vocab_size;
    out->layer_norm_eps = c->layer_norm_eps;
    out->n_params = c->causal ? m->dec.n_params : m->weights.n_params;
    out->is_decoder = c->causal;
    out->num_kv_heads = c->num_kv_heads;
    out->bos_token_id = c->causal ? c->bos_token_id : -1;
    out->eos_token_id = c->causal && c->n_eos > 0 ? c->eos_token_ids[0] : -1;
    out->tp_size = m->params.tp_size > 1 ? m->params.tp_size : 1;
    out->pooling = m->pipeline.pooling;
    out->normalize = m->pipeline.normalize;
    out->has_tokenizer = m->tokenizer != NULL;
    out->tokenizer_kind = m->tokenizer_kind;
    return NOPAD_OK;
}
