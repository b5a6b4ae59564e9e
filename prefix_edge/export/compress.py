"""Compressed task prefixes (`export --compress-prefix RATIO|auto`): a text task's prefix keeps
only the tokens that later queries attend to, chosen once, at export.

Which tokens: a query-agnostic score per prefix token from the fp32 model (transformers): the
attention the prefix's own last WINDOW tokens pay it (largest over those queries, averaged
over heads and layers; SnapKV's observation window, placed where every user input joins). One
subset is kept for every layer and head (both engines attend to it unchanged), always with the
first SINK tokens (attention sinks), the last RECENT ones and the special tokens (the chat
template's turn markers). KVzip's context-reconstruction score (the attention paid while the
model repeats the prefix) was measured too and kept the task answers far less well on the
default model's demo tasks; H2O and plain recency came within noise of the window
(benchmarks/compression_scores.py, docs/compression.md). Reconstruction is used for the
agreement below.

Where the kept tokens go: at cache slots 0..K-1, keys re-rotated by -(P - K) positions. RoPE
attention depends only on the distance between a query and a key, so a new token at K + i sees
a kept key from original position p at distance P + i - p: exactly what it would see after the
whole prefix. Neither engine changes (ONNX Runtime's GroupQueryAttention places new tokens at
the cache length, llama.cpp masks by cell position). Values are untouched. Models whose
attention does not depend on distance alone are refused (sliding-window layers: the window
would cover other tokens; longrope / dynamic RoPE: frequencies change with the length).

Reconstruction agreement: the model is asked to repeat the prefix after itself ("... Repeat
the previous context exactly.", teacher-forced); the share of those positions whose greedy
token is the same with only the kept tokens visible as with all of them. The manifest records
it per task (with what was kept, the source ids and the ratio); `auto` picks per task the
largest ratio in AUTO_RATIOS whose agreement is at least AUTO_AGREEMENT. `eval` scores the
compressed prefix against the whole one (prefilled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import PrefixEdgeError
from ..runtime.engines.kv import KvLayers, shift_keys

METHOD = "window-attention"
REPEAT = "\n\nRepeat the previous context exactly.\n"
SINK, RECENT = 4, 16
WINDOW = 16  # the prefix's last tokens whose attention scores the rest
AUTO_RATIOS = (4.0, 3.0, 2.0, 1.5)
AUTO_AGREEMENT = 0.9
CHUNK = 512  # prefix tokens reconstructed per scoring pass
MIN_TOKENS = 2 * (SINK + RECENT)  # shorter prefixes are kept whole


@dataclass
class Plan:
    """One task's compression: the kept positions of its source prefix (sorted)."""

    kept: list[int]
    source_ids: list[int]
    ratio: float | str
    agreement: float

    @property
    def delta(self) -> int:
        """Positions every kept key moves back by: P - K."""
        return len(self.source_ids) - len(self.kept)

    def record(self) -> dict:
        """The manifest's `compression` entry of the task."""
        P, K = len(self.source_ids), len(self.kept)
        return {"method": METHOD, "ratio": self.ratio, "source_tokens": P, "kept_tokens": K,
                "kept": list(self.kept), "source_ids": list(self.source_ids),
                "reconstruction_agreement": round(float(self.agreement), 4)}


def check_model(hf_dir: Path, info) -> None:
    """Refuse models whose attention a shifted prefix would change (one line)."""
    import json

    if info.sliding_layers:
        raise PrefixEdgeError("--compress-prefix: this model has sliding-window layers (their window "
                              "would cover other tokens after compression); export it without")
    from .source import recurrent_layers, rope_parameters

    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    if recurrent_layers(cfg):
        raise PrefixEdgeError(f"--compress-prefix: this model has recurrent ({recurrent_layers(cfg)}) "
                              "layers, whose state after the prefix holds every token and cannot be "
                              "reduced to a subset; export it without")
    kind = rope_parameters(cfg)["rope_type"]
    if kind not in ("default", "llama3", "linear", "yarn"):
        raise PrefixEdgeError(f"--compress-prefix: RoPE scaling {kind!r} changes its frequencies with "
                              "the length, so a shifted prefix would not attend as the whole one; "
                              "export it without")


