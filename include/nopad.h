/* nopad — padding-free transformer inference.
 *
 * Public C API. A batch is a packed token stream: tokens[T] for all sequences back to back,
 * described by cu_seqlens[B+1] (cu_seqlens[0] = 0, cu_seqlens[B] = T). Every function returns a
 * nopad_status; on failure nopad_last_error() holds a message naming what, where and what was
 * expected. Every object has an init/free pair; free functions accept NULL.
 *
 * No CUDA types appear here: device selection is an enum, device buffers are plain pointers. */
#ifndef NOPAD_H
#define NOPAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NOPAD_VERSION_MAJOR 0
#define NOPAD_VERSION_MINOR 1
#define NOPAD_VERSION_PATCH 0

/* ---- status and errors -------------------------------------------------------------------- */

typedef enum nopad_status {
    NOPAD_OK = 0,
    NOPAD_ERR_INVALID_ARGUMENT = 1, /* a caller-supplied value is out of range or inconsistent */
    NOPAD_ERR_IO = 2,               /* a file or folder is missing or unreadable */
    NOPAD_ERR_FORMAT = 3,           /* a file is malformed (safetensors, JSON, vocab, ...) */
    NOPAD_ERR_UNSUPPORTED = 4,      /* well-formed but not supported (model_type, dtype, ...) */
    NOPAD_ERR_OUT_OF_MEMORY = 5,
    NOPAD_ERR_BUFFER_TOO_SMALL = 6, /* output capacity too small; the needed size is reported */
    NOPAD_ERR_TOO_LONG = 7,         /* a sequence exceeds the model maximum and truncation is off */
    NOPAD_ERR_BACKEND = 8,          /* the compute backend failed (e.g. a CUDA error) */
    NOPAD_ERR_INTERNAL = 9,
    NOPAD_ERR_QUEUE_FULL = 10,      /* an engine's queue of waiting requests is full; retry later */
} nopad_status;

/* Short name of a status code ("invalid argument", ...). Never NULL. */
const char *nopad_status_string(nopad_status status);
/* Message describing the last failure on the calling thread ("" if none). Thread-local, valid
 * until the next nopad call on this thread. */
const char *nopad_last_error(void);
/* "MAJOR.MINOR.PATCH" */
const char *nopad_version(void);
/* The source this library was built from: `git describe --always --dirty` of its checkout at
 * build time (e.g. "05498cb", "05498cb-dirty"), or "unknown" outside a git checkout. Benchmark
 * records take it from the library they ran. */
const char *nopad_build_id(void);
/* The kernel family OpenBLAS picked for this CPU ("Haswell", "SkylakeX", ...). OpenBLAS falls back
 * to "Prescott" (SSE3, about half the speed) on CPUs it does not recognise, e.g. some virtual
 * machines; OPENBLAS_CORETYPE set before the program starts overrides the choice. */
const char *nopad_cpu_blas_kernels(void);

/* ---- enums -------------------------------------------------------------------------------- */

typedef enum nopad_device { NOPAD_DEVICE_CPU = 0, NOPAD_DEVICE_CUDA = 1 } nopad_device;

typedef enum nopad_dtype { NOPAD_DTYPE_F32 = 0, NOPAD_DTYPE_F16 = 1, NOPAD_DTYPE_BF16 = 2 } nopad_dtype;

typedef enum nopad_pooling {
    NOPAD_POOLING_MODEL = -1, /* use the folder's sentence-transformers config, else CLS */
    NOPAD_POOLING_NONE = 0,   /* no pooled output */
    NOPAD_POOLING_CLS = 1,    /* first token of each sequence */
    NOPAD_POOLING_MEAN = 2,   /* mean over each sequence's tokens */
    NOPAD_POOLING_MAX = 3,    /* element-wise max over each sequence's tokens */
} nopad_pooling;

/* ---- tokenizer ---------------------------------------------------------------------------- */

typedef struct nopad_tokenizer nopad_tokenizer;

/* Loads tokenizer.json from the folder `dir`, else vocab.txt (+ tokenizer_config.json for
 * do_lower_case); given a GGUF file instead, the tokenizer its metadata describes. */
nopad_status nopad_tokenizer_load(const char *dir, nopad_tokenizer **out);
void nopad_tokenizer_free(nopad_tokenizer *tok);

typedef struct nopad_tokenize_params {
    int add_special_tokens; /* 1: wrap in the template ([CLS] ... [SEP]); default 1 */
    int truncate;           /* 1: cut to max_length (keeping the closing special token); default 0 */
    int32_t max_length;     /* total ids allowed incl. special tokens; <= 0 means no limit */
} nopad_tokenize_params;
nopad_tokenize_params nopad_tokenize_default_params(void);

/* Tokenizes UTF-8 `text` of `len` bytes into ids[capacity]. *n_ids receives the number of ids.
 * Invalid UTF-8 -> NOPAD_ERR_INVALID_ARGUMENT. More ids than max_length with truncate == 0 ->
 * NOPAD_ERR_TOO_LONG with *n_ids = the untruncated length. More ids than capacity ->
 * NOPAD_ERR_BUFFER_TOO_SMALL with *n_ids = needed. */
nopad_status nopad_tokenize(const nopad_tokenizer *tok, const char *text, size_t len,
                            const nopad_tokenize_params *params, int32_t *ids, int32_t capacity,
                            int32_t *n_ids);
/* Two texts as one sequence in the tokenizer's pair template, as HF tokenizers' encode(a, b):
 * [CLS] a [SEP] b [SEP] (BERT, DeBERTa), <s> a </s></s> b </s> (RoBERTa, XLM-R), with the
 * template's token type ids into types[capacity] (may be NULL): a cross-encoder's query and
 * document, an NLI premise and hypothesis. Truncation to max_length cuts the longer text first
 * (HF's longest_first); the rest as nopad_tokenize. */
nopad_status nopad_tokenize_pair(const nopad_tokenizer *tok, const char *a, size_t a_len,
                                 const char *b, size_t b_len, const nopad_tokenize_params *params,
                                 int32_t *ids, int32_t *types, int32_t capacity, int32_t *n_ids);
int32_t nopad_tokenizer_vocab_size(const nopad_tokenizer *tok);
/* Id of a token string such as "[CLS]", or -1 when absent. */
int32_t nopad_tokenizer_token_to_id(const nopad_tokenizer *tok, const char *token);
/* The token string of an id as Hugging Face's id_to_token gives it: as the vocabulary spells it
 * ("Ġhello", "##ing", "▁the", "<0x0A>", "[CLS]"; an added token with normalized set in its
 * normalized form). NUL-terminated and owned by the tokenizer; *len (may be NULL) receives its
 * length in bytes. NULL for an id outside [0, vocab_size) or one without a token. */
const char *nopad_tokenizer_id_to_token(const nopad_tokenizer *tok, int32_t id, size_t *len);

/* What a tokenizer is, by its model and pre-tokenizer. */
typedef enum nopad_tokenizer_kind {
    NOPAD_TOKENIZER_WORDPIECE = 0,         /* "wordpiece": BERT-family */
    NOPAD_TOKENIZER_BPE_BYTE_LEVEL = 1,    /* "bpe-byte-level": GPT-2, RoBERTa, LLaMA-3, Qwen2 */
    NOPAD_TOKENIZER_BPE_SENTENCEPIECE = 2, /* "bpe-sentencepiece": "▁" for spaces, <0xNN> byte
                                              fallback (LLaMA-2, Mistral) */
    NOPAD_TOKENIZER_UNIGRAM = 3,           /* "unigram": XLM-RoBERTa, ALBERT, DeBERTa-v3 */
    NOPAD_TOKENIZER_BPE = 4,               /* "bpe": any other BPE */
} nopad_tokenizer_kind;
nopad_tokenizer_kind nopad_tokenizer_get_kind(const nopad_tokenizer *tok);
/* The kind's stable name ("wordpiece", "bpe-byte-level", ...; see above). Never NULL. */
const char *nopad_tokenizer_kind_name(nopad_tokenizer_kind kind);

