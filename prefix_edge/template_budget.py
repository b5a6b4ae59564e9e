"""The budget of one chat-template rendering, and the checks the instrumented template runs.

A chat template is code from whoever exported the bundle, so one rendering is bounded:
RENDER_SECONDS of the rendering thread's CPU time, RENDER_CHARS characters written in all (its
output, `set` blocks and macros on the way) and in any string or list it builds, MAX_CALL_DEPTH
nested calls (macros calling macros), integers of MAX_INT_BITS bits and ranges of MAX_RANGE
items. chat_template.py compiles a template with every loop, output and `~` through `loop`,
`out` and `concat` here, and its environment's calls, filters and `+ * ** %` through the
checks here, so a template over a budget stops with one TemplateBudgetError line instead of
running until killed or exhausting memory.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import time

from .errors import PrefixEdgeError

RENDER_SECONDS = 5.0         # CPU seconds (the rendering thread's) of one rendering
RENDER_CHARS = 32 << 20      # characters one rendering writes in all, and of any value it builds
MAX_CALL_DEPTH = 64          # nested calls (a macro calling itself ...)
MAX_INT_BITS = 4096          # integers a template computes (`*`, `**`)
MAX_RANGE = 100_000          # items of one range() (jinja2's sandbox limit)


class TemplateBudgetError(PrefixEdgeError):
    """The chat template went over its rendering budget (time, size, depth, numbers)."""


class _Budget(threading.local):
    """The rendering in progress on this thread (none: only the size limits apply)."""
    deadline: float | None = None
    seconds = RENDER_SECONDS
    written = 0
    depth = 0
    ticks = 0


_budget = _Budget()


@contextlib.contextmanager
def rendering(seconds: float | None = None):
    """One rendering on this thread, with its own clock and counts."""
    b = _budget
    b.seconds = RENDER_SECONDS if seconds is None else seconds
    b.deadline, b.written, b.depth, b.ticks = time.thread_time() + b.seconds, 0, 0, 0
    try:
        yield b
    finally:
        b.deadline = None


@contextlib.contextmanager
def nested():
    """One call (a macro, a method) inside the rendering: the clock is read, the depth counted."""
    tick()
    b = _budget
    if b.depth >= MAX_CALL_DEPTH:
        raise TemplateBudgetError(f"its calls nest more than {MAX_CALL_DEPTH} deep")
    b.depth += 1
    try:
        yield
    finally:
        b.depth -= 1


def tick() -> None:
    b = _budget
    b.ticks += 1
    if b.deadline is not None and not b.ticks & 63 and time.thread_time() > b.deadline:
        raise TemplateBudgetError(f"it ran for more than {b.seconds:g} s of CPU time")


def sized(value, what: str = "a value"):
    if isinstance(value, (str, list, tuple, dict, set)) and len(value) > RENDER_CHARS:
        raise TemplateBudgetError(f"it built {what} of {len(value)} items or characters "
                                  f"(at most {RENDER_CHARS})")
    return value


def over(n: int, what: str) -> None:
    if n > RENDER_CHARS:
        raise TemplateBudgetError(f"{what} would write more than {RENDER_CHARS} characters or items")


def _weight(x) -> int:
    """About the characters str(x) or tojson(x) writes, shared references counted each time
    (`[s] * 1000` is 1000 copies of s there); the count stops past the budget."""
    n, stack = 0, [x]
    while stack and n <= RENDER_CHARS:
        v = stack.pop()
        if isinstance(v, str):
            n += len(v) + 2
        elif isinstance(v, dict):
            n += 2 + 4 * len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            n += 2 + 2 * len(v)
            stack.extend(v)
        elif isinstance(v, int):
            n += v.bit_length() // 3 + 1
        else:
            n += 8
    return n


def _text(parts, what: str) -> list[str]:
    """The parts as strings, a container's size counted before it is written out."""
    out = []
    for p in parts:
        if not isinstance(p, str):
            over(_weight(p), what)
        out.append(str(p))
    return out


def check_format(fmt, args=()) -> None:
    """A format string (printf `%` or str.format) with a width or precision beyond the budget,
    or arguments that would write beyond it."""
    if isinstance(fmt, str) and any(len(d) > 9 or int(d) > RENDER_CHARS for d in re.findall(r"\d+", fmt)):
        raise TemplateBudgetError("a format string asks for a width beyond the budget")
    _text(args, "a format")


def _ints(args, kwargs, what: str) -> None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and abs(a) > RENDER_CHARS:
            raise TemplateBudgetError(f"{what}: an argument of {a.bit_length()} bits is beyond the "
                                      f"budget of {RENDER_CHARS}")


def _length(x) -> int:
    return len(x) if isinstance(x, str) else _weight(x)


