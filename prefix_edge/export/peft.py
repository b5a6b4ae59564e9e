"""PEFT prompt-learning adapters: read, check against the base model, lay out their KV.

An adapter dir holds `adapter_config.json` and `adapter_model.safetensors` with one tensor,
`prompt_embeddings` (what peft 0.21 saves: the prompt encoder's *output*, so P-tuning's MLP/LSTM
and prefix tuning's projection are already applied):

- PREFIX_TUNING, CARTRIDGE: [V, num_layers * 2 * token_dim], the KV itself. PEFT
  (`PeftModel.get_prompt`) views it as [V, 2L, num_attention_heads, token_dim / heads], layer l's
  key = index 2l, value = 2l + 1, and passes it as `past_key_values`: keys are used as stored (no
  RoPE), the input starts at position V and attends to all V virtual tokens. For grouped-KV
  models PEFT sets num_attention_heads = n_kv_heads and token_dim = n_kv_heads * head_dim.
  A cartridge (`CartridgeEncoder`) is the same tensor split into frozen + trainable rows for
  training only; saved, it is one [V, L*2*token_dim] tensor served exactly like prefix tuning.
- PROMPT_TUNING, P_TUNING: [V, hidden_size] input embeddings that PEFT concatenates *before* the
  input's embeddings (BOS included): their KV comes from running them through the model.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..bundle import ModelInfo, sha256_file
from ..errors import PrefixEdgeError
from ..tasks import TaskSpec

KV_TYPES = ("PREFIX_TUNING", "CARTRIDGE")       # the tensor is the KV
EMBEDDING_TYPES = ("PROMPT_TUNING", "P_TUNING")  # the tensor is input embeddings
PEFT_TYPES = KV_TYPES + EMBEDDING_TYPES
WEIGHTS = "adapter_model.safetensors"


@dataclass
class Adapter:
    task: str
    where: str                 # "FILE: task 'NAME': key 'adapter'" for messages
    path: Path
    peft_type: str
    config: dict[str, Any]
    embeddings: np.ndarray     # float32 [V, D]: prompt_embeddings as saved
    sha256: str
    # a KV adapter on a model whose layers differ in KV shape (Gemma 4): each layer's (KV heads,
    # head dim) and the shape PEFT provisions every layer's prefix at (check_adapter sets them)
    layer_shapes: list[tuple[int, int]] | None = None
    provisioned: tuple[int, int] | None = None

    @property
    def n_virtual(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def is_kv(self) -> bool:
        return self.peft_type in KV_TYPES

    def manifest_entry(self) -> dict[str, Any]:
        base = self.config.get("base_model_name_or_path")
        if isinstance(base, str) and os.path.isabs(base):
            base = Path(base).name  # a local path says nothing on another machine; keep its name
        return {"peft_type": self.peft_type, "num_virtual_tokens": self.n_virtual,
                "name": self.path.name, "sha256": self.sha256, "base_model": base}


def read_adapter(spec: TaskSpec) -> Adapter:
    """Read a peft task's adapter dir; every problem names the task file, task and key."""
    where = spec.where("adapter")
    path = Path(spec.adapter)

    def bad(msg: str) -> PrefixEdgeError:
        return PrefixEdgeError(f"{where}: {msg}")

    try:
        config = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise bad(f"{path} is not a PEFT adapter dir (no adapter_config.json)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"{path / 'adapter_config.json'} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise bad(f"{path / 'adapter_config.json'} is not a JSON object")
    peft_type = str(config.get("peft_type", ""))
    if peft_type not in PEFT_TYPES:
        raise bad(f"adapter {path.name} has peft_type {peft_type or 'none'!r}; prefix-edge bakes "
                  f"prompt-learning adapters: {', '.join(PEFT_TYPES)}")
    weights = path / WEIGHTS
    if not weights.is_file():
        alt = " (found adapter_model.bin: re-save with safe_serialization=True)" \
            if (path / "adapter_model.bin").is_file() else ""
        raise bad(f"{path} has no {WEIGHTS}{alt}")
    try:
        from safetensors.torch import load_file

        tensors = load_file(str(weights))
    except Exception as e:
        raise bad(f"cannot read {weights}: {e}") from None
    if "prompt_embeddings" not in tensors:
        raise bad(f"{weights} has no 'prompt_embeddings' tensor (has: {', '.join(sorted(tensors))})")
    emb = tensors["prompt_embeddings"].float().numpy()
    if emb.ndim != 2 or emb.shape[0] == 0:
        raise bad(f"prompt_embeddings is {list(emb.shape)}, expected [num_virtual_tokens, width]")
    if not np.all(np.isfinite(emb)):
        raise bad("prompt_embeddings holds NaN or infinite values")
    return Adapter(spec.name, where, path, peft_type, config, np.ascontiguousarray(emb),
                   sha256_file(weights))


def check_adapter(a: Adapter, m: ModelInfo, base_names: list[str],
                  warn: Callable[[str], None], config: dict | None = None) -> None:
    """Does the adapter fit the base model (`config`: its config.json)? A mismatch is an error
    naming both sides; a different `base_model_name_or_path` only a warning (names differ
    across copies)."""
    c = a.config
    mult = float((config or {}).get("embedding_multiplier", 1.0))
    if not a.is_kv and (config or {}).get("model_type") == "falcon_h1" and mult != 1.0:
        # FalconH1Model scales embed_tokens(input_ids) only, never inputs_embeds, which PEFT passes
        raise PrefixEdgeError(f"{a.where}: adapter {a.path.name} is {a.peft_type}: PEFT gives Falcon-H1 "
                              f"its text as inputs_embeds, which skip the model's embedding_multiplier "
                              f"({mult:g}), so what it trained is not this model on the text; a bundle "
                              "cannot give its answers")
    if (config or {}).get("model_type") in ("gemma3n", "gemma3n_text") and not a.is_kv:
        raise PrefixEdgeError(f"{a.where}: adapter {a.path.name} is {a.peft_type} on Gemma 3n, which "
                              "prefix-edge does not bake: PEFT runs a prompt-tuned Gemma 3n on embeddings, "
                              "without the per-layer inputs its layers take from token ids, and the "
                              "bundle's graph reads ids (prefix tuning and text tasks work)")

    if (config or {}).get("model_type") in ("gemma4", "gemma4_text") and not a.is_kv:
        raise PrefixEdgeError(f"{a.where}: adapter {a.path.name} is {a.peft_type} on Gemma 4, which "
                              "prefix-edge does not bake: PEFT gives a prompt-tuned Gemma 4 embeddings, from "
                              "which transformers cannot find the token ids its per-layer inputs read (it "
                              "refuses to run it); prefix tuning and text tasks work")

    def fits(key: str, got, want, what: str) -> None:
        if got is not None and got != want:
            raise PrefixEdgeError(f"{a.where}: adapter {a.path.name} has {key} = {got}, but the base "
                                  f"model has {want} {what}")

    V, width = a.embeddings.shape
    fits("num_virtual_tokens", c.get("num_virtual_tokens"), V,
         "(rows of its own prompt_embeddings)")
    if c.get("num_transformer_submodules", 1) != 1:
        raise PrefixEdgeError(f"{a.where}: adapter {a.path.name} has num_transformer_submodules = "
                              f"{c['num_transformer_submodules']} (an encoder-decoder adapter); the "
                              "base model is a decoder-only causal LM")
    fits("num_layers", c.get("num_layers"), m.n_layers, "layers")
    shapes = layer_kv_shapes(config or {})
    if a.is_kv and shapes is not None:  # Gemma 4: every layer's prefix at one shape, PEFT's widest
        heads, token_dim = c.get("num_attention_heads"), c.get("token_dim")  # as PEFT provisioned it
        if not isinstance(heads, int) or not isinstance(token_dim, int) or heads < 1 or token_dim % heads:
            raise PrefixEdgeError(f"{a.where}: adapter {a.path.name} does not say the KV shape it was "
                                  f"provisioned at (num_attention_heads {heads}, token_dim {token_dim})")
        dim = token_dim // heads
        shared = int(config.get("num_kv_shared_layers") or 0)
        for i, (h, d) in enumerate(shapes[:len(shapes) - shared]):
            if h > heads or d > dim:  # PEFT gives such a layer no prefix at all: not one sequence
                raise PrefixEdgeError(f"{a.where}: adapter {a.path.name} is provisioned at {heads} KV heads × "
                                      f"{dim}, which layer {i}'s {h} × {d} does not fit: PEFT leaves that layer "
                                      "without the prefix, which a bundle cannot hold")
        a.layer_shapes, a.provisioned = shapes, (heads, dim)
    elif a.is_kv:
        heads, dim = m.n_kv_heads, m.head_dim
        fits("token_dim", c.get("token_dim"), heads * dim, f"KV heads × head dim ({heads} × {dim})")
        fits("num_attention_heads", c.get("num_attention_heads"), heads, "KV heads")
    if a.is_kv:
        fits("prompt_embeddings width", width, m.n_layers * 2 * heads * dim,
             f"(layers × 2 × KV heads × head dim = {m.n_layers} × 2 × {heads} × {dim})")
    else:
        fits("token_dim", c.get("token_dim"), m.hidden_size, "as hidden size")
        fits("prompt_embeddings width", width, m.hidden_size, "as hidden size")
    base = c.get("base_model_name_or_path")
    if isinstance(base, str) and base and not same_model_name(base, base_names):
        warn(f"task '{a.task}': adapter {a.path.name} was trained on {base!r}, the base model here "
             f"is {base_names[0]!r} (shapes fit, so it is baked anyway)")


def _norm(name: str) -> str:
    """'HuggingFaceTB/SmolLM2-135M-Instruct', '/x/SmolLM2-135M-Instruct.Q4_1.gguf' -> 'smollm2-135m-instruct'."""
    name = name.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].lower()
    name = re.sub(r"\.gguf$", "", name)
    return re.sub(r"[.-](q\d\w*|f16|f32|bf16|iq\d\w*)$", "", name)


