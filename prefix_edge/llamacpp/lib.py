"""llama-cpp-python as a library: imported quietly, its state-format version, the devices its
build can use, and the KV cache types (and their rotation) a bundle may bake with."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

from ..errors import PrefixEdgeError
from .seqstate import GGML_TYPE_F16, GGML_TYPE_Q8_0, SEQ_STATE_MAGIC

STATE_FORMAT = "llama.cpp-seq-state"
KV_TYPES = {"f16": GGML_TYPE_F16, "q8_0": GGML_TYPE_Q8_0}  # KV cache types a bundle may bake with
_LOG_CALLBACK = None  # keeps the no-op log callback alive for as long as llama.cpp may call it
_LIB = None  # the bindings, once loaded (load_llama_cpp)
_VERSION = ""  # llama-cpp-python's version (load_llama_cpp)
_IMPORT_LOCK = threading.Lock()


def _bindings():
    """llama-cpp-python's ctypes bindings (`llama_cpp.llama_cpp`) and its version, without
    running the package's `__init__`, which also imports the high-level `Llama`, its chat
    formats and jinja2: 66-105 ms of a cold start here against 12-16 ms for the bindings alone.
    The package is a bare module only while the bindings import (under a lock); a later
    `import llama_cpp` runs it in full and reuses the same bindings module."""
    import importlib
    import importlib.util
    import re
    import sys

    with _IMPORT_LOCK:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or not spec.origin:
            raise ImportError("llama_cpp")
        if "llama_cpp" in sys.modules and hasattr(sys.modules["llama_cpp"], "__version__"):  # imported in full
            return importlib.import_module("llama_cpp.llama_cpp"), sys.modules["llama_cpp"].__version__
        found = re.search(r"""^__version__\s*=\s*["']([^"']+)""", Path(spec.origin).read_text(), re.M)
        bare = importlib.util.module_from_spec(spec)
        sys.modules["llama_cpp"] = bare
        try:
            low = importlib.import_module("llama_cpp.llama_cpp")
        finally:
            if sys.modules.get("llama_cpp") is bare:
                del sys.modules["llama_cpp"]
    if found is None:
        import importlib.metadata

        return low, importlib.metadata.version("llama_cpp_python")
    return low, found.group(1)


def _silent_log_callback(llama_cpp):
    """A log callback that drops every message, native where possible. llama.cpp logs ~2,000
    lines loading the default model; a Python callback takes the GIL for each, so the model's
    load would stall behind any Python running beside it (the tokenizer's load: overlap.py).
    C's `abs` is the native no-op: it reads the level as its one int argument and returns; the
    C calling conventions of x86-64 and arm64 leave the other arguments unread and the return
    value unused. Where the C library cannot be opened, a Python no-op."""
    try:
        return ctypes.cast(ctypes.CDLL(None).abs, llama_cpp.llama_log_callback)
    except (OSError, AttributeError, TypeError):
        return llama_cpp.llama_log_callback(lambda level, text, user_data: None)


def load_llama_cpp():
    """llama-cpp-python's bindings with its logging silenced and its backend initialised (once
    per process; later calls return the same module)."""
    global _LIB, _LOG_CALLBACK, _VERSION
    if _LIB is not None:
        return _LIB
    try:
        llama_cpp, version = _bindings()
    except ImportError:
        raise PrefixEdgeError("the gguf backend needs llama-cpp-python: "
                              "pip install 'prefix-edge[llama]'") from None
    _LOG_CALLBACK = _silent_log_callback(llama_cpp)
    llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    _VERSION, _LIB = version, llama_cpp
    return llama_cpp


def state_version() -> str:
    """What a seq-state blob depends on besides the model, for the prefix fingerprint. The blob
    carries no version of its own; the session / seq-file versions mark llama.cpp's state
    format changes, and the package version pins the rest."""
    L = load_llama_cpp()
    return (f"{STATE_FORMAT}/magic={SEQ_STATE_MAGIC:08x}/session={L.LLAMA_SESSION_VERSION}"
            f"/seq={L.LLAMA_STATE_SEQ_VERSION}/llama-cpp-python={_VERSION}")


def _format_part(version: str) -> str:
    """The state-format part of a state_version string (the package version may differ)."""
    return version.split("/llama-cpp-python=")[0]


def available_devices() -> list[str]:
    import sys

    L = load_llama_cpp()
    if not L.llama_supports_gpu_offload():
        return ["cpu"]
    return ["cpu", "metal" if sys.platform == "darwin" else "cuda"]


def kv_rotation(kv_type: str, head_dim: int, head_dim_v: int) -> int:
    """The Hadamard order llama.cpp rotates a cache's K and V heads by (0: none).

    llama.cpp (since its PR 21038) rotates Q, K and V of a quantized cache by the normalized
    Hadamard matrix when the head size is a multiple of 64, unless LLAMA_ATTN_ROT_DISABLE is set;
    checked here against its own cells: a head of 64 is rotated by H64, one of 32 is not. For
    other head sizes that are multiples of 64 but no power of 2 the order is not known here, so
    such a model cannot have a quantized cache."""
    import os

    if kv_type == "f16" or os.environ.get("LLAMA_ATTN_ROT_DISABLE", "0").strip() not in ("", "0"):
        return 0
    if head_dim % 64 or head_dim_v % 64:
        return 0
    if head_dim != head_dim_v or head_dim & (head_dim - 1):
        raise PrefixEdgeError(f"a {kv_type} KV cache rotates heads of {head_dim}/{head_dim_v} in a way "
                              "prefix-edge does not know; use f16")
    return head_dim


def gguf_state_options(state: dict) -> dict:
    """The context options a bundle's GGUF prefixes were baked with (its manifest `state`): the
    KV cache type and flash attention (V untransposed). Anything else is refused by the backend
    in one line."""
    state = state if isinstance(state, dict) else {}
    return {"kv_type": str(state.get("kv_type", "f16")), "flash_attn": not state.get("v_trans", True)}
