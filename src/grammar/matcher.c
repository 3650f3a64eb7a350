/* The incremental matcher: the set of parse stacks the bytes so far leave open.
 *
 * A stack is a chain of nodes (pos, parent, count): pos is the element to match next in some
 * alternative, parent the node to continue from when that alternative ends, count the
 * repetitions a counted repetition (GRAM_REPEAT at pos) has done. Every stack's top
 * waits on a byte set; accepting a byte advances each top whose set holds it and expands the
 * result (entering referenced rules, leaving finished ones) until every new top waits on a byte
 * set again, or the whole grammar has ended (the ACCEPT top).
 *
 * Nodes, tops and the start of each state live in three arrays that only grow along a path, so a
 * save is three counters and a restore truncates them: the mask walk tries a token's bytes and
 * rolls back in O(1). Nodes are interned on (pos, parent, count), so equal stacks are one node
 * and the set of stacks stays a set, whatever ambiguity the grammar has ((a?)*** would otherwise
 * multiply its stacks at every byte); within a step, an expansion reached twice (x* with x
 * empty) stops there. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"
#include "util/error.h"

#define NO_NODE UINT32_MAX
#define TOP_ACCEPT UINT32_MAX
/* Rule entries without consuming a byte, nested: only a left-recursive grammar ($ref cycles
 * with nothing consumed between) goes this deep; its deeper stacks are dropped. */
#define MAX_EXPAND_DEPTH 512

typedef struct mnode {
    uint32_t pos, parent;
    uint32_t count; /* at a GRAM_REPEAT: the repetitions done once the one under way ends */
} mnode;

/* The intern table's entry: (pos, parent, count) -> node. An entry whose node was rolled back
 * (id past the arena or holding other content) is stale, and is overwritten when met. */
typedef struct islot {
    uint32_t pos, parent, count, node;
} islot;

/* This step's expansions done: (pos, parent, count) with the step's stamp. */
typedef struct eslot {
    uint32_t pos, parent, count, stamp;
} eslot;

#define MASK_CACHE_ENTRIES 4
#define MASK_CACHE_KEY 256 /* the longest state key cached, in words */

typedef struct mask_cache_entry {
    const void *trie;   /* the vocabulary the mask is of (NULL: an empty entry) */
    uint32_t *key;      /* [MASK_CACHE_KEY] the state (grammar_matcher_state_key) */
    uint32_t key_len;
    uint32_t *mask;     /* [words] */
    size_t words;
    int32_t allowed;
    uint64_t used;      /* cache_clock at the last hit or fill: the oldest is replaced */
} mask_cache_entry;

struct grammar_matcher {
    const grammar *g;
    mnode *nodes;
    uint32_t n_nodes, cap_nodes;
    uint32_t *tops;
    uint32_t n_tops, cap_tops;
    uint32_t *states; /* the first top of each state; the current state is the last */
    uint32_t n_states, cap_states;
    islot *intern;
    uint32_t intern_mask, intern_used;
    eslot *expanded;
    uint32_t expanded_mask, expanded_used, stamp;
    int failed;       /* out of memory inside a step: the step fails (the byte is refused) */
    /* the masks of the last states seen (grammar_matcher_kept_*): a free string's characters come
     * back to the same state token after token, and its mask is then a copy */
    mask_cache_entry cache[MASK_CACHE_ENTRIES];
    uint64_t cache_clock, cache_hits;
};

static int grow(void **ptr, uint32_t *cap, uint32_t need, size_t elem) {
    if (need <= *cap) return 1;
    uint32_t cap2 = *cap ? *cap * 2 : 64;
    while (cap2 < need) cap2 *= 2;
    void *p = realloc(*ptr, (size_t)cap2 * elem);
    if (!p) return 0;
    *ptr = p;
    *cap = cap2;
    return 1;
}

