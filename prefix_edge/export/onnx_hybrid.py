"""The recurrent blocks of hybrid models in the own ONNX graph (export/onnx_graph.py builds the
rest): LFM2's short convolution and Granite 4.0-H's Mamba2 mixer, each with its state as a graph
input and output.

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

Granite 4.0-H (GraniteMoeHybridForCausalLM, dense: no experts): `layers_block_type` mixes
"mamba" and "attention" layers (attention without RoPE when position_embedding_type is "nope"),
Granite's multipliers, a gated MLP `shared_mlp`. A Mamba2 layer, as transformers' torch path:

    z, xBC, dt = split(in_proj(h))
    xBC = silu(depthwise causal conv1d(xBC, kernel mamba_d_conv) + bias)   (state: conv window)
    x, B, C = split(xBC)                      (B and C per group, shared by its heads)
    dt = softplus(dt + dt_bias); a = dt * A   (A = -exp(A_log), per head)
    S_t = exp(a_t) S_{t-1} + dt_t x_t B_t^T;  y_t = C_t S_t + D x_t    (state S: [heads, d_head, d_state])
    out = out_proj(rmsnorm(y * silu(z)))

A forward of n tokens computes the recurrence in closed form (the SSD "chunk" form, one chunk):
with c = cumsum(a), y = ((C B^T) * L) (dt x) + exp(c) C S_0^T + D x, where L[t, s] = exp(c_t - c_s)
for s <= t, and S_n = exp(c_n) S_0 + sum_s exp(c_n - c_s) dt_s x_s B_s^T. L is [heads, n, n], so
the engine runs a Mamba2 graph's forward in pieces of at most SSM_CHUNK tokens.

Falcon-H1 (FalconH1ForCausalLM): a Mamba2 mixer beside attention in every layer, both on the same
normed input, their outputs summed before the residual add; its μP multipliers (embedding, the
mixer's input and per-section in_proj outputs, key, attention in/out, SSM out, MLP gate/down,
lm_head) are folded into the weights here (falcon_h1_weights); the mixer's gated RMSNorm is per
group, before or after the gate (mamba_norm_before_gate), or absent (mamba_rms_norm false).
"""

from __future__ import annotations

import numpy as np

from ..errors import PrefixEdgeError

LFM2 = "Lfm2ForCausalLM"
LFM3 = "Lfm3ForCausalLM"  # LFM2's conv layers beside full and sliding attention, gated per head, sandwich norms
GRANITE_H = "GraniteMoeHybridForCausalLM"
FALCON_H1 = "FalconH1ForCausalLM"
STATE_IN, STATE_OUT = "past_conv.", "present_conv."  # + layer index: a recurrent layer's state
SSM_IN, SSM_OUT = "past_ssm.", "present_ssm."  # + layer index: a Mamba2 layer's SSM state


