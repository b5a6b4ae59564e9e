"""Choose the ONNX int4 recipe by what the trained demo tasks score through the bundle.

For each recipe (prefix_edge.quantize.onnx.Int4Recipe): export the default model with the demo
tasks to an ONNX-only bundle, then score the trained tasks on their held-out sets with
`prefix-edge eval` (order_json: json-fields, sentiment_tuned: label, support_tuned: chrF), and
record the graph size and decode tok/s. GGUF Q4_1 (the source file, unchanged) is the row to
match: the default model's linear weights are Q4_1 and its embedding/LM head Q8_0.

    python benchmarks/int4_recipes.py [--recipes int4,int4:embed=8,head=8] [--threads 2] [--json docs/int4-recipes.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

RECIPES = ["int4", "int4:head=8", "int4:head=8,embed=8", "int4:head=8,embed=8,sym=0",
           "int4:head=8,embed=8,acc=0", "int4:block=128,head=8,embed=8"]
TASKS = ["order_json", "sentiment_tuned", "support_tuned"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipes", default=";".join(RECIPES), help="';'-separated recipes")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--threads", type=int)
    ap.add_argument("--limit", type=int, help="first N held-out lines per task")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from prefix_edge.paths import demo_data
    from prefix_edge.tasks.datafile import read_jsonl
    from prefix_edge.evaluation.metrics import guess_metric
    from prefix_edge.evaluation.run import eval_bundle
    from prefix_edge.export.build import export_bundle

    rows = []
    for recipe in args.recipes.split(";"):
        with tempfile.TemporaryDirectory(prefix="pe-int4-") as tmp:
            out = Path(tmp) / "bundle"
            t = time.perf_counter()
            export_bundle(None, None, out, formats=["onnx"], quantize=recipe, progress=False)
            row = {"recipe": recipe, "export_s": round(time.perf_counter() - t, 1),
                   "model_mb": round((out / "onnx" / "model.onnx").stat().st_size / 1e6, 1), "tasks": {}}
            for task in args.tasks.split(","):
                data = read_jsonl(demo_data(task))[: args.limit]
                s = eval_bundle(out, task, "onnx", data, guess_metric([e.output for e in data]), args.threads)
                row["tasks"][task] = {"metric": s.metric, "score": s.score, "exact": s.exact,
                                      "decode_tok_s": s.tok_s}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    names = args.tasks.split(",")
    print("| recipe | model MB | " + " | ".join(f"{t} score (exact)" for t in names) + " | decode tok/s |")
    print("|---|---|" + "---|" * len(names) + "---|")
    for r in rows:
        cells = [f"{r['tasks'][t]['score']:.3f} ({r['tasks'][t]['exact']:.2f})" for t in names]
        tps = [r["tasks"][t]["decode_tok_s"] for t in names if r["tasks"][t]["decode_tok_s"]]
        print(f"| `{r['recipe']}` | {r['model_mb']} | " + " | ".join(cells)
              + f" | {sum(tps) / max(1, len(tps)):.0f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
