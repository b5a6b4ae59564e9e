"""A body fuzz of every endpoint of a real server (`prefix-edge serve`, llama.cpp, the tiny
quantized bundle): each field of each body (top-level, and nested in messages, content parts,
tool calls, tools, tool_choice, response_format, stream_options, input items, text.format,
metadata, logit_bias, stop) given every JSON type it does not take, and hostile values of the
types it does (a 100 KB string, a lone surrogate, arrays nested 5,000 deep, NaN, -1e999, a
5,000-digit number). Every answer is a 2xx, or a 4xx in OpenAI's shape whose `param` names the
field; never a 5xx or a traceback; and afterwards the server gives a plain request the answer
it gave before.
The cases are a fixed matrix plus a seeded draw of combined mutations: bounded and repeatable."""

from __future__ import annotations

import json
import random
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("llama_cpp")

from .helpers.serve import start_server, stop_server  # noqa: E402

HOLE = "@@fuzz@@"  # where a case's value goes in the body's JSON text
DEEP = 5000
# a value's JSON text and the kinds of JSON it is ("int" and "float" are both numbers)
VALUES = {
    "null": ("null", "null"), "bool": ("true", "bool"), "int": ("7", "int"),
    "float": ("2.5", "float"), "str": ('"x"', "str"), "list": ('[1, "a"]', "list"),
    "obj": ('{"a": 1}', "obj"),
    "huge": ('"' + "word " * 20_000 + '"', "str"),
    "surrogate": ('"a\\ud800b"', "str"),
    "deep": ("[" * DEEP + "]" * DEEP, "list"),
    "deep_obj": ('{"a": ' * DEEP + "1" + "}" * DEEP, "obj"),
    "nan": ("NaN", "float"), "overflow": ("-1e999", "float"),
    "bigint": ("9" * 5000, "int"),
}
HOSTILE = {"surrogate", "deep", "deep_obj", "nan", "overflow", "bigint"}  # a 4xx whatever the field takes


def takes(spec: str, kind: str) -> bool:
    kinds = set(spec.split("|"))
    return "any" in kinds or kind in kinds or (kind in ("int", "float") and "num" in kinds)


SAMPLING = {"max_tokens": "int|null", "temperature": "num|null", "top_p": "num|null",
            "seed": "int|null", "stop": "str|list|null", "presence_penalty": "num|null",
            "frequency_penalty": "num|null", "logit_bias": "obj|null", "top_k": "int|null",
            "min_p": "num|null", "repetition_penalty": "num|null", "speculative": "str|null"}
COMMON = {"model": "str", "stream": "bool|null", "stream_options": "obj|null", "user": "str|null",
          "n": "int|null", "metadata": "obj|null", "store": "bool|null", "service_tier": "str|null",
          "echo": "bool|null", "suffix": "str|null", "best_of": "int|null",
          "max_completion_tokens": "int|null", "response_format": "obj|null", "tools": "list|null",
          "tool_choice": "str|obj|null", "parallel_tool_calls": "bool|null", "functions": "list|null",
          "function_call": "str|obj|null", "prompt_cache_key": "str|null",
          "safety_identifier": "str|null", "modalities": "list|null", "reasoning_effort": "str|null",
          "verbosity": "str|null", "web_search_options": "obj|null", "prediction": "obj|null",
          "audio": "obj|null", "top_logprobs": "int|null", "bogus": "", **SAMPLING,
          "documents": "list|null", "compose_documents": "bool|null", "compose_recompute": "int|null"}  # extensions (documents.py)
