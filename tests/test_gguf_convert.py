"""HF -> GGUF conversion (llama.cpp's own converter, through prefix_edge.export.gguf) and GGUF
quantization (prefix_edge.llamacpp.quantize) checked against transformers, on tiny seeded random
models of the architectures people deploy (Llama 3.x, Qwen2/3, Gemma 3, Phi-3/4, SmolLM3,
Granite, Mistral), in their configs' shapes.

Each architecture gets its own byte-level BPE tokenizer, trained here, with a different
pre-tokenizer (SmolLM digits + ByteLevel, plain GPT-2 ByteLevel, Qwen2 split regex, and Llama 3
split regex on a fourth, llama, model), so every pre-tokenizer name the converter writes is
exercised by llama.cpp's own tokenizer (the models: tests/helpers/archs.py).
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from prefix_edge.errors import PrefixEdgeError
from prefix_edge.export.gguf import convert_hf_to_gguf
from prefix_edge.llamacpp.quantize import GGUF_QUANT_CHOICES, quantize_gguf

from .helpers.archs import ARCHS, CHATML, CORPUS, SPECIALS, USER_DEFINED, Built, build_arch

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):\n    return",
    "<|im_start|>user\nCafé déjà vu, 123 apples?<|im_end|>\n<|im_start|>assistant\n",
    "Привет 🌍 x = [1, 2]; y = {'k': 42}",
    "    indented\t\ttabs   and spaces\n\n",
    "I'm sure they'll say <think>42</think> 2024-11-05",
]
TOKENIZE_TEXTS = CORPUS + [
    "Hello  world!\n\n\tdef f(x):\n        return x**2  # 12345 ÆØÅ 你好 🚀 I'm it's 3.14159   ",
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n  hi <think>  x</think><|im_end|>",
    "unseen: Ωμέγα ẞ ﬁ 𝔘𝔫𝔦 \r\n\r\n 0x1F600 1234567890 \u00a0nbsp\u3000ideo  trailing   ",
    "<|endoftext|><|endoftext|>a<|im_end|>",
]

# llama.cpp vs transformers, both fp32 with an F32 KV cache: the only difference left is the
# order of floating-point sums in ggml's kernels. Measured here, over all positions of all
# prompts: max |Δlogit| = 1.22e-5 (llama), 1.31e-5 (mistral), 1.24e-5 (qwen2), on logits up to
# ~7.7 in magnitude (rel. ~2e-6). 1e-3 leaves ~80x margin and is still far below what a broken
# conversion gives: without the Q/K permutation (or with it, for qwen2) max |Δ| was 4.8-7.0 and
# greedy tokens changed.
LOGIT_ATOL = 1e-3
# Gemma 3's GELU-tanh: ggml computes GELU through an f16 lookup table even on f32 tensors
# (GGML_GELU_FP16), so ~1e-3 per activation; measured max |Δlogit| 1.29e-2 over the prompts.
ARCH_ATOL = {"gemma3": 3e-2}
# and with the F16 KV cache: Phi-4-mini's shape (head_dim 64 here) rounds the most, measured 6.0e-2
F16_ARCH_ATOL = {"gemma3": 3e-2, "phi3": 5e-2}
# f16 rounding (11-bit mantissa) of the KV cache (llama.cpp's default) or of the weights (ftype
# "f16"): measured max |Δlogit| 1.1e-2..1.6e-2 (f16 KV) and 1.7e-2..2.0e-2 (f16 weights).
F16_ATOL = 5e-2


def _load(path: Path, f32_kv: bool = True):
    import llama_cpp

    kv = llama_cpp.GGML_TYPE_F32 if f32_kv else None
    return llama_cpp.Llama(model_path=str(path), n_ctx=256, logits_all=True, verbose=False,
                           n_threads=2, type_k=kv, type_v=kv)


def _llama_logits(llm, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def _hf_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def _metadata(path: Path) -> dict:
    import gguf

    reader = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    meta["tensors"] = {t.name: t.tensor_type.name for t in reader.tensors}
    return meta


@pytest.fixture(scope="module", params=list(ARCHS))
def built(request, tmp_path_factory) -> Built:
    return build_arch(request.param, tmp_path_factory.mktemp("model"))  # no arch in the name: llama.cpp keys some vocab rules on it


@pytest.fixture(scope="module")
def llm(built):
    model = _load(built.gguf)
    yield model
    model.close()


def test_logits_match_transformers(built, llm):
    worst = 0.0
    for prompt in PROMPTS:
        ids = built.tokenizer.encode(prompt, add_special_tokens=False)
        ours, ref = _llama_logits(llm, ids), _hf_logits(built.model, ids)
        worst = max(worst, float(np.abs(ours - ref).max()))
        np.testing.assert_allclose(ours, ref, rtol=0, atol=ARCH_ATOL.get(built.kind, LOGIT_ATOL), err_msg=prompt)
        assert (ours.argmax(-1) == ref.argmax(-1)).all(), prompt
    print(f"\n{built.kind}: max |Δlogit| vs transformers = {worst:.2e}")


def test_logits_with_default_f16_kv_cache(built):
    llm = _load(built.gguf, f32_kv=False)
    try:
        for prompt in PROMPTS:
            ids = built.tokenizer.encode(prompt, add_special_tokens=False)
            ours, ref = _llama_logits(llm, ids), _hf_logits(built.model, ids)
            np.testing.assert_allclose(ours, ref, rtol=0, atol=F16_ATOL + F16_ARCH_ATOL.get(built.kind, 0.0),
                                       err_msg=prompt)
            assert ours[-1].argmax() == ref[-1].argmax(), prompt
    finally:
        llm.close()


def test_tokenization_matches_transformers(built, llm):
    for text in TOKENIZE_TEXTS:
        ours = llm.tokenize(text.encode(), add_bos=False, special=True)
        assert ours == built.tokenizer.encode(text, add_special_tokens=False), text
        # and back: llama.cpp detokenizes to the same text (special tokens rendered)
        assert llm.detokenize(ours, special=True).decode() == text, text


def test_metadata(built, llm):
    import gguf

    meta = _metadata(built.gguf)
    _, extras, _, arch, pre = ARCHS[built.kind]
    tok = built.tokenizer
    assert meta["general.architecture"] == arch
    assert meta["tokenizer.ggml.model"] == "gpt2"
    assert meta["tokenizer.ggml.pre"] == pre
    assert meta["tokenizer.chat_template"] == CHATML
    assert meta[f"{arch}.attention.head_count"] == 4
    assert meta[f"{arch}.attention.head_count_kv"] == 2
    assert meta[f"{arch}.rope.freq_base"] == pytest.approx(extras["rope_theta"])
    assert meta[f"{arch}.attention.layer_norm_rms_epsilon"] == pytest.approx(
        extras["rms_norm_eps"])
    assert meta["tokenizer.ggml.bos_token_id"] == tok.bos_token_id
    assert meta["tokenizer.ggml.eos_token_id"] == tok.eos_token_id
    assert meta["tokenizer.ggml.padding_token_id"] == tok.pad_token_id
    assert meta["tokenizer.ggml.unknown_token_id"] == tok.unk_token_id
    # BOS/EOS added as transformers adds them (here: neither), whether or not the file says so
    assert meta.get("tokenizer.ggml.add_bos_token", False) is False
    assert llm.tokenize(b"hello there", add_bos=True, special=True) == tok.encode("hello there")
    types = meta["tokenizer.ggml.token_type"]
    assert len(meta["tokenizer.ggml.tokens"]) == len(types) == len(tok)
    for t in SPECIALS:
        assert types[tok.convert_tokens_to_ids(t)] == gguf.TokenType.CONTROL
    for t in USER_DEFINED:
        assert types[tok.convert_tokens_to_ids(t)] == gguf.TokenType.USER_DEFINED
    assert types.count(gguf.TokenType.NORMAL) == len(tok) - len(SPECIALS) - len(USER_DEFINED)
    assert ("output.weight" in meta["tensors"]) == (not extras["tie_word_embeddings"])
    assert set(meta["tensors"].values()) == {"F32"}


def test_q8_0_keeps_greedy_next_token(built, llm, tmp_path):
    q8 = tmp_path / "model-q8_0.gguf"
    quantize_gguf(built.gguf, q8, "q8_0")
    assert "Q8_0" in _metadata(q8)["tensors"].values()
    quant = _load(q8)
    try:
        same = 0
        for prompt in PROMPTS:
            ids = built.tokenizer.encode(prompt, add_special_tokens=False)
            same += _llama_logits(quant, ids)[-1].argmax() == _llama_logits(llm, ids)[-1].argmax()
    finally:
        quant.close()
    assert same >= math.ceil(0.75 * len(PROMPTS)), f"{same}/{len(PROMPTS)} greedy tokens kept"


def test_quantize_rejects_unknown_type(built, tmp_path):
    assert {"f16", "q8_0", "q4_0", "q4_1", "q4_k_m", "q5_k_m", "q6_k"} <= set(GGUF_QUANT_CHOICES)
    with pytest.raises(PrefixEdgeError, match="unknown GGUF quantization 'q3_xyz'.*q8_0"):
        quantize_gguf(built.gguf, tmp_path / "x.gguf", "q3_xyz")
    with pytest.raises(PrefixEdgeError, match="no GGUF file"):
        quantize_gguf(tmp_path / "missing.gguf", tmp_path / "x.gguf", "q8_0")


# ---------------------------------------------------------------- one architecture is enough


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Built:
    return build_arch("llama", tmp_path_factory.mktemp("llama-extra"))


def test_bf16_weights_and_f16_output(llama_dir, tmp_path):
    """bf16 checkpoints (numpy cannot read them) convert exactly; f16 output stays close."""
    import torch
    import transformers

    bf16_dir = tmp_path / "bf16"
    copy.deepcopy(llama_dir.model).to(torch.bfloat16).save_pretrained(bf16_dir)
    llama_dir.tokenizer.save_pretrained(bf16_dir)
    ref_model = transformers.LlamaForCausalLM.from_pretrained(bf16_dir, dtype=torch.float32)
    convert_hf_to_gguf(bf16_dir, tmp_path / "bf16-as-f32.gguf", "f32")
    convert_hf_to_gguf(bf16_dir, tmp_path / "bf16-as-f16.gguf", "f16")
    types = _metadata(tmp_path / "bf16-as-f16.gguf")["tensors"]
    assert types["blk.0.attn_q.weight"] == "F16" and types["blk.0.attn_norm.weight"] == "F32"
    for name, atol in (("bf16-as-f32.gguf", LOGIT_ATOL), ("bf16-as-f16.gguf", F16_ATOL)):
        llm = _load(tmp_path / name)
        try:
            for prompt in PROMPTS:
                ids = llama_dir.tokenizer.encode(prompt, add_special_tokens=False)
                ours, ref = _llama_logits(llm, ids), _hf_logits(ref_model, ids)
                np.testing.assert_allclose(ours, ref, rtol=0, atol=atol,
                                           err_msg=f"{name}: {prompt}")
        finally:
            llm.close()


@pytest.mark.parametrize("rope_scaling", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16},
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
], ids=lambda r: r["rope_type"])
def test_rope_scaling_matches_transformers(rope_scaling, tmp_path):
    """Scaled RoPE changes these logits by up to ~10 in transformers; llama.cpp must follow."""
    built = build_arch("llama", tmp_path, rope_scaling=rope_scaling)
    has_freqs = "rope_freqs.weight" in _metadata(built.gguf)["tensors"]
    assert has_freqs == (rope_scaling["rope_type"] == "llama3")
    llm = _load(built.gguf)
    try:
        for prompt in PROMPTS:
            ids = built.tokenizer.encode(prompt, add_special_tokens=False)
            np.testing.assert_allclose(_llama_logits(llm, ids), _hf_logits(built.model, ids),
                                       rtol=0, atol=LOGIT_ATOL, err_msg=prompt)
    finally:
        llm.close()


def _copy_with(src: Path, dst: Path, filename: str, edit) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.gguf"))
    data = json.loads((dst / filename).read_text())
    edit(data)
    (dst / filename).write_text(json.dumps(data))
    return dst


def test_unsupported_inputs_raise_clear_errors(llama_dir, tmp_path):
    def unknown_arch(cfg):
        cfg["architectures"] = ["NoSuchModelForCausalLM"]

    bad = _copy_with(llama_dir.hf_dir, tmp_path / "arch", "config.json", unknown_arch)
    with pytest.raises(PrefixEdgeError, match="llama.cpp's converter .* cannot convert arch: .*NoSuchModelForCausalLM"):
        convert_hf_to_gguf(bad, tmp_path / "x.gguf")

    def whitespace_pre(spec):
        spec["pre_tokenizer"] = {"type": "Whitespace"}

    bad = _copy_with(llama_dir.hf_dir, tmp_path / "pre", "tokenizer.json", whitespace_pre)
    with pytest.raises(PrefixEdgeError, match="pre-tokenizer.*Whitespace.*none that llama.cpp"):
        convert_hf_to_gguf(bad, tmp_path / "x.gguf")

    def prefix_space(spec):
        spec["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True

    bad = _copy_with(llama_dir.hf_dir, tmp_path / "prefix", "tokenizer.json", prefix_space)
    with pytest.raises(PrefixEdgeError, match="pre-tokenizer"):
        convert_hf_to_gguf(bad, tmp_path / "x.gguf")

    (tmp_path / "nojson").mkdir()
    shutil.copy(llama_dir.hf_dir / "config.json", tmp_path / "nojson")
    shutil.copy(llama_dir.hf_dir / "model.safetensors", tmp_path / "nojson")
    with pytest.raises(PrefixEdgeError, match="cannot convert nojson"):
        convert_hf_to_gguf(tmp_path / "nojson", tmp_path / "x.gguf")
    with pytest.raises(PrefixEdgeError, match="unknown GGUF ftype"):
        convert_hf_to_gguf(llama_dir.hf_dir, tmp_path / "x.gguf", "q4_0")
    assert not (tmp_path / "x.gguf").exists()
