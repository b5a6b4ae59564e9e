"""Baking: run each task's prefix through the deployed model and store that backend's KV."""

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


def check_geometry(be, manifest: Manifest) -> None:
    m = manifest.model
    if (be.n_layers, be.n_kv_heads, be.head_dim) != (m.n_layers, m.n_kv_heads, m.head_dim):
        raise PrefixEdgeError(
            f"the {be.name} model has {be.n_layers} layers × {be.n_kv_heads} KV heads × {be.head_dim}, "
            f"the model config says {m.n_layers} × {m.n_kv_heads} × {m.head_dim}")


def bake(be, manifest: Manifest, task_ids: dict[str, list[int]], root: Path,
         advance) -> dict[str, TaskPrefixFile]:
    """Bake every task's prefix ids through backend `be` (the deployed model); fill in the
    backend's KV dtype, state facts and fingerprint in `manifest`. Returns {task: file entry}."""
    check_geometry(be, manifest)
    info = manifest.backends[be.name]
    info.kv_dtype = be.kv_dtype_name
    info.state = be.state_info()
    info.fingerprint = manifest.fingerprint(be.name)
    out = {}
    for name, ids in task_ids.items():
        be.begin(None)
        be.prefill(np.array(ids, np.int64))
        rel = f"tasks/{name}.{be.name}.safetensors"
        be.save_prefix(root / rel, np.array(ids, np.int64),
                       {"fingerprint": info.fingerprint, "task": name,
                        "prefix_format_version": PREFIX_FORMAT_VERSION})
        (root / rel).chmod(0o644)  # safetensors creates 0600 files; a bundle is meant to be shared
        out[name] = TaskPrefixFile(file=rel, sha256=sha256_file(root / rel),
                                   bytes=(root / rel).stat().st_size, fingerprint=info.fingerprint)
        advance()
    return out
