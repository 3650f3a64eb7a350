"""Every bad input of the foundation issue raises a clear exception from Python (never a crash),
carrying nopad's message and status; a failed call leaves the object usable."""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

import nopad
from conftest import MODELS


def copy_model(tmp_path, name="bert_a", config=None, files=("config.json", "model.safetensors")):
    d = tmp_path / ("m_%s" % name)
    d.mkdir()
    for f in files:
        shutil.copy(MODELS / name / f, d / f)
    if config is not None:
        (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return d


def bert_a_config(**changes):
    cfg = json.loads((MODELS / "bert_a" / "config.json").read_text())
    cfg.update(changes)
    return cfg


def expect(cls, status, words, fn, *args, **kwargs):
    with pytest.raises(cls) as e:
        fn(*args, **kwargs)
    assert isinstance(e.value, nopad.NopadError)
    assert e.value.status == status
    for w in words:
        assert w.lower() in str(e.value).lower(), (w, str(e.value))
    return e.value


IO, FORMAT, UNSUP = nopad.Status.IO, nopad.Status.FORMAT, nopad.Status.UNSUPPORTED
INVAL, TOO_LONG = nopad.Status.INVALID_ARGUMENT, nopad.Status.TOO_LONG


# ---- loading -------------------------------------------------------------------------------------

def test_missing_folder_and_files(tmp_path):
    err = expect(nopad.FileError, IO, ["does not exist"], nopad.Encoder, tmp_path / "nope")
    assert isinstance(err, OSError)
    empty = tmp_path / "empty"
    empty.mkdir()
    expect(nopad.FileError, IO, ["config.json"], nopad.Encoder, empty)
    d = copy_model(tmp_path, files=("config.json",))
    expect(nopad.FileError, IO, ["model.safetensors"], nopad.Encoder, d)
    expect(nopad.NopadError, IO, [], nopad.Encoder, MODELS / "bert_a" / "config.json")


def _cli_message(path):
    """The CLI's message for model folder `path` (nopad info), or None without a CLI."""
    cli = os.environ.get("NOPAD_CLI")
    if not cli:
        return None
    r = subprocess.run([cli, "info", "--model", str(path)], capture_output=True, text=True)
    assert r.returncode == 1, r
    return r.stderr.strip().replace("nopad: error: ", "", 1)


def test_gguf_path_messages_match_the_cli(tmp_path):
    """A .gguf path is a GGUF file, never a "model folder": missing, or with another magic."""
    missing = tmp_path / "nope.gguf"
    zipped = tmp_path / "model.gguf"
    zipped.write_bytes(b"PK\x03\x04 not a gguf")
    err = expect(nopad.FileError, IO, ["GGUF file '%s' does not exist" % missing], nopad.Encoder,
                 missing)
    cli = _cli_message(missing)
    if cli is not None:
        assert str(err) == cli, (str(err), cli)
    err = expect(nopad.FormatError, FORMAT, ['is not a GGUF file (magic "PK\\x03\\x04"'],
                 nopad.Encoder, zipped)
    cli = _cli_message(zipped)
    if cli is not None:
        assert str(err) in cli, (str(err), cli)


def test_folder_messages_match_the_cli(tmp_path):
    """A missing path, a file and a symlink loop each say what is wrong, as the CLI does (the
    package used to say "no such folder" for all three; issue 19, item 5)."""
    missing = tmp_path / "nope"
    a_file = tmp_path / "config.json"
    a_file.write_text("{}")
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    for path, words in [(missing, ["model folder '%s' does not exist" % missing]),
                        (a_file, ["model folder '%s' is not a folder" % a_file]),
                        (loop, ["model folder '%s'" % loop, "symbolic links"])]:
        err = expect(nopad.FileError, IO, words, nopad.Encoder, path)
        assert "no such folder" not in str(err)
        cli = _cli_message(path)
        if cli is not None:
            assert str(err) == cli, (str(err), cli)


@pytest.mark.parametrize("config, cls, status, word", [
    ('{"model_type": "bert", ', nopad.FormatError, FORMAT, "not valid JSON"),
    ("[1, 2, 3]", nopad.FormatError, FORMAT, "JSON object"),
    ({"hidden_size": 48}, nopad.FormatError, FORMAT, "model_type"),
    ({"model_type": "t5"}, nopad.UnsupportedError, UNSUP, "t5"),
    ({"model_type": "gpt2"}, nopad.FormatError, FORMAT, "vocab_size"),
    ({"model_type": "bert", "vocab_size": 10}, nopad.FormatError, FORMAT, "hidden_size"),
    (bert_a_config(hidden_size="wide"), nopad.FormatError, FORMAT, "hidden_size"),
    (bert_a_config(num_attention_heads=5), nopad.FormatError, FORMAT, "divisible"),
    (bert_a_config(hidden_act="mish"), nopad.UnsupportedError, UNSUP, "mish"),
    (bert_a_config(num_hidden_layers=-2), nopad.FormatError, FORMAT, "num_hidden_layers"),
    (bert_a_config(num_hidden_layers=3), nopad.FormatError, FORMAT, "is missing"),
    (bert_a_config(intermediate_size=99), nopad.FormatError, FORMAT, "has shape"),
    (bert_a_config(vocab_size=1000), nopad.FormatError, FORMAT, "word_embeddings"),
])
def test_bad_config(tmp_path, config, cls, status, word):
    expect(cls, status, [word], nopad.Encoder, copy_model(tmp_path, config=config))


def test_truncated_weights(tmp_path):
    d = copy_model(tmp_path)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:len(data) // 2])
    expect(nopad.FormatError, FORMAT, ["model.safetensors"], nopad.Encoder, d)


def test_unsupported_device_and_dtype():
    expect(nopad.UnsupportedError, UNSUP, ["F16"], nopad.Encoder, MODELS / "bert_a",
           dtype="fp16")
    expect(nopad.UnsupportedError, UNSUP, ["BF16"], nopad.Encoder, MODELS / "bert_a",
           dtype="bf16")
    expect(nopad.InvalidArgumentError, INVAL, ["tpu"], nopad.Encoder, MODELS / "bert_a",
           device="tpu")
    expect(nopad.InvalidArgumentError, INVAL, ["fp8"], nopad.Encoder, MODELS / "bert_a",
           dtype="fp8")
    with pytest.raises(TypeError):
        nopad.Encoder(MODELS / "bert_a", threads="4")
    expect(nopad.InvalidArgumentError, INVAL, ["max_batch_tokens"], nopad.Encoder,
           MODELS / "bert_a", max_batch_tokens=-1)


def test_cuda_in_a_cpu_build():
    if "no CUDA" not in _cuda_message():
        pytest.skip("this library has a CUDA backend")
    expect(nopad.UnsupportedError, UNSUP, ["cuda", "no CUDA backend"], nopad.Encoder,
           MODELS / "bert_a", device="cuda", dtype="fp16")


def _cuda_message():
    try:
        nopad.Encoder(MODELS / "bert_a", device="cuda", dtype="fp16").close()
    except nopad.NopadError as e:
        return str(e)
    return ""


def test_bad_tokenizer_files(tmp_path):
    expect(nopad.FileError, IO, [], nopad.Tokenizer, tmp_path / "nope")
    d = copy_model(tmp_path)  # no tokenizer.json, no vocab.txt
    expect(nopad.FileError, IO, ["vocab.txt"], nopad.Tokenizer, d)
    (d / "tokenizer.json").write_text('{"model": {"type": "WordPiece", ')
    expect(nopad.FormatError, FORMAT, ["tokenizer.json"], nopad.Tokenizer, d)
    expect(nopad.FormatError, FORMAT, ["tokenizer.json"], nopad.Encoder, d)
    (d / "tokenizer.json").write_text('{"model": {"type": "WordLevel", "vocab": {"a": 0}, '
                                      '"unk_token": "a"}}')
    expect(nopad.NopadError, UNSUP, ["WordLevel"], nopad.Tokenizer, d)


# ---- encoding ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bert():
    with nopad.Encoder(MODELS / "bert_a") as enc:
        yield enc


@pytest.fixture(scope="module")
def st():
    with nopad.Encoder(MODELS / "st_mean_norm") as enc:  # has a tokenizer; max_seq_length 20
        yield enc


IDS = np.arange(1, 6, dtype=np.int32)
CU = np.array([0, 3, 5], dtype=np.int32)


def test_bad_ids(bert):
    V = bert.info.vocab_size
    bad = IDS.copy()
    bad[4] = V
    expect(nopad.InvalidArgumentError, INVAL, ["outside the vocabulary", str(V)], bert.forward,
           bad, CU)
    bad[4] = -1
    expect(nopad.InvalidArgumentError, INVAL, ["-1", "vocabulary"], bert.forward, bad, CU)
    expect(nopad.InvalidArgumentError, INVAL, ["int32"], bert.forward,
           np.array([1, 2**40], np.int64), [0, 2])
    expect(nopad.InvalidArgumentError, INVAL, ["integers"], bert.forward, IDS.astype(float), CU)
    expect(nopad.InvalidArgumentError, INVAL, ["1-D"], bert.forward, IDS.reshape(1, 5), CU)
    types = np.array([0, 0, 0, 0, bert.info.type_vocab_size], np.int32)
    expect(nopad.InvalidArgumentError, INVAL, ["token type"], bert.forward, IDS, CU, types)
    expect(nopad.InvalidArgumentError, INVAL, ["token_type_ids has 2"], bert.forward, IDS, CU,
           [0, 0])
    bert.forward(IDS, CU)  # still usable


def test_bad_cu_seqlens(bert):
    expect(nopad.InvalidArgumentError, INVAL, ["sequence 1"], bert.forward, IDS[:3],
           [0, 3, 3])
    expect(nopad.InvalidArgumentError, INVAL, ["cu_seqlens[0]"], bert.forward, IDS[:4],
           [1, 3, 4])
    expect(nopad.InvalidArgumentError, INVAL, ["cu_seqlens[-1] is 4", "5 tokens"],
           bert.forward, IDS, [0, 2, 4])
    expect(nopad.InvalidArgumentError, INVAL, ["cu_seqlens[-1] is 9"], bert.forward, IDS,
           [0, 9, 5][:2])
    expect(nopad.InvalidArgumentError, INVAL, ["decreases"], bert.forward, IDS, [0, 4, 2, 5])


def test_empty_batches(bert, st):
    expect(nopad.InvalidArgumentError, INVAL, ["empty batch"], bert.forward, [], [0])
    expect(nopad.InvalidArgumentError, INVAL, ["empty batch"], bert.forward, [], [])
    expect(nopad.InvalidArgumentError, INVAL, ["empty batch"], st.encode, [])
    expect(nopad.InvalidArgumentError, INVAL, ["empty batch"], bert.forward_padded,
           np.zeros((0, 4), np.int32))


def test_too_long(bert, st):
    n = bert.info.max_seq_length + 1
    ids = np.ones(n, np.int32)
    expect(nopad.TooLongError, TOO_LONG, ["at most %d" % (n - 1)], bert.forward, ids, [0, n])
    long_text = " ".join(["them"] * 40)
    err = expect(nopad.TooLongError, TOO_LONG, ["sentence 1", "42 tokens",
                                                "maximum sequence length 20", "truncate=True"],
                 st.encode, ["them", long_text])
    assert isinstance(err, ValueError)
    assert st.encode(["them", long_text], truncate=True).shape == (2, 48)
    tok = st.tokenizer
    expect(nopad.TooLongError, TOO_LONG, ["42 tokens", "max_length 10"], tok.encode, long_text,
           max_length=10)
    assert len(tok.encode(long_text, truncate=True, max_length=10)) == 10
    expect(nopad.InvalidArgumentError, INVAL, ["max_length"], tok.encode, "x", truncate=True)
    expect(nopad.InvalidArgumentError, INVAL, ["special tokens"], tok.encode, "x",
           truncate=True, max_length=1)


def test_invalid_utf8(st):
    bad = b"caf\xc3"  # a truncated sequence
    expect(nopad.InvalidArgumentError, INVAL, ["UTF-8", "byte offset 3"], st.tokenizer.encode,
           bad)
    expect(nopad.InvalidArgumentError, INVAL, ["sentence 1", "UTF-8"], st.encode, [b"ok", bad])
    expect(nopad.InvalidArgumentError, INVAL, ["text 0", "UTF-8"], st.tokenizer.encode_batch,
           [b"\xff"])
    expect(nopad.InvalidArgumentError, INVAL, ["UTF-8"], st.tokenizer.encode, "\ud800")
    with pytest.raises(TypeError):
        st.encode([1, 2])
    with pytest.raises(TypeError):
        st.tokenizer.encode_batch("not a list")


def test_bad_options(bert, st):
    expect(nopad.InvalidArgumentError, INVAL, ["average"], bert.forward, IDS, CU,
           pooling="average")
    expect(nopad.InvalidArgumentError, INVAL, ["normalize"], bert.forward, IDS, CU,
           pooling="none", normalize=True)
    expect(nopad.InvalidArgumentError, INVAL, ["normalize"], st.encode, ["a"], pooling="none",
           normalize=True)
    expect(nopad.InvalidArgumentError, INVAL, ["batch_tokens"], st.encode, ["a"],
           batch_tokens=0)
    expect(nopad.InvalidArgumentError, INVAL, ["out", "(5, 48)"], bert.forward, IDS, CU,
           out=np.zeros((5, 47), np.float32))
    expect(nopad.InvalidArgumentError, INVAL, ["out"], bert.forward, IDS, CU,
           out=np.zeros((5, 48), np.float64))
    expect(nopad.FileError, IO, ["no tokenizer"], bert.encode, ["hello"])
    expect(nopad.InvalidArgumentError, INVAL, ["right padding"], bert.forward_padded,
           np.ones((2, 3), np.int32), attention_mask=[[1, 1, 1], [0, 1, 1]])
    expect(nopad.InvalidArgumentError, INVAL, ["lengths[1]"], bert.forward_padded,
           np.ones((2, 3), np.int32), lengths=[3, 0])


def test_max_batch_tokens():
    with nopad.Encoder(MODELS / "bert_a", max_batch_tokens=4) as enc:
        expect(nopad.InvalidArgumentError, INVAL, ["max_batch_tokens"], enc.forward, IDS, CU)
        enc.forward(IDS[:4], [0, 2, 4])


def test_closed_objects(tmp_path):
    enc = nopad.Encoder(MODELS / "st_max")
    tok = enc.tokenizer
    enc.close()
    enc.close()  # twice is fine
    assert enc.closed and tok.closed
    expect(nopad.InvalidArgumentError, INVAL, ["closed"], enc.forward, IDS, CU)
    expect(nopad.InvalidArgumentError, INVAL, ["closed"], enc.encode, ["a"])
    expect(nopad.InvalidArgumentError, INVAL, ["closed"], tok.encode, "a")
    t = nopad.Tokenizer(MODELS / "st_max")
    with t:
        assert t.encode("them")
    expect(nopad.InvalidArgumentError, INVAL, ["closed"], t.encode, "a")


def test_cuda_tensors_need_a_cuda_encoder(bert):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    expect(nopad.InvalidArgumentError, INVAL, ["device='cuda'"], bert.forward,
           torch.from_numpy(IDS).cuda(), torch.from_numpy(CU).cuda())
