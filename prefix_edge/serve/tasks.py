"""Tasks made at run time, over HTTP (Runtime.add_task / remove_task, runtime/tasks.py):

    POST   /v1/tasks          {"name", "system" | "examples" | "prefix", "template", "chat", and
                              generation defaults (max_tokens, temperature, json_schema ...)}
                              -> 201 the task (GET's shape) and "verified"
    GET    /v1/tasks          every task: the bundle's ("exported") and those created
    GET    /v1/tasks/{name}   one
    DELETE /v1/tasks/{name}   a created task: calls running finish, new ones get 404

Creating and deleting are off unless the server was started with --allow-task-api (403
otherwise), and behind the API key like every /v1/ route. A bad field is a 400 naming it (the
same checks and lines as export's task file); a name taken 409; the store's byte budget spent
429 (insufficient_quota); an exported task cannot be deleted (403). A created task is a model
at once: /v1/models lists it, chat/completions serve it.
"""

from __future__ import annotations

import asyncio

from fastapi import Request

from ..bundle.created import TaskExists, TaskStoreFull
from ..errors import EngineError, PrefixEdgeError, RuntimeClosed
from ..runtime.tasks import ExportedTask, UnknownTask
from .fields import read_body
from .schema import ApiError


class LiveTasks:
    """The runtime's tasks as a call sees them now: created and deleted at run time, by this
    process or another sharing the store (Runtime.has_task)."""

    def __init__(self, rt):
        self.rt = rt

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and self.rt.has_task(name)

    def __iter__(self):
        return iter(sorted(self.rt.tasks))

    def __getitem__(self, name: str):
        return self.rt.tasks[name]


def task_error(e: Exception) -> ApiError:
    """A task call's error as its HTTP answer: 404 unknown, 403 exported, 409 taken, 429 the
    store full, 500 the engine's, 503 closed, else 400 naming the field."""
    if isinstance(e, ApiError):
        return e
    param = getattr(e, "param", None)
    for kind, status, code in ((UnknownTask, 404, "task_not_found"), (ExportedTask, 403, "task_exported"),
                               (TaskExists, 409, "task_exists"), (TaskStoreFull, 429, "insufficient_quota"),
                               (EngineError, 500, None), (RuntimeClosed, 503, "unavailable")):
        if isinstance(e, kind):
            err = ApiError(status, str(e), param, code)
            if status >= 500:
                err.type = "server_error"
            return err
    if isinstance(e, PrefixEdgeError):
        return ApiError(400, str(e), param or "name", None)
    return ApiError(500, f"internal error: {type(e).__name__}", None, None)


class TaskApi:
    def __init__(self, rt, metrics, state, error, allowed: bool = False):
        self.rt, self.metrics, self.state, self.error, self.allowed = rt, metrics, state, error, allowed

    def _answer(self, e: Exception):
        err = task_error(e)
        self.metrics.count("tasks", err.status)
        return self.error(err.status, err.message, err.type, err.param, err.code)

    def _refused(self):
        if self.state.draining:
            return self.error(503, "the server is shutting down", "server_error", None, "unavailable",
                              {"Retry-After": "5", "Connection": "close"})
        if not self.allowed:
            return self.error(403, "creating and deleting tasks is off on this server (start it with "
                              "--allow-task-api)", "permission_error", None, "task_api_off")
        return None

    async def create(self, request: Request):
        refused = self._refused()
        if refused is not None:
            return refused
        raw = await request.body()

        def make():
            body = read_body(raw)
            name = body.get("name")
            if name is None:
                raise ApiError(400, "`name` is required: the task's name (a model's id once made)", "name")
            return self.rt.add_task(name, **{k: v for k, v in body.items() if k != "name"})

        try:
            made = await asyncio.to_thread(make)
        except Exception as e:  # noqa: BLE001 - every error is an answer
            return self._answer(e)
        self.metrics.count("tasks", 201)
        from fastapi.responses import JSONResponse

        return JSONResponse(made, status_code=201)

    async def list(self):
        def rows():
            out = []
            for name in sorted(self.rt.tasks):
                try:
                    out.append(self.rt.task_info(name))
                except UnknownTask:  # deleted meanwhile
                    pass
            return out

        return {"object": "list", "data": await asyncio.to_thread(rows)}

    async def get(self, name: str):
        try:
            return await asyncio.to_thread(self.rt.task_info, name)
        except Exception as e:  # noqa: BLE001
            return self._answer(e)

    async def delete(self, name: str):
        refused = self._refused()
        if refused is not None:
            return refused
        try:
            await asyncio.to_thread(self.rt.remove_task, name)
        except Exception as e:  # noqa: BLE001
            return self._answer(e)
        return {"id": name, "object": "task.deleted", "deleted": True}
