"""Tiny seeded random models of the 2025-26 on-device families: the hybrids LFM2 (short-convolution blocks + attention),
Granite 4.0-H (Mamba2 + attention, dense MLP) and Falcon-H1 (Mamba2 beside attention in every
layer), and the dense EXAONE 4.0, Hunyuan dense and OLMo 2, plus a Gemma 3 whose every layer
slides. Each in its published config's shape (hidden 64, 4 heads, 2 KV heads), with the byte-level
BPE tokenizer and ChatML template of tests/helpers/archs.py."""

from __future__ import annotations

from pathlib import Path

from .archs import CHATML, CORPUS, seeded_model, train_tokenizer

# the families' tests' two tasks: a chat one (a system prompt) and a text one (a prefix that
# mixes words, digits and punctuation), n tokens each
CHAT_AND_TEXT = """
[task.support]
system = "You are a helpful assistant. Answer briefly and politely, and mention the plan."
max_tokens = {n}

[task.raw]
kind = "text"
prefix = "{prefix}"
template = "{{input}} =>"
max_tokens = {n}
"""
FAMILY_PREFIX = "The quick brown fox jumps over the lazy dog. It's 12:45 and we've got 3,141 apples. "


def family_tasks(n: int, prefix: str = FAMILY_PREFIX) -> str:
    """CHAT_AND_TEXT with n max tokens and the text task's prefix (TOML-escaped)."""
    import json

    return CHAT_AND_TEXT.format(n=n, prefix=json.dumps(prefix)[1:-1])


