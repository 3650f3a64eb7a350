"""nopad.Generator: the tiny decoders of tests/data/models against Hugging Face (logits and
greedy ids), then the real default decoder, SmolLM2-135M-Instruct Q4_1 (a GGUF file from
scripts/fetch_default_decoder.sh; NOPAD_SMOLLM2_GGUF, else the cached file; the tests that need
it are skipped without it): greedy answers, streaming, batching, seeded sampling, the low-level
Sequence / decode, and the errors."""
import math
import os
from pathlib import Path

import numpy as np
import pytest

import nopad
from conftest import DECODER_MODELS, MODELS, load_safetensors, row_rel_err

CHAT = "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n"
FRANCE = CHAT % "What is the capital of France?"
STORY = "Once upon a time"


# ---- the tiny decoders (HF folders, ids only) --------------------------------------------------

@pytest.mark.parametrize("name", DECODER_MODELS)
def test_tiny_decoder_against_hf(name):
    g = load_safetensors(MODELS / name / "golden.safetensors")
    ids, cu = g["input_ids"], g["cu_seqlens"]
    prompts = [ids[cu[i]:cu[i + 1]].tolist() for i in range(len(cu) - 1)]
    with nopad.Generator(MODELS / name) as gen:
        assert gen.info.is_decoder and gen.info.vocab_size == g["logits"].shape[1]
        assert gen.tokenizer is None
        # every position of each prompt, one step per prompt, all sequences in one call
        seqs = [gen.sequence() for _ in prompts]
        logits = gen.decode(seqs, prompts, all_logits=True)
        assert row_rel_err(logits, g["logits"]) < 1e-4
        assert [len(s) for s in seqs] == [len(p) for p in prompts]
        # greedy, all prompts together, EOS off as HF's goldens were made
        out = gen.generate_ids(prompts, max_tokens=32, ignore_eos=True)
        assert out == g["greedy"].tolist()
        with pytest.raises(nopad.InvalidArgumentError, match="tokenizer"):
            gen.generate("some text")
    with pytest.raises(nopad.InvalidArgumentError, match="nopad.Generator"):
        nopad.Encoder(MODELS / name)


# ---- SmolLM2-135M-Instruct --------------------------------------------------------------------

