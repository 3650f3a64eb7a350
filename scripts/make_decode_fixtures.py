#!/usr/bin/env python3
"""Writes the decoder fixtures (tests/test_tokenizer_decode.c reads them).

    pip install tokenizers
    python3 scripts/make_decode_fixtures.py          # tests/data/tokenizer/decode_cases.jsonl
    python3 scripts/make_decode_fixtures.py --random 2000 --library build/libnopad.so
        # no files: compares a built libnopad.so with HF's decode on N random id lists for every
        # decoder below, and checks the stream (chunks valid UTF-8, chunks + flush = decode)

Each line of decode_cases.jsonl is one tokenizer and the decodes HF gives for it:
    name       what the decoder is
    tokenizer  a tokenizer.json (as text): a WordPiece model over VOCAB (the model matters only
               for its vocab), a Lowercase normalizer, the added tokens [CLS] <s> (special),
               <extra> (not special), "New X" (normalized) and "[Norm X]" (special, normalized:
               HF 0.23 reads both back in their normalized form and then does not take the
               second for special), and the decoder
    cases      [[ids, decode, decode_skip], ...]: HF's Tokenizer.decode of ids, as hex UTF-8,
               with skip_special_tokens false and true
The id lists are random (seeded) over tokens chosen to hit each decoder's rules: byte-level
characters that split UTF-8 characters, <0xNN> runs valid and not, "▁" at token starts and
inside, WordPiece's "##" and cleanup patterns, BPE suffixes, CTC pads and delimiters. Decoders
that HF refuses to build, and id lists on which HF panics (Strip on tokens shorter than its
counts), are left out.
"""
import argparse
import ctypes
import json
import os
import random
import shutil
import tempfile

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "tokenizer")

VOCAB = [
    "[UNK]", "a", "b", "##b", "##", "c", "▁", "▁a", "▁b▁c", "▁▁", "a▁", " ", "  ", " a ", ".",
    " .", "?", "!", ",", "do", " do not", "not", "n't", "'", "s", "m", "'m", "##n't", "re",
    "<0x41>", "<0x0A>", "<0x20>", "<0xE5>", "<0x8F>", "<0xAB>", "<0xF0>", "<0x9F>", "<0x98>",
    "<0x80>", "<0xFF>", "<0xC3>", "<0xA9>", "<0x+F>", "<0xfg>", "<0X41>", "Ġhello", "Ġ", "Ã",
    "©", "ģ", "ðŁĺ", "Ģ", "ðŁ", "ĺĢ", "å", "ı", "«", "é", "漢", "😀", "x</w>", "</w>",
    "y</w>z</w>", "<pad>", "|", "||", "<pad>a", "ĊĉĠ", "<unk>", "\u0085", "\ufffd", "",
]

DECODERS = [
    ("none", None),
    ("ByteLevel", decoders.ByteLevel()),
    ("Metaspace always", decoders.Metaspace(replacement="▁", prepend_scheme="always")),
    ("Metaspace first", decoders.Metaspace(replacement="▁", prepend_scheme="first")),
    ("Metaspace never", decoders.Metaspace(replacement="▁", prepend_scheme="never")),
    ("Metaspace _", decoders.Metaspace(replacement="a", prepend_scheme="always")),
    ("ByteFallback", decoders.ByteFallback()),
    ("Fuse", decoders.Fuse()),
    ("Strip 1 0", decoders.Strip(content=" ", left=1, right=0)),
    ("Strip 0 1", decoders.Strip(content=" ", left=0, right=1)),
    ("Strip a 2 2", decoders.Strip(content="a", left=2, right=2)),
    ("Replace ▁", decoders.Replace("▁", " ")),
    ("Replace empty", decoders.Replace("", "-")),
    ("Replace aa", decoders.Replace("▁▁", "_")),
    ("WordPiece", decoders.WordPiece(prefix="##", cleanup=True)),
    ("WordPiece no cleanup", decoders.WordPiece(prefix="##", cleanup=False)),
    ("WordPiece empty prefix", decoders.WordPiece(prefix="", cleanup=True)),
    ("BPEDecoder", decoders.BPEDecoder(suffix="</w>")),
    ("BPEDecoder empty", decoders.BPEDecoder(suffix="")),
    ("CTC", decoders.CTC(pad_token="<pad>", word_delimiter_token="|", cleanup=True)),
    ("CTC no cleanup", decoders.CTC(pad_token="<pad>", word_delimiter_token="|", cleanup=False)),
    ("LLaMA-2", decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                   decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0)])),
    ("ByteFallback Metaspace", decoders.Sequence([decoders.ByteFallback(),
                                                  decoders.Metaspace(replacement="▁",
                                                                     prepend_scheme="always")])),
    ("nested Sequence", decoders.Sequence([decoders.Sequence([decoders.Fuse()]),
                                           decoders.Sequence([]), decoders.ByteLevel()])),
    ("Fuse Strip", decoders.Sequence([decoders.Fuse(), decoders.Strip(content=" ", left=3,
                                                                      right=0)])),
]


def build(decoder):
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(VOCAB) if t},
                                     unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.add_special_tokens([AddedToken("[CLS]", special=True), AddedToken("<s>", special=True),
                            AddedToken("[Norm X]", special=True, normalized=True)])
    tok.add_tokens([AddedToken("<extra>", special=False), AddedToken("New X", normalized=True)])
    if decoder is not None:
        tok.decoder = decoder
    return tok


