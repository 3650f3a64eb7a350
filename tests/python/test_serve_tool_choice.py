"""tool_choice "required" and a named function, forced by the grammar (nopad_constraint_json_sequence):
the answer is calls in the model family's format (Hermes, for the ChatML models here), each naming
one of the tools (the named one) with arguments that validate against that tool's parameters
(checked with the jsonschema package), parsed back into tool_calls with finish_reason
"tool_calls", plain and streamed, on chat and on /v1/responses. One call with a named function or
without parallel_tool_calls; one or more under "required" with them.

Two decoders: SmolLM2 (the default decoder, which sometimes calls a tool by itself) and a tiny
random decoder (tests/data/models/llama_gqa's weights, its vocabulary grown to the GPT-2-style test
tokenizer's 400 tokens plus ChatML's two markers): without the mask it never writes a valid call,
the hard case; served with the chatml, llama3 and mistral-v3 templates, so each family's call
syntax is forced and parsed back. Refusals: a tool whose parameters hold an unsupported keyword (400 naming it and
its path), a $ref outside the parameters' $defs, an unknown named function, "required" without
tools or beside a structured output.

Needs what tests/python/test_serve.py needs; skipped without it. Loopback only."""
import json
from typing import List, Literal

import pytest

from serve_fixtures import (DEC_NAME, KEY, Server, client, make_tiny_chat_decoder,  # noqa: F401
                            pytestmark, server)

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"],
        "additionalProperties": False}}}
# b unbounded: the random model writes up to 18 digits, which must come back as written (an int,
# not a double's rounding)
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
        "b": {"type": "integer"}}, "required": ["a", "b"],
        "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What's the weather in Paris and in Rome?"}]


def _check_calls(choice, names, count=None):
    """Calls only, each of one of `names` with arguments valid against its parameters."""
    m = choice.message
    assert choice.finish_reason == "tool_calls", choice
    assert m.content is None and m.tool_calls, m
    if count is not None:
        assert len(m.tool_calls) == count
    for c in m.tool_calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert c.function.name in names
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, PARAMS[c.function.name])
        props = PARAMS[c.function.name]["properties"]
        assert all(isinstance(v, int) for k, v in args.items() if props[k].get("type") == "integer"), args
    return [(c.function.name, c.function.arguments) for c in m.tool_calls]