@pytest.fixture(scope="module")
def gguf():
    path = os.environ.get("NOPAD_SMOLLM2_GGUF") or os.path.expanduser(
        "~/.cache/nopad/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not Path(path).is_file():
        pytest.skip("SmolLM2-135M-Instruct GGUF not found (set NOPAD_SMOLLM2_GGUF; "
                    "scripts/fetch_default_decoder.sh fetches it)")
    return path


@pytest.fixture(scope="module")
def gen(gguf):
    with nopad.Generator(gguf) as g:
        yield g


def test_info_and_tokenizer(gen):
    i = gen.info
    assert i.is_decoder and i.family == "LLaMA" and i.model_type == "llama"
    assert (i.num_layers, i.num_heads, i.num_kv_heads, i.head_size) == (30, 9, 3, 64)
    assert i.vocab_size == 49152 and i.weights_dtype == "Q4_1" and i.compute_dtype == "F32"
    assert i.eos_token_id == gen.tokenizer.token_to_id("<|im_end|>")
    assert gen.tokenizer.kind == "bpe-byte-level"
    assert "Generator" in repr(gen) and "LLaMA" in repr(gen)


def test_greedy_answer(gen):
    assert gen.generate(FRANCE, max_tokens=16) == ["The capital of France is Paris."]
    ids = gen.generate_ids(FRANCE, max_tokens=16)[0]
    assert ids[-1] == gen.info.eos_token_id  # stopped at <|im_end|>, kept as HF keeps it
    assert gen.tokenizer.decode(ids, skip_special_tokens=True) == "The capital of France is Paris."
    # the same prompt given as ids
    assert gen.generate_ids(gen.tokenizer.encode(FRANCE), max_tokens=16) == [ids]
    assert gen.generate(FRANCE, max_tokens=0) == [""]
    assert gen.generate([]) == []


def test_stream_equals_generate(gen):
    text = gen.generate(FRANCE, max_tokens=16)[0]
    stream = gen.stream(FRANCE, max_tokens=16)
    pieces = list(stream)
    assert len(pieces) > 3 and all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == text
    assert stream.token_ids == gen.generate_ids(FRANCE, max_tokens=16)[0]
    # sampled, without stopping at the end of sequence: still the same text
    kw = dict(max_tokens=24, temperature=1.2, seed=5, ignore_eos=True)
    assert "".join(gen.stream(STORY, **kw)) == gen.generate(STORY, **kw)[0]


def test_stream_stops_early(gen):
    with gen.stream(STORY, max_tokens=64, ignore_eos=True) as stream:
        first = next(stream)
        assert first
    assert len(stream.token_ids) < 64
    assert list(stream) == []


def test_batched_equals_alone(gguf):
    # dequantised: with the weights kept quantized each row's activations are rounded to int8,
    # and a float difference of 1e-7 between batchings can round a value the other way
    # (tests/test_quant_decoder.c); float weights change only by float rounding
    with nopad.Generator(gguf, weights="f32") as gen:
        prompts = [FRANCE, STORY, CHAT % "Name three colours."]
        together = gen.generate_ids(prompts, max_tokens=12)
        alone = [gen.generate_ids(p, max_tokens=12)[0] for p in prompts]
        assert together == alone
        assert gen.generate(prompts, max_tokens=12) == [gen.tokenizer.decode(
            ids, skip_special_tokens=True) for ids in alone]


def test_seeded_sampling(gen):
    kw = dict(max_tokens=16, temperature=0.9, top_p=0.95, top_k=50, ignore_eos=True)
    a = gen.generate_ids(STORY, seed=7, **kw)
    assert gen.generate_ids(STORY, seed=7, **kw) == a
    # a prompt's draws depend on its seed only, not on what runs beside it
    assert gen.generate_ids([FRANCE, STORY], seed=7, **kw)[1] == a[0]
    others = [gen.generate_ids(STORY, seed=s, **kw)[0] for s in (8, 9, 2**64 - 1)]
    assert any(o != a[0] for o in others)
    assert all(len(o) == 16 for o in others)
    # top_k=1 is greedy
    greedy = gen.generate_ids(FRANCE, max_tokens=10)
    assert gen.generate_ids(FRANCE, max_tokens=10, temperature=0.7, top_k=1, seed=3) == greedy


@pytest.mark.parametrize("kw, word", [
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=math.nan), "temperature"),
    (dict(temperature=math.inf), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(min_p=1.0), "min_p"),
    (dict(min_p=-0.1), "min_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-2.01), "frequency_penalty"),
    (dict(logit_bias={0: 100.5}), "logit_bias"),
    (dict(logit_bias={10**7: 1.0}), "logit_bias"),
    (dict(max_tokens=-1), "max_tokens"),
    (dict(seed=-1), "seed"),
])
def test_bad_sampling_params(gen, kw, word):
    for call in (gen.generate, gen.generate_ids, gen.stream):
        with pytest.raises(nopad.InvalidArgumentError, match=word) as e:
            call(FRANCE, **kw)
        assert e.value.status == nopad.Status.INVALID_ARGUMENT


def test_bad_prompts(gen):
    with pytest.raises(TypeError, match="temperature"):
        gen.generate(FRANCE, temperature="hot")
    with pytest.raises(TypeError, match="max_tokens"):
        gen.generate(FRANCE, max_tokens=2.5)
    with pytest.raises(nopad.InvalidArgumentError, match="outside the vocabulary"):
        gen.generate([[1, 2, 49152]])
    with pytest.raises(nopad.InvalidArgumentError, match="prompt 1 is empty"):
        gen.generate([FRANCE, ""])
    with pytest.raises(nopad.InvalidArgumentError, match="invalid UTF-8|UTF-8"):
        gen.generate(b"\xff\xfe")
    with pytest.raises(nopad.TooLongError, match="context"):
        gen.generate(FRANCE, max_tokens=9000)
    with pytest.raises(TypeError, match="one prompt"):
        gen.stream([FRANCE, STORY])
    # the generator still works after refused calls
    assert gen.generate(FRANCE, max_tokens=16) == ["The capital of France is Paris."]


