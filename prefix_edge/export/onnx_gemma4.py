"""Gemma 4's text decoder in the own ONNX graph (export/onnx_graph.py builds the rest: the
inputs, the RoPE caches, the lm_head and its soft-capping).

Gemma4ForConditionalGeneration's text path, read as transformers' Gemma4ForCausalLM
(export/text_only.py), every piece as modeling_gemma4.py computes it:
- embeddings times sqrt(hidden); per-layer inputs as Gemma 3n's (onnx_gemma3n.per_layer_inputs),
  each layer adding its gated projection after the MLP: x + norm(W_p (gelu(W_g x) * input_i));
  every layer's output times its `layer_scalar`.
- Attention, sandwich-normed (input, post-attention, pre- and post-feedforward norms, each
  scaling by w itself): q/k norms per head, v normed without a scale, scale 1. Each layer has
  its layer type's head size and KV-head count (the global layers' `global_head_dim` and
  `num_global_key_value_heads`); on global layers with `attention_k_eq_v` the values are the
  keys' projection (before the k norm and the rotary). Sliding layers: GQA's local window and
  the sliding RoPE; global layers: their proportional partial RoPE, a cos/sin cache of half
  their head whose frequencies past the rotary part are 0 (an identity there).
- KV-shared layers (the last num_kv_shared_layers) attend to the cache of the last earlier
  layer of their type (onnx_gemma3n.shared_attention); they hold no KV (E2B: 20 of 35), and
  those of E2B's shape have MLPs twice as wide (use_double_wide_mlp: the weights say so).
- MLP: GELU-tanh. MoE layers (enable_moe_block, the 26B-A4B) and bidirectional attention are
  refused in one line.
So the graph's KV inputs differ in shape between layers ([batch, kv_heads_i, L, head_dim_i]):
the ONNX engine reads each layer's shape off the graph (runtime/engines/onnx/engine.py).
"""

from __future__ import annotations

import numpy as np

from .onnx_gemma3n import kv_sources, own_attention, per_layer_inputs, shared_attention

GEMMA4 = "Gemma4ForCausalLM"
TEXT_LAYERS = ("sliding_attention", "full_attention")


def gemma4_config(hf_dir, refuse):
    """The text config as transformers reads it, refused (`refuse(what)`) where the graph cannot
    follow it."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(hf_dir))
    c = getattr(c, "text_config", None) or c
    bad = [t for t in c.layer_types if t not in TEXT_LAYERS]
    if bad:
        raise refuse(f"{bad[0]!r} layers on Gemma 4 (it builds {', '.join(TEXT_LAYERS)})")
    if getattr(c, "enable_moe_block", False):
        raise refuse("Gemma 4's mixture-of-experts layers (enable_moe_block, e.g. 26B-A4B)")
    if getattr(c, "use_bidirectional_attention", None) == "all":
        raise refuse("bidirectional attention on Gemma 4")
    if c.hidden_activation != "gelu_pytorch_tanh":
        raise refuse(f"{c.hidden_activation!r} activation on Gemma 4")
    if int(c.num_kv_shared_layers or 0) >= int(c.num_hidden_layers):
        raise refuse("a Gemma 4 whose every layer reads another's KV (an assistant model)")
    return c


def layer_dims(tc) -> list[tuple[int, int]]:
    """Every layer's (KV heads, head size), as its layer type has them."""
    out = []
    for i in range(int(tc.num_hidden_layers)):
        lc = tc.per_layer_config[i]
        out.append((int(lc.num_key_value_heads), int(lc.head_dim)))
    return out


