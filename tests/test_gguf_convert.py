"""HF -> GGUF conversion (llama.cpp's own converter, through prefix_edge.export.gguf) and GGUF
quantization (prefix_edge.quantize.gguf) checked against transformers, on tiny seeded random
models of the architectures people deploy (Llama 3.x, Qwen2/3, Gemma 3, Phi-3/4, SmolLM3,
Granite, Mistral), in their configs' shapes.

Each architecture gets its own byte-level BPE tokenizer, trained here, with a different
pre-tokenizer (SmolLM digits + ByteLevel, plain GPT-2 ByteLevel, Qwen2 split regex, and Llama 3
split regex on a fourth, llama, model), so every pre-tokenizer name the converter writes is
exercised by llama.cpp's own tokenizer.
Self-contained: nothing from conftest.py, no downloads.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from prefix_edge.errors import PrefixEdgeError
from prefix_edge.export.gguf import convert_hf_to_gguf
from prefix_edge.quantize.gguf import GGUF_QUANT_CHOICES, quantize_gguf

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<think>", "</think>"]  # added, not special: llama.cpp USER_DEFINED tokens
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The split regexes of Qwen2's and Llama 3's tokenizer.json, as they are published.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 12:45 and we've got 3,141 apples.",
    "def add(a, b):\n    return a + b  # sum\n\nfor i in range(10):\n\tprint(i ** 2)",
    "Café déjà vu — naïve façade. Größe, Straße, ÆØÅ æøå.",
    "Привет, мир! Как дела? 你好，世界。こんにちは世界。안녕하세요 🌍🚀😀",
    "    indented   text\twith\t\ttabs and   multiple    spaces\n\n\nnew lines",
    "x = [1, 2, 3]; y = {'k': 42}; z = \"string\" if x else None  # 2024-11-05",
    "<html><body class=\"main\">Hello &amp; welcome!</body></html>",
    "I'm sure they'll say we'd rather not. You're right, isn't it? THEY'LL SEE.",
]
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

# Per arch: (transformers class, config extras, tokenizer style, GGUF arch, GGUF pre name)
ARCHS = {
    "llama": ("LlamaForCausalLM", dict(head_dim=16, rope_theta=100000.0, attention_bias=True,
                                       tie_word_embeddings=True, rms_norm_eps=1e-5),
              "smollm", "llama", "smollm"),
    "mistral": ("MistralForCausalLM", dict(head_dim=16, rope_theta=1e6, sliding_window=None,
                                           tie_word_embeddings=False, rms_norm_eps=1e-5),
                "gpt2", "llama", "gpt-2"),
    "qwen2": ("Qwen2ForCausalLM", dict(rope_theta=1e6, use_sliding_window=False,
                                       tie_word_embeddings=True, rms_norm_eps=1e-6),
              "qwen2", "qwen2", "qwen2"),
    # a Llama 3 style tokenizer (digit triples, ignore_merges) on an untied llama
    "llama3": ("LlamaForCausalLM", dict(head_dim=16, rope_theta=500000.0,
                                        tie_word_embeddings=False, rms_norm_eps=1e-5),
               "llama3", "llama", "llama-bpe"),
    # the architectures people deploy on devices, in the shapes of their published configs
    "llama3.2": ("LlamaForCausalLM", dict(head_dim=16, rope_theta=500000.0, tie_word_embeddings=True,
                                          rms_norm_eps=1e-5, rope_scaling={
                                              "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
                 "llama3", "llama", "llama-bpe"),
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=16, rope_theta=1e6, tie_word_embeddings=True,
                                       rms_norm_eps=1e-6), "qwen2", "qwen3", "qwen2"),
    "gemma3": ("Gemma3ForCausalLM", dict(head_dim=16, rope_theta=1e6, rope_local_base_freq=10000.0,
                                         sliding_window=8, num_hidden_layers=6,  # 5 local : 1 global, as Gemma 3
                                         layer_types=["sliding_attention"] * 5 + ["full_attention"],
                                         query_pre_attn_scalar=16, tie_word_embeddings=True, rms_norm_eps=1e-6,
                                         hidden_activation="gelu_pytorch_tanh"), "gpt2", "gemma3", "gpt-2"),
    # head_dim 64 (Phi-4-mini: 128): a rotary of 0.75 x 64 = 48 dims, as ORT's attention needs
    "phi3": ("Phi3ForCausalLM", dict(hidden_size=256, rope_theta=10000.0, partial_rotary_factor=0.75, tie_word_embeddings=True,
                                     rms_norm_eps=1e-5), "gpt2", "phi3", "gpt-2"),
    "smollm3": ("SmolLM3ForCausalLM", dict(head_dim=16, rope_theta=2e6, num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0],
                                           tie_word_embeddings=True, rms_norm_eps=1e-6), "llama3", "smollm3", "llama-bpe"),
    "granite": ("GraniteForCausalLM", dict(rope_theta=10000.0, embedding_multiplier=12.0, residual_multiplier=0.22,
                                           attention_multiplier=0.0625, logits_scaling=8.0, tie_word_embeddings=True,
                                           rms_norm_eps=1e-5), "gpt2", "granite", "gpt-2"),
}

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


@dataclass
class Built:
    kind: str
    hf_dir: Path
    gguf: Path
    model: object  # transformers model, fp32, eval mode
    tokenizer: object  # transformers PreTrainedTokenizerFast


def _train_tokenizer(style: str):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    split = {"qwen2": QWEN2_SPLIT, "llama3": LLAMA3_SPLIT}.get(style)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
    tok = Tokenizer(models.BPE(ignore_merges=style == "llama3"))
    if style == "gpt2":
        tok.pre_tokenizer = byte_level
    elif style == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|im_end|>",
                                   unk_token="<|endoftext|>")
    fast.add_tokens(USER_DEFINED)
    fast.chat_template = CHATML
    return fast


def _build(kind: str, out: Path, convert: bool = True, **overrides) -> Built:
    import torch
    import transformers

    cls_name, extras, style, _, _ = ARCHS[kind]
    extras = {**extras, **overrides}
    tokenizer = _train_tokenizer(style)
    cls = getattr(transformers, cls_name)
    config = cls.config_class(**{
        "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "initializer_range": 0.2, "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id, **extras})
    torch.manual_seed(0)
    model = cls(config)
    with torch.no_grad():  # HF inits biases to 0 and norms to 1: randomize so both are tested
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.2)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if kind == "phi3":  # Phi-4-mini's tokenizer is a GPT-2 BPE, and its config says so
        cfg = json.loads((out / "tokenizer_config.json").read_text())
        (out / "tokenizer_config.json").write_text(json.dumps({**cfg, "tokenizer_class": "GPT2Tokenizer"}))
    gguf_path = out / "model-f32.gguf"
    if convert:
        convert_hf_to_gguf(out, gguf_path, "f32")
    return Built(kind, out, gguf_path, model, tokenizer)


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
    return _build(request.param, tmp_path_factory.mktemp("model"))  # no arch in the name: llama.cpp keys some vocab rules on it


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
    return _build("llama", tmp_path_factory.mktemp("llama-extra"))


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
    built = _build("llama", tmp_path, rope_scaling=rope_scaling)
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
