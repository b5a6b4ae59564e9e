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
