"""The scheduler's unit tier's pieces, shared by tests/test_scheduler.py and
tests/test_speculative.py: a request of token ids on the fake engine's tokenizer, a scheduler
over a fake engine, and a request's outcome once it has ended."""

from __future__ import annotations

import numpy as np

from prefix_edge.runtime.engines.prefix import Prefix
from prefix_edge.runtime.scheduler import Call, Request, Scheduler
from prefix_edge.runtime.decode.sampling import Sampler
from prefix_edge.runtime.decode.text import TextStream

from .fake_engine import EOS, FakeEngine, tokenizer

TOK = tokenizer()
SLOTS = 4


CALL_FIELDS = ("speculative", "logprobs", "prefix_keep", "background")


def request(ids, max_tokens: int = 6, prefix: Prefix | None = None, key: str | None = None,
            cuts=(), stops=(), **kw) -> Request:
    """A request of `ids` (after `prefix`, resident under `key`); kw: the Call's own fields
    (CALL_FIELDS), the rest the Sampler's."""
    call = {k: kw.pop(k) for k in CALL_FIELDS if k in kw}
    return Request(Call("t", key, prefix, np.asarray(ids, np.int64), max_tokens, frozenset({EOS}),
                        cuts=tuple(cuts), **call), Sampler(**kw), TextStream(TOK, list(stops)))


def scheduler(engine: FakeEngine | None = None, slots: int = SLOTS, **kw) -> tuple[Scheduler, FakeEngine]:
    engine = engine or FakeEngine()
    return Scheduler(engine, slots=slots, request_seqs=tuple(range(slots)), **kw), engine


def outcome(r: Request, timeout: float = 20.0) -> tuple[str, str]:
    """(finish reason, or 'error: ...'; the text) once r has ended."""
    text = []
    while True:
        kind, value = r.events.get(timeout=timeout)
        if kind == "text":
            text.append(value)
        elif kind == "done":
            return value, "".join(text)
        else:
            return f"error: {value}", "".join(text)
