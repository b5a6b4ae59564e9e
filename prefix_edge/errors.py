"""The one exception type. Raised where bad input is first seen; the CLI prints its message
as one line and exits non-zero."""

from __future__ import annotations

import sys


def warn(message: str) -> None:
    """One warning line on stderr (the run goes on)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


class PrefixEdgeError(Exception):
    """A user-facing error with a message that says what is wrong and what to do. `param`: the
    call's argument it is about, where it is about one ("messages", "text", "tools", "n"...; a
    server reports it as the request field's OpenAI `param`), else None."""

    exit_code = 1

    def __init__(self, *args, param: str | None = None):
        super().__init__(*args)
        self.param = param


class EngineError(PrefixEdgeError):
    """The engine (or the runtime's own code) failed while running a request: not the caller's
    mistake. A server answers 500; any other PrefixEdgeError a call meets is about the call
    itself and answers 4xx (serve/calls.step_error decides, once)."""


def engine_error(e: BaseException, what: str = "engine error") -> EngineError:
    """`e`, met while the engine ran a request, as an EngineError (one line; its message kept
    where it is already a PrefixEdgeError's)."""
    if isinstance(e, EngineError):
        return e
    if isinstance(e, PrefixEdgeError):
        return EngineError(str(e))
    text = " ".join(str(e).split())[:200]
    return EngineError(f"{what}: {type(e).__name__}" + (f": {text}" if text else ""))


class RuntimeBusy(PrefixEdgeError):
    """The runtime's request queue is full: retry later (a server answers 429)."""


class RuntimeClosed(PrefixEdgeError):
    """The runtime was closed (a server answers 503)."""


class ContextLengthExceeded(PrefixEdgeError):
    """The prefix + input cannot fit the context one request may use (a server answers 400,
    code context_length_exceeded)."""


def disk_full(exc: BaseException | None) -> bool:
    """Whether `exc` (or what caused it) is a full disk, however a library wrapped it."""
    import errno

    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False
