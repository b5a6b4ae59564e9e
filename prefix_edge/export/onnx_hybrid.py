"""The recurrent blocks of hybrid models in the own ONNX graph (export/onnx_graph.py builds the
rest): LFM2's short convolution, with its state as a graph input and output.

LFM2 (Lfm2ForCausalLM): `layer_types` mixes "conv" and "full_attention" layers. A conv layer's
operator, as transformers' Lfm2ShortConv computes it:

    B, C, x = split(in_proj(h), 3)            (+ bias with conv_bias)
    Bx = B * x
    y = depthwise causal conv1d(Bx, kernel conv_L_cache) (+ bias)
    out = out_proj(C * y)

Its state is the last conv_L_cache - 1 values of Bx per channel: the graph reads it as
`past_conv.{i}` [batch, hidden, L - 1] and writes the state after the new tokens as
`present_conv.{i}`. A sequence's state starts at zeros (the causal conv's own zero padding), so a
prefill in chunks, a decode step and a restored state give the conv outputs of one whole run.
The rest of the layer is the llama one under other names (operator_norm and ffn_norm for the
two pre-norms, q_layernorm / k_layernorm per head, feed_forward w1/w3/w2 for gate/up/down,
the final norm `embedding_norm`), renamed here to the names onnx_graph.py reads.
"""

from __future__ import annotations

import numpy as np

from ..errors import PrefixEdgeError

LFM2 = "Lfm2ForCausalLM"
STATE_IN, STATE_OUT = "past_conv.", "present_conv."  # + layer index: a recurrent layer's state


def lfm2_layers(hf_dir) -> list[bool]:
    """Which layers are short-convolution layers, as transformers reads the config (its
    layer_types, or the older full_attn_idxs)."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(hf_dir))
    bad = sorted({t for t in c.layer_types if t not in ("conv", "full_attention")})
    if bad:
        raise PrefixEdgeError(f"the own ONNX builder has no {bad[0]!r} layers on {LFM2} "
                              "(it builds conv and full_attention)")
    return [t == "conv" for t in c.layer_types]


def lfm2_weights(w: dict[str, np.ndarray], conv: list[bool]) -> None:
    """Rename LFM2's tensors (in place) to the llama names the graph builder reads."""
    names = {"operator_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "self_attn.out_proj": "self_attn.o_proj", "feed_forward.w1": "mlp.gate_proj",
             "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj"}
    for i in range(len(conv)):
        p = f"model.layers.{i}."
        for old, new in names.items():
            for kind in (".weight", ".bias"):
                if p + old + kind in w:
                    w[p + new + kind] = w.pop(p + old + kind)
    w["model.norm.weight"] = w.pop("model.embedding_norm.weight")


def short_conv(g, h: str, p: str, i: int, hidden: int) -> str:
    """LFM2's conv operator on the normed hidden states `h` [batch, seq, hidden] of layer `i`
    (tensor prefix `p`); returns its output before the residual add. `g` is the builder's
    (init, node, linear, w)."""
    w = g.w
    kernel = w.pop(f"{p}.conv.conv.weight")  # [hidden, 1, L]
    if kernel.shape[0] != hidden or kernel.shape[1] != 1:
        raise PrefixEdgeError(f"the own ONNX builder has no {list(kernel.shape)} conv kernel on {LFM2} "
                              f"(a depthwise one, [{hidden}, 1, L])")
    L = int(kernel.shape[2])
    bcx = g.linear(h, [f"{p}.conv.in_proj"], f"/{p}/conv/in_proj")
    b, c, x = g.node("Split", [bcx], [f"/{p}/conv/B", f"/{p}/conv/C", f"/{p}/conv/x"], f"/{p}/conv/Split",
                     axis=-1, num_outputs=3)
    bx = g.node("Mul", [b, x], [f"/{p}/conv/Bx"], f"/{p}/conv/Mul_Bx")
    bx_t = g.node("Transpose", [bx], [f"/{p}/conv/Bx_T"], f"/{p}/conv/Transpose_in", perm=[0, 2, 1])
    # the state's L - 1 columns, then the new ones: a conv without padding gives one output each
    window = g.node("Concat", [f"{STATE_IN}{i}", bx_t], [f"/{p}/conv/window"], f"/{p}/conv/Concat", axis=2)
    ins = [window, g.init(f"{p}.conv.conv.weight", kernel)]
    if f"{p}.conv.conv.bias" in w:
        ins.append(g.init(f"{p}.conv.conv.bias", w.pop(f"{p}.conv.conv.bias")))
    y = g.node("Conv", ins, [f"/{p}/conv/y"], f"/{p}/conv/Conv", group=hidden, kernel_shape=[L])
    g.node("Slice", [window, g.init(f"/{p}/conv/keep", np.array([-(L - 1)], np.int64)),
                     g.init(f"/{p}/conv/end", np.array([np.iinfo(np.int64).max], np.int64)),
                     g.init(f"/{p}/conv/axis", np.array([2], np.int64))], [f"{STATE_OUT}{i}"], f"/{p}/conv/state")
    y_t = g.node("Transpose", [y], [f"/{p}/conv/y_T"], f"/{p}/conv/Transpose_out", perm=[0, 2, 1])
    gated = g.node("Mul", [c, y_t], [f"/{p}/conv/gated"], f"/{p}/conv/Mul_C")
    return g.linear(gated, [f"{p}.conv.out_proj"], f"/{p}/conv/out_proj")

