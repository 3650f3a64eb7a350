"""The grammar matcher (src/grammar/, issue 44) against the jsonschema package.

The C side is the test program test_grammar (tests/test_grammar.c) in its two Python modes:
``--check`` answers accept/refuse for documents, ``--generate`` writes documents from random walks
through a grammar. Schemas come from Pydantic models (as an OpenAI client sends them) and by hand.

- Every document of the canonical form (keys in the schema's order, compact or one space after
  ":" and ","), valid or not, gets the answer jsonschema gives, with its format checks on.
- Every generated document parses and validates: the grammar is never wider than the schema.
- Unsupported keywords are refused by name and path.

The program is found next to the library (build/tests/test_grammar for NOPAD_LIBRARY=
build/libnopad.so) or at $NOPAD_TEST_GRAMMAR.
"""
import copy
import datetime
import enum
import json
import os
import random
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Annotated, List, Literal, Optional, Union

import pytest

jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parents[2]


def _program():
    env = os.environ.get("NOPAD_TEST_GRAMMAR")
    if env:
        return Path(env)
    lib = os.environ.get("NOPAD_LIBRARY")
    build = Path(lib).resolve().parent if lib else REPO / "build"
    return build / "tests" / "test_grammar"


PROGRAM = _program()
pytestmark = pytest.mark.skipif(not PROGRAM.is_file(), reason="test_grammar not built (%s)" % PROGRAM)


def run(mode, cases, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)
        path = f.name
    try:
        out = subprocess.run([str(PROGRAM), mode, path, *map(str, args)], capture_output=True,
                             check=True, timeout=600).stdout.decode("utf-8")
    finally:
        os.unlink(path)
    return out.split("\n")[:-1]  # not splitlines: U+2028 inside a document is no line break


def validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def reference(schema, doc):
    try:
        value = json.loads(doc)
    except ValueError:
        return False
    return validator(schema).is_valid(value)


def dumps(value, spaced):
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": ") if spaced else (",", ":"))


# ---- schemas ----------------------------------------------------------------------------------

def pydantic_schemas():
    pydantic = pytest.importorskip("pydantic")
    from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

    class Color(str, enum.Enum):
        red = "red"
        green = "green"
        blue = "blue"

    class Address(BaseModel):
        model_config = ConfigDict(extra="forbid")
        street: str = Field(max_length=30)
        zip: str = Field(pattern=r"^\d{5}(-\d{4})?$")
        country: Literal["US", "CA", "MX"] = "US"

    class Person(BaseModel):
        model_config = ConfigDict(extra="forbid")
        id: uuid.UUID
        name: str = Field(min_length=1, max_length=20)
        age: int = Field(ge=0, le=130)
        email: Optional[Annotated[str, WithJsonSchema({"type": "string", "format": "email"})]] = None
        favorite: Color
        born: datetime.date
        seen: datetime.datetime
        tags: List[str] = Field(default_factory=list, max_length=4)
        address: Address
        friends: List[Address] = Field(default_factory=list, min_length=0, max_length=2)

    class Cat(BaseModel):
        model_config = ConfigDict(extra="forbid")
        kind: Literal["cat"]
        lives: int = Field(ge=1, le=9)

    class Dog(BaseModel):
        model_config = ConfigDict(extra="forbid")
        kind: Literal["dog"]
        good: bool

    class Pets(BaseModel):
        model_config = ConfigDict(extra="forbid")
        pets: List[Union[Cat, Dog]] = Field(min_length=1, max_length=3)
        owner: Optional[str] = None
        counts: dict[str, int] = Field(default_factory=dict)

    class Tree(BaseModel):
        value: int
        children: List["Tree"] = Field(default_factory=list, max_length=2)

    return {"person": Person.model_json_schema(), "pets": Pets.model_json_schema(),
            "tree": Tree.model_json_schema()}


