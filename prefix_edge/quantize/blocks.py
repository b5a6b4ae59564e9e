"""Block quantization shared by export and the prefix-file codec (numpy only)."""

from __future__ import annotations

import numpy as np


def q8_0(a: np.ndarray, block: int, scale_dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's Q8_0 along the last axis: int8 values q [..., n/block, block] and one scale
    per block [..., n/block] (amax / 127, stored as `scale_dtype`; q is rounded against the
    stored scale). An all-zero block gets scale 0 and q 0."""
    blocks = np.asarray(a, np.float32).reshape(*a.shape[:-1], -1, block)
    scale = (np.abs(blocks).max(-1) / 127).astype(scale_dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.nan_to_num(np.round(blocks / scale.astype(np.float32)[..., None]))
    return q.clip(-127, 127).astype(np.int8), scale
