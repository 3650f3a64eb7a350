/* The tensor-parallel shard plan (tp.h), the workers a leader starts without a launcher, and the
 * step messages from rank 0 to the others. */
#define _GNU_SOURCE /* dladdr: where this library (and so nopad-worker beside it) was loaded from */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "model/model_internal.h"
#include "model/tp.h"
#include "util/error.h"
#include "util/knobs.h"

static int fits(const model_config *cfg, int32_t size) {
    const int32_t nh = cfg->num_heads, kvh = cfg->num_kv_heads > 0 ? cfg->num_kv_heads : cfg->num_heads;
    if (size < 1 || nh % size != 0 || cfg->intermediate_size % size != 0) return 0;
    return kvh % size == 0 || size % kvh == 0;
}

nopad_status tp_shard_plan(const model_config *cfg, nopad_comm *comm, int32_t rank, int32_t size,
                           tp_shard *out) {
    memset(out, 0, sizeof *out);
    if (size < 1 || rank < 0 || rank >= size)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "tensor parallelism: rank %d of %d", rank, size);
    const int32_t nh = cfg->num_heads, kvh = cfg->num_kv_heads > 0 ? cfg->num_kv_heads : cfg->num_heads;
    if (!fits(cfg, size)) {
        char ok[256] = "";
        size_t used = 0;
        for (int32_t d = 1; d <= nh && used + 16 < sizeof ok; d++)
            if (fits(cfg, d)) used += (size_t)snprintf(ok + used, sizeof ok - used, "%s%d", used ? ", " : "", d);
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "tensor parallelism: tp %d does not split this model (%d query heads, %d "
                               "key/value heads, intermediate size %d: tp must divide the query heads "
                               "and the intermediate size, and divide or be a multiple of the key/value "
                               "heads); tp that work: %s",
                               size, nh, kvh, cfg->intermediate_size, ok);
    }
    out->comm = comm;
    out->rank = rank;
    out->size = size;
    out->heads = nh / size;
    out->head0 = rank * out->heads;
    if (kvh % size == 0) {
        out->kv_heads = kvh / size;
        out->kv_head0 = rank * out->kv_heads;
    } else { /* size is a multiple of kvh: size / kvh ranks share each key/value head */
        out->kv_heads = 1;
        out->kv_head0 = rank / (size / kvh);
    }
    out->ffn = cfg->intermediate_size / size;
    out->ffn0 = rank * out->ffn;
    const int32_t V = cfg->vocab_size;
    out->vocab_stride = (V + size - 1) / size;
    out->vocab0 = rank * out->vocab_stride;
    const int32_t left = V - out->vocab0;
    out->vocab_rows = left < 0 ? 0 : left < out->vocab_stride ? left : out->vocab_stride;
    out->seq_min_tokens = comm && knob_int(KNOB_TP_SEQUENCE_PARALLEL) ? size : 0;
    return NOPAD_OK;
}

/* ---- the launcher's world, from its environment (MPI is not started for this) ---------------- */

static int32_t env_int(const char *const *names, int32_t fallback) {
    for (const char *const *n = names; *n; n++) {
        const char *v = getenv(*n);
        if (v && *v) return (int32_t)atoi(v);
    }
    return fallback;
}

int32_t nopad_world_rank(void) {
    static const char *const names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", NULL};
    return env_int(names, 0);
}

int32_t nopad_world_size(void) {
    static const char *const names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
    return env_int(names, 1);
}

/* ---- rank 0 plans, every rank runs: the step messages ----------------------------------------
 *
 * Rank 0 (the leader) owns the scheduling: its engine, its sequences, its HTTP server. Before each
 * piece of work that involves the other ranks' shards (a context made or freed, a decoder forward,
 * its output, the wait for its ids, an encoder forward), it broadcasts one message: a header and
 * the host arrays the work reads. Every other rank (a follower, in nopad_tp_follow) receives it and
 * runs the same call on its shard, with the same arguments, so the collectives inside meet in the
 * same order on every rank. A call that refuses its input refuses it on every rank alike (the
 * same checks on the same data), so nobody is left waiting in a collective. The leader serialises
 * its messages and the work they announce (model->tp_lock): two of its threads never interleave
 * collectives. */

