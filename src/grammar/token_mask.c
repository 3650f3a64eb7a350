/* Token masks: a trie of the vocabulary's token bytes, flattened in preorder, walked against the
 * matcher. Each node tries one byte on top of its parent's state; a byte the grammar refuses
 * skips the node's whole subtree (every token sharing that prefix) at once, and a save / restore
 * of the matcher's arena is three counters, so the walk costs one matcher step per live trie
 * node. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"
#include "util/error.h"

typedef struct trie_node {
    uint32_t next;      /* the first node after this one's subtree */
    uint32_t tok_first; /* this node's tokens: ids[tok_first .. tok_first + tok_count) */
    uint16_t tok_count;
    uint16_t depth;     /* bytes from the root: 1 for a first byte */
    uint16_t deepest;   /* the largest depth in the subtree */
    uint8_t byte;
} trie_node;

struct grammar_token_trie {
    int32_t vocab_size;
    uint8_t *bytes;     /* every token's bytes back to back */
    uint64_t *offset;   /* token id -> offset in bytes; offset[vocab_size] = total */
    trie_node *nodes;
    uint64_t (*below)[4]; /* per node: the bytes of its subtree (itself included), 256 bits */
    uint32_t n_nodes;
    int32_t n_tokens;
    int32_t *ids;       /* token ids by node (lexicographic order of their bytes) */
    int32_t *eos;
    int32_t n_eos;
    uint32_t max_depth;
};

/* The longest token the trie holds: longer ones (none in real vocabularies) never match. */
#define TRIE_MAX_TOKEN 1024

static const grammar_token_trie *sort_trie;

