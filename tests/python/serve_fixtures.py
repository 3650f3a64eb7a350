"""What the nopad serve tests share: the default decoder's and encoder's paths and the CLI's (from
the environment, as tests/python/conftest.py describes), the skip condition without them
(`pytestmark`), a server on loopback (`Server`), and the module fixtures `server` (nopad serve with
the default decoder, its GGUF weights as they are) and `client` (the openai client on `server`).
A test module takes the fixtures by importing them, and may define its own `server` (other
options) that the imported `client` then uses. Also a tiny random ChatML decoder
(`make_tiny_chat_decoder`) for the constrained tests' hard case."""
import http.client
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import DATA, REPO

openai = pytest.importorskip("openai")

GGUF = os.environ.get("NOPAD_SMOLLM2_GGUF", "")
MINILM = os.environ.get("NOPAD_MINILM_DIR", "")
CLI = os.environ.get("NOPAD_CLI", str(REPO / "build" / "nopad"))
KEY = "sk-nopad-test"
pytestmark = pytest.mark.skipif(not (Path(GGUF).is_file() and Path(MINILM).is_dir()
                                     and Path(CLI).is_file()),
                                reason="needs NOPAD_SMOLLM2_GGUF, NOPAD_MINILM_DIR and the CLI")
DEC_NAME = Path(GGUF).name[:-len(".gguf")] if GGUF.endswith(".gguf") else Path(GGUF).name
ENC_NAME = Path(MINILM).name


class Server:
    """`nopad serve --port 0 ARGS` on loopback; its port read from its first line."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([CLI, "serve", "--port", "0", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + 120
        self.port = None
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("nopad serve did not start: %s" % "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
            if m:
                self.port = int(m.group(1))
            assert time.time() < deadline
        self._drain = threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True)
        self._drain.start()

    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def request(self, method, path, body=None, headers=None, timeout=120):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Authorization": "Bearer " + KEY}
        h.update(headers or {})
        data = json.dumps(body) if isinstance(body, (dict, list)) else body
        if data is not None:
            h.setdefault("Content-Type", "application/json")
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        out = r.status, dict(r.getheaders()), r.read()
        conn.close()
        return out

    def metrics(self):
        status, _, body = self.request("GET", "/metrics")
        assert status == 200
        values = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def stop(self):
        self.proc.terminate()
        rc = self.proc.wait(timeout=60)
        assert rc == 0, "nopad serve exited %d: %s" % (rc, "".join(self.log))


@pytest.fixture(scope="module")
def server():
    s = Server("--model", GGUF, "--api-key", KEY, "--threads", "2")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url() + "/v1", api_key=KEY, max_retries=0)


def make_tiny_chat_decoder(folder):
    """llama_gqa (2 layers, hidden 96) with the GPT-2-style byte-level test tokenizer (400 tokens)
    plus <|im_start|> and <|im_end|> (the end of a turn: its EOS); the embedding and head rows the
    vocabulary gained drawn at random with the old rows' spread; a context of 4096 (RoPE: the
    weights do not depend on it) for the tool prompt. The folder."""
    folder.mkdir()
    src = DATA / "models" / "llama_gqa"
    tok = json.loads((DATA / "tokenizer" / "bpe_gpt2.json").read_text())
    n = len(tok["model"]["vocab"])
    tok["added_tokens"] = [dict(id=n + i, content=c, single_word=False, lstrip=False, rstrip=False,
                                normalized=False, special=True)
                           for i, c in enumerate(["<|im_start|>", "<|im_end|>"])]
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(vocab_size=n + 2, max_position_embeddings=4096, bos_token_id=n, eos_token_id=n + 1)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "generation_config.json").write_text(json.dumps(dict(bos_token_id=n, eos_token_id=n + 1)))
    from safetensors.numpy import load_file, save_file
    w = load_file(str(src / "model.safetensors"))
    rng = np.random.default_rng(44)
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        extra = rng.normal(0, w[k].std(), (n + 2 - w[k].shape[0], w[k].shape[1])).astype(np.float32)
        w[k] = np.concatenate([w[k], extra])
    save_file(w, str(folder / "model.safetensors"))
    return folder
