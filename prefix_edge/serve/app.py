"""An OpenAI-compatible local server where a task is a model (FastAPI + uvicorn).

    GET  /health, /metrics (Prometheus text), /v1/models
    POST /v1/chat/completions, /v1/completions   (non-streaming, and SSE with stream=true)

One Runtime serves every request (its scheduler batches them). A chat request's input is its
one user message: the task's prefix *is* the conversation so far, so earlier turns and extra
system messages are refused with a 400 naming `messages`, never silently dropped. Errors have
OpenAI's shape: {"error": {"message", "type", "param", "code"}}; a client's mistake is a 4xx.

The event loop does no O(input) work: the body is parsed, checked and tokenized in a worker
thread, and a waiting response holds no thread (the engine thread wakes the loop). A client
that goes away cancels its request at once, streamed or not. Limits: limits.py; shutdown:
lifecycle.py.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from ..errors import ContextLengthExceeded, PrefixEdgeError, RuntimeBusy, RuntimeClosed
from .limits import BODY_TIMEOUT, MAX_BODY, BodyLimits
from .metrics import Metrics
from .schema import ApiError, check_strings, completion_params, chat_input

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop", "timeout": "length"}
DISCONNECTED = 499  # counted in /metrics for a client that left before its answer


class ServerState:
    """What shutdown needs to know: whether new requests are refused, the requests in flight,
    and how many of them were cut."""

    def __init__(self):
        self.draining = False
        self.live: set = set()
        self.readers: set = set()  # tasks still receiving a body (limits.BodyLimits)
        self.cut_requests = 0

    def cut(self, reason: str = "shutdown") -> None:
        """On the event loop: end every request still running or uploading."""
        for h in list(self.live):
            if not h.done:
                self.cut_requests += 1
                h.cancel(reason)
        for task in list(self.readers):
            task._prefix_edge_cut = True
            task.cancel()


def error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
          code: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status, headers=headers)


def create_app(rt, api_key: str | None = None, cors_origins: list[str] | None = None,
               max_body: int = MAX_BODY, body_timeout: float = BODY_TIMEOUT) -> FastAPI:
    app = FastAPI(title="prefix-edge", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = Metrics()
    state = ServerState()
    created = int(time.time())
    tasks = rt.tasks  # fixed for the runtime's life
    # the last one added runs first: body limits, then CORS (a preflight is answered before
    # any key check), then the key
    if api_key:  # a plain ASGI wrapper: BaseHTTPMiddleware would re-buffer streamed responses
        app.add_middleware(_BearerAuth, key=api_key)
    if cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=cors_origins, allow_methods=["*"],
                           allow_headers=["*"])
    app.add_middleware(BodyLimits, max_body=max_body, timeout=body_timeout, readers=state.readers)

    @app.get("/health")
    async def health():
        info = rt.engine_info()
        return {"status": "ok" if not rt.closed else "closed", "backend": info["backend"],
                "tasks": len(tasks), "active": info["active"], "waiting": info["waiting"]}

    @app.get("/metrics")
    async def prom():
        return PlainTextResponse(metrics.render(rt.engine_info()),
                                 media_type="text/plain; version=0.0.4")

    def model_card(name: str) -> dict:
        t = tasks[name]
        return {"id": name, "object": "model", "created": created, "owned_by": "prefix-edge",
                "kind": t.kind, "prefix_tokens": t.prefix_tokens,
                "prefix_bytes": sum(p.bytes for p in t.prefixes.values())}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(name) for name in sorted(tasks)]}

    @app.get("/v1/models/{model_id:path}")
    async def one_model(model_id: str):
        if model_id not in tasks:
            return error(404, f"the model `{model_id}` does not exist", param="model",
                         code="model_not_found")
        return model_card(model_id)

    from starlette.exceptions import HTTPException

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):  # 404/405 in OpenAI's shape
        what = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on "
                f"{request.url.path}"}.get(exc.status_code, str(exc.detail))
        return error(exc.status_code, what, code={404: "not_found", 405: "method_not_allowed"}
                     .get(exc.status_code), headers=getattr(exc, "headers", None))

    def parse(raw: bytes, chat: bool) -> tuple:
        """In a worker thread: the body parsed and checked, and the request started. An
        ApiError carries the model (for /metrics) once it is known."""
        seen = {"model": ""}
        try:
            return _parse(raw, chat, seen)
        except (ApiError, RuntimeBusy, RuntimeClosed) as e:
            e.model = seen["model"]
            raise

    def _parse(raw: bytes, chat: bool, seen: dict) -> tuple:
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            raise ApiError(400, "the request body is not valid JSON")
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        check_strings(body)
        model = body.get("model")
        if not isinstance(model, str):
            raise ApiError(400, "`model` is required: a task name (GET /v1/models)", "model")
        if model not in tasks:
            raise ApiError(404, f"the model `{model}` does not exist; this server's models "
                           f"(tasks) are: {', '.join(sorted(tasks))}", "model", "model_not_found")
        seen["model"] = model
        text = chat_input(body) if chat else _prompt(body)
        opts, stream, include_usage = completion_params(body)
        try:
            return model, rt.astream(model, text, **opts), stream, include_usage
        except (RuntimeBusy, RuntimeClosed):
            raise
        except ContextLengthExceeded as e:
            raise ApiError(400, str(e), "messages" if chat else "prompt", "context_length_exceeded")
        except PrefixEdgeError as e:
            raise ApiError(400, str(e), _param_of(str(e)) or ("messages" if chat else "prompt"))

    async def complete(request: Request, chat: bool):
        if state.draining:
            return error(503, "the server is shutting down", "server_error", None, "unavailable",
                         {"Retry-After": "5", "Connection": "close"})
        raw = await request.body()
        try:
            model, handle, stream, include_usage = await asyncio.to_thread(parse, raw, chat)
        except ApiError as e:
            metrics.count(e.model, e.status)
            return error(e.status, e.message, param=e.param, code=e.code)
        except RuntimeBusy as e:
            metrics.count(e.model, 429)
            return error(429, str(e), "rate_limit_error", None, "overloaded", {"Retry-After": "1"})
        except RuntimeClosed as e:
            metrics.count(e.model, 503)
            return error(503, str(e), "server_error", None, "unavailable", {"Retry-After": "5"})
        state.live.add(handle)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if stream:
            return StreamingResponse(_sse(handle, rid, model, chat, include_usage, metrics, state),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        watcher = asyncio.create_task(_watch_disconnect(request, handle))
        parts = []
        try:
            async for chunk in handle:
                parts.append(chunk)
        except PrefixEdgeError as e:
            metrics.count(model, 500)
            return error(500, str(e), "server_error")
        finally:
            watcher.cancel()
            state.live.discard(handle)
        r = handle.result
        if r.stats.finish_reason == "disconnected":
            metrics.count(model, DISCONNECTED)
            metrics.disconnected += 1
            return error(400, "the client disconnected", code="client_disconnected")  # nobody reads it
        if r.stats.finish_reason == "shutdown":
            metrics.count(model, 503)
            return error(503, "the server shut down before this request finished", "server_error",
                         None, "server_shutdown", {"Retry-After": "5"})
        metrics.observe(model, r)
        text_out = "".join(parts)
        choice: dict[str, Any] = {"index": 0, "finish_reason": FINISH.get(r.stats.finish_reason, "stop")}
        if chat:
            choice["message"] = {"role": "assistant", "content": text_out}
        else:
            choice.update(text=text_out, logprobs=None)
        return {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": model, "choices": [choice],
                "usage": _usage(r), "system_fingerprint": None}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    app.state.metrics = metrics
    app.state.server = state
    return app


class _BearerAuth:
    """Require `Authorization: Bearer KEY` on /v1/* (401, OpenAI-shaped, otherwise)."""

    def __init__(self, app, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            got = dict(scope.get("headers") or []).get(b"authorization", b"")
            if got != self.expected:
                resp = error(401, "invalid or missing API key (Authorization: Bearer ...)",
                             "authentication_error", None, "invalid_api_key")
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


def _prompt(body: dict) -> str:
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if not isinstance(p, str):
        raise ApiError(400, "`prompt` must be a string (one prompt per request)", "prompt")
    return p


def _param_of(msg: str) -> str | None:
    for name in ("max_tokens", "temperature", "top_p", "seed", "stop", "presence_penalty",
                 "frequency_penalty", "logit_bias", "top_k", "min_p"):
        if msg.startswith(name) or f" {name} " in msg:
            return name
    if "input" in msg:
        return "messages"
    return None


def _usage(r) -> dict:
    prompt = r.stats.prefix_tokens + r.stats.input_tokens
    return {"prompt_tokens": prompt, "completion_tokens": r.stats.generated_tokens,
            "total_tokens": prompt + r.stats.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": r.stats.prefix_tokens if r.stats.prefix_cached else 0}}


async def _watch_disconnect(request: Request, handle) -> None:
    """Cancel `handle` as soon as the client's connection goes away (its body is already read:
    the next ASGI message is the disconnect)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            handle.cancel("disconnected")
            return


async def _sse(handle, rid: str, model: str, chat: bool, include_usage: bool, metrics: Metrics,
               state: ServerState):
    created = int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"

    def frame(choices: list, usage: dict | None = None) -> str:
        obj = {"id": rid, "object": kind, "created": created, "model": model, "choices": choices}
        if include_usage:
            obj["usage"] = usage
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    def delta(text: str | None, finish: str | None, role: bool = False) -> dict:
        if chat:
            d: dict = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            return {"index": 0, "delta": d, "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

    def failure(message: str, type_: str, code: str | None) -> str:
        err = {"error": {"message": message, "type": type_, "param": None, "code": code}}
        return f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n"

    try:
        if chat:
            yield frame([delta(None, None, role=True)])
        async for chunk in handle:
            yield frame([delta(chunk, None)])
        r = handle.result
        if r.stats.finish_reason == "shutdown":  # never a silent cut: the client sees why
            metrics.count(model, 503)
            yield failure("the server shut down before this answer finished", "server_error",
                          "server_shutdown")
            return
        metrics.observe(model, r)
        yield frame([delta(None, FINISH.get(r.stats.finish_reason, "stop"))])
        if include_usage:
            yield frame([], _usage(r))
        yield "data: [DONE]\n\n"
    except PrefixEdgeError as e:
        metrics.count(model, 500)
        yield failure(str(e), "server_error", None)
    finally:
        state.live.discard(handle)
        if not handle.done:  # the client went away: stop generating for it
            handle.cancel("disconnected")
            metrics.count(model, DISCONNECTED)
            metrics.disconnected += 1
