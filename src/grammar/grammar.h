/* Constrained decoding (issue 44): a JSON schema, a regex or a list of choices compiles to a
 * context-free grammar over bytes; an incremental matcher walks the grammar one byte at a time;
 * a trie of the vocabulary's token bytes turns the matcher's state into the allowed-token mask.
 * docs/grammar.md has the design, what is accepted and refused, and the measured times.
 *
 * Ownership: a grammar is immutable once built and may be shared by any number of matchers (and
 * threads); a matcher belongs to one request; a token trie is built once per vocabulary and
 * shared by every request. */
#ifndef NOPAD_GRAMMAR_GRAMMAR_H
#define NOPAD_GRAMMAR_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "nopad.h"

typedef struct grammar grammar;

/* A JSON schema (the text of one JSON value) to the grammar of the documents that validate
 * against it, in the canonical form of docs/grammar.md (keys in the schema's order, at most one
 * space or newline between tokens). An unsupported keyword -> NOPAD_ERR_UNSUPPORTED naming the
 * keyword and its JSON path ("schema.properties.age: keyword \"multipleOf\" is not supported");
 * a malformed schema -> NOPAD_ERR_INVALID_ARGUMENT naming where. */
nopad_status grammar_from_json_schema(const char *schema, size_t len, grammar **out);
/* JSON values inside fixed text (tool calls): `open`, then min_count to max_count values (max_count
 * -1: no limit) joined by `separator`, then `close`; each value valid against one of the
 * n_schemas schemas (schemas[i]: its text, lens[i] bytes), each compiled on its own so that its
 * $ref resolve within it. Errors as grammar_from_json_schema's, the path starting "schemas[i]". */
nopad_status grammar_from_json_sequence(const char *const *schemas, const size_t *lens, size_t n_schemas,
                                        const char *open, const char *separator, const char *close,
                                        int32_t min_count, int32_t max_count, grammar **out);
/* response_format {"type": "json_object"}: any JSON object. */
nopad_status grammar_any_json_object(grammar **out);
/* vLLM's guided_regex: the output (raw bytes, not a JSON string) matches the whole pattern. */
nopad_status grammar_from_regex(const char *pattern, size_t len, grammar **out);
/* vLLM's guided_choice: the output is exactly one of the n strings (raw bytes). */
nopad_status grammar_from_choices(const char *const *choices, const size_t *lens, size_t n,
                                  grammar **out);
void grammar_free(grammar *g);
/* Number of grammar elements (a size measure for tests and limits). */
size_t grammar_size(const grammar *g);

/* ---- the matcher: a set of parse stacks, kept in an arena that rolls back ------------------- */

typedef struct grammar_matcher grammar_matcher;

/* A point to roll back to (grammar_matcher_save / grammar_matcher_restore). */
typedef struct grammar_mark {
    uint32_t nodes, tops, states;
} grammar_mark;

nopad_status grammar_matcher_create(const grammar *g, grammar_matcher **out);
void grammar_matcher_free(grammar_matcher *m);
/* Back to the start of the grammar (nothing accepted). */
void grammar_matcher_reset(grammar_matcher *m);
/* 1: the byte continues a document (the state advances); 0: no document continues with it (the
 * state is unchanged). */
int grammar_matcher_accept(grammar_matcher *m, uint8_t byte);
/* All the bytes or none: 1 when every byte was accepted, else 0 and the state is unchanged. */
int grammar_matcher_accept_bytes(grammar_matcher *m, const uint8_t *bytes, size_t n);
/* 1 when the bytes accepted so far form a whole document. */
int grammar_matcher_is_accepting(const grammar_matcher *m);
/* 1 when some byte can still follow (a document may be accepting and continue: "12" -> "123"). */
int grammar_matcher_can_continue(const grammar_matcher *m);
grammar_mark grammar_matcher_save(const grammar_matcher *m);
/* Back to a mark taken earlier on the current path (later marks become invalid). */
void grammar_matcher_restore(grammar_matcher *m, grammar_mark mark);
/* Forgets the history (no earlier mark stays valid) and keeps only the current state, so a long
 * generation does not grow the arena: call it after each accepted token. */
nopad_status grammar_matcher_commit(grammar_matcher *m);

/* ---- token masks ----------------------------------------------------------------------------- */

typedef struct grammar_token_trie grammar_token_trie;

/* The trie of a vocabulary: tokens[id] points at the token's bytes (as the model emits them,
 * after byte-level / byte-fallback decoding), lens[id] their count. A token of length 0 (special
 * and control tokens) is never allowed by a mask; eos_ids[n_eos] are allowed exactly when the
 * matcher is accepting. */
nopad_status grammar_token_trie_create(const uint8_t *const *tokens, const uint32_t *lens,
                                       int32_t vocab_size, const int32_t *eos_ids, int32_t n_eos,
                                       grammar_token_trie **out);
/* The same from a tokenizer's vocabulary (nopad_tokenizer_id_to_token, with the byte-level and
 * <0xNN> byte-fallback spellings turned back into bytes; special tokens get length 0). */
nopad_status grammar_token_trie_from_tokenizer(const nopad_tokenizer *tok, const int32_t *eos_ids,
                                               int32_t n_eos, grammar_token_trie **out);
void grammar_token_trie_free(grammar_token_trie *trie);
int32_t grammar_token_trie_vocab_size(const grammar_token_trie *trie);
/* A token's bytes as the trie holds them (for tests and for feeding a sampled token). */
const uint8_t *grammar_token_trie_token(const grammar_token_trie *trie, int32_t id, uint32_t *len);

/* mask[(vocab_size + 31) / 32]: bit t of word t / 32 set when token t may come next. The matcher
 * is left in the state it was given. Returns the number of allowed tokens. */
int32_t grammar_token_mask(const grammar_token_trie *trie, grammar_matcher *m, uint32_t *mask);
/* Feeds an emitted token: 1 when its bytes were accepted (EOS: when the matcher was accepting). */
int grammar_matcher_accept_token(grammar_matcher *m, const grammar_token_trie *trie, int32_t id);

/* Masks shared between requests on one vocabulary: equal grammars (by content: a schema compiled
 * once per request) in equal states have equal masks, so each state's is computed once while it
 * stays among the cache's n_entries most recently used. Thread-safe. */
typedef struct grammar_mask_cache grammar_mask_cache;
nopad_status grammar_mask_cache_create(const grammar_token_trie *trie, uint32_t n_entries,
                                       grammar_mask_cache **out);
void grammar_mask_cache_free(grammar_mask_cache *cache);
/* grammar_token_mask on the cache's trie, through the cache (any thread; the matcher is one
 * thread's at a time, as always). */
int32_t grammar_token_mask_shared(grammar_mask_cache *cache, grammar_matcher *m, uint32_t *mask);
/* Masks found in the cache and computed, so far. */
void grammar_mask_cache_counts(grammar_mask_cache *cache, uint64_t *hits, uint64_t *misses);

#endif
