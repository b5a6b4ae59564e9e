"""An OpenAI-compatible local server where a task is a model (FastAPI + uvicorn).

    GET  /health, /metrics (Prometheus text), /v1/models, /v1/models/{id}, /v1/responses/{id},
         /v1/tasks, /v1/tasks/{name}
    POST /v1/chat/completions, /v1/completions (completions.py), /v1/responses (responses.py),
         /v1/embeddings (embeddings.py), /v1/tasks (tasks.py: tasks made at run time)
    DELETE /v1/responses/{id}, /v1/tasks/{name}

One Runtime serves every request (its scheduler batches them). A task is a model; the model
`base` is the bundle's model with no task prefix. A chat request's messages (system, history)
are rendered by the model's chat template after the task's prefix. Errors have OpenAI's shape:
{"error": {"message", "type", "param", "code"}}; a client's mistake is a 4xx.

The event loop does no O(input) work: bodies are parsed, checked and tokenized in a worker
thread, and a waiting response holds no thread (the engine thread wakes the loop). Limits:
limits.py; shutdown: lifecycle.py.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from .calls import BASE_MODEL
from .completions import Completions
from .embeddings import Embeddings
from .limits import BODY_TIMEOUT, MAX_BODY, BodyLimits
from .auth import BearerAuth, Keys, tenant_of
from .metrics import Metrics
from .responses import Responses
from .store import StoredResponses
from .tasks import LiveTasks, TaskApi


class ServerState:
    """What shutdown needs to know: whether new requests are refused, the requests in flight,
    and how many of them were cut."""

    def __init__(self):
        self.draining = False
        self.live: set = set()
        self.readers: set = set()  # tasks still receiving a body (limits.BodyLimits)
        self.aliases: dict[str, str] = {}  # serve --alias: name -> a task or the base model
        self._cut: list = []  # handles cancelled by cut(); some may have finished just before

    def cut(self, reason: str = "shutdown") -> None:
        """On the event loop: end every request still running or uploading."""
        for h in list(self.live):
            if not h.done:
                self._cut.append((h, reason))
                h.cancel(reason)
        for task in list(self.readers):
            task._prefix_edge_cut = True
            task.cancel()

    @property
    def cut_requests(self) -> int:
        """How many requests cut() really ended: one whose last token came while the cut was on
        its way finished normally and its client got the whole answer, so it is not counted."""
        return sum(1 for h, reason in self._cut
                   if h.result is None or h.result.stats.finish_reason == reason)


def error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
          code: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status, headers=headers)


def create_app(rt, api_key: str | None = None, cors_origins: list[str] | None = None,
               max_body: int = MAX_BODY, body_timeout: float = BODY_TIMEOUT,
               stored_responses=None, keys: Keys | None = None, metrics_public: bool = False,
               aliases: dict[str, str] | None = None, allow_task_api: bool = False) -> FastAPI:
    """`stored_responses`: where /v1/responses keeps stored responses (default: this process's
    own; `serve --ray` shares them between replicas, cluster/store.py). `api_key` (one key) or
    `keys` (auth.Keys: several, each to its tenant): required on /v1/ and /metrics (unless
    metrics_public); each tenant's calls see only their own cache entries (auth.py).
    allow_task_api: POST and DELETE /v1/tasks create and delete tasks (tasks.py)."""
    app = FastAPI(title="prefix-edge", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = Metrics()
    state = ServerState()
    state.aliases = check_aliases(aliases or {}, rt.tasks)
    created = int(time.time())
    tasks = LiveTasks(rt)  # the bundle's and those created at run time
    # the last one added runs first: body limits, then CORS (a preflight is answered before
    # any key check), then the key
    if api_key and keys is None:
        keys = Keys.single(api_key)
    if keys is not None:
        app.add_middleware(BearerAuth, keys=keys, metrics_public=metrics_public, refuse=_unauthorized)
    if cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        # credentials (cookies, Authorization) for origins named explicitly; never with "*"
        # (the CORS spec forbids a wildcard origin with credentials)
        app.add_middleware(CORSMiddleware, allow_origins=cors_origins, allow_methods=["*"],
                           allow_headers=["*"], allow_credentials="*" not in cors_origins)
    app.add_middleware(BodyLimits, max_body=max_body, timeout=body_timeout, readers=state.readers)

    @app.get("/health")
    async def health():
        info = rt.engine_info()
        emb = rt.embeddings.info()
        return {"status": "ok" if not rt.closed else "closed", "backend": info["backend"],
                "tasks": len(rt.tasks), "active": info["active"], "waiting": info["waiting"],
                "embeddings": {"running_texts": emb["running_texts"], "waiting_texts": emb["waiting_texts"],
                               "waiting_tokens": emb["waiting_tokens"]}}

    @app.get("/metrics")
    async def prom():
        return PlainTextResponse(metrics.render(rt.engine_info(), memory()),
                                 media_type="text/plain; version=0.0.4")

    def memory() -> dict:
        """Each store's bytes and budget: the runtime's, and the stored responses (when they
        are this process's: store.py)."""
        out = dict(rt.memory())
        if isinstance(responder.stored, StoredResponses):
            out["stored_responses"] = responder.stored.info()
        return out

    def model_card(name: str) -> dict:
        if name not in tasks:  # the base model
            return {"id": name, "object": "model", "created": created, "owned_by": "prefix-edge",
                    "kind": "base", "chat": True, "prefix_tokens": 0, "prefix_bytes": 0,
                    "source": rt.manifest.model.source}
        t = tasks[name]
        return {"id": name, "object": "model", "created": created, "owned_by": "prefix-edge",
                "kind": t.kind, "chat": t.chat, "prefix_tokens": t.prefix_tokens,
                "prefix_bytes": sum(p.bytes for p in t.prefixes.values())}

    def names() -> list[str]:
        now = sorted(rt.tasks)
        return now + ([BASE_MODEL] if BASE_MODEL not in now else [])

    def card(name: str) -> dict:
        target = state.aliases.get(name)
        return model_card(name) if target is None else {**model_card(target), "id": name, "alias_of": target}

    @app.get("/v1/models")
    async def models():  # in a worker thread: a created task's card may read the task store
        return await asyncio.to_thread(lambda: {"object": "list", "data": [
            card(name) for name in names() + sorted(state.aliases)
            if name in state.aliases or name == BASE_MODEL or name in rt.tasks]})

    @app.get("/v1/models/{model_id:path}")
    async def one_model(model_id: str):
        def one():
            if model_id not in tasks and model_id != BASE_MODEL and model_id not in state.aliases:
                return error(404, f"the model `{model_id}` does not exist", param="model",
                             code="model_not_found")
            return card(model_id)

        return await asyncio.to_thread(one)

    from starlette.exceptions import HTTPException

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):  # 404/405 in OpenAI's shape
        what = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on "
                f"{request.url.path}"}.get(exc.status_code, str(exc.detail))
        return error(exc.status_code, what, code={404: "not_found", 405: "method_not_allowed"}
                     .get(exc.status_code), headers=getattr(exc, "headers", None))

    completer = Completions(rt, metrics, state, error)
    responder = Responses(rt, metrics, state, error, stored_responses)
    embedder = Embeddings(rt, metrics, state, error)

    task_api = TaskApi(rt, metrics, state, error, allow_task_api)

    @app.post("/v1/tasks")
    async def create_task(request: Request):
        return await task_api.create(request)

    @app.get("/v1/tasks")
    async def list_tasks():
        return await task_api.list()

    @app.get("/v1/tasks/{name}")
    async def get_task(name: str):
        return await task_api.get(name)

    @app.delete("/v1/tasks/{name}")
    async def delete_task(name: str):
        return await task_api.delete(name)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        return await embedder(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await completer(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await completer(request, chat=False)

    @app.post("/v1/responses")
    async def create_response(request: Request):
        return await responder.create(request)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request):
        return responder.get(response_id, tenant_of(request))

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request):
        return responder.delete(response_id, tenant_of(request))

    app.state.metrics = metrics
    app.state.server = state
    return app


def check_aliases(aliases: dict[str, str], tasks) -> dict[str, str]:
    """serve --alias NAME=TARGET: each target a task or the base model, no name a task's or
    the base model's own, no alias of an alias; a PrefixEdgeError line otherwise."""
    from ..errors import PrefixEdgeError

    known = set(tasks) | {BASE_MODEL}
    for name, target in aliases.items():
        if not name or not name.strip() or name != name.strip():
            raise PrefixEdgeError(f"--alias {name!r}={target}: the name is empty or has spaces around it")
        if name in known:
            raise PrefixEdgeError(f"--alias {name}={target}: `{name}` is already a model of this bundle")
        if target not in known:
            raise PrefixEdgeError(f"--alias {name}={target}: `{target}` is not a task of this bundle nor "
                                  f"`{BASE_MODEL}` (tasks: {', '.join(sorted(tasks)) or 'none'})")
    return dict(aliases)


async def _unauthorized(scope, receive, send):
    resp = error(401, "invalid or missing API key (Authorization: Bearer ...)",
                 "authentication_error", None, "invalid_api_key")
    return await resp(scope, receive, send)
