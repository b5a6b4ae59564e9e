"""Convert a Hugging Face checkpoint directory to a GGUF file for llama.cpp.

Written with the `gguf` package (the writer, tensor-name map, key names and `SpecialVocab`);
llama.cpp's own `convert_hf_to_gguf.py` is not a package, so the few rules it applies to this
model family are repeated here:

- Architectures: LlamaForCausalLM (SmolLM/SmolLM2 included) and MistralForCausalLM become GGUF
  arch "llama"; Qwen2ForCausalLM becomes "qwen2" (q/k/v biases). Anything else is refused.
- llama/mistral: the rows of Q and K (weights and biases) are permuted per head. HF rotates the
  two halves of a head (rotate-half RoPE); llama.cpp's "llama" rotates adjacent pairs, so HF dim i
  goes to 2i and dim i + head_dim/2 to 2i + 1. llama.cpp runs "qwen2" with NEOX (rotate-half)
  RoPE, so Qwen2 weights are written as they are.
- Tied embeddings: no `output.weight`; llama.cpp then reuses `token_embd.weight`.
- RoPE scaling: none, linear, or llama3 (as a `rope_freqs.weight` tensor). Mistral's
  `sliding_window` is not written (llama.cpp's "llama" has none), as llama.cpp's converter does:
  outputs differ only past the window.
- f16: 2-D weights in f16, 1-D tensors (norms, biases, rope factors) stay f32.
- Tokenizer: byte-level BPE from tokenizer.json only (GGUF model "gpt2"). Token types follow
  llama.cpp's `get_vocab_base`; merges, special-token ids, add_bos/add_eos and the chat template
  come from `gguf.SpecialVocab`. llama.cpp picks `tokenizer.ggml.pre` by hashing the tokens of a
  test string against known models; we read tokenizer.json's pre_tokenizer instead and map the
  shapes we know onto the llama.cpp name that implements the same split (see `_PRE_TOKENIZERS`).

Weights are read with safetensors as numpy; bf16 tensors (numpy has no bf16) go through torch.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..errors import PrefixEdgeError

FTYPES = ("f32", "f16")

# HF architecture -> (GGUF arch name, permute Q/K rows for llama.cpp's RoPE layout)
_ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", True),
    "MistralForCausalLM": ("llama", True),
    "Qwen2ForCausalLM": ("qwen2", False),
}

# The split regexes of tokenizer.json that llama.cpp re-implements under a known name.
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_REGEX = _QWEN2_REGEX.replace(r"|\p{N}|", r"|\p{N}{1,3}|")

# Pre-tokenizer signature (see `_pre_tokenizer_signature`) -> llama.cpp `tokenizer.ggml.pre`.
_PRE_TOKENIZERS = {
    ("bytelevel+regex",): "gpt-2",                 # plain GPT-2 ByteLevel split
    ("digits", "bytelevel+regex"): "smollm",       # SmolLM/SmolLM2, StarCoder: each digit alone
    (("split", _QWEN2_REGEX), "bytelevel"): "qwen2",
    (("split", _LLAMA3_REGEX), "bytelevel"): "llama-bpe",
}


def convert_hf_to_gguf(hf_dir: Path, out: Path, ftype: str = "f32") -> None:
    """Write the model in `hf_dir` (config.json, model*.safetensors, tokenizer.json,
    tokenizer_config.json) to the GGUF file `out`, weights in `ftype` ("f32" or "f16")."""
    import gguf

    hf_dir, out = Path(hf_dir), Path(out)
    if ftype not in FTYPES:
        raise PrefixEdgeError(f"unknown GGUF ftype {ftype!r}; choose one of {', '.join(FTYPES)}")
    cfg = _read_json(hf_dir / "config.json")
    archs = cfg.get("architectures") or ["?"]
    if archs[0] not in _ARCHITECTURES:
        raise PrefixEdgeError(
            f"cannot convert {archs[0]} to GGUF; supported: {', '.join(_ARCHITECTURES)}")
    arch, permute_qk = _ARCHITECTURES[archs[0]]
    if cfg.get("use_sliding_window"):
        raise PrefixEdgeError(f"{archs[0]} with use_sliding_window: llama.cpp's {arch} attends "
                              f"to the whole context, so it would not compute the same model")

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    writer = gguf.GGUFWriter(tmp, arch)
    try:  # into `out`.part, renamed when complete
        writer.add_name(hf_dir.name)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32 if ftype == "f32"
                             else gguf.LlamaFileType.MOSTLY_F16)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        rope_freqs = _write_hparams(writer, cfg, arch)
        _write_tokenizer(writer, hf_dir, cfg["vocab_size"])
        _add_tensors(writer, hf_dir, cfg, arch, permute_qk, ftype, rope_freqs)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    writer.close()
    os.replace(tmp, out)


# ---------------------------------------------------------------------------- hyper-parameters


def _write_hparams(w, cfg: dict, arch: str) -> np.ndarray | None:
    """Write the model's shape and RoPE keys; return llama3 RoPE factors when it has them."""
    n_embd, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or n_embd // n_head
    w.add_vocab_size(cfg["vocab_size"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(n_embd)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(cfg.get("num_key_value_heads") or n_head)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(head_dim)
    if cfg.get("head_dim"):  # as llama.cpp's converter; it defaults to n_embd / n_head
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)

    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    base = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
    w.add_rope_freq_base(base)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return None
    if kind == "linear":
        import gguf

        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
        return None
    if kind == "llama3" and arch == "llama":
        return _llama3_rope_factors(rope, cfg, base, head_dim)
    raise PrefixEdgeError(f"RoPE scaling {kind!r} is not supported by the GGUF converter "
                          f"(supported: none, linear, llama3 for llama)")


def _llama3_rope_factors(rope: dict, cfg: dict, base: float, dim: int) -> np.ndarray:
    """Per-frequency divisors llama.cpp reads from `rope_freqs.weight` (as HF's llama3 RoPE)."""
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old_ctx = rope.get("original_max_position_embeddings",
                       cfg.get("original_max_position_embeddings", 8192))
    freqs = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * math.pi / freqs
    smooth = (old_ctx / wavelen - low) / (high - low)
    factors = np.where(wavelen < old_ctx / high, 1.0,
                       np.where(wavelen > old_ctx / low, factor,
                                1.0 / ((1 - smooth) / factor + smooth)))
    return factors.astype(np.float32)


# ---------------------------------------------------------------------------- tensors


def _add_tensors(w, hf_dir: Path, cfg: dict, arch: str, permute_qk: bool, ftype: str,
                 rope_freqs: np.ndarray | None) -> None:
    import gguf

    arch_enum = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    names = gguf.get_tensor_name_map(arch_enum, cfg["num_hidden_layers"])
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_head
    tied = cfg.get("tie_word_embeddings", False)
    if rope_freqs is not None:
        w.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", rope_freqs)
    for name, data in _read_safetensors(hf_dir):
        if name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight"):
            continue
        new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise PrefixEdgeError(f"{hf_dir}: tensor {name!r} has no GGUF name for arch {arch}")
        if permute_qk and name.endswith(("q_proj.weight", "q_proj.bias")):
            data = _permute_rows(data, n_head)
        elif permute_qk and name.endswith(("k_proj.weight", "k_proj.bias")):
            data = _permute_rows(data, n_kv)
        dtype = np.float16 if ftype == "f16" and data.ndim >= 2 else np.float32
        w.add_tensor(new_name, np.ascontiguousarray(data, dtype=dtype))


def _permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Per head, interleave the two row halves: row i -> 2i, row i + d/2 -> 2i + 1."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def _read_safetensors(hf_dir: Path) -> Iterator[tuple[str, np.ndarray]]:
    from safetensors import safe_open

    files = sorted(hf_dir.glob("model*.safetensors"))
    if not files:
        raise PrefixEdgeError(f"{hf_dir} has no model*.safetensors weights; re-save the model "
                              f"with save_pretrained(..., safe_serialization=True)")
    for path in files:
        with safe_open(path, framework="numpy") as st:
            for name in st.keys():
                if st.get_slice(name).get_dtype() == "BF16":
                    yield name, _read_bf16(path, name)
                else:
                    yield name, st.get_tensor(name)


def _read_bf16(path: Path, name: str) -> np.ndarray:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as st:
        return st.get_tensor(name).float().numpy()


# ---------------------------------------------------------------------------- tokenizer


def _write_tokenizer(w, hf_dir: Path, vocab_size: int) -> None:
    import gguf
    from tokenizers import Tokenizer

    path = hf_dir / "tokenizer.json"
    if not path.is_file():
        raise PrefixEdgeError(f"{hf_dir} has no tokenizer.json; only byte-level BPE (fast) "
                              f"tokenizers can be converted to GGUF")
    spec = _read_json(path)
    model = spec.get("model") or {}
    if (model.get("type") != "BPE" or model.get("byte_fallback")
            or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix")):
        raise PrefixEdgeError(f"{path}: only byte-level BPE tokenizers are supported "
                              f"(model type {model.get('type')!r})")
    if (spec.get("normalizer") or {"type": "NFC"}).get("type") != "NFC":
        raise PrefixEdgeError(f"{path}: normalizer {spec['normalizer'].get('type')!r} has no "
                              f"llama.cpp equivalent")
    pre = _pre_tokenizer_name(spec.get("pre_tokenizer"), path)
    if model.get("ignore_merges") and pre != "llama-bpe":
        raise PrefixEdgeError(f"{path}: ignore_merges with pre-tokenizer {pre!r} is not "
                              f"reproduced by llama.cpp")

    tok = Tokenizer.from_file(str(path))
    by_id = {i: t for t, i in tok.get_vocab(with_added_tokens=True).items()}
    if max(by_id) >= vocab_size:
        raise PrefixEdgeError(f"{path}: token id {max(by_id)} is outside the model's "
                              f"vocab_size {vocab_size}")
    added = tok.get_added_tokens_decoder()
    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        if i not in by_id:  # the embedding matrix is padded past the tokenizer
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:  # stored as plain text, matched before BPE (llama.cpp: pre-normalized)
            tokens.append(added[i].content)
            control = added[i].special or _looks_special(added[i].content)
            types.append(gguf.TokenType.CONTROL if control else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)

    special = gguf.SpecialVocab(hf_dir, load_merges=True, n_vocab=vocab_size)
    # transformers adds BOS/EOS only when tokenizer_config or the post-processor says so; without
    # an explicit key llama.cpp would fall back to its own per-pre-tokenizer default.
    special.add_special_token.setdefault("bos", False)
    special.add_special_token.setdefault("eos", False)
    special.add_to_gguf(w, quiet=True)


def _pre_tokenizer_name(pre_tokenizer: dict | None, path: Path) -> str:
    signature = _pre_tokenizer_signature(pre_tokenizer)
    name = _PRE_TOKENIZERS.get(signature)
    if name is None:
        raise PrefixEdgeError(
            f"{path}: pre-tokenizer {json.dumps(pre_tokenizer)[:300]} matches none that llama.cpp "
            f"implements here (GPT-2 ByteLevel, SmolLM digits + ByteLevel, Qwen2 or Llama 3 "
            f"split regex + ByteLevel)")
    return name


def _pre_tokenizer_signature(pre_tokenizer: dict | None) -> tuple:
    """Reduce tokenizer.json's pre_tokenizer to the parts that decide how text is split."""
    if not pre_tokenizer:
        return ()
    steps = (pre_tokenizer.get("pretokenizers", [])
             if pre_tokenizer.get("type") == "Sequence" else [pre_tokenizer])
    signature: list = []
    for step in steps:
        kind = step.get("type")
        if kind == "ByteLevel" and not step.get("add_prefix_space"):
            signature.append("bytelevel+regex" if step.get("use_regex", True) else "bytelevel")
        elif kind == "Digits" and step.get("individual_digits"):
            signature.append("digits")
        elif (kind == "Split" and step.get("behavior") == "Isolated" and not step.get("invert")
              and "Regex" in (step.get("pattern") or {})):
            regex = step["pattern"]["Regex"].replace("\r", r"\r").replace("\n", r"\n")
            signature.append(("split", regex))
        else:
            signature.append(("unsupported", json.dumps(step, sort_keys=True)))
    return tuple(signature)


def _looks_special(token: str) -> bool:
    """llama.cpp's `does_token_look_special`: added tokens some models forget to mark special."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<｜") and token.endswith("｜>"))
            or (token.startswith("<unused") and token.endswith(">")))


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise PrefixEdgeError(f"missing {path}")
    return json.loads(path.read_text(encoding="utf-8"))


def file_type_name(path: Path) -> str:
    """The weight type a GGUF file declares (general.file_type), as llama.cpp names it: q4_1, f16..."""
    import gguf

    try:
        field = gguf.GGUFReader(str(path)).get_field(gguf.Keys.General.FILE_TYPE)
    except Exception as e:
        raise PrefixEdgeError(f"{path}: not a readable GGUF file ({e})") from None
    if field is None:
        return "unknown"
    value = int(field.parts[field.data[0]][0])
    try:
        name = gguf.LlamaFileType(value).name
    except ValueError:
        return f"type-{value}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()
