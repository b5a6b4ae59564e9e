"""Next-token choice: greedy at temperature 0, else temperature / top-k / top-p with a seed."""

from __future__ import annotations

import numpy as np


class Sampler:
    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None):
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> int:
        if self.temperature <= 0:
            return int(np.argmax(logits))
        x = logits.astype(np.float64) / self.temperature
        if 0 < self.top_k < x.shape[0]:
            idx = np.argpartition(-x, self.top_k - 1)[: self.top_k]
        else:
            idx = np.arange(x.shape[0])
        order = idx[np.argsort(-x[idx], kind="stable")]
        p = np.exp(x[order] - x[order[0]])
        p /= p.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), self.top_p) + 1)
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        return int(order[self.rng.choice(len(order), p=p)])
