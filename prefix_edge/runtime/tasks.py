"""Tasks created at run time: Runtime.add_task / remove_task (and through them `POST` /
`DELETE /v1/tasks`, `prefix-edge task add|rm`).

A task is given as a task file's fields (name, system, examples, prefix, template, chat, its
generation defaults, json_schema ...), checked exactly as export checks a task file's
(tasks/taskfile.py, the defaults' constraints compiled), rendered by the bundle's chat template
and tokenized by its tokenizer as export does (tasks/tokens.py), then:

1. baked on the runtime's own engine, through its scheduler beside the requests running: a
   request that reads the prefix in export's chunks (protocol.PREFILL_CHUNK) from an empty
   sequence and hands its state over once read (no torch, no export stack);
2. written as a prefix file (the engine's write_snapshot: the bundle's codec) and read back
   through the engine's own checks;
3. verified: a probe input answered greedily from the stored prefix and from a prefill of the
   prefix, token for token and log-probability for log-probability (PROBE_TOKENS); a mismatch
   refuses the task (an engine fault, not the caller's);
4. stored (bundle/created.py: atomic, checksummed, fingerprinted to the model) and put in the
   bundle's tasks, where every call finds it as it finds an exported task.

Created tasks are text tasks (trained adapters and compressed prefixes are export's). A
runtime of another backend bakes its own prefix of a stored task when it opens; runtimes
sharing a store (replicas) see a task another one created or deleted at their next call of it
(`sync`).
"""

from __future__ import annotations

import queue
import secrets
import threading
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..bundle import prefixfile
from ..bundle.created import CreatedTask, TaskExists, TaskStoreFull, prefix_name
from ..bundle.manifest import TaskInfo, TaskPrefixFile, task_digest
from ..bundle.prefixfile import PREFIX_FORMAT_VERSION
from ..bundle.verify import sha256_file
from ..errors import EngineError, PrefixEdgeError
from ..tasks import TEXT_KEYS, fill_template, ids_sha256, parse_task, prefix_ids, render_task, task_name_problem
from .engines.protocol import PREFILL_CHUNK

TASK_BYTES = 64 << 20     # one created task's prefix file, at most (Runtime.open task_bytes)
STORE_BYTES = 1 << 30     # every created task's prefix files together (task_store_bytes)
MAX_TASKS = 1024          # created tasks in a store
PROBE = "Hello."          # the probe's input, wrapped as the task wraps an input
PROBE_TOKENS = 8
FIELDS = (TEXT_KEYS - {"kind", "compress_prefix"}) | {"name"}  # what a created task takes
WAIT_S = 600.0            # the most a bake or a probe waits for the engine


class UnknownTask(PrefixEdgeError):
    """No task of that name (a server answers 404)."""


class ExportedTask(PrefixEdgeError):
    """An exported task cannot be deleted or replaced (a server answers 403)."""


def _run(sched, req) -> tuple[str, object]:
    """Submit a request and wait for its end: (finish reason, or "error", the error)."""
    sched.submit(req)
    while True:
        try:
            kind, value = req.events.get(timeout=WAIT_S)
        except queue.Empty:
            sched.cancel(req, "timeout")
            raise EngineError("the engine did not finish a created task's bake in time") from None
        if kind == "done":
            return value, None
        if kind == "error":
            return "error", value