/* The raw bytes an id adds to a text, whole UTF-8 characters or not (OpenAI's logprobs "bytes"):
 * a byte-level BPE token mapped back through GPT-2's bytes_to_unicode; a SentencePiece BPE token
 * with "▁" as a space and <0xNN> as the byte NN. A special token (one decode drops with
 * skip_special_tokens) and an added token that is not a byte-level spelling add nothing (0
 * bytes). out[capacity] receives them and *len their number; NOPAD_ERR_BUFFER_TOO_SMALL (with
 * *len) when capacity < *len, except for out NULL and capacity 0 (a measure: NOPAD_OK). Other kinds (WordPiece, Unigram, plain BPE, whose spacing depends on
 * the neighbours): NOPAD_ERR_UNSUPPORTED; an id outside the vocabulary: NOPAD_ERR_INVALID_ARGUMENT. */
nopad_status nopad_tokenizer_token_bytes(const nopad_tokenizer *tok, int32_t id, uint8_t *out, size_t capacity,
                                         size_t *len);

/* Ids back to text, exactly as Hugging Face tokenizers' decode: each id's token (added tokens
 * first), then the tokenizer.json "decoder" (ByteLevel, Metaspace, ByteFallback, Fuse, Strip,
 * Replace, WordPiece, BPEDecoder, CTC, Sequence; none: tokens joined by " "). Bytes that are not
 * valid UTF-8 become U+FFFD, so the text is always valid UTF-8. skip_special_tokens = 1 drops the
 * added tokens marked special ([CLS], <s>, ...).
 * *text_len receives the text's length in bytes (without the NUL). text[capacity] receives the
 * text and a NUL when capacity > *text_len; else NOPAD_ERR_BUFFER_TOO_SMALL (capacity 0 and text
 * NULL measure). An id < 0 or >= nopad_tokenizer_vocab_size -> NOPAD_ERR_INVALID_ARGUMENT naming
 * it; an id inside that range without a token is dropped, as HF drops it. A decoder type nopad
 * lacks -> NOPAD_ERR_UNSUPPORTED naming it (the tokenizer still encodes). */
nopad_status nopad_detokenize(const nopad_tokenizer *tok, const int32_t *ids, size_t n_ids,
                              int skip_special_tokens, char *text, size_t capacity,
                              size_t *text_len);

/* Decoding one id at a time, as ids come from a generator: each step returns the text that id
 * completes, spaced exactly as the whole decode spaces it (HF's DecodeStream). Text that a later
 * id may still change is held back: the bytes of an unfinished UTF-8 character (a byte-level
 * token holding part of an emoji) and a run of <0xNN> byte-fallback tokens, until the id that
 * settles them (bytes that can no longer form a character come out as U+FFFD). Every chunk is
 * valid UTF-8; the chunks plus the flush's equal nopad_detokenize of all the ids. One stream
 * serves one sequence on one thread; the tokenizer must outlive it. */
typedef struct nopad_decode_stream nopad_decode_stream;
nopad_status nopad_decode_stream_create(const nopad_tokenizer *tok, int skip_special_tokens,
                                        nopad_decode_stream **out);
/* Adds one id. *text and *len receive the new text (often "" while a character is unfinished),
 * NUL-terminated, owned by the stream and valid until its next call. A bad id is refused as by
 * nopad_detokenize and leaves the stream as it was. */
nopad_status nopad_decode_stream_step(nopad_decode_stream *stream, int32_t id, const char **text,
                                      size_t *len);
/* Ends the sequence: returns the text held back (U+FFFD for an unfinished character), and the
 * stream starts afresh for the next sequence. */
nopad_status nopad_decode_stream_flush(nopad_decode_stream *stream, const char **text,
                                       size_t *len);
void nopad_decode_stream_free(nopad_decode_stream *stream);

/* ---- model -------------------------------------------------------------------------------- */

typedef struct nopad_model nopad_model;

/* How a model holds its weights (nopad_model_params.weights). GGUF files store block-quantized
 * formats (Q4_1, Q4_K, ...); a backend runs some of them as stored (docs/decoder.md). */
typedef enum nopad_weights {
    NOPAD_WEIGHTS_AUTO = 0, /* NATIVE for a GGUF file on the CPU; elsewhere the compute dtype */
    NOPAD_WEIGHTS_NATIVE,   /* as stored: block formats the backend runs stay quantized (the CPU
                               and CUDA run Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K; the
                               rest is dequantised, with a one-line notice on stderr) */
    NOPAD_WEIGHTS_F32,      /* dequantised to the compute dtype, which must be this one */
    NOPAD_WEIGHTS_F16,
    NOPAD_WEIGHTS_BF16,
    NOPAD_WEIGHTS_FP8,      /* CUDA (Hopper): float weights quantized at load to FP8 E4M3 with a
                               float32 scale per output row (docs/fp8.md); an F8_E4M3 safetensors
                               checkpoint stays FP8 under AUTO there. The CPU refuses it
                               (NOPAD_ERR_UNSUPPORTED) and dequantises an F8 checkpoint */
} nopad_weights;

typedef struct nopad_model_params {
    nopad_device device;      /* default NOPAD_DEVICE_CPU */
    int32_t device_index;     /* CUDA: the device ordinal (as cudaSetDevice counts); default 0 */
    nopad_dtype dtype;        /* compute dtype: F32 on the CPU; F16 or BF16 on CUDA. default F32 */
    int n_threads;            /* CPU threads; <= 0: OpenMP's default */
    /* The model's default context (nopad_model_context), which the one-call entry points run on,
     * is created at load with these five; see nopad_context_params for their meaning. */
    int32_t max_batch_tokens;
    void *cuda_stream;
    int32_t cuda_graph_max_tokens;
    int32_t kv_cache_tokens;
    int32_t kv_block_size;
    /* Tensor parallelism: the model is split over tp_size ranks (<= 1: one process, the default),
     * each of which holds only its shard (docs/parallel.md). Two ways to start them:
     * - no launcher: nopad_model_load starts tp_size - 1 worker processes on this machine itself
     *   (the nopad-worker program beside libnopad.so, or $NOPAD_TP_WORKER; one GPU each on CUDA)
     *   and leads them; nopad_model_free ends them. Nothing else changes for the caller.
     * - under a launcher (mpirun / srun, whose world must have tp_size ranks; on one machine or
     *   several): rank 0 calls nopad_model_load and uses the model as with one process; every
     *   other rank calls nopad_tp_follow, which runs the steps rank 0 sends.
     * A build without MPI (CPU) or NCCL (CUDA) refuses tp_size > 1. */
    int32_t tp_size;
    nopad_weights weights;    /* default NOPAD_WEIGHTS_AUTO */
} nopad_model_params;
nopad_model_params nopad_model_default_params(void);

/* Loads a Hugging Face model folder (config.json + model.safetensors or a sharded index, an
 * optional tokenizer and optional sentence-transformers files), or a decoder from a GGUF file
 * (its config, weights — dequantised — and tokenizer all from the file). Encoders: bert,
 * roberta, xlm-roberta, distilbert, albert, deberta-v2 (v2 and v3; the CPU only for now), with
 * their *ForSequenceClassification head when the folder has one (nopad_classify); decoders: gpt2,
 * llama, mistral, qwen2 (see nopad_model_info.is_decoder and the generation API below).
 *
 * Threads: a loaded model may be used from several threads at once. Its weights, config and
 * tokenizer are read-only. Calls that run the model go through a context: the one-call entry
 * points (nopad_encode_packed) share the model's default context, so concurrent calls on them
 * are safe but run one after another (a lock). For work in parallel, give each thread its own
 * context (nopad_context_create); calls on different contexts run at the same time. Free the
 * contexts, then the model, when no call is running. */
nopad_status nopad_model_load(const char *dir, const nopad_model_params *params, nopad_model **out);
void nopad_model_free(nopad_model *model);

/* ---- tensor parallelism across processes (docs/parallel.md) ------------------------------- */

/* This process's rank in its launcher's world (Open MPI, MPICH / PMI or Slurm environment
 * variables; 0 without a launcher) and the world's size (1 without one). Neither starts MPI. */
