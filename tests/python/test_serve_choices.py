"""nopad serve's n > 1 through the official openai client: n engine requests of one prompt, with
seeds seed, seed + 1, ...: choice i equals the single request with seed + i, n=3 with a seed is
reproducible, greedy choices are equal (as vLLM's), usage counts the prompt once and sums the
completions; streamed, each choice's chunks carry its index (a role chunk and a finish_reason
each) and add up to the plain answer's choices, one usage chunk and one [DONE] at the end.
n above 16, n below 1 and best_of are 400s. Under load (16 clients, requests of 1 to 4 choices,
streams left early) every answer is whole and no KV block stays held.

The prompt runs once before the comparisons: every request after it finds the same blocks in the
engine's prefix cache, so requests compared with each other compute alike.

Needs what tests/python/test_serve.py needs; skipped without it. Loopback only."""
import http.client
import json
import random
import threading
import time

import pytest

from serve_fixtures import DEC_NAME, GGUF, KEY, Server, pytestmark, server  # noqa: F401  (the skip condition)

openai = pytest.importorskip("openai")

PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(base_url=server.url() + "/v1", api_key=KEY, max_retries=0)
    c.completions.create(model=DEC_NAME, prompt=PROMPT, max_tokens=1)  # the prompts' blocks cached
    c.chat.completions.create(model=DEC_NAME, messages=CHAT, max_tokens=1)
    return c