class Planner:
    """The fp32 model, loaded once, scoring prefixes (torch; export only)."""

    def __init__(self, hf_dir: Path, tokenizer, special_ids: set[int]):
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32,
                                                          attn_implementation="eager").eval()
        self.repeat = tokenizer.encode(REPEAT, add_special_tokens=False).ids
        self.special = special_ids
        self.inv_freq = rope_inv_freq(self.model)
        self.rope_layers = rope_layers(self.model.config)
        self._cache = None  # the last scored prefix's KV (transformers), for its agreement

    def plan(self, name: str, ids: list[int], ratio: float | str) -> Plan | None:
        """The kept positions of `ids` at `ratio` (or, "auto", the largest of AUTO_RATIOS whose
        agreement holds); None: keep it whole."""
        P = len(ids)
        if P < MIN_TOKENS:
            return None
        scores, runs = self._score(ids)
        for r in AUTO_RATIOS if ratio == "auto" else (float(ratio),):
            kept = choose(scores, ids, r, self.special)
            if len(kept) >= P:
                continue
            a = self._agreement(ids, kept, runs)
            if ratio != "auto" or a >= AUTO_AGREEMENT:
                return Plan(kept, list(ids), r, a)
        return None

    # -- scoring ---------------------------------------------------------------------------
    def _score(self, ids: list[int]):
        """(score per prefix token, the reconstruction runs' full-cache argmaxes, for agreement).

        The score: the attention the prefix's last WINDOW tokens pay each earlier token (the
        largest over those queries, averaged over heads and layers): where a user's input
        joins, what the model looks back at."""
        torch = self.torch
        P = len(ids)
        W = min(WINDOW, P - 1)
        total = torch.zeros(P)
        hooks = []

        def hook(_mod, _inp, out):
            w = out[1] if isinstance(out, tuple) and len(out) > 1 else None
            if w is not None and w.shape[-2] == W:
                total.add_(w[0, :, :, :P].amax(dim=1).mean(dim=0).float())

        runs = []
        with torch.no_grad():
            cache = self.model(torch.tensor([ids[:P - W]]), use_cache=True).past_key_values
            for layer in self.model.model.layers:
                hooks.append(layer.self_attn.register_forward_hook(hook))
            try:
                self.model(torch.tensor([ids[P - W:]]), past_key_values=cache, use_cache=True,
                           position_ids=torch.arange(P - W, P)[None])
            finally:
                for h in hooks:
                    h.remove()
            for c0 in range(0, P, CHUNK):  # the whole prefix's reconstruction, for agreement
                chunk = ids[c0:c0 + CHUNK]
                q = torch.tensor([self.repeat + chunk])
                out = self.model(q, past_key_values=cache, use_cache=True,
                                 position_ids=torch.arange(P, P + q.shape[1])[None])
                crop_to(cache, P)
                runs.append((c0, out.logits[0].argmax(-1)))
        self._cache = cache
        return (total / len(self.model.model.layers)).numpy(), runs

    def _agreement(self, ids: list[int], kept: list[int], runs) -> float:
        """Share of the reconstruction's positions whose greedy token with only `kept` in the
        prefix equals the whole prefix's."""
        torch = self.torch
        P = len(ids)
        keep = torch.zeros(P, dtype=torch.long)
        keep[kept] = 1
        same = total = 0
        with torch.no_grad():
            for c0, full in runs:
                chunk = ids[c0:c0 + CHUNK]
                q = torch.tensor([self.repeat + chunk])
                mask = torch.cat([keep, torch.ones(q.shape[1], dtype=torch.long)])[None]
                out = self.model(q, past_key_values=self._cache, use_cache=True, attention_mask=mask,
                                 position_ids=torch.arange(P, P + q.shape[1])[None])
                crop_to(self._cache, P)
                got = out.logits[0].argmax(-1)
                same += int((got == full).sum())
                total += int(full.numel())
        return same / max(total, 1)

    def close(self) -> None:
        self.model = None
        self._cache = None


def choose(scores: np.ndarray, ids: list[int], ratio: float, special: set[int]) -> list[int]:
    """The kept positions: the first SINK, the last RECENT, the special tokens, then the best
    scored until ceil(P / ratio) (never fewer than the forced ones)."""
    P = len(ids)
    budget = max(math.ceil(P / ratio), SINK + RECENT)
    forced = set(range(min(SINK, P))) | set(range(max(0, P - RECENT), P))
    forced |= {i for i, t in enumerate(ids) if t in special}
    rest = [i for i in np.argsort(-np.asarray(scores), kind="stable") if i not in forced]
    kept = sorted(forced | set(int(i) for i in rest[:max(0, budget - len(forced))]))
    return kept


# -- the model's rotation ------------------------------------------------------------------
def rope_inv_freq(model) -> np.ndarray:
    """The rotary frequencies the model applies (transformers' own rotary module), float64."""
    rot = getattr(model.model, "rotary_emb", None)
    if rot is None or not hasattr(rot, "inv_freq"):
        raise PrefixEdgeError("--compress-prefix: cannot find this model's rotary embedding")
    return rot.inv_freq.detach().double().numpy()


def rope_layers(cfg) -> list[bool]:
    """Per layer: does it rotate keys (SmolLM3's no-RoPE layers do not)."""
    n = cfg.num_hidden_layers
    flags = getattr(cfg, "no_rope_layers", None)
    return [bool(v) for v in flags] if flags else [True] * n


# -- applying a plan to a baked sequence ----------------------------------------------------
def compressed_kv(be, plan: Plan, inv_freq: np.ndarray, rope_on: list[bool]):
    """The engine `be`'s current sequence (the whole prefix, prefilled) reduced to the plan's
    kept tokens at slots 0..K-1, keys shifted back by plan.delta, as a Prefix of `be` (KV as
    data through the engine protocol: kv_of / prefix_of)."""
    kept = np.asarray(plan.kept, np.int64)
    kv = be.kv_of(be.seq_snapshot(be.single_seq, np.asarray(plan.source_ids, np.int64)))
    ks = [shift_keys(k[kept], -plan.delta, inv_freq, be.rope_layout) if rope_on[layer] else k[kept]
          for layer, k in enumerate(kv.k)]
    return be.prefix_of(KvLayers(ks, [v[kept] for v in kv.v]), np.asarray(plan.source_ids, np.int64)[kept])


def crop_to(cache, n: int) -> None:
    """Keep a transformers cache's first n positions (transformers 5's crop takes how many to drop)."""
    drop = cache.get_seq_length() - n
    if drop > 0:
        cache.crop(-drop)
