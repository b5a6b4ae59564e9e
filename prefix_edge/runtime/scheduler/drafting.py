"""Speculative decoding (`speculative="lookup"` or `"mtp"`): more than one token per forward.

On a CPU a decode step reads every weight once for one token; a forward of a few more tokens
costs about the same. So for a request in its decode phase the scheduler (loop.py) drafts
up to k tokens after the token it is about to forward:

- first the constraint's forced tokens (llguidance's fast-forward: the keys, quotes and braces
  a JSON schema determines),
- then prompt lookup: the longest of the last NGRAMS tokens found again in the prompt and the
  answer so far (numpy over the history, no Python loop over it or over the vocabulary), and
  the tokens that followed it there,

cut where the constraint refuses one (validate_tokens). The draft goes into the same engine
forward as the other sequences' steps, as one item whose last k+1 positions' logits come back
(engine protocol: items (seq, pos, ids, rows)). `accept` then runs the request's ordinary
per-token path on each row in turn (the sampler with its bias, penalties and constraint mask,
stop strings, max_tokens, logprobs, streaming): the chosen token equal to the draft's next one
means that draft token's KV is already right and the next row holds the following logits; the
first token that differs is the request's next token, as it would have been without a draft,
and the draft's KV after it is cut off (engine.seq_truncate).

Sampling (temperature > 0) keeps its distribution: each row's token is drawn from the exact
distribution of the sequence so far, and a draft token counts only where the draw equals it,
which is the standard acceptance rule for a deterministic draft (accepted with probability
p(x), else a draw from p with x left out, renormalised); the generator draws once per
emitted token, so a seeded request gives the answer it gives with "off" on equal logits.

k adapts per request: every draft token accepted raises it (to K_MAX), a rejection sets it to
what was accepted plus one; a lookup of which nothing is kept pauses lookups for 1, 2, 4 ...
PAUSE_MAX steps, scaled by the row cost (forced tokens are still drafted), so free text that
repeats little of its prompt decodes nearly as "off" does. What a verified row costs is
measured, not assumed (RowCost: the scheduler's own decode forwards, timed by their token
count): a lookup token is drafted only where the share of lookup tokens kept lately pays for its
row (llama.cpp on a small CPU: a row costs most of a step, so lookups must be kept nearly
always; ONNX Runtime's int4 kernels: a tenth of one, so most lookups pay;
benchmarks/verify_cost.py), until CALIBRATED forwards of each kind have been timed; then it is
fixed for the runtime's life. Every request starts from the same drafting state. So, once the
cost is fixed, what a request drafts is a function of the request alone, never of other
requests (before, a task's next request started where its last left its lookups, and the cost
moved with every forward: the same greedy request gave three answers amid other traffic);
on ONNX each sequence runs a graph run of its own, so its answer is then the same whatever
else runs. Verifying k tokens at once is a k-token prefill, whose last bits can differ
from one-at-a-time decoding: greedy answers can differ from "off" in near-ties
(docs/speculative.md measures how often). The prompt and turn caches keep a prompt's KV before
its first decoded token only (loop.Scheduler._keep_prompt), so no draft's KV is ever stored there.

`speculative="mtp"` drafts with the model's own MTP head instead of lookups (engine.mtp_draft,
runtime/engines/llama/mtp.py: Qwen3.5's checkpoints ship one; a runtime opened with mtp_head):
the constraint's forced tokens where it has some, else up to k of the head's greedy tokens, cut
where the constraint refuses one, verified and kept exactly as above (HeadDrafter). k adapts
as lookup's does; a draft of which nothing is kept pauses the head for 1, 2, 4 ... PAUSE_MAX
steps, scaled by the row cost, as a missed lookup does (a head that keeps missing, as a random
model's does, then costs little).
"""

from __future__ import annotations

import logging

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ...errors import engine_error

