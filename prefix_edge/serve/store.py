"""Stored responses (`POST /v1/responses` with `store`, the default): each kept as JSON bytes,
so nothing a later request does can change one (every read decodes a fresh copy), within a
count and a byte budget, the oldest dropped first."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

MAX_STORED = 256           # responses kept
STORED_BYTES = 64 << 20    # bytes of JSON they may hold together


def frozen(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


class StoredResponses:
    """id -> (the response object, the conversation it continues: the messages a chain from it
    starts with). A mapping as serve/responses.py uses it (`in`, `[]`, get, `[] =`, pop,
    popitem, len); `raw(id)` is the response's JSON as it was stored. A response larger than
    the whole budget is not kept. Thread-safe (parses run in worker threads)."""

    def __init__(self, count: int = MAX_STORED, budget_bytes: int = STORED_BYTES):
        self.count, self.budget = max(0, int(count)), max(0, int(budget_bytes))
        self._items: OrderedDict[str, tuple[bytes, bytes]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = self.evicted = self.refused = 0

    def __setitem__(self, rid: str, entry: tuple) -> None:
        blobs = (frozen(entry[0]), frozen(entry[1]))
        size = len(blobs[0]) + len(blobs[1])
        with self._lock:
            self._drop(rid)
            if size > self.budget or not self.count:
                self.refused += 1
                return
            self._items[rid] = blobs
            self.bytes += size
            while len(self._items) > self.count or self.bytes > self.budget:
                self._drop(next(iter(self._items)))
                self.evicted += 1

    def _drop(self, rid: str) -> bool:
        old = self._items.pop(rid, None)
        if old is not None:
            self.bytes -= len(old[0]) + len(old[1])
        return old is not None

    def __contains__(self, rid) -> bool:
        return isinstance(rid, str) and rid in self._items

    def __len__(self) -> int:
        return len(self._items)

    def raw(self, rid: str) -> bytes | None:
        got = self._items.get(rid) if isinstance(rid, str) else None
        return None if got is None else got[0]

    def get(self, rid, default=None):
        got = self._items.get(rid) if isinstance(rid, str) else None
        return default if got is None else (json.loads(got[0]), json.loads(got[1]))

    def __getitem__(self, rid):
        got = self.get(rid)
        if got is None:
            raise KeyError(rid)
        return got

    def pop(self, rid, default=None):
        with self._lock:
            got = self._items.get(rid) if isinstance(rid, str) else None
            if got is None:
                return default
            self._drop(rid)
        return json.loads(got[0]), json.loads(got[1])

    def popitem(self, last: bool = True):
        with self._lock:
            rid = next(reversed(self._items)) if last else next(iter(self._items))
            got = self._items[rid]
            self._drop(rid)
        return rid, (json.loads(got[0]), json.loads(got[1]))

    def info(self) -> dict:
        return {"count": len(self._items), "max_count": self.count, "bytes": self.bytes,
                "budget_bytes": self.budget, "evicted": self.evicted, "refused": self.refused}