DOCS = {"documents": {"documents": [{"title": "t", "text": "x"}]}}
DOC_PATHS = {("documents", 0): "obj", ("documents", 0, "title"): "str|null", ("documents", 0, "text"): "str"}
TOOL = {"type": "function", "function": {"name": "get", "description": "look it up", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": '{"q": "a"}'}}
HISTORY = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
           {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"},
                                                        "strict": True}}

# endpoint -> (the body every case starts from, {field path: the kinds it takes}, {the first
# key of a path: the fields the body holds for that path's cases})
CHAT = ({"model": "support", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        {**{(k,): v for k, v in COMMON.items()}, ("messages",): "list", ("logprobs",): "bool|null",
         ("messages", 0): "obj", ("messages", 0, "role"): "str", ("messages", 0, "content"): "str|list",
         ("messages", 0, "name"): "str|null",
         ("messages", 1, "tool_calls"): "list|null", ("messages", 1, "tool_calls", 0): "obj",
         ("messages", 1, "tool_calls", 0, "id"): "str", ("messages", 1, "tool_calls", 0, "type"): "str",
         ("messages", 1, "tool_calls", 0, "function"): "obj",
         ("messages", 1, "tool_calls", 0, "function", "name"): "str",
         ("messages", 1, "tool_calls", 0, "function", "arguments"): "str|obj",
         ("messages", 2, "tool_call_id"): "str", ("messages", 2, "content"): "str|list",
         ("tools", 0): "obj", ("tools", 0, "type"): "str", ("tools", 0, "function"): "obj",
         ("tools", 0, "function", "name"): "str", ("tools", 0, "function", "description"): "str|null",
         ("tools", 0, "function", "parameters"): "obj|null", ("tools", 0, "function", "strict"): "bool|null",
         ("tool_choice", "type"): "str", ("tool_choice", "function"): "obj",
         ("tool_choice", "function", "name"): "str",
         ("response_format", "type"): "str", ("response_format", "json_schema"): "obj",
         ("response_format", "json_schema", "name"): "str",
         ("response_format", "json_schema", "schema"): "obj|null",
         ("response_format", "json_schema", "strict"): "bool|null",
         ("stream_options", "include_usage"): "bool|null", ("logit_bias", "5"): "num",
         ("stop", 0): "str", ("metadata", "k"): "str", **DOC_PATHS},
        {**DOCS, "messages": {"messages": HISTORY}, "tools": {"tools": [TOOL]},
         "tool_choice": {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get"}}},
         "response_format": {"response_format": SCHEMA_FORMAT},
         "stream_options": {"stream_options": {"include_usage": True}}, "logit_bias": {"logit_bias": {"5": 1}},
         "stop": {"stop": ["zz"]}, "metadata": {"metadata": {"k": "v"}}})
# content parts: a path of its own under messages (the base's content is a list there)
PARTS = ({"model": "support", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
          "max_tokens": 1},
         {("messages", 0, "content", 0): "obj", ("messages", 0, "content", 0, "type"): "str",
          ("messages", 0, "content", 0, "text"): "str"}, {})
COMPLETIONS = ({"model": "raw", "prompt": "hi", "max_tokens": 1},
               {**{(k,): v for k, v in COMMON.items()}, ("prompt",): "str|list", ("logprobs",): "int|null",
                ("prompt", 0): "str|int|list", ("logit_bias", "5"): "num", ("stop", 0): "str"},
               {"prompt": {"prompt": ["hi"]}, "logit_bias": {"logit_bias": {"5": 1}}, "stop": {"stop": ["zz"]}})
RTOOL = {"type": "function", "name": "get", "description": "look it up", "strict": False,
         "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
ITEMS = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
         {"type": "function_call", "call_id": "call_1", "name": "get", "arguments": '{"q": "a"}'},
         {"type": "function_call_output", "call_id": "call_1", "output": "42"}]
RESPONSES = ({"model": "support", "input": "hi", "max_output_tokens": 1},
             {**{(k,): v for k, v in {
                 "model": "str", "input": "str|list", "instructions": "str|null", "stream": "bool|null",
                 "max_output_tokens": "int|null", "temperature": "num|null", "top_p": "num|null",
                 "tools": "list|null", "tool_choice": "str|obj|null", "parallel_tool_calls": "bool|null",
                 "text": "obj|null", "store": "bool|null", "previous_response_id": "str|null",
                 "metadata": "obj|null", "user": "str|null", "truncation": "str|null",
                 "reasoning": "obj|null", "include": "list|null", "top_logprobs": "int|null",
                 "service_tier": "str|null", "prompt_cache_key": "str|null", "safety_identifier": "str|null",
                 "stream_options": "obj|null", "background": "bool|null", "seed": "int|null",
                 "max_tool_calls": "int|null", "prompt_cache_retention": "str|null", "bogus": "",
                 "documents": "list|null", "compose_documents": "bool|null", "compose_recompute": "int|null",
                 "speculative": "str|null"}.items()}, **DOC_PATHS,
              ("input", 0): "obj", ("input", 0, "type"): "str", ("input", 0, "role"): "str",
              ("input", 0, "content"): "str|list", ("input", 0, "content", 0): "obj",
              ("input", 0, "content", 0, "type"): "str", ("input", 0, "content", 0, "text"): "str",
              ("input", 1, "type"): "str", ("input", 1, "call_id"): "str", ("input", 1, "name"): "str",
              ("input", 1, "arguments"): "str", ("input", 2, "call_id"): "str", ("input", 2, "output"): "any",
              ("tools", 0): "obj", ("tools", 0, "type"): "str", ("tools", 0, "name"): "str",
              ("tools", 0, "description"): "str|null", ("tools", 0, "parameters"): "obj|null",
              ("tools", 0, "strict"): "bool|null", ("tool_choice", "type"): "str", ("tool_choice", "name"): "str",
              ("text", "format"): "obj|null", ("text", "format", "type"): "str", ("text", "format", "name"): "str",
              ("text", "format", "schema"): "obj|null", ("text", "format", "strict"): "bool|null",
              ("text", "verbosity"): "str|null", ("reasoning", "effort"): "str|null",
              ("metadata", "k"): "str", ("include", 0): "str"},
             {**DOCS, "input": {"input": ITEMS}, "tools": {"tools": [RTOOL]},
              "tool_choice": {"tools": [RTOOL], "tool_choice": {"type": "function", "name": "get"}},
              "text": {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"},
                                           "strict": True}}},
              "reasoning": {"reasoning": {"effort": "low"}}, "metadata": {"metadata": {"k": "v"}},
              "include": {"include": ["message.output_text.logprobs"]}})
ENDPOINTS = {"/v1/chat/completions": [CHAT, PARTS], "/v1/completions": [COMPLETIONS],
             "/v1/responses": [RESPONSES]}


def body_text(base: dict, context: dict, path: tuple, value: str) -> bytes:
    """The base body (with the context its path needs) with `value` (JSON text) at `path`."""
    body = json.loads(json.dumps({**base, **context.get(path[0], {})}))
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = HOLE
    return json.dumps(body, ensure_ascii=True).replace(json.dumps(HOLE), value, 1).encode()


def matrix() -> list[tuple[str, tuple, str, bool]]:
    """(endpoint, path, value name, whether it must be a 4xx) for every field and value."""
    out = []
    for url, groups in ENDPOINTS.items():
        for base, fields, _ in groups:
            for path, spec in fields.items():
                for name, (_, kind) in VALUES.items():
                    if len(path) == 1 and kind == "null" and takes(spec, kind):
                        continue  # a top-level null is "not given": the base body itself
                    out.append((url, path, name, name in HOSTILE or not takes(spec, kind)))
    return out


def group_of(url: str, path: tuple):
    return next(g for g in ENDPOINTS[url] if path in g[1])


def root(param) -> str | None:
    return re.split(r"[.\[]", param)[0] if isinstance(param, str) else None


def check(r: httpx.Response, path: tuple, must_fail: bool, what: str) -> None:
    assert r.status_code < 500, f"{what}: {r.status_code} {r.text[:300]}"
    if r.status_code >= 400:
        err = r.json()["error"]
        # too long for the context: the conversation is named, whichever field made it long
        named = {str(path[0])} | ({"messages", "input", "prompt"} if err["code"] == "context_length_exceeded" else set())
        assert root(err["param"]) in named, f"{what}: param {err['param']!r}: {err}"
        assert err["message"] and "\n" not in err["message"] and "Traceback" not in err["message"], what
    else:
        assert not must_fail, f"{what}: accepted ({r.status_code}): {r.text[:300]}"


@pytest.fixture(scope="module")
def server(bundle_int4):
    proc, base = start_server(bundle_int4, "--backend", "gguf", "--slots", "2", "--n-ctx", "256")
    yield base
    rc, err = stop_server(proc)
    assert rc == 0, err
    assert "Traceback" not in err and "Exception" not in err, err[-5000:]


def _plain(base: str) -> str:
    r = httpx.post(base + "/v1/chat/completions", timeout=60, json={
        "model": "support", "messages": [{"role": "user", "content": "my sync stopped"}], "max_tokens": 8})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _post(client, base, url, raw: bytes) -> httpx.Response:
    return client.post(base + url, content=raw, headers={"Content-Type": "application/json"})


def test_every_field_with_every_wrong_type(server):
    before = _plain(server)
    cases = matrix()
    assert len(cases) > 1500

    def one(case):
        url, path, name, must_fail = case
        base, _, context = group_of(url, path)
        raw = body_text(base, context, path, VALUES[name][0])
        with httpx.Client(timeout=120) as c:
            r = _post(c, server, url, raw)
        check(r, path, must_fail, f"{url} {'.'.join(map(str, path))} = {name}")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, cases))
    assert _plain(server) == before  # unharmed: the same answer as before the fuzz


