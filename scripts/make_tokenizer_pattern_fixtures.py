#!/usr/bin/env python3
"""Writes the fixtures of patterns that can match the empty string: Replace normalizers and Split
pre-tokenizers whose pattern is "" (String or Regex) or a regex such as "a*", and Hugging Face
`tokenizers`' ids for them.

    pip install tokenizers
    python3 scripts/make_tokenizer_pattern_fixtures.py     # files in tests/data/tokenizer/patterns/
    python3 scripts/make_tokenizer_pattern_fixtures.py --library build/libnopad.so
        # no files: compares a built libnopad.so with HF and prints every difference
    python3 scripts/make_tokenizer_pattern_fixtures.py --fuzz-seeds
        # also writes three of them as seeds of fuzz/fuzz_tokenizer.c (fuzz/corpus/tokenizer/)

HF compiles a String pattern as an escaped regex, so "" matches at every character boundary, the
two ends included: Replace "" -> "X" turns "ab" into "XaXbX". An empty input has no match at all
(its Pattern impl returns the input whole), so Replace never grows "" into "X".

The tokenizers are WordPiece over single characters ("a", "##a", ...) behind a WhitespaceSplit, so
the ids spell out the normalized and split text character by character.

tests/data/tokenizer/patterns/<name>.json   the tokenizers, as `tokenizers` saves them
tests/data/tokenizer/patterns/cases.jsonl   one JSON object per (tokenizer, text):
    tok    the name (file <tok>.json)
    hex    the UTF-8 bytes of the text
    ids    Tokenizer.encode(text, add_special_tokens=False).ids
"""
import argparse
import ctypes
import json
import os
import sys

from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer", "patterns")

CHARS = "abcXY_é漢字"
TEXTS = ["", "a", "ab", "ab c", "baab", "aaa b aa", "é漢字 a", "  ", " a ", "a [CLS] b", "[CLS]",
         "X", "aXa"]


def replace(pattern, content):
    return {"type": "Replace", "pattern": pattern, "content": content}


def split(pattern, behavior):
    return {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": False}


# name -> (normalizer, pre-tokenizer before the WhitespaceSplit or None)
PIPELINES = {
    "replace_empty_string": (replace({"String": ""}, "X"), None),
    "replace_empty_regex": (replace({"Regex": ""}, "X"), None),
    "replace_empty_string_long": (replace({"String": ""}, "_Y"), None),
    "replace_empty_to_empty": (replace({"String": ""}, ""), None),
    "replace_regex_a_star": (replace({"Regex": "a*"}, "X"), None),
    "strip_then_replace_empty": ({"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": True, "strip_right": True},
        replace({"String": ""}, "X")]}, None),
    "replace_then_replace_empty": ({"type": "Sequence", "normalizers": [
        replace({"String": "a"}, ""), replace({"String": ""}, "X")]}, None),
    "split_empty_string_isolated": (None, split({"String": ""}, "Isolated")),
    "split_empty_string_removed": (None, split({"String": ""}, "Removed")),
    "split_empty_regex_merged_next": (None, split({"Regex": ""}, "MergedWithNext")),
    "split_regex_a_star_isolated": (None, split({"Regex": "a*"}, "Isolated")),
}


def tokenizer_json(normalizer, pre):
    vocab = {"[UNK]": 0, "[CLS]": 1}
    for c in CHARS:
        vocab[c] = len(vocab)
        vocab["##" + c] = len(vocab)
    ws = {"type": "WhitespaceSplit"}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 1, "content": "[CLS]", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": normalizer,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [pre, ws]} if pre else ws,
        "post_processor": None, "decoder": None,
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab},
    }


def hf_cases():
    """(name, tokenizer.json text, [(text, ids)]) for every pipeline."""
    out = []
    for name, (normalizer, pre) in PIPELINES.items():
        text = json.dumps(tokenizer_json(normalizer, pre), ensure_ascii=False, indent=1)
        tok = Tokenizer.from_str(text)
        out.append((name, text, [(t, tok.encode(t, add_special_tokens=False).ids)
                                 for t in TEXTS]))
    return out


class _Params(ctypes.Structure):
    _fields_ = [("add_special_tokens", ctypes.c_int), ("truncate", ctypes.c_int),
                ("max_length", ctypes.c_int32)]


def compare(library):
    import tempfile
    lib = ctypes.CDLL(library)
    lib.nopad_tokenizer_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.nopad_tokenize_default_params.restype = _Params
    lib.nopad_tokenize.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                   ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32),
                                   ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]
    lib.nopad_tokenizer_free.argtypes = [ctypes.c_void_p]
    lib.nopad_last_error.restype = ctypes.c_char_p
    params = lib.nopad_tokenize_default_params()
    params.add_special_tokens = 0
    bad = 0
    for name, text, cases in hf_cases():
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
                f.write(text)
            tok = ctypes.c_void_p()
            if lib.nopad_tokenizer_load(d.encode(), ctypes.byref(tok)) != 0:
                print("%s: nopad cannot load it: %s" % (name, lib.nopad_last_error().decode()))
                bad += 1
                continue
        for t, want in cases:
            raw = t.encode()
            ids, got = (ctypes.c_int32 * 256)(), ctypes.c_int32()
            st = lib.nopad_tokenize(tok, raw, len(raw), ctypes.byref(params), ids, 256,
                                    ctypes.byref(got))
            mine = list(ids[:got.value]) if st == 0 else "status %d" % st
            if mine != want:
                print("%s %r: nopad %s, HF %s" % (name, t, mine, want))
                bad += 1
        lib.nopad_tokenizer_free(tok)
    print("%d differences" % bad)
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--library", help="compare this libnopad.so with HF instead of writing files")
    ap.add_argument("--fuzz-seeds", action="store_true",
                    help="also write seeds for fuzz/fuzz_tokenizer.c")
    args = ap.parse_args()
    if args.library:
        sys.exit(1 if compare(args.library) else 0)
    if args.fuzz_seeds:
        seeds = os.path.join(ROOT, "fuzz", "corpus", "tokenizer")
        for name, (normalizer, pre) in PIPELINES.items():
            if name in ("strip_then_replace_empty", "replace_regex_a_star",
                        "split_empty_string_isolated"):
                # first byte 0: the rest is a tokenizer.json (fuzz_tokenizer.c)
                with open(os.path.join(seeds, "json_pattern_" + name), "wb") as f:
                    f.write(b"\0" + json.dumps(tokenizer_json(normalizer, pre),
                                               ensure_ascii=False).encode())
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "cases.jsonl"), "w", encoding="utf-8") as cases_file:
        for name, text, cases in hf_cases():
            with open(os.path.join(OUT, name + ".json"), "w", encoding="utf-8") as f:
                f.write(text + "\n")
            for t, ids in cases:
                cases_file.write(json.dumps({"tok": name, "hex": t.encode().hex(), "ids": ids})
                                 + "\n")
    print("wrote %d tokenizers and %d cases to %s" % (len(PIPELINES), len(PIPELINES) * len(TEXTS),
                                                      OUT))


if __name__ == "__main__":
    main()