enum {
    TP_STOP = 1,           /* the leader freed its model */
    TP_CONTEXT_CREATE = 2, /* n: max_batch_tokens, cuda_graph_max_tokens, kv_cache_tokens, kv_block_size */
    TP_CONTEXT_FREE = 3,
    TP_DECODER_FORWARD = 4,/* n: B, T, max_blocks, all_logits, want_rows; then cu_q | tokens | seqlen_k | table */
    TP_DECODER_OUTPUT = 5, /* n: rows, what (TP_OUT_*), history length; then params, draws, cu_history | history */
    TP_DECODER_WAIT = 6,
    TP_ENCODER_FORWARD = 7,/* n: B, T, max_seqlen, graph rows, has types; then ids, types, cu_seqlens (backend memory) */
};
enum { TP_OUT_LOGITS = 1, TP_OUT_IDS = 2, TP_OUT_LOGPROBS = 4, TP_OUT_HISTORY = 8 };

typedef struct tp_message {
    int32_t op;
    int32_t context; /* the context's id: 0 is the model's default */
    int64_t n[6];
} tp_message;

static int leads(const nopad_model *m) { return m->comm && m->tp.rank == 0 && !m->following; }

static nopad_status send_message(nopad_model *m, tp_message *msg) {
    return comm_host_broadcast(m->comm, msg, sizeof *msg, 0);
}

nopad_status tp_context_created(nopad_context *c) {
    nopad_model *m = c->model;
    /* the default context (on the weights' backend; made during the load, before m->context is
     * set) is context 0 on every rank: no message */
    if (!leads(m) || c->be == m->be) return NOPAD_OK;
    pthread_mutex_lock(&m->tp_lock);
    c->tp_id = ++m->tp_contexts;
    tp_message msg = {.op = TP_CONTEXT_CREATE, .context = c->tp_id,
                      .n = {c->params.max_batch_tokens, c->params.cuda_graph_max_tokens,
                            c->params.kv_cache_tokens, c->params.kv_block_size}};
    nopad_status st = send_message(m, &msg);
    pthread_mutex_unlock(&m->tp_lock);
    return st;
}

void tp_context_freed(nopad_context *c) {
    nopad_model *m = c->model;
    if (!leads(m) || c == m->context || c->tp_id == 0) return;
    pthread_mutex_lock(&m->tp_lock);
    tp_message msg = {.op = TP_CONTEXT_FREE, .context = c->tp_id};
    send_message(m, &msg);
    pthread_mutex_unlock(&m->tp_lock);
}

void tp_model_freed(nopad_model *m) {
    if (!leads(m)) return;
    pthread_mutex_lock(&m->tp_lock);
    tp_message msg = {.op = TP_STOP};
    send_message(m, &msg);
    pthread_mutex_unlock(&m->tp_lock);
}

/* The decoder step's int32 arrays, as one buffer: cu_q [B+1] | tokens [T] | seqlen_k [B] | table [B, max_blocks]. */
static size_t forward_ints(int64_t B, int64_t T, int64_t max_blocks) { return (size_t)(B + 1 + T + B + B * max_blocks); }

static nopad_status forward_run(nopad_context *c, const decoder_batch *b, int want_rows) {
    return decoder_forward_launch(c->be, &c->model->cfg, &c->model->dec, &c->dec, b, want_rows);
}

