"""nopad serve's /v1/responses (text) and completions' echo, through the official openai client.
A response equals the chat completion of the same messages (instructions as the system message:
the same prompt, so the same greedy text and token counts), plain and streamed (the events in
OpenAI's order with their sequence numbers, the deltas adding up to the text, the client's stream
helper assembling the same response); a string input, a message list and input_text parts are the
same request; tools as on chat (the same prompt, so the same calls for the same seed, as
function_call items, plain and streamed, and function_call / function_call_output items back
into the prompt); what would need more (stored conversations, forced calls)
is a 400 naming the field. echo puts the prompt's text before the completion, plain and streamed, and
with logprobs (prompt log-probabilities are not computed) is a 400.

Needs what tests/python/test_serve.py needs; skipped without it. Loopback only."""
import json

import pytest

from serve_fixtures import DEC_NAME, client, pytestmark, server  # noqa: F401  (the skip condition)

openai = pytest.importorskip("openai")

QUESTION = "What is the capital of France?"
BRIEF = "Answer briefly."


def _chat(client, max_tokens):
    return client.chat.completions.create(
        model=DEC_NAME, max_tokens=max_tokens, temperature=0,
        messages=[{"role": "system", "content": BRIEF}, {"role": "user", "content": QUESTION}])


@pytest.mark.parametrize("max_tokens", [40, 5])
def test_response_equals_chat(client, max_tokens):
    chat = _chat(client, max_tokens)
    r = client.responses.create(model=DEC_NAME, instructions=BRIEF, input=QUESTION,
                                max_output_tokens=max_tokens, temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == DEC_NAME
    assert r.output_text == chat.choices[0].message.content
    assert len(r.output) == 1 and r.output[0].type == "message" and r.output[0].role == "assistant"
    assert [c.type for c in r.output[0].content] == ["output_text"]
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.instructions == BRIEF and r.max_output_tokens == max_tokens
    if chat.choices[0].finish_reason == "length":
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    else:
        assert r.status == "completed" and r.incomplete_details is None


def test_response_streamed(client):
    kw = dict(model=DEC_NAME, instructions=BRIEF, input=QUESTION, max_output_tokens=40, temperature=0)
    plain = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    last = "response.completed" if plain.status == "completed" else "response.incomplete"
    n_deltas = types.count("response.output_text.delta")
    assert types == (["response.created", "response.in_progress", "response.output_item.added",
                      "response.content_part.added"] + ["response.output_text.delta"] * n_deltas
                     + ["response.output_text.done", "response.content_part.done",
                        "response.output_item.done", last])
    assert n_deltas >= 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == plain.output_text == events[-4].text == events[-1].response.output_text
    ids = {e.item_id for e in events if hasattr(e, "item_id")} | {events[2].item.id, events[-2].item.id}
    assert len(ids) == 1
    assert events[-1].response.usage.output_tokens == plain.usage.output_tokens
    if plain.status == "completed":  # the helper insists on response.completed
        with client.responses.stream(**kw) as stream:
            final = stream.get_final_response()
        assert final.output_text == plain.output_text


def test_input_forms(client):
    kw = dict(model=DEC_NAME, max_output_tokens=8, temperature=0)
    a = client.responses.create(input=QUESTION, **kw)
    b = client.responses.create(input=[{"role": "user", "content": QUESTION}], **kw)
    c = client.responses.create(input=[{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "What is the capital "}, {"type": "input_text", "text": "of France?"}]}], **kw)
    assert a.output_text == b.output_text == c.output_text
    # a conversation: the assistant's earlier output_text goes back into the prompt
    conv = client.responses.create(input=[
        {"role": "developer", "content": BRIEF}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": QUESTION}], **kw)
    chat = client.chat.completions.create(model=DEC_NAME, max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": BRIEF}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": QUESTION}])
    assert conv.output_text == chat.choices[0].message.content


