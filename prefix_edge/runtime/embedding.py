"""Sentence embeddings from the bundle's own model (`Runtime.embed`, the server's /v1/embeddings).

A text is tokenized by the bundle's tokenizer as it is (no chat template, no task prefix, no
BOS added; a special token it spells stays text), run through the model from position 0, and its
final-norm hidden states (what the lm_head reads) pooled: "mean" over the text's tokens,
"last" (the last token's, which has attended to every token before it), or "prompt" (PromptEOL,
Jiang et al. 2023: the text placed in `This sentence : "<text>" means in one word:"` and the last
token's state taken, where a decoder sums the sentence up to predict the next word; the prompt's
pieces are tokenized on their own and joined to the text's ids, token-id inputs included), then
L2-normalised unless asked not to. "prompt" is the default (measured: docs/embeddings.md). Engines: llama.cpp's embeddings mode (engines/llama/embedding.py: pooled
by llama.cpp) and the own ONNX graph's hidden_states output (engines/onnx/embedding.py: pooled
here). A text's vector does not depend on what it is batched with (ONNX: bit-identical; llama.cpp:
within float rounding, tests/test_embeddings.py) nor on the engine beyond the model files'
own difference (docs/embeddings.md has the measured cosines).

Threads: the embedder has one thread of its own, started on the first call, which alone touches
its native state (llama.cpp's embeddings context, the ONNX KV buffer); the scheduler's engine
thread is not involved, and the two share the CPU. Calls from any thread queue their texts; the
embedder's thread takes the queue in batches (up to MAX_BATCH texts and `cells` tokens for
llama.cpp, whose one llama_decode runs them together), so concurrent callers are batched together.

Limits, as for chats: a call holds at most `request_tokens` tokens (OptionError naming `input`),
the queue at most `queue_tokens` (RuntimeBusy: the server's 429); a batch takes its texts from
the waiting calls in turn (one text of each, round and round), so a small call is not stuck
behind a large one; `cancel(job)` (a client that hung up) drops a call's texts not yet run. The
engine's native state is freed after IDLE_S seconds without a call (and made again at the next).
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError

import numpy as np

from ..errors import PrefixEdgeError, RuntimeBusy, RuntimeClosed, engine_error
from ..options import MAX_INPUT_BYTES, OptionError, check_text

POOLINGS = ("mean", "last", "prompt")
# the default: on the default model's paraphrase retrieval (docs/embeddings.md) recall@1
# 0.93-1.00 against mean's 0.55-0.70 and last's 0.62-0.82, both engines, three seeded sets
DEFAULT_POOLING = "prompt"
# pooling "prompt" (PromptEOL): the text between these, the last token's state
PROMPT_HEAD, PROMPT_TAIL = 'This sentence : "', '" means in one word:"'
MAX_INPUTS = 2048   # texts in one call (OpenAI's limit for one embeddings request)
MAX_TOKENS = 2048   # tokens of one text (and of one llama.cpp batch: its embeddings context's cells)
MAX_BATCH = 16      # texts the embedder's thread runs together (llama.cpp: one llama_decode)
REQUEST_TOKENS = 65536   # tokens one call may hold (32 full-length texts)
QUEUE_TOKENS = 262144    # tokens waiting at most, all calls together; beyond: RuntimeBusy
IDLE_S = 60.0            # seconds without a call after which the native state is freed


class Job:
    """One call: its texts' ids, pooling, and the vectors as they come."""

    def __init__(self, ids: list[np.ndarray], pooling: str, normalize: bool, wrap: int = 0):
        self.ids, self.pooling, self.normalize = ids, pooling, normalize
        self.out: list[np.ndarray | None] = [None] * len(ids)
        self.left = len(ids)
        self.future: Future = Future()
        self.tokens = sum(len(i) for i in ids) - wrap * len(ids)  # the input's (no prompt's)
        self.cost = sum(len(i) for i in ids)  # what it holds in the queue (with the prompt's)
        self.next = 0  # its first text not yet taken


