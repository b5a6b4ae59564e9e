"""A runtime's decode against its engine's own, in one run: what the runtime (scheduler, sampling,
streaming) costs per token, and the OpenMP hazard that made it cost two thirds (2026-12-05).

    python benchmarks/runtime_decode.py [--bundle DIR] [--threads 2] [--tokens 32] [--rounds 3]
                                        [--out docs/runtime-decode.json]

Each measurement runs in a fresh process (a decode on a thread marks the process for good), rounds
alternating the four (the default bundle's GGUF, greedy, EOS held off, medians over rounds):
- "engine alone": the engine's one-sequence API on a fresh engine, on this thread;
- "runtime, slots 1" and "runtime, slots 4": Runtime.generate on runtimes of 1 and 4 slots
  (the engine thread decodes; 4 slots is the server's default);
- "runtime, slots 4, after a decode on this thread": the same runtime once this (long-lived)
  thread has run one forward on the engine itself. llama.cpp's OpenMP keeps a thread pool per
  thread that ever decoded; with two pools on a machine whose cores the engine's threads fill,
  libgomp throttles its spinning and the engine thread's decodes wait on futexes. Runtime.open
  now opens the engine on a thread that ends (runtime/engines/overlap.on_own_thread); before,
  its open-time probes left a pool on the opening thread and every multi-slot runtime decoded
  as this last row does.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

MESSAGES = [{"role": "user", "content": "How do I get a refund?"}]


MODES = ("engine alone", "runtime, slots 1", "runtime, slots 4", "runtime, slots 4, after a decode on this thread")


def measure(mode: str, bundle_dir: Path, threads: int, tokens: int) -> float:
    """One mode's decode tokens/s, in this (fresh) process."""
    import numpy as np

    from prefix_edge import Runtime
    from prefix_edge.bundle import Bundle
    from prefix_edge.runtime.engines import open_backend

    bundle = Bundle.open(bundle_dir)
    if mode == "engine alone":
        be = open_backend("gguf", bundle.model_file("gguf"), threads=threads, n_ctx=2048)
        be.begin(None)
        be.prefill(np.arange(10, 40, dtype=np.int64))
        t = time.perf_counter()
        for i in range(tokens):
            be.step(100 + i)
        return tokens / (time.perf_counter() - t)
    no_end = {str(t): -100.0 for t in bundle.manifest.model.eos_token_ids}
    with Runtime.open(bundle.root, backend="gguf", threads=threads, slots=1 if "slots 1" in mode else 4,
                      prompt_cache_bytes=0, read_ahead=False) as rt:
        if "after a decode" in mode:  # one forward on this thread, as the open-time probes did before
            rt.backend.forward([(0, 0, np.array([1, 2], np.int64))])
            rt.backend.seq_free(0)
        rt.generate(None, messages=MESSAGES, max_tokens=4)
        return rt.generate(None, messages=MESSAGES, max_tokens=tokens, logit_bias=no_end).stats.decode_tok_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child's mode
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from prefix_edge.bundle import Bundle
    from prefix_edge.paths import default_bundle

    bundle = Bundle.open(args.bundle or default_bundle())
    if args.one is not None:
        print(json.dumps({"tok_s": measure(args.one, bundle.root, args.threads, args.tokens)}))
        return
    import subprocess

    rows: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            out = subprocess.run([sys.executable, __file__, "--bundle", str(bundle.root), "--threads", str(args.threads),
                                  "--tokens", str(args.tokens), "--one", mode], capture_output=True, text=True, check=True)
            rows[mode].append(json.loads(out.stdout.strip().splitlines()[-1])["tok_s"])
    base = statistics.median(rows["engine alone"])
    report = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {args.threads} threads",
              "bundle": bundle.manifest.model.source, "tokens": args.tokens, "rounds": args.rounds,
              "decode_tok_s": {k: {"median": round(statistics.median(v), 1),
                                   "vs_engine_alone": round(statistics.median(v) / base, 2)} for k, v in rows.items()}}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