def same_model_name(base: str, names: list[str]) -> bool:
    """Loose match of an adapter's base_model_name_or_path with the names the base model goes
    by here (its path, its config's _name_or_path): same last path component, ignoring case,
    a .gguf suffix and a quantization suffix."""
    want = _norm(base)
    return any(want and want == _norm(n) for n in names if n)


# --- KV of prefix tuning / cartridges ---------------------------------------------------------

def adapter_kv(a: Adapter, m: ModelInfo) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-layer key and value of a KV adapter, float32 [n_kv_heads, V, head_dim] each (the HF
    cache layout: keys as PEFT passes them, i.e. un-rotated, in HF's rotate-half dim order). A
    model whose layers differ in KV shape (Gemma 4): each layer's first heads and dims of the
    provisioned prefix, as PEFT slices it."""
    if not a.is_kv:
        raise PrefixEdgeError(f"{a.where}: {a.peft_type} holds embeddings, not KV")
    V = a.n_virtual
    heads, dim = a.provisioned or (m.n_kv_heads, m.head_dim)
    shapes = a.layer_shapes or [(heads, dim)] * m.n_layers
    x = a.embeddings.reshape(V, 2 * m.n_layers, heads, dim).transpose(1, 2, 0, 3)
    return ([np.ascontiguousarray(x[2 * l, :h, :, :d]) for l, (h, d) in enumerate(shapes)],
            [np.ascontiguousarray(x[2 * l + 1, :h, :, :d]) for l, (h, d) in enumerate(shapes)])


def layer_kv_shapes(config: dict) -> list[tuple[int, int]] | None:
    """Each layer's (KV heads, head dim) of a config whose layers differ (Gemma 4's global
    layers: per_layer_config's overrides, or an older config's global_head_dim and
    num_global_key_value_heads), or None."""
    types = config.get("layer_types") or []
    per, gdim = config.get("per_layer_config"), config.get("global_head_dim")
    if not types or (not per and gdim is None):
        return None
    heads, dim = int(config["num_key_value_heads"]), int(config["head_dim"])
    if per:
        return [(int(per.get(str(i), {}).get("num_key_value_heads", heads)), int(per.get(str(i), {}).get("head_dim", dim)))
                for i in range(len(types))]
    gheads = int(config.get("num_global_key_value_heads") or heads)
    return [(heads, dim) if t == "sliding_attention" else (gheads, int(gdim)) for t in types]


def hf_keys_to_llama_cpp(k: np.ndarray) -> np.ndarray:
    """Per head, the HF→GGUF permutation of key dims (llama.cpp's converter permutes the rows of
    k_proj for a model with NORM RoPE the same way): llama.cpp dim 2i = HF dim i, dim 2i+1 = HF dim i + head_dim/2.
    `k` is [..., head_dim]; returns the same shape."""
    hd = k.shape[-1]
    if hd % 2:
        raise PrefixEdgeError(f"head_dim {hd} is odd: no rotate-half RoPE layout to permute")
    return np.stack([k[..., : hd // 2], k[..., hd // 2:]], axis=-1).reshape(k.shape)
