#!/usr/bin/env python3
"""Writes the fixtures of tests/test_tokenizer_gguf.c: what Hugging Face transformers builds from
a GGUF file's tokenizer metadata (AutoTokenizer.from_pretrained(folder, gguf_file=name)).

    pip install transformers gguf sentencepiece tokenizers    # no torch needed (see below)
    python3 scripts/make_gguf_tokenizer_fixtures.py [--smollm2 PATH]

Writes into tests/data/tokenizer/:
    gguf/<name>.gguf    small GGUF files, tokenizer metadata only, written with the `gguf` package
                        as llama.cpp's converters write them:
        tiny_llama            "llama": SentencePiece BPE trained here (sentencepiece, vocab 700,
                              byte fallback, <think> user-defined) on the mostly-ASCII lines, no
                              merges (transformers derives them from the scores), no
                              add_bos_token (default: yes)
        tiny_llama_merges     the same vocabulary with merges in the file, add_bos_token false,
                              add_eos_token true, a padding id
        tiny_gpt2             "gpt2": byte-level BPE trained here (tokenizers, vocab 500), pre
                              "gpt-2" (plain ByteLevel); extra tokens: <think> user-defined, a
                              control token with a space (skipped by transformers), "é" (the byte
                              0xE9's spelling: a duplicate) and "x y" (respelled byte by byte)
        tiny_gpt2_llama_bpe   the same with pre "llama-bpe" (Split regex + ByteLevel) and
                              add_bos_token true
        tiny_gpt2_qwen2       the same with pre "qwen2" and add_eos_token true
    gguf/<name>.json    transformers' tokenizer.json for each (backend_tokenizer.to_str())
    gguf/bad_*.gguf     files the converter must refuse (tests check the message)
    gguf_cases.jsonl    per corpus line: {"line", "hex", "<name>": ids, "<name>/nospecial": ids,
                        "<name>/decode": decode(ids), "<name>/decode_skip": the same with
                        skip_special_tokens=True}; decodes as the hex of their UTF-8 (a text may
                        hold NUL)
    smollm2_gguf_cases.jsonl   (when the SmolLM2 GGUF is found: --smollm2, $NOPAD_SMOLLM2_GGUF or
                        scripts/fetch_default_decoder.sh's cache) per corpus line: {"line", "hex",
                        "ids", "nospecial", "decode": decode(ids), "decode_skip": decode(ids,
                        skip_special_tokens=True)}, decodes in hex as above

transformers' GGUF reader imports torch only for tensor dtypes; the tokenizer path never uses it,
so a stand-in module is present while that reader is imported, and the metadata-only config path
is told torch is there (load_gguf_checkpoint with return_tensors=False reads metadata only).
The texts are tests/data/tokenizer/corpus.jsonl's (re-run this script when it grows).
"""
import argparse
import json
import math
import os
import struct
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "tokenizer")
GGUF_DIR = os.path.join(DATA, "gguf")


def load_transformers():
    import transformers

    stand_in = types.ModuleType("torch")
    stand_in.__getattr__ = lambda name: object
    sys.modules["torch"] = stand_in
    try:
        import transformers.integrations.gguf.reader  # noqa: F401  (binds the stand-in)
    finally:
        del sys.modules["torch"]
    import transformers.modeling_gguf_pytorch_utils as mg

    mg.is_torch_available = lambda: True
    return transformers


def hf_tokenizer(path):
    from transformers import AutoTokenizer

    folder, name = os.path.split(os.path.abspath(path))
    return AutoTokenizer.from_pretrained(folder, gguf_file=name)


def corpus():
    with open(os.path.join(DATA, "corpus.jsonl"), encoding="utf-8") as f:
        return [json.loads(line)["hex"] for line in f]


# ---- writing GGUF files ---------------------------------------------------------------------------