def lfm2_layers(hf_dir) -> list[bool]:
    """Which layers are short-convolution layers, as transformers reads the config (its
    layer_types, or the older full_attn_idxs)."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(hf_dir))
    kinds = ("conv", "full_attention", "sliding_attention") if c.model_type == "lfm3" else ("conv", "full_attention")
    bad = sorted({t for t in c.layer_types if t not in kinds})
    if bad:
        raise PrefixEdgeError(f"the own ONNX builder has no {bad[0]!r} layers on {c.architectures[0]} "
                              f"(it builds {', '.join(kinds)})")
    return [t == "conv" for t in c.layer_types]


def lfm2_weights(w: dict[str, np.ndarray], conv: list[bool], sandwich: bool = False) -> None:
    """Rename LFM2's (and LFM3's) tensors (in place) to the llama names the graph builder reads;
    `sandwich`: LFM3's norms before and after each sublayer, named as Gemma 3's."""
    names = {"operator_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "self_attn.out_proj": "self_attn.o_proj", "feed_forward.w1": "mlp.gate_proj",
             "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj"}
    if sandwich:
        names.update({"ffn_norm": "pre_feedforward_layernorm", "post_operator_norm": "post_attention_layernorm",
                      "post_ffn_norm": "post_feedforward_layernorm"})
    for i in range(len(conv)):
        p = f"model.layers.{i}."
        for old, new in names.items():
            for kind in (".weight", ".bias"):
                if p + old + kind in w:
                    w[p + new + kind] = w.pop(p + old + kind)
    w["model.norm.weight"] = w.pop("model.embedding_norm.weight")


def causal_conv(g, x: str, name: str, i: int, weight: str, channels: int) -> str:
    """A depthwise causal conv1d over `x` [batch, seq, channels] whose state (its last L - 1
    inputs) is the graph input past_conv.{i} / output present_conv.{i}; [batch, seq, channels]."""
    w = g.w
    kernel = w.pop(weight + ".weight")  # [channels, 1, L]
    if kernel.shape[0] != channels or kernel.shape[1] != 1:
        raise PrefixEdgeError(f"the own ONNX builder has no {list(kernel.shape)} conv kernel (a depthwise "
                              f"one, [{channels}, 1, L])")
    L = int(kernel.shape[2])
    x_t = g.node("Transpose", [x], [f"{name}/in_T"], f"{name}/Transpose_in", perm=[0, 2, 1])
    # the state's L - 1 columns, then the new ones: a conv without padding gives one output each
    window = g.node("Concat", [f"{STATE_IN}{i}", x_t], [f"{name}/window"], f"{name}/Concat", axis=2)
    ins = [window, g.init(weight + ".weight", kernel)]
    if weight + ".bias" in w:
        ins.append(g.init(weight + ".bias", w.pop(weight + ".bias")))
    y = g.node("Conv", ins, [f"{name}/y"], f"{name}/Conv", group=channels, kernel_shape=[L])
    g.node("Slice", [window, g.init(f"{name}/keep", np.array([-(L - 1)], np.int64)),
                     g.init(f"{name}/end", np.array([np.iinfo(np.int64).max], np.int64)),
                     g.init(f"{name}/axis", np.array([2], np.int64))], [f"{STATE_OUT}{i}"], f"{name}/state")
    return g.node("Transpose", [y], [f"{name}/y_T"], f"{name}/Transpose_out", perm=[0, 2, 1])


def short_conv(g, h: str, p: str, i: int, hidden: int) -> str:
    """LFM2's conv operator on the normed hidden states `h` [batch, seq, hidden] of layer `i`
    (tensor prefix `p`); returns its output before the residual add. `g` is the builder's
    (w, init, node, linear)."""
    bcx = g.linear(h, [f"{p}.conv.in_proj"], f"/{p}/conv/in_proj")
    b, c, x = g.node("Split", [bcx], [f"/{p}/conv/B", f"/{p}/conv/C", f"/{p}/conv/x"], f"/{p}/conv/Split",
                     axis=-1, num_outputs=3)
    bx = g.node("Mul", [b, x], [f"/{p}/conv/Bx"], f"/{p}/conv/Mul_Bx")
    y = causal_conv(g, bx, f"/{p}/conv/conv", i, f"{p}.conv.conv", hidden)
    gated = g.node("Mul", [c, y], [f"/{p}/conv/gated"], f"/{p}/conv/Mul_C")
    return g.linear(gated, [f"{p}.conv.out_proj"], f"/{p}/conv/out_proj")


GRANITE_H_KINDS = {"linear_attention": "mamba", "full_attention": "attention"}  # 5.x layer_types -> 4.x

def granite_h_layers(hf_dir, w: dict[str, np.ndarray]) -> tuple[list[bool], object]:
    """Which layers are Mamba2 layers, and the config; the shared MLP renamed (in place) to
    the llama names (the MoE variants are refused earlier: onnx_source.read_config)."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(hf_dir))
    kinds = [GRANITE_H_KINDS.get(t, t) for t in c.layers_block_type]  # transformers 5 names them anew
    bad = sorted({t for t in kinds if t not in ("mamba", "attention")})
    if bad:
        raise PrefixEdgeError(f"the own ONNX builder has no {bad[0]!r} layers on {GRANITE_H}")
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        gate, up = np.split(w.pop(f"{p}.shared_mlp.input_linear.weight"), 2, axis=0)
        w[f"{p}.mlp.gate_proj.weight"], w[f"{p}.mlp.up_proj.weight"] = gate, up
        w[f"{p}.mlp.down_proj.weight"] = w.pop(f"{p}.shared_mlp.output_linear.weight")
    return [t == "mamba" for t in kinds], c


NEMOTRON_H = "NemotronHForCausalLM"
NEMOTRON_H_KINDS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention",
                    "full_attention": "attention", "mlp": "mlp", "moe": "moe"}


