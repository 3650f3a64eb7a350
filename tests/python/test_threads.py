"""close() while other threads use the object (issue 19, item 1): close() stops new calls at once
(they raise the "closed" error), waits only for the calls in flight, then frees; it never hangs,
also when called twice at once, from a thread that is itself inside a call, or from __del__."""
import gc
import threading

import numpy as np
import pytest

import nopad
from conftest import MODELS

MODEL = MODELS / "st_max"  # tiny CPU model with a tokenizer
TIMEOUT = 10.0  # generous: only "it returns", never how fast
SENTENCES = ["hello world", "them and us", "a third, longer sentence of words"]


def _start_workers(enc, n):
    """n daemon threads calling enc.encode in a loop until it raises (or `stop` is set)."""
    stop = threading.Event()
    started = threading.Barrier(n + 1)
    results = [None] * n  # per worker: the exception that ended its loop
    calls = [0] * n

    def work(k):
        first = True
        try:
            while not stop.is_set():
                emb = enc.encode(SENTENCES)
                assert emb.shape == (len(SENTENCES), enc.hidden_size)
                assert np.isfinite(emb).all()
                calls[k] += 1
                if first:
                    first = False
                    started.wait(TIMEOUT)
        except BaseException as e:  # noqa: BLE001 (recorded, checked by the test)
            results[k] = e
            if first:
                started.abort()

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    started.wait(TIMEOUT)  # every worker has finished one encode and is looping
    return threads, stop, results, calls


def _close_in_thread(obj):
    errors = []

    def run():
        try:
            obj.close()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errors


def _joined(threads, what):
    """Joins each thread (TIMEOUT each) and asserts it ended: `what` names them in the failure."""
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive(), what


def _closed_cleanly(closer, errors, what):
    """The closer thread ended within TIMEOUT and its close() raised nothing."""
    _joined([closer], what)
    assert not errors, errors


def _assert_closed_error(e):
    assert isinstance(e, nopad.InvalidArgumentError), repr(e)
    assert e.status == nopad.Status.INVALID_ARGUMENT
    assert "closed" in str(e).lower(), str(e)


@pytest.mark.parametrize("n_workers", [1, 2, 4])
def test_close_returns_while_threads_keep_encoding(n_workers):
    enc = nopad.Encoder(MODEL)
    threads, stop, results, calls = _start_workers(enc, n_workers)
    try:
        _closed_cleanly(*_close_in_thread(enc), "Encoder.close() did not return within %gs while %d "
                        "threads kept encoding" % (TIMEOUT, n_workers))
        assert enc.closed
        _joined(threads, "a worker kept running after close()")
    finally:
        stop.set()  # lets a hung close() (the old bug) finish, so the test run can end
    assert all(c >= 1 for c in calls), calls
    for e in results:
        _assert_closed_error(e)
    with pytest.raises(nopad.InvalidArgumentError, match="closed"):
        enc.encode(SENTENCES)
    enc.close()  # twice is fine


def test_close_from_several_threads_at_once():
    enc = nopad.Encoder(MODEL)
    tok = enc.tokenizer
    threads, stop, results, _ = _start_workers(enc, 4)
    try:
        for closer, errors in [_close_in_thread(enc) for _ in range(3)]:
            _closed_cleanly(closer, errors, "a concurrent close() did not return")
        _joined(threads, "a worker kept running after close()")
    finally:
        stop.set()
    for e in results:
        _assert_closed_error(e)
    assert enc.closed and tok.closed
    with pytest.raises(nopad.InvalidArgumentError, match="closed"):
        tok.encode("a")


def test_close_from_inside_a_call_does_not_deadlock():
    """A thread inside a call (a signal handler or callback on it) closes the object: close()
    returns at once, new calls raise, and the memory goes when the outer call ends."""
    enc = nopad.Encoder(MODEL)
    done = threading.Event()

    def inside():
        with enc._handle.use():
            enc.close()
            enc.close()
            assert enc.closed
            with pytest.raises(nopad.InvalidArgumentError, match="closed"):
                enc.encode(SENTENCES)
        done.set()

    t = threading.Thread(target=inside, daemon=True)
    t.start()
    t.join(TIMEOUT)
    assert done.is_set(), "close() inside a call deadlocked or failed"
    assert enc.closed


def test_closed_tokenizer_while_threads_tokenize():
    tok = nopad.Tokenizer(MODEL)
    stop = threading.Event()
    results = []

    def work():
        try:
            while not stop.is_set():
                tok.encode("hello world")
        except BaseException as e:  # noqa: BLE001
            results.append(e)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        _closed_cleanly(*_close_in_thread(tok), "Tokenizer.close() did not return")
        _joined(threads, "a worker kept running after close()")
    finally:
        stop.set()
    assert len(results) == 4
    for e in results:
        _assert_closed_error(e)


def test_garbage_collection_after_threads():
    enc = nopad.Encoder(MODEL)
    threads, stop, results, _ = _start_workers(enc, 2)
    stop.set()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive()
    assert results == [None, None]
    del enc, threads
    gc.collect()  # __del__ frees without waiting on anything


def test_model_tokenizer_after_close_is_refused():
    """A model's tokenizer is read inside the model's protection (issue 38, item 7.3): once
    close() has begun, enc.tokenizer raises the "closed" error; before, it read the vocabulary
    size of the freed tokenizer (a use-after-free that ASan reports) and returned a view."""
    enc = nopad.Encoder(MODEL)
    assert enc.tokenizer.vocab_size > 0
    enc.close()
    with pytest.raises(nopad.InvalidArgumentError, match="closed") as info:
        enc.tokenizer
    _assert_closed_error(info.value)
    with pytest.raises(nopad.InvalidArgumentError, match="closed"):
        enc.encode(SENTENCES)  # the path through the tokenizer


def _gguf():
    import os
    from pathlib import Path

    path = os.environ.get("NOPAD_SMOLLM2_GGUF") or os.path.expanduser(
        "~/.cache/nopad/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not Path(path).is_file():
        pytest.skip("SmolLM2 GGUF not found (scripts/fetch_default_decoder.sh)")
    return path


def test_close_while_threads_generate_from_text():
    """close() from another thread while others generate from text prompts (issue 38, item
    7.3): every path through the tokenizer (prompts, the decode of the output) is inside the
    model's protection, so the workers end with the "closed" error and nothing reads freed
    memory (ASan checks that)."""
    gen = nopad.Generator(_gguf())
    tok = gen.tokenizer
    stop = threading.Event()
    started = threading.Barrier(3)
    results = [None, None]

    def work(k):
        first = True
        try:
            while not stop.is_set():
                if k == 0:
                    assert len(gen.generate("Hello", max_tokens=2)) == 1
                else:
                    assert gen.tokenizer.encode("Hello world") and tok.decode([1, 2])
                if first:
                    first = False
                    started.wait(TIMEOUT)
        except BaseException as e:  # noqa: BLE001 (recorded, checked below)
            results[k] = e
            if first:
                started.abort()

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    try:
        started.wait(TIMEOUT)
        _closed_cleanly(*_close_in_thread(gen), "Generator.close() did not return")
        _joined(threads, "a worker kept running after close()")
    finally:
        stop.set()
    for e in results:
        _assert_closed_error(e)
