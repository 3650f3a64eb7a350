"""A model folder whose tokenizer nopad does not support still loads from Python: token ids work
(Encoder.forward), text (Encoder.encode) raises UnsupportedError saying why; a malformed tokenizer
file still fails the load."""
import json
import shutil

import numpy as np
import pytest

import nopad
from conftest import MODELS


def folder(tmp_path, tokenizer_json):
    d = tmp_path / "m"
    d.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(MODELS / "bert_a" / f, d / f)
    (d / "tokenizer.json").write_text(tokenizer_json)
    return d


def test_ids_work_and_text_says_why(tmp_path, capfd):
    tok = {"model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"}}
    with nopad.Encoder(folder(tmp_path, json.dumps(tok))) as enc:
        err = capfd.readouterr().err
        assert "nopad: warning:" in err and "WordLevel" in err
        assert enc.tokenizer is None
        assert 'model type "WordLevel" is not supported' in enc.tokenizer_error
        assert enc.info.has_tokenizer is False
        assert enc.info.tokenizer_kind == "unsupported"
        hidden = enc.forward(np.array([1, 2, 3], np.int32), np.array([0, 3], np.int32))
        assert hidden.shape[0] == 3
        with pytest.raises(nopad.UnsupportedError, match='"WordLevel" is not supported') as e:
            enc.encode("some text")
        assert "forward() takes token ids" in str(e.value)


def test_broken_tokenizer_still_fails(tmp_path):
    with pytest.raises(nopad.FormatError, match="not valid JSON"):
        nopad.Encoder(folder(tmp_path, '{"model": '))


def test_no_tokenizer_has_no_reason():
    with nopad.Encoder(MODELS / "bert_a") as enc:
        assert enc.tokenizer is None and enc.tokenizer_error is None
        with pytest.raises(nopad.FileError, match="no tokenizer.json or vocab.txt"):
            enc.encode("text")
