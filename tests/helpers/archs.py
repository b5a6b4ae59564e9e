"""Tiny seeded random models of the architectures people deploy (Llama 3.x, Qwen2/3, Gemma 3,
Phi-3/4, SmolLM3, Granite, Mistral), in their configs' shapes, each with a byte-level BPE
tokenizer trained here with its family's pre-tokenizer (SmolLM digits + ByteLevel, plain GPT-2
ByteLevel, Qwen2's split regex, Llama 3's split regex), and its GGUF conversion (llama.cpp's own
converter). Self-contained: nothing from conftest.py, no downloads. The conversion, architecture,
Gemma 3 ONNX and iSWA tests build theirs here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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

@dataclass
class Built:
    kind: str
    hf_dir: Path
    gguf: Path
    model: object  # transformers model, fp32, eval mode
    tokenizer: object  # transformers PreTrainedTokenizerFast


def train_tokenizer(style: str):
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


def seeded_model(cls, tokenizer, vocab: int, extras: dict):
    """A tiny `cls` (hidden 64, 4 heads, 2 KV heads, 2 layers unless `extras` says), seeded, its
    biases and norm weights drawn too (HF inits them to 0 and 1), in eval mode."""
    import torch

    config = cls.config_class(**{
        "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
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
    return model.eval()


def build_arch(kind: str, out: Path, convert: bool = True, **overrides) -> Built:
    """ARCHS[kind] (its config extras updated by `overrides`), seeded, saved in `out` with its
    tokenizer, and converted to `out`/model-f32.gguf unless convert=False."""
    import transformers

    cls_name, extras, style, _, _ = ARCHS[kind]
    extras = {**extras, **overrides}
    tokenizer = train_tokenizer(style)
    model = seeded_model(getattr(transformers, cls_name), tokenizer, len(tokenizer), extras)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if kind == "phi3":  # Phi-4-mini's tokenizer is a GPT-2 BPE, and its config says so
        cfg = json.loads((out / "tokenizer_config.json").read_text())
        (out / "tokenizer_config.json").write_text(json.dumps({**cfg, "tokenizer_class": "GPT2Tokenizer"}))
    gguf_path = out / "model-f32.gguf"
    if convert:
        from prefix_edge.export.gguf import convert_hf_to_gguf

        convert_hf_to_gguf(out, gguf_path, "f32")
    return Built(kind, out, gguf_path, model, tokenizer)
