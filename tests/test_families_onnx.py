"""The dense 2025-26 families on the own ONNX graph (export/onnx_graph.py), each a tiny seeded
checkpoint (tests/helpers/families.py) exported once with `--format onnx --quantize none`:
OLMo 2 (post-norms, q/k norms over the whole projection), EXAONE 4.0 (per-head q/k norms,
post-norms; as the family helper builds it, and a 4-layer one with a window of 8 whose last layer
is global and has no RoPE), Hunyuan dense (per-head q/k norms after the rotary; with the NTK-alpha
dynamic RoPE real checkpoints ship), ERNIE 4.5 (interleaved rotary, biases everywhere) and the
hybrids LFM2 (short-convolution layers), Granite 4.0-H (Mamba2 layers, attention without RoPE)
and Falcon-H1 (Mamba2 beside attention in every layer, its μP multipliers set, two groups), and
Gemma 4 (per-layer head sizes; E2B's layout, the larger models' K = V global layers, the dense
31B's without per-layer inputs or KV sharing):
- fp32 logits at every position match transformers to 1e-4, stepped one token at a time, in
  chunks and as one prefill, and the greedy tokens agree;
- a baked chat prefix and a baked text prefix give the first-step logits (1e-5) and the greedy
  tokens of prefilling them;
- the default export command (`--format onnx,gguf`) writes both engines for one of them.
"""

from __future__ import annotations

import numpy as np
import pytest

from prefix_edge import Runtime

from .helpers.families import FALCON_MUP, build_family, family_tasks
from .helpers.parity import baked_and_prefilled, three_ways

pytestmark = pytest.mark.integration

ATOL = 1e-4
# Qwen3.5's and the OLMo hybrid's reference: transformers computes a whole sequence's Gated DeltaNet with its chunked
# kernel, and steps with its recurrent one (the graph's order); on this model and a 40-token input
# the two differ by 4.0e-4 from each other, so the graph is held to transformers within 2e-3
TOLERANCE = {"qwen3_5": 2e-3, "olmo_hybrid": 2e-3}
GGUF_TIE = 0.1  # f32 weights, llama.cpp's F16 KV cache: tests/test_hybrid_gguf.py's logit bound
N = 8
TASKS = family_tasks(N)
INPUTS = ["The quick brown fox", "def add(a, b):\n    return", "I'm sure they'll say"]
# name -> (tests/helpers/families.py kind, config overrides)
CASES = {
    "olmo2": ("olmo2", {}),
    "exaone4": ("exaone4", {}),
    "exaone4-window": ("exaone4", dict(num_hidden_layers=4, sliding_window=8)),
    "hunyuan": ("hunyuan", dict(rope_scaling={"type": "dynamic", "alpha": 1000.0, "factor": 1.0})),
    "ernie4_5": ("ernie4_5", {}),
    # transformers 5's: OLMo 3 (sliding 3:1, a window of 8), Ministral 3 (YaRN, the query scaled
    # by position past 16)
    "olmo3": ("olmo3", {}),
    "ministral3": ("ministral3", {}),
    # Nemotron-H (dense): Mamba2, squared-ReLU MLP and position-free attention blocks, one a layer
    "nemotronh": ("nemotronh", {}),
    # Qwen3.5: Gated DeltaNet layers (a Scan over the tokens), gated attention, partial rotary
    "qwen3_5": ("qwen3_5", {}),
    "olmo_hybrid": ("olmo_hybrid", {}),  # (its released checkpoints: no rotary; this one has it)
    "lfm3": ("lfm3", {}),
    # Gemma 4 (E2B's text shape): sliding heads of 16, global ones of 512, per-layer inputs, the
    # last two layers reading earlier layers' KV; and the larger models' global layers: K = V,
    # their own KV-head count and head size, double-wide MLPs on the shared layers, layer scalars
    "gemma4": ("gemma4", {}),
    "gemma4-k-eq-v": ("gemma4", dict(attention_k_eq_v=True, num_global_key_value_heads=1, global_head_dim=32,
                                     use_double_wide_mlp=True, final_logit_softcapping=30.0,
                                     random_layer_scalars=True)),
    # the dense 31B's layout: no per-layer inputs, no KV-shared layers, K = V global layers
    "gemma4-dense": ("gemma4", dict(hidden_size_per_layer_input=0, num_kv_shared_layers=0, attention_k_eq_v=True,
                                    num_global_key_value_heads=1, global_head_dim=32)),
    # the hybrids: recurrent layers' states in and out (tests/test_hybrid_onnx.py)
    "lfm2": ("lfm2", {}),
    "granitehybrid": ("granitehybrid", {}),
    "falconh1": ("falconh1", dict(FALCON_MUP, mamba_n_groups=2, mamba_norm_before_gate=True)),
}
_BUILT: dict = {}


