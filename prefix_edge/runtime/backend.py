"""The Backend protocol: the seam between the scheduler and an inference engine.

A backend owns one model and serves *sequences* (the scheduler, scheduler.py, is the only
caller, from its one engine thread):

    backend.seq_restore(seq, prefix)   empty `seq`, install a baked prefix (or none) at 0..P-1
    backend.seq_copy(src, dst)         dst := src (llama.cpp: shares the KV cells)
    backend.seq_snapshot(seq, ids)     seq's KV copied out as a Prefix (the turn cache)
    backend.forward([(seq, pos, ids)]) one forward over several sequences -> last logits of each
    backend.seq_free(seq)

and, for one sequence (export's baking, bench, parity tests):

    backend.begin(prefix)        reset the sequence; install a baked prefix (or none) at 0..P-1
    backend.prefill(ids)         append tokens at the current position, return the last logits
    backend.step(token)          append one token, return its logits

Export bakes a prefix with begin(None) + prefill(prefix ids) + save_prefix(path); the runtime
loads it with load_prefix(path) and hands it to begin().

Sampling, stop strings, detokenization and streaming live above this seam, once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from .prefix import Prefix


class Backend(Protocol):
    name: str
    device: str
    n_ctx: int
    threads: int | None
    n_layers: int
    n_kv_heads: int
    head_dim: int
    kv_dtype_name: str

    def load_prefix(self, path: Path) -> Prefix: ...

    def prefix_from(self, tensors: dict, meta: dict, where: str) -> Prefix: ...

    def read_prefix_ids(self, path: Path) -> np.ndarray: ...

    def begin(self, prefix: Prefix | None) -> None: ...

    def prefill(self, ids: np.ndarray) -> np.ndarray: ...

    def step(self, token: int) -> np.ndarray: ...

    def save_prefix(self, path: Path, ids: np.ndarray, metadata: dict[str, str]) -> None: ...

    def state_info(self) -> dict: ...

    def close(self) -> None: ...


BACKENDS = ("onnx", "gguf")
MODEL_SUFFIX = {"onnx": ".onnx", "gguf": ".gguf"}


def open_backend(name: str, model_path: Path, device: str = "cpu", threads: int | None = None,
                 n_ctx: int = 2048, **engine) -> Backend:
    """The one place that maps a backend name to its implementation (imported lazily: the
    gguf backend needs llama-cpp-python, the onnx one onnxruntime). threads: None means the
    physical cores this process may use (runtime/cpus.py), never the engine's own default."""
    from .cpus import default_threads

    threads = threads or default_threads()
    if name == "onnx":
        from .onnx import OnnxBackend

        return OnnxBackend(model_path, device=device, threads=threads, n_ctx=n_ctx, **engine)
    if name == "gguf":
        from .llama import LlamaBackend

        return LlamaBackend(model_path, device=device, threads=threads, n_ctx=n_ctx, **engine)
    from ..errors import PrefixEdgeError

    raise PrefixEdgeError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
