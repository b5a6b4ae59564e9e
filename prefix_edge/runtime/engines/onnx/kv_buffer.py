"""The fused ONNX graph's KV buffer: one sequence's keys and values, bound as the graph's past
and present at once (extended in place), grown by copying into a larger one. The engine
(engine.py) keeps one per sequence; the embeddings path (embedding.py) one of its own."""

from __future__ import annotations

import numpy as np

GROW_MIN = 64  # positions a buffer has beyond its sequence when made or grown


def round_up(n: int, to: int = 64) -> int:
    """n rounded up to a multiple of `to` (a buffer's capacity)."""
    return -(-n // to) * to


class KvBuffer:
    """One sequence's KV for the fused graph: per layer key and value arrays [1, kv_heads,
    capacity, head_dim] (`shapes`: each input's (kv_heads, head_dim); Gemma 4's differ between
    layers) and the OrtValues over that same memory (bound as past and present).
    np.zeros pages are mapped lazily: RSS grows with the positions written, not the capacity.
    The layers' arrays are views of one slab: numpy asks for huge pages on a large allocation,
    so the first write faults in 2 MB pages, not 4 KB ones (a 1k-token prefix's first restore
    on the default model: 16 ms instead of 32-47 ms in a VM where a page fault is dear)."""

    def __init__(self, shapes: list[tuple[int, int]], dtype, capacity: int):
        import onnxruntime as ort

        self.capacity = capacity
        self.busy = False  # held by a sequence
        sizes = [h * d * capacity for h, d in shapes]
        slab = np.zeros(sum(sizes), dtype)
        self.nbytes = slab.nbytes
        ends = np.cumsum(sizes)
        self.arrays = [slab[end - size:end].reshape(1, h, capacity, d) for size, end, (h, d) in zip(sizes, ends, shapes)]
        self.values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self.arrays]

    def resized(self, pos: int, out: "KvBuffer") -> "KvBuffer":
        """`out` (a buffer of the new capacity) holding this one's first `pos` positions."""
        for src, dst in zip(self.arrays, out.arrays):
            dst[:, :, :pos] = src[:, :, :pos]
        return out
