"""What real OpenAI clients send, through the official `openai` SDK to a real `prefix-edge serve`
on a loopback port (the tiny bundle): tools as pydantic writes them (`$defs`, `definitions`,
Enums, nested and listed models, `strict`) in every tool_choice and in response_format; the
SDK's stream helpers; `/v1/completions` with token ids and lists of prompts; `base` on every
endpoint; CORS with credentials; tools offered to a completion-prompt tool task; no token limit
runs to the context; errors name their field. Answers are compared with the same call run
in-process (greedy, ONNX)."""

from __future__ import annotations

import enum
import json

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
jsonschema = pytest.importorskip("jsonschema")

from pydantic import BaseModel, Field  # noqa: E402

from prefix_edge import PrefixEdgeError, Runtime  # noqa: E402

from .conftest import INPUTS  # noqa: E402
from .helpers.served import KEY, client, launch_server, local, server  # noqa: E402,F401  (fixtures)


class Unit(str, enum.Enum):
    C = "C"
    F = "F"


class Item(BaseModel):
    qty: int = Field(ge=1, le=9)


class Order(BaseModel):  # a list of models and an Enum: both under $defs
    items: list[Item] = Field(max_length=1)
    unit: Unit


class Temp(BaseModel):  # an Enum under $defs
    unit: Unit


def _definitions(schema: dict) -> dict:
    """A schema's `$defs` as the older `definitions` (what pydantic v1 and some frameworks write)."""
    text = json.dumps(schema).replace('"$defs"', '"definitions"').replace("#/$defs/", "#/definitions/")
    return json.loads(text)


def _tool(model, strict: bool, old: bool = False) -> dict:
    if strict:
        return openai.pydantic_function_tool(model)
    params = model.model_json_schema()
    return {"type": "function", "function": {"name": model.__name__, "parameters": _definitions(params) if old
                                             else params}}


ASK = [{"role": "user", "content": "hot?"}]
CALL_SCHEMA = {"anyOf": [
    {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 3}, "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"], "additionalProperties": False}},
     "required": ["name", "arguments"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"const": "order"}, "arguments": {
        "type": "object", "properties": {"quantity": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["quantity"], "additionalProperties": False}},
     "required": ["name", "arguments"], "additionalProperties": False}]}
TOOL_TASKS = '''
[task.call]
kind = "text"
chat = false
prefix = "Request: weather in Rome\\nCall:\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"Rome\\", \\"unit\\": \\"C\\"}}\\n\\n"
template = "Request: {input}\\nCall:\\n"
max_tokens = 96
stop = ["\\n"]
json_schema = @SCHEMA@

[task.words]
kind = "text"
chat = false
prefix = "Say: "
template = "{input} =>"
max_tokens = 4
'''




def _toml_inline(obj) -> str:
    """A JSON value as a TOML inline value."""
    if isinstance(obj, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_inline(v)}" for k, v in obj.items()) + " }"
    if isinstance(obj, list):
        return "[" + ", ".join(_toml_inline(v) for v in obj) + "]"
    return json.dumps(obj)


@pytest.fixture(scope="module")
def wide_bundle(tiny_model, tmp_path_factory):
    """The tiny model with 2,048 positions (its 512 do not hold two pydantic tools' listing; RoPE
    weights do not depend on it), exported (ONNX fp32) with a completion-prompt tool task."""
    import shutil

    from prefix_edge.export.build import export_bundle

    d = tmp_path_factory.mktemp("wide")
    shutil.copytree(tiny_model, d / "model")
    cfg = json.loads((d / "model" / "config.json").read_text())
    (d / "model" / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 2048}))
    (d / "tasks.toml").write_text(TOOL_TASKS.replace("@SCHEMA@", _toml_inline(CALL_SCHEMA)), encoding="utf-8")
    export_bundle(d / "model", d / "tasks.toml", d / "bundle", formats=("onnx",), quantize="none", progress=False)
    return d / "bundle"


@pytest.fixture(scope="module")
def wide(wide_bundle):
    """(openai client, base URL) of `prefix-edge serve` on the wide bundle."""
    proc, base = launch_server(wide_bundle)
    yield openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=120), base
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
def wide_local(wide_bundle):
    with Runtime.open(wide_bundle, backend="onnx") as rt:
        yield rt


