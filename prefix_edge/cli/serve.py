"""`prefix-edge serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..serve.lifecycle import GRACE
from ..serve.limits import BODY_TIMEOUT, HEADER_TIMEOUT, MAX_BODY, MAX_CONNECTIONS
from ..serve.store import MAX_STORED, STORED_BYTES
from ..runtime.tasks import STORE_BYTES, TASK_BYTES
from .app import app


@app.command()
def serve(
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="Bundle dir (default bundle when omitted)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (default: loopback only)."),
    port: int = typer.Option(8080, "--port"),
    backend: str = typer.Option("auto", "--backend", help="onnx | gguf | auto."),
    device: str = typer.Option("cpu", "--device"),
    threads: Optional[int] = typer.Option(None, "--threads"),
    slots: int = typer.Option(4, "--slots", help="Requests decoded together (llama.cpp: a KV stream each)."),
    n_ctx: Optional[int] = typer.Option(None, "--n-ctx", help="Positions one request may use: prefix + input + output (default: the model's context; llama.cpp: at most 4096)."),
    kv_cells: Optional[int] = typer.Option(None, "--kv-cells", help="llama.cpp KV cells in all (default: slots x n-ctx; with --shared-kv: from the longest prefix and slots)."),
    shared_kv: bool = typer.Option(False, "--shared-kv", help="llama.cpp: one KV cache shared by all requests and resident prefixes (less memory; answers may move with load)."),
    window_cache: str = typer.Option("full", "--window-cache", help="llama.cpp, sliding-window layers (Gemma 3): 'full' keeps every position's cells (exact); 'window' a ring of the window and a batch (less memory on long contexts; answers may differ at near ties)."),
    mtp_head: bool = typer.Option(False, "--mtp-head", help="llama.cpp, a model that ships an MTP head (Qwen3.5): load it, so that speculative=\"mtp\" requests draft with it (docs/speculative.md)."),
    prompt_cache: int = typer.Option(512, "--prompt-cache", "--turn-cache", help="MiB of host memory for the KV of prompts already read: a request starting with the same tokens (the same documents or system prompt, a conversation's next turn) prefills only the rest; 0: off."),
    document_cache: int = typer.Option(512, "--document-cache", help="MiB of host memory for documents' KV kept for compose_documents=true requests (each document computed once, composed in any order); 0: off."),
    cache: int = typer.Option(512, "--cache", help="MiB of host memory for the prompt and document caches together (the entry used longest ago, in either, goes first; each keeps its own cap too)."),
    read_ahead: bool = typer.Option(True, "--read-ahead/--no-read-ahead", help="After a chat call, read its reply into the prompt cache while the server is idle, so that the conversation's next turn prefills only its new message (exact; docs/conversations.md)."),
    prompt_cache_disk: int = typer.Option(2048, "--prompt-cache-disk", help="MiB of disk (under the home directory) for the prompts that keep coming back, so that a restarted server starts warm; 0: off."),
    queue_size: int = typer.Option(64, "--queue", help="Requests that may wait; beyond: 429."),
    stored_responses: int = typer.Option(MAX_STORED, "--stored-responses", help="/v1/responses kept for previous_response_id and GET (the oldest dropped beyond; 0: none)."),
    stored_mb: int = typer.Option(STORED_BYTES >> 20, "--stored-mb", help="MiB the stored responses may hold together (the oldest dropped beyond)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="PREFIX_EDGE_API_KEY", help="Require Authorization: Bearer KEY on /v1/ and /metrics (one key, one tenant)."),
    api_keys: Optional[Path] = typer.Option(None, "--api-keys", help="A file of `KEY TENANT` lines: several keys, each tenant's prompt and document caches its own (docs/server.md, Tenants)."),
    alias: Optional[list[str]] = typer.Option(None, "--alias", help="NAME=TARGET: answer to NAME as the task (or `base`) TARGET, for clients that send a fixed model name (e.g. --alias text-embedding-3-small=base); repeatable."),
    allow_task_api: bool = typer.Option(False, "--allow-task-api", help="Let clients create and delete tasks (POST / DELETE /v1/tasks; behind the API key): each baked, verified and stored beside the bundle (docs/tasks-at-run-time.md)."),
    task_store: Optional[Path] = typer.Option(None, "--task-store", help="Where created tasks are kept (default: the bundle's created/ folder)."),
    task_mb: float = typer.Option(TASK_BYTES >> 20, "--task-mb", help="MiB one created task's prefix may take (400 beyond)."),
    task_store_mb: float = typer.Option(STORE_BYTES >> 20, "--task-store-mb", help="MiB all created tasks' prefixes may take together (429 beyond)."),
    metrics_public: bool = typer.Option(False, "--metrics-public", help="Serve /metrics without the API key (it names tasks and counts every client's requests)."),
    cors: Optional[str] = typer.Option(None, "--cors", help="Comma-separated origins allowed by CORS (default: none)."),
    max_body: int = typer.Option(MAX_BODY, "--max-body", help="Largest request body in bytes (413 beyond)."),
    body_timeout: float = typer.Option(BODY_TIMEOUT, "--body-timeout", help="Seconds to receive a request body (408 beyond)."),
    header_timeout: float = typer.Option(HEADER_TIMEOUT, "--header-timeout", help="Seconds to receive a request head; the connection is closed beyond."),
    max_connections: int = typer.Option(MAX_CONNECTIONS, "--max-connections", help="Open connections; beyond, new ones are closed at once."),
    grace: float = typer.Option(GRACE, "--grace", help="Seconds running requests may take to finish after SIGTERM/SIGINT; then they end with an error."),
    ray: bool = typer.Option(False, "--ray", help="Serve on a Ray cluster (the [ray] extra): replicas of the runtime, each task routed to the replicas that hold it."),
    replicas: int = typer.Option(2, "--replicas", help="--ray: runtime replicas."),
    tasks_per_replica: int = typer.Option(8, "--tasks-per-replica", help="--ray: tasks a replica keeps loaded (least recently used dropped beyond)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="--ray: join this cluster (default: start a local one)."),
    ray_config: Optional[Path] = typer.Option(None, "--ray-config", help="--ray: write the Ray Serve config for `serve deploy` to this file and exit."),
) -> None:
    """Serve the bundle's tasks as models over an OpenAI-compatible HTTP API."""
    from ..errors import PrefixEdgeError

    if api_key and api_keys:
        raise PrefixEdgeError("give --api-key or --api-keys, not both (put the one key in the file)")
    if api_keys and (ray or ray_config):
        raise PrefixEdgeError("--api-keys (tenants) is not supported with --ray: use --api-key")
    aliases = {}
    for a in alias or []:
        name, eq, target = a.partition("=")
        if not eq:
            raise PrefixEdgeError(f"--alias {a!r}: expected NAME=TARGET (e.g. text-embedding-3-small=base)")
        if name in aliases:
            raise PrefixEdgeError(f"--alias {name}: given twice")
        aliases[name] = target
    if aliases and (ray or ray_config):
        raise PrefixEdgeError("--alias is not supported with --ray yet")
    keys = None
    if api_keys:
        from ..serve.auth import Keys

        keys = Keys.from_file(api_keys)  # a bad file fails here, before the model loads
    if ray or ray_config:
        from ..cluster.run import serve_forever, write_config

        if replicas < 1 or tasks_per_replica < 1:
            raise PrefixEdgeError("--replicas and --tasks-per-replica must be >= 1")
        args = {"bundle": str(bundle) if bundle else None, "replicas": replicas, "tasks_per_replica": tasks_per_replica,
                "backend": backend, "device": device, "threads": threads, "slots": slots,
                "prompt_cache": prompt_cache, "prompt_cache_disk": prompt_cache_disk,
                "document_cache": document_cache, "cache": cache, "api_key": api_key,
                "allow_task_api": allow_task_api, "task_store": str(task_store) if task_store else None,
                "task_mb": task_mb, "task_store_mb": task_store_mb}
        if ray_config:
            write_config(ray_config, args, host, port)
            typer.echo(f"wrote {ray_config}: `serve deploy {ray_config}` (set api_key in its args yourself)", err=True)
            return
        typer.echo(f"serving on Ray: {replicas} replica(s) on http://{host}:{port}/v1", err=True)
        serve_forever(args, host, port, ray_address)
        return

    try:
        import uvicorn

        from ..serve.app import create_app
    except ImportError:
        raise PrefixEdgeError("the server needs its extra: pip install 'prefix-edge[serve]'") from None
    from ..runtime.runtime import Runtime
    from ..serve.lifecycle import bind, make_server
    from ..serve.limits import protocol_class, raise_fd_limit
    from ..serve.store import StoredResponses

    for name, value, low in (("--max-body", max_body, 1), ("--body-timeout", body_timeout, 0.001),
                             ("--header-timeout", header_timeout, 0.001),
                             ("--max-connections", max_connections, 1), ("--grace", grace, 0),
                             ("--stored-responses", stored_responses, 0), ("--stored-mb", stored_mb, 0)):
        if value < low:
            raise PrefixEdgeError(f"{name} must be >= {low}, got {value}")
    sock = bind(host, port)  # a port in use fails here, before the model loads
    raise_fd_limit()
    rt = None
    try:
        rt = Runtime.open(bundle, backend=backend, device=device, threads=threads, slots=slots,
                          queue_size=queue_size, n_ctx=n_ctx, kv_cells=kv_cells, shared_kv=shared_kv,
                          prompt_cache_bytes=max(0, prompt_cache) << 20,
                          prompt_cache_disk_bytes=max(0, prompt_cache_disk) << 20,
                          document_cache_bytes=max(0, document_cache) << 20, cache_bytes=max(0, cache) << 20,
                          read_ahead=read_ahead, window_cache=window_cache, mtp_head=mtp_head, task_store=task_store,
                          task_bytes=max(1, int(task_mb * (1 << 20))),
                          task_store_bytes=max(0, int(task_store_mb * (1 << 20))))
        application = create_app(rt, api_key=api_key, keys=keys, metrics_public=metrics_public, aliases=aliases,
                                 cors_origins=[o.strip() for o in cors.split(",")] if cors else None,
                                 max_body=max_body, body_timeout=body_timeout,
                                 stored_responses=StoredResponses(stored_responses, stored_mb << 20),
                                 allow_task_api=allow_task_api)
        config = uvicorn.Config(application, log_level="warning", lifespan="off",
                                http=protocol_class(header_timeout, max_connections))
        server = make_server(config, application.state.server, grace)
        who = f", {len(keys.tenants)} tenant(s)" if keys is not None else ""
        typer.echo(f"serving {len(rt.tasks)} tasks ({rt.backend.name}{who}) on http://{host}:{port}/v1", err=True)
        server.run(sockets=[sock])
    finally:
        if rt is not None:
            rt.close()
        sock.close()
    cut = application.state.server.cut_requests
    if cut:
        typer.echo(f"shutdown: {cut} request(s) still running after {grace:g} s were ended with an error", err=True)
        raise typer.Exit(1)
