"""A conversation's turns with long replies: time to first token per turn with the reply read
ahead (the default) and without (`read_ahead=False`), each turn's tokens checked against the
same conversation run cold (`use_prompt_cache=False`).

The model answers itself (its replies go back into the history as a chat client sends them),
`--max-tokens` per reply, one slot; between turns the benchmark waits until the reply has been
read ahead (what the user's reading time gives it) and reports how long that took.

    python benchmarks/read_ahead.py [--bundle DIR] [--turns 10] [--max-tokens 120]
                                    [--out docs/read-ahead.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

USER = [
    "My sync stopped this morning. What can I do?", "I am on a train with mobile data.",
    "Where is that setting exactly?", "It syncs again. How much space does Plus have?",
    "And the Family plan?", "Can I pay yearly, and what does it save?",
    "I deleted a folder last week, can I get it back?", "I am on the Free plan.",
    "How do I reset my password?", "Is there an outage right now?", "Thanks, that is all.",
]


def run(bundle, backend: str, turns: int, max_tokens: int, read_ahead: bool, threads: int) -> list[dict]:
    from prefix_edge import Runtime

    rows, msgs = [], []
    with Runtime.open(bundle, backend=backend, slots=1, threads=threads, read_ahead=read_ahead) as rt:
        def settled() -> int:
            info = rt.engine_info()["read_ahead"]
            return info["done"] + info["skipped"]

        def wait(n: int) -> None:
            for _ in range(6000):
                if settled() >= n:
                    return
                time.sleep(0.01)

        rt.generate("support", messages=[{"role": "user", "content": "hi"}], max_tokens=2)  # warm up
        wait(1 if read_ahead else 0)
        rt.prompts.clear()
        for k in range(turns):
            msgs.append({"role": "user", "content": USER[k % len(USER)]})
            before = settled()
            r = rt.generate("support", messages=msgs, max_tokens=max_tokens)
            t = time.perf_counter()
            if read_ahead:  # the user reads; the reply is read ahead meanwhile
                wait(before + 1)
            read_s = time.perf_counter() - t
            cold = rt.generate("support", messages=msgs, max_tokens=max_tokens, use_prompt_cache=False)
            rows.append({"turn": k + 1, "ttft_ms": r.stats.ttft_ms, "cold_ttft_ms": cold.stats.ttft_ms,
                         "prompt_tokens": r.stats.prefix_tokens + r.stats.input_tokens,
                         "cached_tokens": r.stats.cached_tokens, "reply_tokens": len(r.tokens),
                         "equals_cold": r.tokens == cold.tokens,
                         "read_ahead_s": round(read_s, 3) if read_ahead else None})
            msgs.append({"role": "assistant", "content": r.text})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--backends", default="onnx,gguf")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="docs/read-ahead.json")
    a = ap.parse_args()
    from prefix_edge.paths import default_bundle

    bundle = Path(a.bundle) if a.bundle else default_bundle()
    report = {"date": time.strftime("%Y-%m-%d"), "bundle": str(bundle), "turns": a.turns,
              "max_tokens": a.max_tokens, "threads": a.threads,
              "machine": platform.processor() or platform.machine(), "engines": {}}
    for backend in a.backends.split(","):
        out = {}
        for mode, flag in (("read_ahead", True), ("off", False)):
            rows = run(bundle, backend, a.turns, a.max_tokens, flag, a.threads)
            later = [r["ttft_ms"] for r in rows[1:]]
            out[mode] = {"rows": rows, "ttft_last_over_second": round(rows[-1]["ttft_ms"] / rows[1]["ttft_ms"], 2),
                         "ttft_median_ms": round(statistics.median(later), 1),
                         "equal_to_cold": sum(r["equals_cold"] for r in rows)}
            print(f"{backend} {mode}: TTFT turn 2..{a.turns} " +
                  " ".join(f"{r['ttft_ms']:.0f}" for r in rows[1:]) +
                  f" ms; last/second {out[mode]['ttft_last_over_second']}; "
                  f"{out[mode]['equal_to_cold']}/{len(rows)} equal to cold", flush=True)
        report["engines"][backend] = out
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
