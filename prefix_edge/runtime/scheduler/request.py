"""A request in two parts: the `Call` the caller's thread made (what to run; never changed once
submitted) and the `Request`, its run: the decoding state the call brought (sampler, text
stream), the one-shot hooks the engine thread takes (snapshot, midpoint), the channel back
(events, notify, cancel), and the engine thread's own state (sequence, position, tokens)."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field

import numpy as np

from ..engines.prefix import Prefix
from ..decode.sampling import Sampler
from ..decode.text import TextStream


@dataclass(frozen=True, eq=False)
class Call:
    """What one call runs, made on the caller's thread (prepare.py) before it is submitted."""

    task: str | None
    prefix_key: str | None       # resident-prefix key (the task), None: no shared prefix
    prefix: Prefix | None        # restored before `ids` (None: start empty)
    ids: np.ndarray              # tokens to prefill after the prefix
    max_tokens: int
    eos: frozenset
    prefix_cached: bool = True   # the task's prefix comes baked (else it is in `ids`)
    load_ms: float = 0.0         # loading the prefix on the caller's thread
    t0: float = field(default_factory=time.perf_counter)
    cuts: tuple = ()             # input positions prefill chunks never cross (turn boundaries)
    prefix_keep: int | None = None  # positions of `prefix` to restore (None: all of it)
    turn_hit: int = 0            # input tokens restored from the prompt cache (not in `ids`)
    logprobs: int | None = None  # record each token's log-probability and this many alternatives
    tools: object = None         # tools.ToolSpec: the answer may be read as a tool call
    turn: tuple | None = None    # a conversation's (root, input ids, cuts): its turn-cache key
    speculative: str = "off"     # "lookup": drafts verified in one forward (drafting.py)
    background: bool = False     # a reply's prefill for the next turn (prepare.reply_prefill): runs
    # only while no other request waits, and gives way to one that needs its sequence
    follow: tuple | None = None  # (task, messages, scope) of a conversation's call: its reply can be read ahead


@dataclass(eq=False)  # identity, not field-wise (numpy) comparison
class Request:
    call: Call
    sampler: Sampler             # the call's sampling (its constraint's state moves with each token)
    text: TextStream             # its detokenizer and stop strings
    # the engine thread takes each once: fn(backend, request), run where the input is read
    snapshot: object = None      # ... whole (the prompt cache's entry)
    midpoint: tuple | None = None  # (input position, fn): ... up to the start of its last message
    compose: object = None       # compose.Composition: documents laid before `ids` (engine thread)
    siblings: list = field(default_factory=list)  # n > 1: the other choices, forked after the prefill
    parent: "Request | None" = None               # a sibling's first choice
    # the channel back: events (text chunks, then "done" or "error") and the caller's cancel
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    notify: object = None        # called (engine thread) after each event: an asyncio consumer's wake-up
    cancel_reason: str | None = None
    # the engine thread's state
    seq: int = -1
    pos: int = 0
    fed: int = 0                 # input tokens prefilled so far
    reserved: int = 0            # KV cells reserved (llama.cpp)
    uses_resident: bool = False  # started as a copy of a resident prefix (holds a user count)
    forked: bool = False         # a choice that has its first one's KV
    restore_ms: float = 0.0      # restoring the prefix into its sequence
    prompt_end: int = -1         # its position once its whole input is read (the snapshot's end)
    drafter: object = None       # drafting.Drafter, made at its first decode step
    drafts: bool = True          # drafting may still run (False: the engine cannot verify)
    next_token: int | None = None
    tokens: list = field(default_factory=list)
    chunks: list = field(default_factory=list)
    token_logprobs: list = field(default_factory=list)  # (token, logprob, [(id, logprob)...])
    n_samples: int = 0
    t_first: float | None = None
    t_last: float | None = None
    done: bool = False

    @property
    def load_ms(self) -> float:
        """The prefix's loading and restore, in milliseconds."""
        return self.call.load_ms + self.restore_ms

    def emit(self, kind: str, value) -> None:
        self.events.put((kind, value))
        wake = self.notify
        if wake is not None:
            try:
                wake()
            except Exception:  # a closed event loop: its consumer is gone
                pass
