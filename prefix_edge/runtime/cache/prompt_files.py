"""PromptFiles: the prompt cache's persistent tier (optional), so a restarted runtime starts warm.

A prompt whose start keeps coming back (a hit at the same chunk end at least `hits` times,
covering at least `min_tokens` input tokens) is written, on a background thread, as a prefix
file (the bundle's codec, through the engine's own write_snapshot) to a folder of the home
directory per model and engine (paths.prompt_cache_dir): written to a temporary name, then
renamed. Besides the KV and ids a file carries what rebuilds its keys: the root (a task or the
base model) and that task's digest, the positions before its input, the input's cuts, the
prefill chunk, and every chunk end with its chain key (prompt_cache.chain), those fields
covered by a checksum of their own so that the index can trust them from the header alone.

At open the folder's headers are read (no KV): a lookup that misses memory but matches a file's
key loads it: the codec checks the whole payload's CRC-32 and its MAC with this home's secret
(paths.secret_key: a file anyone else wrote, e.g. another local user who can write the folder,
is refused however well-formed), the engine checks the arrays like a baked prefix
(fingerprint, shapes, state version), and the ids are chained again and must give the file's
keys. Files are opened as untrusted (no symbolic link, no FIFO: a regular file only), and one
larger than a snapshot of the positions its header names can be (Engine.snapshot_bytes) is
refused before it is read. The file stays (an entry is copied into memory, never moved). Every file is
untrusted: one that fails any of this is a one-line warning, a miss, and deleted. A well-formed
file for another configuration of the same model (another prefill_chunk, another version of a
task) is kept for that one and counted in the budget, never read here.

Bounded: the folder's files total at most `budget` bytes; the least recently used go first
(their modification time: a load or a hit touches it). Several processes may share a folder:
names are keys, renames are atomic, and each one trims by what is on disk.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...bundle import prefixfile
from ...errors import PrefixEdgeError, disk_full, warn
from .prompts import chain, root_task

FORMAT = "prefix-edge-prompt/1"
SUFFIX = ".safetensors"
DEFAULT_HITS = 2
DEFAULT_MIN_TOKENS = 256
OWN = ("format", "fingerprint", "backend", "root", "task_digest", "n_root", "cuts", "prefill_chunk", "keys")
INDEX_CRC = "index_crc32"
COUNTED = 4096        # chunk ends whose hits are counted (least recently hit forgotten first)
QUEUED = 2            # writes waiting (each holds its entry's KV); beyond, one at a later hit
TOUCH_S = 60.0        # a file's time is touched at most this often by hits
STALE_TMP_S = 24 * 3600


def root_digest(manifest) -> Callable[[str], str | None]:
    """root -> what a file of that root must carry as task_digest ("" for the base model; None:
    a task this bundle does not have)."""
    def digest(root: str) -> str | None:
        if root.split("|", 1)[0] == "base":  # a scoped root (prompts.cache_root): its task
            return ""
        task = root_task(root)
        return manifest.task_digest(task) if task in manifest.tasks else None
    return digest


def _index_crc(meta: dict[str, str]) -> str:
    return f"{zlib.crc32(json.dumps({k: meta.get(k) for k in OWN}, sort_keys=True).encode()):08x}"


@dataclass
class _File:
    path: Path
    n: int                  # input tokens it covers (after its root)
    links: list             # [(chunk end, key)], the last at n


class PromptFiles:
    def __init__(self, folder: Path, budget: int, backend: Any, fingerprint: str, chunk: int,
                 digest: Callable[[str], str | None], hits: int = DEFAULT_HITS,
                 min_tokens: int = DEFAULT_MIN_TOKENS, key: bytes | None = None):
        """key: the MAC key every file is written with and must carry (paths.secret_key)."""
        self.folder, self.budget = Path(folder), max(0, int(budget))
        self.key = key
        self.backend, self.fingerprint, self.chunk, self.digest = backend, fingerprint, chunk, digest
        self.hits, self.min_tokens = max(1, hits), max(1, min_tokens)
        self.loading = threading.Lock()   # one load at a time (the next finds it in memory)
        self._lock = threading.Lock()
        self._files: dict[str, _File] = {}
        self._index: dict[bytes, list[str]] = {}
        self._counts: OrderedDict[bytes, int] = OrderedDict()
        self._pending: set[str] = set()
        self._touched: dict[str, float] = {}
        self._warned: set[str] = set()
        self._queue: queue.Queue = queue.Queue(QUEUED)
        self._thread: threading.Thread | None = None
        self.loads = self.writes = self.refused = self.evicted = 0
        self.n_files = self.n_bytes = 0
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            warn(f"prompt cache: cannot use {self.folder} ({e.strerror or e}): prompts are not kept on disk")
            self.budget = 0
            return
        self._scan()

    # -- the index ------------------------------------------------------------------------
    def _scan(self) -> None:
        """Index the folder's files from their headers; remove what cannot be read."""
        for p in sorted(self._entries()):
            try:
                rec = self._record(p, prefixfile.metadata(p, untrusted=True))
            except PrefixEdgeError as e:
                self._refuse(p, str(e))
                continue
            except Exception as e:  # noqa: BLE001 - an unreadable file is a miss, never a crash
                self._refuse(p, f"{p}: {_line(e)}")
                continue
            if rec is not None:
                self._add(rec)
        self._trim()

    def _entries(self):
        try:
            listing = list(os.scandir(self.folder))
        except OSError:
            return []
        out = []
        for d in listing:
            if d.name.startswith(".") and ".tmp-" in d.name:
                self._stale(Path(d.path))
            elif d.name.endswith(SUFFIX) and d.is_file(follow_symlinks=False):
                out.append(Path(d.path))
        return out

    def _stale(self, tmp: Path) -> None:
        """A temporary file left by a process that died while writing (or a day old)."""
        try:
            pid = int(tmp.name.rsplit(".tmp-", 1)[1].split("-")[0])
            try:
                os.kill(pid, 0)  # signal 0: is it alive
                alive = True
            except ProcessLookupError:
                alive = False
            except OSError:
                alive = True
            if not alive or time.time() - tmp.stat().st_mtime > STALE_TMP_S:
                tmp.unlink()
        except (ValueError, IndexError, OSError):
            pass

    def _record(self, path: Path, meta: dict[str, str]) -> _File | None:
        """The file's index entry from its header; None: a file of another configuration;
        PrefixEdgeError: a file that is not a good one of this model's."""
        if meta.get("format") != FORMAT:
            raise PrefixEdgeError(f"{path}: not a prompt-cache file")
        if meta.get(INDEX_CRC) != _index_crc(meta):
            raise PrefixEdgeError(f"{path}: the file is damaged (its header's checksum does not match)")
        if meta.get("fingerprint") != self.fingerprint or meta.get("backend") != self.backend.name:
            raise PrefixEdgeError(f"{path}: written for another model or engine (fingerprint "
                                  f"{meta.get('fingerprint', '')[:12]}, {meta.get('backend')})")
        root = meta.get("root", "")
        if meta.get("prefill_chunk") != str(self.chunk) or self.digest(root) != meta.get("task_digest"):
            return None  # another runtime's prefill chunk, another version of the task
        try:
            links = [(int(e), bytes.fromhex(k)) for e, k in json.loads(meta["keys"])]
            n_root = int(meta["n_root"])
        except (KeyError, ValueError, TypeError, RecursionError):
            raise PrefixEdgeError(f"{path}: its keys are not readable") from None
        ends = [e for e, _ in links]
        if not links or n_root < 0 or ends[0] <= 0 or any(b <= a for a, b in zip(ends, ends[1:])):
            raise PrefixEdgeError(f"{path}: its keys are not readable")
        return _File(path, ends[-1], links)

    def _add(self, rec: _File) -> None:
        with self._lock:
            self._drop(rec.path.name)
            self._files[rec.path.name] = rec
            for _, k in rec.links:
                self._index.setdefault(k, []).append(rec.path.name)

    def _drop(self, name: str) -> None:
        rec = self._files.pop(name, None)
        if rec is None:
            return
        for _, k in rec.links:
            held = self._index.get(k)
            if held is not None and name in held:
                held.remove(name)
                if not held:
                    del self._index[k]

    def _refuse(self, path: Path, why: str) -> None:
        """A bad file: one warning, a miss, and it goes."""
        with self._lock:
            self._drop(path.name)
            self.refused += 1
            first = path.name not in self._warned
            self._warned.add(path.name)
        if first:
            warn(f"prompt cache: {why}; deleted (the prompt is read again)")
        try:
            size = path.stat().st_size
            path.unlink()
            with self._lock:
                self.n_files, self.n_bytes = max(0, self.n_files - 1), max(0, self.n_bytes - size)
        except OSError:
            pass

    # -- reading -------------------------------------------------------------------------
    def best(self, links: list, above: int, partial: bool) -> tuple[_File, int] | None:
        """The file that serves the longest chunk end of `links` beyond `above`, and that end."""
        with self._lock:
            for end, key in reversed(links):
                if end <= above:
                    return None
                for name in reversed(self._index.get(key, ())):
                    rec = self._files[name]
                    if rec.n == end or (partial and rec.n > end):
                        return rec, end
        return None

    def load(self, rec: _File, root: str, n_root: int) -> tuple[np.ndarray, tuple, Any] | None:
        """(input ids, cuts, Prefix) of a file, checked through; None: refused (and deleted)."""
        path = rec.path
        try:
            n_all = n_root + rec.n  # positions the file holds, if it is what its header says
            tensors, meta = prefixfile.read(path, verify=True, mac_key=self.key,
                                            max_bytes=self.backend.snapshot_bytes(n_all) + 64 * len(rec.links))
            again = self._record(path, meta)  # the header as read now, whole-payload checked
            if again is None or again.links != rec.links or meta.get("root") != root:
                raise PrefixEdgeError(f"{path}: it changed since it was indexed")
            if int(meta["n_root"]) != n_root:
                raise PrefixEdgeError(f"{path}: {meta['n_root']} positions before its input, this "
                                      f"root has {n_root}")
            prefix = self.backend.prefix_from(tensors, meta, str(path))  # checked like a baked prefix
            skip = n_root - prefix.n_virtual
            if skip < 0 or prefix.n_tokens != n_root + rec.n:
                raise PrefixEdgeError(f"{path}: its KV holds {prefix.n_tokens} positions, its "
                                      f"keys {n_root + rec.n}")
            ids = prefix.ids[skip:]
            cuts = json.loads(meta.get("cuts", ""))
            if not isinstance(cuts, list) or not all(type(c) is int and 0 < c < 1 << 40 for c in cuts):
                raise PrefixEdgeError(f"{path}: its cuts are not a list of positions")
            cuts = tuple(cuts)
            if chain(root, ids, cuts, self.chunk) != rec.links:
                raise PrefixEdgeError(f"{path}: its token ids do not match its keys")
        except PrefixEdgeError as e:
            if not path.exists():  # trimmed by another process meanwhile: a plain miss
                with self._lock:
                    self._drop(path.name)
                return None
            self._refuse(path, str(e))
            return None
        except Exception as e:  # noqa: BLE001 - a bad file is a miss, never a crash
            self._refuse(path, f"{path}: {_line(e)}")
            return None
        self._touch(path)
        with self._lock:
            self.loads += 1
        return ids, cuts, prefix

    # -- writing -------------------------------------------------------------------------
    def hit(self, key: bytes, end: int) -> bool:
        """Count a memory hit at chunk end `key`; whether its entry should now be written."""
        touch, n = None, 0
        with self._lock:
            names = self._index.get(key)
            on_disk = bool(names)
            if on_disk:  # its place in the disk's LRU (touched at most once a minute)
                if len(self._touched) > COUNTED:
                    self._touched.clear()
                now = time.monotonic()
                if now - self._touched.get(names[-1], 0.0) >= TOUCH_S:
                    self._touched[names[-1]] = now
                    touch = self._files[names[-1]].path
            else:
                n = self._counts.pop(key, 0) + 1
                self._counts[key] = n
                while len(self._counts) > COUNTED:
                    self._counts.popitem(last=False)
        if touch is not None:
            self._touch(touch)
        return not on_disk and self.budget > 0 and n >= self.hits and end >= self.min_tokens

    def write(self, root: str, ids: np.ndarray, cuts: tuple, prefix: Any) -> None:
        """Write a memory entry (root + ids, as put) in the background; dropped when the queue
        is full (a later hit asks again)."""
        if prefix.nbytes > self.budget or len(ids) == 0:
            return
        links = chain(root, ids, cuts, self.chunk)
        name = links[-1][1].hex() + SUFFIX
        with self._lock:
            if name in self._pending or name in self._files:
                return
            self._pending.add(name)
            if self._thread is None:
                self._thread = threading.Thread(target=self._writer, name="prompt-files", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait((name, root, cuts, prefix, links))
        except queue.Full:
            with self._lock:
                self._pending.discard(name)

    def _writer(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._write(*job)
            except Exception as e:  # noqa: BLE001 - the cache only ever saves work: one warning
                with self._lock:
                    first = "write" not in self._warned
                    self._warned.add("write")
                if first:
                    warn(f"prompt cache: cannot write to {self.folder}: {_line(e)}")
            finally:
                if job is not None:
                    with self._lock:
                        self._pending.discard(job[0])
                self._queue.task_done()

    def _write(self, name: str, root: str, cuts: tuple, prefix: Any, links: list) -> None:
        meta = {"format": FORMAT, "fingerprint": self.fingerprint, "backend": self.backend.name,
                "root": root, "task_digest": self.digest(root) or "",
                "n_root": str(prefix.n_tokens - links[-1][0]), "cuts": json.dumps(list(cuts)),
                "prefill_chunk": str(self.chunk), "keys": json.dumps([[e, k.hex()] for e, k in links])}
        meta[INDEX_CRC] = _index_crc(meta)
        path = self.folder / name
        tmp = self.folder / f".{name}.tmp-{os.getpid()}-{threading.get_ident()}"
        try:
            self.backend.write_snapshot(tmp, prefix, meta, self.key)
            _stamp(tmp)
            os.replace(tmp, path)  # never a half-written file under a name
        except BaseException as e:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            if isinstance(e, Exception) and disk_full(e):
                raise PrefixEdgeError("No space left on device") from None
            raise
        self._add(_File(path, links[-1][0], links))
        with self._lock:
            self.writes += 1
        self._trim()

    def _trim(self) -> None:
        """The folder within its budget: the least recently used files removed first."""
        files = []
        for p in self._entries():
            try:
                st = p.stat()
            except OSError:
                continue
            files.append((st.st_mtime, p.name, st.st_size, p))
        files.sort()
        total = sum(f[2] for f in files)
        while files and total > self.budget:
            _, name, size, p = files.pop(0)
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            except OSError:
                continue
            total -= size
            with self._lock:
                self._drop(name)
                self.evicted += 1
        with self._lock:
            self.n_files, self.n_bytes = len(files), total

    def _touch(self, path: Path) -> None:
        try:
            _stamp(path)  # its place in the disk's LRU
        except OSError:
            pass

    def flush(self) -> None:
        """Wait for the writes asked for so far."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        """Finish the writes asked for, then stop the writer."""
        if self._thread is not None:
            self._queue.join()
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def info(self) -> dict:
        with self._lock:
            return {"disk_files": self.n_files, "disk_bytes": self.n_bytes, "disk_budget_bytes": self.budget,
                    "disk_loads": self.loads, "disk_writes": self.writes, "disk_refused": self.refused,
                    "disk_evicted": self.evicted}


def _stamp(path: Path) -> None:
    """A file's modification time set to now at the clock's full resolution (a plain write or
    utime takes the kernel's coarse clock: two files written a few ms apart can tie, and the
    LRU order between them is then a coin flip)."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
