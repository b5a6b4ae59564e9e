"""The engine protocol: the seam between the scheduler and an inference engine.

An engine owns one model and serves *sequences*. The scheduler (runtime/scheduler/) is its only
caller at run time, from its one engine thread, and makes exactly these calls:

    engine.seq_restore(seq, prefix, keep)
                                      empty `seq`, install a baked prefix or a kept prompt's
                                      state (or none) at 0..P-1 (keep: only its first positions,
                                      where `keeps_partial`)
    engine.seq_copy(src, dst)         dst := src (llama.cpp: shares the KV cells)
    engine.seq_snapshot(seq, ids)     seq's KV copied out as a Prefix (the turn cache)
    engine.forward([(seq, pos, ids)]) one forward over several sequences -> last logits of each
                                      (an item (seq, pos, ids, rows): its last `rows` positions'
                                      logits, [rows, n_vocab], where `verifies`)
    engine.seq_truncate(seq, pos)     drop seq's positions pos.. (a rejected draft's KV)
    engine.seq_free(seq)

A composed request (compose.py) adds, between forwards: kv_of (a state as per-layer K/V
arrays, runtime/engines/kv.py), seq_extend (positions' K/V appended to a sequence as data),
seq_reserve (room for the positions it will hold) and seq_truncate; keys move with runtime/engines/kv.py. prefix_of is kv_of's way back.

A Prefix's state is the engine's own type (engines/prefix.py: llama/state.py SeqBlob,
onnx/state.py KvArrays), made and read by the engine alone; what the engine keeps about one (walked
already, the buffer it lives in) stays in the engine. Around them: prefix_from / load_prefix (a
prefix file's arrays checked and made the engine's Prefix; `lasting`: a task's prefix, restored
again and again, not a cache's entry), write_snapshot / save_prefix (the other way), state_info (what its prefixes depend on),
seq_pos, close. Each engine builds itself from a bundle (Engine.from_bundle: its own options,
context and cache sizes), so the runtime never asks which engine it holds.

`Engine` below is the whole contract: every attribute and call the scheduler, the runtime, the
caches and OneSequence use is declared there, and every engine defines each one (nothing is
probed with getattr; tests/test_engine_protocol.py checks both engines and the test fake).

OneSequence (below) is the single-sequence API, begin / prefill / step, over those same calls:
export's baking, bench and the parity tests use it. Sampling, stop strings, detokenization,
constraints and streaming live above this seam, once. engines/__init__.py maps a backend name to its
engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

from ...errors import PrefixEdgeError
from .prefix import Prefix

if TYPE_CHECKING:
    from ...bundle import Bundle
    from .kv import KvLayers


# The chunk a prefill reads at once, unless Runtime.open(prefill_chunk=...) says otherwise; export
# bakes a prefix in chunks of this size too. An engine's numbers may depend on how many tokens one
# forward holds (llama.cpp's quantized kernels: a batch of 7 and one of 206 round differently, up
# to 1 logit apart on a real Gemma 3 Q4_K_M), so a baked prefix equals its prefill bit for bit when
# both read it in the same chunks: the runtime's uncached prefill of a task reads its prefix in
# these chunks and ends one at the prefix's end, where a baked prefix's input starts.
PREFILL_CHUNK = 128


@dataclass(frozen=True)
class EngineConfig:
    """What Runtime.open asks of an engine; each engine turns it into its own options."""

    device: str = "cpu"
    threads: int | None = None
    n_ctx: int | None = None       # positions one request may use (None: the engine's default)
    slots: int = 4                 # requests decoded together
    prefill_chunk: int = PREFILL_CHUNK
    shared_kv: bool = False        # llama.cpp: one cache shared by every sequence
    kv_cells: int | None = None    # llama.cpp: total KV cells
    verify: str = "cached"
    longest_prefix: int = 0        # the bundle's longest task prefix (must fit a request)
    priority: str = "normal"       # "background": one thread, not spinning, at a lower OS priority
    # llama.cpp's sliding-window layers (Gemma 3): "full" keeps their cells for every position
    # (exact: a hit and a bake equal a prefill); "window" a ring of the window and one batch
    # (less memory on long contexts; answers may differ from a prefill in the last bits)
    window_cache: str = "full"
    # llama.cpp, a model with an MTP head (Qwen3.5's): the head loaded to draft for
    # speculative="mtp" (its context, and on a hybrid snapshots of the recurrent state)
    mtp_head: bool = False


@dataclass(frozen=True)
class StateLayout:
    """What one sequence's state holds, layer kind by layer kind: what the caches may do with a
    stored state follows from it (keep only its first positions, or not)."""

    kv_layers: int             # attention layers whose K and V hold every position
    window_layers: int = 0     # attention layers holding only the last `window` positions (sliding)
    window: int = 0
    recurrent_layers: int = 0  # layers with a state of their own (a conv window, an SSM state):
                               # the state after the last token, with no positions to cut back

    @property
    def keeps_partial(self) -> bool:
        """A stored state's first positions alone can be restored: every layer holds them all."""
        return self.window_layers == 0 and self.recurrent_layers == 0


