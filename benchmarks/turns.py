"""Time to first token of turn k in a 10-turn conversation: the turn cache vs a full prefill,
both engines in process, and the server against llama-cpp-python's own server on the same GGUF.

    python benchmarks/turns.py [--bundle DIR] [--turns 10] [--out docs/turns.json]

The conversation is scripted (fixed user messages and fixed assistant replies), so every
runner sees the same history; the reply each turn generates is timed to its first token and
then dropped. Task: `support` (its 284-token system prompt is the baked prefix); llama-cpp-python's
server gets that system prompt as the first message and keeps its slot's prompt cache across
requests (its default). Both servers decode with the same threads. TTFT over HTTP is the time
from sending the request to the first content delta of the SSE stream.
llama-cpp-python's server needs: pip install sse-starlette starlette-context pydantic-settings
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

USER = [
    "My sync stopped this morning.", "I am on a train with mobile data.", "Where is that setting?",
    "Done, it syncs again. How much space does Plus have?", "And Family?", "Can I pay yearly?",
    "I deleted a folder last week, can I get it back?", "I am on Free.", "How do I reset my password?",
    "Thanks, that is all for today.", "One more: is there an outage now?", "Great, bye!",
]
ASSISTANT = [
    "Sync pauses automatically on metered connections. You can resume it from Settings > Network.",
    "Mobile data counts as metered, so sync is paused to save your data allowance.",
    "Open Settings, then Network, and switch on syncing over metered connections.",
    "Plus has 200 GB for up to five devices, for $4 per month.",
    "Family has 2 TB shared by up to six people, for $12 per month.",
    "Yes: annual billing saves two months compared with paying monthly.",
    "Deleted files stay in the Trash for 30 days on Free and 180 days on Plus and Family.",
    "Then you can restore it from the Trash if it was deleted less than 30 days ago.",
    "Go to nimbus.example/reset; support staff can never see or change a password.",
    "You are welcome, have a good day!", "Outages are posted at status.nimbus.example.", "Bye!",
]


def conversation(k: int) -> list[dict]:
    """The messages of turn k (1-based): k-1 scripted exchanges, then user message k."""
    msgs = []
    for i in range(k - 1):
        msgs += [{"role": "user", "content": USER[i]}, {"role": "assistant", "content": ASSISTANT[i]}]
    return msgs + [{"role": "user", "content": USER[k - 1]}]


def in_process(bundle, backend: str, turns: int, max_tokens: int, cache: bool) -> list[dict]:
    from prefix_edge import Runtime

    out = []
    with Runtime.open(bundle, backend=backend, slots=1, prompt_cache_bytes=(512 << 20) if cache else 0) as rt:
        rt.generate("support", messages=conversation(1), max_tokens=2)  # warm the engine
        rt.prompts.clear()
        for k in range(1, turns + 1):
            r = rt.generate("support", messages=conversation(k), max_tokens=max_tokens)
            out.append({"turn": k, "ttft_ms": r.stats.ttft_ms, "prompt_tokens": r.stats.prefix_tokens
                        + r.stats.input_tokens, "cached_tokens": r.stats.cached_tokens})
    return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(args: list[str], port: int) -> subprocess.Popen:
    import tempfile

    log = tempfile.TemporaryFile()  # not a pipe: llama.cpp's load log would fill it and block
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(1200):
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"server failed: {log.read().decode(errors='replace')[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not start")


def over_http(port: int, model: str, system: str | None, turns: int, max_tokens: int) -> list[dict]:
    out = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", timeout=600) as c:
        for k in range(0, turns + 1):  # turn 0: a warm-up request, not reported
            msgs = conversation(max(k, 1))
            if system is not None:
                msgs = [{"role": "system", "content": system}] + msgs
            body = {"model": model, "messages": msgs, "max_tokens": max_tokens, "temperature": 0,
                    "stream": True}
            t0 = time.perf_counter()
            ttft = None
            with c.stream("POST", "/chat/completions", json=body) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if ttft is None and line.startswith("data: {"):
                        delta = json.loads(line[6:])["choices"]
                        if delta and delta[0].get("delta", {}).get("content"):
                            ttft = (time.perf_counter() - t0) * 1e3
            if k:
                out.append({"turn": k, "ttft_ms": round(ttft or float("nan"), 1)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out", default="docs/turns.json")
    a = ap.parse_args()
    from prefix_edge import Runtime
    from prefix_edge.paths import default_bundle

    bundle = Path(a.bundle) if a.bundle else default_bundle()
    with Runtime.open(bundle, backend="gguf", slots=1) as rt:
        threads = rt.threads
        gguf = rt.root / next(f for f in rt.manifest.backends["gguf"].files if f.endswith(".gguf"))
        system = rt.manifest.tasks["support"].chat_messages[0]["content"]
        backends = [b for b in ("gguf", "onnx") if b in rt.manifest.backends]
    report = {"bundle": str(bundle), "turns": a.turns, "max_tokens": a.max_tokens, "threads": threads,
              "date": time.strftime("%Y-%m-%d"), "in_process": {}, "http": {}}
    for b in backends:
        for cache in (True, False):
            report["in_process"][f"{b} turn cache {'on' if cache else 'off'}"] = \
                in_process(bundle, b, a.turns, a.max_tokens, cache)
    port = _port()
    ours = _serve([sys.executable, "-m", "prefix_edge", "serve", "--bundle", str(bundle), "--port",
                   str(port), "--backend", "gguf", "--slots", "1", "--threads", str(threads)], port)
    try:
        report["http"]["prefix-edge serve (gguf)"] = over_http(port, "support", None, a.turns, a.max_tokens)
    finally:
        ours.terminate()
        ours.wait(30)
    port = _port()
    peer = _serve([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                   "--n_ctx", "4096", "--n_threads", str(threads), "--n_threads_batch", str(threads)], port)
    try:
        report["http"]["llama-cpp-python server"] = over_http(port, "x", system, a.turns, a.max_tokens)
    finally:
        peer.terminate()
        peer.wait(30)
    for group in ("in_process", "http"):
        for name, rows in report[group].items():
            t = {r["turn"]: r["ttft_ms"] for r in rows}
            report.setdefault("turn10_over_turn2", {})[name] = round(t[a.turns] / t[2], 2)
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["turn10_over_turn2"], indent=1))
    for group in ("in_process", "http"):
        for name, rows in report[group].items():
            print(f"{name:36s}", " ".join(f"{r['ttft_ms']:7.1f}" for r in rows))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
