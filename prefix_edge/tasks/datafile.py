"""Example files: JSONL lines `{"input": str, "output": str}`, read by `train`, `distill` and
`eval`. Blank lines are skipped; every problem names the file and the line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import PrefixEdgeError


@dataclass(frozen=True)
class Example:
    input: str
    output: str


def read_jsonl(path: Path, need_output: bool = True) -> list[Example]:
    """The examples of `path`; with need_output=False a line may be `{"input": ...}` alone (its
    output is then "")."""
    path = Path(path)
    if not path.is_file():
        raise PrefixEdgeError(f"{path}: no such data file")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise PrefixEdgeError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    out = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            raise PrefixEdgeError(f"{path}:{no}: not valid JSON ({getattr(e, 'msg', 'too deeply nested')})") from None
        if not isinstance(row, dict):
            raise PrefixEdgeError(f"{path}:{no}: expected an object with keys 'input' and 'output'")
        for key in ("input", "output"):
            if key not in row and (need_output or key == "input"):
                raise PrefixEdgeError(f"{path}:{no}: missing key '{key}'")
            if not isinstance(row.get(key, ""), str):
                raise PrefixEdgeError(f"{path}:{no}: '{key}' must be a string")
        out.append(Example(row["input"], row.get("output", "")))
    if not out:
        raise PrefixEdgeError(f"{path}: no examples")
    return out


def write_jsonl(path: Path, rows: list[Example]) -> None:
    Path(path).write_text("".join(json.dumps({"input": r.input, "output": r.output}, ensure_ascii=False) + "\n"
                                  for r in rows), encoding="utf-8")
