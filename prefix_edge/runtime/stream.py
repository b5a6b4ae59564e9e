"""What a request hands back: Stream (sync, any thread), AsyncStream (asyncio), Result, Stats."""

from __future__ import annotations

import queue
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .scheduler import Request


@dataclass
class Stats:
    prefix_tokens: int
    input_tokens: int
    prefix_load_ms: float
    ttft_ms: float
    decode_tok_s: float
    total_ms: float
    generated_tokens: int = 0
    prefix_cached: bool = True
    finish_reason: str = ""
    cached_tokens: int = 0  # positions restored instead of computed: the prefix, earlier turns
    # where those came from: {"task_prefix": the bundle's baked prefix, "prompt_cache": a prompt
    # read before (its positions past the task's prefix), "documents": composed documents' KV}
    cached_from: dict = field(default_factory=dict)
    drafted_tokens: int = 0   # speculative="lookup": draft tokens verified...
    accepted_tokens: int = 0  # ...and those the model agreed with (each saved a forward)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Result:
    text: str
    tokens: list[int]
    stats: Stats
    logprobs: list | None = None  # logprobs=k: per token (id, logprob, [(id, logprob)] * k)
    tool_calls: list | None = None  # tools offered and the answer is a call: OpenAI's tool_calls


class Stream:
    """One request's text chunks, as they are generated. Iterate it (any thread), or cancel it
    from any thread: the stream then ends with `result.stats.finish_reason == "cancelled"` and
    its sequence is freed at the engine's next step. `result` is set once it has ended.

    finish(req, finish_reason) -> Result and cancel(req, reason) are the runtime's (the stream
    knows nothing else of it)."""

    def __init__(self, req: Request, finish: Callable[["Request", str], "Result"],
                 cancel: Callable[["Request", str], None]):
        self._req, self._finish, self._cancel = req, finish, cancel
        self.result: Result | None = None
        self._ended = False
        self.on_end = None  # fn(Result or None on error), once, in the consumer's thread

    @property
    def max_tokens(self) -> int:
        """The tokens this request may generate at most: its max_tokens, else its task's, else
        what the context leaves (what a "length" finish means)."""
        return self._req.call.max_tokens

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> str:
        return self._next(None)

    def _next(self, deadline: float | None) -> str:
        while not self._ended:
            try:
                wait = None if deadline is None else max(0.0, deadline - time.perf_counter())
                kind, value = self._req.events.get(timeout=wait)
            except queue.Empty:
                self.cancel("timeout")
                deadline = None
                continue
            return self._take(kind, value)
        raise StopIteration

    def _take(self, kind: str, value):
        if kind == "text":
            return value
        self._ended = True
        if kind == "error":
            self._ended_with(None)
            raise value
        self.result = self._finish(self._req, value)
        self._ended_with(self.result)
        raise StopIteration

    def _ended_with(self, result: "Result | None") -> None:
        cb, self.on_end = self.on_end, None
        if cb is not None:
            cb(result)

    def wait(self, timeout: float | None = None) -> "Result":
        """Read the stream to its end and return its Result (cancelled after `timeout` s)."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        try:
            while True:
                self._next(deadline)
        except StopIteration:
            return self.result

    @property
    def logprobs(self) -> list:
        """(token, logprob, alternatives) of the tokens so far (with logprobs=k)."""
        return self._req.token_logprobs

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop this request (safe from any thread, also during its prefill)."""
        self._cancel(self._req, reason)

    @property
    def done(self) -> bool:
        return self._ended

    def close(self) -> None:
        if not self._ended:
            self.cancel()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # an abandoned stream must not keep its sequence busy
        try:
            if not self._ended and self._req.cancel_reason is None:
                self._cancel(self._req, "cancelled")
        except Exception:
            pass


class AsyncStream:
    """`async for chunk in rt.astream(...)`. The engine thread wakes the event loop itself
    (call_soon_threadsafe) after each event, so a waiting stream holds no thread, and any number
    of streams wait at once; leaving the loop early or cancelling the task cancels the request."""

    def __init__(self, stream: Stream):
        self._s = stream
        self._wake = None

    @property
    def result(self) -> Result | None:
        return self._s.result

    @property
    def done(self) -> bool:
        return self._s.done

    @property
    def max_tokens(self) -> int:
        return self._s.max_tokens

    def cancel(self, reason: str = "cancelled") -> None:
        self._s.cancel(reason)

    @property
    def logprobs(self) -> list:
        return self._s.logprobs

    @property
    def tools_offered(self) -> bool:
        t = self._s._req.call.tools
        return t is not None and t.choice != "none"

    @property
    def tools_guided(self) -> bool:
        """The answer is constrained to text-or-call or to a call (tools.guide): a call is
        streamed as it is written."""
        t = self._s._req.call.tools
        return t is not None and t.guided

    @property
    def logprobs_on(self) -> bool:
        return self._s._req.call.logprobs is not None

    def __aiter__(self) -> "AsyncStream":
        return self

    async def __anext__(self) -> str:
        if self._s.done:
            raise StopAsyncIteration
        req = self._s._req
        if self._wake is None:
            import asyncio  # already loaded where a loop runs; not at every runtime import

            loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
            wake = self._wake
            req.notify = lambda: loop.call_soon_threadsafe(wake.set)
        while True:
            self._wake.clear()
            try:
                kind, value = req.events.get_nowait()
                break
            except queue.Empty:
                pass
            try:
                await self._wake.wait()
            except BaseException:  # cancelled while waiting: the request goes too
                self._s.cancel()
                raise
        try:
            return self._s._take(kind, value)
        except StopIteration:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        if not self._s.done:
            self._s.cancel()
