"""speculative="lookup" (runtime/scheduler/drafting.py): drafts of forced tokens and prompt-lookup spans,
verified in one forward. The reference of every answer is the same request with "off".

Unit tier: the scheduler on the fake engine, and a fake whose next token continues a count (so
spans of the input repeat in the answer and drafts are accepted). Integration tier: the tiny
seeded model's bundle on llama.cpp and on ONNX (the fused graph's logits of the last
positions), drafts verified on both."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from prefix_edge.options import OptionError, resolve
from prefix_edge.runtime.scheduler.drafting import Drafter, lookup
from tests.helpers.fake_engine import FakeEngine
from tests.helpers.scheduling import outcome, request, scheduler

from .helpers.served import client, local, server  # noqa: F401 (fixtures: a served tiny bundle)









class Counting(FakeEngine):
    """The fake engine, its next token mostly the last one + 1 (mod the vocabulary, never the
    end of sequence): an input counting up is continued by the answer."""

    def logits(self, state: list[int]) -> np.ndarray:
        x = super().logits(state)
        if len(state) % 7:  # now and then the random draw wins: a draft is rejected there
            x[(state[-1] % (self.n_vocab - 1)) + 1] += 20
        return x


PROMPTS = [list(range(1, 30)) + list(range(3, 8)), list(range(10, 40)) * 2 + [12, 13],
           [5, 6, 7, 8, 5, 6, 7, 8, 5, 6], list(range(20, 60))]


def run(engine_cls, ids, speculative="off", **kw):
    s, e = scheduler(engine_cls())
    try:
        r = request(ids, speculative=speculative, **kw)
        s.submit(r)
        reason, text = outcome(r)
        return list(r.tokens), reason, text, dict(s.stats), len(e.log), r
    finally:
        s.close()


def test_the_option():
    assert resolve()["speculative"] == "off"
    assert resolve({"speculative": "lookup"})["speculative"] == "lookup"
    for bad in ("on", 1, True, ""):
        with pytest.raises(OptionError) as e:
            resolve({"speculative": bad})
        assert e.value.field == "speculative" and "speculative" in str(e.value)


def test_lookup_finds_the_latest_earlier_span():
    hist = np.array([1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 2, 3], np.int64)
    assert lookup(hist, 3).tolist() == [4, 7, 8]  # the latest "2 3" (3-gram "8 2 3": none)
    assert lookup(np.array([1, 2, 3], np.int64), 3).tolist() == []
    d = Drafter(np.array([1, 2, 3, 4, 5, 6], np.int64))
    assert d.propose([2, 3], None, 2) == [4, 5]


def test_lookups_pause_after_misses_and_resume_after_a_hit():
    """A lookup of which nothing is kept pauses lookups for 1, 2, 4 ... PAUSE_MAX steps (the
    paused steps draft nothing), as do lookups kept less than half the time; lookups kept whole
    again start the pauses from 1."""
    from prefix_edge.runtime.scheduler.drafting import PAUSE_MAX

    d = Drafter(np.array([1, 2, 3, 4, 5, 6], np.int64))
    answer = [2, 3]  # "2 3" is in the prompt: a lookup finds what followed it there

    def skipped() -> int:  # steps until the next lookup, then that lookup rejected whole
        n = 0
        while not (draft := d.propose(answer, None, 4)):
            n += 1
        d.update(len(draft), 0)
        return n

    assert [skipped() for _ in range(8)] == [0, 1, 2, 4, 8, 16, 32, 32] and PAUSE_MAX == 32
    def kept(n: int) -> None:  # the next lookup, n of it kept
        while not (draft := d.propose(answer, None, 4)):
            pass
        d.update(len(draft), min(n, len(draft)))

    kept(1)  # kept in part, still under half of what lookups drafted lately: paused again
    assert d.pause == PAUSE_MAX
    for _ in range(3):
        kept(4)  # kept whole: the share recovers
    assert d.pause == 0 and d.misses == 0 and d.rate >= 0.5
    assert [skipped() for _ in range(3)] == [0, 1, 2]


def test_row_cost_is_measured_from_decode_forwards():
    """RowCost: a row's cost as a share of a one-token step, the slope of the decode forwards'
    times over their token counts; the prior until both one-token and longer forwards are seen;
    a forward past MAX_TIMED tokens is not timed."""
    from prefix_edge.runtime.scheduler.drafting import MAX_TIMED, ROW_PRIOR, RowCost

    c = RowCost()
    assert c.share() == ROW_PRIOR
    c.observe(1, 0.010)
    assert c.share() == ROW_PRIOR
    c.observe(3, 0.014)
    c.observe(5, 0.018)
    assert c.share() == pytest.approx(0.2)
    c.observe(MAX_TIMED + 1, 9.0)
    assert c.share() == pytest.approx(0.2)
    c.observe(3, 0.054)  # an exponential average: 0.8 * 0.014 + 0.2 * 0.054 = 0.022
    assert c.t[3] == pytest.approx(0.022)
    s, e = scheduler(Counting())  # the scheduler times its decode forwards into it
    try:
        r = request(PROMPTS[0], max_tokens=24, speculative="lookup")
        s.submit(r)
        outcome(r)
        assert 1 in s.drafting.cost.t and max(s.drafting.cost.t) > 1
    finally:
        s.close()
    c = RowCost(calibrated=2)  # fixed once two of each kind were timed
    for n, t in ((1, 0.010), (3, 0.014), (1, 0.010), (3, 0.014)):
        c.observe(n, t)
    assert c.frozen and c.share() == pytest.approx(0.2)
    c.observe(3, 0.5)
    assert c.share() == pytest.approx(0.2) and c.t[3] == pytest.approx(0.014)


def test_lookups_are_as_long_as_their_rows_pay():
    """The i-th lookup token is kept about rate**i of the time: a lookup drafts while that is
    more than a row costs; at a kept share under the cost, one token (a probe)."""
    span = np.arange(10, 40, dtype=np.int64)
    for rate, cost, want in ((1.0, 0.9, 8), (0.8, 0.1, 8), (0.8, 0.5, 3), (0.8, 0.7, 1), (0.3, 0.5, 1)):
        d = Drafter(np.concatenate([span, span[:3]]))
        d.k, d.rate = 8, rate
        assert len(d.propose([], None, 8, cost)) == want, (rate, cost)
    d = Drafter(np.array([1, 2, 3, 4, 5, 6], np.int64))  # pauses scale with the cost: here 2x

    def skipped() -> int:
        n = 0
        while not (draft := d.propose([2, 3], None, 4, 1.0)):
            n += 1
        d.update(len(draft), 0)
        return n

    assert [skipped() for _ in range(8)] == [0, 2, 4, 8, 16, 32, 64, 64]
    # a drafter started in a pause (rate, misses given) waits that long, then probes one token
    d = Drafter(np.array([1, 2, 3, 4, 5, 6], np.int64), rate=0.2, misses=3)
    assert [d.propose([2, 3], None, 4, 0.5) for _ in range(5)] == [[], [], [], [], [4]]


@pytest.mark.parametrize("ids", PROMPTS)
@pytest.mark.parametrize("kw", [dict(max_tokens=24), dict(max_tokens=7), dict(max_tokens=24, stops=("w30",)),
                                dict(max_tokens=24, repetition_penalty=1.3, frequency_penalty=0.5),
                                dict(max_tokens=24, temperature=0.8, seed=3, top_k=8),
                                dict(max_tokens=24, logprobs=2)],
                         ids=["greedy", "max_tokens", "stop", "penalties", "sampled", "logprobs"])
def test_lookup_equals_off_on_the_fake(ids, kw):
    logprobs = kw.pop("logprobs", None)
    out = {}
    for spec in ("off", "lookup"):
        s, e = scheduler(Counting())
        try:
            r = request(ids, speculative=spec, logprobs=logprobs, **kw)
            s.submit(r)
            out[spec] = (outcome(r), list(r.tokens), r.token_logprobs, len(e.log), dict(s.stats))
        finally:
            s.close()
        assert e.seqs == {}
    assert out["lookup"][:3] == out["off"][:3]
    if kw["max_tokens"] > 7 and "temperature" not in kw:  # the answer continues the count
        assert out["lookup"][4]["accepted"] > 0 and out["lookup"][3] < out["off"][3]


def test_max_tokens_is_never_passed_by_a_draft():
    for m in range(1, 12):
        off = run(Counting, PROMPTS[0], max_tokens=m)
        on = run(Counting, PROMPTS[0], "lookup", max_tokens=m)
        assert on[:3] == off[:3] and len(on[0]) <= m


def test_an_engine_that_cannot_cut_back_decodes_as_off():
    class Recurrent(Counting):
        def __init__(self):
            super().__init__(keeps_partial=False)

    off = run(Recurrent, PROMPTS[0], max_tokens=16)
    on = run(Recurrent, PROMPTS[0], "lookup", max_tokens=16)
    assert on[:3] == off[:3] and on[3]["drafted"] == 0 and on[4] == off[4]


def test_requests_together_mixing_off_and_lookup():
    refs = [run(Counting, p, "off", max_tokens=20)[:2] for p in PROMPTS]
    s, e = scheduler(Counting(), prefill_chunk=8)
    try:
        rs = []
        for i, p in enumerate(PROMPTS * 2):
            r = request(p, max_tokens=20, speculative="lookup" if i % 2 else "off")
            rs.append(r)
        threads = [threading.Thread(target=s.submit, args=(r,)) for r in rs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, r in enumerate(rs):
            reason, _ = outcome(r)
            assert (list(r.tokens), reason) == refs[i % len(PROMPTS)]
    finally:
        s.close()
    assert e.seqs == {} and s.stats["accepted"] > 0


def test_cancel_mid_stream_frees_the_sequence():
    s, e = scheduler(Counting())
    try:
        r = request(PROMPTS[1], max_tokens=200, speculative="lookup")
        s.submit(r)
        kind, _ = r.events.get(timeout=20)
        assert kind == "text"
        s.cancel(r)
        assert outcome(r)[0] in ("cancelled", "length")
        after = request(PROMPTS[0], max_tokens=12, speculative="lookup")
        s.submit(after)
        outcome(after)
    finally:
        s.close()
    assert e.seqs == {}
    assert list(after.tokens) == run(Counting, PROMPTS[0], max_tokens=12)[0]


# -- real engines ---------------------------------------------------------------------------
REPEATS = ["The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
           "Maria wants 3 mugs in Valencia. Maria wants 3 mugs in Valencia. Maria wants",
           "0123456789 0123456789 0123456789 01234"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "quantity": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "quantity", "city"]}


def _pair(rt, task, text, **kw):
    off = rt.generate(task, text, speculative="off", **kw)
    on = rt.generate(task, text, speculative="lookup", **kw)
    return off, on


@pytest.mark.parametrize("backend", ["gguf", "onnx"])
def test_lookup_equals_off_on_the_engines(bundle_fp32, backend):
    if backend == "gguf":
        pytest.importorskip("llama_cpp")
    from prefix_edge.runtime.runtime import Runtime

    with Runtime.open(bundle_fp32, backend=backend, threads=1, slots=4) as rt:
        accepted = 0
        for text in REPEATS:
            for task in (None, "raw"):
                for kw in (dict(max_tokens=40), dict(max_tokens=9), dict(max_tokens=40, stop=["fox", "9"])):
                    off, on = _pair(rt, task, text, **kw)
                    assert (on.text, on.tokens, on.stats.finish_reason) == \
                        (off.text, off.tokens, off.stats.finish_reason), (task, text, kw)
                    assert off.stats.drafted_tokens == 0
                    accepted += on.stats.accepted_tokens
        off, on = _pair(rt, "extract", REPEATS[1], json_schema=SCHEMA, max_tokens=48)
        assert on.text == off.text and on.tokens == off.tokens
        assert on.stats.accepted_tokens > 0  # the schema's forced keys, quotes and braces at least
        accepted += on.stats.accepted_tokens
        off, on = _pair(rt, None, REPEATS[0], max_tokens=24, logprobs=2)
        assert on.logprobs == off.logprobs
        # n choices (sampled, seeded): each choice as with "off"
        offs = [s.wait() for s in rt.choices(None, REPEATS[0], n=3, speculative="off", max_tokens=24,
                                             temperature=0.7, seed=5)]
        ons = [s.wait() for s in rt.choices(None, REPEATS[0], n=3, speculative="lookup", max_tokens=24,
                                            temperature=0.7, seed=5)]
        assert [r.tokens for r in ons] == [r.tokens for r in offs]
        # several requests at once from threads, off and lookup mixed
        refs = {t: rt.generate(None, t, max_tokens=32).tokens for t in REPEATS}
        got: dict = {}

        def go(i, t):
            got[i] = rt.generate(None, t, max_tokens=32, speculative="lookup" if i % 2 else "off").tokens

        threads = [threading.Thread(target=go, args=(i, t)) for i, t in enumerate(REPEATS * 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [got[i] for i in range(len(threads))] == [refs[t] for t in REPEATS * 2]
        # cancelled mid-stream: the runtime goes on as before
        s = rt.stream(None, REPEATS[2], speculative="lookup", max_tokens=200)
        next(iter(s))
        s.cancel()
        assert s.wait().stats.finish_reason in ("cancelled", "length")
        assert rt.generate(None, REPEATS[0], max_tokens=32, speculative="lookup").tokens == refs[REPEATS[0]]
        assert rt.backend.verifies and accepted > 0  # both engines verify drafts of this model


def test_a_lookup_answer_does_not_move_with_other_requests(bundle_fp32):
    """Issue 50's trial: the same greedy lookup request gave three answers amid other clients'
    traffic (a task's requests shared their drafting state, and a row's measured cost moved
    with every forward). Now every request starts from the same state and, once the cost is
    calibrated, it is fixed: on ONNX (a graph run per sequence) the request's tokens are the
    same alone and beside three other lookup requests of other texts, every time."""
    from prefix_edge.runtime.runtime import Runtime

    with Runtime.open(bundle_fp32, backend="onnx", threads=1, slots=4) as rt:
        cost = rt._sched.drafting.cost
        while not cost.frozen:  # calibration: the runtime's first decode forwards of each kind
            rt.generate(None, REPEATS[0], max_tokens=40, speculative="lookup")
        share = cost.share()
        alone = rt.generate("raw", REPEATS[1], max_tokens=40, speculative="lookup")
        for round_ in range(3):
            got: dict = {}

            def go(i, text, task):
                got[i] = rt.generate(task, text, max_tokens=40, speculative="lookup")
            jobs = [(0, REPEATS[1], "raw")] + [(i, REPEATS[(i + round_) % len(REPEATS)] + f" {i}", None)
                                                for i in (1, 2, 3)]
            threads = [threading.Thread(target=go, args=job) for job in jobs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert got[0].tokens == alone.tokens, round_
            assert got[0].stats.drafted_tokens == alone.stats.drafted_tokens  # the same drafts, too
        assert cost.share() == share


def test_the_server_takes_speculative_and_reports_predicted_tokens(client, local):
    """chat-completions and Responses take the `speculative` extension; the answer is the
    library's, and a drafted request's usage carries OpenAI's predicted-output counts."""
    import openai

    ask = [{"role": "user", "content": REPEATS[1]}]
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": SCHEMA}}
    ref = local.generate(None, messages=ask, max_tokens=48, speculative="lookup", json_schema=SCHEMA)
    assert ref.stats.drafted_tokens > 0  # the schema's forced keys at least
    r = client.chat.completions.create(model="base", messages=ask, max_tokens=48, response_format=fmt,
                                       extra_body={"speculative": "lookup"})
    assert r.choices[0].message.content == ref.text
    d = r.usage.completion_tokens_details
    assert (d.accepted_prediction_tokens, d.rejected_prediction_tokens) == \
        (ref.stats.accepted_tokens, ref.stats.drafted_tokens - ref.stats.accepted_tokens)
    off = client.chat.completions.create(model="base", messages=ask, max_tokens=48, response_format=fmt)
    assert off.choices[0].message.content == local.generate(None, messages=ask, max_tokens=48,
                                                            json_schema=SCHEMA).text
    assert off.usage.completion_tokens_details is None
    resp = client.responses.create(model="base", input=REPEATS[1], max_output_tokens=48,
                                   text={"format": {"type": "json_schema", "name": "order", "schema": SCHEMA}},
                                   extra_body={"speculative": "lookup"})
    assert resp.output_text == ref.text
    for call in (lambda: client.responses.create(model="base", input="hi", extra_body={"speculative": "fast"}),
                 lambda: client.chat.completions.create(model="base", messages=ask,
                                                        extra_body={"speculative": "fast"})):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.param == "speculative"
