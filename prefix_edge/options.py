"""Generation options: the one definition of every option's type, range and default.

Task files (a task's defaults), the Python API (`rt.generate(..., top_p=0.9)`), the CLI
(`prefix-edge run --top-p 0.9`) and the server (OpenAI's request fields) all resolve options
here: the defaults below, then a task's, then a request's, each value checked, and an error that
names the field (OptionError.field).

    opts = resolve(task_defaults, request_overrides)   # a checked dict of every option
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import PrefixEdgeError

MAX_LOGIT_BIAS = 300  # entries of a logit_bias, as OpenAI's API allows
MAX_STOP = 16         # stop strings (OpenAI's API allows 4; more is an extension)
# UTF-8 bytes of one request's input (its text, or all its messages together), checked before
# it is tokenized; the server's request-body limit is the same number (serve/limits.py MAX_BODY)
MAX_INPUT_BYTES = 4 << 20


class OptionError(PrefixEdgeError):
    """A generation option with a bad value; `field` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(message, param=field)
        self.field = field


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # int | float | bool | stop | bias | schema | pattern | choice
    default: Any
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # (lo, hi] rather than [lo, hi]
    help: str = ""
    choices: tuple[str, ...] = ()  # kind "choice": the values it takes

    @property
    def range(self) -> str:
        if self.choices:
            return " | ".join(self.choices)
        if self.lo is None:
            return ""
        hi = "2**63" if self.hi == 2 ** 63 else f"{self.hi:g}" if isinstance(self.hi, float) else str(self.hi)
        return f"{'(' if self.lo_open else '['}{self.lo:g}, {hi}{')' if self.hi == 2 ** 63 else ']'}"

    def check(self, value: Any) -> Any:
        """The value normalised (ints accepted as floats, a stop string as a list, logit_bias
        keys as ints), or OptionError naming this field."""
        k, name = self.kind, self.name
        if k in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, (int, float) if k == "float" else int):
                raise OptionError(name, f"{name} must be {'a number' if k == 'float' else 'an integer'} "
                                        f"in {self.range}, got {value!r}")
            if k == "float" and not math.isfinite(value):
                raise OptionError(name, f"{name} must be finite, got {value!r}")
            low_ok = value > self.lo if self.lo_open else value >= self.lo
            if not (low_ok and (value < self.hi if self.hi == 2 ** 63 else value <= self.hi)):
                raise OptionError(name, f"{name} must be in {self.range}{self.help and f' ({self.help})'}, "
                                        f"got {value!r}")
            return float(value) if k == "float" else value
        if k == "bool":
            if not isinstance(value, bool):
                raise OptionError(name, f"{name} must be true or false, got {value!r}")
            return value
        if k == "stop":
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) and x for x in value) \
                    or len(value) > MAX_STOP:
                raise OptionError(name, f"{name} must be a non-empty string or a list of up to {MAX_STOP} "
                                        f"of them, got {value!r}")
            for x in value:
                check_text(x, name)
            return list(value)
        if k == "bias":
            if not isinstance(value, dict):
                raise OptionError(name, f"{name} must map token ids to biases in [-100, 100], got {value!r}")
            if len(value) > MAX_LOGIT_BIAS:
                raise OptionError(name, f"{name} has {len(value)} entries; at most {MAX_LOGIT_BIAS} "
                                        "(as OpenAI's API)")
            bias = {}
            for key, v in value.items():
                try:
                    tok = -1 if isinstance(key, bool) else int(key)
                except (TypeError, ValueError):
                    tok = -1
                if tok < 0 or isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
                    raise OptionError(name, f"{name}: {key!r}: {v!r} is not a token id (>= 0) and a bias "
                                            "in [-100, 100]")
                bias[tok] = float(v)
            return bias
        if k == "choice":
            if not isinstance(value, str) or value not in self.choices:
                raise OptionError(name, f"{name} must be one of {', '.join(map(repr, self.choices))}, "
                                        f"got {value!r}")
            return value
        if k == "schema":
            if not isinstance(value, (bool, dict)):
                raise OptionError(name, f"{name} must be a JSON schema (an object), true (any JSON object) "
                                        f"or false (none, over a task's), got {value!r}")
            return value
        if not isinstance(value, str) or not value:  # pattern: regex, grammar
            raise OptionError(name, f"{name} must be a non-empty string, got {value!r}")
        return value


