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


def on_own_thread(fn: Callable[[], Any]) -> Any:
    """fn() on a thread of its own that ends with it: its value, or its error raised here.

    Runtime.open opens the engine so: an engine's open-time probes decode (llama.cpp:
    batches_alike, the state layout), and llama.cpp's OpenMP keeps a pool of threads for each
    thread that ever decoded, for that thread's life. Two pools on a 2-core machine make libgomp
    throttle their spinning and every barrier of the engine thread's decodes waits on a futex:
    decode ran ~3x slower (84 -> 25 tok/s on the default model) whenever the opening thread,
    which lives on, had decoded. A thread that ends takes its pool with it."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - raised on the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name="prefix-edge-open", daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.1)  # a KeyboardInterrupt still reaches the caller
    if "error" in box:
        raise box["error"]
    return box["value"]
