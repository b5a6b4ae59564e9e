"""POST /v1/responses (and GET / DELETE /v1/responses/{id}): OpenAI's Responses API, the text
subset the openai SDK, its agents and LangChain's Responses path send.

`input` is a string (one user message) or a list of message items ({role, content} with
`input_text` / `output_text` parts, `type: "message"` optional); `instructions` is a system
message before them; `previous_response_id` continues a stored response (its input and output
come first; responses are kept in memory unless `store: false`, store.py: as JSON, so a chain
from one never changes it, the last MAX_STORED within STORED_BYTES).
Streaming sends the typed events (response.created ... response.output_text.delta ...
response.completed), each with its sequence_number. Function tools (`tools`, `tool_choice`)
work as on chat completions (runtime/chat/tools.py): a call is a `function_call` output item (with
`response.function_call_arguments.*` events when streamed; with tools offered an answer is held
until it is clearly a message; a guided call streams its arguments as they are written), and `function_call` / `function_call_output` input items are the
history. Every field's JSON shape is checked first (fields.py).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from ..errors import PrefixEdgeError, RuntimeBusy, RuntimeClosed
from ..options import CONSTRAINTS, OptionError
from ..runtime.chat.tools import AnswerRouter
from .auth import cache_scope, tenant_of
from .calls import DISCONNECTED, LogprobFormat, admit, sse, start, step_error, task_of, watch_disconnect
from .fields import RESPONSE_FIELDS, check_fields, read_body, refuse_unknown
from .schema import ApiError, completion_params, response_format
from .store import MAX_STORED, StoredResponses
from .tasks import LiveTasks

# the runtime's (and chat's) names of a call's fields as a Responses request spells them
NAMES = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}


def _copy(value):
    """A deep copy of stored JSON data (what the store holds never reaches a request)."""
    return json.loads(json.dumps(value))


def _messages(body: dict, history: list) -> list:
    """This request's conversation: `history` (a stored one's copy, itself never changed: a new
    list, new messages), `instructions` first, the input items after."""
    msgs = list(history)
    ins = body.get("instructions")
    if ins is not None:
        if not isinstance(ins, str):
            raise ApiError(400, "`instructions` must be a string", "instructions")
        msgs = [{"role": "system", "content": ins}] + msgs  # not carried to a next response
    inp = body.get("input")
    if isinstance(inp, str):
        return msgs + [{"role": "user", "content": inp}]
    if not isinstance(inp, list) or not inp:
        raise ApiError(400, "`input` must be a string or a non-empty list of message items", "input")
    for i, item in enumerate(inp):
        if not isinstance(item, dict):
            raise ApiError(400, f"`input[{i}]` must be an object", "input")
        kind = item.get("type", "message")
        if kind == "function_call":  # an earlier call: an assistant turn with tool_calls
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            last = msgs[-1] if msgs else {}
            if last.get("role") == "assistant" and last.get("tool_calls"):
                msgs[-1] = {**last, "tool_calls": [*last["tool_calls"], call]}
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out = item.get("output")
            msgs.append({"role": "tool", "tool_call_id": item.get("call_id"),
                         "content": out if isinstance(out, (str, list)) else json.dumps(out)})
        elif kind == "message":
            msgs.append({"role": item.get("role"), "content": item.get("content")})
        else:
            raise ApiError(400, f"`input[{i}]`: items of type {kind!r} are not supported (message, "
                           "function_call and function_call_output)", "input")
    return msgs


def _tools(body: dict) -> dict:
    """The Responses API's flat function tools → chat completions' {type, function} shape."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        return {"tools": None, "tool_choice": None if choice in (None, "auto", "none") else choice}
    if not isinstance(tools, list):
        raise ApiError(400, "`tools` must be a list of function tools", "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise ApiError(400, f"`tools[{i}]`: only function tools are supported, got {kind!r}", "tools")
        out.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                     if k in t}})
    if isinstance(choice, dict):
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return {"tools": out, "tool_choice": choice}


def stored_key(response_id: str, tenant: str | None) -> str:
    """Where a stored response is kept: a tenant reads, continues and deletes only its own."""
    return response_id if tenant is None else f"{tenant}\x1f{response_id}"


