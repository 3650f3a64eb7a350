"""Constrained decoding from Python (Engine.submit's json_schema, json_object, regex, choices):
with SmolLM2 (skipped without the GGUF), a Pydantic model's schema, sampled at temperature 1,
gives documents that the model class itself validates; a regex and choices hold whole; bad
arguments and an unsupported schema keyword are refused before anything runs."""
import json
import os
import re
from pathlib import Path
from typing import List, Literal

import pytest

import nopad


@pytest.fixture(scope="module")
def gguf():
    path = os.environ.get("NOPAD_SMOLLM2_GGUF") or os.path.expanduser(
        "~/.cache/nopad/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not Path(path).is_file():
        pytest.skip("SmolLM2 GGUF not found (scripts/fetch_default_decoder.sh)")
    return path


CHAT = "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n"


def test_pydantic_schema_regex_choices(gguf):
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=24)
        country: str = pydantic.Field(max_length=24)
        population: int = pydantic.Field(ge=0)
        climate: Literal["hot", "mild", "cold"]
        sights: List[str] = pydantic.Field(max_length=3)

    with nopad.Generator(gguf) as gen, nopad.Engine(gen) as eng:
        # sampled: some documents wander into an extra property (pydantic's schema allows them)
        # until max_tokens; which ones depends on the CPU's kernels' summation order, so six
        # seeds, at least two of them whole (4 of 6 whole with the AVX2 kernels, 2026-12-07)
        reqs = [eng.submit(CHAT % "Describe a city as JSON.", max_tokens=120, temperature=1.0,
                           seed=s, json_schema=City) for s in range(6)]
        whole = 0
        for r in reqs:
            text = r.result()
            if r.finish_reason == "length":  # a prefix, cut by max_tokens
                continue
            assert r.finish_reason == "stop"
            City.model_validate_json(text)  # raises on an invalid document
            whole += 1
        assert whole >= 2
        r = eng.submit(CHAT % "A ticket code?", max_tokens=16, temperature=1.0, seed=5,
                       regex=r"[A-Z]{2}-[0-9]{4}")
        assert re.fullmatch(r"[A-Z]{2}-[0-9]{4}", r.result()) and r.finish_reason == "stop"
        r = eng.submit(CHAT % "Is the sky blue? yes or no", max_tokens=8, choices=["yes", "no"])
        assert r.result() in ("yes", "no")
        r = eng.submit(CHAT % "A JSON object please.", max_tokens=60, json_object=True)
        text = r.result()
        if r.finish_reason == "stop":
            assert isinstance(json.loads(text), dict)


def test_refusals(gguf):
    with nopad.Generator(gguf) as gen, nopad.Engine(gen) as eng:
        with pytest.raises(nopad.UnsupportedError, match=r"multipleOf"):
            eng.submit("x", json_schema={"type": "integer", "multipleOf": 2})
        with pytest.raises(nopad.InvalidArgumentError, match="at most one"):
            eng.submit("x", json_object=True, regex="a+")
        with pytest.raises(TypeError):
            eng.submit("x", choices="yes")
