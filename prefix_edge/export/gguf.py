"""Convert a Hugging Face checkpoint directory to a GGUF file for llama.cpp: llama.cpp's own
`convert_hf_to_gguf.py`, of the llama.cpp version inside the installed llama-cpp-python
(export/llama_convert.py finds or fetches it and runs it in a child process). It knows every
architecture that llama.cpp runs (Llama 1-3.x, Mistral, Qwen2/3, Gemma 1-3, Phi-3/4, SmolLM3,
Granite, ...), with their tensor layouts, RoPE scaling and tokenizers.

Kept here, because llama.cpp's converter cannot do it: naming the BPE pre-tokenizer of a
tokenizer llama.cpp has not seen. llama.cpp recognises a pre-tokenizer by hashing the tokens of a
test string against the models it knows; a newly trained tokenizer has no known hash, so we read
tokenizer.json's pre_tokenizer and map the shapes we know onto the llama.cpp name that
implements the same split (see `_PRE_TOKENIZERS`), or refuse.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from ..errors import PrefixEdgeError

FTYPES = ("f32", "f16")

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


def pre_tokenizer_spec(name: str) -> dict | None:
    """tokenizer.json's pre_tokenizer for llama.cpp's BPE pre-tokenizer `name` (the inverse of
    `_PRE_TOKENIZERS`), None for a name not mapped here."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
    for signature, known in _PRE_TOKENIZERS.items():
        if known != name:
            continue
        steps = []
        for step in signature:
            if step == "digits":
                steps.append({"type": "Digits", "individual_digits": True})
            elif step in ("bytelevel+regex", "bytelevel"):
                steps.append({**byte_level, "use_regex": step == "bytelevel+regex"})
            else:
                steps.append({"type": "Split", "pattern": {"Regex": step[1]}, "behavior": "Isolated",
                              "invert": False})
        return steps[0] if len(steps) == 1 else {"type": "Sequence", "pretokenizers": steps}
    return None


def convert_hf_to_gguf(hf_dir: Path, out: Path, ftype: str = "f32", check: bool = True) -> None:
    """Write the model in `hf_dir` (config.json, model*.safetensors, the tokenizer files) to the
    GGUF file `out`, weights in `ftype` ("f32", or "f16": 2-D weights f16, norms f32). `check`:
    then load it and decode a token in a child process (llamacpp/child.py), so that a model
    llama.cpp asserts on is an error line here, not an abort of the process that loads it next."""
    from ..llamacpp.child import check_loads
    from .llama_convert import convert

    hf_dir = Path(hf_dir)
    if ftype not in FTYPES:
        raise PrefixEdgeError(f"unknown GGUF ftype {ftype!r}; choose one of {', '.join(FTYPES)}")
    refuse_unsupported(_read_json(hf_dir / "config.json"))
    convert(hf_dir, Path(out), ftype)
    if check:
        try:
            check_loads(Path(out), f"{hf_dir.name} converted to GGUF")
        except PrefixEdgeError:
            Path(out).unlink(missing_ok=True)
            raise


def refuse_unsupported(cfg: dict) -> None:
    """Checkpoint shapes llama.cpp's converter writes but its graph cannot run, refused before
    the conversion (one line naming the setting and what to do)."""
    if cfg.get("model_type") == "ernie4_5" and cfg.get("use_bias"):
        raise PrefixEdgeError("this ERNIE 4.5 checkpoint has use_bias=true: llama.cpp's ERNIE 4.5 "
                              "graph has no MLP biases (its converter writes them, its loader then "
                              "refuses the tensor count); export it with --format onnx")
    if cfg.get("model_type") in ("gemma3n", "gemma3n_text"):
        _refuse_gemma3n(cfg.get("text_config") or cfg)


# what llama.cpp's Gemma 3n graph fixes in code instead of reading the GGUF (llama-hparams.h,
# llama-model.cpp, models/gemma3n-iswa.cpp): a checkpoint that differs would load and compute
# another model
GEMMA3N_FIXED = {"hidden_size_per_layer_input": 256, "laurel_rank": 64, "altup_num_inputs": 4, "altup_active_idx": 0}
GEMMA3N_FIRST_SHARED = 20  # each shared layer then reads layer 18 (sliding) or 19 (global)
GEMMA3N_SPARSE_LAYERS, GEMMA3N_SPARSITY = 10, 0.95


