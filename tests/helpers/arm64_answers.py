"""The arm64 tier's answers, as one JSON object on stdout: the README's examples, a
baked-vs-prefilled check on the shortest instruction task and a two-turn conversation, greedy (each step with
its top-5 log-probabilities), on one backend of the default bundle ($PREFIX_EDGE_HOME).
tests/test_arm64.py runs this same file with the x86 host's Python and inside the arm64 root (no
import from the tests: it is copied there alone).

    python arm64_answers.py onnx|gguf [THREADS]

(The baked-vs-prefilled task is the shortest one with a written prompt, not the longest, and the
answers are short: under qemu llama.cpp computes a token in about a second of CPU.)
"""

from __future__ import annotations

import json
import sys
import time

from prefix_edge import Runtime

ORDER = "Hi, this is Maria Lopez, please send 3 desk lamps to Porto."          # README
REVIEW = "Stopped charging after a week and the seller ignored me."            # README
QUESTION = "I deleted a folder by mistake three weeks ago on the Free plan. Can I get it back?"
TURNS = ("My sync stopped.", "Where is that setting?")                         # README's chat


def main(backend: str, threads: int) -> dict:
    out: dict = {"backend": backend, "threads": threads, "seconds": {}}
    t0 = time.perf_counter()

    def timed(name, fn):
        t = time.perf_counter()
        r = fn()
        out["seconds"][name] = round(time.perf_counter() - t, 2)
        return r

    def answer(r) -> dict:  # with each step's top-5 (token, logprob): how near a tie a step was
        top = [[[int(t), round(float(lp), 4)] for t, lp in alts] for _, _, alts in (r.logprobs or [])]
        return {"tokens": list(r.tokens), "text": r.text, "cached_tokens": r.stats.cached_tokens,
                "top": top}

    with timed("open", lambda: Runtime.open(None, backend=backend, threads=threads)) as rt:
        out["order_json"] = answer(timed("order_json", lambda: rt.generate("order_json", ORDER)))
        out["sentiment_tuned"] = answer(timed("sentiment_tuned", lambda: rt.generate("sentiment_tuned", REVIEW)))
        task = min((k for k, t in rt.tasks.items() if t.kind == "text"), key=lambda k: rt.tasks[k].prefix_tokens)
        out["prefix_task"] = {"task": task, "prefix_tokens": rt.tasks[task].prefix_tokens}
        out["baked"] = answer(timed("baked", lambda: rt.generate(task, QUESTION, max_tokens=12, logprobs=5)))
        out["prefilled"] = answer(timed("prefilled", lambda: rt.generate(
            task, QUESTION, max_tokens=12, logprobs=5, use_prefix_cache=False)))
        conv = rt.chat("support")
        out["turns"] = [answer(timed(f"turn{i + 1}", lambda t=t: conv.send(t, max_tokens=12, logprobs=5)))
                        for i, t in enumerate(TURNS)]
    out["seconds"]["total"] = round(time.perf_counter() - t0, 2)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)))
