"""Context that repeats: three documents (~2.5k tokens) in the system message, then a question,
five requests (first; the same documents with a new question, twice; the documents reordered;
one document swapped), through prefix-edge's prompt cache (on and off, both engines), its
composed documents (`documents=`, compose_documents=True: each document's KV once) and plain
llama-cpp-python (`Llama.create_chat_completion`, its own longest-common-prefix reuse) on the
same GGUF file, in one run. Time to first token of each request (max_tokens=1).

    python benchmarks/context_reuse.py [--bundle DIR] [--threads 2] [--out docs/context-reuse.json]
                                       [--backends gguf,onnx] [--sentences 52]

(--sentences: each sheet's length; 52 gives the 3,790-token workload, 13 about a quarter of it
for the larger models.)

Each runner is its own fresh process (the engines' first request warms up on an unrelated
prompt, which is then dropped from the cache), so one runner's pages and caches never help
another. Model: the bundle's base model (no task: the documents are the whole prefix).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

PRODUCTS = ["Orion desk lamp", "Vega kettle", "Lyra chair", "Atlas backpack"]
FACETS = ["warranty", "price", "weight", "colour", "material", "battery", "delivery", "returns",
          "cleaning", "assembly", "noise", "power", "size", "origin", "support", "accessories"]
WORDS = ["steady", "quiet", "bright", "compact", "sturdy", "light", "smooth", "simple", "careful",
         "patient", "quick", "gentle", "modern", "classic", "clear", "solid"]


def document(i: int, sentences: int = 52) -> str:
    """A seeded product sheet: facts a question can be answered from."""
    rnd = random.Random(1000 + i)
    name = PRODUCTS[i]
    lines = [f"Document {i + 1}: the {name}."]
    for k in range(sentences):
        facet = FACETS[k % len(FACETS)]
        lines.append(f"The {facet} of the {name} is {rnd.choice(WORDS)} and rated {rnd.randint(2, 98)} "
                     f"on our {rnd.choice(WORDS)} scale; customers call it {rnd.choice(WORDS)}.")
    return " ".join(lines)


SYSTEM = "Answer from these documents."


SENTENCES = 52  # each sheet's sentences (--sentences)


def requests() -> list[tuple[str, list[str], str]]:
    """(name, documents, question) of each request, in order."""
    d = [document(i, SENTENCES) for i in range(4)]
    return [("first", d[:3], "What is the warranty of the Orion desk lamp?"),
            ("same documents, new question", d[:3], "How heavy is the Lyra chair?"),
            ("same documents, another question", d[:3], "What colour is the Vega kettle?"),
            ("reordered", [d[2], d[0], d[1]], "What is the price of the Vega kettle?"),
            ("one swapped", [d[0], d[1], d[3]], "How loud is the Atlas backpack?")]


def workload() -> list[tuple[str, list[dict]]]:
    """The requests as messages: the documents joined into the system message."""
    return [(name, [{"role": "system", "content": SYSTEM + "\n\n" + "\n\n".join(docs)},
                    {"role": "user", "content": q}]) for name, docs, q in requests()]


WARM = [{"role": "user", "content": "Hello there, how are you today?"}]


def run_prefix_edge(bundle: str, backend: str, threads: int, mode: str) -> list[dict]:
    """mode: "on" / "off" (the prompt cache; documents joined into the system message) or
    "composed" (the documents given as `documents=`, compose_documents=True, prompt cache off)."""
    from prefix_edge import Runtime

    out = []
    with Runtime.open(bundle, backend=backend, threads=threads, slots=1,
                      prompt_cache_bytes=(512 << 20) if mode == "on" else 0) as rt:
        rt.generate(None, messages=WARM, max_tokens=1)
        rt.prompts.clear()
        for (name, m), (_, docs, q) in zip(workload(), requests()):
            if mode == "composed":
                r = rt.generate(None, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                                documents=[{"text": d} for d in docs], compose_documents=True, max_tokens=1)
            else:
                r = rt.generate(None, messages=m, max_tokens=1)
            out.append({"request": name, "ttft_ms": r.stats.ttft_ms, "prompt_tokens": r.stats.input_tokens,
                        "cached_tokens": r.stats.cached_tokens, "first_token": r.tokens[:1]})
    return out


def run_llama_cpp(gguf: str, threads: int) -> list[dict]:
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)
    llm.create_chat_completion(messages=WARM, max_tokens=1, temperature=0.0)
    out = []
    for name, m in workload():
        t = time.perf_counter()
        r = llm.create_chat_completion(messages=m, max_tokens=1, temperature=0.0)
        out.append({"request": name, "ttft_ms": round((time.perf_counter() - t) * 1e3, 3),
                    "prompt_tokens": r["usage"]["prompt_tokens"]})
    return out


def child(args: list[str]) -> list[dict]:
    p = subprocess.run([sys.executable, __file__, "--sentences", str(SENTENCES), "--child", *args],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{args}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="docs/context-reuse.json")
    ap.add_argument("--backends", default="gguf,onnx")
    ap.add_argument("--sentences", type=int, default=52)
    ap.add_argument("--child", nargs="+")
    a = ap.parse_args()
    global SENTENCES
    SENTENCES = a.sentences
    if a.child:
        kind, *rest = a.child
        if kind == "llama":
            res = run_llama_cpp(rest[0], int(rest[1]))
        else:
            res = run_prefix_edge(rest[0], rest[1], int(rest[2]), rest[3])
        print(json.dumps(res))
        return
    from prefix_edge.bundle import Bundle
    from prefix_edge.paths import default_bundle

    bundle = Bundle.open(a.bundle or default_bundle())
    gguf = str(bundle.model_file("gguf"))
    runs = {}
    backends = a.backends.split(",")
    for backend in backends:
        for cache in ("on", "off"):
            runs[f"prefix-edge {backend}, prompt cache {cache}"] = child(["pe", str(bundle.root), backend,
                                                                         str(a.threads), cache])
        runs[f"prefix-edge {backend}, composed documents"] = child(["pe", str(bundle.root), backend,
                                                                    str(a.threads), "composed"])
    runs["llama-cpp-python (its prefix reuse)"] = child(["llama", gguf, str(a.threads)])
    names = [n for n, _ in workload()]
    report = {"date": time.strftime("%Y-%m-%d"), "threads": a.threads, "sentences": SENTENCES,
              "machine": platform.processor() or
              platform.machine(), "bundle": str(bundle.root), "requests": names, "runs": runs}
    peer = runs["llama-cpp-python (its prefix reuse)"]
    for key, rows in runs.items():
        cells = " | ".join(f"{r['ttft_ms']:.0f}" for r in rows)
        print(f"| {key} | {cells} |")
    same = [n for n in names if n.startswith("same")]
    for key, rows in runs.items():
        if "cache on" in key:
            ratio = statistics.median(rows[names.index(n)]["ttft_ms"] / peer[names.index(n)]["ttft_ms"] for n in same)
            speedup = statistics.median(rows[0]["ttft_ms"] / rows[names.index(n)]["ttft_ms"] for n in same)
            report.setdefault("ratios", {})[key] = {"same_documents_vs_llama_cpp": round(ratio, 3),
                                                   "same_documents_vs_first": round(speedup, 1)}
            print(f"{key}: same documents {ratio:.2f}x llama-cpp-python's reuse, {speedup:.0f}x faster than the first")
    for backend in backends:  # composed vs that engine's prefill, documents seen before
        rows, base = runs[f"prefix-edge {backend}, composed documents"], runs[f"prefix-edge {backend}, prompt cache off"]
        moved = {n: round(rows[names.index(n)]["ttft_ms"] / base[names.index(n)]["ttft_ms"], 3)
                 for n in ("reordered", "one swapped")}
        report.setdefault("composed_vs_prefill", {})[backend] = moved
        print(f"{backend} composed / prefill: " + ", ".join(f"{n} {v:.2f}x" for n, v in moved.items()))
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