def binop_check(op: str, a, b) -> None:
    seq = (str, list, tuple)
    if op == "*":
        if isinstance(a, seq) and isinstance(b, int):
            over(_length(a) * max(b, 0), "a repetition")
        elif isinstance(b, seq) and isinstance(a, int):
            over(_length(b) * max(a, 0), "a repetition")
        elif isinstance(a, int) and isinstance(b, int) and a.bit_length() + b.bit_length() > MAX_INT_BITS:
            raise TemplateBudgetError(f"a product of more than {MAX_INT_BITS} bits")
    elif op == "**":
        if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1 \
                and (a.bit_length() - 1) * b > MAX_INT_BITS:
            raise TemplateBudgetError(f"a power of more than {MAX_INT_BITS} bits")
    elif op == "+":
        if isinstance(a, seq) and isinstance(b, seq):
            over(len(a) + len(b), "a concatenation")
    elif op == "%" and isinstance(a, str):
        args = b if isinstance(b, tuple) else (b,)
        check_format(a, args)
        if "*" in a:
            _ints(args, {}, "a `%` format's `*` width")


WIDTHS = {"ljust", "rjust", "center", "zfill", "expandtabs"}  # str methods whose int makes text


def method_check(obj, args, kwargs) -> tuple:
    """A builtin method of a str (`'x'.ljust(n)`, `s.replace(a, b)`, `sep.join(xs)`, a format)."""
    owner, name = obj.__self__, obj.__name__
    if not isinstance(owner, str):
        return args
    if name in ("format", "format_map"):  # jinja2 < 3.1.5 formats in call(), not at getattr
        check_format(owner, (*args, *kwargs.values()))
    elif name in WIDTHS:
        _ints(args, kwargs, f"str.{name}()")
        if name == "expandtabs":
            over(len(owner) * max(int(args[0]) if args else 8, 1), "str.expandtabs()")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        n = owner.count(args[0]) if args[0] else len(owner) + 1
        over(len(owner) + n * max(len(args[1]) - len(args[0]), 0), "str.replace()")
    elif name == "join" and args:
        items = list(loop(args[0]))
        over(sum(map(_length, items)) + len(owner) * len(items), "str.join()")
        args = (items, *args[1:])
    return args


AMPLIFIERS = {"center", "batch", "slice", "indent", "wordwrap"}  # filters whose int makes text


def bounded_filter(name: str, f):
    """A filter with the budget's checks around it (its value and arguments, its result)."""
    skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(f)
    def bounded(*args, **kwargs):
        tick()
        value, rest = (args[skip] if len(args) > skip else None), args[skip + 1:]
        if name in AMPLIFIERS:
            _ints(rest, kwargs, f"the {name} filter")
        if name == "format":
            check_format(value, (*rest, *kwargs.values()))
        elif name in ("string", "pprint", "tojson"):
            over(_weight(value), name)
        elif name == "replace" and len(rest) >= 2:
            s, old, new = str(value), str(rest[0]), str(rest[1])
            over(len(s) + (s.count(old) if old else len(s) + 1) * max(len(new) - len(old), 0), "replace")
        elif name in ("join", "sum"):
            items = list(loop(value)) if value is not None else []
            sep = (rest[0] if rest else kwargs.get("d", "")) if name == "join" else ""
            over(sum(map(_length, items)) + len(str(sep)) * len(items), name)
            args = (*args[:skip], items, *rest)
        elif name == "indent":
            w = rest[0] if rest else kwargs.get("width", 4)
            over((str(value).count("\n") + 1) * (len(w) if isinstance(w, str) else int(w)), "indent")
        elif name == "wordwrap":
            wrap = kwargs.get("wrapstring") or (rest[2] if len(rest) > 2 else None) or "\n"
            over(len(str(value)) * (len(str(wrap)) + 1), "wordwrap")
        return sized(f(*args, **kwargs), f"a {name} result")
    return bounded


def _rendering() -> _Budget:
    """The budget of the rendering in progress (outside one, e.g. jinja2 folding constants at
    compile time, the instrumented nodes refuse to run: they stay runtime calls)."""
    if _budget.deadline is None:
        raise RuntimeError("not rendering")
    return _budget


def loop(iterable):
    """Every for-loop's iterable: the budget's clock is read as it runs."""
    _rendering()

    def ticking():
        for x in iterable:
            tick()
            yield x
    return ticking()


def concat(parts) -> str:
    _rendering()
    texts = _text(parts, "a `~` concatenation")
    over(sum(map(len, texts)), "a `~` concatenation")
    return "".join(texts)


def out(parts) -> str:
    """Every output the template writes (to the rendering, a `set` block or a macro's body)."""
    b = _rendering()
    tick()
    texts = _text(parts, "an output")
    b.written += sum(map(len, texts))
    if b.written > RENDER_CHARS:
        raise TemplateBudgetError(f"it wrote more than {RENDER_CHARS} characters")
    return "".join(texts)


def safe_range(*args):
    rng = range(*args)
    try:
        n = len(rng)
    except OverflowError:
        n = MAX_RANGE + 1
    if n > MAX_RANGE:
        raise TemplateBudgetError(f"range() of more than {MAX_RANGE} items")
    return rng
