"""What a `serve --ray` replica costs and what a task adds to it: a local Ray cluster of N
replicas of a bundle, each replica's RSS (from /proc, by the pid its responses report) with no
task loaded and after every task was asked once, and the latency of a task's first request on
a replica (multiplexed load: its prefix read and checked) against a repeat.

    python benchmarks/cluster_memory.py [--bundle DIR] [--replicas 2] [--backend gguf]
                                        [--out docs/cluster-memory.json]
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


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--backend", default="gguf")
    ap.add_argument("--out", default="docs/cluster-memory.json")
    a = ap.parse_args()
    from prefix_edge.bundle import Manifest
    from prefix_edge.paths import default_bundle

    bundle = Path(a.bundle) if a.bundle else default_bundle()
    tasks = sorted(Manifest.read(bundle).tasks)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "prefix_edge", "serve", "--ray", "--bundle", str(bundle),
                             "--port", str(port), "--backend", a.backend, "--threads", "1", "--slots", "2",
                             "--replicas", str(a.replicas), "--tasks-per-replica", str(len(tasks))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    try:
        t0 = time.time()
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() - t0 > 300:
                raise SystemExit("the cluster did not come up")
            time.sleep(1)
        startup_s = round(time.time() - t0, 1)
        pids = {}
        for _ in range(20):  # find every replica (the router spreads these)
            c = json.loads(httpx.get(base + "/health").headers["x-prefix-edge-counters"])
            pids[c["replica"]] = c["pid"]
        empty = {r: rss_mb(p) for r, p in pids.items()}
        first, again = [], []
        for task in tasks:
            for out in (first, again):
                t = time.perf_counter()
                r = httpx.post(base + "/v1/chat/completions", timeout=120, json={
                    "model": task, "max_tokens": 1, "messages": [{"role": "user", "content": "Hello"}]})
                r.raise_for_status()
                out.append((time.perf_counter() - t) * 1e3)
                c = json.loads(r.headers["x-prefix-edge-counters"])
                pids[c["replica"]] = c["pid"]
        loaded = {r: rss_mb(p) for r, p in pids.items()}
        counters = {}
        for _ in range(20):
            c = json.loads(httpx.get(base + "/health").headers["x-prefix-edge-counters"])
            counters[c["replica"]] = c
        manifest = Manifest.read(bundle)
        prefix_mb = {t: round(sum(p.bytes for p in manifest.tasks[t].prefixes.values()) / 1e6, 2) for t in tasks}
        report = {"date": time.strftime("%Y-%m-%d"), "bundle": str(bundle), "backend": a.backend,
                  "replicas": a.replicas, "tasks": len(tasks), "startup_s": startup_s,
                  "rss_mb_no_task": empty, "rss_mb_all_tasks_asked": loaded,
                  "resident_after": {r: c["resident"] for r, c in counters.items()},
                  "first_request_ms_median": round(statistics.median(first), 1),
                  "repeat_request_ms_median": round(statistics.median(again), 1),
                  "prefix_file_mb_per_task_both_backends": prefix_mb}
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
        print(json.dumps(report, indent=1))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
