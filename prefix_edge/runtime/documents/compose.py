"""Composed documents (`compose_documents=True`, opt-in: not exact): each document's KV is
computed once on its own and reused wherever, in whatever order, it comes again.

A composed request's prompt is pieces (block.py `composed_pieces`): the head (the prompt up
to the first document), then per document its label (from the second on: the separator and
"[i] ") and its ids, then the tail (the rest: the question, the generation prompt). On the
engine thread, after the scheduler has restored the request's root (a task's prefix, or none):

1. the head is prefilled;
2. every document not in the document cache (cache/documents.py) is prefilled right after the
   head, alone, and its K and V kept (runtime/engines/kv.py KvLayers): computed after the same context
   whatever the order, so a hit equals a miss;
3. back at the head's end, the documents are laid in their order: a document's first `k`
   tokens are prefilled where they now stand (they see every document before: EPIC's
   LegoLink, recomputing each chunk's attention-sink tokens), the rest of its KV is spliced
   in with its keys re-rotated to the new positions (runtime/engines/kv.py); the first document sits
   where it was computed and is spliced as it is, so one document composes exactly;
4. the scheduler prefills the tail as any input and decodes.

After the first token the request's state is kept (`Composed`, in the same cache, keyed by
everything the composed part is a function of): the same documents in the same order again
restore it instead of composing (a hit equals a miss: the same KV, the tail prefilled in the same
chunks). Nothing composed enters the exact prompt cache. Driven one unit at a time (a forward of at most
a prefill chunk, or a splice) so other requests keep decoding between units.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cache.documents import DocumentKv, document_key
from ..engines.kv import KvLayers, Rope

@dataclass
class Piece:
    label: np.ndarray  # ids between the previous document and this one (the second on: "\n\n[i]")
    ids: np.ndarray    # the document's ids
    key: str           # its document-cache key


@dataclass
class Composed:
    """A composed request's whole state once read (its sequence's snapshot, taken after its
    first token, as the prompt cache takes one) and where its composed part ends: the same
    documents in the same order again restore its first `n` positions instead of composing."""

    prefix: object  # the engine's Prefix
    n: int

    @property
    def nbytes(self) -> int:
        return self.prefix.nbytes


def composition_key(root: str, head: np.ndarray, docs: list[Piece], k: int) -> str:
    """What a composed part is a function of: the root, the head, each label and document, k."""
    return document_key(f"composed:{k}:{root}", head,
                        np.concatenate([np.concatenate([d.label, [-1], d.ids, [-2]]) for d in docs]))


class Composition:
    def __init__(self, head: np.ndarray, docs: list[Piece], cache: DocumentKv, rope: Rope, k: int,
                 chunk: int, key: str):
        self.head, self.docs, self.cache, self.rope = head, docs, cache, rope
        self.k, self.chunk, self.key = int(k), int(chunk), key
        self.end = -1      # the position after the composed part, once composed
        self.restored = False  # the whole composed part came from the cache (a Composed)
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
        `done` once the documents are in place (the scheduler then prefills r.call.ids)."""
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

    def keep(self, be, r) -> None:
        """After r's first token (its whole input read, nothing decoded yet): its state kept for
        the same composition again (engine thread; the scheduler's snapshot hook)."""
        if not self.restored and self.end > 0:
            self.cache.put(self.key, Composed(be.seq_snapshot(r.seq, np.zeros(r.pos, np.int64)), self.end))

    def _steps(self, be, r):
        room = r.pos + self.n_tokens + len(r.call.ids) + 64
        got = self.cache.get(self.key)
        if isinstance(got, Composed):  # the same documents in the same order: as composed before
            self.reused = got.n - r.pos
            r.pos = self.end = be.seq_restore(r.seq, got.prefix, got.n)
            self.restored = True
            be.seq_reserve(r.seq, room)
            return
        be.seq_reserve(r.seq, room)
        yield from self._prefill(be, r, self.head)
        at = r.pos  # where every document is computed on its own
        kvs: list[KvLayers] = []
        hits: list[bool] = []
        for d in self.docs:
            kv = self.cache.get(d.key)
            hits.append(kv is not None)
            if kv is None:
                be.seq_truncate(r.seq, at)
                r.pos = at
                yield from self._prefill(be, r, d.ids)
                kv = be.kv_of(be.seq_snapshot(r.seq, np.zeros(r.pos, np.int64))).span(at)
                self.cache.put(d.key, kv)
                self.computed += 1
            kvs.append(kv)
            yield 0
        be.seq_truncate(r.seq, at)
        r.pos = at
        for i, (d, kv) in enumerate(zip(self.docs, kvs)):
            yield from self._prefill(be, r, d.label)
            j = 0 if i == 0 else min(self.k, len(d.ids))
            self.reused += (len(d.ids) - j) if hits[i] else 0
            yield from self._prefill(be, r, d.ids[:j])
            if j < len(d.ids):
                r.pos = be.seq_extend(r.seq, kv.span(j, copy=False).shifted(r.pos - (at + j), self.rope, be.rope_layout))
            yield 0
        self.end = r.pos
