#!/usr/bin/env python3
"""Tiny random encoders with real tokenizers: text in, hidden states out, for end-to-end tests.

    python3 scripts/make_text_models.py --tokenizers-only   # no torch: tokenizer files + texts
    python3 scripts/make_text_models.py                     # torch: weights + goldens
    python3 scripts/make_text_models.py --only albert_text  # some folders only (either mode)

Writes tests/data/models/<name>/ for
    roberta_text  RobertaModel     + byte-level BPE (tests/data/tokenizer/parity/bpe_roberta.json)
    xlmr_text     XLMRobertaModel  + Unigram as xlm-roberta-base ships it (parity/unigram_xlmr.json)
    albert_text   AlbertModel      + Unigram as albert-base-v2 ships it (parity/unigram_albert.json)
The tokenizers are those of scripts/make_tokenizer_parity.py (trained on the tokenizer corpus), so
the model folders and the parity fixtures agree; config.json's vocab_size is the tokenizer's size.

The work is split so that the machine with torch needs neither sentencepiece nor protobuf:

--tokenizers-only (tokenizers + transformers, no torch; the outputs are committed):
    tokenizer.json         the parity file, copied byte for byte
    tokenizer_config.json  as transformers' <Class>.save_pretrained writes it (model_max_length =
                           the longest sequence the model takes); transformers 5 writes no
                           special_tokens_map.json, and none is made here
    golden_texts.txt       8 texts from the corpus, one per line (UTF-8, LF, none holds a line
                           break, a control character or edge whitespace), in packed order
default (torch + transformers + tokenizers + safetensors + numpy; reads the files above):
    config.json, model.safetensors   save_pretrained of the seeded random model (p += 0.1 * randn)
    golden.safetensors
        input_ids          int32 [T]    tokenizers.Tokenizer.from_file(tokenizer.json).encode(text)
                                        with special tokens, truncated to the model's maximum
        token_type_ids     int32 [T]    the encoding's type ids (zeros)
        cu_seqlens         int32 [B+1]
        last_hidden_state  float32 [T, H]  HF, one sequence at a time, fp32, eager, eval
    Checks (fails loudly): the reloaded model equals the in-memory one; a right-padded batch with
    an attention mask gives the same per-token outputs (atol 1e-4). Reports (does not fail) texts
    where transformers' AutoTokenizer gives other ids than the tokenizer.json run by `tokenizers`
    (transformers 5 rebuilds the XLM-R and ALBERT pipelines; see tests/data/README.md).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import unicodedata
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(ROOT, "tests", "data", "models")
TOK_DIR = os.path.join(ROOT, "tests", "data", "tokenizer")
NOISE = 0.1

COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

# name: parity tokenizer, transformers tokenizer class, model class, config, seed, max tokens
SPECS = {
    "roberta_text": dict(
        tok="bpe_roberta", tokenizer_class="RobertaTokenizer", model_class="RobertaModel",
        config_class="RobertaConfig", seed=61, max_len=80,
        config=dict(max_position_embeddings=82, type_vocab_size=1, layer_norm_eps=1e-5,
                    hidden_act="gelu", pad_token_id=1, bos_token_id=0, eos_token_id=2)),
    "xlmr_text": dict(
        tok="unigram_xlmr", tokenizer_class="XLMRobertaTokenizer", model_class="XLMRobertaModel",
        config_class="XLMRobertaConfig", seed=62, max_len=80,
        config=dict(max_position_embeddings=82, type_vocab_size=1, layer_norm_eps=1e-5,
                    hidden_act="gelu", pad_token_id=1, bos_token_id=0, eos_token_id=2)),
    "albert_text": dict(
        tok="unigram_albert", tokenizer_class="AlbertTokenizer", model_class="AlbertModel",
        config_class="AlbertConfig", seed=63, max_len=80,
        config=dict(max_position_embeddings=80, embedding_size=16, type_vocab_size=2,
                    num_hidden_groups=1, inner_group_num=1, layer_norm_eps=1e-12,
                    hidden_act="gelu_new", classifier_dropout_prob=0.0, pad_token_id=0,
                    bos_token_id=2, eos_token_id=3)),
}


def folder(name):
    return os.path.join(MODELS_DIR, name)


def hf_tokenizer(name, truncate=True):
    """The folder's tokenizer.json as `tokenizers` runs it (what nopad reads)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(folder(name), "tokenizer.json"))
    if truncate:
        tok.enable_truncation(max_length=SPECS[name]["max_len"])
    return tok