def write_gguf(path, model, tokens, types_=None, scores=None, merges=None, pre=None, ids=None,
               flags=None, arch="llama"):
    import gguf

    w = gguf.GGUFWriter(path, arch)
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    if types_ is not None:
        w.add_token_types(types_)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    for key, value in (ids or {}).items():
        w.add_uint32("tokenizer.ggml." + key, value)
    for key, value in (flags or {}).items():
        w.add_bool("tokenizer.ggml." + key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def raw_gguf(path, kvs):
    """A GGUF v3 file with no tensors and the metadata `kvs` [(key, type, payload bytes)], for
    values the gguf package will not write (invalid UTF-8, NUL bytes)."""
    def s(b):
        return struct.pack("<Q", len(b)) + b
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, vtype, payload in kvs:
        out += s(key.encode()) + struct.pack("<I", vtype) + payload
    with open(path, "wb") as f:
        f.write(out)


def str_array(items):
    return struct.pack("<IQ", 8, len(items)) + b"".join(struct.pack("<Q", len(b)) + b for b in items)


def train_sentencepiece(texts):
    import sentencepiece as spm

    # the mostly-ASCII lines, so the rest of the corpus tokenizes through byte fallback
    mostly_ascii = [t for t in texts if t.strip() and sum(c.isascii() for c in t) >= 0.9 * len(t)]
    with tempfile.TemporaryDirectory() as d:
        prefix = os.path.join(d, "sp")
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(mostly_ascii), model_prefix=prefix,
            model_type="bpe", vocab_size=700, byte_fallback=True, character_coverage=0.98,
            user_defined_symbols=["<think>"], num_threads=1, hard_vocab_limit=False,
            minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    tokens, scores, types_ = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(float(sp.get_score(i)))
        # llama.cpp's SentencePiece types: 1 normal, 2 unknown, 3 control, 4 user-defined,
        # 5 unused, 6 byte
        types_.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 5 if sp.is_unused(i)
                      else 6 if sp.is_byte(i) else 4 if tokens[-1] == "<think>" else 1)
    return tokens, scores, types_


def train_byte_level(texts):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=500, show_progress=False,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    types_ = [3 if t.startswith("<|") else 1 for t in tokens]
    # the quirks: user-defined, a control token transformers skips, a duplicate spelling, a
    # token outside the byte alphabet
    for extra, kind in (("<think>", 4), ("<|ctl x|>", 3), ("\u00e9", 1), ("x y", 1)):
        tokens.append(extra)
        types_.append(kind)
    return tokens, types_, merges


def write_tiny(texts):
    os.makedirs(GGUF_DIR, exist_ok=True)
    files = {}
    tokens, scores, types_ = train_sentencepiece(texts)
    ids = {"bos_token_id": 1, "eos_token_id": 2, "unknown_token_id": 0}
    files["tiny_llama"] = dict(model="llama", tokens=tokens, types_=types_, scores=scores,
                               pre="default", ids=ids)
    tmp = os.path.join(GGUF_DIR, "tmp.gguf")
    write_gguf(tmp, **files["tiny_llama"])
    derived = json.loads(hf_tokenizer(tmp).backend_tokenizer.to_str())["model"]["merges"]
    os.remove(tmp)
    files["tiny_llama_merges"] = dict(model="llama", tokens=tokens, types_=types_, scores=scores,
                                      merges=[" ".join(m) for m in derived],
                                      ids=dict(ids, padding_token_id=0),
                                      flags={"add_bos_token": False, "add_eos_token": True})
    tokens, types_, merges = train_byte_level(texts)
    ids = {"bos_token_id": tokens.index("<|im_start|>"), "eos_token_id": tokens.index("<|im_end|>"),
           "unknown_token_id": 0, "padding_token_id": 0}
    files["tiny_gpt2"] = dict(model="gpt2", tokens=tokens, types_=types_, merges=merges,
                              pre="gpt-2", ids=ids, flags={"add_bos_token": False})
    files["tiny_gpt2_llama_bpe"] = dict(files["tiny_gpt2"], pre="llama-bpe",
                                        flags={"add_bos_token": True})
    files["tiny_gpt2_qwen2"] = dict(files["tiny_gpt2"], pre="qwen2", flags={"add_eos_token": True})
    for name, spec in files.items():
        write_gguf(os.path.join(GGUF_DIR, name + ".gguf"), **spec)
    return list(files)