FIELDS: dict[str, Field] = {f.name: f for f in (
    Field("max_tokens", "int", None, 1, 1 << 20,
          help="tokens to generate at most; none set (nor by the task): to the end of the context"),
    Field("temperature", "float", 0.0, 0.0, 2.0, help="0 = greedy"),
    Field("top_p", "float", 1.0, 0.0, 1.0, help="1 = off; 0 = the most likely token only"),
    Field("top_k", "int", 0, 0, 1 << 20, help="0 = off"),
    Field("seed", "int", None, 0, 2 ** 63, help="sampling seed"),
    Field("stop", "stop", []),
    Field("min_p", "float", 0.0, 0.0, 1.0, help="0 = off"),
    Field("repetition_penalty", "float", 1.0, 0.0, 10.0, lo_open=True, help="1 = off"),
    Field("presence_penalty", "float", 0.0, -2.0, 2.0, help="0 = off"),
    Field("frequency_penalty", "float", 0.0, -2.0, 2.0, help="0 = off"),
    Field("logit_bias", "bias", {}),
    Field("json_schema", "schema", None),  # a JSON schema, or true: any JSON object
    Field("regex", "pattern", None),
    Field("grammar", "pattern", None),     # a Lark grammar (llguidance's dialect)
    Field("speculative", "choice", "off", choices=("off", "lookup", "mtp"),
          help="lookup: draft the constraint's forced tokens and spans of the input; mtp: draft "
               "with the model's own MTP head (a runtime opened with mtp_head); verified in one "
               "forward (docs/speculative.md)"),
    Field("compose_documents", "bool", False,
          help="the call's documents' KV computed once each and composed in any order: faster on "
               "documents seen before, not exact (docs/context-reuse.md)"),
    Field("compose_recompute", "int", 32, 0, 4096,
          help="composed documents: each later document's first tokens prefilled in place"),
)}
DEFAULTS: dict[str, Any] = {name: f.default for name, f in FIELDS.items()}
CONSTRAINTS = ("json_schema", "regex", "grammar")


def check_text(text: str, what: str, limit: int = MAX_INPUT_BYTES) -> int:
    """Text must be encodable as UTF-8 (a lone surrogate, e.g. JSON's "\\ud800", is refused) and
    at most `limit` bytes of it, checked before anything else reads it; its UTF-8 bytes."""
    if len(text) > limit:  # at least a byte per character: refused before it is encoded
        raise OptionError(what, f"{what} is {len(text)} characters; the input may be at most {limit} "
                                f"bytes (MAX_INPUT_BYTES)")
    try:
        n = len(text.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise OptionError(what, f"{what} is not valid text: a lone surrogate (U+{ord(text[e.start]):04X}) "
                                f"at character {e.start}") from None
    if n > limit:
        raise OptionError(what, f"{what} is {n} bytes of UTF-8; the input may be at most {limit} bytes "
                                "(MAX_INPUT_BYTES)")
    return n


def check(opts: dict[str, Any]) -> dict[str, Any]:
    """Check the options given (None values are "not given"); the same dict normalised. An
    unknown key is an error naming it."""
    out = dict(opts)
    for key, value in opts.items():
        field = FIELDS.get(key)
        if field is None:
            raise OptionError(key, f"unknown generation option {key!r}")
        if value is not None:
            out[key] = field.check(value)
    given = [k for k in CONSTRAINTS if out.get(k) not in (None, False)]
    if len(given) > 1:
        raise OptionError(given[1], f"give one constraint, not {' and '.join(given)}")
    return out


def resolve(*layers: dict[str, Any] | None) -> dict[str, Any]:
    """Every option: DEFAULTS, then each layer in turn (a task's defaults, a request's
    overrides; None values in a layer are "not given"), checked."""
    out = dict(DEFAULTS)
    for layer in layers:
        out.update({k: v for k, v in (layer or {}).items() if v is not None})
    out = check(out)
    if out["top_p"] == 0.0:
        out["top_p"] = 1e-9  # as OpenAI: the most likely token only
    return out
