"""The server's generator beside its own embedder (one Runtime, as `prefix-edge serve` runs them):
chat requests timed alone, then while another thread embeds batches of 16 texts in a loop, with
threads "auto" (forwards lease their threads from one CPU budget) and fixed at every core (each
native pool full-width, as before).

    python benchmarks/chat_with_embeddings.py [--bundle DIR] [--backend onnx,gguf] [--requests 6] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
from pathlib import Path

TEXTS = [f"Order {i}: {n} desk lamps to {c}, arrived {s}." for i, (n, c, s) in enumerate(
    [(3, "Porto", "broken"), (1, "Lyon", "late"), (7, "Oslo", "fine"), (2, "Quito", "damp")] * 4)]


def run(bundle, backend: str, threads, requests: int, with_embeddings: bool) -> dict:
    from prefix_edge import Runtime

    with Runtime.open(bundle, backend=backend, threads=threads) as rt:
        task = "support" if "support" in rt.tasks else next(iter(rt.tasks))
        rt.generate(task, "hello", max_tokens=2)
        rt.embed(TEXTS[:2])
        stop = threading.Event()
        embedded = [0]

        def embed_loop():
            while not stop.is_set():
                rt.embed(TEXTS)
                embedded[0] += len(TEXTS)

        t = threading.Thread(target=embed_loop, daemon=True)
        if with_embeddings:
            t.start()
        ttft, tok_s = [], []
        for i in range(requests):
            r = rt.generate(task, f"Can I get a refund for order {i}?", max_tokens=32, use_prompt_cache=False)
            ttft.append(r.stats.ttft_ms)
            tok_s.append(r.stats.decode_tok_s)
        stop.set()
        if with_embeddings:
            t.join()
    return {"backend": backend, "threads": "auto" if threads is None else f"fixed {threads}",
            "embeddings_beside": with_embeddings, "ttft_ms": round(statistics.median(ttft), 1),
            "decode_tok_s": round(statistics.median(tok_s), 1), "texts_embedded": embedded[0]}


def main() -> None:
    from prefix_edge.runtime.engines.cpus import default_threads

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--backend", default="onnx,gguf")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows = []
    for backend in a.backend.split(","):
        for threads in (None, default_threads()):
            for beside in (False, True):
                rows.append(run(a.bundle, backend, threads, a.requests, beside))
                print(json.dumps(rows[-1]), flush=True)
    if a.out:
        a.out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
