"""TurnCache: the KV of conversations so far, so that turn k prefills only its new tokens.

When a chat request has read its whole prompt (task prefix + rendered conversation + the
generation prompt), the engine copies that sequence's KV out (`backend.seq_snapshot`) and puts
it here. The next turn's prompt starts with those very tokens (the history, then the reply and
the new user message), so it restores the snapshot and prefills only the rest.

Keys are token ids at *turn boundaries* (the ends of earlier turns' prompts), rooted at a task
(or the base model): a radix over conversations cut only where a turn can resume. A request
with cuts c1 < c2 < ... looks up ids[:c] for the largest c first. An entry also records the
cuts below its own end, and a hit needs the request's cuts below c to be the same: the cached
KV was then computed from the same tokens in the same prefill chunks as a run without the
cache (chunks never cross a cut), so a cached turn gives the tokens of an uncached one (on CPU
both engines also give bit-identical logits for other chunkings, measured; a GPU kernel may
not). The reply's own tokens are never taken from here: decoded one at a time, their KV differs
from a prefill of them (measured: final logits up to 0.6-0.9 apart), which the uncached run does.

Byte-budgeted, least recently used first out. An entry is a host copy: a running request
holds its own reference, so evicting never touches a request in flight.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .prefix import Prefix

DEFAULT_BYTES = 256 << 20


def turn_key(root: str, ids: np.ndarray, cuts: tuple[int, ...]) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    h.update(root.encode())
    h.update(np.asarray(cuts, np.int64).tobytes())
    h.update(b"|")
    h.update(np.ascontiguousarray(ids, np.int64).tobytes())
    return h.digest()


@dataclass
class TurnEntry:
    prefix: Prefix  # the KV of root prefix + ids[:n]
    n: int          # input tokens it covers (after the root's prefix)


class TurnCache:
    def __init__(self, budget_bytes: int = DEFAULT_BYTES):
        self.budget = max(0, int(budget_bytes))
        self._lru: OrderedDict[bytes, TurnEntry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = self.stored = 0

    def lookup(self, root: str, ids: np.ndarray, cuts: tuple[int, ...]) -> TurnEntry | None:
        """The entry for the longest ids[:c] (c a cut, c < len(ids)) with the same cuts below c."""
        if not self.budget:
            return None
        with self._lock:
            for i in range(len(cuts) - 1, -1, -1):
                c = cuts[i]
                if c >= len(ids):
                    continue
                k = turn_key(root, ids[:c], cuts[:i])
                e = self._lru.get(k)
                if e is not None:
                    self._lru.move_to_end(k)
                    self.hits += 1
                    return e
            self.misses += 1
            return None

    def get(self, root: str, ids: np.ndarray, cuts: tuple[int, ...]) -> TurnEntry | None:
        """The entry for exactly these ids (a conversation being saved), or None."""
        with self._lock:
            return self._lru.get(turn_key(root, ids, cuts))

    def put(self, root: str, ids: np.ndarray, cuts: tuple[int, ...], prefix: Prefix) -> bool:
        """Keep `prefix` (the KV after root + ids) for the turn after it; cuts: those below len(ids)."""
        if prefix.nbytes > self.budget:
            return False
        k = turn_key(root, ids, tuple(c for c in cuts if c < len(ids)))
        with self._lock:
            old = self._lru.pop(k, None)
            if old is not None:
                self._bytes -= old.prefix.nbytes
            self._lru[k] = TurnEntry(prefix, len(ids))
            self._bytes += prefix.nbytes
            self.stored += 1
            while self._bytes > self.budget and self._lru:
                _, e = self._lru.popitem(last=False)
                self._bytes -= e.prefix.nbytes
        return True

    def clear(self) -> None:
        with self._lock:
            self._lru.clear()
            self._bytes = 0

    def info(self) -> dict:
        with self._lock:
            return {"entries": len(self._lru), "bytes": self._bytes, "budget_bytes": self.budget,
                    "hits": self.hits, "misses": self.misses, "stored": self.stored}
