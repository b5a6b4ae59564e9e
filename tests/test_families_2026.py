"""The end-of-2026 families at export (transformers 5), beyond what tests/test_hybrid_gguf.py and
tests/test_families_onnx.py check per engine:
- the default export (`--format onnx,gguf`) of a model llama.cpp runs and the own ONNX graph
  refuses (Gemma 4 with experts) writes llama.cpp's bundle alone, saying so in one warning line;
- the default export of a family llama.cpp's converter lacks (LFM3, the OLMo hybrid) writes the
  own ONNX graph's bundle alone, saying so in one warning line; `--format gguf` is one error line;
- `--onnx-builder optimum` where optimum-onnx cannot run beside transformers 5 is one line naming
  why and the extra."""

from __future__ import annotations

import json

import pytest

from prefix_edge.errors import PrefixEdgeError

from .conftest import cli
from .helpers.families import build_family, family_tasks

pytestmark = pytest.mark.integration
pytest.importorskip("llama_cpp")

def test_default_export_of_a_model_the_graph_refuses_is_llama_cpps_bundle(tmp_path):
    """Gemma 4 with mixture-of-experts layers (the 26B-A4B's shape): llama.cpp runs it, the own
    graph refuses its experts before reading a weight; the default export writes llama.cpp's
    bundle alone and says why in one warning line."""
    build_family("gemma4", tmp_path / "model", enable_moe_block=True, num_experts=4, top_k_experts=2,
                 moe_intermediate_size=32)
    (tmp_path / "tasks.toml").write_text(family_tasks(4), encoding="utf-8")
    got = cli("export", tmp_path / "model", "--tasks", tmp_path / "tasks.toml", "--out", tmp_path / "b",
              "--quantize", "none")
    assert got.returncode == 0, got.stderr.decode()[-2000:]
    err = " ".join(got.stderr.decode().split())  # (the console wraps long lines)
    assert ("onnx backend skipped: the own ONNX builder has no Gemma 4's mixture-of-experts layers "
            "(enable_moe_block, e.g. 26B-A4B); the bundle is llama.cpp's") in err, err[-800:]
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert sorted(manifest["backends"]) == ["gguf"] and not (tmp_path / "b" / "onnx").exists()
    assert manifest["model"]["architecture"] == "Gemma4ForCausalLM"
    # and asked for explicitly, the own graph's refusal is one error line
    got = cli("export", tmp_path / "model", "--tasks", tmp_path / "tasks.toml", "--out", tmp_path / "o",
              "--format", "onnx", "--quantize", "none")
    errors = [line for line in got.stderr.decode().splitlines() if line.startswith("error:")]
    assert got.returncode == 1 and len(errors) == 1 and "mixture-of-experts" in errors[0], errors


@pytest.mark.parametrize("kind, arch", [("lfm3", "Lfm3ForCausalLM"), ("olmo_hybrid", "OlmoHybridForCausalLM")])
def test_default_export_of_a_family_llama_cpp_lacks_is_the_onnx_bundle(kind, arch, tmp_path):
    build_family(kind, tmp_path / "model")
    (tmp_path / "tasks.toml").write_text(family_tasks(4), encoding="utf-8")
    got = cli("export", tmp_path / "model", "--tasks", tmp_path / "tasks.toml", "--out", tmp_path / "b",
              "--quantize", "none")
    assert got.returncode == 0, got.stderr.decode()[-2000:]
    err = " ".join(got.stderr.decode().split())
    assert f"gguf backend skipped: llama.cpp's converter" in err and f"does not know {arch}" in err, err[-800:]
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert sorted(manifest["backends"]) == ["onnx"] and not (tmp_path / "b" / "gguf").exists()
    # and asked for explicitly, llama.cpp's format is one error line and no bundle
    got = cli("export", tmp_path / "model", "--tasks", tmp_path / "tasks.toml", "--out", tmp_path / "g",
              "--format", "gguf", "--quantize", "none")
    errors = [line for line in got.stderr.decode().splitlines() if line.startswith("error:")]
    assert got.returncode == 1 and len(errors) == 1 and f"{arch} is not supported" in errors[0], errors
    assert not (tmp_path / "g").exists()


def test_the_optimum_builder_without_optimum_is_one_line(tiny_model, tasks_file, tmp_path):
    from prefix_edge.export.build import export_bundle
    from prefix_edge.export.onnx import optimum_unavailable

    why = optimum_unavailable()
    if why is None:
        pytest.skip("optimum-onnx runs beside this transformers: its builder is tested (tests/test_parity.py)")
    with pytest.raises(PrefixEdgeError) as e:
        export_bundle(tiny_model, tasks_file, tmp_path / "b", quantize="none", formats=["onnx"],
                      onnx_builder="optimum", progress=False)
    assert "--onnx-builder optimum" in str(e.value) and why in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kind, multimodal", [("gemma4", "Gemma4"), ("qwen3_5", "Qwen3_5")])
def test_a_multimodal_checkpoint_exports_its_text_path(kind, multimodal, tmp_path):
    """Gemma 4 and Qwen3.5 ship as *ForConditionalGeneration (vision (and audio) towers beside the
    language model, whose weights sit under model.language_model.): export reads the text path
    (*ForCausalLM, as for Gemma 3n) and the bundle answers as the text model's own bundle, bit for
    bit, on every engine it has."""
    import numpy as np
    import transformers
    from safetensors.torch import load_file, save_file

    from prefix_edge import Runtime
    from prefix_edge.export.build import export_bundle

    from .helpers.parity import baked_and_prefilled

    text_dir, mm_dir = tmp_path / "text", tmp_path / "multimodal"
    model, tok = build_family(kind, text_dir)
    mm_dir.mkdir()
    config = getattr(transformers, f"{multimodal}Config")(text_config=model.config.to_dict())
    config.architectures = [f"{multimodal}ForConditionalGeneration"]
    config.save_pretrained(mm_dir)
    weights = {"model.language_model." + k[len("model."):]: v for k, v in load_file(str(text_dir / "model.safetensors")).items()
               if k.startswith("model.")}
    import torch
    weights["model.vision_tower.patch_embedder.input_proj.weight"] = torch.zeros(8, 8)  # a tower's tensor: not read
    save_file(weights, str(mm_dir / "model.safetensors"), metadata={"format": "pt"})
    for f in text_dir.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            (mm_dir / f.name).write_bytes(f.read_bytes())
    (tmp_path / "tasks.toml").write_text(family_tasks(4), encoding="utf-8")
    for src in (text_dir, mm_dir):
        export_bundle(src, tmp_path / "tasks.toml", tmp_path / f"b-{src.name}", quantize="none", gguf_quant="f32",
                      progress=False)
    manifest = json.loads((tmp_path / "b-multimodal" / "manifest.json").read_text())
    backends = ["gguf", "onnx"]
    assert manifest["model"]["architecture"] == f"{multimodal}ForCausalLM" and sorted(manifest["backends"]) == backends
    for backend in backends:
        with Runtime.open(tmp_path / "b-text", backend=backend) as a, \
                Runtime.open(tmp_path / "b-multimodal", backend=backend) as b:
            for task in ("support", "raw"):
                baked_a, _ = baked_and_prefilled(a, task, "The quick brown fox")
                baked_b, prefilled_b = baked_and_prefilled(b, task, "The quick brown fox")
                assert np.array_equal(baked_a, baked_b), (backend, task)
                assert np.abs(baked_b - prefilled_b).max() <= (0 if backend == "gguf" else 1e-5), (backend, task)
