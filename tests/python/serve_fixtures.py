"""What the nopad serve tests share: the default decoder's and encoder's paths and the CLI's (from
the environment, as tests/python/conftest.py describes), the skip condition without them
(`pytestmark`), a server on loopback (`Server`), and the module fixtures `server` (nopad serve with
the default decoder, its GGUF weights as they are) and `client` (the openai client on `server`).
A test module takes the fixtures by importing them, and may define its own `server` (other
options) that the imported `client` then uses. Also a tiny random ChatML decoder
(`make_tiny_chat_decoder`) for the constrained tests' hard case."""
import os
from pathlib import Path

import pytest

from conftest import DATA, make_tiny_chat_decoder  # noqa: F401  (re-exported for the tests)
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


