"""Helpers for the KV-reduction benchmarks (prefix_store.py, gguf_kv.py): a greedy answer and
its teacher-forced agreement on another configuration.

Teacher forcing feeds the reference answer's tokens into the other configuration and counts
the steps whose argmax is the reference's next token (the EOS that ended it included). Every
step agreeing is the same as both greedy answers being identical; the fraction is the token
agreement that the KV-cache quantization literature reports."""

from __future__ import annotations

import numpy as np


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
