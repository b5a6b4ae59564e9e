"""What the demo-data scripts share: where they write, the seeds, small text helpers."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
SEEDS = {"sentiment": 31001, "translate": 31002, "support": 31003}


def write(name: str, rows: list[dict]) -> None:
    DATA.mkdir(exist_ok=True)
    with open(DATA / name, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    print(f"data/{name}: {len(rows)} examples")


def cap(s: str) -> str:
    return s[0].upper() + s[1:]
