/* Data-parallel training: the balance plan, the sharded data, the global loader, the exchange
 * and the step with its bucketed gradient all-reduce (dp.h says how they fit). */
#include "train/dp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/file.h"

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        nopad_status st_ = (expr);                                                                 \
        if (st_ != NOPAD_OK) return st_;                                                           \
    } while (0)

/* ---- the balance plan ------------------------------------------------------------------------ */

/* The balance of the ranks' loads: Σ over ranks of the squared deviations of their tokens and of
 * their Σ L² from the means, each over its mean. */
typedef struct loads {
    int64_t *tokens, *squares; // [ranks]
    double mean_tokens, mean_squares;
} loads;

static double deviation(const loads *w, int64_t tokens, int64_t squares) {
    const double t = (double)tokens / w->mean_tokens - 1, s = (double)squares / w->mean_squares - 1;
    return t * t + s * s;
}

/* How much moving dt tokens and ds squares from rank a to rank b lowers the sum of deviations. */
static double gain(const loads *w, int32_t a, int32_t b, int64_t dt, int64_t ds) {
    return deviation(w, w->tokens[a], w->squares[a]) + deviation(w, w->tokens[b], w->squares[b]) -
           deviation(w, w->tokens[a] - dt, w->squares[a] - ds) -
           deviation(w, w->tokens[b] + dt, w->squares[b] + ds);
}

static void move_load(loads *w, int32_t a, int32_t b, int64_t dt, int64_t ds) {
    w->tokens[a] -= dt, w->squares[a] -= ds;
    w->tokens[b] += dt, w->squares[b] += ds;
}

int32_t train_balance_plan(const int32_t *lengths, const int32_t *owner, int32_t n, int32_t ranks,
                           int32_t *dest) {
    for (int32_t i = 0; i < n; i++) dest[i] = owner[i];
    loads w = {.tokens = calloc(2 * (size_t)(ranks > 0 ? ranks : 1), sizeof(int64_t))};
    if (!w.tokens || ranks < 2 || n < 1) { /* unbalanced is still right: only slower */
        free(w.tokens);
        return 0;
    }
    w.squares = w.tokens + ranks;
    int64_t total_t = 0, total_s = 0;
    for (int32_t i = 0; i < n; i++) {
        const int64_t L = lengths[i];
        w.tokens[owner[i]] += L, w.squares[owner[i]] += L * L;
        total_t += L, total_s += L * L;
    }
    w.mean_tokens = (double)total_t / ranks, w.mean_squares = (double)total_s / ranks;
    /* each step lowers the sum of deviations; 4n + ranks bounds the steps anyway */
    for (int32_t iter = 0; iter < 4 * n + ranks; iter++) {
        double worst = 0;
        for (int32_t r = 0; r < ranks; r++) {
            const double t = (double)w.tokens[r] / w.mean_tokens, s = (double)w.squares[r] / w.mean_squares;
            if (t > worst) worst = t;
            if (s > worst) worst = s;
        }
        if (worst <= 1.05) break; /* within 5% of the means: more moves would buy little */
        /* the move of one sequence that lowers the deviations most */
        int32_t best = -1, to = -1, back = -1;
        double best_gain = 1e-12;
        for (int32_t i = 0; i < n; i++) {
            const int64_t L = lengths[i];
            for (int32_t r = 0; r < ranks; r++) {
                if (r == dest[i]) continue;
                const double g = gain(&w, dest[i], r, L, L * L);
                if (g > best_gain) best = i, to = r, best_gain = g;
            }
        }
        /* where none helps, the swap of two sequences that does (a longer one for a shorter) */
        for (int32_t i = 0; to < 0 && i < n; i++) {
            for (int32_t j = 0; j < n; j++) {
                if (dest[j] == dest[i] || lengths[j] >= lengths[i]) continue;
                const int64_t Li = lengths[i], Lj = lengths[j];
                const double g = gain(&w, dest[i], dest[j], Li - Lj, Li * Li - Lj * Lj);
                if (g > best_gain) best = i, back = j, best_gain = g;
            }
        }
        if (back >= 0) to = dest[back];
        if (best < 0) break; /* no move or swap lowers the deviations */
        const int32_t from = dest[best];
        const int64_t L = lengths[best];
        move_load(&w, from, to, L, L * L);
        dest[best] = to;
        if (back >= 0) {
            const int64_t J = lengths[back];
            move_load(&w, to, from, J, J * J);
            dest[back] = from;
        }
    }
    free(w.tokens);
    int32_t moved = 0;
    for (int32_t i = 0; i < n; i++) moved += dest[i] != owner[i];
    return moved;
}

/* ---- data ------------------------------------------------------------------------------------ */

/* The first line start at or after byte size·r/ranks (a line starts at 0 or after a '\n'). */
static size_t share_start(const char *text, size_t len, int32_t r, int32_t ranks) {
    if (r <= 0) return 0;
    if (r >= ranks) return len;
    size_t p = (size_t)((unsigned long long)len * (unsigned long long)r / (unsigned long long)ranks);
    while (p < len && p > 0 && text[p - 1] != '\n') p++;
    return p;
}

