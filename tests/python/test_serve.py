"""nopad serve through the official openai client: completions and chat, plain and streamed, and
embeddings give what the in-process engine and encoder give for the same prompt and seed; the
chat prompt equals the model's own Jinja template rendered by jinja2; the extra sampling fields
(min_tokens, stop, top_k, ...) and the refusals (n over 16, top logprobs, unknown fields) as 400s;
then a load test (32 clients, 500 requests of random lengths, some streamed, some abandoned early:
every answer complete with its exact token count, none lost or doubled, /metrics agreeing with the
clients' counts, no KV block held at the end) and a bounded queue (--max-queue 4: 429s with
Retry-After, nothing else fails).

Needs the default decoder (NOPAD_SMOLLM2_GGUF) and encoder (NOPAD_MINILM_DIR), the CLI built with
libmicrohttpd (NOPAD_CLI), and the openai package; skipped without them. Loopback only."""
import http.client
import json
import random
import threading
import time

import numpy as np
import pytest

import nopad
from serve_fixtures import (DEC_NAME, ENC_NAME, GGUF, KEY, MINILM, Server, client,  # noqa: F401
                            pytestmark)

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server():
    s = Server("--model", GGUF, "--embedding-model", MINILM, "--api-key", KEY, "--threads", "2",
               "--weights", "f32")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def engine():
    # both dequantised: with the weights kept quantized, each row's activations are rounded to
    # int8 and the server's shared prefixes (computed in other steps) can round a value the
    # other way (docs/decoder.md, "Quantized weights on the CPU")
    with nopad.Engine(GGUF, threads=2, weights="f32") as eng:
        yield eng


def _engine_text(engine, prompt, **kw):
    r = engine.submit(prompt, **kw)
    text = r.result()
    out = text, r.stats()["generated_tokens"], r.finish_reason
    r.close()
    return out


# ---- completions and chat against the in-process engine ----------------------------------------

PROMPTS = ["Hello, my name is", "The capital of France is", "def fibonacci(n):\n"]


@pytest.mark.parametrize("sampling", [dict(temperature=0.0),
                                      dict(temperature=0.8, top_p=0.9, seed=7),
                                      dict(temperature=1.2, top_k=20, seed=3)])
def test_completion_equals_engine(client, engine, sampling):
    kw = dict(sampling)
    if "top_k" in kw:  # not an OpenAI field: the client sends it in extra_body
        kw["extra_body"] = {"top_k": kw.pop("top_k")}
    for prompt in PROMPTS:
        want, n, finish = _engine_text(engine, prompt, max_tokens=20, **sampling)
        r = client.completions.create(model=DEC_NAME, prompt=prompt, max_tokens=20, **kw)
        assert r.choices[0].text == want
        assert r.choices[0].finish_reason == finish
        assert r.usage.completion_tokens == n
        assert r.usage.total_tokens == r.usage.prompt_tokens + n
        chunks = list(client.completions.create(model=DEC_NAME, prompt=prompt, max_tokens=20,
                                                stream=True, **kw))
        assert "".join(c.choices[0].text for c in chunks) == want
        assert chunks[-1].choices[0].finish_reason == finish


def _jinja_prompt(messages):
    """The model's own chat template (GGUF tokenizer.chat_template) rendered as transformers does."""
    jinja2 = pytest.importorskip("jinja2")
    import ctypes
    from nopad import _native
    lib = _native.library()
    m = ctypes.c_void_p()
    assert lib.nopad_model_load(GGUF.encode(), None, ctypes.byref(m)) == 0
    try:
        template = lib.nopad_model_chat_template(m).decode()
    finally:
        lib.nopad_model_free(m)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True)


CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke."}],
]


@pytest.mark.parametrize("messages", CHATS)
def test_chat_equals_engine(client, engine, messages):
    prompt = _jinja_prompt(messages)
    want, n, finish = _engine_text(engine, prompt, max_tokens=24, temperature=0.0)
    r = client.chat.completions.create(model=DEC_NAME, messages=messages, max_tokens=24,
                                       temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want
    assert r.choices[0].finish_reason == finish
    assert r.usage.completion_tokens == n
    stream = client.chat.completions.create(model=DEC_NAME, messages=messages, max_tokens=24,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == finish
    assert chunks[-1].usage.completion_tokens == n and not chunks[-1].choices


def test_chat_content_parts_and_developer_role(client):
    a = client.chat.completions.create(
        model=DEC_NAME, max_tokens=8, temperature=0,
        messages=[{"role": "developer", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "Say "},
                                               {"type": "text", "text": "hi"}]}])
    b = client.chat.completions.create(
        model=DEC_NAME, max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}])
    assert a.choices[0].message.content == b.choices[0].message.content


