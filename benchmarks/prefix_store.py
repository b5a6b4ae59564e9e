"""What a smaller ONNX prefix store costs: f16 and q8_0 against the exact f32 store.

For every task of a bundle (exported with the default `--prefix-store f32`) that has a held-out
set: the task's prefix is re-encoded by the prefix-file codec (bundle.prefixfile.encode_kv, then
decode_kv as the runtime does on load), and every held-out input is decoded greedily from the
exact prefix and from each reduced one through the same ONNX session. Reported per store: bytes
per prefix position (as stored), answers whose greedy tokens are identical, tokens identical up to
the first difference, the largest first-step |logit difference|, and each task's held-out score
(`prefix-edge eval`'s metric) from each store's answers.

    python benchmarks/prefix_store.py [--bundle DIR] [--stores f16,q8_0] [--max-tokens 64] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from kv_compare import add_common_args, greedy, held_out, teacher_forced


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--stores", default="f16,q8_0")
    add_common_args(ap)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from prefix_edge import Runtime
    from prefix_edge.bundle import prefixfile

    stores = args.stores.split(",")
    totals = {s: {"answers": 0, "same_answers": 0, "tokens": 0, "same_tokens": 0, "forced_agree": 0,
                  "max_dlogit": 0.0,
                  "bytes": 0, "positions": 0} for s in ["f32", *stores]}
    scores = {}
    with Runtime.open(args.bundle, backend="onnx", threads=args.threads) as rt:
        be = rt.backend
        for task in rt.tasks:
            held = held_out(rt, task, args.limit, args.max_tokens)
            if held is None:
                continue
            rows, n_max, metric, mean_score = held
            exact, _ = rt.prefixes.get(task)
            kv = dict(zip(be.past_names, exact.state.kv))
            variants = {}
            for s in ["f32", *stores]:
                tensors, meta = prefixfile.encode_kv(kv, s)
                totals[s]["bytes"] += sum(t.nbytes for t in tensors.values())
                totals[s]["positions"] += exact.n_tokens
                # read back as a file of that store is read (the engine decodes it)
                variants[s] = be.prefix_from({prefixfile.IDS: exact.ids, **tensors},
                                             {**meta, "n_virtual": str(exact.n_virtual)}, task)
            texts = {s: [] for s in ["f32", *stores]}
            for ex in rows:
                ids = rt.encode_input(task, ex.input)
                ref, ref_logits = greedy(be, variants["f32"], ids, n_max, rt.eos)
                texts["f32"].append(rt.tokenizer.decode([t for t in ref if t not in rt.eos]))
                for s in stores:
                    out, logits = greedy(be, variants[s], ids, n_max, rt.eos)
                    t = totals[s]
                    t["answers"] += 1
                    t["same_answers"] += out == ref
                    n_same = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
                    t["tokens"] += len(ref)
                    t["same_tokens"] += n_same
                    t["forced_agree"] += teacher_forced(be, variants[s], ids, ref)
                    t["max_dlogit"] = max(t["max_dlogit"], float(np.abs(logits - ref_logits).max()))
                    texts[s].append(rt.tokenizer.decode([t for t in out if t not in rt.eos]))
            scores[task] = {s: mean_score(ans) for s, ans in texts.items()}
            print(f"{task} ({metric}, n={len(rows)}): {scores[task]}", file=sys.stderr, flush=True)
    report = {}
    print("| store | bytes / prefix position | identical greedy answers | tokens before first difference | "
          "teacher-forced token agreement | max first-step abs logit diff |")
    print("|---|---|---|---|---|---|")
    for s, t in totals.items():
        per = t["bytes"] / max(1, t["positions"])
        if s == "f32":
            report[s] = {"bytes_per_position": round(per)}
            print(f"| f32 (exact) | {per:,.0f} | reference | reference | reference | 0 |")
            continue
        report[s] = {"bytes_per_position": round(per), "answers": t["answers"],
                     "same_answers": t["same_answers"] / max(1, t["answers"]),
                     "same_tokens": t["same_tokens"] / max(1, t["tokens"]),
                     "teacher_forced_agreement": t["forced_agree"] / max(1, t["tokens"]),
                     "max_dlogit": t["max_dlogit"]}
        r = report[s]
        print(f"| {s} | {per:,.0f} | {r['same_answers']:.3f} ({t['same_answers']}/{t['answers']}) | "
              f"{r['same_tokens']:.3f} | {r['teacher_forced_agreement']:.4f} | {r['max_dlogit']:.3g} |")
    print("\n| task | " + " | ".join(f"score {s}" for s in ["f32", *stores]) + " |")
    print("|---|" + "---|" * (1 + len(stores)))
    for task, sc in scores.items():
        print(f"| `{task}` | " + " | ".join(f"{v:.3f}" for v in sc.values()) + " |")
    if args.json:
        args.json.write_text(json.dumps({"stores": report, "scores": scores}, indent=2) + "\n")


if __name__ == "__main__":
    main()