nopad_status train_dataset_load_shard(const char *path, const nopad_tokenizer *tok,
                                      const train_data_params *params, int32_t rank, int32_t ranks,
                                      train_dataset *out) {
    memset(out, 0, sizeof *out);
    if (!path || !tok || !params || ranks < 1 || rank < 0 || rank >= ranks)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_dataset_load_shard: bad argument "
                               "(rank %d of %d)", rank, ranks);
    char *text = NULL;
    size_t len = 0;
    TRY(read_file(path, 0, &text, &len));
    const size_t lo = share_start(text, len, rank, ranks), hi = share_start(text, len, rank + 1, ranks);
    int64_t line = 1;
    for (const char *p = text; (p = memchr(p, '\n', (size_t)(text + lo - p))) != NULL; p++) line++;
    nopad_status st = train_dataset_init(tok, params, out);
    if (st == NOPAD_OK) st = train_dataset_add_lines(out, tok, text + lo, len - lo, hi - lo, path, line, 0);
    free(text);
    if (st != NOPAD_OK) train_dataset_free(out);
    return st;
}

/* params.pack on this rank's share, collective: the pieces one process cuts from the whole file.
 * A rank's tokens follow the earlier ranks' in the file, so its pieces start where the multiples
 * of max_length fall among its tokens (those before the first end the previous rank's last piece),
 * and its last piece runs on into the next ranks' first tokens: every rank gathers every rank's
 * token count and first max_length - 1 tokens. */
static nopad_status pack_share(nopad_comm *comm, train_dataset *d) {
    const int32_t P = comm_size(comm), me = comm_rank(comm);
    const int64_t L = d->params.max_length, H = L - 1; /* a piece's tokens after its first */
    int64_t *counts = calloc((size_t)P, sizeof *counts);
    int32_t *heads = calloc((size_t)P * (size_t)H, sizeof *heads), *tail = malloc((size_t)H * sizeof *tail);
    if (!counts || !heads || !tail) {
        free(counts), free(heads), free(tail);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "packing the training lines: out of memory");
    }
    int32_t *mine = heads + (size_t)me * H;
    const int64_t own = d->n_tokens;
    memcpy(mine, d->ids, (size_t)(own < H ? own : H) * sizeof *mine);
    nopad_status st = comm_all_gather(comm, NULL, counts, &own, sizeof own, COMM_BYTE);
    if (st == NOPAD_OK) st = comm_all_gather(comm, NULL, heads, mine, (size_t)H, COMM_I32);
    int64_t before = 0, n_tail = 0;
    for (int32_t r = 0; r < me; r++) before += counts[r];
    for (int32_t r = me + 1; r < P && n_tail < H; r++) {
        const int64_t take = counts[r] < H - n_tail ? counts[r] : H - n_tail;
        memcpy(tail + n_tail, heads + (size_t)r * H, (size_t)take * sizeof *tail);
        n_tail += take;
    }
    if (st == NOPAD_OK) st = train_dataset_pack(d, (L - before % L) % L, tail, n_tail);
    free(counts), free(heads), free(tail);
    return st;
}

/* ---- gradient buckets ------------------------------------------------------------------------ */

int32_t train_grad_buckets(const train_model *m) { return m->cfg.num_layers + 2; }

void train_grad_bucket(const train_model *m, int32_t bucket, int64_t *offset, int64_t *count) {
    const int32_t L = m->cfg.num_layers;
    /* the flat layout: the embeddings, layer 0 .. L-1, the head (train_model.c) */
    const int64_t head = (float *)(m->task == TRAIN_TASK_MLM ? m->g.mlm_dense_w : m->g.pool_w) - m->grads;
    if (bucket == 0) {
        *offset = head;
        *count = m->n_params - head;
    } else if (bucket <= L) {
        const int32_t l = L - bucket;
        *offset = (float *)m->g.layers[l].qkv_w - m->grads;
        *count = (l + 1 < L ? (float *)m->g.layers[l + 1].qkv_w - m->grads : head) - *offset;
    } else {
        *offset = 0;
        *count = (L > 0 ? (float *)m->g.layers[0].qkv_w - m->grads : head);
    }
}

/* ---- agreement ------------------------------------------------------------------------------- */

nopad_status train_dp_agree(nopad_comm *comm, nopad_status st, const char *what) {
    const int32_t size = comm_size(comm), rank = comm_rank(comm);
    if (size < 2) return st;
    int32_t failed = st != NOPAD_OK ? rank : size; /* the lowest failing rank speaks */
    TRY(comm_all_reduce(comm, NULL, &failed, 1, COMM_I32, COMM_MIN));
    if (failed == size) return NOPAD_OK;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", failed == rank ? nopad_last_error() : "");
    TRY(comm_host_broadcast(comm, msg, sizeof msg, failed));
    if (failed == rank) return st;
    return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: rank %d failed: %s", what, failed, msg);
}

nopad_status train_dp_any(train_dp *dp, int *flag) {
    int32_t v = *flag != 0;
    TRY(comm_all_reduce(dp->comm, NULL, &v, 1, COMM_I32, COMM_MAX));
    *flag = v;
    return NOPAD_OK;
}

/* ---- the run --------------------------------------------------------------------------------- */

/* Int32 words of a sequence's record: length, type-0 length, masked count, label (or the bits
 * of a regression target), the example's number in the corpus (two words: it keys the sequence's
 * dropout masks on whichever rank computes it), then ids[len] and, for MLM, masked
 * positions[len] and labels[len]. */
enum { RECORD_HEAD = 6 };
static int64_t record_size(const train_dp *dp, int32_t len) {
    return RECORD_HEAD + (int64_t)(dp->model->task == TRAIN_TASK_MLM ? 3 : 1) * len;
}

