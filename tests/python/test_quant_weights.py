"""nopad.Generator(weights=...): a GGUF file's block-quantized weights kept as stored on the CPU
(tests/data/gguf/quant_tiny.gguf, scripts/make_gguf_quant_fixtures.py: random Q4_K / Q6_K / Q8_0
weights; tests/test_quant_decoder.c derives the bounds) against the same file dequantised, and the
choices that are refused."""
import numpy as np
import pytest

import nopad
from conftest import DATA, row_rel_err

TINY = DATA / "gguf" / "quant_tiny.gguf"


def test_native_against_dequantised():
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 512, n).tolist() for n in (37, 5, 50)]
    with nopad.Generator(TINY) as native, nopad.Generator(TINY, weights="f32") as dequant:
        # the activations are rounded to int8 blocks: 5e-2 (test_quant_decoder.c derives it);
        # the random model's greedy ids are far from ties
        a = native.decode([native.sequence() for _ in prompts], prompts, all_logits=True)
        b = dequant.decode([dequant.sequence() for _ in prompts], prompts, all_logits=True)
        assert row_rel_err(a, b) < 5e-2
        assert native.generate_ids(prompts, max_tokens=16, ignore_eos=True) == \
            dequant.generate_ids(prompts, max_tokens=16, ignore_eos=True)
        assert native.generate("abc", max_tokens=4, ignore_eos=True) == \
            dequant.generate("abc", max_tokens=4, ignore_eos=True)


def test_weights_refused():
    with pytest.raises(nopad.UnsupportedError, match="fp8 is not supported yet"):
        nopad.Generator(TINY, weights="fp8")
    with pytest.raises(nopad.InvalidArgumentError, match="compute dtype"):
        nopad.Generator(TINY, weights="bf16")
    with pytest.raises(nopad.InvalidArgumentError, match="'int4'"):
        nopad.Generator(TINY, weights="int4")
