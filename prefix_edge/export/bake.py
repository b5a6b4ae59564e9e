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
from ..runtime.prefix import Prefix
from ..tasks import RenderedTask

from ..bundle.prefixfile import PREFIX_FORMAT_VERSION  # noqa: E402


def leading_special_ids(tokenizer) -> list[int]:
    """The ids a tokenizer adds in front of a text (BOS, for tokenizers that add one)."""
    plain = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    for k in range(len(full) - len(plain) + 1):
        if full[k:k + len(plain)] == plain:
            return full[:k]
    return []


def prefix_ids(tokenizer, rendered: RenderedTask, name: str, n_ctx: int,
               n_virtual: int = 0) -> list[int]:
    """The prefix's text ids (after `n_virtual` virtual tokens, for a peft task). A raw-text
    (chat = false) task's text starts with what the tokenizer adds in front of a text (a BOS,
    for models that want one: Gemma's answers are garbage without it), as llama.cpp and
    transformers see the same prompt; a peft one's as PEFT sees `tokenizer(text)`: soft prompt
    / prefix KV first, then BOS and the text. A chat task's template writes its own BOS."""
    text = rendered.prefix_text
    ids = tokenizer.encode(text, add_special_tokens=False).ids if text else []
    if not rendered.chat and (text or n_virtual):
        ids = leading_special_ids(tokenizer) + ids
    if not ids and not n_virtual:
        raise PrefixEdgeError(f"task '{name}': the prefix renders to no tokens")
    if n_virtual + len(ids) + 1 >= n_ctx:
        what = f"{n_virtual} virtual + {len(ids)} text" if n_virtual else f"{len(ids)}"
        raise PrefixEdgeError(f"task '{name}': prefix is {what} tokens, the model's context is {n_ctx}")
    return ids


def check_geometry(be, manifest: Manifest) -> None:
    m = manifest.model
    layers = getattr(be, "model_layers", be.n_layers)  # a hybrid's recurrent layers too
    if (layers, be.n_kv_heads, be.head_dim) != (m.n_layers, m.n_kv_heads, m.head_dim):
        raise PrefixEdgeError(
            f"the {be.name} model has {layers} layers × {be.n_kv_heads} KV heads × {be.head_dim}, "
            f"the model config says {m.n_layers} × {m.n_kv_heads} × {m.head_dim}")


def bake(be, manifest: Manifest, task_ids: dict[str, list[int]], root: Path, advance,
         adapters: dict | None = None, model_path: Path | None = None,
         store: str | None = None, compression=None) -> dict[str, TaskPrefixFile]:
    """Bake every task's prefix through backend `be` (the deployed model at `model_path`);
    `adapters` maps peft tasks to their export.peft.Adapter; `store` is how an onnx prefix
    stores its KV (bundle.prefixfile.KV_STORES; None: the graph's own dtype); `compression`:
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
    soft = _SoftPrompts(be, manifest.model, model_path)
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
            if ids:
                logits = be.prefill(np.array(ids, np.int64))
                if not np.all(np.isfinite(logits)):  # its KV then holds them too: never baked
                    raise PrefixEdgeError(f"task '{name}': the {be.name} model computes NaN or infinite values "
                                          "on this prefix (a token whose embedding it cannot normalise?)")
            rel = layout.prefix_file(name, be.name)
            plan = compression[0].get(name) if compression else None
            if plan is None:
                be.save_prefix(root / rel, np.array(ids, np.int64), meta, **({"store": store} if store else {}))
            else:
                _save_compressed(be, root / rel, plan, compression[1], compression[2], meta, store)
            (root / rel).chmod(0o644)  # safetensors creates 0600 files; a bundle is meant to be shared
            out[name] = TaskPrefixFile(file=rel, sha256=sha256_file(root / rel),
                                       bytes=(root / rel).stat().st_size, fingerprint=info.fingerprint)
            advance()
    finally:
        soft.close()
    return out


def _save_compressed(be, path: Path, plan, inv_freq, rope_on, meta: dict, store: str | None) -> None:
    """Write the current sequence, reduced to `plan`'s kept tokens, as the task's prefix file."""
    from .compress import compressed_kv

    prefix = compressed_kv(be, plan, inv_freq, rope_on)
    if be.name == "onnx":
        from ..runtime.engines.onnx.prefix_files import write_prefix

        write_prefix(path, prefix.ids, dict(zip(be.past_names, prefix.kv)), meta, store or "f32")
    else:
        from ..runtime.engines.llama.prefix_files import write_prefix

        write_prefix(path, prefix.ids, prefix.kv, meta, be.kv_type, be.expected_state())


def _begin_virtual(be, adapter, m: ModelInfo, soft: "_SoftPrompts") -> None:
    """Reset `be` to a sequence holding the adapter's V virtual positions."""
    from .peft import adapter_kv

    if adapter.is_kv:
        be.begin(kv_prefix(be, *adapter_kv(adapter, m), m))
    elif be.name == "gguf":
        be.begin(None)
        be.prefill_embeddings(adapter.embeddings)
    elif be.name == "onnx":
        kv = soft.runner().kv(adapter.embeddings)
        be.begin(Prefix(np.zeros(0, np.int64), kv, {}, sum(t.nbytes for t in kv),
                        n_virtual=adapter.n_virtual))
    else:
        raise PrefixEdgeError(f"no soft-prompt route for the {be.name} backend")