@pytest.fixture(scope="module", params=list(CASES))
def family(request, tmp_path_factory):
    """One checkpoint and one ONNX export per case for the whole module."""
    name = request.param
    if name not in _BUILT:
        from prefix_edge.export.build import export_bundle

        kind, overrides = CASES[name]
        root = tmp_path_factory.mktemp(f"onnx-{name}")
        model, tok = build_family(kind, root / "model", **overrides)
        (root / "tasks.toml").write_text(TASKS, encoding="utf-8")
        manifest = export_bundle(root / "model", root / "tasks.toml", root / "bundle", formats=("onnx",),
                                 quantize="none", progress=False)
        _BUILT[name] = (model, tok, root, manifest)
    model, tok, root, manifest = _BUILT[name]
    with Runtime.open(root / "bundle", backend="onnx") as rt:
        yield name, model, tok, manifest, rt


def test_logits_match_transformers_at_every_position(family):
    import torch

    name, model, tok, manifest, rt = family
    if name == "exaone4-window":  # the window slides, and the last layer attends to all, unrotated
        assert model.config.layer_types == ["sliding_attention"] * 3 + ["full_attention"]
    be, worst = rt.backend, 0.0
    prompts = [tok.encode(t, add_special_tokens=False) for t in INPUTS]
    prompts.append(np.random.default_rng(0).integers(0, len(tok), 40).tolist())  # specials included
    for ids in prompts:
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0].numpy()
        diffs, stepped = three_ways(be, ids, ref)
        for what, d in diffs.items():
            worst = max(worst, d)
            assert d <= TOLERANCE.get(name, ATOL), (name, what, len(ids), d)
        assert (stepped.argmax(-1) == ref.argmax(-1)).all(), name
    fid = manifest.extra["fidelity"]["onnx"]
    assert fid["max_abs_logit_diff_first_token"] <= TOLERANCE.get(name, ATOL) and fid["greedy_8_agrees"] == fid["probes"], fid
    print(f"\n{name} onnx fp32: max |Δlogit| vs transformers = {worst:.2e}")


def test_baked_prefix_is_the_prefill(family):
    name, _, _, manifest, rt = family
    for task in ("support", "raw"):
        assert manifest.tasks[task].prefix_tokens > 10, (name, task)
        for text in INPUTS:
            baked, full = baked_and_prefilled(rt, task, text)
            assert np.max(np.abs(baked - full)) < 1e-5, (name, task, text)
            a = rt.generate(task, text, max_tokens=N)
            b = rt.generate(task, text, max_tokens=N, use_prefix_cache=False)
            assert a.tokens == b.tokens and len(a.tokens) > 0, (name, task, text)


def export_both(tmp_path) -> None:
    """The default export command on tmp_path/model: `--format onnx,gguf --quantize none`."""
    import os
    import subprocess
    import sys

    (tmp_path / "tasks.toml").write_text(TASKS, encoding="utf-8")
    cmd = [sys.executable, "-m", "prefix_edge", "export", str(tmp_path / "model"), "--tasks",
           str(tmp_path / "tasks.toml"), "--format", "onnx,gguf", "--quantize", "none", "--out",
           str(tmp_path / "bundle")]
    p = subprocess.run(cmd, capture_output=True, text=True,
                       env={**os.environ, "PREFIX_EDGE_HOME": str(tmp_path / "home")})
    assert p.returncode == 0, p.stderr[-2000:]