/* Drops the staged batches; an exchange in flight is waited for first (every rank staged it). */
static nopad_status drop_staged(train_dp *dp) {
    nopad_status st = NOPAD_OK;
    for (int i = 0; i < 2; i++) {
        train_dp_staged *g = &dp->staged[i];
        const nopad_status w = comm_host_wait(dp->comm, g->exchange);
        if (st == NOPAD_OK) st = w;
        g->exchange = NULL;
        g->valid = 0;
    }
    return st;
}

void train_dp_free(train_dp *dp) {
    if (!dp) return;
    drop_staged(dp);
    for (int i = 0; i < 2; i++) {
        train_dp_staged *g = &dp->staged[i];
        free(g->batch), free(g->owner), free(g->dest), free(g->blen), free(g->send), free(g->recv);
        free(g->counts);
    }
    free(dp->lengths), free(dp->order), free(dp->reader), free(dp->local_index), free(dp->records);
    free(dp->cu_seqlens), free(dp->tokens), free(dp->types);
    free(dp->mlm_positions), free(dp->mlm_labels), free(dp->labels), free(dp->targets);
    free(dp->examples), free(dp->loss_sums);
    free(dp->gathered_records), free(dp->gathered_ranks), free(dp->g_cu_seqlens), free(dp->g_tokens);
    free(dp->g_types), free(dp->g_mlm_positions), free(dp->g_mlm_labels), free(dp->g_labels);
    free(dp->g_targets), free(dp->g_examples);
    memset(dp, 0, sizeof *dp);
}

/* What every run holds whatever its data: the staged batches, the records, one micro-batch. */
static nopad_status init_run(nopad_comm *comm, int exchange, train_model *m, int32_t local_tokens,
                             int32_t local_seqs, int32_t global_tokens, int32_t global_seqs, uint64_t seed,
                             train_dp *dp) {
    memset(dp, 0, sizeof *dp);
    dp->comm = comm;
    dp->rank = comm_rank(comm);
    dp->size = comm_size(comm);
    dp->exchange = exchange;
    dp->model = m;
    dp->local_tokens = local_tokens, dp->local_seqs = local_seqs;
    dp->global_tokens = global_tokens, dp->global_seqs = global_seqs;
    dp->seed = seed;
    const size_t P = (size_t)dp->size, B = (size_t)global_seqs;
    /* a rank's records of a step fit a whole global batch */
    const size_t words = (size_t)(RECORD_HEAD * (int64_t)global_seqs + 3 * (int64_t)global_tokens);
    int missing = 0;
    for (int i = 0; i < 2; i++) {
        train_dp_staged *g = &dp->staged[i];
        g->counts = calloc(4 * P, sizeof *g->counts);
        g->batch = malloc(B * sizeof(int32_t));
        g->owner = malloc(B * sizeof(int32_t));
        g->dest = malloc(B * sizeof(int32_t));
        g->blen = malloc(B * sizeof(int32_t));
        g->send = malloc(words * sizeof(int32_t));
        g->recv = malloc(words * sizeof(int32_t));
        missing |= !g->counts || !g->batch || !g->owner || !g->dest || !g->blen || !g->send || !g->recv;
    }
    dp->loss_sums = calloc(P, sizeof *dp->loss_sums);
    dp->records = malloc(words * sizeof(int32_t));
    const size_t T = (size_t)local_tokens, S = (size_t)local_seqs;
    dp->cu_seqlens = malloc((S + 1) * sizeof(int32_t));
    dp->tokens = malloc(T * sizeof(int32_t));
    dp->types = malloc(T * sizeof(int32_t));
    dp->mlm_positions = malloc(T * sizeof(int32_t));
    dp->mlm_labels = malloc(T * sizeof(int32_t));
    dp->labels = malloc(S * sizeof(int32_t));
    dp->targets = malloc(S * sizeof(float));
    dp->examples = malloc(S * sizeof(int64_t));
    if (missing || !dp->loss_sums || !dp->records || !dp->cu_seqlens || !dp->tokens || !dp->types ||
        !dp->mlm_positions || !dp->mlm_labels || !dp->labels || !dp->targets || !dp->examples)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "data-parallel training: out of memory");
    return comm_attach(comm, m->be);
}

/* The per-example arrays for n examples (a streamed window's may grow). */
static nopad_status reserve_examples(train_dp *dp, int64_t n) {
    if (n > INT32_MAX)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training data: %lld examples, more than %d",
                               (long long)n, INT32_MAX);
    if (n <= dp->cap_examples) return NOPAD_OK;
    int32_t **arrays[] = {&dp->lengths, &dp->order, &dp->reader, &dp->local_index};
    for (size_t k = 0; k < sizeof arrays / sizeof arrays[0]; k++) {
        int32_t *a = realloc(*arrays[k], (size_t)(n > 0 ? n : 1) * sizeof(int32_t));
        if (!a) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "data-parallel training: out of memory");
        *arrays[k] = a;
    }
    dp->cap_examples = (int32_t)n;
    return NOPAD_OK;
}

