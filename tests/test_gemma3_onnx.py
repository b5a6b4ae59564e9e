"""Gemma 3 (Gemma3ForCausalLM, text-only) through the own ONNX graph (export/onnx_graph.py), on a
tiny seeded checkpoint in Gemma 3's shape (tests/test_gguf_convert.py: 6 layers, 5 sliding of
window 8 : 1 global, query_pre_attn_scalar 16, local and global RoPE bases):
- fp32 logits at every position match transformers to 1e-4, stepped one token at a time, in
  chunks and as one prefill, on prompts up to 5x the sliding window (its off-by-one shows there);
- a baked text prefix longer than the window (a system prompt, a raw text prefix) gives the
  first-step logits (1e-5) and the greedy tokens of prefilling it;
- PEFT soft prompts (prompt tuning: embeddings that skip Gemma's embedding scale) and prefix
  tuning give PEFT's own first-step logits;
- the export's fidelity record is within 1e-4; an int4 export opens and generates;
- what the graph cannot do (logit soft-capping, other layer types or activations) is one line.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from prefix_edge import PrefixEdgeError, Runtime

from .helpers.archs import build_arch
from .helpers.parity import baked_and_prefilled
from .helpers.adapters import make_adapter

WINDOW = 8  # ARCHS["gemma3"]'s sliding_window
ATOL = 1e-4
N = 8
LONG = ("The quick brown fox jumps over the lazy dog. It's 12:45 and we've got 3,141 apples. "
        "def add(a, b):\n    return a + b  # sum")
TASKS = f'''
[task.support]
system = "You are a helpful assistant. Answer briefly and politely, and mention the plan."
max_tokens = {N}

[task.raw]
kind = "text"
prefix = {json.dumps(LONG + " ")}
template = "{{input}} =>"
max_tokens = {N}

[task.soft]
kind = "peft"
adapter = "prompt"
chat = false
max_tokens = {N}

[task.tuned]
kind = "peft"
adapter = "prefix"
chat = false
max_tokens = {N}
'''
INPUTS = ["The quick brown fox", "def add(a, b):\n    return", "I'm sure they'll say"]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    from prefix_edge.export.build import export_bundle

    root = tmp_path_factory.mktemp("gemma3")
    built = build_arch("gemma3", root / "model", convert=False)
    assert built.model.config.sliding_window == WINDOW
    assert built.model.config.layer_types.count("full_attention") == 1
    make_adapter(built.hf_dir, "prompt", root / "prompt", seed=3)
    make_adapter(built.hf_dir, "prefix", root / "prefix", seed=4)
    (root / "tasks.toml").write_text(TASKS, encoding="utf-8")
    manifest = export_bundle(built.hf_dir, root / "tasks.toml", root / "bundle", formats=("onnx",),
                             quantize="none", progress=False)
    rt = Runtime.open(root / "bundle", backend="onnx")
    yield built, root, manifest, rt
    rt.close()


def _prompts(tok) -> list[list[int]]:
    ids = [tok.encode(t, add_special_tokens=False) for t in INPUTS + [LONG]]
    rng = np.random.default_rng(0)  # and ids no text gives, specials included
    ids.append(rng.integers(0, len(tok), 5 * WINDOW).tolist())
    assert max(len(p) for p in ids[:-1]) > 3 * WINDOW  # a text prompt well past the window
    return ids


def test_logits_match_transformers_at_every_position(gemma):
    import torch

    built, _, _, rt = gemma
    be, worst = rt.backend, 0.0
    for ids in _prompts(built.tokenizer):
        with torch.no_grad():
            ref = built.model(torch.tensor([ids])).logits[0].numpy()
        be.begin(None)
        stepped = np.array([be.prefill(np.array(ids[:1], np.int64))] + [be.step(t) for t in ids[1:]])
        be.begin(None)
        whole = be.prefill(np.array(ids, np.int64))
        cut = min(len(ids) - 1, WINDOW + 3)  # a chunk across the window, then one more chunk
        be.begin(None)
        chunks = [be.prefill(np.array(ids[:cut], np.int64))]
        if cut < len(ids):
            chunks.append(be.prefill(np.array(ids[cut:], np.int64)))
        for name, got, want in (("stepped", stepped, ref), ("whole", whole, ref[-1]),
                                ("chunks", np.array(chunks), ref[[cut - 1, -1]][:len(chunks)])):
            d = float(np.max(np.abs(got - want)))
            worst = max(worst, d)
            assert d <= ATOL, (name, len(ids), d)
        assert (stepped.argmax(-1) == ref.argmax(-1)).all()
    print(f"\ngemma3 onnx fp32: max |Δlogit| vs transformers = {worst:.2e}")


def test_fidelity_record(gemma):
    fid = gemma[2].extra["fidelity"]["onnx"]
    assert fid["max_abs_logit_diff_first_token"] <= ATOL, fid
    assert fid["greedy_8_agrees"] == fid["probes"], fid


def test_baked_text_prefix_is_the_prefill(gemma):
    _, _, manifest, rt = gemma
    for task in ("support", "raw"):
        assert manifest.tasks[task].prefix_tokens > 2 * WINDOW, task  # the window slides inside it
        for text in INPUTS:
            baked, full = baked_and_prefilled(rt, task, text)
            assert np.max(np.abs(baked - full)) < 1e-5, (task, text)
            a = rt.generate(task, text, max_tokens=N)
            b = rt.generate(task, text, max_tokens=N, use_prefix_cache=False)
            assert a.tokens == b.tokens and len(a.tokens) > 0, (task, text)


@pytest.mark.parametrize("task", ["soft", "tuned"])
def test_baked_adapter_is_peft(gemma, task):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    built, root, _, rt = gemma
    adapter = {"soft": "prompt", "tuned": "prefix"}[task]
    pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(built.hf_dir)).eval(),
                                   str(root / adapter)).eval()
    prefix, _ = rt.prefixes.get(task)
    for text in INPUTS:
        ids = built.tokenizer.encode(text, add_special_tokens=False)
        with torch.no_grad():
            cur = torch.tensor([ids])
            want = pm(input_ids=cur, attention_mask=torch.ones_like(cur)).logits[0, -1].numpy()
        rt.backend.begin(prefix)
        got = rt.backend.prefill(np.array(ids, np.int64))
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"{task} {text}")


def test_int4_export_opens_and_generates(gemma, tmp_path):
    from prefix_edge.export.build import export_bundle

    built, root, _, _ = gemma
    (tmp_path / "tasks.toml").write_text(TASKS.split("[task.soft]")[0], encoding="utf-8")
    manifest = export_bundle(built.hf_dir, tmp_path / "tasks.toml", tmp_path / "bundle", formats=("onnx",),
                             quantize="int4", progress=False)
    assert manifest.backends["onnx"].quantization == "int4"
    with Runtime.open(tmp_path / "bundle", backend="onnx") as rt:
        for task in ("support", "raw"):
            assert len(rt.generate(task, INPUTS[0], max_tokens=N).tokens) > 0


@pytest.mark.parametrize("change, needle", [
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"layer_types": ["sliding_attention"] * 5 + ["chunked_attention"]}, "'chunked_attention' layers"),
    ({"hidden_activation": "gelu"}, "'gelu' activation"),
    ({"use_bidirectional_attention": True}, "bidirectional attention"),
])
def test_refusals_are_one_line(gemma, tmp_path, change, needle):
    from prefix_edge.export.onnx_graph import build_onnx

    cfg = json.loads((gemma[0].hf_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))  # refused before any weight
    with pytest.raises(PrefixEdgeError, match=needle) as e:
        build_onnx(tmp_path, tmp_path / "out")
    assert "\n" not in str(e.value) and "--onnx-builder optimum" in str(e.value)
