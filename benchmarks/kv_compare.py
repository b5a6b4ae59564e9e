"""Helpers for the KV-reduction benchmarks (prefix_store.py, gguf_kv.py): a greedy answer and
its teacher-forced agreement on another configuration.

Teacher forcing feeds the reference answer's tokens into the other configuration and counts
the steps whose argmax is the reference's next token (the EOS that ended it included). Every
step agreeing is the same as both greedy answers being identical; the fraction is the token
agreement that the KV-cache quantization literature reports."""

from __future__ import annotations

import numpy as np


def add_common_args(ap, limit: int | None = None) -> None:
    """The options every KV-comparison script takes (after its own)."""
    from pathlib import Path

    ap.add_argument("--max-tokens", type=int, default=256, help="cap on the task's own max_tokens")
    ap.add_argument("--limit", type=int, default=limit, help="held-out lines per task (default: all)")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--json", type=Path)


def greedy(be, prefix, ids, max_tokens: int, eos: set[int]) -> tuple[list[int], np.ndarray]:
    """The greedy answer (EOS included when reached) and the first step's logits."""
    be.begin(prefix)
    logits = be.prefill(ids)
    first = logits.copy()
    out = []
    for _ in range(max_tokens):
        t = int(np.argmax(logits))
        out.append(t)
        if t in eos:
            break
        logits = be.step(t)
    return out, first


def teacher_forced(be, prefix, ids, answer: list[int]) -> int:
    """Steps of `answer` whose token is this configuration's argmax, fed the answer so far."""
    be.begin(prefix)
    logits = be.prefill(ids)
    agree = 0
    for i, t in enumerate(answer):
        agree += int(np.argmax(logits)) == t
        if i + 1 < len(answer):
            logits = be.step(t)
    return agree


def held_out(rt, task: str, limit: int | None, max_tokens: int):
    """A demo task's held-out lines (the first `limit`), its greedy token cap (the task's own,
    at most `max_tokens`) and a scorer of answer texts: (rows, n_max, score(texts) -> mean);
    None for a task without a held-out set."""
    from prefix_edge.paths import demo_data
    from prefix_edge.tasks.datafile import read_jsonl
    from prefix_edge.evaluation.metrics import guess_metric, scorer

    data = demo_data(task)
    if data is None:
        return None
    every = read_jsonl(data)
    rows = every[:limit]
    metric = guess_metric([ex.output for ex in every])
    opts = rt.options(task, {})
    score = scorer(metric, [ex.output for ex in rows])

    def cut(text: str) -> str:  # the task's stop strings end an answer, as in the runtime
        ends = [text.find(x) for x in opts["stop"] if x in text]
        return text[: min(ends)] if ends else text

    def mean_score(texts: list[str]) -> float:
        return round(sum(score(cut(a), ex.output).score for a, ex in zip(texts, rows)) / len(rows), 4)

    return rows, min(max_tokens, opts["max_tokens"]), metric, mean_score
