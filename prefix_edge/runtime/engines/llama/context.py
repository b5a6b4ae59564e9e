"""The GGUF engine's llama.cpp context: made with the runtime's settings, made again, larger,
when a sequence outgrows it, and asked at open whether it batches sequences alike
(batches_alike).

llama.cpp allocates (and clears) a context's whole KV cache when the context is made, so a
cache sized for every slot's longest possible request is resident from the first token on:
4 slots x 4096 positions of a Qwen3-0.6B are 1.9 GB, 4.6x its Q4 weights. The engine instead
starts each slot's stream at what the bundle's prefixes need and grows the streams (doubling,
up to the request limit) when a sequence would pass their end: every live sequence's state is
read out, a context with larger streams made, the states written back. A sequence sits at the
same cells of its own stream either way and attends over the same number of cells (the used
ones, rounded up to 256), so its tokens do not depend on when or whether the cache grew
(tests/test_llama_growth.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ....errors import PrefixEdgeError

GROW_STEP = 256  # llama.cpp rounds a stream to 256 cells


@dataclass(frozen=True)
class ContextSpec:
    n_seq_max: int
    n_batch: int | None      # None: a whole context in one llama_decode
    kv_unified: bool
    ggml_kv_type: int
    flash_attn: bool
    threads: int | None
    swa_full: bool = True  # sliding-window layers keep every position's cell (exact; see make_context)
    n_rs_seq: int = 0  # a recurrent state's snapshots kept per sequence, to cut it back (engine.RS_SNAPSHOTS)


def make_context(L, model, spec: ContextSpec, n_ctx: int, device: str):
    """A llama.cpp context of `n_ctx` cells (all streams together) for `model`."""
    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = spec.n_batch or n_ctx  # default: a whole prompt fits one llama_decode
    cp.n_ubatch = min(512, cp.n_batch)
    # Several sequences. kv_unified=False (the runtime's default): each sequence has a KV
    # stream of its own (n_ctx / n_seq_max cells) and always sits at the same cells, so its
    # attention sums run in the same order whatever else is in the cache or the batch: a
    # request's tokens equal its lone run. kv_unified=True: ONE cache shared by every
    # sequence, seq_cp shares a prefix's cells instead of copying them (less memory), but a
    # sequence's cells land wherever room is, and the sums' order (hence near-tie greedy
    # tokens) follows the placement.
    cp.n_seq_max = spec.n_seq_max
    cp.kv_unified = spec.kv_unified
    # sliding-window layers (Gemma 3): their cache as large as the stream (swa_full), not a
    # ring of the window and one batch. In a ring a position's cell depends on the chunks that
    # came before it, and a restored state's cells sit elsewhere than a prefill's: the attention
    # sums then run in other SIMD lanes, and a prompt-cache hit differed from a miss in the last
    # bits (6 of 12 conversations). With the whole stream a position sits at its own cell both
    # ways (seq_restore unfolds the window, seqstate_write.unfold_window): a hit equals a miss.
    # The cost: those layers' cells for every position of a sequence (the stream grows with
    # it, runtime/engines/llama/context.grow), not only the window's; states, bundles and caches
    # still hold the window's cells only.
    cp.swa_full = spec.swa_full  # False: EngineConfig.window_cache "window", the ring (less memory, not exact)
    cp.type_k = cp.type_v = spec.ggml_kv_type
    cp.flash_attn_type = (L.LLAMA_FLASH_ATTN_TYPE_ENABLED if spec.flash_attn
                          else L.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    cp.no_perf = True
    cp.n_rs_seq = spec.n_rs_seq
    if spec.threads:
        cp.n_threads = cp.n_threads_batch = spec.threads
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise PrefixEdgeError(f"cannot create a llama.cpp context (n_ctx={n_ctx}, device={device}, "
                              f"flash_attn={spec.flash_attn}): out of memory?")
    return ctx


def grow(be, need: int) -> None:
    """Make room for `need` positions in every stream of engine `be` (runtime/engines/llama/engine.py), up to
    its max_ctx_seq: the live states read out, a context with larger streams made, the states
    written back. A no-op while they fit."""
    if need <= be.n_ctx_seq or need > be.max_ctx_seq:
        return
    L = be._L
    live = [s for s in range(be.n_seq_max) if L.llama_memory_seq_pos_max(be.mem, s) >= 0]
    # a copy llama.cpp has not carried out yet (it does at the next decode) is taken from its source
    src = {s: be._copied.get(s, s) for s in live}
    states = {s: be.seq_snapshot(src[s], np.zeros(be.seq_pos(src[s]), np.int64)) for s in live}
    cells = grown_cells(be.n_ctx_seq, need, be.max_ctx_seq)
    ctx = make_context(L, be.model, be._spec, cells * be.n_stream, be.device)
    L.llama_free(be.ctx)
    be.ctx, be._copied = ctx, {}
    be.adopt_context()
    head, be.mtp = be.mtp, None  # an MTP head's context is not remade: what it has read stays
    try:
        for s, state in states.items():
            be.seq_restore(s, state)
    finally:
        be.mtp = head


def grown_cells(current: int, need: int, limit: int) -> int:
    """A stream's next size: double, at least `need`, at most `limit`, a multiple of 256."""
    cells = max(2 * current, -(-need // GROW_STEP) * GROW_STEP)
    return min(limit, cells)


def batches_alike(be) -> bool:
    """Whether, in engine `be`'s context, a sequence's token forwarded beside another sequence's
    gets the logits it gets alone (protocol.Engine.batches_sequences): two one-token forwards on
    sequences 0 and 1, together and apart, compared bit for bit (a few milliseconds at open).
    Not so on the tiny seeded Gemma 3 and Gemma 3n (1.8e-5 and 4.6e-4 apart); so on the real
    Gemma 3 270M Q4_K_M."""
    if be.n_seq_max < 2:
        return True
    L = be._L
    ids = np.array([1], np.int64), np.array([2], np.int64)
    try:
        alone = be.forward([(0, 0, ids[0])])[0].copy()
        L.llama_memory_seq_rm(be.mem, 0, -1, -1)
        together = be.forward([(0, 0, ids[0]), (1, 0, ids[1])])[0]
        return bool(np.array_equal(alone, together))
    finally:
        for s in (0, 1):
            L.llama_memory_seq_rm(be.mem, s, -1, -1)