nopad_status tp_decoder_forward(nopad_context *c, const decoder_batch *b, int want_rows) {
    nopad_model *m = c->model;
    if (!leads(m)) return forward_run(c, b, want_rows);
    const int64_t B = b->n_seqs, T = b->cu_q[B], W = b->max_blocks;
    const size_t n = forward_ints(B, T, W);
    int32_t *buf = malloc(n * sizeof *buf);
    if (!buf) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "decoder step: out of memory");
    memcpy(buf, b->cu_q, (size_t)(B + 1) * sizeof *buf);
    memcpy(buf + B + 1, b->tokens, (size_t)T * sizeof *buf);
    memcpy(buf + B + 1 + T, b->seqlen_k, (size_t)B * sizeof *buf);
    memcpy(buf + 2 * B + 1 + T, b->block_table, (size_t)(B * W) * sizeof *buf);
    pthread_mutex_lock(&m->tp_lock);
    tp_message msg = {.op = TP_DECODER_FORWARD, .context = c->tp_id, .n = {B, T, W, b->all_logits, want_rows}};
    nopad_status st = send_message(m, &msg);
    if (st == NOPAD_OK) st = comm_host_broadcast(m->comm, buf, n * sizeof *buf, 0);
    if (st == NOPAD_OK) st = forward_run(c, b, want_rows);
    pthread_mutex_unlock(&m->tp_lock);
    free(buf);
    return st;
}

static nopad_status output_run(nopad_context *c, const decoder_output *out) {
    return decoder_output_launch(c->be, &c->model->cfg, &c->model->dec, &c->dec, out);
}

nopad_status tp_decoder_output(nopad_context *c, const decoder_output *out) {
    nopad_model *m = c->model;
    if (!leads(m)) return output_run(c, out);
    const int64_t rows = c->dec.out_rows;
    const int64_t n_hist = out->cu_history && rows > 0 ? out->cu_history[rows] : 0;
    const int32_t what = (out->logits ? TP_OUT_LOGITS : 0) | (out->ids ? TP_OUT_IDS : 0) |
                         (out->logprobs ? TP_OUT_LOGPROBS : 0) | (out->cu_history ? TP_OUT_HISTORY : 0);
    pthread_mutex_lock(&m->tp_lock);
    tp_message msg = {.op = TP_DECODER_OUTPUT, .context = c->tp_id, .n = {rows, what, n_hist}};
    nopad_status st = send_message(m, &msg);
    if (st == NOPAD_OK && out->ids && rows > 0) {
        st = comm_host_broadcast(m->comm, (void *)out->params, (size_t)rows * sizeof *out->params, 0);
        if (st == NOPAD_OK) st = comm_host_broadcast(m->comm, (void *)out->draws, (size_t)rows * sizeof *out->draws, 0);
        if (st == NOPAD_OK && out->cu_history) {
            st = comm_host_broadcast(m->comm, (void *)out->cu_history, (size_t)(rows + 1) * sizeof(int32_t), 0);
            if (st == NOPAD_OK && n_hist > 0)
                st = comm_host_broadcast(m->comm, (void *)out->history, (size_t)n_hist * sizeof(int32_t), 0);
        }
    }
    if (st == NOPAD_OK) st = output_run(c, out);
    pthread_mutex_unlock(&m->tp_lock);
    return st;
}

nopad_status tp_decoder_wait(nopad_context *c, const decoder_output *out) {
    nopad_model *m = c->model;
    if (!leads(m)) return decoder_step_wait(c->be, &c->dec, out);
    pthread_mutex_lock(&m->tp_lock);
    tp_message msg = {.op = TP_DECODER_WAIT, .context = c->tp_id};
    nopad_status st = send_message(m, &msg);
    nopad_status waited = decoder_step_wait(c->be, &c->dec, out);
    pthread_mutex_unlock(&m->tp_lock);
    return st != NOPAD_OK ? st : waited;
}

nopad_status tp_decoder_step(nopad_context *c, const decoder_batch *b, const decoder_output *out) {
    nopad_status st = tp_decoder_forward(c, b, out->logits || out->ids);
    if (st == NOPAD_OK) st = tp_decoder_output(c, out);
    nopad_status waited = tp_decoder_wait(c, out);
    return st != NOPAD_OK ? st : waited;
}