def test_n_seeded_reproducible_and_per_seed(client):
    kw = dict(model=DEC_NAME, prompt=PROMPT, max_tokens=10, temperature=0.8)
    a = client.completions.create(n=3, seed=5, **kw)
    b = client.completions.create(n=3, seed=5, **kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    texts = [c.text for c in a.choices]
    assert texts == [c.text for c in b.choices]
    assert len(set(texts)) > 1  # three seeds, not three copies
    singles = [client.completions.create(seed=5 + i, **kw) for i in range(3)]
    assert texts == [s.choices[0].text for s in singles]
    assert [c.finish_reason for c in a.choices] == [s.choices[0].finish_reason for s in singles]
    assert a.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert a.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert a.usage.total_tokens == a.usage.prompt_tokens + a.usage.completion_tokens


def test_n_greedy_choices_equal(client):
    r = client.chat.completions.create(model=DEC_NAME, messages=CHAT, max_tokens=8, temperature=0, n=4)
    assert len(r.choices) == 4 and len({c.message.content for c in r.choices}) == 1
    assert [c.index for c in r.choices] == [0, 1, 2, 3]


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_n_streamed(server, client, route):
    kw = dict(model=DEC_NAME, max_tokens=8, temperature=0.8, seed=11, n=3)
    if route == "chat":
        create, kw["messages"] = client.chat.completions.create, CHAT
    else:
        create, kw["prompt"] = client.completions.create, PROMPT
    plain = create(**kw)
    chunks = list(create(stream=True, stream_options={"include_usage": True}, **kw))
    texts, finishes, roles = {}, {}, {}
    for ch in chunks[:-1]:
        assert len(ch.choices) == 1
        c = ch.choices[0]
        if route == "chat":
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.delta.role:
                roles[c.index] = roles.get(c.index, 0) + 1
        else:
            texts[c.index] = texts.get(c.index, "") + c.text
        if c.finish_reason:
            finishes[c.index] = c.finish_reason
    want = [c.message.content if route == "chat" else c.text for c in plain.choices]
    assert [texts[i] for i in range(3)] == want
    assert [finishes[i] for i in range(3)] == [c.finish_reason for c in plain.choices]
    if route == "chat":
        assert roles == {0: 1, 1: 1, 2: 1}
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    body = {k: v for k, v in kw.items()}
    body["stream"] = True
    status, _, raw = server.request("POST", path, body)
    assert status == 200 and raw.count(b"data: [DONE]") == 1 and raw.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("extra,param", [(dict(n=17), "n"), (dict(n=0), "n"),
                                         (dict(best_of=2, n=2), "best_of")])
def test_n_refusals(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=DEC_NAME, prompt=PROMPT, max_tokens=2, **extra)
    assert e.value.body["param"] == param


def _n_request(port, job):
    """One request of job["n"] choices; returns (outcome, completion_tokens, prompt_tokens)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = {"model": DEC_NAME, "max_tokens": job["max_tokens"], "temperature": 0.9,
            "seed": job["seed"], "ignore_eos": True, "stream": job["stream"], "n": job["n"],
            "messages": [{"role": "user", "content": job["prompt"]}]}
    if job["stream"]:
        body["stream_options"] = {"include_usage": True}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, (r.status, r.read()[:300])
    if not job["stream"]:
        d = json.loads(r.read())
        conn.close()
        assert sorted(c["index"] for c in d["choices"]) == list(range(job["n"]))
        assert all(c["finish_reason"] == "length" for c in d["choices"])
        return "ok", d["usage"]["completion_tokens"], d["usage"]["prompt_tokens"]
    usage, finished, done = None, set(), False
    for line in iter(r.fp.readline, b""):
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        if job["abandon"]:  # the first event: leave, with every choice running
            conn.sock.close()
            conn.close()
            return "abandoned", 0, 0
        if line == b"data: [DONE]":
            done = True
            break
        d = json.loads(line[6:])
        usage = d.get("usage") or usage
        finished |= {c["index"] for c in d["choices"] if c.get("finish_reason")}
    conn.close()
    assert done and finished == set(range(job["n"])), (done, finished)
    return "ok", usage["completion_tokens"], usage["prompt_tokens"]


def test_n_under_load_no_block_held():
    """16 clients, 64 requests of 1 to 4 choices, half streamed, a fifth of the streams left after
    their first event: every answer has all its choices and n * max_tokens tokens (ignore_eos),
    and at the end no KV block is held and /metrics counts what the clients counted."""
    rng = random.Random(3)
    jobs = []
    for _ in range(64):
        stream = rng.random() < 0.5
        abandon = stream and rng.random() < 0.2
        words = [rng.choice(["red", "sky", "blue", "cat", "sea"]) for _ in range(rng.randint(1, 12))]
        jobs.append(dict(prompt=" ".join(words), n=rng.randint(1, 4),
                         max_tokens=200 if abandon else rng.randint(1, 6), stream=stream,
                         abandon=abandon, seed=rng.randint(0, 1000)))
    s = Server("--model", GGUF, "--api-key", KEY, "--threads", "2", "--kv-tokens", "16384")
    try:
        results = [None] * len(jobs)
        todo = iter(range(len(jobs)))
        lock = threading.Lock()

        def client():
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                try:
                    results[i] = _n_request(s.port, jobs[i])
                except Exception as e:  # noqa: BLE001
                    results[i] = ("error", repr(e)), 0, 0

        threads = [threading.Thread(target=client) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        errors = [r for r in results if r[0] not in ("ok", "abandoned")]
        assert not errors, errors[:3]
        ok = [(j, r) for j, r in zip(jobs, results) if r[0] == "ok"]
        abandoned = sum(j["abandon"] for j in jobs)
        assert abandoned > 0 and len(ok) == len(jobs) - abandoned
        for j, r in ok:
            assert r[1] == j["n"] * j["max_tokens"], (j, r)
        deadline = time.time() + 60
        while True:  # abandoned streams are cancelled at their next write
            m = s.metrics()
            if m["nopad_requests_running"] == 0 and m["nopad_requests_waiting"] == 0:
                break
            assert time.time() < deadline, m
            time.sleep(0.1)
        assert m["nopad_kv_blocks_used"] == 0
        assert m["nopad_requests_cancelled_total"] == abandoned
        assert m["nopad_completion_tokens_total"] == sum(r[1] for _, r in ok)
        assert m["nopad_prompt_tokens_total"] == sum(r[2] for _, r in ok)
    finally:
        s.stop()
