"""Pooled embeddings from the GGUF engine's model: llama.cpp's embeddings mode.

A second llama.cpp context on the engine's model (weights shared, nothing copied), made with
`embeddings=True` and no pooling of llama.cpp's: it returns each asked-for token's final-norm
output (what the lm_head reads) and the pooling is done here: "mean" over a text's tokens,
"last" (and "prompt", a wrapped text's last token) the last one's. One context serves every
pooling. A batch's texts are one sequence each in one cache of `cells` cells (cleared before
each batch), fed in llama_decode calls of at most UBATCH tokens (a text may span several: causal
attention over the cache gives a token the same output however the batch is cut). Why so small
a piece: in embeddings mode llama.cpp outputs every token of a decode and reserves a row of
logits for each (n_vocab floats), and its compute buffer grows with the piece; llama.cpp's own
MEAN/LAST pooling needs each text whole in one micro-batch, so a 1,500-token text cost 570 MB
more on the default model (and 2.4 GB after three requests on the 1.5B one, the fault trial);
in UBATCH pieces it costs what a piece costs, whatever the text's length.

Threads: this context is touched by the embedder's own thread only (runtime/embedding.py),
never by the scheduler's engine thread, which has a context of its own; llama.cpp allows
several contexts of one model, each used from one thread. The embedder frees it when idle.
"""

from __future__ import annotations

import numpy as np

from ....errors import PrefixEdgeError

EMBED_THREADS = 1  # the embedder's llama.cpp threads (see _context)


UBATCH = 128  # tokens one llama_decode holds (its logits rows and compute buffer are sized to it)


class LlamaPooled:
    """`pooled(batch, pooling)`: one vector [n_embd] per token-id array of the batch."""

    def __init__(self, be, cells: int, n_seq: int):
        self.be, self.cells, self.n_seq = be, cells, n_seq
        self._ctx = None
        self._batch = None

    def _context(self):
        if self._ctx is not None:
            return self._ctx
        be = self.be
        L = be._L
        if be.model is None:
            raise PrefixEdgeError("the gguf backend is closed")
        cp = L.llama_context_default_params()
        cp.n_ctx = self.cells
        cp.n_batch = cp.n_ubatch = min(UBATCH, self.cells)
        cp.n_seq_max = self.n_seq
        cp.kv_unified = True  # the batch's sequences share one cache of `cells`
        cp.embeddings = True
        cp.pooling_type = L.LLAMA_POOLING_TYPE_NONE  # each token's output; pooled here
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
        cp.no_perf = True
        # one thread: an OpenMP build gives every host thread that runs a parallel region a team
        # of its own, and once two teams exist (the engine thread's and this one's: more threads
        # than CPUs) libgomp throttles every barrier's spinning for good: the generator decoded
        # 77 tok/s before the first embedding and 29 after it, idle embedder or not
        cp.n_threads = cp.n_threads_batch = EMBED_THREADS
        ctx = L.llama_init_from_model(be.model, cp)
        if not ctx:
            raise PrefixEdgeError(f"cannot create a llama.cpp embeddings context ({self.cells} cells): "
                                  "out of memory?")
        self._ctx = ctx
        self._batch = L.llama_batch_init(min(UBATCH, self.cells), 0, 1)
        return ctx

    def pooled(self, batch: list[np.ndarray], pooling: str) -> list[np.ndarray]:
        be = self.be
        L = be._L
        if len(batch) > self.n_seq or sum(len(ids) for ids in batch) > self.cells:
            raise PrefixEdgeError(f"an embeddings batch holds at most {self.n_seq} texts and "
                                  f"{self.cells} tokens")
        ctx = self._context()
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        n = be.n_embd
        sums = [np.zeros(n, np.float64) for _ in batch]
        lasts = [None] * len(batch)
        todo = [(seq, j, tok) for seq, ids in enumerate(batch)
                for j, tok in enumerate(np.asarray(ids, np.int64).tolist())]
        ends = {seq: len(ids) - 1 for seq, ids in enumerate(batch)}
        b, piece = self._batch, min(UBATCH, self.cells)
        for start in range(0, len(todo), piece):
            part = todo[start:start + piece]
            for k, (seq, j, tok) in enumerate(part):
                b.token[k] = tok
                b.pos[k] = j
                b.n_seq_id[k] = 1
                b.seq_id[k][0] = seq
                b.logits[k] = 1  # llama.cpp outputs every token in embeddings mode anyway
            b.n_tokens = len(part)
            rc = be.decode(ctx, b, most=EMBED_THREADS)
            if rc != 0:
                raise PrefixEdgeError(f"llama_decode of an embeddings batch failed (code {rc})")
            for k, (seq, j, _) in enumerate(part):
                if pooling != "mean" and j != ends[seq]:
                    continue
                ptr = L.llama_get_embeddings_ith(ctx, k)
                if not ptr:
                    raise PrefixEdgeError("llama.cpp returned no embedding for a token")
                row = np.ctypeslib.as_array(ptr, shape=(n,))
                if pooling == "mean":
                    sums[seq] += row
                if j == ends[seq]:
                    lasts[seq] = row.astype(np.float32, copy=True)
        if pooling == "mean":
            return [(s / len(ids)).astype(np.float32) for s, ids in zip(sums, batch)]
        return lasts

    def close(self) -> None:
        """Free the context (before the engine frees the model it uses)."""
        L = self.be._L
        if self._batch is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            L.llama_free(self._ctx)
            self._ctx = None
