"""What constrained decoding costs: decode tok/s with and without the constraint, the same
requests, both engines, in one run.

    python benchmarks/constraint_cost.py [--bundle DIR] [--n 20] [--out docs/constraint-cost.json]

Requests: the `extract` task on its held-out inputs with its JSON schema (the demo's default),
and `support` answers with a permissive regex (`[^\\x00]*`, a mask on every token of a long
answer), each timed with the constraint on (use_constraint=True) and off. The tok/s figure is
the runtime's own (decode steps between the first and the last token / their time), summed over
the requests; the first constrained request, which builds llguidance's tokenizer, is a warm-up.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def rate(rt, task: str, inputs: list[str], constrain: bool, **opts) -> dict:
    toks = secs = 0.0
    valid = 0
    for x in inputs:
        r = rt.generate(task, x, use_constraint=constrain, **opts)
        s = r.stats
        if s.decode_tok_s > 0:
            toks += s.generated_tokens - 1
            secs += (s.generated_tokens - 1) / s.decode_tok_s
        try:
            json.loads(r.text)
            valid += 1
        except ValueError:
            pass
    return {"decode_tok_s": round(toks / secs, 1) if secs else None, "tokens": int(toks),
            "valid_json": valid, "n": len(inputs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--out", default="docs/constraint-cost.json")
    a = ap.parse_args()
    from prefix_edge import Runtime
    from prefix_edge.paths import default_bundle

    bundle = Path(a.bundle) if a.bundle else default_bundle()
    data = Path(__file__).resolve().parent.parent / "prefix_edge/models/smollm2-135m/data"
    inputs = [json.loads(line)["input"] for line in (data / "extract.heldout.jsonl").read_text().splitlines()][:a.n]
    questions = [json.loads(line)["input"] for line in (data / "support.heldout.jsonl").read_text().splitlines()][:a.n]
    report = {"date": time.strftime("%Y-%m-%d"), "bundle": str(bundle), "n": a.n, "rows": []}
    for backend in ("gguf", "onnx"):
        with Runtime.open(bundle, backend=backend, slots=1) as rt:
            t = time.perf_counter()
            rt.generate("extract", inputs[0])  # warm-up, builds llguidance's tokenizer
            warm = round((time.perf_counter() - t) * 1e3, 1)
            for task, xs, opts in (("extract", inputs, {}),
                                   ("support", questions, {"regex": "[^\\x00]*", "max_tokens": 96})):
                on = rate(rt, task, xs, True, **opts)
                off = rate(rt, task, xs, False, **opts)
                report["rows"].append({"backend": backend, "task": task, "constraint": opts.get("regex", "json_schema"),
                                       "on": on, "off": off,
                                       "ratio": round(on["decode_tok_s"] / off["decode_tok_s"], 3),
                                       "first_request_ms": warm})
                print(backend, task, on, off, report["rows"][-1]["ratio"])
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