K_START, K_MAX = 4, 8  # K_MAX + 1 rows of logits: what the ONNX graph gives (onnx_graph.LOGITS_TAIL)
PAUSE_MAX = 32  # steps without a lookup after rejected ones: 1, 2, 4 ... up to this many, times
# the row cost over ROW_PRIOR (a probe that costs most of a step is made less often)
# a lookup token kept must pay for the rows verified: with the share of lookup tokens kept (a
# moving average, 0.3 the latest draft's) below what a row costs (RowCost.share, as a share of a
# one-token step; ROW_PRIOR until this machine's forwards have told it), lookups pause as after a miss
ROW_PRIOR = 0.5
ROW_FLOOR = 0.05  # the least a row is taken to cost, however cheap it measured
MAX_TIMED = 16    # decode forwards of up to this many tokens are timed
NGRAMS = (3, 2)   # n-gram lengths looked up, longest first
MAX_HISTORY = 8192  # the last this many tokens of prompt + answer are searched
CALIBRATED = 32     # timed decode forwards of one token, and of more, after which a row's cost is fixed


class Drafting:
    """The scheduler's drafting, on its engine thread: a decoding request's draft, and the
    verification of a forwarded one. `stats`: the scheduler's (drafted, accepted) counts."""

    def __init__(self, backend, stats: dict):
        self.backend, self.stats = backend, stats
        self.said = False  # an engine that cannot verify drafts is said once
        self.cost = RowCost()

    def draft(self, r, budget: int) -> list[int] | None:
        """r's draft to forward after its next token (speculative="lookup"), or None: its
        next token alone. At most `budget` tokens, and never past what max_tokens lets the
        "off" run write (so its KV reservation holds)."""
        spec = r.call.speculative
        if spec not in ("lookup", "mtp") or not r.drafts or r.cancel_reason:
            return None
        if r.drafter is None:
            if not self.backend.verifies or (spec == "mtp" and not self.backend.drafts_mtp):
                self._say(spec)
                r.drafts = False
                return None
            if spec == "mtp":
                r.drafter = HeadDrafter(self.backend)
            else:
                first = (r.parent if r.parent is not None else r).call  # a choice: its first one's input
                r.drafter = Drafter(r.call.ids if first.prefix is None else np.concatenate([first.prefix.ids, r.call.ids]))
        limit = min(budget, r.call.max_tokens - r.n_samples - 1)
        if limit <= 0:
            return None
        if spec == "mtp":
            draft = r.drafter.propose(r, r.sampler.constraint, limit, self.cost.share())
        else:
            draft = r.drafter.propose(r.tokens, r.sampler.constraint, limit, self.cost.share())
        return draft or None

    def _say(self, spec: str) -> None:
        if not self.said:
            self.said = True
            be = self.backend
            if spec == "mtp" and not be.drafts_mtp:
                why = ("the model has no MTP head, or the runtime was opened without mtp_head "
                       "(an MTP head runs on the gguf engine)")
            elif not be.keeps_partial:
                why = "its state cannot be cut back"
            else:
                why = "its graph gives only the last position's logits"
            logging.getLogger("prefix_edge").warning(
                "speculative=%r: the %s engine cannot draft and verify here (%s); decoding one "
                "token per forward", spec, be.name, why)

    def verify(self, r, rows: np.ndarray, draft: list[int], sample, finish) -> None:
        """r forwarded its next token and `draft`: its tokens from each row in turn (the
        ordinary per-token path, `sample`), and the rejected part of the draft's KV cut off
        (an engine that fails to: `finish` ends r with the error)."""
        pos = r.pos
        n = accept(r, rows, draft, sample)
        r.pos = pos + 1 + n
        r.drafter.update(len(draft), n)
        self.stats["drafted"] += len(draft)
        self.stats["accepted"] += n
        if not r.done and n < len(draft):
            try:
                self.backend.seq_truncate(r.seq, r.pos)
            except Exception as e:
                finish(r, "error", engine_error(e))


