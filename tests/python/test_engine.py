"""nopad.Engine: requests from several Python threads through the library's engine give what
nopad.Generator gives for each prompt alone (greedy; sampled with a seed), stream their text,
cancel, report stats and refuse bad input. The tiny llama_gqa fixture (ids) always; SmolLM2 (text,
stop strings) when its GGUF is there."""
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import nopad
from conftest import MODELS


def _prompts(n, vocab, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(1, 60))).tolist() for _ in range(n)]


@pytest.mark.parametrize("overlap", [None, True])
def test_engine_threads_equal_generator(overlap):
    # overlap_steps=True: the CUDA default (step n+1 queued before step n's ids are back), on the CPU
    with nopad.Generator(MODELS / "llama_gqa") as gen, \
            nopad.Engine(gen, kv_cache_tokens=4096, max_running=8, max_step_tokens=256,
                         overlap_steps=overlap) as eng:
        prompts = _prompts(24, gen.info.vocab_size)
        want = [gen.generate_ids([p], max_tokens=12, ignore_eos=True)[0] for p in prompts]
        got = [None] * len(prompts)

        def worker(k):
            for i in range(k, len(prompts), 4):
                r = eng.submit(prompts[i], max_tokens=12, ignore_eos=True)
                r.result()
                got[i] = r.ids
                assert r.finish_reason == "length"
                r.close()

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == want
        # the engine's counters settle once its thread has retired the last request
        for _ in range(200):
            st = eng.stats()
            if st["running"] == 0 and st["tokens_generated"] == 12 * len(prompts):
                break
            threading.Event().wait(0.01)
        assert st["tokens_generated"] == 12 * len(prompts) and st["running"] == 0
        assert st["kv_blocks_used"] == 0 and st["steps"] > 0


def test_engine_sampling_cancel_and_errors():
    with nopad.Generator(MODELS / "llama_gqa") as gen, \
            nopad.Engine(gen, max_queue=2, max_running=1) as eng:
        p = _prompts(1, gen.info.vocab_size, seed=3)[0]
        want = gen.generate_ids([p], max_tokens=10, temperature=0.8, top_p=0.9, seed=7,
                                ignore_eos=True)[0]
        r = eng.submit(p, max_tokens=10, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
        r.result()
        assert r.ids == want
        # one request runs at a time: the second waits behind the first's 110 steps and is
        # cancelled there (the context is 128)
        first = eng.submit(p[:8], max_tokens=110, ignore_eos=True)
        second = eng.submit(p[:8], max_tokens=110, ignore_eos=True)
        second.cancel()
        assert second.result() == "" and second.finish_reason == "cancelled" and second.ids == []
        first.result()
        assert first.finish_reason == "length" and len(first.ids) == 110
        with pytest.raises(nopad.InvalidArgumentError):
            eng.submit([], max_tokens=4)
        with pytest.raises(nopad.InvalidArgumentError):
            eng.submit(p, max_tokens=0)
        with pytest.raises(nopad.InvalidArgumentError, match="tokenizer"):
            eng.submit("text needs a tokenizer", max_tokens=4)
        with pytest.raises(nopad.TooLongError):
            eng.submit(p, max_tokens=10**6)
        # a reader sees the end before the engine's thread retires the request and counts its
        # blocks free (stats are a snapshot taken after each iteration): wait for that iteration
        deadline = time.monotonic() + 5.0
        while eng.stats()["kv_blocks_used"] != 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert eng.stats()["kv_blocks_used"] == 0
    with pytest.raises(nopad.InvalidArgumentError, match="closed"):
        eng.submit(p, max_tokens=4)


def test_generator_close_closes_its_running_engines():
    """Generator.close() while an Engine on it runs (issue 38, item 7.2): the engine is closed
    first (its thread joined, its requests ended and still readable), then the weights are
    freed. Before, close() returned at once and the engine's thread read the freed weights."""
    gen = nopad.Generator(MODELS / "llama_gqa")
    eng = nopad.Engine(gen, kv_cache_tokens=4096, max_running=8, max_step_tokens=256)
    prompts = _prompts(8, gen.info.vocab_size, seed=5)
    reqs = [eng.submit(p[:8], max_tokens=110, ignore_eos=True) for p in prompts]
    assert reqs[-1].read()  # the engine's thread is stepping
    gen.close()
    assert gen.closed and eng.closed
    for r in reqs:
        r.result(timeout=10)  # each ended: the engine's thread is gone
        assert r.finish_reason in ("cancelled", "length")
        assert len(r.ids) <= 110
    with pytest.raises(nopad.InvalidArgumentError, match="closed"):
        eng.submit(prompts[0], max_tokens=4)
    with pytest.raises(nopad.InvalidArgumentError, match="closed"):
        eng.stats()
    eng.close()  # closing it again is fine


def test_generator_close_while_threads_submit():
    """Generator.close() from one thread while others submit to their engines on it: close()
    returns with every engine closed (before, they went on stepping over freed weights), the
    submitting threads get the "closed" error, and a new engine on it is refused."""
    gen = nopad.Generator(MODELS / "llama_gqa")
    prompt = _prompts(1, gen.info.vocab_size, seed=9)[0][:8]
    engines = [nopad.Engine(gen, kv_cache_tokens=512, max_step_tokens=64) for _ in range(3)]
    started = threading.Barrier(len(engines) + 1)
    errors = [None] * len(engines)

    def work(k):
        first = True
        try:
            while True:
                engines[k].submit(prompt, max_tokens=40, ignore_eos=True)
                if first:
                    first = False
                    started.wait(10)
        except BaseException as e:  # noqa: BLE001 (checked below)
            errors[k] = e
            if first:
                started.abort()

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(3)]
    for t in threads:
        t.start()
    started.wait(10)
    gen.close()
    assert [e.closed for e in engines] == [True] * len(engines)
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    for e in errors:
        assert isinstance(e, nopad.InvalidArgumentError) and "closed" in str(e), repr(e)
    with pytest.raises(nopad.InvalidArgumentError, match="closed"):
        nopad.Engine(gen)
    for e in engines:
        e.close()