# -- 1. tools and response_format with $defs, in every mode ------------------------------------
@pytest.mark.parametrize("strict, old", [(True, False), (False, False), (False, True)])
@pytest.mark.parametrize("choice", ["auto", "required", "forced"])
def test_pydantic_tools_work_in_every_mode(wide, wide_local, choice, strict, old):
    """Tools as pydantic writes them (strict through openai.pydantic_function_tool; plain
    model_json_schema with `$defs`, or with `definitions`): a 200 in every tool_choice (the
    references pointed at nothing: a 400 blaming response_format); a call parses as its model
    and equals the library's answer to the same call."""
    client, local = wide[0], wide_local
    tools = [_tool(Order, strict, old), _tool(Temp, strict, old)]
    tc = {"type": "function", "function": {"name": "Temp"}} if choice == "forced" else choice
    r = client.chat.completions.create(model="base", messages=ASK, tools=tools, tool_choice=tc,
                                       max_tokens=40, temperature=0.0)
    ref = local.generate(None, messages=ASK, tools=tools, tool_choice=tc, max_tokens=40)
    msg = r.choices[0].message
    if choice != "auto":
        assert msg.tool_calls, r
    if msg.tool_calls:
        call = msg.tool_calls[0].function
        assert call.arguments == ref.tool_calls[0]["function"]["arguments"]
        if r.choices[0].finish_reason == "tool_calls":  # whole (not cut by max_tokens)
            {"Order": Order, "Temp": Temp}[call.name].model_validate_json(call.arguments)
    else:
        assert msg.content == ref.text


def test_response_format_with_defs_parses(wide, wide_local):
    """response_format json_schema with `$defs` (the SDK's parse() helper on a pydantic model)."""
    client, local = wide[0], wide_local
    r = client.chat.completions.parse(model="base", messages=ASK, response_format=Order, max_tokens=40,
                                      temperature=0.0)
    assert isinstance(r.choices[0].message.parsed, Order)
    schema = openai.lib._pydantic.to_strict_json_schema(Order)  # what the SDK sends
    ref = local.generate(None, messages=ASK, json_schema=schema, max_tokens=40)
    assert r.choices[0].message.content == ref.text


# -- 2. a streamed call in OpenAI's chunk shape --------------------------------------------------
def test_stream_helper_parses_a_pydantic_call(wide):
    """The SDK 2.x chat.completions.stream() helper on a forced strict pydantic tool: the final
    completion's call is parsed as the model (the raw chunks' shape: test_tools.py
    test_a_streamed_call_has_one_entry_per_index_per_chunk)."""
    client, server = wide
    tools = [openai.pydantic_function_tool(Order)]
    tc = {"type": "function", "function": {"name": "Order"}}
    with client.chat.completions.stream(model="base", messages=ASK, tools=tools, tool_choice=tc,
                                        max_tokens=40, temperature=0.0) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert final.choices[0].finish_reason == "tool_calls"
    assert isinstance(call.function.parsed_arguments, Order)


# -- 3, 4. /v1/completions: token ids, lists of prompts, base ------------------------------------
def test_prompt_as_token_ids_equals_the_text(client, local):
    """Token ids are the prompt as given: the ids of a task's wrapped input (or of a base
    prompt) answer as the text does."""
    for model, task in (("raw", "raw"), ("base", None)):
        ids = [int(t) for t in local.encode_input(task, INPUTS[0])]
        by_text = client.completions.create(model=model, prompt=INPUTS[0], max_tokens=8, temperature=0.0)
        by_ids = client.completions.create(model=model, prompt=ids, max_tokens=8, temperature=0.0)
        assert by_ids.choices[0].text == by_text.choices[0].text
        assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens
    ref = local.generate(None, INPUTS[0], max_tokens=8)  # base: the prompt alone, no template
    assert by_text.choices[0].text == ref.text


