"""top_logprobs / completions logprobs k, logit_bias, presence_penalty and frequency_penalty through
nopad serve, with the openai client against a server on loopback.

The decoder is the tiny random ChatML decoder (serve_fixtures.make_tiny_chat_decoder: f32 weights,
402 tokens). The reference is the same model through the Python package: Generator.decode fed the
prompt, then one id a step as the engine feeds them, its logits changed as nopad.h defines the
fields (logit_bias added, then logit - frequency_penalty * count - presence_penalty * [count > 0]
over the generated ids, in float32), a log-softmax in double and the argmax (greedy). Both sides
run the CPU's f32 kernels on the same shapes, so the log-probabilities agree to ~1e-6; the bound
is the issue's 1e-4.

Needs what tests/python/test_serve.py needs; skipped without it. Loopback only."""
import json

import numpy as np
import pytest

import nopad
from serve_fixtures import KEY, Server, make_tiny_chat_decoder, pytestmark  # noqa: F401

openai = pytest.importorskip("openai")

MODEL = "tiny_chat"
VOCAB = 402
ATOL = 1e-4  # the bound; both sides are the same f32 CPU arithmetic (agree to ~1e-6)
# what the chatml writer renders for one user message (no default system message: the tiny
# decoder's template is named, not read from a tokenizer_config)
CHAT = [{"role": "user", "content": "Say something."}]
CHAT_TEXT = "<|im_start|>user\nSay something.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_chat_decoder(tmp_path_factory.mktemp("logprobs") / MODEL)


@pytest.fixture(scope="module")
def server(folder):
    s = Server("--model", str(folder), "--chat-template", "chatml", "--api-key", KEY, "--threads", "2")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url() + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def gen(folder):
    with nopad.Generator(folder) as g:
        yield g


def _log_softmax(x):
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def reference(gen, prompt, steps, presence=0.0, frequency=0.0, bias=None):
    """Greedy by the definitions (module docstring): the ids and each step's log-softmax rows."""
    ids, rows = [], []
    with gen.sequence() as seq:
        logits = gen.decode(seq, list(prompt))[0]
        for _ in range(steps):
            x = logits.astype(np.float32).copy()
            for t, b in (bias or {}).items():
                x[t] += np.float32(b)
            counts = np.bincount(np.array(ids, dtype=np.int64), minlength=len(x)).astype(np.float32)
            x = (x - np.float32(frequency) * counts) - np.float32(presence) * (counts > 0).astype(np.float32)
            rows.append(_log_softmax(x))
            ids.append(int(np.argmax(x)))  # the lowest id on ties, as the sampler
            logits = gen.decode(seq, [ids[-1]])[0]
    return ids, rows


def text(gen, t):
    """The token's text as the server reports it: its JSON strings end at a NUL (cJSON's C strings),
    so the byte token 0 is "" there (docs/serve.md)."""
    return gen.tokenizer.decode([t], skip_special_tokens=False).split("\0")[0]


def top_ids(row, k):
    return np.argsort(-row, kind="stable")[:k]  # equal values: the lower id first, as the engine


def prompt_ids(seed, n=12):
    return np.random.default_rng(seed).integers(0, 400, n).tolist()


def check_completion_logprobs(gen, lp, ids, rows, k):
    """A completions logprobs object against the reference: tokens, token_logprobs, text_offset,
    and top_logprobs {text: logprob} of the k most likely (two ids of one text: the first kept)."""
    assert lp.tokens == [text(gen, t) for t in ids]
    np.testing.assert_allclose(lp.token_logprobs, [r[t] for r, t in zip(rows, ids)], rtol=0, atol=ATOL)
    assert lp.text_offset == np.cumsum([0] + [len(t) for t in lp.tokens[:-1]]).tolist()
    assert len(lp.top_logprobs) == len(ids)
    for got, row, chosen in zip(lp.top_logprobs, rows, ids):
        want = {}
        for t in top_ids(row, k):
            want.setdefault(text(gen, t), row[t])
        assert chosen == top_ids(row, 1)[0]  # greedy: the argmax, so among the k
        assert sorted(got) == sorted(want)
        np.testing.assert_allclose([got[t] for t in sorted(want)], [want[t] for t in sorted(want)],
                                   rtol=0, atol=ATOL)


