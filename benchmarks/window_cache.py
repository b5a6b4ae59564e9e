"""What `window_cache="window"` trades: llama.cpp's sliding-window layers kept as a ring of the
window and one batch (llama.cpp's own default) against "full" (prefix-edge's default: every
position's cells, so a restored state sits where a prefill leaves it).

For a GGUF bundle of a model with sliding-window layers (Gemma 3) and a task whose prefix passes
the window, on each mode:
- agreement: each input answered with the baked prefix and with the prefix prefilled
  (`use_prefix_cache=False`), greedy: replies equal, logprobs bit for bit, the largest gap in a
  chosen token's logprob;
- memory: the process's resident memory after opening the runtime and after one prompt of N
  random tokens (one slot, no prompt cache), each in a fresh process.

    python benchmarks/window_cache.py --bundle DIR --task french_long [--lengths 1000,3000,4000]
                                      [--out docs/window-cache.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

INPUTS = ["good night", "the dog", "I love you", "the red house", "my sister", "where is the bank",
          "the blue sky", "thank you very much"]
MODES = ("full", "window")


def agreement(bundle: str, task: str, mode: str, max_tokens: int) -> dict:
    from prefix_edge import Runtime

    tokens = bits = 0
    gap = 0.0
    with Runtime.open(bundle, backend="gguf", read_ahead=False, window_cache=mode) as rt:
        for text in INPUTS:
            cold = rt.generate(task, text, use_prefix_cache=False, logprobs=1, max_tokens=max_tokens)
            baked = rt.generate(task, text, logprobs=1, max_tokens=max_tokens)
            tokens += cold.tokens == baked.tokens
            bits += cold.logprobs == baked.logprobs
            for a, b in zip(cold.logprobs, baked.logprobs):
                if a[0] != b[0]:
                    break
                gap = max(gap, abs(a[1] - b[1]))
    return {"inputs": len(INPUTS), "replies_equal": tokens, "logprobs_bit_equal": bits,
            "max_chosen_logprob_gap": round(gap, 6)}


def memory(bundle: str, mode: str, n: int) -> dict:
    """Resident MiB after open and after a prompt of n tokens, in a fresh process."""
    code = f"""
import json, numpy as np
from prefix_edge import Runtime
def rss():
    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS')) / 1024
with Runtime.open({bundle!r}, backend='gguf', read_ahead=False, slots=1, prompt_cache_bytes=0,
                  window_cache={mode!r}, n_ctx={max(4096, n + 64)}) as rt:
    a = rss()
    rt.generate(None, np.random.default_rng(0).integers(1000, 50000, {n}).tolist(), max_tokens=1)
    print(json.dumps({{"open_mib": round(a), "after_mib": round(rss())}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return {"tokens": n, **got, "grew_mib": got["after_mib"] - got["open_mib"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--task", required=True, help="a task whose prefix passes the window")
    ap.add_argument("--lengths", default="1000,3000,4000")
    ap.add_argument("--max-tokens", type=int, default=6)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    report = {"date": time.strftime("%Y-%m-%d"), "machine": platform.machine(), "bundle": a.bundle,
              "task": a.task, "modes": {}}
    for mode in MODES:
        report["modes"][mode] = {"agreement": agreement(a.bundle, a.task, mode, a.max_tokens),
                                 "memory": [memory(a.bundle, mode, int(n)) for n in a.lengths.split(",")]}
        print(mode, json.dumps(report["modes"][mode]), flush=True)
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
