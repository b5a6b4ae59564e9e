"""Tool calls: rendering (a tool-aware template as transformers renders it, with tools, calls and
tool results; the fallback system message where the template has none), forced calls
constrained to their function's parameters on both engines (validated by jsonschema), reading
an answer as a call, and the server's tool_calls (plain and streamed) through the openai SDK."""

from __future__ import annotations

import json

import httpx
import pytest

from prefix_edge import PrefixEdgeError, Runtime
from prefix_edge.runtime.tools import ToolSpec, check_tools, for_template, read_call

from .conftest import INPUTS
from .test_serve import KEY, client, server  # noqa: F401  (the same server fixtures)

jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ORDER = {"type": "function", "function": {
    "name": "order", "parameters": {"type": "object", "properties": {"qty": {"type": "integer", "minimum": 1,
                                                                             "maximum": 9}},
                                    "required": ["qty"], "additionalProperties": False}}}
TOOLS = [WEATHER, ORDER]
SMALL = [ORDER, {"type": "function", "function": {"name": "stop", "parameters": {
    "type": "object", "properties": {"now": {"type": "boolean"}}, "required": ["now"]}}}]  # fits the tiny model's 512
# a tool-aware template in the shape of Qwen's: tools listed in the system turn, calls in
# <tool_call> tags, tool results in their own turn
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{% for c in m.tool_calls %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments if c.function.arguments is string else c.function.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
HISTORY = [{"role": "user", "content": "3 please"},
           {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
               "name": "order", "arguments": "{\"qty\": 3}"}}]},
           {"role": "tool", "tool_call_id": "c1", "content": "ordered"}]


def test_tool_aware_template_renders_as_transformers(tiny_model):
    from prefix_edge.chat_template import render_chat
    from prefix_edge.runtime.chat import check_messages

    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_model))
    spec = check_tools(TOOLS, "auto")
    msgs, tools = for_template(check_messages(HISTORY), spec, True)
    got = render_chat(TOOL_TEMPLATE, msgs, True, dict(tok.special_tokens_map), tools)
    want = tok.apply_chat_template(HISTORY, tools=TOOLS, chat_template=TOOL_TEMPLATE, tokenize=False,
                                   add_generation_prompt=True)
    assert got == want and "<tool_response>\nordered" in got
    assert read_call('<tool_call>\n{"name": "order", "arguments": {"qty": 2}}\n</tool_call>', spec)[0][
        "function"] == {"name": "order", "arguments": "{\"qty\": 2}"}