def test_sampling_extras(client, engine):
    # min_tokens: the end of sequence is ignored until then (done in the server)
    question = [{"role": "user", "content": "What is 2+2?"}]
    short = client.chat.completions.create(model=DEC_NAME, max_tokens=40, temperature=0,
                                           messages=question)
    assert short.usage.completion_tokens < 20 and short.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model=DEC_NAME, max_tokens=40, temperature=0,
                                       messages=question, extra_body={"min_tokens": 20})
    assert r.usage.completion_tokens >= 20
    assert r.choices[0].message.content.startswith(short.choices[0].message.content)
    # ignore_eos, stop strings, repetition_penalty, min_p, top_k: as the engine
    kw = dict(max_tokens=24, temperature=0.7, seed=11, top_k=30, min_p=0.05,
              repetition_penalty=1.3, ignore_eos=True)
    want, n, _ = _engine_text(engine, PROMPTS[0], **kw)
    r = client.completions.create(model=DEC_NAME, prompt=PROMPTS[0], max_tokens=24, temperature=0.7,
                                  seed=11, extra_body=dict(top_k=30, min_p=0.05,
                                                           repetition_penalty=1.3, ignore_eos=True))
    assert r.choices[0].text == want and r.usage.completion_tokens == n == 24
    want, n, finish = _engine_text(engine, PROMPTS[0], max_tokens=30, temperature=0.0, stop=[","])
    r = client.completions.create(model=DEC_NAME, prompt=PROMPTS[0], max_tokens=30, temperature=0,
                                  stop=[","])
    assert r.choices[0].text == want and "," not in want and r.choices[0].finish_reason == "stop"
    # token ids as the prompt
    ids = nopad.Generator(GGUF).tokenizer.encode(PROMPTS[1]) if hasattr(nopad.Generator, "tokenizer") else None
    if ids is not None:
        a = client.completions.create(model=DEC_NAME, prompt=list(ids), max_tokens=8, temperature=0)
        b = client.completions.create(model=DEC_NAME, prompt=PROMPTS[1], max_tokens=8, temperature=0)
        assert a.choices[0].text == b.choices[0].text