def _refuse_gemma3n(t: dict) -> None:
    def refuse(what: str) -> PrefixEdgeError:
        return PrefixEdgeError(f"this Gemma 3n checkpoint has {what}; llama.cpp's Gemma 3n graph fixes it "
                               "in code (E2B's and E4B's value), so its GGUF would compute another model: "
                               "export it with --format onnx")

    for k, v in GEMMA3N_FIXED.items():
        if k in t and t[k] != v:
            raise refuse(f"{k} {t[k]} (llama.cpp: {v})")
    n, shared = int(t.get("num_hidden_layers", 0)), int(t.get("num_kv_shared_layers", 0))
    reads = (t.get("layer_types") or [])[GEMMA3N_FIRST_SHARED - 2:GEMMA3N_FIRST_SHARED]
    if (n - shared != GEMMA3N_FIRST_SHARED or reads != ["sliding_attention", "full_attention"]) if shared \
            else n > GEMMA3N_FIRST_SHARED:
        raise refuse(f"{n} layers, the last {shared} KV-shared (llama.cpp: any layer from {GEMMA3N_FIRST_SHARED} "
                     "on shares, reading layer 18 if sliding, else 19)")
    pattern = [float(x) for x in t.get("activation_sparsity_pattern") or []]
    if pattern and pattern != [GEMMA3N_SPARSITY if i < GEMMA3N_SPARSE_LAYERS else 0.0 for i in range(len(pattern))]:
        raise refuse(f"activation_sparsity_pattern {pattern} (llama.cpp: {GEMMA3N_SPARSITY} on layers "
                     f"0-{GEMMA3N_SPARSE_LAYERS - 1}, none after)")


def pre_tokenizer_name(hf_dir: Path) -> str:
    """The llama.cpp `tokenizer.ggml.pre` of tokenizer.json's pre_tokenizer (one line naming
    what llama.cpp cannot reproduce otherwise)."""
    path = Path(hf_dir) / "tokenizer.json"
    if not path.is_file():
        raise PrefixEdgeError(f"{hf_dir} has no tokenizer.json: its BPE pre-tokenizer cannot be named")
    spec = _read_json(path)
    pre = spec.get("pre_tokenizer")
    name = _PRE_TOKENIZERS.get(_pre_tokenizer_signature(pre))
    if name is None:
        raise PrefixEdgeError(
            f"{path}: pre-tokenizer {json.dumps(pre)[:300]} matches none that llama.cpp "
            f"implements here (GPT-2 ByteLevel, SmolLM digits + ByteLevel, Qwen2 or Llama 3 "
            f"split regex + ByteLevel), and llama.cpp does not know its hash")
    if (spec.get("model") or {}).get("ignore_merges") and name != "llama-bpe":
        raise PrefixEdgeError(f"{path}: ignore_merges with pre-tokenizer {name!r} is not "
                              f"reproduced by llama.cpp")
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


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise PrefixEdgeError(f"missing {path}")
    return json.loads(path.read_text(encoding="utf-8"))


def gguf_reader(path: Path):
    """gguf-py's reader of `path`, one per file version (parsing a 262k-piece vocabulary's
    metadata takes ~8 s: every step of an export shares one)."""
    st = Path(path).stat()
    return _reader(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=2)
def _reader(path: str, mtime_ns: int, size: int):
    import gguf

    return gguf.GGUFReader(path)


def gguf_field(reader, name: str, default=None):
    """A metadata value of a gguf-py reader (a list for an array), or `default` where absent."""
    f = reader.get_field(name)
    return default if f is None else f.contents()


def file_type_name(path: Path) -> str:
    """The weight type a GGUF file declares (general.file_type), as llama.cpp names it: q4_1, f16..."""
    import gguf

    try:
        field = gguf_reader(path).get_field(gguf.Keys.General.FILE_TYPE)
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