class Embedder:
    """The runtime's embeddings: `submit(items, pooling, normalize)` -> a Future of the
    (n, d) float32 array; `embed(...)` waits for it."""

    def __init__(self, backend, tokenizer, n_ctx: int, request_tokens: int = REQUEST_TOKENS,
                 queue_tokens: int = QUEUE_TOKENS, idle_s: float = IDLE_S):
        self.backend, self.tokenizer = backend, tokenizer
        self.max_tokens = min(n_ctx, MAX_TOKENS)
        self.request_tokens, self.queue_tokens, self.idle_s = request_tokens, queue_tokens, idle_s
        self.n_vocab = int(backend.n_vocab)
        self._jobs: deque = deque()  # calls with texts not yet taken, in turn
        self._queued = 0             # their tokens not yet taken
        self.running = 0             # texts being run now
        self.done = self.cancelled = self.refused = 0  # calls answered / cancelled / refused busy
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.offer = backend.embeddings(MAX_BATCH)  # what the engine offers (protocol.Embeddings)
        self._runner = None  # the engine's Pooler, made in the embedder's thread
        self._text_tok = None
        self._prompt_ids: tuple[list[int], list[int]] | None = None  # _wrap()

    # -- the caller's thread: inputs checked and tokenized ------------------------------------
    def _encode(self, text: str) -> list[int]:
        if self._text_tok is None:  # special tokens the text spells are encoded as text
            from tokenizers import Tokenizer

            tok = Tokenizer.from_str(self.tokenizer.to_str())
            tok.encode_special_tokens = True
            self._text_tok = tok
        return self._text_tok.encode(text, add_special_tokens=False).ids

    def _wrap(self) -> tuple[list[int], list[int]]:
        """pooling "prompt": the ids before and after a text (PROMPT_HEAD, PROMPT_TAIL)."""
        if self._prompt_ids is None:
            self._prompt_ids = tuple(self.tokenizer.encode(t, add_special_tokens=False).ids
                                     for t in (PROMPT_HEAD, PROMPT_TAIL))
        return self._prompt_ids

    def prepare(self, items, field: str = "input", pooling: str = DEFAULT_POOLING) -> list[np.ndarray]:
        """The texts (or token-id lists) of a call as id arrays, each checked: OptionError
        naming `field` (and the item, input[i]) otherwise. pooling "prompt": each wrapped in
        the prompt (its tokens count toward the limit)."""
        head, tail = self._wrap() if pooling == "prompt" else ([], [])
        room = self.max_tokens - len(head) - len(tail)
        if isinstance(items, str) or (isinstance(items, (list, tuple)) and items
                                      and all(isinstance(t, int) and not isinstance(t, bool) for t in items)):
            items = [items]  # one text, or one text's token ids
        if not isinstance(items, (list, tuple)) or not items:
            raise OptionError(field, f"{field} must be a string, a non-empty list of strings, or token "
                                     f"ids (a list of integers, or a list of such lists), got {_kind(items)}")
        if len(items) > MAX_INPUTS:
            raise OptionError(field, f"{field} has {len(items)} items; at most {MAX_INPUTS} in one call")
        total, out = 0, []
        for i, item in enumerate(items):
            where = f"{field}[{i}]" if len(items) > 1 else field
            if isinstance(item, str):
                total += check_text(item, where)
                if total > MAX_INPUT_BYTES:
                    raise OptionError(field, f"{field}'s texts are more than {MAX_INPUT_BYTES} bytes of "
                                             "UTF-8 together (MAX_INPUT_BYTES)")
                if not item:
                    raise OptionError(field, f"{where} is an empty string: nothing to embed")
                ids = self._encode(item)
            elif isinstance(item, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool)
                                                         for t in item):
                if not item:
                    raise OptionError(field, f"{where} is an empty list of token ids: nothing to embed")
                ids = list(item)
                bad = next((t for t in ids if not 0 <= t < self.n_vocab), None)
                if bad is not None:
                    raise OptionError(field, f"{where}: token id {bad} is outside this model's "
                                             f"vocabulary (0..{self.n_vocab - 1})")
            else:
                raise OptionError(field, f"{where} must be a string or a list of token ids, got {_kind(item)}")
            if not ids:
                raise OptionError(field, f"{where} has no tokens: nothing to embed")
            if len(ids) > room:
                raise OptionError(field, f"{where} is {len(ids)} tokens; an embedding input may be at "
                                         f"most {room} tokens" + (f" ({self.max_tokens} with the "
                                                                  "prompt of pooling 'prompt')" if head else ""))
            out.append(np.asarray([*head, *ids, *tail], np.int64))
        return out

    def submit(self, items, pooling: str = DEFAULT_POOLING, normalize: bool = True, field: str = "input") -> Job:
        """Check and tokenize here (errors at the call), queue for the embedder's thread."""
        if pooling not in POOLINGS:
            raise OptionError("pooling", f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        if not isinstance(normalize, bool):
            raise OptionError("normalize", f"normalize must be true or false, got {normalize!r}")
        why = self.unsupported()
        if why is not None:
            raise PrefixEdgeError(why)
        wrap = sum(map(len, self._wrap())) if pooling == "prompt" else 0
        job = Job(self.prepare(items, field, pooling), pooling, normalize, wrap)
        if job.cost > self.request_tokens:
            raise OptionError(field, f"{field} is {job.cost} tokens in all; one call may hold at most "
                                     f"{self.request_tokens}: split it")
        with self._cv:
            if self._closed:
                raise RuntimeClosed("the runtime is closed")
            if self._queued + job.cost > self.queue_tokens:
                self.refused += 1
                raise RuntimeBusy(f"the embeddings queue is full ({self._queued} tokens waiting, at most "
                                  f"{self.queue_tokens}): try again shortly")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="prefix-edge-embed", daemon=True)
                self._thread.start()
            self._jobs.append(job)
            self._queued += job.cost
            self._cv.notify()
        job.future.add_done_callback(lambda f, job=job: f.cancelled() and self._drop(job))
        return job

    def cancel(self, job: Job) -> None:
        """A call nobody waits for any more (its client hung up): its texts not yet run are
        dropped; the batch running now ends as it is."""
        job.future.cancel()

    def _drop(self, job: Job) -> None:
        with self._cv:
            if job in self._jobs:
                self._jobs.remove(job)
                self._queued -= sum(len(x) for x in job.ids[job.next:])
            self.cancelled += 1

    def info(self) -> dict:
        """Waiting calls, texts and tokens, texts running, calls answered, cancelled, refused."""
        with self._cv:
            return {"waiting_calls": len(self._jobs),
                    "waiting_texts": sum(len(j.ids) - j.next for j in self._jobs),
                    "waiting_tokens": self._queued, "running_texts": self.running,
                    "done": self.done, "cancelled": self.cancelled, "refused": self.refused,
                    "open": self._runner is not None}

    def embed(self, items, pooling: str = DEFAULT_POOLING, normalize: bool = True) -> np.ndarray:
        return self.submit(items, pooling, normalize).future.result()

    # -- the embedder's thread -----------------------------------------------------------------
    def _take(self) -> list:
        """The next batch: one text of each waiting call in turn (calls of the first one's
        pooling), round and round, up to the engine's texts per run and max_tokens tokens;
        the calls are rotated so that the next batch starts with the next call."""
        first = self._jobs[0].pooling
        batch, tokens = [], 0
        cap = self.offer.texts_per_run
        progress = True
        while progress and len(batch) < cap:
            progress = False
            for job in list(self._jobs):
                if len(batch) >= cap:
                    break
                if job.pooling != first or job.next >= len(job.ids) or job.future.done():
                    continue
                n = len(job.ids[job.next])
                if tokens + n > self.max_tokens:
                    continue
                batch.append((job, job.next))
                job.next += 1
                tokens += n
                self._queued -= n
                progress = True
        for job in [j for j in self._jobs if j.next >= len(j.ids) or j.future.done()]:
            self._jobs.remove(job)
        self._jobs.rotate(-1)
        return batch

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._closed:
                    if not self._cv.wait(self.idle_s if self._runner is not None else None) \
                            and not self._jobs and self._runner is not None:
                        self._runner.close()  # idle: the native state goes (made again when needed)
                        self._runner = None
                if self._closed:
                    return
                batch = self._take()
                self.running = len(batch)
            if batch:
                self._run(batch)
            with self._cv:
                self.running = 0

    def _run(self, batch: list) -> None:
        try:
            if self._runner is None:
                self._runner = self.offer.open(self.max_tokens)
            vecs = self._runner.pooled([job.ids[i] for job, i in batch], batch[0][0].pooling)
        except Exception as e:  # every call in the batch gets the error
            err = engine_error(e, "embedding failed")
            for job, _ in batch:
                _settle(job.future, error=err)
            return
        for (job, i), v in zip(batch, vecs):
            if job.normalize:
                v = v / max(float(np.linalg.norm(v)), 1e-12)
            job.out[i] = v.astype(np.float32, copy=False)
            job.left -= 1
            if job.left == 0 and _settle(job.future, np.stack(job.out)):
                with self._cv:
                    self.done += 1

    @property
    def dimensions(self) -> int:
        """The length of a vector: the model's hidden size (0: this runtime cannot embed)."""
        return self.offer.dimensions

    def unsupported(self) -> str | None:
        """Why this runtime cannot embed (an ONNX graph without hidden_states), or None."""
        return self.offer.why_not

    def close(self) -> None:
        """End the thread (queued calls get RuntimeClosed) and free the native state; before
        the engine closes (a llama.cpp context must go before its model)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._cv:
            left, self._jobs, self._queued = list(self._jobs), deque(), 0
        for job in left:
            _settle(job.future, error=RuntimeClosed("the runtime is closed"))
        if self._runner is not None:
            self._runner.close()
            self._runner = None


def _settle(future: Future, value=None, error: BaseException | None = None) -> bool:
    """A call's result or error, unless it is over already (failed, or cancelled by its caller
    from another thread meanwhile); whether it was set."""
    try:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(value)
            return True
    except InvalidStateError:
        pass
    return False


def _kind(v) -> str:
    return type(v).__name__ if not isinstance(v, (list, tuple)) or v else "an empty list"