nopad_status train_dp_init(nopad_comm *comm, int exchange, train_model *m, train_dataset *local,
                           int32_t local_tokens, int32_t local_seqs, int32_t global_tokens,
                           int32_t global_seqs, uint64_t seed, train_dp *out) {
    train_dp *dp = out;
    nopad_status st = init_run(comm, exchange, m, local_tokens, local_seqs, global_tokens, global_seqs, seed, dp);
    st = train_dp_agree(comm, st, "data-parallel training");
    dp->local = local;
    const int32_t P = dp->size;
    if (local->params.pack && local->params.task == TRAIN_TASK_MLM) { /* the whole file's pieces */
        const nopad_status packed = train_dp_agree(comm, pack_share(comm, local), "packing the training lines");
        if (st == NOPAD_OK) st = packed;
    }
    /* every rank's example count, then every example's length */
    int32_t *counts = calloc((size_t)P, sizeof *counts), *first = calloc((size_t)P + 1, sizeof *first);
    if (st == NOPAD_OK && (!counts || !first))
        st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "data-parallel training: out of memory");
    const int32_t mine = local->n_examples;
    if (st == NOPAD_OK) st = comm_all_gather(comm, NULL, counts, &mine, 1, COMM_I32);
    int64_t n = 0;
    for (int32_t r = 0; st == NOPAD_OK && r < P; r++) {
        first[r] = (int32_t)n;
        n += counts[r];
        if (n > INT32_MAX)
            st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training data: %lld examples, more "
                                 "than %d", (long long)n, INT32_MAX);
    }
    if (st == NOPAD_OK && n == 0)
        st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training data: no training example in "
                             "any rank's share (blank, or nothing to mask)");
    if (st == NOPAD_OK) st = reserve_examples(dp, n);
    int32_t *my_lengths = st == NOPAD_OK ? malloc(((size_t)mine + 1) * sizeof *my_lengths) : NULL;
    if (st == NOPAD_OK && !my_lengths)
        st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "data-parallel training: out of memory");
    if (st == NOPAD_OK) {
        first[P] = (int32_t)n;
        dp->n_examples = (int32_t)n;
        for (int32_t j = 0; j < mine; j++) {
            local->index[j] += first[dp->rank];
            my_lengths[j] = (int32_t)(local->offsets[j + 1] - local->offsets[j]);
        }
        for (int32_t r = 0; r < P; r++)
            for (int32_t e = first[r]; e < first[r + 1]; e++) dp->reader[e] = r, dp->local_index[e] = e - first[r];
        size_t *scount = dp->staged[0].counts, *soff = scount + P, *rcount = soff + P, *roff = rcount + P;
        for (int32_t r = 0; r < P; r++) {
            scount[r] = (size_t)mine, soff[r] = 0;
            rcount[r] = (size_t)counts[r], roff[r] = (size_t)first[r];
        }
        st = comm_all_to_allv(comm, NULL, dp->lengths, rcount, roff, my_lengths, scount, soff, COMM_I32);
    }
    free(counts), free(first), free(my_lengths);
    for (int32_t e = 0; st == NOPAD_OK && e < dp->n_examples; e++)
        if (dp->lengths[e] > local_tokens) /* every rank sees it: they all fail alike */
            st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training data: example %d has %d "
                                 "tokens, more than the batch budget of %d", e, dp->lengths[e], local_tokens);
    if (st == NOPAD_OK) st = train_dp_seek(dp, 0, 0, 0);
    if (st != NOPAD_OK) train_dp_free(dp);
    return st;
}

nopad_status train_dp_sum_counts(void *comm, nopad_status st, int64_t *values, size_t n) {
    st = train_dp_agree(comm, st, "reading the training data");
    if (st == NOPAD_OK && n > 0) st = comm_all_reduce(comm, NULL, values, n, COMM_I64, COMM_SUM);
    return st;
}

nopad_status train_dp_init_stream(nopad_comm *comm, int exchange, train_model *m, train_stream *stream,
                                  int32_t local_tokens, int32_t local_seqs, int32_t global_tokens,
                                  int32_t global_seqs, uint64_t seed, train_dp *out) {
    train_dp *dp = out;
    nopad_status st = init_run(comm, exchange, m, local_tokens, local_seqs, global_tokens, global_seqs, seed, dp);
    dp->stream = stream;
    dp->local = &stream->data;
    st = train_dp_agree(comm, st, "data-parallel training");
    if (st == NOPAD_OK) st = train_dp_seek(dp, 0, 0, 0);
    if (st != NOPAD_OK) train_dp_free(dp);
    return st;
}

/* Streamed (collective): window w of the epoch. Each rank reads its blocks of it; every example's
 * length goes to every rank (one all-to-all-v), laid out as one process reads the window (its
 * blocks in the epoch's order, each block's lines in file order), with the rank that read it;
 * the window's order is train_loader's over it. */
