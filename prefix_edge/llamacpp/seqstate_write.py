"""Writing llama.cpp sequence-state blobs (the layout is in seqstate.py): a prefix's cells
from K and V arrays (a PEFT prefix-tuning adapter's KV, baked for the GGUF backend), and a
bundle's one-stream blobs re-laid for a context with a KV stream per sequence and back (a
hybrid model's recurrent part, which has no streams, travels as it is), and a sliding-window part
unfolded to the cells a prefill leaves (unfold_window)."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from ..errors import PrefixEdgeError
from ..quantize.blocks import hadamard
from .seqstate import (GGML_TYPE_F16, GGML_TYPE_Q8_0, Q8_0_BLOCK, Q8_0_BYTES, SEQ_STATE_MAGIC,
                       SeqStateInfo, _read_cells, _read_data, _Reader)
from .seqstate_recurrent import read_recurrent

_MAX_UNFOLD = 1 << 22  # positions a sliding-window part may be unfolded to (llama.cpp's contexts stay far below)


def row_bytes(ggml_type: int, n: int) -> int:
    """Bytes of one cache row of n values in a KV type this runtime restores (f16 or q8_0)."""
    if ggml_type == GGML_TYPE_Q8_0:
        return n // Q8_0_BLOCK * Q8_0_BYTES
    return 2 * n


def q8_0_rows(a: np.ndarray) -> np.ndarray:
    """Rows [P, n] (n % 32 == 0) as ggml's Q8_0 bytes [P, n/32*34] (f16 scale, 32 int8),
    rounded as ggml's CPU quantizer does (quantize/blocks.py)."""
    from ..quantize.blocks import q8_0

    q, d = q8_0(a, Q8_0_BLOCK, np.dtype("<f2"), ggml_rounding=True)
    out = np.empty((*q.shape[:-1], Q8_0_BYTES), np.uint8)
    out[..., :2] = d[..., None].view(np.uint8)
    out[..., 2:] = q.view(np.uint8)
    return out.reshape(q.shape[0], -1)


def build_seq_state(k: list[np.ndarray], v: list[np.ndarray], v_trans: bool,
                    seq_id: int = 0, kv_type: int = GGML_TYPE_F16, rotation: int = 0,
                    swa_layers: Sequence[int] = (), window: int = 0) -> bytes:
    """A blob holding cells 0..P-1 of sequence `seq_id`, from per-layer float16 K and V
    arrays [P, n_kv_heads*head_dim] (K post-RoPE in llama.cpp's layout), cached as `kv_type`.

    A model with sliding-window layers (`swa_layers`, the indices into k and v, and their
    `window`): the other layers' part with every cell (no layer when all slide), then the
    sliding-window layers' part with the last min(P, window) cells, as llama.cpp writes an
    iSWA cache.

    q8_0: llama.cpp needs flash attention (V untransposed) and may keep a quantized cache's K
    and V rotated, each head by the normalized Hadamard matrix of order `rotation` (0: not
    rotated; runtime/engines/llama/engine.py kv_rotation says which); the rows are rotated so, then quantized
    as ggml does."""
    if kv_type == GGML_TYPE_Q8_0 and v_trans:
        raise PrefixEdgeError("build_seq_state: a q8_0 cache has V untransposed (flash attention)")
    if not k or len(k) != len(v):
        raise PrefixEdgeError(f"build_seq_state: {len(k)} K layers vs {len(v)} V layers")
    arrs = [np.asarray(a) for a in (*k, *v)]
    p = arrs[0].shape[0] if arrs[0].ndim == 2 else -1
    for i, a in enumerate(arrs):
        if a.ndim != 2 or a.shape[0] != p or a.dtype != np.float16:
            raise PrefixEdgeError(f"build_seq_state: {'KV'[i >= len(k)]} layer {i % len(k)} is "
                                  f"{a.dtype}{list(a.shape)}; need float16 [{p}, n_embd]")
    swa = sorted(set(int(i) for i in swa_layers))
    if swa and (swa[0] < 0 or swa[-1] >= len(k) or window < 1):
        raise PrefixEdgeError(f"build_seq_state: sliding-window layers {swa} (window {window}) "
                              f"do not fit {len(k)} layers")
    full = [i for i in range(len(k)) if i not in swa]
    out = [struct.pack("<Ii", SEQ_STATE_MAGIC, seq_id),
           _part([k[i] for i in full], [v[i] for i in full], 0, p, v_trans, seq_id, kv_type, rotation)]
    if swa:
        out.append(_part([k[i] for i in swa], [v[i] for i in swa], max(0, p - window), p,
                         v_trans, seq_id, kv_type, rotation))
    return b"".join(out)


