"""HostBudget: one byte budget over the runtime's host caches, least recently used out first
across all of them.

The prompt cache (prompts.py: states of prompts already read) and the document cache
(documents.py: documents' KV and composed states) each keep their own cap (`prompt_cache_bytes`,
`document_cache_bytes`; 0 turns one off), and together they stay within this budget
(`cache_bytes`, DEFAULT_BYTES: sized for a laptop; `prefix-edge serve --cache MIB`). When an
entry comes in and the two together hold more, the entry used longest ago, in either cache, goes
(a cache may name a victim it prefers: the document cache's composed states before documents).
Every entry carries a stamp from one clock (`tick`), renewed at each use. An evicted entry is
only the cache's reference: a request that holds it keeps it until it ends, so nothing is
evicted under a request in flight.

A member is any object with `bytes` (what it holds now), `victim()` (the stamp of the entry it
would give up, or None when empty) and `evict()` (drop that entry); it calls `settle()` after
storing, outside its own lock (settle takes the members' locks one at a time).
"""

from __future__ import annotations

import itertools
import threading

DEFAULT_BYTES = 512 << 20


class HostBudget:
    def __init__(self, budget_bytes: int = DEFAULT_BYTES):
        self.budget = max(0, int(budget_bytes))
        self._members: list = []
        self._clock = itertools.count(1)
        self._lock = threading.Lock()
        self.evictions = 0

    def tick(self) -> int:
        """A use stamp: later uses get larger ones (itertools.count is atomic under the GIL)."""
        return next(self._clock)

    def join(self, member) -> None:
        self._members.append(member)

    @property
    def bytes(self) -> int:
        return sum(m.bytes for m in self._members)

    def settle(self) -> int:
        """Evict, least recently used first across the members, until they fit; returns how many."""
        n = 0
        with self._lock:
            while self.bytes > self.budget:
                stamps = [(s, i) for i, m in enumerate(self._members) if (s := m.victim()) is not None]
                if not stamps:
                    break
                self._members[min(stamps)[1]].evict()
                n += 1
            self.evictions += n
        return n

    def info(self) -> dict:
        return {"bytes": self.bytes, "budget_bytes": self.budget, "evictions": self.evictions}
