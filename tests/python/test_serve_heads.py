"""TEI's POST /predict and POST /rerank on `nopad serve --embedding-model DIR` with a
sequence-classification folder (the tiny classifiers of scripts/make_deberta_fixtures.py with
their parity tokenizers): scores equal HF's logits through softmax / sigmoid within 1e-4 (the bound
of tests/test_heads.c), best first, and the refusals."""
import json
import math
import shutil
from pathlib import Path

import pytest

from conftest import DATA, MODELS
from serve_process import CLI, Server

pytestmark = pytest.mark.skipif(not Path(CLI).is_file(), reason="needs the CLI (NOPAD_CLI)")
TOL = 1e-4


def start(folder):
    return Server("--threads", "2", "--embedding-model", str(folder))


def post(server, path, body):
    """(status, the JSON answer)."""
    status, _, raw = server.request("POST", path, body, timeout=60)
    return status, json.loads(raw or b"null")


def _folder(tmp_path_factory, name):
    g = json.loads((MODELS / name / "golden_text.json").read_text())
    d = tmp_path_factory.mktemp(name)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(MODELS / name / f, d / f)
    shutil.copy(DATA.parent.parent / g["tokenizer"], d / "tokenizer.json")
    return d, g


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    d, g = _folder(tmp_path_factory, "xlmr_rerank")
    s = start(d)
    yield s, g
    s.stop()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    d, g = _folder(tmp_path_factory, "bert_cls")
    s = start(d)
    yield s, g
    s.stop()


def _softmax(x):
    m = max(x)
    e = [math.exp(v - m) for v in x]
    return [v / sum(e) for v in e]


def test_rerank_matches_hf(reranker):
    s, g = reranker
    status, out = post(s, "/rerank", {"query": g["query"], "texts": g["texts"], "return_text": True})
    assert status == 200, out
    want = [1 / (1 + math.exp(-x[0])) for x in g["pair_logits"]]
    assert sorted(r["index"] for r in out) == list(range(len(g["texts"])))
    assert [r["score"] for r in out] == sorted((r["score"] for r in out), reverse=True)
    for r in out:
        assert abs(r["score"] - want[r["index"]]) <= TOL
        assert r["text"] == g["texts"][r["index"]]
    status, raw = post(s, "/rerank", {"query": g["query"], "texts": g["texts"], "raw_scores": True})
    assert status == 200
    for r in raw:
        assert abs(r["score"] - g["pair_logits"][r["index"]][0]) <= TOL
    # a single-label head on /predict: sigmoid of the text's logit
    status, one = post(s, "/predict", {"inputs": g["texts"][0]})
    assert status == 200 and len(one) == 1
    assert abs(one[0]["score"] - 1 / (1 + math.exp(-g["logits"][0][0]))) <= TOL


def test_predict_matches_hf(classifier):
    s, g = classifier
    status, out = post(s, "/predict", {"inputs": g["texts"]})
    assert status == 200, out
    assert len(out) == len(g["texts"])
    for preds, logits in zip(out, g["logits"]):
        p = _softmax(logits)
        assert [q["score"] for q in preds] == sorted((q["score"] for q in preds), reverse=True)
        for q in preds:
            assert abs(q["score"] - p[g["labels"].index(q["label"])]) <= TOL
    # one pair, [a, b]: the pair template with its token types
    status, pair = post(s, "/predict", {"inputs": [g["query"], g["texts"][0]], "raw_scores": True})
    assert status == 200
    for q in pair:
        assert abs(q["score"] - g["pair_logits"][0][g["labels"].index(q["label"])]) <= TOL
    # a batch mixing a text and a pair
    status, mixed = post(s, "/predict", {"inputs": [[g["texts"][1]], [g["query"], g["texts"][2]]], "raw_scores": True})
    assert status == 200 and len(mixed) == 2
    for q in mixed[0]:
        assert abs(q["score"] - g["logits"][1][g["labels"].index(q["label"])]) <= TOL
    for q in mixed[1]:
        assert abs(q["score"] - g["pair_logits"][2][g["labels"].index(q["label"])]) <= TOL


def test_refusals(classifier, reranker):
    s, g = classifier
    status, out = post(s, "/rerank", {"query": "q", "texts": ["a"]})
    assert status == 400 and "one-label head" in out["error"]["message"]
    status, out = post(s, "/predict", {"inputs": ["a b " * 100], "truncate": False})
    assert status == 400 and out["error"]["code"] == "context_length_exceeded"
    status, out = post(s, "/predict", {"inputs": ["a b " * 100], "truncate": True})
    assert status == 200
    status, out = post(s, "/predict", {"inputs": [["a", "b", "c"]]})
    assert status == 400 and out["error"]["param"] == "inputs[0]"
    status, out = post(s, "/predict", {"inputs": "x", "normalize": True})
    assert status == 400 and out["error"]["param"] == "normalize"
    r, _ = reranker
    status, out = post(r, "/rerank", {"texts": ["a"]})
    assert status == 400 and out["error"]["param"] == "query"
    status, out = post(r, "/rerank", {"query": "q", "texts": []})
    assert status == 400 and out["error"]["param"] == "texts"
