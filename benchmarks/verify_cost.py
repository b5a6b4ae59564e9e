"""What verifying a draft costs: one engine forward of k tokens (logits for all k) against a
one-token decode step, on the engines `speculative="lookup"` runs on.

Drafted tokens pay off only where a forward of k tokens costs much less than k forwards of one.
This measures that cost curve on each engine of a bundle (or on bare model files), at a context
of --context positions, and prints the ceiling it sets on any drafting method: k / cost(k), the
decode speed-up if every one of k-1 drafted tokens were accepted.

    python benchmarks/verify_cost.py                      # the default bundle, both engines
    python benchmarks/verify_cost.py --bundle DIR --json out.json
    python benchmarks/verify_cost.py --model gguf:/path/model-q4_0.gguf --model onnx:/path/model.onnx
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prefix_edge.runtime.engines import open_backend  # noqa: E402


def curve(engine, context: int, rows: list[int], reps: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    hi = min(engine.n_vocab, 32000)
    engine.seq_restore(0, None)
    engine.forward([(0, 0, rng.integers(100, hi, context).astype(np.int32))])
    out = []
    for k in rows:
        times = []
        for _ in range(reps + 2):
            ids = rng.integers(100, hi, k).astype(np.int32)
            t0 = time.perf_counter()
            engine.forward([(0, context, ids, k)])
            times.append(time.perf_counter() - t0)
            engine.seq_truncate(0, context)
        out.append({"rows": k, "ms": 1000 * statistics.median(times[2:])})
    base = out[0]["ms"]
    for r in out:
        r["cost"] = r["ms"] / base
        r["ceiling"] = r["rows"] / r["cost"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", help="a bundle directory (default: the default bundle)")
    ap.add_argument("--model", action="append", default=[], metavar="ENGINE:PATH",
                    help="a bare model file instead of a bundle's (repeatable)")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--rows", default="1,2,3,4,5,6,8,9")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", help="write the report here")
    a = ap.parse_args(argv)
    rows = [int(x) for x in a.rows.split(",")]
    if rows[0] != 1:
        rows = [1] + rows
    models = []
    if a.model:
        for m in a.model:
            name, _, path = m.partition(":")
            models.append((name, Path(path), {}))
    else:
        from prefix_edge.bench.measure import Bench
        from prefix_edge.paths import default_bundle

        b = Bench(Path(a.bundle) if a.bundle else default_bundle(), threads=a.threads or 2, runs=1)
        for name in b.manifest.backends:
            models.append((name, b.model_file(name), b.engine_options(name)))
    report = {"machine": platform.machine(), "context": a.context, "threads": a.threads, "models": []}
    for name, path, opts in models:
        eng = open_backend(name, path, threads=a.threads, n_ctx=a.context + max(rows) + 16, **opts)
        if not eng.verifies:
            print(f"{name} {path.name}: this engine gives only the last position's logits; skipped")
            continue
        res = curve(eng, a.context, rows, a.reps)
        eng.close()
        report["models"].append({"engine": name, "file": path.name, "curve": res})
        print(f"\n{name} {path.name} (context {a.context})")
        print("| rows | ms | cost vs 1 row | ceiling (all accepted) |")
        print("|---|---|---|---|")
        for r in res:
            print(f"| {r['rows']} | {r['ms']:.2f} | {r['cost']:.2f} | {r['ceiling']:.2f} |")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