nopad_status tp_encoder_forward(nopad_context *c, const nopad_seqs *seqs, int32_t rows, const int32_t *tokens,
                                const int32_t *types, void *hidden) {
    nopad_model *m = c->model;
    if (!leads(m)) return context_run_encoder(c, seqs, rows, tokens, types, hidden);
    nopad_backend *be = c->be;
    const int32_t B = seqs->n_seqs, T = seqs->n_tokens;
    pthread_mutex_lock(&m->tp_lock);
    tp_message msg = {.op = TP_ENCODER_FORWARD, .context = c->tp_id,
                      .n = {B, T, seqs->max_seqlen, rows, types != NULL}};
    nopad_status st = send_message(m, &msg);
    /* the ids go from the leader's backend memory to the followers' workspaces */
    if (st == NOPAD_OK) st = comm_broadcast(m->comm, be, (void *)tokens, (size_t)T, COMM_I32, 0);
    if (st == NOPAD_OK && types) st = comm_broadcast(m->comm, be, (void *)types, (size_t)T, COMM_I32, 0);
    if (st == NOPAD_OK) st = comm_broadcast(m->comm, be, (void *)seqs->cu_seqlens, (size_t)B + 1, COMM_I32, 0);
    if (st == NOPAD_OK) st = context_run_encoder(c, seqs, rows, tokens, types, hidden);
    pthread_mutex_unlock(&m->tp_lock);
    return st;
}

/* ---- the follower ---------------------------------------------------------------------------- */

typedef struct follower {
    nopad_model *m;
    nopad_context **contexts; /* by id; [0] the model's default */
    int32_t n_contexts;
    /* the output arrays the leader's caller had: the same shapes here, contents unused */
    float *logits, *logprobs;
    int32_t *ids, *ints;
    size_t logits_cap, rows_cap, ints_cap;
    nopad_sampling_params *params;
    uint64_t *draws;
    int32_t *history, *cu_history;
    size_t history_cap;
    decoder_output out; /* the last output launched, for its wait */
} follower;

static nopad_status grow_bytes(void **buf, size_t *cap, size_t need) {
    if (need <= *cap) return NOPAD_OK;
    void *grown = realloc(*buf, need);
    if (!grown) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tensor-parallel follower: out of memory");
    *buf = grown;
    *cap = need;
    return NOPAD_OK;
}

static nopad_context *follower_context(follower *f, int32_t id) {
    return id >= 0 && id < f->n_contexts ? f->contexts[id] : NULL;
}

static nopad_status follow_forward(follower *f, nopad_context *c, const tp_message *msg) {
    const int64_t B = msg->n[0], T = msg->n[1], W = msg->n[2];
    const size_t n = forward_ints(B, T, W);
    nopad_status st = grow_bytes((void **)&f->ints, &f->ints_cap, n * sizeof(int32_t));
    /* the leader sends the arrays whatever happens here: receive them before anything can fail */
    if (st == NOPAD_OK) st = comm_host_broadcast(f->m->comm, f->ints, n * sizeof(int32_t), 0);
    if (st != NOPAD_OK) return st;
    const int32_t *cu = f->ints, *tokens = cu + B + 1, *seqlen = tokens + T, *table = seqlen + B;
    const decoder_batch b = {.n_seqs = (int32_t)B, .cu_q = cu, .tokens = tokens, .seqlen_k = seqlen,
                             .block_table = table, .max_blocks = (int32_t)W, .all_logits = (int)msg->n[3]};
    return forward_run(c, &b, (int)msg->n[4]);
}