static int by_bytes(const void *pa, const void *pb) {
    const grammar_token_trie *t = sort_trie;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    uint64_t la = t->offset[a + 1] - t->offset[a], lb = t->offset[b + 1] - t->offset[b];
    int c = memcmp(t->bytes + t->offset[a], t->bytes + t->offset[b], la < lb ? la : lb);
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

nopad_status grammar_token_trie_create(const uint8_t *const *tokens, const uint32_t *lens,
                                       int32_t vocab_size, const int32_t *eos_ids, int32_t n_eos,
                                       grammar_token_trie **out) {
    *out = NULL;
    if (vocab_size <= 0 || n_eos < 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "token trie: vocab_size %d, %d EOS ids", vocab_size, n_eos);
    for (int32_t i = 0; i < n_eos; i++)
        if (eos_ids[i] < 0 || eos_ids[i] >= vocab_size)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "token trie: EOS id %d outside [0, %d)", eos_ids[i], vocab_size);
    grammar_token_trie *t = calloc(1, sizeof(*t));
    if (!t) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "token trie: out of memory");
    t->vocab_size = vocab_size;
    t->offset = malloc(((size_t)vocab_size + 1) * sizeof(uint64_t));
    uint64_t total = 0;
    int32_t n_tokens = 0;
    for (int32_t i = 0; i < vocab_size; i++) {
        uint32_t len = lens[i] <= TRIE_MAX_TOKEN ? lens[i] : 0;
        total += len;
        n_tokens += len > 0;
    }
    t->bytes = malloc(total ? total : 1);
    t->ids = malloc(((size_t)n_tokens + 1) * sizeof(int32_t));
    t->nodes = malloc((total ? total : 1) * sizeof(trie_node)); /* at most one node a byte */
    t->eos = malloc(((size_t)n_eos + 1) * sizeof(int32_t));
    if (!t->offset || !t->bytes || !t->ids || !t->nodes || !t->eos) {
        grammar_token_trie_free(t);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "token trie: out of memory for %d tokens", vocab_size);
    }
    if (n_eos) memcpy(t->eos, eos_ids, (size_t)n_eos * sizeof(int32_t));
    t->n_eos = n_eos;
    uint64_t at = 0;
    int32_t k = 0;
    for (int32_t i = 0; i < vocab_size; i++) {
        uint32_t len = lens[i] <= TRIE_MAX_TOKEN ? lens[i] : 0;
        t->offset[i] = at;
        if (len) memcpy(t->bytes + at, tokens[i], len);
        at += len;
        if (len) t->ids[k++] = i;
    }
    t->offset[vocab_size] = at;
    sort_trie = t;
    qsort(t->ids, (size_t)n_tokens, sizeof(int32_t), by_bytes);
    sort_trie = NULL;

    /* preorder: each token after its lexicographic predecessor shares a prefix of it, so only
     * the nodes below that prefix are new; a node's subtree ends when the path leaves it */
    uint32_t path[TRIE_MAX_TOKEN + 1];
    uint32_t depth = 0, n = 0;
    const uint8_t *prev = NULL;
    uint64_t prev_len = 0;
    for (int32_t j = 0; j < n_tokens; j++) {
        int32_t id = t->ids[j];
        const uint8_t *s = t->bytes + t->offset[id];
        uint64_t len = t->offset[id + 1] - t->offset[id];
        uint64_t common = 0;
        while (common < len && common < prev_len && s[common] == prev[common]) common++;
        while (depth > common) t->nodes[path[--depth]].next = n;
        for (; depth < len; depth++) {
            t->nodes[n] = (trie_node){0, (uint32_t)j, 0, (uint16_t)(depth + 1), (uint16_t)(depth + 1), s[depth]};
            path[depth] = n++;
        }
        trie_node *end = &t->nodes[path[len - 1]];
        if (end->tok_count == 0) end->tok_first = (uint32_t)j;
        end->tok_count++;
        if (len > t->max_depth) t->max_depth = (uint32_t)len;
        prev = s;
        prev_len = len;
    }
    while (depth > 0) t->nodes[path[--depth]].next = n;
    t->n_nodes = n;
    t->n_tokens = n_tokens;
    /* each subtree's bytes, children before parents: a node's parent is the nearest node
     * before it one level up */
    t->below = calloc(n ? n : 1, sizeof(t->below[0]));
    if (!t->below) {
        grammar_token_trie_free(t);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "token trie: out of memory for %u nodes", n);
    }
    for (uint32_t i = 0; i < n; i++) {
        uint8_t b = t->nodes[i].byte;
        t->below[i][b >> 6] |= 1ull << (b & 63);
    }
    {
        uint32_t *parent = malloc((n ? n : 1) * sizeof(uint32_t));
        if (!parent) {
            grammar_token_trie_free(t);
            return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "token trie: out of memory for %u nodes", n);
        }
        for (uint32_t i = 0; i < n; i++) {
            uint32_t d = t->nodes[i].depth;
            path[d - 1] = i;
            parent[i] = d > 1 ? path[d - 2] : UINT32_MAX;
        }
        for (uint32_t i = n; i-- > 0;) {
            if (parent[i] == UINT32_MAX) continue;
            for (int w = 0; w < 4; w++) t->below[parent[i]][w] |= t->below[i][w];
            if (t->nodes[i].deepest > t->nodes[parent[i]].deepest) t->nodes[parent[i]].deepest = t->nodes[i].deepest;
        }
        free(parent);
    }
    *out = t;
    return NOPAD_OK;
}

void grammar_token_trie_free(grammar_token_trie *t) {
    if (!t) return;
    free(t->bytes);
    free(t->offset);
    free(t->nodes);
    free(t->below);
    free(t->ids);
    free(t->eos);
    free(t);
}

int32_t grammar_token_trie_vocab_size(const grammar_token_trie *t) { return t->vocab_size; }

const uint8_t *grammar_token_trie_token(const grammar_token_trie *t, int32_t id, uint32_t *len) {
    if (id < 0 || id >= t->vocab_size) {
        *len = 0;
        return NULL;
    }
    *len = (uint32_t)(t->offset[id + 1] - t->offset[id]);
    return t->bytes + t->offset[id];
}

