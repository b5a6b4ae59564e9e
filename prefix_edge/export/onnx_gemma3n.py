"""Gemma 3n's text decoder in the own ONNX graph (export/onnx_graph.py builds the rest: the
inputs, the RoPE caches, the lm_head).

Gemma3nForConditionalGeneration's text path, read as transformers' Gemma3nForCausalLM
(export/text_only.py), every piece as modeling_gemma3n.py computes it:
- embeddings times sqrt(hidden); per-layer embeddings (a second table, [vocab, layers x P],
  times sqrt(P)) plus a projection of the embeddings (times hidden^-1/2, RMS-normed per layer),
  times 1/sqrt(2): one [P] input per layer. Ids past the per-layer table read row 0, as the
  multimodal class masks them.
- AltUp: four streams, [batch, seq, 4, hidden]. The first is the embeddings; the others their
  projections rescaled to its RMS. Each layer predicts the streams from a 4x4 mix per token
  (router: tanh of the RMS-normed active stream over hidden), runs the layer on the active one,
  corrects every stream by the innovation, and adds the per-layer input's gated projection to
  streams 1-3. At the end streams 1-3 are unprojected, rescaled, and the four averaged.
- LAuReL: a rank-r residual (left, right, a norm) beside attention; attention's output and
  LAuReL's summed, times 1/sqrt(2).
- Attention: q/k norms per head, v normed without a scale, scale 1, sliding layers with the
  local RoPE and GQA's window. KV-shared layers (the last num_kv_shared_layers) attend to the
  cache of the last earlier layer of their type: built by hand over that layer's present
  output (q rotated by RotaryEmbedding, KV heads repeated, each query masked by its own
  position: causal, and the window on sliding layers), so they have no past or present of
  their own and a sequence's KV is that of the other layers (E2B: 20 of 30), as llama.cpp's.
  The graph's metadata names the model's layer count (onnx_graph.MODEL_LAYERS).
- MLP: GELU-tanh, on the layers of activation_sparsity_pattern the gate first cut at its
  mean + std x Phi^-1(sparsity) (population std, as transformers; llama.cpp's uses n - 1).
- Final logit soft-capping: tanh(logits / cap) x cap (onnx_graph.py, after the lm_head).
Norm weights scale as they are (no 1 + w, unlike Gemma 3).
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

GEMMA3N = "Gemma3nForCausalLM"
TEXT_LAYERS = ("sliding_attention", "full_attention")


def gemma3n_config(hf_dir, refuse):
    """The text config as transformers reads it, refused (`refuse(what)`) where the graph cannot
    follow it."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(hf_dir))
    bad = [t for t in c.layer_types if t not in TEXT_LAYERS]
    if bad:
        raise refuse(f"{bad[0]!r} layers on Gemma 3n (it builds {', '.join(TEXT_LAYERS)})")
    if int(c.altup_active_idx) != 0:  # transformers' own merge and per-layer add assume stream 0
        raise refuse(f"altup_active_idx {c.altup_active_idx} on Gemma 3n")
    if "sliding_attention" in c.layer_types and not c.sliding_window:
        raise refuse("sliding_attention layers without a sliding_window on Gemma 3n")
    if c.hidden_activation != "gelu_pytorch_tanh":
        raise refuse(f"{c.hidden_activation!r} activation on Gemma 3n")
    return c


def kv_sources(layer_types: list[str], n_shared: int) -> list[int]:
    """For every layer, the layer whose keys and values it attends to (itself, or for a
    KV-shared layer the last non-shared layer of its type, as transformers finds it)."""
    first = len(layer_types) - n_shared
    out = list(range(len(layer_types)))
    if n_shared and first > 0:
        head = layer_types[:first]
        for i in range(first, len(layer_types)):
            out[i] = len(head) - 1 - head[::-1].index(layer_types[i])
    return out


