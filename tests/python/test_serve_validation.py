"""nopad serve's request validation where cJSON alone would let a request through wrong: a NUL in
any text field (cJSON ends its strings there: "Par\\u0000xyz" would act as "Par") and invalid
UTF-8 are a 400 naming the field, with the byte offset inside that field's own text; a body with
more after its JSON object is invalid JSON at that byte; sampling numbers are checked as the
32-bit floats the engine samples with (top_p 1e-300 is 0 there), so the engine never refuses what
the server accepted.

Needs what tests/python/test_serve.py needs (the default decoder and encoder, the CLI built with
libmicrohttpd); skipped without them. Loopback only."""
import json

import pytest

from serve_fixtures import GGUF, KEY, MINILM, Server, pytestmark  # noqa: F401  (the skip condition)


@pytest.fixture(scope="module")
def server():
    s = Server("--model", GGUF, "--embedding-model", MINILM, "--api-key", KEY, "--threads", "2")
    yield s
    s.stop()


def _error(server, path, body, status=400):
    """POSTs body (a dict, or the raw bytes); returns the error object of the expected status."""
    got, _, raw = server.request("POST", path, body)
    assert got == status, (got, raw[:400])
    e = json.loads(raw)["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"], e
    return e


CHAT = "/v1/chat/completions"
USER = {"role": "user", "content": "Hi"}

# (route, body, the field the 400 names); every text the server passes on, with a NUL in it
NUL_CASES = [
    ("/v1/completions", {"prompt": "Par\x00xyz", "max_tokens": 1}, "prompt"),
    ("/v1/completions", {"prompt": ["Par\x00xyz"], "max_tokens": 1}, "prompt[0]"),
    ("/v1/completions", {"prompt": "Hi", "stop": "Par\x00xyz", "max_tokens": 1}, "stop"),
    ("/v1/completions", {"prompt": "Hi", "stop": ["a", "Par\x00xyz"], "max_tokens": 1}, "stop[1]"),
    (CHAT, {"messages": [USER, {"role": "user", "content": "a\x00b"}], "max_tokens": 1},
     "messages[1].content"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                      {"type": "text", "text": "b\x00"}]}],
            "max_tokens": 1}, "messages[0].content[1].text"),
    (CHAT, {"messages": [USER], "stop": ["\x00"], "max_tokens": 1}, "stop[0]"),
    ("/v1/embeddings", {"input": ["a", "b", "c", "d\x00e"]}, "input[3]"),
    ("/v1/embeddings", {"input": "a\x00"}, "input"),
    ("/embed", {"inputs": ["a", "\x00b"]}, "inputs[1]"),
    ("/predict", {"inputs": [["a", "b\x00"]]}, "inputs[0][1]"),
    ("/rerank", {"query": "q\x00", "texts": ["a"]}, "query"),
    ("/rerank", {"query": "q", "texts": ["a", "b\x00"]}, "texts[1]"),
]


@pytest.mark.parametrize("path,body,param", NUL_CASES, ids=[c[2] + " " + c[0] for c in NUL_CASES])
def test_nul_is_refused_naming_the_field(server, path, body, param):
    e = _error(server, path, body)
    assert e["param"] == param and e["code"] == "invalid_value", e
    assert "NUL" in e["message"], e


def test_raw_nul_bad_escape_and_field_name_with_nul(server):
    e = _error(server, "/v1/completions", b'{"prompt": "Par\x00xyz", "max_tokens": 1}')
    assert e["param"] == "prompt" and "NUL character at byte 3" in e["message"], e
    # cJSON reads a \u escape with a non-hex digit as a NUL
    e = _error(server, "/v1/completions", b'{"prompt": "Hi", "stop": ["Par\\uZZZZ"], "max_tokens": 1}')
    assert e["param"] == "stop[0]" and "invalid \\u escape at byte 3" in e["message"], e
    # "prompt\u0000x" would read as "prompt"
    e = _error(server, "/v1/completions", b'{"prompt\\u0000x": "Hi", "max_tokens": 1}')
    assert e["code"] == "invalid_value" and "field name" in e["message"], e


@pytest.mark.parametrize("tail", [b" garbage", b'{"prompt": "Bye"}', b"\x00", b"]"])
def test_body_with_more_after_the_object(server, tail):
    body = b'{"prompt": "Hi", "max_tokens": 1}'
    e = _error(server, "/v1/completions", body + tail)
    assert e["code"] == "invalid_json" and e["param"] is None, e
    assert "at byte %d" % (len(body) + len(tail) - len(tail.lstrip())) in e["message"], e
    # white space after the object is fine
    status, _, raw = server.request("POST", "/v1/completions", body + b" \r\n\t")
    assert status == 200, raw[:400]


def test_invalid_json_names_the_byte(server):
    e = _error(server, "/v1/embeddings", b'{"input": ["a",, "b"]}')
    assert e["code"] == "invalid_json" and "at byte 15" in e["message"], e


# values inside the JSON range that a 32-bit float turns into one the engine refuses, and a
# neighbour that stays valid as a float (temperature 1e-50 becomes 0: greedy, which it means)
@pytest.mark.parametrize("name,refused,taken", [
    ("top_p", 1e-300, 1e-30), ("min_p", 0.9999999999, 0.99999), ("repetition_penalty", 1e-50, 1e-30),
])
def test_sampling_numbers_checked_as_floats(server, name, refused, taken):
    for path, base in (("/v1/completions", {"prompt": "Hi"}), (CHAT, {"messages": [USER]})):
        e = _error(server, path, {**base, "max_tokens": 1, name: refused})
        assert e["param"] == name and e["code"] == "invalid_value", e
        assert "32-bit float" in e["message"], e
    status, _, raw = server.request("POST", "/v1/completions",
                                    {"prompt": "Hi", "max_tokens": 1, "temperature": 1e-50, name: taken})
    assert status == 200, raw[:400]


# (route, raw body, the field, the offset of the bad byte inside that field's decoded text)
UTF8_CASES = [
    ("/v1/completions", b'{"prompt": "ab\xff", "max_tokens": 1}', "prompt", 2),
    (CHAT, b'{"messages": [{"role": "system", "content": "Be brief."}, '
           b'{"role": "user", "content": "h\\u00e9llo \\n\xc0\xaf"}], "max_tokens": 1}',
     "messages[1].content", 8),
    ("/v1/completions", b'{"prompt": "Hi", "stop": ["\xed\xa0\x80"], "max_tokens": 1}', "stop[0]", 0),
    ("/v1/embeddings", b'{"input": ["a", "b", "\xe2\x82"]}', "input[2]", 0),
    ("/rerank", b'{"query": "q", "texts": ["ok", "\xf4\x90\x80\x80"]}', "texts[1]", 0),
]


@pytest.mark.parametrize("path,body,param,offset", UTF8_CASES, ids=[c[2] for c in UTF8_CASES])
def test_invalid_utf8_names_the_field_and_its_offset(server, path, body, param, offset):
    e = _error(server, path, body)
    assert e["param"] == param and e["code"] == "invalid_value", e
    assert "not valid UTF-8 at byte %d" % offset in e["message"], e
