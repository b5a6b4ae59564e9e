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
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import PrefixEdgeError

SEQ_STATE_MAGIC = 0xAF143CD8
GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0 = 0, 1, 30, 8
Q8_0_BLOCK, Q8_0_BYTES = 32, 34  # ggml's block_q8_0: f16 scale d, then 32 int8 values
_TYPE_NAMES = {GGML_TYPE_F32: "f32", GGML_TYPE_F16: "f16", GGML_TYPE_BF16: "bf16",
               2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0"}
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


def parse_seq_state(blob: bytes | bytearray | memoryview | np.ndarray) -> SeqStateInfo:
    """Walk a whole blob; raise PrefixEdgeError unless it is one well-formed sequence state."""
    buf = memoryview(blob).cast("B") if not isinstance(blob, np.ndarray) else memoryview(
        np.ascontiguousarray(blob).view(np.uint8).reshape(-1))
    r = _Reader(buf)
    magic = r.read("<I", "magic")
    if magic != SEQ_STATE_MAGIC:
        raise PrefixEdgeError(f"not a llama.cpp seq-state blob: magic {magic:#010x}, "
                              f"expected {SEQ_STATE_MAGIC:#010x}")
    seq_id = r.read("<i", "seq_id")
    n_stream = r.read("<I", "n_stream")
    if n_stream != 1:
        raise PrefixEdgeError(f"seq-state blob has {n_stream} KV streams; this runtime reads "
                              "blobs of one-sequence contexts (exactly 1 stream)")
    cell_count = r.read("<I", "cell_count")
    if cell_count * 12 > len(buf) - r.off:   # a cell is at least pos + n_seq_id + one seq id
        raise PrefixEdgeError(f"seq-state blob truncated or corrupt: cell_count {cell_count} "
                              f"needs over {cell_count * 12} bytes, {len(buf) - r.off} left")
    positions, cell_seq = _read_cells(r, cell_count)
    info = SeqStateInfo(seq_id, n_stream, cell_count, positions, cell_seq, False, 0)
    if cell_count:
        _read_data(r, info)
    if r.off != len(buf):
        raise PrefixEdgeError(f"seq-state blob has {len(buf) - r.off} trailing bytes after "
                              f"offset {r.off} (corrupt, or written by another llama.cpp layout)")
    info.nbytes = len(buf)
    return info


def _read_cells(r: _Reader, n: int) -> tuple[np.ndarray, np.ndarray]:
    # fast path: every cell in exactly one sequence -> fixed 12-byte records
    if n and r.off + 12 * n <= len(r.buf):
        rec = np.frombuffer(r.buf, "<i4", count=3 * n, offset=r.off).reshape(n, 3)
        if np.all(rec[:, 1] == 1):
            r.off += 12 * n
            return rec[:, 0].copy(), rec[:, 2].copy()
    pos = np.empty(n, np.int32)
    seq = np.empty(n, np.int32)
    for i in range(n):
        pos[i] = r.read("<i", f"cell {i} pos")
        k = r.read("<I", f"cell {i} n_seq_id")
        if k > _MAX_SEQ:
            raise PrefixEdgeError(f"seq-state blob corrupt: cell {i} claims {k} sequences "
                                  f"(at most {_MAX_SEQ})")
        ids = [r.read("<i", f"cell {i} seq_id") for _ in range(k)]
        seq[i] = ids[0] if k == 1 else -1
    return pos, seq


def _read_data(r: _Reader, info: SeqStateInfo) -> None:
    v_trans = r.read("<I", "v_trans")
    if v_trans > 1:
        raise PrefixEdgeError(f"seq-state blob corrupt: v_trans is {v_trans}, not 0 or 1")
    n_layer = r.read("<I", "n_layer")
    if not 0 < n_layer <= _MAX_LAYERS:
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
    v_row_bytes, v_trans, n_embd_v_gqa, max_cells. Positions must be 0..cell_count-1 and every
    cell must belong to exactly one sequence, whatever `expected` holds."""
    def bad(what: str, got, want) -> PrefixEdgeError:
        return PrefixEdgeError(f"prefix KV state does not fit: {what} is {got}, expected {want}")

    if "cell_count" in expected and info.cell_count != expected["cell_count"]:
        raise bad("cell count (prefix tokens)", info.cell_count, expected["cell_count"])
    if "max_cells" in expected and info.cell_count > expected["max_cells"]:
        raise bad("cell count", info.cell_count, f"at most {expected['max_cells']} (n_ctx)")
    if info.cell_count == 0:
        raise PrefixEdgeError("prefix KV state is empty (0 cells)")
    if np.any(info.cell_seq_ids < 0):
        raise PrefixEdgeError("prefix KV state has cells shared by several sequences")
    want_pos = np.arange(info.cell_count, dtype=np.int32)
    if not np.array_equal(info.positions, want_pos):
        i = int(np.flatnonzero(info.positions != want_pos)[0])
        raise bad(f"position of cell {i}", int(info.positions[i]), i)
    if "n_layer" in expected and info.n_layer != expected["n_layer"]:
        raise bad("layer count", info.n_layer, expected["n_layer"])
    if "v_trans" in expected and info.v_trans != bool(expected["v_trans"]):
        raise bad("v_trans (V layout; flash attention off = transposed)", info.v_trans,
                  bool(expected["v_trans"]))
    for il, lay in enumerate(info.layers):
        for key, got, fmt in (("k_type", lay.k_type, type_name), ("v_type", lay.v_type, type_name),
                              ("k_row_bytes", lay.k_row_bytes, str),
                              ("v_row_bytes", lay.v_row_bytes, str)):
            want = expected.get(key, getattr(info.layers[0], key))
            if got != want:
                raise bad(f"layer {il} {key}", fmt(got), fmt(want))
        if info.v_trans and "n_embd_v_gqa" in expected and lay.n_embd_v_gqa != expected["n_embd_v_gqa"]:
            raise bad(f"layer {il} n_embd_v_gqa", lay.n_embd_v_gqa, expected["n_embd_v_gqa"])


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


def hadamard(n: int) -> np.ndarray:
    """The normalized Sylvester Hadamard matrix of order n (a power of 2), float32."""
    if n < 1 or n & (n - 1):
        raise PrefixEdgeError(f"no Hadamard rotation of order {n} (not a power of 2)")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(np.float32)


def build_seq_state(k: list[np.ndarray], v: list[np.ndarray], v_trans: bool,
                    seq_id: int = 0, kv_type: int = GGML_TYPE_F16, rotation: int = 0) -> bytes:
    """A blob holding cells 0..P-1 of sequence `seq_id`, from per-layer float16 K and V
    arrays [P, n_kv_heads*head_dim] (K post-RoPE in llama.cpp's layout), cached as `kv_type`.

    q8_0: llama.cpp needs flash attention (V untransposed) and may keep a quantized cache's K
    and V rotated, each head by the normalized Hadamard matrix of order `rotation` (0: not
    rotated; runtime/llama.py kv_rotation says which); the rows are rotated so, then quantized
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
    n_layer = len(k)
    cells = np.empty((p, 3), "<i4")
    cells[:, 0], cells[:, 1], cells[:, 2] = np.arange(p), 1, seq_id
    parts = [struct.pack("<IiII", SEQ_STATE_MAGIC, seq_id, 1, p), cells.tobytes(),
             struct.pack("<II", int(v_trans), n_layer)]
    if kv_type == GGML_TYPE_Q8_0:
        h = hadamard(rotation) if rotation else None
        for a in (*k, *v):
            x = np.asarray(a, np.float32)
            if h is not None:
                x = (x.reshape(p, -1, rotation) @ h.T).reshape(p, -1)
            rows = q8_0_rows(x)
            parts += [struct.pack("<iQ", GGML_TYPE_Q8_0, rows.shape[1]), rows.tobytes()]
        return b"".join(parts)
    for a in k:
        parts += [struct.pack("<iQ", GGML_TYPE_F16, a.shape[1] * 2), a.astype("<f2").tobytes()]
    for a in v:
        if v_trans:
            parts += [struct.pack("<iII", GGML_TYPE_F16, 2, a.shape[1]),
                      np.ascontiguousarray(a.T).astype("<f2").tobytes()]
        else:
            parts += [struct.pack("<iQ", GGML_TYPE_F16, a.shape[1] * 2), a.astype("<f2").tobytes()]
    return b"".join(parts)


def extract_kv(blob, info: SeqStateInfo | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-layer K and V as float16 [cell_count, n_embd] (cell order); the inverse of
    build_seq_state. K arrays (and V when not transposed) are read-only views of the blob."""
    info = info or parse_seq_state(blob)
    buf = memoryview(blob).cast("B") if not isinstance(blob, np.ndarray) else memoryview(
        np.ascontiguousarray(blob).view(np.uint8).reshape(-1))
    n = info.cell_count
    ks, vs = [], []
    for il, lay in enumerate(info.layers):
        if lay.k_type != GGML_TYPE_F16 or lay.v_type != GGML_TYPE_F16:
            raise PrefixEdgeError(f"extract_kv: layer {il} K/V are {type_name(lay.k_type)}/"
                                  f"{type_name(lay.v_type)}; only f16 caches can be extracted")
        ks.append(np.frombuffer(buf, "<f2", n * lay.k_row_bytes // 2, lay.k_offset).reshape(n, -1))
        if info.v_trans:
            vt = np.frombuffer(buf, "<f2", n * lay.n_embd_v_gqa, lay.v_offset)
            vs.append(np.ascontiguousarray(vt.reshape(lay.n_embd_v_gqa, n).T))
        else:
            vs.append(np.frombuffer(buf, "<f2", n * lay.v_row_bytes // 2, lay.v_offset).reshape(n, -1))
    return ks, vs


def all_finite(blob, info: SeqStateInfo) -> bool:
    """No NaN or infinity in the blob's K and V data (F16: all exponent bits set; tested on the
    integer view, which is much faster than a float16 isfinite; Q8_0: in the blocks' scales)."""
    buf = memoryview(blob).cast("B") if not isinstance(blob, np.ndarray) else blob.data
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


def in_stream(blob: np.ndarray, stream: int, n_stream: int) -> np.ndarray:
    """A one-stream blob (as bundles store them) re-laid for a context with `n_stream` KV
    streams (llama.cpp `kv_unified = false`: one stream per sequence), the cells in `stream`:
    the stream count, then an empty stream (cell_count 0) for every other one."""
    b = np.ascontiguousarray(blob).view(np.uint8).reshape(-1)
    if n_stream == 1:
        return b
    if b.size < 12 or int(b[8:12].view("<u4")[0]) != 1 or not 0 <= stream < n_stream:
        raise PrefixEdgeError("seq-state blob: expected a one-stream blob to place in a stream")
    out = np.zeros(b.size + 4 * (n_stream - 1), np.uint8)
    out[:8] = b[:8]
    out[8:12] = np.array([n_stream], "<u4").view(np.uint8)
    at = 12 + 4 * stream
    out[at:at + b.size - 12] = b[12:]
    return out


def out_of_stream(blob: np.ndarray, stream: int, n_stream: int) -> np.ndarray:
    """The inverse of in_stream: the one-stream blob of `stream` from a blob that llama.cpp
    wrote for a context of `n_stream` KV streams (every other stream empty). A view of `blob`,
    whose header bytes it rewrites."""
    b = np.ascontiguousarray(blob).view(np.uint8).reshape(-1)
    if n_stream == 1:
        return b
    tail = 4 * (n_stream - 1 - stream)
    at = 12 + 4 * stream
    if b.size < at + 4 + tail or int(b[8:12].view("<u4")[0]) != n_stream or \
            np.any(b[12:at].view("<u4")) or (tail and np.any(b[b.size - tail:].view("<u4"))):
        raise PrefixEdgeError("seq-state blob: not a blob of one sequence's stream")
    head = b[:8].copy()  # the one-stream header goes just before the stream's data: no copy
    b[at - 12:at - 4] = head
    b[at - 4:at] = np.array([1], "<u4").view(np.uint8)
    return b[at - 12:b.size - tail]
