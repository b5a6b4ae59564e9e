"""Qwen3.5 (Qwen3_5ForCausalLM, and the text path of Qwen3_5ForConditionalGeneration) and the OLMo
hybrid (OlmoHybridForCausalLM) on the own ONNX graph: their Gated DeltaNet layers; Qwen3.5's gated
attention and zero-centred norms (the OLMo hybrid's attention layers are OLMo 3's, post-normed).

A Gated DeltaNet layer (transformers' Qwen3_5GatedDeltaNet): `in_proj_qkv` through a depthwise
causal conv (state `past_conv.{i}`, as LFM2's and Mamba2's) and SiLU, split into q, k (L2-normed,
q times d_k ** -0.5; each key head serving num_v / num_k value heads) and v; beta = sigmoid(b),
g = -exp(A_log) * softplus(a + dt_bias); then the gated delta rule, token by token, on the state
S [heads, d_k, d_v] (`past_ssm.{i}` / `present_ssm.{i}`):

    S = S * exp(g_t);  delta = (v_t - k_t S) * beta_t;  S = S + k_t ⊗ delta;  o_t = q_t S

as an ONNX Scan over the tokens (exact: the same recurrence transformers' recurrent kernel runs;
its chunked prefill computes the same sums in another order, within float noise), then a
per-head RMSNorm of o times silu(z), `out_proj`.

A full-attention layer: `q_proj` gives each head's query and its output gate side by side (split
here into q and gate rows), per-head q/k norms, a quarter of each head rotated (text positions:
the interleaved M-RoPE is the plain rotary), and the attention's output times sigmoid(gate)
before `o_proj`. Every RMSNorm but the gated one scales by (1 + w): folded into its weight.
"""

from __future__ import annotations

import numpy as np

from ..errors import PrefixEdgeError
from .onnx_hybrid import SSM_IN, SSM_OUT, STATE_IN, STATE_OUT, causal_conv

QWEN3_5 = "Qwen3_5ForCausalLM"
OLMO_HYBRID = "OlmoHybridForCausalLM"
# each family's names for the mixer's weights: (q, k and v's projections, z, b, a, the gated norm,
# the output projection), the gated norm's epsilon (None: the config's), beta's scale
NAMES = {QWEN3_5: (["in_proj_qkv"], "in_proj_z", "in_proj_b", "in_proj_a", "norm", "out_proj", None),
         OLMO_HYBRID: (["q_proj", "k_proj", "v_proj"], "g_proj", "b_proj", "a_proj", "o_norm", "o_proj", 1e-5)}


def qwen3_5_layers(hf_dir, w: dict[str, np.ndarray]):
    """(which layers are Gated DeltaNet ones, the text config); the weights prepared in place:
    the (1 + w) norms folded, each head's query and gate rows of q_proj split apart."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(hf_dir))
    c = getattr(c, "text_config", None) or c
    bad = sorted({t for t in c.layer_types if t not in ("linear_attention", "full_attention")})
    if bad:
        raise PrefixEdgeError(f"the own ONNX builder has no {bad[0]!r} layers on {QWEN3_5}")
    if getattr(c, "attention_bias", False):
        raise PrefixEdgeError(f"the own ONNX builder has no attention bias on {QWEN3_5}")
    for k in list(w):  # zero-centred RMSNorms: x / rms * (1 + w)
        if k.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight")) or k == "model.norm.weight":
            w[k] = w[k] + np.float32(1.0)
    d = int(c.head_dim)
    for i, t in enumerate(c.layer_types):
        if t != "full_attention":
            continue
        p = f"model.layers.{i}.self_attn"
        qg = w.pop(f"{p}.q_proj.weight").reshape(c.num_attention_heads, 2, d, -1)
        w[f"{p}.q_proj.weight"] = qg[:, 0].reshape(c.num_attention_heads * d, -1)
        w[f"{p}.gate_proj.weight"] = qg[:, 1].reshape(c.num_attention_heads * d, -1)
    return [t == "linear_attention" for t in c.layer_types], c


def olmo_hybrid_layers(hf_dir, w: dict[str, np.ndarray]):
    """(which layers are Gated DeltaNet ones, whether the attention layers rotate, the config) of
    an OLMo hybrid: its attention layers are OLMo 3's (post-norms, q/k norms over the whole
    projection), its linear-attention layers pre-normed; the released checkpoints set no rotary.
    Its weights as transformers loads them (in place): the checkpoint's names (attention_layer_norm,
    feedforward_layer_norm, the conv in three pieces) are its conversion mapping's."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(hf_dir))
    bad = sorted({t for t in c.layer_types if t not in ("linear_attention", "full_attention")})
    if bad:
        raise PrefixEdgeError(f"the own ONNX builder has no {bad[0]!r} layers on {OLMO_HYBRID}")
    for k in list(w):  # (transformers' conversion_mapping["olmo_hybrid"])
        for old, new in ((".attention_layer_norm.", ".input_layernorm."),
                         (".feedforward_layer_norm.", ".post_attention_layernorm.")):
            if old in k:
                w[k.replace(old, new)] = w.pop(k)
    for i in range(c.num_hidden_layers):
        q = f"model.layers.{i}.linear_attn"
        if f"{q}.q_conv1d.weight" in w:
            w[f"{q}.conv1d.weight"] = np.concatenate([w.pop(f"{q}.{t}_conv1d.weight") for t in "qkv"], axis=0)
    return [t == "linear_attention" for t in c.layer_types], getattr(c, "rope_parameters", None) is not None, c