HAND_SCHEMAS = {
    "numbers": {"type": "object", "properties": {
        "small": {"type": "integer", "minimum": -7, "maximum": 12},
        "big": {"type": "integer", "exclusiveMinimum": 99, "exclusiveMaximum": 100000},
        "neg": {"type": "integer", "maximum": -10},
        "x": {"type": "number"},
        "flag": {"type": ["boolean", "null"]}},
        "required": ["small", "big", "neg", "x"], "additionalProperties": False},
    "strings": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2,3}-[0-9a-f]+$"},
        "word": {"type": "string", "pattern": "ab|cd"},
        "short": {"type": "string", "minLength": 2, "maxLength": 4},
        "t": {"type": "string", "format": "time"},
        "c": {"const": "fixed \"value\""},
        "e": {"enum": [1, "one", None, [1, 2], {"k": True}]}},
        "required": ["code", "word", "short"], "additionalProperties": False},
    "open": {"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "string"}},
             "required": ["a"]},
    "dict": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "integer"},
                                                         "maxItems": 2}},
    "any": {},
    "oneof": {"oneOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 10}]},
}


# ---- documents ----------------------------------------------------------------------------------

def valid_values():
    """Hand-made valid instances of each schema, key order as the schema's."""
    person = {"id": "123e4567-e89b-12d3-a456-426614174000", "name": "Zoë", "age": 36,
              "email": "ada@example.org", "favorite": "green", "born": "1815-12-10",
              "seen": "2024-02-29T23:59:59.5+01:00", "tags": ["a", "b \"q\""],
              "address": {"street": "1 Main St", "zip": "12345-6789", "country": "CA"},
              "friends": [{"street": "x", "zip": "00000", "country": "US"}]}
    return {
        "person": [person, {**person, "email": None, "tags": [], "friends": []},
                   {k: v for k, v in person.items() if k not in ("email", "tags", "friends")}],
        "pets": [{"pets": [{"kind": "cat", "lives": 9}, {"kind": "dog", "good": False}], "owner": None,
                  "counts": {"cats": 1, "dogs": 2}},
                 {"pets": [{"kind": "dog", "good": True}]}],
        "tree": [{"value": 1, "children": [{"value": -2, "children": []}, {"value": 3}]}, {"value": 0}],
        "numbers": [{"small": -7, "big": 100, "neg": -10, "x": 1.5e-3, "flag": None},
                    {"small": 12, "big": 99999, "neg": -123456789, "x": -0.25, "flag": True}],
        "strings": [{"code": "AB-0f", "word": "xxabyy", "short": "éé", "t": "12:30:00Z", "c": "fixed \"value\"",
                     "e": [1, 2]},
                    {"code": "XYZ-1", "word": "cd", "short": "a\nb", "e": {"k": True}},
                    {"code": "QQ-a", "word": "abab", "short": "12", "e": None}],
        "open": [{"a": 1}, {"a": 1, "ab": "s"}, {"a": 1, "b": [1, {"c": None}], "aa": "x"}],
        "dict": [{}, {"x": [1, 2], "y z": []}],
        "any": [None, [1, "a", {"b": False}], {"x": 1.25}, "str", 7],
        "oneof": ["ab", 10, 123456],
    }


def mutations(value, rng):
    """Invalid (or not-JSON) variants of a valid value: every leaf replaced by wrong things, keys
    dropped and added, arrays grown, the text truncated."""
    out = []

    def leaves(v, path=()):
        if isinstance(v, dict):
            for k, x in v.items():
                yield from leaves(x, path + (k,))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                yield from leaves(x, path + (i,))
        yield path

    def replaced(path, new):
        v = copy.deepcopy(value)
        if not path:
            return new
        at = v
        for p in path[:-1]:
            at = at[p]
        at[path[-1]] = new
        return v

    def dropped(path):
        v = copy.deepcopy(value)
        at = v
        for p in path[:-1]:
            at = at[p]
        del at[path[-1]]
        return v

    for path in leaves(value):
        for new in (None, True, -1, 0, 131, 10**6, 2.5, "", "x" * 40, "ABC-1g", "2023-02-29", "24:00:00Z",
                    "not-a-uuid", "noatsign", "purple", [], {}, ["a"] * 5):
            if rng.random() < 0.35:
                out.append(replaced(path, new))
        if path and rng.random() < 0.5:
            out.append(dropped(path))
    if isinstance(value, dict):
        out.append({**value, "zzz": 1})
    return out


@pytest.fixture(scope="module")
def schemas():
    s = dict(HAND_SCHEMAS)
    s.update(pydantic_schemas())
    return s