static nopad_status load_window(train_dp *dp, int32_t w) {
    train_stream *s = dp->stream;
    const int32_t P = dp->size;
    TRY(drop_staged(dp));
    TRY(train_dp_agree(dp->comm, train_stream_seek(s, dp->epoch, w, 0), "reading the training data"));
    dp->window = w;
    const int32_t first = w * s->window_blocks;
    const int32_t last = w >= s->n_windows ? first
                       : s->n_blocks - first < s->window_blocks ? s->n_blocks : first + s->window_blocks;
    int64_t n = 0;
    for (int32_t i = first; i < last; i++) n += s->first_example[s->block_order[i] + 1] - s->first_example[s->block_order[i]];
    TRY(reserve_examples(dp, n)); /* the same n on every rank: they fail alike */
    size_t *counts = calloc(5 * (size_t)P + 1, sizeof *counts);
    int32_t *by_rank = malloc((size_t)(n > 0 ? n : 1) * sizeof *by_rank);
    int32_t *mine = malloc((size_t)(s->data.n_examples + 1) * sizeof *mine);
    nopad_status st = NOPAD_OK;
    if (!counts || !by_rank || !mine)
        st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "data-parallel training: out of memory");
    st = train_dp_agree(dp->comm, st, "reading the training data");
    if (st == NOPAD_OK) {
        size_t *scount = counts, *soff = scount + P, *rcount = soff + P, *roff = rcount + P, *at = roff + P;
        for (int32_t i = first; i < last; i++) {
            const int32_t b = s->block_order[i];
            rcount[train_stream_block_reader(s, b)] += (size_t)(s->first_example[b + 1] - s->first_example[b]);
        }
        for (int32_t r = 1; r < P; r++) roff[r] = roff[r - 1] + rcount[r - 1];
        for (int32_t j = 0; j < s->data.n_examples; j++)
            mine[j] = (int32_t)(s->data.offsets[j + 1] - s->data.offsets[j]);
        for (int32_t r = 0; r < P; r++) scount[r] = (size_t)s->data.n_examples;
        st = comm_all_to_allv(dp->comm, NULL, by_rank, rcount, roff, mine, scount, soff, COMM_I32);
        /* the window's examples in one process's order: each block's from the rank that read it */
        int32_t e = 0;
        for (int32_t i = first; st == NOPAD_OK && i < last; i++) {
            const int32_t b = s->block_order[i], r = train_stream_block_reader(s, b);
            for (int64_t k = s->first_example[b]; k < s->first_example[b + 1]; k++, e++) {
                dp->reader[e] = r;
                dp->local_index[e] = (int32_t)at[r];
                dp->lengths[e] = by_rank[roff[r] + at[r]++];
            }
        }
    }
    free(counts), free(by_rank), free(mine);
    TRY(st);
    dp->n_examples = (int32_t)n;
    train_shuffle(dp->order, dp->n_examples, dp->seed, dp->epoch, (uint32_t)w, TRAIN_SHUFFLE_EXAMPLES);
    dp->cursor = dp->pack_cursor = 0;
    return NOPAD_OK;
}

nopad_status train_dp_seek(train_dp *dp, uint32_t epoch, int32_t window, int32_t cursor) {
    dp->epoch = epoch;
    if (dp->stream) {
        if (window < 0 || window > dp->stream->n_windows)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_dp_seek: window %d outside [0, %d]",
                                   window, dp->stream->n_windows);
        TRY(load_window(dp, window));
    } else if (window != 0) {
        return nopad_set_error(NOPAD_ERR_FORMAT, "window %d of an epoch whose data is held in memory (it "
                               "has one)", window);
    }
    if (cursor < 0 || cursor > dp->n_examples)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_dp_seek: cursor %d outside [0, %d]",
                               cursor, dp->n_examples);
    nopad_status st = drop_staged(dp);
    if (!dp->stream) train_shuffle(dp->order, dp->n_examples, dp->seed, epoch, 0, TRAIN_SHUFFLE_EXAMPLES);
    dp->cursor = dp->pack_cursor = cursor;
    return st;
}

/* The global batch from *cursor in `order`, as train_loader_next packs it (batch and blen may be
 * NULL: counted only); *cursor moves past it. Its sequences; *tokens their tokens. */
static int32_t pack_from(const train_dp *dp, const int32_t *order, int32_t *cursor, int32_t *batch, int32_t *blen,
                         int32_t *tokens) {
    int32_t B = 0, T = 0;
    while (*cursor < dp->n_examples && B < dp->global_seqs) {
        const int32_t e = order[*cursor], len = dp->lengths[e];
        if (T + len > dp->global_tokens) break;
        if (batch) batch[B] = e, blen[B] = len;
        B++;
        T += len;
        (*cursor)++;
    }
    *tokens = T;
    return B;
}

nopad_status train_dp_count_batches(train_dp *dp, uint32_t epoch, int64_t *n) {
    *n = 0;
    int32_t cursor = 0, tokens = 0;
    if (dp->stream) { /* each window read (collective), as one process counts a streamed epoch */
        dp->epoch = epoch;
        for (int32_t w = 0; w < dp->stream->n_windows; w++) {
            TRY(load_window(dp, w));
            for (cursor = 0; pack_from(dp, dp->order, &cursor, NULL, NULL, &tokens) > 0;) (*n)++;
        }
        return NOPAD_OK;
    }
    /* an order of its own: the staged batches keep theirs */
    int32_t *order = malloc((size_t)(dp->n_examples > 0 ? dp->n_examples : 1) * sizeof *order);
    if (!order) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "counting the training steps: out of memory");
    train_shuffle(order, dp->n_examples, dp->seed, epoch, 0, TRAIN_SHUFFLE_EXAMPLES);
    while (pack_from(dp, order, &cursor, NULL, NULL, &tokens) > 0) (*n)++;
    free(order);
    return NOPAD_OK;
}

/* The record of this rank's example e (the corpus's number) at rec: masked as one process masks
 * it in this epoch. */
static void build_record(const train_dp *dp, int32_t e, int32_t *rec) {
    const train_dataset *d = dp->local;
    const int32_t j = dp->local_index[e];
    const int32_t len = (int32_t)(d->offsets[j + 1] - d->offsets[j]);
    rec[0] = len;
    rec[1] = d->type0_len[j];
    rec[2] = rec[3] = 0;
    memcpy(&rec[4], &d->index[j], sizeof(int64_t));
    if (dp->model->task == TRAIN_TASK_MLM) {
        rec[2] = train_mask_example(d, dp->seed, dp->epoch, j, rec + RECORD_HEAD,
                                    rec + RECORD_HEAD + len, rec + RECORD_HEAD + 2 * len);
        return;
    }
    memcpy(rec + RECORD_HEAD, d->ids + d->offsets[j], (size_t)len * sizeof(int32_t));
    if (dp->model->num_labels == 1) memcpy(&rec[3], &d->targets[j], sizeof(float));
    else rec[3] = d->labels[j];
}