static uint32_t push_top(grammar_matcher *m, uint32_t top) {
    if (!grow((void **)&m->tops, &m->cap_tops, m->n_tops + 1, sizeof(uint32_t))) {
        m->failed = 1;
        return 0;
    }
    m->tops[m->n_tops++] = top;
    return 1;
}

static uint32_t key_hash(uint32_t pos, uint32_t parent, uint32_t count) {
    return pos * 0x9E3779B1u ^ parent * 0x85EBCA77u ^ count * 0xC2B2AE3Du;
}

static int node_is(const grammar_matcher *m, uint32_t id, uint32_t pos, uint32_t parent, uint32_t count) {
    return id < m->n_nodes && m->nodes[id].pos == pos && m->nodes[id].parent == parent &&
           m->nodes[id].count == count;
}

/* Rebuilds the intern table with its live entries only, doubling it when they fill a quarter. */
static int intern_rehash(grammar_matcher *m) {
    uint32_t live = 0;
    for (uint32_t i = 0; i <= m->intern_mask; i++) {
        islot *e = &m->intern[i];
        live += e->node != NO_NODE && node_is(m, e->node, e->pos, e->parent, e->count);
    }
    uint32_t cap = m->intern_mask + 1;
    while (live * 4 >= cap) cap *= 2;
    islot *t = malloc((size_t)cap * sizeof(islot));
    if (!t) return 0;
    memset(t, 0xFF, (size_t)cap * sizeof(islot));
    uint32_t used = 0;
    for (uint32_t i = 0; i <= m->intern_mask; i++) {
        islot *e = &m->intern[i];
        if (e->node == NO_NODE || !node_is(m, e->node, e->pos, e->parent, e->count)) continue;
        uint32_t h = key_hash(e->pos, e->parent, e->count) & (cap - 1);
        while (t[h].node != NO_NODE) h = (h + 1) & (cap - 1);
        t[h] = *e;
        used++;
    }
    free(m->intern);
    m->intern = t;
    m->intern_mask = cap - 1;
    m->intern_used = used;
    return 1;
}

static void intern_clear(grammar_matcher *m) {
    memset(m->intern, 0xFF, (size_t)(m->intern_mask + 1) * sizeof(islot));
    m->intern_used = 0;
}

/* The node (pos, parent, count): the live one of that content, or a new one. */
static uint32_t node_of(grammar_matcher *m, uint32_t pos, uint32_t parent, uint32_t count) {
    if ((m->intern_used + 1) * 2 > m->intern_mask && !intern_rehash(m)) {
        m->failed = 1;
        return NO_NODE;
    }
    uint32_t h = key_hash(pos, parent, count) & m->intern_mask;
    islot *e;
    for (;; h = (h + 1) & m->intern_mask) {
        e = &m->intern[h];
        if (e->node == NO_NODE) {
            m->intern_used++;
            break;
        }
        if (e->pos == pos && e->parent == parent && e->count == count) {
            if (node_is(m, e->node, pos, parent, count)) return e->node;
            break; /* stale: rolled back; the new node takes the entry */
        }
    }
    if (!grow((void **)&m->nodes, &m->cap_nodes, m->n_nodes + 1, sizeof(mnode))) {
        m->failed = 1;
        return NO_NODE;
    }
    m->nodes[m->n_nodes] = (mnode){pos, parent, count};
    *e = (islot){pos, parent, count, m->n_nodes};
    return m->n_nodes++;
}

static int expanded_rehash(grammar_matcher *m) {
    uint32_t cap = (m->expanded_mask + 1) * 2;
    eslot *t = calloc(cap, sizeof(eslot));
    if (!t) return 0;
    for (uint32_t i = 0; i <= m->expanded_mask; i++) {
        eslot *e = &m->expanded[i];
        if (e->stamp != m->stamp) continue;
        uint32_t h = key_hash(e->pos, e->parent, e->count) & (cap - 1);
        while (t[h].stamp == m->stamp) h = (h + 1) & (cap - 1);
        t[h] = *e;
    }
    free(m->expanded);
    m->expanded = t;
    m->expanded_mask = cap - 1;
    return 1;
}

