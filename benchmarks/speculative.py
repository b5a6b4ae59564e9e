"""speculative="lookup" against "off", per demo task and engine, on a bundle's held-out inputs:
tokens per decode forward, decode tok/s (the ratio to "off" in the same run), and how many
answers are equal to "off" (greedy: the reference), JSON answers valid. Prints the table in
docs/speculative.md.

    python benchmarks/speculative.py [--bundle DIR] [--threads N] [--inputs 20] [--tasks order_json,extract]
                                     [--json docs/speculative-report.json]

Each input runs "off" then "lookup" on one runtime per engine (slots=1, nothing else running),
after one warm-up request; a task's own options (its schema, max_tokens) apply to both.

`--peer`: llama.cpp's own prompt-lookup decoding on the same GGUF file, as llama-cpp-python
exposes it (`Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))`), against the same
Llama without a draft model: the same prompt ids (the task's prefix ids and its wrapped input;
tasks with trained virtual tokens cannot be given to it and are skipped), greedy, the task's
max_tokens, no constraint (llama-cpp-python's sampling loop takes no schema of ours). Decode
tok/s from a stream's first to last token, and answers equal to its own no-draft run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TASKS = ["order_json", "extract", "sentiment", "translate", "support"]


def inputs_of(task: str, n: int) -> list[str]:
    from prefix_edge.cli.eval import demo_data

    path = demo_data(task)
    if path is None:
        return []
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return [x["input"] for x in lines[:n]]


def measure(rt, task: str, texts: list[str]) -> dict:
    out = {}
    answers = {}
    for spec in ("off", "lookup"):
        gen = dec_s = accepted = drafted = decode_steps = 0
        answers[spec] = []
        for text in texts:
            r = rt.generate(task, text, speculative=spec, temperature=0.0)
            s = r.stats
            n_dec = max(0, s.generated_tokens - 1)
            gen += n_dec
            if s.decode_tok_s > 0:
                dec_s += n_dec / s.decode_tok_s
            accepted += s.accepted_tokens
            drafted += s.drafted_tokens
            decode_steps += max(0, n_dec - s.accepted_tokens)
            answers[spec].append(r.text)
        out[spec] = {"decode_tokens": gen, "tok_s": round(gen / dec_s, 1) if dec_s else 0.0,
                     "tokens_per_forward": round(gen / decode_steps, 3) if decode_steps else 1.0,
                     "drafted": drafted, "accepted": accepted}
    equal = sum(a == b for a, b in zip(answers["off"], answers["lookup"]))
    valid = None
    if task in ("order_json", "extract"):
        def ok(t):
            try:
                json.loads(t)
                return True
            except ValueError:
                return False
        valid = sum(ok(t) for t in answers["lookup"])
    return {"task": task, "n": len(texts), "equal": equal, "json_valid": valid, **out,
            "speedup": round(out["lookup"]["tok_s"] / out["off"]["tok_s"], 3) if out["off"]["tok_s"] else None}


def peer(root: Path, threads: int | None, tasks: list[str], n: int) -> list[dict]:
    """llama-cpp-python's prompt-lookup decoding against its plain decode (module doc)."""
    import time

    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from prefix_edge.bundle import Bundle
    from prefix_edge.options import resolve
    from prefix_edge.runtime.runtime import Runtime

    bundle = Bundle.open(root)
    prompts = {}
    with Runtime.open(root, backend="gguf", threads=threads, slots=1) as rt:
        for task in tasks:
            info = rt.manifest.tasks[task]
            texts = inputs_of(task, n)
            if info.n_virtual or not texts:
                continue
            pre = rt.prefixes.ids(task).tolist()
            limit = resolve(info.defaults)["max_tokens"] or 64
            prompts[task] = ([pre + rt.encode_input(task, t).tolist() for t in texts], limit)
    rows = []
    answers: dict = {}
    for name, draft in (("plain", None), ("lookup", LlamaPromptLookupDecoding(num_pred_tokens=10))):
        llm = Llama(model_path=str(bundle.model_file("gguf")), n_ctx=4096, n_threads=threads or 2,
                    n_threads_batch=threads or 2, draft_model=draft, verbose=False)
        for task, (ids_list, limit) in prompts.items():
            toks = secs = 0.0
            for i, ids in enumerate(ids_list):
                llm.reset()
                first = last = None
                text = []
                for chunk in llm.create_completion(prompt=ids, max_tokens=limit, temperature=0.0,
                                                   stream=True):
                    last = time.perf_counter()
                    first = first or last
                    text.append(chunk["choices"][0]["text"])
                answers[(name, task, i)] = "".join(text)
                k = max(0, len(text) - 1)
                if k and last > first:
                    toks, secs = toks + k, secs + (last - first)
            rows.append({"peer": name, "task": task, "n": len(ids_list),
                         "tok_s": round(toks / secs, 1) if secs else 0.0})
        del llm
    for r in rows:
        if r["peer"] == "lookup":
            base = next(x for x in rows if x["peer"] == "plain" and x["task"] == r["task"])
            r["speedup"] = round(r["tok_s"] / base["tok_s"], 3) if base["tok_s"] else None
            r["equal"] = sum(answers[("lookup", r["task"], i)] == answers[("plain", r["task"], i)]
                             for i in range(r["n"]))
    return rows


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
    from prefix_edge.paths import default_bundle
    from prefix_edge.runtime.runtime import Runtime

    root = args.bundle or default_bundle()
    rows = []
    for backend in args.backends.split(","):
        with Runtime.open(root, backend=backend, threads=args.threads, slots=1) as rt:
            names = args.tasks.split(",") if args.tasks else [t for t in TASKS if t in rt.tasks]
            for task in names:
                texts = inputs_of(task, args.inputs)
                if not texts:
                    print(f"{task}: no held-out inputs, skipped", file=sys.stderr)
                    continue
                rt.generate(task, texts[0])  # warm-up
                row = {"backend": backend, **measure(rt, task, texts)}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    print("| engine | task | inputs | tokens/forward | decode tok/s off | decode tok/s lookup | ratio "
          "| answers equal to off | JSON valid |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        valid = "" if r["json_valid"] is None else f"{r['json_valid']}/{r['n']}"
        print(f"| {r['backend']} | {r['task']} | {r['n']} | {r['lookup']['tokens_per_forward']:.2f} "
              f"| {r['off']['tok_s']} | {r['lookup']['tok_s']} | {r['speedup']} | {r['equal']}/{r['n']} "
              f"| {valid} |")
    if args.peer:
        names = args.tasks.split(",") if args.tasks else TASKS
        peers = peer(root, args.threads, names, args.inputs)
        print("\n| llama-cpp-python | task | inputs | decode tok/s | ratio to its plain decode | answers equal |")
        print("|---|---|---|---|---|---|")
        for r in peers:
            if r["peer"] == "lookup":
                base = next(x for x in peers if x["peer"] == "plain" and x["task"] == r["task"])
                print(f"| prompt lookup (10) | {r['task']} | {r['n']} | {r['tok_s']} (plain {base['tok_s']}) "
                      f"| {r['speedup']} | {r['equal']}/{r['n']} |")
        rows.append({"peer": peers})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
