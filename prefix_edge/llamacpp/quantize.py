"""GGUF weight quantization through llama.cpp's own quantizer (`llama_model_quantize`, as the
`llama-quantize` tool), called from llama-cpp-python in a child process (llamacpp/child.py):
llama.cpp asserts on a model's metadata, and an abort there is an error line, not the end of
the export. The child then loads and decodes the quantized model.

Names are the usual llama.cpp ones, lower case: "q8_0", "q4_k_m", ... K-quants work on rows of
256 values; llama.cpp falls back to a legacy type for tensors whose rows are not a multiple of it.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import PrefixEdgeError

# name -> llama_cpp's LLAMA_FTYPE_* constant (looked up when used: llama_cpp is optional)
_FTYPES = {
    "f32": "LLAMA_FTYPE_ALL_F32",
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "q5_k_s": "LLAMA_FTYPE_MOSTLY_Q5_K_S",
    "q5_1": "LLAMA_FTYPE_MOSTLY_Q5_1",
    "q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q4_k_s": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
    "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q3_k_m": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
    "q2_k": "LLAMA_FTYPE_MOSTLY_Q2_K",
}

GGUF_QUANT_CHOICES = tuple(_FTYPES)


def quantize_gguf(src: Path, dst: Path, qtype: str, allow_requantize: bool = False) -> None:
    """Quantize the GGUF model `src` into `dst` with llama.cpp's `qtype` (see GGUF_QUANT_CHOICES).
    Norms and other 1-D tensors stay f32, as llama.cpp decides. `allow_requantize` lets an
    already-quantized source be re-quantized (quality suffers; llama.cpp refuses by default)."""
    src, dst = Path(src), Path(dst)
    if qtype not in _FTYPES:
        raise PrefixEdgeError(f"unknown GGUF quantization {qtype!r}; choose one of "
                              f"{', '.join(GGUF_QUANT_CHOICES)}")
    if not src.is_file():
        raise PrefixEdgeError(f"no GGUF file at {src}")
    if dst.resolve() == src.resolve():
        raise PrefixEdgeError(f"quantizing {src} onto itself; choose another output path")
    from . import child as llama_child
    from .lib import load_llama_cpp

    llama_cpp = load_llama_cpp()  # raises a clear error without llama-cpp-python
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        llama_child.quantize(src, dst, getattr(llama_cpp, _FTYPES[qtype]), allow_requantize,
                             f"{gguf_model_name(src)} to {qtype}")
    except PrefixEdgeError:
        dst.unlink(missing_ok=True)
        raise


def gguf_model_name(path: Path) -> str:
    """`path` with the model it holds, as its GGUF metadata names it (general.architecture and
    general.name), where the gguf package can read them."""
    try:
        import gguf

        reader = gguf.GGUFReader(str(path))
        found = [reader.get_field(k) for k in ("general.architecture", "general.name")]
        said = [str(f.contents()) for f in found if f is not None]
    except Exception:
        said = []
    return f"{path} ({', '.join(said)})" if said else str(path)
