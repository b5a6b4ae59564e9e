"""Which engine a backend name means: the registry, one line per engine. An engine is a folder
here and its line: the module and class (imported only when that engine opens: the gguf one
needs llama-cpp-python, the onnx one onnxruntime), the Python module its native library comes
with, and where it has one, the check that its library runs on this machine (llama.cpp's probe
in a child process: a build that dies by a signal never takes this process down)."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ...bundle import BACKENDS
from ...errors import PrefixEdgeError
from .protocol import Engine


@dataclass(frozen=True)
class EngineEntry:
    module: str               # the engine's module, relative to this package
    cls: str
    library: str              # the module its native library comes with
    check: str | None = None  # "module:function" (model path or None) -> why it cannot run here, or None


REGISTRY = {
    "onnx": EngineEntry(".onnx.engine", "OnnxBackend", "onnxruntime"),
    "gguf": EngineEntry(".llama.engine", "LlamaBackend", "llama_cpp", "prefix_edge.llamacpp.probe:unusable"),
}
assert set(REGISTRY) == set(BACKENDS), "every backend the bundle names has an engine"


def _entry(name: str) -> EngineEntry:
    entry = REGISTRY.get(name)
    if entry is None:
        raise PrefixEdgeError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    return entry


def engine_class(name: str):
    """The one place that maps a backend name to its engine class."""
    entry = _entry(name)
    return getattr(importlib.import_module(entry.module, __name__), entry.cls)


def installed(name: str) -> bool:
    """The engine's library is installed (not imported: that is the engine's own business)."""
    return importlib.util.find_spec(_entry(name).library) is not None


def unusable(name: str, model_path: Path | None) -> str | None:
    """Why the engine's library cannot run here (on this model, where given), or None."""
    entry = _entry(name)
    if entry.check is None:
        return None
    module, func = entry.check.split(":")
    return getattr(importlib.import_module(module), func)(model_path)


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