class Responses:
    def __init__(self, rt, metrics, state, error, stored=None):
        self.rt, self.metrics, self.state, self.error = rt, metrics, state, error
        self.tasks = LiveTasks(rt)  # created and deleted at run time too
        # id -> (response, messages): store.py's own, or an OrderedDict that also shares them
        # (cluster/store.py)
        self.stored = StoredResponses() if stored is None else stored
        self.lp = LogprobFormat(rt)

    def _missing(self, response_id: str):
        return self.error(404, f"no stored response `{response_id}`", param="response_id",
                          code="not_found")

    def get(self, response_id: str, tenant: str | None = None):
        key = stored_key(response_id, tenant)
        raw = self.stored.raw(key) if isinstance(self.stored, StoredResponses) else None
        if raw is not None:
            return Response(raw, media_type="application/json")  # as stored, byte for byte
        got = self.stored.get(key)
        return self._missing(response_id) if got is None else got[0]

    def delete(self, response_id: str, tenant: str | None = None):
        if self.stored.pop(stored_key(response_id, tenant), None) is None:
            return self._missing(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    def parse(self, raw: bytes, tenant: str | None = None) -> tuple:
        seen = {"model": ""}
        try:
            body = read_body(raw)
            refuse_unknown(body, RESPONSE_FIELDS)
            check_fields(body, RESPONSE_FIELDS)
            task = task_of(body, self.tasks, seen, self.state.aliases)
            tools = _tools(body)
            tx = body.get("text") or {}
            if not isinstance(tx, dict):
                raise ApiError(400, "`text` must be an object", "text")
            fmt = response_format(tx.get("format"), "text.format")
            history = []
            prev = body.get("previous_response_id")
            if prev is not None:
                got = self.stored.get(stored_key(prev, tenant))
                if got is None:
                    raise ApiError(404, f"no stored response `{prev}`", "previous_response_id",
                                   "previous_response_not_found")
                history = _copy(got[1])
            messages = _messages(body, history)
            sampling = {k: body[k] for k in ("temperature", "top_p", "seed", "documents", "compose_documents",
                                             "compose_recompute", "speculative") if k in body}
            if body.get("max_output_tokens") is not None:
                sampling["max_tokens"] = body["max_output_tokens"]
            top = body.get("top_logprobs")
            if top is not None:
                sampling.update(logprobs=True, top_logprobs=top)
            opts, _, _, _ = completion_params(sampling)
            opts.update(fmt, **tools)
            scope = cache_scope(tenant, body.get("prompt_cache_key"))
            if scope is not None:
                opts["cache_scope"] = scope
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise ApiError(400, "`stream` must be true or false", "stream")
            store = body.get("store", True) is not False
            handle = start(self.rt, task, None, messages, opts, 1, "input")[0]
            return seen["model"], handle, body, messages, stream, store
        except ApiError as e:
            e.param = NAMES.get(e.param, e.param)
            e.model = seen["model"]
            raise
        except (RuntimeBusy, RuntimeClosed) as e:
            e.model = seen["model"]
            raise

    def _response(self, rid: str, mid: str, model: str, body: dict, status: str, text: str | None,
                  result=None, call_id: str | None = None, cap: int | None = None) -> dict:
        """cap: the output tokens the request may write (its max_output_tokens, else its task's
        max_tokens, else what the context leaves), echoed as max_output_tokens: what an
        `incomplete` with reason max_output_tokens ran into."""
        incomplete = None
        if result is not None and result.stats.finish_reason in ("length", "timeout"):
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        done = "incomplete" if incomplete else "completed" if status != "in_progress" else "in_progress"
        out = []
        if result is not None and result.tool_calls:
            out = [{"type": "function_call", "id": "fc_" + (call_id or c["id"])[5:], "call_id": call_id or c["id"],
                    "status": done, "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                   for c in result.tool_calls]
        elif text is not None:
            part = {"type": "output_text", "text": text, "annotations": []}
            if result is not None and result.logprobs is not None:
                part["logprobs"] = self.lp.chat(result.logprobs)
            out = [{"type": "message", "id": mid, "status": done, "role": "assistant", "content": [part]}]
        use = None
        if result is not None:
            s = result.stats
            n_in = s.prefix_tokens + s.input_tokens
            use = {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": s.cached_tokens},
                   "output_tokens": s.generated_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                   "total_tokens": n_in + s.generated_tokens}
        return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status,
                "model": model, "output": out, "usage": use, "error": None,
                "incomplete_details": incomplete, "instructions": body.get("instructions"),
                "max_output_tokens": body.get("max_output_tokens") if cap is None else cap,
                "temperature": body.get("temperature"), "top_p": body.get("top_p"),
                "parallel_tool_calls": body.get("parallel_tool_calls", True),
                "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [], "text": (body.get("text") or {"format": {"type": "text"}}),
                "previous_response_id": body.get("previous_response_id"),
                "store": body.get("store", True), "metadata": body.get("metadata") or {},
                "truncation": body.get("truncation", "disabled"), "reasoning": None,
                "user": body.get("user")}

    def _keep(self, rid: str, resp: dict, messages: list, text: str, store: bool, calls=None,
              tenant: str | None = None) -> None:
        if resp["instructions"] is not None:
            messages = messages[1:]
        if store:
            reply = {"role": "assistant", "content": None, "tool_calls": calls} if calls else \
                {"role": "assistant", "content": text}
            self.stored[stored_key(rid, tenant)] = (resp, messages + [reply])  # store.py keeps it as JSON, in its budgets
            while not isinstance(self.stored, StoredResponses) and len(self.stored) > MAX_STORED:
                self.stored.popitem(last=False)  # an OrderedDict given instead

    async def create(self, request: Request):
        state, metrics, error = self.state, self.metrics, self.error
        tenant = tenant_of(request)
        got = await admit(request, state, metrics, error, self.parse, tenant)
        if not isinstance(got, tuple):
            return got
        model, h, body, messages, stream, store = got
        state.live.add(h)
        rid, mid = "resp_" + uuid.uuid4().hex[:24], "msg_" + uuid.uuid4().hex[:24]
        if stream:
            return sse(self._events(h, rid, mid, model, body, messages, store, tenant))
        watcher = asyncio.create_task(watch_disconnect(request, [h]))
        parts = []
        try:
            async for chunk in h:
                parts.append(chunk)
        except OptionError as e:  # the request's own option (text.format) failed at a step
            metrics.count(model, 400)
            return error(400, str(e), param="text.format" if e.field in CONSTRAINTS else e.field)
        except PrefixEdgeError as e:  # 400: about the call itself; 500: the engine's (calls.step_error)
            err = step_error(e, NAMES)
            metrics.count(model, err.status)
            return error(err.status, err.message, err.type, err.param)
        finally:
            watcher.cancel()
            state.live.discard(h)
        r = h.result
        if r.stats.finish_reason in ("disconnected", "shutdown"):
            metrics.count(model, DISCONNECTED if r.stats.finish_reason == "disconnected" else 503)
            return error(503, "the request was cut before it finished", "server_error", None,
                         r.stats.finish_reason)
        metrics.observe(model, r)
        resp = self._response(rid, mid, model, body, "completed", r.text, r, cap=h.max_tokens)
        self._keep(rid, resp, messages, r.text, store, r.tool_calls, tenant)
        return resp

    async def _events(self, h, rid, mid, model, body, messages, store, tenant=None):
        seq = 0

        def event(kind: str, **data: Any) -> str:
            nonlocal seq
            obj = {"type": kind, "sequence_number": seq, **data}
            seq += 1
            return f"event: {kind}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"

        where = {"item_id": mid, "output_index": 0, "content_index": 0}
        parts, sent = [], 0
        try:
            start_resp = self._response(rid, mid, model, body, "in_progress", None, cap=h.max_tokens)
            yield event("response.created", response=start_resp)
            yield event("response.in_progress", response=start_resp)
            router = AnswerRouter(h.tools_guided) if h.tools_offered else None
            source, rest = [], router is None  # rest: stream the remaining chunks as the message

            def call_events(deltas: list):
                for d in deltas:  # the head of a call (its id and name), then argument fragments
                    fc = "fc_" + router.writer.id[5:]
                    if d.get("id"):
                        yield event("response.output_item.added", output_index=0, item={
                            "type": "function_call", "id": fc, "call_id": router.writer.id,
                            "status": "in_progress", "name": router.writer.name, "arguments": ""})
                    if d["function"].get("arguments"):  # the head may carry the first fragment
                        yield event("response.function_call_arguments.delta", item_id=fc, output_index=0,
                                    delta=d["function"]["arguments"])

            if router is not None:  # a call or a message: held until it is clearly one
                async for chunk in h:
                    text, deltas = router.feed(chunk)
                    for e in call_events(deltas):
                        yield e
                    if text:  # a message: streamed from here
                        source, rest = [text], True
                        break
                else:
                    text, deltas = router.end()
                    for e in call_events(deltas):
                        yield e
                    source = [text] if text else []
            r = h.result
            streamed = router is not None and router.streamed_call
            if r is not None and r.tool_calls and r.stats.finish_reason != "shutdown":
                resp = self._response(rid, mid, model, body, "completed", None, r,
                                      router.writer.id if streamed else None, cap=h.max_tokens)
                for k, item in enumerate(resp["output"]):
                    if not streamed:
                        yield event("response.output_item.added", output_index=k,
                                    item={**item, "arguments": "", "status": "in_progress"})
                        yield event("response.function_call_arguments.delta", item_id=item["id"],
                                    output_index=k, delta=item["arguments"])
                    yield event("response.function_call_arguments.done", item_id=item["id"],
                                output_index=k, arguments=item["arguments"])
                    yield event("response.output_item.done", output_index=k, item=item)
                self.metrics.observe(model, r)
                self._keep(rid, resp, messages, "", store, r.tool_calls, tenant)
                yield event("response.incomplete" if resp["status"] == "incomplete" else "response.completed",
                            response=resp)
                return
            if streamed:  # written as a call, not read as one (cut by a stop string): the text
                source = [router.writer.text]
            yield event("response.output_item.added", output_index=0, item={
                "type": "message", "id": mid, "status": "in_progress", "role": "assistant", "content": []})
            yield event("response.content_part.added", **where,
                        part={"type": "output_text", "text": "", "annotations": []})
            for chunk in source:
                parts.append(chunk)
                yield event("response.output_text.delta", **where, delta=chunk, logprobs=[])
            if rest:
                async for chunk in h:
                    parts.append(chunk)
                    lp = []
                    if h.logprobs_on:
                        items = h.logprobs[sent:]
                        sent += len(items)
                        lp = self.lp.chat(items)
                    yield event("response.output_text.delta", **where, delta=chunk, logprobs=lp)
            r = h.result
            text = "".join(parts)
            if r.stats.finish_reason == "shutdown":
                self.metrics.count(model, 503)
                yield event("error", code="server_shutdown", param=None,
                            message="the server shut down before this answer finished")
                return
            self.metrics.observe(model, r)
            part = {"type": "output_text", "text": text, "annotations": []}
            yield event("response.output_text.done", **where, text=text, logprobs=[])
            yield event("response.content_part.done", **where, part=part)
            resp = self._response(rid, mid, model, body, "completed", text, r, cap=h.max_tokens)
            yield event("response.output_item.done", output_index=0, item=resp["output"][0])
            self._keep(rid, resp, messages, text, store, tenant=tenant)
            yield event("response.incomplete" if resp["status"] == "incomplete" else "response.completed",
                        response=resp)
        except PrefixEdgeError as e:  # 400: about the call itself; 500: the engine's (calls.step_error)
            err = step_error(e, NAMES)
            self.metrics.count(model, err.status)
            yield event("error", code=err.type, param=err.param, message=err.message)
        finally:
            self.state.live.discard(h)
            if not h.done:
                h.cancel("disconnected")
                self.metrics.count(model, DISCONNECTED)
                self.metrics.disconnected += 1