/* Marks (pos, parent, count) expanded in this step: 1 when it was not yet, 0 when it was, -1
 * when out of memory. */
static int first_expansion(grammar_matcher *m, uint32_t pos, uint32_t parent, uint32_t count) {
    if ((m->expanded_used + 1) * 2 > m->expanded_mask && !expanded_rehash(m)) return -1;
    uint32_t h = key_hash(pos, parent, count) & m->expanded_mask;
    for (;; h = (h + 1) & m->expanded_mask) {
        eslot *e = &m->expanded[h];
        if (e->stamp != m->stamp) {
            *e = (eslot){pos, parent, count, m->stamp};
            m->expanded_used++;
            return 1;
        }
        if (e->pos == pos && e->parent == parent && e->count == count) return 0;
    }
}

static void new_step(grammar_matcher *m) {
    m->expanded_used = 0;
    if (++m->stamp == 0) { /* the stamps wrapped: old entries could look current */
        memset(m->expanded, 0, (m->expanded_mask + 1) * sizeof(eslot));
        m->stamp = 1;
    }
}

static void expand(grammar_matcher *m, uint32_t pos, uint32_t parent, uint32_t count, int depth) {
    const grammar *g = m->g;
    for (;;) {
        if (depth > MAX_EXPAND_DEPTH || m->failed) return;
        uint32_t e = g->elems[pos];
        if (GRAM_KIND(e) == GRAM_END) {
            if (parent == NO_NODE) {
                /* the whole grammar ended: once per step */
                int first = first_expansion(m, UINT32_MAX, UINT32_MAX, UINT32_MAX);
                if (first < 0) m->failed = 1;
                else if (first) push_top(m, TOP_ACCEPT);
                return;
            }
            mnode p = m->nodes[parent];
            pos = p.pos;
            parent = p.parent;
            count = p.count;
            depth++;
            continue;
        }
        int first = first_expansion(m, pos, parent, count);
        if (first < 0) m->failed = 1;
        if (first <= 0) return;
        if (GRAM_KIND(e) == GRAM_CHAR) {
            uint32_t n = node_of(m, pos, parent, 0);
            if (n != NO_NODE) push_top(m, n);
            return;
        }
        uint32_t rule = GRAM_ARG(e);
        if (GRAM_KIND(e) == GRAM_REPEAT) {
            /* count repetitions done: past min, what follows may come; below max, one more
             * (whose end comes back here with count + 1; an unbounded count stops at min,
             * where more no longer changes anything) */
            const grammar_repeat *r = &g->repeat[rule];
            if (count >= r->min) expand(m, pos + 1, parent, 0, depth + 1);
            if (count < r->max) {
                uint32_t next = r->max == UINT32_MAX && count >= r->min ? count : count + 1;
                uint32_t ret = node_of(m, pos, parent, next);
                if (ret == NO_NODE) return;
                for (uint32_t a = g->rule_alt0[r->body]; a < g->rule_alt0[r->body + 1]; a++)
                    expand(m, g->alt_start[a], ret, 0, depth + 1);
            }
            return;
        }
        /* a rule reference: continue after it when the rule ends (the caller's own
         * continuation when the reference ends its alternative, so x R loops stay flat) */
        uint32_t ret = parent;
        if (GRAM_KIND(g->elems[pos + 1]) != GRAM_END) {
            ret = node_of(m, pos + 1, parent, 0);
            if (ret == NO_NODE) return;
        }
        for (uint32_t a = g->rule_alt0[rule]; a < g->rule_alt0[rule + 1]; a++)
            expand(m, g->alt_start[a], ret, 0, depth + 1);
        return;
    }
}

static int begin_state(grammar_matcher *m) {
    if (!grow((void **)&m->states, &m->cap_states, m->n_states + 1, sizeof(uint32_t))) return 0;
    m->states[m->n_states++] = m->n_tops;
    return 1;
}

