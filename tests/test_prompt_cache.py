"""The prompt cache: the KV of prompts already read, reused by any later request that starts with
the same tokens (runtime/cache/prompts.py).

The reference for every hit is the same request with the cache off (`use_prompt_cache=False`,
or a runtime opened with `prompt_cache_bytes=0`): the tokens and their log-probabilities must be
equal, on both engines, also with threads and with a cache that evicts while requests run.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from prefix_edge import Runtime
from prefix_edge.runtime.engines.prefix import Prefix
from prefix_edge.runtime.cache.prompts import PromptCache, chain, chunk_ends

from .helpers.sheets import DOCS, QUESTIONS, ask_text

BACKENDS = ["onnx", "gguf"]

def _snap(n: int, nbytes: int = 100) -> Prefix:
    return Prefix(np.arange(n, dtype=np.int64), SimpleNamespace(nbytes=nbytes))  # a state the caches see by its bytes


# -- the cache itself -----------------------------------------------------------------------

def test_chunk_ends_follow_the_cuts():
    assert chunk_ends(10, (), 4) == [4, 8, 10]
    assert chunk_ends(10, (3,), 4) == [3, 7, 10]
    assert chunk_ends(10, (3, 5), 4) == [3, 5, 9, 10]
    assert chunk_ends(0, (), 4) == []


def test_chain_keys_are_shared_until_the_first_different_chunk():
    a = np.arange(20)
    b = a.copy()
    b[13] = 99
    ka, kb = chain("base", a, (), 4), chain("base", b, (), 4)
    assert [e for e, _ in ka] == [4, 8, 12, 16, 20]
    assert ka[:3] == kb[:3] and ka[3][1] != kb[3][1]
    assert chain("task:x", a, (), 4)[0][1] != ka[0][1]  # rooted
    assert chain("base", a, (6,), 4)[1][1] != ka[1][1]  # other chunks: another key


def test_lookup_takes_the_longest_chunk_end_and_leaves_a_token():
    c = PromptCache(1 << 20, chunk=4)
    ids = np.arange(20)
    assert c.put("base", ids, (), _snap(20))
    hit = c.lookup("base", np.concatenate([ids[:14], [77, 78]]), (), n_root=0)
    assert (hit.n, hit.keep) == (12, 12)
    hit = c.lookup("base", ids, (), n_root=5)  # the same prompt: all but its last chunk
    assert (hit.n, hit.keep) == (16, 21)
    assert c.lookup("base", np.array([5, 6, 7, 8, 9]), (), 0) is None
    assert c.lookup("other", ids, (), 0) is None
    info = c.info()
    assert (info["hits"], info["misses"], info["hit_tokens"]) == (2, 2, 28)


def test_an_engine_that_cannot_keep_part_hits_whole_entries_only():
    c = PromptCache(1 << 20, chunk=4, partial=False)
    ids = np.arange(20)
    c.put("base", ids[:8], (), _snap(8))
    c.put("base", ids, (), _snap(20))
    assert c.lookup("base", ids[:18], (), 0).n == 8  # 16 would need part of the 20-token entry
    assert c.info()["entries"] == 2  # the 8-token entry is not subsumed


def test_budget_lru_and_subsumed_entries():
    c = PromptCache(250, chunk=4)
    ids = np.arange(40)
    c.put("base", ids[:8], (), _snap(8))
    c.put("base", ids[:16], (), _snap(16))  # ends at 8 too: the first entry serves nothing more
    assert c.info()["entries"] == 1 and c.info()["bytes"] == 100
    c.put("base", ids[:16], (), _snap(16))  # the same prompt again: kept once
    assert c.info()["stored"] == 2
    c.put("x", ids[:8], (), _snap(8))
    c.lookup("base", ids[:20], (), 0)  # base's entry is the most recently used
    c.put("y", ids[:8], (), _snap(8))  # over budget: x goes
    assert c.lookup("x", ids[:12], (), 0) is None and c.lookup("base", ids[:20], (), 0).n == 16
    assert c.info()["bytes"] <= 250 and c.info()["evicted"] == 1
    assert not c.put("z", ids[:8], (), _snap(8, nbytes=251))  # bigger than the budget


# -- through the engines --------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_same_document_new_question_equals_a_miss(bundle_int4, backend):
    """A text task's input: the document's chunks come from the cache, the question is
    prefilled; tokens and log-probabilities equal the uncached run's."""
    with Runtime.open(bundle_int4, backend=backend, prefill_chunk=16) as rt:
        P = rt.manifest.tasks["support"].prefix_tokens
        first = rt.generate("support", ask_text(DOCS[0], QUESTIONS[0]), max_tokens=8, logprobs=2)
        assert first.stats.cached_tokens == P
        got = [rt.generate("support", ask_text(DOCS[0], q), max_tokens=8, logprobs=2) for q in QUESTIONS[1:]]
        refs = [rt.generate("support", ask_text(DOCS[0], q), max_tokens=8, logprobs=2, use_prompt_cache=False)
                for q in QUESTIONS[1:]]
        n_doc = len(rt.tokenizer.encode(DOCS[0] + "\n\nQuestion:", add_special_tokens=False).ids)
        for g, r in zip(got, refs):
            assert g.tokens == r.tokens and g.logprobs == r.logprobs
            assert g.stats.cached_tokens >= P + n_doc - 16  # all but the chunk the question starts in
            assert g.stats.input_tokens == r.stats.input_tokens
        assert rt.engine_info()["prompt_cache"]["hits"] >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_base_model_system_documents_are_reused_to_the_message_end(bundle_int4, backend):
    """Documents in the system message, the base model: a new question reuses everything up to
    the end of the system message (a cut: chunks never cross a message's end)."""
    system = "Answer from these documents.\n\n" + "\n\n".join(DOCS)
    with Runtime.open(bundle_int4, backend=backend, prefill_chunk=16) as rt:
        msgs = [[{"role": "system", "content": system}, {"role": "user", "content": q}] for q in QUESTIONS]
        rt.generate(None, messages=msgs[0], max_tokens=8)
        got = [rt.generate(None, messages=m, max_tokens=8, logprobs=1) for m in msgs[1:]]
        refs = [rt.generate(None, messages=m, max_tokens=8, logprobs=1, use_prompt_cache=False)
                for m in msgs[1:]]
        for m, g, r in zip(msgs[1:], got, refs):
            assert g.tokens == r.tokens and g.logprobs == r.logprobs
            # the whole system message (its end is a cut), not just its last chunk end
            _, cuts, _ = rt.chat_input(None, m)
            assert len(cuts) == 1 and g.stats.cached_tokens == cuts[0] and cuts[0] % 16 != 0
            assert g.stats.input_tokens == r.stats.input_tokens


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_and_a_cache_that_evicts_in_flight(bundle_int4, backend):
    """Three threads at once, one document each, every question twice, into a cache that holds
    about three prompts (nine are kept in turn): each answer equals its uncached run."""
    with Runtime.open(bundle_int4, backend=backend, prefill_chunk=16, prompt_cache_bytes=0) as rt:
        refs = {(d, q): rt.generate("support", ask_text(d, q), max_tokens=6).tokens for d in DOCS for q in QUESTIONS}
    with Runtime.open(bundle_int4, backend=backend, prefill_chunk=16) as rt:
        rt.generate("support", ask_text(max(DOCS, key=len), QUESTIONS[0]), max_tokens=1)
        budget = int(3.5 * rt.engine_info()["prompt_cache"]["bytes"])
    got, errors = {}, []
    with Runtime.open(bundle_int4, backend=backend, prefill_chunk=16, slots=3,
                      prompt_cache_bytes=budget) as rt:
        def run(d):
            try:
                for q in QUESTIONS:
                    got[d, q] = [rt.generate("support", ask_text(d, q), max_tokens=6).tokens for _ in range(2)]
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=run, args=(d,)) for d in DOCS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors
        info = rt.engine_info()["prompt_cache"]
        assert info["hits"] >= 6 and info["evicted"] > 0 and info["bytes"] <= budget
    for k, ref in refs.items():
        assert got[k] == [ref, ref], k


def test_off_means_off(bundle_int4):
    with Runtime.open(bundle_int4, backend="gguf", prefill_chunk=16, prompt_cache_bytes=0) as rt:
        for q in QUESTIONS:
            r = rt.generate("support", ask_text(DOCS[0], q), max_tokens=2)
            assert r.stats.cached_tokens == rt.manifest.tasks["support"].prefix_tokens
        assert rt.engine_info()["prompt_cache"]["entries"] == 0