def _part(k: list[np.ndarray], v: list[np.ndarray], first: int, p: int, v_trans: bool,
          seq_id: int, kv_type: int, rotation: int) -> bytes:
    """One cache's part (one stream) holding the cells of positions first..p-1."""
    n = p - first
    cells = np.empty((n, 3), "<i4")
    cells[:, 0], cells[:, 1], cells[:, 2] = np.arange(first, p), 1, seq_id
    parts = [struct.pack("<II", 1, n), cells.tobytes(), struct.pack("<II", int(v_trans), len(k))]
    k, v = [a[first:] for a in k], [a[first:] for a in v]
    if kv_type == GGML_TYPE_Q8_0:
        h = hadamard(rotation) if rotation else None
        for a in (*k, *v):
            x = np.asarray(a, np.float32)
            if h is not None:
                x = (x.reshape(n, -1, rotation) @ h.T).reshape(n, -1)
            rows = q8_0_rows(x)
            parts += [struct.pack("<iQ", GGML_TYPE_Q8_0, rows.shape[1]), rows.tobytes()]
        return b"".join(parts)
    for a in k:
        parts += [struct.pack("<iQ", GGML_TYPE_F16, a.shape[1] * 2), a.astype("<f2", copy=False).tobytes()]
    for a in v:
        if v_trans:
            parts += [struct.pack("<iII", GGML_TYPE_F16, 2, a.shape[1]),
                      np.ascontiguousarray(a.T).astype("<f2", copy=False).tobytes()]
        else:
            parts += [struct.pack("<iQ", GGML_TYPE_F16, a.shape[1] * 2), a.astype("<f2", copy=False).tobytes()]
    return b"".join(parts)


def in_stream(blob: np.ndarray, stream: int, n_stream: int, info: SeqStateInfo | None = None) -> np.ndarray:
    """A one-stream blob (as bundles store them) re-laid for a context with `n_stream` KV
    streams (llama.cpp `kv_unified = false`: one stream per sequence), the cells in `stream`:
    each cache's part gets the stream count, then an empty stream (cell_count 0) for every
    other one; a recurrent part (no streams) as it is. `info` (its parse) is needed for a blob
    of two caches' parts or with a recurrent part."""
    b = np.ascontiguousarray(blob).view(np.uint8).reshape(-1)
    if n_stream == 1:
        return b
    if b.size < 12 or int(b[8:12].view("<u4")[0]) != 1 or not 0 <= stream < n_stream:
        raise PrefixEdgeError("seq-state blob: expected a one-stream blob to place in a stream")
    spans = [(8, b.size)] if info is None else [part.span for part in info.parts]
    zeros = np.zeros(4, np.uint8)
    pieces = [b[:8]]
    for start, end in spans:
        pieces += [np.array([n_stream], "<u4").view(np.uint8), *[zeros] * stream, b[start + 4:end],
                   *[zeros] * (n_stream - 1 - stream)]
    if info is not None and info.recurrent is not None:
        pieces.append(b[info.recurrent.span[0]:info.recurrent.span[1]])
    return np.concatenate(pieces)