class Pooler(Protocol):
    """An engine's embeddings runner (runtime/embedding.py): made, used and closed on the
    embedder's own thread only."""

    def pooled(self, batch: list[np.ndarray], pooling: str) -> list[np.ndarray]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Embeddings:
    """What an engine offers the runtime's embedder (Engine.embeddings)."""

    dimensions: int                    # a vector's length (0: this engine cannot embed)
    why_not: str | None                # the one line saying why it cannot, else None
    texts_per_run: int                 # texts one pooled() call runs together
    open: Callable[[int], Pooler]      # the most tokens of one run -> the runner (embedder's thread)


@dataclass
class Opened:
    """An engine from Engine.from_bundle, with what the scheduler needs to know of it."""

    engine: "Engine"
    n_ctx: int                 # positions one request may use
    kv_cells: int | None       # cells the scheduler counts (a shared cache), else None
    shared_kv: bool = False
    request_seqs: tuple[int, ...] = ()
    resident_seqs: tuple[int, ...] = ()


class Engine(Protocol):
    name: str
    device: str
    n_ctx: int           # positions one sequence may hold
    threads: int | None
    n_layers: int
    model_layers: int    # every layer of the model, a hybrid's recurrent ones too
    n_kv_heads: int
    head_dim: int
    kv_dtype_name: str
    n_vocab: int         # the length of the logits forward() returns (the model's vocabulary)
    # The most tokens one forward() takes, all its items together: the scheduler's budget per
    # step and OneSequence's prefill chunk. None: no bound but n_ctx per sequence (ONNX runs
    # the items one after another, each a graph run of any length up to n_ctx).
    n_batch: int | None
    # KV cells allocated for all sequences together (llama.cpp: its context's, every stream).
    # None: no cache of cells (ONNX: each sequence's buffers grow with it; kv_bytes() says
    # what they hold).
    kv_cells_total: int | None
    # The sequence OneSequence (begin / prefill / step, save_prefix) uses, the same on an
    # engine of its own (engines.open_backend) and on a runtime's. Where the engine has a
    # sequence to spare it is none of Opened.request_seqs / resident_seqs: ONNX -1 (any id is
    # a key), llama.cpp with one shared cache 0 (reserved). llama.cpp with a KV stream per slot
    # has none to spare (a sequence id needs a stream of its own, n_seq_max = slots; one more
    # would cost a slot's KV): 0 is then also the first slot's, and the one-sequence API on a
    # runtime's engine is for a runtime with no request running.
    single_seq: int
    state_layout: StateLayout  # which layers hold KV, a window of it, or a recurrent state
    keeps_partial: bool  # seq_restore(keep=...) is allowed: state_layout.keeps_partial
    # Speculative decoding (runtime/scheduler/drafting.py) can run here: forward takes items of four,
    # (seq, pos, ids, rows), returning their last `rows` positions' logits, and seq_truncate
    # cuts a sequence back. False where the state cannot be cut back (not keeps_partial) or the
    # model gives only the last position's logits (an ONNX graph without `logits_rows`):
    # `speculative="lookup"` then decodes as "off".
    verifies: bool
    # The model's own MTP head drafts here (speculative="mtp": mtp_draft(seq, token, pos, k),
    # llama/mtp.py); False: no head, or not loaded (EngineConfig.mtp_head), and "mtp" decodes as "off".
    drafts_mtp: bool
    # One forward of several sequences' tokens gives each sequence the logits of its lone
    # forward, bit for bit. False where the engine computes a token otherwise beside another
    # sequence's (llama.cpp on the tiny seeded Gemma 3 and Gemma 3n, not on the real Gemma 3
    # 270M; measured at open): the scheduler then forwards each decoding sequence alone,
    # so a request's tokens never depend on what else is running.
    batches_sequences: bool
    # How a cached key pairs its rotated dims ("halves" / "adjacent": runtime/engines/kv.py shift_keys).
    rope_layout: str
    # prefill_embeddings runs here (input embeddings in place of tokens: a PEFT soft prompt).
    # False: the model takes token ids only (the ONNX graph: export bakes a soft prompt through
    # an edited copy of it, export/soft_prompt.py).
    takes_embeddings: bool

    @classmethod
    def from_bundle(cls, bundle: "Bundle", model_hashes: dict[str, str], cfg: EngineConfig) -> Opened: ...

    # -- what the scheduler calls ----------------------------------------------------------
    def seq_restore(self, seq: int, prefix: Prefix | None, keep: int | None = None) -> int: ...

    def seq_copy(self, src: int, dst: int) -> None: ...

    def seq_snapshot(self, seq: int, ids: np.ndarray, n_virtual: int = 0) -> Prefix: ...

    def forward(self, items: list[tuple]) -> list[np.ndarray]: ...

    def seq_truncate(self, seq: int, pos: int) -> None: ...  # keep positions 0..pos-1 (verifies)

    def mtp_draft(self, seq: int, token: int, pos: int, k: int) -> list[int]: ...  # (drafts_mtp)

    def seq_free(self, seq: int) -> None: ...

    def seq_pos(self, seq: int) -> int: ...  # seq's next position (after its last stored one)

    # -- KV as data (runtime/engines/kv.py): every layer's K and V of a state's positions ---------------
    def kv_of(self, prefix: Prefix) -> "KvLayers": ...

    # kv's layers in the model's order; `sliding`: which of them are sliding-window layers of
    # `window` positions (an engine that keeps them apart, llama.cpp's iSWA cache, places them)
    def prefix_of(self, kv: "KvLayers", ids: np.ndarray, n_virtual: int = 0,
                  sliding: tuple[int, ...] = (), window: int = 0) -> Prefix: ...

    def seq_extend(self, seq: int, kv: "KvLayers") -> int: ...  # append positions' KV as data

    def seq_reserve(self, seq: int, positions: int) -> None: ...  # room for that many, now

    # -- the one-sequence API's extra (export's baking): float rows [n, hidden] at the position
    def prefill_embeddings(self, emb: np.ndarray) -> np.ndarray: ...

    # -- prefixes in and out ----------------------------------------------------------------
    def prefix_from(self, tensors: dict, meta: dict, where: str, values_checked: bool = False,
                    lasting: bool = False) -> Prefix: ...

    def load_prefix(self, path: Path) -> Prefix: ...

    def read_prefix_ids(self, path: Path) -> np.ndarray: ...

    def save_prefix(self, path: Path, ids: np.ndarray, metadata: dict[str, str]) -> None: ...

    def write_snapshot(self, path: Path, prefix: Prefix, metadata: dict[str, str],
                       mac_key: bytes | None = None) -> None: ...  # mac_key: bundle/prefixfile.py

    def snapshot_bytes(self, n_tokens: int) -> int: ...  # at most a snapshot file's bytes (refused unread above)

    def state_info(self) -> dict: ...

    def prefix_bytes(self, n_tokens: int, file_bytes: int) -> int: ...  # host memory of a loaded prefix

    def memory_info(self) -> dict[str, dict]: ...  # stores of its own: {name: {bytes, budget_bytes}}

    # -- embeddings (runtime/embedding.py) ----------------------------------------------------
    def embeddings(self, max_batch: int) -> Embeddings: ...

    def close(self) -> None: ...


