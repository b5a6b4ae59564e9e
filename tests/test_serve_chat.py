"""The server with the clients people use: conversations (system prompts, history) through the
official openai SDK (chat completions and the Responses API), LangChain's ChatOpenAI and
litellm, n choices, logprobs. Every answer is compared with the same request run in process
(Runtime.generate(messages=...)) on the same bundle and backend."""

from __future__ import annotations

import json
import os

import httpx
import openai
import pytest

from prefix_edge import Runtime

from .conftest import INPUTS
from .helpers.served import KEY, client, server  # noqa: F401  (the shared server's fixtures)

SYSTEM = "Answer in one short sentence."


@pytest.fixture(scope="module")
def local(bundle_int4):
    with Runtime.open(bundle_int4, backend="onnx", prompt_cache_bytes=0) as rt:
        yield rt


def _ref(local, task, messages, **kw):
    return local.generate(None if task == "base" else task, messages=messages, max_tokens=12, **kw)


@pytest.mark.parametrize("task", ["support", "base"])
def test_conversation_with_history_and_system(client, local, task):
    msgs = [{"role": "system", "content": SYSTEM}]
    cached = []
    hits_before = _prompt_cache_hits(client)
    for turn in INPUTS:
        msgs.append({"role": "user", "content": turn})
        r = client.chat.completions.create(model=task, messages=msgs, max_tokens=12)
        ref = _ref(local, task, msgs)
        assert r.choices[0].message.content == ref.text
        assert r.choices[0].finish_reason == {"eos": "stop", "length": "length"}[ref.stats.finish_reason]
        assert r.usage.prompt_tokens == ref.stats.prefix_tokens + ref.stats.input_tokens
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        msgs.append({"role": "assistant", "content": r.choices[0].message.content})
    # turn k resumed after turn k-1's prompt (the turn cache), not only after the task prefix
    assert cached[1] > cached[0] and cached[2] > cached[1]
    assert _prompt_cache_hits(client) - hits_before == len(INPUTS) - 1  # every turn after the first


def _prompt_cache_hits(client) -> int:
    hits = [ln for ln in httpx.get(client.base_url.join("/metrics").__str__().replace("/v1", ""),
                                   headers={"Authorization": f"Bearer {KEY}"})
            .text.splitlines() if ln.startswith("prefix_edge_prompt_cache_hits_total")]
    return int(hits[0].split()[1])


def test_streamed_choices_interleave(client, local):
    msgs = [{"role": "user", "content": INPUTS[0]}]
    text = {0: "", 1: ""}
    finish = {}
    for chunk in client.chat.completions.create(model="support", messages=msgs, max_tokens=12,
                                                n=2, stream=True):
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    ref = _ref(local, "support", msgs)
    want = {"eos": "stop", "length": "length"}[ref.stats.finish_reason]
    assert text == {0: ref.text, 1: ref.text} and finish == {0: want, 1: want}
    r = client.chat.completions.create(model="support", messages=msgs, max_tokens=12, n=3,
                                       temperature=1.0, seed=11)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for i, c in enumerate(r.choices):  # choice i: the lone request with seed + i
        assert c.message.content == _ref(local, "support", msgs, temperature=1.0, seed=11 + i).text
    assert r.usage.completion_tokens == sum(
        _ref(local, "support", msgs, temperature=1.0, seed=11 + i).stats.generated_tokens for i in range(3))


def test_logprobs(client, local):
    msgs = [{"role": "user", "content": INPUTS[1]}]
    ref = _ref(local, "support", msgs, logprobs=2)
    r = client.chat.completions.create(model="support", messages=msgs, max_tokens=12,
                                       logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert [round(x.logprob, 9) for x in content] == [round(lp, 9) for _, lp, _ in ref.logprobs]
    spelled = b"".join(bytes(x.bytes) for x in content).decode(errors="replace")
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):  # skipped in the text
        spelled = spelled.replace(special, "")
    assert spelled == r.choices[0].message.content
    assert all(len(x.top_logprobs) == 2 and x.top_logprobs[0].logprob == x.logprob for x in content)
    streamed = []
    for chunk in client.chat.completions.create(model="support", messages=msgs, max_tokens=12,
                                                logprobs=True, stream=True):
        for c in chunk.choices:
            if c.logprobs and c.logprobs.content:
                streamed += [x.logprob for x in c.logprobs.content]
    assert [round(x, 9) for x in streamed] == [round(lp, 9) for _, lp, _ in ref.logprobs]
    c = client.completions.create(model="support", prompt=INPUTS[1], max_tokens=12, logprobs=2)
    lp = c.choices[0].logprobs
    assert "".join(lp.tokens).startswith(c.choices[0].text) and len(lp.top_logprobs[0]) == 2
    assert lp.token_logprobs == [x.logprob for x in content]  # the same input, the same model


