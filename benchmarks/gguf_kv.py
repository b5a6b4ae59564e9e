"""What llama.cpp's q8_0 KV cache costs (`export --gguf-kv q8_0`) against the default f16 one.

Two bundles of the same GGUF model: the default (f16 cache) and one exported with
`--gguf-kv q8_0` (its prefixes baked in a q8_0 cache, run with flash attention). For every demo
task with a held-out set, each input is answered greedily by both; the q8_0 runtime is also fed
the f16 answer (teacher forcing, kv_compare.py). Reported: bytes per prefix position, identical
answers, tokens before the first difference, teacher-forced token agreement, the largest
first-step |logit difference|, each task's held-out score under both, and decode tok/s (64 tokens
after the longest prefix, runs alternating between the two).

    python benchmarks/gguf_kv.py --q8 DIR [--f16 DIR] [--threads 2] [--limit N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from kv_compare import add_common_args, greedy, held_out, teacher_forced


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--f16", type=Path, help="bundle with the f16 cache (default: the default bundle)")
    ap.add_argument("--q8", type=Path, required=True, help="the same model exported with --gguf-kv q8_0")
    add_common_args(ap)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

    from prefix_edge import Runtime
    from prefix_edge.bundle import Manifest
    from prefix_edge.paths import default_bundle

    f16_dir = args.f16 or default_bundle()
    a, b = Manifest.read(f16_dir), Manifest.read(args.q8)
    if a.backends["gguf"].files != b.backends["gguf"].files:
        sys.exit("the two bundles hold different GGUF models: not a KV-cache comparison")
    if (a.backends["gguf"].state.get("kv_type"), b.backends["gguf"].state.get("kv_type")) != ("f16", "q8_0"):
        sys.exit("--f16 must be an f16-cache bundle and --q8 a q8_0-cache one")
    rts = {"f16": Runtime.open(f16_dir, backend="gguf", threads=args.threads),
           "q8_0": Runtime.open(args.q8, backend="gguf", threads=args.threads)}
    t = {"answers": 0, "same_answers": 0, "tokens": 0, "same_tokens": 0, "forced_agree": 0, "max_dlogit": 0.0}
    size = {k: [0, 0] for k in rts}
    scores = {}
    rt = rts["f16"]
    for task in rt.tasks:
        held = held_out(rt, task, args.limit, args.max_tokens)
        if held is None:
            continue
        rows, n_max, metric, mean_score = held
        prefixes = {k: r.prefixes.get(task)[0] for k, r in rts.items()}
        for k, p in prefixes.items():
            size[k][0] += p.nbytes
            size[k][1] += p.n_tokens
        texts = {k: [] for k in rts}
        for ex in rows:
            ids = rt.encode_input(task, ex.input)
            ref, ref_logits = greedy(rt.backend, prefixes["f16"], ids, n_max, rt.eos)
            out, logits = greedy(rts["q8_0"].backend, prefixes["q8_0"], ids, n_max, rt.eos)
            t["answers"] += 1
            t["same_answers"] += out == ref
            t["same_tokens"] += next((i for i, (x, y) in enumerate(zip(out, ref)) if x != y), min(len(out), len(ref)))
            t["tokens"] += len(ref)
            t["forced_agree"] += teacher_forced(rts["q8_0"].backend, prefixes["q8_0"], ids, ref)
            t["max_dlogit"] = max(t["max_dlogit"], float(np.abs(logits - ref_logits).max()))
            for k, toks in (("f16", ref), ("q8_0", out)):
                texts[k].append(rt.tokenizer.decode([x for x in toks if x not in rt.eos]))
        scores[task] = {k: mean_score(ans) for k, ans in texts.items()}
        print(f"{task} ({metric}, n={len(rows)}): {scores[task]}", file=sys.stderr, flush=True)

    speeds = {k: [] for k in rts}
    task = max(rt.tasks, key=lambda x: rt.tasks[x].prefix_tokens)
    for _ in range(3):
        for k, r in rts.items():
            be = r.backend
            be.begin(r.prefixes.get(task)[0])
            logits = be.prefill(r.encode_input(task, "Where can I see if the service is down?"))
            t0 = time.perf_counter()
            for _ in range(64):
                logits = be.step(int(np.argmax(logits)))
            speeds[k].append(64 / (time.perf_counter() - t0))
    report = {"bytes_per_position": {k: round(v[0] / max(1, v[1])) for k, v in size.items()},
              "answers": t["answers"], "same_answers": t["same_answers"] / max(1, t["answers"]),
              "same_tokens": t["same_tokens"] / max(1, t["tokens"]),
              "teacher_forced_agreement": t["forced_agree"] / max(1, t["tokens"]),
              "max_dlogit": t["max_dlogit"], "scores": scores,
              "decode_tok_s": {k: round(statistics.median(v), 1) for k, v in speeds.items()},
              "kv_bytes_per_cell": {k: r.backend.bytes_per_cell for k, r in rts.items()}}
    for r in rts.values():
        r.close()
    print("| cache | bytes / prefix position | KV bytes / cell | identical greedy answers | tokens before first difference | "
          "teacher-forced token agreement | max first-step abs logit diff | decode tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for k in rts:
        first = k == "f16"
        print(f"| {k} | {report['bytes_per_position'][k]:,} | {report['kv_bytes_per_cell'][k]:,} | " +
              ("reference | reference | reference | 0" if first else
               f"{report['same_answers']:.3f} ({t['same_answers']}/{t['answers']}) | {report['same_tokens']:.3f} | "
               f"{report['teacher_forced_agreement']:.4f} | {report['max_dlogit']:.3g}") +
              f" | {report['decode_tok_s'][k]} |")
    print("\n| task | score f16 | score q8_0 |\n|---|---|---|")
    for task, sc in scores.items():
        print(f"| `{task}` | {sc['f16']:.3f} | {sc['q8_0']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
