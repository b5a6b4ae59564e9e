"""Where things are in a bundle, and the rule that every path stays inside it."""

from __future__ import annotations

from pathlib import Path

from ..errors import PrefixEdgeError

MANIFEST = "manifest.json"
TOKENIZER_DIR = "tokenizer"
TOKENIZER = "tokenizer/tokenizer.json"
TASKS_DIR = "tasks"
MODEL_FILE = {"onnx": "onnx/model.onnx", "gguf": "gguf/model.gguf"}
# a GGUF model's MTP head as a file of its own (llama.cpp's converter --mtp writes one, mtp-*.gguf,
# for a model converted without it): copied beside the model by export, loaded for speculative="mtp"
MTP_HEAD = "gguf/mtp-head.gguf"
BACKENDS = tuple(MODEL_FILE)  # the backends a bundle may hold, each with its engine (runtime/engines/__init__.py)


def model_dir(backend: str) -> str:
    return MODEL_FILE[backend].split("/")[0]


def prefix_file(task: str, backend: str) -> str:
    """A task's prefix file for one backend (task names are checked portable file names)."""
    return f"{TASKS_DIR}/{task}.{backend}.safetensors"


def confined(root: Path, rel: str, where: Path | str = "manifest") -> Path:
    """root/rel, refused unless it is a plain relative path that stays inside root (symlinks
    resolved)."""
    p = Path(rel)
    if not rel or p.is_absolute() or ".." in p.parts or "\\" in rel or rel.startswith("~") \
            or any(c in rel for c in "\x00:"):
        raise PrefixEdgeError(f"{where}: path {rel!r} is not a relative path inside the bundle")
    full = (root / p)
    try:
        real, base = full.resolve(), root.resolve()
    except (OSError, RuntimeError):
        raise PrefixEdgeError(f"{where}: path {rel!r} cannot be resolved") from None
    if real != base and base not in real.parents:
        raise PrefixEdgeError(f"{where}: path {rel!r} leads outside the bundle")
    return full