def nemotron_h_layers(hf_dir, w: dict[str, np.ndarray]) -> tuple[list[str], object]:
    """Nemotron-H's block kinds ("mamba", "attention", "mlp": one mixer a layer) and a config in
    the Mamba2 builder's names; its weights renamed (in place) to the ones the builder reads.
    The MoE variants and any other MLP activation than squared ReLU are refused in one line."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(hf_dir))
    kinds = [NEMOTRON_H_KINDS.get(t, t) for t in c.layers_block_type]
    bad = sorted({t for t in kinds if t not in ("mamba", "attention", "mlp")})
    if bad:
        raise PrefixEdgeError(f"the own ONNX builder has no {bad[0]!r} layers on {NEMOTRON_H}; "
                              "export with --format gguf")
    if c.mlp_hidden_act != "relu2":
        raise PrefixEdgeError(f"the own ONNX builder has no {c.mlp_hidden_act!r} MLP activation on {NEMOTRON_H}")
    for k in list(w):  # backbone.* (as the checkpoints and transformers 5 write them) -> model.*
        w["model." + k.split(".", 1)[1] if k.startswith("backbone.") else k] = w.pop(k)
    w["model.embed_tokens.weight"] = w.pop("model.embeddings.weight")
    w["model.norm.weight"] = w.pop("model.norm_f.weight")
    to = {"mamba": "mamba", "attention": "self_attn", "mlp": "mlp"}
    for i, kind in enumerate(kinds):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = w.pop(f"{p}.norm.weight")
        for k in [k for k in w if k.startswith(f"{p}.mixer.")]:
            w[f"{p}.{to[kind]}." + k[len(f"{p}.mixer."):]] = w.pop(k)
    hc = SimpleNamespace(  # the Mamba2 builder's names (mamba2 below); its gated norm per group, gate first
        mamba_n_heads=c.mamba_num_heads, mamba_d_head=c.mamba_head_dim, mamba_d_state=c.ssm_state_size,
        mamba_n_groups=c.n_groups, mamba_d_conv=c.conv_kernel, mamba_expand=c.expand, hidden_size=c.hidden_size,
        mamba_d_ssm=int(c.mamba_num_heads) * int(c.mamba_head_dim), mamba_rms_norm=True,
        mamba_norm_before_gate=False)
    return kinds, hc


def falcon_h1_weights(hf_dir, w: dict[str, np.ndarray]):
    """Falcon-H1's config; its multipliers folded into the weights (in place) and its names
    renamed to the ones the builder reads: a linear map times a constant is the map with its
    weights (and bias) scaled, and an input scaled before a linear map is its weights scaled."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(hf_dir))
    f32 = np.float32
    inner = int(c.mamba_d_ssm) if c.mamba_d_ssm is not None else int(c.mamba_expand * c.hidden_size)
    gs = int(c.mamba_n_groups) * int(c.mamba_d_state)
    mup = np.ones(2 * inner + 2 * gs + int(c.mamba_n_heads), f32)  # transformers' compute_mup_vector
    for (lo, hi), m in zip(((0, inner), (inner, 2 * inner), (2 * inner, 2 * inner + gs),
                            (2 * inner + gs, 2 * inner + 2 * gs), (2 * inner + 2 * gs, len(mup))), c.ssm_multipliers):
        mup[lo:hi] *= f32(m)

    def scale(key: str, rows=None, cols=None) -> None:
        if key + ".weight" in w:
            a = w[key + ".weight"]
            a = a * (rows[:, None] if isinstance(rows, np.ndarray) else f32(rows if rows is not None else 1.0))
            w[key + ".weight"] = a * f32(cols if cols is not None else 1.0)
        if key + ".bias" in w and rows is not None:
            w[key + ".bias"] = w[key + ".bias"] * (rows if isinstance(rows, np.ndarray) else f32(rows))

    gate_m, down_m = c.mlp_multipliers
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        scale(f"{p}.mamba.in_proj", rows=mup, cols=c.ssm_in_multiplier)
        scale(f"{p}.mamba.out_proj", rows=c.ssm_out_multiplier)
        for t in "qv":
            scale(f"{p}.self_attn.{t}_proj", cols=c.attention_in_multiplier)
        scale(f"{p}.self_attn.k_proj", rows=c.key_multiplier, cols=c.attention_in_multiplier)
        scale(f"{p}.self_attn.o_proj", rows=c.attention_out_multiplier)
        scale(f"{p}.feed_forward.gate_proj", rows=gate_m)
        scale(f"{p}.feed_forward.down_proj", rows=down_m)
        for t in ("gate_proj", "up_proj", "down_proj"):
            for kind in (".weight", ".bias"):
                if f"{p}.feed_forward.{t}{kind}" in w:
                    w[f"{p}.mlp.{t}{kind}"] = w.pop(f"{p}.feed_forward.{t}{kind}")
        w[f"{p}.post_attention_layernorm.weight"] = w.pop(f"{p}.pre_ff_layernorm.weight")
    w["model.norm.weight"] = w.pop("model.final_layernorm.weight")
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])  # (tied: the embedding table)
    w["lm_head.weight"] = head * f32(c.lm_head_multiplier)
    return c


