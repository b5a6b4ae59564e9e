"""ONNX weight quantization through onnxruntime.quantization.

- int4 (Int4Recipe; default chosen by the trained demo tasks' held-out scores, README
  "Choosing the quantization"): the decoder's MatMuls as GGUF Q4_1 (MatMulNBits + per-block
  minimum, quantize/q4_1.py), LM head as 8-bit MatMulNBits and embedding as 8-bit
  GatherBlockQuantized (both llama.cpp's Q8_0: the default model's own types), accuracy_level 4. Activations are quantized per row
  block, so prefilling P+U tokens or P then U gives the same numbers: baked prefixes stay exact.
- int8: dynamic (DynamicQuantizeLinear + MatMulInteger). One activation scale per input tensor,
  so a baked prefix and a full prefill see different scales: not exact (see README).

The deployed graph is then optimized offline (`optimize_onnx`, ORT's EXTENDED level: the
hardware-independent fusions), so opening it at run time skips most graph rewriting: measured
here 1.9 s instead of 3.4 s to create the session of the default model, same logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import PrefixEdgeError

CHOICES = ("none", "int8", "int4")


@dataclass(frozen=True)
class Int4Recipe:
    """How `int4` quantizes: the decoder's MatMuls at 4 bits (blocks of `block` along the input
    dim, symmetric or with zero points, `accuracy` = MatMulNBits' accuracy_level: 4 computes with
    int8 activations, 0 with fp32), and the tied embedding table / LM head at `embed` / `head`
    bits (4, 8, or 32 = left fp32); `q41=1` writes the decoder's MatMuls as GGUF Q4_1 instead
    (blocks of 32, a scale and a float minimum each: quantize/q4_1.py; exact for weights that
    came from a Q4_1 file). Written `int4` (the default recipe) or
    `int4:block=32,sym=1,acc=4,embed=8,head=8,q41=0`."""

    block: int = 32
    sym: bool = True
    acc: int = 4
    embed: int = 8
    head: int = 8
    q41: bool = True

    @classmethod
    def parse(cls, spec: str) -> "Int4Recipe":
        name, _, args = spec.partition(":")
        if name != "int4":
            raise PrefixEdgeError(f"unknown quantization {spec!r}; choose one of {', '.join(CHOICES)}")
        fields = {}
        for item in filter(None, args.split(",")):
            key, _, value = item.partition("=")
            if key not in cls.__dataclass_fields__ or not value.isdigit():
                raise PrefixEdgeError(f"{spec!r}: {item!r} is not KEY=NUMBER with KEY one of "
                                      f"{', '.join(cls.__dataclass_fields__)}")
            fields[key] = bool(int(value)) if key in ("sym", "q41") else int(value)
        r = cls(**fields)
        if r.block not in (16, 32, 64, 128, 256) or r.acc not in (0, 1, 2, 3, 4) \
                or r.embed not in (4, 8, 32) or r.head not in (4, 8, 32):
            raise PrefixEdgeError(f"{spec!r}: block is 16..256 (a power of two), acc 0..4, "
                                  "embed and head 4, 8 or 32")
        return r


def _int4(src: Path, dst: Path, r: Int4Recipe) -> None:
    """MatMulNBits for the decoder's MatMuls, and for the LM head / GatherBlockQuantized for the
    embedding at their own bit widths (one quantizer pass per width)."""
    import logging

    import numpy as np
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.ERROR)
    model = onnx.load(str(src), load_external_data=True)
    head = [n.name for n in model.graph.node if n.op_type == "MatMul" and "lm_head" in n.name]
    embed = [n.name for n in model.graph.node if n.op_type == "Gather"
             and any(i.name == n.input[0] for i in model.graph.initializer)]
    body = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in head]
    if r.q41:
        from .q4_1 import apply

        if r.head == 4:  # a 4-bit head in the Q4_1 form too (its float minimum fits better)
            body, head = body + head, []
        done = apply(model, body, r.acc)
        body = [n for n in body if n not in done]  # e.g. an input dim that is no multiple of 32
    passes = [(4, r.block, r.sym, body, ("MatMul",))] if body else []
    if r.head != 32 and head:  # at 8 bits: symmetric blocks of 32, llama.cpp's Q8_0
        passes.append((r.head, 32 if r.head == 8 else r.block, r.sym or r.head == 8, head, ("MatMul",)))
    if r.embed == 4 and embed:
        passes.append((4, r.block, r.sym, embed, ("Gather",)))
    elif r.embed == 8:  # the quantizer does 4-bit Gathers only; the op itself takes 8 bits
        for name in embed:
            _gather_q8(model, name)
    for bits, block, sym, names, ops in passes:
        # nodes_to_include only adds to op_types_to_quantize: exclude every other node of the type
        others = [n.name for n in model.graph.node if n.op_type in ops and n.name not in names]
        q = MatMulNBitsQuantizer(model, bits=bits, block_size=block, is_symmetric=sym,
                                 accuracy_level=r.acc, nodes_to_exclude=others,
                                 op_types_to_quantize=ops, quant_axes=(("MatMul", 0), ("Gather", 1)))
        with np.errstate(divide="ignore", invalid="ignore"):  # all-zero blocks (e.g. a pad row)
            q.process()
        model = q.model.model
    _save(model, dst)


def quantize_onnx(src: Path, dst: Path, method: str) -> None:
    """Quantize the graph at `src` (its external data beside it) into `dst` (one .onnx file,
    with `dst`.onnx_data when it exceeds protobuf's 2 GB)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if method == "none":
        import onnx

        model = onnx.load(str(src), load_external_data=True)
        _save(model, dst)
    elif method == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        import onnx

        # the fused graph has contrib ops (RotaryEmbedding...) whose outputs ONNX shape
        # inference cannot type: they are float
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8,
                         use_external_data_format=False,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    elif method.startswith("int4"):
        _int4(src, dst, Int4Recipe.parse(method))
    else:
        raise PrefixEdgeError(f"unknown quantization {method!r}; choose one of {', '.join(CHOICES)}")
    optimize_onnx(dst)


def optimize_onnx(path: Path) -> None:
    """Rewrite the graph at `path` in place with ORT's offline EXTENDED optimizations."""
    import onnxruntime as ort

    tmp = path.with_name(path.stem + ".opt.onnx")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(tmp)
    if path.stat().st_size > 1_900_000_000:
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                      path.name + "_data")
    ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    tmp.replace(path)


