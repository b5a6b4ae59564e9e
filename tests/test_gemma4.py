"""Gemma 4 (E2B's text shape, tests/helpers/families.py "gemma4": sliding layers with heads of 16,
global ones of 512, the last two layers reading earlier layers' KV) beyond the family checks of
tests/test_families_onnx.py (logits vs transformers, baked == prefilled) and tests/test_hybrid_gguf.py:
- the own ONNX graph's KV inputs differ in shape between layers, and a prefix file and a
  sequence's buffer hold each layer's own shape (a file of another shape is refused);
- PEFT prefix tuning, which PEFT provisions at the widest layer's shape and slices per layer,
  baked on both engines, equals PEFT's own first step and (ONNX) its greedy run;
- prompt tuning (which transformers cannot run on Gemma 4) and a prefix that a layer does not
  fit are refused in one line before anything is built;
- on ONNX, requests decoded together answer as alone, and a conversation's next turn from the
  prompt cache equals the uncached run."""

from __future__ import annotations

import numpy as np
import pytest

from prefix_edge import Runtime
from prefix_edge.errors import PrefixEdgeError

from .helpers.families import build_family, family_tasks
from .helpers.parity import generated_together

pytestmark = pytest.mark.integration
pytest.importorskip("llama_cpp")

N = 6
INPUTS = ["The quick brown fox", "I'm sure they'll say"]
GGUF_TIE = 0.2  # llama.cpp's gemma4 graph vs transformers (tests/test_hybrid_gguf.py's bound for it)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from prefix_edge.export.build import export_bundle

    root = tmp_path_factory.mktemp("gemma4")
    model, tok = build_family("gemma4", root / "model")
    (root / "tasks.toml").write_text(family_tasks(N), encoding="utf-8")
    export_bundle(root / "model", root / "tasks.toml", root / "bundle", quantize="none", gguf_quant="f32",
                  progress=False)
    return model, tok, root


def test_each_layer_keeps_its_own_kv_shape(exported, tmp_path):
    import safetensors.numpy as st

    _, _, root = exported
    with Runtime.open(root / "bundle", backend="onnx") as rt:
        be = rt.backend
        # layers 0-2 slide (2 KV heads of 16), 3 is global (2 of 512); 4 and 5 read 2's and 3's
        assert be.kv_shapes == [(2, 16)] * 6 + [(2, 512)] * 2 and be.model_layers == 6, be.kv_shapes
        assert be.position_bytes() == 4 * (6 * 32 + 2 * 1024)
        prefix, _ = rt.prefixes.get("support")
        assert [a.shape[1:] for a in prefix.state.kv] == [(2, prefix.n_tokens, 16)] * 6 + \
            [(2, prefix.n_tokens, 512)] * 2
        # a prefix file whose global layer has the sliding layers' shape is one line
        path = next(p for p in (root / "bundle").rglob("*.safetensors") if "onnx" in str(p) and "support" in p.name)
        tensors = st.load_file(str(path))
        tensors["past_key_values.3.key"] = tensors["past_key_values.3.key"][..., :16].copy()
        from safetensors import safe_open
        with safe_open(str(path), "np") as f:
            meta = f.metadata()
        bad = tmp_path / "bad.safetensors"
        st.save_file(tensors, str(bad), metadata=meta)
        with pytest.raises(PrefixEdgeError) as e:
            be.format.read(st.load_file(str(bad)), meta, str(bad))
        assert "past_key_values.3.key" in str(e.value) and "[1, 2," in str(e.value) and "512]" in str(e.value)


def test_prefix_tuning_is_peft_on_both_engines(exported, tmp_path):
    """PEFT provisions every layer's prefix at the global layers' shape (2 × 512) and gives the
    sliding layers its first 16 dims; the KV-shared layers' is never read. Baked: the first step
    equals PEFT's (ONNX fp32 to 1e-4, llama.cpp within its gemma4 noise, the argmax unless a near
    tie), and ONNX's greedy run is PEFT's."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from prefix_edge.export.build import export_bundle

    from .helpers.adapters import baked_prefix_tuning_is_peft, make_adapter

    _, tok, root = exported
    make_adapter(root / "model", "prefix", tmp_path / "adapter", seed=4)
    (tmp_path / "tasks.toml").write_text(f'[task.tuned]\nkind = "peft"\nadapter = "adapter"\nchat = false\n'
                                         f'max_tokens = {N}\n', encoding="utf-8")
    export_bundle(root / "model", tmp_path / "tasks.toml", tmp_path / "bundle", quantize="none", gguf_quant="f32",
                  progress=False)
    pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(root / "model")).eval(),
                                   str(tmp_path / "adapter")).eval()
    worst = baked_prefix_tuning_is_peft(tmp_path / "bundle", "tuned", pm, tok, INPUTS, N, GGUF_TIE)
    print(f"\ngemma4 prefix tuning: max |Δlogit| vs PEFT = {worst}")


@pytest.mark.parametrize("kind, overrides, says", [
    ("prompt", {}, "on Gemma 4, which prefix-edge does not bake"),
    # global layers of 1 KV head × 32: PEFT provisions 1 × 32, which the sliding layers' 2 × 16 do not fit
    ("prefix", dict(attention_k_eq_v=True, num_global_key_value_heads=1, global_head_dim=32),
     "which layer 0's 2 × 16 does not fit"),
])
def test_an_adapter_a_bundle_cannot_hold_is_one_line(kind, overrides, says, tmp_path):
    from prefix_edge.export.build import export_bundle

    from .helpers.adapters import make_adapter

    build_family("gemma4", tmp_path / "model", **overrides)
    make_adapter(tmp_path / "model", kind, tmp_path / "adapter", seed=3)
    (tmp_path / "tasks.toml").write_text('[task.tuned]\nkind = "peft"\nadapter = "adapter"\nchat = false\n',
                                         encoding="utf-8")
    with pytest.raises(PrefixEdgeError) as e:
        export_bundle(tmp_path / "model", tmp_path / "tasks.toml", tmp_path / "bundle", quantize="none",
                      gguf_quant="f32", progress=False)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "bundle").exists()


def test_concurrent_requests_and_the_next_turn_on_onnx(exported):
    """On the own graph: four requests of different lengths decoded together (the KV-shared
    layers' hand-built attention masks each row by its own positions; the buffers hold two KV
    shapes) give the tokens of each alone; a conversation's next turn from the prompt cache (the
    first turn's KV, each layer's own shape) equals the uncached run, logprobs bit for bit."""
    _, _, root = exported
    asks = [("support", INPUTS[0]), ("raw", INPUTS[1]), ("support", INPUTS[1] * 3), ("raw", INPUTS[0] * 2)]
    with Runtime.open(root / "bundle", backend="onnx", slots=4) as rt:
        alone = [rt.generate(t, x, max_tokens=N).tokens for t, x in asks]
        assert generated_together(rt, asks, N) == alone
        turn = [{"role": "system", "content": "You answer in one line."}, {"role": "user", "content": INPUTS[0]}]
        first = rt.generate(None, messages=turn, max_tokens=N)
        turn += [{"role": "assistant", "content": first.text}, {"role": "user", "content": INPUTS[1]}]
        again = rt.generate(None, messages=turn, max_tokens=N, logprobs=2)
        ref = rt.generate(None, messages=turn, max_tokens=N, logprobs=2, use_prompt_cache=False)
        assert again.tokens == ref.tokens and again.logprobs == ref.logprobs
        assert again.stats.cached_tokens >= first.stats.input_tokens > 0, again.stats
