"""Block quantization shared by export, the prefix-file codec and llama.cpp's sequence states
(numpy only)."""

from __future__ import annotations

import numpy as np

from ..errors import PrefixEdgeError


def q8_0(a: np.ndarray, block: int, scale_dtype=np.float32,
         ggml_rounding: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's Q8_0 along the last axis: int8 values q [..., n/block, block] and one scale
    per block [..., n/block] (amax / 127, stored as `scale_dtype`). q is rounded against the
    stored scale, or, with `ggml_rounding`, as ggml's CPU quantizer does it (x times the inverse
    of the fp32 scale: the bytes llama.cpp writes into a q8_0 KV cache). An all-zero block gets
    scale 0 and q 0."""
    blocks = np.asarray(a, np.float32).reshape(*a.shape[:-1], -1, block)
    amax = np.abs(blocks).max(-1) / 127
    scale = amax.astype(scale_dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        if ggml_rounding:
            q = np.rint(blocks * np.where(amax > 0, 1 / amax, 0).astype(np.float32)[..., None])
        else:
            q = np.nan_to_num(np.round(blocks / scale.astype(np.float32)[..., None]))
    return q.clip(-127, 127).astype(np.int8), scale


def q8_0_values(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The inverse of q8_0: int8 values [..., n/block, block] times their block's scale
    [..., n/block], as float32 [..., n]."""
    x = np.asarray(q, np.float32) * np.asarray(scale, np.float32)[..., None]
    return x.reshape(*x.shape[:-2], -1)


def hadamard(n: int) -> np.ndarray:
    """The normalized Sylvester Hadamard matrix of order n (a power of 2), float32; it is
    symmetric and its own inverse."""
    if n < 1 or n & (n - 1):
        raise PrefixEdgeError(f"no Hadamard rotation of order {n} (not a power of 2)")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(np.float32)
