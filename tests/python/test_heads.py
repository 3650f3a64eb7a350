"""Encoder.classify / Encoder.rerank / Tokenizer.encode_pair and DeBERTa through the package,
against the Hugging Face goldens of scripts/make_deberta_fixtures.py. Logits within 1e-4 of HF
(the bound of tests/test_heads.c; observed ~2e-7)."""
import json
import shutil

import numpy as np
import pytest

import nopad
from conftest import DATA, MODELS

TOL = 1e-4


def _golden(name, key):
    from safetensors.numpy import load_file
    return load_file(str(MODELS / name / "golden.safetensors"))[key]


@pytest.fixture(params=["bert_cls", "xlmr_rerank", "deberta_v3_a"])
def text_model(request, tmp_path):
    """(folder with the parity tokenizer copied in, golden_text.json)"""
    name = request.param
    g = json.loads((MODELS / name / "golden_text.json").read_text())
    for f in ("config.json", "model.safetensors"):
        shutil.copy(MODELS / name / f, tmp_path / f)
    shutil.copy(DATA.parent.parent / g["tokenizer"], tmp_path / "tokenizer.json")
    return tmp_path, g


def test_classify_and_pairs_match_hf(text_model):
    folder, g = text_model
    with nopad.Encoder(folder) as enc:
        assert enc.labels == g["labels"]
        logits = enc.classify(g["texts"])
        assert logits.shape == (len(g["texts"]), len(g["labels"]))
        assert np.abs(logits - np.array(g["logits"], np.float32)).max() <= TOL
        assert np.abs(enc.classify(g["texts"][0]) - logits[0]).max() <= 1e-6
        tok = enc.tokenizer
        for k, text in enumerate(g["texts"]):
            ids, types = tok.encode_pair(g["query"], text)
            assert ids == g["pair_ids"][k]
            assert types == g["pair_types"][k]
            cut, _ = tok.encode_pair(g["query"], text, truncate=True, max_length=g["truncate"])
            assert cut == g["pair_ids_truncated"][k]
        if len(g["labels"]) == 1:
            raw = enc.rerank(g["query"], g["texts"], raw_scores=True)
            want = np.array(g["pair_logits"], np.float32)[:, 0]
            assert np.abs(raw - want).max() <= TOL
            scores = enc.rerank(g["query"], g["texts"], batch_tokens=16)
            assert np.abs(scores - 1 / (1 + np.exp(-want))).max() <= TOL
        else:
            with pytest.raises(nopad.InvalidArgumentError, match="one-label head"):
                enc.rerank(g["query"], g["texts"])


@pytest.mark.parametrize("name", ["deberta_v3_a", "deberta_v2_b", "deberta_c2p", "deberta_p2c"])
def test_deberta_hidden_states_match_hf(name):
    ids, cu = _golden(name, "input_ids"), _golden(name, "cu_seqlens")
    types = _golden(name, "token_type_ids")
    want = _golden(name, "last_hidden_state")
    with nopad.Encoder(MODELS / name) as enc:
        assert enc.info.model_type == "deberta-v2"
        got = enc.forward(ids, cu, types if enc.info.type_vocab_size > 0 else None)
    rel = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
    assert rel.max() <= TOL


def test_models_without_heads():
    with nopad.Encoder(MODELS / "deberta_c2p") as enc:
        assert enc.labels == []
        with pytest.raises(nopad.InvalidArgumentError, match="no sequence-classification head"):
            enc._classify_packed(np.array([5, 6], np.int32), None, np.array([0, 2], np.int32), 0)
