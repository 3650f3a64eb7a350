"""What the nopad serve tests share: the default decoder's and encoder's paths and the CLI's (from
the environment, as tests/python/conftest.py describes), the skip condition without them
(`pytestmark`), a server on loopback (`Server`), and the module fixtures `server` (nopad serve with
the default decoder, its GGUF weights as they are) and `client` (the openai client on `server`).
A test module takes the fixtures by importing them, and may define its own `server` (other
options) that the imported `client` then uses. Also a tiny random ChatML decoder
(`make_tiny_chat_decoder`) for the constrained tests' hard case."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import DATA
from serve_process import CLI, KEY, Server  # noqa: F401  (re-exported for the tests)

openai = pytest.importorskip("openai")

GGUF = os.environ.get("NOPAD_SMOLLM2_GGUF", "")
MINILM = os.environ.get("NOPAD_MINILM_DIR", "")
pytestmark = pytest.mark.skipif(not (Path(GGUF).is_file() and Path(MINILM).is_dir()
                                     and Path(CLI).is_file()),
                                reason="needs NOPAD_SMOLLM2_GGUF, NOPAD_MINILM_DIR and the CLI")
DEC_NAME = Path(GGUF).name[:-len(".gguf")] if GGUF.endswith(".gguf") else Path(GGUF).name
ENC_NAME = Path(MINILM).name


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
