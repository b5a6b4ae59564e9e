"""Work done while an engine's model loads: Runtime.open's tokenizer, during the native load.

A cold start is mostly native loads: llama.cpp's model (~80 ms on the default model) or ONNX
Runtime's session (~150-200 ms), and the tokenizer's (~90 ms, `Tokenizer.from_file`, which
holds the GIL). ctypes and ONNX Runtime release the GIL inside their calls, so the two can run
at once on two cores; but only if the tokenizer starts once the engine is already inside its
native call: started earlier, it holds the GIL through the engine's Python and nothing overlaps
(measured: no gain from a plain thread).

    with beside(load_tokenizer) as work:        # Runtime.open
        opened = engine.from_bundle(...)         # an engine: model = native_load(lambda: ...)
    tokenizer = work.result()

`native_load(fn)` runs `fn` (one native call) on a short-lived thread and, meanwhile, the work
pending on this thread; the work runs once, on the opening thread, whatever happens: if no
native load took it (an engine that does not call native_load, an error before), `result()`
runs it then. An error of either is raised as it would have been without the overlap.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

_pending = threading.local()


class Work:
    """A call run once (by run(), or by result() if nothing ran it), its value or error kept
    for result() to return or raise on the caller's thread."""

    def __init__(self, fn: Callable[[], Any]):
        self._fn = fn
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def run(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._value = self._fn()
        except BaseException as e:  # kept, raised by result() on the opening thread
            self._error = e

    def result(self) -> Any:
        self.run()
        if self._error is not None:
            raise self._error
        return self._value


@contextmanager
def beside(fn: Callable[[], Any]) -> Iterator[Work]:
    """`fn` to run during the first native_load on this thread inside the block (else by
    `result()`)."""
    work = Work(fn)
    outer = getattr(_pending, "work", None)
    _pending.work = work
    try:
        yield work
    finally:
        _pending.work = outer


def native_load(fn: Callable[[], Any], settle: float = 0.0) -> Any:
    """fn() — a native call that releases the GIL — with this thread's pending work (if any)
    done meanwhile, starting `settle` seconds in (the part of fn that still holds the GIL: ONNX
    Runtime parses the model under it, then optimizes and prepacks without it)."""
    work = getattr(_pending, "work", None)
    if work is None or work._done:
        return fn()
    load = Work(fn)
    t = threading.Thread(target=load.run, name="prefix-edge-load", daemon=True)
    t.start()  # returns once the thread runs; it reaches the native call before this one's work
    if settle:
        time.sleep(settle)
    try:
        work.run()
    finally:
        t.join()
    return load.result()