@pytest.mark.parametrize("stream", [False, True])
def test_lists_of_prompts_are_n_choices_each(client, local, stream):
    """A list of strings (or of token-id lists): n choices per prompt, choice index = prompt
    index * n + j (OpenAI's rule), each the answer to its prompt alone; usage summed."""
    texts = INPUTS[:3]
    ids = [[int(t) for t in local.encode_input("raw", x)] for x in texts]
    alone = [client.completions.create(model="raw", prompt=x, max_tokens=6, temperature=0.0) for x in texts]
    for prompt in (texts, ids):
        if stream:
            got: dict[int, str] = {}
            for chunk in client.completions.create(model="raw", prompt=prompt, n=2, max_tokens=6,
                                                   temperature=0.0, stream=True):
                for c in chunk.choices:
                    got[c.index] = got.get(c.index, "") + c.text
            texts_by_index = [got[i] for i in range(len(got))]
        else:
            r = client.completions.create(model="raw", prompt=prompt, n=2, max_tokens=6, temperature=0.0)
            assert [c.index for c in r.choices] == list(range(6))
            texts_by_index = [c.text for c in r.choices]
            assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
            assert r.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)
        assert texts_by_index == [alone[i // 2].choices[0].text for i in range(6)]


@pytest.mark.parametrize("prompt", [[], [[]], [1, "a"], ["a", [1]], [[1], "a"], [True], [1.5], [-1],
                                    [10 ** 9], [[5, 10 ** 9]], [""]])
def test_bad_prompts_are_400s_naming_prompt(server, prompt):
    r = httpx.post(server + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                   json={"model": "raw", "prompt": prompt, "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "prompt" and "\n" not in err["message"], err


def test_base_on_every_endpoint_it_is_listed_for(client, local):
    assert "base" in {m.id for m in client.models.list()}
    c = client.completions.create(model="base", prompt=INPUTS[1], max_tokens=6, temperature=0.0)
    assert c.choices[0].text == local.generate(None, INPUTS[1], max_tokens=6).text
    chat = client.chat.completions.create(model="base", messages=ASK, max_tokens=6, temperature=0.0)
    resp = client.responses.create(model="base", input=ASK[0]["content"], max_output_tokens=6, temperature=0.0)
    assert resp.output_text == chat.choices[0].message.content


# -- 7. no token limit: to the context ----------------------------------------------------------
def test_no_limit_runs_to_the_context(client, local):
    """A request that sets no token limit (nor does its task) generates to the end of the
    context (was 256); a task's max_tokens still holds. Checked in the library, on chat
    completions and in a Responses stream (the SDK's responses.stream helper)."""
    ban = {str(e): -100 for e in local.eos}
    r = local.generate(None, messages=ASK, logit_bias=ban)
    n_in = r.stats.input_tokens
    assert len(r.tokens) == local.n_ctx - n_in > 256 and r.stats.finish_reason == "length"
    c = client.chat.completions.create(model="base", messages=ASK, logit_bias=ban)
    assert c.usage.completion_tokens == local.n_ctx - c.usage.prompt_tokens
    assert c.choices[0].message.content == r.text
    t = client.chat.completions.create(model="support", messages=ASK, logit_bias=ban)
    assert t.usage.completion_tokens == local.tasks["support"].defaults["max_tokens"] == 16
    with client.responses.stream(model="base", input=ASK[0]["content"]) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    plain = local.generate(None, messages=ASK)
    assert final.output_text == plain.text and final.status == (
        "completed" if plain.stats.finish_reason == "eos" else "incomplete")


def test_no_limit_in_a_shared_cache_is_a_slots_share(bundle_int4):
    """llama.cpp's shared_kv (one cache for every request): a request without a limit runs to
    a slot's share of the cache (kv_cells // slots, with its input), not past what it reserved."""
    pytest.importorskip("llama_cpp")
    with Runtime.open(bundle_int4, backend="gguf", shared_kv=True, slots=2, kv_cells=512) as rt:
        ban = {str(e): -100 for e in rt.eos}
        r = rt.generate(None, messages=ASK, logit_bias=ban)
        assert rt.n_ctx == 512 and len(r.tokens) == 512 // 2 - r.stats.input_tokens
        assert r.stats.finish_reason == "length"


# -- 8. errors carry their field -------------------------------------------------------------
@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"model": "raw", "prompt": "   "}, "prompt"),
    ("/v1/chat/completions", {"model": "base", "messages": ASK, "tools": [{"type": "function", "function": {
        "name": "a b"}}]}, "tools"),
    ("/v1/chat/completions", {"model": "base", "messages": ASK, "tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"model": "base", "messages": ASK, "tools": [_tool(Temp, True)],
                              "tool_choice": {"type": "function", "function": {"name": "Other"}}}, "tool_choice"),
    ("/v1/chat/completions", {"model": "base", "messages": ASK, "n": 64}, "n"),
    ("/v1/chat/completions", {"model": "base", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages"),
    ("/v1/responses", {"model": "base", "input": [{"role": "wizard", "content": "hi"}]}, "input"),
    ("/v1/completions", {"model": "raw", "prompt": "hi", "tools": [_tool(Temp, True)]}, "tools"),
])
def test_errors_name_their_field(server, path, body, param):
    r = httpx.post(server + path, headers={"Authorization": f"Bearer {KEY}"}, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_library_errors_carry_their_field(local):
    for kw, param in (({"tools": "x"}, "tools"), ({"tool_choice": "required"}, "tool_choice"),
                      ({"logprobs": 99}, "logprobs"), ({"max_tokens": 0}, "max_tokens")):
        with pytest.raises(PrefixEdgeError) as e:
            local.generate(None, messages=ASK, **kw)
        assert e.value.param == param, e.value
    with pytest.raises(PrefixEdgeError) as e:
        local.generate("raw", [local.backend.n_vocab])
    assert e.value.param == "text"


# -- 5. CORS ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cors, credentials", [("http://app.example,http://b.example", True), ("*", False)])
def test_cors_credentials_only_for_named_origins(bundle_int4, cors, credentials):
    """A preflight with credentials from an origin --cors names explicitly: allowed with
    Access-Control-Allow-Credentials; with "*" never (the CORS spec forbids it). /v1/models
    keeps requiring the API key (OpenAI's behaviour; docs/server.md)."""
    proc, base = launch_server(bundle_int4, "--cors", cors)
    try:
        r = httpx.options(base + "/v1/chat/completions", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert r.status_code == 200, r.text
        assert r.headers.get("access-control-allow-credentials") == ("true" if credentials else None)
        assert r.headers["access-control-allow-origin"] == ("http://app.example" if credentials else "*")
        m = httpx.get(base + "/v1/models", headers={"Origin": "http://app.example"})
        assert m.status_code == 401
        ok = httpx.get(base + "/v1/models", headers={"Origin": "http://app.example",
                                                      "Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200
        assert ok.headers.get("access-control-allow-credentials") == ("true" if credentials else None)
        if credentials:
            other = httpx.options(base + "/v1/models", headers={"Origin": "http://evil.example",
                                                                "Access-Control-Request-Method": "GET"})
            assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    finally:
        proc.terminate()
        proc.wait(30)


# -- 6. tools offered to a completion-prompt tool task -----------------------------------------
CLIENT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "order", "parameters": {
        "type": "object", "properties": {"quantity": {"type": "integer"}}, "required": ["quantity"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}]


@pytest.mark.parametrize("offered, choice, names", [
    (CLIENT_TOOLS, "auto", {"get_weather", "order"}),
    (CLIENT_TOOLS, "required", {"get_weather", "order"}),
    (CLIENT_TOOLS[1:], "auto", {"order"}),
    (CLIENT_TOOLS, {"type": "function", "function": {"name": "get_weather"}}, {"get_weather"}),
])
def test_tool_task_answers_as_a_tool_call(wide, wide_local, offered, choice, names):
    """Tools offered (as agent frameworks attach them) to a completion-prompt tool task with one
    user message: its constrained answer, narrowed to the functions offered, is a tool_calls
    entry (was a 400 naming messages); plain and through the SDK's stream helper; equal to the
    task's own answer under the same narrowed schema in-process."""
    from prefix_edge.runtime.chat.tools import check_tools, task_call

    tool_server, rt = wide[0], wide_local
    ask = [{"role": "user", "content": "weather in Oslo"}]
    r = tool_server.chat.completions.create(model="call", messages=ask, tools=offered, tool_choice=choice)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None, r
    call = c.message.tool_calls[0].function
    assert call.name in names
    jsonschema.validate({"name": call.name, "arguments": json.loads(call.arguments)}, CALL_SCHEMA)
    narrowed = task_call(CALL_SCHEMA, check_tools(offered, choice), "call")
    ref = rt.generate("call", ask[0]["content"], json_schema=narrowed)
    assert json.loads(ref.text) == {"name": call.name, "arguments": json.loads(call.arguments)}
    with tool_server.chat.completions.stream(model="call", messages=ask, tools=offered, tool_choice=choice) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.arguments == call.arguments
    assert final.choices[0].finish_reason == "tool_calls"


def test_tool_task_refusals_name_the_field(wide):
    tool_server = wide[0]
    ask = [{"role": "user", "content": "weather in Oslo"}]
    for model, tools, param in (("call", CLIENT_TOOLS[2:], "tools"),  # none of its functions
                                ("words", CLIENT_TOOLS, "tools")):    # its answer is no call
        with pytest.raises(openai.BadRequestError) as e:
            tool_server.chat.completions.create(model=model, messages=ask, tools=tools)
        assert e.value.param == param and "\n" not in e.value.message
    with pytest.raises(openai.BadRequestError) as e:  # still one message: the task's input
        tool_server.chat.completions.create(model="call", messages=[{"role": "system", "content": "x"}, *ask],
                                            tools=CLIENT_TOOLS)
    assert e.value.param == "messages"
    plain = tool_server.chat.completions.create(model="call", messages=ask)
    none = tool_server.chat.completions.create(model="call", messages=ask, tools=CLIENT_TOOLS, tool_choice="none")
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert not none.choices[0].message.tool_calls
