"""Bad token ids and texts are refused, never converted (issue 38, items 7.10 and 7.7).

Every place that takes token ids (prompts as id lists, stop_ids, decode's ids, a DecodeStream's
id, Encoder.forward's input_ids) refuses floats (never truncated), bools, negative values and
values outside the vocabulary or int32 with InvalidArgumentError naming the argument and the
position. Prompts and stop strings refuse a NUL character: the engine reads them as C strings,
which a NUL would silently cut (texts to tokenize keep it: they go with their length); so does a
path. String lists refuse what is not a string with a TypeError naming the entry."""
import numpy as np
import pytest

import nopad
from conftest import MODELS

# what each id list holds wrong, and the words its error must have (the position and the value)
BAD_IDS = [
    ([1.7, 2.2], ["position 0", "1.7", "float"]),          # truncated to [1, 2] before
    ([True, False], ["position 0", "True", "bool"]),       # taken as [1, 0] before
    ([3, True], ["position 1", "True", "bool"]),           # np.asarray gives int64 [3, 1]
    ([3, np.float32(4.0)], ["position 1", "4.0", "float"]),
    ([5, -1], ["position 1", "id -1", "outside the vocabulary"]),
    ([2**32 + 30], ["position 0", str(2**32 + 30), "outside the vocabulary"]),  # wrapped to 30
    ([2**70], ["position 0", str(2**70), "outside the vocabulary"]),
]


