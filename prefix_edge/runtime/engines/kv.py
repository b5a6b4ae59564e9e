"""KV as data: a run of positions' keys and values, layer by layer, and the one place keys are
re-rotated to other positions.

`KvLayers` is what the engines hand out and take back (`engine.kv_of(prefix)`,
`engine.prefix_of(kv, ids)`): per attention layer, K and V as [positions, kv_heads, head_dim]
(keys post-RoPE, as the model cached them), in the engine's KV dtype (float32 ONNX, float16
llama.cpp f16; a q8_0 cache's values dequantized to float32). Whatever builds or reshapes KV
(composed documents, compressed prefixes) works on these arrays, not on an engine's own format.

Rotation. RoPE attention depends only on the distance between a query and a key, so a key
cached at position p moves to p + delta by one more rotation by delta (`shift_keys`); values
do not move. `Rope.of(model)` reads the frequencies from the bundle's manifest (theta, the
scaling's kind) so the runtime needs no torch; `Rope.refusal(model)` says in one line why a
model's keys cannot be moved (sliding-window layers, recurrent layers, layers without RoPE,
a norm after the rotary, a length-dependent scaling), None where they can. Each engine says
how its cache pairs the rotated dimensions (`engine.rope_layout`: "halves", HF and llama.cpp's
NEOX; "adjacent", llama.cpp's NORM and interleaved rotaries). tests/test_composed.py checks the
frequencies against both engines' own layer-0 keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...errors import PrefixEdgeError

# model types whose every attention layer rotates keys with one set of frequencies before
# caching them (q/k norms, where they have them, come before the rotary)
ROTATABLE = {"llama", "mistral", "qwen2", "qwen3", "phi3", "granite", "olmo2", "ernie4_5", "gemma"}
# a GGUF-only bundle's model_type is "gguf:ARCH" (llama.cpp's architecture names): the same
# families, its rotary from the GGUF's metadata, used only once held to llama.cpp's own keys
# at export (export/gguf_source.py check_rope: ModelInfo.rope["checked"])
GGUF_ROTATABLE = {"llama", "qwen2", "qwen3", "phi3", "granite", "olmo2", "ernie4_5", "gemma"}
SCALINGS = ("default", "linear", "llama3")
INTERLEAVED = {"ernie4_5"}  # HF rotates (2i, 2i+1) pairs for these


def hf_rope_layout(model) -> str:
    """How a graph exported from the HF model pairs a cached key's rotated dims."""
    return "adjacent" if model.model_type in INTERLEAVED else "halves"


@dataclass
class KvLayers:
    """Positions' K and V per attention layer: k[i], v[i] are [n, kv_heads, head_dim]."""

    k: list[np.ndarray]
    v: list[np.ndarray]

    @property
    def n(self) -> int:
        return int(self.k[0].shape[0]) if self.k else 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def span(self, start: int, end: int | None = None, copy: bool = True) -> "KvLayers":
        """Positions start..end-1 (copies, so that nothing keeps a larger array alive; views
        with copy=False)."""
        if not copy:
            return KvLayers([a[start:end] for a in self.k], [a[start:end] for a in self.v])
        return KvLayers([a[start:end].copy() for a in self.k], [a[start:end].copy() for a in self.v])

    def then(self, other: "KvLayers") -> "KvLayers":
        """These positions followed by other's."""
        if len(other.k) != len(self.k):
            raise PrefixEdgeError(f"KV of {len(other.k)} layers cannot follow KV of {len(self.k)}")
        return KvLayers([np.concatenate([a, b.astype(a.dtype, copy=False)]) for a, b in zip(self.k, other.k)],
                        [np.concatenate([a, b.astype(a.dtype, copy=False)]) for a, b in zip(self.v, other.v)])

    def shifted(self, delta: int, rope: "Rope", layout: str) -> "KvLayers":
        """The same positions moved by delta (keys re-rotated; values as they are)."""
        if delta == 0:
            return self
        return KvLayers([shift_keys(a, delta, rope.inv_freq, layout, exact=False) for a in self.k],
                        list(self.v))


@dataclass(frozen=True)
class Rope:
    inv_freq: np.ndarray  # float64 [rotary_dims / 2]

    @classmethod
    def refusal(cls, model) -> str | None:
        """Why this model's cached keys cannot be moved to other positions (one line), or None."""
        gguf = model.model_type.startswith("gguf:")
        if model.sliding_layers or (gguf and model.sliding_window):
            return "its sliding-window layers would see other tokens at the new positions"
        if (model.model_type.removeprefix("gguf:") not in GGUF_ROTATABLE) if gguf else (model.model_type not in ROTATABLE):
            return (f"moving its keys is not supported for {model.model_type!r} models (layers without "
                    "RoPE, a norm after the rotary, or not checked yet)")
        scaling = (model.rope or {}).get("scaling") or {}
        kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "?"
        if kind not in SCALINGS:
            return f"its RoPE scaling {kind!r} is not one whose keys can be re-rotated here"
        if gguf and not (model.rope or {}).get("checked"):
            return ("the rotary its GGUF's metadata gives did not match llama.cpp's own keys at export"
                    if "checked" in (model.rope or {}) else
                    "its rotary was not held to llama.cpp's own keys at export (re-export the bundle)")
        return None

    @classmethod
    def of(cls, model) -> "Rope":
        """The model's rotary frequencies from the manifest's ModelInfo (as transformers builds
        them: theta, partial rotary, linear and llama3 scaling)."""
        why = cls.refusal(model)
        if why is not None:
            raise PrefixEdgeError(f"this model's keys cannot be moved: {why}")
        rope = model.rope or {}
        dims = int(model.head_dim * float(rope.get("partial_rotary_factor") or 1.0))
        dims -= dims % 2
        inv = 1.0 / float(rope.get("theta") or 10000.0) ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
        scaling = rope.get("scaling") or {}
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "linear":
            inv = inv / float(scaling["factor"])
        elif kind == "llama3":
            inv = _llama3(inv, scaling)
        return cls(inv)


def _llama3(inv: np.ndarray, s: dict) -> np.ndarray:
    """Llama 3.1's frequency scaling (transformers' _compute_llama3_parameters)."""
    factor, lo, hi = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old / lo, old / hi
    wavelen = 2 * math.pi / inv
    out = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    mid = (1 - smooth) * out / factor + smooth * out
    between = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(between, mid, out)


def shift_keys(k: np.ndarray, delta: int, inv_freq: np.ndarray, layout: str,
               exact: bool = True) -> np.ndarray:
    """Keys [..., head_dim] rotated at position p, re-rotated to p + delta (the angles in
    float64; the products in float64, or float32 with exact=False: a float32 or float16 cache
    loses nothing it holds), the input's dtype out. layout "halves": dims (i, i + r/2) pair (HF,
    NEOX); "adjacent": (2i, 2i+1) (llama.cpp's NORM); r = 2 * len(inv_freq) leading dims rotate
    (partial rotary)."""
    half = inv_freq.size
    work = np.float64 if exact else np.float32
    theta = float(delta) * inv_freq
    c, s = np.cos(theta).astype(work), np.sin(theta).astype(work)
    x = np.asarray(k, work)
    out = x.copy()
    if layout == "halves":
        a, b = x[..., :half], x[..., half:2 * half]
        out[..., :half], out[..., half:2 * half] = a * c - b * s, a * s + b * c
    elif layout == "adjacent":
        a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = a * c - b * s, a * s + b * c
    else:
        raise PrefixEdgeError(f"unknown RoPE key layout {layout!r}")
    return out.astype(k.dtype)