int32_t nopad_world_rank(void);
int32_t nopad_world_size(void);
/* On a rank other than 0 of a tensor-parallel world: loads this rank's shard of the model at
 * `dir` with `params` (the same as rank 0's, tp_size included) and runs the steps rank 0 sends,
 * until rank 0 frees its model (NOPAD_OK) or fails (an error naming rank 0's failure). Returns
 * NOPAD_ERR_INVALID_ARGUMENT on rank 0 or with tp_size <= 1. */
nopad_status nopad_tp_follow(const char *dir, const nopad_model_params *params);
/* The body of a worker that a leader started (nopad-worker calls it; so may a program of your own
 * given as $NOPAD_TP_WORKER): receives the model and its parameters from the leader, loads this
 * rank's shard and runs the leader's steps until the leader frees its model (NOPAD_OK).
 * NOPAD_ERR_INVALID_ARGUMENT in a process that no leader started. */
nopad_status nopad_tp_worker(void);

/* ---- contexts ----------------------------------------------------------------------------- */

/* A context is one stream of work on a loaded model: the activation workspace, the device stream,
 * the recorded CUDA graphs (and later KV memory and training state). The model's weights are
 * shared, read-only, by all of its contexts; contexts run at the same time from different
 * threads, and each runs one call at a time (calls on one context are serialised). A model holds
 * one default context for the one-call entry points (nopad_encode_packed, nopad_model_context). */
typedef struct nopad_context nopad_context;

typedef struct nopad_context_params {
    int32_t max_batch_tokens; /* workspace size in tokens, allocated at creation; larger batches
                                 are refused. <= 0: grow on demand */
    void *cuda_stream;        /* CUDA: a cudaStream_t to run on (owned by the caller); NULL: the
                                 context creates its own */
    int32_t cuda_graph_max_tokens; /* CUDA: batches of at most this many tokens replay the layers
                                 as a CUDA graph recorded per token-count bucket (the second time
                                 a bucket is seen), so small batches are not bound by kernel
                                 launches. Buckets round T up by at most 1/16 (16 rows below 256
                                 tokens); the extra rows are computed and discarded. Up to 48
                                 graphs are kept; dropping the least recently used one waits for
                                 the stream. 0: default (2048); < 0: never */
    int32_t kv_cache_tokens;  /* decoders: the paged KV pool, in tokens over all sequences,
                                 allocated at creation; <= 0: 8192 */
    int32_t kv_block_size;    /* decoders: tokens per KV block; <= 0: 16 */
} nopad_context_params;
nopad_context_params nopad_context_default_params(void);

/* A new context on `model` (on its device and dtype). The model must outlive it. */
nopad_status nopad_context_create(nopad_model *model, const nopad_context_params *params,
                                  nopad_context **out);
/* Frees a context made by nopad_context_create (the model's default context is freed with the
 * model: nopad_context_free ignores it). */
void nopad_context_free(nopad_context *ctx);
/* The model's default context, owned by the model (NULL for NULL). */
nopad_context *nopad_model_context(nopad_model *model);

typedef struct nopad_model_info {
    const char *model_type;   /* config.json model_type: "bert", "roberta", ... */
    const char *family;       /* "BERT", "RoBERTa", "DistilBERT", "ALBERT", "DeBERTa-v2" */
    const char *activation;   /* "gelu", "gelu_new", "relu" */
    const char *weights_dtype;/* dtype of the tensors in the file: "F32", "F16", "BF16", "F8_E4M3" (or "mixed") */
    const char *compute_dtype;/* "F32", "F16", "BF16" */
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t embedding_size;   /* != hidden_size for ALBERT's factorised embeddings */
    int32_t num_layers;
    int32_t num_heads;
    int32_t head_size;
    int32_t intermediate_size;
    int32_t max_position_embeddings;
    int32_t max_seq_length;   /* longest sequence accepted (sentence-transformers or positions) */
    int32_t type_vocab_size;  /* 0 when the family has no token types */
    float layer_norm_eps;
    int64_t n_params;
    nopad_pooling pooling;    /* default pooling of the folder (CLS when not configured) */
    int normalize;            /* 1 if the folder's pipeline L2-normalises */
    int has_tokenizer;
    const char *tokenizer_kind; /* "tokenizer.json", "vocab.txt", "none", or "unsupported" (see
                                   nopad_model_tokenizer_error) */
    int is_decoder;           /* 1: a decoder (generation API); 0: an encoder (nopad_encode) */
    int32_t num_kv_heads;     /* decoders: key/value heads (grouped-query attention) */
    int32_t bos_token_id;     /* decoders: -1 when none */
    int32_t eos_token_id;     /* decoders: the first end-of-sequence id, -1 when none */
    int32_t tp_size;          /* ranks the model is split over (1: not split) */
} nopad_model_info;
nopad_status nopad_model_get_info(const nopad_model *model, nopad_model_info *out);

/* Memory the model holds on its device (host memory for the CPU backend): the weights in the
 * compute dtype, and its default context's activation workspace at its current size (it grows to
 * the largest batch seen, or is fixed by max_batch_tokens) and backend buffers (GEMM workspace,
 * staging). Other contexts report theirs with nopad_context_memory. */
nopad_status nopad_model_memory(const nopad_model *model, size_t *weights_bytes,
                                size_t *workspace_bytes, size_t *backend_bytes);

/* A group of the model's weight tensors as held in memory (a decoder's token_embd, attn_qkv,
 * attn_output, ffn_gate_up, ffn_down, output, and norms_biases for the rest; an encoder's weights
 * in one group, "all"), per format held and format stored: a group whose layers differ in format
 * is listed once per pair. */
typedef struct nopad_weight_group {
    const char *name;   /* "attn_qkv", ... */
    const char *format; /* as held: "Q4_1", "Q6_K", ... (kept as stored) or "F32", "F16", "BF16" */
    const char *stored; /* as in the file: "Q4_1", "Q5_0", "BF16", ... */
    int32_t n_tensors;  /* the file's tensors in the group with this format (Q, K and V count
                           one each); 0 for an encoder's one group, "all" */
    size_t bytes;       /* in memory */
} nopad_weight_group;
/* The model's weight groups: the count, and the first min(count, cap) of them into out (NULL
 * with cap 0: the count only). Strings live as long as the model. */
int32_t nopad_model_weight_groups(const nopad_model *model, nopad_weight_group *out, int32_t cap);

/* The same for one context: its workspace and its backend's own buffers. */
nopad_status nopad_context_memory(const nopad_context *ctx, size_t *workspace_bytes,
                                  size_t *backend_bytes);

/* Counters since creation, for monitoring: forwards run, and of those how many replayed a
 * recorded CUDA graph (cuda_graph_max_tokens); graphs_held is how many the context keeps now.
 * nopad_model_get_stats reports the model's default context. */
typedef struct nopad_model_stats {
    int64_t forwards;
    int64_t graph_replays;
    int64_t graphs_recorded;
    int32_t graphs_held;
} nopad_model_stats;
nopad_status nopad_model_get_stats(const nopad_model *model, nopad_model_stats *out);
nopad_status nopad_context_get_stats(const nopad_context *ctx, nopad_model_stats *out);

/* The tokenizer loaded with the model, or NULL when its folder has none or one nopad does not
 * support. Owned by the model. */
const nopad_tokenizer *nopad_model_tokenizer(const nopad_model *model);
/* Why the folder's tokenizer did not load, when it is there but uses something nopad does not
 * implement (the message of NOPAD_ERR_UNSUPPORTED, naming it; the model then loads without a
 * tokenizer, prints it as a warning on stderr, and works on token ids). NULL otherwise. Owned by
 * the model. A malformed tokenizer file fails nopad_model_load instead. */
const char *nopad_model_tokenizer_error(const nopad_model *model);
/* The chat template a decoder ships, as Jinja text: a GGUF file's tokenizer.chat_template, or a
 * folder's chat_template.jinja, else tokenizer_config.json's "chat_template" (its "default" entry
 * when it is a list). NULL when there is none (and for encoders). Owned by the model. nopad does
 * not run Jinja; front ends (nopad serve) recognise the template's family from its text. */
const char *nopad_model_chat_template(const nopad_model *model);

