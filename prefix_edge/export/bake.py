"""Baking: run each task's prefix through the deployed model and store its per-layer KV."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..bundle import Manifest, TaskPrefixFile, sha256_file
from ..errors import PrefixEdgeError
from ..tasks import RenderedTask

PREFIX_FORMAT_VERSION = "1"


def prefix_ids(tokenizer, rendered: RenderedTask, name: str, n_ctx: int) -> list[int]:
    ids = tokenizer.encode(rendered.prefix_text, add_special_tokens=False).ids
    if not ids:
        raise PrefixEdgeError(f"task '{name}': the prefix renders to no tokens")
    if len(ids) + 1 >= n_ctx:
        raise PrefixEdgeError(f"task '{name}': prefix is {len(ids)} tokens, the model's context is {n_ctx}")
    return ids


def bake_onnx(model_path: Path, manifest: Manifest, task_ids: dict[str, list[int]],
              root: Path, advance) -> dict[str, tuple[int, TaskPrefixFile]]:
    """Bake every task's prefix ids through the graph at `model_path`; fill in the onnx backend's KV dtype
    and fingerprint in `manifest`. Returns {task: (prefix tokens, file entry)}."""
    from ..runtime.onnx import OnnxBackend, write_prefix

    be = OnnxBackend(model_path)
    m = manifest.model
    if (be.n_layers, be.n_kv_heads, be.head_dim) != (m.n_layers, m.n_kv_heads, m.head_dim):
        raise PrefixEdgeError(
            f"the exported graph has {be.n_layers} layers × {be.n_kv_heads} KV heads × {be.head_dim}, "
            f"the model config says {m.n_layers} × {m.n_kv_heads} × {m.head_dim}")
    info = manifest.backends["onnx"]
    info.kv_dtype = np.dtype(be.kv_dtype).name
    info.fingerprint = manifest.fingerprint("onnx")
    out = {}
    for name, ids in task_ids.items():
        be.begin(None)
        be.prefill(np.array(ids, np.int64))
        rel = f"tasks/{name}.onnx.safetensors"
        write_prefix(root / rel, np.array(ids, np.int64), be.kv_tensors(),
                     {"fingerprint": info.fingerprint, "task": name, "backend": "onnx",
                      "prefix_format_version": PREFIX_FORMAT_VERSION})
        out[name] = (len(ids), TaskPrefixFile(file=rel, sha256=sha256_file(root / rel),
                                              bytes=(root / rel).stat().st_size,
                                              fingerprint=info.fingerprint))
        advance()
    be.close()
    return out
