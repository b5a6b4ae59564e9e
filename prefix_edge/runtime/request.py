"""Request: one call's state, from the caller's thread (input, sampler, options) to the engine
thread (its sequence, position, tokens) and back (events on its queue)."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field

import numpy as np

from .engines.prefix import Prefix
from .decode.sampling import Sampler
from .decode.text import TextStream


@dataclass(eq=False)  # identity, not field-wise (numpy) comparison
class Request:
    task: str
    prefix_key: str | None       # resident-prefix key (the task), None: no shared prefix
    prefix: Prefix | None        # restored before `ids` (None: start empty)
    ids: np.ndarray              # tokens to prefill after the prefix
    max_tokens: int
    sampler: Sampler
    text: TextStream
    eos: set
    load_ms: float = 0.0
    prefix_cached: bool = True
    t0: float = field(default_factory=time.perf_counter)
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    notify: object = None        # called (engine thread) after each event: an asyncio consumer's wake-up
    cancel_reason: str | None = None
    cuts: tuple = ()             # input positions prefill chunks never cross (turn boundaries)
    snapshot: object = None      # fn(backend, request), engine thread, once its input is read
    midpoint: tuple | None = None  # (input position, fn(backend, request)): a state kept there too
    prompt_end: int = -1         # its position once its whole input is read (the snapshot's end)
    siblings: list = field(default_factory=list)  # n > 1: the other choices, forked after the prefill
    parent: "Request | None" = None               # a sibling's first choice
    logprobs: int | None = None  # record each token's log-probability and this many alternatives
    prefix_keep: int | None = None  # positions of `prefix` to restore (None: all of it)
    turn_hit: int = 0            # input tokens restored from the prompt cache (not in `ids`)
    tools: object = None         # tools.ToolSpec: the answer may be read as a tool call
    turn: tuple | None = None    # a conversation's (root, input ids, cuts): its turn-cache key
    speculative: str = "off"     # "lookup": drafts verified in one forward (drafting.py)
    drafter: object = None       # drafting.Drafter, made at its first decode step
    compose: object = None       # compose.Composition: documents laid before `ids` (engine thread)
    background: bool = False     # a reply's prefill for the next turn (prepare.reply_prefill): runs
    # only while no other request waits, and gives way to one that needs its sequence
    follow: tuple | None = None  # (task, messages) of a conversation's call: its reply can be read ahead
    # engine-side state
    forked: bool = False
    seq: int = -1
    pos: int = 0
    fed: int = 0                 # input tokens prefilled so far
    reserved: int = 0            # KV cells reserved (llama.cpp)
    uses_resident: bool = False  # started as a copy of a resident prefix (holds a user count)
    next_token: int | None = None
    tokens: list = field(default_factory=list)
    chunks: list = field(default_factory=list)
    token_logprobs: list = field(default_factory=list)  # (token, logprob, [(id, logprob)...])
    n_samples: int = 0
    t_first: float | None = None
    t_last: float | None = None
    done: bool = False

    def emit(self, kind: str, value) -> None:
        self.events.put((kind, value))
        wake = self.notify
        if wake is not None:
            try:
                wake()
            except Exception:  # a closed event loop: its consumer is gone
                pass