typedef struct nopad_encode_params {
    nopad_pooling pooling; /* default NOPAD_POOLING_MODEL */
    int normalize;         /* -1: the folder's default; 0: off; 1: L2-normalise pooled rows */
    int32_t batch_tokens;  /* host batches: run them in forwards of at most this many tokens,
                              sequences in order (a longer sequence runs alone), so a large input
                              needs a workspace of one such forward only; <= 0: one forward.
                              Device batches ignore it. default 0 */
} nopad_encode_params;
nopad_encode_params nopad_encode_default_params(void);

/* Where a batch lives and how it is laid out. */
typedef enum nopad_layout {
    NOPAD_LAYOUT_PACKED = 0, /* tokens[T] back to back, sequences given by cu_seqlens[B+1] */
    NOPAD_LAYOUT_PADDED = 1, /* tokens[B, max_len] row-major, right-padded, lengths[B] real tokens */
} nopad_layout;

/* A batch of token ids for nopad_encode: one description for every layout and memory.
 *   on_device = 0: host int32 arrays in, host float32 outputs.
 *   on_device = 1 (contexts on cuda): every pointer is GPU memory owned by the caller (e.g. torch
 *     tensors), used in place without copies; outputs are in the model's compute dtype; the work
 *     is enqueued on the context's stream and the call returns without waiting. Nothing is read
 *     back from the GPU, so n_tokens and max_seqlen must be given, and ids or lengths the host
 *     cannot check yield NaN rows in the output instead of an error (never an out-of-bounds
 *     access).
 * Padded input is packed inside (on the GPU when on_device) and only real tokens are computed. */
typedef struct nopad_batch {
    nopad_layout layout;
    int on_device;
    int32_t n_seqs;                 /* B >= 1 */
    const int32_t *tokens;          /* packed: [T]; padded: [B, max_len] */
    const int32_t *token_type_ids;  /* the shape of tokens, or NULL (all zero) */
    const int32_t *cu_seqlens;      /* packed: [B+1], cu_seqlens[0] = 0, each length >= 1 */
    const int32_t *lengths;         /* padded: [B], each in [1, max_len] */
    int32_t max_len;                /* padded: the row stride of tokens */
    int32_t n_tokens;               /* on_device: T, the sum of the lengths; host: ignored */
    int32_t max_seqlen;             /* on_device: >= the longest sequence (sizes the attention
                                       launch); host: ignored */
} nopad_batch;

/* Runs the encoder on a batch.
 *   hidden_out  packed: [T, H]; padded: [B, max_len, H] with zeros past each length; or NULL
 *   pooled_out  [B, H] pooled (and maybe normalised) embeddings, or NULL
 * float32 host buffers, or (on_device) device buffers of the compute dtype. */
nopad_status nopad_encode(nopad_context *ctx, const nopad_batch *batch,
                          const nopad_encode_params *params, void *hidden_out, void *pooled_out);

/* The one-call path for the common case: a host packed batch on the model's default context
 * (nopad_encode with layout PACKED, on_device 0). token_type_ids may be NULL. */
nopad_status nopad_encode_packed(nopad_model *model, int32_t n_seqs, const int32_t *cu_seqlens,
                                 const int32_t *tokens, const int32_t *token_type_ids,
                                 const nopad_encode_params *params, float *hidden_out,
                                 float *pooled_out);

/* ---- classification and reranking (encoders with a *ForSequenceClassification head) ------- */

/* The number of labels of the model's sequence-classification head (config.json's id2label), or
 * 0 when the folder has none (architectures[0] is not a *ForSequenceClassification). */
int32_t nopad_model_num_labels(const nopad_model *model);
/* Label `id`'s name from id2label ("positive", "LABEL_0", ...), or NULL outside
 * [0, nopad_model_num_labels). Owned by the model. */
const char *nopad_model_label(const nopad_model *model, int32_t id);

/* Runs the encoder and its head (BertForSequenceClassification's pooler + classifier,
 * RoBERTa's / XLM-R's classifier.dense + out_proj, DeBERTa's ContextPooler + classifier, each on
 * the sequence's first token): logits[B, num_labels] float32 on the host, raw (no softmax or
 * sigmoid). A cross-encoder reranker is a one-label head on a (query, document) pair, tokenized
 * with nopad_tokenize_pair. A host batch, packed or padded, in forwards of at most batch_tokens
 * tokens (<= 0: one). NOPAD_ERR_INVALID_ARGUMENT for a model without a head. */
nopad_status nopad_classify(nopad_context *ctx, const nopad_batch *batch, int32_t batch_tokens,
                            float *logits);
/* The same for a host packed batch on the model's default context. */
nopad_status nopad_classify_packed(nopad_model *model, int32_t n_seqs, const int32_t *cu_seqlens,
                                   const int32_t *tokens, const int32_t *token_type_ids,
                                   float *logits);

/* ---- ops on their own ---------------------------------------------------------------------- */

/* Bytes of the optional workspace of nopad_attention_varlen. */
#define NOPAD_ATTENTION_WORKSPACE_BYTES 16

/* Variable-length multi-head attention on a packed QKV tensor: the encoder's fused attention op,
 * callable on its own (benchmarks, other frameworks). Every sequence attends only to its own
 * tokens (causal: to itself and earlier ones). Nothing is padded.
 *   qkv [T, 3, n_heads, head_size]  Q | K | V blocks per token, as the fused QKV projection writes
 *   out [T, n_heads * head_size]
 *   cu_seqlens [n_seqs + 1]         int32 prefix sums, cu_seqlens[0] = 0
 *   n_tokens                        T = cu_seqlens[n_seqs], the rows of qkv and out (given so
 *                                   nothing is read back; the kernel choice uses it)
 *   max_seqlen                      longest sequence (sizes the launch; no host sync is needed)
 *   workspace                       CUDA only, optional (NULL): NOPAD_ATTENTION_WORKSPACE_BYTES of
 *                                   device memory, 8-byte aligned, zero-filled before its first
 *                                   use. The persistent kernels hand out work through a counter
 *                                   in it and leave it zero when they finish. Calls that may run
 *                                   at the same time (other streams) need workspaces of their
 *                                   own; a call that shares one with an unfinished call computes
 *                                   wrong results. Without it those kernels are not used (slower
 *                                   on some shapes, never wrong). Ignored on the CPU.
 * device CPU: host pointers, dtype F32. device CUDA: device pointers (cu_seqlens too), dtype F16 or
 * BF16, enqueued on `stream` (a cudaStream_t, NULL = the default stream), asynchronous. */
nopad_status nopad_attention_varlen(nopad_device device, nopad_dtype dtype, void *out,
                                    const void *qkv, const int32_t *cu_seqlens, int32_t n_seqs,
                                    int32_t n_tokens, int32_t max_seqlen, int32_t n_heads, int32_t head_size,
                                    float scale, int causal, void *workspace, void *stream);

/* ---- generation: sampling ------------------------------------------------------------------ */

/* One entry of OpenAI's logit_bias: `bias` in [-100, 100] added to id's logit. */
typedef struct nopad_logit_bias {
    int32_t id;
    float bias;
} nopad_logit_bias;

/* How the next token is chosen from a sequence's logits: a constraint's mask (refused ids -inf),
 * logit_bias, then in Hugging Face's order the repetition penalty, vLLM's frequency and presence
 * penalties, temperature, top-k, top-p, min-p, then a draw (or the argmax when temperature is 0).
 * The draw is a function of (seed, the token's index in the sequence's output) only, so a request
 * gives the same tokens alone or batched with others. The fields from presence_penalty on are
 * off when zero, so a zero-initialised tail keeps the sampling of the fields before it. */
