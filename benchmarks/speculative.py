"""speculative="lookup" against "off", per demo task and engine, on a bundle's held-out inputs:
tokens per decode forward, decode tok/s (the ratio to "off" in the same run), and how many
answers are equal to "off" (greedy: the reference), JSON answers valid. Prints the table in
docs/speculative.md. The same as `prefix-edge bench --speculative` (prefix_edge/bench/speculative.py,
which documents the method), with the report written as a list of rows.

    python benchmarks/speculative.py [--bundle DIR] [--threads N] [--inputs 20] [--tasks order_json,extract]
                                     [--backends gguf,onnx] [--peer] [--json docs/speculative-report.json]

`--peer`: llama.cpp's own prompt-lookup decoding on the same GGUF file, as llama-cpp-python
exposes it (`Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))`), against the same
Llama without a draft model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--inputs", type=int, default=20)
    ap.add_argument("--tasks", help="comma-separated subset")
    ap.add_argument("--backends", default="gguf,onnx")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--peer", action="store_true", help="also llama.cpp's own lookup decoding (module doc)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from prefix_edge.bench.speculative import run_all, table
    from prefix_edge.paths import default_bundle

    report = run_all(args.bundle or default_bundle(), args.backends.split(","), args.threads, args.inputs,
                     args.tasks.split(",") if args.tasks else None, peers=args.peer,
                     log=lambda m: print(m, file=sys.stderr))
    print("\n".join(table(report)))
    if args.json:
        rows = report["rows"] + ([{"peer": report["peer"]}] if report.get("peer") else [])
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
