"""Hidden states for embeddings from the ONNX engine's own session: the fused graph's
`hidden_states` output (export/onnx_graph.py: the final norm's output at every position).

A text runs alone (batch 1, from position 0) through the session the engine decodes with,
into a KV buffer of its own that nothing else binds: ONNX Runtime runs one session from several
threads, so this needs no engine thread, and a text's vector is the same whatever else runs.
It runs in pieces of at most PIECE tokens (the KV of the pieces before in the buffer, a
hybrid's recurrent states carried from piece to piece): ONNX Runtime's arena keeps what its
largest run needed, and a 1,500-token text in one run kept 300 MB more on the default model.
Only the embedder's thread (runtime/embedding.py) calls `hidden`.
"""

from __future__ import annotations

import numpy as np

from ....errors import PrefixEdgeError
from .kv_buffer import KvBuffer, round_up

HIDDEN_STATES = "hidden_states"  # export/onnx_graph.py's name (the export layer is above this one)
PIECE = 128  # tokens one run of a text holds


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
            self.buf = KvBuffer(be.kv_shapes, be.kv_dtype, round_up(n))
        states = [np.zeros(shape, np.float32) for shape in be.state_shapes]  # before any token
        out = []
        with be.running() as session:
            for start in range(0, n, PIECE):
                end = min(n, start + PIECE)
                h, states = self._hidden(session, np.ascontiguousarray(ids[:, start:end]), end, states)
                out.append(h)
        return np.concatenate(out) if len(out) > 1 else out[0]

    def _hidden(self, session, ids: np.ndarray, end: int, states: list) -> tuple[np.ndarray, list]:
        """One piece: its hidden states, and the recurrent states after it."""
        be = self.be
        b = session.io_binding()
        b.bind_output(HIDDEN_STATES, "cpu")  # first: get_outputs() is in binding order
        b.bind_cpu_input("input_ids", ids)
        b.bind_cpu_input("seqlens_k", np.array([end - 1], np.int32))
        b.bind_cpu_input("total_sequence_length", np.array(end, np.int32))
        for past, present, value in zip(be.past_names, be.present_names, self.buf.values):
            b.bind_ortvalue_input(past, value)
            b.bind_ortvalue_output(present, value)
        for name, out, state in zip(be.state_names, be.state_out, states):  # a hybrid's
            b.bind_cpu_input(name, state)
            b.bind_output(out, "cpu")
        try:
            session.run_with_iobinding(b)
        except Exception as e:  # ORT raises its own types; give one line
            raise PrefixEdgeError(f"ONNX Runtime failed: {str(e).splitlines()[0]}") from None
        got = b.get_outputs()  # in binding order: hidden states, the presents, the states
        return (np.array(got[0].numpy()[0], dtype=np.float32),
                [np.ascontiguousarray(v.numpy(), np.float32) for v in got[len(got) - len(states):]] if states else [])

    def pooled(self, batch: list[np.ndarray], pooling: str) -> list[np.ndarray]:
        return [pool(self.hidden(ids), pooling) for ids in batch]

    def close(self) -> None:
        self.buf = None


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """[n, d] hidden states -> [d]: their mean, or the last one ("last", "prompt")."""
    return hidden.mean(axis=0, dtype=np.float32) if pooling == "mean" else hidden[-1].copy()
