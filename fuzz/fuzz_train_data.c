/* libFuzzer target: the training-data reader (src/train/data.c) on arbitrary bytes, then a loader
 * epoch over what it accepted.
 *
 * The first byte picks the reading: bit 0 JSONL (else text lines), bit 1 classification (else
 * MLM; classification forces JSONL), bit 2 truncation (for MLM on text lines: packed lines
 * instead), bit 3 regression (one label, else three) or, for MLM, whole-word masking, bits 4-7
 * the model maximum (3 + b/16 · 4 tokens). The tokenizer is a fixed WordPiece vocab.txt
 * of 32 ids. Beyond "no crash, no leak", an accepted corpus keeps the reader's promises: every
 * example within the maximum, starting with [CLS] and ending with [SEP], its ids in the
 * vocabulary (packed: a piece within the maximum, with a token to mask, keyed by its number),
 * its labels in range or its targets finite; and an epoch of the loader visits every
 * example once, no batch over its budget, masked positions never on a special token, and with
 * whole-word masking no word (a piece and its "##" pieces) partly masked. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"
#include "train/data.h"

static const char vocab[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nof\nand\na\nto\nin\nis\n"
                            "##s\n##ing\n##ed\nit\nthat\nwas\nfor\non\nare\nwith\nas\nhe\nbe\n"
                            "at\nby\n,\n.\n!\n\"\n{\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static nopad_tokenizer *tok;
    if (!tok && tokenizer_from_vocab_txt(vocab, sizeof vocab - 1, 1, "fuzz vocab", &tok) != NOPAD_OK)
        __builtin_trap();
    if (size < 1) return 0;
    const uint8_t mode = data[0];
    train_data_params p = train_data_default_params();
    p.task = mode & 2 ? TRAIN_TASK_CLASSIFY : TRAIN_TASK_MLM;
    p.format = (mode & 1) || p.task == TRAIN_TASK_CLASSIFY ? TRAIN_DATA_JSONL : TRAIN_DATA_LINES;
    p.truncate = (mode >> 2) & 1;
    p.num_labels = mode & 8 ? 1 : 3;
    p.max_length = 3 + (mode >> 4) * 4;
    p.whole_word = p.task == TRAIN_TASK_MLM && (mode & 8);
    p.pack = p.task == TRAIN_TASK_MLM && p.format == TRAIN_DATA_LINES && p.truncate;
    if (p.pack) p.truncate = 0;
    train_dataset d;
    if (train_dataset_parse((const char *)data + 1, size - 1, "fuzz", tok, &p, &d) != NOPAD_OK)
        return 0;
    const int32_t V = nopad_tokenizer_vocab_size(tok);
    if (d.n_examples < 1) __builtin_trap();
    for (int32_t e = 0; e < d.n_examples; e++) {
        const int64_t len = d.offsets[e + 1] - d.offsets[e];
        const int32_t *ids = d.ids + d.offsets[e];
        if (p.pack) { /* pieces: end to end from the start, full but the last, none without a word */
            if (len < 1 || len > p.max_length || d.offsets[e] < 0 || d.index[e] != e) __builtin_trap();
            if (d.type0_len[e] != len) __builtin_trap();
            int maskable = 0;
            for (int64_t i = 0; i < len; i++) maskable |= !d.special[ids[i]];
            if (!maskable) __builtin_trap();
        } else {
            if (len < 2 || len > p.max_length || ids[0] != 2 || ids[len - 1] != 3) __builtin_trap();
            if (d.type0_len[e] < 2 || d.type0_len[e] > len) __builtin_trap();
        }
        for (int64_t i = 0; i < len; i++)
            if (ids[i] < 0 || ids[i] >= V) __builtin_trap();
        if (d.labels && (d.labels[e] < 0 || d.labels[e] >= p.num_labels)) __builtin_trap();
        if (d.targets && !isfinite(d.targets[e])) __builtin_trap();
    }
    train_loader l;
    if (train_loader_init(&d, p.max_length, 4, 7, &l) != NOPAD_OK) __builtin_trap();
    int32_t *seen = calloc((size_t)d.n_examples, sizeof *seen);
    if (!seen) __builtin_trap();
    while (train_loader_next(&l)) {
        const train_batch *b = &l.batch;
        if (b->n_seqs < 1 || b->n_seqs > 4 || b->cu_seqlens[b->n_seqs] > p.max_length) __builtin_trap();
        if (p.task == TRAIN_TASK_MLM && b->n_masked < 1) __builtin_trap();
        for (int32_t s = 0; s < b->n_seqs; s++)
            if (seen[l.examples[s]]++) __builtin_trap();
        const int32_t T = b->cu_seqlens[b->n_seqs];
        uint8_t *masked = calloc((size_t)T + 1, 1);
        int32_t *orig = malloc(((size_t)T + 1) * sizeof *orig);
        if (!masked || !orig) __builtin_trap();
        memcpy(orig, b->tokens, (size_t)T * sizeof *orig);
        for (int32_t m = 0; m < b->n_masked; m++) {
            const int32_t at = b->mlm_positions[m];
            if (at < 0 || at >= T || d.special[b->mlm_labels[m]]) __builtin_trap();
            masked[at] = 1;
            orig[at] = b->mlm_labels[m];
        }
        /* whole words: a "##" piece is masked exactly when the piece before it is */
        for (int32_t s = 0; p.whole_word && s < b->n_seqs; s++)
            for (int32_t i = b->cu_seqlens[s] + 1; i < b->cu_seqlens[s + 1]; i++)
                if (!d.special[orig[i]] && !d.special[orig[i - 1]] && d.continues[orig[i]] &&
                    masked[i] != masked[i - 1])
                    __builtin_trap();
        free(masked);
        free(orig);
    }
    for (int32_t e = 0; e < d.n_examples; e++)
        if (seen[e] != 1) __builtin_trap();
    free(seen);
    train_loader_free(&l);
    train_dataset_free(&d);
    return 0;
}
