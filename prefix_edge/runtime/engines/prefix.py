"""Prefix: a task prefix as loaded for one engine (its ids and the engine's KV state)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Prefix:
    """A task prefix as loaded for one backend: its token ids and backend-specific KV state.

    The KV covers positions 0..n_tokens-1: first `n_virtual` virtual tokens (a trained prefix;
    they have no ids), then the text tokens `ids`."""

    ids: np.ndarray  # int64 [n_tokens - n_virtual]: the text part
    kv: Any
    metadata: dict[str, str]
    nbytes: int
    n_virtual: int = 0
    checked_by: Any = None  # the backend whose load_prefix already validated `kv`, if any
    home: Any = None  # onnx fused graph: (backend ref, KV buffer whose first positions hold `kv`)
    pin: bool = True  # onnx fused graph: may become a buffer's home (not a turn-cache snapshot)

    @property
    def n_tokens(self) -> int:
        """KV positions the prefix occupies (virtual + text)."""
        return self.n_virtual + len(self.ids)
