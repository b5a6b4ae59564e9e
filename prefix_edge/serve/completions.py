"""POST /v1/chat/completions and /v1/completions: a body → runtime requests → OpenAI's JSON or
SSE chunks.

A chat request's messages are the conversation (rendered by the model's chat template after
the task's prefix; the turn cache resumes it after the previous turn). `n` choices share one
prefill; `logprobs` report the model's own log-probabilities. The body is parsed, checked and
tokenized in a worker thread; a waiting response holds no thread; a client that goes away
cancels its request(s) at once.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import Request

from ..errors import RuntimeBusy, RuntimeClosed
from ..runtime.chat.tools import ENDED, AnswerRouter
from .auth import cache_scope, tenant_of
from .calls import DISCONNECTED, LogprobFormat, admit, merged, sse, start, step_error, task_of, watch_disconnect
from .fields import COMPLETION_FIELDS, check_fields, read_body, refuse_unknown
from .schema import ApiError, chat_messages, completion_params
from .tasks import LiveTasks

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop", "timeout": "length"}


def usage(results: list, n: int | None = None) -> dict:
    """Usage of choices `n` a prompt (the prompts' tokens counted once each, in order)."""
    firsts = results[::n or len(results)]
    prompt = sum(r.stats.prefix_tokens + r.stats.input_tokens for r in firsts)
    out = sum(x.stats.generated_tokens for x in results)
    use = {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out,
           "prompt_tokens_details": {"cached_tokens": sum(r.stats.cached_tokens for r in firsts)}}
    drafted = sum(x.stats.drafted_tokens for x in results)
    if drafted:  # speculative="lookup": OpenAI's fields for predicted tokens kept and dropped
        accepted = sum(x.stats.accepted_tokens for x in results)
        use["completion_tokens_details"] = {"accepted_prediction_tokens": accepted,
                                            "rejected_prediction_tokens": drafted - accepted}
    return use


class Completions:
    def __init__(self, rt, metrics, state, error):
        self.rt, self.metrics, self.state, self.error = rt, metrics, state, error
        self.tasks = LiveTasks(rt)  # created and deleted at run time too
        self.lp = LogprobFormat(rt)

    def parse(self, raw: bytes, chat: bool, tenant: str | None = None) -> tuple:
        """In a worker thread: the body parsed and checked, and the request started. An
        ApiError carries the model (for /metrics) once it is known."""
        seen = {"model": ""}
        try:
            body = read_body(raw)
            check_fields(body, COMPLETION_FIELDS)
            task = task_of(body, self.tasks, seen, self.state.aliases)
            prompts = None if chat else prompts_of(body)
            messages = chat_messages(body) if chat else None
            refuse_unknown(body, COMPLETION_FIELDS)
            opts, stream, include_usage, n = completion_params(body, chat)
            scope = cache_scope(tenant, body.get("prompt_cache_key"))
            if scope is not None:
                opts["cache_scope"] = scope
            if chat:
                handles = start(self.rt, task, None, messages, opts, n, "messages")
            else:
                handles = start_prompts(self.rt, task, prompts, opts, n)
            return seen["model"], (handles, n), stream, include_usage
        except (ApiError, RuntimeBusy, RuntimeClosed) as e:
            e.model = seen["model"]
            raise

    async def __call__(self, request: Request, chat: bool):
        state, metrics, error = self.state, self.metrics, self.error
        got = await admit(request, state, metrics, error, self.parse, chat, tenant_of(request))
        if not isinstance(got, tuple):
            return got
        model, (handles, per), stream, include_usage = got  # per: choices a prompt
        state.live.update(handles)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if stream:
            return sse(self._sse(handles, rid, model, chat, include_usage, per))
        watcher = asyncio.create_task(watch_disconnect(request, handles))
        try:
            results = [None] * len(handles)
            async for i, kind, value in merged(handles):
                if kind == "error":
                    for h in handles:
                        h.cancel()
                    e = step_error(value)  # 400: the call's own; 500: the engine's
                    metrics.count(model, e.status)
                    return error(e.status, e.message, e.type, e.param)
                if kind == "done":
                    results[i] = value
        finally:
            watcher.cancel()
            state.live.difference_update(handles)
        reasons = {r.stats.finish_reason for r in results}
        if "disconnected" in reasons:
            metrics.count(model, DISCONNECTED)
            metrics.disconnected += 1
            return error(400, "the client disconnected", code="client_disconnected")  # nobody reads it
        if "shutdown" in reasons:
            metrics.count(model, 503)
            return error(503, "the server shut down before this request finished", "server_error",
                         None, "server_shutdown", {"Retry-After": "5"})
        for r in results:
            metrics.observe(model, r)
        choices = []
        for i, r in enumerate(results):
            choice: dict[str, Any] = {"index": i, "finish_reason": FINISH.get(r.stats.finish_reason, "stop")}
            lp = r.logprobs if handles[i].logprobs_on else None
            if chat and r.tool_calls:  # a call cut by max_tokens keeps finish "length"
                if r.stats.finish_reason in ENDED:
                    choice["finish_reason"] = "tool_calls"
                choice.update(message={
                    "role": "assistant", "content": None, "refusal": None, "tool_calls": r.tool_calls})
                choice["logprobs"] = None
            elif chat:
                choice["message"] = {"role": "assistant", "content": r.text, "refusal": None}
                choice["logprobs"] = {"content": self.lp.chat(lp), "refusal": None} if lp is not None else None
            else:
                choice.update(text=r.text, logprobs=self.lp.completion(lp) if lp is not None else None)
            choices.append(choice)
        return {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": model, "choices": choices,
                "usage": usage(results, per), "system_fingerprint": None}

    async def _sse(self, handles: list, rid: str, model: str, chat: bool, include_usage: bool,
                   per: int | None = None):
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        metrics, state = self.metrics, self.state
        sent = [0] * len(handles)  # logprob entries already sent, per choice

        def frame(choices: list, use: dict | None = None) -> str:
            obj = {"id": rid, "object": kind, "created": created, "model": model, "choices": choices}
            if include_usage:
                obj["usage"] = use
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        def delta(i: int, text: str | None, finish: str | None, role: bool = False) -> dict:
            lp = None
            if handles[i].logprobs_on and not role:
                items = handles[i].logprobs[sent[i]:]
                sent[i] += len(items)
                lp = ({"content": self.lp.chat(items), "refusal": None} if chat
                      else self.lp.completion(items)) if items or finish is None else None
            if chat:
                d: dict = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
                return {"index": i, "delta": d, "logprobs": lp, "finish_reason": finish}
            return {"index": i, "text": text or "", "logprobs": lp, "finish_reason": finish}

        def failure(message: str, type_: str, code: str | None, param: str | None = None) -> str:
            err = {"error": {"message": message, "type": type_, "param": param, "code": code}}
            return f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n"

        results = [None] * len(handles)
        # tools offered: text or a call, decided as the answer streams (tools.AnswerRouter)
        routers = [AnswerRouter(h.tools_guided) if chat and h.tools_offered else None for h in handles]

        def calls(i: int, deltas: list) -> str:
            return frame([{"index": i, "delta": {"tool_calls": deltas}, "logprobs": None, "finish_reason": None}])

        try:
            if chat:
                yield frame([delta(i, None, None, role=True) for i in range(len(handles))])
            async for i, what, value in merged(handles):
                if what == "error":
                    e = step_error(value)  # 400: the call's own; 500: the engine's
                    metrics.count(model, e.status)
                    yield failure(e.message, e.type, None, e.param)
                    return
                router = routers[i]
                if what == "text":
                    text, deltas = router.feed(value) if router else (value, [])
                    if deltas:
                        yield calls(i, deltas)
                    if text:
                        yield frame([delta(i, text, None)])
                    continue
                results[i] = value
                stopped = value.stats.finish_reason
                text, deltas = router.end() if router else ("", [])
                is_call = router is not None and router.streamed_call
                if deltas:
                    yield calls(i, deltas)
                elif not is_call and value.tool_calls and stopped != "shutdown":  # held: a call after all
                    yield calls(i, [{"index": k, **c} for k, c in enumerate(value.tool_calls)])
                    is_call = True
                if text and not is_call:
                    yield frame([delta(i, text, None)])
                if stopped == "shutdown":  # never a silent cut: the client sees why
                    metrics.count(model, 503)
                    yield failure("the server shut down before this answer finished", "server_error",
                                  "server_shutdown")
                    return
                metrics.observe(model, value)
                finish = FINISH.get(stopped, "stop")
                if is_call:
                    finish = "tool_calls" if value.tool_calls and stopped in ENDED else finish
                    yield frame([{"index": i, "delta": {}, "logprobs": None, "finish_reason": finish}])
                else:
                    yield frame([delta(i, None, finish)])
            if include_usage:
                yield frame([], usage(results, per))
            yield "data: [DONE]\n\n"
        finally:
            state.live.difference_update(handles)
            if not all(h.done for h in handles):  # the client went away: stop generating for it
                for h in handles:
                    h.cancel("disconnected")
                metrics.count(model, DISCONNECTED)
                metrics.disconnected += 1


MAX_PROMPTS = 64  # prompts in one /v1/completions body (each is a request of its own)
PROMPT_SHAPE = "`prompt` must be a string, a list of strings, token ids (a list of integers) or a list of such lists"


def _ids(x) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def prompts_of(body: dict) -> list:
    """OpenAI's `prompt`: a string, a list of strings, token ids or a list of token-id lists, as
    a list of prompts (each a string or a list of ids)."""
    p = body.get("prompt")
    if isinstance(p, str) or _ids(p):
        return [p]
    if not isinstance(p, list) or not p:
        raise ApiError(400, PROMPT_SHAPE + (", not an empty list" if p == [] else ""), "prompt")
    if len(p) > MAX_PROMPTS:
        raise ApiError(400, f"`prompt` has {len(p)} prompts; at most {MAX_PROMPTS} in one request", "prompt")
    for i, x in enumerate(p):
        if not (isinstance(x, str) or _ids(x)) or type(x) is not type(p[0]):
            raise ApiError(400, PROMPT_SHAPE + f": `prompt[{i}]` is " + (
                "an empty list" if x == [] else "not one of those (nor of its first item's kind)"), "prompt")
    return p


def start_prompts(rt, task, prompts: list, opts: dict, n: int) -> list:
    """Every prompt's n choices, in order (choice index = prompt index * n + j, as OpenAI
    numbers them); one refused cancels those started."""
    handles: list = []
    try:
        for i, p in enumerate(prompts):
            try:
                handles += start(rt, task, p, None, opts, n, "prompt")
            except ApiError as e:
                if len(prompts) > 1:
                    e.message = f"prompt[{i}]: {e.message}"
                    e.args = (e.message,)
                raise
    except BaseException:
        for h in handles:
            h.cancel()
        raise
    return handles
