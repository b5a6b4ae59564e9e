"""Embeddings from the bundle's model: paraphrase retrieval (recall@1, pooling x engine) and
throughput (texts/s at 1 and 16 in flight), beside llama-cpp-python's own
`Llama(..., embedding=True).embed` on the same GGUF (mean pooling, normalised).

The retrieval set is this script's own, seeded: PAIRS pairs of a sentence and a paraphrase of
it, made from templates whose slots (names, numbers, things, places) are drawn with a seed, so
a query's nearest paraphrase must match on content, not on phrasing. Each sentence is a query
against all the paraphrases; recall@1 is the share whose nearest (cosine) is its own.

    python benchmarks/embeddings.py [--bundle DIR] [--pairs 50] [--seed 0] [--threads N]
                                    [--recall-only] [--out docs/embeddings.json]
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from prefix_edge.runtime.embedding import POOLINGS

TEMPLATES = [
    ("{name} bought {n} {item} in {city} last week.",
     "Last week, {n} {item} were purchased by {name} in {city}."),
    ("The {item} I ordered from {city} arrived broken.",
     "My order of {item} shipped from {city} came damaged."),
    ("{name} is flying to {city} on {day} for a conference.",
     "On {day}, {name} takes a plane to {city} to attend a conference."),
    ("Please cancel my subscription to the {item} club, {name} here.",
     "This is {name}: I want to stop my {item} club membership."),
    ("The meeting about {item} moved from {day} to next {day2}.",
     "We rescheduled the {item} meeting: not {day} anymore, next {day2} instead."),
    ("{name} lost {n} {item} on the train to {city}.",
     "On the way to {city} by train, {name} misplaced {n} {item}."),
    ("Can I return {n} {item} I bought in {city}?",
     "Is it possible to send back {n} {item} purchased in {city}?"),
    ("{name}'s {item} stopped working after {n} days.",
     "After {n} days the {item} belonging to {name} broke down."),
]
NAMES = ["Maria", "Tom", "Aiko", "Liam", "Noor", "Pedro", "Olga", "Kwame", "Sara", "Ivan", "Chen", "Lea"]
ITEMS = ["desk lamps", "coffee mugs", "bicycles", "umbrellas", "headphones", "notebooks", "kettles",
         "backpacks", "chairs", "printers", "phones", "books"]
CITIES = ["Porto", "Osaka", "Nairobi", "Lima", "Oslo", "Denver", "Krakow", "Hanoi", "Dublin", "Quito"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def pairs(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        a, b = TEMPLATES[len(out) % len(TEMPLATES)]
        d1, d2 = rng.sample(DAYS, 2)
        slots = dict(name=rng.choice(NAMES), n=rng.randint(2, 30), item=rng.choice(ITEMS),
                     city=rng.choice(CITIES), day=d1, day2=d2)
        s = a.format(**slots)
        if s not in seen:
            seen.add(s)
            out.append((s, b.format(**slots)))
    return out


def recall_at_1(q: np.ndarray, d: np.ndarray) -> float:
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    d = d / np.linalg.norm(d, axis=1, keepdims=True)
    return float(np.mean(np.argmax(q @ d.T, axis=1) == np.arange(len(q))))


def rate(fn, texts: list[str], in_flight: int) -> float:
    """texts/s embedding `texts` one per call, `in_flight` calls at a time."""
    t0 = time.perf_counter()
    if in_flight == 1:
        for t in texts:
            fn(t)
    else:
        with ThreadPoolExecutor(in_flight) as pool:
            list(pool.map(fn, texts))
    return len(texts) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--pairs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rate-texts", type=int, default=64, help="texts per throughput measurement")
    ap.add_argument("--recall-only", action="store_true", help="skip the throughput runs")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from prefix_edge import Runtime
    from prefix_edge.bundle import Bundle
    from prefix_edge.runtime.engines.cpus import default_threads

    threads = a.threads or default_threads()
    bundle = Bundle.open(a.bundle)
    ps = pairs(a.pairs, a.seed)
    queries, docs = [p[0] for p in ps], [p[1] for p in ps]
    texts = (queries + docs) * (1 + a.rate_texts // (2 * len(ps)))
    texts = texts[:a.rate_texts]
    report = {"bundle": str(bundle.root), "pairs": len(ps), "seed": a.seed, "threads": threads,
              "recall_at_1": {}, "texts_per_s": {}, "cosine_onnx_gguf": {}}
    vecs = {}
    for backend in ("onnx", "gguf"):
        if backend not in bundle.backends:
            continue
        with Runtime.open(bundle.root, backend=backend, threads=threads) as rt:
            for pooling in POOLINGS:
                q, d = rt.embed(queries, pooling=pooling), rt.embed(docs, pooling=pooling)
                vecs[backend, pooling] = np.concatenate([q, d])
                report["recall_at_1"][f"{backend}/{pooling}"] = recall_at_1(q, d)
            rt.embed(texts[:4])  # warm
            for k in () if a.recall_only else (1, 16):
                report["texts_per_s"][f"prefix-edge {backend} (mean), {k} in flight"] = \
                    round(rate(lambda t: rt.embed(t), texts, k), 1)
    for pooling in POOLINGS:
        if ("onnx", pooling) in vecs and ("gguf", pooling) in vecs:
            cos = (vecs["onnx", pooling] * vecs["gguf", pooling]).sum(axis=1)
            report["cosine_onnx_gguf"][pooling] = {"min": round(float(cos.min()), 6),
                                                   "mean": round(float(cos.mean()), 6)}
    if "gguf" in bundle.backends:
        import llama_cpp

        llm = llama_cpp.Llama(str(bundle.model_file("gguf")), embedding=True, n_ctx=2048, n_batch=2048,
                              n_ubatch=2048, n_threads=threads, n_threads_batch=threads,
                              pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, verbose=False)
        q, d = np.array(llm.embed(queries, normalize=True)), np.array(llm.embed(docs, normalize=True))
        report["recall_at_1"]["llama-cpp-python/mean"] = recall_at_1(q, d)
        if ("gguf", "mean") in vecs:
            cos = (np.concatenate([q, d]) * vecs["gguf", "mean"]).sum(axis=1)
            report["cosine_llama_cpp_python_gguf_mean"] = round(float(cos.min()), 6)
        if not a.recall_only:
            lock = threading.Lock()  # one Llama is not safe from two threads: 16 in flight = batches of 16

            def one(t):
                with lock:
                    llm.embed(t, normalize=True)
            report["texts_per_s"]["llama-cpp-python embed, 1 in flight"] = round(rate(one, texts, 1), 1)
            t0 = time.perf_counter()
            for i in range(0, len(texts), 16):
                llm.embed(texts[i:i + 16], normalize=True)
            report["texts_per_s"]["llama-cpp-python embed, lists of 16"] = round(len(texts) / (time.perf_counter() - t0), 1)
        llm.close()
    print(f"| recall@1 ({len(ps)} pairs, seed {a.seed}) | |\n|---|---|")
    for k, v in report["recall_at_1"].items():
        print(f"| {k} | {v:.2f} |")
    print(f"\n| texts/s ({len(texts)} texts, {threads} threads) | |\n|---|---|")
    for k, v in report["texts_per_s"].items():
        print(f"| {k} | {v} |")
    print("\ncosine onnx vs gguf:", report["cosine_onnx_gguf"],
          "| llama-cpp-python vs prefix-edge gguf (mean), min:", report.get("cosine_llama_cpp_python_gguf_mean"))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