/* What one byte does from the mask's starting state: LOOP_SAME leads back to it (a free
 * string's character), LOOP_COUNT back to it with one counted repetition one further (a bounded
 * string's character), LOOP_OTHER elsewhere, LOOP_DEAD nowhere. */
enum { LOOP_UNKNOWN, LOOP_DEAD, LOOP_OTHER, LOOP_SAME, LOOP_COUNT };

typedef struct mask_walk {
    const grammar_token_trie *t;
    grammar_matcher *m;
    grammar_mark start;
    uint8_t loop[256];
    uint32_t counter, slack; /* the repetition LOOP_COUNT bytes advance, and its slack */
    int have_counter;
    /* the walk's path (depths 1..depth): a classification truncates the matcher to the start,
     * so every real state on the path other than the start itself (a detour's, or the start's
     * with the counter further) must be replayed again after it */
    uint8_t *real;
    const uint8_t *in_start;
    const uint32_t *units;
    uint32_t depth;
} mask_walk;

/* 1 when the matcher's current state is the start's with the counter `*units` further (0: the
 * start itself) within the slack: the walk may go on as from the start. */
static int back_at_start(mask_walk *w, uint32_t *units) {
    uint32_t counter, slack, delta;
    if (grammar_matcher_same_state(w->m, w->start)) {
        *units = 0;
        return 1;
    }
    if (!grammar_matcher_counted_step(w->m, w->start, &counter, &slack, &delta)) return 0;
    if (w->have_counter && counter != w->counter) return 0;
    w->counter = counter;
    w->slack = slack;
    w->have_counter = 1;
    *units = delta;
    return delta <= slack;
}

static uint8_t classify(mask_walk *w, uint8_t b) {
    if (w->loop[b] != LOOP_UNKNOWN) return w->loop[b];
    for (uint32_t k = 1; k <= w->depth; k++)
        if (w->units[k] > 0 || !w->in_start[k]) w->real[k] = 0;
    grammar_matcher_restore(w->m, w->start);
    uint8_t c;
    uint32_t units;
    if (!grammar_matcher_accept(w->m, b)) c = LOOP_DEAD;
    else if (back_at_start(w, &units)) c = units == 0 ? LOOP_SAME : units == 1 ? LOOP_COUNT : LOOP_OTHER;
    else c = LOOP_OTHER;
    w->loop[b] = c;
    return c;
}

/* 1 when every path below node i (at `units` counted steps) stays in the starting state's
 * shape: its bytes all LOOP_SAME or LOOP_COUNT, and the deepest path within the slack. */
static int subtree_loops(mask_walk *w, uint32_t i, uint32_t units) {
    int counted = 0;
    for (int k = 0; k < 4; k++) {
        for (uint64_t bits = w->t->below[i][k]; bits; bits &= bits - 1) {
            uint8_t c = classify(w, (uint8_t)(k * 64 + __builtin_ctzll(bits)));
            if (c == LOOP_COUNT) counted = 1;
            else if (c != LOOP_SAME) return 0;
        }
    }
    const trie_node *nd = &w->t->nodes[i];
    /* the node's own byte is counted in units already */
    return !counted || units + (uint32_t)(nd->deepest - nd->depth) <= w->slack;
}

/* 1 when every byte that occurs below node i leads from the state saved at `mark` (the state
 * after node i's bytes, real) back to that same state: every path below then stays alive, and
 * all the subtree's tokens pass. The state a detour reaches (the first character of a domain
 * label after its dot, a number's first digit) often loops on itself like this, though it is not
 * the walk's start. Leaves the matcher anywhere past `mark`. */
static int subtree_loops_at(grammar_matcher *m, const grammar_token_trie *t, uint32_t i, grammar_mark mark) {
    for (int k = 0; k < 4; k++) {
        for (uint64_t bits = t->below[i][k]; bits; bits &= bits - 1) {
            grammar_matcher_restore(m, mark);
            if (!grammar_matcher_accept(m, (uint8_t)(k * 64 + __builtin_ctzll(bits))) ||
                !grammar_matcher_same_state(m, mark))
                return 0;
        }
    }
    return 1;
}

