"""DocumentKv: documents' KV computed once on their own, for composed requests (compose.py).

An entry is one document's K and V (runtime/engines/kv.py KvLayers) as computed right after the
context every document of a request shares (the root: a task's prefix or none, then the
prompt up to the first document), at the positions that follow that context. Its key is a
hash of the root, that context's ids and the document's ids: the same document under another
system prompt is another entry. A request that holds an entry keeps it alive while it runs
(evicting drops only the cache's reference), so nothing is evicted under a request in flight.

Beside them, composed requests' whole states (compose.py `Composed`: the same documents in the
same order again restore one instead of composing), under the same budget.

Byte-budgeted (DEFAULT_BYTES; `document_cache_bytes`, 0: off), composed states out before
documents, least recently used first,
counted in `info()` (and `/metrics` through the runtime's stats).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections import OrderedDict

import numpy as np

from ..engines.kv import KvLayers

DEFAULT_BYTES = 512 << 20  # as the prompt cache's (cache/prompts.py)


def document_key(root: str, context: np.ndarray, doc: np.ndarray) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(root.encode())
    for part in (context, doc):
        a = np.ascontiguousarray(part, np.int64)
        h.update(len(a).to_bytes(8, "little"))
        h.update(a.tobytes())
    return h.hexdigest()


class DocumentKv:
    def __init__(self, budget_bytes: int = DEFAULT_BYTES, shared=None):
        self.budget = int(budget_bytes)
        self.shared = shared  # the runtime's one host budget (budget.py), if any: its member
        self._tick = shared.tick if shared is not None else itertools.count(1).__next__
        if shared is not None:
            shared.join(self)
        self._entries: OrderedDict[str, KvLayers] = OrderedDict()
        self._stamps: dict[str, int] = {}  # key -> last use (the host budget's clock)
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0

    def get(self, key: str):
        with self._lock:
            kv = self._entries.get(key)
            if kv is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self._stamps[key] = self._tick()
            self.hits += 1
            return kv

    def put(self, key: str, kv) -> None:  # KvLayers, or compose.Composed (anything with nbytes)
        size = kv.nbytes
        if size > min(self.budget, self.shared.budget if self.shared is not None else self.budget):
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes
            while self._entries and self.bytes + size > self.budget:
                self._evict()
            self._entries[key] = kv
            self._stamps[key] = self._tick()
            self.bytes += size
        if self.shared is not None:
            self.shared.settle()

    def _victim(self) -> str:
        """Composed states go first (least recently used of them): a document's KV serves every
        order it comes in, a state only its own (under the lock, entries not empty)."""
        return next((k for k, v in self._entries.items() if not isinstance(v, KvLayers)), next(iter(self._entries)))

    def _evict(self) -> None:
        victim = self._victim()
        self.bytes -= self._entries.pop(victim).nbytes
        del self._stamps[victim]
        self.evictions += 1

    # -- the host budget's member calls (budget.py) ---------------------------------------
    def victim(self) -> int | None:
        with self._lock:
            return self._stamps[self._victim()] if self._entries else None

    def evict(self) -> None:
        with self._lock:
            if self._entries:
                self._evict()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._stamps.clear()
            self.bytes = 0

    def info(self) -> dict:
        with self._lock:
            docs = sum(isinstance(v, KvLayers) for v in self._entries.values())
            return {"entries": len(self._entries), "documents": docs, "composed_states": len(self._entries) - docs,
                    "bytes": self.bytes, "budget_bytes": self.budget,
                    "hits": self.hits, "misses": self.misses, "evictions": self.evictions}