def own_attention(b, q: str, k: str, v: str, i: int, p: str, n_heads: int, n_kv: int, window: int,
                  rope: list[str]) -> str:
    """Layer i's GroupQueryAttention over its own cache (past/present.{i}), scale 1, rotary
    inside, the window on a sliding layer: Gemma 3n's and Gemma 4's layers that hold KV."""
    attrs = dict(num_heads=n_heads, kv_num_heads=n_kv, do_rotary=1, scale=1.0)
    if window >= 0:
        attrs["local_window_size"] = window
    return b.node("GroupQueryAttention", [q, k, v, f"past_key_values.{i}.key", f"past_key_values.{i}.value",
                                          "seqlens_k", "total_sequence_length", *rope],
                  [f"/{p}/attn/out", f"present.{i}.key", f"present.{i}.value"], f"/{p}/attn/GroupQueryAttention",
                  domain="com.microsoft", **attrs)[0]


def shared_attention(b, q: str, src: int, window: int, rope: list[str], p: str, n_heads: int, n_kv: int,
                     head_dim: int) -> str:
    """Attention of the new tokens' queries over layer `src`'s cache as that layer's GQA left
    it (present.{src}: keys rotated, every position up to the buffer's end, those past each
    row's length stale): q rotated here, K/V heads repeated for the query heads, a mask of
    each query's causal (and sliding) window by position, scale 1. Gemma 3n's and Gemma 4's
    KV-shared layers (`b` the graph builder: node, init, positions)."""
    node, init, f32 = b.node, b.init, np.float32
    n = f"/{p}/attn/shared"

    def axes(name: str, v: list[int]) -> str:
        return init(name, np.array(v, np.int64))

    pos = b.positions()  # [b, s] each query's position
    qr = node("RotaryEmbedding", [q, pos, *rope], [n + "/q_rope"], n + "/Rope", domain="com.microsoft",
              interleaved=0, num_heads=n_heads)
    qh = node("Transpose", [node("Reshape", [qr, axes(n + "/q_shape", [0, 0, n_heads, head_dim])], [n + "/q4"],
                                 n + "/QReshape")], [n + "/q"], n + "/QTranspose", perm=[0, 2, 1, 3])
    group = n_heads // n_kv

    def heads(t: str, name: str) -> str:  # [b, kv, L, d] -> [b, heads, L, d]
        if group == 1:
            return t
        x = node("Unsqueeze", [t, axes(f"{n}/{name}_axis2", [2])], [f"{n}/{name}5"], f"{n}/{name}Unsqueeze")
        shape = node("Concat", [node("Shape", [t], [f"{n}/{name}_shape"], f"{n}/{name}Shape", start=0, end=2),
                                init(f"{n}/{name}_group", np.array([group], np.int64)),
                                node("Shape", [t], [f"{n}/{name}_tail"], f"{n}/{name}Tail", start=2)],
                     [f"{n}/{name}_expand"], f"{n}/{name}ExpandShape", axis=0)
        x = node("Expand", [x, shape], [f"{n}/{name}_rep"], f"{n}/{name}Expand")
        return node("Reshape", [x, axes(f"{n}/{name}_heads", [0, n_heads, -1, head_dim])], [f"{n}/{name}"],
                    f"{n}/{name}Reshape")

    k = heads(f"present.{src}.key", "k")
    v = heads(f"present.{src}.value", "v")
    scores = node("MatMul", [qh, node("Transpose", [k], [n + "/kT"], n + "/KTranspose", perm=[0, 1, 3, 2])],
                  [n + "/scores"], n + "/Scores")  # [b, h, s, L]
    # key j is seen by query position t when j <= t (and t - window < j): [b, 1, s, L]
    length = node("Gather", [node("Shape", [f"present.{src}.key"], [n + "/kv_shape"], n + "/KvShape"),
                             init(n + "/len_axis", np.array(2, np.int64))], [n + "/len"], n + "/Len")
    j = node("Range", [init(n + "/zero", np.array(0, np.int64)), length, init(n + "/one", np.array(1, np.int64))],
             [n + "/j"], n + "/Range")
    t = node("Unsqueeze", [pos, axes(n + "/t_axes", [1, 3])], [n + "/t"], n + "/TUnsqueeze")
    seen = node("LessOrEqual", [j, t], [n + "/causal"], n + "/Causal")
    if window >= 0:
        near = node("Greater", [j, node("Sub", [t, init(n + "/window", np.array(window, np.int64))], [n + "/t_w"],
                                        n + "/TWindow")], [n + "/near"], n + "/Near")
        seen = node("And", [seen, near], [n + "/seen"], n + "/Seen")
    mask = node("Where", [seen, init(n + "/keep", np.array(0.0, f32)), init(n + "/drop", np.array(-np.inf, f32))],
                [n + "/mask"], n + "/Mask")
    probs = node("Softmax", [node("Add", [scores, mask], [n + "/masked"], n + "/AddMask")], [n + "/probs"],
                 n + "/Softmax", axis=-1)
    o = node("MatMul", [probs, v], [n + "/o"], n + "/Out")  # [b, h, s, d]
    o = node("Transpose", [o], [n + "/o_t"], n + "/OTranspose", perm=[0, 2, 1, 3])
    return node("Reshape", [o, axes(n + "/o_shape", [0, 0, n_heads * head_dim])], [n + "/out"], n + "/OReshape")


