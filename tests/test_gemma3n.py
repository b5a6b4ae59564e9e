"""Gemma 3n as its checkpoints ship (Gemma3nForConditionalGeneration: vision and audio towers
beside the text model, a SentencePiece tokenizer.model), a tiny seeded one in E2B's shape whose
reference is transformers' text class (the one the multimodal class runs on text)
(tests/helpers/families.py build_gemma3n), exported once by the default command's formats
(`--quantize none`, f32 GGUF weights):
- export reads the text path (export/text_only.py): the text config and the language model's
  weights, none of the towers', as transformers' Gemma3nForCausalLM;
- the own ONNX graph (export/onnx_gemma3n.py: AltUp, LAuReL, per-layer inputs, KV-shared
  layers, activation sparsity, soft-capping) gives transformers' logits at every position,
  stepped, whole and in chunks, past the sliding window; llama.cpp's gemma3n graph agrees
  within its F16 cache's noise;
- a baked prefix is its prefill on both engines; a KV-shared layer keeps no KV (it attends to
  its source layer's cache), and requests decoded together answer as alone;
- what llama.cpp fixes in code (first shared layer 20, per-layer input 256 ...) is refused for
  the GGUF in one line, and the default formats then give the onnx bundle alone;
- a PEFT prefix-tuning adapter baked is PEFT on both engines; prompt tuning is refused."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from prefix_edge import Runtime
from prefix_edge.errors import PrefixEdgeError

from .helpers.families import GEMMA3N_TEXT, build_gemma3n, family_tasks
from .helpers.parity import agree_until_a_near_tie, baked_and_prefilled, generated_together, three_ways

pytestmark = pytest.mark.integration
pytest.importorskip("llama_cpp")

ATOL = 1e-4
GGUF_TIE = 0.1  # f32 weights, llama.cpp's F16 KV cache: tests/test_hybrid_gguf.py's bound
N = 8
TASKS = family_tasks(N)
INPUTS = ["The quick brown fox", "def add(a, b):\n    return", "I'm sure they'll say"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from prefix_edge.export.build import export_bundle

    root = tmp_path_factory.mktemp("gemma3n")
    model, tok = build_gemma3n(root / "model", sentencepiece=True)
    (root / "tasks.toml").write_text(TASKS, encoding="utf-8")
    manifest = export_bundle(root / "model", root / "tasks.toml", root / "bundle", quantize="none",
                             gguf_quant="f32", progress=False)
    return model, tok, root, manifest


def _ids(tok) -> list[list[int]]:
    prompts = [tok.encode(t, add_special_tokens=False) for t in INPUTS]
    prompts.append(np.random.default_rng(0).integers(0, len(tok), 40).tolist())  # past the window (8)
    return prompts


def test_text_path_is_the_multimodal_model(exported, tmp_path):
    import json

    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from prefix_edge.export.text_only import write_text_only

    model, tok, root, manifest = exported
    src = root / "model"
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma3nForConditionalGeneration"] and "text_config" in cfg
    assert (manifest.model.architecture, manifest.model.n_layers) == ("Gemma3nForCausalLM", 25)
    text = write_text_only(src, cfg, tmp_path / "text")
    with safe_open(str(text / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    assert names and all(n.startswith("model.") and "tower" not in n and "embed_vision" not in n for n in names)
    assert (text / "tokenizer.model").is_file()
    lm = AutoModelForCausalLM.from_pretrained(str(text)).eval()
    assert type(lm).__name__ == "Gemma3nForCausalLM"
    for ids in _ids(tok):
        with torch.no_grad():
            a = model(torch.tensor([ids])).logits
            b = lm(torch.tensor([ids])).logits
        assert torch.equal(a, b)


def test_onnx_logits_match_transformers_at_every_position(exported):
    import torch

    model, tok, root, manifest = exported
    assert manifest.extra["fidelity"]["onnx"]["first_token_agrees"] == manifest.extra["fidelity"]["onnx"]["probes"]
    with Runtime.open(root / "bundle", backend="onnx") as rt:
        be = rt.backend
        for ids in _ids(tok):
            with torch.no_grad():  # with its cache: KV-shared layers read their source's (as served)
                ref = model(torch.tensor([ids]), use_cache=True).logits[0].numpy()
            diffs, _ = three_ways(be, ids, ref)
            assert max(diffs.values()) <= ATOL, (diffs, len(ids))


def test_gguf_matches_transformers(exported):
    import torch

    model, tok, root, manifest = exported
    fid = manifest.extra["fidelity"]["gguf"]
    assert fid["max_abs_logit_diff_first_token"] <= GGUF_TIE and fid["non_finite"] == 0, fid
    with Runtime.open(root / "bundle", backend="gguf") as rt:
        be = rt.backend
        lay = be.state_layout  # E2B's pattern: 4 global and 16 sliding layers hold KV, 5 share
        assert (lay.kv_layers, lay.window_layers, lay.window, be.keeps_partial) == (4, 16, 8, False), lay
        for ids in _ids(tok):
            with torch.no_grad():
                ref = model(torch.tensor([ids]), use_cache=True).logits[0, -1].numpy()
            be.begin(None)
            got = be.prefill(np.array(ids, np.int64))
            d = float(np.max(np.abs(got - ref)))
            top2 = np.sort(ref)[-2:]
            assert d <= GGUF_TIE and (top2[1] - top2[0] <= 2 * d or np.argmax(got) == np.argmax(ref)), (len(ids), d)


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_baked_prefix_is_the_prefill(exported, backend):
    _, _, root, _ = exported
    with Runtime.open(root / "bundle", backend=backend) as rt:
        for task in ("support", "raw"):
            for text in INPUTS:
                baked, full = baked_and_prefilled(rt, task, text)
                # llama.cpp: a restored state's sliding-window cache holds the window's cells, a
                # prefilled one every cell (the rest masked): the same attention summed over
                # another cell count, float noise that 25 random layers grow to ~1e-3 at most
                assert np.max(np.abs(baked - full)) < (1e-4 if backend == "onnx" else 2e-3), (task, text)
                a = rt.generate(task, text, max_tokens=N, logprobs=2)
                b = rt.generate(task, text, max_tokens=N, logprobs=2, use_prefix_cache=False)
                if backend == "onnx":
                    assert a.tokens == b.tokens and len(a.tokens) > 0, (task, text)
                else:  # that noise may flip a near tie of this random model, and nothing else
                    agree_until_a_near_tie(b, a, 1e-2)


def test_kv_shared_layers_hold_no_kv(exported):
    """A KV-shared layer attends to its source layer's cache (layers 20-23 slide and read 18,
    24 reads 19): the graph has no past or present of its own for it, so a prefix file, a
    sequence's buffer and a snapshot hold 20 layers' KV, not 25 (llama.cpp's count too)."""
    from prefix_edge.export.onnx_gemma3n import kv_sources

    _, _, root, manifest = exported
    sources = kv_sources(GEMMA3N_TEXT["layer_types"], GEMMA3N_TEXT["num_kv_shared_layers"])
    assert sources[20:] == [18, 18, 18, 18, 19] and sources[:20] == list(range(20))
    with Runtime.open(root / "bundle", backend="onnx") as rt:
        be = rt.backend
        assert (be.model_layers, be.n_layers, be.state_layout.kv_layers) == (25, 20, 20)
        assert {int(n.split(".")[1]) for n in be.past_names} == set(range(20))
        prefix, _ = rt.prefixes.get("support")
        kv = be.kv_of(prefix)
        assert len(kv.k) == 20 and kv.n == manifest.tasks["support"].prefix_tokens


def test_concurrent_requests_answer_as_alone(exported):
    """Four requests of different lengths decoded together (the shared layers' hand-built
    attention masks each row by its own positions) give the tokens of each alone, on both
    engines. llama.cpp's Gemma 3n computes a token otherwise beside another sequence's (a batch
    of one token takes another path: 4.6e-4 apart here, enough to flip a near tie), which the
    engine measures at open: its decoding sequences are then forwarded one at a time."""
    _, _, root, _ = exported
    asks = [("support", INPUTS[0]), ("raw", INPUTS[1]), ("support", INPUTS[2] * 3), ("raw", INPUTS[0] * 2)]
    for backend in ("onnx", "gguf"):
        with Runtime.open(root / "bundle", backend=backend, slots=4) as rt:
            alone = [rt.generate(t, x, max_tokens=N).tokens for t, x in asks]
            assert generated_together(rt, asks, N) == alone, backend
            assert rt.backend.batches_sequences == (backend == "onnx")


def test_gguf_refuses_what_llama_cpp_fixes_in_code(tmp_path):
    from prefix_edge.export.gguf import refuse_unsupported

    refuse_unsupported({"model_type": "gemma3n", "text_config": dict(GEMMA3N_TEXT)})  # E2B's shape: fine
    dense = {**GEMMA3N_TEXT, "num_hidden_layers": 12, "num_kv_shared_layers": 0,
             "layer_types": GEMMA3N_TEXT["layer_types"][:12], "activation_sparsity_pattern": [0.95] * 10 + [0.0] * 2}
    refuse_unsupported({"model_type": "gemma3n_text", **dense})  # no sharing, under 20 layers: the same
    for bad, words in (({"num_kv_shared_layers": 3}, "the last 3 KV-shared"), ({"laurel_rank": 8}, "laurel_rank 8"),
                       ({"hidden_size_per_layer_input": 128}, "hidden_size_per_layer_input 128"),
                       ({"activation_sparsity_pattern": [0.9] * 10 + [0.0] * 15}, "activation_sparsity_pattern")):
        with pytest.raises(PrefixEdgeError, match=words) as e:
            refuse_unsupported({"model_type": "gemma3n", "text_config": {**GEMMA3N_TEXT, **bad}})
        assert "\n" not in str(e.value) and "--format onnx" in str(e.value)
    # the CLI: --format gguf is one line and exit 1; the default formats give the onnx bundle
    build_gemma3n(tmp_path / "model", num_kv_shared_layers=3)
    (tmp_path / "tasks.toml").write_text(TASKS, encoding="utf-8")
    base = [sys.executable, "-m", "prefix_edge", "export", str(tmp_path / "model"), "--tasks",
            str(tmp_path / "tasks.toml"), "--quantize", "none"]
    r = subprocess.run(base + ["--format", "gguf", "--out", str(tmp_path / "g")], capture_output=True, text=True)
    assert r.returncode == 1 and "the last 3 KV-shared" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "g").exists()
    r = subprocess.run(base + ["--out", str(tmp_path / "b")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "gguf backend skipped" in r.stderr
    from prefix_edge.bundle import Bundle

    assert set(Bundle.open(tmp_path / "b").manifest.backends) == {"onnx"}


def _text_dir(root, tmp_path):
    import json

    from prefix_edge.export.text_only import write_text_only

    src = root / "model"
    return write_text_only(src, json.loads((src / "config.json").read_text()), tmp_path / "text")


def test_prompt_tuning_is_refused_in_one_line(exported, tmp_path):
    """PEFT's prompt tuning runs Gemma 3n on embeddings (no per-layer inputs, which the graph
    takes from ids): refused before any model is built."""
    from prefix_edge.export.build import export_bundle

    from .helpers.adapters import make_adapter

    _, _, root, _ = exported
    make_adapter(_text_dir(root, tmp_path), "prompt", tmp_path / "adapter", seed=3)
    (tmp_path / "tasks.toml").write_text('[task.tuned]\nkind = "peft"\nadapter = "adapter"\nchat = false\n',
                                         encoding="utf-8")
    with pytest.raises(PrefixEdgeError, match="on Gemma 3n, which prefix-edge does not bake") as e:
        export_bundle(root / "model", tmp_path / "tasks.toml", tmp_path / "bundle", quantize="none",
                      gguf_quant="f32", progress=False)
    assert "\n" not in str(e.value) and not (tmp_path / "bundle").exists()


def test_prefix_tuning_is_peft_on_both_engines(exported, tmp_path):
    """A prefix-tuning adapter baked: its KV-shared layers' own prefix is never read (they read
    their source layer's, prefix included, as transformers does), so only the 20 KV layers'
    go into the bundle; the first step equals PEFT's (ONNX fp32 to 1e-4, llama.cpp within its
    F16 noise, the argmax unless a near tie), and ONNX's greedy run is PEFT's."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from prefix_edge.export.build import export_bundle

    from .helpers.adapters import baked_prefix_tuning_is_peft, make_adapter

    _, tok, root, _ = exported
    text = _text_dir(root, tmp_path)
    make_adapter(text, "prefix", tmp_path / "adapter", seed=4)
    (tmp_path / "tasks.toml").write_text(f'[task.tuned]\nkind = "peft"\nadapter = "adapter"\nchat = false\n'
                                         f'max_tokens = {N}\n', encoding="utf-8")
    export_bundle(root / "model", tmp_path / "tasks.toml", tmp_path / "bundle", quantize="none", gguf_quant="f32",
                  progress=False)
    pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(text)).eval(), str(tmp_path / "adapter")).eval()
    baked_prefix_tuning_is_peft(tmp_path / "bundle", "tuned", pm, tok, INPUTS, N, GGUF_TIE)