typedef struct nopad_sampling_params {
    float temperature;        /* 0: greedy (the argmax, lowest id on ties); > 0: logits / t */
    int32_t top_k;            /* keep the k most likely ids; 0: all */
    float top_p;              /* keep the smallest set whose probability reaches p; 1: all */
    float min_p;              /* drop ids below min_p x the top probability; 0: none */
    float repetition_penalty; /* ids already in the prompt or output: logit / p when positive,
                                 logit * p when negative (HF's CTRL rule); 1: none */
    uint64_t seed;            /* the request's random stream */
    /* OpenAI's penalties over the ids GENERATED so far (not the prompt), c(t) times id t:
     * logit[t] = (logit[t] - frequency_penalty · c(t)) - presence_penalty · [c(t) > 0], each in
     * float32, after the repetition penalty. Both in [-2, 2]; 0: off */
    float presence_penalty;
    float frequency_penalty;
    /* [n_logit_bias] (id, bias) pairs added to the logits first (after a constraint's mask), each
     * id at most once, ids in the vocabulary, bias in [-100, 100], n_logit_bias <=
     * NOPAD_MAX_LOGIT_BIAS; NULL / 0: none. Read during the call that takes the params
     * (nopad_engine_submit copies them) */
    const nopad_logit_bias *logit_bias;
    int32_t n_logit_bias;
} nopad_sampling_params;
#define NOPAD_MAX_LOGIT_BIAS 1024 /* logit_bias entries a request may carry */
#define NOPAD_MAX_TOP_LOGPROBS 20 /* most likely alternatives a request may ask for per token */
nopad_sampling_params nopad_sampling_default_params(void); /* greedy, everything off */

/* ---- generation: sequences and steps (decoder models) ------------------------------------- */

/* A sequence's place in a context's paged KV pool: its history, block by block. Blocks come from
 * the pool as the sequence grows and go back when it is freed (nothing is copied). Use a sequence
 * only with the context that made it, one call at a time, and free it before that context. */
typedef struct nopad_sequence nopad_sequence;
nopad_status nopad_sequence_create(nopad_context *ctx, nopad_sequence **out);
void nopad_sequence_free(nopad_sequence *seq);
/* Tokens in the sequence's history (positions filled so far). */
int32_t nopad_sequence_length(const nopad_sequence *seq);

/* One forward step over new tokens of n_seqs sequences, packed: sequence i brings
 * tokens[cu_tokens[i] .. cu_tokens[i+1]) (a prompt, a chunk of one, or one generated token),
 * appended to its history. logits (host, float32): [n_seqs, vocab] for each sequence's last new
 * token, or [n_tokens, vocab] with all_logits. A sequence may appear once per step. Errors
 * (nothing changes): an id outside the vocabulary, a sequence beyond the model's context, the KV
 * pool exhausted (NOPAD_ERR_OUT_OF_MEMORY naming blocks needed and free), more tokens than the
 * context's workspace. */
nopad_status nopad_decode(nopad_context *ctx, int32_t n_seqs, nopad_sequence *const *seqs,
                          const int32_t *cu_tokens, const int32_t *tokens, int all_logits,
                          float *logits);

/* nopad_decode, then each sequence's next id chosen from its last new token's logits, on the
 * device where the backend can (only the ids come back: one host synchronisation). params[n_seqs]
 * each sequence's sampling (NULL: greedy for all), draws[n_seqs] each one's draw counter, the
 * index of the token in its output (NULL: 0), out_ids[n_seqs], out_logprobs[n_seqs] or NULL (as
 * sampling.h defines them). The repetition penalty reads each sequence's whole history: every
 * id it was fed, this step's included. Errors as nopad_decode, plus invalid sampling parameters
 * and logits that are NaN, +inf or all -inf; after any error the sequences are as before. */
nopad_status nopad_decode_sample(nopad_context *ctx, int32_t n_seqs, nopad_sequence *const *seqs,
                                 const int32_t *cu_tokens, const int32_t *tokens,
                                 const nopad_sampling_params *params, const uint64_t *draws,
                                 int32_t *out_ids, float *out_logprobs);

typedef struct nopad_generate_params {
    int32_t max_tokens;           /* new tokens per prompt at most; default 128 */
    int ignore_eos;               /* 1: do not stop at the model's end-of-sequence ids */
    nopad_sampling_params sampling;
} nopad_generate_params;
nopad_generate_params nopad_generate_default_params(void);

/* Called with each new token of prompt `prompt` as it is chosen; return nonzero to stop that
 * prompt there (the token is kept). */
typedef int (*nopad_token_fn)(void *user, int32_t prompt, int32_t token);

/* Generates for n_prompts prompts at once (packed: prompt i is prompt_tokens[cu_prompts[i] ..
 * cu_prompts[i+1])): each step runs every unfinished prompt's next token together, and a prompt
 * that finishes leaves the batch. out_tokens [n_prompts, max_tokens] receives the new ids,
 * out_counts[n_prompts] how many (may be NULL: then only on_token sees them). */
nopad_status nopad_generate(nopad_context *ctx, int32_t n_prompts, const int32_t *cu_prompts,
                            const int32_t *prompt_tokens, const nopad_generate_params *params,
                            int32_t *out_tokens, int32_t *out_counts, nopad_token_fn on_token,
                            void *user);

/* ---- the engine: requests from any thread, fused into one packed step per iteration -------- */

/* An engine runs a decoder on its own thread over requests that arrive at any time from any
 * thread. Every iteration it fuses the next token of every running request and chunks of the
 * prompts of new ones into one packed step, so a request starts without waiting for others to
 * finish and leaves the moment it is done. It owns a context of its own (workspace and KV pool)
 * on the model; the model must outlive it.
 *
 * Scheduling, every iteration: the running requests' next tokens first (in the order they were
 * admitted), then prompt chunks, of running requests still reading their prompt and then of
 * waiting ones (first come, first served), up to max_step_tokens; a long prompt is read in
 * chunks across steps, so it never stalls the others. A waiting request is admitted while KV
 * blocks and max_running allow. When the pool runs out mid-generation the latest-admitted
 * request is preempted: its blocks are freed and it waits at the head of the queue to compute its
 * prompt and output so far again, then goes on where it was (its tokens are the same; none is
 * delivered twice).
 *
 * Prefix sharing: the KV blocks of prompts (and outputs) are content-hashed once computed; a new
 * request whose prompt begins with the same full blocks reuses them instead of computing them
 * again, so a common system prompt is computed once. Unused computed blocks stay cached until
 * their room is needed (least recently used first).
 *
 * Determinism: a request's tokens depend only on its own prompt and parameters (sampling draws
 * are a function of the seed and the token's index in the output), not on what shares its steps
 * or on preemptions, up to rounding: the CPU backend's GEMM rounds a row differently with the
 * number of rows in the step (OpenBLAS picks its kernels by it), so a request's logits alone and
 * among others differ by about 1e-6 relative. Greedy outputs agree unless two logits are that
 * close; a sampled output can part where its draw falls that close to a top-p cut or a step of
 * the distribution. */
typedef struct nopad_engine nopad_engine;

typedef struct nopad_engine_params {
    int32_t max_step_tokens; /* tokens in one step over all requests (next tokens + prompt
                                chunks); the workspace of the engine's context. default 2048 */
    int32_t max_running;     /* requests admitted at once, at most max_step_tokens; default 256 */
    int32_t kv_cache_tokens; /* the KV pool in tokens over all requests; <= 0: 8192 */
    int32_t kv_block_size;   /* tokens per KV block (the unit of sharing too); <= 0: 16 */
    int32_t max_queue;       /* requests submitted and not yet admitted; one more is refused with
                                NOPAD_ERR_QUEUE_FULL. default 1024 */
    int prefix_sharing;      /* 1: share the KV blocks of equal prompt prefixes; default 1 */
    int overlap_steps;       /* 1: plan and queue step n+1 before step n's ids are back, so the
                                device never waits for the host between steps; 0: take them
                                first; < 0 (default): 1 where the device samples (CUDA), 0 where
                                the host does (CPU: there it would only hold each id back a step) */
} nopad_engine_params;
nopad_engine_params nopad_engine_default_params(void);

/* Creates an engine on a decoder model (NULL params: the defaults) and starts its thread.
 * NOPAD_ERR_INVALID_ARGUMENT for an encoder or inconsistent params, naming them. */
nopad_status nopad_engine_create(nopad_model *model, const nopad_engine_params *params,
                                 nopad_engine **out);