@pytest.fixture(scope="module")
def gguf():
    path = os.environ.get("NOPAD_SMOLLM2_GGUF") or os.path.expanduser(
        "~/.cache/nopad/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not Path(path).is_file():
        pytest.skip("SmolLM2 GGUF not found (scripts/fetch_default_decoder.sh)")
    return path


def test_engine_text_streams_and_stops(gguf):
    chat = "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n"
    prompts = [chat % q for q in ("What is the capital of France?", "Count from one to ten.",
                                  "Name a colour.")]
    # dequantised: with the weights kept quantized a row's int8-rounded activations depend on
    # what shares its step, and Generator.generate batches the three prompts differently
    with nopad.Generator(gguf, weights="f32") as gen, nopad.Engine(gen) as eng:
        want = gen.generate(prompts, max_tokens=24)
        reqs = [eng.submit(p, max_tokens=24) for p in prompts]
        pieces = ["".join(reqs[0])]  # streamed
        got = [pieces[0]] + [r.result() for r in reqs[1:]]
        assert got == want
        assert "Paris" in got[0]
        r = eng.submit(prompts[1], max_tokens=40, stop=[" five", " 5"])
        text = r.result()
        assert r.finish_reason == "stop" and " five" not in text and " 5" not in text
        s = r.stats()
        assert s["finish"] == "stop" and s["generated_tokens"] >= 1


def _log_softmax(rows):
    m = rows.max(axis=1, keepdims=True)
    return rows - (np.log(np.exp(rows - m).sum(axis=1, keepdims=True)) + m)


def test_engine_top_logprobs():
    """top_logprobs=5 on a greedy request: each step's 5 most likely ids (ties: the lower id) and
    their log-probabilities equal a softmax in double of the model's logits (Generator.decode of
    the whole sequence) within 1e-4, the issue's bound (both sides CPU fp32; the batch shapes
    differ by 1e-6 relative); the chosen id is the first, with logprobs()'s value. Sampled with
    top_k=3: the two ids past the kept ones are -inf. Refusals: 21, and reading without asking."""
    with nopad.Generator(MODELS / "llama_gqa") as gen, \
            nopad.Engine(gen, kv_cache_tokens=4096, max_running=4, max_step_tokens=256) as eng:
        prompt = _prompts(1, gen.info.vocab_size, seed=11)[0]
        r = eng.submit(prompt, max_tokens=8, ignore_eos=True, logprobs=True, top_logprobs=5)
        r.result()
        top = r.top_logprobs()
        assert len(top) == 8 and all(len(t) == 5 for t in top)
        with gen.sequence() as seq:
            logits = gen.decode(seq, prompt + r.ids[:-1], all_logits=True).astype(np.float64)
        lsm = _log_softmax(logits[len(prompt) - 1:])
        for i, step in enumerate(top):
            want_ids = np.argsort(-lsm[i], kind="stable")[:5]  # stable: equal values by the lower id
            assert [t for t, _ in step] == want_ids.tolist()
            np.testing.assert_allclose([lp for _, lp in step], lsm[i][want_ids], rtol=0, atol=1e-4)
            assert step[0][0] == r.ids[i] and step[0][1] == r.logprobs()[i]
        r.close()
        s = eng.submit(prompt, max_tokens=4, ignore_eos=True, logprobs=True, top_logprobs=5, temperature=0.7,
                       top_k=3, seed=5)
        s.result()
        for i, step in enumerate(s.top_logprobs()):
            lps = [lp for _, lp in step]
            assert all(np.isfinite(lps[:3])) and lps[3:] == [-np.inf, -np.inf]
            assert s.ids[i] in [t for t, _ in step[:3]]
            assert abs(np.logaddexp.reduce(lps[:3])) < 1e-5  # the kept ids hold the whole mass
        s.close()
        with pytest.raises(nopad.InvalidArgumentError, match="top_logprobs is 21"):
            eng.submit(prompt, max_tokens=2, top_logprobs=21)
        plain = eng.submit(prompt, max_tokens=2, ignore_eos=True)
        plain.result()
        with pytest.raises(nopad.InvalidArgumentError, match="top_logprobs 0"):
            plain.top_logprobs()
        plain.close()


def test_engine_openai_penalties_and_logit_bias():
    """presence/frequency penalties and logit_bias through the engine give what the generator
    gives (one sampler, two paths), change the output, and are refused out of range."""
    with nopad.Generator(MODELS / "llama_gqa") as gen, \
            nopad.Engine(gen, kv_cache_tokens=4096, max_running=4, max_step_tokens=256) as eng:
        vocab = gen.info.vocab_size
        prompts = _prompts(3, vocab, seed=21)
        plain = [gen.generate_ids([p], max_tokens=16, ignore_eos=True)[0] for p in prompts]
        first = plain[0][0]
        cases = [dict(frequency_penalty=1.5, presence_penalty=0.5),
                 dict(frequency_penalty=-2.0, temperature=0.9, seed=4),
                 dict(logit_bias={first: -100.0, 7: 3.5}),
                 dict(logit_bias={5: 100.0})]
        for kw in cases:
            for p, base in zip(prompts, plain):
                want = gen.generate_ids([p], max_tokens=16, ignore_eos=True, **kw)[0]
                r = eng.submit(p, max_tokens=16, ignore_eos=True, **kw)
                r.result()
                assert r.ids == want, kw
                r.close()
            if "logit_bias" in kw and 5 in kw["logit_bias"]:
                assert want == [5] * 16  # +100 outweighs any logit of the tiny model
        # a -100 bias on the first greedy id moves the first choice; penalties change the text
        assert gen.generate_ids([prompts[0]], max_tokens=1, logit_bias={first: -100.0})[0][0] != first
        assert any(gen.generate_ids([p], max_tokens=16, ignore_eos=True, frequency_penalty=2.0)[0] != b
                   for p, b in zip(prompts, plain))
        for kw, word in [(dict(presence_penalty=2.5), "presence_penalty"),
                         (dict(frequency_penalty=-3.0), "frequency_penalty"),
                         (dict(logit_bias={0: 101.0}), "logit_bias"),
                         (dict(logit_bias={vocab: 1.0}), "logit_bias")]:
            with pytest.raises(nopad.InvalidArgumentError, match=word):
                eng.submit(prompts[0], max_tokens=2, **kw)


def test_engine_logprobs():
    """A greedy request's logprobs are log-softmax of the model's logits at its ids (the same
    model scored whole through Generator.decode); sampled ones are finite and <= 0; a request
    without logprobs refuses to report them."""
    with nopad.Generator(MODELS / "llama_gqa") as gen, \
            nopad.Engine(gen, kv_cache_tokens=4096, max_running=4, max_step_tokens=256) as eng:
        prompt = _prompts(1, gen.info.vocab_size, seed=7)[0]
        r = eng.submit(prompt, max_tokens=10, ignore_eos=True, logprobs=True)
        r.result()
        got = r.logprobs()
        assert len(got) == 10
        with gen.sequence() as seq:
            logits = gen.decode(seq, prompt + r.ids[:-1], all_logits=True).astype(np.float64)
        rows = logits[len(prompt) - 1:]
        lse = np.log(np.exp(rows - rows.max(axis=1, keepdims=True)).sum(axis=1)) + rows.max(axis=1)
        want = rows[np.arange(10), r.ids] - lse
        # CPU fp32 on both sides, different batch shapes: 1e-6 relative noise in the logits
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
        r.close()
        s = eng.submit(prompt, max_tokens=6, ignore_eos=True, logprobs=True, temperature=0.8,
                       top_p=0.9, seed=3)
        s.result()
        lp = s.logprobs()
        assert len(lp) == 6 and all(np.isfinite(lp)) and max(lp) <= 0.0
        s.close()
        plain = eng.submit(prompt, max_tokens=2, ignore_eos=True)
        plain.result()
        with pytest.raises(nopad.InvalidArgumentError, match="without logprobs"):
            plain.logprobs()
        plain.close()
