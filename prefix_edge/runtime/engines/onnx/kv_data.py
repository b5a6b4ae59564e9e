"""The ONNX engine's KV-as-data calls (runtime/engines/kv.py KvLayers; engines/protocol.py): a state's
per-layer K and V as arrays and back, positions' K and V appended to a sequence, room made for
it. A mixin of OnnxBackend (engine.py): it reads the engine's sequences, buffers and dtype."""

from __future__ import annotations

import numpy as np

from ....errors import PrefixEdgeError
from ..kv import KvLayers
from ..prefix import Prefix
from .kv_buffer import GROW_MIN, round_up


class KvData:
    def kv_of(self, prefix: Prefix) -> KvLayers:
        """A state's K and V per layer, [positions, kv_heads, head_dim] (the KV dtype)."""
        kv = prefix.kv
        return KvLayers([np.ascontiguousarray(kv[i][0].transpose(1, 0, 2)) for i in range(0, len(kv), 2)],
                        [np.ascontiguousarray(kv[i][0].transpose(1, 0, 2)) for i in range(1, len(kv), 2)])

    def seq_reserve(self, seq: int, positions: int) -> None:
        """Room for `positions` in `seq` before it needs them: a fused buffer of that capacity
        now (a spare one if any fits), one copy instead of one per growth."""
        past, pos = self.seqs[seq]
        if self.fused and positions > past.capacity:
            old = past
            self.seqs[seq] = (old.resized(pos, self._buffer(min(self.n_ctx, round_up(positions)))), pos)
            self._recycle(old)

    def seq_extend(self, seq: int, kv: KvLayers) -> int:
        """Append `kv`'s positions to sequence `seq` as they are (keys already rotated for where
        they land); its next position. A fused buffer is written in place (grown if needed)."""
        past, pos = self.seqs[seq]
        end = pos + kv.n
        if end > self.n_ctx:
            raise PrefixEdgeError(f"sequence {seq} would hold {end} positions, over n_ctx={self.n_ctx}")
        if self.fused:
            if end > past.capacity:
                old = past
                past = old.resized(pos, self._buffer(min(self.n_ctx, round_up(max(end + GROW_MIN,
                                                                                  2 * old.capacity)))))
                self._recycle(old)
            for i, (k, v) in enumerate(zip(kv.k, kv.v)):
                past.arrays[2 * i][0, :, pos:end] = k.transpose(1, 0, 2)
                past.arrays[2 * i + 1][0, :, pos:end] = v.transpose(1, 0, 2)
        else:
            new = [a.transpose(1, 0, 2)[None].astype(self.kv_dtype) for pair in zip(kv.k, kv.v) for a in pair]
            past = [np.concatenate([np.asarray(p if isinstance(p, np.ndarray) else p.numpy()), a], axis=2)
                    for p, a in zip(past, new)]
        self.seqs[seq] = (past, end)
        return end

    def prefix_of(self, kv: KvLayers, ids: np.ndarray, n_virtual: int = 0,
                  sliding: tuple[int, ...] = (), window: int = 0) -> Prefix:
        """A Prefix of positions 0..n-1 holding `kv` (the inverse of kv_of), restorable here.
        The own graph caches every position of every layer, sliding ones too: `sliding` and
        `window` change nothing here."""
        arrays = []
        for k, v in zip(kv.k, kv.v):
            arrays += [np.ascontiguousarray(a.astype(self.kv_dtype, copy=False).transpose(1, 0, 2)[None])
                       for a in (k, v)]
        return Prefix(np.asarray(ids, np.int64), arrays, {}, sum(a.nbytes for a in arrays),
                      n_virtual=n_virtual, checked_by=self, pin=False)
