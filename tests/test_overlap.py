"""runtime/engines/overlap.py: the work beside an engine's native load runs once, on the opening thread,
while the load runs on another; errors of either surface as they would without the overlap."""

from __future__ import annotations

import threading

import pytest

from prefix_edge.runtime.engines.overlap import beside, native_load

pytestmark = pytest.mark.unit
WAIT = 60  # seconds a barrier waits for the other side: a hang guard, far beyond any machine's load


def test_work_runs_once_on_the_opening_thread_while_the_load_runs():
    """Overlap is shown by order, not by time: the load and the work each wait, inside their
    call, until the other has started (a barrier), and record when they start and end. Run one
    after the other, they could not both pass the barrier (it breaks after WAIT seconds)."""
    me = threading.get_ident()
    seen, events = {}, []
    both_inside = threading.Barrier(2, timeout=WAIT)

    def load():
        seen["load"] = threading.get_ident()
        events.append("load starts")
        both_inside.wait()  # returns only while the work runs too
        events.append("load ends")
        return "model"

    def work():
        seen["work"] = threading.get_ident()
        seen["calls"] = seen.get("calls", 0) + 1
        events.append("work starts")
        both_inside.wait()
        events.append("work ends")
        return "tokenizer"

    with beside(work) as pending:
        assert native_load(load) == "model"
        assert native_load(lambda: "second") == "second"  # a later load: the work is done
    assert pending.result() == "tokenizer"
    assert seen["work"] == me and seen["load"] != me and seen["calls"] == 1
    assert not both_inside.broken
    assert sorted(events[:2]) == ["load starts", "work starts"]  # both started before either ended
    assert sorted(events[2:]) == ["load ends", "work ends"]


def test_work_without_a_native_load_runs_at_result():
    ran = []
    with beside(lambda: ran.append(threading.get_ident()) or 7) as pending:
        assert ran == []
    assert pending.result() == 7 and pending.result() == 7 and ran == [threading.get_ident()]


def test_a_failing_load_raises_and_the_work_still_completes():
    ran = []

    def load():
        raise ValueError("not a GGUF file")

    with pytest.raises(ValueError, match="not a GGUF"):
        with beside(lambda: ran.append(1) or "tok"):
            native_load(load)
    assert ran == [1]  # joined, not left running on another thread


def test_a_failing_work_raises_at_result_and_the_load_is_kept():
    def work():
        raise RuntimeError("tokenizer.json: expected value")

    with beside(work) as pending:
        assert native_load(lambda: "model") == "model"
    with pytest.raises(RuntimeError, match="expected value"):
        pending.result()


def test_no_work_pending_outside_the_block_or_on_another_thread():
    calls = []
    with beside(lambda: calls.append("outer")) as outer:
        other = []
        t = threading.Thread(target=lambda: other.append(native_load(lambda: threading.get_ident())))
        t.start()
        t.join()
        assert calls == []  # another thread's load does not take this thread's work
        with beside(lambda: calls.append("inner")) as inner:
            native_load(lambda: None)
        assert calls == ["inner"]
        native_load(lambda: None)
        assert calls == ["inner", "outer"]
    native_load(lambda: None)
    assert calls == ["inner", "outer"] and inner.result() is None and outer.result() is None

