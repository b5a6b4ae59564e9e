"""Tasks created at run time (Runtime.add_task, `POST /v1/tasks`, `prefix-edge task add`), kept
in a store beside the bundle and read back by Bundle.open as the bundle's own tasks.

A store is a folder (default: `created/` in the bundle; or one given), a folder per task:

    <store>/<name>/task.json                     the entry (below)
    <store>/<name>/<backend>-<fp12>.safetensors   its prefix for one backend's model (the
                                                  prefix-file codec, bundle/prefixfile.py)

task.json: {"format": "prefix-edge-created-task", "version": 1, "name", "created" (UTC),
"spec" (the fields it was made from), "model" (the digest of the bundle's model facts, tokenizer
and chat template it was rendered and tokenized for: a task made for another model is refused),
"task" (its manifest entry, as manifest.json spells a
task; each prefix's file relative to the task's folder, with its sha256, bytes and the model
fingerprint it was baked for), "sha256" (of the rest, canonical JSON)}.

Every read is untrusted: an entry is checked as the manifest's tasks are (bundle/check.py), its
digest and its prefix files' hashes against it, its prefix files' fingerprints by the bundle
when loaded; a damaged task is refused in one line and left out, never half read. Writes are
atomic: a new task is written in a hidden folder and renamed into place, a prefix added for
another backend is renamed in before the entry that names it is, a deleted task is renamed away
before it is removed, so a process killed at any point leaves each task whole or absent.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import PrefixEdgeError
from ..paths import fsync_path
from .check import check_task_dict
from .manifest import Manifest, TaskInfo, TaskPrefixFile
from .verify import file_hashes

STORE_DIR = "created"      # the default store, inside the bundle
ENTRY = "task.json"
FORMAT = "prefix-edge-created-task"
VERSION = 1
MAX_ENTRY_BYTES = 4 << 20  # a task.json larger than this is refused unread
STALE_S = 3600             # a hidden folder left this long by a killed writer is removed


class TaskExists(PrefixEdgeError):
    """A task of that name exists already (a server answers 409)."""


class TaskStoreFull(PrefixEdgeError):
    """The store's byte budget would be exceeded (a server answers 429, insufficient_quota)."""


@dataclass
class CreatedTask:
    name: str
    info: TaskInfo   # the manifest entry; its prefixes' files relative to `folder`
    spec: dict       # the fields it was made from
    created: str     # UTC, ISO 8601
    folder: Path

    @property
    def nbytes(self) -> int:
        return sum(p.bytes for p in self.info.prefixes.values())


def prefix_name(backend: str, fingerprint: str) -> str:
    return f"{backend}-{fingerprint[:12]}.safetensors"


