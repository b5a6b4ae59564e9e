"""ONNX int4 recipes (quantize/onnx.py, quantize/q4_1.py) on real graphs of the tiny model:
Q4_1 weights come through exactly, the default recipe's ops and bit widths, and bad recipes are
one-line refusals."""

from __future__ import annotations

import numpy as np
import pytest

from prefix_edge.errors import PrefixEdgeError
from prefix_edge.quantize.onnx import Int4Recipe, quantize_onnx
from prefix_edge.quantize.q4_1 import q4_1_blocks


@pytest.fixture(scope="module")
def fp32_graph(tiny_model, tmp_path_factory):
    from prefix_edge.export.onnx_graph import build_onnx

    return build_onnx(tiny_model, tmp_path_factory.mktemp("g"))


def _logits(path, ids=(5, 17, 42, 99, 7)):
    import onnxruntime as ort

    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    n = len(ids)
    feeds = {"input_ids": np.array([ids], np.int64), "seqlens_k": np.array([n - 1], np.int32),
             "total_sequence_length": np.array(n, np.int32)}
    for i in s.get_inputs():
        if i.name.startswith("past_key_values."):
            feeds[i.name] = np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
    return s.run(["logits"], feeds)[0]


def _as_q4_1(src, dst):
    """The graph with every decoder MatMul's weights replaced by their Q4_1 values (f16 d and m,
    as a GGUF file stores them): what a de-quantized Q4_1 model holds."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(src))
    names = {n.input[1] for n in m.graph.node if n.op_type == "MatMul" and "lm_head" not in n.name}
    for i, init in enumerate(m.graph.initializer):
        if init.name in names:
            w = numpy_helper.to_array(init)
            q, d, lo = q4_1_blocks(w)
            d, lo = d.astype(np.float16).astype(np.float32), lo.astype(np.float16).astype(np.float32)
            v = (q * d[..., None] + lo[..., None]).reshape(w.shape[1], w.shape[0]).T
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(v, np.float32), init.name))
    onnx.save(m, str(dst))
    return dst


def test_q4_1_weights_are_exact(fp32_graph, tmp_path):
    """fp32 activations (acc=0): the Q4_1 form reproduces Q4_1 weights to float precision, where
    re-quantizing them to int4 with an integer zero point (q41=0, sym=0) does not."""
    src = _as_q4_1(fp32_graph, tmp_path / "q41src.onnx")
    ref = _logits(src)
    exact = tmp_path / "exact.onnx"
    quantize_onnx(src, exact, "int4:q41=1,acc=0,head=32,embed=32")
    assert np.abs(_logits(exact) - ref).max() < 1e-4
    requant = tmp_path / "requant.onnx"
    quantize_onnx(src, requant, "int4:q41=0,sym=0,acc=0,head=32,embed=32")
    assert np.abs(_logits(requant) - ref).max() > 100 * np.abs(_logits(exact) - ref).max()


def test_default_recipe_ops(fp32_graph, tmp_path):
    import onnx

    out = tmp_path / "int4.onnx"
    quantize_onnx(fp32_graph, out, "int4")
    g = onnx.load(str(out)).graph
    attrs = lambda n: {a.name: a.i for a in n.attribute}  # noqa: E731
    nbits = [n for n in g.node if n.op_type == "MatMulNBits"]
    head = [n for n in nbits if "lm_head" in n.name]
    assert len(head) == 1 and attrs(head[0])["bits"] == 8
    body = [n for n in nbits if n not in head]
    assert len(body) == 2 * 4 and all(attrs(n)["bits"] == 4 and attrs(n)["accuracy_level"] == 4 for n in body)
    emb = [n for n in g.node if n.op_type == "GatherBlockQuantized"]
    assert len(emb) == 1 and attrs(emb[0])["bits"] == 8
    assert not [n for n in g.node if n.op_type == "MatMul" and "lm_head" in n.name]
    ref = _logits(fp32_graph)
    assert np.argmax(_logits(out)[0, -1]) == np.argmax(ref[0, -1])


@pytest.mark.parametrize("spec", ["int4:block=7", "int4:head=5", "int4:q41", "int4:foo=1", "int5"])
def test_bad_recipes_refused(spec):
    with pytest.raises(PrefixEdgeError) as e:
        Int4Recipe.parse(spec)
    assert "\n" not in str(e.value) and spec.split(":")[0] in str(e.value)


def test_recipe_defaults():
    assert Int4Recipe.parse("int4") == Int4Recipe(block=32, sym=True, acc=4, embed=8, head=8, q41=True)
    assert Int4Recipe.parse("int4:q41=0,head=4,embed=4") == Int4Recipe(embed=4, head=4, q41=False)
