"""nopad.Engine on device="cuda" (skipped without a GPU and a CUDA build of libnopad): the step
overlap (step n+1's forward queued before step n's ids are back; the host takes the ids as soon as
the sampling is done and builds step n+1's masks while its forward runs) gives the ids the engine
gives without it, sampled with seeds and greedy; and constrained requests among free ones keep to
their schema. The tiny chat decoder of the serve tests (llama_gqa with a byte-level tokenizer)."""
import json
import os

import numpy as np
import pytest

import nopad
from conftest import make_tiny_chat_decoder


def _cuda_build(folder):
    try:
        nopad.Generator(folder, device="cuda", dtype="fp16").close()
    except nopad.NopadError:  # a CPU build ("no CUDA backend"), or no GPU
        return False
    return True


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = make_tiny_chat_decoder(tmp_path_factory.mktemp("cuda_engine") / "tiny_chat")
    if not _cuda_build(folder):
        pytest.skip("needs a CUDA GPU and libnopad built with NOPAD_CUDA")
    return folder


def _prompts(n, vocab, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab - 2, int(rng.integers(1, 40))).tolist() for _ in range(n)]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_overlap_gives_the_same_ids(tiny, temperature):
    # one request at a time (max_running=1): both modes run the same steps on the same rows, so
    # the ids must be equal bit for bit; only the overlap's timing differs
    got = {}
    for overlap in (False, True):
        with nopad.Generator(tiny, device="cuda", dtype="fp16") as gen, \
                nopad.Engine(gen, kv_cache_tokens=4096, max_running=1, overlap_steps=overlap) as eng:
            prompts = _prompts(12, gen.info.vocab_size, seed=5)
            reqs = [eng.submit(p, max_tokens=int(8 + 5 * i), temperature=temperature, seed=100 + i,
                               ignore_eos=True, logprobs=True) for i, p in enumerate(prompts)]
            got[overlap] = [(r.result(), r.ids, r.logprobs()) for r in reqs]
            for r in reqs:
                assert r.finish_reason == "length"
                r.close()
    for (_, ids_off, lp_off), (_, ids_on, lp_on) in zip(got[False], got[True]):
        assert ids_on == ids_off
        assert np.array_equal(np.asarray(lp_on), np.asarray(lp_off))


SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 100},
        "kind": {"enum": ["a", "bb", "ccc"]},
        "tag": {"type": "string", "maxLength": 6},
    },
    "required": ["n", "kind", "tag"],
    "additionalProperties": False,
}


def test_constrained_among_free_requests(tiny):
    # 32 requests at once, every other under the schema, sampled: the masks of step n+1 are built
    # while its forward runs; every whole document validates, none fails
    with nopad.Generator(tiny, device="cuda", dtype="fp16") as gen, \
            nopad.Engine(gen, kv_cache_tokens=8192, max_running=32) as eng:
        prompts = _prompts(32, gen.info.vocab_size, seed=9)
        if os.environ.get("NOPAD_COMM_FORCE") == "1":
            # the tensor-parallel path at world size one (scripts/gpu_decoder.sh test-comm): a split
            # model refuses constraints at submit, clearly (docs/parallel.md), and runs the rest
            with pytest.raises(nopad.UnsupportedError, match="constrained decoding on a model split"):
                eng.submit(prompts[1], max_tokens=8, json_schema=SCHEMA)
            free = eng.submit(prompts[0], max_tokens=8, ignore_eos=True)
            free.result()
            assert len(free.ids) == 8
            return
        reqs = [eng.submit(p, max_tokens=80, temperature=1.0, seed=i,
                           **({"json_schema": SCHEMA} if i % 2 else {"ignore_eos": True}))
                for i, p in enumerate(prompts)]
        whole = 0
        for i, r in enumerate(reqs):
            text = r.result()
            assert r.finish_reason in ("stop", "length"), r.finish_reason
            if i % 2 and r.finish_reason == "stop":
                doc = json.loads(text)
                assert set(doc) == {"n", "kind", "tag"}
                assert isinstance(doc["n"], int) and 0 <= doc["n"] <= 100
                assert doc["kind"] in ("a", "bb", "ccc") and len(doc["tag"]) <= 6
                whole += 1
            elif i % 2 == 0:
                assert len(r.ids) == 80
            r.close()
        assert whole >= 8
        assert eng.stats()["masks_built"] > 0
