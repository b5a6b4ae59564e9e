"""The scheduler's unit tier, on a fake engine (tests/helpers/fake_engine.py: the engine protocol
over numpy, logits a function of each sequence's whole history): admission, the queue's limit,
cancellation in every phase, budgets, n choices, batching, faults, the prompt-read callback.
Each reference is the same request run alone in a fresh scheduler. The real engines run the
same scheduler in tests/test_concurrency.py, test_runtime.py and test_prompt_cache.py.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from prefix_edge.errors import PrefixEdgeError, RuntimeBusy
from prefix_edge.runtime.engines.prefix import Prefix
from prefix_edge.runtime.scheduler import Request
from tests.helpers.fake_engine import FakeEngine, Tokens
from tests.helpers.scheduling import TOK, outcome, request, scheduler

pytestmark = pytest.mark.unit








def alone(ids, **kw) -> tuple[list[int], str]:
    s, _ = scheduler()
    try:
        r = request(ids, **kw)
        s.submit(r)
        reason, _ = outcome(r)
        return list(r.tokens), reason
    finally:
        s.close()


PROMPTS = [list(range(1 + i, 12 + 3 * i)) for i in range(6)]


def together_equal_each_alone(engine: FakeEngine | None = None) -> FakeEngine:
    """Every prompt submitted at once gives its lone run's tokens and end; the engine after."""
    refs = [alone(p, max_tokens=8) for p in PROMPTS]
    s, engine = scheduler(engine, prefill_chunk=4)
    try:
        rs = [request(p, max_tokens=8) for p in PROMPTS]
        for r in rs:
            s.submit(r)
        for r, (tokens, reason) in zip(rs, refs):
            assert outcome(r)[0] == reason and r.tokens == tokens
    finally:
        s.close()
    return engine


def test_requests_together_equal_each_alone():
    engine = together_equal_each_alone()
    assert engine.seqs == {}  # every sequence freed
    # decode steps batch every decoding request into one forward
    assert max(sum(1 for _, _, n in f if n == 1) for f in engine.log) >= 2


def test_an_engine_that_batches_otherwise_decodes_each_sequence_alone():
    """An engine whose token beside another sequence's gets other logits (batches_sequences
    False, as llama.cpp's Gemma 3n): requests together still give each one's lone tokens, every
    forward holding one sequence; the fake's batched logits differ, so batching would show."""
    engine = together_equal_each_alone(FakeEngine(batches_sequences=False))
    assert max(len(f) for f in engine.log) == 1
    batched = FakeEngine(batches_sequences=False)
    batched.seq_restore(0, None), batched.seq_restore(1, None)
    a, b = batched.forward([(0, 0, np.array([1])), (1, 0, np.array([2]))])
    assert not np.array_equal(a, FakeEngine().forward([(0, 0, np.array([1]))])[0])


def test_prefill_is_chunked_and_never_crosses_a_cut():
    s, engine = scheduler(prefill_chunk=4)
    try:
        r = request(list(range(1, 15)), max_tokens=1, cuts=(6,))
        s.submit(r)
        outcome(r)
    finally:
        s.close()
    assert [n for f in engine.log for _, _, n in f] == [4, 2, 4, 4]


def admitted(r: Request, timeout: float = 20.0) -> None:
    """Wait until the engine thread has given r a sequence."""
    for _ in range(int(timeout * 100)):
        if r.seq >= 0:
            return
        time.sleep(0.01)
    raise AssertionError("not admitted")


def test_queue_limit_is_an_error_not_a_hang():
    s, engine = scheduler(slots=1, queue_size=2)
    engine.gate = threading.Semaphore(0)
    try:
        first = request(PROMPTS[0], max_tokens=50)
        s.submit(first)
        admitted(first)  # the engine is now held in its first forward
        queued = [request(PROMPTS[1]), request(PROMPTS[2])]
        for r in queued:
            s.submit(r)
        with pytest.raises(RuntimeBusy):
            s.submit(request(PROMPTS[3]))
        for r in [first] + queued:
            s.cancel(r)
        engine.gate.release(1000)
        assert [outcome(r)[0] for r in [first] + queued] == ["cancelled"] * 3
    finally:
        s.close()


def run_forwards(engine: FakeEngine, n: int, timeout: float = 20.0) -> None:
    """Let the engine run n more forwards, then wait until it is held before the next one."""
    target = len(engine.log) + n
    engine.gate.release(n)
    for _ in range(int(timeout * 100)):
        if len(engine.log) >= target and engine.held.is_set():
            return
        time.sleep(0.01)
    raise AssertionError("the engine did not reach the gate")


@pytest.mark.parametrize("phase", ["waiting", "prefill", "decode"])
def test_cancel_in_every_phase_frees_it_and_leaves_the_others_alone(phase):
    other_ref = alone(PROMPTS[1], max_tokens=12)
    s, engine = scheduler(slots=1 if phase == "waiting" else 2, prefill_chunk=2)
    engine.gate = threading.Semaphore(0)
    try:
        other = request(PROMPTS[1], max_tokens=12)
        victim = request(list(range(1, 30 if phase == "prefill" else 5)), max_tokens=40)
        s.submit(other)
        admitted(other)
        s.submit(victim)
        run_forwards(engine, {"waiting": 2, "prefill": 4, "decode": 12}[phase])
        if phase == "waiting":
            assert victim.seq == -1
        elif phase == "prefill":
            assert victim.seq >= 0 and 0 < victim.fed < len(victim.call.ids)
        else:
            assert victim.n_samples > 0
        s.cancel(victim)
        engine.gate.release(1000)
        assert outcome(victim)[0] == "cancelled"
        assert outcome(other)[0] == other_ref[1] and other.tokens == other_ref[0]
    finally:
        engine.gate.release(1000)
        s.close()
    assert victim.seq == -1 and engine.seqs == {}