def test_fallback_prompt_and_reading_calls(bundle_int4, tiny_model):
    """A template without tools (ChatML): the tools as a system message first, an earlier call as
    its JSON, a tool result as a user turn; exactly apply_chat_template of those messages."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_model))
    with Runtime.open(bundle_int4, backend="onnx") as rt:
        spec = check_tools(SMALL, "auto")
        ids, _, _ = rt.chat_input(None, HISTORY, spec)
        text = rt.tokenizer.decode(list(ids), skip_special_tokens=False)
        assert "You can call these functions" in text and '"name": "order"' in text
        assert "Tool result (c1): ordered" in text and '{"name": "order", "arguments": {"qty": 3}}' in text
        from prefix_edge.runtime.chat import check_messages

        msgs, _ = for_template(check_messages(HISTORY), spec, False)
        assert list(ids) == tok.apply_chat_template(msgs, add_generation_prompt=True)
        none, _, _ = rt.chat_input(None, HISTORY[:1], check_tools(SMALL, "none"))
        assert "You can call" not in rt.tokenizer.decode(list(none))
    assert read_call('{"name": "order", "arguments": {"qty": 3}}', spec)[0]["function"]["name"] == "order"
    assert read_call('{"name": "nope", "arguments": {}}', spec) is None
    assert read_call("The weather is fine.", spec) is None
    assert read_call('{"name": "order", "arguments": {"qty": 3}}', ToolSpec(TOOLS, "none")) is None


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_forced_calls_validate(bundle_int4, backend):
    with Runtime.open(bundle_int4, backend=backend) as rt:
        for i, choice in enumerate(["required", {"type": "function", "function": {"name": "order"}}] * 3):
            r = rt.generate(None, messages=[{"role": "user", "content": INPUTS[i % 3]}], tools=SMALL,
                            tool_choice=choice, temperature=1.0, seed=i, max_tokens=80)
            assert r.stats.finish_reason == "eos" and r.tool_calls, r.text
            call = r.tool_calls[0]["function"]
            if isinstance(choice, dict):
                assert call["name"] == "order"
            fn = {t["function"]["name"]: t["function"] for t in SMALL}[call["name"]]
            jsonschema.validate(json.loads(call["arguments"]), fn["parameters"])
        r = rt.generate(None, messages=HISTORY, tools=SMALL, max_tokens=5)  # a tool result to answer
        assert r.stats.generated_tokens > 0


@pytest.mark.parametrize("kw, needle", [
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0]"),
    ({"tools": SMALL, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": SMALL, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [ORDER, ORDER]}, "same name"),
])
def test_bad_tools(bundle_int4, kw, needle):
    with Runtime.open(bundle_int4, backend="onnx") as rt:
        with pytest.raises(PrefixEdgeError, match=None) as e:
            rt.generate("support", messages=[{"role": "user", "content": "x"}], **kw)
        assert needle in str(e.value)


def test_server_tool_calls(client, server):
    msgs = [{"role": "user", "content": INPUTS[0]}]
    r = client.chat.completions.create(model="base", messages=msgs, tools=SMALL, tool_choice="required",
                                       max_tokens=80, temperature=1.0, seed=2)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None and c.message.tool_calls
    call = c.message.tool_calls[0]
    fn = {t["function"]["name"]: t["function"] for t in SMALL}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), fn["parameters"])
    # streamed: one tool_calls delta, then finish_reason tool_calls
    name, args, finish = "", "", None
    for chunk in client.chat.completions.create(model="base", messages=msgs, tools=SMALL, stream=True,
                                                tool_choice={"type": "function", "function": {"name": "order"}},
                                                max_tokens=80, temperature=1.0, seed=2):
        for ch in chunk.choices:
            for t in ch.delta.tool_calls or []:
                name += t.function.name or ""
                args += t.function.arguments or ""
            finish = ch.finish_reason or finish
    assert name == "order" and finish == "tool_calls"
    jsonschema.validate(json.loads(args), ORDER["function"]["parameters"])
    # the result goes back as history (assistant tool_calls + a tool message)
    msgs += [c.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "done"}]
    r2 = client.chat.completions.create(model="base", messages=msgs, tools=SMALL, max_tokens=8)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    bad = httpx.post(server + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                     json={"model": "base", "messages": msgs[:1], "tools": SMALL,
                           "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tool_choice"
    legacy = httpx.post(server + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                        json={"model": "base", "messages": msgs[:1], "functions": [{"name": "f"}]})
    assert legacy.status_code == 400 and legacy.json()["error"]["param"] == "functions"


def test_responses_api_function_tools(client):
    """/v1/responses: flat function tools, a forced call as a function_call item (streamed with
    its argument events), and function_call / function_call_output items as the history."""
    tools = [{"type": "function", **SMALL[0]["function"]}]
    r = client.responses.create(model="base", input="order some", tools=tools, tool_choice="required",
                                max_output_tokens=80, temperature=1.0)
    call = r.output[0]
    assert call.type == "function_call" and call.name == "order"
    jsonschema.validate(json.loads(call.arguments), ORDER["function"]["parameters"])
    kinds = [ev.type for ev in client.responses.create(
        model="base", input="order some", tools=tools, tool_choice={"type": "function", "name": "order"},
        max_output_tokens=80, temperature=1.0, stream=True)]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.done" in kinds
    follow = client.responses.create(model="base", tools=tools, max_output_tokens=8, input=[
        {"role": "user", "content": "order some"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "ordered"}])
    assert follow.status in ("completed", "incomplete") and follow.output