static nopad_status follow_output(follower *f, nopad_context *c, const tp_message *msg) {
    const int64_t rows = msg->n[0], what = msg->n[1], n_hist = msg->n[2];
    const size_t r = (size_t)(rows > 0 ? rows : 1), V = (size_t)f->m->cfg.vocab_size;
    nopad_status st = NOPAD_OK;
    if (r + 1 > f->rows_cap) { /* the per-row arrays grow together */
        f->rows_cap = 0;
        free(f->ids), free(f->logprobs), free(f->params), free(f->draws), free(f->cu_history);
        f->ids = malloc((r + 1) * sizeof *f->ids);
        f->logprobs = malloc((r + 1) * sizeof *f->logprobs);
        f->params = malloc((r + 1) * sizeof *f->params);
        f->draws = malloc((r + 1) * sizeof *f->draws);
        f->cu_history = malloc((r + 1) * sizeof *f->cu_history);
        if (!f->ids || !f->logprobs || !f->params || !f->draws || !f->cu_history)
            return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tensor-parallel follower: out of memory");
        f->rows_cap = r + 1;
    }
    if ((what & TP_OUT_IDS) && rows > 0) {
        st = comm_host_broadcast(f->m->comm, f->params, (size_t)rows * sizeof *f->params, 0);
        if (st == NOPAD_OK) st = comm_host_broadcast(f->m->comm, f->draws, (size_t)rows * sizeof *f->draws, 0);
        if (st == NOPAD_OK && (what & TP_OUT_HISTORY)) {
            st = comm_host_broadcast(f->m->comm, f->cu_history, (size_t)(rows + 1) * sizeof(int32_t), 0);
            if (st == NOPAD_OK) st = grow_bytes((void **)&f->history, &f->history_cap,
                                                (size_t)(n_hist > 0 ? n_hist : 1) * sizeof(int32_t));
            if (st == NOPAD_OK && n_hist > 0)
                st = comm_host_broadcast(f->m->comm, f->history, (size_t)n_hist * sizeof(int32_t), 0);
        }
    }
    if (st == NOPAD_OK && (what & TP_OUT_LOGITS))
        st = grow_bytes((void **)&f->logits, &f->logits_cap, r * V * sizeof(float));
    if (st != NOPAD_OK) return st;
    f->out = (decoder_output){.logits = (what & TP_OUT_LOGITS) ? f->logits : NULL,
                              .ids = (what & TP_OUT_IDS) ? f->ids : NULL,
                              .logprobs = (what & TP_OUT_LOGPROBS) ? f->logprobs : NULL,
                              .params = f->params, .draws = f->draws,
                              .history = (what & TP_OUT_HISTORY) ? f->history : NULL,
                              .cu_history = (what & TP_OUT_HISTORY) ? f->cu_history : NULL};
    return output_run(c, &f->out);
}

static nopad_status follow_encoder(follower *f, nopad_context *c, const tp_message *msg) {
    const int32_t B = (int32_t)msg->n[0], T = (int32_t)msg->n[1], rows = (int32_t)msg->n[3];
    const int has_types = (int)msg->n[4];
    nopad_backend *be = c->be;
    encoder_workspace *ws = &c->ws;
    nopad_status st = encoder_workspace_reserve(be, &f->m->cfg, &f->m->weights.tp, ws, rows ? rows : T, B);
    /* a failed reserve here while the leader's succeeded cannot be hidden: the broadcasts below
     * must still meet the leader's, so they run into the workspace only when it exists */
    if (st != NOPAD_OK) return st;
    st = comm_broadcast(f->m->comm, be, ws->tokens, (size_t)T, COMM_I32, 0);
    if (st == NOPAD_OK && has_types) st = comm_broadcast(f->m->comm, be, ws->types, (size_t)T, COMM_I32, 0);
    if (st == NOPAD_OK) st = comm_broadcast(f->m->comm, be, ws->cu_seqlens, (size_t)B + 1, COMM_I32, 0);
    if (st != NOPAD_OK) return st;
    const nopad_seqs seqs = {.n_seqs = B, .n_tokens = T, .max_seqlen = (int32_t)msg->n[2],
                             .cu_seqlens = ws->cu_seqlens};
    return context_run_encoder(c, &seqs, rows, ws->tokens, has_types ? ws->types : NULL, ws->hidden);
}

