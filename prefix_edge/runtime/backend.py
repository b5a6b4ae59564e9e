"""The Backend protocol: the seam between the shared generation loop and an inference engine.

A backend owns one model and one sequence. The generation loop (generate.py) calls:

    backend.begin(prefix)        reset the sequence; install a baked prefix (or none) at 0..P-1
    backend.prefill(ids)         append tokens at the current position, return the last logits
    backend.step(token)          append one token, return its logits

Sampling, stop strings, detokenization and streaming live above this seam, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np


@dataclass
class Prefix:
    """A task prefix as loaded for one backend: its token ids and backend-specific KV state."""

    ids: np.ndarray  # int64 [P]
    kv: Any
    metadata: dict[str, str]
    nbytes: int


class Backend(Protocol):
    name: str
    device: str

    def load_prefix(self, path: Path) -> Prefix: ...

    def read_prefix_ids(self, path: Path) -> np.ndarray: ...

    def begin(self, prefix: Prefix | None) -> None: ...

    def prefill(self, ids: np.ndarray) -> np.ndarray: ...

    def step(self, token: int) -> np.ndarray: ...

    def close(self) -> None: ...
