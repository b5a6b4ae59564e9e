"""Composed documents (`compose_documents=True`, opt-in: not exact): each document's KV is
computed once on its own and reused wherever, in whatever order, it comes again.

A composed request's prompt is pieces (documents.py `composed_pieces`): the head (the prompt up
to the first document), then per document its label (from the second on: the separator and
"[i] ") and its ids, then the tail (the rest: the question, the generation prompt). On the
engine thread, after the scheduler has restored the request's root (a task's prefix, or none):

1. the head is prefilled;
2. every document not in the document cache (cache/documents.py) is prefilled right after the
   head, alone, and its K and V kept (runtime/kv.py KvLayers): computed after the same context
   whatever the order, so a hit equals a miss;
3. back at the head's end, the documents are laid in their order: a document's first `k`
   tokens are prefilled where they now stand (they see every document before: EPIC's
   LegoLink, recomputing each chunk's attention-sink tokens), the rest of its KV is spliced
   in with its keys re-rotated to the new positions (runtime/kv.py); the first document sits
   where it was computed and is spliced as it is, so one document composes exactly;
4. the scheduler prefills the tail as any input and decodes.

Nothing composed enters the exact prompt cache. Driven one unit at a time (a forward of at most
a prefill chunk, or a splice) so other requests keep decoding between units.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cache.documents import DocumentKv
from .kv import KvLayers, Rope

DEFAULT_RECOMPUTE = 32  # k: each later document's first tokens prefilled in place


@dataclass
class Piece:
    label: np.ndarray  # ids before the document (the second on: separator and "[i] ")
    ids: np.ndarray    # the document's ids
    key: str           # its document-cache key


class Composition:
    def __init__(self, head: np.ndarray, docs: list[Piece], cache: DocumentKv, rope: Rope, k: int,
                 chunk: int):
        self.head, self.docs, self.cache, self.rope = head, docs, cache, rope
        self.k, self.chunk = int(k), int(chunk)
        self.computed = 0  # documents prefilled on their own for this request (cache misses)
        self.reused = 0    # tokens spliced in from the document cache (not prefilled here)
        self.done = False
        self._run = None

    @property
    def n_tokens(self) -> int:
        """Positions the composed part holds (head, labels, documents)."""
        return len(self.head) + sum(len(d.label) + len(d.ids) for d in self.docs)

    def advance(self, be, r) -> int:
        """Run the next unit on r's sequence (a forward, or a splice); the tokens it forwarded.
        `done` once the documents are in place (the scheduler then prefills r.ids)."""
        if self._run is None:
            self._run = self._steps(be, r)
        for n in self._run:
            if n:
                return n
        self.done = True
        return 0

    def _prefill(self, be, r, ids: np.ndarray):
        for s in range(0, len(ids), self.chunk):
            part = np.ascontiguousarray(ids[s:s + self.chunk], np.int64)
            be.forward([(r.seq, r.pos, part)])
            r.pos += len(part)
            yield len(part)

    def _state(self, be, r):
        return be.seq_snapshot(r.seq, np.zeros(r.pos, np.int64))

    def _steps(self, be, r):
        yield from self._prefill(be, r, self.head)
        at = r.pos  # where every document is computed on its own
        head = self._state(be, r)
        kvs: list[KvLayers] = []
        hits: list[bool] = []
        for d in self.docs:
            kv = self.cache.get(d.key)
            hits.append(kv is not None)
            if kv is None:
                be.seq_restore(r.seq, head)
                r.pos = at
                yield from self._prefill(be, r, d.ids)
                kv = be.kv_of(self._state(be, r)).span(at)
                self.cache.put(d.key, kv)
                self.computed += 1
            kvs.append(kv)
            yield 0
        be.seq_restore(r.seq, head)
        r.pos = at
        for i, (d, kv) in enumerate(zip(self.docs, kvs)):
            yield from self._prefill(be, r, d.label)
            j = 0 if i == 0 else min(self.k, len(d.ids))
            self.reused += (len(d.ids) - j) if hits[i] else 0
            yield from self._prefill(be, r, d.ids[:j])
            if j < len(d.ids):
                whole = be.kv_of(self._state(be, r)).then(kv.span(j).shifted(r.pos - (at + j), self.rope,
                                                                             be.rope_layout))
                be.seq_restore(r.seq, be.prefix_of(whole, np.zeros(whole.n, np.int64)))
                r.pos = whole.n
            yield 0
