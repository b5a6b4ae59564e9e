"""Constrained decoding: a JSON schema, a regex or a Lark grammar becomes a token mask per step
(llguidance, MIT; no torch), applied in the one sampler above the engines, so batching,
streaming, stop strings, penalties, n choices and cancellation work as without it. Greedy with
a constraint picks the greedy token whenever the constraint allows it.

JSON is written in one style: `{"key": value, "key": value}` (": " and ", ", no other
whitespace), the style of OpenAI's and the demo tasks' JSON; a small model left free to add
whitespace can loop on newlines. The vocabulary llguidance sees is the runtime's own token
bytes (text.TokenBytes), special tokens marked as such: grammar text never matches them, and the
model's end-of-sequence token ends the output once the constraint accepts it.

What a request brings can never take the process down or fail another request: a spec is
bounded before llguidance sees it (constraint_limits.py: size, depth, rules); it is compiled,
and its first steps walked, on a thread with a 64 MiB stack (native recursion grows with a
grammar's depth); llguidance's own limits (items per step, lexer fuel) are errors at a step,
and every failure is an OptionError naming the request's field (json_schema, regex, grammar,
tools), which the scheduler ends that request alone with.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from ...constraint_limits import MAX_CHARS, MAX_DEPTH, problem
from ...errors import PrefixEdgeError
from ...options import OptionError

JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
KINDS = ("json_schema", "regex", "grammar")
STACK_BYTES = 64 << 20   # the compiler's thread: at the bounds it needs under 1 MiB (measured)
PROBE_STEPS = 8          # steps walked at compile time (lowest allowed token each)
CACHE_ENTRIES = 64       # compiled specs kept (verdicts: a grammar, or the error)...
CACHE_CHARS = 16 << 20   # ...and at most this many characters of spec + grammar in all


def spec_of(opts: dict, field: str | None = None) -> tuple[str, str] | None:
    """(kind, text) of the constraint the options ask for, or None; OptionError (naming
    `field`, else the kind) if it is over constraint_limits' bounds."""
    for kind in KINDS:
        v = opts.get(kind)
        if v is None or v is False:
            continue
        bad = problem(kind, v)
        if bad is not None:
            raise OptionError(field or kind, f"{field or kind}: {bad}")
        if kind == "json_schema":
            v = {"type": "object"} if v is True else v
            return kind, json.dumps(v, ensure_ascii=False)  # key order: the schema's property order
        return kind, v
    return None


def one_line(msg: str, default: str = "not valid") -> str:
    """A native error as one short line (a regex error spans lines: the pattern, a caret, the
    reason)."""
    line = " ".join(x.strip() for x in (msg or "").splitlines() if x.strip()) or default
    return line if len(line) <= 300 else line[:297] + "..."


def on_big_stack(fn: Callable, *args):
    """fn(*args) on a thread of its own with a STACK_BYTES stack (address space: only the
    pages touched are memory); its result or its exception, in the caller."""
    out: dict[str, Any] = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # re-raised in the caller
            out["error"] = e

    with _STACK_LOCK:
        try:
            old = threading.stack_size(STACK_BYTES)
        except (ValueError, RuntimeError):  # a platform that cannot size a thread's stack
            old = None
        try:
            t = threading.Thread(target=run, name="prefix-edge-grammar", daemon=True)
            t.start()
        finally:
            if old is not None:
                threading.stack_size(old)
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


_STACK_LOCK = threading.Lock()
_LIMITS = None


def _limits():
    """llguidance's parser limits, its defaults with one-line errors (no parser-state dump)."""
    global _LIMITS
    if _LIMITS is None:
        import llguidance

        _LIMITS = llguidance.LLParserLimits(verbose_errors=False)
    return _LIMITS


def _bounded(kind: str, text: str) -> str | None:
    """constraint_limits' verdict on a spec's text (a schema parsed back, iteratively bounded)."""
    if kind != "json_schema":
        return problem(kind, text)
    if len(text) > MAX_CHARS:
        return f"is {len(text):,} characters; at most {MAX_CHARS:,}"
    try:
        return problem(kind, json.loads(text))
    except RecursionError:
        return f"the schema nests more than {MAX_DEPTH} levels deep; at most {MAX_DEPTH}"
    except ValueError as e:
        return f"not JSON: {one_line(str(e))}"


