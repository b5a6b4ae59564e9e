"""Export-time fidelity: the deployed models against the source model (transformers, fp32).

After a backend's deployed model is built and its prefixes baked, a few probe prompts run
through both: the largest |logit difference| at the first generated position, whether the first
token agrees, and whether 8 greedy tokens agree. The result goes into the manifest
(`extra.fidelity`); a deployed model that disagrees on the first token for most probes is a
visible export warning (a conversion or fusion that went wrong must not pass silently).
"""

from __future__ import annotations

import numpy as np

PROBES = ("The capital of France is",
          "def add(a, b):\n    return",
          "Customer: my order 1234 has not arrived yet. Agent:")
GREEDY = 8
REF_CHUNK = 32  # the reference's Mamba2 chunk (any chunk computes the same scan)


def probe_ids(tokenizer, extra: list[list[int]] = ()) -> list[list[int]]:
    ids = [tokenizer.encode(t, add_special_tokens=False).ids for t in PROBES]
    return [p for p in ids + list(extra) if p]


def reference_dtype(hf_dir, available: int | None = None) -> str:
    """"float32", or "bfloat16" where the checkpoint's fp32 copy would not fit in 80% of the
    memory available now (Gemma 4 E2B's 5.1B parameters are 20 GB in fp32): the export then
    runs, with a reference of less precision (recorded in the manifest beside the figures)."""
    from pathlib import Path

    files = list(Path(hf_dir).glob("*.safetensors")) + list(Path(hf_dir).glob("*.bin"))
    stored = sum(f.stat().st_size for f in files)
    params = stored / 2 if stored else 0  # (checkpoints ship 16-bit weights: an upper bound for fp32 ones)
    if available is None:
        available = _available_memory()
    if available is None or params * 4 <= 0.8 * available:
        return "float32"
    return "bfloat16"


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reference(hf_dir, probes: list[list[int]], dtype: str = "float32") -> list[tuple[np.ndarray, list[int]]]:
    """(first-position logits, greedy tokens) per probe, from transformers in `dtype` (fp32
    unless reference_dtype says it would not fit)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=getattr(torch, dtype))
    model.eval()
    for m in model.modules():  # a Mamba2 mixer's torch path pads every run to its chunk (256 in
        if hasattr(m, "chunk_size") and hasattr(m, "A_log"):  # real configs) and builds [c, c,
            m.chunk_size = min(int(m.chunk_size), REF_CHUNK)  # heads, state] terms: same math, smaller c
    out = []
    with torch.no_grad():
        for ids in probes:
            seq = list(ids)
            first = None
            for _ in range(GREEDY):
                logits = model(input_ids=torch.tensor([seq])).logits[0, -1].float().numpy()
                if first is None:
                    first = logits.copy()
                seq.append(int(np.argmax(logits)))
            out.append((first, seq[len(ids):]))
    del model
    return out


def measure(be, probes: list[list[int]], ref) -> dict:
    """The deployed backend `be` (one-sequence API) against the reference."""
    max_diff, first_ok, greedy_ok, non_finite = 0.0, 0, 0, 0
    for ids, (ref_logits, ref_tokens) in zip(probes, ref):
        be.begin(None)
        logits = be.prefill(np.asarray(ids, np.int64))
        if not np.all(np.isfinite(logits)):  # NaN compares as no difference: counted apart
            non_finite += 1
            continue
        n = min(len(logits), len(ref_logits))
        max_diff = max(max_diff, float(np.max(np.abs(logits[:n] - ref_logits[:n]))))
        toks = []
        for _ in range(GREEDY):
            tok = int(np.argmax(logits))
            toks.append(tok)
            if len(toks) < GREEDY:
                logits = be.step(tok)
        first_ok += toks[0] == ref_tokens[0]
        greedy_ok += toks == ref_tokens
    be.begin(None)
    return {"probes": len(probes), "max_abs_logit_diff_first_token": round(max_diff, 6),
            "first_token_agrees": first_ok, "greedy_8_agrees": greedy_ok, "non_finite": non_finite}


def verdict(backend: str, result: dict) -> str | None:
    """A warning line when the deployed model mostly disagrees with its source, else None."""
    if result.get("non_finite"):
        return (f"fidelity: the deployed {backend} model computes NaN or infinite logits on "
                f"{result['non_finite']} of {result['probes']} probes")
    if result["first_token_agrees"] * 2 < result["probes"]:
        return (f"fidelity: the deployed {backend} model disagrees with the source model on the "
                f"first token of {result['probes'] - result['first_token_agrees']} of "
                f"{result['probes']} probes (max |logit diff| "
                f"{result['max_abs_logit_diff_first_token']:.3g}): check the conversion/quantization")
    return None
