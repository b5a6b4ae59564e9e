"""Prefix: a sequence's state as data — a task's baked prefix, a prompt-cache entry, a saved
conversation's — its token ids and its engine's own state.

The state is a type of its engine's (llama.cpp: llama/state.py SeqBlob, the serialised sequence;
ONNX: onnx/state.py KvArrays, per-layer arrays and recurrent states; StateLayout says which
layers hold what). Everything above the engines sees only what `State` declares: the caches
budget by its bytes, and read and write it through the engine's own calls (prefix_from /
write_snapshot: the one codec, bundle/prefixfile.py, for bundles, the prompt cache's disk tier
and saved conversations alike). What an engine keeps about a state (checked already, the buffer
it lives in) lives in the engine, never on the Prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class State(Protocol):
    """What a Prefix's state shows above its engine."""

    @property
    def nbytes(self) -> int: ...  # the host memory it holds


@dataclass(eq=False)
class Prefix:
    """A state of positions 0..n_tokens-1: first `n_virtual` virtual tokens (a trained prefix;
    they have no ids), then the text tokens `ids`."""

    ids: np.ndarray  # int64 [n_tokens - n_virtual]: the text part
    state: State
    metadata: dict[str, str] = field(default_factory=dict)
    n_virtual: int = 0

    @property
    def n_tokens(self) -> int:
        """KV positions the prefix occupies (virtual + text)."""
        return self.n_virtual + len(self.ids)

    @property
    def nbytes(self) -> int:
        return self.state.nbytes
