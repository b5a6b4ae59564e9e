"""Validation of a manifest's JSON before it becomes dataclasses: every field's presence, type
and range, with the field's path in the one-line error."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import PrefixEdgeError
from .layout import BACKENDS

_HEX64 = re.compile(r"[0-9a-f]{64}")


class _Bad(Exception):
    pass


def _int(v, lo=0, hi=1 << 40):
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _fields(d: Any, where: str, spec: dict[str, Any], optional: set[str] = frozenset()) -> None:
    if not isinstance(d, dict):
        raise _Bad(f"{where} must be an object")
    for k in d:
        if k not in spec:
            raise _Bad(f"{where}.{k} is not a field of this format")
    for k, check in spec.items():
        if k not in d:
            if k in optional:
                continue
            raise _Bad(f"{where}.{k} is missing")
        if not check(d[k]):
            raise _Bad(f"{where}.{k} has a bad value: {str(d[k])[:60]!r}")


def _str(v) -> bool:
    return isinstance(v, str)


def _hex(v) -> bool:
    return isinstance(v, str) and bool(_HEX64.fullmatch(v))


def _dict(v) -> bool:
    return isinstance(v, dict)


def check_manifest_dict(d: dict, path: Path) -> None:
    try:
        _check(d)
    except _Bad as e:
        raise PrefixEdgeError(f"{path}: {e}") from None


def _check(d: dict) -> None:
    from ..tasks import case_collision

    _fields(d, "manifest", {"model": _dict, "tokenizer": _dict, "backends": _dict, "tasks": _dict,
                            "created_by": _str, "format": _str, "format_version": _int,
                            "extra": _dict}, optional={"created_by", "extra"})
    m = d["model"]
    vocab = m["vocab_size"] if isinstance(m, dict) and _int(m.get("vocab_size"), 1) else 1 << 24
    _fields(m, "model", {
        "architecture": _str, "model_type": _str, "n_layers": lambda v: _int(v, 1, 4096),
        "n_heads": lambda v: _int(v, 1, 4096), "n_kv_heads": lambda v: _int(v, 1, 4096),
        "head_dim": lambda v: _int(v, 1, 8192), "hidden_size": lambda v: _int(v, 1, 1 << 20),
        "vocab_size": lambda v: _int(v, 1, 1 << 24), "n_ctx": lambda v: _int(v, 1, 1 << 24),
        "rope": _dict, "source": _str,
        "eos_token_ids": lambda v: isinstance(v, list) and all(_int(x, 0, vocab) for x in v),
        "sliding_layers": lambda v: isinstance(v, list) and all(_int(x, 0, 4095) for x in v),
        "sliding_window": lambda v: _int(v, 0, 1 << 24),
    }, optional={"sliding_layers", "sliding_window"})
    _fields(d["tokenizer"], "tokenizer", {
        "file": _str, "sha256": _hex, "chat_template_sha256": lambda v: v is None or _hex(v),
        "chat_template": lambda v: v is None or (_str(v) and len(v) < 1 << 20),
        "special_tokens": lambda v: v is None or (isinstance(v, dict) and all(
            _str(x) or (isinstance(x, list) and all(map(_str, x))) for x in v.values()))},
        optional={"chat_template", "special_tokens"})
    if not d["backends"]:
        raise _Bad("backends is empty")
    for name, b in d["backends"].items():
        if name not in BACKENDS:
            raise _Bad(f"backends.{name} is not a backend ({', '.join(BACKENDS)})")
        _fields(b, f"backends.{name}", {
            "files": lambda v: isinstance(v, dict) and v and all(_str(k) and _hex(h) for k, h in v.items()),
            "kv_dtype": _str, "quantization": _str, "fingerprint": _hex, "state": _dict})
    clash = case_collision(d["tasks"])
    if clash:
        raise _Bad(f"tasks {clash[0]!r} and {clash[1]!r} differ only in case")
    for name, t in d["tasks"].items():
        _task(name, t, f"tasks.{name}", m, d["backends"])


def check_task_dict(name: str, t: Any, where: str, model: dict, backends: dict) -> None:
    """One task's entry, as the manifest spells it, checked for a model and its backends (a
    task created at run time: bundle/created.py); one PrefixEdgeError line naming the field."""
    try:
        _task(name, t, where, model, backends)
    except _Bad as e:
        raise PrefixEdgeError(str(e)) from None


def _task(name: str, t: Any, where: str, m: dict, backends: dict) -> None:
    from ..options import FIELDS, check as check_options
    from ..tasks import task_name_problem

    problem = task_name_problem(name)
    if problem:
        raise _Bad(f"{where}: {problem}")
    positions = t["prefix_tokens"] if isinstance(t, dict) and _int(t.get("prefix_tokens")) else 0
    _fields(t, where, {
        "kind": lambda v: v in ("text", "peft"), "chat": lambda v: isinstance(v, bool),
        "prefix_tokens": lambda v: _int(v, 0, m["n_ctx"]), "input_before": _str,
        "input_after": _str, "template": lambda v: _str(v) and v.count("{input}") >= 1,
        "defaults": _dict, "prefixes": _dict, "n_virtual": lambda v: _int(v, 0, positions),
        "adapter": lambda v: v is None or isinstance(v, dict),
        "chat_messages": lambda v: v is None or (isinstance(v, list) and all(
            isinstance(x, dict) and set(x) == {"role", "content"} and _str(x["role"])
            and _str(x["content"]) for x in v)),
        "compression": lambda v: v is None or _compression(v, positions, m["vocab_size"]),
        "prefix_sha256": lambda v: v is None or _hex(v)},
        optional={"n_virtual", "adapter", "chat_messages", "compression", "prefix_sha256"})
    bad = sorted(set(t["defaults"]) - set(FIELDS))
    if bad:
        raise _Bad(f"{where}.defaults.{bad[0]} is not a generation option")
    try:
        check_options(t["defaults"])
    except PrefixEdgeError as e:
        raise _Bad(f"{where}.defaults: {e}") from None
    if not t["prefixes"]:
        raise _Bad(f"{where}.prefixes is empty")
    for b, p in t["prefixes"].items():
        if b not in backends:
            raise _Bad(f"{where}.prefixes.{b}: the bundle has no {b} backend")
        _fields(p, f"{where}.prefixes.{b}", {"file": _str, "sha256": _hex,
                                              "bytes": lambda v: _int(v, 1), "fingerprint": _hex})


def _compression(v, positions: int, vocab: int) -> bool:
    """A compressed prefix's record: kept positions strictly increasing inside the source, as
    many as the prefix holds, source ids in the vocabulary."""
    if not isinstance(v, dict):
        return False
    kept, src = v.get("kept"), v.get("source_ids")
    if not (isinstance(kept, list) and isinstance(src, list) and len(kept) == positions
            and all(_int(x, 0, vocab - 1) for x in src) and all(_int(x, 0, len(src) - 1) for x in kept)):
        return False
    return all(a < b for a, b in zip(kept, kept[1:])) and len(src) >= len(kept)