class _Vocab:
    """What llguidance's TokenizerWrapper reads: token bytes, specials, and an encoder."""

    def __init__(self, tokenizer, token_bytes, n_vocab: int, eos: list[int]):
        self.eos_token_id = eos[0]
        self.bos_token_id = None
        table = token_bytes.table(n_vocab)
        # ids past the tokenizer's vocabulary (padded embeddings) and specials never match text
        self.special_token_ids = sorted(set(token_bytes.special) | {i for i, b in enumerate(table) if not b})
        self.tokens = [b if b else f"<[{i}]>".encode() for i, b in enumerate(table)]
        self._tok = tokenizer

    def __call__(self, s):
        if isinstance(s, bytes):
            raise TypeError("text only")
        return self._tok.encode(s, add_special_tokens=False).ids


class Grammars:
    """A runtime's constraint compiler: the llguidance tokenizer (built on first use, ~0.5 s for
    a 49k vocabulary) and the verdicts on specs seen (a checked grammar, or the error; a
    bounded LRU), so a spec is compiled and walked once."""

    def __init__(self, tokenizer, token_bytes: Callable[[], Any], n_vocab: int, eos: list[int]):
        # token_bytes: made on first use too (text.TokenBytes serialises the tokenizer: ~70 ms)
        self._args = (tokenizer, token_bytes, n_vocab, sorted(eos))
        self.n_vocab = n_vocab
        self.eos = frozenset(eos)
        self._lock = threading.Lock()
        self._ll = None
        self._cache: OrderedDict[tuple[str, str], tuple[bool, str]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._cached_chars = 0

    def _tokenizer(self):
        with self._lock:
            if self._ll is None:
                try:
                    import llguidance
                except ImportError:
                    raise PrefixEdgeError("constrained decoding needs llguidance: pip install llguidance") from None
                tok, tb, n, eos = self._args
                self._ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocab(tok, tb(), n, eos)),
                                                  n_vocab=n, eos_token=eos)
            return self._ll

    def grammar(self, kind: str, text: str, field: str | None = None) -> str:
        """The checked llguidance grammar of a spec: compiled, validated and its first
        PROBE_STEPS steps walked (on a big stack), or OptionError naming `field` (else the kind)."""
        key = (kind, text)
        with self._cache_lock:
            verdict = self._cache.get(key)
            if verdict is not None:
                self._cache.move_to_end(key)
        if verdict is None:
            bad = _bounded(kind, text)
            verdict = (False, bad) if bad else on_big_stack(self._compile, kind, text)
            self._keep(key, verdict)
        ok, value = verdict
        if not ok:
            raise OptionError(field or kind, f"{field or kind}: {value}")
        return value

    def _keep(self, key: tuple[str, str], verdict: tuple[bool, str]) -> None:
        size = len(key[1]) + len(verdict[1])
        if size > CACHE_CHARS:
            return
        with self._cache_lock:
            if key in self._cache:
                return
            self._cache[key] = verdict
            self._cached_chars += size
            while len(self._cache) > CACHE_ENTRIES or self._cached_chars > CACHE_CHARS:
                (_, t), (_, g) = self._cache.popitem(last=False)
                self._cached_chars -= len(t) + len(g)

    def _compile(self, kind: str, text: str) -> tuple[bool, str]:
        """(True, grammar) or (False, the problem): on the big-stack thread."""
        import llguidance

        ll = self._tokenizer()
        try:
            if kind == "json_schema":
                g = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_STYLE)
            elif kind == "regex":
                g = llguidance.LLMatcher.grammar_from_regex(text)
            else:
                g = llguidance.LLMatcher.grammar_from_lark(text)
        except (ValueError, TypeError) as e:
            return False, one_line(str(e))
        m = llguidance.LLMatcher(ll, g, log_level=0, limits=_limits())  # the compile, checked
        if m.is_error():
            return False, one_line(m.get_error(), "not supported")
        probe = Constraint(m, self.n_vocab)
        try:
            for _ in range(PROBE_STEPS):
                ids = np.flatnonzero(probe.allowed())
                tok = next((int(i) for i in ids if int(i) not in self.eos), None)
                if tok is None:
                    break
                probe.consume(tok)
        except OptionError as e:
            return False, e.detail
        return True, g

    def constraint(self, opts: dict, field: str | None = None) -> "Constraint | None":
        """A request's constraint, its first mask computed (most problems refused here, at the
        call); errors name `field` (else the constraint's kind)."""
        spec = spec_of(opts, field)
        if spec is None:
            return None
        g = self.grammar(*spec, field=field)
        return on_big_stack(self._start, g, field or spec[0])

    def _start(self, g: str, field: str) -> "Constraint":
        import llguidance

        c = Constraint(llguidance.LLMatcher(self._tokenizer(), g, log_level=0, limits=_limits()),
                       self.n_vocab, field)
        c.ready = c.allowed()
        return c