Backend = Engine  # the name the bundle and the CLI use for an engine ("--backend gguf")


class OneSequence:
    """begin / prefill / step on one sequence (`single_seq`) through the engine's own sequence
    calls: no second state of its own but the position. Mixed into both engines."""

    single_seq: int = 0  # Engine.single_seq
    pos: int = 0

    def begin(self, prefix: Prefix | None) -> None:
        """Reset the sequence and install a baked prefix (or none) at 0..P-1."""
        self.pos = 0
        self.pos = self.seq_restore(self.single_seq, prefix)

    def prefill(self, ids: np.ndarray, chunk: int | None = None) -> np.ndarray:
        """Append tokens at the current position, in chunks of `chunk` tokens (None: as many as
        the engine takes at once; never more); the last logits."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise PrefixEdgeError("prefill needs at least one token")
        seq = self.single_seq
        chunk = min(x for x in (chunk, self.n_batch, ids.size) if x)
        logits = None
        for start in range(0, ids.size, chunk):
            part = ids[start:start + chunk]
            try:
                logits = self.forward([(seq, self.pos, part)])[0]
            except PrefixEdgeError:
                self.pos = self.seq_pos(seq)
                raise
            self.pos += part.size
        return logits

    def step(self, token: int) -> np.ndarray:
        """Append one token; its logits."""
        return self.prefill(np.array([token], np.int64))


def fit_prefix(longest: int, n_ctx: int) -> None:
    if longest >= n_ctx:
        raise PrefixEdgeError(f"the bundle's longest task prefix ({longest} tokens) does not fit "
                              f"n_ctx={n_ctx}; raise n_ctx")