static nopad_status follow_context_create(follower *f, const tp_message *msg) {
    if (msg->context != f->n_contexts)
        return nopad_set_error(NOPAD_ERR_INTERNAL, "tensor-parallel follower: context %d announced, %d expected",
                               msg->context, f->n_contexts);
    nopad_context **grown = realloc(f->contexts, (size_t)(f->n_contexts + 1) * sizeof *grown);
    if (!grown) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tensor-parallel follower: out of memory");
    f->contexts = grown;
    f->contexts[f->n_contexts++] = NULL;
    nopad_context_params p = nopad_context_default_params();
    p.max_batch_tokens = (int32_t)msg->n[0];
    p.cuda_graph_max_tokens = (int32_t)msg->n[1];
    p.kv_cache_tokens = (int32_t)msg->n[2];
    p.kv_block_size = (int32_t)msg->n[3];
    return context_create(f->m, &p, NULL, &f->contexts[msg->context]);
}

/* Runs the leader's messages until it stops. A call that fails here failed on the leader too (the
 * same checks on the same data): the follower reports it to stderr and goes on with the next.
 * Within a step its collectives wait at most NOPAD_COMM_TIMEOUT seconds (default 30; the others
 * are a step's work away at most): rank 0 failing alone after it announced the step (out of
 * memory, say) leaves the others in a collective it never joins, and the follower then ends with
 * that error (under a launcher its exit aborts the job) instead of waiting forever. The wait for
 * the next step is not bounded: the leader may be idle. */
static nopad_status follow(follower *f) {
    const double step_limit_s = knob_float(KNOB_COMM_TIMEOUT) > 0 ? knob_float(KNOB_COMM_TIMEOUT) : 30;
    for (;;) {
        tp_message msg;
        comm_set_wait_limit(f->m->comm, 0);
        nopad_status st = comm_host_broadcast(f->m->comm, &msg, sizeof msg, 0);
        comm_set_wait_limit(f->m->comm, step_limit_s);
        if (st != NOPAD_OK) return nopad_wrap_error(st, "rank %d: waiting for rank 0's next step", f->m->tp.rank);
        if (msg.op == TP_STOP) return NOPAD_OK;
        if (msg.op == TP_CONTEXT_CREATE) {
            st = follow_context_create(f, &msg);
        } else {
            nopad_context *c = follower_context(f, msg.context);
            if (!c)
                return nopad_set_error(NOPAD_ERR_INTERNAL, "rank %d: rank 0 names context %d, which this rank "
                                       "does not hold", f->m->tp.rank, msg.context);
            switch (msg.op) {
            case TP_CONTEXT_FREE:
                context_destroy(c);
                f->contexts[msg.context] = NULL;
                break;
            case TP_DECODER_FORWARD: st = follow_forward(f, c, &msg); break;
            case TP_DECODER_OUTPUT: st = follow_output(f, c, &msg); break;
            case TP_DECODER_WAIT: st = decoder_step_wait(c->be, &c->dec, &f->out); break;
            case TP_ENCODER_FORWARD: st = follow_encoder(f, c, &msg); break;
            default:
                return nopad_set_error(NOPAD_ERR_INTERNAL, "rank %d: unknown message %d from rank 0",
                                       f->m->tp.rank, msg.op);
            }
        }
        if (st != NOPAD_OK && comm_timed_out(f->m->comm))
            return nopad_wrap_error(st, "rank %d: a step of rank 0's did not complete", f->m->tp.rank);
        if (st != NOPAD_OK) {
            fprintf(stderr, "nopad: rank %d: %s (rank 0 refused or failed the same step)\n", f->m->tp.rank,
                    nopad_last_error());
            nopad_clear_error();
        }
    }
}

/* Loads this rank's shard (on `comm` when given, else on the launcher's world) and runs the
 * leader's messages until it stops. */