class Drafter:
    """One request's drafting state: its history (prompt, then the answer as it grows), k,
    and what it drafted and had accepted."""

    def __init__(self, source: np.ndarray, rate: float = 1.0, misses: int = 0):
        """source: the prompt; rate, misses: where the task's last request left its lookups
        (a task whose lookups kept missing starts paused, as its last request ended)."""
        source = np.asarray(source, np.int64).reshape(-1)[-MAX_HISTORY:]
        self.hist = np.empty(max(256, 2 * source.size), np.int64)
        self.hist[:source.size] = source
        self.n = source.size
        self.seen = 0       # answer tokens (Request.tokens) already in hist
        self.k = K_START
        self.drafted = 0
        self.accepted = 0
        self.misses = misses  # lookups rejected (or kept too seldom) in a row
        self.pause = min(PAUSE_MAX, 1 << (misses - 1)) if misses else 0  # steps left without a lookup
        self.looked = False  # the last draft held a lookup, after its `forced` forced tokens
        self.forced = 0
        self.rate = rate  # the share of lookup tokens kept (moving average)
        self.row_cost = ROW_PRIOR  # what a verified row cost when the last draft was made

    def _sync(self, tokens: list[int]) -> None:
        new = tokens[self.seen:]
        if not new:
            return
        if self.n + len(new) > self.hist.size:
            keep = self.hist[max(0, self.n - MAX_HISTORY):self.n]
            grown = np.empty(max(2 * self.hist.size, keep.size + len(new) + 256), np.int64)
            grown[:keep.size] = keep
            self.hist, self.n = grown, keep.size
        self.hist[self.n:self.n + len(new)] = new
        self.n += len(new)
        self.seen = len(tokens)

    def propose(self, tokens: list[int], constraint, limit: int, row_cost: float = ROW_PRIOR) -> list[int]:
        """Up to min(k, limit) tokens to follow the answer `tokens` (whose last is the token
        about to be forwarded): forced ones first, then a lookup of as many tokens as pay for
        their rows (`row_cost`: a verified row's cost as a share of a one-token step)."""
        limit = min(self.k, limit)
        if limit < 1:
            return []
        self._sync(tokens)
        out: list[int] = constraint.forced(limit) if constraint is not None else []
        self.looked, self.forced = False, len(out)
        self.row_cost = row_cost = max(ROW_FLOOR, row_cost)
        if self.pause:  # lookups have been missing: a verified draft would cost more than it saves
            self.pause -= 1
        elif len(out) < limit:
            hist = self.hist[:self.n]
            if out:
                hist = np.concatenate([hist, np.asarray(out, np.int64)])
            # the i-th lookup token is kept about rate**i of the time: draft while that pays for
            # its row (after a pause, at a rate under the cost: one token, a probe)
            worth = limit - len(out) if self.rate >= 1 else 1 if self.rate <= row_cost else \
                int(np.log(row_cost) / np.log(self.rate))
            found = lookup(hist, min(limit - len(out), max(1, worth))).tolist()
            self.looked = bool(found)
            out += found
        if out and constraint is not None:
            out = out[:constraint.valid_prefix(out)]
        return out

    def update(self, drafted: int, accepted: int) -> None:
        """After a verified draft of `drafted` tokens of which `accepted` were kept: k grows
        with a whole draft kept, else falls to what was kept plus one; a lookup kept in nothing,
        or lookups kept less often than a row costs (propose's row_cost), pause lookups for
        1, 2, 4 ... PAUSE_MAX steps times that cost over ROW_PRIOR (free text, where the
        answer repeats little of the prompt, then decodes nearly as "off" does)."""
        self.drafted += drafted
        self.accepted += accepted
        self.k = next_k(self.k, drafted, accepted)
        if self.looked:
            kept = max(0, accepted - self.forced)
            self.rate = 0.7 * self.rate + 0.3 * kept / max(1, drafted - self.forced)
            if kept == 0 or self.rate < self.row_cost:
                self.pause = backoff(self.misses, self.row_cost)
                self.misses += 1
            else:
                self.misses = 0


def next_k(k: int, drafted: int, accepted: int) -> int:
    """A draft's next length: one more after a whole draft kept (up to K_MAX), else what was
    kept plus one."""
    if not drafted:
        return k
    return min(K_MAX, k + 1) if accepted == drafted else max(1, accepted + 1)


def backoff(misses: int, row_cost: float) -> int:
    """Steps without drafting after `misses` earlier misses in a row: 1, 2, 4 ... PAUSE_MAX at
    the prior cost, longer where a probe costs more."""
    return int(np.ceil(min(PAUSE_MAX, 1 << misses) * row_cost / ROW_PRIOR))


