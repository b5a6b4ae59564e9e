"""A Runtime on the fake engine (tests/helpers/fake_engine.py, fake_bundle.py): the whole call
path above the engine seam — options, templates, the prefix cache, the prompt cache, resident
prefixes, midpoint snapshots, composed documents, the scheduler — in the unit tier, in seconds.

The fake's logits are a function of every token before (a hash), so any state the runtime
builds (restored, copied, composed, cut back) answers as a plain prefill exactly when it holds
the same tokens: each reference here is the same call run without the path under test (no baked
prefix, no prompt cache, not composed, not shared), in a runtime of its own."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from prefix_edge import Runtime
from prefix_edge.errors import PrefixEdgeError
from tests.helpers.fake_bundle import write_bundle
from tests.helpers.fake_engine import SLOT, FakeEngine

LONG = " ".join(f"w{1 + (7 * i) % 61}" for i in range(300))  # past two prefill chunks
TASKS = {"long": LONG, "short": "w5 w6 w7 w8"}
CHAT = {"helper": "w20 w21 w22 w23"}
INPUTS = ["w9 w10 w11", " ".join(f"w{30 + i % 20}" for i in range(140)), "w3"]


class Recurrent(FakeEngine):
    """A fake whose state cannot be cut back (as a hybrid's recurrent layers): the prompt cache
    then serves a state only where it ends, so it keeps midpoints too."""

    def __init__(self, **kw):
        super().__init__(keeps_partial=False, **kw)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_bundle(tmp_path_factory.mktemp("fake") / "bundle", TASKS, CHAT)


def opened(root, engine=FakeEngine, **kw) -> Runtime:
    return Runtime.open(root, backend=SLOT, engine=engine, **kw)


def test_a_runtime_opens_on_the_fake_and_a_baked_prefix_answers_as_its_prefill(root):
    with opened(root) as rt:
        assert rt.backend.name == SLOT and isinstance(rt.backend, FakeEngine)
        for task in TASKS:
            for text in INPUTS:
                baked = rt.generate(task, text, max_tokens=12)
                prefilled = rt.generate(task, text, max_tokens=12, use_prefix_cache=False)
                assert baked.tokens == prefilled.tokens and len(baked.tokens) > 0
                assert baked.stats.cached_from["task_prefix"] == rt.tasks[task].prefix_tokens
                assert prefilled.stats.cached_from["task_prefix"] == 0
        # the prefix's read in the chunks export baked it in: its forwards end at 128 and 300
        rt.backend.log.clear()
        rt.generate("long", "w3", max_tokens=1, use_prefix_cache=False)
        ends = np.cumsum([n for fwd in rt.backend.log for _, _, n in fwd])
        assert {128, 256, 300} <= set(ends.tolist())


def test_a_task_switch_on_resident_prefixes_answers_as_a_restore(root):
    """shared_kv: each task's prefix restored once into a resident sequence and copied per
    request; 18 requests of two tasks at once answer as each alone in a runtime without residents
    (no prompt cache: every request starts from its task's resident)."""
    calls = [(task, text) for task in ("long", "short") for text in INPUTS] * 3
    with opened(root) as rt:
        refs = {c: rt.generate(*c, max_tokens=10).tokens for c in set(calls)}
    with opened(root, shared_kv=True, slots=4, prompt_cache_bytes=0) as rt:
        got: dict[int, list[int]] = {}

        def run(i, c):
            got[i] = rt.generate(*c, max_tokens=10).tokens

        threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [got[i] for i in range(len(calls))] == [refs[c] for c in calls]
        stats = rt._sched.stats
        assert stats["resident_restores"] == 2 and stats["resident_hits"] == len(calls) - 2
        assert rt.backend.seqs.keys() <= set(range(4, 8))  # only the residents stay


def conversation(question: str) -> list[dict]:
    return [{"role": "user", "content": " ".join(f"w{40 + i % 19}" for i in range(150))},
            {"role": "assistant", "content": "w7 w8"},
            {"role": "user", "content": question}]


@pytest.mark.parametrize("engine", [FakeEngine, Recurrent], ids=["cut-back", "recurrent"])
def test_the_prompt_cache_serves_a_new_question_after_the_same_history(root, engine):
    """The same history with a new last question: restored from the prompt cache up to the
    start of the last message (a state that cannot be cut back: the midpoint kept for it), the
    answer the uncached run's."""
    with opened(root, engine, read_ahead=False) as rt:
        first = rt.generate("helper", messages=conversation("w30 w31"), max_tokens=8)
        again = rt.generate("helper", messages=conversation("w32 w33 w34"), max_tokens=8)
    with opened(root, engine, prompt_cache_bytes=0) as cold:
        assert first.tokens == cold.generate("helper", messages=conversation("w30 w31"), max_tokens=8).tokens
        ref = cold.generate("helper", messages=conversation("w32 w33 w34"), max_tokens=8)
    assert again.tokens == ref.tokens
    hit = again.stats.cached_from["prompt_cache"]
    assert hit > 150 and hit == again.stats.cached_tokens - rt.tasks["helper"].prefix_tokens
    assert ref.stats.cached_from["prompt_cache"] == 0


def test_composed_documents_answer_as_their_block_and_are_reused(root):
    """compose_documents: each document computed once and spliced in (the fake's keys do not
    rotate: a composed state holds the block's very tokens), so the answer is the plain block's;
    the same documents in another order reuse what was computed."""
    docs = [{"title": "", "text": " ".join(f"w{40 + i % 20}" for i in range(70))},
            {"title": "", "text": " ".join(f"w{10 + i % 20}" for i in range(90))}]
    ask = [{"role": "user", "content": "w9 w10"}]
    with opened(root) as rt:
        for task in (None, "helper"):
            for order in (docs, docs[::-1]):
                composed = rt.generate(task, messages=ask, documents=order, max_tokens=8, compose_documents=True)
                plain = rt.generate(task, messages=ask, documents=order, max_tokens=8)
                assert composed.tokens == plain.tokens
            assert composed.stats.cached_from["documents"] > 100  # the second order: reused


def test_an_engine_of_ones_own_is_checked_as_the_bundles(root, tmp_path):
    """engine=: the class stands in for the bundle's files, its state still held to the
    manifest's (a prefix baked for another state is refused in one line, before any call)."""

    class Other(FakeEngine):
        def state_info(self) -> dict:
            return {"kind": "another"}

    with pytest.raises(PrefixEdgeError, match="re-export the bundle"):
        opened(root, Other)