static void add_balance(train_dp_balance *to, const train_dp_balance *b) {
    to->steps += b->steps;
    to->max_before += b->max_before, to->max_after += b->max_after, to->total += b->total;
    to->moved_seqs += b->moved_seqs, to->moved_tokens += b->moved_tokens;
}

/* Stages the global batch from the pack cursor into g: planned (the same on every rank), the
 * records this rank sends built, and their exchange started. */
static nopad_status stage(train_dp *dp, train_dp_staged *g) {
    const int32_t P = dp->size, me = dp->rank;
    g->valid = 1;
    g->exchange = NULL;
    g->balance = (train_dp_balance){0};
    g->n_batch = pack_from(dp, dp->order, &dp->pack_cursor, g->batch, g->blen, &g->batch_tokens);
    g->cursor = dp->pack_cursor;
    const int32_t B = g->n_batch;
    if (B == 0) return NOPAD_OK;
    for (int32_t i = 0; i < B; i++) g->owner[i] = dp->reader[g->batch[i]];
    int32_t moved = 0;
    if (dp->exchange)
        moved = train_balance_plan(g->blen, g->owner, B, P, g->dest);
    else
        memcpy(g->dest, g->owner, (size_t)B * sizeof(int32_t));
    /* the balance, in tokens */
    int64_t *before = calloc(2 * (size_t)P, sizeof *before), *after = before ? before + P : NULL;
    if (!before) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "data-parallel step: out of memory");
    train_dp_balance b = {.steps = 1, .total = g->batch_tokens, .moved_seqs = moved};
    for (int32_t i = 0; i < B; i++) {
        before[g->owner[i]] += g->blen[i];
        after[g->dest[i]] += g->blen[i];
        if (g->dest[i] != g->owner[i]) b.moved_tokens += g->blen[i];
    }
    for (int32_t r = 0; r < P; r++) {
        if (before[r] > b.max_before) b.max_before = before[r];
        if (after[r] > b.max_after) b.max_after = after[r];
    }
    free(before);
    g->balance = b;
    /* what leaves and what arrives, in batch order per rank: counts from the lengths alone */
    size_t *scount = g->counts, *soff = scount + P, *rcount = soff + P, *roff = rcount + P;
    memset(g->counts, 0, 4 * (size_t)P * sizeof *g->counts);
    for (int32_t i = 0; i < B; i++) {
        if (g->owner[i] == g->dest[i]) continue;
        if (g->owner[i] == me) scount[g->dest[i]] += (size_t)record_size(dp, g->blen[i]);
        if (g->dest[i] == me) rcount[g->owner[i]] += (size_t)record_size(dp, g->blen[i]);
    }
    for (int32_t r = 1; r < P; r++) {
        soff[r] = soff[r - 1] + scount[r - 1];
        roff[r] = roff[r - 1] + rcount[r - 1];
    }
    if (moved == 0) return NOPAD_OK;
    size_t *at = calloc((size_t)P, sizeof *at);
    if (!at) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "data-parallel step: out of memory");
    for (int32_t i = 0; i < B; i++) {
        const int32_t to = g->dest[i];
        if (g->owner[i] != me || to == me) continue;
        build_record(dp, g->batch[i], g->send + soff[to] + at[to]);
        at[to] += (size_t)record_size(dp, g->blen[i]);
    }
    free(at);
    return comm_host_all_to_allv_start(dp->comm, g->recv, rcount, roff, g->send, scount, soff, COMM_I32,
                                       &g->exchange);
}

/* The staged batch g becomes this step's: its exchange received, and this rank's sequences in the
 * batch's order (its own built here, the others' as received). */
static nopad_status take(train_dp *dp, train_dp_staged *g) {
    const nopad_status st = comm_host_wait(dp->comm, g->exchange);
    g->exchange = NULL;
    g->valid = 0;
    if (st != NOPAD_OK) return st;
    const int32_t P = dp->size, B = g->n_batch, me = dp->rank;
    dp->now = g;
    dp->n_batch = B;
    dp->batch_tokens = g->batch_tokens;
    dp->cursor = g->cursor;
    dp->step_balance = g->balance;
    if (B > 0) add_balance(&dp->run_balance, &g->balance);
    size_t *rcount = g->counts + 2 * P, *roff = rcount + P;
    int64_t w = 0;
    memset(rcount, 0, (size_t)P * sizeof *rcount); /* now: what was read of each rank's part */
    dp->n_mine = 0;
    for (int32_t i = 0; i < B; i++) {
        if (g->dest[i] != me) continue;
        const int64_t size = record_size(dp, g->blen[i]);
        if (g->owner[i] == me) {
            build_record(dp, g->batch[i], dp->records + w);
        } else {
            const int32_t from = g->owner[i];
            memcpy(dp->records + w, g->recv + roff[from] + rcount[from], (size_t)size * sizeof(int32_t));
            rcount[from] += (size_t)size;
        }
        w += size;
        dp->n_mine++;
    }
    return NOPAD_OK;
}

