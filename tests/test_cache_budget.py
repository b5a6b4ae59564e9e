"""One host budget over the prompt cache and the document cache (runtime/cache/budget.py): the
entry used longest ago, in either cache, goes first; each cache keeps its own cap; a request's
answer after an eviction equals its uncached run (a hit equals a miss, a miss equals a miss)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from prefix_edge import Runtime
from prefix_edge.runtime.cache.budget import HostBudget
from prefix_edge.runtime.cache.documents import DocumentKv
from prefix_edge.runtime.cache.prompts import PromptCache
from prefix_edge.runtime.engines.kv import KvLayers
from prefix_edge.runtime.engines.prefix import Prefix

from .helpers.sheets import DOCS, QUESTIONS, ask_text


def _state(n: int, nbytes: int) -> Prefix:
    return Prefix(np.arange(n, dtype=np.int64), SimpleNamespace(nbytes=nbytes))  # a state the caches see by its bytes


def _doc_kv(positions: int) -> KvLayers:  # positions * 5 floats * 2 (k and v) * 4 bytes
    return KvLayers([np.zeros((positions, 1, 5), np.float32)], [np.ones((positions, 1, 5), np.float32)])


def test_the_least_recently_used_entry_goes_whichever_cache_holds_it():
    host = HostBudget(1000)
    prompts, docs = PromptCache(10_000, chunk=4, shared=host), DocumentKv(10_000, shared=host)
    ids = np.arange(8, dtype=np.int64)
    assert prompts.put("task-a", ids, (), _state(8, 400))
    docs.put("d1", _doc_kv(10))  # 400 bytes: 800 held
    assert prompts.lookup("task-a", np.arange(9, dtype=np.int64), (), 0) is not None  # the prompt used again
    docs.put("d2", _doc_kv(10))  # 1,200 > 1,000: d1, used longest ago, goes (not the prompt)
    assert docs.get("d1") is None and docs.get("d2") is not None
    assert prompts.info()["entries"] == 1 and host.info() == {"bytes": 800, "budget_bytes": 1000, "evictions": 1}
    assert prompts.put("task-b", ids, (), _state(8, 400))  # now the task-a prompt is the oldest use
    assert prompts.lookup("task-a", np.arange(9, dtype=np.int64), (), 0) is None
    assert prompts.lookup("task-b", np.arange(9, dtype=np.int64), (), 0) is not None
    assert docs.get("d2") is not None and host.bytes == 800 and host.evictions == 2
    assert prompts.info()["evicted"] == 1 and docs.info()["evictions"] == 1  # each counts its own
    # an entry larger than the whole budget is not kept (nothing is evicted for it)
    assert not prompts.put("task-c", ids, (), _state(8, 1001))
    docs.put("d3", _doc_kv(26))  # 1,040 bytes
    assert docs.get("d3") is None and host.bytes == 800 and host.evictions == 2


def test_each_cache_keeps_its_own_cap_inside_the_budget():
    host = HostBudget(10_000)
    prompts, docs = PromptCache(500, chunk=4, shared=host), DocumentKv(0, shared=host)  # documents off
    docs.put("d1", _doc_kv(10))
    assert docs.get("d1") is None
    for i in range(3):
        prompts.put(f"task-{i}", np.arange(8, dtype=np.int64), (), _state(8, 200))
    assert prompts.info()["bytes"] == 400 and host.bytes == 400 and host.evictions == 0  # its own cap evicted


def test_threads_keep_the_budget():
    """Four threads storing into both caches at once: the budget holds after every put settles,
    and no thread deadlocks (a cache settles outside its own lock)."""
    host = HostBudget(5_000)
    prompts, docs = PromptCache(1 << 20, chunk=4, shared=host), DocumentKv(1 << 20, shared=host)
    errors = []

    def work(k: int):
        try:
            rng = np.random.default_rng(k)
            for i in range(200):
                if rng.random() < 0.5:
                    prompts.put(f"t{k}-{i}", np.arange(8, dtype=np.int64), (), _state(8, int(rng.integers(100, 900))))
                else:
                    docs.put(f"d{k}-{i}", _doc_kv(int(rng.integers(2, 20))))
                assert host.bytes <= host.budget + 2 * 900  # at most the entries in flight over it
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert host.bytes <= host.budget and host.evictions > 0


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_an_evicted_prompt_is_a_miss_that_answers_as_one(bundle_int4, backend):
    """A budget that holds one document's prompt state: the second document's evicts the first,
    whose repeat then prefills again and answers as the uncached run; the second's repeat is a
    hit. memory() and engine_info() report the one budget."""
    asks = [ask_text(DOCS[0], QUESTIONS[0]), ask_text(DOCS[1], QUESTIONS[0])]
    with Runtime.open(bundle_int4, backend=backend, prefill_chunk=16, prompt_cache_bytes=0) as rt:
        refs = [rt.generate("support", t, max_tokens=6).tokens for t in asks]
        P = rt.manifest.tasks["support"].prefix_tokens
    with Runtime.open(bundle_int4, backend=backend, prefill_chunk=16) as rt:
        rt.generate("support", asks[0], max_tokens=1)
        one = rt.memory()["host_cache"]["bytes"]
    assert one > 0
    with Runtime.open(bundle_int4, backend=backend, prefill_chunk=16, cache_bytes=int(1.5 * one)) as rt:
        first = [rt.generate("support", t, max_tokens=6) for t in asks]
        host = rt.memory()["host_cache"]
        assert host["bytes"] <= host["budget_bytes"] == int(1.5 * one) and rt.engine_info()["host_cache"]["evictions"] >= 1
        again = [rt.generate("support", t, max_tokens=6) for t in reversed(asks)]  # 1 (kept), then 0 (evicted)
        assert again[0].stats.cached_tokens > P and again[1].stats.cached_tokens == P
        # where the reused positions came from: the task's baked prefix, then the prompt cache
        assert first[0].stats.cached_from == {"task_prefix": P, "prompt_cache": 0, "documents": 0}
        assert again[0].stats.cached_from == {"task_prefix": P, "prompt_cache": again[0].stats.cached_tokens - P,
                                              "documents": 0}
        assert [r.tokens for r in first] == refs and [r.tokens for r in reversed(again)] == refs
