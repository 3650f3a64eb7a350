/* Two texts in the tokenizer's pair template (a cross-encoder's query and document, an NLI
 * premise and hypothesis), truncated as Hugging Face's longest_first does it. */
#include <stdlib.h>

#include "io/tokenizer_internal.h"
#include "util/error.h"

/* Ids of `text` without special tokens, in a fresh buffer (*out, *n). */
static nopad_status tokenize_alone(const nopad_tokenizer *tok, const char *text, size_t len,
                                   int32_t **out, int32_t *n) {
    nopad_tokenize_params p = nopad_tokenize_default_params();
    p.add_special_tokens = 0;
    int32_t need = 0;
    nopad_status st = nopad_tokenize(tok, text, len, &p, NULL, 0, &need);
    if (st != NOPAD_OK && st != NOPAD_ERR_BUFFER_TOO_SMALL) return st;
    nopad_clear_error();
    *out = malloc((size_t)(need ? need : 1) * sizeof(int32_t));
    if (!*out) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_tokenize_pair: out of memory");
    return nopad_tokenize(tok, text, len, &p, *out, need, n);
}

nopad_status nopad_tokenize_pair(const nopad_tokenizer *tok, const char *a, size_t a_len,
                                 const char *b, size_t b_len, const nopad_tokenize_params *params,
                                 int32_t *ids, int32_t *types, int32_t capacity, int32_t *n_ids) {
    if (!tok || !a || !b || !n_ids || (capacity > 0 && !ids))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_tokenize_pair: NULL argument");
    *n_ids = 0;
    const nopad_tokenize_params p = params ? *params : nopad_tokenize_default_params();
    /* the template: the tokenizer's, or $A:0 $B:1 when it has none */
    static const int32_t bare[] = {TOK_PAIR_A, 0, TOK_PAIR_B, 1};
    const int32_t *tmpl = tok->n_pair_template ? tok->pair_template : bare;
    const int32_t n_tmpl = tok->n_pair_template ? tok->n_pair_template : 2;
    int32_t n_special = 0;
    if (p.add_special_tokens)
        for (int32_t i = 0; i < n_tmpl; i++) n_special += tmpl[2 * i] >= 0;

    int32_t *ia = NULL, *ib = NULL, na = 0, nb = 0;
    nopad_status st = tokenize_alone(tok, a, a_len, &ia, &na);
    if (st == NOPAD_OK) st = tokenize_alone(tok, b, b_len, &ib, &nb);
    if (st != NOPAD_OK) goto done;
    const int64_t total = (int64_t)na + nb + n_special;
    if (p.max_length > 0 && total > p.max_length) {
        if (!p.truncate) {
            *n_ids = total > INT32_MAX ? INT32_MAX : (int32_t)total;
            st = nopad_set_error(NOPAD_ERR_TOO_LONG,
                                 "nopad_tokenize_pair: the pair gives %lld ids, more than max_length "
                                 "%d (set truncate to cut it)",
                                 (long long)total, (int)p.max_length);
            goto done;
        }
        const int32_t budget = p.max_length - n_special;
        if (budget < 0) {
            st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                 "nopad_tokenize_pair: the pair template alone has %d special ids, "
                                 "more than max_length %d",
                                 n_special, (int)p.max_length);
            goto done;
        }
        /* tokenizers' LongestFirst: the shorter keeps max(its length, budget - the longer's)
         * ... and if both are still too long, they split the budget, the longer getting the odd
         * one */
        int32_t n_short = na <= nb ? na : nb, n_long = na <= nb ? nb : na;
        n_long = n_short > budget ? n_short : (n_short > budget - n_short ? n_short : budget - n_short);
        if (n_short + n_long > budget) {
            n_short = budget / 2;
            n_long = n_short + budget % 2;
        }
        if (na <= nb) {
            na = n_short < na ? n_short : na;
            nb = n_long < nb ? n_long : nb;
        } else {
            nb = n_short < nb ? n_short : nb;
            na = n_long < na ? n_long : na;
        }
    }
    *n_ids = na + nb + n_special;
    if (*n_ids > capacity) {
        st = nopad_set_error(NOPAD_ERR_BUFFER_TOO_SMALL,
                             "nopad_tokenize_pair: %d ids do not fit in capacity %d", *n_ids, (int)capacity);
        goto done;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < n_tmpl; i++) {
        const int32_t id = tmpl[2 * i], type = tmpl[2 * i + 1];
        if (id >= 0 && !p.add_special_tokens) continue;
        const int32_t *src = id == TOK_PAIR_A ? ia : id == TOK_PAIR_B ? ib : &id;
        const int32_t n = id == TOK_PAIR_A ? na : id == TOK_PAIR_B ? nb : 1;
        for (int32_t j = 0; j < n; j++, k++) {
            ids[k] = src[j];
            if (types) types[k] = p.add_special_tokens ? type : (id == TOK_PAIR_A ? 0 : 1);
        }
    }
done:
    free(ia);
    free(ib);
    return st;
}