def write_bad():
    """One file per refusal; the test expects each one's message."""
    toks = ["<unk>", "<s>", "</s>", "a", "b", "ab"]
    bad = {
        "bad_model_t5": dict(model="t5", tokens=toks, scores=[0.0] * 6),
        "bad_gemma": dict(model="llama", tokens=toks, scores=[0.0] * 6, arch="gemma"),
        "bad_types_length": dict(model="llama", tokens=toks, scores=[0.0] * 6, types_=[1, 3, 3]),
        "bad_bos_range": dict(model="llama", tokens=toks, scores=[0.0] * 6,
                              ids={"bos_token_id": 6}),
        "bad_merge": dict(model="gpt2", tokens=toks, merges=["a  b"]),
        "bad_no_scores": dict(model="llama", tokens=toks),
        "bad_nan_score": dict(model="llama", tokens=toks, scores=[0.0, 0.0, 0.0, 0.0, 0.0,
                                                                  math.nan]),
        "bad_merge_unknown": dict(model="gpt2", tokens=toks, merges=["a c"]),
    }
    for name, spec in bad.items():
        write_gguf(os.path.join(GGUF_DIR, name + ".gguf"), **spec)
    arch = ("general.architecture", 8, struct.pack("<Q", 5) + b"llama")
    model = ("tokenizer.ggml.model", 8, struct.pack("<Q", 5) + b"llama")
    raw_gguf(os.path.join(GGUF_DIR, "bad_no_tokenizer.gguf"), [arch])
    raw_gguf(os.path.join(GGUF_DIR, "bad_utf8.gguf"),
             [arch, model, ("tokenizer.ggml.tokens", 9, str_array([b"a", b"\xff\xfe"]))])
    raw_gguf(os.path.join(GGUF_DIR, "bad_nul.gguf"),
             [arch, model, ("tokenizer.ggml.tokens", 9, str_array([b"a", b"b\x00c"]))])
    raw_gguf(os.path.join(GGUF_DIR, "bad_types_type.gguf"),
             [arch, model, ("tokenizer.ggml.tokens", 9, str_array([b"a"])),
              ("tokenizer.ggml.token_type", 9, struct.pack("<IQI", 4, 1, 1))])
    return sorted(list(bad) + ["bad_no_tokenizer", "bad_utf8", "bad_nul", "bad_types_type"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smollm2", help="SmolLM2-135M-Instruct.Q4_1.gguf (default: "
                    "$NOPAD_SMOLLM2_GGUF, else ~/.cache/nopad/SmolLM2-135M-Instruct.Q4_1.gguf)")
    args = ap.parse_args()
    transformers = load_transformers()
    import tokenizers

    print(f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
    hexes = corpus()
    texts = [bytes.fromhex(h).decode("utf-8") for h in hexes]

    names = write_tiny(texts)
    bad = write_bad()
    toks = {}
    for name in names:
        tok = hf_tokenizer(os.path.join(GGUF_DIR, name + ".gguf"))
        print(f"{name}: {type(tok).__name__}, vocab {len(tok)}")
        toks[name] = tok
        tree = json.loads(tok.backend_tokenizer.to_str())
        with open(os.path.join(GGUF_DIR, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(tree, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
    with open(os.path.join(DATA, "gguf_cases.jsonl"), "w", encoding="utf-8") as f:
        for i, (h, text) in enumerate(zip(hexes, texts)):
            row = {"line": i, "hex": h}
            for name, tok in toks.items():
                ids = row[name] = tok(text).input_ids
                row[name + "/nospecial"] = tok(text, add_special_tokens=False).input_ids
                row[name + "/decode"] = tok.decode(ids).encode("utf-8").hex()
                row[name + "/decode_skip"] = tok.decode(ids, skip_special_tokens=True).encode(
                    "utf-8").hex()
            f.write(json.dumps(row) + "\n")
    print(f"wrote {len(names)} tokenizers, {len(bad)} bad files, {len(texts)} lines of "
          f"gguf_cases.jsonl")

    path = args.smollm2 or os.environ.get("NOPAD_SMOLLM2_GGUF") or os.path.expanduser(
        "~/.cache/nopad/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(path):
        print(f"no SmolLM2 GGUF at {path} (scripts/fetch_default_decoder.sh fetches it): "
              "smollm2_gguf_cases.jsonl left as it is")
        return
    tok = hf_tokenizer(path)
    print(f"{path}: {type(tok).__name__}, vocab {len(tok)}")
    with open(os.path.join(DATA, "smollm2_gguf_cases.jsonl"), "w", encoding="utf-8") as f:
        for i, (h, text) in enumerate(zip(hexes, texts)):
            ids = tok(text).input_ids
            f.write(json.dumps({
                "line": i, "hex": h, "ids": ids,
                "nospecial": tok(text, add_special_tokens=False).input_ids,
                "decode": tok.decode(ids).encode("utf-8").hex(),
                "decode_skip": tok.decode(ids, skip_special_tokens=True).encode("utf-8").hex(),
            }) + "\n")
    print(f"wrote {len(texts)} lines of smollm2_gguf_cases.jsonl")


if __name__ == "__main__":
    main()
