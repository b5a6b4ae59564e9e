"""Compressed prefixes on the default model: task × ratio × score on both engines.

Exports the default model with 8-bit prefix stores (`--prefix-store q8_0 --gguf-kv q8_0`) at
each ratio (none = the uncompressed baseline), then scores every demo text task with
`prefix-edge eval --no-whole` on both backends (the uncompressed bundle is the baseline). Writes docs/compression-report.json; docs/compression.md gives the table.

    python benchmarks/compression_eval.py --ratios none,2,3 --out docs/compression-report.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TASKS = ("support", "sentiment", "extract", "translate", "tool_call")


def run(*args: str, env: dict) -> str:
    p = subprocess.run([sys.executable, "-m", "prefix_edge", *args], capture_output=True, text=True, env=env)
    if p.returncode:
        sys.exit(f"prefix-edge {' '.join(args)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return p.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ratios", default="none,2,3")
    ap.add_argument("--work", default="/tmp/prefix-edge-compression")
    ap.add_argument("--out", default="docs/compression-report.json")
    ap.add_argument("--reuse", action="store_true", help="keep bundles already exported in --work")
    ap.add_argument("--limit", type=int, default=None)
    a = ap.parse_args()
    work = Path(a.work)
    env = {**os.environ, "PREFIX_EDGE_HOME": str(work / "home")}
    report: dict = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "bundles": {}}
    for ratio in a.ratios.split(","):
        b = work / f"b-{ratio}"
        if not (a.reuse and (b / "manifest.json").is_file()):
            t0 = time.perf_counter()
            run("export", "--out", str(b), "--prefix-store", "q8_0", "--gguf-kv", "q8_0",
                "--compress-prefix", ratio, "--force", env=env)
            print(f"export {ratio}: {time.perf_counter() - t0:.0f} s", flush=True)
        m = json.loads((b / "manifest.json").read_text())
        entry = report["bundles"][ratio] = {"tasks": {}}
        for task in TASKS:
            t = m["tasks"][task]
            files = {k: v["bytes"] for k, v in t["prefixes"].items()}
            extra = ["--limit", str(a.limit)] if a.limit else []
            got = json.loads(run("eval", "--task", task, "--bundle", str(b), "--json", "--no-whole", *extra, env=env))
            c = got.get("compression")
            entry["tasks"][task] = {
                "prefix_tokens": t["prefix_tokens"],
                "source_tokens": c["source_tokens"] if c else t["prefix_tokens"],
                "reconstruction_agreement": c["reconstruction_agreement"] if c else None,
                "prefix_file_bytes": files, "metric": got["metric"], "n": got["n"],
                "scores": {r["label"]: r["score"] for r in got["results"]},
                "ttft_ms": {r["label"]: r["ttft_ms"] for r in got["results"]},
                "tok_s": {r["label"]: r["tok_s"] for r in got["results"]},
            }
            print(ratio, task, entry["tasks"][task]["scores"], flush=True)
    Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