# kind -> (transformers class, config extras, recurrent layers llama.cpp keeps a state for)
FAMILIES = {
    # LFM2: layer_types "conv" (short convolution, a 2-token window: conv_L_cache 3) / "full_attention"
    "lfm2": ("Lfm2ForCausalLM", dict(
        num_hidden_layers=4, layer_types=["conv", "conv", "full_attention", "conv"], conv_L_cache=3,
        block_auto_adjust_ff_dim=False, norm_eps=1e-5, tie_word_embeddings=True, rope_theta=1e6), 3),
    # Granite 4.0-H micro's shape: Mamba2 + attention, no RoPE, a dense MLP (its dense variants set
    # num_local_experts = num_experts_per_tok = 0), Granite's multipliers
    "granitehybrid": ("GraniteMoeHybridForCausalLM", dict(
        num_hidden_layers=4, layer_types=["mamba", "mamba", "attention", "mamba"],
        num_local_experts=0, num_experts_per_tok=0, shared_intermediate_size=128,
        mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=16, position_embedding_type="nope",
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625,
        logits_scaling=8.0, tie_word_embeddings=True, rms_norm_eps=1e-5), 3),
    # Falcon-H1: a Mamba2 block beside attention in every layer, an explicit head_dim
    "falconh1": ("FalconH1ForCausalLM", dict(
        head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16,
        mamba_d_conv=4, mamba_expand=1, mamba_chunk_size=16, mamba_rms_norm=True,
        mamba_norm_before_gate=False, tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=1e5), 2),
    # EXAONE 4.0 (q/k norms, post-norms) with the config's sliding_window set: llama.cpp reads
    # the window (n_swa 4096) and keeps no sliding-window cache (only its 64-layer 32B does);
    # the window is past the context, so transformers' sliding layers attend to everything too
    "exaone4": ("Exaone4ForCausalLM", dict(
        head_dim=16, sliding_window=4096, sliding_window_pattern=4, tie_word_embeddings=True,
        rms_norm_eps=1e-5, rope_theta=1e6), 0),
    "hunyuan": ("HunYuanDenseV1ForCausalLM", dict(
        head_dim=16, tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=1e4, eod_token_id=None), 0),
    "olmo2": ("Olmo2ForCausalLM", dict(tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=5e5), 0),
    # a small Gemma 3 whose every layer slides (no global layer): llama.cpp's full-attention
    # cache then holds the cells and no layer
    "gemma3-sliding": ("Gemma3ForCausalLM", dict(
        head_dim=16, rope_theta=1e6, rope_local_base_freq=10000.0, sliding_window=8,
        layer_types=["sliding_attention"] * 2, query_pre_attn_scalar=16, tie_word_embeddings=True,
        rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh"), 0),
    # the end-of-2026 families (transformers 5): OLMo 3 (OLMo 2's post-norms, sliding 3:1)
    "olmo3": ("Olmo3ForCausalLM", dict(
        num_hidden_layers=4, sliding_window=8, layer_types=["sliding_attention"] * 3 + ["full_attention"],
        tie_word_embeddings=False, rms_norm_eps=1e-6), 0),
    # Ministral 3: Mistral's layers, YaRN, and Llama 4's query scaling with the position
    "ministral3": ("Ministral3ForCausalLM", dict(
        head_dim=16, tie_word_embeddings=True, rms_norm_eps=1e-5, rope_parameters={
            "rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 16,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
            "llama_4_scaling_beta": 0.1}), 0),
    # Nemotron-H (dense): Mamba2, MLP (squared ReLU) and attention blocks, one per layer
    "nemotronh": ("NemotronHForCausalLM", dict(
        num_hidden_layers=4, layers_block_type=["mamba", "mlp", "attention", "mlp"], head_dim=16,
        ssm_state_size=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=1, conv_kernel=4, expand=2,
        chunk_size=16, tie_word_embeddings=False, layer_norm_epsilon=1e-5), 1),
    # Qwen3.5 (its text model): 3 Gated DeltaNet layers per gated full-attention layer, partial
    # interleaved M-RoPE (a quarter of the head), as the 0.8B's config at a small head
    "qwen3_5": ("Qwen3_5ForCausalLM", dict(
        num_hidden_layers=4, head_dim=64, layer_types=["linear_attention"] * 3 + ["full_attention"],
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_parameters={
            "rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2], "mrope_interleaved": True}), 3),
    # Gemma 4 (E2B's text model): sliding layers with heads of 16 and global ones of their own
    # size (512, transformers' default for them), per-layer inputs, the last two layers reading
    # earlier layers' KV; its SentencePiece vocabulary (llama.cpp's gemma4 tokenizer)
    "gemma4": ("Gemma4ForCausalLM", dict(
        num_hidden_layers=6, head_dim=16, sliding_window=8,
        # (llama.cpp's shared layers read the last two unshared ones, a sliding then a global one, as E2B's)
        layer_types=["sliding_attention"] * 3 + ["full_attention", "sliding_attention", "full_attention"],
        num_kv_shared_layers=2,
        hidden_size_per_layer_input=16, tie_word_embeddings=True, rms_norm_eps=1e-6), 0),
}
SENTENCEPIECE = ("gemma4",)  # families whose converter reads a SentencePiece vocabulary
# Falcon-H1's μP multipliers in the range its published configs use (the helper's config leaves
# them at 1.0): the own ONNX graph folds each into the weights, so its tests set them all
FALCON_MUP = dict(embedding_multiplier=5.66, lm_head_multiplier=0.039, ssm_multipliers=[0.35, 0.25, 0.5, 0.7, 0.35],
                  attention_in_multiplier=1.3, key_multiplier=0.39, attention_out_multiplier=0.94,
                  ssm_out_multiplier=0.23, ssm_in_multiplier=1.25, mlp_multipliers=[0.88, 0.39])
# dense families only the own ONNX graph's tests build (tests/test_families_onnx.py): ERNIE 4.5
# (interleaved rotary, use_bias on every projection)
MORE = {
    "ernie4_5": ("Ernie4_5ForCausalLM", dict(
        head_dim=16, use_bias=True, tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=5e5), 0),
    # the OLMo hybrid (llama.cpp has none): Gated DeltaNet 3:1 with OLMo 3's attention, beta in [0, 2]
    "olmo_hybrid": ("OlmoHybridForCausalLM", dict(
        num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"], linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_allow_neg_eigval=True,
        tie_word_embeddings=False, rms_norm_eps=1e-6), 3),
    # LFM3 (llama.cpp has none): LFM2's conv layers beside full and sliding attention, a sigmoid gate
    # per head, sandwich norms, proportional partial RoPE on the full layers (its config's defaults)
    "lfm3": ("Lfm3ForCausalLM", dict(
        num_hidden_layers=4, head_dim=16, sliding_window=8, conv_L_cache=3,
        layer_types=["conv", "full_attention", "conv", "sliding_attention"], norm_eps=1e-5, rms_norm_eps=1e-5,
        tie_word_embeddings=True), 2),
}


def train_sentencepiece(out: Path):
    """A SentencePiece BPE tokenizer as ERNIE 4.5, Gemma 3n and Llama 2 ship theirs: a
    `tokenizer.model` and a slow tokenizer's config, no tokenizer.json (byte fallback, identity
    normalisation, <unk> <s> </s> at 0-2, the ChatML markers as user-defined pieces). Saved in
    `out`; returns the transformers tokenizer a user's AutoTokenizer makes of it (the fast one,
    converted from the .model, as export reads it)."""
    import io

    import sentencepiece as spm
    from transformers import AutoTokenizer, LlamaTokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 20), model_writer=model, vocab_size=400, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, split_digits=True, minloglevel=2,
        user_defined_symbols=["<|im_start|>", "<|im_end|>"], unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        normalization_rule_name="identity", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.model").write_bytes(model.getvalue())
    slow = LlamaTokenizer(vocab_file=str(out / "tokenizer.model"), legacy=False, add_bos_token=False)
    slow.chat_template = CHATML
    slow.save_pretrained(out)
    (out / "tokenizer.json").unlink(missing_ok=True)  # transformers 5 writes one: such checkpoints ship without
    return AutoTokenizer.from_pretrained(str(out))


def build_family(kind: str, out: Path, sentencepiece: bool = False, **overrides):
    """FAMILIES[kind] (config extras updated by `overrides`), seeded, saved in `out` with its
    tokenizer (sentencepiece: a tokenizer.model, train_sentencepiece); returns (model,
    tokenizer)."""
    import transformers

    cls_name, extras, _ = {**FAMILIES, **MORE}[kind]
    sentencepiece = sentencepiece or kind in SENTENCEPIECE
    tokenizer = train_sentencepiece(out) if sentencepiece else train_tokenizer("gpt2")
    if kind == "gemma4":  # (its per-layer embedding table: the vocabulary's size)
        extras = {**extras, "vocab_size_per_layer_input": len(tokenizer)}
    # llama.cpp's Mamba2 converter pads the vocabulary to a multiple of 8 (as real checkpoints' is)
    vocab = -(-len(tokenizer) // 8) * 8 if kind in ("granitehybrid", "nemotronh") else len(tokenizer)
    scalars = overrides.pop("random_layer_scalars", False)
    model = seeded_model(getattr(transformers, cls_name), tokenizer, vocab, {**extras, **overrides})
    if scalars:  # Gemma 4's per-layer output scalars (a buffer, 1.0 unless the checkpoint says)
        import torch

        with torch.no_grad():
            for i, layer in enumerate(model.model.layers):
                layer.layer_scalar.fill_(0.5 + 0.25 * (i % 3))
    model.save_pretrained(out)
    if not sentencepiece or kind == "gemma4":  # (a SentencePiece one is saved as it ships; Gemma 4's
        tokenizer.save_pretrained(out)          # checkpoints ship its tokenizer.json beside it)
    return model, tokenizer


# Gemma 3n as real checkpoints ship it: Gemma3nForConditionalGeneration (vision and audio towers
# beside the text model, its config under text_config), the text model in E2B's shape at width
# 64: four sliding layers then a global one, the last layers KV-shared, AltUp's 4 streams,
# LAuReL, per-layer embeddings, activation sparsity on the first 10 layers, logit soft-capping.
# llama.cpp fixes some of it in code rather than reading the GGUF (llama-hparams.h, llama-model.cpp):
# the per-layer input 256, LAuReL's rank 64, sparsity on layers 0-9, and the first shared layer,
# 20 (E2B's 30 - 10 and E4B's 35 - 15), each shared layer reading layer 18 (sliding) or 19
# (global); so these are E2B's, and 25 layers share the last 5. The vocabulary: the text tokens,
# then the vision and audio tokens' slots; unlike E2B's, the per-layer embeddings have rows for
# those slots too (E2B's stop at the text tokens: its text-only class cannot read a slot's id,
# which a random model's greedy reply can reach). The MLP is 1024 wide: llama.cpp's sparsity
# cut takes the gate's std over n - 1, transformers' over n (0.4% apart at 128 wide, 0.06% here,
# 0.006% at E2B's 8192).
GEMMA3N_TEXT = dict(
    hidden_size=64, hidden_size_per_layer_input=256, intermediate_size=1024, num_hidden_layers=25,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
    layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 5, num_kv_shared_layers=5,
    laurel_rank=64, altup_num_inputs=4, activation_sparsity_pattern=[0.95] * 10 + [0.0] * 15,
    max_position_embeddings=256, rope_theta=1e6, rope_local_base_freq=10000.0, final_logit_softcapping=30.0,
    rms_norm_eps=1e-6, initializer_range=0.02)
GEMMA3N_EXTRA_VOCAB = 16  # each of the vision and audio tokens' slots


def build_gemma3n(out: Path, sentencepiece: bool = False, **text_overrides):
    """A seeded tiny Gemma 3n checkpoint saved in `out` as Gemma3nForConditionalGeneration
    ships (its config.json, the text model's weights under model.language_model., the towers'
    beside them) with its tokenizer; returns (the text model, tokenizer): transformers'
    Gemma3nForCausalLM, the class whose forward the multimodal one runs on text. The towers are
    made without their class (which needs timm): a few seeded tensors under their names, which
    export must not read. Every norm weight and AltUp's output scale are drawn (HF inits them to
    1 or 0: both paths would then be untested)."""
    import torch
    from safetensors.torch import save_file
    from transformers import Gemma3nAudioConfig, Gemma3nConfig, Gemma3nForCausalLM, Gemma3nTextConfig, Gemma3nVisionConfig

    tokenizer = train_sentencepiece(out) if sentencepiece else train_tokenizer("gpt2")
    n_text = len(tokenizer)
    vocab = n_text + 2 * GEMMA3N_EXTRA_VOCAB
    text = Gemma3nTextConfig(
        vocab_size=vocab, vocab_size_per_layer_input=vocab,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        # the padding row is zeros (nn.Embedding's padding_idx), which llama.cpp's AltUp divides
        # by (its magnitude has no epsilon: NaN), so it is a slot no prompt uses, as E2B's <pad>
        pad_token_id=vocab - 1, **{**GEMMA3N_TEXT, **text_overrides})
    torch.manual_seed(0)
    model = Gemma3nForCausalLM(text)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "correct_output_scale" in name:
                p.uniform_(0.5, 1.5)
    model = model.eval()
    vision = Gemma3nVisionConfig(hidden_size=32, vocab_size=GEMMA3N_EXTRA_VOCAB, vocab_offset=n_text)
    audio = Gemma3nAudioConfig(hidden_size=32, vocab_size=GEMMA3N_EXTRA_VOCAB, vocab_offset=n_text + GEMMA3N_EXTRA_VOCAB)
    config = Gemma3nConfig(text_config=text, vision_config=vision, audio_config=audio,
                           boi_token_id=n_text, eoi_token_id=n_text + 1, image_token_id=n_text + 2,
                           boa_token_id=n_text + 16, eoa_token_id=n_text + 17, audio_token_id=n_text + 18)
    config.architectures = ["Gemma3nForConditionalGeneration"]
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    weights = {"model.language_model." + k[len("model."):]: v.contiguous() for k, v in model.state_dict().items()
               if k.startswith("model.")}
    g = torch.Generator().manual_seed(1)
    for name, shape in (("model.vision_tower.timm_model.conv_stem.conv.weight", (8, 3, 3, 3)),
                        ("model.audio_tower.subsample_conv_projection.input_proj_linear.weight", (32, 16)),
                        ("model.embed_vision.embedding.weight", (GEMMA3N_EXTRA_VOCAB, 32)),
                        ("model.embed_audio.embedding_projection.weight", (64, 32))):
        weights[name] = torch.randn(shape, generator=g)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    if not sentencepiece:
        tokenizer.save_pretrained(out)
    # the attention implementation set, as from_pretrained sets it (after the multimodal config,
    # which shares `text`, reset it): transformers 5's Gemma 3n with none computes another model
    # (0.9 logits off sdpa and eager, which agree to 2e-5)
    for m in model.modules():
        if getattr(m, "config", None) is not None:
            m.config._attn_implementation = "sdpa"
    return model, tokenizer


def build_qwen3_5_mtp(out: Path, trunk_scale: float = 0.0, fc_hidden: float = 0.0):
    """A seeded tiny Qwen3.5 (FAMILIES["qwen3_5"]) with an MTP head as Qwen3.5's checkpoints ship
    one (`mtp.*`, config mtp_num_hidden_layers 1), saved in `out`; returns (model, tokenizer).

    transformers' Qwen3_5ForCausalLM makes no head, so it is written here: a copy of the full-
    attention layer 3, fc = [c I, fc_hidden R] (the token's embedding, normalised, times c, plus
    fc_hidden times a random map of the model's hidden state), the model's final norm. The
    embedding rows are scaled to one RMS (c), so fc gives the token's embedding back: with
    the Gated DeltaNet layers 0-2's outputs times `trunk_scale` = 0 the model is layer 3 over
    the embeddings and the head computes what the model computes one position on (its drafts
    are kept); a trunk_scale > 0 or fc_hidden > 0 makes them differ."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    model, tokenizer = build_family("qwen3_5", out)
    sd = load_file(str(out / "model.safetensors"))
    h, c = model.config.hidden_size, 0.1
    emb = sd["model.embed_tokens.weight"]
    sd["model.embed_tokens.weight"] = c * emb / emb.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-8)
    for k, v in list(sd.items()):
        if k.startswith("model.layers.3."):
            sd["mtp.layers.0." + k[len("model.layers.3."):]] = v.clone()
        if k.startswith(("model.layers.0.", "model.layers.1.", "model.layers.2.")) and \
                k.endswith(("out_proj.weight", "down_proj.weight")):
            sd[k] = v * trunk_scale
    fc = torch.zeros(h, 2 * h)
    fc[:, :h] = c * torch.eye(h)
    fc[:, h:] = fc_hidden * torch.randn(h, h, generator=torch.Generator().manual_seed(3)) / h ** 0.5
    sd["mtp.fc.weight"] = fc
    sd["mtp.pre_fc_norm_embedding.weight"] = torch.zeros(h)  # (zero-centred: a scale of 1)
    sd["mtp.pre_fc_norm_hidden.weight"] = torch.zeros(h)
    sd["mtp.norm.weight"] = sd["model.norm.weight"].clone()
    save_file({k: v.contiguous() for k, v in sd.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "mtp_num_hidden_layers": 1}, indent=2))
    return model, tokenizer
