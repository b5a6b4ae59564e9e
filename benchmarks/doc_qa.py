"""Doc-QA: composed documents (`compose_documents=True`) against the same documents prefilled.

Each item: three short seeded documents about made-up places (ten facts each), a question that
one of them answers, its gold answer. Per item and engine, on the bundle's base model:

- prefilled: `documents=`, compose off, prompt cache off (the exact answer);
- composed, for each k (`compose_recompute`): the documents are first sent once in another
  order (so each document's KV is in the cache), then the item's order is measured: every
  document is reused, moved to a new place, its first k tokens recomputed.

Reported per engine and k: answers equal to the prefilled one (greedy text), accuracy (the
gold answer in the reply, both runs), and time to first token as a ratio of the prefilled one.

    python benchmarks/doc_qa.py [--bundle DIR] [--items 30] [--k 0,32] [--out docs/doc-qa.json]

Held out: the items come from a seed and templates written for this benchmark; nothing was
tuned on them.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

SYLLABLES = ["ka", "lo", "ren", "vi", "sto", "mar", "qua", "del", "tho", "bri", "nu", "zel", "pa", "dor"]
FACTS = [  # (attribute, question, value kind)
    ("capital", "What is the capital of {p}?", "town"),
    ("river", "Which river flows through {p}?", "town"),
    ("founder", "Who founded {p}?", "person"),
    ("export", "What does {p} export most?", "good"),
    ("animal", "What is the national animal of {p}?", "animal"),
    ("sport", "Which sport is most popular in {p}?", "sport"),
    ("colour", "What colour is the flag of {p}?", "colour"),
    ("dish", "What is the national dish of {p}?", "dish"),
]
VALUES = {
    "good": ["copper", "wool", "salt", "timber", "coffee", "glass", "silk", "olives", "paper", "tin"],
    "animal": ["otter", "falcon", "lynx", "heron", "badger", "bison", "crane", "fox", "seal", "ibis"],
    "sport": ["rowing", "chess", "fencing", "archery", "cycling", "skiing", "sailing", "rugby"],
    "colour": ["green", "orange", "purple", "blue", "yellow", "crimson", "silver", "teal"],
    "dish": ["barley soup", "fish stew", "lentil pie", "rice cakes", "plum dumplings", "goat cheese"],
}


def word(rnd: random.Random, n: int) -> str:
    return "".join(rnd.choice(SYLLABLES) for _ in range(n)).capitalize()


def value(rnd: random.Random, kind: str) -> str:
    if kind == "town":
        return word(rnd, 3)
    if kind == "person":
        return f"{word(rnd, 2)} {word(rnd, 3)}"
    return rnd.choice(VALUES[kind])


def item(seed: int) -> dict:
    rnd = random.Random(seed)
    places = [word(rnd, 3) for _ in range(3)]
    docs, facts = [], []
    for p in places:
        f = {a: value(rnd, kind) for a, _, kind in FACTS}
        facts.append(f)
        text = (f"{p} is a small country. Its capital is {f['capital']}, and the river {f['river']} flows "
                f"through it. {p} was founded by {f['founder']}. Most of what {p} sells abroad is "
                f"{f['export']}. The national animal of {p} is the {f['animal']}. People in {p} love "
                f"{f['sport']} more than any other sport. The flag of {p} is {f['colour']}. The national "
                f"dish of {p} is {f['dish']}.")
        docs.append({"title": p, "text": text})
    which = rnd.randrange(3)
    attr, question, _ = rnd.choice(FACTS)
    return {"documents": docs, "question": question.format(p=places[which]), "gold": facts[which][attr]}


SYSTEM = "Answer the question from the documents, in a few words."


def ask(rt, it: dict, docs: list[dict], **kw):
    return rt.generate(None, messages=[{"role": "system", "content": SYSTEM},
                                       {"role": "user", "content": it["question"]}],
                       documents=docs, **{"max_tokens": 16, **kw})


def run(bundle, backend: str, threads: int, items: list[dict], ks: list[int]) -> dict:
    from prefix_edge import Runtime

    rows = []
    with Runtime.open(bundle, backend=backend, threads=threads, slots=1) as rt:
        ask(rt, items[0], items[0]["documents"], use_prompt_cache=False)  # warm-up
        for it in items:
            docs = it["documents"]
            ref = ask(rt, it, docs, use_prompt_cache=False)
            row = {"gold": it["gold"], "prefilled": ref.text, "prefilled_ttft_ms": ref.stats.ttft_ms}
            seen = [docs[1], docs[2], docs[0]]  # every document once, elsewhere
            ask(rt, it, seen, compose_documents=True, max_tokens=1)
            for k in ks:
                got = ask(rt, it, docs, compose_documents=True, compose_recompute=k)
                row[f"k{k}"] = got.text
                row[f"k{k}_ttft_ms"] = got.stats.ttft_ms
            rows.append(row)
            rt.documents.clear()  # the next item's documents are new
    out = {"rows": rows, "summary": {}}
    hit = [r["gold"].lower() in r["prefilled"].lower() for r in rows]
    out["summary"]["prefilled"] = {"accuracy": round(sum(hit) / len(rows), 3)}
    for k in ks:
        same = sum(r[f"k{k}"] == r["prefilled"] for r in rows)
        acc = sum(r["gold"].lower() in r[f"k{k}"].lower() for r in rows)
        ratio = statistics.median(r[f"k{k}_ttft_ms"] / r["prefilled_ttft_ms"] for r in rows)
        out["summary"][f"k={k}"] = {"agreement": round(same / len(rows), 3), "accuracy": round(acc / len(rows), 3),
                                    "ttft_vs_prefilled": round(ratio, 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--items", type=int, default=30)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--k", default="0,32")
    ap.add_argument("--backends", default="gguf,onnx")
    ap.add_argument("--out", default="docs/doc-qa.json")
    a = ap.parse_args()
    from prefix_edge.bundle import Bundle
    from prefix_edge.paths import default_bundle

    bundle = Bundle.open(a.bundle or default_bundle())
    items = [item(a.seed * 1000 + i) for i in range(a.items)]
    ks = [int(x) for x in a.k.split(",")]
    report = {"date": time.strftime("%Y-%m-%d"), "threads": a.threads, "items": a.items, "seed": a.seed,
              "machine": platform.processor() or platform.machine(), "bundle": str(bundle.root), "engines": {}}
    for backend in a.backends.split(","):
        res = run(bundle.root, backend, a.threads, items, ks)
        report["engines"][backend] = res
        for name, s in res["summary"].items():
            print(f"{backend} {name}: {json.dumps(s)}", flush=True)
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