class HeadDrafter:
    """One request's drafting with the model's MTP head (speculative="mtp"): k, and the pause
    after drafts of which nothing was kept."""

    def __init__(self, backend):
        self.backend = backend
        self.k = 3  # llama.cpp's default draft length for an MTP head
        self.pause = self.misses = 0
        self.drafted = self.accepted = 0
        self.row_cost = ROW_PRIOR
        self.looked = False  # the last draft was the head's (not forced tokens)

    def propose(self, r, constraint, limit: int, row_cost: float = ROW_PRIOR) -> list[int]:
        """The constraint's forced tokens after r's next one, else up to min(k, limit) of the
        head's, cut where the constraint refuses one."""
        out: list[int] = constraint.forced(min(self.k, limit)) if constraint is not None else []
        self.looked = False
        self.row_cost = max(ROW_FLOOR, row_cost)
        if not out:
            if self.pause:
                self.pause -= 1
                return []
            out = self.backend.mtp_draft(r.seq, int(r.next_token), r.pos, min(self.k, limit))
            self.looked = bool(out)
        if out and constraint is not None:
            out = out[:constraint.valid_prefix(out)]
        return out

    def update(self, drafted: int, accepted: int) -> None:
        """After a verified draft: k grows with a whole draft kept (to K_MAX), else falls to
        what was kept plus one; a head's draft kept in nothing pauses the head (1, 2, 4 ...
        PAUSE_MAX steps times the row cost over ROW_PRIOR)."""
        self.drafted += drafted
        self.accepted += accepted
        self.k = next_k(self.k, drafted, accepted)
        if self.looked:
            if accepted == 0:
                self.pause = backoff(self.misses, self.row_cost)
                self.misses += 1
            else:
                self.misses = 0


class RowCost:
    """What one more token in a decode forward costs on this machine, as a share of a one-token
    step: from the scheduler's own decode forwards (observe: tokens in it, seconds), an
    exponential average per token count, the slope over them against one token's time. Until
    forwards of one token and of more have both been seen, ROW_PRIOR; once `calibrated` of each
    have been timed, fixed (`frozen`): drafts no longer move with how busy the machine was."""

    def __init__(self, calibrated: int = CALIBRATED):
        self.t: dict[int, float] = {}
        self._share = ROW_PRIOR  # recomputed once per forward timed, read by every draft
        self.calibrated = calibrated
        self.seen = [0, 0]  # timed forwards of one token, of more
        self.frozen = False

    def observe(self, tokens: int, seconds: float) -> None:
        if self.frozen:
            return
        if 1 <= tokens <= MAX_TIMED:
            self.seen[tokens > 1] += 1
            self.frozen = min(self.seen) >= self.calibrated
            old = self.t.get(tokens)
            self.t[tokens] = seconds if old is None else 0.8 * old + 0.2 * seconds
            one = self.t.get(1)
            more = [(n, t) for n, t in self.t.items() if n > 1]
            if one and more:
                slope = sum(t - one for _, t in more) / sum(n - 1 for n, _ in more)
                self._share = float(min(1.5, max(0.0, slope / one)))

    def share(self) -> float:
        return self._share


def lookup(hist: np.ndarray, k: int, ngrams: tuple[int, ...] = NGRAMS) -> np.ndarray:
    """The up to k tokens that followed the latest earlier occurrence of hist's last n tokens
    (n from `ngrams`, longest first); empty when none occurs."""
    size = hist.size
    for n in ngrams:
        if size <= n:
            continue
        windows = sliding_window_view(hist[:-1], n)  # window i = hist[i:i+n], a token follows it
        hits = np.flatnonzero((windows == hist[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return hist[start:start + k]
    return hist[:0]


def accept(r, rows: np.ndarray, draft: list[int], sample) -> int:
    """Run the request's per-token path (`sample(r, logits)`) on each row of a verified draft:
    rows[i] are the logits after the forwarded token and draft[:i]. Returns how many draft
    tokens were accepted (their KV stays); r.next_token is then the first token that differs,
    unless r has ended."""
    n = 0
    for i in range(len(rows)):
        sample(r, rows[i])
        if r.done or r.cancel_reason:
            break
        if i < len(draft) and r.next_token == draft[i]:
            n += 1
            continue
        break
    return n
