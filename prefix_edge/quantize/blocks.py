"""Block quantization shared by export and the prefix-file codec (numpy only)."""

from __future__ import annotations

import numpy as np


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
