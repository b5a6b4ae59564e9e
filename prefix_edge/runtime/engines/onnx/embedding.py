"""Hidden states for embeddings from the ONNX engine's own session: the fused graph's
`hidden_states` output (export/onnx_graph.py: the final norm's output at every position).

A text runs alone (batch 1, from position 0) through the session the engine decodes with,
into a KV buffer of its own that nothing else binds: ONNX Runtime runs one session from several
threads, so this needs no engine thread, and a text's vector is the same whatever else runs.
Only the embedder's thread (runtime/embedding.py) calls `hidden`.
"""

from __future__ import annotations

import numpy as np

from ....errors import PrefixEdgeError
from .kv_buffer import KvBuffer, round_up

HIDDEN_STATES = "hidden_states"  # export/onnx_graph.py's name (the export layer is above this one)


def unsupported(be) -> str | None:
    """Why engine `be`'s graph cannot give embeddings, or None."""
    if HIDDEN_STATES in {o.name for o in be.session.get_outputs()}:
        return None
    if not be.fused:
        return ("this bundle's ONNX graph is optimum's, which has no hidden-state output: "
                "embed with the gguf backend, or export the bundle with the own ONNX graph")
    return ("this bundle's ONNX graph has no hidden_states output (exported before embeddings): "
            "re-export the bundle (`prefix-edge export`) to embed with the onnx backend, or use "
            "the gguf backend")


class OnnxHidden:
    """`pooled(batch, pooling)`: one vector per text, from `hidden(ids)`, the final-norm hidden
    states [n, hidden] of one text run alone from position 0 (as LlamaPooled's, its twin)."""

    def __init__(self, be):
        why = unsupported(be)
        if why is not None:
            raise PrefixEdgeError(why)
        self.be = be
        self.buf = None  # the KV buffer the texts run in, grown as a longer one comes

    def hidden(self, ids: np.ndarray) -> np.ndarray:
        be = self.be
        if be.session is None:
            raise PrefixEdgeError("the onnx backend is closed")
        ids = np.asarray(ids, np.int64).reshape(1, -1)
        n = ids.shape[1]
        if self.buf is None or self.buf.capacity < n:
            self.buf = KvBuffer(len(be.past_names), be.n_kv_heads, be.head_dim, be.kv_dtype, round_up(n))
        with be.running() as session:
            return self._hidden(session, ids, n)

    def _hidden(self, session, ids: np.ndarray, n: int) -> np.ndarray:
        be = self.be
        b = session.io_binding()
        b.bind_output(HIDDEN_STATES, "cpu")  # first: get_outputs() is in binding order
        b.bind_cpu_input("input_ids", ids)
        b.bind_cpu_input("seqlens_k", np.array([n - 1], np.int32))
        b.bind_cpu_input("total_sequence_length", np.array(n, np.int32))
        for past, present, value in zip(be.past_names, be.present_names, self.buf.values):
            b.bind_ortvalue_input(past, value)
            b.bind_ortvalue_output(present, value)
        for name, out, shape in zip(be.state_names, be.state_out, be.state_shapes):  # a hybrid's
            b.bind_cpu_input(name, np.zeros(shape, np.float32))  # the states before any token
            b.bind_output(out, "cpu")
        try:
            session.run_with_iobinding(b)
        except Exception as e:  # ORT raises its own types; give one line
            raise PrefixEdgeError(f"ONNX Runtime failed: {str(e).splitlines()[0]}") from None
        return np.array(b.get_outputs()[0].numpy()[0], dtype=np.float32)

    def pooled(self, batch: list[np.ndarray], pooling: str) -> list[np.ndarray]:
        return [pool(self.hidden(ids), pooling) for ids in batch]

    def close(self) -> None:
        self.buf = None


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """[n, d] hidden states -> [d]: their mean, or the last one ("last", "prompt")."""
    return hidden.mean(axis=0, dtype=np.float32) if pooling == "mean" else hidden[-1].copy()