def test_default_export_command_builds_both_engines(tmp_path):
    """`prefix-edge export DIR --tasks T --format onnx,gguf --quantize none` on Hunyuan dense (the
    own ONNX builder refused it before), both engines' baked prefixes equal to their prefill."""
    pytest.importorskip("llama_cpp")
    build_family("hunyuan", tmp_path / "model")
    export_both(tmp_path)
    for backend in ("onnx", "gguf"):
        with Runtime.open(tmp_path / "bundle", backend=backend) as rt:
            baked, full = baked_and_prefilled(rt, "support", INPUTS[0])
            assert np.max(np.abs(baked - full)) < 1e-5, backend


def test_a_sentencepiece_checkpoint_exports_both_engines(tmp_path):
    """ERNIE 4.5 as its checkpoints ship: a SentencePiece `tokenizer.model` and a slow
    tokenizer's config, no tokenizer.json. The default export writes both engines (llama.cpp's
    converter reads the .model; the bundle gets the fast tokenizer transformers converts from
    it); the bundle tokenizes as transformers does; on each engine the greedy answer after the
    baked prefix is transformers' greedy continuation of the same ids, and baked == prefilled."""
    import torch

    pytest.importorskip("llama_cpp")
    # use_bias off, as ERNIE-4.5-0.3B ships (llama.cpp's ERNIE graph has no MLP biases: with
    # them the GGUF export is refused up front, the test at the end of this module)
    model, tok = build_family("ernie4_5", tmp_path / "model", sentencepiece=True, use_bias=False)
    assert not (tmp_path / "model" / "tokenizer.json").exists()
    export_both(tmp_path)
    for backend in ("onnx", "gguf"):
        with Runtime.open(tmp_path / "bundle", backend=backend) as rt:
            for text in INPUTS:
                assert rt.tokenizer.encode(text, add_special_tokens=False).ids == \
                    tok.encode(text, add_special_tokens=False), text
            for task in ("support", "raw"):
                for text in INPUTS:
                    baked, full = baked_and_prefilled(rt, task, text)
                    assert np.max(np.abs(baked - full)) < 1e-4, (backend, task, text)
                    prefix, _ = rt.prefixes.get(task)
                    ids = np.concatenate([prefix.ids, rt.encode_input(task, text)]).tolist()
                    got = rt.generate(task, text, max_tokens=N, stop=[]).tokens
                    assert len(got) > 0, (backend, task, text)
                    # transformers' logits along the engine's own answer: each token its argmax
                    # (ONNX fp32), or within llama.cpp's F16-KV noise of it (near ties)
                    with torch.no_grad():
                        ref = model(torch.tensor([ids + got])).logits[0, len(ids) - 1:-1].numpy()
                    gap = ref.max(axis=1) - ref[np.arange(len(got)), got]
                    assert gap.max() <= (0.0 if backend == "onnx" else GGUF_TIE), (backend, task, text, gap)


def test_an_ernie_checkpoint_with_mlp_biases_is_refused_before_gguf_conversion(tmp_path):
    """llama.cpp's converter writes ERNIE 4.5's MLP biases, its graph has none (loading then
    fails on the tensor count): refused up front, naming the setting and the way out."""
    import json

    from prefix_edge.errors import PrefixEdgeError
    from prefix_edge.export.gguf import convert_hf_to_gguf

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "ernie4_5", "use_bias": True}))
    with pytest.raises(PrefixEdgeError) as e:
        convert_hf_to_gguf(tmp_path, tmp_path / "out.gguf")
    assert "use_bias=true" in str(e.value) and "--format onnx" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out.gguf").exists()
