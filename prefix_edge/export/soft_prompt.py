"""Soft prompts (PEFT prompt tuning / P-tuning) through the deployed ONNX graph, at export.

The optimum decoder graph takes `input_ids` only, and a soft prompt has no ids. The route here:
at export, copy the *deployed* (already quantized) graph with one edit, its token-embedding
lookup (`Gather(embed_tokens, input_ids)`, int4's `GatherBlockQuantized`, or a `Gather` of
int8 rows followed by `DequantizeLinear`) removed and its output tensor turned into a graph input; run the
soft prompt's embeddings through that copy once (positions 0..V-1, no past) and keep the
`present.*` tensors as the task's first V KV positions. The copy is thrown away; the bundle
ships only the unchanged graph and the KV.

Why this route: every weight, kernel and quantization scheme that computes the virtual KV is the
deployed one, so the soft-prompt KV is what the deployed model would compute if it could take
embeddings, exactly as a text prefix is baked through the deployed model. The alternative
(computing the KV with the fp32 torch model and storing it) hands the int4 graph a KV that a
different model computed; the README gives the measured cost of that on the tiny test model.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..errors import PrefixEdgeError

_FLOAT_TYPES = {1: np.float32, 10: np.float16}  # onnx TensorProto FLOAT, FLOAT16


def embeddings_graph(model_path: Path, hidden: int):
    """Load the graph at `model_path` and return (model, embeddings input name, its dtype,
    whether `input_ids` is still an input) with the embedding lookup replaced by an input of
    shape [batch, sequence, hidden]."""
    import onnx
    from onnx import helper

    model = onnx.load(str(model_path), load_external_data=True)
    g = model.graph
    lookups = [n for n in g.node if n.op_type in ("Gather", "GatherBlockQuantized")
               and len(n.input) > 1 and n.input[1] == "input_ids"]
    if len(lookups) != 1:
        raise PrefixEdgeError(f"{model_path}: cannot find the token-embedding lookup (found "
                              f"{len(lookups)} Gather nodes on input_ids); soft prompts need it")
    gather = lookups[0]
    removed, out = [gather], gather.output[0]
    inits = {i.name: i for i in g.initializer}
    table = inits.get(gather.input[0])
    if gather.op_type == "GatherBlockQuantized":  # float out, typed like its scales
        dtype = _dtype(inits.get(gather.input[2]) if len(gather.input) > 2 else None)
    elif table is not None and table.data_type in _FLOAT_TYPES:
        dtype = _FLOAT_TYPES[table.data_type]
    else:  # quantized rows: the float embeddings are the DequantizeLinear after the Gather
        # (ORT's offline optimizer may have duplicated it, one copy per consumer: merge them)
        nxt = [n for n in g.node if out in n.input]
        if not nxt or any(n.op_type != "DequantizeLinear" or list(n.input) != list(nxt[0].input)
                          for n in nxt):
            raise PrefixEdgeError(f"{model_path}: the embedding lookup's output is not float and "
                                  "not dequantized by DequantizeLinear; cannot feed a soft prompt")
        removed += nxt
        out = nxt[0].output[0]
        dups = {n.output[0] for n in nxt[1:]}
        for node in g.node:
            for i, name in enumerate(node.input):
                if name in dups:
                    node.input[i] = out
        dtype = _dtype(inits.get(nxt[0].input[1]))
    # Gemma 3 scales token embeddings inside its embedding module (the own graph's embed_scale
    # Mul); embeddings given to transformers (a soft prompt, through PEFT) skip that scale
    nxt = [n for n in g.node if out in n.input]
    if len(nxt) == 1 and nxt[0].op_type == "Mul" and nxt[0].name == "/model/embed_tokens/embed_scale":
        removed.append(nxt[0])
        out = nxt[0].output[0]
    for n in removed:
        g.node.remove(n)
    used = {i for node in g.node for i in node.input}
    for name in {i for n in removed for i in n.input} - used:  # e.g. an untied embedding table
        for init in [i for i in g.initializer if i.name == name]:
            g.initializer.remove(init)
    for vi in [v for v in g.value_info if v.name == out]:
        g.value_info.remove(vi)
    elem = next(k for k, v in _FLOAT_TYPES.items() if v == dtype)
    g.input.append(helper.make_tensor_value_info(out, elem, ["batch_size", "sequence_length", hidden]))
    still_ids = any("input_ids" in n.input for n in g.node)
    if not still_ids:
        keep = [i for i in g.input if i.name != "input_ids"]
        del g.input[:]
        g.input.extend(keep)
    return model, out, dtype, still_ids


def _dtype(scale) -> type:
    """A dequantizing op's float output type: its scale initializer's (default float32)."""
    return _FLOAT_TYPES.get(scale.data_type, np.float32) if scale is not None else np.float32


class SoftPromptRunner:
    """Runs soft-prompt embeddings through the deployed ONNX graph (edited as above)."""

    def __init__(self, model_path: Path, hidden_size: int):
        """Its KV inputs (`past_names`, in the engine's order: layer, key before value) and a
        hybrid graph's recurrent state inputs (`states`, their shapes; they start at zeros,
        their outputs follow the KV's in what kv() returns) are read off the graph itself."""
        import onnx
        import onnxruntime as ort

        model, self.emb_name, self.emb_dtype, self.feed_ids = embeddings_graph(Path(model_path),
                                                                               hidden_size)
        self.hidden = hidden_size
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        with tempfile.TemporaryDirectory(prefix="prefix-edge-soft-prompt-") as tmp:
            if model.ByteSize() < 1_900_000_000:
                src = model.SerializeToString()
            else:  # protobuf's 2 GB limit: external data in a throw-away dir
                src = str(Path(tmp) / "model.onnx")
                onnx.save_model(model, src, save_as_external_data=True,
                                all_tensors_to_one_file=True, location="model.onnx_data")
            del model
            try:
                self.session = ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
            except Exception as e:
                raise PrefixEdgeError(f"{model_path}: the soft-prompt copy of the graph does not "
                                      f"load: {str(e).splitlines()[0]}") from None
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.inputs = set(inputs)
        self.past_names = sorted((n for n in inputs if n.startswith("past_key_values.")),
                                 key=lambda n: (int(n.split(".")[1]), n.endswith("value")))
        self.states = {n: (1, *(int(d) for d in inputs[n].shape[1:]))
                       for n in sorted((n for n in inputs if n.startswith(("past_conv.", "past_ssm."))),
                                       key=lambda n: (int(n.split(".")[1]), n))}
        self.present_names = [n.replace("past_key_values.", "present.") for n in self.past_names]
        self.present_names += [n.replace("past_", "present_") for n in self.states]
        first = inputs[self.past_names[0]]
        kv_dtype = {"tensor(float)": np.float32, "tensor(float16)": np.float16}[first.type]
        self.empty = np.zeros((1, int(first.shape[1]), 0, int(first.shape[3])), kv_dtype)

    def kv(self, emb: np.ndarray) -> list[np.ndarray]:
        """The KV of `emb` [V, hidden] at positions 0..V-1, one array per past name
        ([1, n_kv_heads, V, head_dim], the graph's KV dtype), then a hybrid's recurrent states
        after them."""
        emb = np.asarray(emb)
        if emb.ndim != 2 or emb.shape[1] != self.hidden or emb.shape[0] == 0:
            raise PrefixEdgeError(f"soft prompt is {list(emb.shape)}, expected [V >= 1, {self.hidden}]")
        n = emb.shape[0]
        feeds = {self.emb_name: emb.astype(self.emb_dtype)[None],
                 "attention_mask": np.ones((1, n), np.int64),  # optimum's graph
                 "position_ids": np.arange(n, dtype=np.int64)[None],
                 "seqlens_k": np.array([n - 1], np.int32),  # the fused graph (onnx_graph.py)
                 "total_sequence_length": np.array(n, np.int32)}
        if self.feed_ids:  # input_ids still drives shape computations: any ids of the right shape
            feeds["input_ids"] = np.zeros((1, n), np.int64)
        feeds = {k: v for k, v in feeds.items() if k in self.inputs}
        feeds.update((name, self.empty) for name in self.past_names)
        feeds.update((name, np.zeros(shape, np.float32)) for name, shape in self.states.items())
        return self.session.run(self.present_names, feeds)

    def close(self) -> None:
        self.session = None