def read_texts(name):
    with open(os.path.join(folder(name), "golden_texts.txt"), encoding="utf-8", newline="\n") as f:
        data = f.read()
    assert data.endswith("\n")
    return data[:-1].split("\n")


def autotokenizer_differences(name, texts, ids):
    """Texts where transformers' AutoTokenizer on the folder disagrees with `tokenizers`."""
    try:
        import transformers

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            at = transformers.AutoTokenizer.from_pretrained(folder(name))
        max_len = SPECS[name]["max_len"]
        return [i for i, (t, want) in enumerate(zip(texts, ids))
                if at(t, truncation=True, max_length=max_len)["input_ids"] != want], None
    except Exception as e:  # a missing optional package must not stop the goldens
        return None, "%s: %s" % (type(e).__name__, e)


# ---- --tokenizers-only ---------------------------------------------------------------------------

def corpus_texts():
    with open(os.path.join(TOK_DIR, "corpus.jsonl"), encoding="utf-8") as f:
        return [bytes.fromhex(json.loads(line)["hex"]).decode("utf-8") for line in f]


def plain(text):
    """Safe on one line of a text file: no line break, control, format or edge whitespace."""
    return bool(text) and text == text.strip() and not any(
        unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn") for c in text)


SCRIPT_RANGES = [("a", "z"), ("\u0370", "\u03ff"), ("\u0400", "\u04ff"), ("\u0590", "\u05ff"),
                 ("\u0600", "\u06ff"), ("\u0900", "\u097f"), ("\u0e00", "\u0e7f"),
                 ("\u3040", "\u30ff"), ("\u4e00", "\u9fff"), ("\uac00", "\ud7a3")]


def n_scripts(text):
    low = text.lower()
    return sum(any(a <= c <= b for c in low) for a, b in SCRIPT_RANGES)


PICKS = [  # (what, predicate on the text); the first corpus line that fits and is unused
    ("many scripts", lambda t: n_scripts(t) >= 5),
    ("CJK", lambda t: any("\u4e00" <= c <= "\u9fff" for c in t)),
    ("Arabic or Hebrew", lambda t: any("\u0590" <= c <= "\u06ff" for c in t)),
    ("emoji", lambda t: any(0x1F300 <= ord(c) <= 0x1FAFF for c in t)),
    ("accented Latin", lambda t: any(c in t for c in "éèàüöçñ")),
]


def pick_texts(name):
    """8 texts in packed order (not sorted by length): 5 lines of various scripts, one single-piece
    word, one line just under the maximum, one line truncated to it."""
    tok = hf_tokenizer(name, truncate=False)
    max_len = SPECS[name]["max_len"]
    texts = [t for t in corpus_texts() if plain(t)]
    n = {t: len(tok.encode(t).ids) for t in texts}
    chosen = {}
    for what, pred in PICKS:
        chosen[what] = next(t for t in texts if pred(t) and n[t] < max_len - 15
                            and t not in chosen.values())
    unk = {tok.token_to_id(s) for s in ("<unk>", "[UNK]")} - {None}
    chosen["one piece"] = next(
        w for t in texts for w in t.split(" ")
        if len(w) >= 3 and plain(w) and len(tok.encode(w, add_special_tokens=False).ids) == 1
        and tok.encode(w, add_special_tokens=False).ids[0] not in unk)
    chosen["near maximum"] = next(t for t in texts if max_len - 15 <= n[t] < max_len)
    chosen["truncated"] = next(t for t in texts if n[t] > max_len and len(t) < 2000)
    order = ["many scripts", "truncated", "CJK", "one piece", "emoji", "near maximum",
             "Arabic or Hebrew", "accented Latin"]
    return [(what, chosen[what]) for what in order]


def write_tokenizer_files(name):
    import transformers

    spec = SPECS[name]
    out = folder(name)
    os.makedirs(out, exist_ok=True)
    src = os.path.join(TOK_DIR, "parity", spec["tok"] + ".json")
    if not os.path.exists(src):
        sys.exit("%s missing: run scripts/make_tokenizer_parity.py" % src)
    shutil.copyfile(src, os.path.join(out, "tokenizer.json"))
    with tempfile.TemporaryDirectory() as d:
        shutil.copyfile(src, os.path.join(d, "tokenizer.json"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = getattr(transformers, spec["tokenizer_class"]).from_pretrained(
                d, model_max_length=spec["max_len"])
            t.save_pretrained(os.path.join(d, "saved"))
        for f in ("tokenizer_config.json", "special_tokens_map.json"):
            path = os.path.join(d, "saved", f)
            if os.path.exists(path):
                with open(path, encoding="utf-8") as fh:
                    j = json.load(fh)
                j.pop("is_local", None)  # where it was loaded from: this machine's temp folder
                with open(os.path.join(out, f), "w", encoding="utf-8") as fh:
                    json.dump(j, fh, indent=2, ensure_ascii=False, sort_keys=True)
                    fh.write("\n")
    picks = pick_texts(name)
    with open(os.path.join(out, "golden_texts.txt"), "w", encoding="utf-8", newline="\n") as f:
        for _, text in picks:
            f.write(text + "\n")
    tok = hf_tokenizer(name)
    texts = read_texts(name)
    assert texts == [t for _, t in picks]
    ids = [tok.encode(t).ids for t in texts]
    print("%s: %s, vocab %d, max %d tokens" % (name, spec["tok"], tok.get_vocab_size(),
                                               spec["max_len"]))
    for (what, text), i in zip(picks, ids):
        print("    %-18s %3d ids  %.60r" % (what, len(i), text))
    diff, err = autotokenizer_differences(name, texts, ids)
    if err:
        print("    AutoTokenizer not checked (%s)" % err)
    else:
        print("    AutoTokenizer(folder) differs from tokenizers on %d of %d texts%s" % (
            len(diff), len(texts), (": " + str(diff)) if diff else ""))


# ---- weights and goldens (torch) ------------------------------------------------------------------

def build_model(name):
    import torch
    import transformers

    spec = SPECS[name]
    vocab = hf_tokenizer(name).get_vocab_size()
    torch.manual_seed(spec["seed"])
    cfg = getattr(transformers, spec["config_class"])(vocab_size=vocab, **COMMON, **spec["config"])
    model = getattr(transformers, spec["model_class"])(cfg)
    g = torch.Generator().manual_seed(spec["seed"] + 1000)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(NOISE * torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype))
    model.eval()
    return model


def make_goldens(name):
    import numpy as np
    import torch
    import transformers
    from safetensors.numpy import save_file

    spec = SPECS[name]
    path = folder(name)
    for f in ("tokenizer.json", "golden_texts.txt"):
        if not os.path.exists(os.path.join(path, f)):
            sys.exit("%s/%s missing: run with --tokenizers-only first" % (path, f))
    model = build_model(name)
    for f in ("config.json", "model.safetensors", "golden.safetensors"):
        if os.path.exists(os.path.join(path, f)):
            os.remove(os.path.join(path, f))
    model.save_pretrained(path, safe_serialization=True)
    cls = getattr(transformers, spec["model_class"])
    loaded, info = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                                       output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "mismatched_keys")}
    assert not bad, "%s: %s" % (path, bad)
    loaded.eval()
    model.config._attn_implementation = "eager"

    tok = hf_tokenizer(name)
    texts = read_texts(name)
    encs = [tok.encode(t) for t in texts]
    ids = [np.array(e.ids, dtype=np.int64) for e in encs]
    tts = [np.array(e.type_ids, dtype=np.int64) for e in encs]
    assert all(1 <= len(i) <= spec["max_len"] for i in ids)
    # a pad id inside a RoBERTa-like sequence would change HF's position ids; none is expected
    assert all(loaded.config.pad_token_id not in i for i in ids) or name == "albert_text"
    assert max(len(i) for i in ids) == spec["max_len"], "no text reaches the maximum"

    def run(m):
        outs = []
        with torch.no_grad():
            for i, t in zip(ids, tts):
                o = m(input_ids=torch.from_numpy(i)[None], token_type_ids=torch.from_numpy(t)[None],
                      attention_mask=torch.ones(1, len(i), dtype=torch.long)).last_hidden_state[0]
                assert torch.isfinite(o).all()
                outs.append(o.float().numpy())
        return outs

    hidden = run(loaded)
    for a, b in zip(hidden, run(model)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    # a right-padded batch with an attention mask gives the same per-token outputs
    L = max(len(i) for i in ids)
    pad = loaded.config.pad_token_id
    bi = torch.full((len(ids), L), pad, dtype=torch.long)
    bt = torch.zeros((len(ids), L), dtype=torch.long)
    bm = torch.zeros((len(ids), L), dtype=torch.long)
    for r, (i, t) in enumerate(zip(ids, tts)):
        bi[r, :len(i)] = torch.from_numpy(i)
        bt[r, :len(i)] = torch.from_numpy(t)
        bm[r, :len(i)] = 1
    with torch.no_grad():
        bo = loaded(input_ids=bi, token_type_ids=bt, attention_mask=bm).last_hidden_state
    for r, h in enumerate(hidden):
        np.testing.assert_allclose(bo[r, :len(h)].numpy(), h, rtol=0, atol=1e-4)

    cu = np.zeros(len(ids) + 1, dtype=np.int32)
    cu[1:] = np.cumsum([len(i) for i in ids])
    import tokenizers

    golden = {"input_ids": np.concatenate(ids).astype(np.int32),
              "token_type_ids": np.concatenate(tts).astype(np.int32),
              "cu_seqlens": cu,
              "last_hidden_state": np.concatenate(hidden, axis=0).astype(np.float32)}
    save_file(golden, os.path.join(path, "golden.safetensors"),
              metadata={"generator": "scripts/make_text_models.py", "model": name,
                        "tokenizer": "tokenizers " + tokenizers.__version__})
    print("%s: %s vocab %d, lengths %s (T = %d), torch %s, transformers %s" % (
        name, spec["model_class"], loaded.config.vocab_size, [len(i) for i in ids], int(cu[-1]),
        torch.__version__, transformers.__version__))
    diff, err = autotokenizer_differences(name, texts, [list(i) for i in ids])
    if err:
        print("    AutoTokenizer not checked (%s)" % err)
    elif diff:
        print("    note: AutoTokenizer(folder) differs from tokenizer.json on texts %s" % diff)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizers-only", action="store_true",
                    help="write the tokenizer files and golden_texts.txt (no torch needed)")
    ap.add_argument("--only", nargs="*", choices=sorted(SPECS), help="folders (default: all)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    for name in args.only or list(SPECS):
        if args.tokenizers_only:
            write_tokenizer_files(name)
        else:
            try:
                import torch  # noqa: F401
            except ImportError:
                sys.exit("weights and goldens need torch; --tokenizers-only does not")
            make_goldens(name)


if __name__ == "__main__":
    main()
