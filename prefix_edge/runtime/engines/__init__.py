"""Which engine a backend name means (the engines import lazily: the gguf one needs
llama-cpp-python, the onnx one onnxruntime)."""

from __future__ import annotations

from pathlib import Path

from ...bundle import BACKENDS
from ...errors import PrefixEdgeError
from .protocol import Engine


def engine_class(name: str):
    """The one place that maps a backend name to its engine (imported lazily: the gguf engine
    needs llama-cpp-python, the onnx one onnxruntime)."""
    if name == "onnx":
        from .onnx.engine import OnnxBackend

        return OnnxBackend
    if name == "gguf":
        from .llama.engine import LlamaBackend

        return LlamaBackend
    raise PrefixEdgeError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")


def open_backend(name: str, model_path: Path, device: str = "cpu", threads: int | None = None,
                 n_ctx: int = 2048, **engine) -> Engine:
    """An engine on a model file, outside a bundle's runtime (export's baking and fidelity
    probes, bench, tests). threads: None means the physical cores this process may use
    (runtime/engines/cpus.py), never the engine's own default, each forward running as many of
    them as are free (cpu_share.py); a number is a fixed count."""
    from .cpus import default_threads

    if threads is None:  # the default: adapted to what the CPUs have free
        engine.setdefault("adaptive", True)
    return engine_class(name)(model_path, device=device, threads=threads or default_threads(),
                              n_ctx=n_ctx, **engine)
