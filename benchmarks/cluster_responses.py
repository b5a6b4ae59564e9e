"""What the shared response store costs a `serve --ray` cluster, and that it finds every
response: a local Ray cluster of N replicas (one task held each), requests to /v1/responses
with `store` true and false interleaved (1 output token: the store's write is most of the
difference), chains of 8 turns alternating two tasks (so they alternate replicas; a turn not
found continues from the last one found), and `GET /v1/responses/{id}` of every stored id.

    python benchmarks/cluster_responses.py --bundle DIR [--tasks A,B]
                                           [--rounds 60] [--out docs/cluster-responses.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--tasks", default=None, help="two tasks (default: the bundle's first two)")
    ap.add_argument("--backend", default="onnx")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--out", default="docs/cluster-responses.json")
    a = ap.parse_args()
    from prefix_edge.bundle import Manifest

    tasks = a.tasks.split(",") if a.tasks else sorted(Manifest.read(Path(a.bundle)).tasks)[:2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "prefix_edge", "serve", "--ray", "--bundle", a.bundle,
                             "--port", str(port), "--backend", a.backend, "--threads", "1", "--slots", "2",
                             "--replicas", "2", "--tasks-per-replica", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    try:
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise SystemExit("the cluster did not start")
            time.sleep(1)
        c = httpx.Client(timeout=120)

        def respond(task: str, store: bool = True, prev: str | None = None) -> tuple[float, httpx.Response]:
            t = time.perf_counter()
            r = c.post(base + "/v1/responses", json={"model": task, "input": "hello", "max_output_tokens": 1,
                                                     "store": store, "previous_response_id": prev})
            return (time.perf_counter() - t) * 1000, r

        for _ in range(10):  # warm: each task loaded, on its own replica
            for task in tasks:
                respond(task)
        ms: dict[str, list[float]] = {"store": [], "no_store": [], "chained": [], "get": []}
        ids, replicas, chained, asked, prev = [], set(), 0, 0, None
        for i in range(a.rounds):
            for store in ((True, False) if i % 2 else (False, True)):  # neither always first
                dt, r = respond(tasks[i % 2], store)
                ms["store" if store else "no_store"].append(dt)
                if store:
                    ids.append(r.json()["id"])
            dt, r = respond(tasks[i % 2], True, prev)  # a chain alternating the two tasks
            replicas.add(r.headers.get("x-prefix-edge-replica"))
            if prev:
                asked += 1
                chained += r.status_code == 200
                ms["chained"].append(dt)
            if r.status_code == 200:
                prev = r.json()["id"]
            if i % 8 == 7:
                prev = None  # chains of 8 turns (the conversation stays short)
        found = 0
        for rid in ids:
            t = time.perf_counter()
            found += c.get(f"{base}/v1/responses/{rid}").status_code == 200
            ms["get"].append((time.perf_counter() - t) * 1000)
        out = {"bundle": str(a.bundle), "tasks": tasks, "rounds": a.rounds, "replicas_answering": len(replicas),
               "chain_turns_found": f"{chained}/{asked}", "gets_found": f"{found}/{len(ids)}",
               "median_ms": {k: round(statistics.median(v), 2) for k, v in ms.items()},
               "load_average": os.getloadavg()[0], "cpus": os.cpu_count()}
        print(json.dumps(out, indent=2))
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(90)


if __name__ == "__main__":
    main()