nopad_status train_dp_next(train_dp *dp, int *got) {
    *got = 0;
    train_dp_staged *now = &dp->staged[dp->next];
    if (!now->valid) TRY(stage(dp, now)); /* the first step after a seek */
    TRY(take(dp, now));
    /* streamed: a window's end reads the next window (the step does not overlap that) */
    while (dp->n_batch == 0 && dp->stream && dp->window < dp->stream->n_windows) {
        TRY(load_window(dp, dp->window + 1));
        now = &dp->staged[dp->next];
        TRY(stage(dp, now));
        TRY(take(dp, now));
    }
    if (dp->n_batch == 0) return NOPAD_OK;
    *got = 1;
    /* the next step's batch, on its way while this one computes */
    dp->next ^= 1;
    return stage(dp, &dp->staged[dp->next]);
}

/* A record's fields appended to batch b's arrays (cu_seqlens[B + 1], tokens and types at T,
 * masked rows at M, label or target and example at B); moves B, T and M on. */
static void append_record(const train_dp *dp, const int32_t *rec, train_batch *b, int32_t *cu_seqlens,
                          int32_t *tokens, int32_t *types, int32_t *mlm_positions, int32_t *mlm_labels,
                          int32_t *labels, float *targets, int64_t *examples) {
    const int mlm = dp->model->task == TRAIN_TASK_MLM;
    const int32_t len = rec[0], B = b->n_seqs, T = cu_seqlens[B], M = b->n_masked;
    memcpy(tokens + T, rec + RECORD_HEAD, (size_t)len * sizeof(int32_t));
    for (int32_t i = 0; i < len; i++) types[T + i] = i < rec[1] ? 0 : 1;
    memcpy(&examples[B], &rec[4], sizeof(int64_t));
    if (mlm) {
        for (int32_t i = 0; i < rec[2]; i++) {
            mlm_positions[M + i] = T + rec[RECORD_HEAD + len + i];
            mlm_labels[M + i] = rec[RECORD_HEAD + 2 * len + i];
        }
        b->n_masked = M + rec[2];
    } else if (dp->model->num_labels == 1) {
        memcpy(&targets[B], &rec[3], sizeof(float));
    } else {
        labels[B] = rec[3];
    }
    cu_seqlens[B + 1] = T + len;
    b->n_seqs = B + 1;
}

nopad_status train_dp_gather_batch(train_dp *dp, int32_t root, const train_batch **batch, const int32_t **ranks) {
    *batch = NULL;
    *ranks = NULL;
    const train_dp_staged *g = dp->now;
    if (!g || dp->n_batch == 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_dp_gather_batch: no step taken");
    const int32_t P = dp->size, B = g->n_batch, me = dp->rank;
    const size_t words = (size_t)(RECORD_HEAD * (int64_t)dp->global_seqs + 3 * (int64_t)dp->global_tokens);
    const size_t S = (size_t)dp->global_seqs, T = (size_t)dp->global_tokens;
    if (!dp->gathered_records) {
        dp->gathered_records = malloc(words * sizeof(int32_t));
        dp->gathered_ranks = malloc(S * sizeof(int32_t));
        dp->g_cu_seqlens = malloc((S + 1) * sizeof(int32_t));
        dp->g_tokens = malloc(T * sizeof(int32_t));
        dp->g_types = malloc(T * sizeof(int32_t));
        dp->g_mlm_positions = malloc(T * sizeof(int32_t));
        dp->g_mlm_labels = malloc(T * sizeof(int32_t));
        dp->g_labels = malloc(S * sizeof(int32_t));
        dp->g_targets = malloc(S * sizeof(float));
        dp->g_examples = malloc(S * sizeof(int64_t));
    }
    size_t *counts = calloc(4 * (size_t)P, sizeof *counts);
    if (!counts || !dp->gathered_records || !dp->gathered_ranks || !dp->g_cu_seqlens || !dp->g_tokens ||
        !dp->g_types || !dp->g_mlm_positions || !dp->g_mlm_labels || !dp->g_labels || !dp->g_targets ||
        !dp->g_examples) {
        free(counts);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "gathering the global batch: out of memory");
    }
    /* every rank's records go to the root: their sizes follow from the plan */
    size_t *scount = counts, *soff = scount + P, *rcount = soff + P, *roff = rcount + P;
    for (int32_t i = 0; i < B; i++) {
        const size_t size = (size_t)record_size(dp, g->blen[i]);
        if (g->dest[i] == me) scount[root] += size;
        if (me == root) rcount[g->dest[i]] += size;
    }
    for (int32_t r = 1; r < P; r++) roff[r] = roff[r - 1] + rcount[r - 1];
    nopad_status st = comm_all_to_allv(dp->comm, NULL, dp->gathered_records, rcount, roff, dp->records, scount,
                                       soff, COMM_I32);
    if (st != NOPAD_OK || me != root) {
        free(counts);
        return st;
    }
    /* the loader's order: sequence i is the next record of the rank that computed it */
    train_batch *b = &dp->gathered;
    *b = (train_batch){.cu_seqlens = dp->g_cu_seqlens, .tokens = dp->g_tokens, .types = dp->g_types,
                       .examples = dp->g_examples};
    dp->g_cu_seqlens[0] = 0;
    memset(rcount, 0, (size_t)P * sizeof *rcount); /* now: what was read of each rank's part */
    for (int32_t i = 0; i < B; i++) {
        const int32_t r = g->dest[i];
        const int32_t *rec = dp->gathered_records + roff[r] + rcount[r];
        rcount[r] += (size_t)record_size(dp, rec[0]);
        dp->gathered_ranks[i] = r;
        append_record(dp, rec, b, dp->g_cu_seqlens, dp->g_tokens, dp->g_types, dp->g_mlm_positions,
                      dp->g_mlm_labels, dp->g_labels, dp->g_targets, dp->g_examples);
    }
    if (dp->model->task == TRAIN_TASK_MLM) {
        b->mlm_positions = dp->g_mlm_positions;
        b->mlm_labels = dp->g_mlm_labels;
    } else if (dp->model->num_labels == 1) {
        b->targets = dp->g_targets;
    } else {
        b->labels = dp->g_labels;
    }
    free(counts);
    *batch = b;
    *ranks = dp->gathered_ranks;
    return NOPAD_OK;
}