def gemma4_decoder(b, tc, n_heads: int, windows: list[int], local: list[bool]) -> str:
    """Nodes from input_ids to the final norm's output, whose name it returns; `b` the builder
    (w, init, node, linear, norm, head_norm, positions), `tc` the text config (gemma4_config)."""
    w, init, node, linear, norm, head_norm = b.w, b.init, b.node, b.linear, b.norm, b.head_norm
    hidden, n_layers = int(tc.hidden_size), int(tc.num_hidden_layers)
    ple = int(tc.hidden_size_per_layer_input or 0)
    sources = kv_sources(list(tc.layer_types), int(tc.num_kv_shared_layers or 0))
    dims = layer_dims(tc)
    f32 = np.float32

    x = node("Gather", [init("model.embed_tokens.weight", w["model.embed_tokens.weight"]), "input_ids"],
             ["/model/embed_tokens/out"], "/model/embed_tokens/Gather")
    x = node("Mul", [x, init("embed_scale", np.array(hidden ** 0.5, f32))], ["/model/embed_tokens/scaled"],
             "/model/embed_tokens/embed_scale")
    per_layer = per_layer_inputs(b, x, n_layers, ple, hidden) if ple else None
    for i in range(n_layers):
        p = f"model.layers.{i}"
        n_kv, d = dims[i]
        h = norm(x, f"{p}.input_layernorm.weight", f"/{p}/ln1")
        q = head_norm(linear(h, [f"{p}.self_attn.q_proj"], f"/{p}/attn/q_proj"), f"{p}.self_attn.q_norm.weight",
                      n_heads, f"/{p}/attn/q_norm", d)
        rope = [f"{t}_cache{'_local' if local[i] else ''}" for t in ("cos", "sin")]
        if sources[i] == i:
            k_raw = linear(h, [f"{p}.self_attn.k_proj"], f"/{p}/attn/k_proj")
            v_raw = (linear(h, [f"{p}.self_attn.v_proj"], f"/{p}/attn/v_proj") if f"{p}.self_attn.v_proj.weight" in w
                     else k_raw)  # attention_k_eq_v: the values are the keys' projection
            k = head_norm(k_raw, f"{p}.self_attn.k_norm.weight", n_kv, f"/{p}/attn/k_norm", d)
            w[f"{p}.self_attn.v_norm.weight"] = np.ones(d, f32)  # v normed without a scale
            v = head_norm(v_raw, f"{p}.self_attn.v_norm.weight", n_kv, f"/{p}/attn/v_norm", d)
            a = own_attention(b, q, k, v, i, p, n_heads, n_kv, windows[i], rope)
        else:  # KV-shared: its source's cache, no KV of its own (unused weights dropped)
            for t in ("k_proj", "v_proj", "k_norm", "v_norm"):
                w.pop(f"{p}.self_attn.{t}.weight", None)
            a = shared_attention(b, q, sources[i], windows[i], rope, p, n_heads, *dims[sources[i]])
        attn = norm(linear(a, [f"{p}.self_attn.o_proj"], f"/{p}/attn/o_proj"), f"{p}.post_attention_layernorm.weight",
                    f"/{p}/post_attn_norm")
        x = node("Add", [x, attn], [f"/{p}/attn_residual"], f"/{p}/AddAttn")
        m = norm(x, f"{p}.pre_feedforward_layernorm.weight", f"/{p}/ln2")
        gate = node("FastGelu", [linear(m, [f"{p}.mlp.gate_proj"], f"/{p}/mlp/gate_proj")], [f"/{p}/mlp/gelu"],
                    f"/{p}/mlp/FastGelu", domain="com.microsoft")
        m = node("Mul", [gate, linear(m, [f"{p}.mlp.up_proj"], f"/{p}/mlp/up_proj")], [f"/{p}/mlp/gated"],
                 f"/{p}/mlp/Mul")
        m = norm(linear(m, [f"{p}.mlp.down_proj"], f"/{p}/mlp/down_proj"), f"{p}.post_feedforward_layernorm.weight",
                 f"/{p}/post_ff_norm")
        x = node("Add", [x, m], [f"/{p}/ff_residual"], f"/{p}/AddFfw")
        if per_layer is not None:  # the per-layer input, gated by the layer's output
            g = node("FastGelu", [linear(x, [f"{p}.per_layer_input_gate"], f"/{p}/ple/gate")], [f"/{p}/ple/gelu"],
                     f"/{p}/ple/FastGelu", domain="com.microsoft")
            one = node("Gather", [per_layer, init(f"/{p}/ple/index", np.array([i], np.int64))], [f"/{p}/ple/input4"],
                       f"/{p}/ple/Gather", axis=2)  # [b, s, 1, P] (an initializer is at least 1-d)
            one = node("Squeeze", [one, init(f"/{p}/ple/axis", np.array([2], np.int64))], [f"/{p}/ple/input"],
                       f"/{p}/ple/Squeeze")
            g = node("Mul", [g, one], [f"/{p}/ple/gated"], f"/{p}/ple/Mul")
            g = norm(linear(g, [f"{p}.per_layer_projection"], f"/{p}/ple/projection"),
                     f"{p}.post_per_layer_input_norm.weight", f"/{p}/ple/norm")
            x = node("Add", [x, g], [f"/{p}/ple_residual"], f"/{p}/AddPle")
        scalar = w.pop(f"{p}.layer_scalar", None)
        if scalar is not None and not np.all(scalar == 1.0):
            x = node("Mul", [x, init(f"{p}.layer_scalar", scalar.astype(f32).reshape(-1))], [f"/{p}/scaled"],
                     f"/{p}/LayerScalar")
    return norm(x, "model.norm.weight", "/model/norm")