void grammar_matcher_reset(grammar_matcher *m) {
    m->n_nodes = m->n_tops = m->n_states = 0;
    m->failed = 0;
    intern_clear(m);
    begin_state(m); /* capacity reserved at creation: cannot fail */
    new_step(m);
    const grammar *g = m->g;
    for (uint32_t a = g->rule_alt0[g->root]; a < g->rule_alt0[g->root + 1]; a++)
        expand(m, g->alt_start[a], NO_NODE, 0, 0);
}

nopad_status grammar_matcher_create(const grammar *g, grammar_matcher **out) {
    *out = NULL;
    grammar_matcher *m = calloc(1, sizeof(*m));
    if (!m) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "grammar matcher: out of memory");
    m->g = g;
    m->intern_mask = m->expanded_mask = 255;
    m->intern = malloc((m->intern_mask + 1) * sizeof(islot));
    m->expanded = calloc(m->expanded_mask + 1, sizeof(eslot));
    if (!m->intern || !m->expanded || !grow((void **)&m->states, &m->cap_states, 64, sizeof(uint32_t))) {
        grammar_matcher_free(m);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "grammar matcher: out of memory");
    }
    grammar_matcher_reset(m);
    if (m->failed) {
        grammar_matcher_free(m);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "grammar matcher: out of memory");
    }
    *out = m;
    return NOPAD_OK;
}

void grammar_matcher_free(grammar_matcher *m) {
    if (!m) return;
    free(m->nodes);
    free(m->tops);
    free(m->states);
    free(m->intern);
    free(m->expanded);
    for (int i = 0; i < MASK_CACHE_ENTRIES; i++) {
        free(m->cache[i].key);
        free(m->cache[i].mask);
    }
    free(m);
}

grammar_mark grammar_matcher_save(const grammar_matcher *m) {
    return (grammar_mark){m->n_nodes, m->n_tops, m->n_states};
}

void grammar_matcher_restore(grammar_matcher *m, grammar_mark mark) {
    m->n_nodes = mark.nodes;
    m->n_tops = mark.tops;
    m->n_states = mark.states;
}

int grammar_matcher_accept(grammar_matcher *m, uint8_t byte) {
    grammar_mark before = grammar_matcher_save(m);
    uint32_t first = m->states[m->n_states - 1], last = m->n_tops;
    if (!begin_state(m)) return 0;
    new_step(m);
    m->failed = 0;
    const grammar *g = m->g;
    uint32_t word = byte >> 5, bit = 1u << (byte & 31);
    for (uint32_t i = first; i < last; i++) {
        uint32_t t = m->tops[i];
        if (t == TOP_ACCEPT) continue;
        mnode n = m->nodes[t];
        if (g->sets[GRAM_ARG(g->elems[n.pos])][word] & bit) expand(m, n.pos + 1, n.parent, 0, 0);
    }
    if (m->failed || m->n_tops == last) {
        grammar_matcher_restore(m, before);
        m->failed = 0;
        return 0;
    }
    return 1;
}

int grammar_matcher_accept_bytes(grammar_matcher *m, const uint8_t *bytes, size_t n) {
    grammar_mark before = grammar_matcher_save(m);
    for (size_t i = 0; i < n; i++) {
        if (!grammar_matcher_accept(m, bytes[i])) {
            grammar_matcher_restore(m, before);
            return 0;
        }
    }
    return 1;
}

int grammar_matcher_is_accepting(const grammar_matcher *m) {
    for (uint32_t i = m->states[m->n_states - 1]; i < m->n_tops; i++)
        if (m->tops[i] == TOP_ACCEPT) return 1;
    return 0;
}

int grammar_matcher_can_continue(const grammar_matcher *m) {
    for (uint32_t i = m->states[m->n_states - 1]; i < m->n_tops; i++)
        if (m->tops[i] != TOP_ACCEPT) return 1;
    return 0;
}

