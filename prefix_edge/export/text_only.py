"""The text path of a multimodal checkpoint, as an HF model dir of its own.

Gemma 3n ships as `Gemma3nForConditionalGeneration`: a vision tower, an audio tower and their
embedders beside the language model, the text model's config nested under `text_config` and
its weights under `model.language_model.`. A bundle serves text, so export reads that
checkpoint as the text-only model transformers also defines (`Gemma3nForCausalLM`, model type
`gemma3n_text`): config.json is the `text_config` (architectures and model type set), the
weights are the language model's (renamed `model.*`; the towers' are not copied), and every
other file (tokenizer, chat template, generation config) is linked or copied as it is. The
transformers reference, llama.cpp's converter (which knows both names) and the own ONNX graph
all read that one dir, so they read the same model.

Checked against the multimodal class on text: tests/test_gemma3n.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..errors import PrefixEdgeError

# multimodal architecture -> (its text-only class, model type, the text weights' prefix)
TEXT_PATHS = {
    "Gemma3nForConditionalGeneration": ("Gemma3nForCausalLM", "gemma3n_text", "model.language_model."),
    "Gemma4ForConditionalGeneration": ("Gemma4ForCausalLM", "gemma4_text", "model.language_model."),
    "Qwen3_5ForConditionalGeneration": ("Qwen3_5ForCausalLM", "qwen3_5_text", "model.language_model."),
}
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth")


def text_path(cfg: dict) -> tuple[str, str, str] | None:
    """(text class, model type, weight prefix) when config.json is a multimodal model whose text
    path export reads, else None."""
    return TEXT_PATHS.get((cfg.get("architectures") or ["?"])[0])


def write_text_only(src: Path, cfg: dict, out: Path) -> Path:
    """Write the text-only view of the multimodal checkpoint `src` into `out` and return it."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    arch = cfg["architectures"][0]
    cls, model_type, prefix = TEXT_PATHS[arch]
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise PrefixEdgeError(f"{src}: {arch} without a text_config in config.json")
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise PrefixEdgeError(f"{src}: {arch} without .safetensors weights (export reads its text path from them)")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shards = []  # (source file, its text tensors' names); shard by shard: the towers never held
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            names = [k for k in sf.keys() if k.startswith(prefix) or k == "lm_head.weight"]
        if names:
            shards.append((f, names))
    if not shards:
        raise PrefixEdgeError(f"{src}: {arch} holds no {prefix}* weights")
    weight_map = {}
    for i, (f, names) in enumerate(shards):
        name = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        with safe_open(str(f), framework="pt") as sf:
            keep = {("model." + k[len(prefix):] if k.startswith(prefix) else k): sf.get_tensor(k) for k in names}
        save_file(keep, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(keep, name))
    if len(shards) > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    text = {**text, "architectures": [cls], "model_type": model_type}
    for k in ("torch_dtype", "dtype", "transformers_version"):
        if k in cfg and k not in text:
            text[k] = cfg[k]
    tie = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings"))
    if tie is not None:
        text["tie_word_embeddings"] = tie
    (out / "config.json").write_text(json.dumps(text, indent=2))
    for p in src.iterdir():  # tokenizer, chat template, generation config ...
        if p.is_file() and p.name != "config.json" and not p.name.endswith(_WEIGHTS) \
                and not p.name.endswith(".index.json"):
            try:
                os.link(p, out / p.name)
            except OSError:
                shutil.copy2(p, out / p.name)
    return out