static nopad_status follow_model(const char *dir, const nopad_model_params *params, nopad_comm *comm) {
    nopad_model *m = NULL;
    nopad_status st = model_load_follower(dir, params, comm, &m);
    if (st != NOPAD_OK) return st;
    follower f = {.m = m};
    f.contexts = malloc(sizeof *f.contexts);
    if (!f.contexts) {
        nopad_model_free(m);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_tp_follow: out of memory");
    }
    f.contexts[0] = m->context;
    f.n_contexts = 1;
    st = follow(&f);
    if (comm_timed_out(m->comm)) return st; /* a collective is still pending on these buffers: the
                                               caller ends the process (nopad_tp_follow's contract) */
    for (int32_t i = 1; i < f.n_contexts; i++) context_destroy(f.contexts[i]);
    free(f.contexts);
    free(f.logits), free(f.logprobs), free(f.ids), free(f.ints), free(f.params), free(f.draws);
    free(f.history), free(f.cu_history);
    nopad_model_free(m);
    return st;
}

nopad_status nopad_tp_follow(const char *dir, const nopad_model_params *params) {
    if (!params || params->tp_size <= 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_tp_follow: tp_size must be > 1");
    if (nopad_world_size() <= 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_tp_follow: no launcher started this process; with none, nopad_model_load "
                               "with tp_size %d starts the other ranks itself (call only that), and under "
                               "mpirun -np %d every rank but 0 calls nopad_tp_follow",
                               params->tp_size, params->tp_size);
    if (nopad_world_rank() == 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_tp_follow: this is rank 0, which loads the model with nopad_model_load "
                               "and leads; the other ranks follow");
    return follow_model(dir, params, NULL);
}

/* ---- workers started by the leader, without a launcher -----------------------------------------
 *
 * nopad_model_load with tp_size N in a process that no launcher started (its world is one rank)
 * starts N - 1 workers on this machine itself, as vLLM's --tensor-parallel-size does: the
 * nopad-worker program, through MPI_Comm_spawn (comm_spawn). The leader then sends them what to
 * load, and each runs nopad_tp_worker: it loads its shard and follows, as a launched rank's
 * nopad_tp_follow does, until the leader frees its model. */

#define TP_WORKER_PROGRAM "nopad-worker"
#define TP_WORKER_ARG "--tp-worker"             /* what nopad-worker is started with */
#define TP_WORKER_CHECK_ARG "--tp-worker-check" /* it prints its library's build id and exits */
enum { TP_WORKER_CHECK_S = 30 };

/* What the leader sends its workers: the model to load and how (the leader's own parameters). */
typedef struct tp_load_message {
    nopad_model_params params; /* cuda_stream cleared: a pointer of the leader's process */
    char dir[PATH_MAX];        /* absolute: the workers need not share the leader's working directory */
} tp_load_message;

/* nopad-worker's path: $NOPAD_TP_WORKER, else the file beside the library (or the program) this
 * code was loaded from: build/ holds libnopad.so, nopad and nopad-worker; the Python package
 * bundles nopad-worker beside its libnopad.so. */
static nopad_status worker_program(char *out, size_t cap) {
    const char *env = getenv("NOPAD_TP_WORKER");
    if (env && *env) {
        if (access(env, X_OK) != 0)
            return nopad_set_error(NOPAD_ERR_IO, "NOPAD_TP_WORKER=%s: not an executable file (the program a "
                                   "tensor-parallel leader starts its workers with: nopad-worker)", env);
        snprintf(out, cap, "%s", env);
        return NOPAD_OK;
    }
    Dl_info info;
    const char *here = dladdr((void *)worker_program, &info) && info.dli_fname ? info.dli_fname : "";
    const char *slash = strrchr(here, '/');
    const int len = slash ? (int)(slash - here) : 1;
    if ((size_t)snprintf(out, cap, "%.*s/%s", len, slash ? here : ".", TP_WORKER_PROGRAM) < cap &&
        access(out, X_OK) == 0)
        return NOPAD_OK;
    return nopad_set_error(NOPAD_ERR_IO,
                           "tensor parallelism without a launcher: no %s beside %s (%s is what the leader starts "
                           "its workers with; build it: cmake --build BUILD --target nopad_worker), and "
                           "NOPAD_TP_WORKER is not set; or start the ranks yourself: mpirun -np N ...",
                           TP_WORKER_PROGRAM, *here ? here : "this program", TP_WORKER_PROGRAM);
}

extern char **environ;

/* Runs `program --tp-worker-check` and expects this library's build id back. MPI_Comm_spawn waits
 * forever for a worker that ends before MPI starts (a missing library, another build that
 * refuses our message), so such a program is refused here, with what it said. */
static nopad_status check_worker(const char *program) {
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0)
        return nopad_set_error(NOPAD_ERR_IO, "tensor parallelism: pipe for %s: %s", program, strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
    char *argv[] = {(char *)program, TP_WORKER_CHECK_ARG, NULL};
    pid_t pid = 0;
    const int err = posix_spawn(&pid, program, &actions, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(pipe_fds[1]);
    if (err != 0) {
        close(pipe_fds[0]);
        return nopad_set_error(NOPAD_ERR_IO, "tensor parallelism: cannot start %s: %s", program, strerror(err));
    }
    char said[1024];
    size_t got = 0;
    const time_t deadline = time(NULL) + TP_WORKER_CHECK_S;
    struct pollfd p = {.fd = pipe_fds[0], .events = POLLIN};
    while (got < sizeof said - 1 && time(NULL) < deadline && poll(&p, 1, 1000) >= 0) {
        if (!(p.revents & (POLLIN | POLLHUP))) continue;
        const ssize_t n = read(pipe_fds[0], said + got, sizeof said - 1 - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(pipe_fds[0]);
    said[got] = '\0';
    /* its output closes as it exits, a moment before it can be waited for: wait up to the deadline,
     * then end it */
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(pid, &status, WNOHANG)) == 0 && time(NULL) < deadline) {
        const struct timespec pause = {.tv_sec = 0, .tv_nsec = 1000000};
        nanosleep(&pause, NULL);
    }
    if (done == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    while (got > 0 && (said[got - 1] == '\n' || said[got - 1] == '\r')) said[--got] = '\0';
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && strcmp(said, nopad_build_id()) == 0) return NOPAD_OK;
    return nopad_set_error(NOPAD_ERR_IO,
                           "tensor parallelism: %s cannot serve as this library's worker: `%s %s` %s%s%s (expected "
                           "this library's build id, %s); build nopad-worker with this library, or set "
                           "NOPAD_TP_WORKER",
                           program, program, TP_WORKER_CHECK_ARG,
                           WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "printed '" : "failed: '", said, "'",
                           nopad_build_id());
}

nopad_status tp_start_workers(const char *dir, const nopad_model_params *params, nopad_comm **out) {
    *out = NULL;
    tp_load_message msg;
    memset(&msg, 0, sizeof msg);
    if (!realpath(dir, msg.dir))
        return nopad_set_error(NOPAD_ERR_IO, "tensor parallelism: the model '%s': %s", dir, strerror(errno));
    msg.params = *params;
    msg.params.cuda_stream = NULL;
    char program[PATH_MAX];
    nopad_status st = worker_program(program, sizeof program);
    if (st == NOPAD_OK) st = check_worker(program);
    if (st == NOPAD_OK) st = comm_spawn(params->tp_size - 1, program, TP_WORKER_ARG, out);
    if (st == NOPAD_OK) st = comm_host_broadcast(*out, &msg, sizeof msg, 0);
    if (st != NOPAD_OK && *out) {
        comm_free(*out);
        *out = NULL;
    }
    return st;
}

nopad_status nopad_tp_worker(void) {
    nopad_comm *comm = NULL;
    nopad_status st = comm_parent(&comm);
    if (st != NOPAD_OK) return st;
    tp_load_message msg;
    st = comm_host_broadcast(comm, &msg, sizeof msg, 0);
    if (st != NOPAD_OK) {
        comm_free(comm);
        return st;
    }
    msg.dir[sizeof msg.dir - 1] = '\0';
    return follow_model(msg.dir, &msg.params, comm); /* the model owns comm from here */
}