nopad_status grammar_matcher_commit(grammar_matcher *m) {
    /* copy the nodes the current tops reach, parents first, into fresh arrays */
    uint32_t first = m->states[m->n_states - 1], count = m->n_tops - first;
    uint32_t *map = malloc((size_t)(m->n_nodes ? m->n_nodes : 1) * sizeof(uint32_t));
    mnode *nodes = malloc((size_t)(m->n_nodes ? m->n_nodes : 1) * sizeof(mnode));
    uint32_t *chain = malloc((size_t)(m->n_nodes ? m->n_nodes : 1) * sizeof(uint32_t));
    if (!map || !nodes || !chain) {
        free(map);
        free(nodes);
        free(chain);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "grammar matcher: out of memory compacting");
    }
    memset(map, 0xFF, (size_t)m->n_nodes * sizeof(uint32_t));
    uint32_t n_new = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t t = m->tops[first + i];
        if (t == TOP_ACCEPT) continue;
        uint32_t len = 0;
        for (uint32_t x = t; x != NO_NODE && map[x] == NO_NODE; x = m->nodes[x].parent) chain[len++] = x;
        while (len > 0) {
            uint32_t x = chain[--len];
            uint32_t p = m->nodes[x].parent;
            nodes[n_new] = (mnode){m->nodes[x].pos, p == NO_NODE ? NO_NODE : map[p], m->nodes[x].count};
            map[x] = n_new++;
        }
    }
    for (uint32_t i = 0; i < count; i++) {
        uint32_t t = m->tops[first + i];
        m->tops[i] = t == TOP_ACCEPT ? TOP_ACCEPT : map[t];
    }
    if (n_new) memcpy(m->nodes, nodes, (size_t)n_new * sizeof(mnode));
    m->n_nodes = n_new;
    m->n_tops = count;
    m->states[0] = 0;
    m->n_states = 1;
    intern_clear(m); /* the ids changed: the entries would only be stale */
    free(map);
    free(nodes);
    free(chain);
    return NOPAD_OK;
}

/* Stacks a and b hold the same positions all the way down. */
static int same_stack(const grammar_matcher *m, uint32_t a, uint32_t b) {
    while (a != b) {
        if (a == NO_NODE || b == NO_NODE || m->nodes[a].pos != m->nodes[b].pos ||
            m->nodes[a].count != m->nodes[b].count)
            return 0;
        a = m->nodes[a].parent;
        b = m->nodes[b].parent;
    }
    return 1;
}

int grammar_matcher_same_state(const grammar_matcher *m, grammar_mark mark) {
    uint32_t a0 = m->states[mark.states - 1], an = mark.tops - a0;
    uint32_t b0 = m->states[m->n_states - 1], bn = m->n_tops - b0;
    if (an != bn) return 0;
    for (uint32_t i = 0; i < an; i++) {
        uint32_t a = m->tops[a0 + i], b = m->tops[b0 + i];
        if ((a == TOP_ACCEPT) != (b == TOP_ACCEPT)) return 0;
        if (a != TOP_ACCEPT && !same_stack(m, a, b)) return 0;
    }
    return 1;
}