def _gather_q8(model, node_name: str, block: int = 32) -> None:
    """Replace the Gather `node_name` over an fp32 table by GatherBlockQuantized at 8 bits:
    symmetric blocks of `block` along the hidden dim (llama.cpp's Q8_0), uint8 with zero point 128."""
    import numpy as np
    from onnx import helper, numpy_helper

    from .blocks import q8_0

    g = model.graph
    node = next(n for n in g.node if n.name == node_name)
    init = next(i for i in g.initializer if i.name == node.input[0])
    w = numpy_helper.to_array(init).astype(np.float32)
    shared = sum(i == init.name for n in g.node for i in n.input) > 1
    if w.ndim != 2 or w.shape[1] % block or shared:
        return  # not a [vocab, hidden] table in whole blocks, or tied to another node: left fp32
    q, scale = q8_0(w, block)
    data = (q.astype(np.int16) + 128).astype(np.uint8).reshape(w.shape)
    prefix = init.name
    g.initializer.remove(init)
    g.initializer.extend([numpy_helper.from_array(data, prefix + "_Q8"),
                          numpy_helper.from_array(scale.astype(np.float32), prefix + "_scales"),
                          numpy_helper.from_array(np.full(scale.shape, 128, np.uint8), prefix + "_zp")])
    new = helper.make_node("GatherBlockQuantized", [prefix + "_Q8", node.input[1], prefix + "_scales",
                                                     prefix + "_zp"], list(node.output),
                           name=node.name + "_Q8", domain="com.microsoft", bits=8, block_size=block,
                           gather_axis=0, quantize_axis=1)
    idx = list(g.node).index(node)
    g.node.remove(node)
    g.node.insert(idx, new)


def _save(model, dst: Path) -> None:
    import onnx

    large = model.ByteSize() > 1_900_000_000
    if large:
        onnx.save_model(model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=dst.name + "_data")
    else:
        onnx.save_model(model, str(dst))
