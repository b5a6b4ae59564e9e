"""Constrained decoding (llguidance) on both engines: every supported JSON-schema feature gives
output that parses and validates (sampled at temperature 1 from a random model, the hardest
case for a constraint), a seeded fuzz of random schemas does too, greedy with a constraint that
allows the greedy tokens gives exactly the unconstrained tokens, and bad schemas are one-line
errors naming the feature. The reference validator is jsonschema."""

from __future__ import annotations

import json
import random
import re

import pytest

from prefix_edge import PrefixEdgeError, Runtime

from .conftest import INPUTS

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

BACKENDS = ["onnx", "gguf"]
S = {"type": "string", "maxLength": 6}
FEATURES = {
    "types": {"type": "object", "properties": {"s": S, "i": {"type": "integer"}, "n": {"type": "number"},
                                               "b": {"type": "boolean"}, "z": {"type": "null"}},
              "required": ["s", "i", "n", "b", "z"], "additionalProperties": False},
    "enum_const": {"type": "object", "properties": {"e": {"enum": ["red", "green", 3, None]},
                                                    "c": {"const": "fixed"}},
                   "required": ["e", "c"], "additionalProperties": False},
    "array": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
              "minItems": 1, "maxItems": 4},
    "nested_ref": {"type": "object", "$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}},
                                                      "required": ["x"], "additionalProperties": False}},
                   "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"type": "array", "items": {"$ref": "#/$defs/pt"},
                                                                      "maxItems": 2}},
                   "required": ["a", "b"], "additionalProperties": False},
    "any_of_nullable": {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer"}, S]},
                                                         "o": {"type": ["string", "null"], "maxLength": 4}},
                        "required": ["v", "o"], "additionalProperties": False},
    "string_rules": {"type": "object", "properties": {"p": {"type": "string", "pattern": "^[a-c]{2,4}$"},
                                                      "l": {"type": "string", "minLength": 2, "maxLength": 3},
                                                      "d": {"type": "string", "format": "date"}},
                     "required": ["p", "l", "d"], "additionalProperties": False},
    "number_rules": {"type": "object", "properties": {"i": {"type": "integer", "minimum": -5, "maximum": 5},
                                                      "x": {"type": "number", "minimum": 0, "maximum": 1}},
                     "required": ["i", "x"], "additionalProperties": False},
    "optional_keys": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "boolean"}},
                      "required": ["a"], "additionalProperties": False},
}


@pytest.fixture(scope="module", params=BACKENDS)
def rt(request, bundle_int4):
    with Runtime.open(bundle_int4, backend=request.param) as rt:
        yield rt


def _valid(r, schema):
    assert r.stats.finish_reason == "eos", (r.stats.finish_reason, r.text)
    value = json.loads(r.text)
    jsonschema.validate(value, schema)
    return value


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_every_schema_feature_validates(rt, feature):
    schema = FEATURES[feature]
    for seed in range(3):
        r = rt.generate("support", INPUTS[seed % 3], json_schema=schema, max_tokens=200,
                        temperature=1.0, seed=seed)
        _valid(r, schema)


def _random_schema(rng: random.Random, depth: int = 0) -> dict:
    kinds = ["int", "bool", "enum", "str", "num"] + (["obj", "arr"] if depth < 2 else [])
    k = rng.choice(kinds)
    if k == "int":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 100)}
    if k == "bool":
        return {"type": "boolean"}
    if k == "enum":
        return {"enum": rng.sample(["a", "b", "c", 1, 2, True, None], rng.randint(1, 4))}
    if k == "str":
        return {"type": "string", "maxLength": rng.randint(0, 5)}
    if k == "num":
        return {"type": "number", "minimum": 0, "maximum": 10}
    if k == "arr":
        return {"type": "array", "items": _random_schema(rng, depth + 1), "maxItems": rng.randint(0, 3)}
    names = rng.sample(["a", "b", "c", "d", "e"], rng.randint(1, 4))
    props = {n: _random_schema(rng, depth + 1) for n in names}
    return {"type": "object", "properties": props, "required": [n for n in names if rng.random() < 0.7],
            "additionalProperties": False}


def test_fuzz_random_schemas(rt):
    rng = random.Random(1234)
    for i in range(12):
        schema = _random_schema(rng)
        schema = schema if schema.get("type") == "object" else {"type": "object", "properties": {"v": schema},
                                                                 "required": ["v"], "additionalProperties": False}
        r = rt.generate("extract", INPUTS[i % 3], json_schema=schema, max_tokens=300, temperature=1.0, seed=i)
        _valid(r, schema)


def test_constrained_greedy_is_the_best_allowed_token(bundle_int4):
    """Greedy with a constraint = at each step the model's most likely token among those the
    constraint allows: checked against a loop of our own (a llama.cpp backend outside the
    scheduler, llguidance's matcher, numpy's argmax)."""
    import llguidance
    import numpy as np

    from prefix_edge.runtime.engines import open_backend

    with Runtime.open(bundle_int4, backend="gguf") as rt:
        for regex in ("[a-z ]{1,30}", "(yes|no), [0-9]+"):
            got = rt.generate("support", INPUTS[0], regex=regex, max_tokens=30)
            ids = rt.encode_input("support", INPUTS[0])
            prefix, _ = rt.prefixes.get("support")
            model = rt.root / next(f for f in rt.manifest.backends["gguf"].files if f.endswith(".gguf"))
            m = llguidance.LLMatcher(rt.grammars._tokenizer(), rt.grammars.grammar("regex", regex), log_level=0)
            from prefix_edge.runtime.decode.constraint import Constraint

            c = Constraint(m, rt.grammars.n_vocab)
            be = open_backend("gguf", model, n_ctx=512, kv_type=rt.manifest.backends["gguf"].state["kv_type"])
            try:
                be.begin(prefix)
                logits = be.prefill(ids)
                want = []
                for _ in range(30):
                    tok = int(np.argmax(np.where(c.allowed(), logits, -np.inf)))
                    if tok in rt.eos:
                        break
                    want.append(tok)
                    c.consume(tok)
                    logits = be.step(tok)
            finally:
                be.close()
            assert got.tokens == want
            assert re.fullmatch(regex, got.text)


def test_constraints_with_choices_stops_and_streams(rt):
    schema = FEATURES["enum_const"]
    streams = rt.choices("support", messages=[{"role": "user", "content": INPUTS[0]}], n=3,
                         json_schema=schema, temperature=1.0, seed=5, max_tokens=60)
    for s in streams:
        chunks = list(s)
        assert "".join(chunks) == s.result.text
        _valid(s.result, schema)
    r = rt.generate("support", INPUTS[0], regex="[a-z]{3} [a-z]{3}", stop=[" "], max_tokens=20)
    assert r.stats.finish_reason == "stop" and len(r.text) == 3 and r.text.isalpha()


@pytest.mark.parametrize("opts, needle", [
    ({"json_schema": {"type": "string", "format": "not-a-format"}}, "json_schema"),
    ({"json_schema": "nope"}, "json_schema must be"),
    ({"regex": "(unclosed"}, "regex"),
    ({"grammar": "start: undefined_rule"}, "grammar"),
    ({"regex": "a", "json_schema": True}, "one constraint"),
])
def test_bad_constraints_are_one_line_errors(rt, opts, needle):
    with pytest.raises(PrefixEdgeError) as e:
        rt.generate("support", "x", **opts)
    assert needle in str(e.value) and "\n" not in str(e.value)