int grammar_matcher_counted_step(const grammar_matcher *m, grammar_mark mark, uint32_t *counter,
                                 uint32_t *slack, uint32_t *delta) {
    uint32_t a0 = m->states[mark.states - 1], an = mark.tops - a0;
    uint32_t b0 = m->states[m->n_states - 1], bn = m->n_tops - b0;
    if (an != bn) return 0;
    uint32_t diff = NO_NODE, by = 0;
    for (uint32_t i = 0; i < an; i++) {
        uint32_t a = m->tops[a0 + i], b = m->tops[b0 + i];
        if ((a == TOP_ACCEPT) != (b == TOP_ACCEPT)) return 0;
        if (a == TOP_ACCEPT) continue;
        while (a != b) {
            if (a == NO_NODE || b == NO_NODE) return 0;
            mnode na = m->nodes[a], nb = m->nodes[b];
            if (na.pos != nb.pos) return 0;
            if (na.count != nb.count) {
                if (nb.count < na.count || GRAM_KIND(m->g->elems[na.pos]) != GRAM_REPEAT) return 0;
                if (diff != NO_NODE && (diff != a || nb.count - na.count != by)) return 0;
                diff = a;
                by = nb.count - na.count;
            }
            a = na.parent;
            b = nb.parent;
        }
    }
    if (diff == NO_NODE) return 0;
    /* the node's count is the repetitions done once the current one ends: done = count - 1.
     * The shape stays while done stays on the same side of min and below max. */
    const grammar_repeat *r = &m->g->repeat[GRAM_ARG(m->g->elems[m->nodes[diff].pos])];
    uint32_t done = m->nodes[diff].count - 1;
    uint32_t limit = r->max;
    if (done < r->min && r->min < limit) limit = r->min;
    *counter = diff;
    *slack = limit - done - 1;
    *delta = by;
    return 1;
}

uint32_t grammar_matcher_state_key(const grammar_matcher *m, uint32_t *key, uint32_t cap) {
    uint32_t n = 0;
    for (uint32_t i = m->states[m->n_states - 1]; i < m->n_tops; i++) {
        for (uint32_t x = m->tops[i]; x != TOP_ACCEPT && x != NO_NODE; x = m->nodes[x].parent) {
            if (n + 3 > cap) return 0;
            key[n++] = m->nodes[x].pos;
            key[n++] = m->nodes[x].count;
        }
        if (n + 1 > cap) return 0;
        key[n++] = m->tops[i] == TOP_ACCEPT ? UINT32_MAX - 1 : UINT32_MAX;
    }
    return n;
}

/* ---- the masks of recent states ------------------------------------------------------------ */

int grammar_matcher_kept_find(grammar_matcher *m, const void *trie, uint32_t *mask, size_t words, int32_t *allowed) {
    uint32_t key[MASK_CACHE_KEY];
    const uint32_t n = grammar_matcher_state_key(m, key, MASK_CACHE_KEY);
    if (n == 0) return 0;
    for (int i = 0; i < MASK_CACHE_ENTRIES; i++) {
        mask_cache_entry *c = &m->cache[i];
        if (c->trie != trie || c->words != words || c->key_len != n || memcmp(c->key, key, n * sizeof *key) != 0)
            continue;
        memcpy(mask, c->mask, words * sizeof *mask);
        *allowed = c->allowed;
        c->used = ++m->cache_clock;
        m->cache_hits++;
        return 1;
    }
    return 0;
}

void grammar_matcher_kept_put(grammar_matcher *m, const void *trie, const uint32_t *mask, size_t words,
                            int32_t allowed) {
    uint32_t key[MASK_CACHE_KEY];
    const uint32_t n = grammar_matcher_state_key(m, key, MASK_CACHE_KEY);
    if (n == 0) return; /* a state too large to key: not cached */
    mask_cache_entry *c = &m->cache[0];
    for (int i = 1; i < MASK_CACHE_ENTRIES; i++)
        if (m->cache[i].used < c->used) c = &m->cache[i];
    if (!c->key) c->key = malloc(MASK_CACHE_KEY * sizeof *c->key);
    if (c->words != words) {
        free(c->mask);
        c->mask = malloc(words * sizeof *c->mask);
        c->words = words;
    }
    if (!c->key || !c->mask) { /* out of memory: the entry stays empty, masks are computed */
        c->trie = NULL;
        c->words = 0;
        return;
    }
    memcpy(c->key, key, n * sizeof *key);
    c->key_len = n;
    memcpy(c->mask, mask, words * sizeof *mask);
    c->allowed = allowed;
    c->trie = trie;
    c->used = ++m->cache_clock;
}

uint64_t grammar_matcher_kept_hits(const grammar_matcher *m) { return m->cache_hits; }

const grammar *grammar_matcher_grammar(const grammar_matcher *m) { return m->g; }