def _digest(doc: dict) -> str:
    body = {k: v for k, v in doc.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def model_digest(manifest: Manifest) -> str:
    """What a created task's ids depend on: the model's facts, its tokenizer, its chat template."""
    doc = {"model": asdict(manifest.model), "tokenizer": manifest.tokenizer.sha256,
           "chat_template": manifest.tokenizer.chat_template_sha256}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _entry(task: CreatedTask, model: str) -> bytes:
    doc = {"format": FORMAT, "version": VERSION, "name": task.name, "created": task.created,
           "model": model, "spec": task.spec, "task": asdict(task.info)}
    doc["sha256"] = _digest(doc)
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode()


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class TaskStore:
    """One bundle's store of created tasks (its manifest: what an entry is checked against)."""

    def __init__(self, root: Path, manifest: Manifest):
        self.root, self.manifest = Path(root), manifest

    # -- reading ----------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The tasks on disk now (folders with an entry), without reading them."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if not p.name.startswith(".") and (p / ENTRY).is_file())

    def read(self) -> tuple[dict[str, CreatedTask], list[str]]:
        """Every task in the store, each checked; (tasks, one line per task refused)."""
        tasks, problems = {}, []
        self._sweep()
        for name in self.names():
            try:
                tasks[name] = self.read_one(name)
            except PrefixEdgeError as e:
                problems.append(str(e))
        return tasks, problems

    def folder(self, name: str) -> Path:
        """A task's folder; a name no task can have (a path, a NUL, ...) is refused."""
        from ..tasks import task_name_problem

        problem = task_name_problem(name) if isinstance(name, str) else "a task's name is a string"
        if problem:
            raise PrefixEdgeError(f"task {name!r}: {problem}", param="name")
        return self.root / name

    def read_one(self, name: str) -> CreatedTask:
        """One task's entry, checked (its prefix files' hashes too); a one-line refusal."""
        folder = self.folder(name)
        where = f"created task '{name}' ({folder / ENTRY})"
        try:
            path = folder / ENTRY
            if path.is_symlink() or path.stat().st_size > MAX_ENTRY_BYTES:
                raise PrefixEdgeError(f"{where}: not a plain file under {MAX_ENTRY_BYTES >> 20} MB")
            doc = json.loads(path.read_text(encoding="utf-8"))
        except PrefixEdgeError:
            raise
        except (OSError, ValueError, RecursionError) as e:
            raise PrefixEdgeError(f"{where}: unreadable: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise PrefixEdgeError(f"{where}: not a created task's entry")
        if doc.get("version") != VERSION:
            raise PrefixEdgeError(f"{where}: entry version {doc.get('version')!r}, this prefix-edge reads {VERSION}")
        if doc.get("sha256") != _digest(doc):
            raise PrefixEdgeError(f"{where}: its checksum does not match its contents (damaged or edited)")
        if doc.get("name") != name or not isinstance(doc.get("spec"), dict) or not isinstance(doc.get("created"), str):
            raise PrefixEdgeError(f"{where}: its name, spec or creation time is not what the entry holds")
        if doc.get("model") != model_digest(self.manifest):
            raise PrefixEdgeError(f"{where}: made for another model (or tokenizer, or chat template) than "
                                  "this bundle's: create it again for this one")
        t = doc.get("task")
        check_task_dict(name, t, where, asdict(self.manifest.model), self.manifest.backends)
        info = TaskInfo(**{**t, "prefixes": {b: TaskPrefixFile(**p) for b, p in t["prefixes"].items()}})
        if info.kind != "text" or info.n_virtual or info.compression:
            raise PrefixEdgeError(f"{where}: a created task is a text prefix, this one is not")
        for backend, p in info.prefixes.items():
            f = folder / p.file
            if p.file != prefix_name(backend, p.fingerprint) or not f.is_file() or f.is_symlink():
                raise PrefixEdgeError(f"{where}: its {backend} prefix file {p.file} is missing")
            # hashed once per file identity (verify.py's stat-identity cache, as the bundle's own
            # prefixes): opening a bundle does not read every created task's prefix again
            if f.stat().st_size != p.bytes or file_hashes(folder, [p.file])[p.file] != p.sha256:
                raise PrefixEdgeError(f"{where}: its {backend} prefix file does not match its entry (damaged)")
        return CreatedTask(name, info, doc["spec"], doc["created"], folder)

    def nbytes(self, but: str | None = None) -> int:
        """Bytes the store's tasks' prefix files take (but one's)."""
        total = 0
        for name in self.names():
            if name == but:
                continue
            for p in (self.root / name).iterdir():
                if p.suffix == ".safetensors" and not p.is_symlink():
                    total += p.stat().st_size
        return total

    # -- writing ----------------------------------------------------------------------------
    def create(self, name: str, info: TaskInfo, spec: dict, prefixes: dict[str, Path]) -> CreatedTask:
        """A new task from its entry and its prefix files (written elsewhere: moved in), in
        place at once or not at all; TaskExists if the name is taken."""
        final = self.folder(name)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".new-{name}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            for backend, src in prefixes.items():
                p = info.prefixes[backend]
                os.replace(src, tmp / p.file)
            task = CreatedTask(name, info, spec, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), self.root / name)
            _write(tmp / ENTRY, _entry(task, model_digest(self.manifest)))
            fsync_path(tmp)
            if (self.root / name).exists():
                raise TaskExists(f"task '{name}' exists already", param="name")
            try:
                os.rename(tmp, self.root / name)  # atomic; refused if another writer got there first
            except OSError:
                if (self.root / name).exists():
                    raise TaskExists(f"task '{name}' exists already", param="name") from None
                raise
            fsync_path(self.root)
            return task
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def add_prefix(self, task: CreatedTask, backend: str, entry: TaskPrefixFile, src: Path) -> CreatedTask:
        """`task` with a prefix for another backend's model (baked when a runtime of it first
        opens the bundle): the file renamed in, then the entry that names it."""
        os.replace(src, task.folder / entry.file)
        info = TaskInfo(**{**asdict(task.info), "prefixes": {**task.info.prefixes, backend: entry}})
        new = CreatedTask(task.name, info, task.spec, task.created, task.folder)
        tmp = task.folder / f".{ENTRY}.{secrets.token_hex(4)}"
        _write(tmp, _entry(new, model_digest(self.manifest)))
        os.replace(tmp, task.folder / ENTRY)
        fsync_path(task.folder)
        return new

    def remove(self, name: str) -> bool:
        """Delete a task (renamed away first: never half a task); False if there was none."""
        folder = self.folder(name)
        if not (folder / ENTRY).is_file():
            return False
        gone = self.root / f".gone-{name}-{secrets.token_hex(4)}"
        try:
            os.rename(folder, gone)
        except FileNotFoundError:
            return False
        fsync_path(self.root)
        shutil.rmtree(gone, ignore_errors=True)
        return True

    def _sweep(self) -> None:
        """Remove what killed writers left: hidden folders older than STALE_S (a live
        writer's are younger)."""
        if not self.root.is_dir():
            return
        now = time.time()
        for p in self.root.iterdir():
            try:
                if not p.name.startswith(".") or now - p.lstat().st_mtime <= STALE_S:
                    continue
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink()
            except OSError:
                pass
