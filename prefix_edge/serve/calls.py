"""The serving base every endpoint builds on: a call's model resolved to a task, its body
admitted (read, parsed in a worker thread, errors and overload mapped to OpenAI-shaped
responses), the runtime's streams started with its errors naming the request's field, the
choices' events merged, a hang-up watched, SSE, and the engine's logprobs in OpenAI's shapes.
completions.py (chat/completions, completions), responses.py and embeddings.py use it; none of
them imports another.
"""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..errors import ContextLengthExceeded, EngineError, PrefixEdgeError, RuntimeBusy, RuntimeClosed
from ..options import OptionError
from .schema import ApiError, api_error

DISCONNECTED = 499  # counted in /metrics for a client that left before its answer
BASE_MODEL = "base"  # the bundle's model itself, no task prefix (a plain chat model)


def task_of(body: dict, tasks, seen: dict, aliases: dict | None = None) -> str | None:
    """The task a body's `model` names (None: the base model); `aliases` (serve --alias):
    other names of a task or of the base model. `seen["model"]`: the name as the client sent
    it (the response and /metrics say that one)."""
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "`model` is required: a task name (GET /v1/models)", "model")
    target = (aliases or {}).get(model, model)
    if target not in tasks and target != BASE_MODEL:
        raise ApiError(404, f"the model `{model}` does not exist; this server's models "
                       f"(tasks) are: {', '.join(sorted([*tasks, *(aliases or {})]))}, {BASE_MODEL}",
                       "model", "model_not_found")
    seen["model"] = model
    return None if target == BASE_MODEL and target not in tasks else target


# the runtime's names of a call's input (a PrefixEdgeError's `param`, an OptionError's field):
# the request's input field (`messages`, `prompt` or `input`)
INPUT_ARGS = ("messages", "text", "the input")


def start(rt, task, text, messages, opts: dict, n: int, param: str) -> list:
    """The runtime's streams for one body (AsyncStreams), runtime errors as ApiErrors naming
    the field the error names (`param`, the request's input field, where it names none)."""
    from ..runtime.stream import AsyncStream

    try:
        return [AsyncStream(s) for s in rt.choices(task, text, messages=messages, n=n, **opts)]
    except (RuntimeBusy, RuntimeClosed):
        raise
    except ContextLengthExceeded as e:
        raise ApiError(400, str(e), param, "context_length_exceeded")
    except OptionError as e:
        raise api_error(e, dict.fromkeys(INPUT_ARGS, param))
    except PrefixEdgeError as e:
        raise ApiError(400, str(e), param if e.param in (None, *INPUT_ARGS) else e.param)


def step_error(e: BaseException, names: dict[str, str] | None = None) -> ApiError:
    """An error a running call met, as what the server answers — decided here, once, by its kind:
    the call's own option failing at a step (OptionError: its field named) or anything else
    about the call itself (a PrefixEdgeError: e.g. more KV cells than the cache has) is the
    caller's, 400; the engine failing, or a bug (EngineError, any other exception), 500
    ("server_error"). `names`: the runtime's field names as the endpoint's request spells them."""
    if isinstance(e, OptionError):
        return api_error(e, names)
    if isinstance(e, PrefixEdgeError) and not isinstance(e, EngineError):
        return ApiError(400, str(e), (names or {}).get(e.param, e.param))
    err = ApiError(500, str(e) if isinstance(e, PrefixEdgeError) else f"internal error: {type(e).__name__}")
    err.type = "server_error"
    return err


class LogprobFormat:
    """Engine (id, logprob, alternatives) → OpenAI's logprobs entries."""

    def __init__(self, rt):
        self.rt = rt  # rt.token_bytes is built on the first logprobs request, not at start

    def entry(self, tid: int, lp: float) -> dict:
        b = self.rt.token_bytes(tid)
        return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}

    def chat(self, items: list) -> list:
        return [{**self.entry(t, lp), "top_logprobs": [self.entry(a, alp) for a, alp in alts]}
                for t, lp, alts in items]

    def completion(self, items: list, offset: int = 0) -> dict:
        toks, lps, tops, offs = [], [], [], []
        for t, lp, alts in items:
            e = self.entry(t, lp)
            toks.append(e["token"])
            lps.append(lp)
            tops.append({self.entry(a, alp)["token"]: alp for a, alp in alts})
            offs.append(offset)
            offset += len(e["token"])
        return {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs}


async def merged(handles: list):
    """(index, kind, value) from every choice as it comes: kind "text" (value a chunk), then
    "done" (value its Result) or "error" (value the PrefixEdgeError)."""
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i, h):
        try:
            async for chunk in h:
                await q.put((i, "text", chunk))
            await q.put((i, "done", h.result))
        except PrefixEdgeError as e:
            await q.put((i, "error", e))

    pumps = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    left = len(handles)
    try:
        while left:
            item = await q.get()
            if item[1] != "text":
                left -= 1
            yield item
    finally:
        for p in pumps:
            p.cancel()


async def admit(request: Request, state, metrics, error, parse, *args):
    """A POST's body read and handed to parse(raw, *args) in a worker thread: its result, or
    the error response (503 while draining, the ApiError's 4xx, 429 busy, 503 closed)."""
    if state.draining:
        return error(503, "the server is shutting down", "server_error", None, "unavailable",
                     {"Retry-After": "5", "Connection": "close"})
    raw = await request.body()
    try:
        return await asyncio.to_thread(parse, raw, *args)
    except ApiError as e:
        metrics.count(e.model, e.status)
        return error(e.status, e.message, param=e.param, code=e.code)
    except RuntimeBusy as e:
        metrics.count(e.model, 429)
        return error(429, str(e), "rate_limit_error", None, "overloaded", {"Retry-After": "1"})
    except RuntimeClosed as e:
        metrics.count(e.model, 503)
        return error(503, str(e), "server_error", None, "unavailable", {"Retry-After": "5"})


def sse(events) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def watch_disconnect(request: Request, handles: list) -> None:
    """Cancel the request(s) as soon as the client's connection goes away (its body is read:
    the next ASGI message is the disconnect)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            for h in handles:
                h.cancel("disconnected")
            return


async def disconnected(request: Request) -> None:
    """Returns once the client's connection has gone (its body is read: the next ASGI
    message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