def test_max_tokens_stop_strings_and_eos():
    tokens, reason = alone(PROMPTS[0], max_tokens=5)
    assert reason == "length" and len(tokens) == 5
    text = TOK.decode(tokens)
    stop = text.split()[2]
    s, _ = scheduler()
    try:
        r = request(PROMPTS[0], max_tokens=5, stops=[stop])
        s.submit(r)
        assert outcome(r) == ("stop", text[:text.find(stop)])
    finally:
        s.close()
    s, _ = scheduler(FakeEngine(eos_bias=50.0))  # the end-of-sequence token wins at once
    try:
        r = request(PROMPTS[0], max_tokens=5)
        s.submit(r)
        assert outcome(r) == ("eos", "") and r.tokens == []
    finally:
        s.close()


def test_a_prefix_restored_gives_what_its_prefill_gave():
    pre = list(range(40, 50))
    tokens, _ = alone(pre + PROMPTS[0], max_tokens=6)
    s, engine = scheduler()
    try:
        r = request(PROMPTS[0], max_tokens=6, prefix=Prefix(np.array(pre), Tokens(pre)))
        s.submit(r)
        outcome(r)
        assert r.tokens == tokens
        keep = request(PROMPTS[0], max_tokens=6, prefix=Prefix(np.array(pre + [7, 7]), Tokens(pre + [7, 7])),
                       prefix_keep=len(pre))  # the first positions of a longer state
        s.submit(keep)
        outcome(keep)
        assert keep.tokens == tokens
    finally:
        s.close()


def test_prompt_read_callback_sees_the_whole_prompt_once():
    seen = []
    s, engine = scheduler(prefill_chunk=3)
    try:
        r = request(PROMPTS[2], max_tokens=4)
        r.snapshot = lambda backend, req: seen.append(backend.seq_snapshot(req.seq, req.call.ids).state)
        s.submit(r)
        outcome(r)
    finally:
        s.close()
    assert seen == [list(PROMPTS[2])]


def test_n_choices_fork_after_one_prefill():
    s, engine = scheduler(prefill_chunk=64)
    try:
        first = request(PROMPTS[3], max_tokens=5, temperature=1.0, seed=1)
        sib = request(PROMPTS[3], max_tokens=5, temperature=1.0, seed=2)
        sib.parent = first
        first.siblings = [sib]
        s.submit(first)
        outcome(first)
        outcome(sib)
    finally:
        s.close()
    prefill = [n for f in engine.log for _, _, n in f if n > 1]
    assert prefill == [len(PROMPTS[3])]  # one prefill for both choices
    assert len(first.tokens) == len(sib.tokens) == 5 and first.tokens != sib.tokens


def test_an_engine_fault_ends_its_forward_and_the_engine_goes_on():
    s, engine = scheduler()
    engine.gate = threading.Semaphore(0)
    try:
        rs = [request(p, max_tokens=6) for p in PROMPTS[:2]]
        for r in rs:
            s.submit(r)
        engine.fail_next = RuntimeError("device lost")
        engine.gate.release(1000)
        reason, _ = outcome(rs[0])  # the first forward is the first request's prefill
        assert reason.startswith("error") and "device lost" in reason
        assert outcome(rs[1])[0] == "length" and rs[1].tokens == alone(PROMPTS[1])[0]
        after = request(PROMPTS[4], max_tokens=6)
        s.submit(after)
        assert outcome(after)[0] == "length" and after.tokens == alone(PROMPTS[4])[0]
    finally:
        s.close()
    assert engine.seqs == {}


def test_close_cancels_what_runs_and_refuses_more():
    s, engine = scheduler()
    engine.gate = threading.Semaphore(0)
    r = request(PROMPTS[0], max_tokens=30)
    s.submit(r)
    admitted(r)
    s.close(wait=False)
    engine.gate.release(1000)
    assert outcome(r)[0] == "cancelled"
    with pytest.raises(PrefixEdgeError):
        s.submit(request(PROMPTS[1]))
    s.close()
    assert engine.closed and engine.seqs == {}


@pytest.mark.parametrize("fault", [RuntimeError("device lost"), PrefixEdgeError("llama_decode returned -3")],
                         ids=["bug", "engine-refusal"])
def test_an_engine_fault_is_an_engine_error(fault):
    """What the engine raises while running a request (a bug or its own refusal) reaches the
    caller as an EngineError: a server answers 500 for it, 400 for anything about the call."""
    from prefix_edge.errors import EngineError

    s, engine = scheduler()
    try:
        engine.fail_next = fault
        r = request(PROMPTS[0], max_tokens=4)
        s.submit(r)
        while True:
            kind, value = r.events.get(timeout=20)
            if kind in ("error", "done"):
                break
        assert kind == "error" and isinstance(value, EngineError), (kind, value)
        assert str(fault) in str(value)
    finally:
        s.close()
