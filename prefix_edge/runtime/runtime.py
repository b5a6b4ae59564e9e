"""Runtime: open a bundle, look up a task, load its prefix, decode the user's input onward.

Every generate/stream/astream call is a request with its own sequence, run by the runtime's
engine thread (scheduler/loop.py) together with every other request in flight, from any thread.
Options, templates, tokenization and prefix loading happen here in the caller's thread (so a
bad request fails at the call); sampling, stop strings and streaming run in the scheduler.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from ..bundle import BACKENDS, Bundle
from ..errors import PrefixEdgeError, warn
from .engines.protocol import PREFILL_CHUNK, EngineConfig, Opened
from .engines import engine_class
from .engines.overlap import beside, on_own_thread
from .cache.prefixes import PrefixCache
from .scheduler import Scheduler
from .stream import AsyncStream, Result, Stream
from .prepare import Requests
from .embedding import Embedder
from .tasks import STORE_BYTES, TASK_BYTES, CreatedTasks
from .cache.budget import DEFAULT_BYTES as CACHE_BYTES, HostBudget
from .cache.documents import DEFAULT_BYTES as DOCUMENT_CACHE_BYTES, DocumentKv
from .cache.prompts import DEFAULT_BYTES as PROMPT_CACHE_BYTES, PromptCache

if TYPE_CHECKING:
    from .chat.conversation import Conversation

# llama.cpp first: it decodes concurrent requests in one batched step (ONNX runs them one after
# another); which engine is faster alone depends on the CPU (docs/performance.md)
AUTO_ORDER = ("gguf", "onnx")
RESIDENT_BYTES = 256 << 20   # llama.cpp shared_kv: byte budget of resident task prefixes (LRU)


def choose_backend(bundle: Bundle, backend: str) -> str:
    """auto: the first engine of AUTO_ORDER the bundle has whose library is installed and runs
    on this machine (llama.cpp: probed once per build), warning when one is passed over."""
    if backend != "auto":
        if backend not in BACKENDS:
            raise PrefixEdgeError(f"unknown backend {backend!r}; choose one of: auto, {', '.join(BACKENDS)}")
        return backend
    from .engines import installed, unusable

    candidates = [b for b in AUTO_ORDER if b in bundle.backends and installed(b)]
    for i, name in enumerate(candidates[:-1]):
        why = unusable(name, bundle.model_file(name))
        if why is None:
            return name
        warn(f"{why}; using the {candidates[i + 1]} backend")
    return candidates[-1] if candidates else next(iter(bundle.backends), "onnx")


class Runtime:
    """A bundle opened for generation. Thread-safe: any number of requests may be in flight
    from any threads. Use as a context manager or call close()."""

    def __init__(self, bundle: Bundle, opened: Opened, tokenizer, fingerprint: str,
                 prefix_cache_size: int, slots: int = 4, queue_size: int = 64,
                 prefill_chunk: int = PREFILL_CHUNK, resident_bytes: int = RESIDENT_BYTES,
                 verify: str = "cached", prompt_cache_bytes: int = PROMPT_CACHE_BYTES,
                 prompt_cache_disk: tuple[int, int, int] = (0, 2, 256),
                 document_cache_bytes: int = DOCUMENT_CACHE_BYTES, cache_bytes: int = CACHE_BYTES,
                 read_ahead: bool = True, task_bytes: int = TASK_BYTES, task_store_bytes: int = STORE_BYTES):
        backend, manifest = opened.engine, bundle.manifest
        self.bundle, self.root, self.manifest = bundle, bundle.root, manifest
        self.backend, self.tokenizer = backend, tokenizer
        self.fingerprint, self.prefill_chunk = fingerprint, prefill_chunk
        self.host = HostBudget(cache_bytes)  # one budget over the prompt and document caches
        self.prompts = PromptCache(prompt_cache_bytes, prefill_chunk, backend.keeps_partial, self.host)
        disk_bytes, disk_hits, disk_tokens = prompt_cache_disk
        if disk_bytes and prompt_cache_bytes:  # files are read into, and written from, memory
            from ..paths import prompt_cache_dir, secret_key
            from .cache.prompt_files import PromptFiles, root_digest

            try:
                key = secret_key()
            except OSError as e:
                key = None
                warn(f"prompt cache: cannot keep a secret in the home ({e}): prompts are not kept on disk")
            if key is not None:
                self.prompts.files = PromptFiles(prompt_cache_dir(fingerprint, backend.name), disk_bytes,
                                                 backend, fingerprint, prefill_chunk, root_digest(manifest),
                                                 disk_hits, disk_tokens, key)
        self.prefixes = PrefixCache(bundle, backend, fingerprint, prefix_cache_size, verify)
        self._prefix_lock = threading.Lock()
        self.n_ctx = opened.n_ctx  # positions one request may use (prefix + input + output)
        self.shared_kv = opened.shared_kv
        self._sched = Scheduler(backend, slots=slots, queue_size=queue_size,
                                prefill_chunk=prefill_chunk,
                                resident_bytes=resident_bytes if opened.resident_seqs else 0,
                                resident_seqs=opened.resident_seqs, request_seqs=opened.request_seqs,
                                kv_cells=opened.kv_cells)
        self.requests = Requests(bundle, tokenizer, backend, self.n_ctx, self.prefixes, self.prompts,
                                 self._prefix_lock, lambda: self._sched.closed)
        self.documents = DocumentKv(document_cache_bytes, self.host)  # composed documents' KV (compose.py)
        self.requests.documents, self.requests.prefill_chunk = self.documents, prefill_chunk
        if opened.shared_kv and opened.kv_cells:  # no max_tokens: a slot's share of the one cache
            self.requests.open_cells = opened.kv_cells // slots
        self.eos = self.requests.eos
        self.embeddings = Embedder(backend, tokenizer, self.n_ctx)  # embed(): a thread of its own
        from .chat.read_ahead import ReadAhead  # a conversation's reply read for its next turn

        self.read_ahead = ReadAhead(self.requests, self._sched, read_ahead and prompt_cache_bytes > 0)
        self.created_tasks = CreatedTasks(self, task_bytes, task_store_bytes)  # tasks made at run time

    # -- the caller's-thread half (prepare.py), as the API and the server use it ---------
    def options(self, task: str | None, overrides: dict):
        """A task's generation options with `overrides` resolved and checked (OptionError names the field)."""
        return self.requests.options(task, overrides)

    def encode_input(self, task: str, text: str, raw_special_tokens: bool = False):
        """The task's input wrapping around `text`, tokenized (as export and PEFT tokenize it)."""
        return self.requests.encode_input(task, text, raw_special_tokens)

    def chat_input(self, task: str | None, messages: list, tools=None):
        """(ids after the task's prefix, turn cuts, the checked messages) of a conversation."""
        return self.requests.chat_input(task, messages, tools)

    @property
    def token_bytes(self):
        return self.requests.token_bytes

    @property
    def grammars(self):
        return self.requests.grammars

    @property
    def chat_renderer(self):
        return self.requests.chat_renderer

    @classmethod
    def open(cls, path: str | Path | None = None, backend: str = "auto", device: str = "cpu",
             threads: int | None = None, prefix_cache_size: int = 4,
             n_ctx: int | None = None, verify: str = "cached", slots: int = 4,
             queue_size: int = 64, kv_cells: int | None = None,
             resident_bytes: int = RESIDENT_BYTES, prefill_chunk: int = PREFILL_CHUNK,
             shared_kv: bool = False, prompt_cache_bytes: int = PROMPT_CACHE_BYTES,
             turn_cache_bytes: int | None = None, prompt_cache_disk_bytes: int = 0,
             prompt_cache_disk_hits: int = 2, prompt_cache_disk_tokens: int = 256,
             document_cache_bytes: int = DOCUMENT_CACHE_BYTES, cache_bytes: int = CACHE_BYTES,
             priority: str = "normal", read_ahead: bool = True, window_cache: str = "full",
             mtp_head: bool = False, engine: type | None = None, task_store: str | Path | None = None,
             task_bytes: int = TASK_BYTES, task_store_bytes: int = STORE_BYTES) -> "Runtime":
        """Open a bundle. backend: "onnx", "gguf" or "auto" (the one the bundle has, in this order:
        gguf, then onnx, if llama.cpp runs on this machine). n_ctx caps the positions of one
        request (prefix + input + output; default: the model's). slots: requests decoded
        together (more wait in a queue of queue_size). llama.cpp: every slot has a KV stream
        of its own of up to n_ctx cells (default: the model's context, at most 4096), made at
        what the prefixes need and grown as requests use it (a kv_cells given: allocated up
        front, n_ctx capped at kv_cells // slots); a request then gives the tokens of its lone
        run in a fresh runtime whatever runs beside or before it. shared_kv=True instead shares one cache of kv_cells cells (default from the longest
        prefix and slots) between all requests and resident task prefixes (resident_bytes
        their budget): less memory and task switches without a restore, but a greedy answer
        may change with what else is in the cache (near-tie steps). prompt_cache_bytes:
        host memory for the KV of prompts already read, reused by any later request that starts
        with the same tokens: a conversation's next turn, the same documents or system prompt
        again (cache/prompts.py; 0: off; turn_cache_bytes is its earlier name).
        prompt_cache_disk_bytes: disk for the prompts that keep coming back (a hit at the same
        place prompt_cache_disk_hits times, over at least prompt_cache_disk_tokens input tokens),
        kept under the home directory so that a new runtime of this model starts warm
        (prompt_files.py; 0, the default: off; `serve` keeps 2 GiB). document_cache_bytes:
        host memory for documents' KV kept for `compose_documents=True` (compose.py; 0: off,
        every composed document is computed again). cache_bytes: one budget over those two
        (cache/budget.py: the entry used longest ago, in either, goes first; each also keeps
        its own cap). verify: "cached"
        reuses a model file's hash while its stat identity is unchanged (bundle/verify.py);
        "full" always hashes. threads None ("auto"): each forward runs the threads the CPUs have
        free (docs/contention.md). priority "background": for an app whose own work must come
        first (a desktop UI): one thread unless `threads` says otherwise, never spinning, on
        engine threads at a lower OS scheduling priority. read_ahead: after a conversation's
        call (messages) its reply is read into the prompt cache in the background, while the
        runtime is idle, so that the next turn prefills only its new message
        (chat/read_ahead.py); exact (the chunks the next turn would read). window_cache
        (llama.cpp, models with sliding-window layers: Gemma 3, Gemma 3n): "full", the default,
        keeps those layers' cells for every position of a sequence, so a prompt-cache hit and a
        baked prefix give the prefill's logits bit for bit; "window" keeps a ring of the window
        and one batch (llama.cpp's own default: less memory on long contexts, e.g. 45 MB less
        per slot at 4,096 tokens on Gemma 3 270M), where a restored state's attention sums run
        in other lanes than a prefill's and answers may differ at near ties (docs/models.md).
        mtp_head (llama.cpp, a model that ships an MTP head: Qwen3.5): load the head, so that
        speculative="mtp" drafts with it (docs/speculative.md); it costs the head's KV and, on a
        hybrid, snapshots of each slot's recurrent state.
        engine: the Engine class (runtime/engines/protocol.py) that opens the bundle's `backend`
        files in place of the registry's (runtime/engines/__init__.py): an engine of one's own,
        or the test tier's fake. task_store: where tasks created at run time are kept (add_task;
        default: the bundle's `created/` folder); task_bytes, task_store_bytes: the most one
        created task's prefix, and all of them, may take there."""
        from tokenizers import Tokenizer

        bundle = Bundle.open(path, task_store)
        backend = choose_backend(bundle, backend)
        fingerprint, hashes = bundle.check_model(backend, verify)  # refuses a backend it lacks
        for name, value, low in (("slots", slots, 1), ("queue_size", queue_size, 0),
                                 ("prefill_chunk", prefill_chunk, 1), ("resident_bytes", resident_bytes, 0),
                                 ("n_ctx", n_ctx, 16), ("kv_cells", kv_cells, 64),
                                 ("prompt_cache_bytes", prompt_cache_bytes, 0),
                                 ("turn_cache_bytes", turn_cache_bytes, 0),
                                 ("prompt_cache_disk_bytes", prompt_cache_disk_bytes, 0),
                                 ("prompt_cache_disk_hits", prompt_cache_disk_hits, 1),
                                 ("prompt_cache_disk_tokens", prompt_cache_disk_tokens, 1),
                                 ("document_cache_bytes", document_cache_bytes, 0),
                                 ("cache_bytes", cache_bytes, 0), ("task_bytes", task_bytes, 1),
                                 ("task_store_bytes", task_store_bytes, 0)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise PrefixEdgeError(f"{name} must be an integer >= {low}, got {value!r}")
        if slots > 64:
            raise PrefixEdgeError(f"slots must be <= 64, got {slots}")
        from .engines.cpu_share import PRIORITIES

        if window_cache not in ("full", "window"):
            raise PrefixEdgeError(f"window_cache must be 'full' or 'window', got {window_cache!r}")
        if priority not in PRIORITIES:
            raise PrefixEdgeError(f"priority must be one of {', '.join(map(repr, PRIORITIES))}, got {priority!r}")
        for name, flag in (("shared_kv", shared_kv), ("read_ahead", read_ahead), ("mtp_head", mtp_head)):
            if not isinstance(flag, bool):
                raise PrefixEdgeError(f"{name} must be true or false, got {flag!r}")
        longest = max((t.prefix_tokens for t in bundle.tasks.values()), default=0)
        cfg = EngineConfig(device=device, threads=threads, n_ctx=n_ctx, slots=slots,
                           prefill_chunk=prefill_chunk, shared_kv=shared_kv, kv_cells=kv_cells,
                           verify=verify, longest_prefix=longest, priority=priority, window_cache=window_cache,
                           mtp_head=mtp_head)
        def opening():  # the tokenizer loads while the engine's model does (overlap.py)
            with beside(lambda: Tokenizer.from_file(str(bundle.tokenizer_file))) as loading:
                return (engine or engine_class(backend)).from_bundle(bundle, hashes, cfg), loading

        # on a thread that ends: nothing the engine decodes at open stays on this one (overlap.py)
        opened, loading = on_own_thread(opening)
        be = opened.engine
        state = bundle.backend(backend).state
        if be.state_info() != state:
            be.close()
            raise PrefixEdgeError(
                f"bundle {bundle.root}: its {backend} prefixes were baked for KV state {state}, this "
                f"runtime restores {be.state_info()} (another llama.cpp version?); re-export the bundle")
        try:
            tokenizer = loading.result()
        except Exception as e:  # tokenizers raises its own types; give one line
            be.close()
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise PrefixEdgeError(f"bundle {bundle.root}: cannot load its tokenizer: {why}") from None
        rt = cls(bundle, opened, tokenizer, fingerprint, prefix_cache_size, slots=slots,
                 queue_size=queue_size, prefill_chunk=prefill_chunk, resident_bytes=resident_bytes,
                 verify=verify, prompt_cache_bytes=prompt_cache_bytes if turn_cache_bytes is None
                 else turn_cache_bytes,
                 prompt_cache_disk=(prompt_cache_disk_bytes, prompt_cache_disk_hits, prompt_cache_disk_tokens),
                 document_cache_bytes=document_cache_bytes, cache_bytes=cache_bytes, read_ahead=read_ahead,
                 task_bytes=task_bytes, task_store_bytes=task_store_bytes)
        try:  # a stored task made on another backend's runtime: baked for this one now
            for problem in rt.created_tasks.bake_missing():
                warn(f"{problem}; left out")
        except BaseException:
            rt.close()
            raise
        return rt

    # -- API ------------------------------------------------------------------------------
    @property
    def tasks(self) -> dict:
        """Every task by name (the bundle's and those created at run time): its manifest entry."""
        return dict(self.manifest.tasks)

    def add_task(self, name: str, **fields) -> dict:
        """Create a task at run time from a task file's fields (system, examples, prefix,
        template, chat, generation defaults such as max_tokens or json_schema): checked as
        export checks a task file's, its prefix baked on this runtime's engine, verified (a probe
        answered from it equals its prefill's answer), stored beside the bundle (task_store) and
        served from then on, by this runtime and by any opened on the bundle later. Its
        description (task_info) and {"verified": ...}. Errors name the field (`param`)."""
        return self.created_tasks.add(name, fields)

    def remove_task(self, name: str) -> None:
        """Delete a task created at run time: calls running finish, new ones find no task.
        The bundle's own (exported) tasks cannot be deleted."""
        self.created_tasks.remove(name)

    def has_task(self, name: str) -> bool:
        """Whether `name` is a task now (one created or deleted by another process sharing the
        task store seen too)."""
        self.created_tasks.sync(name)
        return name in self.manifest.tasks

    def task_info(self, name: str) -> dict:
        """What a task is: origin (exported / created), kind, chat, prefix tokens, defaults,
        bytes, and for a created one when and from which fields."""
        self.created_tasks.sync(name)
        return self.created_tasks.describe(name)

    @property
    def threads(self) -> int | None:
        """Threads the engine computes with (default: this process's physical cores)."""
        return self.backend.threads

    @property
    def closed(self) -> bool:
        return self._sched.closed

    def generate(self, task: str | None, text: str | None = None, timeout: float | None = None, *,
                 messages: list | None = None, **overrides) -> Result:
        """Run one request to its end: `text` (the task's input; task None: a plain prompt to the
        base model; or token ids, placed after the prefix as given) or `messages` (a
        conversation, rendered by the model's chat template after the task's prefix; task None:
        the base model, no prefix). No max_tokens (nor the task's): to the end of the context. With `timeout` (seconds) a request still running then is cancelled
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
                                  f"runtime's slots), got {n!r}", param="n")
        self.created_tasks.sync(task)  # a task created or deleted by another process since
        try:
            req = self.requests.request(task, text, overrides, messages)
        except KeyError:  # its task deleted meanwhile (remove_task): as a call of no such task
            if task in self.manifest.tasks:
                raise
            raise PrefixEdgeError(f"unknown task {task!r}; this bundle has: "
                                  f"{', '.join(sorted(self.manifest.tasks)) or 'no tasks'}") from None
        for i in range(1, n):
            sib = self.requests.sibling(req, i, overrides)
            req.siblings.append(sib)
        self._sched.submit(req)
        return [Stream(r, self._finished, self._sched.cancel) for r in [req, *req.siblings]]

    def _finished(self, req, finish_reason: str) -> Result:
        result = self.requests.result(req, finish_reason)
        self.read_ahead.after(req, result, finish_reason)  # a conversation's reply, for its next turn
        return result

    def astream(self, task: str | None, text: str | None = None, *, messages: list | None = None,
                **overrides) -> AsyncStream:
        """`async for chunk in rt.astream(...)`: the asyncio counterpart of stream() (same
        `result` and `cancel()`). Leaving the loop early (break, task cancelled) cancels it."""
        return AsyncStream(self.stream(task, text, messages=messages, **overrides))

    def embed(self, texts, pooling: str = "prompt", normalize: bool = True):
        """Sentence embeddings from the bundle's model: a float32 array (len(texts), hidden size).
        texts: a string, a list of strings, or token ids (a list of ints, or a list of such lists),
        tokenized as they are (no chat template, no task prefix). pooling: "prompt" (the
        default: the text in PromptEOL's prompt, its last state; retrieval measured best),
        "mean" over the text's tokens or "last" (the last token's final hidden state);
        normalize: L2 to unit length. Calls from any thread are batched together by the embedder's own thread
        (runtime/embedding.py); docs/embeddings.md."""
        return self.embeddings.embed(texts, pooling, normalize)

    def chat(self, task: str | None = None, system: str | None = None, **defaults) -> "Conversation":
        """A conversation with a task (None: the base model): `.send(text)` / `.stream(text)`
        keep its history; `.save(path)` / `Runtime.resume(path)` carry it across processes."""
        from .chat.conversation import Conversation

        return Conversation(self, task, system=system, **defaults)

    def resume(self, path: str | Path, signed: bool = False) -> "Conversation":
        """A conversation saved with Conversation.save(), its KV put back in the turn cache when
        it was saved from this bundle (same fingerprint), else re-read on its next turn.
        signed: it must have been saved with signed=True in this home (its MAC)."""
        from .chat.conversation import Conversation

        return Conversation.load(self, path, signed)

    def close(self) -> None:
        """Refuse new requests, end the running ones (finish_reason "cancelled") and give the
        engine's native memory back. Safe to call twice and from any thread."""
        self.embeddings.close()  # its llama.cpp contexts go before the engine's model
        self.read_ahead.close()
        self._sched.close()  # a reply being read ahead ends here ("cancelled")
        self.read_ahead.join()
        with self._prefix_lock:
            self.prefixes.clear()
        self.prompts.close()  # the file writes asked for finish first

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # a runtime dropped without close(): its engine thread still ends
        try:
            if hasattr(self, "embeddings"):  # its thread and llama.cpp contexts, before the model
                self.embeddings.close()
            self._sched.close(wait=False)
        except Exception:
            pass

    def unload(self, task: str) -> bool:
        """Drop a task's prefix from memory (the next request reads its file again); whether
        it was loaded. A request already running keeps its own reference."""
        with self._prefix_lock:
            return self.prefixes.drop(task)

    def memory(self) -> dict[str, dict]:
        """Host memory each of the runtime's stores holds now and its budget, in bytes (the
        budgets sum to a bound): the prompt and document caches under their one budget
        (host_cache; each one's own in engine_info()), the loaded task prefixes, the resident prefixes (llama.cpp shared_kv:
        cells of its KV cache) and the engine's spare KV buffers (onnx)."""
        s = self._sched
        with self._prefix_lock:
            prefixes = self.prefixes.info()
        out = {"host_cache": self.host.info(),
               "task_prefixes": prefixes,
               "resident_prefixes": {"bytes": sum(r["bytes"] for r in s.resident_info().values()),
                                     "budget_bytes": s.residents.budget_bytes}}
        out.update(self.backend.memory_info())
        return {k: {"bytes": v["bytes"], "budget_bytes": v["budget_bytes"]} for k, v in out.items()}

    def engine_info(self) -> dict:
        """What the engine holds now: resident prefixes, active/waiting requests, counters."""
        s = self._sched
        cells = s.kv_cells  # shared cache: the cells it counts; a stream per slot: all of them
        if cells is None:  # llama.cpp: a stream per slot, all of them allocated (ONNX: None)
            cells = self.backend.kv_cells_total
        return {"backend": self.backend.name, "slots": s.slots, "kv_cells": cells,
                "n_ctx": self.n_ctx, "shared_kv": self.shared_kv,
                "active": len(s.active), "waiting": len(s.waiting),
                "residents": s.resident_info(), "prompt_cache": self.prompts.info(),
                "document_cache": self.documents.info(), "host_cache": self.host.info(),
                "created_tasks": self.created_tasks.info(),
                "embeddings": self.embeddings.info(), "read_ahead": self.read_ahead.info(),
                # what one more token in a decode forward costs here, as a share of a step
                # (measured from this runtime's forwards; drafting sizes lookups by it)
                "draft_row_cost": round(s.drafting.cost.share(), 3), **s.stats}
