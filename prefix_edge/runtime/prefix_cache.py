"""PrefixCache: loads task prefixes from a bundle, checks their fingerprint and length, keeps
the most recently used ones in memory (LRU)."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from ..bundle import prefixfile
from ..bundle import Manifest
from ..errors import PrefixEdgeError
from .backend import Backend
from .prefix import Prefix


class PrefixCache:
    def __init__(self, root: Path, manifest: Manifest, backend: Backend, fingerprint: str,
                 capacity: int = 4, verify: str = "cached"):
        self.root, self.manifest, self.backend = root, manifest, backend
        self.verify = verify
        self.fingerprint = fingerprint
        self.capacity = max(0, capacity)
        self._lru: OrderedDict[str, Prefix] = OrderedDict()

    def _file(self, task: str) -> tuple[Path, int]:
        """The task's prefix file and its KV length (virtual + text positions)."""
        info = self.manifest.tasks[task]
        entry = info.prefixes.get(self.backend.name)
        if entry is None:
            raise PrefixEdgeError(f"task '{task}' has no baked prefix for the {self.backend.name} backend")
        if entry.fingerprint != self.fingerprint:
            raise PrefixEdgeError(
                f"task '{task}': the manifest records its prefix as baked for another model "
                f"(fingerprint {entry.fingerprint[:12]} vs {self.fingerprint[:12]}); re-export the bundle")
        from ..bundle import confined
        from ..bundle.verify import file_hashes

        path = confined(self.root, entry.file, f"task '{task}'")
        if not path.is_file():
            raise PrefixEdgeError(f"task '{task}': prefix file {entry.file} is missing from the bundle")
        if path.stat().st_size != entry.bytes or \
                file_hashes(self.root, [entry.file], self.verify)[entry.file] != entry.sha256:
            raise PrefixEdgeError(f"task '{task}': prefix file {entry.file} does not match its manifest "
                                  "entry (corrupt, replaced or edited); re-export the bundle")
        return path, info.prefix_tokens

    def get(self, task: str) -> tuple[Prefix, bool]:
        """The task's prefix and whether it was already in memory."""
        if task in self._lru:
            self._lru.move_to_end(task)
            return self._lru[task], True
        path, n = self._file(task)
        tensors, meta = prefixfile.read(path)  # the codec reads; the backend checks the arrays
        prefix = self.backend.prefix_from(tensors, meta, str(path))
        problem = self.manifest.prefix_problem(task, prefix.metadata, self.fingerprint)
        if problem:
            raise PrefixEdgeError(f"task '{task}': prefix {path.name} was {problem}; re-export the bundle")
        nv = self.manifest.tasks[task].n_virtual
        if prefix.n_tokens != n or prefix.n_virtual != nv:
            raise PrefixEdgeError(
                f"task '{task}': prefix file holds {prefix.n_tokens} positions ({prefix.n_virtual} "
                f"virtual), the manifest says {n} ({nv} virtual); re-export the bundle")
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
        if task in self._lru:
            return self._lru[task].ids
        path, _ = self._file(task)
        return prefixfile.read_ids(path)

    def clear(self) -> None:
        self._lru.clear()
