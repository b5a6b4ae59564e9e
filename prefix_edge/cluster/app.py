"""A Ray Serve application: the bundle's tasks over N replicas, each task routed to the replicas
that hold it (Ray Serve's model multiplexing, the task as the multiplexed model id).

    ingress (one deployment)            TaskReplica x N (one Runtime each: one engine thread,
      the OpenAI routes, the API key,   its own scheduler and batching)
      an unknown task -> 404        ->    the multiplexed loader: a task's prefix read and
      the task from the body's          checked into memory; the least recently used one
      `model` -> multiplexed id         beyond `tasks_per_replica` is dropped
                                        the request through serve/app.py's own FastAPI app
                                        (cluster/asgi.py): the same API, streaming included

Every response carries `x-prefix-edge-replica` (which replica answered) and the replica's
counters; the ingress's `/metrics` renders them per replica and per task (requests, resident
tasks, loads, evictions, queue depth, requests cut by a replica's failure). A request no
replica took (a dead one was picked) is sent once more, elsewhere; a replica that dies with
the request taken ends it as relay.py says (a 503, or a stream's error frames), not retried:
a request that crashes its replica must not crash a second one. Stored responses live in a
ResponseStore shared by the replicas (store.py). `build(args)` is the application builder
Ray's own `serve run` / `serve deploy` call (cli: `prefix-edge serve --ray --ray-config FILE`
writes such a config).
"""


import asyncio
import json
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from ray import serve

from .relay import StreamEnd, unavailable, what_failed
from .store import ResponseStore, SharedResponses

DEFAULTS: dict[str, Any] = {"bundle": None, "replicas": 2, "tasks_per_replica": 8, "backend": "auto",
                            "device": "cpu", "threads": None, "slots": 4, "api_key": None,
                            "prompt_cache": 256, "prompt_cache_disk": 2048, "document_cache": 256, "cache": 256,
                            "stored_responses_mb": 64, "allow_task_api": False, "task_store": None,
                            "task_mb": 64, "task_store_mb": 1024}
BASE = "base"
HOP = {"content-length", "transfer-encoding", "connection"}  # set again by the HTTP layer


def _replica_deployment(k: int):
    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class TaskReplica:
        def __init__(self, bundle: str, runtime_opts: dict, store, allow_task_api: bool = False):
            from ..runtime.runtime import Runtime
            from ..serve.app import create_app

            self.rt = Runtime.open(bundle, prefix_cache_size=max(k, 1), **runtime_opts)
            self.stored = SharedResponses(store)
            # tasks made through one replica live in the store they share: the others see one
            # at its first call (Runtime.has_task)
            self.app = create_app(self.rt, stored_responses=self.stored, allow_task_api=allow_task_api)
            ctx = serve.get_replica_context()
            rid = getattr(ctx, "replica_id", None)
            self.name = getattr(rid, "unique_id", None) or getattr(ctx, "replica_tag", "replica")
            self.loads = self.evictions = 0
            self.resident: set[str] = set()

        @serve.multiplexed(max_num_models_per_replica=max(k, 1))
        async def task(self, name: str):
            if await asyncio.to_thread(self.rt.has_task, name):  # read and checked now, not on the first request
                await asyncio.to_thread(self.rt.prefixes.get, name)
            self.loads += 1
            self.resident.add(name)
            return _Resident(self, name)

        def counters(self) -> dict:
            info = self.rt.engine_info()
            return {"replica": self.name, "pid": os.getpid(), "resident": sorted(self.resident),
                    "loads": self.loads, "evictions": self.evictions, "waiting": info["waiting"],
                    "active": info["active"]}

        async def handle(self, method: str, path: str, query: bytes, headers: list, body: bytes):
            from .asgi import call

            yield {"accepted": self.name}  # from here a failure is this request's: not retried
            name = serve.get_multiplexed_model_id()
            if name:
                await self.task(name)
            async for part in call(self.app, method, path, query, headers, body):
                if self.stored.pending:  # a response just stored: shared before anyone sees it
                    await self.stored.settle()
                if isinstance(part, dict):
                    part["headers"] = [h for h in part["headers"] if h[0].lower() not in HOP] + [
                        ("x-prefix-edge-replica", self.name),
                        ("x-prefix-edge-counters", json.dumps(self.counters()))]
                yield part

        def __del__(self):
            rt = getattr(self, "rt", None)
            if rt is not None:
                rt.close()

    return TaskReplica


