"""Seeded random PEFT prompt-learning adapters (prefix tuning, cartridge, prompt tuning,
P-tuning), as `save_pretrained` writes them: the trained prefixes the export bakes."""

from __future__ import annotations


def peft_config(kind: str):
    from peft import (CartridgeConfig, PrefixTuningConfig, PromptEncoderConfig, PromptTuningConfig,
                      TaskType)

    c = TaskType.CAUSAL_LM
    return {"prefix": lambda: PrefixTuningConfig(task_type=c, num_virtual_tokens=6),
            "cartridge": lambda: CartridgeConfig(task_type=c, num_virtual_tokens=5, num_frozen_tokens=1),
            "prompt": lambda: PromptTuningConfig(task_type=c, num_virtual_tokens=4),
            "ptuning": lambda: PromptEncoderConfig(task_type=c, num_virtual_tokens=4,
                                                   encoder_hidden_size=32)}[kind]()


def make_adapter(model_dir, kind: str, out, seed: int):
    """A PEFT adapter of `kind` for the model in `model_dir`, seeded random init, written to `out`."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    pm = get_peft_model(AutoModelForCausalLM.from_pretrained(str(model_dir)), peft_config(kind))
    if kind in ("prefix", "cartridge"):  # keys/values of std 2: a prefix that clearly matters
        with torch.no_grad():
            for p in pm.prompt_encoder.parameters():
                p.mul_(2.0)
    pm.save_pretrained(str(out))
    return out


def peft_greedy(pm, ids: list[int], n: int):
    """PEFT's own greedy run of n tokens after `ids` through PeftModel.forward (its generate()
    drops the prefix under transformers 5): the first step's logits (numpy) and the tokens."""
    import torch

    cur, want, first = torch.tensor([ids]), [], None
    with torch.no_grad():
        for _ in range(n):
            logits = pm(input_ids=cur, attention_mask=torch.ones_like(cur)).logits[0, -1]
            first = logits.numpy() if first is None else first
            want.append(int(logits.argmax()))
            cur = torch.cat([cur, torch.tensor([[want[-1]]])], dim=1)
    return first, want


def baked_prefix_tuning_is_peft(bundle, task: str, pm, tok, inputs: list[str], n: int, gguf_tie: float) -> dict:
    """A baked prefix-tuning task against PEFT on both engines: the first step's logits (ONNX
    fp32 to 1e-4, llama.cpp within `gguf_tie`, the argmax unless a near tie) and, on ONNX, the
    whole greedy run up to an EOS. Returns each engine's largest |Δlogit|."""
    import numpy as np

    from prefix_edge import Runtime

    worst = {}
    for backend, atol in (("onnx", 1e-4), ("gguf", gguf_tie)):
        worst[backend] = 0.0
        with Runtime.open(bundle, backend=backend) as rt:
            prefix, _ = rt.prefixes.get(task)
            for t in inputs:
                ids = tok.encode(t, add_special_tokens=False)
                first, want = peft_greedy(pm, ids, n)
                rt.backend.begin(prefix)
                got = rt.backend.prefill(np.array(ids, np.int64))
                d = float(np.abs(got - first).max())
                worst[backend] = max(worst[backend], d)
                top2 = np.sort(first)[-2:]
                assert d <= atol and (top2[1] - top2[0] <= 2 * d or int(np.argmax(got)) == want[0]), (backend, t, d)
                if backend == "onnx":  # fp32 all the way
                    stop = next((i for i, x in enumerate(want) if x in set(rt.manifest.model.eos_token_ids)), n)
                    assert rt.generate(task, t, max_tokens=n, stop=[]).tokens[:stop] == want[:stop], t
    return worst