def test_logprobs_equal_engine(client, engine):
    """Completions (logprobs=0) and chat (logprobs=true), plain and streamed: one log-probability
    per generated token, equal to the in-process engine's for the same request (CPU, the same
    steps: within 1e-5), each token's text given, no alternatives unless asked (test_serve_logprobs.py asks)."""
    prompt = PROMPTS[1]
    r = engine.submit(prompt, max_tokens=12, logprobs=True, ignore_eos=True)
    r.result()
    want = r.logprobs()
    r.close()
    c = client.completions.create(model=DEC_NAME, prompt=prompt, max_tokens=12, logprobs=0,
                                  temperature=0, extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    assert len(lp.token_logprobs) == c.usage.completion_tokens == 12
    np.testing.assert_allclose(lp.token_logprobs, want, rtol=0, atol=1e-5)
    assert "".join(lp.tokens).strip() and lp.text_offset[0] == 0
    chunks = list(client.completions.create(model=DEC_NAME, prompt=prompt, max_tokens=12, logprobs=0,
                                            temperature=0, stream=True, extra_body={"ignore_eos": True}))
    streamed = [v for ch in chunks if ch.choices and ch.choices[0].logprobs
                for v in ch.choices[0].logprobs.token_logprobs]
    np.testing.assert_allclose(streamed, want, rtol=0, atol=1e-5)
    msgs = [{"role": "user", "content": "Name a colour."}]
    chat = client.chat.completions.create(model=DEC_NAME, messages=msgs, max_tokens=8, logprobs=True,
                                          temperature=0)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for e in content:
        assert e.logprob <= 0.0 and e.top_logprobs == []
        try:
            assert bytes(e.bytes).decode("utf-8") == e.token
        except UnicodeDecodeError:  # a token that is part of a character: its text is U+FFFD
            assert "\ufffd" in e.token


@pytest.mark.parametrize("extra,param", [
    (dict(n=17), "n"), (dict(logprobs=21), "logprobs"), (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(extra_body={"mirostat": 1}), "mirostat"), (dict(extra_body={"top_k": "x"}), "top_k"),
    (dict(temperature=-1), "temperature"), (dict(max_tokens=100000), "max_tokens"),
])
def test_refusals_are_400(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=DEC_NAME, prompt="Hi", **{"max_tokens": 4, **extra})
    assert e.value.status_code == 400
    assert e.value.body["param"] == param and e.value.body["message"]


def test_wrong_model_and_key(server, client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="Hi", max_tokens=2)
    bad = openai.OpenAI(base_url=server.url() + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert sorted(m.id for m in client.models.list().data) == sorted([DEC_NAME, ENC_NAME])


# ---- embeddings --------------------------------------------------------------------------------

TEXTS = ["A man is eating food.", "The quick brown fox jumps over the lazy dog.", "hello",
         "Padding-free inference packs every sequence back to back."]


def test_embeddings_equal_encoder(server, client):
    with nopad.Encoder(MINILM) as enc:
        want = enc.encode(TEXTS)
    r = client.embeddings.create(model=ENC_NAME, input=TEXTS)  # the client asks for base64
    got = np.array([d.embedding for d in r.data], dtype=np.float32)
    assert [d.index for d in r.data] == list(range(len(TEXTS)))
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert r.usage.prompt_tokens == r.usage.total_tokens > len(TEXTS)
    r = client.embeddings.create(model=ENC_NAME, input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(r.data[0].embedding, want[0], atol=2e-5)
    # TEI's /embed, and Matryoshka dimensions (cut, then normalised)
    status, _, body = server.request("POST", "/embed", {"inputs": TEXTS})
    assert status == 200
    np.testing.assert_allclose(np.array(json.loads(body), dtype=np.float32), want, atol=2e-5)
    r = client.embeddings.create(model=ENC_NAME, input=TEXTS[1], dimensions=64, encoding_format="float")
    cut = want[1][:64] / np.linalg.norm(want[1][:64])
    np.testing.assert_allclose(r.data[0].embedding, cut, atol=2e-5)


def test_embeddings_concurrent_share_batches(server, client):
    with nopad.Encoder(MINILM) as enc:
        want = enc.encode(TEXTS)
    before = server.metrics()["nopad_embedding_batches_total"]
    results, errors = [None] * 32, []

    def one(i):
        try:
            results[i] = client.embeddings.create(model=ENC_NAME, input=TEXTS[i % 4],
                                                  encoding_format="float").data[0].embedding
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, got in enumerate(results):
        np.testing.assert_allclose(got, want[i % 4], atol=2e-5)
    batches = server.metrics()["nopad_embedding_batches_total"] - before
    assert 1 <= batches <= 32


# ---- load ---------------------------------------------------------------------------------------

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex bold jumping zebras".split()


def _one_request(port, job):
    """Sends one request; returns (outcome, completion_tokens, prompt_tokens, id)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = {"model": DEC_NAME, "max_tokens": job["max_tokens"], "temperature": 0,
            "ignore_eos": True, "stream": job["stream"]}
    if job["chat"]:
        body["messages"] = [{"role": "user", "content": job["prompt"]}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = job["prompt"]
        path = "/v1/completions"
    if job["stream"]:
        body["stream_options"] = {"include_usage": True}
    conn.request("POST", path, body=json.dumps(body),
                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        r.read()
        conn.close()
        return ("status", r.status, r.getheader("Retry-After")), 0, 0, None
    if not job["stream"]:
        d = json.loads(r.read())
        conn.close()
        return "ok", d["usage"]["completion_tokens"], d["usage"]["prompt_tokens"], d["id"]
    usage, ids, done, finish = None, set(), False, None
    while True:
        line = r.fp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        if job["abandon"]:  # the first event: leave
            conn.sock.close()
            conn.close()
            return "abandoned", 0, 0, None
        if line == b"data: [DONE]":
            done = True
            break
        d = json.loads(line[6:])
        ids.add(d["id"])
        if d.get("usage"):
            usage = d["usage"]
        for c in d["choices"]:
            finish = c.get("finish_reason") or finish
    conn.close()
    assert done and len(ids) == 1 and finish == "length", (done, ids, finish)
    return "ok", usage["completion_tokens"], usage["prompt_tokens"], ids.pop()


def _run_load(port, jobs, n_clients):
    results = [None] * len(jobs)
    next_job = iter(range(len(jobs)))
    lock = threading.Lock()

    def client():
        while True:
            with lock:
                i = next(next_job, None)
            if i is None:
                return
            try:
                results[i] = _one_request(port, jobs[i])
            except Exception as e:  # noqa: BLE001
                results[i] = ("error", repr(e)), 0, 0, None

    threads = [threading.Thread(target=client) for _ in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _jobs(n, seed, abandon_share=0.06, stream_share=0.3):
    rng = random.Random(seed)
    jobs = []
    for _ in range(n):
        stream = rng.random() < stream_share
        abandon = stream and rng.random() < abandon_share / stream_share
        jobs.append(dict(prompt=" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 24))),
                         max_tokens=200 if abandon else rng.randint(1, 8), stream=stream,
                         abandon=abandon, chat=rng.random() < 0.5))
    return jobs


def _settle(server, timeout=60):
    """Waits until nothing runs or waits (abandoned requests are cancelled at their next write)."""
    deadline = time.time() + timeout
    while True:
        m = server.metrics()
        if m["nopad_requests_running"] == 0 and m["nopad_requests_waiting"] == 0 \
                and m["nopad_http_inflight"] <= 1:
            return m
        assert time.time() < deadline, m
        time.sleep(0.1)


def _count(m, status, routes=("/v1/completions", "/v1/chat/completions")):
    return sum(m.get('nopad_requests_total{route="%s",status="%d"}' % (r, status), 0) for r in routes)


def test_load_32_clients_500_requests():
    s = Server("--model", GGUF, "--api-key", KEY, "--threads", "2", "--kv-tokens", "16384")
    try:
        t0 = time.time()
        jobs = _jobs(500, seed=1)
        results = _run_load(s.port, jobs, 32)
        elapsed = time.time() - t0
        outcomes = [r[0] for r in results]
        errors = [r for r in results if r[0] not in ("ok", "abandoned")]
        assert not errors, errors[:5]
        ok = [(j, r) for j, r in zip(jobs, results) if r[0] == "ok"]
        abandoned = outcomes.count("abandoned")
        assert abandoned == sum(j["abandon"] for j in jobs) > 0
        for j, r in ok:  # the exact count: ignore_eos, so max_tokens each
            assert r[1] == j["max_tokens"], (j, r)
        ids = [r[3] for _, r in ok]
        assert len(set(ids)) == len(ids) == len(jobs) - abandoned  # none lost, none doubled
        m = _settle(s)
        assert _count(m, 200) == len(ok)
        assert _count(m, 499) == abandoned
        assert m["nopad_requests_cancelled_total"] == abandoned
        assert m["nopad_completion_tokens_total"] == sum(r[1] for _, r in ok)
        assert m["nopad_prompt_tokens_total"] == sum(r[2] for _, r in ok)
        assert m["nopad_kv_blocks_used"] == 0  # no leaked block
        assert m["nopad_time_to_first_token_seconds_count"] >= len(ok)
        assert m["nopad_step_seconds_count"] > 0
        print("load: 500 requests, 32 clients, %.1f s" % elapsed)
    finally:
        s.stop()


def test_bounded_queue_429():
    s = Server("--model", GGUF, "--api-key", KEY, "--threads", "2", "--max-queue", "4",
               "--max-running", "2")
    try:
        jobs = _jobs(96, seed=2, abandon_share=0.0)
        results = _run_load(s.port, jobs, 32)
        refused = [r for r in results if r[0] != "ok"]
        assert refused, "no 429 with --max-queue 4 and 32 clients"
        assert all(r[0] == ("status", 429, "1") for r in refused), refused[:5]
        for j, r in zip(jobs, results):
            if r[0] == "ok":
                assert r[1] == j["max_tokens"]
        m = _settle(s)
        assert _count(m, 429) == len(refused)
        assert _count(m, 200) == len(jobs) - len(refused)
        assert m["nopad_kv_blocks_used"] == 0
    finally:
        s.stop()
