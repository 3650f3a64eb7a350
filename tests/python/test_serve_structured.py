"""nopad serve's structured outputs through the official openai client, with SmolLM2: a Pydantic
model through the client's parse helper (response_format json_schema) comes back as that model,
sampled at temperature 1 where a 135M model's free text is rarely JSON; json_object answers parse
as objects; vLLM's guided_choice, guided_regex and guided_json hold; /v1/responses' text.format
json_schema too; streamed, the chunks add up to a valid document. Refusals are 400s naming the
field and, for a schema, the keyword and its path. Needs what tests/python/test_serve.py needs;
skipped without it. Loopback only."""
import json
import re
from typing import List, Literal

import pytest

from serve_fixtures import DEC_NAME, client, pytestmark, server  # noqa: F401

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")


class Planet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    moons: int = pydantic.Field(ge=0, le=500)
    rings: bool
    kind: Literal["rocky", "gas", "ice"]
    neighbours: List[str] = pydantic.Field(max_length=2)


ASK = [{"role": "user", "content": "Describe a planet as JSON."}]


def _parse(client, **kw):
    parse = getattr(getattr(client, "beta", client).chat.completions, "parse", None) \
        or client.chat.completions.parse
    return parse(**kw)


def test_pydantic_parse(client):
    whole = 0
    for seed in range(3):
        try:
            c = _parse(client, model=DEC_NAME, messages=ASK, response_format=Planet, temperature=1.0,
                       seed=seed, max_tokens=120)
        except openai.LengthFinishReasonError:  # a prefix of a document, cut by max_tokens
            continue
        choice = c.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Planet)
        whole += 1
    assert whole >= 2


def test_json_object_and_guided(client):
    c = client.chat.completions.create(model=DEC_NAME, messages=ASK, temperature=1.0, seed=4,
                                       max_tokens=100, response_format={"type": "json_object"})
    if c.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(c.choices[0].message.content), dict)
    c = client.chat.completions.create(model=DEC_NAME, messages=[{"role": "user", "content": "Pick one."}],
                                       max_tokens=8, extra_body={"guided_choice": ["alpha", "beta"]})
    assert c.choices[0].message.content in ("alpha", "beta")
    c = client.completions.create(model=DEC_NAME, prompt="Code: ", max_tokens=12, temperature=1.0, seed=2,
                                  extra_body={"guided_regex": "[a-f0-9]{6}"})
    assert re.fullmatch("[a-f0-9]{6}", c.choices[0].text)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    c = client.completions.create(model=DEC_NAME, prompt="Answer: ", max_tokens=20,
                                  extra_body={"guided_json": schema})
    assert isinstance(json.loads(c.choices[0].text)["ok"], bool)


def test_streamed_and_responses(client):
    chunks = client.chat.completions.create(
        model=DEC_NAME, messages=ASK, temperature=1.0, seed=1, max_tokens=120, stream=True,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "planet", "schema": Planet.model_json_schema()}})
    text, finish = "", None
    for ch in chunks:
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
    if finish == "stop":
        Planet.model_validate_json(text)
    r = client.responses.create(model=DEC_NAME, input="Describe a planet as JSON.", temperature=1.0,
                                max_output_tokens=120,
                                text={"format": {"type": "json_schema", "name": "planet",
                                                 "schema": Planet.model_json_schema(), "strict": True}})
    if r.status == "completed":
        Planet.model_validate_json(r.output_text)


def test_refusals(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=DEC_NAME, messages=ASK, max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {
                "name": "n", "schema": {"type": "object", "properties": {
                    "n": {"type": "number", "multipleOf": 3}}}}})
    assert "multipleOf" in str(err.value) and "properties.n" in str(err.value)
    with pytest.raises(openai.BadRequestError, match="at most one"):
        client.chat.completions.create(model=DEC_NAME, messages=ASK, max_tokens=8,
                                       response_format={"type": "json_object"},
                                       extra_body={"guided_regex": "a+"})
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model=DEC_NAME, messages=ASK, max_tokens=8,
                                       response_format={"type": "yaml"})


@pytest.mark.parametrize("route,body,param", [
    ("chat/completions", {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": {"name": "n"}}},
     "response_format.json_schema.schema"),
    ("chat/completions", {"messages": ASK, "response_format": {"type": "yaml"}}, "response_format.type"),
    ("chat/completions", {"messages": ASK, "response_format": "json"}, "response_format"),
    ("responses", {"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema"),
    ("responses", {"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ("responses", {"input": "x", "text": {"format": {"type": "json_schema", "name": "n",
                                                     "schema": {"type": "string", "format": "hostname"}}}},
     "text.format.schema"),
])
def test_format_refusals_name_the_field(server, route, body, param):
    """chat's response_format and /v1/responses' text.format share one parser: each refusal is a
    400 naming the field where the problem is."""
    status, _, raw = server.request("POST", "/v1/" + route, {"model": DEC_NAME, **body})
    err = json.loads(raw)["error"]
    assert status == 400 and err["param"] == param, err