/* Cancels every request not yet finished (readers see NOPAD_FINISH_CANCELLED), stops and joins
 * the engine's thread and frees its context. Request handles stay valid until
 * nopad_request_free. No other call on the engine (submit, cancel, stats) may run or start
 * meanwhile; call it from a thread of yours, not from an on_token callback. */
void nopad_engine_free(nopad_engine *engine);

/* Why a request ended. */
typedef enum nopad_finish_reason {
    NOPAD_FINISH_NONE = 0,      /* still running */
    NOPAD_FINISH_LENGTH = 1,    /* max_tokens generated */
    NOPAD_FINISH_STOP = 2,      /* an end-of-sequence id (unless ignore_eos) or a stop id, either
                                   delivered, or a stop string */
    NOPAD_FINISH_CANCELLED = 3, /* nopad_request_cancel, nopad_engine_cancel, nopad_request_free or
                                   nopad_engine_free before the end */
    NOPAD_FINISH_ERROR = 4,     /* the step failed (nopad_request_read returns its status) */
} nopad_finish_reason;
/* "none", "length", "stop", "cancelled", "error" (the names OpenAI-style servers use). Never NULL. */
const char *nopad_finish_reason_name(nopad_finish_reason finish);

/* Called on the engine's thread as a request's tokens come, in order: `token` the new id, `text`
 * (NUL-terminated, valid during the call; "" without a tokenizer) the text it releases, as
 * nopad_request_text grows. The last call has finish != NOPAD_FINISH_NONE; its token is -1 when
 * the request ended without a new one (cancelled, error), and it is the last: `user` may go in
 * or after it. Readers see each id (and the end) just before the call carrying it, so the last
 * call finds the request ended (its stats and text complete); a reader that sees the end may
 * still have that call running. The callback holds up every request while it runs: keep it
 * short. It may submit, cancel and free requests, never the engine. */
typedef void (*nopad_request_fn)(void *user, uint64_t request_id, int32_t token, const char *text,
                                 nopad_finish_reason finish);

/* ---- constrained decoding (docs/grammar.md) ------------------------------------------------ */

/* What a request's output must be: a JSON document valid under a schema, any JSON object, a text
 * matching a regular expression, or one of a list of texts. Compiled once and shared: any number
 * of requests may use one at once, and each keeps it alive while it runs (free it when you no
 * longer submit with it). The engine masks each step's choice to the tokens that keep the output
 * a prefix of such a document, and allows the end-of-sequence ids only once it is whole; a whole
 * document that admits nothing more ends the request (NOPAD_FINISH_STOP). The output is then
 * always valid, unless max_tokens stops it first (NOPAD_FINISH_LENGTH). */
typedef struct nopad_constraint nopad_constraint;
/* A JSON schema (its text, len bytes): the keywords docs/grammar.md lists. An unsupported keyword
 * is NOPAD_ERR_UNSUPPORTED naming it and its path in the schema; a malformed schema
 * NOPAD_ERR_INVALID_ARGUMENT naming where. */
nopad_status nopad_constraint_json_schema(const char *schema, size_t len, nopad_constraint **out);
/* Any JSON object (OpenAI's response_format {"type": "json_object"}). */
nopad_status nopad_constraint_json_object(nopad_constraint **out);
/* Text the whole of which matches `pattern` (vLLM's guided_regex; the subset in docs/grammar.md). */
nopad_status nopad_constraint_regex(const char *pattern, size_t len, nopad_constraint **out);
/* Exactly one of the n texts (vLLM's guided_choice). */
nopad_status nopad_constraint_choices(const char *const *choices, int32_t n, nopad_constraint **out);
/* JSON values inside fixed text, as a model family writes tool calls: `open`, then min_count (>= 1)
 * to max_count values (max_count -1: no limit) joined by `separator`, then `close`; each value
 * valid against one of the n_schemas JSON schemas (each compiled on its own: its $ref resolve
 * within it). E.g. Hermes calls: open "<tool_call>\n", separator "\n</tool_call>\n<tool_call>\n",
 * close "\n</tool_call>", one schema per tool. Errors as nopad_constraint_json_schema's, the
 * path starting "schemas[i]". */
nopad_status nopad_constraint_json_sequence(const char *const *schemas, int32_t n_schemas, const char *open,
                                            const char *separator, const char *close, int32_t min_count,
                                            int32_t max_count, nopad_constraint **out);
void nopad_constraint_free(nopad_constraint *constraint);

typedef struct nopad_request_params {
    const int32_t *prompt_ids;  /* the prompt as ids [n_prompt_ids], or NULL and prompt_text */
    int32_t n_prompt_ids;
    const char *prompt_text;    /* UTF-8, tokenized by the model's tokenizer as nopad_tokenize
                                   does by default (special tokens added) */
    int32_t max_tokens;         /* new tokens at most, >= 1; prompt + max_tokens must fit the
                                   model's context and the engine's KV pool. default 128 */
    int ignore_eos;             /* 1: do not stop at the model's end-of-sequence ids */
    nopad_sampling_params sampling;
    const int32_t *stop_ids;    /* [n_stop_ids] ids that end the request (the id is delivered) */
    int32_t n_stop_ids;
    const char *const *stop_strings; /* [n_stop_strings] texts that end the request: its text
                                   stops before the first one that appears; the ids are delivered
                                   up to and with the one completing it. Needs a tokenizer */
    int32_t n_stop_strings;
    nopad_request_fn on_token;  /* optional: each token as it comes (see above) */
    void *user;                 /* on_token's first argument */
    int logprobs;               /* 1: keep each generated id's log-probability, for
                                   nopad_request_logprobs */
    const nopad_constraint *constraint; /* NULL: none; else the output follows it (above). Needs
                                   the model's tokenizer; refused on a split model (tp_size > 1) */
    int32_t top_logprobs;       /* 0..NOPAD_MAX_TOP_LOGPROBS: keep, for each generated id, the
                                   that many most likely ids and their log-probabilities, for
                                   nopad_request_top_logprobs; 0: none */
} nopad_request_params;
nopad_request_params nopad_request_default_params(void);

/* A submitted request: the stream of its results, owned by the caller until nopad_request_free. */
typedef struct nopad_request nopad_request;

/* Submits a request (everything in params is copied). Safe from any thread. Errors, with nothing
 * submitted: NOPAD_ERR_INVALID_ARGUMENT for an empty prompt, both or neither prompt form, ids
 * outside the vocabulary, max_tokens < 1, bad sampling parameters, stop strings or text without
 * a tokenizer; NOPAD_ERR_TOO_LONG when prompt + max_tokens exceeds the model's context or needs
 * more KV blocks than the whole pool holds (it could never run); NOPAD_ERR_QUEUE_FULL when
 * max_queue requests are waiting already (retry later: a server's HTTP 429). */
nopad_status nopad_engine_submit(nopad_engine *engine, const nopad_request_params *params,
                                 nopad_request **out);

/* Reads the request's new token ids, in order, each once: waits until at least one is there or
 * the request has ended, at most timeout_ms (< 0: no limit; 0: does not wait). ids[capacity]
 * receives up to capacity of them and *n_ids their number (0 after a timeout or at the end).
 * *finish receives NOPAD_FINISH_NONE while ids remain to be read, then why it ended. A request
 * that ended in an error returns that error's status and message once its ids are read. Any
 * thread; one reader at a time per request. */
nopad_status nopad_request_read(nopad_request *r, int32_t *ids, int32_t capacity, int32_t *n_ids,
                                nopad_finish_reason *finish, int32_t timeout_ms);

/* The request's text so far: its ids through the model's tokenizer (special tokens skipped),
 * spaced as the whole text is, without held-back bytes of an unfinished character or of what may
 * begin a stop string, and ending before the stop string that ended it. Complete once the
 * request has ended. *text_len receives its length; text[capacity] the text and a NUL when
 * capacity > *text_len, else NOPAD_ERR_BUFFER_TOO_SMALL (capacity 0 and text NULL measure). ""
 * for a model without a tokenizer. */
nopad_status nopad_request_text(nopad_request *r, char *text, size_t capacity, size_t *text_len);

