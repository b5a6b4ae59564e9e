"""Resident task prefixes: a task's prefix restored once into a sequence of its own, which each
request of the task copies (llama.cpp shares the cells) instead of restoring it again.

The scheduler (loop.py) owns one Residents and calls it from its engine thread only: a
pool of sequences set aside for prefixes, a byte budget, least recently used first out, and
never a prefix a running request still reads from (`users`)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ...errors import EngineError
from ..engines.prefix import Prefix


@dataclass
class Resident:
    seq: int
    cells: int
    nbytes: int
    users: int = 0


class Residents:
    def __init__(self, backend, budget_bytes: int, seqs: tuple[int, ...], stats: dict):
        self.backend, self.budget_bytes, self.stats = backend, budget_bytes, stats
        self.free = list(seqs)
        self.held: OrderedDict[str, Resident] = OrderedDict()

    def __contains__(self, key) -> bool:
        return key in self.held

    def info(self) -> dict[str, dict]:
        """By task (a key's task: prepare.resident_key)."""
        return {k.split("#", 1)[0]: {"seq": r.seq, "cells": r.cells, "bytes": r.nbytes, "users": r.users}
                for k, r in list(self.held.items())}

    def cells(self) -> int:
        return sum(x.cells for x in self.held.values())

    def can_hold(self, prefix: Prefix) -> bool:
        """Whether `prefix` could be made resident (a sequence free or freeable, and it fits
        the budget at all)."""
        if not self.free and not any(x.users == 0 for x in self.held.values()):
            return False
        return 0 < self.budget_bytes and prefix.nbytes <= self.budget_bytes

    def evict_until(self, enough, keep: str | None = None) -> bool:
        """Evict unused resident prefixes, least recently used first and never `keep`, until
        enough() holds; return whether it does."""
        for key in list(self.held):
            if enough():
                break
            if key != keep and self.held[key].users == 0:
                res = self.held.pop(key)
                self.backend.seq_free(res.seq)
                self.free.append(res.seq)
        return bool(enough())

    def acquire(self, key: str, prefix: Prefix) -> Resident:
        """The resident copy of `prefix` under `key` (restored now if it is not one yet), with
        one more user; release(key) when that user is done."""
        res = self.held.get(key)
        if res is None:
            res = self._make(key, prefix)
        else:
            self.stats["resident_hits"] += 1
        self.held.move_to_end(key)
        res.users += 1
        return res

    def release(self, key: str) -> None:
        if key in self.held:
            self.held[key].users -= 1

    def clear(self) -> None:
        for res in self.held.values():
            self.backend.seq_free(res.seq)
        self.held.clear()

    def _make(self, key: str, prefix: Prefix) -> Resident:
        def fits() -> bool:  # a free resident sequence, and the byte budget
            held = sum(x.nbytes for x in self.held.values())
            return bool(self.free) and held + prefix.nbytes <= self.budget_bytes

        if not self.evict_until(fits):
            raise EngineError("internal error: no resident slot")  # can_hold said yes
        seq = self.free.pop()
        try:
            self.backend.seq_restore(seq, prefix)
        except BaseException:
            self.backend.seq_free(seq)
            self.free.append(seq)
            raise
        self.stats["resident_restores"] += 1
        res = Resident(seq, prefix.n_tokens, prefix.nbytes)
        self.held[key] = res
        return res