def test_completions_top_logprobs_match_softmax(client, gen):
    """logprobs=5: each position's 5 most likely tokens and their log-probabilities are a CPU
    softmax of that step's logits (within 1e-4); streamed chunks carry the same, in order."""
    prompt = prompt_ids(1)
    ids, rows = reference(gen, prompt, 8)
    kw = dict(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=5,
              extra_body={"ignore_eos": True})
    r = client.completions.create(**kw)
    lp = r.choices[0].logprobs
    check_completion_logprobs(gen, lp, ids, rows, 5)
    chunks = list(client.completions.create(stream=True, **kw))
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    # the same entries; log-probabilities within float32's rounding (each request computes its own
    # logits: see test_chat_top_logprobs_match_softmax)
    assert [t for p in parts for t in p.tokens] == lp.tokens
    np.testing.assert_allclose([v for p in parts for v in p.token_logprobs], lp.token_logprobs, rtol=1e-5, atol=1e-6)
    streamed_top = [d for p in parts for d in p.top_logprobs]
    assert [sorted(d) for d in streamed_top] == [sorted(d) for d in lp.top_logprobs]
    np.testing.assert_allclose([d[t] for d in streamed_top for t in sorted(d)],
                               [d[t] for d in lp.top_logprobs for t in sorted(d)], rtol=1e-5, atol=1e-6)
    assert [o for p in parts for o in p.text_offset] == lp.text_offset
    # logprobs 0: the chosen tokens only, top_logprobs null (as before)
    zero = client.completions.create(**{**kw, "logprobs": 0}).choices[0].logprobs
    assert zero.top_logprobs is None
    np.testing.assert_allclose(zero.token_logprobs, lp.token_logprobs, rtol=1e-5, atol=1e-6)


def test_chat_top_logprobs_match_softmax(client, gen):
    """chat logprobs=true, top_logprobs=5: each content entry {token, logprob, bytes,
    top_logprobs: 5 x {token, logprob, bytes}} most likely first, against the softmax within 1e-4;
    the chosen token (greedy: the argmax) is the first alternative, with its log-probability;
    streamed deltas carry the same entries."""
    prompt = gen.tokenizer.encode(CHAT_TEXT)
    ids, rows = reference(gen, prompt, 8)
    kw = dict(model=MODEL, messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5,
              extra_body={"ignore_eos": True})
    r = client.chat.completions.create(**kw)
    assert r.usage.prompt_tokens == len(prompt)
    content = r.choices[0].logprobs.content
    assert len(content) == 8
    for e, t, row in zip(content, ids, rows):
        # bytes: the token's raw bytes (a byte token that is part of a character is one byte, not
        # its U+FFFD text's three)
        assert e.token == text(gen, t) and e.bytes == list(gen.tokenizer.token_bytes(t))
        assert abs(e.logprob - row[t]) <= ATOL
        want = top_ids(row, 5)
        assert [a.token for a in e.top_logprobs] == [text(gen, w) for w in want]
        assert [a.bytes for a in e.top_logprobs] == [list(gen.tokenizer.token_bytes(w)) for w in want]
        np.testing.assert_allclose([a.logprob for a in e.top_logprobs], row[want], rtol=0, atol=ATOL)
        assert want[0] == t and e.top_logprobs[0].logprob == e.logprob
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    # the same entries; the log-probabilities within float32's rounding, not bit for bit: each request
    # computes its own logits, and the second's prompt may come from the prefix cache the first
    # filled (a CI run saw -3.0160367 against -3.0160356)
    assert len(streamed) == len(content)
    for a, b in zip(streamed, content):
        assert (a.token, a.bytes) == (b.token, b.bytes)
        assert [(x.token, x.bytes) for x in a.top_logprobs] == [(x.token, x.bytes) for x in b.top_logprobs]
        np.testing.assert_allclose([a.logprob] + [x.logprob for x in a.top_logprobs],
                                   [b.logprob] + [x.logprob for x in b.top_logprobs], rtol=1e-5, atol=1e-6)
    # logprobs without top_logprobs: empty lists, as OpenAI
    plain = client.chat.completions.create(**{**kw, "top_logprobs": None}).choices[0].logprobs.content
    assert [e.top_logprobs for e in plain] == [[]] * 8
    np.testing.assert_allclose([e.logprob for e in plain], [e.logprob for e in content], rtol=1e-5, atol=1e-6)