def random_ids(rng, size, n):
    return [rng.randrange(size) for _ in range(rng.randint(0, n))]


def hf_decode(tok, ids, skip):
    """HF's decode, or None where it panics (Strip on short tokens); the panic's message, which
    Rust prints on stderr, is kept out of the output."""
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        return tok.decode(ids, skip_special_tokens=skip)
    except BaseException:  # a Rust panic is a BaseException
        return None
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def write(seed, per_decoder):
    rng = random.Random(seed)
    path = os.path.join(DATA, "decode_cases.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for name, dec in DECODERS:
            tok = build(dec)
            size = tok.get_vocab_size(with_added_tokens=True)
            cases = []
            while len(cases) < per_decoder:
                ids = random_ids(rng, size, 12)
                a, b = hf_decode(tok, ids, False), hf_decode(tok, ids, True)
                if a is None or b is None:
                    continue
                cases.append([ids, a.encode("utf-8").hex(), b.encode("utf-8").hex()])
            rec = {"name": name, "tokenizer": tok.to_str(), "cases": cases}
            f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")


# ---- random id lists: a built libnopad.so against HF ---------------------------------------------

def random_check(n, library, seed):
    lib = ctypes.CDLL(library)
    P = ctypes.c_void_p
    lib.nopad_tokenizer_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(P)]
    lib.nopad_tokenizer_free.argtypes = [P]
    lib.nopad_last_error.restype = ctypes.c_char_p
    lib.nopad_detokenize.argtypes = [P, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t,
                                     ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                                     ctypes.POINTER(ctypes.c_size_t)]
    lib.nopad_decode_stream_create.argtypes = [P, ctypes.c_int, ctypes.POINTER(P)]
    lib.nopad_decode_stream_step.argtypes = [P, ctypes.c_int32, ctypes.POINTER(ctypes.c_char_p),
                                             ctypes.POINTER(ctypes.c_size_t)]
    lib.nopad_decode_stream_flush.argtypes = [P, ctypes.POINTER(ctypes.c_char_p),
                                              ctypes.POINTER(ctypes.c_size_t)]
    lib.nopad_decode_stream_free.argtypes = [P]
    rng = random.Random(seed)
    failed = 0
    buf = ctypes.create_string_buffer(1 << 16)
    for name, dec in DECODERS:
        tok = build(dec)
        size = tok.get_vocab_size(with_added_tokens=True)
        with tempfile.TemporaryDirectory() as d:
            tok.save(os.path.join(d, "tokenizer.json"))
            t = P()
            if lib.nopad_tokenizer_load(d.encode(), ctypes.byref(t)) != 0:
                raise SystemExit("%s: nopad cannot load it: %s" % (name, lib.nopad_last_error()))
        bad = refused = 0
        for _ in range(n):
            ids = random_ids(rng, size, 24)
            skip = rng.random() < 0.5
            want = hf_decode(tok, ids, skip)
            if want is None:
                continue
            arr = (ctypes.c_int32 * max(1, len(ids)))(*ids)
            got_len = ctypes.c_size_t()
            st = lib.nopad_detokenize(t, arr, len(ids), int(skip), buf, len(buf),
                                      ctypes.byref(got_len))
            got = buf.raw[:got_len.value] if st == 0 else None
            stream, text, text_len = P(), ctypes.c_char_p(), ctypes.c_size_t()
            if lib.nopad_decode_stream_create(t, int(skip), ctypes.byref(stream)) != 0:
                refused += 1  # a decoder that reads across tokens after Fuse: not streamable
                if got != want.encode("utf-8"):
                    bad += 1
                continue
            chunks, stream_ok = b"", True
            for i in ids + [None]:
                st2 = (lib.nopad_decode_stream_step(stream, i, ctypes.byref(text),
                                                    ctypes.byref(text_len)) if i is not None
                       else lib.nopad_decode_stream_flush(stream, ctypes.byref(text),
                                                          ctypes.byref(text_len)))
                chunk = ctypes.string_at(text, text_len.value) if st2 == 0 else None
                try:
                    chunk.decode("utf-8")
                except (AttributeError, UnicodeDecodeError):
                    stream_ok = False
                    break
                chunks += chunk
            lib.nopad_decode_stream_free(stream)
            if got != want.encode("utf-8") or not stream_ok or chunks != got:
                bad += 1
                if bad <= 3:
                    print("%s: ids %s skip %d: nopad %r (stream %r), HF %r"
                          % (name, ids, skip, got, chunks if stream_ok else None, want))
        lib.nopad_tokenizer_free(t)
        print("%s: %d random id lists, %d differ%s" % (name, n, bad, " (not streamable: "
                                                       "decode only)" if refused else ""))
        failed += bad
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--random", type=int, default=0, metavar="N",
                    help="compare libnopad.so with HF on N random id lists a decoder (writes "
                         "nothing)")
    ap.add_argument("--library", default="build/libnopad.so")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.random:
        raise SystemExit(1 if random_check(args.random, args.library, args.seed) else 0)
    write(args.seed, 24)


if __name__ == "__main__":
    main()
