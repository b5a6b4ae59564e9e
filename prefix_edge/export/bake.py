"""Baking: run each task's prefix through the deployed model and store that backend's KV.

A text task's prefix is its token ids, prefilled from an empty sequence. A peft task's prefix
starts with V virtual positions installed from its adapter (export/peft.py):

- prefix tuning / cartridge: the adapter's KV itself, written straight into the backend's
  format (ONNX: past tensors in the graph's KV dtype; llama.cpp: F16 seq-state cells 0..V-1 with
  keys permuted into llama.cpp's RoPE layout) and restored like a baked text prefix;
- prompt tuning / P-tuning: the soft-prompt embeddings decoded at positions 0..V-1 (llama.cpp:
  an embeddings batch; ONNX: export/soft_prompt.py).

Text after the virtual part (a peft task's `system`/`prefix`) is then prefilled on the deployed
model, and the whole sequence saved: the prefix file's ids hold only that text, its metadata
`n_virtual` = V.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..bundle import Manifest, ModelInfo, TaskPrefixFile, layout, sha256_file
from ..errors import PrefixEdgeError
from ..bundle import prefixfile
from ..runtime.engines.prefix import Prefix
from ..runtime.engines.protocol import PREFILL_CHUNK

from ..bundle.prefixfile import PREFIX_FORMAT_VERSION  # noqa: E402


def check_geometry(be, manifest: Manifest) -> None:
    m = manifest.model
    layers = be.model_layers  # a hybrid's recurrent layers too
    # (Gemma 4: global and sliding layers' heads of their own size and count)
    shapes = set(getattr(be, "kv_shapes", ())) | {(be.n_kv_heads, be.head_dim),
                                                  (be.n_kv_heads, getattr(be, "head_dim_swa", be.head_dim))}
    if layers != m.n_layers or m.n_kv_heads not in {h for h, _ in shapes} or m.head_dim not in {d for _, d in shapes}:
        raise PrefixEdgeError(
            f"the {be.name} model has {layers} layers × {be.n_kv_heads} KV heads × {be.head_dim}, "
            f"the model config says {m.n_layers} × {m.n_kv_heads} × {m.head_dim}")


def bake(be, manifest: Manifest, task_ids: dict[str, list[int]], root: Path, advance,
         adapters: dict | None = None, model_path: Path | None = None,
         compression=None) -> dict[str, TaskPrefixFile]:
    """Bake every task's prefix through backend `be` (the deployed model at `model_path`; its
    files written as the engine was opened to, e.g. an onnx prefix's KV store);
    `adapters` maps peft tasks to their export.peft.Adapter; `compression`:
    (plans {task: export.compress.Plan}, the model's inv_freq, its RoPE layers), a compressed
    task's whole prefix prefilled and then reduced (export/compress.py). Fills in the backend's
    KV dtype, state facts and fingerprint in `manifest`. Returns {task: file entry}."""
    check_geometry(be, manifest)
    adapters = adapters or {}
    info = manifest.backends[be.name]
    info.kv_dtype = be.kv_dtype_name
    info.state = be.state_info()
    info.fingerprint = manifest.fingerprint(be.name)
    out = {}
    soft = _SoftPrompts(manifest.model, model_path)
    try:
        for name, ids in task_ids.items():
            meta = {"fingerprint": info.fingerprint, "task": name,
                    "task_digest": manifest.task_digest(name),
                    "prefix_format_version": PREFIX_FORMAT_VERSION}
            adapter = adapters.get(name)
            if adapter is None:
                be.begin(None)
            else:
                _begin_virtual(be, adapter, manifest.model, soft)
                meta["n_virtual"] = str(adapter.n_virtual)
            if ids:  # in the runtime's chunks, as its uncached prefill reads a prefix (protocol.PREFILL_CHUNK)
                logits = be.prefill(np.array(ids, np.int64), chunk=PREFILL_CHUNK)
                if not np.all(np.isfinite(logits)):  # its KV then holds them too: never baked
                    raise PrefixEdgeError(f"task '{name}': the {be.name} model computes NaN or infinite values "
                                          "on this prefix (a token whose embedding it cannot normalise?)")
            rel = layout.prefix_file(name, be.name)
            plan = compression[0].get(name) if compression else None
            if plan is None:
                be.save_prefix(root / rel, np.array(ids, np.int64), meta)
            else:  # the whole prefix prefilled, then reduced (export/compress.py)
                from .compress import compressed_kv

                be.write_snapshot(root / rel, compressed_kv(be, plan, compression[1], compression[2]), meta)
            (root / rel).chmod(0o644)  # safetensors creates 0600 files; a bundle is meant to be shared
            out[name] = TaskPrefixFile(file=rel, sha256=sha256_file(root / rel),
                                       bytes=(root / rel).stat().st_size, fingerprint=info.fingerprint)
            advance()
    finally:
        soft.close()
    return out


def _begin_virtual(be, adapter, m: ModelInfo, soft: "_SoftPrompts") -> None:
    """Reset `be` to a sequence holding the adapter's V virtual positions."""
    from .peft import adapter_kv

    if adapter.is_kv:
        be.begin(kv_prefix(be, *adapter_kv(adapter, m), m))
    elif be.takes_embeddings:
        be.begin(None)
        be.prefill_embeddings(adapter.embeddings)
    else:  # a graph that takes token ids only: an edited copy of it runs the soft prompt
        runner = soft.runner()  # the graph's own arrays: its KV inputs', then a hybrid's states
        arrays = dict(zip(runner.past_names + list(runner.states), runner.kv(adapter.embeddings)))
        be.begin(be.prefix_from({prefixfile.IDS: np.zeros(0, np.int64), **arrays},
                                {"n_virtual": str(adapter.n_virtual)}, "the soft prompt's KV", lasting=True))


def kv_prefix(be, keys: list[np.ndarray], values: list[np.ndarray], m: ModelInfo) -> Prefix:
    """A Prefix of V virtual positions for engine `be` from per-layer HF-layout K and V
    ([n_kv_heads, V, head_dim] each, keys un-rotated as PEFT uses them) of model `m`, made by
    the engine (prefix_of) from the KV as data; what only the checkpoint knows is said here: how
    its keys pair their rotated dims, which layers slide, which hold no KV of their own."""
    from .peft import hf_keys_to_llama_cpp
    from ..runtime.engines.kv import KvLayers, hf_rope_layout

    V = keys[0].shape[1]
    lay = be.state_layout
    if lay.recurrent_layers:
        raise PrefixEdgeError(f"a prefix-tuning adapter sets each layer's KV; this model's "
                              f"{lay.recurrent_layers} recurrent layers keep a state, not a KV, so "
                              "prefix tuning cannot apply to it (prompt tuning can)")
    hf = hf_rope_layout(m)  # PEFT's keys pair their dims as the HF model's rotary does
    if (hf, be.rope_layout) == ("halves", "adjacent"):  # llama.cpp's converter permuted q/k
        keys = [hf_keys_to_llama_cpp(k) for k in keys]
    elif be.rope_layout != hf:
        raise PrefixEdgeError(f"the {be.name} model uses {be.rope_layout}: prefix-edge does not know "
                              "its key layout, so it cannot inject a prefix-tuning KV")
    held = lay.kv_layers + lay.window_layers
    sliding = list(m.sliding_layers)
    if held < len(keys) and m.model_type.startswith(("gemma3n", "gemma4")):
        # Gemma 3n's and 4's KV-shared layers hold no KV (llama.cpp: the first n_layer_kv_from_start
        # do); they read their source layer's, prefix included, as transformers does
        keys, values = keys[:held], values[:held]
        sliding = [i for i in sliding if i < held]
    kv = KvLayers([k.transpose(1, 0, 2) for k in keys], [v.transpose(1, 0, 2) for v in values])
    return be.prefix_of(kv, np.zeros(0, np.int64), n_virtual=V, sliding=tuple(sliding),
                        window=int(m.sliding_window or 0) if sliding else 0)


class _SoftPrompts:
    """The ONNX soft-prompt runner, made on first use and closed after baking."""

    def __init__(self, m: ModelInfo, model_path: Path | None):
        self.m, self.model_path, self._runner = m, model_path, None

    def runner(self):
        if self._runner is None:
            from .soft_prompt import SoftPromptRunner

            if self.model_path is None:
                raise PrefixEdgeError("baking a soft prompt needs the deployed ONNX model's path")
            self._runner = SoftPromptRunner(self.model_path, self.m.hidden_size)
        return self._runner

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None
