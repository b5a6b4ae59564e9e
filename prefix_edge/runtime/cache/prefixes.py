"""PrefixCache: loads task prefixes from a bundle, checks their fingerprint and length, keeps
the most recently used ones in memory (LRU)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ...bundle import Bundle
from ...errors import PrefixEdgeError
from ..engines.protocol import Engine
from ..engines.prefix import Prefix


class PrefixCache:
    def __init__(self, bundle: Bundle, backend: Engine, fingerprint: str, capacity: int = 4,
                 verify: str = "cached"):
        self.bundle, self.manifest, self.backend = bundle, bundle.manifest, backend
        self.verify = verify
        self.fingerprint = fingerprint
        self.capacity = max(0, capacity)
        self._lru: OrderedDict[str, Prefix] = OrderedDict()
        self.largest = max((backend.prefix_bytes(t.prefix_tokens, t.prefixes[backend.name].bytes)
                            for t in self.manifest.tasks.values() if backend.name in t.prefixes), default=0)

    def get(self, task: str) -> tuple[Prefix, bool]:
        """The task's prefix and whether it was already in memory: the bundle checks the file,
        the engine the arrays, the bundle again what they hold."""
        if task in self._lru:
            self._lru.move_to_end(task)
            return self._lru[task], True
        name = self.backend.name
        tensors, meta, path, checked = self.bundle.read_prefix(task, name, self.fingerprint, self.verify)
        prefix = self.backend.prefix_from(tensors, meta, str(path), values_checked=checked, lasting=True)
        self.bundle.check_prefix(task, path, prefix.metadata, prefix.n_tokens, prefix.n_virtual,
                                 self.fingerprint)
        if not checked and self.verify == "cached":
            self.bundle.prefix_passed(task, name, self.fingerprint)
        if self.capacity:
            self._lru[task] = prefix
            while len(self._lru) > self.capacity:
                self._lru.popitem(last=False)
        return prefix, False

    def drop(self, task: str) -> bool:
        """Forget a task's prefix (it is read from its file again when next asked for)."""
        return self._lru.pop(task, None) is not None

    def ids(self, task: str):  # noqa: D401
        """Only the prefix token ids (for prefilling the prefix instead of loading it).

        A trained (peft) prefix has none to prefill: its virtual tokens exist only as the baked
        KV (the bundle keeps no adapter weights, and the ONNX graph takes token ids only), so
        there is no in-request baseline to run; PEFT itself is its reference (tests/test_peft.py)."""
        info = self.manifest.tasks[task]
        if info.n_virtual:
            kind = (info.adapter or {}).get("peft_type", "trained")
            raise PrefixEdgeError(
                f"task '{task}' is a trained prefix ({kind}, {info.n_virtual} virtual tokens) with no "
                "text to prefill: it runs only from its baked KV (drop --no-prefix-cache / "
                "use_prefix_cache=False)")
        if info.source_ids is not None:  # compressed: prefilling means the whole prefix
            return np.asarray(info.source_ids, np.int64)
        if task in self._lru:
            return self._lru[task].ids
        from ...bundle import prefixfile

        return prefixfile.read_ids(self.bundle.prefix_file(task, self.backend.name, self.fingerprint,
                                                           self.verify))

    def info(self) -> dict:
        """The prefixes held, their bytes (what their states hold: a fused ONNX graph's, the
        home buffers), and the budget: `capacity` of the bundle's largest (the engine's prefix_bytes)."""
        held = list(self._lru.values())
        return {"entries": len(held), "capacity": self.capacity, "bytes": sum(p.nbytes for p in held),
                "budget_bytes": self.capacity * self.largest}

    def clear(self) -> None:
        self._lru.clear()
