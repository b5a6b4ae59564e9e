"""The GPU check's measurements (benchmarks/gpu_check.sh installs the GPU builds, then runs this):
on each backend (onnx, gguf) and device (cpu, then cuda where this install has it), open the
bundle and, on its longest task, greedy:

- baked == prefilled: the tokens with the prefix restored from its baked file equal the tokens
  with the prefix prefilled in the request (the check that matters on a new device);
- restore time (Stats.prefix_load_ms of the first request, the prefix read from its file), TTFT
  restored from the file, from memory (the runtime's LRU) and prefilled, medians of --runs;
- the device's tokens against the CPU's (reported, not asserted: GPU kernels may round otherwise).

Writes one JSON object (--out); exit 1 when a baked != prefilled is seen or a device asked for
with --devices does not open. Runs on a CPU-only host too (`--devices cpu`): that is how the
script is checked where no GPU is lent.

    python benchmarks/gpu_check.py [--bundle DIR] [--devices cpu,cuda] [--runs 5] --out FILE
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

QUESTION = "I deleted a folder by mistake three weeks ago on the Free plan. Can I get it back?"


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


def measure(bundle: str | None, backend: str, device: str, runs: int, max_tokens: int) -> dict:
    from prefix_edge import Runtime
    from prefix_edge.errors import PrefixEdgeError

    t0 = time.perf_counter()
    try:
        # one prefix in memory at a time, no prompt cache: each TTFT is what its name says
        rt = Runtime.open(bundle, backend=backend, device=device, prefix_cache_size=1,
                          prompt_cache_bytes=0)
    except PrefixEdgeError as e:
        return {"backend": backend, "device": device, "ok": False, "error": str(e)}
    row: dict = {"backend": backend, "device": device, "open_s": round(time.perf_counter() - t0, 2)}
    with rt:
        task = max(rt.tasks, key=lambda k: rt.tasks[k].prefix_tokens)
        other = min(rt.tasks, key=lambda k: rt.tasks[k].prefix_tokens)  # evicts `task` from the LRU
        row.update(task=task, prefix_tokens=rt.tasks[task].prefix_tokens)
        from_file, restore, from_memory, prefilled = [], [], [], []
        for _ in range(runs):
            rt.generate(other, QUESTION, max_tokens=1)
            r = rt.generate(task, QUESTION, max_tokens=1)       # the prefix read from its file
            from_file.append(r.stats.ttft_ms)
            restore.append(r.stats.prefix_load_ms)
            r = rt.generate(task, QUESTION, max_tokens=1)       # the same prefix, now in memory
            from_memory.append(r.stats.ttft_ms)
            r = rt.generate(task, QUESTION, max_tokens=1, use_prefix_cache=False)
            prefilled.append(r.stats.ttft_ms)
        baked = rt.generate(task, QUESTION, max_tokens=max_tokens)
        plain = rt.generate(task, QUESTION, max_tokens=max_tokens, use_prefix_cache=False)
        row.update(
            ok=baked.tokens == plain.tokens,
            baked_tokens=list(baked.tokens), prefilled_tokens=list(plain.tokens), text=baked.text,
            restore_ms=_median(restore), ttft_from_file_ms=_median(from_file),
            ttft_from_memory_ms=_median(from_memory), ttft_prefilled_ms=_median(prefilled),
            decode_tok_s=round(baked.stats.decode_tok_s, 1), threads=rt.threads)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=None, help="a bundle dir (default: the default bundle)")
    ap.add_argument("--backends", default="onnx,gguf")
    ap.add_argument("--devices", default="cpu,cuda", help="cpu first: the others are compared with it")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", required=True)
    ap.add_argument("--context", default="{}", help="JSON merged into the output (the driver's facts)")
    a = ap.parse_args(argv)
    devices = [d for d in a.devices.split(",") if d]
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
           "platform": f"{platform.system()} {platform.machine()}", "python": platform.python_version(),
           **json.loads(a.context), "rows": []}
    for backend in [b for b in a.backends.split(",") if b]:
        for device in devices:
            row = measure(a.bundle, backend, device, a.runs, a.max_tokens)
            cpu = next((r for r in out["rows"] if r["backend"] == backend and r["device"] == "cpu"
                        and "baked_tokens" in r), None)
            if device != "cpu" and cpu and "baked_tokens" in row:
                same = [x == y for x, y in zip(row["baked_tokens"], cpu["baked_tokens"])]
                row["tokens_equal_cpu"] = row["baked_tokens"] == cpu["baked_tokens"]
                row["first_token_differing_from_cpu"] = same.index(False) if False in same else None
                row["ttft_from_file_vs_cpu"] = round(row["ttft_from_file_ms"] / cpu["ttft_from_file_ms"], 3)
                row["restore_vs_cpu"] = round(row["restore_ms"] / max(cpu["restore_ms"], 1e-3), 3)
            out["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if not k.endswith("_tokens")}), file=sys.stderr)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(r.get("ok") for r in out["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