def kv_prefix(be, keys: list[np.ndarray], values: list[np.ndarray], m: ModelInfo) -> Prefix:
    """A Prefix of V virtual positions for backend `be` from per-layer HF-layout K and V
    ([n_kv_heads, V, head_dim] each, keys un-rotated as PEFT uses them) of model `m`."""
    from .peft import hf_keys_to_llama_cpp

    V = keys[0].shape[1]
    empty = np.zeros(0, np.int64)
    if getattr(be, "recurrent_layers", 0):
        raise PrefixEdgeError(f"a prefix-tuning adapter sets each layer's KV; this model's "
                              f"{be.recurrent_layers} recurrent layers keep a state, not a KV, so "
                              "prefix tuning cannot apply to it (prompt tuning can)")
    if be.name == "onnx":
        named = {}
        for l, (k, v) in enumerate(zip(keys, values)):
            named[f"past_key_values.{l}.key"] = np.ascontiguousarray(k[None], dtype=be.kv_dtype)
            named[f"past_key_values.{l}.value"] = np.ascontiguousarray(v[None], dtype=be.kv_dtype)
        kv = [named[n] for n in be.past_names]
        return Prefix(empty, kv, {}, sum(t.nbytes for t in kv), n_virtual=V)
    if be.name == "gguf":
        from ..llamacpp.seqstate_write import build_seq_state

        from ..runtime.kv import hf_rope_layout

        hf = hf_rope_layout(m)  # PEFT's keys pair their dims as the HF model's rotary does
        if (hf, be.rope_layout) == ("halves", "adjacent"):  # llama.cpp's converter permuted q/k
            keys = [hf_keys_to_llama_cpp(k) for k in keys]
        elif be.rope_layout != hf:
            raise PrefixEdgeError(f"the GGUF model uses {be.rope_layout}: prefix-edge does not know "
                                  "its key layout, so it cannot inject a prefix-tuning KV")

        def rows(a: np.ndarray) -> np.ndarray:  # [n_kv, V, d] -> [V, n_kv * d], F16 cells
            return np.ascontiguousarray(a.transpose(1, 0, 2).reshape(V, -1), dtype=np.float16)

        from ..llamacpp.lib import KV_TYPES

        lay = be.state_layout
        held = lay.kv_layers + lay.window_layers
        swa_layers = m.sliding_layers
        if held < len(keys) and m.model_type.startswith("gemma3n"):
            # Gemma 3n's KV-shared layers hold no KV (llama.cpp: the first n_layer_kv_from_start
            # do); they read their source layer's, prefix included, as transformers does
            keys, values = keys[:held], values[:held]
            swa_layers = [i for i in swa_layers if i < held]
        if be.n_swa and (len(swa_layers) != be.swa_n_layer or m.sliding_window != be.n_swa):
            raise PrefixEdgeError(
                f"the GGUF model keeps {be.swa_n_layer} sliding-window layers of {be.n_swa} positions, "
                f"the checkpoint's config {len(swa_layers)} of {m.sliding_window}: cannot place "
                "a prefix-tuning KV in its caches")
        blob = build_seq_state([rows(k) for k in keys], [rows(v) for v in values], be.v_trans,
                               kv_type=KV_TYPES[be.kv_type], rotation=be.kv_rotation,
                               swa_layers=swa_layers if be.n_swa else (), window=be.n_swa)
        state = np.frombuffer(blob, np.uint8)
        return Prefix(empty, state, {}, state.nbytes, n_virtual=V)
    raise PrefixEdgeError(f"no prefix-tuning route for the {be.name} backend")


class _SoftPrompts:
    """The ONNX soft-prompt runner, made on first use and closed after baking."""

    def __init__(self, be, m: ModelInfo, model_path: Path | None):
        self.be, self.m, self.model_path, self._runner = be, m, model_path, None

    def runner(self):
        if self._runner is None:
            from .soft_prompt import SoftPromptRunner

            if self.model_path is None:
                raise PrefixEdgeError("baking a soft prompt needs the deployed ONNX model's path")
            be = self.be
            self._runner = SoftPromptRunner(self.model_path, be.past_names, be.n_kv_heads,
                                            be.head_dim, be.kv_dtype, self.m.hidden_size,
                                            dict(zip(be.state_names, be.state_shapes)))
        return self._runner

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None