def mamba2(g, h: str, p: str, i: int, c, eps: float) -> str:
    """A Mamba2 mixer (transformers' GraniteMoeHybridMambaLayer) on the normed `h` [1, seq,
    hidden] of layer `i`; its output before the residual add. States: past_conv.{i} (the conv
    window over xBC) and past_ssm.{i} [1, heads, d_head, d_state]."""
    w, node, init = g.w, g.node, g.init
    nh, hd, ds, ng = int(c.mamba_n_heads), int(c.mamba_d_head), int(c.mamba_d_state), int(c.mamba_n_groups)
    inner = int(c.mamba_expand * c.hidden_size) if getattr(c, "mamba_d_ssm", None) is None else int(c.mamba_d_ssm)
    falcon = getattr(c, "mamba_rms_norm", None) is not None  # Falcon-H1's norm options
    conv_dim = inner + 2 * ng * ds
    if nh * hd != inner or nh % ng:
        raise PrefixEdgeError(f"the own ONNX builder has no Mamba2 layer of {nh} heads x {hd} for an inner "
                              f"size of {inner} in {ng} groups")
    n = f"/{p}/mamba"
    q = f"{p}.mamba"

    def const(name: str, a) -> str:
        return init(f"{n}/{name}", np.asarray(a))

    def op(kind: str, ins: list[str], out: str, **attrs) -> str:
        return node(kind, ins, [f"{n}/{out}"], f"{n}/{out}", **attrs)

    proj = g.linear(h, [f"{q}.in_proj"], f"{n}/in_proj")
    z, xbc, dt = node("Split", [proj, const("sizes", np.array([inner, conv_dim, nh], np.int64))],
                      [f"{n}/z", f"{n}/xBC", f"{n}/dt_raw"], f"{n}/Split", axis=-1)
    xbc = causal_conv(g, xbc, f"{n}/conv", i, f"{q}.conv1d", conv_dim)
    xbc = op("Mul", [xbc, op("Sigmoid", [xbc], "conv_sigmoid")], "conv_silu")
    x, b, cc = node("Split", [xbc, const("xbc_sizes", np.array([inner, ng * ds, ng * ds], np.int64))],
                    [f"{n}/x", f"{n}/B", f"{n}/C"], f"{n}/Split_xBC", axis=-1)
    dt = op("Softplus", [op("Add", [dt, init(f"{q}.dt_bias", w.pop(f"{q}.dt_bias"))], "dt_biased")], "dt")
    dt = op("Transpose", [op("Reshape", [dt, const("rows_nh", np.array([-1, nh], np.int64))], "dt_rows")],
            "dt_T", perm=[1, 0])  # [nh, n]
    a_neg = -np.exp(w.pop(f"{q}.A_log").astype(np.float32))
    cum = op("CumSum", [op("Mul", [dt, const("A", a_neg[:, None])], "a"), const("time", np.array(1, np.int64))],
             "cum")  # [nh, n]: c_t
    diff = op("Sub", [op("Unsqueeze", [cum, const("ax2", np.array([2], np.int64))], "cum_t"),
                      op("Unsqueeze", [cum, const("ax1", np.array([1], np.int64))], "cum_s")], "diff")
    n_n = op("Shape", [diff], "diff_shape", start=1)  # [n, n]
    lower = op("Cast", [op("Trilu", [op("ConstantOfShape", [n_n], "ones", value=_one())], "lower_f", upper=0)],
               "lower", to=9)  # bool
    seg = op("Exp", [op("Where", [lower, diff, const("neg_inf", np.array(-np.inf, np.float32))], "masked")], "L")

    def heads(t: str, name: str) -> str:  # [1, n, ng * ds] -> [nh, n, ds] (a group's heads share it)
        t = op("Reshape", [t, const(f"{name}_g", np.array([-1, ng, 1, ds], np.int64))], f"{name}_groups")
        t = op("Expand", [t, const(f"{name}_e", np.array([1, ng, nh // ng, ds], np.int64))], f"{name}_exp")
        t = op("Reshape", [t, const(f"{name}_h", np.array([-1, nh, ds], np.int64))], f"{name}_heads")
        return op("Transpose", [t], f"{name}_T", perm=[1, 0, 2])

    bh, ch = heads(b, "B"), heads(cc, "C")
    xh = op("Transpose", [op("Reshape", [x, const("x_h", np.array([-1, nh, hd], np.int64))], "x_heads")],
            "x_T", perm=[1, 0, 2])  # [nh, n, hd]
    xdt = op("Mul", [xh, op("Unsqueeze", [dt, const("ax2b", np.array([2], np.int64))], "dt_col")], "xdt")
    cb = op("MatMul", [ch, op("Transpose", [bh], "B_TT", perm=[0, 2, 1])], "CB")  # [nh, n, n]
    y = op("MatMul", [op("Mul", [cb, seg], "M"), xdt], "y_diag")
    s0 = op("Reshape", [f"{SSM_IN}{i}", const("s_shape", np.array([nh, hd, ds], np.int64))], "S0")
    decay_in = op("Unsqueeze", [op("Exp", [cum], "exp_cum"), const("ax2c", np.array([2], np.int64))],
                  "exp_cum_col")  # [nh, n, 1]
    y_off = op("Mul", [op("MatMul", [ch, op("Transpose", [s0], "S0_T", perm=[0, 2, 1])], "CS0"), decay_in], "y_off")
    d = init(f"{q}.D", w.pop(f"{q}.D").astype(np.float32)[:, None, None])
    y = op("Add", [op("Add", [y, y_off], "y_ssm"), op("Mul", [xh, d], "Dx")], "y_heads")
    y = op("Reshape", [op("Transpose", [y], "y_T", perm=[1, 0, 2]), const("y_flat", np.array([1, -1, inner], np.int64))],
           "y")
    # the state after the last token
    last = op("Slice", [cum, const("last_s", np.array([-1], np.int64)), const("last_e", np.array([2 ** 62], np.int64)),
                        const("last_ax", np.array([1], np.int64))], "cum_last")  # [nh, 1]
    decay = op("Unsqueeze", [op("Exp", [op("Sub", [last, cum], "to_end")], "decay"),
                             const("ax2d", np.array([2], np.int64))], "decay_col")  # [nh, n, 1]
    new = op("MatMul", [op("Transpose", [op("Mul", [xdt, decay], "xdt_decay")], "xdt_T", perm=[0, 2, 1]), bh],
             "S_new_in")  # [nh, hd, ds]
    keep = op("Mul", [s0, op("Unsqueeze", [op("Exp", [last], "exp_last"), const("ax2e", np.array([2], np.int64))],
                             "exp_last_col")], "S_kept")
    node("Reshape", [op("Add", [keep, new], "S_new"), const("s_out", np.array([1, nh, hd, ds], np.int64))],
         [f"{SSM_OUT}{i}"], f"{n}/state")
    silu_z = op("Mul", [z, op("Sigmoid", [z], "z_sigmoid")], "z_silu")
    if falcon and not c.mamba_rms_norm:
        return g.linear(op("Mul", [y, silu_z], "gated"), [f"{q}.out_proj"], f"{n}/out_proj")
    before = falcon and c.mamba_norm_before_gate
    groups = ng if falcon else 1  # transformers: Falcon-H1 per group, Granite 4.0-H over the whole
    t = y if before else op("Mul", [y, silu_z], "gated")
    t = op("Reshape", [t, const("norm_groups", np.array([1, -1, groups, inner // groups], np.int64))], "grouped")
    t = node("SimplifiedLayerNormalization", [t, const("norm_ones", np.ones(inner // groups, np.float32))],
             [f"{n}/normed_g"], f"{n}/norm", axis=-1, epsilon=eps)
    t = op("Mul", [op("Reshape", [t, const("norm_flat", np.array([1, -1, inner], np.int64))], "normed_flat"),
                   init(f"{q}.norm.weight", w.pop(f"{q}.norm.weight"))], "normed")
    if before:
        t = op("Mul", [t, silu_z], "normed_gated")
    return g.linear(t, [f"{q}.out_proj"], f"{n}/out_proj")


def _one():
    from onnx import helper, TensorProto

    return helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
