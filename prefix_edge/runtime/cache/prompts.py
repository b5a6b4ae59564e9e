"""PromptCache: the KV of prompts already read, reused by the longest exact prefix.

When a request has read its whole prompt (a task's baked prefix, or none for the base model,
then its input ids), the engine copies that sequence's KV out (`engine.seq_snapshot`) and puts
it here. A later request whose ids start with the same tokens restores that snapshot, keeps
its first positions (`engine.seq_restore(seq, prefix, keep)`) and prefills only the rest: the
same documents with a new question, a long system prompt every client resends, the next turn
of a conversation (its prompt starts with the last turn's).

Exact by construction. A run prefills its input in *chunks*: `prefill_chunk` tokens from the
input's start, never crossing a *cut* (the end of a message, of an earlier turn's prompt).
`chunk_ends` spells that rule once; the scheduler chunks by it and this cache keys by it: the
key of a boundary b is a chain hash over the chunks before it (each chunk's ids with its
length), rooted at the task (or the base model). A hit at b therefore holds KV computed from
the same tokens in the same chunks as a run without the cache, and the rest of the request
is prefilled from b in the chunks that run would use: a hit gives the tokens of a miss. Only
prompts' KV enters: a reply's own tokens, decoded one at a time, have KV that differs from a
prefill of them (measured: final logits up to 0.6-0.9 apart), which an uncached run does.

Where an engine cannot keep only the first positions of a restored state (llama.cpp's
sliding-window and recurrent layers hold only their last cells), a hit must cover a whole
entry. Entries whose every boundary is also a boundary of a newer entry of the same chain
(a conversation's earlier turn) are dropped when that newer one comes in.

Byte-budgeted, least recently used first out. An entry is a host copy that a running request
holds a reference to: evicting never touches a request in flight.

Optionally persistent (`files`, prompt_files.py): a prompt start that keeps being hit is
written to disk in the background, and a lookup that misses memory but matches a file loads it
(checked through) and keeps it here; the file stays.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..engines.prefix import Prefix

DEFAULT_BYTES = 512 << 20
MIN_TEXT_TOKENS = 64  # a text input shorter than this is not kept (its KV costs more than it saves)


def chunk_end(fed: int, n: int, cuts: tuple[int, ...], chunk: int) -> int:
    """Where the prefill chunk starting at `fed` (of `n` input ids) ends."""
    end = min(n, fed + chunk)
    for c in cuts:
        if fed < c < end:
            return c
    return end


def chunk_ends(n: int, cuts: tuple[int, ...], chunk: int) -> list[int]:
    """Every chunk end of a prefill of `n` ids (the last is n)."""
    out, fed = [], 0
    while fed < n:
        fed = chunk_end(fed, n, cuts, chunk)
        out.append(fed)
    return out


def chain(root: str, ids: np.ndarray, cuts: tuple[int, ...], chunk: int) -> list[tuple[int, bytes]]:
    """(boundary, key) for every chunk end of a prefill of `ids`."""
    h = hashlib.blake2b(root.encode(), digest_size=20)
    ids = np.ascontiguousarray(ids, np.int64)
    out, at = [], 0
    for end in chunk_ends(len(ids), cuts, chunk):
        h.update((end - at).to_bytes(4, "little"))
        h.update(ids[at:end].tobytes())
        out.append((end, h.copy().digest()))
        at = end
    return out


@dataclass
class Hit:
    prefix: Prefix   # the snapshot: root prefix + ids[:n] of the request that made it
    n: int           # input tokens of this request it covers (keep prefix positions up to n)
    keep: int        # positions to keep of the snapshot (root prefix + n)


@dataclass
class _Entry:
    prefix: Prefix
    n: int                                   # input tokens it covers (after the root)
    keys: list[bytes] = field(default_factory=list)  # its boundaries' keys, last = its end
    root: str = ""
    cuts: tuple[int, ...] = ()
    stamp: int = 0                           # its last use (the host budget's clock)


class PromptCache:
    def __init__(self, budget_bytes: int = DEFAULT_BYTES, chunk: int = 128, partial: bool = True,
                 shared=None):
        self.budget = max(0, int(budget_bytes))
        self.shared = shared  # the runtime's one host budget (budget.py), if any: its member
        self._tick = shared.tick if shared is not None else itertools.count(1).__next__
        if shared is not None:
            shared.join(self)
        self.chunk = max(1, int(chunk))
        self.partial = partial  # the engine keeps a restored state's first positions
        self._lru: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[bytes, list[int]] = {}  # boundary key -> entries holding it (newest last)
        self._ids = itertools.count()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = self.stored = self.evicted = 0
        self.hit_tokens = 0
        self.files: Any = None  # the persistent tier (prompt_files.PromptFiles), if any

    # -- reading -------------------------------------------------------------------------
    def lookup(self, root: str, ids: np.ndarray, cuts: tuple[int, ...], n_root: int,
               counted: bool = True) -> Hit | None:
        """The longest reusable start of `ids` (a chunk end below len(ids)), or None. n_root:
        the positions before ids (the task's prefix). Memory first, then the files (if any)
        for a longer one. counted: in the hit and miss counters, and the disk tier's (a reply
        read ahead in the background is not: the counters are the calls')."""
        if not self.budget or len(ids) < 2:
            return None
        # at least one token is left to prefill (its logits)
        links = [(end, key) for end, key in chain(root, ids, cuts, self.chunk) if end < len(ids)]
        files, loaded = self.files, None
        if files is not None:
            with self._lock:
                found = self._find(links)
            if files.best(links, found[1] if found else 0, self.partial) is not None:
                loaded = self._load(files, root, links, n_root)
        with self._lock:
            found = self._find(links)
            if loaded is not None and (found is None or found[1] < loaded[0]):
                end, prefix = loaded  # read from a file, not kept in memory (over the budget)
                key, write = None, None
            elif found is None:
                self.misses += counted
                return None
            else:
                eid, end, key = found
                e = self._lru[eid]
                self._lru.move_to_end(eid)
                e.stamp = self._tick()
                prefix, write = e.prefix, (e.root, e.prefix.ids[len(e.prefix.ids) - e.n:], e.cuts, e.prefix)
            if counted:
                self.hits += 1
                self.hit_tokens += end
        if counted and files is not None and key is not None and files.hit(key, end):
            files.write(*write)
        return Hit(prefix, end, n_root + end)

    def _find(self, links: list) -> tuple[int, int, bytes] | None:
        """(entry, chunk end, key) of the longest of `links` an entry serves (under the lock)."""
        for end, key in reversed(links):
            for eid in reversed(self._index.get(key, ())):
                e = self._lru[eid]
                if e.n == end or (self.partial and e.n > end):
                    return eid, end, key
        return None

    def _load(self, files, root: str, links: list, n_root: int) -> tuple[int, Any] | None:
        """The longest start a file holds beyond what memory holds, read and kept in memory:
        (chunk end, Prefix), or None. A refused file is gone; the next one is tried."""
        with files.loading:  # one load at a time: a second request for it then finds it here
            while True:
                with self._lock:
                    found = self._find(links)
                best = files.best(links, found[1] if found else 0, self.partial)
                if best is None:
                    return None
                rec, end = best
                got = files.load(rec, root, n_root)
                if got is not None:
                    ids, cuts, prefix = got
                    self.put(root, ids, cuts, prefix)  # a copy: the file stays
                    return end, prefix

    def get(self, root: str, ids: np.ndarray, cuts: tuple[int, ...]) -> "_Entry | None":
        """The entry of exactly these ids (a conversation being saved), or None."""
        links = chain(root, ids, cuts, self.chunk)
        if not links:
            return None
        with self._lock:
            for eid in reversed(self._index.get(links[-1][1], ())):
                e = self._lru[eid]
                if e.n == len(ids):
                    return e
        return None

    # -- writing -------------------------------------------------------------------------
    def wants(self, n_ids: int, chat: bool) -> bool:
        """Whether a prompt of n_ids input ids is worth keeping (a conversation's always is:
        its next turn starts with it)."""
        return self.budget > 0 and (chat or n_ids >= MIN_TEXT_TOKENS)

    def put(self, root: str, ids: np.ndarray, cuts: tuple[int, ...], prefix: Prefix) -> bool:
        """Keep `prefix` (the KV after root + ids, as a prompt's read left it)."""
        if prefix.nbytes > min(self.budget, self.shared.budget if self.shared is not None else self.budget) \
                or len(ids) == 0:
            return False
        keys = [k for _, k in chain(root, ids, cuts, self.chunk)]
        with self._lock:
            if any(self._lru[e].n == len(ids) for e in self._index.get(keys[-1], ())):
                return True  # the same prompt again: its KV is here
            mine = set(keys)
            if self.partial:  # older entries ending at one of my boundaries serve nothing more
                for eid in {e for k in keys for e in self._index.get(k, ())}:
                    if self._lru[eid].keys[-1] in mine:
                        self._drop(eid)
            eid = next(self._ids)
            self._lru[eid] = _Entry(prefix, len(ids), keys, root, tuple(cuts), self._tick())
            for k in keys:
                self._index.setdefault(k, []).append(eid)
            self._bytes += prefix.nbytes
            self.stored += 1
            while self._bytes > self.budget and self._lru:
                self._drop(next(iter(self._lru)))
                self.evicted += 1
        if self.shared is not None:
            self.shared.settle()
        return True

    # -- the host budget's member calls (budget.py) ---------------------------------------
    @property
    def bytes(self) -> int:
        return self._bytes

    def victim(self) -> int | None:
        """The stamp of the entry used longest ago, or None."""
        with self._lock:
            return self._lru[next(iter(self._lru))].stamp if self._lru else None

    def evict(self) -> None:
        with self._lock:
            if self._lru:
                self._drop(next(iter(self._lru)))
                self.evicted += 1

    def _drop(self, eid: int) -> None:
        e = self._lru.pop(eid)
        self._bytes -= e.prefix.nbytes
        for k in e.keys:
            held = self._index.get(k)
            if held is not None:
                held.remove(eid)
                if not held:
                    del self._index[k]

    def clear(self) -> None:
        with self._lock:
            self._lru.clear()
            self._index.clear()
            self._bytes = 0

    def close(self) -> None:
        """Finish the file writes asked for (if any), then drop every entry."""
        if self.files is not None:
            self.files.close()
        self.clear()

    def info(self) -> dict:
        with self._lock:
            out = {"entries": len(self._lru), "bytes": self._bytes, "budget_bytes": self.budget,
                   "hits": self.hits, "misses": self.misses, "hit_tokens": self.hit_tokens,
                   "stored": self.stored, "evicted": self.evicted, "chunk": self.chunk}
        if self.files is not None:
            out.update(self.files.info())
        return out


def cache_root(task: str | None, scope: str = "", info=None) -> str:
    """What the prompt and document caches' keys are rooted at: the task (or the base model)
    with its prefix's digest where its manifest entry has one (TaskInfo.prefix_sha256: a task
    made again under its name with another prefix shares no entry with the old one), and the
    scope's digest where there is one (cache/prompt_files.py reads the task back)."""
    root = "base" if task is None else f"task:{task}"
    if task is not None and info is not None and info.prefix_sha256:
        root += f"#{info.prefix_sha256[:16]}"
    if not scope:
        return root
    import hashlib

    return f"{root}|scope:{hashlib.blake2b(scope.encode('utf-8', 'surrogatepass'), digest_size=16).hexdigest()}"


def root_task(root: str) -> str | None:
    """The task a cache root is of (None: the base model)."""
    root = root.split("|", 1)[0]
    return root[5:].split("#", 1)[0] if root.startswith("task:") else None

