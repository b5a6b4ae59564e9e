"""HF llama-family weights → prefix-edge's own ONNX decoder graph, built with onnx.helper.

One fused contrib op per job, as onnxruntime-genai's builder writes them, instead of optimum's
thousands of shape/concat/gather ops:

    Gather (embedding) → per layer: [Skip]SimplifiedLayerNormalization → one MatMul for q, k
    and v (+bias) → GroupQueryAttention (packed qkv, rotary inside, causal, grouped heads)
    → MatMul o → SkipSimplifiedLayerNormalization → one MatMul for gate and up → Split
    → SiLU(gate)·up → MatMul down
    → final norm → the last LOGITS_TAIL positions → MatMul lm_head

Inputs: input_ids [batch, seq] int64, past_key_values.{i}.key|value [batch, n_kv, L, head_dim]
float, seqlens_k [batch] int32 (total length - 1), total_sequence_length [] int32. Outputs:
logits [batch, rows, vocab] (the last min(seq, LOGITS_TAIL) positions: a decode step's one,
and a verified draft's; bundles before it give the last position only), present.{i}.key|value, and
hidden_states [batch, seq, hidden] (the final norm's output at every position: what the lm_head
reads, and what `Runtime.embed` pools; bundles exported before it lack it, and embed refuses them
with onnx in one line naming the re-export). A run that binds no hidden_states gets none copied.
GroupQueryAttention writes the new KV into the past buffer itself when past and present are the
same buffer (the runtime binds them so: runtime/engines/onnx/engine.py), so a step copies no KV, and restoring a
baked prefix is a copy into the first P positions. The KV names and layout are optimum's, so a
prefix file is the same for both graphs.

Supported, each checked against transformers (tests/test_architectures.py):
- LlamaForCausalLM (SmolLM, Llama 2, Llama 3.x with its RoPE scaling), MistralForCausalLM
  (sliding window as GQA's local window), Qwen2ForCausalLM (q/k/v biases);
- Qwen3ForCausalLM: per-head q/k RMSNorm before the rotary (q, k and v go to GQA unpacked);
- Phi3ForCausalLM (Phi-3, Phi-4-mini): fused qkv and gate_up weights, partial rotary;
- SmolLM3ForCausalLM: layers without RoPE (GQA's do_rotary off there);
- GraniteForCausalLM: the embedding multiplier (a Mul), the residual multiplier and
  1/logits_scaling folded into o_proj, down_proj and lm_head, attention_multiplier as GQA's scale;
- Gemma3ForCausalLM (text-only Gemma 3, e.g. 1B): embeddings times sqrt(hidden_size) (a Mul: the
  tied lm_head reads the unscaled table), every RMSNorm's (1 + w) folded into its weight, the
  post-attention and post-feedforward norms on each sublayer's output before its residual add,
  per-head q/k norms, query_pre_attn_scalar ** -0.5 as the scale, GELU-tanh (FastGelu), and the
  config's layer_types: sliding layers get GQA's local window (local_window_size =
  sliding_window: both attend to the last sliding_window keys, the query's own included) and
  their own RoPE (rope_local_base_freq, no scaling: a second cos/sin cache), global layers
  rope_theta with the config's rope_scaling. Logit soft-capping and bidirectional attention are
  refused.
- Olmo2ForCausalLM and Exaone4ForCausalLM: no pre-norms, a post-norm on each sublayer's output
  before its residual add (explicit Adds); OLMo 2's q/k norms span the whole projection,
  EXAONE 4.0's are per head, and its config's layer_types give sliding layers (RoPE, GQA's local
  window) and global layers (no RoPE when sliding_window is set);
- HunYuanDenseV1ForCausalLM: per-head q/k norms after the rotary, so the rotary is a
  RotaryEmbedding op before them (positions from seqlens_k) and GQA's is off; its dynamic RoPE
  with an NTK alpha is a fixed base within max_position_embeddings, built as transformers does;
- Ernie4_5ForCausalLM: interleaved rotary (pairs 2i, 2i+1), use_bias on every projection;
- Lfm2ForCausalLM (a hybrid): short-convolution layers beside attention layers with per-head
  q/k norms; a conv layer's state is a graph input and output (`past_conv.{i}` /
  `present_conv.{i}`, export/onnx_hybrid.py), and only attention layers have past_key_values;
- GraniteMoeHybridForCausalLM (Granite 4.0-H, dense): Mamba2 layers (conv window and SSM state
  in and out: `past_conv.{i}`, `past_ssm.{i}`) beside attention layers without RoPE (nope),
  Granite's multipliers folded as for Granite 3.x, the shared MLP as the gated MLP;
- FalconH1ForCausalLM: a Mamba2 mixer beside attention in every layer (outputs summed), its μP
  multipliers folded into the weights;
- the transformers-5 families: Olmo3ForCausalLM (OLMo 2's post-norms, sliding layers with their
  own RoPE), Ministral3ForCausalLM (YaRN, the query scaled by position), NemotronHForCausalLM
  (one mixer a layer: Mamba2, squared-ReLU MLP or position-free attention), Lfm3ForCausalLM
  (LFM2's conv layers, full and sliding attention gated per head, sandwich norms),
  Qwen3_5ForCausalLM and OlmoHybridForCausalLM (Gated DeltaNet layers: export/onnx_deltanet.py),
  Gemma3nForCausalLM and Gemma4ForCausalLM (decoders of their own: export/onnx_gemma3n.py,
  export/onnx_gemma4.py; Gemma 4's KV inputs differ in shape between layers).
RoPE: the cos/sin caches are transformers' own (`ROPE_INIT_FUNCTIONS`: default, linear, llama3,
yarn with its attention factor); scalings that depend on the sequence length (dynamic,
longrope) and anything else a model needs that the graph cannot do are one-line refusals naming
the feature and `--onnx-builder optimum`.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from .onnx_deltanet import OLMO_HYBRID, QWEN3_5, gated_deltanet, olmo_hybrid_layers, qwen3_5_layers, state_shapes
from .onnx_gemma3n import GEMMA3N, gemma3n_config, gemma3n_decoder, kv_sources
from .onnx_gemma4 import GEMMA4, gemma4_config, gemma4_decoder, layer_dims
from .onnx_hybrid import (FALCON_H1, GRANITE_H, LFM2, LFM3, NEMOTRON_H, SSM_IN, SSM_OUT, STATE_IN, STATE_OUT,
                          falcon_h1_weights, granite_h_layers, lfm2_layers, lfm2_weights, mamba2,
                          nemotron_h_layers, short_conv)
from .onnx_source import (HUNYUAN, POST_NORMS, gemma3_config as _gemma3, read_config as _config,
                          read_weights as _weights, refuse as _refuse, rope_cache)
from .source import rope_parameters

OPSET = 18  # Split's num_outputs
HIDDEN_STATES = "hidden_states"  # the output embeddings read (a bundle without it: no onnx embeddings)
LOGITS_TAIL = 9  # logits of the last this many positions (a run of fewer: all of its own)
MODEL_LAYERS = "prefix_edge.model_layers"  # metadata: the model's layers (KV-shared and recurrent ones too)


def checked_config(hf_dir: Path) -> tuple[dict, object, object, object]:
    """The checkpoint's config, and Gemma 3's, 3n's or 4's text config as transformers reads it,
    each refused (PrefixEdgeError, one line) where the graph cannot build it: before any weight
    is read."""
    cfg = _config(hf_dir)
    arch = cfg["architectures"][0]
    gc = _gemma3(hf_dir, cfg) if arch == "Gemma3ForCausalLM" else None
    g3n = gemma3n_config(hf_dir, _refuse) if arch == GEMMA3N else None
    g4 = gemma4_config(hf_dir, _refuse) if arch == GEMMA4 else None
    return cfg, gc, g3n, g4


def build_onnx(hf_dir: Path, out_dir: Path) -> Path:
    """Write model.onnx (fp32, weights inside or beside it over 2 GB) into `out_dir`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    hf_dir = Path(hf_dir)
    cfg, gc, g3n, g4 = checked_config(hf_dir)  # refused before any weight
    arch = cfg["architectures"][0]
    w = _weights(hf_dir)
    hidden = int(cfg["hidden_size"])
    n_layers = int(cfg.get("num_hidden_layers") or len(cfg.get("layers_block_type") or ()))
    n_heads = int(cfg["num_attention_heads"])
    n_kv = int(cfg.get("num_key_value_heads") or n_heads)
    head_dim = int(cfg.get("head_dim") or hidden // n_heads)
    eps = float(cfg.get("rms_norm_eps", cfg.get("layer_norm_epsilon", 1e-6)))
    n_pos = int(cfg.get("max_position_embeddings", 2048))
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    window = int(window) if window and int(window) < n_pos else -1
    gemma = arch == "Gemma3ForCausalLM"
    # q/k norms: per head before the rotary, over the whole projection (OLMo 2), per head after
    # the rotary (Hunyuan: the rotary leaves GQA), or none
    qk_norm = {"Qwen3ForCausalLM": "head", QWEN3_5: "head", "Gemma3ForCausalLM": "head", "Exaone4ForCausalLM": "head",
               LFM2: "head", LFM3: "head", "Olmo2ForCausalLM": "whole", "Olmo3ForCausalLM": "whole", OLMO_HYBRID: "whole",
               HUNYUAN: "after_rope"}.get(arch)
    qk_keys = {HUNYUAN: ("query_layernorm", "key_layernorm"), LFM2: ("q_layernorm", "k_layernorm")}.get(
        arch, ("q_norm", "k_norm"))
    conv = [False] * n_layers  # LFM2's short-convolution layers (a state, no KV)
    mamba, hc = [False] * n_layers, None  # Granite 4.0-H's Mamba2 layers (two states, no KV)
    states: dict[int, list[tuple[str, str, list[int]]]] = {}  # layer -> its states (in, out, shape)
    if arch in (LFM2, LFM3):
        conv, eps = lfm2_layers(hf_dir), float(cfg.get("norm_eps", 1e-5))
        if arch == LFM3 and float(cfg.get("rms_norm_eps", eps)) != eps:
            raise _refuse(f"q/k norms' epsilon ({cfg['rms_norm_eps']}) other than the layers' ({eps}) on {LFM3}")
        lfm2_weights(w, conv, sandwich=arch == LFM3 and bool(cfg.get("use_sandwich_norm", True)))
        width = int(cfg.get("conv_L_cache", 3)) - 1
        states = {i: [(f"{STATE_IN}{i}", f"{STATE_OUT}{i}", [hidden, width])] for i in range(n_layers) if conv[i]}
    delta, qc = [False] * n_layers, None  # Qwen3.5's Gated DeltaNet layers (two states, no KV)
    if arch == QWEN3_5:
        delta, qc = qwen3_5_layers(hf_dir, w)
    if arch == OLMO_HYBRID:
        delta, olmo_rope, qc = olmo_hybrid_layers(hf_dir, w)
    if qc is not None:
        states = {i: state_shapes(qc, i) for i in range(n_layers) if delta[i]}
    blocks = None  # Nemotron-H: one mixer a layer ("mamba", "attention" or "mlp"), no second sublayer
    if arch == NEMOTRON_H:
        blocks, hc = nemotron_h_layers(hf_dir, w)
        mamba = [b == "mamba" for b in blocks]
    if arch in (GRANITE_H, FALCON_H1, NEMOTRON_H):
        if arch != NEMOTRON_H:
            mamba, hc = granite_h_layers(hf_dir, w) if arch == GRANITE_H else ([True] * n_layers, falcon_h1_weights(hf_dir, w))
        nh, ds = int(hc.mamba_n_heads), int(hc.mamba_d_state)
        inner = int(hc.mamba_expand * hidden) if getattr(hc, "mamba_d_ssm", None) is None else int(hc.mamba_d_ssm)
        conv_dim = inner + 2 * int(hc.mamba_n_groups) * ds
        states = {i: [(f"{STATE_IN}{i}", f"{STATE_OUT}{i}", [conv_dim, int(hc.mamba_d_conv) - 1]),
                      (f"{SSM_IN}{i}", f"{SSM_OUT}{i}", [nh, int(hc.mamba_d_head), ds])]
                  for i in range(n_layers) if mamba[i]}
    post_norms = [arch in POST_NORMS] * n_layers  # no pre-norms: a norm after each sublayer
    granite = arch in ("GraniteForCausalLM", GRANITE_H)
    rope_on = [True] * n_layers
    if arch == "SmolLM3ForCausalLM":
        rope_on = [bool(v) for v in cfg.get("no_rope_layers") or [1] * n_layers]
    if arch == GRANITE_H:  # attention without RoPE unless the config says "rope"
        rope_on = [hc.position_embedding_type != "nope"] * n_layers
    if arch == NEMOTRON_H:  # its attention has no positions at all
        rope_on = [False] * n_layers
    # Gemma 3's and LFM3's norms on each sublayer's input and output (pre_feedforward / post_* names)
    sandwich = gemma or (arch == LFM3 and bool(cfg.get("use_sandwich_norm", True)))
    if arch == OLMO_HYBRID:  # (the released checkpoints: no rotary); its attention layers are OLMo 3's
        rope_on = [olmo_rope] * n_layers
        post_norms = [not d for d in delta]
    attn_scale = float(cfg["attention_multiplier"]) if granite else float(head_dim) ** -0.5
    windows = [window] * n_layers  # GQA's local_window_size per layer (-1: none)
    local = [False] * n_layers  # the layer uses the local RoPE cache (Gemma 3's sliding layers)
    if gemma:
        head_dim, attn_scale = int(gc.head_dim), float(gc.query_pre_attn_scalar) ** -0.5
        local = [t == "sliding_attention" for t in gc.layer_types]
        # transformers: query i sees key j when i - sliding_window < j <= i, the last
        # sliding_window keys; so does GQA with local_window_size = sliding_window (checked
        # against transformers past 2x the window: tests/test_gemma3_onnx.py)
        windows = [int(gc.sliding_window) if s else -1 for s in local]
        for k in w:  # Gemma3RMSNorm scales by (1 + w)
            if k.endswith("norm.weight"):
                w[k] = w[k] + np.float32(1.0)
    kv_dims = [(n_kv, head_dim)] * n_layers  # each layer's KV heads and head size (Gemma 4's differ)
    rope_head = head_dim  # the head size the (global) RoPE cache rotates
    shared_kv = g3n or g4  # Gemma 3n / 4: layer types, KV-shared layers (their norms scale by w: nothing to fold)
    if shared_kv is not None:
        head_dim = int(cfg.get("head_dim") or head_dim) if g4 is not None else int(g3n.head_dim)
        local = [t == "sliding_attention" for t in shared_kv.layer_types]
        windows = [int(shared_kv.sliding_window) if s else -1 for s in local]
        kv_dims = layer_dims(g4) if g4 is not None else [(n_kv, head_dim)] * n_layers
        rope_head = max(d for (_, d), s in zip(kv_dims, local) if not s) if not all(local) else head_dim
    if arch == "Exaone4ForCausalLM":  # sliding layers: RoPE and the window; global: NoPE if windowed
        from transformers import AutoConfig

        ec = AutoConfig.from_pretrained(str(hf_dir))
        sliding = [t == "sliding_attention" for t in ec.layer_types]
        windows = [window if s else -1 for s in sliding]
        rope_on = [s or ec.sliding_window is None for s in sliding]
    if arch in ("Olmo3ForCausalLM", LFM3):  # sliding layers: the window and their own RoPE parameters
        from transformers import AutoConfig

        local = [t == "sliding_attention" for t in AutoConfig.from_pretrained(str(hf_dir)).layer_types]
        windows = [window if s else -1 for s in local]
    # Ministral 3 (Llama 4's): the query times 1 + beta * log(1 + floor(position / original max))
    q_scale = rope_parameters(cfg).get("llama_4_scaling_beta") if arch == "Ministral3ForCausalLM" else None
    res_mult = float(cfg.get("residual_multiplier", 1.0)) if granite else 1.0
    if arch == "Phi3ForCausalLM":  # fused projections, split as HF splits them
        q_rows, kv_rows = n_heads * head_dim, n_kv * head_dim
        for i in range(n_layers):
            p = f"model.layers.{i}"
            qkv = w.pop(f"{p}.self_attn.qkv_proj.weight")
            w[f"{p}.self_attn.q_proj.weight"] = qkv[:q_rows]
            w[f"{p}.self_attn.k_proj.weight"] = qkv[q_rows:q_rows + kv_rows]
            w[f"{p}.self_attn.v_proj.weight"] = qkv[q_rows + kv_rows:]
            gate, up = np.split(w.pop(f"{p}.mlp.gate_up_proj.weight"), 2, axis=0)
            w[f"{p}.mlp.gate_proj.weight"], w[f"{p}.mlp.up_proj.weight"] = gate, up
    if res_mult != 1.0:  # x + r * (h @ W^T) = x + h @ (r W)^T
        for i in range(n_layers):
            for k in ("self_attn.o_proj", "mamba.out_proj", "mlp.down_proj"):
                if f"model.layers.{i}.{k}.weight" in w:
                    w[f"model.layers.{i}.{k}.weight"] = w[f"model.layers.{i}.{k}.weight"] * np.float32(res_mult)

    inits, nodes = [], []

    def init(name: str, a: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(a), name))
        return name

    def node(op: str, ins: list[str], outs: list[str], name: str, domain: str = "", **attrs):
        nodes.append(helper.make_node(op, ins, outs, name=name, domain=domain or None, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def linear(x: str, keys: list[str], name: str) -> str:
        """x @ W^T (+ b) for the weights `keys` stacked along the output dim: one MatMul."""
        weight = np.concatenate([w.pop(k + ".weight") for k in keys], axis=0)  # used once: freed
        y = node("MatMul", [x, init(name + ".weight_T", weight.T)], [name + "/out"], name + "/MatMul")
        if keys[0] + ".bias" in w:
            bias = np.concatenate([w.pop(k + ".bias") for k in keys])
            y = node("Add", [y, init(name + ".bias", bias)], [name + "/bias_out"], name + "/Add")
        return y

    def norm(x: str, weight: str, name: str) -> str:
        """RMSNorm over the hidden dim (no residual to fuse)."""
        return node("SimplifiedLayerNormalization", [x, init(weight, w[weight])], [name + "/out"], name,
                    axis=-1, epsilon=eps)

    def head_norm(x: str, weight: str, heads: int, name: str, dim: int | None = None) -> str:
        """RMSNorm over each head's values (Qwen3's and Gemma 3's q_norm / k_norm); `dim` the
        layer's head size where it is not head_dim (Gemma 4's global layers)."""
        dim = dim or head_dim
        shaped = node("Reshape", [x, init(name + "/shape", np.array([0, 0, heads, dim], np.int64))],
                      [name + "/heads"], name + "/Reshape")
        normed = node("SimplifiedLayerNormalization", [shaped, init(weight, w[weight])], [name + "/normed"],
                      name + "/Norm", axis=-1, epsilon=eps)
        return node("Reshape", [normed, init(name + "/flat", np.array([0, 0, heads * dim], np.int64))],
                    [name + "/out"], name + "/Flatten")

    def attention(h: str, p: str, i: int) -> str:
        """Layer i's attention on the normed `h`, before its residual add."""
        # q, k and v in one MatMul: GroupQueryAttention takes the packed [q; k; v] rows
        qkv = linear(h, [f"{p}.self_attn.{x}_proj" for x in "qkv"], f"/{p}/attn/qkv_proj")
        qkv_in = [qkv, "", ""]
        if q_scale is not None:  # the query scaled by position: unpacked
            q, k, v = node("Split", [qkv, init(f"/{p}/attn/sizes", np.array(
                [n_heads * head_dim, n_kv * head_dim, n_kv * head_dim], np.int64))],
                [f"/{p}/attn/q", f"/{p}/attn/k", f"/{p}/attn/v"], f"/{p}/attn/Split", axis=-1)
            qkv_in = [node("Mul", [q, query_scale()], [f"/{p}/attn/q_scaled"], f"/{p}/attn/q_scale"), k, v]
        if qk_norm:  # q/k norms between the projection and the attention: unpacked
            q, k, v = node("Split", [qkv, init(f"/{p}/attn/sizes", np.array(
                [n_heads * head_dim, n_kv * head_dim, n_kv * head_dim], np.int64))],
                [f"/{p}/attn/q", f"/{p}/attn/k", f"/{p}/attn/v"], f"/{p}/attn/Split", axis=-1)
            qk = []
            for t, key, heads in (("q", qk_keys[0], n_heads), ("k", qk_keys[1], n_kv)):
                t_in = q if t == "q" else k
                if qk_norm == "after_rope":
                    t_in = node("RotaryEmbedding", [t_in, "position_ids", "cos_cache", "sin_cache"],
                                [f"/{p}/attn/{t}_rope"], f"/{p}/attn/{t}_rope", domain="com.microsoft",
                                interleaved=0, num_heads=heads)
                qk.append(norm(t_in, f"{p}.self_attn.{key}.weight", f"/{p}/attn/{key}") if qk_norm == "whole"
                          else head_norm(t_in, f"{p}.self_attn.{key}.weight", heads, f"/{p}/attn/{key}"))
            qkv_in = [*qk, v]
        pk, pv = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
        ok, ov = f"present.{i}.key", f"present.{i}.value"
        gqa_rope = rope_on[i] and qk_norm != "after_rope"
        attrs = dict(num_heads=n_heads, kv_num_heads=n_kv, do_rotary=int(gqa_rope), scale=attn_scale,
                     rotary_interleaved=int(arch == "Ernie4_5ForCausalLM"))
        if windows[i] >= 0:
            attrs["local_window_size"] = windows[i]
        rope = [f"{t}_cache{'_local' if local[i] else ''}" if gqa_rope else "" for t in ("cos", "sin")]
        a = node("GroupQueryAttention", [*qkv_in, pk, pv, "seqlens_k", "total_sequence_length", *rope],
                 [f"/{p}/attn/out", ok, ov], f"/{p}/attn/GroupQueryAttention", domain="com.microsoft",
                 **attrs)[0]
        if arch == LFM3 and f"{p}.self_attn.gate_proj.weight" in w:  # each head's output times its gate
            gate = node("Sigmoid", [linear(h, [f"{p}.self_attn.gate_proj"], f"/{p}/attn/gate_proj")],
                        [f"/{p}/attn/gate"], f"/{p}/attn/Sigmoid")
            heads = node("Reshape", [a, init(f"/{p}/attn/heads", np.array([0, 0, n_heads, head_dim], np.int64))],
                         [f"/{p}/attn/heads_out"], f"/{p}/attn/Reshape_heads")
            gated = node("Mul", [heads, node("Unsqueeze", [gate, init(f"/{p}/attn/ax", np.array([-1], np.int64))],
                                             [f"/{p}/attn/gate_col"], f"/{p}/attn/Unsqueeze")],
                         [f"/{p}/attn/gated_heads"], f"/{p}/attn/Gate")
            a = node("Reshape", [gated, init(f"/{p}/attn/flat", np.array([0, 0, n_heads * head_dim], np.int64))],
                     [f"/{p}/attn/gated"], f"/{p}/attn/Reshape_flat")
        if arch == QWEN3_5:  # the output gated per position and channel before o_proj
            gate = linear(h, [f"{p}.self_attn.gate_proj"], f"/{p}/attn/gate_proj")
            a = node("Mul", [a, node("Sigmoid", [gate], [f"/{p}/attn/gate"], f"/{p}/attn/Sigmoid")],
                     [f"/{p}/attn/gated"], f"/{p}/attn/Gate")
        return linear(a, [f"{p}.self_attn.o_proj"], f"/{p}/attn/o_proj")

    def positions() -> str:
        """position_ids [batch, seq], each token's position as GQA derives it (seqlens_k + 1 -
        seq + j): for a rotary outside GQA and attention built by hand. Made once."""
        if any(n.output[0] == "position_ids" for n in nodes):
            return "position_ids"
        seq = node("Gather", [node("Shape", ["input_ids"], ["/pos/shape"], "/pos/Shape"),
                              init("/pos/one", np.array(1, np.int64))], ["/pos/seq"], "/pos/Gather")
        past = node("Sub", [node("Cast", ["seqlens_k"], ["/pos/seqlens"], "/pos/Cast", to=TensorProto.INT64),
                            node("Sub", [seq, "/pos/one"], ["/pos/seq_1"], "/pos/Sub1")], ["/pos/past"], "/pos/Sub")
        steps = node("Range", [init("/pos/zero", np.array(0, np.int64)), seq, "/pos/one"], ["/pos/steps"],
                     "/pos/Range")
        return node("Add", [node("Unsqueeze", [past, init("/pos/axis", np.array([1], np.int64))], ["/pos/past_col"],
                                 "/pos/Unsqueeze"), steps], ["position_ids"], "/pos/Add")

    def query_scale() -> str:
        """[batch, seq, 1]: each token's query factor (Ministral 3), from a table by position. Made once."""
        if any(n.output[0] == "/qscale/out" for n in nodes):
            return "/qscale/out"
        orig = float(rope_parameters(cfg).get("original_max_position_embeddings") or n_pos)
        table = 1.0 + float(q_scale) * np.log1p(np.floor(np.arange(n_pos, dtype=np.float64) / orig))
        col = node("Gather", [init("/qscale/table", table.astype(np.float32)), positions()], ["/qscale/col"],
                   "/qscale/Gather")
        return node("Unsqueeze", [col, init("/qscale/axis", np.array([-1], np.int64))], ["/qscale/out"],
                    "/qscale/Unsqueeze")

    has_kv = [not mamba[i] and not conv[i] and not delta[i] or arch == FALCON_H1 for i in range(n_layers)]  # past/present in and out
    if blocks is not None:
        has_kv = [b == "attention" for b in blocks]
    if shared_kv is not None:  # KV-shared layers read their source layer's present: none of their own
        sources = kv_sources(list(shared_kv.layer_types), int(shared_kv.num_kv_shared_layers or 0))
        has_kv = [sources[i] == i for i in range(n_layers)]
    builder = SimpleNamespace(w=w, init=init, node=node, linear=linear, norm=norm, head_norm=head_norm, eps=eps,
                              positions=positions)

    if any(rope_on) or qk_norm == "after_rope":  # (a model without RoPE layers has no caches)
        cos, sin = rope_cache(hf_dir, n_pos)
        if cos.shape[1] % 8 or cos.shape[1] > rope_head // 2:
            raise _refuse(f"rotary of {2 * cos.shape[1]} of {rope_head} head dims (ONNX Runtime's "
                          "GroupQueryAttention needs rotary_dim / 2 a multiple of 8)")
        init("cos_cache", cos)
        init("sin_cache", sin)
    if any(local):
        for name, a in zip(("cos_cache_local", "sin_cache_local"), rope_cache(hf_dir, n_pos, local=True)):
            init(name, a)
    if g3n is not None:  # its own decoder: AltUp's streams, LAuReL, per-layer inputs (onnx_gemma3n.py)
        node("Identity", [gemma3n_decoder(builder, g3n, n_heads, n_kv, head_dim, windows, local)], [HIDDEN_STATES],
             "/model/hidden_states")
        hn = HIDDEN_STATES
    elif g4 is not None:  # its own decoder: per-layer head sizes, inputs and scalars (onnx_gemma4.py)
        hn = node("Identity", [gemma4_decoder(builder, g4, n_heads, windows, local)], [HIDDEN_STATES],
                  "/model/hidden_states")
    else:
        x = node("Gather", [init("model.embed_tokens.weight", w["model.embed_tokens.weight"]), "input_ids"],
                 ["/model/embed_tokens/out"], "/model/embed_tokens/Gather")
        if gemma:  # Gemma3TextScaledWordEmbedding: times sqrt(hidden) in the weights' dtype (fp32 here)
            x = node("Mul", [x, init("embed_scale", np.array(hidden ** 0.5, np.float32))],
                     ["/model/embed_tokens/scaled"], "/model/embed_tokens/embed_scale")
        if (granite or arch == FALCON_H1) and float(cfg.get("embedding_multiplier", 1.0)) != 1.0:
            x = node("Mul", [x, init("embedding_multiplier", np.array(cfg["embedding_multiplier"], np.float32))],
                     ["/model/embed_tokens/scaled"], "/model/embed_tokens/Mul")
        if qk_norm == "after_rope":
            positions()
        residual, pending = x, None
        for i in range(n_layers):
            p = f"model.layers.{i}"
            if post_norms[i]:  # OLMo 2 / EXAONE 4.0: the sublayer reads the residual stream itself
                if pending is not None:
                    residual = node("Add", [pending, residual], [f"/{p}/residual"], f"/{p}/Add")
                h = residual
            elif pending is None:
                h = norm(residual, f"{p}.input_layernorm.weight", f"/{p}/ln1")
            else:
                ln1 = init(f"{p}.input_layernorm.weight", w[f"{p}.input_layernorm.weight"])
                h, _, _, residual = node("SkipSimplifiedLayerNormalization", [pending, residual, ln1],
                                         [f"/{p}/ln1/out", "", "", f"/{p}/ln1/sum"], f"/{p}/ln1",
                                         domain="com.microsoft", epsilon=eps)
            if blocks is not None:  # Nemotron-H: the one mixer, then the next layer's norm
                if blocks[i] == "mlp":  # squared ReLU, no gate
                    up = node("Relu", [linear(h, [f"{p}.mlp.up_proj"], f"/{p}/mlp/up_proj")], [f"/{p}/mlp/relu"],
                              f"/{p}/mlp/Relu")
                    sq = node("Mul", [up, up], [f"/{p}/mlp/relu2"], f"/{p}/mlp/Square")
                    pending = linear(sq, [f"{p}.mlp.down_proj"], f"/{p}/mlp/down_proj")
                else:
                    pending = mamba2(builder, h, p, i, hc, eps) if mamba[i] else attention(h, p, i)
                continue
            if conv[i]:
                o = short_conv(builder, h, p, i, hidden)
            elif delta[i]:
                o = gated_deltanet(builder, h, p, i, qc, eps, arch)
            elif arch == FALCON_H1:  # both mixers on the same normed input, summed
                o = node("Add", [mamba2(builder, h, p, i, hc, eps), attention(h, p, i)], [f"/{p}/mixers"], f"/{p}/Add_mixers")
            elif mamba[i]:
                o = mamba2(builder, h, p, i, hc, eps)
            else:
                o = attention(h, p, i)
            if sandwich or post_norms[i]:  # each sublayer's output normed before its residual add
                o = norm(o, f"{p}.post_attention_layernorm.weight", f"/{p}/post_attn_norm")
            if post_norms[i]:
                residual = h2 = node("Add", [o, residual], [f"/{p}/attn/residual"], f"/{p}/attn/Add")
            else:
                ln2_key = f"{p}.{'pre_feedforward' if sandwich else 'post_attention'}_layernorm.weight"
                ln2 = init(ln2_key, w[ln2_key])
                h2, _, _, residual = node("SkipSimplifiedLayerNormalization", [o, residual, ln2],
                                          [f"/{p}/ln2/out", "", "", f"/{p}/ln2/sum"], f"/{p}/ln2",
                                          domain="com.microsoft", epsilon=eps)
            gu_ = linear(h2, [f"{p}.mlp.gate_proj", f"{p}.mlp.up_proj"], f"/{p}/mlp/gate_up_proj")
            g, u = node("Split", [gu_], [f"/{p}/mlp/gate", f"/{p}/mlp/up"], f"/{p}/mlp/Split", axis=-1,
                        num_outputs=2)
            if gemma:  # gelu_pytorch_tanh: FastGelu is the same tanh approximation
                act = node("FastGelu", [g], [f"/{p}/mlp/gelu"], f"/{p}/mlp/FastGelu", domain="com.microsoft")
            else:
                sg = node("Sigmoid", [g], [f"/{p}/mlp/sigmoid"], f"/{p}/mlp/Sigmoid")
                act = node("Mul", [g, sg], [f"/{p}/mlp/silu"], f"/{p}/mlp/SiLU")
            gu = node("Mul", [act, u], [f"/{p}/mlp/gated"], f"/{p}/mlp/Mul")
            pending = linear(gu, [f"{p}.mlp.down_proj"], f"/{p}/mlp/down_proj")
            if sandwich or post_norms[i]:
                pending = norm(pending, f"{p}.post_feedforward_layernorm.weight", f"/{p}/post_ff_norm")
        final = init("model.norm.weight", w["model.norm.weight"])
        # the final norm's output, every position: also a graph output (embeddings: runtime/embedding.py)
        hn = node("SkipSimplifiedLayerNormalization", [pending, residual, final], [HIDDEN_STATES],
                  "/model/norm", domain="com.microsoft", epsilon=eps)
    # the last LOGITS_TAIL positions (a decode step has one; a draft's verification up to
    # that many, runtime/scheduler/drafting.py): a few more lm_head rows per prefill chunk
    last = node("Slice", [hn, init("last_start", np.array([-LOGITS_TAIL], np.int64)),
                          init("last_end", np.array([np.iinfo(np.int64).max], np.int64)),
                          init("last_axis", np.array([1], np.int64))], ["/model/last"], "/model/Slice_last")
    head = w.pop("lm_head.weight", None)
    head = w["model.embed_tokens.weight"] if head is None else head  # tied embeddings
    if granite and float(cfg.get("logits_scaling", 1.0)) != 1.0:
        head = head / np.float32(cfg["logits_scaling"])
    cap = getattr(shared_kv, "final_logit_softcapping", None)
    logits = node("MatMul", [last, init("lm_head.weight_T", head.T)], ["logits" if not cap else "/lm_head/out"],
                  "/lm_head/MatMul")
    if cap:  # tanh(logits / cap) * cap
        capped = node("Tanh", [node("Mul", [logits, init("/softcap/inv", np.array(1.0 / cap, np.float32))],
                                    ["/softcap/scaled"], "/softcap/Scale")], ["/softcap/tanh"], "/softcap/Tanh")
        node("Mul", [capped, init("/softcap/cap", np.array(cap, np.float32))], ["logits"], "/softcap/Mul")

    f32, i32, i64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
    inputs = [helper.make_tensor_value_info("input_ids", i64, ["batch", "seq"])]
    for i in range(n_layers):
        inputs += [helper.make_tensor_value_info(name, f32, ["batch", *shape]) for name, _, shape in states.get(i, [])]
        if has_kv[i]:
            inputs += [helper.make_tensor_value_info(f"past_key_values.{i}.{t}", f32,
                                                     ["batch", kv_dims[i][0], "past_len", kv_dims[i][1]])
                       for t in ("key", "value")]
    inputs += [helper.make_tensor_value_info("seqlens_k", i32, ["batch"]),
               helper.make_tensor_value_info("total_sequence_length", i32, [])]
    outs = [helper.make_tensor_value_info("logits", f32, ["batch", "rows", int(head.shape[0])]),
            helper.make_tensor_value_info(HIDDEN_STATES, f32, ["batch", "seq", hidden])]
    for i in range(n_layers):
        outs += [helper.make_tensor_value_info(name, f32, ["batch", *shape]) for _, name, shape in states.get(i, [])]
        if has_kv[i]:
            outs += [helper.make_tensor_value_info(f"present.{i}.{t}", f32,
                                                   ["batch", kv_dims[i][0], "total_len", kv_dims[i][1]])
                     for t in ("key", "value")]
    graph = helper.make_graph(nodes, "prefix-edge-decoder", inputs, outs, [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              producer_name="prefix-edge")
    model.ir_version = 8
    helper.set_model_props(model, {MODEL_LAYERS: str(n_layers)})  # the engine's count (some hold no KV)
    # make_graph and make_model copy what they are given: the weights go in last, one tensor at
    # a time, each freed as it is copied (a 1B model's weights are held once, not three times)
    large = sum(len(t.raw_data) for t in inits) > 1_800_000_000
    inits.reverse()
    while inits:
        model.graph.initializer.append(inits.pop())
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=large, all_tensors_to_one_file=True,
                    location="model.onnx_data")
    return path
