"""Shared fixtures of the Python package tests (tests/python).

Run from the repository root, after building libnopad.so:

    NOPAD_LIBRARY=build/libnopad.so python3 -m pytest -q tests/python

Without NOPAD_LIBRARY the package finds an installed copy or build/libnopad.so. The package is
imported from python/ unless it is installed. Environment: NOPAD_MINILM_DIR (all-MiniLM-L6-v2,
from scripts/fetch_default_model.sh; its tests are skipped without it), NOPAD_CLI (the nopad
CLI; default build/nopad next to the library).
"""
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
MODELS = DATA / "models"

# As ctest runs the C tests: two threads, no spinning (set before OpenMP starts).
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    import nopad  # noqa: F401  (installed)
except ImportError:
    sys.path.insert(0, str(REPO / "python"))
    import nopad  # noqa: F401,E402



def _golden_tensors(folder):
    """Names of the tensors in folder/golden.safetensors (its JSON header), or () when absent."""
    import struct
    path = folder / "golden.safetensors"
    if not path.is_file():
        return ()
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return tuple(k for k in json.loads(f.read(n)) if k != "__metadata__")


# Encoder goldens hold last_hidden_state; decoder goldens (make_decoder_fixtures.py) logits.
GOLDEN_MODELS = sorted(p.name for p in MODELS.iterdir()
                       if "last_hidden_state" in _golden_tensors(p))
DECODER_MODELS = sorted(p.name for p in MODELS.iterdir() if "logits" in _golden_tensors(p))
ST_MODELS = [m for m in GOLDEN_MODELS if m.startswith("st_")]


def load_safetensors(path):
    st = pytest.importorskip("safetensors.numpy")
    return st.load_file(str(path))


def row_rel_err(a, b):
    """max over rows of |a - b| / |b| (L2 per row)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float((np.linalg.norm(a - b, axis=-1) / np.maximum(np.linalg.norm(b, axis=-1),
                                                              1e-12)).max())


@pytest.fixture(scope="session")
def minilm_dir():
    d = os.environ.get("NOPAD_MINILM_DIR") or os.path.expanduser("~/.cache/nopad/all-MiniLM-L6-v2")
    if not (Path(d) / "config.json").is_file():
        pytest.skip("all-MiniLM-L6-v2 not found (set NOPAD_MINILM_DIR; "
                    "scripts/fetch_default_model.sh fetches it)")
    return Path(d)


@pytest.fixture(scope="session")
def minilm(minilm_dir):
    with nopad.Encoder(minilm_dir) as enc:
        yield enc


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("NOPAD_CLI")
    if not path:
        path = str(nopad.library_path().parent / "nopad")
    if not os.access(path, os.X_OK):
        candidate = REPO / "build" / "nopad"
        if not os.access(candidate, os.X_OK):
            pytest.skip("the nopad CLI was not found (set NOPAD_CLI)")
        path = str(candidate)
    return path


def read_lines(path):
    """Lines as the CLI reads them: split at '\\n', a trailing '\\r' dropped, bytes kept."""
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [l[:-1] if l.endswith(b"\r") else l for l in lines]


@pytest.fixture(scope="session")
def capi_helper(tmp_path_factory):
    """tests/python/capi_helper.c compiled against include/nopad.h and the loaded libnopad.so."""
    import shutil
    import subprocess

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    lib = nopad.library_path().resolve()
    exe = tmp_path_factory.mktemp("capi") / "capi_helper"
    cmd = [cc, "-std=c11", "-O1", "-I", str(REPO / "include"), str(Path(__file__).with_name(
        "capi_helper.c")), str(lib), "-Wl,-rpath," + str(lib.parent), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return exe


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
