"""The trained demo tasks through the default bundle's quantized engines against fp32.

Each trained (PEFT or distilled) task of the default bundle is scored on its held-out set by
`prefix-edge eval --reference`: the ONNX int4 graph, the GGUF Q4_1 model, and fp32
transformers (+ PEFT) on the same lines, greedy. The report keeps each row's score, exact and
valid rates and decode tok/s (tok/s only compare within one run on a quiet machine), and the
int4 − fp32 difference per task.

    python benchmarks/trained_scores.py --out docs/trained-scores.json
    python benchmarks/trained_scores.py --from DIR --out ...   # eval-TASK.json files already made
                                                               # by `prefix-edge eval ... --json`
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import date
from pathlib import Path

TASKS = ("order_json", "sentiment_tuned", "support_tuned", "translate_tuned", "tool_call_tuned",
         "support_distilled")


def run_eval(task: str, threads: int) -> dict:
    p = subprocess.run([sys.executable, "-m", "prefix_edge", "eval", "--task", task, "--reference",
                        "--threads", str(threads), "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"eval {task}: {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout)


def row(r: dict) -> dict:
    return {k: r.get(k) for k in ("score", "exact", "valid", "tok_s")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--from", dest="src", type=Path, help="read DIR/eval-TASK.json instead of running eval")
    a = ap.parse_args()
    tasks = []
    for t in TASKS:
        d = json.loads((a.src / f"eval-{t}.json").read_text()) if a.src else run_eval(t, a.threads)
        rows = {r["label"]: row(r) for r in d["results"]}
        ref = rows["reference"]["score"]
        tasks.append({"task": t, "metric": d["metric"], "n": d["n"], "rows": rows,
                      "int4_minus_fp32": round(rows["onnx"]["score"] - ref, 4),
                      "q4_1_minus_fp32": round(rows["gguf"]["score"] - ref, 4)})
        print(f"{t:18s} {d['metric']:11s} n={d['n']:3d}  onnx {rows['onnx']['score']:.3f}  "
              f"gguf {rows['gguf']['score']:.3f}  fp32 {ref:.3f}", file=sys.stderr)
    a.out.write_text(json.dumps({"date": date.today().isoformat(), "threads": a.threads,
                                 "tasks": tasks}, indent=1) + "\n")


if __name__ == "__main__":
    main()