class _Resident:
    """A task held by a replica; Ray Serve drops it (least recently used) beyond the limit."""

    def __init__(self, replica, name: str):
        self.replica, self.name, self.gone = replica, name, False

    def __del__(self):
        if not self.gone:
            self.gone = True
            self.replica.evictions += 1
            self.replica.resident.discard(self.name)
            if self.name in self.replica.rt.tasks:
                self.replica.rt.unload(self.name)


def _ingress(names: list[str], api_key: str | None, created=None):
    """`created`: the bundle's store of tasks made at run time (bundle/created.py), where a
    model the bundle does not name may be."""
    from ..serve.app import _unauthorized, error
    from ..serve.auth import BearerAuth, Keys

    def _no_stored(response_id: str):
        return error(404, f"no stored response `{response_id}`", param="response_id", code="not_found")

    app = FastAPI(title="prefix-edge cluster", docs_url=None, redoc_url=None, openapi_url=None)
    if api_key:
        app.add_middleware(BearerAuth, keys=Keys.single(api_key), metrics_public=False, refuse=_unauthorized)

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    @serve.ingress(app)
    class Ingress:
        def __init__(self, replicas, store):
            self.replicas, self.store = replicas, store
            self.requests: dict[tuple[str, str], int] = {}
            self.counters: dict[str, dict] = {}
            self.failures: dict[str, int] = {}  # requests cut by their replica's failure

        @app.get("/metrics")
        async def metrics(self) -> PlainTextResponse:
            lines = ["# TYPE prefix_edge_cluster_requests_total counter"]
            for (task, replica), n in sorted(self.requests.items()):
                lines.append(f'prefix_edge_cluster_requests_total{{task="{task}",replica="{replica}"}} {n}')
            lines.append("# TYPE prefix_edge_cluster_replica_failures_total counter")
            for replica, n in sorted(self.failures.items()):
                lines.append(f'prefix_edge_cluster_replica_failures_total{{replica="{replica}"}} {n}')
            for kind, key in (("gauge", "resident"), ("counter", "loads"), ("counter", "evictions"),
                              ("gauge", "waiting"), ("gauge", "active")):
                metric = f"prefix_edge_replica_{key}" + ("_total" if kind == "counter" else "")
                lines.append(f"# TYPE {metric} {kind}")
                for replica, c in sorted(self.counters.items()):
                    v = len(c[key]) if key == "resident" else c[key]
                    lines.append(f'{metric}{{replica="{replica}"}} {v}')
            try:
                st = await self.store.stats.remote()
            except Exception:  # the store is restarting: its lines are left out
                st = None
            for kind, key, metric in (("gauge", "count", ""), ("gauge", "bytes", "_bytes"),
                                      ("gauge", "budget", "_budget_bytes"),
                                      ("counter", "evictions", "_evictions_total")) if st else ():
                lines += [f"# TYPE prefix_edge_cluster_stored_responses{metric} {kind}",
                          f"prefix_edge_cluster_stored_responses{metric} {st[key]}"]
            return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

        @app.get("/v1/responses/{response_id}")
        async def stored_response(self, response_id: str):
            try:
                got = await self.store.get.remote(response_id)
            except Exception as e:  # Serve restarts it (empty)
                return unavailable(f"the response store did not answer ({type(e).__name__})")
            if got is None:
                return _no_stored(response_id)
            return Response(got[0], media_type="application/json")

        @app.delete("/v1/responses/{response_id}")
        async def delete_stored_response(self, response_id: str):
            try:
                gone = await self.store.delete.remote(response_id)
            except Exception as e:
                return unavailable(f"the response store did not answer ({type(e).__name__})")
            if not gone:
                return _no_stored(response_id)
            return {"id": response_id, "object": "response", "deleted": True}

        @app.api_route("/{path:path}", methods=["GET", "POST", "DELETE", "OPTIONS"])
        async def forward(self, path: str, request: Request):
            body = await request.body()
            model = None
            if request.method == "POST" and body[:1] == b"{":
                try:
                    model = json.loads(body).get("model")
                except (ValueError, AttributeError):
                    model = None  # the replica's API answers the malformed body
            if isinstance(model, str) and model not in names and not (
                    created is not None and model in await asyncio.to_thread(created.names)):
                return error(404, f"the model `{model}` does not exist", param="model", code="model_not_found")
            headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()]
            args = (request.method, "/" + path, request.url.query.encode(), headers, body)
            for attempt in (0, 1):
                h = self.replicas.options(stream=True, **({"multiplexed_model_id": model}
                                                          if isinstance(model, str) else {}))
                gen = h.handle.remote(*args)
                try:
                    replica = (await gen.__anext__())["accepted"]
                    break
                except Exception as e:  # no replica took it (a dead one was picked): once more, elsewhere
                    if attempt:
                        return unavailable(f"no replica could take this request ({type(e).__name__})")
            try:
                head = await gen.__anext__()
                hdrs = dict(head["headers"])
                stream = hdrs.get("content-type", "").startswith("text/event-stream")
                if not stream:  # JSON: whole, so a failure is still a 503
                    content = b"".join([part async for part in gen])
            except Exception as e:
                self._failed(replica)
                return unavailable(what_failed(e), replica)
            c = json.loads(hdrs.get("x-prefix-edge-counters", "{}"))
            if c:
                self.counters[c["replica"]] = c
                if isinstance(model, str):
                    key = (model, c["replica"])
                    self.requests[key] = self.requests.get(key, 0) + 1
            if not stream:
                return Response(content, status_code=head["status"], headers=hdrs)
            return StreamingResponse(self._relay(gen, StreamEnd("/" + path), replica),
                                     status_code=head["status"], headers=hdrs)

        def _failed(self, replica: str) -> None:
            self.failures[replica] = self.failures.get(replica, 0) + 1
            self.counters.pop(replica, None)  # its gauges died with it

        async def _relay(self, gen, end: StreamEnd, replica: str):
            try:
                async for part in gen:
                    end.saw(part)
                    yield part
            except Exception as e:  # the replica died mid-stream: end it as the server would
                self._failed(replica)
                yield end.frames(what_failed(e))

    return Ingress


