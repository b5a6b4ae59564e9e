"""The invariant on the architectures people deploy, both backends: tiny seeded random
checkpoints in the shapes of Llama 3.2 (llama3 RoPE), Qwen3, Phi-4-mini (partial rotary),
SmolLM3 (no-RoPE layers), Granite (multipliers) and Gemma 3 (5 sliding-window layers : 1
global, a window of 8 positions, shorter than the task prefixes), each exported (ONNX fp32 through the own
graph, GGUF f32 through llama.cpp's converter) with a text task and a PEFT prefix-tuning adapter:
- the deployed models match transformers (the export's fidelity probes: ONNX to 1e-4);
- a baked text prefix gives the first-step logits and the greedy tokens of prefilling it;
- a baked adapter gives PEFT's own first-step logits and greedy tokens."""

from __future__ import annotations

import numpy as np
import pytest

from prefix_edge import Runtime

from .helpers.archs import build_arch
from .helpers.parity import baked_and_prefilled
from .helpers.adapters import make_adapter

ARCHS = ["llama3.2", "qwen3", "phi3", "smollm3", "granite", "gemma3"]
INPUTS = ["The quick brown fox", "def add(a, b):\n    return", "I'm sure they'll say"]
N = 8
TASKS = '''
[task.support]
system = "You are a helpful assistant. Answer briefly and politely, and mention the plan."
max_tokens = 8

[task.raw]
kind = "text"
prefix = "The quick brown fox jumps over the lazy dog. "
template = "{input} =>"
max_tokens = 8

[task.tuned]
kind = "peft"
adapter = "adapter"
chat = false
max_tokens = 8
'''
# fp32 weights; GGUF's default F16 KV cache rounds the adapter's KV (the text prefixes are baked
# through llama.cpp itself, so they hold exactly what a prefill writes): measured up to 0.051
# (phi3, whose KV of std 2 and 256-wide layers round the most)
PEFT_ATOL = {"onnx": 1e-4, "gguf": 0.1}


@pytest.fixture(scope="module", params=ARCHS)
def arch(request, tmp_path_factory):
    from prefix_edge.export.build import export_bundle

    root = tmp_path_factory.mktemp("arch")
    built = build_arch(request.param, root / "model", convert=False)
    make_adapter(built.hf_dir, "prefix", root / "adapter", seed=7)
    (root / "tasks.toml").write_text(TASKS, encoding="utf-8")
    manifest = export_bundle(built.hf_dir, root / "tasks.toml", root / "bundle", quantize="none",
                             gguf_quant="f32", progress=False)
    return request.param, built, root, manifest


def test_deployed_models_match_transformers(arch):
    kind, _, _, manifest = arch
    fid = manifest.extra["fidelity"]
    assert fid["onnx"]["max_abs_logit_diff_first_token"] <= 1e-4, kind
    assert fid["onnx"]["greedy_8_agrees"] == fid["onnx"]["probes"], kind
    # llama.cpp: f32 weights, its default F16 KV cache (measured 4e-5 .. 3e-2 on these models)
    assert fid["gguf"]["max_abs_logit_diff_first_token"] <= 0.1, kind
    assert fid["gguf"]["first_token_agrees"] == fid["gguf"]["probes"], kind


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_baked_text_prefix_is_the_prefill(arch, backend):
    kind, _, root, _ = arch
    with Runtime.open(root / "bundle", backend=backend) as rt:
        for task in ("support", "raw"):
            for text in INPUTS:
                baked, full = baked_and_prefilled(rt, task, text)
                assert np.max(np.abs(baked - full)) < 1e-5, (kind, task, text)
                a = rt.generate(task, text, max_tokens=N)
                b = rt.generate(task, text, max_tokens=N, use_prefix_cache=False)
                assert a.tokens == b.tokens and len(a.tokens) > 0, (kind, task, text)


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_baked_adapter_is_peft(arch, backend):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    kind, built, root, _ = arch
    pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(built.hf_dir)).eval(),
                                   str(root / "adapter")).eval()
    with Runtime.open(root / "bundle", backend=backend) as rt:
        for text in INPUTS:
            ids = built.tokenizer.encode(text, add_special_tokens=False)
            assert list(rt.encode_input("tuned", text)) == ids
            cur, want, first = torch.tensor([ids]), [], None
            with torch.no_grad():
                for _ in range(N):
                    logits = pm(input_ids=cur, attention_mask=torch.ones_like(cur)).logits[0, -1]
                    first = logits.numpy() if first is None else first
                    tok = int(logits.argmax())
                    if tok == built.tokenizer.eos_token_id:
                        break
                    want.append(tok)
                    cur = torch.cat([cur, torch.tensor([[tok]])], dim=1)
            prefix, _ = rt.prefixes.get("tuned")
            rt.backend.begin(prefix)
            got = rt.backend.prefill(np.array(ids, np.int64))
            np.testing.assert_allclose(got, first, rtol=0, atol=PEFT_ATOL[backend], err_msg=f"{kind} {text}")
            assert int(np.argmax(got)) == int(np.argmax(first)), (kind, text)
            if backend == "onnx":  # fp32 all the way: the whole greedy run
                assert rt.generate("tuned", text, max_tokens=N).tokens[:len(want)] == want, (kind, text)