/* Subtrees smaller than this are walked node by node (the loop test costs up to a matcher step
 * per distinct byte below). 4, 8 and 32 time the same on SmolLM2's vocabulary; at 4 the random
 * vocabularies of test_grammar's brute force reach the test too. */
#define LOOP_TEST_MIN_NODES 4

static void allow(const grammar_token_trie *t, uint32_t first, uint32_t end, uint32_t *mask) {
    for (uint32_t k = first; k < end; k++) {
        int32_t id = t->ids[k];
        mask[id >> 5] |= 1u << (id & 31);
    }
}

int32_t grammar_token_mask(const grammar_token_trie *t, grammar_matcher *m, uint32_t *mask) {
    const size_t words = ((size_t)t->vocab_size + 31) / 32;
    int32_t kept = 0;
    if (grammar_matcher_kept_find(m, t, mask, words, &kept)) return kept;
    memset(mask, 0, words * sizeof(uint32_t));
    mask_walk w = {t, m, grammar_matcher_save(m), {0}, 0, 0, 0, NULL, NULL, NULL, 0};
    /* per depth d of the current path: marks[d] the matcher's state after its bytes (when
     * real[d]); in_start[d]: every byte so far was LOOP_SAME or LOOP_COUNT, units[d] of the
     * latter, so the state is the start's with the counter units further and needs no matcher
     * step of its own; bytes[d] the path, replayed when such a state is needed for real */
    grammar_mark marks[TRIE_MAX_TOKEN + 1];
    uint8_t in_start[TRIE_MAX_TOKEN + 1], real[TRIE_MAX_TOKEN + 1], bytes[TRIE_MAX_TOKEN + 1];
    uint32_t units[TRIE_MAX_TOKEN + 1];
    marks[0] = w.start;
    in_start[0] = real[0] = 1;
    units[0] = 0;
    w.real = real;
    w.in_start = in_start;
    w.units = units;
    int32_t allowed = 0;
    for (uint32_t i = 0; i < t->n_nodes;) {
        const trie_node *nd = &t->nodes[i];
        uint32_t d = nd->depth;
        bytes[d] = nd->byte;
        w.depth = d - 1; /* the path above this node */
        int ok;
        uint8_t c = in_start[d - 1] ? classify(&w, nd->byte) : LOOP_UNKNOWN;
        if (c == LOOP_DEAD) {
            ok = 0;
        } else if (c == LOOP_SAME || (c == LOOP_COUNT && units[d - 1] + 1 <= w.slack)) {
            ok = 1;
            in_start[d] = 1;
            units[d] = units[d - 1] + (c == LOOP_COUNT);
            real[d] = units[d] == 0;
            marks[d] = w.start;
            w.depth = d;
            if (nd->next > i + 1 && subtree_loops(&w, i, units[d])) {
                /* every path below stays in the start's shape: all the subtree's tokens */
                uint32_t end = nd->next < t->n_nodes ? t->nodes[nd->next].tok_first : (uint32_t)t->n_tokens;
                allow(t, nd->tok_first, end, mask);
                allowed += (int32_t)(end - nd->tok_first);
                i = nd->next;
                continue;
            }
        } else {
            if (!real[d - 1]) {
                /* the path's state, truncated by a classification since or never made (the start's
                 * with the counter further): replay the path to have it */
                grammar_matcher_restore(m, w.start);
                int replayed = 1;
                for (uint32_t k = 1; k < d && replayed; k++) replayed = grammar_matcher_accept(m, bytes[k]);
                if (!replayed) { /* cannot happen: the classification said these bytes pass */
                    i = nd->next;
                    continue;
                }
                marks[d - 1] = grammar_matcher_save(m);
                real[d - 1] = 1;
            }
            grammar_matcher_restore(m, marks[d - 1]);
            ok = grammar_matcher_accept(m, nd->byte);
            marks[d] = grammar_matcher_save(m);
            real[d] = 1;
            /* back in the start's shape after a detour (a UTF-8 character's bytes): on from
             * there as from the start */
            in_start[d] = ok && d < nd->deepest && back_at_start(&w, &units[d]);
            if (!in_start[d]) units[d] = 0;
            else if (units[d] == 0) marks[d] = w.start; /* the same state, and never truncated */
            if (ok && !in_start[d] && nd->next >= i + LOOP_TEST_MIN_NODES && subtree_loops_at(m, t, i, marks[d])) {
                uint32_t end = nd->next < t->n_nodes ? t->nodes[nd->next].tok_first : (uint32_t)t->n_tokens;
                allow(t, nd->tok_first, end, mask);
                allowed += (int32_t)(end - nd->tok_first);
                i = nd->next;
                continue;
            }
        }
        if (!ok) {
            i = nd->next;
            continue;
        }
        allow(t, nd->tok_first, nd->tok_first + nd->tok_count, mask);
        allowed += nd->tok_count;
        i++;
    }
    grammar_matcher_restore(m, w.start);
    if (grammar_matcher_is_accepting(m)) {
        for (int32_t k = 0; k < t->n_eos; k++) {
            int32_t id = t->eos[k];
            if (!((mask[id >> 5] >> (id & 31)) & 1)) allowed++;
            mask[id >> 5] |= 1u << (id & 31);
        }
    }
    grammar_matcher_kept_put(m, t, mask, words, allowed);
    return allowed;
}

