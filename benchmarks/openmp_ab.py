"""The portable llama.cpp build with GNU OpenMP (the default: scripts/llama-wheel.sh, the wheel
carrying libgomp.so.1) against one built without it (ggml's own thread pool), side by side on
the default bundle: decode tok/s and the prefilled TTFT of `support`, 2 threads and 1, rounds
alternating between the builds (each round a fresh process), medians.

    python benchmarks/openmp_ab.py [--rounds 4] [--out docs/openmp-ab.json]

The other build is made once with `PREFIX_EDGE_LLAMA_CMAKE_ARGS=-DGGML_OPENMP=OFF bash
scripts/llama-wheel.sh --build` (its own wheelhouse key) and installed into a scratch directory
put first on PYTHONPATH for its rounds. docs/contention.md has the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROUND = """
import json, statistics, sys
from prefix_edge import Runtime
q = "Can I get a refund for an order that arrived broken?"
with Runtime.open(backend="gguf", threads=int(sys.argv[1])) as rt:
    rt.generate("support", q, max_tokens=4)
    d, p = [], []
    for _ in range(3):
        d.append(rt.generate("support", q, max_tokens=64).stats.decode_tok_s)
        p.append(rt.generate("support", q, max_tokens=1, use_prefix_cache=False, use_prompt_cache=False).stats.ttft_ms)
print(json.dumps({"decode_tok_s": statistics.median(d), "prefilled_ttft_ms": statistics.median(p)}))
"""


def build_without_openmp(scratch: Path) -> Path:
    env = {**os.environ, "PREFIX_EDGE_LLAMA_CMAKE_ARGS": "-DGGML_OPENMP=OFF"}
    wheel = subprocess.run(["bash", str(ROOT / "scripts" / "llama-wheel.sh"), "--build"], env=env, check=True,
                           capture_output=True, text=True).stdout.strip().splitlines()[-1]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(scratch), wheel],
                   check=True)
    return scratch


def one(threads: int, pythonpath: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    p = subprocess.run([sys.executable, "-c", ROUND, str(threads)], env=env, capture_output=True, text=True,
                       check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default="docs/openmp-ab.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        other = str(build_without_openmp(Path(d)))
        builds = {"openmp": None, "no-openmp": other}
        rows = {}
        for threads in (2, 1):
            runs = {b: [] for b in builds}
            for _ in range(a.rounds):
                for b, path in builds.items():
                    runs[b].append(one(threads, path))
            for b, rs in runs.items():
                rows.setdefault(str(threads), {})[b] = {
                    k: round(statistics.median(r[k] for r in rs), 1) for k in ("decode_tok_s", "prefilled_ttft_ms")}
            base = rows[str(threads)]["openmp"]
            rows[str(threads)]["no-openmp / openmp"] = {
                k: round(rows[str(threads)]["no-openmp"][k] / base[k], 3) for k in base}
            print(threads, json.dumps(rows[str(threads)]))
    report = {"date": time.strftime("%Y-%m-%d"), "machine": platform.machine(), "cpus": os.cpu_count(),
              "rounds": a.rounds, "threads": rows}
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