class Constraint:
    """One request's matcher: mask(logits) before each choice, consume(token) after it. Every
    failure (llguidance's limits at a step, no token allowed) is an OptionError naming the
    request's field: that request fails, no other."""

    def __init__(self, matcher, n_vocab: int, field: str = "constraint"):
        import llguidance.numpy as lnp

        self._m, self._n, self._lnp, self.field = matcher, n_vocab, lnp, field
        self._bits = lnp.allocate_token_bitmask(1, n_vocab)
        self.ready: np.ndarray | None = None  # the next step's mask, when computed already
        self.steps = 0

    def _error(self, what: str) -> OptionError:
        e = OptionError(self.field, f"{self.field}: {one_line(what)} (after {self.steps} tokens)")
        e.detail = one_line(what)
        return e

    def allowed(self) -> np.ndarray:
        if self.ready is not None:
            ok, self.ready = self.ready, None
            return ok
        self._lnp.fill_next_token_bitmask(self._m, self._bits, 0)
        if self._m.is_error():
            raise self._error(self._m.get_error())
        ok = np.unpackbits(self._bits[0].view(np.uint8), bitorder="little")[:self._n].astype(bool)
        if not ok.any():
            raise self._error("no token is allowed here")
        return ok

    def mask(self, logits: np.ndarray) -> np.ndarray:
        ok = self.allowed()
        n = min(len(ok), logits.shape[0])
        if not ok[:n].any():
            raise self._error("no token of the model is allowed here")
        out = np.full(logits.shape, -np.inf, np.float32)
        out[:n] = np.where(ok[:n], logits[:n], -np.inf)
        return out

    def consume(self, token: int) -> None:
        if not self._m.consume_token(int(token)):
            raise self._error(self._m.get_error() or f"token {int(token)} is not allowed")
        self.steps += 1

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the constraint forces next (llguidance's fast-forward), a
        draft for speculative decoding (scheduler/drafting.py); none where it cannot say."""
        try:
            return [int(t) for t in self._m.compute_ff_tokens()[:limit]]
        except Exception:  # a draft is a hint: never an error
            return []

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens` the constraint would accept in a row from here."""
        try:
            return int(self._m.validate_tokens([int(t) for t in tokens]))
        except Exception:
            return 0

    def copy(self) -> "Constraint":
        c = Constraint.__new__(Constraint)
        c._m, c._n, c._lnp, c.field, c.steps = self._m.deep_copy(), self._n, self._lnp, self.field, self.steps
        c._bits = self._lnp.allocate_token_bitmask(1, self._n)
        c.ready = None if self.ready is None else self.ready.copy()
        return c


def check_task_defaults(specs, tokenizer, n_vocab: int, eos: list[int]) -> None:
    """At export: each task's default constraint compiled and walked as a request's would be,
    and its logit_bias ids within the model's vocabulary, so a task file that would fail every
    run is refused (one line naming the file, the task and the key) instead of exported."""
    from ...tasks import task_where
    from .text import TokenBytes

    grammars = None
    for s in specs:
        d = s.defaults
        bad = next((t for t in d.get("logit_bias") or {} if t >= n_vocab), None)
        if bad is not None:
            raise PrefixEdgeError(f"{task_where(s.file, s.name, 'logit_bias')}: token id {bad} is outside "
                                  f"this model's vocabulary (0..{n_vocab - 1})", param="logit_bias")
        if not any(d.get(k) not in (None, False) for k in KINDS):
            continue
        if grammars is None:
            grammars = Grammars(tokenizer, functools.partial(TokenBytes, tokenizer), n_vocab, eos)
        try:
            grammars.constraint(d)
        except OptionError as e:
            raise PrefixEdgeError(f"{task_where(s.file, s.name, e.field)}: {e}", param=e.field) from None