def test_documents_agree_with_jsonschema(schemas):
    rng = random.Random(20260601)
    values = valid_values()
    cases, expected = [], []
    for name, schema in schemas.items():
        docs = []
        for v in values[name]:
            assert validator(schema).is_valid(v), (name, v)  # the fixture itself
            for spaced in (False, True):
                docs.append(dumps(v, spaced))
            for bad in mutations(v, rng):
                docs.append(dumps(bad, rng.random() < 0.5))
            text = dumps(v, False)
            docs.append(text[: rng.randrange(len(text))])  # not JSON: truncated
            docs.append(text + " x")
        cases.append({"schema": schema, "docs": docs})
        expected.append([reference(schema, d) for d in docs])
    lines = run("--check", cases)
    assert len(lines) == len(cases)
    total = 0
    for (name, schema), case, want, line in zip(schemas.items(), cases, expected, lines):
        assert not line.startswith("ERR"), (name, line)
        got = [c == "1" for c in line]
        wrong = [(d, w) for d, w, g in zip(case["docs"], want, got) if w != g]
        assert not wrong, "%s: %d disagreements, e.g. %r (jsonschema says %s)" % (
            name, len(wrong), wrong[0][0], "valid" if wrong[0][1] else "invalid")
        assert sum(want) >= 2 * len(values[name])  # valid ones are in the set, not only invalid
        total += len(want)
    assert total > 500


def test_generated_documents_validate(schemas):
    """Random byte walks through each grammar: every document they end in parses and validates."""
    names = list(schemas)
    per_schema = 60
    lines = run("--generate", [{"schema": schemas[n]} for n in names], per_schema, 7)
    assert len(lines) == per_schema * len(names)
    finished = 0
    for i, name in enumerate(names):
        v = validator(schemas[name])
        for line in lines[i * per_schema:(i + 1) * per_schema]:
            assert not line.startswith("ERR"), line
            doc = json.loads(line)
            if doc is None:
                continue  # a walk that ran past its length: nothing claimed
            value = json.loads(doc)
            errors = list(v.iter_errors(value))
            assert not errors, "%s: generated %r fails: %s" % (name, doc, errors[0].message)
            finished += 1
    assert finished >= 0.9 * per_schema * len(names)


def test_regex_and_choices():
    import re
    patterns = [r"(yes|no)( [0-9]{1,3})?\.", r"[A-Z][a-z]+ \d+", r"(ab|a)*c?", r"[^,]{1,4},x"]
    rng = random.Random(3)
    cases = []
    for p in patterns:
        cases.append({"regex": p})
    lines = run("--generate", cases, 40, 11)
    for i, p in enumerate(patterns):
        for line in lines[i * 40:(i + 1) * 40]:
            doc = json.loads(line)
            if doc is not None:
                assert re.fullmatch(p, doc), (p, doc)
    probes = ["yes.", "no 123.", "no 1234.", "Maybe.", "Ab 1", "AB 1", "abac", "aac", "ab,x", ",x", "abcde,x",
              "é,x", "yes", ""]
    lines = run("--check", [{"regex": p, "docs": probes} for p in patterns]
                + [{"choices": ["red", "green", "re"], "docs": ["red", "re", "gre", "green", "greens"]}])
    for p, line in zip(patterns, lines):
        assert [c == "1" for c in line] == [bool(re.fullmatch(p, d)) for d in probes], p
    assert lines[-1] == "11010"
    del rng


@pytest.mark.parametrize("schema,keyword,path", [
    ({"type": "object", "properties": {"a": {"type": "string", "contentEncoding": "base64"}}},
     "contentEncoding", "schema.properties.a"),
    ({"type": "array", "items": {"type": "integer", "multipleOf": 2}}, "multipleOf", "schema.items"),
    ({"type": "array", "prefixItems": [{"type": "integer"}]}, "prefixItems", "schema"),
    ({"type": "object", "minProperties": 1}, "minProperties", "schema"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems", "schema"),
    ({"anyOf": [{"not": {"type": "null"}}]}, "not", "schema.anyOf[0]"),
    ({"type": "string", "format": "ipv4"}, "ipv4", "schema"),
])
def test_unsupported_keywords_are_named(schema, keyword, path):
    (line,) = run("--check", [{"schema": schema, "docs": []}])
    assert line.startswith("ERR ") and keyword in line and path + ":" in line, line