def out_of_stream(blob: np.ndarray, stream: int, n_stream: int, parts: int = 1,
                  recurrent: int | None = 0, cell_ext: int = 0) -> np.ndarray:
    """The inverse of in_stream: the one-stream blob of `stream` from a blob that llama.cpp
    wrote for a context of `n_stream` KV streams (every other stream empty), `parts` KV caches'
    parts, then a recurrent part of `recurrent` layers (seqstate.parse_seq_state). With one
    cache's part and no recurrent one, a view of `blob`, whose header bytes it rewrites."""
    b = np.ascontiguousarray(blob).view(np.uint8).reshape(-1)
    if n_stream == 1:
        return b
    if parts == 1 and recurrent == 0:
        tail = 4 * (n_stream - 1 - stream)
        at = 12 + 4 * stream
        if b.size < at + 4 + tail or int(b[8:12].view("<u4")[0]) != n_stream or \
                np.any(b[12:at].view("<u4")) or (tail and np.any(b[b.size - tail:].view("<u4"))):
            raise PrefixEdgeError("seq-state blob: not a blob of one sequence's stream")
        head = b[:8].copy()  # the one-stream header goes just before the stream's data: no copy
        b[at - 12:at - 4] = head
        b[at - 4:at] = np.array([1], "<u4").view(np.uint8)
        return b[at - 12:b.size - tail]
    pieces, off = [b[:8]], 8
    for _ in range(parts):
        if b.size < off + 4 + 4 * n_stream or int(b[off:off + 4].view("<u4")[0]) != n_stream or \
                np.any(b[off + 4:off + 4 + 4 * stream].view("<u4")):
            raise PrefixEdgeError("seq-state blob: not a blob of one sequence's stream")
        start = off + 4 + 4 * stream
        r = _Reader(memoryview(b))
        r.off = start
        n = r.read("<I", "cell_count")
        if n * (12 + cell_ext) > b.size - r.off:
            raise PrefixEdgeError("seq-state blob: not a blob of one sequence's stream")
        info = SeqStateInfo(0, 1, n, *_read_cells(r, n, cell_ext), False, 0)
        if info.cell_count:
            _read_data(r, info)
        end = r.off + 4 * (n_stream - 1 - stream)
        if b.size < end or np.any(b[r.off:end].view("<u4")):
            raise PrefixEdgeError("seq-state blob: not a blob of one sequence's stream")
        pieces += [np.array([1], "<u4").view(np.uint8), b[start:r.off]]
        off = end
    if recurrent != 0:
        r = _Reader(memoryview(b))
        r.off = off
        read_recurrent(r, recurrent)
        pieces.append(b[off:r.off])
        off = r.off
    if off != b.size:
        raise PrefixEdgeError("seq-state blob: trailing bytes after its caches' parts")
    return np.concatenate(pieces)


def unfold_window(blob: np.ndarray, info: SeqStateInfo) -> np.ndarray:
    """A one-stream blob of a model with sliding-window layers (`info` its parse) re-laid so that
    its sliding-window part has a cell for every position 0..n-1, in position order: the window's
    cells with their rows, the older ones zero (outside the window, they are masked: their values
    reach no sum). llama.cpp places a restored part's cells in the order given from the stream's
    first cell, so each position then sits at the cell a prefill puts it in (cell = position, in
    a sliding-window cache as large as the stream, swa_full); the attention sums run over the same
    cells in the same lanes, and the tokens after a restore are the tokens after a prefill, bit
    for bit. (The blob llama.cpp writes holds the window's cells only, so bundles and caches keep
    that; only what goes back into a context is unfolded.)"""
    b = np.ascontiguousarray(blob).view(np.uint8).reshape(-1)
    sw = info.swa
    if sw is None or sw.cell_count == 0:
        return b
    n = int(sw.positions.max()) + 1
    if n > _MAX_UNFOLD or int(sw.positions.min()) < 0:
        raise PrefixEdgeError(f"seq-state blob: sliding-window positions up to {n - 1} cannot be laid out")
    at = sw.positions.astype(np.int64)  # where each of the blob's cells goes
    c = sw.cell_count
    seq = int(sw.cell_seq_ids[0])
    cells = np.empty((n, 3), "<i4")
    cells[:, 0], cells[:, 1], cells[:, 2] = np.arange(n), 1, seq
    out = [struct.pack("<II", 1, n), cells.tobytes(), struct.pack("<II", int(sw.v_trans), sw.n_layer)]
    for lay in sw.layers:
        rows = np.zeros((n, lay.k_row_bytes), np.uint8)
        rows[at] = b[lay.k_offset:lay.k_offset + c * lay.k_row_bytes].reshape(c, lay.k_row_bytes)
        out += [struct.pack("<iQ", lay.k_type, lay.k_row_bytes), rows.tobytes()]
    for lay in sw.layers:
        if sw.v_trans:  # [n_embd_v_gqa][cell][elem]
            e, d = lay.v_elem_bytes, lay.n_embd_v_gqa
            cols = np.zeros((d, n, e), np.uint8)
            cols[:, at] = b[lay.v_offset:lay.v_offset + d * c * e].reshape(d, c, e)
            out += [struct.pack("<iII", lay.v_type, e, d), cols.tobytes()]
        else:
            rows = np.zeros((n, lay.v_row_bytes), np.uint8)
            rows[at] = b[lay.v_offset:lay.v_offset + c * lay.v_row_bytes].reshape(c, lay.v_row_bytes)
            out += [struct.pack("<iQ", lay.v_type, lay.v_row_bytes), rows.tobytes()]
    start, end = sw.span
    return np.concatenate([b[:start], np.frombuffer(b"".join(out), np.uint8), b[end:]])