def _refused(words, fn, *args, **kwargs):
    with pytest.raises(nopad.InvalidArgumentError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert info.value.status == nopad.Status.INVALID_ARGUMENT
    for w in words:
        assert w in msg, (w, msg)
    return msg


@pytest.fixture(scope="module")
def gen():
    with nopad.Generator(MODELS / "llama_gqa") as g:
        yield g


@pytest.fixture(scope="module")
def eng(gen):
    with nopad.Engine(gen, kv_cache_tokens=1024, max_step_tokens=128) as e:
        yield e


@pytest.fixture(scope="module")
def tok():
    with nopad.Tokenizer(MODELS / "st_max") as t:
        yield t


@pytest.mark.parametrize("ids, words", BAD_IDS)
def test_engine_refuses_bad_prompt_ids(eng, ids, words):
    _refused(["prompt"] + words, eng.submit, ids, max_tokens=2)


@pytest.mark.parametrize("ids, words", BAD_IDS)
def test_engine_refuses_bad_stop_ids(eng, ids, words):
    _refused(["stop_ids"] + words, eng.submit, [1, 2, 3], max_tokens=2, stop_ids=ids)


def test_engine_refuses_stop_ids_the_server_refuses(eng, gen):
    V = gen.info.vocab_size
    _refused(["stop_ids", "id -1"], eng.submit, [1, 2], max_tokens=2, stop_ids=[-1])
    _refused(["stop_ids", "id %d at position 1" % V], eng.submit, [1, 2], max_tokens=2,
             stop_ids=[0, V])
    _refused(["stop_ids", "float"], eng.submit, [1, 2], max_tokens=2,
             stop_ids=np.array([3.0, 4.0]))
    _refused(["stop_ids", "int"], eng.submit, [1, 2], max_tokens=2, stop_ids=7)
    # good ones still run, from a list or an array
    r = eng.submit([1, 2, 3], max_tokens=3, ignore_eos=True, stop_ids=np.array([V - 1]))
    r.result()
    assert r.finish_reason in ("length", "stop")


def test_engine_refuses_bad_stop_strings(eng):
    with pytest.raises(TypeError, match=r"stop\[1\].*NoneType"):
        eng.submit([1, 2, 3], max_tokens=2, stop=["a", None])  # AttributeError before
    with pytest.raises(TypeError, match="stop"):
        eng.submit([1, 2, 3], max_tokens=2, stop=5)
    _refused(["stop[0]", "NUL"], eng.submit, [1, 2, 3], max_tokens=2, stop=["Par\u0000xyz"])
    _refused(["stop", "NUL"], eng.submit, [1, 2, 3], max_tokens=2, stop="\u0000")


def test_engine_refuses_nul_in_a_text_prompt(eng):
    # refused before the tokenizer is looked for: this model has none
    _refused(["prompt", "NUL", "byte 3"], eng.submit, "Par\u0000xyz", max_tokens=2)
    _refused(["prompt", "NUL"], eng.submit, b"Par\x00xyz", max_tokens=2)


@pytest.mark.parametrize("ids, words", BAD_IDS)
def test_generator_refuses_bad_ids(gen, ids, words):
    _refused(["prompt"] + words, gen.generate_ids, ids, max_tokens=1)
    _refused(["prompts[1]"] + words, gen.generate_ids, [[1, 2], ids], max_tokens=1)
    _refused(["prompt"] + words, gen.stream, ids, max_tokens=1)
    with gen.sequence() as seq:
        _refused(["tokens_per_seq[0]"] + words, gen.decode, [seq], [ids])
        assert len(seq) == 0  # nothing ran


def test_generator_refuses_bool_and_float_arrays(gen):
    _refused(["prompt", "float"], gen.generate_ids, np.array([1.0, 2.0]), max_tokens=1)
    _refused(["prompt", "bool"], gen.generate_ids, np.array([True, False]), max_tokens=1)


def test_generator_refuses_nul_in_a_text_prompt(gen):
    # refused before the tokenizer is looked for: this model has none
    _refused(["prompt", "NUL"], gen.generate, "Par\u0000xyz", max_tokens=1)
    _refused(["prompts[1]", "NUL"], gen.generate, [[1, 2], "b\u0000"], max_tokens=1)


@pytest.mark.parametrize("ids, words", BAD_IDS)
def test_tokenizer_refuses_bad_ids(tok, ids, words):
    _refused(["ids"] + words, tok.decode, ids)
    with tok.decode_stream() as stream:
        for i in ids:
            if not isinstance(i, (int, np.integer)) or isinstance(i, bool) \
                    or not 0 <= i < tok.vocab_size:
                _refused(["id"], stream.step, i)
    assert tok.decode([]) == ""


def test_tokenizer_takes_nul_whole_and_refuses_it_in_a_path(tok):
    # texts go to the tokenizer with their length: a NUL is a character as in HF tokenizers
    # (tests/data/tokenizers' HF ids include such texts), never the end of the text
    assert tok.encode("them\u0000 and us") == tok.encode("them and us")  # BERT drops it
    assert tok.encode("them\u0000 and us") != tok.encode("them")
    # a path is a C string: "folder\0junk" would load "folder"
    _refused(["NUL"], nopad.Tokenizer, str(MODELS / "st_max") + "\u0000junk")


def test_encoder_refuses_bool_ids():
    with nopad.Encoder(MODELS / "st_max") as enc:
        _refused(["input_ids[1]", "bool"], enc.forward, [101, True, 102], [0, 3])
        _refused(["cu_seqlens[1]", "bool"], enc.forward, [101, 102], [0, True, 2])
        _refused(["input_ids", "float"], enc.forward, [101.0, 102.0], [0, 2])
        _refused(["input_ids[0]", "bool"], enc.forward_padded, [[True, 101]])
        _refused(["token_type_ids[1]", "bool"], enc.forward_padded, [[101, 102]],
                 token_type_ids=[[0, True]])


@pytest.mark.parametrize("kw", [dict(epochs=2.5), dict(epochs=True), dict(num_labels=2.0),
                                dict(batch_tokens=4096.0), dict(batch_seqs=False),
                                dict(seed=True), dict(save_every=1.5), dict(threads=2.0),
                                dict(eval_every=1.0), dict(early_stop=True),
                                dict(stream_buffer=65536.0), dict(lr=True), dict(warmup=True)])
def test_trainer_refuses_floats_and_bools_for_its_numbers(tmp_path, kw):
    # int(2.5) was 2, int(True) 1: the run went on with a number nobody gave
    name = next(iter(kw))
    with pytest.raises(TypeError, match=name):
        nopad.Trainer(MODELS / "bert_cls", tmp_path / "d.jsonl", tmp_path / "o", task="classify",
                      **kw)


@pytest.mark.parametrize("name", ["epochs", "batch_tokens", "batch_seqs", "num_labels"])
def test_trainer_refuses_numbers_its_fields_cannot_hold(tmp_path, name):
    # a C int32 field took 2^32 + 3 as 3
    words = "%s %d: outside the int32" % (name, 2**32 + 3)
    with pytest.raises(nopad.InvalidArgumentError, match=words):
        nopad.Trainer(MODELS / "bert_cls", tmp_path / "d.jsonl", tmp_path / "o", task="classify",
                      **{name: 2**32 + 3})
