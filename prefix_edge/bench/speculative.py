"""`prefix-edge bench --speculative`: speculative="lookup" against "off", per task and engine, on
held-out inputs: tokens per decode forward, decode tok/s (the ratio to "off" in the same run), how
many answers equal "off" (greedy: the reference) and, for JSON tasks, how many are valid JSON.
With peers, llama.cpp's own prompt-lookup decoding on the same GGUF file beside it.

Inputs: a JSONL file (`--inputs FILE`: lines {"task": ..., "input": ...}, or {"input": ...} for
every task), else each demo task's embedded held-out set; a task with neither is skipped. Each
input runs "off" and "lookup" one after the other (the order alternating from input to input, so
a machine's drift slows both alike) on one runtime per engine (slots=1, nothing else running),
after one warm-up request; a task's own options (its schema, max_tokens) apply to both.

The peer: llama-cpp-python's `Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))`
against the same Llama without a draft model, the same prompt ids (the task's prefix ids and its
wrapped input; tasks with trained virtual tokens cannot be given to it and are skipped), greedy,
the task's max_tokens, no constraint (its sampling loop takes no schema of ours). Decode tok/s
from a stream's first to last token, and answers equal to its own no-draft run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..errors import PrefixEdgeError

TASKS = ["order_json", "extract", "sentiment", "translate", "support"]  # demo tasks, in table order
JSON_TASKS = ("order_json", "extract")


def read_inputs(path: Path) -> dict[str | None, list[str]]:
    """{task or None (every task): inputs} from a JSONL file; a bad line is one error line."""
    out: dict[str | None, list[str]] = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            text, task = row["input"], row.get("task")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise PrefixEdgeError(f"{path}:{n}: not a JSON object with an \"input\" string") from None
        if not isinstance(text, str) or not (task is None or isinstance(task, str)):
            raise PrefixEdgeError(f"{path}:{n}: \"input\" must be a string (and \"task\" a task name)")
        out.setdefault(task, []).append(text)
    return out


def inputs_of(task: str, n: int, given: dict | None = None) -> list[str]:
    """Up to n inputs for `task`: the given file's, else the demo task's held-out set."""
    if given is not None:
        return (given.get(task) or given.get(None) or [])[:n]
    from ..paths import demo_data

    path = demo_data(task)
    if path is None:
        return []
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return [x["input"] for x in lines[:n]]


def measure(rt, task: str, texts: list[str]) -> dict:
    """One task on one runtime: "off" then "lookup" over `texts` (module doc)."""
    acc = {spec: dict(gen=0, dec_s=0.0, accepted=0, drafted=0, steps=0) for spec in ("off", "lookup")}
    answers: dict[str, list[str]] = {"off": [], "lookup": []}
    for i, text in enumerate(texts):  # interleaved, the order alternating: drift hits both alike
        for spec in (("off", "lookup") if i % 2 == 0 else ("lookup", "off")):
            r = rt.generate(task, text, speculative=spec, temperature=0.0)
            s, a = r.stats, acc[spec]
            n_dec = max(0, s.generated_tokens - 1)
            a["gen"] += n_dec
            if s.decode_tok_s > 0:
                a["dec_s"] += n_dec / s.decode_tok_s
            a["accepted"] += s.accepted_tokens
            a["drafted"] += s.drafted_tokens
            a["steps"] += max(0, n_dec - s.accepted_tokens)
            answers[spec].append(r.text)
    out = {spec: {"decode_tokens": a["gen"], "tok_s": round(a["gen"] / a["dec_s"], 1) if a["dec_s"] else 0.0,
                  "tokens_per_forward": round(a["gen"] / a["steps"], 3) if a["steps"] else 1.0,
                  "drafted": a["drafted"], "accepted": a["accepted"]} for spec, a in acc.items()}
    equal = sum(a == b for a, b in zip(answers["off"], answers["lookup"]))
    valid = sum(_is_json(t) for t in answers["lookup"]) if task in JSON_TASKS else None
    return {"task": task, "n": len(texts), "equal": equal, "json_valid": valid, **out,
            "speedup": round(out["lookup"]["tok_s"] / out["off"]["tok_s"], 3) if out["off"]["tok_s"] else None}


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def run_all(root: Path, backends: list[str], threads: int | None, n: int, tasks: list[str] | None = None,
            given: dict | None = None, peers: bool = False, log=print) -> dict:
    """{"rows": a row per engine and task, "peer": llama.cpp's lookup rows (with peers)}."""
    from ..runtime.runtime import Runtime

    rows, names = [], []
    for backend in backends:
        with Runtime.open(root, backend=backend, threads=threads, slots=1) as rt:
            names = tasks or [t for t in TASKS if t in rt.tasks] + [t for t in rt.tasks if t not in TASKS]
            for task in names:
                if task not in rt.tasks:
                    raise PrefixEdgeError(f"unknown task {task!r}; the bundle has {', '.join(rt.tasks)}")
                texts = inputs_of(task, n, given)
                if not texts:
                    log(f"{task}: no held-out inputs (give some with --inputs FILE), skipped")
                    continue
                rt.generate(task, texts[0])  # warm-up
                row = {"backend": backend, **measure(rt, task, texts),
                       "row_cost": rt.engine_info()["draft_row_cost"]}
                rows.append(row)
                log(json.dumps(row))
    report = {"rows": rows}
    if peers and "gguf" in backends:
        report["peer"] = peer(root, threads, [r["task"] for r in rows if r["backend"] == "gguf"], n, given)
    return report


def peer(root: Path, threads: int | None, tasks: list[str], n: int, given: dict | None = None) -> list[dict]:
    """llama-cpp-python's prompt-lookup decoding against its plain decode (module doc)."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from ..bundle import Bundle
    from ..options import resolve
    from ..runtime.runtime import Runtime

    bundle = Bundle.open(root)
    prompts = {}
    with Runtime.open(root, backend="gguf", threads=threads, slots=1) as rt:
        for task in tasks:
            info = rt.manifest.tasks[task]
            texts = inputs_of(task, n, given)
            if info.n_virtual or not texts:
                continue
            pre = rt.prefixes.ids(task).tolist()
            limit = resolve(info.defaults)["max_tokens"] or 64
            prompts[task] = ([pre + rt.encode_input(task, t).tolist() for t in texts], limit)
    rows, answers = [], {}
    for name, draft in (("plain", None), ("lookup", LlamaPromptLookupDecoding(num_pred_tokens=10))):
        llm = Llama(model_path=str(bundle.model_file("gguf")), n_ctx=4096, n_threads=threads or 2,
                    n_threads_batch=threads or 2, draft_model=draft, verbose=False)
        for task, (ids_list, limit) in prompts.items():
            toks = secs = 0.0
            for i, ids in enumerate(ids_list):
                llm.reset()
                first = last = None
                text = []
                for chunk in llm.create_completion(prompt=ids, max_tokens=limit, temperature=0.0, stream=True):
                    last = time.perf_counter()
                    first = first or last
                    text.append(chunk["choices"][0]["text"])
                answers[(name, task, i)] = "".join(text)
                k = max(0, len(text) - 1)
                if k and last > first:
                    toks, secs = toks + k, secs + (last - first)
            rows.append({"peer": name, "task": task, "n": len(ids_list), "tok_s": round(toks / secs, 1) if secs else 0.0})
        del llm
    for r in rows:
        if r["peer"] == "lookup":
            base = next(x for x in rows if x["peer"] == "plain" and x["task"] == r["task"])
            r["speedup"] = round(r["tok_s"] / base["tok_s"], 3) if base["tok_s"] else None
            r["equal"] = sum(answers[("lookup", r["task"], i)] == answers[("plain", r["task"], i)]
                             for i in range(r["n"]))
    return rows


def table(report: dict) -> list[str]:
    """The report as docs/speculative.md's markdown tables."""
    out = ["| engine | task | inputs | tokens/forward | decode tok/s off | decode tok/s lookup | ratio "
           "| answers equal to off | JSON valid |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        valid = "" if r["json_valid"] is None else f"{r['json_valid']}/{r['n']}"
        out.append(f"| {r['backend']} | {r['task']} | {r['n']} | {r['lookup']['tokens_per_forward']:.2f} "
                   f"| {r['off']['tok_s']} | {r['lookup']['tok_s']} | {r['speedup']} | {r['equal']}/{r['n']} "
                   f"| {valid} |")
    costs = {r["backend"]: r["row_cost"] for r in report["rows"] if "row_cost" in r}
    if costs:  # the last measure of each engine: its runtime has seen every task's forwards
        out += ["", "A verified row's cost as a share of a one-token step, measured by the runtime: " +
                ", ".join(f"{b} {c}" for b, c in costs.items())]
    if report.get("peer"):
        out += ["", "| llama-cpp-python | task | inputs | decode tok/s | ratio to its plain decode | answers equal |",
                "|---|---|---|---|---|---|"]
        for r in report["peer"]:
            if r["peer"] == "lookup":
                base = next(x for x in report["peer"] if x["peer"] == "plain" and x["task"] == r["task"])
                out.append(f"| prompt lookup (10) | {r['task']} | {r['n']} | {r['tok_s']} (plain {base['tok_s']}) "
                           f"| {r['speedup']} | {r['equal']}/{r['n']} |")
    return out
