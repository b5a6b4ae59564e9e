"""A memory soak of `prefix-edge serve`: N seeded requests of a mix (chats of one and of several
turns, Responses chains with tool calls and full metadata, constrained answers, streams the
client leaves after two events, large stored responses, malformed bodies, chats with
documents from a small pool, composed half the time, embeddings of texts and of long token-id
inputs with every pooling), the server's RSS and
its stores' bytes (/metrics `prefix_edge_memory_bytes`) sampled as they run, against the bound
docs/server.md states: after warm-up the RSS grows by at most the stores' budgets.

    python benchmarks/soak.py [--bundle DIR] [--backend gguf] [--requests 500] [--seed 0]
                              [--concurrency 4] [--out docs/soak.json] [-- serve options...]

The suite runs a bounded version (tests/test_serve_store.py) through `run()`.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

SLACK_MIB = 64  # allocator and interpreter noise the bound allows beyond the budgets
# documents the "documents" requests draw from (so that they repeat, in other orders: the
# prompt cache and the document cache both fill)
DOC_POOL = [" ".join(f"Item {i}.{k} of this sheet is rated {(i * 31 + k * 7) % 50} out of 50." for k in range(12))
            for i in range(6)]
WORDS = ("sync stopped metered connection resume settings parcel damaged order mugs Valencia "
         "review great broke battery train station naïve café 🚀 refund").split()
TOOL = {"type": "function", "name": "lookup", "description": "Look an order up.",
        "parameters": {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]}}
METADATA = {f"key{i:02d}" + "k" * 59: "v" * 512 for i in range(16)}  # OpenAI's most: 16 x 64/512


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stores(base: str) -> dict[str, dict[str, int]]:
    """/metrics' memory lines: {store: {bytes, budget_bytes}}."""
    out: dict[str, dict[str, int]] = {}
    for m in re.finditer(r'^prefix_edge_memory_(bytes|budget_bytes)\{store="([^"]+)"\} (\d+)',
                         httpx.get(base + "/metrics", timeout=60).text, re.M):
        out.setdefault(m.group(2), {})[m.group(1)] = int(m.group(3))
    return out


