"""Tool calls: rendering (a tool-aware template as transformers renders it, with tools, calls and
tool results; the fallback system message where the template has none), forced calls
constrained to their function's parameters on both engines (validated by jsonschema), reading
an answer as a call, and the server's tool_calls (plain and streamed) through the openai SDK."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from prefix_edge import PrefixEdgeError, Runtime
from prefix_edge.runtime.chat.tools import HEAD, CallWriter, ToolSpec, check_tools, constraint_options, for_template, guide, read_call

from .conftest import INPUTS
from .helpers.served import KEY, client, local, server  # noqa: F401  (the shared server's fixtures)

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
    from prefix_edge.runtime.chat.render import check_messages

    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_model))
    spec = check_tools(TOOLS, "auto")
    msgs, tools = for_template(check_messages(HISTORY), spec, True)
    got = render_chat(TOOL_TEMPLATE, msgs, True, dict(tok.special_tokens_map), tools)
    want = tok.apply_chat_template(HISTORY, tools=TOOLS, chat_template=TOOL_TEMPLATE, tokenize=False,
                                   add_generation_prompt=True, return_dict=False)
    assert got == want and "<tool_response>\nordered" in got
    assert read_call('<tool_call>\n{"name": "order", "arguments": {"qty": 2}}\n</tool_call>', spec)[0][
        "function"] == {"name": "order", "arguments": "{\"qty\": 2}"}


def test_a_tool_results_prompt_does_not_carry_the_clients_random_call_ids(bundle_int4):
    """OpenAI-shaped clients send no `name` on a tool message and make call ids at random: the
    fallback prompt names the function the result answers (the matching call's), so the same
    conversation with other ids is the same prompt, and its greedy answer the same; a result
    whose id matches no call says `tool`."""
    def history(ids):
        return [{"role": "user", "content": "3 mugs"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": ids[0], "type": "function", "function": {"name": "order", "arguments": "{\"qty\": 3}"}}]},
                {"role": "tool", "tool_call_id": ids[0], "content": "ordered"},
                {"role": "tool", "tool_call_id": ids[1], "content": "late"}]

    rng = random.Random(5)
    runs = [[f"call_{rng.getrandbits(96):024x}" for _ in range(2)] for _ in range(3)]
    with Runtime.open(bundle_int4, backend="gguf") as rt:
        spec = check_tools(SMALL, "auto")
        prompts = [rt.chat_input(None, history(ids), spec)[0] for ids in runs]
        text = rt.tokenizer.decode(list(prompts[0]), skip_special_tokens=False)
        assert "Tool result (order): ordered" in text and "Tool result (tool): late" in text, text
        assert all(list(p) == list(prompts[0]) for p in prompts[1:])
        answers = [rt.generate(None, messages=history(ids), tools=SMALL, max_tokens=8, use_prompt_cache=False).text
                   for ids in runs]
        assert answers[1:] == answers[:1] * 2


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
        assert "Tool result (order): ordered" in text and '{"name": "order", "arguments": {"qty": 3}}' in text
        assert "c1" not in text
        from prefix_edge.runtime.chat.render import check_messages

        msgs, _ = for_template(check_messages(HISTORY), spec, False)
        assert list(ids) == tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
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


def test_server_tool_calls(client, server, local):
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
    ref = local.generate(None, messages=msgs, tools=SMALL, max_tokens=8)
    assert r2.choices[0].message.content == (None if ref.tool_calls else ref.text)
    assert r2.choices[0].finish_reason == ("tool_calls" if ref.tool_calls else "length" if
                                           ref.stats.finish_reason == "length" else "stop")
    bad = httpx.post(server + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                     json={"model": "base", "messages": msgs[:1], "tools": SMALL,
                           "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tool_choice"
    legacy = httpx.post(server + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                        json={"model": "base", "messages": msgs[:1], "functions": [{"name": "f"}]})
    assert legacy.status_code == 400 and legacy.json()["error"]["param"] == "functions"


def test_responses_api_function_tools(client, local):
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
    ref = local.generate(None, tools=SMALL[:1], max_tokens=8, messages=[
        {"role": "user", "content": "order some"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id, "type": "function", "function": {
            "name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "ordered"}])
    assert follow.status == ("incomplete" if ref.stats.finish_reason == "length" else "completed")
    assert follow.output[0].status == follow.status  # the item is as complete as its response
    assert (follow.output_text if not ref.tool_calls else follow.output[0].arguments) == \
        (ref.text if not ref.tool_calls else ref.tool_calls[0]["function"]["arguments"])
    # the same history under other call ids: the same prompt (the output item's id aside, the same answer)
    again = client.responses.create(model="base", tools=tools, max_output_tokens=8, input=[
        {"role": "user", "content": "order some"},
        {"type": "function_call", "call_id": "call_0123456789abcdef01234567", "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": "call_0123456789abcdef01234567", "output": "ordered"}])
    assert again.usage.input_tokens == follow.usage.input_tokens
    assert [getattr(o, "arguments", None) or getattr(o, "content", None) and o.content[0].text for o in again.output] \
        == [getattr(o, "arguments", None) or getattr(o, "content", None) and o.content[0].text for o in follow.output]


STRICT = [{"type": "function", "function": {**ORDER["function"], "strict": True}}]


def test_strict_tools_in_auto_constrain_the_call(local):
    """tool_choice auto, a strict tool, the fallback prompt: the answer is text that does not
    start with '{', or a call whose arguments validate (llguidance's matcher on the grammar)."""
    import llguidance

    spec = guide(check_tools(STRICT, "auto"), False)
    assert spec.guided and not guide(check_tools(SMALL, "auto"), False).guided
    assert not guide(check_tools(STRICT, "auto"), True).guided  # a native template's own syntax
    g = local.grammars.grammar("grammar", constraint_options({}, spec)["grammar"])

    def accepts(text: str) -> bool:
        m = llguidance.LLMatcher(local.grammars._tokenizer(), g, log_level=0)
        ids = local.tokenizer.encode(text, add_special_tokens=False).ids
        return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()

    assert accepts('{"name": "order", "arguments": {"qty": 3}}') and accepts("Sure, three.") and accepts("")
    assert not accepts('{"name": "order", "arguments": {"qty": 30}}')  # maximum 9
    assert not accepts('{"name": "nope", "arguments": {}}') and not accepts('{"qty": 3}')
    for seed in range(4):  # sampled answers: each one text or a valid call
        r = local.generate(None, messages=[{"role": "user", "content": INPUTS[seed % 3]}], tools=STRICT,
                           temperature=1.5, seed=seed, max_tokens=60)
        if r.text.lstrip().startswith("{") and r.stats.finish_reason == "eos":
            assert r.tool_calls, r.text
            jsonschema.validate(json.loads(r.tool_calls[0]["function"]["arguments"]), ORDER["function"]["parameters"])


FORCE = {"type": "function", "function": {"name": "order"}}


def _forced(local, max_tokens=80):
    return local.generate(None, messages=[{"role": "user", "content": INPUTS[0]}], tools=SMALL,
                          tool_choice=FORCE, max_tokens=max_tokens)


def test_forced_call_cut_by_max_tokens_is_a_partial_call(client, local):
    """A call cut by max_tokens: a call (the arguments written so far), finish reason length,
    in process, through the server and streamed; the same call streamed whole sends its id
    and name first, then the arguments in fragments that join to the non-streamed ones."""
    full = _forced(local)
    assert full.stats.finish_reason == "eos" and full.tool_calls
    n = len(full.tokens) - 3
    cut = _forced(local, n)
    assert cut.stats.finish_reason == "length" and full.text.startswith(cut.text)
    head = HEAD.match(cut.text)
    assert head and cut.tool_calls[0]["function"] == {"name": "order", "arguments": cut.text[head.end():]}
    msgs = [{"role": "user", "content": INPUTS[0]}]
    for max_tokens, ref in ((80, full), (n, cut)):
        r = client.chat.completions.create(model="base", messages=msgs, tools=SMALL, tool_choice=FORCE,
                                           max_tokens=max_tokens)
        c = r.choices[0]
        assert c.finish_reason == ("tool_calls" if ref is full else "length")
        assert c.message.tool_calls[0].function.arguments == ref.tool_calls[0]["function"]["arguments"]
        deltas, finish = [], None
        for chunk in client.chat.completions.create(model="base", messages=msgs, tools=SMALL, stream=True,
                                                    tool_choice=FORCE, max_tokens=max_tokens):
            for ch in chunk.choices:
                deltas += ch.delta.tool_calls or []
                assert not ch.delta.content
                finish = ch.finish_reason or finish
        assert finish == c.finish_reason and deltas[0].id and deltas[0].function.name == "order"
        assert len(deltas) > 2 and all(d.function.name is None for d in deltas[1:])
        assert "".join(d.function.arguments or "" for d in deltas) == ref.tool_calls[0]["function"]["arguments"]


def test_responses_streams_a_forced_call_and_marks_a_cut_one_incomplete(client, local):
    tools = [{"type": "function", **SMALL[0]["function"]}]
    full = _forced(local)
    events = list(client.responses.create(model="base", input=INPUTS[0], tools=tools, stream=True,
                                          tool_choice={"type": "function", "name": "order"}, max_output_tokens=80))
    parts = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"][0]
    assert len(parts) > 2 and "".join(parts) == done.arguments == full.tool_calls[0]["function"]["arguments"]
    assert events[-1].type == "response.completed" and events[-1].response.output[0].status == "completed"
    r = client.responses.create(model="support", input=INPUTS[1], max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete"


def test_call_writer_joins_to_the_call_at_any_chunking():
    text = '{"name": "order", "arguments": {"a": {"b": "x}"}, "c": [1, 2]}}'
    spec = check_tools(SMALL, "required")
    for step in (1, 2, 5, len(text)):
        w = CallWriter()
        fed = [w.feed(text[i:i + step]) for i in range(0, len(text), step)] + [w.end()]
        assert all(len(d) <= 1 for d in fed)  # one entry per index per chunk
        out = [d for ds in fed for d in ds]
        assert out[0]["function"]["name"] == "order" and out[0]["id"] == w.id
        assert all("id" not in d and "name" not in d["function"] for d in out[1:])
        assert "".join(d["function"]["arguments"] for d in out) == read_call(text, spec)[0]["function"]["arguments"]
    w = CallWriter()
    cut = w.feed(text[:40]) + w.end()  # cut short: everything written is the arguments
    assert "".join(d["function"]["arguments"] for d in cut) == text[len('{"name": "order", "arguments": '):40]



def _pydantic_tools():
    """Tools as pydantic writes them (openai.pydantic_function_tool, strict): an Enum and a list
    of models under `$defs`; `Unit` defined by both tools."""
    import enum

    import openai
    from pydantic import BaseModel, Field

    class Unit(str, enum.Enum):
        C = "C"
        F = "F"

    class Item(BaseModel):
        qty: int = Field(ge=1, le=9)

    class Order(BaseModel):
        items: list[Item] = Field(max_length=1)
        unit: Unit

    class Temp(BaseModel):
        unit: Unit

    return {"Order": Order, "Temp": Temp}, [openai.pydantic_function_tool(Order), openai.pydantic_function_tool(Temp)]


def test_defs_move_to_the_call_schema_root(bundle_int4):
    """Each tool's `$defs` at the call schema's root, renamed where two tools share a name, its
    references following: the schema compiles (llguidance) and a call of either tool validates."""
    from prefix_edge.runtime.chat.tools import call_schema

    models, tools = _pydantic_tools()
    schema = call_schema(check_tools(tools, "required"))
    assert set(schema["$defs"]) == {"Item", "Unit", "Unit_2"} and "$defs" not in json.dumps(schema["anyOf"]).replace('"#/$defs/', "")
    for call in ({"name": "Order", "arguments": {"items": [{"qty": 2}], "unit": "C"}},
                 {"name": "Temp", "arguments": {"unit": "F"}}):
        jsonschema.validate(call, schema)
        models[call["name"]].model_validate(call["arguments"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "Temp", "arguments": {"unit": "K"}}, schema)
    with Runtime.open(bundle_int4, backend="onnx") as rt:  # llguidance compiles it (a bad ref is a 400 there)
        rt.grammars.constraint({"json_schema": schema, "regex": None, "grammar": None}, None)


def test_pydantic_tools_with_defs_are_called_valid(client, local):
    """A pydantic tool with `$defs` (it pointed at nothing when nested under arguments: a 400
    blaming response_format): forced through the openai SDK, the call parses as the model, and
    equals the library's. (The smaller tool: the tiny model's 512 positions hold its rendering.)"""
    models, tools = _pydantic_tools()
    msgs = [{"role": "user", "content": "hot?"}]
    choice = {"type": "function", "function": {"name": "Temp"}}
    r = client.chat.completions.create(model="base", messages=msgs, tools=tools[1:], tool_choice=choice,
                                       max_tokens=60, temperature=0.0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    call = c.message.tool_calls[0].function
    assert call.name == "Temp"
    models["Temp"].model_validate_json(call.arguments)
    ref = local.generate(None, messages=msgs, tools=tools[1:], tool_choice=choice, max_tokens=60)
    assert ref.tool_calls[0]["function"]["arguments"] == call.arguments


def test_a_streamed_call_has_one_entry_per_index_per_chunk(client, server):
    """A streamed forced call in OpenAI's chunk shape: never two tool_calls entries of one index
    in one chunk (the first used to carry id+name and then the first argument bytes), so the
    openai SDK's stream helper assembles and parses it."""
    msgs = [{"role": "user", "content": INPUTS[0]}]
    choice = {"type": "function", "function": {"name": "order"}}
    chunks = 0
    with httpx.stream("POST", server + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "base", "messages": msgs, "tools": SMALL, "tool_choice": choice,
                            "stream": True, "max_tokens": 80, "temperature": 0.0}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for ch in json.loads(line[6:])["choices"]:
                idx = [t["index"] for t in ch["delta"].get("tool_calls") or []]
                assert len(idx) == len(set(idx)), ch
                chunks += bool(idx)
    assert chunks >= 2  # the id and name, then arguments in later chunks
    with client.chat.completions.stream(model="base", messages=msgs, tools=SMALL, tool_choice=choice,
                                        max_tokens=80, temperature=0.0) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert call.function.name == "order" and final.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), ORDER["function"]["parameters"])
