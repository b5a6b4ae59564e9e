"""Run `prefix-edge bench --concurrency` on a bundle made for it: the default model with three
text tasks of ~1k, ~600 and ~300 tokens, exported once under $PREFIX_EDGE_HOME/bench-bundles.

    python benchmarks/concurrency.py [--threads 2] [--backend gguf,onnx] [--out docs/concurrency-report.json]
"""

import argparse
import subprocess
import sys
from pathlib import Path

from prefix_edge.bench.concurrency import SENT

def bench_bundle() -> Path:
    from prefix_edge.export.source import default_model_path
    from prefix_edge.paths import home

    out = home() / "bench-bundles" / "concurrency"
    if (out / "manifest.json").is_file():
        return out
    tasks = out.parent / "concurrency-tasks.toml"
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, reps in (("long", 28), ("mid", 16), ("short", 8)):
        lines.append(f'[task.{name}]\nsystem = """{SENT * reps}"""\nmax_tokens = 64\n')
    tasks.write_text("\n".join(lines))
    # in a child process: torch's OpenMP pool must not share a process with llama.cpp's
    subprocess.run([sys.executable, "-m", "prefix_edge", "export", str(default_model_path()),
                    "--tasks", str(tasks), "--out", str(out)], check=True)
    return out



def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="gguf,onnx")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    cmd = [sys.executable, "-m", "prefix_edge", "bench", "--concurrency", "--bundle", str(bench_bundle()),
           "--backend", a.backend, "--threads", str(a.threads)]
    if a.out:
        cmd += ["--out", str(a.out)]
    sys.exit(subprocess.run(cmd).returncode)


if __name__ == "__main__":
    main()