class Mix:
    """The seeded requests: `next()` gives (method, path, body, stream: 0 none, 1 whole, 2 leave early)."""

    def __init__(self, base: str, seed: int):
        self.rng = random.Random(seed)
        cards = httpx.get(base + "/v1/models", timeout=60).json()["data"]
        self.chat = sorted(c["id"] for c in cards if c.get("chat", True)) or ["base"]
        self.text = sorted(c["id"] for c in cards if not c.get("chat", True))  # completions
        self.ids: list[str] = []  # stored responses to chain from
        self.lock = threading.Lock()

    def words(self, lo: int, hi: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(lo, hi)))

    def next(self) -> tuple[str, str, dict | bytes, int]:
        r = self.rng
        with self.lock:
            kind = r.choice(["chat", "chat", "turns", "chain", "chain", "tool", "constraint",
                             "leave", "big", "bad", "documents", "embeddings"] + (["text"] if self.text else []))
            task, mt = r.choice(self.chat), r.randint(1, 12)
            if kind == "chat":
                return "POST", "/v1/chat/completions", {"model": task, "max_tokens": mt, "messages": [
                    {"role": "user", "content": self.words(2, 40)}], "stream": r.random() < 0.3}, 1
            if kind == "documents":  # a few of a small pool, any order; composed half the time
                docs = [{"title": f"Sheet {i}", "text": DOC_POOL[i]} for i in r.sample(range(len(DOC_POOL)), r.randint(1, 3))]
                return "POST", "/v1/chat/completions", {
                    "model": "base", "max_tokens": mt, "documents": docs, "compose_documents": r.random() < 0.5,
                    "messages": [{"role": "user", "content": self.words(2, 12)}], "stream": r.random() < 0.3}, 1
            if kind == "embeddings":  # texts, or now and then long token-id inputs; any pooling
                inp = [[r.randrange(3, 300) for _ in range(300)] for _ in range(4)] if r.random() < 0.15 \
                    else [self.words(2, 30) for _ in range(r.randint(1, 8))]
                return "POST", "/v1/embeddings", {"model": "base", "input": inp,
                                                  "pooling": r.choice(["prompt", "mean", "last"])}, 0
            if kind == "turns":
                msgs = []
                for _ in range(r.randint(2, 4)):
                    msgs += [{"role": "user", "content": self.words(2, 20)},
                             {"role": "assistant", "content": self.words(1, 10)}]
                return "POST", "/v1/chat/completions", {"model": task, "max_tokens": mt,
                                                        "messages": msgs[:-1]}, 0
            if kind == "text":
                return "POST", "/v1/completions", {"model": r.choice(self.text), "max_tokens": mt,
                                                   "prompt": self.words(2, 30)}, 0
            if kind == "constraint":
                fmt = r.choice([{"type": "json_schema", "json_schema": {"name": "o", "schema": {
                    "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}},
                    {"type": "regex", "regex": "(yes|no) [0-9]{1,3}"}, {"type": "json_object"}])
                return "POST", "/v1/chat/completions", {"model": task, "max_tokens": mt, "response_format": fmt,
                                                        "messages": [{"role": "user", "content": self.words(2, 20)}]}, 0
            if kind == "leave":
                return "POST", "/v1/chat/completions", {"model": task, "max_tokens": 64, "stream": True, "messages": [
                    {"role": "user", "content": self.words(2, 20)}]}, 2
            if kind == "bad":
                return "POST", r.choice(["/v1/chat/completions", "/v1/responses"]), r.choice([
                    b'{"model": "x", "messages": [[[[', b'{"model": 1}', b'[' * 3000 + b']' * 3000,
                    json.dumps({"model": task, "input": "x", "previous_response_id": ["a"]}).encode(),
                    json.dumps({"model": task, "input": "x", "metadata": {"k": "v" * 600}}).encode()]), 0
            body: dict = {"model": task, "max_output_tokens": mt, "input": self.words(2, 30)}
            if kind in ("chain", "tool") and self.ids and r.random() < 0.8:
                body["previous_response_id"] = r.choice(self.ids[-20:])
            if kind == "tool":
                body.update(tools=[TOOL], tool_choice="required", max_output_tokens=24)
            elif kind == "chain" and r.random() < 0.5:
                call = f"call_{r.randrange(10**6)}"
                body["input"] = [{"type": "function_call", "call_id": call, "name": "lookup",
                                  "arguments": json.dumps({"order": self.words(1, 2)})},
                                 {"type": "function_call_output", "call_id": call, "output": self.words(1, 8)}]
            if kind == "big":
                body["user"] = "u" * r.randint(100_000, 400_000)  # stored with the response
            body["metadata"] = METADATA if r.random() < 0.5 else {"k": "v"}
            body["stream"] = r.random() < 0.3
            return "POST", "/v1/responses", body, 1 if body["stream"] else 0

    def done(self, body, answer: bytes) -> None:
        """Keep a stored response's id to chain from."""
        if isinstance(body, dict) and "input" in body:
            m = re.search(rb'"id":\s*"(resp_[0-9a-f]+)"', answer)
            if m:
                with self.lock:
                    self.ids.append(m.group(1).decode())


def send(client: httpx.Client, base: str, mix: Mix, req) -> int:
    method, path, body, stream = req
    kw = {"content": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    if stream == 2:  # leave after two events
        with client.stream(method, base + path, **kw) as r:
            for k, _ in enumerate(r.iter_lines()):
                if k >= 2:
                    break
            return r.status_code
    r = client.request(method, base + path, **kw)
    mix.done(body, r.content)
    return r.status_code


def run(base: str, pid: int, requests: int = 500, seed: int = 0, concurrency: int = 4,
        warmup: int | None = None, samples: int = 20) -> dict:
    """Drive the mix; sample RSS and the stores every requests/samples requests."""
    mix = Mix(base, seed)
    warmup = max(1, requests // 10) if warmup is None else warmup
    statuses: dict[int, int] = {}
    trace = [{"done": 0, "rss_mib": round(rss_mib(pid), 1), "stores": stores(base)}]
    every = max(1, requests // samples)
    reqs = [mix.next() for _ in range(requests)]  # drawn up front: the same sequence every run
    with httpx.Client(timeout=600) as client, ThreadPoolExecutor(concurrency) as pool:
        for start in range(0, requests, every):
            for code in pool.map(lambda q: send(client, base, mix, q), reqs[start:start + every]):
                statuses[code] = statuses.get(code, 0) + 1
            trace.append({"done": min(requests, start + every), "rss_mib": round(rss_mib(pid), 1),
                          "stores": stores(base)})
    warm = next(t for t in trace if t["done"] >= warmup)
    budgets = {k: v["budget_bytes"] for k, v in trace[-1]["stores"].items()}
    bound = sum(budgets.values()) / 2**20 + SLACK_MIB
    growth = max(t["rss_mib"] for t in trace) - warm["rss_mib"]
    over = [(t["done"], k) for t in trace for k, v in t["stores"].items() if v["bytes"] > v["budget_bytes"]]
    return {"requests": requests, "seed": seed, "concurrency": concurrency, "statuses": statuses,
            "rss_start_mib": trace[0]["rss_mib"], "rss_warm_mib": warm["rss_mib"],
            "rss_max_mib": max(t["rss_mib"] for t in trace), "rss_end_mib": trace[-1]["rss_mib"],
            "growth_after_warmup_mib": round(growth, 1), "bound_growth_mib": round(bound, 1),
            "budgets_bytes": budgets, "stores_over_budget": over,
            "max_store_bytes": {k: max(t["stores"].get(k, {}).get("bytes", 0) for t in trace) for k in budgets},
            "trace": trace}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--backend", default="gguf")
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--out", default=None)
    ap.add_argument("--log", default=None, help="write the server's stderr here")
    ap.add_argument("serve", nargs="*", help="more `prefix-edge serve` options (after --)")
    a = ap.parse_args()
    port = free_port()
    cmd = [sys.executable, "-m", "prefix_edge", "serve", "--port", str(port), "--backend", a.backend,
           *(["--bundle", a.bundle] if a.bundle else []), *a.serve]
    log = open(a.log, "wb") if a.log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise SystemExit("the server did not start")
        t0 = time.time()
        report = run(base, proc.pid, a.requests, a.seed, a.concurrency)
        report.update(command=" ".join(["python benchmarks/soak.py", *sys.argv[1:]]),
                      seconds=round(time.time() - t0, 1))
    finally:
        if proc.poll() is not None:
            print(f"the server exited with status {proc.returncode}", file=sys.stderr)
        proc.terminate()
        proc.wait(60)
    summary = {k: v for k, v in report.items() if k != "trace"}
    print(json.dumps(summary, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    ok = not report["stores_over_budget"] and report["growth_after_warmup_mib"] <= report["bound_growth_mib"] \
        and not any(code >= 500 for code in report["statuses"])
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