def test_decode_and_sequences(gen):
    ids = gen.tokenizer.encode(FRANCE)
    first = gen.generate_ids(FRANCE, max_tokens=1)[0][0]
    with nopad.Sequence(gen) as seq:
        assert len(seq) == 0
        logits = gen.decode([seq], [ids], all_logits=True)
        assert logits.shape == (len(ids), gen.info.vocab_size) and logits.dtype == np.float32
        assert len(seq) == len(ids)
        assert int(logits[-1].argmax()) == first
        nxt = gen.decode(seq, [first])  # one sequence, one token
        assert nxt.shape == (1, gen.info.vocab_size) and len(seq) == len(ids) + 1
    # the prompt in two chunks, beside another sequence: the same last logits
    a, b = gen.sequence(), gen.sequence()
    gen.decode([a], [ids[:5]])
    out = gen.decode([a, b], [ids[5:], gen.tokenizer.encode(STORY)])
    assert out.shape == (2, gen.info.vocab_size)
    np.testing.assert_allclose(out[0], logits[-1], rtol=1e-4, atol=1e-3)
    # refused steps change nothing
    with pytest.raises(nopad.InvalidArgumentError, match="twice"):
        gen.decode([a, a], [[1], [2]])
    with pytest.raises(nopad.InvalidArgumentError, match="outside the vocabulary"):
        gen.decode([a], [[10**6]])
    assert len(a) == len(ids)
    a.close()
    with pytest.raises(nopad.InvalidArgumentError, match="closed"):
        gen.decode([a], [[1]])
    b.close()


def test_closed_generator(gguf):
    g = nopad.Generator(gguf, kv_cache_tokens=256, max_batch_tokens=64)
    seq = g.sequence()
    g.decode([seq], [[1, 2, 3]])
    # a prompt longer than max_batch_tokens goes in chunks
    long_prompt = CHAT % ("Tell me about Paris. " * 20)
    assert len(g.tokenizer.encode(long_prompt)) > 64
    assert len(g.generate_ids(long_prompt, max_tokens=4)[0]) == 4
    g.close()
    assert g.closed and seq.closed
    with pytest.raises(nopad.InvalidArgumentError, match="closed"):
        g.generate(FRANCE, max_tokens=4)
    with pytest.raises(nopad.InvalidArgumentError, match="closed"):
        nopad.Sequence(g)
    g.close()


def test_kv_pool_exhausted(gguf):
    with nopad.Generator(gguf, kv_cache_tokens=32) as g:
        with pytest.raises(nopad.OutOfMemoryError, match="KV pool"):
            g.generate(CHAT % ("Tell me about Paris. " * 10), max_tokens=4)


def test_blocks_come_back(gguf):
    """Abandoned streams stop and dropped sequences give their KV blocks back: a pool of 4 blocks
    of 16 tokens still runs a prompt that needs all of them afterwards."""
    import gc
    import threading
    with nopad.Generator(gguf, kv_cache_tokens=64) as g:
        prompt = g.tokenizer.encode(FRANCE)  # 16 tokens: 1 block, a second once generating
        for _ in range(10):
            stream = g.stream(prompt, max_tokens=40, ignore_eos=True)
            next(stream)
            del stream  # abandoned: the worker stops at its next token
            seq = g.sequence()
            g.decode([seq], [prompt])
            del seq
        gc.collect()
        for t in threading.enumerate():
            if t.name == "nopad-stream":
                t.join(timeout=30)
        assert not any(t.name.startswith("nopad-") for t in threading.enumerate())
        out = g.generate_ids(prompt, max_tokens=64 - len(prompt), ignore_eos=True)
        assert len(out[0]) == 64 - len(prompt)


def test_encoder_refused(tmp_path, gguf):
    with pytest.raises(nopad.InvalidArgumentError, match="nopad.Generator") as e:
        nopad.Encoder(gguf)
    assert "GGUF" in str(e.value)


def test_encoder_folder_refused():
    with pytest.raises(nopad.InvalidArgumentError) as e:
        nopad.Generator(MODELS / "bert_a")
    msg = str(e.value)
    assert "encoder" in msg and "nopad.Encoder" in msg and "bert_a" in msg


def test_missing_model(tmp_path):
    with pytest.raises(nopad.FileError, match="does not exist"):
        nopad.Generator(tmp_path / "nope.gguf")
    with pytest.raises(nopad.InvalidArgumentError, match="kv_cache_tokens"):
        nopad.Generator(MODELS / "bert_a", kv_cache_tokens=0)
    with pytest.raises(nopad.InvalidArgumentError, match="device"):
        nopad.Generator(MODELS / "bert_a", device="tpu")