def per_layer_inputs(b, x0: str, n_layers: int, ple: int, hidden: int) -> str:
    """The per-layer inputs [b, s, layers, P] of Gemma 3n and Gemma 4 from the token ids and the
    scaled embeddings `x0`: a second table's rows times sqrt(P) (ids past it read row 0, as the
    multimodal classes mask them), plus the embeddings' projection times hidden^-1/2, RMS-normed
    per layer; the sum times 1/sqrt(2)."""
    w, init, node, linear, norm = b.w, b.init, b.node, b.linear, b.norm

    def scaled(x: str, v: float, name: str) -> str:
        return node("Mul", [x, init(name + "/c", np.array(v, np.float32))], [name + "/out"], name)

    table = w.pop("model.embed_tokens_per_layer.weight")
    ids = node("Where", [node("Less", ["input_ids", init("/ple/rows", np.array(table.shape[0], np.int64))],
                              ["/ple/in_table"], "/ple/Less"), "input_ids", init("/ple/zero", np.array(0, np.int64))],
               ["/ple/ids"], "/ple/Where")
    per = node("Gather", [init("model.embed_tokens_per_layer.weight", table), ids], ["/ple/rows_out"], "/ple/Gather")
    shape4 = init("/ple/shape", np.array([0, 0, n_layers, ple], np.int64))
    per = node("Reshape", [scaled(per, ple ** 0.5, "/ple/scaled"), shape4], ["/ple/per"], "/ple/Reshape")
    proj = linear(x0, ["model.per_layer_model_projection"], "/ple/projection")
    proj = node("Reshape", [scaled(proj, hidden ** -0.5, "/ple/proj_scaled"), shape4], ["/ple/proj4"], "/ple/ReshapeProj")
    proj = norm(proj, "model.per_layer_projection_norm.weight", "/ple/norm")
    return scaled(node("Add", [proj, per], ["/ple/sum"], "/ple/Add"), 2 ** -0.5, "/ple/inputs")


