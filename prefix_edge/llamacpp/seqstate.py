"""llama.cpp sequence-state blobs (`llama_state_seq_get_data` / `set_data`), in pure numpy.

llama.cpp checks a blob it restores only for layer count, types, row sizes and V layout; it
reads whatever positions and cell count the blob holds and never asks which model wrote it.
So every blob is walked here, byte for byte, before it reaches llama.cpp.

Layout written by llama-cpp-python 0.3.36 (little-endian; verified against real blobs of a
llama-architecture model, where cells carry no M-RoPE extension):

    u32 magic 0xAF143CD8        (llama-context's io magic; the blob itself has no version)
    i32 seq_id                  (the sequence it was read from)
    u32 n_stream                (KV streams; 1 for a one-sequence context)
    per stream:
      u32 cell_count            (a stream with 0 cells ends here)
      per cell: i32 pos, u32 n_seq_id, n_seq_id x i32 seq_id
      u32 v_trans, u32 n_layer
      per layer: i32 k_type, u64 k_row_bytes, cell_count x k_row_bytes
      if not v_trans, per layer: i32 v_type, u64 v_row_bytes, cell_count x v_row_bytes
      if v_trans, per layer: i32 v_type, u32 v_elem_bytes, u32 n_embd_v_gqa,
                             n_embd_v_gqa x (cell_count x v_elem_bytes)   (V transposed)

A K row is [n_kv_heads][head_dim] post-RoPE, in llama.cpp's rotation layout.

A model with sliding-window layers (Gemma 3: llama.cpp's iSWA cache) writes two caches' parts
after the one magic and seq_id, each laid out as above from n_stream on: the full-attention
layers' cache (every cell), then the sliding-window layers' cache, which holds only the cells
still inside the window (the last n_swa positions; llama.cpp leaves out masked cells), in its
ring's cell order: a prefix longer than that cache (window + a batch) wraps, so the positions
run n-window+j .. n-1, then n-window .. n-window+j-1. When
every layer slides (a small Gemma 3), the full-attention part holds the cells and no layer
(n_layer 0).

A model with M-RoPE (Qwen3.5: `rope.dimension_sections` in its GGUF) writes CELL_EXT more bytes
in each cell, after n_seq_id and before the sequence ids (its cells' extra rotary coordinates
and token): kept as they are; the engine's probe tells which (runtime/engines/llama/state.py).

A hybrid model (LFM2, Granite 4.0-H, Falcon-H1: llama.cpp's llama_memory_hybrid) writes its
attention layers' part as above, then its recurrent layers' state: one cell, the state after
the last token (seqstate_recurrent.py).
Writing blobs (and re-laying them for a context's streams) is seqstate_write.py.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import PrefixEdgeError
from .seqstate_recurrent import RecurrentInfo, check_recurrent, read_recurrent, recurrent_finite

SEQ_STATE_MAGIC = 0xAF143CD8
GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0 = 0, 1, 30, 8
Q8_0_BLOCK, Q8_0_BYTES = 32, 34  # ggml's block_q8_0: f16 scale d, then 32 int8 values
_TYPE_NAMES = {GGML_TYPE_F32: "f32", GGML_TYPE_F16: "f16", GGML_TYPE_BF16: "bf16",
               2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0"}
CELL_EXT = 12           # an M-RoPE model's per-cell extension (llama-cpp-python 0.3.36)
_MAX_SEQ = 256          # LLAMA_MAX_SEQ: a cell cannot belong to more sequences than this
_MAX_LAYERS = 4096
_MAX_EMBD = 1 << 20


def type_name(t: int) -> str:
    return _TYPE_NAMES.get(t, f"ggml type {t}")


@dataclass
class LayerInfo:
    k_type: int
    k_row_bytes: int
    k_offset: int            # where this layer's K rows start in the blob
    v_type: int = -1
    v_row_bytes: int = 0     # bytes per cell of V (v_elem_bytes * n_embd_v_gqa when transposed)
    v_elem_bytes: int = 0    # only written when V is transposed
    n_embd_v_gqa: int = 0    # only written when V is transposed
    v_offset: int = 0


@dataclass
class SeqStateInfo:
    seq_id: int
    n_stream: int
    cell_count: int
    positions: np.ndarray            # int32 [cell_count]
    cell_seq_ids: np.ndarray         # int32 [cell_count]; -1 where a cell has != 1 sequence
    v_trans: bool
    n_layer: int
    layers: list[LayerInfo] = field(default_factory=list)
    nbytes: int = 0
    span: tuple[int, int] = (8, 0)   # [start, end) of this cache's part (from its n_stream on)
    swa: SeqStateInfo | None = None  # an iSWA blob: the sliding-window layers' part, after this one
    recurrent: RecurrentInfo | None = None  # a hybrid model's recurrent layers' state, after the KV

    @property
    def parts(self) -> list[SeqStateInfo]:
        return [self] if self.swa is None else [self, self.swa]

    # per-model summaries (layer 0; check_seq_state insists every layer agrees)
    @property
    def k_type(self) -> int:
        return self.layers[0].k_type if self.layers else -1

    @property
    def v_type(self) -> int:
        return self.layers[0].v_type if self.layers else -1

    @property
    def k_row_bytes(self) -> int:
        return self.layers[0].k_row_bytes if self.layers else 0

    @property
    def v_row_bytes(self) -> int:
        return self.layers[0].v_row_bytes if self.layers else 0

    @property
    def n_embd_v_gqa(self) -> int:
        if not self.layers:
            return 0
        lay = self.layers[0]
        if self.v_trans:
            return lay.n_embd_v_gqa
        if lay.v_type == GGML_TYPE_Q8_0:
            return lay.v_row_bytes // Q8_0_BYTES * Q8_0_BLOCK
        return lay.v_row_bytes // 2 if lay.v_type in (GGML_TYPE_F16, GGML_TYPE_BF16) else 0


class _Reader:
    def __init__(self, buf: memoryview):
        self.buf, self.off = buf, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.off + n > len(self.buf):
            raise PrefixEdgeError(
                f"seq-state blob truncated: {what} needs {n} bytes at offset {self.off}, "
                f"only {len(self.buf) - self.off} left of {len(self.buf)}")

    def read(self, fmt: str, what: str) -> int:
        size = struct.calcsize(fmt)
        self.need(size, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.off)
        self.off += size
        return v

    def skip(self, n: int, what: str) -> int:
        self.need(n, what)
        start = self.off
        self.off += n
        return start


def _view(blob) -> memoryview:
    if isinstance(blob, np.ndarray):
        return memoryview(np.ascontiguousarray(blob).view(np.uint8).reshape(-1))
    return memoryview(blob).cast("B")


def parse_seq_state(blob: bytes | bytearray | memoryview | np.ndarray, parts: int = 1,
                    recurrent: int | None = 0, cell_ext: int = 0) -> SeqStateInfo:
    """Walk a whole blob; raise PrefixEdgeError unless it is one well-formed sequence state of
    `parts` KV caches' parts (2: a model with sliding-window layers), then, where `recurrent`
    is not 0, a recurrent part of that many layers (None: as many as it holds). `cell_ext`: the
    bytes each cell carries after its n_seq_id (CELL_EXT for an M-RoPE model, else 0)."""
    buf = _view(blob)
    r = _Reader(buf)
    magic = r.read("<I", "magic")
    if magic != SEQ_STATE_MAGIC:
        raise PrefixEdgeError(f"not a llama.cpp seq-state blob: magic {magic:#010x}, "
                              f"expected {SEQ_STATE_MAGIC:#010x}")
    seq_id = r.read("<i", "seq_id")
    found = [_read_part(r, seq_id, k, cell_ext) for k in range(parts)]
    rec = read_recurrent(r, recurrent) if recurrent != 0 else None
    if r.off != len(buf):
        raise PrefixEdgeError(f"seq-state blob has {len(buf) - r.off} trailing bytes after "
                              f"offset {r.off} (corrupt, or written by another llama.cpp layout)")
    info = found[0]
    info.swa = found[1] if parts == 2 else None
    info.recurrent = rec
    info.nbytes = len(buf)
    return info


def _read_part(r: _Reader, seq_id: int, k: int, cell_ext: int = 0) -> SeqStateInfo:
    start = r.off
    what = "" if k == 0 else "sliding-window cache: "
    n_stream = r.read("<I", what + "n_stream")
    if n_stream != 1:
        raise PrefixEdgeError(f"seq-state blob has {n_stream} KV streams; this runtime reads "
                              "blobs of one-sequence contexts (exactly 1 stream)")
    cell_count = r.read("<I", what + "cell_count")
    if cell_count * (12 + cell_ext) > len(r.buf) - r.off:   # a cell: pos, n_seq_id, its extension, a seq id
        raise PrefixEdgeError(f"seq-state blob truncated or corrupt: cell_count {cell_count} "
                              f"needs over {cell_count * (12 + cell_ext)} bytes, {len(r.buf) - r.off} left")
    positions, cell_seq = _read_cells(r, cell_count, cell_ext)
    info = SeqStateInfo(seq_id, n_stream, cell_count, positions, cell_seq, False, 0)
    if cell_count:
        _read_data(r, info)
    info.span = (start, r.off)
    return info


def _read_cells(r: _Reader, n: int, ext: int = 0) -> tuple[np.ndarray, np.ndarray]:
    # fast path: every cell in exactly one sequence -> fixed (12 + ext)-byte records
    size = 12 + ext
    if n and r.off + size * n <= len(r.buf):
        rec = np.frombuffer(r.buf, "<i4", count=size // 4 * n, offset=r.off).reshape(n, size // 4)
        if np.all(rec[:, 1] == 1):
            r.off += size * n
            return rec[:, 0].copy(), rec[:, -1].copy()
    pos = np.empty(n, np.int32)
    seq = np.empty(n, np.int32)
    for i in range(n):
        pos[i] = r.read("<i", f"cell {i} pos")
        k = r.read("<I", f"cell {i} n_seq_id")
        if k > _MAX_SEQ:
            raise PrefixEdgeError(f"seq-state blob corrupt: cell {i} claims {k} sequences "
                                  f"(at most {_MAX_SEQ})")
        if ext:
            r.skip(ext, f"cell {i} extension")
        ids = [r.read("<i", f"cell {i} seq_id") for _ in range(k)]
        seq[i] = ids[0] if k == 1 else -1
    return pos, seq


def _read_data(r: _Reader, info: SeqStateInfo) -> None:
    v_trans = r.read("<I", "v_trans")
    if v_trans > 1:
        raise PrefixEdgeError(f"seq-state blob corrupt: v_trans is {v_trans}, not 0 or 1")
    n_layer = r.read("<I", "n_layer")
    if not 0 <= n_layer <= _MAX_LAYERS:  # 0: the full-attention part of an all-sliding model
        raise PrefixEdgeError(f"seq-state blob corrupt: n_layer is {n_layer}")
    info.v_trans, info.n_layer = bool(v_trans), n_layer
    n = info.cell_count
    for il in range(n_layer):
        k_type = r.read("<i", f"layer {il} k_type")
        k_row = r.read("<Q", f"layer {il} k_row_bytes")
        if k_row == 0 or k_row > _MAX_EMBD * 4:
            raise PrefixEdgeError(f"seq-state blob corrupt: layer {il} K row is {k_row} bytes")
        info.layers.append(LayerInfo(k_type, k_row, r.skip(n * k_row, f"layer {il} K rows")))
    for il, lay in enumerate(info.layers):
        lay.v_type = r.read("<i", f"layer {il} v_type")
        if not v_trans:
            lay.v_row_bytes = r.read("<Q", f"layer {il} v_row_bytes")
            if lay.v_row_bytes == 0 or lay.v_row_bytes > _MAX_EMBD * 4:
                raise PrefixEdgeError(
                    f"seq-state blob corrupt: layer {il} V row is {lay.v_row_bytes} bytes")
        else:
            lay.v_elem_bytes = r.read("<I", f"layer {il} v_elem_bytes")
            lay.n_embd_v_gqa = r.read("<I", f"layer {il} n_embd_v_gqa")
            if not 0 < lay.v_elem_bytes <= 8 or not 0 < lay.n_embd_v_gqa <= _MAX_EMBD:
                raise PrefixEdgeError(
                    f"seq-state blob corrupt: layer {il} V element {lay.v_elem_bytes} bytes "
                    f"x {lay.n_embd_v_gqa}")
            lay.v_row_bytes = lay.v_elem_bytes * lay.n_embd_v_gqa
        lay.v_offset = r.skip(n * lay.v_row_bytes, f"layer {il} V data")


def check_seq_state(info: SeqStateInfo, expected: dict) -> None:
    """Compare a parsed blob with what the model/manifest says; raise naming the first mismatch.

    Keys of `expected` (each optional): n_layer, cell_count, k_type, v_type, k_row_bytes,
    v_row_bytes, v_trans, n_embd_v_gqa, max_cells, and for a model with sliding-window layers
    swa = {"n_layer": layers in the sliding-window cache, "window": n_swa} (n_layer then counts
    the full-attention cache's), for a hybrid model recurrent = RecurrentInfo.facts() of its own
    state (seqstate_recurrent.check_recurrent). Positions must be 0..cell_count-1 (the sliding-window part:
    the last min(cell_count, window) of them, in order or rotated as a ring wraps) and every cell must belong to exactly one
    sequence, whatever `expected` holds."""
    def bad(what: str, got, want) -> PrefixEdgeError:
        return PrefixEdgeError(f"prefix KV state does not fit: {what} is {got}, expected {want}")

    if "cell_count" in expected and info.cell_count != expected["cell_count"]:
        raise bad("cell count (prefix tokens)", info.cell_count, expected["cell_count"])
    if "max_cells" in expected and info.cell_count > expected["max_cells"]:
        raise bad("cell count", info.cell_count, f"at most {expected['max_cells']} (n_ctx)")
    if info.cell_count == 0:
        raise PrefixEdgeError("prefix KV state is empty (0 cells)")
    swa = expected.get("swa")
    if (swa is None) != (info.swa is None):
        raise bad("sliding-window cache part", "present" if info.swa else "absent",
                  "present" if swa else "absent")
    n = info.cell_count
    ref = next((lay for part in info.parts for lay in part.layers), None)  # layer facts not in `expected`
    for part, first, n_layer in ((info, 0, expected.get("n_layer")),
                                 (info.swa, max(0, n - int((swa or {}).get("window", 0))), (swa or {}).get("n_layer"))):
        if part is None:
            continue
        where = "sliding-window cache " if part is info.swa else ""
        if np.any(part.cell_seq_ids < 0):
            raise PrefixEdgeError("prefix KV state has cells shared by several sequences")
        want_pos = np.arange(first, n, dtype=np.int32)
        if part.cell_count != want_pos.size:
            raise bad(f"{where}cell count", part.cell_count, want_pos.size)
        if part is info.swa and part.cell_count and first < part.positions[0] < n:
            # the sliding-window cache is a ring: past its size (window + a batch) the newest
            # cells wrap to its start, and llama.cpp writes them in cell order; a restore keeps
            # that order, so the attention sums run as in the context that wrote it
            j = int(part.positions[0]) - first
            ring = np.concatenate([want_pos[j:], want_pos[:j]])
            if np.array_equal(part.positions, ring):
                want_pos = ring
        if not np.array_equal(part.positions, want_pos):
            i = int(np.flatnonzero(part.positions != want_pos)[0])
            raise bad(f"{where}position of cell {i}", int(part.positions[i]), int(want_pos[i]))
        if n_layer is not None and part.n_layer != n_layer:
            raise bad(f"{where}layer count", part.n_layer, n_layer)
        if "v_trans" in expected and part.v_trans != bool(expected["v_trans"]):
            raise bad("v_trans (V layout; flash attention off = transposed)", part.v_trans,
                      bool(expected["v_trans"]))
        own = {**expected, **(swa or {})} if part is info.swa else expected  # (Gemma 4: its own row sizes)
        for il, lay in enumerate(part.layers):
            for key, got, fmt in (("k_type", lay.k_type, type_name), ("v_type", lay.v_type, type_name),
                                  ("k_row_bytes", lay.k_row_bytes, str),
                                  ("v_row_bytes", lay.v_row_bytes, str)):
                want = own.get(key, getattr(ref, key) if ref in part.layers or key.endswith("type") else got)
                if got != want:
                    raise bad(f"{where}layer {il} {key}", fmt(got), fmt(want))
            if part.v_trans and "n_embd_v_gqa" in own and lay.n_embd_v_gqa != own["n_embd_v_gqa"]:
                raise bad(f"{where}layer {il} n_embd_v_gqa", lay.n_embd_v_gqa, own["n_embd_v_gqa"])
    check_recurrent(info.recurrent, expected.get("recurrent"), n)


def extract_kv(blob, info: SeqStateInfo | None = None,
               rotation: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-layer K and V [cells, n_embd] (cell order), the layers of each cache's part in turn
    (an iSWA blob: the full-attention layers, then the sliding-window layers with their fewer
    cells); the inverse of build_seq_state. An f16 cache: float16, K (and V when not
    transposed) read-only views of the blob. A q8_0 cache: float32 values, each head's
    Hadamard rotation of order `rotation` undone (runtime/engines/llama/engine.py kv_rotation; 0: none)."""
    info = info or parse_seq_state(blob)
    buf = _view(blob)
    h = None
    if rotation:
        from ..quantize.blocks import hadamard

        h = hadamard(rotation)

    def q8_rows(off: int, row_bytes: int) -> np.ndarray:
        from ..quantize.blocks import q8_0_values

        b = np.frombuffer(buf, np.uint8, n * row_bytes, off).reshape(n, -1, Q8_0_BYTES)
        x = q8_0_values(b[..., 2:].view(np.int8), np.ascontiguousarray(b[..., :2]).view("<f2")[..., 0])
        return x if h is None else (x.reshape(n, -1, rotation) @ h).reshape(n, -1)

    ks, vs = [], []
    for part in info.parts:
        n = part.cell_count
        for il, lay in enumerate(part.layers):
            if lay.k_type == lay.v_type == GGML_TYPE_Q8_0 and not part.v_trans:
                ks.append(q8_rows(lay.k_offset, lay.k_row_bytes))
                vs.append(q8_rows(lay.v_offset, lay.v_row_bytes))
                continue
            if lay.k_type != GGML_TYPE_F16 or lay.v_type != GGML_TYPE_F16:
                raise PrefixEdgeError(f"extract_kv: layer {il} K/V are {type_name(lay.k_type)}/"
                                      f"{type_name(lay.v_type)}; only f16 and q8_0 caches can be extracted")
            ks.append(np.frombuffer(buf, "<f2", n * lay.k_row_bytes // 2, lay.k_offset).reshape(n, -1))
            if part.v_trans:
                vt = np.frombuffer(buf, "<f2", n * lay.n_embd_v_gqa, lay.v_offset)
                vs.append(np.ascontiguousarray(vt.reshape(lay.n_embd_v_gqa, n).T))
            else:
                vs.append(np.frombuffer(buf, "<f2", n * lay.v_row_bytes // 2, lay.v_offset).reshape(n, -1))
    return ks, vs


def all_finite(blob, info: SeqStateInfo) -> bool:
    """No NaN or infinity in the blob's K and V data (F16: all exponent bits set; tested on the
    integer view, which is much faster than a float16 isfinite; Q8_0: in the blocks' scales)."""
    buf = memoryview(blob).cast("B") if not isinstance(blob, np.ndarray) else blob.data
    for part in info.parts:
        if not _part_finite(buf, part):
            return False
    return recurrent_finite(buf, info.recurrent)


def _part_finite(buf, info: SeqStateInfo) -> bool:
    n = info.cell_count
    for lay in info.layers:
        if lay.k_type == GGML_TYPE_Q8_0 or lay.v_type == GGML_TYPE_Q8_0:
            if info.v_trans or lay.k_type != lay.v_type:
                return False  # llama.cpp writes q8_0 K and V together, V untransposed
            for off, nbytes in ((lay.k_offset, n * lay.k_row_bytes), (lay.v_offset, n * lay.v_row_bytes)):
                if nbytes % Q8_0_BYTES:
                    return False
                scales = np.frombuffer(buf, np.uint8, nbytes, off).reshape(-1, Q8_0_BYTES)[:, :2]
                if np.any((np.ascontiguousarray(scales).view("<u2") & 0x7C00) == 0x7C00):
                    return False
            continue
        v_count = n * lay.n_embd_v_gqa if info.v_trans else n * lay.v_row_bytes // 2
        for off, count in ((lay.k_offset, n * lay.k_row_bytes // 2), (lay.v_offset, v_count)):
            if count and np.any((np.frombuffer(buf, "<u2", count, off) & 0x7C00) == 0x7C00):
                return False
    return True
