"""Next-token choice: logit bias and repetition penalties, then greedy at temperature 0, else
temperature / top-k / top-p / min-p with a seed.

Penalties look at the tokens this request generated so far (not the prefix or the input):
- repetition_penalty r (HF / llama.cpp style, 1 = off): a seen token's logit l becomes l / r if
  l > 0, else l * r;
- presence_penalty p and frequency_penalty f (OpenAI style, 0 = off): l - p * [count > 0] - f * count.
logit_bias {token id: bias} is added first (OpenAI style; -100 effectively bans a token).
"""

from __future__ import annotations

import numpy as np


class Sampler:
    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None, min_p: float = 0.0, repetition_penalty: float = 1.0,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 logit_bias: dict[int, float] | None = None):
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.min_p = min_p
        self.repetition_penalty = repetition_penalty
        self.presence_penalty = presence_penalty
        self.frequency_penalty = frequency_penalty
        self.logit_bias = {int(k): float(v) for k, v in (logit_bias or {}).items()}
        self.seed = seed
        self._rng = None  # made on the first sampled token: greedy never imports numpy.random
        self.counts: dict[int, int] = {}
        self.constraint = None  # constraint.Constraint: masks what it does not allow

    @property
    def rng(self) -> np.random.Generator:
        if self._rng is None:
            self._rng = np.random.default_rng(self.seed)
        return self._rng

    @classmethod
    def from_options(cls, o: dict) -> "Sampler":
        """From resolved generation options (options.resolve)."""
        return cls(o["temperature"], o["top_k"], o["top_p"], o["seed"], o["min_p"], o["repetition_penalty"],
                   o["presence_penalty"], o["frequency_penalty"], o["logit_bias"])

    @property
    def _penalised(self) -> bool:
        return bool(self.counts) and (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                                      or self.frequency_penalty != 0.0)

    def adjust(self, logits: np.ndarray) -> np.ndarray:
        """Bias and penalties applied (a copy; the input is left as it is)."""
        if not self.logit_bias and not self._penalised:
            return logits
        x = logits.astype(np.float32, copy=True)
        n = x.shape[0]
        for tok, bias in self.logit_bias.items():
            if 0 <= tok < n:
                x[tok] += bias
        if self._penalised:
            ids = np.fromiter(self.counts, np.int64)
            cnt = np.fromiter(self.counts.values(), np.float32)
            v = x[ids]
            if self.repetition_penalty != 1.0:
                v = np.where(v > 0, v / self.repetition_penalty, v * self.repetition_penalty)
            v = v - self.presence_penalty - self.frequency_penalty * cnt
            x[ids] = v
        return x

    def __call__(self, logits: np.ndarray) -> int:
        x = self.adjust(logits)
        if self.constraint is not None:
            x = self.constraint.mask(x)
        tok = self._choose(x)
        if self.constraint is not None:
            self.constraint.consume(tok)
        self.counts[tok] = self.counts.get(tok, 0) + 1
        return tok

    def _choose(self, logits: np.ndarray) -> int:
        if self.temperature <= 0:
            return int(np.argmax(logits))
        with np.errstate(over="ignore", invalid="ignore"):
            x = logits.astype(np.float64) / self.temperature
        if not np.isfinite(x.max()):  # a temperature so small the scaled logits overflow: greedy
            return int(np.argmax(logits))
        if 0 < self.top_k < x.shape[0]:
            idx = np.argpartition(-x, self.top_k - 1)[: self.top_k]
        else:
            idx = np.arange(x.shape[0])
        order = idx[np.argsort(-x[idx], kind="stable")]
        p = np.exp(x[order] - x[order[0]])
        p /= p.sum()
        if self.min_p > 0.0:
            keep = max(1, int(np.count_nonzero(p >= self.min_p * p[0])))
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), self.top_p) + 1)
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        return int(order[self.rng.choice(len(order), p=p)])


def token_logprobs(logits: np.ndarray, tok: int, top: int) -> tuple[int, float, list]:
    """(tok, its log-probability, the `top` most likely [(id, log-probability)]) under the
    model's own distribution (the logits before bias, penalties and temperature)."""
    x = logits.astype(np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    alts = []
    if top > 0:
        idx = np.argpartition(-x, top - 1)[:top]
        idx = idx[np.argsort(-x[idx], kind="stable")]
        alts = [(int(i), float(x[i] - lse)) for i in idx]
    return tok, float(x[tok] - lse), alts
