"""TEI's POST /predict and POST /rerank on `nopad serve --embedding-model DIR` with a
sequence-classification folder (the tiny classifiers of scripts/make_deberta_fixtures.py with
their parity tokenizers): scores equal HF's logits through softmax / sigmoid within 1e-4 (the bound
of tests/test_heads.c), best first, and the refusals."""
import http.client
import json
import math
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import DATA, MODELS, REPO

CLI = os.environ.get("NOPAD_CLI", str(REPO / "build" / "nopad"))
pytestmark = pytest.mark.skipif(not Path(CLI).is_file(), reason="needs the CLI (NOPAD_CLI)")
TOL = 1e-4


class Server:
    """`nopad serve --port 0 --embedding-model DIR` on loopback."""

    def __init__(self, folder):
        self.proc = subprocess.Popen([CLI, "serve", "--port", "0", "--threads", "2", "--embedding-model",
                                      str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log, self.port = [], None
        deadline = time.time() + 60
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                if "without libmicrohttpd" in "".join(self.log):
                    pytest.skip("nopad was built without libmicrohttpd")
                raise RuntimeError("nopad serve did not start: %s" % "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
            if m:
                self.port = int(m.group(1))
            assert time.time() < deadline
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()

    def post(self, path, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        out = r.status, json.loads(r.read() or b"null")
        conn.close()
        return out

    def stop(self):
        self.proc.terminate()
        assert self.proc.wait(timeout=60) == 0, "".join(self.log)


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
    s = Server(d)
    yield s, g
    s.stop()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    d, g = _folder(tmp_path_factory, "bert_cls")
    s = Server(d)
    yield s, g
    s.stop()


def _softmax(x):
    m = max(x)
    e = [math.exp(v - m) for v in x]
    return [v / sum(e) for v in e]


def test_rerank_matches_hf(reranker):
    s, g = reranker
    status, out = s.post("/rerank", {"query": g["query"], "texts": g["texts"], "return_text": True})
    assert status == 200, out
    want = [1 / (1 + math.exp(-x[0])) for x in g["pair_logits"]]
    assert sorted(r["index"] for r in out) == list(range(len(g["texts"])))
    assert [r["score"] for r in out] == sorted((r["score"] for r in out), reverse=True)
    for r in out:
        assert abs(r["score"] - want[r["index"]]) <= TOL
        assert r["text"] == g["texts"][r["index"]]
    status, raw = s.post("/rerank", {"query": g["query"], "texts": g["texts"], "raw_scores": True})
    assert status == 200
    for r in raw:
        assert abs(r["score"] - g["pair_logits"][r["index"]][0]) <= TOL
    # a single-label head on /predict: sigmoid of the text's logit
    status, one = s.post("/predict", {"inputs": g["texts"][0]})
    assert status == 200 and len(one) == 1
    assert abs(one[0]["score"] - 1 / (1 + math.exp(-g["logits"][0][0]))) <= TOL


def test_predict_matches_hf(classifier):
    s, g = classifier
    status, out = s.post("/predict", {"inputs": g["texts"]})
    assert status == 200, out
    assert len(out) == len(g["texts"])
    for preds, logits in zip(out, g["logits"]):
        p = _softmax(logits)
        assert [q["score"] for q in preds] == sorted((q["score"] for q in preds), reverse=True)
        for q in preds:
            assert abs(q["score"] - p[g["labels"].index(q["label"])]) <= TOL
    # one pair, [a, b]: the pair template with its token types
    status, pair = s.post("/predict", {"inputs": [g["query"], g["texts"][0]], "raw_scores": True})
    assert status == 200
    for q in pair:
        assert abs(q["score"] - g["pair_logits"][0][g["labels"].index(q["label"])]) <= TOL
    # a batch mixing a text and a pair
    status, mixed = s.post("/predict", {"inputs": [[g["texts"][1]], [g["query"], g["texts"][2]]], "raw_scores": True})
    assert status == 200 and len(mixed) == 2
    for q in mixed[0]:
        assert abs(q["score"] - g["logits"][1][g["labels"].index(q["label"])]) <= TOL
    for q in mixed[1]:
        assert abs(q["score"] - g["pair_logits"][2][g["labels"].index(q["label"])]) <= TOL


def test_refusals(classifier, reranker):
    s, g = classifier
    status, out = s.post("/rerank", {"query": "q", "texts": ["a"]})
    assert status == 400 and "one-label head" in out["error"]["message"]
    status, out = s.post("/predict", {"inputs": ["a b " * 100], "truncate": False})
    assert status == 400 and out["error"]["code"] == "context_length_exceeded"
    status, out = s.post("/predict", {"inputs": ["a b " * 100], "truncate": True})
    assert status == 200
    status, out = s.post("/predict", {"inputs": [["a", "b", "c"]]})
    assert status == 400 and out["error"]["param"] == "inputs[0]"
    status, out = s.post("/predict", {"inputs": "x", "normalize": True})
    assert status == 400 and out["error"]["param"] == "normalize"
    r, _ = reranker
    status, out = r.post("/rerank", {"texts": ["a"]})
    assert status == 400 and out["error"]["param"] == "query"
    status, out = r.post("/rerank", {"query": "q", "texts": []})
    assert status == 400 and out["error"]["param"] == "texts"
