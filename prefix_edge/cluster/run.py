"""`prefix-edge serve --ray`: start (or join) a Ray cluster and run the application on it."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

from ..errors import PrefixEdgeError

IMPORT_PATH = "prefix_edge.cluster.app:build"


def config(args: dict, host: str, port: int) -> dict:
    """A Ray Serve config file's content (`serve deploy FILE` takes it; JSON is YAML)."""
    return {"proxy_location": "EveryNode", "http_options": {"host": host, "port": port},
            "applications": [{"name": "prefix-edge", "route_prefix": "/", "import_path": IMPORT_PATH,
                              "args": {k: v for k, v in args.items() if k != "api_key" and v is not None}}]}


def write_config(path: Path, args: dict, host: str, port: int) -> None:
    Path(path).write_text(json.dumps(config(args, host, port), indent=2) + "\n")


def serve_forever(args: dict, host: str, port: int, address: str | None) -> None:
    try:
        import ray
        from ray import serve
    except ImportError:
        raise PrefixEdgeError("serving on Ray needs its extra: pip install 'prefix-edge[ray]'") from None
    from .app import build

    # Ray Serve's router asks a replica for its queue length before sending it a request and
    # gives up on it after 0.1 s (backing off to 1 s), then routes to the replicas holding the
    # fewest tasks: on a loaded machine a task then strays from the replica that holds its
    # prefix and is loaded again elsewhere. Local workers inherit these (a user's setting wins).
    os.environ.setdefault("RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S", "1.0")
    os.environ.setdefault("RAY_SERVE_MAX_QUEUE_LENGTH_RESPONSE_DEADLINE_S", "5.0")
    ray.init(address=address, include_dashboard=False, log_to_driver=False,
             **({} if address else {"num_cpus": None}))
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(build(args), name="prefix-edge", route_prefix="/")
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
