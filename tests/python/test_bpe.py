"""The Python package on byte-level BPE tokenizers (the fixtures of scripts/make_bpe_fixtures.py):
nopad.Tokenizer loads a folder whose tokenizer.json is BPE and gives HF's ids."""
import json
import os
import shutil

import numpy as np

import nopad
from conftest import REPO

DATA = os.path.join(REPO, "tests", "data", "tokenizer")


def cases():
    with open(os.path.join(DATA, "corpus.jsonl"), encoding="utf-8") as f:
        corpus = [bytes.fromhex(json.loads(line)["hex"]) for line in f]
    with open(os.path.join(DATA, "bpe_cases.jsonl"), encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            text = corpus[rec["line"]] if rec["line"] >= 0 else bytes.fromhex(rec["hex"])
            yield text, rec


def folder(tmp_path, name):
    shutil.copy(os.path.join(DATA, name), tmp_path / "tokenizer.json")
    return tmp_path


def test_roberta_ids_equal_hf(tmp_path):
    with nopad.Tokenizer(folder(tmp_path, "bpe_roberta.json")) as tok:
        texts, want = [], []
        for text, rec in cases():
            assert tok.encode(text) == rec["roberta"]
            assert tok.encode(text, add_special_tokens=False) == rec["nospecial"]
            texts.append(text)
            want.append(rec["roberta"])
        ids, cu_seqlens = tok.encode_batch(texts)
        assert list(np.diff(cu_seqlens)) == [len(w) for w in want]
        assert list(ids) == [i for w in want for i in w]
        assert tok.encode("a <mask>")[-2] == 4  # <mask> (lstrip) matched before the model


def test_gpt2_ids_equal_hf(tmp_path):
    with nopad.Tokenizer(folder(tmp_path, "bpe_gpt2.json")) as tok:
        for text, rec in cases():
            assert tok.encode(text) == rec["gpt2"]
