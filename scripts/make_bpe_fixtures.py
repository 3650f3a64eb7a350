#!/usr/bin/env python3
"""Writes the byte-level BPE tokenizer parity fixtures (tests/test_tokenizer_bpe.c reads them).

    pip install tokenizers
    python3 scripts/make_bpe_fixtures.py     # files in tests/data/tokenizer/
    python3 scripts/make_bpe_fixtures.py --decode-only
        # keeps both tokenizers and every id list; (re)writes the decode fields only
    python3 scripts/make_bpe_fixtures.py --random 100000 --library build/libnopad.so
        # no files: compares a built libnopad.so with HF on N random strings of mixed scripts,
        # whitespace, controls and apostrophes, for both fixture tokenizers

Two byte-level BPE tokenizers are trained with Hugging Face `tokenizers` (the Rust library behind
transformers' fast tokenizers) on the texts of tests/data/tokenizer/corpus.jsonl:
    bpe_roberta.json  RoBERTa-style: <s> <pad> </s> <unk> <mask> (lstrip), ByteLevel with
                      add_prefix_space=true, RobertaProcessing (<s> $A </s>)
    bpe_gpt2.json     GPT-2-style: no special tokens, add_prefix_space=false, ByteLevel
                      post-processor, merges written as ["a", "b"] pairs
bpe_cases.jsonl has one JSON object per line:
    line      the index of the text in corpus.jsonl, or -1 for an extra line given by `hex`
    hex       (extra lines only) the UTF-8 bytes of the text
    roberta   ids from bpe_roberta.json, special tokens added
    nospecial ids from bpe_roberta.json without special tokens
    gpt2      ids from bpe_gpt2.json
    decode_roberta, decode_roberta_skip
              HF's decode of the roberta ids (skip_special_tokens false / true), hex UTF-8
    decode_gpt2
              HF's decode of the gpt2 ids, hex UTF-8
The vocabularies are small (600 and 400) so that most words split into several merges.
CI only reads the committed files; this script needs the `tokenizers` package.
"""
import argparse
import ctypes
import json
import os
import random
import shutil
import tempfile

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "tokenizer")

EXTRA = [
    "  two  spaces\tand\ttabs\n\nnewlines \n  \n\t\t end   ",
    "   leading and trailing   ",
    "\n",
    "I'm you're they've we'll she'd it's DON'T Can'T 'tis",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷 heart ❤️",
    "漢字とかなカナ 中文测试 한국어",
    "numbers 1234567 3.14159 1,000,000 ٣٤٥ ½ Ⅻ",
    "mask <mask> here and<mask>there <s></s> <unk>",
    "café cafe\u0301 naïve Ωmega",
    "x\u0085y\u00a0z\u2028w\u3000v\u000bu\u000cend",
    "a" * 300,
    "https://example.com/path?q=1&r=2 user@example.org",
    "def f(x):\n    return x**2  # comment",
    "",
    " ",
    "مرحبا بالعالم العربي",
    "नमस्ते दुनिया हिन्दी",
    "e\u0301\u0302\u0323 combining marks \u0308alone",
    "ctrl \x00\x01\x1b[31m\x7f\u200b\u200d\ufeff end",
    "Supercalifragilisticexpialidocious" * 20,
    "'s'S 'll'LL 're've'm'd 't ''quoted'' rock'n'roll",
    "  \t  \n\n\n   x \u3000\u3000y\u00a0\u00a0 z",
    "1,234.56 -7e10 0x1F 192.168.0.1 +33 6 12 34 56 78",
    "MiXeD CaSe ÀÉÎÕÜ ß ǅ ﬁ",
    "<s>nested</s><pad><unk><mask><mask>",
    "tab\tsep\tvalues\t\t",
    "🏳️‍🌈 🧑🏿‍💻 👍🏻👍🏼👍🏽👍🏾👍🏿",
]


def long_word(texts):
    """One 4000-byte word: the corpus's ASCII letters run together (many merges per word)."""
    letters = "".join(c for t in texts for c in t if c.isascii() and c.isalpha())
    return letters[:4000]


