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


def three_ways(be, ids: list[int], ref: np.ndarray) -> tuple[dict[str, float], np.ndarray]:
    """Logits of `ids` on engine `be` (the one-sequence API) read stepped (one token a forward),
    whole (one forward) and in two chunks, each against `ref` (the reference's logits at every
    position): ({way: max |difference|}, the stepped logits)."""
    be.begin(None)
    stepped = np.array([be.prefill(np.array(ids[:1], np.int64))] + [be.step(t) for t in ids[1:]])
    be.begin(None)
    whole = be.prefill(np.array(ids, np.int64))
    cut = len(ids) // 2 + 1
    be.begin(None)
    chunks = np.array([be.prefill(np.array(ids[:cut], np.int64)), be.prefill(np.array(ids[cut:], np.int64))])
    return {what: float(np.max(np.abs(got - want))) for what, got, want in (
        ("stepped", stepped, ref), ("whole", whole, ref[-1]), ("chunks", chunks, ref[[cut - 1, -1]]))}, stepped


def agree_until_a_near_tie(ref, got, noise: float) -> None:
    """Greedy replies of two runs whose logits differ by float noise: the same tokens up to the
    first step where they differ, whose top two in `ref` are then within `noise`."""
    assert ref.tokens
    for i, (x, y) in enumerate(zip(ref.tokens, got.tokens)):
        if x != y:
            best = sorted((lp for _, lp in ref.logprobs[i][2]), reverse=True)
            assert best[0] - best[1] <= noise, (i, best)
            return
    assert ref.tokens == got.tokens


def in_threads(calls: list) -> list:
    """Each of `calls` (no-argument callables) run from a thread of its own, all at once: their
    results, in order; an exception in any is raised here."""
    import threading

    got, errors = {}, []

    def run(k):
        try:
            got[k] = calls[k]()
        except Exception as e:  # noqa: BLE001 - raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return [got[k] for k in range(len(calls))]


def generated_together(rt, asks: list[tuple], max_tokens: int) -> list[list[int]]:
    """Each (task, text) of `asks` generated on `rt` from a thread of its own, all at once (the
    scheduler batches them): their tokens, in order."""
    return in_threads([lambda t=t, x=x: rt.generate(t, x, max_tokens=max_tokens).tokens for t, x in asks])