def test_responses_api(client, local, server):
    r = client.responses.create(model="support", instructions=SYSTEM, max_output_tokens=12,
                                input=[{"role": "user", "content": [{"type": "input_text", "text": INPUTS[0]}]}])
    ref = _ref(local, "support", [{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": INPUTS[0]}])
    assert r.output_text == ref.text and r.object == "response"
    assert r.status == ("incomplete" if ref.stats.finish_reason == "length" else "completed")
    assert r.usage.output_tokens == ref.stats.generated_tokens
    # previous_response_id: that response's input and output come first (not its instructions)
    r2 = client.responses.create(model="support", input=INPUTS[1], previous_response_id=r.id,
                                 max_output_tokens=12)
    ref2 = _ref(local, "support", [{"role": "user", "content": INPUTS[0]},
                                   {"role": "assistant", "content": r.output_text},
                                   {"role": "user", "content": INPUTS[1]}])
    assert r2.output_text == ref2.text
    assert client.responses.retrieve(r2.id).output_text == r2.output_text
    kinds, deltas = [], ""
    for ev in client.responses.create(model="base", input="hello there", max_output_tokens=64,
                                      stream=True):
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            deltas += ev.delta
    ref3 = local.generate(None, messages=[{"role": "user", "content": "hello there"}], max_tokens=64)
    assert deltas == ref3.text
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done",
                          "response.incomplete" if ref3.stats.finish_reason == "length" else "response.completed"]
    bad = httpx.post(server + "/v1/responses", headers={"Authorization": f"Bearer {KEY}"},
                     json={"model": "support", "input": [{"type": "computer_call", "action": {}}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    missing = httpx.post(server + "/v1/responses", headers={"Authorization": f"Bearer {KEY}"},
                         json={"model": "support", "input": "x", "previous_response_id": "resp_nope"})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "previous_response_id"


def test_responses_echo_the_cap_that_applied(client, local):
    """The client trial: a stream to a task ended `incomplete` (reason max_output_tokens) while
    echoing `max_output_tokens: null`; the cap was the task file's max_tokens. The response
    (created event, final one, and the stored one) echoes the cap that applied: the request's,
    else the task's, else what the context leaves."""
    task_cap = local.manifest.tasks["support"].defaults["max_tokens"]
    ref = local.generate("support", messages=[{"role": "user", "content": INPUTS[0]}])
    events = list(client.responses.create(model="support", input=INPUTS[0], stream=True))
    created, last = events[0].response, events[-1].response
    assert created.max_output_tokens == task_cap and last.max_output_tokens == task_cap
    assert last.status == ("incomplete" if ref.stats.finish_reason == "length" else "completed")
    if last.status == "incomplete":
        assert last.incomplete_details.reason == "max_output_tokens" and last.usage.output_tokens == task_cap
    assert client.responses.retrieve(last.id).max_output_tokens == task_cap
    assert client.responses.create(model="support", input=INPUTS[0], max_output_tokens=5).max_output_tokens == 5
    base = client.responses.create(model="base", input=INPUTS[0], max_output_tokens=None)
    assert base.max_output_tokens > 64  # the context's room, not null


def test_langchain_chat_openai(server, local):
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    chat = lc.ChatOpenAI(model="support", base_url=server + "/v1", api_key=KEY, max_tokens=12,
                         temperature=0, max_retries=0)
    first = chat.invoke([SystemMessage(SYSTEM), HumanMessage(INPUTS[0])])
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": INPUTS[0]}]
    assert first.content == _ref(local, "support", msgs).text
    history = [SystemMessage(SYSTEM), HumanMessage(INPUTS[0]), AIMessage(first.content), HumanMessage(INPUTS[2])]
    streamed = "".join(c.content for c in chat.stream(history))
    msgs += [{"role": "assistant", "content": first.content}, {"role": "user", "content": INPUTS[2]}]
    assert streamed == _ref(local, "support", msgs).text


def test_litellm(server, local):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    litellm = pytest.importorskip("litellm")
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": INPUTS[0]},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": INPUTS[1]}]
    r = litellm.completion(model="openai/support", api_base=server + "/v1", api_key=KEY,
                           messages=msgs, max_tokens=12, temperature=0)
    assert r.choices[0].message.content == _ref(local, "support", msgs).text


def test_raw_bodies_real_clients_send(server, local):
    """Shapes other clients send by default, as raw JSON: content parts, developer role,
    null fields, stream_options."""
    msgs = [{"role": "developer", "content": SYSTEM},
            {"role": "user", "content": [{"type": "text", "text": INPUTS[2]}]}]
    body = {"model": "support", "messages": msgs, "max_tokens": 12, "tools": None, "tool_choice": None,
            "stream": True, "stream_options": {"include_usage": True}, "n": 1, "logprobs": False}
    text, usage = "", None
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                obj = json.loads(line[6:])
                usage = obj.get("usage") or usage
                for c in obj["choices"]:
                    text += c["delta"].get("content") or ""
    ref = _ref(local, "support", [{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": INPUTS[2]}])
    assert text == ref.text and usage["completion_tokens"] == ref.stats.generated_tokens


@pytest.mark.parametrize("messages, param, code", [
    ([{"role": "user", "content": "hi " * 3000}], "messages", "context_length_exceeded"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b " * 800}] * 4
     + [{"role": "user", "content": "c"}], "messages", "context_length_exceeded"),
    ([{"role": "user"}], "messages", None),
    ([{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}, {"role": "user", "content": "x"}],
     "messages", None),
    ([{"content": "x"}], "messages", None),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:"}}]}], "messages", None),
])
def test_bad_conversations_are_400s(server, messages, param, code):
    r = httpx.post(server + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": "support", "messages": messages, "max_tokens": 4}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == code and "\n" not in err["message"]


def test_structured_output_with_the_sdk(client, local, server):
    """The openai SDK's `.parse` (chat completions and the Responses API) gets an object of its
    pydantic model; json_object gives JSON; the same constrained request in process gives the
    same text; a schema feature llguidance cannot do is a 400 naming response_format."""
    from typing import Literal, Optional

    from pydantic import BaseModel, Field

    class Order(BaseModel):
        name: Optional[str] = Field(max_length=8)
        quantity: int = Field(ge=0, le=99)
        size: Literal["S", "M", "L"]

    msgs = [{"role": "user", "content": INPUTS[1]}]
    r = client.chat.completions.parse(model="extract", messages=msgs, response_format=Order,
                                      max_tokens=80, temperature=1.0, seed=3)
    order = r.choices[0].message.parsed
    schema = openai.lib._pydantic.to_strict_json_schema(Order)
    ref = local.generate("extract", messages=msgs, json_schema=schema, max_tokens=80,
                         temperature=1.0, seed=3)
    assert r.choices[0].message.content == ref.text
    assert isinstance(order, Order) and order == Order.model_validate_json(ref.text)
    rr = client.responses.parse(model="support", input=INPUTS[0], text_format=Order,
                                max_output_tokens=80, temperature=1.0, extra_body={"seed": 5})
    ref = local.generate("support", messages=[{"role": "user", "content": INPUTS[0]}], json_schema=schema,
                         max_tokens=80, temperature=1.0, seed=5)
    assert rr.output_text == ref.text
    assert isinstance(rr.output_parsed, Order) and rr.output_parsed == Order.model_validate_json(ref.text)
    j = client.chat.completions.create(model="support", messages=msgs, max_tokens=80, temperature=1.0,
                                       seed=1, response_format={"type": "json_object"})
    ref = local.generate("support", messages=msgs, json_schema=True, max_tokens=80, temperature=1.0, seed=1)
    assert j.choices[0].message.content == ref.text
    assert j.choices[0].finish_reason == {"eos": "stop", "length": "length"}[ref.stats.finish_reason]
    if ref.stats.finish_reason == "eos":
        assert isinstance(json.loads(ref.text), dict)
    else:  # cut by max_tokens: an unfinished object
        assert ref.text.startswith("{")
    bad = httpx.post(server + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                     json={"model": "support", "messages": msgs, "response_format": {
                         "type": "json_schema", "json_schema": {"name": "x", "schema": {
                             "type": "string", "format": "no-such-format"}}}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format"
    assert "no-such-format" in bad.json()["error"]["message"]
    rx = client.chat.completions.create(model="support", messages=msgs, max_tokens=20,
                                        extra_body={"response_format": {"type": "regex", "regex": "(yes|no)"}})
    ref = local.generate("support", messages=msgs, max_tokens=20, regex="(yes|no)")
    assert rx.choices[0].message.content == ref.text and ref.stats.finish_reason == "eos"
    assert rx.choices[0].finish_reason == "stop" and ref.text in ("yes", "no")  # and the regex held