def test_responses_logprobs_match_chat(client, gen):
    """/v1/responses with include ["message.output_text.logprobs"] and top_logprobs 5: the
    output_text part lists chat's entries {token, logprob, bytes, top_logprobs}, against the
    softmax within 1e-4; the streamed output_text.delta events carry the same entries in order,
    and output_text.done all of them; without the include and with top_logprobs 0 the list is
    empty, as OpenAI's."""
    prompt = gen.tokenizer.encode(CHAT_TEXT)  # input "Say something." is that user message
    ids, rows = reference(gen, prompt, 8)
    kw = dict(model=MODEL, input=CHAT[0]["content"], max_output_tokens=8, temperature=0, top_logprobs=5,
              include=["message.output_text.logprobs"])
    r = client.responses.create(**kw)
    assert r.usage.input_tokens == len(prompt) and r.top_logprobs == 5
    entries = r.output[0].content[0].logprobs
    n = r.usage.output_tokens
    assert 1 <= n <= 8 and len(entries) == n
    for e, t, row in zip(entries, ids, rows):
        assert e.token == text(gen, t) and abs(e.logprob - row[t]) <= ATOL
        want = top_ids(row, 5)
        assert [a.token for a in e.top_logprobs] == [text(gen, w) for w in want]
        np.testing.assert_allclose([a.logprob for a in e.top_logprobs], row[want], rtol=0, atol=ATOL)
    events = list(client.responses.create(stream=True, **kw))
    streamed = [e for ev in events if ev.type == "response.output_text.delta" for e in ev.logprobs]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in entries]
    done = [ev for ev in events if ev.type == "response.output_text.done"]
    assert len(done) == 1 and [e.model_dump() for e in done[0].logprobs] == [e.model_dump() for e in entries]
    plain = client.responses.create(model=MODEL, input=CHAT[0]["content"], max_output_tokens=8, temperature=0)
    assert plain.output[0].content[0].logprobs == [] and plain.output_text == r.output_text


def test_sampled_alternatives(client):
    """Sampled (temperature 1, seeded): completions logprobs=1 lists the most likely token and, as
    OpenAI documents, the chosen one beside it when it is another (with its token_logprob); under
    top_k=2 the alternatives past the 2 kept have probability 0, reported as vLLM does (-9999.0),
    and the kept two hold the whole mass."""
    kw = dict(model=MODEL, prompt=prompt_ids(4), max_tokens=12, temperature=1.0, seed=7,
              extra_body={"ignore_eos": True})
    lp = client.completions.create(logprobs=1, **kw).choices[0].logprobs
    for top, token, value in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs):
        # a byte token that is part of a character is "\ufffd" alone, the key of several ids
        assert token in top and (top[token] == value or token == "\ufffd") and 1 <= len(top) <= 2
    assert any(len(top) == 2 for top in lp.top_logprobs)  # some draws are not the argmax
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=1.0, seed=3,
                                          logprobs=True, top_logprobs=5,
                                          extra_body={"ignore_eos": True, "top_k": 2})
    for e in chat.choices[0].logprobs.content:
        values = [a.logprob for a in e.top_logprobs]
        assert values[2:] == [-9999.0] * 3 and e.token in [a.token for a in e.top_logprobs[:2]]
        assert abs(np.logaddexp.reduce(values[:2])) < 1e-5