def test_seeded_combined_mutations(server):
    """Two or three fields of one body mutated at once (a seeded draw): never a 5xx, and a 4xx
    names one of them."""
    rng = random.Random(40)
    before = _plain(server)
    with httpx.Client(timeout=120) as c:
        for _ in range(300):
            url = rng.choice(sorted(ENDPOINTS))
            base, fields, context = rng.choice(ENDPOINTS[url])
            paths = rng.sample(sorted(fields, key=str), rng.randint(2, 3))
            paths = [p for p in paths if not any(q != p and p[:len(q)] == q for q in paths)]
            body = {**base}
            for p in paths:
                body.update(context.get(p[0], {}))
            body = json.loads(json.dumps(body))
            holes = []
            for k, p in enumerate(paths):
                node = body
                try:
                    for key in p[:-1]:
                        node = node[key]
                    node[p[-1]] = f"{HOLE}{k}"
                    holes.append((p, rng.choice(sorted(VALUES))))
                except (KeyError, IndexError, TypeError):
                    pass  # a path under another mutated field: that one stands
            raw = json.dumps(body, ensure_ascii=True)
            for k, (p, name) in enumerate(holes):
                raw = raw.replace(json.dumps(f"{HOLE}{k}"), VALUES[name][0], 1)
            r = _post(c, server, url, raw.encode())
            what = f"{url} " + ", ".join(f"{'.'.join(map(str, p))}={n}" for p, n in holes)
            assert r.status_code < 500, f"{what}: {r.status_code} {r.text[:300]}"
            if r.status_code >= 400:
                err = r.json()["error"]
                # too long for the context: the conversation is named, as in the test above
                named = {str(p[0]) for p, _ in holes} | {None} | (
                    {"messages", "input", "prompt"} if err["code"] == "context_length_exceeded" else set())
                assert root(err["param"]) in named, f"{what}: {r.text[:300]}"
    assert _plain(server) == before


