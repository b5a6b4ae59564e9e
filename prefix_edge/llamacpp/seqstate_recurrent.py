"""The recurrent layers' part of a llama.cpp sequence state (hybrid models: LFM2's short
convolutions, Granite 4.0-H's and Falcon-H1's Mamba2 blocks), in pure numpy.

llama.cpp keeps a recurrent layer's memory (`llama_memory_recurrent`) as one cell per sequence:
its state after the sequence's last token, not a cell per token. A hybrid model's sequence state
(`llama_memory_hybrid`) is the attention layers' KV part (seqstate.py), then this part (no
stream count: the recurrent memory has no streams):

    u32 cell_count              (1: the sequence's one state; 0: none)
    per cell: i32 pos           (the last position the state has read)
              u32 n_seq_id = 0  (a one-sequence state names no sequence)
    u32 s_trans = 0, u32 n_layer (the model's layers: all of them, recurrent or not)
    per recurrent layer: i32 r_type, u64 r_row_bytes, cell_count x r_row_bytes  (conv window)
    per recurrent layer: i32 s_type, u64 s_row_bytes, cell_count x s_row_bytes  (SSM state;
                                                                      LFM2's is 0 bytes)

Nothing in the part says which layers are recurrent: the engine reads their count off a state
of its own (runtime/engines/llama/engine.py) and holds every later blob to it. Such a state cannot be cut
back to an earlier position (it holds no per-token history): a cache keeps it whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import PrefixEdgeError

GGML_TYPE_F32 = 0
_MAX_ROW = 1 << 30      # bytes of one layer's state row
_MAX_LAYERS = 4096


@dataclass
class RecurrentLayer:
    r_type: int
    r_row_bytes: int
    r_offset: int
    s_type: int = -1
    s_row_bytes: int = 0
    s_offset: int = 0


@dataclass
class RecurrentInfo:
    cell_count: int
    positions: np.ndarray            # int32 [cell_count]
    n_layer: int                     # the model's layer count, as llama.cpp writes it
    layers: list[RecurrentLayer] = field(default_factory=list)
    span: tuple[int, int] = (0, 0)   # [start, end) of this part in the blob

    def facts(self) -> dict:
        """What every blob of the same model and context repeats (check_recurrent's `want`)."""
        lay = self.layers[0] if self.layers else RecurrentLayer(-1, 0, 0)
        return {"n_layer": self.n_layer, "layers": len(self.layers), "r_type": lay.r_type,
                "r_row_bytes": lay.r_row_bytes, "s_type": lay.s_type, "s_row_bytes": lay.s_row_bytes}

    @property
    def nbytes(self) -> int:
        return self.span[1] - self.span[0]


def read_recurrent(r, n_rec: int | None) -> RecurrentInfo:
    """Read the recurrent part at reader `r` (seqstate._Reader): `n_rec` recurrent layers, or
    None: as many as the rest of the blob holds (how the engine learns its model's count)."""
    start = r.off
    if start == len(r.buf):
        raise PrefixEdgeError("seq-state blob ends where the recurrent layers' state should begin "
                              "(a state of a model without recurrent layers, or cut short)")
    n = r.read("<I", "recurrent state: cell_count")
    if n > 1:
        raise PrefixEdgeError(f"seq-state blob corrupt: the recurrent state has {n} cells; one "
                              "sequence has at most 1")
    pos = np.empty(n, np.int32)
    for i in range(n):
        pos[i] = r.read("<i", "recurrent state: cell pos")
        k = r.read("<I", "recurrent state: cell n_seq_id")
        if k != 0:
            raise PrefixEdgeError(f"seq-state blob corrupt: the recurrent cell names {k} sequences "
                                  "(a one-sequence state names none)")
    s_trans = r.read("<I", "recurrent state: s_trans")
    if s_trans != 0:
        raise PrefixEdgeError(f"seq-state blob corrupt: recurrent s_trans is {s_trans} "
                              "(llama.cpp reads only 0)")
    n_layer = r.read("<I", "recurrent state: n_layer")
    if not 0 < n_layer <= _MAX_LAYERS:
        raise PrefixEdgeError(f"seq-state blob corrupt: recurrent state n_layer is {n_layer}")
    info = RecurrentInfo(n, pos, n_layer)
    if n_rec is None:
        rows = []
        while r.off < len(r.buf):
            rows.append(_row(r, n, len(rows), "state"))
        if not rows or len(rows) % 2 or len(rows) // 2 > n_layer:
            raise PrefixEdgeError(f"seq-state blob: a recurrent state of {len(rows)} rows is not "
                                  "conv + SSM rows per recurrent layer (a layout this runtime "
                                  "does not read)")
        n_rec = len(rows) // 2
        info.layers = [RecurrentLayer(*rows[i], *rows[n_rec + i]) for i in range(n_rec)]
    else:
        if not 0 < n_rec <= n_layer:
            raise PrefixEdgeError(f"seq-state blob: {n_rec} recurrent layers of {n_layer}")
        info.layers = [RecurrentLayer(*_row(r, n, il, "conv")) for il in range(n_rec)]
        for il, lay in enumerate(info.layers):
            lay.s_type, lay.s_row_bytes, lay.s_offset = _row(r, n, il, "SSM")
    info.span = (start, r.off)
    return info


def _row(r, n: int, il: int, what: str) -> tuple[int, int, int]:
    t = r.read("<i", f"recurrent layer {il} {what} type")
    size = r.read("<Q", f"recurrent layer {il} {what} row bytes")
    if t != GGML_TYPE_F32 or size > _MAX_ROW or size % 4:
        raise PrefixEdgeError(f"seq-state blob corrupt: recurrent layer {il} {what} rows are ggml "
                              f"type {t} of {size} bytes (llama.cpp keeps f32 rows)")
    return t, size, r.skip(n * size, f"recurrent layer {il} {what} data")


def check_recurrent(rec: RecurrentInfo | None, want: dict | None, n_cells: int) -> None:
    """A parsed recurrent part against `want` (RecurrentInfo.facts of the model's own state):
    present exactly when wanted, one cell at the last position of the blob's n_cells, every
    layer's rows as the model's."""
    def bad(what: str, got, exp) -> PrefixEdgeError:
        return PrefixEdgeError(f"prefix KV state does not fit: {what} is {got}, expected {exp}")

    if (rec is None) != (want is None):
        raise bad("recurrent layers' state", "present" if rec else "absent",
                  "present" if want else "absent")
    if rec is None:
        return
    if rec.cell_count != 1:
        raise bad("recurrent state cell count", rec.cell_count, 1)
    if int(rec.positions[0]) != n_cells - 1:
        raise bad("recurrent state position", int(rec.positions[0]), n_cells - 1)
    got = rec.facts()
    for key in ("n_layer", "layers"):
        if got[key] != want[key]:
            raise bad(f"recurrent state {key.replace('layers', 'recurrent layer count')}", got[key], want[key])
    for il, lay in enumerate(rec.layers):
        for key in ("r_type", "r_row_bytes", "s_type", "s_row_bytes"):
            if getattr(lay, key) != want[key]:
                raise bad(f"recurrent layer {il} {key}", getattr(lay, key), want[key])


def recurrent_finite(buf, rec: RecurrentInfo | None) -> bool:
    """No NaN or infinity in the recurrent layers' f32 rows."""
    if rec is None:
        return True
    n = rec.cell_count
    for lay in rec.layers:
        for off, size in ((lay.r_offset, lay.r_row_bytes), (lay.s_offset, lay.s_row_bytes)):
            if n * size and not np.all(np.isfinite(np.frombuffer(buf, "<f4", n * size // 4, off))):
                return False
    return True
