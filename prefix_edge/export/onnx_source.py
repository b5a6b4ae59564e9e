"""What the own ONNX graph builder (export/onnx_graph.py) reads of a checkpoint: its config,
checked (a model or setting the graph cannot build is one line naming it and the alternative),
its weights as fp32 numpy, and its RoPE caches as transformers computes them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import PrefixEdgeError
from .onnx_gemma3n import GEMMA3N
from .onnx_gemma4 import GEMMA4
from .onnx_deltanet import OLMO_HYBRID, QWEN3_5
from .onnx_hybrid import FALCON_H1, GRANITE_H, LFM2, LFM3, NEMOTRON_H
from .source import rope_parameters

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "Phi3ForCausalLM", "SmolLM3ForCausalLM", "GraniteForCausalLM", "Gemma3ForCausalLM",
                 "Olmo2ForCausalLM", "Exaone4ForCausalLM", "HunYuanDenseV1ForCausalLM", "Ernie4_5ForCausalLM",
                 LFM2, GRANITE_H, FALCON_H1, GEMMA3N, "Olmo3ForCausalLM", "Ministral3ForCausalLM", NEMOTRON_H,
                 QWEN3_5, OLMO_HYBRID, LFM3, GEMMA4)
POST_NORMS = ("Olmo2ForCausalLM", "Olmo3ForCausalLM", "Exaone4ForCausalLM")  # no pre-norms: a norm after each sublayer
HUNYUAN = "HunYuanDenseV1ForCausalLM"
GEMMA3_LAYERS = ("sliding_attention", "full_attention")
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")


def refuse(what: str) -> PrefixEdgeError:
    return PrefixEdgeError(f"the own ONNX builder has no {what}; export with --onnx-builder optimum")


def read_config(hf_dir: Path) -> dict:
    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = (cfg.get("architectures") or ["?"])[0]
    if arch not in ARCHITECTURES:
        from .llama_convert import converter_knows

        gguf = " --format gguf (llama.cpp's converter knows it), or" if converter_knows(arch) else ""
        raise PrefixEdgeError(f"the own ONNX builder does not know {arch} (it builds "
                              f"{', '.join(ARCHITECTURES)}); export with{gguf} --onnx-builder optimum")
    scaling = rope_parameters(cfg)
    kind = scaling["rope_type"]
    if kind == "dynamic" and arch == HUNYUAN and scaling.get("alpha"):
        kind = "default"  # NTK alpha: a fixed base up to max_position_embeddings (rope_cache)
    if kind not in ROPE_TYPES:
        raise refuse(f"{kind!r} RoPE scaling (it depends on the sequence length)" if kind in
                      ("dynamic", "longrope") else f"{kind!r} RoPE scaling")
    gemma = arch in ("Gemma3ForCausalLM", GEMMA3N, GEMMA4)  # its MLP reads hidden_activation, GELU-tanh
    act = cfg.get("hidden_activation", "gelu_pytorch_tanh") if gemma else \
        cfg.get("hidden_act", cfg.get("hidden_activation", "silu"))
    if act != ("gelu_pytorch_tanh" if gemma else "silu"):
        raise refuse(f"{act!r} activation{' on ' + arch if gemma else ''}")
    if cfg.get("attention_bias") and arch in ("Qwen3ForCausalLM", "Phi3ForCausalLM", "Gemma3ForCausalLM", QWEN3_5,
                                              "Exaone4ForCausalLM", GEMMA3N):
        raise refuse(f"attention bias on {arch}")
    if cfg.get("mlp_bias"):
        raise refuse("MLP bias")
    if arch == GRANITE_H and cfg.get("num_local_experts"):  # before any weight is read (a 7B MoE's are many)
        raise PrefixEdgeError(f"the own ONNX builder has no experts (num_local_experts "
                              f"{cfg['num_local_experts']}) on {GRANITE_H}; export with --format gguf")
    return cfg


def gemma3_config(hf_dir: Path, cfg: dict):
    """Gemma 3's text config as transformers reads it (its defaults: layer_types from
    sliding_window_pattern, head_dim, query_pre_attn_scalar ...), refused where the graph cannot
    follow it."""
    from transformers import AutoConfig

    bad = [t for t in cfg.get("layer_types") or () if t not in GEMMA3_LAYERS]
    if bad:  # before transformers, whose config refuses them in its own words
        raise refuse(f"{bad[0]!r} layers on Gemma3ForCausalLM (it builds {', '.join(GEMMA3_LAYERS)})")
    c = AutoConfig.from_pretrained(str(hf_dir))
    for k in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(c, k, None) is not None:
            raise refuse(f"{k} ({getattr(c, k)}) on Gemma3ForCausalLM")
    if getattr(c, "use_bidirectional_attention", False):
        raise refuse("bidirectional attention (use_bidirectional_attention) on Gemma3ForCausalLM")
    if "sliding_attention" in c.layer_types and not c.sliding_window:
        raise refuse("sliding_attention layers without a sliding_window on Gemma3ForCausalLM")
    return c


def read_weights(hf_dir: Path) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint as fp32 numpy (bf16/f16 widened through torch)."""
    from safetensors.torch import load_file

    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise PrefixEdgeError(f"{hf_dir}: no .safetensors weights for the own ONNX builder")
    out = {}
    for f in files:
        for k, t in load_file(str(f)).items():
            out[k] = t.float().numpy()
    return out


def rope_cache(hf_dir: Path, n_pos: int, local: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [n_pos, rotary_dim/2] as transformers computes them for this config (its own
    RoPE init function: partial rotary, linear/llama3/yarn scaling, yarn's attention factor).
    `local`: the sliding layers' RoPE of a config with one per layer type (Gemma 3's)."""
    import torch
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = AutoConfig.from_pretrained(str(hf_dir))
    config = getattr(config, "text_config", None) or config
    layer_type = "sliding_attention" if local else "full_attention"
    nested = all(isinstance(v, dict) for v in (config.rope_parameters or {}).values())
    p = rope_parameters({"rope_parameters": config.rope_parameters,
                         "partial_rotary_factor": getattr(config, "partial_rotary_factor", None)}, layer_type)
    kind = p["rope_type"]
    try:  # a config whose layer types differ in head size (Gemma 4's): this type's
        dims = config.per_layer_config[layer_type]
    except (AttributeError, KeyError, TypeError, ValueError):
        dims = config
    dim = getattr(dims, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if kind == "default" or (kind == "dynamic" and p.get("alpha")):
        base = float(p["rope_theta"])
        if kind == "dynamic":  # Hunyuan's NTK alpha, as HunYuanDenseV1RotaryEmbedding: the base scaled
            base *= p["alpha"] ** (dim / (dim - 2))
        dim = int(dim * float(p.get("partial_rotary_factor") or 1.0))
        inv, scale = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)), 1.0
    else:
        inv, scale = ROPE_INIT_FUNCTIONS[kind](config, "cpu", layer_type=layer_type if nested else None)
    freqs = torch.arange(n_pos, dtype=torch.float32)[:, None] * inv.float()[None, :]
    return (freqs.cos() * scale).numpy().astype(np.float32), (freqs.sin() * scale).numpy().astype(np.float32)