@pytest.mark.parametrize("raw, param", [
    (b'{"model": "support", "input": "hi", "\\ud800": 1}', "\\ud800"),
    (b'{"model": "support", "input": "hi", "": 1}', ""),
    (b'{"model": "support", "input": "hi", "max_output_tokens": 2, "previous_response_id": ["a"]}',
     "previous_response_id"),
    (b'{"model": "support", "input": "hi", "max_output_tokens": 2, "previous_response_id": {"a": 1}}',
     "previous_response_id"),
    (b'{"model": "support", "input": "hi", "metadata": {"k": "' + b"v" * 513 + b'"}}', "metadata"),
    (b'{"model": "support", "input": "hi", "metadata": {"' + b"k" * 65 + b'": "v"}}', "metadata"),
    (b'{"model": "support", "input": "hi", "metadata": {' + b", ".join(b'"k%d": "v"' % i for i in range(17))
     + b"}}", "metadata"),
    (b'{"model": "support", "messages": [{"role": "user", "content": "hi"}], "metadata": {"k": 1}}', "metadata"),
])
def test_named_refusals(server, raw, param):
    url = "/v1/chat/completions" if b"messages" in raw else "/v1/responses"
    r = httpx.post(server + url, content=raw, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("where", ["responses", "chat"])
def test_deeply_nested_call_arguments_are_a_400(server, where):
    """Arguments of an earlier tool call nested 10,000 deep (a JSON string): a 400 naming the
    field, not a RecursionError."""
    deep = "[" * 10_000 + "]" * 10_000
    if where == "responses":
        url, body = "/v1/responses", {"model": "support", "max_output_tokens": 2, "input": [
            {"type": "function_call", "call_id": "c1", "name": "get", "arguments": deep},
            {"type": "function_call_output", "call_id": "c1", "output": "42"}]}
    else:
        call = {"id": "c1", "type": "function", "function": {"name": "get", "arguments": deep}}
        url, body = "/v1/chat/completions", {"model": "support", "max_tokens": 2, "messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"}]}
    r = httpx.post(server + url, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == ("input" if where == "responses" else "messages"), r.text


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_path_parameters(server, method):
    """Ids of every shape in the paths that take one: a 404 naming the id (or a 405 for a
    method a path does not take), in OpenAI's shape."""
    ids = ["resp_nope", "x" * 8000, "%ED%A0%80", "%00", "..%2F..%2Fetc", "%F0%9F%9A%80", "a/b", "null", "[]"]
    with httpx.Client(timeout=60) as c:
        for rid in ids:
            r = c.request(method, f"{server}/v1/responses/{rid}")
            assert r.status_code in (404, 414), (rid, r.text)
            if r.status_code == 404 and "/" not in rid and "%2F" not in rid:  # else: no such route
                assert r.json()["error"]["param"] == "response_id", (rid, r.text)
            m = c.request(method, f"{server}/v1/models/{rid}")
            assert m.status_code in ((404, 414) if method == "GET" else (405, 414)), (rid, m.text)
            assert "error" in m.json(), m.text
            t = c.request(method, f"{server}/v1/tasks/{rid}")  # a name no task has: never a path
            # (GET: no such task; DELETE: the task API is off on this server)
            assert t.status_code in ((404, 414) if method == "GET" else (403, 404, 414)), (rid, t.text)
            assert "error" in t.json(), t.text
        for url in ("/v1/models", "/health", "/metrics"):
            r = c.request(method, server + url, content=b'{"a": [[[[[')
            assert r.status_code == (200 if method == "GET" else 405), (url, r.text)
    assert _plain(server)


def test_the_fuzz_covers_every_field():
    """Every field the server takes is in the matrix (a field added to the server and not
    here fails this), and every generation option a request can name is a field of chat and
    completions, shaped by its kind (fields.option_fields: one definition, options.py)."""
    from prefix_edge.options import FIELDS
    from prefix_edge.serve.fields import COMPLETION_FIELDS, OPTION_SHAPES, RESPONSE_FIELDS

    named = {n for n, f in FIELDS.items() if f.kind not in ("schema", "pattern")}  # constraints: response_format
    assert named <= set(COMPLETION_FIELDS)
    assert all(COMPLETION_FIELDS[n] is OPTION_SHAPES[FIELDS[n].kind] for n in named)
    assert all(RESPONSE_FIELDS[n] is OPTION_SHAPES[FIELDS[n].kind] for n in named & set(RESPONSE_FIELDS))
    top = {url: {p[0] for g in groups for p in g[1] if len(p) == 1} for url, groups in ENDPOINTS.items()}
    assert top["/v1/chat/completions"] | top["/v1/completions"] == set(COMPLETION_FIELDS) | {"bogus"}
    assert top["/v1/responses"] == set(RESPONSE_FIELDS) | {"bogus"}
