"""Choose the ONNX weight quantization for the default model by measurement.

For each of none / int8 / int4: export the default model with the demo tasks, then measure the
graph size, TTFT with the baked prefix and with the prefix prefilled (longest demo task), decode
tok/s, the largest first-token logit difference between baked and prefilled, and how many demo
requests give identical greedy tokens baked vs prefilled.

    python benchmarks/quantization.py [--threads 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np

from prefix_edge import Runtime
from prefix_edge.export.build import export_bundle

QUESTIONS = [
    "How long do deleted files stay in the Trash on the Plus plan?",
    "Paul Martin here, please send 4 office chairs to Lyon.",
    "The hinge snapped after two days and the seller ignored me.",
    "Where is the nearest train station?",
]


def measure(bundle: Path, threads: int) -> dict:
    with Runtime.open(bundle, threads=threads) as rt:
        longest = max(rt.tasks, key=lambda t: rt.tasks[t].prefix_tokens)
        q = QUESTIONS[0]
        cached = [rt.generate(longest, q, max_tokens=32).stats for _ in range(5)]
        prefilled = [rt.generate(longest, q, max_tokens=32, use_prefix_cache=False).stats for _ in range(3)]
        prefix, _ = rt.prefixes.get(longest)
        ids = rt.encode_input(longest, q)
        rt.backend.begin(prefix)
        a = rt.backend.prefill(ids)
        rt.backend.begin(None)
        b = rt.backend.prefill(np.concatenate([prefix.ids, ids]))
        same = total = 0
        for task in rt.tasks:
            for text in QUESTIONS:
                total += 1
                same += rt.generate(task, text, max_tokens=32).tokens == \
                    rt.generate(task, text, max_tokens=32, use_prefix_cache=False).tokens
        size = sum((bundle / f).stat().st_size for f in rt.manifest.backends["onnx"].files)
    med = statistics.median
    return {"model_mb": round(size / 1e6, 1), "task": longest,
            "ttft_cached_ms": med(s.ttft_ms for s in cached),
            "ttft_prefilled_ms": med(s.ttft_ms for s in prefilled),
            "decode_tok_s": med(s.decode_tok_s for s in cached),
            "max_abs_dlogit_baked_vs_prefilled": float(np.max(np.abs(a - b))),
            "greedy_identical": f"{same}/{total}"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--methods", default="none,int8,int4")
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="pe-quant-"))
    report = {}
    for method in args.methods.split(","):
        bundle = root / method
        if not (bundle / "manifest.json").exists():
            export_bundle(None, None, bundle, quantize=method, force=True, progress=False)
        report[method] = measure(bundle, args.threads)
        print(method, json.dumps(report[method]), flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
