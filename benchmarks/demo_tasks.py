"""Score every demo task of a bundle on its embedded held-out set with `prefix-edge eval`, on
every backend (and the fp32 reference with --reference), and print the table in docs/tasks.md.

    python benchmarks/demo_tasks.py [--bundle DIR] [--threads N] [--reference] [--json docs/demo-tasks.json]

Rows are grouped by held-out set: a prompt task next to its trained (`_tuned`) and distilled
(`_distilled`) twins; `extract` (a prompt) shares `order_json`'s set. Bytes are the task's prefix
file per backend, from the manifest.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ORDER = ["order_json", "extract", "sentiment", "sentiment_tuned", "translate", "translate_tuned",
         "support", "support_tuned", "support_distilled"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--tasks", help="comma-separated subset")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from prefix_edge.bundle import Manifest
    from prefix_edge.paths import demo_data
    from prefix_edge.paths import default_bundle

    root = args.bundle or default_bundle()
    manifest = Manifest.read(root)
    names = args.tasks.split(",") if args.tasks else [t for t in ORDER if t in manifest.tasks]
    out = []
    for task in names:
        if demo_data(task) is None:
            print(f"{task}: no held-out set, skipped", file=sys.stderr)
            continue
        cmd = [sys.executable, "-m", "prefix_edge", "eval", "--bundle", str(root), "--task", task, "--json"]
        cmd += ["--threads", str(args.threads)] if args.threads else []
        cmd += ["--reference"] if args.reference else []
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"{task}: {p.stderr.strip()}")
        r = json.loads(p.stdout)
        info = manifest.tasks[task]
        r["kind"] = info.kind
        r["bytes"] = {b: f.bytes for b, f in info.prefixes.items()}
        for s in r["results"]:
            s.pop("rows")
        out.append(r)
        print(f"{task}: " + ", ".join(f"{s['label']} {s['score']:.3f}" for s in r["results"]), file=sys.stderr)
    print("| held-out set (metric) | task | kind | positions | prefix MB onnx / gguf | score onnx | score gguf |"
          + (" score fp32 ref |" if args.reference else "") + " exact onnx / gguf | TTFT ms onnx / gguf |")
    print("|---|---|---|---|---|---|---|" + ("---|" if args.reference else "") + "---|---|")
    for r in out:
        res = {s["label"]: s for s in r["results"]}
        on, gg = res.get("onnx", {}), res.get("gguf", {})
        mb = " / ".join(f"{r['bytes'][b] / 1e6:.1f}" if b in r["bytes"] else "-" for b in ("onnx", "gguf"))
        row = [f"{Path(r['data']).name.split('.')[0]} ({r['metric']}, n={r['n']})", f"`{r['task']}`",
               "trained" if r["kind"] == "peft" else "prompt", str(r["prefix_tokens"]), mb,
               f"{on.get('score', float('nan')):.3f}", f"{gg.get('score', float('nan')):.3f}"]
        if args.reference:
            row.append(f"{res['reference']['score']:.3f}" if "reference" in res else "-")
        row += [f"{on.get('exact', 0):.2f} / {gg.get('exact', 0):.2f}",
                f"{on.get('ttft_ms') or 0:.0f} / {gg.get('ttft_ms') or 0:.0f}"]
        print("| " + " | ".join(row) + " |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