class CreatedTasks:
    """A runtime's created tasks: made, verified, stored, deleted and kept in step with its store."""

    def __init__(self, rt, task_bytes: int = TASK_BYTES, store_bytes: int = STORE_BYTES):
        self.rt, self.bundle = rt, rt.bundle
        self.task_bytes, self.store_bytes = task_bytes, store_bytes
        self._lock = threading.Lock()  # one create or delete at a time in this runtime
        self._seen: dict[str, tuple] = {}  # name -> its entry's stat identity when read

    # -- making one --------------------------------------------------------------------------
    def add(self, name, fields: dict) -> dict:
        """Create, bake, verify and store a task; its description (describe)."""
        rt = self.rt
        if not isinstance(fields, dict):
            raise PrefixEdgeError("a task's fields must be an object", param="name")
        for key in ("kind", "adapter", "compress_prefix"):
            if key in fields and not (key == "kind" and fields[key] == "text"):
                raise PrefixEdgeError(f"{key}: a task created at run time is a text task (system, examples "
                                      "or prefix); trained adapters and compressed prefixes are baked "
                                      "by `prefix-edge export`", param=key)
        unknown = sorted(set(fields) - FIELDS - {"kind"})
        if unknown:
            raise PrefixEdgeError(f"unknown field {unknown[0]!r} (a task takes: {', '.join(sorted(FIELDS))})",
                                  param=unknown[0])
        spec = parse_task(name, {k: v for k, v in fields.items() if k != "name"})
        why = self.bundle.created_problem(name)
        if why is not None:
            raise ExportedTask(f"task '{name}': {why}", param="name")
        from .decode.constraint import check_task_defaults

        check_task_defaults([spec], rt.tokenizer, rt.requests._n_vocab, sorted(rt.eos))
        template, special = self.bundle.chat_template()
        try:
            rendered = render_task(spec, template, special)
            ids = prefix_ids(rt.tokenizer, rendered, name, rt.n_ctx)
        except PrefixEdgeError as e:
            field = "examples" if spec.examples else "system" if spec.system is not None else "prefix"
            raise PrefixEdgeError(str(e).replace("the model's context", "the context a request may use"),
                                  param=e.param or field) from None
        info = TaskInfo(kind="text", chat=rendered.chat, prefix_tokens=len(ids), input_before=rendered.input_before,
                        input_after=rendered.input_after, template=rendered.template, defaults=dict(spec.defaults),
                        prefixes={}, chat_messages=[dict(m) for m in rendered.messages] if rendered.chat else None,
                        prefix_sha256=ids_sha256(ids))
        with self._lock:
            store = self.bundle.store
            if name in self.bundle.created or (store.root / name).exists():
                raise TaskExists(f"task '{name}' exists already: delete it first", param="name")
            if len(store.names()) >= MAX_TASKS:
                raise TaskStoreFull(f"the task store holds {MAX_TASKS} tasks, its most: delete one first")
            src, entry = self._bake(name, info, np.asarray(ids, np.int64))
            try:
                if entry.bytes > self.task_bytes:
                    raise PrefixEdgeError(f"task '{name}': its prefix takes {entry.bytes:,} bytes, over this "
                                          f"runtime's {self.task_bytes:,} a task", param="prefix")
                used = store.nbytes()
                if used + entry.bytes > self.store_bytes:
                    raise TaskStoreFull(f"task '{name}': its prefix ({entry.bytes:,} bytes) would take the task "
                                        f"store over its {self.store_bytes:,} bytes ({used:,} used): delete a task first")
                info.prefixes = {rt.backend.name: entry}
                verified = self._verify(name, info, src, ids)
                task = store.create(name, info, {k: v for k, v in fields.items() if k != "name"}, {rt.backend.name: src})
            finally:
                src.unlink(missing_ok=True)
            with rt._prefix_lock:
                rt.prefixes.drop(name)
                self.bundle.add_created(task)
            self._seen[name] = self._stamp(name)
        return {**self.describe(name), "verified": verified}

    def _bake(self, name: str, info: TaskInfo, ids: np.ndarray) -> tuple[Path, TaskPrefixFile]:
        """The prefix read on the runtime's engine in export's chunks, written to a file in the
        store's folder: (its path, its entry)."""
        rt = self.rt
        got: dict = {}
        at = (*range(PREFILL_CHUNK, len(ids), PREFILL_CHUNK), len(ids))

        def keep(backend, r) -> None:  # engine thread: the state once the prefix is read
            got["prefix"] = backend.seq_snapshot(r.seq, ids)

        reason, err = _run(rt._sched, rt.requests.raw(ids, cuts=at, snapshot=keep))
        if "prefix" not in got:
            raise EngineError(f"task '{name}': the engine did not bake its prefix ({err or reason})")
        fp = rt.fingerprint
        store = self.bundle.store
        store.root.mkdir(parents=True, exist_ok=True)
        src = store.root / f".bake-{name}-{secrets.token_hex(4)}.safetensors"
        meta = {"fingerprint": fp, "task": name, "task_digest": task_digest(name, info),
                "prefix_format_version": PREFIX_FORMAT_VERSION}
        try:
            rt.backend.write_snapshot(src, got["prefix"], meta)
        except Exception:
            src.unlink(missing_ok=True)
            raise
        return src, TaskPrefixFile(prefix_name(rt.backend.name, fp), sha256_file(src), src.stat().st_size, fp)

    def _verify(self, name: str, info: TaskInfo, src: Path, ids) -> dict:
        """The stored prefix read back through the engine's checks, and a probe answered from it
        and from a prefill of the prefix: equal token for token, log-probability for
        log-probability, or the task is refused."""
        rt = self.rt
        tensors, meta = prefixfile.read(src)
        prefix = rt.backend.prefix_from(tensors, meta, f"task '{name}'s baked prefix")
        if prefix.n_tokens != len(ids) or meta.get("task_digest") != task_digest(name, info):
            raise EngineError(f"task '{name}': its baked prefix is not the task's")
        probe = np.array(rt.tokenizer.encode(info.input_before + fill_template(info.template, PROBE)
                                             + info.input_after, add_special_tokens=False).ids, np.int64)
        n = min(PROBE_TOKENS, rt.n_ctx - len(ids) - len(probe))
        if n < 1:
            raise PrefixEdgeError(f"task '{name}': its prefix ({len(ids)} tokens) leaves no room for an input "
                                  f"in the {rt.n_ctx} tokens a request may use", param="prefix")
        at = (*range(PREFILL_CHUNK, len(ids), PREFILL_CHUNK), len(ids))
        out = []
        for req in (rt.requests.raw(probe, prefix=prefix, max_tokens=n, logprobs=0),
                    rt.requests.raw(np.concatenate([ids, probe]), cuts=at, max_tokens=n, logprobs=0)):
            reason, err = _run(rt._sched, req)
            if err is not None:
                raise EngineError(f"task '{name}': its probe failed: {err}")
            out.append((list(req.tokens), [lp for _, lp, _ in req.token_logprobs]))
        (baked, lp_b), (prefilled, lp_p) = out
        if baked != prefilled or lp_b != lp_p:
            raise EngineError(f"task '{name}': its baked prefix answers a probe otherwise than its prefill "
                              f"({baked} vs {prefilled}); not stored")
        return {"probe_tokens": len(baked), "baked_equals_prefilled": True}

    # -- the rest ------------------------------------------------------------------------------
    def remove(self, name: str) -> bool:
        """Delete a created task: calls already running finish, new ones find no task."""
        if not isinstance(name, str) or task_name_problem(name):
            raise UnknownTask(f"no created task {name!r}", param="name")
        if name in self.bundle.exported:
            raise ExportedTask(f"task '{name}' is the bundle's own (exported); only created tasks can be deleted",
                               param="name")
        with self._lock:
            gone = self.bundle.store.remove(name)
            with self.rt._prefix_lock:
                known = self.bundle.created.pop(name, None) is not None
                self.bundle.drop_created(name)
                self.rt.prefixes.drop(name)
            self._seen.pop(name, None)
        if not (gone or known):
            raise UnknownTask(f"no created task '{name}'", param="name")
        return True

    def describe(self, name: str) -> dict:
        """What GET /v1/tasks/{name} shows of a task."""
        info = self.bundle.manifest.tasks.get(name)
        if info is None:
            raise UnknownTask(f"no task '{name}'", param="name")
        created = self.bundle.created.get(name)
        out = {"id": name, "object": "task", "origin": "created" if created else "exported",
               "kind": info.kind, "chat": info.chat, "prefix_tokens": info.prefix_tokens,
               "template": info.template, "defaults": dict(info.defaults),
               "backends": sorted(info.prefixes), "bytes": sum(p.bytes for p in info.prefixes.values())}
        if created is not None:
            out.update(created=created.created, fields=dict(created.spec))
        return out

    def info(self) -> dict:
        """/metrics: created tasks and the bytes of their prefix files."""
        created = list(self.bundle.created.values())
        return {"count": len(created), "bytes": sum(t.nbytes for t in created),
                "budget_bytes": self.store_bytes}

    def _stamp(self, name: str) -> tuple | None:
        if task_name_problem(name):
            return None
        try:
            st = (self.bundle.store.root / name / "task.json").stat()
        except (OSError, ValueError):
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def sync(self, name) -> None:
        """Before a call of task `name`: a created task deleted or replaced in the store since
        this runtime read it (another process: a replica, the CLI) is dropped or read again, one
        created there read in (and baked for this engine where its store has no prefix of it)."""
        if not isinstance(name, str) or name in self.bundle.exported or task_name_problem(name):
            return  # (a name no task can have is never looked up on disk: no path from it)
        stamp = self._stamp(name)
        if stamp == self._seen.get(name) and (stamp is None) == (name not in self.bundle.created):
            return
        with self._lock:
            stamp = self._stamp(name)
            with self.rt._prefix_lock:
                self.bundle.drop_created(name)
                self.rt.prefixes.drop(name)
            self._seen[name] = stamp
            if stamp is None:
                return
            try:
                task = self.bundle.store.read_one(name)
            except PrefixEdgeError:
                return  # damaged or half there: not a task (`prefix-edge verify` says why)
            if self.bundle.created_problem(name) is None:
                self._take(task)

    def bake_missing(self) -> list[str]:
        """At open: a prefix baked for this engine's model for each stored task that has none
        (made on a runtime of another backend); one line per task that cannot be."""
        problems = []
        for name, task in list(self.bundle.created.items()):
            self._seen[name] = self._stamp(name)
            try:
                self._take(task)
            except PrefixEdgeError as e:
                with self.rt._prefix_lock:
                    self.bundle.drop_created(name)
                problems.append(f"created task '{name}': {e}")
        return problems

    def _take(self, task: CreatedTask) -> None:
        rt, backend = self.rt, self.rt.backend.name
        entry = task.info.prefixes.get(backend)
        if entry is None or entry.fingerprint != rt.fingerprint:
            info = TaskInfo(**{**asdict(task.info), "prefixes": {}})
            ids = prefixfile.read_ids(task.folder / next(iter(task.info.prefixes.values())).file)
            src, entry = self._bake(task.name, info, ids)
            try:
                task = self.bundle.store.add_prefix(task, backend, entry, src)
            finally:
                src.unlink(missing_ok=True)
            self._seen[task.name] = self._stamp(task.name)
        with rt._prefix_lock:
            self.bundle.add_created(task)