def build(args: dict) -> Any:
    """The Ray Serve application of a bundle (Ray's application-builder signature)."""
    from ..bundle import Bundle

    a = {**DEFAULTS, **(args or {})}
    opened = Bundle.open(a["bundle"], a["task_store"])
    bundle, names = str(opened.root), sorted(opened.tasks) + [BASE]
    opts = {"backend": a["backend"], "device": a["device"], "threads": a["threads"], "slots": int(a["slots"]),
            # MiB; "turn_cache" is the memory tier's earlier name. The replicas on one machine
            # share the disk tier's folder (several processes may: prompt_files.py)
            "prompt_cache_bytes": max(0, int(a.get("turn_cache", a["prompt_cache"]))) << 20,
            "prompt_cache_disk_bytes": max(0, int(a["prompt_cache_disk"])) << 20,
            "document_cache_bytes": max(0, int(a["document_cache"])) << 20,
            "cache_bytes": max(0, int(a["cache"])) << 20, "task_store": a["task_store"],
            "task_bytes": max(1, int(float(a["task_mb"]) * (1 << 20))),
            "task_store_bytes": max(0, int(float(a["task_store_mb"]) * (1 << 20)))}
    store = ResponseStore.bind(max(1, int(a["stored_responses_mb"])) << 20)
    replica = _replica_deployment(int(a["tasks_per_replica"])).options(num_replicas=int(a["replicas"]))
    return _ingress(names, a["api_key"], opened.store).bind(
        replica.bind(bundle, opts, store, bool(a["allow_task_api"])), store)
