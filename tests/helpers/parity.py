"""The invariant's two sides on a runtime's engine: the first-step logits of an input after a
task's baked prefix, and after that prefix prefilled in the same sequence (the one-sequence API
on the runtime's own engine, idle: no request runs meanwhile)."""

from __future__ import annotations

import numpy as np


def baked_and_prefilled(rt, task: str, text: str) -> tuple[np.ndarray, np.ndarray]:
    """First-step logits of `text` after the task's baked prefix, and with the prefix prefilled."""
    ids = rt.encode_input(task, text)
    prefix, _ = rt.prefixes.get(task)
    rt.backend.begin(prefix)
    baked = rt.backend.prefill(ids)
    rt.backend.begin(None)
    return baked, rt.backend.prefill(np.concatenate([prefix.ids, ids]))