/* The log-probabilities of the request's generated ids delivered so far, in order, as the
 * sampler reports them (sampling.h: under the distribution the id was drawn from, after
 * temperature, top-k, top-p and min-p; for greedy, the model's at temperature 1 after the
 * repetition penalty): out[capacity] receives the first min(capacity, delivered) of them and *n
 * the number delivered. A request submitted without logprobs is NOPAD_ERR_INVALID_ARGUMENT. Any
 * thread, on_token included (an id's log-probability is there before the call carrying it). */
nopad_status nopad_request_logprobs(nopad_request *r, float *out, int32_t capacity, int32_t *n);
/* The same from generated id `first` on (>= 0): out[capacity] receives the log-probabilities of
 * ids first .. first + min(capacity, delivered - first) - 1, *n the number delivered, so a reader
 * that streams them copies each once. */
nopad_status nopad_request_logprobs_from(nopad_request *r, int32_t first, float *out, int32_t capacity,
                                         int32_t *n);

/* The top_logprobs (k, as submitted) most likely ids of each generated id's step, delivered so
 * far, in order: for generated id i, ids[i * k + j] and logprobs[i * k + j], j < k, most likely
 * first, ties in order of the lower id. The distribution is the one nopad_request_logprobs uses
 * (the id drawn is among them when it ranks within k, with the same log-probability): the logits
 * after the constraint's mask, logit_bias and the penalties, ranked by logit; each
 * log-probability under what the draw kept (-inf for an id that top-k, top-p or min-p dropped, or
 * whose logit is -inf), for greedy at temperature 1 over every id. Ids past the vocabulary's size are
 * -1 with -inf. ids and logprobs [capacity * k] receive the first min(capacity, delivered) ids'
 * lists and *n the number of ids delivered. A request submitted with top_logprobs 0 is
 * NOPAD_ERR_INVALID_ARGUMENT. Any thread, on_token included. */
nopad_status nopad_request_top_logprobs(nopad_request *r, int32_t *ids, float *logprobs, int32_t capacity,
                                        int32_t *n);
/* The same from generated id `first` on (>= 0): ids and logprobs [capacity * k] receive the lists
 * of ids first .. first + min(capacity, delivered - first) - 1, *n the number delivered. */
nopad_status nopad_request_top_logprobs_from(nopad_request *r, int32_t first, int32_t *ids, float *logprobs,
                                             int32_t capacity, int32_t *n);

/* The engine's id of the request (unique per engine, from 1), as on_token receives it. */
uint64_t nopad_request_id(const nopad_request *r);

/* Asks the request to stop: it ends with NOPAD_FINISH_CANCELLED at the engine's next iteration
 * and its KV blocks are freed (ids delivered before stay readable). A request that has already
 * ended is left as it is (NOPAD_OK). Safe from any thread, on_token included. */
nopad_status nopad_request_cancel(nopad_request *r);
/* The same by id, for callers that keep ids: NOPAD_ERR_INVALID_ARGUMENT when no request of this
 * engine with that id is in flight (never submitted, or already ended and retired). */
nopad_status nopad_engine_cancel(nopad_engine *engine, uint64_t request_id);

/* Releases the handle; a request not yet ended is cancelled first. The engine keeps what it needs
 * until it retires the request. */
void nopad_request_free(nopad_request *r);

/* One request's numbers. Times in milliseconds from its submission; -1 for what has not happened. */
typedef struct nopad_request_stats {
    int32_t prompt_tokens;        /* ids of its prompt */
    int32_t prompt_tokens_shared; /* of them, read from shared KV blocks (prefix sharing) */
    int32_t generated_tokens;     /* ids generated so far */
    int32_t preemptions;          /* times it was preempted and computed again */
    nopad_finish_reason finish;   /* NOPAD_FINISH_NONE while running */
    double admitted_ms;           /* it was first admitted (its first step planned) */
    double first_token_ms;        /* its first id was delivered */
    double finished_ms;           /* it ended */
} nopad_request_stats;
nopad_status nopad_request_get_stats(nopad_request *r, nopad_request_stats *out);

/* The engine's counters: a snapshot, from any thread. */
typedef struct nopad_engine_stats {
    int32_t running;                /* requests admitted (holding KV blocks) */
    int32_t waiting;                /* submitted, not running: new or preempted */
    int32_t kv_blocks_total;
    int32_t kv_blocks_used;         /* held by running requests */
    int32_t kv_blocks_cached;       /* held by no request, keeping computed prefixes for reuse;
                                       taken for new content, least recently used first, once
                                       no free block is left */
    int32_t kv_block_size;
    int64_t requests_finished;      /* ended for any reason */
    int64_t steps;                  /* packed steps run */
    int64_t tokens_generated;       /* ids delivered */
    int64_t prompt_tokens_computed; /* prompt (and, after a preemption, output) tokens computed */
    int64_t prompt_tokens_shared;   /* the same read from shared blocks instead */
    int64_t preemptions;
    double last_step_ms;            /* the last step, from its launch (or the step before's end, where
                                       it was queued behind it) to its ids taken */
    double tokens_per_s;            /* ids delivered per second of wall time over the last 64
                                       steps (0 after a second without a step) */
    int64_t masks_built;            /* constraint masks computed: one a constrained row a step */
    double mask_ms;                 /* the host time they took, in total (the engine thread's, while
                                       the device runs the step's forward where it samples) */
} nopad_engine_stats;
nopad_status nopad_engine_get_stats(nopad_engine *engine, nopad_engine_stats *out);

/* ---- training (issue 24; CPU float32, CUDA as its training ops land; docs/training.md) ------ */

typedef enum nopad_train_task {
    NOPAD_TRAIN_MLM = 0,      /* masked-LM on text lines (or JSONL "text") */
    NOPAD_TRAIN_CLASSIFY = 1, /* sequence classification on JSONL {"text", "label"[, "text_pair"]};
                                 one label = regression */
} nopad_train_task;

typedef enum nopad_train_optimizer {
    NOPAD_TRAIN_ADAMW = 0, /* with global-norm gradient clipping first, as HF's Trainer */
    NOPAD_TRAIN_LAMB = 1,  /* clips by itself */
} nopad_train_optimizer;

/* Where a run stands, after each optimiser step. */
typedef struct nopad_train_progress {
    int64_t step, total_steps;  /* steps taken (>= 1), and of the whole run */
    int32_t epoch, epochs;      /* 0-based epoch of this step, and of the run */
    double loss;                /* this step's mean loss */
    double lr;                  /* the learning rate this step used */
    double grad_norm;           /* the global gradient norm before clipping */
    int64_t tokens;             /* real tokens trained on so far */
    double elapsed_s;           /* since the first step began */
} nopad_train_progress;
/* Called after every step; returning non-zero stops the run (the checkpoint is still saved). */
typedef int (*nopad_train_fn)(void *user, const nopad_train_progress *p);

/* What picks a run's best evaluation (a tie keeps the earlier step). */
typedef enum nopad_train_metric {
    NOPAD_TRAIN_METRIC_AUTO = 0,     /* accuracy for classification with >= 2 labels, else loss */
    NOPAD_TRAIN_METRIC_LOSS = 1,     /* the mean eval loss, lower is better */
    NOPAD_TRAIN_METRIC_ACCURACY = 2, /* the eval accuracy, higher is better (classification with
                                        >= 2 labels) */
} nopad_train_metric;

/* One evaluation during a run (eval_every, eval_every_epoch), after the step it follows. */
typedef struct nopad_train_eval {
    int64_t step;               /* steps taken when it ran */
    int32_t epoch;              /* 0-based epoch of that step */
    int32_t examples;           /* of the eval data */
    double loss;                /* the mean eval loss */
    double accuracy;            /* classification with >= 2 labels, else -1 */
    nopad_train_metric metric;  /* LOSS or ACCURACY: what "best" is by */
    int is_best;                /* 1: better than every evaluation before it (saved to
                                   output_dir/best with save_best) */
    int64_t best_step;          /* the best evaluation so far (this one when is_best) */
    double best_value;          /* its metric */
    int32_t since_best;         /* evaluations since the best (0 when is_best) */
    int32_t evaluations;        /* of the run so far, this one and a resumed run's included */
} nopad_train_eval;
/* Called after every evaluation; returning non-zero stops the run (the checkpoint is saved). */
typedef int (*nopad_train_eval_fn)(void *user, const nopad_train_eval *e);

