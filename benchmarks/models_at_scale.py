"""The runtime at the sizes people deploy: random-weight checkpoints with the published configs
of Qwen3-0.6B, Llama-3.2-1B, LFM2-1.2B, Granite-4.0-H-1B and Qwen3.5-0.8B (hybrids) and Gemma 4 E2B's
text model (speed and memory do not depend on the weights' values),
exported as a user would (ONNX int4 through the own graph, GGUF Q4_1 through llama.cpp's
converter), then `prefix-edge bench` on each bundle (TTFT with a prefix baked vs prefilled at
P = 1024 and 4096, decode tok/s, cold start, peak RSS, bytes per prefix token).

    python benchmarks/models_at_scale.py [--models qwen3-0.6b,llama-3.2-1b] [--work DIR]
                                         [--out docs/scale.json] [--threads 2]
                                         [--prefix-lengths 1024,4096] [--runs 2] [--peers]

The tokenizer is the default model's (SmolLM2, 49,152 tokens, byte-level BPE) grown to each
config's own vocabulary size with merges of its tokens and one more byte (ranked last, so
they change little of how text tokenizes): the embedding and output matrices have the real
shapes and every row is a token llama.cpp's converter and tokenizer accept. The context is
8192 positions, so P = 4096 fits with its input.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # (tests.helpers: a SentencePiece tokenizer)

CONFIGS = {
    "qwen3-0.6b": {  # Qwen/Qwen3-0.6B config.json
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
        "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000, "tie_word_embeddings": True,
        "vocab_size": 151936, "hidden_act": "silu", "attention_bias": False},
    "llama-3.2-1b": {  # meta-llama/Llama-3.2-1B-Instruct config.json
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
        "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True,
        "vocab_size": 128256, "hidden_act": "silu", "rope_scaling": {
            "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"}},
    # LiquidAI/LFM2-1.2B's shape (16 blocks: 10 short-convolution, 6 GQA at 2, 5, 8, 10, 12, 14;
    # block_ff_dim 12288 auto-adjusted to 8192): a hybrid
    "lfm2-1.2b": {
        "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "hidden_size": 2048,
        "intermediate_size": 12288, "block_ff_dim": 12288, "block_auto_adjust_ff_dim": True,
        "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 128000,
        "norm_eps": 1e-5, "rope_theta": 1000000.0, "conv_L_cache": 3, "conv_bias": False,
        "tie_word_embeddings": True, "vocab_size": 65536,
        "layer_types": ["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)]},
    # ibm-granite/granite-4.0-h-1b's shape as its GGUF metadata gives it (granitehybrid: 40 blocks,
    # hidden 1536, 12 query heads of 128, shared MLP 4096, Mamba2 inner 3072 in 48 heads of 64,
    # state 128, conv 4, one group, vocabulary 100,352, Granite's multipliers, no RoPE); ASSUMED
    # (that metadata lists them truncated): 4 attention layers, every 10th, with 4 KV heads
    "granite-4.0-h-1b": {
        "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
        "hidden_size": 1536, "intermediate_size": 4096, "shared_intermediate_size": 4096,
        "num_hidden_layers": 40, "num_attention_heads": 12, "num_key_value_heads": 4,
        "layer_types": ["attention" if i % 10 == 9 else "mamba" for i in range(40)],
        "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_d_conv": 4,
        "mamba_expand": 2, "mamba_n_groups": 1, "mamba_chunk_size": 256, "mamba_conv_bias": True,
        "mamba_proj_bias": False, "num_local_experts": 0, "num_experts_per_tok": 0,
        "position_embedding_type": "nope", "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
        "attention_multiplier": 0.0078125, "logits_scaling": 6.0, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True, "vocab_size": 100352,
        "hidden_act": "silu"},
    # Qwen/Qwen3.5-0.8B's text_config (transformers 5): 18 Gated DeltaNet layers (16 heads of 128,
    # conv 4) and 6 gated full-attention layers (8 heads, 2 KV heads of 256, a quarter rotated,
    # interleaved M-RoPE), vocabulary 248,320, tied embeddings; its MTP head left out (the GGUF
    # converts without one: --no-mtp)
    "qwen3.5-0.8b": {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 1024,
        "intermediate_size": 3584, "num_hidden_layers": 24, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
        "layer_types": ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(24)],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "vocab_size": 248320, "hidden_act": "silu",
        "attention_bias": False},
    # google/gemma-4-E2B's text model (Gemma4ForConditionalGeneration's text_config, as its text path
    # exports): 35 layers, a global one every 5th (7: heads of 512, proportional partial RoPE) beside
    # sliding ones (window 512, heads of 256), 8 query heads and 1 KV head, the last 20 layers
    # reading earlier layers' KV (their MLPs twice as wide), per-layer inputs of 256 (a
    # [262,144, 35 x 256] table: most of its 5.1B parameters), final logit soft-capping
    "gemma-4-e2b": {
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "hidden_size": 1536,
        "intermediate_size": 6144, "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 1,
        "head_dim": 256, "global_head_dim": 512, "sliding_window": 512,
        "layer_types": ["full_attention" if i % 5 == 4 else "sliding_attention" for i in range(35)],
        "num_kv_shared_layers": 20, "use_double_wide_mlp": True, "hidden_size_per_layer_input": 256,
        "vocab_size_per_layer_input": 262144, "final_logit_softcapping": 30.0,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                               "rope_theta": 1000000.0}},
        "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "vocab_size": 262144, "attention_bias": False},
}
# families whose converter reads a SentencePiece-style vocabulary (BPE with byte fallback): the
# tokenizer grown from a small trained SentencePiece one (tests/helpers/families.py) instead
SENTENCEPIECE = ("gemma-4-e2b",)
# the export formats where not both (Qwen3.5: measured on llama.cpp; its ONNX graph prefills the
# Gated DeltaNet token by token, a run of its own at this size)
# Gemma 4 E2B: its fp32 ONNX graph, 18 GB before quantization, does not fit this 24 GB machine's export)
FORMATS: dict[str, str] = {"qwen3.5-0.8b": "gguf", "gemma-4-e2b": "gguf"}
TASKS = '''
[task.support]
system = """You answer questions about storage plans, billing, devices and sync. Be brief."""
max_tokens = 16
'''


CONTEXT = 8192


def grow_tokenizer(src: Path, out: Path, vocab_size: int, byte_fallback: bool = False) -> None:
    """Copy the tokenizer files in `src` to `out`, its BPE vocabulary grown to `vocab_size`
    tokens: token + byte for the tokens in id order (then the new ones'), each with its merge,
    lowest rank last. byte_fallback: the source is SentencePiece-style (byte tokens <0xNN>) and
    stays so."""
    for f in src.iterdir():
        if f.is_file() and f.name != "tokenizer.model":  # (the grown tokenizer.json is the tokenizer)
            shutil.copy(f, out / f.name)
    data = json.loads((src / "tokenizer.json").read_text())
    vocab, merges = data["model"]["vocab"], data["model"]["merges"]
    special = {t["content"] for t in data.get("added_tokens", [])}
    alphabet = [t for t in vocab if len(t) == 1 and t not in special]
    base = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if t not in special]
    if byte_fallback:
        alphabet = [t for t in alphabet if not t.startswith("<0x")]
    for tok in base:  # (the list grows as it is read: a small vocabulary's new tokens grow too)
        for ch in alphabet:
            if len(vocab) >= vocab_size:
                break
            if tok + ch not in vocab:
                vocab[tok + ch] = len(vocab)
                merges.append([tok, ch] if isinstance(merges[0], list) else f"{tok} {ch}")
                if len(base) < vocab_size:
                    base.append(tok + ch)
    # byte-level BPE: every byte is a token, nothing to fall back to (with byte_fallback set,
    # llama.cpp's converter writes a SentencePiece-style vocabulary whose tokenizer aborts)
    data["model"]["byte_fallback"] = byte_fallback
    if len(vocab) != vocab_size or sorted(vocab.values()) != list(range(vocab_size)):
        raise SystemExit(f"cannot grow the tokenizer to {vocab_size} tokens")
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))


def build(name: str, out: Path, tokenizer_dir: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if (out / "config.json").is_file():
        return out
    cfg = dict(CONFIGS[name])
    cfg["max_position_embeddings"] = CONTEXT  # the cos/sin caches and GGUF context stay small
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "bfloat16", "bos_token_id": 1,
                                                 "eos_token_id": 2, "pad_token_id": 2}))
    config = AutoConfig.from_pretrained(str(out))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    model.save_pretrained(str(out))
    del model
    if name in SENTENCEPIECE:
        sp = out.parent / "sentencepiece"
        if not (sp / "tokenizer.json").is_file():
            from tests.helpers.families import train_sentencepiece

            train_sentencepiece(sp).save_pretrained(str(sp))  # its tokenizer.json, the fast one's
        grow_tokenizer(sp, out, cfg["vocab_size"], byte_fallback=True)
    else:
        grow_tokenizer(tokenizer_dir, out, cfg["vocab_size"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(CONFIGS))
    ap.add_argument("--work", default="/tmp/prefix-edge-scale")
    ap.add_argument("--out", default="docs/scale.json")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefix-lengths", default="1024,4096")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--peers", action="store_true", help="also the peer baselines (raw llama-cpp-python loop)")
    ap.add_argument("--format", default=None, help="the export formats for every model (default: FORMATS's, else onnx,gguf)")
    a = ap.parse_args()
    from prefix_edge.paths import default_bundle

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    (work / "tasks.toml").write_text(TASKS)
    report = {"date": time.strftime("%Y-%m-%d"), "threads": a.threads, "models": {}}
    for name in a.models.split(","):
        hf = build(name, work / name / "hf", default_bundle() / "tokenizer")
        bundle = work / name / "bundle"
        export_s = None  # None: the bundle was there from an earlier run
        if not (bundle / "manifest.json").is_file():
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "prefix_edge", "export", str(hf), "--tasks",
                            str(work / "tasks.toml"), "--out", str(bundle), "--quantize", "int4",
                            "--gguf-quant", "q4_1", "--format", a.format or FORMATS.get(name, "onnx,gguf"),
                            "--force"], check=True)
            export_s = round(time.perf_counter() - t, 1)
        out = work / name / "bench.json"
        subprocess.run([sys.executable, "-m", "prefix_edge", "bench", "--bundle", str(bundle),
                        "--prefix-lengths", a.prefix_lengths, "--runs", str(a.runs),
                        "--peers" if a.peers else "--no-peers", "--threads", str(a.threads),
                        "--out", str(out)], check=True)
        sizes = {p.name: p.stat().st_size for p in (bundle / "onnx").glob("*")} | \
            {p.name: p.stat().st_size for p in (bundle / "gguf").glob("*")}
        report["models"][name] = {"config": CONFIGS[name], "export_s": export_s, "files": sizes,
                                  "bench": json.loads(out.read_text())}
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
        print(name, "done")


if __name__ == "__main__":
    main()
