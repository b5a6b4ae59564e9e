"""What the demo-data scripts share: where they write, the seeds, small text helpers."""

from __future__ import annotations

import json
import os
from pathlib import Path

# The demo data travels with the package (prefix_edge/models/smollm2-135m/data); these scripts are
# not part of it. $DEMO_DATA_DIR writes elsewhere (tests/test_demo_data.py: the files are reproducible).
DATA = Path(os.environ.get("DEMO_DATA_DIR")
            or Path(__file__).resolve().parents[2] / "prefix_edge" / "models" / "smollm2-135m" / "data")
SEEDS = {"sentiment": 31001, "translate": 31002, "support": 31003}


def write(name: str, rows: list[dict]) -> None:
    DATA.mkdir(exist_ok=True)
    with open(DATA / name, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    print(f"data/{name}: {len(rows)} examples")


def cap(s: str) -> str:
    return s[0].upper() + s[1:]
