"""No native memory leaks over 1000 create/free cycles: the resident set stays flat after a
warm-up (VmRSS from /proc/self/status)."""
import gc
import sys

import numpy as np
import pytest

import nopad
from conftest import MODELS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

CYCLES = 1000
BOUND_KB = 3 * 1024  # one leaked copy of bert_a's weights per cycle would be ~170 MB


def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def settle():
    """Collects garbage and hands free heap memory back to the system (glibc's malloc_trim), so
    that memory freed by earlier tests (e.g. a decoder's weights and KV pool) neither hides a
    leak nor counts as one."""
    gc.collect()
    try:
        import ctypes
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def grows(cycle, warmup=100):
    for i in range(warmup):
        cycle(i)
    settle()
    before = rss_kb()
    for i in range(CYCLES):
        cycle(i)
    settle()
    return rss_kb() - before


def test_encoder_create_free():
    ids = np.arange(1, 10, dtype=np.int32)
    cu = np.array([0, 4, 9], dtype=np.int32)

    def cycle(i):
        if i % 2:
            with nopad.Encoder(MODELS / "bert_a") as enc:  # close() frees
                enc.forward(ids, cu, pooling="mean")
        else:
            enc = nopad.Encoder(MODELS / "albert_b")  # garbage collection frees
            enc.forward(ids, cu)
            del enc

    growth = grows(cycle)
    assert growth < BOUND_KB, "RSS grew by %d KiB over %d cycles" % (growth, CYCLES)


def test_tokenizer_create_free():
    def cycle(i):
        tok = nopad.Tokenizer(MODELS / ("st_max" if i % 2 else "st_cls_v6"))
        tok.encode_batch(["them any old do", "x" * 50])
        if i % 3:
            tok.close()
        del tok

    growth = grows(cycle)
    assert growth < BOUND_KB, "RSS grew by %d KiB over %d cycles" % (growth, CYCLES)


def test_encoder_with_tokenizer_create_free():
    def cycle(i):
        enc = nopad.Encoder(MODELS / "st_mean_norm")
        tok = enc.tokenizer
        enc.encode(["them", "any old do"])
        if i % 2:
            enc.close()
        del enc, tok

    growth = grows(cycle)
    assert growth < BOUND_KB, "RSS grew by %d KiB over %d cycles" % (growth, CYCLES)


def test_a_leak_would_be_seen():
    """The measurement sees ~100 KiB leaked per cycle (keeping the encoders alive)."""
    kept = []
    growth = grows(lambda i: kept.append(nopad.Encoder(MODELS / "bert_a")), warmup=0)
    for enc in kept:
        enc.close()
    assert growth > BOUND_KB


def test_freed_without_the_cycle_collector():
    """No reference cycles: dropping the last reference frees at once (not at the next gc)."""
    import weakref

    gc.disable()
    try:
        enc = nopad.Encoder(MODELS / "st_max")
        tok = enc.tokenizer
        r = weakref.ref(enc)
        del enc
        assert r() is not None  # the tokenizer keeps its encoder alive ...
        assert tok.encode("them")[0] == 2
        del tok
        assert r() is None  # ... and nothing else does
        t = nopad.Tokenizer(MODELS / "st_max")
        r = weakref.ref(t)
        del t
        assert r() is None
    finally:
        gc.enable()