def state_shapes(c, i: int) -> list[tuple[str, str, list[int]]]:
    """Layer i's two states: the conv window over q, k, v and the delta rule's S."""
    conv_dim = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
    return [(f"{STATE_IN}{i}", f"{STATE_OUT}{i}", [conv_dim, int(c.linear_conv_kernel_dim) - 1]),
            (f"{SSM_IN}{i}", f"{SSM_OUT}{i}", [int(c.linear_num_value_heads), int(c.linear_key_head_dim),
                                               int(c.linear_value_head_dim)])]


def gated_deltanet(g, h: str, p: str, i: int, c, eps: float, arch: str = QWEN3_5) -> str:
    """Layer i's Gated DeltaNet on the normed `h` [1, seq, hidden]; its output before the residual
    add. `arch`: whose weight names (NAMES); OLMo's may scale beta by 2 (linear_allow_neg_eigval)."""
    from onnx import TensorProto, helper

    w, node, init = g.w, g.node, g.init
    nk, nv = int(c.linear_num_key_heads), int(c.linear_num_value_heads)
    dk, dv = int(c.linear_key_head_dim), int(c.linear_value_head_dim)
    if nv % nk:
        raise PrefixEdgeError(f"the own ONNX builder has no {nv} value heads over {nk} key heads on {QWEN3_5}")
    n, q = f"/{p}/delta", f"{p}.linear_attn"

    made: set[str] = set()

    def const(name: str, a) -> str:  # (one initializer a name: q's and k's reshapes share some)
        if f"{n}/{name}" not in made:
            made.add(f"{n}/{name}")
            init(f"{n}/{name}", np.asarray(a))
        return f"{n}/{name}"

    def op(kind: str, ins: list[str], out: str, **attrs) -> str:
        return node(kind, ins, [f"{n}/{out}"], f"{n}/{out}", **attrs)

    qkv_keys, z_key, b_key, a_key, norm_key, out_key, norm_eps = NAMES[arch]
    qkv = g.linear(h, [f"{q}.{k}" for k in qkv_keys], f"{n}/in_proj_qkv")
    z = g.linear(h, [f"{q}.{z_key}"], f"{n}/in_proj_z")
    b = g.linear(h, [f"{q}.{b_key}"], f"{n}/in_proj_b")
    a = g.linear(h, [f"{q}.{a_key}"], f"{n}/in_proj_a")
    qkv = causal_conv(g, qkv, f"{n}/conv", i, f"{q}.conv1d", 2 * nk * dk + nv * dv)
    qkv = op("Mul", [qkv, op("Sigmoid", [qkv], "conv_sigmoid")], "conv_silu")
    qq, kk, vv = node("Split", [qkv, const("sizes", np.array([nk * dk, nk * dk, nv * dv], np.int64))],
                      [f"{n}/q", f"{n}/k", f"{n}/v"], f"{n}/Split", axis=-1)

    def heads(t: str, name: str, scale: float | None) -> str:  # [1, seq, nk*dk] -> [seq, nv, dk], L2-normed
        t = op("Reshape", [t, const(f"{name}_shape", np.array([-1, nk, dk], np.int64))], f"{name}_heads")
        ss = op("ReduceSum", [op("Mul", [t, t], f"{name}_sq"), const("last", np.array([-1], np.int64))],
                f"{name}_ss", keepdims=1)
        t = op("Mul", [t, op("Reciprocal", [op("Sqrt", [op("Add", [ss, const("l2_eps", np.array(1e-6, np.float32))],
                                                                 f"{name}_ss_eps")], f"{name}_norm")],
                             f"{name}_inv")], f"{name}_l2")
        if scale is not None:
            t = op("Mul", [t, const(f"{name}_scale", np.array(scale, np.float32))], f"{name}_scaled")
        if nv != nk:  # each key head serves nv / nk consecutive value heads
            t = op("Unsqueeze", [t, const("ax2", np.array([2], np.int64))], f"{name}_col")
            t = op("Expand", [t, const(f"{name}_rep", np.array([1, nk, nv // nk, dk], np.int64))], f"{name}_exp")
            t = op("Reshape", [t, const(f"{name}_vheads", np.array([-1, nv, dk], np.int64))], f"{name}_rep_heads")
        return t

    qh, kh = heads(qq, "q", dk ** -0.5), heads(kk, "k", None)
    vh = op("Reshape", [vv, const("v_shape", np.array([-1, nv, dv], np.int64))], "v_heads")
    beta = op("Sigmoid", [b], "beta_raw")
    if arch == OLMO_HYBRID and getattr(c, "linear_allow_neg_eigval", False):  # beta in [0, 2]
        beta = op("Mul", [beta, const("two", np.array(2.0, np.float32))], "beta_2")
    beta = op("Reshape", [beta, const("nv_rows", np.array([-1, nv], np.int64))], "beta")
    a_neg = -np.exp(w.pop(f"{q}.A_log").astype(np.float32))
    sp = op("Softplus", [op("Add", [a, init(f"{q}.dt_bias", w.pop(f"{q}.dt_bias"))], "a_dt")], "softplus")
    decay = op("Exp", [op("Reshape", [op("Mul", [sp, const("A", a_neg)], "g"), const("nv_rows2",
                                                                                 np.array([-1, nv], np.int64))],
                          "g_rows")], "decay")  # [seq, nv]

    # the recurrence, one token a step: state S [nv, dk, dv]; scanned: q, k [nv, dk], v [nv, dv], decay, beta [nv]
    f32 = TensorProto.FLOAT
    b_nodes, b_init = [], []

    def bop(kind: str, ins: list[str], out: str, **attrs) -> str:
        b_nodes.append(helper.make_node(kind, ins, [out], name=out, **attrs))
        return out

    b_init += [helper.make_tensor("ax_last", TensorProto.INT64, [1], [-1]),
               helper.make_tensor("ax_mid", TensorProto.INT64, [1], [1]),
               helper.make_tensor("ax_12", TensorProto.INT64, [2], [1, 2])]
    s = bop("Mul", ["S_in", bop("Unsqueeze", ["decay_t", "ax_12"], "decay_col")], "S_decayed")
    k_col = bop("Unsqueeze", ["k_t", "ax_last"], "k_col")  # [nv, dk, 1]
    mem = bop("ReduceSum", [bop("Mul", [s, k_col], "Sk"), "ax_mid"], "kv_mem", keepdims=0)  # [nv, dv]
    delta = bop("Mul", [bop("Sub", ["v_t", mem], "v_minus"), bop("Unsqueeze", ["beta_t", "ax_last"], "beta_col")],
                "delta")
    s_new = bop("Add", [s, bop("Mul", [k_col, bop("Unsqueeze", [delta, "ax_mid"], "delta_row")], "k_delta")], "S_out")
    o = bop("ReduceSum", [bop("Mul", [s_new, bop("Unsqueeze", ["q_t", "ax_last"], "q_col")], "Sq"), "ax_mid"],
            "o_t", keepdims=0)
    body = helper.make_graph(
        b_nodes, f"{n}/step",
        [helper.make_tensor_value_info("S_in", f32, [nv, dk, dv]),
         helper.make_tensor_value_info("q_t", f32, [nv, dk]), helper.make_tensor_value_info("k_t", f32, [nv, dk]),
         helper.make_tensor_value_info("v_t", f32, [nv, dv]), helper.make_tensor_value_info("decay_t", f32, [nv]),
         helper.make_tensor_value_info("beta_t", f32, [nv])],
        [helper.make_tensor_value_info(s_new, f32, [nv, dk, dv]), helper.make_tensor_value_info(o, f32, [nv, dv])],
        b_init)
    s0 = op("Reshape", [f"{SSM_IN}{i}", const("s_shape", np.array([nv, dk, dv], np.int64))], "S0")
    s_last, outs = node("Scan", [s0, qh, kh, vh, decay, beta], [f"{n}/S_last", f"{n}/o"], f"{n}/Scan",
                        body=body, num_scan_inputs=5)
    node("Reshape", [s_last, const("s_out", np.array([1, nv, dk, dv], np.int64))], [f"{SSM_OUT}{i}"], f"{n}/state")
    # the gated RMSNorm per head (its own weight, not zero-centred), times silu(z)
    normed = node("SimplifiedLayerNormalization", [outs, init(f"{q}.{norm_key}.weight", w.pop(f"{q}.{norm_key}.weight"))],
                  [f"{n}/normed"], f"{n}/norm", axis=-1, epsilon=norm_eps or eps)  # [seq, nv, dv]
    flat = op("Reshape", [normed, const("flat", np.array([1, -1, nv * dv], np.int64))], "normed_flat")
    gated = op("Mul", [flat, op("Mul", [z, op("Sigmoid", [z], "z_sigmoid")], "z_silu")], "gated")
    return g.linear(gated, [f"{q}.{out_key}"], f"{n}/out_proj")