def corpus_texts():
    with open(os.path.join(DATA, "corpus.jsonl"), encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def train(texts, vocab_size, special, add_prefix_space):
    tok = Tokenizer(models.BPE(unk_token="<unk>" if special else None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


# ---- random strings: a built libnopad.so against HF ----------------------------------------------

POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n\r\x0b\x0c",
    "'sStTmMdDlLrRvVe", ".,;:!?-_()[]{}<>/\\@#$%^&*+=|~`\"", "éèêëàâäôöûüçñßÀÉÎÕÜ",
    "\u0301\u0308\u0323\u200d\u200b\ufeff", "漢字中文测试かなカナ한국어", "مرحبا العربي",
    "नमस्ते हिन्दी", "😀👍🏽👨‍👩‍👧🇫🇷❤️", "\x85\xa0\u2028\u2029\u3000\u1680\u2007\u202f\u205f",
    "٣٤٥½Ⅻ²³¼", "\x00\x01\x1b\x7f", "ǅǈǋ\u0345\U0001d400\U00010400", "ʰʱˆ\u02b0\u3005\u16ee",
]


def random_check(n, library, seed):
    lib = ctypes.CDLL(library)
    lib.nopad_tokenizer_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.nopad_tokenize.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                   ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32),
                                   ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]
    lib.nopad_tokenizer_free.argtypes = [ctypes.c_void_p]
    every = "".join(POOLS)
    failed = 0
    for name in ("bpe_roberta", "bpe_gpt2"):
        rng = random.Random(seed)
        with tempfile.TemporaryDirectory() as d:
            shutil.copy(os.path.join(DATA, name + ".json"), os.path.join(d, "tokenizer.json"))
            tok = ctypes.c_void_p()
            if lib.nopad_tokenizer_load(d.encode(), ctypes.byref(tok)) != 0:
                raise SystemExit("nopad cannot load %s" % name)
            hf = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        ids, got = (ctypes.c_int32 * 4096)(), ctypes.c_int32()
        bad = 0
        for _ in range(n):
            text = "".join(rng.choice(POOLS[rng.randrange(len(POOLS))]) if rng.random() < 0.7
                           else rng.choice(every) for _ in range(rng.randint(0, 40)))
            if rng.random() < 0.05:
                text += " <mask>"
            raw = text.encode("utf-8")
            st = lib.nopad_tokenize(tok, raw, len(raw), None, ids, 4096, ctypes.byref(got))
            want = hf.encode(text).ids
            if st != 0 or list(ids[:got.value]) != want:
                bad += 1
                if bad <= 5:
                    print("%s: %r: nopad %s (status %d), HF %s" % (name, text, list(ids[:got.value]), st, want))
        lib.nopad_tokenizer_free(tok)
        print("%s: %d random strings, %d differ from HF" % (name, n, bad))
        failed += bad
    return failed


def add_decodes(rec, roberta, gpt2):
    """The decode fields of one bpe_cases.jsonl record (its ids as they are)."""
    def hexed(tok, ids, skip):
        return tok.decode(ids, skip_special_tokens=skip).encode("utf-8").hex()
    rec["decode_roberta"] = hexed(roberta, rec["roberta"], False)
    rec["decode_roberta_skip"] = hexed(roberta, rec["roberta"], True)
    rec["decode_gpt2"] = hexed(gpt2, rec["gpt2"], False)
    return rec


def decode_only():
    """Adds the decode fields to the committed bpe_cases.jsonl, ids and tokenizers unchanged."""
    roberta = Tokenizer.from_file(os.path.join(DATA, "bpe_roberta.json"))
    gpt2 = Tokenizer.from_file(os.path.join(DATA, "bpe_gpt2.json"))
    path = os.path.join(DATA, "bpe_cases.jsonl")
    with open(path, encoding="utf-8") as f:
        recs = [json.loads(line) for line in f]
    with open(path, "w", encoding="utf-8") as f:
        for rec in recs:
            f.write(json.dumps(add_decodes(rec, roberta, gpt2), separators=(",", ":")) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--random", type=int, default=0, metavar="N",
                    help="compare libnopad.so with HF on N random strings (writes nothing)")
    ap.add_argument("--library", default="build/libnopad.so")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--decode-only", action="store_true",
                    help="keep the tokenizers and ids; (re)write the decode fields")
    args = ap.parse_args()
    if args.decode_only:
        decode_only()
        return
    if args.random:
        raise SystemExit(1 if random_check(args.random, args.library, args.seed) else 0)
    texts = corpus_texts()
    roberta = train(texts, 600, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], True)
    roberta.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    # RoBERTa's <mask> swallows the space before it
    from tokenizers import AddedToken

    roberta.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    gpt2 = train(texts, 400, [], False)
    gpt2.post_processor = processors.ByteLevel(trim_offsets=False)

    roberta_path = os.path.join(DATA, "bpe_roberta.json")
    gpt2_path = os.path.join(DATA, "bpe_gpt2.json")
    roberta.save(roberta_path)
    gpt2.save(gpt2_path)
    # merges as "a b" strings in one file and as ["a", "b"] pairs in the other
    for path, legacy in ((roberta_path, True), (gpt2_path, False)):
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        merges = j["model"]["merges"]
        if legacy:
            j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in merges]
        else:
            j["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in merges]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
    # the files as saved are what the C side reads: reload them so the ids come from them
    roberta = Tokenizer.from_file(roberta_path)
    gpt2 = Tokenizer.from_file(gpt2_path)

    lines = [(i, t) for i, t in enumerate(texts)] + [(-1, t) for t in EXTRA + [long_word(texts)]]
    with open(os.path.join(DATA, "bpe_cases.jsonl"), "w", encoding="utf-8") as f:
        for i, text in lines:
            rec = {"line": i}
            if i < 0:
                rec["hex"] = text.encode("utf-8").hex()
            rec["roberta"] = roberta.encode(text).ids
            rec["nospecial"] = roberta.encode(text, add_special_tokens=False).ids
            rec["gpt2"] = gpt2.encode(text).ids
            add_decodes(rec, roberta, gpt2)
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
