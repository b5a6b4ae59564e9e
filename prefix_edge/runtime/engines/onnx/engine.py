"""ONNX Runtime backend over a decoder graph with past KV: prefix-edge's own fused graph
(export/onnx_graph.py, the default) or optimum's `text-generation-with-past` graph.

One session does prefill and decode. A baked prefix is fed as the first `past_key_values`.
- Fused graph (inputs `seqlens_k`, `total_sequence_length`): a sequence owns one KV buffer per
  layer and kind, [1, n_kv_heads, capacity, head_dim], bound as both past and present, which
  GroupQueryAttention extends in place (rotary positions from seqlens_k). Restoring a prefix
  copies it into the first P positions; a buffer grows (one copy) when a sequence outgrows it.
- optimum graph: the attention mask covers past + new tokens and position ids start at the past
  length (positions starting at 0 would give silently wrong logits); each step returns new
  present tensors (past + new, concatenated by the graph).

A hybrid graph (LFM2, Granite 4.0-H, Falcon-H1: export/onnx_hybrid.py) has KV for its attention
layers only and, per recurrent layer, state inputs `past_conv.{i}` (and a Mamba2 layer's
`past_ssm.{i}`) and outputs `present_conv.{i}` (`present_ssm.{i}`): a sequence keeps those
states after its last token (float32, `self.rec[seq]`), a restore puts them back, and they cannot
be cut back to an earlier position (keeps_partial is False, as on llama.cpp). A Mamba2 graph's
forward of many tokens runs in pieces of SSM_CHUNK.

The state type, its format and prefix files (read, checked, written): state.py.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import numpy as np

from ....bundle import prefixfile
from ....errors import PrefixEdgeError
from .sessions import Sessions
from ..protocol import Embeddings, EngineConfig, OneSequence, Opened, StateLayout, fit_prefix
from ..kv import KvLayers, hf_rope_layout
from ..prefix import Prefix
from .kv_buffer import GROW_MIN, KvBuffer, round_up
from .state import BACKEND, KvArrays, KvFormat

SSM_CHUNK = 256  # tokens per graph run of a Mamba2 graph (its [heads, n, n] terms stay small)
STATE_INPUTS = ("past_conv.", "past_ssm.")  # a hybrid's states: export/onnx_hybrid.py's names (export is above)
MODEL_LAYERS = "prefix_edge.model_layers"  # the graph's metadata: export/onnx_graph.py's name
_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def available_devices() -> list[str]:
    import onnxruntime as ort

    provs = ort.get_available_providers()
    return ["cpu"] + (["cuda"] if "CUDAExecutionProvider" in provs else [])


class OnnxBackend(OneSequence):
    name = BACKEND
    single_seq = -1  # the one-sequence API's own sequence: never one of the scheduler's
    n_batch = None  # a forward runs its items one after another, each up to n_ctx tokens
    kv_cells_total = None  # no cache of cells: a sequence's buffers grow with it (kv_bytes)

    @classmethod
    def from_bundle(cls, bundle, model_hashes: dict[str, str], cfg: EngineConfig) -> Opened:
        """The bundle's ONNX graph; the model's hash (checked by the bundle) keys this machine's
        session cache, whose files are verified alike. A sequence's KV grows as it needs."""
        from ..cpus import default_threads

        model = bundle.model_file("onnx")
        limit = bundle.manifest.model.n_ctx
        ctx = min(limit, cfg.n_ctx) if cfg.n_ctx else limit
        fit_prefix(cfg.longest_prefix, ctx)
        rel = str(model.relative_to(bundle.root))
        background = cfg.priority == "background"
        be = cls(model, device=cfg.device, threads=cfg.threads or (1 if background else default_threads()),
                 n_ctx=ctx, verify=cfg.verify, model_sha256=model_hashes[rel],
                 adaptive=cfg.threads is None and not background, background=background,
                 rope_layout=hf_rope_layout(bundle.manifest.model))
        return Opened(be, ctx, None, False, request_seqs=tuple(range(cfg.slots)))

    def __init__(self, model_path: Path, device: str = "cpu", threads: int | None = None,
                 n_ctx: int = 2048, verify: str = "cached", model_sha256: str | None = None,
                 adaptive: bool = False, background: bool = False, prefix_store: str = "f32",
                 rope_layout: str = "halves"):
        if device == "auto":
            device = "cuda" if "cuda" in available_devices() else "cpu"
        if device == "cuda" and "cuda" not in available_devices():
            raise PrefixEdgeError(
                "device 'cuda' asked for, but this onnxruntime has no CUDA provider "
                "(install prefix-edge[gpu] instead of onnxruntime, with a CUDA driver present)")
        if device not in ("cpu", "cuda"):
            raise PrefixEdgeError(f"the onnx backend runs on 'cpu' or 'cuda', not {device!r}")
        self.device, self.n_ctx, self.threads = device, n_ctx, threads
        self.rope_layout = rope_layout  # the HF model's (the graph is built from it): runtime/engines/kv.py hf_rope_layout
        # the full session, and while the CPUs are contended a lean one (sessions.py)
        self._sessions = Sessions(Path(model_path), device, threads, verify, model_sha256,
                                  adaptive=adaptive, background=background)
        self.session, self.session_source = self._sessions.full, self._sessions.source
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.past_names = sorted((n for n in inputs if n.startswith("past_key_values.")),
                                 key=lambda n: (int(n.split(".")[1]), n.endswith("value")))
        if not self.past_names:
            raise PrefixEdgeError(f"{model_path}: not a decoder graph with past_key_values inputs")
        self.present_names = [n.replace("past_key_values.", "present.") for n in self.past_names]
        self.state_names = sorted((n for n in inputs if n.startswith(STATE_INPUTS)),
                                  key=lambda n: (int(n.split(".")[1]), n))
        self.state_out = [n.replace("past_", "present_", 1) for n in self.state_names]
        self.state_shapes = [(1, *(int(d) for d in inputs[n].shape[1:])) for n in self.state_names]
        # a Mamba2 graph computes n tokens with [heads, n, n] terms: forwards go in pieces
        self.piece = SSM_CHUNK if any(n.startswith("past_ssm.") for n in self.state_names) else None
        self.rec: dict[int, list[np.ndarray]] = {}  # a hybrid's recurrent states per sequence
        # the model's layers: attention ones (KV), recurrent ones (a state), or both in one layer
        self.model_layers = 1 + max(int(n.split(".")[1]) for n in self.past_names + self.state_names)
        # ... and layers holding neither (Gemma 3n's KV-shared ones), as the graph declares them
        declared = self.session.get_modelmeta().custom_metadata_map.get(MODEL_LAYERS, "")
        if declared.isdigit() and int(declared) >= self.model_layers:
            self.model_layers = int(declared)
        self.recurrent_layers = len({n.split(".")[1] for n in self.state_names})
        first = inputs[self.past_names[0]]
        self.n_layers = len(self.past_names) // 2
        # each KV input's (heads, head_dim): layers may differ (Gemma 4's global and sliding ones)
        self.kv_shapes = [(int(inputs[n].shape[1]), int(inputs[n].shape[3])) for n in self.past_names]
        self.n_kv_heads, self.head_dim = self.kv_shapes[0]  # (the first layer's: what inspect reports)
        self.position_values = sum(h * d for h, d in self.kv_shapes)  # the values one position adds
        self.kv_dtype = _ORT_DTYPES[first.type]
        self.has_position_ids = "position_ids" in inputs
        self.fused = "seqlens_k" in inputs  # the own fused graph: KV extended in place
        if self.state_names and not self.fused:
            raise PrefixEdgeError(f"{model_path}: a graph with recurrent states but without the fused "
                                  "attention inputs (seqlens_k); re-export the bundle")
        if self.fused and device != "cpu":
            raise PrefixEdgeError(f"{model_path}: the fused ONNX graph runs on the CPU; for CUDA export "
                                  "the bundle with --onnx-builder optimum")
        self.output_names = ["logits", *self.present_names]
        logits = next((o for o in self.session.get_outputs() if o.name == "logits"), None)
        if logits is None or not isinstance(logits.shape[-1], int):
            raise PrefixEdgeError(f"{model_path}: not a decoder graph with a logits output of a fixed vocabulary")
        self.n_vocab = int(logits.shape[-1])
        # a graph whose logits hold the last few positions (onnx_graph.py LOGITS_TAIL, declared
        # "rows"; docs/bundle-format.md) verifies drafts; one of the last position only does not
        # ... and a rejected draft is cut back, which a recurrent state cannot be
        self.verifies = self.fused and logits.shape[1] != 1 and not self.state_names
        self.drafts_mtp = False  # an MTP head runs on llama.cpp only (llama/mtp.py)
        self.batches_sequences = True  # forward runs its items one after another, each its own graph run
        self._kv_device = "cuda" if device == "cuda" else "cpu"  # presents stay where ORT made them
        self.seqs: dict[int, tuple[list, int]] = {}
        self._spare: list[KvBuffer] = []  # buffers of freed sequences, reused (fused graph)
        self._homes: list[tuple] = []  # (state ref, its home buffer): see _start
        # what a state of this graph is; save_prefix / write_snapshot store KV as prefix_store
        self.format = KvFormat(tuple(self.past_names), tuple(self.state_names), tuple(self.state_shapes),
                               tuple(self.kv_shapes), self.kv_dtype, self.position_values, prefix_store)

    # -- sequences (the engine protocol: restore, copy, forward, free) --------------------
    # A sequence is its past and its length. Fused graph: its own KvBuffer (a prefix is copied
    # in at restore; the graph extends the buffer in place; freed buffers become spares).
    # optimum's graph: a list of past tensors; a restored prefix's arrays are shared (read-only)
    # by every sequence of that task until its first forward, which returns new present tensors.
    # Sequences run one after another: one row per run keeps every request bit-identical to
    # running alone (see runtime/scheduler/loop.py).
    @property
    def state_layout(self) -> StateLayout:
        """Every attention layer's KV holds every position (a sliding layer's window is the
        graph's mask, not a shorter buffer); a hybrid's recurrent layers hold one state."""
        return StateLayout(kv_layers=self.n_layers, recurrent_layers=self.recurrent_layers)

    @property
    def keeps_partial(self) -> bool:
        """seq_restore can keep a state's first positions: not with a recurrent state."""
        return self.state_layout.keeps_partial

    def _states(self, prefix: Prefix | None) -> list[np.ndarray]:
        """A new sequence's recurrent states: the prefix's (copied: a forward replaces them) or
        zeros (no token yet: the causal conv's own zero padding)."""
        if prefix is None:
            return [np.zeros(s, np.float32) for s in self.state_shapes]
        return [np.array(a, np.float32) for a in prefix.state.states]

    def _start(self, prefix: Prefix | None, keep: int | None = None) -> tuple:
        """A new sequence's (past, position): the prefix's KV or none.

        Fused graph: the first sequence of a prefix copies it into a buffer that becomes the
        prefix's home: the prefix's arrays are then views of that buffer's first P positions,
        which no forward writes (GQA appends after them). While no sequence holds it, the next
        sequence of that prefix takes the home as it is: a task switch copies nothing."""
        n = 0 if prefix is None else prefix.n_tokens
        if keep is not None and keep < n:  # the first positions of a state: views, never a home
            if self.state_names:
                raise PrefixEdgeError(f"cannot keep {keep} of a state's {n} positions: its recurrent "
                                      "layers hold only the state after the last one")
            if keep < 0:
                raise PrefixEdgeError(f"cannot keep {keep} of a state's {n} positions")
            kv = [t[:, :, :keep] for t in prefix.state.kv]
            prefix, n = Prefix(prefix.ids[:max(0, keep - prefix.n_virtual)], KvArrays(kv),
                               n_virtual=min(prefix.n_virtual, keep)), keep
        state = prefix.state if prefix is not None else None
        if self.fused:
            home = state.home if state is not None and state.home is not None and \
                state.home[0]() is self else None
            if home is not None and not home[1].busy:
                home[1].busy = True
                return home[1], n
            homing = state is not None and state.home is None and state.lasting
            buf = self._buffer(min(self.n_ctx, round_up(n + GROW_MIN)),
                               most=self._home_positions(n) if homing else None)
            if state is not None:
                for a, kv in zip(buf.arrays, state.kv):
                    a[:, :, :n] = kv
                if homing:
                    state.home = (weakref.ref(self), buf)
                    state.kv = [a[:, :, :n] for a in buf.arrays]  # the loaded KV arrays go
                    self._homes.append((weakref.ref(state), buf))
            return buf, n
        if state is not None:
            return list(state.kv), n
        return [np.zeros((1, h, 0, d), self.kv_dtype) for h, d in self.kv_shapes], 0

    def _home_positions(self, n: int) -> int:
        """The largest buffer a prefix of n positions takes as its home (a bigger spare is
        left for a longer sequence: the prefix cache never pins a whole context)."""
        return min(self.n_ctx, 2 * round_up(n + GROW_MIN))

    def position_bytes(self) -> int:
        """Bytes of KV one position holds (every layer's key and value)."""
        return self.position_values * np.dtype(self.kv_dtype).itemsize

    takes_embeddings = False  # the graph takes token ids (a soft prompt: export/soft_prompt.py)

    def prefill_embeddings(self, emb: np.ndarray) -> np.ndarray:
        raise PrefixEdgeError("the onnx engine's graph takes token ids only (export bakes a soft "
                              "prompt through an edited copy of it: export/soft_prompt.py)")

    def embeddings(self, max_batch: int) -> Embeddings:
        """The own graph's hidden_states output (embedding.py), one text per run."""
        from .embedding import HIDDEN_STATES, OnnxHidden, unsupported

        out = next((o for o in self.session.get_outputs() if o.name == HIDDEN_STATES), None)
        dims = int(out.shape[-1]) if out is not None and isinstance(out.shape[-1], int) else 0
        return Embeddings(dims, unsupported(self), 1, lambda max_tokens: OnnxHidden(self))

    def prefix_bytes(self, n_tokens: int, file_bytes: int) -> int:
        """The most host memory a loaded prefix of n_tokens positions holds (its arrays, or
        the fused graph's home buffer of it)."""
        return self.position_bytes() * (self._home_positions(n_tokens) if self.fused else n_tokens) + \
            self.format.state_bytes()

    def memory_info(self) -> dict[str, dict]:
        """kv_spares: freed KV buffers kept for reuse, their bytes and the bound (SPARE_BYTES,
        or SPARE_BUFFERS whole contexts where that is less)."""
        return {"kv_spares": {"bytes": sum(b.nbytes for b in list(self._spare)),
                              "budget_bytes": min(SPARE_BYTES, SPARE_BUFFERS * self.n_ctx * self.position_bytes())}}

    def _buffer(self, capacity: int, most: int | None = None) -> "KvBuffer":
        """A KV buffer of at least `capacity` positions (and at most `most`: a prefix's home):
        a spare one (its pages already mapped: a fresh one costs a page fault per 4 KB on first
        write) or a new one."""
        alive = []
        for ref, buf in self._homes:  # homes of prefixes gone (not held by a sequence) are spares
            if ref() is not None:
                alive.append((ref, buf))
            elif not buf.busy:
                self._recycle(buf)
        self._homes = alive
        fits = [b for b in self._spare if capacity <= b.capacity <= (most or b.capacity)]
        if fits:
            buf = min(fits, key=lambda b: b.capacity)
            self._spare.remove(buf)
        else:
            buf = KvBuffer(self.kv_shapes, self.kv_dtype, capacity)
        buf.busy = True
        return buf

    def _recycle(self, past) -> None:
        """Keep a dropped sequence's buffer as a spare (at most SPARE_BUFFERS, SPARE_BYTES)."""
        if not isinstance(past, KvBuffer):
            return
        past.busy = False
        if any(buf is past and ref() is not None for ref, buf in self._homes):
            return  # a live prefix's home: kept for that prefix's next sequence
        self._homes = [(ref, buf) for ref, buf in self._homes if buf is not past]
        self._spare.append(past)
        self._spare.sort(key=lambda b: -b.nbytes)
        while len(self._spare) > SPARE_BUFFERS or sum(b.nbytes for b in self._spare) > SPARE_BYTES:
            self._spare.pop(0)  # the biggest goes first

    def seq_restore(self, seq: int, prefix: Prefix | None, keep: int | None = None) -> int:
        if seq in self.seqs:
            self._recycle(self.seqs[seq][0])
        self.seqs[seq] = self._start(prefix, keep)
        if self.state_names:
            self.rec[seq] = self._states(prefix)
        return self.seqs[seq][1]

    def seq_copy(self, src: int, dst: int) -> None:
        past, pos = self.seqs[src]
        if dst in self.seqs:
            self._recycle(self.seqs[dst][0])
        self.seqs[dst] = (past.resized(pos, self._buffer(past.capacity)) if self.fused else list(past), pos)
        if self.state_names:
            self.rec[dst] = [a.copy() for a in self.rec[src]]

    def seq_snapshot(self, seq: int, ids: np.ndarray, n_virtual: int = 0) -> Prefix:
        """Sequence `seq`'s KV now (all its positions) copied out, as a Prefix seq_restore puts
        back into any sequence (never a buffer's home: it would pin a whole buffer)."""
        past, pos = self.seqs[seq]
        if self.fused:
            kv = [a[:, :, :pos].copy() for a in past.arrays]
        else:
            kv = [np.array(v if isinstance(v, np.ndarray) else v.numpy()) for v in past]
        return Prefix(np.asarray(ids, np.int64), KvArrays(kv, [a.copy() for a in self.rec.get(seq, [])]),
                      n_virtual=n_virtual)

    # -- prefixes in and out: the state's format (state.py) -------------------------------
    def load_prefix(self, path: Path) -> Prefix:
        """Read a prefix file through the codec (prefixfile.py) and check it for this graph."""
        tensors, meta = prefixfile.read(path)
        return self.prefix_from(tensors, meta, str(path), lasting=True)

    def prefix_from(self, tensors: dict, meta: dict, where: str, values_checked: bool = False,
                    lasting: bool = False) -> Prefix:
        """A Prefix from a prefix file's arrays, checked against this graph (lasting: a task's
        prefix, which may take a KV buffer as its home; state.py KvArrays)."""
        return self.format.read(tensors, meta, where, values_checked, lasting)

    def read_prefix_ids(self, path: Path) -> np.ndarray:
        return prefixfile.read_ids(path)

    def state_info(self) -> dict:
        """What restoring a prefix depends on beyond the model files (recorded in the manifest)."""
        return {}

    @property
    def kv_dtype_name(self) -> str:
        return np.dtype(self.kv_dtype).name

    def save_prefix(self, path: Path, ids: np.ndarray, metadata: dict[str, str]) -> None:
        """Write the current sequence (a prefilled prefix) as a prefix file."""
        state = self.seq_snapshot(self.single_seq, ids).state
        self.format.write(path, ids, state.kv, state.states, metadata)

    def write_snapshot(self, path: Path, prefix: Prefix, metadata: dict[str, str],
                       mac_key: bytes | None = None) -> None:
        self.format.write(path, prefix.ids, prefix.state.kv, prefix.state.states,
                          {**metadata, "n_virtual": str(prefix.n_virtual)}, mac_key)

    def snapshot_bytes(self, n_tokens: int) -> int:
        return self.format.snapshot_bytes(n_tokens)

    # -- KV as data (runtime/engines/kv.py) ----------------------------------------------------
    def kv_of(self, prefix: Prefix) -> KvLayers:
        return self.format.kv_of(prefix.state)

    def prefix_of(self, kv: KvLayers, ids: np.ndarray, n_virtual: int = 0,
                  sliding: tuple[int, ...] = (), window: int = 0) -> Prefix:
        """The inverse of kv_of; the own graph caches every position of every layer, sliding
        ones too: `sliding` and `window` change nothing here."""
        return self.format.prefix_of(kv, ids, n_virtual)

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

    def kv_bytes(self) -> int:
        """Bytes of KV the sequences hold: a fused graph's buffers at their capacity; arrays
        shared by several sequences (a restored prefix before its first forward) count once."""
        seen, total = set(), 0
        for past, _pos in self.seqs.values():
            for t in (past.arrays if self.fused else past):
                if id(t) not in seen:
                    seen.add(id(t))
                    total += t.nbytes if isinstance(t, np.ndarray) else \
                        int(np.prod(t.shape())) * np.dtype(self.kv_dtype).itemsize
        return total + len(self.seqs) * self.format.state_bytes()

    def seq_free(self, seq: int) -> None:
        if seq in self.seqs:
            self._recycle(self.seqs.pop(seq)[0])
        self.rec.pop(seq, None)

    def forward(self, items: list[tuple]) -> list[np.ndarray]:
        """Each item a graph run of its own: (seq, pos, ids) -> the last position's logits;
        (seq, pos, ids, rows) -> the last `rows` positions' [rows, n_vocab] (`verifies`)."""
        out = []
        for seq, pos, ids, *rows in items:
            past, have = self.seqs[seq]
            if pos != have:
                raise PrefixEdgeError(f"sequence {seq} is at position {have}, not {pos}")
            n_rows = min(int(rows[0]), int(np.asarray(ids).size)) if rows else 0
            if n_rows > 1 and not self.verifies:
                raise PrefixEdgeError("this ONNX graph gives only the last position's logits")
            ids = np.asarray(ids, dtype=np.int64).reshape(-1)
            step = self.piece or max(1, ids.size)
            for start in range(0, ids.size - step, step):  # all but the last piece (Mamba2 graphs)
                _, past = self._run(past, pos + start, ids[start:start + step], 1, seq)
            last = (ids.size - 1) // step * step
            logits, past = self._run(past, pos + last, ids[last:], max(n_rows, 1), seq)
            if logits.shape[0] != max(n_rows, 1):
                raise PrefixEdgeError(f"the ONNX graph gave {logits.shape[0]} rows of logits, not {n_rows}")
            self.seqs[seq] = (past, pos + ids.size)
            out.append(logits if n_rows else logits[-1])
        return out

    def mtp_draft(self, seq: int, token: int, pos: int, k: int) -> list[int]:
        return []  # no MTP head in the graph (drafts_mtp)

    def seq_truncate(self, seq: int, pos: int) -> None:
        """Keep `seq`'s positions 0..pos-1: a fused buffer's length; other graphs' past arrays
        cut (copied out of ORT's)."""
        past, have = self.seqs[seq]
        if not 0 <= pos <= have:
            raise PrefixEdgeError(f"cannot cut sequence {seq} at {have} back to {pos}")
        if self.state_names and pos != have:
            raise PrefixEdgeError(f"cannot cut sequence {seq} at {have} back to {pos}: its recurrent "
                                  "layers hold only the state after the last token")
        if not self.fused:
            past = [np.ascontiguousarray(np.asarray(v if isinstance(v, np.ndarray) else v.numpy())[:, :, :pos])
                    for v in past]
        self.seqs[seq] = (past, pos)

    def seq_pos(self, seq) -> int:
        return self.seqs[seq][1] if seq in self.seqs else 0

    def _run(self, past: list, pos: int, ids: np.ndarray, rows: int = 1, seq: int | None = None):
        """Append `ids` at `pos` after `past`; return the last `rows` positions' logits
        [rows, n_vocab] and the new past.

        Runs through an IO binding: the presents stay OrtValues owned by ORT and are bound as
        the next call's past directly, so the KV is never copied out to numpy between steps
        (with plain `run`, every step copies the whole cache once more)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        n = ids.shape[1]
        if n == 0:
            raise PrefixEdgeError("prefill needs at least one token")
        if pos + n > self.n_ctx:
            raise PrefixEdgeError(f"context full: {pos} + {n} tokens exceed n_ctx={self.n_ctx}")
        if self.fused:
            return self._run_fused(past, pos, ids, rows, seq)
        with self.running() as session:
            return self._run_past(session, past, pos, ids, rows, n)

    def _run_past(self, session, past, pos: int, ids: np.ndarray, rows: int, n: int):
        b = session.io_binding()
        b.bind_cpu_input("input_ids", ids)
        b.bind_cpu_input("attention_mask", np.ones((1, pos + n), np.int64))
        if self.has_position_ids:
            b.bind_cpu_input("position_ids", np.arange(pos, pos + n, dtype=np.int64)[None])
        for name, value in zip(self.past_names, past):
            if isinstance(value, np.ndarray):
                b.bind_cpu_input(name, value)
            else:
                b.bind_ortvalue_input(name, value)
        b.bind_output("logits", "cpu")
        for name in self.present_names:
            b.bind_output(name, self._kv_device)
        try:
            session.run_with_iobinding(b)
        except Exception as e:  # ORT raises its own types; give one line
            raise PrefixEdgeError(f"ONNX Runtime failed: {str(e).splitlines()[0]}") from None
        out = b.get_outputs()
        return np.array(out[0].numpy()[0, -rows:], dtype=np.float32), out[1:]

    def _run_fused(self, buf: "KvBuffer", pos: int, ids: np.ndarray, rows: int = 1, seq: int | None = None):
        n = ids.shape[1]
        if pos + n > buf.capacity:
            old = buf
            buf = old.resized(pos, self._buffer(min(self.n_ctx, round_up(max(pos + n + GROW_MIN,
                                                                          old.capacity * 3 // 2)))))
            self._recycle(old)
        with self.running() as session:
            return self._run_buffer(session, buf, pos, ids, rows, seq, n)

    def _run_buffer(self, session, buf: "KvBuffer", pos: int, ids: np.ndarray, rows: int, seq, n: int):
        b = session.io_binding()
        b.bind_output("logits", "cpu")
        b.bind_cpu_input("input_ids", ids)
        b.bind_cpu_input("seqlens_k", np.array([pos + n - 1], np.int32))
        b.bind_cpu_input("total_sequence_length", np.array(pos + n, np.int32))
        for past_name, present_name, value in zip(self.past_names, self.present_names, buf.values):
            b.bind_ortvalue_input(past_name, value)
            b.bind_ortvalue_output(present_name, value)  # the same buffer: extended in place
        states = self.rec.get(seq) if self.state_names else None
        for name, out, value in zip(self.state_names, self.state_out, states or ()):
            b.bind_cpu_input(name, value)
            b.bind_output(out, "cpu")  # a new array: the graph reads the old one to make it
        try:
            session.run_with_iobinding(b)
        except Exception as e:  # ORT raises its own types; give one line
            raise PrefixEdgeError(f"ONNX Runtime failed: {str(e).splitlines()[0]}") from None
        out = b.get_outputs()
        if states is not None:
            self.rec[seq] = [np.array(v.numpy(), np.float32) for v in out[len(out) - len(states):]]
        return np.array(out[0].numpy()[0, -rows:], dtype=np.float32), buf

    def running(self):
        """The session a forward runs on now, held (a context manager): sessions.py."""
        return self._sessions.running()

    def close(self) -> None:
        self._sessions.close()
        self.session = None
        self.seqs = {}
        self.rec = {}
        self._spare = []
        self._homes = []


SPARE_BUFFERS, SPARE_BYTES = 2, 128 << 20  # freed buffers kept for reuse