typedef struct nopad_train_params {
    const char *model_dir;        /* an HF BERT folder with its tokenizer (required) */
    const char *data_path;        /* training data (required): JSONL when it ends in .jsonl or
                                     for classification, else one text example a line */
    const char *eval_path;        /* evaluation data or NULL (same format) */
    const char *output_dir;       /* the checkpoint folder (required; its parent must exist) */
    nopad_train_task task;        /* NOPAD_TRAIN_MLM */
    int32_t num_labels;           /* classification: 0 = the checkpoint's classifier; N creates a
                                     new pooler and classifier when the checkpoint has none */
    int32_t epochs;               /* 3 */
    double lr;                    /* 5e-5 (peak, after the warmup) */
    double warmup_ratio;          /* 0.1: ceil(ratio·steps) warmup steps, then linear decay to 0 */
    int64_t warmup_steps;         /* -1: from warmup_ratio */
    int32_t batch_tokens;         /* 4096: a batch's token budget (real tokens, no padding) */
    int32_t batch_seqs;           /* 32: at most this many sequences a batch */
    uint64_t seed;                /* 42: data order, masking, a new head's weights */
    nopad_train_optimizer optimizer; /* NOPAD_TRAIN_ADAMW */
    double weight_decay;          /* 0.01 (not on biases and LayerNorm parameters) */
    double max_grad_norm;         /* 1.0; <= 0: no clipping */
    int64_t save_every;           /* 0; N > 0: also save the checkpoint every N steps */
    int truncate;                 /* 0: an example longer than the model maximum is an error
                                     naming its line; 1: cut it */
    int n_threads;                /* CPU threads; <= 0: OpenMP's default */
    nopad_train_fn on_step;       /* or NULL */
    void *user;
    const char *resume_dir;       /* NULL, or a checkpoint folder (save_every / the end save) to
                                     continue: its weights, moments, step, schedule and data
                                     position; the run's settings (task, optimizer, epochs, lr,
                                     warmup, batch budgets, seed, ...) must be the saved run's,
                                     else an error naming both values. It may be output_dir. */
    nopad_device device;          /* NOPAD_DEVICE_CPU */
    int32_t device_index;         /* CUDA device ordinal; 0 */
    nopad_dtype dtype;            /* compute dtype: F32 (CPU); BF16 or F16 on CUDA (float32 master
                                     weights either way) */
    const char *log_path;         /* NULL, or a JSONL file (truncated) with a line a step: step,
                                     epoch, loss (%.17g), lr, grad_norm, tokens */
    int log_batches;              /* 1: each log line also holds the batch trained on (cu_seqlens,
                                     input_ids, token_type_ids, and mlm_positions + mlm_labels or
                                     labels), to replay the run elsewhere */
    double dropout;               /* -1: config.json's hidden_dropout_prob (BERT's 0.1), as HF's
                                     Trainer runs; else a rate in [0, 1), 0 = off. Dropout after
                                     the embeddings and each sub-layer (the attention's
                                     probabilities: attention_dropout). Evaluation runs without. */
    int stream;                   /* 0: the training data is tokenized whole into memory (4 bytes a
                                     token); 1: streamed a window at a time, memory bounded by
                                     stream_buffer whatever the corpus size (docs/training.md) */
    int64_t stream_buffer;        /* 64 MiB: the text a streamed window holds (>= 1024 bytes) */
    /* Evaluation during training (needs eval_path). Without either of these, eval_path is
     * evaluated once at the end, into the result. With them, every evaluation (and the one of
     * the run's last step) is recorded: on_eval, a log line, trainer_state.json's history. */
    int64_t eval_every;           /* 0; N > 0: evaluate after every N steps */
    int eval_every_epoch;         /* 0; 1: evaluate at the end of each epoch */
    int save_best;                /* 1: the weights of the best evaluation (best_metric) to
                                     output_dir/best (config.json, model.safetensors, the tokenizer
                                     files, eval_results.json naming the step) */
    nopad_train_metric best_metric; /* AUTO; a resumed run keeps its checkpoint's */
    int32_t early_stop;           /* 0; K > 0: stop after K evaluations in a row without
                                     improving on the best */
    nopad_train_eval_fn on_eval;  /* or NULL; gets `user` */
    int whole_word_mask;          /* 0; 1 (masked-LM, WordPiece tokenizers): mask whole words, a
                                     piece and the "##" pieces after it together, each word with
                                     probability 0.15 (BERT's whole-word masking); the 80/10/10
                                     replacement stays per piece */
    int pack_lines;               /* 0; 1 (masked-LM, data in memory): the lines, each with its
                                     [CLS] ... [SEP], concatenated in file order and cut into
                                     examples of the model maximum (HF run_mlm.py's grouping
                                     without --line_by_line), so the model sees full-length
                                     sequences; 0 trains on each line alone */
    double early_stop_min_delta;  /* 0; > 0: early_stop counts the evaluations since one beat the
                                     best before it by more than this (a loss lower, an accuracy
                                     higher by that much; Keras' min_delta); save_best and
                                     is_best still take any improvement */
    double attention_dropout;     /* -1: follows dropout when that is set (>= 0), else config.json's
                                     attention_probs_dropout_prob (BERT's 0.1); else a rate in
                                     [0, 1), 0 = off. Dropout of the attention probabilities
                                     (after the softmax). Evaluation runs without. Resuming, an
                                     unset rate (this one, or dropout) is the checkpoint's. */
    int dp_exchange;              /* 1; data-parallel runs (under a launcher): before each step the
                                     sequences that must move go to other processes so that each
                                     holds equal tokens and attention work (docs/training.md); 0
                                     trains each process on what it read (the same result: the
                                     exchange only permutes the work). Ignored by one process. */
} nopad_train_params;
nopad_train_params nopad_train_default_params(void);

typedef struct nopad_train_result {
    int64_t steps;                  /* the model's step count at the end (resumed ones included) */
    int64_t resumed_step;           /* the checkpoint's step count with resume_dir, else 0 */
    double first_loss, last_loss;   /* of the first and the last step of this call */
    int32_t num_labels;             /* classification: the head's */
    int new_head;                   /* 1: the head was created (not in the checkpoint) */
    int32_t n_examples, n_truncated; /* of the training data */
    int32_t eval_examples;          /* 0 without eval_path */
    double eval_accuracy;           /* classification with eval_path (num_labels > 1), else -1 */
    double eval_loss;               /* the mean loss over eval_path, else -1 */
    int32_t evaluations;            /* recorded during the run (eval_every, eval_every_epoch),
                                       a resumed run's earlier ones included */
    nopad_train_metric best_metric; /* LOSS or ACCURACY with evaluations, else AUTO */
    int64_t best_step;              /* the best of them (the earliest of equals), 0 without */
    double best_value;              /* its metric, -1 without */
    int early_stopped;              /* 1: early_stop ended the run */
    /* data-parallel runs (dp_ranks > 1, or a forced world of one): the balance of this call's
     * steps, in tokens. Per step, the most loaded process's tokens as read and as computed (after
     * the exchange), summed over the steps; the tokens of the global batches (a process's mean is
     * dp_tokens / dp_ranks); the sequences and tokens the exchange moved. 0 with one process. */
    int32_t dp_ranks;
    int64_t dp_steps, dp_tokens, dp_max_read, dp_max_computed, dp_moved_seqs, dp_moved_tokens;
} nopad_train_result;

/* Fine-tunes (or pretrains with MLM) model_dir on data_path and saves output_dir: an
 * HF model folder (config.json, model.safetensors, the source's tokenizer files) that nopad and
 * transformers load, plus the optimiser state. Errors name the file, line or step: a bad flag
 * value, a missing file, bad data, a non-finite loss. */
nopad_status nopad_train(const nopad_train_params *params, nopad_train_result *out);

#ifdef __cplusplus
}
#endif
#endif /* NOPAD_H */