@pytest.mark.parametrize("extra,param", [
    (dict(tools=[{"type": "function", "name": "f", "parameters": {}}],
          tool_choice={"type": "function", "name": "g"}), "tool_choice"),
    (dict(tools=[{"type": "web_search"}]), "tools[0]"),
    (dict(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]), "input[0]"),
    (dict(text={"format": {"type": "yaml"}}), "text.format.type"),
    (dict(previous_response_id="resp_1"), "previous_response_id"),
    (dict(input=[{"type": "reasoning", "id": "rs_1", "summary": []}]), "input[0]"),
    (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]), "input[0].content"),
    (dict(input=""), "input"),
    (dict(extra_body={"max_tokens": 5}), "max_tokens"),
    (dict(truncation="auto"), "truncation"),
])
def test_refusals(client, extra, param):
    kw = dict(model=DEC_NAME, input=QUESTION, max_output_tokens=4)
    kw.update(extra)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**kw)
    assert e.value.body["param"] == param and e.value.body["message"], e.value.body


@pytest.mark.parametrize("prompt", ["The capital of France is", [504, 3575, 282]])
def test_echo(client, prompt):
    kw = dict(model=DEC_NAME, prompt=prompt, max_tokens=6, temperature=0)
    plain = client.completions.create(**kw)
    echoed = client.completions.create(echo=True, **kw)
    head = prompt if isinstance(prompt, str) else None
    if head is None:  # ids: the prompt's text is their decoding, the echo's head
        head = echoed.choices[0].text[:len(echoed.choices[0].text) - len(plain.choices[0].text)]
        assert head and not head.startswith(" ")
    assert echoed.choices[0].text == head + plain.choices[0].text
    assert echoed.usage.completion_tokens == plain.usage.completion_tokens
    chunks = list(client.completions.create(echo=True, stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == echoed.choices[0].text
    assert chunks[0].choices[0].text.startswith(head)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(echo=True, logprobs=0, **kw)
    assert e.value.body["param"] == "echo"


def test_echo_only_on_completions(server):
    status, _, body = server.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "echo": True})
    assert status == 400 and json.loads(body)["error"]["param"] == "echo"


TOOLS = [{"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}]
ASK = "What's the weather in Paris? Use the tool."


# On the development machine (2026-12-07) seed 6 makes SmolLM2 call a tool, seed 2 answers in text
@pytest.mark.parametrize("seed", [6, 2])
def test_tools_equal_chat(client, seed):
    """The tools reach the prompt as on chat: the same seed gives the chat's answer, as items."""
    chat_tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS]
    chat = client.chat.completions.create(model=DEC_NAME, messages=[{"role": "user", "content": ASK}],
                                          tools=chat_tools, max_tokens=60, temperature=0.7, seed=seed)
    kw = dict(model=DEC_NAME, input=ASK, tools=TOOLS, max_output_tokens=60, temperature=0.7,
              extra_body={"seed": seed})
    r = client.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    want = chat.choices[0].message
    assert [(c.name, c.arguments) for c in calls] == \
           [(c.function.name, c.function.arguments) for c in want.tool_calls or []]
    for c in calls:
        assert c.call_id.startswith("call_") and c.id == "fc_" + c.call_id[5:] and c.status == "completed"
        assert isinstance(json.loads(c.arguments), dict)
    assert (r.output_text or None) == want.content
    assert r.status == ("completed" if calls or chat.choices[0].finish_reason == "stop" else "incomplete")
    events = list(client.responses.create(stream=True, **kw))
    final = events[-1].response
    assert [(o.type, getattr(o, "name", None), getattr(o, "arguments", None)) for o in final.output] == \
           [(o.type, getattr(o, "name", None), getattr(o, "arguments", None)) for o in r.output]
    assert final.output_text.strip() == r.output_text.strip()  # a stream's text is untrimmed
    types = [e.type for e in events]
    assert types.count("response.function_call_arguments.done") == len(calls)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    if final.status == "completed":  # the client's helper assembles the same items
        with client.responses.stream(**kw) as stream:
            got = stream.get_final_response()
        assert [o.type for o in got.output] == [o.type for o in r.output]


def test_call_items_go_back_into_the_prompt(client):
    items = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": json.dumps({"city": "Paris"})},
             {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}]
    r = client.responses.create(model=DEC_NAME, input=items, tools=TOOLS, max_output_tokens=12, temperature=0)
    chat_tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS]
    chat = client.chat.completions.create(model=DEC_NAME, tools=chat_tools, max_tokens=12, temperature=0, messages=[
        items[0],
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": items[1]["arguments"]}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}])
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.output_text == (chat.choices[0].message.content or "")