/* A bucket's gradients summed across the ranks, started as soon as the backward has finished
 * them: on CUDA it runs on NCCL's second stream while the backward goes on with the layers below
 * (comm_all_reduce_async); train_dp_forward_backward joins them before anything reads them. */
static nopad_status reduce_bucket(void *user, int32_t bucket) {
    train_dp *dp = user;
    const train_model *m = dp->model;
    int64_t offset, count;
    train_grad_bucket(m, bucket, &offset, &count);
    nopad_status st = comm_all_reduce_async(dp->comm, m->be, m->grads + offset, (size_t)count, COMM_F32, COMM_SUM);
    if (st != NOPAD_OK && dp->bucket_status == NOPAD_OK) dp->bucket_status = st;
    return st;
}

/* The records from `*next` that fit one forward, as a batch; *next moves past them. */
static void micro_batch(train_dp *dp, int32_t *next, int64_t *at) {
    train_batch *b = &dp->micro;
    *b = (train_batch){.cu_seqlens = dp->cu_seqlens, .tokens = dp->tokens, .types = dp->types,
                       .examples = dp->examples};
    dp->cu_seqlens[0] = 0;
    while (*next < dp->n_mine && b->n_seqs < dp->local_seqs) {
        const int32_t *rec = dp->records + *at;
        if (dp->cu_seqlens[b->n_seqs] + rec[0] > dp->local_tokens) break;
        append_record(dp, rec, b, dp->cu_seqlens, dp->tokens, dp->types, dp->mlm_positions, dp->mlm_labels,
                      dp->labels, dp->targets, dp->examples);
        *at += record_size(dp, rec[0]);
        (*next)++;
    }
    if (dp->model->task == TRAIN_TASK_MLM) {
        b->mlm_positions = dp->mlm_positions;
        b->mlm_labels = dp->mlm_labels;
    } else if (dp->model->num_labels == 1) {
        b->targets = dp->targets;
    } else {
        b->labels = dp->labels;
    }
}

nopad_status train_dp_forward_backward(train_dp *dp, train_context *ctx, double *loss) {
    train_model *m = dp->model;
    const int mlm = m->task == TRAIN_TASK_MLM;
    /* the global batch's rows: its sequences, or the masked tokens every rank holds */
    int32_t rows = dp->n_batch;
    if (mlm) {
        int64_t at = 0;
        rows = 0;
        for (int32_t s = 0; s < dp->n_mine; s++) {
            rows += dp->records[at + 2];
            at += record_size(dp, dp->records[at]);
        }
        TRY(comm_all_reduce(dp->comm, NULL, &rows, 1, COMM_I32, COMM_SUM));
    }
    double sum = 0;
    nopad_status st = NOPAD_OK;
    dp->bucket_status = NOPAD_OK;
    ctx->loss_rows = rows;
    int32_t next = 0;
    int64_t at = 0;
    for (int first = 1; st == NOPAD_OK && next < dp->n_mine; first = 0) {
        micro_batch(dp, &next, &at);
        const int last = next == dp->n_mine;
        ctx->accumulate = !first;
        ctx->grads_ready = last ? reduce_bucket : NULL; /* the buckets are whole after the last */
        ctx->grads_user = dp;
        double part = 0;
        st = train_forward(ctx, &dp->micro);
        if (st == NOPAD_OK) st = train_backward(ctx);
        if (st == NOPAD_OK) st = train_read_loss_sum(ctx, &part);
        sum += part;
    }
    if (st == NOPAD_OK && dp->n_mine == 0) { /* nothing to compute here: a zero share of the sums */
        st = m->be->zero(m->be, m->grads, (size_t)m->n_params * sizeof(float));
        for (int32_t b = 0; st == NOPAD_OK && b < train_grad_buckets(m); b++) st = reduce_bucket(dp, b);
    }
    ctx->loss_rows = 0;
    ctx->accumulate = 0;
    ctx->grads_ready = NULL;
    ctx->grads_user = NULL;
    if (st == NOPAD_OK) st = dp->bucket_status;
    if (st == NOPAD_OK) st = comm_join(dp->comm, m->be); /* the sums, before the optimiser reads them */
    if (st != NOPAD_OK) return st;
    /* the loss: each rank's sum, added in rank order on every rank (the same double everywhere) */
    dp->loss_sums[dp->rank] = sum;
    TRY(comm_all_gather(dp->comm, NULL, dp->loss_sums, &dp->loss_sums[dp->rank], sizeof(double),
                        COMM_BYTE));
    double total = 0;
    for (int32_t r = 0; r < dp->size; r++) total += dp->loss_sums[r];
    *loss = total / rows;
    if (!isfinite(*loss))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training step: the loss is %g", *loss);
    return NOPAD_OK;
}
