"""What forwarding decoding sequences one at a time costs where llama.cpp computes a token beside
another sequence's otherwise than alone (Gemma 3, Gemma 3n: `batches_sequences` False, measured
at open). N requests started together on one runtime, greedy, `--max-tokens` each: wall time and
tokens per second, the engine's own choice (one forward per sequence) against one forward for
them all (the engine's flag overridden here, as before 2026-12-05), alternating rounds in one
process; and whether each request's tokens equal its lone run.

    python benchmarks/serial_decode.py --bundle DIR --task french [--requests 4] [--max-tokens 48]
                                       [--rounds 3] [--out docs/serial-decode.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import threading
import time
from pathlib import Path

INPUTS = ["good night", "the dog", "I love you", "the red house", "my sister", "where is the bank",
          "the blue sky", "thank you very much"]


def run_one(rt, task: str, text: str, max_tokens: int) -> list[int]:
    """Greedy, the end of sequence forbidden: every request decodes max_tokens."""
    no_end = {int(t): -100.0 for t in rt.manifest.model.eos_token_ids}
    return rt.generate(task, text, max_tokens=max_tokens, logit_bias=no_end).tokens


def together(rt, task: str, texts: list[str], max_tokens: int) -> tuple[float, list]:
    out: dict = {}

    def one(k: int) -> None:
        out[k] = run_one(rt, task, texts[k], max_tokens)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(texts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, [out[k] for k in range(len(texts))]


def main() -> None:
    from prefix_edge import Runtime

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--task", required=True)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    texts = (INPUTS * a.requests)[:a.requests]
    with Runtime.open(a.bundle, backend="gguf", slots=a.requests, read_ahead=False, prompt_cache_bytes=0) as rt:
        be = rt.backend
        measured = be.batches_sequences
        alone = [run_one(rt, a.task, t, a.max_tokens) for t in texts]
        times: dict = {"one forward each": [], "one forward for all": []}
        equal: dict = {k: 0 for k in times}
        for _ in range(a.rounds):
            for mode, flag in (("one forward each", False), ("one forward for all", True)):
                be.batches_sequences = flag
                s, got = together(rt, a.task, texts, a.max_tokens)
                times[mode].append(s)
                equal[mode] += sum(g == w for g, w in zip(got, alone))
        be.batches_sequences = measured
    n = a.requests * a.max_tokens
    report = {"date": time.strftime("%Y-%m-%d"), "machine": platform.machine(), "bundle": a.bundle,
              "task": a.task, "requests": a.requests, "max_tokens": a.max_tokens, "rounds": a.rounds,
              "engine_batches_sequences": measured,
              "modes": {m: {"median_s": round(statistics.median(v), 3),
                            "tokens_per_s": round(n / statistics.median(v), 1),
                            "requests_equal_to_alone": f"{equal[m]}/{a.requests * a.rounds}"} for m, v in times.items()}}
    print(json.dumps(report, indent=1))
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
