"""The step as data: what one scheduler step runs, planned before anything runs.

A step is a list of `Forward`s, each a tuple of work items that go into ONE engine forward, and
`Compose` units, run first:

- `Decode`: a decoding request's next token (one position's logits back, sampled);
- `Verify`: that token and a draft after it (drafting.py): its last rows' logits back, each
  sampled in turn and the draft kept as far as they agree;
- `Prefill`: a chunk of a request's input (`last`: the chunk that ends it, whose logits give
  the first token);
- `Compose`: the next unit of a request's composed documents (compose.py; it runs the engine
  itself: a forward of at most one chunk, or a splice), counted as a chunk of the step's budget.

`plan` makes the step from the active requests (decoding ones first, in sequence order; then
compositions; then one prefill chunk per reading request, never cut by the budget); the loop
(loop.py) runs it, compositions first, then the forwards, dispatching on each item's type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import numpy as np

from ..cache.prompts import chunk_end
from .request import Request


@dataclass(frozen=True, eq=False)
class Decode:
    r: Request
    token: int

    @property
    def item(self) -> tuple:
        return (self.r.seq, self.r.pos, np.array([self.token], np.int64))

    n = 1


@dataclass(frozen=True, eq=False)
class Verify:
    r: Request
    token: int
    draft: tuple[int, ...]

    @property
    def ids(self) -> np.ndarray:
        return np.array([self.token, *self.draft], np.int64)

    @property
    def item(self) -> tuple:
        return (self.r.seq, self.r.pos, self.ids, 1 + len(self.draft))

    @property
    def n(self) -> int:
        return 1 + len(self.draft)


@dataclass(frozen=True, eq=False)
class Prefill:
    r: Request
    start: int   # input position of the chunk's first token
    n: int
    last: bool   # it ends the input: its logits give the first token

    @property
    def item(self) -> tuple:
        return (self.r.seq, self.r.pos, self.r.call.ids[self.start:self.start + self.n])


@dataclass(frozen=True, eq=False)
class Compose:
    r: Request


Work = Union[Decode, Verify, Prefill]
Forward = tuple  # of Work: the items of one engine forward


@dataclass(frozen=True)
class Step:
    compose: tuple  # Compose units, run first
    decode: tuple   # Forwards of decoding requests (timed: drafting.RowCost)
    prefill: tuple  # Forwards of one Prefill each, run last

    @property
    def empty(self) -> bool:
        return not (self.decode or self.compose or self.prefill)


def plan(active: list[Request], budget: int, chunk: int, batches: bool,
         draft: Callable[[Request, int], list[int] | None]) -> Step:
    """One step over `active`: every decoding request's next token (with its draft, where
    `draft(r, room)` gives one; a draft never takes another request's turn), in sequence order,
    in one forward (one each where the engine does not batch sequences alike: `batches`
    False); then compositions; then a prefill chunk (chunks of `chunk` from the input's start,
    ended at its cuts) per request still reading its input while the `budget` of tokens lasts,
    so each request sees the same kernel shapes as in its lone run."""
    decode: list = []
    waiting = sum(r.next_token is not None for r in active)
    for r in sorted(active, key=lambda r: r.seq):
        if r.next_token is not None and budget >= 1:
            budget, waiting = budget - 1, waiting - 1
            d = draft(r, budget - waiting)
            if d is None:
                decode.append(Decode(r, r.next_token))
            else:
                decode.append(Verify(r, r.next_token, tuple(d)))
                budget -= len(d)
    forwards = ((tuple(decode),) if batches else tuple((w,) for w in decode)) if decode else ()
    composing = []
    for r in active:
        if r.compose is not None and not r.compose.done and budget >= chunk:
            composing.append(Compose(r))
            budget -= chunk
    prefill = []
    for r in active:
        if r.next_token is None and r.fed < len(r.call.ids) and (r.compose is None or r.compose.done):
            n = chunk_end(r.fed, len(r.call.ids), r.call.cuts, chunk) - r.fed
            if n > budget:
                break
            prefill.append((Prefill(r, r.fed, n, r.fed + n == len(r.call.ids)),))
            budget -= n
    return Step(tuple(composing), forwards, tuple(prefill))