def test_logit_bias_forces_and_bans(client, gen):
    """Greedy: +100 on an id makes it every token (the tiny model's logits span far less than
    100); -100 on the greedy first choice gives the runner-up instead; the reported
    log-probabilities are those of the biased logits."""
    prompt = prompt_ids(2)
    ids, rows = reference(gen, prompt, 6)
    forced = next(t for t in range(100, VOCAB) if text(gen, t).strip().isalpha() and t not in ids)
    kw = dict(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
              extra_body={"ignore_eos": True})
    r = client.completions.create(logit_bias={str(forced): 100}, **kw)
    want_ids, want_rows = reference(gen, prompt, 6, bias={forced: 100})
    assert want_ids == [forced] * 6 and r.choices[0].text == text(gen, forced) * 6
    check_completion_logprobs(gen, r.choices[0].logprobs, want_ids, want_rows, 3)
    banned = client.completions.create(logit_bias={str(ids[0]): -100}, **kw)
    want_ids, want_rows = reference(gen, prompt, 6, bias={ids[0]: -100})
    assert want_ids[0] == top_ids(rows[0], 2)[1] and ids[0] not in want_ids
    check_completion_logprobs(gen, banned.choices[0].logprobs, want_ids, want_rows, 3)
    # the chat route takes it too
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, temperature=0,
                                          logit_bias={str(forced): 100}, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == text(gen, forced) * 3


@pytest.mark.parametrize("presence,frequency", [(0.0, 1.5), (2.0, 0.0), (0.5, -2.0)])
def test_penalties_follow_their_definition(client, gen, presence, frequency):
    """presence/frequency penalties on a greedy answer that repeats tokens: the ids are the argmax
    of logit - frequency * count - presence * [count > 0] over the ids generated so far (not the
    prompt), and the log-probabilities (5 alternatives) are those of the penalised logits. The
    penalised answer differs from the plain one (a positive penalty breaks a repetition, a
    negative frequency penalty makes one), so the comparison is not of two unpenalised runs."""
    prompt = prompt_ids(3)
    plain, _ = reference(gen, prompt, 16)
    assert len(set(plain)) < len(plain)  # the plain answer repeats
    want_ids, want_rows = reference(gen, prompt, 16, presence=presence, frequency=frequency)
    assert want_ids != plain
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, logprobs=5,
                                  presence_penalty=presence, frequency_penalty=frequency,
                                  extra_body={"ignore_eos": True})
    check_completion_logprobs(gen, r.choices[0].logprobs, want_ids, want_rows, 5)


@pytest.mark.parametrize("route,body,param,says", [
    ("completions", {"presence_penalty": 2.5}, "presence_penalty", "[-2, 2]"),
    ("completions", {"frequency_penalty": -2.01}, "frequency_penalty", "[-2, 2]"),
    ("chat/completions", {"presence_penalty": "1"}, "presence_penalty", "a number"),
    ("completions", {"logit_bias": {"abc": 1}}, "logit_bias", "'abc'"),
    ("completions", {"logit_bias": {"-1": 1}}, "logit_bias", "'-1'"),
    ("completions", {"logit_bias": {"1.5": 1}}, "logit_bias", "'1.5'"),
    ("completions", {"logit_bias": {"5": 101}}, "logit_bias", "'5'"),
    ("completions", {"logit_bias": {"5": "x"}}, "logit_bias", "'5'"),
    ("chat/completions", {"logit_bias": {str(VOCAB): 1}}, "logit_bias", "'%d' is outside the vocabulary" % VOCAB),
    ("completions", {"logit_bias": {"99999999999": 1}}, "logit_bias", "'99999999999'"),
    ("completions", {"logit_bias": [1]}, "logit_bias", "an object"),
    ("completions", {"logit_bias": {"7": 1, "007": 2}}, "logit_bias", "'007'"),
    ("completions", {"logprobs": 21}, "logprobs", "[0, 20]"),
    ("completions", {"logprobs": True}, "logprobs", "whole number"),
    ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
    ("chat/completions", {"top_logprobs": 2}, "top_logprobs", "'logprobs': true"),
    ("responses", {"top_logprobs": 21}, "top_logprobs", "[0, 20]"),
    ("responses", {"include": ["file_search_call.results"]}, "include", "message.output_text.logprobs"),
    ("responses", {"include": "message.output_text.logprobs"}, "include", "an array"),
])
def test_refusals_name_the_field(server, route, body, param, says):
    base = {"completions": {"prompt": "Hi"}, "chat/completions": {"messages": CHAT},
            "responses": {"input": "Hi"}}[route]
    status, _, raw = server.request("POST", "/v1/" + route, {"model": MODEL, "max_tokens": 2, **base, **body}
                                    if route != "responses" else {"model": MODEL, **base, **body})
    err = json.loads(raw)["error"]
    assert status == 400 and err["param"] == param and says in err["message"], err
