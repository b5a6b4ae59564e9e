"""Scheduler: one engine thread per Runtime owns the native context and steps every active
request together.

Requests come from any thread (or several generators on one thread). Each gets its own
sequence in the engine. Between steps the engine thread admits waiting requests (a bounded
queue: a full one is an error, not a hang), drops cancelled ones (their sequence is freed at
once), and then runs ONE forward over every active sequence: one token for each decoding
request, plus a prefill chunk (<= `prefill_chunk` tokens) for requests still reading their
input, so a long input neither blocks the others nor delays a cancel by more than one chunk.
What a step runs is planned first, as data (plan.py), then run.

Shared prefixes (llama.cpp): a task's baked prefix is restored once into a *resident* sequence;
a request of that task starts as `seq_cp` of it, so N requests hold one copy of the prefix cells
(unified KV cache) and a task switch is a `seq_cp`, not a restore. Resident prefixes are kept
within a byte budget, least recently used evicted first (never one in use): residents.py. The KV cache has a
fixed number of cells: a request reserves input + max_tokens cells on admission and waits while
they are not free.

Sampling, stop strings and detokenization run here too, per request; a request's consumer
only reads events (text chunks, then a Result or an error) from its queue. A request with
speculative="lookup" forwards a draft after its next token and keeps what the model agrees
with (drafting.py).
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref

import numpy as np

from ...errors import EngineError, PrefixEdgeError, RuntimeBusy, RuntimeClosed, engine_error
from ..decode.sampling import token_logprobs
from ..engines.protocol import PREFILL_CHUNK
from .drafting import Drafting
from .plan import Compose, Forward, Prefill, Verify, plan
from .request import Request
from .residents import Residents


class Scheduler:
    def __init__(self, backend, slots: int = 4, queue_size: int = 64, prefill_chunk: int = PREFILL_CHUNK,
                 resident_bytes: int = 0, resident_seqs: tuple[int, ...] = (),
                 request_seqs: tuple[int, ...] = (), kv_cells: int | None = None):
        self.backend = backend
        self.slots = slots
        self.queue_size = queue_size
        self.prefill_chunk = max(1, prefill_chunk)
        self.n_batch = backend.n_batch if backend.n_batch is not None else 1 << 30  # None: unbounded
        self.free_seqs = list(request_seqs)
        self.kv_cells = kv_cells  # None: no cell accounting (ONNX)
        self.active: list[Request] = []
        self.waiting: list[Request] = []
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._n_waiting = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self.stats = {"steps": 0, "resident_restores": 0, "resident_hits": 0, "forward_tokens": 0,
                      "drafted": 0, "accepted": 0}
        self.residents = Residents(backend, resident_bytes, resident_seqs, self.stats)
        self.drafting = Drafting(backend, self.stats)
        self._thread = threading.Thread(target=self._loop, name="prefix-edge-engine", daemon=True)
        self._thread.start()
        atexit.register(_close_at_exit, weakref.ref(self))  # never exit inside a native call

    # -- any thread -----------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        with self._lock:
            if self._closing:
                raise RuntimeClosed("the runtime is closed")
            if req.call.background and not self.idle_for_background():
                raise RuntimeBusy("busy: a reply is read ahead only while the runtime is idle")
            if self._n_waiting >= self.queue_size:
                raise RuntimeBusy(f"the runtime is busy: {self._n_waiting} requests are "
                                      "already waiting (queue_size); retry later")
            self._n_waiting += 1
            self._inbox.put(req)
        self._wake.set()

    def idle_for_background(self) -> bool:
        """Nothing waits and a slot is free (a background request may start)."""
        return not self._n_waiting and len(self.active) < self.slots

    def cancel(self, req: Request, reason: str = "cancelled") -> None:
        if req.cancel_reason is None:
            req.cancel_reason = reason
        self._wake.set()

    def close(self, timeout: float = 30.0, wait: bool = True) -> None:
        with self._lock:
            self._closing = True
        self._wake.set()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def run_in_engine(self, fn, timeout: float = 60.0):
        """Run fn(scheduler) on the engine thread between two steps (a consistent view of the
        native state, touched by its one thread); return its result."""
        from concurrent.futures import Future

        fut: Future = Future()
        if self._closing:
            raise RuntimeClosed("the runtime is closed")
        self._calls.put((fn, fut))
        self._wake.set()
        return fut.result(timeout)

    @property
    def closed(self) -> bool:
        return self._closing

    def resident_info(self) -> dict[str, dict]:
        return self.residents.info()

    # -- the engine thread ----------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                self._drain()
                self._run_calls()
                if self._closing:
                    break
                try:
                    self._reap()
                    self._admit()
                    if not self.active:
                        self._wake.wait(0.5)
                        self._wake.clear()
                        continue
                    self._step()
                except Exception as e:  # a bug must end the requests involved, not the engine
                    err = engine_error(e, "internal engine error")
                    for r in list(self.active):
                        self._finish(r, "error", err)
        finally:
            self._drain()
            for r in self.active + self.waiting:
                self._finish(r, "cancelled")
            while True:
                try:
                    _fn, fut = self._calls.get_nowait()
                except queue.Empty:
                    break
                fut.set_exception(RuntimeClosed("the runtime is closed"))
            self.residents.clear()
            self.backend.close()  # the native memory goes back with the engine thread

    def _run_calls(self) -> None:
        while True:
            try:
                fn, fut = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                fut.set_result(fn(self))
            except BaseException as e:
                fut.set_exception(e)

    def _drain(self) -> None:
        while True:
            try:
                self.waiting.append(self._inbox.get_nowait())
            except queue.Empty:
                return

    def _reap(self) -> None:
        for r in [r for r in self.active + self.waiting if r.cancel_reason]:
            self._finish(r, r.cancel_reason)

    def _unqueue(self, r: Request) -> None:
        self.waiting.remove(r)
        with self._lock:
            self._n_waiting -= 1

    def _finish(self, r: Request, reason: str, error: Exception | None = None) -> None:
        if r.done:
            return
        r.done = True
        if r in self.active:
            self.active.remove(r)
        elif r in self.waiting:
            self._unqueue(r)
        if r.seq >= 0:
            if r.snapshot is not None and error is None:
                self._keep_prompt(r)  # its first token ended it (max_tokens 1, EOS, a stop)
            self.backend.seq_free(r.seq)
            self.free_seqs.append(r.seq)
            r.seq = -1
        if r.uses_resident:
            self.residents.release(r.call.prefix_key)
            r.uses_resident = False
        r.reserved = 0
        for sib in r.siblings:  # choices not forked yet end with their first one
            if not sib.forked:
                self._finish(sib, reason, error)
        if error is not None:
            r.emit("error", error)
        else:
            tail = r.text.flush()
            if tail:
                r.chunks.append(tail)
                r.emit("text", tail)
            r.emit("done", reason)

    # cells ------------------------------------------------------------------------------
    def _cells_used(self) -> int:
        return self.residents.cells() + sum(r.reserved for r in self.active)

    def _free_cells_for(self, need: int, keep: str | None) -> bool:
        """Make `need` KV cells free (evicting unused resident prefixes if needed)."""
        return self.kv_cells is None or self.residents.evict_until(
            lambda: self.kv_cells - self._cells_used() >= need, keep)

    def _admit(self) -> None:
        if any(not w.call.background for w in self.waiting) and not self.free_seqs:
            for bg in [a for a in self.active if a.call.background]:  # a reply read ahead gives way
                self._finish(bg, "cancelled")
        while self.waiting and self.free_seqs:
            # FIFO among calls; a reply read ahead only when no call waits
            r = next((w for w in self.waiting if not w.call.background), self.waiting[0])
            if len(self.free_seqs) < 1 + len(r.siblings) and self.active:
                return  # its choices need a sequence each: wait for running requests (FIFO)
            try:
                if not self._start(r):
                    return  # no room yet: wait for running requests to finish (FIFO)
            except EngineError as e:
                self._finish(r, "error", e)
                continue
            except PrefixEdgeError as e:  # the request itself (too large for the cache): the caller's
                self._finish(r, "error", e)
                continue
            except Exception as e:  # never let the engine thread die
                self._finish(r, "error", engine_error(e, "internal error"))
                continue
            self._unqueue(r)
            self.active.append(r)

    def _start(self, r: Request) -> bool:
        """Give `r` a sequence with its prefix in place; False if the cache has no room yet."""
        t = time.perf_counter()
        n_prefix = (r.call.prefix.n_tokens if r.call.prefix_keep is None else r.call.prefix_keep) \
            if r.call.prefix is not None else 0
        own = len(r.call.ids) + r.call.max_tokens + (r.compose.n_tokens if r.compose is not None else 0)
        shared = (r.call.prefix is not None and r.call.prefix_key is not None
                  and (r.call.prefix_key in self.residents or self.residents.can_hold(r.call.prefix)))
        # a prefix already resident costs no new cells; any other is restored once
        need = own + (0 if shared and r.call.prefix_key in self.residents else n_prefix)
        if self.kv_cells is not None and need > self.kv_cells:
            raise PrefixEdgeError(f"the request needs {need} KV cells (prefix {n_prefix} + input "
                                  f"{len(r.call.ids)} + max_tokens {r.call.max_tokens}), the cache has "
                                  f"{self.kv_cells}; lower max_tokens or open with a larger kv_cells")
        if not self._free_cells_for(need, r.call.prefix_key if shared else None):
            if not self.active:  # nothing will free cells: cannot happen unless residents are pinned
                raise EngineError("no free KV cells for this request")
            return False
        seq = self.free_seqs.pop()
        try:
            if shared:
                res = self.residents.acquire(r.call.prefix_key, r.call.prefix)
                r.uses_resident = True
                self.backend.seq_copy(res.seq, seq)
                r.reserved = own
            else:
                self.backend.seq_restore(seq, r.call.prefix, r.call.prefix_keep)
                r.reserved = own + n_prefix
        except BaseException as e:
            self.backend.seq_free(seq)
            self.free_seqs.append(seq)
            if isinstance(e, Exception):  # the engine's restore or copy failed: not the caller's
                raise engine_error(e) from None
            raise
        r.seq, r.pos = seq, n_prefix
        r.restore_ms += (time.perf_counter() - t) * 1e3
        for sib in r.siblings:  # idle (all input "read") until the fork gives them r's KV
            if len(self.free_seqs) == 0:
                raise PrefixEdgeError(f"n={1 + len(r.siblings)} choices need as many free slots")
            sib.seq, sib.fed, sib.reserved = self.free_seqs.pop(), len(sib.call.ids), sib.call.max_tokens
            self.active.append(sib)
        return True

    # the step ---------------------------------------------------------------------------
    def _step(self) -> None:
        """One step, planned as data (plan.py), then run: compositions, the decoding requests'
        forward(s), a forward per prefill chunk."""
        step = plan(self.active, self.n_batch, self.prefill_chunk, self.backend.batches_sequences,
                    self.drafting.draft)
        for unit in step.compose:
            self._compose(unit)
        for fwd in step.decode:  # timed: what a verified row costs here (drafting.RowCost)
            self._forward(fwd, timed=True)
        for fwd in step.prefill:
            self._forward(fwd)

    def _compose(self, unit: Compose) -> None:
        """The next unit of a request's composition."""
        r = unit.r
        try:
            r.compose.advance(self.backend, r)
        except Exception as e:
            self._finish(r, "error", engine_error(e, "engine error while composing documents"))

    def _forward(self, fwd: Forward, timed: bool = False) -> None:
        """One engine forward of `fwd`'s work; each item's logits to its request."""
        try:
            t0 = time.perf_counter()
            logits = self.backend.forward([w.item for w in fwd])
            if timed:
                self.drafting.cost.observe(sum(w.n for w in fwd), time.perf_counter() - t0)
        except Exception as e:
            err = engine_error(e)
            for w in fwd:
                self._finish(w.r, "error", err)
            return
        self.stats["steps"] += 1
        self.stats["forward_tokens"] += sum(w.n for w in fwd)
        for w, lg in zip(fwd, logits):
            r = w.r
            if isinstance(w, Verify):  # rows of logits: the token, then the draft's
                self.drafting.verify(r, lg, list(w.draft), self._sample, self._finish)
                continue
            r.pos += w.n
            if isinstance(w, Prefill):
                r.fed += w.n
                if r.midpoint is not None and r.fed == r.midpoint[0]:
                    self._keep_midpoint(r)
                if not w.last:
                    continue
            if not r.cancel_reason:
                first = r.n_samples == 0
                if first:
                    self._prompt_read(r, lg)
                self._sample(r, lg)
                if first and not r.done:
                    self._keep_prompt(r)  # after the first token is out: no TTFT for the copy

    def _keep_midpoint(self, r: Request) -> None:
        """r's prefill has just reached the start of its last message: keep that state too (an
        engine that cannot cut a state back serves the same context with a new question only
        from a state that ends there; prepare.py)."""
        (_, keep), r.midpoint = r.midpoint, None
        try:
            keep(self.backend, r)
        except Exception:  # a cache that cannot keep it costs the next request a prefill
            pass

    def _keep_prompt(self, r: Request) -> None:
        """r's KV holds its whole input and nothing after (its first token is sampled, not yet
        forwarded): hand it to the prompt cache, once. Called after the first token is emitted,
        or from _finish when that token ended the request, before its sequence is freed."""
        keep, r.snapshot = r.snapshot, None
        if keep is not None and r.seq >= 0 and r.pos == r.prompt_end:  # no decoded token's KV
            try:
                keep(self.backend, r)
            except Exception:  # a cache that cannot keep this turn costs the next one a prefill
                pass

    def _prompt_read(self, r: Request, logits: np.ndarray) -> None:
        """r has read its whole input: fork its other choices (each samples its first token)."""
        r.prompt_end = r.pos
        for sib in r.siblings:
            if sib.done:
                continue
            self.backend.seq_copy(r.seq, sib.seq)
            sib.pos, sib.forked, sib.restore_ms = r.pos, True, r.restore_ms
            self._sample(sib, logits)

    def _sample(self, r: Request, logits: np.ndarray) -> None:
        """r's next token. What a request brought failing here (its constraint, sampler
        options, stop strings, logprobs) ends that request alone; the others go on."""
        try:
            self._next_token(r, logits)
        except Exception as e:
            # its own options' failure is the caller's (OptionError, a PrefixEdgeError); a bug here is not
            err = e if isinstance(e, PrefixEdgeError) else engine_error(e, "internal error in this request's sampling")
            if r.done:  # it failed inside its own end: its consumer still gets a last event
                r.emit("error", err)
            self._finish(r, "error", err)

    def _next_token(self, r: Request, logits: np.ndarray) -> None:
        tok = r.sampler(logits)
        if r.call.logprobs is not None and tok not in r.call.eos:
            r.token_logprobs.append(token_logprobs(logits, tok, r.call.logprobs))
        r.n_samples += 1
        r.t_last = time.perf_counter()
        if r.t_first is None:
            r.t_first = r.t_last
        r.next_token = None
        if tok in r.call.eos:
            return self._finish(r, "eos")
        r.tokens.append(tok)
        chunk = r.text.push(tok)
        if chunk:
            r.chunks.append(chunk)
            r.emit("text", chunk)
        if r.text.stopped:
            return self._finish(r, "stop")
        if r.n_samples >= r.call.max_tokens:
            return self._finish(r, "length")
        r.next_token = tok


def _close_at_exit(ref) -> None:
    sched = ref()
    if sched is not None:
        sched.close(timeout=10.0)