int grammar_matcher_accept_token(grammar_matcher *m, const grammar_token_trie *t, int32_t id) {
    for (int32_t k = 0; k < t->n_eos; k++)
        if (t->eos[k] == id) return grammar_matcher_is_accepting(m);
    uint32_t len;
    const uint8_t *s = grammar_token_trie_token(t, id, &len);
    if (!s || len == 0) return 0;
    return grammar_matcher_accept_bytes(m, s, len);
}

/* ---- a tokenizer's vocabulary as bytes ----------------------------------------------------------- */

nopad_status grammar_token_trie_from_tokenizer(const nopad_tokenizer *tok, const int32_t *eos_ids,
                                               int32_t n_eos, grammar_token_trie **out) {
    *out = NULL;
    nopad_tokenizer_kind kind = nopad_tokenizer_get_kind(tok);
    if (kind != NOPAD_TOKENIZER_BPE_BYTE_LEVEL && kind != NOPAD_TOKENIZER_BPE_SENTENCEPIECE)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "token trie: a %s tokenizer (constrained decoding "
                               "needs bpe-byte-level or bpe-sentencepiece)", nopad_tokenizer_kind_name(kind));
    int32_t vocab = nopad_tokenizer_vocab_size(tok);
    uint32_t *lens = calloc((size_t)vocab + 1, sizeof(uint32_t));
    const uint8_t **ptrs = calloc((size_t)vocab + 1, sizeof(*ptrs));
    /* each token's bytes (nopad_tokenizer_token_bytes: special and added tokens have none), back to
     * back; no token has more bytes than its spelling (a byte is one character or more there) */
    size_t total = 0;
    for (int32_t id = 0; id < vocab; id++) {
        size_t len = 0;
        if (nopad_tokenizer_id_to_token(tok, id, &len)) total += len;
    }
    uint8_t *bytes = malloc(total + 1);
    if (!lens || !ptrs || !bytes) {
        free(lens);
        free(ptrs);
        free(bytes);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "token trie: out of memory for %d tokens", vocab);
    }
    size_t at = 0;
    for (int32_t id = 0; id < vocab; id++) {
        ptrs[id] = bytes + at;
        size_t len = 0;
        if (nopad_tokenizer_token_bytes(tok, id, bytes + at, total - at, &len) != NOPAD_OK) len = 0;
        lens[id] = (uint32_t)len;
        at += len;
    }
    nopad_status st = grammar_token_trie_create(ptrs, lens, vocab, eos_ids, n_eos, out);
    free(lens);
    free(ptrs);
    free(bytes);
    return st;
}
