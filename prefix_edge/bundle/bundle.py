"""Bundle: one opened bundle directory, and every question asked of it. Its layout (layout.py),
typed manifest (manifest.py), prefix files (prefixfile.py) and file verification (verify.py)
are reached through it: the runtime, `prefix-edge verify`, `inspect`, `bench`, `eval`, `distill`
and the cluster open a bundle with Bundle.open and ask it; none of them joins paths or hashes
files itself. Every check is a one-line PrefixEdgeError naming what is wrong."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PrefixEdgeError, warn
from . import prefixfile
from .created import STORE_DIR, CreatedTask, TaskStore
from .layout import MANIFEST, MODEL_FILE, MTP_HEAD, confined
from .manifest import BackendInfo, Manifest
from .verify import file_hashes, passed, remember_pass, sha256_file

MODEL_SUFFIX = {"onnx": ".onnx", "gguf": ".gguf"}


class Bundle:
    def __init__(self, root: Path, manifest: Manifest, task_store: str | Path | None = None):
        self.root, self.manifest = Path(root), manifest
        # tasks created at run time (created.py): the store's, by name, in manifest.tasks too
        self.store = TaskStore(Path(task_store) if task_store is not None else self.root / STORE_DIR, manifest)
        self.created: dict[str, CreatedTask] = {}
        self.exported = frozenset(manifest.tasks)  # the tasks export made

    @classmethod
    def open(cls, path: str | Path | None = None, task_store: str | Path | None = None) -> "Bundle":
        """The bundle at `path` (None: the default bundle), its manifest read and checked, and
        the tasks created for it (in `task_store`, default the bundle's `created/`), each
        checked; a damaged one is left out with a warning line."""
        from ..paths import default_bundle

        root = Path(path) if path is not None else default_bundle()
        if path is None and not (root / MANIFEST).is_file():
            raise PrefixEdgeError(f"no default bundle at {root}; create it with: prefix-edge export")
        bundle = cls(root, Manifest.read(root), task_store)
        for problem in bundle.load_created():
            warn(f"{problem}; left out")
        return bundle

    # -- created tasks (created.py) -------------------------------------------------------
    def load_created(self) -> list[str]:
        """Read the store's tasks into the bundle; one line per task refused."""
        tasks, problems = self.store.read()
        for name, task in tasks.items():
            why = self.created_problem(name)
            if why is not None and name not in self.created:
                problems.append(f"created task '{name}': {why}")
                continue
            self.add_created(task)
        return problems

    def created_problem(self, name: str) -> str | None:
        """Why `name` cannot be a created task's (a clash with one of the bundle's, whose names
        differ from it in case only too), or None."""
        from ..tasks import task_name_problem

        problem = task_name_problem(name)
        if problem:
            return problem
        clash = next((t for t in self.exported if t.casefold() == name.casefold()), None)
        if clash is not None:
            return f"the bundle has a task {clash!r} already (exported tasks cannot be replaced)"
        return None

    def add_created(self, task: CreatedTask) -> None:
        self.created[task.name] = task
        self.manifest.tasks[task.name] = task.info

    def drop_created(self, name: str) -> None:
        self.manifest.tasks.pop(name, None)
        self.created.pop(name, None)

    def task_file(self, task: str, rel: str) -> Path:
        """A task's file: the bundle's, or a created task's in its folder (confined to it)."""
        root, rel = self._task_root(task, rel)
        return confined(root, rel, f"{'created ' if task in self.created else ''}task '{task}'")

    def _task_root(self, task: str, rel: str) -> tuple[Path, str]:
        """(the folder a task's files are relative to, `rel`): the bundle, or a created task's."""
        created = self.created.get(task)
        return (created.folder, rel) if created is not None else (self.root, rel)

    def __repr__(self) -> str:
        return f"Bundle({str(self.root)!r})"

    @property
    def tasks(self):
        return self.manifest.tasks

    @property
    def backends(self) -> dict[str, BackendInfo]:
        return self.manifest.backends

    def path(self, rel: str, where: str = "manifest") -> Path:
        """root/rel, confined to the bundle."""
        return confined(self.root, rel, where)

    # -- models ---------------------------------------------------------------------------
    def backend(self, name: str) -> BackendInfo:
        if name not in self.manifest.backends:
            raise PrefixEdgeError(f"bundle {self.root} has no {name} model (it has: "
                                  f"{', '.join(self.manifest.backends) or 'none'})")
        return self.manifest.backends[name]

    def model_file(self, backend: str) -> Path:
        info = self.backend(backend)
        rel = MODEL_FILE[backend] if MODEL_FILE[backend] in info.files else \
            next((f for f in info.files if f.endswith(MODEL_SUFFIX[backend]) and f != MTP_HEAD), None)
        if rel is None:
            raise PrefixEdgeError(f"bundle {self.root}: its {backend} files hold no {MODEL_SUFFIX[backend]} model")
        return self.path(rel)

    def mtp_head_file(self) -> Path | None:
        """The GGUF model's MTP head as a file of its own (layout.MTP_HEAD), or None."""
        info = self.manifest.backends.get("gguf")
        return self.path(MTP_HEAD) if info is not None and MTP_HEAD in info.files else None

    @property
    def tokenizer_file(self) -> Path:
        return self.path(self.manifest.tokenizer.file)

    def check_model(self, backend: str, verify: str = "cached") -> tuple[str, dict[str, str]]:
        """The fingerprint of `backend`'s files as they are on disk, and their hashes, refused
        unless the files, the tokenizer and the fingerprint are the manifest's."""
        info = self.backend(backend)
        actual = file_hashes(self.root, info.files, verify)
        for rel, sha in actual.items():
            if sha != info.files[rel]:
                raise PrefixEdgeError(f"bundle {self.root}: model file {rel} does not match its manifest "
                                      "entry (changed after export); re-export the bundle")
        tok = self.manifest.tokenizer
        if file_hashes(self.root, [tok.file], verify)[tok.file] != tok.sha256:
            raise PrefixEdgeError(f"bundle {self.root}: {tok.file} does not match the manifest")
        fingerprint = self.manifest.fingerprint(backend, actual)
        if fingerprint != info.fingerprint:
            raise PrefixEdgeError(
                f"bundle {self.root}: the manifest's {backend} fingerprint does not match its contents "
                "(the manifest was edited or the bundle is mixed); re-export the bundle")
        return fingerprint, actual

    def chat_template(self) -> tuple[str | None, dict[str, Any]]:
        """The model's chat template and the special tokens it is rendered with, checked against
        the manifest's hash (in the fingerprint). Bundles from before the manifest kept the text
        read it from the tokenizer dir export wrote (chat_template.jinja or tokenizer_config.json)."""
        t = self.manifest.tokenizer
        if t.chat_template_sha256 is None:
            return None, {}
        text, special = t.chat_template, t.special_tokens
        tok_dir = (self.root / t.file).parent
        if text is None or special is None:
            try:
                cfg = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
                if text is None:
                    jinja = tok_dir / "chat_template.jinja"
                    text = jinja.read_text(encoding="utf-8") if jinja.is_file() else cfg.get("chat_template")
                if special is None:
                    special = {k: (v.get("content") if isinstance(v, dict) else v) for k, v in cfg.items()
                               if k.endswith("_token") and isinstance(v, (str, dict))}
            except (OSError, ValueError) as e:
                raise PrefixEdgeError(f"bundle {self.root}: cannot read its chat template: {e}") from None
        if not isinstance(text, str) or hashlib.sha256(text.encode()).hexdigest() != t.chat_template_sha256:
            raise PrefixEdgeError(f"bundle {self.root}: its chat template does not match the manifest's "
                                  "hash (edited or missing); re-export the bundle")
        return text, dict(special or {})

    # -- task prefixes --------------------------------------------------------------------
    def prefix_file(self, task: str, backend: str, fingerprint: str, verify: str = "cached") -> Path:
        """The task's prefix file for `backend`, refused unless the manifest records it for this
        model (`fingerprint`) and its size and hash are the manifest's."""
        entry = self.manifest.tasks[task].prefixes.get(backend)
        if entry is None:
            raise PrefixEdgeError(f"task '{task}' has no baked prefix for the {backend} backend")
        if entry.fingerprint != fingerprint:
            raise PrefixEdgeError(
                f"task '{task}': the manifest records its prefix as baked for another model "
                f"(fingerprint {entry.fingerprint[:12]} vs {fingerprint[:12]}); re-export the bundle")
        path = self.task_file(task, entry.file)
        if not path.is_file():
            raise PrefixEdgeError(f"task '{task}': prefix file {entry.file} is missing from the bundle")
        root, rel = self._task_root(task, entry.file)
        if path.stat().st_size != entry.bytes or file_hashes(root, [rel], verify)[rel] != entry.sha256:
            raise PrefixEdgeError(f"task '{task}': prefix file {entry.file} does not match its manifest "
                                  "entry (corrupt, replaced or edited); re-export the bundle")
        return path

    def read_prefix(self, task: str, backend: str, fingerprint: str, verify: str = "cached"):
        """(tensors, metadata, path, values_checked) of the task's prefix file, checked as
        prefix_file() does; the engine checks the arrays (Engine.prefix_from: the O(bytes) walk
        only unless `values_checked`, i.e. this very file passed it before), then check_prefix()
        what it loaded."""
        path = self.prefix_file(task, backend, fingerprint, verify)
        tensors, meta = prefixfile.read(path)
        checked = verify == "cached" and passed(*self._task_root(task, self.manifest.tasks[task].prefixes[backend].file),
                                                f"{backend}:{fingerprint}")
        return tensors, meta, path, checked

    def prefix_passed(self, task: str, backend: str, fingerprint: str) -> None:
        """Remember that the task's prefix file passed every check for this model (its stat
        identity and hash with it), so the next load skips the engine's walk of its values."""
        remember_pass(*self._task_root(task, self.manifest.tasks[task].prefixes[backend].file),
                      f"{backend}:{fingerprint}")

    def check_prefix(self, task: str, path: Path, meta: dict[str, str], n_tokens: int, n_virtual: int,
                     fingerprint: str) -> None:
        """Refuse a loaded prefix that is not this task's for this model, or of another length."""
        problem = self.manifest.prefix_problem(task, meta, fingerprint)
        if problem:
            raise PrefixEdgeError(f"task '{task}': prefix {path.name} was {problem}; re-export the bundle")
        info = self.manifest.tasks[task]
        if n_tokens != info.prefix_tokens or n_virtual != info.n_virtual:
            raise PrefixEdgeError(
                f"task '{task}': prefix file holds {n_tokens} positions ({n_virtual} virtual), the "
                f"manifest says {info.prefix_tokens} ({info.n_virtual} virtual); re-export the bundle")

    def prefix_ids(self, task: str, backend: str | None = None):
        """The text ids of a task's prefix as a prefill would give it: a compressed prefix's
        whole source (manifest), else its file's for `backend` (default the first)."""
        src = self.manifest.tasks[task].source_ids
        if src is not None:
            return np.asarray(src, np.int64)
        prefixes = self.manifest.tasks[task].prefixes
        entry = prefixes[backend] if backend else next(iter(prefixes.values()))
        return prefixfile.read_ids(self.task_file(task, entry.file))

    # -- everything -----------------------------------------------------------------------
    def verify_all(self) -> list[dict]:
        """Every file re-hashed and every prefix file checked (`prefix-edge verify`): one row per
        file, {file, kind, bytes, status ("ok" or "FAIL"), detail}."""
        m, rows = self.manifest, []

        def check(rel: str, kind: str, want_sha: str, want_bytes: int | None = None,
                  p: Path | None = None) -> str | None:
            p = p if p is not None else self.path(rel)
            row = {"file": rel, "kind": kind, "bytes": p.stat().st_size if p.is_file() else 0,
                   "status": "ok", "detail": ""}
            rows.append(row)
            if not p.is_file():
                row.update(status="FAIL", detail="missing")
                return None
            if want_bytes is not None and row["bytes"] != want_bytes:
                row.update(status="FAIL", detail=f"size {row['bytes']}, manifest says {want_bytes}")
                return None
            if sha256_file(p) != want_sha:
                row.update(status="FAIL", detail="sha256 differs from the manifest")
                return None
            return want_sha

        actual = {}
        check(m.tokenizer.file, "tokenizer", m.tokenizer.sha256)
        for name, b in m.backends.items():
            for rel, sha in b.files.items():
                actual.setdefault(name, {})[rel] = check(rel, f"model ({name})", sha) or "?"
        fps = {}
        for name, b in m.backends.items():
            fps[name] = m.fingerprint(name, actual.get(name, {}))
            if fps[name] != b.fingerprint:
                rows.append({"file": MANIFEST, "kind": f"fingerprint ({name})", "bytes": 0,
                             "status": "FAIL", "detail": "recomputed fingerprint differs"})
        for problem in self.store.read()[1]:  # created tasks left out at open
            rows.append({"file": str(self.store.root), "kind": "created task", "bytes": 0, "status": "FAIL",
                         "detail": problem})
        for task, t in sorted(m.tasks.items()):
            for backend, e in sorted(t.prefixes.items()):
                path = self.task_file(task, e.file)
                shown = e.file if task not in self.created else str(path)
                kind = f"{'created ' if task in self.created else ''}prefix {task} ({backend})"
                if check(shown, kind, e.sha256, e.bytes, path) is None:
                    continue
                row = rows[-1]
                if backend not in fps:
                    row.update(status="FAIL", detail=f"the bundle has no {backend} model")
                    continue
                try:
                    meta = prefixfile.metadata(path)
                except Exception as ex:  # PrefixEdgeError: one line
                    row.update(status="FAIL", detail=f"unreadable: {str(ex).splitlines()[0]}")
                    continue
                problem = ("the manifest records it for another model" if e.fingerprint != fps[backend]
                           else m.prefix_problem(task, meta, fps[backend]))
                if problem:
                    row.update(status="FAIL", detail=problem)
        return rows
