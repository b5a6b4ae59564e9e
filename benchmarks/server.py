"""`prefix-edge serve` vs in-process, and vs llama-cpp-python's own OpenAI server, on one bundle.

    python benchmarks/server.py [--bundle DIR] [--threads 2] [--out docs/server-report.json]

  a. TTFT overhead of the server: client-side time to the first streamed content chunk through
     `prefix-edge serve` minus the in-process `Runtime.stream` time to its first chunk (gguf,
     same bundle, same task and inputs; p50 of 20 each)
  b. aggregate completion tok/s through the server at 1 / 4 / 8 concurrent clients (EOS banned)
  c. vs `python -m llama_cpp.server` on the same GGUF with the task's system prompt (and
     examples) sent as messages every time (it reuses the longest common prefix of the previous
     prompt): TTFT p50 for one task, and with requests alternating over 3 tasks

Servers run one at a time, each in its own process, with the same thread count.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

Q = ["How do I resume sync after a metered connection paused it?",
     "Can I get a refund on an annual plan?",
     "I deleted a folder three weeks ago on the Free plan, can I get it back?",
     "How many devices does the Plus plan allow?"]
TASKS = ["support", "extract", "sentiment"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(base: str, proc, path: str = "/health") -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(proc.stderr.read().decode())
        try:
            if httpx.get(base + path, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("server did not start")


CLIENT = httpx.Client(timeout=600)  # one client, kept-alive connections, as SDK clients do
# (a new httpx connection per request cost ~21 ms here, more than the server itself)


def ttft_http(base: str, body: dict) -> tuple[float, int]:
    t0 = time.perf_counter()
    first, n = None, 0
    with CLIENT.stream("POST", base + "/v1/chat/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            ch = obj.get("choices") or []
            if ch and (ch[0].get("delta") or {}).get("content"):
                n += 1
                if first is None:
                    first = time.perf_counter()
    return ((first or time.perf_counter()) - t0) * 1e3, n


@contextlib.contextmanager
def served(args: list[str], ready_path: str = "/health"):
    """Start a server process on a free loopback port (`{port}` in args); yield its base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([a.replace("{port}", str(port)) for a in args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ})
    try:
        wait(base, proc, ready_path)
        yield base
    finally:
        proc.terminate()
        proc.wait(30)


def ttft_tasks(base: str, make, runs: int) -> dict:
    """TTFT p50 with every request on one task, and with requests alternating over 3 tasks."""
    ttft_http(base, make("support", Q[0]))  # warm up
    one = [ttft_http(base, make("support", Q[i % 4]))[0] for i in range(runs)]
    alt = [ttft_http(base, make(TASKS[i % 3], Q[i % 4]))[0] for i in range(runs)]
    return {"one_task_p50_ms": p50(one), "alternating_3_p50_ms": p50(alt)}


def messages_for(spec, text: str) -> list[dict]:
    msgs = [{"role": "system", "content": spec.system}] if spec.system else []
    for ex in spec.examples:
        msgs += [{"role": "user", "content": spec.template.replace("{input}", ex.user, 1)},
                 {"role": "assistant", "content": ex.assistant}]
    return msgs + [{"role": "user", "content": spec.template.replace("{input}", text, 1)}]


def p50(xs) -> float:
    return round(statistics.median(xs), 1)


def main() -> None:
    from prefix_edge import Runtime
    from prefix_edge.paths import default_bundle, default_tasks_file
    from prefix_edge.tasks import load_tasks

    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    bundle = a.bundle or default_bundle()
    specs = {s.name: s for s in load_tasks(default_tasks_file())}
    report: dict = {"bundle": str(bundle), "threads": a.threads}

    # a. in-process TTFT (time to the first chunk, as a streaming client sees it)
    inproc = []
    with Runtime.open(bundle, backend="gguf", threads=a.threads) as rt:
        ban = {str(e): -100 for e in rt.eos}
        rt.generate("support", Q[0], max_tokens=2)
        for i in range(a.runs):
            t0 = time.perf_counter()
            s = rt.stream("support", Q[i % 4], max_tokens=8)
            next(s)
            inproc.append((time.perf_counter() - t0) * 1e3)
            list(s)
    with served([sys.executable, "-m", "prefix_edge", "serve", "--bundle", str(bundle), "--backend",
                 "gguf", "--threads", str(a.threads), "--port", "{port}", "--slots", "8"]) as base:
        body = lambda t, q, n=8: {"model": t, "max_tokens": n, "messages": [{"role": "user", "content": q}]}  # noqa: E731
        ttft_http(base, body("support", Q[0], 2))
        via_server = [ttft_http(base, body("support", Q[i % 4]))[0] for i in range(a.runs)]
        report["ttft_overhead"] = {"in_process_p50_ms": p50(inproc), "server_p50_ms": p50(via_server),
                                   "overhead_p50_ms": round(p50(via_server) - p50(inproc), 1)}
        # b. throughput through the server
        thr = {}
        for n in (1, 4, 8):
            def one(k):
                b = {**body("support", Q[k % 4] + f" ({k})", 32), "logit_bias": ban}
                r = CLIENT.post(base + "/v1/chat/completions", json=b).json()
                return r["usage"]["completion_tokens"]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                toks = sum(pool.map(one, range(n)))
            thr[n] = round(toks / (time.perf_counter() - t0), 1)
        report["server_tok_s"] = {**thr, "4_vs_1": round(thr[4] / thr[1], 2), "8_vs_1": round(thr[8] / thr[1], 2)}
        # c. prefix-edge TTFT: one task, 3 alternating tasks
        report["prefix_edge_ttft"] = ttft_tasks(base, body, a.runs)

    # c. llama-cpp-python's own server, the prompt sent every time
    gguf = next((bundle / "gguf").glob("*.gguf"))
    with served([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--n_ctx", "4096",
                 "--n_threads", str(a.threads), "--n_threads_batch", str(a.threads),
                 "--port", "{port}", "--verbose", "false"], "/v1/models") as base:
        report["llama_cpp_server_ttft"] = ttft_tasks(
            base, lambda t, q: {"model": "x", "max_tokens": 8, "temperature": 0.0,
                                "messages": messages_for(specs[t], q)}, a.runs)
    pe, lc = report["prefix_edge_ttft"], report["llama_cpp_server_ttft"]
    report["ratio_llama_cpp_server_over_prefix_edge"] = {
        "one_task": round(lc["one_task_p50_ms"] / pe["one_task_p50_ms"], 2),
        "alternating_3": round(lc["alternating_3_p50_ms"] / pe["alternating_3_p50_ms"], 2)}
    print(json.dumps(report, indent=1))
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