def _streamed_calls(client, kw):
    """The raw chunks' calls (no content delta, the last chunk's finish_reason "tool_calls") and
    the client's stream helper's assembled ones, which must agree."""
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    raw = [(tc.function.name, tc.function.arguments)
           for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    with client.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion()
    assert [(c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls] == raw
    return raw


# ---- SmolLM2 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1])
def test_required_plain_and_streamed(client, seed):
    kw = dict(model=DEC_NAME, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=160,
              temperature=0.8, seed=seed)
    plain = _check_calls(client.chat.completions.create(**kw).choices[0], PARAMS)
    assert _streamed_calls(client, kw) == plain


def test_required_without_parallel_calls_is_one_call(client):
    r = client.chat.completions.create(model=DEC_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=160, temperature=0)
    _check_calls(r.choices[0], PARAMS, count=1)


def test_named_function(client):
    # the question asks for the weather; the named function is add, and that is what comes
    kw = dict(model=DEC_NAME, messages=ASK, tools=TOOLS, max_tokens=160, temperature=0,
              tool_choice={"type": "function", "function": {"name": "add"}})
    plain = _check_calls(client.chat.completions.create(**kw).choices[0], ["add"], count=1)
    assert _streamed_calls(client, kw) == plain


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    age: int = pydantic.Field(ge=0, le=120)


class Booking(pydantic.BaseModel):
    """Book a table for some guests."""
    guests: List[Person] = pydantic.Field(min_length=1, max_length=3)
    time: Literal["lunch", "dinner"]


def test_pydantic_tool_with_defs(client):
    """openai.pydantic_function_tool's schema refers to Person through $defs: the refs resolve in
    the call's schema, and the arguments parse back into the model."""
    tool = openai.pydantic_function_tool(Booking)
    assert "$defs" in tool["function"]["parameters"]
    r = client.chat.completions.create(
        model=DEC_NAME, max_tokens=200, temperature=0, tools=[tool, WEATHER],
        messages=[{"role": "user", "content": "Book dinner for Ann (31) and Bob (40)."}],
        tool_choice={"type": "function", "function": {"name": "Booking"}})
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "Booking"
    Booking.model_validate_json(call.function.arguments)


def test_responses_required_and_named(client):
    flat = [dict(type="function", **t["function"]) for t in TOOLS]
    for choice, names in (("required", PARAMS), ({"type": "function", "name": "add"}, ["add"])):
        kw = dict(model=DEC_NAME, input=ASK[0]["content"], tools=flat, tool_choice=choice,
                  max_output_tokens=160, temperature=0)
        r = client.responses.create(**kw)
        calls = [o for o in r.output if o.type == "function_call"]
        assert calls and len(calls) == len(r.output)  # calls only, no message
        for c in calls:
            assert c.name in names
            jsonschema.validate(json.loads(c.arguments), PARAMS[c.name])
        echoed = r.tool_choice if isinstance(r.tool_choice, str) else r.tool_choice.model_dump(exclude_none=True)
        assert echoed == choice
        # streamed: the same calls, as function_call items of the completed response
        events = list(client.responses.create(stream=True, **kw))
        assert events[-1].type == "response.completed"
        assert [(o.type, o.name, o.arguments) for o in events[-1].response.output] == \
               [(c.type, c.name, c.arguments) for c in calls]


WEIRD = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer", "multipleOf": 3}}}}}
SELF_REF = {"type": "function", "function": {"name": "tree", "parameters": {
    "type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}}}


@pytest.mark.parametrize("extra,param,words", [
    (dict(tools=[ADD, WEIRD], tool_choice="required"), "tools[1].function.parameters",
     'schema.properties.x: keyword "multipleOf" is not supported'),
    (dict(tools=[SELF_REF], tool_choice="required"), "tools[0].function.parameters", '"#"'),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "sub"}}), "tool_choice",
     '"sub", which is not among'),
    (dict(tool_choice="required"), "tool_choice", "only allowed when 'tools'"),
    (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "tool_choice",
     "cannot be combined"),
    (dict(tools=TOOLS, tool_choice={"type": "function"}), "tool_choice", "must be"),
])
def test_refusals(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DEC_NAME, messages=ASK, max_tokens=4, **extra)
    assert e.value.body["param"] == param and words in e.value.body["message"], e.value.body


def test_unsupported_keyword_without_tool_choice_is_only_listed(client):
    """With tool_choice auto the parameters are only shown to the model: nothing compiles them."""
    r = client.chat.completions.create(model=DEC_NAME, messages=ASK, max_tokens=4, tools=[WEIRD])
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")


# ---- the tiny random decoder --------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_chat_decoder(tmp_path_factory.mktemp("tool_choice") / "tiny_chat")


# the three call syntaxes: Hermes blocks (chatml), Llama-3's bare object, Mistral's bare array
@pytest.fixture(scope="module", params=["chatml", "llama3", "mistral-v3"])
def tiny_client(tiny_folder, request):
    s = Server("--model", str(tiny_folder), "--chat-template", request.param, "--api-key", KEY, "--threads", "2")
    yield openai.OpenAI(base_url=s.url() + "/v1", api_key=KEY, max_retries=0)
    s.stop()


TINY = dict(model="tiny_chat", messages=ASK, tools=TOOLS, max_tokens=200, temperature=1.0,
            parallel_tool_calls=False)


def test_tiny_decoder_calls_nothing_unforced(tiny_client):
    """The reference for the cases below: left to itself the random model writes no call."""
    for seed in range(4):
        r = tiny_client.chat.completions.create(seed=seed, **TINY)
        assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("choice,names", [
    ("required", PARAMS), ({"type": "function", "function": {"name": "get_weather"}}, ["get_weather"]),
    ({"type": "function", "function": {"name": "add"}}, ["add"])], ids=["required", "named_weather", "named_add"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tiny_decoder_forced(tiny_client, choice, names, seed):
    kw = dict(seed=seed, tool_choice=choice, **TINY)
    plain = _check_calls(tiny_client.chat.completions.create(**kw).choices[0], names, count=1)
    assert _streamed_calls(tiny_client, kw) == plain