def gemma3n_decoder(b, tc, n_heads: int, n_kv: int, head_dim: int, windows: list[int], local: list[bool]) -> str:
    """Nodes from input_ids to the final norm's output, whose name it returns; `b` the builder
    (w, init, node, linear, norm, head_norm, eps), `tc` the text config (gemma3n_config)."""
    w, init, node, linear, norm, head_norm = b.w, b.init, b.node, b.linear, b.norm, b.head_norm
    hidden, n_layers = int(tc.hidden_size), int(tc.num_hidden_layers)
    ple, n_alt, act_idx = int(tc.hidden_size_per_layer_input), int(tc.altup_num_inputs), int(tc.altup_active_idx)
    sources = kv_sources(list(tc.layer_types), int(tc.num_kv_shared_layers or 0))
    f32 = np.float32

    def const(name: str, v) -> str:
        return init(name, np.asarray(v, f32))

    def mul(x: str, c: str, name: str) -> str:
        return node("Mul", [x, c], [name + "/out"], name)

    def axes(name: str, v: list[int]) -> str:
        return init(name, np.array(v, np.int64))

    def pick(x: str, i: int, name: str) -> str:  # stream i of [b, s, streams, h]: [b, s, h]
        one = node("Gather", [x, init(name + "/index", np.array([i], np.int64))], [name + "/one"], name, axis=2)
        return node("Squeeze", [one, "/g3n/axis2"], [name + "/out"], name + "/Squeeze")

    def rms(x: str, name: str) -> str:  # sqrt(max(mean(x^2), 1e-5)) over the last axis, kept
        sq = node("Mul", [x, x], [name + "/sq"], name + "/Sq")
        m = node("ReduceMean", [sq, "/g3n/last_axis"], [name + "/mean"], name + "/Mean", keepdims=1)
        return node("Sqrt", [node("Max", [m, "/g3n/eps"], [name + "/max"], name + "/Max")], [name + "/out"], name + "/Sqrt")

    def mag(x: str, name: str) -> str:  # sqrt(mean(x^2)) of [b, s, h]: [b, s, 1, 1] (no epsilon)
        sq = node("Mul", [x, x], [name + "/sq"], name + "/Sq")
        m = node("ReduceMean", [sq, "/g3n/last_axis"], [name + "/mean"], name + "/Mean", keepdims=1)
        return node("Unsqueeze", [node("Sqrt", [m], [name + "/sqrt"], name + "/Sqrt"), "/g3n/axis2"], [name + "/out"],
                    name + "/Unsqueeze")

    routers: dict[str, tuple[str, str]] = {}  # a layer's router weights (read twice: predict, correct)

    def router(x: str, p: str, name: str) -> str:  # tanh(W (rmsnorm(x) / hidden)): [b, s, streams]
        if p not in routers:
            routers[p] = (init(f"{p}.altup.router_norm.weight", w.pop(f"{p}.altup.router_norm.weight")),
                          init(f"{p}.altup.modality_router.weight_T", w.pop(f"{p}.altup.modality_router.weight").T))
        nw, rw = routers[p]
        r = node("SimplifiedLayerNormalization", [x, nw], [name + "/norm"], name + "/Norm", axis=-1, epsilon=b.eps)
        r = node("MatMul", [mul(r, const(name + "/scale", 1.0 / hidden), name + "/scaled"), rw], [name + "/router"],
                 name + "/MatMul")
        return node("Tanh", [r], [name + "/out"], name + "/Tanh")

    def mlp(h: str, p: str, i: int) -> str:
        gate = linear(h, [f"{p}.mlp.gate_proj"], f"/{p}/mlp/gate_proj")
        up = linear(h, [f"{p}.mlp.up_proj"], f"/{p}/mlp/up_proj")
        s = float(tc.activation_sparsity_pattern[i]) if tc.activation_sparsity_pattern else 0.0
        if s > 0.0:  # gaussian top-k: relu(g - (mean + std * z)), population std
            n = f"/{p}/mlp/sparsity"
            mean = node("ReduceMean", [gate, "/g3n/last_axis"], [n + "/mean"], n + "/Mean", keepdims=1)
            dev = node("Sub", [gate, mean], [n + "/dev"], n + "/Dev")
            var = node("ReduceMean", [node("Mul", [dev, dev], [n + "/dev2"], n + "/Dev2"), "/g3n/last_axis"],
                       [n + "/var"], n + "/Var", keepdims=1)
            std = node("Sqrt", [var], [n + "/std"], n + "/Std")
            cut = node("Add", [mean, mul(std, const(n + "/z", NormalDist().inv_cdf(s)), n + "/z_std")], [n + "/cut"], n + "/Cut")
            gate = node("Relu", [node("Sub", [gate, cut], [n + "/sub"], n + "/Sub")], [n + "/out"], n + "/Relu")
        act = node("FastGelu", [gate], [f"/{p}/mlp/gelu"], f"/{p}/mlp/FastGelu", domain="com.microsoft")
        return linear(node("Mul", [act, up], [f"/{p}/mlp/gated"], f"/{p}/mlp/Mul"), [f"{p}.mlp.down_proj"], f"/{p}/mlp/down_proj")

    init("/g3n/last_axis", np.array([-1], np.int64))
    unsq2 = init("/g3n/axis2", np.array([2], np.int64))
    init("/g3n/eps", np.array(1e-5, f32))
    # embeddings, and the per-layer inputs [b, s, layers, P]
    x0 = node("Gather", [init("model.embed_tokens.weight", w["model.embed_tokens.weight"]), "input_ids"],
              ["/model/embed_tokens/out"], "/model/embed_tokens/Gather")
    x0 = mul(x0, const("embed_scale", hidden ** 0.5), "/model/embed_tokens/scaled")
    per_layer = per_layer_inputs(b, x0, n_layers, ple, hidden)
    # AltUp's streams [b, s, 4, h]: the embeddings, then their projections at the embeddings' RMS
    target = mag(x0, "/altup/target")
    rest = linear(x0, [f"model.altup_projections.{k}" for k in range(n_alt - 1)], "/altup/projections")
    rest = node("Reshape", [rest, axes("/altup/shape", [0, 0, n_alt - 1, hidden])], ["/altup/rest"], "/altup/Reshape")
    rest = node("Div", [mul(rest, target, "/altup/times_target"), rms(rest, "/altup/rest_rms")], ["/altup/rescaled"], "/altup/Div")
    streams = node("Concat", [node("Unsqueeze", [x0, unsq2], ["/altup/first"], "/altup/Unsqueeze"), rest],
                   ["/altup/streams"], "/altup/Concat", axis=2)
    mask = init("/altup/not_active", np.array([[0.0] if k == act_idx else [1.0] for k in range(n_alt)], f32))
    for i in range(n_layers):
        p = f"model.layers.{i}"
        # predict: streams + coefs @ streams, coefs [b, s, 4, 4] from the active stream's router
        coefs = linear(router(pick(streams, act_idx, f"/{p}/altup/active_in"), p, f"/{p}/altup/predict_router"),
                       [f"{p}.altup.prediction_coefs"], f"/{p}/altup/prediction_coefs")
        coefs = node("Reshape", [coefs, axes(f"/{p}/altup/coef_shape", [0, 0, n_alt, n_alt])], [f"/{p}/altup/coefs"],
                     f"/{p}/altup/CoefReshape")
        pred = node("Add", [streams, node("MatMul", [coefs, streams], [f"/{p}/altup/mixed"], f"/{p}/altup/Mix")],
                    [f"/{p}/altup/pred"], f"/{p}/altup/Predict")
        active = pick(pred, act_idx, f"/{p}/altup/active")
        h = norm(active, f"{p}.input_layernorm.weight", f"/{p}/ln1")
        lr = linear(linear(h, [f"{p}.laurel.linear_left"], f"/{p}/laurel/left"), [f"{p}.laurel.linear_right"], f"/{p}/laurel/right")
        laurel = node("Add", [h, norm(lr, f"{p}.laurel.post_laurel_norm.weight", f"/{p}/laurel/norm")], [f"/{p}/laurel/out"],
                      f"/{p}/laurel/Add")
        # attention
        q = head_norm(linear(h, [f"{p}.self_attn.q_proj"], f"/{p}/attn/q_proj"), f"{p}.self_attn.q_norm.weight", n_heads,
                      f"/{p}/attn/q_norm")
        if sources[i] == i:
            k = head_norm(linear(h, [f"{p}.self_attn.k_proj"], f"/{p}/attn/k_proj"), f"{p}.self_attn.k_norm.weight", n_kv,
                          f"/{p}/attn/k_norm")
            w[f"{p}.self_attn.v_norm.weight"] = np.ones(head_dim, f32)  # v normed without a scale
            v = head_norm(linear(h, [f"{p}.self_attn.v_proj"], f"/{p}/attn/v_proj"), f"{p}.self_attn.v_norm.weight", n_kv,
                          f"/{p}/attn/v_norm")
        rope = [f"{t}_cache{'_local' if local[i] else ''}" for t in ("cos", "sin")]
        if sources[i] == i:
            a = own_attention(b, q, k, v, i, p, n_heads, n_kv, windows[i], rope)
        else:  # KV-shared: attends to its source's cache, no KV of its own (unused weights dropped)
            for t in ("k_proj", "v_proj", "k_norm"):
                w.pop(f"{p}.self_attn.{t}.weight", None)
            a = shared_attention(b, q, sources[i], windows[i], rope, p, n_heads, n_kv, head_dim)
        attn = norm(linear(a, [f"{p}.self_attn.o_proj"], f"/{p}/attn/o_proj"), f"{p}.post_attention_layernorm.weight",
                    f"/{p}/post_attn_norm")
        gated = node("Add", [active, attn], [f"/{p}/attn_gated"], f"/{p}/AddAttn")
        attn_laurel = mul(node("Add", [gated, laurel], [f"/{p}/attn_laurel_sum"], f"/{p}/AddLaurel"),
                          const(f"/{p}/half", 2 ** -0.5), f"/{p}/attn_laurel")
        ffw = norm(mlp(norm(attn_laurel, f"{p}.pre_feedforward_layernorm.weight", f"/{p}/ln2"), p, i),
                   f"{p}.post_feedforward_layernorm.weight", f"/{p}/post_ff_norm")
        activated = node("Add", [attn_laurel, ffw], [f"/{p}/activated"], f"/{p}/AddFfw")
        # correct: every stream + innovation x (coef + 1)
        cc = linear(router(activated, p, f"/{p}/altup/correct_router"), [f"{p}.altup.correction_coefs"],
                    f"/{p}/altup/correction_coefs")
        cc = node("Unsqueeze", [node("Add", [cc, const(f"/{p}/altup/one", 1.0)], [f"/{p}/altup/cc1"], f"/{p}/altup/AddOne"),
                                axes(f"/{p}/altup/axis3", [3])], [f"/{p}/altup/cc"], f"/{p}/altup/UnsqueezeCc")
        innov = node("Unsqueeze", [node("Sub", [activated, active], [f"/{p}/altup/innov"], f"/{p}/altup/Innovation"), unsq2],
                     [f"/{p}/altup/innov4"], f"/{p}/altup/UnsqueezeInnov")
        corrected = node("Add", [pred, node("Mul", [innov, cc], [f"/{p}/altup/delta"], f"/{p}/altup/Delta")],
                         [f"/{p}/altup/corrected"], f"/{p}/altup/Correct")
        # the per-layer input, gated by the corrected active stream, into streams 1-3
        first = pick(corrected, act_idx, f"/{p}/altup/first")
        if tc.altup_correct_scale:
            first = mul(first, init(f"{p}.altup.correct_output_scale", w.pop(f"{p}.altup.correct_output_scale")),
                        f"/{p}/altup/scaled")
        g = node("FastGelu", [linear(first, [f"{p}.per_layer_input_gate"], f"/{p}/ple/gate")], [f"/{p}/ple/gelu"],
                 f"/{p}/ple/FastGelu", domain="com.microsoft")
        g = node("Mul", [g, pick(per_layer, i, f"/{p}/ple/input")], [f"/{p}/ple/gated"], f"/{p}/ple/Mul")
        g = norm(linear(g, [f"{p}.per_layer_projection"], f"/{p}/ple/projection"), f"{p}.post_per_layer_input_norm.weight",
                 f"/{p}/ple/norm")
        g = mul(node("Unsqueeze", [g, unsq2], [f"/{p}/ple/g4"], f"/{p}/ple/Unsqueeze"), mask, f"/{p}/ple/masked")
        streams = node("Add", [corrected, g], [f"/{p}/streams"], f"/{p}/AddPle")
    # merge: streams 1-3 unprojected and rescaled to the active stream's RMS, the four averaged
    s0 = pick(streams, act_idx, "/altup/final_active")
    others = [k for k in range(n_alt) if k != act_idx]
    rest = node("Gather", [streams, init("/altup/others", np.array(others, np.int64))], ["/altup/final_rest"],
                "/altup/GatherRest", axis=2)
    un = np.stack([w.pop(f"model.altup_unembed_projections.{k}.weight").T for k in range(n_alt - 1)])  # [3, h, h]
    rest = node("Einsum", [rest, init("model.altup_unembed_projections", un)], ["/altup/unembedded"], "/altup/Unembed",
                equation="bskh,khg->bskg")
    rest = node("Div", [mul(rest, mag(s0, "/altup/final_target"), "/altup/final_times"), rms(rest, "/altup/final_rms")],
                ["/altup/final_rescaled"], "/altup/FinalDiv")
    merged = node("Concat", [node("Unsqueeze", [s0, unsq2], ["/altup/final_first"], "/altup/FinalUnsqueeze"), rest],
                  ["/altup/final_streams"], "/altup/FinalConcat", axis=2)
    mean = node("ReduceMean", [merged, unsq2], ["/altup/mean"], "/altup/Mean", keepdims=0)
    return norm(mean, "model.norm.weight", "/model/norm")
