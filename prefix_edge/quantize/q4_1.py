"""GGUF Q4_1's scheme in an ONNX graph: MatMulNBits plus a per-block minimum.

Q4_1 stores a weight block of 32 as w = d·q + m (q in 0..15, one scale d and one minimum m per
block). MatMulNBits has integer zero points only, so m cannot ride in it: re-quantizing Q4_1
weights to int4 with a zero point moves every value by up to half a step again (the default
model ships as Q4_1, so its ONNX int4 graph would carry two rounding errors). Written exactly:

    x·w = Σ_b d_b · Σ_{k∈b} x_k q_k  +  Σ_b m_b · Σ_{k∈b} x_k
        = MatMulNBits(x; q, d, zero point 0)  +  BlockSum(x) · M

BlockSum(x) ([…, K/32]) is computed once per input tensor (q/k/v share one, gate/up another)
and M is the [K/32, N] fp32 table of minimums. For weights that came out of Q4_1 this is their
exact value (d and m are recovered per block: the block's minimum and (max - min)/15); for other
weights it is llama.cpp's Q4_1 quantization of them.
"""

from __future__ import annotations

import numpy as np

BLOCK = 32


def q4_1_blocks(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w [K, N] (MatMul's B) → q [N, K/32, 32] uint8, d [N, K/32], m [N, K/32] (fp32)."""
    wt = np.ascontiguousarray(w.T, dtype=np.float32)  # [N, K]
    n, k = wt.shape
    blocks = wt.reshape(n, k // BLOCK, BLOCK)
    lo, hi = blocks.min(-1), blocks.max(-1)
    d = (hi - lo) / 15
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d[..., None] > 0, np.round((blocks - lo[..., None]) / d[..., None]), 0)
    return q.clip(0, 15).astype(np.uint8), d.astype(np.float32), lo.astype(np.float32)


def apply(model, node_names: list[str], accuracy_level: int) -> list[str]:
    """Replace each MatMul in `node_names` (fp32 initializer B [K, N], K % 32 == 0) by the Q4_1
    form above; returns the names of those replaced."""
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    order = list(g.node)
    sums: dict[str, str] = {}  # input tensor -> its block sums
    done = []
    new_nodes = []
    for node in order:
        b = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        shared = b is not None and sum(b.name in n.input for n in order) > 1
        if node.name not in node_names or b is None or shared or len(b.dims) != 2 or b.dims[0] % BLOCK:
            new_nodes.append(node)
            continue
        w = numpy_helper.to_array(b)
        k, n = w.shape
        q, d, m = q4_1_blocks(w)
        packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)  # [N, K/32, 16]
        nb = k // BLOCK
        zp = np.zeros((n, (nb + 1) // 2), np.uint8)  # zero point 0: w = d·q (+ m below)
        base = node.name.replace("/", "_").strip("_")
        g.initializer.extend([numpy_helper.from_array(packed, base + "_Q4"),
                              numpy_helper.from_array(d.reshape(-1), base + "_scales"),
                              numpy_helper.from_array(zp.reshape(-1), base + "_zp"),
                              numpy_helper.from_array(np.ascontiguousarray(m.T), base + "_mins")])
        x, y = node.input[0], node.output[0]
        if x not in sums:
            shape = base + "_bs_shape"
            g.initializer.append(numpy_helper.from_array(np.array([0, 0, nb, BLOCK], np.int64), shape))
            new_nodes += [helper.make_node("Reshape", [x, shape], [x + "/blocks"], name=base + "/BlockReshape"),
                          helper.make_node("ReduceSum", [x + "/blocks", base + "_axis"], [x + "/blocksum"],
                                           name=base + "/BlockSum", keepdims=0)]
            g.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), base + "_axis"))
            sums[x] = x + "/blocksum"
        new_nodes += [
            helper.make_node("MatMulNBits", [x, base + "_Q4", base + "_scales", base + "_zp"],
                             [y + "/dq"], name=base + "/MatMulNBits", domain="com.microsoft",
                             K=k, N=n, bits=4, block_size=BLOCK, accuracy_level=accuracy_level),
            helper.make_node("MatMul", [sums[x], base + "_mins"], [y + "/min"], name=base + "/MinMatMul"),
            helper.make_node("Add", [y + "/dq", y + "/min"], [y], name=base + "/MinAdd")]
        g.initializer.remove(b)
        done.append(node.name)
    g.ClearField("node")
    g.node.extend(new_nodes)
    return done
