"""Runtime: open a bundle, look up a task, load its prefix, decode the user's input onward.

Every generate/stream/astream call is a request with its own sequence, run by the runtime's
engine thread (scheduler.py) together with every other request in flight, from any thread.
Options, templates, tokenization and prefix loading happen here in the caller's thread (so a
bad request fails at the call); sampling, stop strings and streaming run in the scheduler.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from ..bundle import Manifest
from ..errors import PrefixEdgeError
from .backend import BACKENDS, MODEL_SUFFIX, open_backend
from .prefix_cache import PrefixCache
from .scheduler import Scheduler
from .stream import AsyncStream, Result, Stream
from .prepare import Requests
from .turn_cache import DEFAULT_BYTES as TURN_CACHE_BYTES, TurnCache
from ..bundle.verify import file_hashes

if TYPE_CHECKING:
    from .conversation import Conversation

AUTO_ORDER = ("gguf", "onnx")  # by measured decode speed on CPU (README, Performance)
GGUF_CTX_DEFAULT = 4096      # llama.cpp: positions per request unless n_ctx says otherwise
GGUF_CTX_CAP = 1 << 15       # shared_kv: positions per request unless n_ctx says otherwise
REQUEST_CELLS = 512          # shared_kv: cells per slot by default (input + default max_tokens)
RESIDENT_SEQS = 16           # shared_kv: llama.cpp sequences kept for resident task prefixes
RESIDENT_BYTES = 256 << 20   # their byte budget (LRU beyond it)


def _importable(backend: str) -> bool:
    import importlib.util

    return importlib.util.find_spec({"onnx": "onnxruntime", "gguf": "llama_cpp"}[backend]) is not None


def _gguf_file(root: Path, manifest: Manifest) -> Path | None:
    files = [f for f in manifest.backends["gguf"].files if f.endswith(MODEL_SUFFIX["gguf"])]
    return (root / files[0]) if files and (root / files[0]).is_file() else None


def _llama_or_onnx(root: Path, manifest: Manifest) -> str:
    """auto: gguf if llama.cpp runs on this machine (probed once per build), else onnx."""
    from .probe import llama_verdict, warn

    v = llama_verdict(_gguf_file(root, manifest))
    if v is not None and not v.ok:
        warn(f"{v.detail}; using the onnx backend")
        return "onnx"
    return "gguf"


class Runtime(Requests):
    """A bundle opened for generation. Thread-safe: any number of requests may be in flight
    from any threads. Use as a context manager or call close()."""

    def __init__(self, root: Path, manifest: Manifest, backend, tokenizer, fingerprint: str,
                 prefix_cache_size: int, n_ctx: int, slots: int = 4, queue_size: int = 64,
                 prefill_chunk: int = 128, resident_bytes: int = RESIDENT_BYTES,
                 kv_cells: int | None = None, verify: str = "cached", shared_kv: bool = False,
                 turn_cache_bytes: int = TURN_CACHE_BYTES):
        self.root, self.manifest, self.backend, self.tokenizer = root, manifest, backend, tokenizer
        self.fingerprint, self.prefill_chunk = fingerprint, prefill_chunk
        self.turns = TurnCache(turn_cache_bytes)
        self.prefixes = PrefixCache(root, manifest, backend, fingerprint, prefix_cache_size, verify)
        self._prefix_lock = threading.Lock()
        self.n_ctx = n_ctx  # positions one request may use (prefix + input + output)
        self.eos = set(manifest.model.eos_token_ids)
        self.last_result: Result | None = None
        self._special_ids = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
        self.shared_kv = shared_kv and backend.name == "gguf"
        if self.shared_kv:  # seq 0: the one-sequence API; then requests; then residents
            req = tuple(range(1, slots + 1))
            resident = tuple(range(slots + 1, backend.n_seq_max))
        else:
            req, resident, resident_bytes = tuple(range(slots)), (), 0
        self._sched = Scheduler(backend, slots=slots, queue_size=queue_size,
                                prefill_chunk=prefill_chunk, resident_bytes=resident_bytes,
                                resident_seqs=resident, request_seqs=req, kv_cells=kv_cells)

    @classmethod
    def open(cls, path: str | Path | None = None, backend: str = "auto", device: str = "cpu",
             threads: int | None = None, prefix_cache_size: int = 4,
             n_ctx: int | None = None, verify: str = "cached", slots: int = 4,
             queue_size: int = 64, kv_cells: int | None = None,
             resident_bytes: int = RESIDENT_BYTES, prefill_chunk: int = 128,
             shared_kv: bool = False, turn_cache_bytes: int = TURN_CACHE_BYTES) -> "Runtime":
        """Open a bundle. backend: "onnx", "gguf" or "auto" (the faster one the bundle has:
        gguf, then onnx, if llama.cpp runs on this machine). n_ctx caps the positions of one
        request (prefix + input + output; default: the model's). slots: requests decoded
        together (more wait in a queue of queue_size). llama.cpp: every slot has a KV stream
        of its own, n_ctx cells (default: the model's context, at most 4096), allocated up front
        (kv_cells = slots * n_ctx; a kv_cells given caps n_ctx at kv_cells // slots); a request
        then gives the tokens of its lone run in a fresh runtime whatever runs beside or before
        it. shared_kv=True instead shares one cache of kv_cells cells (default from the longest
        prefix and slots) between all requests and resident task prefixes (resident_bytes
        their budget): less memory and task switches without a restore, but a greedy answer
        may change with what else is in the cache (near-tie steps). turn_cache_bytes: host
        memory for the KV of conversations so far (turn_cache.py; 0: off). verify: "cached"
        reuses a model file's hash while its stat identity is unchanged (runtime/verify.py);
        "full" always hashes."""
        from tokenizers import Tokenizer

        from ..paths import default_bundle

        root = Path(path) if path is not None else default_bundle()
        if path is None and not (root / "manifest.json").is_file():
            raise PrefixEdgeError(
                f"no default bundle at {root}; create it with: prefix-edge export")
        manifest = Manifest.read(root)
        probed = False  # llama.cpp's verdict is looked up once per open
        if backend == "auto":
            backend = next((b for b in AUTO_ORDER if b in manifest.backends and _importable(b)),
                           next(iter(manifest.backends), "onnx"))
            if backend == "gguf" and "onnx" in manifest.backends and _importable("onnx"):
                backend, probed = _llama_or_onnx(root, manifest), True
        if backend == "gguf" and "gguf" in manifest.backends and not probed:
            from .probe import require_llama

            require_llama(_gguf_file(root, manifest))  # a crashing build is an error, not a crash
        if backend not in BACKENDS:
            raise PrefixEdgeError(f"unknown backend {backend!r}; choose one of: auto, {', '.join(BACKENDS)}")
        if backend not in manifest.backends:
            raise PrefixEdgeError(f"bundle {root} has no {backend} model (it has: "
                                  f"{', '.join(manifest.backends) or 'none'})")
        info = manifest.backends[backend]
        actual = file_hashes(root, info.files, verify)
        for rel, sha in actual.items():
            if sha != info.files[rel]:
                raise PrefixEdgeError(f"bundle {root}: model file {rel} does not match its manifest "
                                      "entry (changed after export); re-export the bundle")
        tok_hash = file_hashes(root, [manifest.tokenizer.file], verify)[manifest.tokenizer.file]
        if tok_hash != manifest.tokenizer.sha256:
            raise PrefixEdgeError(f"bundle {root}: {manifest.tokenizer.file} does not match the manifest")
        fingerprint = manifest.fingerprint(backend, actual)
        if fingerprint != info.fingerprint:
            raise PrefixEdgeError(
                f"bundle {root}: the manifest's {backend} fingerprint does not match its contents "
                "(the manifest was edited or the bundle is mixed); re-export the bundle")
        for name, value, low in (("slots", slots, 1), ("queue_size", queue_size, 0),
                                 ("prefill_chunk", prefill_chunk, 1), ("resident_bytes", resident_bytes, 0),
                                 ("n_ctx", n_ctx, 16), ("kv_cells", kv_cells, 64),
                                 ("turn_cache_bytes", turn_cache_bytes, 0)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise PrefixEdgeError(f"{name} must be an integer >= {low}, got {value!r}")
        if slots > 64:
            raise PrefixEdgeError(f"slots must be <= 64, got {slots}")
        if not isinstance(shared_kv, bool):
            raise PrefixEdgeError(f"shared_kv must be true or false, got {shared_kv!r}")
        ctx = manifest.model.n_ctx
        if backend == "gguf":
            ctx = min(ctx, GGUF_CTX_CAP if shared_kv else GGUF_CTX_DEFAULT)
        ctx = min(manifest.model.n_ctx, n_ctx) if n_ctx else ctx
        if backend == "gguf" and not shared_kv and kv_cells is not None:
            ctx = min(ctx, kv_cells // slots)
        longest = max((t.prefix_tokens for t in manifest.tasks.values()), default=0)
        if longest >= ctx:
            raise PrefixEdgeError(f"the bundle's longest task prefix ({longest} tokens) does not fit "
                                  f"n_ctx={ctx}; raise n_ctx")
        model_file = next(f for f in info.files if f.endswith(MODEL_SUFFIX[backend]))
        extra = {}
        if backend == "gguf":
            from .llama_lib import gguf_state_options

            if shared_kv:
                if kv_cells is None:  # residents of the longest prefix + room for every slot
                    kv_cells = min(2 * longest + slots * REQUEST_CELLS, slots * ctx)
                    kv_cells = max(1024, -(-kv_cells // 256) * 256)
                n_seq = 1 + slots + RESIDENT_SEQS
            else:  # a stream per slot, of ctx cells (llama.cpp rounds a stream up to 256 cells)
                kv_cells, n_seq = slots * ctx, slots
            extra = {"n_seq_max": n_seq, "n_batch": max(512, prefill_chunk), "kv_unified": shared_kv,
                     **gguf_state_options(info.state)}
        else:
            # the model's hash (checked above) keys the session cache, whose files are verified alike
            kv_cells, extra = None, {"verify": verify, "model_sha256": actual[model_file]}
        be = open_backend(backend, root / model_file, device=device, threads=threads,
                          n_ctx=kv_cells or ctx, **extra)
        if backend == "gguf" and not shared_kv:
            ctx, kv_cells = min(ctx, be.n_ctx_seq), None  # a request's stream is its own: nothing shared to count
        if be.state_info() != info.state:
            be.close()
            raise PrefixEdgeError(
                f"bundle {root}: its {backend} prefixes were baked for KV state {info.state}, this "
                f"runtime restores {be.state_info()} (another llama.cpp version?); re-export the bundle")
        tokenizer = Tokenizer.from_file(str(root / manifest.tokenizer.file))
        return cls(root, manifest, be, tokenizer, fingerprint, prefix_cache_size, n_ctx=ctx,
                   slots=slots, queue_size=queue_size, prefill_chunk=prefill_chunk,
                   resident_bytes=resident_bytes, kv_cells=kv_cells, verify=verify,
                   shared_kv=shared_kv, turn_cache_bytes=turn_cache_bytes)

    # -- API ------------------------------------------------------------------------------
    @property
    def tasks(self) -> dict:
        return dict(self.manifest.tasks)

    @property
    def threads(self) -> int | None:
        """Threads the engine computes with (default: this process's physical cores)."""
        return self.backend.threads

    @property
    def closed(self) -> bool:
        return self._sched.closed

    def generate(self, task: str | None, text: str | None = None, timeout: float | None = None, *,
                 messages: list | None = None, **overrides) -> Result:
        """Run one request to its end: `text` (the task's input) or `messages` (a conversation,
        rendered by the model's chat template after the task's prefix; task None: the base
        model, no prefix). With `timeout` (seconds) a request still running then is cancelled
        and returns what it has, with finish_reason "timeout"."""
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout > 0):
            raise PrefixEdgeError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        h = self.stream(task, text, messages=messages, **overrides)
        return h.wait(timeout)

    def stream(self, task: str | None, text: str | None = None, *, messages: list | None = None,
               **overrides) -> Stream:
        """Start a request; iterate the returned Stream for its text chunks (its `result` is
        set at the end), or `cancel()` it from any thread."""
        return self.choices(task, text, messages=messages, n=1, **overrides)[0]

    def choices(self, task: str | None, text: str | None = None, *, messages: list | None = None,
                n: int = 1, **overrides) -> list[Stream]:
        """n answers to one input: one prefill, then each choice decodes from a copy of its KV
        (choice i > 0 samples with seed + i when a seed is given). A Stream per choice."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self._sched.slots:
            raise PrefixEdgeError(f"n must be an integer in [1, {self._sched.slots}] (this "
                                  f"runtime's slots), got {n!r}")
        req = self._request(task, text, overrides, messages)
        for i in range(1, n):
            sib = self._sibling(req, i, overrides)
            req.siblings.append(sib)
        self._sched.submit(req)
        return [Stream(r, self._finished, self._sched.cancel) for r in [req, *req.siblings]]

    def _finished(self, req, finish_reason: str) -> Result:
        self.last_result = self._result(req, finish_reason)
        return self.last_result

    def astream(self, task: str | None, text: str | None = None, *, messages: list | None = None,
                **overrides) -> AsyncStream:
        """`async for chunk in rt.astream(...)`: the asyncio counterpart of stream() (same
        `result` and `cancel()`). Leaving the loop early (break, task cancelled) cancels it."""
        return AsyncStream(self.stream(task, text, messages=messages, **overrides))

    def chat(self, task: str | None = None, system: str | None = None, **defaults) -> "Conversation":
        """A conversation with a task (None: the base model): `.send(text)` / `.stream(text)`
        keep its history; `.save(path)` / `Runtime.resume(path)` carry it across processes."""
        from .conversation import Conversation

        return Conversation(self, task, system=system, **defaults)

    def resume(self, path: str | Path) -> "Conversation":
        """A conversation saved with Conversation.save(), its KV put back in the turn cache when
        it was saved from this bundle (same fingerprint), else re-read on its next turn."""
        from .conversation import Conversation

        return Conversation.load(self, path)

    def close(self) -> None:
        """Refuse new requests, end the running ones (finish_reason "cancelled") and give the
        engine's native memory back. Safe to call twice and from any thread."""
        self._sched.close()
        with self._prefix_lock:
            self.prefixes.clear()
        self.turns.clear()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # a runtime dropped without close(): its engine thread still ends
        try:
            self._sched.close(wait=False)
        except Exception:
            pass

    def unload(self, task: str) -> bool:
        """Drop a task's prefix from memory (the next request reads its file again); whether
        it was loaded. A request already running keeps its own reference."""
        with self._prefix_lock:
            return self.prefixes.drop(task)

    def engine_info(self) -> dict:
        """What the engine holds now: resident prefixes, active/waiting requests, counters."""
        s = self._sched
        cells = s.kv_cells  # shared cache: the cells it counts; a stream per slot: all of them
        if cells is None and self.backend.name == "gguf":
            cells = self.backend.n_ctx
        return {"backend": self.backend.name, "slots": s.slots, "kv_cells": cells,
                "n_ctx": self.n_ctx, "shared_kv": self.shared_kv,
                "active": len(s.active), "waiting": len(s.waiting),
                "residents": s.resident_info(), "turn_cache": self.turns.info(), **s.stats}
