"""DocumentKv: documents' KV computed once on their own, for composed requests (compose.py).

An entry is one document's K and V (runtime/kv.py KvLayers) as computed right after the
context every document of a request shares (the root: a task's prefix or none, then the
prompt up to the first document), at the positions that follow that context. Its key is a
hash of the root, that context's ids and the document's ids: the same document under another
system prompt is another entry. A request that holds an entry keeps it alive while it runs
(evicting drops only the cache's reference), so nothing is evicted under a request in flight.

Byte-budgeted (DEFAULT_BYTES; `document_cache_bytes`, 0: off), least recently used out first,
counted in `info()` (and `/metrics` through the runtime's stats).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import numpy as np

from ..kv import KvLayers

DEFAULT_BYTES = 256 << 20


def document_key(root: str, context: np.ndarray, doc: np.ndarray) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(root.encode())
    for part in (context, doc):
        a = np.ascontiguousarray(part, np.int64)
        h.update(len(a).to_bytes(8, "little"))
        h.update(a.tobytes())
    return h.hexdigest()


class DocumentKv:
    def __init__(self, budget_bytes: int = DEFAULT_BYTES):
        self.budget = int(budget_bytes)
        self._entries: OrderedDict[str, KvLayers] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0

    def get(self, key: str) -> KvLayers | None:
        with self._lock:
            kv = self._entries.get(key)
            if kv is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return kv

    def put(self, key: str, kv: KvLayers) -> None:
        size = kv.nbytes
        if size > self.budget:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes
            while self._entries and self.bytes + size > self.budget:
                _, gone = self._entries.popitem(last=False)
                self.bytes -= gone.nbytes
                self.evictions += 1
            self._entries[key] = kv
            self.bytes += size

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    def info(self) -> dict:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self.bytes, "budget_bytes": self.budget,
                    "hits": self.hits, "misses": self.misses, "evictions": self.evictions}
